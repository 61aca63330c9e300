"""The Qdrant store: one collection of chunk vectors (cosine), embedded folder or server alike."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
import numpy as np
from qdrant_client import QdrantClient, models
from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

from ragrank.documents import Candidate, Chunk, MetadataValue
from ragrank.errors import CollectionMismatchError, StoreError, StoreUnreachableError
from ragrank.settings import Settings, env_name

#: Fixed namespace so that point ids are the same on every machine and in every run.
POINT_NAMESPACE = uuid.UUID("4f1f0c62-3c1b-5a57-9d0e-7a1d2c9b6e11")

#: Payload keys a search filter may name directly; any other key is looked up in `metadata`.
TOP_LEVEL_FILTER_KEYS = frozenset({"doc_id"})


@dataclass(frozen=True)
class DocumentStamp:
    """What every chunk point of a document records about the version it came from."""

    content_hash: str
    chunks: int
    #: The source it was indexed from (a folder or file path), for `--delete-missing`.
    origin: str = ""


@dataclass
class StoredDocument:
    """The points a document has in the collection."""

    chunks: set[int] = field(default_factory=set)
    stamps: set[DocumentStamp] = field(default_factory=set)

    def holds_version(self, content_hash: str, origin: str) -> bool:
        """Exactly chunks 0..n-1, all stamped with this version: nothing missing, no stale
        point (whatever a crashed run may have left)."""
        if len(self.stamps) != 1:
            return False
        (stamp,) = self.stamps
        return (stamp.content_hash, stamp.origin) == (content_hash, origin) and self.chunks == set(
            range(stamp.chunks)
        )


def point_id(doc_id: str, chunk_index: int) -> str:
    """A deterministic UUID for a chunk, so re-indexing a document overwrites its points."""
    return str(uuid.uuid5(POINT_NAMESPACE, json.dumps([doc_id, chunk_index])))


@dataclass(frozen=True)
class CollectionLayout:
    """How a new collection spreads over a Qdrant cluster: shards, copies of each shard, and
    how many copies a write waits for."""

    shards: int = 1
    replicas: int = 1
    write_consistency: int = 1


class QdrantStore:
    """Reads and writes chunk points in one Qdrant collection.

    The embedded (local folder) client is not thread-safe, so every call goes through a lock;
    against a server the lock only serialises this process's own calls to one client.
    """

    def __init__(
        self,
        client: QdrantClient,
        collection: str,
        *,
        embedded: bool = False,
        layout: CollectionLayout | None = None,
    ) -> None:
        self._client = client
        self.collection = collection
        self.embedded = embedded
        self.layout = layout or CollectionLayout()
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: Settings) -> QdrantStore:
        try:
            if settings.uses_embedded_qdrant:
                settings.qdrant_path.mkdir(parents=True, exist_ok=True)
                client = QdrantClient(path=str(settings.qdrant_path))
            else:
                client = QdrantClient(
                    url=settings.qdrant_url, api_key=settings.qdrant_api_key, timeout=10
                )
        except RuntimeError as exc:
            # The embedded client locks its folder; a second process gets a RuntimeError.
            raise StoreError(
                f"Cannot open the embedded Qdrant folder {settings.qdrant_path}: {exc} "
                f"Only one process may open it at a time: stop the other ragrank process, or run "
                f"a Qdrant server and set {env_name('qdrant_url')}."
            ) from None
        return cls(
            client,
            settings.collection,
            embedded=settings.uses_embedded_qdrant,
            layout=CollectionLayout(
                shards=settings.qdrant_shard_number,
                replicas=settings.qdrant_replication_factor,
                write_consistency=settings.qdrant_write_consistency_factor,
            ),
        )

    def close(self) -> None:
        with self._lock:
            self._client.close()

    def ensure_collection(self, dimension: int) -> None:
        """Create the collection (cosine) if missing; refuse one built for another model."""
        with self._lock:
            try:
                if not self._client.collection_exists(self.collection):
                    try:
                        self._create_collection(dimension)
                        return
                    except Exception:
                        # API replicas and the indexer start together: another one may have
                        # created it since; then check that one like any existing collection.
                        if not self._client.collection_exists(self.collection):
                            raise
                info = self._client.get_collection(self.collection)
            except Exception as exc:
                raise StoreError(f"Qdrant refused collection {self.collection!r}: {exc}") from exc
        vectors = info.config.params.vectors
        if not isinstance(vectors, models.VectorParams):
            raise CollectionMismatchError(
                f"Collection {self.collection!r} uses named vectors; ragrank needs a single "
                f"unnamed vector. Set {env_name('collection')} to another name."
            )
        if vectors.size != dimension or vectors.distance != models.Distance.COSINE:
            raise CollectionMismatchError(
                f"Collection {self.collection!r} holds {vectors.size}-d vectors with "
                f"{vectors.distance.value} distance, but the embedding model gives {dimension}-d "
                f"vectors compared by Cosine. Set {env_name('collection')} to a new name, or "
                f"re-create the collection for this model."
            )

    def _create_collection(self, dimension: int) -> None:
        self._client.create_collection(
            self.collection,
            vectors_config=models.VectorParams(size=dimension, distance=models.Distance.COSINE),
            # The embedded store has no cluster to spread over.
            shard_number=None if self.embedded else self.layout.shards,
            replication_factor=None if self.embedded else self.layout.replicas,
            write_consistency_factor=None if self.embedded else self.layout.write_consistency,
        )

    def upsert(
        self,
        chunks: Sequence[Chunk],
        vectors: np.ndarray,
        stamps: Mapping[str, DocumentStamp] | None = None,
    ) -> None:
        """Write chunk points; `stamps` (by doc_id) adds each document's content hash, chunk
        count and origin, which `stored_documents` reads back to skip unchanged documents."""
        if len(chunks) != len(vectors):
            raise ValueError(f"{len(chunks)} chunks but {len(vectors)} vectors")
        stamps = stamps or {}
        points = [
            models.PointStruct(
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
            )
            for chunk, vector in zip(chunks, vectors, strict=True)
        ]
        self._call(self._client.upsert, self.collection, points=points, wait=True)

    def search(
        self,
        vector: np.ndarray,
        limit: int,
        where: Mapping[str, MetadataValue] | None = None,
    ) -> list[Candidate]:
        """The `limit` chunks most similar to `vector`, best first, optionally filtered."""
        response = self._call(
            self._client.query_points,
            self.collection,
            query=vector.tolist(),
            limit=limit,
            query_filter=_equality_filter(where),
            with_payload=True,
        )
        return [_candidate(point.payload or {}, point.score) for point in response.points]

    def stored_documents(self, doc_ids: Sequence[str]) -> dict[str, StoredDocument]:
        """What the collection holds of each document: its chunk numbers and the stamps on
        them. Documents with no point are absent."""
        found: dict[str, StoredDocument] = {}
        if not doc_ids:
            return found
        query = _doc_ids_filter(doc_ids)
        for payload in self._scroll(query, ["doc_id", "chunk", "hash", "chunks", "origin"]):
            stored = found.setdefault(str(payload["doc_id"]), StoredDocument())
            stored.chunks.add(int(payload.get("chunk", -1)))
            stored.stamps.add(
                DocumentStamp(
                    str(payload.get("hash", "")),
                    int(payload.get("chunks", -1)),
                    str(payload.get("origin", "")),
                )
            )
        return found

    def documents_from(self, origin: str) -> set[str]:
        """doc_ids of every document indexed from `origin`."""
        query = models.Filter(
            must=[models.FieldCondition(key="origin", match=models.MatchValue(value=origin))]
        )
        return {str(payload["doc_id"]) for payload in self._scroll(query, ["doc_id"])}

    def delete_tails(self, chunk_counts: Mapping[str, int]) -> None:
        """Delete each document's points from chunk `count` on (what a shorter version left)."""
        if not chunk_counts:
            return
        tails = [
            models.Filter(
                must=[
                    models.FieldCondition(key="doc_id", match=models.MatchValue(value=doc_id)),
                    models.FieldCondition(key="chunk", range=models.Range(gte=count)),
                ]
            )
            for doc_id, count in chunk_counts.items()
        ]
        selector = models.FilterSelector(filter=models.Filter(should=list(tails)))
        self._call(self._client.delete, self.collection, points_selector=selector, wait=True)

    def delete_documents(self, doc_ids: Sequence[str]) -> None:
        if not doc_ids:
            return
        query = _doc_ids_filter(doc_ids)
        selector = models.FilterSelector(filter=query)
        self._call(self._client.delete, self.collection, points_selector=selector, wait=True)

    def ensure_payload_indexes(self, metadata_keys: Sequence[str] = ()) -> None:
        """Keyword indexes on `doc_id`, `origin` and the given metadata keys, so that filters
        stay fast on a Qdrant server (the embedded store scans; it has none)."""
        if self.embedded:
            return
        fields = ["doc_id", "origin", *(f"metadata.{key}" for key in metadata_keys)]
        for name in fields:
            self._call(
                self._client.create_payload_index,
                self.collection,
                field_name=name,
                field_schema=models.PayloadSchemaType.KEYWORD,
                wait=True,
            )

    def _scroll(self, query: models.Filter, fields: list[str]) -> Iterator[Mapping[str, Any]]:
        offset: Any = None
        while True:
            points, offset = self._call(
                self._client.scroll,
                self.collection,
                scroll_filter=query,
                limit=1024,
                offset=offset,
                with_payload=fields,
                with_vectors=False,
            )
            for point in points:
                yield point.payload or {}
            if offset is None:
                return

    def count(self) -> int:
        result = self._call(self._client.count, self.collection, exact=True)
        return int(result.count)

    def ping(self) -> bool:
        """Whether the store answers and the collection exists."""
        try:
            return bool(self._call(self._client.collection_exists, self.collection))
        except StoreError:
            return False

    def _call(self, method: Any, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            try:
                return method(*args, **kwargs)
            except Exception as exc:
                error = StoreUnreachableError if _transient(exc) else StoreError
                raise error(f"Qdrant call {method.__name__} failed: {exc}") from exc


def _transient(exc: Exception) -> bool:
    """Whether a failed call may succeed later: no connection, a timeout, or 5xx/429."""
    if isinstance(exc, UnexpectedResponse):
        return exc.status_code is None or exc.status_code == 429 or exc.status_code >= 500
    return isinstance(exc, (ResponseHandlingException, httpx.TransportError, OSError))


def _doc_ids_filter(doc_ids: Sequence[str]) -> models.Filter:
    return models.Filter(
        must=[models.FieldCondition(key="doc_id", match=models.MatchAny(any=list(doc_ids)))]
    )


def _stamp_payload(stamp: DocumentStamp | None) -> dict[str, Any]:
    if stamp is None:
        return {}
    return {"hash": stamp.content_hash, "chunks": stamp.chunks, "origin": stamp.origin}


def _equality_filter(where: Mapping[str, MetadataValue] | None) -> models.Filter | None:
    if not where:
        return None
    conditions: list[models.Condition] = []
    for key, value in where.items():
        path = key if key in TOP_LEVEL_FILTER_KEYS else f"metadata.{key}"
        if value is None:
            conditions.append(models.IsNullCondition(is_null=models.PayloadField(key=path)))
        elif isinstance(value, float):
            conditions.append(
                models.FieldCondition(key=path, range=models.Range(gte=value, lte=value))
            )
        else:
            conditions.append(models.FieldCondition(key=path, match=models.MatchValue(value=value)))
    return models.Filter(must=conditions)


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
