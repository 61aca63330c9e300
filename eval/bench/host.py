"""`ragrank bench --host-only`: the server's host path (HTTP, tokenising, planning, batching,
collating) against the tokenizer alone, with a model that costs about nothing.

One run measures, on the same (query, abstract) pairs:

* ``tokenizer``: the model's fast tokenizer alone, pinned to one core, encoding the pairs into
  padded tensors in batches of 16, 32 and 64 (the best counts). This is what one core can feed.
* ``server``: `/v1/rerank` on a real `ragrank serve` with a zero-layer cross-encoder (the real
  XLM-R tokenizer, embeddings and a head, no transformer layers), at 4, 16 and 64 concurrent
  clients, each request one query with `--documents` abstracts.

On a GPU the model is fast enough that this host path decides the throughput; the ratio
server / tokenizer says how much of one core's tokenizing the whole server delivers.
"""

from __future__ import annotations

import asyncio
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from eval.bench.harness import (
    RunResult,
    Workload,
    drive,
    free_port,
    ragrank_command,
    server_process,
)
from eval.bench.options import bench_data
from ragrank.beir import load_beir
from ragrank.errors import RagrankError

if TYPE_CHECKING:
    from eval.bench.options import BenchOptions

console = Console()

CLIENTS = (4, 16, 64)
TOKENIZER_BATCHES = (16, 32, 64)
#: The ratio server / tokenizer at 16 clients that the host path must reach on 2 cores.
TARGET = 1.0


def build_zero_layer_model(tokenizer_file: Path, out: Path) -> Path:
    """A one-logit XLM-R cross-encoder with no transformer layers: the real tokenizer and the
    real vocabulary's embeddings, so every host cost is real and the model's is about nil."""
    from transformers import XLMRobertaConfig

    from eval.random_models import load_tokenizer, save_random_model

    tokenizer = load_tokenizer(tokenizer_file, out.with_name(out.name + "-tok"), 512)
    config = XLMRobertaConfig(
        vocab_size=len(tokenizer),
        hidden_size=16,
        num_hidden_layers=0,
        num_attention_heads=1,
        intermediate_size=16,
        max_position_embeddings=514,
        type_vocab_size=1,
        pad_token_id=tokenizer.pad_token_id,
    )
    return save_random_model("reranker", config, tokenizer, out)


def build_requests(
    data: Path, *, requests: int, documents: int, seed: int = 0
) -> list[tuple[str, list[str]]]:
    """`requests` random queries of `data`, each with `documents` random abstracts (title and
    text), whole: the server windows them as it would any client's."""
    dataset = load_beir(data)
    rng = random.Random(seed)
    queries = sorted(dataset.queries.values())
    passages = [f"{d.title} {d.text}".strip() for d in dataset.corpus.values()]
    return [
        (rng.choice(queries), rng.sample(passages, min(documents, len(passages))))
        for _ in range(requests)
    ]


def tokenizer_only(model: Path, pairs_file: Path, batch_sizes: list[int]) -> dict[str, float]:
    """Pairs/s of the fast tokenizer alone into padded tensors, per batch size (run pinned to
    one core: see `main`)."""
    from transformers import AutoTokenizer

    factory: Any = AutoTokenizer  # transformers' factories are untyped
    tokenizer = factory.from_pretrained(str(model))
    pairs = json.loads(pairs_file.read_text(encoding="utf-8"))
    queries, passages = [p[0] for p in pairs], [p[1] for p in pairs]
    result: dict[str, float] = {}
    for size in batch_sizes:
        tokenizer(queries[:size], passages[:size], padding=True, return_tensors="pt")  # warm-up
        started = time.perf_counter()
        for start in range(0, len(pairs), size):
            tokenizer(
                queries[start : start + size],
                passages[start : start + size],
                padding=True,
                truncation="longest_first",
                max_length=512,
                return_tensors="pt",
            )
        result[str(size)] = len(pairs) / (time.perf_counter() - started)
    return result


