"""The one app factory. It reads no environment: callers pass `Settings` (and, in tests or the
demo, ready-made `Services`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from litestar import Litestar
from litestar.datastructures import State
from litestar.di import Provide
from litestar.openapi import OpenAPIConfig
from litestar.plugins.prometheus import PrometheusController

from ragrank import __version__
from ragrank.settings import Settings
from server.errors import EXCEPTION_HANDLERS
from server.metrics import PROMETHEUS, instrument
from server.routes import ROUTES
from server.services import SearchService, Services


def create_app(settings: Settings, *, services: Services | None = None) -> Litestar:
    """Build the Litestar app. Without `services`, models and store load at startup from
    `settings` and are closed at shutdown; given ones stay owned by the caller."""

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
                yield
        finally:
            if owned:
                ready.store.close()

    def provide_search_service(state: State) -> SearchService:
        service: SearchService = state.search_service
        return service

    return Litestar(
        route_handlers=[*ROUTES, PrometheusController],
        middleware=[PROMETHEUS.middleware],
        dependencies={
            "search_service": Provide(provide_search_service, sync_to_thread=False),
        },
        exception_handlers=EXCEPTION_HANDLERS,
        lifespan=[lifespan],
        openapi_config=OpenAPIConfig(
            title="ragrank",
            version=__version__,
            description="Retrieval from Qdrant with cross-encoder reranking.",
            path="/schema",
        ),
    )
