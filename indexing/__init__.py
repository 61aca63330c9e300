"""The indexing worker: document sources, chunking, and embedding into Qdrant."""

from indexing.chunking import Chunker
from indexing.pipeline import Indexer, IndexSummary
from indexing.sources import read_documents

__all__ = ["Chunker", "IndexSummary", "Indexer", "read_documents"]
