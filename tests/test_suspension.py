"""Which callables can suspend, and the pipeline entering a cancel scope only where something can."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
import trio.testing

from dsh_core import (
    Agent,
    Allow,
    Ask,
    CancelSignal,
    ToolExecution,
    ToolExecutionFailure,
    ToolExecutionResult,
    ToolRunContext,
    define_tool,
    hookimpl,
    run_tool_calls,
)
from dsh_core._suspension import ANALYSIS_ENABLED, can_suspend, suspends_beyond_next
from dsh_core.testing import make_input, make_runtime

Next = Callable[[], Awaitable[Any]]


# -- the bytecode reading ------------------------------------------------------------------


async def returns_at_once(args: Any) -> Any:
    return args


async def awaits_something(args: Any) -> Any:
    return await args()


async def async_with(args: Any) -> Any:
    async with args:
        return None


async def async_for(args: Any) -> Any:
    async for item in args:
        return item
    return None


async def async_comprehension(args: Any) -> Any:
    return [item async for item in args]


async def only_next(execution: Any, next: Next) -> Any:
    if execution is None:
        return Allow()
    return await next()


async def next_twice(execution: Any, next: Next) -> Any:
    await next()
    return await next()


async def next_then_sleep(execution: Any, next: Next) -> Any:
    outcome = await next()
    await trio.sleep(0)
    return outcome


async def next_called_early(execution: Any, next: Next) -> Any:
    pending = next()
    return await pending


async def next_rebound(execution: Any, next: Next) -> Any:
    next = execution
    return await next()


async def next_with_argument(execution: Any, next: Any) -> Any:
    return await next(execution)


async def next_in_finally(execution: Any, next: Next) -> Any:
    try:
        return await next()
    finally:
        await trio.lowlevel.checkpoint()


def plain_sync(args: Any) -> Any:
    return args


# Everyday policy listeners: each suspends only through next().
async def denies_some(execution: Any, next: Next) -> Any:
    if execution.name in {"rm", "format"}:
        return Allow()
    return await next()


async def inspects_the_outcome(execution: Any, next: Next) -> Any:
    name = execution.name
    outcome = await next()
    if outcome is None or name is None:
        return outcome
    return outcome


async def post_listener(execution: Any, result: Any, next: Next) -> Any:
    decision = await next()
    seen = [execution, result, decision]
    return decision if seen else None


async def next_in_try(execution: Any, next: Next) -> Any:
    try:
        return await next()
    finally:
        execution.clear()


async def next_in_expression(execution: Any, next: Next) -> Any:
    outcome = await next() if execution else None
    return outcome


class Plugin:
    async def only_next(self, execution: Any, next: Next) -> Any:
        return await next()

    async def observer(self, execution: Any, result: Any) -> None:
        return None

    async def __call__(self, args: Any) -> Any:
        return args


def test_the_reading_is_enabled_on_this_interpreter() -> None:
    # The suite runs on every supported CPython: the self-check must pass on each,
    # or the fast paths below would be silently off.
    assert ANALYSIS_ENABLED


@pytest.mark.parametrize(
    ("fn", "expected"),
    [
        (returns_at_once, False),
        (Plugin().observer, False),
        (awaits_something, True),
        (async_with, True),
        (async_for, True),
        (async_comprehension, True),
        (only_next, True),  # an await of anything, next() included, can suspend
        (plain_sync, True),  # a plain def may return an awaitable
        (functools.partial(returns_at_once), True),
        (Plugin(), True),  # an object with an async __call__ is not read
        (lambda args: args, True),
    ],
)
def test_can_suspend(fn: Any, expected: bool) -> None:
    assert can_suspend(fn) is expected


@pytest.mark.parametrize(
    ("fn", "expected"),
    [
        (only_next, False),
        (Plugin().only_next, False),
        (denies_some, False),
        (inspects_the_outcome, False),
        (post_listener, False),
        (next_in_try, False),
        (next_in_expression, False),
        (returns_at_once, False),  # no await at all
        (next_twice, False),  # a second call fails the call; it never suspends on its own
        (next_then_sleep, True),
        (next_called_early, True),
        (next_rebound, True),
        (next_with_argument, True),
        (next_in_finally, True),
        (awaits_something, True),  # no parameter named next
        (async_with, True),
        (plain_sync, True),
    ],
)
def test_suspends_beyond_next(fn: Any, expected: bool) -> None:
    assert suspends_beyond_next(fn) is expected


# -- the pipeline enters a scope only where something can suspend ---------------------------


class LinkCounter:
    """Counts the cancel scopes the pipeline links to signals (every scope it enters is linked)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.links = 0
        original = CancelSignal.link

        def counting(signal: CancelSignal, scope: trio.CancelScope) -> Callable[[], None]:
            self.links += 1
            return original(signal, scope)

        monkeypatch.setattr(CancelSignal, "link", counting)


