"""Request and response bodies. Limits live in the types, so the OpenAPI schema shows them."""

from __future__ import annotations

from typing import Annotated, Any

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
