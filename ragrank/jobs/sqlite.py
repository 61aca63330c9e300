"""The job queue in one SQLite file, shared by the API (which enqueues) and its one worker
(which runs jobs). SQLite gives atomic claims across processes on one machine or volume, survives
a restart of either side, and needs no other service; its locks are unsafe on network file
systems, so the queue never leaves one machine (PostgreSQL's does)."""

from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import replace
from typing import IO, TYPE_CHECKING, Any

from ragrank.errors import JobQueueError
from ragrank.jobs.queue import JOB_STATES, Job, JobKind, ended_state, upsert_payload
from ragrank.locks import lock_file
from ragrank.settings import env_name

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence
    from pathlib import Path

    from ragrank.documents import Document

log = logging.getLogger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    payload TEXT NOT NULL,
    state TEXT NOT NULL,
    counts TEXT NOT NULL DEFAULT '{}',
    errors TEXT NOT NULL DEFAULT '[]',
    created REAL NOT NULL,
    updated REAL NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0
);
DROP INDEX IF EXISTS jobs_queued;
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs (state);
"""


class SqliteJobQueue:
    """Jobs in SQLite. Safe to share between threads and processes; one worker at a time."""

    #: One worker, in order: a claim never expires (a restarted worker requeues what it held).
    lease_s: float | None = None

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.Lock()
        self._worker_lock: IO[str] | None = None
        with self._connect() as db:
            db.executescript(_SCHEMA)
            columns = {row["name"] for row in db.execute("PRAGMA table_info(jobs)")}
            if "attempts" not in columns:  # a queue written before attempts were counted
                db.execute("ALTER TABLE jobs ADD COLUMN attempts INTEGER NOT NULL DEFAULT 0")

    def describe(self) -> str:
        return str(self.path)

    def add_upsert(self, documents: Sequence[Document]) -> str:
        return self._add("upsert", upsert_payload(documents))

    def add_delete(self, doc_id: str) -> str:
        return self._add("delete", {"doc_id": doc_id})

    def get(self, job_id: str) -> Job | None:
        with self._connect() as db:
            row = db.execute("SELECT * FROM jobs WHERE id = ?", (job_id,)).fetchone()
        return None if row is None else _job(row)

    def claim(self) -> Job | None:
        """The first queued job, now marked running; None when there is none. Jobs run in the
        order they were written (SQLite's rowid), not by their clocks: two API threads or
        replicas may stamp `created` in one order and commit in the other."""
        with self._connect() as db:
            db.execute("BEGIN IMMEDIATE")
            row = db.execute(
                "SELECT * FROM jobs WHERE state = 'queued' ORDER BY rowid LIMIT 1"
            ).fetchone()
            if row is None:
                return None
            db.execute(
                "UPDATE jobs SET state = 'running', updated = ?, attempts = attempts + 1 "
                "WHERE id = ?",
                (time.time(), row["id"]),
            )
        job = _job(row)
        return replace(job, state="running", attempts=job.attempts + 1)

    def renew(self, job_id: str) -> bool:
        del job_id  # claims never expire
        return True

    def finish(
        self, job_id: str, counts: Mapping[str, int], errors: Sequence[Mapping[str, str]]
    ) -> bool:
        """Done, or failed when nothing of it succeeded."""
        with self._connect() as db:
            db.execute(
                "UPDATE jobs SET state = ?, counts = ?, errors = ?, updated = ? WHERE id = ?",
                (
                    ended_state(counts, errors),
                    json.dumps(dict(counts)),
                    json.dumps(list(errors)),
                    time.time(),
                    job_id,
                ),
            )
        return True

    def jobs(self) -> Iterator[Job]:
        """Every job, in the order the worker takes them."""
        with self._connect() as db:
            rows = db.execute("SELECT * FROM jobs ORDER BY rowid").fetchall()
        return map(_job, rows)

    def states(self) -> dict[str, int]:
        """How many jobs are in each state."""
        with self._connect() as db:
            rows = db.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state").fetchall()
        found = {row[0]: row[1] for row in rows}
        return {state: found.get(state, 0) for state in JOB_STATES}

    def retry_later(self, job_id: str, delay_s: float) -> None:
        """Back to the queue, still first: the one worker pauses itself for `delay_s`."""
        del delay_s
        with self._connect() as db:
            db.execute(
                "UPDATE jobs SET state = 'queued', updated = ? WHERE id = ? AND state = 'running'",
                (time.time(), job_id),
            )

    @contextmanager
    def as_worker(self, *, embedded_store: bool) -> Iterator[int]:
        """Hold the queue's worker lock (a file beside it) for the block, then put back the
        jobs a dead worker left running: with one worker, whatever runs is its own."""
        del embedded_store  # one worker either way
        if self._worker_lock is not None:  # already this object's worker
            yield 0
            return
        handle = lock_file(self.path.with_name(self.path.name + ".worker"))
        if handle is None:
            raise JobQueueError(
                f"Another worker runs the job queue {self.path}. A SQLite queue allows one "
                f"worker: for several, put the queue on PostgreSQL ({env_name('jobs_url')}) "
                f"and Qdrant on a server ({env_name('qdrant_url')})."
            )
        self._worker_lock = handle
        try:
            yield self._requeue_running()
        finally:
            self._worker_lock = None
            handle.close()

    def owns_folder(self, origin: str) -> bool:
        del origin  # the queue's one worker syncs every folder it watches
        return True

    def wait_for_work(self, timeout_s: float, stop: threading.Event) -> None:
        stop.wait(timeout_s)

    def close(self) -> None:
        """Nothing stays open between calls."""

    def _requeue_running(self) -> int:
        """Put back jobs a dead worker left running (each job is an idempotent sync). Logged
        here, whichever door started the worker."""
        with self._connect() as db:
            requeued = db.execute(
                "UPDATE jobs SET state = 'queued', updated = ? WHERE state = 'running'",
                (time.time(),),
            ).rowcount
        if requeued:
            log.info("worker: %d interrupted job(s) queued again", requeued)
        return requeued

    def _add(self, kind: JobKind, payload: Mapping[str, Any]) -> str:
        job_id = uuid.uuid4().hex
        now = time.time()
        with self._connect() as db:
            db.execute(
                "INSERT INTO jobs (id, kind, payload, state, created, updated) "
                "VALUES (?, ?, ?, 'queued', ?, ?)",
                (job_id, kind, json.dumps(payload, ensure_ascii=False), now, now),
            )
        return job_id

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        with self._lock:
            db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
            db.row_factory = sqlite3.Row
            try:
                db.execute("PRAGMA journal_mode=WAL")
                yield db
                if db.in_transaction:
                    db.execute("COMMIT")
            except BaseException:
                if db.in_transaction:
                    db.execute("ROLLBACK")
                raise
            finally:
                db.close()


def _job(row: sqlite3.Row) -> Job:
    return Job(
        id=row["id"],
        kind=row["kind"],
        state=row["state"],
        payload=json.loads(row["payload"]),
        counts=json.loads(row["counts"]),
        errors=json.loads(row["errors"]),
        created=row["created"],
        updated=row["updated"],
        attempts=row["attempts"],
    )
