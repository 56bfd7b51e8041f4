"""Code Mode: the run_code transport, its sub-call scheduling, events and rendering.

Scheduling logic runs against a fake in-process code runtime on trio's virtual
clock; a few end-to-end tests run real programs in the subprocess runtime on
the real clock with short budgets.
"""

from __future__ import annotations

import contextlib
import itertools
import re
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from dsh_core import (
    Accept,
    Agent,
    CancelSignal,
    Deny,
    DshError,
    ImageBlock,
    PresentationMode,
    TextBlock,
    ToolExecution,
    ToolExecutionFailure,
    ToolExecutionResult,
    ToolExecutionSuccess,
    ToolRunContext,
    ToolRuntime,
    UserMessage,
    define_tool,
    hookimpl,
)
from dsh_core.code_mode import CodeRunError, CodeRunResult, SubprocessPythonRuntime
from dsh_core.code_mode._bridge import pretty_json, render_run_code_value
from dsh_core.testing import FakeCodeRuntime, Recorder, json_tool, make_input

Next = Callable[[], Awaitable[Any]]
Program = Callable[[Mapping[str, Callable[[Any], Awaitable[Any]]]], Awaitable[CodeRunResult]]


def code(result: ToolExecutionResult) -> str | None:
    assert isinstance(result, ToolExecutionFailure), result
    return result.error.info.code if result.error.info else None


def sleepy(name: str, seconds: float, spans: dict[str, tuple[float, float]], *, parallel: bool) -> Any:
    async def body(args: Any) -> str:
        start = trio.current_time()
        await trio.sleep(seconds)
        spans[args["id"]] = (start, trio.current_time())
        return args["id"]

    return json_tool(
        name,
        body,
        parameters={"id": {"type": "string", "required": True}},
        output={"type": "string"},
        is_concurrency_safe=(lambda a: True) if parallel else None,
    )


def code_runtime(program: Program, *tools: Any, **options: Any) -> tuple[ToolRuntime, list[tuple[str, Any]]]:
    events: list[tuple[str, Any]] = []
    runtime = ToolRuntime(
        mode="code", code_runtime=FakeCodeRuntime(program), event_sink=lambda t, d: events.append((t, d)), **options
    )
    for tool in tools:
        runtime.register(tool)
    return runtime, events


def run_code(call_id: str = "outer", **options: Any) -> Any:
    return make_input("run_code", {"code": "...", "description": "do things"}, call_id=call_id, **options)


def gather(*calls: Callable[[], Awaitable[Any]]) -> Callable[[], Awaitable[list[Any]]]:
    async def run_all() -> list[Any]:
        results: list[Any] = [None] * len(calls)

        async def one(index: int) -> None:
            try:
                results[index] = await calls[index]()
            except Exception as exc:
                results[index] = exc

        async with trio.open_nursery() as nursery:
            for index in range(len(calls)):
                nursery.start_soon(one, index)
                await trio.sleep(0)  # submission order = start order
        return results

    return run_all


async def test_sub_calls_get_ordered_ids_parent_token_and_root(autojump_clock: trio.testing.MockClock) -> None:
    recorder = Recorder()

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        first = await tools["echo"]({"n": 1})
        second = await tools["echo"]({"n": 2})
        return CodeRunResult(logs=["ok"], value=[first, second], has_value=True)

    runtime, events = code_runtime(program, json_tool("echo"))
    runtime.plugins.register(recorder)
    result = await runtime.execute(run_code("outer", agent=Agent("a"), root_call_id="root"))
    assert isinstance(result, ToolExecutionSuccess)
    assert result.value == {"logs": ("ok",), "result": ({"n": 1}, {"n": 2})}
    nested = [(e.call_id, e.root_call_id, e.parent) for e, _ in recorder.results if e.parent is not None]
    outer = next(e for e, _ in recorder.results if e.parent is None)
    assert [n[0] for n in nested] == ["outer:code:1", "outer:code:2"]
    assert all(root == "root" and parent is outer.token for _, root, parent in nested)
    assert [t for t, _ in events] == ["tool/code-dispatch-start", "tool/code-dispatch"] * 2
    assert events[1][1]["content"] == (TextBlock('{"n": 1}'),)


async def test_run_code_is_never_a_binding_and_sees_the_agents_visible_set() -> None:
    agent = Agent("a")

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        return CodeRunResult()

    fake = FakeCodeRuntime(program)
    runtime = ToolRuntime(mode="code", code_runtime=fake)
    runtime.register(json_tool("global"))
    runtime.register(json_tool("mine"), agent)
    await runtime.execute(run_code(agent=agent))
    assert fake.names == ["global", "mine"]


async def test_parallel_sub_calls_overlap_up_to_the_cap(autojump_clock: trio.testing.MockClock) -> None:
    spans: dict[str, tuple[float, float]] = {}

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        await gather(*[lambda i=i: tools["read"]({"id": str(i)}) for i in range(6)])()
        return CodeRunResult()

    runtime, _ = code_runtime(program, sleepy("read", 1, spans, parallel=True), max_parallel_sub_calls=2)
    result = await runtime.execute(run_code())
    assert not result.is_error
    assert trio.current_time() == pytest.approx(3)


async def test_exclusive_sub_call_is_a_barrier(autojump_clock: trio.testing.MockClock) -> None:
    spans: dict[str, tuple[float, float]] = {}

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        await gather(
            lambda: tools["read"]({"id": "r1"}),
            lambda: tools["read"]({"id": "r2"}),
            lambda: tools["write"]({"id": "w"}),
            lambda: tools["read"]({"id": "r3"}),
        )()
        return CodeRunResult()

    runtime, _ = code_runtime(
        program, sleepy("read", 1, spans, parallel=True), sleepy("write", 1, spans, parallel=False)
    )
    await runtime.execute(run_code())
    assert spans["r1"][0] == spans["r2"][0] == pytest.approx(0)
    assert spans["w"] == (pytest.approx(1), pytest.approx(2))
    assert spans["r3"][0] == pytest.approx(2)


