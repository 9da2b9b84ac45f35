"""What a valid configuration may still get wrong (``loom config check``, and ``loom serve`` at start):
routes whose Work nothing can start, bindings, Work kinds and scopes nothing uses, schedule routes
nothing feeds. Each is a `Finding` naming the key and saying what follows; nothing here is refused
(`Config.validate` refuses what cannot run at all).

Schedules are armed timers, not configuration: `check_schedules` takes what the store holds.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

import attrs

from ._keys import key_path
from .config import Config
from .model import EffectiveRoute, WorkKindPolicy
from .resolve import scope_ancestry


@attrs.frozen(kw_only=True)
class Finding:
    """One thing the configuration (or what runs on it) gets wrong: where, and what follows."""

    key: str
    message: str

    def __str__(self) -> str:
        return f"{self.key}: {self.message}"


@attrs.frozen(kw_only=True)
class ArmedSchedule:
    """A recurring timer as `check_schedules` sees it: the Event type and scope it fires."""

    timer_id: str
    type: str
    scope: str


def _route_key(route: EffectiveRoute) -> str:
    return f"{key_path('scopes', route.scope)}.routes[{route.index}]"


def _targets(config: Config) -> list[str]:
    """Every declared scope: routes and bindings resolve in each (an Event's own scope may be undeclared:
    it sees its nearest declared ancestor's, which is one of these)."""
    return sorted(config.scopes)


def check_config(
    config: Config,
    *,
    standing_handlers: Mapping[str, str] | None = None,
    plugin_kinds: Collection[str] = (),
) -> list[Finding]:
    """Routes that create Work no binding starts, bindings no route names, Work kinds no route gives,
    scopes where no route is in force. ``standing_handlers``: route handlers that give their Work a
    standing kind of their own (the ``schedule`` handler's ``schedule``); ``plugin_kinds``: the kinds
    plugins define (a declared kind of the same name replaces one)."""
    findings: list[Finding] = []
    seen_routes: set[tuple[str, int]] = set()
    named_bindings: set[tuple[str, str]] = set()
    given_kinds: set[str] = set()
    for target in _targets(config):
        for route in config.routes_for(target):
            if route.binding is not None:
                named_bindings.add((route.binding.scope, route.binding.name))
            kind = route.route.work_kind or (standing_handlers or {}).get(route.route.handler)
            if kind is not None:
                given_kinds.add(kind)
            if (route.scope, route.index) in seen_routes:
                continue
            seen_routes.add((route.scope, route.index))
            if route.route.create_work and route.route.binding is None and route.route.policy.value != "drop":
                findings.append(
                    Finding(
                        key=_route_key(route),
                        message=f"route {route.route.name!r} creates Work but names no binding: nothing starts"
                        " that Work (its attempts run under the binding of the route that brought its input),"
                        " so it stays ready with a start_failed diagnostic; name a binding, or claim it from a"
                        " host",
                    )
                )
    for scope, declared in sorted(config.scopes.items()):
        for name in sorted(declared.bindings):
            if (scope, name) not in named_bindings:
                findings.append(
                    Finding(
                        key=key_path(key_path("scopes", scope), "bindings", name),
                        message=f"binding {name!r} is named by no route in force in scope {scope!r} or below"
                        " it: nothing runs on it",
                    )
                )
    for kind in sorted(config.work_kinds):
        if kind not in given_kinds and kind not in plugin_kinds:
            findings.append(
                Finding(
                    key=key_path("work_kinds", kind),
                    message=f"work kind {kind!r} is given by no route (work_kind = {kind!r}): no Work has it",
                )
            )
    for kind, policy in sorted(config.work_kinds.items()):
        findings += _idle_settings(kind, policy)
    for scope in _targets(config):
        if not config.routes_for(scope) and not _routes_below(config, scope):
            findings.append(
                Finding(
                    key=key_path("scopes", scope),
                    message=f"scope {scope!r} has no route in force, here or below it: every Event sent to"
                    " it is unmatched (it starts nothing)",
                )
            )
    return findings


def _idle_settings(kind: str, policy: WorkKindPolicy) -> list[Finding]:
    """The settings of a Work kind that change nothing: ``resume`` (whether a parked attempt resumes is
    its binding's ``resume`` capability), and a standing kind's retry budget (it has none)."""
    found: list[Finding] = []
    where = key_path("work_kinds", kind)
    if policy.resume:
        found.append(
            Finding(
                key=key_path(where, "resume"),
                message=f"work kind {kind!r} sets resume, which changes nothing: a parked attempt resumes"
                ' when its binding pins the resume capability (capabilities = ["resume"])',
            )
        )
    budget = WorkKindPolicy(retry_attempts=policy.retry_attempts)
    if policy.standing and (
        policy.retry_attempts != WorkKindPolicy().retry_attempts
        or policy.retry_backoff_ms != budget.retry_backoff_ms
        or policy.fail_on_exhaustion
    ):
        found.append(
            Finding(
                key=where,
                message=f"work kind {kind!r} is standing, and standing Work has no retry budget: its"
                " retry_attempts, retry_backoff_ms and fail_on_exhaustion change nothing (a failure is"
                " retried only when its executor says when)",
            )
        )
    return found


def _routes_below(config: Config, scope: str) -> bool:
    return any(
        other != scope and scope in scope_ancestry(other) and config.scopes[other].routes
        for other in config.scopes
    )


def check_schedules(
    config: Config, armed: Iterable[ArmedSchedule], *, schedule_handlers: Collection[str] = ("schedule",)
) -> list[Finding]:
    """Schedules that will never start anything: an armed recurring timer whose Event no route in its
    scope takes (it fires, and each occurrence is unmatched or dropped), and a route of a schedule
    handler that no armed schedule feeds (it waits for occurrences that never come)."""
    findings: list[Finding] = []
    fed: set[tuple[str, int]] = set()
    for timer in armed:
        route = _first_match(config, timer.scope, timer.type)
        if route is None or route.route.policy.value == "drop":
            what = "matches no route there" if route is None else f"is dropped by route {route.route.name!r}"
            findings.append(
                Finding(
                    key=f"timers.{timer.timer_id}",
                    message=f"schedule {timer.timer_id!r} fires {timer.type!r} Events in scope {timer.scope!r},"
                    f" which {what}: its occurrences start nothing",
                )
            )
        else:
            fed.add((route.scope, route.index))
    seen: set[tuple[str, int]] = set()
    for target in _targets(config):
        for route in config.routes_for(target):
            if route.route.handler not in schedule_handlers or (route.scope, route.index) in seen:
                continue
            seen.add((route.scope, route.index))
            if (route.scope, route.index) not in fed:
                findings.append(
                    Finding(
                        key=_route_key(route),
                        message=f"route {route.route.name!r} runs schedules, but no armed schedule fires its"
                        f" types ({', '.join(route.route.types) or 'any'}) in scope {route.scope!r} or below:"
                        " it never fires (arm one: POST /timers with a recurrence)",
                    )
                )
    return findings


def _first_match(config: Config, scope: str, event_type: str) -> EffectiveRoute | None:
    try:
        routes = config.routes_for(scope)
    except Exception:
        return None
    return next((route for route in routes if route.matches(event_type)), None)
