"""Arbitrary values at every public entry: bad input is refused with a `LoomError`, stores nothing, and
the runtime goes on.

Each example opens a runtime on a fresh file store with a little state (a route creating Work for
``order.*`` in ``shop``, an accepted and routed Event, its Work, a claimed lease and its toolbelt, an
armed timer and a due one), then makes a few calls chosen from the whole public surface (host API,
reads, controls, timers, executions and waits, the toolbelt, ``Config.from_dict`` and
``Config.from_toml`` with ``reload``, ``watch``; a public `Runtime` method without an entry fails). The
arguments are mostly good values with one or two hostile ones: text with lone surrogates or control
characters, too-long or padded strings, integers outside 64 bits, bools, nan, strings where integers
belong, payloads with non-string keys, 10,000 levels of nesting, sets, bytes, objects, sizes at the
limits, ``None`` and wrong record types. For every call:

1. it returns, or raises a `loom.LoomError` subclass whose message is printable text; any builtin
   error (``TypeError``, ``RecursionError``, ``OverflowError``, ``UnicodeEncodeError``,
   ``sqlite3.IntegrityError``, ``AttributeError`` ...) fails the test, naming the call. This catches
   an entry that forwards an unchecked value to ``json.dumps``, SQLite, ``attrs`` or a dict lookup.
2. when exactly one argument (or record field) was hostile and the call raised `InvalidRequest`, the
   message names that field, unless the same call with a good value in its place is refused the same
   way (a hostile value can be valid, and the refusal about something else). This catches a refusal
   that says only "bad value".
3. when it raised, the database is row for row what it was (every table, read through a separate
   read-only connection), except the redacted diagnostic a causal refusal commits on purpose and the
   ``due`` cursor. This catches a check made after a first write, or a procedure whose failure is not
   rolled back.
4. afterwards a good Event with a fresh delivery id is accepted and can be read back. This catches an
   input that stops the storage actor (`StorageClosed`) or wedges acceptance.

Fixed bugs and the limits still open are pinned by the plain tests at the end of the module.
"""

from __future__ import annotations

import inspect
import math
import re
import sqlite3
import tempfile
import types
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

import loom
from loom.kernel.causal import REJECTIONS_NAMESPACE
from loom.records.validation import (
    FIRING_RESERVE_BYTES,
    MAX_PAYLOAD_BYTES,
    MAX_PAYLOAD_DEPTH,
    MAX_TIME_MS,
)
from loom.runtime._runtime import ACTORS
from loom.testing import T0_MS

SCOPE = "shop"
CONFIG = loom.Config.from_dict(
    {"scopes": {SCOPE: {"routes": [{"name": "orders", "types": ["order.*"], "create_work": True}]}}}
)

# -- markers: values built only when a call is made -------------------------------------------------
#
# Deep and huge values are built at call time from small markers, so neither hypothesis (drawing,
# shrinking, printing a falsifying example) nor the test itself ever recurses through them.


def nested(levels: int, kind: str = "dict") -> Any:
    """``levels`` nested objects (or arrays) around ``1``, built iteratively."""
    value: Any = 1
    for _ in range(levels):
        value = {"a": value} if kind == "dict" else [value]
    return value


def payload_of(size: int) -> dict[str, str]:
    """A payload whose canonical JSON is exactly ``size`` bytes: ``{"a": "xxx..."}``."""
    return {"a": "x" * (size - len('{"a":""}'))}


class Marker:
    def build(self, ctx: Ctx) -> Any:
        raise NotImplementedError


@attrs.frozen(repr=False)
class Ref(Marker):
    """A value of the example's fixture state (a real id, the lease, a due firing request)."""

    name: str

    def build(self, ctx: Ctx) -> Any:
        return ctx.refs[self.name]

    def __repr__(self) -> str:
        return f"<{self.name}>"


@attrs.frozen(repr=False)
class Deep(Marker):
    """``levels`` nested objects (or arrays) around ``1``, built iteratively."""

    levels: int
    kind: str = "dict"

    def build(self, ctx: Ctx) -> Any:
        return nested(self.levels, self.kind)

    def __repr__(self) -> str:
        return f"<{self.levels} nested {self.kind}s>"


@attrs.frozen(repr=False)
class Big(Marker):
    """A string of ``size`` characters."""

    size: int
    char: str = "x"

    def build(self, ctx: Ctx) -> str:
        return self.char * self.size

    def __repr__(self) -> str:
        return f"<{self.size} x {self.char!r}>"


@attrs.frozen(repr=False)
class Sized(Marker):
    """A payload whose canonical JSON is exactly ``size`` bytes: ``{"a": "xxx..."}``."""

    size: int

    def build(self, ctx: Ctx) -> dict[str, str]:
        return payload_of(self.size)

    def __repr__(self) -> str:
        return f"<payload of {self.size} bytes>"


@attrs.frozen(repr=False)
class Proxy(Marker):
    """A read-only mapping that is not a ``dict`` (``json.dumps`` cannot write one)."""

    inner: dict[str, Any]

    def build(self, ctx: Ctx) -> Any:
        return types.MappingProxyType(ctx.build(self.inner))

    def __repr__(self) -> str:
        return f"mappingproxy({self.inner!r})"


@attrs.frozen(repr=False)
class Bad(Marker):
    """A hostile value drawn for the field ``name`` (the rest of its record or call is good), with the
    good value drawn for it too."""

    name: str
    value: Any
    good: Any

    def build(self, ctx: Ctx) -> Any:
        if ctx.good:
            return ctx.build(self.good)
        ctx.hostile.append((ctx.param, self.name))
        return ctx.build(self.value)

    def __repr__(self) -> str:
        return f"{self.name}={self.value!r}!"


@attrs.frozen(repr=False)
class Rec(Marker):
    """A record (``EventIn``, ``TimerSpec``, ``Lease``, an outcome ...) built from drawn fields."""

    cls: Callable[..., Any]
    fields: dict[str, Any]

    def build(self, ctx: Ctx) -> Any:
        return self.cls(**{name: ctx.build(value) for name, value in self.fields.items()})

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.fields.items())
        return f"{getattr(self.cls, '__name__', self.cls)}({inner})"


@attrs.frozen(repr=False)
class LeaseWith(Marker):
    """The example's real lease with some fields replaced."""

    changes: dict[str, Any]

    def build(self, ctx: Ctx) -> loom.Lease:
        return attrs.evolve(ctx.refs["lease"], **{k: ctx.build(v) for k, v in self.changes.items()})

    def __repr__(self) -> str:
        return f"<lease with {self.changes!r}>"


class Opaque:
    """An object that is no kind of JSON data."""

    def __repr__(self) -> str:
        return "<object>"


