"""Registry rules: scopes, shadowing, restrictions, reserved names, disposers, tools-change."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import attrs
import pytest

import dsh_core
from dsh_core import (
    Agent,
    Disposer,
    JsonSchemaError,
    RegistrationError,
    ToolDefinition,
    ToolOutput,
    ToolRegistration,
    ToolRestriction,
    ToolRuntime,
    define_tool,
    hookimpl,
)
from dsh_core._events import PIPELINE_EVENT_TYPES
from dsh_core.testing import FakeCodeRuntime, Recorder, StaticApproval, json_tool, make_input, make_runtime


def raw_tool(name: str, **overrides: object) -> ToolDefinition:
    async def body(args: object, run: object) -> object:
        return None

    fields: dict[str, object] = {
        "name": name,
        "description": f"raw {name}",
        "parameters": {"type": "object", "properties": {}},
        "output": ToolOutput(schema={}),
        "execute": body,
    }
    fields.update(overrides)
    return ToolDefinition(**fields)  # type: ignore[arg-type]


def test_register_and_get_returns_the_same_definition() -> None:
    runtime = ToolRuntime()
    tool = json_tool("echo")
    runtime.register(tool)
    assert runtime.get("echo") is tool
    assert runtime.get("missing") is None


def test_duplicate_in_global_layer_is_refused() -> None:
    runtime = ToolRuntime()
    runtime.register(json_tool("echo"))
    with pytest.raises(RegistrationError, match='tool "echo" is already registered'):
        runtime.register(json_tool("echo"))


def test_duplicate_in_one_scope_is_refused_but_other_layers_may_shadow() -> None:
    runtime = ToolRuntime()
    agent = Agent("a")
    runtime.register(json_tool("echo"))
    runtime.register(json_tool("echo"), agent)
    with pytest.raises(RegistrationError, match="already registered in this scope"):
        runtime.register(json_tool("echo"), agent)


@pytest.mark.parametrize("scoped_first", [True, False])
def test_scoped_registration_shadows_global_in_either_order(scoped_first: bool) -> None:
    runtime = ToolRuntime()
    agent = Agent("a")
    global_tool, scoped_tool = json_tool("echo"), json_tool("echo")
    if scoped_first:
        runtime.register(scoped_tool, agent)
        runtime.register(global_tool)
    else:
        runtime.register(global_tool)
        runtime.register(scoped_tool, agent)
    assert runtime.get("echo", agent) is scoped_tool
    assert runtime.get("echo") is global_tool
    assert [s.name for s in runtime.schemas(agent)] == ["echo"]


def test_scoped_tool_is_invisible_to_other_scopes_and_globally() -> None:
    runtime = ToolRuntime()
    a, b = Agent("a"), Agent("b")
    runtime.register(json_tool("mine"), a)
    assert runtime.get("mine", b) is None
    assert runtime.get("mine") is None


async def test_other_scopes_tool_executes_as_unknown() -> None:
    runtime = ToolRuntime()
    a, b = Agent("a"), Agent("b")
    runtime.register(json_tool("mine"), a)
    result = await runtime.execute(make_input("mine", agent=b))
    assert result.is_error and result.error.info is not None
    assert result.error.info.code == "UNKNOWN_TOOL"
    assert result.error.message == 'unknown tool "mine"'


def test_child_scope_inherits_parent_scope_registrations() -> None:
    runtime = ToolRuntime()
    preset = Agent("preset")
    child = Agent("child", parent=preset)
    tool = json_tool("shared")
    runtime.register(tool, preset)
    assert runtime.get("shared", child) is tool


@pytest.mark.parametrize("scope", [None, Agent("a")])
def test_run_code_is_reserved_everywhere(scope: Agent | None) -> None:
    runtime = ToolRuntime()
    with pytest.raises(RegistrationError, match='"run_code" is reserved'):
        runtime.register(json_tool("run_code"), scope)


def test_restrict_requires_a_scope() -> None:
    runtime = ToolRuntime()
    runtime.register(json_tool("a"))
    with pytest.raises(RegistrationError, match="requires a scope"):
        runtime.restrict(ToolRestriction(deny=["a"]), None)


def test_restrict_rejects_empty_filter() -> None:
    runtime = ToolRuntime()
    with pytest.raises(RegistrationError, match="no-op"):
        runtime.restrict(ToolRestriction(), Agent("a"))


@pytest.mark.parametrize(
    ("names", "message"),
    [
        ("a", "a restriction filter must be a list of tool names, got str"),
        (["a", 1], "a restriction filter lists tool names (non-empty str), got 1"),
        (["a", ""], "a restriction filter lists tool names (non-empty str), got ''"),
    ],
    ids=["a-str", "an-int-entry", "an-empty-entry"],
)
def test_restriction_filters_list_tool_names(names: object, message: str) -> None:
    for field in ("allow", "deny"):
        with pytest.raises(TypeError) as raised:
            ToolRestriction(**{field: names})  # type: ignore[arg-type]
        assert str(raised.value) == message


@pytest.mark.parametrize("scope", [["worker"], {"id": "worker"}], ids=["list", "dict"])
async def test_an_unhashable_scope_is_named_as_such(scope: object) -> None:
    runtime = make_runtime(json_tool("echo"))
    message = f"a scope must be None, an Agent or a hashable key, got {type(scope).__name__}"
    for lookup in (runtime.schemas, runtime.names, lambda s: runtime.get("echo", s)):
        with pytest.raises(TypeError) as raised:
            lookup(scope)
        assert str(raised.value) == message


class _AsyncCheck:
    async def __call__(self, execution: Any) -> str | None:
        return "no"


async def _async_guard(execution: Any) -> str | None:
    return "no"


@pytest.mark.parametrize(("guard", "label"), [(_async_guard, "_async_guard"), (_AsyncCheck(), "_AsyncCheck")])
def test_an_async_guard_is_refused_when_registered(guard: Any, label: str) -> None:
    """Its coroutine would be read as the reason (never awaited) and fail every call."""
    runtime = make_runtime(json_tool("echo"))
    with pytest.raises(TypeError) as raised:
        runtime.guard(guard)
    assert str(raised.value) == (
        f"guard() takes a plain function returning None or a reason; {label} is async "
        "(a check that must await belongs in a dsh_pre_execute listener)"
    )
    assert runtime._registry.view(None).guards == ()


def test_restrict_rejects_run_code() -> None:
    runtime = ToolRuntime()
    with pytest.raises(RegistrationError, match='reserved Code Mode transport "run_code"'):
        runtime.restrict(ToolRestriction(deny=["run_code"]), Agent("a"))


def test_restrict_rejects_unknown_names_listing_known_ones() -> None:
    runtime = ToolRuntime()
    runtime.register(json_tool("beta"))
    runtime.register(json_tool("alpha"))
    with pytest.raises(RegistrationError) as caught:
        runtime.restrict(ToolRestriction(allow=["nope", "zilch"]), Agent("a"))
    message = str(caught.value)
    assert 'tools "nope", "zilch"' in message
    assert "known inherited tools: alpha, beta" in message


def test_restrict_rejects_unknown_name_with_none_known() -> None:
    runtime = ToolRuntime()
    with pytest.raises(RegistrationError, match=r'tool "x"; known inherited tools: \(none\)'):
        runtime.restrict(ToolRestriction(deny=["x"]), Agent("a"))


def test_restrict_rejects_scope_local_names() -> None:
    runtime = ToolRuntime()
    agent = Agent("a")
    runtime.register(json_tool("local"), agent)
    with pytest.raises(RegistrationError, match='unknown inherited tool "local"'):
        runtime.restrict(ToolRestriction(deny=["local"]), agent)


def test_allow_filter_keeps_only_listed_and_excludes_later_globals() -> None:
    runtime = ToolRuntime()
    agent = Agent("a")
    runtime.register(json_tool("a"))
    runtime.register(json_tool("b"))
    runtime.restrict(ToolRestriction(allow=["a"]), agent)
    runtime.register(json_tool("later"))
    assert [s.name for s in runtime.schemas(agent)] == ["a"]


def test_deny_only_filter_admits_later_globals() -> None:
    runtime = ToolRuntime()
    agent = Agent("a")
    runtime.register(json_tool("a"))
    runtime.register(json_tool("b"))
    runtime.restrict(ToolRestriction(deny=["b"]), agent)
    runtime.register(json_tool("later"))
    assert [s.name for s in runtime.schemas(agent)] == ["a", "later"]


def test_restrictions_intersect_and_lift_independently() -> None:
    runtime = ToolRuntime()
    agent = Agent("a")
    for name in ("a", "b", "c"):
        runtime.register(json_tool(name))
    lift_first = runtime.restrict(ToolRestriction(allow=["a", "b"]), agent)
    runtime.restrict(ToolRestriction(allow=["b", "c"]), agent)
    assert runtime.names(agent) == ["b"]
    lift_first()
    assert runtime.names(agent) == ["b", "c"]


def test_scope_local_tools_stay_visible_under_allow_filter() -> None:
    runtime = ToolRuntime()
    agent = Agent("a")
    runtime.register(json_tool("g"))
    runtime.register(json_tool("mine"), agent)
    runtime.restrict(ToolRestriction(allow=[]), agent)
    assert runtime.names(agent) == ["mine"]


def test_parent_restriction_applies_to_children_and_child_restriction_not_to_parent() -> None:
    runtime = ToolRuntime()
    parent = Agent("p")
    child = Agent("c", parent=parent)
    for name in ("a", "b"):
        runtime.register(json_tool(name))
    runtime.restrict(ToolRestriction(deny=["a"]), parent)
    runtime.restrict(ToolRestriction(deny=["b"]), child)
    assert runtime.names(parent) == ["b"]
    assert runtime.names(child) == []


def test_restriction_filter_is_copied() -> None:
    runtime = ToolRuntime()
    agent = Agent("a")
    runtime.register(json_tool("a"))
    runtime.register(json_tool("b"))
    names = ["a"]
    runtime.restrict(ToolRestriction(allow=names), agent)
    names.append("b")
    assert runtime.names(agent) == ["a"]


def test_schemas_expose_only_name_description_parameters() -> None:
    runtime = ToolRuntime()

    async def body(args: object) -> int:
        return 1

    runtime.register(
        define_tool(
            name="add",
            description="adds",
            parameters={"a": {"type": "integer", "required": True}},
            output={"type": "integer"},
            execute=body,
            timeout_ms=5,
            is_concurrency_safe=lambda args: True,
            finalize_content=lambda e, r: None,
        )
    )
    (schema,) = runtime.schemas()
    assert schema.to_dict() == {
        "name": "add",
        "description": "adds",
        "parameters": {
            "type": "object",
            "properties": {"a": {"type": "integer"}},
            "required": ["a"],
        },
    }
    assert {field.name for field in attrs.fields(type(schema))} == {"name", "description", "parameters"}


def described(name: str, description: str) -> ToolDefinition:
    async def body(args: object) -> str:
        return description

    return define_tool(name=name, description=description, parameters={}, output={"type": "string"}, execute=body)


async def test_the_nearest_scope_wins_for_get_schemas_and_execute() -> None:
    # BEHAVIOUR e.2: global, then each chain layer farthest first, nearer layers overwriting same-name entries
    # (the name keeps its first position); the scope's own registration shadows them all.
    runtime = ToolRuntime()
    grandparent = Agent("grandparent")
    parent = Agent("parent", parent=grandparent)
    child = Agent("child", parent=parent)
    tools = {
        None: described("echo", "global"),
        grandparent: described("echo", "grandparent"),
        parent: described("echo", "parent"),
    }
    runtime.register(tools[None])
    runtime.register(described("later", "global later"))
    # The nearer layers register first: registration order must not decide which one wins.
    runtime.register(tools[parent], parent)
    runtime.register(tools[grandparent], grandparent)

    async def seen_by(scope: Agent | None) -> tuple[object, list[tuple[str, str]], object]:
        result = await runtime.execute(make_input("echo", agent=scope))
        assert not result.is_error, result
        return runtime.get("echo", scope), [(s.name, s.description) for s in runtime.schemas(scope)], result.value

    for scope, winner in [(None, None), (grandparent, grandparent), (parent, parent), (child, parent)]:
        description = tools[winner].description
        assert await seen_by(scope) == (
            tools[winner],
            [("echo", description), ("later", "global later")],
            description,
        ), scope

    own = described("echo", "child's own")
    runtime.register(own, child)
    assert await seen_by(child) == (own, [("echo", "child's own"), ("later", "global later")], "child's own")


def test_schemas_carry_only_json_plain_values_never_callbacks() -> None:
    # SPEC: schemas() is an explicit allowlist of name/description/parameters, deep copies, never leaks callbacks.
    async def program(tools: object) -> None:
        return None

    runtime = ToolRuntime(mode="both", code_runtime=FakeCodeRuntime(program))
    agent = Agent("a")

    async def add(args: object) -> int:
        return 1

    runtime.register(
        define_tool(
            name="add",
            description="adds",
            parameters={"a": {"type": "integer", "required": True}},
            output=ToolOutput(
                schema={"type": "integer"},
                render=lambda args, value: [],
                presentation_meta=lambda args, value: value,
            ),
            execute=add,
            timeout_ms=5,
            is_concurrency_safe=lambda args: True,
            finalize_content=lambda e, r: None,
        )
    )
    runtime.register(raw_tool("raw", parameters={"type": "object", "properties": {"n": {"default": [1, 2.5, None]}}}))
    runtime.register(raw_tool("mine"), agent)

    def plain(value: object, where: str) -> None:
        if isinstance(value, dict):
            assert type(value) is dict, where
            for key, item in value.items():
                assert type(key) is str, where
                plain(item, f"{where}.{key}")
        elif isinstance(value, list):
            assert type(value) is list, where
            for index, item in enumerate(value):
                plain(item, f"{where}[{index}]")
        else:
            assert value is None or type(value) in (str, int, float, bool), (where, value)

    for scope in (None, agent):
        schemas = runtime.schemas(scope)
        assert [s.name for s in schemas] == ["add", "raw"] + (["mine"] if scope else []) + ["run_code"]
        for schema in schemas:
            assert {field.name for field in attrs.fields(type(schema))} == {"name", "description", "parameters"}
            data = schema.to_dict()
            assert list(data) == ["name", "description", "parameters"]
            plain(data, schema.name)
            assert json.loads(json.dumps(data)) == data
            assert not any(callable(value) for value in (schema.name, schema.description, schema.parameters))

    def callback(args: object) -> None:
        return None

    with pytest.raises(
        dsh_core.NonJsonValueError, match=r'^tool "leaky" parameters must be lossless JSON: \$\.default: '
    ):
        runtime.register(raw_tool("leaky", parameters={"type": "object", "default": callback}))
    assert runtime.get("leaky") is None


def test_returned_schemas_cannot_be_mutated_and_lists_are_fresh() -> None:
    runtime = ToolRuntime()
    runtime.register(json_tool("a", parameters={"x": {"type": "string"}}))
    first = runtime.schemas()
    with pytest.raises(TypeError):
        first[0].parameters["properties"]["x"]["type"] = "number"  # type: ignore[index]
    first.clear()
    assert [s.name for s in runtime.schemas()] == ["a"]


def test_schemas_cache_is_invalidated_by_changes() -> None:
    runtime = ToolRuntime()
    dispose = runtime.register(json_tool("a"))
    assert runtime.names() == ["a"]
    dispose()
    assert runtime.names() == []


def test_disposer_is_idempotent_and_a_context_manager() -> None:
    runtime = ToolRuntime()
    recorder = Recorder()
    runtime.plugins.register(recorder)
    with runtime.register(json_tool("a")) as dispose:
        assert runtime.get("a") is not None
    assert runtime.get("a") is None
    changes = recorder.changes
    dispose()
    dispose()
    assert recorder.changes == changes


def test_a_registration_names_the_tool_as_registered() -> None:
    runtime = ToolRuntime()
    tool = json_tool("a")
    registration = runtime.register(tool)
    assert isinstance(registration, ToolRegistration) and isinstance(registration, Disposer)
    assert registration.definition is tool and registration.name == "a"
    assert ToolRuntime().register(json_tool("b"), Agent("x")).name == "b"


def test_disposer_removes_only_its_own_registration() -> None:
    runtime = ToolRuntime()
    dispose = runtime.register(json_tool("a"))
    dispose()
    replacement = json_tool("a")
    runtime.register(replacement)
    dispose()
    assert runtime.get("a") is replacement


def test_every_change_fires_tools_change_unfiltered() -> None:
    runtime = ToolRuntime()
    recorder = Recorder()
    runtime.plugins.register(recorder)
    agent = Agent("a")
    dispose = runtime.register(json_tool("g"))
    assert recorder.changes == 1
    scoped = runtime.register(json_tool("s"), agent)
    assert recorder.changes == 2
    lift = runtime.restrict(ToolRestriction(deny=["g"]), agent)
    assert recorder.changes == 3
    lift()
    scoped()
    dispose()
    assert recorder.changes == 6
    runtime.guard(lambda execution: None)
    assert recorder.changes == 6  # guards do not change the visible set


def test_a_substitute_takes_the_tools_place_in_its_scope_until_disposed() -> None:
    """What a simulation stands in with: the same names everywhere, no tools-change, the original back after."""
    runtime = ToolRuntime()
    recorder = Recorder()
    worker = Agent("worker")
    first, real, last, scoped = json_tool("first"), json_tool("t"), json_tool("last"), json_tool("t")
    for tool in (first, real, last):
        runtime.register(tool)
    runtime.register(scoped, worker)
    runtime.restrict(ToolRestriction(deny=["first"]), worker)
    runtime.plugins.register(recorder)
    substitute = json_tool("t")
    restore = runtime._registry.substitute(substitute, None)
    assert runtime.get("t") is substitute and runtime.names() == ["first", "t", "last"]
    assert runtime.get("t", worker) is scoped and runtime.names(worker) == ["t", "last"]
    restore()
    restore()
    assert runtime.get("t") is real and runtime.names() == ["first", "t", "last"]
    assert recorder.changes == 0
    with pytest.raises(RegistrationError, match='no tool "first" is registered in this scope to substitute'):
        runtime._registry.substitute(json_tool("first"), worker)
    with pytest.raises(RegistrationError, match='no tool "nope" is registered in this scope to substitute'):
        runtime._registry.substitute(json_tool("nope"), None)


@pytest.mark.parametrize("scoped", [False, True])
def test_a_registration_disposed_while_a_substitute_stands_in_stays_disposed(scoped: bool) -> None:
    """The owner unregisters during a simulation: the stand-in goes, and no restore brings the tool back."""
    runtime = ToolRuntime()
    scope = Agent("worker") if scoped else None
    registration = runtime.register(json_tool("t"), scope)
    outer = runtime._registry.substitute(json_tool("t"), scope)
    inner = runtime._registry.substitute(json_tool("t"), scope)  # a stand-in for the stand-in
    registration()
    assert runtime.names(scope) == []
    inner()
    outer()
    assert runtime.names(scope) == []
    replacement = json_tool("t")
    runtime.register(replacement, scope)  # the name is free again
    assert runtime.get("t", scope) is replacement


def test_nested_substitutes_restore_in_turn_and_the_registration_still_disposes() -> None:
    runtime = ToolRuntime()
    real, outer_tool, inner_tool = json_tool("t"), json_tool("t"), json_tool("t")
    registration = runtime.register(real)
    outer = runtime._registry.substitute(outer_tool, None)
    inner = runtime._registry.substitute(inner_tool, None)
    assert runtime.get("t") is inner_tool
    inner()
    assert runtime.get("t") is outer_tool
    outer()
    assert runtime.get("t") is real
    registration()
    assert runtime.names() == []


def test_the_view_cache_stays_bounded_as_agents_churn() -> None:
    runtime = ToolRuntime()
    tool = json_tool("t")
    runtime.register(tool)
    shared = runtime._registry.view(None)
    for index in range(5000):
        agent = Agent(f"task-{index}")
        assert runtime.get("t", agent) is tool
    assert len(runtime._registry._views) <= 4096
    assert runtime._registry.view(None) is shared  # the global view outlives the clearing
    assert runtime.names(Agent("late")) == ["t"]


def test_failing_tools_change_listener_rolls_registration_back() -> None:
    runtime = ToolRuntime()

    class Refuse:
        @hookimpl
        def dsh_tools_change(self) -> None:
            raise RuntimeError("listener refuses")

    runtime.plugins.register(Refuse())
    with pytest.raises(RuntimeError, match="listener refuses"):
        runtime.register(json_tool("a"))
    assert runtime.get("a") is None
    assert runtime.schemas() == []


class RefuseWhileArmed:
    """A tools-change listener that raises while ``armed`` (and counts every notification)."""

    def __init__(self) -> None:
        self.armed = False
        self.notified = 0

    @hookimpl
    def dsh_tools_change(self) -> None:
        self.notified += 1
        if self.armed:
            self.armed = False  # refuses once; the rollback's own notification goes through
            raise RuntimeError("listener refuses")


REFUSABLE_CHANGES = {
    "restrict": lambda rt, agent: rt.restrict(ToolRestriction(deny=["a"]), agent),
    "present_as": lambda rt, agent: rt.present_as("code", agent),
    "defer_tools": lambda rt, agent: rt.defer_tools(["a"], agent),
    "load_tools": lambda rt, agent: rt.load_tools(["b"], agent),
    "register": lambda rt, agent: rt.register(json_tool("c"), agent),
}


@pytest.mark.parametrize("change", list(REFUSABLE_CHANGES))
def test_a_change_a_listener_refuses_is_rolled_back_and_announced(change: str) -> None:
    runtime = ToolRuntime()
    runtime.register(json_tool("a"))
    runtime.register(define_tool(name="b", description="d", parameters={}, output={"type": "json"},
                                 execute=lambda args: None, defer_loading=True))  # fmt: skip
    agent = Agent("x")
    listener = RefuseWhileArmed()
    runtime.plugins.register(listener)
    before = [schema.name for schema in runtime.schemas(agent)]
    listener.armed = True
    with pytest.raises(RuntimeError, match="listener refuses"):
        REFUSABLE_CHANGES[change](runtime, agent)
    assert listener.notified == 2  # the refused change, then its rollback
    assert [schema.name for schema in runtime.schemas(agent)] == before == ["a"]
    assert [schema.name for schema in runtime.model_tools(agent).schemas] == ["a"]
    assert runtime.get("a", agent) is not None
    # Nothing was left behind without a disposer: the same change can be made again, and undone.
    with REFUSABLE_CHANGES[change](runtime, agent):
        assert [schema.name for schema in runtime.schemas(agent)] != before
    assert [schema.name for schema in runtime.schemas(agent)] == before


def test_a_change_listener_sees_run_code_when_a_scope_is_first_presented_in_code() -> None:
    runtime = ToolRuntime()
    runtime.register(json_tool("echo"))
    agent = Agent("x")
    seen: list[list[str]] = []

    class Watcher:
        @hookimpl
        def dsh_tools_change(self) -> None:
            seen.append([schema.name for schema in runtime.schemas(agent)])

    runtime.plugins.register(Watcher())
    runtime.present_as("code", agent)
    assert seen == [["echo", "run_code"]]


def test_a_broken_schema_is_reported_before_the_reserved_name() -> None:
    broken = raw_tool("run_code", output=ToolOutput(schema={"type": "weird"}))
    with pytest.raises(JsonSchemaError, match='tool "run_code" output'):
        ToolRuntime().register(broken)


@pytest.mark.parametrize(
    "change",
    [
        lambda rt: rt.register(json_tool("x"), ["not", "hashable"]),
        lambda rt: rt.guard(lambda execution: None, ["not", "hashable"]),
        lambda rt: rt.present_as("code", ["not", "hashable"]),
        lambda rt: rt.defer_tools(["x"], ["not", "hashable"]),
        lambda rt: rt.restrict(ToolRestriction(deny=["x"]), ["not", "hashable"]),
        lambda rt: rt.schemas(["not", "hashable"]),
    ],
    ids=["register", "guard", "present_as", "defer_tools", "restrict", "schemas"],
)
def test_an_unhashable_scope_is_refused_the_same_way_everywhere(change: Any) -> None:
    runtime = ToolRuntime()
    runtime.register(json_tool("x"))
    with pytest.raises(TypeError) as raised:
        change(runtime)
    assert str(raised.value) == "a scope must be None, an Agent or a hashable key, got list"


@pytest.mark.parametrize("bad", [0, -1, math.inf, math.nan, "5", True])
def test_timeout_ms_must_be_positive_finite(bad: object) -> None:
    with pytest.raises(TypeError, match="timeout_ms must be a positive finite number"):
        raw_tool("t", timeout_ms=bad)


def test_register_refuses_non_definitions() -> None:
    runtime = ToolRuntime()
    with pytest.raises(RegistrationError, match="takes a ToolDefinition"):
        runtime.register({"name": "x"})  # type: ignore[arg-type]


def test_output_must_be_declared() -> None:
    with pytest.raises(TypeError, match="must declare output=ToolOutput"):
        raw_tool("t", output=None)


def _sync_body(args: object, run: object) -> object:
    return 1


class _AsyncCallable:
    async def __call__(self, args: object, run: object) -> object:
        return None


@pytest.mark.parametrize(
    "execute",
    [_sync_body, lambda args, run: 1, print],
    ids=["def", "lambda", "builtin"],
)
def test_a_raw_definition_refuses_a_body_that_is_not_async(execute: object) -> None:
    # The pipeline awaits what the body returns, so every call would fail TOOL_ERROR.
    with pytest.raises(TypeError) as raised:
        raw_tool("t", execute=execute)
    assert str(raised.value) == (
        f'tool "t" execute must be an async callable taking (args, run), got {type(execute).__name__} '
        "(define_tool adapts a plain def)"
    )


def test_a_raw_definition_takes_an_object_with_an_async_call() -> None:
    body = _AsyncCallable()
    assert raw_tool("t", execute=body).execute is body


def test_register_validates_output_schema_with_every_violation() -> None:
    runtime = ToolRuntime()
    tool = raw_tool("t", output=ToolOutput(schema={"type": "weird", "pattern": "x"}))
    with pytest.raises(JsonSchemaError) as caught:
        runtime.register(tool)
    assert len(caught.value.violations) == 2
    assert all(v.startswith('tool "t" output:') for v in caught.value.violations)


def test_register_validates_parameters_are_object_rooted() -> None:
    runtime = ToolRuntime()
    with pytest.raises(JsonSchemaError) as caught:
        runtime.register(raw_tool("t", parameters={"type": "string"}))
    # The reason is the tool's arguments, not structured output's.
    assert caught.value.violations == (
        'tool "t" parameters: schema.type must be "object" (tool arguments are a JSON object)',
    )


def test_present_as_requires_scope_and_one_declaration_per_scope() -> None:
    runtime = ToolRuntime()
    agent = Agent("a")
    with pytest.raises(RegistrationError, match="requires a scope"):
        runtime.present_as("both", None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="mode must be one of"):
        runtime.present_as("weird", agent)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ((1,), "Agent.id must be a non-empty str, got 1"),
        (("",), "Agent.id must be a non-empty str, got ''"),
        (("child", "root"), "Agent.parent must be an Agent or None, got str"),
    ],
)
def test_agents_are_checked_when_built(fields: tuple[object, ...], message: str) -> None:
    with pytest.raises(TypeError) as raised:
        Agent(*fields)  # type: ignore[arg-type]
    assert str(raised.value) == message


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"plugins": object()}, "plugins must be a pluggy.PluginManager, got object"),
        ({"approval": "yes"}, "approval must be an ApprovalService (an object with an async request method), got str"),
        ({"trace_decisions": 1}, "trace_decisions must be a bool, got int"),
        ({"event_sink": "log.jsonl"}, "event_sink must be callable or None, got str"),
    ],
)
def test_runtime_options_of_the_wrong_kind_are_refused(options: dict[str, object], message: str) -> None:
    with pytest.raises(TypeError) as raised:
        ToolRuntime(**options)  # type: ignore[arg-type]
    assert str(raised.value) == message


class SyncRequest:
    def request(self, execution: Any, reason: str | None) -> str:
        return "allowed-once"


def test_an_approval_service_whose_request_is_not_async_is_refused() -> None:
    # Awaiting its answer would fail every Ask POLICY_ERROR: refuse it where it is configured.
    with pytest.raises(TypeError) as raised:
        ToolRuntime(approval=SyncRequest())  # type: ignore[arg-type]
    assert str(raised.value) == (
        "approval must be an ApprovalService (an object with an async request method): SyncRequest.request is not async"
    )


@pytest.mark.parametrize(
    ("service", "message"),
    [
        (lambda e, r: "allowed-once", "approval must be an ApprovalService (an object with an async request method), got function"),
        ("nonsense", "approval must be an ApprovalService (an object with an async request method), got str"),
        (SyncRequest(), "approval must be an ApprovalService (an object with an async request method): SyncRequest.request is not async"),
    ],
    ids=["lambda", "str", "sync-request"],
)  # fmt: skip
def test_assigning_runtime_approval_is_checked_as_the_constructor_checks(service: Any, message: str) -> None:
    approval = StaticApproval("allowed-once")
    runtime = ToolRuntime(approval=approval)
    with pytest.raises(TypeError) as raised:
        runtime.approval = service
    assert str(raised.value) == message
    assert runtime.approval is approval  # the refused service did not replace it
    runtime.approval = None
    assert runtime.approval is None


def test_send_event_delivers_a_plugin_event_to_the_sink() -> None:
    seen: list[tuple[str, dict[str, Any]]] = []
    runtime = ToolRuntime(event_sink=lambda event_type, data: seen.append((event_type, dict(data))))
    runtime.send_event("my-plugin/flushed", {"rows": 3})
    assert seen == [("my-plugin/flushed", {"rows": 3})]
    ToolRuntime().send_event("my-plugin/flushed", {"rows": 3})  # no sink: nothing to deliver to


def test_send_event_contains_a_raising_sink(caplog: pytest.LogCaptureFixture) -> None:
    def broken(event_type: str, data: object) -> None:
        raise OSError("disk full")

    ToolRuntime(event_sink=broken).send_event("my-plugin/flushed", {})
    assert [(r.name, r.levelname, r.getMessage()) for r in caplog.records] == [
        ("dsh_core", "WARNING", "event sink failed for my-plugin/flushed: disk full")
    ]


@pytest.mark.parametrize(
    ("event_type", "data", "message"),
    [
        ("", {}, "event_type must be a non-empty str, got ''"),
        (None, {}, "event_type must be a non-empty str, got None"),
        ("x/y", [("a", 1)], "event data must be a Mapping, got list"),
    ],
)
def test_send_event_refuses_malformed_events(event_type: Any, data: Any, message: str) -> None:
    with pytest.raises(TypeError) as raised:
        ToolRuntime(event_sink=lambda *_: None).send_event(event_type, data)
    assert str(raised.value) == message


@pytest.mark.parametrize(
    "event_type",
    [
        "tool/call",
        "tool/result",
        "tool/code-dispatch-start",
        "tool/code-dispatch",
        "tool/retry",
        "tool/orphaned",
        "tool/orphan-finished",
    ],
)
def test_send_event_refuses_the_pipelines_own_event_types(event_type: str) -> None:
    """A session log reads these as the pipeline's records: one from a plugin would make it unreadable."""
    seen: list[str] = []
    runtime = ToolRuntime(event_sink=lambda sent, data: seen.append(sent))
    with pytest.raises(ValueError) as raised:
        runtime.send_event(event_type, {"weird": True})
    assert str(raised.value) == (
        f'event type "{event_type}" is one the pipeline itself records (a session log would read it as its '
        'own and could not be replayed): give the event a name of its own, such as "my-plugin/flushed"'
    )
    assert seen == []


