"""What the soak run samples of the server each interval: its process, its metrics, its disk."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import httpx


def process_sample(pid: int) -> dict[str, float]:
    """Resident memory (MiB), threads and open file descriptors of the server, from /proc."""
    fields: dict[str, str] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        fields[name] = (value.split() or [""])[0]
    return {
        "rss_mb": round(int(fields["VmRSS"]) / 1024, 1),
        # Of which anonymous (the heap) and file-backed (the store's mapped segment files,
        # which the kernel can drop and read again).
        "rss_anon_mb": round(int(fields["RssAnon"]) / 1024, 1),
        "rss_file_mb": round(int(fields["RssFile"]) / 1024, 1),
        "threads": int(fields["Threads"]),
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
    }


def scrape(base: str) -> dict[str, float]:
    """Queue depths and the job queue's states from `/metrics`."""
    found: dict[str, float] = {}
    text = httpx.get(f"{base}/metrics", timeout=30).text
    for line in text.splitlines():
        for prefix, name in (
            ('ragrank_queue_depth{engine="embed",', "embed_queue"),
            ('ragrank_queue_depth{engine="rerank",', "rerank_queue"),
            ('ragrank_jobs{state="queued"}', "jobs_queued"),
            ('ragrank_jobs{state="running"}', "jobs_running"),
            ('ragrank_jobs{state="done"}', "jobs_done"),
        ):
            if line.startswith(prefix):
                # A queue per served model: the role's depth is their sum.
                found[name] = found.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return found


def folder_mb(path: Path) -> float:
    """MiB of a file, or of every file below a folder."""
    files = [str(path)] if path.is_file() else []
    for folder, _, names in os.walk(path):  # the store renames files as it writes: skip those
        files.extend(os.path.join(folder, name) for name in names)
    total = 0
    for name in files:
        with contextlib.suppress(OSError):
            total += os.stat(name).st_size
    return round(total / 2**20, 1)
