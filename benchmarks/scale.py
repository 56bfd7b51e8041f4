"""How the registry scales: execute cost as registered tools grow 10 → 10 000, and memory per tool.

The execute rows call one tool from the middle of the set; each is compared
with the 10-tool row and must stay flat (lookups are cached dict accesses).
Memory is measured with ``tracemalloc`` (allocations still alive after
``gc.collect()``), once per run: a definition (``define_tool``), its
registration (plus the resolved view that ``schemas()`` builds), and the
compiled contract its first ``execute`` caches. The tools share one parameter
schema, so one compiled validator serves them all.
"""

from __future__ import annotations

import functools
import gc
import tracemalloc

import trio

from ._fixtures import make_input, runtime_with, succeeds_with
from ._harness import Bench, Case, Once, Target, Timer, loop_timer
from .schemas import tool_set

GROUP = "scale"

SIZES = (10, 100, 1_000, 10_000)
SMOKE_SIZES = (10, 1_000)


def _execute_timer(count: int) -> Timer:
    runtime = runtime_with(tools=tool_set(count))
    request = make_input(f"t{count // 2:04d}", {"a": 1, "b": 2})
    return loop_timer("await runtime.execute(request)", {"runtime": runtime, "request": request}, "trio")


@functools.cache
def _memory(count: int) -> dict[str, float]:
    """Bytes per tool still allocated after each stage."""

    def traced() -> int:
        gc.collect()
        return tracemalloc.get_traced_memory()[0]

    tracemalloc.start()
    try:
        start = traced()
        tools = tool_set(count)
        defined = traced()
        runtime = runtime_with(tools=tools)
        runtime.schemas()
        registered = traced()

        async def first_calls() -> None:
            for tool in tools:
                await runtime.execute(make_input(tool.name, {"a": 1, "b": 2}))

        trio.run(first_calls)
        executed = traced()
    finally:
        tracemalloc.stop()
    return {
        "definition": (defined - start) / count,
        "registration": (registered - defined) / count,
        "contract": (executed - registered) / count,
    }


def _memory_stage(count: int, stage: str) -> float:
    return _memory(count)[stage]


def cases(smoke: bool) -> list[Case]:
    sizes = SMOKE_SIZES if smoke else SIZES
    memory_count = 100 if smoke else 1_000
    out: list[Case] = [
        Bench(key=f"scale.n{count}", label=f"execute with {count:,} registered tools",
              setup=functools.partial(_execute_timer, count), vs=f"scale.n{sizes[0]}",
              target=None if count == sizes[0] else Target(limit=1.3), expect=succeeds_with(3))
        for count in sizes
    ]  # fmt: skip
    labels = {
        "definition": "memory per tool: define_tool",
        "registration": "memory per tool: register + resolved view",
        "contract": "memory per tool: compiled contract of its first execute",
    }
    for stage, label in labels.items():
        out.append(
            Once(key=f"scale.mem.{stage}", label=f"{label} ({memory_count:,} tools)",
                 measure=functools.partial(_memory_stage, memory_count, stage),
                 vs=None if stage == "definition" else "scale.mem.definition")
        )  # fmt: skip
    return out
