"""The HTTP JSON API of ``loom serve``, in-process over a real runtime on a file (docs/http-api.md).

Each status code a route documents is produced here, every refusal is checked for its body
``{error, field, message}`` (naming the field as the client wrote it), and every refused request is
checked to leave the store byte for byte as it was.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing
from service_kit import JSON, Api, api, order, refusal

import loom
from loom.records.validation import MAX_PAYLOAD_DEPTH, MAX_TIME_MS
from loom.service._app import OPS, make_app
from loom.service._wire import MAX_BODY_BYTES
from loom.testing import T0_MS

HOUR = 3_600_000


# -- events -------------------------------------------------------------------------------------------


async def test_an_event_is_accepted_once_then_answered_as_a_duplicate(tmp_path: Path) -> None:
    """Catches an ingress that answers 201 twice (or stores twice) for one delivery."""
    async with api(tmp_path) as a:
        first = await a.client.post("/events", json=order(1))
        assert first.status_code == 201
        event = first.json()
        assert event["duplicate"] is False
        assert (event["source"], event["delivery_id"], event["seq"]) == ("shop", "o-1", 1)
        again = await a.unchanged(a.client.post("/events", json=order(1)))
        assert again.status_code == 200
        assert again.json() == {**event, "duplicate": True, "routing": again.json()["routing"]}
        assert len(await a.rt.events()) == 1


BAD_EVENTS: list[tuple[Any, str | None]] = [
    ({k: v for k, v in order(1).items() if k != "source"}, "source"),
    (order(1, colour="red"), "colour"),
    (order(1, source=5), "source"),
    (order(1, source=""), "source"),
    (order(1, delivery_id="d" * 201), "delivery_id"),
    (order(1, type="Bad type"), "type"),
    (order(1, type="core.wait.woken"), "type"),
    (order(1, scope="not a scope"), "scope"),
    (order(1, scope=None), "scope"),
    (order(1, key=""), "key"),
    (order(1, key="a\x00b"), "key"),
    (order(1, work_id=7), "work_id"),
    (order(1, payload=[1, 2]), "payload"),
    (order(1, payload="x"), "payload"),
    (order(1, payload={"n": "\ud800"}), "payload.n"),
    (order(1, payload={"big": 2**64}), "payload.big"),
    ([], None),
    ([order(n) for n in range(1001)], None),
    ("order", None),
    (None, None),
]


@pytest.mark.parametrize(("body", "field"), BAD_EVENTS)
async def test_a_bad_event_is_400_naming_the_field_and_changes_nothing(
    tmp_path: Path, body: Any, field: str | None
) -> None:
    """Catches a refusal without the field (or with the runtime's ``event.`` name), a 500 for a
    malformed body, and a check made after something was written."""
    async with api(tmp_path) as a:
        response = await a.unchanged(a.client.post("/events", content=json.dumps(body), headers=JSON))
        refusal(response, 400, "invalid_request", field)


def _nested(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels):
        value = {"a": value}
    return value


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"{not json", "not valid JSON"),
        (b'{"source": NaN}', "not valid JSON"),
        (b"\xff\xfe{}", "not UTF-8"),
        (b"[" * 200_000 + b"]" * 200_000, "nested too deeply"),
        (b"", "must be a JSON object"),
    ],
)
async def test_a_body_that_is_not_a_json_object_is_400(tmp_path: Path, raw: bytes, why: str) -> None:
    """Catches a decoder that lets NaN, bad UTF-8 or a RecursionError through as a 500."""
    async with api(tmp_path) as a:
        body = refusal(
            await a.unchanged(a.client.post("/events", content=raw, headers=JSON)), 400, "invalid_request"
        )
        assert why in body["message"]


async def test_a_payload_nested_past_the_limit_is_refused_naming_where(tmp_path: Path) -> None:
    """Catches a depth check that only names the payload, or lets the runtime recurse into it."""
    async with api(tmp_path) as a:
        deep = order(1, payload=_nested(MAX_PAYLOAD_DEPTH + 1))
        response = await a.unchanged(a.client.post("/events", json=deep))
        assert response.status_code == 400
        assert response.json()["field"].startswith("payload.a.a")


@pytest.mark.filterwarnings(
    # the refused upload's generator is left unfinished on purpose: the server stops reading it
    "ignore:Async generator 'httpx._content:ResourceWarning",
    "ignore:Exception ignored in. <async_generator object AsyncIteratorByteStream:"
    "pytest.PytestUnraisableExceptionWarning",
)
async def test_a_body_over_the_limit_is_413_whether_or_not_its_length_is_given(tmp_path: Path) -> None:
    """Catches a limit checked only against Content-Length (a chunked body streams past it)."""
    async with api(tmp_path) as a:
        big = json.dumps(order(1, payload={"x": "y" * MAX_BODY_BYTES})).encode()
        refusal(await a.unchanged(a.client.post("/events", content=big, headers=JSON)), 413, "too_large")

        async def chunks() -> Any:
            for start in range(0, len(big), 65536):
                yield big[start : start + 65536]

        refusal(await a.unchanged(a.client.post("/events", content=chunks(), headers=JSON)), 413, "too_large")
        assert (await a.client.post("/events", json=order(2))).status_code == 201


async def test_events_are_listed_in_sequence_order_by_page_and_type(tmp_path: Path) -> None:
    """Catches paging that skips or repeats an Event, and a type filter that is ignored."""
    async with api(tmp_path) as a:
        for n in range(5):
            assert (await a.client.post("/events", json=order(n))).status_code == 201
        await a.client.post("/events", json=order("p", type="order.paid"))
        seen, after = [], 0
        while True:
            page = (await a.client.get("/events", params={"after": after, "limit": 2})).json()
            seen += [e["delivery_id"] for e in page["events"]]
            if page["next_after"] is None:
                break
            after = page["next_after"]
        assert seen == [f"o-{n}" for n in range(5)] + ["o-p"]
        paid = (await a.client.get("/events", params={"type": "order.paid"})).json()["events"]
        assert [e["delivery_id"] for e in paid] == ["o-p"]
        for params, field in [
            ({"after": "-1"}, "after"),
            ({"limit": "0"}, "limit"),
            ({"limit": "x"}, "limit"),
        ]:
            refusal(await a.client.get("/events", params=params), 400, "invalid_request", field)


async def test_one_event_with_its_checkpoint_or_404(tmp_path: Path) -> None:
    async with api(tmp_path) as a:
        event = (await a.client.post("/events", json=order(1))).json()
        await a.rt.wait_idle()
        shown = (await a.client.get(f"/events/{event['id']}")).json()
        assert shown["event"]["id"] == event["id"]
        assert shown["checkpoint"]["status"] == "routed"
        refusal(await a.client.get("/events/ev_nope"), 404, "not_found")


# -- work and operator controls -------------------------------------------------------------------------


async def _work(a: Api, n: int) -> dict[str, Any]:
    assert (await a.client.post("/events", json=order(n))).status_code in (200, 201)
    await a.rt.wait_idle()
    response = await a.client.get(f"/work/by-key/order/{n}")
    assert response.status_code == 200, response.text
    return response.json()  # type: ignore[no-any-return]


async def test_a_work_shows_state_keys_pending_input_and_history(tmp_path: Path) -> None:
    """Catches a Work view missing its pending input or history, or a by-key route that cannot take a
    key with a slash."""
    async with api(tmp_path) as a:
        view = await _work(a, 1)
        work = view["work"]
        assert work["state"] == "ready"
        assert work["keys"] == ["order/1"]
        assert [e["delivery_id"] for e in view["pending_inputs"]] == ["o-1"]
        assert [cp["route"] for cp in view["history"]["checkpoints"]] == ["orders"]
        assert view["wait"] is None
        assert (await a.client.get(f"/work/{work['id']}")).json() == view
        refusal(await a.client.get("/work/wk_nope"), 404, "not_found")
        refusal(await a.client.get("/work/by-key/order/404"), 404, "not_found")


async def test_work_is_listed_by_scope_and_state(tmp_path: Path) -> None:
    config = loom.Config.from_dict(
        {
            "scopes": {
                "shop": {"routes": [{"name": "orders", "types": ["order.*"], "create_work": True}]},
                "shopping": {"routes": [{"name": "orders", "types": ["order.*"], "create_work": True}]},
            }
        }
    )
    async with api(tmp_path, config=config) as a:
        for n, scope in enumerate(["shop", "shop/eu", "shopping"]):
            await a.client.post("/events", json=order(n, scope=scope))
        await a.rt.wait_idle()

        async def scopes(**params: str) -> list[str]:
            response = await a.client.get("/work", params=params)
            assert response.status_code == 200, response.text
            return sorted(w["scope"] for w in response.json()["work"])

        assert await scopes(scope="shop") == ["shop", "shop/eu"]
        assert await scopes(state="ready") == ["shop", "shop/eu", "shopping"]
        assert await scopes(state="completed") == []
        refusal(await a.client.get("/work", params={"state": "asleep"}), 400, "invalid_request", "state")
        refusal(await a.client.get("/work", params={"scope": "a b"}), 400, "invalid_request", "scope")
        refusal(await a.client.get("/work", params={"after": "a\x01"}), 400, "invalid_request", "after")
        refusal(await a.client.get("/timers", params={"work": "a\x01"}), 400, "invalid_request", "work")
        refusal(await a.client.get("/timers", params={"after": "a\x01"}), 400, "invalid_request", "after")
        refusal(await a.client.get("/timers", params={"state": "late"}), 400, "invalid_request", "state")


async def test_hold_release_and_cancel(tmp_path: Path) -> None:
    """Catches a hold whose reason is lost, a hold without a reason that goes through, and a control
    on a terminal Work answered as a success."""
    async with api(tmp_path) as a:
        work_id = (await _work(a, 1))["work"]["id"]
        refusal(
            await a.unchanged(a.client.post(f"/work/{work_id}/hold", json={})),
            400,
            "invalid_request",
            "reason",
        )
        refusal(
            await a.unchanged(a.client.post(f"/work/{work_id}/hold", json={"reason": " "})),
            400,
            "invalid_request",
            "reason",
        )
        held = await a.client.post(f"/work/{work_id}/hold", json={"reason": "stock check"})
        assert held.status_code == 200
        assert (held.json()["held"], held.json()["hold_reason"]) == (True, "stock check")
        assert (await a.client.get(f"/work/{work_id}")).json()["work"]["hold_reason"] == "stock check"
        released = await a.client.post(f"/work/{work_id}/release")
        assert released.status_code == 200
        assert released.json()["held"] is False
        assert (await a.client.post(f"/work/{work_id}/cancel", json={})).json()["state"] == "cancelled"
        refusal(
            await a.unchanged(a.client.post(f"/work/{work_id}/hold", json={"reason": "x"})), 409, "conflict"
        )
        refusal(await a.client.post("/work/wk_nope/release"), 404, "not_found")
        refusal(
            await a.client.post("/work/wk_nope/cancel", json={"force": True}), 400, "invalid_request", "force"
        )


async def test_interrupt_retry_and_replay_refuse_what_does_not_apply(tmp_path: Path) -> None:
    """Catches controls answered as a success where they do not apply: an interrupt with no running
    attempt (or one not pinned to be interruptible), a retry while an attempt runs, a replay of an
    Event of another Work or of one that was routed."""
    async with api(tmp_path) as a:
        one = (await _work(a, 1))["work"]["id"]
        two = await _work(a, 2)
        refusal(await a.unchanged(a.client.post(f"/work/{one}/interrupt", json={})), 409, "conflict")
        await a.rt.claim(one, owner="host")
        body = refusal(
            await a.unchanged(a.client.post(f"/work/{one}/interrupt", json={"reason": "enough"})),
            409,
            "conflict",
        )
        assert "interrupt capability" in body["message"]
        refusal(await a.unchanged(a.client.post(f"/work/{one}/retry", json={})), 409, "conflict")
        other = two["pending_inputs"][0]["id"]
        refusal(
            await a.unchanged(a.client.post(f"/work/{one}/replay", json={"event_id": other})),
            409,
            "conflict",
            "event_id",
        )
        refusal(
            await a.unchanged(a.client.post(f"/work/{one}/replay", json={"event_id": "ev_nope"})),
            404,
            "not_found",
            "event_id",
        )
        refusal(await a.client.post(f"/work/{one}/replay", json={}), 400, "invalid_request", "event_id")
        own = two["history"]["checkpoints"][0]["event_id"]
        response = await a.unchanged(
            a.client.post(f"/work/{two['work']['id']}/replay", json={"event_id": own})
        )
        refusal(response, 409, "conflict")


# -- timers and diagnostics ---------------------------------------------------------------------------


def _timer(**changes: Any) -> dict[str, Any]:
    body = {
        "id": "remind-1",
        "fire_at_ms": T0_MS + HOUR,
        "source": "ops",
        "type": "order.remind",
        "scope": "shop",
    }
    body.update(changes)
    return body


async def test_a_root_timer_is_armed_fires_once_on_the_test_clock_and_is_cancelled_by_revision(
    tmp_path: Path,
) -> None:
    """Catches a timer route that loses the firing ledger, fires twice, or cancels at any revision."""
    async with api(tmp_path) as a:
        armed = await a.client.post("/timers", json=_timer())
        assert armed.status_code == 201, armed.text
        assert armed.json()["state"] == "armed"
        other = (await a.client.post("/timers", json=_timer(id="remind-2"))).json()
        listed = (await a.client.get("/timers", params={"state": "armed"})).json()["timers"]
        assert [t["id"] for t in listed] == ["remind-1", "remind-2"]
        refusal(
            await a.unchanged(
                a.client.post("/timers/remind-2/cancel", json={"revision": other["revision"] + 1})
            ),
            409,
            "conflict",
        )
        assert (await a.client.post("/timers/remind-2/cancel", json={"revision": other["revision"]})).json()[
            "state"
        ] == "cancelled"
        assert (await a.client.post("/debug/clock", json={"advance_ms": HOUR})).status_code == 200
        await a.rt.wait_idle()
        shown = (await a.client.get("/timers/remind-1")).json()
        assert shown["timer"]["state"] == "fired"
        assert [f["result"] for f in shown["firings"]] == ["accepted"]
        assert (await a.client.get("/timers/remind-2")).json()["firings"] == []
        refusal(await a.client.get("/timers/nope"), 404, "not_found")


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"fire_at_ms": "soon"}, "fire_at_ms"),
        ({"fire_at_ms": -1}, "fire_at_ms"),
        ({"fire_at_ms": 1.5}, "fire_at_ms"),
        ({"type": "core.retry.due"}, "type"),
        ({"scope": "a b"}, "scope"),
        ({"interval_ms": 0}, "interval_ms"),
        ({"recurrence": "nope", "spec": {}}, "recurrence"),
        ({"recurrence": "cron", "spec": {"cron": "61 * * * *"}}, "spec"),
        ({"spec": {"cron": "* * * * *"}}, "spec"),
        ({"payload": {"x": float("inf")}}, None),
        ({"when": 5}, "when"),
    ],
)
async def test_a_bad_timer_is_400_naming_the_field(
    tmp_path: Path, changes: dict[str, Any], field: str | None
) -> None:
    async with api(tmp_path) as a:
        raw = json.dumps(_timer(**changes), allow_nan=True)
        response = await a.unchanged(a.client.post("/timers", content=raw, headers=JSON))
        assert response.status_code == 400, response.text
        if field is not None:
            assert response.json()["field"] == field, response.json()


async def test_diagnostics_are_listed_by_kind(tmp_path: Path) -> None:
    async with api(tmp_path) as a:
        await a.client.post("/timers", json=_timer(id="bad", source="shop", delivery_id="o-1"))
        await a.client.post("/events", json=order(1))  # takes the timer's delivery identity first
        await a.client.post("/debug/clock", json={"advance_ms": HOUR})
        await a.rt.wait_idle()
        found = (await a.client.get("/diagnostics", params={"kind": "invalid_timer"})).json()["diagnostics"]
        assert [d["subject"] for d in found] == ["bad"]
        assert (await a.client.get("/diagnostics", params={"kind": "handler_error"})).json()[
            "diagnostics"
        ] == []
        refusal(await a.client.get("/diagnostics", params={"limit": "1001"}), 400, "invalid_request", "limit")


# -- the execution toolbelt -----------------------------------------------------------------------------


async def _lease(a: Api, n: int) -> loom.Lease:
    work_id = (await _work(a, n))["work"]["id"]
    return await a.rt.claim(work_id, owner="host")


def _bearer(lease: loom.Lease, token: str | None = None) -> dict[str, str]:
    return {"Authorization": f"Bearer {token if token is not None else lease.token}"}


async def test_the_toolbelt_needs_the_executions_own_current_token(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Catches a toolbelt that takes any valid token (another execution's), a token after its attempt
    ended, a request without one, and a token written to a log or echoed in an answer."""
    caplog.set_level(logging.DEBUG)
    async with api(tmp_path) as a:
        mine, theirs = await _lease(a, 1), await _lease(a, 2)
        emit = f"/executions/{mine.execution_id}/emit"
        refusal(await a.unchanged(a.client.post(emit, json=order(9))), 401, "unauthorized", "Authorization")
        for header in ("Basic abc", "Bearer", "Bearer two words", f"Bearer {'x' * 501}"):
            response = await a.unchanged(
                a.client.post(emit, json=order(9), headers={"Authorization": header})
            )
            refusal(response, 401, "unauthorized", "Authorization")
        for token in (theirs.token, mine.token + "x"):
            response = await a.unchanged(a.client.post(emit, json=order(9), headers=_bearer(mine, token)))
            body = refusal(response, 403, "stale_authority")
            assert token not in body["message"]
        ok = await a.client.post(emit, json=order(9, type="order.noted"), headers=_bearer(mine))
        assert ok.status_code == 201, ok.text
        assert ok.json()["parent_id"] == mine.request.trigger.id  # type: ignore[union-attr]
        done = await a.client.post(
            f"/executions/{mine.execution_id}/complete", json={"outcome": "completed"}, headers=_bearer(mine)
        )
        assert done.status_code == 200, done.text
        assert done.json()["state"] == "completed"
        response = await a.unchanged(a.client.post(emit, json=order(10), headers=_bearer(mine)))
        refusal(response, 403, "stale_authority")
    for record in caplog.records:
        text = record.getMessage() + str(record.args) + str(record.exc_info)
        assert mine.token not in text, record
        assert theirs.token not in text, record


async def test_toolbelt_calls_act_under_the_lease(tmp_path: Path) -> None:
    """Catches calls that are not made under the execution's lease: the child's parent, the timer's
    execution, the heartbeat's new expiry."""
    async with api(tmp_path) as a:
        lease = await _lease(a, 1)
        base = f"/executions/{lease.execution_id}"
        auth = _bearer(lease)
        child = await a.client.post(f"{base}/child", json={"name": "pack", "keys": ["pack/1"]}, headers=auth)
        assert child.status_code == 200, child.text
        assert (child.json()["parent_id"], child.json()["keys"]) == (lease.work_id, ["pack/1"])
        timer = await a.client.post(f"{base}/timer", json=_timer(id="nudge"), headers=auth)
        assert timer.status_code == 200, timer.text
        assert timer.json()["execution_id"] == lease.execution_id
        await a.client.post("/debug/clock", json={"advance_ms": 1000})
        beat = await a.client.post(f"{base}/heartbeat", json={"lease_ms": 120_000}, headers=auth)
        assert beat.status_code == 200, beat.text
        assert beat.json()["expires_at_ms"] == a.clock.now_ms() + 120_000
        assert (await a.rt.execution(lease.execution_id)).expires_at_ms == a.clock.now_ms() + 120_000
        refusal(
            await a.unchanged(
                a.client.post(f"{base}/child", json={"name": "x", "keys": ["order/1"]}, headers=auth)
            ),
            409,  # the key is another Work's now: a refusal of the state, not of the form
            "conflict",
        )
        refusal(
            await a.unchanged(a.client.post(f"{base}/heartbeat", json={"lease_ms": 0}, headers=auth)),
            400,
            "invalid_request",
            "lease_ms",
        )


async def test_wait_parks_the_attempt_and_one_event_wakes_it(tmp_path: Path) -> None:
    """Catches a wait route that does not end the attempt's authority, or a wake that never comes."""
    async with api(tmp_path) as a:
        lease = await _lease(a, 1)
        base = f"/executions/{lease.execution_id}"
        refusal(
            await a.unchanged(
                a.client.post(f"{base}/wait", json={"types": "approval.*"}, headers=_bearer(lease))
            ),
            400,
            "invalid_request",
            "types",
        )
        # a key the Work does not own, a sequence past history: refusals of the state, not the form
        refusal(
            await a.unchanged(
                a.client.post(f"{base}/wait", json={"keys": ["not/mine"]}, headers=_bearer(lease))
            ),
            409,
            "conflict",
        )
        refusal(
            await a.unchanged(
                a.client.post(f"{base}/wait", json={"after_seq": 10**9}, headers=_bearer(lease))
            ),
            409,
            "conflict",
        )
        waited = await a.client.post(
            f"{base}/wait", json={"types": ["approval.*"], "timeout_ms": HOUR}, headers=_bearer(lease)
        )
        assert waited.status_code == 200, waited.text
        assert waited.json()["state"] == "waited"
        view = (await a.client.get(f"/work/{lease.work_id}")).json()
        assert view["work"]["state"] == "waiting"
        assert view["wait"]["types"] == ["approval.*"]
        refusal(await a.client.post(f"{base}/heartbeat", headers=_bearer(lease)), 403, "stale_authority")
        await a.client.post("/events", json=order(1, delivery_id="ok-1", type="approval.granted"))
        await a.rt.wait_idle()
        view = (await a.client.get(f"/work/{lease.work_id}")).json()
        assert [w["state"] for w in view["waits"]] == ["woken"]
        assert view["work"]["state"] == "ready"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "outcome"),
        ({"outcome": "done"}, "outcome"),
        ({"outcome": "failed"}, "error"),
        ({"outcome": "completed", "error": "x"}, "error"),
        ({"outcome": "failed", "error": "x", "retry_after_ms": -1}, "retry_after_ms"),
        ({"outcome": "completed", "usage": {"tokens": "many"}}, "usage"),
        ({"outcome": "completed", "consumed_inputs": [""]}, "consumed_inputs[0]"),
    ],
)
async def test_a_bad_outcome_is_400_and_the_attempt_runs_on(
    tmp_path: Path, body: dict[str, Any], field: str | None
) -> None:
    async with api(tmp_path) as a:
        lease = await _lease(a, 1)
        response = await a.unchanged(
            a.client.post(f"/executions/{lease.execution_id}/complete", json=body, headers=_bearer(lease))
        )
        assert response.status_code in (400, 409), response.text
        if field is not None:
            refusal(response, 400, "invalid_request", field)
        failed = await a.client.post(
            f"/executions/{lease.execution_id}/complete",
            json={"outcome": "failed", "error": "gave up"},
            headers=_bearer(lease),
        )
        assert failed.status_code == 200, failed.text
        assert failed.json()["state"] == "failed"


