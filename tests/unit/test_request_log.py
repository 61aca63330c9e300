"""Request ids in headers and logs, structured log lines, and error counters."""

from __future__ import annotations

import io
import json
import logging
import re
from typing import TYPE_CHECKING

import pytest
from prometheus_client import REGISTRY

from ragrank.logs import REQUEST_ID, JsonFormatter, RequestIdFilter, TextFormatter

if TYPE_CHECKING:
    from collections.abc import Iterator

    from litestar.testing import AsyncTestClient

HEX_ID = re.compile(r"[0-9a-f]{32}")


@pytest.fixture
def json_log() -> Iterator[io.StringIO]:
    """What ragrank's JSON handler writes, as a string."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.addHandler(handler)
    level = root.level
    root.setLevel(logging.INFO)
    yield stream
    root.removeHandler(handler)
    root.setLevel(level)


def _lines(stream: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in stream.getvalue().splitlines()]


async def test_every_response_carries_a_request_id_and_a_sane_one_is_kept(
    fake_client: AsyncTestClient,
):
    answers = [
        await fake_client.get("/health"),
        await fake_client.post("/v1/search", json={"query": ""}),
        await fake_client.get("/no/such/route"),
    ]
    ids = [answer.headers["x-request-id"] for answer in answers]
    assert all(HEX_ID.fullmatch(request_id) for request_id in ids)
    assert len(set(ids)) == 3

    kept = await fake_client.get("/health", headers={"X-Request-ID": "trace-42.a:b_c"})
    assert kept.headers["x-request-id"] == "trace-42.a:b_c"
    for insane in (b"a b", b"x" * 129, b"\xe9", b""):
        answer = await fake_client.get("/health", headers={"X-Request-ID": insane})
        assert HEX_ID.fullmatch(answer.headers["x-request-id"]), insane


async def test_each_request_logs_one_structured_line_with_its_id(
    fake_client: AsyncTestClient, json_log: io.StringIO
):
    answer = await fake_client.post("/v1/search", json={"query": "tea", "top_k": 0})
    assert answer.status_code == 400
    (line,) = [entry for entry in _lines(json_log) if entry["logger"] == "ragrank.requests"]
    assert line["request_id"] == answer.headers["x-request-id"]
    assert (line["method"], line["path"], line["status"]) == ("POST", "/v1/search", 400)
    assert isinstance(line["duration_ms"], float) and line["level"] == "INFO"
    assert "tea" not in json.dumps(line)  # bodies are not logged


def test_records_written_during_a_request_carry_its_id():
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(TextFormatter())
    logger = logging.getLogger("ragrank.test.request_id")
    logger.addHandler(handler)
    logger.propagate = False
    token = REQUEST_ID.set("req-7")
    try:
        logger.warning("store slow", extra={"seconds": 2.5})
    finally:
        REQUEST_ID.reset(token)
    logger.warning("outside")
    inside, outside = stream.getvalue().splitlines()
    assert inside.endswith("store slow request_id=req-7 seconds=2.5")
    assert outside.endswith("outside")

    handler.setFormatter(JsonFormatter())
    try:
        raise ValueError("boom")
    except ValueError:
        logger.exception("failed")
    entry = json.loads(stream.getvalue().splitlines()[-1])
    assert entry["message"] == "failed" and "ValueError: boom" in entry["exc"]
    assert "request_id" not in entry


def _errors(status: int, code: str) -> float:
    value = REGISTRY.get_sample_value("ragrank_errors_total", {"status": str(status), "code": code})
    return value or 0.0


async def test_errors_are_counted_by_status_and_code(fake_client: AsyncTestClient):
    before = _errors(400, "invalid_request"), _errors(404, "not_found")
    await fake_client.post("/v1/search", json={"query": "tea", "top_k": 0})
    await fake_client.post("/v1/search", json={"query": ""})
    await fake_client.get(f"/v1/jobs/{'0' * 32}")
    assert _errors(400, "invalid_request") == before[0] + 2
    assert _errors(404, "not_found") == before[1] + 1
    exposed = (await fake_client.get("/metrics")).text
    assert 'ragrank_errors_total{code="invalid_request",status="400"}' in exposed