async def test_one_sub_calls_post_execute_never_overlaps_the_next_ones_pre_execute(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """h.5: starts and commits share one ordered lane; only dispatches overlap."""
    spans: list[tuple[str, str, float, float]] = []

    class SlowPolicies:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
            if execution.parent is None:
                return await next()  # run_code itself
            start = trio.current_time()
            await trio.sleep(0.5 if execution.call_id.endswith(":2") else 0.1)
            spans.append(("pre", execution.call_id[-1], start, trio.current_time()))
            return await next()

        @hookimpl
        async def dsh_post_execute(self, execution: ToolExecution, result: Any, next: Next) -> Any:
            if execution.parent is None:
                return await next()  # run_code itself
            start = trio.current_time()
            await trio.sleep(0.3)
            spans.append(("post", execution.call_id[-1], start, trio.current_time()))
            return await next()

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        values = await gather(*[lambda i=i: tools["read"]({"id": str(i)}) for i in (1, 2, 3)])()
        return CodeRunResult(value=values, has_value=True)

    runtime, _ = code_runtime(program, sleepy("read", 0.01, {}, parallel=True))
    runtime.plugins.register(SlowPolicies())
    result = await runtime.execute(run_code())
    assert result.value["result"] == ("1", "2", "3")  # type: ignore[index]
    ordered = sorted(spans, key=lambda span: span[2])
    for (_, _, _, end), (_, _, start, _) in itertools.pairwise(ordered):
        assert start >= end - 1e-9, ordered  # no two ordered stages at once
    assert [(stage, number) for stage, number, _, _ in ordered if stage == "post"] == [
        ("post", "1"), ("post", "2"), ("post", "3")
    ]  # fmt: skip


async def test_a_slow_dispatch_log_holds_back_later_starts_not_the_programs_value(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """h.5/h.6: the binding resolves first; while no log slot is free, the next sub-call waits to start."""
    returned: list[float] = []
    started: list[float] = []

    class SlowLog:
        @hookimpl
        async def dsh_code_dispatch_log(self, dispatch: Any, next: Next) -> Any:
            await trio.sleep(0.5)
            return await next()

    async def echo(args: Any) -> Any:
        started.append(trio.current_time())
        return args

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        for index in range(4):
            await tools["echo"]({"i": index})
            returned.append(trio.current_time())
        return CodeRunResult()

    runtime, events = code_runtime(program, json_tool("echo", echo), max_parallel_sub_calls=1)
    runtime.plugins.register(SlowLog())
    result = await runtime.execute(run_code(agent=Agent("a")))
    assert not result.is_error
    # Each value reaches the program as soon as its call commits; the log backlog delays the next start.
    assert [round(at - start, 6) for at, start in zip(returned, started, strict=True)] == [0, 0, 0, 0]
    assert started == [pytest.approx(0), pytest.approx(0), pytest.approx(0.5), pytest.approx(1.0)]
    assert [event for event, _ in events].count("tool/code-dispatch") == 4
    assert trio.current_time() == pytest.approx(2.0)  # the run waits for the last log


async def test_denied_sub_call_reaches_the_program_as_an_error() -> None:
    class DenyWrites:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
            if execution.name == "write":
                return Deny("writes are not allowed here")
            return await next()

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        try:
            await tools["write"]({})
        except Exception as exc:
            return CodeRunResult(value=str(exc), has_value=True)
        return CodeRunResult()

    runtime, events = code_runtime(program, json_tool("write"))
    runtime.plugins.register(DenyWrites())
    result = await runtime.execute(run_code(agent=Agent("a")))
    assert result.value == {"logs": (), "result": "writes are not allowed here"}  # type: ignore[union-attr]
    assert events[-1][1]["is_error"] is True


async def test_non_json_binding_arguments_fail_that_call_without_a_number() -> None:
    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        try:
            await tools["echo"]({"x": float("nan")})
        except Exception as exc:
            message = str(exc)
        await tools["echo"]({})
        return CodeRunResult(value=message, has_value=True)

    recorder = Recorder()
    runtime, _ = code_runtime(program, json_tool("echo"))
    runtime.plugins.register(recorder)
    result = await runtime.execute(run_code())
    assert "tool arguments must be lossless JSON" in result.value["result"]  # type: ignore[union-attr, index]
    assert [e.call_id for e, _ in recorder.results if e.parent] == ["outer:code:1"]


async def test_post_execute_value_replacement_is_what_the_program_sees() -> None:
    class Replace:
        @hookimpl
        async def dsh_post_execute(self, execution: ToolExecution, result: Any, next: Next) -> Any:
            await next()
            return Accept(value={"replaced": True}) if execution.parent else Accept()

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        return CodeRunResult(value=await tools["echo"]({"orig": 1}), has_value=True)

    runtime, _ = code_runtime(program, json_tool("echo"))
    runtime.plugins.register(Replace())
    result = await runtime.execute(run_code())
    assert result.value["result"] == {"replaced": True}  # type: ignore[union-attr, index]


async def test_outer_cancellation_cancels_in_flight_and_abandons_queued(
    autojump_clock: trio.testing.MockClock,
) -> None:
    spans: dict[str, tuple[float, float]] = {}
    body_exits: list[float] = []

    async def slow(args: Any) -> str:
        try:
            await trio.sleep(100)
        finally:
            body_exits.append(trio.current_time())
        return "late"

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        results = await gather(lambda: tools["slow"]({}), lambda: tools["write"]({"id": "w"}))()
        return CodeRunResult(value=[str(r) for r in results], has_value=True)

    runtime, events = code_runtime(
        program, json_tool("slow", slow, is_concurrency_safe=lambda a: True), sleepy("write", 1, spans, parallel=False)
    )
    signal = CancelSignal()

    async def stop() -> None:
        await trio.sleep(2)
        signal.cancel("user stop")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(stop)
        result = await runtime.execute(run_code(signal=signal, agent=Agent("a")))
    assert code(result) == "ABORTED"
    assert body_exits == [pytest.approx(2)]
    assert "w" not in spans
    starts = [d["sub_call_id"] for t, d in events if t == "tool/code-dispatch-start"]
    settles = [(d["sub_call_id"], d["is_error"]) for t, d in events if t == "tool/code-dispatch"]
    assert starts == ["outer:code:1"]  # the queued exclusive call never started and logs nothing
    assert settles == [("outer:code:1", True)]


async def test_run_settling_cancels_calls_the_program_did_not_await(autojump_clock: trio.testing.MockClock) -> None:
    drained: list[float] = []

    async def slow(args: Any) -> str:
        try:
            await trio.sleep(100)
        finally:
            drained.append(trio.current_time())
        return "late"

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        with trio.move_on_after(1):
            await tools["slow"]({})
        return CodeRunResult(logs=["gave up"])

    recorder = Recorder()
    runtime, events = code_runtime(program, json_tool("slow", slow))
    runtime.plugins.register(recorder)
    result = await runtime.execute(run_code(agent=Agent("a")))
    assert not result.is_error and drained == [pytest.approx(1)]
    nested = [r for e, r in recorder.results if e.parent is not None]
    assert len(nested) == 1 and code(nested[0]) == "ABORTED"
    assert [t for t, _ in events] == ["tool/code-dispatch-start", "tool/code-dispatch"]


async def test_dispatch_log_waterfall_changes_only_the_logged_copy() -> None:
    class Shorten:
        @hookimpl
        async def dsh_code_dispatch_log(self, dispatch: Any, next: Next) -> Any:
            await next()
            return [TextBlock(f"[{dispatch.name} {dispatch.sub_call_id} logged]")]

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        return CodeRunResult(value=await tools["echo"]({"big": "x" * 100}), has_value=True)

    runtime, events = code_runtime(program, json_tool("echo"))
    runtime.plugins.register(Shorten())
    result = await runtime.execute(run_code())
    assert result.value["result"] == {"big": "x" * 100}  # type: ignore[union-attr, index]
    assert events[-1][1]["content"] == (TextBlock("[echo outer:code:1 logged]"),)


async def test_dispatch_log_waterfall_runs_outer_to_inner_like_the_others() -> None:
    """h.6 / hookspecs "Order": tryfirst outermost, then later-registered, then trylast; each wraps what is inside it."""
    entered: list[str] = []

    class Layer:
        def __init__(self, label: str, **marks: bool) -> None:
            async def dsh_code_dispatch_log(dispatch: Any, next: Next) -> Any:
                entered.append(label)
                (inner,) = await next()
                return [TextBlock(f"{label}({inner.text})")]

            # A fresh function per instance: pluggy reads the marks from the function itself.
            self.dsh_code_dispatch_log = hookimpl(**marks)(dsh_code_dispatch_log)

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        return CodeRunResult(value=await tools["echo"]({"v": 1}), has_value=True)

    runtime, events = code_runtime(program, json_tool("echo"))
    for plugin in (Layer("n1"), Layer("tl", trylast=True), Layer("tf", tryfirst=True), Layer("n2")):
        runtime.plugins.register(plugin)
    result = await runtime.execute(run_code())
    assert result.value["result"] == {"v": 1}  # type: ignore[union-attr, index]
    assert entered == ["tf", "n2", "n1", "tl"]
    assert events[-1][1]["content"] == (TextBlock('tf(n2(n1(tl({"v": 1}))))'),)


async def test_raising_dispatch_log_listener_falls_back_to_original(caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        @hookimpl
        async def dsh_code_dispatch_log(self, dispatch: Any, next: Next) -> Any:
            raise RuntimeError("log listener broke")

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        await tools["echo"]({"a": 1})
        return CodeRunResult()

    runtime, events = code_runtime(program, json_tool("echo"))
    runtime.plugins.register(Broken())
    await runtime.execute(run_code())
    assert events[-1][1]["content"] == (TextBlock('{"a": 1}'),)
    assert "logging the original settled content" in caplog.text


async def test_images_and_sub_contexts_are_deferred_to_the_outer_result() -> None:
    async def picture(args: Any, run: ToolRunContext) -> str:
        run.defer_context(UserMessage([TextBlock("sub context")], source="pic"))
        return "png"

    tool = define_tool(
        name="pic",
        description="",
        parameters={},
        output={"type": "string"},
        execute=picture,
    )
    tool = __import__("attrs").evolve(
        tool,
        output=__import__("dsh_core").ToolOutput(
            schema=tool.output.schema, render=lambda a, v: [ImageBlock(data="AAAA", mime_type="image/png")]
        ),
    )

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        await tools["pic"]({})
        return CodeRunResult()

    runtime, _ = code_runtime(program, tool)
    result = await runtime.execute(run_code())
    sources = [c.source for c in result.additional_contexts]
    assert sources == ["code-mode", "pic"]
    assert isinstance(result.additional_contexts[0].content[0], ImageBlock)


async def test_failed_run_is_code_run_failed_with_captured_output() -> None:
    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        return CodeRunResult(logs=["captured before failure"], error=CodeRunError(kind="exception", message="boom"))

    runtime, _ = code_runtime(program)
    result = await runtime.execute(run_code())
    assert code(result) == "CODE_RUN_FAILED"
    assert result.content == (
        TextBlock("Error: code run failed (exception): boom\nCaptured output:\ncaptured before failure"),
    )


async def test_blank_description_is_refused() -> None:
    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        raise AssertionError("must not run")

    runtime, _ = code_runtime(program)
    result = await runtime.execute(make_input("run_code", {"code": "", "description": "   "}))
    assert result.is_error and "invalid description" in result.error.message  # type: ignore[union-attr]


async def test_code_mode_without_a_runtime_fails_clearly() -> None:
    runtime = ToolRuntime(mode="code")
    result = await runtime.execute(run_code())
    assert result.is_error and 'mode "code" requires a code runtime' in result.error.message  # type: ignore[union-attr]


async def test_model_direct_call_under_code_is_unknown_with_route_back() -> None:
    runtime, _ = code_runtime(lambda tools: None, json_tool("echo"))  # type: ignore[arg-type, return-value]
    result = await runtime.execute(make_input("echo"))
    assert code(result) == "UNKNOWN_TOOL"
    assert "call `echo` from inside a `run_code` program" in result.error.message  # type: ignore[union-attr]


def test_model_tools_per_mode() -> None:
    native = ToolRuntime()
    native.register(json_tool("echo"))
    assert [s.name for s in native.model_tools().schemas] == ["echo"]
    assert native.model_tools().instructions == ""

    code_only = ToolRuntime(mode="code", code_runtime=FakeCodeRuntime(returns_nothing))
    code_only.register(json_tool("echo"))
    tools = code_only.model_tools()
    assert [s.name for s in tools.schemas] == ["run_code"]
    assert "`run_code` is the only tool you can call directly" in tools.instructions
    assert "echo" in tools.instructions
    assert code_only.model_tools().instructions == tools.instructions  # byte-identical, cacheable

    both = ToolRuntime(mode="both", code_runtime=FakeCodeRuntime(returns_nothing))
    both.register(json_tool("echo"))
    assert [s.name for s in both.model_tools().schemas] == ["echo", "run_code"]
    assert "only tool you can call directly" not in both.model_tools().instructions


async def returns_nothing(bindings: Mapping[str, Any]) -> CodeRunResult:
    return CodeRunResult(logs=())


@pytest.mark.parametrize("mode", ["code", "both"])
async def test_a_code_mode_without_a_usable_code_runtime_has_no_model_tools(mode: PresentationMode) -> None:
    # Advertising run_code (or a Python SDK to a non-Python runtime) would only fail later, less clearly.
    missing = ToolRuntime(mode=mode)
    missing.register(json_tool("echo"))
    with pytest.raises(DshError, match=f'^mode "{mode}" requires a code runtime: pass ToolRuntime') as raised:
        missing.model_tools()
    assert raised.value.code == "CODE_RUNTIME_MISSING"
    failure = await missing.execute(make_input("run_code", {"code": "return 1", "description": "one"}))
    assert isinstance(failure, ToolExecutionFailure)
    assert failure.error.message.startswith(f'mode "{mode}" requires a code runtime')
    assert code(failure) == "CODE_RUNTIME_MISSING"

    ruby = FakeCodeRuntime(returns_nothing)
    ruby.language = "ruby"
    unsupported = ToolRuntime(mode=mode, code_runtime=ruby)
    message = 'no SDK renderer registered for runtime language "ruby" (known: "python")'
    with pytest.raises(DshError, match=re.escape(message)) as raised:
        unsupported.model_tools()
    assert raised.value.code == "CODE_RUNTIME_UNSUPPORTED"
    failure = await unsupported.execute(make_input("run_code", {"code": "return 1", "description": "one"}))
    assert isinstance(failure, ToolExecutionFailure)
    assert (failure.error.message, code(failure)) == (message, "CODE_RUNTIME_UNSUPPORTED")
    assert ruby.runs == 0  # the program never ran


def test_model_tools_renders_the_sdk_once_per_visible_tool_set(monkeypatch: pytest.MonkeyPatch) -> None:
    from dsh_core import code_mode

    renders: list[int] = []
    original = code_mode.render_python_sdk

    def counting(tools: Any) -> str:
        renders.append(len(list(tools)))
        return original(tools)

    monkeypatch.setattr(code_mode, "render_python_sdk", counting)
    runtime = ToolRuntime(mode="code", code_runtime=FakeCodeRuntime(returns_nothing))
    runtime.register(json_tool("echo"))
    first = runtime.model_tools()
    assert runtime.model_tools() is first
    assert renders == [1]
    with runtime.register(json_tool("zebra")):
        second = runtime.model_tools()
        assert "zebra" in second.instructions and runtime.model_tools() is second
    assert renders == [1, 2]
    third = runtime.model_tools()
    assert third.instructions == first.instructions and "zebra" not in third.instructions
    assert renders == [1, 2, 1]


def test_present_as_scopes_code_mode_and_disposer_restores() -> None:
    runtime = ToolRuntime()
    runtime.register(json_tool("echo"))
    agent = Agent("coder")
    child = Agent("child", parent=agent)
    dispose = runtime.present_as("code", agent)
    assert runtime.effective_mode(child) == "code"
    assert runtime.names(agent) == ["echo", "run_code"]
    assert runtime.names() == ["echo"]
    dispose()
    assert runtime.effective_mode(agent) == "native" and runtime.names(agent) == ["echo"]


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ({"logs": ("printed",)}, "printed"),
        ({"logs": (), "result": "returned"}, "returned"),
        ({"logs": ("printed",), "result": "returned"}, "printed\nreturned"),
        ({"logs": ()}, "(run_code completed with no output)"),
        ({"logs": (), "result": {"n": 42, "ok": True}}, '{\n  "n": 42,\n  "ok": true\n}'),
        ({"logs": (), "result": ["x", 2]}, '[\n  "x",\n  2\n]'),
        ({"logs": (), "result": None}, "null"),
    ],
)
def test_run_code_rendering(value: Any, text: str) -> None:
    assert render_run_code_value({}, value) == [TextBlock(text)]


def test_pretty_json_caps_indentation_and_survives_deep_values() -> None:
    nested: Any = [1, 2]
    for _ in range(6):
        nested = [nested]
    rendered = pretty_json(nested)
    assert max(len(line) - len(line.lstrip()) for line in rendered.splitlines()) <= 10
    assert "[[1,2]]" in rendered.replace(" ", "")
    # Past the indentation cap containers are compact, with no space after "," or ":".
    assert "\n          [[1,2]]\n" in rendered
    assert '\n          {"k":"v","n":[1,2]}\n' in pretty_json([[[[[{"k": "v", "n": [1, 2]}]]]]])
    deep: Any = []
    for _ in range(5000):
        deep = [deep]
    assert len(pretty_json(deep)) < 11000


def _reference_pretty(value: Any, depth: int = 0) -> str:
    """pretty_json's format, written plainly (recursive: shallow values only)."""
    import json

    if isinstance(value, (dict, list, tuple)) and depth >= 5:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    pad, inner = "  " * depth, "  " * (depth + 1)
    if isinstance(value, dict) and value:
        items = [f"{inner}{json.dumps(k, ensure_ascii=False)}: {_reference_pretty(v, depth + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(value, (list, tuple)) and value:
        return "[\n" + ",\n".join(inner + _reference_pretty(v, depth + 1) for v in value) + "\n" + pad + "]"
    return json.dumps(value, ensure_ascii=False)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False).map(lambda number: number + 0.0)  # -0.0 is no JSON value
    | st.text(),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=3), children, max_size=4),
    max_leaves=30,
)


