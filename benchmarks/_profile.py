"""``python -m benchmarks --profile``: where the pipeline's time goes, for 0 and 10 listeners per waterfall.

First a breakdown: the building blocks of one ``add`` call timed alone (CPU
µs, best of 7), including a few private pipeline functions; a block whose
name no longer exists prints ``n/a`` instead of failing. Then cProfile's
per-function totals (sorted by own time) and, with ``pyinstrument`` installed
(bench venv only), its call tree. Profilers inflate small functions, so read
their shares, not their µs.
"""

from __future__ import annotations

import cProfile
import gc
import importlib
import inspect
import io
import json
import pstats
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from dsh_core import (
    CancelSignal,
    TextBlock,
    ToolExecution,
    ToolExecutionSuccess,
    ToolRunContext,
    json_text,
    snapshot_json,
)

from ._fixtures import ARGS, make_input, runtime_with
from ._harness import CLOCKS, loop_timer

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
    ("begin + the four stages, without execute's cancel scope",
     "c = P.begin(runtime, request); await P._policy_stage(runtime, c); await P._dispatch_stage(runtime, c); "
     "await P._post_stage(runtime, c); await P.finish(runtime, c)", "trio"),
    ("_pipeline.begin (stages 1-4)", "P.begin(runtime, request)", "sync"),
    ("  snapshot_json(args)", "snapshot_json(ARGS)", "sync"),
    ("  ToolExecution(...) (attrs frozen, 8 fields)", "ToolExecution(call_id='c', root_call_id='c', name='add', "
     "arguments=FROZEN, signal=SIGNAL, token=None)", "sync"),
    ("  contract.validate_args(frozen) (partial -> CompiledValidator)", "CONTRACT.validate_args(FROZEN)", "sync"),
    ("  the compiled fastjsonschema function alone", "CONTRACT.validate_args.func._fast(FROZEN)", "sync"),
    ("  runtime._contract(tool) (WeakKeyDictionary)", "runtime._contract(TOOL)", "sync"),
    ("trio.CancelScope() enter+exit", "with trio.CancelScope(): pass", "trio"),
    ("signal.link(scope) + unlink()", "SIGNAL.link(SCOPE)()", "sync"),
    ("_policy_stage, 0 listeners", "await P._policy_stage(runtime, CALL)", "trio"),
    ("_dispatch_stage, 0 listeners", "CALL.step = 'dispatch'; await P._dispatch_stage(runtime, CALL)", "trio"),
    ("  HookChains.listeners(hook) (x4 per call)", "runtime._chains.listeners('dsh_pre_execute', None)", "sync"),
    ("  ToolRunContext(...)", "ToolRunContext(EXECUTION, SIGNAL, [])", "sync"),
    ("  tool.execute(args, run) (define_tool's run_body + add)", "await TOOL.execute(FROZEN, RUN)", "trio"),
    ("  _pipeline._build_success (output stage)", "P._build_success(runtime, TOOL, EXECUTION, 3, None)", "sync"),
    ("    default_render(args, 3)", "TOOL.output.render(FROZEN, 3)", "sync"),
    ("      json_text(3) (json.dumps with keyword arguments)", "json_text(3)", "sync"),
    ("      a prebuilt JSONEncoder(...).encode(3)", "ENCODE(3)", "sync"),
    ("      str(3)", "str(3)", "sync"),
    ("      TextBlock('3')", "TextBlock('3')", "sync"),
    ("    as_content([block])", "as_content(list(CONTENT))", "sync"),
    ("    ToolExecutionSuccess(...)", "ToolExecutionSuccess(value=3, content=CONTENT)", "sync"),
    ("_post_stage, 0 listeners", "CALL._settle('post', SUCCESS); await P._post_stage(runtime, CALL)", "trio"),
    ("finish, 0 observers", "CALL._settle('final', SUCCESS); await P.finish(runtime, CALL)", "trio"),
    ("inspect.isawaitable(None) (once per dsh_result observer)", "isawaitable(None)", "sync"),
    ("attrs.evolve(success, trace=...) (tracing, deferred contexts)", "attrs.evolve(SUCCESS, trace=None)", "sync"),
)  # fmt: skip


def _breakdown() -> None:
    import attrs

    from dsh_core import _pipeline
    from dsh_core._content import as_content

    runtime = runtime_with()
    runtime10 = runtime_with(10)
    request = make_input("add", ARGS)
    tool = runtime.get("add")
    assert tool is not None
    frozen = snapshot_json(ARGS)
    signal = CancelSignal()
    execution = ToolExecution(call_id="c", root_call_id="c", name="add", arguments=frozen, signal=signal,
                              token=None)  # type: ignore[arg-type]  # fmt: skip
    content = (TextBlock("3"),)
    call = _pipeline.begin(runtime, request)
    namespace: dict[str, Any] = {
        "P": _pipeline, "runtime": runtime, "runtime10": runtime10, "request": request, "TOOL": tool,
        "CONTRACT": runtime._contract(tool), "FROZEN": frozen, "ARGS": ARGS, "SIGNAL": signal,
        "SCOPE": trio.CancelScope(), "EXECUTION": execution, "CONTENT": content,
        "SUCCESS": ToolExecutionSuccess(value=3, content=content), "snapshot_json": snapshot_json,
        "ToolExecution": ToolExecution, "ToolExecutionSuccess": ToolExecutionSuccess, "TextBlock": TextBlock,
        "json_text": json_text, "ENCODE": json.JSONEncoder(ensure_ascii=False, allow_nan=False).encode,
        "attrs": attrs, "trio": trio, "CALL": call, "RUN": ToolRunContext(execution, signal, []),
        "ToolRunContext": ToolRunContext, "as_content": as_content, "isawaitable": inspect.isawaitable,
    }  # fmt: skip
    clock = CLOCKS["cpu"]
    print("=== building blocks of one add call (CPU µs, best of 7 x 20 000) ===")
    for label, stmt, runner in _BLOCKS:
        try:
            timer = loop_timer(stmt, dict(namespace), runner)  # type: ignore[arg-type]
            timer(10, clock)
            best = min(timer(20_000, clock) for _ in range(7)) * 1e6 / 20_000
            print(f"{label:70s} {best:8.2f}")
        except Exception as exc:  # a renamed internal: report it, keep profiling
            print(f"{label:70s}      n/a ({type(exc).__name__}: {exc})")
    print()


def profile(*, smoke: bool = False, top: int = 25) -> None:
    iterations = 200 if smoke else 20_000
    if not smoke:
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
