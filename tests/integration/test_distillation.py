"""A held-out split by paragraph, distillation into a shallower student, its calibration, and
the cascade evaluated, end to end on tiny random models and a tiny two-language collection
whose queries carry a `paragraph` field (as XQuAD-R's do). Random weights: mechanics only,
never quality."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np
import pytest
from litestar.testing import AsyncTestClient

from cli import main
from cli.compose import load_services
from eval.finetune.data import TrainingData
from eval.splits import GroupSplit
from ragrank import SAMPLE_DATASET
from ragrank.beir import load_beir, merge_beir
from ragrank.errors import DocumentError
from server import create_app

if TYPE_CHECKING:
    from pathlib import Path

    from ragrank.settings import Settings

LANGUAGES = ("en", "de")
PARAGRAPHS = 10
SPLIT = ["--split-by", "paragraph", "--test-share", "0.3"]


@pytest.fixture(scope="module")
def languages(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two folders named as languages, each the sample corpus with 40 questions: a document's
    title asked about, in ten paragraphs of four questions each."""
    root = tmp_path_factory.mktemp("xquad-like")
    documents = [json.loads(line) for line in (SAMPLE_DATASET / "corpus.jsonl").open()][:40]
    folders = []
    for language in LANGUAGES:
        folder = root / language
        (folder / "qrels").mkdir(parents=True)
        shutil.copy(SAMPLE_DATASET / "corpus.jsonl", folder / "corpus.jsonl")
        with (folder / "queries.jsonl").open("w") as queries:
            for i, doc in enumerate(documents):
                metadata = {"paragraph": f"p{i % PARAGRAPHS:02d}"}
                record = {"_id": f"x{i:02d}", "text": f"{doc['title']}?", "metadata": metadata}
                queries.write(json.dumps(record) + "\n")
        rows = [f"x{i:02d}\t{doc['_id']}\t1" for i, doc in enumerate(documents)]
        (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(rows))
        folders.append(folder)
    return folders


def _common(embedder: Path) -> list[str]:
    return ["--embed-model", str(embedder), "--device", "cpu", "--no-cache", "--no-progress"]


