"""Scenario catalogue S160-S200 (code-mode.spec): mode-aware wire contribution, the sub-dispatch
scheduler and the run_code dispatch bridge.

The programs run on an in-process fake code runtime (a coroutine over the bindings), so the
scheduling tests drive each sub-call through gates and check what had started at each point.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import pytest
import trio
import trio.testing

# The same fixtures as the bridge scenarios: a fake code runtime whose events are recorded.
from test_scenarios_code_mode_bridge import echo_tool, setup

from dsh_core import (
    Accept,
    Agent,
    Block,
    CancelSignal,
    DshError,
    TextBlock,
    ToolDefinition,
    ToolDispatchExecution,
    ToolExecution,
    ToolExecutionFailure,
    ToolExecutionResult,
    ToolExecutionSuccess,
    ToolExecutionToken,
    ToolOutput,
    ToolRestriction,
    ToolRunContext,
    ToolRuntime,
    UserMessage,
    define_tool,
    hookimpl,
)
from dsh_core.code_mode import CodeRunError, CodeRunResult
from dsh_core.testing import FakeCodeRuntime, json_tool, make_input

Next = Callable[[], Awaitable[Any]]
Events = list[tuple[str, dict[str, Any]]]

PYTHON_CODE_PARAM = "The program: the body of an async Python function."
CODE_ONLY_RULE = "`run_code` is the only tool you can call directly"


def run_code(*, agent: Agent | None = None, signal: CancelSignal | None = None) -> Any:
    return make_input(
        "run_code",
        {"code": "...", "description": "Run the test program"},
        call_id="call-1",
        agent=agent,
        signal=signal,
    )


def starts(events: Events) -> list[str]:
    return [data["sub_call_id"] for kind, data in events if kind == "tool/code-dispatch-start"]


def settles(events: Events) -> list[dict[str, Any]]:
    return [data for kind, data in events if kind == "tool/code-dispatch"]


def value_of(result: ToolExecutionResult) -> Any:
    assert isinstance(result, ToolExecutionSuccess), result
    return result.value


async def capture(outcomes: dict[str, Any], key: str, binding: Any, args: Any) -> None:
    """Await one binding, keeping its value or the message it was rejected with."""
    try:
        outcomes[key] = await binding(args)
    except Exception as exc:  # the program-facing rejection
        outcomes[key] = f"rejected: {exc}"


class Gated:
    """Tools whose bodies wait on a per-id gate, tracking order, live and peak counts."""

    def __init__(self) -> None:
        self.order: list[str] = []
        self.pending: set[str] = set()
        self.live = 0
        self.peak = 0
        self.gates: dict[str, trio.Event] = {}

    def gate(self, key: str) -> trio.Event:
        return self.gates.setdefault(key, trio.Event())

    def release(self, key: str) -> None:
        self.gate(key).set()

    def tool(self, name: str, *, safe: bool) -> ToolDefinition:
        async def body(args: Any) -> str:
            key = args["id"]
            self.order.append(f"start:{key}")
            self.live += 1
            self.peak = max(self.peak, self.live)
            self.pending.add(key)
            try:
                await self.gate(key).wait()
            finally:
                self.live -= 1
                self.pending.discard(key)
            self.order.append(f"end:{key}")
            return f"{name}:{key}"

        return define_tool(
            name=name,
            description=f"gated {name}",
            parameters={"id": {"type": "string", "required": True}},
            output={"type": "string"},
            execute=body,
            is_concurrency_safe=(lambda args: True) if safe else None,
        )


async def submit(nursery: trio.Nursery, outcomes: dict[str, Any], key: str, binding: Any, args: Any) -> None:
    """Start one binding call and wait until it has gone as far as it can (keeps submission order)."""
    nursery.start_soon(capture, outcomes, key, binding, args)
    await trio.testing.wait_all_tasks_blocked()


# -- mode-aware wire contribution ---------------------------------------------------------


def test_code_mode_wire_is_run_code_alone_with_an_sdk_of_the_natives() -> None:
    """S161: under "code" the model gets only run_code; the SDK lists echo but never run_code."""
    runtime, _, _ = setup(None, echo_tool())
    tools = runtime.model_tools()
    assert [schema.name for schema in tools.schemas] == ["run_code"]
    assert "class Tools(Protocol):" in tools.instructions
    assert "    async def echo(self, args: EchoArgs) -> str:" in tools.instructions
    assert "def run_code" not in tools.instructions
    assert 'tools["run_code"]' not in tools.instructions


def test_code_only_rule_precedes_the_sdk() -> None:
    """S162: under "code" the run_code-only rule comes first, before the SDK instructions and stubs."""
    runtime, _, _ = setup(None, echo_tool())
    instructions = runtime.model_tools().instructions
    assert instructions.startswith(CODE_ONLY_RULE)
    assert instructions.count(CODE_ONLY_RULE) == 1
    sdk_heading = instructions.index("## Writing code for run_code")
    assert instructions.index(CODE_ONLY_RULE) < sdk_heading < instructions.index("class Tools(Protocol):")


def test_deep_output_schema_renders_in_the_sdk() -> None:
    """S164: a tool with a 5 000-deep oneOf output and empty parameters reaches the SDK as `str | None`."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(5000):
        schema = {"oneOf": [schema, {"type": "null"}]}

    async def body(args: Any) -> Any:
        return None

    deep = define_tool(
        name="deep_output",
        description="",
        parameters={},
        output=ToolOutput(schema=schema, render=lambda args, value: [TextBlock(str(value))]),
        execute=body,
    )
    runtime, _, _ = setup(None, deep)
    instructions = runtime.model_tools().instructions
    # As the original's TypeScript SDK says it (`string | null`): each operand once.
    assert "    async def deep_output(self, args: dict[str, Any]) -> str | None: ...\n" in instructions


