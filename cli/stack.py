"""The one way to run the stack: services, the app and its companions. `ragrank serve` and
`ragrank demo` both go through `run_stack`, so what one serves the other serves too."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable
    from contextlib import AbstractContextManager

    from litestar import Litestar

    from ragrank.jobs import JobQueue
    from ragrank.settings import Settings
    from server import Services
    from server.app import Companion


def run_stack(
    settings: Settings,
    *,
    prepare: Callable[[Services], None] | None = None,
    serve: bool = True,
) -> None:
    """Load the services, run `prepare` on them (the demo indexes its sample there), then
    serve `stack_app` until interrupted; the store is closed on the way out."""
    from cli.compose import load_services
    from server.app import serve as serve_app

    services = load_services(settings)
    try:
        if prepare is not None:
            prepare(services)
        if serve:
            serve_app(stack_app(settings, services), settings)
    finally:
        if services.jobs is not None:
            services.jobs.close()
        services.store.close()


def stack_app(settings: Settings, services: Services) -> Litestar:
    """The app on ready services, with the companions the store needs: only one process may
    open an embedded Qdrant folder, so the indexing worker then runs inside the API."""
    from server import create_app

    alongside = [in_process_worker(settings)] if settings.uses_embedded_qdrant else []
    return create_app(settings, services=services, alongside=alongside)


def in_process_worker(settings: Settings) -> Companion:
    """The indexing worker as a companion of the API, on the API's models and store."""
    from indexing import worker_thread

    def companion(services: Services, jobs: JobQueue) -> AbstractContextManager[object]:
        return worker_thread(settings, services.inference.bulk_embedder(), services.store, jobs)

    return companion
