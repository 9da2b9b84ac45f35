"""Derived identifiers: stable functions of their inputs (no randomness in procedures)."""

from __future__ import annotations

import hashlib

from .validation import MAX_ID_LEN


def stable_id(prefix: str, *parts: str) -> str:
    digest = hashlib.blake2b("\x00".join(parts).encode(), digest_size=12).hexdigest()
    return f"{prefix}_{digest}"


def event_id(source: str, delivery_id: str) -> str:
    """An Event's id follows from its delivery identity, so a replay names the same Event."""
    return stable_id("ev", source, delivery_id)


def core_delivery_id(kind: str, *parts: str) -> str:
    """The delivery id of an Event loom makes itself: ``kind/part/...``, or, where the ids it names make
    that longer than an Event's delivery id may be, its first characters and a digest of the whole
    (stable: the same parts always give the same id, so a repeated request finds its first Event)."""
    whole = "/".join((kind, *parts))
    if len(whole) <= MAX_ID_LEN:
        return whole
    digest = hashlib.blake2b(whole.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()
    return f"{whole[: MAX_ID_LEN - len(digest) - 1]}~{digest}"
