"""What every engine of the store shares: point ids, the payload layout, document stamps, an
engine-neutral filter, and the operations built from the engines' primitives."""

from __future__ import annotations

import hashlib
import json
import uuid
from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import dataclass, field, replace
from itertools import islice
from typing import TYPE_CHECKING, Any

from ragrank.documents import Candidate, Chunk, MetadataValue, passage_text
from ragrank.errors import SparseVectorsMissingError
from ragrank.settings import Settings, env_name
from ragrank.sparse import SPARSE_VECTOR, SparseEncoder, SparseVector
from ragrank.store.fusion import Fusion, fuse_by_language

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Iterator, Mapping, Sequence

    import numpy as np

#: Fixed namespace so that point ids are the same on every machine and in every run.
POINT_NAMESPACE = uuid.UUID("4f1f0c62-3c1b-5a57-9d0e-7a1d2c9b6e11")

#: Payload keys a search filter may name directly; any other key is looked up in `metadata`.
TOP_LEVEL_FILTER_KEYS = frozenset({"doc_id"})

#: Payload keys that always get a keyword index: the indexer filters on them on every run.
INDEXED_KEYS = ("doc_id", "origin")


@dataclass(frozen=True)
class DocumentStamp:
    """What every chunk point of a document records about the version it came from."""

    content_hash: str
    chunks: int
    #: The source it was indexed from (a folder or file path), for `--delete-missing`.
    origin: str = ""
    #: What made its sparse vectors (`sparse_stamp`), empty without them.
    sparse: str = ""


@dataclass
class StoredDocument:
    """The points a document has in the collection."""

    chunks: set[int] = field(default_factory=set)
    stamps: set[DocumentStamp] = field(default_factory=set)

    def holds_version(self, content_hash: str, origin: str, sparse: str = "") -> bool:
        """Exactly chunks 0..n-1, all stamped with this version: nothing missing, no stale
        point (whatever a crashed run may have left)."""
        if len(self.stamps) != 1:
            return False
        (stamp,) = self.stamps
        version = (stamp.content_hash, stamp.origin, stamp.sparse)
        return version == (content_hash, origin, sparse) and self.chunks == set(range(stamp.chunks))


@dataclass(frozen=True)
class StoredPoint:
    """A point as stored: what `ragrank store migrate` copies between engines."""

    id: str
    vector: list[float]
    payload: dict[str, Any]
    sparse: SparseVector | None = None

    @classmethod
    def read(cls, point_id: Any, vector: Any, payload: Any) -> StoredPoint:
        """A point as an engine returns it: its vectors one list, or a dict by name."""
        dense, sparse = stored_vectors(vector)
        return cls(str(point_id), dense, dict(payload or {}), sparse)


@dataclass(frozen=True)
class IndexTuning:
    """The vector index: HNSW graph degree and build width, the search width, and the size
    (KiB of vectors) from which a segment gets a graph (smaller ones are scanned exactly)."""

    m: int = 16
    ef_construct: int = 100
    ef: int = 128
    indexing_threshold_kb: int = 10_000
    #: Below this many KiB of candidate vectors a search scans them exactly.
    full_scan_threshold_kb: int = 10_000
    #: The share of a segment's points deleted (or overwritten) from which an optimize
    #: rebuilds it without them. BM25's IDF counts the points a segment still holds, so 0,
    #: rebuilding any segment with a deletion, keeps it exact.
    vacuum_deleted_ratio: float = 0.0

    @classmethod
    def from_settings(cls, settings: Settings) -> IndexTuning:
        return cls(
            m=settings.hnsw_m,
            ef_construct=settings.hnsw_ef_construct,
            ef=settings.hnsw_ef,
            indexing_threshold_kb=settings.hnsw_indexing_threshold_kb,
            full_scan_threshold_kb=settings.hnsw_indexing_threshold_kb,
            vacuum_deleted_ratio=settings.vacuum_deleted_ratio,
        )


# An engine-neutral filter: each engine translates it into its own classes.
@dataclass(frozen=True)
class Equals:
    key: str
    value: str | int | bool | float


@dataclass(frozen=True)
class AnyOf:
    key: str
    values: tuple[str, ...]


@dataclass(frozen=True)
class AtLeast:
    key: str
    value: float


@dataclass(frozen=True)
class IsNull:
    key: str


@dataclass(frozen=True)
class Where:
    """All of `must` and, when `should` is given, at least one of `should`."""

    must: tuple[Condition, ...] = ()
    should: tuple[Condition, ...] = ()


Condition = Equals | AnyOf | AtLeast | IsNull | Where