@given(json_values)
def test_pretty_json_writes_what_the_plain_format_says(value: Any) -> None:
    """Lists of scalars take a faster path (a program's million numbers took seconds): same text."""
    from dsh_core import snapshot_json, thaw

    frozen = snapshot_json(value)  # as a program's result arrives
    assert pretty_json(frozen) == _reference_pretty(thaw(frozen))


def _nested(value: Any, levels: int) -> Any:
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize(
    "value",
    [
        [{"id": 1, "name": "é\ud800", "ok": True}, {"id": 2.5, "name": None}, {}, [], 7, "x", [1, "a"]],
        [[1, 2], [], ["a", None, 0.5]],
        {"rows": [{"a": {"deep": 1}}, {"b": 2}]},
        *(_nested([{"k": "v"}, [1, 2], {}, 3], levels) for levels in range(7)),
        *(_nested({"k": 1, "l": "x"}, levels) for levels in range(7)),
    ],
)
def test_pretty_json_rows_and_flat_containers_write_what_the_plain_format_says(value: Any) -> None:
    """Rows of objects (a program's 200 000 rows took 1.6 s on the event loop) and the indentation cap around them."""
    from dsh_core import snapshot_json, thaw

    frozen = snapshot_json(value)
    assert pretty_json(frozen) == _reference_pretty(thaw(frozen))


