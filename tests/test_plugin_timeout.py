"""The timeout policy (dsh_plugins.timeout): deadlines on trio's clock, never abandoning the body."""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
import trio.testing

from dsh_core import (
    CancelSignal,
    ConfigError,
    DshError,
    TextBlock,
    ToolDispatchExecution,
    ToolExecutionResult,
    ToolRunContext,
    ToolRuntime,
    hookimpl,
)
from dsh_core.code_mode import CodeRunResult
from dsh_core.testing import FakeCodeRuntime, expect_failure, json_tool, make_input, make_runtime
from dsh_plugins import timeout

Next = Callable[[], Awaitable[ToolExecutionResult]]


def with_timeout(*tools: Any, config: dict[str, Any] | None = None) -> ToolRuntime:
    runtime = make_runtime(*tools)
    timeout.dsh_setup(runtime, config or {})
    return runtime


def sleeper(name: str = "slow", seconds: float = 100, **options: Any) -> Any:
    async def body(args: Any) -> str:
        await trio.sleep(seconds)
        return "done"

    return json_tool(name, body, **options)



async def test_cooperative_body_times_out_exactly_at_the_budget(autojump_clock: trio.testing.MockClock) -> None:
    runtime = with_timeout(sleeper(timeout_ms=500))
    start = trio.current_time()
    result = expect_failure(await runtime.execute(make_input("slow")))
    assert trio.current_time() - start == pytest.approx(0.5)
    assert result.code == "TOOL_TIMEOUT"
    assert result.error.info is not None and result.error.info.name == "ToolTimeoutError"
    assert result.error.info.plugin == "timeout-policy"
    assert result.error.message == "tool call timed out after 500ms"
    assert result.content == (TextBlock("Error: tool call timed out after 500ms"),)


async def test_body_that_shields_its_cleanup_is_awaited_past_the_deadline(
    autojump_clock: trio.testing.MockClock,
) -> None:
    cleanup: list[float] = []

    async def stubborn(args: Any) -> str:
        try:
            await trio.sleep(100)
        finally:
            with trio.CancelScope(shield=True):
                await trio.sleep(2)
            cleanup.append(trio.current_time())
        return "unreachable"

    runtime = with_timeout(json_tool("stubborn", stubborn, timeout_ms=1000))
    start = trio.current_time()
    result = expect_failure(await runtime.execute(make_input("stubborn")))
    assert trio.current_time() - start == pytest.approx(3.0)
    assert cleanup and cleanup[0] - start == pytest.approx(3.0)
    assert result.code == "TOOL_TIMEOUT"


async def test_success_returned_after_the_deadline_becomes_a_timeout(autojump_clock: trio.testing.MockClock) -> None:
    async def ignores_signal(args: Any) -> str:
        with trio.CancelScope(shield=True):
            await trio.sleep(1)
        return "late"

    runtime = with_timeout(json_tool("late", ignores_signal, timeout_ms=500))
    assert expect_failure(await runtime.execute(make_input("late"))).code == "TOOL_TIMEOUT"


async def test_tool_without_budget_sees_the_callers_own_signal() -> None:
    seen: list[CancelSignal] = []

    async def body(args: Any, run: ToolRunContext) -> str:
        seen.append(run.signal)
        return "ok"

    runtime = with_timeout(json_tool("free", body))
    request = make_input("free")
    result = await runtime.execute(request)
    assert not result.is_error
    assert seen == [request.signal] and seen[0] is request.signal


async def test_tool_with_budget_sees_a_signal_carrying_the_deadline(autojump_clock: trio.testing.MockClock) -> None:
    seen: list[CancelSignal] = []

    async def body(args: Any, run: ToolRunContext) -> str:
        seen.append(run.signal)
        return "ok"

    runtime = with_timeout(json_tool("bounded", body, timeout_ms=250))
    request = make_input("bounded")
    start = trio.current_time()
    assert not (await runtime.execute(request)).is_error
    assert seen[0] is not request.signal
    assert seen[0].deadline == pytest.approx(start + 0.25)


async def test_caller_cancel_before_the_deadline_is_aborted_not_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runtime = with_timeout(sleeper(timeout_ms=500))
    signal = CancelSignal()
    async with trio.open_nursery() as nursery:

        async def cancel_soon() -> None:
            await trio.sleep(0.1)
            signal.cancel("user pressed stop")

        nursery.start_soon(cancel_soon)
        start = trio.current_time()
        result = expect_failure(await runtime.execute(make_input("slow", signal=signal)))
    assert trio.current_time() - start == pytest.approx(0.1)
    assert result.code == "ABORTED"


