"""The HTTP service's operations: what every handler receives (`Service`, `Call`) and how an
operation is described (`Op`, `Query`), with the request checks they share (docs/http-api.md)."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import aclosing, contextmanager
from typing import Any, TypeVar

import attrs
import trio
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from ..records.clock import ManualClock
from ..records.validation import MAX_KEY_LEN
from ..records.work import Lease
from ..runtime import Runtime
from ._access import Access
from ._metrics import Metrics
from ._wire import (
    BAD_REQUEST,
    FORBIDDEN,
    MAX_BODY_BYTES,
    MEDIA_TYPE,
    MISDIRECTED,
    NOT_FOUND,
    STALE,
    TOO_LARGE,
    UNAUTHORIZED,
    ErrorKind,
    Field,
    HTTPError,
)
from ._wire import INTERNAL as INTERNAL

T = TypeVar("T")


class Watches:
    """The open watch streams of one app, so that a stopping server ends them at once: their clients
    see the stream end cleanly instead of a connection cut when the grace period runs out."""

    def __init__(self) -> None:
        self._waits: set[trio.CancelScope] = set()
        self._ended = False

    @contextmanager
    def ending(self, wait: trio.CancelScope) -> Iterator[None]:
        """Within this block, `end` cancels ``wait``."""
        self._waits.add(wait)
        try:
            yield
        finally:
            self._waits.discard(wait)

    def ended(self) -> bool:
        return self._ended

    def end(self) -> None:
        self._ended = True
        for wait in self._waits:
            wait.cancel()


@attrs.define(kw_only=True)
class Service:
    """What every operation reaches: the runtime, the test clock (``None``: the wall clock), metrics."""

    rt: Runtime
    metrics: Metrics
    clock: ManualClock | None = None
    max_body: int = MAX_BODY_BYTES
    access: Access = attrs.field(factory=Access)
    stopping: trio.Event | None = None
    """Set once the server stops: a long-poll answers at once (``None``: it never stops early)."""
    watches: Watches = attrs.field(factory=Watches)


@attrs.frozen(kw_only=True)
class Call:
    request: Request
    body: dict[str, Any]
    lease: Lease | None = None
    items: list[tuple[str, Any]] | None = None
    """A batch's items, each named as a refusal names it (``line N``, ``item N``) with its decoded JSON
    (``None``: the body is one object), for an `Op` with ``batch``."""

    def path(self, name: str) -> str:
        return str(self.request.path_params[name])

    @property
    def query(self) -> Any:
        return self.request.query_params


Handler = Callable[[Service, Call], Awaitable[Response]]


@attrs.frozen(kw_only=True)
class Query:
    name: str
    kind: str
    doc: str
    choices: tuple[str, ...] = ()
    schema: dict[str, Any] = attrs.field(factory=dict)


@attrs.frozen(kw_only=True)
class Op:
    """One operation: its route, its inputs and the answers it documents."""

    method: str
    path: str
    handler: Handler
    summary: str
    tag: str
    query: tuple[Query, ...] = ()
    body: tuple[Field, ...] | None = None
    body_required: bool = True
    body_schema: dict[str, Any] = attrs.field(factory=dict)
    """More of the body's JSON Schema, for the OpenAPI document (rules across fields)."""
    prefixes: tuple[str, ...] = ()
    renames: dict[str, str] = attrs.field(factory=dict)
    """The runtime's argument names that the API calls otherwise (``after_id`` is ``after``)."""
    ok: tuple[int, ...] = (200,)
    answer: dict[str, Any] = attrs.field(factory=dict)
    """The JSON Schema of a successful answer (`_schemas`)."""
    errors: tuple[ErrorKind, ...] = ()
    auth: bool = False
    """The execution toolbelt: the bearer token of the execution's current lease."""
    public: bool = False
    """Open to every client that reaches the server, without the operator token (health, this document)."""
    media: str = "application/json"
    test_clock_only: bool = False
    batch: bool = False
    """The body may also be a batch: a JSON array, or JSON lines (``application/x-ndjson``)."""
    path_schemas: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    """The JSON Schema of a path parameter that is not an id (an attempt number)."""

    @property
    def openapi_path(self) -> str:
        return re.sub(r"\{(\w+):\w+\}", r"{\1}", self.path)

    @property
    def path_params(self) -> list[str]:
        return re.findall(r"\{(\w+)(?::\w+)?\}", self.path)

    @property
    def needs_operator_token(self) -> bool:
        return not (self.auth or self.public)

    def documented_errors(self, *, operator_token: bool = False) -> list[ErrorKind]:
        """Every refusal this operation can answer (``operator_token``: the server requires one)."""
        kinds = list(self.errors)
        if self.body is not None or self.query or self.path_params:
            kinds.append(BAD_REQUEST)
        if self.body is not None:
            kinds += [TOO_LARGE, MEDIA_TYPE]
        if self.auth:
            kinds += [UNAUTHORIZED, STALE]
        elif operator_token and self.needs_operator_token:
            kinds.append(UNAUTHORIZED)
        if self.method != "GET":
            kinds.append(FORBIDDEN)
        if self.test_clock_only:
            kinds.append(NOT_FOUND)
        kinds.append(MISDIRECTED)
        return kinds


