"""The job queue on a real PostgreSQL: claims, leases, per-document order, several workers and
API processes, a killed worker, a restarted database, and the embedded store's one worker.

No Qdrant server runs here, so workers that share a store are threads of this process, each on
its own queue connection; the killed worker is a real process on an embedded store. Each test
has a database of its own; the one that restarts PostgreSQL has a cluster of its own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np
import psycopg
import pytest

from eval.bench.harness import free_port, ragrank_command, server_process
from eval.bench.soak.checks import points
from indexing import Chunker, Indexer, Worker
from ragrank.backends.models import SentenceTransformerEmbedder
from ragrank.documents import Document
from ragrank.errors import JobQueueError
from ragrank.jobs.postgres import PostgresJobQueue
from ragrank.store import open_store
from tests.conftest import tiny_settings
from tests.fakes import FakeEmbedder
from tests.postgres import Postgres, admin_url_or_skip, postgres, private_postgres
from tests.servers import side_by_side

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from pathlib import Path

    from server.services import Services

__all__ = ["postgres", "private_postgres"]  # the fixtures


def _docs(prefix: str, n: int, words: int = 8) -> list[Document]:
    return [
        Document(doc_id=f"{prefix}{i}", text=" ".join(f"w{prefix}{i}x{j}" for j in range(words)))
        for i in range(n)
    ]


def _until(check: Any, within_s: float = 60.0, every_s: float = 0.05) -> Any:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if found := check():
            return found
        time.sleep(every_s)
    raise AssertionError(f"not within {within_s} s: {check}")


# --- the queue itself ---------------------------------------------------------------------------


def test_a_job_waits_for_an_earlier_one_on_the_same_document_whichever_worker_asks(
    postgres: Postgres,
):
    api, one, two = (PostgresJobQueue(postgres.url) for _ in range(3))
    first = api.add_upsert(_docs("a", 2))  # a0, a1
    deleted = api.add_delete("a0")
    other = api.add_upsert(_docs("b", 1))
    taken = one.claim()
    assert taken is not None and taken.id == first
    # The delete of a0 waits for the upsert of a0; the unrelated job does not.
    second = two.claim()
    assert second is not None and second.id == other
    assert two.claim() is None
    assert one.finish(first, {"new": 2}, [])
    third = two.claim()
    assert third is not None and third.id == deleted
    assert api.states() == {"queued": 0, "running": 2, "done": 1, "failed": 0}
    for queue in (api, one, two):
        queue.close()


def test_a_lapsed_lease_is_taken_over_and_the_first_worker_cannot_finish_it(postgres: Postgres):
    api, one, two = (PostgresJobQueue(postgres.url, lease_s=0.4) for _ in range(3))
    job_id = api.add_upsert(_docs("a", 1))
    assert (taken := one.claim()) is not None and taken.id == job_id
    assert two.claim() is None  # held
    assert one.renew(job_id)
    time.sleep(0.6)  # one stops renewing, as a killed worker would
    again = two.claim()
    assert again is not None and again.id == job_id and again.attempts == 2
    assert not one.renew(job_id)
    assert not one.finish(job_id, {"new": 1}, [])  # its result does not count
    assert two.finish(job_id, {"new": 1}, [])
    job = api.get(job_id)
    assert job is not None and job.state == "done" and job.attempts == 2
    for queue in (api, one, two):
        queue.close()


def test_a_job_that_keeps_losing_its_worker_ends_failed_saying_why(postgres: Postgres):
    queues = [PostgresJobQueue(postgres.url, lease_s=0.3, max_lost=1) for _ in range(3)]
    job_id = queues[0].add_upsert(_docs("a", 1))
    assert queues[0].claim() is not None
    time.sleep(0.4)
    assert queues[1].claim() is not None  # the first loss: taken over
    time.sleep(0.4)
    assert queues[2].claim() is None  # the second: not tried again
    job = queues[2].get(job_id)
    assert job is not None and job.state == "failed"
    assert "stopped while running it 2 times" in job.errors[0]["error"]
    for queue in queues:
        queue.close()


def test_concurrent_start_ups_migrate_once_and_a_newer_schema_is_refused(postgres: Postgres):
    queues = [PostgresJobQueue(postgres.url) for _ in range(4)]
    threads = [threading.Thread(target=queue.states) for queue in queues]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with psycopg.connect(postgres.url, autocommit=True) as db:
        versions = [row[0] for row in db.execute("SELECT version FROM ragrank_schema")]
        assert versions == [1]
        db.execute("INSERT INTO ragrank_schema VALUES (99)")
    newer = PostgresJobQueue(postgres.url)
    with pytest.raises(JobQueueError, match="schema version 99"):
        newer.states()
    for queue in [*queues, newer]:
        queue.close()


def test_one_worker_at_a_time_syncs_a_watched_folder_and_another_takes_over(
    fake_services: Services, postgres: Postgres, tmp_path: Path
):
    folder = tmp_path / "watched"
    folder.mkdir()
    (folder / "a.txt").write_text("alpha beta gamma", encoding="utf-8")
    swept: list[str] = []

    class Counting(Worker):
        def sweep(self, watched: Path) -> Any:
            swept.append(self.name)
            return super().sweep(watched)

    indexer = Indexer(
        fake_services.embedder,
        fake_services.store,
        chunker=Chunker(fake_services.embedder.token_spans, 50),
        sparse=fake_services.sparse,
    )
    first, second = PostgresJobQueue(postgres.url), PostgresJobQueue(postgres.url)
    workers = []
    for name, queue in (("first", first), ("second", second)):
        worker = Counting(indexer, queue, watch=[folder], watch_interval_s=0)
        worker.name = name  # type: ignore[attr-defined]
        workers.append(worker)
    with first.as_worker(embedded_store=False), second.as_worker(embedded_store=False):
        for worker in workers:
            worker.run_once()
        assert swept == ["first"]
        first.close()  # the owner stops: its session, and the folder's lock, end
        workers[1].run_once()
        assert swept == ["first", "second"]
    second.close()
    assert fake_services.store.stored_documents(["a.txt"])


# --- workers sharing one queue ------------------------------------------------------------------


class SlowEmbedder(FakeEmbedder):
    """A forward pass that takes a while, so that jobs overlap across workers."""

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        time.sleep(0.01)
        return super().embed_passages(texts)


class Recording:
    """Which worker ran which job, and whether two ever ran one job at once."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running: set[str] = set()
        self.overlaps: list[str] = []
        self.runs: Counter[str] = Counter()
        self.by_worker: Counter[str] = Counter()

    def worker(self, name: str, services: Services, queue: PostgresJobQueue) -> Worker:
        recording = self
        embedder = SlowEmbedder()
        indexer = Indexer(
            embedder,
            services.store,
            chunker=Chunker(embedder.token_spans, 50),
            sparse=services.sparse,
        )

        class RecordedWorker(Worker):
            def run_job(self, job: Any) -> bool:
                with recording.lock:
                    if job.id in recording.running:
                        recording.overlaps.append(job.id)
                    recording.running.add(job.id)
                    recording.runs[job.id] += 1
                    recording.by_worker[name] += 1
                try:
                    return super().run_job(job)
                finally:
                    with recording.lock:
                        recording.running.discard(job.id)

        return RecordedWorker(indexer, queue, poll_s=0.2)


