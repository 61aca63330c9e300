"""`make bench-served`: what `/v1/rerank` delivers of its device, measured on a machine without
one. The real server runs (HTTP, tokenizer, batching engine, packed collation); only the
forward pass is the calibrated device model of `eval.bench.device_model`, fitted to the H200.

For each engine (`--policies`: `window`, the previous engine's policy, and `continuous`):
- closed-loop clients (each sends its next request when answered) at each `--clients` count;
- open-loop Poisson arrivals at each `--loads` share of the device's capacity.
Each run reports pairs/s, p50 and p99, served/device (pairs/s over the device alone on the same
pairs in full batches), and the share of wall time of each stage and of the device's idle time
with work waiting (read from the server's Prometheus counters).

The device's speed: by default the host's own capacity (the server with an instant device,
16 clients) over `--host-share`, so that the device, not the 2-core host, is the bottleneck, as
a GPU is when one host feeds it. The last line is the new engine's served/device by clients.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import tempfile
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console
from rich.table import Table

from eval.bench.device_model import H200_BATCH_TOKENS, DeviceModel
from eval.bench.harness import (
    RunResult,
    Workload,
    drive,
    first_request_ms,
    free_port,
    latency_quantile,
    ragrank_command,
    server_process,
    tiny_model,
)
from eval.bench.load import build_workload
from eval.bench.options import XLMR_TOKENIZER, ServedOptions, bench_data
from ragrank.backends.models import CrossEncoderScorer
from ragrank.device import resolve_placement
from ragrank.engine import STAGES
from ragrank.errors import RagrankError
from ragrank.options import parse_options

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

console = Console()

#: Items in one batch of the modelled GPU (the CUDA default).
BATCH_ITEMS = 256
#: Targets on the device model, for the new engine.
TARGETS = {"clients_16": 0.9, "clients_64": 0.9, "clients_4": 0.75}
OPEN_LOOP_P99_BATCHES = 3.0
ONE_CLIENT_OVERHEAD = 1.2


@dataclass
class Level(RunResult):
    """One run against one server: closed loop at some clients, or open loop at some load."""

    device_pairs_per_s: float = 0.0
    #: Each stage's share of the wall time, the device's busy and idle shares, and a pair's
    #: mean wait (`shares`).
    stages: dict[str, float] = field(default_factory=dict)
    requests: int = 0
    #: Open loop: the arrival rate sent, and the latencies of an ideal engine on the same
    #: arrivals (`ideal_latencies`).
    extra: dict[str, float | None] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        measured = super().summary()
        del measured["batch_size"], measured["note"]
        return {
            **measured,
            "pairs_per_s": round(self.pairs_per_s, 1),
            "requests": self.requests,
            "served_over_device": round(self.pairs_per_s / self.device_pairs_per_s, 3),
            "stage_shares": {k: round(v, 3) for k, v in self.stages.items()},
            "idle_share": round(self.stages.get("idle", 0.0), 3),
            **self.extra,
        }


def scrape(base: str) -> dict[str, float]:
    """The rerank engine's stage, busy and idle seconds from the server's Prometheus text."""
    text = httpx.get(base + "/metrics", timeout=30).text
    totals: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.labels.get("engine") != "rerank" or not sample.name.endswith("_total"):
                continue
            if sample.name == "ragrank_stage_seconds_total":
                key = sample.labels["stage"]
            elif sample.name in (
                "ragrank_device_busy_seconds_total",
                "ragrank_device_idle_seconds_total",
            ):
                key = sample.name.split("_")[2]
            else:
                continue
            totals[key] = totals.get(key, 0.0) + sample.value
    return totals


def shares(
    before: dict[str, float], after: dict[str, float], wall: float, pairs: int
) -> dict[str, float]:
    """Each stage's seconds over the wall time, and the mean queue wait of a pair in ms."""
    grown = {k: after.get(k, 0.0) - before.get(k, 0.0) for k in (*STAGES, "busy", "idle")}
    waited = grown.pop("queue_wait")
    if not wall:
        return {}
    return {**{k: v / wall for k, v in grown.items()}, "queue_wait_ms": waited / pairs * 1000}


