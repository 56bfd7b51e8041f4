"""Cancellation at every stage, on trio's virtual clock (no real sleeps)."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
import trio.testing

from dsh_core import (
    Agent,
    Ask,
    CancelSignal,
    TextBlock,
    ToolDispatchExecution,
    ToolExecution,
    ToolExecutionFailure,
    ToolExecutionResult,
    ToolRunContext,
    UserMessage,
    hookimpl,
)
from dsh_core._decisions import Deny
from dsh_core._trace import trace_of
from dsh_core.testing import Recorder, json_tool, make_input, make_runtime

Next = Callable[[], Awaitable[Any]]


def code(result: ToolExecutionResult) -> str | None:
    assert isinstance(result, ToolExecutionFailure), result
    return result.error.info.code if result.error.info else None


def sleeper(seconds: float, log: list[str] | None = None) -> Any:
    async def body(args: Any, run: ToolRunContext) -> str:
        if log is not None:
            log.append("started")
        await trio.sleep(seconds)
        if log is not None:
            log.append("finished")
        return "done"

    return json_tool("sleep", body, output={"type": "string"})


async def cancel_after(signal: CancelSignal, seconds: float, reason: str = "user pressed stop") -> None:
    await trio.sleep(seconds)
    signal.cancel(reason)


async def test_pre_cancelled_signal_skips_everything_but_still_snapshots_and_notifies() -> None:
    recorder = Recorder()
    log: list[str] = []
    runtime = make_runtime(sleeper(1, log), plugins=[recorder])
    signal = CancelSignal()
    signal.cancel()
    result = await runtime.execute(make_input("sleep", {"x": [1]}, signal=signal))
    assert code(result) == "ABORTED_BEFORE_DISPATCH"
    assert result.content == (TextBlock("Error: tool call aborted before dispatch"),)
    assert log == []
    assert recorder.hooks == ["dsh_result"]
    execution, _ = recorder.results[0]
    assert execution.arguments == {"x": (1,)}


async def test_pre_cancelled_unknown_tool_reports_aborted_not_unknown() -> None:
    signal = CancelSignal()
    signal.cancel()
    result = await make_runtime().execute(make_input("nope", signal=signal))
    assert code(result) == "ABORTED_BEFORE_DISPATCH"


async def test_non_json_arguments_win_over_pre_cancellation() -> None:
    signal = CancelSignal()
    signal.cancel()
    result = await make_runtime(sleeper(1)).execute(make_input("sleep", {"x": {1, 2}}, signal=signal))
    assert code(result) == "INVALID_ARGS"


async def test_cancel_during_body_interrupts_it_and_reports_aborted(autojump_clock: trio.testing.MockClock) -> None:
    log: list[str] = []
    runtime = make_runtime(sleeper(100, log))
    signal = CancelSignal()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancel_after, signal, 3)
        result = await runtime.execute(make_input("sleep", signal=signal))
    assert code(result) == "ABORTED"
    assert result.content == (TextBlock("Error: tool call aborted"),)
    assert log == ["started"]
    assert trio.current_time() == pytest.approx(3)


async def test_started_body_is_drained_before_the_result(autojump_clock: trio.testing.MockClock) -> None:
    cleanup: list[float] = []

    async def stubborn(args: Any, run: ToolRunContext) -> str:
        try:
            await trio.sleep(100)
        finally:
            with trio.CancelScope(shield=True):
                await trio.sleep(2)
                cleanup.append(trio.current_time())
        return "never"

    runtime = make_runtime(json_tool("stubborn", stubborn, output={"type": "string"}))
    signal = CancelSignal()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancel_after, signal, 1)
        result = await runtime.execute(make_input("stubborn", signal=signal))
    assert cleanup == [pytest.approx(3)]
    assert trio.current_time() == pytest.approx(3)
    assert code(result) == "ABORTED"


async def test_cooperative_body_that_returns_after_cancel_is_aborted(autojump_clock: trio.testing.MockClock) -> None:
    async def cooperative(args: Any, run: ToolRunContext) -> str:
        with trio.CancelScope(shield=True):
            await run.signal.wait()
        return "finished anyway"

    runtime = make_runtime(json_tool("coop", cooperative, output={"type": "string"}))
    signal = CancelSignal()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancel_after, signal, 1)
        result = await runtime.execute(make_input("coop", signal=signal))
    assert code(result) == "ABORTED"


async def test_tool_owned_failure_survives_cancellation(autojump_clock: trio.testing.MockClock) -> None:
    async def fails_on_cancel(args: Any, run: ToolRunContext) -> str:
        try:  # noqa: SIM105 - a misbehaving tool that swallows its cancellation, spelled out
            await trio.sleep(100)
        except trio.Cancelled:
            pass
        raise RuntimeError("tool noticed and failed")

    runtime = make_runtime(json_tool("t", fails_on_cancel, output={"type": "string"}))
    signal = CancelSignal()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancel_after, signal, 1)
        result = await runtime.execute(make_input("t", signal=signal))
    assert code(result) == "TOOL_ERROR"
    assert result.error.message == "tool noticed and failed"  # type: ignore[union-attr]


async def test_cancel_during_pre_execute_is_aborted_before_dispatch(autojump_clock: trio.testing.MockClock) -> None:
    log: list[str] = []

    class SlowGate:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
            await trio.sleep(50)  # ignores the signal: the runtime's scope interrupts it
            return await next()

    runtime = make_runtime(sleeper(1, log), plugins=[SlowGate()])
    signal = CancelSignal()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancel_after, signal, 2)
        result = await runtime.execute(make_input("sleep", signal=signal))
    assert code(result) == "ABORTED_BEFORE_DISPATCH"
    assert log == []
    assert trio.current_time() == pytest.approx(2)


async def test_gate_that_watches_the_signal_then_allows_is_aborted_before_dispatch(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log: list[str] = []

    class Watcher:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
            with trio.CancelScope(shield=True):
                await execution.signal.wait()
            return await next()

    runtime = make_runtime(sleeper(1, log), plugins=[Watcher()])
    signal = CancelSignal()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancel_after, signal, 1)
        result = await runtime.execute(make_input("sleep", signal=signal))
    assert code(result) == "ABORTED_BEFORE_DISPATCH" and log == []


async def test_denial_is_kept_even_if_cancelled_while_deciding(autojump_clock: trio.testing.MockClock) -> None:
    class SlowDeny:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
            with trio.CancelScope(shield=True):
                await execution.signal.wait()
            return Deny("no, and also cancelled")

    runtime = make_runtime(sleeper(1), plugins=[SlowDeny()])
    signal = CancelSignal()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancel_after, signal, 1)
        result = await runtime.execute(make_input("sleep", signal=signal))
    assert code(result) == "DENIED"


async def test_cancel_during_approval_is_aborted_before_dispatch(autojump_clock: trio.testing.MockClock) -> None:
    class SlowHuman:
        async def request(self, execution: ToolExecution, reason: str | None) -> str:
            await trio.sleep(1000)
            return "allowed-once"

    class AskAlways:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
            return Ask()

    runtime = make_runtime(sleeper(1), plugins=[AskAlways()], approval=SlowHuman())
    signal = CancelSignal()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancel_after, signal, 5)
        result = await runtime.execute(make_input("sleep", signal=signal, agent=Agent("a")))
    assert code(result) == "ABORTED_BEFORE_DISPATCH"


async def test_approval_reporting_cancelled_after_signal_is_aborted_before_dispatch() -> None:
    signal = CancelSignal()

    class Approver:
        async def request(self, execution: ToolExecution, reason: str | None) -> str:
            signal.cancel()
            return "cancelled"

    class AskAlways:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
            return Ask()

    recorder = Recorder()
    runtime = make_runtime(sleeper(1), plugins=[AskAlways(), recorder], approval=Approver())
    result = await runtime.execute(make_input("sleep", signal=signal, agent=Agent("a")))
    assert code(result) == "ABORTED_BEFORE_DISPATCH"
    assert "dsh_post_execute" in recorder.hooks  # routed as a post-result


async def test_wrapper_signal_replacement_cannot_detach_caller_cancellation(
    autojump_clock: trio.testing.MockClock,
) -> None:
    seen: list[CancelSignal] = []

    class Detacher:
        @hookimpl
        async def dsh_execute(self, execution: ToolDispatchExecution, next: Next) -> Any:
            saved = execution.signal
            execution.signal = CancelSignal()  # a fresh signal nobody will fire
            try:
                return await next()
            finally:
                execution.signal = saved

    async def body(args: Any, run: ToolRunContext) -> str:
        seen.append(run.signal)
        await trio.sleep(100)
        return "late"

    runtime = make_runtime(json_tool("t", body, output={"type": "string"}), plugins=[Detacher()])
    signal = CancelSignal()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancel_after, signal, 1)
        result = await runtime.execute(make_input("t", signal=signal))
    assert code(result) == "ABORTED"
    assert trio.current_time() == pytest.approx(1)
    assert seen[0].cancelled


async def test_body_without_wrappers_sees_the_callers_signal_object() -> None:
    seen: list[CancelSignal] = []

    async def body(args: Any, run: ToolRunContext) -> None:
        seen.append(run.signal)

    runtime = make_runtime(json_tool("t", body, output={"type": "null"}))
    signal = CancelSignal()
    await runtime.execute(make_input("t", signal=signal))
    assert seen == [signal]


async def test_wrapper_deadline_interrupts_body(autojump_clock: trio.testing.MockClock) -> None:
    class Deadline:
        @hookimpl
        async def dsh_execute(self, execution: ToolDispatchExecution, next: Next) -> Any:
            saved = execution.signal
            execution.signal = CancelSignal.any(saved, CancelSignal.after(2, reason="mine"))
            try:
                return await next()
            finally:
                execution.signal = saved

    runtime = make_runtime(sleeper(100), plugins=[Deadline()])
    result = await runtime.execute(make_input("sleep"))
    assert code(result) == "ABORTED"
    assert trio.current_time() == pytest.approx(2)


async def test_already_fired_wrapper_signal_skips_the_body() -> None:
    log: list[str] = []

    class Fired:
        @hookimpl
        async def dsh_execute(self, execution: ToolDispatchExecution, next: Next) -> Any:
            fired = CancelSignal()
            fired.cancel()
            execution.signal = fired
            return await next()

    runtime = make_runtime(sleeper(1, log), plugins=[Fired()])
    result = await runtime.execute(make_input("sleep"))
    assert code(result) == "ABORTED_BEFORE_DISPATCH" and log == []


async def test_wrapper_short_circuit_success_after_cancel_is_aborted_before_dispatch(
    autojump_clock: trio.testing.MockClock,
) -> None:
    from dsh_core import ToolExecutionSuccess

    class WaitThenAnswer:
        @hookimpl
        async def dsh_execute(self, execution: ToolDispatchExecution, next: Next) -> Any:
            with trio.CancelScope(shield=True):
                await execution.signal.wait()
            return ToolExecutionSuccess(value="cached", content=())

    runtime = make_runtime(sleeper(1), plugins=[WaitThenAnswer()])
    signal = CancelSignal()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancel_after, signal, 1)
        result = await runtime.execute(make_input("sleep", signal=signal))
    assert code(result) == "ABORTED_BEFORE_DISPATCH"


async def test_cancel_during_post_execute_turns_success_into_aborted(autojump_clock: trio.testing.MockClock) -> None:
    class SlowPost:
        @hookimpl
        async def dsh_post_execute(self, execution: ToolExecution, result: Any, next: Next) -> Any:
            await trio.sleep(10)
            return await next()

    runtime = make_runtime(sleeper(1), plugins=[SlowPost()])
    signal = CancelSignal()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancel_after, signal, 5)
        result = await runtime.execute(make_input("sleep", signal=signal))
    assert code(result) == "ABORTED"


async def test_failure_in_post_stage_is_not_replaced_by_cancellation(autojump_clock: trio.testing.MockClock) -> None:
    async def fails(args: Any) -> None:
        raise RuntimeError("tool failed")

    class SlowPost:
        @hookimpl
        async def dsh_post_execute(self, execution: ToolExecution, result: Any, next: Next) -> Any:
            await trio.sleep(10)
            return await next()

    runtime = make_runtime(json_tool("t", fails), plugins=[SlowPost()])
    signal = CancelSignal()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancel_after, signal, 5)
        result = await runtime.execute(make_input("t", signal=signal))
    assert code(result) == "TOOL_ERROR"


async def test_deferred_contexts_stay_on_the_aborted_result(autojump_clock: trio.testing.MockClock) -> None:
    async def body(args: Any, run: ToolRunContext) -> None:
        run.defer_context(UserMessage([TextBlock("kept")], source="t"))
        await trio.sleep(100)

    runtime = make_runtime(json_tool("t", body, output={"type": "null"}))
    signal = CancelSignal()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancel_after, signal, 1)
        result = await runtime.execute(make_input("t", signal=signal))
    assert code(result) == "ABORTED"
    assert [c.content[0].text for c in result.additional_contexts] == ["kept"]  # type: ignore[union-attr]


async def test_outer_trio_cancellation_propagates_after_the_body_drained(
    autojump_clock: trio.testing.MockClock,
) -> None:
    cleanup: list[float] = []
    recorder = Recorder()

    async def body(args: Any, run: ToolRunContext) -> None:
        try:
            await trio.sleep(100)
        finally:
            with trio.CancelScope(shield=True):
                await trio.sleep(1)
                cleanup.append(trio.current_time())

    runtime = make_runtime(json_tool("t", body, output={"type": "null"}), plugins=[recorder])
    with trio.move_on_after(2) as outer:
        await runtime.execute(make_input("t"))
    assert outer.cancelled_caught
    assert cleanup == [pytest.approx(3)]
    assert recorder.results == []  # the caller's own scope cancelled execute() itself


async def test_exactly_one_result_per_call_when_cancelled_at_each_point(autojump_clock: trio.testing.MockClock) -> None:
    recorder = Recorder()

    class SlowPre:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
            await trio.sleep(1)
            return await next()

    class SlowPost:
        @hookimpl
        async def dsh_post_execute(self, execution: ToolExecution, result: Any, next: Next) -> Any:
            await trio.sleep(1)
            return await next()

    runtime = make_runtime(sleeper(1), plugins=[SlowPre(), SlowPost(), recorder])
    expected = {0.5: "ABORTED_BEFORE_DISPATCH", 1.5: "ABORTED", 2.5: "ABORTED", 10: None}
    for at, expected_code in expected.items():
        signal = CancelSignal()
        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(cancel_after, signal, at)
            result = await runtime.execute(make_input("sleep", signal=signal))
            nursery.cancel_scope.cancel()
        assert (result.error.info.code if result.is_error and result.error.info else None) == expected_code
        assert trio.current_time() - start <= max(at, 3) + 1e-9
    assert recorder.hooks.count("dsh_result") == len(expected)


class PostWitness:
    """A post-execute listener recording the code of every result it is shown."""

    def __init__(self) -> None:
        self.seen: list[str | None] = []

    @hookimpl
    async def dsh_post_execute(self, execution: ToolExecution, result: ToolExecutionResult, next: Next) -> Any:
        self.seen.append(code(result) if result.is_error else None)
        return await next()


class SleepingPre:
    @hookimpl
    async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
        await trio.sleep(50)  # interrupted by the runtime's scope
        return await next()


class NoticingPre:
    @hookimpl
    async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
        with trio.CancelScope(shield=True):
            await execution.signal.wait()  # notices, and returns
        return await next()


class AskAlways:
    @hookimpl
    async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
        return Ask()


class SlowApproval:
    async def request(self, execution: ToolExecution, reason: str | None) -> str:
        await trio.sleep(1000)
        return "allowed-once"


async def _noticing_body(args: Any, run: ToolRunContext) -> str:
    with trio.CancelScope(shield=True):
        await run.signal.wait()
    return "done"


async def _sleeping_body(args: Any, run: ToolRunContext) -> str:
    await trio.sleep(100)
    return "done"


WHERE_THE_CANCEL_LANDS = {
    "a body that is interrupted": (_sleeping_body, [], "ABORTED"),
    "a body that notices and returns": (_noticing_body, [], "ABORTED"),
    "a pre-execute listener that is interrupted": (_sleeping_body, [SleepingPre()], "ABORTED_BEFORE_DISPATCH"),
    "a pre-execute listener that notices": (_sleeping_body, [NoticingPre()], "ABORTED_BEFORE_DISPATCH"),
    "an approval that is interrupted": (_sleeping_body, [AskAlways()], "ABORTED_BEFORE_DISPATCH"),
}


@pytest.mark.parametrize("scheduled", [False, True], ids=["execute", "run_tool_calls"])
@pytest.mark.parametrize("where", list(WHERE_THE_CANCEL_LANDS))
async def test_post_execute_sees_an_aborted_call_wherever_the_cancel_landed(
    autojump_clock: trio.testing.MockClock, where: str, scheduled: bool
) -> None:
    from dsh_core import run_tool_calls

    body, plugins, expected = WHERE_THE_CANCEL_LANDS[where]
    witness = PostWitness()
    runtime = make_runtime(
        json_tool("t", body, output={"type": "string"}), plugins=[*plugins, witness], approval=SlowApproval()
    )
    signal = CancelSignal()
    request = make_input("t", signal=signal, agent=Agent("a"))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancel_after, signal, 3)
        result = (await run_tool_calls(runtime, [request]))[0] if scheduled else await runtime.execute(request)
    assert code(result) == expected
    assert witness.seen == [expected]
    assert trio.current_time() == pytest.approx(3)


async def test_a_post_execute_listener_that_awaits_after_the_cancel_is_interrupted(
    autojump_clock: trio.testing.MockClock,
) -> None:
    interrupted: list[str | None] = []

    class AuditsSlowly:
        @hookimpl
        async def dsh_post_execute(self, execution: ToolExecution, result: ToolExecutionResult, next: Next) -> Any:
            try:
                await trio.sleep(10)
            except trio.Cancelled:
                interrupted.append(code(result))
                raise
            return await next()

    runtime = make_runtime(json_tool("t", _sleeping_body, output={"type": "string"}), plugins=[AuditsSlowly()])
    signal = CancelSignal()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancel_after, signal, 3)
        result = await runtime.execute(make_input("t", signal=signal))
    assert code(result) == "ABORTED"
    assert interrupted == ["ABORTED"]
    assert trio.current_time() == pytest.approx(3)


def test_cancel_signal_reason_and_fusion() -> None:
    a, b = CancelSignal(), CancelSignal()
    fused = CancelSignal.any(a, b)
    assert not fused.cancelled and fused.reason is None
    b.cancel("b first")
    a.cancel("a second")
    assert fused.cancelled and fused.reason == "b first"
    assert CancelSignal.any(a) is a
    with pytest.raises(TypeError, match="fires through its sources"):
        fused.cancel()
    # Fused after both fired: still the one that fired first, whatever the argument order.
    assert CancelSignal.any(a, b).reason == "b first"


@pytest.mark.parametrize("other", [1, None, trio.CancelScope()], ids=["int", "None", "cancel-scope"])
def test_fusing_something_that_is_not_a_signal_names_it(other: Any) -> None:
    with pytest.raises(TypeError, match=rf"CancelSignal.any\(\) takes CancelSignals; signals\[1\] is {type(other).__name__}"):
        CancelSignal.any(CancelSignal(), other)


@pytest.mark.parametrize("fires", ["caller", "deadline"])
async def test_fusing_a_signal_with_one_it_already_covers_gives_it_back(
    fires: str, autojump_clock: trio.testing.MockClock
) -> None:
    """What the pipeline does with a wrapper's deadline: re-fusing the caller's signal builds nothing new."""
    caller, deadline = CancelSignal(), CancelSignal.after(5, reason="too slow")
    wrapped = CancelSignal.any(caller, deadline)
    assert CancelSignal.any(caller, wrapped) is wrapped
    assert CancelSignal.any(wrapped, deadline, caller) is wrapped
    bigger = CancelSignal.any(caller, CancelSignal())
    assert CancelSignal.any(wrapped, bigger).sources == (caller, deadline, bigger.sources[1])
    if fires == "caller":
        caller.cancel("stop")
        assert wrapped.cancelled and wrapped.reason == "stop"
    else:
        await wrapped.wait()
        assert trio.current_time() == pytest.approx(5) and wrapped.reason == "too slow"


@pytest.mark.parametrize(
    ("value", "shown"), [("5", "'5'"), (None, "None"), (True, "True"), (float("nan"), "nan")], ids=str
)
async def test_a_deadline_must_be_a_real_number(value: object, shown: str) -> None:
    """A bool would pass as an int and NaN never compares true: both are refused with the rest."""
    with pytest.raises(TypeError) as caught:
        CancelSignal.at(value)  # type: ignore[arg-type]
    assert str(caught.value) == f"CancelSignal.at(deadline): deadline must be a real number, got {shown}"
    with pytest.raises(TypeError) as caught:
        CancelSignal.after(value)  # type: ignore[arg-type]
    assert str(caught.value) == f"CancelSignal.after(seconds): seconds must be a real number, got {shown}"


async def test_deadlines_of_any_size_are_taken(autojump_clock: trio.testing.MockClock) -> None:
    assert not CancelSignal.at(10**400).cancelled
    assert CancelSignal.at(-math.inf).cancelled
    assert not CancelSignal.after(math.inf).cancelled
    assert not CancelSignal.after(10**400).cancelled
    assert CancelSignal.after(-(10**400)).cancelled


def _sleeper_runtime() -> Any:
    async def sleeps(args: Any) -> str:
        await trio.sleep(100)
        return "slept"

    return make_runtime(json_tool("sleeps", sleeps, output={"type": "string"}))


def test_a_deadline_taken_in_one_run_keeps_what_is_left_of_it_in_the_next() -> None:
    """trio's clocks differ per run: a budget read in one run fired at once, or hours late, in the next."""

    async def take_and_spend() -> CancelSignal:
        signal = CancelSignal.after(30, reason="turn budget")
        await trio.sleep(10)
        return signal

    signal = trio.run(take_and_spend, clock=trio.testing.MockClock(autojump_threshold=0))
    runtime = _sleeper_runtime()

    async def use() -> tuple[ToolExecutionResult, float]:
        start = trio.current_time()
        result = await runtime.execute(make_input("sleeps", signal=signal))
        return result, trio.current_time() - start

    later = trio.testing.MockClock(autojump_threshold=0)
    later.jump(123_456)  # another run, another time
    result, spent = trio.run(use, clock=later)
    assert isinstance(result, ToolExecutionFailure) and result.code == "ABORTED"
    assert spent == pytest.approx(20)
    assert signal.cancelled and signal.reason == "turn budget"


