"""``run_tool_calls``: execute one model turn's tool calls with bounded, conflict-aware parallelism.

Calls are taken in model order and classified just before each would start
(:func:`~dsh_core._resources.classify_call`):

* **Exclusive** — an unkeyed call whose tool is not concurrency-safe (or whose
  ``resource_keys`` raised or returned something malformed). It is a full
  barrier: it waits until every earlier call has settled, runs alone, and
  nothing after it starts before it is done. Exactly today's behaviour.
* **Parallel** — an unkeyed call whose ``is_concurrency_safe(args)`` is
  ``True``. It overlaps with every other non-exclusive call of its group.
* **Keyed** — a call whose tool's ``resource_keys(args)`` returned
  ``{"read": [...], "write": [...]}``. The keys replace ``is_concurrency_safe``
  for it: it overlaps with parallel calls and with keyed calls it does not
  conflict with, and its dispatch waits until every *earlier* keyed call it
  conflicts with (write/write or read/write on a shared key) has settled. So
  for every key, conflicting accesses happen in model order, and the turn has
  the effects of running the calls one by one, while readers of one key, and
  calls on disjoint keys, overlap. Empty key lists conflict with nothing.

A run of consecutive non-exclusive calls forms a group that shares a rolling
pool of ``max_parallel`` slots; a keyed call waiting for a conflicting one
holds its slot (so a later, non-conflicting call may start before it). A tool
without ``resource_keys`` is scheduled exactly as before.

Within a group only the dispatch stage (wrappers and body) overlaps: policies
are decided in model order before a call starts, and post-execute,
finalisation and the ``dsh_result`` observers run in model order as the calls
settle. A keyed call whose signal fires while it waits stops waiting and ends
``ABORTED_BEFORE_DISPATCH``.

A cancellation of the caller's own scope (or an interpreter exit) ends the
turn without results: every call it had begun (its policy started) and not
committed is told ``dsh_call_unwound``, wherever it was (deciding, waiting for
a key, dispatching, or waiting to be committed); a call not begun is not.
Calls that settle inline never suspend, so the turn looks for that cancellation
before it begins each call (a deadline that passed while quick calls ran stops
the next one from starting), and lets other tasks run every
``_CALLS_PER_YIELD`` calls, so a long batch of them does not starve the host.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Final

import trio

from . import _pipeline
from ._execution import Exclusive, Parallel, ToolExecutionInput, input_of
from ._resources import KeyIndex, ResourceClaim, classify_call, settle_after, wait_for_settled
from ._results import ToolExecutionResult
from ._runtime import ToolRuntime
from ._signal import CancelSignal
from ._waterfall import lone_exit

__all__ = ["run_tool_calls"]

# A batch of calls that settle inline gives other tasks a turn after this many (a checkpoint
# costs a few microseconds; a call that settles inline, about as much again).
_CALLS_PER_YIELD: Final = 16


class _Pace:
    """Where a turn checkpoints between calls: each call looks for a cancellation, every Nth yields."""

    __slots__ = ("begun",)

    def __init__(self) -> None:
        self.begun = 0

    async def before_call(self) -> None:
        self.begun += 1
        if self.begun % _CALLS_PER_YIELD:
            await trio.lowlevel.checkpoint_if_cancelled()
        else:
            await trio.lowlevel.checkpoint()


async def run_tool_calls(
    runtime: ToolRuntime, inputs: Iterable[ToolExecutionInput], max_parallel: int = 10
) -> list[ToolExecutionResult]:
    """Execute ``inputs`` as a model turn; results come back in input order.

    Each call is classified (exclusive, parallel, or by its resource keys; see
    the module documentation) just before it would start, so a registry change
    between calls is honoured. ``max_parallel=1`` runs everything serially.
    Every input yields exactly one result, including calls whose signal fired
    before they started (``ABORTED_BEFORE_DISPATCH``).
    """
    if not isinstance(runtime, ToolRuntime):
        raise TypeError(f"run_tool_calls() takes a ToolRuntime first, got {type(runtime).__name__}")
    if type(max_parallel) is not int or max_parallel < 1:
        raise ValueError(f"max_parallel must be a positive integer, got {max_parallel!r}")
    calls = list(inputs)
    for position, call in enumerate(calls):
        if not isinstance(call, ToolExecutionInput):
            raise TypeError(f"run_tool_calls() takes ToolExecutionInput items, got {type(call).__name__} at position {position}")
    results: list[ToolExecutionResult | None] = [None] * len(calls)
    pace = _Pace()
    index = 0
    while index < len(calls):
        await pace.before_call()
        kind = classify_call(runtime, calls[index])
        if isinstance(kind, Exclusive):
            results[index] = await runtime.execute(calls[index])
            index += 1
        else:
            begun: list[_pipeline.PreparedCall] = []
            try:
                index = await _run_group(runtime, calls, index, kind, results, max_parallel, begun, pace)
            except BaseException as exc:
                # A lone interrupt, or nothing but cancellations, goes on bare, as out of execute(),
                # not grouped by the group's tasks: a host's ``except trio.Cancelled`` sees it.
                cause = _only_cancelled(exc) or lone_exit(exc)
                # Its tasks are over: a call not committed by now never will be.
                for prepared in begun:
                    _pipeline.unwound(prepared, cause)
                if cause is exc:
                    raise
                raise cause from None
    return [result for result in results if result is not None]


def _only_cancelled(exc: BaseException) -> trio.Cancelled | None:
    """The first ``trio.Cancelled`` of ``exc`` when it holds nothing else (at any depth), else ``None``."""
    if not isinstance(exc, BaseExceptionGroup):
        return None
    first: trio.Cancelled | None = None
    pending: list[BaseException] = [exc]
    while pending:
        current = pending.pop()
        if isinstance(current, BaseExceptionGroup):
            pending.extend(reversed(current.exceptions))
        elif isinstance(current, trio.Cancelled):
            first = first or current
        else:
            return None
    return first


async def _run_group(
    runtime: ToolRuntime,
    calls: list[ToolExecutionInput],
    start: int,
    first: ResourceClaim | Parallel,
    results: list[ToolExecutionResult | None],
    max_parallel: int,
    begun: list[_pipeline.PreparedCall],
    pace: _Pace,
) -> int:
    """Run the group of non-exclusive calls starting at ``start``; returns the index after it.

    Every call it prepares is appended to ``begun`` (one it drops unwinding must be told so).

    Only a dispatch that can suspend gets a task and a slot for its whole
    duration: one that cannot (an inline body, no wrapper that suspends) would
    gain nothing from overlapping, so it runs right after its policy, in the
    loop. Likewise a call is committed (post-execute, finalisation, observers)
    by the loop itself when nothing before it waits to be committed (and its
    commit is not expected to wait on anything), and through the in-order
    commit task otherwise. A call that would do all of that in the loop, with
    nothing in flight before it, is simply executed there.
    """
    limiter = trio.CapacityLimiter(max_parallel)
    # Unbounded: the limiter bounds the dispatches in flight; what waits here is settled or dispatching.
    send, receive = trio.open_memory_channel[tuple[int, _pipeline.PreparedCall, trio.Event | None]](math.inf)
    keys = KeyIndex()
    uncommitted = 0
    # The settle events of the dispatches running in tasks (for a rewritten call's barrier),
    # in start order; each dispatch removes its own as it settles, so no start rescans the rest.
    running: dict[trio.Event, None] = {}
    # Set by the commit task when nothing is left to commit, for a barrier waiting for that.
    drained: trio.Event | None = None

    async def all_committed(signal: CancelSignal) -> None:
        """Until every call before the next has been committed (or ``signal`` fires)."""
        nonlocal drained
        while uncommitted and not signal.cancelled:
            drained = trio.Event()
            await wait_for_settled(signal, [drained])

    async def dispatch(
        call: _pipeline.PreparedCall, settled: trio.Event, slot: object, after: Sequence[trio.Event]
    ) -> None:
        try:
            if after:
                await wait_for_settled(call.execution.signal, after)
            await _pipeline.dispatch(runtime, call)
        finally:
            limiter.release_on_behalf_of(slot)
            await settle_after(after, settled)
            del running[settled]

    async def commit() -> None:
        # Finalise strictly in model order, whatever order the dispatches settle in.
        nonlocal uncommitted
        async with receive:
            async for position, call, settled in receive:
                if settled is not None:
                    await settled.wait()
                results[position] = await _pipeline.finalize(runtime, call)
                uncommitted -= 1
                if not uncommitted and drained is not None:
                    drained.set()

    index = start
    async with trio.open_nursery() as nursery:
        nursery.start_soon(commit)
        async with send:
            while index < len(calls):
                if index != start:  # the group's first call was paced before the group began
                    await pace.before_call()
                request = calls[index]
                classified_at = runtime._registry.version
                kind = first if index == start else classify_call(runtime, request)
                if isinstance(kind, Exclusive):
                    break
                if uncommitted == 0 and not isinstance(kind, ResourceClaim) and _pipeline.settles_inline(runtime, request):
                    # Nothing before it is in flight (every such call is uncommitted) and it cannot
                    # suspend once its policy is decided: the steps below would run back to back.
                    results[index] = await _pipeline.execute(runtime, request)
                    index += 1
                    continue
                slot = object()
                try:
                    # A free slot needs no checkpoint; only a full pool makes the loop wait.
                    limiter.acquire_on_behalf_of_nowait(slot)
                except trio.WouldBlock:
                    await limiter.acquire_on_behalf_of(slot)
                call = await _pipeline.prepare(runtime, request)
                begun.append(call)
                settled: trio.Event | None = None
                barrier = False
                changed = call.rewrites is not None or runtime._registry.version != classified_at
                if call.step == "dispatch" and changed and classify_call(runtime, input_of(call.execution)) != kind:
                    # A policy rewrote the arguments, or the tool was replaced while the policies
                    # decided, and the call now schedules otherwise (other keys, or exclusive): it
                    # was admitted as something it no longer is. Run it as a barrier, as an
                    # exclusive call runs: once everything before it has settled and been
                    # committed, and committed itself before anything after it starts.
                    try:
                        await wait_for_settled(call.execution.signal, list(running))
                        await all_committed(call.execution.signal)
                        await _pipeline.dispatch(runtime, call)
                    finally:
                        limiter.release_on_behalf_of(slot)
                    barrier = True
                elif call.step == "dispatch":
                    # The tool may be replaced before its body runs (while it waits for a key, say):
                    # the body stage then refuses a replacement this schedule does not cover.
                    call.admitted = kind
                    claimed: trio.Event | None = None
                    after: list[trio.Event] = []
                    if isinstance(kind, ResourceClaim):
                        claimed = trio.Event()
                        after = keys.claim(kind, claimed)
                    if not after and not call.dispatch_suspends:
                        try:
                            await _pipeline.dispatch(runtime, call)
                        finally:
                            limiter.release_on_behalf_of(slot)
                            if claimed is not None:
                                claimed.set()
                    else:
                        settled = claimed if claimed is not None else trio.Event()
                        running[settled] = None
                        nursery.start_soon(dispatch, call, settled, slot, after)
                else:
                    # Decided before dispatch (denied, aborted...): it touches no resource,
                    # so it claims no key and later calls keep waiting on the real holders.
                    limiter.release_on_behalf_of(slot)
                if settled is None and uncommitted == 0 and (barrier or not call.hooks.finish_suspends):
                    results[index] = await _pipeline.finalize(runtime, call)
                else:
                    uncommitted += 1
                    send.send_nowait((index, call, settled))
                index += 1
    return index
