"""The options of `ragrank bench`: each field is one flag (`ragrank.options` builds them). Light
on purpose, so that `ragrank --help` loads no model code."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from ragrank import SAMPLE_DATASET
from ragrank.options import option

RUNS = (
    "ceiling",
    "ragrank",
    "ragrank-openvino",
    "ragrank-openvino-int8",
    "window",
    "arrival",
    "request",
    "infinity",
)
#: The shared model configs, tokenizers and evaluation data: beside the repository, or where
#: RAGRANK_SHARED_DIR says (on a machine they were copied to), as for the tests.
SHARED_DIR = Path(os.environ.get("RAGRANK_SHARED_DIR", "../shared"))
#: BEIR SciFact there, where the benchmarks find it when it is present.
DEFAULT_DATA = SHARED_DIR / "data" / "scifact"
XLMR_TOKENIZER = SHARED_DIR / "models" / "xlm-roberta-tokenizer" / "tokenizer.json.gz"


def bench_data(given: Path | None) -> Path:
    """The BEIR folder a benchmark reads: the one given, else SciFact where it is present, else
    the bundled sample."""
    return given or (DEFAULT_DATA if DEFAULT_DATA.exists() else SAMPLE_DATASET)


@dataclass(frozen=True)
class BenchOptions:
    """What `ragrank bench` measures, with what, and where the JSON report goes."""

    model: str | None = option(
        None,
        "reranker folder or hub id (default: a MiniLM-L6-shaped cross-encoder built from the "
        "all-MiniLM-L6-v2 weights with a fresh one-logit head; its scores mean nothing)",
    )
    data: Path | None = option(
        None,
        f"BEIR folder for queries and documents (default: {DEFAULT_DATA} if present, else the "
        "bundled sample)",
    )
    clients: int = option(16, "concurrent clients")
    documents: int = option(32, "documents per request")
    rounds: int = option(2, "requests per client")
    batch_sizes: tuple[int, ...] = option((4, 8, 16, 32), "batch sizes the ceiling sweeps")
    runs: tuple[str, ...] = option(RUNS, "what to measure", choices=RUNS)
    infinity: str | None = option(None, "the infinity_emb executable (found if installed)")
    device: str = option("auto", "auto, cpu or cuda")
    out: Path | None = option(None, "JSON report (default: eval-results/bench-load-<time>.json)")
    seed: int = option(0, "workload seed")
    host_only: bool = option(
        False,
        "measure the host path: the tokenizer alone on one core against /v1/rerank with a "
        "zero-layer cross-encoder, at 4, 16 and 64 clients",
    )
    host_requests: int = option(128, "--host-only: requests per client count")
    tokenizer: Path = option(
        XLMR_TOKENIZER, "--host-only: the tokenizer.json(.gz) the zero-layer model uses"
    )


@dataclass(frozen=True)
class OverloadOptions:
    """`python -m eval.bench.overload`: capacity, four times it, and recovery."""

    model: str | None = option(None, "reranker folder (default: the MiniLM-L6-shaped one)")
    clients: int = option(4, "clients at capacity")
    factor: int = option(4, "overload multiple")
    documents: int = option(8, "documents per request")
    seconds: float = option(20.0, "length of each phase")
    queue_size: int = option(64, "RAGRANK_QUEUE_SIZE of the server")
    out: Path | None = option(None, "JSON report (default: eval-results/overload-<time>.json)")


@dataclass(frozen=True)
class SoakOptions:
    """`python -m eval.bench.soak`: one server under mixed load for a set time."""

    minutes: float = option(30.0, "length of the run")
    clients: int = option(6, "closed-loop clients")
    interval: float = option(10.0, "seconds per sample")
    kills: int = option(0, "kill -9 and restarts")
    warmup: float | None = option(
        None, "seconds of each server life not judged (default: a tenth of the run, at least 60)"
    )
    doc_ids: int = option(200, "document ids written")
    seed: int | None = option(None, "random seed (default: from the clock)")
    rerank_model: str | None = option(None, "reranker folder (default: MiniLM-shaped)")
    embed_model: str | None = option(None, "embedder (default: all-MiniLM-L6-v2)")
    tiny: bool = option(
        False, "tiny random models instead: many requests per second, for short runs"
    )
    out: Path | None = option(None, "JSON report (default: eval-results/soak-<time>.json)")
    keep: bool = option(False, "keep the store, queue and logs (kept on failure)")


@dataclass(frozen=True)
class GpuOptions:
    """`make bench-gpu`: packed against padded, budgets, kernels, server against model."""

    device: str = option("auto", "auto, cuda or cpu")
    dtype: str = option("auto", "auto (bf16 on a GPU that has it, fp16 on others, fp32 on a CPU)")
    tiny: bool = option(False, "two-layer models: a CPU check")
    queries: int = option(30, "SciFact queries")
    pairs: int = option(2048, "pairs per fixed length")
    server_requests: int = option(128, "/v1/rerank requests")
    data: Path | None = option(
        None, "BEIR folder (default: SciFact beside the repository if present)"
    )
    out: Path | None = option(None, "JSON report (default: eval-results/bench-gpu-<time>.json)")
    models: Path | None = option(
        None,
        "a folder with the models an earlier run built there (reranker/, embedder/, "
        "reranker-spread/); built there when absent (default: a temporary folder)",
    )


@dataclass(frozen=True)
class FamiliesOptions:
    """`python -m eval.bench.families`: pairs/s of one reranker of each family."""

    device: str = option("auto", "auto, cuda or cpu")
    dtype: str = option("auto", "auto (bf16 on a GPU that has it, fp16 on others, fp32 on a CPU)")
    tiny: bool = option(False, "two-layer models of each family: a quick check")
    queries: int = option(4, "SciFact queries, each against --documents abstracts")
    documents: int = option(8, "abstracts per query")
    data: Path | None = option(
        None, "BEIR folder (default: SciFact beside the repository if present)"
    )
    models: Path | None = option(
        None, "a folder with the models an earlier run built there; built there when absent"
    )
    out: Path | None = option(
        None, "JSON report (default: eval-results/bench-families-<time>.json)"
    )


@dataclass(frozen=True)
class ExactBenchOptions:
    """`python -m eval.bench.exact`: faiss's GPU index against its CPU index, top 100."""

    embed_model: str = option(help="the embedder whose vectors are searched (folder or hub id)")
    data: Path = option(DEFAULT_DATA, "BEIR folder: its corpus is indexed, its queries search it")
    device: str = option("auto", "where the embedder runs: auto, cuda or cpu")
    top: int = option(100, "results compared per query")
    tolerance: float = option(
        1e-5, "a result one side lacks still agrees if its score is this close to the k-th score"
    )
    out: Path | None = option(None, "JSON report (default: eval-results/bench-exact-<time>.json)")