@attrs.define
class Ctx:
    rt: loom.Runtime
    refs: dict[str, Any]
    good: bool = False
    """Build every hostile value's good counterpart instead."""
    param: str = ""
    """The argument being built."""
    hostile: list[tuple[str, str]] = attrs.field(factory=list)
    """(argument, field) of each hostile value built."""

    def arguments(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        built = {}
        for name, value in kwargs.items():
            self.param = name
            built[name] = self.build(value)
        return built

    def build(self, value: Any) -> Any:
        if isinstance(value, Marker):
            return value.build(self)
        if isinstance(value, dict):
            return {self.build(k): self.build(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self.build(v) for v in value]
        if isinstance(value, tuple):
            return tuple(self.build(v) for v in value)
        return value


# -- hostile values ---------------------------------------------------------------------------------

any_char = st.characters(exclude_categories=())  # lone surrogates and control characters included
SPECIAL_TEXT = [
    "",
    " ",
    " padded",
    "padded ",
    "\t",
    "\ud800",
    "a\udfffb",
    "\x00",
    "a\nb",
    "\x7f",
    "é",
    "😀",
    "a" * 200,
    "a" * 201,
    "a" * 500,
    "a" * 501,
    "a" * 2_000,
    "a" * 2_001,
]
NOT_TEXT: list[Any] = [None, 0, 5, True, 1.5, math.nan, b"bytes", ["a"], ("a",), {"a": 1}, Opaque()]
huge_text = st.sampled_from([Big(10_000), Big(MAX_PAYLOAD_BYTES + 1), Big(300, "\ud800")])
hostile_text = st.one_of(
    st.sampled_from(SPECIAL_TEXT), st.text(any_char, max_size=12), huge_text, st.sampled_from(NOT_TEXT)
)
SPECIAL_INTS: list[Any] = [
    0,
    -1,
    1,
    2**31,
    2**63 - 1,
    2**63,
    2**64,
    -(2**63),
    -(2**63) - 1,
    10**100,
    MAX_TIME_MS,
    MAX_TIME_MS + 1,
    T0_MS,
]
hostile_int = st.one_of(
    st.sampled_from(SPECIAL_INTS),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.booleans(),
    st.floats(),  # nan and infinities included
    st.sampled_from(["1", "", None, [1], Opaque()]),
)
names = st.from_regex(r"[a-z][a-z0-9_.-]{0,12}", fullmatch=True)


def ident(*refs: str) -> st.SearchStrategy[Any]:
    """An id to look up: one of the fixture's, a well-formed unknown one."""
    return st.one_of(st.sampled_from([Ref(r) for r in refs]), names) if refs else names


json_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**65), max_value=2**65),
    st.floats(),
    st.text(any_char, max_size=8),
    st.sampled_from(
        [
            b"bytes",
            frozenset({1}),
            Opaque(),
            Big(1_000, "\ud800"),
            Deep(MAX_PAYLOAD_DEPTH - 1),
            Deep(MAX_PAYLOAD_DEPTH),
            Deep(10_000),
            Deep(10_000, "list"),
            Proxy({"a": 1}),
        ]
    ),
)
json_keys = st.one_of(st.text(any_char, max_size=6), st.sampled_from([1, None, True, 1.5, ("a",), "\ud800"]))
json_ish = st.recursive(
    json_leaves,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(json_keys, inner, max_size=3), st.tuples(inner)
    ),
    max_leaves=6,
)
good_payload = st.one_of(
    st.just({}), st.dictionaries(st.text(max_size=5), st.integers(0, 9) | st.text(max_size=5), max_size=3)
)
hostile_payload = st.one_of(
    st.dictionaries(json_keys, json_ish, max_size=3),
    st.sampled_from(
        [
            None,
            [],
            "payload",
            5,
            Deep(MAX_PAYLOAD_DEPTH),
            Deep(MAX_PAYLOAD_DEPTH + 1),
            Deep(10_000),
            Proxy({"a": 1}),
            Sized(MAX_PAYLOAD_BYTES),
            Sized(MAX_PAYLOAD_BYTES + 1),
            Sized(MAX_PAYLOAD_BYTES - FIRING_RESERVE_BYTES),
            Sized(MAX_PAYLOAD_BYTES - FIRING_RESERVE_BYTES + 1),
        ]
    ),
)


@st.composite
def mixed(
    draw: st.DrawFn, fields: dict[str, tuple[st.SearchStrategy[Any], st.SearchStrategy[Any]]]
) -> dict[str, Any]:
    """Each field good, except none, one or two drawn from their hostile strategy (marked `Bad`)."""
    hostile = draw(st.sets(st.sampled_from(sorted(fields)), max_size=2)) if fields else set()
    return {
        name: Bad(name, draw(bad), draw(good)) if name in hostile else draw(good)
        for name, (good, bad) in fields.items()
    }


def record(
    cls: Callable[..., Any], fields: dict[str, tuple[st.SearchStrategy[Any], st.SearchStrategy[Any]]]
) -> st.SearchStrategy[Any]:
    return mixed(fields).map(lambda drawn: Rec(cls, drawn))


def opt(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), strategy)


def event_in() -> st.SearchStrategy[Any]:
    return record(
        loom.EventIn,
        {
            "source": (st.sampled_from(["fuzz", "shop"]), hostile_text),
            "delivery_id": (names, hostile_text),
            "type": (st.sampled_from(["order.placed", "order.paid", "fuzz.thing"]), hostile_text),
            "scope": (st.just(SCOPE), hostile_text),
            "key": (opt(st.sampled_from(["order/1", "order/9"])), hostile_text),
            "work_id": (opt(st.just(Ref("work"))), hostile_text),
            "payload": (good_payload, hostile_payload),
        },
    )


def timer_spec(**overrides: tuple[st.SearchStrategy[Any], st.SearchStrategy[Any]]) -> st.SearchStrategy[Any]:
    fields = {
        "id": (st.one_of(names, st.just(Ref("timer"))), hostile_text),
        "fire_at_ms": (st.sampled_from([T0_MS, T0_MS + 60_000]), hostile_int),
        "source": (st.just("fuzz"), hostile_text),
        "type": (st.sampled_from(["order.reminder", "fuzz.tick"]), hostile_text),
        "scope": (st.just(SCOPE), hostile_text),
        "key": (st.none(), hostile_text),
        "work_id": (st.none(), hostile_text),
        "payload": (good_payload, hostile_payload),
        "delivery_id": (opt(names), hostile_text),
        "interval_ms": (opt(st.sampled_from([1_000, 3_600_000])), hostile_int),
        "recurrence": (st.none(), hostile_text),
        "spec": (st.none(), st.one_of(hostile_payload, st.just({}))),
    }
    fields.update(overrides)
    return record(loom.TimerSpec, fields)


cron_spec = record(
    dict,
    {
        "schedule_id": (names, hostile_text),
        "cron": (st.sampled_from(["*/5 * * * *", "0 9 * * MON"]), hostile_text),
        "timezone": (st.sampled_from(["UTC", "Europe/Berlin"]), hostile_text),
        "catch_up_ms": (st.just(60_000), hostile_int),
    },
)
cron_timer = timer_spec(
    recurrence=(st.just("cron"), hostile_text),
    spec=(cron_spec, hostile_payload),
    interval_ms=(st.none(), hostile_int),
)

