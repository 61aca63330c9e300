"""Worker mode: jobs posted over REST, run by a worker in the same test, durable across
restarts; one bad document fails alone; watched folders stay in sync."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import TYPE_CHECKING

import pytest
from litestar.testing import AsyncTestClient

from cli import stack_app
from indexing import Chunker, Indexer
from indexing.worker import Worker
from ragrank.documents import Document
from ragrank.errors import JobQueueError, StoreError, StoreUnreachableError
from ragrank.jobs.sqlite import SqliteJobQueue
from ragrank.settings import Settings
from server import create_app
from server.services import Services
from tests.fakes import FakeEmbedder, fake_inference, swap_models

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    import numpy as np


class PoisonedEmbedder(FakeEmbedder):
    """Fails on any batch holding the word POISON."""

    def embed_passages(self, texts: Sequence[str]) -> np.ndarray:
        if any("POISON" in text for text in texts):
            raise ValueError("cannot embed POISON")
        return super().embed_passages(texts)


def _worker(services: Services, jobs: SqliteJobQueue, **options: object) -> Worker:
    embedder = services.embedder
    indexer = Indexer(
        embedder, services.store, chunker=Chunker(embedder.token_spans, 50), sparse=services.sparse
    )
    return Worker(indexer, jobs, **options)  # type: ignore[arg-type]


async def _wait_for(client: AsyncTestClient, job_id: str) -> dict[str, object]:
    for _ in range(200):
        body = (await client.get(f"/v1/jobs/{job_id}")).json()
        if body["state"] in ("done", "failed"):
            return body
        await asyncio.sleep(0.05)
    raise AssertionError(f"job {job_id} did not finish: {body}")


async def test_documents_posted_and_deleted_over_rest_reach_the_index(
    fake_services: Services, tmp_path: Path
):
    settings = Settings(jobs_path=tmp_path / "jobs.sqlite3", qdrant_path=tmp_path / "q")
    app = stack_app(settings, fake_services)
    documents = [
        {"id": "rhine", "text": "The Rhine flows into the North Sea.", "metadata": {"lang": "en"}},
        {"id": "tea", "text": "Green tea is brewed at 80 degrees.", "title": "Tea"},
    ]
    async with AsyncTestClient(app=app) as client:
        accepted = await client.post("/v1/documents", json={"documents": documents})
        assert accepted.status_code == 202, accepted.text
        job = await _wait_for(client, accepted.json()["job_id"])
        assert job["state"] == "done" and job["kind"] == "upsert"
        assert job["counts"]["new"] == 2 and job["errors"] == []
        hits = await client.post(
            "/v1/search", json={"query": "Rhine North Sea", "top_k": 1, "rerank": False}
        )
        assert hits.json()["results"][0]["doc_id"] == "rhine"

        again = await client.post("/v1/documents", json={"documents": documents})
        assert (await _wait_for(client, again.json()["job_id"]))["counts"]["unchanged"] == 2

        deleted = await client.delete("/v1/documents/rhine")
        assert deleted.status_code == 202
        job = await _wait_for(client, deleted.json()["job_id"])
        assert job["counts"] == {"deleted": 1}
        filtered = {"query": "Rhine", "filter": {"doc_id": "rhine"}}
        assert (await client.post("/v1/search", json=filtered)).json()["results"] == []

        missing = await client.get(f"/v1/jobs/{'0' * 32}")
        assert missing.status_code == 404
        malformed = await client.get("/v1/jobs/nope")
        assert malformed.status_code == 400 and malformed.json()["error"]["field"] == "job_id"


async def test_api_replicas_share_only_qdrant_and_the_job_queue(
    fake_services: Services, tmp_path: Path
):
    """Two API processes as the cluster profile runs them (their own models, the same Qdrant and
    job queue, the indexer apart): any request may go to either and gets the same answer."""
    settings = Settings(jobs_path=tmp_path / "jobs.sqlite3", qdrant_path=tmp_path / "q")
    replicas = [
        create_app(
            settings,
            services=Services(
                inference=fake_inference(), store=fake_services.store, sparse=fake_services.sparse
            ),
        )
        for _ in range(2)
    ]
    indexer = _worker(fake_services, SqliteJobQueue(settings.jobs_path), poll_s=0.02)
    stop = threading.Event()
    thread = threading.Thread(target=indexer.run, args=(stop,))
    thread.start()
    documents = [
        {"id": "rhine", "text": "The Rhine flows into the North Sea."},
        {"id": "tea", "text": "Green tea is brewed at 80 degrees."},
    ]
    try:
        async with AsyncTestClient(app=replicas[0]) as a, AsyncTestClient(app=replicas[1]) as b:
            accepted = await a.post("/v1/documents", json={"documents": documents})
            job = await _wait_for(b, accepted.json()["job_id"])  # asked of the other replica
            assert job["state"] == "done" and job["counts"]["new"] == 2
            query = {"query": "Rhine North Sea", "top_k": 2}
            answers = [(await client.post("/v1/search", json=query)).json() for client in (a, b)]
            assert answers[0]["results"] == answers[1]["results"]
            assert answers[0]["results"][0]["doc_id"] == "rhine"
            deleted = await b.delete("/v1/documents/rhine")
            assert (await _wait_for(a, deleted.json()["job_id"]))["counts"] == {"deleted": 1}
            for client in (a, b):
                hits = (await client.post("/v1/search", json=query)).json()["results"]
                assert [hit["doc_id"] for hit in hits] == ["tea"]
    finally:
        stop.set()
        thread.join()


async def test_document_limits_answer_400_naming_the_field(fake_services, tmp_path: Path):
    settings = Settings(jobs_path=tmp_path / "jobs.sqlite3")
    too_many = [{"id": f"d{i}", "text": "x"} for i in range(1_001)]
    async with AsyncTestClient(app=create_app(settings, services=fake_services)) as client:
        response = await client.post("/v1/documents", json={"documents": too_many})
        assert response.status_code == 400
        error = response.json()["error"]
        assert error["field"] == "documents"
        assert "at most 1,000 items, got 1,001 (RAGRANK_MAX_INGEST_DOCUMENTS)" in error["message"]
        long_text = {"documents": [{"id": "a", "text": "x" * 1_000_001}]}
        response = await client.post("/v1/documents", json=long_text)
        assert response.json()["error"]["field"] == "documents[0].text"
        response = await client.post("/v1/documents", json={"documents": [{"id": "", "text": ""}]})
        assert response.status_code == 400
        assert "id" in response.json()["error"]["field"]


def test_a_job_waits_for_an_unreachable_qdrant_and_is_never_done_before_it_lands(
    fake_services: Services, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    store = fake_services.store
    upsert, outages = store.upsert, [2]

    def flaky_upsert(*args: object, **kwargs: object) -> None:
        if outages[0]:
            outages[0] -= 1
            raise StoreUnreachableError("Qdrant call upsert failed: connection refused")
        upsert(*args, **kwargs)

    monkeypatch.setattr(store, "upsert", flaky_upsert)
    jobs = SqliteJobQueue(tmp_path / "jobs.sqlite3")
    worker = _worker(fake_services, jobs, retry_initial_s=0.05, retry_max_s=0.08)
    job_id = jobs.add_upsert([Document(doc_id=f"d{i}", text=f"text {i}") for i in range(2)])
    pauses = []
    for _ in range(2):  # two outages: the job goes back to the queue each time
        assert worker.run_once()
        assert jobs.get(job_id).state == "queued"  # type: ignore[union-attr]
        pauses.append(worker._retry_s)
        assert not worker.run_once()  # paused: nothing claimed
        time.sleep(worker._retry_s + 0.01)
    assert pauses == [0.05, 0.08]  # doubled, up to the cap
    assert worker.run_once()
    job = jobs.get(job_id)
    assert job is not None and job.state == "done" and job.counts["new"] == 2
    assert store.count() > 0 and worker._retry_s == 0.0


def test_a_refusal_by_qdrant_is_not_retried_but_fails_the_document(
    fake_services: Services, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    def refuse(*args: object, **kwargs: object) -> None:
        raise StoreError("Qdrant call upsert failed: bad request")

    monkeypatch.setattr(fake_services.store, "upsert", refuse)
    jobs = SqliteJobQueue(tmp_path / "jobs.sqlite3")
    job_id = jobs.add_upsert([Document(doc_id="d", text="text")])
    assert _worker(fake_services, jobs).run_once()
    job = jobs.get(job_id)
    assert job is not None and job.state == "failed" and "bad request" in job.errors[0]["error"]


def test_one_bad_document_fails_alone_with_its_error(fake_services: Services, tmp_path: Path):
    jobs = SqliteJobQueue(tmp_path / "jobs.sqlite3")
    services = swap_models(fake_services, embedders=[PoisonedEmbedder()])
    batch = [
        Document(doc_id="good1", text="fine words"),
        Document(doc_id="bad", text="this is POISON"),
        Document(doc_id="good2", text="more fine words"),
    ]
    job_id = jobs.add_upsert(batch)
    assert _worker(services, jobs).run_once()
    job = jobs.get(job_id)
    assert job is not None and job.state == "done"
    assert job.counts["new"] == 2 and job.counts["failed"] == 1
    assert list(job.errors) == [{"doc_id": "bad", "error": "ValueError: cannot embed POISON"}]
    stored = fake_services.store.stored_documents(["good1", "bad", "good2"])
    assert set(stored) == {"good1", "good2"}


def test_jobs_survive_a_restart_and_interrupted_ones_run_again(
    fake_services: Services, tmp_path: Path
):
    path = tmp_path / "jobs.sqlite3"
    first = SqliteJobQueue(path)
    job_id = first.add_upsert([Document(doc_id="a", text="alpha beta")])
    claimed = first.claim()  # a worker takes it, then dies
    assert claimed is not None and claimed.id == job_id
    assert first.claim() is None

    restarted = SqliteJobQueue(path)  # a new process
    assert restarted.get(job_id).state == "running"  # type: ignore[union-attr]
    worker = _worker(fake_services, restarted, poll_s=0.01)
    with restarted.as_worker(embedded_store=True) as requeued:
        assert requeued == 1
        worker.run_once()
    job = restarted.get(job_id)
    assert job is not None and job.state == "done" and job.counts["new"] == 1
    assert job.attempts == 2


def test_a_second_worker_on_a_sqlite_queue_is_refused_naming_the_shared_queue(tmp_path: Path):
    """Two workers on one file would each requeue what the other runs."""
    path = tmp_path / "jobs.sqlite3"
    with (
        SqliteJobQueue(path).as_worker(embedded_store=False),
        pytest.raises(JobQueueError, match="RAGRANK_JOBS_URL"),
        SqliteJobQueue(path).as_worker(embedded_store=False),
    ):
        pass
    with SqliteJobQueue(path).as_worker(embedded_store=False) as requeued:  # free again
        assert requeued == 0


def test_watched_folders_are_synced_with_delete_missing(fake_services: Services, tmp_path: Path):
    folder = tmp_path / "watched"
    folder.mkdir()
    (folder / "a.md").write_text("# A\n\nalpha", encoding="utf-8")
    (folder / "b.html").write_text("<p>beta</p>", encoding="utf-8")
    jobs = SqliteJobQueue(tmp_path / "jobs.sqlite3")
    worker = _worker(fake_services, jobs, watch=[folder], watch_interval_s=0)
    assert worker.run_once()
    assert set(fake_services.store.documents_from(str(folder.resolve()))) == {"a.md", "b.html"}
    (folder / "a.md").unlink()
    worker.run_once()
    assert set(fake_services.store.documents_from(str(folder.resolve()))) == {"b.html"}


async def test_searches_answer_while_the_in_process_worker_writes(
    fake_services: Services, tmp_path: Path
):
    """The API's in-process worker and its searches share the embedded shard: every search
    during a job answers 200, and the job's points are all there once it is done."""
    settings = Settings(jobs_path=tmp_path / "jobs.sqlite3", qdrant_path=tmp_path / "q")
    app = stack_app(settings, fake_services)
    documents = [
        {"id": f"doc-{i}", "text": f"Passage {i} about rivers, tea and mountains."}
        for i in range(300)
    ]
    async with AsyncTestClient(app=app) as client:
        accepted = await client.post("/v1/documents", json={"documents": documents})
        job_id = accepted.json()["job_id"]
        statuses: list[int] = []
        while (await client.get(f"/v1/jobs/{job_id}")).json()["state"] in ("queued", "running"):
            answer = await client.post("/v1/search", json={"query": "rivers", "rerank": False})
            statuses.append(answer.status_code)
        job = await _wait_for(client, job_id)
    assert job["state"] == "done" and job["counts"]["new"] == 300
    assert statuses and set(statuses) == {200}
    assert fake_services.store.count() == 300
