"""The soak run's traffic: closed-loop clients mixing searches, reranks, embeddings, writes,
job polls and scrapes, and the shared record of what they saw."""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import httpx

#: The operations a client picks from, with their weights.
MIX = {
    "search": 25,
    "search_first_stage": 8,
    "search_filtered": 10,
    "rerank": 14,
    "embeddings": 10,
    "ingest": 10,
    "delete": 4,
    "job": 12,
    "metrics": 3,
}
LANGUAGES = ("en", "de", "fr", "es")


@dataclass
class Window:
    """What the clients saw in one sampling interval."""

    latencies_ms: dict[str, list[float]] = field(default_factory=lambda: defaultdict(list))
    statuses: Counter[str] = field(default_factory=Counter)


@dataclass
class Soak:
    """The clients' shared record."""

    base: str
    seed: int
    doc_ids: int
    passages: list[str]
    queries: list[str]
    window: Window = field(default_factory=Window)
    statuses: Counter[str] = field(default_factory=Counter)
    accepted: dict[str, str] = field(default_factory=dict)  # job id: kind
    #: Writes whose answer never came (a kill cut them off): each may or may not have landed.
    unanswered_writes: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, route: str, status: int, started: float) -> None:
        with self.lock:
            label = f"{route} {status}"
            self.window.statuses[label] += 1
            self.statuses[label] += 1
            if 200 <= status < 300:
                self.window.latencies_ms[route].append((time.perf_counter() - started) * 1000)

    def take_window(self) -> Window:
        with self.lock:
            window, self.window = self.window, Window()
        return window


async def client(soak: Soak, number: int, deadline: float) -> None:
    rng = random.Random(soak.seed * 1_000 + number)
    operations, weights = zip(*MIX.items(), strict=True)
    async with httpx.AsyncClient(base_url=soak.base, timeout=120) as http:
        while time.monotonic() < deadline:
            operation = rng.choices(operations, weights)[0]
            try:
                await _operation(soak, http, rng, operation)
            except httpx.TransportError as exc:
                # Refused at connect, a write was never sent; cut off later, it may have landed.
                if operation in ("ingest", "delete") and not isinstance(exc, httpx.ConnectError):
                    with soak.lock:
                        soak.unanswered_writes += 1
                soak.record(operation, 0, time.perf_counter())  # no answer: the server is down
                await asyncio.sleep(0.5)


async def _operation(soak: Soak, http: httpx.AsyncClient, rng: random.Random, name: str) -> None:
    started = time.perf_counter()
    query = rng.choice(soak.queries)
    if name.startswith("search"):
        body: dict[str, Any] = {"query": query, "top_k": 5, "candidates": 20}
        if name == "search_first_stage":
            body["rerank"] = False
        elif name == "search_filtered":
            body["filter"] = {"lang": rng.choice(LANGUAGES)}
        response = await http.post("/v1/search", json=body)
    elif name == "rerank":
        passages = rng.sample(soak.passages, 8)
        response = await http.post("/v1/rerank", json={"query": query, "documents": passages})
    elif name == "embeddings":
        texts = rng.sample(soak.passages, 4)
        response = await http.post("/v1/embeddings", json={"input": texts})
    elif name == "ingest":
        documents: list[dict[str, Any]] = [
            {
                "id": f"soak-{rng.randrange(soak.doc_ids)}",
                "text": " ".join(rng.sample(soak.passages, rng.randint(1, 3))),
                "title": f"version {rng.randrange(10**6)}",
                "metadata": {"lang": rng.choice(LANGUAGES), "n": rng.randrange(100)},
            }
            for _ in range(rng.randint(1, 4))
        ]
        response = await http.post("/v1/documents", json={"documents": documents})
    elif name == "delete":
        response = await http.delete(f"/v1/documents/soak-{rng.randrange(soak.doc_ids)}")
    elif name == "job":
        with soak.lock:
            ids = list(soak.accepted)
        if not ids:
            return
        response = await http.get(f"/v1/jobs/{rng.choice(ids[-50:])}")
    else:
        response = await http.get("/metrics")
    if name in ("ingest", "delete") and response.status_code == 202:
        with soak.lock:
            soak.accepted[response.json()["job_id"]] = name
    soak.record(name, response.status_code, started)


def drain(soak: Soak, timeout_s: float = 600) -> dict[str, str]:
    """Wait for every accepted job to end; their final states."""
    ends = time.monotonic() + timeout_s
    states: dict[str, str] = {}
    with httpx.Client(base_url=soak.base, timeout=60) as http:
        for job_id in soak.accepted:
            while True:
                state = http.get(f"/v1/jobs/{job_id}").json()["state"]
                if state in ("done", "failed") or time.monotonic() > ends:
                    states[job_id] = state
                    break
                time.sleep(0.2)
    return states
