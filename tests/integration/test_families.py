"""The reranker families beyond BERT and XLM-R: ModernBERT and Qwen3 rerankers (the causal
`yes`/`no` form and its `-seq-cls` conversion), on tiny random models built here. Packed and
padded logits equal transformers' own forward to 1e-4 in fp32; the prompt, the windows and the
scoring rule are the families' own. Random weights: these tests check arithmetic, never
relevance."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pytest
import torch

from eval.random_models import (
    TinyFamily,
    sample_tokenizer,
    save_family_model,
    save_tiny_family,
    tiny_qwen3_config,
)
from ragrank.backends.families import DEFAULT_INSTRUCTION, FAMILIES, default_prompt
from ragrank.backends.models import CrossEncoderScorer
from ragrank.backends.packing import PackedBatch, PaddedBatch
from ragrank.device import Placement
from ragrank.errors import ModelLoadError

if TYPE_CHECKING:
    from pathlib import Path

CPU = Placement("cpu", torch.float32)
QUERIES = ["why are leaves green", "Wie lang ist der Rhein?"]
PASSAGES = [
    "Chlorophyll absorbs red and blue light and reflects green.",
    "short",
    # Longer than the tiny ModernBERT's 8-token local window, many times over.
    " ".join(["A longer passage about rivers, lakes and seas."] * 12),
    "Der Rhein ist rund 1.230 Kilometer lang und fließt in die Nordsee.",
]
PAIRS = [(q, p) for q in QUERIES for p in PASSAGES]


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("families")
    names: list[TinyFamily] = ["modernbert", "modernbert-mean", "qwen3-reranker", "qwen3-seq-cls"]
    return {name: save_tiny_family(name, folder / name) for name in names}


def _reference(folder: Path, scorer: CrossEncoderScorer, family: str) -> np.ndarray:
    """An independent copy of the model, run by transformers on each input alone (no padding,
    no packing, its eager attention): its logit, or the last token's `yes` minus `no`."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    causal = family == "qwen3-reranker"
    factory = AutoModelForCausalLM if causal else AutoModelForSequenceClassification
    model = factory.from_pretrained(str(folder), attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    yes, no = tokenizer.convert_tokens_to_ids("yes"), tokenizer.convert_tokens_to_ids("no")
    logits = []
    with torch.inference_mode():
        for item in scorer.tokens.pairs(PAIRS):
            output = model(input_ids=torch.tensor([item.ids])).logits.float()
            logits.append(output[0, -1, yes] - output[0, -1, no] if causal else output.view(-1)[0])
    return np.array(logits, dtype=np.float32)


@pytest.mark.parametrize(
    ("name", "family"),
    [
        ("modernbert", "modernbert"),
        ("modernbert-mean", "modernbert"),
        ("qwen3-reranker", "qwen3-reranker"),
        ("qwen3-seq-cls", "qwen3-seq-cls"),
    ],
)
def test_packed_and_padded_logits_equal_transformers_own_forward(
    families: dict[str, Path], name: str, family: str
):
    packed = CrossEncoderScorer(str(families[name]), placement=CPU, packed="on")
    padded = CrossEncoderScorer(str(families[name]), placement=CPU, packed="off")
    assert packed.family.name == family
    assert packed.packed and not padded.packed
    assert isinstance(packed.collate(packed.tokens.pairs(PAIRS)), PackedBatch)
    assert isinstance(padded.collate(padded.tokens.pairs(PAIRS)), PaddedBatch)
    expected = _reference(families[name], packed, name)
    assert np.ptp(expected) > 1e-3  # distinct logits, or a mixed-up order could pass
    np.testing.assert_allclose(packed.score_pairs(PAIRS), expected, atol=1e-4, rtol=0)
    np.testing.assert_allclose(padded.score_pairs(PAIRS), expected, atol=1e-4, rtol=0)


def test_modernbert_mean_pooling_is_read_from_the_model(families: dict[str, Path]):
    assert CrossEncoderScorer(str(families["modernbert"]), placement=CPU).family.pooling == "first"
    mean = CrossEncoderScorer(str(families["modernbert-mean"]), placement=CPU)
    assert mean.family.pooling == "mean"


def test_long_context_families_window_by_their_own_limit_up_to_8k(
    families: dict[str, Path], tiny_reranker_path: Path
):
    for name in ("modernbert", "qwen3-reranker", "qwen3-seq-cls"):
        scorer = CrossEncoderScorer(str(families[name]), placement=CPU)
        assert scorer.max_length == 8192, name
        document = " ".join(["river"] * 3000)
        # One window at 8K where a 512-token model needs several.
        assert len(scorer.plan_windows("q", [document]).inputs) == 1
        capped = CrossEncoderScorer(str(families[name]), placement=CPU, max_length=256)
        assert capped.max_length == 256
        assert len(capped.plan_windows("q", [document]).inputs) > 1
    xlmr = CrossEncoderScorer(str(tiny_reranker_path), placement=CPU)
    assert xlmr.family.name == "xlm-roberta" and xlmr.max_length == 512


def test_the_default_prompt_is_the_model_cards_tokenised_whole(families: dict[str, Path]):
    """Query and document are tokenised apart (once per request), yet the input equals the
    tokenizer's encoding of the model card's whole prompt: the spaces after `<Query>:` and
    `<Document>:` go with the texts, as in the whole string."""
    from transformers import AutoTokenizer

    scorer = CrossEncoderScorer(str(families["qwen3-reranker"]), placement=CPU)
    assert scorer.tokens.prompt == default_prompt()
    tokenizer = AutoTokenizer.from_pretrained(str(families["qwen3-reranker"]))
    prompt = default_prompt()
    for query, document in PAIRS:
        whole = prompt.prefix + query + prompt.middle + document + prompt.suffix
        expected = tokenizer(whole, add_special_tokens=False)["input_ids"]
        assert scorer.tokens.pairs([(query, document)])[0].ids == expected
    assert DEFAULT_INSTRUCTION in prompt.prefix


def test_the_instruction_setting_goes_into_the_default_prompt(families: dict[str, Path]):
    scorer = CrossEncoderScorer(
        str(families["qwen3-reranker"]), placement=CPU, instruction="Find the law that applies"
    )
    assert scorer.tokens.prompt is not None
    assert "<Instruct>: Find the law that applies\n" in scorer.tokens.prompt.prefix


def test_a_folder_chat_template_that_carries_a_pair_sets_the_prompt(
    families: dict[str, Path], tmp_path: Path
):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(families["qwen3-seq-cls"]))
    tokenizer.chat_template = (
        "<|im_start|>user\nQ={{ messages | selectattr('role', 'eq', 'query') | "
        "map(attribute='content') | first }}\nD={{ messages | selectattr('role', 'eq', "
        "'document') | map(attribute='content') | first }}<|im_end|>"
    )
    folder = tmp_path / "templated"
    for path in families["qwen3-seq-cls"].iterdir():
        if path.is_file() and not path.name.startswith(("tokenizer", "special_tokens")):
            (folder / path.name).parent.mkdir(parents=True, exist_ok=True)
            (folder / path.name).write_bytes(path.read_bytes())
    tokenizer.save_pretrained(folder)
    scorer = CrossEncoderScorer(str(folder), placement=CPU)
    prompt = scorer.tokens.prompt
    assert prompt is not None and prompt.source == "chat template"
    assert (prompt.prefix, prompt.middle, prompt.suffix) == (
        "<|im_start|>user\nQ=",
        "\nD=",
        "<|im_end|>",
    )
    whole = "<|im_start|>user\nQ=rivers\nD=The Rhine<|im_end|>"
    expected = tokenizer(whole, add_special_tokens=False)["input_ids"]
    assert scorer.tokens.pairs([("rivers", "The Rhine")])[0].ids == expected


