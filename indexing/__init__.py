"""The indexing worker: document sources, chunking, embedding into Qdrant, the job queue and
the worker that runs it. This module is the package's public API for the other front doors."""

from indexing.chunking import Chunker
from indexing.jobs import JOB_STATES, Job, JobStore
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
    "JobStore",
    "Worker",
    "read_documents",
    "worker_thread",
]