good_lease = st.just(Ref("lease"))
lease = st.one_of(
    st.just(Ref("lease")),
    st.just(Ref("lease")),
    mixed(
        {
            "execution_id": (st.just(Ref("execution")), hostile_text),
            "attempt": (st.just(1), hostile_int),
            "epoch": (st.just(1), hostile_int),
            "token": (names, hostile_text),
            "work_id": (st.just(Ref("work")), hostile_text),
            "request": (st.just(Ref("request")), st.sampled_from([None, "request", Opaque()])),
        }
    ).map(LeaseWith),
    st.sampled_from([None, "lease", Opaque()]),
)
wait_spec = st.one_of(
    record(
        loom.WaitSpec,
        {
            "keys": (st.just(("order/1",)), st.one_of(hostile_text, st.lists(hostile_text, max_size=2))),
            "types": (st.just(("order.*",)), st.one_of(hostile_text, st.lists(hostile_text, max_size=2))),
            "after_seq": (st.none(), hostile_int),
            "timeout_ms": (opt(st.just(60_000)), hostile_int),
        },
    ),
    st.sampled_from([None, "wait", Opaque()]),
)
usage = st.one_of(
    st.dictionaries(names, st.integers(0, 100) | st.floats(0, 10), max_size=2),
    st.dictionaries(json_keys, st.one_of(hostile_int, hostile_text), min_size=1, max_size=2),
    st.sampled_from([None, [], "usage"]),
)
consumed = st.one_of(
    st.just(()),
    st.lists(st.one_of(st.just(Ref("event")), names), max_size=2).map(tuple),
    st.lists(hostile_text, min_size=1, max_size=2),
    st.sampled_from([None, "ev_1", Opaque()]),
)
good_outcome = st.sampled_from([loom.Completed(), loom.Handoff(), loom.Failed(error="it broke")])
outcome = st.one_of(
    record(loom.Completed, {"consumed_inputs": (st.just(()), consumed), "usage": (st.just({}), usage)}),
    record(loom.Handoff, {"consumed_inputs": (st.just(()), consumed), "usage": (st.just({}), usage)}),
    record(
        loom.Failed,
        {
            "error": (st.just("it broke"), hostile_text),
            "retry_after_ms": (opt(st.just(1_000)), hostile_int),
            "consumed_inputs": (st.just(()), consumed),
            "usage": (st.just({}), usage),
        },
    ),
    record(
        loom.Waiting,
        {
            "wait": (st.just(Ref("wait_spec")), wait_spec),
            "consumed_inputs": (st.just(()), consumed),
            "usage": (st.just({}), usage),
            "artifacts": (st.just(()), st.one_of(hostile_text, st.lists(hostile_text, max_size=2))),
        },
    ),
    st.sampled_from([None, "completed", Opaque(), loom.Unmatched()]),
)
fire_request = st.one_of(
    st.just(Ref("fire_request")),
    record(
        loom.FireRequest,
        {
            "timer_id": (st.just(Ref("due_timer")), hostile_text),
            "revision": (st.just(1), hostile_int),
            "fire_at_ms": (st.just(T0_MS), hostile_int),
        },
    ),
    st.sampled_from([None, "fire", Opaque()]),
)
enum_like = st.one_of(
    st.sampled_from([None, "ready", "armed", loom.WorkState.READY, loom.TimerState.ARMED]), hostile_text
)

# -- configuration data -----------------------------------------------------------------------------

route = mixed(
    {
        "name": (st.sampled_from(["orders", "more"]), hostile_text),
        "types": (st.just(["order.*"]), st.one_of(hostile_text, st.lists(hostile_text, max_size=2))),
        "create_work": (st.booleans(), hostile_int),
        "policy": (st.sampled_from(["queue", "drop"]), hostile_text),
        "reason": (st.none(), hostile_text),
        "config": (good_payload, hostile_payload),
    }
).map(lambda fields: {k: v for k, v in fields.items() if v is not None})
scope_table = mixed(
    {
        "routes": (st.lists(route, max_size=2), st.one_of(hostile_payload, hostile_text)),
        "capacity": (st.just(4), hostile_int),
        "bindings": (
            st.just({}),
            st.dictionaries(
                json_keys, st.fixed_dictionaries({"executor": hostile_text, "config": hostile_payload})
            ),
        ),
    }
)
config_data = mixed(
    {
        "scopes": (
            st.dictionaries(st.sampled_from([SCOPE, "acme/web"]), scope_table, max_size=2),
            st.one_of(st.dictionaries(json_keys, scope_table, max_size=2), hostile_payload),
        ),
        "causal": (st.just({"max_depth": 8}), st.fixed_dictionaries({"max_depth": hostile_int})),
        "work_kinds": (
            st.just({}),
            st.dictionaries(
                json_keys,
                st.fixed_dictionaries({"retry_attempts": hostile_int, "trigger": hostile_text}),
                max_size=2,
            ),
        ),
    }
)

# -- the public entries -----------------------------------------------------------------------------

Entry = Callable[..., Awaitable[Any]]


async def _config(ctx: Ctx, *, data: Any, generation: Any) -> Any:
    config = loom.Config.from_dict(data, generation=generation)
    return ctx.rt.reload(config)


async def _toml(ctx: Ctx, *, text: str) -> Any:
    return ctx.rt.reload(loom.Config.from_toml(text))


TOML = [
    '[scopes.shop]\nroutes = [{name = "orders", types = ["order.*"], create_work = true}]',
    '[scopes.shop]\nroutes = [{name = "r", policy = "drop", reason = "spam"}]',
    "[causal]\nmax_depth = 8",
]
HOSTILE_TOML = [
    '[scopes.shop]\nroutes = [{name = "r", config = {when = 2026-01-01T00:00:00Z}}]',
    '[scopes.shop]\nroutes = [{name = "r", config = {n = 9223372036854775807}}]',
    '[scopes."a\\u0000b"]',
    '[scopes.shop]\nroutes = [{name = "r", policy = "drop", reason = "a\\u0000b"}]',
    "[work_kinds.k]\nretry_attempts = 1e3",
    "[causal]\nmax_depth = -1",
    "x = [" * 50 + "]" * 50,
    "[scopes",
]
toml_text = st.one_of(
    st.sampled_from(HOSTILE_TOML),
    st.text(any_char, max_size=40),
    st.sampled_from(TOML).flatmap(lambda t: st.text(any_char, max_size=3).map(lambda junk: t + junk)),
)


async def _toolbelt(ctx: Ctx, **kwargs: Any) -> None:
    await ctx.rt.toolbelt(**kwargs).heartbeat()


