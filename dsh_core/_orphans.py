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

    Thread-safe: workers finish on their own threads. A finish is announced
    (``tool/orphan-finished``, then the wake-up of the waiters that it leaves
    idle) on the loop of a trio run that is still going: the run that
    abandoned the thread, else the latest run that called the runtime while
    orphans ran, else a waiter's run, so that the event sink is not called
    from a second thread while a run uses it. Only when none of those runs is
    left does the worker thread announce the finish itself. Each waiter is
    woken through its own run, whichever run that is.
    """

    def __init__(self, sink: Callable[[], EventSink | None] = lambda: None) -> None:
        self._sink = sink
        self._lock = threading.Lock()
        self._running: dict[int, tuple[OrphanedWork, trio.lowlevel.TrioToken]] = {}
        # Finishes whose tool/orphan-finished is not sent yet. Waiters wait for
        # them too: a host that waited for its orphans has seen every finish.
        self._unannounced = 0
        self._idle_waiters: set[tuple[trio.Event, trio.lowlevel.TrioToken]] = set()
        self._latest_run: trio.lowlevel.TrioToken | None = None

    def running(self) -> tuple[OrphanedWork, ...]:
        with self._lock:
            return tuple(work for work, _ in self._running.values())

    def note_run(self) -> None:
        """Remember the calling trio run as the one using the runtime, where finishes can be announced.

        Every call starts here while orphans run (``begin`` looks at ``_running``
        itself first, without the lock: a stale answer only means another run, or
        none, is noted).
        """
        self._latest_run = trio.lowlevel.current_trio_token()

    async def wait_idle(self) -> None:
        """Return once no orphaned thread is running and every finish is announced (at once when so)."""
        with self._lock:
            if not self._running and not self._unannounced:
                return
            waiter = (trio.Event(), trio.lowlevel.current_trio_token())
            self._idle_waiters.add(waiter)
        try:
            await waiter[0].wait()
        finally:
            # A cancelled waiter must not keep its finished run's token.
            with self._lock:
                self._idle_waiters.discard(waiter)

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
            if entry is None:
                return
            self._unannounced += 1
            work, abandoning_run = entry
            runs = [abandoning_run, self._latest_run, *(token for _, token in self._idle_waiters)]
            if not self._running:
                self._latest_run = None  # nothing left to announce there: let that run go
        seconds = max(0.0, time.time() - work.abandoned_at)

        def announce() -> None:
            try:
                self._emit("tool/orphan-finished", work.to_json() | {"outcome": outcome, "seconds": seconds})
            finally:
                self._announced()

        for token in dict.fromkeys(runs):
            if token is not None and _call_soon(token, announce):
                return
        # No run is left to hand it to: the sink hears it from this thread.
        announce()

    def _announced(self) -> None:
        with self._lock:
            self._unannounced -= 1
            if self._running or self._unannounced:
                return
            waiters, self._idle_waiters = self._idle_waiters, set()
        for idle, token in waiters:
            # A waiter's run that ended took the waiter with it.
            _call_soon(token, idle.set)

    def _emit(self, event_type: str, data: dict[str, Any]) -> None:
        send_event(self._sink(), event_type, data, logger)


def _call_soon(token: trio.lowlevel.TrioToken, fn: Callable[[], object]) -> bool:
    """Run ``fn`` on the loop of ``token``'s run; False when that run is over.

    A call the run accepts is guaranteed to run before ``trio.run`` returns.
    """
    try:
        token.run_sync_soon(fn)
    except trio.RunFinishedError:
        return False
    return True


class _Skipped(Exception):
    """The call stopped waiting before a worker thread picked its work up."""
