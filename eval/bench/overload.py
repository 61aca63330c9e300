"""`python -m eval.bench.overload`: a `ragrank serve` process driven past its capacity.

Three closed-loop phases of bounded length against `/v1/rerank`, each client sending its next
request as soon as the last one is answered and never waiting for `Retry-After` (the worst
case for the server):

1. **capacity**: `--clients` clients; the answered requests per second are the capacity;
2. **overload**: `--factor` (4) times as many clients, so the requests on offer are several
   times what the server can answer;
3. **recovery**: `--clients` clients again; the throughput should be the capacity again.

It reports every status code per phase (only 200 and 429 are expected), the request rate on
offer against the capacity, the latency of answered requests, the server's resident memory
sampled every 0.2 s, and the longest queue seen in `/metrics`. It writes a JSON report.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from eval.bench.harness import (
    free_port,
    latency_quantile,
    minilm_reranker,
    ragrank_command,
    server_process,
    small_embedder,
)
from eval.bench.options import OverloadOptions
from ragrank import SAMPLE_DATASET
from ragrank.beir import load_beir
from ragrank.options import parse_options

if TYPE_CHECKING:
    from collections.abc import Sequence


@dataclass
class Phase:
    name: str
    clients: int
    seconds: float = 0.0
    statuses: Counter[int] = field(default_factory=Counter)
    latencies_ms: list[float] = field(default_factory=list)
    retry_after: set[str] = field(default_factory=set)

    @property
    def answered_per_s(self) -> float:
        return self.statuses[200] / self.seconds if self.seconds else 0.0

    @property
    def offered_per_s(self) -> float:
        return sum(self.statuses.values()) / self.seconds if self.seconds else 0.0

    def summary(self) -> dict[str, Any]:
        return {
            "phase": self.name,
            "clients": self.clients,
            "seconds": round(self.seconds, 2),
            "statuses": {str(code): count for code, count in sorted(self.statuses.items())},
            "requests_per_s": round(self.offered_per_s, 2),
            "answered_per_s": round(self.answered_per_s, 2),
            "p50_ms_answered": latency_quantile(self.latencies_ms, 50),
            "p99_ms_answered": latency_quantile(self.latencies_ms, 99),
            "retry_after_values": sorted(self.retry_after),
        }


def rss_mb(pid: int) -> float:
    """Resident memory of one process (`ragrank serve` is one), from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def run_phase(
    phase: Phase, url: str, bodies: Sequence[dict[str, Any]], seconds: float
) -> Phase:
    """`phase.clients` closed-loop clients for `seconds`."""
    deadline = time.perf_counter() + seconds

    async def client(http: httpx.AsyncClient, offset: int) -> None:
        index = offset
        while time.perf_counter() < deadline:
            body = bodies[index % len(bodies)]
            index += phase.clients
            started = time.perf_counter()
            try:
                response = await http.post(url, json=body)
            except httpx.TransportError:
                phase.statuses[0] += 1  # no answer at all
                continue
            phase.statuses[response.status_code] += 1
            if response.status_code == 200:
                phase.latencies_ms.append((time.perf_counter() - started) * 1000)
            elif response.status_code == 429:
                phase.retry_after.add(response.headers.get("retry-after", "missing"))

    limits = httpx.Limits(max_connections=phase.clients)
    async with httpx.AsyncClient(timeout=600, limits=limits) as http:
        started = time.perf_counter()
        await asyncio.gather(*(client(http, c) for c in range(phase.clients)))
        phase.seconds = time.perf_counter() - started
    return phase


def queue_depth(base: str) -> float:
    text = httpx.get(f"{base}/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith('ragrank_queue_depth{engine="rerank",')
    )


def _bodies(documents: int) -> list[dict[str, Any]]:
    """64 rerank requests over the bundled sample (short passages)."""
    dataset = load_beir(SAMPLE_DATASET)
    queries = sorted(dataset.queries.values())
    passages = [d.passage for d in dataset.corpus.values()]
    return [
        {
            "query": queries[i % len(queries)],
            "documents": [passages[(i * 7 + j) % len(passages)] for j in range(documents)],
        }
        for i in range(64)
    ]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_options(
        OverloadOptions, argv, prog="python -m eval.bench.overload", description=__doc__
    )
    work = Path(tempfile.mkdtemp(prefix="ragrank-overload-"))
    model = args.model or minilm_reranker(work / "minilm-reranker")
    bodies = _bodies(args.documents)
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "RAGRANK_EMBED_MODEL": small_embedder(),
        "RAGRANK_RERANK_MODEL": model,
        "RAGRANK_QDRANT_PATH": str(work / "qdrant"),
        "RAGRANK_JOBS_PATH": str(work / "jobs.sqlite3"),
        "RAGRANK_DEVICE": "cpu",
        "RAGRANK_QUEUE_SIZE": str(args.queue_size),
        "RAGRANK_LOG_LEVEL": "WARNING",
    }
    command = ragrank_command("serve", "--port", str(port))
    phases: list[Phase] = []
    memory: list[tuple[str, float]] = []
    depths: list[float] = []
    with server_process(command, env, f"{base}/ready", work / "serve.log") as process:
        current = ["idle"]
        stop = threading.Event()

        def sample() -> None:
            while not stop.wait(0.2):
                memory.append((current[0], rss_mb(process.pid)))
                with contextlib.suppress(httpx.HTTPError):
                    depths.append(queue_depth(base))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        url = f"{base}/v1/rerank"
        asyncio.run(run_phase(Phase("warm-up", 1), url, bodies, min(3.0, args.seconds)))
        for name, clients in (
            ("capacity", args.clients),
            ("overload", args.clients * args.factor),
            ("recovery", args.clients),
        ):
            current[0] = name
            phases.append(asyncio.run(run_phase(Phase(name, clients), url, bodies, args.seconds)))
        current[0] = "after"
        time.sleep(1.0)
        stop.set()
        sampler.join()
    report = _report(args, argv, model=model, phases=phases, memory=memory, depths=depths)
    out = args.out or Path("eval-results") / f"overload-{datetime.now():%Y%m%d-%H%M%S}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(report, indent=2))
    unexpected = {code for phase in phases for code in phase.statuses if code not in (200, 429)}
    return 1 if unexpected else 0


def _report(
    args: OverloadOptions,
    argv: Sequence[str] | None,
    *,
    model: str,
    phases: list[Phase],
    memory: list[tuple[str, float]],
    depths: list[float],
) -> dict[str, Any]:
    capacity = phases[0].answered_per_s or float("nan")
    peak: dict[str, float] = {}
    for name, megabytes in memory:
        peak[name] = max(peak.get(name, 0.0), megabytes)
    return {
        "command": "python -m eval.bench.overload "
        + " ".join(sys.argv[1:] if argv is None else argv),
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
        "model": model,
        "documents_per_request": args.documents,
        "queue_size_items": args.queue_size,
        "phases": [phase.summary() for phase in phases],
        "capacity_answered_per_s": round(capacity, 2),
        "overload_offered_x_capacity": round(phases[1].offered_per_s / capacity, 1),
        "recovery_x_capacity": round(phases[2].answered_per_s / capacity, 2),
        "rss_mb_peak_by_phase": {name: round(value, 1) for name, value in peak.items()},
        "queue_depth_max_items": max(depths, default=0.0),
    }


if __name__ == "__main__":
    raise SystemExit(main())
