"""The same ``add`` tool through peer frameworks' own tool-execution paths; ratio peer / ours.

The peers are bench-only dependencies (``benchmarks/requirements-peers.txt``),
never runtime ones: each is imported lazily and its row is skipped with a note
when its distribution is not installed. An installed peer whose recipe no
longer works (a module moved, an API changed) fails the run instead, as does
one whose call does not return ``3`` (openai-agents returns an error string,
MCP a ``CallToolResult`` with ``is_error`` set, rather than raising). The recipes and versions are those of
``/work/shared/PERF-ANCHORS.md``. Every peer gets ``async def add`` (its fast
path: MCP, openai-agents and langchain run sync tools in a worker thread).
openai-agents takes the arguments as JSON text, so it is compared with our
row that parses JSON text too; both build their per-call input object (our
``ToolExecutionInput``, its ``ToolContext``) in every call, as their agent
loops do (a row that reuses one ``ToolContext`` is shown for reference). asyncio peers run under ``asyncio.run`` (default
loop), MCP under trio like us.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
from collections.abc import Callable
from importlib import metadata
from typing import Any

from ._fixtures import ARGS
from ._harness import Bench, Case, Expect, Skipped, Target, Timer, loop_timer

GROUP = "peers"


async def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def _mcp_timer(modules: dict[str, Any]) -> Timer:
    server = modules["mcp.server.mcpserver"].MCPServer("bench")
    server.tool()(add)
    return loop_timer('await server.call_tool("add", ARGS)', {"server": server, "ARGS": ARGS}, "trio")


def _pydantic_ai_timer(modules: dict[str, Any]) -> Timer:
    ai = modules["pydantic_ai"]
    toolset = modules["pydantic_ai.toolsets"].FunctionToolset([add])
    context = ai.RunContext(deps=None, model=modules["pydantic_ai.models.test"].TestModel(),
                            usage=modules["pydantic_ai.usage"].RunUsage())  # fmt: skip
    manager_class = modules["pydantic_ai.tool_manager"].ToolManager
    manager = asyncio.run(manager_class(toolset=toolset).for_run_step(context))
    part = modules["pydantic_ai.messages"].ToolCallPart(tool_name="add", args=dict(ARGS))
    return loop_timer("await manager.handle_call(part)", {"manager": manager, "part": part}, "asyncio")


def _openai_agents_timer(modules: dict[str, Any], *, context_per_call: bool = False) -> Timer:
    agents = modules["agents"]
    agents.set_tracing_disabled(True)
    tool = agents.function_tool(add)
    text = '{"a": 1, "b": 2}'
    context_class = modules["agents.tool_context"].ToolContext
    namespace = {"tool": tool, "Context": context_class, "TEXT": text}
    if context_per_call:
        # What its runner does for every call (it goes through ToolContext.from_agent_context,
        # which costs more): the call id, tool name and arguments travel in a new context,
        # as ours travel in a new ToolExecutionInput.
        statement = (
            'await tool.on_invoke_tool(Context(context=None, tool_name="add", tool_call_id="c1", '
            "tool_arguments=TEXT), TEXT)"
        )
        return loop_timer(statement, namespace, "asyncio")
    namespace["context"] = context_class(context=None, tool_name="add", tool_call_id="c1", tool_arguments=text)
    return loop_timer("await tool.on_invoke_tool(context, TEXT)", namespace, "asyncio")


def _langchain_timer(modules: dict[str, Any]) -> Timer:
    tool = modules["langchain_core.tools"].StructuredTool.from_function(coroutine=add)
    return loop_timer("await tool.ainvoke(ARGS)", {"tool": tool, "ARGS": ARGS}, "asyncio")


_PEERS: tuple[tuple[str, str, tuple[str, ...], Callable[[dict[str, Any]], Timer], str], ...] = (
    ("peers.mcp", "mcp 2.3.0 MCPServer.call_tool (trio)", ("mcp.server.mcpserver",), _mcp_timer, "pipeline.l0"),
    ("peers.pydantic_ai", "pydantic-ai 2.68.0 ToolManager.handle_call (asyncio)",
     ("pydantic_ai", "pydantic_ai.toolsets", "pydantic_ai.models.test", "pydantic_ai.usage",
      "pydantic_ai.tool_manager", "pydantic_ai.messages"), _pydantic_ai_timer, "pipeline.l0"),
    ("peers.openai_agents", "openai-agents 0.24.0 FunctionTool.on_invoke_tool, JSON text, a ToolContext per call "
     "(asyncio)", ("agents", "agents.tool_context"), functools.partial(_openai_agents_timer, context_per_call=True),
     "pipeline.l0.json"),
    ("peers.openai_agents.reused", "openai-agents 0.24.0 the same, one ToolContext reused for every call",
     ("agents", "agents.tool_context"), _openai_agents_timer, "pipeline.l0.json"),
    ("peers.langchain", "langchain-core 1.8.3 StructuredTool.ainvoke (asyncio)",
     ("langchain_core.tools",), _langchain_timer, "pipeline.l0"),
)  # fmt: skip


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


_PINS = {"peers.mcp": ("mcp", "2.3.0"), "peers.pydantic_ai": ("pydantic-ai-slim", "2.68.0"),
         "peers.openai_agents": ("openai-agents", "0.24.0"), "peers.openai_agents.reused": ("openai-agents", "0.24.0"),
         "peers.langchain": ("langchain-core", "1.8.3")}  # fmt: skip

# Rows shown for reference, without a verdict: they leave out per-call work our compared row pays.
_REFERENCE = {
    "peers.openai_agents.reused": "not like for like: our row builds its ToolExecutionInput (call id, name, "
    "arguments) per call; this one skips the ToolContext that carries the same per call, so it shows the tool path "
    "alone",
}


def _returns_sum(value: Any) -> str | None:
    return None if value == 3 else f"the peer's call returned {value!r:.200}, not add's 3"


def _mcp_returns_sum(result: Any) -> str | None:
    if getattr(result, "is_error", None) is not False:
        return f"MCP reported an error: {result!r:.200}"
    return _returns_sum((getattr(result, "structured_content", None) or {}).get("result"))


_EXPECT: dict[str, Expect] = {"peers.mcp": _mcp_returns_sum}


def _setup(make: Callable[[dict[str, Any]], Timer], names: tuple[str, ...]) -> Timer:
    # Imported only here: the distribution is installed, so a failed import is a broken recipe, not a skip.
    return make({name: importlib.import_module(name) for name in names})


def cases(smoke: bool) -> list[Case]:
    out: list[Case] = []
    for key, label, names, make, vs in _PEERS:
        distribution, pinned = _PINS[key]
        installed = _version(distribution)
        if installed is None:
            why = f"skipped: {distribution} is not installed (pip install -r benchmarks/requirements-peers.txt)"
            out.append(Skipped(key=key, label=label, note=why))
            continue
        notes = [
            _REFERENCE.get(key),
            None if installed == pinned else f"{distribution} {installed} is installed, the pin is {pinned}",
        ]
        note = "; ".join(n for n in notes if n) or None
        # The peer's time over ours: at least 1 means we are faster.
        target = None if key in _REFERENCE else Target(limit=1.0, at_least=True)
        out.append(Bench(key=key, label=label, setup=functools.partial(_setup, make, names), vs=vs, note=note,
                         target=target, expect=_EXPECT.get(key, _returns_sum)))  # fmt: skip
    return out
