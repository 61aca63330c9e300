"""`python -m eval.bench.soak` (`make soak`): one `ragrank serve`, on the embedded store with its
in-process worker, under mixed reads and writes for a set time (30 minutes by default).

Several closed-loop clients mix `/v1/search` (reranked, first stage only, filtered),
`/v1/rerank`, `/v1/embeddings`, ingest and delete jobs over a fixed set of document ids, job
polling and `/metrics` scrapes. Every `--interval` seconds it records the server's resident
memory, threads and open file descriptors, the batching queues, the job queue, p50/p99 per
route and the status counts; it writes them as JSON and as a PNG over time.

With `--kills N` it `kill -9`s the server N times at random moments (in the first third),
restarts it on the same
folder and goes on. At the end it checks, and exits 1 when any check fails:

- no answer was a 5xx;
- every accepted job (a 202 with its id) reached `done`, and no job is in the queue that a
  client did not send (a write whose answer a kill cut off may have landed: at most one job
  each);
- the final collection equals a clean replay of the queue's jobs, in order, into a fresh
  store: the same points, payloads and vectors, so no job was lost or applied twice;
- RSS, threads and file descriptors grow by less than 5 % (threads and descriptors: or by at
  most 2) from the first to the last tenth of the longest server life after its warm-up
  (`--warmup`: 10 % of the run, at least 60 s);
- p99 in the last tenth (five samples at least) is within 1.5x of the first: of all answers
  (at least 100 in both tenths), and of each route with at least 1,000 answers in both.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np

from eval.bench.harness import (
    free_port,
    latency_quantile,
    minilm_reranker,
    ragrank_command,
    server_process,
    small_embedder,
)
from eval.bench.options import SoakOptions
from ragrank import SAMPLE_DATASET
from ragrank.beir import load_beir
from ragrank.options import parse_options

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ragrank.settings import Settings

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
#: Answers a route (or all of them) needs in each compared tenth for its p99 to be judged:
#: below that, a p99 is the slowest one or two answers, which a single pause decides.
MIN_LATENCIES = 100
#: The same for one route: its p99 is judged on at least ten answers above it. In a
#: three-minute run a route's tenth holds a few hundred answers, and one slow search (a
#: segment flush after writes) moved its p99 2.3x while all answers' p99 moved 1.1x.
MIN_ROUTE_LATENCIES = 1_000


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


def process_sample(pid: int) -> dict[str, float]:
    """Resident memory (MiB), threads and open file descriptors of the server, from /proc."""
    fields: dict[str, str] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        fields[name] = (value.split() or [""])[0]
    return {
        "rss_mb": round(int(fields["VmRSS"]) / 1024, 1),
        # Of which anonymous (the heap) and file-backed (the store's mapped segment files,
        # which the kernel can drop and read again).
        "rss_anon_mb": round(int(fields["RssAnon"]) / 1024, 1),
        "rss_file_mb": round(int(fields["RssFile"]) / 1024, 1),
        "threads": int(fields["Threads"]),
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
    }


def scrape(base: str) -> dict[str, float]:
    """Queue depths and the job queue's states from `/metrics`."""
    found: dict[str, float] = {}
    text = httpx.get(f"{base}/metrics", timeout=30).text
    for line in text.splitlines():
        for prefix, name in (
            ('ragrank_queue_depth{engine="embed"}', "embed_queue"),
            ('ragrank_queue_depth{engine="rerank"}', "rerank_queue"),
            ('ragrank_jobs{state="queued"}', "jobs_queued"),
            ('ragrank_jobs{state="running"}', "jobs_running"),
            ('ragrank_jobs{state="done"}', "jobs_done"),
        ):
            if line.startswith(prefix):
                found[name] = float(line.rsplit(" ", 1)[1])
    return found


