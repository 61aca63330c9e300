"""The durable job queue between the API (which enqueues document writes) and the indexing
workers (which run them), behind one interface with two engines:

- `sqlite`: one file, the embedded default. API and worker on one machine, one worker.
- `postgres`: a shared queue on PostgreSQL (`RAGRANK_JOBS_URL`) for any number of API replicas
  and workers on any hosts, with leases, so a job whose worker died runs again.

Both run the jobs touching one document in the order they were accepted."""

from __future__ import annotations

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
    from ragrank.settings import Settings

__all__ = [
    "JOB_STATES",
    "Job",
    "JobKind",
    "JobQueue",
    "JobState",
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
