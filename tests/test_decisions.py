"""The kernel's pure decisions, tested directly: first match, handler-free decisions,
causal position, trigger selection and Work kind policy."""

from __future__ import annotations

import fnmatch

from hypothesis import given
from hypothesis import strategies as st

from loom import Config, Drop, Event, Unmatched
from loom.kernel.causal import position, utc_minute
from loom.kernel.executions import kind_policy, select_trigger
from loom.kernel.resolve import decide_without_handler, first_match
from loom.testing import T0_MS

SEGMENTS = st.sampled_from(["issue", "pr", "x", "build", "*"])
PATTERNS = st.lists(st.lists(SEGMENTS, min_size=1, max_size=2).map(".".join), max_size=3)
TYPES = st.lists(st.sampled_from(["issue", "pr", "x", "build"]), min_size=1, max_size=2).map(".".join)


def event(type: str = "x.y", *, id: str = "e", depth: int = 0, root: str | None = None) -> Event:
    return Event(
        id=id,
        seq=1,
        source="s",
        delivery_id=id,
        type=type,
        scope="acme",
        key=None,
        work_id=None,
        execution_id=None,
        payload={},
        parent_id=None,
        cause_id=None,
        root_id=root or id,
        depth=depth,
        accepted_at_ms=T0_MS,
    )


def config_with(patterns: list[list[str]]) -> Config:
    routes = [{"name": f"r{i}", "types": p, "create_work": True} for i, p in enumerate(patterns)]
    return Config.from_dict({"scopes": {"acme": {"routes": routes}}})


@given(st.lists(PATTERNS, max_size=5), TYPES)
def test_first_match_is_the_first_route_whose_filter_passes(
    patterns: list[list[str]], event_type: str
) -> None:
    from loom.config import effective_routes

    routes = effective_routes(config_with(patterns), "acme")
    chosen = first_match(routes, event_type)
    passing = [
        i for i, p in enumerate(patterns) if not p or any(fnmatch.fnmatchcase(event_type, x) for x in p)
    ]
    if not passing:
        assert chosen is None
    else:
        assert chosen is not None
        assert chosen.name == f"r{passing[0]}"


def test_no_match_and_drop_routes_decide_without_a_handler() -> None:
    config = Config.from_dict(
        {
            "scopes": {
                "acme": {
                    "routes": [
                        {
                            "name": "bots",
                            "types": ["bot.*"],
                            "policy": "drop",
                            "reason": "bots never start work",
                        },
                        {"name": "work", "types": ["job.*"], "create_work": True},
                    ]
                }
            }
        }
    )
    from loom.config import effective_routes

    routes = effective_routes(config, "acme")
    unmatched = decide_without_handler(config, first_match(routes, "other.x"), event("other.x"))
    assert unmatched is not None
    assert isinstance(unmatched[0], Unmatched)
    assert unmatched[1] is None
    dropped = decide_without_handler(config, first_match(routes, "bot.say"), event("bot.say"))
    assert dropped is not None
    assert dropped[0] == Drop(reason="bots never start work")
    assert dropped[1] is not None
    assert dropped[1].name == "bots"
    assert decide_without_handler(config, first_match(routes, "job.run"), event("job.run")) is None


def test_cited_causation_takes_the_deeper_chain_and_charges_both_roots() -> None:
    trigger = event(id="t", depth=5, root="A")
    cause = event(id="c", depth=9, root="B")
    cited = position(trigger, cause)
    assert (cited.root_id, cited.depth, cited.charged_roots) == ("B", 10, ("B", "A"))
    assert position(trigger, None).charged_roots == ("A",)
    assert position(trigger, event(id="c2", depth=1, root="A")).charged_roots == ("A",)


def test_the_minute_bucket_is_the_fixed_utc_minute() -> None:
    assert utc_minute(T0_MS + 59_999) == utc_minute(T0_MS) == T0_MS // 60_000
    assert utc_minute(T0_MS + 60_000) == utc_minute(T0_MS) + 1


def test_trigger_selection_by_work_kind_and_out_of_range_answers() -> None:
    inputs = [event(id=f"e{i}") for i in range(3)]
    config = Config.from_dict({"work_kinds": {"latest": {"trigger": "newest"}, "plain": {}}})
    newest = kind_policy(config, "latest").select_trigger
    assert (select_trigger(inputs, newest) or inputs[0]).id == "e2"
    assert (select_trigger(inputs, kind_policy(config, "plain").select_trigger) or inputs[1]).id == "e0"
    assert (select_trigger(inputs, lambda _: 7) or inputs[1]).id == "e0"  # out of range: the first
    assert select_trigger([], None) is None
    assert kind_policy(config, "unknown") == kind_policy(config, None)
