"""Request bodies are held to their declared types. Litestar converts a handler's `data` leniently
(`0` for `false`, `"5"` for `5`); this hook checks the body strictly first, with JSON Schema's
one allowance (`5.0` is an integer), so what the OpenAPI schema says is what the server
accepts."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

import msgspec
from litestar.exceptions import ValidationException

from server.limits import check_limits

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from litestar import Request

    from ragrank.settings import Settings

_PATH = re.compile(r" - at (?:`key` in )?`\$\.?([^`]*)`$")


def strict_body(settings: Settings) -> Callable[[Request[Any, Any, Any]], Awaitable[None]]:
    """A `before_request` hook: a 400 naming the field when the body breaks its type or one of
    the configured limits, before any model work."""

    async def hook(request: Request[Any, Any, Any]) -> None:
        data = request.route_handler.parsed_fn_signature.parameters.get("data")
        if data is None:
            return
        body = await request.body()  # cached: Litestar's own decoding reads it again
        try:
            try:
                typed = msgspec.json.decode(body, type=data.annotation, strict=True)
            except msgspec.ValidationError:
                # Only then walk the body in Python for JSON Schema's allowance (5.0 is an
                # integer). A typed decode can fail on the type before it sees malformed JSON
                # (`1` followed by junk), so the untyped decode there may still find it.
                typed = _strict_with_integral_floats(body, data.annotation)
        except msgspec.DecodeError:
            return  # not JSON at all: Litestar answers that itself
        check_limits(typed, settings)

    return hook


def _strict_with_integral_floats(body: bytes, kind: Any) -> Any:
    """`body` as `kind`, strictly, once integral floats are ints; a 400 naming the field."""
    try:
        return msgspec.convert(
            _integral_floats_as_ints(msgspec.json.decode(body)), type=kind, strict=True
        )
    except msgspec.ValidationError as exc:
        message = str(exc)
        path = _PATH.search(message)
        raise ValidationException(
            detail="invalid request body",
            extra=[{"message": _PATH.sub("", message), "key": path.group(1) if path else ""}],
        ) from None


def _integral_floats_as_ints(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_integral_floats_as_ints(item) for item in value]
    if isinstance(value, dict):
        return {key: _integral_floats_as_ints(item) for key, item in value.items()}
    return value
