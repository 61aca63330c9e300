"""The int8 embedder backend: its vectors against the float model's, the floor that gates it,
the stamp that re-indexes on a switch, and its settings."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pytest
import torch

import ragrank.backends.models
from eval.embedding_cache import cache_key
from indexing import Indexer
from ragrank.backends.models import SentenceTransformerEmbedder
from ragrank.backends.quantization import (
    INT8_RECIPE,
    FullRangeLinear,
    VectorAgreement,
    calibration_texts,
    outlier_layers,
    quantize_int8,
    vector_agreement,
)
from ragrank.documents import Document
from ragrank.errors import ModelLoadError, SettingsError
from ragrank.settings import Settings
from ragrank.store import open_store

if TYPE_CHECKING:
    from pathlib import Path

    from ragrank.protocols import Vectors

#: The least cosine between a text's float and int8 vectors these tests accept.
FLOOR = 0.99
TEXTS = [f"passage {i}: " + "ein Wort, a word, 一个词 " * (i % 7 + 1) for i in range(40)]


def cosines(reference: Vectors, candidate: Vectors) -> np.ndarray:
    return np.asarray(np.sum(reference * candidate, axis=1))


@pytest.fixture(scope="module")
def int8_embedder(tiny_embedder_path: Path) -> SentenceTransformerEmbedder:
    return SentenceTransformerEmbedder.from_settings(
        Settings(embed_model=str(tiny_embedder_path), device="cpu", embed_backend="int8")
    )


def test_int8_vectors_agree_with_the_float_model(
    embedder: SentenceTransformerEmbedder, int8_embedder: SentenceTransformerEmbedder
):
    int8_linear = torch.ao.nn.quantized.dynamic.Linear
    assert any(isinstance(m, int8_linear) for m in int8_embedder._encoder.modules())
    assert not any(isinstance(m, int8_linear) for m in embedder._encoder.modules())
    reference, vectors = embedder.embed_passages(TEXTS), int8_embedder.embed_passages(TEXTS)
    assert vectors.dtype == np.float32 and vectors.shape == reference.shape
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert not np.array_equal(reference, vectors), "int8 changed nothing"
    assert cosines(reference, vectors).min() >= FLOOR
    agreement = int8_embedder.agreement
    assert agreement is not None and agreement.texts == 32 and agreement.mean_cosine >= FLOOR
    assert embedder.agreement is None
    assert (embedder.backend, int8_embedder.backend) == ("torch", INT8_RECIPE)


def test_the_floor_fails_on_vectors_that_moved(embedder: SentenceTransformerEmbedder):
    """The same floor, on vectors moved as far as a poor quantisation would move them."""
    reference = embedder.embed_passages(TEXTS)
    noise = np.random.default_rng(0).normal(size=reference.shape).astype(np.float32)
    moved = reference + 0.2 * noise / np.linalg.norm(noise, axis=1, keepdims=True)
    moved /= np.linalg.norm(moved, axis=1, keepdims=True)
    assert cosines(reference, moved).min() < FLOOR
    half = len(TEXTS) // 2
    agreement = vector_agreement((reference[:half], reference[half:]), (moved[:half], moved[half:]))
    assert agreement.mean_cosine < FLOOR
    assert vector_agreement(
        (reference[:half], reference[half:]), (reference[:half], reference[half:])
    ).mean_cosine == pytest.approx(1.0)


def test_an_int8_embedder_below_the_floor_is_refused(
    tiny_embedder_path: Path, monkeypatch: pytest.MonkeyPatch
):
    poor = VectorAgreement(texts=32, mean_cosine=0.95, min_cosine=0.9, top1=0.5)
    monkeypatch.setattr(ragrank.backends.models, "vector_agreement", lambda *_: poor)
    with pytest.raises(ModelLoadError) as error:
        SentenceTransformerEmbedder.from_settings(
            Settings(embed_model=str(tiny_embedder_path), device="cpu", embed_backend="int8")
        )
    message = str(error.value)
    assert "RAGRANK_EMBED_MIN_AGREEMENT" in message and "RAGRANK_EMBED_BACKEND=torch" in message
    assert "0.9500" in message and "0.99" in message


def test_the_int8_embedder_is_cpu_only(
    embedder: SentenceTransformerEmbedder, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr(embedder._runner, "device", "cuda:0")
    with pytest.raises(ModelLoadError) as error:
        embedder._use_int8(FLOOR)
    assert "RAGRANK_EMBED_BACKEND=int8 runs on the CPU only" in str(error.value)
    assert "RAGRANK_EMBED_BACKEND=torch on cuda:0" in str(error.value)
    assert embedder.backend == "torch" and embedder.agreement is None


def test_switching_the_backend_re_embeds_every_document(
    settings: Settings,
    embedder: SentenceTransformerEmbedder,
    int8_embedder: SentenceTransformerEmbedder,
):
    documents = [Document(doc_id=f"d{i}", text=f"Document {i} says something.") for i in range(3)]
    store = open_store(settings)
    try:
        float_indexer = Indexer.from_settings(settings, embedder, store)
        int8_indexer = Indexer.from_settings(settings, int8_embedder, store)
        assert float_indexer.content_hash(documents[0]) != int8_indexer.content_hash(documents[0])
        assert float_indexer.index(documents, progress=False).new == 3
        assert int8_indexer.index(documents, progress=False).updated == 3
        assert int8_indexer.index(documents, progress=False).unchanged == 3
        assert float_indexer.index(documents, progress=False).updated == 3
    finally:
        store.close()


def test_the_float_stamp_is_the_one_earlier_releases_wrote(
    settings: Settings, embedder: SentenceTransformerEmbedder
):
    """Adding the backend to the recipe must not re-index collections indexed before it."""
    import hashlib
    import json

    store = open_store(settings)
    try:
        indexer = Indexer.from_settings(settings, embedder, store)
    finally:
        store.close()
    document = Document(doc_id="d", text="text", title="title")
    recipe = json.dumps(
        [
            embedder.model_id,
            embedder.passage_prefix,
            indexer.chunker.max_tokens,
            indexer.chunker.overlap,
        ]
    )
    earlier = json.dumps([recipe, "title", "text", {}], sort_keys=True, ensure_ascii=False)
    assert indexer.content_hash(document) == hashlib.sha256(earlier.encode()).hexdigest()


def test_the_eval_cache_keeps_each_backends_vectors_apart():
    base = {"model_id": "m", "passage_prefix": "p", "corpus_checksum": "c", "max_length": 512}
    assert cache_key(**base) == cache_key(**base, backend="torch")
    assert cache_key(**base, backend="int8") != cache_key(**base)


def test_calibration_texts_span_the_sample():
    queries, passages = calibration_texts()
    assert len(queries) == 8 and len(passages) == 24
    assert len(set(passages)) == 24


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        (
            "RAGRANK_EMBED_BACKEND",
            "onnx",
            "RAGRANK_EMBED_BACKEND must be one of auto, torch, int8, openvino, openvino-int8",
        ),
        ("RAGRANK_EMBED_MIN_AGREEMENT", "2", "must be between -1 and 1"),
    ],
)
def test_the_backend_settings_are_checked(variable: str, value: str, message: str):
    with pytest.raises(SettingsError, match=message):
        Settings.from_env({variable: value})


class TwoLayers(torch.nn.Module):
    """Two linear layers; the second one's inputs carry one outlier feature."""

    def __init__(self) -> None:
        super().__init__()
        self.plain = torch.nn.Linear(8, 8)
        self.spiky = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        spikes = torch.zeros_like(x)
        spikes[:, 0] = 100.0
        return self.spiky(self.plain(x) + spikes)


def test_the_layer_with_outlier_inputs_is_kept_in_float():
    model = TwoLayers()
    inputs = torch.randn(16, 8)
    assert outlier_layers(model, lambda: model(inputs), share=0.5) == ["spiky"]
    assert outlier_layers(model, lambda: model(inputs), share=1.0) == ["spiky", "plain"]
    quantized = quantize_int8(model, keep_float=["spiky"])
    assert isinstance(quantized.plain, FullRangeLinear)
    assert type(quantized.spiky) is torch.nn.Linear
    assert type(model.plain) is torch.nn.Linear, "the float model was changed"
    with torch.inference_mode():
        kept = torch.nn.functional.cosine_similarity(quantized(inputs), model(inputs)).min()
        every = quantize_int8(model)
        assert isinstance(every.spiky, FullRangeLinear)
        all_int8 = torch.nn.functional.cosine_similarity(every(inputs), model(inputs)).min()
    assert kept > all_int8


def test_the_int8_embedder_keeps_its_outlier_layers_in_float(
    int8_embedder: SentenceTransformerEmbedder,
):
    kept = int8_embedder.float_layers
    assert len(kept) >= 1
    for name in kept:
        assert type(int8_embedder._encoder.get_submodule(name)) is torch.nn.Linear
