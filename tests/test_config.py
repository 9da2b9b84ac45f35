"""The configuration layer: loading, inheritance, validation errors and generations (docs/configuration.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

import loom
from loom import Capability, CausalLimits, Config, ConfigError, Policy
from loom.config import (
    Binding,
    ConfigHolder,
    Route,
    ScopeConfig,
    Synchronous,
    WorkKindPolicy,
    effective_bindings,
    effective_routes,
    retry_delays,
)
from loom.plugins.registry import offered

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "loom.toml"

INHERITANCE = """
[[scopes.acme.routes]]
name = "a"
types = ["a.*"]
[[scopes.acme.routes]]
name = "b"
types = ["b.acme"]
[[scopes.acme.routes]]
name = "c"
types = ["x.*"]

[[scopes."acme/web".routes]]
name = "b"
types = ["b.web"]
[[scopes."acme/web".routes]]
name = "d"
types = ["x.*"]
"""

# A base that the validation cases below extend or edit.
BASE = """
[scopes.acme.bindings.fake]
executor = "fake"
capabilities = ["inject"]

[[scopes.acme.routes]]
name = "first"

[[scopes."acme/web".routes]]
name = "by-key"
types = ["issue.*"]
create_work = true
binding = "fake"
policy = "inject"
"""

ALL_CAPABILITIES = {"fake": {"inject", "interrupt", "resume", "adopt"}}


def load(text: str) -> Config:
    return Config.from_toml(text, file="loom.toml")


def refused(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load(text)
    return info.value


def assert_names(error: ConfigError, key: str, reason: str) -> None:
    assert error.file == "loom.toml"
    assert error.key == key
    assert reason in error.reason
    assert str(error).startswith(f"loom.toml: {key}: ")


# -- defaults ------------------------------------------------------------------------------------------


def test_default_config_has_default_causal_limits_and_no_routes() -> None:
    config = Config()
    assert config.causal == CausalLimits(max_depth=32, per_minute=128)
    assert isinstance(config.causal, CausalLimits)
    assert config.generation == 1
    assert config.store.synchronous is Synchronous.FULL
    assert effective_routes(config, "acme/web") == ()
    assert load("") == config


def test_causal_and_store_tables_are_read() -> None:
    config = load('[causal]\nmax_depth = 8\nper_minute = 10\n[store]\nsynchronous = "NORMAL"\n')
    assert config.causal == CausalLimits(max_depth=8, per_minute=10)
    assert config.store.synchronous is Synchronous.NORMAL


def test_route_defaults() -> None:
    route = load('[[scopes.acme.routes]]\nname = "r"\n').scopes["acme"].routes[0]
    assert route == Route(name="r")
    assert route.handler == "correlate"
    assert route.policy is Policy.QUEUE
    assert route.types == ()
    assert route.create_work is False
    assert route.matches("anything.at.all")


# -- inheritance ---------------------------------------------------------------------------------------


def test_descendant_route_replaces_in_its_slot_and_new_names_append() -> None:
    config = load(INHERITANCE)
    routes = effective_routes(config, "acme/web")
    assert [(r.name, r.scope) for r in routes] == [
        ("a", "acme"),
        ("b", "acme/web"),
        ("c", "acme"),
        ("d", "acme/web"),
    ]
    assert routes[1].route.types == ("b.web",)
    assert [r.slot for r in routes] == [0, 1, 2, 3]
    assert routes[1].key == 'scopes."acme/web".routes[0]'
    assert routes[2].key == "scopes.acme.routes[2]"
    assert all(r.target == "acme/web" for r in routes)


def test_ancestor_scope_keeps_its_own_routes() -> None:
    routes = effective_routes(load(INHERITANCE), "acme")
    assert [(r.name, r.scope) for r in routes] == [("a", "acme"), ("b", "acme"), ("c", "acme")]


def test_first_matching_route_in_effective_order_is_the_inherited_one() -> None:
    routes = effective_routes(load(INHERITANCE), "acme/web")
    assert [r.name for r in routes if r.matches("x.one")] == ["c", "d"]
    assert [r.name for r in routes if r.matches("b.acme")] == []
    assert [r.name for r in routes if r.matches("b.web")] == ["b"]


def test_undeclared_scopes_inherit_from_their_nearest_declared_ancestors() -> None:
    config = load('[[scopes."acme/web".routes]]\nname = "only"\n')
    assert effective_routes(config, "acme") == ()
    assert [r.name for r in effective_routes(config, "acme/web/deep/er")] == ["only"]
    assert [r.name for r in effective_routes(config, "acme/webby")] == []


def test_nearest_binding_replaces_the_whole_inherited_binding() -> None:
    config = load(
        """
        [scopes.acme.bindings.agent]
        executor = "shell"
        capabilities = ["inject", "adopt"]
        config = { command = "agent", env = { A = "1" } }

        [scopes.acme.bindings.other]
        executor = "python"

        [scopes."acme/web".bindings.agent]
        executor = "python"
        config = { env = { B = "2" } }

        [[scopes.acme.routes]]
        name = "r"
        binding = "agent"
        """
    )
    web = effective_bindings(config, "acme/web/x")
    assert web["agent"].scope == "acme/web"
    assert web["agent"].binding == Binding(executor="python", config={"env": {"B": "2"}})
    assert web["agent"].binding.capabilities == frozenset()
    assert web["other"].scope == "acme"
    assert effective_bindings(config, "acme")["agent"].binding.config == {
        "command": "agent",
        "env": {"A": "1"},
    }

    (inherited,) = effective_routes(config, "acme/web")
    assert inherited.scope == "acme"
    assert inherited.binding is not None
    assert inherited.binding.scope == "acme/web"
    assert inherited.binding.executor == "python"
    (at_home,) = effective_routes(config, "acme")
    assert at_home.binding is not None
    assert at_home.binding.executor == "shell"


def test_inherited_route_takes_its_fallback_where_the_target_scope_binding_lacks_the_capability() -> None:
    config = load(
        """
        [scopes.acme.bindings.agent]
        executor = "fake"
        capabilities = ["inject"]
        [scopes."acme/web".bindings.agent]
        executor = "fake"

        [[scopes.acme.routes]]
        name = "r"
        binding = "agent"
        policy = "inject"
        fallback = "queue"
        """
    )
    (home,) = effective_routes(config, "acme")
    assert (home.policy, home.fallback_reason) == (Policy.INJECT, None)
    (web,) = effective_routes(config, "acme/web")
    assert web.policy is Policy.QUEUE
    assert web.fallback_reason == "binding 'agent' (scope 'acme/web') does not pin inject"


def test_fallback_chain_takes_the_first_supported_policy() -> None:
    config = load(
        """
        [scopes.acme.bindings.agent]
        executor = "fake"
        capabilities = ["inject"]
        [[scopes.acme.routes]]
        name = "r"
        binding = "agent"
        policy = "interrupt"
        fallback = ["inject", "drop"]
        reason = "no way to deliver"
        """
    )
    (route,) = effective_routes(config, "acme")
    assert route.route.fallback == (Policy.INJECT, Policy.DROP)
    assert route.policy is Policy.INJECT
    assert route.fallback_reason == "binding 'agent' (scope 'acme') does not pin interrupt"


NAMES = st.lists(st.sampled_from("abcdefg"), unique=True, max_size=5)
LEVELS = st.lists(st.tuples(st.booleans(), NAMES), min_size=1, max_size=5)


def chain_config(levels: list[tuple[bool, list[str]]]) -> tuple[Config, list[str]]:
    """Scopes s0, s0/s1, ...; an undeclared level declares nothing. Each route's type names its level."""
    scopes = [("/".join(f"s{j}" for j in range(i + 1))) for i in range(len(levels))]
    declared = {
        scope: ScopeConfig(routes=tuple(Route(name=name, types=(f"{scope}.{name}",)) for name in names))
        for scope, (is_declared, names) in zip(scopes, levels, strict=True)
        if is_declared
    }
    return Config(scopes=declared), scopes


