"""One soak run: start the server, drive it, kill and restart it, sample it, judge it."""

from __future__ import annotations

import asyncio
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
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
    tiny_models,
)
from eval.bench.options import SoakOptions
from eval.bench.soak.checks import growth, jobs_done, latency, no_5xx, replay
from eval.bench.soak.plot import plot
from eval.bench.soak.probes import folder_mb, process_sample, scrape
from eval.bench.soak.traffic import Soak, client, drain
from ragrank import SAMPLE_DATASET
from ragrank.beir import load_beir
from ragrank.options import parse_options

if TYPE_CHECKING:
    from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_options(SoakOptions, argv, prog="python -m eval.bench.soak", description=__doc__)
    seed = args.seed if args.seed is not None else int(time.time())
    rng = random.Random(seed)
    work = Path(tempfile.mkdtemp(prefix="ragrank-soak-"))
    if args.tiny:
        tiny = tiny_models(work / "models")
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
            finished = drain(soak)
        break
    report = _report(run, argv, seed, finished, env)
    out = args.out or Path("eval-results") / f"soak-{datetime.now():%Y%m%d-%H%M%S}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    plot(run.samples, out.with_suffix(".png"))
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


def _report(
    run: Run, argv: Sequence[str] | None, seed: int, finished: dict[str, str], env: dict[str, str]
) -> dict[str, Any]:
    from ragrank.jobs import open_job_queue
    from ragrank.settings import Settings

    soak, samples = run.soak, run.samples
    settings = Settings.from_env(env)
    queue = list(open_job_queue(settings).jobs())
    checks = {
        "no_5xx": no_5xx(soak),
        "every_accepted_job_done": jobs_done(soak, finished, queue),
        "collection_equals_replay": replay(settings, queue, run.work),
        **growth(samples, run.warmup_s),
        **latency(samples, run.warmup_s),
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
