"""Fitting a reranker's calibration (Platt scaling) and measuring reliability (expected
calibration error). The served side only applies a fitted calibration
(`ragrank.calibration`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from scipy.optimize import minimize

from ragrank.calibration import Calibration, probabilities

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from eval.metrics import Run
    from ragrank.beir import Qrels

#: Equal-width probability bins of the expected calibration error.
ECE_BINS = 10


def fit_platt(logits: Sequence[float], labels: Sequence[int], fitted_on: str = "") -> Calibration:
    """a and b of sigmoid(a·logit + b) minimising the log loss on (logit, 0/1 label) pairs,
    with Platt's smoothed targets so that a separable sample does not send a to infinity."""
    x = np.asarray(logits, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64)
    positives, negatives = float(y.sum()), float(len(y) - y.sum())
    if not positives or not negatives:
        raise ValueError("a calibration needs relevant and non-relevant pairs both")
    target = np.where(y > 0, (positives + 1) / (positives + 2), 1 / (negatives + 2))

    def loss(params: np.ndarray) -> tuple[float, np.ndarray]:
        z = params[0] * x + params[1]
        p = 1.0 / (1.0 + np.exp(-z))
        eps = 1e-12
        value = -np.mean(target * np.log(p + eps) + (1 - target) * np.log(1 - p + eps))
        residual = p - target
        return float(value), np.array([np.mean(residual * x), np.mean(residual)])

    found = minimize(loss, np.array([1.0, 0.0]), jac=True, method="L-BFGS-B")
    return Calibration(a=float(found.x[0]), b=float(found.x[1]), fitted_on=fitted_on)


def expected_calibration_error(
    scores: Sequence[float] | np.ndarray, labels: Sequence[int] | np.ndarray
) -> float:
    """The mean gap between predicted probability and observed relevance, over equal-width
    bins weighted by the pairs in each (0: perfectly reliable)."""
    p = np.asarray(scores, dtype=np.float64)
    y = np.asarray(labels, dtype=np.float64)
    if not len(p):
        return 0.0
    bins = np.minimum((p * ECE_BINS).astype(int), ECE_BINS - 1)
    error = 0.0
    for b in range(ECE_BINS):
        mask = bins == b
        if mask.any():
            error += mask.sum() / len(p) * abs(p[mask].mean() - y[mask].mean())
    return float(error)


def labelled_pairs(
    qrels: Qrels, logits: Mapping[str, Mapping[str, float]]
) -> tuple[list[float], list[int]]:
    """Every (query, document) logit with its 0/1 label from `qrels`."""
    values: list[float] = []
    labels: list[int] = []
    for qid, docs in logits.items():
        relevant = qrels.get(qid, {})
        for doc_id, logit in docs.items():
            values.append(float(logit))
            labels.append(int(relevant.get(doc_id, 0) > 0))
    return values, labels


def reliability(qrels: Qrels, logits: Run, calibration: Calibration | None) -> dict[str, float]:
    """ECE of the plain sigmoid and of the calibration (when there is one) on the reranked
    pairs of `logits`, with the pairs and the share relevant."""
    values, labels = labelled_pairs(qrels, logits)
    report = {
        "pairs": float(len(values)),
        "relevant_share": float(np.mean(labels)) if labels else 0.0,
        "ece_sigmoid": expected_calibration_error(probabilities(values, None), labels),
    }
    if calibration is not None:
        report["ece_calibrated"] = expected_calibration_error(
            probabilities(values, calibration), labels
        )
    return report
