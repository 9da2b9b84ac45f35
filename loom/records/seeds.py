"""Random seeds for lease tokens, drawn by the actors that ask for claims (procedures take them as
arguments and stay deterministic).

Every admission request carries a fresh seed (`kernel.admission.AdmitRequest.token_seed`), and most
requests start nothing, so a seed must cost next to nothing: they are cut from random bytes the system
gives in reads of `POOL_BYTES` (one ``getrandom`` call per 128 seeds rather than one per seed; on a
virtual machine each call costs about as much as the rest of a request's making). The bytes come from
the same source as ``secrets.token_urlsafe``'s, each used once: a child process forgets what its parent
had drawn (``os.register_at_fork``), so the two never cut the same seed.
"""

from __future__ import annotations

import base64
import os
import threading

SEED_BYTES = 32
"""Random bytes in a seed (its text is 43 URL-safe characters, as ``secrets.token_urlsafe(32)``'s)."""
POOL_BYTES = 4096
"""Random bytes read from the system at once."""

_lock = threading.Lock()
_pool = b""
_at = 0


def token_seed() -> str:
    """A fresh random seed as URL-safe text, never handed out before (in any thread or process)."""
    global _pool, _at
    with _lock:
        if _at + SEED_BYTES > len(_pool):
            _pool, _at = os.urandom(POOL_BYTES), 0
        chunk = _pool[_at : _at + SEED_BYTES]
        _at += SEED_BYTES
    return base64.urlsafe_b64encode(chunk).rstrip(b"=").decode("ascii")


def _forget() -> None:
    """In a child process: draw anew (what the parent drew is the parent's)."""
    global _pool, _at, _lock
    _lock = threading.Lock()  # (a lock held by another thread at the fork stays held in the child)
    _pool, _at = b"", 0


os.register_at_fork(after_in_child=_forget)
