"""Worker threads a cancelled call leaves behind: reported as orphaned work, never silently leaked.

Threads run for real here, so these tests coordinate them with
``threading.Event`` (no sleeps) and bound every real wait with ``trio.fail_after``.
Timeouts use pytest-trio's ``mock_clock`` without autojump: the test moves the
clock itself once the worker thread is known to be running, because autojump
would fire the deadline before the thread had started.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from dsh_core import (
    CancelSignal,
    OrphanedWork,
    RetryPolicy,
    SessionLog,
    SessionRecorder,
    ToolExecutionSuccess,
    ToolExecutionToken,
    ToolRunContext,
    ToolRuntime,
    define_tool,
    read_session_log,
    replay,
)
from dsh_core._execution import new_execution
from dsh_core.testing import expect_failure, json_tool, make_input, make_runtime
from dsh_plugins import timeout

REAL_WAIT = 10  # seconds: a bound on real thread hand-offs, never reached when the code works


class Gate:
    """A blocking function for a worker thread: signals when it starts, returns when released."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.finished = threading.Event()
        self.calls = 0

    def __call__(self, value: Any = "done") -> Any:
        self.calls += 1
        self.started.set()
        try:
            if not self.release.wait(REAL_WAIT):
                raise RuntimeError("gate never released")
            if isinstance(value, BaseException):
                raise value
            return value
        finally:
            self.finished.set()

    async def wait_started(self) -> None:
        with trio.fail_after(REAL_WAIT):
            await trio.to_thread.run_sync(self.started.wait)


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, event_type: str, data: Mapping[str, Any]) -> None:
        self.seen.append((event_type, dict(data)))

    def types(self) -> list[str]:
        return [event_type for event_type, _ in self.seen]


def threaded_tool(gate: Gate, name: str = "blocking", **options: Any) -> Any:
    async def body(args: Any, run: ToolRunContext) -> Any:
        return await run.run_in_thread(gate, args.get("value", "done"))

    return json_tool(name, body, **options)



async def cancel_once_started(gate: Gate, signal: CancelSignal) -> None:
    await gate.wait_started()
    signal.cancel("caller gave up")


async def test_uncancelled_call_returns_the_thread_value_and_leaves_nothing_behind() -> None:
    gate = Gate()
    gate.release.set()
    runtime = make_runtime(threaded_tool(gate))
    result = await runtime.execute(make_input("blocking", {"value": 42}))
    assert isinstance(result, ToolExecutionSuccess)
    assert result.value == 42
    assert runtime.orphaned_work() == []
    with trio.fail_after(REAL_WAIT):
        await runtime.wait_for_orphans()


async def test_exception_in_the_thread_is_the_calls_failure() -> None:
    gate = Gate()
    gate.release.set()

    async def body(args: Any, run: ToolRunContext) -> Any:
        return await run.run_in_thread(gate, ValueError("disk on fire"))

    runtime = make_runtime(json_tool("blocking", body))
    result = expect_failure(await runtime.execute(make_input("blocking")))
    assert result.code == "TOOL_ERROR"
    assert "disk on fire" in result.error.message
    assert runtime.orphaned_work() == []


async def test_cancelled_call_resolves_at_once_and_reports_the_running_thread(
    caplog: pytest.LogCaptureFixture,
) -> None:
    gate = Gate()
    events = Events()
    runtime = make_runtime(threaded_tool(gate))
    runtime.event_sink = events
    signal = CancelSignal()
    caplog.set_level(logging.WARNING, logger="dsh_core.orphans")
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancel_once_started, gate, signal)
        with trio.fail_after(REAL_WAIT):
            result = await runtime.execute(make_input("blocking", call_id="c-1", signal=signal))
    # The thread is still blocked: the call did not wait for it.
    assert not gate.finished.is_set()
    assert expect_failure(result).code == "ABORTED"
    [work] = runtime.orphaned_work()
    assert isinstance(work, OrphanedWork)
    assert (work.call_id, work.tool, work.agent) == ("c-1", "blocking", None)
    assert work.function.endswith("Gate")
    assert work.thread
    assert events.types() == ["tool/orphaned"]
    assert events.seen[0][1]["callId"] == "c-1"
    assert "keeps running as orphaned work" in caplog.text

    gate.release.set()
    with trio.fail_after(REAL_WAIT):
        await runtime.wait_for_orphans()
    assert runtime.orphaned_work() == []
    assert events.types() == ["tool/orphaned", "tool/orphan-finished"]
    finished = events.seen[1][1]
    assert finished["callId"] == "c-1"
    assert finished["outcome"] == "returned"
    assert finished["seconds"] >= 0


