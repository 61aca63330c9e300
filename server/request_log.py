"""A request id for every request (the client's `X-Request-ID` when it is sane, else a new one),
returned in the response's `X-Request-ID`, attached to every log record written while the
request is handled, and one structured log line per request."""

from __future__ import annotations

import logging
import re
import time
import uuid
from typing import TYPE_CHECKING

from litestar.datastructures import MutableScopeHeaders
from litestar.enums import ScopeType

from ragrank.logs import REQUEST_ID

if TYPE_CHECKING:
    from litestar.types import ASGIApp, Message, Receive, Scope, Send

HEADER = "x-request-id"
_SANE = re.compile(r"[A-Za-z0-9._:-]{1,128}")

log = logging.getLogger("ragrank.requests")


def _incoming(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == HEADER.encode():
            text = value.decode("latin-1")
            return text if _SANE.fullmatch(text) else None
    return None


def request_id_middleware(app: ASGIApp) -> ASGIApp:
    """The outermost middleware: everything inside it, error handlers included, sees the id."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != ScopeType.HTTP:
            await app(scope, receive, send)
            return
        method = scope["method"]
        request_id = _incoming(scope) or uuid.uuid4().hex
        token = REQUEST_ID.set(request_id)
        status = 500  # if no response starts, the client got nothing: count it as a failure
        started = time.perf_counter()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                MutableScopeHeaders.from_message(message)[HEADER] = request_id
            await send(message)

        try:
            await app(scope, receive, send_with_id)
        finally:
            client = scope.get("client")
            log.info(
                "%s %s %d",
                method,
                scope["path"],
                status,
                extra={
                    "method": method,
                    "path": scope["path"],
                    "status": status,
                    "duration_ms": round((time.perf_counter() - started) * 1000, 2),
                    "client": client[0] if client else None,
                },
            )
            REQUEST_ID.reset(token)

    return middleware
