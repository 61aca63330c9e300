"""The agreement gate of the CPU backends, and the calibration texts of both roles.

A backend other than torch moves a model's outputs, so it is used only after it is compared
with torch's float32 model on a calibration set from the bundled sample: a cross-encoder by the
per-query Spearman correlation of the two score lists, an embedder by the cosine between each
text's two vectors. Below the role's `RAGRANK_*_MIN_AGREEMENT` the model is refused. Static
quantisation calibrates on the rest of the sample (`held_out_texts`), so the gate measures texts
the quantisation was not fit to.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from itertools import islice
from typing import TYPE_CHECKING, Protocol

import numpy as np
from scipy.stats import spearmanr

from ragrank import SAMPLE_DATASET
from ragrank.documents import open_text, read_jsonl_documents
from ragrank.errors import ModelLoadError
from ragrank.settings import env_name

if TYPE_CHECKING:
    from collections.abc import Sequence

    from numpy.typing import NDArray

    from ragrank.protocols import Pair
    from ragrank.roles import Role


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

    @property
    def level(self) -> float:
        """What the threshold is compared with."""
        return self.mean_spearman

    def __str__(self) -> str:
        return (
            f"Spearman per query mean {self.mean_spearman:.3f} (min {self.min_spearman:.3f}), "
            f"same top-1 for {self.top1:.0%} of {self.queries} queries, "
            f"max |Δlogit| {self.max_abs_diff:.4f} over {self.pairs} pairs"
        )


@dataclass(frozen=True)
class VectorAgreement:
    """How closely a quantised embedder's vectors match the float one's."""

    texts: int
    #: Mean and worst cosine between a text's two vectors.
    mean_cosine: float
    min_cosine: float
    #: Share of calibration queries whose nearest passage is the same under both.
    top1: float

    @property
    def level(self) -> float:
        """What the threshold is compared with."""
        return self.mean_cosine

    def __str__(self) -> str:
        return (
            f"cosine to the float vectors mean {self.mean_cosine:.4f} (min "
            f"{self.min_cosine:.4f}) over {self.texts} texts, same nearest passage for "
            f"{self.top1:.0%} of queries"
        )


def calibration_texts(queries: int = 8, documents: int = 24) -> tuple[list[str], list[str]]:
    """(queries, passages) from the bundled sample, spread over the whole (multilingual)
    collection."""
    groups = calibration_groups(queries, documents)
    return [group[0][0] for group in groups], [passage for _, passage in groups[0]]


def vector_agreement(
    reference: tuple[NDArray[np.floating], NDArray[np.floating]],
    candidate: tuple[NDArray[np.floating], NDArray[np.floating]],
) -> VectorAgreement:
    """Compare two embedders' L2-normalised (query, passage) vectors of the same texts."""
    cosines = np.concatenate(
        [np.sum(r * c, axis=1) for r, c in zip(reference, candidate, strict=True)]
    )
    nearest = [
        np.argmax(queries @ passages.T, axis=1) for queries, passages in (reference, candidate)
    ]
    return VectorAgreement(
        texts=len(cosines),
        mean_cosine=float(np.mean(cosines)),
        min_cosine=float(np.min(cosines)),
        top1=float(np.mean(nearest[0] == nearest[1])),
    )


def calibration_groups(queries: int = 8, documents: int = 12) -> list[list[Pair]]:
    """(query, passage) pairs from the bundled sample: each query against the same documents,
    spread over the whole (multilingual) collection."""
    with open_text(SAMPLE_DATASET / "queries.jsonl") as lines:
        texts = [str(json.loads(line)["text"]) for line in islice(lines, queries)]
    corpus = list(read_jsonl_documents(SAMPLE_DATASET / "corpus.jsonl"))
    step = max(GATE_STRIDE, len(corpus) // documents // GATE_STRIDE * GATE_STRIDE)
    passages = [f"{d.title} {d.text}".strip() for d in corpus[::step][:documents]]
    return [[(query, passage) for passage in passages] for query in texts]


#: Every `GATE_STRIDE`-th passage of the sample, and its first `GATE_QUERIES` queries, are
#: the agreement gate's (`calibration_texts`, `calibration_groups`); static quantisation
#: calibrates on the rest (`held_out_texts`), so the gate measures texts it was not fit to.
GATE_STRIDE = 5
GATE_QUERIES = 8


def _sample() -> tuple[list[str], list[str]]:
    """(queries, passages) of the whole bundled sample."""
    with open_text(SAMPLE_DATASET / "queries.jsonl") as lines:
        queries = [str(json.loads(line)["text"]) for line in lines]
    corpus = read_jsonl_documents(SAMPLE_DATASET / "corpus.jsonl")
    return queries, [f"{d.title} {d.text}".strip() for d in corpus]


def held_out_texts() -> tuple[list[str], list[str]]:
    """(queries, passages) of the sample that no agreement gate reads: what static
    quantisation calibrates on."""
    queries, passages = _sample()
    return queries[GATE_QUERIES:], [p for i, p in enumerate(passages) if i % GATE_STRIDE]


def held_out_groups(documents: int = 12) -> list[list[Pair]]:
    """Each held-out query against `documents` held-out passages, a different slice each, so
    that the calibration pairs cover the whole multilingual sample."""
    queries, passages = held_out_texts()
    return [
        [(query, passages[(n * documents + k) % len(passages)]) for k in range(documents)]
        for n, query in enumerate(queries)
    ]


def require_floor(
    agreement: Measured, *, role: Role, model_id: str, backend: str, floor: float
) -> None:
    """A `ModelLoadError` naming the role's settings when `agreement` is below `floor`."""
    setting = env_name(role.setting("backend"))
    threshold = env_name(role.setting("min_agreement"))
    if agreement.level < floor:
        raise ModelLoadError(
            f"The {backend} {role.label} model {model_id!r} is too far from the float one "
            f"({agreement}); {threshold} is {floor:g}. Set {setting}=torch, or lower "
            f"{threshold} if that is acceptable."
        )


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


class Measured(Protocol):
    @property
    def level(self) -> float: ...
