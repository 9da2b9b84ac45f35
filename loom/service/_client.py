"""A small JSON client for a running ``loom serve`` (the CLI's server-talking commands).

Every failure a user can cause or meet (a server that is not running, a bad URL, an unknown Work, a
refused request) becomes a `UserError` with one line that says what happened; the CLI prints it and
exits non-zero. Errors from the server arrive as ``{"error", "field", "message"}``.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping
from typing import Any

from ._cli_base import DEFAULT_URL, UserError

__all__ = ["DEFAULT_URL", "Client", "UserError"]

TIMEOUT_S = 30.0


class Client:
    """Requests to a loom server at ``url``; answers are decoded JSON."""

    def __init__(
        self, url: str = DEFAULT_URL, *, timeout: float = TIMEOUT_S, token: str | None = None
    ) -> None:
        self.url = checked_url(url)
        self.timeout = timeout
        self._token = token
        """The server's operator token, sent as ``Authorization: Bearer`` (never printed)."""
        # a loom server is normally on this machine: do not send its requests through a proxy
        self._opener = urllib.request.build_opener(
            urllib.request.ProxyHandler({}), _HTTPHandler(), _HTTPSHandler()
        )

    def get(self, path: str, params: Mapping[str, object | None] | None = None) -> Any:
        return self._request("GET", path + _query(params), None)

    def post(
        self,
        path: str,
        body: Mapping[str, Any] | list[Any],
        *,
        max_bytes: int | None = None,
        what: str = "the request",
    ) -> Any:
        """``body`` sent as JSON; one of more than ``max_bytes`` (the server's limit for it) is
        refused before it is sent, as ``what``."""
        return self._request("POST", path, body, max_bytes=max_bytes, what=what)

    def text(self, path: str) -> str:
        """A route that answers text (``/metrics``)."""
        raw = self._open("GET", path, None, accept="text/plain", read=lambda r: r.read())
        return str(raw.decode("utf-8", errors="replace"))

    def stream(self, path: str, params: Mapping[str, object | None] | None = None) -> Iterator[str]:
        """The lines of a server-sent event stream as they arrive, until the server ends it."""
        request = self._build("GET", path + _query(params), None, accept="text/event-stream")
        try:
            response = self._opener.open(request, timeout=self.timeout)
        except (OSError, ValueError, http.client.HTTPException) as exc:
            raise self._failure(exc, "GET", path) from None
        with response:
            try:
                for raw in response:
                    yield raw.decode("utf-8", errors="replace").rstrip("\r\n")
            except (OSError, http.client.HTTPException) as exc:
                raise UserError(
                    f"the stream from the loom server at {self.url} stopped: {_one_line(exc)}"
                ) from None

    def _build(self, method: str, path: str, data: bytes | None, *, accept: str) -> urllib.request.Request:
        headers = {"Accept": accept, "Content-Type": "application/json"}
        if self._token is not None:
            headers["Authorization"] = f"Bearer {self._token}"
        return urllib.request.Request(self.url + path, data=data, method=method, headers=headers)

    def _failure(self, exc: Exception, method: str, path: str) -> UserError:
        if isinstance(exc, urllib.error.HTTPError):
            return UserError(_refusal(exc.code, exc.read()))
        if isinstance(exc, urllib.error.URLError):
            reason = exc.reason.strerror if isinstance(exc.reason, OSError) else exc.reason
            return UserError(f"cannot reach the loom server at {self.url}: {reason or exc}")
        if isinstance(exc, TimeoutError):
            return UserError(f"the loom server at {self.url} did not answer within {self.timeout:g}s")
        if isinstance(exc, http.client.HTTPException):  # what answered is no HTTP server
            said = f"{type(exc).__name__}: {_one_line(exc)}"
            return UserError(f"cannot talk to the loom server at {self.url}: it did not answer HTTP ({said})")
        return UserError(f"cannot talk to the loom server at {self.url}: {_one_line(exc)}")

    def _open(self, method: str, path: str, data: bytes | None, *, accept: str, read: Any) -> Any:
        request = self._build(method, path, data, accept=accept)
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                return read(response)
        except (OSError, ValueError, http.client.HTTPException) as exc:
            raise self._failure(exc, method, path) from None

    def _request(
        self,
        method: str,
        path: str,
        body: Mapping[str, Any] | list[Any] | None,
        *,
        max_bytes: int | None = None,
        what: str = "the request",
    ) -> Any:
        data = json.dumps(body).encode("utf-8") if body is not None else None
        if data is not None and max_bytes is not None and len(data) > max_bytes:
            raise UserError(
                f"{what} is too large to send: {len(data):,} bytes as JSON, over the server's limit of"
                f" {_size(max_bytes)}"
            )
        raw = self._open(method, path, data, accept="application/json", read=lambda r: r.read())
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise UserError(
                f"the server at {self.url} answered {method} {path} with something not JSON"
            ) from None


