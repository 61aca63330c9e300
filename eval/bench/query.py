"""Per-query latency of /v1/search's pipeline (embed, retrieve, rerank) on the bundled sample.

    python -m eval.bench.query --candidates 20 50 --repeat 3

Models and device come from the usual RAGRANK_* settings. The sample is indexed into a
temporary embedded Qdrant, then a real `ragrank serve` answers every sample query `--repeat`
times per candidate count, and the stage timings it reports (`timings` in each answer) are
collected. Prints the median and p95 of each stage.
"""

from __future__ import annotations

import os
import platform
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np
import torch

from eval.bench.harness import free_port, ragrank_command, server_process
from indexing import Indexer
from ragrank import SAMPLE_DATASET
from ragrank.backends.serving import load_inference
from ragrank.beir import load_beir
from ragrank.device import resolve_placement
from ragrank.errors import RagrankError
from ragrank.options import option, parse_options
from ragrank.settings import Settings, env_name
from ragrank.store import open_store

if TYPE_CHECKING:
    from collections.abc import Sequence

STAGES = ("embed", "sparse", "retrieve", "rerank", "total")


@dataclass(frozen=True, kw_only=True)
class QueryOptions:
    candidates: tuple[int, ...] = option((20, 50), "candidate counts to measure")
    repeat: int = option(3, "times each sample query runs per candidate count")


def _measure(base: str, queries: list[str], candidates: int, repeat: int) -> dict[str, list[float]]:
    timings: dict[str, list[float]] = {stage: [] for stage in STAGES}
    with httpx.Client(base_url=base, timeout=600) as http:

        def search(query: str, top_k: int) -> dict[str, float]:
            body = {"query": query, "top_k": top_k, "candidates": candidates, "rerank": True}
            answer = http.post("/v1/search", json=body)
            if answer.status_code != 200:
                raise RagrankError(f"/v1/search answered {answer.status_code}: {answer.text}")
            stages: dict[str, float] = answer.json()["timings"]
            return stages

        search(queries[0], 1)  # warm-up
        for _ in range(repeat):
            for query in queries:
                stages = search(query, min(10, candidates))
                for stage in STAGES:
                    timings[stage].append(stages[stage])
    return timings


def _index_sample(settings: Settings) -> str:
    """Index the sample into the settings' folder, and close it for the server to open."""
    inference = load_inference(settings, rerankers=False)
    store = open_store(settings)
    try:
        with inference.running():
            indexer = Indexer.from_settings(settings, inference.bulk_embedder(), store)
            return str(indexer.index(load_beir(SAMPLE_DATASET).corpus.values(), progress=False))
    finally:
        store.close()


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_options(
        QueryOptions, argv, prog="python -m eval.bench.query", description=__doc__
    )
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        overrides: dict[str, Any] = {
            "qdrant_path": work / "qdrant",
            "jobs_path": work / "jobs.sqlite3",
            "collection": "bench",
        }
        settings = Settings.from_env(qdrant_url="", **overrides)
        placement = resolve_placement(settings.device, settings.dtype)
        summary = _index_sample(settings)
        queries = list(load_beir(SAMPLE_DATASET).queries.values())
        print(
            f"embedder {settings.embed_model} | reranker {settings.rerank_model}\n"
            f"device {placement.device} {placement.dtype} | torch threads "
            f"{torch.get_num_threads()} | {platform.processor() or platform.machine()}\n"
            f"{summary}; {len(queries)} queries x {options.repeat}"
        )
        port = free_port()
        env = {**os.environ, **{env_name(k): str(v) for k, v in overrides.items()}}
        env[env_name("qdrant_url")] = ""
        command = ragrank_command("serve", "--port", str(port))
        base = f"http://127.0.0.1:{port}"
        with server_process(command, env, base + "/ready", work / "server.log"):
            print(f"{'candidates':>10} " + " ".join(f"{s + ' p50/p95 ms':>22}" for s in STAGES))
            for candidates in options.candidates:
                timings = _measure(base, queries, candidates, options.repeat)
                quantiles = [np.percentile(timings[s], [50, 95]) for s in STAGES]
                cells = [f"{p50:>10.1f} / {p95:>8.1f}" for p50, p95 in quantiles]
                print(f"{candidates:>10} " + " ".join(f"{c:>22}" for c in cells))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
