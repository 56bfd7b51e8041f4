"""dsh_plugins._cut_short: how a record names what cut a call short (the cause dsh_call_unwound gives)."""

from __future__ import annotations

import trio

from dsh_plugins._cut_short import cut_short_message, what_cut


async def a_cancellation() -> trio.Cancelled:
    with trio.CancelScope() as scope:
        scope.cancel()
        try:
            await trio.lowlevel.checkpoint()
        except trio.Cancelled as exc:
            return exc
    raise AssertionError("the checkpoint was not cancelled")


async def test_a_cancellation_is_named_also_inside_a_task_groups_exception() -> None:
    cancelled = await a_cancellation()
    assert what_cut(cancelled) == "trio.Cancelled"
    assert what_cut(BaseExceptionGroup("turn", [cancelled, await a_cancellation()])) == "trio.Cancelled"
    assert what_cut(BaseExceptionGroup("cleanup failed", [ValueError("x"), cancelled])) == "trio.Cancelled"


async def test_an_interpreter_exit_wins_over_a_cancellation_beside_it() -> None:
    assert what_cut(KeyboardInterrupt()) == "KeyboardInterrupt"
    assert what_cut(GeneratorExit()) == "GeneratorExit"
    assert what_cut(BaseExceptionGroup("both", [await a_cancellation(), SystemExit(1)])) == "SystemExit"


def test_anything_else_is_named_by_its_type() -> None:
    # (The runtime tells no plain failure, which becomes the call's result; an internal error could.)
    assert what_cut(RuntimeError("bug")) == "RuntimeError"
    assert what_cut(ExceptionGroup("errors", [ValueError("x")])) == "ExceptionGroup"
    assert cut_short_message(KeyboardInterrupt()) == (
        "cut short by KeyboardInterrupt from outside the call; it has no result"
    )
