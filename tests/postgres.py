"""The throwaway PostgreSQL that `.ci/postgres` starts, for the tests of the shared job queue:
each test gets a database of its own on it, and a test that restarts the database gets a
cluster of its own. Without one the tests skip, and under CI they fail, as the browser tests
do: CI must run them."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

if TYPE_CHECKING:
    from collections.abc import Iterator

SCRIPT = Path(__file__).resolve().parents[1] / ".ci" / "postgres"


@dataclass(frozen=True)
class Postgres:
    """One database, and, on a cluster of the test's own, the means to restart it."""

    url: str
    data: Path | None = None

    def stop(self) -> None:
        assert self.data is not None, "only a private cluster is stopped"
        subprocess.run([str(SCRIPT), "stop", str(self.data)], check=True)

    def start(self) -> None:
        assert self.data is not None, "only a private cluster is started"
        port = str(urlsplit(self.url).port)
        subprocess.run(
            [str(SCRIPT), "start", str(self.data), port], check=True, stdout=subprocess.DEVNULL
        )


def admin_url_or_skip() -> str:
    url = os.environ.get("RAGRANK_TEST_POSTGRES_URL", "")
    if not url:
        reason = "no PostgreSQL: .ci/postgres start DIR sets RAGRANK_TEST_POSTGRES_URL"
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the job-queue tests on PostgreSQL: {reason}")
        pytest.skip(reason)
    return url


@pytest.fixture
def postgres() -> Iterator[Postgres]:
    """A fresh database, dropped afterwards."""
    admin = admin_url_or_skip()
    name = f"ragrank_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin, autocommit=True) as db:
        db.execute(f'CREATE DATABASE "{name}"')
    yield Postgres(urlunsplit(urlsplit(admin)._replace(path=f"/{name}")))
    with psycopg.connect(admin, autocommit=True, connect_timeout=10) as db:
        db.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def private_postgres() -> Iterator[Postgres]:
    """A cluster of the test's own (same binaries, a free port), for a test that stops and
    starts it while the other tests use the shared one."""
    from eval.bench.harness import free_port

    admin_url_or_skip()  # the shared cluster's presence says the binaries are here
    data = Path(tempfile.mkdtemp(prefix="ragrank-pg-"))  # under /tmp: the postgres user reaches it
    port = free_port()
    subprocess.run([str(SCRIPT), "start", str(data), str(port)], check=True, capture_output=True)
    try:
        yield Postgres(f"postgresql://postgres@127.0.0.1:{port}/postgres", data)
    finally:
        subprocess.run([str(SCRIPT), "stop", str(data)], check=False, capture_output=True)
        shutil.rmtree(data, ignore_errors=True)
