"""Documents → chunks → passage embeddings → Qdrant points: an idempotent, crash-safe sync.

Every chunk point carries its document's stamp: a content hash (of the text, title, metadata
and everything that shapes the dense vectors: model, backend, prefix, chunk size), the
document's chunk count, and what made its BM25 sparse vectors. A document is skipped,
without chunking or embedding, when the collection holds exactly its chunks 0..n-1, all with
the current stamp. Anything else, including what a run killed half-way left behind, fails
that check, so the next run rewrites the document: its points are upserted (ids from doc_id
and chunk number, so overwritten in place) and then the points past its new end are deleted.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable, Iterator, Sized
from dataclasses import dataclass, field, replace
from itertools import islice
from typing import TYPE_CHECKING

from tqdm import tqdm

from indexing.chunking import Chunker
from ragrank.sparse import SparseEncoder, sparse_encoder
from ragrank.store import DocumentStamp, Store, sparse_stamp

if TYPE_CHECKING:
    from ragrank.documents import Chunk, Document
    from ragrank.protocols import TextEmbedder
    from ragrank.settings import Settings

#: Metadata that changes without the document changing (a file's mtime): not hashed.
VOLATILE_METADATA = frozenset({"modified"})
#: Documents looked up in the collection per round trip.
LOOKUP_BATCH = 64


@dataclass
class IndexSummary:
    new: int = 0
    updated: int = 0
    unchanged: int = 0
    deleted: int = 0
    chunks: int = 0
    seconds: float = 0.0
    deleted_ids: list[str] = field(default_factory=list, repr=False)

    @property
    def documents(self) -> int:
        """Documents read from the source."""
        return self.new + self.updated + self.unchanged

    def __str__(self) -> str:
        rate = self.chunks / self.seconds if self.seconds > 0 else 0.0
        return (
            f"{self.documents} documents: {self.new} new, {self.updated} updated, "
            f"{self.unchanged} unchanged, {self.deleted} deleted; {self.chunks} chunks embedded "
            f"in {self.seconds:.1f} s ({rate:.1f} chunks/s)"
        )


@dataclass(frozen=True)
class _Pending:
    document: Document
    chunks: list[Chunk]
    stamp: DocumentStamp


class Indexer:
    """Syncs documents into the collection; see the module docstring."""

    def __init__(
        self,
        embedder: TextEmbedder,
        store: Store,
        *,
        chunker: Chunker,
        batch_size: int = 64,
        metadata_indexes: tuple[str, ...] = (),
        sparse: SparseEncoder | None = None,
    ) -> None:
        self._embedder = embedder
        self.store = store
        self.chunker = chunker
        self._batch_size = batch_size
        if store.sparse and sparse is None:
            raise ValueError("the collection keeps BM25 vectors: the indexer needs their encoder")
        self._sparse = sparse
        self._sparse_stamp = sparse_stamp(sparse)
        store.ensure_collection(embedder.dimension)
        if sparse is not None and sparse.detects:
            metadata_indexes = tuple(dict.fromkeys((*metadata_indexes, "lang")))
        store.ensure_payload_indexes(metadata_indexes)
        # Whatever shapes the vectors: a change re-embeds every document. The backend is
        # named only when it is not the float one, so that older stamps stay valid.
        recipe: list[object] = [
            embedder.model_id,
            embedder.passage_prefix,
            chunker.max_tokens,
            chunker.overlap,
        ]
        if embedder.backend != "torch":
            recipe.append(embedder.backend)
        self._recipe = json.dumps(recipe)

    @classmethod
    def from_settings(cls, settings: Settings, embedder: TextEmbedder, store: Store) -> Indexer:
        prefix_tokens = len(embedder.token_spans(embedder.passage_prefix))
        # The prefix counts against the budget; the two special tokens against the model's limit.
        budget = max(min(settings.chunk_tokens, embedder.max_length - 2) - prefix_tokens, 1)
        chunker = Chunker(
            embedder.token_spans,
            max_tokens=budget,
            overlap=min(settings.chunk_overlap, budget - 1),
        )
        return cls(
            embedder,
            store,
            chunker=chunker,
            batch_size=settings.index_batch_size,
            metadata_indexes=settings.metadata_index_keys,
            sparse=sparse_encoder(settings),
        )

    def content_hash(self, document: Document) -> str:
        metadata = {k: v for k, v in document.metadata.items() if k not in VOLATILE_METADATA}
        content = json.dumps(
            [self._recipe, document.title, document.text, metadata],
            sort_keys=True,
            ensure_ascii=False,
            default=str,
        )
        return hashlib.sha256(content.encode()).hexdigest()

    def index(
        self,
        documents: Iterable[Document],
        *,
        origin: str = "",
        delete_missing: bool = False,
        progress: bool = True,
    ) -> IndexSummary:
        """Sync `documents` into the collection. With `delete_missing`, documents indexed
        earlier from the same `origin` that are not among `documents` are deleted."""
        if delete_missing and not origin:
            raise ValueError("delete_missing needs the origin the documents come from")
        started = time.perf_counter()
        summary = IndexSummary()
        seen: set[str] = set()
        pending: list[_Pending] = []
        total = len(documents) if isinstance(documents, Sized) else None
        with tqdm(total=total, desc="indexing", unit="doc", disable=not progress) as bar:
            for group in _batched(iter(documents), LOOKUP_BATCH):
                stored = self.store.stored_documents([d.doc_id for d in group])
                for document in group:
                    seen.add(document.doc_id)
                    content_hash = self.content_hash(document)
                    held = stored.get(document.doc_id)
                    if held is not None and held.holds_version(
                        content_hash, origin, self._sparse_stamp
                    ):
                        summary.unchanged += 1
                        continue
                    chunks = self.chunker.chunk(document)
                    stamp = DocumentStamp(content_hash, len(chunks), origin, self._sparse_stamp)
                    pending.append(_Pending(document, chunks, stamp))
                    if held is None:
                        summary.new += 1
                    else:
                        summary.updated += 1
                    if sum(len(p.chunks) for p in pending) >= self._batch_size:
                        summary.chunks += self._write(pending)
                        pending = []
                bar.update(len(group))
                elapsed = time.perf_counter() - started
                bar.set_postfix(
                    chunks=summary.chunks, chunks_per_s=f"{summary.chunks / elapsed:.1f}"
                )
            summary.chunks += self._write(pending)
        if delete_missing:
            missing = sorted(self.store.documents_from(origin) - seen)
            self.store.delete_documents(missing)
            summary.deleted, summary.deleted_ids = len(missing), missing
        summary.seconds = time.perf_counter() - started
        return summary

    def _write(self, pending: list[_Pending]) -> int:
        """Embed (length-sorted batches) and compute BM25 vectors, upsert, then cut each
        document's stale tail."""
        chunks = [chunk for item in pending for chunk in item.chunks]
        if chunks:
            passages = [c.passage for c in chunks]
            vectors = self._embedder.embed_passages(passages)
            lexical = None
            if self._sparse is not None:
                languages = [self._sparse.language_of(c.passage, c.metadata) for c in chunks]
                lexical = self._sparse.documents(passages, languages)
                if self._sparse.detects:
                    chunks = [
                        with_language(c, lang) for c, lang in zip(chunks, languages, strict=True)
                    ]
            stamps = {item.document.doc_id: item.stamp for item in pending}
            self.store.upsert(chunks, vectors, stamps, lexical)
        self.store.delete_tails({item.document.doc_id: item.stamp.chunks for item in pending})
        return len(chunks)


def with_language(chunk: Chunk, language: str | None) -> Chunk:
    """`chunk` with the language its BM25 vector was analysed in as its `lang` metadata, so
    that filters can use it; a document that names its language keeps its own field."""
    if language is None or "lang" in chunk.metadata or "language" in chunk.metadata:
        return chunk
    return replace(chunk, metadata={**chunk.metadata, "lang": language})


def _batched(items: Iterator[Document], size: int) -> Iterator[list[Document]]:
    while group := list(islice(items, size)):
        yield group
