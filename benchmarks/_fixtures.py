"""The tool, listeners and runtimes every group measures: ``add(a, b) -> int`` and no-op plugins.

Also the checks a timed ``add`` call must pass before it is timed (:func:`succeeds_with`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from types import ModuleType
from typing import Any

import trio

from dsh_core import (
    ToolDefinition,
    ToolExecution,
    ToolExecutionFailure,
    ToolExecutionResult,
    ToolRuntime,
    define_tool,
    hookimpl,
)
from dsh_core.testing import make_input

__all__ = [
    "ADD_PARAMETERS",
    "ADD_SCHEMA",
    "ARGS",
    "ARGS_TEXT",
    "NoopListener",
    "add_body",
    "add_body_suspending",
    "add_tool",
    "all_succeed_with",
    "make_input",
    "runtime_with",
    "succeeds_with",
]

ARGS: dict[str, int] = {"a": 1, "b": 2}
ARGS_TEXT = '{"a": 1, "b": 2}'
ADD_PARAMETERS: dict[str, Any] = {
    "a": {"type": "integer", "required": True, "description": "The first addend."},
    "b": {"type": "integer", "required": True, "description": "The second addend."},
}
# The JSON Schema define_tool derives from ADD_PARAMETERS, as fastjsonschema gets it.
ADD_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
}


async def add_body(args: Any) -> int:
    """The trivial tool body: the sum of the two validated arguments."""
    return int(args["a"] + args["b"])


async def add_body_suspending(args: Any) -> int:
    """The same sum after one trio checkpoint: a body that can (and does) suspend."""
    await trio.lowlevel.checkpoint()
    return int(args["a"] + args["b"])


def add_tool(
    name: str = "add", description: str = "Add two integers.", *, execute: Any = add_body, **options: Any
) -> ToolDefinition:
    """``add(a: int, b: int) -> int`` through ``define_tool``, the way a host declares a tool."""
    return define_tool(
        name=name, description=description, parameters=ADD_PARAMETERS, output={"type": "integer"},
        execute=execute, **options,
    )  # fmt: skip


class NoopListener:
    """One pass-through listener on every waterfall, plus an async ``dsh_result`` observer."""

    @hookimpl
    async def dsh_pre_execute(self, execution: ToolExecution, next: Callable[[], Awaitable[Any]]) -> Any:
        return await next()

    @hookimpl
    async def dsh_execute(self, execution: Any, next: Callable[[], Awaitable[Any]]) -> Any:
        return await next()

    @hookimpl
    async def dsh_post_execute(
        self, execution: ToolExecution, result: ToolExecutionResult, next: Callable[[], Awaitable[Any]]
    ) -> Any:
        return await next()

    @hookimpl
    async def dsh_result(self, execution: ToolExecution, result: ToolExecutionResult) -> None:
        return None


def runtime_with(
    listeners: int = 0,
    *,
    tools: Iterable[ToolDefinition] | None = None,
    trace: bool = False,
    setups: Iterable[tuple[ModuleType, dict[str, Any]]] = (),
) -> ToolRuntime:
    """A runtime with ``tools`` (default: ``add``), ``listeners`` no-op plugins and plugin ``dsh_setup`` calls."""
    runtime = ToolRuntime(trace_decisions=trace)
    for tool in tools if tools is not None else (add_tool(),):
        runtime.register(tool)
    for _ in range(listeners):
        runtime.plugins.register(NoopListener())
    for module, config in setups:
        module.dsh_setup(runtime=runtime, config=config)
    return runtime


def _problem(result: Any, value: Any) -> str | None:
    if isinstance(result, ToolExecutionFailure):
        info = result.error.info
        return f"the call failed: {result.error.message}" + (f" ({info.code})" if info is not None else "")
    if getattr(result, "is_error", True) is not False:
        return f"expected a ToolExecutionSuccess, got {result!r:.200}"
    if result.value != value:
        return f"expected the value {value!r}, got {result.value!r:.200}"
    return None


def succeeds_with(value: Any = 3) -> Callable[[Any], str | None]:
    """A check that one ``execute`` returned a success carrying ``value`` (``add``'s 3 by default)."""
    return lambda result: _problem(result, value)


def all_succeed_with(value: Any = 3) -> Callable[[Any], str | None]:
    """A check that every result of one ``run_tool_calls`` turn is a success carrying ``value``."""

    def check(results: Any) -> str | None:
        if not results:
            return f"expected a list of results, got {results!r:.200}"
        for index, result in enumerate(results):
            problem = _problem(result, value)
            if problem is not None:
                return f"result {index} of {len(results)}: {problem}"
        return None

    return check