@given(LEVELS)
def test_inheritance_keeps_ancestor_slots_appends_new_names_and_uses_the_deepest_definition(
    levels: list[tuple[bool, list[str]]],
) -> None:
    config, scopes = chain_config(levels)
    previous: list[str] = []
    for depth, scope in enumerate(scopes):
        routes = effective_routes(config, scope)
        names = [r.name for r in routes]
        # The parent's effective names keep their slots; names new at this level follow, in declared order.
        assert names[: len(previous)] == previous
        declared_here = config.scopes[scope].routes if scope in config.scopes else ()
        assert names[len(previous) :] == [r.name for r in declared_here if r.name not in previous]
        for slot, route in enumerate(routes):
            deepest = next(
                s
                for s in reversed(scopes[: depth + 1])
                if s in config.scopes and config.scopes[s].route(route.name) is not None
            )
            assert route.scope == deepest
            assert route.route == config.scopes[deepest].route(route.name)
            assert route.route.types == (f"{deepest}.{route.name}",)
            assert config.scopes[deepest].routes[route.index] == route.route
            assert route.slot == slot
        previous = names
    # An undeclared descendant sees exactly what its nearest declared ancestor sees.
    leaf = effective_routes(config, scopes[-1] + "/leaf")
    assert [attrs.evolve(r, target=scopes[-1]) for r in leaf] == list(effective_routes(config, scopes[-1]))