async def _watch(ctx: Ctx, *, capacity: Any) -> None:
    async with ctx.rt.watch(capacity=capacity):
        pass


ENTRIES: dict[str, tuple[Entry, st.SearchStrategy[dict[str, Any]]]] = {}


def entry(name: str, call: Entry, /, **params: tuple[st.SearchStrategy[Any], st.SearchStrategy[Any]]) -> None:
    ENTRIES[name] = (call, mixed(params))


def host(method: str, /, **params: tuple[st.SearchStrategy[Any], st.SearchStrategy[Any]]) -> None:
    async def call(ctx: Ctx, **kwargs: Any) -> Any:
        result = getattr(ctx.rt, method)(**kwargs)
        return await result if isinstance(result, Awaitable) else result

    entry(method, call, **params)


def tool(method: str, /, **params: tuple[st.SearchStrategy[Any], st.SearchStrategy[Any]]) -> None:
    async def call(ctx: Ctx, **kwargs: Any) -> Any:
        return await getattr(ctx.refs["toolbelt"], method)(**kwargs)

    entry(f"toolbelt.{method}", call, **params)


EVENT = ("event", "event2")  # the fixture's routed Event (the claimed attempt's trigger)
limit = (st.sampled_from([1, 10, 1_000]), hostile_int)
text_id = (names, hostile_text)

