"""Logging for every ragrank process: one JSON object per line (for log pipelines) or plain text
(for people at a terminal), each record carrying the request id of the request it belongs to."""

from __future__ import annotations

import json
import logging
import sys
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

#: The id of the HTTP request handled in this context (set by the server's middleware).
REQUEST_ID: ContextVar[str | None] = ContextVar("ragrank_request_id", default=None)

# uvicorn adds `color_message`, a copy of the message with terminal colours.
_STANDARD = set(vars(logging.makeLogRecord({}))) | {
    "message",
    "asctime",
    "request_id",
    "color_message",
}


class _RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = REQUEST_ID.get()
        return True


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    """The request id (when there is one), then the fields passed as `extra=`."""
    request_id = getattr(record, "request_id", None)
    fields = {"request_id": request_id} if request_id else {}
    fields.update((k, v) for k, v in vars(record).items() if k not in _STANDARD)
    return fields


class JsonFormatter(logging.Formatter):
    """`{"ts", "level", "logger", "message", "request_id"?, ...extra fields, "exc"?}`."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(_fields(record))
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


class TextFormatter(logging.Formatter):
    """The usual one-line text, with the request id and extra fields appended."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extra = _fields(record)
        if extra and "\n" not in line:
            line += " " + " ".join(f"{k}={v}" for k, v in extra.items())
        return line


def configure_logging(log_format: str = "auto", level: str = "INFO") -> None:
    """Send every logger's records to stderr in `log_format` (`auto`: JSON unless stderr is a
    terminal) at `level` (both as `Settings` checked them)."""
    if log_format == "auto":
        log_format = "text" if sys.stderr.isatty() else "json"
    handler = logging.StreamHandler()
    handler.addFilter(_RequestIdFilter())
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # faiss announces at INFO which of its CPU builds it loaded.
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)
