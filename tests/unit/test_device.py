from __future__ import annotations

import pytest
import torch

from ragrank.device import resolve_placement
from ragrank.errors import SettingsError


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback")
def test_auto_is_cpu_fp32_without_cuda_and_cuda_is_refused():
    placement = resolve_placement("auto", "auto")
    assert (placement.device, placement.dtype) == ("cpu", torch.float32)
    with pytest.raises(SettingsError, match="RAGRANK_DEVICE=cuda"):
        resolve_placement("cuda")


def test_an_explicit_dtype_wins():
    assert resolve_placement("cpu", "bfloat16").dtype == torch.bfloat16