# -- the test clock -----------------------------------------------------------------------------------


async def test_the_debug_clock_exists_only_under_the_test_clock(tmp_path: Path) -> None:
    """Catches a production server whose business time anyone can move."""
    async with api(tmp_path, test_clock=False) as a:
        refusal(await a.client.get("/debug/clock"), 404, "not_found")
        refusal(await a.unchanged(a.client.post("/debug/clock", json={"advance_ms": HOUR})), 404, "not_found")
        assert "/debug/clock" not in (await a.client.get("/openapi.json")).json()["paths"]


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        (b'{"advance_ms": -1}', "advance_ms"),
        (b'{"now_ms": -1}', "now_ms"),
        (b'{"advance_ms": 1.5}', "advance_ms"),
        (b'{"advance_ms": "60000"}', "advance_ms"),
        (b'{"advance_ms": true}', "advance_ms"),
        (b'{"advance_ms": 1e400}', "advance_ms"),
        (b'{"advance_ms": 99999999999999999999999}', "advance_ms"),
        (b'{"advance_ms": 1, "now_ms": 1}', "now_ms"),
        (b"{}", None),
        (b"[]", None),
        (b"soon", None),
        (b'{"offset": 5}', "offset"),
    ],
)
async def test_the_debug_clock_moves_only_forward(tmp_path: Path, raw: bytes, field: str | None) -> None:
    """Catches a clock that goes backwards, or takes a float, a string or a bool for milliseconds."""
    async with api(tmp_path) as a:
        before = (await a.client.get("/debug/clock")).json()
        refusal(
            await a.unchanged(a.client.post("/debug/clock", content=raw, headers=JSON)),
            400,
            "invalid_request",
            field,
        )
        assert (await a.client.get("/debug/clock")).json() == before