@given(LEVELS)
def test_generated_configs_round_trip_through_plain_data(levels: list[tuple[bool, list[str]]]) -> None:
    config, _ = chain_config(levels)
    assert Config.from_dict(config.to_dict()) == config


# -- validation errors name the file, the key and the reason -------------------------------------------

ROUTE = 'scopes."acme/web".routes[0]'


@pytest.mark.parametrize(
    ("text", "key", "reason"),
    [
        pytest.param(
            BASE.replace('policy = "inject"', 'policy = "broadcast"'),
            f"{ROUTE}.policy",
            "unknown policy 'broadcast'; expected one of: queue, inject, interrupt, drop",
            id="unknown-policy",
        ),
        pytest.param(
            BASE.replace('policy = "inject"', 'policy = "coalesce"'),
            f"{ROUTE}.policy",
            "'coalesce' is not a policy: queue is lossless",
            id="coalesce",
        ),
        pytest.param(
            BASE.replace('policy = "inject"', 'policy = "inject"\nfallback = "coalesce"'),
            f"{ROUTE}.fallback",
            "'coalesce' is not a policy",
            id="coalesce-fallback",
        ),
        pytest.param(
            BASE.replace('policy = "inject"', 'policy = "inject"\nfallback = ["interrupt", "inject"]'),
            f"{ROUTE}.fallback[1]",
            "fallback cycle: inject -> interrupt -> inject",
            id="fallback-cycle",
        ),
        pytest.param(
            BASE.replace('policy = "inject"', 'policy = "interrupt"\nfallback = ["interrupt"]'),
            f"{ROUTE}.fallback[0]",
            "fallback cycle: interrupt -> interrupt",
            id="fallback-self-cycle",
        ),
        pytest.param(
            BASE.replace('policy = "inject"', 'policy = "inject"\nfallback = ["queue", "drop"]'),
            f"{ROUTE}.fallback[1]",
            "drop is unreachable: the chain already ends at queue",
            id="unreachable-fallback",
        ),
        pytest.param(
            BASE.replace('policy = "inject"', 'policy = "queue"\nfallback = "drop"'),
            f"{ROUTE}.fallback",
            "a queue route needs no capability, so it takes no fallback",
            id="fallback-on-queue",
        ),
        pytest.param(
            BASE.replace('policy = "inject"', 'policy = "inject"\nerror_fallback = "interrupt"'),
            f"{ROUTE}.error_fallback",
            "must be queue or drop, got interrupt",
            id="error-fallback-needs-capability",
        ),
        pytest.param(
            BASE.replace('capabilities = ["inject"]', "capabilities = []"),
            f"{ROUTE}.policy",
            "route 'by-key' cannot inject: binding 'fake' (scope 'acme') does not pin inject, "
            "and it has no queue or drop fallback",
            id="inject-without-capability",
        ),
        pytest.param(
            BASE.replace('policy = "inject"', 'policy = "interrupt"\nfallback = "inject"').replace(
                'capabilities = ["inject"]', "capabilities = []"
            ),
            f"{ROUTE}.policy",
            "does not pin interrupt; binding 'fake' (scope 'acme') does not pin inject",
            id="fallback-chain-without-capability",
        ),
        pytest.param(
            BASE.replace('binding = "fake"\n', ""),
            f"{ROUTE}.policy",
            "inject needs a binding that pins inject, and the route names no binding",
            id="inject-without-binding",
        ),
        pytest.param(
            BASE.replace('binding = "fake"', 'binding = "missing"'),
            f"{ROUTE}.binding",
            "unknown binding 'missing': no binding of that name in scope 'acme/web' or its ancestors",
            id="unknown-binding",
        ),
        pytest.param(
            BASE + '[scopes."acme/web".bindings.child]\nexecutor = "fake"\n'
            '[[scopes.acme.routes]]\nname = "uses-child"\nbinding = "child"\n',
            "scopes.acme.routes[1].binding",
            "unknown binding 'child': no binding of that name in scope 'acme'",
            id="binding-only-in-a-descendant",
        ),
        pytest.param(
            BASE + '[[scopes."acme/web".routes]]\nname = "by-key"\n',
            'scopes."acme/web".routes[1].name',
            "duplicate route name 'by-key' (first at routes[0])",
            id="duplicate-route-name",
        ),
        pytest.param(
            BASE.replace('policy = "inject"', 'polcy = "inject"'),
            f"{ROUTE}.polcy",
            "unknown key 'polcy' (did you mean 'policy'?)",
            id="unknown-route-key",
        ),
        pytest.param(
            BASE + "[routing]\nx = 1\n",
            "routing",
            "unknown key 'routing'",
            id="unknown-top-level-key",
        ),
        pytest.param(
            BASE + "[scopes.acme]\nlimit = 1\nroute = 2\n",
            "scopes.acme",
            "unknown keys 'limit', 'route' (did you mean 'routes'?)",
            id="unknown-keys-named",
        ),
        pytest.param(
            BASE + '[[scopes."acme/web".routes]]\ntypes = ["x"]\n',
            'scopes."acme/web".routes[1]',
            "missing required key 'name'",
            id="route-without-name",
        ),
        pytest.param(
            BASE.replace('types = ["issue.*"]', 'types = "issue.*"'),
            f"{ROUTE}.types",
            "must be an array, got str 'issue.*'",
            id="types-not-a-list",
        ),
        pytest.param(
            BASE.replace('types = ["issue.*"]', 'types = ["issue *"]'),
            f"{ROUTE}.types[0]",
            "must be an event type pattern",
            id="bad-type-pattern",
        ),
        pytest.param(
            BASE.replace("create_work = true", 'create_work = "yes"'),
            f"{ROUTE}.create_work",
            "must be true or false",
            id="bool-expected",
        ),
        pytest.param(
            BASE.replace('policy = "inject"', 'policy = "queue"\nreason = "why"'),
            f"{ROUTE}.reason",
            "only a route that can drop records a reason",
            id="reason-without-drop",
        ),
        pytest.param(
            BASE.replace('policy = "inject"', 'policy = "drop"'),
            f"{ROUTE}.create_work",
            "a drop route cannot create Work",
            id="drop-creating-work",
        ),
        pytest.param(
            BASE.replace('policy = "inject"', 'policy = "inject"\nconfig = { since = 2026-01-01 }'),
            f"{ROUTE}.config.since",
            "must be JSON data (no dates or times)",
            id="opaque-config-not-json",
        ),
        pytest.param(
            BASE + '[scopes."acme web"]\n',
            'scopes."acme web"',
            "a scope must be a path like 'org/team/repo'",
            id="bad-scope-name",
        ),
        pytest.param(
            BASE + "[scopes.acme]\ncapacity = 0\n",
            "scopes.acme.capacity",
            "must be an integer from 1 to 1000000, got 0",
            id="capacity-not-positive",
        ),
        pytest.param(
            BASE.replace('capabilities = ["inject"]', 'capabilities = ["inject", "teleport"]'),
            "scopes.acme.bindings.fake.capabilities[1]",
            "unknown capability 'teleport'; expected one of: inject, interrupt, resume, adopt",
            id="unknown-capability",
        ),
        pytest.param(
            BASE.replace('executor = "fake"\n', ""),
            "scopes.acme.bindings.fake",
            "missing required key 'executor'",
            id="binding-without-executor",
        ),
        pytest.param(
            BASE + "[causal]\nmax_depth = 0\n",
            "causal.max_depth",
            "must be an integer from 1 to 1024, got 0",
            id="causal-depth",
        ),
        pytest.param(
            BASE + "[causal]\nper_minute = true\n",
            "causal.per_minute",
            "must be an integer, got bool True",
            id="causal-rate-not-an-integer",
        ),
        pytest.param(
            BASE + '[store]\nsynchronous = "OFF"\n',
            "store.synchronous",
            "unknown synchronous level 'OFF'; expected one of: FULL, NORMAL",
            id="store-synchronous",
        ),
        pytest.param(
            BASE + "[work_kinds.job]\nretry_attempts = 11\n",
            "work_kinds.job.retry_attempts",
            "must be an integer from 1 to 10, got 11",
            id="retry-budget-bounded",
        ),
        pytest.param(
            BASE + "[work_kinds.job]\nretry_attempts = 4\nretry_backoff_ms = [1000, 2000]\n",
            "work_kinds.job.retry_backoff_ms",
            "must hold one delay per failure but the last: 3 for retry_attempts = 4, got 2",
            id="backoff-length",
        ),
        pytest.param(
            BASE + "[work_kinds.job]\nretry_attempts = 2\nretry_backoff_ms = [0]\n",
            "work_kinds.job.retry_backoff_ms[0]",
            "must be an integer from 1 to",
            id="backoff-positive",
        ),
    ],
)
def test_refused_config_names_file_key_and_reason(text: str, key: str, reason: str) -> None:
    assert_names(refused(text), key, reason)


