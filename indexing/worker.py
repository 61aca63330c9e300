"""The indexing worker: runs queued jobs (documents posted to or deleted through the API) and
keeps watched folders in sync. Any number run on a shared (PostgreSQL) queue: each renews the
lease on the job in hand, and a worker cut off from the queue waits and reconnects."""

from __future__ import annotations

import logging
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from indexing.pipeline import Indexer, IndexSummary
from indexing.sources import read_documents
from ragrank.errors import JobQueueUnavailableError, StoreUnreachableError

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence
    from pathlib import Path

    from ragrank.documents import Document
    from ragrank.jobs import Job, JobQueue
    from ragrank.protocols import TextEmbedder
    from ragrank.settings import Settings
    from ragrank.store import Store

log = logging.getLogger(__name__)

#: The origin of documents that came through the API (folders use their path).
API_ORIGIN = "api"


@dataclass
class Worker:
    indexer: Indexer
    jobs: JobQueue
    watch: Sequence[Path] = ()
    watch_interval_s: float = 30.0
    poll_s: float = 1.0
    #: While Qdrant is unreachable, jobs wait in the queue; the pause doubles up to the cap.
    retry_initial_s: float = 1.0
    retry_max_s: float = 60.0
    #: Build the store's vector index whenever the queue runs dry after writes (an embedded
    #: store needs ragrank to; a server does it by itself).
    optimize_when_idle: bool = False
    #: The worker shares its process with the API's searches: the build must not stop them
    #: (see `EdgeStore.optimize`).
    alongside_searches: bool = False
    #: The store is an embedded folder: such a worker must be its queue's only one.
    embedded_store: bool = False
    _stop: threading.Event = field(default_factory=threading.Event, init=False)
    _last_sweep: float = field(default=float("-inf"), init=False)
    _wrote: bool = field(default=False, init=False)
    _retry_s: float = field(default=0.0, init=False)
    _paused_until: float = field(default=float("-inf"), init=False)

    @classmethod
    def from_settings(
        cls,
        settings: Settings,
        embedder: TextEmbedder,
        store: Store,
        jobs: JobQueue,
        *,
        optimize_when_idle: bool = False,
        alongside_searches: bool = False,
    ) -> Worker:
        return cls(
            Indexer.from_settings(settings, embedder, store),
            jobs,
            watch=settings.watch_folders,
            watch_interval_s=settings.watch_interval_s,
            optimize_when_idle=optimize_when_idle,
            alongside_searches=alongside_searches,
            embedded_store=settings.uses_embedded_qdrant,
        )

    def run(self, stop: threading.Event) -> None:
        """Work until `stop` is set. While the queue cannot be reached the worker waits,
        doubling the pause up to the cap, and carries on where it was once it can."""
        self._stop = stop
        with self.jobs.as_worker(embedded_store=self.embedded_store):
            while not stop.is_set():
                try:
                    worked = self.run_once()
                except JobQueueUnavailableError as exc:
                    self._back_off(f"{exc}")
                    stop.wait(self._retry_s)
                    continue
                self._wrote = self._wrote or worked
                if not worked:
                    if self.optimize_when_idle and self._wrote:
                        self._wrote = False
                        self._optimize()
                    self._wait()

    def _wait(self) -> None:
        try:
            self.jobs.wait_for_work(self.poll_s, self._stop)
        except JobQueueUnavailableError as exc:
            self._back_off(f"{exc}")
            self._stop.wait(self._retry_s)

    def _back_off(self, why: str) -> None:
        self._retry_s = min(max(self._retry_s * 2, self.retry_initial_s), self.retry_max_s)
        log.warning("worker: %s; retrying in %.0f s", why, self._retry_s)

    def _optimize(self) -> None:
        try:
            self.indexer.store.optimize(while_serving=self.alongside_searches)
        except Exception:  # searches still answer, exactly, from the unindexed points
            log.exception("worker: building the vector index failed")

    def run_once(self) -> bool:
        """Run every queued job, and sweep the watched folders when due. Whether it did
        anything."""
        worked = False
        if time.monotonic() < self._paused_until:
            return False
        while (job := self.jobs.claim()) is not None:
            worked = True
            if not self.run_job(job):
                return worked
        if self.watch and time.monotonic() - self._last_sweep >= self.watch_interval_s:
            self._last_sweep = time.monotonic()
            for folder in self.watch:
                if self.jobs.owns_folder(str(folder.resolve())):
                    self.sweep(folder)
                    worked = True
        return worked

    def sweep(self, folder: Path) -> IndexSummary | None:
        try:
            summary = self.indexer.index(
                read_documents(folder),
                origin=str(folder.resolve()),
                delete_missing=True,
                progress=False,
            )
        except Exception:
            log.exception("worker: syncing %s failed", folder)
            return None
        if summary.new or summary.updated or summary.deleted:
            log.info("worker: %s: %s", folder, summary)
        return summary

    def run_job(self, job: Job) -> bool:
        """Run `job` to its end, or, if Qdrant cannot be reached, put it back in the queue and
        pause the worker (a job is never marked done before its writes landed). Whether it
        ended."""
        try:
            with self._renewing(job):
                if job.kind == "delete":
                    counts, errors = self._delete(str(job.payload["doc_id"]))
                else:
                    counts, errors = self._upsert(job.documents())
        except StoreUnreachableError as exc:
            self._back_off(f"Qdrant unreachable ({exc}); job {job.id} queued again")
            self._paused_until = time.monotonic() + self._retry_s
            self.jobs.retry_later(job.id, self._retry_s)
            return False
        except Exception as exc:  # the job fails; the worker carries on
            log.exception("worker: job %s failed", job.id)
            counts, errors = {}, [{"doc_id": "", "error": f"{type(exc).__name__}: {exc}"}]
        self._retry_s = 0.0
        self._finish(job, counts, errors)
        return True

    def _finish(
        self, job: Job, counts: Mapping[str, int], errors: Sequence[Mapping[str, str]]
    ) -> None:
        """Record the outcome, waiting out a queue that cannot be reached; should the worker
        stop first, the lease runs out and another worker runs the job again (a re-run
        writes the same points)."""
        while True:
            try:
                if not self.jobs.finish(job.id, counts, errors):
                    log.warning("worker: job %s was taken over by another worker", job.id)
                return
            except JobQueueUnavailableError as exc:
                self._back_off(f"{exc}; job {job.id} is done but not yet recorded")
                if self._stop.wait(self._retry_s):
                    return

    @contextmanager
    def _renewing(self, job: Job) -> Iterator[None]:
        """Renew the claim on `job` every third of its lease while the block runs."""
        lease_s = self.jobs.lease_s
        if lease_s is None:
            yield
            return
        done = threading.Event()

        def renew() -> None:
            while not done.wait(lease_s / 3):
                try:
                    if not self.jobs.renew(job.id):
                        log.warning("worker: lost the lease on job %s", job.id)
                        return
                except JobQueueUnavailableError as exc:
                    log.warning("worker: cannot renew the lease on job %s: %s", job.id, exc)

        thread = threading.Thread(target=renew, name=f"ragrank-lease-{job.id[:8]}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join()

    def _upsert(self, documents: list[Document]) -> tuple[dict[str, int], list[Mapping[str, str]]]:
        """Index the batch; if that fails, index its documents one by one so that one bad
        document fails alone, with its error."""
        totals = {"new": 0, "updated": 0, "unchanged": 0, "failed": 0, "chunks": 0}
        errors: list[Mapping[str, str]] = []
        try:
            parts = [self.indexer.index(documents, origin=API_ORIGIN, progress=False)]
        except StoreUnreachableError:
            raise  # not the documents' fault: the whole job waits for Qdrant
        except Exception:
            parts = []
            for document in documents:
                try:
                    parts.append(self.indexer.index([document], origin=API_ORIGIN, progress=False))
                except StoreUnreachableError:
                    raise
                except Exception as exc:
                    totals["failed"] += 1
                    error = f"{type(exc).__name__}: {exc}"
                    errors.append({"doc_id": document.doc_id, "error": error})
        for part in parts:
            for key in ("new", "updated", "unchanged", "chunks"):
                totals[key] += getattr(part, key)
        return totals, errors

    def _delete(self, doc_id: str) -> tuple[dict[str, int], list[Mapping[str, str]]]:
        store = self.indexer.store
        present = doc_id in store.stored_documents([doc_id])
        store.delete_documents([doc_id])
        return {"deleted": int(present)}, []


@contextmanager
def worker_thread(
    settings: Settings, embedder: TextEmbedder, store: Store, jobs: JobQueue
) -> Iterator[Worker]:
    """The worker on a thread of this process, sharing a server's models and store: an embedded
    Qdrant folder can be open in one process only. Stops, and waits for the job in hand, on
    exit."""
    worker = Worker.from_settings(
        settings, embedder, store, jobs, optimize_when_idle=True, alongside_searches=True
    )
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,), name="ragrank-worker")
    # The queue's worker lock is taken here, not on the thread, so that a refused worker stops
    # the server's start-up.
    with jobs.as_worker(embedded_store=worker.embedded_store):
        thread.start()
        try:
            yield worker
        finally:
            stop.set()
            thread.join()
