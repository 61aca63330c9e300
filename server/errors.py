"""One map from exceptions to JSON error bodies `{"error": {"code", "message", "field"?}}`."""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Any

from litestar import MediaType, Request, Response
from litestar.exceptions import HTTPException, ValidationException
from litestar.status_codes import (
    HTTP_400_BAD_REQUEST,
    HTTP_413_REQUEST_ENTITY_TOO_LARGE,
    HTTP_429_TOO_MANY_REQUESTS,
    HTTP_500_INTERNAL_SERVER_ERROR,
    HTTP_503_SERVICE_UNAVAILABLE,
    HTTP_504_GATEWAY_TIMEOUT,
)

from ragrank.errors import (
    ClientDisconnectedError,
    EngineUnavailableError,
    InvalidRequestError,
    ItemTooLargeError,
    JobQueueError,
    JobQueueUnavailableError,
    ModelError,
    ModelLoadError,
    QueueFullError,
    RagrankError,
    RequestTimeoutError,
    StoreError,
)
from ragrank.ids import DOC_ID_PATTERN
from ragrank.settings import env_name
from server.metrics import ERRORS
from server.routes.shared import NON_BLANK, ErrorDetail, ErrorResponse

if TYPE_CHECKING:
    from collections.abc import Callable

log = logging.getLogger("ragrank.server")

_NAMED_FIELD = re.compile(r"field `([^`]+)`")
_HTTP_CODES = {
    400: "invalid_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
    429: "too_many_requests",
}


def _error(
    status: int,
    code: str,
    message: str,
    field: str | None = None,
    headers: dict[str, str] | None = None,
) -> Response[Any]:
    ERRORS.labels(status=str(status), code=code).inc()
    body = ErrorResponse(error=ErrorDetail(code=code, message=message, field=field), detail=message)
    return Response(body, status_code=status, media_type=MediaType.JSON, headers=headers)


def validation_error(_: Request[Any, Any, Any], exc: ValidationException) -> Response[Any]:
    """Litestar's body validation (msgspec types with limits) → 400 naming the field."""
    problems = exc.extra if isinstance(exc.extra, list) else []
    first = problems[0] if problems and isinstance(problems[0], dict) else {}
    message = str(first.get("message") or exc.detail)
    field = str(first.get("key") or "")
    if field in ("", "data"):
        # Unknown and missing fields are reported on the whole body; msgspec names them.
        named = _NAMED_FIELD.search(message)
        field = named.group(1) if named else ""
    field = field.removesuffix("[...]")
    message = message.replace(f"matching regex {NON_BLANK!r}", "with some non-whitespace text")
    message = message.replace(f"matching regex {DOC_ID_PATTERN!r}", "with no control characters")
    if field:
        message = f"{field}: {message}"
    return _error(HTTP_400_BAD_REQUEST, "invalid_request", message, field or None)


def invalid_request(_: Request[Any, Any, Any], exc: InvalidRequestError) -> Response[Any]:
    return _error(HTTP_400_BAD_REQUEST, exc.code, str(exc), exc.field)


def unavailable(_: Request[Any, Any, Any], exc: RagrankError) -> Response[Any]:
    log.warning("service unavailable: %s", exc)
    return _error(HTTP_503_SERVICE_UNAVAILABLE, exc.code, str(exc))


def job_queue_unavailable(
    _: Request[Any, Any, Any], exc: JobQueueUnavailableError
) -> Response[Any]:
    """A shared queue's database is down or restarting: nothing was accepted, so the client
    retries; documents accepted earlier are safe in it."""
    log.warning("job queue unavailable: %s", exc)
    return _error(HTTP_503_SERVICE_UNAVAILABLE, exc.code, str(exc), headers={"Retry-After": "2"})


def queue_full(_: Request[Any, Any, Any], exc: QueueFullError) -> Response[Any]:
    return _error(
        HTTP_429_TOO_MANY_REQUESTS,
        exc.code,
        str(exc),
        headers={"Retry-After": str(exc.retry_after)},
    )


def _status(status: int) -> Callable[[Request[Any, Any, Any], RagrankError], Response[Any]]:
    """A handler answering `status` with the error's own code and message."""

    def handler(_: Request[Any, Any, Any], exc: RagrankError) -> Response[Any]:
        return _error(status, exc.code, str(exc))

    return handler


def http_error(_: Request[Any, Any, Any], exc: HTTPException) -> Response[Any]:
    code = _HTTP_CODES.get(exc.status_code, f"http_{exc.status_code}")
    return _error(exc.status_code, code, str(exc.detail), headers=exc.headers)


def body_too_large(limit: int) -> Callable[[Request[Any, Any, Any], Exception], Response[Any]]:
    """413 for a request body over `limit` bytes, naming the limit and its setting."""

    def handler(_: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
        return _error(
            HTTP_413_REQUEST_ENTITY_TOO_LARGE,
            "payload_too_large",
            f"the request body is over {limit:,} bytes ({env_name('max_request_bytes')})",
        )

    return handler


def internal_error(request: Request[Any, Any, Any], exc: Exception) -> Response[Any]:
    # The trace goes to the log only: clients never see paths, code or secrets.
    log.exception("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return _error(HTTP_500_INTERNAL_SERVER_ERROR, "internal_error", "internal server error")


EXCEPTION_HANDLERS: dict[type[Exception] | int, Any] = {
    ValidationException: validation_error,
    InvalidRequestError: invalid_request,
    StoreError: unavailable,
    ModelLoadError: unavailable,
    EngineUnavailableError: unavailable,
    JobQueueError: unavailable,
    JobQueueUnavailableError: job_queue_unavailable,
    QueueFullError: queue_full,
    RequestTimeoutError: _status(HTTP_504_GATEWAY_TIMEOUT),
    ItemTooLargeError: _status(HTTP_413_REQUEST_ENTITY_TOO_LARGE),
    ModelError: _status(HTTP_500_INTERNAL_SERVER_ERROR),
    # Nobody reads this answer; 499 (nginx's "client closed request") marks it in logs and metrics.
    ClientDisconnectedError: _status(499),
    HTTPException: http_error,
    Exception: internal_error,
}
