"""Scenario catalogue S134-S159, S242-S252, S356-S365: scoped registration, ``restrict``, scoped
dispatch (listeners, guards, observers, argument materialisation), ``execution_mode``, the
signal on the execution views, and the tool-pipeline invariants.

Only the scenarios the rest of the suite does not already pin live here. ``tool(name, reply)`` is
the catalogue's scoped-spec fixture: a raw definition with open empty parameters and a string
output rendered as one text block, whose body returns ``reply`` (default ``ran:<name>``);
``run`` executes it and returns the first text block.
"""

from __future__ import annotations

import logging
import typing
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import pytest

from dsh_core import (
    Accept,
    Agent,
    Allow,
    CancelSignal,
    Deny,
    Exclusive,
    FrozenDict,
    Parallel,
    RegistrationError,
    TextBlock,
    ToolDefinition,
    ToolDispatchExecution,
    ToolErrorInfo,
    ToolExecution,
    ToolExecutionFailure,
    ToolExecutionInput,
    ToolExecutionMode,
    ToolExecutionResult,
    ToolExecutionSuccess,
    ToolExecutionToken,
    ToolFailure,
    ToolOutput,
    ToolRestriction,
    ToolRunContext,
    ToolRuntime,
    define_tool,
    hookimpl,
)
from dsh_core.testing import make_input

Next = Callable[[], Awaitable[Any]]

NOT_JSON = "tool execution arguments must be losslessly JSON-serializable"


def tool(name: str, reply: str | None = None, *, calls: list[str] | None = None) -> ToolDefinition:
    async def body(args: Any, run: ToolRunContext) -> str:
        if calls is not None:
            calls.append(name)
        return f"ran:{name}" if reply is None else reply

    return ToolDefinition(
        name=name,
        description=f"test tool {name}",
        parameters={"type": "object", "properties": {}},
        output=ToolOutput(schema={"type": "string"}, render=lambda args, value: [TextBlock(value)]),
        execute=body,
    )


async def run(runtime: ToolRuntime, name: str, agent: Agent | None = None, arguments: object = None) -> str:
    result = await runtime.execute(make_input(name, arguments, agent=agent))
    first = result.content[0]
    assert isinstance(first, TextBlock), result
    return first.text


def names(runtime: ToolRuntime, scope: Agent | None = None) -> list[str]:
    return sorted(schema.name for schema in runtime.schemas(scope))


def is_frozen(obj: object, field: str) -> bool:
    try:
        setattr(obj, field, None)
    except (AttributeError, TypeError):
        return True
    return False


class Plugin:
    """A plugin built from keyword hook functions, optionally scoped (``dsh_scope``)."""

    def __init__(self, scope: Agent | None = None, *, tryfirst: bool = False, **hooks: Callable[..., Any]) -> None:
        if scope is not None:
            self.dsh_scope = scope
        for hook, fn in hooks.items():
            setattr(self, hook, hookimpl(tryfirst=tryfirst)(fn))


# -- S134: tools/result observers are fire-and-forget ---------------------------------------------


async def test_observer_return_values_are_ignored(caplog: pytest.LogCaptureFixture) -> None:
    """S134: an observer's return value is ignored: no effect on the result, no warning."""
    runtime = ToolRuntime()
    runtime.register(tool("t"))
    seen: list[ToolExecutionResult] = []

    def returns_a_value(execution: ToolExecution, result: ToolExecutionResult) -> object:
        seen.append(result)
        return {"replacement": "ignored"}

    def records(execution: ToolExecution, result: ToolExecutionResult) -> None:
        seen.append(result)

    runtime.plugins.register(Plugin(dsh_result=records), name="records")
    runtime.plugins.register(Plugin(dsh_result=returns_a_value), name="returns-a-value")
    with caplog.at_level(logging.WARNING, logger="dsh_core"):
        result = await runtime.execute(make_input("t"))
    assert result == ToolExecutionSuccess(value="ran:t", content=(TextBlock("ran:t"),))
    assert len(seen) == 2 and all(observed is result for observed in seen)
    assert [record for record in caplog.records if record.name == "dsh_core"] == []


# -- S135-S138: scoped registration ----------------------------------------------------------------


async def test_scoped_tool_is_isolated_to_its_scope() -> None:
    """S135: a scope's own tool is listed and runs only for that scope."""
    runtime = ToolRuntime()
    a, other = Agent("a"), Agent("other")
    runtime.register(tool("shared"))
    runtime.register(tool("mine"), a)
    assert names(runtime, a) == ["mine", "shared"]
    assert names(runtime) == ["shared"]
    assert names(runtime, other) == ["shared"]
    assert await run(runtime, "mine", a) == "ran:mine"
    assert await run(runtime, "mine", other) == 'Error: unknown tool "mine"'
    assert await run(runtime, "mine") == 'Error: unknown tool "mine"'