def test_both_mode_wire_is_natives_then_run_code_with_the_sdk_and_no_rule() -> None:
    """S167: under "both" the wire carries echo then run_code, plus the SDK (and no code-only rule)."""
    runtime, _, _ = setup(None, echo_tool(), mode="both")
    tools = runtime.model_tools()
    assert [schema.name for schema in tools.schemas] == ["echo", "run_code"]
    assert tools.instructions.startswith("## Writing code for run_code")
    assert "    async def echo(self, args: EchoArgs) -> str:" in tools.instructions
    assert CODE_ONLY_RULE not in tools.instructions


@pytest.mark.parametrize(
    ("mode", "restricted", "lifted"),
    [("code", ["run_code"], ["run_code"]), ("both", ["echo", "run_code"], ["echo", "hidden", "run_code"])],
)
async def test_allow_restriction_keeps_run_code_and_shapes_sdk_and_bindings(
    mode: str, restricted: list[str], lifted: list[str]
) -> None:
    """S168: allow=["echo"] never removes run_code; it hides "hidden" from the SDK and the bindings."""
    agent = Agent("a")
    runtime, _, fake = setup(None, echo_tool(), echo_tool("hidden"), mode=mode)
    lift = runtime.restrict(ToolRestriction(allow=["echo"]), agent)
    tools = runtime.model_tools(agent)
    assert [schema.name for schema in tools.schemas] == restricted
    assert "async def echo(self" in tools.instructions
    assert "hidden" not in tools.instructions
    result = await runtime.execute(run_code(agent=agent))
    assert isinstance(result, ToolExecutionSuccess), result
    assert fake.names == ["echo"]
    lift()
    assert [schema.name for schema in runtime.model_tools(agent).schemas] == lifted
    assert "async def hidden(self" in runtime.model_tools(agent).instructions


