"""The eval suite's outputs: a table in the terminal, and `report.json` (every number, the
configuration and the environment), `report.md` and PNG plots under the output folder."""

from __future__ import annotations

import json
import platform
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import numpy as np
from rich.console import Console
from rich.table import Table

from eval.against import against_rows
from eval.exact import FAISS_DISTRIBUTIONS, faiss_build, installed_versions
from eval.metrics import (
    BOOTSTRAP_RESAMPLES,
    CONFIDENCE,
    HEADLINE,
    METRICS,
    PERMUTATIONS,
    SEED,
    STAT_TESTS,
    Comparison,
    format_p,
)
from eval.systems import BASELINE, SYSTEMS

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from pathlib import Path

    from eval.suite import DatasetResult

LIBRARIES = (
    "ragrank",
    "torch",
    "transformers",
    "sentence-transformers",
    *FAISS_DISTRIBUTIONS,
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

    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        # Which faiss build the exact search ran on, and where: CPU or GPU.
        "exact_search": faiss_build().describe(),
        "libraries": installed_versions(LIBRARIES),
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
        "oracle_k": result.oracle_k,
        "oracle": result.oracle,
        "ann_recall_vs_exact": result.ann_recall,
        "sparse_query_languages": result.sparse_query_languages,
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
    macro["oracle"] = {
        name: float(np.mean([r.oracle[name] for r in results if name in r.oracle]))
        for name in sorted({name for r in results for name in r.oracle})
    }
    return macro


def print_table(report: Mapping[str, Any], console: Console | None = None) -> None:
    """The terminal's view of the JSON report: NDCG@10 of each system per dataset with its
    oracle@K, then each system against cosine, then the notes."""
    # Piped output would otherwise be cut to 80 columns.
    console = console or Console(width=None if sys.stdout.isatty() else 120)
    datasets = report["datasets"]
    macro = report["macro"]
    systems = list(dict.fromkeys(name for d in datasets for name in d["systems"]))
    depth = datasets[0]["oracle_k"] if datasets else 0
    table = Table(
        title=f"{HEADLINE.upper()} (oracle@{depth}: the best reordering of the top {depth})"
    )
    table.add_column("dataset")
    table.add_column("queries", justify="right")
    for name in systems:
        table.add_column(name, justify="right")
    for d in datasets:
        row = [d["name"], str(d["evaluated_queries"])]
        row += [_cell(d["systems"], name, d["oracle"]) for name in systems]
        table.add_row(*row)
    if len(datasets) > 1:
        row = ["macro average", str(sum(d["evaluated_queries"] for d in datasets))]
        row += [
            f"{macro[name][HEADLINE]:.4f}"
            + (f" ({macro['oracle'][name]:.3f})" if name in macro["oracle"] else "")
            for name in systems
        ]
        table.add_row(*row, style="bold")
    console.print(table)
    console.print(f"exact search: {_exact_search(report)}")
    _print_against_cosine(report, console)
    if "against" in report:
        header, rows = against_rows(report["against"])
        earlier = Table(title=f"{HEADLINE.upper()} against {report['against']['report']}")
        for index, name in enumerate(header):
            earlier.add_column(name, justify="left" if index < 2 else "right")
        for row in rows:
            earlier.add_row(*row, style="bold" if row[0].startswith("macro") else None)
        console.print(earlier)
    _print_notes(report, console)


def _print_against_cosine(report: Mapping[str, Any], console: Console) -> None:
    datasets = report["datasets"]
    compared = [(d, c) for d in datasets for c in d["comparisons"] if c["baseline"] == BASELINE]
    if not compared:
        return
    against = Table(title=f"{HEADLINE.upper()} against cosine")
    for name in ("dataset", "system", "Δ [95 % CI]", "p (fisher)", "W/T/L"):
        against.add_column(name, justify="left" if name in ("dataset", "system") else "right")
    for d, c in compared:
        low, high = c["delta_ci"][HEADLINE]
        against.add_row(
            d["name"],
            c["challenger"],
            f"{c['delta'][HEADLINE]:+.4f} [{low:+.3f}, {high:+.3f}]",
            format_p(c["p_values"]["fisher"][HEADLINE]),
            f"{c['wins']}/{c['ties']}/{c['losses']}",
        )
    if len(datasets) > 1:
        for name, delta in report["macro"]["delta"].items():
            if name != BASELINE:
                against.add_row(
                    "macro average",
                    name,
                    f"{delta[HEADLINE]:+.4f}",
                    "",
                    f"{delta['datasets_improved']} sets ↑",
                    style="bold",
                )
    console.print(against)


def _print_notes(report: Mapping[str, Any], console: Console) -> None:
    """The embedder against its baseline, and ANN recall."""
    for d in report["datasets"]:
        for c in d["comparisons"]:
            if c["challenger"] != BASELINE:
                continue
            low, high = c["delta_ci"][HEADLINE]
            console.print(
                f"{d['name']}: {HEADLINE} of cosine against {c['baseline']} (the baseline "
                f"embedder): {_cell(d['systems'], BASELINE)} vs "
                f"{_cell(d['systems'], c['baseline'])}, Δ {c['delta'][HEADLINE]:+.4f} "
                f"[{low:+.3f}, {high:+.3f}], p (fisher) "
                f"{format_p(c['p_values']['fisher'][HEADLINE])}"
                f", W/T/L {c['wins']}/{c['ties']}/{c['losses']}"
            )
        if d["ann_recall_vs_exact"]:
            console.print(
                f"{d['name']}: Qdrant's top-k against the exact top-k: "
                + ", ".join(f"{k} {v:.4f}" for k, v in d["ann_recall_vs_exact"].items())
            )


def _exact_search(report: Mapping[str, Any]) -> str:
    """The faiss build and device of the exact search (older reports do not say)."""
    return str(report.get("environment", {}).get("exact_search", "faiss (build not recorded)"))


def _cell(systems: Mapping[str, Any], name: str, oracle: Mapping[str, float] | None = None) -> str:
    """A system's headline in a report's dataset, with its oracle@K when given."""
    if name not in systems:
        return "–"
    cell = f"{systems[name]['metrics'][HEADLINE]:.4f}"
    if oracle and name in oracle:
        cell += f" ({oracle[name]:.3f})"
    return cell


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
        f"{report['created']} · embedder `{config['embed_model']}`"
        f"{' (int8)' if config.get('embed_backend') == 'int8' else ''} · {reranker} · split "
        f"`{config['split']}` · exact search {_exact_search(report)}",
        "",
        f"## {HEADLINE.upper()}",
        "",
        f"In brackets, oracle@{datasets[0]['oracle_k'] if datasets else 0}: the {HEADLINE} of "
        "the best reordering of each system's top candidates, the most any reranker of them "
        "could reach.",
        "",
        "| dataset | queries | " + " | ".join(systems) + " |",
        "| --- | ---: | " + " | ".join("---:" for _ in systems) + " |",
    ]
    for d in datasets:
        cells = [
            (
                f"{d['systems'][s]['metrics'][HEADLINE]:.4f}"
                + (f" ({d['oracle'][s]:.3f})" if s in d.get("oracle", {}) else "")
            )
            if s in d["systems"]
            else "–"
            for s in systems
        ]
        lines.append(f"| {d['name']} | {d['evaluated_queries']} | " + " | ".join(cells) + " |")
    if len(datasets) > 1:
        macro = report["macro"]
        cells = [
            f"{macro[s][HEADLINE]:.4f}"
            + (f" ({macro['oracle'][s]:.3f})" if s in macro.get("oracle", {}) else "")
            for s in systems
        ]
        lines.append("| **macro average** | | " + " | ".join(cells) + " |")
    lines += _against_cosine(report)
    if "against" in report:
        header, rows = against_rows(report["against"])
        lines += ["", f"## Against the earlier report `{report['against']['report']}`", ""]
        lines += [
            "Each system before (the earlier report) and after (this run), on the same queries.",
            "",
            "| " + " | ".join(header) + " |",
            "| --- | --- | " + " | ".join("---:" for _ in header[2:]) + " |",
        ]
        lines += ["| " + " | ".join(row) + " |" for row in rows]
    return _markdown_rest(report, plots, lines)