def test_the_reserved_event_types_are_every_tool_event_dsh_core_writes() -> None:
    """A new pipeline event type must be reserved too, or a plugin could forge it."""
    sources = Path(dsh_core.__file__).parent.rglob("*.py")
    written = {match for path in sources for match in re.findall(r'"(tool/[a-z-]+)"', path.read_text())}
    assert written == PIPELINE_EVENT_TYPES


def test_send_event_takes_other_tool_events_such_as_the_undo_plugins() -> None:
    seen: list[str] = []
    runtime = ToolRuntime(event_sink=lambda sent, data: seen.append(sent))
    for event_type in ("tool/reverted", "tool/revert-failed", "my-plugin/tool/call"):
        runtime.send_event(event_type, {})
    assert seen == ["tool/reverted", "tool/revert-failed", "my-plugin/tool/call"]


def test_scoped_view_binds_scope() -> None:
    runtime = ToolRuntime()
    agent = Agent("a")
    view = runtime.scoped(agent)
    tool = json_tool("mine")
    view.register(tool)
    assert view.get("mine") is tool
    assert runtime.get("mine") is None
    assert [s.name for s in view.schemas()] == ["mine"]
    assert view.names() == ["mine"] and runtime.names() == []
    assert [s.name for s in view.model_tools().schemas] == ["mine"]