def test_a_deadline_taken_outside_any_run_counts_from_when_it_was_taken() -> None:
    signal = CancelSignal.after(30, reason="budget")
    assert not signal.cancelled
    runtime = _sleeper_runtime()

    async def use() -> tuple[ToolExecutionResult, float]:
        start = trio.current_time()
        result = await runtime.execute(make_input("sleeps", signal=signal))
        return result, trio.current_time() - start

    result, spent = trio.run(use, clock=trio.testing.MockClock(autojump_threshold=0))
    assert isinstance(result, ToolExecutionFailure) and result.code == "ABORTED"
    assert 25 < spent <= 30  # what was left of it, real time having passed meanwhile


def test_a_deadline_in_a_later_run_on_the_system_clock_is_as_far_as_it_was() -> None:
    signal = trio.run(_after_60)

    async def far() -> float:
        return signal.deadline - trio.current_time()

    assert 50 < trio.run(far) <= 60  # each run's clock has its own random offset


async def _after_60() -> CancelSignal:
    return CancelSignal.after(60)


def test_a_deadline_first_noticed_in_a_worker_thread_still_reads_as_after_an_earlier_cancel() -> None:
    """Noticed outside the run, the deadline was timed on perf_counter and read as first."""

    async def main() -> tuple[object, object]:
        caller = CancelSignal()
        unsubscribe = caller.subscribe(lambda: None)  # a run listens, as the pipeline does
        deadline = CancelSignal.after(0.2, reason="TIMEOUT")
        fused = CancelSignal.any(caller, deadline)
        caller.cancel("user pressed stop")
        await trio.sleep(1)  # the deadline passes, unnoticed
        in_thread = await trio.to_thread.run_sync(lambda: fused.reason)
        unsubscribe()
        return in_thread, fused.reason

    clock = trio.testing.MockClock(autojump_threshold=0)
    clock.jump(1_000_000)  # a run's clock is far from perf_counter, as a SystemClock's offset makes it
    assert trio.run(main, clock=clock) == ("user pressed stop", "user pressed stop")


