"""`ragrank bench`: `/v1/rerank` under concurrent load, against what the model alone can do.

One run on one machine measures, on the same (query, document) pairs:

* ``ceiling``: the cross-encoder in this process, no HTTP, all pairs sorted by length, at the
  best of `--batch-sizes` (found on a sample, then timed on every pair); per backend.
* ``ragrank``: `ragrank serve` under `--clients` concurrent clients, each sending its requests
  one after another (`--documents` per request); ``ragrank-openvino`` and
  ``ragrank-openvino-int8`` the same on that CPU backend, each with its own ceiling
  (``ceiling-openvino``, ``ceiling-openvino-int8``).
* ``window``: the same server with the window policy (everything waiting sorted across
  requests, answered when the window ends), the previous default.
* ``arrival``: the same server batching windows in arrival order (no length sort).
* ``request``: the same server with cross-request batching off (one request per batch set).
* ``infinity``: Infinity (`infinity_emb v2`, torch engine) serving the same model folder, when
  its executable is found (`--infinity`, or `infinity_emb` on PATH or in `.venv-infinity`).

Every server gets the ceiling's best batch size. Documents are cut so that each pair fits the
model in one window: every system then scores exactly the same tokens (no windows, no silent
truncation). Prints pairs/s, p50/p99 request latency and the ratios; writes JSON.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import platform
import random
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from rich.console import Console
from rich.table import Table

from eval.bench.harness import (
    RunResult,
    Workload,
    drive,
    free_port,
    minilm_reranker,
    ragrank_command,
    server_process,
    small_embedder,
)
from eval.bench.options import BenchOptions, bench_data
from ragrank.backends.models import CrossEncoderScorer
from ragrank.beir import load_beir
from ragrank.device import resolve_placement
from ragrank.options import parse_options

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from ragrank.device import Placement
    from ragrank.protocols import Pair

#: What the server must reach on a 2-core CPU: (numerator, denominator, least ratio).
TARGETS = (
    ("ragrank", "ceiling", 0.9),
    ("ragrank-openvino", "ceiling-openvino", 0.9),
    ("ragrank-openvino-int8", "ceiling-openvino-int8", 0.9),
    ("best ceiling", "ceiling", 2.0),
    ("best ragrank", "infinity", 2.0),
    ("ragrank", "arrival", 1.3),
)

#: The server runs on a CPU backend other than torch, and the backend each runs.
BACKEND_RUNS = {
    "ragrank-openvino": "openvino",
    "ragrank-openvino-int8": "openvino-int8",
}

console = Console()


def build_workload(
    scorer: CrossEncoderScorer,
    data: Path,
    *,
    requests: int,
    documents: int,
    seed: int = 0,
) -> Workload:
    """`requests` random queries of `data` (BEIR layout), each with `documents` random
    passages (title and text), every passage cut to the first window the server would score."""
    dataset = load_beir(data)
    rng = random.Random(seed)
    queries = sorted(dataset.queries.values())
    passages = [f"{d.title} {d.text}".strip() for d in dataset.corpus.values()]
    built: list[tuple[str, list[str]]] = []
    lengths: list[int] = []
    specials = scorer.tokens.template.pair_specials
    for _ in range(requests):
        chosen = rng.sample(passages, min(documents, len(passages)))
        query = rng.choice(queries)
        plan = scorer.plan_windows(query, chosen)
        window = scorer.max_length - specials - plan.query_tokens
        # Two tokens of margin: cut text can tokenise slightly differently at its edge.
        cut = [_first_tokens(scorer, doc, window - 2) for doc in chosen]
        fitted = scorer.plan_windows(query, cut)
        built.append((query, cut))
        lengths.extend(fitted.lengths)
    return Workload(requests=built, lengths=lengths)


def _first_tokens(scorer: CrossEncoderScorer, text: str, count: int) -> str:
    """`text` up to the end of its `count`-th token."""
    spans = scorer.tokens.spans([text])[0]
    return text if len(spans) <= count else text[: spans[max(count, 1) - 1][1]]


def measure_ceiling(
    scorer: CrossEncoderScorer,
    pairs: Sequence[Pair],
    batch_sizes: Sequence[int],
    *,
    sweep_pairs: int = 192,
    seed: int = 0,
) -> tuple[RunResult, dict[int, float]]:
    """The model alone: pairs sorted by length, every batch size timed on a sample, the best
    then timed on all pairs."""
    lengths = [len(item) for item in scorer.tokens.pairs(pairs)]
    sample = random.Random(seed).sample(range(len(pairs)), min(sweep_pairs, len(pairs)))

    def timed(indices: Sequence[int], batch_size: int) -> float:
        ordered = sorted(indices, key=lambda i: lengths[i])
        started = time.perf_counter()
        for start in range(0, len(ordered), batch_size):
            scorer.score_pairs([pairs[i] for i in ordered[start : start + batch_size]])
        return time.perf_counter() - started

    timed(sample[: max(batch_sizes)], max(batch_sizes))  # warm-up
    sweep = {size: len(sample) / timed(sample, size) for size in batch_sizes}
    best = max(sweep, key=lambda size: sweep[size])
    seconds = timed(range(len(pairs)), best)
    return RunResult("ceiling", len(pairs), seconds, batch_size=best), sweep


def measure_server(
    name: str,
    command: list[str],
    env: dict[str, str],
    *,
    port: int,
    path: str,
    ready_path: str,
    body: Callable[[str, list[str]], dict[str, Any]],
    workload: Workload,
    clients: int,
    log: Path,
    batch_size: int,
) -> RunResult:
    base = f"http://127.0.0.1:{port}"
    with server_process(command, env, base + ready_path, log):
        warmup = Workload(requests=workload.requests[:1], lengths=[])
        asyncio.run(drive(base + path, body, warmup, 1))
        seconds, latencies = asyncio.run(drive(base + path, body, workload, clients))
    pairs = sum(len(docs) for _, docs in workload.requests)
    return RunResult(name, pairs, seconds, latencies, batch_size=batch_size)


def find_infinity(given: str | None) -> str | None:
    if given:
        return given
    local = Path(".venv-infinity/bin/infinity_emb")
    return shutil.which("infinity_emb") or (str(local) if local.exists() else None)


def throughput_ratio(results: dict[str, RunResult], top: str, bottom: str) -> float | None:
    """`top`'s pairs/s over `bottom`'s (`best ragrank`, `best ceiling`: the fastest run of
    that kind, any backend); None when either did not run."""
    if top.startswith("best "):
        kind = top.removeprefix("best ")
        mine = [r for n, r in results.items() if n.startswith(kind)]
        if not mine:
            return None
        numerator = max(r.pairs_per_s for r in mine)
    elif top in results:
        numerator = results[top].pairs_per_s
    else:
        return None
    if bottom not in results or not results[bottom].pairs_per_s:
        return None
    return numerator / results[bottom].pairs_per_s


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m eval.bench.load`, the same as `ragrank bench`."""
    return run(
        parse_options(BenchOptions, argv, prog="python -m eval.bench.load", description=__doc__)
    )


