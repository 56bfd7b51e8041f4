"""``run_tool_calls`` of 1 000 parallel-safe ``add`` calls: cost per call over serial execution and the body.

One iteration is one model turn of 1 000 calls (``max_parallel=10``); figures
are µs per call. ``add``'s body never suspends, so ``run_tool_calls`` runs each
of those calls inline, one after another, without a task or a slot: that row
measures the inline path. The same turn with a body that suspends once takes
the concurrent path (a task and a slot per call) and is compared with one
``execute`` of that body. The overhead row is the inline per-call time minus
the body's own time (``limit.body``): what the pipeline plus the scheduler add
to each call.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dsh_core import run_tool_calls

from ._fixtures import ARGS, add_body, add_body_suspending, add_tool, all_succeed_with, make_input, runtime_with
from ._harness import Bench, Case, Derived, Timer, loop_timer

GROUP = "scheduling"

CALLS = 1000


def _namespace(body: Any = add_body) -> dict[str, object]:
    runtime = runtime_with(tools=[add_tool(is_concurrency_safe=lambda args: True, execute=body)])
    requests = [make_input("add", ARGS, call_id=f"call-{index}") for index in range(CALLS)]
    return {"runtime": runtime, "requests": requests, "run_tool_calls": run_tool_calls}


def _serial_timer() -> Timer:
    # The loop discards the results; once() collects them, so the check sees every call the loop makes.
    return loop_timer(
        "for request in requests: await runtime.execute(request)",
        _namespace(),
        "trio",
        result="[await runtime.execute(request) for request in requests]",
    )


def _parallel_timer(body: Any = add_body) -> Timer:
    return loop_timer("await run_tool_calls(runtime, requests)", _namespace(body), "trio")


def _overhead(stats: Mapping[str, float]) -> float:
    return stats["scheduling.parallel"] - (stats["limit.body"] - stats["limit.aloop"])


def cases(smoke: bool) -> list[Case]:
    ok = all_succeed_with(3)
    return [
        Bench(key="scheduling.serial", label=f"{CALLS} calls, execute one after another", setup=_serial_timer,
              per=CALLS, vs="pipeline.l0", expect=ok),
        Bench(key="scheduling.parallel",
              label=f"run_tool_calls, {CALLS} parallel-safe calls whose body cannot suspend (the inline path)",
              setup=_parallel_timer, per=CALLS, vs="scheduling.serial", expect=ok,
              note="a call whose body cannot suspend settles inline: no task, no slot, whatever max_parallel is"),
        Derived(key="scheduling.overhead", label="run_tool_calls overhead per call over the body time (inline path)",
                inputs=("scheduling.parallel", "limit.body", "limit.aloop"), compute=_overhead,
                vs="limit.body"),
        Bench(key="scheduling.parallel.suspending",
              label=f"run_tool_calls, {CALLS} parallel-safe calls, a body that suspends once "
                    "(tasks and slots, max_parallel=10)",
              setup=lambda: _parallel_timer(add_body_suspending), per=CALLS, vs="pipeline.l0.suspending",
              expect=ok),
    ]  # fmt: skip