async def open_loop(
    url: str, workload: Workload, rate: float, duration_s: float, seed: int
) -> tuple[float, list[float], list[float]]:
    """Requests at Poisson arrivals of `rate`/s for `duration_s`, each sent without waiting for
    the others; returns the wall time until the last answer, each request's latency (in order
    sent) and its planned arrival time."""
    rng = random.Random(seed)

    async def one(http: httpx.AsyncClient, query: str, docs: list[str]) -> float:
        started = time.perf_counter()
        response = await http.post(url, json={"query": query, "documents": docs})
        if response.status_code != 200:
            raise RagrankError(f"{url} answered {response.status_code}: {response.text}")
        return (time.perf_counter() - started) * 1000

    limits = httpx.Limits(max_connections=1000)
    async with httpx.AsyncClient(timeout=3600, limits=limits) as http:
        tasks = []
        arrivals: list[float] = []
        while not arrivals or arrivals[-1] < duration_s:
            arrivals.append((arrivals[-1] if arrivals else 0.0) + rng.expovariate(rate))
        started = time.perf_counter()
        for index, at in enumerate(arrivals[:-1]):
            # Sleep until each arrival's own time: a late wake-up is caught up, not carried.
            await asyncio.sleep(max(0.0, at - (time.perf_counter() - started)))
            query, docs = workload.requests[index % len(workload.requests)]
            tasks.append(asyncio.ensure_future(one(http, query, docs)))
        latencies = list(await asyncio.gather(*tasks))
        return time.perf_counter() - started, latencies, arrivals[: len(tasks)]


def ideal_latencies(
    arrivals: Sequence[float], requests: Sequence[Sequence[int]], device: DeviceModel
) -> list[float]:
    """Each request's latency (ms) on the device alone with no host cost at all: packed
    batches of the oldest waiting pairs, each formed the moment the device frees up. No
    engine can answer these arrivals faster; at high load this floor is queueing alone."""
    waiting: deque[tuple[int, int]] = deque()
    remaining = [len(pairs) for pairs in requests]
    finished = [0.0] * len(requests)
    now, arrived = 0.0, 0
    while arrived < len(arrivals) or waiting:
        if not waiting:
            now = max(now, arrivals[arrived])
        while arrived < len(arrivals) and arrivals[arrived] <= now:
            waiting.extend((arrived, length) for length in requests[arrived])
            arrived += 1
        batch: list[int] = []
        tokens = 0
        while waiting and len(batch) < BATCH_ITEMS:
            if batch and tokens + waiting[0][1] > H200_BATCH_TOKENS:
                break
            owner, length = waiting.popleft()
            batch.append(owner)
            tokens += length
        now += device.seconds(tokens)
        for owner in batch:
            remaining[owner] -= 1
            if remaining[owner] == 0:
                finished[owner] = now
    return [(finished[i] - arrivals[i]) * 1000 for i in range(len(arrivals))]


