"""Retrying a tool body (``RetryPolicy``): which failures, how long between attempts, and what stops it.

Every pause runs on trio's clock, so these tests use pytest-trio's
``autojump_clock`` and read the elapsed virtual time to check the schedule.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from dsh_core import (
    AttemptTimedOut,
    CancelSignal,
    ErrorCode,
    RetryPolicy,
    SessionLog,
    SessionRecorder,
    TextBlock,
    ToolRunContext,
    ToolRuntime,
    TransientToolError,
    UserMessage,
    define_tool,
    hookimpl,
    read_session_log,
    run_tool_calls,
)
from dsh_core.testing import FakeCodeRuntime, expect_failure, expect_success, json_tool, make_input, make_runtime
from dsh_plugins import timeout
from dsh_plugins.ledger import EffectLedger
from dsh_plugins.undo import UndoLog

EXACT = RetryPolicy(max_attempts=3, initial_delay_s=0.5, multiplier=2.0, jitter=0)


class Flaky:
    """A tool body that raises the given errors in turn, then returns ``value``; it records when it ran."""

    def __init__(self, *errors: BaseException, value: Any = "ok", hang: bool = False) -> None:
        self.errors = list(errors)
        self.value = value
        self.hang = hang
        self.started: list[float] = []

    async def __call__(self, args: Any, run: ToolRunContext) -> Any:
        self.started.append(trio.current_time())
        await trio.sleep(0)
        if self.errors:
            error = self.errors.pop(0)
            if error is HANG:
                await trio.sleep_forever()
            raise error
        return self.value


HANG = Exception("hang")  # a marker: this attempt never returns on its own




async def test_a_transient_failure_is_retried_with_exponential_backoff(autojump_clock: trio.testing.MockClock) -> None:
    body = Flaky(TransientToolError("busy"), TransientToolError("still busy"))
    runtime = make_runtime(json_tool("fetch", body, retry=EXACT))
    result = expect_success(await runtime.execute(make_input("fetch")))
    assert result.value == "ok"
    start = body.started[0]
    assert [round(t - start, 6) for t in body.started] == [0, 0.5, 1.5]


async def test_the_last_failure_says_how_many_attempts_it_took(autojump_clock: trio.testing.MockClock) -> None:
    body = Flaky(*(TransientToolError(f"busy {n}") for n in range(3)))
    runtime = make_runtime(json_tool("fetch", body, retry=EXACT))
    result = expect_failure(await runtime.execute(make_input("fetch")))
    assert len(body.started) == 3
    assert result.error.message == "busy 2 (after 3 attempts)"
    assert result.content == (TextBlock("Error: busy 2 (after 3 attempts)"),)
    assert result.code == ErrorCode.TOOL_ERROR
    assert result.error.info is not None and result.error.info.name == "TransientToolError"


async def test_a_failure_the_policy_does_not_name_is_not_retried(autojump_clock: trio.testing.MockClock) -> None:
    body = Flaky(ValueError("bad input"))
    runtime = make_runtime(json_tool("fetch", body, retry=EXACT))
    result = expect_failure(await runtime.execute(make_input("fetch")))
    assert len(body.started) == 1
    assert result.error.message == "bad input"  # one attempt: nothing to add
    assert result.error.info is not None and result.error.info.name == "ValueError"


async def test_a_failure_after_retries_that_is_not_transient_ends_them(autojump_clock: trio.testing.MockClock) -> None:
    body = Flaky(ConnectionError("reset"), KeyError("gone"), value="never")
    runtime = make_runtime(json_tool("fetch", body, retry=EXACT))
    result = expect_failure(await runtime.execute(make_input("fetch")))
    assert len(body.started) == 2
    assert result.error.message.endswith("(after 2 attempts)")
    assert result.error.info is not None and result.error.info.name == "KeyError"


@pytest.mark.parametrize("error", [ConnectionResetError("reset"), TimeoutError("slow socket"), TransientToolError("x")])
async def test_the_default_policy_retries_dropped_connections_and_socket_timeouts(
    autojump_clock: trio.testing.MockClock, error: Exception
) -> None:
    body = Flaky(error)
    runtime = make_runtime(json_tool("fetch", body, retry=RetryPolicy()))
    assert expect_success(await runtime.execute(make_input("fetch"))).value == "ok"
    assert len(body.started) == 2


async def test_retry_on_replaces_the_default_classes(autojump_clock: trio.testing.MockClock) -> None:
    policy = attrs.evolve(EXACT, retry_on=(LookupError,))
    runtime = make_runtime(
        json_tool("lookup", Flaky(KeyError("k")), retry=policy),
        json_tool("connect", Flaky(ConnectionError("c")), retry=policy),
    )
    assert expect_success(await runtime.execute(make_input("lookup"))).value == "ok"
    assert expect_failure(await runtime.execute(make_input("connect"))).error.message == "c"


async def test_a_single_class_is_accepted_for_retry_on() -> None:
    assert RetryPolicy(retry_on=KeyError).retry_on == (KeyError,)


async def test_max_attempts_of_one_never_retries(autojump_clock: trio.testing.MockClock) -> None:
    body = Flaky(TransientToolError("busy"))
    runtime = make_runtime(json_tool("fetch", body, retry=RetryPolicy(max_attempts=1)))
    assert expect_failure(await runtime.execute(make_input("fetch"))).error.message == "busy"
    assert len(body.started) == 1


async def test_retry_after_lengthens_the_pause(autojump_clock: trio.testing.MockClock) -> None:
    body = Flaky(TransientToolError("rate limited", retry_after_s=5))
    runtime = make_runtime(json_tool("fetch", body, retry=EXACT))
    expect_success(await runtime.execute(make_input("fetch")))
    assert body.started[1] - body.started[0] == pytest.approx(5)


async def test_retry_after_past_the_longest_pause_fails_now(autojump_clock: trio.testing.MockClock) -> None:
    body = Flaky(TransientToolError("come back tomorrow", retry_after_s=86_400))
    runtime = make_runtime(json_tool("fetch", body, retry=EXACT))
    result = expect_failure(await runtime.execute(make_input("fetch")))
    assert len(body.started) == 1
    assert result.error.message == "come back tomorrow"
    assert trio.current_time() - body.started[0] < 1


async def test_the_pause_never_exceeds_max_delay(autojump_clock: trio.testing.MockClock) -> None:
    policy = RetryPolicy(max_attempts=4, initial_delay_s=10, multiplier=10, max_delay_s=15, jitter=0)
    body = Flaky(*(TransientToolError("busy") for _ in range(3)))
    runtime = make_runtime(json_tool("fetch", body, retry=policy))
    expect_success(await runtime.execute(make_input("fetch")))
    gaps = [round(b - a, 6) for a, b in zip(body.started, body.started[1:], strict=False)]
    assert gaps == [10, 15, 15]


def test_jitter_takes_off_at_most_its_fraction_of_the_pause() -> None:
    policy = RetryPolicy(initial_delay_s=2, jitter=0.25)
    error = TransientToolError("busy")
    assert policy.pause_before(2, error, uniform=lambda: 0.0) == 2
    assert policy.pause_before(2, error, uniform=lambda: 1.0) == 1.5
    assert policy.pause_before(3, error, uniform=lambda: 0.5) == pytest.approx(4 * (1 - 0.125))
    assert policy.pause_before(4, error) is None  # past max_attempts (3)


@pytest.mark.parametrize("multiplier", [2000, 2000.0])
def test_a_steep_backoff_stays_at_the_cap_instead_of_overflowing(multiplier: float) -> None:
    policy = RetryPolicy(max_attempts=100, initial_delay_s=0.001, multiplier=multiplier, max_delay_s=1, jitter=0)
    error = TransientToolError("busy")
    assert policy.pause_before(2, error) == 0.001
    assert policy.pause_before(3, error) == 1  # 2 s, capped
    assert policy.pause_before(100, error) == 1  # 2000 ** 98 is past any float


async def test_a_hundred_steep_attempts_end_in_the_bodys_failure(autojump_clock: trio.testing.MockClock) -> None:
    body = Flaky(*(TransientToolError("busy") for _ in range(100)))
    policy = RetryPolicy(max_attempts=100, initial_delay_s=0.001, multiplier=2000, max_delay_s=1, jitter=0)
    runtime = make_runtime(json_tool("fetch", body, retry=policy))
    result = expect_failure(await runtime.execute(make_input("fetch")))
    assert result.error.message == "busy (after 100 attempts)"
    assert len(body.started) == 100


def test_jitter_never_shortens_a_pause_the_service_asked_for() -> None:
    policy = RetryPolicy(initial_delay_s=2, jitter=1.0)
    assert policy.pause_before(2, TransientToolError("busy", retry_after_s=3), uniform=lambda: 1.0) == 3


class RateLimited(TransientToolError):
    """A transient error with an ``__init__`` of its own that never sets ``retry_after_s``."""

    def __init__(self, status: int) -> None:
        Exception.__init__(self, f"HTTP {status}")
        self.status = status


class ShyRetryAfter(TransientToolError):
    """A transient error whose ``retry_after_s`` cannot even be read."""

    @property  # type: ignore[override]
    def retry_after_s(self) -> float:
        raise KeyError("Retry-After")

    @retry_after_s.setter
    def retry_after_s(self, value: object) -> None:
        pass


def _asking(seconds: object) -> TransientToolError:
    """A transient error with ``retry_after_s`` set after construction, past its check (a raw header)."""
    error = TransientToolError("rate limited")
    error.retry_after_s = seconds  # type: ignore[assignment]
    return error


async def test_a_transient_subclass_without_retry_after_is_retried_on_the_policy_schedule(
    autojump_clock: trio.testing.MockClock,
) -> None:
    body = Flaky(RateLimited(429))
    runtime = make_runtime(json_tool("fetch", body, retry=EXACT))
    assert expect_success(await runtime.execute(make_input("fetch"))).value == "ok"
    assert body.started[1] - body.started[0] == pytest.approx(0.5)


async def test_a_transient_subclass_without_retry_after_fails_with_its_own_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    body = Flaky(*(RateLimited(429) for _ in range(3)))
    runtime = make_runtime(json_tool("fetch", body, retry=EXACT))
    result = expect_failure(await runtime.execute(make_input("fetch")))
    assert (result.code, result.error.info and result.error.info.name) == ("TOOL_ERROR", "RateLimited")
    assert result.error.message == "HTTP 429 (after 3 attempts)"
    assert len(body.started) == 3


@pytest.mark.parametrize("seconds", ["5", -1, float("nan"), float("inf"), True])
async def test_an_invalid_retry_after_is_ignored_and_logged(
    seconds: object, autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    body = Flaky(_asking(seconds))
    runtime = make_runtime(json_tool("fetch", body, retry=EXACT))
    with caplog.at_level("WARNING", logger="dsh_core"):
        assert expect_success(await runtime.execute(make_input("fetch"))).value == "ok"
    assert body.started[1] - body.started[0] == pytest.approx(0.5)
    assert f"TransientToolError (rate limited) has retry_after_s={seconds!r}" in caplog.text
    assert "not a finite number of seconds >= 0; retrying on the policy's own schedule" in caplog.text


async def test_a_retry_after_that_raises_when_read_is_ignored_and_logged(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    body = Flaky(ShyRetryAfter("busy"))
    runtime = make_runtime(json_tool("fetch", body, retry=EXACT))
    with caplog.at_level("WARNING", logger="dsh_core"):
        assert expect_success(await runtime.execute(make_input("fetch"))).value == "ok"
    assert body.started[1] - body.started[0] == pytest.approx(0.5)
    assert "ShyRetryAfter (busy): reading retry_after_s raised KeyError" in caplog.text


def test_pause_before_reads_a_missing_retry_after_as_not_asked() -> None:
    policy = RetryPolicy(initial_delay_s=2, jitter=0)
    assert policy.pause_before(2, RateLimited(503)) == 2
    assert policy.pause_before(2, _asking("60")) == 2


async def test_an_invalid_retry_after_in_a_parallel_batch_loses_no_result(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def slow(args: Any) -> str:
        await trio.sleep(5)
        return "slow ok"

    body = Flaky(*(_asking("5") for _ in range(3)))
    runtime = make_runtime(
        json_tool("slow", slow, is_concurrency_safe=lambda args: True),
        json_tool("fetch", body, retry=EXACT, is_concurrency_safe=lambda args: True),
    )
    slow_result, fetch_result = await run_tool_calls(runtime, [make_input("slow"), make_input("fetch")])
    assert expect_success(slow_result).value == "slow ok"
    assert expect_failure(fetch_result).error.message == "rate limited (after 3 attempts)"
    assert len(body.started) == 3


async def test_a_transient_failure_inside_a_nursery_is_retried(autojump_clock: trio.testing.MockClock) -> None:
    started: list[float] = []

    async def fetch_one() -> None:
        await trio.sleep(0)
        raise TransientToolError("rate limited", retry_after_s=2)

    async def body(args: Any) -> str:
        started.append(trio.current_time())
        if len(started) < 3:
            async with trio.open_nursery() as nursery:  # trio groups the child's error: a group of one
                nursery.start_soon(fetch_one)
        return "ok"

    runtime = make_runtime(json_tool("fetch", body, retry=EXACT))
    assert expect_success(await runtime.execute(make_input("fetch"))).value == "ok"
    assert (started[1] - started[0], started[2] - started[1]) == pytest.approx((2, 2))


async def test_a_transient_failure_inside_a_nursery_ends_in_that_error(autojump_clock: trio.testing.MockClock) -> None:
    attempts = 0

    async def body(args: Any) -> str:
        nonlocal attempts
        attempts += 1
        async with trio.open_nursery() as nursery:
            nursery.start_soon(Flaky(TransientToolError("busy", code="RATE_LIMITED")), None, None)
        return "ok"

    runtime = make_runtime(json_tool("fetch", body, retry=EXACT))
    result = expect_failure(await runtime.execute(make_input("fetch")))
    assert (result.code, result.error.message) == ("RATE_LIMITED", "busy (after 3 attempts)")
    assert attempts == 3


async def test_an_output_contract_failure_is_never_retried(autojump_clock: trio.testing.MockClock) -> None:
    calls = 0

    async def wrong(args: Any) -> Any:
        nonlocal calls
        calls += 1
        return "not a number"

    runtime = make_runtime(json_tool("count", wrong, output={"type": "integer"}, retry=EXACT))
    result = expect_failure(await runtime.execute(make_input("count")))
    assert result.code == ErrorCode.INVALID_TOOL_OUTPUT
    assert calls == 1


async def test_a_plain_def_body_is_retried_too(autojump_clock: trio.testing.MockClock) -> None:
    attempts: list[float] = []

    def body(args: Any) -> str:
        attempts.append(trio.current_time())
        if len(attempts) < 2:
            raise TransientToolError("busy")
        return "ok"

    runtime = make_runtime(json_tool("sync", body, retry=EXACT))  # type: ignore[arg-type]
    assert expect_success(await runtime.execute(make_input("sync"))).value == "ok"
    assert attempts[1] - attempts[0] == pytest.approx(0.5)


async def test_a_cancel_during_the_pause_aborts_the_call_at_once(autojump_clock: trio.testing.MockClock) -> None:
    body = Flaky(TransientToolError("busy"), value="late")
    policy = RetryPolicy(initial_delay_s=60, jitter=0)
    runtime = make_runtime(json_tool("fetch", body, retry=policy))
    signal = CancelSignal()

    async def stop_soon() -> None:
        await trio.sleep(1)
        signal.cancel("user pressed stop")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(stop_soon)
        result = expect_failure(await runtime.execute(make_input("fetch", signal=signal)))
    assert result.code == ErrorCode.ABORTED
    assert len(body.started) == 1
    assert trio.current_time() - body.started[0] == pytest.approx(1)


async def test_a_failure_while_the_caller_gives_up_stands_without_retry(
    autojump_clock: trio.testing.MockClock,
) -> None:
    signal = CancelSignal()
    attempts = 0

    async def body(args: Any) -> Any:
        nonlocal attempts
        attempts += 1
        signal.cancel("stop")
        raise TransientToolError("busy")

    runtime = make_runtime(json_tool("fetch", body, retry=EXACT))
    result = expect_failure(await runtime.execute(make_input("fetch", signal=signal)))
    assert attempts == 1
    assert result.error.message == "busy"  # failures are never replaced by cancellation


async def test_an_attempt_past_its_budget_is_cancelled_and_retried(autojump_clock: trio.testing.MockClock) -> None:
    body = Flaky(HANG)
    policy = attrs.evolve(EXACT, attempt_timeout_s=2)
    runtime = make_runtime(json_tool("fetch", body, retry=policy))
    assert expect_success(await runtime.execute(make_input("fetch"))).value == "ok"
    assert [round(t - body.started[0], 6) for t in body.started] == [0, 2.5]


async def test_the_last_attempt_past_its_budget_fails_tool_timeout(autojump_clock: trio.testing.MockClock) -> None:
    body = Flaky(HANG, HANG)
    policy = RetryPolicy(max_attempts=2, initial_delay_s=1, jitter=0, attempt_timeout_s=3)
    runtime = make_runtime(json_tool("fetch", body, retry=policy))
    result = expect_failure(await runtime.execute(make_input("fetch")))
    assert result.code == ErrorCode.TOOL_TIMEOUT
    assert result.error.message == "the attempt ran past its 3 s budget (after 2 attempts)"
    assert result.error.info is not None and result.error.info.name == AttemptTimedOut.__name__
    assert trio.current_time() - body.started[0] == pytest.approx(7)


class Charge:
    """A body whose side effect, once begun, is finished (shielded), however long past the attempt's budget."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.charged: list[float] = []

    async def __call__(self, args: Any) -> Any:
        with trio.CancelScope(shield=True):
            await trio.sleep(self.seconds)
            self.charged.append(trio.current_time())
        return {"charge": len(self.charged)}