def _against_cosine(report: Mapping[str, Any]) -> list[str]:
    """Each system against cosine, per dataset and on the macro average."""
    datasets = report["datasets"]
    lines: list[str] = []
    against = [(d, c) for d in datasets for c in d["comparisons"] if c["baseline"] == "cosine"]
    if against:
        lines += [
            "",
            "## Against cosine",
            "",
            "| dataset | system | Δ [95 % CI] | p (fisher) | p (student) | wins / ties / losses |",
            "| --- | --- | ---: | ---: | ---: | ---: |",
        ]
        for d, c in against:
            low, high = c["delta_ci"][HEADLINE]
            lines.append(
                f"| {d['name']} | {c['challenger']} "
                f"| {c['delta'][HEADLINE]:+.4f} [{low:+.4f}, {high:+.4f}] "
                f"| {format_p(c['p_values']['fisher'][HEADLINE])} "
                f"| {format_p(c['p_values']['student'][HEADLINE])} "
                f"| {c['wins']} / {c['ties']} / {c['losses']} |"
            )
        if len(datasets) > 1:
            for name, delta in report["macro"]["delta"].items():
                if name != "cosine":
                    lines.append(
                        f"| **macro average** | {name} | {delta[HEADLINE]:+.4f} | | "
                        f"| {delta['datasets_improved']} of {len(datasets)} improved |"
                    )
    return lines