async def test_scoped_shadow_runs_for_its_scope_and_global_runs_elsewhere() -> None:
    """S136: scope registers bash first, then a global bash: each view runs its own, one schema in the scope."""
    runtime = ToolRuntime()
    a = Agent("a")
    runtime.register(tool("bash", "restricted-bash"), a)
    runtime.register(tool("bash", "global-bash"))
    assert await run(runtime, "bash", a) == "restricted-bash"
    assert await run(runtime, "bash") == "global-bash"
    assert [schema.name for schema in runtime.schemas(a)] == ["bash"]


def test_duplicate_global_registration_points_to_the_agents_scope() -> None:
    """S137: a second global tool of one name is refused with the per-agent hint; per scope likewise."""
    runtime = ToolRuntime()
    a = Agent("a")
    runtime.register(tool("x"))
    with pytest.raises(RegistrationError) as caught:
        runtime.register(tool("x"))
    assert str(caught.value) == (
        'tool "x" is already registered (for a per-agent variant, register it in that agent\'s scope)'
    )
    runtime.register(tool("y"), a)
    with pytest.raises(RegistrationError, match='tool "y" is already registered in this scope'):
        runtime.register(tool("y"), a)


def test_disposing_a_scopes_registration_removes_it_from_the_scope() -> None:
    """S138: disposing what a scope registered leaves the scope with nothing."""
    runtime = ToolRuntime()
    a = Agent("a")
    definition = tool("mine")
    dispose = runtime.register(definition, a)
    assert runtime.get("mine", a) is definition
    dispose()
    assert runtime.get("mine", a) is None
    assert runtime.schemas(a) == []


# -- S139-S146: restrict() -------------------------------------------------------------------------


async def test_allow_list_keeps_scope_local_tools() -> None:
    """S139: allow=[read] hides bash but not the scope's own capture; the global view is untouched."""
    runtime = ToolRuntime()
    a = Agent("a")
    runtime.register(tool("read"))
    runtime.register(tool("bash"))
    runtime.register(tool("capture"), a)
    runtime.restrict(ToolRestriction(allow=["read"]), a)
    assert names(runtime, a) == ["capture", "read"]
    assert await run(runtime, "bash", a) == 'Error: unknown tool "bash"'
    assert await run(runtime, "read", a) == "ran:read"
    assert await run(runtime, "capture", a) == "ran:capture"
    assert names(runtime) == ["bash", "read"]


async def test_filters_stay_live_for_later_globals_and_locals() -> None:
    """S140: a deny filter admits a later global, an allow filter excludes it; later locals always show."""
    runtime = ToolRuntime()
    deny_scope, allow_scope = Agent("d"), Agent("l")
    runtime.register(tool("read"))
    runtime.register(tool("bash"))
    runtime.restrict(ToolRestriction(deny=["bash"]), deny_scope)
    runtime.restrict(ToolRestriction(allow=["read"]), allow_scope)
    runtime.register(tool("web"))
    runtime.register(tool("denied-local"), deny_scope)
    runtime.register(tool("allowed-local"), allow_scope)
    assert names(runtime, deny_scope) == ["denied-local", "read", "web"]
    assert names(runtime, allow_scope) == ["allowed-local", "read"]
    assert await run(runtime, "web", deny_scope) == "ran:web"
    assert await run(runtime, "web", allow_scope) == 'Error: unknown tool "web"'
    assert await run(runtime, "denied-local", deny_scope) == "ran:denied-local"
    assert await run(runtime, "allowed-local", allow_scope) == "ran:allowed-local"


def test_allow_and_deny_intersect_and_lift_independently() -> None:
    """S141: allow [a, b] then deny [b] leaves a; lifting the allow leaves a and c."""
    runtime = ToolRuntime()
    a = Agent("a")
    for name in ("a", "b", "c"):
        runtime.register(tool(name))
    lift_allow = runtime.restrict(ToolRestriction(allow=["a", "b"]), a)
    runtime.restrict(ToolRestriction(deny=["b"]), a)
    assert names(runtime, a) == ["a"]
    lift_allow()
    assert names(runtime, a) == ["a", "c"]


async def test_child_restriction_filters_tools_inherited_from_the_parent_scope() -> None:
    """S144: a child's deny hides a parent-scope tool for the child only."""
    runtime = ToolRuntime()
    parent = Agent("parent")
    child = Agent("child", parent=parent)
    runtime.register(tool("bash"), parent)
    runtime.register(tool("read"), parent)
    assert names(runtime, child) == ["bash", "read"]
    runtime.restrict(ToolRestriction(deny=["bash"]), child)
    assert names(runtime, child) == ["read"]
    assert await run(runtime, "bash", child) == 'Error: unknown tool "bash"'
    assert names(runtime, parent) == ["bash", "read"]