@dataclass
class _Run:
    """One benchmark run's models, workload and device model."""

    options: ServedOptions
    models: tuple[Path, Path]
    workload: Workload
    scratch: Path
    #: The device model at speed 1, and its capacity on the workload's pairs at speed 1.
    capacity_at_1: float

    @contextmanager
    def server(self, policy: str, speed: float) -> Iterator[str]:
        """The server with the device model at `speed`, batching by `policy`; yields its URL."""
        port = free_port()
        reranker, embedder = self.models
        env = {
            **os.environ,
            "RAGRANK_RERANK_MODEL": str(reranker),
            "RAGRANK_EMBED_MODEL": str(embedder),
            "RAGRANK_QDRANT_PATH": str(self.scratch / f"qdrant-{policy}-{port}"),
            "RAGRANK_QDRANT_URL": "",
            "RAGRANK_HOST": "127.0.0.1",
            "RAGRANK_PORT": str(port),
            "RAGRANK_DEVICE": "cpu",
            "RAGRANK_RERANK_BATCH_SIZE": str(BATCH_ITEMS),
            "RAGRANK_RERANK_BATCH_TOKENS": str(H200_BATCH_TOKENS),
            "RAGRANK_REQUEST_TIMEOUT_S": "3600",
            "RAGRANK_BATCHING": policy,
            "RAGRANK_LOG_LEVEL": "WARNING",
        }
        command = [sys.executable, "-m", "cli.device_model_server", str(speed)]
        base = f"http://127.0.0.1:{port}"
        log = self.scratch / f"server-{policy}-{port}.log"
        with server_process(command, env, base + "/ready", log):
            yield base

    def closed_loop(self, base: str, clients: int, device: float) -> Level:
        count = max(self.options.requests, 2 * clients)
        requests = [self.workload.requests[i % len(self.workload.requests)] for i in range(count)]
        workload = Workload(requests=requests, lengths=[])
        body = _rerank_body
        asyncio.run(drive(base + "/v1/rerank", body, Workload(requests[:clients], []), clients))
        before = scrape(base)
        seconds, latencies = asyncio.run(drive(base + "/v1/rerank", body, workload, clients))
        pairs = sum(len(docs) for _, docs in requests)
        return Level(
            f"{clients} client{'s' if clients > 1 else ''}",
            pairs,
            seconds,
            latencies,
            device_pairs_per_s=device,
            stages=shares(before, scrape(base), seconds, pairs),
            requests=count,
        )

    def open_loop(self, base: str, load: float, device: float, model: DeviceModel) -> Level:
        per_request = self.options.documents
        rate = load * device / per_request
        before = scrape(base)
        seconds, latencies, arrivals = asyncio.run(
            open_loop(base + "/v1/rerank", self.workload, rate, self.options.open_loop_s, 1)
        )
        sizes = [len(docs) for _, docs in self.workload.requests]
        starts = np.cumsum([0, *sizes])
        lengths = self.workload.lengths
        requests = [
            lengths[starts[i % len(sizes)] : starts[i % len(sizes) + 1]]
            for i in range(len(arrivals))
        ]
        ideal = ideal_latencies(arrivals, requests, model)
        pairs = sum(len(r) for r in requests)
        return Level(
            f"open loop {load:.0%}",
            pairs,
            seconds,
            latencies,
            device_pairs_per_s=device,
            stages=shares(before, scrape(base), seconds, pairs),
            requests=len(latencies),
            extra={
                "offered_pairs_per_s": round(pairs / arrivals[-1], 1) if arrivals else None,
                "ideal_p50_ms": latency_quantile(ideal, 50),
                "ideal_p99_ms": latency_quantile(ideal, 99),
            },
        )


def _rerank_body(query: str, documents: list[str]) -> dict[str, Any]:
    return {"query": query, "documents": documents}


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_options(
        ServedOptions, argv, prog="python -m eval.bench.served", description=__doc__
    )
    return run(options)