@dataclass(frozen=True)
class GpuCheckOptions:
    """`make gpu-check`: every figure a GPU run must show, in one run, one JSON, one table."""

    tiny: bool = option(False, "CPU-sized: tiny models, the bundled sample, few requests")
    device: str = option("auto", "auto, cuda or cpu")
    budget_s: float = option(
        330.0, "the whole run's time, models built; a step left without time is skipped"
    )
    data: Path | None = option(
        None, "BEIR folder (default: SciFact beside the repository if present, else the sample)"
    )
    out: Path | None = option(None, "output folder (default: eval-results/gpu-check-<time>/)")


@dataclass(frozen=True)
class IndexBenchOptions:
    """`python -m eval.bench.index`: indexing throughput, dense only against with BM25."""

    data: Path = option(SAMPLE_DATASET, "a BEIR folder (default: the bundled sample)")
    limit: int = option(1000, "documents to index")
    out: Path | None = option(None, "write the figures as JSON here")
    repeat: int = option(2, "runs of each variant, alternated; the best counts")


@dataclass(frozen=True)
class QueueBenchOptions:
    """`python -m eval.bench.queue`: the job queue's throughput, claim latency and recovery."""

    postgres_url: str | None = option(
        None,
        "a PostgreSQL URL whose user may create databases: the benchmark works in a database of "
        "its own and drops it (default: RAGRANK_JOBS_URL)",
    )
    jobs: int = option(300, "jobs per throughput run, one short document each")
    pickups: int = option(20, "jobs added one at a time to an idle worker, for the pick-up time")
    lease: float = option(5.0, "the lease (s) in the recovery run")
    out: Path | None = option(None, "write the figures as JSON here")