def test_the_base_of_the_refusal_cases_is_accepted() -> None:
    (_, by_key) = effective_routes(load(BASE), "acme/web")
    assert by_key.policy is Policy.INJECT


def test_invalid_toml_is_refused_naming_the_file() -> None:
    error = refused("[scopes\n")
    assert error.file == "loom.toml"
    assert "not valid TOML" in str(error)


def test_load_names_a_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "absent.toml"
    with pytest.raises(ConfigError) as info:
        Config.load(missing)
    assert info.value.file == str(missing)
    assert "cannot read the file" in str(info.value)


def test_load_reads_a_file_and_names_it_in_errors(tmp_path: Path) -> None:
    path = tmp_path / "loom.toml"
    path.write_text(INHERITANCE)
    assert Config.load(path) == load(INHERITANCE)
    path.write_text('[[scopes.acme.routes]]\nname = "r"\npolicy = "coalesce"\n')
    with pytest.raises(ConfigError, match=r"loom\.toml: scopes\.acme\.routes\[0\]\.policy: 'coalesce'"):
        Config.load(path)


def test_records_built_in_python_are_held_to_the_same_rules() -> None:
    with pytest.raises(ConfigError, match=r"fallback\[0\]: fallback cycle: inject -> inject"):
        Route(name="r", policy=Policy.INJECT, fallback=(Policy.INJECT,))
    with pytest.raises(ConfigError, match=r"routes\[1\]\.name: duplicate route name 'r'"):
        ScopeConfig(routes=(Route(name="r"), Route(name="r")))
    with pytest.raises(ConfigError, match=r"scopes\.acme\.routes\[0\]\.binding: unknown binding 'b'"):
        Config(scopes={"acme": ScopeConfig(routes=(Route(name="r", binding="b"),))})


