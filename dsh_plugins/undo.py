"""Undo: revert what completed calls did, newest first, through each tool's declared ``revert``.

A tool that can be undone declares ``define_tool(..., revert=fn)``: ``fn(args,
value)`` undoes one successful call given its arguments and canonical value
(``write_file`` restores the text it replaced, ``edit_file`` puts the old
string back), and raises when it cannot, because the world changed since in a
way it cannot undo safely. This plugin remembers every call of such a tool
whose body succeeded (a policy blocking the result afterwards does not undo
what the body did), Code Mode sub-calls included, and undoes them on request::

    [plugins.undo]
    enabled = true
    max_entries = 1000        # the oldest are forgotten past this (they can no longer be undone)

    log = runtime.plugins.get_plugin("undo-log")
    outcomes = await log.undo(3)                   # the last three undoable calls, newest first
    outcomes = await log.undo_to("call_17")        # call_17 (or its run_code sub-calls) and all after it

Undo is the host's action (a person's "undo" button, a rejected turn), not the
model's: the reverts run directly, outside the tool pipeline, one at a time,
newest first. Requests that overlap (two clicks of the button) take turns:
each chooses its entries only once the one before it has finished, so no entry
is reverted twice. It stops at the first revert that fails, since an earlier
effect may be what a later one depended on; that entry and the older ones stay
in the log (``keep_going=True`` attempts every entry instead, for effects
known to be independent). A revert cancelled part-way leaves its entry in the
log, announced neither way: it is not known to be undone, and a later attempt
meets the tool's own check that the world still matches. Each outcome is also
sent to the runtime's ``event_sink`` as ``tool/reverted`` or
``tool/revert-failed`` (a :class:`~dsh_core.SessionRecorder` keeps them). The log lives in memory: it undoes what this process did.
"""

from __future__ import annotations

import collections
import inspect
import itertools
import weakref
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Final

import attrs
import trio

from dsh_core import (
    PreToolDecision,
    ScopeKey,
    TableCheck,
    ToolDispatchExecution,
    ToolExecution,
    ToolExecutionResult,
    ToolExecutionSuccess,
    ToolExecutionToken,
    ToolRuntime,
    check_validator,
    hookimpl,
    scope_id,
    structure_table,
)

from ._settings_warnings import report_inert_keys

__all__ = ["PLUGIN_NAME", "UndoEntry", "UndoLog", "UndoOutcome", "UndoSettings"]

PLUGIN_NAME: Final = "undo-log"  # the entry point's module is registered as "undo"
MAX_ENTRIES: Final = 100_000

DSH_CAPABILITIES: dict[str, list[str]] = {"tools": [], "affects": []}



def _max_entries_problem(value: int) -> str | None:
    if type(value) is not int or not 1 <= value <= MAX_ENTRIES:
        return f"must be an integer from 1 to {MAX_ENTRIES}, got {value!r}"
    return None


@attrs.frozen(kw_only=True)
class UndoSettings:
    """The ``[plugins.undo]`` table."""

    enabled: bool = False
    max_entries: Annotated[int, TableCheck(_max_entries_problem)] = attrs.field(
        default=1000, validator=check_validator(_max_entries_problem)
    )


class _AnyAgent:
    """``undo_to``'s default: calls of every agent."""


_ANY_AGENT: Final = _AnyAgent()


@attrs.frozen(kw_only=True, slots=True)
class UndoEntry:
    """One successful call that can be undone: what ran, what it returned, and how to revert it."""

    call_id: str
    root_call_id: str
    tool: str
    agent: ScopeKey | None
    arguments: Any
    value: Any
    revert: Callable[[Any, Any], object] = attrs.field(repr=False)
    # The run_code execution a sub-call belongs to (its parent's token): sub-calls of one run
    # finish, and are recorded, in any order, and runs may reuse an id.
    run: object | None = attrs.field(default=None, repr=False, eq=False)
    # When its dispatch started, among this log's: the order the calls were made in.
    dispatch: int = attrs.field(default=0, repr=False, eq=False)


@attrs.frozen(kw_only=True, slots=True)
class UndoOutcome:
    """What undoing one entry did: ``reverted``, or the ``error`` that stopped the undo there."""

    call_id: str
    tool: str
    reverted: bool
    error: str | None = None


