"""Text loom did not make, on every store (docs/concepts.md "Supervision"): an executor's exception
message of any length or content fails its attempt with an error every backend keeps, and a reason or
an error a caller gives with a NUL in it is refused on every backend alike (PostgreSQL's text holds no
NUL, SQLite's does: a store must not decide what is valid input)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from loom import (
    Config,
    EventIn,
    Failed,
    InvalidRequest,
    Lease,
    RetryState,
    Runtime,
    SubscriptionSpec,
    WorkState,
    hookimpl,
    open_runtime,
)
from loom.plugins.handlers import work_id_for_key
from loom.plugins.python_executor import PythonExecutor
from loom.records.validation import MAX_REASON_LEN, check_json_value, storable_text
from loom.testing import ManualClock

SCOPE = "acme"

CONFIG = Config.from_dict(
    {
        "work_kinds": {"once": {"retry_attempts": 1}},
        "scopes": {
            SCOPE: {
                "bindings": {"py": {"executor": "python", "config": {"function": "boom"}}},
                "routes": [
                    {"name": "r", "types": ["r.*"], "create_work": True, "binding": "py", "work_kind": "once"}
                ],
            }
        },
    }
)

MESSAGES = {
    "long": "x" * (3 * MAX_REASON_LEN),
    "nul": "before\x00after",
    "surrogate": "before\ud800after",
    "blank": "   ",
}


@pytest.mark.parametrize("kind", sorted(MESSAGES))
async def test_an_executor_exception_of_any_text_fails_its_attempt(
    loom_store: str, clock: ManualClock, kind: str
) -> None:
    """The attempt fails, its error quoting the message as every store keeps it (a NUL or a lone
    surrogate as its escape, a long one cut), and no retry being left, the Work is held. Catches an
    error quoted as raised: the outcome's commit is refused (too long, a lone surrogate; a NUL on
    PostgreSQL) and the attempt stays running until its lease expires."""
    executor = PythonExecutor()
    message = MESSAGES[kind]

    @executor.function("boom")
    async def boom(*_: object) -> None:
        raise RuntimeError(message)

    async with open_runtime(
        loom_store, clock=clock, config=CONFIG, plugins=[executor], load_entry_points=False
    ) as rt:
        await rt.publish(EventIn(source="t", delivery_id="1", type="r.go", scope=SCOPE, key="k"))
        await rt.wait_idle()
        result = await rt.result(work_id_for_key(SCOPE, "k"))
    assert (result.state, result.failures, result.retry, result.held) == (
        WorkState.READY,
        1,
        RetryState.EXHAUSTED,
        True,
    )
    assert result.error is not None
    assert result.error.startswith("executor 'python' raised RuntimeError")
    assert len(result.error) <= MAX_REASON_LEN
    assert "\x00" not in result.error
    assert result.error.encode("utf-8")  # (a lone surrogate would not encode)
    if kind in ("nul", "surrogate"):
        assert result.error.endswith(storable_text(message))


def test_storable_text_escapes_cuts_and_names_blank_text() -> None:
    """Catches a NUL or lone surrogate kept as it is, a cut past the limit, and blank text kept blank."""
    assert storable_text("a\x00b\udc80c") == "a\\u0000b\\udc80c"
    assert storable_text("x" * 50, limit=10) == "xxxxxxx..."
    assert storable_text("x" * 10, limit=10) == "x" * 10
    assert storable_text(" \n ") == "(no text)"


@pytest.fixture
async def rt(loom_store: str, clock: ManualClock) -> AsyncIterator[Runtime]:
    config = Config.from_dict(
        {"scopes": {SCOPE: {"routes": [{"name": "r", "types": ["r.*"], "create_work": True}]}}}
    )
    async with open_runtime(loom_store, clock=clock, config=config, actors=(), load_entry_points=False) as rt:
        yield rt


async def started(rt: Runtime) -> Lease:
    await rt.publish(EventIn(source="t", delivery_id="1", type="r.start", scope=SCOPE, key="k"))
    await rt.poll()
    return await rt.claim(work_id_for_key(SCOPE, "k"), owner="host")


@pytest.mark.parametrize(("value", "said"), [(object(), "holds an object"), ({1, 2}, "holds a set")])
def test_a_value_that_is_not_json_data_is_named_with_its_article(value: object, said: str) -> None:
    """Catches "result holds a object" (seen: a function's result that is not JSON)."""
    with pytest.raises(InvalidRequest, match=f"^result {said}, which is not JSON data$"):
        check_json_value("result", value)


async def test_a_reason_or_an_error_with_a_nul_is_refused_and_changes_nothing(rt: Runtime) -> None:
    """A hold's reason and a failure's error holding a NUL get `InvalidRequest` naming the field, on
    SQLite as on PostgreSQL, and nothing changes: the Work is not held, the attempt still runs and
    then completes with a text without one. Catches the check left to the store (PostgreSQL refuses
    with its own error, SQLite keeps the NUL)."""
    lease = await started(rt)
    with pytest.raises(InvalidRequest, match="reason") as held:
        await rt.hold(lease.work_id, reason="stock\x00check")
    assert "NUL" in str(held.value)
    with pytest.raises(InvalidRequest, match="error") as failed:
        await rt.complete(lease, Failed(error="boom\x00"))
    assert "NUL" in str(failed.value)
    work = await rt.work(lease.work_id)
    assert work is not None
    assert (work.state, work.held) == (WorkState.RUNNING, False)
    await rt.complete(lease, Failed(error="boom"))
    assert (await rt.result(lease.work_id)).error == "boom"


GATED = Config.from_dict(
    {"scopes": {SCOPE: {"routes": [{"name": "r", "types": ["r.*"], "create_work": True, "work_kind": "job"}]}},
     "work_kinds": {"job": {"standing": True}}}
)  # fmt: skip


@pytest.mark.parametrize("kind", ["long", "nul", "surrogate"])
async def test_a_start_gate_reason_of_any_text_holds_its_work_alone(
    loom_store: str, clock: ManualClock, kind: str
) -> None:
    """A start gate's reason becomes the hold reason, kept as every store keeps one. Catches a reason
    held as answered: the hold's own check refused it, the admission pass raised, the Work it did not
    concern was left running under a lease the host never received, and the gated Work was never held
    (with actors running, the runtime stopped)."""

    class Gate:
        @hookimpl
        def loom_start_gates(self) -> dict[str, Any]:
            return {"g": lambda work: MESSAGES[kind] if work.keys[0] == "bad" else None}

    async with open_runtime(
        loom_store, clock=clock, config=GATED, plugins=[Gate()], actors=(), load_entry_points=False
    ) as rt:
        for key in ("good", "bad"):
            await rt.publish(EventIn(source="t", delivery_id=key, type="r.go", scope=SCOPE, key=key))
        await rt.poll()
        (lease,) = await rt.admit(owner="host")
        assert lease.work_id == work_id_for_key(SCOPE, "good")
        bad = await rt.work(work_id_for_key(SCOPE, "bad"))
        assert bad.held
        assert bad.hold_reason == storable_text(f"start gate g: {MESSAGES[kind]}")


async def test_an_alias_filter_raising_any_text_skips_its_subscription_alone(
    loom_store: str, clock: ManualClock
) -> None:
    """Catches an alias filter's message quoted as raised: a lone surrogate in it failed the store's
    encoding, the whole reconciliation batch rolled back (the well-behaved subscription published
    nothing) and the error escaped the public API."""

    class Filters:
        @hookimpl
        def loom_alias_filters(self) -> dict[str, Any]:
            def bad(event: Any, spec: Any) -> bool:
                raise ValueError(MESSAGES["surrogate"])

            return {"bad": bad, "ok": lambda event, spec: True}

    async with open_runtime(
        loom_store, clock=clock, config=GATED, plugins=[Filters()], actors=(), load_entry_points=False
    ) as rt:
        for key in ("src", "d1", "d2"):
            await rt.publish(EventIn(source="t", delivery_id=key, type="r.go", scope=SCOPE, key=key))
        await rt.poll()
        d1, d2 = work_id_for_key(SCOPE, "d1"), work_id_for_key(SCOPE, "d2")
        await rt.subscribe(
            d1,
            SubscriptionSpec(namespace="n", id="bad", source_key="src", types=("r.out",), filter_name="bad"),
        )
        await rt.subscribe(
            d2, SubscriptionSpec(namespace="n", id="ok", source_key="src", types=("r.out",), filter_name="ok")
        )
        await rt.publish(EventIn(source="t", delivery_id="out", type="r.out", scope=SCOPE, key="src"))
        await rt.poll()
        report = await rt.reconcile_subscriptions()
        assert report.skipped == ("n/bad",)
        assert len(report.aliases) == 1  # the well-behaved one published its alias
        (failed,) = await rt.subscriptions(d1)
        assert failed.reason is not None
        assert "\\ud800" in failed.reason