@dataclass(frozen=True)
class Retrieval:
    """One first-stage query: nearest by the dense or the sparse vector, or both fused."""

    dense: list[float] | None
    sparse: SparseVector | None
    limit: int
    where: Where | None = None
    exact: bool = False
    fusion: Fusion = field(default_factory=Fusion)


def stored_vectors(vector: Any) -> tuple[list[float], SparseVector | None]:
    """A point's vectors as an engine returns them (one list, or a dict by name) as the dense
    vector and the BM25 one."""
    named = vector if isinstance(vector, dict) else {"": vector}
    lexical = named.get(SPARSE_VECTOR)
    sparse = None
    if lexical is not None:
        sparse = SparseVector(tuple(lexical.indices), tuple(float(v) for v in lexical.values))
    return [float(x) for x in named.get("") or []], sparse


def sparse_stamp(encoder: SparseEncoder | None) -> str:
    """What a point records of the encoder that made its sparse vector."""
    if encoder is None:
        return ""
    return hashlib.sha256(encoder.recipe.encode()).hexdigest()[:16]


def missing_sparse(collection: str) -> SparseVectorsMissingError:
    return SparseVectorsMissingError(
        f"Collection {collection!r} was made without BM25 sparse vectors, which sparse and "
        f"hybrid retrieval need. Run `ragrank store add-sparse` to compute them from the "
        f"stored chunk text (nothing is re-embedded), or set {env_name('sparse')}=none and "
        f"{env_name('retrieval')}=dense to search it by dense vectors only."
    )


def point_id(doc_id: str, chunk_index: int) -> str:
    """A deterministic UUID for a chunk, so re-indexing a document overwrites its points."""
    return str(uuid.uuid5(POINT_NAMESPACE, json.dumps([doc_id, chunk_index])))


