"""The vector store: one collection of chunk vectors (dense by cosine, and BM25 sparse),
behind one interface with two engines. Embedded (`RAGRANK_QDRANT_PATH`) runs Qdrant Edge
in-process; a server (`RAGRANK_QDRANT_URL`) runs through qdrant-client."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ragrank.store.base import (
    POINT_NAMESPACE,
    TOP_LEVEL_FILTER_KEYS,
    AnyOf,
    AtLeast,
    Condition,
    DocumentStamp,
    Equals,
    IndexTuning,
    IsNull,
    Store,
    StoredDocument,
    StoredPoint,
    Where,
    point_id,
    sparse_stamp,
)
from ragrank.store.edge import EdgeStore
from ragrank.store.fusion import Fusion
from ragrank.store.server import CollectionLayout, ServerStore

if TYPE_CHECKING:
    from ragrank.settings import Settings


def open_store(settings: Settings) -> Store:
    """The store the settings name: a Qdrant server when `qdrant_url` is set, else the
    embedded Qdrant Edge folder at `qdrant_path`."""
    if settings.uses_embedded_qdrant:
        return EdgeStore.from_settings(settings)
    return ServerStore.from_settings(settings)


__all__ = [
    "POINT_NAMESPACE",
    "TOP_LEVEL_FILTER_KEYS",
    "AnyOf",
    "AtLeast",
    "CollectionLayout",
    "Condition",
    "DocumentStamp",
    "EdgeStore",
    "Equals",
    "Fusion",
    "IndexTuning",
    "IsNull",
    "ServerStore",
    "Store",
    "StoredDocument",
    "StoredPoint",
    "Where",
    "open_store",
    "point_id",
    "sparse_stamp",
]
