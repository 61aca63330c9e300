"""Prometheus /metrics: HTTP requests by route and status, and what each forward pass held."""

from __future__ import annotations

import re
from pathlib import Path

from litestar.testing import AsyncTestClient

from eval.beir import load_beir
from indexing import Indexer
from indexing.chunking import Chunker
from ragrank import SAMPLE_DATASET
from ragrank.settings import Settings
from ragrank.store import QdrantStore
from server import Services, create_app
from tests.fakes import FakeEmbedder, FakeScorer


def _value(text: str, name: str, **labels: str) -> float:
    """The sample `name{labels...}` in an exposition, or 0."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_metrics_count_requests_by_route_and_status_and_report_batches(tmp_path: Path):
    embedder = FakeEmbedder()
    store = QdrantStore.from_settings(Settings(qdrant_path=tmp_path / "q", collection="t"))
    Indexer(embedder, store, chunker=Chunker(embedder.token_spans, max_tokens=100)).index(
        load_beir(SAMPLE_DATASET).corpus.values(), progress=False
    )
    services = Services(embedder=embedder, scorer=FakeScorer(), store=store)
    try:
        async with AsyncTestClient(app=create_app(Settings(), services=services)) as client:
            before = (await client.get("/metrics")).text
            assert (
                await client.post(
                    "/v1/search", json={"query": "rivers", "top_k": 5, "candidates": 8}
                )
            ).status_code == 200
            assert (await client.post("/v1/search", json={"query": ""})).status_code == 400
            response = await client.get("/metrics")
    finally:
        store.close()
    assert response.status_code == 200
    text = response.text
    ok = _value(text, "ragrank_http_requests_total", path="/v1/search", status_code="200")
    bad = _value(text, "ragrank_http_requests_total", path="/v1/search", status_code="400")
    assert (
        ok - _value(before, "ragrank_http_requests_total", path="/v1/search", status_code="200")
        == 1
    )
    assert (
        bad - _value(before, "ragrank_http_requests_total", path="/v1/search", status_code="400")
        == 1
    )
    assert re.search(r'ragrank_http_request_duration_seconds_bucket\{.*path="/v1/search"', text)
    items = _value(text, "ragrank_batch_items_sum", engine="rerank")
    assert items - _value(before, "ragrank_batch_items_sum", engine="rerank") == 8
    for name in (
        "ragrank_batch_tokens_count",
        "ragrank_batch_padding_ratio_count",
        "ragrank_forward_seconds_count",
        "ragrank_batch_requests_count",
    ):
        assert _value(text, name, engine="embed") > _value(before, name, engine="embed")
    assert "ragrank_queue_depth{" in text