@pytest.fixture(scope="module")
def student(
    languages: list[Path],
    tiny_embedder_path: Path,
    tiny_reranker_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    """A one-layer student distilled from the tiny reranker on both languages merged, with
    unlabelled queries besides, one of them a test query's text."""
    output = tmp_path_factory.mktemp("distil") / "student"
    unlabelled = output.parent / "traffic.txt"
    test_text = _test_side_text(languages)
    unlabelled.write_text(f"what is coffee\n{test_text}\nrivers of europe\n")
    flags = [
        "--merge",
        *map(str, languages),
        "--output",
        str(output),
        "--split",
        "test",
        *SPLIT,
        "--validation-share",
        "0.2",
        "--base",
        str(tiny_embedder_path),
        "--layers",
        "1",
        "--teacher",
        str(tiny_reranker_path),
        "--unlabelled-queries",
        str(unlabelled),
        "--negatives",
        "3",
        "--max-steps",
        "2",
        "--batch-size",
        "4",
        "--near-duplicate",
        "1.0",
        *_common(tiny_embedder_path),
    ]
    assert main(["finetune", "reranker", *flags]) == 0
    return output


def _test_side_text(languages: list[Path]) -> str:
    dataset = merge_beir([load_beir(folder) for folder in languages])
    split = GroupSplit("paragraph", 42, 0.3, 0.2)
    return dataset.queries[split.queries(dataset, "test", dataset.judged_queries)[0]]


def test_a_paragraph_falls_on_one_side_in_every_folder(languages: list[Path]):
    merged = merge_beir([load_beir(folder) for folder in languages])
    split = GroupSplit("paragraph", 42, 0.3, 0.2)
    sides = {
        side: set(split.queries(merged, side, merged.judged_queries))
        for side in ("train", "validation", "test")
    }
    assert sum(map(len, sides.values())) == len(merged.judged_queries)
    assert all(sides.values())
    for side, queries in sides.items():
        paragraphs = {merged.query_metadata[q]["paragraph"] for q in queries}
        others = set().union(*(s for name, s in sides.items() if name != side))
        assert not paragraphs & {merged.query_metadata[q]["paragraph"] for q in others}
    # One folder alone puts each question where the merged collection does.
    alone = load_beir(languages[1])
    for qid in alone.judged_queries:
        assert (f"de/{qid}" in sides["test"]) == bool(split.queries(alone, "test", [qid]))


def test_a_limited_merged_collection_keeps_each_parts_first_queries(languages: list[Path]):
    from eval.options import EvalOptions
    from eval.suite import _evaluated_queries

    parts = [load_beir(folder) for folder in languages]
    options = EvalOptions(limit_queries=3, split_by="paragraph", progress=False)
    merged = _evaluated_queries(merge_beir(parts), options)
    alone = {part.name: list(_evaluated_queries(part, options)) for part in parts}
    assert list(merged) == [f"{name}/{qid}" for name, ids in alone.items() for qid in ids]
    assert all(len(ids) == 3 for ids in alone.values())


def test_a_query_without_the_field_is_refused(languages: list[Path]):
    dataset = load_beir(languages[0])
    with pytest.raises(DocumentError, match="no metadata field 'chapter'"):
        GroupSplit("chapter", 42, 0.3, 0.1).queries(dataset, "test", dataset.judged_queries)


def test_distillation_trains_on_the_train_side_only(student: Path, languages: list[Path]):
    data = TrainingData.from_json(json.loads((student / "training-data.json").read_text()))
    assert data.miner == "hybrid"
    assert data.groups is not None
    groups = data.groups["groups"]
    merged = merge_beir([load_beir(folder) for folder in languages])
    test_paragraphs = set(groups["test"])
    assert test_paragraphs
    assert set(groups["train"]).isdisjoint(test_paragraphs)
    used = [*data.split.train, *data.split.validation]
    assert {merged.query_metadata[q]["paragraph"] for q in used}.isdisjoint(test_paragraphs)
    assert {merged.query_metadata[q]["paragraph"] for q in data.split.held_out} == test_paragraphs
    assert {q.split("/")[0] for q in data.split.held_out} == set(LANGUAGES)
    # The unlabelled query with a test query's text is dropped; the others are distilled.
    assert sorted((data.unlabelled or {}).values()) == ["rivers of europe", "what is coffee"]


def test_the_student_learns_the_teachers_scores(student: Path):
    scores = json.loads((student / "teacher-scores.json").read_text())
    report = json.loads((student / "report.json").read_text())
    assert report["loss_function"] == "distillation (margin-mse)"
    assert report["distilled_queries"] == len(scores)
    assert report["unlabelled_queries"] == 2
    assert all(
        len(row["documents"]) == len(row["logits"]) == 3 + 1 and np.isfinite(row["logits"]).all()
        for row in scores.values()
    )
    # Two steps of four: the teacher scores the eight queries sampled for them, no more.
    assert len(scores) == 2 * 4
    data = TrainingData.from_json(json.loads((student / "training-data.json").read_text()))
    for qid in data.unlabelled or {}:
        assert len((data.train_candidates or {})[qid]) >= 3 + 1
    assert np.isfinite(report["loss"][0]["loss"])
    config = json.loads((student / "model" / "config.json").read_text())
    assert config["num_hidden_layers"] == 1


async def test_the_student_is_served_with_its_calibration(student: Path, settings: Settings):
    calibration = json.loads((student / "model" / "calibration.json").read_text())
    assert calibration["method"] == "platt"
    assert {"a", "b", "ece_sigmoid", "ece_calibrated", "pairs"} <= set(calibration)
    assert "Calibration (Platt" in (student / "report.md").read_text()
    served = replace(settings, rerank_model=str(student / "model"))
    services = load_services(served)
    query, documents = "Why are leaves green?", ["Chlorophyll.", "Tides and the moon."]
    try:
        async with AsyncTestClient(app=create_app(served, services=services)) as client:
            answers = [
                (
                    await client.post(
                        "/v1/rerank",
                        json={"query": query, "documents": documents, "raw_scores": raw},
                    )
                ).json()["results"]
                for raw in (True, False)
            ]
    finally:
        services.store.close()
    logits = {r["index"]: r["relevance_score"] for r in answers[0]}
    for result in answers[1]:
        logit = logits[result["index"]]
        expected = 1 / (1 + np.exp(-(calibration["a"] * logit + calibration["b"])))
        assert result["relevance_score"] == pytest.approx(expected, rel=1e-5)


def test_the_eval_scores_the_test_side_and_the_cascades_work(
    *,
    student: Path,
    languages: list[Path],
    tiny_embedder_path: Path,
    tiny_reranker_path: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.setenv(
        "RAGRANK_RERANK_MODELS", f"teacher={tiny_reranker_path},student={student / 'model'}"
    )
    output = tmp_path / "report"
    flags = [
        "--merge",
        *map(str, languages),
        "--split",
        "test",
        *SPLIT,
        "--systems",
        "hybrid,hybrid-reranked,hybrid-blended,cascade-first,cascade,cascade-blended",
        "--rerank-blend",
        "1",
        "--cascade",
        "student:2",
        "--cascade-top",
        "1",
        "3",
        "--candidates",
        "4",
        "--versus",
        "hybrid",
        "--output",
        str(output),
        *_common(tiny_embedder_path),
    ]
    assert main(["eval", *flags]) == 0
    report = json.loads((output / "report.json").read_text())
    split = GroupSplit("paragraph", 42, 0.3, 0.0)
    test_side = split.queries(load_beir(languages[0]), "test", load_beir(languages[0]).queries)
    assert [d["evaluated_queries"] for d in report["datasets"]] == [len(test_side)] * 2
    timings = report["datasets"][0]["timings"]
    assert timings["hybrid-reranked_default_pairs_per_query"] == 4
    assert timings["cascade-first_fast_pairs_per_query"] == 4
    assert timings["cascade_default_pairs_per_query"] == 2
    assert timings["cascade@1_default_pairs_per_query"] == 1
    assert timings["cascade@3_default_pairs_per_query"] == 3
    for cascade in ("cascade", "cascade@1", "cascade@3"):  # the fast model scored every candidate
        assert timings[f"{cascade}_fast_pairs_per_query"] == 4
    systems = report["datasets"][0]["systems"]
    assert {"cascade", "cascade@1", "cascade@3", "cascade-first"} <= set(systems)
    # A blend of weight 1 is hybrid's own order, over the reranker's pairs (deep in the list,
    # hybrid's tied scores may be broken another way by the metrics, so MAP@100 may differ).
    blended, hybrid = systems["hybrid-blended"]["metrics"], systems["hybrid"]["metrics"]
    assert blended["ndcg@10"] == hybrid["ndcg@10"]
    assert timings["hybrid-blended_default_pairs_per_query"] == 4
    # Blended wholly into hybrid, the cascade at any K and the student alone are hybrid's
    # order, at the cascade's pairs.
    for name in ("cascade-blended", "cascade-blended@1", "cascade-blended@3"):
        assert systems[name]["metrics"]["ndcg@10"] == hybrid["ndcg@10"]
    assert systems["cascade-first-blended"]["metrics"]["ndcg@10"] == hybrid["ndcg@10"]
    assert timings["cascade-blended@3_default_pairs_per_query"] == 3
    assert timings["cascade-first-blended_fast_pairs_per_query"] == 4
    pooled = report["macro"]["versus"]["hybrid"]["hybrid-reranked"]
    assert pooled["queries"] == 2 * len(test_side)
    assert 0 <= pooled["p_values"]["fisher"] <= 1
    reliability = report["datasets"][0]["reliability"]
    assert "ece_calibrated" in reliability["cascade-first"]  # the student has a calibration
    assert "ece_calibrated" not in reliability["hybrid-reranked"]
    markdown = (output / "report.md").read_text()
    assert "NDCG@10 against hybrid" in markdown
    assert "The rerankers' work" in markdown
    work = markdown.split("The rerankers' work")[1]
    cascade_row = next(line for line in work.splitlines() if line.startswith("| cascade |"))
    assert cascade_row.rstrip(" |").endswith("| 2.0 | 4.0")
    # Blended wholly into hybrid, the teacher gains nothing, so there is no share to keep.
    kept = markdown.split("keeps of the default one's gain over hybrid")[1].split(
        "\n## ", maxsplit=1
    )[0]
    assert "| hybrid-reranked | cascade-first |" in kept
    assert "| hybrid-blended | cascade-first-blended | +0.0000 | +0.0000 | none to keep |" in kept