def folder_mb(path: Path) -> float:
    """MiB of a file, or of every file below a folder."""
    files = [str(path)] if path.is_file() else []
    for folder, _, names in os.walk(path):  # the store renames files as it writes: skip those
        files.extend(os.path.join(folder, name) for name in names)
    total = 0
    for name in files:
        with contextlib.suppress(OSError):
            total += os.stat(name).st_size
    return round(total / 2**20, 1)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_options(SoakOptions, argv, prog="python -m eval.bench.soak", description=__doc__)
    seed = args.seed if args.seed is not None else int(time.time())
    rng = random.Random(seed)
    work = Path(tempfile.mkdtemp(prefix="ragrank-soak-"))
    if args.tiny:
        from eval.random_models import save_tiny_models

        tiny = save_tiny_models(work / "models")
        args = replace(args, embed_model=str(tiny[0]), rerank_model=str(tiny[1]))
    env = {
        **os.environ,
        "RAGRANK_EMBED_MODEL": args.embed_model or small_embedder(),
        "RAGRANK_RERANK_MODEL": args.rerank_model or minilm_reranker(work / "reranker"),
        "RAGRANK_QDRANT_PATH": str(work / "qdrant"),
        "RAGRANK_JOBS_PATH": str(work / "jobs.sqlite3"),
        "RAGRANK_DEVICE": "cpu",
        "RAGRANK_LOG_LEVEL": "WARNING",
        "RAGRANK_METADATA_INDEXES": "lang",
    }
    dataset = load_beir(SAMPLE_DATASET)
    port = free_port()
    soak = Soak(
        base=f"http://127.0.0.1:{port}",
        seed=seed,
        doc_ids=args.doc_ids,
        passages=[d.passage for d in dataset.corpus.values()],
        queries=sorted(dataset.queries.values()),
    )
    run = Run(soak=soak, args=args, work=work)
    seconds = args.minutes * 60
    # Early, so the life after the last restart is the longest and is judged after its warm-up.
    offsets = sorted(rng.uniform(0.1, 0.3) * seconds for _ in range(args.kills))
    command = ragrank_command("serve", "--port", str(port))
    clients: threading.Thread | None = None
    life = 0
    while True:
        log = work / f"serve-{life}.log"
        with server_process(command, env, f"{soak.base}/ready", log) as process:
            if clients is None:  # the clock starts once the first server is ready
                run.started = time.monotonic()
                run.deadline = run.started + seconds
                run.kills = [run.started + at for at in offsets]
                clients = threading.Thread(target=run.clients)
                clients.start()
            if run.watch(process.pid, life):
                process.send_signal(signal.SIGKILL)
                process.wait()
                print(f"soak: kill -9 at {time.monotonic() - run.started:.0f} s", flush=True)
                life += 1
                continue
            clients.join()
            finished = _drain(soak)
        break
    report = _report(run, argv, seed, finished, env)
    out = args.out or Path("eval-results") / f"soak-{datetime.now():%Y%m%d-%H%M%S}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    _plot(run.samples, out.with_suffix(".png"))
    print(json.dumps({k: v for k, v in report.items() if k != "samples"}, indent=2))
    print(f"soak: report in {out}, plot in {out.with_suffix('.png')}")
    failed = [name for name, check in report["checks"].items() if not check["ok"]]
    for name in failed:  # last, so that a log's tail says what failed
        print(f"soak: FAILED {name}: {json.dumps(report['checks'][name])[:400]}")
    passed = not failed
    if passed and not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    else:
        print(f"soak: the server's folders and logs are in {work}")
    return 0 if passed else 1


