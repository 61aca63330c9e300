"""The eval suite's runs: exact search, reranking of the top candidates, the embedding cache."""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING

import numpy as np
import pytest

from eval.embedding_cache import EmbeddingCache, cache_key
from eval.exact import ExactIndex
from eval.runs import overlap_recall, ranked, rerank_run
from ragrank.inference import Inference
from ragrank.settings import Settings
from tests.fakes import FakeEmbedder, FakeScorer

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path


def normalised(rng: np.random.Generator, rows: int, dim: int = 16) -> np.ndarray:
    vectors = rng.normal(size=(rows, dim)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def test_exact_index_returns_numpys_brute_force_top_k():
    rng = np.random.default_rng(0)
    passages, queries = normalised(rng, 300), normalised(rng, 7)
    scores, rows = ExactIndex(passages, gpu=False).search(queries, 10)
    expected = np.argsort(-(queries @ passages.T), axis=1)[:, :10]
    np.testing.assert_array_equal(rows, expected)
    np.testing.assert_allclose(
        scores, np.take_along_axis(queries @ passages.T, expected, 1), atol=1e-5
    )
    # k beyond the corpus is capped rather than padded with -1 rows.
    assert ExactIndex(passages[:5], gpu=False).search(queries, 100)[1].shape == (7, 5)


@contextmanager
def _offline(scorer: FakeScorer, *, batch_size: int) -> Iterator[Inference]:
    """An offline inference of the fake scorer, running on its own loop."""
    settings = Settings(rerank_batch_size=batch_size, rerank_batch_tokens=10_000)
    inference = Inference.of(settings, embedders=[FakeEmbedder()], rerankers=[scorer], offline=True)
    with inference.running():
        yield inference


def test_rerank_orders_the_candidates_by_score_and_keeps_the_rest_below():
    first_stage = {"q": {f"d{i}": 1.0 - i / 10 for i in range(6)}}
    # FakeScorer scores by passage length: longer first.
    passages = {f"d{i}": "word " * (1 + i) for i in range(6)}
    scorer = FakeScorer()
    with _offline(scorer, batch_size=2) as inference:
        run, pairs = rerank_run(
            inference, {"q": "query"}, first_stage, passages, candidates=3, progress=False
        )
    assert ranked(run["q"]) == ["d2", "d1", "d0", "d3", "d4", "d5"]
    assert pairs == 3


def test_a_long_document_scores_its_best_window():
    scorer = FakeScorer()
    long_document = " ".join(["x"] * 100 + ["y" * 80])  # the second window holds the long word
    passages = {"long": long_document, "short": "tiny"}
    with _offline(scorer, batch_size=8) as inference:
        run, pairs = rerank_run(
            inference,
            {"q": "query"},
            {"q": {"long": 0.5, "short": 0.9}},
            passages,
            candidates=2,
            progress=False,
        )
    windows = [p for batch in scorer.batches for _, p in batch if p != "tiny"]
    assert len(windows) >= 2 and pairs == len(windows) + 1
    assert run["q"]["long"] == pytest.approx(max(len(w) / 20.0 - 3.0 for w in windows))


def test_overlap_recall_counts_the_exact_top_k_found():
    exact = {"a": {"1": 0.9, "2": 0.8, "3": 0.7}, "b": {"4": 0.9, "5": 0.1}}
    approximate = {"a": {"1": 0.9, "3": 0.7, "9": 0.5}, "b": {"5": 0.2, "4": 0.1}}
    assert overlap_recall(approximate, exact, 2) == pytest.approx((1 / 2 + 2 / 2) / 2)
    assert overlap_recall(exact, exact, 3) == 1.0


def test_the_cache_key_covers_what_changes_the_vectors(tmp_path: Path):
    model = tmp_path / "model"
    model.mkdir()
    (model / "weights.bin").write_bytes(b"1234")
    base = {
        "model_id": str(model),
        "passage_prefix": "passage: ",
        "corpus_checksum": "abc",
        "max_length": 512,
    }
    key = cache_key(**base)
    assert cache_key(**base) == key
    for change in ({"passage_prefix": ""}, {"corpus_checksum": "abd"}, {"max_length": 256}):
        assert cache_key(**{**base, **change}) != key
    (model / "weights.bin").write_bytes(b"12345")  # the same folder, other weights
    assert cache_key(**base) != key


def test_the_cache_returns_what_it_stored_for_the_same_documents_only(tmp_path: Path):
    cache = EmbeddingCache(tmp_path / "cache")
    vectors = np.arange(6, dtype=np.float32).reshape(3, 2)
    assert cache.load("k", ["a", "b", "c"]) is None
    cache.save("k", ["a", "b", "c"], vectors)
    np.testing.assert_array_equal(cache.load("k", ["a", "b", "c"]), vectors)
    assert cache.load("k", ["a", "c", "b"]) is None
    assert not list((tmp_path / "cache").glob(".*tmp"))
