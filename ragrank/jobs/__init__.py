"""The durable job queue between the API (which enqueues document writes) and the indexing
workers (which run them), behind one interface with two engines:

- `sqlite`: one file, the embedded default. API and worker on one machine, one worker.
- `postgres`: a shared queue on PostgreSQL (`RAGRANK_JOBS_URL`) for any number of API replicas
  and workers on any hosts, with leases, so a job whose worker died runs again.

Both run the jobs touching one document in the order they were accepted."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from ragrank.jobs.queue import (
    JOB_STATES,
    Job,
    JobKind,
    JobQueue,
    JobState,
    ended_state,
    upsert_payload,
)

if TYPE_CHECKING:
    from collections.abc import Mapping

    from ragrank.settings import Settings

__all__ = [
    "JOB_STATES",
    "Job",
    "JobKind",
    "JobQueue",
    "JobState",
    "LazyJobQueue",
    "ended_state",
    "open_job_queue",
    "upsert_payload",
]


def open_job_queue(settings: Settings) -> JobQueue:
    """The queue the settings name: PostgreSQL at `jobs_url`, else SQLite at `jobs_path`."""
    if settings.jobs_url:
        from ragrank.jobs.postgres import PostgresJobQueue

        return PostgresJobQueue(
            settings.jobs_url, lease_s=settings.jobs_lease_s, max_lost=settings.jobs_max_lost
        )
    from ragrank.jobs.sqlite import SqliteJobQueue

    return SqliteJobQueue(settings.jobs_path)


class LazyJobQueue:
    """The settings' job queue, opened on first use: a server that never takes a write makes no
    SQLite file, and a metrics scrape opens none."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._queue: JobQueue | None = None
        self._lock = threading.Lock()

    def get(self) -> JobQueue:
        with self._lock:
            if self._queue is None:
                self._queue = open_job_queue(self._settings)
            return self._queue

    def states(self) -> Mapping[str, int]:
        """Jobs by state; none for a SQLite queue that no write has made yet."""
        settings = self._settings
        exists = settings.jobs_url is not None or settings.jobs_path.exists()
        return self.get().states() if self._queue is not None or exists else {}

    def close(self) -> None:
        with self._lock:
            if self._queue is not None:
                self._queue.close()
                self._queue = None
