"""Device placement with the tiny models: half precision on CUDA (bf16 where the GPU has it,
else fp16, as `ragrank/device.py` says), float32 scores out."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ragrank.backends.models import CrossEncoderScorer, SentenceTransformerEmbedder
from ragrank.device import resolve_placement
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


@pytest.mark.gpu
def test_on_a_cuda_machine_the_exact_search_is_faiss_gpu_and_agrees_with_its_cpu_index():
    """`make setup` installs faiss-gpu where it finds a GPU; its GPU index returns the CPU
    index's top 100."""
    from eval.exact import ExactIndex, faiss_build

    build = faiss_build()
    assert (build.distribution, build.on_gpu) == ("faiss-gpu", True), build.describe()
    rng = np.random.default_rng(0)
    passages = rng.standard_normal((5000, 384)).astype(np.float32)
    passages /= np.linalg.norm(passages, axis=1, keepdims=True)
    queries = passages[rng.choice(5000, 50, replace=False)] + 0.1 * rng.standard_normal((50, 384))
    _, on_gpu = ExactIndex(passages, gpu=True).search(queries, 100)
    _, on_cpu = ExactIndex(passages, gpu=False).search(queries, 100)
    assert all(set(a) == set(b) for a, b in zip(on_gpu, on_cpu, strict=True))
