"""The operator token of ``loom serve``, kept in a file that the server and the command line read
(docs/http-api.md "Access"). Nothing of the HTTP server is imported here: the command line uses it."""

from __future__ import annotations

from pathlib import Path

from ..records.errors import InvalidRequest

MIN_TOKEN_LEN = 16


def read_token_file(path: str | Path) -> str:
    """The operator token kept in ``path`` (surrounding whitespace ignored); `InvalidRequest` naming
    ``token_file`` when it cannot be read or is too short to be a secret."""
    try:
        token = Path(path).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise InvalidRequest(f"cannot read the token file {path}: {reason}", field="token_file") from None
    if len(token) < MIN_TOKEN_LEN or not all("\x21" <= ch <= "\x7e" for ch in token):
        raise InvalidRequest(
            f"the token file {path} must hold one token of at least {MIN_TOKEN_LEN} printable ASCII"
            " characters without spaces (for example: python -c 'import secrets; print(secrets.token_urlsafe())')",
            field="token_file",
        )
    return token