@dataclass
class Run:
    """One soak run: its clients, its clock and its samples."""

    soak: Soak
    args: SoakOptions
    work: Path
    started: float = 0.0
    deadline: float = 0.0
    #: When (monotonic) each kill -9 is due.
    kills: list[float] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)

    @property
    def warmup_s(self) -> float:
        """Left out of each server life before growth is judged: allocators, caches and pools
        fill in the first minute."""
        given: float | None = self.args.warmup
        return given if given is not None else max(60.0, 0.1 * self.args.minutes * 60)

    def clients(self) -> None:
        async def together() -> None:
            count = self.args.clients
            await asyncio.gather(*(client(self.soak, n, self.deadline) for n in range(count)))

        asyncio.run(together())

    def watch(self, pid: int, life: int) -> bool:
        """Sample the server until the run ends (False) or a kill is due (True)."""
        while True:
            next_at = min([time.monotonic() + self.args.interval, self.deadline, *self.kills])
            time.sleep(max(0.0, next_at - time.monotonic()))
            now = time.monotonic()
            self.samples.append(self.sample(pid, life, now))
            if self.kills and now >= self.kills[0]:
                self.kills.pop(0)
                return True
            if now >= self.deadline:
                return False

    def sample(self, pid: int, life: int, now: float) -> dict[str, Any]:
        window = self.soak.take_window()
        sample: dict[str, Any] = {"t_s": round(now - self.started, 1), "life": life}
        try:
            sample.update(process_sample(pid))
            sample.update(scrape(self.soak.base))
        except (OSError, httpx.HTTPError, KeyError):
            pass  # a sample while the server is down or dying
        jobs_files = self.work.glob("jobs.sqlite3*")
        sample["jobs_db_mb"] = round(sum(folder_mb(f) for f in jobs_files), 1)
        sample["qdrant_mb"] = folder_mb(self.work / "qdrant")
        latencies = window.latencies_ms
        sample["statuses"] = dict(window.statuses)
        sample["p50_ms"] = {r: latency_quantile(v, 50) for r, v in latencies.items()}
        sample["p99_ms"] = {r: latency_quantile(v, 99) for r, v in latencies.items()}
        sample["latencies_ms"] = {r: [round(x, 1) for x in v] for r, v in latencies.items()}
        return sample


def _drain(soak: Soak, timeout_s: float = 600) -> dict[str, str]:
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


def _report(
    run: Run, argv: Sequence[str] | None, seed: int, finished: dict[str, str], env: dict[str, str]
) -> dict[str, Any]:
    from indexing import JobStore
    from ragrank.settings import Settings

    soak, samples = run.soak, run.samples
    settings = Settings.from_env(env)
    queue = list(JobStore(settings.jobs_path).jobs())
    checks = {
        "no_5xx": _no_5xx(soak),
        "every_accepted_job_done": _jobs_done(soak, finished, queue),
        "collection_equals_replay": _replay(settings, queue, run.work),
        **_growth(samples, run.warmup_s),
        **_latency(samples, run.warmup_s),
    }
    return {
        "command": "python -m eval.bench.soak " + " ".join(sys.argv[1:] if argv is None else argv),
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
        "seed": seed,
        "minutes": run.args.minutes,
        "clients": run.args.clients,
        "kills": run.args.kills,
        "models": {"embed": env["RAGRANK_EMBED_MODEL"], "rerank": env["RAGRANK_RERANK_MODEL"]},
        "requests": sum(soak.statuses.values()),
        "statuses": dict(sorted(soak.statuses.items())),
        "jobs": {"accepted": len(soak.accepted), "in_queue": len(queue)},
        "unanswered_writes": soak.unanswered_writes,
        "disk_mb": {
            "jobs": round(sum(folder_mb(f) for f in run.work.glob("jobs.sqlite3*")), 1),
            "qdrant": folder_mb(run.work / "qdrant"),
        },
        "checks": checks,
        "samples": [{k: v for k, v in s.items() if k != "latencies_ms"} for s in samples],
    }


def _no_5xx(soak: Soak) -> dict[str, Any]:
    errors = {label: n for label, n in soak.statuses.items() if int(label.rsplit(" ", 1)[1]) >= 500}
    return {"ok": not errors, "detail": errors or "none"}


def _jobs_done(soak: Soak, finished: dict[str, str], queue: list[Any]) -> dict[str, Any]:
    """Every accepted job done and in the queue; nothing else there but the writes a kill cut
    off (each at most one job)."""
    not_done = {job_id: state for job_id, state in finished.items() if state != "done"}
    in_queue = {job.id for job in queue}
    lost = [job_id for job_id in soak.accepted if job_id not in in_queue]
    unknown = len(in_queue - set(soak.accepted))
    ok = not not_done and not lost and unknown <= soak.unanswered_writes
    detail = {
        "accepted": len(soak.accepted),
        "not_done": not_done,
        "lost": lost,
        "in_queue_not_acknowledged": unknown,
        "writes_without_answer": soak.unanswered_writes,
    }
    return {"ok": ok, "detail": detail}


