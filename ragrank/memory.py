"""Whether a set of models fits the device, checked before any of them loads.

A model's weights are sized from its files (safetensors headers give every tensor's shape, so
the size in the dtype it will run in is exact; other weight files count by their bytes). The
sum must fit a share of the device's free memory, the rest being left to the batches: a set
that does not fit is refused at start-up with the figures, rather than failing on its first
large batch or being killed by the kernel.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ragrank.errors import ModelLoadError
from ragrank.loading import local_model_folder
from ragrank.settings import env_name

if TYPE_CHECKING:
    from collections.abc import Sequence

#: Bytes per element of the dtypes models run in.
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
_GIB = 1024**3


@dataclass(frozen=True)
class ModelSize:
    name: str
    #: Bytes of weights in the dtype the model runs in; None when its files are not here yet.
    weights: int | None


def model_folder(model_id: str) -> Path | None:
    """The folder a model loads from: its local folder, else its snapshot in the Hugging Face
    cache; None when it is not on this machine yet."""
    local = local_model_folder(model_id)
    if local is not None:
        return local
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(model_id, local_files_only=True))
    except Exception:
        return None


def _safetensors_elements(path: Path) -> int:
    """Elements of every tensor in a safetensors file, read from its header alone."""
    with path.open("rb") as handle:
        (length,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(length))
    total = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        count = 1
        for dimension in entry["shape"]:
            count *= int(dimension)
        total += count
    return total


def weights_bytes(model_id: str, dtype: str) -> int | None:
    """Bytes of the model's weights in `dtype`, from its files; None when they are absent."""
    folder = model_folder(model_id)
    if folder is None:
        return None
    tensors = sorted(folder.rglob("*.safetensors"))
    if tensors:
        return sum(_safetensors_elements(p) for p in tensors) * DTYPE_BYTES.get(dtype, 4)
    others = [*folder.rglob("*.bin"), *folder.rglob("*.pt")]
    return sum(p.stat().st_size for p in others) or None


def available_bytes(device: str) -> int:
    """Free memory on `device`: the GPU's free memory, or the host's available memory."""
    if device.startswith("cuda"):
        import torch

        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return int(free)
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def check_fits(
    sizes: Sequence[ModelSize], *, device: str, dtype: str, share: float, free: int
) -> None:
    """A `ModelLoadError` with the figures when the models' weights exceed `share` of `free`."""
    known = [s for s in sizes if s.weights is not None]
    needed = sum(s.weights or 0 for s in known)
    allowed = int(free * share)
    if needed <= allowed:
        return
    parts = ", ".join(f"{s.name} {(s.weights or 0) / _GIB:.2f} GiB" for s in known)
    raise ModelLoadError(
        f"The served models need {needed / _GIB:.2f} GiB of weights in {dtype} ({parts}), but "
        f"{device} has {free / _GIB:.2f} GiB free and {env_name('model_memory_share')}={share:g} "
        f"allows {allowed / _GIB:.2f} GiB for weights. Serve fewer or smaller models "
        f"({env_name('rerank_models')}, {env_name('embed_models')}), or raise "
        f"{env_name('model_memory_share')}."
    )