def _markdown_rest(report: Mapping[str, Any], plots: Sequence[str], lines: list[str]) -> str:
    """The baseline embedder, all metrics, ANN recall, times, extremes, plots, config."""
    config = report["config"]
    datasets = report["datasets"]
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
    timed = [system.timing_key for system in SYSTEMS.values()]
    labels = [key.removesuffix("_ms_per_query").replace("_", "-") for key in timed]
    lines += [
        "| dataset | corpus encode s | BM25 encode s | embed ms/query | "
        + " | ".join(f"{label} ms/query" for label in labels)
        + " |",
        "| --- | ---: | ---: | ---: | " + " | ".join("---:" for _ in labels) + " |",
    ]
    for d in datasets:
        t = d["timings"]
        encode = f"{t['corpus_encode_s']:.1f}" + (" (cached)" if t.get("corpus_cached") else "")
        keys = ("sparse_encode_s", "embed_ms_per_query", *timed)
        cells = [f"{t[k]:.1f}" if k in t else "–" for k in keys]
        lines.append(f"| {d['name']} | {encode} | " + " | ".join(cells) + " |")
    for d in datasets:
        for challenger, system in SYSTEMS.items():
            if system.extremes and challenger in d["systems"]:
                lines += _extremes(d, challenger)
    lines += ["", "## Plots", ""] + [f"![{name}]({name})" for name in plots]
    lines += ["", "## Configuration", "", "```json", json.dumps(config, indent=2), "```", ""]
    return "\n".join(lines)


def _extremes(d: Mapping[str, Any], challenger: str) -> list[str]:
    """The largest per-query wins and losses of `challenger` against cosine."""
    moves = sorted(
        (q[challenger][HEADLINE] - q["cosine"][HEADLINE], qid, q["query"])
        for qid, q in d["per_query"].items()
    )
    lines = ["", f"## {d['name']}: largest wins and losses of {challenger} ({HEADLINE})", ""]
    lines += ["| Δ | query id | query |", "| ---: | --- | --- |"]
    picked = [m for m in moves[::-1][:EXTREMES] if m[0] > 0] + [
        m for m in moves[:EXTREMES] if m[0] < 0
    ]
    lines += [f"| {delta:+.4f} | {qid} | {text[:120]} |" for delta, qid, text in picked]
    return lines


def write_plots(results: Sequence[DatasetResult], output: Path) -> list[Path]:
    """`ndcg10.png`: the headline per system and dataset with 95 % CIs, and a dash at each
    system's oracle@K; `deltas.png`: the
    distribution of per-query deltas of each challenger against cosine."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = list(dict.fromkeys(name for result in results for name in result.scores))
    width = 0.8 / len(systems)
    figure, axes = plt.subplots(figsize=(max(6.0, 1.2 * len(results) + 2), 4))
    for offset, name in enumerate(systems):
        xs, means, errors, shown = [], [], [], []
        for x, result in enumerate(results):
            if name not in result.scores:
                continue
            shown.append(result)
            scores = result.scores[name]
            mean = scores.means[HEADLINE]
            low, high = scores.headline_ci
            xs.append(x + (offset - (len(systems) - 1) / 2) * width)
            means.append(mean)
            errors.append((mean - low, high - mean))
        bars = axes.bar(xs, means, width, yerr=np.array(errors).T, capsize=3, label=name)
        ceilings = [(x, r.oracle[name]) for x, r in zip(xs, shown, strict=True) if name in r.oracle]
        if ceilings:
            axes.scatter(
                [x for x, _ in ceilings],
                [c for _, c in ceilings],
                marker="_",
                s=400,
                color=bars.patches[0].get_facecolor(),
                label=f"{name} oracle@{results[0].oracle_k}",
            )
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