@contextmanager
def _workers(
    services: Services, url: str, names: Sequence[str], recording: Recording
) -> Iterator[threading.Event]:
    stop = threading.Event()
    queues = [PostgresJobQueue(url) for _ in names]
    threads = [
        threading.Thread(target=recording.worker(name, services, queue).run, args=(stop,))
        for name, queue in zip(names, queues, strict=True)
    ]
    for thread in threads:
        thread.start()
    try:
        yield stop
    finally:
        stop.set()
        for thread in threads:
            thread.join(timeout=60)
        for queue in queues:
            queue.close()


def test_two_workers_share_the_jobs_and_never_run_one_twice_at_once(
    fake_services: Services, postgres: Postgres
):
    api = PostgresJobQueue(postgres.url)
    recording = Recording()
    job_ids = [api.add_upsert(_docs(f"j{n}-", 3)) for n in range(40)]
    with _workers(fake_services, postgres.url, ["one", "two"], recording):
        _until(lambda: api.states()["done"] == len(job_ids))
    assert recording.overlaps == []
    assert all(recording.runs[job_id] == 1 for job_id in job_ids)
    assert set(recording.by_worker) == {"one", "two"}  # both took jobs
    assert all(job.attempts == 1 for job in api.jobs())
    stored = fake_services.store.stored_documents(
        [f"j{n}-{i}" for n in range(40) for i in range(3)]
    )
    assert len(stored) == 120
    api.close()


