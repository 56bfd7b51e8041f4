"""Scenario catalogue S201-S241 (code-mode.spec): the rest of the run_code dispatch bridge and
per-agent presentation.

Programs run on an in-process fake code runtime (a coroutine over the bindings) unless a test
needs the real child process (exotic binding names).
"""

from __future__ import annotations

import datetime
import operator
from collections.abc import Awaitable, Callable, Iterator, Mapping
from decimal import Decimal
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from dsh_core import (
    Accept,
    Agent,
    Block,
    CancelSignal,
    CodeRunFailedError,
    DshError,
    Exclusive,
    ImageBlock,
    Parallel,
    RegistrationError,
    SessionLog,
    SessionRecorder,
    TextBlock,
    ToolDefinition,
    ToolErrorInfo,
    ToolExecution,
    ToolExecutionFailure,
    ToolExecutionResult,
    ToolExecutionSuccess,
    ToolFailure,
    ToolOutput,
    ToolRunContext,
    ToolRuntime,
    UserMessage,
    define_tool,
    hookimpl,
    read_session_log,
    replay,
)
from dsh_core.code_mode import CodeRunError, CodeRunResult, SubprocessPythonRuntime
from dsh_core.presentation import GenericCallView
from dsh_core.testing import FakeCodeRuntime, Recorder, json_tool, make_input

Next = Callable[[], Awaitable[Any]]
Program = Callable[[Mapping[str, Any]], Awaitable[CodeRunResult]]
Events = list[tuple[str, dict[str, Any]]]

CODE_ONLY_RULE = "`run_code` is the only tool you can call directly"
NO_OUTPUT = "(run_code completed with no output)"
LOSSLESS = "tool arguments must be lossless JSON"
PNG = ImageBlock(data="iVBORw0KGgo=", mime_type="image/png")


def setup(
    program: Program | None = None, *tools: ToolDefinition, mode: str = "code", **options: Any
) -> tuple[ToolRuntime, Events, FakeCodeRuntime]:
    events: Events = []
    fake = FakeCodeRuntime(program)
    runtime = ToolRuntime(
        mode=mode,  # type: ignore[arg-type]
        code_runtime=fake,
        event_sink=lambda kind, data: events.append((kind, dict(data))),
        **options,
    )
    for tool in tools:
        runtime.register(tool)
    return runtime, events, fake


def echo_tool(name: str = "echo", calls: list[Any] | None = None, *, safe: bool = False) -> ToolDefinition:
    async def body(args: Any) -> str:
        if calls is not None:
            calls.append(args)
        return f"{name}:{args['value']}"

    return define_tool(
        name=name,
        description="echo arguments back",
        parameters={"value": {"type": "string", "required": True}},
        output={"type": "string"},
        execute=body,
        is_concurrency_safe=(lambda args: True) if safe else None,
    )


def blocks_tool(name: str, blocks: list[Any], value: str = "image result") -> ToolDefinition:
    """A tool whose value is ``value`` and whose rendered content is exactly ``blocks``."""

    async def body(args: Any) -> str:
        return value

    return define_tool(
        name=name,
        description=f"renders {len(blocks)} blocks",
        parameters={},
        output=ToolOutput(schema={"type": "string"}, render=lambda args, value: list(blocks)),
        execute=body,
    )


def run_code(
    *,
    agent: Agent | None = None,
    signal: CancelSignal | None = None,
    description: str = "Run the test program",
) -> Any:
    return make_input(
        "run_code",
        {"code": "...", "description": description},
        call_id="call-1",
        agent=agent,
        signal=signal,
    )


def settles(events: Events) -> list[dict[str, Any]]:
    return [data for kind, data in events if kind == "tool/code-dispatch"]


def nested_results(recorder: Recorder) -> list[tuple[ToolExecution, ToolExecutionResult]]:
    return [(execution, result) for execution, result in recorder.results if execution.parent is not None]


def value_of(result: ToolExecutionResult) -> Any:
    assert isinstance(result, ToolExecutionSuccess), result
    return result.value


def failure(message: str, name: str | None = None, code: str | None = None) -> ToolExecutionFailure:
    info = ToolErrorInfo(name=name, code=code) if name is not None and code is not None else None
    return ToolExecutionFailure(
        error=ToolFailure(message=message, info=info), content=(TextBlock(f"Error: {message}"),)
    )


async def outcome_of(binding: Any, args: Any) -> str:
    """Await one binding: its value as text, or ``rejected: <message>``."""
    try:
        return str(await binding(args))
    except Exception as exc:  # the program-facing rejection
        return f"rejected: {exc}"


def returning(value: Any) -> Program:
    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        return CodeRunResult(value=value, has_value=True)

    return program


def nest(value: Any, depth: int) -> Any:
    for _ in range(depth):
        value = [value]
    return value


