"""Request and response bodies. Limits live in the types, so the OpenAPI schema shows them."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

MAX_QUERY_CHARS = 2_000
MAX_TOP_K = 100
MAX_CANDIDATES = 500
MAX_FILTER_KEYS = 16

FilterKey = Annotated[str, Meta(min_length=1, max_length=128)]
FilterValue = str | int | float | bool


class SearchRequest(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Embed `query`, retrieve `candidates` chunks by cosine, rerank them, return `top_k`."""

    query: Annotated[
        str,
        Meta(min_length=1, max_length=MAX_QUERY_CHARS, description="The search text."),
    ]
    top_k: Annotated[
        int, Meta(ge=1, le=MAX_TOP_K, description="Results to return; at most `candidates`.")
    ] = 10
    candidates: Annotated[
        int,
        Meta(ge=1, le=MAX_CANDIDATES, description="Chunks retrieved by cosine before reranking."),
    ] = 50
    rerank: Annotated[
        bool, Meta(description="Rerank with the cross-encoder; false returns cosine order.")
    ] = True
    filter: (
        Annotated[
            dict[FilterKey, FilterValue],
            Meta(
                max_length=MAX_FILTER_KEYS,
                description="Equality on `doc_id` or on metadata keys; all must match.",
            ),
        ]
        | None
    ) = None


class SearchHit(Struct, frozen=True, kw_only=True):
    rank: int
    doc_id: str
    chunk: int
    text: str
    title: str
    metadata: dict[str, Any]
    score: Annotated[
        float,
        Meta(
            description="Reranker relevance in [0, 1] (sigmoid of its logit); "
            "the cosine similarity when `rerank` is false."
        ),
    ]
    retrieval_score: Annotated[float, Meta(description="Cosine similarity to the query.")]


class Timings(Struct, frozen=True, kw_only=True):
    embed: float
    retrieve: float
    rerank: float
    total: float


class SearchResponse(Struct, frozen=True, kw_only=True):
    results: list[SearchHit]
    reranked: bool
    timings_ms: Timings


class Health(Struct, frozen=True, kw_only=True):
    status: str


class Readiness(Struct, frozen=True, kw_only=True):
    ready: bool
    store: bool
    models: bool
    embed_model: str
    rerank_model: str
    collection: str


class ErrorDetail(Struct, frozen=True, kw_only=True, omit_defaults=True):
    code: str
    message: str
    field: str | None = None


class ErrorResponse(Struct, frozen=True, kw_only=True):
    error: ErrorDetail


MAX_RERANK_DOCUMENTS = 1_000
MAX_DOCUMENT_CHARS = 100_000
MAX_TOKENS_PER_DOC = 32_768

DocumentText = Annotated[str, Meta(max_length=MAX_DOCUMENT_CHARS)]
QueryText = Annotated[
    str, Meta(min_length=1, max_length=MAX_QUERY_CHARS, description="The search text.")
]


class RerankDocument(Struct, frozen=True, kw_only=True):
    text: DocumentText


class RerankRequest(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Cohere's v2 rerank request. `model` is accepted for client compatibility; the server
    always uses its configured reranker."""

    query: QueryText
    documents: Annotated[
        list[DocumentText | RerankDocument],
        Meta(min_length=1, max_length=MAX_RERANK_DOCUMENTS),
    ]
    model: str | None = None
    top_n: Annotated[int, Meta(ge=1)] | None = None
    return_documents: bool = False
    max_tokens_per_doc: (
        Annotated[
            int,
            Meta(
                ge=1,
                le=MAX_TOKENS_PER_DOC,
                description="Tokens of each document that are scored; longer ones are cut. "
                "Default: 8 model windows.",
            ),
        ]
        | None
    ) = None
    raw_scores: Annotated[
        bool, Meta(description="Return the reranker's logits instead of sigmoid relevance.")
    ] = False


class RerankResult(Struct, frozen=True, kw_only=True, omit_defaults=True):
    index: int
    relevance_score: float
    document: RerankDocument | None = None


class ApiVersion(Struct, frozen=True, kw_only=True):
    version: str = "2"


class BilledUnits(Struct, frozen=True, kw_only=True):
    search_units: int


class TokenUsage(Struct, frozen=True, kw_only=True):
    input_tokens: int


class RerankMeta(Struct, frozen=True, kw_only=True):
    api_version: ApiVersion
    billed_units: BilledUnits
    tokens: TokenUsage


class RerankResponse(Struct, frozen=True, kw_only=True):
    id: str
    results: list[RerankResult]
    meta: RerankMeta


class TeiRerankRequest(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """text-embeddings-inference's rerank request. Long texts are scored in windows, so
    `truncate` changes nothing and is accepted for compatibility."""

    query: QueryText
    texts: Annotated[list[DocumentText], Meta(min_length=1, max_length=MAX_RERANK_DOCUMENTS)]
    raw_scores: bool = False
    return_text: bool = False
    truncate: bool = False
    truncation_direction: str | None = None


class TeiRank(Struct, frozen=True, kw_only=True, omit_defaults=True):
    index: int
    score: float
    text: str | None = None


MAX_EMBED_INPUTS = 2_048

EmbedText = Annotated[str, Meta(min_length=1, max_length=MAX_DOCUMENT_CHARS)]


class EmbeddingsRequest(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """OpenAI's embeddings request, plus `input_type`, which picks the e5 prefix."""

    input: EmbedText | Annotated[list[EmbedText], Meta(min_length=1, max_length=MAX_EMBED_INPUTS)]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    input_type: Annotated[
        Literal["query", "passage"],
        Meta(description="Which prefix the texts get (`query: ` or `passage: ` for e5)."),
    ] = "passage"
    user: str | None = None


class Embedding(Struct, frozen=True, kw_only=True):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: Annotated[
        list[float] | str,
        Meta(description="Floats, or base64 of little-endian float32 when asked for."),
    ]


class EmbeddingsUsage(Struct, frozen=True, kw_only=True):
    prompt_tokens: int
    total_tokens: int


class EmbeddingsResponse(Struct, frozen=True, kw_only=True):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingsUsage


MAX_DOCUMENTS_PER_JOB = 1_000
MAX_DOCUMENT_CHARS = 1_000_000
MAX_DOC_ID_CHARS = 512


class DocumentIn(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    id: Annotated[str, Meta(min_length=1, max_length=MAX_DOC_ID_CHARS)]
    text: Annotated[str, Meta(max_length=MAX_DOCUMENT_CHARS)]
    title: Annotated[str, Meta(max_length=MAX_QUERY_CHARS)] = ""
    metadata: Annotated[dict[FilterKey, Any], Meta(max_length=64)] = {}


class DocumentsRequest(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Documents to index (or replace, by `id`), as one job."""

    documents: Annotated[list[DocumentIn], Meta(min_length=1, max_length=MAX_DOCUMENTS_PER_JOB)]


class JobAccepted(Struct, frozen=True, kw_only=True):
    job_id: str
    state: str


class JobError(Struct, frozen=True, kw_only=True):
    doc_id: str
    error: str


class JobStatus(Struct, frozen=True, kw_only=True):
    job_id: str
    kind: Literal["upsert", "delete"]
    state: Literal["queued", "running", "done", "failed"]
    documents: int
    counts: dict[str, int]
    errors: list[JobError]
    created_at: float
    updated_at: float
