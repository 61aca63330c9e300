"""`make gpu-check`'s table: on a GPU each figure is judged against its target, and a figure
below its target reads "missed"."""

from __future__ import annotations

from pathlib import Path

import pytest

from eval.bench.gpu_check import Step, checks, gpu_test_modules, markdown


def bench_result(pairs_per_s: float, over_model: float, agreement: float) -> dict:
    entry = {
        "packed": {"pairs_per_s": pairs_per_s, "peak_share": 0.5},
        "padded": {"pairs_per_s": pairs_per_s / 2, "peak_share": 0.25},
        "packed_over_padded": 2.0,
    }
    return {
        "dtype": "torch.bfloat16",
        "matmul_peak_tflops": 700.0,
        "reranker": {
            **dict.fromkeys(("128", "256", "512", "scifact"), entry),
            "scifact_packed_by_budget": {"32768": pairs_per_s},
            "scifact_packed_by_kernel": {"sdpa": pairs_per_s, "flash": "unavailable: ImportError"},
        },
        "server": {
            "first_request_ms": {"warmup_on": 150.0, "warmup_off": 900.0},
            "16": {"pairs_per_s": 1.0, "p50_ms": 1, "p99_ms": 2, "over_model_only": 0.5},
            "64": {"pairs_per_s": 1.0, "p50_ms": 1, "p99_ms": 2, "over_model_only": over_model},
        },
        "embedder": {"packed": 10.0, "padded": 5.0},
        "agreement": {
            "spread": {"top10": agreement, "logit_spread": 1.0, "spread_over_error": 50.0},
            "default_init": {"top10": 0.4, "logit_spread": 1e-4, "spread_over_error": 0.2},
        },
        "families": {
            "qwen3-reranker-0.6b": {
                "family": "qwen3-reranker",
                "shape_of": "Qwen/Qwen3-Reranker-0.6B",
                "tokenizer": "XLM-R's (stand-in)",
                "pairs_per_s": 900.0,
                "tokens_mean": 410.0,
            }
        },
    }


def verdicts(result: dict, *, targets: bool = True) -> dict[str, str]:
    step = Step("bench-gpu", [], 1, Path("bench-gpu.json"), status="ok", result=result)
    return {row["check"]: row["verdict"] for row in checks([step], targets=targets)}


def test_figures_at_their_targets_are_met_and_below_them_missed():
    met = verdicts(bench_result(2400, 0.95, 1.0))
    missed = verdicts(bench_result(1500, 0.5, 0.9))
    judged = {
        "reranker alone, SciFact lengths, packed",
        "/v1/rerank, 64 clients x 32 abstracts",
        "top-10 agreement, torch.bfloat16 packed against fp32 padded",
    }
    assert {met[name] for name in judged} == {"met"}
    assert {missed[name] for name in judged} == {"missed"}
    # A figure with no target is reported, not judged: each family's rate among them.
    assert met["/v1/rerank, 16 clients x 32 abstracts"] == ""
    family = "qwen3-reranker-0.6b alone (qwen3-reranker family, Qwen/Qwen3-Reranker-0.6B shape)"
    assert met[f"{family}, SciFact lengths"] == ""


def test_a_cpu_run_judges_nothing_and_a_step_that_failed_shows_in_the_table():
    assert set(verdicts(bench_result(1500, 0.5, 0.9), targets=False).values()) == {""}
    report = {
        "tiny": False,
        "device": "cuda",
        "dtype": "torch.bfloat16",
        "created": "now",
        "models_built_s": 1.0,
        "seconds": 2.0,
        "checks": [],
        "steps": {"tests": {"status": "timed out after 150 s", "seconds": 150.0}},
    }
    assert "| tests | timed out after 150 s | 150.0 |" in markdown(report)


def test_only_the_modules_with_gpu_tests_are_collected():
    modules = gpu_test_modules()
    assert "tests/integration/test_packing.py" in modules
    assert all("mark.gpu" in Path(m).read_text() for m in modules)
    assert "tests/integration/test_fuzz.py" not in modules


def test_an_exact_search_without_faiss_gpu_is_reported_not_failed():
    exact = {
        "against": "numpy float64",
        "identical": 10,
        "identical_up_to_ties": 10,
        "queries": 10,
        "top": 100,
        "faiss": "faiss-cpu 1.15.1 on the CPU",
    }
    step = Step("exact", [], 1, Path("exact.json"), status="ok", result=exact)
    (row,) = checks([step], targets=True)
    assert row["figure"].startswith("faiss-gpu not installed")
    assert row["verdict"] == ""


def test_a_step_output_that_lacks_a_figure_is_an_error_not_a_silent_gap():
    result = bench_result(2400, 0.95, 1.0)
    del result["reranker"]["scifact_packed_by_budget"]
    with pytest.raises(KeyError, match="scifact_packed_by_budget"):
        verdicts(result)
    load = Step("load-64", [], 1, Path("load-64.json"), status="ok", result={"runs": []})
    with pytest.raises(KeyError, match="ragrank"):
        checks([load], targets=False)