def run(options: ServedOptions) -> int:
    """The benchmark: prints the tables and the served/device line, writes JSON."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if options.tiny:
        options = _tiny(options)
    out = options.out or Path("eval-results") / time.strftime("bench-served-%Y%m%d-%H%M%S.json")
    with tempfile.TemporaryDirectory(prefix="ragrank-served-") as scratch_dir:
        scratch = Path(scratch_dir)
        bench, report = _prepare(options, scratch)
        speed = options.speed if options.speed is not None else _auto_speed(bench, report)
        device = bench.capacity_at_1 * speed
        model = DeviceModel.h200(speed)
        report.update(speed=speed, device_pairs_per_s=round(device, 1))
        report["full_batch_ms"] = round(model.seconds(H200_BATCH_TOKENS) * 1000, 1)
        console.print(
            f"device model: H200 x {speed:.3f} = {device:.0f} pairs/s on this workload; "
            f"one full batch {report['full_batch_ms']} ms"
        )
        report["engines"] = {}
        for policy in options.policies:
            report["engines"][policy] = _engine_runs(bench, policy, speed, device)
        if options.warm_start:
            report["warm_start"] = _warm_start(bench)
    report["targets"] = _verdicts(report, options)
    _print(report)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    console.print(f"wrote {out}")
    new = report["engines"][options.policies[-1]]["closed"]
    console.print(
        "served/device: "
        + ", ".join(f"{level['name']} {level['served_over_device']:.2f}" for level in new)
    )
    return 0


def _tiny(options: ServedOptions) -> ServedOptions:
    from dataclasses import replace

    return replace(
        options,
        requests=min(options.requests, 8),
        clients=tuple(c for c in options.clients if c <= 16),
        open_loop_s=min(options.open_loop_s, 2.0),
        documents=min(options.documents, 8),
        speed=options.speed if options.speed is not None else 0.05,
    )


def _prepare(options: ServedOptions, scratch: Path) -> tuple[_Run, dict[str, Any]]:
    """The tiny reranker and embedder (the real XLM-R tokenizer where it is present), the
    workload and the device's capacity on it."""
    tokenizer = XLMR_TOKENIZER if XLMR_TOKENIZER.exists() else None
    reranker = tiny_model("reranker", scratch / "reranker", tokenizer)
    embedder = tiny_model("embedder", scratch / "embedder", tokenizer)
    scorer = CrossEncoderScorer(str(reranker), placement=resolve_placement("cpu"))
    data = bench_data(options.data)
    largest = max(options.requests, 2 * max(options.clients))
    workload = build_workload(
        scorer, data, requests=largest, documents=options.documents, seed=options.seed
    )
    lengths = list(workload.lengths)
    capacity = DeviceModel.h200().capacity(lengths, BATCH_ITEMS, H200_BATCH_TOKENS)
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "data": str(data),
        "tokenizer": "XLM-R" if tokenizer else "sample",
        "workload": workload.describe(),
        "cores": os.cpu_count(),
        "device_model": {
            "fitted_to": "H200, bge-reranker-v2-m3 shape, bf16, packed",
            "rate_tokens_per_s": round(DeviceModel.h200().rate),
            "launch_ms": DeviceModel.h200().launch * 1000,
            "capacity_at_speed_1": round(capacity, 1),
        },
    }
    console.print(f"workload {data}: {workload.describe()}")
    return _Run(options, (reranker, embedder), workload, scratch, capacity), report


def _auto_speed(bench: _Run, report: dict[str, Any]) -> float:
    """The host's capacity (an instant device, 16 clients) over `host_share` devices."""
    with bench.server("continuous", 0.0) as base:
        level = bench.closed_loop(base, 16, float("inf"))
    host = level.pairs_per_s
    report["host_pairs_per_s"] = round(host, 1)
    speed = host / bench.options.host_share / bench.capacity_at_1
    console.print(f"host alone (instant device, 16 clients): {host:.0f} pairs/s")
    return round(speed, 4)


def _engine_runs(bench: _Run, policy: str, speed: float, device: float) -> dict[str, Any]:
    model = DeviceModel.h200(speed)
    closed, opened = [], []
    with bench.server(policy, speed) as base:
        for clients in bench.options.clients:
            level = bench.closed_loop(base, clients, device)
            closed.append(level.summary())
            console.print(f"{policy}: {level.name}: {level.summary()}")
        for load in bench.options.loads:
            level = bench.open_loop(base, load, device, model)
            opened.append(level.summary())
            console.print(f"{policy}: {level.name}: {level.summary()}")
    return {"closed": closed, "open": opened}


