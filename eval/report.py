"""The eval suite's outputs: a table in the terminal, and `report.json` (every number, the
configuration and the environment), `report.md` and PNG plots under the output folder."""

from __future__ import annotations

import json
import platform
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from eval.metrics import (
    BOOTSTRAP_RESAMPLES,
    CONFIDENCE,
    HEADLINE,
    METRICS,
    PERMUTATIONS,
    SEED,
    STAT_TESTS,
    Comparison,
)
from eval.suite import DatasetResult

LIBRARIES = (
    "ragrank",
    "torch",
    "transformers",
    "sentence-transformers",
    "faiss-cpu",
    "faiss-gpu",
    "faiss-gpu-cu12",
    "ranx",
    "qdrant-client",
    "numpy",
    "scipy",
    "matplotlib",
)
#: Largest wins and losses listed per dataset in report.md.
EXTREMES = 5


def build_report(
    results: Sequence[DatasetResult], config: Mapping[str, Any], created: datetime | None = None
) -> dict[str, Any]:
    """The whole report as plain JSON-ready data."""
    return {
        "created": (created or datetime.now(UTC)).isoformat(timespec="seconds"),
        "config": {
            **config,
            "metrics": list(METRICS),
            "headline": HEADLINE,
            "significance": {
                "tests": list(STAT_TESTS),
                "permutations": PERMUTATIONS,
                "bootstrap_resamples": BOOTSTRAP_RESAMPLES,
                "confidence": CONFIDENCE,
                "seed": SEED,
            },
        },
        "environment": environment(),
        "datasets": [_dataset(result) for result in results],
        "macro": macro_average(results),
    }


def environment() -> dict[str, Any]:
    import torch

    versions = {}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "libraries": versions,
    }


def _dataset(result: DatasetResult) -> dict[str, Any]:
    systems = list(result.scores)
    return {
        "name": result.name,
        "path": result.path,
        "split": result.split,
        "checksums": dict(result.checksums),
        "documents": result.documents,
        "judged_queries": result.judged_queries,
        "evaluated_queries": len(result.queries),
        "systems": {
            name: {"metrics": scores.means, f"{HEADLINE}_ci": list(scores.headline_ci)}
            for name, scores in result.scores.items()
        },
        "comparisons": [_comparison(c) for c in result.comparisons],
        "ann_recall_vs_exact": result.ann_recall,
        "timings": result.timings,
        "per_query": {
            qid: {
                "query": text,
                **{
                    name: {m: result.scores[name].per_query[m][qid] for m in METRICS}
                    for name in systems
                },
            }
            for qid, text in result.queries.items()
        },
    }


def _comparison(comparison: Comparison) -> dict[str, Any]:
    return {
        "baseline": comparison.baseline,
        "challenger": comparison.challenger,
        "delta": comparison.delta,
        "delta_ci": {m: list(ci) for m, ci in comparison.delta_ci.items()},
        "p_values": comparison.p_values,
        "wins": comparison.wins,
        "ties": comparison.ties,
        "losses": comparison.losses,
    }


def macro_average(results: Sequence[DatasetResult]) -> dict[str, Any]:
    """Unweighted mean over datasets of each system's metrics and each comparison's delta."""
    systems = {name for result in results for name in result.scores}
    macro: dict[str, Any] = {
        name: {
            metric: float(
                np.mean([r.scores[name].means[metric] for r in results if name in r.scores])
            )
            for metric in METRICS
        }
        for name in sorted(systems)
    }
    deltas: dict[str, list[float]] = {}
    for result in results:
        for c in result.comparisons:
            deltas.setdefault(c.challenger, []).append(c.delta[HEADLINE])
    macro["delta"] = {
        name: {HEADLINE: float(np.mean(values)), "datasets_improved": sum(v > 0 for v in values)}
        for name, values in deltas.items()
    }
    return macro