# -- validation against the registered plugins ---------------------------------------------------------


def test_executor_without_the_pinned_capability_is_refused_naming_the_route() -> None:
    config = load(BASE)
    with pytest.raises(ConfigError) as info:
        config.validate(executors={"fake": {"interrupt"}})
    assert_names(
        info.value,
        f"{ROUTE}.policy",
        "route 'by-key' cannot inject: executor 'fake' (binding 'fake') does not advertise inject",
    )


async def test_a_capability_advertised_without_its_method_is_not_offered() -> None:
    """An executor that lists ``inject`` and ``interrupt`` in its capabilities but has neither method
    does not offer them: an inject route through it is refused when the configuration loads. Catches a
    check of the list alone (seen: the route loaded, and every dispatch was an ambiguous answer retried
    until it gave up, the input left pending)."""

    class Boastful:
        capabilities = frozenset({"inject", "interrupt", "resume"})

        async def launch(self, request: Any, toolbelt: Any) -> Any:
            return loom.Completed()

        @loom.hookimpl
        def loom_executors(self) -> dict[str, Any]:
            return {"fake": self}

    assert offered(Boastful()) == {"resume"}  # (resume has launch to fall back on)
    with pytest.raises(ConfigError) as info:
        async with loom.open_runtime(":memory:", config=load(BASE), plugins=[Boastful()], actors=()):
            pass
    assert "cannot inject: executor 'fake' (binding 'fake') does not advertise inject" in str(info.value)
    assert "with its inject method" in str(info.value)


