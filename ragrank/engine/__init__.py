"""The batching engine that the server and the eval drive: one queue per model, batches formed
under a token budget by one cost rule, forward passes on the model's own thread, and where the
time goes. It knows no torch and no HTTP: a model is a few callables."""

from ragrank.engine.core import (
    BatchEngine,
    BatchStats,
    DeviceLoad,
    DeviceTurns,
    embedding_engine,
    scoring_engine,
)
from ragrank.engine.scheduling import EngineLimits, batch_cost, cut, longest_first
from ragrank.engine.timings import STAGES, DeviceClock, StageTotals

__all__ = [
    "STAGES",
    "BatchEngine",
    "BatchStats",
    "DeviceClock",
    "DeviceLoad",
    "DeviceTurns",
    "EngineLimits",
    "StageTotals",
    "batch_cost",
    "cut",
    "embedding_engine",
    "longest_first",
    "scoring_engine",
]
