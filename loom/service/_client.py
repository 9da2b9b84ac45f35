"""A small JSON client for a running ``loom serve`` (the CLI's server-talking commands).

Every failure a user can cause or meet (a server that is not running, a bad URL, an unknown Work, a
refused request) becomes a `UserError` with one line that says what happened; the CLI prints it and
exits non-zero. Errors from the server arrive as ``{"error", "field", "message"}``.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8440"
TIMEOUT_S = 30.0


class UserError(Exception):
    """A failure the user can act on: the CLI prints its one line to stderr and exits non-zero."""


class Client:
    """Requests to a loom server at ``url``; answers are decoded JSON."""

    def __init__(
        self, url: str = DEFAULT_URL, *, timeout: float = TIMEOUT_S, token: str | None = None
    ) -> None:
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise UserError(f"--url must be an http:// address such as {DEFAULT_URL}, got {url!r}")
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._token = token
        """The server's operator token, sent as ``Authorization: Bearer`` (never printed)."""
        # a loom server is normally on this machine: do not send its requests through a proxy
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    def get(self, path: str, params: Mapping[str, object | None] | None = None) -> Any:
        query = {key: str(value) for key, value in (params or {}).items() if value is not None}
        return self._request("GET", path + (f"?{urllib.parse.urlencode(query)}" if query else ""), None)

    def post(self, path: str, body: Mapping[str, Any]) -> Any:
        return self._request("POST", path, body)

    def _request(self, method: str, path: str, body: Mapping[str, Any] | None) -> Any:
        data = json.dumps(body).encode("utf-8") if body is not None else None
        headers = {"Accept": "application/json", "Content-Type": "application/json"}
        if self._token is not None:
            headers["Authorization"] = f"Bearer {self._token}"
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with self._opener.open(request, timeout=self.timeout) as response:
                raw = response.read()
        except urllib.error.HTTPError as exc:
            raise UserError(_refusal(exc.code, exc.read())) from None
        except urllib.error.URLError as exc:
            reason = exc.reason.strerror if isinstance(exc.reason, OSError) else exc.reason
            raise UserError(f"cannot reach the loom server at {self.url}: {reason or exc}") from None
        except TimeoutError:
            raise UserError(
                f"the loom server at {self.url} did not answer within {self.timeout:g}s"
            ) from None
        except (OSError, ValueError) as exc:
            raise UserError(f"cannot talk to the loom server at {self.url}: {exc}") from None
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise UserError(
                f"the server at {self.url} answered {method} {path} with something not JSON"
            ) from None


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