def _replay(settings: Settings, queue: list[Any], work: Path) -> dict[str, Any]:
    """Run the queue's jobs again, in order, on a fresh store, and compare the two."""
    from indexing import JobStore, Worker
    from ragrank.models import SentenceTransformerEmbedder
    from ragrank.store import open_store

    fresh = settings.replace(
        qdrant_path=work / "replay-qdrant", jobs_path=work / "replay-jobs.sqlite3"
    )
    jobs = JobStore(fresh.jobs_path)
    for job in queue:
        if job.kind == "upsert":
            jobs.add_upsert(job.documents())
        else:
            jobs.add_delete(str(job.payload["doc_id"]))
    embedder = SentenceTransformerEmbedder.from_settings(settings)
    replayed = open_store(fresh)
    served = open_store(settings)
    try:
        replayed.ensure_collection(embedder.dimension)
        Worker.from_settings(fresh, embedder, replayed, jobs).run_once()
        ours, theirs = _points(served), _points(replayed)
    finally:
        replayed.close()
        served.close()
    missing, extra = sorted(set(theirs) - set(ours)), sorted(set(ours) - set(theirs))
    differ = [
        point
        for point in set(ours) & set(theirs)
        if ours[point][0] != theirs[point][0]
        or not np.allclose(ours[point][1], theirs[point][1], atol=1e-4)
    ]
    detail = {
        "points": len(ours),
        "replayed_points": len(theirs),
        "documents": len({payload["doc_id"] for payload, _ in ours.values()}),
        "missing": missing[:10],
        "extra": extra[:10],
        "different": sorted(differ)[:10],
    }
    return {"ok": not (missing or extra or differ), "detail": detail}


def _points(store: Any) -> dict[str, tuple[dict[str, Any], list[float]]]:
    found: dict[str, tuple[dict[str, Any], list[float]]] = {}
    for page in store.points():
        for point in page:
            sparse = point.sparse
            payload = dict(point.payload)
            if sparse is not None:
                payload["_sparse"] = (list(sparse.indices), [round(v, 5) for v in sparse.values])
            found[point.id] = (payload, point.vector)
    return found