@pytest.mark.parametrize(("mode", "restricted"), [("code", ["run_code"]), ("both", ["kept", "run_code"])])
async def test_deny_restriction_keeps_run_code_and_shapes_sdk_and_bindings(mode: str, restricted: list[str]) -> None:
    """S169: deny=["denied"] never removes run_code; the SDK and the bindings lose "denied"."""
    agent = Agent("a")
    runtime, _, fake = setup(None, echo_tool("denied"), echo_tool("kept"), mode=mode)
    runtime.restrict(ToolRestriction(deny=["denied"]), agent)
    tools = runtime.model_tools(agent)
    assert [schema.name for schema in tools.schemas] == restricted
    assert "denied" not in tools.instructions
    assert "async def kept(self" in tools.instructions
    await runtime.execute(run_code(agent=agent))
    assert fake.names == ["kept"]


@pytest.mark.parametrize("mode", ["code", "both"])
async def test_run_code_is_reserved_and_shared_by_every_scope(mode: str) -> None:
    """S170: run_code cannot be registered, shadowed or restricted; a scope gets the one shared transport."""
    from dsh_core import RegistrationError

    agent = Agent("a")
    runtime, _, _ = setup(None, echo_tool(), mode=mode)
    for scope in (None, agent):
        with pytest.raises(RegistrationError, match='"run_code" is reserved for the Code Mode transport'):
            runtime.register(json_tool("run_code"), scope)
    for restriction in (ToolRestriction(allow=["run_code"]), ToolRestriction(deny=["run_code"])):
        with pytest.raises(RegistrationError, match='cannot name the reserved Code Mode transport "run_code"'):
            runtime.restrict(restriction, agent)
    runtime.register(echo_tool("scoped_safe"), agent)
    tools = runtime.model_tools(agent)
    transports = [schema for schema in tools.schemas if schema.name == "run_code"]
    assert len(transports) == 1
    assert "Execute a Python program" in transports[0].description
    assert "async def scoped_safe(self" in tools.instructions
    assert runtime.get("run_code", agent) is runtime.get("run_code")
    result = await runtime.execute(run_code(agent=agent))
    assert result.content == (TextBlock("(run_code completed with no output)"),)


async def test_run_code_is_never_a_binding_under_both() -> None:
    """S172: under "both" a program sees only echo, under `tools` with the `ToolCallError` class."""
    runtime, _, fake = setup(None, echo_tool(), mode="both")
    result = await runtime.execute(run_code())
    assert isinstance(result, ToolExecutionSuccess), result
    assert fake.names == ["echo"]
    assert fake.namespace == ("tools", "ToolCallError")


def test_code_mode_assembly_without_a_runtime_fails() -> None:
    """S174: a code mode with no code runtime fails the wire assembly, not only the run_code call."""
    runtime = ToolRuntime(mode="code")
    runtime.register(echo_tool())
    with pytest.raises(Exception, match="requires a code runtime"):
        runtime.model_tools()


def test_code_mode_assembly_with_an_unknown_language_fails() -> None:
    """S175: a runtime whose language has no SDK renderer ("ruby") fails the wire assembly."""
    runtime = ToolRuntime(mode="code", code_runtime=FakeCodeRuntime(language="ruby"))
    runtime.register(echo_tool())
    with pytest.raises(Exception, match='no SDK renderer registered for runtime language "ruby"'):
        runtime.model_tools()


def test_python_runtime_gets_the_python_sdk() -> None:
    """S176: a python runtime's SDK is a typing.Protocol with async methods and top-level await."""
    runtime, _, _ = setup(None, echo_tool())
    instructions = runtime.model_tools().instructions
    assert "class Tools(Protocol):" in instructions
    assert "async def echo(self, args:" in instructions
    assert "top-level `await`" in instructions


def test_python_runtime_under_both_describes_a_python_run_code() -> None:
    """S177: under "both" with a python runtime: Python SDK, Python run_code description, natives kept."""
    runtime, _, _ = setup(None, echo_tool(), mode="both")
    tools = runtime.model_tools()
    assert "class Tools(Protocol):" in tools.instructions
    (transport,) = [schema for schema in tools.schemas if schema.name == "run_code"]
    assert "Execute a Python program" in transport.description
    assert "echo" in [schema.name for schema in tools.schemas]


