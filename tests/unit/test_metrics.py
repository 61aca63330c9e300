"""Prometheus /metrics: HTTP requests by route and status, and what each forward pass held."""

from __future__ import annotations

import re

from litestar.testing import AsyncTestClient

from ragrank.settings import Settings
from server import create_app


def _value(text: str, name: str, **labels: str) -> float:
    """The sample `name{labels...}` in an exposition, or 0."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_metrics_count_requests_by_route_and_status_and_report_batches(indexed_services):
    app = create_app(Settings(), services=indexed_services)
    async with AsyncTestClient(app=app) as client:
        before = (await client.get("/metrics")).text
        search = {"query": "rivers", "top_k": 5, "candidates": 8}
        assert (await client.post("/v1/search", json=search)).status_code == 200
        assert (await client.post("/v1/search", json={"query": ""})).status_code == 400
        response = await client.get("/metrics")
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
    # Labelled by engine and by model (other tests in this process serve other models).
    rerank = {"engine": "rerank", "model": "fake-scorer"}
    items = _value(text, "ragrank_batch_items_sum", **rerank)
    assert items - _value(before, "ragrank_batch_items_sum", **rerank) == 8
    for name in (
        "ragrank_batch_tokens_count",
        "ragrank_batch_padding_ratio_count",
        "ragrank_forward_seconds_count",
        "ragrank_batch_requests_count",
    ):
        embed = {"engine": "embed", "model": "fake-embedder"}
        assert _value(text, name, **embed) > _value(before, name, **embed)
    assert "ragrank_queue_depth{" in text


async def test_the_job_queue_is_reported_by_state(indexed_services, tmp_path):
    settings = Settings(jobs_path=tmp_path / "jobs.sqlite3")
    async with AsyncTestClient(app=create_app(settings, services=indexed_services)) as client:
        empty = (await client.get("/metrics")).text
        assert _value(empty, "ragrank_jobs", state="queued") == 0
        assert not settings.jobs_path.exists()  # a scrape makes no queue file
        body = {"documents": [{"id": "d", "text": "x"}]}
        for _ in range(3):
            assert (await client.post("/v1/documents", json=body)).status_code == 202
        assert (await client.delete("/v1/documents/d")).status_code == 202
        text = (await client.get("/metrics")).text
    assert _value(text, "ragrank_jobs", state="queued") == 4  # no worker runs here
    assert _value(text, "ragrank_jobs", state="done") == 0


async def test_each_stage_and_the_device_clock_are_reported(indexed_services):
    app = create_app(Settings(), services=indexed_services)
    rerank = {"engine": "rerank", "model": "fake-scorer"}
    async with AsyncTestClient(app=app) as client:
        before = (await client.get("/metrics")).text
        search = {"query": "rivers", "top_k": 5, "candidates": 8}
        assert (await client.post("/v1/search", json=search)).status_code == 200
        text = (await client.get("/metrics")).text
    for stage in ("tokenise", "collate", "forward", "queue_wait"):
        grown = _value(text, "ragrank_stage_seconds_total", stage=stage, **rerank) - _value(
            before, "ragrank_stage_seconds_total", stage=stage, **rerank
        )
        assert grown > 0, stage
    busy = "ragrank_device_busy_seconds_total"
    assert _value(text, busy, **rerank) > _value(before, busy, **rerank)
    assert 0.0 <= _value(text, "ragrank_device_idle_share", **rerank) <= 1.0
    assert "ragrank_device_idle_seconds_total{" in text