@pytest.fixture
def links(monkeypatch: pytest.MonkeyPatch) -> LinkCounter:
    return LinkCounter(monkeypatch)


def add_tool(body: Callable[..., Any]) -> Any:
    return define_tool(
        name="add",
        description="Add.",
        parameters={"a": {"type": "integer", "required": True}, "b": {"type": "integer", "required": True}},
        output={"type": "integer"},
        execute=body,
    )


async def add_now(args: Any) -> int:
    return int(args["a"] + args["b"])


async def add_later(args: Any) -> int:
    await trio.lowlevel.checkpoint()
    return int(args["a"] + args["b"])


class PassThrough:
    @hookimpl
    async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
        return await next()

    @hookimpl
    async def dsh_execute(self, execution: Any, next: Next) -> Any:
        return await next()

    @hookimpl
    async def dsh_post_execute(self, execution: ToolExecution, result: ToolExecutionResult, next: Next) -> Any:
        return await next()

    @hookimpl
    async def dsh_result(self, execution: ToolExecution, result: ToolExecutionResult) -> None:
        return None


class SleepyPre:
    @hookimpl
    async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
        await trio.lowlevel.checkpoint()
        return await next()


def test_define_tool_marks_an_async_body_that_awaits_nothing_inline() -> None:
    assert add_tool(add_now).inline
    assert not add_tool(add_later).inline


async def test_a_call_in_which_nothing_can_suspend_enters_no_scope(links: LinkCounter) -> None:
    runtime = make_runtime(add_tool(add_now), plugins=[PassThrough(), PassThrough()])
    result = await runtime.execute(make_input("add", {"a": 1, "b": 2}))
    assert result.value == 3
    assert links.links == 0


@pytest.mark.parametrize(
    ("body", "plugins"),
    [(add_later, []), (add_now, [SleepyPre()]), (add_later, [PassThrough()])],
    ids=["suspending body", "suspending listener", "both"],
)
async def test_a_call_in_which_something_can_suspend_enters_one_scope(
    links: LinkCounter, body: Any, plugins: list[object]
) -> None:
    runtime = make_runtime(add_tool(body), plugins=plugins)
    result = await runtime.execute(make_input("add", {"a": 1, "b": 2}))
    assert result.value == 3
    assert links.links == 1


async def test_an_unscoped_call_still_sees_its_signal_fire_during_the_body() -> None:
    signal = CancelSignal()

    def body(args: Any, run: ToolRunContext) -> int:
        signal.cancel("stop")  # nothing can suspend, but the signal is still looked at after the body
        return 3

    runtime = make_runtime(add_tool(body), plugins=[PassThrough()])
    result = await runtime.execute(make_input("add", {"a": 1, "b": 2}, signal=signal))
    assert isinstance(result, ToolExecutionFailure)
    assert result.code == "ABORTED"


