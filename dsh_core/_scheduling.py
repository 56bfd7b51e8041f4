"""``run_tool_calls``: execute one model turn's tool calls with bounded parallelism.

Calls are taken in model order. A run of consecutive ``Parallel`` calls forms a
group that shares a rolling pool of ``max_parallel`` slots; each ``Exclusive``
call waits for the pool to drain and runs alone, as a barrier. Within a group
only the dispatch stage (wrappers and body) overlaps: policies are decided in
model order before a call starts, and post-execute, finalisation and the
``dsh_result`` observers run in model order as the calls settle.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import trio

from . import _pipeline
from ._execution import Parallel, ToolExecutionInput
from ._results import ToolExecutionResult

if TYPE_CHECKING:
    from ._runtime import ToolRuntime

__all__ = ["run_tool_calls"]


async def run_tool_calls(
    runtime: ToolRuntime, inputs: Iterable[ToolExecutionInput], max_parallel: int = 10
) -> list[ToolExecutionResult]:
    """Execute ``inputs`` as a model turn; results come back in input order.

    Each call is classified with ``runtime.execution_mode`` just before it would
    start, so a registry change between calls is honoured. ``max_parallel=1``
    runs everything serially. Every input yields exactly one result, including
    calls whose signal fired before they started (``ABORTED_BEFORE_DISPATCH``).
    """
    if type(max_parallel) is not int or max_parallel < 1:
        raise ValueError(f"max_parallel must be a positive integer, got {max_parallel!r}")
    calls = list(inputs)
    results: list[ToolExecutionResult | None] = [None] * len(calls)
    index = 0
    while index < len(calls):
        if isinstance(runtime.execution_mode(calls[index]), Parallel):
            index = await _run_parallel_group(runtime, calls, index, results, max_parallel)
        else:
            results[index] = await runtime.execute(calls[index])
            index += 1
    return [result for result in results if result is not None]


async def _run_parallel_group(
    runtime: ToolRuntime,
    calls: list[ToolExecutionInput],
    start: int,
    results: list[ToolExecutionResult | None],
    max_parallel: int,
) -> int:
    """Run the parallel group starting at ``start``; returns the index after it."""
    limiter = trio.CapacityLimiter(max_parallel)
    send, receive = trio.open_memory_channel[tuple[int, _pipeline.PreparedCall, trio.Event]](max_parallel)

    async def dispatch(call: _pipeline.PreparedCall, settled: trio.Event, slot: object) -> None:
        try:
            await _pipeline.dispatch(runtime, call)
        finally:
            limiter.release_on_behalf_of(slot)
            settled.set()

    async def commit() -> None:
        # Finalise strictly in model order, whatever order the dispatches settle in.
        async with receive:
            async for position, call, settled in receive:
                await settled.wait()
                results[position] = await _pipeline.finalize(runtime, call)

    index = start
    async with trio.open_nursery() as nursery:
        nursery.start_soon(commit)
        async with send:
            while index < len(calls):
                request = calls[index]
                if index != start and not isinstance(runtime.execution_mode(request), Parallel):
                    break
                slot = object()
                await limiter.acquire_on_behalf_of(slot)
                call = await _pipeline.prepare(runtime, request)
                settled = trio.Event()
                if call.step == "dispatch":
                    nursery.start_soon(dispatch, call, settled, slot)
                else:
                    limiter.release_on_behalf_of(slot)
                    settled.set()
                await send.send((index, call, settled))
                index += 1
    return index
