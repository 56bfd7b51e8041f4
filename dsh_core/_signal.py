"""``CancelSignal``: the caller-owned cancellation token (the AbortSignal stand-in).

A trio ``CancelScope`` can only guard the code lexically inside it and can be
entered once, so it cannot be the token a caller hands to a pipeline that many
stages (policies, wrappers, the body, nested Code Mode calls) observe. A
``CancelSignal`` is that token: any number of observers poll ``cancelled`` or
``await wait()``, and the runtime links it to the cancel scope around the work
it owns, so firing the signal interrupts that work at its next checkpoint.

A signal may also carry a deadline (``CancelSignal.after``). It fires by itself
when ``trio.current_time()`` reaches the deadline, and a linked scope gets that
deadline directly, so no timer task is needed. The deadline is kept with the
clock it was read on (trio's clocks differ by a random offset per run): a signal
made in one run, or before any, keeps its budget in a later one.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import threading
import time
from collections.abc import Callable

import trio

from ._json import safe_repr

__all__ = ["CancelSignal"]

_fire_order = itertools.count(1)
_INF = math.inf
logger = logging.getLogger("dsh_core")


def _now(clock: trio.abc.Clock | None = None) -> float:
    try:
        return trio.current_time()
    except RuntimeError:
        pass
    if clock is not None:
        # Another thread cancels a signal observed in a run: read that run's clock
        # at the cancel call, so "first in time" compares it with deadlines fairly.
        # trio's clocks allow that: SystemClock is perf_counter() plus a fixed
        # offset; MockClock reads a few floats (a read racing a jump lands on
        # either side of it).
        return clock.current_time()
    return -math.inf  # no run has observed the signal: nothing in one can have come earlier


def _time(method: str, parameter: str, value: object) -> float:
    # A bool passes isinstance(int); NaN compares false with everything, so it would never fire.
    if type(value) is bool or not isinstance(value, (int, float)) or value != value:
        raise TypeError(f"CancelSignal.{method}({parameter}): {parameter} must be a real number, got {safe_repr(value)}")
    return value


class CancelSignal:
    """A cancellation token shared by everything working on behalf of one caller.

    ``cancel(reason)`` fires it once (later calls do nothing); ``cancelled`` and
    ``reason`` report it; ``await wait()`` blocks until it fires. Signals are
    identity objects: they are never JSON and never frozen into results.

    ``cancel`` may be called from any thread (a UI thread, a worker): the
    work waiting on the signal is woken in the trio run it waits in, and the
    cancel is timed on that run's clock at the call, not when the run gets to
    it, so ``any`` still tells whether it came before a deadline.
    """

    __slots__ = (
        "_clock", "_clock_token", "_deadline", "_deadline_on", "_deadline_reason", "_fired_at", "_fired_when",
        "_listeners", "_reason", "_sources",
    )  # fmt: skip

    def __init__(self) -> None:
        self._fired_at = 0  # 0 = not fired; otherwise a global firing sequence number
        self._fired_when = _INF  # when it fired on trio's clock (a deadline: the deadline itself)
        # The clock of the run that listened last, read by a cancel from another thread.
        self._clock: trio.abc.Clock | None = None
        self._clock_token: trio.lowlevel.TrioToken | None = None  # the run that clock is of
        self._reason: object = None
        # Each listener with the trio run it listens in: a signal may outlive one run (a host
        # running one trio.run per turn) or be shared by runs in two threads.
        self._listeners: list[_Listener] | None = None
        # Whether there is a deadline (and when it is never, or already, at all: ±inf); _deadline_on
        # holds when, with the clock it is a time on (None: time.perf_counter, outside any run). One
        # attribute: a run in another thread moving the deadline onto its clock replaces it whole.
        self._deadline = math.inf
        self._deadline_on: tuple[float, trio.abc.Clock | None] = (math.inf, None)
        self._deadline_reason: object = None
        self._sources: tuple[CancelSignal, ...] = ()

    @classmethod
    def after(cls, seconds: float, *, reason: object = None) -> CancelSignal:
        """A signal that fires ``seconds`` from now, with ``reason``.

        Inside a trio run the time is on its clock (a ``MockClock``'s too); outside
        one, on ``time.perf_counter``. Either way the budget holds in whichever run
        observes the signal, this one or a later one.
        """
        seconds = _time("after", "seconds", seconds)
        clock = _current_clock()
        try:
            deadline = (clock.current_time() if clock is not None else time.perf_counter()) + seconds
        except OverflowError:  # an int beyond float range: as good as infinitely far
            deadline = math.inf if seconds > 0 else -math.inf
        return cls._with_deadline(deadline, clock, reason)

    @classmethod
    def at(cls, deadline: float, *, reason: object = None) -> CancelSignal:
        """A signal that fires when ``trio.current_time()`` reaches ``deadline``.

        ``deadline`` is a time on the running trio run's clock; outside a run only
        ``math.inf`` and ``-math.inf`` (never, and already) mean anything: use
        :meth:`after` there.
        """
        deadline = _time("at", "deadline", deadline)
        clock = _current_clock()
        if clock is None and -_INF < deadline < _INF:
            raise RuntimeError(
                "CancelSignal.at() outside a trio run: its deadline is a time on a run's clock "
                "(trio.current_time()); call it inside trio.run, or use CancelSignal.after(seconds)"
            )
        return cls._with_deadline(deadline, clock, reason)

    @classmethod
    def _with_deadline(cls, deadline: float, clock: trio.abc.Clock | None, reason: object) -> CancelSignal:
        signal = cls()
        signal._deadline = deadline
        signal._deadline_on = (deadline, clock)
        signal._deadline_reason = reason if reason is not None else "deadline exceeded"
        return signal

    @classmethod
    def any(cls, *signals: CancelSignal) -> CancelSignal:
        """A signal that fires when any of ``signals`` fires, with the reason of the one that fired first.

        First in time, also when several had fired before fusing (``AbortSignal.any``
        would take the first in argument order then): the reason reports what
        actually stopped the work.

        Fusing is lazy (the fused signal asks its sources), so fusing costs nothing
        until somebody waits on the result.
        """
        if not signals:
            raise TypeError("CancelSignal.any() takes at least one signal")
        flat: list[CancelSignal] = []
        for signal in signals:
            try:
                sources = signal._sources or (signal,)
            except AttributeError:  # not a signal: found out here, free while they all are
                index = next((i for i, s in enumerate(signals) if not isinstance(s, CancelSignal)), None)
                if index is None:
                    raise
                raise TypeError(
                    f"CancelSignal.any() takes CancelSignals; signals[{index}] is {type(signals[index]).__name__}"
                ) from None
            for source in sources:
                if not any(source is seen for seen in flat):
                    flat.append(source)
        if len(flat) == 1:
            return flat[0]
        for signal in signals:
            if len(signal._sources) == len(flat):
                # Already listens to every source (a wrapper's deadline fused with the
                # caller's signal, fused again with the caller's): the same signal.
                return signal
        fused = cls()
        fused._sources = tuple(flat)
        # The earliest, compared on one clock; kept on its own (every clock runs at the same pace).
        earliest = min(flat, key=lambda source: source._local_deadline())
        fused._deadline, fused._deadline_on = earliest._deadline, earliest._deadline_on
        return fused

    # -- state -----------------------------------------------------------------

    @property
    def cancelled(self) -> bool:
        """Whether the signal has fired (explicitly, through a source, or by deadline)."""
        if self._fired_at:
            return True
        if self._sources:  # a fused signal never fires itself: it asks its sources
            return any(source.cancelled for source in self._sources)
        if self._deadline != _INF:
            # Outside a run (a worker thread polling): on the clock of the run that listened last
            # (an explicit cancel from such a thread is timed on it too), else on its own, never on
            # perf_counter while the signals it is compared with fired on a run's clock: any() must
            # still tell which came first.
            clock = _current_clock() or self._clock or self._deadline_on[1]
            deadline = self._deadline_in(clock)
            if _clock_now(clock) >= deadline:
                self._fire(self._deadline_reason, when=deadline)
                return True
        return False

    def _local_deadline(self) -> float:
        """The deadline as a time on the running trio run's clock (outside one, on ``time.perf_counter``)."""
        return self._deadline_in(_current_clock())

    def _deadline_in(self, clock: trio.abc.Clock | None) -> float:
        """The deadline as a time on ``clock``, the running run's (``None``: outside any run).

        A deadline taken on another clock (another run's, or before any) is moved
        onto this run's with the time it has left: trio's clocks differ by a random
        offset per run, and a MockClock runs at its own pace, so only what is left
        carries over.
        """
        deadline = self._deadline
        if deadline == _INF or deadline == -_INF:
            return deadline
        on, on_clock = self._deadline_on
        if clock is on_clock:
            return on
        local = _clock_now(clock) + (on - _clock_now(on_clock))
        if clock is not None:
            self._deadline_on = (local, clock)
        return local

    @property
    def reason(self) -> object:
        """Why it fired (``None`` while it has not)."""
        if self._sources:
            fired = [s for s in self._sources if s.cancelled]
            # First in time: a deadline that passed before an explicit cancel was noticed still came first.
            return min(fired, key=lambda s: (s._fired_when, s._fired_at))._reason if fired else None
        return self._reason if self.cancelled else None

    @property
    def deadline(self) -> float:
        """The earliest deadline this signal carries (``math.inf`` when none), on the running run's clock.

        Outside a trio run, on ``time.perf_counter``.
        """
        return self._local_deadline()

    @property
    def sources(self) -> tuple[CancelSignal, ...]:
        """The signals a fused signal listens to (empty for a plain signal)."""
        return self._sources

    def cancel(self, reason: object = None) -> None:
        """Fire the signal; ``reason`` defaults to ``"cancelled"``. Idempotent.

        A fused signal cannot be fired directly: fire one of its sources.
        """
        if self._sources:
            raise TypeError("a fused CancelSignal fires through its sources; cancel one of them")
        if not self._fired_at:
            self._fire("cancelled" if reason is None else reason)

    def _fire(self, reason: object, *, when: float | None = None) -> None:
        with _LISTENING:
            if self._fired_at:
                return  # fired meanwhile by another thread: its reason stands, its listeners are its to wake
            # The time and reason before the mark: a reader in the run that sees the
            # signal fired (from another thread, just now) reads them complete.
            self._fired_when = _now(self._clock) if when is None else when
            self._reason = reason
            self._fired_at = next(_fire_order)
            listeners, self._listeners = self._listeners, None
        if not listeners:
            return
        try:
            current: trio.lowlevel.TrioToken | None = trio.lowlevel.current_trio_token()
        except RuntimeError:  # another thread
            current = None
        for entry in listeners:
            if entry.token is None or entry.token is current:
                _call(entry.callback)
            else:
                # Trio's events and cancel scopes may be touched only from their run's thread.
                with contextlib.suppress(trio.RunFinishedError):  # that run is over: nobody is left to wake
                    entry.token.run_sync_soon(_call, entry.callback)

    async def wait(self) -> None:
        """Block until the signal fires (returns at once if it already has)."""
        if self.cancelled:
            return
        # No nursery, for a fused signal either: a cancellation of the waiter came out of one
        # wrapped in an exception group, which an ``except trio.Cancelled`` around the wait missed.
        fired = trio.Event()  # this wait's own, in this run
        remove = self.subscribe(fired.set)
        try:
            with trio.move_on_at(self._local_deadline()):
                await fired.wait()
        finally:
            remove()
        self.cancelled  # noqa: B018 - evaluating fires a passed deadline

    # -- linking to cancel scopes ---------------------------------------------

    def subscribe(self, listener: Callable[[], None]) -> Callable[[], None]:
        """Call ``listener()`` once when the signal fires explicitly; returns the unsubscriber.

        Deadlines do not call listeners (nothing runs at the deadline); use
        :meth:`link` to have a cancel scope honour both.
        """
        if not self._sources:
            return self._add_listener(listener)
        called = False

        def once() -> None:
            # Several sources may fire: the fused signal fires once.
            nonlocal called
            if not called:
                called = True
                listener()

        removers = [target._add_listener(once) for target in self._sources]

        def unsubscribe() -> None:
            for remove in removers:
                remove()

        return unsubscribe

    def _add_listener(self, listener: Callable[[], None]) -> Callable[[], None]:
        try:
            token: trio.lowlevel.TrioToken | None = trio.lowlevel.current_trio_token()
        except RuntimeError:
            token = None  # outside a trio run: the listener runs where cancel() is called
        else:
            if token is not self._clock_token:
                self._clock, self._clock_token = trio.lowlevel.current_clock(), token
        entry = _Listener(listener, token)
        with _LISTENING:
            fired = bool(self._fired_at)
            if not fired:
                if self._listeners is None:
                    self._listeners = []
                listeners = self._listeners
                listeners.append(entry)
        if fired:
            # Fired by another thread after the caller looked: no wake-up is coming, so now.
            _call(listener)
            return _noop
        return _Remover(listeners, entry)

    def link(self, scope: trio.CancelScope) -> Callable[[], None]:
        """Make ``scope`` cancel when this signal fires; returns the unlinker.

        A signal that already fired cancels the scope at once; a deadline becomes
        the scope's deadline (the earlier of the two wins).
        """
        if self.cancelled:
            scope.cancel()
            return _noop
        if self._deadline != _INF:
            deadline = self._local_deadline()
            if deadline < scope.deadline:
                scope.deadline = deadline
        return self.subscribe(scope.cancel)

    def __repr__(self) -> str:
        state = f"cancelled reason={self.reason!r}" if self.cancelled else "pending"
        return f"<CancelSignal {state}>"


def _noop() -> None:
    return None


def _current_clock() -> trio.abc.Clock | None:
    try:
        return trio.lowlevel.current_clock()
    except RuntimeError:
        return None


def _clock_now(clock: trio.abc.Clock | None) -> float:
    # trio's clocks may be read from any thread: SystemClock is perf_counter() plus an
    # offset, MockClock a few floats.
    return clock.current_time() if clock is not None else time.perf_counter()


class _Listener:
    """A listener and the trio run it listens in (``None``: none, it is called where the signal fires)."""

    __slots__ = ("callback", "token")

    def __init__(self, callback: Callable[[], None], token: trio.lowlevel.TrioToken | None) -> None:
        self.callback = callback
        self.token = token


# Guards a signal's listener list and its firing mark together: a listener added in a run while
# another thread fires the signal is either in the list the firing takes, or sees it fired.
_LISTENING = threading.Lock()


def _call(listener: Callable[[], None]) -> None:
    try:
        listener()
    except Exception as exc:
        # One broken listener must not keep the others (the runtime's cancel scopes) from hearing it.
        logger.warning("CancelSignal listener %r failed: %s: %s", listener, type(exc).__name__, exc)


class _Remover:
    """Removes one listener (cheaper per call than a closure plus contextlib.suppress)."""

    __slots__ = ("_entry", "_listeners")

    def __init__(self, listeners: list[_Listener], entry: _Listener) -> None:
        self._listeners = listeners
        self._entry = entry

    def __call__(self) -> None:
        # No lock: list.remove is one atomic step, and a list the firing took is no one's to change.
        try:  # noqa: SIM105 - contextlib.suppress costs more on this per-call path
            self._listeners.remove(self._entry)
        except ValueError:
            pass