async def test_child_allow_list_keeps_the_childs_own_tools() -> None:
    """S145: the child's allow list over parent tools never hides the child's own tool."""
    runtime = ToolRuntime()
    parent = Agent("parent")
    child = Agent("child", parent=parent)
    runtime.register(tool("bash"), parent)
    runtime.register(tool("read"), parent)
    runtime.register(tool("report"), child)
    runtime.restrict(ToolRestriction(allow=["read"]), child)
    assert names(runtime, child) == ["read", "report"]
    assert await run(runtime, "report", child) == "ran:report"


def test_ancestor_restriction_reaches_descendants() -> None:
    """S146: a parent's deny of a global applies to its child too; the parent's own tool stays."""
    runtime = ToolRuntime()
    parent = Agent("parent")
    child = Agent("child", parent=parent)
    runtime.register(tool("web"))
    runtime.register(tool("bash"), parent)
    runtime.restrict(ToolRestriction(deny=["web"]), parent)
    assert names(runtime, child) == ["bash"]
    assert names(runtime, parent) == ["bash"]


# -- S147-S151: scoped listeners and guards --------------------------------------------------------


async def test_scoped_pre_execute_listener_gates_only_its_agent() -> None:
    """S147: a scoped denial applies to its agent only; other agents and agent-less calls run."""
    runtime = ToolRuntime()
    a, other = Agent("a"), Agent("other")
    runtime.register(tool("t"))
    seen: list[str] = []

    async def veto(execution: ToolExecution, next: Next) -> Any:
        assert isinstance(execution.agent, Agent)
        seen.append(execution.agent.id)
        return Deny("scoped veto")

    runtime.plugins.register(Plugin(a, dsh_pre_execute=veto))
    assert await run(runtime, "t", a) == "Error: scoped veto"
    assert await run(runtime, "t", other) == "ran:t"
    assert await run(runtime, "t") == "ran:t"
    assert seen == ["a"]


async def test_scoped_guards_run_after_an_allowing_listener_and_duplicates_are_independent() -> None:
    """S148: two registrations of one scoped guard deny after an Allow(); lifting one keeps the other."""
    runtime = ToolRuntime()
    a, other = Agent("a"), Agent("other")
    body_calls: list[str] = []
    runtime.register(tool("t", calls=body_calls))
    frozen_arguments: list[bool] = []

    def terminal(execution: ToolExecution) -> str:
        frozen_arguments.append(isinstance(execution.arguments, FrozenDict))
        return "terminal policy"

    async def always_allow(execution: ToolExecution, next: Next) -> Any:
        return Allow()

    runtime.plugins.register(Plugin(a, tryfirst=True, dsh_pre_execute=always_allow))
    lift_first = runtime.guard(terminal, a)
    lift_second = runtime.guard(terminal, a)
    assert await run(runtime, "t", a) == "Error: terminal policy"
    assert await run(runtime, "t", other) == "ran:t"
    assert body_calls == ["t"]
    lift_first()
    assert await run(runtime, "t", a) == "Error: terminal policy"
    lift_second()
    assert await run(runtime, "t", a) == "ran:t"
    assert body_calls == ["t", "t"]
    assert frozen_arguments == [True, True]  # the first denial already stopped the second registration


async def test_global_guards_are_monotonic() -> None:
    """S149: an abstaining guard cannot outvote a later denying one; the body never runs."""
    runtime = ToolRuntime()
    body_calls: list[str] = []
    runtime.register(tool("t", calls=body_calls))

    def abstain(execution: ToolExecution) -> None:
        return None

    def deny(execution: ToolExecution) -> str:
        return "global denial"

    runtime.guard(abstain)
    runtime.guard(deny)
    result = await runtime.execute(make_input("t"))
    label = "test_global_guards_are_monotonic.<locals>.deny"
    assert result == ToolExecutionFailure(
        error=ToolFailure("global denial", ToolErrorInfo(name="GuardDenial", code="DENIED", plugin=label)),
        content=(TextBlock("Error: global denial"),),
    )
    assert body_calls == []


async def test_guard_registered_by_an_earlier_guard_is_consulted_in_the_same_call() -> None:
    """S150: a guard added by an earlier guard during evaluation already decides the same call."""
    runtime = ToolRuntime()
    runtime.register(tool("t"))
    calls: list[str] = []

    def late(execution: ToolExecution) -> str:
        calls.append("late")
        return "late denial"

    def first(execution: ToolExecution) -> None:
        calls.append("first")
        if calls == ["first"]:
            runtime.guard(late)

    runtime.guard(first)
    assert await run(runtime, "t") == "Error: late denial"
    assert calls == ["first", "late"]


