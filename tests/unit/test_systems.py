"""The eval's system registry: what the options, the suite and the reports read."""

from __future__ import annotations

import dataclasses

import pytest

from eval.options import EvalOptions
from eval.systems import BASELINE, DEFAULT_SYSTEMS, SYSTEMS, plan
from ragrank.errors import SettingsError


def test_each_system_comes_after_the_first_stage_it_reorders():
    order = list(SYSTEMS)
    assert order[0] == BASELINE
    for name, system in SYSTEMS.items():
        if system.first_stage is not None:
            assert system.first_stage in SYSTEMS, name
            assert order.index(system.first_stage) < order.index(name), name
            assert system.needs_reranker, f"{name} reorders a first stage with the reranker"


def test_a_plan_adds_the_baseline_and_every_first_stage_in_registry_order():
    assert [s.name for s in plan(["hybrid-reranked"])] == [BASELINE, "hybrid", "hybrid-reranked"]
    assert [s.name for s in plan(["bm25", "reranked"])] == [BASELINE, "bm25", "reranked"]
    assert [s.name for s in plan([])] == [BASELINE]


def test_what_a_system_needs_follows_from_how_it_runs():
    for name in ("ann", "bm25", "hybrid"):
        assert SYSTEMS[name].needs_store
    assert SYSTEMS["bm25"].needs_sparse and SYSTEMS["hybrid"].needs_sparse
    assert not SYSTEMS["ann"].needs_sparse
    # A reranked system needs what its first stage needs, through the plan.
    needs = [s for s in plan(["hybrid-reranked"]) if s.needs_sparse]
    assert [s.name for s in needs] == ["hybrid"]


def test_the_options_offer_exactly_the_registered_systems():
    field = next(f for f in dataclasses.fields(EvalOptions) if f.name == "systems")
    assert field.metadata["choices"] == tuple(SYSTEMS)
    assert field.default == DEFAULT_SYSTEMS
    for name in SYSTEMS:
        assert f"{name} (" in field.metadata["help"]
    with pytest.raises(SettingsError, match="unknown rerankd"):
        EvalOptions(systems=("cosine", "rerankd"))


def test_timing_keys_are_distinct():
    keys = [system.timing_key for system in SYSTEMS.values()]
    assert len(keys) == len(set(keys))
    assert SYSTEMS[BASELINE].timing_key == "retrieval_ms_per_query"
    assert SYSTEMS["reranked"].timing_key == "rerank_ms_per_query"
