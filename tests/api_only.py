"""An API process that only accepts writes into the job queue and answers from it: the app
without the in-process worker, as an API replica of the cluster profile runs on a Qdrant server.
No Qdrant server installs where the tests run, so each replica has its own embedded store, and
this process builds the app itself rather than through `cli.stack`, which would (rightly) add
the worker an embedded store needs. Its settings come from the environment
(`python -m tests.api_only`)."""

from __future__ import annotations

from cli.compose import load_services
from ragrank.logs import configure_logging
from ragrank.settings import Settings
from server.app import create_app, serve

if __name__ == "__main__":
    settings = Settings.from_env()
    configure_logging(settings.log_format, settings.log_level)
    services = load_services(settings)
    try:
        serve(create_app(settings, services=services), settings)
    finally:
        services.store.close()