def run(options: BenchOptions) -> int:
    """The load benchmark (or, with `host_only`, the host-path one): prints, writes JSON."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if options.host_only:
        from eval.bench.host import run as run_host

        return run_host(options)
    placement = resolve_placement(options.device)
    data = bench_data(options.data)
    out = options.out or Path("eval-results") / time.strftime("bench-load-%Y%m%d-%H%M%S.json")
    with tempfile.TemporaryDirectory(prefix="ragrank-bench-") as scratch_dir:
        scratch = Path(scratch_dir)
        model = options.model or minilm_reranker(scratch / "minilm-l6-reranker")
        scorer = CrossEncoderScorer(model, placement=placement)
        workload = build_workload(
            scorer,
            data,
            requests=options.clients * options.rounds,
            documents=options.documents,
            seed=options.seed,
        )
        console.print(
            f"model {model} | {placement.device} {placement.dtype} | torch "
            f"{torch.__version__}, {torch.get_num_threads()} threads | "
            f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores\n"
            f"data {data}: {workload.describe()}"
        )
        report: dict[str, Any] = {
            "model": model,
            "device": placement.device,
            "data": str(data),
            "workload": workload.describe(),
            "clients": options.clients,
            "documents": options.documents,
        }
        out.parent.mkdir(parents=True, exist_ok=True)
        results: dict[str, RunResult] = {}

        def save(measured: dict[str, RunResult]) -> None:
            """Each run is written as soon as it is measured: a run cut short by a time limit
            still leaves its figures."""
            results.update(measured)
            report["runs"] = [r.summary() for r in results.values()]
            report["ratios"] = _ratios(results)
            out.write_text(json.dumps(report, indent=2) + "\n")

        bench = _Bench(options, model, placement.device.startswith("cuda"), workload, scratch)
        save(bench.ceilings(scorer, placement, report))
        bench.servers(results["ceiling"].batch_size, save)
    _print(results, report)
    console.print(f"wrote {out}")
    return 0


@dataclass
class _Bench:
    """One benchmark run's model, workload and scratch folder, shared by its measurements."""

    options: BenchOptions
    model: str
    gpu: bool
    workload: Workload
    scratch: Path

    @property
    def runs(self) -> list[str]:
        # The backends other than torch run on the CPU only.
        return [r for r in self.options.runs if not (self.gpu and r in BACKEND_RUNS)]

    def ceilings(
        self, scorer: CrossEncoderScorer, placement: Placement, report: dict[str, Any]
    ) -> dict[str, RunResult]:
        """The model alone, in this process: the sweep, and each CPU backend at the best size."""
        results: dict[str, RunResult] = {}
        ceiling, sweep = measure_ceiling(scorer, self.workload.pairs, self.options.batch_sizes)
        results["ceiling"] = ceiling
        report["ceiling_sweep"] = {str(k): round(v, 3) for k, v in sweep.items()}
        console.print(f"ceiling: {ceiling.pairs_per_s:.1f} pairs/s at batch {ceiling.batch_size}")
        report["agreement"], report["conversion"] = {}, {}
        for run, backend in BACKEND_RUNS.items():
            if run not in self.runs:
                continue
            other = CrossEncoderScorer(
                self.model, placement=placement, backend=backend, min_agreement=-1
            )
            report["agreement"][backend] = asdict(other.agreement) if other.agreement else None
            report["conversion"][backend] = str(other.conversion) if other.conversion else None
            result, _ = measure_ceiling(other, self.workload.pairs, [ceiling.batch_size])
            result.name = f"ceiling-{backend}"
            results[result.name] = result
            console.print(f"{result.name}: {result.pairs_per_s:.1f} pairs/s; {other.agreement}")
            del other
        return results

    def servers(self, best: int, save: Callable[[dict[str, RunResult]], None]) -> None:
        """Each server run in `--runs`, at the ceiling's best batch size, saved as it ends."""
        results: dict[str, RunResult] = {}
        plan = {
            "ragrank": ("continuous", "torch"),
            **{run: ("continuous", backend) for run, backend in BACKEND_RUNS.items()},
            "window": ("window", "torch"),
            "arrival": ("arrival", "torch"),
            "request": ("request", "torch"),
        }
        for name, (batching, backend) in plan.items():
            if name in self.runs:
                results[name] = self.ragrank(name, batching, backend, best)
                console.print(f"{name}: {results[name].pairs_per_s:.1f} pairs/s")
                save(results)
        if "infinity" not in self.runs:
            return
        infinity = find_infinity(self.options.infinity)
        if infinity is None:
            console.print(
                "infinity: skipped, no infinity_emb found (pip install "
                "'infinity-emb[server,torch]' into .venv-infinity, or pass --infinity)"
            )
            return
        results["infinity"] = _infinity(
            infinity,
            self.model,
            gpu=self.gpu,
            batch_size=best,
            workload=self.workload,
            clients=self.options.clients,
            scratch=self.scratch,
        )
        console.print(f"infinity: {results['infinity'].pairs_per_s:.1f} pairs/s")
        save(results)

    def ragrank(self, name: str, batching: str, backend: str, best: int) -> RunResult:
        """`ragrank serve` in its own process, under the workload."""
        port = free_port()
        env = {
            **os.environ,
            "RAGRANK_RERANK_MODEL": self.model,
            "RAGRANK_EMBED_MODEL": small_embedder(),
            "RAGRANK_QDRANT_PATH": str(self.scratch / f"qdrant-{name}"),
            "RAGRANK_QDRANT_URL": "",
            "RAGRANK_HOST": "127.0.0.1",
            "RAGRANK_PORT": str(port),
            "RAGRANK_DEVICE": self.options.device,
            "RAGRANK_RERANK_BATCH_SIZE": str(best),
            "RAGRANK_REQUEST_TIMEOUT_S": "3600",
            "RAGRANK_BATCHING": batching,
            "RAGRANK_RERANK_BACKEND": backend,
        }
        return measure_server(
            name,
            ragrank_command("serve"),
            env,
            port=port,
            path="/v1/rerank",
            ready_path="/ready",
            body=lambda q, docs: {"query": q, "documents": docs},
            workload=self.workload,
            clients=self.options.clients,
            log=self.scratch / f"{name}.log",
            batch_size=best,
        )


