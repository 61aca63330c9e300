from __future__ import annotations

import itertools

import pytest

from indexing.chunking import Chunker
from ragrank.documents import Document
from tests.fakes import FakeEmbedder

spans = FakeEmbedder().token_spans


def _doc(text: str) -> Document:
    return Document(doc_id="d", text=text, title="T", metadata={"k": 1})


def test_a_short_document_is_one_chunk():
    chunks = Chunker(spans, max_tokens=50).chunk(_doc("  A short text.  "))
    assert [(c.text, c.chunk_index, c.title, dict(c.metadata)) for c in chunks] == [
        ("A short text.", 0, "T", {"k": 1})
    ]


def test_empty_documents_give_no_chunks():
    assert Chunker(spans, max_tokens=10).chunk(_doc("   ")) == []


def test_chunks_respect_the_budget_and_their_offsets_point_into_the_text():
    text = " ".join(f"w{i}" for i in range(200))
    chunks = Chunker(spans, max_tokens=30, overlap=5).chunk(_doc(text))
    assert all(len(spans(c.passage)) <= 30 for c in chunks)  # title included
    assert all(text[c.start : c.end] == c.text for c in chunks)
    assert [c.chunk_index for c in chunks] == list(range(len(chunks)))
    # Overlap: each chunk starts 5 tokens before the previous one ended.
    for before, after in itertools.pairwise(chunks):
        assert spans(before.text)[-5:] and before.text.split()[-5:] == after.text.split()[:5]
    assert chunks[-1].text.endswith("w199")


def test_chunks_prefer_paragraph_then_sentence_ends():
    first = "One two three four five six seven. Eight nine ten."
    second = "Eleven twelve thirteen fourteen."
    text = f"{first}\n\n{second}"
    chunks = Chunker(spans, max_tokens=12).chunk(_doc(text))
    assert [c.text for c in chunks] == [first, second]
    sentence_text = "Alpha beta gamma delta epsilon. Zeta eta theta iota kappa lambda mu nu."
    cut = Chunker(spans, max_tokens=10).chunk(_doc(sentence_text))
    assert cut[0].text == "Alpha beta gamma delta epsilon."


def test_a_title_takes_its_share_of_the_budget_but_never_more_than_half():
    text = " ".join(f"w{i}" for i in range(100))
    titled = Document(doc_id="d", text=text, title="three word title")
    assert all(len(spans(c.passage)) <= 20 for c in Chunker(spans, max_tokens=20).chunk(titled))
    huge = Document(doc_id="d", text=text, title="t " * 50)
    assert {len(spans(c.text)) for c in Chunker(spans, max_tokens=20).chunk(huge)} == {10}


def test_invalid_budgets_are_refused():
    with pytest.raises(ValueError, match="overlap"):
        Chunker(spans, max_tokens=10, overlap=10)
