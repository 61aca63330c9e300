"""Indexing throughput against the raw encoder on the same chunks.

    python -m eval.bench.index --data ../shared/data/scifact --limit 1000

The documents are chunked once; the raw encoder then embeds every chunk passage in one call (its
best case: one global length sort, no store; the one figure here of a model alone). The indexer
then syncs the same documents into a fresh embedded Qdrant as `ragrank index` does, its passages
embedded as bulk batches of the model's engine (`ragrank.inference`), with chunking, upserts and
stamps; and a second sync
shows what an unchanged run costs. The first sync is also run without BM25 sparse vectors
(`sparse_overhead`: what they add to it), each variant `--repeat` times, alternated, the
fastest counting (two cores shared with anything else are noisy). Then each of the dataset's
queries (up to 200) is embedded alone, as a search embeds it, for the median latency. Models,
device and backend come from the usual RAGRANK_* settings: compare the backends by running it
once with each `RAGRANK_EMBED_BACKEND` (a process per backend, so each reports its own memory).
"""

from __future__ import annotations

import json
import resource
import tempfile
import time
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from eval.bench.options import IndexBenchOptions
from indexing import Indexer, IndexSummary, read_documents
from ragrank.backends.serving import load_inference
from ragrank.options import parse_options
from ragrank.settings import Settings
from ragrank.sparse import sparse_encoder
from ragrank.store import open_store

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ragrank.documents import Document
    from ragrank.inference import Inference
    from ragrank.protocols import Embedder


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_options(
        IndexBenchOptions, argv, prog="python -m eval.bench.index", description=__doc__
    )
    corpus = args.data / "corpus.jsonl"
    if not corpus.exists():
        corpus = args.data / "corpus.jsonl.gz"
    documents = list(islice(read_documents(corpus), args.limit))

    base = Settings.from_env(qdrant_url="", collection="bench")
    inference = load_inference(base, rerankers=False)
    embedder = inference.embedder
    loaded_rss = _rss_mib()
    with inference.running():
        runs, passages, raw_s = _index_runs(args, documents, base, inference)
    encoder = sparse_encoder(base)
    started = time.perf_counter()
    if encoder is not None:
        encoder.documents(passages)
    sparse_s = time.perf_counter() - started
    (first, second), (dense_first, _) = runs["with_sparse"], runs["dense_only"]
    figures = {
        "model": base.embed_model,
        "embed_backend": embedder.backend,
        "agreement": str(getattr(embedder, "agreement", None) or "") or None,
        "conversion": str(getattr(embedder, "conversion", None) or "") or None,
        "sparse": base.sparse,
        "documents": len(documents),
        "chunks": len(passages),
        "raw_encoder_chunks_per_s": round(len(passages) / raw_s, 2),
        "indexer_chunks_per_s": round(first.chunks / first.seconds, 2),
        "ratio": round((first.chunks / first.seconds) / (len(passages) / raw_s), 3),
        "first_run_s": round(first.seconds, 2),
        "dense_only_first_run_s": round(dense_first.seconds, 2),
        "sparse_overhead": round(first.seconds / dense_first.seconds - 1, 3),
        "bm25_encode_s": round(sparse_s, 2),
        "unchanged_run_s": round(second.seconds, 2),
        "unchanged": second.unchanged,
        "query_embed_ms_p50": _query_p50_ms(embedder, args.data),
        "rss_after_load_mib": round(loaded_rss),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }
    print(json.dumps(figures, indent=2))
    if args.out:
        args.out.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


def _index_runs(
    args: IndexBenchOptions, documents: list[Document], base: Settings, inference: Inference
) -> tuple[dict[str, tuple[IndexSummary, IndexSummary]], list[str], float]:
    """Each variant's (first, unchanged) sync, the fastest of `--repeat`; the chunk passages;
    and the raw encoder's seconds over them."""
    dense_only = base.replace(sparse="none", retrieval="dense")
    embedder = inference.embedder
    passages: list[str] = []
    raw_s = 0.0
    runs: dict[str, tuple[IndexSummary, IndexSummary]] = {}
    variants = [("dense_only", dense_only), ("with_sparse", base)] * max(1, args.repeat)
    for name, variant in variants:
        with tempfile.TemporaryDirectory() as folder:
            settings = variant.replace(qdrant_path=Path(folder))
            store = open_store(settings)
            try:
                indexer = Indexer.from_settings(settings, inference.bulk_embedder(), store)
                if not passages:
                    passages = [c.passage for d in documents for c in indexer.chunker.chunk(d)]
                    embedder.embed_passages(passages[:64])  # warm-up
                    started = time.perf_counter()
                    embedder.embed_passages(passages)
                    raw_s = time.perf_counter() - started
                first = indexer.index(documents, progress=False)
                if name not in runs or first.seconds < runs[name][0].seconds:
                    runs[name] = (first, indexer.index(documents, progress=False))
            finally:
                store.close()
    return runs, passages, raw_s


def _query_p50_ms(embedder: Embedder, data: Path, most: int = 200) -> float:
    """Median milliseconds to embed one of the dataset's queries alone."""
    queries = [document.text for document in islice(read_documents(data / "queries.jsonl"), most)]
    embedder.embed_queries(queries[:8])  # warm-up
    times = []
    for query in queries:
        started = time.perf_counter()
        embedder.embed_queries([query])
        times.append((time.perf_counter() - started) * 1000)
    return round(float(np.median(times)), 2)


def _rss_mib() -> float:
    """The process's resident memory now (Linux), in MiB."""
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * resource.getpagesize() / 2**20


if __name__ == "__main__":
    raise SystemExit(main())
