"""Fine-tuning data: the query split never lets a held-out query in, and hard-negative mining
never returns a labelled positive or a near-duplicate of one."""

from __future__ import annotations

from dataclasses import replace
from types import MappingProxyType

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from eval.finetune.data import (
    Miner,
    mine_hard_negatives,
    mining_options,
    positives,
    split_queries,
)
from eval.options import FinetuneOptions
from ragrank.beir import BeirDataset, load_beir, load_qrels
from ragrank.documents import Document
from ragrank.errors import DocumentError, SettingsError
from ragrank.settings import Settings, default_prefixes
from tests.conftest import SHARED_DATA
from tests.fakes import FakeEmbedder

SCIFACT = SHARED_DATA / "scifact"


def dataset(queries: dict[str, str], qrels: dict[str, dict[str, int]]) -> BeirDataset:
    corpus = {
        doc_id: Document(doc_id=doc_id, text=f"text of {doc_id}")
        for docs in qrels.values()
        for doc_id in docs
    }
    return BeirDataset(
        name="toy",
        corpus=MappingProxyType(corpus),
        queries=MappingProxyType(queries),
        qrels=MappingProxyType(qrels),
    )


def test_split_drops_held_out_queries_by_id_and_by_text_and_is_disjoint():
    queries = {f"q{i}": f"question number {i}" for i in range(20)}
    queries["dup"] = "  Question NUMBER 3 "  # the text of a held-out query, another id
    qrels = {qid: {f"d{qid}": 1} for qid in queries}
    qrels["nopos"] = {"dx": 0}
    queries["nopos"] = "only a judged non-relevant document"
    held_out = {"q3": {"d": 1}, "q7": {"d": 1}}

    split = split_queries(dataset(queries, qrels), held_out, validation_fraction=0.25, seed=1)

    assert set(split.held_out) == {"q3", "q7", "dup"}
    seen = set(split.train) | set(split.validation)
    assert not seen & set(split.held_out)
    assert not set(split.train) & set(split.validation)
    # Every usable query is used once; one without a positive is not usable.
    assert seen == set(queries) - {"q3", "q7", "dup", "nopos"}
    assert len(split.validation) == round(0.25 * len(seen))


def test_split_is_seeded():
    queries = {f"q{i}": f"question {i}" for i in range(40)}
    qrels = {qid: {f"d{qid}": 1} for qid in queries}
    data = dataset(queries, qrels)
    first = split_queries(data, {}, validation_fraction=0.2, seed=5)
    assert first == split_queries(data, {}, validation_fraction=0.2, seed=5)
    assert first.validation != split_queries(data, {}, validation_fraction=0.2, seed=6).validation


def test_split_needs_two_usable_queries():
    data = dataset({"q1": "a", "q2": "b"}, {"q1": {"d1": 1}, "q2": {"d2": 1}})
    with pytest.raises(DocumentError, match="at least 2"):
        split_queries(data, {"q2": {"d2": 1}}, validation_fraction=0.1, seed=0)


@pytest.mark.skipif(not SCIFACT.is_dir(), reason="needs ../shared/data/scifact")
def test_scifact_split_never_holds_a_test_query():
    """The proof's split: 809 train queries, none of them a test query, by id or by text."""
    data = load_beir(SCIFACT, split="train")
    test = load_qrels(SCIFACT / "qrels" / "test.tsv")
    split = split_queries(data, test, validation_fraction=0.1, seed=42)
    used = set(split.train) | set(split.validation)
    test_texts = {data.queries[qid].strip().casefold() for qid in test}
    assert not used & set(test)
    assert not {data.queries[qid].strip().casefold() for qid in used} & test_texts
    assert len(used) + len(split.held_out) == len(data.judged_queries) == 809
    assert len(split.validation) == 81