def unnest(value: Any) -> tuple[int, Any]:
    depth = 0
    while isinstance(value, (list, tuple)):
        assert len(value) == 1
        depth += 1
        value = value[0]
    return depth, value


# -- the run_code dispatch bridge (continued) --------------------------------------------------


async def test_non_lossless_binding_argument_is_rejected_before_dispatch() -> None:
    """S201: a binding argument that is not JSON (a Decimal) rejects the call: nothing dispatched or logged."""
    calls: list[Any] = []
    recorder = Recorder()

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        return CodeRunResult(value=await outcome_of(tools["echo"], {"value": "x", "n": Decimal(1)}), has_value=True)

    runtime, events, _ = setup(program, echo_tool("echo", calls))
    runtime.plugins.register(recorder)
    result = await runtime.execute(run_code(agent=Agent("a")))
    text = value_of(result)["result"]
    assert text.startswith(f"rejected: {LOSSLESS}")
    assert calls == []
    assert events == []
    assert nested_results(recorder) == []


async def test_binding_arguments_are_an_independent_snapshot() -> None:
    """S202: the tool and the settle event see the arguments as passed, even if the program then mutates them."""
    calls: list[Any] = []
    gate = trio.Event()

    async def body(args: Any) -> str:
        await gate.wait()
        calls.append(args)
        return "done"

    raw: dict[str, Any] = {"value": "x", "nested": ["same"]}

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(tools["echo"], raw)
            await trio.testing.wait_all_tasks_blocked()
            raw["value"] = "changed"
            raw["nested"].append("extra")
            gate.set()
        return CodeRunResult()

    runtime, events, _ = setup(program, json_tool("echo", body, output={"type": "string"}))
    result = await runtime.execute(run_code(agent=Agent("a")))
    assert isinstance(result, ToolExecutionSuccess), result
    expected = {"value": "x", "nested": ("same",)}
    assert calls == [expected]
    assert [data["arguments"] for data in settles(events)] == [expected]


async def test_post_execute_contexts_of_sub_calls_ride_the_outer_result() -> None:
    """S203: contexts a post-execute listener attaches to sub-calls are deferred to run_code, in order."""

    class Context:
        @hookimpl
        async def dsh_post_execute(self, execution: ToolExecution, result: Any, next: Next) -> Any:
            if execution.name != "echo":
                return await next()
            await next()
            return Accept(
                additional_contexts=[UserMessage([TextBlock(f"context for {execution.call_id}")], source="test")]
            )

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        await tools["echo"]({"value": "a"})
        await tools["echo"]({"value": "b"})
        return CodeRunResult()

    runtime, _, _ = setup(program, echo_tool())
    runtime.plugins.register(Context())
    result = await runtime.execute(run_code())
    assert isinstance(result, ToolExecutionSuccess), result
    assert result.additional_contexts == (
        UserMessage([TextBlock("context for call-1:code:1")], source="test"),
        UserMessage([TextBlock("context for call-1:code:2")], source="test"),
    )


async def test_image_content_of_a_sub_call_is_deferred_whole() -> None:
    """S204: a sub-call rendering text + image defers one context with the complete content."""

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        await tools["image_result"]({})
        return CodeRunResult()

    runtime, _, _ = setup(program, blocks_tool("image_result", [TextBlock("image result"), PNG]))
    result = await runtime.execute(run_code())
    assert isinstance(result, ToolExecutionSuccess), result
    assert result.additional_contexts == (UserMessage([TextBlock("image result"), PNG], source="code-mode"),)


@pytest.mark.parametrize("decision", ["block", "replace-content"])
async def test_images_removed_by_post_execute_are_not_deferred(decision: str) -> None:
    """S205: an image that a post-execute block or content replacement removed is never deferred."""

    class Strip:
        @hookimpl
        async def dsh_post_execute(self, execution: ToolExecution, result: Any, next: Next) -> Any:
            if execution.name != "image_result":
                return await next()
            await next()
            if decision == "block":
                return Block(feedback=[TextBlock("no images")])
            return Accept(content=[TextBlock("image stripped")])

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        return CodeRunResult(value=await outcome_of(tools["image_result"], {}), has_value=True)

    runtime, _, _ = setup(program, blocks_tool("image_result", [TextBlock("image result"), PNG]))
    runtime.plugins.register(Strip())
    result = await runtime.execute(run_code())
    expected = "rejected: no images" if decision == "block" else "image result"
    assert value_of(result) == {"logs": (), "result": expected}
    assert result.additional_contexts == ()


