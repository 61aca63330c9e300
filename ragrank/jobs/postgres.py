"""The job queue on PostgreSQL, shared by any number of API replicas and workers on any hosts.

- A claim is one `UPDATE … FOR UPDATE SKIP LOCKED`: concurrent workers never take one job.
- A claim is a lease on the database's clock (no two hosts' clocks are compared). The worker
  renews it while it works; a job whose worker died is taken over once its lease expires.
- A job waits while an earlier unfinished job shares a document with it, so the writes to one
  document land in the order the API accepted them, whichever workers run them.
- Workers wait on `LISTEN`, so a new job starts at once, not at the next poll.
- The schema is versioned in `ragrank_schema` and migrated on first use, under a lock that
  makes concurrent start-ups wait for one another."""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import uuid
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool, PoolTimeout

from ragrank.errors import JobQueueError, JobQueueUnavailableError
from ragrank.jobs.queue import JOB_STATES, Job, JobKind, ended_state, upsert_payload
from ragrank.settings import env_name

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence
    from threading import Event

    from ragrank.documents import Document

log = logging.getLogger(__name__)

#: The first key of every advisory lock ragrank takes ("rr"), the second says which.
_LOCKS = 0x7272
_SCHEMA_LOCK, _WORKERS_LOCK = 0, 1
#: Watched folders are locked under their own first key, by a hash of their origin.
_FOLDER_LOCKS = 0x7273
_CHANNEL = "ragrank_jobs"

#: Version N is the N-th entry; a version is never edited once released, only added to.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE ragrank_jobs (
        seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        id text NOT NULL UNIQUE,
        kind text NOT NULL,
        payload text NOT NULL,
        doc_ids text[] NOT NULL,
        state text NOT NULL,
        counts jsonb NOT NULL DEFAULT '{}',
        errors jsonb NOT NULL DEFAULT '[]',
        attempts integer NOT NULL DEFAULT 0,
        lost integer NOT NULL DEFAULT 0,
        worker text,
        lease_until timestamptz,
        not_before timestamptz NOT NULL DEFAULT now(),
        created timestamptz NOT NULL DEFAULT now(),
        updated timestamptz NOT NULL DEFAULT now()
    );
    CREATE INDEX ragrank_jobs_open ON ragrank_jobs (seq) WHERE state IN ('queued', 'running');
    CREATE INDEX ragrank_jobs_open_docs ON ragrank_jobs USING gin (doc_ids)
        WHERE state IN ('queued', 'running');
    CREATE INDEX ragrank_jobs_by_state ON ragrank_jobs (state);
    """,
)

_COLUMNS = (
    "id, kind, payload, state, counts, errors, attempts, "
    "extract(epoch FROM created)::float8 AS created, "
    "extract(epoch FROM updated)::float8 AS updated"
)

# A job may run when it is queued (and its retry time has come) or its worker's lease ran out,
# and no earlier unfinished job shares a document with it.
_CLAIM = f"""
WITH next AS (
    SELECT j.seq FROM ragrank_jobs j
    WHERE j.state IN ('queued', 'running')
      AND (j.state = 'queued' OR j.lease_until < now())
      AND j.not_before <= now()
      AND NOT EXISTS (
          SELECT 1 FROM ragrank_jobs e
          WHERE e.state IN ('queued', 'running') AND e.seq < j.seq AND e.doc_ids && j.doc_ids
      )
    ORDER BY j.seq
    LIMIT 1
    FOR UPDATE OF j SKIP LOCKED
)
UPDATE ragrank_jobs AS j
SET state = 'running', worker = %(worker)s, lease_until = now() + %(lease)s * interval '1 s',
    attempts = j.attempts + 1, lost = j.lost + (j.state = 'running')::int, updated = now()