# -- end to end in a real subprocess (real clock, short budgets) --------------------------


def add_tool() -> Any:
    async def add(args: Any) -> int:
        return args["a"] + args["b"]

    return define_tool(
        name="add",
        description="Add two integers",
        parameters={"a": {"type": "integer", "required": True}, "b": {"type": "integer", "required": True}},
        output={"type": "integer"},
        execute=add,
        is_concurrency_safe=lambda a: True,
    )


@pytest.mark.parametrize("exclusive", [False, True], ids=["parallel-safe", "exclusive"])
async def test_a_call_the_program_stops_waiting_for_is_cancelled_on_the_host(exclusive: bool) -> None:
    """asyncio.wait_for only stopped the program waiting: the tool ran on, and later calls waited 30 s."""
    aborted: list[bool] = []

    async def slow(args: Any) -> str:
        try:
            await trio.sleep(30)
        except trio.Cancelled:
            aborted.append(True)
            raise
        return "slow done"

    events: list[tuple[str, Any]] = []
    runtime = ToolRuntime(
        mode="code",
        code_runtime=SubprocessPythonRuntime(wall_budget_s=20),
        event_sink=lambda kind, data: events.append((kind, dict(data))),
    )
    runtime.register(json_tool("slow", slow, is_concurrency_safe=None if exclusive else (lambda args: True)))
    runtime.register(add_tool())
    program = (
        "import asyncio\n"
        "try:\n"
        "    await asyncio.wait_for(tools.slow({}), 0.3)\n"
        "except TimeoutError:\n"
        "    print('gave up')\n"
        "return await tools.add({'a': 1, 'b': 2})\n"
    )
    start = trio.current_time()
    result = await runtime.execute(make_input("run_code", {"code": program, "description": "Give up"}))
    assert isinstance(result, ToolExecutionSuccess), result
    assert result.value == {"logs": ("gave up",), "result": 3}
    assert trio.current_time() - start < 10 and aborted == [True]
    settled = [data for kind, data in events if kind == "tool/code-dispatch"]
    assert [(data["name"], data["is_error"]) for data in settled] == [("slow", True), ("add", False)]


