"""The embedded store: Qdrant Edge, Qdrant's own engine in-process (HNSW, WAL, payload
indexes), one shard per collection under `RAGRANK_QDRANT_PATH/edge/`.

Two properties of Edge's Python binding shape this class (both measured, see docs/deployment.md):
- every call holds the interpreter lock for its whole length, so reads need no lock of ours
  and gain nothing from threads;
- `optimize()` (building the HNSW graph) therefore stops every other thread of the process
  while it runs: a serving process builds in a child process instead (`EdgeStore.optimize`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING, Any

import numpy as np
import qdrant_edge as edge

from ragrank.errors import CollectionMismatchError, StoreError, StoreUnreachableError
from ragrank.locks import lock_file
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
from ragrank.store.legacy import legacy_collections

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence
    from pathlib import Path

    from ragrank.store.fusion import Fusion

#: Edge writes the shard's configuration here; ragrank reads the vector size back from it.
EDGE_CONFIG_FILE = "edge_config.json"


def shard_folder(folder: Path, collection: str) -> Path:
    return folder / "edge" / collection


class EdgeStore(Store):
    """One collection as a Qdrant Edge shard in a local folder. Only one process may open the
    folder: a lock file says so at once, instead of a failure deep in the engine."""

    embedded = True

    def __init__(
        self,
        folder: Path,
        collection: str,
        *,
        tuning: IndexTuning | None = None,
        sparse: bool = True,
        allow_legacy: bool = False,
    ) -> None:
        self.folder = folder
        self.collection = collection
        self.tuning = tuning or IndexTuning()
        self.sparse = sparse
        self.path = shard_folder(folder, collection)
        self._lifecycle = threading.Lock()
        self._write_lock = threading.Lock()
        self._guard = _SwapGuard()
        self._shard: edge.EdgeShard | None = None
        self._dimension: int | None = None
        self._has_sparse = False
        #: Whether points were deleted since the last build, which a build then vacuums.
        self._deleted = False
        self._lock_file: IO[str] | None = _lock_folder(folder)
        try:
            if not allow_legacy and not self._exists() and collection in legacy_collections(folder):
                raise StoreError(
                    f"The embedded Qdrant folder {folder} holds collection {collection!r} in the "
                    f"format of ragrank's earlier embedded engine (qdrant-client's local mode). "
                    f"Run `ragrank store migrate` to copy its points into Qdrant Edge, keeping "
                    f"vectors and payloads (nothing is re-embedded), or set "
                    f"{env_name('qdrant_path')} to a new folder."
                )
            # A copy that a build alongside searches left behind, killed mid-way.
            shutil.rmtree(_reading_copy(self.path), ignore_errors=True)
            if self._exists():
                self._dimension, self._has_sparse = _stored_vectors(self.path)
                self._shard = self._load(self._dimension)
        except BaseException:
            self._release()
            raise

    @classmethod
    def from_settings(cls, settings: Settings, *, allow_legacy: bool = False) -> EdgeStore:
        return cls(
            settings.qdrant_path,
            settings.collection,
            tuning=IndexTuning.from_settings(settings),
            sparse=settings.sparse != "none",
            allow_legacy=allow_legacy,
        )

    def _exists(self) -> bool:
        return (self.path / EDGE_CONFIG_FILE).is_file()

    def _config(self, dimension: int, sparse: bool) -> edge.EdgeConfig:
        lexical = {SPARSE_VECTOR: edge.EdgeSparseVectorParams(modifier=edge.Modifier.Idf)}
        return edge.EdgeConfig(
            vectors=edge.EdgeVectorParams(size=dimension, distance=edge.Distance.Cosine),
            sparse_vectors=lexical if sparse else None,
            hnsw_config=edge.HnswIndexConfig(
                m=self.tuning.m,
                ef_construct=self.tuning.ef_construct,
                full_scan_threshold=self.tuning.full_scan_threshold_kb,
            ),
            optimizers=edge.EdgeOptimizersConfig(
                indexing_threshold=self.tuning.indexing_threshold_kb,
                deleted_threshold=self.tuning.vacuum_deleted_ratio,
                vacuum_min_vector_number=1,
            ),
        )

    def _load(self, dimension: int | None) -> edge.EdgeShard:
        config = None if dimension is None else self._config(dimension, self._has_sparse)
        try:
            return edge.EdgeShard.load(str(self.path), config)
        except Exception as exc:
            raise StoreError(f"Cannot open the Qdrant Edge shard {self.path}: {exc}") from exc

    def ensure_collection(self, dimension: int) -> None:
        with self._lifecycle:
            if self._shard is None:
                if self._exists():
                    raise StoreError(f"The Qdrant Edge shard {self.path} is closed")
                self.path.mkdir(parents=True, exist_ok=True)
                config = self._config(dimension, self.sparse)
                try:
                    self._shard = edge.EdgeShard.create(str(self.path), config)
                except Exception as exc:
                    raise StoreError(f"Cannot create the shard {self.path}: {exc}") from exc
                self._dimension, self._has_sparse = dimension, self.sparse
                return
        if self._dimension is not None and self._dimension != dimension:
            raise CollectionMismatchError(
                f"Collection {self.collection!r} holds {self._dimension}-d vectors with Cosine "
                f"distance, but the embedding model gives {dimension}-d vectors compared by "
                f"Cosine. Set {env_name('collection')} to a new name, or delete {self.path} to "
                f"re-create the collection for this model."
            )
        if self.sparse and not self._has_sparse:
            raise missing_sparse(self.collection)

    def has_sparse(self) -> bool:
        return self._has_sparse

    def _create_sparse(self) -> None:
        self._update(edge.UpdateOperation.create_sparse_vector(SPARSE_VECTOR, edge.Modifier.Idf))
        self._has_sparse = True

    def _set_sparse(
        self, ids: Sequence[str], vectors: Sequence[SparseVector], payload: Mapping[str, Any]
    ) -> None:
        if not ids:
            return
        points = [
            edge.PointVectors(point_id, {SPARSE_VECTOR: _sparse(vector)})
            for point_id, vector in zip(ids, vectors, strict=True)
        ]
        with self._write_lock:
            self._call("update", edge.UpdateOperation.update_vectors(points))
            self._call("update", edge.UpdateOperation.set_payload(list(ids), dict(payload)))
            self._call("flush")

    def _set_metadata(self, ids: Sequence[str], values: Mapping[str, Any]) -> None:
        if not ids:
            return
        with self._write_lock:
            operation = edge.UpdateOperation.set_payload(list(ids), dict(values), key="metadata")
            self._call("update", operation)
            self._call("flush")
            self._deleted = True  # points of built segments are rewritten elsewhere

    def _open(self) -> edge.EdgeShard:
        shard = self._shard
        if shard is None:
            raise StoreError(
                f"Collection {self.collection!r} does not exist yet in {self.folder}: index "
                f"documents first"
            )
        return shard

    def _call(self, method: str, *args: Any) -> Any:
        """One call on the shard, which a build alongside searches cannot swap mid-call."""
        with self._guard.reading():
            return _run(getattr(self._open(), method), *args)

    def _update(self, operation: edge.UpdateOperation) -> None:
        """Apply one write and flush it: Edge logs every write in its WAL before applying it,
        and `flush` makes the segments and the log durable on disk (about 5 ms). Writes wait
        while a build runs alongside searches."""
        with self._write_lock:
            self._call("update", operation)
            self._call("flush")

    def write_points(self, points: Sequence[StoredPoint]) -> None:
        if points:
            self._update(
                edge.UpdateOperation.upsert_points(
                    [edge.Point(point.id, self._vectors(point), point.payload) for point in points]
                )
            )

    def _vectors(self, point: StoredPoint) -> Any:
        if point.sparse is None or not self._has_sparse:
            return point.vector
        return {"": point.vector, SPARSE_VECTOR: _sparse(point.sparse)}

    def _query(self, request: Retrieval) -> list[tuple[Mapping[str, Any], float]]:
        dense, sparse, limit = request.dense, request.sparse, request.limit
        params = edge.SearchParams(hnsw_ef=self.tuning.ef, exact=request.exact)
        where_filter = _filter(request.where)
        stages: list[tuple[Any, edge.SearchParams | None]] = []
        if dense is not None:
            stages.append((edge.Query.Nearest(dense), params))
        if sparse is not None:
            stages.append((edge.Query.Nearest(_sparse(sparse), using=SPARSE_VECTOR), None))
        if len(stages) == 1:
            ((query, stage_params),) = stages
            query_request = edge.QueryRequest(
                limit=limit,
                query=query,
                filter=where_filter,
                params=stage_params,
                with_payload=True,
            )
        else:
            query_request = edge.QueryRequest(
                limit=limit,
                prefetches=[
                    edge.Prefetch(limit=limit, query=query, params=stage, filter=where_filter)
                    for query, stage in stages
                ],
                query=_fusion(request.fusion),
                with_payload=True,
            )
        return [(hit.payload or {}, hit.score) for hit in self._call("query", query_request)]

    def _page(
        self, where: Where | None, fields: list[str] | bool, vectors: bool, limit: int, offset: Any
    ) -> tuple[list[StoredPoint], Any]:
        request = edge.ScrollRequest(
            offset=offset,
            limit=limit,
            filter=_filter(where),
            with_payload=fields,
            with_vector=vectors,
        )
        records, offset = self._call("scroll", request)
        points = [StoredPoint.read(r.id, r.vector, r.payload) for r in records]
        return points, offset

    def _delete(self, where: Where) -> None:
        self._update(edge.UpdateOperation.delete_points_by_filter(_where(where)))
        self._deleted = True

    def _index_keywords(self, fields: Sequence[str]) -> None:
        for name in fields:
            self._update(
                edge.UpdateOperation.create_field_index(name, edge.PayloadSchemaType.Keyword)
            )

    def count(self) -> int:
        return int(self._call("count", edge.CountRequest(exact=True)))

    def ping(self) -> bool:
        return self._shard is not None

    def unindexed(self) -> int:
        """Points not yet in an HNSW graph (searched by exact scan until `optimize`)."""
        info = self._call("info")
        return max(0, int(info.points_count) - int(info.indexed_vectors_count))

    def optimize(self, *, while_serving: bool = False) -> None:
        """Build the HNSW graph of every segment big enough to need one.

        Edge's binding holds the interpreter lock for the whole build, so in this process
        nothing else would run meanwhile. Without `while_serving` the build runs here (after
        `ragrank index`, before the server listens). With it, a child process builds on the
        shard while this one searches a copy of it (the same points, so the same answers);
        writes wait for the build, and the built shard then replaces the copy.
        """
        if not while_serving:
            with self._write_lock:
                self._call("optimize")
                self._call("flush")
                self._deleted = False
            return
        with self._write_lock:
            if self._shard is None or not (self._deleted or self._needs_graph()):
                return
            self._deleted = False
            self._call("flush")
            copy = _reading_copy(self.path)
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(self.path, copy)
            self._swap(_run(edge.EdgeShard.load, str(copy)))
            try:
                build_in_child(self.path)
            finally:
                self._swap(self._load(self._dimension))
                shutil.rmtree(copy, ignore_errors=True)

    def _needs_graph(self) -> bool:
        """Whether points outside any graph reach the size from which a segment gets one."""
        vector_kb = (self._dimension or 0) * 4 / 1024
        return self.unindexed() * vector_kb >= self.tuning.indexing_threshold_kb

    def _swap(self, shard: edge.EdgeShard) -> None:
        """Put `shard` under the readers, once no call is in flight, and close the old one."""
        with self._guard.swapping():
            old, self._shard = self._shard, shard
            if old is not None:
                _run(old.close)

    def close(self) -> None:
        # After any write or build in progress: a build beside searches swaps shards.
        with self._write_lock, self._lifecycle:
            shard, self._shard = self._shard, None
            try:
                if shard is not None:
                    _run(shard.flush)
                    _run(shard.close)
            finally:
                self._release()

    def _release(self) -> None:
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None


class _SwapGuard:
    """Any number of shard calls at once, or one swap of the shard under them."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._calls = 0
        self._swapping = False

    @contextmanager
    def reading(self) -> Iterator[None]:
        with self._changed:
            self._changed.wait_for(lambda: not self._swapping)
            self._calls += 1
        try:
            yield
        finally:
            with self._changed:
                self._calls -= 1
                self._changed.notify_all()

    @contextmanager
    def swapping(self) -> Iterator[None]:
        with self._changed:
            self._changed.wait_for(lambda: not self._swapping)
            self._swapping = True
            self._changed.wait_for(lambda: self._calls == 0)
        try:
            yield
        finally:
            with self._changed:
                self._swapping = False
                self._changed.notify_all()


