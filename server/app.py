"""The one app factory. It reads no environment and loads nothing: callers pass `Settings` and
ready `Services`, which stay theirs to close (`cli.stack` is the one way the product runs it)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractContextManager, ExitStack, asynccontextmanager
from typing import TYPE_CHECKING

from litestar import Litestar
from litestar.di import Provide
from litestar.openapi import OpenAPIConfig
from litestar.openapi.spec import Components
from litestar.status_codes import HTTP_413_REQUEST_ENTITY_TOO_LARGE

from ragrank import __version__
from ragrank.inference import Inference  # noqa: TC001 (Litestar reads the providers' hints)
from ragrank.jobs import JobQueue, LazyJobQueue
from ragrank.roles import EMBEDDING, RERANK
from server.auth import SECURITY_SCHEMES, ApiKeys, api_key_guard
from server.errors import EXCEPTION_HANDLERS, body_too_large
from server.metrics import PROMETHEUS, MetricsController, instrument, instrument_jobs
from server.openapi import (
    complete_request_schemas,
    request_types,
    write_dimension_into_schema,
    write_limits_into_schema,
    write_models_into_schema,
)
from server.pipeline import SearchPipeline
from server.playground import playground_router
from server.request_log import request_id_middleware
from server.routes import documents, embeddings, health, models, rerank, search
from server.routes.root import root_router
from server.services import Services
from server.strict import strict_body

if TYPE_CHECKING:
    from litestar.datastructures import State
    from litestar.types import ControllerRouterHandler

    from ragrank.protocols import ModelRole
    from ragrank.settings import Settings

#: Something that runs for as long as the app serves, with the app's services and job queue:
#: `ragrank serve` hands in the indexing worker this way on an embedded Qdrant folder, which only
#: one process may open.
Companion = Callable[[Services, JobQueue], AbstractContextManager[object]]


def create_app(
    settings: Settings,
    *,
    services: Services,
    alongside: Sequence[Companion] = (),
) -> Litestar:
    """Build the Litestar app on `services`, which the caller loaded and closes. Each of
    `alongside` is entered at start-up, once the engines run, and left at shutdown."""
    # The caller's queue, or one of the app's own when none is handed in (opened on first use).
    jobs = services.jobs or LazyJobQueue(settings)

    def provide_jobs() -> JobQueue:
        return jobs.get()

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        _describe_models(app, services, strict_names=settings.model_names == "strict")
        inference = services.inference
        pipeline = SearchPipeline(services, settings)
        try:
            async with inference:
                for engine in inference.engines:
                    instrument(engine)
                instrument_jobs(jobs.states)
                app.state.pipeline = pipeline
                app.state.inference = inference
                companions = ExitStack()
                try:
                    for companion in alongside:
                        companions.enter_context(companion(services, provide_jobs()))
                    yield
                finally:
                    # On a thread: a companion's work may wait on the inference, which needs
                    # this loop to finish it.
                    await asyncio.to_thread(companions.close)
        finally:
            pipeline.close()
            if services.jobs is None:
                jobs.close()

    keys = ApiKeys.from_settings(settings)  # a missing key file stops here, at start-up
    app = Litestar(
        route_handlers=_route_handlers(settings, keys),
        guards=[api_key_guard(keys)],
        before_request=strict_body(settings),
        middleware=[PROMETHEUS.middleware],
        dependencies={
            "pipeline": Provide(_provide_pipeline, sync_to_thread=False),
            "inference": Provide(_provide_inference, sync_to_thread=False),
            "jobs": Provide(provide_jobs, sync_to_thread=False),
        },
        exception_handlers={
            **EXCEPTION_HANDLERS,
            HTTP_413_REQUEST_ENTITY_TOO_LARGE: body_too_large(settings.max_request_bytes),
        },
        request_max_body_size=settings.max_request_bytes,
        # Logging is the process's (ragrank/logs.py): Litestar must not configure its own.
        logging_config=None,
        lifespan=[lifespan],
        openapi_config=_openapi_config(keys),
    )
    # Outside the router, as Litestar's own OpenTelemetry plugin does, so that requests no route
    # matches (404, 405) get an id and a log line too; app middleware only wraps routes.
    app.asgi_handler = request_id_middleware(app.asgi_handler)
    # Built once here; the schema route serves this object.
    bodies = request_types(app)
    complete_request_schemas(app.openapi_schema, bodies)
    write_limits_into_schema(app.openapi_schema, settings, bodies)
    return app


def _provide_pipeline(state: State) -> SearchPipeline:
    pipeline: SearchPipeline = state.pipeline
    return pipeline


def _provide_inference(state: State) -> Inference:
    inference: Inference = state.inference
    return inference


def _describe_models(app: Litestar, services: Services, *, strict_names: bool) -> None:
    """Once the models are loaded, the served schema states what they accept: the embedder's
    vector length, the names of a field that must name a served model (a cascade's) and,
    when only served names are accepted, each role's model names."""
    bodies = request_types(app)
    inference = services.inference
    write_dimension_into_schema(app.openapi_schema, bodies, inference.embedder.dimension)
    names: dict[ModelRole, list[str]] = {
        RERANK.name: [name for served in inference.rerankers for name in served.names],
        EMBEDDING.name: [name for served in inference.embedders for name in served.names],
    }
    write_models_into_schema(app.openapi_schema, bodies, names, strict=strict_names)


def _route_handlers(settings: Settings, keys: ApiKeys) -> list[ControllerRouterHandler]:
    """Every domain's routes, one line each, in any order."""
    return [
        search.router,
        rerank.router,
        embeddings.router,
        documents.router,
        models.router,
        health.router,
        root_router(settings),
        playground_router(settings, api_keys=keys.enabled),
        MetricsController,
    ]


def _openapi_config(keys: ApiKeys) -> OpenAPIConfig:
    return OpenAPIConfig(
        title="ragrank",
        version=__version__,
        description="Retrieval from Qdrant with cross-encoder reranking.",
        path="/schema",
        components=Components(security_schemes=SECURITY_SCHEMES if keys.enabled else None),
        security=[{name: []} for name in SECURITY_SCHEMES] if keys.enabled else None,
    )


def serve(app: Litestar, settings: Settings) -> None:
    """Serve `app` with uvicorn on the settings' host and port. The request-id middleware logs
    every request, so uvicorn keeps the process's log handlers and writes no access log."""
    import uvicorn

    uvicorn.run(app, host=settings.host, port=settings.port, log_config=None, access_log=False)
