"""HTTP handlers. They validate, call the `SearchService`, and shape responses; nothing more."""

from __future__ import annotations

import asyncio
import base64
import time
import uuid
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
from litestar import Request, Response, get, post
from litestar.openapi import ResponseSpec
from litestar.status_codes import HTTP_200_OK, HTTP_503_SERVICE_UNAVAILABLE

from ragrank.errors import ClientDisconnectedError, InvalidRequestError
from ragrank.protocols import relevance
from server.auth import PUBLIC
from server.schemas import (
    JINA_TASKS,
    MODEL_ERRORS,
    ApiVersion,
    BilledUnits,
    CohereBilledUnits,
    CohereEmbedMeta,
    CohereEmbedRequest,
    CohereEmbedResponse,
    CohereFloats,
    Embedding,
    EmbeddingsRequest,
    EmbeddingsResponse,
    EmbeddingsUsage,
    Health,
    InfinityRank,
    InfinityRerankResponse,
    Readiness,
    RerankDocument,
    RerankMeta,
    RerankRequest,
    RerankResponse,
    RerankResult,
    SearchHit,
    SearchRequest,
    SearchResponse,
    TeiEmbedRequest,
    TeiRank,
    TeiRerankRequest,
    Timings,
    TokenUsage,
    Usage,
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
    max_windows_per_doc: int | None = None,
) -> tuple[list[tuple[int, float]], int]:
    """(document index, score) best first, and the tokens the reranker read."""
    outcome = await _unless_disconnected(
        request,
        search_service.rerank(query, texts, max_tokens_per_doc, max_windows_per_doc),
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
    """Cohere-shaped reranking, v1 and v2, which Jina's clients call too."""
    texts = [d if isinstance(d, str) else d.text for d in data.documents]
    ranked, tokens = await _ranked(
        request,
        search_service,
        data.query,
        texts,
        raw_scores=data.raw_scores,
        max_tokens_per_doc=data.max_tokens_per_doc,
        max_windows_per_doc=data.max_chunks_per_doc,
    )
    return RerankResponse(
        model=search_service.services.scorer.model_id,
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


@post("/rerank", status_code=HTTP_200_OK, tags=["rerank"], responses=MODEL_ERRORS)
async def rerank_tei(
    data: TeiRerankRequest, search_service: SearchService, request: Request[Any, Any, Any]
) -> list[TeiRank] | InfinityRerankResponse:
    """text-embeddings-inference-shaped reranking (`texts`: a list of ranks), or
    Infinity-shaped (`documents`: Infinity's answer)."""
    if bool(data.texts) == bool(data.documents):
        raise InvalidRequestError(
            "texts: give the texts to rank as `texts` (TEI) or as `documents` (Infinity), not both",
            field="texts",
        )
    texts = data.texts or data.documents
    ranked, tokens = await _ranked(
        request, search_service, data.query, texts, raw_scores=data.raw_scores
    )
    best = ranked[: data.top_n]
    if not data.texts:
        return InfinityRerankResponse(
            id=str(uuid.uuid4()),
            created=int(time.time()),
            model=search_service.services.scorer.model_id,
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


def _dimensions(search_service: SearchService, field: str, asked: int | None) -> None:
    """A 400 unless `asked` is absent or the embedder's own vector length."""
    served = search_service.services.embedder.dimension
    if asked is not None and asked != served:
        raise InvalidRequestError(
            f"{field}: this server's embedder gives {served}-dimensional vectors, and ragrank "
            f"does not shorten them; give {served} or leave {field} out",
            field=field,
        )


@post(
    ["/v1/embeddings", "/embeddings"],
    status_code=HTTP_200_OK,
    tags=["embeddings"],
    responses=MODEL_ERRORS,
)
async def embeddings(
    data: EmbeddingsRequest, search_service: SearchService, request: Request[Any, Any, Any]
) -> EmbeddingsResponse:
    """OpenAI-shaped embeddings, which Infinity's (`/embeddings`) and Jina's clients call too;
    `input_type` or Jina's `task` picks the query or passage prefix."""
    _dimensions(search_service, "dimensions", data.dimensions)
    if not data.normalized:
        raise InvalidRequestError(
            "normalized: ragrank's vectors are always unit length; leave normalized out or "
            "give true",
            field="normalized",
        )
    if data.late_chunking:
        raise InvalidRequestError(
            "late_chunking: not served; each input is embedded on its own", field="late_chunking"
        )
    role = JINA_TASKS[data.task] if data.task is not None else data.input_type
    encoding = data.embedding_type or data.encoding_format
    texts = [data.input] if isinstance(data.input, str) else data.input
    outcome = await _unless_disconnected(
        request, search_service.embed(texts, as_queries=role == "query")
    )
    return EmbeddingsResponse(
        data=[
            Embedding(
                index=index,
                embedding=(
                    base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
                    if encoding == "base64"
                    else vector.tolist()
                ),
            )
            for index, vector in enumerate(outcome.vectors)
        ],
        model=search_service.services.embedder.model_id,
        usage=EmbeddingsUsage(prompt_tokens=outcome.tokens, total_tokens=outcome.tokens),
    )


@post(["/embed", "/"], status_code=HTTP_200_OK, tags=["embeddings"], responses=MODEL_ERRORS)
async def embed_tei(
    data: TeiEmbedRequest, search_service: SearchService, request: Request[Any, Any, Any]
) -> list[list[float]]:
    """text-embeddings-inference-shaped embeddings, at `/embed` and at `/`, where Hugging
    Face's client posts when pointed at a TEI URL; `prompt_name: query` gives the query
    prefix."""
    _dimensions(search_service, "dimensions", data.dimensions)
    texts = [data.inputs] if isinstance(data.inputs, str) else data.inputs
    outcome = await _unless_disconnected(
        request, search_service.embed(texts, as_queries=data.prompt_name == "query")
    )
    return [vector.tolist() for vector in outcome.vectors]


@post(
    ["/v1/embed", "/v2/embed"], status_code=HTTP_200_OK, tags=["embeddings"], responses=MODEL_ERRORS
)
async def embed_cohere(
    data: CohereEmbedRequest, search_service: SearchService, request: Request[Any, Any, Any]
) -> CohereEmbedResponse:
    """Cohere-shaped embeddings, v1 and v2: `search_document` (or no `input_type`) embeds
    passages, the other input types queries."""
    _dimensions(search_service, "output_dimension", data.output_dimension)
    as_queries = data.input_type not in (None, "search_document")
    outcome = await _unless_disconnected(
        request, search_service.embed(data.texts, as_queries=as_queries)
    )
    vectors = [vector.tolist() for vector in outcome.vectors]
    version = "2" if request.url.path.startswith("/v2/") else "1"
    by_type = version == "2" or data.embedding_types is not None
    return CohereEmbedResponse(
        response_type="embeddings_by_type" if by_type else "embeddings_floats",
        id=str(uuid.uuid4()),
        embeddings=CohereFloats(float_=vectors) if by_type else vectors,
        texts=data.texts,
        meta=CohereEmbedMeta(
            api_version=ApiVersion(version=version),
            billed_units=CohereBilledUnits(input_tokens=outcome.tokens),
        ),
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


ROUTES = [search, rerank, rerank_tei, embeddings, embed_tei, embed_cohere, health, ready]