def _reading_copy(path: Path) -> Path:
    return path.with_name(f".{path.name}.reading")


def build_in_child(path: Path) -> None:
    """`optimize` on the shard at `path` in a child process, which dies with this one (a
    build killed mid-way leaves the shard as it was: Edge swaps built segments in whole)."""
    command = [sys.executable, "-m", "ragrank.store.build", str(path), str(os.getpid())]
    done = subprocess.run(command, check=False, capture_output=True, text=True)
    if done.returncode != 0:
        raise StoreError(f"Building the index of {path} failed: {done.stderr.strip()[-500:]}")


def _lock_folder(folder: Path) -> IO[str]:
    folder.mkdir(parents=True, exist_ok=True)
    handle = lock_file(folder / "ragrank.lock")
    if handle is None:
        raise StoreError(
            f"Cannot open the embedded Qdrant folder {folder}: another process holds it. Only "
            f"one process may open it at a time: stop the other ragrank process, or run a "
            f"Qdrant server and set {env_name('qdrant_url')}."
        )
    return handle


def _stored_vectors(path: Path) -> tuple[int | None, bool]:
    """The dense vector size the shard was created with (None where its file is unreadable:
    the shard then opens with the configuration it holds), and whether it declares the
    sparse vector."""
    try:
        config = json.loads((path / EDGE_CONFIG_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None, False
    try:
        dimension: int | None = int(config["vectors"][""]["size"])
    except (KeyError, TypeError, ValueError):
        dimension = None
    sparse = config.get("sparse_vectors") if isinstance(config, dict) else None
    return dimension, isinstance(sparse, dict) and SPARSE_VECTOR in sparse


def _run(method: Any, *args: Any) -> Any:
    try:
        return method(*args)
    except OSError as exc:
        raise StoreUnreachableError(f"Qdrant Edge {method.__name__} failed: {exc}") from exc
    except Exception as exc:
        raise StoreError(f"Qdrant Edge {method.__name__} failed: {exc}") from exc


def _sparse(vector: SparseVector | None) -> edge.SparseVector:
    if vector is None:
        return edge.SparseVector([], [])
    return edge.SparseVector(list(vector.indices), list(vector.values))


def _fusion(fusion: Fusion) -> Any:
    if fusion.method == "dbsf":
        return edge.Fusion.Dbsf()
    return edge.Fusion.Rrf(k=fusion.k, weights=fusion.weights)


def _filter(where: Where | None) -> edge.Filter | None:
    return None if where is None else _where(where)


def _where(where: Where) -> edge.Filter:
    return edge.Filter(
        must=[_condition(c) for c in where.must] or None,
        should=[_condition(c) for c in where.should] or None,
    )


def _condition(condition: Condition) -> Any:
    if isinstance(condition, Where):
        return _where(condition)
    if isinstance(condition, IsNull):
        return edge.IsNullCondition(condition.key)
    if isinstance(condition, AnyOf):
        return edge.FieldCondition(key=condition.key, match=edge.MatchAny(list(condition.values)))
    if isinstance(condition, AtLeast):
        return edge.FieldCondition(key=condition.key, range=edge.RangeFloat(gte=condition.value))
    value = condition.value
    if isinstance(value, float):
        return edge.FieldCondition(key=condition.key, range=edge.RangeFloat(gte=value, lte=value))
    return edge.FieldCondition(key=condition.key, match=_match_value(value))


def _match_value(value: str | int | bool) -> edge.MatchValue:
    if isinstance(value, bool):
        # The binding reads a Python bool as the integer 0 or 1, which matches no stored
        # boolean; numpy's bool reaches it as a boolean.
        return edge.MatchValue(np.bool_(value))  # type: ignore[arg-type]
    return edge.MatchValue(value)