async def test_a_fused_signals_wait_is_cancelled_with_a_bare_cancelled(autojump_clock: trio.testing.MockClock) -> None:
    """It waited in a nursery: a cancellation came out wrapped in an exception group."""
    fused = CancelSignal.any(CancelSignal(), CancelSignal.after(100))
    caught: list[str] = []
    with trio.move_on_after(1):
        try:
            await fused.wait()
        except trio.Cancelled:
            caught.append("bare")
            raise
    assert caught == ["bare"] and trio.current_time() == pytest.approx(1)
    await fused.wait()  # and the earliest deadline among its sources still ends it
    assert trio.current_time() == pytest.approx(100) and fused.cancelled


def test_at_outside_a_run_takes_only_never_or_already() -> None:
    with pytest.raises(RuntimeError, match=r"CancelSignal.at\(\) outside a trio run: .* use CancelSignal.after"):
        CancelSignal.at(100.0)
    assert not CancelSignal.at(math.inf).cancelled
    assert CancelSignal.at(-math.inf).cancelled


async def test_cancel_signal_wait_and_deadline(autojump_clock: trio.testing.MockClock) -> None:
    signal = CancelSignal.after(5, reason="too slow")
    await signal.wait()
    assert trio.current_time() == pytest.approx(5)
    assert signal.cancelled and signal.reason == "too slow"
    fused = CancelSignal.any(CancelSignal(), CancelSignal.after(1))
    await fused.wait()
    assert trio.current_time() == pytest.approx(6)


