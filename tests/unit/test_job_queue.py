"""The durable job queue's order and its counts."""

from __future__ import annotations

import time

from ragrank.documents import Document
from ragrank.jobs.sqlite import SqliteJobQueue


def test_jobs_run_in_the_order_they_were_written_whatever_their_clocks(tmp_path, monkeypatch):
    """Two API threads may stamp their jobs in one order and commit them in the other: the
    worker follows the commits, as a replay of the queue does."""
    jobs = SqliteJobQueue(tmp_path / "jobs.sqlite3")
    clock = iter([200.0, 200.0, 100.0, 100.0, 300.0, 300.0])
    monkeypatch.setattr(time, "time", lambda: next(clock))
    first = jobs.add_upsert([Document(doc_id="a", text="x")])
    second = jobs.add_delete("a")  # stamped earlier, written later
    monkeypatch.undo()
    assert [job.id for job in jobs.jobs()] == [first, second]
    claimed = jobs.claim()
    assert claimed is not None and claimed.id == first
    assert jobs.states() == {"queued": 1, "running": 1, "done": 0, "failed": 0}


def test_a_postgres_url_is_logged_without_its_password():
    from ragrank.jobs.postgres import redacted

    assert redacted("postgresql://app:s3cret@db:5432/q") == "postgresql://app:***@db:5432/q"
    assert redacted("postgresql://app@db/q") == "postgresql://app@db/q"


def test_the_jobs_url_must_be_postgresql_and_an_empty_one_means_sqlite():
    import pytest

    from ragrank.errors import SettingsError
    from ragrank.settings import Settings

    with pytest.raises(SettingsError, match="RAGRANK_JOBS_URL must be a PostgreSQL URL"):
        Settings(jobs_url="mysql://db/q")
    assert Settings(jobs_url="").jobs_url is None
