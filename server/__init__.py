"""The Litestar query server: the app factory, routes grouped by domain, msgspec schemas."""

from server.app import create_app, serve
from server.pipeline import SearchPipeline
from server.services import Services

__all__ = ["SearchPipeline", "Services", "create_app", "serve"]