def test_binding_pinning_an_unadvertised_capability_is_refused() -> None:
    config = load(BASE.replace('policy = "inject"', 'policy = "inject"\nfallback = "queue"'))
    with pytest.raises(ConfigError) as info:
        config.validate(executors={"fake": {"interrupt"}})
    assert_names(
        info.value,
        "scopes.acme.bindings.fake.capabilities",
        "pins inject, which executor 'fake' does not advertise (it advertises: interrupt)",
    )


@pytest.mark.parametrize(
    ("plugins", "key", "reason"),
    [
        pytest.param(
            {"executors": {"shell": set()}},
            "scopes.acme.bindings.fake.executor",
            "unknown executor 'fake' (known: shell)",
            id="executor",
        ),
        pytest.param(
            {"handlers": {"explicit_work"}},
            "scopes.acme.routes[0].handler",
            "unknown route handler 'correlate' (known: explicit_work)",
            id="handler",
        ),
        pytest.param(
            {"work_kinds": {"agent"}},
            f"{ROUTE}.work_kind",
            "unknown work kind 'job' (known: agent)",
            id="work-kind",
        ),
    ],
)
def test_unknown_plugins_are_refused(plugins: dict[str, Any], key: str, reason: str) -> None:
    config = load(BASE.replace('policy = "inject"', 'policy = "inject"\nwork_kind = "job"'))
    with pytest.raises(ConfigError) as info:
        config.validate(**plugins)
    assert_names(info.value, key, reason)


def test_unknown_trigger_selection_is_refused() -> None:
    config = load(BASE + '[work_kinds.job]\ntrigger = "newest"\n')
    config.validate(triggers={"newest"})
    with pytest.raises(ConfigError) as info:
        config.validate(triggers=set())
    assert_names(info.value, "work_kinds.job.trigger", "unknown trigger selection 'newest' (known: first)")