async def test_sub_call_contexts_survive_a_failed_run() -> None:
    """S206: under "both", a context attached to a sub-call stays on run_code's failure."""

    class Context:
        @hookimpl
        async def dsh_post_execute(self, execution: ToolExecution, result: Any, next: Next) -> Any:
            await next()
            if execution.name == "echo":
                return Accept(additional_contexts=[UserMessage([TextBlock("nested context")], source="test")])
            return Accept()

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        await tools["echo"]({"value": "x"})
        return CodeRunResult(error=CodeRunError(kind="exception", message="program failed later"))

    runtime, _, _ = setup(program, echo_tool(), mode="both")
    runtime.plugins.register(Context())
    result = await runtime.execute(run_code())
    assert isinstance(result, ToolExecutionFailure), result
    assert result.additional_contexts == (UserMessage([TextBlock("nested context")], source="test"),)


async def test_failed_run_is_a_structured_code_run_failure() -> None:
    """S207: a run failing on its budget → CodeRunFailedError/CODE_RUN_FAILED with kind, message and logs."""

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        return CodeRunResult(
            logs=["got this far"], error=CodeRunError(kind="timeout", message="compute budget exhausted (300ms busy)")
        )

    runtime, _, _ = setup(program)
    result = await runtime.execute(run_code())
    assert result == failure(
        "code run failed (timeout): compute budget exhausted (300ms busy)\nCaptured output:\ngot this far",
        "CodeRunFailedError",
        "CODE_RUN_FAILED",
    )


def test_code_run_failed_error_identity() -> None:
    """S208: CodeRunFailedError carries code CODE_RUN_FAILED and is a DshError named CodeRunFailedError."""
    error = CodeRunFailedError("code run failed (exception): boom")
    assert isinstance(error, DshError)
    assert (type(error).__name__, error.code, str(error)) == (
        "CodeRunFailedError",
        "CODE_RUN_FAILED",
        "code run failed (exception): boom",
    )


async def test_outer_abort_reported_by_the_runtime_is_a_code_run_failure(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """S209: outer abort while a slow call runs and one is queued: the runtime reports 'abort'."""
    started: list[str] = []
    saw_abort: list[str] = []

    async def slow(args: Any, run: ToolRunContext) -> str:
        started.append(args["id"])
        with trio.move_on_after(0.5):
            try:
                await run.signal.wait()
            except trio.Cancelled:
                saw_abort.append(args["id"])
                raise
            saw_abort.append(args["id"])
        return f"slow:{args['id']}"

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        with trio.CancelScope(shield=True):  # a runtime that stops the program itself and reports the abort
            async with trio.open_nursery() as nursery:
                for key in ("first", "second"):
                    nursery.start_soon(outcome_of, tools["slow"], {"id": key})
                    await trio.testing.wait_all_tasks_blocked()
            return CodeRunResult(error=CodeRunError(kind="abort", message="user-cancel"))

    runtime, _, _ = setup(
        program,
        json_tool("slow", slow, parameters={"id": {"type": "string", "required": True}}, output={"type": "string"}),
    )
    signal = CancelSignal()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: _cancel_after(signal, 0.05, "user-cancel"))
        result = await runtime.execute(run_code(signal=signal))
    assert started == ["first"]
    assert saw_abort == ["first"]
    assert trio.current_time() == pytest.approx(0.05)
    assert isinstance(result, ToolExecutionFailure), result
    assert result.error.info == ToolErrorInfo(name="CodeRunFailedError", code="CODE_RUN_FAILED")
    assert result.content == (TextBlock("Error: code run failed (abort): user-cancel"),)


async def _cancel_after(signal: CancelSignal, seconds: float, reason: str) -> None:
    await trio.sleep(seconds)
    signal.cancel(reason)


async def test_outer_abort_settles_the_running_call_and_starts_no_queued_one(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """S209 (Python outcome): the outer abort cancels the running call; the queued one never starts."""
    started: list[str] = []
    saw_abort: list[str] = []

    async def slow(args: Any, run: ToolRunContext) -> str:
        started.append(args["id"])
        try:
            await trio.sleep(0.5)
        except trio.Cancelled:
            saw_abort.append(args["id"])
            raise
        return f"slow:{args['id']}"

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        async with trio.open_nursery() as nursery:
            for key in ("first", "second"):
                nursery.start_soon(outcome_of, tools["slow"], {"id": key})
                await trio.testing.wait_all_tasks_blocked()
        return CodeRunResult()

    runtime, events, _ = setup(
        program,
        json_tool("slow", slow, parameters={"id": {"type": "string", "required": True}}, output={"type": "string"}),
    )
    signal = CancelSignal()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: _cancel_after(signal, 0.05, "user-cancel"))
        result = await runtime.execute(run_code(signal=signal, agent=Agent("a")))
    assert result == failure("tool call aborted", "AbortError", "ABORTED")
    assert started == ["first"]
    assert saw_abort == ["first"]
    assert [(data["sub_call_id"], data["is_error"]) for data in settles(events)] == [("call-1:code:1", True)]
    assert trio.current_time() == pytest.approx(0.05)


