"""The job queue's own cost, SQLite against PostgreSQL.

    python -m eval.bench.queue --postgres-url postgresql://postgres@127.0.0.1:5432/postgres

- throughput: jobs (one short document each) per second from queued to done, for 1 and 2
  workers; a SQLite queue allows one worker, so it has no 2-worker figure;
- claim: how long one `claim()` takes with jobs waiting;
- pick-up: from a job's commit to an idle worker starting it (PostgreSQL's workers wake on
  `NOTIFY`; SQLite's poll every second);
- recovery: from a `kill -9` of the worker holding a job to another worker starting it.

Workers are threads of this process on a tiny random embedder and one embedded store, so the
queue and the store dominate, not the model. On a machine with few cores, two workers share
them: the 2-worker figure shows the queue's overhead and contention, not compute scaling. The
benchmark works in a database of its own, created and dropped; the URL's user needs CREATEDB.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from eval.bench.options import QueueBenchOptions
from eval.random_models import save_tiny_model
from indexing import Indexer, Worker
from ragrank.backends.serving import load_inference
from ragrank.documents import Document
from ragrank.jobs.postgres import PostgresJobQueue
from ragrank.jobs.sqlite import SqliteJobQueue
from ragrank.options import parse_options
from ragrank.settings import Settings
from ragrank.store import open_store

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

    from ragrank.jobs import Job, JobQueue
    from ragrank.protocols import TextEmbedder as Embedder

# The victim of the recovery run: claims the one job, renews its lease, never finishes.
_VICTIM = """
import sys, time
from ragrank.jobs.postgres import PostgresJobQueue
queue = PostgresJobQueue(sys.argv[1], lease_s=float(sys.argv[2]))
while queue.claim() is None:
    time.sleep(0.05)
print("claimed", flush=True)
while True:
    time.sleep(float(sys.argv[2]) / 3)
    queue.renew(sys.argv[3])
"""


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_options(
        QueueBenchOptions, argv, prog="python -m eval.bench.queue", description=__doc__
    )
    admin = args.postgres_url or Settings.from_env().jobs_url
    if not admin:
        print("eval.bench.queue: give --postgres-url or set RAGRANK_JOBS_URL", file=sys.stderr)
        return 2
    with (
        ExitStack() as stack,
        tempfile.TemporaryDirectory() as tmp,
        bench_database(admin) as url,
    ):
        folder = Path(tmp)
        model = save_tiny_model("embedder", folder / "tiny-multilingual-e5")
        settings = Settings(embed_model=str(model), device="cpu", collection="bench")
        inference = load_inference(settings, rerankers=False)
        stack.enter_context(inference.running())
        embedder = inference.bulk_embedder()
        engines: dict[str, Callable[[], JobQueue]] = {
            "sqlite": lambda: SqliteJobQueue(folder / "jobs.sqlite3"),
            "postgres": lambda: PostgresJobQueue(url),
        }
        figures: dict[str, Any] = {"jobs": args.jobs}
        for name, make in engines.items():
            run = Run(settings, embedder, folder / name, make, url if name == "postgres" else "")
            figures[name] = {
                "jobs_per_s_1_worker": round(run.throughput(args.jobs, 1), 1),
                "jobs_per_s_2_workers": (
                    round(run.throughput(args.jobs, 2), 1) if name == "postgres" else None
                ),
                "claim_ms": run.claim_ms(args.jobs),
                "pickup_ms": run.pickup_ms(args.pickups),
            }
        figures["postgres"]["recovery"] = recovery(url, settings, embedder, folder, args.lease)
    print(json.dumps(figures, indent=2))
    if args.out:
        args.out.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


@contextmanager
def bench_database(admin: str) -> Iterator[str]:
    import psycopg

    name = f"ragrank_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin, autocommit=True) as db:
        db.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlunsplit(urlsplit(admin)._replace(path=f"/{name}"))
    finally:
        with psycopg.connect(admin, autocommit=True) as db:
            db.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


@dataclass
class Run:
    """One engine's runs, each on an empty queue and a fresh store."""

    settings: Settings
    embedder: Embedder
    folder: Path
    make: Callable[[], JobQueue]
    #: The benchmark's database, for a PostgreSQL engine; empty for SQLite.
    url: str
    runs: int = 0

    def throughput(self, jobs: int, workers: int) -> float:
        with self._fresh() as (queue, store):
            for i in range(jobs):
                queue.add_upsert([_document(i)])
            with _workers(self.settings, self.embedder, store, self.make, workers):
                began = time.perf_counter()
                while queue.states()["done"] < jobs:
                    time.sleep(0.005)
                return jobs / (time.perf_counter() - began)

    def claim_ms(self, jobs: int) -> dict[str, float]:
        with self._fresh() as (queue, _):
            for i in range(jobs):
                queue.add_upsert([_document(i)])
            times = []
            while True:
                began = time.perf_counter()
                job = queue.claim()
                times.append((time.perf_counter() - began) * 1000)
                if job is None:
                    break
                queue.finish(job.id, {"new": 1}, [])
        return _summary(times[:-1])

    def pickup_ms(self, jobs: int) -> dict[str, float]:
        with (
            self._fresh() as (queue, store),
            _workers(self.settings, self.embedder, store, self.make, 1) as started,
        ):
            added: dict[str, float] = {}
            for i in range(jobs):
                time.sleep(0.3)  # the worker is idle, waiting
                added[queue.add_upsert([_document(i)])] = time.perf_counter()
            while len(started) < jobs:
                time.sleep(0.01)
        return _summary([(started[job_id] - added[job_id]) * 1000 for job_id in added])

    @contextmanager
    def _fresh(self) -> Iterator[tuple[JobQueue, Any]]:
        self.runs += 1
        if self.url:
            import psycopg

            with psycopg.connect(self.url, autocommit=True) as db:
                db.execute("DROP TABLE IF EXISTS ragrank_jobs, ragrank_schema")
        else:
            for file in self.folder.parent.glob("jobs.sqlite3*"):
                file.unlink()
        store = open_store(self.settings.replace(qdrant_path=self.folder / f"q{self.runs}"))
        store.ensure_collection(self.embedder.dimension)
        queue = self.make()
        try:
            yield queue, store
        finally:
            queue.close()
            store.close()