# --- API processes on the shared queue ----------------------------------------------------------


def _api_process(
    settings_env: dict[str, str], folder: Path, name: str
) -> Any:  # a context manager: (base URL, process)
    port = free_port()
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        **settings_env,
        "RAGRANK_QDRANT_PATH": str(folder / f"{name}-qdrant"),
        "RAGRANK_PORT": str(port),
    }
    command = [ragrank_command()[0], "-m", "tests.api_only"]
    return port, server_process(
        command, env, f"http://127.0.0.1:{port}/ready", folder / f"{name}.log", ready_within_s=120
    )


def _tiny_env(tmp_path: Path, embedder: Path, reranker: Path, url: str) -> dict[str, str]:
    settings = tiny_settings(tmp_path, embedder, reranker)
    return {
        "RAGRANK_EMBED_MODEL": settings.embed_model,
        "RAGRANK_RERANK_MODEL": settings.rerank_model,
        "RAGRANK_COLLECTION": settings.collection,
        "RAGRANK_DEVICE": "cpu",
        "RAGRANK_JOBS_URL": url,
        "RAGRANK_JOBS_LEASE_S": "3",
    }


def _wait_done(client: httpx.Client, job_id: str) -> dict[str, Any]:
    def finished() -> dict[str, Any] | None:
        body: dict[str, Any] = client.get(f"/v1/jobs/{job_id}").json()
        return body if body.get("state") in ("done", "failed") else None

    found: dict[str, Any] = _until(finished, every_s=0.1)
    return found


def test_an_upsert_then_a_delete_posted_to_two_api_processes_ends_deleted(
    fake_services: Services,
    postgres: Postgres,
    tmp_path: Path,
    tiny_embedder_path: Path,
    tiny_reranker_path: Path,
):
    env = _tiny_env(tmp_path, tiny_embedder_path, tiny_reranker_path, postgres.url)
    port_a, api_a = _api_process(env, tmp_path, "a")
    port_b, api_b = _api_process(env, tmp_path, "b")
    recording = Recording()
    with (
        side_by_side(api_a, api_b),
        httpx.Client(base_url=f"http://127.0.0.1:{port_a}", timeout=30) as a,
        httpx.Client(base_url=f"http://127.0.0.1:{port_b}", timeout=30) as b,
        _workers(fake_services, postgres.url, ["one", "two"], recording),
    ):
        # A slow upsert holding the document, then its delete to the other process: the
        # idle worker must not run the delete before the upsert ends.
        body = {
            "documents": [{"id": "x", "text": "the one"}]
            + [{"id": d.doc_id, "text": d.text} for d in _docs("fill", 300)]
        }
        upsert = a.post("/v1/documents", json=body)
        assert upsert.status_code == 202, upsert.text
        delete = b.delete("/v1/documents/x")
        assert delete.status_code == 202, delete.text
        # Each process answers for the other's job: one queue.
        upserted = _wait_done(b, upsert.json()["job_id"])
        deleted = _wait_done(a, delete.json()["job_id"])
        # Both processes' gauges count the shared queue's jobs, not their own.
        for client in (a, b):
            assert 'ragrank_jobs{state="done"} 2.0' in client.get("/metrics").text
    assert upserted["state"] == "done" and upserted["counts"]["new"] == 301
    assert deleted["state"] == "done" and deleted["counts"] == {"deleted": 1}
    assert deleted["updated_at"] >= upserted["updated_at"]
    assert "x" not in fake_services.store.stored_documents(["x"])
    assert "fill0" in fake_services.store.stored_documents(["fill0"])