class UndoLog:
    """The undo log of one runtime (register it as a plugin; see the module documentation).

    Args:
        runtime: the runtime whose calls it records (for the tools' ``revert``
            and its ``event_sink``).
        max_entries: how many undoable calls to remember; older ones are forgotten.
    """

    def __init__(self, runtime: ToolRuntime, *, max_entries: int = 1000) -> None:
        check_validator(_max_entries_problem)(self, attrs.fields(UndoSettings).max_entries, max_entries)
        self.runtime = runtime
        self._entries: collections.deque[UndoEntry] = collections.deque(maxlen=max_entries)
        # Calls numbered in the order they were made (pre-execute runs in model order; their
        # dispatches start, and finish, in any order): the log keeps that order.
        self._dispatches = itertools.count()
        self._made: weakref.WeakKeyDictionary[ToolExecutionToken, int] = weakref.WeakKeyDictionary()
        self.forgotten = 0
        """How many undoable calls were dropped for ``max_entries``."""
        # Held while a request chooses its entries and reverts them: a second request choosing
        # while the first awaits a revert would pick the same entry and revert it again.
        self._undoing = trio.Lock()

    def entries(self) -> tuple[UndoEntry, ...]:
        """The calls that can be undone, oldest first (in the order they were made, not finished)."""
        return tuple(self._entries)

    @hookimpl(tryfirst=True)
    async def dsh_pre_execute(
        self, execution: ToolExecution, next: Callable[[], Awaitable[PreToolDecision]]
    ) -> PreToolDecision:
        self._made[execution.token] = self._dispatches.__next__()  # (the hook's own next() is the chain)
        return await next()

    @hookimpl(tryfirst=True)
    async def dsh_execute(
        self, execution: ToolDispatchExecution, next: Callable[[], Awaitable[ToolExecutionResult]]
    ) -> ToolExecutionResult:
        # What the body itself did, outside every other wrapper and before any post-execute
        # listener: a call a policy blocks afterwards (or whose value it replaces), or that the
        # caller's signal turned ABORTED as the body returned, still did its work and can be
        # undone; an answer a wrapper gave without running the body here (the effect ledger's
        # record of an earlier process) did nothing here to undo. Recorded also when next()
        # raises after the body returned (the caller's scope cancelled on the way out, an inner
        # wrapper raising): the work happened all the same. No await stands between.
        dispatch = self._made.pop(execution.token, None)
        if dispatch is None:  # dispatched without its pre-execute stage here (a plugin registered meanwhile)
            dispatch = self._dispatches.__next__()
        try:
            return await next()
        finally:
            body = execution.body_result
            if isinstance(body, ToolExecutionSuccess):
                self._record(execution, body, dispatch)

    def _record(self, execution: ToolDispatchExecution, result: ToolExecutionSuccess, dispatch: int) -> None:
        definition = self.runtime.get(execution.name, execution.agent)
        if definition is None or definition.revert is None:
            return
        if len(self._entries) == self._entries.maxlen:
            self.forgotten += 1
            self._entries.popleft()  # the oldest, so that one made earlier can still go in its place
        # Where it belongs by when it was made: usually last; a parallel call that finished
        # before one made earlier goes before it (undo_to("c2") then takes c3 as well).
        index = len(self._entries)
        while index and self._entries[index - 1].dispatch > dispatch:
            index -= 1
        self._entries.insert(
            index,
            UndoEntry(
                call_id=execution.call_id,
                root_call_id=execution.root_call_id,
                tool=execution.name,
                agent=execution.agent,
                arguments=execution.arguments,
                value=result.value,
                revert=definition.revert,
                run=execution.parent,
                dispatch=dispatch,
            ),
        )

    async def undo(
        self, count: int = 1, *, where: Callable[[UndoEntry], bool] | None = None, keep_going: bool = False
    ) -> list[UndoOutcome]:
        """Undo the ``count`` newest entries (of those ``where`` accepts), newest first.

        Returns one outcome per revert attempted; the last one failed when the
        undo stopped early. ``keep_going=True`` goes on past a failed revert
        (for effects known to be independent, such as edits of different
        files): every entry is attempted, and the failed ones stay in the log.
        Fewer entries than ``count`` is not an error.

        Raises:
            ValueError: ``count`` is not a positive integer.
            TypeError: ``where`` is an async function (its answer would be a coroutine,
                true for every entry: everything would be undone).
        """
        if type(count) is not int or count < 1:
            raise ValueError(f"count must be a positive integer, got {count!r}")
        async with self._undoing:
            chosen = [entry for entry in reversed(self._entries) if where is None or _accepts(where, entry)][:count]
            return await self._revert(chosen, keep_going)

    async def undo_to(
        self, call_id: str, *, agent: ScopeKey | _AnyAgent | None = _ANY_AGENT, keep_going: bool = False
    ) -> list[UndoOutcome]:
        """Undo the call ``call_id`` and everything recorded after it, newest first.

        ``call_id`` may also be a ``run_code`` call's id: its undoable sub-calls,
        and everything after the first of them, are undone. An id used more than
        once (providers may reuse ids across turns) means its newest use, a plain
        call or a ``run_code`` run. ``agent`` (a scope key, or ``None`` for calls
        made without one) keeps to that agent's calls: the call is looked for
        among them, and only they are undone; call ids are per agent, so a host
        with several names the agent whose turn it rejects. ``keep_going`` as for
        :meth:`undo`.

        Raises:
            LookupError: no undoable call has that id (never recorded, already undone, or forgotten).
        """
        async with self._undoing:
            entries = [
                entry for entry in self._entries if isinstance(agent, _AnyAgent) or _same_agent(entry.agent, agent)
            ]
            start = _newest_call(entries, call_id)
            if start is not None:
                return await self._revert(list(reversed(entries[start:])), keep_going)
        whose = "" if isinstance(agent, _AnyAgent) else f" of agent {scope_id(agent)!r}"
        raise LookupError(f"no undoable call {call_id!r}{whose} (it failed, was undone, or was forgotten)")

    async def _revert(self, chosen: list[UndoEntry], keep_going: bool) -> list[UndoOutcome]:
        outcomes: list[UndoOutcome] = []
        for entry in chosen:
            try:
                done = entry.revert(entry.arguments, entry.value)
                if inspect.isawaitable(done):
                    await done
            except Exception as exc:
                reason = str(exc) or type(exc).__name__
                outcome = UndoOutcome(call_id=entry.call_id, tool=entry.tool, reverted=False, error=reason)
                outcomes.append(outcome)
                self._announce("tool/revert-failed", entry, outcome.error)
                if keep_going:
                    continue
                break
            self._forget(entry)
            outcomes.append(UndoOutcome(call_id=entry.call_id, tool=entry.tool, reverted=True))
            self._announce("tool/reverted", entry, None)
        return outcomes

    def _forget(self, undone: UndoEntry) -> None:
        # By identity: two entries can hold equal fields (a provider reusing a call id).
        for index, entry in enumerate(self._entries):
            if entry is undone:
                del self._entries[index]
                return

    def _announce(self, event_type: str, entry: UndoEntry, error: str | None) -> None:
        data: dict[str, Any] = {
            "call_id": entry.call_id,
            "root_call_id": entry.root_call_id,
            "tool": entry.tool,
            "agent": scope_id(entry.agent),
        }
        if error is not None:
            data["error"] = error
        # A broken sink is logged and ignored: the revert happened (or failed) either way.
        self.runtime.send_event(event_type, data)


