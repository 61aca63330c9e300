"""Search latency of each reranker and each cascade: `/v1/search` p50 and p99 on an idle CPU
server, with the default (large) reranker alone, the fast one alone, and the cascade at each K.

    export RAGRANK_RERANK_MODELS=teacher=runs/rerankers/teacher/model,\\
    student=runs/rerankers/student/model
    python -m eval.bench.cascade --data ../shared/data/xquad-r/en

`ragrank serve` runs in a subprocess on an embedded store with the models of the usual
RAGRANK_* settings; the folder's corpus is indexed through its jobs API and waited for. Each
configuration then answers `--searches` of the folder's queries, one after another, after a
few unmeasured ones; the request's `cascade` and `model` pick the configuration, so one server
measures them all. The server's own timings give each stage's pairs and milliseconds.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from eval.bench.contention import (
    JOB_TIMEOUT_S,
    WARM_UP_SEARCHES,
    post_documents,
    scratch_server_env,
    wait_for_jobs,
)
from eval.bench.harness import free_port, latency_quantile, ragrank_command, server_process
from eval.bench.options import CascadeBenchOptions
from ragrank.beir import load_beir
from ragrank.options import parse_options

if TYPE_CHECKING:
    from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_options(
        CascadeBenchOptions, argv, prog="python -m eval.bench.cascade", description=__doc__
    )
    dataset = load_beir(options.data)
    documents = list(dataset.corpus.values())
    queries = list(dataset.queries.values())[:500]
    with tempfile.TemporaryDirectory(prefix="ragrank-cascade-") as folder:
        figures = _measure(options, Path(folder), documents, queries)
    print(json.dumps(figures, indent=2))
    if options.out:
        options.out.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


def configurations(options: CascadeBenchOptions) -> dict[str, dict[str, Any]]:
    """Each configuration's request fields: the large reranker alone, the fast one alone, and
    the cascade at each K."""
    alone: dict[str, dict[str, Any]] = {
        "default reranker": {"cascade": False},
        f"{options.fast} alone": {"cascade": False, "model": options.fast},
    }
    return alone | {
        f"cascade K={top}": {"cascade": {"model": options.fast, "top": top}} for top in options.tops
    }


def _measure(
    options: CascadeBenchOptions, scratch: Path, documents: list[Any], queries: list[str]
) -> dict[str, Any]:
    port = free_port()
    env = scratch_server_env(scratch, "cascade", port, timeout_s=JOB_TIMEOUT_S)
    base = f"http://127.0.0.1:{port}"
    figures: dict[str, Any] = {}
    with (
        server_process(ragrank_command("serve"), env, base + "/ready", scratch / "server.log"),
        httpx.Client(base_url=base, timeout=JOB_TIMEOUT_S) as http,
    ):
        started = time.perf_counter()
        wait_for_jobs(http, post_documents(http, documents, options.batch))
        figures["indexing_s"] = round(time.perf_counter() - started, 1)
        figures["models"] = {
            card["id"]: f"{card['model']} ({card['backend']})"
            for card in http.get("/v1/models").json()["data"]
        }
        for name, fields in configurations(options).items():
            body = {"top_k": 10, "candidates": options.candidates, **fields}
            for query in queries[:WARM_UP_SEARCHES]:
                _search(http, {**body, "query": query})
            searches = [
                _search(http, {**body, "query": queries[i % len(queries)]})
                for i in range(options.searches)
            ]
            figures[name] = summarise(searches)
    return figures


def summarise(searches: Sequence[tuple[float, list[dict[str, Any]]]]) -> dict[str, Any]:
    """One configuration's figures from its searches (client ms, rerank stages): p50 and p99,
    and for each stage in order its mean pairs and p50 ms, which say where a cascade's time
    goes (the fast pass over every candidate, the large one over K)."""
    stages = [list(column) for column in zip(*(found for _, found in searches), strict=True)]
    return {
        "p50_ms": latency_quantile([spent for spent, _ in searches], 50),
        "p99_ms": latency_quantile([spent for spent, _ in searches], 99),
        "pairs_per_search": [
            round(sum(stage["pairs"] for stage in column) / len(column), 1) for column in stages
        ],
        "stage_p50_ms": [
            latency_quantile([stage["ms"] for stage in column], 50) for column in stages
        ],
    }


def _search(http: httpx.Client, body: dict[str, Any]) -> tuple[float, list[dict[str, Any]]]:
    """Milliseconds one search takes from the client's side, and its rerank stages."""
    started = time.perf_counter()
    answer = http.post("/v1/search", json=body)
    elapsed = (time.perf_counter() - started) * 1000
    answer.raise_for_status()
    stages: list[dict[str, Any]] = answer.json()["timings_ms"]["rerank_stages"]
    return elapsed, stages


if __name__ == "__main__":
    raise SystemExit(main())