def test_config_matching_its_plugins_validates() -> None:
    config = load(BASE + '[work_kinds.job]\ntrigger = "first"\n')
    config.validate(executors=ALL_CAPABILITIES, handlers={"correlate"}, work_kinds=set(), triggers=set())


# -- generations ---------------------------------------------------------------------------------------


def test_replace_puts_the_next_generation_in_force() -> None:
    holder = ConfigHolder(load(BASE), executors=ALL_CAPABILITIES)
    assert holder.current.generation == 1
    new = holder.replace(load(INHERITANCE))
    assert new.generation == 2
    assert holder.current is new
    assert [r.name for r in effective_routes(holder.current, "acme/web")] == ["a", "b", "c", "d"]


def test_refused_replace_leaves_the_old_generation_in_force() -> None:
    holder = ConfigHolder(load(BASE), executors=ALL_CAPABILITIES)
    first = holder.replace(load(BASE))
    lacking = load(
        BASE.replace('policy = "inject"', 'policy = "interrupt"').replace(
            'capabilities = ["inject"]', 'capabilities = ["interrupt"]'
        )
    )
    weaker = ConfigHolder(first, executors={"fake": {"inject"}})
    with pytest.raises(ConfigError, match=r"does not advertise interrupt"):
        weaker.replace(lacking)
    assert weaker.current is first
    assert weaker.current.generation == 2
    assert effective_routes(weaker.current, "acme/web")[1].policy is Policy.INJECT


def test_config_that_fails_to_load_never_reaches_the_holder() -> None:
    holder = ConfigHolder(load(BASE))
    with pytest.raises(ConfigError, match="fallback cycle"):
        holder.replace(load(BASE.replace('policy = "inject"', 'policy = "inject"\nfallback = ["inject"]')))
    assert holder.current.generation == 1
    assert holder.current == load(BASE)


def test_holder_refuses_an_initial_config_its_plugins_cannot_serve() -> None:
    with pytest.raises(ConfigError, match="unknown executor 'fake'"):
        ConfigHolder(load(BASE), executors={})


def test_generation_is_a_positive_integer() -> None:
    assert Config.from_toml("", generation=7).generation == 7
    for bad in (0, 2**63, True):
        with pytest.raises(ConfigError, match="generation: must be an integer from 1 to"):
            Config(generation=bad)


# -- work kinds and retry ------------------------------------------------------------------------------


def test_default_retry_budget_is_three_attempts_with_five_and_ten_minutes() -> None:
    policy = WorkKindPolicy()
    assert policy.retry_attempts == 3
    assert policy.retry_backoff_ms == (300_000, 600_000) == retry_delays(3)
    assert [policy.retry_delay_ms(n) for n in (1, 2, 3)] == [300_000, 600_000, None]


def test_four_attempt_budget_adds_fifteen_minutes() -> None:
    assert retry_delays(4) == (300_000, 600_000, 900_000)
    policy = load("[work_kinds.job]\nretry_attempts = 4\n").work_kinds["job"]
    assert policy.retry_backoff_ms == (300_000, 600_000, 900_000)
    assert [policy.retry_delay_ms(n) for n in (1, 2, 3, 4)] == [300_000, 600_000, 900_000, None]


def test_single_attempt_budget_never_retries() -> None:
    assert retry_delays(1) == ()
    assert WorkKindPolicy(retry_attempts=1).retry_delay_ms(1) is None


def test_standing_work_arms_no_automatic_retry() -> None:
    assert WorkKindPolicy(standing=True).retry_delay_ms(1) is None


def test_work_kind_table_is_read() -> None:
    text = """
    [work_kinds.job]
    standing = true
    run_once = true
    resume = true
    trigger = "newest"
    retry_attempts = 2
    retry_backoff_ms = [1000]
    reopen = true
    """
    assert load(text).work_kinds["job"] == WorkKindPolicy(
        standing=True,
        run_once=True,
        resume=True,
        trigger="newest",
        retry_attempts=2,
        retry_backoff_ms=(1000,),
        reopen=True,
    )