async def test_caller_cancel_first_stays_aborted_even_if_cleanup_outlasts_the_budget(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def slow_cleanup(args: Any) -> str:
        try:
            await trio.sleep(100)
        finally:
            with trio.CancelScope(shield=True):
                await trio.sleep(5)
        return "unreachable"

    runtime = with_timeout(json_tool("t", slow_cleanup, timeout_ms=500))
    signal = CancelSignal()
    async with trio.open_nursery() as nursery:

        async def cancel_soon() -> None:
            await trio.sleep(0.1)
            signal.cancel()

        nursery.start_soon(cancel_soon)
        result = expect_failure(await runtime.execute(make_input("t", signal=signal)))
    assert result.code == "ABORTED"


async def test_caller_cancel_first_stays_aborted_when_the_body_ignores_it_past_the_budget(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def oblivious(args: Any) -> str:
        with trio.CancelScope(shield=True):
            await trio.sleep(2)
        return "finished anyway"

    runtime = with_timeout(json_tool("t", oblivious, timeout_ms=500))
    signal = CancelSignal()
    async with trio.open_nursery() as nursery:

        async def cancel_soon() -> None:
            await trio.sleep(0.1)
            signal.cancel()

        nursery.start_soon(cancel_soon)
        result = expect_failure(await runtime.execute(make_input("t", signal=signal)))
    assert result.code == "ABORTED"


def cancel_from_another_thread(signal: CancelSignal, reason: str) -> None:
    """Fire ``signal`` from a real other thread (a UI thread), blocking the trio loop until it has."""
    thread = threading.Thread(target=signal.cancel, args=(reason,))
    thread.start()
    thread.join()


async def test_a_cross_thread_cancel_before_the_deadline_is_aborted_though_the_body_held_the_loop_past_it() -> None:
    # Real time: the body blocks the loop (sync work) for 250 ms past a 200 ms
    # budget; the caller's cancel came at once, from another thread, so the run
    # hears of it only after the deadline. Who came first decides (BEHAVIOUR.md §j).
    signal = CancelSignal()

    async def blocking(args: Any) -> str:
        cancel_from_another_thread(signal, "user pressed stop")
        time.sleep(0.25)
        await trio.sleep(0)
        return "done"

    runtime = with_timeout(json_tool("slow", blocking, timeout_ms=200))
    result = expect_failure(await runtime.execute(make_input("slow", signal=signal)))
    assert result.code == "ABORTED"
    assert result.error.message == "tool call aborted"


@pytest.mark.parametrize("cancel_first", [True, False])
async def test_a_cross_thread_cancel_is_timed_when_it_was_made_not_when_the_run_hears_of_it(
    autojump_clock: trio.testing.MockClock, cancel_first: bool
) -> None:
    signal = CancelSignal()

    async def blocking(args: Any) -> str:
        # Holding the loop: the clock moves past the 500 ms budget without a checkpoint.
        if cancel_first:
            cancel_from_another_thread(signal, "user pressed stop")
            autojump_clock.jump(1)
        else:
            autojump_clock.jump(1)
            cancel_from_another_thread(signal, "user pressed stop")
        await trio.sleep(0)
        return "done"

    runtime = with_timeout(json_tool("slow", blocking, timeout_ms=500))
    result = expect_failure(await runtime.execute(make_input("slow", signal=signal)))
    assert result.code == ("ABORTED" if cancel_first else "TOOL_TIMEOUT")


class CheckpointingPost:
    """A post-execute listener that checkpoints (so a pending cancellation would be delivered there)."""

    @hookimpl
    async def dsh_post_execute(self, execution: Any, result: Any, next: Callable[[], Awaitable[Any]]) -> Any:
        await trio.sleep(0)
        return await next()


@pytest.mark.parametrize("post_listener", [False, True])
async def test_timeout_first_stays_timeout_when_the_caller_cancels_during_cleanup(
    autojump_clock: trio.testing.MockClock, post_listener: bool
) -> None:
    async def slow_cleanup(args: Any) -> str:
        try:
            await trio.sleep(100)
        finally:
            with trio.CancelScope(shield=True):
                await trio.sleep(5)
        return "unreachable"

    runtime = with_timeout(json_tool("t", slow_cleanup, timeout_ms=500))
    if post_listener:
        runtime.plugins.register(CheckpointingPost())
    signal = CancelSignal()
    async with trio.open_nursery() as nursery:

        async def cancel_late() -> None:
            await trio.sleep(2)  # after the 0.5 s deadline, while the body cleans up
            signal.cancel()

        nursery.start_soon(cancel_late)
        result = expect_failure(await runtime.execute(make_input("t", signal=signal)))
    assert result.code == "TOOL_TIMEOUT"


async def test_failure_from_the_body_before_the_deadline_stays(autojump_clock: trio.testing.MockClock) -> None:
    async def broken(args: Any) -> str:
        await trio.sleep(0.1)
        raise DshError("disk on fire", code="DISK_ON_FIRE")

    runtime = with_timeout(json_tool("broken", broken, timeout_ms=500))
    result = expect_failure(await runtime.execute(make_input("broken")))
    assert result.code == "DISK_ON_FIRE"
    assert result.error.message == "disk on fire"


async def test_success_before_the_deadline_is_returned_unchanged(autojump_clock: trio.testing.MockClock) -> None:
    runtime = with_timeout(sleeper(seconds=0.4, timeout_ms=500))
    result = await runtime.execute(make_input("slow"))
    assert not result.is_error and result.value == "done"


async def test_config_default_ms_bounds_tools_without_their_own(autojump_clock: trio.testing.MockClock) -> None:
    runtime = with_timeout(sleeper("plain"), sleeper("own", timeout_ms=1000), config={"default_ms": 300})
    start = trio.current_time()
    plain = expect_failure(await runtime.execute(make_input("plain")))
    assert trio.current_time() - start == pytest.approx(0.3)
    assert plain.error.message == "tool call timed out after 300ms"
    own = expect_failure(await runtime.execute(make_input("own")))
    assert own.error.message == "tool call timed out after 1000ms"


async def test_without_default_ms_a_tool_without_budget_runs_to_completion(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runtime = with_timeout(sleeper("plain", seconds=3600))
    assert not (await runtime.execute(make_input("plain"))).is_error


async def test_two_runtimes_do_not_share_settings(autojump_clock: trio.testing.MockClock) -> None:
    short = with_timeout(sleeper(seconds=1), config={"default_ms": 100})
    unbounded = with_timeout(sleeper(seconds=1))
    assert expect_failure(await short.execute(make_input("slow"))).code == "TOOL_TIMEOUT"
    assert not (await unbounded.execute(make_input("slow"))).is_error


@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        ({"default_ms": -1}, "positive finite"),
        ({"default_ms": 0}, "positive finite"),
        ({"default_ms": float("inf")}, "default_ms: expected a finite number (TOML's nan and inf are not), got inf"),
        ({"default_ms": float("nan")}, "default_ms: expected a finite number (TOML's nan and inf are not), got nan"),
        ({"default_ms": True}, "expected a number"),
        ({"default_ms": 3e9}, "maximum of 2147483647 ms"),
        ({"default_ms": "30s"}, "expected a number"),
        ({"deafult_ms": 10}, 'unknown key "deafult_ms"'),
    ],
)
def test_bad_config_is_refused_with_the_table_path(config: dict[str, Any], fragment: str) -> None:
    runtime = make_runtime()
    with pytest.raises(ConfigError, match=r"\[plugins\.timeout\]") as caught:
        timeout.dsh_setup(runtime, config)
    assert fragment in str(caught.value)
    assert runtime.plugins.get_plugin("timeout-policy") is None


async def test_budget_above_the_maximum_fails_the_call_clearly_without_running_it() -> None:
    ran: list[bool] = []

    async def body(args: Any) -> str:
        ran.append(True)
        return "ok"

    runtime = with_timeout(json_tool("forever", body, timeout_ms=3e9), json_tool("beyond", body, timeout_ms=10**400))
    result = expect_failure(await runtime.execute(make_input("forever")))
    assert result.code == "POLICY_ERROR"
    assert result.error.info is not None and result.error.info.plugin == "timeout-policy"
    assert 'tool "forever" timeout_ms = 3000000000 ms exceeds' in result.error.message
    # An int beyond any float: the same clear failure, not an OverflowError from formatting it.
    beyond = expect_failure(await runtime.execute(make_input("beyond")))
    assert beyond.code == "POLICY_ERROR"
    assert 'tool "beyond" timeout_ms = about 2**1328 ms exceeds' in beyond.error.message
    assert ran == []


class SignalSpy:
    """A dsh_execute wrapper recording ``execution.signal`` before, during (inner) and after ``next()``."""

    def __init__(self, log: list[tuple[str, CancelSignal]], label: str, **marks: bool) -> None:
        async def dsh_execute(execution: ToolDispatchExecution, next: Next) -> ToolExecutionResult:
            log.append((f"{label}:before", execution.signal))
            try:
                return await next()
            finally:
                log.append((f"{label}:after", execution.signal))

        self.dsh_execute = hookimpl(**marks)(dsh_execute)


async def test_execution_signal_is_restored_after_next(autojump_clock: trio.testing.MockClock) -> None:
    log: list[tuple[str, CancelSignal]] = []
    runtime = make_runtime(sleeper(seconds=0.1, timeout_ms=500), plugins=[SignalSpy(log, "outer")])
    timeout.dsh_setup(runtime, {})
    # A trylast plugin registered after the timeout policy sits inside it.
    runtime.plugins.register(SignalSpy(log, "inner", trylast=True))
    request = make_input("slow")
    start = trio.current_time()
    assert not (await runtime.execute(request)).is_error
    signals = dict(log)
    assert [label for label, _ in log] == ["outer:before", "inner:before", "inner:after", "outer:after"]
    assert signals["outer:before"] is request.signal
    assert signals["outer:after"] is request.signal
    assert signals["inner:before"] is not request.signal
    assert signals["inner:before"].deadline == pytest.approx(start + 0.5)


async def test_execution_signal_is_restored_when_an_inner_wrapper_raises() -> None:
    log: list[tuple[str, CancelSignal]] = []

    class Raising:
        @hookimpl(trylast=True)
        async def dsh_execute(self, execution: ToolDispatchExecution, next: Next) -> ToolExecutionResult:
            raise RuntimeError("inner wrapper broke")

    runtime = make_runtime(json_tool("t", timeout_ms=500), plugins=[SignalSpy(log, "outer")])
    timeout.dsh_setup(runtime, {})
    runtime.plugins.register(Raising(), name="raising")
    request = make_input("t")
    result = expect_failure(await runtime.execute(request))
    assert result.error.info is not None and result.error.info.plugin == "raising"
    assert dict(log)["outer:after"] is request.signal


async def test_time_spent_in_outer_wrappers_does_not_count_against_the_budget(
    autojump_clock: trio.testing.MockClock,
) -> None:
    class Queue:
        @hookimpl
        async def dsh_execute(self, execution: ToolDispatchExecution, next: Next) -> ToolExecutionResult:
            await trio.sleep(2)  # e.g. waiting for a concurrency slot
            return await next()

    # Registered before the policy: as a plain listener the policy would then be outermost.
    runtime = make_runtime(sleeper(seconds=0.1, timeout_ms=500), plugins=[Queue()])
    timeout.dsh_setup(runtime, {})
    assert not (await runtime.execute(make_input("slow"))).is_error


async def test_an_earlier_outer_deadline_reads_as_a_plain_cancellation(
    autojump_clock: trio.testing.MockClock,
) -> None:
    class OuterDeadline:
        @hookimpl
        async def dsh_execute(self, execution: ToolDispatchExecution, next: Next) -> ToolExecutionResult:
            saved = execution.signal
            execution.signal = CancelSignal.any(saved, CancelSignal.after(0.2, reason="outer budget"))
            try:
                return await next()
            finally:
                execution.signal = saved

    async def slow_cleanup(args: Any) -> str:
        try:
            await trio.sleep(100)
        finally:
            with trio.CancelScope(shield=True):
                await trio.sleep(1)  # still unwinding when this policy's own 0.5 s budget passes
        return "unreachable"

    runtime = with_timeout(json_tool("t", slow_cleanup, timeout_ms=500))
    runtime.plugins.register(OuterDeadline())
    start = trio.current_time()
    result = expect_failure(await runtime.execute(make_input("t")))
    assert trio.current_time() - start == pytest.approx(1.2)
    assert result.code == "ABORTED"


async def test_parallel_calls_each_get_their_own_deadline(autojump_clock: trio.testing.MockClock) -> None:
    runtime = with_timeout(sleeper("a", seconds=0.3, timeout_ms=500), sleeper("b", seconds=1, timeout_ms=500))
    results: dict[str, ToolExecutionResult] = {}

    async def run(name: str) -> None:
        results[name] = await runtime.execute(make_input(name))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run, "a")
        nursery.start_soon(run, "b")
    assert not results["a"].is_error
    assert expect_failure(results["b"]).code == "TOOL_TIMEOUT"


