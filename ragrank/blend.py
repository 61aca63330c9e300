"""The order of a reranked list: the reranker's, or a blend of it with the first stage's.

A cross-encoder and the first stage err on different candidates, so mixing their orders can
beat both (score interpolation in the rerankers' literature). The blend mixes ranks, not scores,
because a reranker's logits and a fused first stage's scores have no common scale: each
candidate gets `weight / (K + first-stage rank) + (1 - weight) / (K + reranker rank)`, reciprocal
rank fusion with K = 60 (its usual constant). The rule lives here once; the server's search and
the eval both apply it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Sequence

#: Reciprocal rank fusion's constant: large enough that no single rank dominates.
BLEND_K = 60


def reranked_order(scores: Sequence[float], blend: float = 0.0) -> list[int]:
    """The candidates' indices best first. `scores` are the reranker's, in first-stage order
    (index 0 was the first stage's best). `blend` is the first stage's weight, from 0 (the
    reranker's order alone) to 1 (the first stage's); ties keep the first stage's order."""
    if not 0.0 <= blend <= 1.0:
        raise ValueError(f"blend must be between 0 and 1, not {blend}")
    values = np.asarray(scores, dtype=np.float64)
    by_reranker = np.argsort(-values, kind="stable")
    if blend == 0.0:
        return [int(i) for i in by_reranker]
    reranker_rank = np.empty(len(values), dtype=np.float64)
    reranker_rank[by_reranker] = np.arange(1, len(values) + 1)
    first_rank = np.arange(1, len(values) + 1, dtype=np.float64)
    fused = blend / (BLEND_K + first_rank) + (1.0 - blend) / (BLEND_K + reranker_rank)
    return [int(i) for i in np.argsort(-fused, kind="stable")]
