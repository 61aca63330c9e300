"""Per-query latency of /v1/search's pipeline (embed, retrieve, rerank) on the bundled sample.

    python -m eval.bench.query --candidates 20 50 --repeat 3

Models and device come from the usual RAGRANK_* settings. The sample is indexed into a
temporary embedded Qdrant, then every sample query runs `--repeat` times per candidate count,
through the same `SearchService` the server uses. Prints the median and p95 of each stage.
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from indexing import Indexer
from ragrank import SAMPLE_DATASET
from ragrank.beir import load_beir
from ragrank.device import resolve_placement
from ragrank.settings import Settings
from server.services import SearchService, Services

if TYPE_CHECKING:
    from collections.abc import Sequence

STAGES = ("embed", "sparse", "retrieve", "rerank", "total")


async def _measure(
    services: Services, settings: Settings, queries: list[str], candidates: int, repeat: int
) -> dict[str, list[float]]:
    timings: dict[str, list[float]] = {stage: [] for stage in STAGES}
    async with SearchService(services, settings) as service:
        await service.search(queries[0], top_k=1, candidates=candidates, rerank=True)  # warm-up
        for _ in range(repeat):
            for query in queries:
                outcome = await service.search(
                    query, top_k=min(10, candidates), candidates=candidates, rerank=True
                )
                for stage in STAGES:
                    timings[stage].append(outcome.timings_ms[stage])
    return timings


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m eval.bench.query", description=__doc__)
    parser.add_argument("--candidates", type=int, nargs="+", default=[20, 50])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as folder:
        settings = Settings.from_env(qdrant_path=Path(folder), qdrant_url="", collection="bench")
        placement = resolve_placement(settings.device, settings.dtype)
        services = Services.load(settings)
        dataset = load_beir(SAMPLE_DATASET)
        summary = Indexer.from_settings(settings, services.embedder, services.store).index(
            dataset.corpus.values(), progress=False
        )
        queries = list(dataset.queries.values())
        print(
            f"embedder {settings.embed_model} | reranker {settings.rerank_model}\n"
            f"device {placement.device} {placement.dtype} | torch threads "
            f"{torch.get_num_threads()} | {platform.processor() or platform.machine()}\n"
            f"{summary}; {len(queries)} queries x {args.repeat}"
        )
        print(f"{'candidates':>10} " + " ".join(f"{s + ' p50/p95 ms':>22}" for s in STAGES))
        try:
            for candidates in args.candidates:
                timings = asyncio.run(
                    _measure(services, settings, queries, candidates, args.repeat)
                )
                quantiles = [np.percentile(timings[s], [50, 95]) for s in STAGES]
                cells = [f"{p50:>10.1f} / {p95:>8.1f}" for p50, p95 in quantiles]
                print(f"{candidates:>10} " + " ".join(f"{c:>22}" for c in cells))
        finally:
            services.store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
