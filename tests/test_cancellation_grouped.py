"""A failure raised together with a cancellation (grouped by a task group) is a result, never an escape.

A body or listener that runs a trio nursery can fail in cleanup while the
call's signal unwinds it: trio then raises one group holding the scope's
``Cancelled`` and the cleanup's error. The ``Cancelled`` belongs to the call's
own cancel scope; the error is the call's failure. Before the fix the whole
group was re-raised as "fatal", the scope took its ``Cancelled`` out, and the
rest escaped ``execute()`` (and took a whole ``run_tool_calls`` turn down).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
import trio.testing

from dsh_core import (
    Agent,
    Ask,
    CancelSignal,
    ToolExecution,
    ToolExecutionFailure,
    ToolExecutionInput,
    ToolExecutionResult,
    ToolRuntime,
    define_tool,
    hookimpl,
    run_tool_calls,
)
from dsh_core.testing import Recorder, make_input, make_runtime

Next = Callable[[], Awaitable[Any]]


def failure_of(result: ToolExecutionResult) -> tuple[str | None, str | None, str]:
    assert isinstance(result, ToolExecutionFailure), result
    info = result.error.info
    assert info is not None
    return info.code, info.plugin, result.error.message


async def _fails_in_cleanup() -> None:
    try:
        await trio.sleep(100)
    finally:
        raise RuntimeError("cleanup failed")  # closing a connection that is already gone, say


async def task_group_failing_on_cancel() -> None:
    """Two tasks (a worker and its helper): the worker's cleanup fails when they are cancelled."""
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_fails_in_cleanup)
        nursery.start_soon(trio.sleep, 100)


async def body_with_task_group(args: Any) -> dict[str, Any]:
    await task_group_failing_on_cancel()
    return {"ok": True}


def group_tool(**extra: Any) -> Any:
    return define_tool(
        name="work", description="d", parameters={}, output={"type": "json"}, execute=body_with_task_group, **extra
    )


def plain_tool() -> Any:
    return define_tool(
        name="work", description="d", parameters={}, output={"type": "json"}, execute=lambda a: {"ok": 1}
    )


async def cancel_at(signal: CancelSignal, seconds: float) -> None:
    await trio.sleep(seconds)
    signal.cancel("user pressed stop")


async def execute_cancelled_at(runtime: ToolRuntime, seconds: float, *, agent: Agent | None = None) -> Any:
    signal = CancelSignal()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancel_at, signal, seconds)
        return await runtime.execute(make_input("work", {}, signal=signal, agent=agent))


async def test_body_task_group_failing_on_cancel_is_the_calls_tool_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    recorder = Recorder()
    runtime = make_runtime(group_tool(), plugins=[recorder])
    result = await execute_cancelled_at(runtime, 1)
    assert failure_of(result) == ("TOOL_ERROR", None, "cleanup failed")
    # The failure took the ordinary road: post-execute saw it, the observer got exactly it.
    assert recorder.hooks == ["dsh_pre_execute", "dsh_execute", "dsh_post_execute", "dsh_result"]
    assert [r for _, r in recorder.results] == [result]


class TaskGroupListener:
    """A listener of one waterfall whose task group fails in cleanup when the call is cancelled."""

    def __init__(self, hook: str) -> None:
        self.hook = hook

    @hookimpl(optionalhook=True)
    async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
        if self.hook == "pre":
            await task_group_failing_on_cancel()
        return await next()

    @hookimpl(optionalhook=True)
    async def dsh_execute(self, execution: Any, next: Next) -> Any:
        if self.hook == "execute":
            await task_group_failing_on_cancel()
        return await next()

    @hookimpl(optionalhook=True)
    async def dsh_post_execute(self, execution: ToolExecution, result: Any, next: Next) -> Any:
        if self.hook == "post":
            await task_group_failing_on_cancel()
        return await next()


@pytest.mark.parametrize("hook", ["pre", "execute", "post"])
async def test_listener_task_group_failing_on_cancel_is_its_policy_error(
    hook: str, autojump_clock: trio.testing.MockClock
) -> None:
    runtime = make_runtime(plain_tool(), plugins={"grouped": TaskGroupListener(hook)})
    result = await execute_cancelled_at(runtime, 1)
    assert failure_of(result) == ("POLICY_ERROR", "grouped", "cleanup failed")


async def test_approval_task_group_failing_on_cancel_is_an_approval_policy_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    class AskFirst:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
            await trio.sleep(0)  # a listener that suspends: the stages run in the call's scope
            return Ask("confirm")

    class GroupedApproval:
        async def request(self, execution: ToolExecution, reason: str | None) -> str:
            await task_group_failing_on_cancel()
            return "allowed-once"

    runtime = make_runtime(plain_tool(), plugins={"ask": AskFirst()})
    runtime.approval = GroupedApproval()
    result = await execute_cancelled_at(runtime, 1, agent=Agent(id="a"))
    assert failure_of(result) == ("POLICY_ERROR", "approval", "cleanup failed")


async def test_one_grouped_failure_does_not_take_the_turn_down(autojump_clock: trio.testing.MockClock) -> None:
    async def body(args: Any) -> dict[str, Any]:
        if args["grouped"]:
            await task_group_failing_on_cancel()
        else:
            await trio.sleep(2)
        return {"ok": True}

    tool = define_tool(
        name="work",
        description="d",
        parameters={"grouped": {"type": "boolean", "required": True}},
        output={"type": "json"},
        execute=body,
        is_concurrency_safe=lambda a: True,
    )
    runtime = make_runtime(tool)
    stop = CancelSignal()
    calls = [
        ToolExecutionInput(call_id="a", name="work", arguments={"grouped": False}, signal=CancelSignal()),
        ToolExecutionInput(call_id="b", name="work", arguments={"grouped": True}, signal=stop),
    ]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancel_at, stop, 1)
        results = await run_tool_calls(runtime, calls)
    assert not results[0].is_error
    assert failure_of(results[1]) == ("TOOL_ERROR", None, "cleanup failed")


async def test_the_callers_own_scope_still_cancels_the_call(autojump_clock: trio.testing.MockClock) -> None:
    # The Cancelled is the caller's scope's, not the call's: it propagates, and only it.
    runtime = make_runtime(group_tool())
    reached = False
    with trio.move_on_after(1) as scope:
        await runtime.execute(make_input("work", {}))
        reached = True
    assert scope.cancelled_caught
    assert not reached


async def test_an_interrupt_grouped_with_a_failure_still_propagates() -> None:
    async def body(args: Any) -> None:
        raise BaseExceptionGroup("both", [KeyboardInterrupt(), RuntimeError("boom")])

    tool = define_tool(name="work", description="d", parameters={}, output={"type": "json"}, execute=body)
    runtime = make_runtime(tool)
    with pytest.raises(KeyboardInterrupt) as caught:
        await runtime.execute(make_input("work", {}))
    # Bare, as trio lets a lone interrupt out of trio.run: the failure part stayed with the call.
    assert type(caught.value) is KeyboardInterrupt
