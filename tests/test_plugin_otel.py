"""The OpenTelemetry plugin: one span per call, the right parent, attributes, and no effect on outcomes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from dsh_core import (
    Agent,
    Ask,
    CancelSignal,
    ConfigError,
    Deny,
    RetryPolicy,
    Rewrite,
    ToolExecution,
    ToolRuntime,
    TraceStep,
    TransientToolError,
    failure_result,
    hookimpl,
    run_tool_calls,
)
from dsh_core.testing import FakeCodeRuntime, json_tool, make_input, make_runtime
from dsh_plugins import otel
from dsh_plugins.otel import MAX_CONTENT_CHARS, PLUGIN_NAME, OtelTracing


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def tracer(exporter: InMemorySpanExporter) -> trace.Tracer:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("test")


def spans(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return list(exporter.get_finished_spans())


def traced(tracer: trace.Tracer, *tools: Any, record_content: bool = False, **options: Any) -> ToolRuntime:
    runtime = make_runtime(*tools, **options)
    runtime.plugins.register(OtelTracing(tracer, record_content=record_content), name=PLUGIN_NAME)
    return runtime


async def test_a_call_gets_one_span_with_the_genai_attributes(
    tracer: trace.Tracer, exporter: InMemorySpanExporter
) -> None:
    runtime = traced(tracer, json_tool("echo"))
    result = await runtime.execute(make_input("echo", {"x": 1}, call_id="c1", agent=Agent("planner")))
    assert not result.is_error
    (span,) = spans(exporter)
    assert span.name == "execute_tool echo"
    assert dict(span.attributes or {}) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "echo",
        "gen_ai.tool.call.id": "c1",
        "gen_ai.tool.type": "function",
        "dsh.root_call_id": "c1",
        "dsh.agent": "planner",
    }
    assert span.status.status_code == StatusCode.UNSET


async def test_a_failure_sets_error_status_code_and_blamed_plugin(
    tracer: trace.Tracer, exporter: InMemorySpanExporter
) -> None:
    class Refuse:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Callable[[], Awaitable[Any]]) -> Any:
            raise RuntimeError("policy bug")

    runtime = traced(tracer, json_tool("echo"))
    runtime.plugins.register(Refuse(), name="refuse")
    result = await runtime.execute(make_input("echo"))
    assert result.code == "POLICY_ERROR"
    (span,) = spans(exporter)
    assert span.status.status_code == StatusCode.ERROR
    assert span.status.description == "POLICY_ERROR"  # the message is content: recorded only when asked
    assert span.attributes is not None
    assert span.attributes["error.type"] == "POLICY_ERROR" and span.attributes["dsh.plugin"] == "refuse"


async def test_a_denied_call_is_traced_as_an_error(tracer: trace.Tracer, exporter: InMemorySpanExporter) -> None:
    class DenyAll:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Callable[[], Awaitable[Any]]) -> Any:
            return Deny("no")

    runtime = traced(tracer, json_tool("echo"))
    runtime.plugins.register(DenyAll())
    await runtime.execute(make_input("echo"))
    (span,) = spans(exporter)
    assert span.attributes is not None and span.attributes["error.type"] == "DENIED"


@pytest.mark.parametrize(
    ("name", "arguments", "code"), [("nope", {}, "UNKNOWN_TOOL"), ("typed", {"n": "x"}, "INVALID_ARGS")]
)
async def test_a_call_that_fails_before_any_policy_still_gets_a_span(
    tracer: trace.Tracer, exporter: InMemorySpanExporter, name: str, arguments: Any, code: str
) -> None:
    runtime = traced(tracer, json_tool("typed", parameters={"n": {"type": "integer", "required": True}}))
    await runtime.execute(make_input(name, arguments))
    (span,) = spans(exporter)
    # A name no tool has is the model's text: span names must stay few.
    assert span.name == ("execute_tool" if code == "UNKNOWN_TOOL" else f"execute_tool {name}")
    assert span.attributes is not None and span.attributes["error.type"] == code
    assert span.attributes["gen_ai.tool.name"] == name


async def test_an_unknown_tools_long_name_is_cut_and_kept_out_of_the_span_name(
    tracer: trace.Tracer, exporter: InMemorySpanExporter
) -> None:
    runtime = traced(tracer, json_tool("echo"))
    await runtime.execute(make_input("n" * 300_000))
    (span,) = spans(exporter)
    assert span.name == "execute_tool"
    assert span.attributes is not None
    name = span.attributes["gen_ai.tool.name"]
    assert isinstance(name, str) and len(name) == otel.MAX_NAME_CHARS and name.endswith("…")


async def test_a_failures_message_is_content_recorded_only_when_asked_and_cut(
    tracer: trace.Tracer, exporter: InMemorySpanExporter
) -> None:
    secret = "token=hunter2 " * 2000

    async def leak(args: Any) -> str:
        raise RuntimeError(secret)

    for record_content in (False, True):
        exporter.clear()
        runtime = traced(tracer, json_tool("leaky", leak), record_content=record_content, trace_decisions=True)
        result = await runtime.execute(make_input("leaky"))
        assert result.code == "TOOL_ERROR" and "hunter2" in result.error.message
        (span,) = spans(exporter)
        outcomes = [str((event.attributes or {})["dsh.outcome"]) for event in span.events]
        description = span.status.description or ""
        if record_content:
            assert "hunter2" in description and len(description) == MAX_CONTENT_CHARS
            assert any("hunter2" in outcome for outcome in outcomes)
            assert all(len(outcome) <= MAX_CONTENT_CHARS for outcome in outcomes)
        else:
            assert description == "TOOL_ERROR"
            assert "fail: TOOL_ERROR" in outcomes
            assert not any("hunter2" in outcome for outcome in outcomes)


@pytest.mark.parametrize(
    ("outcome", "verdict"),
    [
        ("fail: TOOL_ERROR: secret: more", "fail: TOOL_ERROR"),
        ("error: POLICY_ERROR: x", "error: POLICY_ERROR"),
        ("retry in 0.5 s: fail: TOOL_ERROR: busy", "retry in 0.5 s: fail: TOOL_ERROR"),
        ("fail: TOOL_TIMEOUT", "fail: TOOL_TIMEOUT"),
        ("deny: rm -rf /secret", "deny"),
        ("block: the output said x", "block"),
        ("ask", "ask"),
        ("accept(content) +2 contexts", "accept(content) +2 contexts"),
        ("pass", "pass"),
    ],
)
def test_a_steps_verdict_keeps_no_free_text(outcome: str, verdict: str) -> None:
    assert TraceStep(stage="execute", actor="x", outcome=outcome).verdict == verdict


async def test_the_span_is_current_while_the_body_runs(tracer: trace.Tracer, exporter: InMemorySpanExporter) -> None:
    async def body(args: Any) -> str:
        with tracer.start_as_current_span("http GET"):
            return "ok"

    runtime = traced(tracer, json_tool("fetch", body))
    await runtime.execute(make_input("fetch"))
    inner, outer = spans(exporter)
    assert inner.name == "http GET" and outer.name == "execute_tool fetch"
    assert inner.parent is not None and inner.parent.span_id == outer.context.span_id  # type: ignore[union-attr]


async def test_the_callers_current_span_is_the_parent(tracer: trace.Tracer, exporter: InMemorySpanExporter) -> None:
    runtime = traced(tracer, json_tool("echo"))
    with tracer.start_as_current_span("agent turn"):
        await runtime.execute(make_input("echo"))
    call, turn = spans(exporter)
    assert call.parent is not None and call.parent.span_id == turn.context.span_id  # type: ignore[union-attr]


async def test_code_mode_sub_calls_nest_under_their_run_code_span(
    tracer: trace.Tracer, exporter: InMemorySpanExporter
) -> None:
    async def program(tools: Any) -> None:
        await tools["echo"]({"n": 1})
        await tools["echo"]({"n": 2})

    runtime = ToolRuntime(mode="code", code_runtime=FakeCodeRuntime(program))
    runtime.register(json_tool("echo"))
    runtime.plugins.register(OtelTracing(tracer), name=PLUGIN_NAME)
    result = await runtime.execute(make_input("run_code", {"code": "...", "description": "d"}, call_id="outer"))
    assert not result.is_error, result
    finished = spans(exporter)
    assert [span.name for span in finished] == ["execute_tool echo", "execute_tool echo", "execute_tool run_code"]
    outer = finished[-1]
    for sub in finished[:2]:
        assert sub.parent is not None and sub.parent.span_id == outer.context.span_id  # type: ignore[union-attr]
        assert sub.attributes is not None and sub.attributes["dsh.root_call_id"] == "outer"


async def test_a_rewritten_call_has_one_span(tracer: trace.Tracer, exporter: InMemorySpanExporter) -> None:
    class Tidy:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Callable[[], Awaitable[Any]]) -> Any:
            if execution.arguments.get("path") == "a":
                return Rewrite({"path": "b"}, "tidy")
            return await next()

    runtime = traced(tracer, json_tool("read"))
    runtime.plugins.register(Tidy())
    result = await runtime.execute(make_input("read", {"path": "a"}))
    assert result.value == {"path": "b"}
    assert len(spans(exporter)) == 1


async def test_decision_steps_and_retries_become_span_events(
    tracer: trace.Tracer, exporter: InMemorySpanExporter, autojump_clock: Any
) -> None:
    attempts = 0

    async def flaky(args: Any) -> str:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise TransientToolError("busy")
        return "ok"

    tool = json_tool("fetch", flaky, retry=RetryPolicy(jitter=0))
    runtime = traced(tracer, tool, trace_decisions=True)
    await runtime.execute(make_input("fetch"))
    (span,) = spans(exporter)
    events = [(event.name, dict(event.attributes or {})) for event in span.events]
    steps = [(attributes["dsh.stage"], attributes["dsh.actor"], attributes["dsh.outcome"]) for _, attributes in events]
    assert {name for name, _ in events} == {"dsh.decision"}
    assert steps == [
        ("pre", PLUGIN_NAME, "pass"),  # the plugin's own listeners are layers like any other
        ("execute", PLUGIN_NAME, "pass"),
        ("execute", "fetch (attempt 1)", "retry in 0.5 s: fail: TOOL_ERROR"),  # the message is content
        ("execute", "fetch (body)", "ok"),
    ]


async def test_content_is_recorded_only_when_asked_and_cut(
    tracer: trace.Tracer, exporter: InMemorySpanExporter
) -> None:
    runtime = traced(tracer, json_tool("echo"), record_content=True)
    await runtime.execute(make_input("echo", {"text": "x" * (MAX_CONTENT_CHARS * 2)}))
    (span,) = spans(exporter)
    assert span.attributes is not None
    arguments = span.attributes["gen_ai.tool.call.arguments"]
    assert isinstance(arguments, str) and len(arguments) == MAX_CONTENT_CHARS and arguments.endswith("…")
    assert isinstance(span.attributes["gen_ai.tool.call.result"], str)


async def test_a_broken_tracer_changes_no_outcome(caplog: pytest.LogCaptureFixture) -> None:
    class BrokenTracer:
        def start_span(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("exporter down")

    runtime = traced(BrokenTracer(), json_tool("echo"))  # type: ignore[arg-type]
    result = await runtime.execute(make_input("echo", {"a": 1}))
    assert not result.is_error and result.value == {"a": 1}
    assert "otel: cannot start the span" in caplog.text


def test_the_entry_point_registers_only_when_enabled() -> None:
    runtime = ToolRuntime()
    otel.dsh_setup(runtime, {})
    assert runtime.plugins.get_plugin(PLUGIN_NAME) is None
    otel.dsh_setup(runtime, {"enabled": True, "record_content": True})
    plugin = runtime.plugins.get_plugin(PLUGIN_NAME)
    assert isinstance(plugin, OtelTracing) and plugin.record_content


def test_a_dry_run_exports_no_spans() -> None:
    from dsh_core._simulate import SimulationRuntime

    runtime = SimulationRuntime()
    otel.dsh_setup(runtime, {"enabled": True})
    assert runtime.plugins.get_plugin(PLUGIN_NAME) is None


def test_an_unknown_setting_is_a_configuration_error() -> None:
    with pytest.raises(ConfigError, match="record_arguments"):
        otel.dsh_setup(ToolRuntime(), {"enabled": True, "record_arguments": True})


async def test_a_sub_call_from_another_task_still_nests_under_its_parent_call(
    tracer: trace.Tracer, exporter: InMemorySpanExporter
) -> None:
    # The bridge may send a sub-call from a task that did not inherit the parent's context.
    tokens: list[Any] = []
    release = trio.Event()

    class Capture:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Callable[[], Awaitable[Any]]) -> Any:
            tokens.append(execution.token)
            return await next()

    async def wait(args: Any) -> str:
        await release.wait()
        return "done"

    runtime = traced(tracer, json_tool("outer", wait), json_tool("inner"))
    runtime.plugins.register(Capture())
    async with trio.open_nursery() as nursery:
        nursery.start_soon(runtime.execute, make_input("outer", call_id="o"))
        await trio.testing.wait_all_tasks_blocked()
        sub = make_input("inner", call_id="o/1", parent=tokens[0], root_call_id="o")
        await runtime.execute(sub)
        release.set()
    inner, outer = spans(exporter)
    assert inner.parent is not None and inner.parent.span_id == outer.context.span_id  # type: ignore[union-attr]


def test_check_says_when_spans_would_go_nowhere(tracer: trace.Tracer) -> None:
    # No provider set in this process (the tests pass their own tracer): the global one is a proxy.
    assert "no OpenTelemetry tracer provider is set" in OtelTracing().diagnostics()[0]
    assert OtelTracing(tracer).diagnostics() == []


def test_check_says_when_the_provider_or_tracer_is_the_no_op_one(monkeypatch: pytest.MonkeyPatch) -> None:
    assert OtelTracing(trace.NoOpTracer()).diagnostics() == [
        "the tracer given to OtelTracing is a NoOpTracer, so every span is dropped"
    ]
    monkeypatch.setattr(trace, "get_tracer_provider", trace.NoOpTracerProvider)
    (problem,) = OtelTracing().diagnostics()
    assert problem.startswith("the OpenTelemetry tracer provider is the no-op one (NoOpTracerProvider")
    monkeypatch.setattr(trace, "get_tracer_provider", TracerProvider)
    assert OtelTracing().diagnostics() == []


def sleeping(seconds: float) -> Any:
    async def body(args: Any) -> str:
        await trio.sleep(seconds)
        return "done"

    return body


def tracing_of(runtime: ToolRuntime) -> OtelTracing:
    plugin = runtime.plugins.get_plugin(PLUGIN_NAME)
    assert isinstance(plugin, OtelTracing)
    return plugin


CUT_SHORT_STATUS = "cut short by trio.Cancelled from outside the call; it has no result"


async def test_a_call_the_hosts_scope_cuts_short_in_its_body_ends_its_span_as_cancelled(
    tracer: trace.Tracer, exporter: InMemorySpanExporter, autojump_clock: Any
) -> None:
    runtime = traced(tracer, json_tool("send", sleeping(10)))
    for index in range(3):
        with trio.move_on_after(1):  # the host's turn budget, not the call's signal
            await runtime.execute(make_input("send", call_id=f"c{index}"))
    finished = spans(exporter)
    assert [span.attributes["gen_ai.tool.call.id"] for span in finished] == ["c0", "c1", "c2"]  # type: ignore[index]
    for span in finished:
        assert span.status.status_code == StatusCode.ERROR
        assert span.status.description == CUT_SHORT_STATUS
        assert span.attributes is not None
        assert (span.attributes["error.type"], span.attributes["dsh.body_started"]) == ("cancelled", True)
    assert len(tracing_of(runtime)._spans) == 0  # none held open for the runtime's life


async def test_a_call_cut_short_in_a_policy_ends_its_span_before_any_body(
    tracer: trace.Tracer, exporter: InMemorySpanExporter, autojump_clock: Any
) -> None:
    class SlowPolicy:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Callable[[], Awaitable[Any]]) -> Any:
            await trio.sleep(5)  # asks a remote policy service
            return await next()

    runtime = traced(tracer, json_tool("send"))
    runtime.plugins.register(SlowPolicy(), name="slow-policy")
    with trio.move_on_after(1):
        await runtime.execute(make_input("send"))
    (span,) = spans(exporter)
    assert span.status.status_code == StatusCode.ERROR and span.status.description == CUT_SHORT_STATUS
    assert span.attributes is not None
    assert (span.attributes["error.type"], span.attributes["dsh.body_started"]) == ("cancelled", False)
    assert len(tracing_of(runtime)._spans) == 0


async def test_a_call_cut_while_its_approval_waits_ends_its_span_as_cancelled_and_holds_nothing(
    tracer: trace.Tracer, exporter: InMemorySpanExporter, autojump_clock: Any
) -> None:
    class AskFirst:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Callable[[], Awaitable[Any]]) -> Any:
            return Ask("send it?")

    class NoAnswer:
        async def request(self, execution: ToolExecution, reason: str | None) -> str:
            await trio.sleep_forever()
            raise AssertionError("unreachable")

    runtime = traced(tracer, json_tool("send"), approval=NoAnswer())
    runtime.plugins.register(AskFirst(), name="ask")
    with trio.move_on_after(1):  # cut while the approval prompt waits
        await runtime.execute(make_input("send", agent=Agent("main")))
    (span,) = spans(exporter)
    assert span.status.status_code == StatusCode.ERROR and span.status.description == CUT_SHORT_STATUS
    assert span.attributes is not None
    assert (span.attributes["error.type"], span.attributes["dsh.body_started"]) == ("cancelled", False)
    assert len(tracing_of(runtime)._spans) == 0


async def test_a_call_cut_in_post_execute_ends_its_span_once(
    tracer: trace.Tracer, exporter: InMemorySpanExporter, autojump_clock: Any
) -> None:
    class SlowPost:
        @hookimpl
        async def dsh_post_execute(self, execution: ToolExecution, result: Any, next: Callable[[], Awaitable[Any]]) -> Any:
            await trio.sleep(5)  # reports the result to a slow service
            return await next()

    runtime = traced(tracer, json_tool("send"))
    runtime.plugins.register(SlowPost(), name="slow-post")
    with trio.move_on_after(1):
        await runtime.execute(make_input("send"))
    (span,) = spans(exporter)
    assert span.status.description == CUT_SHORT_STATUS and span.attributes is not None
    assert (span.attributes["error.type"], span.attributes["dsh.body_started"]) == ("cancelled", True)
    assert len(tracing_of(runtime)._spans) == 0


async def test_a_call_waiting_to_be_committed_in_a_cut_turn_ends_its_span(
    tracer: trace.Tracer, exporter: InMemorySpanExporter, autojump_clock: Any
) -> None:
    safe = {"is_concurrency_safe": lambda args: True}
    runtime = traced(tracer, json_tool("slow", sleeping(10), **safe), json_tool("quick", sleeping(0.5), **safe))
    with trio.move_on_after(1):
        await run_tool_calls(runtime, [make_input("slow", call_id="slow"), make_input("quick", call_id="quick")])
    ended = {span.attributes["gen_ai.tool.call.id"]: span.attributes["error.type"] for span in spans(exporter)}  # type: ignore[index]
    assert ended == {"slow": "cancelled", "quick": "cancelled"}
    assert len(tracing_of(runtime)._spans) == 0


async def test_a_call_cut_while_its_own_signal_fires_too_ends_its_span_once(
    tracer: trace.Tracer, exporter: InMemorySpanExporter, autojump_clock: Any
) -> None:
    runtime = traced(tracer, json_tool("send", sleeping(10)))
    signal = CancelSignal()
    with trio.CancelScope() as turn:

        async def cut_both() -> None:
            await trio.sleep(1)
            signal.cancel()
            turn.cancel()  # trio hands the Cancelled to the host's scope: no ABORTED result comes

        async with trio.open_nursery() as nursery:
            nursery.start_soon(cut_both)
            await runtime.execute(make_input("send", signal=signal))
    (span,) = spans(exporter)
    assert span.attributes is not None and span.attributes["error.type"] == "cancelled"


async def test_the_calls_own_signal_ends_its_span_once_as_aborted(
    tracer: trace.Tracer, exporter: InMemorySpanExporter, autojump_clock: Any
) -> None:
    runtime = traced(tracer, json_tool("send", sleeping(10)))
    signal = CancelSignal()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(runtime.execute, make_input("send", signal=signal))
        await trio.sleep(1)
        signal.cancel()
    (span,) = spans(exporter)
    assert span.attributes is not None and span.attributes["error.type"] == "ABORTED"
    assert "dsh.body_started" not in span.attributes


async def test_a_cancellation_an_outer_wrapper_turns_into_a_result_still_gives_one_span(
    tracer: trace.Tracer, exporter: InMemorySpanExporter, autojump_clock: Any
) -> None:
    runtime = traced(tracer, json_tool("send", sleeping(10)))

    class OwnDeadline:  # outside the plugin's wrapper, with a trio scope of its own instead of a signal
        @hookimpl(tryfirst=True)
        async def dsh_execute(self, execution: Any, next: Callable[[], Awaitable[Any]]) -> Any:
            with trio.move_on_after(1):
                return await next()
            return failure_result("too slow", "TOOL_TIMEOUT")

    runtime.plugins.register(OwnDeadline(), name="own-deadline")
    result = await runtime.execute(make_input("send"))
    assert result.is_error
    (span,) = spans(exporter)
    # The call has a result after all: its span records it, as for any other call.
    assert span.attributes is not None and span.attributes["error.type"] == "TOOL_TIMEOUT"
    assert span.status.description == "TOOL_TIMEOUT"


async def test_a_span_that_cannot_end_does_not_stop_the_cancellation(
    caplog: pytest.LogCaptureFixture, autojump_clock: Any
) -> None:
    ended: list[str] = []

    class BrokenSpan:
        def set_attribute(self, key: str, value: Any) -> None:
            raise RuntimeError("exporter down")

        def end(self) -> None:
            ended.append("end")

    class BrokenTracer:
        def start_span(self, *args: Any, **kwargs: Any) -> Any:
            return BrokenSpan()

    runtime = traced(BrokenTracer(), json_tool("send", sleeping(10)))  # type: ignore[arg-type]
    with trio.move_on_after(1) as turn:
        await runtime.execute(make_input("send", call_id="c1"))
    assert turn.cancelled_caught  # the host's Cancelled reached its scope, not an error in its place
    assert ended == ["end"]
    assert "otel: cannot end the span of call c1 cut short: exporter down" in caplog.text


class SandboxShadow:
    @hookimpl
    async def dsh_pre_execute(self, execution: ToolExecution, next: Callable[[], Awaitable[Any]]) -> Any:
        if execution.arguments.get("path") == "/etc/shadow":
            return Rewrite({"path": "/tmp/safe"}, "sandboxed")
        return await next()


@pytest.mark.parametrize("record_content", [True, False])
async def test_a_rewritten_calls_span_shows_what_ran_and_each_rewrite(
    tracer: trace.Tracer, exporter: InMemorySpanExporter, record_content: bool
) -> None:
    runtime = traced(tracer, json_tool("read"), record_content=record_content, plugins={"sandbox": SandboxShadow()})
    result = await runtime.execute(make_input("read", {"path": "/etc/shadow"}))
    assert result.value == {"path": "/tmp/safe"}
    (span,) = spans(exporter)
    attributes = dict(span.attributes or {})
    rewrites = [(event.name, dict(event.attributes or {})) for event in span.events]
    if record_content:
        assert attributes["gen_ai.tool.call.arguments"] == '{"path": "/tmp/safe"}'
        assert rewrites == [
            (
                "dsh.rewrite",
                {"dsh.rewrite.by": "sandbox", "dsh.rewrite.reason": "sandboxed", "dsh.rewrite.from": '{"path": "/etc/shadow"}'},
            )
        ]
    else:  # the model's arguments stay off the span, and the reason, free text that may quote them
        assert "gen_ai.tool.call.arguments" not in attributes
        assert rewrites == [("dsh.rewrite", {"dsh.rewrite.by": "sandbox"})]