async def test_orphan_that_raises_is_reported_as_raised() -> None:
    gate = Gate()
    events = Events()

    async def body(args: Any, run: ToolRunContext) -> Any:
        return await run.run_in_thread(gate, OSError("late failure"))

    runtime = make_runtime(json_tool("blocking", body))
    runtime.event_sink = events
    signal = CancelSignal()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancel_once_started, gate, signal)
        assert expect_failure(await runtime.execute(make_input("blocking", signal=signal))).code == "ABORTED"
    gate.release.set()
    with trio.fail_after(REAL_WAIT):
        await runtime.wait_for_orphans()
    assert events.seen[-1][0] == "tool/orphan-finished"
    assert events.seen[-1][1]["outcome"] == "raised"


async def test_timeout_resolves_on_time_and_the_thread_is_orphaned(mock_clock: trio.testing.MockClock) -> None:
    gate = Gate()
    runtime = make_runtime(threaded_tool(gate, timeout_ms=500))
    timeout.dsh_setup(runtime, {})
    outcome: list[Any] = []

    async def call() -> None:
        outcome.append(await runtime.execute(make_input("blocking", call_id="slow-1")))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(call)
        await gate.wait_started()
        mock_clock.jump(0.5)
    assert expect_failure(outcome[0]).code == "TOOL_TIMEOUT"
    assert [work.call_id for work in runtime.orphaned_work()] == ["slow-1"]
    gate.release.set()
    with trio.fail_after(REAL_WAIT):
        await runtime.wait_for_orphans()
    assert runtime.orphaned_work() == []


async def test_an_attempt_past_its_budget_whose_thread_still_runs_is_not_retried(
    mock_clock: trio.testing.MockClock,
) -> None:
    """A second attempt would do the same work beside the first, which nothing can stop: no retry."""
    stuck, second = Gate(), Gate()
    second.release.set()
    gates = [stuck, second]

    async def body(args: Any, run: ToolRunContext) -> Any:
        return await run.run_in_thread(gates.pop(0), "done")

    policy = RetryPolicy(max_attempts=2, initial_delay_s=0, jitter=0, attempt_timeout_s=1)
    runtime = make_runtime(json_tool("blocking", body, retry=policy))
    outcome: list[Any] = []

    async def call() -> None:
        outcome.append(await runtime.execute(make_input("blocking", call_id="r-1")))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(call)
        await stuck.wait_started()
        mock_clock.jump(1)  # the first attempt's budget: it is cancelled, its thread runs on
    failure = expect_failure(outcome[0])
    assert failure.code == "TOOL_TIMEOUT"
    assert failure.error.message == "the attempt ran past its 1 s budget; not retried while its worker thread still runs"
    assert gates == [second]  # the second attempt never started
    assert [work.call_id for work in runtime.orphaned_work()] == ["r-1"]  # the first attempt's thread
    stuck.release.set()
    with trio.fail_after(REAL_WAIT):
        await runtime.wait_for_orphans()
    assert runtime.orphaned_work() == []


async def test_work_given_up_before_a_thread_took_it_never_starts() -> None:
    gate = Gate()
    gate.release.set()
    limiter = trio.CapacityLimiter(1)
    events = Events()

    async def body(args: Any, run: ToolRunContext) -> Any:
        return await run.run_in_thread(gate, limiter=limiter)

    runtime = make_runtime(json_tool("blocking", body))
    runtime.event_sink = events
    signal = CancelSignal()

    async def cancel_when_waiting() -> None:
        await trio.testing.wait_all_tasks_blocked()
        signal.cancel("gave up")

    # The only slot is taken: the call waits for it until it is cancelled.
    async with limiter, trio.open_nursery() as nursery:
        nursery.start_soon(cancel_when_waiting)
        result = await runtime.execute(make_input("blocking", signal=signal))
    assert expect_failure(result).code == "ABORTED"
    assert gate.calls == 0
    assert runtime.orphaned_work() == []
    assert events.seen == []


