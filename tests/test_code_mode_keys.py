"""Code Mode schedules sub-calls by resource keys as run_tool_calls does: generated programs, checked spans.

Each generated program gathers a list of sub-calls (keyed by read/write key lists, parallel-safe without
keys, or exclusive) on trio's virtual clock. Whatever the mix and the pool size, no two conflicting
keyed bodies overlap and the earlier one (in the order the program made them) runs first, an exclusive
body runs alone with everything before it done and nothing after it started, at most
``max_parallel_sub_calls`` bodies run at once, and every call returns its own value.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsh_core import ToolExecutionSuccess, ToolRuntime
from dsh_core.code_mode import CodeRunResult
from dsh_core.testing import FakeCodeRuntime, json_tool, make_input

KEYS = ("a", "b", "c")
Span = tuple[int, int]


def _tools(spans: dict[str, Span], running: list[int], peak: list[int]) -> list[Any]:
    # Spans are counted in body starts and ends, not clock time: two zero-second bodies that
    # overlapped would show equal times, but not equal counts.
    async def body(args: Any) -> str:
        running[0] += 1
        start = running[1] = running[1] + 1
        peak[0] = max(peak[0], running[0])
        try:
            await trio.sleep(args["seconds"])
        finally:
            running[0] -= 1
            running[1] += 1
        spans[args["id"]] = (start, running[1])
        return str(args["id"])

    parameters = {
        "id": {"type": "string", "required": True},
        "seconds": {"type": "number", "required": True},
        "read": {"type": "array", "items": {"type": "string"}},
        "write": {"type": "array", "items": {"type": "string"}},
    }
    common = {"parameters": parameters, "output": {"type": "string"}}
    return [
        json_tool(
            "keyed",
            body,
            resource_keys=lambda args: {"read": list(args.get("read", [])), "write": list(args.get("write", []))},
            is_concurrency_safe=lambda args: True,
            **common,
        ),
        json_tool("parallel", body, is_concurrency_safe=lambda args: True, **common),
        json_tool("exclusive", body, **common),
    ]


sub_calls = st.lists(
    st.tuples(
        st.sampled_from(["keyed", "keyed", "keyed", "parallel", "exclusive"]),
        st.sampled_from([0, 0.5, 1, 2.5]),
        st.lists(st.sampled_from(KEYS), max_size=2, unique=True),
        st.lists(st.sampled_from(KEYS), max_size=2, unique=True),
    ),
    min_size=1,
    max_size=10,
)


def _conflict(first: tuple[set[str], set[str]], second: tuple[set[str], set[str]]) -> bool:
    (read1, write1), (read2, write2) = first, second
    return bool(write1 & (read2 | write2) or write2 & read1)


@settings(max_examples=80, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(plan=sub_calls, cap=st.sampled_from([1, 2, 10]))
def test_generated_programs_keep_key_order_exclusivity_and_the_pool_size(plan: list[Any], cap: int) -> None:
    spans: dict[str, Span] = {}
    running, peak = [0, 0], [0]  # bodies running now, starts and ends so far; most at once
    calls = [
        (tool, {"id": f"s{index}", "seconds": seconds, "read": read, "write": write})
        for index, (tool, seconds, read, write) in enumerate(plan)
    ]

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        results: list[Any] = [None] * len(calls)

        async def one(index: int) -> None:
            tool, arguments = calls[index]
            results[index] = await tools[tool](arguments)

        async with trio.open_nursery() as nursery:
            for index in range(len(calls)):
                nursery.start_soon(one, index)
                await trio.sleep(0)  # submission order = the order the program made them
        return CodeRunResult(value=results, has_value=True)

    async def main() -> None:
        runtime = ToolRuntime(mode="code", code_runtime=FakeCodeRuntime(program), max_parallel_sub_calls=cap)
        for tool in _tools(spans, running, peak):
            runtime.register(tool)
        result = await runtime.execute(make_input("run_code", {"code": "...", "description": "generated"}))
        assert isinstance(result, ToolExecutionSuccess), result
        assert result.value["result"] == tuple(arguments["id"] for _, arguments in calls)  # type: ignore[index]

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))

    assert peak[0] <= cap
    for later, (tool2, args2) in enumerate(calls):
        for earlier in range(later):
            tool1, args1 = calls[earlier]
            end1, start2 = spans[args1["id"]][1], spans[args2["id"]][0]
            if "exclusive" in (tool1, tool2):
                assert end1 <= start2, (earlier, later, "an exclusive call overlapped or ran out of order")
            elif tool1 == tool2 == "keyed" and _conflict(
                (set(args1["read"]), set(args1["write"])), (set(args2["read"]), set(args2["write"]))
            ):
                assert end1 <= start2, (earlier, later, "conflicting keyed calls overlapped or ran out of order")
