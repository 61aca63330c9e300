"""Fuzzing the real app on a real socket (uvicorn in a thread: `tests.servers.app_on_socket`),
fake models over an embedded Qdrant with the sample indexed. Schemathesis generates valid and
invalid requests from the server's own OpenAPI schema: every answer must match it (status code,
content type, body).
The structural fuzzer sends what no schema describes (tests/hostile.py): bodies built to break
parsers and validators. No answer may be a 5xx, and the server answers `/ready` after."""

from __future__ import annotations

import json
import random
from typing import TYPE_CHECKING

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.config import SchemathesisConfig

from ragrank.settings import Settings
from server import create_app
from tests import hostile
from tests.servers import app_on_socket

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

    from litestar import Litestar

    from server.services import Services

#: Examples per operation and generation mode (valid, invalid): over 1,000 requests in all
#: (operations without parameters, such as GET /health, stop early).
EXAMPLES = 60


def aliases(app: Litestar) -> set[tuple[str, str]]:
    """(method, path) of each operation whose handler another path also serves (`/v2/rerank`
    beside `/v1/rerank`): fuzzing one path of a handler (the first, sorted) covers them all."""
    operations: dict[object, list[tuple[str, str]]] = {}
    for route in app.routes:
        for handler in getattr(route, "route_handlers", ()):
            served = operations.setdefault(handler.fn, [])
            served.extend((method, route.path_format) for method in handler.http_methods)
    return {alias for served in operations.values() for alias in sorted(served)[1:]}


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
def app(indexed_services: Services, tmp_path: Path) -> Litestar:
    """The app with fake models and the sample indexed."""
    settings = Settings(jobs_path=tmp_path / "jobs.sqlite3", qdrant_path=tmp_path / "q")
    return create_app(settings, services=indexed_services)


@pytest.fixture
def base_url(app: Litestar) -> Iterator[str]:
    """The app served by uvicorn on a free port."""
    with app_on_socket(app) as base:
        yield base


def test_every_operation_answers_within_its_schema_and_never_5xx(base_url: str, app: Litestar):
    schema = schemathesis.openapi.from_url(f"{base_url}/schema/openapi.json", config=CONFIG)
    skipped = aliases(app)
    operations = [
        operation
        for operation in (result.ok() for result in schema.get_all_operations())
        if (operation.method.upper(), operation.path) not in skipped
    ]
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


#: Fresh recipes per run, beside the corpus; a failing one is printed to be added to it.
FRESH = 100


def test_hostile_bodies_and_paths_never_get_a_5xx(base_url: str):
    seed = random.randrange(2**32)
    recipes = hostile.load() + hostile.generate(seed, FRESH)
    assert any(r.get("regression") for r in recipes) and len(recipes) >= 400
    statuses: dict[int, int] = {}
    with httpx.Client(base_url=base_url, timeout=60) as client:
        for recipe in recipes:
            status = _send(client, hostile.build(recipe), recipe, seed)
            statuses[status] = statuses.get(status, 0) + 1
        assert client.get("/ready").status_code == 200
    print("hostile requests by status:", statuses)


def _send(
    client: httpx.Client, request: hostile.Request, recipe: dict[str, object], seed: int
) -> int:
    headers = {"content-type": request.media_type} if request.media_type else {}
    content: object = request.body
    if request.chunks and request.body:
        size = max(1, len(request.body) // request.chunks)
        body = request.body
        content = (body[i : i + size] for i in range(0, len(body), size))
    try:
        answer = client.request(request.method, request.path, content=content, headers=headers)
    except (httpx.RemoteProtocolError, httpx.WriteError, httpx.ReadError):
        # The server may close a connection it will not read to the end (a body past its size
        # limit); it must still be up, which the next request and /ready check.
        return 0
    where = f"recipe {json.dumps(recipe)} (fresh ones from seed {seed})"
    assert answer.status_code < 500, f"{answer.status_code} {answer.text[:300]} for {where}"
    if answer.status_code >= 400:
        error = answer.json()["error"]
        assert error["code"] and error["message"], where
        assert "Traceback" not in answer.text and 'File "' not in answer.text, where
    return answer.status_code
