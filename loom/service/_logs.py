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
from datetime import UTC, datetime

from ..records.errors import InvalidRequest

FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
ACCESS_FORMAT = '%(h)s "%(r)s" %(s)s %(b)s %(D)sus'
"""Hypercorn's access line: client, request line, status, bytes sent, microseconds."""


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
