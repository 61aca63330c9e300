"""The job queue's interface, shared by its engines and everything that uses a queue: the
jobs, their kinds and states, and the `JobQueue` protocol. Its own module, so that the engines
import it and never the package that picks between them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, get_args, runtime_checkable

from ragrank.documents import Document

if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping, Sequence
    from contextlib import AbstractContextManager
    from threading import Event


JobKind = Literal["upsert", "delete"]
JobState = Literal["queued", "running", "done", "failed"]
JOB_STATES: tuple[JobState, ...] = get_args(JobState)


@dataclass(frozen=True)
class Job:
    id: str
    kind: JobKind
    state: JobState
    payload: Mapping[str, Any]
    counts: Mapping[str, int] = field(default_factory=dict)
    #: One entry per failed document: {"doc_id": ..., "error": ...}.
    errors: Sequence[Mapping[str, str]] = ()
    created: float = 0.0
    updated: float = 0.0
    #: How many times a worker took the job: more than one after a retry or a lost worker.
    attempts: int = 0

    def documents(self) -> list[Document]:
        return [
            Document(doc_id=d["doc_id"], text=d["text"], title=d["title"], metadata=d["metadata"])
            for d in self.payload.get("documents", [])
        ]


def ended_state(counts: Mapping[str, int], errors: Sequence[Mapping[str, str]]) -> JobState:
    """`done`, or `failed` when nothing of the job succeeded."""
    failed = bool(errors) and not any(v for k, v in counts.items() if k != "failed")
    return "failed" if failed else "done"


def upsert_payload(documents: Sequence[Document]) -> dict[str, Any]:
    return {
        "documents": [
            {"doc_id": d.doc_id, "text": d.text, "title": d.title, "metadata": dict(d.metadata)}
            for d in documents
        ]
    }


@runtime_checkable  # the API's handlers take it by dependency injection, which checks the type
class JobQueue(Protocol):
    """What the API and the worker need of a queue. Every method may raise
    `JobQueueUnavailableError` while the queue's database cannot be reached."""

    #: How long a claim lasts unless renewed; None where a claim never expires (one worker).
    lease_s: float | None

    def describe(self) -> str:
        """Where the jobs are, for logs: a path, or a URL without its password."""
        ...

    def add_upsert(self, documents: Sequence[Document]) -> str: ...

    def add_delete(self, doc_id: str) -> str: ...

    def get(self, job_id: str) -> Job | None: ...

    def jobs(self) -> Iterator[Job]:
        """Every job, in the order they were accepted."""
        ...

    def states(self) -> dict[str, int]:
        """How many jobs are in each state."""
        ...

    def claim(self) -> Job | None:
        """The next job that may run now, marked running for this worker; None when none may
        (a job waits while an earlier one on any of its documents is unfinished)."""
        ...

    def renew(self, job_id: str) -> bool:
        """Extend this worker's claim on a running job; False when the claim was lost."""
        ...

    def finish(
        self, job_id: str, counts: Mapping[str, int], errors: Sequence[Mapping[str, str]]
    ) -> bool:
        """Done, or failed when nothing of it succeeded; False when this worker no longer held
        the job (another worker took it over and its result stands)."""
        ...

    def retry_later(self, job_id: str, delay_s: float) -> None:
        """Put a running job back in the queue, untouched, to run again after `delay_s`."""
        ...

    def as_worker(self, *, embedded_store: bool) -> AbstractContextManager[int]:
        """Run as one of the queue's workers for the block, or refuse with a `JobQueueError`
        saying what to change: entered before the worker opens its store. Yields how many
        interrupted jobs were queued again. Re-entrant within one queue object."""
        ...

    def owns_folder(self, origin: str) -> bool:
        """Whether this worker syncs the watched folder `origin`: one worker at a time does."""
        ...

    def wait_for_work(self, timeout_s: float, stop: Event) -> None:
        """Return when a job may have been added, after `timeout_s`, or once `stop` is set."""
        ...

    def close(self) -> None: ...
