"""The store on a Qdrant server (or cluster), through qdrant-client."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx
from qdrant_client import QdrantClient, models
from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

from ragrank.errors import CollectionMismatchError, StoreError, StoreUnreachableError
from ragrank.settings import Settings, env_name
from ragrank.sparse import SPARSE_VECTOR, SparseVector
from ragrank.store.base import (
    AnyOf,
    AtLeast,
    Condition,
    IndexTuning,
    IsNull,
    Retrieval,
    Store,
    StoredPoint,
    Where,
    missing_sparse,
)

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from ragrank.store.fusion import Fusion


@dataclass(frozen=True)
class CollectionLayout:
    """How a new collection spreads over a Qdrant cluster: shards, copies of each shard, and
    how many copies a write waits for."""

    shards: int = 1
    replicas: int = 1
    write_consistency: int = 1


class ServerStore(Store):
    """One collection on a Qdrant server. qdrant-client's HTTP client is thread-safe, so
    concurrent searches go out in parallel; the server orders the writes."""

    embedded = False

    def __init__(
        self,
        client: QdrantClient,
        collection: str,
        *,
        layout: CollectionLayout | None = None,
        tuning: IndexTuning | None = None,
        sparse: bool = True,
    ) -> None:
        self._client = client
        self.collection = collection
        self.layout = layout or CollectionLayout()
        self.tuning = tuning or IndexTuning()
        self.sparse = sparse
        #: Whether the collection declares the sparse vector, once looked up.
        self._has_sparse: bool | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> ServerStore:
        client = QdrantClient(url=settings.qdrant_url, api_key=settings.qdrant_api_key, timeout=10)
        return cls(
            client,
            settings.collection,
            layout=CollectionLayout(
                shards=settings.qdrant_shard_number,
                replicas=settings.qdrant_replication_factor,
                write_consistency=settings.qdrant_write_consistency_factor,
            ),
            tuning=IndexTuning.from_settings(settings),
            sparse=settings.sparse != "none",
        )

    def close(self) -> None:
        self._client.close()

    def ensure_collection(self, dimension: int) -> None:
        try:
            if not self._client.collection_exists(self.collection):
                try:
                    self._create_collection(dimension)
                    self._has_sparse = self.sparse
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
        self._has_sparse = SPARSE_VECTOR in (info.config.params.sparse_vectors or {})
        if self.sparse and not self._has_sparse:
            raise missing_sparse(self.collection)

    def has_sparse(self) -> bool:
        if self._has_sparse is None:
            info = self._call(self._client.get_collection, self.collection)
            self._has_sparse = SPARSE_VECTOR in (info.config.params.sparse_vectors or {})
        return self._has_sparse

    def _create_sparse(self) -> None:
        config = models.SparseVectorConfig(modifier=models.Modifier.IDF)
        self._call(
            self._client.create_vector_name,
            self.collection,
            SPARSE_VECTOR,
            models.SparseVectorNameConfig(sparse=config),
        )
        self._has_sparse = True

    def _set_sparse(
        self, ids: Sequence[str], vectors: Sequence[SparseVector], payload: Mapping[str, Any]
    ) -> None:
        if not ids:
            return
        points = [
            models.PointVectors(id=point_id, vector={SPARSE_VECTOR: _sparse(vector)})
            for point_id, vector in zip(ids, vectors, strict=True)
        ]
        self._call(self._client.update_vectors, self.collection, points=points, wait=True)
        self._call(
            self._client.set_payload,
            self.collection,
            payload=dict(payload),
            points=list(ids),
            wait=True,
        )

    def _set_metadata(self, ids: Sequence[str], values: Mapping[str, Any]) -> None:
        if not ids:
            return
        self._call(
            self._client.set_payload,
            self.collection,
            payload=dict(values),
            points=list(ids),
            key="metadata",
            wait=True,
        )

    def _create_collection(self, dimension: int) -> None:
        self._client.create_collection(
            self.collection,
            vectors_config=models.VectorParams(size=dimension, distance=models.Distance.COSINE),
            sparse_vectors_config=(
                {SPARSE_VECTOR: models.SparseVectorParams(modifier=models.Modifier.IDF)}
                if self.sparse
                else None
            ),
            shard_number=self.layout.shards,
            replication_factor=self.layout.replicas,
            write_consistency_factor=self.layout.write_consistency,
            hnsw_config=models.HnswConfigDiff(
                m=self.tuning.m,
                ef_construct=self.tuning.ef_construct,
                full_scan_threshold=self.tuning.full_scan_threshold_kb,
            ),
            optimizers_config=models.OptimizersConfigDiff(
                indexing_threshold=self.tuning.indexing_threshold_kb,
                deleted_threshold=self.tuning.vacuum_deleted_ratio,
                vacuum_min_vector_number=1,
            ),
        )

    def write_points(self, points: Sequence[StoredPoint]) -> None:
        structs = [
            models.PointStruct(id=point.id, vector=self._vectors(point), payload=point.payload)
            for point in points
        ]
        self._call(self._client.upsert, self.collection, points=structs, wait=True)

    def _vectors(self, point: StoredPoint) -> Any:
        if point.sparse is None or not self.sparse:
            return point.vector
        return {"": point.vector, SPARSE_VECTOR: _sparse(point.sparse)}

    def _query(self, request: Retrieval) -> list[tuple[Mapping[str, Any], float]]:
        dense, sparse, limit = request.dense, request.sparse, request.limit
        params = models.SearchParams(hnsw_ef=self.tuning.ef, exact=request.exact)
        where_filter = _filter(request.where)
        stages: list[models.Prefetch] = []
        if dense is not None:
            stages.append(models.Prefetch(query=dense, params=params, limit=limit))
        if sparse is not None:
            stages.append(models.Prefetch(query=_sparse(sparse), using=SPARSE_VECTOR, limit=limit))
        if len(stages) == 1:
            (stage,) = stages
            arguments: dict[str, Any] = {
                "query": stage.query,
                "using": stage.using,
                "search_params": stage.params,
                "query_filter": where_filter,
            }
        else:
            arguments = {
                "prefetch": [stage.model_copy(update={"filter": where_filter}) for stage in stages],
                "query": _fusion(request.fusion),
            }
        response = self._call(
            self._client.query_points,
            self.collection,
            limit=limit,
            with_payload=True,
            **arguments,
        )
        return [(point.payload or {}, point.score) for point in response.points]

    def _page(
        self, where: Where | None, fields: list[str] | bool, vectors: bool, limit: int, offset: Any
    ) -> tuple[list[StoredPoint], Any]:
        records, offset = self._call(
            self._client.scroll,
            self.collection,
            scroll_filter=_filter(where),
            limit=limit,
            offset=offset,
            with_payload=fields,
            with_vectors=vectors,
        )
        points = [StoredPoint.read(r.id, r.vector, r.payload) for r in records]
        return points, offset

    def _delete(self, where: Where) -> None:
        selector = models.FilterSelector(filter=_where(where))
        self._call(self._client.delete, self.collection, points_selector=selector, wait=True)

    def _index_keywords(self, fields: Sequence[str]) -> None:
        for name in fields:
            self._call(
                self._client.create_payload_index,
                self.collection,
                field_name=name,
                field_schema=models.PayloadSchemaType.KEYWORD,
                wait=True,
            )

    def count(self) -> int:
        result = self._call(self._client.count, self.collection, exact=True)
        return int(result.count)

    def ping(self) -> bool:
        try:
            return bool(self._call(self._client.collection_exists, self.collection))
        except StoreError:
            return False

    def optimize(self, *, while_serving: bool = False) -> None:
        """A server builds its indexes in the background by itself."""

    def _call(self, method: Any, *args: Any, **kwargs: Any) -> Any:
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


def _sparse(vector: SparseVector) -> models.SparseVector:
    return models.SparseVector(indices=list(vector.indices), values=list(vector.values))


def _fusion(fusion: Fusion) -> models.Query:
    if fusion.method == "dbsf":
        return models.FusionQuery(fusion=models.Fusion.DBSF)
    return models.RrfQuery(rrf=models.Rrf(k=fusion.k, weights=fusion.weights))


def _filter(where: Where | None) -> models.Filter | None:
    return None if where is None else _where(where)


def _where(where: Where) -> models.Filter:
    return models.Filter(
        must=[_condition(c) for c in where.must] or None,
        should=[_condition(c) for c in where.should] or None,
    )


def _condition(condition: Condition) -> models.Condition:
    if isinstance(condition, Where):
        return _where(condition)
    if isinstance(condition, IsNull):
        return models.IsNullCondition(is_null=models.PayloadField(key=condition.key))
    if isinstance(condition, AnyOf):
        return models.FieldCondition(
            key=condition.key, match=models.MatchAny(any=list(condition.values))
        )
    if isinstance(condition, AtLeast):
        return models.FieldCondition(key=condition.key, range=models.Range(gte=condition.value))
    value = condition.value
    if isinstance(value, float):
        return models.FieldCondition(key=condition.key, range=models.Range(gte=value, lte=value))
    return models.FieldCondition(key=condition.key, match=models.MatchValue(value=value))
