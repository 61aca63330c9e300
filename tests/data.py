"""Small made-up chunks and vectors that the store tests share."""

from __future__ import annotations

import numpy as np

from ragrank.documents import Chunk


def make_chunks(n: int, doc_id: str = "doc", **metadata: object) -> list[Chunk]:
    return [
        Chunk(
            doc_id=doc_id,
            chunk_index=i,
            text=f"text {i}",
            title="T",
            metadata=metadata,
            start=i * 10,
            end=i * 10 + 6,
        )
        for i in range(n)
    ]


def unit(rows: int, dim: int, seed: int = 0) -> np.ndarray:
    vectors = np.random.default_rng(seed).normal(size=(rows, dim)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
