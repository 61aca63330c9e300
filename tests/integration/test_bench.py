"""`ragrank bench`: the workload, the model-only ceiling and a small end-to-end run against real
`ragrank serve` processes (tiny random models: the numbers mean nothing, the mechanics do)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import pytest
import torch

from cli import main
from eval.bench.harness import RunResult
from eval.bench.load import build_workload, measure_ceiling, throughput_ratio
from ragrank import SAMPLE_DATASET
from ragrank.backends.models import CrossEncoderScorer
from ragrank.device import Placement

if TYPE_CHECKING:
    from pathlib import Path


def test_workload_documents_fit_the_model_in_one_window(scorer: CrossEncoderScorer):
    workload = build_workload(scorer, SAMPLE_DATASET, requests=5, documents=7, seed=3)
    assert len(workload.requests) == 5
    assert all(len(docs) == 7 for _, docs in workload.requests)
    assert len(workload.pairs) == len(workload.lengths) == 35
    for query, docs in workload.requests:
        plan = scorer.plan_windows(query, docs)
        assert plan.owners == list(range(len(docs))), "a document would need two windows"
        assert max(plan.lengths) <= scorer.max_length
    again = build_workload(scorer, SAMPLE_DATASET, requests=5, documents=7, seed=3)
    assert again.requests == workload.requests


def test_long_documents_are_cut_to_their_first_window(scorer: CrossEncoderScorer, tmp_path: Path):
    (tmp_path / "qrels").mkdir()
    long_text = " ".join(f"word{i}" for i in range(3000))
    (tmp_path / "corpus.jsonl").write_text(json.dumps({"_id": "d", "text": long_text}) + "\n")
    (tmp_path / "queries.jsonl").write_text(json.dumps({"_id": "q", "text": "a query"}) + "\n")
    (tmp_path / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq\td\t1\n")
    workload = build_workload(scorer, tmp_path, requests=1, documents=1)
    (query, (doc,)) = workload.requests[0]
    assert long_text.startswith(doc) and len(doc) < len(long_text)
    assert scorer.plan_windows(query, [doc]).owners == [0]


def test_ceiling_times_every_pair_at_the_best_batch_size(scorer: CrossEncoderScorer):
    workload = build_workload(scorer, SAMPLE_DATASET, requests=4, documents=6)
    result, sweep = measure_ceiling(scorer, workload.pairs, [2, 8], sweep_pairs=12)
    assert set(sweep) == {2, 8} and all(rate > 0 for rate in sweep.values())
    assert result.batch_size == max(sweep, key=lambda size: sweep[size])
    assert result.pairs == 24 and result.seconds > 0


def test_ratios_compare_measured_throughputs():
    results = {
        "ceiling": RunResult("ceiling", 100, 10.0),
        "ragrank": RunResult("ragrank", 90, 10.0),
        "ragrank-openvino": RunResult("ragrank-openvino", 120, 10.0),
        "infinity": RunResult("infinity", 80, 10.0),
    }
    assert throughput_ratio(results, "ragrank", "ceiling") == pytest.approx(0.9)
    assert throughput_ratio(results, "best ragrank", "infinity") == pytest.approx(1.5)
    assert throughput_ratio(results, "ragrank", "arrival") is None


def test_bench_runs_servers_end_to_end_and_writes_json(tiny_reranker_path: Path, tmp_path: Path):
    out = tmp_path / "bench.json"
    code = main(
        [
            "bench",
            "--model",
            str(tiny_reranker_path),
            "--data",
            str(SAMPLE_DATASET),
            "--clients",
            "2",
            "--documents",
            "4",
            "--rounds",
            "2",
            "--batch-sizes",
            "2",
            "4",
            "--runs",
            "ceiling",
            "ragrank",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    report = json.loads(out.read_text())
    runs = {run["name"]: run for run in report["runs"]}
    # One server run: each starts a process; the other policies are the engine's own tests.
    assert set(runs) == {"ceiling", "ragrank"}
    assert all(run["pairs"] == 16 and run["pairs_per_s"] > 0 for run in runs.values())
    assert runs["ragrank"]["p50_ms"] > 0 and runs["ragrank"]["p99_ms"] >= runs["ragrank"]["p50_ms"]
    assert runs["ceiling"]["p50_ms"] is None
    assert set(report["ceiling_sweep"]) == {"2", "4"}
    expected = runs["ragrank"]["pairs_per_s"] / runs["ceiling"]["pairs_per_s"]
    assert report["ratios"]["ragrank / ceiling"]["ratio"] == pytest.approx(expected, abs=2e-3)
    assert report["ratios"]["best ragrank / infinity"]["ratio"] is None
    assert report["workload"]["pairs"] == 16


def test_the_overload_run_answers_only_200_and_429_and_recovers(
    tiny_reranker_path: Path, tmp_path: Path
):
    """The mechanics of `eval.bench.overload` with a tiny model: 4 times the clients on a queue
    of 8 items get 429s with Retry-After; nothing else but 200 comes back."""
    from eval.bench.overload import main as overload

    out = tmp_path / "overload.json"
    argv = ["--model", str(tiny_reranker_path), "--seconds", "1.5", "--clients", "2"]
    argv += ["--queue-size", "8", "--documents", "4", "--out", str(out)]
    assert overload(argv) == 0
    report = json.loads(out.read_text())
    capacity, overload_phase, recovery = report["phases"]
    assert set(overload_phase["statuses"]) <= {"200", "429"}
    assert int(overload_phase["statuses"].get("429", 0)) > 0
    assert (
        overload_phase["retry_after_values"]
        and "missing" not in overload_phase["retry_after_values"]
    )
    assert capacity["answered_per_s"] > 0 and recovery["answered_per_s"] > 0
    assert report["queue_depth_max_items"] <= 8


def test_the_host_benchmark_pieces_measure_what_they_say(tmp_path: Path):
    """`--host-only`: the zero-layer model has no transformer layers and serves through the
    real loading code; the tokenizer-only run encodes every pair at each batch size."""
    from eval.bench.host import (
        build_requests,
        build_zero_layer_model,
        tokenizer_only,
    )
    from eval.bench.options import XLMR_TOKENIZER

    if not XLMR_TOKENIZER.exists():
        pytest.skip("needs ../shared/models")
    model = build_zero_layer_model(XLMR_TOKENIZER, tmp_path / "zero")
    scorer = CrossEncoderScorer(str(model), placement=Placement("cpu", torch.float32))
    assert scorer._runner.config.num_hidden_layers == 0
    requests = build_requests(SAMPLE_DATASET, requests=3, documents=4)
    assert [len(docs) for _, docs in requests] == [4, 4, 4]
    assert scorer.score(requests[0][0], requests[0][1]).shape == (4,)
    pairs = tmp_path / "pairs.json"
    pairs.write_text(json.dumps([(q, d) for q, docs in requests for d in docs]))
    sweep = tokenizer_only(model, pairs, [2, 4])
    assert set(sweep) == {"2", "4"} and all(rate > 0 for rate in sweep.values())


def test_a_gpu_check_step_past_its_limit_is_stopped_with_what_it_started(tmp_path, monkeypatch):
    """The step's process starts another (as bench-gpu starts a server); a timeout stops both,
    and the step says it timed out."""
    import sys
    import time

    from eval.bench import gpu_check

    monkeypatch.setattr(gpu_check, "MIN_STEP_S", 1.0)
    marker = tmp_path / "grandchild-outlived-the-step"
    late_write = f"import pathlib, time; time.sleep(3); pathlib.Path({str(marker)!r}).touch()"
    script = (
        f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {late_write!r}]); "
        "time.sleep(60)"
    )
    step = gpu_check.Step("slow", [sys.executable, "-c", script], 2, tmp_path / "out.json")
    gpu_check.run_step(step, deadline=time.monotonic() + 60, log=tmp_path / "slow.log")
    assert step.status == "timed out after 2 s" and step.result == {}
    time.sleep(3)
    assert not marker.exists()


def test_the_store_benchmark_measures_both_engines(tmp_path: Path, capsys):
    from eval.bench.store import main as bench_store

    code = bench_store(["--sizes", "300", "--queries", "8", "--output", str(tmp_path)])
    assert code == 0
    (written,) = tmp_path.glob("bench-store-*.json")
    rows = json.loads(written.read_text(encoding="utf-8"))
    assert [row["engine"] for row in rows] == ["Qdrant Edge", "qdrant-client local mode"]
    for row in rows:
        # 300 points sit below the indexing threshold: both engines search exactly.
        assert row["recall_at_10"] == row["filtered_recall_at_10"] == 1.0
        assert row["upsert_points_per_s"] > 0 and row["rss_mb"] > 0
    assert rows[0]["ef_for_recall_0_9"]["hnsw_ef"] == 16
    assert "| Qdrant Edge | 300 |" in capsys.readouterr().out


def test_the_family_benchmark_rates_one_reranker_of_each_family(tmp_path: Path):
    """`python -m eval.bench.families --tiny`: a row per family, each scored by its own
    family's code, from the shared configs (skipped without them)."""
    from eval.bench import families

    if not (families.MINILM.is_dir() and families.BGE.is_dir()):
        pytest.skip("needs the shared model configs")
    out = tmp_path / "families.json"
    code = families.main(
        [
            *("--tiny", "--device", "cpu", "--queries", "1", "--documents", "2"),
            *("--data", str(SAMPLE_DATASET), "--out", str(out)),
        ]
    )
    assert code == 0
    rows = json.loads(out.read_text())["families"]
    assert {name: row["family"] for name, row in rows.items()} == {
        "minilm-l6": "bert",
        "bge-reranker-v2-m3": "xlm-roberta",
        "modernbert-base": "modernbert",
        "qwen3-reranker-0.6b": "qwen3-reranker",
    }
    assert all(row["pairs"] == 2 and row["pairs_per_s"] > 0 for row in rows.values())
    # The decoder's pairs carry its prompt.
    assert rows["qwen3-reranker-0.6b"]["tokens_mean"] > rows["bge-reranker-v2-m3"]["tokens_mean"]


def test_the_cascade_benchmark_summarises_each_stage_in_order():
    from eval.bench.cascade import configurations, summarise
    from eval.bench.options import CascadeBenchOptions

    names = list(configurations(CascadeBenchOptions(tops=(5, 10))))
    assert names == ["default reranker", "student alone", "cascade K=5", "cascade K=10"]
    searches = [
        (float(total), [{"pairs": 20, "ms": fast}, {"pairs": top, "ms": large}])
        for total, fast, large, top in [(100, 10, 80, 5), (300, 30, 60, 10), (200, 20, 70, 6)]
    ]
    figures = summarise(searches)
    assert figures["p50_ms"] == 200.0
    assert figures["pairs_per_search"] == [20.0, 7.0]
    assert figures["stage_p50_ms"] == [20.0, 70.0]
    assert summarise([(50.0, [])])["stage_p50_ms"] == []
