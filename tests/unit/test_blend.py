"""The blend of the first stage's order with the reranker's: the rule, its setting, and a
search served with it (fake models, whose reranker order is known)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from litestar.testing import AsyncTestClient

from eval.runs import blended_run
from ragrank.blend import reranked_order
from ragrank.errors import SettingsError
from ragrank.settings import Settings
from server import create_app

if TYPE_CHECKING:
    from server.services import Services


def test_no_blend_is_the_rerankers_order_with_ties_in_first_stage_order():
    assert reranked_order([0.1, 0.9, 0.5, 0.9]) == [1, 3, 2, 0]


def test_a_full_blend_is_the_first_stages_order():
    assert reranked_order([0.1, 0.9, 0.5], 1.0) == [0, 1, 2]


def test_an_even_blend_moves_a_candidate_both_orders_like_up():
    # Reranker: 1, 2, 0. First stage: 0, 1, 2. Candidate 0 (first there, last here) beats 2.
    assert reranked_order([0.1, 0.9, 0.5], 0.5) == [1, 0, 2]


@pytest.mark.parametrize("weight", [-0.1, 1.5])
def test_a_blend_outside_zero_to_one_is_refused(weight: float):
    with pytest.raises(ValueError, match="between 0 and 1"):
        reranked_order([0.1], weight)
    with pytest.raises(SettingsError, match="RAGRANK_RERANK_BLEND"):
        Settings(rerank_blend=weight)


def test_the_eval_blends_the_candidates_and_keeps_the_rest_below():
    first = {"q": {"a": 4.0, "b": 3.0, "c": 2.0, "d": 1.0}}
    reranked = {"q": {"a": 0.1, "b": 0.9, "c": 0.5}}
    run = blended_run(first, reranked, candidates=3, blend=0.5)
    assert sorted(run["q"], key=lambda doc: -run["q"][doc]) == ["b", "a", "c", "d"]


async def _results(services: Services, served: float, **extra: Any) -> list[dict[str, Any]]:
    settings = Settings(rerank_blend=served)
    body = {"query": "coffee espresso", "candidates": 10, "top_k": 10, **extra}
    async with AsyncTestClient(app=create_app(settings, services=services)) as client:
        response = await client.post("/v1/search", json=body)
    assert response.status_code == 200, response.text
    results: list[dict[str, Any]] = response.json()["results"]
    return results


async def test_a_search_orders_by_the_blend_and_keeps_the_rerankers_scores(
    indexed_services: Services,
):
    reranked = await _results(indexed_services, 0.0)
    scores = [hit["score"] for hit in reranked]
    assert scores == sorted(scores, reverse=True)
    first_stage = await _results(indexed_services, 1.0)
    assert [hit["retrieval_rank"] for hit in first_stage] == list(range(1, len(reranked) + 1))
    by_rank = {hit["retrieval_rank"]: hit["score"] for hit in reranked}
    assert [hit["score"] for hit in first_stage] == [by_rank[r] for r in sorted(by_rank)]
    assert scores != [hit["score"] for hit in first_stage]  # the reranker moved something


async def test_a_requests_blend_overrides_the_servers(indexed_services: Services):
    first_stage = await _results(indexed_services, 0.0, blend=1)
    assert [hit["retrieval_rank"] for hit in first_stage] == list(range(1, len(first_stage) + 1))
    reranked = await _results(indexed_services, 1.0, blend=0)
    scores = [hit["score"] for hit in reranked]
    assert scores == sorted(scores, reverse=True)


@pytest.mark.parametrize("blend", [-0.5, 1.01, "half"])
async def test_a_bad_blend_is_a_400_naming_the_field(indexed_services: Services, blend: Any):
    async with AsyncTestClient(app=create_app(Settings(), services=indexed_services)) as client:
        response = await client.post("/v1/search", json={"query": "coffee", "blend": blend})
    assert response.status_code == 400, response.text
    assert "blend" in response.text
