"""The eval suite's outputs: a table in the terminal, and `report.json` (every number, the
configuration and the environment), `report.md` and PNG plots under the output folder."""

from __future__ import annotations

import json
import platform
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import numpy as np
from rich.console import Console
from rich.table import Table

from eval.against import against_rows
from eval.exact import FAISS_DISTRIBUTIONS, faiss_build, installed_versions
from eval.metrics import (
    ALPHA,
    BOOTSTRAP_RESAMPLES,
    CONFIDENCE,
    HEADLINE,
    METRICS,
    PERMUTATIONS,
    SEED,
    STAT_TESTS,
    Comparison,
    bootstrap_ci,
    format_p,
    paired_tests,
)
from eval.systems import (
    BASELINE,
    BLEND_RERANKED,
    CASCADE_FIRST,
    CASCADE_FIRST_BLENDED,
    CASCADE_STAGE,
    LARGE_BLENDED,
    SYSTEMS,
)

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
        "reliability": result.reliability,
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


def pooled_comparisons(results: Sequence[DatasetResult]) -> dict[str, dict[str, Any]]:
    """Baseline → challenger → the macro comparison: every dataset's queries pooled (their
    mean is the macro average when the datasets hold as many queries each, as XQuAD-R's
    languages do), with a bootstrap interval, both paired tests, wins, ties and losses, and
    the datasets improved and significantly worse."""
    pooled: dict[tuple[str, str], list[float]] = {}
    improved: dict[tuple[str, str], list[float]] = {}
    worse: dict[tuple[str, str], int] = {}
    for result in results:
        for c in result.comparisons:
            key = (c.baseline, c.challenger)
            after = result.scores[c.challenger].per_query[HEADLINE]
            before = result.scores[c.baseline].per_query[HEADLINE]
            pooled.setdefault(key, []).extend(after[q] - before[q] for q in after)
            improved.setdefault(key, []).append(c.delta[HEADLINE])
            lost = c.delta[HEADLINE] < 0 and c.p_values["fisher"][HEADLINE] < ALPHA
            worse[key] = worse.get(key, 0) + int(lost)
    versus: dict[str, dict[str, Any]] = {}
    for (baseline, challenger), values in pooled.items():
        deltas = np.asarray(values)
        versus.setdefault(baseline, {})[challenger] = {
            "queries": len(deltas),
            "delta": float(deltas.mean()),
            "delta_ci": list(bootstrap_ci(deltas)),
            "p_values": paired_tests(deltas),
            "wins": int((deltas > 0).sum()),
            "ties": int((deltas == 0).sum()),
            "losses": int((deltas < 0).sum()),
            "datasets_improved": sum(d > 0 for d in improved[(baseline, challenger)]),
            "datasets_significantly_worse": worse[(baseline, challenger)],
            "datasets": len(improved[(baseline, challenger)]),
        }
    return versus


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
    macro["versus"] = pooled_comparisons(results)
    macro["oracle"] = {
        name: float(np.mean([r.oracle[name] for r in results if name in r.oracle]))
        for name in sorted({name for r in results for name in r.oracle})
    }
    return macro


@dataclass(frozen=True)
class ReportTable:
    """One table of the report, rendered alike to the terminal (rich) and to report.md: the
    cells are text; the first `labels` columns are left-aligned and the rest, numbers, right
    (`right` names the right-aligned columns instead)."""

    title: str
    header: Sequence[str]
    rows: Sequence[Sequence[str]]
    #: Rows shown in bold: the macro averages.
    bold: frozenset[int] = frozenset()
    labels: int = 1
    right: frozenset[int] | None = None
    #: A sentence under the title.
    note: str = ""

    def _right(self, column: int) -> bool:
        return column in self.right if self.right is not None else column >= self.labels

    def rich(self) -> Table:
        table = Table(title=self.title, caption=self.note or None)
        for index, name in enumerate(self.header):
            table.add_column(name, justify="right" if self._right(index) else "left")
        for index, row in enumerate(self.rows):
            table.add_row(*row, style="bold" if index in self.bold else None)
        return table

    def markdown(self) -> list[str]:
        align = ["---:" if self._right(i) else "---" for i in range(len(self.header))]
        lines = ["", f"## {self.title}", ""] + ([self.note, ""] if self.note else [])
        lines += ["| " + " | ".join(self.header) + " |", "| " + " | ".join(align) + " |"]
        for index, row in enumerate(self.rows):
            cells = list(row)
            if index in self.bold and cells[0]:
                cells[0] = f"**{cells[0]}**"
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
        return lines