# -- the example file ----------------------------------------------------------------------------------


def test_example_file_loads_validates_and_round_trips() -> None:
    config = Config.load(EXAMPLE)
    config.validate(
        executors={"shell": {"inject", "interrupt", "adopt", "resume"}, "python": set()},
        handlers={"correlate", "explicit_work", "schedule"},
        work_kinds=set(),
        triggers=set(),
    )
    assert Config.from_dict(config.to_dict(), file="round-trip") == config
    assert attrs.evolve(config, generation=2) != config

    web = effective_routes(config, "acme/web")
    assert [(r.name, r.scope, r.policy) for r in web] == [
        ("ignored-bots", "acme/web", Policy.DROP),
        ("issues", "acme", Policy.QUEUE),
        ("nightly", "acme", Policy.QUEUE),
        ("reviews", "acme/web", Policy.INTERRUPT),
        ("deploys", "acme/web", Policy.DROP),
    ]
    assert web[1].fallback_reason == "binding 'agent' (scope 'acme/web') does not pin inject"
    assert effective_routes(config, "acme")[1].policy is Policy.INJECT
    assert config.scopes["acme"].bindings["agent"].capabilities == {
        Capability.INJECT,
        Capability.INTERRUPT,
        Capability.ADOPT,
    }
    assert config.work_kinds["agent"].retry_attempts == 4
    assert config.scopes["acme/web"].capacity == 2


# -- retention and compaction (docs/operations.md, "Retention") ------------------------------------------


def test_retention_durations_read_as_written_and_round_trip() -> None:
    config = Config.from_toml(
        '[retention]\nworks = "1d12h"\nevents = "forever"\ndiagnostics = 90000\ndedup = "30m"\n'
        '[compaction]\nevery = "5m"\nbatch = 50\n'
        '[scopes.acme.retention]\ntimers = "250ms"\n'
    )
    retention = config.retention
    assert (retention.works_ms, retention.events_ms, retention.diagnostics_ms, retention.dedup_ms) == (
        36 * 3_600_000,
        -1,
        90_000,
        1_800_000,
    )
    assert config.scopes["acme"].retention is not None
    assert config.scopes["acme"].retention.timers_ms == 250
    assert (config.compaction.every_ms, config.compaction.batch) == (300_000, 50)
    assert Config.from_dict(config.to_dict()) == config
    assert config.to_dict()["retention"] == {"works": "1d12h", "events": "forever", "diagnostics": "1m30s",
                                             "dedup": "30m"}  # fmt: skip


@pytest.mark.parametrize(
    ("toml", "key", "reason"),
    [
        ('[retention]\nworks = "a week"', "retention.works", "a duration such as '7d'"),
        ("[retention]\nevents = -2", "retention.events", "milliseconds from 0"),
        ('[retention]\ntimer = "1d"', "retention.timer", "did you mean 'timers'"),
        ('[scopes.acme.retention]\ndedup = "1d"', "scopes.acme.retention.dedup", "not tied to a scope"),
        ('[scopes.acme.retention]\ndiagnostics = "1d"', "scopes.acme.retention.diagnostics", "[retention]"),
        ('[compaction]\nevery = "forever"', "compaction.every", "a duration"),
        ('[compaction]\nevery = "10ms"', "compaction.every", "at least 1s"),
        ("[compaction]\nbatch = 0", "compaction.batch", "from 1 to"),
        ('[retention]\nworks = "200000w"', "retention.works", "at most"),
    ],
)
def test_a_bad_retention_names_the_file_and_key(toml: str, key: str, reason: str) -> None:
    """Catches: a retention read leniently (a typo keeping everything forever, or nothing)."""
    with pytest.raises(ConfigError) as caught:
        Config.from_toml(toml, file="loom.toml")
    assert (caught.value.file, caught.value.key) == ("loom.toml", key)
    assert reason in caught.value.reason