# -- shared parsing ---------------------------------------------------------------------------------


def _json_media(content_type: str) -> bool:
    media, _, params = content_type.partition(";")
    media = media.strip().lower()
    if not (media == "application/json" or (media.startswith("application/") and media.endswith("+json"))):
        return False
    for param in params.split(";"):
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset" and value.strip().strip('"').lower() not in ("utf-8", "utf8"):
            return False
    return True


async def read_json_body(request: Request, limit: int, *, ndjson: bool = False) -> bytes:
    """The body of a request that must send JSON: `read_body`, refused with 415 when it declares
    another type, or has bytes and declares none (a browser sends a form or ``text/plain`` to any
    site without asking it first; JSON it sends only where the site allows it)."""
    content_type = request.headers.get("content-type")
    lines = ndjson and content_type is not None and content_type.partition(";")[0].strip().lower() in NDJSON
    if content_type is not None and not lines and not _json_media(content_type):
        raise HTTPError(
            MEDIA_TYPE,
            f"the body must be sent as Content-Type: application/json, not {content_type[:100]!r}",
            field="Content-Type",
        )
    raw = await read_body(request, limit)
    if raw and content_type is None:
        raise HTTPError(
            MEDIA_TYPE, "a body must be sent with Content-Type: application/json", field="Content-Type"
        )
    return raw


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused with 413 as soon as it is known to be longer than ``limit``."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > limit:
        raise HTTPError(TOO_LARGE, f"the body is {int(length)} bytes; the limit is {limit}")
    chunks: list[bytes] = []
    size = 0
    try:
        async with aclosing(request.stream()) as stream:
            async for chunk in stream:
                size += len(chunk)
                if size > limit:
                    raise HTTPError(TOO_LARGE, f"the body is larger than the limit of {limit} bytes")
                chunks.append(chunk)
    except ClientDisconnect:
        # the client went away, or stalled and was cut off (the server's read timeout): no one hears
        # this answer, and it is no fault of loom's
        raise HTTPError(BAD_REQUEST, "the connection closed before the whole body arrived") from None
    return b"".join(chunks)


NDJSON = ("application/x-ndjson", "application/jsonl", "application/jsonlines")
"""JSON lines: the media types of a batch body sent one JSON value a line."""

_TOKEN = re.compile(rf"[\x21-\x7e]{{1,{MAX_KEY_LEN}}}\Z")


def bearer_token(request: Request) -> str:
    """The bearer token of the ``Authorization`` header (never logged, never echoed)."""
    header = request.headers.get("authorization")
    if header is None:
        raise HTTPError(
            UNAUTHORIZED, "an Authorization: Bearer <token> header is required", field="Authorization"
        )
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not _TOKEN.match(token):
        raise HTTPError(
            UNAUTHORIZED,
            "the Authorization header must be 'Bearer <token>' with the execution's token",
            field="Authorization",
        )
    return token


def page(items: Sequence[T], limit: int, cursor: Callable[[T], object]) -> tuple[list[T], object]:
    """A page of at most ``limit`` items out of ``items`` (read with ``limit + 1``), and the cursor of the
    next page: the last item's when more remain, ``None`` when this is the last page."""
    more = len(items) > limit
    shown = list(items[:limit])
    return shown, (cursor(shown[-1]) if more and shown else None)
