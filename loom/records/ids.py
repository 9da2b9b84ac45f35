"""Derived identifiers: stable functions of their inputs (no randomness in procedures)."""

from __future__ import annotations

import hashlib


def stable_id(prefix: str, *parts: str) -> str:
    digest = hashlib.blake2b("\x00".join(parts).encode(), digest_size=12).hexdigest()
    return f"{prefix}_{digest}"


def event_id(source: str, delivery_id: str) -> str:
    """An Event's id follows from its delivery identity, so a replay names the same Event."""
    return stable_id("ev", source, delivery_id)
