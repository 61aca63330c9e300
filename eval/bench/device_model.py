"""A calibrated device model: a reranker whose forward pass is replaced by the time a measured
GPU takes for the same tokens, so that the server's own path (HTTP, tokenizer, engine,
collation) can be measured against a device on a machine without one.

A pass of `tokens` real tokens (packed) takes `tokens / rate + launch` seconds, divided by
`speed`, and sleeps that long without holding the interpreter lock, as a forward pass on a GPU
leaves the host free. Everything else is the real reranker: its tokenizer, its window plan and
its packed collation.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ragrank.backends.packing import PackedBatch
from ragrank.engine import cut

if TYPE_CHECKING:
    from collections.abc import Sequence

    from numpy.typing import NDArray

    from ragrank.backends.models import CrossEncoderScorer, SentenceTransformerEmbedder
    from ragrank.protocols import Pair
    from ragrank.tokens import ModelInput, TokenSpans, WindowPlan

#: The H200 figures the model is fitted to (bge-reranker-v2-m3 shape, bf16, packed, torch
#: varlen, 32,768-token batches): pairs/s at SciFact lengths (mean 380 tokens a pair).
H200_SCIFACT_PAIRS_PER_S = 1_847.0
H200_SCIFACT_MEAN_TOKENS = 380.0
H200_BATCH_TOKENS = 32_768
#: The fixed cost of one pass. Every measured row ran full 32k-token batches, so the table
#: cannot separate it from the rate; 1.5 ms (3 % of a full batch) is the eager launch cost of a
#: 24-layer encoder's kernels, and it makes a stream of tiny batches cost what it does.
H200_LAUNCH_S = 0.0015


@dataclass(frozen=True)
class DeviceModel:
    """Seconds a packed forward pass takes on the modelled device."""

    #: Real tokens per second of the forward pass.
    rate: float
    #: Seconds every pass costs, whatever its size.
    launch: float
    #: The device's speed against the one measured (2.0: twice as fast); 0 means instant.
    speed: float = 1.0

    def seconds(self, tokens: int) -> float:
        if self.speed == 0:
            return 0.0
        return (tokens / self.rate + self.launch) / self.speed

    def capacity(self, lengths: Sequence[int], items: int, budget: int) -> float:
        """Pairs/s of the device alone over `lengths` in full packed batches: the most any
        server can deliver on it."""
        runs = cut(lengths, items, budget, packed=True)
        seconds = sum(self.seconds(sum(lengths[run])) for run in runs)
        return len(lengths) / seconds if seconds else float("inf")

    @classmethod
    def h200(cls, speed: float = 1.0) -> DeviceModel:
        """Fitted so that full 32k-token batches of SciFact pairs run at the measured rate."""
        pairs = H200_BATCH_TOKENS / H200_SCIFACT_MEAN_TOKENS
        batch_s = pairs / H200_SCIFACT_PAIRS_PER_S
        return cls(
            rate=H200_BATCH_TOKENS / (batch_s - H200_LAUNCH_S), launch=H200_LAUNCH_S, speed=speed
        )


class DeviceModelScorer:
    """A real reranker's host side with the device model's forward pass (a `Scorer`)."""

    packed = True
    backend = "device-model"

    def __init__(self, scorer: CrossEncoderScorer, device: DeviceModel) -> None:
        self._scorer = scorer
        self.device = device
        self.model_id = scorer.model_id
        self.tokens = scorer.tokens
        self.max_length = scorer.max_length

    def plan_windows(
        self, query: str, documents: Sequence[str], max_tokens_per_doc: int | None = None
    ) -> WindowPlan:
        return self._scorer.plan_windows(query, documents, max_tokens_per_doc)

    def collate(self, inputs: Sequence[ModelInput]) -> PackedBatch:
        batch = self._scorer.collate(inputs, packed=True)
        assert isinstance(batch, PackedBatch)
        return batch

    def upload(self, batch: PackedBatch) -> PackedBatch:
        """The copy to the device is part of the modelled pass."""
        return batch

    def launch(self, batch: PackedBatch) -> NDArray[np.float32]:
        """Sleep for the pass's device time (`time.sleep` releases the interpreter lock)."""
        time.sleep(self.device.seconds(batch.bounds[-1]))
        return np.zeros(batch.count, dtype=np.float32)

    def fetch(self, launched: NDArray[np.float32]) -> NDArray[np.float32]:
        return launched

    def forward(self, batch: Any) -> NDArray[np.float32]:
        return self.fetch(self.launch(batch))

    def score(self, query: str, passages: Sequence[str]) -> NDArray[np.float32]:
        return self.score_pairs([(query, passage) for passage in passages])

    def score_pairs(self, pairs: Sequence[Pair]) -> NDArray[np.float32]:
        return self.forward(self.collate(self.tokens.pairs(pairs)))

    def warm_up(self, batch_items: int, batch_tokens: int) -> int:
        """Nothing to warm: the modelled device has no start-up cost."""
        return 0


class DeviceModelEmbedder:
    """A real embedder's host side (tokenizer, token spans, packed collation) with the device
    model's forward pass (an `Embedder`): its vectors are stand-ins, one per input and fixed by
    its ids, so that a search still finds what an identical text was indexed with; what it
    measures is time, never meaning."""

    packed = True

    def __init__(self, embedder: SentenceTransformerEmbedder, device: DeviceModel) -> None:
        self._embedder = embedder
        self.device = device
        self.model_id = embedder.model_id
        self.dimension = embedder.dimension
        self.max_length = embedder.max_length
        self.query_prefix = embedder.query_prefix
        self.passage_prefix = embedder.passage_prefix
        self.backend = "device-model"

    def token_spans(self, text: str) -> TokenSpans:
        return self._embedder.token_spans(text)

    def encode_texts(self, texts: Sequence[str]) -> list[ModelInput]:
        return self._embedder.encode_texts(texts)

    def collate(self, inputs: Sequence[ModelInput]) -> tuple[PackedBatch, list[int]]:
        batch = self._embedder.collate(inputs, packed=True)
        assert isinstance(batch, PackedBatch)
        return batch, [hash(tuple(item.ids)) % 2**32 for item in inputs]

    def upload(self, batch: tuple[PackedBatch, list[int]]) -> tuple[PackedBatch, list[int]]:
        return batch

    def launch(self, batch: tuple[PackedBatch, list[int]]) -> NDArray[np.float32]:
        """Sleep for the pass's device time (`time.sleep` releases the interpreter lock)."""
        packed, seeds = batch
        time.sleep(self.device.seconds(packed.bounds[-1]))
        vectors = np.stack(
            [np.random.default_rng(seed).standard_normal(self.dimension) for seed in seeds]
        ).astype(np.float32)
        normalised: NDArray[np.float32] = vectors / np.linalg.norm(vectors, axis=1, keepdims=True)
        return normalised

    def fetch(self, launched: NDArray[np.float32]) -> NDArray[np.float32]:
        return launched

    def forward(self, batch: Any) -> NDArray[np.float32]:
        return self.fetch(self.launch(batch))

    def embed_queries(self, texts: Sequence[str]) -> NDArray[np.float32]:
        return self.forward(self.collate(self.encode_texts([self.query_prefix + t for t in texts])))

    def embed_passages(self, texts: Sequence[str]) -> NDArray[np.float32]:
        inputs = self.encode_texts([self.passage_prefix + t for t in texts])
        return self.forward(self.collate(inputs))

    def warm_up(self, batch_items: int, batch_tokens: int) -> int:
        """Nothing to warm: the modelled device has no start-up cost."""
        return 0
