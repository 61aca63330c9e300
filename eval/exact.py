"""Exact cosine search with faiss: inner product over L2-normalised vectors (`IndexFlatIP`), on
the GPU when faiss was built with GPU support and CUDA is present."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import faiss
import numpy as np

if TYPE_CHECKING:
    from numpy.typing import NDArray

    from ragrank.protocols import Vectors


def faiss_gpu_available() -> bool:
    """True when this faiss build has GPU support and sees at least one GPU."""
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


class ExactIndex:
    """Brute-force top-k by inner product; the passage vectors must already be normalised."""

    def __init__(self, vectors: Vectors, *, gpu: bool | None = None) -> None:
        self.gpu = faiss_gpu_available() if gpu is None else gpu
        cpu_index = faiss.IndexFlatIP(vectors.shape[1])
        index: Any = cpu_index
        if self.gpu:
            self._resources = faiss.StandardGpuResources()
            index = faiss.index_cpu_to_gpu(self._resources, 0, cpu_index)
        index.add(np.ascontiguousarray(vectors, dtype=np.float32))
        self._index = index
        self.size = len(vectors)

    def search(self, queries: Vectors, k: int) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
        """(scores, row indices), best first, for each query; k is capped at the index size."""
        k = min(k, self.size)
        scores, rows = self._index.search(np.ascontiguousarray(queries, dtype=np.float32), k)
        return np.asarray(scores, dtype=np.float32), np.asarray(rows, dtype=np.int64)