async def test_a_sub_call_the_program_cancels_is_aborted_and_the_next_call_does_not_wait_for_its_body(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A program's asyncio.wait_for only stopped waiting: the sub-call ran on, and later calls waited for it."""
    started: list[str] = []
    saw_abort: list[str] = []

    async def slow(args: Any, run: ToolRunContext) -> str:
        started.append(args["id"])
        try:
            await trio.sleep(100)
        except trio.Cancelled:
            saw_abort.append(args["id"])
            raise
        return f"slow:{args['id']}"

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        async with trio.open_nursery() as nursery:
            for key in ("running", "queued"):  # exclusive: the second waits for the first to commit
                nursery.start_soon(outcome_of, tools["slow"], {"id": key})
                await trio.testing.wait_all_tasks_blocked()
            await trio.sleep(1)
            nursery.cancel_scope.cancel()  # the program stops waiting for both (asyncio.wait_for's way)
        echoed = await tools["echo"]({"value": "after"})
        return CodeRunResult(value=[echoed, trio.current_time()], has_value=True)

    runtime, events, _ = setup(
        program,
        json_tool("slow", slow, parameters={"id": {"type": "string", "required": True}}, output={"type": "string"}),
        echo_tool(),
    )
    result = await runtime.execute(run_code())
    assert isinstance(result, ToolExecutionSuccess), result
    assert result.value["result"] == ("echo:after", 1)
    assert started == ["running"] and saw_abort == ["running"]
    settled = [(data["sub_call_id"], data["is_error"]) for data in settles(events)]
    assert settled == [("call-1:code:1", True), ("call-1:code:3", False)]


async def test_runtime_raising_after_starting_a_binding_drains_it_first() -> None:
    """S210: a backend that raises mid-run fails run_code; its in-flight call is aborted and logged before return."""
    saw_abort: list[bool] = []
    running = trio.Event()

    async def slow(args: Any, run: ToolRunContext) -> str:
        running.set()
        try:
            await trio.sleep_forever()
        finally:
            saw_abort.append(run.signal.cancelled)
        return "never"

    outcomes: list[str] = []

    async def keep(binding: Any) -> None:
        outcomes.append(await outcome_of(binding, {}))

    async with trio.open_nursery() as program_tasks:  # the backend's own task for the pending call

        async def program(tools: Mapping[str, Any]) -> CodeRunResult:
            program_tasks.start_soon(keep, tools["slow"])
            await running.wait()
            raise RuntimeError("backend exploded")

        runtime, events, _ = setup(program, json_tool("slow", slow, output={"type": "string"}))
        result = await runtime.execute(run_code(agent=Agent("a")))
    assert isinstance(result, ToolExecutionFailure), result
    assert outcomes == ["rejected: tool call aborted"]
    assert saw_abort == [True]
    assert [(kind, data["name"]) for kind, data in events] == [
        ("tool/code-dispatch-start", "slow"),
        ("tool/code-dispatch", "slow"),
    ]
    assert settles(events)[0]["is_error"] is True


async def test_raising_backend_fails_run_code_with_its_own_message() -> None:
    """S210: a backend that raises fails run_code as a plain failure carrying the backend's message."""

    class ExplodingBackend(FakeCodeRuntime):
        async def run(self, program: str, bindings: Mapping[str, Any], **names: str) -> CodeRunResult:
            raise RuntimeError("backend exploded")

    runtime = ToolRuntime(mode="code", code_runtime=ExplodingBackend())
    result = await runtime.execute(run_code())
    assert isinstance(result, ToolExecutionFailure), result
    assert result.error.message == "backend exploded"
    assert result.error.info is not None and result.error.info.name == "RuntimeError"
    assert result.content == (TextBlock("Error: backend exploded"),)


async def test_sub_calls_dispatch_without_an_owning_agent() -> None:
    """S211: a run_code call with no agent still dispatches its sub-calls."""
    calls: list[Any] = []

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        return CodeRunResult(value=await tools["echo"]({"value": "x"}), has_value=True)

    runtime = ToolRuntime(mode="code", code_runtime=FakeCodeRuntime(program))
    runtime.register(echo_tool("echo", calls))
    result = await runtime.execute(run_code())
    assert value_of(result) == {"logs": (), "result": "echo:x"}
    assert calls == [{"value": "x"}]


def test_run_code_pending_card_uses_the_description_as_title() -> None:
    """S213: run_code's pending card: generic, titled by the description, kind execute, the program as raw input."""
    runtime, _, _ = setup()
    arguments = {"code": "return 1", "description": "Return the constant one"}
    expected = GenericCallView(title="Return the constant one", kind="execute", raw_input="return 1")
    tool = runtime.get("run_code")
    assert tool is not None and tool.present_call is not None
    assert tool.present_call(arguments) == expected
    assert runtime.present_call("run_code", arguments) == expected


@pytest.mark.parametrize(
    ("outcome", "text"),
    [
        (CodeRunResult(logs=["printed"]), "printed"),
        (CodeRunResult(value="returned", has_value=True), "returned"),
        (CodeRunResult(logs=["printed"], value="returned", has_value=True), "printed\nreturned"),
        (CodeRunResult(), NO_OUTPUT),
    ],
)
async def test_run_code_content_is_durable_text_without_a_result_presenter(outcome: CodeRunResult, text: str) -> None:
    """S215: logs and value become the durable text; run_code has no result presenter."""

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        return outcome

    runtime, _, _ = setup(program)
    result = await runtime.execute(run_code())
    assert isinstance(result, ToolExecutionSuccess), result
    assert result.content == (TextBlock(text),)
    tool = runtime.get("run_code")
    assert tool is not None and tool.present_result is None


async def test_post_execute_preview_replaces_run_code_content() -> None:
    """S216: a policy's preview replacing run_code's content is what stays; the value is kept."""
    preview = "[output spilled to /tmp/spill-1.txt; first line: line 0]"

    class Spill:
        @hookimpl
        async def dsh_post_execute(self, execution: ToolExecution, result: Any, next: Next) -> Any:
            await next()
            if execution.name == "run_code":
                return Accept(content=[TextBlock(preview)])
            return Accept()

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        return CodeRunResult(logs=[f"line {n}" for n in range(50)])

    runtime, _, _ = setup(program)
    runtime.plugins.register(Spill())
    result = await runtime.execute(run_code())
    assert isinstance(result, ToolExecutionSuccess), result
    assert result.content == (TextBlock(preview),)
    assert result.value == {"logs": tuple(f"line {n}" for n in range(50))}
    tool = runtime.get("run_code")
    assert tool is not None and tool.present_result is None


async def test_settle_event_logs_the_sub_result_content_verbatim() -> None:
    """S218: the program sees the value; the settle event keeps every rendered block (long text, non-text)."""
    long_text = TextBlock("x" * 300)

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        return CodeRunResult(value=await tools["mixed"]({}), has_value=True)

    runtime, events, _ = setup(program, blocks_tool("mixed", [long_text, PNG], value="mixed-value"))
    result = await runtime.execute(run_code(agent=Agent("a")))
    assert isinstance(result, ToolExecutionSuccess), result
    assert result.content == (TextBlock("mixed-value"),)
    assert [data["content"] for data in settles(events)] == [(long_text, PNG)]


class _HostileMapping(Mapping[str, Any]):
    """A mapping whose inspection raises (the Python stand-in for a throwing getter)."""

    def __getitem__(self, key: str) -> Any:
        raise RuntimeError("error-throw")

    def __iter__(self) -> Iterator[str]:
        raise RuntimeError("error-throw")

    def __len__(self) -> int:
        raise RuntimeError("error-throw")


class _HostileDict(dict):  # type: ignore[type-arg]
    def items(self) -> Any:
        raise RuntimeError("raw-throw")


async def test_bad_binding_arguments_are_rejected_without_dispatch() -> None:
    """S219: non-JSON binding arguments (hostile mapping, dict subclass, datetime, function, set) never dispatch."""
    calls: list[Any] = []
    recorder = Recorder()
    bad: list[object] = [
        _HostileMapping(),
        _HostileDict(value="x"),
        datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC),
        lambda: None,
        {"value": {"x"}},
    ]

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        return CodeRunResult(value=[await outcome_of(tools["echo"], args) for args in bad], has_value=True)

    runtime, events, _ = setup(program, echo_tool("echo", calls))
    runtime.plugins.register(recorder)
    result = await runtime.execute(run_code(agent=Agent("a")))
    messages = value_of(result)["result"]
    assert len(messages) == 5
    assert all(message.startswith(f"rejected: {LOSSLESS}") for message in messages), messages
    assert "\n".join(messages).count(LOSSLESS) == 5
    assert calls == []
    assert events == []
    assert nested_results(recorder) == []