async def test_a_signal_cancelled_from_another_thread_interrupts_the_work() -> None:
    import threading

    signal = CancelSignal()
    started = trio.Event()

    async def waits(args: Any, run: ToolRunContext) -> str:
        started.set()
        await trio.sleep(100)
        return "never"

    runtime = make_runtime(json_tool("t", waits, output={"type": "string"}))
    results: list[ToolExecutionResult] = []
    async with trio.open_nursery() as nursery:

        async def call() -> None:
            results.append(await runtime.execute(make_input("t", signal=signal)))

        nursery.start_soon(call)
        await started.wait()
        with trio.fail_after(5):  # real time: a thread is involved
            thread = threading.Thread(target=signal.cancel, args=("stop from the UI thread",))
            thread.start()
            await trio.to_thread.run_sync(thread.join)
            while not results:
                await trio.sleep(0.01)
    assert code(results[0]) == "ABORTED"
    assert signal.reason == "stop from the UI thread"


async def test_a_raising_signal_listener_does_not_keep_cancellation_from_the_work(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    from dsh_core import run_tool_calls

    signal = CancelSignal()
    signal.subscribe(lambda: 1 / 0)  # someone's broken listener, registered first
    runtime = make_runtime(sleeper(100))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancel_after, signal, 1)
        results = await run_tool_calls(runtime, [make_input("sleep", signal=signal, call_id=f"c{i}") for i in range(3)])
    # One at a time (the tool is exclusive): the running one is interrupted at t=1, the rest never start.
    assert [code(result) for result in results] == ["ABORTED", "ABORTED_BEFORE_DISPATCH", "ABORTED_BEFORE_DISPATCH"]
    assert trio.current_time() == pytest.approx(1)
    assert "CancelSignal listener" in caplog.text and "ZeroDivisionError" in caplog.text


