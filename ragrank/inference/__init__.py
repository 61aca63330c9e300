"""The one place that runs models: each served model's typed spec, its engine, and what the
doors ask of them. Backends load the models (`ragrank.backends.serving`); the doors call
`Inference`."""

from ragrank.cascade import Cascade
from ragrank.inference.core import (
    CascadeOutcome,
    CascadeStage,
    EmbedOutcome,
    EngineEmbedder,
    Inference,
    ModelPlacement,
    RerankOutcome,
    best_windows,
    first_windows,
)
from ragrank.inference.served import Served, pick
from ragrank.inference.spec import ModelSpec, ModelSpecs, model_specs, read_models_file, role_spec

__all__ = [
    "Cascade",
    "CascadeOutcome",
    "CascadeStage",
    "EmbedOutcome",
    "EngineEmbedder",
    "Inference",
    "ModelPlacement",
    "ModelSpec",
    "ModelSpecs",
    "RerankOutcome",
    "Served",
    "best_windows",
    "first_windows",
    "model_specs",
    "pick",
    "read_models_file",
    "role_spec",
]
