"""The error hierarchy: one base, each subclass also its matching builtin.

Messages name the object and the reason; callers can catch either the loom class
or the builtin it extends.
"""

from __future__ import annotations


class LoomError(Exception):
    """Base of every error loom raises on purpose."""


class InvalidRequest(LoomError, ValueError):
    """Bad input: a malformed event, a bad argument. Nothing was changed.

    ``field`` names the bad field where the check knew it (``event.source``, ``limit``,
    ``event.payload.items[3]``), else ``None``; the message names it too.
    """

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class ConfigError(InvalidRequest):
    """A configuration was refused; the previous generation stays in force."""

    def __init__(self, message: str, *, file: str | None = None, key: str | None = None) -> None:
        where = ": ".join(part for part in (file, key) if part)
        super().__init__(f"{where}: {message}" if where else message)
        self.file = file
        self.key = key
        self.reason = message


class NotFound(LoomError, LookupError):
    """An unknown id."""


class Conflict(LoomError, RuntimeError):
    """A revision or ownership conflict; rereading and retrying may succeed."""


class IllegalTransition(Conflict):
    """A state change its record's lifecycle does not allow (``ready -> completed`` is fine,
    ``completed -> running`` never is). Nothing was changed."""


class StaleAuthority(LoomError, PermissionError):
    """A stale lease token, epoch or attempt: the caller lost its authority."""


class CausalRefused(LoomError, PermissionError):
    """Derived acceptance refused by the causal bounds (depth or per-minute rate).

    The refusal's redacted diagnostic was committed before this was raised.
    """

    def __init__(self, message: str, *, rejection: object | None = None) -> None:
        super().__init__(message)
        self.rejection = rejection


class NotAdoptable(LoomError, RuntimeError):
    """An executor could not verify a detached execution during recovery."""


class CallRefused(LoomError, PermissionError):
    """A call gate refused a toolbelt call: that is the call's result, and nothing changed."""

    def __init__(self, message: str, *, gate: str, operation: str) -> None:
        super().__init__(message)
        self.gate = gate
        self.operation = operation


class CallParked(LoomError, RuntimeError):
    """A call gate turned a toolbelt call into a wait: the call did not run, and the attempt is now
    parked on the gate's wait under its fence (its authority is released). Return from the execution;
    once woken, the attempt continues (resumed, or as its next attempt) and may make the call again,
    which the gate decides again."""

    def __init__(self, message: str, *, gate: str, operation: str, wait_id: str | None) -> None:
        super().__init__(message)
        self.gate = gate
        self.operation = operation
        self.wait_id = wait_id


class NotAccepting(LoomError, RuntimeError):
    """An executor definitely did not accept an injected input."""


class StorageError(LoomError, OSError):
    """The store failed (I/O error, disk full, a failed commit).

    Raised to every caller whose request was in the failed batch: none of their
    effects committed.
    """


class SchemaTooNew(StorageError):
    """The database was written by a newer loom; it was opened without writing."""


class StorageUnavailable(StorageError):
    """The connection to a shared database (PostgreSQL) was lost, say by a restart of the server.

    The batch in flight failed to every caller in it (if the connection was lost during its COMMIT,
    its outcome is unknown: acceptance is idempotent by ``(source, delivery_id)``, so offering again
    is safe); the storage actor reconnects with backoff, and background actors start again from the
    store once it is back.
    """


class StorageClosed(StorageError):
    """The storage actor is not running (stopped, or crashed at a fault point)."""


class StorageLost(StorageError):
    """The store takes no more writes, for good: its file was deleted, replaced or found corrupt while
    loom ran. A background actor that meets it stops the runtime; restore the file from a backup."""


class NodeInUse(LoomError, RuntimeError):
    """Another running loom holds this node name on the shared database: only one process may run
    under a node name (it recovers its previous incarnations' attempts at once, which must be dead)."""


class WaitTimedOut(LoomError, TimeoutError):
    """`Runtime.wait_for` gave up: the Work's outcome was not settled within the time it was given.
    ``result`` is the Work's outcome as it stood then."""

    def __init__(self, message: str, *, result: object) -> None:
        super().__init__(message)
        self.result = result
