"""The one app factory. It reads no environment: callers pass `Settings` (and, in tests or the
demo, ready-made `Services`)."""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager

import anyio
from litestar import Litestar
from litestar.datastructures import State
from litestar.di import Provide
from litestar.openapi import OpenAPIConfig
from litestar.openapi.spec import Components
from litestar.status_codes import HTTP_413_REQUEST_ENTITY_TOO_LARGE

from indexing.jobs import JobStore
from indexing.worker import Worker
from ragrank import __version__
from ragrank.settings import Settings
from server.auth import SECURITY_SCHEMES, ApiKeys, api_key_guard
from server.documents import DOCUMENT_ROUTES
from server.errors import EXCEPTION_HANDLERS, body_too_large
from server.limits import write_limits_into_schema
from server.metrics import PROMETHEUS, MetricsController, instrument
from server.request_log import request_id_middleware
from server.routes import ROUTES
from server.schemas import complete_request_schemas
from server.services import SearchService, Services
from server.strict import strict_body


def create_app(
    settings: Settings, *, services: Services | None = None, run_worker: bool | None = None
) -> Litestar:
    """Build the Litestar app. Without `services`, models and store load at startup from
    `settings` and are closed at shutdown; given ones stay owned by the caller.

    `run_worker` runs the indexing worker on a thread of this process; by default it does when
    the app loads its own services on an embedded Qdrant folder, which only one process may
    open (`ragrank serve` asks for it whenever the folder is embedded)."""
    jobs: list[JobStore] = []  # opened on first use

    def provide_jobs() -> JobStore:
        if not jobs:
            jobs.append(JobStore(settings.jobs_path))
        return jobs[0]

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        owned = services is None
        ready = services
        if ready is None:
            ready = await anyio.to_thread.run_sync(Services.load, settings)
        try:
            async with SearchService(ready, settings) as search_service:
                instrument(search_service.embed_engine)
                instrument(search_service.score_engine)
                app.state.search_service = search_service
                in_process = settings.uses_embedded_qdrant and owned
                if run_worker if run_worker is not None else in_process:
                    with _worker_thread(settings, ready, provide_jobs()):
                        yield
                else:
                    yield
        finally:
            if owned:
                ready.store.close()

    def provide_search_service(state: State) -> SearchService:
        service: SearchService = state.search_service
        return service

    keys = ApiKeys.from_settings(settings)  # a missing key file stops here, at start-up
    app = Litestar(
        route_handlers=[*ROUTES, *DOCUMENT_ROUTES, MetricsController],
        guards=[api_key_guard(keys)],
        before_request=strict_body(settings),
        middleware=[PROMETHEUS.middleware],
        dependencies={
            "search_service": Provide(provide_search_service, sync_to_thread=False),
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
        openapi_config=OpenAPIConfig(
            title="ragrank",
            version=__version__,
            description="Retrieval from Qdrant with cross-encoder reranking.",
            path="/schema",
            components=Components(security_schemes=SECURITY_SCHEMES if keys.enabled else None),
            security=[{name: []} for name in SECURITY_SCHEMES] if keys.enabled else None,
        ),
    )
    # Outside the router, as Litestar's own OpenTelemetry plugin does, so that requests no route
    # matches (404, 405) get an id and a log line too; app middleware only wraps routes.
    app.asgi_handler = request_id_middleware(app.asgi_handler)
    # Built once here; the schema route serves this object.
    complete_request_schemas(app.openapi_schema)
    write_limits_into_schema(app.openapi_schema, settings)
    return app


def serve(app: Litestar, settings: Settings) -> None:
    """Serve `app` with uvicorn on the settings' host and port. The request-id middleware logs
    every request, so uvicorn keeps the process's log handlers and writes no access log."""
    import uvicorn

    uvicorn.run(app, host=settings.host, port=settings.port, log_config=None, access_log=False)


@contextmanager
def _worker_thread(settings: Settings, services: Services, jobs: JobStore) -> Iterator[None]:
    """The indexing worker on a thread of this process, sharing its models and store."""
    worker = Worker.from_settings(
        settings,
        services.embedder,
        services.store,
        jobs,
        optimize_when_idle=True,
        alongside_searches=True,
    )
    stop = threading.Event()
    thread = threading.Thread(target=worker.run, args=(stop,), name="ragrank-worker")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
