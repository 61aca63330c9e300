"""BM25 sparse vectors and hybrid retrieval on both store engines: the weights and the scores
against hand computation, IDF through updates and deletes, fusion against a hand-fused list,
old collections, and vectors of any text."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from transformers import AutoTokenizer

from ragrank.documents import Chunk
from ragrank.sparse import Bm25Params, QdrantBm25, SparseVector, SubwordBm25
from ragrank.store import EdgeStore, Store

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

PARAMS = Bm25Params(k=1.2, b=0.75, avg_len=4.0)


def test_subword_weights_count_the_tokenizer_ids(tiny_embedder_path: Path):
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_embedder_path))
    encoder = SubwordBm25(PARAMS, tokenizer, "tiny")
    text = "river river delta"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    (vector,) = encoder.documents([text])
    norm = 1 - 0.75 + 0.75 * len(ids) / 4.0
    for term, weight in zip(vector.indices, vector.values, strict=True):
        tf = ids.count(term)
        assert weight == pytest.approx(tf * 2.2 / (tf + 1.2 * norm))
    assert set(vector.indices) == set(ids)
    assert encoder.query(text).vector == SparseVector(
        tuple(sorted(set(ids))), (1.0,) * len(set(ids))
    )


@pytest.fixture(scope="module")
def encoders(tiny_embedder_path: Path) -> dict[str, QdrantBm25 | SubwordBm25]:
    tokenizer = AutoTokenizer.from_pretrained(str(tiny_embedder_path))
    return {
        "bm25": QdrantBm25(Bm25Params()),
        "none": QdrantBm25(Bm25Params(), "none"),
        "subword": SubwordBm25(Bm25Params(), tokenizer, "tiny"),
    }


@pytest.fixture(scope="module")
def one_point_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    store = EdgeStore(tmp_path_factory.mktemp("q"), "c")
    store.ensure_collection(2)
    yield store
    store.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=st.text(max_size=300), kind=st.sampled_from(["bm25", "none", "subword"]))
@example(text="", kind="bm25")
@example(text=" !!! ... ¿? ", kind="bm25")  # nothing left after cleaning
@example(text="the of and", kind="bm25")  # stopwords only
@example(text="東京は日本の首都です", kind="bm25")
@example(text="ภาษาไทยง่ายนิดเดียว", kind="subword")
@example(text="Привет, мир! 🌍 \u200b\x00", kind="none")
def test_the_vectors_of_any_text_are_valid_for_qdrant(
    one_point_store: Store, encoders, text: str, kind: str
):
    encoder = encoders[kind]
    for vector in (*encoder.documents([text]), encoder.query(text).vector):
        assert len(vector.indices) == len(vector.values)
        assert all(a < b for a, b in zip(vector.indices, vector.indices[1:], strict=False))
        assert all(0 <= i < 2**32 for i in vector.indices)
        assert all(math.isfinite(v) and v > 0 for v in vector.values)
    # Each example overwrites the one point, then finds it by hybrid search.
    chunk = Chunk(doc_id="x", chunk_index=0, text=text)
    one_point_store.upsert([chunk], np.ones((1, 2), np.float32), sparse=encoder.documents([text]))
    hits = one_point_store.search(np.ones(2, np.float32), 5, sparse=encoder.query(text).vector)
    assert [h.chunk.doc_id for h in hits] == ["x"]