def _warm_start(bench: _Run) -> dict[str, float | None]:
    """The first request's latency on a real (CPU) reranker, with warm-up and without."""
    first: dict[str, float | None] = {}
    reranker, embedder = bench.models
    query, docs = bench.workload.requests[0]
    for warmup in ("on", "off"):
        port = free_port()
        env = {
            **os.environ,
            "RAGRANK_RERANK_MODEL": str(reranker),
            "RAGRANK_EMBED_MODEL": str(embedder),
            "RAGRANK_QDRANT_PATH": str(bench.scratch / f"qdrant-warm-{warmup}"),
            "RAGRANK_QDRANT_URL": "",
            "RAGRANK_PORT": str(port),
            "RAGRANK_WARMUP": warmup,
            "RAGRANK_LOG_LEVEL": "WARNING",
        }
        base = f"http://127.0.0.1:{port}"
        log = bench.scratch / f"warm-{warmup}.log"
        with server_process(ragrank_command("serve"), env, base + "/ready", log):
            first[f"first_request_ms_warmup_{warmup}"] = first_request_ms(base, query, docs)
    return first


def _verdicts(report: dict[str, Any], options: ServedOptions) -> dict[str, Any]:
    """The new engine against the targets (none in `--tiny`)."""
    if options.tiny:
        return {}
    new = report["engines"][options.policies[-1]]
    served = {
        f"clients_{level['name'].split()[0]}": level["served_over_device"]
        for level in new["closed"]
    }
    verdicts: dict[str, Any] = {
        key: {"value": served.get(key), "target": f">= {target}"} for key, target in TARGETS.items()
    }
    batch_ms = report["full_batch_ms"]
    for level in new["open"]:
        if level["name"].endswith("90%"):
            verdicts["open_90_p99_over_full_batch"] = {
                "value": round(level["p99_ms"] / batch_ms, 2),
                "target": f"<= {OPEN_LOOP_P99_BATCHES}",
                "ideal_engine": round(level["ideal_p99_ms"] / batch_ms, 2),
            }
    one = next((lv for lv in new["closed"] if lv["name"] == "1 client"), None)
    if one is not None:
        verdicts["one_client_latency_over_own_work"] = {
            "value": _one_client_overhead(one, report),
            "target": f"<= {ONE_CLIENT_OVERHEAD}",
        }
    return verdicts


def _one_client_overhead(level: dict[str, Any], report: dict[str, Any]) -> float | None:
    """p50 latency over the request's own tokenising plus its own device time."""
    stages = level["stage_shares"]
    if not level["requests"] or level["p50_ms"] is None:
        return None
    wall_ms = level["seconds"] * 1000
    own_tokenise = stages.get("tokenise", 0.0) * wall_ms / level["requests"]
    own_device = stages.get("busy", 0.0) * wall_ms / level["requests"]
    own = own_tokenise + own_device
    return round(level["p50_ms"] / own, 2) if own else None


def _print(report: dict[str, Any]) -> None:
    table = Table(
        title=f"/v1/rerank against the device model ({report['device_pairs_per_s']} pairs/s)"
    )
    columns = ("engine", "run", "pairs/s", "p50 ms", "p99 ms", "served/device", "idle", "wait ms")
    stage_columns = ("tokenise", "collate", "forward", "answer")
    for column in (*columns, *stage_columns):
        table.add_column(column, justify="left" if column in ("engine", "run") else "right")
    for policy, runs in report["engines"].items():
        for level in (*runs["closed"], *runs["open"]):
            shares_ = level["stage_shares"]
            table.add_row(
                policy,
                level["name"],
                f"{level['pairs_per_s']:.0f}",
                str(level["p50_ms"]),
                str(level["p99_ms"]),
                f"{level['served_over_device']:.2f}",
                f"{level['idle_share']:.0%}",
                f"{shares_.get('queue_wait_ms', 0.0):.0f}",
                *(f"{shares_.get(stage, 0.0):.0%}" for stage in stage_columns),
            )
    console.print(table)
    for name, verdict in report["targets"].items():
        ideal = f"; an ideal engine: {verdict['ideal_engine']}" if "ideal_engine" in verdict else ""
        console.print(f"{name}: {verdict['value']} (target {verdict['target']}{ideal})")
    if "warm_start" in report:
        console.print(f"first request: {report['warm_start']}")


if __name__ == "__main__":
    raise SystemExit(main())