def test_setup_registers_one_fresh_instance_per_runtime() -> None:
    first, second = make_runtime(), make_runtime()
    timeout.dsh_setup(first, {})
    timeout.dsh_setup(second, {"default_ms": 5})
    a = first.plugins.get_plugin("timeout-policy")
    b = second.plugins.get_plugin("timeout-policy")
    assert isinstance(a, timeout.TimeoutPolicy) and isinstance(b, timeout.TimeoutPolicy)
    assert a is not b
    assert a.runtime is first and b.settings.default_ms == 5


async def test_a_body_that_cannot_suspend_still_sees_its_deadline_and_times_out(
    mock_clock: trio.testing.MockClock,
) -> None:
    seen: list[bool] = []

    def busy(args: Any, run: ToolRunContext) -> str:
        # A plain def body cannot be interrupted; it runs past its budget and polls the signal.
        seen.append(run.signal.cancelled)
        mock_clock.jump(0.6)
        seen.append(run.signal.cancelled)
        return "done"

    runtime = with_timeout(json_tool("busy", busy, timeout_ms=500))
    assert runtime.get("busy").inline
    result = expect_failure(await runtime.execute(make_input("busy")))
    assert seen == [False, True]
    assert result.code == "TOOL_TIMEOUT"


async def test_a_wrapper_is_told_whether_the_dispatch_can_suspend() -> None:
    seen: dict[str, bool] = {}

    class Watch:
        @hookimpl
        async def dsh_execute(self, execution: ToolDispatchExecution, next: Next) -> ToolExecutionResult:
            seen[execution.name] = execution.may_suspend
            return await next()

    async def instant(args: Any) -> str:
        return "now"

    runtime = make_runtime(json_tool("instant", instant), sleeper("slow", 0), plugins=[Watch()])
    await runtime.execute(make_input("instant"))
    await runtime.execute(make_input("slow"))
    assert seen == {"instant": False, "slow": True}