@pytest.mark.parametrize(
    ("body", "field"), [({"now_ms": 0}, "now_ms"), ({"advance_ms": MAX_TIME_MS - 1}, "advance_ms")]
)
async def test_a_clock_move_the_clock_where_it_is_cannot_make_is_409(
    tmp_path: Path, body: dict[str, int], field: str
) -> None:
    """A well-formed move that only the clock's own time refuses (backwards, or past the year 9999 from
    where it is) is a conflict with that state, as the OpenAPI document says; not a malformed request."""
    async with api(tmp_path) as a:
        before = (await a.client.get("/debug/clock")).json()
        refusal(await a.unchanged(a.client.post("/debug/clock", json=body)), 409, "conflict", field)
        assert (await a.client.get("/debug/clock")).json() == before


async def test_the_debug_clock_fires_what_became_due_and_records_its_floor(tmp_path: Path) -> None:
    """Catches a clock move that wakes nobody, and one that is not recorded before it is answered."""
    async with api(tmp_path) as a:
        assert (await a.client.get("/debug/clock")).json() == {
            "now_ms": T0_MS,
            "now": "2026-01-01T00:00:00.000Z",
            "floor_ms": T0_MS,  # the start is recorded: a restart continues here
        }
        await a.client.post("/timers", json=_timer(fire_at_ms=T0_MS + 2 * HOUR))
        moved = (await a.client.post("/debug/clock", json={"advance_ms": HOUR})).json()
        assert moved == {"now_ms": T0_MS + HOUR, "now": "2026-01-01T01:00:00.000Z", "floor_ms": T0_MS + HOUR}
        await a.rt.wait_idle()
        assert (await a.client.get("/timers/remind-1")).json()["firings"] == []
        assert (await a.client.post("/debug/clock", json={"now_ms": T0_MS + 2 * HOUR})).status_code == 200
        await a.rt.wait_idle()
        assert len((await a.client.get("/timers/remind-1")).json()["firings"]) == 1
        assert await a.rt.time_floor() == T0_MS + 2 * HOUR


