"""dsh_call_unwound: every call that leaves the pipeline without a published result is told so, once."""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from typing import Any

import pluggy
import pytest
import trio
import trio.testing

from dsh_core import (
    Agent,
    Ask,
    CancelSignal,
    SimulationRuntime,
    ToolExecution,
    ToolExecutionResult,
    ToolRuntime,
    hookimpl,
    run_tool_calls,
)
from dsh_core.code_mode import SubprocessPythonRuntime
from dsh_core.testing import FakeCodeRuntime, Recorder, json_tool, make_input, make_runtime

Next = Callable[[], Awaitable[Any]]


def kind(cause: BaseException) -> str:
    """What unwound a call: the exceptions in ``cause`` (a task group's holds them grouped)."""
    if isinstance(cause, BaseExceptionGroup):
        return "|".join(sorted({kind(inner) for inner in cause.exceptions}))
    return type(cause).__name__


class Unwound:
    """Records every notice as (call id, what unwound it, whether the body started)."""

    def __init__(self) -> None:
        self.notices: list[tuple[str, str, bool]] = []
        self.executions: list[ToolExecution] = []
        self.causes: list[BaseException] = []

    @hookimpl
    def dsh_call_unwound(self, execution: ToolExecution, cause: BaseException, body_started: bool) -> None:
        self.notices.append((execution.call_id, kind(cause), body_started))
        self.executions.append(execution)
        self.causes.append(cause)


def sleeping(name: str, seconds: float, **options: Any) -> Any:
    async def body(args: Any) -> str:
        await trio.sleep(seconds)
        return "done"

    return json_tool(name, body, **options)


class SlowPost:
    @hookimpl
    async def dsh_post_execute(self, execution: ToolExecution, result: Any, next: Next) -> Any:
        await trio.sleep(5)  # reports the result to a slow service
        return await next()


class SlowPolicy:
    @hookimpl
    async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
        if execution.call_id == "deciding":
            await trio.sleep(1)  # asks a remote policy service
        return await next()


class NoAnswer:
    async def request(self, execution: ToolExecution, reason: str | None) -> str:
        await trio.sleep_forever()
        raise AssertionError("unreachable")


class AskFirst:
    @hookimpl
    async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
        return Ask("send it?")


async def test_a_call_the_hosts_scope_cuts_in_its_body_is_told_once(autojump_clock: trio.testing.MockClock) -> None:
    unwound, recorder = Unwound(), Recorder()
    runtime = make_runtime(sleeping("send", 10), plugins=[unwound, recorder])
    with trio.move_on_after(1) as turn:  # the host's turn budget, not the call's signal
        await runtime.execute(make_input("send", {"to": "ceo"}, call_id="c1"))
    assert turn.cancelled_caught
    assert unwound.notices == [("c1", "Cancelled", True)]
    assert unwound.executions[0].arguments == {"to": "ceo"}
    assert recorder.hooks == ["dsh_pre_execute", "dsh_execute", "dsh_call_unwound"]  # and no dsh_result


async def test_a_call_cut_while_its_approval_waits_is_told_the_body_never_started(
    autojump_clock: trio.testing.MockClock,
) -> None:
    unwound = Unwound()
    runtime = make_runtime(json_tool("send"), plugins=[unwound, AskFirst()], approval=NoAnswer())
    with trio.move_on_after(1) as turn:
        await runtime.execute(make_input("send", call_id="c1", agent=Agent("main")))
    assert turn.cancelled_caught
    assert unwound.notices == [("c1", "Cancelled", False)]


async def test_a_call_cut_in_post_execute_is_told_once_with_its_body_started(
    autojump_clock: trio.testing.MockClock,
) -> None:
    unwound = Unwound()
    runtime = make_runtime(json_tool("send"), plugins=[unwound, SlowPost()])
    with trio.move_on_after(1):
        await runtime.execute(make_input("send", call_id="c1"))
    assert unwound.notices == [("c1", "Cancelled", True)]


