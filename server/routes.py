"""HTTP handlers. They validate, call the `SearchService`, and shape responses; nothing more."""

from __future__ import annotations

from litestar import Response, get, post
from litestar.status_codes import HTTP_200_OK, HTTP_503_SERVICE_UNAVAILABLE

from ragrank.errors import InvalidRequestError
from server.schemas import Health, Readiness, SearchHit, SearchRequest, SearchResponse, Timings
from server.services import SearchService


@post("/v1/search", status_code=HTTP_200_OK, tags=["search"])
async def search(data: SearchRequest, search_service: SearchService) -> SearchResponse:
    """Retrieve the `candidates` nearest chunks by cosine, rerank them, and return `top_k`."""
    if not data.query.strip():
        raise InvalidRequestError("query must contain non-whitespace text", field="query")
    if data.top_k > data.candidates:
        raise InvalidRequestError(
            f"top_k ({data.top_k}) must not exceed candidates ({data.candidates})", field="top_k"
        )
    outcome = await search_service.search(
        data.query,
        top_k=data.top_k,
        candidates=data.candidates,
        rerank=data.rerank,
        where=data.filter,
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
            )
            for rank, hit in enumerate(outcome.hits, start=1)
        ],
        reranked=outcome.reranked,
        timings_ms=Timings(**outcome.timings_ms),
    )


@get("/health", tags=["operations"])
async def health() -> Health:
    """Liveness: the process answers."""
    return Health(status="ok")


@get("/ready", tags=["operations"])
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


ROUTES = [search, health, ready]
