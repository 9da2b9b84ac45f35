"""Who may use ``loom serve`` (docs/http-api.md "Access"): the host names it answers to, which
browser pages may change anything, and the operator token.

* **Host.** A request whose ``Host`` header names a host this server does not serve is refused
  (421) before anything runs: a page on another domain that re-points its DNS name at this
  machine (DNS rebinding) reads nothing. A server on a loopback address serves its loopback names;
  one on another address also its own address, its machine's host name, and ``--allow-host``.
* **Origin.** A request that can change state (every method but GET and HEAD) made by a browser
  page of another origin is refused (403): ``Sec-Fetch-Site`` must be ``same-origin`` or ``none``
  and ``Origin``, when given, must be this server's own. Clients that are not browsers send
  neither header.
* **Token.** With an operator token (``--token-file``; required off loopback), every route but
  ``/healthz``, ``/openapi.json`` and the execution toolbelt (which has its lease tokens) needs
  ``Authorization: Bearer <token>`` (401 otherwise); the web view also takes it as the password of
  HTTP Basic authentication, which browsers ask for.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import socket
from collections.abc import Callable, Iterable, MutableMapping
from typing import Any
from urllib.parse import urlsplit

import attrs
from starlette.datastructures import Headers

from ._wire import FORBIDDEN, MISDIRECTED, UNAUTHORIZED, ErrorKind, error_body, json_response

Scope = MutableMapping[str, Any]
ASGIApp = Callable[..., Any]

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
ANY_HOST = "*"
SAFE_METHODS = frozenset({"GET", "HEAD"})


def is_loopback(host: str) -> bool:
    """Whether a listen host is this machine only (``localhost``, ``127.0.0.0/8``, ``::1``)."""
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def host_name(value: str) -> str:
    """The host of a ``Host`` header or an address, without its port or brackets, in lower case."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    name, sep, port = value.rpartition(":")
    if sep and port.isdigit() and ":" not in name:
        value = name
    return value.rstrip(".")


@attrs.frozen(kw_only=True)
class Access:
    """The access rules of one server: the host names it serves (``None``: any) and the operator
    token (``None``: none is required)."""

    hosts: frozenset[str] | None = LOOPBACK_NAMES
    token: str | None = attrs.field(default=None, repr=False)

    @classmethod
    def for_listen(
        cls, listen_host: str, *, allow_hosts: Iterable[str] = (), token: str | None = None
    ) -> Access:
        """The rules for a server listening on ``listen_host``: its loopback names, and off loopback
        its own address and the machine's host name; ``allow_hosts`` adds names (``*``: any)."""
        extra = [host_name(name) for name in allow_hosts]
        if ANY_HOST in extra:
            return cls(hosts=None, token=token)
        hosts = set(LOOPBACK_NAMES) | {host_name(listen_host)}
        if not is_loopback(listen_host):
            hosts.add(socket.gethostname().lower())
        return cls(hosts=frozenset(hosts | set(extra)), token=token)


def _same(given: str, token: str) -> bool:
    return hmac.compare_digest(given.encode("utf-8", "replace"), token.encode())


def presented_token(headers: Headers) -> str | None:
    """The operator token of an ``Authorization`` header: Bearer, or the password of Basic."""
    scheme, _, credentials = headers.get("authorization", "").strip().partition(" ")
    credentials = credentials.strip()
    if scheme.lower() == "bearer":
        return credentials
    if scheme.lower() == "basic":
        try:
            decoded = base64.b64decode(credentials, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            return None
        return decoded.partition(":")[2]
    return None


class Guard:
    """ASGI middleware applying `Access` to every HTTP request before the app sees it. ``is_open``
    says which requests need no operator token."""

    def __init__(self, app: ASGIApp, *, access: Access, is_open: Callable[[Scope], bool]) -> None:
        self.app = app
        self.access = access
        self.is_open = is_open

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            refusal = self.refusal(scope, Headers(scope=scope))
            if refusal is not None:
                kind, message, field = refusal
                headers = None
                if kind is UNAUTHORIZED:
                    basic = str(scope.get("path", "")).startswith("/ui")
                    headers = {"WWW-Authenticate": 'Basic realm="loom"' if basic else 'Bearer realm="loom"'}
                response = json_response(error_body(kind, message, field), kind.status, headers=headers)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

    def refusal(self, scope: Scope, headers: Headers) -> tuple[ErrorKind, str, str | None] | None:
        host = headers.get("host")
        if host is None:
            return MISDIRECTED, "a Host header is required", "Host"
        if self.access.hosts is not None and host_name(host) not in self.access.hosts:
            served = ", ".join(sorted(self.access.hosts))
            return (
                MISDIRECTED,
                f"this server does not serve the host {host_name(host)[:100]!r} (it serves {served};"
                " loom serve --allow-host adds a name)",
                "Host",
            )
        if scope["method"] not in SAFE_METHODS:
            site = headers.get("sec-fetch-site")
            if site is not None and site not in ("same-origin", "none"):
                return FORBIDDEN, f"a {site} page may not change anything here (Sec-Fetch-Site)", "Origin"
            origin = headers.get("origin")
            if origin is not None and urlsplit(origin).netloc.lower() != host.strip().lower():
                return FORBIDDEN, f"a page of {origin[:100]!r} may not change anything here", "Origin"
        token = self.access.token
        if token is not None and not self.is_open(scope):
            given = presented_token(headers)
            if given is None or not _same(given, token):
                return (
                    UNAUTHORIZED,
                    "this server needs its operator token: Authorization: Bearer <token>",
                    "Authorization",
                )
        return None
