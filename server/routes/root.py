"""What `/` answers: the landing page a browser gets, and text-embeddings-inference's embed,
which Hugging Face's client posts to when pointed at a TEI URL. One router owns the path, so
no other domain's registration order matters."""

from __future__ import annotations

from typing import TYPE_CHECKING

from litestar import Router

from server.playground import landing_page
from server.routes.embeddings import embed_tei_at_root

if TYPE_CHECKING:
    from ragrank.settings import Settings


def root_router(settings: Settings) -> Router:
    return Router(path="/", route_handlers=[landing_page(settings), embed_tei_at_root])
