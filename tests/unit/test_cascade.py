"""The cascade (a fast reranker scores every candidate, the default one rescores its top K),
calibrated scores and `min_score`, through the core's rule and over HTTP with fake models:
the fast one ranks short passages first, the default one long passages first, so which model
placed each result is known in advance."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
from litestar.testing import AsyncTestClient

from eval.calibration import expected_calibration_error, fit_platt
from ragrank.calibration import Calibration, probabilities, read_calibration, write_calibration
from ragrank.cascade import cascade_order, shortlist
from ragrank.documents import passage_text
from ragrank.errors import SettingsError
from ragrank.inference import Cascade, Served, role_spec
from ragrank.roles import RERANK
from ragrank.settings import Settings
from server import create_app
from tests.fakes import FakeScorer, ShortFirstScorer, fake_inference, swap_models

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from server.services import Services

DOCUMENTS = [
    "a",
    "bbbbbbbbbbbbbbbbbbbb",
    "cc",
    "dddddddddd",
    "eeeee",
    "ffffffffffffffffffffffffffffff",
]


def test_the_shortlist_is_the_fast_models_best_and_the_rest_keep_its_order():
    fast = [0.1, 0.9, 0.5, 0.7, 0.3]
    assert shortlist(fast, 2) == [1, 3]
    merged = cascade_order(fast, [1, 3], [0.2, 0.8])
    assert merged.order == [3, 1, 2, 4, 0]
    assert merged.scores == [0.8, 0.2, 0.5, 0.3, 0.1]
    assert merged.second == [True, True, False, False, False]


def test_a_blended_cascade_listens_to_the_first_stage_at_both_stages():
    fast = [0.1, 0.9, 0.5, 0.7, 0.3]  # in the first stage's order: index 0 was its best
    # 0.5/(60 + first rank) + 0.5/(60 + fast rank): the first stage's best (fast rank 5) now
    # beats the fast model's second (first rank 4).
    assert shortlist(fast, 2, blend=0.5) == [1, 0]
    # The large model prefers 0; blended with the first stage, which does too: 0 leads.
    merged = cascade_order(fast, [1, 0], [0.2, 0.8], blend=0.5)
    assert merged.order == [0, 1, 3, 2, 4]
    assert merged.scores == [0.8, 0.2, 0.7, 0.5, 0.3]
    assert merged.second == [True, True, False, False, False]
    # The large model against the first stage, at even weights: a tie, in the first stage's
    # order; without the blend, the large model's.
    assert cascade_order(fast, [1, 0], [0.8, 0.2], blend=0.5).order[:2] == [0, 1]
    assert cascade_order(fast, [1, 0], [0.8, 0.2]).order[:2] == [1, 0]


def test_a_cascade_blended_wholly_into_the_first_stage_keeps_its_order():
    fast = [0.1, 0.9, 0.5, 0.7, 0.3]
    short = shortlist(fast, 3, blend=1.0)
    assert short == [0, 1, 2]
    assert cascade_order(fast, short, [0.9, 0.1, 0.5], blend=1.0).order == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("text", ["student", "student:", ":3", "student:0", "student:x"])
def test_a_malformed_cascade_setting_is_refused_naming_it(text: str):
    with pytest.raises(SettingsError, match="RAGRANK_CASCADE"):
        Settings(cascade=text)


def test_a_cascade_of_an_unserved_model_stops_start_up():
    with pytest.raises(SettingsError, match="'nobody' is not a served reranker"):
        fake_inference(Settings(cascade="nobody:2"))


def _cascading(services: Services, settings: Settings) -> tuple[Services, FakeScorer]:
    fast, large = ShortFirstScorer(), FakeScorer()
    rerankers = [
        Served(role_spec(settings, RERANK, large.model_id, ("large",)), large),
        Served(role_spec(settings, RERANK, fast.model_id, ("fast",)), fast),
    ]
    return swap_models(services, settings, rerankers=rerankers), large


async def test_the_large_model_scores_only_the_fast_ones_top_k(fake_services: Services):
    settings = Settings(cascade="fast:2")
    services, large = _cascading(fake_services, settings)
    inference = services.inference
    assert inference.cascade_rule == Cascade("fast", 2)
    async with inference:
        outcome = await inference.cascade("q", DOCUMENTS, Cascade("fast", 2))
    # The fast model's best two are the two shortest; the large one puts the longer first.
    assert outcome.order[:2] == [2, 0]
    assert outcome.second == [True, True, False, False, False, False]
    # Then the rest, shortest first, as the fast model ranks them.
    assert outcome.order[2:] == [4, 3, 1, 5]
    assert [stage.pairs for stage in outcome.stages] == [len(DOCUMENTS), 2]
    assert sum(len(batch) for batch in large.batches) == 2


@pytest.fixture
async def client(indexed_services: Services) -> AsyncIterator[tuple[AsyncTestClient, FakeScorer]]:
    settings = Settings(cascade="fast:3")
    services, large = _cascading(indexed_services, settings)
    async with AsyncTestClient(app=create_app(settings, services=services)) as test_client:
        yield test_client, large


async def _search(client: AsyncTestClient, **extra: Any) -> dict[str, Any]:
    body = {"query": "coffee espresso", "candidates": 10, "top_k": 10, **extra}
    response = await client.post("/v1/search", json=body)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


async def test_search_runs_the_servers_cascade_and_times_both_stages(client):
    test_client, large = client
    body = await _search(test_client)
    stages = body["timings_ms"]["rerank_stages"]
    assert [s["model"] for s in stages] == ["fake-short-first", "fake-scorer"]
    assert [s["pairs"] for s in stages][1] == 3
    assert stages[0]["pairs"] >= len(body["results"])
    assert sum(len(batch) for batch in large.batches) == 3
    lengths = [len(passage_text(hit["title"], hit["text"])) for hit in body["results"]]
    # The fast model's best three (the shortest), longest first as the large model ranks
    # them; then the rest, shortest first, as the fast one does.
    assert len(lengths) > 3
    assert lengths[:3] == sorted(lengths[:3], reverse=True)
    assert lengths[3:] == sorted(lengths[3:])
    assert max(lengths[:3]) <= min(lengths[3:])


async def test_a_request_sets_its_own_cascade_or_none(client):
    test_client, _ = client
    own = await _search(test_client, cascade={"model": "fast", "top": 1})
    assert [s["pairs"] for s in own["timings_ms"]["rerank_stages"]][1] == 1
    plain = await _search(test_client, cascade=False)
    assert [s["model"] for s in plain["timings_ms"]["rerank_stages"]] == ["fake-scorer"]
    lengths = [len(passage_text(hit["title"], hit["text"])) for hit in plain["results"]]
    assert lengths == sorted(lengths, reverse=True)


async def test_a_requests_blend_applies_to_both_stages_of_the_cascade(client):
    test_client, large = client
    body = await _search(test_client, blend=1)
    # Wholly the first stage's weight: its order, though both stages still scored.
    ranks = [hit["retrieval_rank"] for hit in body["results"]]
    assert ranks == sorted(ranks)
    assert [s["pairs"] for s in body["timings_ms"]["rerank_stages"]][1] == 3
    assert sum(len(batch) for batch in large.batches) == 3
    unblended = await _search(test_client)
    assert [hit["retrieval_rank"] for hit in unblended["results"]] != ranks


@pytest.mark.parametrize(
    ("cascade", "field"),
    [
        ({"model": "nobody", "top": 2}, "cascade.model"),
        ({"model": "fast", "top": 0}, "cascade.top"),
        ({"model": "fast"}, "cascade"),
        ("fast:2", "cascade"),
    ],
)
async def test_a_bad_cascade_is_a_400_naming_the_field(client, cascade: Any, field: str):
    test_client, _ = client
    response = await test_client.post("/v1/search", json={"query": "coffee", "cascade": cascade})
    assert response.status_code == 400, response.text
    assert field in response.text


async def test_min_score_drops_results_below_it(client):
    test_client, _ = client
    everything = await _search(test_client, cascade=False)
    scores = [hit["score"] for hit in everything["results"]]
    floor = sorted(scores)[len(scores) // 2]
    kept = await _search(test_client, cascade=False, min_score=floor)
    assert [hit["score"] for hit in kept["results"]] == [s for s in scores if s >= floor]
    assert 0 < len(kept["results"]) < len(scores)
    response = await test_client.post("/v1/search", json={"query": "x", "min_score": 1e7})
    assert response.status_code == 400
    assert "min_score" in response.text


async def test_rerank_min_score_and_a_calibrated_relevance_score(
    fake_services: Services, tmp_path: Path
):
    documents = ["short", "a much longer document about rivers and seas", "medium text"]
    folder = tmp_path / "fake-scorer"
    folder.mkdir()
    write_calibration(folder, Calibration(a=2.0, b=-1.0), {"pairs": 10})
    scorer = FakeScorer()
    scorer.model_id = str(folder)
    services = swap_models(fake_services, rerankers=[scorer])
    assert services.inference.calibration() == read_calibration(str(folder))
    async with AsyncTestClient(app=create_app(Settings(), services=services)) as test_client:
        response = await test_client.post(
            "/v1/rerank", json={"query": "rivers", "documents": documents, "min_score": 0.01}
        )
    assert response.status_code == 200, response.text
    logits = np.array([len(d) / 20 - 3 for d in documents])
    expected = 1 / (1 + np.exp(-(2.0 * logits - 1.0)))
    results = response.json()["results"]
    assert [r["index"] for r in results] == [
        i for i in np.argsort(-expected) if expected[i] >= 0.01
    ]
    for result in results:
        assert result["relevance_score"] == pytest.approx(expected[result["index"]])


def test_platt_scaling_recovers_a_known_calibration():
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, 20_000)
    labels = (rng.random(20_000) < 1 / (1 + np.exp(-(0.5 * logits - 1.0)))).astype(int)
    fitted = fit_platt(logits.tolist(), labels.tolist())
    assert fitted.a == pytest.approx(0.5, abs=0.05)
    assert fitted.b == pytest.approx(-1.0, abs=0.08)
    before = expected_calibration_error(probabilities(logits, None), labels)
    after = expected_calibration_error(probabilities(logits, fitted), labels)
    assert after < 0.02 < before


def test_a_calibration_needs_both_labels():
    with pytest.raises(ValueError, match="relevant and non-relevant"):
        fit_platt([1.0, 2.0], [1, 1])