def _ratios(results: dict[str, RunResult]) -> dict[str, dict[str, float | None]]:
    ratios: dict[str, dict[str, float | None]] = {
        f"{top} / {bottom}": {
            "ratio": _round(throughput_ratio(results, top, bottom)),
            "target": target,
        }
        for top, bottom, target in TARGETS
    }
    for bottom in ("request", "window"):
        ratios[f"ragrank / {bottom}"] = {
            "ratio": _round(throughput_ratio(results, "ragrank", bottom)),
            "target": None,
        }
    return ratios


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _infinity(
    executable: str,
    model: str,
    *,
    gpu: bool,
    batch_size: int,
    workload: Workload,
    clients: int,
    scratch: Path,
) -> RunResult:
    port = free_port()
    command = [
        executable,
        "v2",
        "--model-id",
        model,
        "--served-model-name",
        "bench",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--engine",
        "torch",
        "--device",
        "cuda" if gpu else "cpu",
        "--dtype",
        "float16" if gpu else "float32",
        "--batch-size",
        str(batch_size),
    ]
    env = {**os.environ, "DO_NOT_TRACK": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0"}
    return measure_server(
        "infinity",
        command,
        env,
        port=port,
        path="/rerank",
        ready_path="/health",
        body=lambda q, docs: {"model": "bench", "query": q, "documents": docs},
        workload=workload,
        clients=clients,
        log=scratch / "infinity.log",
        batch_size=batch_size,
    )


def _print(results: dict[str, RunResult], report: dict[str, Any]) -> None:
    table = Table(title="reranking throughput")
    for column in ("run", "batch", "pairs/s", "p50 ms", "p99 ms", "× ceiling"):
        table.add_column(column, justify="left" if column == "run" else "right")
    ceiling = results["ceiling"].pairs_per_s
    for result in results.values():
        summary = result.summary()
        table.add_row(
            result.name,
            str(result.batch_size),
            f"{result.pairs_per_s:.1f}",
            "-" if summary["p50_ms"] is None else f"{summary['p50_ms']:.0f}",
            "-" if summary["p99_ms"] is None else f"{summary['p99_ms']:.0f}",
            f"{result.pairs_per_s / ceiling:.2f}",
        )
    console.print(table)
    for name, entry in report["ratios"].items():
        ratio, target = entry["ratio"], entry["target"]
        if ratio is None:
            console.print(f"{name}: not measured")
            continue
        verdict = "" if target is None else (" ok" if ratio >= target else " BELOW")
        goal = "" if target is None else f" (target >= {target})"
        console.print(f"{name}: {ratio:.2f}{goal}{verdict}")


if __name__ == "__main__":
    raise SystemExit(main())