async def test_deep_binding_arguments_are_dispatched_and_logged_intact(tmp_path: Path) -> None:
    """S220: 5 000-deep binding arguments reach the tool and the session log intact."""
    seen: list[tuple[int, Any]] = []

    async def count(args: Any) -> int:
        seen.append(unnest(args["nested"]))
        return seen[-1][0]

    deep_args = define_tool(
        name="deep_args",
        description="count array depth",
        parameters={"nested": {"type": "json", "required": True}},
        output={"type": "integer"},
        execute=count,
    )

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        return CodeRunResult(value=await tools["deep_args"]({"nested": nest("leaf", 5000)}), has_value=True)

    path = tmp_path / "session.jsonl"
    with SessionLog(path) as log:
        recorder = SessionRecorder(log)
        runtime = ToolRuntime(mode="code", code_runtime=FakeCodeRuntime(program), event_sink=recorder.event_sink)
        runtime.register(deep_args)
        result = await runtime.execute(run_code(agent=Agent("a")))
    assert value_of(result) == {"logs": (), "result": 5000}
    assert seen == [(5000, "leaf")]
    logged = [event.data for event in read_session_log(path).events if event.type == "tool/code-dispatch"]
    assert len(logged) == 1
    assert unnest(logged[0]["arguments"]["nested"]) == (5000, "leaf")


