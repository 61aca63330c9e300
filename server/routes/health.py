"""Liveness and readiness: `GET /health` and `GET /ready`, open without a key."""

from __future__ import annotations

from litestar import Response, get
from litestar.openapi import ResponseSpec
from litestar.status_codes import HTTP_200_OK, HTTP_503_SERVICE_UNAVAILABLE
from msgspec import Struct

from server.auth import PUBLIC
from server.services import SearchService


class Health(Struct, frozen=True, kw_only=True):
    status: str


class Readiness(Struct, frozen=True, kw_only=True):
    ready: bool
    store: bool
    models: bool
    embed_model: str
    rerank_model: str
    collection: str


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


#: The handlers this module adds to the app.
ROUTES = [health, ready]
