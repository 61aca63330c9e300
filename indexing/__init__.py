"""The indexing worker: document sources, chunking, embedding into Qdrant, and the worker that
runs the job queue's writes (the queue itself is the core's, `ragrank.jobs`). This module is
the package's public API for the other front doors."""

from indexing.chunking import Chunker
from indexing.pipeline import Indexer, IndexSummary
from indexing.sources import read_documents
from indexing.worker import API_ORIGIN, Worker, worker_thread

__all__ = [
    "API_ORIGIN",
    "Chunker",
    "IndexSummary",
    "Indexer",
    "Worker",
    "read_documents",
    "worker_thread",
]