async def test_signal_fusion_edges(autojump_clock: trio.testing.MockClock) -> None:
    with pytest.raises(TypeError, match="at least one signal"):
        CancelSignal.any()
    a, b = CancelSignal.after(1, reason="deadline A"), CancelSignal()
    await trio.sleep(2)
    b.cancel("explicit B")  # after the deadline passed, though nobody looked at it yet
    assert CancelSignal.any(a, b).reason == "deadline A"
    calls: list[str] = []
    c, d = CancelSignal(), CancelSignal()
    CancelSignal.any(c, d).subscribe(lambda: calls.append("fired"))
    c.cancel()
    d.cancel()
    assert calls == ["fired"]  # once, as the fused signal fires once


async def test_a_call_cancelled_while_waiting_for_its_key_runs_no_wrapper(
    autojump_clock: trio.testing.MockClock,
) -> None:
    from dsh_core import run_tool_calls

    wrapped: list[tuple[str, bool]] = []

    class Wrapper:
        @hookimpl
        async def dsh_execute(self, execution: ToolDispatchExecution, next: Next) -> Any:
            wrapped.append((execution.arguments["id"], execution.signal.cancelled))
            return await next()

    async def body(args: Any) -> str:
        await trio.sleep(5)
        return str(args["id"])

    tool = json_tool("k", body, output={"type": "string"}, resource_keys=lambda a: {"write": [a["key"]]})
    runtime = make_runtime(tool, plugins=[Wrapper()])
    stop_b = CancelSignal()
    calls = [
        make_input("k", {"key": "a", "id": "A"}, call_id="A"),
        make_input("k", {"key": "a", "id": "B"}, call_id="B", signal=stop_b),
        make_input("k", {"key": "a", "id": "C"}, call_id="C"),
    ]
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancel_after, stop_b, 1)  # while B waits for A's key
        results = await run_tool_calls(runtime, calls)
    assert [code(r) if r.is_error else r.value for r in results] == ["A", "ABORTED_BEFORE_DISPATCH", "C"]
    # As when the signal fires by the end of stage 5: no wrapper runs for B (one used to, at t=1).
    assert wrapped == [("A", False), ("C", False)]


