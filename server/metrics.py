"""Prometheus metrics. Requests and durations by route and status come from Litestar's own
middleware; the batching engines report what each forward pass held."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from litestar import Response, get
from litestar.plugins.prometheus import PrometheusConfig, PrometheusController
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from ragrank.engine import STAGES
from ragrank.errors import JobQueueUnavailableError
from ragrank.jobs import JOB_STATES

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from ragrank.engine import BatchEngine, BatchStats

#: Each engine is one role ("embed", "rerank") of one served model.
_ENGINE = ["engine", "model"]

BATCH_ITEMS = Histogram(
    "ragrank_batch_items",
    "Items in one forward pass",
    _ENGINE,
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
)
BATCH_REQUESTS = Histogram(
    "ragrank_batch_requests",
    "Requests sharing one forward pass",
    _ENGINE,
    buckets=(1, 2, 3, 4, 8, 16, 32, 64),
)
BATCH_TOKENS = Histogram(
    "ragrank_batch_tokens",
    "Padded tokens in one forward pass",
    _ENGINE,
    buckets=(64, 256, 1024, 2048, 4096, 8192, 16384, 32768, 65536),
)
PADDING_RATIO = Histogram(
    "ragrank_batch_padding_ratio",
    "Share of a forward pass's tokens that are padding",
    _ENGINE,
    buckets=(0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0),
)
FORWARD_SECONDS = Histogram(
    "ragrank_forward_seconds",
    "Time of one forward pass, tokenisation included",
    _ENGINE,
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
QUEUE_DEPTH = Gauge("ragrank_queue_depth", "Items waiting for a forward pass", _ENGINE)
STAGE_SECONDS = Counter(
    "ragrank_stage_seconds",
    "Seconds spent in each stage of a request's items (queue_wait: summed over the items)",
    [*_ENGINE, "stage"],
)
DEVICE_BUSY = Counter(
    "ragrank_device_busy_seconds", "Seconds the model ran forward passes", _ENGINE
)
DEVICE_IDLE = Counter(
    "ragrank_device_idle_seconds",
    "Seconds no forward pass ran while work waited for one (host work, convoys)",
    _ENGINE,
)
IDLE_SHARE = Gauge(
    "ragrank_device_idle_share",
    "Of the last minute's time with work waiting, the share in which no forward pass ran",
    _ENGINE,
)
RERANK_FALLBACKS = Counter(
    "ragrank_rerank_fallbacks_total",
    "Searches with rerank=auto answered in cosine order, by the reranker's error code",
    ["code"],
)
JOBS = Gauge(
    "ragrank_jobs",
    "Jobs in the durable queue, by state (a shared queue: every replica reports the same)",
    ["state"],
)
JOB_QUEUE_UP = Gauge(
    "ragrank_job_queue_up", "1 when the last scrape could read the job queue, else 0"
)
ERRORS = Counter(
    "ragrank_errors_total", "Error responses by HTTP status and error code", ["status", "code"]
)


def observe(stats: BatchStats) -> None:
    labels = {"engine": stats.engine, "model": stats.model}
    BATCH_ITEMS.labels(**labels).observe(stats.items)
    BATCH_REQUESTS.labels(**labels).observe(stats.requests)
    BATCH_TOKENS.labels(**labels).observe(stats.padded_tokens)
    PADDING_RATIO.labels(**labels).observe(1 - stats.tokens / max(stats.padded_tokens, 1))
    FORWARD_SECONDS.labels(**labels).observe(stats.seconds)


def instrument(engine: BatchEngine[Any, Any, Any]) -> None:
    """Report `engine`'s batches and queue depth."""
    engine.on_batch.append(observe)
    labels = {"engine": engine.name, "model": engine.model}
    QUEUE_DEPTH.labels(**labels).set_function(lambda: engine.queue_depth)
    IDLE_SHARE.labels(**labels).set_function(engine.clock.idle_share)
    counters = {stage: STAGE_SECONDS.labels(**labels, stage=stage) for stage in STAGES}
    counters |= {"busy": DEVICE_BUSY.labels(**labels), "idle": DEVICE_IDLE.labels(**labels)}
    counted = dict.fromkeys(counters, 0.0)

    def clocked(_: BatchStats) -> None:
        """The engine's running totals (its stages and its device clock), as counters: what
        grew since the last batch."""
        now = {**engine.totals.snapshot(), "busy": engine.clock.busy_s, "idle": engine.clock.idle_s}
        for key, counter in counters.items():
            counter.inc(max(0.0, now[key] - counted[key]))
        counted.update(now)

    engine.on_batch.append(clocked)


def instrument_jobs(states: Callable[[], Mapping[str, int]]) -> None:
    """Report the job queue's size by state, read once per scrape: a scrape reads the gauges
    in the order they were made, and the first one counts for all. A queue that cannot be
    read reports `ragrank_job_queue_up 0` and no counts, and the scrape still answers."""
    last: list[Mapping[str, int]] = [{}]
    up = [1.0]

    def read(state: str) -> float:
        if state == JOB_STATES[0]:
            try:
                last[0], up[0] = states(), 1.0
            except JobQueueUnavailableError:
                last[0], up[0] = {}, 0.0
        return last[0].get(state, 0) if up[0] else float("nan")

    for state in JOB_STATES:
        JOBS.labels(state=state).set_function(partial(read, state))
    JOB_QUEUE_UP.set_function(lambda: up[0])


PROMETHEUS = PrometheusConfig(
    app_name="ragrank", prefix="ragrank_http", group_path=True, exclude=["/metrics"]
)


class MetricsController(PrometheusController):
    """`GET /metrics` in Prometheus's text format; an operations endpoint, so it stays out of the
    API's OpenAPI schema (which describes JSON)."""

    include_in_schema = False

    @get(sync_to_thread=True)
    def get(self) -> Response[bytes]:
        """On a worker thread, not the event loop: the job-queue gauges read a shared queue's
        database, which may be slow or, while it restarts, wait out a connection timeout."""
        return Response(generate_latest(REGISTRY), headers={"Content-Type": CONTENT_TYPE_LATEST})