def test_yes_and_no_come_from_the_folders_own_scoring_module(
    families: dict[str, Path], tmp_path: Path
):
    """sentence-transformers saves a decoder reranker's token ids in its LogitScore module;
    ragrank scores by those, not by whatever `yes` and `no` the tokenizer has."""
    from sentence_transformers import CrossEncoder
    from sentence_transformers.cross_encoder.modules import LogitScore

    encoder = CrossEncoder(str(families["qwen3-reranker"]), device="cpu")
    logit_score = next(m for m in encoder if isinstance(m, LogitScore))
    logit_score.true_token_id, logit_score.false_token_id = 7, 11
    encoder.save(str(tmp_path / "saved"))
    scorer = CrossEncoderScorer(str(tmp_path / "saved"), placement=CPU, packed="off")
    model = encoder.transformers_model
    with torch.inference_mode():
        items = scorer.tokens.pairs(PAIRS[:2])
        expected = [
            float(
                model(input_ids=torch.tensor([i.ids])).logits[0, -1, 7]
                - model(input_ids=torch.tensor([i.ids])).logits[0, -1, 11]
            )
            for i in items
        ]
    np.testing.assert_allclose(scorer.score_pairs(PAIRS[:2]), expected, atol=1e-4)


def test_a_decoder_without_yes_and_no_is_refused_naming_the_setting(tmp_path: Path):
    tokenizer = sample_tokenizer(tmp_path / "tok")
    folder = save_family_model(
        "qwen3-reranker", tiny_qwen3_config(tokenizer), tokenizer, tmp_path / "no-yes"
    )
    with pytest.raises(ModelLoadError, match="RAGRANK_RERANK_MODEL"):
        CrossEncoderScorer(str(folder), placement=CPU)


