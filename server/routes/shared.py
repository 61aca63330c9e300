"""What the feature modules share: the `domain` router each ends with, the `model` field every
vendor sends, a query's non-blank rule, the error envelope and the answers it documents, the API
version and Cohere's priority, and the wait for a model that gives up when its client leaves."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

from litestar import Router
from litestar.openapi import ResponseSpec
from msgspec import Meta, Struct

from ragrank.errors import ClientDisconnectedError

if TYPE_CHECKING:
    from collections.abc import Awaitable, Mapping, Sequence

    from litestar import Request
    from litestar.handlers import HTTPRouteHandler

#: A query must hold some non-whitespace text (a JSON Schema pattern is a search, not a match).
#: The whitespace is spelled out, not `\S`: Python's and JavaScript's `\s` differ (\x1c-\x1f,
#: \x85, \ufeff), and both the server and clients must read the pattern the same way.
NON_BLANK = (
    r"[^\t\n\x0b\x0c\r \x1c-\x1f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]"
)

#: The served model a request picks, by one of its names (RAGRANK_RERANK_MODELS,
#: RAGRANK_EMBED_MODELS) or its hub id; absent or unknown, the default (`server.services.pick`).
#: Under RAGRANK_MODEL_NAMES=strict the served schema lists the names as an enum once the models
#: are loaded (`server.openapi.write_models_into_schema`).
_MODEL_HELP = (
    "The served {role} model to use, by a name `/v1/models` lists or its hub id; absent, or a "
    "name no served model has (a vendor's, say): the default (the first served). A server run "
    "with RAGRANK_MODEL_NAMES=strict answers an unknown name with a 400 listing the served ones."
)
RerankerName = (
    Annotated[
        str,
        Meta(
            max_length=256,
            description=_MODEL_HELP.format(role="reranking"),
            extra={"served_models": "rerank"},
        ),
    ]
    | None
)
EmbedderName = (
    Annotated[
        str,
        Meta(
            max_length=256,
            description=_MODEL_HELP.format(role="embedding"),
            extra={"served_models": "embedding"},
        ),
    ]
    | None
)


class ErrorDetail(Struct, frozen=True, kw_only=True, omit_defaults=True):
    code: str
    message: str
    field: str | None = None


class ErrorResponse(Struct, frozen=True, kw_only=True):
    error: ErrorDetail
    detail: Annotated[
        str,
        Meta(description="`error.message` again, where Jina's and FastAPI-style clients read it."),
    ]


def domain(
    *handlers: HTTPRouteHandler,
    tags: Sequence[str] = (),
    responses: Mapping[int, ResponseSpec] | None = None,
    path: str = "/",
) -> Router:
    """One domain's routes: the path, the OpenAPI tags and the error answers its handlers share,
    declared once (a handler's own `responses` add to the shared ones). A route module ends with
    `router = domain(...)`, and the app factory registers it in one line."""
    for handler in handlers:
        handler.responses = {**(responses or {}), **(handler.responses or {})}
    return Router(path=path, tags=list(tags), route_handlers=list(handlers))


def error_responses(*statuses: int) -> dict[int, ResponseSpec]:
    """OpenAPI entries for the error answers a route can give, all `ErrorResponse`."""
    return {
        status: ResponseSpec(data_container=ErrorResponse, description=ERROR_DESCRIPTIONS[status])
        for status in statuses
    }


ERROR_DESCRIPTIONS = {
    400: "The body or a field breaks a limit, a type or an id rule: the error names the field, "
    "the limit and its variable.",
    401: "An API key is configured and the request carries no valid one.",
    403: "The API key is read-only and the route writes.",
    404: "No such job.",
    413: "The body is over the server's size limit, or an input is too large for the device.",
    415: "The body is not sent as `application/json`.",
    429: "The model's queue is full; retry after `Retry-After` seconds.",
    500: "An unexpected failure; the body holds no internals.",
    503: "Qdrant, a model or the job queue is unavailable; retry after `Retry-After` seconds "
    "where given.",
    504: "The request waited longer than the server's request timeout.",
}
#: What every route that runs a model can answer besides 200.
MODEL_ERRORS = error_responses(400, 401, 413, 415, 429, 500, 503, 504)


CoherePriority = Annotated[
    int | None, Meta(description="Cohere's scheduling priority: accepted and ignored.")
]


class ApiVersion(Struct, frozen=True, kw_only=True):
    version: str = "2"


TruncationDirection = Literal["Left", "Right", "left", "right"] | None

_Result = TypeVar("_Result")


async def unless_disconnected(request: Request[Any, Any, Any], work: Awaitable[_Result]) -> _Result:
    """Await `work`, cancelling it if the client disconnects first; the batching engines then
    drop its queued items. (Litestar does not cancel handlers on disconnect by itself.)"""
    task = asyncio.ensure_future(work)

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    watcher = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        # Wait for the cancellation to land, so the work's queued items are dropped before the
        # answer goes out rather than on some later turn of the loop.
        await asyncio.wait({task})
        raise ClientDisconnectedError("the client disconnected before the answer was ready")
    return task.result()