def test_python_run_code_schema_read_through_the_registry() -> None:
    """S179: run_code as registered: Python description (return, description arg) and the code param text."""
    runtime, _, _ = setup(None, echo_tool())
    tool = runtime.get("run_code")
    assert tool is not None
    for phrase in ("Execute a Python program", "`return <value>`", "`description`"):
        assert phrase in tool.description
    assert "TypeScript" not in tool.description
    assert tool.parameters["properties"]["code"]["description"] == PYTHON_CODE_PARAM
    assert tool.schema.parameters == tool.parameters


async def test_run_code_for_an_unknown_language_fails_loud() -> None:
    """S180: a "ruby" runtime cannot be offered or used through run_code; the error names the language.

    Python adaptation: run_code's description is a plain attribute (this package renders
    Python only), so the language is checked where the model would see or use it instead:
    model_tools() raises and a run_code call fails, both with the same message.
    """
    ruby = FakeCodeRuntime(language="ruby")
    runtime = ToolRuntime(mode="code", code_runtime=ruby)
    message = 'no SDK renderer registered for runtime language "ruby" (known: "python")'
    with pytest.raises(DshError, match=re.escape(message)):
        runtime.model_tools()
    result = await runtime.execute(make_input("run_code", {"code": "return 1", "description": "one"}))
    assert isinstance(result, ToolExecutionFailure)
    assert result.error.message == message
    assert result.error.info is not None and result.error.info.code == "CODE_RUNTIME_UNSUPPORTED"


def test_run_code_without_a_runtime_is_described_in_the_default_flavor() -> None:
    """S181: with no runtime mounted, run_code still reads in the default (here: the only, Python) flavor."""
    runtime = ToolRuntime(mode="code")
    tool = runtime.get("run_code")
    assert tool is not None
    assert "Execute a Python program" in tool.description
    assert tool.parameters["properties"]["code"]["description"] == PYTHON_CODE_PARAM


def test_disposing_the_code_presentation_removes_run_code_and_the_sdk() -> None:
    """S183: once the code presentation is disposed, the wire has no run_code and no SDK text."""
    agent = Agent("a")
    runtime = ToolRuntime(code_runtime=FakeCodeRuntime())
    runtime.register(echo_tool())
    dispose = runtime.present_as("code", agent)
    assert [schema.name for schema in runtime.model_tools(agent).schemas] == ["run_code"]
    dispose()
    tools = runtime.model_tools(agent)
    assert [schema.name for schema in tools.schemas] == ["echo"]
    assert tools.instructions == ""


# -- the sub-dispatch scheduler ---------------------------------------------------------------


async def test_safe_sub_calls_overlap_with_one_start_event_each() -> None:
    """S184: three parallel-safe calls are all in flight before any release; one start event each."""
    gated = Gated()
    seen_pending: list[set[str]] = []

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        outcomes: dict[str, Any] = {}
        async with trio.open_nursery() as nursery:
            for key in "abc":
                await submit(nursery, outcomes, key, tools["safe_read"], {"id": key})
            seen_pending.append(set(gated.pending))
            for key in "abc":
                gated.release(key)
        return CodeRunResult(value=",".join(outcomes[key] for key in "abc"), has_value=True)

    runtime, events, _ = setup(program, gated.tool("safe_read", safe=True))
    result = await runtime.execute(run_code(agent=Agent("a")))
    assert value_of(result) == {"logs": (), "result": "safe_read:a,safe_read:b,safe_read:c"}
    assert seen_pending == [{"a", "b", "c"}]
    assert gated.peak == 3
    assert starts(events) == ["call-1:code:1", "call-1:code:2", "call-1:code:3"]
    assert sorted(data["sub_call_id"] for data in settles(events)) == starts(events)


