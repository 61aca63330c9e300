"""Request and response bodies. A field bounded by a request limit declares it
(`length_limit`, `value_limit`): its type holds the ceiling, and the configured value is checked
on top and written into the served OpenAPI schema (`server/limits.py`, `server/openapi.py`)."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from litestar.openapi import ResponseSpec
from msgspec import Meta, Struct

from ragrank.ids import DOC_ID_PATTERN, DOC_ID_RULE, MAX_DOC_ID_CHARS
from server.limits import length_limit, value_limit

#: The most RRF's `k` may be set to: far past the point where it changes any order.
MAX_RRF_K = 100_000

MAX_TITLE_CHARS = 2_000
#: A query must hold some non-whitespace text (a JSON Schema pattern is a search, not a match).
#: The whitespace is spelled out, not `\S`: Python's and JavaScript's `\s` differ (\x1c-\x1f,
#: \x85, \ufeff), and both the server and clients must read the pattern the same way.
NON_BLANK = (
    r"[^\t\n\x0b\x0c\r \x1c-\x1f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]"
)
MAX_FILTER_KEYS = 16

#: The `model` clients must send (a vendor's model name, a LiteLLM alias). A server serves one
#: embedder and one reranker, so the name is read and ignored; answers name the model served.
ModelName = (
    Annotated[
        str,
        Meta(
            max_length=256,
            description="Accepted for client compatibility and ignored: the server always "
            "uses its configured model, which answers that carry a `model` name.",
        ),
    ]
    | None
)

MetadataKey = Annotated[str, Meta(min_length=1, max_length=128)]
#: Filter keys become Qdrant payload paths (`metadata.<key>`), which take plain names only.
FilterKey = Annotated[
    str, Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_][A-Za-z0-9_-]*$")
]
FilterValue = str | int | float | bool


class SearchRequest(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Retrieve `candidates` chunks (dense, BM25, or both fused), rerank them, return
    `top_k`."""

    query: Annotated[
        str,
        length_limit(
            "max_query_chars", min_length=1, pattern=NON_BLANK, description="The search text."
        ),
    ]
    top_k: Annotated[int, value_limit("max_top_k", ge=1, description="Results to return.")] = 10
    candidates: Annotated[
        int,
        value_limit(
            "max_candidates",
            ge=1,
            description="Chunks the first stage retrieves before reranking (raised to `top_k` "
            "if below).",
        ),
    ] = 50
    rerank: Annotated[
        bool | Literal["auto"],
        Meta(
            description="Rerank with the cross-encoder; false returns the first stage's "
            "order; `auto` reranks when the reranker can and otherwise returns the first "
            "stage's order with `rerank_error` saying why."
        ),
    ] = True
    retrieval: Annotated[
        Literal["dense", "sparse", "hybrid"] | None,
        Meta(
            description="The first stage: `dense` (cosine of the embeddings), `sparse` (BM25) "
            "or `hybrid` (both, fused by `fusion`, the filter applied to each); absent: the "
            "server's RAGRANK_RETRIEVAL."
        ),
    ] = None
    fusion: Annotated[
        Literal["rrf", "dbsf"] | None,
        Meta(
            description="How `hybrid` merges its two lists: `rrf` (reciprocal rank fusion) or "
            "`dbsf` (distribution-based score fusion); absent: the server's RAGRANK_FUSION."
        ),
    ] = None
    rrf_k: (
        Annotated[
            int,
            Meta(
                ge=1,
                le=MAX_RRF_K,
                description="RRF's k, in `1 / (k + rank)` with ranks from 0: higher flattens "
                "the weight of the top ranks; absent: the server's RAGRANK_RRF_K.",
            ),
        ]
        | None
    ) = None
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
    dense_weight: (
        Annotated[
            float,
            Meta(
                ge=0.01,
                le=100,
                description="RRF's weight of the dense list (Qdrant divides a list's 1-based "
                "positions by its weight); absent: the server's RAGRANK_RRF_DENSE_WEIGHT.",
            ),
        ]
        | None
    ) = None
    sparse_weight: (
        Annotated[
            float,
            Meta(
                ge=0.01,
                le=100,
                description="RRF's weight of the BM25 list; below 1 it counts less than the "
                "dense one; absent: the server's RAGRANK_RRF_SPARSE_WEIGHT.",
            ),
        ]
        | None
    ) = None
    model: ModelName = None


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
            "the first stage's score when `rerank` is false."
        ),
    ]
    retrieval_score: Annotated[
        float,
        Meta(
            description="The first stage's score: cosine similarity (`dense`), BM25 "
            "(`sparse`), or the fused score (`hybrid`)."
        ),
    ]
    retrieval_rank: Annotated[
        int,
        Meta(
            description="The chunk's 1-based position in the first stage's order: how far "
            "reranking moved it."
        ),
    ]


