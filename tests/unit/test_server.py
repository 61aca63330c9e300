"""The HTTP layer with fake models: validation, error bodies, ordering, unavailability."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import TYPE_CHECKING

import httpx
import pytest
from litestar.testing import AsyncTestClient
from qdrant_client.http.exceptions import ResponseHandlingException

from ragrank import SAMPLE_DATASET
from ragrank.beir import load_beir
from ragrank.errors import ModelFailedError, SettingsError
from ragrank.settings import Settings
from ragrank.sparse import sparse_encoder
from ragrank.store import open_store
from server import Services, create_app
from tests.fakes import FakeScorer, fake_inference, swap_models

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from litestar import Litestar


@pytest.fixture
async def client(indexed_services: Services) -> AsyncIterator[AsyncTestClient]:
    async with AsyncTestClient(app=create_app(Settings(), services=indexed_services)) as client:
        yield client


async def test_the_query_is_embedded_with_the_query_prefix(client, indexed_services):
    response = await client.post("/v1/search", json={"query": "heat pumps"})
    assert response.status_code == 200
    assert indexed_services.embedder.seen[-1] == "query: heat pumps"
    # Passages were embedded with the passage prefix at indexing time.
    assert indexed_services.embedder.seen[0].startswith("passage: ")


async def test_search_tokenises_on_host_threads_only(client, indexed_services):
    """The event loop and the models' threads never tokenise: the query is tokenised once per
    model, on the host pool."""
    embedder, scorer = indexed_services.embedder, indexed_services.inference.scorer
    before = len(embedder.vocabulary.threads), len(scorer.vocabulary.threads)
    response = await client.post(
        "/v1/search", json={"query": "heat pumps", "top_k": 5, "candidates": 5}
    )
    assert response.status_code == 200 and response.json()["reranked"]
    new_embed = embedder.vocabulary.threads[before[0] :]
    new_score = scorer.vocabulary.threads[before[1] :]
    assert len(new_embed) == 1  # the query, once
    assert len(new_score) == 1 + 5  # the query once, each candidate once
    assert all(name.startswith("ragrank-host") for name in new_embed + new_score)


async def test_reranking_orders_by_the_scorer_and_keeps_top_k(client, indexed_services):
    body = (
        await client.post("/v1/search", json={"query": "river sea", "top_k": 4, "candidates": 12})
    ).json()
    # FakeScorer scores by passage length: longest first.
    pairs = [pair for batch in indexed_services.inference.scorer.batches for pair in batch]
    assert {query for query, _ in pairs} == {"river sea"}
    passages = [passage for _, passage in pairs]
    assert len(passages) == 12
    returned = [f"{h['title']} {h['text']}" for h in body["results"]]
    assert set(returned) <= set(passages)
    assert [len(p) for p in returned] == sorted(map(len, passages), reverse=True)[:4]


async def test_no_scorer_call_without_rerank(client, indexed_services):
    await client.post("/v1/search", json={"query": "river", "rerank": False})
    assert indexed_services.inference.scorer.batches == []


@pytest.mark.parametrize(
    ("body", "field", "fragment"),
    [
        ({"query": ""}, "query", "length >= 1"),
        ({"query": "   "}, "query", "non-whitespace"),
        ({"query": "x" * 2001}, "query", "at most 2,000 characters"),
        ({"query": "x", "top_k": 0}, "top_k", ">= 1"),
        ({"query": "x", "top_k": 101, "candidates": 200}, "top_k", "at most 100"),
        ({"query": "x", "candidates": 501}, "candidates", "at most 500"),
        ({"query": "x", "rerank": "yes"}, "rerank", "Invalid enum value"),
        ({"query": "x", "rerank": 1}, "rerank", "Expected `bool | str`"),
        ({"query": "x", "filter": {"": "a"}}, "filter", "length >= 1"),
        ({"query": "x", "filter": {"k": [1]}}, "filter", "Expected"),
        ({"query": "x", "filter": {f"k{i}": 1 for i in range(17)}}, "filter", "length <= 16"),
        ({"query": "x", "topk": 5}, "topk", "unknown field"),
        ({"query": "x", "retrieval": "fuzzy"}, "retrieval", "Invalid enum value"),
        ({"query": "x", "fusion": "max"}, "fusion", "Invalid enum value"),
        ({"query": "x", "rrf_k": 0}, "rrf_k", ">= 1"),
        ({"query": "x", "rrf_k": 100_001}, "rrf_k", "<= 100000"),
        ({"query": "x", "dense_weight": 0}, "dense_weight", ">= 0.01"),
        ({"query": "x", "sparse_weight": 101}, "sparse_weight", "<= 100"),
        ({"top_k": 5}, "query", "missing required field"),
    ],
)
async def test_bad_requests_get_a_400_naming_the_field_and_the_limit(client, body, field, fragment):
    response = await client.post("/v1/search", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] in {"invalid_request"}
    assert error["field"] is not None and error["field"].startswith(field.split(".")[0])
    assert fragment.lower() in error["message"].lower()


@pytest.mark.parametrize("retrieval", ["dense", "sparse", "hybrid"])
async def test_each_retrieval_keeps_the_filter_and_times_its_stages(client, retrieval):
    body = {"query": "the longest river", "rerank": False, "top_k": 20, "candidates": 20}
    answer = (
        await client.post(
            "/v1/search", json={**body, "retrieval": retrieval, "filter": {"lang": "en"}}
        )
    ).json()
    assert answer["retrieval"] == retrieval and answer["results"]
    assert all(hit["metadata"]["lang"] == "en" for hit in answer["results"])
    timings = {"embed", "sparse", "retrieve", "rerank", "total", "rerank_stages"}
    assert set(answer["timings_ms"]) == timings
    assert answer["timings_ms"]["rerank_stages"] == []  # no reranking asked
    if retrieval == "sparse":
        # BM25 finds only chunks sharing a term with the query (English stemming: rivers).
        assert all("river" in hit["text"].lower() for hit in answer["results"])
        assert answer["timings_ms"]["embed"] < answer["timings_ms"]["total"]
    scores = [hit["retrieval_score"] for hit in answer["results"]]
    assert scores == sorted(scores, reverse=True)


async def test_hybrid_is_the_default_and_fuses_as_asked(client):
    body = {"query": "the longest river", "rerank": False, "top_k": 10, "candidates": 10}
    default = (await client.post("/v1/search", json=body)).json()
    assert default["retrieval"] == "hybrid"
    rrf = (await client.post("/v1/search", json={**body, "fusion": "rrf", "rrf_k": 1})).json()
    # RRF scores are sums of 1 / (k + rank), ranks from 0: with k = 1 the top one is
    # between 1 (first in one list) and 2 (first in both).
    assert 1.0 <= rrf["results"][0]["retrieval_score"] <= 2.0
    wide = (await client.post("/v1/search", json={**body, "fusion": "rrf", "rrf_k": 60})).json()
    assert wide["results"][0]["retrieval_score"] <= 2 / 60 + 1e-6
    heavy = (
        await client.post("/v1/search", json={**body, "dense_weight": 3, "sparse_weight": 0.5})
    ).json()
    assert heavy["results"] and heavy["retrieval"] == "hybrid"
    dbsf = (await client.post("/v1/search", json={**body, "fusion": "dbsf"})).json()
    assert dbsf["results"] == default["results"]  # DBSF is the default fusion


async def test_sparse_retrieval_without_bm25_vectors_is_a_400_naming_the_field(indexed_services):
    services = replace(indexed_services, sparse=None)
    async with AsyncTestClient(app=create_app(Settings(), services=services)) as client:
        response = await client.post("/v1/search", json={"query": "x", "retrieval": "hybrid"})
        assert response.status_code == 400
        assert response.json()["error"]["field"] == "retrieval"
        assert "RAGRANK_SPARSE=none" in response.json()["error"]["message"]


async def test_candidates_below_top_k_are_raised_to_top_k(client, indexed_services):
    response = await client.post("/v1/search", json={"query": "river", "top_k": 8, "candidates": 3})
    assert response.status_code == 200, response.text
    assert len(response.json()["results"]) == 8


async def test_bodies_are_held_to_their_declared_types(client, indexed_services):
    for body, field in [
        ({"query": "x", "rerank": 0}, "rerank"),
        ({"query": "x", "top_k": "5"}, "top_k"),
        ({"query": "x", "top_k": 5.5}, "top_k"),
        ({"query": "x", "filter": {"a.b": 1}}, "filter"),
    ]:
        response = await client.post("/v1/search", json=body)
        assert response.status_code == 400, body
        assert response.json()["error"]["field"] == field
    # JSON Schema's integers include 5.0, so the server takes it too.
    integral = await client.post("/v1/search", json={"query": "x", "top_k": 5.0})
    assert integral.status_code == 200


async def test_a_body_over_the_size_limit_is_a_413_naming_the_limit(fake_services, tmp_path):
    settings = Settings(max_request_bytes=1_000, jobs_path=tmp_path / "jobs.sqlite3")
    async with AsyncTestClient(app=create_app(settings, services=fake_services)) as client:
        response = await client.post("/v1/rerank", json={"query": "q", "documents": ["x" * 2_000]})
        assert response.status_code == 413
        message = response.json()["error"]["message"]
        assert "1,000 bytes" in message and "RAGRANK_MAX_REQUEST_BYTES" in message
        fits = await client.post("/v1/rerank", json={"query": "q", "documents": ["x" * 500]})
        assert fits.status_code == 200


async def test_limits_are_settings_checked_before_any_model_work(indexed_services, tmp_path):
    settings = Settings(
        max_query_chars=10,
        max_top_k=10,
        max_candidates=50,
        max_rerank_documents=2,
        max_document_chars=5,
        max_embed_inputs=2,
        jobs_path=tmp_path / "jobs.sqlite3",
    )
    scorer = indexed_services.inference.scorer
    calls = len(scorer.batches)
    app = create_app(settings, services=indexed_services)
    async with AsyncTestClient(app=app) as client:
        for path, body, field, variable in [
            ("/v1/search", {"query": "x" * 11}, "query", "RAGRANK_MAX_QUERY_CHARS"),
            ("/v1/search", {"query": "x", "top_k": 11}, "top_k", "RAGRANK_MAX_TOP_K"),
            (
                "/v1/search",
                {"query": "x", "candidates": 51},
                "candidates",
                "RAGRANK_MAX_CANDIDATES",
            ),
            ("/v1/rerank", {"query": "q", "documents": ["a"] * 3}, "documents", "RERANK_DOC"),
            (
                "/v1/rerank",
                {"query": "q", "documents": ["a", {"text": "abcdef"}]},
                "documents[1].text",
                "RAGRANK_MAX_DOCUMENT_CHARS",
            ),
            ("/rerank", {"query": "q", "texts": ["abcdef"]}, "texts[0]", "DOCUMENT_CHARS"),
            ("/v1/embeddings", {"input": ["a", "b", "c"]}, "input", "RAGRANK_MAX_EMBED_INPUTS"),
            ("/v1/embeddings", {"input": "abcdef"}, "input", "RAGRANK_MAX_DOCUMENT_CHARS"),
        ]:
            response = await client.post(path, json=body)
            assert response.status_code == 400, (path, body, response.text)
            error = response.json()["error"]
            assert error["field"] == field and variable in error["message"], error
        assert len(scorer.batches) == calls  # refused before the reranker saw anything
        schema = (await client.get("/schema/openapi.json")).json()["components"]["schemas"]
        assert schema["SearchRequest"]["properties"]["query"]["maxLength"] == 10
        assert schema["SearchRequest"]["properties"]["top_k"]["maximum"] == 10
        assert schema["RerankDocument"]["properties"]["text"]["maxLength"] == 5


def test_a_limit_cannot_be_set_past_its_ceiling_or_below_a_default():
    with pytest.raises(SettingsError, match="RAGRANK_MAX_TOP_K must be between 10 and 1,000"):
        Settings(max_top_k=1_001)
    with pytest.raises(SettingsError, match="RAGRANK_MAX_CANDIDATES must be between 50 and"):
        Settings(max_candidates=20)
    with pytest.raises(SettingsError, match="RAGRANK_MAX_QUERY_CHARS must be between 1 and"):
        Settings(max_query_chars=0)


async def test_malformed_json_is_a_400_without_internals(client):
    for body in (b"{not json", b"1\x1f junk after a valid number"):
        response = await client.post(
            "/v1/search", content=body, headers={"content-type": "application/json"}
        )
        assert response.status_code == 400, body
        assert "Traceback" not in response.text and "/work" not in response.text


async def test_unknown_routes_get_a_json_404(client):
    response = await client.get("/v2/nothing")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


async def test_an_unreachable_store_means_503_and_not_ready():
    store = open_store(Settings(qdrant_url="http://127.0.0.1:9", collection="t"))
    services = Services(inference=fake_inference(), store=store, sparse=sparse_encoder(Settings()))
    try:
        async with AsyncTestClient(app=create_app(Settings(), services=services)) as client:
            ready = await client.get("/ready")
            assert ready.status_code == 503 and ready.json()["ready"] is False
            assert (await client.get("/health")).status_code == 200
            response = await client.post("/v1/search", json={"query": "x"})
            assert response.status_code == 503
            assert response.json()["error"]["code"] == "store_unavailable"
    finally:
        store.close()


class DyingScorer(FakeScorer):
    def score_pairs(self, pairs):
        raise ModelFailedError("CUDA error: an illegal memory access was encountered")


def _with_scorer(
    services: Services, scorer: FakeScorer, settings: Settings | None = None
) -> Services:
    return swap_models(services, settings, rerankers=[scorer])


@asynccontextmanager
async def concurrent_client(app: Litestar) -> AsyncIterator[httpx.AsyncClient]:
    """Litestar's test client serialises requests; httpx's ASGI transport runs them
    concurrently on this event loop, as a real server would."""
    async with (
        app.lifespan(),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://ragrank.test"
        ) as client,
    ):
        yield client


async def test_concurrent_searches_share_reranker_batches(indexed_services):
    """While one batch holds the device, the requests that arrive meanwhile queue up, and the
    next batch takes pairs of several of them."""
    scorer = HeldScorer()
    app = create_app(Settings(), services=_with_scorer(indexed_services, scorer))
    first, *others = ["river sea", "coffee espresso", "solar panels", "bees flowers"]

    def search(query: str) -> asyncio.Task[httpx.Response]:
        body = {"query": query, "top_k": 3, "candidates": 6}
        return asyncio.create_task(client.post("/v1/search", json=body))

    async with concurrent_client(app) as client:
        running = [search(first)]
        await _until(scorer.started.is_set)
        running += [search(query) for query in others]
        engine = app.state.inference.engines[-1]
        # Every request's six pairs are collated or queued behind the held batch.
        await _until(lambda: engine.queue_depth + sum(map(len, scorer.collated)) == 4 * 6)
        scorer.release.set()
        responses = await asyncio.gather(*running)
    assert all(r.status_code == 200 for r in responses)
    mixed = [b for b in scorer.batches if len({q for q, _ in b}) > 1]
    assert mixed, "pairs of different requests were scored in one forward pass"


class HeldScorer(FakeScorer):
    """Holds each forward pass until released, so a test controls what is in flight, and
    records each batch as the engine collates it."""

    def __init__(self) -> None:
        super().__init__()
        self.started = threading.Event()
        self.release = threading.Event()
        self.collated: list[list[tuple[str, str]]] = []

    def collate(self, inputs):
        pairs = super().collate(inputs)
        self.collated.append(pairs)
        return pairs

    def score_pairs(self, pairs):
        self.started.set()
        self.release.wait(timeout=30)
        return super().score_pairs(pairs)

    def has_collated(self, query: str) -> bool:
        """Whether a batch holding `query`'s pairs has been collated."""
        return any(q == query for batch in self.collated for q, _ in batch)


