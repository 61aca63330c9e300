"""The indexing worker: document sources, chunking, embedding into Qdrant, the job queue and
the worker that runs it. This module is the package's public API for the other front doors."""

from indexing.chunking import Chunker
from indexing.jobs import JOB_STATES, Job, JobQueue, open_job_queue
from indexing.jobs.postgres import PostgresJobQueue
from indexing.jobs.sqlite import SqliteJobQueue
from indexing.pipeline import Indexer, IndexSummary
from indexing.sources import read_documents
from indexing.worker import API_ORIGIN, Worker, worker_thread

__all__ = [
    "API_ORIGIN",
    "JOB_STATES",
    "Chunker",
    "IndexSummary",
    "Indexer",
    "Job",
    "JobQueue",
    "PostgresJobQueue",
    "SqliteJobQueue",
    "Worker",
    "open_job_queue",
    "read_documents",
    "worker_thread",
]
