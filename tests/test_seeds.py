"""Lease-token seeds (`loom.records.seeds.token_seed`) are cut from random bytes read in bulk: each one
fresh, in the form ``secrets.token_urlsafe(32)`` gives, and a forked child never cuts the seeds its
parent cuts next.

Catches: a cut that does not move on (the same seed twice: two claims' tokens derived alike), a seed
shorter than 32 random bytes, and a pool a child inherits and cuts from as its parent does (the two
processes' next seeds equal).
"""

from __future__ import annotations

import os
import re

from loom.records import seeds


def test_each_seed_is_fresh_url_safe_text_of_32_random_bytes() -> None:
    drawn = [seeds.token_seed() for _ in range(3 * seeds.POOL_BYTES // seeds.SEED_BYTES + 7)]
    assert len(set(drawn)) == len(drawn), "a seed was handed out twice"
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{43}", seed) for seed in drawn), drawn[:3]


def test_a_forked_child_never_cuts_its_parents_next_seed() -> None:
    seeds.token_seed()  # (the pool holds bytes the child inherits)
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child process
        try:
            os.write(writer, seeds.token_seed().encode())
        finally:
            os._exit(0)
    os.close(writer)
    parents = seeds.token_seed()
    with os.fdopen(reader, "rb") as pipe:
        childs = pipe.read().decode()
    os.waitpid(child, 0)
    assert len(childs) == 43
    assert childs != parents, "the child cut the seed its parent cut next"