async def test_an_unscoped_calls_approval_prompt_is_cancelled_by_its_signal(links: LinkCounter) -> None:
    class AskFirst:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
            return Ask("sure?")

    class Forever:
        async def request(self, execution: ToolExecution, reason: str | None) -> str:
            await trio.sleep_forever()
            raise AssertionError("unreachable")

    signal = CancelSignal()
    runtime = make_runtime(add_tool(add_now), plugins=[AskFirst()], approval=Forever())
    outcome: list[ToolExecutionResult] = []

    async def call() -> None:
        request = make_input("add", {"a": 1, "b": 2}, signal=signal, agent=Agent("a"))
        outcome.append(await runtime.execute(request))

    # fail_after: were the prompt not interruptible, the test would fail instead of hanging.
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(call)
            await trio.testing.wait_all_tasks_blocked()
            signal.cancel("user pressed stop")
    assert isinstance(outcome[0], ToolExecutionFailure)
    assert outcome[0].code == "ABORTED_BEFORE_DISPATCH"
    assert links.links == 1  # the prompt's own scope, and only it


async def test_a_tool_replaced_after_resolution_by_a_suspending_one_is_still_interruptible() -> None:
    async def forever(args: Any) -> int:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    replacement = add_tool(forever)
    runtime = make_runtime(add_tool(add_now))
    swapped: list[bool] = []

    def swap(execution: ToolExecution) -> None:
        if not swapped:
            swapped.append(True)
            runtime._registry._global.tools.clear()
            runtime.register(replacement)
        return None

    runtime.guard(swap)
    signal = CancelSignal()
    outcome: list[ToolExecutionResult] = []

    async def call() -> None:
        outcome.append(await runtime.execute(make_input("add", {"a": 1, "b": 2}, signal=signal)))

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(call)
            await trio.testing.wait_all_tasks_blocked()
            signal.cancel()
    assert isinstance(outcome[0], ToolExecutionFailure)
    assert outcome[0].code == "ABORTED"


async def test_a_suspending_observer_is_cancelled_with_the_call_a_quiet_one_is_not_scoped(
    links: LinkCounter,
) -> None:
    seen: list[str] = []

    class Quiet:
        @hookimpl
        async def dsh_result(self, execution: ToolExecution, result: ToolExecutionResult) -> None:
            seen.append("quiet")

    class Slow:
        @hookimpl
        async def dsh_result(self, execution: ToolExecution, result: ToolExecutionResult) -> None:
            await trio.lowlevel.checkpoint()
            seen.append("slow")

    runtime = make_runtime(add_tool(add_now), plugins=[Quiet(), Slow()])
    await runtime.execute(make_input("add", {"a": 1, "b": 2}))
    assert sorted(seen) == ["quiet", "slow"]
    assert links.links == 1  # the slow observer's scope


async def test_the_scheduler_scopes_only_the_stages_that_can_suspend(links: LinkCounter) -> None:
    tool = define_tool(
        name="add",
        description="Add.",
        parameters={"a": {"type": "integer", "required": True}, "b": {"type": "integer", "required": True}},
        output={"type": "integer"},
        execute=add_now,
        is_concurrency_safe=lambda args: True,
    )
    runtime = make_runtime(tool, plugins=[PassThrough()])
    results = await run_tool_calls(runtime, [make_input("add", {"a": n, "b": 1}) for n in range(5)])
    assert [result.value for result in results] == [1, 2, 3, 4, 5]
    assert links.links == 0


async def test_with_the_reading_switched_off_every_async_callable_may_suspend(
    monkeypatch: pytest.MonkeyPatch, links: LinkCounter
) -> None:
    # What an interpreter whose bytecode fails the import-time self-check gets: correct, just scoped.
    from dsh_core import _suspension

    monkeypatch.setattr(_suspension, "ANALYSIS_ENABLED", False)
    assert can_suspend(returns_at_once) and suspends_beyond_next(only_next)
    runtime = make_runtime(add_tool(add_now), plugins=[PassThrough()])
    assert not runtime.get("add").inline
    result = await runtime.execute(make_input("add", {"a": 1, "b": 2}))
    assert result.value == 3
    assert links.links == 2  # the call's scope and the async observer's
