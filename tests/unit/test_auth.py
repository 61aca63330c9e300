"""API keys: probes stay open, everything else needs a key; read-only keys cannot write."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from litestar.testing import AsyncTestClient

from ragrank.errors import SettingsError
from ragrank.settings import Settings
from server import create_app
from server.auth import Access, ApiKeys

if TYPE_CHECKING:
    from pathlib import Path

    from server.services import Services

FULL, READONLY = "full-key-1", "read-key-1"
SEARCH = {"query": "tea", "top_k": 1}
RERANK = {"query": "tea", "documents": ["green tea", "the Rhine"]}
DOCUMENTS = {"documents": [{"id": "d", "text": "Green tea."}]}


@pytest.fixture
async def client(fake_services: Services, tmp_path: Path):
    settings = Settings(
        api_keys=f"{FULL}, other-key", readonly_api_keys=READONLY, jobs_path=tmp_path / "j.db"
    )
    async with AsyncTestClient(app=create_app(settings, services=fake_services)) as client:
        yield client


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


async def test_probes_need_no_key_and_everything_else_does(client: AsyncTestClient):
    assert (await client.get("/health")).status_code == 200
    assert (await client.get("/ready")).status_code == 200
    for method, path, body in [
        ("POST", "/v1/search", SEARCH),
        ("POST", "/v1/search", {"not": "valid"}),  # refused before the body is read
        ("POST", "/v1/rerank", RERANK),
        ("POST", "/v1/embeddings", {"input": "tea"}),
        ("POST", "/v1/documents", DOCUMENTS),
        ("GET", "/v1/jobs/nope", None),
        ("GET", "/metrics", None),
        ("GET", "/schema/openapi.json", None),
    ]:
        for headers in ({}, _bearer("wrong"), {"api-key": "wrong"}, {"Authorization": FULL}):
            answer = await client.request(method, path, json=body, headers=headers)
            assert answer.status_code == 401, (path, headers, answer.text)
            assert answer.json()["error"]["code"] == "unauthorized"
            assert "Bearer" in answer.headers["www-authenticate"]
            assert "wrong" not in answer.text


async def test_a_full_key_may_do_everything_by_either_header(client: AsyncTestClient):
    for headers in (_bearer(FULL), {"api-key": FULL}, _bearer("other-key")):
        assert (await client.post("/v1/search", json=SEARCH, headers=headers)).status_code == 200
        accepted = await client.post("/v1/documents", json=DOCUMENTS, headers=headers)
        assert accepted.status_code == 202
        deleted = await client.delete("/v1/documents/d", headers=headers)
        assert deleted.status_code == 202
        assert (await client.get("/metrics", headers=headers)).status_code == 200


async def test_a_readonly_key_reads_but_gets_403_on_writes(client: AsyncTestClient):
    headers = _bearer(READONLY)
    assert (await client.post("/v1/search", json=SEARCH, headers=headers)).status_code == 200
    assert (await client.post("/v1/rerank", json=RERANK, headers=headers)).status_code == 200
    embedded = await client.post("/v1/embeddings", json={"input": "tea"}, headers=headers)
    assert embedded.status_code == 200
    for answer in (
        await client.post("/v1/documents", json=DOCUMENTS, headers=headers),
        await client.delete("/v1/documents/d", headers={"api-key": READONLY}),
    ):
        assert answer.status_code == 403
        assert answer.json()["error"]["code"] == "forbidden"
        assert "read-only" in answer.json()["error"]["message"]


async def test_the_openapi_schema_declares_both_ways_to_send_a_key(client: AsyncTestClient):
    schema = (await client.get("/schema/openapi.json", headers=_bearer(READONLY))).json()
    schemes = schema["components"]["securitySchemes"]
    assert schemes["bearer"] == {"type": "http", "scheme": "bearer"}
    assert schemes["apiKey"] == {"type": "apiKey", "name": "api-key", "in": "header"}


async def test_without_keys_the_api_is_open(fake_client: AsyncTestClient):
    assert (await fake_client.post("/v1/search", json=SEARCH)).status_code == 200
    schema = (await fake_client.get("/schema/openapi.json")).json()
    assert "securitySchemes" not in schema.get("components", {})


def test_keys_come_from_variables_and_files_and_never_show_in_repr(tmp_path: Path):
    file = tmp_path / "keys"
    file.write_text("# team A\nfile-key\n\n  spaced-key  \n", encoding="utf-8")
    settings = Settings.from_env(
        {
            "RAGRANK_API_KEYS": " env-key ,",
            "RAGRANK_API_KEYS_FILE": str(file),
            "RAGRANK_READONLY_API_KEYS": "reader,env-key",
        }
    )
    assert "env-key" not in repr(settings) and "reader" not in repr(settings)
    keys = ApiKeys.from_settings(settings)
    for key in ("env-key", "file-key", "spaced-key"):
        assert keys.access(key) is Access.WRITE  # also listed read-only: the wider one counts
    assert keys.access("reader") is Access.READ
    for key in ("# team A", "", "Env-key", "env-key ", None):
        assert keys.access(key) is Access.NONE


def test_an_unreadable_key_file_stops_start_up_naming_the_variable(
    tmp_path: Path, fake_services: Services
):
    settings = Settings(readonly_api_keys_file=tmp_path / "missing")
    with pytest.raises(SettingsError, match="RAGRANK_READONLY_API_KEYS_FILE"):
        create_app(settings, services=fake_services)
