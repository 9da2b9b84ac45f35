"""A client generated from ``GET /openapi.json`` calls every operation of a real ``loom serve`` (Hypercorn,
a file store, the test clock) and checks each answer against the schema the document gives for its
status: the document types every answer, so a generated client can rely on it (docs/http-api.md).

The client knows nothing of loom but the document: each call names an ``operationId``, its path
parameters, query and body are checked against the operation's declared parameters, and the answer is
validated (``$ref`` resolved in the document's components)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import jsonschema_rs
import trio
from service_kit import CONFIG, order

import loom
from loom.service.serve import open_service, run_http
from loom.testing import T0_MS


class GeneratedClient:
    """Operations by ``operationId``, built from an OpenAPI 3.1 document alone."""

    def __init__(self, document: dict[str, Any], http: httpx.AsyncClient) -> None:
        self.http = http
        self.components = document["components"]
        self.operations: dict[str, tuple[str, str, dict[str, Any]]] = {}
        for path, methods in document["paths"].items():
            for method, operation in methods.items():
                self.operations[operation["operationId"]] = (method.upper(), path, operation)
        self.called: set[str] = set()

    def _check(self, schema: dict[str, Any], value: Any, what: str) -> None:
        root = {**schema, "components": self.components}
        errors = [e.message for e in jsonschema_rs.validator_for(root).iter_errors(value)]
        assert not errors, f"{what} does not match its documented schema: {errors[:3]}"

    async def call(
        self, operation_id: str, *, query: dict[str, Any] | None = None, body: Any = None, **path: str
    ) -> tuple[int, Any]:
        method, template, operation = self.operations[operation_id]
        declared = {p["name"]: p for p in operation.get("parameters", [])}
        for name, value in path.items():
            assert declared[name]["in"] == "path", name
            template = template.replace("{" + name + "}", value)
        for name, value in (query or {}).items():
            assert declared[name]["in"] == "query", name
            self._check(declared[name]["schema"], value, f"{operation_id} query {name}")
        if body is not None:
            schema = operation["requestBody"]["content"]["application/json"]["schema"]
            self._check(schema, body, f"{operation_id} request body")
        response = await self.http.request(method, template, params=query, json=body)
        documented = operation["responses"].get(str(response.status_code))
        assert documented is not None, f"{operation_id} answered an undocumented {response.status_code}"
        media = response.headers["content-type"].partition(";")[0]
        content = documented["content"][media]
        value = response.json() if media.endswith("json") else response.text
        self._check(content["schema"], value, f"{operation_id} {response.status_code} answer")
        self.called.add(operation_id)
        return response.status_code, value


async def test_a_generated_client_round_trips_every_operation(tmp_path: Path) -> None:
    """Catches an answer without a schema (an untyped client), a schema that says something other
    than the answer (a missing field, a wrong type, a record renamed), and an operation the document
    lists that cannot be called as documented."""
    async with (
        open_service(
            str(tmp_path / "api.db"), config=CONFIG, test_clock=loom.ManualClock(start_ms=T0_MS),
            load_entry_points=False,
        ) as service,
        trio.open_nursery() as nursery,
    ):  # fmt: skip
        rt = service.runtime
        urls = await nursery.start(run_http, service.app, "127.0.0.1:0")
        async with httpx.AsyncClient(base_url=urls[0]) as http:
            document = (await http.get("/openapi.json")).json()
            c = GeneratedClient(document, http)
            assert (await c.call("get_healthz"))[0] == 200
            assert (await c.call("get_openapi_json"))[0] == 200
            status, event = await c.call("post_events", body=order(1))
            assert status == 201
            status, batch = await c.call("post_events", body=[order(n) for n in (1, 2, 3, 4)])
            assert [r["status"] for r in batch["results"]] == [200, 201, 201, 201]
            await rt.wait_idle()
            _, page = await c.call("get_events", query={"limit": 2})
            assert page["next_after"] == 2
            await c.call("get_events_event_id", event_id=event["id"])
            _, works = await c.call("get_work", query={"limit": 1000})
            assert works["next_after"] is None
            assert len(works["work"]) == 4
            ids = {w["keys"][0]: w["id"] for w in works["work"]}
            await c.call("get_work_work_id", work_id=ids["order/1"])
            await c.call("get_work_by_key_key", key="order/2")
            await c.call("get_ui_work")
            await c.call("get_ui_work_page", work_id=ids["order/1"])
            # the controls
            await c.call("post_work_work_id_hold", work_id=ids["order/3"], body={"reason": "stock"})
            await c.call("post_work_work_id_release", work_id=ids["order/3"])
            await c.call("post_work_work_id_retry", work_id=ids["order/3"], body={})
            await c.call("post_work_work_id_replay", work_id=ids["order/3"], body={"event_id": event["id"]})
            await c.call("post_work_work_id_cancel", work_id=ids["order/3"])
            # the toolbelt, with real leases
            first = await rt.claim(ids["order/1"], owner="client")
            second = await rt.claim(ids["order/2"], owner="client")
            third = await rt.claim(ids["order/4"], owner="client")
            token = {"Authorization": f"Bearer {first.token}"}
            http.headers.update(token)
            emitted = {**order("e"), "delivery_id": "e-1"}
            await c.call("post_executions_execution_id_emit", execution_id=first.execution_id, body=emitted)
            await c.call(
                "post_executions_execution_id_child", execution_id=first.execution_id, body={"name": "kid"}
            )
            timer = {
                "id": "tb-1",
                "fire_at_ms": T0_MS + 60_000,
                "source": "t",
                "type": "t.x",
                "scope": "shop",
            }
            await c.call("post_executions_execution_id_timer", execution_id=first.execution_id, body=timer)
            await c.call("post_executions_execution_id_heartbeat", execution_id=first.execution_id)
            await c.call(
                "post_executions_execution_id_complete",
                execution_id=first.execution_id,
                body={"outcome": "completed"},
            )
            http.headers["Authorization"] = f"Bearer {second.token}"
            await c.call(
                "post_executions_execution_id_wait", execution_id=second.execution_id, body={"types": ["x.*"]}
            )
            del http.headers["Authorization"]
            # an attempt launched by no executor has no interrupt capability: a documented refusal
            await c.call("post_work_work_id_interrupt", work_id=third.work_id, body={"reason": "stop"})
            # timers, diagnostics, the test clock, metrics
            armed = {"id": "t-1", "fire_at_ms": T0_MS + 60_000, "source": "c", "type": "t.y", "scope": "shop"}
            _, made = await c.call("post_timers", body=armed)
            await c.call("get_timers", query={"state": "armed"})
            await c.call("get_timers_timer_id", timer_id="t-1")
            await c.call("post_timers_timer_id_cancel", timer_id="t-1", body={"revision": made["revision"]})
            await c.call("get_diagnostics")
            await c.call("get_debug_clock")
            await c.call("post_debug_clock", body={"advance_ms": 1000})
            await c.call("get_metrics")
            await c.call("post_compact", body={"dry_run": True})
            # the watch stream: a hold after the stream opened arrives as a work event
            method, path, operation = c.operations["get_watch"]
            async with http.stream(method, path, params={"limit": 1}) as stream:
                assert stream.headers["content-type"].startswith("text/event-stream")
                lines = stream.aiter_lines()
                assert (await anext(lines)).startswith(": watching")
                await rt.hold(ids["order/2"], reason="watched")
                rest = [line async for line in lines]
            c.called.add("get_watch")
            assert rest[1] == "event: work", rest
            change = json.loads(rest[2].removeprefix("data: "))
            assert (change["work"]["id"], change["work"]["held"]) == (ids["order/2"], True)
            c._check(document["components"]["schemas"]["Work"], change["work"], "a watched Work")
            assert operation["responses"]["200"]["content"].keys() == {"text/event-stream"}
        assert c.called == set(c.operations), f"not called: {set(c.operations) - c.called}"
        nursery.cancel_scope.cancel()
