"""Logging for every ragrank process: one JSON object per line (for log pipelines) or plain text
(for people at a terminal), each record carrying the request id of the request it belongs to."""

from __future__ import annotations

import importlib
import json
import logging
import sys
from contextlib import suppress
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


class RequestIdFilter(logging.Filter):
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
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    _adopt_library_loggers()
    # faiss announces at INFO which of its CPU builds it loaded.
    logging.getLogger("faiss.loader").setLevel(logging.WARNING)


#: Libraries whose loggers get a console handler of their own when their logging module is
#: imported: huggingface_hub's (which also propagates, so each of its download retries printed
#: twice, once plain and once as JSON) and transformers' (which does not propagate, so its
#: warnings never reached the configured format). Imported here so that they are adopted
#: before any model loads.
_SELF_HANDLED = ("huggingface_hub.utils.logging", "transformers.utils.logging")


def _adopt_library_loggers() -> None:
    """Route every library logger through the root's one handler: drop the console handlers
    libraries gave their own loggers, and let their records propagate."""
    for module in _SELF_HANDLED:
        with suppress(ImportError):
            importlib.import_module(module)
    for logger in list(logging.Logger.manager.loggerDict.values()):
        if not isinstance(logger, logging.Logger):
            continue
        console = [h for h in logger.handlers if _writes_to_console(h)]
        if console:
            for console_handler in console:
                logger.removeHandler(console_handler)
            logger.propagate = True


def _writes_to_console(handler: logging.Handler) -> bool:
    """A plain stream handler, as libraries add (a file handler is a subclass, and stays)."""
    return type(handler) is logging.StreamHandler