# -- Code Mode ------------------------------------------------------------------------------


def code_mode_runtime(program: Any, *tools: Any, config: dict[str, Any]) -> ToolRuntime:
    runtime = ToolRuntime(mode="code", code_runtime=FakeCodeRuntime(program))
    for tool in tools:
        runtime.register(tool)
    timeout.dsh_setup(runtime, config)
    return runtime


def run_code_input() -> Any:
    return make_input("run_code", {"code": "...", "description": "timed"}, call_id="outer")


async def test_a_sub_call_past_its_own_budget_times_out_inside_the_program(
    autojump_clock: trio.testing.MockClock,
) -> None:
    outcomes: list[str] = []

    async def program(tools: Any) -> CodeRunResult:
        try:
            await tools["slow"]({})
        except Exception as error:
            outcomes.append(str(error))
        outcomes.append(await tools["fast"]({}))
        return CodeRunResult(value=outcomes, has_value=True)

    runtime = code_mode_runtime(
        program, sleeper("slow", timeout_ms=2000), sleeper("fast", seconds=1, output={"type": "string"}), config={}
    )
    result = await runtime.execute(run_code_input())
    assert not result.is_error
    assert outcomes == ["tool call timed out after 2000ms", "done"]
    assert trio.current_time() == pytest.approx(3)


