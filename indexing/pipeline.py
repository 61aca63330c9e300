"""Documents → chunks → passage embeddings → Qdrant points, in batches, with a progress bar."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sized
from dataclasses import dataclass

from tqdm import tqdm

from indexing.chunking import Chunker
from ragrank.documents import Chunk, Document
from ragrank.models import Embedder
from ragrank.settings import Settings
from ragrank.store import QdrantStore


@dataclass(frozen=True)
class IndexSummary:
    documents: int
    chunks: int
    seconds: float

    def __str__(self) -> str:
        rate = self.chunks / self.seconds if self.seconds > 0 else 0.0
        return (
            f"indexed {self.documents} documents as {self.chunks} chunks "
            f"in {self.seconds:.1f} s ({rate:.1f} chunks/s)"
        )


class Indexer:
    """Embeds and upserts documents. Point ids come from (doc_id, chunk index), so indexing a
    document again overwrites its points instead of duplicating them."""

    def __init__(
        self, embedder: Embedder, store: QdrantStore, *, chunker: Chunker, batch_size: int = 64
    ) -> None:
        self._embedder = embedder
        self._store = store
        self._chunker = chunker
        self._batch_size = batch_size
        store.ensure_collection(embedder.dimension)

    @classmethod
    def from_settings(cls, settings: Settings, embedder: Embedder, store: QdrantStore) -> Indexer:
        prefix_tokens = len(embedder.token_spans(embedder.passage_prefix))
        # The prefix counts against the budget; the two special tokens against the model's limit.
        budget = max(min(settings.chunk_tokens, embedder.max_length - 2) - prefix_tokens, 1)
        chunker = Chunker(
            embedder.token_spans,
            max_tokens=budget,
            overlap=min(settings.chunk_overlap, budget - 1),
        )
        return cls(embedder, store, chunker=chunker, batch_size=settings.index_batch_size)

    def index(self, documents: Iterable[Document], *, progress: bool = True) -> IndexSummary:
        started = time.perf_counter()
        pending: list[Chunk] = []
        document_count = chunk_count = 0
        total = len(documents) if isinstance(documents, Sized) else None
        with tqdm(total=total, desc="indexing", unit="doc", disable=not progress) as bar:
            for document in documents:
                pending.extend(self._chunker.chunk(document))
                document_count += 1
                bar.update()
                while len(pending) >= self._batch_size:
                    batch, pending = pending[: self._batch_size], pending[self._batch_size :]
                    chunk_count += self._write(batch)
                    bar.set_postfix(chunks=chunk_count)
            chunk_count += self._write(pending)
            bar.set_postfix(chunks=chunk_count)
        return IndexSummary(document_count, chunk_count, time.perf_counter() - started)

    def _write(self, chunks: list[Chunk]) -> int:
        if not chunks:
            return 0
        vectors = self._embedder.embed_passages([c.passage for c in chunks])
        self._store.upsert(chunks, vectors)
        return len(chunks)
