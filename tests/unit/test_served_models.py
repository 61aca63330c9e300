"""Several models in one server: a request's `model` picks a reranker or an embedder by one of
its names or its model id; absent, or a name no served model answers to, it gets the default
(the first), and under strict names an unknown one is a 400 listing the served ones.
`/v1/models`, `/ready` and the metrics list them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from litestar.testing import AsyncTestClient

from ragrank.errors import SettingsError
from ragrank.inference import Served, role_spec
from ragrank.roles import EMBEDDING, RERANK, Role
from ragrank.settings import ANY_NAME, ServedModel, Settings, parse_served
from server import create_app
from tests.fakes import NarrowEmbedder, ShortFirstScorer, swap_models

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

    from server.services import Services

DOCUMENTS = ["short one", "a much longer document about rivers and seas", "medium text here"]


def _several(
    services: Services, settings: Settings | None = None, *, any_name: bool = False
) -> Services:
    settings = settings or Settings()
    second, narrow = ShortFirstScorer(), NarrowEmbedder()
    scorer, embedder = services.inference.scorer, services.embedder
    default_names = ("bge", ANY_NAME) if any_name else ("bge", "BAAI/bge-reranker-v2-m3")

    def served(role: Role, names: tuple[str, ...], model: Any) -> Served[Any]:
        return Served(role_spec(settings, role, model.model_id, names), model)

    return swap_models(
        services,
        settings,
        rerankers=[
            served(RERANK, default_names, scorer),
            served(RERANK, ("short", second.model_id), second),
        ],
        embedders=[
            served(EMBEDDING, ("e5", embedder.model_id), embedder),
            served(EMBEDDING, ("narrow",), narrow),
        ],
    )


@pytest.fixture
async def client(indexed_services: Services) -> AsyncIterator[AsyncTestClient]:
    app = create_app(Settings(), services=_several(indexed_services))
    async with AsyncTestClient(app=app) as test_client:
        yield test_client


async def _order(client: AsyncTestClient, **extra: str) -> list[int]:
    body = {"query": "rivers", "documents": DOCUMENTS, **extra}
    answer = await client.post("/v1/rerank", json=body)
    assert answer.status_code == 200, answer.text
    return [r["index"] for r in answer.json()["results"]]


async def test_the_model_field_picks_a_reranker_by_name_or_id_and_the_default_is_the_first(
    client: AsyncTestClient,
):
    longest_first, shortest_first = [1, 2, 0], [0, 2, 1]
    assert await _order(client) == longest_first
    assert await _order(client, model="bge") == longest_first
    assert await _order(client, model="BAAI/bge-reranker-v2-m3") == longest_first
    assert await _order(client, model="short") == shortest_first
    assert await _order(client, model="fake-short-first") == shortest_first
    tei = await client.post("/rerank", json={"query": "q", "texts": DOCUMENTS, "model": "short"})
    assert [r["index"] for r in tei.json()] == shortest_first
    named = await client.post(
        "/v1/rerank", json={"query": "q", "documents": DOCUMENTS, "model": "short"}
    )
    assert named.json()["model"] == "fake-short-first"


#: A vendor's model name on every route that takes a `model`.
VENDOR_NAMED = (
    ("/v1/rerank", {"query": "q", "documents": ["d"], "model": "rerank-v3.5"}),
    ("/rerank", {"query": "q", "texts": ["d"], "model": "rerank-v3.5"}),
    ("/v1/search", {"query": "rivers", "model": "rerank-v3.5"}),
    ("/v1/embeddings", {"input": ["rivers"], "model": "rerank-v3.5"}),
    ("/embed", {"inputs": ["rivers"], "model": "rerank-v3.5"}),
    ("/v2/embed", {"texts": ["rivers"], "model": "rerank-v3.5"}),
)


async def test_by_default_a_name_no_model_has_gets_the_default_on_every_route(
    client: AsyncTestClient,
):
    for path, body in VENDOR_NAMED:
        answer = await client.post(path, json=body)
        assert answer.status_code == 200, (path, answer.text)
    assert await _order(client, model="rerank-v3.5") == await _order(client)
    vectors = await client.post("/v1/embeddings", json={"input": ["r"], "model": "ada-002"})
    assert vectors.json()["model"] == "fake-embedder"
    assert len(vectors.json()["data"][0]["embedding"]) == 64  # the default, not `narrow`
    schema = (await client.get("/schema/openapi.json")).json()["components"]["schemas"]
    assert "enum" not in schema["RerankRequest"]["properties"]["model"]["anyOf"][0]


async def test_strict_names_make_an_unknown_model_a_400_listing_the_served_ones(
    indexed_services: Services,
):
    settings = Settings(model_names="strict")
    app = create_app(settings, services=_several(indexed_services, settings))
    async with AsyncTestClient(app=app) as client:
        await _strict_answers(client)
        schema = (await client.get("/schema/openapi.json")).json()["components"]["schemas"]
        model = schema["RerankRequest"]["properties"]["model"]["anyOf"][0]
        assert model["enum"] == sorted(
            ["bge", "BAAI/bge-reranker-v2-m3", "short", "fake-short-first"]
        )


async def _strict_answers(client: AsyncTestClient) -> None:
    for path, body in VENDOR_NAMED:
        answer = await client.post(path, json=body)
        assert answer.status_code == 400, (path, answer.text)
        error = answer.json()["error"]
        assert error["field"] == "model", path
        assert "'rerank-v3.5' is not served" in error["message"]
        served = (
            ("bge", "short") if path.endswith("rerank") or "search" in path else ("e5", "narrow")
        )
        assert all(name in error["message"] for name in served), error["message"]


async def test_a_catch_all_name_takes_any_name_no_other_model_has(indexed_services: Services):
    settings = Settings(model_names="strict")
    app = create_app(settings, services=_several(indexed_services, settings, any_name=True))
    async with AsyncTestClient(app=app) as client:
        assert await _order(client, model="rerank-v3.5") == [1, 2, 0]
        assert await _order(client, model="short") == [0, 2, 1]


async def test_search_reranks_with_the_named_model(client: AsyncTestClient):
    async def scores(**extra: str) -> dict[str, float]:
        body = {"query": "rivers", "top_k": 8, "candidates": 8, **extra}
        answer = await client.post("/v1/search", json=body)
        assert answer.status_code == 200, answer.text
        return {hit["text"]: hit["score"] for hit in answer.json()["results"]}

    default, short = await scores(), await scores(model="short")
    # The two rerankers' logits are each other's negatives: sigmoid(-x) = 1 - sigmoid(x).
    assert len(default) == 8 and default.keys() == short.keys()
    for text, score in default.items():
        assert short[text] == pytest.approx(1 - score)


async def test_the_model_field_picks_an_embedder_and_its_dimension(client: AsyncTestClient):
    default = await client.post("/v1/embeddings", json={"input": ["rivers"]})
    narrow = await client.post("/v1/embeddings", json={"input": ["rivers"], "model": "narrow"})
    assert len(default.json()["data"][0]["embedding"]) == 64
    assert len(narrow.json()["data"][0]["embedding"]) == 16
    assert narrow.json()["model"] == "fake-narrow-embedder"
    asked = {"input": ["rivers"], "model": "narrow", "dimensions": 64}
    wrong = await client.post("/v1/embeddings", json=asked)
    assert wrong.status_code == 400 and "16" in wrong.json()["error"]["message"]


async def test_models_lists_every_served_model_openai_shaped(client: AsyncTestClient):
    answer = await client.get("/v1/models")
    assert answer.status_code == 200
    body = answer.json()
    assert body["object"] == "list"
    cards = [(m["id"], m["type"], m["default"], m["object"]) for m in body["data"]]
    assert cards == [
        ("e5", "embedding", True, "model"),
        ("narrow", "embedding", False, "model"),
        ("bge", "rerank", True, "model"),
        ("short", "rerank", False, "model"),
    ]
    short = body["data"][3]
    assert short["model"] == "fake-short-first" and short["names"] == ["short", "fake-short-first"]
    assert all(isinstance(m["created"], int) and m["owned_by"] == "ragrank" for m in body["data"])


async def test_ready_and_the_metrics_name_every_model(client: AsyncTestClient):
    ready = (await client.get("/ready")).json()
    assert ready["rerank_models"] == ["bge", "short"]
    assert ready["embed_models"] == ["e5", "narrow"]
    assert ready["rerank_model"] == "fake-scorer"
    await _order(client, model="short")
    metrics = (await client.get("/metrics")).text
    assert 'ragrank_batch_items_count{engine="rerank",model="short"}' in metrics
    assert 'ragrank_queue_depth{engine="rerank",model="bge"}' in metrics
    assert 'ragrank_queue_depth{engine="embed",model="narrow"}' in metrics


def test_served_lists_parse_names_and_refuse_what_is_ambiguous():
    assert parse_served("", "X") == ()
    assert parse_served("bge|*=BAAI/bge, /models/qwen", "X") == (
        ServedModel(("bge", "*", "BAAI/bge"), "BAAI/bge"),
        ServedModel(("/models/qwen",), "/models/qwen"),
    )
    for bad in ("a=m1,a=m2", "m1,,m2", "=m", "a|=m", "a="):
        with pytest.raises(SettingsError, match="X"):
            parse_served(bad, "X")
    settings = Settings(rerank_models="bge=BAAI/bge-reranker-v2-m3,qwen=Qwen/Qwen3-Reranker-0.6B")
    assert settings.rerank_model == "BAAI/bge-reranker-v2-m3"
    assert [s.name for s in settings.served_rerankers] == ["bge", "qwen"]
    assert [s.names for s in Settings(rerank_model="m").served_rerankers] == [("m",)]
    with pytest.raises(SettingsError, match="RAGRANK_RERANK_MODELS"):
        Settings(rerank_models="a=x,a=y")
