"""What cut a call short: the ``cause`` of ``dsh_call_unwound``, named for a record.

An observer that opens something for a call (an audit line's timing, a span)
closes it when the call's result is published (``dsh_result``), or, for a call
cut short from outside (the host's turn deadline, its Ctrl-C handling, an
interpreter exit), when the runtime tells it the call unwound without one.
"""

from __future__ import annotations

from typing import Final

import trio

__all__ = ["cut_short_message", "what_cut"]

# What no cancel scope stops: named first when a group holds one beside a cancellation.
_EXITS: Final = (KeyboardInterrupt, SystemExit, GeneratorExit)


def what_cut(cause: BaseException) -> str:
    """``"trio.Cancelled"``, ``"KeyboardInterrupt"``, ``"SystemExit"``, ``"GeneratorExit"``, else the type's name.

    (dsh_core's own split of a group into what must propagate and what a result
    holds answers another question: this names the one cause a record shows.)

    ``cause`` may be a task group's exception group (a scheduler's, unwinding):
    an interpreter exit inside it wins over a cancellation, which wins over
    anything else.
    """
    pending = [cause]
    cancelled = False
    while pending:
        current = pending.pop()
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)
        elif isinstance(current, _EXITS):
            return type(current).__name__
        elif isinstance(current, trio.Cancelled):
            cancelled = True
    return "trio.Cancelled" if cancelled else type(cause).__name__


def cut_short_message(cause: BaseException) -> str:
    """The status or error message of a call ``cause`` cut short."""
    return f"cut short by {what_cut(cause)} from outside the call; it has no result"
