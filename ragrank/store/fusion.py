"""Hybrid fusion that knows which passages BM25 can read.

BM25 matches words, so it can only judge a passage written in the query's language. Qdrant's
fusion cannot know that: a translation of the answer that the dense list ranks first scores
nothing in the BM25 list, exactly as an irrelevant passage does, and the query's own-language
lexical matches are lifted above it. Here a passage whose stored language differs from the
query's takes, in BM25's place, the dense list's judgement of it scaled by `other_languages`
(or BM25's own, when BM25 found it anyway and ranked it higher). Below 1, a passage both
lists agree on still comes before a translation the dense list likes as much. Passages in
the query's language, and those of no known language, are fused exactly as Qdrant fuses
them: the same RRF and DBSF formulas, so a one-language collection gets Qdrant's answer.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ragrank.language import declared_language
from ragrank.settings import Settings

if TYPE_CHECKING:
    from collections.abc import Collection, Mapping, Sequence


class FusionSettings(Protocol):
    """The settings a `Fusion` is built from (`Settings`, and the eval's options)."""

    @property
    def fusion(self) -> str: ...
    @property
    def rrf_k(self) -> int: ...
    @property
    def rrf_dense_weight(self) -> float: ...
    @property
    def rrf_sparse_weight(self) -> float: ...
    @property
    def fusion_other_languages(self) -> float: ...


#: Each fusion field and the setting it comes from; the defaults are the settings' own.
_SETTINGS = {
    "method": "fusion",
    "k": "rrf_k",
    "dense_weight": "rrf_dense_weight",
    "sparse_weight": "rrf_sparse_weight",
    "other_languages": "fusion_other_languages",
}
_DEFAULTS: dict[str, Any] = {f.name: f.default for f in dataclasses.fields(Settings)}


@dataclass(frozen=True)
class Fusion:
    """How hybrid retrieval merges its dense and sparse lists: `rrf` (reciprocal rank
    fusion, `1 / (k + rank)` summed, ranks from 0) or `dbsf` (scores normalised by their
    distribution). RRF weighs each list as Qdrant does, dividing its 1-based positions by the
    list's weight: `1 / (k + (rank + 1) / weight - 1)`."""

    method: str = _DEFAULTS["fusion"]
    k: int = _DEFAULTS["rrf_k"]
    dense_weight: float = _DEFAULTS["rrf_dense_weight"]
    sparse_weight: float = _DEFAULTS["rrf_sparse_weight"]
    #: Given the query's languages, how much of BM25's part a passage in another language
    #: takes from the dense list instead (see `fuse_by_language`); 0 fuses as Qdrant does.
    other_languages: float = _DEFAULTS["fusion_other_languages"]

    @classmethod
    def from_settings(cls, settings: FusionSettings) -> Fusion:
        """The fusion the settings (or the eval's options) configure."""
        return cls(**{field: getattr(settings, name) for field, name in _SETTINGS.items()})

    def override(self, **changes: Any) -> Fusion:
        """This fusion with a request's choices; a None choice keeps the configured value."""
        return dataclasses.replace(self, **{k: v for k, v in changes.items() if v is not None})

    @property
    def weights(self) -> list[float] | None:
        """Qdrant's RRF weights, in prefetch order (dense, then sparse); None when equal."""
        if self.dense_weight == self.sparse_weight == 1.0:
            return None
        return [self.dense_weight, self.sparse_weight]


#: A search hit as an engine returns it: its payload and its score.
Hit = tuple["Mapping[str, Any]", float]


def fuse_by_language(
    dense: Sequence[Hit],
    sparse: Sequence[Hit],
    fusion: Fusion,
    languages: Collection[str],
    limit: int,
) -> list[Hit]:
    """The two lists fused, each passage outside `languages` (the query's) taking part of its
    BM25 share from the dense list; the best `limit`, ties by document and chunk."""
    dense_share = _shares(dense, fusion, fusion.dense_weight)
    sparse_share = _shares(sparse, fusion, fusion.sparse_weight)
    # The dense list's judgement, weighted as BM25's would be, scaled.
    stand_in = _shares(dense, fusion, fusion.sparse_weight)
    payloads: dict[tuple[str, int], Mapping[str, Any]] = {}
    for payload, _ in [*dense, *sparse]:
        payloads.setdefault(_key(payload), payload)
    fused: list[Hit] = []
    for key, payload in payloads.items():
        lexical = sparse_share.get(key, 0.0)
        if not readable(payload, languages):
            lexical = max(lexical, fusion.other_languages * stand_in.get(key, 0.0))
        fused.append((payload, dense_share.get(key, 0.0) + lexical))
    fused.sort(key=lambda hit: (-hit[1], *_key(hit[0])))
    return fused[:limit]


def readable(payload: Mapping[str, Any], languages: Collection[str]) -> bool:
    """Whether BM25 could match the passage: it is in one of the query's languages, or in no
    language its metadata names."""
    language = declared_language(payload.get("metadata") or {})
    return language is None or language in languages


def _key(payload: Mapping[str, Any]) -> tuple[str, int]:
    return str(payload.get("doc_id", "")), int(payload.get("chunk", 0))


def _shares(hits: Sequence[Hit], fusion: Fusion, weight: float) -> dict[tuple[str, int], float]:
    """Each hit's part of the fused score, as Qdrant computes it: RRF's weighted reciprocal
    rank, or DBSF's score scaled by the list's mean ± 3 sample standard deviations."""
    keys = [_key(payload) for payload, _ in hits]
    if fusion.method == "rrf":
        return {key: 1.0 / (fusion.k + (rank + 1) / weight - 1) for rank, key in enumerate(keys)}
    scores = np.array([score for _, score in hits], dtype=np.float32)
    if len(scores) < 2:
        return dict.fromkeys(keys, 0.5)
    mean, spread = float(scores.mean()), 3.0 * float(scores.std(ddof=1))
    if spread == 0.0:
        return dict.fromkeys(keys, 0.5)
    low = mean - spread
    return {key: (float(s) - low) / (2 * spread) for key, s in zip(keys, scores, strict=True)}
