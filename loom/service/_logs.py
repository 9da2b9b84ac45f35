"""How ``loom serve`` logs (docs/operations.md "Logs"): one line per event of interest, as text or as
JSON (``--log-format``), on stderr.

A JSON line holds ``time`` (ISO 8601 UTC), ``level``, ``logger`` and ``message``, and the exception
text when there is one; the access log (logger ``loom.service.access``) is one line per request at
info.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Awaitable, Callable, MutableMapping
from datetime import UTC, datetime
from typing import Any

from ..records.errors import InvalidRequest
from ._render import printable

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
access_log = logging.getLogger("loom.service.access")


def escaped(text: str) -> str:
    """``text`` as one line of printable characters: what a terminal does not show as itself written
    as its escape (`printable`: ``\\n``, ``\\x00``, ``\\u2028``), and a backslash and a double quote
    escaped too. A request's path and query are the client's to choose (``%0a`` decodes to a newline):
    written raw, one request could forge further log lines, or end the quoted request line early."""
    return printable(text.replace("\\", "\\\\").replace('"', '\\"'))


def request_target(scope: MutableMapping[str, Any]) -> str:
    """The path as decoded (what the routes read), and the query string as sent."""
    query = scope.get("query_string", b"")
    return str(scope.get("path", "")) + ("?" + query.decode("latin-1") if query else "")


class AccessLog:
    """ASGI middleware writing one access line per HTTP request, at info, once its answer is sent (or
    its client went away): client, request line, status, bytes sent, microseconds
    (``127.0.0.1:50312 "POST /events HTTP/1.1" 201 352 5780us``; ``-`` for an answer never begun),
    each field `escaped`, so that one request is one line whatever its path.
    Hypercorn's own access log is off: it writes a request twice when the client closes the
    connection as the answer ends."""

    def __init__(self, app: Callable[..., Awaitable[None]]) -> None:
        self.app = app

    async def __call__(self, scope: MutableMapping[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status: int | None = None
        size = 0

        async def sending(message: MutableMapping[str, Any]) -> None:
            nonlocal status, size
            if message["type"] == "http.response.start":
                status = int(message["status"])
            elif message["type"] == "http.response.body":
                size += len(message.get("body", b""))
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            client = scope.get("client")
            access_log.info(
                '%s "%s %s HTTP/%s" %s %s %dus',
                escaped(f"{client[0]}:{client[1]}") if client else "-",
                escaped(str(scope.get("method", "-"))),
                escaped(request_target(scope)),
                escaped(str(scope.get("http_version", "1.1"))),
                status if status is not None else "-",
                size if status is not None else "-",
                (time.perf_counter() - started) * 1_000_000,
            )


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def configure_logging(log_level: str | int, log_format: str = "text") -> None:
    """Log loom's records at ``log_level`` and above to stderr, as ``text`` or ``json`` lines."""
    level = log_level if isinstance(log_level, int) else logging.getLevelName(str(log_level).upper())
    if not isinstance(level, int):
        raise InvalidRequest(
            f"log_level must be debug, info, warning or error, got {log_level!r}", field="log_level"
        )
    if log_format not in FORMATS:
        raise InvalidRequest(f"log_format must be text or json, got {log_format!r}", field="log_format")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):  # one handler: a record is written once
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(max(level, logging.INFO) if level > logging.DEBUG else level)
    logging.getLogger("loom").setLevel(level)
