"""What the storage actor's batches are made of: a request, the actor's counts, and the
exceptions a batch raises inside the worker thread (`_actor`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, TypeVar

import attrs
import trio

from ..records.errors import StorageError, StorageLost, StorageUnavailable
from ._sqlite import FileGone
from ._tx import Tx

log = logging.getLogger("loom.storage")

CONFLICT_RETRIES = 12
"""How many times a batch that raced another node runs again before its requests run one at a time
(`one_by_one`), each as many times again before it fails as a storage error."""


P = ParamSpec("P")
R = TypeVar("R")

Procedure = Callable[Concatenate[Tx, int, P], R]
FaultHook = Callable[[str, int], None]
"""Called in the worker thread at ``"before_commit"`` and ``"after_commit"`` with the batch number."""


class CrashPoint(BaseException):
    """Raised by a fault hook to stop the storage actor as a process kill would."""


@attrs.define(eq=False)
class Request:
    proc: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    done: trio.Event = attrs.field(factory=trio.Event)
    ok: bool = False
    value: Any = None
    error: BaseException | None = None
    read: bool = False
    """A read (`StorageActor.read`): it changes nothing, so a batch of reads alone publishes nothing."""
    relaxed: bool = False
    """Its writes need not outlive a power loss (`StorageActor.submit_relaxed`)."""


@attrs.define(kw_only=True)
class StorageStats:
    batches: int = 0
    requests: int = 0
    largest_batch: int = 0
    failed_batches: int = 0
    reads: int = 0
    """Reads served alone, apart from any batch (`StorageActor.read`)."""
    relaxed_batches: int = 0
    """Batches committed without waiting for the disk (`StorageActor.submit_relaxed`)."""
    guarded_reruns: int = 0
    """Batches that met a failing request (or step) unguarded and ran again guarded."""
    conflict_reruns: int = 0
    """Batches that met a conflict (another node's write, a lock, a prepared statement the server
    lost) and ran again."""
    split_batches: int = 0
    """Batches that lost every run to other nodes and ran one request at a time (`one_by_one`)."""


class StorageFailure(Exception):
    def __init__(self, cause: BaseException, *, lost: bool = False, in_commit: bool = False) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.lost = lost
        self.in_commit = in_commit

    @property
    def kind(self) -> type[StorageError]:
        """What its callers are answered: `StorageLost` once the file is gone or corrupt for good."""
        return StorageLost if isinstance(self.cause, FileGone) else StorageError


class Resync(BaseException):
    """A relaxed batch found something to settle: it runs again, waiting for the disk."""


class Conflict(Exception):
    """The batch raced another writer and was rolled back whole: run it again."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def one_by_one(
    run: Callable[[list[Request], int, int | None], tuple[list[Any], bool]],
    batch: list[Request],
    now_ms: int,
    batch_no: int | None,
    stats: StorageStats,
    where: str,
) -> list[Any]:
    """Run a batch that kept racing other nodes (each run lost a deadlock, or a row, to one of them)
    one request per transaction (``run``: one with its own retries; answers its notices): a small
    transaction holds few locks, and other nodes' batches get through between them. A request that
    still cannot commit fails alone, and the others' commits stand; one that loses the connection
    fails with the rest (``where``: the store, for their errors)."""
    stats.split_batches += 1
    log.warning("a batch of %d requests lost every run to other nodes: one request at a time", len(batch))
    notices: list[Any] = []
    for index, request in enumerate(batch):
        try:
            notices += run([request], now_ms, batch_no)[0]
        except StorageFailure as failure:
            if not failure.lost:
                _failed(request, StorageError(f"storage failed; this request was not committed: {failure}"))
                continue
            for left in batch[index:]:  # (the next batch reconnects)
                how = "may or may not have" if failure.in_commit and left is request else "was not"
                lost = f"the connection to {where} was lost; this request {how} committed"
                _failed(left, StorageUnavailable(f"{lost} (the storage actor reconnects): {failure}"))
            break
    return notices


def _failed(request: Request, error: StorageError) -> None:
    request.ok = False
    request.value = None
    request.error = error
