"""Schemathesis against the server's own OpenAPI schema: the real app on a real socket (uvicorn
in a thread), fake models over an embedded Qdrant with the sample indexed, valid and invalid
requests generated for every operation. No answer may be a 5xx, and every answer must match
the schema (status code, content type, body)."""

from __future__ import annotations

import socket
import threading
import time
from typing import TYPE_CHECKING

import httpx
import pytest
import schemathesis
import uvicorn
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.config import SchemathesisConfig

from ragrank.settings import Settings
from server import create_app

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from server.services import Services

#: Examples per operation and generation mode (valid, invalid): over 1,000 requests in all
#: (operations without parameters, such as GET /health, stop early).
EXAMPLES = 80


#: A body over the server's size limit (RAGRANK_MAX_REQUEST_BYTES) is refused unread with a
#: 413, valid or not: the schema allows, say, 1,000 documents of 1,000,000 characters.
CONFIG = SchemathesisConfig.from_str(
    """
[checks.negative_data_rejection]
expected-statuses = [400, 401, 403, 404, 405, 413, 415, 422, 429]
[checks.positive_data_acceptance]
expected-statuses = [200, 202, 401, 403, 404, 409, 413, 429]
"""
)


@pytest.fixture
def base_url(indexed_services: Services, tmp_path: Path) -> Iterator[str]:
    """The app with fake models and the sample indexed, served by uvicorn on a free port."""
    settings = Settings(jobs_path=tmp_path / "jobs.sqlite3", qdrant_path=tmp_path / "q")
    app = create_app(settings, services=indexed_services)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False)
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.05)
    yield base
    server.should_exit = True
    thread.join(timeout=10)


def test_every_operation_answers_within_its_schema_and_never_5xx(base_url: str):
    schema = schemathesis.openapi.from_url(f"{base_url}/schema/openapi.json", config=CONFIG)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 10
    calls: dict[str, int] = {}
    for operation in operations:
        for mode in GenerationMode:
            strategy = operation.as_strategy(generation_mode=mode)

            @given(case=strategy)
            @settings(
                max_examples=EXAMPLES,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            def check(case: schemathesis.Case) -> None:
                calls[case.operation.label] = calls.get(case.operation.label, 0) + 1
                case.call_and_validate()

            try:
                check()
            except Unsatisfiable:
                # An operation with nothing to get wrong (GET /health) has no invalid input.
                assert mode is GenerationMode.NEGATIVE, operation.label
    print("schemathesis requests per operation:", calls)
    assert sum(calls.values()) >= 1_000, calls
