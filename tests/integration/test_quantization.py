"""The int8 CPU backend: quantised layers, the rank-agreement check that gates it, its settings."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pytest
import torch

import ragrank.backends.models
from ragrank.backends.models import CrossEncoderScorer
from ragrank.backends.quantization import Agreement, calibration_groups, rank_agreement
from ragrank.device import resolve_placement
from ragrank.errors import ModelLoadError, SettingsError
from ragrank.settings import Settings

if TYPE_CHECKING:
    from pathlib import Path


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


def test_calibration_groups_pair_each_query_with_the_same_documents():
    groups = calibration_groups(queries=3, documents=5)
    assert len(groups) == 3
    assert all(len(group) == 5 for group in groups)
    assert [p for _, p in groups[0]] == [p for _, p in groups[2]]
    assert len({q for q, _ in groups[0]}) == 1


def test_int8_backend_quantises_linear_layers_and_reports_agreement(tiny_reranker_path: Path):
    placement = resolve_placement("cpu")
    exact = CrossEncoderScorer(str(tiny_reranker_path), placement=placement)
    int8 = CrossEncoderScorer(
        str(tiny_reranker_path), placement=placement, backend="int8", min_agreement=-1.0
    )
    assert exact.agreement is None
    agreement = int8.agreement
    assert agreement is not None and agreement.queries == 8 and agreement.pairs == 96
    int8_linear = torch.ao.nn.quantized.dynamic.Linear
    quantised = [m for m in int8._model.modules() if isinstance(m, int8_linear)]
    assert quantised, "no linear layer runs in int8"
    pairs = [("a query", f"passage {i} " + "word " * i) for i in range(10)]
    reference, scores = exact.score_pairs(pairs), int8.score_pairs(pairs)
    assert scores.dtype == np.float32 and scores.shape == (10,)
    assert not np.array_equal(reference, scores), "int8 changed nothing"
    assert np.abs(reference - scores).max() < 0.5


def test_int8_backend_is_refused_below_the_agreement_threshold(
    tiny_reranker_path: Path, monkeypatch: pytest.MonkeyPatch
):
    poor = Agreement(
        queries=8, pairs=96, mean_spearman=0.4, min_spearman=0.1, top1=0.5, max_abs_diff=1.0
    )
    monkeypatch.setattr(ragrank.backends.models, "checked_agreement", lambda *_: poor)
    with pytest.raises(ModelLoadError) as error:
        CrossEncoderScorer(
            str(tiny_reranker_path),
            placement=resolve_placement("cpu"),
            backend="int8",
            min_agreement=0.9,
        )
    message = str(error.value)
    assert "RAGRANK_RERANK_MIN_AGREEMENT" in message and "RAGRANK_RERANK_BACKEND" in message
    assert "0.400" in message


def test_int8_backend_is_cpu_only(scorer: CrossEncoderScorer, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(scorer._runner, "device", "cuda")
    with pytest.raises(ModelLoadError, match="RAGRANK_RERANK_BACKEND=int8 runs on the CPU only"):
        scorer._use_int8(0.9)


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        (
            "RAGRANK_RERANK_BACKEND",
            "onnx",
            "RAGRANK_RERANK_BACKEND must be one of auto, torch, int8, openvino, openvino-int8",
        ),
        (
            "RAGRANK_BATCHING",
            "fifo",
            "RAGRANK_BATCHING must be one of continuous, window, arrival, request",
        ),
        ("RAGRANK_RERANK_MIN_AGREEMENT", "high", "must be a number"),
        ("RAGRANK_RERANK_MIN_AGREEMENT", "1.5", "must be between -1 and 1"),
    ],
)
def test_backend_and_batching_settings_are_checked(variable: str, value: str, message: str):
    with pytest.raises(SettingsError, match=message):
        Settings.from_env({variable: value})


def test_backend_and_batching_settings_are_read():
    settings = Settings.from_env(
        {
            "RAGRANK_RERANK_BACKEND": "int8",
            "RAGRANK_BATCHING": "arrival",
            "RAGRANK_RERANK_MIN_AGREEMENT": "0.95",
        }
    )
    assert (settings.rerank_backend, settings.batching) == ("int8", "arrival")
    assert settings.rerank_min_agreement == 0.95
