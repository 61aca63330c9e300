"""Reranking: Cohere's and Jina's `POST /v1/rerank` and `/v2/rerank`, text-embeddings-
inference's and Infinity's `POST /rerank`."""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, ClassVar, Literal

import numpy as np
from litestar import Request, post
from litestar.status_codes import HTTP_200_OK
from msgspec import Meta, Struct

from ragrank.errors import InvalidRequestError
from ragrank.inference import Inference
from server.limits import length_limit
from server.routes.shared import (
    MODEL_ERRORS,
    NON_BLANK,
    ApiVersion,
    CoherePriority,
    RerankerName,
    TruncationDirection,
    domain,
    unless_disconnected,
)

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


#: The most windows `max_chunks_per_doc` may ask for per document.
MAX_CHUNKS_PER_DOC = 256


class RerankRequest(Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Cohere's rerank request, v1 and v2, which is also Jina's."""

    query: QueryText
    documents: Annotated[
        list[DocumentText | RerankDocument],
        length_limit("max_rerank_documents", min_length=1),
    ]
    model: RerankerName = None
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
        bool,
        Meta(
            description="Return the reranker's logits instead of its relevance (the "
            "calibrated probability, or the logit's sigmoid for a model without calibration)."
        ),
    ] = False
    min_score: (
        Annotated[
            float,
            Meta(
                ge=-1e6,
                le=1e6,
                description="Drop results whose `relevance_score` is below this (a probability "
                "in [0, 1], or a logit with `raw_scores`).",
            ),
        ]
        | None
    ) = None


class RerankResult(Struct, frozen=True, kw_only=True, omit_defaults=True):
    index: int
    relevance_score: float
    document: RerankDocument | None = None


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
    model: RerankerName = None


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


async def _ranked(
    request: Request[Any, Any, Any],
    inference: Inference,
    query: str,
    texts: list[str],
    *,
    raw_scores: bool,
    max_tokens_per_doc: int | None = None,
    max_windows_per_doc: int | None = None,
    model: str | None = None,
) -> tuple[list[tuple[int, float]], int, str]:
    """(document index, score) best first, the tokens the reranker read, and its model."""
    outcome = await unless_disconnected(
        request,
        inference.rerank(query, texts, max_tokens_per_doc, max_windows_per_doc, model=model),
    )
    scores = np.asarray(outcome.logits if raw_scores else outcome.scores, dtype=np.float64)
    order = np.argsort(-scores, kind="stable")
    return [(int(i), float(scores[i])) for i in order], outcome.tokens, outcome.model


@post(["/v1/rerank", "/v2/rerank"], status_code=HTTP_200_OK)
async def rerank(
    data: RerankRequest, inference: Inference, request: Request[Any, Any, Any]
) -> RerankResponse:
    """Cohere-shaped reranking, v1 and v2, which Jina's clients call too."""
    texts = [d if isinstance(d, str) else d.text for d in data.documents]
    ranked, tokens, model = await _ranked(
        request,
        inference,
        data.query,
        texts,
        raw_scores=data.raw_scores,
        max_tokens_per_doc=data.max_tokens_per_doc,
        max_windows_per_doc=data.max_chunks_per_doc,
        model=data.model,
    )
    if data.min_score is not None:
        ranked = [(index, score) for index, score in ranked if score >= data.min_score]
    return RerankResponse(
        model=model,
        usage=Usage(prompt_tokens=tokens, total_tokens=tokens),
        id=str(uuid.uuid4()),
        results=[
            RerankResult(
                index=index,
                relevance_score=score,
                document=RerankDocument(text=texts[index]) if data.return_documents else None,
            )
            for index, score in ranked[: data.top_n]
        ],
        meta=RerankMeta(
            api_version=ApiVersion(),
            billed_units=BilledUnits(search_units=1),
            tokens=TokenUsage(input_tokens=tokens),
        ),
    )


@post("/rerank", status_code=HTTP_200_OK)
async def rerank_tei(
    data: TeiRerankRequest, inference: Inference, request: Request[Any, Any, Any]
) -> list[TeiRank] | InfinityRerankResponse:
    """text-embeddings-inference-shaped reranking (`texts`: a list of ranks), or
    Infinity-shaped (`documents`: Infinity's answer)."""
    if bool(data.texts) == bool(data.documents):
        raise InvalidRequestError(
            "texts: give the texts to rank as `texts` (TEI) or as `documents` (Infinity), not both",
            field="texts",
        )
    texts = data.texts or data.documents
    ranked, tokens, model = await _ranked(
        request, inference, data.query, texts, raw_scores=data.raw_scores, model=data.model
    )
    best = ranked[: data.top_n]
    if not data.texts:
        return InfinityRerankResponse(
            id=str(uuid.uuid4()),
            created=int(time.time()),
            model=model,
            results=[
                InfinityRank(
                    index=index,
                    relevance_score=score,
                    document=texts[index] if data.return_documents else None,
                )
                for index, score in best
            ],
            usage=Usage(prompt_tokens=tokens, total_tokens=tokens),
        )
    return [
        TeiRank(index=index, score=score, text=texts[index] if data.return_text else None)
        for index, score in best
    ]


router = domain(rerank, rerank_tei, tags=["rerank"], responses=MODEL_ERRORS)
