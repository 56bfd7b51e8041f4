"""Worker threads a cancelled tool call had to leave running, tracked until they return.

trio can cancel anything that awaits, but not a thread: Python has no way to
stop one. A body that waits for its thread keeps a timed-out call open as long
as the thread runs; a body that abandons it resolves on time and leaks it
silently. :meth:`ToolRunContext.run_in_thread` takes the second road and makes
the leak visible: the abandoned thread is recorded as :class:`OrphanedWork` on
the runtime until it returns, announced through the runtime's ``event_sink``
(``tool/orphaned`` then ``tool/orphan-finished``) and logged, and a host can
list what is still running or wait for it before it exits.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import attrs
import trio

from ._events import EventSink, send_event

__all__ = ["OrphanTracker", "OrphanedWork"]

logger = logging.getLogger("dsh_core.orphans")

T = TypeVar("T")


@attrs.frozen(slots=True)
class OrphanedWork:
    """A worker thread still running for a call that has already resolved.

    ``call_id``, ``tool`` and ``agent`` (the call's :func:`scope_id`) name the
    call that started it, ``function`` what the thread runs, ``thread`` the
    worker's thread name, and ``abandoned_at`` the wall-clock time (epoch
    seconds) at which the call stopped waiting for it.
    """

    call_id: str
    tool: str
    agent: str | None
    function: str
    thread: str
    abandoned_at: float

    def to_json(self) -> dict[str, Any]:
        return {
            "callId": self.call_id,
            "name": self.tool,
            "agent": self.agent,
            "function": self.function,
            "thread": self.thread,
            "abandonedAt": self.abandoned_at,
        }


def describe_function(fn: Callable[..., object]) -> str:
    qualname = getattr(fn, "__qualname__", None)
    if isinstance(qualname, str):
        module = getattr(fn, "__module__", None)
        return f"{module}.{qualname}" if isinstance(module, str) else qualname
    return type(fn).__qualname__


class _ThreadRun:
    """One ``run_in_thread`` call; every field is read and written under the tracker's lock."""

    __slots__ = ("abandoned", "finished", "orphan", "started", "thread")

    def __init__(self) -> None:
        self.started = False
        self.finished = False
        # Set when the call stopped waiting before the thread picked the work up:
        # the work is then skipped rather than started for a call already gone.
        self.abandoned = False
        self.thread = ""
        self.orphan: OrphanedWork | None = None


class OrphanTracker:
    """The abandoned worker threads of one runtime (see the module docstring).

    Thread-safe: workers finish on their own threads; events and waiter wake-ups
    are handed back to the trio run that abandoned the work.
    """

    def __init__(self, sink: Callable[[], EventSink | None] = lambda: None) -> None:
        self._sink = sink
        self._lock = threading.Lock()
        self._running: dict[int, tuple[OrphanedWork, trio.lowlevel.TrioToken]] = {}
        self._idle_waiters: list[trio.Event] = []

    def running(self) -> tuple[OrphanedWork, ...]:
        with self._lock:
            return tuple(work for work, _ in self._running.values())

    async def wait_idle(self) -> None:
        """Return once no orphaned thread is running (at once when none is)."""
        with self._lock:
            if not self._running:
                return
            idle = trio.Event()
            self._idle_waiters.append(idle)
        await idle.wait()

    async def run_in_thread(
        self,
        fn: Callable[..., T],
        args: tuple[Any, ...],
        *,
        call_id: str,
        tool: str,
        agent: str | None,
        limiter: trio.CapacityLimiter | None,
    ) -> T:
        run = _ThreadRun()
        token = trio.lowlevel.current_trio_token()

        def work() -> T:
            with self._lock:
                if run.abandoned:
                    raise _Skipped
                run.started = True
                run.thread = threading.current_thread().name
            outcome = "raised"
            try:
                value = fn(*args)
                outcome = "returned"
                return value
            finally:
                self._finished(run, outcome)

        try:
            return await trio.to_thread.run_sync(work, abandon_on_cancel=True, limiter=limiter)
        except trio.Cancelled:
            self._abandon(run, token, fn, call_id=call_id, tool=tool, agent=agent)
            raise

    def _abandon(
        self,
        run: _ThreadRun,
        token: trio.lowlevel.TrioToken,
        fn: Callable[..., object],
        *,
        call_id: str,
        tool: str,
        agent: str | None,
    ) -> None:
        with self._lock:
            run.abandoned = True
            if not run.started or run.finished:
                return
            work = OrphanedWork(
                call_id=call_id,
                tool=tool,
                agent=agent,
                function=describe_function(fn),
                thread=run.thread,
                abandoned_at=time.time(),
            )
            run.orphan = work
            self._running[id(run)] = (work, token)
        logger.warning(
            "tool %s (call %s) was cancelled while its worker thread %s ran %s; "
            "the thread cannot be stopped and keeps running as orphaned work",
            tool,
            call_id,
            work.thread,
            work.function,
        )
        self._emit("tool/orphaned", work.to_json())

    def _finished(self, run: _ThreadRun, outcome: str) -> None:
        # Runs on the worker thread.
        with self._lock:
            run.finished = True
            entry = self._running.pop(id(run), None) if run.orphan is not None else None
            waiters: list[trio.Event] = []
            if entry is not None and not self._running:
                waiters, self._idle_waiters = self._idle_waiters, []
        if entry is None:
            return
        work, token = entry
        seconds = max(0.0, time.time() - work.abandoned_at)

        def announce() -> None:
            self._emit("tool/orphan-finished", work.to_json() | {"outcome": outcome, "seconds": seconds})
            for waiter in waiters:
                waiter.set()

        # When the run that abandoned the thread is over there is no loop left to
        # tell, and the sink belongs to it.
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(announce)

    def _emit(self, event_type: str, data: dict[str, Any]) -> None:
        send_event(self._sink(), event_type, data, logger)


class _Skipped(Exception):
    """The call stopped waiting before a worker thread picked its work up."""
