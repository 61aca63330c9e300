"""The body guard, one for every route that reads a body, run before any handler: the media
type, then the body limits (`server/limits.py`), then the route's type held strictly, then the
route's own limits. Litestar converts a handler's `data` leniently (`0` for `false`, `"5"` for
`5`); checked strictly first, with JSON Schema's one allowance (`5.0` is an integer), what the
OpenAPI schema says is what the server accepts."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import anyio
import msgspec
from litestar.exceptions import HTTPException, ValidationException
from litestar.status_codes import HTTP_415_UNSUPPORTED_MEDIA_TYPE

from ragrank.errors import InvalidRequestError
from server.limits import check_limits, decode_body

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from litestar import Request

    from ragrank.settings import Settings

_PATH = re.compile(r" - at (?:`key` in )?`\$\.?([^`]*)`$")
#: Bodies above this are checked in a worker thread, so the event loop keeps answering.
_THREAD_FROM_BYTES = 256 * 1024


def strict_body(settings: Settings) -> Callable[[Request[Any, Any, Any]], Awaitable[None]]:
    """A `before_request` hook: a 415 for a body that is not JSON by its media type, a 400
    naming the field, the limit and its variable for one past a limit or off its type; all
    before any model work."""

    async def hook(request: Request[Any, Any, Any]) -> None:
        data = request.route_handler.parsed_fn_signature.parameters.get("data")
        if data is None:
            return
        _check_media_type(request.content_type[0])
        body = await request.body()  # over RAGRANK_MAX_REQUEST_BYTES: a 413; cached for Litestar
        if not body or body.isspace():
            raise InvalidRequestError("the request needs a JSON body")
        if len(body) < _THREAD_FROM_BYTES:
            _check(body, data.annotation, settings)
        else:
            await anyio.to_thread.run_sync(_check, body, data.annotation, settings)

    return hook


def _check_media_type(media_type: str) -> None:
    """JSON only, by its media type. A browser sends `text/plain`, a form or no type across
    origins without asking the server first; taking those as JSON would let any web page
    write to a server on its visitor's network."""
    if media_type == "application/json" or (
        media_type.startswith("application/") and media_type.endswith("+json")
    ):
        return
    got = f"got {media_type!r}" if media_type else "got none"
    raise HTTPException(
        status_code=HTTP_415_UNSUPPORTED_MEDIA_TYPE,
        detail=f"Content-Type: the body must be sent as application/json, {got}",
    )


def _check(body: bytes, kind: Any, settings: Settings) -> None:
    value = decode_body(body, settings)
    try:
        typed = msgspec.convert(value, type=kind, strict=True)
    except msgspec.ValidationError:
        typed = _strict_with_integral_floats(value, kind)
    check_limits(typed, settings)


def _strict_with_integral_floats(value: Any, kind: Any) -> Any:
    """`value` as `kind`, strictly, once integral floats are ints; a 400 naming the field."""
    try:
        return msgspec.convert(_integral_floats_as_ints(value), type=kind, strict=True)
    except msgspec.ValidationError as exc:
        message = str(exc)
        path = _PATH.search(message)
        raise ValidationException(
            detail="invalid request body",
            extra=[{"message": _PATH.sub("", message), "key": path.group(1) if path else ""}],
        ) from None


def _integral_floats_as_ints(value: Any) -> Any:
    """Recursive, as the body's depth is already bounded (RAGRANK_MAX_JSON_DEPTH)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_integral_floats_as_ints(item) for item in value]
    if isinstance(value, dict):
        return {key: _integral_floats_as_ints(item) for key, item in value.items()}
    return value
