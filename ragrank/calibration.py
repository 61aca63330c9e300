"""Scores that mean something: a reranker's logit turned into an estimated probability of
relevance by Platt scaling, sigmoid(a·logit + b), with a and b fitted on the model's own
validation queries and saved beside its weights (`calibration.json`).

A raw logit means something different for each model (and each fine-tuning run), so a
threshold chosen on one is wrong for the next; a calibrated score of 0.7 means "about 70 %
of such pairs were relevant" on the data it was fitted on. A model without the file keeps
the plain sigmoid of its logit."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from collections.abc import Sequence

    from numpy.typing import NDArray

CALIBRATION_FILE = "calibration.json"


@dataclass(frozen=True)
class Calibration:
    """Platt scaling of one model's logits."""

    a: float
    b: float
    #: What it was fitted on, in words (the report's).
    fitted_on: str = ""

    def probabilities(self, logits: NDArray[np.floating] | Sequence[float]) -> NDArray[np.float64]:
        return sigmoid(self.a * np.asarray(logits, dtype=np.float64) + self.b)


def sigmoid(values: NDArray[np.floating] | Sequence[float]) -> NDArray[np.float64]:
    """Computed in float64 so that large logits do not saturate early."""
    return np.asarray(1.0 / (1.0 + np.exp(-np.asarray(values, dtype=np.float64))))


def probabilities(
    logits: NDArray[np.floating] | Sequence[float], calibration: Calibration | None
) -> NDArray[np.float64]:
    """The served relevance score of each logit: calibrated when the model has a calibration,
    else its plain sigmoid."""
    if calibration is None:
        return sigmoid(logits)
    return calibration.probabilities(logits)


def read_calibration(model: str) -> Calibration | None:
    """The calibration saved in a local model folder, or None (a hub id, or no file)."""
    path = Path(model) / CALIBRATION_FILE
    if not path.is_file():
        return None
    data = json.loads(path.read_text(encoding="utf-8"))
    return Calibration(
        a=float(data["a"]), b=float(data["b"]), fitted_on=str(data.get("fitted_on", ""))
    )


def write_calibration(folder: Path, calibration: Calibration, details: dict[str, Any]) -> Path:
    """Save a calibration beside a model's weights, with what it was measured on."""
    path = folder / CALIBRATION_FILE
    path.write_text(
        json.dumps({"method": "platt", **asdict(calibration), **details}, indent=2) + "\n",
        encoding="utf-8",
    )
    return path
