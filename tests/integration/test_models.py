from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import numpy as np
import pytest

from ragrank.backends.models import CrossEncoderScorer, SentenceTransformerEmbedder
from ragrank.device import resolve_placement
from ragrank.errors import ModelLoadError
from ragrank.protocols import relevance
from ragrank.settings import Settings

if TYPE_CHECKING:
    from pathlib import Path


def test_embedder_applies_role_prefixes(embedder, tiny_embedder_path):
    from sentence_transformers import SentenceTransformer

    raw = SentenceTransformer(str(tiny_embedder_path), device="cpu")
    text = "Wo mündet der Rhein?"
    expected_query = raw.encode(["query: " + text], normalize_embeddings=True)
    expected_passage = raw.encode(["passage: " + text], normalize_embeddings=True)
    np.testing.assert_allclose(embedder.embed_queries([text]), expected_query, atol=1e-5)
    np.testing.assert_allclose(embedder.embed_passages([text]), expected_passage, atol=1e-5)
    assert not np.allclose(expected_query, expected_passage)


def test_embedder_without_prefixes_encodes_the_bare_text(tiny_embedder_path):
    from sentence_transformers import SentenceTransformer

    bare = SentenceTransformerEmbedder(
        str(tiny_embedder_path),
        query_prefix="",
        passage_prefix="",
        placement=resolve_placement("cpu"),
    )
    raw = SentenceTransformer(str(tiny_embedder_path), device="cpu")
    np.testing.assert_allclose(
        bare.embed_queries(["plain"]), raw.encode(["plain"], normalize_embeddings=True), atol=1e-5
    )


def test_embeddings_are_unit_length_float32_and_batched(embedder):
    texts = [f"document number {i} " * (i % 7 + 1) for i in range(70)]  # > 2 batches of 32
    vectors = embedder.embed_passages(texts)
    assert vectors.shape == (70, embedder.dimension)
    assert vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    # Batch composition does not change a text's vector.
    np.testing.assert_allclose(embedder.embed_passages(texts[5:6]), vectors[5:6], atol=1e-5)
    assert embedder.embed_passages([]).shape == (0, embedder.dimension)


def test_token_spans_point_into_the_text(embedder):
    text = "Espresso is brewed under pressure. 咖啡因是一种兴奋剂。"
    spans = embedder.token_spans(text)
    assert spans, "a non-empty text has tokens"
    assert all(0 <= start <= end <= len(text) for start, end in spans)
    assert spans == sorted(spans)
    assert "".join(text[s:e] for s, e in spans).replace(" ", "") == text.replace(" ", "")


def test_scorer_gives_one_float32_logit_per_passage_independent_of_batching(scorer):
    passages = [f"passage {i} " + "word " * (i * 3) for i in range(40)]  # > 2 batches of 16
    logits = scorer.score("a query", passages)
    assert logits.shape == (40,)
    assert logits.dtype == np.float32
    alone = np.array([scorer.score("a query", [p])[0] for p in passages[:5]])
    np.testing.assert_allclose(alone, logits[:5], atol=1e-4)
    assert scorer.score("a query", []).shape == (0,)


def test_scorer_truncates_inputs_longer_than_the_model_limit(scorer):
    very_long = "token " * 5000
    logits = scorer.score("query", [very_long, "short"])
    assert np.isfinite(logits).all()


def test_relevance_is_a_sigmoid_that_does_not_saturate_early():
    logits = np.array([-30.0, 0.0, 8.0, 12.0], dtype=np.float16)
    scores = relevance(logits)
    assert scores.dtype == np.float64
    assert scores[1] == pytest.approx(0.5)
    assert 0 < scores[0] < 1e-12
    assert scores[2] < scores[3] < 1.0  # float16 sigmoid would give 1.0 for both


@pytest.mark.parametrize(
    ("factory", "variable"),
    [
        (SentenceTransformerEmbedder.from_settings, "RAGRANK_EMBED_MODEL"),
        (CrossEncoderScorer.from_settings, "RAGRANK_RERANK_MODEL"),
    ],
)
def test_missing_hub_model_names_the_model_and_the_setting(factory, variable):
    # conftest sets HF_HUB_OFFLINE=1: like an unreachable hub with nothing cached.
    model = "intfloat/no-such-model-for-ragrank-tests"
    settings = Settings(embed_model=model, rerank_model=model, device="cpu")
    with pytest.raises(ModelLoadError) as caught:
        factory(settings)
    assert model in str(caught.value)
    assert variable in str(caught.value)


def test_missing_local_folder_names_the_setting(tmp_path: Path):
    missing = str(tmp_path / "nowhere")
    with pytest.raises(ModelLoadError, match="RAGRANK_EMBED_MODEL"):
        SentenceTransformerEmbedder.from_settings(Settings(embed_model=missing, device="cpu"))


def test_a_multi_label_classifier_is_refused(tmp_path: Path, tiny_reranker_path: Path):
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

    config = AutoConfig.from_pretrained(tiny_reranker_path, num_labels=3)
    model = AutoModelForSequenceClassification.from_config(config)
    model.save_pretrained(tmp_path / "three")
    AutoTokenizer.from_pretrained(tiny_reranker_path).save_pretrained(tmp_path / "three")
    with pytest.raises(ModelLoadError, match="one-logit"):
        CrossEncoderScorer.from_settings(
            Settings(rerank_model=str(tmp_path / "three"), device="cpu")
        )