async def test_sub_call_unregistered_after_enumeration_is_unknown() -> None:
    """S187: a tool disposed after the bindings were enumerated fails with `unknown tool`; no body runs."""
    calls: list[Any] = []
    disposers: list[Any] = []

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        disposers[0]()
        outcomes: dict[str, Any] = {}
        await capture(outcomes, "x", tools["ephemeral"], {"value": "x"})
        return CodeRunResult(value=outcomes["x"], has_value=True)

    runtime, _, _ = setup(program)
    disposers.append(runtime.register(echo_tool("ephemeral", calls)))
    result = await runtime.execute(run_code())
    assert value_of(result) == {"logs": (), "result": 'rejected: unknown tool "ephemeral"'}
    assert calls == []


async def test_pre_execute_of_the_next_call_waits_for_the_previous_one() -> None:
    """S188: a slow pre-execute on call 1 holds back call 2's pre-execute; stages stay in order."""
    stages: list[str] = []
    release = trio.Event()
    blocked_view: list[list[str]] = []

    class SlowGate:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
            if execution.name == "safe_read":
                stages.append(f"pre-enter:{execution.call_id}")
                if execution.call_id.endswith(":1"):
                    await release.wait()
                stages.append(f"pre-exit:{execution.call_id}")
            return await next()

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        outcomes: dict[str, Any] = {}
        async with trio.open_nursery() as nursery:
            await submit(nursery, outcomes, "1", tools["safe_read"], {"id": "1"})
            await submit(nursery, outcomes, "2", tools["safe_read"], {"id": "2"})
            blocked_view.append(list(stages))
            release.set()
        return CodeRunResult(value=[outcomes["1"], outcomes["2"]], has_value=True)

    async def read(args: Any) -> str:
        return f"read:{args['id']}"

    runtime, _, _ = setup(program, json_tool("safe_read", read, is_concurrency_safe=lambda args: True))
    runtime.plugins.register(SlowGate())
    result = await runtime.execute(run_code())
    assert value_of(result) == {"logs": (), "result": ("read:1", "read:2")}
    assert blocked_view == [["pre-enter:call-1:code:1"]]
    assert stages == [
        "pre-enter:call-1:code:1",
        "pre-exit:call-1:code:1",
        "pre-enter:call-1:code:2",
        "pre-exit:call-1:code:2",
    ]


async def test_exclusive_barrier_holds_through_post_execute() -> None:
    """S189: a read submitted after a writer does not start while the writer's post-execute is pending."""
    stages: list[str] = []
    release = trio.Event()
    blocked_view: list[list[str]] = []

    class SlowPost:
        @hookimpl
        async def dsh_post_execute(self, execution: ToolExecution, result: Any, next: Next) -> Any:
            if execution.name == "writer":
                stages.append("post-enter:writer")
                await release.wait()
                stages.append("post-exit:writer")
            return await next()

    async def write(args: Any) -> str:
        stages.append("body:writer")
        return "written"

    async def read(args: Any) -> str:
        stages.append("body:safe_read")
        return "read"

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        outcomes: dict[str, Any] = {}
        async with trio.open_nursery() as nursery:
            await submit(nursery, outcomes, "w", tools["writer"], {})
            await submit(nursery, outcomes, "r", tools["safe_read"], {})
            blocked_view.append(list(stages))
            release.set()
        return CodeRunResult(value=[outcomes["w"], outcomes["r"]], has_value=True)

    runtime, _, _ = setup(
        program,
        json_tool("writer", write),
        json_tool("safe_read", read, is_concurrency_safe=lambda args: True),
    )
    runtime.plugins.register(SlowPost())
    result = await runtime.execute(run_code())
    assert value_of(result) == {"logs": (), "result": ("written", "read")}
    assert blocked_view == [["body:writer", "post-enter:writer"]]
    assert stages == ["body:writer", "post-enter:writer", "post-exit:writer", "body:safe_read"]