FROM next WHERE j.seq = next.seq
RETURNING {_COLUMNS}
"""

# A job that has lost its worker `max_lost` times is not tried again: it ends failed, saying so.
_FAIL_LOST = """
UPDATE ragrank_jobs
SET state = 'failed', worker = NULL, lease_until = NULL, updated = now(),
    errors = jsonb_build_array(jsonb_build_object('doc_id', '', 'error', format(
        'its worker stopped while running it %%s times (killed, out of memory, or cut off from '
        'the queue for longer than the %%s s lease); not tried again', lost + 1, %(lease)s)))
WHERE state = 'running' AND lease_until < now() AND lost >= %(max_lost)s
"""


class PostgresJobQueue:
    """Jobs in PostgreSQL. Safe to share between threads; each process opens its own."""

    def __init__(self, url: str, *, lease_s: float = 30.0, max_lost: int = 3) -> None:
        self.url = url
        self.lease_s: float | None = lease_s
        self.max_lost = max_lost
        self.worker_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._migrated = False
        self._pool: ConnectionPool[Any] = ConnectionPool(
            url,
            min_size=1,
            max_size=4,
            open=False,
            timeout=3.0,
            check=ConnectionPool.check_connection,
            kwargs={"connect_timeout": 3, "application_name": "ragrank", "row_factory": dict_row},
        )
        self._pool.open(wait=False)
        # The worker's own connection: it holds the advisory locks (worker, watched folders)
        # and listens for new jobs. Opened by `as_worker`.
        self._session: psycopg.Connection[Any] | None = None
        self._worker_embedded: bool | None = None
        self._folders: set[str] = set()

    def describe(self) -> str:
        return redacted(self.url)

    # --- the API's side -------------------------------------------------------------------

    def add_upsert(self, documents: Sequence[Document]) -> str:
        return self._add("upsert", upsert_payload(documents), [d.doc_id for d in documents])

    def add_delete(self, doc_id: str) -> str:
        return self._add("delete", {"doc_id": doc_id}, [doc_id])

    def get(self, job_id: str) -> Job | None:
        with self._db() as db:
            row = db.execute(
                f"SELECT {_COLUMNS} FROM ragrank_jobs WHERE id = %s", (job_id,)
            ).fetchone()
        return None if row is None else _job(row)

    def jobs(self) -> Iterator[Job]:
        with self._db() as db:
            rows = db.execute(f"SELECT {_COLUMNS} FROM ragrank_jobs ORDER BY seq").fetchall()
        return map(_job, rows)

    def states(self) -> dict[str, int]:
        with self._db() as db:
            rows = db.execute("SELECT state, count(*) FROM ragrank_jobs GROUP BY state").fetchall()
        found = {row["state"]: row["count"] for row in rows}
        return {state: found.get(state, 0) for state in JOB_STATES}

    # --- the worker's side ----------------------------------------------------------------

    def claim(self) -> Job | None:
        params = {"worker": self.worker_id, "lease": self.lease_s, "max_lost": self.max_lost}
        with self._db() as db:
            failed = db.execute(_FAIL_LOST, params).rowcount
            if failed:
                log.error("jobs: %d job(s) lost their worker too often and failed", failed)
            row = db.execute(_CLAIM, params).fetchone()
        return None if row is None else _job(row)

    def renew(self, job_id: str) -> bool:
        with self._db() as db:
            renewed = db.execute(
                "UPDATE ragrank_jobs SET lease_until = now() + %s * interval '1 s' "
                "WHERE id = %s AND worker = %s AND state = 'running'",
                (self.lease_s, job_id, self.worker_id),
            ).rowcount
        return renewed == 1

    def finish(
        self, job_id: str, counts: Mapping[str, int], errors: Sequence[Mapping[str, str]]
    ) -> bool:
        with self._db() as db:
            finished = db.execute(
                "UPDATE ragrank_jobs SET state = %s, counts = %s, errors = %s, worker = NULL, "
                "lease_until = NULL, updated = now() "
                "WHERE id = %s AND worker = %s AND state = 'running'",
                (
                    ended_state(counts, errors),
                    json.dumps(dict(counts)),
                    json.dumps(list(errors)),
                    job_id,
                    self.worker_id,
                ),
            ).rowcount
        return finished == 1

    def retry_later(self, job_id: str, delay_s: float) -> None:
        with self._db() as db:
            db.execute(
                "UPDATE ragrank_jobs SET state = 'queued', worker = NULL, lease_until = NULL, "
                "not_before = now() + %s * interval '1 s', updated = now() "
                "WHERE id = %s AND worker = %s AND state = 'running'",
                (delay_s, job_id, self.worker_id),
            )

    @contextmanager
    def as_worker(self, *, embedded_store: bool) -> Iterator[int]:
        """Run as one of the queue's workers for the block. Workers on a Qdrant server share
        the queue; a worker on an embedded store must be its only one (jobs split between two
        folders would leave each with half the documents), so it is refused if any other
        worker runs, and any other is refused while it runs. Nothing is requeued: leases
        bring back the jobs of dead workers."""
        if self._worker_embedded is not None:  # already a worker: the same process's thread
            yield 0
            return
        self._worker_embedded = embedded_store
        try:
            self._open_session()
            yield 0
        finally:
            self._worker_embedded = None
            self._close_session()

    def owns_folder(self, origin: str) -> bool:
        if origin in self._folders:
            return True
        with self._session_db() as session:
            owned = session.execute(
                "SELECT pg_try_advisory_lock(%s, hashtext(%s)) AS taken", (_FOLDER_LOCKS, origin)
            ).fetchone()
        if owned and owned["taken"]:
            self._folders.add(origin)
            log.info("jobs: this worker syncs %s", origin)
            return True
        return False

    def wait_for_work(self, timeout_s: float, stop: Event) -> None:
        """Wake on the next NOTIFY of a new job; checks `stop` every quarter second."""
        deadline = time.monotonic() + timeout_s
        with self._session_db() as session:
            while not stop.is_set() and (left := deadline - time.monotonic()) > 0:
                for _ in session.notifies(timeout=min(left, 0.25), stop_after=1):
                    return

    def close(self) -> None:
        self._close_session()
        self._pool.close()

    # --- internals --------------------------------------------------------------------------

    def _add(self, kind: JobKind, payload: Mapping[str, Any], doc_ids: list[str]) -> str:
        job_id = uuid.uuid4().hex
        with self._db() as db:
            db.execute(
                "INSERT INTO ragrank_jobs (id, kind, payload, doc_ids, state) "
                "VALUES (%s, %s, %s, %s, 'queued')",
                (job_id, kind, json.dumps(payload, ensure_ascii=False), doc_ids),
            )
            db.execute("SELECT pg_notify(%s, '')", (_CHANNEL,))
        return job_id

    @contextmanager
    def _db(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection in a transaction, committed at the end; an unreachable
        database raises `JobQueueUnavailableError`."""
        try:
            with self._pool.connection() as db:
                if not self._migrated:
                    migrate(db, self.describe())
                    self._migrated = True
                yield db
        except (psycopg.OperationalError, psycopg.InterfaceError, PoolTimeout) as exc:
            raise self._unavailable(exc) from None

    @contextmanager
    def _session_db(self) -> Iterator[psycopg.Connection[Any]]:
        """The worker's session; reopened, with its locks taken again, after it was cut."""
        try:
            if self._session is None or self._session.closed or self._session.broken:
                self._open_session()
            assert self._session is not None
            yield self._session
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            self._close_session()
            raise self._unavailable(exc) from None

    def _open_session(self) -> None:
        self._close_session()
        try:
            session = psycopg.connect(
                self.url,
                autocommit=True,
                row_factory=dict_row,
                connect_timeout=3,
                application_name=f"ragrank worker {self.worker_id}",
            )
        except psycopg.OperationalError as exc:
            raise self._unavailable(exc) from None
        try:
            self._lock_workers(session)
            session.execute(f"LISTEN {_CHANNEL}")
            for origin in sorted(self._folders):  # a cut session lost them: take them again
                row = session.execute(
                    "SELECT pg_try_advisory_lock(%s, hashtext(%s)) AS taken",
                    (_FOLDER_LOCKS, origin),
                ).fetchone()
                if not (row and row["taken"]):  # another worker took the folder meanwhile
                    self._folders.discard(origin)
                    log.info("jobs: %s is synced by another worker now", origin)
        except BaseException:
            session.close()
            raise
        self._session = session

    def _lock_workers(self, session: psycopg.Connection[Any]) -> None:
        embedded = bool(self._worker_embedded)
        take = "pg_try_advisory_lock" if embedded else "pg_try_advisory_lock_shared"
        row = session.execute(f"SELECT {take}(%s, %s) AS taken", (_LOCKS, _WORKERS_LOCK)).fetchone()
        if row and row["taken"]:
            return
        others = session.execute(
            "SELECT a.application_name, l.mode FROM pg_locks l JOIN pg_stat_activity a "
            "ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.classid = %s AND l.objid = %s "
            "AND l.granted",
            (_LOCKS, _WORKERS_LOCK),
        ).fetchall()
        names = ", ".join(sorted(str(o["application_name"]) for o in others)) or "another worker"
        if embedded:
            reason = f"other workers already run its jobs ({names})"
        else:
            reason = f"a worker on an embedded Qdrant store runs its jobs ({names})"
        raise JobQueueError(
            f"This worker cannot join the job queue at {self.describe()}: {reason}. A worker "
            f"on an embedded Qdrant store must be the queue's only one, since each would hold "
            f"part of the documents: run Qdrant as a server, set {env_name('qdrant_url')} on "
            f"every worker, and start as many as you need."
        )

    def _close_session(self) -> None:
        session, self._session = self._session, None
        if session is not None and not session.closed:
            session.close()  # ends its locks and its LISTEN

    def _unavailable(self, exc: BaseException) -> JobQueueUnavailableError:
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return JobQueueUnavailableError(
            f"the job queue at {self.describe()} cannot be reached ({detail}); "
            f"retry shortly ({env_name('jobs_url')})"
        )


