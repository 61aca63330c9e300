"""`python -m eval.bench.exact`: the eval's exact search on faiss's GPU index against its CPU
index, on one BEIR collection: the same top 100 for every query, and the time of each.

Where faiss has no GPU (the `eval` extra's faiss-cpu, or no GPU visible) the CPU index is
checked against numpy's float64 brute force instead, so the comparison still runs on a CPU.
Two results may swap places when their scores differ by less than float32 resolves: a result
one side lacks agrees when its score on the other side is within `--tolerance` of the k-th.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from rich.console import Console

from eval.bench.options import ExactBenchOptions
from eval.exact import ExactIndex, faiss_build
from ragrank.backends.models import SentenceTransformerEmbedder
from ragrank.beir import load_beir
from ragrank.device import resolve_placement
from ragrank.options import parse_options

if TYPE_CHECKING:
    from collections.abc import Sequence

    from numpy.typing import NDArray

console = Console()


def numpy_top(
    passages: NDArray[np.float32], queries: NDArray[np.float32], k: int
) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    """Exact top-k by inner product in float64: the reference where faiss has no GPU."""
    scores = queries.astype(np.float64) @ passages.astype(np.float64).T
    rows = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(scores, rows, axis=1).astype(np.float32), rows.astype(np.int64)


def agreement(
    reference: tuple[NDArray[np.float32], NDArray[np.int64]],
    candidate: tuple[NDArray[np.float32], NDArray[np.int64]],
    all_scores: NDArray[np.float32],
    tolerance: float,
) -> dict[str, Any]:
    """How many queries get the same top-k, strictly and up to near-ties at the k-th place."""
    (ref_scores, ref_rows), (_, cand_rows) = reference, candidate
    identical = tied = 0
    for i, (ref, cand) in enumerate(zip(ref_rows, cand_rows, strict=True)):
        if set(ref.tolist()) == set(cand.tolist()):
            identical += 1
            tied += 1
            continue
        kth = float(ref_scores[i, -1])
        # Each row only one side has must score within the tolerance of the k-th on the CPU.
        odd = set(ref.tolist()) ^ set(cand.tolist())
        tied += all(abs(float(all_scores[i, row]) - kth) <= tolerance for row in odd)
    return {"queries": len(ref_rows), "identical": identical, "identical_up_to_ties": tied}


def run(options: ExactBenchOptions) -> dict[str, Any]:
    """Embed the collection, search it both ways, compare; the figures as a dict."""
    build = faiss_build()
    dataset = load_beir(options.data)
    placement = resolve_placement(options.device)
    embedder = SentenceTransformerEmbedder(
        options.embed_model, query_prefix="query: ", passage_prefix="passage: ", placement=placement
    )
    passages = np.asarray(
        embedder.embed_passages([d.passage for d in dataset.corpus.values()]), dtype=np.float32
    )
    queries = np.asarray(embedder.embed_queries(list(dataset.queries.values())), np.float32)
    k = min(options.top, len(passages))
    cpu_index = ExactIndex(passages, gpu=False)
    started = time.perf_counter()
    reference = cpu_index.search(queries, k)
    cpu_ms = (time.perf_counter() - started) * 1000 / len(queries)
    if build.on_gpu:
        gpu_index = ExactIndex(passages, gpu=True)
        gpu_index.search(queries[:8], k)  # warm-up
        started = time.perf_counter()
        candidate = gpu_index.search(queries, k)
        other, other_ms = "faiss GPU index", (time.perf_counter() - started) * 1000 / len(queries)
    else:
        started = time.perf_counter()
        candidate = numpy_top(passages, queries, k)
        other, other_ms = "numpy float64", (time.perf_counter() - started) * 1000 / len(queries)
    all_scores = (queries @ passages.T).astype(np.float32)
    return {
        "faiss": build.describe(),
        "data": str(options.data),
        "embed_model": options.embed_model,
        "documents": len(passages),
        "top": k,
        "reference": "faiss CPU index",
        "against": other,
        "ms_per_query": {"faiss CPU index": round(cpu_ms, 4), other: round(other_ms, 4)},
        "max_score_difference": float(np.max(np.abs(reference[0] - candidate[0]))),
        **agreement(reference, candidate, all_scores, options.tolerance),
    }


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_options(
        ExactBenchOptions, argv, prog="python -m eval.bench.exact", description=__doc__
    )
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    report = run(options)
    out = options.out or Path("eval-results") / time.strftime("bench-exact-%Y%m%d-%H%M%S.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    console.print(
        f"{report['faiss']}: {report['against']} against the faiss CPU index, top {report['top']}"
        f" of {report['queries']} queries: {report['identical']} identical, "
        f"{report['identical_up_to_ties']} up to near-ties; wrote {out}"
    )
    return 0 if report["identical_up_to_ties"] == report["queries"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