async def test_a_tool_cannot_mutate_the_arguments_that_get_logged() -> None:
    """S221: the sub-call's arguments are immutable; the logged arguments stay as the program passed them."""
    attempts: list[str] = []

    async def mutate(args: Any) -> str:
        for attempt in (
            lambda: operator.setitem(args["list"], 0, "mutated"),
            lambda: operator.setitem(args, "list", []),
        ):
            try:
                attempt()
                attempts.append("mutated")
            except TypeError:
                attempts.append("refused")
        return "ok"

    mutator = define_tool(
        name="mutator",
        description="tries to change its arguments",
        parameters={"list": {"type": "array", "items": {"type": "string"}, "required": True}},
        output={"type": "string"},
        execute=mutate,
    )

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        return CodeRunResult(value=await tools["mutator"]({"list": ["original"]}), has_value=True)

    runtime, events, _ = setup(program, mutator)
    result = await runtime.execute(run_code(agent=Agent("a")))
    assert value_of(result) == {"logs": (), "result": "ok"}
    assert attempts == ["refused", "refused"]
    assert [data["arguments"] for data in settles(events)] == [{"list": ("original",)}]


async def test_tools_with_exotic_dunder_names_are_ordinary_bindings() -> None:
    """S222: in a real child process, tools named like object internals are ordinary bindings."""

    async def ok(args: Any) -> str:
        return "proto-tool-ok"

    async def class_ok(args: Any) -> str:
        return "class-tool-ok"

    runtime = ToolRuntime(mode="code", code_runtime=SubprocessPythonRuntime(wall_budget_s=10))
    runtime.register(json_tool("__proto__", ok, output={"type": "string"}))
    runtime.register(json_tool("__class__", class_ok, output={"type": "string"}))
    program = "a = await tools['__proto__']({})\nb = await tools['__class__']({})\nprint(a)\nreturn b"
    result = await runtime.execute(make_input("run_code", {"code": program, "description": "Call dunder tools"}))
    assert isinstance(result, ToolExecutionSuccess), result
    assert result.content == (TextBlock("proto-tool-ok\nclass-tool-ok"),)


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ({"n": 42, "ok": True}, '{\n  "n": 42,\n  "ok": true\n}'),
        ({}, "{}"),
        ({"outer": [{"inner": True}]}, '{\n  "outer": [\n    {\n      "inner": true\n    }\n  ]\n}'),
        (["x", 2], '[\n  "x",\n  2\n]'),
        ([], "[]"),
        (None, "null"),
        ("raw", "raw"),
    ],
)
async def test_run_code_renders_its_return_value(value: Any, text: str) -> None:
    """S223: the returned value renders as 2-space pretty JSON (strings raw, null explicit)."""
    runtime, _, _ = setup(returning(value))
    result = await runtime.execute(run_code())
    assert value_of(result) == {"logs": (), "result": value}
    assert result.content == (TextBlock(text),)


async def test_run_code_without_a_value_renders_the_no_output_text() -> None:
    """S223: a program that returns nothing: value {logs: []} and the no-output text."""
    runtime, _, _ = setup(None)
    result = await runtime.execute(run_code())
    assert value_of(result) == {"logs": ()}
    assert result.content == (TextBlock(NO_OUTPUT),)


async def test_deeply_nested_return_value_renders_compactly() -> None:
    """S224: a record of empty containers, a pair and a record, wrapped in 5 000 arrays, renders in < 11 000 chars."""
    leaf = {"empty_list": [], "empty_record": {}, "pair": ["leaf", 1], "record": {"k": "leaf"}}
    runtime, _, _ = setup(returning(nest(leaf, 5000)))
    result = await runtime.execute(run_code())
    assert isinstance(result, ToolExecutionSuccess), result
    (block,) = result.content
    assert isinstance(block, TextBlock)
    assert block.text.startswith("[\n  [\n    [")
    assert '"leaf"' in block.text
    assert block.text.endswith("]")
    assert len(block.text) < 11000


async def test_pre_aborted_run_code_never_reaches_the_runtime() -> None:
    """S225: a run_code call whose signal already fired is the registry's ABORTED_BEFORE_DISPATCH."""
    calls: list[Any] = []
    runtime, events, fake = setup(None, echo_tool("echo", calls))
    signal = CancelSignal()
    signal.cancel("stop")
    result = await runtime.execute(run_code(signal=signal))
    assert result == failure("tool call aborted before dispatch", "AbortError", "ABORTED_BEFORE_DISPATCH")
    assert fake.runs == 0
    assert calls == []
    assert events == []