host("publish", event=(event_in(), st.sampled_from([None, "event", Opaque(), loom.Unmatched()])))
host("publish_routed", event=(event_in(), st.sampled_from([None, "event", Opaque(), loom.Unmatched()])))
host(
    "publish_many",
    events=(st.lists(event_in(), max_size=3), st.sampled_from([None, "event", [Opaque()], (None,), {}])),
)
host(
    "publish_derived",
    event=(event_in(), st.sampled_from([None, Opaque()])),
    parent_id=(ident(*EVENT), hostile_text),
    cause_id=(opt(ident(*EVENT)), hostile_text),
)
host("event", event_id=(ident(*EVENT), hostile_text))
host(
    "event_by_delivery",
    source=(st.just("shop"), hostile_text),
    delivery_id=(st.sampled_from(["o-1", "nope"]), hostile_text),
)
host(
    "events",
    after_seq=(st.sampled_from([0, 1]), hostile_int),
    limit=limit,
    root_id=(opt(ident(*EVENT)), hostile_text),
    type=(opt(st.just("order.placed")), hostile_text),
)
host("checkpoint", event_id=(ident(*EVENT), hostile_text))
host("work", work_id=(ident("work", "work2"), hostile_text))
host("work_for_key", key=(st.sampled_from(["order/1", "order/9"]), hostile_text))
host(
    "works",
    state=(st.none(), enum_like),
    scope=(opt(st.sampled_from([SCOPE, "shop/eu"])), hostile_text),
    after_id=(st.just(""), hostile_text),
    limit=limit,
)
cursor = (opt(st.tuples(st.sampled_from([0, T0_MS]), st.just("wk_0"))), st.one_of(hostile_int, hostile_text))
host(
    "works_changed",
    state=(st.none(), enum_like),
    scope=(opt(st.sampled_from([SCOPE, "shop/eu"])), hostile_text),
    key_prefix=(opt(st.just("order/")), hostile_text),
    before=cursor,
    limit=limit,
)
host("work_counts", scope=(opt(st.just(SCOPE)), hostile_text))
host(
    "events_newest",
    before_seq=(opt(st.just(2)), hostile_int),
    type=(opt(st.just("order.placed")), hostile_text),
    limit=limit,
)
host(
    "diagnostics_newest",
    kind=(opt(st.just("handler_error")), hostile_text),
    subject=(st.none(), hostile_text),
    before_id=(opt(st.just(5)), hostile_int),
    limit=limit,
)
host("timers_due", after=cursor, limit=limit)
host("schedules", after_id=(st.just(""), hostile_text), limit=limit)
host("history", work_id=(ident("work"), hostile_text), newest=(opt(st.sampled_from([1, 200])), hostile_int))
host("result", work_id=(ident("work", "work2"), hostile_text))
host("check", schedules=(st.booleans(), st.sampled_from([None, "yes", 1])))
hostile_seconds = st.one_of(hostile_int, st.sampled_from([-0.5, float("nan"), float("inf"), "1", True]))
host(
    "wait_for",
    work_id=(ident("work", "work2"), hostile_text),
    timeout=(st.sampled_from([0, 0.001]), hostile_seconds),
)
host(
    "wait_routed",
    event_id=(ident(*EVENT), hostile_text),
    timeout=(st.sampled_from([0, 0.001]), hostile_seconds),
)
host(
    "attempt_logs",
    work_id=(ident("work", "work2"), hostile_text),
    attempt=(st.sampled_from([1, 2]), hostile_int),
    stream=(opt(st.sampled_from(["stdout", "stderr"])), hostile_text),
    tail=(st.sampled_from([1, 100]), hostile_int),
)
host(
    "latest_diagnostics", subject=(ident("work"), hostile_text), limit=(st.sampled_from([1, 20]), hostile_int)
)
host("execution", execution_id=(ident("execution"), hostile_text))
host("intents", execution_id=(ident("execution"), hostile_text))
host(
    "diagnostics",
    kind=(opt(st.just("handler_error")), hostile_text),
    subject=(st.none(), hostile_text),
    after_id=(st.sampled_from([0, 5]), hostile_int),
    limit=limit,
)
host("kv", namespace=(st.just("core.timers"), hostile_text), limit=limit)
host("causal_rejections", limit=limit)
host(
    "budget_ledgers",
    budget=(opt(st.just("usd")), hostile_text),
    subject=(st.none(), hostile_text),
    limit=limit,
)
host("timer", timer_id=(ident("timer", "due_timer"), hostile_text))
host(
    "timers",
    state=(st.none(), enum_like),
    work_id=(opt(ident("work")), hostile_text),
    after_id=(st.just(""), hostile_text),
    limit=limit,
)
host(
    "firings",
    timer_id=(ident("timer", "due_timer"), hostile_text),
    newest=(opt(st.sampled_from([1, 200])), hostile_int),
)
host("arm", spec=(timer_spec(), st.sampled_from([None, "timer", Opaque()])))
host("arm", spec=(cron_timer, st.sampled_from([None, {}])))
ENTRIES["arm_cron"] = ENTRIES.pop("arm")
host("arm", spec=(timer_spec(), st.sampled_from([None, "timer", Opaque()])))
host(
    "arm_recurring",
    spec=(timer_spec(interval_ms=(st.just(60_000), hostile_int)), st.sampled_from([None, Opaque()])),
)
host(
    "arm_recurrence",
    kind=(st.just("cron"), hostile_text),
    spec=(cron_spec, hostile_payload),
    timer_id=text_id,
    fire_at_ms=(st.just(T0_MS + 60_000), hostile_int),
    source=(st.just("fuzz"), hostile_text),
    type=(st.just("fuzz.tick"), hostile_text),
    scope=(st.just(SCOPE), hostile_text),
    key=(st.none(), hostile_text),
    payload=(st.none(), hostile_payload),
)
host("cancel_timer", timer_id=(ident("timer", "due_timer"), hostile_text), revision=(st.just(1), hostile_int))
host("due", limit=limit)
host("fire", request=(fire_request, st.sampled_from([None, Opaque()])))
host("poll", limit=limit)
host("compact", limit=limit, dry_run=(st.booleans(), hostile_int))
host("hold", work_id=(ident("work", "work2"), hostile_text), reason=(st.just("by hand"), hostile_text))
host("release", work_id=(ident("work", "work2"), hostile_text))
host("cancel", work_id=(ident("work", "work2"), hostile_text))
host(
    "interrupt",
    work_id=(ident("work", "work2"), hostile_text),
    reason=(st.just("stop it"), hostile_text),
    request_id=(opt(names), hostile_text),
)
host(
    "replay",
    event_id=(ident(*EVENT), hostile_text),
    reason=(st.just("again"), hostile_text),
    request_id=(opt(names), hostile_text),
)
host(
    "claim",
    work_id=(ident("work", "work2"), hostile_text),
    owner=(st.just("host"), hostile_text),
    lease_ms=(st.just(30_000), hostile_int),
    binding=(st.none(), st.sampled_from(["fake", Opaque(), 5])),
)
host(
    "admit",
    limit=limit,
    owner=(opt(st.just("host")), hostile_text),
    lease_ms=(st.just(30_000), hostile_int),
)
host("renew", lease=(good_lease, lease), lease_ms=(st.just(30_000), hostile_int))
host(
    "lease_for",
    execution_id=(ident("execution"), hostile_text),
    token=(st.one_of(st.just(Ref("token")), names), hostile_text),
)
host("complete", lease=(good_lease, lease), outcome=(good_outcome, outcome))
host(
    "wait",
    lease=(good_lease, lease),
    spec=(st.one_of(st.none(), st.just(Ref("wait_spec"))), wait_spec),
    consumed_inputs=(st.just(()), consumed),
    usage=(st.none(), usage),
    artifacts=(st.just(()), st.one_of(hostile_text, st.lists(hostile_text, max_size=2))),
)
host("waits", work_id=(ident("work", "work2"), hostile_text))
host(
    "enrich_wait",
    lease=(good_lease, lease),
    usage=(st.none(), usage),
    artifacts=(st.just(()), st.one_of(hostile_text, st.lists(hostile_text, max_size=2))),
)
host("recover_expired", limit=limit, owner=(opt(st.just("host")), hostile_text))
host("adopt", lease=(good_lease, lease))
host("not_adoptable", lease=(good_lease, lease), reason=(st.just("no such process"), hostile_text))
host(
    "retry",
    work_id=(ident("work", "work2"), hostile_text),
    reason=(st.just("try again"), hostile_text),
    request_id=(opt(names), hostile_text),
)
subscription_spec = st.one_of(
    record(
        loom.SubscriptionSpec,
        {
            "namespace": (st.just("deps"), hostile_text),
            "id": (names, hostile_text),
            # keys neither fixture Work owns: a good spec is never refused for its source
            "source_key": (st.sampled_from(["order/9", "other/1"]), hostile_text),
            "source_scope": (st.none(), hostile_text),
            "types": (st.just(("order.*",)), st.one_of(hostile_text, st.lists(hostile_text, max_size=2))),
            "after": (st.just(0), hostile_int),
            "filter_name": (st.none(), hostile_text),
            "filter": (st.none(), hostile_payload),
            "label": (st.just(""), hostile_text),
        },
    ),
    st.sampled_from([None, "subscription", Opaque()]),
)
host(
    "subscribe",
    work_id=(ident("work", "work2"), hostile_text),
    spec=(subscription_spec, st.sampled_from([None, Opaque()])),
    dependent_key=(st.none(), hostile_text),
)
host("reconcile_subscriptions", limit=limit)
host("subscriptions", work_id=(ident("work", "work2"), hostile_text))
host("subscription", namespace=(st.just("deps"), hostile_text), id=(names, hostile_text))
host("reload", config=(st.just(CONFIG), st.sampled_from([None, {}, "loom.toml", Opaque()])))
# (a grace of 0 answers at once; the runtime then starts nothing more in that example, and the
# fixture's attempts are a host's, which no drain waits for)
host("drain", grace_s=(st.sampled_from([0, 0.0]), hostile_int))
not_an_actor = hostile_text.filter(lambda name: not (isinstance(name, str) and name in ACTORS))
host("run_actor", name=(not_an_actor, not_an_actor))  # (a real actor would run until cancelled)
entry("toolbelt", _toolbelt, lease=(good_lease, lease), lease_ms=(st.just(30_000), hostile_int))
entry("watch", _watch, capacity=(st.just(16), hostile_int))
entry("Config.from_dict", _config, data=(config_data, hostile_payload), generation=(st.just(1), hostile_int))
entry(
    "Config.from_toml", _toml, text=(st.sampled_from(TOML), toml_text)
)  # text only: the plain tests below pin the rest
tool(
    "emit", event=(event_in(), st.sampled_from([None, Opaque()])), cause_id=(opt(ident(*EVENT)), hostile_text)
)
tool(
    "create_child",
    name=(names, hostile_text),
    keys=(
        st.lists(st.sampled_from(["child/1", "child/2"]), max_size=2, unique=True),
        st.one_of(hostile_text, st.lists(hostile_text, max_size=3), st.just(["dup", "dup"])),
    ),
    kind=(st.none(), hostile_text),
)
tool("arm_timer", spec=(timer_spec(), st.sampled_from([None, Opaque()])))
tool("heartbeat")
tool("pin", metadata=(good_payload, hostile_payload))
tool("adopt")


@attrs.frozen(repr=False)
class Call:
    entry: str
    kwargs: dict[str, Any]

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items())
        return f"{self.entry}({args})"


calls = st.sampled_from(sorted(ENTRIES)).flatmap(
    lambda name: ENTRIES[name][1].map(lambda kwargs: Call(name, kwargs))
)

# -- the fixture state, the snapshot and the properties ---------------------------------------------


def order(n: int) -> loom.EventIn:
    return loom.EventIn(
        source="shop", delivery_id=f"o-{n}", type="order.placed", scope=SCOPE, key=f"order/{n}"
    )


