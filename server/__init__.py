"""The Litestar query server: app factory, routes, schemas and the search service."""

from server.app import create_app, serve
from server.services import SearchService, Services

__all__ = ["SearchService", "Services", "create_app", "serve"]