class _Connection(http.client.HTTPConnection):
    """An HTTP connection that reads the server's answer even when sending the request failed because
    the server stopped reading it: a server that refuses a body too large (413) answers before the
    body has arrived and closes the connection, and the client, still sending, meets a broken pipe
    (or a reset). The answer says why; without one, the failure to send is raised as it was."""

    _unsent: OSError | None = None

    def send(self, data: Any) -> None:
        if self._unsent is not None:
            return  # the rest of a body the server no longer reads
        try:
            super().send(data)
        except (BrokenPipeError, ConnectionResetError) as exc:
            self._unsent = exc

    def getresponse(self) -> http.client.HTTPResponse:
        try:
            return super().getresponse()
        except (OSError, http.client.HTTPException):
            if self._unsent is None:
                raise
            raise urllib.error.URLError(self._unsent) from None


class _HTTPSConnection(_Connection, http.client.HTTPSConnection):
    pass


class _HTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_Connection, req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_HTTPSConnection, req)


def _size(count: int) -> str:
    """A number of bytes, in MiB when it is a whole number of them: ``16 MiB (16,777,216 bytes)``."""
    mib = 1024 * 1024
    return f"{count // mib} MiB ({count:,} bytes)" if count % mib == 0 else f"{count:,} bytes"


def checked_url(url: str) -> str:
    """``url`` without its trailing ``/``, or `UserError` saying what is wrong with it: an http:// or
    https:// address naming a host, with a port from 1 to 65535 if it names one, and no user name or
    password (the operator token goes in --token-file), query, fragment, space or control character."""
    expected = f"--url must be an http:// address such as {DEFAULT_URL}"
    if any(ch.isspace() or not ch.isprintable() for ch in url):
        raise UserError(f"--url {url!r}: an address holds no space or control character")
    try:
        parsed = urllib.parse.urlsplit(url)
    except ValueError as exc:  # an unclosed or malformed [IPv6] host
        raise UserError(f"--url {url!r}: not a valid address ({exc})") from None
    if parsed.scheme not in ("http", "https") or not parsed.netloc:
        raise UserError(f"{expected}, got {url!r}")
    if "@" in parsed.netloc:  # (not echoed: it may hold a password)
        raise UserError("--url must not hold a user name or password (give the token with --token-file)")
    if not parsed.hostname:
        raise UserError(f"--url {url!r}: it names no host")
    try:
        port = parsed.port
    except ValueError:
        port = -1
    if (port is not None and not 1 <= port <= 65535) or parsed.netloc.endswith(":"):
        raise UserError(f"--url {url!r}: the port must be a number from 1 to 65535")
    if parsed.query or parsed.fragment or url.endswith(("?", "#")):
        raise UserError(f"--url {url!r}: an address takes no query or fragment (?... or #...)")
    return url.rstrip("/")


def _one_line(exc: Exception) -> str:
    """An error's text as one line (the HTTP client's may hold the raw line it was answered)."""
    return " ".join(str(exc).split())[:200] or type(exc).__name__


def _query(params: Mapping[str, object | None] | None) -> str:
    query = {key: str(value) for key, value in (params or {}).items() if value is not None}
    return f"?{urllib.parse.urlencode(query)}" if query else ""


def _refusal(status: int, raw: bytes) -> str:
    """One line for an error answer: the server's message (and the field it names)."""
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("message"), str):
        message: str = body["message"]
        field = body.get("field")
        if isinstance(field, str) and field and field not in message:
            message = f"{field}: {message}"
        return message
    text = raw.decode("utf-8", errors="replace").strip().splitlines()
    return f"the server answered HTTP {status}" + (f": {text[0][:200]}" if text else "")