#: The store benchmark's sizes, and the largest the local mode is run at by default: the local
#: mode holds everything in Python objects and scans in numpy, and beyond this it takes many
#: minutes per size, which is the point the table makes.
STORE_SIZES = (10_000, 100_000, 1_000_000)
LOCAL_MODE_MAX = 100_000


@dataclass(frozen=True)
class StoreBenchOptions:
    """`make bench-store`: the embedded store at each size, Qdrant Edge against the local mode."""

    sizes: tuple[int, ...] = option(STORE_SIZES, "points per run")
    queries: int = option(200, "query vectors per size")
    local_queries: int = option(
        20,
        "query vectors per size for the local mode (a filtered search of 100k points takes it "
        "over a second)",
    )
    ef: int | None = option(None, "hnsw_ef", setting="hnsw_ef")
    local_max: int = option(LOCAL_MODE_MAX, "largest size the local mode is run at (0: never)")
    output: Path = option(Path("eval-results"), "report folder")
    one: tuple[str, ...] | None = option(
        None, "internal: one engine (edge or local) at one size, in a child process", metavar="X"
    )
    serving: Path | None = option(None, "internal: the RSS of a server process on this shard")


@dataclass(frozen=True)
class LanguageBenchOptions:
    """`python -m eval.bench.language`: how well and how fast texts' languages are identified."""

    xquad: Path = option(SHARED_DIR / "data" / "xquad-r", "XQuAD-R, one folder per language")
    scifact: Path = option(DEFAULT_DATA, "SciFact (English)")
    limit: int = option(2000, "texts per set at most")
    out: Path | None = option(None, "write the figures as JSON here")


@dataclass(frozen=True)
class ServedOptions:
    """`make bench-served`: the real server against a calibrated device model, old engine and
    new, closed-loop and open-loop."""

    clients: tuple[int, ...] = option((1, 4, 16, 64), "closed-loop client counts")
    documents: int = option(32, "documents per request")
    requests: int = option(64, "closed loop: requests at each client count (at least 2 each)")
    loads: tuple[float, ...] = option((0.5, 0.9), "open loop: arrival rates, shares of capacity")
    open_loop_s: float = option(20.0, "open loop: seconds of arrivals at each load")
    speed: float | None = option(
        None,
        "the device's speed against the H200 it is fitted to (default: the host's own capacity "
        "over --host-share, so that the device is the bottleneck)",
    )
    host_share: float = option(3.0, "default speed: the host can feed this many such devices")
    policies: tuple[str, ...] = option(
        ("window", "continuous"), "engines to compare (RAGRANK_BATCHING); the last one is new"
    )
    warm_start: bool = option(True, "also time the first request with and without warm-up")
    data: Path | None = option(None, "BEIR folder (default: SciFact if present, else the sample)")
    tiny: bool = option(False, "CPU check: few requests and a short open loop, no targets")
    out: Path | None = option(None, "JSON report (default: eval-results/bench-served-<time>.json)")
    seed: int = option(0, "workload seed")


@dataclass(frozen=True)
class ContentionBenchOptions:
    """`python -m eval.bench.contention`: `/v1/search` latency idle and while indexing."""

    data: Path = option(SAMPLE_DATASET, "a BEIR folder (default: the bundled sample)")
    base: int = option(500, "documents indexed first, unmeasured: what the searches search")
    limit: int = option(2000, "documents of the indexing job that searches run against")
    searches: int = option(100, "searches with the server idle")
    candidates: int = option(20, "candidates each search reranks")
    batch: int = option(100, "documents per POST /v1/documents (a job each)")
    device_model: float | None = option(
        None,
        "model both the embedder's and the reranker's forward passes on the calibrated H200 "
        "device model at this speed (1: the measured GPU) instead of running them",
        metavar="SPEED",
    )
    out: Path | None = option(None, "write the figures as JSON here")


@dataclass(frozen=True)
class CascadeBenchOptions:
    """`python -m eval.bench.cascade`: `/v1/search` latency of each reranker and cascade."""

    data: Path = option(SAMPLE_DATASET, "a BEIR folder to index and query")
    fast: str = option("student", "the served name of the cascade's fast reranker")
    tops: tuple[int, ...] = option((5, 10, 20), "the cascade's K values", metavar="K")
    searches: int = option(100, "measured searches per configuration")
    candidates: int = option(20, "candidates each search reranks")
    batch: int = option(200, "documents per POST /v1/documents")
    out: Path | None = option(None, "write the figures as JSON here")