def test_a_model_of_no_served_family_fails_at_start_up_listing_them(tmp_path: Path):
    from transformers import DistilBertConfig, DistilBertForSequenceClassification

    tokenizer = sample_tokenizer(tmp_path / "tok")
    config = DistilBertConfig(
        vocab_size=len(tokenizer), dim=32, hidden_dim=64, n_layers=1, n_heads=2, num_labels=1
    )
    DistilBertForSequenceClassification(config).save_pretrained(tmp_path / "distil")
    tokenizer.save_pretrained(tmp_path / "distil")
    with pytest.raises(ModelLoadError) as error:
        CrossEncoderScorer(str(tmp_path / "distil"), placement=CPU)
    message = str(error.value)
    assert "DistilBertForSequenceClassification" in message
    assert all(family.name in message for family in FAMILIES)
    assert "RAGRANK_RERANK_MODEL" in message


def test_a_qwen3_reranker_serves_raw_scores_and_their_sigmoid(
    families: dict[str, Path], fake_services
):
    """Over HTTP, as for cross-encoders: `raw_scores` gives the log-odds of `yes`, and the
    default its sigmoid, the probability of `yes` against `no`."""

    from litestar.testing import TestClient

    from ragrank.protocols import relevance
    from ragrank.settings import Settings
    from server import create_app
    from tests.fakes import swap_models

    scorer = CrossEncoderScorer(str(families["qwen3-reranker"]), placement=CPU)
    settings = Settings(device="cpu")
    services = swap_models(fake_services, settings, rerankers=[scorer])
    logits = scorer.score(QUERIES[0], PASSAGES)
    with TestClient(create_app(settings, services=services)) as client:
        for raw in (True, False):
            body = {"query": QUERIES[0], "documents": PASSAGES, "raw_scores": raw}
            answer = client.post("/v1/rerank", json=body)
            assert answer.status_code == 200, answer.text
            got = {r["index"]: r["relevance_score"] for r in answer.json()["results"]}
            expected = logits if raw else relevance(logits)
            np.testing.assert_allclose([got[i] for i in range(len(PASSAGES))], expected, atol=1e-5)