async def test_several_orphans_are_listed_until_each_returns() -> None:
    gates = [Gate(), Gate()]
    runtime = make_runtime(threaded_tool(gates[0], "first"), threaded_tool(gates[1], "second"))
    for gate, name in zip(gates, ("first", "second"), strict=True):
        signal = CancelSignal()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(cancel_once_started, gate, signal)
            await runtime.execute(make_input(name, signal=signal))
    assert sorted(work.tool for work in runtime.orphaned_work()) == ["first", "second"]
    gates[0].release.set()
    with trio.fail_after(REAL_WAIT):
        while len(runtime.orphaned_work()) != 1:
            await trio.to_thread.run_sync(gates[0].finished.wait)
            await trio.sleep(0)
    assert [work.tool for work in runtime.orphaned_work()] == ["second"]

    async def waiter(done: list[bool]) -> None:
        await runtime.wait_for_orphans()
        done.append(True)

    done: list[bool] = []
    with trio.fail_after(REAL_WAIT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(waiter, done)
            await trio.testing.wait_all_tasks_blocked()
            assert done == []  # still waiting for the second thread
            gates[1].release.set()
    assert done == [True]
    assert runtime.orphaned_work() == []


async def test_a_raising_event_sink_does_not_disturb_the_call(caplog: pytest.LogCaptureFixture) -> None:
    gate = Gate()

    def broken_sink(event_type: str, data: Mapping[str, Any]) -> None:
        raise RuntimeError("sink down")

    runtime = make_runtime(threaded_tool(gate))
    runtime.event_sink = broken_sink
    signal = CancelSignal()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancel_once_started, gate, signal)
        assert expect_failure(await runtime.execute(make_input("blocking", signal=signal))).code == "ABORTED"
    assert len(runtime.orphaned_work()) == 1
    assert "event sink failed for tool/orphaned: sink down" in caplog.text
    gate.release.set()
    with trio.fail_after(REAL_WAIT):
        await runtime.wait_for_orphans()


async def test_define_tool_in_thread_runs_a_plain_def_body_in_a_worker_thread() -> None:
    loop_thread = threading.current_thread()
    seen: list[threading.Thread] = []

    def add(args: Any) -> int:
        seen.append(threading.current_thread())
        return int(args["a"] + args["b"])

    tool = define_tool(
        name="add",
        description="adds",
        parameters={"a": {"type": "integer", "required": True}, "b": {"type": "integer", "required": True}},
        output={"type": "integer"},
        execute=add,
        in_thread=True,
    )
    assert tool.inline is False
    runtime = make_runtime(tool)
    result = await runtime.execute(make_input("add", {"a": 2, "b": 3}))
    assert isinstance(result, ToolExecutionSuccess) and result.value == 5
    assert seen and seen[0] is not loop_thread


async def test_define_tool_in_thread_orphan_names_the_authors_function() -> None:
    gate = Gate()

    def slow_lookup(args: Any, run: ToolRunContext) -> str:
        return str(gate())

    tool = define_tool(
        name="lookup", description="d", parameters={}, output={"type": "string"}, execute=slow_lookup, in_thread=True
    )
    runtime = make_runtime(tool)
    signal = CancelSignal()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancel_once_started, gate, signal)
        assert expect_failure(await runtime.execute(make_input("lookup", signal=signal))).code == "ABORTED"
    [work] = runtime.orphaned_work()
    assert work.function.endswith("slow_lookup")
    gate.release.set()
    with trio.fail_after(REAL_WAIT):
        await runtime.wait_for_orphans()


def test_define_tool_in_thread_refuses_an_async_body_and_a_non_bool() -> None:
    async def body(args: Any) -> int:
        return 1

    with pytest.raises(TypeError, match="in_thread=True takes a plain def execute"):
        define_tool(name="t", description="d", parameters={}, output={"type": "integer"}, execute=body, in_thread=True)
    with pytest.raises(TypeError, match="in_thread must be a bool"):
        define_tool(
            name="t",
            description="d",
            parameters={},
            output={"type": "integer"},
            execute=lambda args: 1,
            in_thread=1,  # type: ignore[arg-type]
        )


async def test_in_thread_body_returning_an_awaitable_is_refused() -> None:
    async def later() -> int:
        return 1

    tool = define_tool(
        name="t",
        description="d",
        parameters={},
        output={"type": "integer"},
        execute=lambda args: later(),
        in_thread=True,
    )
    result = expect_failure(await make_runtime(tool).execute(make_input("t")))
    assert "returned an awaitable" in result.error.message