async def _until(condition, timeout_s: float = 30.0) -> None:
    """Wait on the event loop until `condition()` holds (no fixed sleeps: CI may be slow)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        await asyncio.sleep(0.01)


async def test_a_full_rerank_queue_answers_429_with_retry_after(indexed_services):
    scorer = HeldScorer()
    settings = Settings(queue_size=5, batch_wait_ms=0)
    app = create_app(settings, services=_with_scorer(indexed_services, scorer, settings))
    body = {"query": "river", "top_k": 5, "candidates": 5}
    async with concurrent_client(app) as client:
        first = asyncio.create_task(client.post("/v1/search", json=body))
        await _until(scorer.started.is_set)  # its 5 pairs are in the worker now
        engine = app.state.inference.engines[-1]
        # The next batch is taken off the queue and collated while the first runs.
        second = asyncio.create_task(client.post("/v1/search", json=body))
        await _until(lambda: engine.queue_depth == 0 and len(scorer.collated) == 2)
        third = asyncio.create_task(client.post("/v1/search", json=body))
        await _until(lambda: engine.queue_depth == 5)  # its 5 pairs fill the queue
        refused = await client.post("/v1/search", json=body)
        scorer.release.set()
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "queue_full"
        for answered in (first, second, third):
            assert (await answered).status_code == 200


async def test_a_dead_reranker_means_503_and_not_ready(indexed_services):
    services = _with_scorer(indexed_services, DyingScorer())
    async with AsyncTestClient(app=create_app(Settings(), services=services)) as client:
        assert (await client.get("/ready")).status_code == 200
        failed = await client.post("/v1/search", json={"query": "river"})
        assert failed.status_code == 503
        assert failed.json()["error"]["code"] == "engine_unavailable"
        ready = await client.get("/ready")
        assert ready.status_code == 503
        assert ready.json()["models"] is False
        # Searches that need no reranker still work; reranking ones fail fast.
        assert (
            await client.post("/v1/search", json={"query": "x", "rerank": False})
        ).status_code == 200
        assert (await client.post("/v1/search", json={"query": "x"})).status_code == 503


class FailingScorer(FakeScorer):
    """Fails on every batch, as a model that raises on some input would."""

    def score_pairs(self, pairs):
        raise ValueError("/secret/path: kernel failed")


async def test_rerank_auto_falls_back_to_cosine_order_and_says_why(indexed_services):
    for scorer, code in ((DyingScorer(), "engine_unavailable"), (FailingScorer(), "model_error")):
        services = _with_scorer(indexed_services, scorer)
        async with AsyncTestClient(app=create_app(Settings(), services=services)) as client:
            body = {"query": "river", "top_k": 5, "candidates": 10}
            cosine = (await client.post("/v1/search", json={**body, "rerank": False})).json()
            auto = await client.post("/v1/search", json={**body, "rerank": "auto"})
            assert auto.status_code == 200, auto.text
            answer = auto.json()
            assert answer["reranked"] is False
            assert answer["rerank_error"].startswith(code) and "secret" not in auto.text
            assert answer["results"] == cosine["results"]
            assert cosine["rerank_error"] is None
            metrics = (await client.get("/metrics")).text
            assert f'ragrank_rerank_fallbacks_total{{code="{code}"}}' in metrics
            strict = await client.post("/v1/search", json={**body, "rerank": True})
            assert strict.status_code in (500, 503) and strict.json()["error"]["code"] == code


async def test_rerank_auto_reranks_when_the_reranker_works(client, indexed_services):
    answer = (await client.post("/v1/search", json={"query": "river", "rerank": "auto"})).json()
    assert answer["reranked"] is True and answer["rerank_error"] is None


class Outage:
    """A Qdrant client that, while `down`, fails every call as a refused connection does."""

    def __init__(self, client: object) -> None:
        self.client, self.down = client, False

    def __getattr__(self, name: str) -> object:
        attribute = getattr(self.client, name)
        if not (self.down and callable(attribute)):
            return attribute

        def refused(*args: object, **kwargs: object) -> None:
            raise ResponseHandlingException(ConnectionRefusedError("connection refused"))

        return refused


async def test_search_recovers_by_itself_when_qdrant_returns(fake_services):
    from qdrant_client import QdrantClient

    from indexing import Chunker, Indexer
    from ragrank.store import ServerStore

    store = ServerStore(QdrantClient(":memory:"), "t")  # a Qdrant server's stand-in
    services = replace(fake_services, store=store)
    embedder = services.embedder
    chunker = Chunker(embedder.token_spans, max_tokens=100)
    Indexer(embedder, store, chunker=chunker, sparse=services.sparse).index(
        load_beir(SAMPLE_DATASET).corpus.values(), progress=False
    )
    outage = Outage(store._client)
    store._client = outage  # type: ignore[assignment]
    async with AsyncTestClient(app=create_app(Settings(), services=services)) as client:
        body = {"query": "river", "rerank": False}
        assert (await client.post("/v1/search", json=body)).status_code == 200
        outage.down = True
        failed = await client.post("/v1/search", json=body)
        assert failed.status_code == 503
        assert failed.json()["error"]["code"] == "store_unavailable"
        assert "Qdrant" in failed.json()["error"]["message"]
        ready = await client.get("/ready")
        assert ready.status_code == 503 and ready.json()["store"] is False
        outage.down = False  # Qdrant is back: no restart, no reconnect call
        assert (await client.post("/v1/search", json=body)).status_code == 200
        assert (await client.get("/ready")).status_code == 200


async def test_a_client_that_disconnects_has_its_queued_items_dropped(indexed_services):
    scorer = HeldScorer()
    settings = Settings(batch_wait_ms=0)
    app = create_app(settings, services=_with_scorer(indexed_services, scorer, settings))
    body = json.dumps({"query": "coffee espresso", "top_k": 3, "candidates": 3}).encode()
    pending = [{"type": "http.request", "body": body, "more_body": False}]
    gone = asyncio.Event()
    sent: list[dict] = []

    async def receive():
        if pending:
            return pending.pop(0)
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/search",
        "raw_path": b"/v1/search",
        "query_string": b"",
        "root_path": "",
        "client": ("127.0.0.1", 5000),
        "server": ("ragrank.test", 80),
        "headers": [(b"content-type", b"application/json"), (b"host", b"ragrank.test")],
    }
    async with concurrent_client(app) as client:
        first = asyncio.create_task(
            client.post("/v1/search", json={"query": "rivers", "top_k": 3, "candidates": 3})
        )
        await _until(lambda: scorer.has_collated("rivers"))  # its pairs hold the model
        second = asyncio.create_task(app(scope, receive, send))
        # The second request's pairs wait behind the first's, collated as its next batch.
        await _until(lambda: scorer.has_collated("coffee espresso"))
        assert not scorer.batches
        gone.set()  # the second client hangs up
        await second
        assert sent[0]["status"] == 499
        scorer.release.set()
        # Hold the loop while the model's thread moves on to the next batch: the items must
        # have been dropped by the time the 499 went out, not on a later turn of the loop.
        time.sleep(0.3)
        assert (await first).status_code == 200
    scored = {query for batch in scorer.batches for query, _ in batch}
    assert scored == {"rivers"}, "the disconnected request's pairs were never scored"


@pytest.mark.parametrize(("warmup", "warm_ups"), [("on", 1), ("off", 0)])
async def test_models_warm_up_before_readiness_unless_turned_off(
    indexed_services, warmup: str, warm_ups: int
):
    scorer = FakeScorer()
    settings = Settings(warmup=warmup)
    app = create_app(settings, services=_with_scorer(indexed_services, scorer, settings))
    async with AsyncTestClient(app=app) as client:
        assert (await client.get("/ready")).status_code == 200
        assert scorer.warm_ups == warm_ups
