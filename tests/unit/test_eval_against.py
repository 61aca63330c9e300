"""`ragrank eval --against`: each system against the same one in an earlier report, query by
query, with the paired tests."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from eval.against import against, against_rows, read_report
from eval.metrics import METRICS
from eval.report import markdown
from ragrank.errors import DocumentError

if TYPE_CHECKING:
    from pathlib import Path


def report(name: str, ndcg: dict[str, list[float]], checksum: str = "c1") -> dict[str, Any]:
    """A report with one dataset whose systems score `ndcg` per query."""
    queries = len(next(iter(ndcg.values())))
    return {
        "datasets": [
            {
                "name": name,
                "split": "test",
                "checksums": {"corpus.jsonl": checksum},
                "systems": {system: {} for system in ndcg},
                "per_query": {
                    f"q{i}": {
                        system: {metric: values[i] for metric in METRICS}
                        for system, values in ndcg.items()
                    }
                    for i in range(queries)
                },
            }
        ]
    }


def two(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    return {"datasets": first["datasets"] + second["datasets"]}


RNG = np.random.default_rng(0)
BEFORE = RNG.uniform(0.2, 0.9, 200).round(3).tolist()


def test_the_same_runs_differ_in_nothing():
    earlier = report("set", {"cosine": BEFORE, "hybrid": BEFORE})
    section = against(earlier, earlier, "old")
    assert [(r["system"], r["delta"], r["p_fisher"]) for r in section["rows"]] == [
        ("cosine", 0.0, 1.0),
        ("hybrid", 0.0, 1.0),
    ]
    assert section["rows"][0]["ties"] == 200


def test_a_loss_on_most_queries_is_significant_and_a_small_jitter_is_not():
    lower = [v - 0.05 for v in BEFORE]
    jitter = (np.array(BEFORE) + RNG.normal(0, 0.01, 200)).tolist()
    earlier = report("set", {"cosine": BEFORE, "hybrid": BEFORE})
    section = against(report("set", {"cosine": lower, "hybrid": jitter}), earlier, "old")
    loss, noise = section["rows"]
    assert loss["delta"] == pytest.approx(-0.05)
    assert loss["p_fisher"] < 0.001 and loss["p_student"] < 0.001 and loss["losses"] == 200
    assert loss["delta_ci"][1] < 0
    assert noise["p_fisher"] > 0.05 and noise["delta_ci"][0] < 0 < noise["delta_ci"][1]
    assert section["macro"]["cosine"]["significant_losses"] == 1
    assert section["macro"]["hybrid"]["significant_losses"] == 0


def test_only_the_same_data_and_systems_are_paired():
    earlier = two(report("a", {"cosine": BEFORE}), report("b", {"cosine": BEFORE}, "other"))
    now = two(report("a", {"cosine": BEFORE, "hybrid": BEFORE}), report("b", {"cosine": BEFORE}))
    section = against(now, earlier, "old")
    assert [(r["dataset"], r["system"]) for r in section["rows"]] == [("a", "cosine")]
    with pytest.raises(DocumentError, match="--against old: it shares no dataset"):
        against(report("c", {"cosine": BEFORE}), earlier, "old")


def test_the_macro_row_and_the_markdown_show_the_comparison(tmp_path: Path):
    earlier = two(report("a", {"cosine": BEFORE}), report("b", {"cosine": BEFORE}))
    now = two(report("a", {"cosine": [v - 0.01 for v in BEFORE]}), report("b", {"cosine": BEFORE}))
    section = against(now, earlier, "old")
    assert section["macro"]["cosine"]["delta"] == pytest.approx(-0.005)
    header, rows = against_rows(section)
    assert rows[-1][:2] == ["macro average (2)", "cosine"] and rows[-1][4] == "-0.0050"
    assert len(header) == len(rows[0])
    (tmp_path / "report.json").write_text(json.dumps(earlier))
    assert read_report(tmp_path) == earlier
    with pytest.raises(DocumentError, match=r"not a readable report\.json"):
        read_report(tmp_path / "missing")


def test_the_report_markdown_has_the_section():
    earlier = report("a", {"cosine": BEFORE})
    full = {
        "created": "now",
        "config": {
            "embed_model": "m",
            "embed_backend": "openvino-int8:nncf-static-transformer/1",
            "split": "test",
        },
        "datasets": [],
        "macro": {},
        "against": against(earlier, earlier, "old"),
    }
    text = markdown(full, [])
    assert (
        "## Against the earlier report `old`" in text
        and "(openvino-int8:nncf-static-transformer/1)" in text
    )
