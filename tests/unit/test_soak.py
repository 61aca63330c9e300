"""The soak run's verdicts, on made-up samples: each check can fail."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from eval.bench.soak import Soak, growth, jobs_done, latency


def _samples(rss: list[float], life: int = 0, latency: float = 10.0) -> list[dict[str, Any]]:
    return [
        {
            "t_s": 10.0 * (i + 100 * life),
            "life": life,
            "rss_mb": value,
            "threads": 40,
            "fds": 30,
            "latencies_ms": {"search": [latency] * 300, "rerank": [latency] * 300},
        }
        for i, value in enumerate(rss)
    ]


def test_memory_that_keeps_growing_fails_and_flat_memory_passes():
    flat = growth(_samples([500.0] * 5 + [400.0] * 100), warmup_s=50)  # warm-up left out
    assert flat["rss_mb_flat"]["ok"] and flat["threads_flat"]["ok"]
    leaking = growth(_samples([400.0 + i for i in range(100)]))
    assert not leaking["rss_mb_flat"]["ok"]
    assert not growth(_samples([400.0] * 5))["rss_mb_flat"]["ok"]  # too short to judge


def test_threads_may_move_by_two_but_not_keep_growing():
    samples = _samples([400.0] * 100)
    for sample in samples[-10:]:
        sample["threads"] = 42  # +5 %, yet two threads: a pool that grew on demand
    assert growth(samples)["threads_flat"]["ok"]
    for i, sample in enumerate(samples):
        sample["fds"] = 30 + i // 10  # one more file every ten samples
    fds = growth(samples)["fds_flat"]
    assert not fds["ok"] and fds["detail"] == {"first_tenth": 30.0, "last_tenth": 39.0}


def test_the_longest_server_life_is_judged_after_a_restart():
    before_kill = _samples([300.0 + 10 * i for i in range(30)], life=0)
    after = _samples([420.0] * 60, life=1)
    assert growth(before_kill + after)["rss_mb_flat"]["ok"]


def test_p99_that_drifts_past_one_and_a_half_times_fails():
    steady = _samples([400.0] * 50, latency=10.0)
    assert latency(steady)["p99_steady"]["ok"]
    for sample in steady[-5:]:
        sample["latencies_ms"]["search"] = [16.0] * 300
    drifted = latency(steady)["p99_steady"]
    assert not drifted["ok"] and drifted["detail"]["search"]["ratio"] == 1.6
    sparse = _samples([400.0] * 50, latency=10.0)
    for sample in sparse:
        sample["latencies_ms"]["job"] = [10.0] * 20
    for sample in sparse[-5:]:
        sample["latencies_ms"]["job"] = [30.0] + [10.0] * 19  # 100 answers: 5 slow ones
    assert latency(sparse)["p99_steady"]["ok"]
    few = steady[:12]
    for sample in few:
        sample["latencies_ms"] = {"search": [10.0] * 3}
    assert not latency(few)["p99_steady"]["ok"]  # too few answers to judge


def test_a_lost_job_or_one_nobody_sent_fails():
    soak = Soak(base="", seed=0, doc_ids=1, passages=[], queries=[])
    soak.accepted = {"a": "ingest", "b": "delete"}
    queue = [SimpleNamespace(id="a"), SimpleNamespace(id="b")]
    done = {"a": "done", "b": "done"}
    assert jobs_done(soak, done, queue)["ok"]
    assert not jobs_done(soak, {"a": "done", "b": "failed"}, queue)["ok"]
    assert not jobs_done(soak, done, queue[:1])["ok"]  # b was accepted, then lost
    extra = [*queue, SimpleNamespace(id="c")]
    assert not jobs_done(soak, done, extra)["ok"]
    soak.unanswered_writes = 1  # a kill cut off one write's answer: c may be it
    assert jobs_done(soak, done, extra)["ok"]
