"""Store maintenance behind `ragrank store`: migrating a folder of the earlier embedded engine,
adding BM25 vectors to stored points, building the index, and what a shard holds. Each works
from `Settings` and returns what it did, so the command line only prints."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ragrank.errors import RagrankError, StoreError
from ragrank.language import ANALYSERS
from ragrank.settings import env_name
from ragrank.sparse import QdrantBm25
from ragrank.store.base import sparse_stamp
from ragrank.store.edge import EdgeStore
from ragrank.store.legacy import legacy_collections
from ragrank.store.server import ServerStore

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from pathlib import Path

    from ragrank.settings import Settings
    from ragrank.sparse import SparseEncoder
    from ragrank.store.base import Store

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ShardState:
    """What `ragrank store info` shows of an embedded collection."""

    collection: str
    points: int
    unindexed: int
    path: Path


def require_embedded(settings: Settings, action: str) -> None:
    if not settings.uses_embedded_qdrant:
        raise RagrankError(
            f"ragrank store {action} works on the embedded folder ({env_name('qdrant_path')}); a "
            f"Qdrant server ({env_name('qdrant_url')}) migrates and optimizes its collections "
            "itself"
        )


def migrate_folder(settings: Settings, *, progress: bool = True) -> list[Migrated]:
    """Migrate every collection of the earlier engine in `settings.qdrant_path` into Edge, then
    give the copies their BM25 vectors unless `RAGRANK_SPARSE=none`."""
    require_embedded(settings, "migrate")
    moved = migrate(
        settings.qdrant_path,
        lambda name: EdgeStore.from_settings(settings.replace(collection=name), allow_legacy=True),
        progress=progress,
    )
    if settings.sparse != "none":
        add_sparse_vectors(settings, [item.collection for item in moved], progress=progress)
    return moved


def shard_state(settings: Settings, *, optimize: bool = False) -> ShardState:
    """The embedded collection's points and how many wait for the index; `optimize` builds the
    index first."""
    require_embedded(settings, "optimize" if optimize else "info")
    store = EdgeStore.from_settings(settings)
    try:
        if optimize:
            store.optimize()
        return ShardState(store.collection, store.count(), store.unindexed(), store.path)
    finally:
        store.close()


def add_sparse_vectors(
    settings: Settings, collections: Sequence[str], *, progress: bool = True
) -> dict[str, int]:
    """Give every point of each collection its BM25 vector, from its stored text; returns the
    points done per collection. Nothing is re-embedded, and a rerun finishes an interrupted
    run."""
    from tqdm import tqdm

    from ragrank.sparse import sparse_encoder
    from ragrank.store import open_store

    encoder = sparse_encoder(settings)
    if encoder is None:
        raise RagrankError(
            f"{env_name('sparse')}=none: choose the BM25 tokeniser to add (bm25 or subword)"
        )
    done: dict[str, int] = {}
    for collection in collections:
        store = open_store(settings.replace(collection=collection))
        try:
            with tqdm(
                total=store.count(),
                desc=f"BM25 vectors of {collection}",
                unit="point",
                disable=not progress,
            ) as bar:
                done[collection] = store.add_sparse(encoder, progress=bar.update)
            store.optimize()
        finally:
            store.close()
    return done


def indexed_sparse_encoder(store: Store, encoder: SparseEncoder | None) -> SparseEncoder | None:
    """The encoder queries must use to meet the collection's BM25 vectors: `encoder`, unless
    the collection was indexed with Qdrant's BM25 in one fixed language and `encoder` would
    analyse differently. Then queries keep that language until the collection is re-indexed,
    and the log says so once."""
    if not isinstance(encoder, QdrantBm25):
        return encoder
    stamp = store.usual_sparse_stamp()
    if stamp is None or stamp == sparse_stamp(encoder):
        return encoder
    for language in ("none", *ANALYSERS.values()):
        fixed = QdrantBm25(encoder.params, language)
        if sparse_stamp(fixed) == stamp:
            log.warning(
                "collection %r was indexed with BM25 language %r: queries are analysed as %r "
                "until it is re-indexed; `ragrank store add-sparse` recomputes its BM25 vectors "
                "as %s=%s without re-embedding",
                store.collection,
                language,
                language,
                env_name("bm25_language"),
                encoder.language,
            )
            return fixed
    return encoder


@dataclass(frozen=True)
class Migrated:
    collection: str
    points: int
    dimension: int


def migrate(
    folder: Path,
    open_target: Callable[[str], Store],
    *,
    progress: bool = True,
    batch: int = 256,
) -> list[Migrated]:
    """Copy every collection of the local-mode folder into an Edge shard of the same name,
    points with their ids, vectors and payloads, then build its index. A rerun rewrites the
    same points (the ids are kept), so an interrupted migration is finished by running it
    again. The old files are left in place for the user to delete."""
    from qdrant_client import QdrantClient
    from tqdm import tqdm

    sizes = legacy_collections(folder)
    if not sizes:
        raise StoreError(f"{folder} holds no collection of the earlier embedded engine")
    try:
        client = QdrantClient(path=str(folder))
    except RuntimeError as exc:
        raise StoreError(f"Cannot open {folder}: {exc}") from None
    done: list[Migrated] = []
    try:
        for name, dimension in sizes.items():
            # The local mode is qdrant-client, so the server engine reads it page by page.
            source = ServerStore(client, name)
            total = source.count()
            target = open_target(name)
            try:
                target.ensure_collection(dimension)
                with tqdm(
                    total=total, desc=f"migrating {name}", unit="point", disable=not progress
                ) as bar:
                    for points in source.points(batch):
                        target.write_points(points)
                        bar.update(len(points))
                copied = target.count()
                if copied < total:
                    raise StoreError(
                        f"collection {name!r}: {total} points in {folder}, but {copied} in "
                        f"the new shard; run the migration again"
                    )
                target.optimize()
            finally:
                target.close()
            done.append(Migrated(name, total, dimension))
    finally:
        client.close()
    return done