def test_a_postgres_restart_answers_503_meanwhile_and_loses_nothing(
    fake_services: Services,
    private_postgres: Postgres,
    tmp_path: Path,
    tiny_embedder_path: Path,
    tiny_reranker_path: Path,
):
    env = _tiny_env(tmp_path, tiny_embedder_path, tiny_reranker_path, private_postgres.url)
    port, api = _api_process(env, tmp_path, "a")
    recording = Recording()
    accepted: list[str] = []
    with (
        api,
        httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client,
        _workers(fake_services, private_postgres.url, ["one", "two"], recording),
    ):
        for n in range(5):
            answer = client.post(
                "/v1/documents",
                json={
                    "documents": [
                        {"id": d.doc_id, "text": d.text} for d in _docs(f"before{n}-", 20)
                    ]
                },
            )
            assert answer.status_code == 202
            accepted.append(answer.json()["job_id"])
        private_postgres.stop()
        try:
            down = client.post("/v1/documents", json={"documents": [{"id": "z", "text": "z"}]})
            assert down.status_code == 503, down.text
            assert down.json()["error"]["code"] == "job_queue_unavailable"
            assert down.headers["Retry-After"]
            assert client.get(f"/v1/jobs/{accepted[0]}").status_code == 503
            metrics = client.get("/metrics")
            assert metrics.status_code == 200
            assert "ragrank_job_queue_up 0.0" in metrics.text
            time.sleep(1.5)  # the workers meet the outage too
        finally:
            private_postgres.start()

        def accepted_again() -> str | None:
            answer = client.post(
                "/v1/documents",
                json={"documents": [{"id": d.doc_id, "text": d.text} for d in _docs("after", 20)]},
            )
            return answer.json()["job_id"] if answer.status_code == 202 else None

        accepted.append(_until(accepted_again, within_s=30, every_s=0.5))
        jobs = [_wait_done(client, job_id) for job_id in accepted]
    assert [job["state"] for job in jobs] == ["done"] * 6
    names = [d.doc_id for n in range(5) for d in _docs(f"before{n}-", 20)] + [
        d.doc_id for d in _docs("after", 20)
    ]
    assert len(fake_services.store.stored_documents(names)) == 120
    assert recording.overlaps == []


# --- worker processes on an embedded store ------------------------------------------------------