async def test_a_cross_thread_cancel_after_a_deadline_fired_does_not_read_as_first(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # The cancel's time is read from the run's clock at the cancel call: -inf
    # ("before everything") would make any(...) report it, though the deadline came first.
    caller = CancelSignal()
    caller.subscribe(lambda: None)  # observed in this run, as the runtime's link does
    deadline = CancelSignal.after(1, reason="deadline")
    fused = CancelSignal.any(caller, deadline)
    await trio.sleep(2)
    assert deadline.cancelled
    await trio.to_thread.run_sync(caller.cancel, "late stop from the UI thread")
    assert caller.cancelled
    assert fused.reason == "deadline"


async def test_a_cross_thread_cancel_before_a_deadline_reads_as_first_though_noticed_after_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    caller = CancelSignal()
    caller.subscribe(lambda: None)
    deadline = CancelSignal.after(1, reason="deadline")
    fused = CancelSignal.any(caller, deadline)
    await trio.to_thread.run_sync(caller.cancel, "early stop from the UI thread")
    await trio.sleep(2)  # nobody in the run looked until after the deadline
    assert fused.reason == "early stop from the UI thread"


class DispatchLog:
    """A wrapper that logs each call it sees dispatched (an audit or metrics plugin, say)."""

    def __init__(self) -> None:
        self.dispatched: list[str] = []

    @hookimpl
    async def dsh_execute(self, execution: ToolDispatchExecution, next: Next) -> Any:
        self.dispatched.append(execution.call_id)
        return await next()


class PostSees:
    def __init__(self) -> None:
        self.seen: list[str] = []

    @hookimpl
    async def dsh_post_execute(self, execution: ToolExecution, result: ToolExecutionResult, next: Next) -> Any:
        self.seen.append((code(result) or "?") if result.is_error else "success")
        return await next()


@pytest.mark.parametrize("gate", ["guard", "pre-execute"])
async def test_a_cancel_while_an_allowing_gate_runs_starts_no_wrapper(
    gate: str, autojump_clock: trio.testing.MockClock
) -> None:
    # BEHAVIOUR f.5 step 4: cancelled once the gates allowed -> ABORTED_BEFORE_DISPATCH as a post-result;
    # dispatch does not start, so no dsh_execute wrapper logs the call as dispatched.
    log: list[str] = []
    signal = CancelSignal()
    wrapper, post = DispatchLog(), PostSees()

    class CancelsThenAllows:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
            signal.cancel("user pressed stop")
            return await next()

    plugins: list[object] = [post, wrapper]
    if gate == "pre-execute":
        plugins.append(CancelsThenAllows())
    runtime = make_runtime(sleeper(1, log), plugins=plugins, trace_decisions=True)
    if gate == "guard":

        def guard(execution: ToolExecution) -> None:
            signal.cancel("user pressed stop")

        runtime.guard(guard)
    result = await runtime.execute(make_input("sleep", signal=signal))
    assert code(result) == "ABORTED_BEFORE_DISPATCH"
    assert wrapper.dispatched == [] and log == []
    assert post.seen == ["ABORTED_BEFORE_DISPATCH"]
    trace = trace_of(result)
    assert trace is not None
    assert [(step.stage, step.actor, step.outcome) for step in trace][1:] == [
        ("execute", "dispatch", "cancelled: user pressed stop"),  # why the call ended though its gate allowed it
        ("post", "PostSees-" + format(id(post), "x"), "pass"),
    ]
    assert trace.steps[0].stage == ("guard" if gate == "guard" else "pre")


async def test_a_wrapper_success_after_the_cancel_reaches_post_execute_as_aborted(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # BEHAVIOUR f.6 / f.13: a wrapper that waited and then short-circuited with a success after the caller
    # cancelled: post-execute gets ABORTED_BEFORE_DISPATCH (the body never ran), not the wrapper's success.
    from dsh_core import ToolExecutionSuccess

    signal = CancelSignal()
    log: list[str] = []
    post = PostSees()

    class CacheThatWaits:
        @hookimpl
        async def dsh_execute(self, execution: ToolDispatchExecution, next: Next) -> Any:
            with trio.CancelScope(shield=True):
                await trio.sleep(5)
            return ToolExecutionSuccess(value="cached", content=())

    runtime = make_runtime(sleeper(1, log), plugins=[post, CacheThatWaits()])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancel_after, signal, 1)
        result = await runtime.execute(make_input("sleep", signal=signal))
    assert post.seen == ["ABORTED_BEFORE_DISPATCH"]
    assert code(result) == "ABORTED_BEFORE_DISPATCH" and log == []


async def test_a_cancel_during_post_execute_keeps_each_deferred_context_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # BEHAVIOUR f.13: contexts deferred before a success the cancellation replaces stay on the abort, each once.
    first = UserMessage([TextBlock("image attached")], source="t")
    second = UserMessage([TextBlock("diff attached")], source="t")

    async def body(args: Any, run: ToolRunContext) -> str:
        run.defer_context(first)
        run.defer_context(second)
        return "done"

    class SlowPost:
        @hookimpl
        async def dsh_post_execute(self, execution: ToolExecution, result: Any, next: Next) -> Any:
            await trio.sleep(10)
            return await next()

    runtime = make_runtime(json_tool("t", body, output={"type": "string"}), plugins=[SlowPost()])
    signal = CancelSignal()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancel_after, signal, 5)
        result = await runtime.execute(make_input("t", signal=signal))
    assert code(result) == "ABORTED"
    assert [c.content[0].text for c in result.additional_contexts] == ["image attached", "diff attached"]  # type: ignore[union-attr]