async def test_context_built_by_hand_can_run_in_a_thread() -> None:
    signal = CancelSignal()
    execution = new_execution("c", "c", "t", {}, signal, ToolExecutionToken(), None, None)
    run = ToolRunContext(execution, execution.signal, [])
    assert await run.run_in_thread(lambda a, b: a * b, 6, 7) == 42


async def test_session_recorder_logs_orphan_events_and_replay_ignores_them(tmp_path: Path) -> None:
    gate = Gate()
    runtime = make_runtime(threaded_tool(gate))
    path = tmp_path / "session.jsonl"
    with SessionLog(path) as log:
        recorder = SessionRecorder(log, runtime)
        runtime.plugins.register(recorder)
        runtime.event_sink = recorder.event_sink
        signal = CancelSignal()
        request = make_input("blocking", call_id="c-9", signal=signal)
        recorder.record_call(request)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(cancel_once_started, gate, signal)
            await runtime.execute(request)
        gate.release.set()
        with trio.fail_after(REAL_WAIT):
            await runtime.wait_for_orphans()
    types = [event.type for event in read_session_log(path).events]
    assert types == ["tool/call", "tool/orphaned", "tool/result", "tool/orphan-finished"]
    [call] = replay(read_session_log(path), runtime)
    assert call.call_id == "c-9"
    assert call.result is not None and call.result.is_error


async def test_runtime_without_event_sink_still_tracks_orphans() -> None:
    gate = Gate()
    runtime = ToolRuntime()
    runtime.register(threaded_tool(gate))
    signal = CancelSignal()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancel_once_started, gate, signal)
        await runtime.execute(make_input("blocking", signal=signal))
    assert len(runtime.orphaned_work()) == 1
    gate.release.set()
    with trio.fail_after(REAL_WAIT):
        await runtime.wait_for_orphans()


def orphan_in_its_own_run(runtime: ToolRuntime, gate: Gate) -> None:
    """One turn in its own ``trio.run``, as the CLI runs each: the call is cancelled and leaves its thread."""

    async def turn() -> None:
        signal = CancelSignal()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(cancel_once_started, gate, signal)
            with trio.fail_after(REAL_WAIT):
                result = await runtime.execute(make_input("blocking", call_id="c-1", signal=signal))
        assert expect_failure(result).code == "ABORTED"

    trio.run(turn)
    assert [work.call_id for work in runtime.orphaned_work()] == ["c-1"]


def test_a_later_run_waits_for_an_orphan_the_previous_run_left() -> None:
    """The run that abandoned the thread is over: the waiter's own run is woken, and hears the finish first."""
    gate = Gate()
    events = Events()
    runtime = make_runtime(threaded_tool(gate))
    runtime.event_sink = events
    orphan_in_its_own_run(runtime, gate)

    async def shutdown() -> list[str]:
        async with trio.open_nursery() as nursery:

            async def release_once_waiting() -> None:
                await trio.testing.wait_all_tasks_blocked()
                gate.release.set()

            nursery.start_soon(release_once_waiting)
            with trio.fail_after(REAL_WAIT):
                await runtime.wait_for_orphans()
            return events.types()

    assert trio.run(shutdown) == ["tool/orphaned", "tool/orphan-finished"]
    assert runtime.orphaned_work() == []
    assert events.seen[1][1]["callId"] == "c-1"
    assert events.seen[1][1]["outcome"] == "returned"


def test_the_finish_goes_to_the_run_now_using_the_runtime_not_the_worker_thread() -> None:
    """A later turn that writes to the same sink must not be raced by the worker thread."""
    gate = Gate()
    sink_threads: dict[str, threading.Thread] = {}
    announced = threading.Event()

    def sink(event_type: str, data: Mapping[str, Any]) -> None:
        sink_threads[event_type] = threading.current_thread()
        if event_type == "tool/orphan-finished":
            announced.set()

    async def echo(args: Any, run: ToolRunContext) -> Any:
        return "ok"

    runtime = make_runtime(threaded_tool(gate), json_tool("echo", echo))
    runtime.event_sink = sink
    orphan_in_its_own_run(runtime, gate)

    async def next_turn() -> None:
        assert isinstance(await runtime.execute(make_input("echo")), ToolExecutionSuccess)
        gate.release.set()
        with trio.fail_after(REAL_WAIT):
            assert await trio.to_thread.run_sync(announced.wait, REAL_WAIT)

    trio.run(next_turn)
    assert sink_threads["tool/orphan-finished"] is threading.current_thread()
    assert runtime.orphaned_work() == []


