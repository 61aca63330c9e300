"""A durable job queue in one SQLite file, shared by the API (which enqueues) and the worker
(which runs jobs). SQLite gives atomic claims across processes on one machine or volume, survives
a restart of either side, and needs no other service."""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, get_args

from ragrank.documents import Document

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence
    from pathlib import Path

JobKind = Literal["upsert", "delete"]
JobState = Literal["queued", "running", "done", "failed"]
JOB_STATES: tuple[JobState, ...] = get_args(JobState)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    payload TEXT NOT NULL,
    state TEXT NOT NULL,
    counts TEXT NOT NULL DEFAULT '{}',
    errors TEXT NOT NULL DEFAULT '[]',
    created REAL NOT NULL,
    updated REAL NOT NULL
);
DROP INDEX IF EXISTS jobs_queued;
CREATE INDEX IF NOT EXISTS jobs_by_state ON jobs (state);
"""


@dataclass(frozen=True)
class Job:
    id: str
    kind: JobKind
    state: JobState
    payload: Mapping[str, Any]
    counts: Mapping[str, int] = field(default_factory=dict)
    #: One entry per failed document: {"doc_id": ..., "error": ...}.
    errors: Sequence[Mapping[str, str]] = ()
    created: float = 0.0
    updated: float = 0.0

    def documents(self) -> list[Document]:
        return [
            Document(doc_id=d["doc_id"], text=d["text"], title=d["title"], metadata=d["metadata"])
            for d in self.payload.get("documents", [])
        ]


class JobStore:
    """Jobs in SQLite. Safe to share between threads and processes."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.Lock()
        with self._connect() as db:
            db.executescript(_SCHEMA)

    def add_upsert(self, documents: Sequence[Document]) -> str:
        records = [
            {"doc_id": d.doc_id, "text": d.text, "title": d.title, "metadata": dict(d.metadata)}
            for d in documents
        ]
        return self._add("upsert", {"documents": records})

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
                "UPDATE jobs SET state = 'running', updated = ? WHERE id = ?",
                (time.time(), row["id"]),
            )
        return replace(_job(row), state="running")

    def finish(
        self, job_id: str, counts: Mapping[str, int], errors: Sequence[Mapping[str, str]]
    ) -> None:
        """Done, or failed when nothing of it succeeded."""
        failed = bool(errors) and not any(v for k, v in counts.items() if k != "failed")
        with self._connect() as db:
            db.execute(
                "UPDATE jobs SET state = ?, counts = ?, errors = ?, updated = ? WHERE id = ?",
                (
                    "failed" if failed else "done",
                    json.dumps(dict(counts)),
                    json.dumps(list(errors)),
                    time.time(),
                    job_id,
                ),
            )

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

    def release(self, job_id: str) -> None:
        """Put a running job back in the queue, untouched, to be run again later."""
        with self._connect() as db:
            db.execute(
                "UPDATE jobs SET state = 'queued', updated = ? WHERE id = ? AND state = 'running'",
                (time.time(), job_id),
            )

    def requeue_running(self) -> int:
        """Put back jobs a dead worker left running (each job is an idempotent sync)."""
        with self._connect() as db:
            cursor = db.execute(
                "UPDATE jobs SET state = 'queued', updated = ? WHERE state = 'running'",
                (time.time(),),
            )
            return cursor.rowcount

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
    )