def _one_core_tokenizer(model: Path, pairs: list[tuple[str, str]], scratch: Path) -> RunResult:
    pairs_file = scratch / "pairs.json"
    pairs_file.write_text(json.dumps(pairs), encoding="utf-8")
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "RAYON_NUM_THREADS": "1"}
    command = [sys.executable, "-m", "eval.bench.host", "tokenizer", str(model), str(pairs_file)]
    core = sorted(os.sched_getaffinity(0))[0]
    output = subprocess.run(
        ["taskset", "-c", str(core), *command] if _has_taskset() else command,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if output.returncode != 0:
        raise RagrankError(f"the tokenizer run failed:\n{output.stderr[-3000:]}")
    sweep: dict[str, float] = json.loads(output.stdout.strip().splitlines()[-1])
    best = max(sweep, key=lambda size: sweep[size])
    result = RunResult("tokenizer, 1 core", len(pairs), len(pairs) / sweep[best])
    result.batch_size = int(best)
    result.note = ", ".join(f"{size}: {rate:.0f}/s" for size, rate in sweep.items())
    return result


def _has_taskset() -> bool:
    from shutil import which

    return which("taskset") is not None


def run(options: BenchOptions) -> int:
    """The host-path benchmark: prints the table and the verdict, writes JSON."""
    if not options.tokenizer.exists():
        raise RagrankError(
            f"--host-only needs the XLM-R tokenizer at {options.tokenizer}; pass --tokenizer"
        )
    data = bench_data(options.data)
    out = options.out or Path("eval-results") / time.strftime("bench-host-%Y%m%d-%H%M%S.json")
    requests = build_requests(
        data, requests=options.host_requests, documents=options.documents, seed=options.seed
    )
    pairs = [(query, doc) for query, docs in requests for doc in docs]
    with tempfile.TemporaryDirectory(prefix="ragrank-bench-host-") as scratch_dir:
        scratch = Path(scratch_dir)
        model = build_zero_layer_model(options.tokenizer, scratch / "zero-layer")
        console.print(
            f"zero-layer XLM-R cross-encoder | {platform.processor() or platform.machine()}, "
            f"{os.cpu_count()} cores | data {data}: {len(requests)} requests x {options.documents} "
            f"abstracts"
        )
        baseline = _one_core_tokenizer(model, pairs, scratch)
        console.print(f"tokenizer alone, 1 core: {baseline.pairs_per_s:.0f} pairs/s")
        results = [baseline]
        port = free_port()
        env = {
            **os.environ,
            "RAGRANK_RERANK_MODEL": str(model),
            "RAGRANK_EMBED_MODEL": str(model),
            "RAGRANK_QDRANT_PATH": str(scratch / "qdrant"),
            "RAGRANK_QDRANT_URL": "",
            "RAGRANK_HOST": "127.0.0.1",
            "RAGRANK_PORT": str(port),
            "RAGRANK_DEVICE": options.device,
            "RAGRANK_REQUEST_TIMEOUT_S": "3600",
            "RAGRANK_LOG_LEVEL": "WARNING",
        }
        base = f"http://127.0.0.1:{port}"
        workload = Workload(requests=requests, lengths=[])
        with server_process(
            ragrank_command("serve"),
            env,
            base + "/ready",
            scratch / "serve.log",
        ):

            def body(query: str, docs: list[str]) -> dict[str, Any]:
                return {"query": query, "documents": docs}

            warmup = Workload(requests=requests[:8], lengths=[])
            asyncio.run(drive(base + "/v1/rerank", body, warmup, 4))
            for clients in CLIENTS:
                seconds, latencies = asyncio.run(
                    drive(base + "/v1/rerank", body, workload, clients)
                )
                result = RunResult(f"server, {clients} clients", len(pairs), seconds, latencies)
                results.append(result)
                console.print(f"{result.name}: {result.pairs_per_s:.0f} pairs/s")
    report = _report(results, baseline, data, options)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    console.print(f"wrote {out}")
    return 0


def _report(
    results: list[RunResult], baseline: RunResult, data: Path, options: BenchOptions
) -> dict[str, Any]:
    table = Table(title="host path: /v1/rerank with a zero-layer model vs the tokenizer alone")
    for column in ("run", "pairs/s", "p50 ms", "p99 ms", "x tokenizer"):
        table.add_column(column, justify="left" if column == "run" else "right")
    for result in results:
        summary = result.summary()
        table.add_row(
            result.name,
            f"{result.pairs_per_s:.0f}",
            "-" if summary["p50_ms"] is None else f"{summary['p50_ms']:.0f}",
            "-" if summary["p99_ms"] is None else f"{summary['p99_ms']:.0f}",
            f"{result.pairs_per_s / baseline.pairs_per_s:.2f}",
        )
    console.print(table)
    at_16 = next(r for r in results if r.name == "server, 16 clients")
    ratio = at_16.pairs_per_s / baseline.pairs_per_s
    verdict = "ok" if ratio >= TARGET else "BELOW"
    console.print(
        f"server at 16 clients / tokenizer on 1 core: {ratio:.2f} (target >= {TARGET}) {verdict}"
    )
    return {
        "data": str(data),
        "documents": options.documents,
        "requests": options.host_requests,
        "cores": os.cpu_count(),
        "tokenizer_threads": os.environ.get("RAGRANK_TOKENIZER_THREADS", "auto"),
        "runs": [r.summary() for r in results],
        "ratio_16_clients": round(ratio, 3),
        "target": TARGET,
    }


def main(argv: list[str] | None = None) -> int:
    """`python -m eval.bench.host tokenizer MODEL PAIRS_JSON`: the one-core tokenizer run."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 3 or argv[0] != "tokenizer":
        print("usage: python -m eval.bench.host tokenizer MODEL PAIRS_JSON", file=sys.stderr)
        return 2
    sweep = tokenizer_only(Path(argv[1]), Path(argv[2]), list(TOKENIZER_BATCHES))
    print(json.dumps(sweep))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