def test_with_no_run_left_the_finish_is_sent_from_the_worker_thread(caplog: pytest.LogCaptureFixture) -> None:
    gate = Gate()
    seen: list[str] = []
    announced = threading.Event()

    def broken_sink(event_type: str, data: Mapping[str, Any]) -> None:
        seen.append(event_type)
        if event_type == "tool/orphan-finished":
            announced.set()
            raise RuntimeError("sink down")

    runtime = make_runtime(threaded_tool(gate))
    runtime.event_sink = broken_sink
    orphan_in_its_own_run(runtime, gate)
    gate.release.set()
    assert announced.wait(REAL_WAIT)
    assert seen == ["tool/orphaned", "tool/orphan-finished"]
    assert runtime.orphaned_work() == []

    async def wait_for_orphans() -> None:
        with trio.fail_after(REAL_WAIT):
            await runtime.wait_for_orphans()

    # Returns once the announcement is over, so the sink's failure has been logged by then.
    trio.run(wait_for_orphans)
    assert "event sink failed for tool/orphan-finished: sink down" in caplog.text


async def test_a_cancelled_waiter_is_forgotten() -> None:
    gate = Gate()
    runtime = make_runtime(threaded_tool(gate))
    signal = CancelSignal()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancel_once_started, gate, signal)
        await runtime.execute(make_input("blocking", signal=signal))
    with trio.move_on_after(0):
        await runtime.wait_for_orphans()
    assert runtime._orphans._idle_waiters == set()
    gate.release.set()
    with trio.fail_after(REAL_WAIT):
        await runtime.wait_for_orphans()


async def test_a_waiter_that_comes_after_the_thread_returned_still_sees_the_finish_first() -> None:
    """The thread has returned but its ``tool/orphan-finished`` still waits for this run's loop."""
    gate = Gate()
    events = Events()
    runtime = make_runtime(threaded_tool(gate))
    runtime.event_sink = events
    signal = CancelSignal()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancel_once_started, gate, signal)
        await runtime.execute(make_input("blocking", signal=signal))
    gate.release.set()
    # Without a checkpoint, so the loop cannot run the announcement the thread hands it.
    deadline = time.monotonic() + REAL_WAIT
    while runtime.orphaned_work():
        assert time.monotonic() < deadline, "the orphaned thread never returned"
    assert events.types() == ["tool/orphaned"]
    with trio.fail_after(REAL_WAIT):
        await runtime.wait_for_orphans()
    assert events.types() == ["tool/orphaned", "tool/orphan-finished"]


async def test_the_ledger_does_not_rerun_an_in_doubt_call_while_its_earlier_thread_runs(
    mock_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    """A tool safe to run again is still not run beside its first attempt: that is the effect twice at once."""
    from dsh_plugins import ledger as ledger_plugin

    gate = Gate()
    runtime = make_runtime(threaded_tool(gate, timeout_ms=500))
    timeout.dsh_setup(runtime, {})
    ledger = ledger_plugin.EffectLedger(tmp_path / "effects.jsonl", rerun_in_doubt=["blocking"], runtime=runtime)
    runtime.plugins.register(ledger, name=ledger_plugin.PLUGIN_NAME)
    try:
        outcome: list[Any] = []

        async def call() -> None:
            outcome.append(await runtime.execute(make_input("blocking", call_id="o-1")))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(call)
            await gate.wait_started()
            mock_clock.jump(0.5)
        assert expect_failure(outcome[0]).code == "TOOL_TIMEOUT"

        again = expect_failure(await runtime.execute(make_input("blocking", call_id="o-1")))
        assert again.code == ledger_plugin.EFFECT_IN_DOUBT
        assert "its earlier attempt still runs in a worker thread it left behind" in again.error.message
        assert gate.calls == 1  # not started a second time
        other = runtime.execute(make_input("blocking", call_id="o-2", arguments={"value": "other"}))
        gate.release.set()  # other call ids are not held back: this one runs (and returns at once)
        assert isinstance(await other, ToolExecutionSuccess)

        with trio.fail_after(REAL_WAIT):
            await runtime.wait_for_orphans()
        rerun = await runtime.execute(make_input("blocking", call_id="o-1"))
        assert isinstance(rerun, ToolExecutionSuccess) and rerun.value == "done"
    finally:
        ledger.close()
