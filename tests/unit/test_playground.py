"""The playground's routes without a browser: the page, its security headers, its helper routes
and the settings that shape them. The page itself is driven in tests/integration."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from litestar.testing import AsyncTestClient

from ragrank import SAMPLE_DATASET
from ragrank.beir import load_beir
from ragrank.errors import SettingsError
from ragrank.settings import Settings
from server.app import create_app

if TYPE_CHECKING:
    from pathlib import Path

    from server.services import Services

KEY = "playground-test-key"


async def test_root_links_the_playground_which_serves_its_files_with_a_strict_policy(
    fake_client: AsyncTestClient,
):
    root = await fake_client.get("/")
    assert root.status_code == 200 and root.headers["content-type"].startswith("text/html")
    assert 'href="/playground"' in root.text
    page = await fake_client.get("/playground")
    assert page.status_code == 200 and "ragrank playground" in page.text
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "default-src 'none'" in policy
    assert "unsafe-inline" not in policy and "unsafe-eval" not in policy
    assert page.headers["x-content-type-options"] == "nosniff"
    for asset in ("playground.js", "playground.css"):
        served = await fake_client.get(f"/playground/{asset}")
        assert served.status_code == 200 and served.headers["content-security-policy"] == policy
    # No inline script or style in the page: the policy would block them.
    assert "<script>" not in page.text and "<style" not in page.text and " style=" not in page.text


async def test_playground_routes_stay_out_of_the_openapi_schema(fake_client: AsyncTestClient):
    paths = (await fake_client.get("/schema/openapi.json")).json()["paths"]
    assert "/v1/search" in paths
    assert not [path for path in paths if path.startswith("/playground")]
    assert list(paths["/"]) == ["post"]  # TEI's embed; the page's GET / stays out


async def test_config_says_what_the_page_may_offer(fake_client: AsyncTestClient):
    config = (await fake_client.get("/playground/config")).json()
    assert config["api_keys"] is False
    assert config["retrievals"] == ["dense", "sparse", "hybrid"]
    assert config["retrieval"] == Settings().retrieval
    assert config["labels"] is None
    assert (await fake_client.get("/playground/examples")).json() == []


async def test_labels_come_from_the_configured_beir_folder_by_exact_query_text(
    fake_services: Services,
):
    dataset = load_beir(SAMPLE_DATASET)
    query_id, text = next(iter(dataset.judged_queries.items()))
    settings = Settings(labels=SAMPLE_DATASET, api_keys=KEY)
    async with AsyncTestClient(app=create_app(settings, services=fake_services)) as client:
        config = (await client.get("/playground/config")).json()
        assert config["labels"] == SAMPLE_DATASET.name and config["api_keys"] is True
        # The labels are the collection's data: they need a key like the API.
        assert (await client.get("/playground/examples")).status_code == 401
        auth = {"Authorization": f"Bearer {KEY}"}
        examples = (await client.get("/playground/examples", headers=auth)).json()
        assert {e["id"] for e in examples} == set(dataset.judged_queries)
        found = (await client.get("/playground/labels", params={"text": text}, headers=auth)).json()
        assert found == {"query_id": query_id, "relevant": dict(dataset.qrels[query_id])}
        unknown = await client.get("/playground/labels", params={"text": "no such"}, headers=auth)
        assert unknown.json() == {"query_id": None, "relevant": {}}
        too_long = await client.get(
            "/playground/labels", params={"text": "x" * 30_000}, headers=auth
        )
        assert too_long.status_code == 400 and too_long.json()["error"]["field"] == "text"


async def test_playground_off_leaves_only_the_landing_page(fake_services: Services):
    settings = Settings(playground="off")
    async with AsyncTestClient(app=create_app(settings, services=fake_services)) as client:
        root = await client.get("/")
        assert root.status_code == 200 and "/playground" not in root.text
        for path in ("/playground", "/playground/config", "/playground/playground.js"):
            assert (await client.get(path)).status_code == 404


def test_unreadable_labels_stop_the_server_at_start_with_the_setting_named(
    tmp_path: Path, fake_services: Services
):
    with pytest.raises(SettingsError, match="RAGRANK_LABELS"):
        create_app(Settings(labels=tmp_path / "missing"), services=fake_services)
    with pytest.raises(SettingsError, match="RAGRANK_PLAYGROUND must be one of on, off"):
        Settings(playground="maybe")