class Store(ABC):
    """Reads and writes chunk points in one collection. Engines implement the primitives
    (the abstract methods); the document-level operations are built on them once, here, so
    that both engines keep the same semantics."""

    collection: str
    #: Whether the store lives in this process (and ragrank must build its index).
    embedded: bool
    tuning: IndexTuning
    #: Whether the collection must carry BM25 sparse vectors beside the dense ones.
    sparse: bool

    @abstractmethod
    def ensure_collection(self, dimension: int) -> None:
        """Create the collection (cosine, and BM25 sparse with IDF when `sparse`) if missing;
        refuse one built for another model, or one without the sparse vectors needed."""

    @abstractmethod
    def has_sparse(self) -> bool:
        """Whether the existing collection declares the BM25 sparse vector."""

    @abstractmethod
    def _create_sparse(self) -> None:
        """Declare the BM25 sparse vector (IDF modifier) on the existing collection."""

    @abstractmethod
    def _set_sparse(
        self, ids: Sequence[str], vectors: Sequence[SparseVector], payload: Mapping[str, Any]
    ) -> None:
        """Replace the sparse vector of existing points and merge `payload` into theirs,
        keeping their dense vectors."""

    @abstractmethod
    def _set_metadata(self, ids: Sequence[str], values: Mapping[str, Any]) -> None:
        """Merge `values` into the `metadata` of existing points."""

    @abstractmethod
    def write_points(self, points: Sequence[StoredPoint]) -> None:
        """Write points exactly as given (ids, vectors and payloads), as a migration does."""

    @abstractmethod
    def _query(self, request: Retrieval) -> list[tuple[Mapping[str, Any], float]]:
        """One Query API call: nearest by the dense or the sparse vector, or, given both,
        each as a prefetch of `limit` under the filter, fused."""

    @abstractmethod
    def _page(
        self, where: Where | None, fields: list[str] | bool, vectors: bool, limit: int, offset: Any
    ) -> tuple[list[StoredPoint], Any]:
        """One page of a scroll (vectors empty unless asked for), and the offset of the next
        page, or None after the last."""

    @abstractmethod
    def _delete(self, where: Where) -> None: ...

    @abstractmethod
    def _index_keywords(self, fields: Sequence[str]) -> None: ...

    @abstractmethod
    def count(self) -> int: ...

    @abstractmethod
    def ping(self) -> bool:
        """Whether the store answers and the collection exists."""

    @abstractmethod
    def optimize(self, *, while_serving: bool = False) -> None:
        """Build the vector index for what was written since the last build, blocking;
        `while_serving` keeps this process's searches answering meanwhile. A server does
        this by itself, in the background."""

    @abstractmethod
    def close(self) -> None: ...

    def upsert(
        self,
        chunks: Sequence[Chunk],
        vectors: np.ndarray,
        stamps: Mapping[str, DocumentStamp] | None = None,
        sparse: Sequence[SparseVector] | None = None,
    ) -> None:
        """Write chunk points; `stamps` (by doc_id) adds each document's content hash, chunk
        count and origin, which `stored_documents` reads back to skip unchanged documents.
        `sparse` gives each chunk its BM25 vector."""
        if len(chunks) != len(vectors):
            raise ValueError(f"{len(chunks)} chunks but {len(vectors)} vectors")
        if sparse is not None and len(sparse) != len(chunks):
            raise ValueError(f"{len(chunks)} chunks but {len(sparse)} sparse vectors")
        stamps = stamps or {}
        lexical: Sequence[SparseVector | None] = sparse or [None] * len(chunks)
        self.write_points(
            [
                StoredPoint(
                    id=point_id(chunk.doc_id, chunk.chunk_index),
                    vector=vector.tolist(),
                    payload={
                        "doc_id": chunk.doc_id,
                        "chunk": chunk.chunk_index,
                        "text": chunk.text,
                        "title": chunk.title,
                        "metadata": dict(chunk.metadata),
                        "start": chunk.start,
                        "end": chunk.end,
                        **_stamp_payload(stamps.get(chunk.doc_id)),
                    },
                    sparse=lexical_vector,
                )
                for chunk, vector, lexical_vector in zip(chunks, vectors, lexical, strict=True)
            ]
        )

    def add_sparse(
        self,
        encoder: SparseEncoder,
        *,
        batch: int = 256,
        progress: Callable[[int], object] | None = None,
    ) -> int:
        """Give every point a BM25 vector computed from its stored text (and stamp it so, and
        with a per-language encoder record each chunk's language as its `lang` metadata),
        declaring the sparse vector first if the collection lacks it; dense vectors are kept.
        Rerunning it finishes an interrupted run. `progress(n)` is told each batch's size.
        Returns the number of points."""
        if not self.has_sparse():
            self._create_sparse()
        stamp = sparse_stamp(encoder)
        done = 0
        for page in self._pages(None, ["text", "title", "metadata"], vectors=False, batch=batch):
            texts = [
                passage_text(str(p.payload.get("title") or ""), str(p.payload.get("text") or ""))
                for p in page
            ]
            metadata = [dict(p.payload.get("metadata") or {}) for p in page]
            languages = [encoder.language_of(t, m) for t, m in zip(texts, metadata, strict=True)]
            vectors = encoder.documents(texts, languages)
            self._set_sparse([p.id for p in page], vectors, {"sparse": stamp})
            if encoder.detects:
                # As indexing does: a point whose document names its language keeps it.
                unnamed: dict[str, list[str]] = {}
                for point, meta, language in zip(page, metadata, languages, strict=True):
                    if language and "lang" not in meta and "language" not in meta:
                        unnamed.setdefault(language, []).append(point.id)
                for language, ids in unnamed.items():
                    self._set_metadata(ids, {"lang": language})
            done += len(page)
            if progress is not None:
                progress(len(page))
        return done

    def usual_sparse_stamp(self, sample: int = 256) -> str | None:
        """The sparse stamp most of the first `sample` points carry (None when empty): what
        made the collection's BM25 vectors."""
        stamps: Counter[str] = Counter()
        for payload in islice(self._scroll(None, ["sparse"]), sample):
            stamps[str(payload.get("sparse", ""))] += 1
        return stamps.most_common(1)[0][0] if stamps else None

    def points(self, batch: int = 256) -> Iterator[list[StoredPoint]]:
        """Every point with its vector and payload, in batches."""
        yield from self._pages(None, True, vectors=True, batch=batch)

    def _pages(
        self, where: Where | None, fields: list[str] | bool, *, vectors: bool, batch: int
    ) -> Iterator[list[StoredPoint]]:
        offset: Any = None
        while True:
            page, offset = self._page(where, fields, vectors, batch, offset)
            yield page
            if offset is None:
                return

    def _scroll(self, where: Where | None, fields: list[str]) -> Iterator[Mapping[str, Any]]:
        for page in self._pages(where, fields, vectors=False, batch=1024):
            for point in page:
                yield point.payload

    def search(
        self,
        vector: np.ndarray | None,
        limit: int,
        where: Mapping[str, MetadataValue] | None = None,
        *,
        sparse: SparseVector | None = None,
        fusion: Fusion | None = None,
        exact: bool = False,
        languages: Collection[str] = (),
    ) -> list[Candidate]:
        """The `limit` best chunks, optionally filtered: nearest to the dense `vector`, best
        by BM25 for `sparse`, or, given both, the two lists fused (`fusion`; DBSF by
        default, as in the settings). `languages`, the ones BM25 read the query in, lets
        the fusion give a passage in another language, which BM25 cannot match, part of
        BM25's share from the dense list (`fusion.other_languages`). `exact` skips the dense
        vector index and compares with every point."""
        if vector is None and sparse is None:
            raise ValueError("a search needs a dense vector, a sparse one, or both")
        if sparse is not None and not self.has_sparse():
            raise missing_sparse(self.collection)
        request = Retrieval(
            dense=None if vector is None else vector.tolist(),
            sparse=sparse,
            limit=limit,
            where=equality_filter(where),
            exact=exact,
            fusion=fusion or Fusion(),
        )
        if (
            request.dense is not None
            and request.sparse is not None
            and languages
            and request.fusion.other_languages > 0
        ):
            hits = fuse_by_language(
                self._query(replace(request, sparse=None)),
                self._query(replace(request, dense=None)),
                request.fusion,
                languages,
                limit,
            )
        else:
            hits = self._query(request)
        candidates = [_candidate(payload, score) for payload, score in hits]
        # Fused scores tie often (the same ranks in different lists), and Qdrant orders ties
        # arbitrarily: the same search must give the same answer.
        candidates.sort(key=lambda c: (-c.retrieval_score, c.chunk.doc_id, c.chunk.chunk_index))
        return candidates

    def stored_documents(self, doc_ids: Sequence[str]) -> dict[str, StoredDocument]:
        """What the collection holds of each document: its chunk numbers and the stamps on
        them. Documents with no point are absent."""
        found: dict[str, StoredDocument] = {}
        if not doc_ids:
            return found
        query = Where(must=(AnyOf("doc_id", tuple(doc_ids)),))
        fields = ["doc_id", "chunk", "hash", "chunks", "origin", "sparse"]
        for payload in self._scroll(query, fields):
            stored = found.setdefault(str(payload["doc_id"]), StoredDocument())
            stored.chunks.add(int(payload.get("chunk", -1)))
            stored.stamps.add(
                DocumentStamp(
                    str(payload.get("hash", "")),
                    int(payload.get("chunks", -1)),
                    str(payload.get("origin", "")),
                    str(payload.get("sparse", "")),
                )
            )
        return found

    def documents_from(self, origin: str) -> set[str]:
        """doc_ids of every document indexed from `origin`."""
        query = Where(must=(Equals("origin", origin),))
        return {str(payload["doc_id"]) for payload in self._scroll(query, ["doc_id"])}

    def delete_tails(self, chunk_counts: Mapping[str, int]) -> None:
        """Delete each document's points from chunk `count` on (what a shorter version left)."""
        if not chunk_counts:
            return
        tails = tuple(
            Where(must=(Equals("doc_id", doc_id), AtLeast("chunk", count)))
            for doc_id, count in chunk_counts.items()
        )
        self._delete(Where(should=tails))

    def delete_documents(self, doc_ids: Sequence[str]) -> None:
        if doc_ids:
            self._delete(Where(must=(AnyOf("doc_id", tuple(doc_ids)),)))

    def ensure_payload_indexes(self, metadata_keys: Sequence[str] = ()) -> None:
        """Keyword indexes on `doc_id`, `origin` and the given metadata keys, so that the
        indexer's lookups and search filters stay fast as the collection grows."""
        self._index_keywords([*INDEXED_KEYS, *(f"metadata.{key}" for key in metadata_keys)])


