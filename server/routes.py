"""HTTP handlers. They validate, call the `SearchService`, and shape responses; nothing more."""

from __future__ import annotations

import asyncio
import base64
import uuid
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
from litestar import Request, Response, get, post
from litestar.openapi import ResponseSpec
from litestar.status_codes import HTTP_200_OK, HTTP_503_SERVICE_UNAVAILABLE

from ragrank.errors import ClientDisconnectedError
from ragrank.protocols import relevance
from server.auth import PUBLIC
from server.schemas import (
    MODEL_ERRORS,
    ApiVersion,
    BilledUnits,
    Embedding,
    EmbeddingsRequest,
    EmbeddingsResponse,
    EmbeddingsUsage,
    Health,
    Readiness,
    RerankDocument,
    RerankMeta,
    RerankRequest,
    RerankResponse,
    RerankResult,
    SearchHit,
    SearchRequest,
    SearchResponse,
    TeiRank,
    TeiRerankRequest,
    Timings,
    TokenUsage,
)
from server.services import SearchService

if TYPE_CHECKING:
    from collections.abc import Awaitable

_Result = TypeVar("_Result")


async def _unless_disconnected(
    request: Request[Any, Any, Any], work: Awaitable[_Result]
) -> _Result:
    """Await `work`, cancelling it if the client disconnects first; the batching engines then
    drop its queued items. (Litestar does not cancel handlers on disconnect by itself.)"""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        raise ClientDisconnectedError("the client disconnected before the answer was ready")
    return task.result()


@post("/v1/search", status_code=HTTP_200_OK, tags=["search"], responses=MODEL_ERRORS)
async def search(
    data: SearchRequest, search_service: SearchService, request: Request[Any, Any, Any]
) -> SearchResponse:
    """Retrieve `candidates` chunks (dense, BM25 or hybrid), rerank them, return `top_k`."""
    outcome = await _unless_disconnected(
        request,
        search_service.search(
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
            )
            for rank, hit in enumerate(outcome.hits, start=1)
        ],
        reranked=outcome.reranked,
        retrieval=outcome.retrieval,
        timings_ms=Timings(**outcome.timings_ms),
        rerank_error=outcome.rerank_error,
    )


async def _ranked(
    request: Request[Any, Any, Any],
    search_service: SearchService,
    query: str,
    texts: list[str],
    *,
    raw_scores: bool,
    max_tokens_per_doc: int | None = None,
) -> tuple[list[tuple[int, float]], int]:
    """(document index, score) best first, and the tokens the reranker read."""
    outcome = await _unless_disconnected(
        request, search_service.rerank(query, texts, max_tokens_per_doc)
    )
    logits = np.asarray(outcome.logits, dtype=np.float32)
    scores = logits.astype(np.float64) if raw_scores else relevance(logits)
    order = np.argsort(-scores, kind="stable")
    return [(int(i), float(scores[i])) for i in order], outcome.tokens


@post(
    ["/v1/rerank", "/v2/rerank"], status_code=HTTP_200_OK, tags=["rerank"], responses=MODEL_ERRORS
)
async def rerank(
    data: RerankRequest, search_service: SearchService, request: Request[Any, Any, Any]
) -> RerankResponse:
    """Cohere-shaped reranking (v2; also served at /v2/rerank for Cohere's client)."""
    texts = [d if isinstance(d, str) else d.text for d in data.documents]
    ranked, tokens = await _ranked(
        request,
        search_service,
        data.query,
        texts,
        raw_scores=data.raw_scores,
        max_tokens_per_doc=data.max_tokens_per_doc,
    )
    return RerankResponse(
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


@post("/rerank", status_code=HTTP_200_OK, tags=["rerank"], responses=MODEL_ERRORS)
async def rerank_tei(
    data: TeiRerankRequest, search_service: SearchService, request: Request[Any, Any, Any]
) -> list[TeiRank]:
    """text-embeddings-inference-shaped reranking."""
    ranked, _ = await _ranked(
        request, search_service, data.query, data.texts, raw_scores=data.raw_scores
    )
    return [
        TeiRank(index=index, score=score, text=data.texts[index] if data.return_text else None)
        for index, score in ranked
    ]


@post("/v1/embeddings", status_code=HTTP_200_OK, tags=["embeddings"], responses=MODEL_ERRORS)
async def embeddings(
    data: EmbeddingsRequest, search_service: SearchService, request: Request[Any, Any, Any]
) -> EmbeddingsResponse:
    """OpenAI-shaped embeddings; `input_type` picks the query or passage prefix."""
    texts = [data.input] if isinstance(data.input, str) else data.input
    outcome = await _unless_disconnected(
        request, search_service.embed(texts, as_queries=data.input_type == "query")
    )
    return EmbeddingsResponse(
        data=[
            Embedding(
                index=index,
                embedding=(
                    base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
                    if data.encoding_format == "base64"
                    else vector.tolist()
                ),
            )
            for index, vector in enumerate(outcome.vectors)
        ],
        model=search_service.services.embedder.model_id,
        usage=EmbeddingsUsage(prompt_tokens=outcome.tokens, total_tokens=outcome.tokens),
    )


@get("/health", tags=["operations"], opt={PUBLIC: True})
async def health() -> Health:
    """Liveness: the process answers."""
    return Health(status="ok")


@get(
    "/ready",
    tags=["operations"],
    opt={PUBLIC: True},
    responses={503: ResponseSpec(Readiness, description="Not ready: what is missing.")},
)
async def ready(search_service: SearchService) -> Response[Readiness]:
    """Readiness: both batching engines running and Qdrant reachable with the collection in
    place; else 503."""
    services = search_service.services
    store_ok = await search_service.store_ready()
    models_ok = search_service.models_ready
    body = Readiness(
        ready=store_ok and models_ok,
        store=store_ok,
        models=models_ok,
        embed_model=services.embedder.model_id,
        rerank_model=services.scorer.model_id,
        collection=services.store.collection,
    )
    return Response(body, status_code=HTTP_200_OK if body.ready else HTTP_503_SERVICE_UNAVAILABLE)


ROUTES = [search, rerank, rerank_tei, embeddings, health, ready]