async def fixture_state(rt: loom.Runtime) -> dict[str, Any]:
    e1 = await rt.publish(order(1))
    e2 = await rt.publish(order(2))
    await rt.poll(10)
    work = await rt.work_for_key("order/1")
    work2 = await rt.work_for_key("order/2")
    lease = await rt.claim(work.id, owner="host")
    timer = await rt.arm(
        loom.TimerSpec(id="later", fire_at_ms=T0_MS + 60_000, source="fuzz", type="fuzz.tick", scope=SCOPE)
    )
    due = await rt.arm(
        loom.TimerSpec(id="now", fire_at_ms=T0_MS, source="fuzz", type="fuzz.tick", scope=SCOPE)
    )
    return {
        "event": e1.id,
        "event2": e2.id,
        "work": work.id,
        "work2": work2.id,
        "execution": lease.execution_id,
        "lease": lease,
        "token": lease.token,
        "request": lease.request,
        "toolbelt": rt.toolbelt(lease),
        "timer": timer.id,
        "due_timer": due.id,
        "wait_spec": loom.WaitSpec(keys=("order/1",), types=("order.*",)),
        "fire_request": loom.FireRequest(timer_id=due.id, revision=due.revision, fire_at_ms=due.fire_at_ms),
    }


def snapshot(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, through a read-only connection of its own."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        tables = [name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        return {table: sorted(map(repr, conn.execute(f'SELECT * FROM "{table}"'))) for table in tables}
    finally:
        conn.close()


def changes(before: dict[str, list[Any]], after: dict[str, list[Any]]) -> Iterator[str]:
    for table in sorted(set(before) | set(after)):
        old, new = set(before.get(table, ())), set(after.get(table, ()))
        for row in sorted(new - old):
            yield f"{table} + {row[:200]}"
        for row in sorted(old - new):
            yield f"{table} - {row[:200]}"


def allowed(change: str, error: BaseException) -> bool:
    """A ``due`` cursor move, or the redacted diagnostic a causal refusal commits on purpose."""
    if change.startswith("kv ") and "'core.timers', 'due_cursor'" in change:
        return True
    return isinstance(error, loom.CausalRefused) and change.startswith(f"kv + ('{REJECTIONS_NAMESPACE}'")


def named(message: str, field: str) -> bool:
    """Whether a refusal's message names ``field`` (a record field, an argument, a config key)."""
    aliases = {
        "cause_id": ("cause",),
        "keys": ("key",),
        "spec": ("timer.", "spec"),
        "event": ("event", "EventIn"),
        "config": ("config", "Config"),
        "data": ("<dict>:",),  # Config.from_dict names its file, then the key path
        "text": ("<string>:",),
        "kind": ("kind", "recurrence"),
        "name": ("name", "actor"),
        "timer_id": ("timer_id", "timer.id"),
    }
    return any(word.lower() in message.lower() for word in (field, *aliases.get(field, ())))


def printable(message: str) -> bool:
    """A message that can be logged: non-empty text that encodes as UTF-8 (no lone surrogate)."""
    try:
        return bool(message.encode("utf-8"))
    except UnicodeEncodeError:
        return False


async def attempt(ctx: Ctx, call: Call) -> loom.LoomError | None:
    """Make ``call``: what it raised (``None``: it returned); a builtin error fails the test."""
    function, _ = ENTRIES[call.entry]
    kwargs = ctx.arguments(call.kwargs)
    try:
        await function(ctx, **kwargs)
    except loom.LoomError as exc:
        return exc
    except Exception as exc:
        raise AssertionError(
            f"{call!r} let a builtin {type(exc).__name__} escape: {str(exc)[:300]!r}"
        ) from exc
    return None


async def run_example(path: Path, plan: list[Call]) -> None:
    async with loom.open_runtime(
        str(path), clock=loom.ManualClock(start_ms=T0_MS), config=CONFIG, load_entry_points=False, actors=()
    ) as rt:
        refs = await fixture_state(rt)
        for i, call in enumerate(plan):
            ctx = Ctx(rt, refs)
            before = snapshot(path)
            error = await attempt(ctx, call)
            event(f"{call.entry}: {type(error).__name__ if error is not None else 'returned'}")
            if error is not None:
                message = str(error)
                assert printable(message), (
                    f"{call!r}: the message of {type(error).__name__} is not printable text"
                )
                leftovers = [c for c in changes(before, snapshot(path)) if not allowed(c, error)]
                assert not leftovers, f"{call!r} raised {error!r} but stored: {leftovers[:5]}"
                if isinstance(error, loom.InvalidRequest) and len(ctx.hostile) == 1:
                    argument, field = ctx.hostile[0]
                    if not (named(message, field) or named(message, argument)):
                        # a hostile value can be valid: then the same call with the good value is
                        # refused the same way, for a reason that is not this field
                        again = await attempt(Ctx(rt, refs, good=True), call)
                        assert (type(again), str(again)) == (type(error), message), (
                            f"{call!r} was refused without naming {field}: {message!r}"
                        )
            good = await rt.publish(
                loom.EventIn(source="fuzz-check", delivery_id=f"good-{i}", type="fuzz.check", scope=SCOPE)
            )
            assert not good.duplicate, f"after {call!r}"
            assert (await rt.event(good.id)).delivery_id == f"good-{i}", f"after {call!r}"


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
@given(plan=st.lists(calls, min_size=1, max_size=5))
def test_no_input_escapes_as_a_builtin_error_stores_partially_or_stops_the_runtime(
    tmp_path: Path, plan: list[Call]
) -> None:
    directory = Path(tempfile.mkdtemp(dir=tmp_path))
    trio.run(run_example, directory / "loom.db", plan)


NOT_FUZZED = {
    "wait_idle": "takes no arguments",
    "mark_time": "takes no arguments",
    "time_floor": "takes no arguments",
    "gauges": "takes no arguments",
    "store_size": "takes no arguments",
}


def test_every_public_entry_of_the_runtime_is_fuzzed() -> None:
    """A public method of `Runtime` without an entry above fails here: add one (with its arguments'
    good and hostile strategies), or say in ``NOT_FUZZED`` why it takes no input."""
    public = {name for name, _ in inspect.getmembers(loom.Runtime, callable) if not name.startswith("_")}
    assert public - set(ENTRIES) - set(NOT_FUZZED) == set()
    for name in ENTRIES:
        owner = loom.Toolbelt if name.startswith("toolbelt.") else loom.Runtime
        assert name in ("arm_cron", "Config.from_dict", "Config.from_toml") or hasattr(
            owner, name.removeprefix("toolbelt.")
        ), name


# -- the bugs the property found, one plain test each -----------------------------------------------


@pytest.mark.parametrize(
    ("data", "key"),
    [
        ({"scopes": {1: {}}}, "scopes.1"),
        ({"work_kinds": {None: {}}}, "work_kinds.None"),
        ({"scopes": {SCOPE: {"bindings": {("a",): {"executor": "x"}}}}}, "scopes.shop.bindings"),
    ],
)
def test_a_config_table_with_a_key_that_is_not_a_string_is_refused(data: dict[Any, Any], key: str) -> None:
    """It used to raise ``TypeError: expected string or bytes-like object`` while naming the key."""
    with pytest.raises(loom.ConfigError, match="keys must be strings") as info:
        loom.Config.from_dict(data)
    assert str(info.value.key).startswith(key)


@pytest.mark.parametrize("where", ["route", "binding", "scopes"])
def test_config_data_nested_ten_thousand_levels_deep_is_refused(where: str) -> None:
    """It used to raise ``RecursionError`` (copying the data, then checking an opaque table)."""
    scope: dict[str, Any] = {
        "route": {"routes": [{"name": "r", "config": {"a": nested(10_000)}}]},
        "binding": {"bindings": {"b": {"executor": "x", "config": nested(10_000)}}},
        "scopes": nested(10_000),
    }[where]
    with pytest.raises(loom.ConfigError, match="nested more than"):
        loom.Config.from_dict({"scopes": {SCOPE: scope}})


def test_an_opaque_config_table_is_held_to_the_payload_nesting_limit() -> None:
    fits = nested(MAX_PAYLOAD_DEPTH - 1)
    config = loom.Config.from_dict({"scopes": {SCOPE: {"routes": [{"name": "r", "config": {"a": fits}}]}}})
    assert config.scopes[SCOPE].routes[0].config["a"] == fits
    with pytest.raises(loom.ConfigError, match=f"nested more than {MAX_PAYLOAD_DEPTH}") as info:
        loom.Config.from_dict({"scopes": {SCOPE: {"routes": [{"name": "r", "config": {"a": [fits]}}]}}})
    assert str(info.value.key).startswith("scopes.shop.routes[0].config.a")


def test_a_read_only_mapping_in_config_data_is_read_as_a_table() -> None:
    """It used to raise ``TypeError: cannot pickle 'mappingproxy' object`` (a deep copy of the data)."""
    proxy = types.MappingProxyType({"routes": [{"name": "r", "config": types.MappingProxyType({"a": 1})}]})
    config = loom.Config.from_dict({"scopes": {SCOPE: proxy}})
    assert config.scopes[SCOPE].routes[0].config == {"a": 1}


@pytest.mark.parametrize(
    ("value", "reason"),
    [(2**63, "within 64 bits"), ("\ud800", "valid Unicode"), ({"\udfff": 1}, "valid Unicode")],
)
def test_an_opaque_config_table_holds_only_json_a_payload_could_carry(value: Any, reason: str) -> None:
    """Such values used to be accepted, though no payload or record may carry them."""
    with pytest.raises(loom.ConfigError, match=reason) as info:
        loom.Config.from_dict({"scopes": {SCOPE: {"routes": [{"name": "r", "config": {"v": value}}]}}})
    assert str(info.value.key).startswith("scopes.shop.routes[0].config.v")
    assert printable(str(info.value))


@pytest.mark.parametrize(
    ("reason", "why"), [("\ud800", "Unicode"), ("a\x00b", "control"), ("a" * 2_001, "longer")]
)
async def test_a_drop_reason_the_kernel_would_refuse_is_refused_in_config(reason: str, why: str) -> None:
    """It used to be accepted; then every Event the route matched stayed unrouted (``routing_failed``)."""
    data = {
        "scopes": {
            SCOPE: {"routes": [{"name": "r", "types": ["order.*"], "policy": "drop", "reason": reason}]}
        }
    }
    with pytest.raises(loom.ConfigError, match=why) as info:
        loom.Config.from_dict(data)
    assert info.value.key == "scopes.shop.routes[0].reason"
    assert printable(str(info.value))
    fine = loom.Config.from_dict(
        {"scopes": {SCOPE: {"routes": [{"name": "r", "policy": "drop", "reason": "spam"}]}}}
    )
    assert fine.scopes[SCOPE].routes[0].reason == "spam"


def test_a_config_error_naming_a_key_that_is_not_valid_unicode_is_printable() -> None:
    """The key path used to carry the lone surrogate itself, so logging the error raised
    ``UnicodeEncodeError``."""
    with pytest.raises(loom.ConfigError) as info:
        loom.Config.from_dict({"scopes": {"\ud800": {}}})
    assert printable(str(info.value))
    assert info.value.key == 'scopes."\\ud800"'


@attrs.define
class Fixture:
    rt: loom.Runtime
    path: Path
    refs: dict[str, Any]

    def snapshot(self) -> dict[str, list[Any]]:
        return snapshot(self.path)


@pytest.fixture
async def fx(tmp_path: Path) -> Any:
    path = tmp_path / "loom.db"
    async with loom.open_runtime(
        str(path), clock=loom.ManualClock(start_ms=T0_MS), config=CONFIG, load_entry_points=False, actors=()
    ) as rt:
        yield Fixture(rt, path, await fixture_state(rt))


async def refused(fx: Fixture, field: str, call: Awaitable[Any]) -> loom.InvalidRequest:
    """``call`` raises `InvalidRequest` naming ``field``, stores nothing, and a good Event goes in after."""
    before = fx.snapshot()
    with pytest.raises(loom.InvalidRequest, match=re.escape(field)) as info:
        await call
    assert fx.snapshot() == before
    await fx.rt.publish(
        loom.EventIn(source="t", delivery_id=f"after-{field}", type="fuzz.check", scope=SCOPE)
    )
    return info.value


async def test_reload_with_something_that_is_not_a_config_is_a_config_error(fx: Fixture) -> None:
    """It used to raise ``attrs.exceptions.NotAnAttrsClassError``."""
    for junk in (None, {"scopes": {}}, "loom.toml"):
        with pytest.raises(loom.ConfigError, match="expected a Config"):
            fx.rt.reload(junk)  # type: ignore[arg-type]
    assert fx.rt.config.generation == 1


@pytest.mark.parametrize("capacity", [-1, 0, 0.0, "16", None, 2**70])
async def test_watch_capacity_must_be_a_positive_integer(fx: Fixture, capacity: Any) -> None:
    """``-1`` used to raise ``ValueError``, ``0.0`` and ``"16"`` ``TypeError`` (from trio); ``0`` made a
    watcher that lags at every batch."""
    with pytest.raises(loom.InvalidRequest, match="capacity"):
        fx.rt.watch(capacity=capacity)


async def test_arm_recurring_with_something_that_is_not_a_timer_spec(fx: Fixture) -> None:
    """It used to raise ``AttributeError: 'NoneType' object has no attribute 'interval_ms'``."""
    await refused(fx, "TimerSpec", fx.rt.arm_recurring(None))  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("spec", "payload", "field"),
    [(None, None, "timer.spec"), ({}, [], "timer.payload"), ({}, [("a", 1)], "timer.payload")],
)
async def test_arm_recurrence_takes_tables_only(fx: Fixture, spec: Any, payload: Any, field: str) -> None:
    """``spec=None`` and ``payload=[("a", 1)]`` used to raise ``TypeError``; ``payload=[]`` was armed
    as an empty payload."""
    call = fx.rt.arm_recurrence(
        "cron", spec, timer_id="t", fire_at_ms=T0_MS, source="s", type="a.b", scope=SCOPE, payload=payload
    )
    await refused(fx, field, call)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"consumed_inputs": 5}, "consumed_inputs"),
        ({"consumed_inputs": "ev_1"}, "consumed_inputs"),
        ({"artifacts": None}, "artifacts"),
        ({"usage": [("tokens", 1)]}, "usage"),
    ],
)
async def test_wait_takes_lists_and_a_table(fx: Fixture, kwargs: dict[str, Any], field: str) -> None:
    """``5``, ``None`` and a list for ``usage`` used to raise ``TypeError``; the string ``"ev_1"`` was
    split into the one-character event ids ``e``, ``v``, ``_``, ``1``."""
    await refused(fx, field, fx.rt.wait(fx.refs["lease"], **kwargs))