def print_table(results: Sequence[DatasetResult], console: Console | None = None) -> None:
    """NDCG@10 of each system per dataset, and reranked against cosine."""
    # Piped output would otherwise be cut to 80 columns.
    console = console or Console(width=None if sys.stdout.isatty() else 120)
    systems = list(dict.fromkeys(name for result in results for name in result.scores))
    reranks = "reranked" in systems
    table = Table(title=f"{HEADLINE.upper()}" + (": reranked vs cosine" if reranks else ""))
    for name, justify in [("dataset", "left"), ("queries", "right")] + [
        (name, "right") for name in systems
    ]:
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    if reranks:
        for name in ("Δ [95 % CI]", "p (fisher)", "W/T/L"):
            table.add_column(name, justify="right")
    for result in results:
        row = [result.name, str(len(result.queries))]
        row += [_cell(result.scores, name) for name in systems]
        c = next((c for c in result.comparisons if c.challenger == "reranked"), None)
        if c is not None:
            low, high = c.delta_ci[HEADLINE]
            row += [
                f"{c.delta[HEADLINE]:+.4f} [{low:+.3f}, {high:+.3f}]",
                format_p(c.p_values["fisher"][HEADLINE]),
                f"{c.wins}/{c.ties}/{c.losses}",
            ]
        table.add_row(*row)
    if len(results) > 1:
        macro = macro_average(results)
        row = ["macro average", str(sum(len(r.queries) for r in results))]
        row += [f"{macro[name][HEADLINE]:.4f}" for name in systems]
        if reranks:
            delta = macro["delta"]["reranked"]
            row += [f"{delta[HEADLINE]:+.4f}", "", f"{delta['datasets_improved']} sets ↑"]
        table.add_row(*row, style="bold")
    console.print(table)
    for result in results:
        for c in result.comparisons:
            if c.challenger != "cosine":
                continue
            low, high = c.delta_ci[HEADLINE]
            console.print(
                f"{result.name}: {HEADLINE} of cosine against {c.baseline} (the baseline "
                f"embedder): {_cell(result.scores, 'cosine')} vs "
                f"{_cell(result.scores, c.baseline)}, Δ {c.delta[HEADLINE]:+.4f} "
                f"[{low:+.3f}, {high:+.3f}], p (fisher) {format_p(c.p_values['fisher'][HEADLINE])}"
                f", W/T/L {c.wins}/{c.ties}/{c.losses}"
            )
        if result.ann_recall:
            console.print(
                f"{result.name}: Qdrant's top-k against the exact top-k: "
                + ", ".join(f"{k} {v:.4f}" for k, v in result.ann_recall.items())
            )


def format_p(p: float) -> str:
    """A p-value to four places; a randomisation test cannot resolve below 1/permutations."""
    return f"{p:.4f}" if p >= 1e-4 else "< 0.0001"


def _cell(scores: Mapping[str, Any], name: str) -> str:
    return f"{scores[name].means[HEADLINE]:.4f}" if name in scores else "–"


def write_report(
    report: Mapping[str, Any], results: Sequence[DatasetResult], output: Path
) -> list[Path]:
    """report.json, report.md and the plots; returns the paths written."""
    output.mkdir(parents=True, exist_ok=True)
    written = [output / "report.json", output / "report.md"]
    written[0].write_text(json.dumps(report, indent=2, ensure_ascii=False), encoding="utf-8")
    plots = write_plots(results, output)
    written[1].write_text(markdown(report, [p.name for p in plots]), encoding="utf-8")
    return written + plots


