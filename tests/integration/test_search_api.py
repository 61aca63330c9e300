"""End to end: the sample corpus, tiny models, embedded Qdrant, searched over HTTP."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pytest
from litestar.testing import AsyncTestClient

from cli.compose import load_services
from indexing import Indexer
from ragrank import SAMPLE_DATASET
from ragrank.beir import load_beir
from ragrank.protocols import relevance
from server import Services, create_app
from tests.conftest import tiny_settings

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Iterator
    from pathlib import Path

    from ragrank.settings import Settings

QUERY = "Why can't Python threads use several CPU cores?"


@pytest.fixture(scope="module")
def settings(
    tmp_path_factory: pytest.TempPathFactory, tiny_embedder_path: Path, tiny_reranker_path: Path
) -> Settings:
    """One indexed sample for the whole module: its tests only read."""
    return tiny_settings(tmp_path_factory.mktemp("search"), tiny_embedder_path, tiny_reranker_path)


@pytest.fixture(scope="module")
def services(settings: Settings) -> Iterator[Services]:
    services = load_services(settings)
    Indexer.from_settings(settings, services.embedder, services.store).index(
        load_beir(SAMPLE_DATASET).corpus.values(), progress=False
    )
    yield services
    services.store.close()


@pytest.fixture
async def client(settings: Settings, services: Services) -> AsyncIterator[AsyncTestClient]:
    async with AsyncTestClient(app=create_app(settings, services=services)) as client:
        yield client


async def _search(client: AsyncTestClient, **body: object) -> dict:
    response = await client.post("/v1/search", json=body)
    assert response.status_code == 200, response.text
    return response.json()


async def test_search_returns_top_k_hits_with_every_field_and_timings(client):
    body = await _search(client, query=QUERY, top_k=7, candidates=30)
    results = body["results"]
    assert len(results) == 7
    assert [hit["rank"] for hit in results] == list(range(1, 8))
    for hit in results:
        assert set(hit) == {
            "rank",
            "doc_id",
            "chunk",
            "text",
            "title",
            "metadata",
            "score",
            "retrieval_score",
            "retrieval_rank",
        }
        assert hit["text"] and hit["doc_id"] and "lang" in hit["metadata"]
        assert 0.0 <= hit["score"] <= 1.0
        assert -1.0 <= hit["retrieval_score"] <= 1.0
    assert body["reranked"] is True
    timings = body["timings_ms"]
    assert set(timings) == {"embed", "sparse", "retrieve", "rerank", "total", "rerank_stages"}
    [stage] = timings.pop("rerank_stages")
    assert stage["pairs"] >= len(body["results"])
    assert all(value >= 0 for value in timings.values())
    stages = timings["embed"] + timings["sparse"] + timings["retrieve"] + timings["rerank"]
    assert timings["total"] >= stages - 1e-6


async def test_reranked_order_follows_the_cross_encoder_over_the_cosine_candidates(
    client, services
):
    cosine = await _search(client, query=QUERY, top_k=20, candidates=20, rerank=False)
    reranked = await _search(client, query=QUERY, top_k=20, candidates=20)
    key = lambda hit: (hit["doc_id"], hit["chunk"])  # noqa: E731
    assert {key(h) for h in reranked["results"]} == {key(h) for h in cosine["results"]}
    # Score the same candidates independently and check every hit got its own score.
    passages = [f"{h['title']} {h['text']}" for h in cosine["results"]]
    expected = relevance(services.inference.scorer.score(QUERY, passages))
    by_key = {key(h): s for h, s in zip(cosine["results"], expected, strict=True)}
    for hit in reranked["results"]:
        assert hit["score"] == pytest.approx(by_key[key(hit)], abs=1e-6)
    scores = [hit["score"] for hit in reranked["results"]]
    assert scores == sorted(scores, reverse=True)
    # Each hit says where the first stage had it: how far reranking moved it.
    first_rank = {key(h): h["rank"] for h in cosine["results"]}
    assert [h["retrieval_rank"] for h in reranked["results"]] == [
        first_rank[key(h)] for h in reranked["results"]
    ]
    assert [h["retrieval_rank"] for h in cosine["results"]] == list(range(1, 21))


@pytest.mark.parametrize("retrieval", ["dense", "sparse", "hybrid"])
async def test_rerank_false_returns_the_first_stage_as_the_store_gives_it(
    client, services, retrieval
):
    body = await _search(
        client, query=QUERY, top_k=10, candidates=10, rerank=False, retrieval=retrieval
    )
    assert body["reranked"] is False and body["retrieval"] == retrieval
    assert body["timings_ms"]["rerank"] < 50  # no model ran
    scores = [hit["retrieval_score"] for hit in body["results"]]
    assert scores == sorted(scores, reverse=True)
    assert [hit["score"] for hit in body["results"]] == scores
    vector = services.embedder.embed_queries([QUERY])[0]
    analysed = services.sparse.query(QUERY)
    lexical, languages = analysed.vector, (analysed.language or "").split("+")
    direct = {
        "dense": lambda: services.store.search(vector, 10),
        "sparse": lambda: services.store.search(None, 10, sparse=lexical),
        "hybrid": lambda: services.store.search(vector, 10, sparse=lexical, languages=languages),
    }[retrieval]()
    assert [(h["doc_id"], h["chunk"]) for h in body["results"]] == [
        (c.chunk.doc_id, c.chunk.chunk_index) for c in direct
    ]
    np.testing.assert_allclose(scores, [c.retrieval_score for c in direct], atol=1e-5)


async def test_filters_restrict_results(client):
    by_lang = await _search(client, query=QUERY, filter={"lang": "de"})
    assert by_lang["results"] and {h["metadata"]["lang"] for h in by_lang["results"]} == {"de"}
    by_doc = await _search(client, query=QUERY, filter={"doc_id": "prog-en-1"})
    assert [h["doc_id"] for h in by_doc["results"]] == ["prog-en-1"]
    nothing = await _search(client, query=QUERY, filter={"lang": "tlh"})
    assert nothing["results"] == []


async def test_health_ready_and_schema(client, settings):
    assert (await client.get("/health")).json() == {"status": "ok"}
    ready = await client.get("/ready")
    assert ready.status_code == 200
    assert ready.json()["ready"] is True
    assert ready.json()["collection"] == settings.collection
    schema = (await client.get("/schema/openapi.json")).json()
    request = schema["components"]["schemas"]["SearchRequest"]["properties"]
    assert request["query"]["maxLength"] == 2000 and request["query"]["minLength"] == 1
    assert request["top_k"]["maximum"] == 100 and request["top_k"]["minimum"] == 1
    assert request["candidates"]["maximum"] == 500


async def test_the_query_language_is_identified_named_and_reported_with_matched_words(client):
    body = await _search(
        client,
        query="Durch welche Länder fließt die Donau?",
        retrieval="sparse",
        rerank=False,
        highlight=True,
    )
    assert body["sparse_language"] == "de"
    top = body["results"][0]
    assert top["doc_id"] == "rivers-de-2"
    # Whole words by stem: "fließt" meets "fließt", "Länder" meets "Länder"; "die" is a stopword.
    assert {"Länder", "Donau"} <= set(top["matched"]) and "die" not in top["matched"]
    named = await _search(client, query="Donau", language="de", retrieval="sparse", rerank=False)
    assert named["sparse_language"] == "de" and "matched" not in named["results"][0]


async def test_a_language_without_an_analyser_is_searched_unstemmed(client):
    body = await _search(client, query="Donau", language="wl", retrieval="sparse", rerank=False)
    assert body["sparse_language"] == "wl"
    assert body["results"][0]["doc_id"] == "rivers-de-2"


async def test_hybrid_tells_the_store_the_query_languages(
    client, settings: Settings, services: Services, monkeypatch: pytest.MonkeyPatch
):
    """The fusion learns which languages BM25 read the query in, so that passages in other
    languages can take part of BM25's share from the dense list."""
    seen: list[tuple[list[str], float]] = []
    search = services.store.search

    def spy(*args, **kwargs):
        seen.append((list(kwargs["languages"]), kwargs["fusion"].other_languages))
        return search(*args, **kwargs)

    monkeypatch.setattr(services.store, "search", spy)
    await _search(client, query="Durch welche Länder fließt die Donau?", rerank=False)
    await _search(client, query="Donau", language="de", retrieval="dense", rerank=False)
    weight = settings.fusion_other_languages
    assert weight > 0 and seen == [(["de"], weight), ([], weight)]
