"""dsh_plugins._cut_short: which exceptions leaving a listener mean the call will have no result."""

from __future__ import annotations

import trio

from dsh_core import CancelSignal
from dsh_plugins._cut_short import cut_short


async def a_cancellation() -> trio.Cancelled:
    with trio.CancelScope() as scope:
        scope.cancel()
        try:
            await trio.lowlevel.checkpoint()
        except trio.Cancelled as exc:
            return exc
    raise AssertionError("the checkpoint was not cancelled")


async def test_a_cancellation_from_outside_the_call_leaves_it_without_a_result() -> None:
    cancelled = await a_cancellation()
    assert cut_short(cancelled, CancelSignal()) == "trio.Cancelled"
    assert cut_short(BaseExceptionGroup("cleanup failed", [ValueError("x"), cancelled]), CancelSignal()) == (
        "trio.Cancelled"
    )


async def test_the_callers_own_cancellation_and_plain_errors_still_get_a_result() -> None:
    fired = CancelSignal()
    fired.cancel()
    assert cut_short(await a_cancellation(), fired) is None  # the call's own scope takes it: ABORTED
    assert cut_short(ValueError("inner listener broke"), CancelSignal()) is None  # POLICY_ERROR
    assert cut_short(ExceptionGroup("errors", [ValueError("x")]), CancelSignal()) is None


async def test_an_interpreter_exit_leaves_the_call_without_a_result_whatever_the_signal() -> None:
    fired = CancelSignal()
    fired.cancel()
    assert cut_short(KeyboardInterrupt(), CancelSignal()) == "KeyboardInterrupt"
    assert cut_short(BaseExceptionGroup("both", [await a_cancellation(), SystemExit(1)]), fired) == "SystemExit"
