"""Folders written by ragrank's earlier embedded engine (qdrant-client's local mode: points
pickled into SQLite), and their migration into Qdrant Edge without re-embedding."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ragrank.errors import StoreError
from ragrank.store.server import ServerStore

if TYPE_CHECKING:
    from collections.abc import Callable
    from pathlib import Path

    from ragrank.store.edge import EdgeStore

#: The local mode's catalogue of collections, at the top of its folder.
LEGACY_META = "meta.json"


def legacy_collections(folder: Path) -> dict[str, int]:
    """The collections (name: vector size) that the local mode's catalogue in `folder` lists."""
    try:
        meta = json.loads((folder / LEGACY_META).read_text(encoding="utf-8"))
        collections = meta["collections"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    sizes: dict[str, int] = {}
    for name, config in collections.items():
        vectors = (config or {}).get("vectors") or {}
        if isinstance(vectors.get("size"), int):
            sizes[str(name)] = vectors["size"]
    return sizes


@dataclass(frozen=True)
class Migrated:
    collection: str
    points: int
    dimension: int


def migrate(
    folder: Path,
    open_target: Callable[[str], EdgeStore],
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
