"""Document and job handlers: writes become jobs in the durable queue, answered at once with a
job id; the indexing worker runs them (see indexing/worker.py)."""

from __future__ import annotations

from litestar import delete, get, post
from litestar.exceptions import NotFoundException
from litestar.status_codes import HTTP_202_ACCEPTED

from indexing import JobStore
from ragrank.documents import Document
from server.auth import WRITES
from server.schemas import (
    DocumentsRequest,
    JobAccepted,
    JobError,
    JobStatus,
    error_responses,
)


@post(
    "/v1/documents",
    status_code=HTTP_202_ACCEPTED,
    sync_to_thread=True,
    opt={WRITES: True},
    responses=error_responses(400, 401, 403, 413, 500),
)
def add_documents(data: DocumentsRequest, jobs: JobStore) -> JobAccepted:
    """Queue documents for indexing; a document with an existing `id` replaces it."""
    documents = [
        Document(doc_id=d.id, text=d.text, title=d.title, metadata=d.metadata)
        for d in data.documents
    ]
    return JobAccepted(job_id=jobs.add_upsert(documents), state="queued")


@delete(
    "/v1/documents/{doc_id:str}",
    status_code=HTTP_202_ACCEPTED,
    sync_to_thread=True,
    opt={WRITES: True},
    responses=error_responses(400, 401, 403, 500),
)
def delete_document(doc_id: str, jobs: JobStore) -> JobAccepted:
    """Queue the deletion of a document and all its chunks."""
    return JobAccepted(job_id=jobs.add_delete(doc_id), state="queued")


@get("/v1/jobs/{job_id:str}", sync_to_thread=True, responses=error_responses(400, 401, 404, 500))
def job_status(job_id: str, jobs: JobStore) -> JobStatus:
    job = jobs.get(job_id)
    if job is None:
        raise NotFoundException(f"no job {job_id!r}")
    return JobStatus(
        job_id=job.id,
        kind=job.kind,
        state=job.state,
        documents=len(job.payload.get("documents", [])) if job.kind == "upsert" else 1,
        counts=dict(job.counts),
        errors=[JobError(doc_id=e["doc_id"], error=e["error"]) for e in job.errors],
        created_at=job.created,
        updated_at=job.updated,
    )


DOCUMENT_ROUTES = [add_documents, delete_document, job_status]
