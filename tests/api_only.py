"""An API process that only accepts writes into the job queue and answers from it: the app
without the in-process worker, as an API replica on a shared queue runs. Its settings come from
the environment (`python -m tests.api_only`)."""

from __future__ import annotations

from ragrank.logs import configure_logging
from ragrank.settings import Settings
from server.app import create_app, serve

if __name__ == "__main__":
    settings = Settings.from_env()
    configure_logging(settings.log_format, settings.log_level)
    serve(create_app(settings), settings)
