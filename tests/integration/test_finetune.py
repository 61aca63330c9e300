"""`ragrank finetune` end to end on tiny random models and a tiny BEIR collection: a few
training steps, the saved folders served through the server's own loading code, the report,
the held-out queries kept out, and resuming. Random weights: mechanics only, never quality."""

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
from eval.finetune.reranker import load_base, training_rows
from eval.options import FinetuneOptions
from ragrank import SAMPLE_DATASET
from ragrank.backends.models import CrossEncoderScorer, SentenceTransformerEmbedder
from ragrank.beir import load_beir, load_qrels
from ragrank.errors import ModelLoadError
from ragrank.settings import Settings
from server import create_app

if TYPE_CHECKING:
    from pathlib import Path

LEAK_BY_ID = "q01"  # a test query id that the training qrels also judge
LEAK_BY_TEXT = "leak-text"  # a training query carrying a test query's text


@pytest.fixture(scope="module")
def collection(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bundled sample (124 documents, its 16 test queries) plus 30 training queries, each
    a document's title asked as a question, and two training queries that are test queries."""
    root = tmp_path_factory.mktemp("beir")
    shutil.copy(SAMPLE_DATASET / "corpus.jsonl", root / "corpus.jsonl")
    (root / "qrels").mkdir()
    shutil.copy(SAMPLE_DATASET / "qrels" / "test.tsv", root / "qrels" / "test.tsv")
    documents = [json.loads(line) for line in (root / "corpus.jsonl").read_text().splitlines()[:30]]
    test_queries = [
        json.loads(line) for line in (SAMPLE_DATASET / "queries.jsonl").read_text().splitlines()
    ]
    train = {f"t{i:02d}": f"What is {doc['title']}?" for i, doc in enumerate(documents)}
    train[LEAK_BY_TEXT] = next(q["text"] for q in test_queries if q["_id"] == "q02")
    with (root / "queries.jsonl").open("w") as queries:
        for qid, text in train.items():
            queries.write(json.dumps({"_id": qid, "text": text}) + "\n")
        for query in test_queries:
            queries.write(json.dumps(query) + "\n")
    rows = [f"t{i:02d}\t{doc['_id']}\t1" for i, doc in enumerate(documents)]
    rows += [f"{LEAK_BY_ID}\tcoffee-en-1\t1", f"{LEAK_BY_TEXT}\tplants-en-1\t1"]
    (root / "qrels" / "train.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(rows))
    return root


def _flags(collection: Path, output: Path, base: Path, embedder: Path) -> list[str]:
    return [
        "--dataset",
        str(collection),
        "--output",
        str(output),
        "--base",
        str(base),
        "--embed-model",
        str(embedder),
        "--device",
        "cpu",
        "--max-steps",
        "2",
        "--batch-size",
        "4",
        # A random model embeds every text alike: only exact copies count as duplicates.
        "--near-duplicate",
        "1.0",
        "--validation-fraction",
        "0.2",
        "--no-cache",
        "--no-progress",
    ]


@pytest.fixture(scope="module")
def reranker_run(
    collection: Path, tiny_embedder_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A reranker started from a plain encoder (the tiny bi-encoder: a fresh head)."""
    output = tmp_path_factory.mktemp("finetune") / "reranker"
    flags = _flags(collection, output, tiny_embedder_path, tiny_embedder_path)
    assert main(["finetune", "reranker", *flags]) == 0
    return output


async def test_the_fine_tuned_reranker_is_served_by_the_server(
    reranker_run: Path, settings: Settings
):
    folder = reranker_run / "model"
    scorer = CrossEncoderScorer.from_settings(replace(settings, rerank_model=str(folder)))
    logits = scorer.score_pairs([("why are leaves green", "chlorophyll"), ("a", "b")])
    assert logits.shape == (2,)
    assert np.isfinite(logits).all()

    services = load_services(replace(settings, rerank_model=str(folder)))
    try:
        app = create_app(replace(settings, rerank_model=str(folder)), services=services)
        async with AsyncTestClient(app=app) as client:
            response = await client.post(
                "/v1/rerank",
                json={"query": "Why are leaves green?", "documents": ["Chlorophyll.", "Tides."]},
            )
    finally:
        services.store.close()
    assert response.status_code == 200, response.text
    assert sorted(r["index"] for r in response.json()["results"]) == [0, 1]


def test_the_report_has_the_loss_curve_and_validation_by_epoch(reranker_run: Path):
    report = json.loads((reranker_run / "report.json").read_text())
    assert report["role"] == "reranker"
    assert report["head"] == "fresh"
    # 30 usable training queries: 20 % validate; the two test queries are dropped.
    assert report["queries"] == {"train": 24, "validation": 6, "held_out_dropped": 2}
    assert report["training_examples"] == 24 * (1 + 4)
    assert [entry["step"] for entry in report["validation_by_epoch"]] == [2]
    assert 0 <= report["validation_by_epoch"][0]["val_ndcg@10"] <= 1
    assert set(report["validation_before"]) == {"val_ndcg@10", "val_recall@10", "val_mrr@10"}
    assert 0 <= report["validation_first_stage"]["val_ndcg@10"] <= 1
    assert "first stage (hybrid order)" in (reranker_run / "report.md").read_text()
    assert report["miner"] == "hybrid"
    assert report["calibration"]["pairs"] == 6 * 20
    assert report["loss"][0]["step"] == 1
    assert np.isfinite(report["loss"][0]["loss"])
    assert report["best"]["step"] == 2
    assert (reranker_run / "training.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "validation NDCG@10" in (reranker_run / "report.md").read_text()


def test_training_never_sees_a_test_query(reranker_run: Path, collection: Path):
    data = TrainingData.from_json(json.loads((reranker_run / "training-data.json").read_text()))
    test = load_qrels(collection / "qrels" / "test.tsv")
    dataset = load_beir(collection, split="train")
    used = {*data.split.train, *data.split.validation, *data.negatives}
    assert not used & set(test)
    assert set(data.split.held_out) == {LEAK_BY_ID, LEAK_BY_TEXT}
    texts = {doc_id: doc.passage for doc_id, doc in dataset.corpus.items()}
    options = FinetuneOptions(dataset=collection, output=reranker_run)
    rows, _, _ = training_rows(dataset.queries, dataset.qrels, texts, data, options)
    test_texts = {dataset.queries[qid] for qid in test}
    assert rows["query"]
    assert not set(rows["query"]) & test_texts
    # Mining never hands a positive back as a negative.
    for qid, negatives in data.negatives.items():
        assert not set(negatives) & set(dataset.qrels[qid])


def test_a_finished_run_is_kept_and_an_interrupted_one_resumes(
    reranker_run: Path, collection: Path, tiny_embedder_path: Path, capsys
):
    flags = _flags(collection, reranker_run, tiny_embedder_path, tiny_embedder_path)
    model = reranker_run / "model" / "model.safetensors"
    written = model.stat().st_mtime_ns
    assert main(["finetune", "reranker", *flags]) == 0
    assert "holds a finished run" in capsys.readouterr().out
    assert model.stat().st_mtime_ns == written

    changed = [*flags, "--learning-rate", "1e-4"]
    assert main(["finetune", "reranker", *changed]) == 2
    assert "differs in the options learning_rate" in capsys.readouterr().err

    # Killed after its checkpoint: the rerun resumes from it instead of starting over, so
    # the checkpoint is not rewritten and its validation pass is in the history unchanged.
    before = json.loads((reranker_run / "report.json").read_text())["validation_by_epoch"][0]
    checkpoint = reranker_run / "checkpoints" / "checkpoint-2" / "model.safetensors"
    saved = checkpoint.stat().st_mtime_ns
    shutil.rmtree(reranker_run / "model")
    (reranker_run / "report.json").unlink()
    assert main(["finetune", "reranker", *flags]) == 0
    assert model.exists()
    assert checkpoint.stat().st_mtime_ns == saved
    report = json.loads((reranker_run / "report.json").read_text())
    assert report["validation_by_epoch"][0] == before
    assert report["loss"][0]["step"] == 1


def test_the_base_may_be_a_cross_encoder_but_not_a_classifier(
    tiny_reranker_path: Path, tmp_path: Path
):
    _, head = load_base(str(tiny_reranker_path), 64, "cpu")
    assert head == "trained"
    classifier = tmp_path / "nli"
    shutil.copytree(tiny_reranker_path, classifier)
    config = json.loads((classifier / "config.json").read_text())
    config["id2label"] = {"0": "a", "1": "b", "2": "c"}
    (classifier / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match=r"3 labels.*--base"):
        load_base(str(classifier), 64, "cpu")


def test_the_fine_tuned_embedder_keeps_its_prefixes(
    collection: Path, tiny_embedder_path: Path, tmp_path: Path
):
    output = tmp_path / "embedder"
    flags = _flags(collection, output, tiny_embedder_path, tiny_embedder_path)
    assert main(["finetune", "embedder", *flags]) == 0
    folder = output / "model"
    # The base is e5-named, so it trained with query:/passage:; the folder says so itself.
    settings = Settings(embed_model=str(folder), device="cpu")
    assert settings.prefixes() == ("query: ", "passage: ")
    embedder = SentenceTransformerEmbedder.from_settings(settings)
    vectors = embedder.embed_queries(["why are leaves green"])
    assert vectors.shape == (1, 32)
    assert np.linalg.norm(vectors, axis=1) == pytest.approx(1.0, abs=1e-5)
    report = json.loads((output / "report.json").read_text())
    assert report["role"] == "embedder"
    assert report["query_prefix"] == "query: "
    assert report["training_examples"] == 24
    assert report["validation_by_epoch"]
    assert f"--baseline-embed-model {tiny_embedder_path}" in (output / "report.md").read_text()


def test_the_listwise_loss_trains_one_list_per_query(
    collection: Path, tiny_reranker_path: Path, tiny_embedder_path: Path, tmp_path: Path
):
    output = tmp_path / "listnet"
    flags = _flags(collection, output, tiny_reranker_path, tiny_embedder_path)
    assert main(["finetune", "reranker", *flags, "--loss", "listnet"]) == 0
    report = json.loads((output / "report.json").read_text())
    assert (report["loss_function"], report["head"]) == ("listnet", "trained")
    assert report["training_examples"] == 24
    assert np.isfinite(report["loss"][0]["loss"])
    assert (output / "model" / "model.safetensors").exists()
