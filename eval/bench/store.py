"""The embedded store at scale: Qdrant Edge against qdrant-client's local mode (the earlier
embedded engine), on random 384-d unit vectors with payloads.

    python -m eval.bench.store                       # 10k, 100k and 1M points
    python -m eval.bench.store --sizes 10000 --queries 50

Each engine and size runs in a process of its own, so that its RSS is its own. Reported: upsert
rate (through the store's own write path, flush included), index build time, query p50/p99
with and without a payload filter (one key, 10 % of the points), recall@10 against exact
search, queries/s from one and two threads, disk and RSS. For Edge, it also sweeps `hnsw_ef`
for the smallest value reaching recall@10 >= 0.9: random vectors are the graph's worst case,
so this is a floor, not the default (that is set on real embeddings, see docs/deployment.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from eval.bench.options import StoreBenchOptions
from ragrank.documents import Chunk
from ragrank.options import parse_options
from ragrank.settings import Settings
from ragrank.store import EdgeStore, IndexTuning, ServerStore, Store

if TYPE_CHECKING:
    from collections.abc import Iterator

DIMENSION = 384
LANGUAGES = ("de", "en", "es", "fr", "it", "ja", "nl", "pt", "ru", "zh")
EF_SWEEP = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


def _batches(size: int, batch: int, seed: int = 0) -> Iterator[tuple[list[Chunk], np.ndarray]]:
    """The corpus, generated batch by batch (the whole of it never sits in memory)."""
    rng = np.random.default_rng(seed)
    for start in range(0, size, batch):
        count = min(batch, size - start)
        vectors = rng.standard_normal((count, DIMENSION), dtype=np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        chunks = [
            Chunk(
                doc_id=f"d{start + i}",
                chunk_index=0,
                text=f"passage {start + i}",
                metadata={"lang": LANGUAGES[(start + i) % len(LANGUAGES)]},
            )
            for i in range(count)
        ]
        yield chunks, vectors


def _queries(count: int) -> np.ndarray:
    queries = np.random.default_rng(12345).standard_normal((count, DIMENSION), dtype=np.float32)
    normed: np.ndarray = queries / np.linalg.norm(queries, axis=1, keepdims=True)
    return normed


def _rss_mb() -> tuple[float, float]:
    """Current and peak resident memory of this process, in MB."""
    values: dict[str, float] = {}
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                values[key] = int(rest.split()[0]) / 1024
    return values.get("VmRSS", 0.0), values.get("VmHWM", 0.0)


def _disk_mb(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 1e6


def _latencies(store: Store, queries: np.ndarray, where: dict[str, Any] | None) -> list[float]:
    times = []
    for query in queries:
        start = time.perf_counter()
        store.search(query, 10, where)
        times.append((time.perf_counter() - start) * 1000)
    return times


def _ids(
    store: Store, queries: np.ndarray, exact: bool, where: dict[str, Any] | None = None
) -> list[set[str]]:
    return [{h.chunk.doc_id for h in store.search(q, 10, where, exact=exact)} for q in queries]


def _recall(found: list[set[str]], exact: list[set[str]]) -> float:
    return float(np.mean([len(f & e) / max(1, len(e)) for f, e in zip(found, exact, strict=True)]))


def _throughput(store: Store, queries: np.ndarray, threads: int) -> float:
    """Queries per second with `threads` threads searching at once."""
    parts = np.array_split(queries, threads)
    workers = [
        threading.Thread(target=lambda part=part: [store.search(q, 10) for q in part])
        for part in parts
    ]
    start = time.perf_counter()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return len(queries) / (time.perf_counter() - start)


def run_one(engine: str, size: int, queries: int, ef: int) -> dict[str, Any]:
    """One engine at one size, in this process."""
    with tempfile.TemporaryDirectory(prefix="ragrank-bench-store-") as folder:
        path = Path(folder)
        tuning = replace(IndexTuning.from_settings(Settings()), ef=ef)
        store: Store
        if engine == "edge":
            store = EdgeStore(path, "bench", tuning=tuning)
        else:
            from qdrant_client import QdrantClient

            store = ServerStore(QdrantClient(path=str(path)), "bench", tuning=tuning)
        store.ensure_collection(DIMENSION)
        store.ensure_payload_indexes(("lang",))
        start = time.perf_counter()
        for chunks, vectors in _batches(size, 1000):
            store.upsert(chunks, vectors)
        upsert_s = time.perf_counter() - start
        start = time.perf_counter()
        store.optimize()
        build_s = time.perf_counter() - start
        probe = _queries(queries)
        where = {"lang": "de"}
        _latencies(store, probe[:5], None)  # warm the caches
        plain = _latencies(store, probe, None)
        filtered = _latencies(store, probe, where)
        exact = _ids(store, probe, exact=True)
        exact_filtered = _ids(store, probe, exact=True, where=where)
        result: dict[str, Any] = {
            "engine": "Qdrant Edge" if engine == "edge" else "qdrant-client local mode",
            "points": size,
            "hnsw_ef": ef,
            "queries": queries,
            "upsert_points_per_s": round(size / upsert_s),
            "index_build_s": round(build_s, 1),
            "query_p50_ms": round(float(np.percentile(plain, 50)), 2),
            "query_p99_ms": round(float(np.percentile(plain, 99)), 2),
            "filtered_p50_ms": round(float(np.percentile(filtered, 50)), 2),
            "filtered_p99_ms": round(float(np.percentile(filtered, 99)), 2),
            "recall_at_10": round(_recall(_ids(store, probe, exact=False), exact), 4),
            "filtered_recall_at_10": round(
                _recall(_ids(store, probe, exact=False, where=where), exact_filtered), 4
            ),
            "qps_1_thread": round(_throughput(store, probe, 1), 1),
            "qps_2_threads": round(_throughput(store, probe, 2), 1),
        }
        if engine == "edge":
            sweep = []
            for value in EF_SWEEP:
                store.tuning = replace(tuning, ef=value)
                recall = _recall(_ids(store, probe, exact=False), exact)
                p50 = float(np.percentile(_latencies(store, probe, None), 50))
                sweep.append(
                    {"hnsw_ef": value, "recall_at_10": round(recall, 4), "p50_ms": round(p50, 2)}
                )
                if recall >= 0.9:  # the smallest width that reaches it
                    break
            result["ef_sweep"] = sweep
            enough = next((row for row in sweep if row["recall_at_10"] >= 0.9), None)
            result["ef_for_recall_0_9"] = enough
        rss, peak = _rss_mb()
        result |= {
            "disk_mb": round(_disk_mb(path), 1),
            "rss_mb": round(rss),
            "peak_rss_mb": round(peak),
            "raw_vectors_mb": round(size * DIMENSION * 4 / 1e6),
        }
        store.close()
        if engine == "edge":
            # What a restarted server holds: a fresh process opens the built shard and searches.
            command = [sys.executable, "-m", "eval.bench.store", "--serving", str(path)]
            done = subprocess.run(command, check=True, capture_output=True, text=True)
            result["serving_rss_mb"] = round(float(done.stdout.strip().splitlines()[-1]))
    return result


def serving_rss(folder: Path, queries: int) -> float:
    """RSS (MB) of this process once it has opened the shard and answered `queries` searches."""
    store = EdgeStore(folder, "bench")
    try:
        for query in _queries(queries):
            store.search(query, 10)
    finally:
        rss, _ = _rss_mb()
        store.close()
    return rss


def _table(results: list[dict[str, Any]]) -> str:
    columns = [
        ("engine", "engine"),
        ("points", "points"),
        ("upsert_points_per_s", "upsert/s"),
        ("index_build_s", "build s"),
        ("query_p50_ms", "p50 ms"),
        ("query_p99_ms", "p99 ms"),
        ("filtered_p50_ms", "filtered p50"),
        ("filtered_p99_ms", "filtered p99"),
        ("recall_at_10", "recall@10"),
        ("filtered_recall_at_10", "filtered recall@10"),
        ("qps_1_thread", "q/s 1 thr"),
        ("qps_2_threads", "q/s 2 thr"),
        ("disk_mb", "disk MB"),
        ("rss_mb", "RSS MB"),
        ("serving_rss_mb", "serving RSS MB"),
        ("raw_vectors_mb", "raw vectors MB"),
    ]
    lines = [
        "| " + " | ".join(title for _, title in columns) + " |",
        "| " + " | ".join("---" if key == "engine" else "---:" for key, _ in columns) + " |",
    ]
    for row in results:
        cells = [_cell(row.get(key, "–")) for key, _ in columns]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _cell(value: object) -> str:
    return f"{value:,}" if isinstance(value, int) else str(value)


def main(argv: list[str] | None = None) -> int:
    args = parse_options(
        StoreBenchOptions,
        argv,
        prog="python -m eval.bench.store",
        description=__doc__,
        settings=Settings(),
    )
    if args.serving:
        print(serving_rss(args.serving, args.queries))
        return 0
    ef = args.ef if args.ef is not None else Settings().hnsw_ef
    if args.one:
        engine, points = args.one
        print(json.dumps(run_one(engine, int(points), args.queries, ef)))
        return 0
    results = []
    for size in args.sizes:
        for engine in ("edge", "local"):
            if engine == "local" and size > args.local_max:
                continue
            print(f"{engine} at {size:,} points ...", file=sys.stderr, flush=True)
            command = [sys.executable, "-m", "eval.bench.store", "--one", engine, str(size)]
            queries = args.queries if engine == "edge" else min(args.queries, args.local_queries)
            command += ["--queries", str(queries), "--ef", str(ef)]
            done = subprocess.run(
                command, check=True, capture_output=True, text=True, env=os.environ
            )
            results.append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    print(_table(results))
    for row in results:
        if row.get("ef_for_recall_0_9"):
            found = row["ef_for_recall_0_9"]
            print(
                f"Edge at {row['points']:,} points: hnsw_ef {found['hnsw_ef']} reaches recall@10 "
                f"{found['recall_at_10']} on random vectors, p50 {found['p50_ms']} ms"
            )
    args.output.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    path = args.output / f"bench-store-{stamp}.json"
    path.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
