"""Protocol fakes for the two model roles: deterministic, instant, no torch."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

from ragrank.models import Pair, TokenSpans, WindowPlan

_WORD = re.compile(r"\S+")


class FakeEmbedder:
    """Bag-of-words hashing into 64 dimensions: texts sharing words get similar vectors."""

    model_id = "fake-embedder"
    dimension = 64
    max_length = 512
    query_prefix = "query: "
    passage_prefix = "passage: "

    def __init__(self) -> None:
        self.seen: list[str] = []

    def embed_queries(self, texts: Sequence[str]) -> NDArray[np.float32]:
        return self._embed([self.query_prefix + t for t in texts])

    def embed_passages(self, texts: Sequence[str]) -> NDArray[np.float32]:
        return self._embed([self.passage_prefix + t for t in texts])

    def token_spans(self, text: str) -> TokenSpans:
        return [(m.start(), m.end()) for m in _WORD.finditer(text)]

    def text_lengths(self, texts: Sequence[str]) -> list[int]:
        return [len(text.split()) + 2 for text in texts]

    def embed_batch(self, texts: Sequence[str]) -> NDArray[np.float32]:
        return self._embed(list(texts))

    def _embed(self, texts: list[str]) -> NDArray[np.float32]:
        self.seen.extend(texts)
        vectors = np.zeros((len(texts), self.dimension), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in text.lower().split()[1:]:  # skip the role prefix
                digest = hashlib.blake2b(word.encode(), digest_size=4).digest()
                vectors[row, int.from_bytes(digest, "little") % self.dimension] += 1.0
            vectors[row, 0] += 1e-3  # never a zero vector
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


class FakeScorer:
    """Scores a passage by its length, so the reranked order is known in advance."""

    model_id = "fake-scorer"

    def __init__(self) -> None:
        #: Each forward pass's pairs, in the order the engine sent them.
        self.batches: list[list[Pair]] = []

    def score(self, query: str, passages: Sequence[str]) -> NDArray[np.float32]:
        return self.score_pairs([(query, passage) for passage in passages])

    def pair_lengths(self, pairs: Sequence[Pair]) -> list[int]:
        return [_pair_length(pair) for pair in pairs]

    def plan_windows(
        self, query: str, documents: Sequence[str], max_tokens_per_doc: int | None = None
    ) -> WindowPlan:
        """Windows of 64 words, 48 apart; a document is cut at `max_tokens_per_doc` words."""
        pairs, owners = [], []
        for index, document in enumerate(documents):
            words = document.split()[: max_tokens_per_doc or None]
            for start in range(0, max(len(words) - 16, 1), 48):
                pairs.append((query, " ".join(words[start : start + 64])))
                owners.append(index)
        return WindowPlan(pairs=pairs, owners=owners, lengths=[_pair_length(p) for p in pairs])

    def score_pairs(self, pairs: Sequence[Pair]) -> NDArray[np.float32]:
        self.batches.append(list(pairs))
        return np.array([len(passage) / 20.0 - 3.0 for _, passage in pairs], dtype=np.float32)


def _pair_length(pair: Pair) -> int:
    query, passage = pair
    return len(query.split()) + len(passage.split()) + 3