# -- service routes -----------------------------------------------------------------------------------


async def test_health_metrics_and_unknown_routes(tmp_path: Path) -> None:
    """Catches metrics that are not counted from the runtime's commits (a wake, a firing, routed
    Events), and plain-text 404/405 answers."""
    async with api(tmp_path) as a:
        health = (await a.client.get("/healthz")).json()
        assert (health["status"], health["test_clock"], health["now_ms"]) == ("ok", True, T0_MS)
        lease = await _lease(a, 1)
        await a.client.post(
            f"/executions/{lease.execution_id}/wait", json={"types": ["approval.*"]}, headers=_bearer(lease)
        )
        await a.client.post("/events", json=order(1, delivery_id="ok", type="approval.granted"))
        await a.client.post("/timers", json=_timer())
        await a.client.post("/debug/clock", json={"advance_ms": HOUR})
        await a.rt.wait_idle()
        await trio.testing.wait_all_tasks_blocked()
        text = (await a.client.get("/metrics")).text
        samples = {
            line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line and not line.startswith("#")
        }
        events = await a.rt.events()
        assert samples["loom_events_accepted_total"] == len(events)
        assert samples["loom_waits_woken_total"] == 1
        assert samples['loom_timers_fired_total{result="accepted"}'] >= 1
        assert samples['loom_events_routed_total{status="routed"}'] >= 2
        assert samples["loom_storage_batch_requests_count"] > 0
        assert samples["loom_storage_commit_seconds_count"] == samples["loom_storage_batch_requests_count"]
        refusal(await a.client.get("/nowhere"), 404, "not_found")
        refusal(await a.client.delete("/events"), 405, "method_not_allowed")


