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


@pytest.mark.parametrize(("bf16", "expected"), [(True, torch.bfloat16), (False, torch.float16)])
def test_auto_on_cuda_is_bf16_where_the_gpu_has_it_else_fp16(monkeypatch, bf16, expected):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: bf16)
    placement = resolve_placement("auto", "auto")
    assert (placement.device, placement.dtype) == ("cuda", expected)
    assert resolve_placement("cuda:1", "auto").dtype == expected
    # An explicit dtype still wins on CUDA.
    assert resolve_placement("cuda", "float32").dtype == torch.float32
