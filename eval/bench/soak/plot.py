"""The soak run's picture: memory, threads, files, queues and p99 over time."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from eval.bench.soak.traffic import MIX

if TYPE_CHECKING:
    from pathlib import Path


def plot(samples: list[dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, 3, figsize=(15, 7.5), sharex=True)
    minutes = [s["t_s"] / 60 for s in samples]
    panels = [
        ("resident memory (MiB)", ("rss_mb", "rss_anon_mb", "rss_file_mb")),
        ("threads, open files", ("threads", "fds")),
        ("queues (items, jobs)", ("embed_queue", "rerank_queue", "jobs_queued")),
        ("disk (MiB)", ("jobs_db_mb", "qdrant_mb")),
    ]
    for axis, (title, names) in zip(axes.flat, panels, strict=False):
        for name in names:
            axis.plot(minutes, [s.get(name, np.nan) for s in samples], label=name)
        axis.set_title(title)
        axis.legend(fontsize=7)
    p99 = axes.flat[4]
    for route in MIX:
        p99.plot(minutes, [s["p99_ms"].get(route) or np.nan for s in samples], label=route)
    p99.set_title("p99 per route (ms)")
    p99.set_yscale("log")
    p99.legend(fontsize=6, ncol=2)
    answers = axes.flat[5]
    for kind, low, high in (
        ("2xx", 200, 300),
        ("4xx", 400, 500),
        ("5xx", 500, 600),
        ("none", 0, 1),
    ):
        counts = [
            sum(n for label, n in s["statuses"].items() if low <= int(label.rsplit()[1]) < high)
            for s in samples
        ]
        answers.plot(minutes, counts, label=kind)
    answers.set_title("answers per sample")
    answers.legend(fontsize=7)
    restarts = [
        m
        for m, a, b in zip(minutes[1:], samples, samples[1:], strict=False)
        if a["life"] != b["life"]
    ]
    for axis in axes.flat:
        for at in restarts:
            axis.axvline(at, color="red", linestyle=":", linewidth=1)
        axis.grid(alpha=0.3)
    for axis in axes[1]:
        axis.set_xlabel("minutes")
    figure.suptitle("ragrank soak: one server, mixed reads and writes (red: kill -9 and restart)")
    figure.tight_layout()
    figure.savefig(out, dpi=90)
    plt.close(figure)
