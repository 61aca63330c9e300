"""The one body guard and the one rule per identifier: every route that reads a body refuses a
body past a limit with a 400 naming the limit and its variable (413 for bytes, 415 for a body
that is not JSON), before any model work; ids follow the same rule in paths and bodies."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import pytest
from litestar.testing import AsyncTestClient

from ragrank.errors import DocumentError, SettingsError
from ragrank.jobs.sqlite import SqliteJobQueue
from ragrank.settings import Settings
from server import create_app

if TYPE_CHECKING:
    from collections.abc import AsyncIterator
    from pathlib import Path

    from server import Services

#: One valid body per route that reads one; `{}` is where a nested value goes.
BODIES: dict[str, dict[str, Any]] = {
    "/v1/search": {"query": "tea", "filter": {"lang": "en"}},
    "/v1/rerank": {"query": "tea", "documents": ["a", "b"]},
    "/v2/rerank": {"query": "tea", "documents": ["a", "b"]},
    "/rerank": {"query": "tea", "texts": ["a", "b"]},
    "/v1/embeddings": {"input": ["a", "b"]},
    "/v1/documents": {"documents": [{"id": "d", "text": "x", "metadata": {"k": 1}}]},
}

LIMITS = {
    "max_request_bytes": 20_000,
    "max_json_depth": 6,
    "max_json_values": 200,
    "max_json_items": 100,
    "max_json_keys": 20,
    "max_json_string_chars": 1_000,
    "max_query_chars": 100,
    "max_document_chars": 500,
    "max_ingest_document_chars": 1_000,
    "max_rerank_documents": 50,
    "max_embed_inputs": 50,
    "max_ingest_documents": 50,
}


@pytest.fixture
async def client(indexed_services: Services, tmp_path: Path) -> AsyncIterator[AsyncTestClient]:
    settings = Settings(jobs_path=tmp_path / "jobs.sqlite3", **LIMITS)
    async with AsyncTestClient(app=create_app(settings, services=indexed_services)) as client:
        yield client


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"a": value}
    return value


def _breaking(route: str, limit: str) -> bytes:
    """A body for `route` past `limit` only, in the field where a client would put it."""
    body = json.loads(json.dumps(BODIES[route]))
    # The body limits come before the route's types: any field can carry the breach.
    slot = {"/v1/documents": "metadata", "/v1/search": "filter"}.get(route, "model")
    holder = body["documents"][0] if route == "/v1/documents" else body
    holder[slot] = {
        "max_json_depth": _nested(8),
        "max_json_items": {"k": list(range(101))},
        "max_json_keys": {f"k{i}": i for i in range(21)},
        "max_json_string_chars": {"k": "x" * 1_001},
        "max_json_values": {"k": [[1, 2]] * 90},
    }[limit]
    return json.dumps(body).encode()


@pytest.mark.parametrize("route", BODIES)
@pytest.mark.parametrize(
    "limit", ["max_json_depth", "max_json_items", "max_json_keys", "max_json_string_chars"]
)
async def test_every_body_limit_is_a_400_naming_it_on_every_route(
    client: AsyncTestClient, indexed_services: Services, route: str, limit: str
):
    assert (await client.post(route, json=BODIES[route])).status_code in (200, 202)
    calls = len(indexed_services.inference.scorer.batches), len(indexed_services.embedder.seen)
    response = await client.post(
        route, content=_breaking(route, limit), headers={"content-type": "application/json"}
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert f"RAGRANK_{limit.upper()}" in error["message"], error
    assert error["field"], error  # where in the body the limit was passed
    after = len(indexed_services.inference.scorer.batches), len(indexed_services.embedder.seen)
    assert after == calls  # refused before any model saw it


@pytest.mark.parametrize("route", BODIES)
async def test_values_bytes_media_type_and_duplicates_are_checked_on_every_route(
    client: AsyncTestClient, route: str
):
    body = _breaking(route, "max_json_values")
    response = await client.post(route, content=body, headers={"content-type": "application/json"})
    assert response.status_code == 400 and "RAGRANK_MAX_JSON_VALUES" in response.text
    big = json.dumps({**BODIES[route], "model": "x" * 30_000})
    response = await client.post(route, content=big, headers={"content-type": "application/json"})
    assert response.status_code == 413 and "RAGRANK_MAX_REQUEST_BYTES" in response.text
    for media_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
        response = await client.post(
            route, content=json.dumps(BODIES[route]), headers={"content-type": media_type}
        )
        assert response.status_code == 415, (media_type, response.text)
        assert "application/json" in response.json()["error"]["message"]
    twice = json.dumps(BODIES[route])[:-1] + ', "model": "a", "model": "b"}'
    response = await client.post(route, content=twice, headers={"content-type": "application/json"})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["field"] == "model"
    for empty in (b"", b"  "):
        response = await client.post(
            route, content=empty, headers={"content-type": "application/json"}
        )
        assert response.status_code == 400 and "JSON body" in response.text


async def test_a_body_within_every_limit_passes_whatever_its_shape(client: AsyncTestClient):
    """Just inside each bound is accepted: the limits are exact, not approximate."""
    deep = {"documents": [{"id": "d", "text": "x", "metadata": {"k": _nested(2)}}]}  # 6 levels
    wide = {"documents": [{"id": "d", "text": "x" * 1_000, "metadata": {"k": list(range(100))}}]}
    keys = {"documents": [{"id": "d", "text": "x", "metadata": {f"k{i}": i for i in range(20)}}]}
    for body in (deep, wide, keys):
        response = await client.post("/v1/documents", json=body)
        assert response.status_code == 202, response.text
    seven = {"documents": [{"id": "d", "text": "x", "metadata": {"k": _nested(3)}}]}
    assert (await client.post("/v1/documents", json=seven)).status_code == 400


async def test_non_json_numbers_strings_and_deep_nesting_are_400s(client: AsyncTestClient):
    for body in (
        b'{"query": "a", "top_k": NaN}',
        b'{"query": "a", "top_k": 1e999}',
        b'{"query": "a", "top_k": ' + b"9" * 5_000 + b"}",
        b'{"query": "\xff"}',
        b'{"query": "\\ud800"}',
        b'{"query": "a", "filter": ' + b'{"a": ' * 2_000 + b"1" + b"}" * 2_001,
        b"[" * 19_000,
        b'{"query": "a"',
    ):
        response = await client.post(
            "/v1/search", content=body, headers={"content-type": "application/json"}
        )
        assert response.status_code == 400, (body[:40], response.text)
        assert "Traceback" not in response.text
    assert (await client.get("/ready")).status_code == 200


async def test_the_schema_says_the_body_limits(client: AsyncTestClient):
    schema = (await client.get("/schema/openapi.json")).json()
    described = schema["info"]["description"]
    for limit in LIMITS:
        if limit.startswith("max_json") or limit == "max_request_bytes":
            assert f"RAGRANK_{limit.upper()}" in described
    components = schema["components"]["schemas"]
    embeddings = components["EmbeddingsRequest"]["properties"]
    user = next(s for s in embeddings["user"]["anyOf"] if s.get("type") == "string")
    assert user["maxLength"] == 1_000  # no bound of its own: the body's
    model = next(s for s in embeddings["model"]["anyOf"] if s.get("type") == "string")
    assert model["maxLength"] == 256  # its own, below the body's
    metadata = components["DocumentIn"]["properties"]["metadata"]
    assert metadata["maxProperties"] == 20  # the body's, below the type's 64
    assert components["SearchRequest"]["properties"]["query"]["maxLength"] == 100
    doc_id = components["DocumentIn"]["properties"]["id"]
    assert doc_id["maxLength"] == 512 and doc_id["pattern"].startswith("^[^\\x00-\\x1f")
    delete = schema["paths"]["/v1/documents/{doc_id}"]["delete"]["parameters"][0]["schema"]
    assert delete["maxLength"] == 512 and delete["pattern"] == doc_id["pattern"]
    job = schema["paths"]["/v1/jobs/{job_id}"]["get"]["parameters"][0]["schema"]
    assert job["pattern"].startswith("^[0-9a-f]{32}")


def test_a_body_limit_must_hold_the_route_limits():
    with pytest.raises(SettingsError, match="RAGRANK_MAX_JSON_STRING_CHARS"):
        Settings(max_ingest_document_chars=2_000_000)
    with pytest.raises(SettingsError, match="RAGRANK_MAX_JSON_ITEMS"):
        Settings(max_json_items=100, max_rerank_documents=200)
    with pytest.raises(SettingsError, match="RAGRANK_MAX_JSON_DEPTH must be between 4"):
        Settings(max_json_depth=3)


async def test_a_document_id_is_addressable_in_the_path_exactly_as_given(
    client: AsyncTestClient, tmp_path: Path
):
    """Ids may hold `/`, spaces and any script; a delete by path names the same id."""
    jobs = SqliteJobQueue(tmp_path / "jobs.sqlite3")
    for doc_id, path in [
        ("guide/intro.md", "guide/intro.md"),
        ("guide/intro.md", "guide%2Fintro.md"),
        ("a//b/", "a//b/"),
        ("é x?#", "%C3%A9%20x%3F%23"),
        ("x" * 512, "x" * 512),
    ]:
        response = await client.delete(f"/v1/documents/{path}")
        assert response.status_code == 202, (path, response.text)
        job = jobs.get(response.json()["job_id"])
        assert job is not None and job.payload["doc_id"] == doc_id
    accepted = await client.post(
        "/v1/documents", json={"documents": [{"id": "a//b/", "text": "x"}]}
    )
    assert accepted.status_code == 202


async def test_an_id_off_its_rule_is_a_400_in_a_path_and_in_a_body(client: AsyncTestClient):
    for path in ("x" * 513, "a%00b", "a%0A", "%FF", "tab%09"):
        response = await client.delete(f"/v1/documents/{path}")
        assert response.status_code == 400, (path, response.text)
        assert response.json()["error"]["field"] == "doc_id"
    for doc_id in ("x" * 513, "a\x00b", "a\n", ""):
        body = {"documents": [{"id": doc_id, "text": "x"}]}
        response = await client.post("/v1/documents", json=body)
        assert response.status_code == 400, (doc_id, response.text)
        assert response.json()["error"]["field"] == "documents[0].id"
        search = await client.post("/v1/search", json={"query": "a", "filter": {"doc_id": doc_id}})
        assert search.status_code == 400, search.text
        assert search.json()["error"]["field"] == "filter.doc_id"
    for job_id in ("nope", "x" * 10_000, "A" * 32, "0" * 31):
        response = await client.get(f"/v1/jobs/{job_id}")
        assert response.status_code == 400 and response.json()["error"]["field"] == "job_id"
        assert len(response.text) < 300  # the id is not echoed back
    assert (await client.get(f"/v1/jobs/{'0' * 32}")).status_code == 404


def test_files_and_collections_follow_the_same_rules(tmp_path: Path):
    from indexing import read_documents

    (tmp_path / "bad\x01name.md").write_text("x", encoding="utf-8")
    with pytest.raises(DocumentError, match="control character"):
        list(read_documents(tmp_path))
    (tmp_path / "corpus.jsonl").write_text('{"_id": "a\\u0007", "text": "x"}\n', encoding="utf-8")
    with pytest.raises(DocumentError, match="control character"):
        list(read_documents(tmp_path / "corpus.jsonl"))
    for name in ("../escape", ".hidden", "a/b", "", "x" * 256, "spa ce"):
        with pytest.raises(SettingsError, match="RAGRANK_COLLECTION"):
            Settings(collection=name)
    assert Settings(collection="ragrank-demo_2.1").collection == "ragrank-demo_2.1"
