"""The opt-in int8 CPU backend of the cross-encoder, and the check that gates it.

Dynamic int8 quantisation (per-channel weights, activations quantised per batch) of every
linear layer makes a BERT-sized cross-encoder faster on CPU cores. It also moves its scores,
so a quantised model is used only after its rankings are compared with the float model's on a
calibration set: per query, the Spearman correlation of the two score lists. Below
`RAGRANK_RERANK_MIN_AGREEMENT` the server refuses to start.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from scipy.stats import spearmanr

from ragrank import SAMPLE_DATASET
from ragrank.documents import open_text, read_jsonl_documents

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from numpy.typing import NDArray

    from ragrank.protocols import Pair


@dataclass(frozen=True)
class Agreement:
    """How closely a quantised scorer ranks like the float one."""

    queries: int
    pairs: int
    #: Mean and worst per-query Spearman correlation of the two score lists.
    mean_spearman: float
    min_spearman: float
    #: Share of queries whose best document is the same under both.
    top1: float
    #: Largest absolute difference of a logit.
    max_abs_diff: float

    def __str__(self) -> str:
        return (
            f"Spearman per query mean {self.mean_spearman:.3f} (min {self.min_spearman:.3f}), "
            f"same top-1 for {self.top1:.0%} of {self.queries} queries, "
            f"max |Δlogit| {self.max_abs_diff:.4f} over {self.pairs} pairs"
        )


def calibration_groups(queries: int = 8, documents: int = 12) -> list[list[Pair]]:
    """(query, passage) pairs from the bundled sample: each query against the same documents,
    spread over the whole (multilingual) collection."""
    with open_text(SAMPLE_DATASET / "queries.jsonl") as lines:
        texts = [str(json.loads(line)["text"]) for line in islice(lines, queries)]
    corpus = list(read_jsonl_documents(SAMPLE_DATASET / "corpus.jsonl"))
    step = max(1, len(corpus) // documents)
    passages = [f"{d.title} {d.text}".strip() for d in corpus[::step][:documents]]
    return [[(query, passage) for passage in passages] for query in texts]


def rank_agreement(
    reference: Sequence[NDArray[np.floating]], candidate: Sequence[NDArray[np.floating]]
) -> Agreement:
    """Compare two scorers' logits, one array per query."""
    rhos = [float(spearmanr(r, c).statistic) for r, c in zip(reference, candidate, strict=True)]
    rhos = [0.0 if np.isnan(rho) else rho for rho in rhos]
    same_top = [
        int(np.argmax(r)) == int(np.argmax(c)) for r, c in zip(reference, candidate, strict=True)
    ]
    diffs = [
        float(np.max(np.abs(r - c))) for r, c in zip(reference, candidate, strict=True) if len(r)
    ]
    return Agreement(
        queries=len(rhos),
        pairs=sum(len(r) for r in reference),
        mean_spearman=float(np.mean(rhos)),
        min_spearman=float(np.min(rhos)),
        top1=float(np.mean(same_top)),
        max_abs_diff=max(diffs, default=0.0),
    )


def quantize_int8(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of `model` whose linear layers run in int8 on the CPU."""
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    quantize: Any = quantize_dynamic  # untyped in torch
    with warnings.catch_warnings():
        # torch.ao's eager quantisation is deprecated in favour of torchao, which needs
        # torch.compile to be fast on CPUs; this path still works and needs nothing extra.
        warnings.simplefilter("ignore")
        quantized: torch.nn.Module = quantize(
            model, {torch.nn.Linear: per_channel_dynamic_qconfig}, inplace=False
        )
    return quantized


def checked_agreement(
    groups: Sequence[Sequence[Pair]],
    float_scores: Callable[[Sequence[Pair]], NDArray[np.float32]],
    int8_scores: Callable[[Sequence[Pair]], NDArray[np.float32]],
) -> Agreement:
    """Score every calibration group with both scorers and compare the rankings."""
    reference = [float_scores(group) for group in groups]
    candidate = [int8_scores(group) for group in groups]
    return rank_agreement(reference, candidate)
