"""The web playground: one static page (`server/static/playground/`) that calls the public REST
API, plus the two small routes only it needs: what this server offers, and the relevance labels
of a BEIR dataset (`RAGRANK_LABELS`) so the page can mark relevant documents and score a query.

Everything here stays out of the OpenAPI schema: the page is a tool for people, not an API."""

from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from litestar import MediaType, Response, Router, get
from litestar.params import Parameter
from litestar.static_files import create_static_files_router
from msgspec import Struct

from ragrank import __version__
from ragrank.beir import load_qrels, load_queries
from ragrank.errors import DocumentError, SettingsError
from ragrank.settings import LIMIT_CEILINGS, RETRIEVALS, env_name
from server.auth import PUBLIC
from server.pipeline import SearchPipeline

if TYPE_CHECKING:
    from litestar.handlers import HTTPRouteHandler

    from ragrank.settings import Settings

STATIC = Path(__file__).parent / "static"

#: The page's own files only: no inline script or style, no other origin, no framing, no plugin.
PAGE_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": PAGE_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
}
#: A query text to look up: at most as long as any query may be.
LabelledText = Annotated[str, Parameter(max_length=LIMIT_CEILINGS["max_query_chars"])]
#: Labelled queries offered as examples (a dataset may hold thousands).
MAX_EXAMPLES = 100


class ServedReranker(Struct, frozen=True, kw_only=True):
    """A reranker the picker offers: the name a search sends, and what it loaded."""

    name: str
    model: str


class PlaygroundConfig(Struct, frozen=True, kw_only=True):
    """What the page needs to know before the first search."""

    api_keys: bool
    retrievals: list[str]
    retrieval: str
    max_top_k: int
    max_candidates: int
    labels: str | None
    embed_model: str
    rerank_model: str
    #: Every served reranker, the default first: the page's picker.
    rerank_models: list[ServedReranker]
    collection: str
    version: str


class LabelledQuery(Struct, frozen=True, kw_only=True):
    id: str
    text: str


class QueryLabels(Struct, frozen=True, kw_only=True):
    """The labels of the labelled query whose text is the one searched, if any."""

    query_id: str | None
    relevant: dict[str, int]


@dataclass(frozen=True)
class Labels:
    """A BEIR dataset's labelled queries, looked up by their exact text."""

    name: str
    by_text: dict[str, tuple[str, dict[str, int]]]

    @classmethod
    def load(cls, root: Path) -> Labels:
        try:
            queries = load_queries(root / "queries.jsonl")
            qrels = load_qrels(root / "qrels" / "test.tsv")
        except (OSError, DocumentError) as exc:
            message = f"{env_name('labels')}: cannot read labels in {root}: {exc}"
            raise SettingsError(message) from None
        by_text: dict[str, tuple[str, dict[str, int]]] = {}
        for query_id, text in queries.items():
            if query_id in qrels:
                by_text.setdefault(text.strip(), (query_id, dict(qrels[query_id])))
        return cls(root.name, by_text)


def landing_page(settings: Settings) -> HTTPRouteHandler:
    """`GET /`: where to go from here, for a person who opened the server in a browser."""
    landing = _landing(playground=settings.playground == "on")

    @get("/", opt={PUBLIC: True}, include_in_schema=False, media_type=MediaType.HTML)
    async def index() -> Response[str]:
        return Response(landing, media_type=MediaType.HTML, headers=SECURITY_HEADERS)

    return index


def playground_router(settings: Settings, *, api_keys: bool) -> Router:
    """`/playground` with its helper routes, none with `RAGRANK_PLAYGROUND=off`. A labels folder
    that cannot be read stops the server here, at start-up."""
    labels = Labels.load(settings.labels) if settings.labels is not None else None

    @get("/playground/config", opt={PUBLIC: True}, include_in_schema=False)
    async def playground_config(pipeline: SearchPipeline) -> PlaygroundConfig:
        inference = pipeline.inference
        return PlaygroundConfig(
            api_keys=api_keys,
            retrievals=["dense"] if settings.sparse == "none" else list(RETRIEVALS),
            retrieval=settings.retrieval,
            max_top_k=settings.max_top_k,
            max_candidates=settings.max_candidates,
            labels=labels.name if labels else None,
            embed_model=inference.embedder.model_id,
            rerank_model=inference.scorer.model_id if inference.scorer is not None else "",
            rerank_models=[
                ServedReranker(name=s.name, model=s.model.model_id) for s in inference.rerankers
            ],
            collection=pipeline.services.store.collection,
            version=__version__,
        )

    @get("/playground/examples", include_in_schema=False)
    async def examples() -> list[LabelledQuery]:
        """Labelled queries to try; empty without `RAGRANK_LABELS`."""
        found = labels.by_text.items() if labels else ()
        return [LabelledQuery(id=qid, text=text) for text, (qid, _) in found][:MAX_EXAMPLES]

    @get("/playground/labels", include_in_schema=False)
    async def query_labels(text: LabelledText) -> QueryLabels:
        found = labels.by_text.get(text.strip()) if labels else None
        if found is None:
            return QueryLabels(query_id=None, relevant={})
        return QueryLabels(query_id=found[0], relevant=found[1])

    handlers: list[Any] = []
    if settings.playground == "on":
        page = create_static_files_router(
            path="/playground",
            directories=[STATIC / "playground"],
            html_mode=True,
            name="playground",
            opt={PUBLIC: True},
            after_request=_secure,
            include_in_schema=False,
        )
        handlers += [playground_config, examples, query_labels, page]
    return Router(path="/", route_handlers=handlers)


async def _secure(response: Response[Any]) -> Response[Any]:
    response.headers.update(SECURITY_HEADERS)
    return response


def _landing(*, playground: bool) -> str:
    links = [
        ("/playground", "Playground", "try a query: first stage and reranked side by side"),
        ("/schema/swagger", "API reference", "the OpenAPI schema, browsable"),
        ("/schema/openapi.json", "OpenAPI JSON", "for client generators"),
        ("/ready", "Readiness", "models and store"),
        ("/metrics", "Metrics", "Prometheus"),
    ][0 if playground else 1 :]
    items = "\n".join(
        f'<li><a href="{href}">{html.escape(name)}</a>: {html.escape(what)}</li>'
        for href, name, what in links
    )
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>ragrank</title></head><body><h1>ragrank {html.escape(__version__)}</h1>"
        f"<p>Retrieval from Qdrant with cross-encoder reranking.</p><ul>\n{items}\n</ul>"
        "</body></html>\n"
    )