def _steady(
    samples: list[dict[str, Any]], warmup_s: float
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The first and the last tenth (five samples at least) of the longest server life after
    its warm-up (its first `warmup_s` seconds); empty when no life is long enough to judge
    (10 samples)."""
    lives: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for sample in samples:
        if "rss_mb" in sample:
            lives[sample["life"]].append(sample)
    steady = [[s for s in life if s["t_s"] - life[0]["t_s"] >= warmup_s] for life in lives.values()]
    longest = max(steady, key=len, default=[])
    if len(longest) < 10:
        return [], []
    # At least five samples a side: in a short run a tenth is a few seconds, and one pause in
    # them would decide the verdict.
    tenth = max(5, len(longest) // 10)
    return longest[:tenth], longest[-tenth:]


#: Threads and open files may grow by this many even when that is over 5 %: pools start and
#: stop worker threads and sockets on demand, and one more of 16 is not a leak.
COUNT_SLACK = 2


def _growth(samples: list[dict[str, Any]], warmup_s: float = 0.0) -> dict[str, dict[str, Any]]:
    """Each of RSS, threads and open files grows by less than 5 % (counts: or by at most
    COUNT_SLACK) from the first to the last tenth of the longest life after its warm-up."""
    first, last = _steady(samples, warmup_s)
    checks = {}
    for name in ("rss_mb", "threads", "fds"):
        if not first:
            checks[f"{name}_flat"] = {"ok": False, "detail": "the run was too short to judge"}
            continue
        before = statistics.fmean(s[name] for s in first)
        after = statistics.fmean(s[name] for s in last)
        growth = after / before - 1
        detail = {"first_tenth": round(before, 1), "last_tenth": round(after, 1)}
        ok = growth < 0.05 or (name != "rss_mb" and after - before <= COUNT_SLACK)
        checks[f"{name}_flat"] = {"ok": ok, "growth": round(growth, 4), "detail": detail}
    return checks


def _latency(samples: list[dict[str, Any]], warmup_s: float = 0.0) -> dict[str, dict[str, Any]]:
    """p99 of the last tenth within 1.5x the first: of all answers, and of each route with
    enough answers in both tenths for a p99 to mean something (MIN_LATENCIES,
    MIN_ROUTE_LATENCIES)."""
    first, last = _steady(samples, warmup_s)
    if not first:
        return {"p99_steady": {"ok": False, "detail": "the run was too short to judge"}}
    ratios: dict[str, Any] = {}
    for route in ("all", *MIX):
        early = [
            x for s in first for r, v in s["latencies_ms"].items() if route in (r, "all") for x in v
        ]
        late = [
            x for s in last for r, v in s["latencies_ms"].items() if route in (r, "all") for x in v
        ]
        need = MIN_LATENCIES if route == "all" else MIN_ROUTE_LATENCIES
        if len(early) >= need and len(late) >= need:
            p99_early = float(np.percentile(early, 99))
            p99_late = float(np.percentile(late, 99))
            ratios[route] = {
                "first_p99_ms": round(p99_early, 1),
                "last_p99_ms": round(p99_late, 1),
                "ratio": round(p99_late / p99_early, 2),
                "answers": [len(early), len(late)],
            }
    ok = "all" in ratios and all(r["ratio"] <= 1.5 for r in ratios.values())
    return {"p99_steady": {"ok": ok, "detail": ratios or "too few answers to judge"}}


def _plot(samples: list[dict[str, Any]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, 3, figsize=(15, 7.5), sharex=True)
    minutes = [s["t_s"] / 60 for s in samples]
    panels = [
        ("resident memory (MiB)", ("rss_mb", "rss_anon_mb", "rss_file_mb")),
        ("threads, open files", ("threads", "fds")),
        ("queues (items, jobs)", ("embed_queue", "rerank_queue", "jobs_queued")),
        ("disk (MiB)", ("jobs_db_mb", "qdrant_mb")),
    ]
    for axis, (title, names) in zip(axes.flat, panels, strict=False):
        for name in names:
            axis.plot(minutes, [s.get(name, np.nan) for s in samples], label=name)
        axis.set_title(title)
        axis.legend(fontsize=7)
    p99 = axes.flat[4]
    for route in MIX:
        p99.plot(minutes, [s["p99_ms"].get(route) or np.nan for s in samples], label=route)
    p99.set_title("p99 per route (ms)")
    p99.set_yscale("log")
    p99.legend(fontsize=6, ncol=2)
    answers = axes.flat[5]
    for kind, low, high in (
        ("2xx", 200, 300),
        ("4xx", 400, 500),
        ("5xx", 500, 600),
        ("none", 0, 1),
    ):
        counts = [
            sum(n for label, n in s["statuses"].items() if low <= int(label.rsplit()[1]) < high)
            for s in samples
        ]
        answers.plot(minutes, counts, label=kind)
    answers.set_title("answers per sample")
    answers.legend(fontsize=7)
    restarts = [
        m
        for m, a, b in zip(minutes[1:], samples, samples[1:], strict=False)
        if a["life"] != b["life"]
    ]
    for axis in axes.flat:
        for at in restarts:
            axis.axvline(at, color="red", linestyle=":", linewidth=1)
        axis.grid(alpha=0.3)
    for axis in axes[1]:
        axis.set_xlabel("minutes")
    figure.suptitle("ragrank soak: one server, mixed reads and writes (red: kill -9 and restart)")
    figure.tight_layout()
    figure.savefig(out, dpi=90)
    plt.close(figure)


if __name__ == "__main__":
    raise SystemExit(main())