def redacted(url: str) -> str:
    """The URL without its password, for logs and messages."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


def migrate(db: psycopg.Connection[Any], where: str) -> None:
    """Bring the schema to the newest version this code knows, in one transaction that
    concurrent start-ups wait on; refuse a database migrated by a newer version."""
    with db.transaction():
        db.execute("SELECT pg_advisory_xact_lock(%s, %s)", (_LOCKS, _SCHEMA_LOCK))
        db.execute("CREATE TABLE IF NOT EXISTS ragrank_schema (version integer NOT NULL)")
        row = db.execute("SELECT coalesce(max(version), 0) AS version FROM ragrank_schema")
        found = row.fetchone()
        current = int(found["version"]) if found else 0
        if current > len(MIGRATIONS):
            raise JobQueueError(
                f"The job queue at {where} has schema version {current}, newer than this "
                f"ragrank's {len(MIGRATIONS)}: upgrade ragrank on this host."
            )
        for version in range(current + 1, len(MIGRATIONS) + 1):
            db.execute(MIGRATIONS[version - 1])
            db.execute("INSERT INTO ragrank_schema (version) VALUES (%s)", (version,))
            log.info("jobs: schema of %s migrated to version %d", where, version)


def _job(row: Mapping[str, Any]) -> Job:
    return Job(
        id=row["id"],
        kind=row["kind"],
        state=row["state"],
        payload=json.loads(row["payload"]),
        counts=row["counts"],
        errors=row["errors"],
        created=row["created"],
        updated=row["updated"],
        attempts=row["attempts"],
    )