@pytest.mark.parametrize(("request_", "field"), [(None, "lease.request"), ("kind", "lease.request.kind")])
async def test_complete_with_a_lease_whose_request_is_malformed(
    fx: Fixture, request_: Any, field: str
) -> None:
    """A lease whose request is ``None`` used to raise ``AttributeError``, one whose request names an
    unhashable kind ``TypeError``."""
    lease: loom.Lease = fx.refs["lease"]
    bad = attrs.evolve(lease, request=None if request_ is None else attrs.evolve(lease.request, kind=["k"]))
    await refused(fx, field, fx.rt.complete(bad, loom.Completed()))
    assert (await fx.rt.execution(lease.execution_id)).state is loom.ExecutionState.RUNNING


async def test_create_child_with_a_key_twice_is_refused_and_stores_nothing(fx: Fixture) -> None:
    """It used to raise ``sqlite3.IntegrityError: UNIQUE constraint failed: work_keys.key``."""
    await refused(fx, "keys[1]", fx.refs["toolbelt"].create_child("c", keys=["child/1", "child/1"]))
    child = await fx.refs["toolbelt"].create_child("c", keys=["child/1"])
    assert child.keys == ("child/1",)


@pytest.mark.parametrize("payload", [types.MappingProxyType({"a": 1}), {"a": types.MappingProxyType({})}])
async def test_a_payload_mapping_that_is_not_a_dict_is_refused(fx: Fixture, payload: Any) -> None:
    """It used to pass validation, then raise ``TypeError: Object of type mappingproxy is not JSON
    serializable``."""
    event = loom.EventIn(source="t", delivery_id="m", type="a.b", scope=SCOPE, payload=payload)
    await refused(fx, "event.payload", fx.rt.publish(event))