async def test_a_replacement_guard_is_consulted_in_the_same_call() -> None:
    """S151: a guard that lifts itself and registers a replacement: the replacement decides this call.

    Deliberate departure (BEHAVIOUR n.10): the original defers the replacement to the next
    call, an artefact of JS Map storage. Here guard evaluation is uniformly live: a guard
    registered while a call's guards run is consulted for that call (guards can only deny),
    and one removed before its turn is not.
    """
    runtime = ToolRuntime()
    a = Agent("a")
    runtime.register(tool("t"))
    runtime.register(tool("scope_sibling"), a)  # keeps the scope's layer alive
    calls: list[str] = []
    lift: list[Callable[[], None]] = []

    def replacement(execution: ToolExecution) -> str:
        calls.append("replacement")
        return "replacement denial"

    def first(execution: ToolExecution) -> None:
        calls.append("first")
        lift[0]()
        runtime.guard(replacement, a)

    lift.append(runtime.guard(first, a))
    assert await run(runtime, "t", a) == "Error: replacement denial"
    assert calls == ["first", "replacement"]
    assert await run(runtime, "t", a) == "Error: replacement denial"
    assert calls == ["first", "replacement", "replacement"]


async def test_a_guard_removed_before_its_turn_is_not_consulted_and_none_is_asked_twice() -> None:
    runtime = ToolRuntime()
    runtime.register(tool("t"))
    calls: list[str] = []
    lifts: dict[str, Callable[[], None]] = {}

    def make(name: str, verdict: str | None = None, then: Callable[[], None] = lambda: None) -> Any:
        def guard(execution: ToolExecution) -> str | None:
            calls.append(name)
            then()
            return verdict

        return guard

    def first_changes_the_table() -> None:
        if calls.count("first") == 1:
            lifts["doomed"]()
            runtime.guard(make("added"))

    lifts["first"] = runtime.guard(make("first", then=first_changes_the_table))
    lifts["doomed"] = runtime.guard(make("doomed", "doomed denial"))
    lifts["last"] = runtime.guard(make("last"))
    assert await run(runtime, "t") == "ran:t"
    assert calls == ["first", "last", "added"]


# -- S152-S159: one execution, one argument snapshot, one outcome ----------------------------------


async def test_one_token_per_call_and_one_frozen_argument_snapshot() -> None:
    """S152: every stage of one call shares a token; the body gets a frozen copy; the caller's dict is untouched."""
    runtime = ToolRuntime()
    a = Agent("a")
    counts = {"safe": 0, "danger": 0, "scoped_results": 0}
    body_arguments: list[Any] = []

    async def safe(args: Any, run: ToolRunContext) -> str:
        counts["safe"] += 1
        body_arguments.append(args)
        return "safe"

    async def danger(args: Any, run: ToolRunContext) -> str:
        counts["danger"] += 1
        return "danger"

    for name, body in (("safe", safe), ("danger", danger)):
        runtime.register(
            ToolDefinition(
                name=name,
                description=name,
                parameters={"type": "object", "properties": {}},
                output=ToolOutput(schema={"type": "string"}, render=lambda args, value: [TextBlock(value)]),
                execute=body,
            )
        )
    runtime.guard(lambda execution: "danger denied" if execution.name == "danger" else None, a)
    tokens: dict[str, list[ToolExecutionToken]] = {}

    def collect(execution: ToolExecution) -> None:
        tokens.setdefault(execution.call_id, []).append(execution.token)

    async def pre(execution: ToolExecution, next: Next) -> Any:
        assert isinstance(execution.arguments, FrozenDict)
        collect(execution)
        return await next()

    async def wrap(execution: ToolDispatchExecution, next: Next) -> Any:
        collect(execution.execution)
        return await next()

    async def post(execution: ToolExecution, result: ToolExecutionResult, next: Next) -> Any:
        collect(execution)
        return await next()

    def scoped_result(execution: ToolExecution, result: ToolExecutionResult) -> None:
        collect(execution)
        counts["scoped_results"] += 1

    runtime.plugins.register(Plugin(dsh_pre_execute=pre, dsh_execute=wrap, dsh_post_execute=post))
    runtime.plugins.register(Plugin(a, dsh_result=scoped_result))

    denied = await runtime.execute(make_input("danger", {}, call_id="danger-1", agent=a))
    assert denied.content == (TextBlock("Error: danger denied"),)
    caller_arguments = {"source": True}
    allowed = await runtime.execute(make_input("safe", caller_arguments, call_id="safe-1", agent=a))
    assert allowed.content == (TextBlock("safe"),)

    assert caller_arguments == {"source": True}
    caller_arguments["source"] = False  # still the caller's own, mutable dict
    (seen,) = body_arguments
    assert seen is not caller_arguments and isinstance(seen, FrozenDict)
    assert dict(seen) == {"source": True}
    assert [len(tokens["danger-1"]), len(tokens["safe-1"])] == [3, 4]  # denial: pre, post, result
    assert all(token is tokens[call][0] for call in tokens for token in tokens[call])
    assert len({id(group[0]) for group in tokens.values()}) == 2
    assert counts == {"safe": 1, "danger": 0, "scoped_results": 2}