class Timings(Struct, frozen=True, kw_only=True):
    """Milliseconds of each stage; a stage the search skipped reads 0."""

    embed: float
    sparse: Annotated[float, Meta(description="Computing the query's BM25 vector.")]
    retrieve: float
    rerank: float
    total: float


class SearchResponse(Struct, frozen=True, kw_only=True):
    results: list[SearchHit]
    reranked: bool
    retrieval: Annotated[str, Meta(description="The first stage this search ran.")]
    timings_ms: Timings
    rerank_error: Annotated[
        str | None,
        Meta(description="With `rerank: auto`, why the results are in the first stage's order."),
    ] = None


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
    detail: Annotated[
        str,
        Meta(description="`error.message` again, where Jina's and FastAPI-style clients read it."),
    ]


def error_responses(*statuses: int) -> dict[int, ResponseSpec]:
    """OpenAPI entries for the error answers a route can give, all `ErrorResponse`."""
    return {
        status: ResponseSpec(data_container=ErrorResponse, description=ERROR_DESCRIPTIONS[status])
        for status in statuses
    }


ERROR_DESCRIPTIONS = {
    400: "The body or a field breaks a limit, a type or an id rule: the error names the field, "
    "the limit and its variable.",
    401: "An API key is configured and the request carries no valid one.",
    403: "The API key is read-only and the route writes.",
    404: "No such job.",
    413: "The body is over the server's size limit, or an input is too large for the device.",
    415: "The body is not sent as `application/json`.",
    429: "The model's queue is full; retry after `Retry-After` seconds.",
    500: "An unexpected failure; the body holds no internals.",
    503: "Qdrant or a model is unavailable.",
    504: "The request waited longer than the server's request timeout.",
}
#: What every route that runs a model can answer besides 200.
MODEL_ERRORS = error_responses(400, 401, 413, 415, 429, 500, 503, 504)


MAX_TOKENS_PER_DOC = 32_768

DocumentText = Annotated[str, length_limit("max_document_chars")]
QueryText = Annotated[
    str,
    length_limit(
        "max_query_chars", min_length=1, pattern=NON_BLANK, description="The search text."
    ),
]


class RerankDocument(Struct, frozen=True, kw_only=True):
    text: DocumentText


CoherePriority = Annotated[
    int | None, Meta(description="Cohere's scheduling priority: accepted and ignored.")
]
#: The most windows `max_chunks_per_doc` may ask for per document.
MAX_CHUNKS_PER_DOC = 256


