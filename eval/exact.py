"""Exact cosine search with faiss: inner product over L2-normalised vectors (`IndexFlatIP`), on
the GPU when faiss was built with GPU support and CUDA is present."""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata
from typing import TYPE_CHECKING, Any

import faiss
import numpy as np

from ragrank.errors import RagrankError

if TYPE_CHECKING:
    from collections.abc import Iterable

    from numpy.typing import NDArray

    from ragrank.protocols import Vectors

#: The distributions that install the `faiss` module: the `eval` extra's CPU build, the `gpu`
#: extra's CUDA build (which runs the CPU indexes too), and the community CUDA 12 wheel.
FAISS_DISTRIBUTIONS = ("faiss-cpu", "faiss-gpu", "faiss-gpu-cu12")


class FaissConflictError(RagrankError):
    """More than one faiss build is installed: they overwrite each other's `faiss` module."""


@dataclass(frozen=True)
class FaissBuild:
    """Which faiss this environment runs, and where its exact search goes."""

    distribution: str
    version: str
    gpus: int

    @property
    def on_gpu(self) -> bool:
        return self.gpus > 0

    def describe(self) -> str:
        """One line for reports: `faiss-gpu 1.15.1 on the GPU (1 visible)`."""
        where = f"on the GPU ({self.gpus} visible)" if self.on_gpu else "on the CPU"
        return f"{self.distribution} {self.version} {where}"


def installed_versions(names: Iterable[str]) -> dict[str, str]:
    """The version of each of `names` that is installed, by name; the others are left out."""
    versions = {}
    for name in names:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def faiss_build() -> FaissBuild:
    """The installed faiss build. Two builds in one environment are refused: both write the
    same `faiss` package, so which one imports depends on the order they were installed in."""
    installed = installed_versions(FAISS_DISTRIBUTIONS)
    if len(installed) > 1:
        names = " and ".join(installed)
        raise FaissConflictError(
            f"{names} are both installed and share the faiss module: keep one "
            "(pip uninstall them all, then install 'ragrank[eval]' on a CPU machine or "
            "'ragrank[gpu]' on a CUDA one)"
        )
    distribution, version = next(iter(installed.items()), ("faiss", faiss.__version__))
    gpus = faiss.get_num_gpus() if hasattr(faiss, "StandardGpuResources") else 0
    return FaissBuild(distribution, version, gpus)


class ExactIndex:
    """Brute-force top-k by inner product; the passage vectors must already be normalised."""

    def __init__(self, vectors: Vectors, *, gpu: bool | None = None) -> None:
        self.gpu = faiss_build().on_gpu if gpu is None else gpu
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
