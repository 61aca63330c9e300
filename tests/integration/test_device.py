"""Device placement with the tiny models: half precision on CUDA (bf16 where the GPU has it,
else fp16, as `ragrank/device.py` says), float32 scores out."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ragrank.device import resolve_placement
from ragrank.models import CrossEncoderScorer, SentenceTransformerEmbedder
from ragrank.settings import Settings


@pytest.mark.gpu
def test_on_cuda_models_run_in_half_precision_and_scores_come_back_float32(
    tiny_embedder_path, tiny_reranker_path
):
    settings = Settings(
        embed_model=str(tiny_embedder_path), rerank_model=str(tiny_reranker_path), device="auto"
    )
    half = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    assert resolve_placement(settings.device).dtype == half
    scorer = CrossEncoderScorer.from_settings(settings)
    passages = ["a short passage", "another, somewhat longer passage of text"]
    logits = scorer.score("query", passages)
    assert logits.dtype == np.float32
    on_cpu = CrossEncoderScorer.from_settings(settings.replace(device="cpu"))
    np.testing.assert_allclose(logits, on_cpu.score("query", passages), atol=2e-2)
    vectors = SentenceTransformerEmbedder.from_settings(settings).embed_passages(passages)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-3)
