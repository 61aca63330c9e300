"""The cascade: a fast reranker scores every candidate, and the default (large) reranker
rescores only the fast one's top K. The rule lives here once; the server's search and the
eval both apply it.

The order it gives: the shortlist in the large model's order, then the rest in the fast
model's. Each document keeps the score of the model that placed it, both calibrated
probabilities where the models have a calibration (`ragrank.calibration`).

With a blend (`ragrank.blend`) each stage listens to the first stage too: the shortlist is the
best K of the fast model's order blended with the first stage's, and the large model's order
over it is blended with the first stage's as well. A fast model weaker than the first stage
then cannot keep from the large one what the first stage ranked high."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ragrank.blend import reranked_order
from ragrank.errors import SettingsError

if TYPE_CHECKING:
    from collections.abc import Sequence


@dataclass(frozen=True)
class Cascade:
    """Which served reranker filters (`model`), and how many of its best the default one
    rescores (`top`)."""

    model: str
    top: int

    @classmethod
    def parse(cls, text: str, where: str) -> Cascade | None:
        """`NAME:K` (e.g. `student:10`); empty means no cascade. `where` names the setting or
        field in the error."""
        text = text.strip()
        if not text:
            return None
        name, _, top = text.rpartition(":")
        if not name or not top.strip().isdigit() or int(top) < 1:
            raise SettingsError(
                f"{where}={text!r}: expected NAME:K, a served reranker's name and the number "
                "(at least 1) of its best candidates the default reranker rescores"
            )
        return cls(model=name.strip(), top=int(top))


def shortlist(first: Sequence[float], top: int, blend: float = 0.0) -> list[int]:
    """The indices of the `top` best fast-model scores, best first (ties: input order, which
    is the first stage's); with `blend`, the best of their order blended with the first
    stage's."""
    return reranked_order(first, blend)[:top]


@dataclass(frozen=True)
class CascadeOrder:
    """The cascade's answer: document indices best first, each one's score, and which stage
    placed it (`second` for the shortlist the large model rescored)."""

    order: list[int]
    scores: list[float]
    second: list[bool]


def cascade_order(
    first: Sequence[float], short: Sequence[int], second: Sequence[float], blend: float = 0.0
) -> CascadeOrder:
    """Merge the two stages: `short` (indices, from `shortlist`) ordered by `second` (their
    scores from the large model, in `short`'s order), then every other document by `first`;
    with `blend`, each of the two orders blended with the first stage's (the indices' order).
    Scores are whatever scale the caller passes (logits, or probabilities)."""
    if blend:
        by_position = sorted(range(len(short)), key=lambda j: short[j])
        picked = reranked_order([second[j] for j in by_position], blend)
        rescored = [(short[by_position[p]], second[by_position[p]]) for p in picked]
    else:  # stable: ties keep the fast model's order
        rescored = sorted(zip(short, second, strict=True), key=lambda pair: -pair[1])
    chosen = set(short)
    rest = [i for i in shortlist(first, len(first), blend) if i not in chosen]
    return CascadeOrder(
        order=[i for i, _ in rescored] + rest,
        scores=[float(s) for _, s in rescored] + [float(first[i]) for i in rest],
        second=[True] * len(rescored) + [False] * len(rest),
    )