def _mining_case(seed: int, docs: int) -> tuple[dict[str, list[str]], dict, dict, np.ndarray]:
    rng = np.random.default_rng(seed)
    vectors = rng.normal(size=(docs, 8)).astype(np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    doc_ids = [f"d{i}" for i in range(docs)]
    qrels = {
        f"q{q}": {
            doc_ids[i]: int(rng.integers(0, 3)) for i in rng.choice(docs, size=4, replace=False)
        }
        for q in range(5)
    }
    for q, judged in qrels.items():
        if not positives(qrels, q):
            judged[next(iter(judged))] = 1
    candidates = {q: list(rng.permutation(doc_ids)[: docs // 2]) for q in qrels}
    return candidates, qrels, {d: i for i, d in enumerate(doc_ids)}, vectors


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 10_000), docs=st.integers(8, 60), count=st.integers(1, 10))
def test_mining_never_returns_a_positive(seed: int, docs: int, count: int):
    candidates, qrels, rows, vectors = _mining_case(seed, docs)
    texts = {doc_id: f"text {doc_id}" for doc_id in rows}
    mined = mine_hard_negatives(
        candidates, qrels, rows, vectors, texts, count=count, near_duplicate=0.9, seed=seed
    )
    for qid, negatives in mined.items():
        assert not set(negatives) & positives(qrels, qid)
        assert set(negatives) <= set(candidates[qid])
        assert len(negatives) == len(set(negatives)) <= count
        for doc_id in negatives:
            for positive in positives(qrels, qid):
                assert float(vectors[rows[doc_id]] @ vectors[rows[positive]]) < 0.9


def test_mining_skips_near_duplicates_and_same_text_but_keeps_judged_non_relevant():
    vectors = np.array(
        [[1, 0, 0], [0.999, 0.0447, 0], [0, 1, 0], [0, 0, 1], [0.6, 0.8, 0]], dtype=np.float32
    )
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
    rows = {d: i for i, d in enumerate(["pos", "near", "other", "copy", "judged0"])}
    texts = {"pos": "Same Text", "near": "a", "other": "b", "copy": "same  text", "judged0": "c"}
    qrels = {"q": {"pos": 1, "judged0": 0}}
    mined = mine_hard_negatives(
        {"q": ["pos", "near", "copy", "other", "judged0"]},
        qrels,
        rows,
        vectors,
        texts,
        count=10,
        near_duplicate=0.95,
        seed=0,
    )
    assert sorted(mined["q"]) == ["judged0", "other"]


def test_options_name_the_flag_they_refuse():
    with pytest.raises(SettingsError, match=r"--learning-rate.*--negatives"):
        FinetuneOptions(dataset=SCIFACT, output=SCIFACT, learning_rate=0, negatives=0)
    with pytest.raises(SettingsError, match="--held-out-split 'train' is the training split"):
        FinetuneOptions(dataset=SCIFACT, output=SCIFACT, held_out_split="train")


@pytest.mark.parametrize("exact", [False, True])
def test_mining_searches_as_exactly_as_asked(exact: bool):
    """`--exact-search` on fine-tuning reaches the eval's search it mines with, so that two
    runs mine the same negatives from the same first stage."""
    options = FinetuneOptions(dataset=SCIFACT, output=SCIFACT, exact_search=exact)
    mining = mining_options(options, Miner(embedder=FakeEmbedder()))
    assert mining.exact_search is exact
    assert mining.systems == ("hybrid",)


@pytest.mark.parametrize(
    ("model", "expected"),
    [
        ("intfloat/multilingual-e5-small", ("query: ", "passage: ")),
        ("intfloat/e5-base-v2", ("query: ", "passage: ")),
        ("/models/multilingual-e5-small-q4", ("query: ", "passage: ")),
        ("/models/e5/model", ("query: ", "passage: ")),
        ("/srv/ci-clone5/all-MiniLM-L6-v2", ("", "")),
        ("sentence-transformers/all-MiniLM-L6-v2", ("", "")),
        ("BAAI/bge-small-e5x", ("", "")),
    ],
)
def test_e5_prefixes_follow_the_models_name_not_any_e5_in_its_path(model, expected):
    assert default_prefixes(model) == expected


def test_a_model_folder_records_its_prefixes(tmp_path):
    folder = tmp_path / "my-tuned-model"
    folder.mkdir()
    assert default_prefixes(str(folder)) == ("", "")
    (folder / "config_sentence_transformers.json").write_text(
        '{"prompts": {"query": "query: ", "passage": "passage: "}}'
    )
    assert default_prefixes(str(folder)) == ("query: ", "passage: ")
    settings = Settings(embed_model=str(folder))
    assert settings.prefixes() == ("query: ", "passage: ")
    # An explicit setting still wins.
    assert Settings(embed_model=str(folder), query_prefix="").prefixes()[0] == ""


def test_the_warmup_is_a_step_count_every_transformers_version_reads_alike(tmp_path):
    """`--warmup-ratio` becomes ceil(ratio * planned steps) warm-up steps: transformers reads a
    float `warmup_steps` below 1 as a ratio only from version 5 on, and 4.x silently skipped a
    warm-up passed that way."""
    from transformers import TrainingArguments

    from eval.finetune.trainer import planned_steps, training_arguments

    options = FinetuneOptions(
        dataset=SCIFACT, output=tmp_path, warmup_ratio=0.1, epochs=2, batch_size=16
    )
    assert planned_steps(options, examples=100) == 14  # 2 epochs of ceil(100 / 16) batches
    arguments = training_arguments(options, "cpu", 100)
    assert arguments["warmup_steps"] == 2
    assert isinstance(arguments["warmup_steps"], int)
    trained = TrainingArguments(**arguments)
    assert trained.get_warmup_steps(14) == 2

    capped = FinetuneOptions(dataset=SCIFACT, output=tmp_path, warmup_ratio=0.06, max_steps=50)
    assert training_arguments(capped, "cpu", 10_000)["warmup_steps"] == 3
    assert training_arguments(replace(capped, warmup_ratio=0.0), "cpu", 10)["warmup_steps"] == 0


def test_a_run_with_more_negatives_has_the_teacher_score_only_the_new_pairs(tmp_path, monkeypatch):
    import json
    from types import SimpleNamespace

    from eval.finetune import reranker

    asked: list[tuple[str, str]] = []

    class Teacher:
        def predict(self, pairs, **_):
            asked.extend(pairs)
            return np.array([float(len(q) + len(d)) for q, d in pairs])

    monkeypatch.setattr(reranker, "load_model", lambda *_: Teacher())
    run = SimpleNamespace(
        dataset=SimpleNamespace(queries={"q1": "one", "q2": "two"}),
        data=SimpleNamespace(unlabelled=None),
        texts={doc: f"text {doc}" for doc in ("a", "b", "c", "d")},
        device="cpu",
    )
    options = SimpleNamespace(
        output=tmp_path, teacher=tmp_path, max_length=32, batch_size=2, progress=False
    )
    (tmp_path / reranker.TEACHER_SCORES).write_text(
        json.dumps(
            {
                "q1": {"documents": ["a", "b"], "logits": [1.5, -2.0]},
                "q2": [0.1, 0.2],  # an earlier version's bare list: scored again
            }
        )
    )
    scores = reranker.teacher_scores({"q1": ["a", "b", "c"], "q2": ["a", "d"]}, run, options)
    assert sorted(asked) == [("one", "text c"), ("two", "text a"), ("two", "text d")]
    assert scores == {"q1": [1.5, -2.0, 9.0], "q2": [9.0, 9.0]}
    stored = json.loads((tmp_path / reranker.TEACHER_SCORES).read_text())
    assert stored["q1"] == {"documents": ["a", "b", "c"], "logits": [1.5, -2.0, 9.0]}
    asked.clear()
    assert reranker.teacher_scores({"q1": ["c", "a"]}, run, options) == {"q1": [9.0, 1.5]}
    assert asked == []