def _accepts(where: Callable[[UndoEntry], bool], entry: UndoEntry) -> bool:
    verdict = where(entry)
    if inspect.isawaitable(verdict):
        if inspect.iscoroutine(verdict):
            verdict.close()  # never awaited, and said so here rather than by a RuntimeWarning
        raise TypeError("undo(where=...) takes a plain function returning a bool, not an async one")
    return bool(verdict)


def _same_agent(entry_agent: ScopeKey | None, agent: ScopeKey | None) -> bool:
    return entry_agent is agent or entry_agent == agent or scope_id(entry_agent) == scope_id(agent)


def _newest_call(entries: list[UndoEntry], call_id: str) -> int | None:
    """Where undoing ``call_id`` starts: its newest entry, or the first sub-call of its newest ``run_code`` run.

    A provider may reuse ids across turns, so the newest use is meant, whichever
    kind it was. A run's sub-calls finish, and are recorded, in any order
    (``asyncio.gather``): the run is told apart by its token, not by numbers.
    """
    for newest in range(len(entries) - 1, -1, -1):
        entry = entries[newest]
        if entry.call_id == call_id:
            return newest
        if entry.root_call_id == call_id:
            break
    else:
        return None
    run = entries[newest].run
    if run is None:  # not recorded through the bridge: the entry itself
        return newest
    # Every sub-call of that run holds its token, whatever order they finished in; an earlier
    # run with the same id holds another.
    return next(index for index, entry in enumerate(entries) if entry.run is run)


@hookimpl
def dsh_setup(runtime: ToolRuntime, config: dict[str, Any]) -> None:
    """Register an :class:`UndoLog` (named ``undo-log``) when ``enabled = true``."""
    settings = structure_table(UndoSettings, config, "[plugins.undo]")
    if settings.enabled:
        runtime.plugins.register(UndoLog(runtime, max_entries=settings.max_entries), name=PLUGIN_NAME)
    else:
        report_inert_keys(runtime, "undo", config, "enabled", "the undo log is off: set enabled = true to turn it on")
