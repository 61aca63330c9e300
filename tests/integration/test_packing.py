"""The padding-free forward: packed batches give the logits and embeddings of the Hugging Face
model's own padded forward on the same ids (fp32, CPU, 1e-4), for the BERT and XLM-R families,
on tiny random models and on random models of the real shapes. Random weights: these tests
check arithmetic, never relevance."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np
import pytest
import torch

from eval.random_models import load_tokenizer, save_random_model, save_spread_reranker
from ragrank.backends.models import CrossEncoderScorer, SentenceTransformerEmbedder
from ragrank.backends.packing import PackedBatch, PaddedBatch, collate_padded
from ragrank.device import Placement
from tests.conftest import SHARED_MODELS, shared_tokenizer_file

if TYPE_CHECKING:
    from pathlib import Path

CPU = Placement("cpu", torch.float32)
BERT_RERANKER = SHARED_MODELS / "ms-marco-MiniLM-L-6-v2-noweights"
XLMR_TOKENIZER = SHARED_MODELS / "xlm-roberta-tokenizer" / "tokenizer.json.gz"
needs_shared = pytest.mark.skipif(
    not (BERT_RERANKER.exists() and XLMR_TOKENIZER.exists()), reason="needs ../shared/models"
)

QUERIES = ["why are leaves green", "Wie lang ist der Rhein?", "東京の人口は"]
PASSAGES = [
    "Chlorophyll absorbs red and blue light and reflects green.",
    "Der Rhein ist rund 1.230 Kilometer lang und fließt in die Nordsee.",
    "東京都の人口は約1400万人です。",
    "short",
    " ".join(["A longer passage about rivers, lakes and seas."] * 12),
]


def _reference_logits(folder: Path, scorer: CrossEncoderScorer, pairs) -> np.ndarray:
    """An independent copy of the model, run padded by transformers on the same ids."""
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(str(folder)).eval()
    inputs = scorer.tokens.pairs(pairs)
    batch = collate_padded(
        inputs,
        pad_id=scorer.tokens.pad_id,
        uses_types=scorer.tokens.template.uses_types,
        pin=False,
    )
    with torch.inference_mode():
        return model(**batch.features).logits.float().view(-1).numpy()


def _check_scorer(folder: Path) -> None:
    packed = CrossEncoderScorer(str(folder), placement=CPU, packed="on")
    padded = CrossEncoderScorer(str(folder), placement=CPU, packed="off")
    assert packed.packed and not padded.packed
    pairs = [(q, p) for q in QUERIES for p in PASSAGES]
    batch = packed.collate(packed.tokens.pairs(pairs))
    assert isinstance(batch, PackedBatch) and batch.input_ids.shape[0] == 1
    assert isinstance(padded.collate(padded.tokens.pairs(pairs)), PaddedBatch)
    expected = _reference_logits(folder, packed, pairs)
    np.testing.assert_allclose(packed.score_pairs(pairs), expected, atol=1e-4, rtol=0)
    np.testing.assert_allclose(padded.score_pairs(pairs), expected, atol=1e-4, rtol=0)


def _check_embedder(folder: Path) -> None:
    from sentence_transformers import SentenceTransformer

    packed = SentenceTransformerEmbedder(
        str(folder), query_prefix="query: ", passage_prefix="passage: ", placement=CPU, packed="on"
    )
    assert packed.packed
    texts = [*QUERIES, *PASSAGES]
    reference = SentenceTransformer(str(folder), device="cpu").encode(
        ["passage: " + t for t in texts], normalize_embeddings=True, convert_to_numpy=True
    )
    np.testing.assert_allclose(packed.embed_passages(texts), reference, atol=1e-4, rtol=0)


def test_packed_xlmr_reranker_matches_the_padded_forward(tiny_reranker_path: Path):
    _check_scorer(tiny_reranker_path)


def test_packed_xlmr_embedder_matches_sentence_transformers(tiny_embedder_path: Path):
    _check_embedder(tiny_embedder_path)


@pytest.fixture(scope="module")
def shapes(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("shapes")


@needs_shared
def test_packed_bert_reranker_of_ms_marco_minilm_shape_matches(shapes: Path):
    """BERT with token types (query 0, passage 1) and a pooler before the classifier."""
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(str(BERT_RERANKER))
    tokenizer = AutoTokenizer.from_pretrained(str(BERT_RERANKER))
    folder = save_random_model("reranker", config, tokenizer, shapes / "ms-marco-minilm")
    _check_scorer(folder)


@needs_shared
def test_packed_bert_embedder_of_multilingual_e5_small_shape_matches(shapes: Path):
    """multilingual-e5-small is a BertModel (positions from 0) with the XLM-R tokenizer."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(SHARED_MODELS / "multilingual-e5-small"))
    tokenizer = load_tokenizer(XLMR_TOKENIZER, shapes / "e5-small-tok")
    _check_embedder(save_random_model("embedder", config, tokenizer, shapes / "e5-small"))


