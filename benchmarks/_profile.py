"""``python -m benchmarks --profile``: where the pipeline's time goes, for 0 and 10 listeners per waterfall.

First a breakdown: the building blocks of one ``add`` call timed alone (CPU
µs, best of 7), including a few private pipeline functions; a block that no
longer runs (a renamed internal) prints ``n/a`` and the profile then fails
naming every such block, so the breakdown cannot silently rot. Then cProfile's
per-function totals (sorted by own time) and, with ``pyinstrument`` installed
(bench venv only), its call tree. Profilers inflate small functions, so read
their shares, not their µs. ``smoke=True`` runs all of it with tiny counts.
"""

from __future__ import annotations

import cProfile
import gc
import importlib
import io
import pstats
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from dsh_core import CancelSignal, TextBlock, ToolRunContext, snapshot_json

from ._fixtures import ARGS, make_input, runtime_with
from ._harness import CLOCKS, BenchmarkFailure, loop_timer

__all__ = ["profile"]


def _calls(listeners: int, iterations: int) -> Callable[[], Awaitable[None]]:
    runtime = runtime_with(listeners)
    request = make_input("add", ARGS)

    async def loop() -> None:
        for _ in range(iterations):
            await runtime.execute(request)

    return loop


# (label, statement, runner): what one 0-listener call is made of, outermost first.
_BLOCKS: tuple[tuple[str, str, str], ...] = (
    ("execute, 0 listeners (whole call)", "await runtime.execute(request)", "trio"),
    ("execute, 10 listeners per waterfall (whole call)", "await runtime10.execute(request)", "trio"),
    ("execute, 0 listeners, a body that suspends once (+ the call's cancel scope)",
     "await runtime_suspending.execute(request)", "trio"),
    ("_pipeline.begin (stages 1-4: identity, lookups, argument check + snapshot)", "P.begin(runtime, request)", "sync"),
    ("  contract.read_arguments(args) (the one-pass check + snapshot a flat call takes)",
     "CONTRACT.read_arguments(ARGS)", "sync"),
    ("  new_execution(...) (the call's ToolExecution)",
     "new_execution('c', 'c', 'add', FROZEN, SIGNAL, None, None, None)", "sync"),
    ("  what the one pass replaces: snapshot_json(args)", "snapshot_json(ARGS)", "sync"),
    ("  ... + contract.argument_violations(frozen)", "CONTRACT.argument_violations(FROZEN)", "sync"),
    ("  ... of which the compiled fastjsonschema function", "CONTRACT.args_fast(FROZEN)", "sync"),
    ("  HookChains.for_call(agent) (all four hooks, cached)", "runtime._chains.for_call(None)", "sync"),
    ("  PreparedCall(...)", "P.PreparedCall(EXECUTION, None, HOOKS)", "sync"),
    ("_decide (guards, last signal check)", "CALL.step = 'policy'; P._decide(runtime, CALL, ALLOW, None)", "sync"),
    ("_dispatch_body (run context, body, output stage)", "await P._dispatch_body(runtime, CALL, CALL.execution.signal)", "trio"),
    ("  ToolRunContext(...)", "ToolRunContext(EXECUTION, SIGNAL, [])", "sync"),
    ("  tool.execute(args, run) (define_tool's adapter + add)", "await TOOL.execute(FROZEN, RUN)", "trio"),
    ("  _build_success (output snapshot, check, render, result)",
     "P._build_success(TOOL, CONTRACT, EXECUTION, 3, None)", "sync"),
    ("    default_block(3)", "default_block(3)", "sync"),
    ("    new_success(...)", "new_success(3, CONTENT, None, False)", "sync"),
    ("signal.cancelled (checked after each stage)", "SIGNAL.cancelled", "sync"),
    ("trio.CancelScope() enter+exit (what a call that can suspend adds)", "with trio.CancelScope(): pass", "trio"),
    ("signal.link(scope) + unlink()", "SIGNAL.link(SCOPE)()", "sync"),
    ("a waterfall of 10 pass-through listeners alone", "await Chain(LISTENERS, (EXECUTION,), CHECK, BASE).run()",
     "trio"),
)  # fmt: skip


