"""The operator's compaction route (``POST /compact``, ``loom compact``): one sweep now, or a dry run
that says what it would remove (docs/http-api.md, docs/operations.md)."""

from __future__ import annotations

from starlette.responses import Response

from ..kernel.compaction import DEFAULT_LIMIT
from ..records.compaction import COUNTS
from ..records.serde import unstructure
from ._ops import Call, Service
from ._schemas import INTEGER, obj
from ._wire import Field, json_response

COMPACT_FIELDS = (
    Field("dry_run", "boolean", doc="say what the sweep would remove, and remove nothing"),
    Field(
        "limit",
        "integer",
        nullable=True,
        doc=f"rows each pass looks at per kind of row (default {DEFAULT_LIMIT})",
        schema={"minimum": 1, "maximum": 10_000},
    ),
)


COMPACTED = obj(
    **{name: INTEGER for name in (*COUNTS, "kept", "released_bytes", "removed")},
    more={"type": "boolean"},
    dry_run={"type": "boolean"},
)
"""The answer: what the sweep removed (or would), per kind of row (`CompactionReport`)."""


async def compact(s: Service, call: Call) -> Response:
    limit = call.body.get("limit")
    report = await s.rt.compact(
        DEFAULT_LIMIT if limit is None else limit, dry_run=bool(call.body.get("dry_run", False))
    )
    return json_response({**unstructure(report), "removed": report.removed})