def test_scope_id_names_scopes_for_files_that_outlive_the_process() -> None:
    from dsh_core import scope_id

    class Unprintable:
        def __str__(self) -> str:
            raise RuntimeError("no")

    assert scope_id(None) is None
    assert scope_id(Agent("main", parent=Agent("root"))) == "main"
    assert scope_id(("team", 7)) == "('team', 7)"
    assert scope_id(Unprintable()) == "<unprintable Unprintable scope>"


@pytest.mark.parametrize("which", ["parameters", "output"])
def test_a_schema_errors_count_of_unlisted_violations_survives_naming_the_tool(
    monkeypatch: pytest.MonkeyPatch, which: str
) -> None:
    """The registry re-raises the checker's error with the tool's name: the count of violations not listed stays."""
    import dsh_core._registry as registry
    from dsh_core._errors import Violations

    def refusing(schema: object, **reason: str) -> None:
        raise dsh_core.JsonSchemaError(Violations(["schema.x is bad"], 7))

    monkeypatch.setattr(registry, f"assert_{'object' if which == 'parameters' else 'supported'}_json_schema", refusing)
    runtime = dsh_core.ToolRuntime()
    from dsh_core.testing import json_tool

    with pytest.raises(dsh_core.JsonSchemaError) as raised:
        runtime.register(json_tool("t"))
    assert raised.value.violations == (f'tool "t" {which}: schema.x is bad',)
    assert raised.value.omitted == 7
    assert str(raised.value).endswith("… and 7 more")