def test_a_session_long_signal_interrupts_a_call_in_every_later_trio_run() -> None:
    """It kept the first run's token: in a later run, cancel() posted to the finished run and the body ran on."""
    signal = CancelSignal()

    async def slow(args: Any, run: ToolRunContext) -> str:
        await trio.sleep(5)
        return "finished"

    runtime = make_runtime(json_tool("slow", slow, output={"type": "string"}))

    async def turn(cancel_after: float | None) -> tuple[ToolExecutionResult, float]:
        async with trio.open_nursery() as nursery:
            if cancel_after is not None:

                async def stop() -> None:
                    await trio.sleep(cancel_after)
                    signal.cancel("user pressed stop")

                nursery.start_soon(stop)
            started = trio.current_time()
            result = await runtime.execute(make_input("slow", signal=signal))
            return result, trio.current_time() - started

    first, _ = trio.run(turn, None, clock=trio.testing.MockClock(autojump_threshold=0))
    assert first.value == "finished"
    second, took = trio.run(turn, 0.1, clock=trio.testing.MockClock(autojump_threshold=0))
    assert code(second) == "ABORTED" and took == pytest.approx(0.1)


def test_a_signal_waited_for_in_one_trio_run_can_be_waited_for_in_the_next() -> None:
    signal = CancelSignal()

    async def wait_briefly() -> None:
        with trio.move_on_after(1):
            await signal.wait()

    trio.run(wait_briefly, clock=trio.testing.MockClock(autojump_threshold=0))

    async def wait_for_stop() -> float:
        with trio.fail_after(10):  # virtual time: a wait that is never woken fails instead of hanging
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_cancel_later, signal, 0.5)
                await signal.wait()
                return trio.current_time()

    assert trio.run(wait_for_stop, clock=trio.testing.MockClock(autojump_threshold=0)) == pytest.approx(0.5)