def _tables(report: Mapping[str, Any]) -> list[ReportTable]:
    """The tables both the terminal and report.md show, in order."""
    tables = [_headline(report), _against_cosine(report)]
    tables += [
        _versus(report, baseline)
        for baseline in report["config"].get("versus", ())
        if baseline != BASELINE
    ]
    tables += [_pairs(report), _kept(report), _reliability(report), _embedder(report)]
    if "against" in report:
        header, rows = against_rows(report["against"])
        tables.append(
            ReportTable(
                title=f"Against the earlier report `{report['against']['report']}`",
                header=header,
                rows=rows,
                bold=frozenset(i for i, r in enumerate(rows) if r[0].startswith("macro")),
                labels=2,
                note="Each system before (the earlier report) and after (this run), on the "
                "same queries.",
            )
        )
    tables.append(_ann(report))
    return [table for table in tables if table.rows]


def _headline(report: Mapping[str, Any]) -> ReportTable:
    datasets, macro = report["datasets"], report["macro"]
    systems = list(dict.fromkeys(name for d in datasets for name in d["systems"]))
    depth = datasets[0]["oracle_k"] if datasets else 0
    rows = [
        [d["name"], str(d["evaluated_queries"])]
        + [_cell(d["systems"], name, d.get("oracle")) for name in systems]
        for d in datasets
    ]
    if len(datasets) > 1:
        rows.append(
            ["macro average", str(sum(d["evaluated_queries"] for d in datasets))]
            + [
                f"{macro[name][HEADLINE]:.4f}"
                + (f" ({macro['oracle'][name]:.3f})" if name in macro.get("oracle", {}) else "")
                for name in systems
            ]
        )
    return ReportTable(
        title=f"{HEADLINE.upper()} (oracle@{depth}: the best reordering of the top {depth})",
        header=["dataset", "queries", *systems],
        rows=rows,
        bold=frozenset({len(datasets)} if len(datasets) > 1 else ()),
        note=f"In brackets, oracle@{depth}: the {HEADLINE} of the best reordering of each "
        "system's top candidates, the most any reranker of them could reach.",
    )


def _comparison_cells(c: Mapping[str, Any]) -> list[str]:
    """Δ with its interval, both p-values, and wins / ties / losses of one comparison."""
    low, high = c["delta_ci"][HEADLINE]
    return [
        f"{c['delta'][HEADLINE]:+.4f} [{low:+.4f}, {high:+.4f}]",
        format_p(c["p_values"]["fisher"][HEADLINE]),
        format_p(c["p_values"]["student"][HEADLINE]),
        f"{c['wins']} / {c['ties']} / {c['losses']}",
    ]


COMPARED = ["Δ [95 % CI]", "p (fisher)", "p (student)", "wins / ties / losses"]


def _against_cosine(report: Mapping[str, Any]) -> ReportTable:
    """Each system against cosine, per dataset and on the macro average."""
    datasets = report["datasets"]
    compared = [(d, c) for d in datasets for c in d["comparisons"] if c["baseline"] == BASELINE]
    rows = [[d["name"], c["challenger"], *_comparison_cells(c)] for d, c in compared]
    first_macro = len(rows)
    if compared and len(datasets) > 1:
        rows += [
            [
                "macro average",
                name,
                f"{delta[HEADLINE]:+.4f}",
                "",
                "",
                f"{delta['datasets_improved']} of {len(datasets)} improved",
            ]
            for name, delta in report["macro"]["delta"].items()
            if name != BASELINE
        ]
    return ReportTable(
        title=f"{HEADLINE.upper()} against cosine",
        header=["dataset", "system", *COMPARED],
        rows=rows,
        bold=frozenset(range(first_macro, len(rows))),
        labels=2,
    )


def _versus(report: Mapping[str, Any], baseline: str) -> ReportTable:
    """Each system against `baseline` (`--versus`), per dataset, then on every query pooled
    (the macro average) with its own interval and paired tests."""
    datasets = report["datasets"]
    compared = [(d, c) for d in datasets for c in d["comparisons"] if c["baseline"] == baseline]
    rows = [[d["name"], c["challenger"], *_comparison_cells(c)] for d, c in compared]
    first_macro = len(rows)
    for name, c in report["macro"].get("versus", {}).get(baseline, {}).items():
        low, high = c["delta_ci"]
        rows.append(
            [
                f"macro average ({c['queries']} queries)",
                name,
                f"{c['delta']:+.4f} [{low:+.3f}, {high:+.3f}]",
                format_p(c["p_values"]["fisher"]),
                format_p(c["p_values"]["student"]),
                f"{c['wins']}/{c['ties']}/{c['losses']}; {c['datasets_improved']} of "
                f"{c['datasets']} improved, {c['datasets_significantly_worse']} significantly "
                "worse",
            ]
        )
    return ReportTable(
        title=f"{HEADLINE.upper()} against {baseline}",
        header=["dataset", "system", *COMPARED],
        rows=rows,
        bold=frozenset(range(first_macro, len(rows))),
        labels=2,
        note=f"Significantly worse: Δ < 0 at p < {ALPHA:.2f} (Fisher's randomisation test).",
    )