async def test_an_unknown_tool_name_of_any_length_is_quoted_by_its_ends() -> None:
    """The name is the model's text: a 300 000-character one came back whole in the message the model reads."""
    from dsh_core.testing import make_input

    name = "a" * 150_000 + "b" * 150_000
    result = await dsh_core.ToolRuntime().execute(make_input(name))
    assert result.is_error and result.error.info is not None and result.error.info.code == "UNKNOWN_TOOL"
    assert result.error.message.startswith('unknown tool "aaaa') and result.error.message.endswith('bbbb"')
    assert len(result.error.message) < 250


@pytest.mark.parametrize("name", ["my tool", "weird/name", "x" * 65, "поиск", "a.b"])
def test_a_name_model_providers_refuse_is_registered_with_a_warning(name: str, caplog: pytest.LogCaptureFixture) -> None:
    """Only the CLI's check said so: a library host heard of it when the provider refused the request."""
    runtime = ToolRuntime()
    runtime.register(json_tool(name))
    (record,) = [r for r in caplog.records if r.name == "dsh_core"]
    assert record.levelname == "WARNING"
    assert record.getMessage().startswith(f'tool "{name}" is registered, but its name does not match ^[a-zA-Z0-9_-]{{1,64}}$')
    assert runtime.get(name) is not None


def test_a_name_providers_take_registers_quietly(caplog: pytest.LogCaptureFixture) -> None:
    ToolRuntime().register(json_tool("gh__create-issue_2"))
    assert [r for r in caplog.records if r.name == "dsh_core"] == []