async def test_the_openapi_document_describes_every_route_of_the_app(tmp_path: Path) -> None:
    """Catches a route added to the app but not to the document (or the other way round)."""
    async with api(tmp_path) as a:
        doc = (await a.client.get("/openapi.json")).json()
        assert doc["openapi"].startswith("3.")
        documented = {(path, method.upper()) for path, ops in doc["paths"].items() for method in ops}
        expected = {(op.openapi_path, op.method) for op in OPS} | {
            ("/ui/work", "GET"),
            ("/ui/work/{work_id}", "GET"),
        }
        assert documented == expected
        # the rest of the web console: HTML pages, its script, watch and actions (docs/http-api.md)
        pages = ("events", "events/{event_id}", "timers", "timers/{timer_id}", "schedules", "diagnostics")
        console = {(f"/ui/{page}", "GET") for page in (*pages, "static/{name}", "watch")}
        console |= {("/ui", "GET"), ("/ui/", "GET"), ("/ui/act/{action}", "POST")}
        app = make_app(a.rt)
        routed = {
            (route.path.replace(":path", ""), method)
            for route in app.routes
            for method in getattr(route, "methods", ()) or ()
            if method != "HEAD" and route.path != "/"
        }
        assert routed == expected | console
        for path, ops in doc["paths"].items():
            for operation in ops.values():
                for status in operation["responses"]:
                    assert (status.isdigit() and int(status) < 500) or status == "503", (path, status)