async def test_the_run_codes_own_deadline_aborts_the_sub_call_in_flight(autojump_clock: trio.testing.MockClock) -> None:
    seen: list[str | None] = []

    class Outcomes:
        @hookimpl
        def dsh_result(self, execution: Any, result: ToolExecutionResult) -> None:
            if execution.parent is not None:
                seen.append(result.error.info.code if result.is_error and result.error.info else None)

    async def program(tools: Any) -> CodeRunResult:
        await tools["slow"]({})
        return CodeRunResult()

    runtime = code_mode_runtime(program, sleeper("slow", timeout_ms=10_000), config={"default_ms": 5000})
    runtime.plugins.register(Outcomes())
    result = expect_failure(await runtime.execute(run_code_input()))
    assert result.code == "TOOL_TIMEOUT"
    assert result.error.message == "tool call timed out after 5000ms"
    assert seen == ["ABORTED"]  # the sub-call was stopped by the run's end, not by a budget of its own
    assert trio.current_time() == pytest.approx(5)


@pytest.mark.parametrize(
    ("written", "shown"),
    [("-1", "got -1"), ("-2.5", "got -2.5"), ("0", "got 0"), ("-1e400", "got -inf"), ("nan", "got nan")],
)
def test_a_bad_default_is_quoted_as_written(written: str, shown: str) -> None:
    """The table's ``-1`` reached the check as ``-1.0``, and the message quoted a number the file does not hold."""
    import tomllib

    from dsh_core import ConfigError, structure_table
    from dsh_plugins.timeout import TimeoutSettings

    with pytest.raises(ConfigError) as caught:
        structure_table(TimeoutSettings, tomllib.loads(f"default_ms = {written}"), "[plugins.timeout]")
    assert str(caught.value).endswith(shown), caught.value


def test_a_huge_negative_budget_keeps_its_sign() -> None:
    from dsh_plugins.timeout import format_ms

    assert format_ms(-(10**400)) == "about -2**1328" and format_ms(10**400) == "about 2**1328"