class RerankRequest(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Cohere's rerank request, v1 and v2, which is also Jina's."""

    query: QueryText
    documents: Annotated[
        list[DocumentText | RerankDocument],
        length_limit("max_rerank_documents", min_length=1),
    ]
    model: ModelName = None
    top_n: Annotated[int, Meta(ge=1)] | None = None
    return_documents: bool = False
    max_chunks_per_doc: (
        Annotated[
            int,
            Meta(
                ge=1,
                le=MAX_CHUNKS_PER_DOC,
                description="Cohere v1: windows of each document that are scored; the "
                "document's score is its best window's.",
            ),
        ]
        | None
    ) = None
    priority: CoherePriority = None
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


class Usage(Struct, frozen=True, kw_only=True):
    """Tokens read, in Jina's and Infinity's words."""

    prompt_tokens: int
    total_tokens: int


class RerankResponse(Struct, frozen=True, kw_only=True):
    """Cohere's answer (`id`, `meta`), with Jina's `model` and `usage` besides."""

    id: str
    results: list[RerankResult]
    meta: RerankMeta
    model: str
    usage: Usage


RerankTexts = Annotated[list[DocumentText], length_limit("max_rerank_documents", min_length=1)]
TruncationDirection = Literal["Left", "Right", "left", "right"] | None


class TeiRerankRequest(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """text-embeddings-inference's rerank request (`texts`), or Infinity's (`documents`): the
    one given picks the answer's shape. Long texts are scored in windows, so `truncate` and
    `truncation_direction` change nothing and are accepted for compatibility."""

    #: The body takes exactly one of these (the handler checks it; the schema says it).
    exactly_one_of: ClassVar[tuple[str, ...]] = ("texts", "documents")

    query: QueryText
    texts: Annotated[RerankTexts, Meta(description="TEI: the texts to rank.")] = []
    documents: Annotated[RerankTexts, Meta(description="Infinity: the texts to rank.")] = []
    raw_scores: bool = False
    return_text: bool = False
    return_documents: Annotated[bool, Meta(description="Infinity: return each text.")] = False
    top_n: Annotated[int, Meta(ge=1, description="Return the best `top_n` only.")] | None = None
    truncate: bool = False
    truncation_direction: TruncationDirection = None
    model: ModelName = None


class TeiRank(Struct, frozen=True, kw_only=True, omit_defaults=True):
    index: int
    score: float
    text: str | None = None


class InfinityRank(Struct, frozen=True, kw_only=True):
    index: int
    relevance_score: float
    document: str | None = None


class InfinityRerankResponse(Struct, frozen=True, kw_only=True):
    """Infinity's rerank answer, to a `/rerank` request that gave `documents`."""

    object: Literal["rerank"] = "rerank"
    id: str
    created: int
    model: str
    results: list[InfinityRank]
    usage: Usage


EmbedText = Annotated[str, length_limit("max_document_chars", min_length=1)]


EmbedTexts = Annotated[list[EmbedText], length_limit("max_embed_inputs", min_length=1)]
Dimensions = (
    Annotated[
        int,
        Meta(
            ge=1,
            description="The vectors' length: only the model's own is served (ragrank "
            "does not shorten vectors).",
            # The served schema gives the embedder's length once the model is loaded.
            extra={"model_dimension": True},
        ),
    ]
    | None
)
#: Jina's tasks, by the e5 prefix each gets: e5 reads symmetric tasks as queries.
JINA_TASKS = {
    "retrieval.query": "query",
    "retrieval.passage": "passage",
    "text-matching": "query",
    "classification": "query",
    "separation": "query",
    "code.query": "query",
    "code.passage": "passage",
}
JinaTask = Literal[
    "retrieval.query",
    "retrieval.passage",
    "text-matching",
    "classification",
    "separation",
    "code.query",
    "code.passage",
]


class EmbeddingsRequest(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """OpenAI's embeddings request, which is also Infinity's and Jina's; `input_type` (or
    Jina's `task`) picks the e5 prefix."""

    input: EmbedText | EmbedTexts
    model: ModelName = None
    encoding_format: Literal["float", "base64"] = "float"
    input_type: Annotated[
        Literal["query", "passage"],
        Meta(description="Which prefix the texts get (`query: ` or `passage: ` for e5)."),
    ] = "passage"
    task: Annotated[
        JinaTask | None,
        Meta(
            description="Jina's task, read as `input_type`: `retrieval.passage` and "
            "`code.passage` are passages, the others queries."
        ),
    ] = None
    dimensions: Dimensions = None
    normalized: Annotated[
        bool,
        Meta(
            description="Jina: vectors are always unit length; `false` is refused.",
            extra={"only": True},
        ),
    ] = True
    embedding_type: Annotated[
        Literal["float", "base64"] | None, Meta(description="Jina's `encoding_format`.")
    ] = None
    late_chunking: Annotated[
        bool, Meta(description="Jina: not served; only `false` is accepted.", extra={"only": False})
    ] = False
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


class TeiEmbedRequest(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """text-embeddings-inference's embed request (also what Hugging Face's client sends to a
    TEI URL). Its clients do not say which texts are queries: `prompt_name` does."""

    inputs: EmbedText | EmbedTexts
    normalize: Annotated[bool, Meta(description="Accepted; vectors are always unit length.")] = True
    truncate: bool | None = None
    truncation_direction: TruncationDirection = None
    prompt_name: Annotated[
        Literal["query", "passage", "document"] | None,
        Meta(description="`query` gives the query prefix; absent or the others, the passage one."),
    ] = None
    dimensions: Dimensions = None
    model: ModelName = None


class CohereEmbedRequest(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Cohere's embed request, v1 and v2: texts only (no images)."""

    texts: EmbedTexts
    model: ModelName = None
    input_type: Annotated[
        Literal["search_query", "search_document", "classification", "clustering"] | None,
        Meta(
            description="`search_document` (and absent) embeds passages; the others queries, "
            "as e5 reads symmetric tasks."
        ),
    ] = None
    embedding_types: (
        Annotated[
            list[Literal["float"]],
            Meta(min_length=1, max_length=1, description="Only `float` vectors are served."),
        ]
        | None
    ) = None
    truncate: Annotated[
        Literal["NONE", "START", "END"] | None,
        Meta(description="Accepted; a text past the model's window is cut at its end."),
    ] = None
    output_dimension: Dimensions = None
    max_tokens: Annotated[
        int | None, Meta(description="Accepted and ignored: the model's window applies.")
    ] = None
    priority: CoherePriority = None


class CohereBilledUnits(Struct, frozen=True, kw_only=True):
    input_tokens: int


class CohereEmbedMeta(Struct, frozen=True, kw_only=True):
    api_version: ApiVersion
    billed_units: CohereBilledUnits


class CohereFloats(Struct, frozen=True, kw_only=True, rename={"float_": "float"}):
    float_: list[list[float]]


class CohereEmbedResponse(Struct, frozen=True, kw_only=True):
    """Cohere's embed answer: `embeddings` by type (v2, or v1 asked for types), else the
    floats themselves (v1)."""

    response_type: Literal["embeddings_floats", "embeddings_by_type"]
    id: str
    embeddings: list[list[float]] | CohereFloats
    texts: list[str]
    meta: CohereEmbedMeta


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
    kind: Literal["upsert", "delete"]
    state: Literal["queued", "running", "done", "failed"]
    documents: int
    counts: dict[str, int]
    errors: list[JobError]
    created_at: float
    updated_at: float
