"""A run against an earlier report, query by query: the same systems on the same data, before
and after a change of configuration (a backend, a model version, a setting).

Each system both reports ran is compared on each dataset both evaluated (same name, corpus
and queries checksums, split and evaluated queries) with the paired tests of the eval: the
mean delta with its bootstrap interval, Fisher's randomisation test and Student's paired
t-test on the per-query values, and wins, ties and losses. It reads the reports' JSON only, so
an earlier report from another machine or model serves as well.
"""

from __future__ import annotations

import json
import math
import warnings
from typing import TYPE_CHECKING, Any

import numpy as np

from eval.metrics import HEADLINE, METRICS, PERMUTATIONS, SEED, bootstrap_ci, format_p
from ragrank.errors import DocumentError

if TYPE_CHECKING:
    from collections.abc import Mapping
    from pathlib import Path

#: Below this p-value (Fisher's) a change counts as significant, as in the report's notes.
SIGNIFICANCE = 0.05


def read_report(path: Path) -> dict[str, Any]:
    """An earlier `report.json`, or the report folder holding one."""
    file = path / "report.json" if path.is_dir() else path
    try:
        report: dict[str, Any] = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DocumentError(f"--against {path}: not a readable report.json ({exc})") from None
    if not isinstance(report.get("datasets"), list):
        raise DocumentError(f"--against {path}: not a ragrank eval report (no datasets)")
    return report


def against(report: Mapping[str, Any], earlier: Mapping[str, Any], source: str) -> dict[str, Any]:
    """The `against` section of `report`: each shared system on each shared dataset, the
    earlier report's run as the baseline, and the macro average of each system."""
    before = {_identity(d): d for d in earlier["datasets"]}
    rows = []
    for dataset in report["datasets"]:
        old = before.get(_identity(dataset))
        if old is None:
            continue
        queries = list(dataset["per_query"])
        if sorted(queries) != sorted(old["per_query"]):
            continue
        for system in dataset["systems"]:
            if system in old["systems"]:
                rows.append(_paired(dataset["name"], system, queries, old, dataset))
    if not rows:
        raise DocumentError(
            f"--against {source}: it shares no dataset (same name, checksums, split and "
            f"queries) and system with this run"
        )
    macro: dict[str, dict[str, Any]] = {}
    for system in dict.fromkeys(row["system"] for row in rows):
        mine = [row for row in rows if row["system"] == system]
        macro[system] = {
            "datasets": len(mine),
            "before": float(np.mean([row["before"] for row in mine])),
            "after": float(np.mean([row["after"] for row in mine])),
            "delta": float(np.mean([row["delta"] for row in mine])),
            "significant_losses": sum(_significant(row) and row["delta"] < 0 for row in mine),
            "significant_gains": sum(_significant(row) and row["delta"] > 0 for row in mine),
        }
    return {"report": source, "metric": HEADLINE, "rows": rows, "macro": macro}


def _identity(dataset: Mapping[str, Any]) -> str:
    checksums = json.dumps(dataset.get("checksums", {}), sort_keys=True)
    return f"{dataset['name']}|{dataset.get('split')}|{checksums}"


def _significant(row: Mapping[str, Any]) -> bool:
    return bool(row["p_fisher"] < SIGNIFICANCE)


def _paired(
    name: str,
    system: str,
    queries: list[str],
    old: Mapping[str, Any],
    new: Mapping[str, Any],
) -> dict[str, Any]:
    from ranx.statistical_tests import fisher_randomization_test, paired_student_t_test

    control = np.array([old["per_query"][q][system][HEADLINE] for q in queries], dtype=float)
    treatment = np.array([new["per_query"][q][system][HEADLINE] for q in queries], dtype=float)
    deltas = treatment - control
    if np.any(deltas):
        p_fisher = float(fisher_randomization_test(control, treatment, PERMUTATIONS, 0.05, SEED)[0])
        with warnings.catch_warnings():
            # Deltas all (nearly) equal: scipy warns, and the test's p is 0 or undefined.
            warnings.simplefilter("ignore", RuntimeWarning)
            p_student = float(paired_student_t_test(control, treatment, 0.05)[0])
        if math.isnan(p_student):
            p_student = 0.0
    else:  # the same ranking for every query: nothing to test
        p_fisher = p_student = 1.0
    low, high = bootstrap_ci(deltas)
    return {
        "dataset": name,
        "system": system,
        "queries": len(queries),
        "before": float(control.mean()),
        "after": float(treatment.mean()),
        "delta": float(deltas.mean()),
        "delta_ci": [low, high],
        "p_fisher": p_fisher,
        "p_student": p_student,
        "wins": int(np.sum(deltas > 0)),
        "ties": int(np.sum(deltas == 0)),
        "losses": int(np.sum(deltas < 0)),
        "other_metrics": {
            metric: float(
                np.mean([new["per_query"][q][system][metric] for q in queries])
                - np.mean([old["per_query"][q][system][metric] for q in queries])
            )
            for metric in METRICS
            if metric != HEADLINE
        },
    }


def against_rows(section: Mapping[str, Any]) -> tuple[list[str], list[list[str]]]:
    """The section as a table's header and rows (the terminal and report.md show the same),
    the macro average of each system last."""
    header = ["dataset", "system", "before", "after", "Δ [95 % CI]", "p (fisher)", "p (student)"]
    header.append("wins / ties / losses")
    rows = [
        [
            row["dataset"],
            row["system"],
            f"{row['before']:.4f}",
            f"{row['after']:.4f}",
            f"{row['delta']:+.4f} [{row['delta_ci'][0]:+.4f}, {row['delta_ci'][1]:+.4f}]",
            format_p(row["p_fisher"]),
            format_p(row["p_student"]),
            f"{row['wins']} / {row['ties']} / {row['losses']}",
        ]
        for row in section["rows"]
    ]
    for system, macro in section["macro"].items():
        if macro["datasets"] > 1:
            rows.append(
                [
                    f"macro average ({macro['datasets']})",
                    system,
                    f"{macro['before']:.4f}",
                    f"{macro['after']:.4f}",
                    f"{macro['delta']:+.4f}",
                    "",
                    "",
                    f"{macro['significant_gains']} up, {macro['significant_losses']} down "
                    f"(p < {SIGNIFICANCE:g})",
                ]
            )
    return header, rows
