"""Cohere- and TEI-shaped reranking over HTTP, with the fake scorer (score = length / 20 - 3)."""

from __future__ import annotations

import numpy as np
import pytest

from ragrank.protocols import relevance

DOCUMENTS = ["short one", "a much longer document about rivers and seas", "medium text here"]


@pytest.fixture
def client(fake_client, fake_services):
    fake_client.scorer = fake_services.inference.scorer
    return fake_client


@pytest.mark.parametrize("path", ["/v1/rerank", "/v2/rerank"])
async def test_cohere_shape_sorted_by_relevance_with_meta(client, path):
    response = await client.post(
        path,
        json={
            "model": "fake-scorer",
            "query": "rivers",
            "documents": DOCUMENTS,
        },
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["id"]
    assert [r["index"] for r in body["results"]] == [1, 2, 0]
    expected = relevance(np.array([len(d) / 20 - 3 for d in DOCUMENTS], dtype=np.float32))
    for result in body["results"]:
        assert result["relevance_score"] == pytest.approx(expected[result["index"]])
        assert "document" not in result
    assert body["meta"]["billed_units"] == {"search_units": 1}
    assert body["meta"]["tokens"]["input_tokens"] > 0


async def test_top_n_return_documents_objects_and_raw_scores(client):
    body = (
        await client.post(
            "/v1/rerank",
            json={
                "query": "rivers",
                "documents": [{"text": d} for d in DOCUMENTS],
                "top_n": 2,
                "return_documents": True,
                "raw_scores": True,
            },
        )
    ).json()
    assert [r["index"] for r in body["results"]] == [1, 2]
    assert body["results"][0]["document"] == {"text": DOCUMENTS[1]}
    assert body["results"][0]["relevance_score"] == pytest.approx(len(DOCUMENTS[1]) / 20 - 3)


async def test_a_long_document_takes_its_best_windows_score(client):
    long_document = " ".join(["w"] * 100 + ["wwwwwwwwwwwwwwwwwwww"] * 60)  # later windows longer
    body = (
        await client.post(
            "/v1/rerank",
            json={
                "query": "q",
                "documents": ["tiny", long_document],
                "raw_scores": True,
            },
        )
    ).json()
    scorer = client.scorer
    plan = scorer.plan_windows("q", ["tiny", long_document])
    pairs = scorer.collate(plan.inputs)
    windows = [p for p, owner in zip(pairs, plan.owners, strict=True) if owner == 1]
    assert len(windows) > 1
    best = max(scorer.score_pairs(windows))
    result = next(r for r in body["results"] if r["index"] == 1)
    assert result["relevance_score"] == pytest.approx(float(best))
    cut = (
        await client.post(
            "/v1/rerank",
            json={
                "query": "q",
                "documents": [long_document],
                "raw_scores": True,
                "max_tokens_per_doc": 50,
            },
        )
    ).json()
    assert cut["results"][0]["relevance_score"] < result["relevance_score"]


async def test_tei_shape(client):
    response = await client.post(
        "/rerank",
        json={
            "query": "rivers",
            "texts": DOCUMENTS,
            "return_text": True,
            "truncate": True,
        },
    )
    assert response.status_code == 200
    ranks = response.json()
    assert [r["index"] for r in ranks] == [1, 2, 0]
    assert ranks[0]["text"] == DOCUMENTS[1]
    assert 0 < ranks[0]["score"] < 1
    raw = (
        await client.post("/rerank", json={"query": "q", "texts": DOCUMENTS, "raw_scores": True})
    ).json()
    assert "text" not in raw[0]
    assert raw[0]["score"] == pytest.approx(len(DOCUMENTS[1]) / 20 - 3)


@pytest.mark.parametrize(
    ("path", "body", "field", "fragment"),
    [
        ("/v1/rerank", {"query": "q", "documents": []}, "documents", "length >= 1"),
        (
            "/v1/rerank",
            {"query": "q", "documents": ["d"] * 1001},
            "documents",
            "at most 1,000 items",
        ),
        (
            "/v1/rerank",
            {"query": "q", "documents": ["x" * 100_001]},
            "documents",
            "at most 100,000 characters",
        ),
        (
            "/v1/rerank",
            {"query": "q", "documents": [{"text": "x" * 100_001}]},
            "documents",
            "RAGRANK_MAX_DOCUMENT_CHARS",
        ),
        ("/v1/rerank", {"query": " ", "documents": ["d"]}, "query", "non-whitespace"),
        (
            "/v1/rerank",
            {"query": "x" * 2001, "documents": ["d"]},
            "query",
            "at most 2,000 characters",
        ),
        ("/v1/rerank", {"query": "q", "documents": ["d"], "top_n": 0}, "top_n", ">= 1"),
        (
            "/v1/rerank",
            {"query": "q", "documents": ["d"], "max_tokens_per_doc": 0},
            "max_tokens_per_doc",
            ">= 1",
        ),
        ("/rerank", {"query": "q", "texts": ["d"] * 1001}, "texts", "at most 1,000 items"),
    ],
)
async def test_limits_answer_400_naming_field_and_limit(client, path, body, field, fragment):
    response = await client.post(path, json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["field"].startswith(field)
    assert fragment in error["message"]


async def test_the_query_and_each_document_are_tokenised_once_on_host_threads(client):
    """Windows are cut from ids: one tokenisation for the query, one per document, all on the
    host pool (never the event loop, never the model's thread)."""
    threads = client.scorer.vocabulary.threads
    before = len(threads)
    response = await client.post("/v1/rerank", json={"query": "q", "documents": DOCUMENTS})
    assert response.status_code == 200
    assert len(threads) - before == 1 + len(DOCUMENTS)
    assert all(name.startswith("ragrank-host") for name in threads[before:]), threads[before:]


async def test_infinity_shape_on_the_same_route_by_its_documents_field(client):
    body = {"query": "rivers", "documents": DOCUMENTS, "top_n": 2, "model": "fake-scorer"}
    answer = (await client.post("/rerank", json={**body, "return_documents": True})).json()
    assert answer["object"] == "rerank" and answer["model"] == client.scorer.model_id
    assert [r["index"] for r in answer["results"]] == [1, 2]
    assert answer["results"][0]["document"] == DOCUMENTS[1]
    assert answer["usage"]["prompt_tokens"] == answer["usage"]["total_tokens"] > 0
    bare = (await client.post("/rerank", json=body)).json()
    assert bare["results"][0]["document"] is None
    tei = await client.post("/rerank", json={"query": "rivers", "texts": DOCUMENTS, "top_n": 1})
    assert [r["index"] for r in tei.json()] == [1]


@pytest.mark.parametrize(
    "body",
    [
        {"query": "q"},
        {"query": "q", "texts": ["a"], "documents": ["a"]},
    ],
)
async def test_rerank_needs_texts_or_documents_not_both(client, body):
    response = await client.post("/rerank", json=body)
    assert response.status_code == 400
    assert response.json()["error"]["field"] == "texts"


async def test_jina_reads_the_same_answer_and_the_error_detail(client):
    answer = (
        await client.post(
            "/v1/rerank",
            json={"model": "fake-scorer", "query": "q", "documents": ["d"]},
        )
    ).json()
    assert answer["model"] == client.scorer.model_id and answer["usage"]["total_tokens"] > 0
    assert answer["id"] and answer["meta"]["tokens"]["input_tokens"] > 0  # Cohere's too
    error = (await client.post("/v1/rerank", json={"query": " ", "documents": ["d"]})).json()
    assert error["detail"] == error["error"]["message"]


async def test_max_chunks_per_doc_scores_the_first_windows_only(client):
    # The fake scorer's windows are 64 words, 48 apart: the last ones here are the longest.
    document = " ".join(["w"] * 100 + ["wwwwwwwwwwwwwwwwwwww"] * 60)
    body = {"query": "q", "documents": [document], "raw_scores": True}
    every = (await client.post("/v1/rerank", json=body)).json()
    first = (await client.post("/v1/rerank", json={**body, "max_chunks_per_doc": 1})).json()
    plan = client.scorer.plan_windows("q", [document])
    (expected,) = client.scorer.score_pairs(client.scorer.collate(plan.inputs[:1]))
    assert first["results"][0]["relevance_score"] == pytest.approx(float(expected))
    assert first["results"][0]["relevance_score"] < every["results"][0]["relevance_score"]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"query": "q", "documents": ["d"], "rank_fields": ["title"]}, "rank_fields"),
        ({"query": "q", "documents": ["d"], "modle": "x"}, "modle"),
        ({"query": "q", "documents": ["d"], "model": "m" * 257}, "model"),
        ({"query": "q", "documents": ["d"], "max_chunks_per_doc": 0}, "max_chunks_per_doc"),
    ],
)
async def test_a_field_no_client_sends_is_still_refused(client, body, field):
    response = await client.post("/v1/rerank", json=body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["field"] == field