@pytest.mark.parametrize(
    ("metadata", "why"),
    [(5, "JSON object"), (None, "JSON object"), (payload_of(MAX_PAYLOAD_BYTES + 1), "larger than")],
    ids=["int", "None", "too large"],
)
async def test_pinned_metadata_is_held_to_the_payload_rules(fx: Fixture, metadata: Any, why: str) -> None:
    """``5`` and ``None`` used to raise ``TypeError`` (``dict()`` of it); metadata of any size was stored."""
    error = await refused(fx, "metadata", fx.refs["toolbelt"].pin(metadata))
    assert why in str(error)


# -- limits once open: bad values met beyond the entry points -------------------------------------


def test_a_config_generation_outside_64_bits_is_refused() -> None:
    with pytest.raises(loom.ConfigError, match="generation"):
        loom.Config.from_dict({}, generation=2**63)


@pytest.mark.parametrize("rearmed", [False, True], ids=["recurring", "re-armed"])
async def test_a_timer_whose_firing_identity_would_be_too_long_is_refused_at_arm(
    fx: Fixture, rearmed: bool
) -> None:
    """A re-arm's firing identity is ``{id}@r{revision}``, a recurring one's ``{id}@{occurrence_ms}``:
    an id with no room for the suffix is refused at its first arm, naming the id."""
    spec = loom.TimerSpec(id="t" * 200, fire_at_ms=T0_MS, source="s", type="a.b", scope=SCOPE)
    if not rearmed:
        spec = attrs.evolve(spec, interval_ms=60_000)
    with pytest.raises(loom.InvalidRequest, match=r"timer\.id is longer than 176"):
        await fx.rt.arm(spec)
    fitting = attrs.evolve(spec, id="t" * 176)
    timer = await fx.rt.arm(fitting)
    if rearmed:
        timer = await fx.rt.arm(attrs.evolve(fitting, payload={"changed": True}))
    firing = await fx.rt.fire(loom.FireRequest(timer_id=timer.id, revision=timer.revision, fire_at_ms=T0_MS))
    assert firing.result is loom.FiringResult.ACCEPTED, firing.detail


@pytest.mark.parametrize("recurs", ["once", "interval", "cron"])
async def test_a_timer_payload_at_its_limit_is_armed_and_fires(fx: Fixture, recurs: str) -> None:
    """The size a timer's payload may have at arm leaves room for what its firing adds; a byte more is
    refused at arm, naming the payload."""
    how: dict[str, Any] = {
        "once": {},
        "interval": {"interval_ms": 60_000},
        "cron": {"recurrence": "cron", "spec": {"schedule_id": "s" * 150, "cron": "*/5 * * * *"}},
    }[recurs]
    limit = MAX_PAYLOAD_BYTES - FIRING_RESERVE_BYTES
    spec = loom.TimerSpec(
        id="full",
        fire_at_ms=T0_MS,
        source="s",
        type="a.b",
        scope=SCOPE,
        payload=payload_of(limit),
        **how,
    )
    over = attrs.evolve(spec, id="over", payload=payload_of(limit + 1))
    await refused(fx, "timer.payload", fx.rt.arm(over))
    timer = await fx.rt.arm(spec)
    firing = await fx.rt.fire(loom.FireRequest(timer_id=timer.id, revision=timer.revision, fire_at_ms=T0_MS))
    assert firing.result is loom.FiringResult.ACCEPTED, firing.detail
    assert firing.event_id is not None
    assert len((await fx.rt.event(firing.event_id)).payload["a"]) == len(spec.payload["a"])


@pytest.mark.parametrize(
    "text",
    ["a = " + "[" * 100_000 + "]" * 100_000, "a = " + "{b = " * 5_000 + "}" * 5_000, None, b"[causal]"],
)
def test_toml_that_tomllib_cannot_read_is_a_config_error(text: Any) -> None:
    with pytest.raises(loom.ConfigError):
        loom.Config.from_toml(text)


@pytest.mark.parametrize(
    "kwargs",
    [{"config": {}}, {"lease_ms": "60000"}, {"owner": 5}, {"clock": 5}],
    ids=lambda kw: next(iter(kw)),
)
async def test_open_runtime_refuses_arguments_of_the_wrong_type(
    tmp_path: Path, kwargs: dict[str, Any]
) -> None:
    with pytest.raises(loom.InvalidRequest):
        async with loom.open_runtime(str(tmp_path / "loom.db"), load_entry_points=False, actors=(), **kwargs):
            pass