def equality_filter(where: Mapping[str, MetadataValue] | None) -> Where | None:
    """A search's `{key: value}` filter: every pair must match; `None` matches a missing or
    null value; keys other than `doc_id` are metadata keys."""
    if not where:
        return None
    conditions: list[Condition] = []
    for key, value in where.items():
        path = key if key in TOP_LEVEL_FILTER_KEYS else f"metadata.{key}"
        conditions.append(IsNull(path) if value is None else Equals(path, value))
    return Where(must=tuple(conditions))


def _stamp_payload(stamp: DocumentStamp | None) -> dict[str, Any]:
    if stamp is None:
        return {}
    return {
        "hash": stamp.content_hash,
        "chunks": stamp.chunks,
        "origin": stamp.origin,
        "sparse": stamp.sparse,
    }


def _candidate(payload: Mapping[str, Any], score: float) -> Candidate:
    chunk = Chunk(
        doc_id=str(payload.get("doc_id", "")),
        chunk_index=int(payload.get("chunk", 0)),
        text=str(payload.get("text", "")),
        title=str(payload.get("title", "")),
        metadata=dict(payload.get("metadata") or {}),
        start=int(payload.get("start", 0)),
        end=int(payload.get("end", 0)),
    )
    return Candidate(chunk=chunk, retrieval_score=float(score))
