"""One long-lived reader of a terminal's lines, handing each line to the question asked now.

A blocking ``readline`` cannot be interrupted. Reading each answer in its own
worker thread (abandoned when the question expires) leaves that thread waiting
for input, and the next line typed goes to it, for a question no longer asked,
and is lost. Here a single thread reads the stream, one line at a time and only
while a question waits, and a line is given to the question waiting when it is
read: the line typed after a question expired answers the one shown since.
Lines piped in ahead are read one per question. A line read once no question
waits any more (its question expired while the line was typed, and no other was
shown yet) is discarded, never kept for a later, different question.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable

import attrs
import trio

__all__ = ["LineReader"]

logger = logging.getLogger("dsh_plugins.approval")


@attrs.define(eq=False)
class _Waiter:
    """A question waiting for its line: the reader thread wakes it through its trio run's token."""

    token: trio.lowlevel.TrioToken
    arrived: trio.Event = attrs.field(factory=trio.Event)
    line: str | None = None  # None once arrived: the stream has ended
    shown: bool = False  # the question is on screen: the reader may take a line for it

    def receive(self, line: str | None) -> None:
        self.line = line
        self.arrived.set()


class LineReader:
    """Lines of one input stream, read by one daemon thread started at the first :meth:`next_line`.

    ``readline`` blocks until a line is typed and returns it; ``""``,
    ``EOFError`` or ``OSError`` ends the stream for good (every later
    :meth:`next_line` returns ``None`` at once).
    """

    def __init__(self, readline: Callable[[], str]) -> None:
        self._readline = readline
        self._guard = threading.Lock()
        self._asked = threading.Condition(self._guard)  # notified when a question starts waiting
        self._waiter: _Waiter | None = None
        self._ended = False
        self._thread: threading.Thread | None = None

    async def next_line(self, shown: Callable[[], None]) -> str | None:
        """Call ``shown`` (which shows the question), then wait for the first line read after it.

        Returns ``None`` when the stream has ended. Cancelling the wait
        withdraws it: a line read afterwards is discarded.
        """
        waiter = _Waiter(trio.lowlevel.current_trio_token())
        with self._guard:
            if self._ended:
                return None
            # Registered before the question is shown, so a quick answer cannot slip past it; but
            # read only once it is shown (see below).
            self._waiter = waiter
            if self._thread is None:
                self._thread = threading.Thread(target=self._read_lines, name="dsh-approval-reader", daemon=True)
                self._thread.start()
        try:
            shown()
            with self._guard:
                # Only now: woken before, the reader took a line typed ahead (one that showing the
                # question discards from the terminal) and it answered a question nobody had seen.
                waiter.shown = True
                self._asked.notify()
            await waiter.arrived.wait()
        finally:
            with self._guard:
                if self._waiter is waiter:
                    self._waiter = None
        return waiter.line

    def _read_lines(self) -> None:
        while True:
            with self._guard:
                # Read only for a question: what is piped in ahead stays in the stream for the next.
                self._asked.wait_for(lambda: self._waiter is not None and self._waiter.shown)
            try:
                line: str | None = self._readline()
            except (EOFError, OSError) as exc:
                logger.debug("approval input ended: %r", exc)
                line = None
            if not line:
                line = None
            with self._guard:
                waiter, self._waiter = self._waiter, None
                if line is None:
                    self._ended = True
            if waiter is not None:
                # A run that has finished has nobody left to answer.
                with contextlib.suppress(trio.RunFinishedError):
                    waiter.token.run_sync_soon(waiter.receive, line)
            elif line is not None:
                logger.warning("discarded a line typed while no approval question was waiting")
            if line is None:
                return
