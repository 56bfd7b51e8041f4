"""``run_tool_calls`` of 1 000 parallel-safe ``add`` calls: cost per call over serial execution and the body.

One iteration is one model turn of 1 000 calls (``max_parallel=10``); figures
are µs per call. The overhead row is the per-call time minus the body's own
time (``limit.body``): what the pipeline plus the scheduler add to each call.
"""

from __future__ import annotations

from collections.abc import Mapping

from dsh_core import run_tool_calls

from ._fixtures import ARGS, add_tool, make_input, runtime_with
from ._harness import Bench, Case, Derived, Timer, loop_timer

GROUP = "scheduling"

CALLS = 1000


def _namespace() -> dict[str, object]:
    runtime = runtime_with(tools=[add_tool(is_concurrency_safe=lambda args: True)])
    requests = [make_input("add", ARGS, call_id=f"call-{index}") for index in range(CALLS)]
    return {"runtime": runtime, "requests": requests, "run_tool_calls": run_tool_calls}


def _serial_timer() -> Timer:
    return loop_timer("for request in requests: await runtime.execute(request)", _namespace(), "trio")


def _parallel_timer() -> Timer:
    return loop_timer("await run_tool_calls(runtime, requests)", _namespace(), "trio")


def _overhead(stats: Mapping[str, float]) -> float:
    return stats["scheduling.parallel"] - (stats["limit.body"] - stats["limit.aloop"])


def cases(smoke: bool) -> list[Case]:
    return [
        Bench(key="scheduling.serial", label=f"{CALLS} calls, execute one after another", setup=_serial_timer,
              per=CALLS, vs="pipeline.l0"),
        Bench(key="scheduling.parallel", label=f"run_tool_calls, {CALLS} parallel-safe calls (max_parallel=10)",
              setup=_parallel_timer, per=CALLS, vs="scheduling.serial"),
        Derived(key="scheduling.overhead", label="run_tool_calls overhead per call over the body time",
                inputs=("scheduling.parallel", "limit.body", "limit.aloop"), compute=_overhead,
                vs="limit.body"),
    ]  # fmt: skip
