"""Whether a call unwinding out of a plugin's listener will still get a result.

An observer that opens something for a call (an audit line's timing, a span)
closes it when the call's result is published (``dsh_result``). A call the
caller's own signal cancels has one: the pipeline's cancel scope, linked to
that signal, takes the ``trio.Cancelled`` and the call ends ``ABORTED``. A
cancellation from a scope outside the call (the host's turn deadline, its
Ctrl-C handling) or an interpreter exit goes straight through
``ToolRuntime.execute``, and no result is ever published: what the observer
opened must be closed as the call unwinds through it, or never.
"""

from __future__ import annotations

from typing import Final

import trio

from dsh_core import CancelSignal

__all__ = ["cut_short"]

# What no cancel scope stops (trio.Cancelled is judged apart).
_EXITS: Final = (KeyboardInterrupt, SystemExit, GeneratorExit)


def cut_short(exc: BaseException, signal: CancelSignal) -> str | None:
    """What is ending the call without a result (``"trio.Cancelled"``, ``"KeyboardInterrupt"``...), or ``None``.

    ``exc`` is what an inner listener, wrapper or body raised out of
    ``next()``; ``signal`` is the caller's (``ToolExecution.signal``, not a
    wrapper's replacement). ``None`` means the call still gets its result:
    ``exc`` holds no cancellation or exit (an inner listener's error, which
    fails the call), or only ``trio.Cancelled`` while the caller's signal has
    fired, which the call's own scope takes. Were the host's scope cancelled at
    that moment too, that call would have no result after all: trio gives the
    ``Cancelled`` to the outermost cancelled scope, which nothing in the call
    can see.
    """
    pending = [exc]
    cancelled = False
    while pending:
        current = pending.pop()
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)
        elif isinstance(current, _EXITS):
            return type(current).__name__
        elif isinstance(current, trio.Cancelled):
            cancelled = True
    if cancelled and not signal.cancelled:
        return "trio.Cancelled"
    return None
