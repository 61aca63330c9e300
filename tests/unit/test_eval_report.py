"""The eval report's table of what a cascade's fast reranker keeps of the default one's gain."""

from __future__ import annotations

from typing import Any

from eval.report import markdown


def report(macro: dict[str, float]) -> dict[str, Any]:
    """A report with nothing but each system's macro NDCG@10."""
    return {
        "created": "now",
        "config": {"embed_model": "m", "split": "test"},
        "datasets": [],
        "macro": {name: {"ndcg@10": value} for name, value in macro.items()},
    }


def kept_rows(text: str) -> list[str]:
    section = text.split("keeps of the default one's gain over hybrid")[1].split(
        "\n## ", maxsplit=1
    )[0]
    return [line for line in section.splitlines() if line.startswith("| hybrid-")]


def test_the_fast_rerankers_share_of_the_gain_alone_and_blended():
    text = markdown(
        report(
            {
                "hybrid": 0.80,
                "hybrid-reranked": 0.82,
                "cascade-first": 0.815,
                "hybrid-blended": 0.84,
                "cascade-first-blended": 0.83,
            }
        ),
        [],
    )
    assert kept_rows(text) == [
        "| hybrid-reranked | cascade-first | +0.0200 | +0.0150 | 75% |",
        "| hybrid-blended | cascade-first-blended | +0.0400 | +0.0300 | 75% |",
    ]


def test_a_default_reranker_below_the_first_stage_has_no_share_to_keep():
    text = markdown(report({"hybrid": 0.80, "hybrid-reranked": 0.79, "cascade-first": 0.81}), [])
    assert kept_rows(text) == [
        "| hybrid-reranked | cascade-first | -0.0100 | +0.0100 | none to keep |"
    ]


def test_without_a_cascade_there_is_no_table():
    text = markdown(report({"hybrid": 0.80, "hybrid-reranked": 0.82}), [])
    assert "keeps of the default one's gain" not in text
