"""Folders written by ragrank's earlier embedded engine (qdrant-client's local mode: points
pickled into SQLite): how to recognise one. `ragrank.store.maintenance` migrates them."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

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