def _pairs(report: Mapping[str, Any]) -> ReportTable:
    """Each reranking system's macro NDCG@10 and the pairs per query each of its rerankers
    scored: what the cascade saves of the large model's work."""
    rows = []
    macro = report["macro"]
    for name in macro:
        keys = {
            stage: [
                d["timings"].get(f"{name}_{stage}_pairs_per_query")
                for d in report["datasets"]
                if f"{name}_{stage}_pairs_per_query" in d["timings"]
            ]
            for stage in ("default", "fast")
        }
        if not any(keys.values()) or HEADLINE not in macro[name]:
            continue
        cells = [f"{np.mean(v):.1f}" if v else "0" for v in (keys["default"], keys["fast"])]
        rows.append([name, f"{macro[name][HEADLINE]:.4f}", *cells])
    return ReportTable(
        title="The rerankers' work",
        header=["system", f"macro {HEADLINE}", "default reranker pairs/query", "fast pairs/query"],
        rows=rows,
        note="Pairs per query each reranker scored; the cascade's default reranker scores its K.",
    )


#: The systems a cascade's run sets side by side, (the default reranker's, the fast one's):
#: alone, and each blended with their first stage.
KEPT_PAIRS = (
    (BLEND_RERANKED, CASCADE_FIRST),
    (LARGE_BLENDED, CASCADE_FIRST_BLENDED),
)


def _kept(report: Mapping[str, Any]) -> ReportTable:
    """The cascade's fast reranker's macro gain over the first stage both rerank, as a share of
    the default reranker's: what a distilled student keeps of its teacher's gain, measured in
    one run so that both rerank the same candidates."""
    macro = report["macro"]
    first = macro.get(CASCADE_STAGE, {}).get(HEADLINE)
    rows = []
    for large, fast in KEPT_PAIRS:
        if (
            first is None
            or HEADLINE not in macro.get(large, {})
            or HEADLINE not in macro.get(fast, {})
        ):
            continue
        gained, kept = macro[large][HEADLINE] - first, macro[fast][HEADLINE] - first
        # A share of a loss, or of nothing, would read as progress where there is none.
        share = f"{kept / gained:.0%}" if gained > 0 else "none to keep"
        rows.append([large, fast, f"{gained:+.4f}", f"{kept:+.4f}", share])
    return ReportTable(
        title=f"What the fast reranker keeps of the default one's gain over {CASCADE_STAGE}",
        header=["default reranker", "fast reranker", "default gain", "fast gain", "kept"],
        rows=rows,
        labels=2,
        note=f"Macro {HEADLINE.upper()} minus {CASCADE_STAGE}'s, over the same candidates; "
        "kept: the fast gain as a share of the default one.",
    )


def _reliability(report: Mapping[str, Any]) -> ReportTable:
    """How far each reranking system's relevance scores are from the observed relevance of
    the pairs it reranked: the expected calibration error of the plain sigmoid and of the
    model's calibration."""
    rows = []
    for d in report["datasets"]:
        for name, r in d.get("reliability", {}).items():
            calibrated = f"{r['ece_calibrated']:.4f}" if "ece_calibrated" in r else "–"
            rows.append(
                [
                    d["name"],
                    name,
                    f"{int(r['pairs']):,}",
                    f"{r['relevant_share']:.3f}",
                    f"{r['ece_sigmoid']:.4f}",
                    calibrated,
                ]
            )
    return ReportTable(
        title="Reliability of the relevance scores",
        header=["dataset", "system", "pairs", "relevant", "ECE sigmoid", "ECE calibrated"],
        rows=rows,
        labels=2,
        note="Expected calibration error over 10 bins (0: a score of p means relevant p of the "
        "time); calibrated: the model's Platt scaling, fitted on its validation queries.",
    )


def _embedder(report: Mapping[str, Any]) -> ReportTable:
    """Cosine retrieval with the embedder against the baseline embedder's."""
    compared = [
        (d, c) for d in report["datasets"] for c in d["comparisons"] if c["challenger"] == BASELINE
    ]
    baseline = compared[0][1]["baseline"] if compared else ""
    rows = [
        [
            d["name"],
            _cell(d["systems"], c["baseline"]),
            _cell(d["systems"], BASELINE),
            *_comparison_cells(c),
        ]
        for d, c in compared
    ]
    embed_model = report["config"].get("baseline_embed_model", baseline)
    return ReportTable(
        title=f"The embedder against the baseline embedder `{embed_model}`",
        header=["dataset", baseline, BASELINE, *COMPARED],
        rows=rows,
        note=f"{HEADLINE} of {BASELINE} against {baseline}, the baseline embedder.",
    )


