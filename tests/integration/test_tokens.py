"""Tokenise once: inputs assembled from ids equal what the model's own tokenizer gives for the
same texts, on the real XLM-R (multilingual-e5, bge-reranker-v2-m3) and BERT (ms-marco MiniLM)
tokenizers. Property tests over random texts with scripts mixed."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ragrank.backends.packing import collate_padded
from ragrank.tokens import DEFAULT_WINDOWS_PER_DOC, Tokens
from tests.conftest import SHARED_MODELS, build_tokenizer

BERT_FOLDER = SHARED_MODELS / "ms-marco-MiniLM-L-6-v2-noweights"
XLMR_PACKED = SHARED_MODELS / "xlm-roberta-tokenizer" / "tokenizer.json.gz"

pytestmark = pytest.mark.skipif(
    not (BERT_FOLDER.exists() and XLMR_PACKED.exists()), reason="needs ../shared/models"
)

#: Words from several scripts, digits, punctuation and symbols, joined by assorted spaces.
WORDS = [
    "river",
    "Flußufer",
    "naïve",
    "résumé",
    "COVID-19",
    "p53",
    "3.14",
    "e-mail",
    "U.S.A.",
    "река",
    "Москва",
    "南瓜",
    "東京都",
    "日本語の",
    "한국어",
    "ภาษาไทย",
    "हिन्दी",
    "عربي",
    "עברית",
    "Ελλάδα",
    "🙂",
    "—",
    "(",
    ")",
    ",",
    "...",
    "%",
    "&amp;",
    "x²",
    "Ωmega",
]
word = st.one_of(st.sampled_from(WORDS), st.text(min_size=1, max_size=8).filter(str.strip))
gap = st.sampled_from([" ", "  ", "\n", "\t", " - ", ""])


@st.composite
def texts(draw: st.DrawFn, min_words: int = 1, max_words: int = 40) -> str:
    words = draw(st.lists(word, min_size=min_words, max_size=max_words))
    return "".join(w + draw(gap) for w in words).strip() or "x"


@pytest.fixture(scope="module", params=["xlm-r", "bert"])
def tokenizer(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    from transformers import AutoTokenizer

    if request.param == "bert":
        made = AutoTokenizer.from_pretrained(str(BERT_FOLDER))
    else:
        made = build_tokenizer(Path(tmp_path_factory.mktemp("xlmr")))
    yield made
    # Each `Tokens` holds its own copy of the tokenizer (XLM-R's: hundreds of MB, eight limits):
    # they go with their tokenizer, not at the end of the test worker.
    for key in [key for key in _made if key[0] == id(made)]:
        del _made[key]
    gc.collect()


_made: dict[tuple[int, int], Tokens] = {}


def tokens_for(tokenizer, max_length: int) -> Tokens:
    """One `Tokens` per tokenizer and limit: each copies the tokenizer, which takes a second for
    XLM-R's 250k pieces."""
    key = (id(tokenizer), max_length)
    if key not in _made:
        _made[key] = Tokens(tokenizer, max_length)
    return _made[key]


relaxed = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@relaxed
@given(query=texts(), document=texts(max_words=60))
def test_an_uncut_pair_is_exactly_what_the_tokenizer_gives(tokenizer, query, document):
    tokens = tokens_for(tokenizer, 100_000)
    plan = tokens.plan_windows(query, [document])
    assert len(plan.inputs) == 1
    expected = tokenizer(query, document)
    assert plan.inputs[0].ids == expected["input_ids"]
    if tokens.template.uses_types:
        assert plan.inputs[0].type_ids == expected["token_type_ids"]
    else:
        assert set(expected.get("token_type_ids", [0])) == {0}


@relaxed
@given(text=texts(max_words=80))
def test_a_single_text_is_what_the_tokenizer_gives_cut_at_the_model_limit(tokenizer, text):
    tokens = tokens_for(tokenizer, 24)
    expected = tokenizer(text, truncation=True, max_length=24)
    assert tokens.texts([text])[0].ids == expected["input_ids"]


@relaxed
@given(
    query=texts(max_words=30), passage=texts(max_words=60), limit=st.sampled_from([8, 13, 32, 64])
)
def test_text_pairs_are_cut_as_longest_first_truncation_cuts_them(tokenizer, query, passage, limit):
    tokens = tokens_for(tokenizer, limit)
    expected = tokenizer(query, passage, truncation="longest_first", max_length=limit)
    assert tokens.pairs([(query, passage)])[0].ids == expected["input_ids"]


@relaxed
@given(query=texts(max_words=6), document=texts(min_words=40, max_words=120))
def test_windows_are_slices_of_the_document_ids_and_are_what_is_scored(tokenizer, query, document):
    """A window is cut from the document's ids, never re-tokenised. Where a cut falls inside a
    word, re-tokenising the window's text can give other ids at its two edges (a SentencePiece
    word start, a WordPiece `##` piece): the assembled ids are the ones scored. Away from the
    edges, both agree."""
    tokens = tokens_for(tokenizer, 48)
    plan = tokens.plan_windows(query, [document])
    window = 48 - tokens.template.pair_specials - plan.query_tokens
    document_ids = tokens.ids([document])[0][: window * DEFAULT_WINDOWS_PER_DOC]
    spans = tokens.spans([document])[0]
    query_ids = tokens.ids([query])[0][: plan.query_tokens]
    start, stride = 0, window - window // 4
    assert len(plan.inputs) == max(1, -(-(len(document_ids) - window) // stride) + 1)
    for item in plan.inputs:
        content = document_ids[start : start + window]
        assert item.ids == tokens.pair(query_ids, content).ids
        text = document[spans[start][0] : spans[start + len(content) - 1][1]]
        again = tokenizer(text, add_special_tokens=False)["input_ids"]
        if again != content:
            interior = again[3:-3]
            assert not interior or any(
                content[i : i + len(interior)] == interior for i in range(len(content))
            ), "re-tokenised text differs away from the cut edges"
        start += stride
    batch = collate_padded(plan.inputs, pad_id=tokens.pad_id, uses_types=False, pin=False)
    for row, item in enumerate(plan.inputs):
        assert batch.features["input_ids"][row, : len(item)].tolist() == item.ids


def test_the_template_is_read_off_each_tokenizer(tokenizer):
    template = tokens_for(tokenizer, 512).template
    if tokenizer.cls_token == "[CLS]":  # BERT: [CLS] A [SEP] B [SEP], B typed 1
        assert (template.pair_specials, template.uses_types) == (3, True)
        assert template.pair_types[1:4:2] == (0, 1)
    else:  # XLM-R: <s> A </s></s> B </s>
        assert (template.pair_prefix, template.middle, template.pair_suffix) == ([0], [2, 2], [2])
        assert not template.uses_types
