"""The soak run's verdicts: no 5xx, every job done, the collection equal to a clean replay,
flat memory, threads and files, steady p99."""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import TYPE_CHECKING, Any

import numpy as np

from eval.bench.soak.traffic import MIX

if TYPE_CHECKING:
    from pathlib import Path

    from eval.bench.soak.traffic import Soak
    from ragrank.settings import Settings

#: Answers a route (or all of them) needs in each compared tenth for its p99 to be judged:
#: below that, a p99 is the slowest one or two answers, which a single pause decides.
MIN_LATENCIES = 100
#: The same for one route: its p99 is judged on at least ten answers above it. In a
#: three-minute run a route's tenth holds a few hundred answers, and one slow search (a
#: segment flush after writes) moved its p99 2.3x while all answers' p99 moved 1.1x.
MIN_ROUTE_LATENCIES = 1_000


def no_5xx(soak: Soak) -> dict[str, Any]:
    errors = {label: n for label, n in soak.statuses.items() if int(label.rsplit(" ", 1)[1]) >= 500}
    return {"ok": not errors, "detail": errors or "none"}


def jobs_done(soak: Soak, finished: dict[str, str], queue: list[Any]) -> dict[str, Any]:
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


def replay(settings: Settings, queue: list[Any], work: Path) -> dict[str, Any]:
    """Run the queue's jobs again, in order, on a fresh store, and compare the two."""
    from indexing import Worker
    from ragrank.backends.serving import load_inference
    from ragrank.jobs import open_job_queue
    from ragrank.store import open_store

    fresh = settings.replace(
        qdrant_path=work / "replay-qdrant", jobs_path=work / "replay-jobs.sqlite3", jobs_url=None
    )
    jobs = open_job_queue(fresh)
    for job in queue:
        if job.kind == "upsert":
            jobs.add_upsert(job.documents())
        else:
            jobs.add_delete(str(job.payload["doc_id"]))
    inference = load_inference(settings, rerankers=False)
    replayed = open_store(fresh)
    served = open_store(settings)
    try:
        with inference.running():
            embedder = inference.bulk_embedder()
            replayed.ensure_collection(embedder.dimension)
            Worker.from_settings(fresh, embedder, replayed, jobs).run_once()
        ours, theirs = points(served), points(replayed)
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


def points(store: Any) -> dict[str, tuple[dict[str, Any], list[float]]]:
    found: dict[str, tuple[dict[str, Any], list[float]]] = {}
    for page in store.points():
        for point in page:
            sparse = point.sparse
            payload = dict(point.payload)
            if sparse is not None:
                payload["_sparse"] = (list(sparse.indices), [round(v, 5) for v in sparse.values])
            found[point.id] = (payload, point.vector)
    return found


def steady(
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


def growth(samples: list[dict[str, Any]], warmup_s: float = 0.0) -> dict[str, dict[str, Any]]:
    """Each of RSS, threads and open files grows by less than 5 % (counts: or by at most
    COUNT_SLACK) from the first to the last tenth of the longest life after its warm-up."""
    first, last = steady(samples, warmup_s)
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


def latency(samples: list[dict[str, Any]], warmup_s: float = 0.0) -> dict[str, dict[str, Any]]:
    """p99 of the last tenth within 1.5x the first: of all answers, and of each route with
    enough answers in both tenths for a p99 to mean something (MIN_LATENCIES,
    MIN_ROUTE_LATENCIES)."""
    first, last = steady(samples, warmup_s)
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