async def test_end_to_end_program_with_gather_and_caught_tool_error() -> None:
    runtime = ToolRuntime(mode="code", code_runtime=SubprocessPythonRuntime(wall_budget_s=10))
    runtime.register(add_tool())
    program = (
        "import asyncio\n"
        "sums = await asyncio.gather(tools.add({'a': 1, 'b': 2}), tools['add']({'a': 3, 'b': 4}))\n"
        "print('sums', sums)\n"
        "try:\n"
        "    await tools.add({'a': 'x', 'b': 1})\n"
        "except ToolCallError as exc:\n"
        "    print('caught', exc.tool_name)\n"
        "return sum(sums)\n"
    )
    result = await runtime.execute(make_input("run_code", {"code": program, "description": "Add numbers"}))
    assert isinstance(result, ToolExecutionSuccess), result
    assert result.value == {"logs": ("sums [3, 7]", "caught add"), "result": 10}


async def test_end_to_end_infinite_loop_hits_the_budget() -> None:
    runtime = ToolRuntime(mode="code", code_runtime=SubprocessPythonRuntime(wall_budget_s=1.0))
    start = trio.current_time()
    result = await runtime.execute(make_input("run_code", {"code": "while True:\n    pass\n", "description": "spin"}))
    assert code(result) == "CODE_RUN_FAILED"
    assert "(timeout)" in result.error.message  # type: ignore[union-attr]
    assert trio.current_time() - start < 8


async def test_end_to_end_outer_cancellation_reaps_the_child() -> None:
    import os

    runtime = ToolRuntime(mode="code", code_runtime=SubprocessPythonRuntime(wall_budget_s=30))
    signal = CancelSignal()
    program = "import os\nprint(os.getpid())\nimport time\nwhile True:\n    time.sleep(0.05)\n"

    async def stop() -> None:
        await trio.sleep(1.0)
        signal.cancel("stop")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(stop)
        result = await runtime.execute(make_input("run_code", {"code": program, "description": "wait"}, signal=signal))
    assert code(result) == "ABORTED"
    # The child is gone (reaped): no process with that pid belongs to us any more.
    for pid in _children_of(os.getpid()):
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            assert b"_child.py" not in handle.read()


def _children_of(pid: int) -> list[int]:
    import os

    children: list[int] = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
                if int(fields[1]) == pid:
                    children.append(int(entry))
            except OSError:
                continue
    return children


async def test_end_to_end_denied_tool_reaches_the_program_as_tool_call_error() -> None:
    class DenyAdd:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
            return Deny("adding is forbidden today") if execution.name == "add" else await next()

    runtime = ToolRuntime(mode="code", code_runtime=SubprocessPythonRuntime(wall_budget_s=10))
    runtime.register(add_tool())
    runtime.plugins.register(DenyAdd())
    program = (
        "try:\n"
        "    await tools.add({'a': 1, 'b': 2})\n"
        "except ToolCallError as exc:\n"
        "    return [exc.tool_name, str(exc)]\n"
    )
    result = await runtime.execute(make_input("run_code", {"code": program, "description": "Try to add"}))
    assert isinstance(result, ToolExecutionSuccess), result
    name, message = result.value["result"]  # type: ignore[index, misc]
    assert name == "add" and "adding is forbidden today" in message


async def test_end_to_end_exclusive_call_waits_for_parallel_ones() -> None:
    order: list[str] = []

    async def read(args: Any) -> str:
        order.append(f"start {args['id']}")
        await trio.sleep(0.2)
        order.append(f"end {args['id']}")
        return args["id"]

    async def write(args: Any) -> str:
        order.append("write")
        return "w"

    runtime = ToolRuntime(mode="code", code_runtime=SubprocessPythonRuntime(wall_budget_s=10))
    runtime.register(json_tool("read", read, output={"type": "string"}, is_concurrency_safe=lambda a: True))
    runtime.register(json_tool("write", write, output={"type": "string"}))
    # The reads are submitted first, then the write: the exclusive write must wait for
    # both reads to finish, though all three frames reach the host at once.
    program = "import asyncio\nawait asyncio.gather(tools.read({'id': 'r1'}), tools.read({'id': 'r2'}), tools.write({}))\n"
    result = await runtime.execute(make_input("run_code", {"code": program, "description": "Read then write"}))
    assert not result.is_error, result
    assert order.index("write") > max(order.index("end r1"), order.index("end r2"))
    assert order.index("start r2") < order.index("end r1")  # the two reads overlapped


