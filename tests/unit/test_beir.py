from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from ragrank import SAMPLE_DATASET
from ragrank.beir import load_beir, load_qrels
from ragrank.errors import DocumentError
from tests.conftest import SHARED_DATA

if TYPE_CHECKING:
    from pathlib import Path


def test_the_sample_collection_is_consistent():
    dataset = load_beir(SAMPLE_DATASET)
    assert 100 <= len(dataset.corpus) <= 300
    assert len({d.metadata["lang"] for d in dataset.corpus.values()}) >= 5
    assert len(dataset.judged_queries) == len(dataset.queries) >= 10
    for labels in dataset.qrels.values():
        assert labels and set(labels) <= set(dataset.corpus)


def test_qrels_keep_string_ids_and_zero_relevance(tmp_path: Path):
    path = tmp_path / "test.tsv"
    path.write_text("query-id\tcorpus-id\tscore\n01\t007\t0\n01\t8\t2\n", encoding="utf-8")
    assert load_qrels(path) == {"01": {"007": 0, "8": 2}}
    path.write_text("query-id\tcorpus-id\tscore\n01\t007\n", encoding="utf-8")
    with pytest.raises(DocumentError, match=":2:"):
        load_qrels(path)


@pytest.mark.skipif(not (SHARED_DATA / "scifact").exists(), reason="../shared/data absent")
def test_scifact_loads_with_its_documented_counts():
    dataset = load_beir(SHARED_DATA / "scifact", split="test")
    assert len(dataset.corpus) == 5183
    assert len(dataset.judged_queries) == 300