async def test_non_json_arguments_publish_one_outcome_to_scoped_and_global_observers() -> None:
    """S153: a call with non-JSON arguments skips policy and the body but still reaches every observer once."""
    runtime = ToolRuntime()
    a = Agent("a")
    body_calls: list[str] = []
    runtime.register(tool("t", calls=body_calls))
    counts = {"policy": 0, "scoped": 0, "global": 0}
    parents: list[ToolExecutionToken] = []

    async def policy(execution: ToolExecution, next: Next) -> Any:
        counts["policy"] += 1
        return await next()

    def capture(execution: ToolExecution, result: ToolExecutionResult) -> None:
        parents.append(execution.token)

    capture_plugin = Plugin(dsh_result=capture)
    runtime.plugins.register(capture_plugin)
    assert await run(runtime, "t") == "ran:t"
    runtime.plugins.unregister(capture_plugin)
    (parent,) = parents
    body_calls.clear()

    signal = CancelSignal()
    observed: list[tuple[ToolExecution, ToolExecutionResult]] = []

    def scoped(execution: ToolExecution, result: ToolExecutionResult) -> None:
        counts["scoped"] += 1
        observed.append((execution, result))

    def everyone(execution: ToolExecution, result: ToolExecutionResult) -> None:
        counts["global"] += 1

    runtime.plugins.register(Plugin(dsh_pre_execute=policy, dsh_result=everyone))
    runtime.plugins.register(Plugin(a, dsh_result=scoped))

    def invalid() -> None:
        return None

    caller_arguments = {"invalid": invalid}
    scoped_result = await runtime.execute(
        ToolExecutionInput(call_id="bad", name="t", arguments=caller_arguments, signal=signal, agent=a, parent=parent)
    )
    agentless_result = await runtime.execute(make_input("t", caller_arguments))
    for result in (scoped_result, agentless_result):
        assert isinstance(result, ToolExecutionFailure)
        assert result.error.message.startswith(NOT_JSON)
        assert result.content == (TextBlock(f"Error: {result.error.message}"),)
    ((execution, seen_result),) = observed
    assert execution.arguments is None
    assert execution.parent is parent
    assert execution.signal is signal
    assert is_frozen(execution, "arguments") and is_frozen(execution, "signal")
    assert seen_result is scoped_result
    assert counts == {"policy": 0, "scoped": 1, "global": 2}
    assert body_calls == []
    assert caller_arguments == {"invalid": invalid}
    caller_arguments["more"] = invalid  # never frozen


class ScriptedInput(ToolExecutionInput):
    """A hostile ``ToolExecutionInput`` subclass whose fields are counting properties.

    ``answers[field]`` is the sequence of values successive reads return (the last one
    repeats), or an exception every read raises. It skips the class's own ``__init__``
    (and so its checks), as a subclass can: the pipeline must not rely on them.
    """

    FIELDS = ("call_id", "name", "arguments", "signal", "agent", "root_call_id", "parent")

    def __init__(self, **answers: Any) -> None:
        object.__setattr__(self, "reads", dict.fromkeys(self.FIELDS, 0))
        object.__setattr__(self, "_answers", answers)

    def _read(self, field: str) -> Any:
        count = self.reads[field]
        self.reads[field] += 1
        answer = self._answers[field]
        if isinstance(answer, BaseException):
            raise answer
        return answer[min(count, len(answer) - 1)]

    call_id = property(lambda self: self._read("call_id"))
    name = property(lambda self: self._read("name"))
    arguments = property(lambda self: self._read("arguments"))
    signal = property(lambda self: self._read("signal"))
    agent = property(lambda self: self._read("agent"))
    root_call_id = property(lambda self: self._read("root_call_id"))
    parent = property(lambda self: self._read("parent"))


async def test_a_stateful_parent_field_is_read_once() -> None:
    """S154: a ``parent`` that answers None first and a forged token later is read once; every stage sees None."""
    runtime = ToolRuntime()
    parents: list[tuple[str, object]] = []

    async def body(args: Any, run: ToolRunContext) -> str:
        parents.append(("body", run.parent))
        return "ran:t"

    runtime.register(
        ToolDefinition(
            name="t",
            description="t",
            parameters={"type": "object", "properties": {}},
            output=ToolOutput(schema={"type": "string"}, render=lambda args, value: [TextBlock(value)]),
            execute=body,
        )
    )

    async def pre(execution: ToolExecution, next: Next) -> Any:
        parents.append(("pre", execution.parent))
        return await next()

    async def wrap(execution: ToolDispatchExecution, next: Next) -> Any:
        parents.append(("execute", execution.parent))
        return await next()

    def observe(execution: ToolExecution, result: ToolExecutionResult) -> None:
        parents.append(("result", execution.parent))

    runtime.plugins.register(Plugin(dsh_pre_execute=pre, dsh_execute=wrap, dsh_result=observe))
    request = ScriptedInput(
        call_id=["stateful"], name=["t"], arguments=[{}], signal=[CancelSignal()], agent=[None],
        root_call_id=[None], parent=[None, ToolExecutionToken()],
    )  # fmt: skip
    result = await runtime.execute(request)
    assert result == ToolExecutionSuccess(value="ran:t", content=(TextBlock("ran:t"),))
    assert request.reads["parent"] == 1
    assert parents == [("pre", None), ("execute", None), ("body", None), ("result", None)]