async def test_the_host_cutting_a_call_whose_own_signal_fired_is_told_too(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Both at once: trio hands the Cancelled to the outermost scope, the host's, and no ABORTED result comes.
    unwound = Unwound()
    runtime = make_runtime(sleeping("send", 10), plugins=[unwound])
    signal = CancelSignal()
    with trio.CancelScope() as turn:

        async def cut_both() -> None:
            await trio.sleep(1)
            signal.cancel()
            turn.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(cut_both)
            await runtime.execute(make_input("send", call_id="c1", signal=signal))
    assert unwound.notices == [("c1", "Cancelled", True)]


async def test_a_normal_call_and_a_call_its_own_signal_aborts_are_not_told(
    autojump_clock: trio.testing.MockClock,
) -> None:
    unwound, recorder = Unwound(), Recorder()
    runtime = make_runtime(sleeping("send", 10), json_tool("echo"), plugins=[unwound, recorder, SlowPost()])
    assert not (await runtime.execute(make_input("echo", call_id="ok"))).is_error
    signal = CancelSignal()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(runtime.execute, make_input("send", call_id="aborted", signal=signal))
        await trio.sleep(1)
        signal.cancel()
    assert unwound.notices == []
    (_, aborted) = recorder.results
    assert aborted[1].is_error and aborted[1].error.info is not None and aborted[1].error.info.code == "ABORTED"


async def test_a_raising_notice_listener_is_contained_and_the_cancellation_goes_on(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    class Broken:
        @hookimpl
        def dsh_call_unwound(self, execution: ToolExecution) -> None:
            raise RuntimeError("disk gone")

    before, after = Unwound(), Unwound()
    runtime = ToolRuntime()
    runtime.register(sleeping("send", 10))
    runtime.plugins.register(before, name="before")
    runtime.plugins.register(Broken(), name="broken")
    runtime.plugins.register(after, name="after")
    with trio.move_on_after(1) as turn:
        await runtime.execute(make_input("send", call_id="c1"))
    assert turn.cancelled_caught  # the host's Cancelled reached its scope, not the listener's error
    assert before.notices == after.notices == [("c1", "Cancelled", True)]
    assert 'tool "send" (c1): dsh_call_unwound listener broken failed: disk gone' in caplog.text


async def test_a_keyboard_interrupt_out_of_a_body_is_told_and_still_propagates() -> None:
    async def body(args: Any) -> str:
        raise KeyboardInterrupt

    unwound, recorder = Unwound(), Recorder()
    runtime = make_runtime(json_tool("stop", body), plugins=[unwound, recorder])
    with pytest.raises(KeyboardInterrupt):
        await runtime.execute(make_input("stop", call_id="c1"))
    assert unwound.notices == [("c1", "KeyboardInterrupt", True)]
    assert recorder.hooks == ["dsh_pre_execute", "dsh_execute", "dsh_call_unwound"]


def interrupt_validation_of(marker: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C lands while the arguments holding ``marker`` are checked against the schema (stage 4)."""
    from dsh_core._definition import ToolContract

    checking = ToolContract.argument_violations

    def interrupted(contract: ToolContract, arguments: Any) -> tuple[str, ...]:
        if marker in arguments:
            raise KeyboardInterrupt
        return checking(contract, arguments)

    monkeypatch.setattr(ToolContract, "argument_violations", interrupted)


async def test_a_call_interrupted_while_its_arguments_are_frozen_is_never_told(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dsh_core import _pipeline

    def interrupted(value: object) -> Any:
        raise KeyboardInterrupt  # stage 1: no execution exists yet, no hook can have seen the call

    monkeypatch.setattr(_pipeline, "snapshot_json", interrupted)
    unwound, recorder = Unwound(), Recorder()
    runtime = make_runtime(json_tool("send"), plugins=[unwound, recorder])
    with pytest.raises(KeyboardInterrupt):
        await runtime.execute(make_input("send", {"to": ["ceo"]}, call_id="c1"))
    assert unwound.notices == []
    assert recorder.hooks == []


async def test_a_call_interrupted_while_its_arguments_validate_is_told_once_though_no_hook_saw_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    interrupt_validation_of("stop", monkeypatch)
    unwound, recorder = Unwound(), Recorder()
    runtime = make_runtime(json_tool("send"), plugins=[unwound, recorder])
    with pytest.raises(KeyboardInterrupt):
        await runtime.execute(make_input("send", {"stop": ["now"]}, call_id="c1"))
    assert unwound.notices == [("c1", "KeyboardInterrupt", False)]
    assert unwound.executions[0].arguments["stop"] == ("now",)
    assert recorder.hooks == ["dsh_call_unwound"]  # no dsh_result, no second notice


async def test_a_turn_interrupted_while_a_later_calls_arguments_validate_tells_both_calls_once(
    monkeypatch: pytest.MonkeyPatch, autojump_clock: trio.testing.MockClock
) -> None:
    interrupt_validation_of("stop", monkeypatch)
    unwound, recorder = Unwound(), Recorder()
    safe = {"is_concurrency_safe": lambda args: True}
    runtime = make_runtime(sleeping("slow", 10, **safe), plugins=[unwound, recorder])
    calls = [make_input("slow", {"n": [1]}, call_id="running"), make_input("slow", {"stop": [1]}, call_id="cut")]
    with pytest.raises(KeyboardInterrupt) as caught:
        await run_tool_calls(runtime, calls)
    assert type(caught.value) is KeyboardInterrupt  # bare, as from execute(): not grouped by the group's tasks
    # "running" is cut in its dispatch task as the group's task group unwinds the interrupt.
    assert unwound.notices == [("cut", "KeyboardInterrupt", False), ("running", "Cancelled", True)]
    assert sorted(hook for hook, _ in recorder.events if hook != "dsh_pre_execute" and hook != "dsh_execute") == [
        "dsh_call_unwound"
    ] * 2


async def test_a_code_mode_sub_call_interrupted_while_its_arguments_validate_tells_both_calls_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    interrupt_validation_of("stop", monkeypatch)

    async def program(tools: Any) -> None:
        await tools["echo"]({"stop": ["now"]})

    unwound = Unwound()
    runtime = ToolRuntime(mode="code", code_runtime=FakeCodeRuntime(program))
    runtime.register(json_tool("echo"))
    runtime.plugins.register(unwound, name="unwound")
    with pytest.raises(KeyboardInterrupt):
        await runtime.execute(make_input("run_code", {"code": "...", "description": "d"}, call_id="outer"))
    assert unwound.notices == [("outer:code:1", "KeyboardInterrupt", False), ("outer", "KeyboardInterrupt", True)]


async def test_a_keyboard_interrupt_in_a_policy_is_told_once_before_the_body_started() -> None:
    class Interrupting:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
            raise KeyboardInterrupt

    unwound, recorder = Unwound(), Recorder()
    runtime = make_runtime(json_tool("send"), plugins=[unwound, Interrupting(), recorder])
    with pytest.raises(KeyboardInterrupt):
        await runtime.execute(make_input("send", call_id="c1"))
    assert unwound.notices == [("c1", "KeyboardInterrupt", False)]
    assert recorder.hooks == ["dsh_pre_execute", "dsh_call_unwound"]


async def test_a_keyboard_interrupt_in_a_notice_listener_still_lets_the_others_hear_and_propagates(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    class Interrupted:
        @hookimpl
        def dsh_call_unwound(self) -> None:
            raise KeyboardInterrupt

    after = Unwound()
    runtime = ToolRuntime()
    runtime.register(sleeping("send", 10))
    runtime.plugins.register(Interrupted(), name="interrupted")
    runtime.plugins.register(after, name="after")  # called first: the later-registered listener is outermost
    with pytest.raises(KeyboardInterrupt), trio.move_on_after(1):
        await runtime.execute(make_input("send", call_id="c1"))
    assert after.notices == [("c1", "Cancelled", True)]


async def test_a_call_cut_while_its_result_is_published_is_told_to_the_plugins_that_had_not_seen_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    class SlowObserver:
        @hookimpl
        async def dsh_result(self, execution: ToolExecution, result: ToolExecutionResult) -> None:
            await trio.sleep(5)  # ships the result off the host

    class Both(Unwound):
        def __init__(self) -> None:
            super().__init__()
            self.results: list[str] = []

        @hookimpl
        def dsh_result(self, execution: ToolExecution, result: ToolExecutionResult) -> None:
            self.results.append(execution.call_id)

    inner, outer = Both(), Both()
    runtime = ToolRuntime()
    runtime.register(json_tool("send"))
    runtime.plugins.register(inner, name="inner")  # its observer runs after the slow one
    runtime.plugins.register(SlowObserver(), name="slow")
    runtime.plugins.register(outer, name="outer")  # its observer ran before the cut
    with trio.move_on_after(1) as turn:
        await runtime.execute(make_input("send", call_id="c1"))
    assert turn.cancelled_caught
    assert (outer.results, outer.notices) == (["c1"], [])
    assert (inner.results, inner.notices) == ([], [("c1", "Cancelled", True)])


async def test_a_turn_cut_short_tells_every_call_it_began_and_none_it_had_not(
    autojump_clock: trio.testing.MockClock,
) -> None:
    unwound, recorder = Unwound(), Recorder()
    safe = {"is_concurrency_safe": lambda args: True}
    tools = [sleeping("slow", 10, **safe), sleeping("quick", 0.5, **safe), json_tool("exclusive")]
    runtime = make_runtime(*tools, plugins=[unwound, recorder, SlowPolicy()])
    calls = [make_input("slow", call_id="running"), make_input("quick", call_id="settled")]
    calls += [make_input("slow", call_id="deciding")]  # begun once "settled" frees its slot, at 0.5 s
    calls += [make_input("exclusive", call_id="later")]  # waits for the group to settle: never begun
    with trio.move_on_after(1) as turn:
        await run_tool_calls(runtime, calls, max_parallel=2)
    assert turn.cancelled_caught
    assert sorted(unwound.notices) == [
        ("deciding", "Cancelled", False),  # its policy (a second long, from 0.5 s) was still deciding
        ("running", "Cancelled", True),
        # Its dispatch was over and it waited to be committed behind "running": it ran, with no result
        # (told as the turn's task group unwinds, which groups the cancellation).
        ("settled", "Cancelled", True),
    ]
    assert (
        sorted(hook for hook, _ in recorder.events if hook not in ("dsh_pre_execute", "dsh_execute"))
        == ["dsh_call_unwound"] * 3
    )


async def test_a_turn_cut_while_a_policy_decides_tells_that_call(autojump_clock: trio.testing.MockClock) -> None:
    unwound = Unwound()
    runtime = make_runtime(
        json_tool("send", is_concurrency_safe=lambda args: True),
        plugins=[unwound, AskFirst()],
        approval=NoAnswer(),
    )
    with trio.move_on_after(1):
        await run_tool_calls(runtime, [make_input("send", call_id="c1", agent=Agent("main"))])
    assert unwound.notices == [("c1", "Cancelled", False)]


async def test_a_code_mode_sub_call_interrupted_tells_both_calls() -> None:
    async def stop(args: Any) -> str:
        raise KeyboardInterrupt

    async def program(tools: Any) -> None:
        await tools["stop"]({})

    unwound = Unwound()
    runtime = ToolRuntime(mode="code", code_runtime=FakeCodeRuntime(program))
    runtime.register(json_tool("stop", stop))
    runtime.plugins.register(unwound, name="unwound")
    with pytest.raises(KeyboardInterrupt) as caught:
        await runtime.execute(make_input("run_code", {"code": "...", "description": "d"}, call_id="outer"))
    assert type(caught.value) is KeyboardInterrupt  # bare, as from a plain call: not grouped by the run's tasks
    assert unwound.notices == [("outer:code:1", "KeyboardInterrupt", True), ("outer", "KeyboardInterrupt", True)]
    assert [type(cause) for cause in unwound.causes] == [KeyboardInterrupt, KeyboardInterrupt]


async def test_a_keyboard_interrupt_in_a_code_mode_program_itself_reaches_the_host_bare() -> None:
    async def program(tools: Any) -> None:
        await tools["echo"]({})
        raise KeyboardInterrupt  # Ctrl-C lands in the program, between its sub-calls

    unwound, recorder = Unwound(), Recorder()
    runtime = ToolRuntime(mode="code", code_runtime=FakeCodeRuntime(program))
    runtime.register(json_tool("echo"))
    runtime.plugins.register(unwound, name="unwound")
    runtime.plugins.register(recorder, name="recorder")
    with pytest.raises(KeyboardInterrupt) as caught:
        await runtime.execute(make_input("run_code", {"code": "...", "description": "d"}, call_id="outer"))
    assert type(caught.value) is KeyboardInterrupt
    assert unwound.notices == [("outer", "KeyboardInterrupt", True)]
    assert type(unwound.causes[0]) is KeyboardInterrupt
    assert [call_id for _, call_id in recorder.events if _ == "dsh_result"] == ["outer:code:1"]


async def test_a_code_mode_sub_call_interrupted_while_it_waits_to_commit_is_told(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dsh_core.code_mode import _bridge

    waiting = _bridge._Lane.wait_for_turn

    async def interrupted(lane: Any, queue: Any, ticket: Any) -> None:
        if queue is lane.commits:
            raise KeyboardInterrupt  # Ctrl-C lands between the sub-call's dispatch and its commit
        await waiting(lane, queue, ticket)

    monkeypatch.setattr(_bridge._Lane, "wait_for_turn", interrupted)

    async def program(tools: Any) -> None:
        await tools["echo"]({})

    unwound = Unwound()
    runtime = ToolRuntime(mode="code", code_runtime=FakeCodeRuntime(program))
    runtime.register(json_tool("echo"))
    runtime.plugins.register(unwound, name="unwound")
    with pytest.raises(KeyboardInterrupt) as caught:
        await runtime.execute(make_input("run_code", {"code": "...", "description": "d"}, call_id="outer"))
    assert type(caught.value) is KeyboardInterrupt
    assert unwound.notices == [("outer:code:1", "KeyboardInterrupt", True), ("outer", "KeyboardInterrupt", True)]


async def test_a_scoped_plugin_is_told_only_of_its_scopes_calls(autojump_clock: trio.testing.MockClock) -> None:
    scope = Agent("mine")
    mine = Unwound()
    mine.dsh_scope = scope  # type: ignore[attr-defined]
    runtime = make_runtime(sleeping("send", 10), plugins=[mine])
    for call_id, agent in (("mine", scope), ("other", Agent("other"))):
        with trio.move_on_after(1):
            await runtime.execute(make_input("send", call_id=call_id, agent=agent))
    assert mine.notices == [("mine", "Cancelled", True)]


def test_an_async_notice_listener_is_refused_at_registration() -> None:
    class Awaiting:
        @hookimpl
        async def dsh_call_unwound(self, execution: ToolExecution) -> None:
            pass

    runtime = ToolRuntime()
    with pytest.raises(pluggy.PluginValidationError, match=r"dsh_call_unwound .* is an async def"):
        runtime.plugins.register(Awaiting(), name="awaiting")


async def test_a_dry_run_tells_no_one(autojump_clock: trio.testing.MockClock) -> None:
    """A rehearsal (dsh-tools simulate) runs no call: nothing for an audit trail to record, cut or not."""
    unwound = Unwound()
    dry = SimulationRuntime()
    dry.register(json_tool("send"))
    dry.plugins.register(unwound, name="unwound")
    dry.plugins.register(SlowPolicy(), name="slow-policy")
    with trio.move_on_after(0.5) as turn:
        await dry.execute(make_input("send", call_id="deciding"))
    assert turn.cancelled_caught and unwound.notices == []


class Settled(Unwound):
    """Records the notices and, as (call id, code or "ok"), the published results."""

    def __init__(self) -> None:
        super().__init__()
        self.results: list[tuple[str, str]] = []

    @hookimpl
    def dsh_result(self, execution: ToolExecution, result: ToolExecutionResult) -> None:
        code = "ok" if not result.is_error else str(result.error.info.code if result.error.info else None)  # type: ignore[union-attr]
        self.results.append((execution.call_id, code))


def gathering_runtime(first: Any, settled: Settled) -> tuple[ToolRuntime, trio.Event]:
    """A subprocess runtime whose program gathers ``first`` and then ``quick`` (both parallel-safe).

    ``quick`` finishes its dispatch at once and then waits to commit behind ``first``;
    the event is set as its body runs.
    """
    quick_ran = trio.Event()

    async def quick(args: Any) -> str:
        quick_ran.set()
        return "done"

    safe = {"is_concurrency_safe": lambda args: True}
    runtime = ToolRuntime(mode="code", code_runtime=SubprocessPythonRuntime(wall_budget_s=30))
    runtime.register(json_tool("first", first, **safe))
    runtime.register(json_tool("quick", quick, **safe))
    runtime.plugins.register(settled, name="settled")
    return runtime, quick_ran


GATHER_BOTH = "import asyncio\nawait asyncio.gather(tools.first({}), tools.quick({}))\n"


async def test_a_keyboard_interrupt_in_a_sub_call_ends_the_run_while_another_waits_to_commit_behind_it() -> None:
    quick_ran: trio.Event

    async def first(args: Any) -> str:
        await quick_ran.wait()  # "quick" is done and waits to commit behind this call
        raise KeyboardInterrupt

    settled = Settled()
    runtime, quick_ran = gathering_runtime(first, settled)
    with trio.fail_after(10), pytest.raises(KeyboardInterrupt) as caught:  # a real budget: it used to hang here
        await runtime.execute(make_input("run_code", {"code": GATHER_BOTH, "description": "d"}, call_id="outer"))
    assert type(caught.value) is KeyboardInterrupt  # bare out of the subprocess runtime's tasks too
    assert settled.notices == [("outer:code:1", "KeyboardInterrupt", True), ("outer", "KeyboardInterrupt", True)]
    # It still commits, in its turn (its value is discarded): told of its end once, as a result.
    assert [call_id for call_id, _ in settled.results] == ["outer:code:2"]
    assert not [pid for pid in _children_of(os.getpid()) if b"_child.py" in _cmdline(pid)]


async def test_the_hosts_scope_cut_while_a_sub_call_waits_to_commit_behind_another_ends_the_run() -> None:
    quick_ran: trio.Event

    async def first(args: Any) -> str:
        await trio.sleep_forever()  # until the run's signal aborts it
        raise AssertionError("unreachable")

    settled = Settled()
    runtime, quick_ran = gathering_runtime(first, settled)

    async def cut_once_quick_ran(turn: trio.CancelScope) -> None:
        await quick_ran.wait()
        turn.cancel()

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            with trio.CancelScope() as turn:
                nursery.start_soon(cut_once_quick_ran, turn)
                await runtime.execute(
                    make_input("run_code", {"code": GATHER_BOTH, "description": "d"}, call_id="outer")
                )
    assert turn.cancelled_caught
    assert settled.notices == [("outer", "Cancelled", True)]
    # The run's signal fired as the run unwound: both sub-calls settle through it, in order.
    assert settled.results == [("outer:code:1", "ABORTED"), ("outer:code:2", "ABORTED")]
    assert not [pid for pid in _children_of(os.getpid()) if b"_child.py" in _cmdline(pid)]


def _children_of(pid: int) -> list[int]:
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


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read()
    except OSError:
        return b""
