"""Resource keys: what one call declares it reads and writes, for conflict scheduling.

A tool opts in with ``resource_keys(args) -> {"read": [...], "write": [...]}``
(either list may be left out; keys are non-empty strings such as a path, a
URL or an account id, compared exactly). Two calls *conflict* when one writes
a key the other reads or writes; a key in both lists of one call counts as a
write. :func:`run_tool_calls <dsh_core.run_tool_calls>` and the Code Mode bridge use
this to overlap non-conflicting calls and serialise conflicting ones in the
order they were made.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import attrs
import trio

from ._arguments_text import model_arguments
from ._execution import EXCLUSIVE, Exclusive, Parallel, ToolExecutionInput
from ._registry import RUN_CODE_NAME
from ._signal import CancelSignal
from ._waterfall import is_fatal

if TYPE_CHECKING:
    from ._runtime import ToolRuntime

__all__ = ["KeyIndex", "ResourceClaim", "admits", "classify_call", "settle_after", "wait_for_settled"]


@attrs.frozen(slots=True, kw_only=True)
class ResourceClaim:
    """The keys one call reads and writes (``write`` wins for a key in both)."""

    read: frozenset[str] = frozenset()
    write: frozenset[str] = frozenset()

    def conflicts_with(self, other: ResourceClaim) -> bool:
        """Write/write or read/write on a shared key."""
        return not (
            self.write.isdisjoint(other.write)
            and self.write.isdisjoint(other.read)
            and self.read.isdisjoint(other.write)
        )


# Past this many readers of one key, those that have settled are dropped (at each power of two:
# amortised constant work per claim).
_READERS_BEFORE_PRUNING = 64


class KeyIndex:
    """Per key, the settle events of the last writer and of the readers since (claims made in order)."""

    __slots__ = ("_readers", "_writer")

    def __init__(self) -> None:
        self._writer: dict[str, trio.Event] = {}
        self._readers: dict[str, list[trio.Event]] = {}

    def claim(self, claim: ResourceClaim, settled: trio.Event) -> list[trio.Event]:
        """Record a call's claim; returns the unset settle events its dispatch must wait for.

        An event already set is left out: what it stood for is over, and waiting on it
        would still be a checkpoint, which a call that cannot suspend must not meet.
        """
        after: dict[trio.Event, None] = {}
        for key in claim.write:
            writer = self._writer.get(key)
            if writer is not None:
                after[writer] = None
            after.update(dict.fromkeys(self._readers.pop(key, ())))
            self._writer[key] = settled
        for key in claim.read:
            writer = self._writer.get(key)
            if writer is not None:
                after[writer] = None
            readers = self._readers.setdefault(key, [])
            if len(readers) >= _READERS_BEFORE_PRUNING and len(readers).bit_count() == 1:
                # A program reading one key over and over (never writing it) grew the list
                # without bound: readers that have settled no later writer needs to wait for.
                readers[:] = [reader for reader in readers if not reader.is_set()]
            readers.append(settled)
        return [event for event in after if not event.is_set()]


async def wait_for_settled(signal: CancelSignal, after: Sequence[trio.Event]) -> None:
    """Wait until every event in ``after`` is set, or until ``signal`` fires.

    A fired signal ends the wait quietly: the dispatch that follows sees it and
    ends the call before its wrappers and body run (``ABORTED_BEFORE_DISPATCH``).
    """
    with trio.CancelScope() as scope:
        unlink = signal.link(scope)
        try:
            for event in after:
                await event.wait()
        finally:
            unlink()


async def settle_after(after: Sequence[trio.Event], settled: trio.Event) -> None:
    """Set ``settled`` once everything in ``after`` has settled (shielded).

    A call cancelled while it waited settles early; it reports itself settled only
    once what it waited for has, so "after me" stays transitive for later
    conflicting calls. Those are earlier calls, always drained: no deadlock.
    """
    if after:
        with trio.CancelScope(shield=True):
            for event in after:
                await event.wait()
    settled.set()


def admits(admitted: ResourceClaim | Parallel, now: ResourceClaim | Parallel | Exclusive) -> bool:
    """Whether a call scheduled as ``admitted`` may run as ``now`` without breaking that schedule.

    A parallel call was ordered against no key, so it stays safe only as a call
    touching none; a keyed one, only within the keys it claimed (reading a key
    it claimed to write included).
    """
    if isinstance(now, Exclusive):
        return False
    if isinstance(now, Parallel):
        return True
    if isinstance(admitted, Parallel):
        return not (now.read or now.write)
    return now.write <= admitted.write and now.read <= admitted.read | admitted.write


def _keys(value: object) -> frozenset[str] | None:
    if isinstance(value, str | bytes) or not isinstance(value, list | tuple | set | frozenset):
        return None
    items = tuple(value)
    if any(type(key) is not str or not key for key in items):
        return None  # checked before hashing: an unhashable entry is malformed, not a crash
    return frozenset(items)


def parse_claim(declared: object) -> ResourceClaim | None:
    """A claim from what ``resource_keys`` returned, or ``None`` when it is malformed."""
    if not isinstance(declared, Mapping) or not set(declared) <= {"read", "write"}:
        return None
    read = _keys(declared.get("read", ()))
    write = _keys(declared.get("write", ()))
    if read is None or write is None:
        return None
    return ResourceClaim(read=read - write, write=write)


def classify_call(runtime: ToolRuntime, request: ToolExecutionInput) -> ResourceClaim | Parallel | Exclusive:
    """How ``run_tool_calls`` schedules ``request``: by its keys, or parallel/exclusive as before.

    A visible tool with ``resource_keys`` that returns a well-formed mapping
    gives a :class:`ResourceClaim`. ``None`` (no keys for these arguments; what
    ``define_tool`` answers for invalid arguments) falls back to
    ``runtime.execution_mode``, as for a tool without ``resource_keys``. A
    classifier that raises or returns anything else makes the call
    ``Exclusive``: it declared that it has resources but not which.
    """
    view = runtime._registry.view(request.agent)
    tool = view.tools.get(request.name)
    if tool is None or tool.resource_keys is None:
        return runtime.execution_mode(request)
    if request.parent is None and view.mode == "code" and request.name != RUN_CODE_NAME:
        return EXCLUSIVE
    try:
        declared = tool.resource_keys(model_arguments(request.arguments))
    except BaseException as exc:
        if is_fatal(exc):
            raise
        return EXCLUSIVE
    if declared is None:
        return runtime.execution_mode(request)
    try:
        claim = parse_claim(declared)
    except BaseException as exc:
        # A mapping (or list) that raises while it is read is "anything else" too: it must not
        # take the whole turn down with it.
        if is_fatal(exc):
            raise
        return EXCLUSIVE
    return EXCLUSIVE if claim is None else claim
