"""Search: `POST /v1/search`, retrieval by the first stage then reranking."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from litestar import Request, post
from litestar.status_codes import HTTP_200_OK
from msgspec import Meta, Struct

from ragrank.inference import Cascade
from ragrank.language import known_language, primary_subtag
from ragrank.settings import FusionKind, Retrieval
from server.limits import key_rules, length_limit, value_limit
from server.pipeline import SearchPipeline
from server.routes.shared import (
    MODEL_ERRORS,
    NON_BLANK,
    RerankerName,
    domain,
    unless_disconnected,
)

#: The most RRF's `k` may be set to: far past the point where it changes any order.
MAX_RRF_K = 100_000
MAX_FILTER_KEYS = 16

#: Filter keys become Qdrant payload paths (`metadata.<key>`), which take plain names only.
FilterKey = Annotated[
    str, Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_][A-Za-z0-9_-]*$")
]
FilterValue = str | int | float | bool


class CascadeRequest(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A cascade of two rerankers for one search."""

    model: Annotated[
        str,
        Meta(
            min_length=1,
            max_length=256,
            description="The served reranker that scores every candidate (a fast one).",
            extra={"served_only": "rerank"},
        ),
    ]
    top: Annotated[
        int,
        value_limit(
            "max_candidates",
            ge=1,
            description="How many of its best candidates the request's reranker (`model`, else "
            "the default) rescores.",
        ),
    ]


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
        Retrieval | None,
        Meta(
            description="The first stage: `dense` (cosine of the embeddings), `sparse` (BM25) "
            "or `hybrid` (both, fused by `fusion`, the filter applied to each); absent: the "
            "server's RAGRANK_RETRIEVAL."
        ),
    ] = None
    fusion: Annotated[
        FusionKind | None,
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
                extra=key_rules(doc_id="doc_id"),
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
    language: (
        Annotated[
            str,
            Meta(
                min_length=2,
                max_length=16,
                pattern=r"^[A-Za-z]{2,3}([-_][A-Za-z0-9]{2,8})?$",
                description="The query's language for BM25, an ISO 639-1 code such as `de` "
                "(its stopwords and stemmer when Qdrant's BM25 has them, else its words "
                "unstemmed); absent: identified from the query. Used with "
                "RAGRANK_BM25_LANGUAGE=auto.",
            ),
        ]
        | None
    ) = None
    highlight: Annotated[
        bool,
        Meta(description="List each result's words that the query's BM25 terms matched."),
    ] = False
    model: RerankerName = None
    cascade: Annotated[
        bool | CascadeRequest | None,
        Meta(
            description='Rerank as a cascade: `{"model": NAME, "top": K}` has the served '
            "reranker NAME score every candidate and the request's reranker rescore its top K; "
            "`false` reranks with one model; absent or `true`: the server's RAGRANK_CASCADE."
        ),
    ] = None
    blend: (
        Annotated[
            float,
            Meta(
                ge=0,
                le=1,
                description="The first stage's weight in the reranked order, 0 to 1: each "
                "result ranks by `w/(60 + retrieval_rank) + (1 - w)/(60 + its reranker rank)`; "
                "0 is the reranker's order alone; scores stay the reranker's; in a cascade, "
                "both stages' orders; absent: the server's RAGRANK_RERANK_BLEND.",
            ),
        ]
        | None
    ) = None
    min_score: (
        Annotated[
            float,
            Meta(
                ge=-1e6,
                le=1e6,
                description="Drop results whose `score` is below this (with reranking, an "
                "estimated probability of relevance in [0, 1]).",
            ),
        ]
        | None
    ) = None


class SearchHit(Struct, frozen=True, kw_only=True, omit_defaults=True):
    rank: int
    doc_id: str
    chunk: int
    text: str
    title: str
    metadata: dict[str, Any]
    score: Annotated[
        float,
        Meta(
            description="Reranker relevance in [0, 1]: the probability of relevance that "
            "the model's calibration estimates from its logit (the logit's sigmoid for a model "
            "without one); in a cascade, the score of the model that placed the result; the "
            "first stage's score when `rerank` is false."
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
    matched: Annotated[
        list[str] | None,
        Meta(
            description="With `highlight`, the words of `text` that BM25 matched (the query's "
            "stems, not its stopwords), each once."
        ),
    ] = None


class RerankStage(Struct, frozen=True, kw_only=True):
    """One reranker's part in a search: two in a cascade."""

    model: str
    pairs: Annotated[int, Meta(description="(query, window) pairs it scored.")]
    ms: float


class Timings(Struct, frozen=True, kw_only=True):
    """Milliseconds of each stage; a stage the search skipped reads 0."""

    embed: float
    sparse: Annotated[float, Meta(description="Computing the query's BM25 vector.")]
    retrieve: float
    rerank: float
    total: float
    rerank_stages: Annotated[
        list[RerankStage],
        Meta(description="Each reranker that ran, in order, with the pairs it scored."),
    ] = []


class SearchResponse(Struct, frozen=True, kw_only=True):
    results: list[SearchHit]
    reranked: bool
    retrieval: Annotated[str, Meta(description="The first stage this search ran.")]
    timings_ms: Timings
    rerank_error: Annotated[
        str | None,
        Meta(description="With `rerank: auto`, why the results are in the first stage's order."),
    ] = None
    sparse_language: Annotated[
        str | None,
        Meta(
            description="The language the query's BM25 terms were analysed in: an ISO 639-1 "
            "code, two joined by `+` when the query's language was uncertain; absent when BM25 "
            "did not run or applies no language."
        ),
    ] = None


def _cascade(requested: bool | CascadeRequest | None) -> Cascade | Literal[False] | None:
    """The pipeline's cascade argument: a request's own, off, or the server's (None)."""
    if isinstance(requested, CascadeRequest):
        return Cascade(model=requested.model, top=requested.top)
    return False if requested is False else None


@post("/v1/search", status_code=HTTP_200_OK)
async def search(
    data: SearchRequest, pipeline: SearchPipeline, request: Request[Any, Any, Any]
) -> SearchResponse:
    """Retrieve `candidates` chunks (dense, BM25 or hybrid), rerank them, return `top_k`."""
    # A code BM25 has no analyser for is analysed as any such language is: words unstemmed.
    language = None
    if data.language is not None:
        language = known_language(data.language) or primary_subtag(data.language)
    outcome = await unless_disconnected(
        request,
        pipeline.search(
            data.query,
            top_k=data.top_k,
            candidates=max(data.candidates, data.top_k),
            rerank=data.rerank,
            where=data.filter,
            retrieval=data.retrieval,
            fusion=data.fusion,
            rrf_k=data.rrf_k,
            dense_weight=data.dense_weight,
            sparse_weight=data.sparse_weight,
            language=language,
            highlight=data.highlight,
            model=data.model,
            cascade=_cascade(data.cascade),
            blend=data.blend,
            min_score=data.min_score,
        ),
    )
    return SearchResponse(
        results=[
            SearchHit(
                rank=rank,
                doc_id=hit.candidate.chunk.doc_id,
                chunk=hit.candidate.chunk.chunk_index,
                text=hit.candidate.chunk.text,
                title=hit.candidate.chunk.title,
                metadata=dict(hit.candidate.chunk.metadata),
                score=hit.score,
                retrieval_score=hit.candidate.retrieval_score,
                retrieval_rank=hit.retrieval_rank,
                matched=None if hit.matched is None else list(hit.matched),
            )
            for rank, hit in enumerate(outcome.hits, start=1)
        ],
        reranked=outcome.reranked,
        retrieval=outcome.retrieval,
        timings_ms=Timings(
            **outcome.timings_ms,
            rerank_stages=[
                RerankStage(model=stage.model, pairs=stage.pairs, ms=stage.ms)
                for stage in outcome.rerank_stages
            ],
        ),
        rerank_error=outcome.rerank_error,
        sparse_language=outcome.sparse_language,
    )


router = domain(search, tags=["search"], responses=MODEL_ERRORS)