def _breakdown(*, iterations: int = 20_000, best_of: int = 7) -> None:
    from benchmarks._fixtures import add_body_suspending, add_tool
    from dsh_core import Allow, _pipeline
    from dsh_core._definition import contract_of, default_block
    from dsh_core._execution import new_execution
    from dsh_core._results import new_success
    from dsh_core._waterfall import Chain

    async def base() -> object:
        return None

    runtime = runtime_with()
    runtime10 = runtime_with(10)
    request = make_input("add", ARGS)
    tool = runtime.get("add")
    assert tool is not None
    frozen = snapshot_json(ARGS)
    signal = CancelSignal()
    execution = new_execution("c", "c", "add", frozen, signal, None, None, None)  # type: ignore[arg-type]
    content = (TextBlock("3"),)
    call = _pipeline.begin(runtime, request)
    namespace: dict[str, Any] = {
        "P": _pipeline, "runtime": runtime, "runtime10": runtime10, "request": request, "TOOL": tool,
        "runtime_suspending": runtime_with(tools=[add_tool(execute=add_body_suspending)]),
        "CONTRACT": contract_of(tool), "FROZEN": frozen, "ARGS": ARGS, "SIGNAL": signal,
        "SCOPE": trio.CancelScope(), "EXECUTION": execution, "CONTENT": content, "HOOKS": runtime._chains.for_call(None),
        "snapshot_json": snapshot_json, "new_execution": new_execution, "new_success": new_success,
        "default_block": default_block, "trio": trio, "CALL": call, "ALLOW": Allow(),
        "RUN": ToolRunContext(execution, signal, []), "ToolRunContext": ToolRunContext, "Chain": Chain,
        "LISTENERS": runtime10._chains.for_call(None).pre, "BASE": base, "CHECK": lambda outcome: None,
    }  # fmt: skip
    clock = CLOCKS["cpu"]
    print(f"=== building blocks of one add call (CPU µs, best of {best_of} x {iterations:,}) ===")
    broken: list[str] = []
    for label, stmt, runner in _BLOCKS:
        try:
            timer = loop_timer(stmt, dict(namespace), runner)  # type: ignore[arg-type]
            timer(10, clock)
            best = min(timer(iterations, clock) for _ in range(best_of)) * 1e6 / iterations
            print(f"{label:78s} {best:8.2f}")
        except Exception as exc:  # a renamed internal: report it, finish the table, then fail
            print(f"{label:78s}      n/a ({type(exc).__name__}: {exc})")
            broken.append(f"profile block {label.strip()!r}: {type(exc).__name__}: {exc}")
    print()
    if broken:
        raise BenchmarkFailure("\n".join(broken))


def profile(*, smoke: bool = False, top: int = 25) -> None:
    iterations = 200 if smoke else 20_000
    if smoke:
        _breakdown(iterations=10, best_of=1)
    else:
        _breakdown()
    for listeners in (0, 10):
        loop = _calls(listeners, iterations)
        trio.run(loop)  # warm-up: caches, compiled validators, listener chains
        gc.collect()
        gc.freeze()
        start = time.process_time()
        trio.run(loop)
        plain = (time.process_time() - start) * 1e6 / iterations
        print(f"=== execute, {listeners} no-op listeners per waterfall: {plain:.2f} µs/call (CPU) unprofiled, "
              f"{iterations} calls ===")  # fmt: skip
        profiler = cProfile.Profile()
        profiler.enable()
        trio.run(loop)
        profiler.disable()
        out = io.StringIO()
        pstats.Stats(profiler, stream=out).strip_dirs().sort_stats("tottime").print_stats(top)
        print(out.getvalue())
        try:
            pyinstrument = importlib.import_module("pyinstrument")
        except ImportError:
            print("(pyinstrument is not installed: cProfile only)\n")
            continue
        sampler = pyinstrument.Profiler(interval=0.001)
        sampler.start()
        trio.run(_calls(listeners, iterations // 4))
        sampler.stop()
        print(sampler.output_text(unicode=True, color=False))
