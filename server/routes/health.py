"""Liveness and readiness: `GET /health` and `GET /ready`, open without a key."""

from __future__ import annotations

from typing import Annotated

from litestar import Response, get
from litestar.openapi import ResponseSpec
from litestar.status_codes import HTTP_200_OK, HTTP_503_SERVICE_UNAVAILABLE
from msgspec import Meta, Struct

from server.auth import PUBLIC
from server.pipeline import SearchPipeline
from server.routes.shared import domain


class Health(Struct, frozen=True, kw_only=True):
    status: str


class Readiness(Struct, frozen=True, kw_only=True):
    ready: bool
    store: bool
    models: bool
    embed_model: Annotated[str, Meta(description="The default embedder: it indexes and searches.")]
    rerank_model: Annotated[str, Meta(description="The default reranker.")]
    collection: str
    embed_models: Annotated[
        list[str], Meta(description="Every served embedder's name, the default first.")
    ]
    rerank_models: Annotated[
        list[str], Meta(description="Every served reranker's name, the default first.")
    ]


@get("/health", opt={PUBLIC: True})
async def health() -> Health:
    """Liveness: the process answers."""
    return Health(status="ok")


@get(
    "/ready",
    opt={PUBLIC: True},
    responses={503: ResponseSpec(Readiness, description="Not ready: what is missing.")},
)
async def ready(pipeline: SearchPipeline) -> Response[Readiness]:
    """Readiness: every model's batching engine running and Qdrant reachable with the collection in
    place; else 503."""
    inference = pipeline.inference
    store_ok = await pipeline.store_ready()
    models_ok = inference.models_ready
    body = Readiness(
        ready=store_ok and models_ok,
        store=store_ok,
        models=models_ok,
        embed_model=inference.embedder.model_id,
        rerank_model=inference.scorer.model_id if inference.scorer is not None else "",
        collection=pipeline.services.store.collection,
        embed_models=[served.name for served in inference.embedders],
        rerank_models=[served.name for served in inference.rerankers],
    )
    return Response(body, status_code=HTTP_200_OK if body.ready else HTTP_503_SERVICE_UNAVAILABLE)


router = domain(health, ready, tags=["operations"])