async def test_an_attempt_that_succeeds_past_its_budget_stands_and_is_not_run_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    body = Charge(2)
    policy = RetryPolicy(max_attempts=3, initial_delay_s=0.1, jitter=0, attempt_timeout_s=1)
    runtime = make_runtime(json_tool("pay", body, retry=policy))
    result = expect_success(await runtime.execute(make_input("pay")))
    assert result.value == {"charge": 1}
    assert body.charged == [pytest.approx(2)]  # the side effect happened once


async def test_an_attempt_that_returns_a_bad_value_past_its_budget_is_not_run_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """It was taken for a timed-out attempt: the charge ran three times, and the call ended TOOL_TIMEOUT."""
    body = Charge(2)
    policy = RetryPolicy(max_attempts=3, initial_delay_s=0.1, jitter=0, attempt_timeout_s=1)
    runtime = make_runtime(json_tool("pay", body, output={"type": "string"}, retry=policy))
    result = expect_failure(await runtime.execute(make_input("pay")))
    assert result.code == ErrorCode.INVALID_TOOL_OUTPUT
    assert body.charged == [pytest.approx(2)]  # the body returned: its work was done, once


async def test_a_pause_the_calls_deadline_would_cut_ends_in_the_bodys_failure_at_once(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Slept anyway, the pause ran into the timeout, and the model got TOOL_TIMEOUT in place of the real error."""
    body = Flaky(TransientToolError("rate limited: retry in 20 s", retry_after_s=20))
    policy = RetryPolicy(max_attempts=3, max_delay_s=30, jitter=0)
    runtime = make_runtime(json_tool("api", body, retry=policy, timeout_ms=10_000))
    timeout.dsh_setup(runtime, {})
    result = expect_failure(await runtime.execute(make_input("api")))
    assert result.code == ErrorCode.TOOL_ERROR and result.error.message == "rate limited: retry in 20 s"
    assert trio.current_time() == pytest.approx(0) and len(body.started) == 1


async def test_an_attempt_that_blocks_past_its_budget_and_succeeds_is_not_run_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    inserted = 0

    async def body(args: Any) -> Any:
        nonlocal inserted
        await trio.sleep(0)
        autojump_clock.jump(0.3)  # blocking work (a sync client): no checkpoint while the budget runs out
        inserted += 1
        return {"rows": inserted}

    policy = RetryPolicy(max_attempts=2, initial_delay_s=0.01, jitter=0, attempt_timeout_s=0.2)
    runtime = make_runtime(json_tool("insert", body, retry=policy))
    result = expect_success(await runtime.execute(make_input("insert")))
    assert result.value == {"rows": 1}
    assert inserted == 1


async def test_a_success_past_the_budget_while_the_caller_gives_up_is_aborted_and_not_run_again(
    autojump_clock: trio.testing.MockClock,
) -> None:
    body = Charge(2)
    seen: list[Any] = []

    class Watch:
        @hookimpl
        async def dsh_execute(self, execution: Any, next: Any) -> Any:
            result = await next()
            seen.append(execution.body_result)
            return result

    signal = CancelSignal()
    policy = RetryPolicy(max_attempts=3, initial_delay_s=0.1, jitter=0, attempt_timeout_s=1)
    runtime = make_runtime(json_tool("pay", body, retry=policy))
    runtime.plugins.register(Watch(), name="watch")

    async def stop_soon() -> None:
        await trio.sleep(1.5)
        signal.cancel("user pressed stop")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(stop_soon)
        result = expect_failure(await runtime.execute(make_input("pay", signal=signal)))
    assert result.code == ErrorCode.ABORTED
    assert len(body.charged) == 1
    assert [getattr(r, "value", None) for r in seen] == [{"charge": 1}]  # the work that happened


async def test_an_attempt_that_succeeds_past_its_budget_is_committed_and_undoable_once(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    body = Charge(2)
    policy = RetryPolicy(max_attempts=3, initial_delay_s=0.1, jitter=0, attempt_timeout_s=1)
    runtime = make_runtime(json_tool("pay", body, revert=lambda args, value: None, retry=policy))
    ledger = EffectLedger(tmp_path / "effects.jsonl", runtime=runtime)
    undo_log = UndoLog(runtime)
    runtime.plugins.register(ledger, name="effect-ledger")
    runtime.plugins.register(undo_log, name="undo-log")
    result = expect_success(await runtime.execute(make_input("pay", call_id="c1")))
    assert result.value == {"charge": 1}
    entry = ledger.get("c1")
    assert entry is not None and (entry.state, entry.value) == ("committed", {"charge": 1})
    assert [u.value for u in undo_log.entries()] == [{"charge": 1}]
    assert len(body.charged) == 1


async def test_the_timeout_plugin_budget_covers_every_attempt_and_pause(
    autojump_clock: trio.testing.MockClock,
) -> None:
    body = Flaky(*(TransientToolError("busy") for _ in range(9)))
    policy = RetryPolicy(max_attempts=10, initial_delay_s=1, multiplier=1, jitter=0)
    runtime = make_runtime(json_tool("fetch", body, retry=policy, timeout_ms=3500))
    timeout.dsh_setup(runtime, {})
    result = expect_failure(await runtime.execute(make_input("fetch")))
    assert len(body.started) == 4  # at 0, 1, 2 and 3 s
    # The pause after the fourth would run into the deadline (3.5 s): its failure ends the call then.
    assert result.error.message == "busy (after 4 attempts)"
    assert trio.current_time() - body.started[0] == pytest.approx(3)


async def test_the_timeout_plugin_cuts_an_attempt_that_outlasts_the_calls_budget(
    autojump_clock: trio.testing.MockClock,
) -> None:
    body = Flaky(TransientToolError("busy"), HANG)
    policy = RetryPolicy(max_attempts=10, initial_delay_s=1, multiplier=1, jitter=0)
    runtime = make_runtime(json_tool("fetch", body, retry=policy, timeout_ms=3500))
    timeout.dsh_setup(runtime, {})
    result = expect_failure(await runtime.execute(make_input("fetch")))
    assert result.code == ErrorCode.TOOL_TIMEOUT
    assert trio.current_time() - body.started[0] == pytest.approx(3.5)


async def test_a_failed_attempts_deferred_contexts_go_with_it(autojump_clock: trio.testing.MockClock) -> None:
    attempt = 0

    async def body(args: Any, run: ToolRunContext) -> str:
        nonlocal attempt
        attempt += 1
        run.defer_context(UserMessage(content=(TextBlock(f"note from attempt {attempt}"),)))
        await trio.sleep(0)
        if attempt == 1:
            raise TransientToolError("busy")
        return "ok"

    runtime = make_runtime(json_tool("fetch", body, retry=EXACT))
    result = expect_success(await runtime.execute(make_input("fetch")))
    assert [context.content for context in result.additional_contexts] == [(TextBlock("note from attempt 2"),)]


async def test_each_retry_is_an_event_and_a_trace_step(autojump_clock: trio.testing.MockClock) -> None:
    events: list[tuple[str, Mapping[str, Any]]] = []
    body = Flaky(TransientToolError("busy"), ConnectionError("reset"))
    runtime = make_runtime(
        json_tool("fetch", body, retry=EXACT),
        trace_decisions=True,
        event_sink=lambda kind, data: events.append((kind, data)),
    )
    result = expect_success(await runtime.execute(make_input("fetch", call_id="c1")))
    assert events == [
        (
            "tool/retry",
            {
                "call_id": "c1",
                "root_call_id": "c1",
                "tool": "fetch",
                "attempt": 1,
                "pause_s": 0.5,
                "code": "TOOL_ERROR",
                "message": "busy",
            },
        ),
        (
            "tool/retry",
            {
                "call_id": "c1",
                "root_call_id": "c1",
                "tool": "fetch",
                "attempt": 2,
                "pause_s": 1.0,
                "code": "TOOL_ERROR",
                "message": "reset",
            },
        ),
    ]
    assert result.trace is not None
    assert [(step.stage, step.actor, step.outcome) for step in result.trace.steps] == [
        ("execute", "fetch (attempt 1)", "retry in 0.5 s: fail: TOOL_ERROR: busy"),
        ("execute", "fetch (attempt 2)", "retry in 1 s: fail: TOOL_ERROR: reset"),
        ("execute", "fetch (body)", "ok"),
    ]


async def test_a_failing_event_sink_does_not_stop_the_retry(autojump_clock: trio.testing.MockClock) -> None:
    def broken(kind: str, data: Mapping[str, Any]) -> None:
        raise RuntimeError("disk full")

    body = Flaky(TransientToolError("busy"))
    runtime = make_runtime(json_tool("fetch", body, retry=EXACT), event_sink=broken)
    assert expect_success(await runtime.execute(make_input("fetch"))).value == "ok"


async def test_the_session_log_keeps_the_retries(autojump_clock: trio.testing.MockClock, tmp_path: Path) -> None:
    with SessionLog(tmp_path / "session.jsonl") as log:
        runtime = make_runtime(json_tool("fetch", Flaky(TransientToolError("busy")), retry=EXACT))
        recorder = SessionRecorder(log, runtime)
        runtime.plugins.register(recorder)
        runtime.event_sink = recorder.event_sink
        request = make_input("fetch", call_id="c9")
        recorder.record_call(request)
        expect_success(await runtime.execute(request))
    types = [event.type for event in read_session_log(tmp_path / "session.jsonl").events]
    assert types == ["tool/call", "tool/retry", "tool/result"]


async def test_code_mode_sub_calls_are_retried_like_native_ones(autojump_clock: trio.testing.MockClock) -> None:
    body = Flaky(TransientToolError("busy"), value=7)
    events: list[str] = []
    returned: list[Any] = []

    async def program(tools: Mapping[str, Callable[[Any], Awaitable[Any]]]) -> None:
        returned.append(await tools["fetch"]({}))

    runtime = ToolRuntime(
        mode="code", code_runtime=FakeCodeRuntime(program), event_sink=lambda kind, data: events.append(kind)
    )
    runtime.register(json_tool("fetch", body, retry=EXACT))
    result = await runtime.execute(make_input("run_code", {"code": "...", "description": "d"}))
    assert not result.is_error, result
    assert returned == [7] and len(body.started) == 2
    assert "tool/retry" in events


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_attempts": 0}, "max_attempts must be an int from 1 to 100"),
        ({"max_attempts": 101}, "max_attempts must be an int from 1 to 100"),
        ({"max_attempts": True}, "max_attempts must be an int"),
        ({"initial_delay_s": -1}, "initial_delay_s must be a finite number of seconds >= 0"),
        ({"max_delay_s": float("inf")}, "max_delay_s must be a finite number of seconds >= 0"),
        ({"multiplier": 0.5}, "multiplier must be a finite number >= 1"),
        ({"jitter": 1.5}, "jitter must be a fraction from 0 to 1"),
        ({"jitter": float("nan")}, "jitter must be a fraction from 0 to 1"),
        ({"attempt_timeout_s": 0}, "attempt_timeout_s must be a positive finite number or None"),
    ],
)
def test_a_policy_out_of_range_is_refused(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RetryPolicy(**options)


@pytest.mark.parametrize("retry_on", [(), (int,), ("KeyError",), [KeyError], (KeyboardInterrupt,)])
def test_retry_on_must_name_exception_classes(retry_on: Any) -> None:
    with pytest.raises(TypeError, match="retry_on"):
        RetryPolicy(retry_on=retry_on)


def test_a_definition_refuses_a_retry_that_is_not_a_policy() -> None:
    with pytest.raises(TypeError, match="retry must be a RetryPolicy or None, got dict"):
        define_tool(
            name="x",
            description="x",
            parameters={},
            output={"type": "json"},
            execute=Flaky(),
            retry={"max_attempts": 3},  # type: ignore[arg-type]
        )


@pytest.mark.parametrize("seconds", [-1, float("nan"), float("inf"), "5", True])
def test_retry_after_must_be_a_duration(seconds: Any) -> None:
    with pytest.raises(ValueError, match="retry_after_s"):
        TransientToolError("busy", retry_after_s=seconds)


def test_a_transient_error_keeps_a_code_of_its_own() -> None:
    assert TransientToolError("busy").code == "TOOL_ERROR"
    assert TransientToolError("busy", code="RATE_LIMITED").code == "RATE_LIMITED"


async def test_a_tool_without_a_policy_runs_once(autojump_clock: trio.testing.MockClock) -> None:
    body = Flaky(TransientToolError("busy"))
    runtime = make_runtime(json_tool("fetch", body))
    assert expect_failure(await runtime.execute(make_input("fetch"))).error.message == "busy"
    assert len(body.started) == 1


class HttpError(Exception):
    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


async def test_retry_if_narrows_the_classes_to_the_errors_worth_it(autojump_clock: trio.testing.MockClock) -> None:
    policy = attrs.evolve(EXACT, retry_on=HttpError, retry_if=lambda error: getattr(error, "status", 0) in (429, 503))
    unavailable = Flaky(HttpError(503))
    missing = Flaky(HttpError(404))
    runtime = make_runtime(json_tool("a", unavailable, retry=policy), json_tool("b", missing, retry=policy))
    assert expect_success(await runtime.execute(make_input("a"))).value == "ok"
    assert expect_failure(await runtime.execute(make_input("b"))).error.message == "HTTP 404"
    assert (len(unavailable.started), len(missing.started)) == (2, 1)


async def test_retry_if_must_answer_exactly_true(autojump_clock: trio.testing.MockClock) -> None:
    body = Flaky(TransientToolError("busy"))
    policy = attrs.evolve(EXACT, retry_if=lambda error: "yes")
    runtime = make_runtime(json_tool("fetch", body, retry=policy))
    expect_failure(await runtime.execute(make_input("fetch")))
    assert len(body.started) == 1


async def test_a_raising_retry_if_keeps_the_bodys_error_and_is_logged(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(error: BaseException) -> bool:
        raise RuntimeError("predicate bug")

    body = Flaky(TransientToolError("busy"))
    runtime = make_runtime(json_tool("fetch", body, retry=attrs.evolve(EXACT, retry_if=broken)))
    with caplog.at_level("WARNING", logger="dsh_core"):
        result = expect_failure(await runtime.execute(make_input("fetch")))
    assert result.error.message == "busy"
    assert "retry_if raised RuntimeError: predicate bug; not retrying" in caplog.text


def test_retry_if_must_be_callable() -> None:
    with pytest.raises(TypeError, match="retry_if must be callable or None, got str"):
        RetryPolicy(retry_if="status == 429")  # type: ignore[arg-type]
