"""Fuzz target: ``search_tools`` on arbitrary model text, with arbitrary limits.

The query is the model's text and the ranking runs on the event loop, so every
query must come back as one structured result, never an exception: a success
listing at most ``max_results`` deferred tools (each a tool the agent can call,
now loaded), or ``INVALID_ARGS`` for a query past its bounds or a limit below
one, with nothing loaded.
"""

from __future__ import annotations

import re
from typing import Any

import trio
from conftest_reliability import *  # noqa: F403 - fixtures
from conftest_reliability import FIGURES
from fuzz_support import fuzz
from hypothesis import strategies as st

from dsh_core import ToolExecutionFailure, ToolExecutionSuccess, ToolRuntime
from dsh_core.testing import json_tool, make_input
from dsh_plugins.tool_search import DEFAULT_NAME, MAX_QUERY_CHARS, MAX_QUERY_WORDS, search_tool

MAX_RESULTS = 4
NAMES = ["github__create_issue", "github__listPulls", "jira-create-ticket", "send_email", "weather_now", "ÉTÉ_été"]
WORDS = [word for name in NAMES for word in re.findall(r"[a-z0-9]+", name.lower())]


def fresh_runtime() -> ToolRuntime:
    runtime = ToolRuntime()
    for name in NAMES:
        runtime.register(json_tool(name, defer_loading=True))
    runtime.register(json_tool("always_shown"))
    runtime.register(search_tool(runtime, max_results=MAX_RESULTS))
    return runtime


queries = st.one_of(
    st.text(max_size=60),
    st.lists(st.sampled_from(WORDS) | st.text(max_size=8), max_size=40).map(" ".join),
    st.sampled_from(NAMES),
    st.text(min_size=MAX_QUERY_CHARS - 5, max_size=MAX_QUERY_CHARS + 5),
)


def search_target(case: tuple[str, int | None]) -> None:
    query, limit = case
    runtime = fresh_runtime()
    arguments: dict[str, Any] = {"query": query}
    if limit is not None:
        arguments["limit"] = limit

    async def main() -> Any:
        return await runtime.execute(make_input(DEFAULT_NAME, arguments))

    result = trio.run(main)
    FIGURES.results += 1
    loaded = {schema.name for schema in runtime.schemas()} - {"always_shown", DEFAULT_NAME}
    words = set(re.findall(r"[a-z0-9]+", re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", query).lower()))
    if len(query) > MAX_QUERY_CHARS or len(words) > MAX_QUERY_WORDS or (limit is not None and limit < 1):
        assert isinstance(result, ToolExecutionFailure), result
        assert result.error.info is not None and result.error.info.code == "INVALID_ARGS"
        assert loaded == set()
        return
    assert isinstance(result, ToolExecutionSuccess), result
    found = [tool["name"] for tool in result.value["tools"]]
    assert len(found) <= min(limit or MAX_RESULTS, MAX_RESULTS)
    assert len(set(found)) == len(found) and set(found) <= set(NAMES)
    assert loaded == set(found)
    assert result.value["deferred"] == len(NAMES) - len(found)
    if query.strip() in NAMES:
        assert found[0] == query.strip()


def test_fuzz_tool_search() -> None:
    assert fuzz(st.tuples(queries, st.none() | st.integers(-3, 10)), search_target) > 0