async def test_bad_input_never_answers_500(tmp_path: Path) -> None:
    """A sweep of hostile values through every route that takes input: each answer is documented for
    that route and none is a 5xx."""
    hostile: list[Any] = [None, 0, -1, 2**64, 1.5, True, "", " x", "\x00", "\ud800", [], {}, "a" * 3000]
    async with api(tmp_path) as a:
        lease = await _lease(a, 1)
        for op in OPS:
            if op.body is None:
                continue
            path = op.openapi_path.replace("{work_id}", lease.work_id).replace(
                "{execution_id}", lease.execution_id
            )
            path = path.replace("{timer_id}", "t").replace("{key}", "order/1").replace("{event_id}", "ev")
            documented = {int(s) for s in op.ok} | {k.status for k in op.documented_errors()}
            for field in op.body:
                for value in hostile:
                    body = json.dumps({field.name: value})
                    response = await a.client.post(path, content=body, headers=_bearer(lease) | JSON)
                    assert response.status_code < 500, (op.path, field.name, value, response.text)
                    assert response.status_code in documented, (
                        op.path,
                        field.name,
                        value,
                        response.status_code,
                    )


async def test_make_app_without_metrics_or_clock_still_answers(tmp_path: Path) -> None:
    async with api(tmp_path, test_clock=False) as a:
        app = make_app(a.rt)
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://localhost"
        ) as client:
            assert (await client.get("/metrics")).status_code == 200
            assert (await client.get("/healthz")).json()["test_clock"] is False
