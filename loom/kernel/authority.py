"""Fenced authority: what every call from a running execution presents, and its check.

A lease's expiry is exclusive: at ``now == expires_at`` it has lost authority. A stale
token, epoch or attempt raises `StaleAuthority` and changes nothing.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

import attrs

from ..records.errors import StaleAuthority
from ..records.validation import check_lease
from ..records.work import Execution, ExecutionState, Lease
from ..store import Tx


@attrs.frozen(kw_only=True)
class Authority:
    """What a fenced call presents."""

    execution_id: str
    attempt: int
    epoch: int
    token: str

    @classmethod
    def of(cls, lease: Lease) -> Authority:
        """What ``lease`` presents (`InvalidRequest` when it is not a well-formed `Lease`)."""
        check_lease("lease", lease)
        return cls(
            execution_id=lease.execution_id, attempt=lease.attempt, epoch=lease.epoch, token=lease.token
        )


def same_token(stored: str, presented: str) -> bool:
    """Whether ``presented`` is the stored token, compared in constant time (a token is a secret)."""
    return hmac.compare_digest(
        stored.encode("utf-8", "surrogatepass"), presented.encode("utf-8", "surrogatepass")
    )


def authorize(tx: Tx, now_ms: int, auth: Authority) -> Execution:
    """The execution, if ``auth`` still holds its lease; else `StaleAuthority`."""
    execution = tx.execution(auth.execution_id)
    if execution is None:
        raise StaleAuthority(f"execution {auth.execution_id!r} does not exist")
    if execution.attempt != auth.attempt:
        raise StaleAuthority(
            f"execution {execution.id}: attempt {auth.attempt} is not attempt {execution.attempt}"
        )
    if execution.state is not ExecutionState.RUNNING:
        raise StaleAuthority(f"execution {execution.id} is {execution.state}: its authority ended")
    if execution.epoch != auth.epoch:
        raise StaleAuthority(
            f"execution {execution.id}: epoch {auth.epoch} is stale (current {execution.epoch})"
        )
    stored = tx.execution_token(execution.id)
    if stored is None or not same_token(stored, auth.token):
        raise StaleAuthority(f"execution {execution.id}: the token is not the current lease's")
    if execution.expires_at_ms is None or now_ms >= execution.expires_at_ms:
        raise StaleAuthority(f"execution {execution.id}: its lease expired at {execution.expires_at_ms}")
    return execution


def authorize_recovery(tx: Tx, now_ms: int, auth: Authority) -> Execution:
    """The attempt, if ``auth`` holds its recovery-in-progress authority (a recoverer's lease over an
    expired attempt, while its executor verifies it); else `StaleAuthority`."""
    execution = tx.execution(auth.execution_id)
    if execution is None or execution.attempt != auth.attempt:
        raise StaleAuthority(f"execution {auth.execution_id!r}: no attempt {auth.attempt}")
    if execution.state is not ExecutionState.RECOVERING:
        raise StaleAuthority(f"execution {execution.id} is {execution.state}, not being recovered")
    stored = tx.execution_token(execution.id)
    if execution.epoch != auth.epoch or stored is None or not same_token(stored, auth.token):
        raise StaleAuthority(
            f"execution {execution.id}: epoch {auth.epoch} is stale (current {execution.epoch})"
        )
    if execution.expires_at_ms is None or now_ms >= execution.expires_at_ms:
        raise StaleAuthority(
            f"execution {execution.id}: its recovery lease expired at {execution.expires_at_ms}"
        )
    return execution


def lease_token(seed: str, index: int) -> str:
    """The ``index``-th lease token of a pass that drew the secret ``seed``: as unpredictable as the
    seed, and derived, so a procedure that hands out many leases needs no randomness of its own."""
    digest = hashlib.blake2b(str(index).encode(), key=seed.encode()[:64], digest_size=24).digest()
    return base64.urlsafe_b64encode(digest).decode()