async def test_sub_calls_are_numbered_and_run_in_the_order_they_were_made_not_awaited(
    autojump_clock: trio.testing.MockClock,
) -> None:
    journal: list[str] = []

    async def append(args: Any) -> str:
        await trio.sleep(1)
        journal.append(args["v"])
        return args["v"]

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        calls = [tools["append"]({"v": v}) for v in "abcd"]  # made in this order...
        results: list[str] = []

        async def wait(call: Awaitable[str]) -> None:
            results.append(await call)

        async with trio.open_nursery() as nursery:
            for call in reversed(calls):  # ...awaited in the other
                nursery.start_soon(wait, call)
        return CodeRunResult(value=results, has_value=True)

    runtime, events = code_runtime(program, json_tool("append", append, output={"type": "string"}))
    result = await runtime.execute(run_code())
    assert result.value == {"logs": (), "result": ("a", "b", "c", "d")}  # type: ignore[union-attr]
    assert journal == ["a", "b", "c", "d"]
    starts = [(d["sub_call_id"], d["arguments"]["v"]) for t, d in events if t == "tool/code-dispatch-start"]
    assert starts == [("outer:code:1", "a"), ("outer:code:2", "b"), ("outer:code:3", "c"), ("outer:code:4", "d")]


async def test_end_to_end_gathered_calls_are_numbered_and_run_in_the_order_the_program_made_them() -> None:
    # A rerun of the same program must give its calls the same ids (an effect ledger replays
    # by id), and calls that change things run in the order they were made.
    program = (
        "import asyncio\n"
        "await asyncio.gather(*[tools.append({'v': v}) for v in 'abcdef'])\n"
    )
    journal: list[str] = []
    events: list[tuple[str, Any]] = []

    async def append(args: Any) -> None:
        await trio.sleep(0.001)
        journal.append(args["v"])

    runtime = ToolRuntime(
        mode="code",
        code_runtime=SubprocessPythonRuntime(wall_budget_s=10),
        event_sink=lambda t, d: events.append((t, d)),
    )
    runtime.register(json_tool("append", append))  # no classifier: exclusive
    for _ in range(6):
        journal.clear()
        events.clear()
        result = await runtime.execute(make_input("run_code", {"code": program, "description": "append"}, call_id="run"))
        assert not result.is_error, result
        assert journal == list("abcdef")
        starts = [(d["sub_call_id"], d["arguments"]["v"]) for t, d in events if t == "tool/code-dispatch-start"]
        assert starts == [(f"run:code:{n}", v) for n, v in enumerate("abcdef", 1)]


async def test_end_to_end_huge_output_hits_the_output_limit_quickly() -> None:
    runtime = ToolRuntime(
        mode="code", code_runtime=SubprocessPythonRuntime(wall_budget_s=20, max_output_bytes=1024 * 1024)
    )
    program = "chunk = 'x' * 1_000_000\nfor _ in range(100):\n    print(chunk)\n"
    start = trio.current_time()
    result = await runtime.execute(make_input("run_code", {"code": program, "description": "Print 100 MB"}))
    assert code(result) == "CODE_RUN_FAILED"
    assert "(output-limit)" in result.error.message  # type: ignore[union-attr]
    assert trio.current_time() - start < 15


