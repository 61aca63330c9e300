"""The options of `ragrank bench`: each field is one flag (`ragrank.options` builds them). Light
on purpose, so that `ragrank --help` loads no model code."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ragrank.options import option

RUNS = ("ceiling", "ragrank", "ragrank-int8", "arrival", "request", "infinity")
#: BEIR SciFact beside the repository, where the benchmarks find it when it is there.
DEFAULT_DATA = Path("../shared/data/scifact")
XLMR_TOKENIZER = Path("../shared/models/xlm-roberta-tokenizer/tokenizer.json.gz")


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
