"""Document and job handlers: writes become jobs in the durable queue (`ragrank/jobs/`),
answered at once with a job id; the indexing worker runs them (see indexing/worker.py). Ids in
paths follow the same rules as ids in bodies (`ragrank/ids.py`)."""

from __future__ import annotations

from typing import Annotated, Any
from urllib.parse import unquote_to_bytes

from litestar import Request, delete, get, post
from litestar.exceptions import NotFoundException
from litestar.params import Parameter
from litestar.status_codes import HTTP_202_ACCEPTED
from msgspec import Meta, Struct

from ragrank.documents import Document
from ragrank.errors import InvalidRequestError
from ragrank.ids import (
    DOC_ID_PATTERN,
    DOC_ID_RULE,
    JOB_ID_PATTERN,
    JOB_ID_RULE,
    MAX_DOC_ID_CHARS,
    doc_id_problem,
    is_job_id,
)
from ragrank.jobs import JobKind, JobQueue, JobState
from server.auth import WRITES
from server.limits import length_limit
from server.routes.shared import domain, error_responses

MAX_TITLE_CHARS = 2_000
MetadataKey = Annotated[str, Meta(min_length=1, max_length=128)]


class DocumentIn(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    id: Annotated[
        str,
        Meta(
            min_length=1,
            max_length=MAX_DOC_ID_CHARS,
            pattern=DOC_ID_PATTERN,
            description=f"The document's id: {DOC_ID_RULE}; an existing one is replaced.",
        ),
    ]
    text: Annotated[str, length_limit("max_ingest_document_chars")]
    title: Annotated[str, Meta(max_length=MAX_TITLE_CHARS)] = ""
    metadata: Annotated[dict[MetadataKey, Any], Meta(max_length=64)] = {}


class DocumentsRequest(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Documents to index (or replace, by `id`), as one job."""

    documents: Annotated[list[DocumentIn], length_limit("max_ingest_documents", min_length=1)]


class JobAccepted(Struct, frozen=True, kw_only=True):
    job_id: str
    state: str


class JobError(Struct, frozen=True, kw_only=True):
    doc_id: str
    error: str


class JobStatus(Struct, frozen=True, kw_only=True):
    job_id: str
    kind: JobKind
    state: JobState
    documents: int
    counts: dict[str, int]
    errors: list[JobError]
    created_at: float
    updated_at: float
    #: Workers that took the job: above 1 after Qdrant was unreachable or a worker was lost.
    attempts: int = 0


DOCUMENTS_PATH = "/v1/documents"

#: The id as the OpenAPI schema shows it. The route takes the rest of the path, `/` included,
#: and reads it from the raw path: Litestar's own value is normalised (`a//b` reads `/a/b`).
DocIdParameter = Annotated[
    str,
    Parameter(
        description=f"The document's id, percent-encoded: {DOC_ID_RULE}; `/` may stay as is.",
        schema_extra={"maxLength": MAX_DOC_ID_CHARS, "minLength": 1, "pattern": DOC_ID_PATTERN},
    ),
]
JobIdParameter = Annotated[
    str,
    Parameter(
        description=f"The job's id: {JOB_ID_RULE}.",
        schema_extra={"pattern": JOB_ID_PATTERN, "minLength": 32, "maxLength": 32},
    ),
]


@post(
    DOCUMENTS_PATH,
    status_code=HTTP_202_ACCEPTED,
    sync_to_thread=True,
    opt={WRITES: True},
    responses=error_responses(403, 413, 415),
)
def add_documents(data: DocumentsRequest, jobs: JobQueue) -> JobAccepted:
    """Queue documents for indexing; a document with an existing `id` replaces it."""
    documents = [
        Document(doc_id=d.id, text=d.text, title=d.title, metadata=d.metadata)
        for d in data.documents
    ]
    return JobAccepted(job_id=jobs.add_upsert(documents), state="queued")


@delete(
    f"{DOCUMENTS_PATH}/{{doc_id:path}}",
    status_code=HTTP_202_ACCEPTED,
    sync_to_thread=True,
    opt={WRITES: True},
    responses=error_responses(403),
)
def delete_document(
    doc_id: DocIdParameter, jobs: JobQueue, request: Request[Any, Any, Any]
) -> JobAccepted:
    """Queue the deletion of a document and all its chunks."""
    del doc_id  # Litestar's value is normalised; the id is read from the raw path
    return JobAccepted(job_id=jobs.add_delete(_doc_id_in_path(request)), state="queued")


def _doc_id_in_path(request: Request[Any, Any, Any]) -> str:
    """The id after `/v1/documents/` in the raw path, percent-decoded, under the id rule."""
    raw: bytes = request.scope.get("raw_path") or request.scope["path"].encode()
    encoded = raw.rsplit(f"{DOCUMENTS_PATH}/".encode(), 1)[-1]
    try:
        doc_id = unquote_to_bytes(encoded).decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidRequestError(
            "doc_id: the id's percent-encoding is not UTF-8", field="doc_id"
        ) from None
    problem = doc_id_problem(doc_id)
    if problem:
        raise InvalidRequestError(f"doc_id: {problem}", field="doc_id")
    return doc_id


@get("/v1/jobs/{job_id:str}", sync_to_thread=True, responses=error_responses(404))
def job_status(job_id: JobIdParameter, jobs: JobQueue) -> JobStatus:
    if not is_job_id(job_id):
        raise InvalidRequestError(f"job_id: a job id is {JOB_ID_RULE}", field="job_id")
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
        attempts=job.attempts,
    )


router = domain(
    add_documents, delete_document, job_status, responses=error_responses(400, 401, 500, 503)
)