async def test_run_settlement_drains_a_commit_in_progress() -> None:
    """S190: the program returns while an un-awaited call's post-execute is blocked; the run still drains it."""
    gated = Gated()
    post_entered = trio.Event()
    post_release = trio.Event()

    class SlowPost:
        @hookimpl
        async def dsh_post_execute(self, execution: ToolExecution, result: Any, next: Next) -> Any:
            if execution.name == "safe_read":
                post_entered.set()
                await post_release.wait()
            return await next()

    async def release_soon() -> None:
        await trio.lowlevel.checkpoint()
        post_release.set()

    async with trio.open_nursery() as helpers:

        async def program(tools: Mapping[str, Any]) -> CodeRunResult:
            outcomes: dict[str, Any] = {}
            async with trio.open_nursery() as nursery:
                await submit(nursery, outcomes, "a", tools["safe_read"], {"id": "a"})
                gated.release("a")
                await post_entered.wait()
                helpers.start_soon(release_soon)
                nursery.cancel_scope.cancel()  # stop waiting for the call: it was fired and forgotten
            return CodeRunResult()

        runtime, events, _ = setup(program, gated.tool("safe_read", safe=True))
        runtime.plugins.register(SlowPost())
        result = await runtime.execute(run_code(agent=Agent("a")))
    assert isinstance(result, ToolExecutionSuccess), result
    assert [(data["name"], data["is_error"]) for data in settles(events)] == [("safe_read", True)]


async def test_post_execute_and_contexts_follow_submission_order() -> None:
    """S191: post-execute and its contexts run in submission order even when call 2 finishes first."""
    gated = Gated()
    post_order: list[str] = []

    class Context:
        @hookimpl
        async def dsh_post_execute(self, execution: ToolExecution, result: Any, next: Next) -> Any:
            if execution.name != "safe_read":
                return await next()
            post_order.append(execution.call_id)
            await next()
            return Accept(additional_contexts=[UserMessage([TextBlock(f"ctx:{execution.call_id}")], source="test")])

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        outcomes: dict[str, Any] = {}
        async with trio.open_nursery() as nursery:
            await submit(nursery, outcomes, "a", tools["safe_read"], {"id": "a"})
            await submit(nursery, outcomes, "b", tools["safe_read"], {"id": "b"})
            gated.release("b")
            await trio.testing.wait_all_tasks_blocked()
            gated.release("a")
        return CodeRunResult()

    runtime, _, _ = setup(program, gated.tool("safe_read", safe=True))
    runtime.plugins.register(Context())
    result = await runtime.execute(run_code())
    assert isinstance(result, ToolExecutionSuccess), result
    assert gated.order == ["start:a", "start:b", "end:b", "end:a"]
    assert post_order == ["call-1:code:1", "call-1:code:2"]
    assert [context.content for context in result.additional_contexts] == [
        (TextBlock("ctx:call-1:code:1"),),
        (TextBlock("ctx:call-1:code:2"),),
    ]


async def test_queued_unstarted_call_is_abandoned_when_the_program_fails() -> None:
    """S192: the program fails with a writer in flight and one queued: only the first starts and settles."""
    gated = Gated()
    outcomes: dict[str, Any] = {}

    async with trio.open_nursery() as program_tasks:

        async def program(tools: Mapping[str, Any]) -> CodeRunResult:
            await submit(program_tasks, outcomes, "w1", tools["writer"], {"id": "w1"})
            await submit(program_tasks, outcomes, "w2", tools["writer"], {"id": "w2"})
            return CodeRunResult(error=CodeRunError(kind="exception", message="program threw"))

        runtime, events, _ = setup(program, gated.tool("writer", safe=False))
        result = await runtime.execute(run_code(agent=Agent("a")))
    assert isinstance(result, ToolExecutionFailure), result
    assert result.error.info is not None and result.error.info.code == "CODE_RUN_FAILED"
    assert starts(events) == ["call-1:code:1"]
    assert [data["sub_call_id"] for data in settles(events)] == ["call-1:code:1"]
    assert gated.order == ["start:w1"]
    assert outcomes["w2"] == "rejected: run_code run is over (run_code settled); writer tool call abandoned"