async def test_one_input_snapshot_builds_the_error_execution() -> None:
    """S155: with non-JSON arguments, every input field is read once and the observer sees the first answers."""
    runtime = ToolRuntime()
    a = Agent("a")
    runtime.register(tool("t"))
    first_signal, first_parent = CancelSignal(), ToolExecutionToken()
    observed: list[ToolExecution] = []
    runtime.plugins.register(Plugin(a, dsh_result=lambda execution, result: observed.append(execution)))
    request = ScriptedInput(
        call_id=["unstable-error", "changed"], name=["t", "other"], arguments=[{"bad": {1, 2}}],
        signal=[first_signal, CancelSignal()], agent=[a, Agent("later")], root_call_id=[None, "forged-root"],
        parent=[first_parent, ToolExecutionToken()],
    )  # fmt: skip
    result = await runtime.execute(request)
    assert isinstance(result, ToolExecutionFailure) and result.error.message.startswith(NOT_JSON)
    assert request.reads == dict.fromkeys(ScriptedInput.FIELDS, 1)
    (execution,) = observed
    assert (execution.call_id, execution.root_call_id, execution.name) == ("unstable-error", "unstable-error", "t")
    assert execution.agent is a and execution.parent is first_parent and execution.signal is first_signal
    assert execution.arguments is None
    assert all(is_frozen(execution, field) for field in ("call_id", "name", "agent", "parent", "signal"))


async def test_raising_arguments_field_fails_with_its_message() -> None:
    """S156: an ``arguments`` field that raises fails the call with that message; read once, observed once."""
    runtime = ToolRuntime()
    runtime.register(tool("t"))
    observed: list[tuple[ToolExecution, ToolExecutionResult]] = []
    runtime.plugins.register(Plugin(dsh_result=lambda execution, result: observed.append((execution, result))))
    request = ScriptedInput(
        call_id=["c"], name=["t"], arguments=RuntimeError("getter exploded"), signal=[CancelSignal()],
        agent=[None], root_call_id=[None], parent=[None],
    )  # fmt: skip
    result = await runtime.execute(request)
    assert isinstance(result, ToolExecutionFailure)
    assert result.content == (TextBlock("Error: getter exploded"),)
    assert result.error.message == "getter exploded"
    assert request.reads["arguments"] == 1
    ((execution, seen),) = observed
    assert execution.arguments is None and seen is result


class Opaque:
    """A plain class instance: not JSON."""


@pytest.mark.parametrize(
    "arguments", [pytest.param(lambda: __import__("types").MappingProxyType({"a": 1}), id="mapping"),
                  pytest.param(Opaque, id="instance")],
)  # fmt: skip
async def test_non_json_argument_containers_are_rejected_before_policy(arguments: Callable[[], object]) -> None:
    """S157: a read-only Mapping or a class instance as arguments fails before policy and body, observed once."""
    runtime = ToolRuntime()
    body_calls: list[str] = []
    runtime.register(tool("t", calls=body_calls))
    counts = {"policy": 0}
    observed: list[tuple[ToolExecution, ToolExecutionResult]] = []

    async def policy(execution: ToolExecution, next: Next) -> Any:
        counts["policy"] += 1
        return await next()

    runtime.plugins.register(
        Plugin(dsh_pre_execute=policy, dsh_result=lambda execution, result: observed.append((execution, result)))
    )
    result = await runtime.execute(make_input("t", arguments()))
    assert isinstance(result, ToolExecutionFailure)
    message = result.error.message
    assert message.startswith(f"{NOT_JSON}: $: ") and message.endswith(" is not a JSON value")
    assert result.error.info == ToolErrorInfo(name="NonJsonValueError", code="INVALID_ARGS")
    assert result.content == (TextBlock(f"Error: {message}"),)
    assert (counts["policy"], len(body_calls), len(observed)) == (0, 0, 1)
    ((execution, seen),) = observed
    assert execution.arguments is None and seen.is_error


async def test_nested_arguments_are_materialised_once() -> None:
    """S158: the body sees the snapshot taken at entry, whatever the caller's nested object becomes later."""
    runtime = ToolRuntime()

    async def body(args: Any, run: ToolRunContext) -> str:
        return f"ran:{args['nested']['mode']}"

    runtime.register(
        ToolDefinition(
            name="t",
            description="t",
            parameters={"type": "object", "properties": {}},
            output=ToolOutput(schema={"type": "string"}, render=lambda args, value: [TextBlock(value)]),
            execute=body,
        )
    )
    caller_arguments: dict[str, Any] = {"nested": {"mode": "safe"}}

    async def swap(execution: ToolExecution, next: Next) -> Any:
        caller_arguments["nested"]["mode"] = {"no longer", "json"}
        return await next()

    runtime.plugins.register(Plugin(dsh_pre_execute=swap))
    result = await runtime.execute(make_input("t", caller_arguments))
    assert result == ToolExecutionSuccess(value="ran:safe", content=(TextBlock("ran:safe"),))