def _worker_process(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as output:
        return subprocess.Popen(
            ragrank_command("worker"),
            env={**os.environ, "HF_HUB_OFFLINE": "1", **env},
            stdout=output,
            stderr=subprocess.STDOUT,
        )


def test_a_killed_worker_s_job_is_taken_over_after_its_lease_and_matches_a_clean_run(
    postgres: Postgres, tmp_path: Path, tiny_embedder_path: Path, tiny_reranker_path: Path
):
    settings = tiny_settings(tmp_path, tiny_embedder_path, tiny_reranker_path)
    env = {
        **_tiny_env(tmp_path, tiny_embedder_path, tiny_reranker_path, postgres.url),
        "RAGRANK_QDRANT_PATH": str(tmp_path / "qdrant"),
        "RAGRANK_CHUNK_TOKENS": "64",
        "RAGRANK_CHUNK_OVERLAP": "8",
        "RAGRANK_INDEX_BATCH_SIZE": "16",
    }
    documents = _docs("d", 600, words=40)
    queue = PostgresJobQueue(postgres.url)
    job_id = queue.add_upsert(documents)
    log = tmp_path / "worker.log"
    first = _worker_process(env, log)
    _until(lambda: (job := queue.get(job_id)) is not None and job.state == "running", 120)
    time.sleep(2.0)  # mid-job: running for a while, far from its end
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=30)
    held = queue.get(job_id)
    assert held is not None and held.state == "running", "the job ended before the kill"
    second = _worker_process(env, log)
    try:
        job = _until(lambda: (j := queue.get(job_id)) is not None and j.state == "done" and j, 300)
    finally:
        second.send_signal(signal.SIGINT)
        second.wait(timeout=60)
    # Taken over: what the first worker wrote is found unchanged, the rest is new.
    assert job.attempts == 2, log.read_text()[-2000:]
    assert job.counts["new"] + job.counts["unchanged"] == 600
    queue.close()

    clean = settings.replace(qdrant_path=tmp_path / "clean")
    embedder = SentenceTransformerEmbedder.from_settings(clean)
    served, fresh = open_store(settings), open_store(clean)
    try:
        fresh.ensure_collection(embedder.dimension)
        Indexer.from_settings(clean, embedder, fresh).index(documents, origin="api", progress=False)
        ours, theirs = points(served), points(fresh)
    finally:
        served.close()
        fresh.close()
    assert set(ours) == set(theirs) and len(ours) >= 600
    assert all(ours[p][0] == theirs[p][0] for p in ours)
    assert all(np.allclose(ours[p][1], theirs[p][1], atol=1e-4) for p in ours)


def test_a_second_worker_on_an_embedded_store_is_refused_naming_the_qdrant_server(
    postgres: Postgres, tmp_path: Path, tiny_embedder_path: Path, tiny_reranker_path: Path
):
    env = _tiny_env(tmp_path, tiny_embedder_path, tiny_reranker_path, postgres.url)
    first = _worker_process(
        {**env, "RAGRANK_QDRANT_PATH": str(tmp_path / "one")}, tmp_path / "one.log"
    )
    try:
        with psycopg.connect(postgres.url, autocommit=True) as db:
            _until(
                lambda: db.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE application_name LIKE 'ragrank worker%'"
                ).fetchone(),
                120,
            )
        second = subprocess.run(
            ragrank_command("worker"),
            env={**os.environ, **env, "RAGRANK_QDRANT_PATH": str(tmp_path / "two")},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert second.returncode == 2
        assert "RAGRANK_QDRANT_URL" in second.stderr and "ragrank worker" in second.stderr
        assert first.poll() is None  # the first carries on
    finally:
        first.send_signal(signal.SIGINT)
        first.wait(timeout=60)


def test_the_queue_benchmark_reports_every_figure(postgres: Postgres, tmp_path: Path):
    from eval.bench import queue as bench

    out = tmp_path / "queue.json"
    admin = admin_url_or_skip()
    assert (
        bench.main(
            [
                "--postgres-url",
                admin,
                "--jobs",
                "20",
                "--pickups",
                "3",
                "--lease",
                "3",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    figures = json.loads(out.read_text())
    for engine in ("sqlite", "postgres"):
        assert figures[engine]["jobs_per_s_1_worker"] > 0
        assert figures[engine]["claim_ms"]["n"] == 20
        assert figures[engine]["pickup_ms"]["n"] == 3
    assert figures["sqlite"]["jobs_per_s_2_workers"] is None
    assert figures["postgres"]["jobs_per_s_2_workers"] > 0
    # Taken over only once the lease ran out: at least two thirds of it after the kill.
    assert figures["postgres"]["recovery"]["taken_over_after_s"] >= 2.0
