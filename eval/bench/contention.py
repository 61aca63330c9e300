"""Search latency while indexing: `/v1/search` p50 and p99 on an idle server, then while an
indexing job runs through the same server's in-process worker.

    python -m eval.bench.contention --data ../shared/data/scifact --limit 2000
    python -m eval.bench.contention --data ../shared/data/scifact --limit 2000 --device-model 1

`ragrank serve` runs in a subprocess on an embedded store, with the models of the usual
RAGRANK_* settings (with `--device-model`, both forward passes are the calibrated H200 model of
`eval.bench.device_model`, batched as on a GPU, and everything else, tokenising, chunking, BM25,
the store, is real).
First `--base` documents are indexed and waited for; then, after a few unmeasured ones,
`--searches` searches run one after another on the idle server; then the next `--limit`
documents are posted as jobs of `--batch`, and searches run one after another until the worker
has indexed them all. The indexer's
passages go through the embedder's engine as bulk work, which yields to searches: a search
waits at most for the one batch on the device.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from eval.bench.device_model import H200_BATCH_TOKENS
from eval.bench.harness import free_port, latency_quantile, ragrank_command, server_process
from eval.bench.options import ContentionBenchOptions
from eval.bench.served import BATCH_ITEMS
from indexing import read_documents
from ragrank.options import parse_options

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ragrank.documents import Document

#: Searches before the measured ones: the first of a server pay for caches filling.
WARM_UP_SEARCHES = 10
#: How long the benchmark waits for a job before it gives up.
JOB_TIMEOUT_S = 3600.0


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_options(
        ContentionBenchOptions, argv, prog="python -m eval.bench.contention", description=__doc__
    )
    corpus = options.data / "corpus.jsonl"
    if not corpus.exists():
        corpus = options.data / "corpus.jsonl.gz"
    documents = list(islice(read_documents(corpus), options.base + options.limit))
    queries = [d.text for d in islice(read_documents(options.data / "queries.jsonl"), 300)]
    with tempfile.TemporaryDirectory(prefix="ragrank-contention-") as folder:
        figures = _measure(options, Path(folder), documents, queries)
    print(json.dumps(figures, indent=2))
    if options.out:
        options.out.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


def _measure(
    options: ContentionBenchOptions, scratch: Path, documents: list[Document], queries: list[str]
) -> dict[str, Any]:
    port = free_port()
    env = scratch_server_env(scratch, "contention", port, timeout_s=600)
    if options.device_model is None:
        command = ragrank_command("serve")
    else:
        speed = str(options.device_model)
        command = [sys.executable, "-m", "cli.device_model_server", speed, "--embedder"]
        # The batch limits a GPU runs with (`make bench-served`'s), for both models.
        for role in ("EMBED", "RERANK"):
            env.setdefault(f"RAGRANK_{role}_BATCH_SIZE", str(BATCH_ITEMS))
            env.setdefault(f"RAGRANK_{role}_BATCH_TOKENS", str(H200_BATCH_TOKENS))
    base = f"http://127.0.0.1:{port}"
    with (
        server_process(command, env, base + "/ready", scratch / "server.log"),
        httpx.Client(base_url=base, timeout=600) as http,
    ):
        wait_for_jobs(http, post_documents(http, documents[: options.base], options.batch))
        for query in queries[:WARM_UP_SEARCHES]:
            _search(http, query, options)
        idle_stages: dict[str, list[float]] = {}
        idle = [
            _search(http, queries[i % len(queries)], options, idle_stages)
            for i in range(options.searches)
        ]
        started = time.perf_counter()
        jobs = post_documents(http, documents[options.base :], options.batch)
        busy: list[float] = []
        busy_stages: dict[str, list[float]] = {}
        while not _done(http, jobs):
            busy.append(_search(http, queries[len(busy) % len(queries)], options, busy_stages))
        indexing_s = time.perf_counter() - started
        chunks = sum(_status(http, job)["counts"].get("chunks", 0) for job in jobs)
        models = http.get("/v1/models").json()["data"]
    return {
        "device": "device model (H200 fit)" if options.device_model is not None else "cpu",
        "device_model_speed": options.device_model,
        "models": {card["type"]: f"{card['model']} ({card['backend']})" for card in models},
        "documents_indexed": len(documents) - options.base,
        "indexing_s": round(indexing_s, 1),
        "chunks_per_s_while_searching": round(chunks / indexing_s, 1),
        "searches": {"idle": len(idle), "indexing": len(busy)},
        "idle_ms": _quantiles(idle),
        "indexing_ms": _quantiles(busy),
        "p50_ratio": _ratio(busy, idle, 50),
        "p99_ratio": _ratio(busy, idle, 99),
        # Where the server says a search's time went: the median of each stage.
        "idle_stage_ms_p50": _medians(idle_stages),
        "indexing_stage_ms_p50": _medians(busy_stages),
    }


def scratch_server_env(
    scratch: Path, collection: str, port: int, *, timeout_s: float
) -> dict[str, str]:
    """The environment of a benchmark's `ragrank serve`: the usual RAGRANK_* models, an
    embedded store and a job queue in `scratch`, on loopback at `port`."""
    return {
        **os.environ,
        "RAGRANK_QDRANT_PATH": str(scratch / "qdrant"),
        "RAGRANK_QDRANT_URL": "",
        "RAGRANK_JOBS_PATH": str(scratch / "jobs.sqlite3"),
        "RAGRANK_COLLECTION": collection,
        "RAGRANK_HOST": "127.0.0.1",
        "RAGRANK_PORT": str(port),
        "RAGRANK_LOG_LEVEL": "WARNING",
        "RAGRANK_REQUEST_TIMEOUT_S": str(int(timeout_s)),
    }


def post_documents(http: httpx.Client, documents: list[Document], batch: int) -> list[str]:
    """Queue `documents` as jobs of `batch`; their ids."""
    jobs = []
    for start in range(0, len(documents), batch):
        body = {
            "documents": [
                {"id": d.doc_id, "text": d.text, "title": d.title}
                for d in documents[start : start + batch]
            ]
        }
        answer = http.post("/v1/documents", json=body)
        answer.raise_for_status()
        jobs.append(str(answer.json()["job_id"]))
    return jobs


def _status(http: httpx.Client, job: str) -> dict[str, Any]:
    answer = http.get(f"/v1/jobs/{job}")
    answer.raise_for_status()
    status: dict[str, Any] = answer.json()
    return status


def _done(http: httpx.Client, jobs: list[str]) -> bool:
    """Whether every job has ended; a failed one stops the benchmark."""
    for job in jobs:
        state = _status(http, job)["state"]
        if state == "failed":
            raise RuntimeError(f"indexing job {job} failed: {_status(http, job)['errors']}")
        if state != "done":
            return False
    return True


def wait_for_jobs(http: httpx.Client, jobs: list[str]) -> None:
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while not _done(http, jobs):
        if time.monotonic() > deadline:
            raise TimeoutError("the base documents were not indexed in time")
        time.sleep(0.5)


def _search(
    http: httpx.Client,
    query: str,
    options: ContentionBenchOptions,
    stages: dict[str, list[float]] | None = None,
) -> float:
    """Milliseconds one search takes, from the client's side; its server-side stages are
    added to `stages`."""
    body = {"query": query, "top_k": 10, "candidates": options.candidates}
    started = time.perf_counter()
    answer = http.post("/v1/search", json=body)
    elapsed = (time.perf_counter() - started) * 1000
    answer.raise_for_status()
    if stages is not None:
        for stage, spent in answer.json()["timings_ms"].items():
            if isinstance(spent, int | float):  # not the list of rerank stages
                stages.setdefault(stage, []).append(spent)
    return elapsed


def _quantiles(latencies: list[float]) -> dict[str, float | None]:
    return {"p50": latency_quantile(latencies, 50), "p99": latency_quantile(latencies, 99)}


def _medians(stages: dict[str, list[float]]) -> dict[str, float | None]:
    return {stage: latency_quantile(spent, 50) for stage, spent in stages.items()}


def _ratio(busy: list[float], idle: list[float], q: int) -> float | None:
    during, before = latency_quantile(busy, q), latency_quantile(idle, q)
    if during is None or not before:
        return None
    return round(during / before, 2)


if __name__ == "__main__":
    raise SystemExit(main())
