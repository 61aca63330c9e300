"""Corpus embeddings cached on disk, so that a second evaluation with another reranker or
candidate count does not embed the corpus again.

The key covers everything that changes the vectors: the model (id, and for a local folder the
names, sizes and modification times of its files), its backend, the passage prefix, the
checksum of the corpus file, the token limit and how a document becomes text.
"""

from __future__ import annotations

import hashlib
import json
import os
from typing import TYPE_CHECKING

import numpy as np

from ragrank.loading import local_model_folder

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from ragrank.protocols import Vectors

#: Bump when the text given to the embedder changes (`Document.passage`: title, space, text).
TEXT_FORMAT = "title-space-text/2"


def model_fingerprint(model_id: str) -> str:
    """The model id, plus a digest of its files when it is a local folder."""
    folder = local_model_folder(model_id)
    if folder is None:
        return model_id
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        stat = path.stat()
        digest.update(f"{path.relative_to(folder)}:{stat.st_size}:{stat.st_mtime_ns};".encode())
    return f"{folder.resolve()}@{digest.hexdigest()[:16]}"


def cache_key(
    *,
    model_id: str,
    passage_prefix: str,
    corpus_checksum: str,
    max_length: int,
    backend: str = "torch",
) -> str:
    fields: dict[str, object] = {
        "model": model_fingerprint(model_id),
        "passage_prefix": passage_prefix,
        "corpus": corpus_checksum,
        "max_length": max_length,
        "text": TEXT_FORMAT,
    }
    if backend != "torch":  # named only when not the float one: older keys stay valid
        fields["backend"] = backend
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:32]


class EmbeddingCache:
    """`<folder>/<key>.npy` holds the vectors, `<key>.json` the document ids in row order."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def load(self, key: str, doc_ids: Sequence[str]) -> Vectors | None:
        """The cached vectors, or None when missing or written for other documents."""
        vectors_path, ids_path = self._paths(key)
        if not (vectors_path.exists() and ids_path.exists()):
            return None
        try:
            stored_ids = json.loads(ids_path.read_text(encoding="utf-8"))["doc_ids"]
            vectors = np.load(vectors_path, allow_pickle=False)
        except (OSError, ValueError, KeyError):
            return None
        if stored_ids != list(doc_ids) or len(vectors) != len(doc_ids):
            return None
        return np.asarray(vectors, dtype=np.float32)

    def save(self, key: str, doc_ids: Sequence[str], vectors: Vectors) -> None:
        """Write both files atomically: a killed run leaves no half-written entry."""
        self.folder.mkdir(parents=True, exist_ok=True)
        vectors_path, ids_path = self._paths(key)
        tmp = vectors_path.with_name(f".{key}.{os.getpid()}.tmp")
        with tmp.open("wb") as handle:
            np.save(handle, np.asarray(vectors, dtype=np.float32), allow_pickle=False)
        os.replace(tmp, vectors_path)
        tmp.write_text(json.dumps({"doc_ids": list(doc_ids)}), encoding="utf-8")
        os.replace(tmp, ids_path)

    def _paths(self, key: str) -> tuple[Path, Path]:
        return self.folder / f"{key}.npy", self.folder / f"{key}.json"