def _ann(report: Mapping[str, Any]) -> ReportTable:
    datasets = [d for d in report["datasets"] if d["ann_recall_vs_exact"]]
    return ReportTable(
        title="ANN (Qdrant) against exact search",
        header=["dataset", *(datasets[0]["ann_recall_vs_exact"] if datasets else ())],
        rows=[
            [d["name"], *(f"{v:.4f}" for v in d["ann_recall_vs_exact"].values())] for d in datasets
        ],
        note="Qdrant's top-k against the exact top-k (faiss).",
    )


def print_table(report: Mapping[str, Any], console: Console | None = None) -> None:
    """The terminal's view of the JSON report: the tables report.md opens with."""
    # Piped output would otherwise be cut to 80 columns.
    console = console or Console(width=None if sys.stdout.isatty() else 120)
    for table in _tables(report):
        console.print(table.rich())
    console.print(f"exact search: {_exact_search(report)}")


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


def _backend(config: Mapping[str, Any]) -> str:
    """The embedder's backend recipe beside its name, unless it is torch's."""
    backend = config.get("embed_backend", "torch")
    return "" if backend in ("torch", "auto") else f" ({backend})"


def markdown(report: Mapping[str, Any], plots: Sequence[str]) -> str:
    config = report["config"]
    reranker = (
        f"reranker `{config['rerank_model']}` · {config['candidates']} candidates"
        if config.get("rerank_model")
        else "no reranker"
    )
    lines = [
        "# ragrank eval",
        "",
        f"{report['created']} · embedder `{config['embed_model']}`"
        f"{_backend(config)} · {reranker} · split "
        f"`{config.get('split')}` · exact search {_exact_search(report)}",
    ]
    for table in [*_tables(report), _all_metrics(report), _time(report)]:
        lines += table.markdown() if table.rows else []
    for d in report["datasets"]:
        for challenger, system in SYSTEMS.items():
            if system.extremes and challenger in d["systems"]:
                lines += _extremes(d, challenger).markdown()
    lines += ["", "## Plots", ""] + [f"![{name}]({name})" for name in plots]
    lines += ["", "## Configuration", "", "```json", json.dumps(config, indent=2), "```", ""]
    return "\n".join(lines)


def _all_metrics(report: Mapping[str, Any]) -> ReportTable:
    return ReportTable(
        title="All metrics",
        header=["dataset", "system", *METRICS],
        rows=[
            [d["name"], name, *(f"{system['metrics'][m]:.4f}" for m in METRICS)]
            for d in report["datasets"]
            for name, system in d["systems"].items()
        ],
        labels=2,
    )


def _time(report: Mapping[str, Any]) -> ReportTable:
    timed = [system.timing_key for system in SYSTEMS.values()]
    labels = [key.removesuffix("_ms_per_query").replace("_", "-") for key in timed]
    rows = []
    for d in report["datasets"]:
        t = d["timings"]
        encode = f"{t['corpus_encode_s']:.1f}" + (" (cached)" if t.get("corpus_cached") else "")
        keys = ("sparse_encode_s", "embed_ms_per_query", *timed)
        rows.append([d["name"], encode, *(f"{t[k]:.1f}" if k in t else "–" for k in keys)])
    return ReportTable(
        title="Time",
        header=[
            "dataset",
            "corpus encode s",
            "BM25 encode s",
            "embed ms/query",
            *(f"{label} ms/query" for label in labels),
        ],
        rows=rows,
    )


def _extremes(d: Mapping[str, Any], challenger: str) -> ReportTable:
    """The largest per-query wins and losses of `challenger` against cosine."""
    moves = sorted(
        (q[challenger][HEADLINE] - q[BASELINE][HEADLINE], qid, q["query"])
        for qid, q in d["per_query"].items()
    )
    picked = [m for m in moves[::-1][:EXTREMES] if m[0] > 0] + [
        m for m in moves[:EXTREMES] if m[0] < 0
    ]
    return ReportTable(
        title=f"{d['name']}: largest wins and losses of {challenger} ({HEADLINE})",
        header=["Δ", "query id", "query"],
        rows=[[f"{delta:+.4f}", qid, text[:120]] for delta, qid, text in picked],
        right=frozenset({0}),
    )


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