class Unprintable(Exception):
    """An exception whose ``str()`` itself raises."""

    def __str__(self) -> str:
        raise RuntimeError("cannot print")


async def test_every_observer_gets_the_frozen_outcome_and_failures_are_contained(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """S159: a wrapper-authored failure reaches scoped and global observers frozen; observer faults are logged."""
    runtime = ToolRuntime()
    a = Agent("a")
    runtime.register(tool("t"))
    recorded: list[bool] = []
    outer = ToolExecutionFailure(error=ToolFailure("outer failure"), content=(TextBlock("outer failure"),))

    async def outermost(execution: ToolDispatchExecution, next: Next) -> Any:
        await next()
        return outer

    def scoped(execution: ToolExecution, result: ToolExecutionResult) -> None:
        assert is_frozen(execution, "name") and isinstance(execution.arguments, FrozenDict)
        assert is_frozen(result, "content") and isinstance(result.content, tuple)
        assert is_frozen(result.content[0], "text")
        recorded.append(result.is_error)

    def unprintable(execution: ToolExecution, result: ToolExecutionResult) -> None:
        raise Unprintable()

    def rejected(execution: ToolExecution, result: ToolExecutionResult) -> Awaitable[None]:
        async def fail() -> None:
            raise RuntimeError("async observer failure")

        return fail()

    def records(execution: ToolExecution, result: ToolExecutionResult) -> None:
        recorded.append(result.is_error)

    runtime.plugins.register(Plugin(dsh_result=records), name="records")
    runtime.plugins.register(Plugin(dsh_result=rejected), name="rejected")
    runtime.plugins.register(Plugin(dsh_result=unprintable), name="unprintable")
    runtime.plugins.register(Plugin(a, dsh_result=scoped), name="scoped")
    runtime.plugins.register(Plugin(tryfirst=True, dsh_execute=outermost), name="outermost")
    with caplog.at_level(logging.WARNING, logger="dsh_core"):
        result = await runtime.execute(make_input("t", call_id="c", agent=a))
    assert result == outer
    assert recorded == [True, True]
    assert [record.getMessage() for record in caplog.records if record.name == "dsh_core"] == [
        'tool "t" (c): dsh_result observer unprintable failed: <unprintable exception>',
        'tool "t" (c): dsh_result observer rejected failed: async observer failure',
    ]


# -- S242-S251: execution_mode -----------------------------------------------------------------------


def test_execution_mode_follows_the_arguments() -> None:
    """S245: a classifier reading a required ``mode`` makes reads parallel and writes exclusive."""
    runtime = ToolRuntime()

    async def body(args: Any) -> None:
        return None

    runtime.register(
        define_tool(
            name="fs",
            description="fs",
            parameters={"mode": {"type": "string", "required": True}},
            output={"type": "null"},
            execute=body,
            is_concurrency_safe=lambda args: args["mode"] == "read",
        )
    )
    assert runtime.execution_mode(make_input("fs", {"mode": "read"})) == Parallel()
    assert runtime.execution_mode(make_input("fs", {"mode": "write"})) == Exclusive()


def test_raw_classifier_receives_the_parsed_arguments() -> None:
    """S249: a raw definition's classifier is called with the caller's parsed arguments."""
    runtime = ToolRuntime()
    seen: list[object] = []

    def classify(args: object) -> bool:
        seen.append(args)
        return True

    runtime.register(attrs.evolve(tool("raw"), is_concurrency_safe=classify))
    assert runtime.execution_mode(make_input("raw", {"anything": 1})) == Parallel()
    assert seen == [{"anything": 1}]


def test_execution_mode_is_a_two_variant_tagged_type() -> None:
    """S251: ``ToolExecutionMode`` is exactly ``Parallel | Exclusive``, told apart by ``kind``."""
    assert typing.get_args(ToolExecutionMode) == (Parallel, Exclusive)
    assert (Parallel().kind, Exclusive().kind) == ("parallel", "exclusive")
    assert Parallel() != Exclusive()


# -- S252: the signal on every execution view ----------------------------------------------------------


async def test_signal_is_required_and_only_the_dispatch_view_may_replace_it() -> None:
    """S252: the input needs a signal; pre/post/result/body views cannot change it; a wrapper may swap, not drop it."""
    with pytest.raises(TypeError):
        ToolExecutionInput(call_id="c", name="t", arguments={})  # type: ignore[call-arg]
    runtime = ToolRuntime()
    caller = CancelSignal()
    problems: dict[str, list[str]] = {}

    def attempt(seat: str, view: object, replacement: object) -> None:
        for label, action in (("assign", lambda: setattr(view, "signal", replacement)),
                              ("delete", lambda: delattr(view, "signal"))):  # fmt: skip
            try:
                action()
            except (AttributeError, TypeError):
                problems.setdefault(seat, []).append(label)

    async def body(args: Any, run: ToolRunContext) -> str:
        attempt("body", run, CancelSignal())
        return "ok"

    runtime.register(attrs.evolve(tool("t"), execute=body))

    async def pre(execution: ToolExecution, next: Next) -> Any:
        attempt("pre", execution, CancelSignal())
        return await next()

    async def wrap(execution: ToolDispatchExecution, next: Next) -> Any:
        attempt("execute-none", execution, None)
        own = CancelSignal()
        execution.signal = own
        assert execution.signal is own
        try:
            return await next()
        finally:
            execution.signal = caller

    async def post(execution: ToolExecution, result: ToolExecutionResult, next: Next) -> Any:
        attempt("post", execution, CancelSignal())
        return await next()

    def observe(execution: ToolExecution, result: ToolExecutionResult) -> None:
        attempt("result", execution, CancelSignal())
        assert execution.signal is caller

    runtime.plugins.register(Plugin(dsh_pre_execute=pre, dsh_execute=wrap, dsh_post_execute=post, dsh_result=observe))
    result = await runtime.execute(make_input("t", signal=caller))
    assert result == ToolExecutionSuccess(value="ok", content=(TextBlock("ok"),))
    both = ["assign", "delete"]
    assert problems == {"pre": both, "execute-none": both, "body": both, "post": both, "result": both}


# -- S356: tool-pipeline invariants ---------------------------------------------------------------------


class StageOrder:
    """Checks the stage-order and publication invariants of every call it sees."""

    def __init__(self) -> None:
        self.stages: dict[str, list[str]] = {}
        self.violations: list[str] = []
        self.changes = 0

    def _enter(self, execution: ToolExecution, stage: str) -> None:
        seen = self.stages.setdefault(execution.call_id, [])
        if stage == "pre" and "pre" in seen:
            self.violations.append("tools/pre-execute repeated for one execution")
        if stage == "execute" and seen != ["pre"]:
            self.violations.append("tools/execute must follow tools/pre-execute")
        if stage == "post" and seen not in (["pre"], ["pre", "execute"]):
            self.violations.append("tools/post-execute must follow tools/pre-execute or tools/execute")
        seen.append(stage)

    @hookimpl(tryfirst=True)
    async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
        self._enter(execution, "pre")
        return await next()

    @hookimpl(tryfirst=True)
    async def dsh_execute(self, execution: ToolDispatchExecution, next: Next) -> Any:
        self._enter(execution.execution, "execute")
        return await next()

    @hookimpl(tryfirst=True)
    async def dsh_post_execute(self, execution: ToolExecution, result: ToolExecutionResult, next: Next) -> Any:
        self._enter(execution, "post")
        return await next()

    @hookimpl
    def dsh_result(self, execution: ToolExecution, result: ToolExecutionResult) -> None:
        if not is_frozen(execution, "name"):
            self.violations.append("tools/result execution must be frozen before publication")
        if not (is_frozen(result, "content") and isinstance(result.content, tuple)):
            self.violations.append("tools/result outcome and content must be frozen before publication")
        if not (execution.name and execution.call_id):
            self.violations.append("tools/result execution must carry non-empty name and callId")
        self.stages.setdefault(execution.call_id, []).append("result")

    @hookimpl
    def dsh_tools_change(self) -> None:
        self.changes += 1


async def test_pipeline_keeps_the_stage_order_invariants() -> None:
    """S356: a run is pre -> execute -> post -> frozen result, a denial pre -> post -> frozen result."""
    runtime = ToolRuntime()
    checker = StageOrder()
    runtime.plugins.register(checker)
    runtime.register(tool("t"))
    runtime.register(tool("vetoed"))

    async def veto(execution: ToolExecution, next: Next) -> Any:
        return Deny("no") if execution.name == "vetoed" else await next()

    async def accept(execution: ToolExecution, result: ToolExecutionResult, next: Next) -> Any:
        await next()
        return Accept()

    runtime.plugins.register(Plugin(dsh_pre_execute=veto, dsh_post_execute=accept))
    runtime.guard(lambda execution: "guarded" if execution.call_id == "guarded" else None)
    assert await runtime.execute(make_input("t", call_id="ran")) == ToolExecutionSuccess(
        value="ran:t", content=(TextBlock("ran:t"),)
    )
    assert (await runtime.execute(make_input("vetoed", call_id="denied"))).is_error
    assert (await runtime.execute(make_input("t", call_id="guarded"))).is_error
    assert checker.stages == {
        "ran": ["pre", "execute", "post", "result"],
        "denied": ["pre", "post", "result"],
        "guarded": ["pre", "post", "result"],
    }
    assert checker.violations == []
    assert checker.changes == 2