@needs_shared
@pytest.mark.slow
@pytest.mark.parametrize(
    ("kind", "config_dir"),
    [("reranker", "bge-reranker-v2-m3"), ("embedder", "multilingual-e5-base")],
)
def test_packed_forward_of_the_full_size_shapes_matches(shapes: Path, kind: str, config_dir: str):
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(SHARED_MODELS / config_dir))
    tokenizer = load_tokenizer(XLMR_TOKENIZER, shapes / f"{config_dir}-tok")
    folder = save_random_model(kind, config, tokenizer, shapes / config_dir)  # type: ignore[arg-type]
    (_check_scorer if kind == "reranker" else _check_embedder)(folder)


def test_an_unknown_architecture_falls_back_to_padded_batches_logged_once(
    tmp_path: Path, tiny_reranker_path: Path, caplog: pytest.LogCaptureFixture
):
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(str(tiny_reranker_path))
    config.position_embedding_type = "relative_key"  # not absolute: no packed forward
    folder = save_random_model(
        "reranker", config, AutoTokenizer.from_pretrained(str(tiny_reranker_path)), tmp_path / "m"
    )
    with caplog.at_level(logging.WARNING, logger="ragrank.backends.models"):
        scorer = CrossEncoderScorer(str(folder), placement=CPU, packed="on")
        logits = [scorer.score("q", PASSAGES) for _ in range(3)]
    assert not scorer.packed
    assert isinstance(scorer.collate(scorer.tokens.pairs([("q", "d")])), PaddedBatch)
    assert [r.message for r in caplog.records].count(caplog.records[0].message) == 1
    assert "padded batches" in caplog.records[0].message
    assert logits[0].shape == (len(PASSAGES),)


@pytest.mark.gpu
def test_packed_bf16_on_cuda_ranks_like_the_fp32_padded_forward(model_dir: Path):
    """Numerics on a GPU: the top-10 of each query agrees with fp32 padded at least 0.99, on
    a reranker whose logits spread wider than bf16 rounds (else the check measures noise)."""
    spread = save_spread_reranker(model_dir / "tiny-spread-reranker", shared_tokenizer_file())
    fast = CrossEncoderScorer(str(spread), placement=Placement("cuda", torch.bfloat16), packed="on")
    exact = CrossEncoderScorer(
        str(spread), placement=Placement("cuda", torch.float32), packed="off"
    )
    rng = np.random.default_rng(0)
    words = ["river", "lake", "sea", "ocean", "rain", "cloud", "leaf", "green", "light", "blue"]
    agreement = []
    for query in QUERIES * 10:
        passages = [" ".join(rng.choice(words, rng.integers(3, 60))) for _ in range(100)]
        top_fast = set(np.argsort(-fast.score(query, passages))[:10])
        top_exact = set(np.argsort(-exact.score(query, passages))[:10])
        agreement.append(len(top_fast & top_exact) / 10)
    assert np.mean(agreement) >= 0.99