async def _cancel_later(signal: CancelSignal, seconds: float) -> None:
    await trio.sleep(seconds)
    signal.cancel()


def test_a_signal_shared_by_runs_in_two_threads_wakes_both() -> None:
    """Rebound to the run that listened last, the signal woke only that one: the other run's wait hung."""
    import threading
    import time

    signal = CancelSignal()
    waiting, linked = threading.Event(), threading.Event()
    outcome: dict[str, str] = {}

    def waits() -> None:
        async def main() -> None:
            waiting.set()
            with trio.move_on_after(10) as scope:  # real time: threads are involved
                await signal.wait()
            outcome["waits"] = "timed out" if scope.cancelled_caught else "woke"

        trio.run(main)

    def links() -> None:
        async def main() -> None:
            with trio.CancelScope() as scope:
                signal.link(scope)
                linked.set()
                with trio.move_on_after(10):
                    await trio.sleep_forever()
            outcome["links"] = "cancelled" if scope.cancelled_caught else "not cancelled"

        trio.run(main)

    first = threading.Thread(target=waits)
    first.start()
    assert waiting.wait(10)
    time.sleep(0.1)  # let the first run reach its wait
    second = threading.Thread(target=links)
    second.start()
    assert linked.wait(10)
    signal.cancel("stop")
    first.join(15)
    second.join(15)
    assert outcome == {"waits": "woke", "links": "cancelled"}


def test_a_listener_of_a_signal_fired_meanwhile_is_called_at_once() -> None:
    """A cancel from another thread landing between a caller's check and its subscribe woke nothing."""
    signal = CancelSignal()
    signal.cancel("stop")  # as if fired by another thread just after the caller looked
    heard: list[str] = []
    signal.subscribe(lambda: heard.append("stop"))
    assert heard == ["stop"]