def test_cli_call_run_code_in_both_mode() -> None:
    import subprocess
    import sys

    program = "r = await tools.calc({'op': 'add', 'a': 2, 'b': 3})\nprint('calc says', r)\nreturn r"
    completed = subprocess.run(
        [sys.executable, "-m", "dsh_core._cli", "--mode", "both", "call", "run_code",
         __import__("json").dumps({"code": program, "description": "Add two numbers"})],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.splitlines() == ["calc says 5", "5"]


async def test_a_binding_completes_at_once_only_when_idle_and_nothing_can_suspend(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def quiet_body(args: Any) -> str:
        return "quiet"

    async def loud_body(args: Any) -> str:
        await trio.sleep(1)
        return "loud"

    seen: dict[str, bool] = {}

    async def program(bindings: Mapping[str, Any]) -> CodeRunResult:
        seen["quiet"] = bindings["quiet"].completes_at_once()
        seen["loud"] = bindings["loud"].completes_at_once()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(bindings["loud"], {})
            await trio.testing.wait_all_tasks_blocked()
            seen["quiet while another is in flight"] = bindings["quiet"].completes_at_once()
        seen["quiet afterwards"] = bindings["quiet"].completes_at_once()
        return CodeRunResult(value=await bindings["quiet"]({}), has_value=True)

    runtime, _ = code_runtime(
        program,
        json_tool("quiet", quiet_body, output={"type": "string"}),
        json_tool("loud", loud_body, output={"type": "string"}),
    )
    result = await runtime.execute(run_code())
    assert result.value == {"logs": (), "result": "quiet"}  # type: ignore[union-attr]
    assert seen == {"quiet": True, "loud": False, "quiet while another is in flight": False, "quiet afterwards": True}


@pytest.mark.parametrize("approval", [False, True])
async def test_a_listener_that_can_suspend_or_ask_makes_a_binding_not_complete_at_once(approval: bool) -> None:
    from dsh_core.testing import StaticApproval

    class Checkpointing:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
            if not approval:
                await trio.lowlevel.checkpoint()
            return await next()

    async def quiet_body(args: Any) -> str:
        return "quiet"

    seen: list[bool] = []

    async def program(bindings: Mapping[str, Any]) -> CodeRunResult:
        seen.append(bindings["quiet"].completes_at_once())
        return CodeRunResult()

    options: dict[str, Any] = {"approval": StaticApproval("allowed-once")} if approval else {}
    runtime, _ = code_runtime(program, json_tool("quiet", quiet_body, output={"type": "string"}), **options)
    runtime.plugins.register(Checkpointing())
    await runtime.execute(run_code())
    assert seen == [False]


class _TaskSteps(trio.abc.Instrument):
    def __init__(self) -> None:
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps += 1


@contextlib.contextmanager
def counting_task_steps() -> Iterator[_TaskSteps]:
    """Counts trio task steps (wake-ups) while the block runs."""
    steps = _TaskSteps()
    trio.lowlevel.add_instrument(steps)
    try:
        yield steps
    finally:
        trio.lowlevel.remove_instrument(steps)


def parallel_read(body: Callable[[Any], Awaitable[str]]) -> Any:
    """A parallel-safe ``read(id) -> str`` tool running ``body``."""
    return json_tool(
        "read",
        body,
        parameters={"id": {"type": "string", "required": True}},
        output={"type": "string"},
        is_concurrency_safe=lambda a: True,
    )


async def test_queued_sub_calls_wake_only_at_their_turn(autojump_clock: trio.testing.MockClock) -> None:
    # A slow first call holds every commit back while hundreds of others queue to start
    # and to commit: waking every queued ticket on every change of the lane made such a
    # program quadratic (4 000 gathered sub-calls took 25 s). Task steps count wake-ups.
    count = 400

    async def body(args: Any) -> str:
        await trio.sleep(50 if args["id"] == "0" else 1)
        return args["id"]


    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        values = await gather(*[lambda i=i: tools["read"]({"id": str(i)}) for i in range(count)])()
        return CodeRunResult(value=values, has_value=True)

    runtime, events = code_runtime(program, parallel_read(body), max_parallel_sub_calls=4)
    with counting_task_steps() as steps:
        result = await runtime.execute(run_code())
    assert isinstance(result, ToolExecutionSuccess), result
    assert result.value["result"] == tuple(str(i) for i in range(count))
    commits = [d["sub_call_id"] for t, d in events if t == "tool/code-dispatch"]
    assert commits == [f"outer:code:{i + 1}" for i in range(count)]
    assert steps.steps < 25 * count, steps.steps


async def test_a_settled_run_abandons_thousands_of_queued_calls_at_once(autojump_clock: trio.testing.MockClock) -> None:
    count = 2000
    started: list[str] = []

    async def body(args: Any) -> str:
        started.append(args["id"])
        await trio.sleep(100)
        return args["id"]


    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        with trio.move_on_after(1):
            async with trio.open_nursery() as nursery:
                for i in range(count):
                    nursery.start_soon(tools["read"], {"id": str(i)})
        return CodeRunResult(error=CodeRunError(kind="timeout", message="out of budget"))

    runtime, events = code_runtime(program, parallel_read(body), max_parallel_sub_calls=4)
    with counting_task_steps() as steps:
        result = await runtime.execute(run_code())
    assert code(result) == "CODE_RUN_FAILED"
    assert len(started) == 4
    assert trio.current_time() == pytest.approx(1)
    assert len([t for t, _ in events if t == "tool/code-dispatch"]) == 4  # only started calls log
    assert steps.steps < 25 * count, steps.steps


async def test_without_an_event_sink_dispatch_log_listeners_do_not_run(autojump_clock: trio.testing.MockClock) -> None:
    # They reshape only the logged copy, and nothing is logged without a sink: a suspending one
    # would still have cost every sub-call a log slot (and the inline path) for nothing.
    seen: list[str] = []

    class SlowLog:
        @hookimpl
        async def dsh_code_dispatch_log(self, dispatch: Any, next: Next) -> Any:
            seen.append(dispatch.sub_call_id)
            await trio.sleep(1)
            return await next()

    at_once: list[bool] = []

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        at_once.append(tools["echo"].completes_at_once())
        return CodeRunResult(value=await tools["echo"]({"n": 1}), has_value=True)

    runtime = ToolRuntime(mode="code", code_runtime=FakeCodeRuntime(program))
    runtime.register(json_tool("echo"))
    runtime.plugins.register(SlowLog())
    result = await runtime.execute(run_code())
    assert result.value == {"logs": (), "result": {"n": 1}}  # type: ignore[union-attr]
    assert seen == [] and at_once == [True] and trio.current_time() == 0

    logged, events = code_runtime(program, json_tool("echo"))
    logged.plugins.register(SlowLog())
    await logged.execute(run_code())
    assert seen == ["outer:code:1"] and at_once[-1] is False
    assert [t for t, _ in events] == ["tool/code-dispatch-start", "tool/code-dispatch"]


async def test_a_program_firing_calls_without_awaiting_them_waits_for_room(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each call a program has waiting costs the host tasks: past the cap the host reads no
    # further frame until one is answered, so a flood is slowed down, never unbounded.
    from dsh_core.code_mode import _runtime

    monkeypatch.setattr(_runtime, "MAX_CALLS_IN_FLIGHT", 8)
    waiting: list[int] = []
    serve = _runtime._Session._serve

    async def counting_serve(self: Any, *args: Any) -> None:
        waiting.append(len(self._in_flight))
        await serve(self, *args)

    monkeypatch.setattr(_runtime._Session, "_serve", counting_serve)

    async def slow_add(args: Any) -> int:
        await trio.sleep(0.001)  # suspends: every call is served by a task of its own
        return args["a"] + args["b"]

    runtime = ToolRuntime(mode="code", code_runtime=SubprocessPythonRuntime(wall_budget_s=20))
    runtime.register(json_tool("add", slow_add, output={"type": "integer"}, is_concurrency_safe=lambda a: True))
    program = (
        "import asyncio\n"
        "sums = await asyncio.gather(*[tools.add({'a': i, 'b': 1}) for i in range(200)])\n"
        "return sum(sums)\n"
    )
    result = await runtime.execute(make_input("run_code", {"code": program, "description": "flood"}))
    assert isinstance(result, ToolExecutionSuccess), result
    assert result.value == {"logs": (), "result": sum(range(200)) + 200}
    assert len(waiting) == 200 and max(waiting) == 8


def keyed_writer(spans: dict[str, tuple[float, float]], *, concurrency_safe: bool) -> Any:
    async def body(args: Any) -> str:
        start = trio.current_time()
        await trio.sleep(1)
        spans[args["id"]] = (start, trio.current_time())
        return args["id"]

    return json_tool(
        "write",
        body,
        parameters={"id": {"type": "string", "required": True}, "path": {"type": "string", "required": True}},
        output={"type": "string"},
        is_concurrency_safe=(lambda a: True) if concurrency_safe else None,
        resource_keys=lambda args: {"write": [args["path"]]},
    )


@pytest.mark.parametrize("concurrency_safe", [True, False], ids=["safe-and-keyed", "keyed-only"])
async def test_keyed_sub_calls_serialise_on_a_shared_key_and_overlap_otherwise(
    concurrency_safe: bool, autojump_clock: trio.testing.MockClock
) -> None:
    # As in run_tool_calls, keys replace is_concurrency_safe: two writes of one path never overlap (a
    # concurrency-safe tool used to run them at once), writes of different paths do.
    spans: dict[str, tuple[float, float]] = {}

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        values = await gather(
            lambda: tools["write"]({"id": "a1", "path": "a.txt"}),
            lambda: tools["write"]({"id": "b", "path": "b.txt"}),
            lambda: tools["write"]({"id": "a2", "path": "a.txt"}),
        )()
        return CodeRunResult(value=values, has_value=True)

    runtime, _ = code_runtime(program, keyed_writer(spans, concurrency_safe=concurrency_safe))
    result = await runtime.execute(run_code())
    assert isinstance(result, ToolExecutionSuccess)
    assert result.value["result"] == ("a1", "b", "a2")  # type: ignore[index]
    assert spans["a1"] == (pytest.approx(0), pytest.approx(1))
    assert spans["b"] == (pytest.approx(0), pytest.approx(1))
    assert spans["a2"] == (pytest.approx(1), pytest.approx(2))  # waited for the first write of a.txt


async def test_a_keyed_sub_call_waiting_for_its_key_is_abandoned_when_the_run_is_cancelled(
    autojump_clock: trio.testing.MockClock,
) -> None:
    spans: dict[str, tuple[float, float]] = {}
    outcomes: list[Any] = []

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        outcomes.extend(
            await gather(
                lambda: tools["write"]({"id": "a1", "path": "a.txt"}),
                lambda: tools["write"]({"id": "a2", "path": "a.txt"}),
            )()
        )
        return CodeRunResult()

    runtime, _ = code_runtime(program, keyed_writer(spans, concurrency_safe=True))
    recorder = Recorder()
    runtime.plugins.register(recorder)
    signal = CancelSignal()
    async with trio.open_nursery() as nursery:

        async def cancel() -> None:
            await trio.sleep(0.5)
            signal.cancel("stop")

        nursery.start_soon(cancel)
        result = await runtime.execute(run_code(signal=signal))
    assert code(result) == "ABORTED"
    assert "a2" not in spans  # it never dispatched
    sub_codes = {e.call_id: r.error.info.code for e, r in recorder.results if e.parent is not None and r.is_error}
    assert sub_codes == {"outer:code:1": "ABORTED", "outer:code:2": "ABORTED_BEFORE_DISPATCH"}


async def test_a_sub_call_rewritten_onto_other_keys_runs_as_a_barrier(autojump_clock: trio.testing.MockClock) -> None:
    # Admitted for b.txt, rewritten to a.txt while it was decided: it can no longer trust the claim it
    # was admitted with, so it waits for every call started before it and nothing starts beside it.
    from dsh_core import Rewrite

    spans: dict[str, tuple[float, float]] = {}

    class MovesToA:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
            args = execution.arguments
            if execution.parent is not None and args["id"] == "moved" and args["path"] == "b.txt":
                return Rewrite({**args, "path": "a.txt"}, reason="b.txt is read-only")
            return await next()

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        await gather(
            lambda: tools["write"]({"id": "a1", "path": "a.txt"}),
            lambda: tools["write"]({"id": "moved", "path": "b.txt"}),
            lambda: tools["write"]({"id": "c", "path": "c.txt"}),
        )()
        return CodeRunResult()

    runtime, _ = code_runtime(program, keyed_writer(spans, concurrency_safe=True))
    runtime.plugins.register(MovesToA())
    result = await runtime.execute(run_code())
    assert not result.is_error
    assert spans["a1"] == (pytest.approx(0), pytest.approx(1))
    assert spans["moved"] == (pytest.approx(1), pytest.approx(2))
    assert spans["c"] == (pytest.approx(2), pytest.approx(3))


@pytest.mark.parametrize("parallel", [True, False])
async def test_a_call_awaited_after_a_later_one_does_not_hold_the_run(
    autojump_clock: trio.testing.MockClock, parallel: bool
) -> None:
    """A sub-call started only when awaited: awaiting a later call first waited on it for good."""
    spans: dict[str, tuple[float, float]] = {}

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        first = tools["read"]({"id": "a"})
        second = await tools["read"]({"id": "b"})
        return CodeRunResult(value=[await first, second], has_value=True)

    runtime, events = code_runtime(program, sleepy("read", 1, spans, parallel=parallel))
    with trio.fail_after(60):
        result = await runtime.execute(run_code())
    assert isinstance(result, ToolExecutionSuccess), result
    assert result.value["result"] == ("a", "b")
    started = [data["sub_call_id"] for kind, data in events if kind == "tool/code-dispatch-start"]
    assert started == ["outer:code:1", "outer:code:2"]  # still in the order the program made them
    if not parallel:
        assert spans["a"][1] <= spans["b"][0]


# Python says so when the dropped awaitable is collected: the program's bug, reported as such.
@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited:RuntimeWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_a_call_never_awaited_does_not_hold_later_calls(autojump_clock: trio.testing.MockClock) -> None:
    spans: dict[str, tuple[float, float]] = {}

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        tools["read"]({"id": "ignored"})  # a program bug: the call is made, its outcome never awaited
        return CodeRunResult(value=await tools["read"]({"id": "b"}), has_value=True)

    runtime, events = code_runtime(program, sleepy("read", 1, spans, parallel=False))
    with trio.fail_after(60):
        result = await runtime.execute(run_code())
    assert isinstance(result, ToolExecutionSuccess), result
    assert result.value["result"] == "b"
    assert set(spans) == {"ignored", "b"}  # made, so it ran: before the later call, as made
    assert spans["ignored"][1] <= spans["b"][0]
    assert [d["sub_call_id"] for kind, d in events if kind == "tool/code-dispatch"] == ["outer:code:1", "outer:code:2"]


async def test_a_tool_replaced_while_a_sub_call_waits_for_its_key_is_not_run_outside_its_schedule(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """As in run_tool_calls: the waiting sub-call was admitted under the old tool's keys."""
    spans: dict[str, tuple[float, float]] = {}
    runtime_box: list[ToolRuntime] = []
    disposers: list[Any] = []
    exclusive = sleepy("write", 1, spans, parallel=False)

    async def body(args: Any) -> str:
        # Half-way through "first", with "second" admitted and waiting for it.
        start = trio.current_time()
        await trio.sleep(0.5)
        if args["id"] == "first":
            disposers.pop()()
            runtime_box[0].register(exclusive)
        await trio.sleep(0.5)
        spans[args["id"]] = (start, trio.current_time())
        return args["id"]

    writer = json_tool(
        "write", body, parameters={"id": {"type": "string", "required": True}, "path": {"type": "string"}},
        output={"type": "string"}, resource_keys=lambda args: {"write": [args["path"]]},
    )  # fmt: skip

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        values = await gather(
            lambda: tools["slow"]({"id": "slow"}),
            lambda: tools["write"]({"id": "first", "path": "a"}),
            lambda: tools["write"]({"id": "second", "path": "a"}),
        )()
        return CodeRunResult(value=[str(value) for value in values], has_value=True)

    runtime, _ = code_runtime(program, sleepy("slow", 5, spans, parallel=True))
    runtime_box.append(runtime)
    disposers.append(runtime.register(writer))
    result = await runtime.execute(run_code())
    assert isinstance(result, ToolExecutionSuccess), result
    slow, first, second = result.value["result"]  # type: ignore[index]
    assert (slow, first) == ("slow", "first")
    assert 'tool "write" was replaced while this call waited to run' in second
    assert "second" not in spans
