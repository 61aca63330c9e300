"""Choosing the torch device and dtype from the `device` and `dtype` settings."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ragrank.errors import SettingsError
from ragrank.settings import DTYPES

if TYPE_CHECKING:
    import torch

#: oneDNN's variable: how many compiled CPU kernels (primitives) it keeps, one per input shape.
ONEDNN_CACHE_VARIABLE = "ONEDNN_PRIMITIVE_CACHE_CAPACITY"


@dataclass(frozen=True)
class Placement:
    device: str
    dtype: torch.dtype


def resolve_placement(device: str = "auto", dtype: str = "auto") -> Placement:
    """`auto` picks CUDA when present, in bf16 (fp16 on GPUs without bf16), else the CPU in
    fp32. torch is imported here, not at module level, so that the server's light modules can
    size batches without it until a model is loaded."""
    import torch

    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SettingsError(f"RAGRANK_DEVICE={device} but CUDA is not available here")
    if dtype == "auto":
        if not device.startswith("cuda"):
            return Placement(device, torch.float32)
        half = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return Placement(device, half)
    if dtype not in DTYPES:
        raise SettingsError(f"RAGRANK_DTYPE must be one of {', '.join(DTYPES)}")
    return Placement(device, getattr(torch, dtype))


def batch_limits(placement: Placement, size: int = 0, tokens: int = 0) -> tuple[int, int]:
    """(items, tokens) per forward pass; 0 means the device's default. Tokens are padded ones,
    or real ones when batches are packed. A GPU wants large batches to stay busy (32k tokens:
    `make bench-gpu` sweeps the budget); on two CPU cores 16 pairs per batch reranked 50
    candidates in 1.07 s against 1.27 s with 32 (`python -m eval.bench.query`,
    docs/performance.md)."""
    gpu = placement.device.startswith("cuda")
    return size or (256 if gpu else 16), tokens or (32_768 if gpu else 8_192)


def bound_kernel_cache(capacity: int) -> None:
    """Set oneDNN's primitive cache for this process, unless its own variable is set. Each batch
    shape compiles and keeps its own CPU kernels, and a server sees thousands of shapes: at
    oneDNN's default (1,024) a CPU server's memory climbs for tens of minutes before it
    levels off. oneDNN reads the variable at its first kernel, so this comes before any
    model runs."""
    os.environ.setdefault(ONEDNN_CACHE_VARIABLE, str(capacity))