@contextmanager
def _workers(
    settings: Settings,
    embedder: Embedder,
    store: Any,
    make: Callable[[], JobQueue],
    count: int,
) -> Iterator[dict[str, float]]:
    """`count` workers on threads, each on its own queue connection; yields when each job
    started (perf_counter), by id."""
    started: dict[str, float] = {}

    class Timed(Worker):
        def run_job(self, job: Job) -> bool:
            started.setdefault(job.id, time.perf_counter())
            return super().run_job(job)

    stop = threading.Event()
    queues = [make() for _ in range(count)]
    threads = [
        threading.Thread(
            target=Timed(Indexer.from_settings(settings, embedder, store), queue).run,
            args=(stop,),
        )
        for queue in queues
    ]
    for thread in threads:
        thread.start()
    try:
        yield started
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        for queue in queues:
            queue.close()


def recovery(
    url: str, settings: Settings, embedder: Embedder, folder: Path, lease_s: float
) -> dict[str, float]:
    """kill -9 a process that holds a job under `lease_s`, with a worker idle beside it."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as db:
        db.execute("DROP TABLE IF EXISTS ragrank_jobs, ragrank_schema")
    queue = PostgresJobQueue(url, lease_s=lease_s)
    job_id = queue.add_upsert([_document(0)])
    victim = subprocess.Popen(
        [sys.executable, "-c", _VICTIM, url, str(lease_s), job_id],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert victim.stdout is not None
    victim.stdout.readline()  # "claimed"
    store = open_store(settings.replace(qdrant_path=folder / "recovery"))
    store.ensure_collection(embedder.dimension)
    make = lambda: PostgresJobQueue(url, lease_s=lease_s)  # noqa: E731
    try:
        with _workers(settings, embedder, store, make, 1) as started:
            time.sleep(lease_s)  # the victim renews meanwhile: nothing is taken over
            assert job_id not in started, "taken over while its worker lived"
            victim.kill()
            killed = time.perf_counter()
            while job_id not in started:
                time.sleep(0.01)
            taken_over_s = started[job_id] - killed
    finally:
        victim.kill()
        victim.wait()
        store.close()
        queue.close()
    return {"lease_s": lease_s, "taken_over_after_s": round(taken_over_s, 2)}


def _document(i: int) -> Document:
    return Document(doc_id=f"d{i}", text=f"document {i}: a short text about item {i} and more")


def _summary(times_ms: list[float]) -> dict[str, float]:
    ordered = sorted(times_ms)
    return {
        "p50": round(statistics.median(ordered), 2),
        "p99": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 2),
        "n": len(ordered),
    }


if __name__ == "__main__":
    raise SystemExit(main())