# -- the run_code dispatch bridge ------------------------------------------------------------


async def test_bridge_curates_output_and_logs_each_settled_sub_call(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """S193: two echo calls: curated value and text, what echo saw, exact settle events, no meta."""
    calls: list[Any] = []

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        one = await tools["echo"]({"value": "one"})
        two = await tools["echo"]({"value": "two"})
        return CodeRunResult(logs=[f"saw {one}"], value=two, has_value=True)

    runtime, events, _ = setup(program, echo_tool("echo", calls))
    result = await runtime.execute(run_code(agent=Agent("a")))
    assert isinstance(result, ToolExecutionSuccess), result
    assert result.value == {"logs": ("saw echo:one",), "result": "echo:two"}
    assert result.content == (TextBlock("saw echo:one\necho:two"),)
    assert result.meta is None
    assert calls == [{"value": "one"}, {"value": "two"}]
    assert settles(events) == [
        {
            "root_call_id": "call-1",
            "parent_call_id": "call-1",
            "sub_call_id": f"call-1:code:{n}",
            "agent": "a",  # the outer call's: two agents' run_code calls may share a call id
            "name": "echo",
            "arguments": {"value": word},
            "is_error": False,
            "content": (TextBlock(f"echo:{word}"),),
            "duration_s": 0.0,
        }
        for n, word in ((1, "one"), (2, "two"))
    ]


async def test_nested_observer_sees_only_an_opaque_parent_token() -> None:
    """S194: with a signal-swapping wrapper on run_code, a nested observer sees just the outer token."""
    parents: list[Any] = []
    outer_tokens: list[ToolExecutionToken] = []

    class SwapSignal:
        @hookimpl
        async def dsh_execute(self, execution: ToolDispatchExecution, next: Next) -> Any:
            if execution.name != "run_code":
                return await next()
            original = execution.signal
            execution.signal = CancelSignal()
            try:
                return await next()
            finally:
                execution.signal = original

    class Observer:
        @hookimpl
        def dsh_result(self, execution: ToolExecution, result: ToolExecutionResult) -> None:
            if execution.parent is not None:
                parents.append(execution.parent)
                with pytest.raises(AttributeError):
                    execution.parent.signal = CancelSignal()  # type: ignore[attr-defined]
            else:
                outer_tokens.append(execution.token)

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        await tools["echo"]({"value": "x"})
        return CodeRunResult(value="done", has_value=True)

    runtime, _, _ = setup(program, echo_tool())
    runtime.plugins.register(SwapSignal())
    runtime.plugins.register(Observer())
    result = await runtime.execute(run_code())
    assert isinstance(result, ToolExecutionSuccess), result
    assert result.content == (TextBlock("done"),)
    assert len(parents) == 1 and len(outer_tokens) == 1
    assert type(parents[0]) is ToolExecutionToken
    assert parents[0] is outer_tokens[0]


@pytest.mark.parametrize("blocked", [False, True])
async def test_nested_conclusion_is_forwarded_unless_the_sub_call_was_blocked(blocked: bool) -> None:
    """S195: a sub-call's conclude_turn concludes the run_code call, unless post-execute blocked it."""

    async def finalize(args: Any, run: ToolRunContext) -> str:
        run.conclude_turn()
        return "final"

    class BlockFinalize:
        @hookimpl
        async def dsh_post_execute(self, execution: ToolExecution, result: Any, next: Next) -> Any:
            if execution.name == "finalize":
                return Block(feedback=[TextBlock("not yet")])
            return await next()

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        outcomes: dict[str, Any] = {}
        await capture(outcomes, "f", tools["finalize"], {})  # swallows a rejection
        return CodeRunResult(value=outcomes["f"], has_value=True)

    runtime, _, _ = setup(program, json_tool("finalize", finalize, output={"type": "string"}))
    if blocked:
        runtime.plugins.register(BlockFinalize())
    result = await runtime.execute(run_code())
    assert isinstance(result, ToolExecutionSuccess), result
    assert result.value == {"logs": (), "result": "rejected: not yet" if blocked else "final"}
    assert result.concludes_turn is (not blocked)


async def test_unclassified_sub_calls_serialise(autojump_clock: trio.testing.MockClock) -> None:
    """S196: calls of a tool without a classifier never overlap, even when gathered."""
    intervals: list[str] = []
    live = [0]

    async def probe(args: Any) -> str:
        assert live[0] == 0, "probe calls overlapped"
        live[0] += 1
        intervals.append(f"enter {args['id']}")
        await trio.sleep(0.02)
        intervals.append(f"exit {args['id']}")
        live[0] -= 1
        return str(args["id"])

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        outcomes: dict[str, Any] = {}
        async with trio.open_nursery() as nursery:
            for key in "abc":
                await submit(nursery, outcomes, key, tools["probe"], {"id": key})
        return CodeRunResult(value=",".join(outcomes[key] for key in "abc"), has_value=True)

    runtime, _, _ = setup(program, json_tool("probe", probe, output={"type": "string"}))
    result = await runtime.execute(run_code())
    assert intervals == ["enter a", "exit a", "enter b", "exit b", "enter c", "exit c"]
    assert result.content == (TextBlock("a,b,c"),)


async def test_tool_error_reaches_the_program_as_its_message() -> None:
    """S197: a tool that raises rejects the program's call with the tool's error text."""

    async def fail(args: Any) -> str:
        raise RuntimeError("deliberate failure")

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        try:
            await tools["fail"]({})
        except Exception as exc:
            return CodeRunResult(value=f"caught: {exc}", has_value=True)
        return CodeRunResult()

    runtime, _, _ = setup(program, json_tool("fail", fail))
    result = await runtime.execute(run_code())
    assert isinstance(result, ToolExecutionSuccess), result
    assert result.content == (TextBlock("caught: deliberate failure"),)


async def test_throwing_dispatch_log_listener_is_contained(caplog: pytest.LogCaptureFixture) -> None:
    """S198: a raising dsh_code_dispatch_log listener neither fails the run nor loses the settle event."""

    class Broken:
        @hookimpl
        async def dsh_code_dispatch_log(self, dispatch: Any, next: Next) -> Any:
            raise RuntimeError("log listener exploded")

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        return CodeRunResult(value=await tools["echo"]({"value": "x"}), has_value=True)

    runtime, events, _ = setup(program, echo_tool())
    runtime.plugins.register(Broken())
    result = await runtime.execute(run_code(agent=Agent("a")))
    assert value_of(result) == {"logs": (), "result": "echo:x"}
    assert [(d["name"], d["is_error"], d["content"]) for d in settles(events)] == [
        ("echo", False, (TextBlock("echo:x"),))
    ]
    assert "log listener exploded" in caplog.text
    assert "logging the original settled content" in caplog.text


async def test_throwing_pre_listener_settles_the_sub_call_without_post_execute() -> None:
    """S199: a raising pre-execute listener fails the sub-call finally: no body, no post-execute, one settle."""
    calls: list[Any] = []
    posts: list[str] = []

    class Exploding:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
            if execution.name == "echo":
                raise RuntimeError("gate exploded")
            return await next()

        @hookimpl
        async def dsh_post_execute(self, execution: ToolExecution, result: Any, next: Next) -> Any:
            posts.append(execution.name)
            return await next()

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        outcomes: dict[str, Any] = {}
        await capture(outcomes, "e", tools["echo"], {"value": "x"})
        return CodeRunResult(value=outcomes["e"], has_value=True)

    runtime, events, _ = setup(program, echo_tool("echo", calls))
    runtime.plugins.register(Exploding())
    result = await runtime.execute(run_code(agent=Agent("a")))
    assert value_of(result) == {"logs": (), "result": "rejected: gate exploded"}
    assert calls == []
    assert "echo" not in posts
    assert [(d["name"], d["is_error"]) for d in settles(events)] == [("echo", True)]