async def test_binding_called_after_the_outer_abort_is_not_dispatched() -> None:
    """S226: the program aborts the outer call, then calls echo: echo never runs; the run is ABORTED."""
    calls: list[Any] = []
    signal = CancelSignal()
    seen: list[str] = []

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        signal.cancel("user-cancel")
        seen.append(await outcome_of(tools["echo"], {"value": "late"}))
        return CodeRunResult(value=seen[-1], has_value=True)

    runtime, _, _ = setup(program, echo_tool("echo", calls))
    result = await runtime.execute(run_code(signal=signal))
    assert result == failure("tool call aborted", "AbortError", "ABORTED")
    assert calls == []
    assert seen == ["rejected: run_code run is over (user-cancel); echo not dispatched"]


async def test_dispatch_events_never_become_calls_on_replay(tmp_path: Path) -> None:
    """S227: replaying a session with Code Mode dispatch events yields only the model-requested call."""

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        return CodeRunResult(value=await tools["echo"]({"value": "x"}), has_value=True)

    path = tmp_path / "session.jsonl"
    with SessionLog(path) as log:
        recorder = SessionRecorder(log)
        runtime = ToolRuntime(mode="code", code_runtime=FakeCodeRuntime(program), event_sink=recorder.event_sink)
        runtime.register(echo_tool())
        runtime.plugins.register(recorder)
        request = run_code(agent=Agent("a"))
        recorder.record_call(request)
        result = await runtime.execute(request)
    assert isinstance(result, ToolExecutionSuccess), result
    read = read_session_log(path)
    assert [event.type for event in read.events] == [
        "tool/call",
        "tool/code-dispatch-start",
        "tool/code-dispatch",
        "tool/result",
    ]
    calls = replay(read, runtime)
    assert [(call.call_id, call.name) for call in calls] == [("call-1", "run_code")]
    assert [dispatch["subCallId"] for dispatch in calls[0].dispatches] == ["call-1:code:1"]


@pytest.mark.parametrize("cap", [0, -1, 1.5, True])
def test_direct_construction_refuses_a_bad_sub_call_cap(cap: Any) -> None:
    """S228: max_parallel_sub_calls must be a positive integer."""
    with pytest.raises(ValueError, match="max_parallel_sub_calls must be a positive integer"):
        ToolRuntime(mode="code", max_parallel_sub_calls=cap)


def test_direct_construction_in_code_mode_has_run_code_and_a_default_cap() -> None:
    """S229: ToolRuntime(mode="code") presents run_code; the sub-call cap defaults to 10."""
    runtime = ToolRuntime(mode="code")
    tool = runtime.get("run_code")
    assert tool is not None and tool.name == "run_code"
    assert runtime.max_parallel_sub_calls == 10


def test_direct_construction_without_config_is_native() -> None:
    """S230: a bare ToolRuntime is native: no run_code, no SDK."""
    runtime = ToolRuntime()
    runtime.register(echo_tool())
    assert runtime.mode == "native"
    assert runtime.get("run_code") is None
    assert runtime.names() == ["echo"]
    tools = runtime.model_tools()
    assert [schema.name for schema in tools.schemas] == ["echo"]
    assert tools.instructions == ""


async def test_model_direct_native_call_under_code_is_unknown_with_the_route_back() -> None:
    """S231: under "code" a model-direct call of a native tool fails UNKNOWN_TOOL with the exact route-back."""
    calls: list[Any] = []
    runtime, _, _ = setup(None, echo_tool("write", calls))
    result = await runtime.execute(make_input("write", {"value": "x"}))
    assert result == failure(
        'unknown tool "write": only `run_code` is callable directly — '
        "call `write` from inside a `run_code` program instead",
        "ToolNotFoundError",
        "UNKNOWN_TOOL",
    )
    assert calls == []


@pytest.mark.parametrize("cancelled", [False, True])
async def test_a_collapsed_call_with_non_json_arguments_keeps_its_finalizer_only_when_aborted(cancelled: bool) -> None:
    """f.1 step 4: the finalizer is dropped for a collapsed call unless its signal had already fired."""
    finalized: list[bool] = []
    tool = attrs.evolve(echo_tool(), finalize_content=lambda execution, result: finalized.append(result.is_error))
    runtime, _, _ = setup(None, tool)
    signal = CancelSignal()
    if cancelled:
        signal.cancel()
    result = await runtime.execute(make_input("echo", {"value": {1, 2}}, signal=signal))
    assert isinstance(result, ToolExecutionFailure)
    assert result.error.message.startswith("tool execution arguments must be losslessly JSON-serializable")
    assert finalized == ([True] if cancelled else [])