def test_test_models_build_without_the_shared_tokenizer(tmp_path: Path):
    """Where ../shared is absent the fixtures train their own tokenizer; that path must work."""
    from tests.conftest import build_tiny_embedder, build_tiny_reranker

    settings = Settings(
        embed_model=str(build_tiny_embedder(tmp_path / "e5", use_shared=False)),
        rerank_model=str(build_tiny_reranker(tmp_path / "rr", use_shared=False)),
        device="cpu",
    )
    embedder = SentenceTransformerEmbedder.from_settings(settings)
    assert embedder.embed_queries(["Wo mündet der Rhein?"]).shape == (1, 32)
    assert CrossEncoderScorer.from_settings(settings).score("q", ["a", "b"]).shape == (2,)


def test_cuda_failures_become_the_errors_the_engine_acts_on():
    import torch

    from ragrank.backends.models import device_errors
    from ragrank.errors import BatchTooLargeError, ModelFailedError

    with pytest.raises(BatchTooLargeError), device_errors():
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    with pytest.raises(ModelFailedError), device_errors():
        raise RuntimeError("CUDA error: device-side assert triggered")
    with pytest.raises(RuntimeError, match="shape mismatch"), device_errors():
        raise RuntimeError("shape mismatch")


async def test_the_engine_splits_a_real_scorer_batch_on_simulated_oom(scorer, monkeypatch):
    """The real model path: out-of-memory on batches over 3 pairs; every score still arrives."""
    import torch

    from ragrank.engine import BatchEngine, EngineLimits

    pairs = [("query", f"passage number {i} " + "x " * i) for i in range(10)]
    expected = scorer.score_pairs(pairs)
    forward = scorer._model.forward
    refused: list[int] = []

    def forward_that_runs_out_of_memory(*args, **kwargs):
        if kwargs["input_ids"].shape[0] > 3:
            refused.append(kwargs["input_ids"].shape[0])
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return forward(*args, **kwargs)

    monkeypatch.setattr(scorer._model, "forward", forward_that_runs_out_of_memory)
    engine = BatchEngine(
        "rerank",
        collate=scorer.collate,
        run=lambda batch: scorer.forward(batch).tolist(),
        limits=EngineLimits(max_batch_size=16, max_batch_tokens=100_000, max_wait_ms=0),
    )
    engine.start()
    try:
        scores = await engine.submit(scorer.tokens.pairs(pairs))
    finally:
        await engine.stop()
    assert refused[0] == 10  # the first batch held all ten pairs and was split
    np.testing.assert_allclose(scores, expected, atol=1e-4)


def test_windows_fit_the_model_and_the_query_takes_at_most_a_quarter(scorer):
    document = " ".join(f"Sentence {i} is about rivers." for i in range(400))
    query = "Which rivers flow north? " * 200
    plan = scorer.plan_windows(query, ["a short document", document])
    assert plan.owners.count(0) == 1
    assert plan.owners.count(1) > 1
    assert max(plan.lengths) == scorer.max_length  # full windows use the whole budget
    query_ids = scorer.tokens.ids([query])[0]
    assert plan.query_tokens == (scorer.max_length - 4) // 4  # XLM-R adds 4 special tokens
    document_ids = scorer.tokens.ids([document])[0]
    windows = [i for i, owner in zip(plan.inputs, plan.owners, strict=True) if owner == 1]
    body = slice(1 + plan.query_tokens + 2, -1)  # <s> query </s></s> window </s>
    for item in windows:
        assert item.ids[1 : 1 + plan.query_tokens] == query_ids[: plan.query_tokens]
    first, second = windows[0].ids[body], windows[1].ids[body]
    assert first == document_ids[: len(first)]
    # Neighbouring windows overlap by a quarter: the second starts inside the first.
    stride = len(first) - len(first) // 4
    assert document_ids[stride : stride + len(second)] == second
    cut = scorer.plan_windows("q", [document], max_tokens_per_doc=30)
    assert len(cut.inputs) == 1
    assert len(cut.inputs[0]) - cut.query_tokens - 4 == 30


def test_planning_and_scoring_can_run_on_different_threads_at_once(scorer):
    """A fast tokenizer shared by two threads fails ("Already borrowed", or tensors built with
    the other call's truncation settings); each thread tokenises with its own copy."""
    documents = ["word " * (50 + i) for i in range(32)]
    pairs = [("a query", d) for d in documents]
    errors: list[BaseException] = []

    def repeat(function, times: int) -> None:
        try:
            for _ in range(times):
                function()
        except Exception as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=repeat, args=(lambda: scorer.score_pairs(pairs[:4]), 30)),
        threading.Thread(target=repeat, args=(lambda: scorer.plan_windows("q", documents), 200)),
        threading.Thread(target=repeat, args=(lambda: scorer.tokens.pairs(pairs), 200)),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[0]


def test_each_host_thread_tokenises_with_its_own_tokenizer_copy(scorer):
    copies: list[object] = []

    def take() -> None:
        copies.append(scorer.tokens._own())
        assert scorer.tokens._own() is copies[-1]  # kept for the thread's life

    threads = [threading.Thread(target=take) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len({id(c) for c in copies}) == 3
    assert scorer.tokens._backend not in copies


def test_warm_up_runs_the_forward_over_its_shapes(scorer, embedder):
    """On a CPU: two short inputs, the way the model runs."""
    assert scorer.warm_up(16, 8192) == 2
    assert embedder.warm_up(16, 8192) == 2
