"""``schemas()`` and the Code Mode SDK text for 1 000 registered tools.

The tools are ``t0000 … t0999``, each ``(a: int, b: int) -> int`` with a
description, sharing one parameter schema (so one compiled validator, as
PERF-ANCHORS.md's export rows do). The floor is the plain-Python export a host
could do with prebuilt schema dicts; the SDK text is compared with
``json.dumps`` of the same 1 000 schemas (the wire encoding of the native list).
"""

from __future__ import annotations

import json
from typing import Any

from dsh_core import ToolDefinition, ToolRuntime

from ._fixtures import add_tool, runtime_with
from ._harness import Bench, Case, Clock, Expect, Target, Timer, loop_timer

GROUP = "schemas"


def tool_set(count: int) -> list[ToolDefinition]:
    """``count`` distinct ``add``-shaped tools named ``t0000``…, with descriptions."""
    return [add_tool(f"t{index:04d}", f"Tool number {index}: add two integers.") for index in range(count)]


_runtimes: dict[int, ToolRuntime] = {}


def shared_runtime(count: int) -> ToolRuntime:
    runtime = _runtimes.get(count)
    if runtime is None:
        runtime = _runtimes[count] = runtime_with(tools=tool_set(count))
    return runtime


def _floor_timer(count: int) -> Timer:
    prebuilt = [
        (tool.name, tool.description, dict(tool.parameters)) for _, tool in shared_runtime(count).registrations()
    ]
    stmt = '[{"name": name, "description": text, "input_schema": schema} for name, text, schema in PREBUILT]'
    return loop_timer(stmt, {"PREBUILT": prebuilt})


def _first_call_timer(count: int) -> Timer:
    """``schemas()`` right after a registry change; the change itself is not timed."""
    runtime = shared_runtime(count)
    probe = add_tool("zz_probe")

    def timer(n: int, clock: Clock) -> float:
        total = 0.0
        disposer = None
        for _ in range(n):
            if disposer is None:
                disposer = runtime.register(probe)
            else:
                disposer()
                disposer = None
            start = clock()
            runtime.schemas()
            total += clock() - start
        if disposer is not None:
            disposer()
        return total

    return timer


def _json_floor_timer(count: int) -> Timer:
    schemas = [schema.to_dict() for schema in shared_runtime(count).schemas()]
    return loop_timer("dumps(SCHEMAS)", {"dumps": json.dumps, "SCHEMAS": schemas})


def _sdk_timer(count: int) -> Timer:
    from dsh_core.code_mode import render_python_sdk

    tools = [tool for _, tool in shared_runtime(count).registrations()]
    return loop_timer("render(TOOLS)", {"render": render_python_sdk, "TOOLS": tools})


def _has_tools(count: int) -> Expect:
    def check(exported: Any) -> str | None:
        return None if len(exported) == count else f"expected {count} tools, got {len(exported)}"

    return check


def cases(smoke: bool) -> list[Case]:
    count = 1000
    return [
        Bench(key="schemas.floor", label=f"floor: plain-Python export of {count} prebuilt schema dicts",
              setup=lambda: _floor_timer(count), expect=_has_tools(count)),
        Bench(key="schemas.first", label=f"schemas(), {count} tools, first call after a change",
              setup=lambda: _first_call_timer(count), vs="schemas.floor"),
        Bench(key="schemas.repeat", label=f"schemas(), {count} tools, repeated call",
              setup=lambda: loop_timer("runtime.schemas()", {"runtime": shared_runtime(count)}),
              vs="schemas.floor", target=Target(limit=50, absolute=True), expect=_has_tools(count)),
        Bench(key="schemas.json", label=f"floor: json.dumps of the {count} schemas (wire encoding)",
              setup=lambda: _json_floor_timer(count), vs="schemas.floor"),
        Bench(key="schemas.sdk", label=f"render_python_sdk, {count} tools", setup=lambda: _sdk_timer(count),
              vs="schemas.json",
              expect=lambda text: None if f"t{count - 1:04d}" in text else "the SDK text does not name every tool"),
    ]  # fmt: skip
