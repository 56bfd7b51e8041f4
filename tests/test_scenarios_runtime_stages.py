"""Scenario catalogue S43-S85 (ToolRuntime, continued): behaviours no other test file pins exactly.

Contexts, stage composition order, cancellation racing every stage (each on
trio's virtual clock), wrapper signal fusion, wrapper short-circuits and cached
results, schema snapshots and registration ownership. A listener that "blocks"
waits, shielded, on a ``release`` event the test sets after cancelling the
caller's signal, so the listener itself decides what happens next (as an
uncooperative JavaScript promise would).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from dsh_core import (
    Block,
    CancelSignal,
    Deny,
    DshError,
    FrozenDict,
    NonJsonValueError,
    RegistrationError,
    TextBlock,
    ToolDefinition,
    ToolDispatchExecution,
    ToolErrorInfo,
    ToolExecution,
    ToolExecutionFailure,
    ToolExecutionInput,
    ToolExecutionResult,
    ToolExecutionSuccess,
    ToolExecutionToken,
    ToolFailure,
    ToolOutput,
    ToolRunContext,
    ToolRuntime,
    UserMessage,
    define_tool,
    hookimpl,
)
from dsh_core.testing import make_input, make_runtime

Next = Callable[[], Awaitable[Any]]

ABORTED_BEFORE_DISPATCH = ToolFailure(
    message="tool call aborted before dispatch", info=ToolErrorInfo(name="AbortError", code="ABORTED_BEFORE_DISPATCH")
)
ABORTED = ToolFailure(message="tool call aborted", info=ToolErrorInfo(name="AbortError", code="ABORTED"))


class HarnessError(DshError):
    """A plugin's or tool's own structured error (the original's ``HarnessError``)."""


def ctx(text: str, source: str = "test") -> UserMessage:
    return UserMessage([TextBlock(text)], source=source)


def listener(hook: str, fn: Callable[..., Any], **marks: bool) -> object:
    """A plugin object whose only hookimpl is ``fn`` for ``hook``."""

    class Plugin:
        pass

    plugin = Plugin()
    setattr(plugin, hook, hookimpl(**marks)(fn))
    return plugin


def echo_tool(name: str = "echo", body: Callable[..., Awaitable[Any]] | None = None, **options: Any) -> ToolDefinition:
    """``echo``: ``{text?: string}`` in, the text (default ``""``) out, rendered as one text block."""

    async def echo(args: Any, run: ToolRunContext) -> Any:
        return args.get("text", "")

    return define_tool(
        name=name,
        description="echo arguments back",
        parameters={"text": {"type": "string"}},
        output=ToolOutput(schema={"type": "string"}, render=lambda args, value: [TextBlock(value)]),
        execute=body or echo,
        **options,
    )


def content_tool(name: str, body: Callable[..., Awaitable[Any]]) -> ToolDefinition:
    """The content fixture: output is an array of JSON blocks; the value IS the content list."""
    return define_tool(
        name=name,
        description=f"content fixture {name}",
        parameters={},
        output=ToolOutput(
            schema={"type": "array", "items": {"type": "json"}},
            render=lambda args, value: [TextBlock(block["text"]) for block in value],
        ),
        execute=body,
    )


class Body:
    """A tool body that counts its runs, optionally deferring contexts and waiting on ``release`` first."""

    def __init__(self, value: object = "ok", *, defer: tuple[UserMessage, ...] = (), release: trio.Event | None = None):
        self.runs = 0
        self.value = value
        self.defer = defer
        self.release = release
        self.signals: list[CancelSignal] = []

    async def __call__(self, args: Any, run: ToolRunContext) -> object:
        self.runs += 1
        self.signals.append(run.signal)
        for context in self.defer:
            run.defer_context(context)
        if self.release is not None:
            with trio.CancelScope(shield=True):  # ignores the cancellation until released
                await self.release.wait()
        return self.value


async def cancel_while_blocked(
    runtime: ToolRuntime, name: str, release: trio.Event, arguments: object = None
) -> ToolExecutionResult:
    """Start the call, cancel the caller's signal while a stage is blocked, check it is still pending, release."""
    signal = CancelSignal()
    outcome: list[ToolExecutionResult] = []

    async def call() -> None:
        outcome.append(await runtime.execute(make_input(name, arguments, signal=signal)))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(call)
        await trio.sleep(1)
        signal.cancel("user pressed stop")
        await trio.sleep(1)
        assert outcome == []  # started work is never abandoned: the call waits for the blocked stage
        release.set()
    (result,) = outcome
    return result


# -- S43-S47: finalizers and contexts -------------------------------------------------------------


async def test_finalizer_returning_none_keeps_the_content() -> None:
    """S43: a finalizer returning None leaves the rendered content; it runs exactly once."""
    calls: list[ToolExecutionResult] = []

    def finalize(execution: ToolExecution, result: ToolExecutionResult) -> None:
        calls.append(result)

    runtime = make_runtime(echo_tool("quiet", finalize_content=finalize))
    result = await runtime.execute(make_input("quiet"))
    assert result == ToolExecutionSuccess(value="", content=(TextBlock(""),))
    assert calls == [result]


async def test_block_keeps_its_own_contexts_on_the_failure() -> None:
    """S44: a block with one plugin context → failure with the feedback text and exactly that context."""

    async def post(execution: ToolExecution, result: ToolExecutionResult, next: Next) -> Any:
        await next()
        return Block(feedback=[TextBlock("rejected")], additional_contexts=[ctx("why it was rejected")])

    runtime = make_runtime(echo_tool())
    runtime.plugins.register(listener("dsh_post_execute", post), name="blocker")
    result = await runtime.execute(make_input("echo", {"text": "hi"}))
    assert result == ToolExecutionFailure(
        error=ToolFailure(
            message="rejected", info=ToolErrorInfo(name="PostExecuteBlock", code="DENIED", plugin="blocker")
        ),
        content=(TextBlock("rejected"),),
        additional_contexts=(ctx("why it was rejected"),),
    )


# -- S48-S49: composition order ----------------------------------------------------------------------


async def test_pre_and_post_listeners_compose_around_next_in_stage_order() -> None:
    """S48: pre and post listeners recording before/after next() → pre:before, pre:after, post:before, post:after."""
    order: list[str] = []

    async def pre(execution: ToolExecution, next: Next) -> Any:
        order.append("pre:before")
        decision = await next()
        order.append("pre:after")
        return decision

    async def post(execution: ToolExecution, result: ToolExecutionResult, next: Next) -> Any:
        order.append("post:before")
        decision = await next()
        order.append("post:after")
        return decision

    runtime = make_runtime(echo_tool(), plugins=[listener("dsh_pre_execute", pre), listener("dsh_post_execute", post)])
    result = await runtime.execute(make_input("echo", {"text": "hi"}))
    assert result == ToolExecutionSuccess(value="hi", content=(TextBlock("hi"),))
    assert order == ["pre:before", "pre:after", "post:before", "post:after"]


async def test_execute_wrappers_sit_between_pre_execute_and_post_execute_around_the_body() -> None:
    """S49: order pre, execute:before, dispatch (the body), execute:after, post; the content value is returned."""
    order: list[str] = []

    async def traced(args: Any, run: ToolRunContext) -> Any:
        order.append("dispatch")
        return [{"type": "text", "text": "hi"}]

    async def pre(execution: ToolExecution, next: Next) -> Any:
        order.append("pre")
        return await next()

    async def around(execution: ToolDispatchExecution, next: Next) -> Any:
        order.append("execute:before")
        result = await next()
        order.append("execute:after")
        return result

    async def post(execution: ToolExecution, result: ToolExecutionResult, next: Next) -> Any:
        order.append("post")
        return await next()

    runtime = make_runtime(
        content_tool("traced", traced),
        plugins=[listener("dsh_pre_execute", pre), listener("dsh_execute", around), listener("dsh_post_execute", post)],
    )
    result = await runtime.execute(make_input("traced"))
    assert result == ToolExecutionSuccess(value=({"type": "text", "text": "hi"},), content=(TextBlock("hi"),))
    assert order == ["pre", "execute:before", "dispatch", "execute:after", "post"]


# -- S51-S60: cancellation racing each stage ------------------------------------------------------------


async def test_denial_settling_after_cancel_is_kept(autojump_clock: trio.testing.MockClock) -> None:
    """S51: a gate that denies after the caller cancelled → exactly the denial; the body never runs."""
    release = trio.Event()
    body = Body()

    async def gate(execution: ToolExecution, next: Next) -> Any:
        with trio.CancelScope(shield=True):
            await release.wait()
        return Deny("policy denied the call")

    runtime = make_runtime(echo_tool(body=body))
    runtime.plugins.register(listener("dsh_pre_execute", gate), name="gate")
    result = await cancel_while_blocked(runtime, "echo", release)
    assert result == ToolExecutionFailure(
        error=ToolFailure(message="policy denied the call", info=ToolErrorInfo("PolicyDenial", "DENIED", "gate")),
        content=(TextBlock("Error: policy denied the call"),),
    )
    assert body.runs == 0


async def test_pre_listener_failure_after_cancel_is_kept(autojump_clock: trio.testing.MockClock) -> None:
    """S52: a gate that raises after the caller cancelled → exactly that failure, not an abort; no body."""
    release = trio.Event()
    body = Body()

    async def gate(execution: ToolExecution, next: Next) -> Any:
        with trio.CancelScope(shield=True):
            await release.wait()
        raise RuntimeError("gate interrupted")

    runtime = make_runtime(echo_tool(body=body))
    runtime.plugins.register(listener("dsh_pre_execute", gate), name="gate")
    result = await cancel_while_blocked(runtime, "echo", release)
    assert result == ToolExecutionFailure(
        error=ToolFailure(message="gate interrupted", info=ToolErrorInfo("RuntimeError", "POLICY_ERROR", "gate")),
        content=(TextBlock("Error: gate interrupted"),),
    )
    assert body.runs == 0


async def test_wrapper_delegating_after_cancel_is_aborted_before_dispatch(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """S53: a wrapper installs its own signal, blocks, the caller cancels, then it calls next() → no body."""
    release = trio.Event()
    body = Body()

    async def wrapper(execution: ToolDispatchExecution, next: Next) -> Any:
        saved = execution.signal
        execution.signal = CancelSignal()
        try:
            with trio.CancelScope(shield=True):
                await release.wait()
            return await next()
        finally:
            execution.signal = saved

    runtime = make_runtime(echo_tool(body=body), plugins=[listener("dsh_execute", wrapper)])
    result = await cancel_while_blocked(runtime, "echo", release)
    assert result == ToolExecutionFailure(
        error=ABORTED_BEFORE_DISPATCH, content=(TextBlock("Error: tool call aborted before dispatch"),)
    )
    assert body.runs == 0


async def test_wrapper_supplying_an_already_fired_signal_is_aborted_before_dispatch() -> None:
    """S54: a wrapper that installs an already-fired signal → the exact ABORTED_BEFORE_DISPATCH error; no body."""
    body = Body()

    async def wrapper(execution: ToolDispatchExecution, next: Next) -> Any:
        fired = CancelSignal()
        fired.cancel("wrapper gave up")
        execution.signal = fired
        return await next()

    runtime = make_runtime(echo_tool(body=body), plugins=[listener("dsh_execute", wrapper)])
    result = await runtime.execute(make_input("echo"))
    assert isinstance(result, ToolExecutionFailure)
    assert result.error == ABORTED_BEFORE_DISPATCH
    assert body.runs == 0


async def test_cancel_overtakes_a_wrapper_short_circuit_keeping_its_contexts(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """S55: a wrapper that waits, then answers success itself after the cancel → aborted before dispatch + its contexts."""
    release = trio.Event()
    body = Body()

    async def wrapper(execution: ToolDispatchExecution, next: Next) -> Any:
        with trio.CancelScope(shield=True):
            await release.wait()
        return ToolExecutionSuccess(
            value="wrapper success",
            content=(TextBlock("wrapper success"),),
            additional_contexts=(ctx("from the wrapper", source="wrapper"),),
        )

    runtime = make_runtime(echo_tool(body=body), plugins=[listener("dsh_execute", wrapper)])
    result = await cancel_while_blocked(runtime, "echo", release)
    assert result == ToolExecutionFailure(
        error=ABORTED_BEFORE_DISPATCH,
        content=(TextBlock("Error: tool call aborted before dispatch"),),
        additional_contexts=(ctx("from the wrapper", source="wrapper"),),
    )
    assert body.runs == 0


async def test_late_wrapper_success_after_cancel_is_aborted_with_deferred_contexts(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """S56: the body ran and deferred a context; the wrapper blocks after next(); cancel → ABORTED + that context."""
    release = trio.Event()
    body = Body(defer=(ctx("child", source="child"),))

    async def wrapper(execution: ToolDispatchExecution, next: Next) -> Any:
        result = await next()
        with trio.CancelScope(shield=True):
            await release.wait()
        return result

    runtime = make_runtime(echo_tool(body=body), plugins=[listener("dsh_execute", wrapper)])
    result = await cancel_while_blocked(runtime, "echo", release)
    assert result == ToolExecutionFailure(
        error=ABORTED,
        content=(TextBlock("Error: tool call aborted"),),
        additional_contexts=(ctx("child", source="child"),),
    )
    assert body.runs == 1


async def test_late_post_success_after_cancel_is_aborted_with_deferred_and_post_contexts(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """S57: the post listener blocks after next(), then accepts with its own context → ABORTED with [child, post]."""
    release = trio.Event()
    body = Body(defer=(ctx("child", source="child"),))

    async def post(execution: ToolExecution, result: ToolExecutionResult, next: Next) -> Any:
        decision = await next()
        with trio.CancelScope(shield=True):
            await release.wait()
        return attrs.evolve(decision, additional_contexts=(ctx("post", source="post"), *decision.additional_contexts))

    runtime = make_runtime(echo_tool(body=body), plugins=[listener("dsh_post_execute", post)])
    result = await cancel_while_blocked(runtime, "echo", release)
    assert result == ToolExecutionFailure(
        error=ABORTED,
        content=(TextBlock("Error: tool call aborted"),),
        additional_contexts=(ctx("child", source="child"), ctx("post", source="post")),
    )


async def test_wrapper_failure_after_cancel_keeps_its_code(autojump_clock: trio.testing.MockClock) -> None:
    """S58: a wrapper that raises its own structured error after the cancel → that error, not an abort; no body."""
    release = trio.Event()
    body = Body()

    async def wrapper(execution: ToolDispatchExecution, next: Next) -> Any:
        with trio.CancelScope(shield=True):
            await release.wait()
        raise HarnessError("wrapper failed", code="WRAPPER_FAILURE")

    runtime = make_runtime(echo_tool(body=body))
    runtime.plugins.register(listener("dsh_execute", wrapper), name="wrapper")
    result = await cancel_while_blocked(runtime, "echo", release)
    assert result == ToolExecutionFailure(
        error=ToolFailure(message="wrapper failed", info=ToolErrorInfo("HarnessError", "WRAPPER_FAILURE", "wrapper")),
        content=(TextBlock("Error: wrapper failed"),),
    )
    assert body.runs == 0


async def test_post_listener_failure_after_cancel_keeps_its_code(autojump_clock: trio.testing.MockClock) -> None:
    """S60: a post listener that raises its own structured error after the cancel → that error, not an abort."""
    release = trio.Event()

    async def post(execution: ToolExecution, result: ToolExecutionResult, next: Next) -> Any:
        with trio.CancelScope(shield=True):
            await release.wait()
        raise HarnessError("post-policy failed", code="POST_FAILURE")

    runtime = make_runtime(echo_tool())
    runtime.plugins.register(listener("dsh_post_execute", post), name="post-policy")
    result = await cancel_while_blocked(runtime, "echo", release)
    assert result == ToolExecutionFailure(
        error=ToolFailure(
            message="post-policy failed", info=ToolErrorInfo("HarnessError", "POST_FAILURE", "post-policy")
        ),
        content=(TextBlock("Error: post-policy failed"),),
    )


# -- S61-S62, S70: the caller's signal versus wrapper replacements ------------------------------------------


def signal_swapper(replacements: list[CancelSignal], received: list[CancelSignal]) -> object:
    """A wrapper that installs a fresh signal of its own around next() and restores the previous one."""

    async def wrapper(execution: ToolDispatchExecution, next: Next) -> Any:
        received.append(execution.signal)
        saved = execution.signal
        replacement = CancelSignal()
        replacements.append(replacement)
        execution.signal = replacement
        try:
            return await next()
        finally:
            execution.signal = saved

    return listener("dsh_execute", wrapper)


async def test_caller_cancel_reaches_the_body_through_a_wrapper_replacement(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """S61: the body's signal fuses the caller's with the replacement; a caller cancel fires it, not the replacement."""
    seen: list[CancelSignal] = []

    async def waits_for_abort(args: Any, run: ToolRunContext) -> str:
        seen.append(run.signal)
        with trio.CancelScope(shield=True):  # only the signal itself can wake it
            await run.signal.wait()
        return "late"

    replacements: list[CancelSignal] = []
    runtime = make_runtime(echo_tool(body=waits_for_abort), plugins=[signal_swapper(replacements, [])])
    signal = CancelSignal()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: _cancel_later(signal, 3))
        result = await runtime.execute(make_input("echo", signal=signal))
    assert isinstance(result, ToolExecutionFailure) and result.error == ABORTED
    assert trio.current_time() == pytest.approx(3)
    (body_signal,), (replacement,) = seen, replacements
    assert body_signal is not signal and body_signal is not replacement
    assert body_signal.cancelled
    assert not replacement.cancelled


async def _cancel_later(signal: CancelSignal, seconds: float) -> None:
    await trio.sleep(seconds)
    signal.cancel("user pressed stop")


async def test_post_execute_sees_the_callers_signal_after_a_wrapper_swapped_it() -> None:
    """S62: a wrapper swaps the signal and restores it; post-execute's execution carries the caller's signal.

    (The original reaches post-execute through an unregistered tool; here visibility is checked before
    any policy, so a registered tool carries the call to post-execute.)
    """
    recorded: list[CancelSignal] = []

    async def post(execution: ToolExecution, result: ToolExecutionResult, next: Next) -> Any:
        recorded.append(execution.signal)
        return await next()

    replacements: list[CancelSignal] = []
    runtime = make_runtime(echo_tool(), plugins=[signal_swapper(replacements, []), listener("dsh_post_execute", post)])
    signal = CancelSignal()
    result = await runtime.execute(make_input("echo", {"text": "x"}, signal=signal))
    assert not result.is_error
    assert len(replacements) == 1
    assert len(recorded) == 1 and recorded[0] is signal


async def test_body_gets_a_fused_signal_that_is_neither_the_callers_nor_the_wrappers() -> None:
    """S70: the wrapper receives the caller's signal, replaces it; the body sees a third, fused signal."""
    received: list[CancelSignal] = []
    replacements: list[CancelSignal] = []
    body = Body()
    runtime = make_runtime(echo_tool(body=body), plugins=[signal_swapper(replacements, received)])
    signal = CancelSignal()
    result = await runtime.execute(make_input("echo", signal=signal))
    assert result == ToolExecutionSuccess(value="ok", content=(TextBlock("ok"),))
    assert len(received) == 1 and received[0] is signal
    (body_signal,), (replacement,) = body.signals, replacements
    assert isinstance(body_signal, CancelSignal)
    assert body_signal is not signal and body_signal is not replacement


# -- S63-S65: draining, pre-aborted calls ------------------------------------------------------------------


async def test_uncooperative_started_body_is_drained_and_keeps_its_deferred_context(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """S63: a body that ignores the cancel keeps the call pending until it returns; then ABORTED + its context."""
    release = trio.Event()
    body = Body(defer=(ctx("nested", source="nested"),), release=release)
    runtime = make_runtime(echo_tool(body=body))
    result = await cancel_while_blocked(runtime, "echo", release)
    assert result == ToolExecutionFailure(
        error=ABORTED,
        content=(TextBlock("Error: tool call aborted"),),
        additional_contexts=(ctx("nested", source="nested"),),
    )
    assert body.runs == 1


class CountingInput(ToolExecutionInput):
    """A ``ToolExecutionInput`` whose ``arguments`` count their reads (the original's getter)."""

    def __init__(self, arguments: object, signal: CancelSignal) -> None:
        super().__init__(call_id="call-pre-aborted", name="echo", arguments=None, signal=signal)
        object.__setattr__(self, "_counted", arguments)
        object.__setattr__(self, "reads", 0)

    @property  # type: ignore[override]
    def arguments(self) -> object:
        object.__setattr__(self, "reads", self.reads + 1)
        return self._counted


async def test_pre_aborted_call_runs_no_stage_and_notifies_once_with_frozen_objects() -> None:
    """S64: a pre-aborted call reads its arguments once, runs no listener or body, and observers get frozen objects."""
    phases = {"pre": 0, "around": 0, "body": 0, "post": 0, "result": 0}
    observed: list[tuple[ToolExecution, ToolExecutionResult]] = []

    async def body(args: Any, run: ToolRunContext) -> str:
        phases["body"] += 1
        return "ran"

    async def pre(execution: ToolExecution, next: Next) -> Any:
        phases["pre"] += 1
        return await next()

    async def around(execution: ToolDispatchExecution, next: Next) -> Any:
        phases["around"] += 1
        return await next()

    async def post(execution: ToolExecution, result: ToolExecutionResult, next: Next) -> Any:
        phases["post"] += 1
        return await next()

    def observe(execution: ToolExecution, result: ToolExecutionResult) -> None:
        phases["result"] += 1
        observed.append((execution, result))

    plugins = [
        listener("dsh_pre_execute", pre),
        listener("dsh_execute", around),
        listener("dsh_post_execute", post),
        listener("dsh_result", observe),
    ]
    runtime = make_runtime(echo_tool(body=body), plugins=plugins)
    signal = CancelSignal()
    signal.cancel("already gone")
    arguments = {"nested": {"value": 1}}
    request = CountingInput(arguments, signal)
    result = await runtime.execute(request)  # type: ignore[arg-type]

    assert request.reads == 1
    assert phases == {"pre": 0, "around": 0, "body": 0, "post": 0, "result": 1}
    assert result == ToolExecutionFailure(
        error=ABORTED_BEFORE_DISPATCH, content=(TextBlock("Error: tool call aborted before dispatch"),)
    )
    ((execution, seen),) = observed
    assert seen is result
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        execution.name = "other"  # type: ignore[misc]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        result.content = ()  # type: ignore[misc]
    assert isinstance(execution.token, ToolExecutionToken)
    assert execution.signal is signal
    assert execution.arguments is not arguments
    assert execution.arguments == {"nested": {"value": 1}}
    assert isinstance(execution.arguments, FrozenDict) and isinstance(execution.arguments["nested"], FrozenDict)
    with pytest.raises(TypeError):
        execution.arguments["nested"]["value"] = 2  # type: ignore[index]


async def test_argument_failure_beats_pre_abort_for_an_unregistered_name() -> None:
    """S65: non-JSON arguments of an unknown tool with a pre-aborted signal → the argument failure, one notification."""
    observed: list[tuple[ToolExecution, ToolExecutionResult]] = []

    def observe(execution: ToolExecution, result: ToolExecutionResult) -> None:
        observed.append((execution, result))

    runtime = make_runtime(plugins=[listener("dsh_result", observe)])
    signal = CancelSignal()
    signal.cancel()
    result = await runtime.execute(make_input("missing", {"invalid": lambda: None}, signal=signal))
    assert isinstance(result, ToolExecutionFailure)
    message = result.error.message
    assert message.startswith("tool execution arguments must be losslessly JSON-serializable")
    assert result.content == (TextBlock(f"Error: {message}"),)
    assert result.error.info is not None and result.error.info.code == "INVALID_ARGS"
    assert len(observed) == 1 and observed[0][1] is result


# -- S67, S69, S72, S73: what wrappers and post listeners see and return ------------------------------------


async def test_thrown_tool_error_is_normalised_before_the_wrapper_sees_it() -> None:
    """S67: a body raising a structured error reaches the wrapper as a failure result keeping message and code."""
    seen: list[ToolExecutionResult] = []

    async def kaboom(args: Any, run: ToolRunContext) -> str:
        raise HarnessError("kaboom", code="BOOM")

    async def wrapper(execution: ToolDispatchExecution, next: Next) -> Any:
        result = await next()
        seen.append(result)
        return result

    runtime = make_runtime(echo_tool(body=kaboom), plugins=[listener("dsh_execute", wrapper)])
    result = await runtime.execute(make_input("echo"))
    expected = ToolExecutionFailure(
        error=ToolFailure(message="kaboom", info=ToolErrorInfo(name="HarnessError", code="BOOM")),
        content=(TextBlock("Error: kaboom"),),
    )
    assert seen == [expected]
    assert result == expected


async def test_thrown_tool_still_reaches_post_execute_as_a_failure() -> None:
    """S69: through a pass-through wrapper, post-execute sees the body's exception as an error result."""
    seen: list[bool] = []

    async def explodes(args: Any, run: ToolRunContext) -> str:
        raise RuntimeError("exploded")

    async def wrapper(execution: ToolDispatchExecution, next: Next) -> Any:
        return await next()

    async def post(execution: ToolExecution, result: ToolExecutionResult, next: Next) -> Any:
        seen.append(result.is_error)
        return await next()

    runtime = make_runtime(
        echo_tool(body=explodes), plugins=[listener("dsh_execute", wrapper), listener("dsh_post_execute", post)]
    )
    result = await runtime.execute(make_input("echo"))
    assert seen == [True]
    assert result.content == (TextBlock("Error: exploded"),)


async def test_cached_canonical_result_is_revalidated_for_another_tool() -> None:
    """S72: a wrapper replaying one tool's canonical result for another → checked against that tool's output."""
    object_runs: list[bool] = []
    cache: list[ToolExecutionResult] = []

    async def string_body(args: Any) -> str:
        return "cached"

    async def object_body(args: Any) -> dict[str, bool]:
        object_runs.append(True)
        return {"ok": True}

    async def wrapper(execution: ToolDispatchExecution, next: Next) -> Any:
        if execution.name == "string-output":
            cache.append(await next())
            return cache[0]
        return cache[0]

    runtime = make_runtime(
        define_tool(
            name="string-output", description="", parameters={}, output={"type": "string"}, execute=string_body
        ),
        define_tool(
            name="object-output",
            description="",
            parameters={},
            output={
                "type": "object",
                "additionalProperties": False,
                "properties": {"ok": {"type": "boolean", "required": True}},
            },
            execute=object_body,
        ),
        plugins=[listener("dsh_execute", wrapper)],
    )
    first = await runtime.execute(make_input("string-output"))
    second = await runtime.execute(make_input("object-output"))
    assert first == ToolExecutionSuccess(value="cached", content=(TextBlock("cached"),))
    assert object_runs == []
    assert isinstance(second, ToolExecutionFailure)
    assert second.error.info is not None
    assert (second.error.info.name, second.error.info.code) == ("ToolOutputError", "INVALID_TOOL_OUTPUT")
    assert not hasattr(second, "value")


async def test_wrapper_short_circuit_keeps_its_contexts() -> None:
    """S73: a wrapper answering success itself with one context → the result carries exactly that context."""
    body = Body()

    async def wrapper(execution: ToolDispatchExecution, next: Next) -> Any:
        return ToolExecutionSuccess(
            value="short", content=(TextBlock("authored"),), additional_contexts=(ctx("from around dispatch"),)
        )

    runtime = make_runtime(echo_tool(body=body), plugins=[listener("dsh_execute", wrapper)])
    result = await runtime.execute(make_input("echo"))
    assert result == ToolExecutionSuccess(
        value="short", content=(TextBlock("short"),), additional_contexts=(ctx("from around dispatch"),)
    )
    assert body.runs == 0


# -- S79-S80: schema projection ------------------------------------------------------------------------------


async def _none_body(args: Any, run: Any) -> None:
    return None


def test_deep_raw_parameters_are_projected_whole() -> None:
    """S79: 5 000 nested oneOf layers in raw parameters come back from schemas() with every layer."""
    nested: dict[str, Any] = {"type": "string"}
    for _ in range(5000):
        nested = {"oneOf": [nested, {"type": "null"}]}
    runtime = ToolRuntime()
    runtime.register(
        ToolDefinition(
            name="deep",
            description="deep parameters",
            parameters={"type": "object", "properties": {"nested": nested}},
            output=ToolOutput(schema={}),
            execute=_none_body,
        )
    )
    (schema,) = runtime.schemas()
    node: Any = schema.parameters["properties"]["nested"]
    layers = 0
    while "oneOf" in node:
        assert node["oneOf"][1] == {"type": "null"}
        node = node["oneOf"][0]
        layers += 1
    assert layers == 5000
    assert node == {"type": "string"}


def test_non_lossless_raw_parameters_are_refused() -> None:
    """S80: raw parameters with a NaN default are refused (here when the definition is built, naming the path)."""
    with pytest.raises(NonJsonValueError, match=r"\$\.default"):
        ToolDefinition(
            name="lossy-schema",
            description="",
            parameters={"type": "object", "default": math.nan},
            output=ToolOutput(schema={}),
            execute=_none_body,
        )


def test_non_lossless_raw_parameters_error_names_the_tool() -> None:
    """S80: the refusal of non-lossless raw parameters names the tool, its parameters and the path."""
    with pytest.raises(NonJsonValueError) as raised:
        ToolDefinition(
            name="lossy-schema",
            description="",
            parameters={"type": "object", "default": math.nan},
            output=ToolOutput(schema={}),
            execute=_none_body,
        )
    assert str(raised.value).startswith('tool "lossy-schema" parameters must be lossless JSON: $.default: ')
    assert raised.value.path == "$.default"
    with pytest.raises(TypeError, match=r'^tool "listy" parameters: a schema must be a mapping, got list$'):
        ToolDefinition(
            name="listy", description="", parameters=[], output=ToolOutput(schema={}), execute=_none_body
        )  # type: ignore[arg-type]


# -- S82, S84-S85: registration ownership ---------------------------------------------------------------------


def test_duplicates_refused_and_an_owners_registrations_go_with_it() -> None:
    """S82: a second global echo is refused; an owner's (exit stack's) registration is removed when it closes."""
    runtime = ToolRuntime()
    runtime.register(echo_tool())
    with pytest.raises(RegistrationError, match="already registered"):
        runtime.register(echo_tool())
    with contextlib.ExitStack() as owner:
        owner.enter_context(runtime.register(echo_tool("scoped")))
        assert runtime.names() == ["echo", "scoped"]
    assert runtime.names() == ["echo"]


def test_change_listener_failure_rolls_back_then_a_retry_registers() -> None:
    """S84: a tools-change listener raising once undoes the registration; a retry succeeds and disposes cleanly."""
    raised: list[bool] = []

    def on_change() -> None:
        if not raised:
            raised.append(True)
            raise RuntimeError("boom change listener")

    runtime = ToolRuntime()
    runtime.plugins.register(listener("dsh_tools_change", on_change))
    with pytest.raises(RuntimeError, match="boom change listener"):
        runtime.register(echo_tool())
    assert runtime.get("echo") is None
    assert runtime.schemas() == []
    dispose = runtime.register(echo_tool())
    assert runtime.names() == ["echo"]
    dispose()
    assert runtime.get("echo") is None


async def test_registration_is_undone_at_its_lifo_slot_in_the_owners_teardown() -> None:
    """S85: in an async exit stack, the disposer runs at its own LIFO position among the other teardown steps."""
    runtime = ToolRuntime()
    order: list[str] = []

    async def first_teardown() -> None:
        await trio.sleep(0)
        order.append("first: " + ("still registered" if runtime.get("nested") is not None else "gone"))

    async with contextlib.AsyncExitStack() as owner:
        owner.callback(lambda: order.append("disposed-last: " + ("gone" if runtime.get("nested") is None else "kept")))
        owner.enter_context(runtime.register(echo_tool("nested")))
        order.append("registered")
        owner.push_async_callback(first_teardown)
    assert order == ["registered", "first: still registered", "disposed-last: gone"]
    assert runtime.get("nested") is None
