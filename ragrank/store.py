"""The Qdrant store: one collection of chunk vectors (cosine), embedded folder or server alike."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from qdrant_client import QdrantClient, models

from ragrank.documents import Candidate, Chunk, MetadataValue
from ragrank.errors import CollectionMismatchError, StoreError
from ragrank.settings import Settings, env_name

#: Fixed namespace so that point ids are the same on every machine and in every run.
POINT_NAMESPACE = uuid.UUID("4f1f0c62-3c1b-5a57-9d0e-7a1d2c9b6e11")

#: Payload keys a search filter may name directly; any other key is looked up in `metadata`.
TOP_LEVEL_FILTER_KEYS = frozenset({"doc_id"})


def point_id(doc_id: str, chunk_index: int) -> str:
    """A deterministic UUID for a chunk, so re-indexing a document overwrites its points."""
    return str(uuid.uuid5(POINT_NAMESPACE, json.dumps([doc_id, chunk_index])))


class QdrantStore:
    """Reads and writes chunk points in one Qdrant collection.

    The embedded (local folder) client is not thread-safe, so every call goes through a lock;
    against a server the lock only serialises this process's own calls to one client.
    """

    def __init__(self, client: QdrantClient, collection: str) -> None:
        self._client = client
        self.collection = collection
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
        return cls(client, settings.collection)

    def close(self) -> None:
        with self._lock:
            self._client.close()

    def ensure_collection(self, dimension: int) -> None:
        """Create the collection (cosine) if missing; refuse one built for another model."""
        with self._lock:
            try:
                if not self._client.collection_exists(self.collection):
                    self._client.create_collection(
                        self.collection,
                        vectors_config=models.VectorParams(
                            size=dimension, distance=models.Distance.COSINE
                        ),
                    )
                    return
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

    def upsert(self, chunks: Sequence[Chunk], vectors: np.ndarray) -> None:
        if len(chunks) != len(vectors):
            raise ValueError(f"{len(chunks)} chunks but {len(vectors)} vectors")
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
                raise StoreError(f"Qdrant call {method.__name__} failed: {exc}") from exc


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