async def test_pre_aborted_collapsed_call_is_aborted_before_dispatch() -> None:
    """S232: a collapsed (code-only) call whose signal already fired is ABORTED_BEFORE_DISPATCH, not UNKNOWN_TOOL."""
    runtime, _, _ = setup(None, echo_tool())
    signal = CancelSignal()
    signal.cancel()
    result = await runtime.execute(make_input("echo", {"value": "x"}, signal=signal))
    assert isinstance(result, ToolExecutionFailure), result
    assert result.error.info == ToolErrorInfo(name="AbortError", code="ABORTED_BEFORE_DISPATCH")


# -- per-agent presentation ------------------------------------------------------------------


async def test_one_agent_in_code_under_a_native_deployment() -> None:
    """S233: present_as("code") for one agent: its wire is run_code + SDK, its direct echo is UNKNOWN_TOOL."""
    calls: list[Any] = []
    agent = Agent("coder")
    runtime = ToolRuntime(code_runtime=FakeCodeRuntime())
    runtime.register(echo_tool("echo", calls))
    runtime.present_as("code", agent)
    tools = runtime.model_tools(agent)
    assert [schema.name for schema in tools.schemas] == ["run_code"]
    assert "async def echo(self, args:" in tools.instructions
    assert CODE_ONLY_RULE in tools.instructions
    result = await runtime.execute(make_input("echo", {"value": "x"}, agent=agent))
    assert isinstance(result, ToolExecutionFailure), result
    assert result.error.info == ToolErrorInfo(name="ToolNotFoundError", code="UNKNOWN_TOOL")
    assert calls == []
    native = runtime.model_tools()
    assert [schema.name for schema in native.schemas] == ["echo"]
    assert native.instructions == ""


async def test_standing_scope_presentation_covers_its_children_only() -> None:
    """S234: a standing scope presenting "code" covers agents parented to it; an unparented sibling stays native."""
    calls: list[Any] = []
    preset = Agent("preset")
    child = Agent("child", parent=preset)
    loner = Agent("loner")
    runtime = ToolRuntime(code_runtime=FakeCodeRuntime())
    runtime.register(echo_tool("echo", calls, safe=True))
    runtime.present_as("code", preset)

    assert runtime.get("run_code", child) is not None
    assert [schema.name for schema in runtime.model_tools(child).schemas] == ["run_code"]
    direct = make_input("echo", {"value": "child"}, agent=child)
    assert runtime.execution_mode(direct) == Exclusive()
    result = await runtime.execute(direct)
    assert isinstance(result, ToolExecutionFailure), result
    assert result.error.info == ToolErrorInfo(name="ToolNotFoundError", code="UNKNOWN_TOOL")
    assert calls == []

    assert runtime.get("run_code", loner) is None
    assert [schema.name for schema in runtime.model_tools(loner).schemas] == ["echo"]
    sibling = make_input("echo", {"value": "loner"}, agent=loner)
    assert runtime.execution_mode(sibling) == Parallel()
    assert value_of(await runtime.execute(sibling)) == "echo:loner"
    assert calls == [{"value": "loner"}]


def test_run_code_is_only_in_a_coded_agents_table() -> None:
    """S235: run_code resolves for the coded scope only, not for a plain scope nor globally."""
    coded = Agent("coded")
    plain = Agent("plain")
    runtime = ToolRuntime(code_runtime=FakeCodeRuntime())
    runtime.register(echo_tool())
    runtime.present_as("code", coded)
    assert runtime.get("run_code", coded) is not None
    assert runtime.get("run_code", plain) is None
    assert runtime.get("run_code") is None
    assert "run_code" not in runtime.names(plain)
    assert "run_code" not in [schema.name for schema in runtime.schemas()]


def test_agent_opts_out_of_a_code_deployment() -> None:
    """S236: present_as("native") under a code deployment: that agent gets echo and no SDK."""
    agent = Agent("native-agent")
    runtime, _, _ = setup(None, echo_tool())
    runtime.present_as("native", agent)
    tools = runtime.model_tools(agent)
    assert [schema.name for schema in tools.schemas] == ["echo"]
    assert tools.instructions == ""
    assert [schema.name for schema in runtime.model_tools().schemas] == ["run_code"]


def test_second_presentation_for_a_scope_is_refused() -> None:
    """S238: a second present_as in the same scope conflicts with the first."""
    agent = Agent("a")
    runtime = ToolRuntime(code_runtime=FakeCodeRuntime())
    runtime.present_as("code", agent)
    with pytest.raises(RegistrationError, match='conflicts with "code" already declared'):
        runtime.present_as("both", agent)
    assert runtime.effective_mode(agent) == "code"


def test_missing_runtime_is_reported_with_the_agents_mode() -> None:
    """S241: native deployment, no code runtime, an agent presenting "both": its wire fails naming "both"."""
    agent = Agent("a")
    runtime = ToolRuntime()
    runtime.register(echo_tool())
    runtime.present_as("both", agent)
    with pytest.raises(DshError, match=r'^mode "both" requires a code runtime'):
        runtime.model_tools(agent)
    assert [schema.name for schema in runtime.model_tools().schemas] == ["echo"]
