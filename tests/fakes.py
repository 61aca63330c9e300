"""Protocol fakes for the two model roles: deterministic, instant, no torch.

They tokenise by whitespace into ids of their own vocabulary, so the engine carries real
`ModelInput`s, and their `collate` turns ids back into words for the scoring rule."""

from __future__ import annotations

import dataclasses
import hashlib
import re
import threading
from typing import TYPE_CHECKING, Any

import numpy as np

from ragrank.inference import Inference
from ragrank.settings import Settings
from ragrank.tokens import ModelInput, TokenSpans, WindowPlan

if TYPE_CHECKING:
    from collections.abc import Sequence

    from numpy.typing import NDArray

    from ragrank.protocols import Pair
    from server.services import Services

_WORD = re.compile(r"\S+")
#: Special ids: start, separator and end of an input.
START, SEP, END = 0, 1, 2


class _Vocabulary:
    """Words to ids and back; shared by threads."""

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}
        self._words: list[str] = ["<s>", "</s>", "<end>"]
        self._lock = threading.Lock()
        #: Thread names that tokenised, for tests that check where host work runs.
        self.threads: list[str] = []

    def ids(self, text: str) -> list[int]:
        with self._lock:
            self.threads.append(threading.current_thread().name)
            out = []
            for word in text.split():
                if word not in self._ids:
                    self._ids[word] = len(self._words)
                    self._words.append(word)
                out.append(self._ids[word])
            return out

    def text(self, ids: Sequence[int]) -> str:
        return " ".join(self._words[i] for i in ids)


class Launches:
    """The fakes launch and fetch in one step (a CPU model's forward is synchronous), and
    count their warm-ups without running any pass."""

    warm_ups = 0

    def upload(self, batch: Any) -> Any:
        return batch

    def launch(self, batch: Any) -> Any:
        return self.forward(batch)  # type: ignore[attr-defined]

    def fetch(self, launched: Any) -> Any:
        return launched

    def warm_up(self, batch_items: int, batch_tokens: int) -> int:
        self.warm_ups += 1
        return 0


class FakeEmbedder(Launches):
    """Bag-of-words hashing into 64 dimensions: texts sharing words get similar vectors."""

    model_id = "fake-embedder"
    backend = "torch"
    dimension = 64
    max_length = 512
    query_prefix = "query: "
    passage_prefix = "passage: "
    packed = False

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.vocabulary = _Vocabulary()

    def embed_queries(self, texts: Sequence[str]) -> NDArray[np.float32]:
        return self._embed([self.query_prefix + t for t in texts])

    def embed_passages(self, texts: Sequence[str]) -> NDArray[np.float32]:
        return self._embed([self.passage_prefix + t for t in texts])

    def token_spans(self, text: str) -> TokenSpans:
        return [(m.start(), m.end()) for m in _WORD.finditer(text)]

    def encode_texts(self, texts: Sequence[str]) -> list[ModelInput]:
        return [ModelInput([START, *self.vocabulary.ids(text), END]) for text in texts]

    def collate(self, inputs: Sequence[ModelInput]) -> list[str]:
        return [self.vocabulary.text(item.ids[1:-1]) for item in inputs]

    def forward(self, batch: list[str]) -> NDArray[np.float32]:
        return self._embed(batch)

    def _embed(self, texts: list[str]) -> NDArray[np.float32]:
        self.seen.extend(texts)
        vectors = np.zeros((len(texts), self.dimension), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in text.lower().split()[1:]:  # skip the role prefix
                digest = hashlib.blake2b(word.encode(), digest_size=4).digest()
                vectors[row, int.from_bytes(digest, "little") % self.dimension] += 1.0
            vectors[row, 0] += 1e-3  # never a zero vector
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


class FakeScorer(Launches):
    """Scores a passage by its length, so the reranked order is known in advance."""

    model_id = "fake-scorer"
    packed = False

    def __init__(self) -> None:
        #: Each forward pass's pairs, in the order the engine sent them.
        self.batches: list[list[Pair]] = []
        self.vocabulary = _Vocabulary()

    def score(self, query: str, passages: Sequence[str]) -> NDArray[np.float32]:
        return self.score_pairs([(query, passage) for passage in passages])

    def plan_windows(
        self, query: str, documents: Sequence[str], max_tokens_per_doc: int | None = None
    ) -> WindowPlan:
        """Windows of 64 words, 48 apart; a document is cut at `max_tokens_per_doc` words."""
        query_ids = self.vocabulary.ids(query)
        inputs, owners = [], []
        for index, document in enumerate(documents):
            words = self.vocabulary.ids(document)[: max_tokens_per_doc or None]
            for start in range(0, max(len(words) - 16, 1), 48):
                window = words[start : start + 64]
                inputs.append(ModelInput([START, *query_ids, SEP, *window, END]))
                owners.append(index)
        return WindowPlan(inputs=inputs, owners=owners)

    def collate(self, inputs: Sequence[ModelInput]) -> list[Pair]:
        pairs = []
        for item in inputs:
            cut = item.ids.index(SEP)
            pairs.append(
                (
                    self.vocabulary.text(item.ids[1:cut]),
                    self.vocabulary.text(item.ids[cut + 1 : -1]),
                )
            )
        return pairs

    def forward(self, batch: list[Pair]) -> NDArray[np.float32]:
        return self.score_pairs(batch)

    def score_pairs(self, pairs: Sequence[Pair]) -> NDArray[np.float32]:
        self.batches.append(list(pairs))
        return np.array([len(passage) / 20.0 - 3.0 for _, passage in pairs], dtype=np.float32)


class ShortFirstScorer(FakeScorer):
    """A second reranker that ranks the other way round: short passages first."""

    model_id = "fake-short-first"

    def score_pairs(self, pairs: Sequence[Pair]) -> NDArray[np.float32]:
        return -super().score_pairs(pairs)


class NarrowEmbedder(FakeEmbedder):
    """A second embedder with vectors of another length."""

    model_id = "fake-narrow-embedder"
    dimension = 16


def fake_inference(
    settings: Settings | None = None,
    *,
    embedders: Sequence[Any] | None = None,
    rerankers: Sequence[Any] | None = None,
) -> Inference:
    """An inference over fakes (a `FakeEmbedder` and a `FakeScorer` unless given), each model
    configured by `settings`' values for its role."""
    return Inference.of(
        settings or Settings(),
        embedders=[FakeEmbedder()] if embedders is None else embedders,
        rerankers=[FakeScorer()] if rerankers is None else rerankers,
    )


def swap_models(
    services: Services,
    settings: Settings | None = None,
    *,
    embedders: Sequence[Any] | None = None,
    rerankers: Sequence[Any] | None = None,
) -> Services:
    """`services` with another inference: the given models (else the same ones) under
    `settings`."""
    inference = services.inference
    return dataclasses.replace(
        services,
        inference=Inference.of(
            settings or Settings(),
            embedders=list(inference.embedders) if embedders is None else embedders,
            rerankers=list(inference.rerankers) if rerankers is None else rerankers,
        ),
    )
