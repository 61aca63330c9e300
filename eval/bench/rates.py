"""What the model-only benchmarks share: forward passes timed alone, on the device, and the
SciFact requests they score."""

from __future__ import annotations

import random
import time
from typing import TYPE_CHECKING

import torch

from ragrank.beir import load_beir
from ragrank.engine import cut, longest_first

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from pathlib import Path

    from ragrank.backends.models import CrossEncoderScorer, SentenceTransformerEmbedder
    from ragrank.tokens import ModelInput


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(work: Callable[[], object], device: str, repeat: int = 1) -> float:
    """Seconds per call of `work`, the device synchronised around it."""
    sync(device)
    started = time.perf_counter()
    for _ in range(repeat):
        work()
    sync(device)
    return (time.perf_counter() - started) / repeat


def forward_rate(
    model: CrossEncoderScorer | SentenceTransformerEmbedder,
    inputs: Sequence[ModelInput],
    *,
    packed: bool,
    budget: int,
    device: str,
) -> float:
    """Sequences/s of the forward passes alone (length-sorted batches under the token budget,
    collated beforehand)."""
    lengths = [len(item) for item in inputs]
    order = longest_first(lengths)
    collated = [
        model.collate([inputs[order[i]] for i in range(run.start, run.stop)], packed=packed)
        for run in cut([lengths[i] for i in order], 4096, budget, packed=packed)
    ]
    model.forward(collated[0])  # warm-up
    seconds = timed(lambda: [model.forward(batch) for batch in collated], device)
    return len(inputs) / seconds


def scifact_requests(data: Path, queries: int, documents: int) -> list[tuple[str, list[str]]]:
    """Each query against `documents` random abstracts (title and text)."""
    dataset = load_beir(data)
    rng = random.Random(0)
    texts = [f"{d.title} {d.text}".strip() for d in dataset.corpus.values()]
    chosen = rng.sample(sorted(dataset.queries.values()), min(queries, len(dataset.queries)))
    return [(query, rng.sample(texts, min(documents, len(texts)))) for query in chosen]