def markdown(report: Mapping[str, Any], plots: Sequence[str]) -> str:
    config = report["config"]
    datasets = report["datasets"]
    systems = list(dict.fromkeys(s for d in datasets for s in d["systems"]))
    reranker = (
        f"reranker `{config['rerank_model']}` · {config['candidates']} candidates"
        if config.get("rerank_model")
        else "no reranker"
    )
    lines = [
        "# ragrank eval",
        "",
        f"{report['created']} · embedder `{config['embed_model']}` · {reranker} · split "
        f"`{config['split']}`",
        "",
        f"## {HEADLINE.upper()}",
        "",
        "| dataset | queries | " + " | ".join(systems) + " | Δ reranked [95 % CI] | p (fisher) "
        "| p (student) | wins / ties / losses |",
        "| --- | ---: | " + " | ".join("---:" for _ in systems) + " | ---: | ---: | ---: | ---: |",
    ]
    for d in datasets:
        cells = [
            f"{d['systems'][s]['metrics'][HEADLINE]:.4f}" if s in d["systems"] else "–"
            for s in systems
        ]
        c = next((c for c in d["comparisons"] if c["challenger"] == "reranked"), None)
        extra = (
            [
                f"{c['delta'][HEADLINE]:+.4f} [{c['delta_ci'][HEADLINE][0]:+.4f}, "
                f"{c['delta_ci'][HEADLINE][1]:+.4f}]",
                format_p(c["p_values"]["fisher"][HEADLINE]),
                format_p(c["p_values"]["student"][HEADLINE]),
                f"{c['wins']} / {c['ties']} / {c['losses']}",
            ]
            if c
            else ["–"] * 4
        )
        lines.append(
            f"| {d['name']} | {d['evaluated_queries']} | " + " | ".join(cells + extra) + " |"
        )
    if len(datasets) > 1:
        macro = report["macro"]
        cells = [f"{macro[s][HEADLINE]:.4f}" for s in systems]
        delta = macro["delta"].get("reranked")
        extra = (
            [
                f"{delta[HEADLINE]:+.4f}",
                "",
                "",
                f"{delta['datasets_improved']} of {len(datasets)} improved",
            ]
            if delta
            else ["–"] * 4
        )
        lines.append("| **macro average** | | " + " | ".join(cells + extra) + " |")
    embedders = [(d, c) for d in datasets for c in d["comparisons"] if c["challenger"] == "cosine"]
    if embedders:
        lines += [
            "",
            f"## The embedder against the baseline embedder `{config['baseline_embed_model']}`",
            "",
            f"| dataset | {embedders[0][1]['baseline']} | cosine | Δ [95 % CI] | p (fisher) "
            "| p (student) | wins / ties / losses |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for d, c in embedders:
            low, high = c["delta_ci"][HEADLINE]
            lines.append(
                f"| {d['name']} "
                f"| {d['systems'][c['baseline']]['metrics'][HEADLINE]:.4f} "
                f"| {d['systems']['cosine']['metrics'][HEADLINE]:.4f} "
                f"| {c['delta'][HEADLINE]:+.4f} [{low:+.4f}, {high:+.4f}] "
                f"| {format_p(c['p_values']['fisher'][HEADLINE])} "
                f"| {format_p(c['p_values']['student'][HEADLINE])} "
                f"| {c['wins']} / {c['ties']} / {c['losses']} |"
            )
    lines += ["", "## All metrics", ""]
    lines += ["| dataset | system | " + " | ".join(METRICS) + " |"]
    lines += ["| --- | --- | " + " | ".join("---:" for _ in METRICS) + " |"]
    for d in datasets:
        for name, system in d["systems"].items():
            values = " | ".join(f"{system['metrics'][m]:.4f}" for m in METRICS)
            lines.append(f"| {d['name']} | {name} | {values} |")
    ann = [d for d in datasets if d["ann_recall_vs_exact"]]
    if ann:
        lines += ["", "## ANN (Qdrant) against exact search", ""]
        lines += ["| dataset | " + " | ".join(ann[0]["ann_recall_vs_exact"]) + " |"]
        lines += ["| --- | " + " | ".join("---:" for _ in ann[0]["ann_recall_vs_exact"]) + " |"]
        for d in ann:
            lines.append(
                f"| {d['name']} | "
                + " | ".join(f"{v:.4f}" for v in d["ann_recall_vs_exact"].values())
                + " |"
            )
    lines += ["", "## Time", ""]
    lines += [
        "| dataset | corpus encode s | embed ms/query | retrieval ms/query | rerank ms/query "
        "| ann ms/query |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for d in datasets:
        t = d["timings"]
        encode = f"{t['corpus_encode_s']:.1f}" + (" (cached)" if t.get("corpus_cached") else "")
        cells = [
            f"{t[k]:.1f}" if k in t else "–"
            for k in (
                "embed_ms_per_query",
                "retrieval_ms_per_query",
                "rerank_ms_per_query",
                "ann_ms_per_query",
            )
        ]
        lines.append(f"| {d['name']} | {encode} | " + " | ".join(cells) + " |")
    for d in datasets:
        if "reranked" not in d["systems"]:
            continue
        moves = sorted(
            (q["reranked"][HEADLINE] - q["cosine"][HEADLINE], qid, q["query"])
            for qid, q in d["per_query"].items()
        )
        lines += ["", f"## {d['name']}: largest wins and losses of reranking ({HEADLINE})", ""]
        lines += ["| Δ | query id | query |", "| ---: | --- | --- |"]
        picked = [m for m in moves[::-1][:EXTREMES] if m[0] > 0] + [
            m for m in moves[:EXTREMES] if m[0] < 0
        ]
        lines += [f"| {delta:+.4f} | {qid} | {text[:120]} |" for delta, qid, text in picked]
    lines += ["", "## Plots", ""] + [f"![{name}]({name})" for name in plots]
    lines += ["", "## Configuration", "", "```json", json.dumps(config, indent=2), "```", ""]
    return "\n".join(lines)


def write_plots(results: Sequence[DatasetResult], output: Path) -> list[Path]:
    """`ndcg10.png`: the headline per system and dataset with 95 % CIs; `deltas.png`: the
    distribution of per-query deltas of each challenger against cosine."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = list(dict.fromkeys(name for result in results for name in result.scores))
    width = 0.8 / len(systems)
    figure, axes = plt.subplots(figsize=(max(6.0, 1.2 * len(results) + 2), 4))
    for offset, name in enumerate(systems):
        xs, means, errors = [], [], []
        for x, result in enumerate(results):
            if name not in result.scores:
                continue
            scores = result.scores[name]
            mean = scores.means[HEADLINE]
            low, high = scores.headline_ci
            xs.append(x + (offset - (len(systems) - 1) / 2) * width)
            means.append(mean)
            errors.append((mean - low, high - mean))
        axes.bar(xs, means, width, yerr=np.array(errors).T, capsize=3, label=name)
    axes.set_xticks(
        range(len(results)), [r.name for r in results], rotation=45 if len(results) > 4 else 0
    )
    axes.set_ylabel(f"{HEADLINE.upper()} (95 % bootstrap CI)")
    axes.set_ylim(0, 1)
    axes.legend()
    figure.tight_layout()
    paths = [output / "ndcg10.png"]
    figure.savefig(paths[0], dpi=120)
    plt.close(figure)

    compared = [(r, c) for r in results for c in r.comparisons]
    if compared:
        columns = min(4, len(compared))
        rows = -(-len(compared) // columns)
        figure, grid = plt.subplots(
            rows, columns, figsize=(3.2 * columns, 2.6 * rows), squeeze=False
        )
        for axis, (result, c) in zip(grid.flat, compared, strict=False):
            deltas = [
                result.scores[c.challenger].per_query[HEADLINE][qid]
                - result.scores[c.baseline].per_query[HEADLINE][qid]
                for qid in result.queries
            ]
            axis.hist(deltas, bins=np.linspace(-1, 1, 41), color="tab:blue")
            axis.axvline(0, color="black", linewidth=0.8)
            axis.set_title(f"{result.name}: {c.challenger} − {c.baseline}", fontsize=9)
            axis.set_xlabel(f"Δ {HEADLINE} per query", fontsize=8)
        for axis in list(grid.flat)[len(compared) :]:
            axis.set_visible(False)
        figure.tight_layout()
        paths.append(output / "deltas.png")
        figure.savefig(paths[-1], dpi=120)
        plt.close(figure)
    return paths
