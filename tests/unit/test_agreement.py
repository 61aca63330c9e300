"""The agreement gate's measures, its calibration texts, and the backend settings."""

from __future__ import annotations

import numpy as np
import pytest

from eval.embedding_cache import cache_key
from ragrank.backends.agreement import (
    calibration_groups,
    calibration_texts,
    held_out_groups,
    held_out_texts,
    rank_agreement,
    vector_agreement,
)
from ragrank.errors import SettingsError
from ragrank.settings import Settings

#: The least mean cosine to the float vectors that the embedder's default gate accepts.
FLOOR = 0.99


def test_rank_agreement_measures_per_query_rankings():
    a = [np.array([3.0, 2.0, 1.0]), np.array([0.1, 0.5, 0.9, 0.2])]
    same = rank_agreement(a, [x * 2 + 1 for x in a])  # monotone: same rankings
    assert same.mean_spearman == pytest.approx(1.0)
    assert same.top1 == 1.0
    assert same.queries == 2 and same.pairs == 7
    flipped = rank_agreement(a, [-x for x in a])
    assert flipped.mean_spearman == pytest.approx(-1.0)
    assert flipped.top1 == 0.0
    assert flipped.max_abs_diff == pytest.approx(6.0)


def test_vector_agreement_falls_below_the_floor_on_vectors_that_moved():
    """The floor, on vectors moved as far as a poor quantisation would move them."""
    rng = np.random.default_rng(0)
    reference = rng.normal(size=(40, 32)).astype(np.float32)
    reference /= np.linalg.norm(reference, axis=1, keepdims=True)
    noise = rng.normal(size=reference.shape).astype(np.float32)
    moved = reference + 0.2 * noise / np.linalg.norm(noise, axis=1, keepdims=True)
    moved /= np.linalg.norm(moved, axis=1, keepdims=True)
    half = len(reference) // 2
    split = (reference[:half], reference[half:])
    assert vector_agreement(split, (moved[:half], moved[half:])).mean_cosine < FLOOR
    same = vector_agreement(split, split)
    assert same.mean_cosine == pytest.approx(1.0) and same.top1 == 1.0


def test_calibration_groups_pair_each_query_with_the_same_documents():
    groups = calibration_groups(queries=3, documents=5)
    assert len(groups) == 3
    assert all(len(group) == 5 for group in groups)
    assert [p for _, p in groups[0]] == [p for _, p in groups[2]]
    assert len({q for q, _ in groups[0]}) == 1


def test_calibration_texts_span_the_sample():
    queries, passages = calibration_texts()
    assert len(queries) == 8 and len(passages) == 24
    assert len(set(passages)) == 24


def test_quantisation_never_calibrates_on_the_gates_texts():
    queries, passages = calibration_texts()
    held_queries, held_passages = held_out_texts()
    assert not set(queries) & set(held_queries) and not set(passages) & set(held_passages)
    gate_pairs = {pair for group in calibration_groups() for pair in group}
    held_pairs = [pair for group in held_out_groups() for pair in group]
    assert held_pairs and not gate_pairs & set(held_pairs)
    assert len({passage for _, passage in held_pairs}) > 50


def test_the_eval_cache_keeps_each_backends_vectors_apart():
    base = {"model_id": "m", "passage_prefix": "p", "corpus_checksum": "c", "max_length": 512}
    assert cache_key(**base) == cache_key(**base, backend="torch")
    assert cache_key(**base, backend="openvino:f32") != cache_key(**base)


@pytest.mark.parametrize("role", ["EMBED", "RERANK"])
@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("onnx", "BACKEND must be one of auto, torch, openvino, openvino-int8"),
        ("int8", "BACKEND=int8, ragrank's own int8 recipe, was removed: openvino-int8"),
    ],
)
def test_the_backend_settings_are_checked(role: str, value: str, message: str):
    with pytest.raises(SettingsError, match=message):
        Settings.from_env({f"RAGRANK_{role}_BACKEND": value})


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        (
            "RAGRANK_BATCHING",
            "fifo",
            "RAGRANK_BATCHING must be one of continuous, window, arrival, request",
        ),
        ("RAGRANK_RERANK_MIN_AGREEMENT", "high", "must be a number"),
        ("RAGRANK_RERANK_MIN_AGREEMENT", "1.5", "must be between -1 and 1"),
        ("RAGRANK_EMBED_MIN_AGREEMENT", "2", "must be between -1 and 1"),
    ],
)
def test_batching_and_agreement_settings_are_checked(variable: str, value: str, message: str):
    with pytest.raises(SettingsError, match=message):
        Settings.from_env({variable: value})


def test_backend_and_batching_settings_are_read():
    settings = Settings.from_env(
        {
            "RAGRANK_RERANK_BACKEND": "openvino-int8",
            "RAGRANK_EMBED_BACKEND": "openvino",
            "RAGRANK_BATCHING": "arrival",
            "RAGRANK_RERANK_MIN_AGREEMENT": "0.95",
        }
    )
    assert (settings.rerank_backend, settings.embed_backend) == ("openvino-int8", "openvino")
    assert settings.batching == "arrival" and settings.rerank_min_agreement == 0.95
    assert Settings.from_env({}).embed_backend == "auto"
