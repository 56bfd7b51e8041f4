"""``ToolRuntime.execute`` of ``add`` against the physical limit with the same number of hook layers.

Rows: 0, 1 and 10 no-op listeners on every waterfall (pre, execute, post and a
``dsh_result`` observer), decision tracing on and off, arguments arriving as
JSON text, and the first-party timeout and audit plugins set up through their
``dsh_setup(runtime, config)``, alone and on top of 1 and 10 listeners. Every
row checks, before timing, that its call returns ``add``'s success.
"""

from __future__ import annotations

import atexit
import datetime
import functools
import importlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from types import ModuleType
from typing import Any

import trio

from dsh_core import (
    CancelSignal,
    RetryPolicy,
    ToolDefinition,
    ToolExecution,
    ToolExecutionInput,
    ToolExecutionResult,
    hookimpl,
)

from ._fixtures import ARGS, ARGS_TEXT, add_body_suspending, add_tool, make_input, runtime_with, succeeds_with
from ._harness import Bench, Case, Derived, Target, Timer, loop_timer

GROUP = "pipeline"

_EXECUTE = "await runtime.execute(request)"


def _plugin(name: str) -> ModuleType:
    """A first-party plugin module, imported when its case is set up (a failed import fails that case)."""
    return importlib.import_module(f"dsh_plugins.{name}")


def _execute_timer(
    listeners: int = 0,
    *,
    trace: bool = False,
    setups: Iterable[tuple[str, dict[str, Any]]] = (),
    tools: Iterable[ToolDefinition] | None = None,
) -> Timer:
    runtime = runtime_with(
        listeners, trace=trace, setups=[(_plugin(name), config) for name, config in setups], tools=tools
    )
    return loop_timer(_EXECUTE, {"runtime": runtime, "request": make_input("add", ARGS)}, "trio")


def _json_args_timer() -> Timer:
    runtime = runtime_with()
    namespace = {
        "runtime": runtime, "Input": ToolExecutionInput, "loads": json.loads, "TEXT": ARGS_TEXT,
        "SIGNAL": CancelSignal(),
    }  # fmt: skip
    stmt = 'await runtime.execute(Input(call_id="c1", name="add", arguments=loads(TEXT), signal=SIGNAL))'
    return loop_timer(stmt, namespace, "trio")


@functools.cache
def _scratch_dir() -> str:
    """A temporary directory for the audit logs, removed when the run exits."""
    path = tempfile.mkdtemp(prefix="dsh-bench-")
    atexit.register(shutil.rmtree, path, True)
    return path


def _audit_path(name: str) -> str:
    return os.path.join(_scratch_dir(), f"{name}.jsonl")


class _LastResult:
    """Keeps the last (execution, result) a runtime reports."""

    def __init__(self) -> None:
        self.seen: tuple[ToolExecution, ToolExecutionResult] | None = None

    @hookimpl
    def dsh_result(self, execution: ToolExecution, result: ToolExecutionResult) -> None:
        self.seen = (execution, result)


def _audit_floor_timer() -> Timer:
    """One audit line without the pipeline: build the record, encode it as the plugin does, ``os.write`` it."""
    audit = _plugin("audit")
    runtime = runtime_with()
    last = _LastResult()
    runtime.plugins.register(last)
    trio.run(runtime.execute, make_input("add", ARGS))
    assert last.seen is not None
    execution, result = last.seen
    namespace = {
        "log": audit.AuditLog(_audit_path("floor")), "dumps": json.dumps, "record": audit.audit_record,
        "execution": execution, "result": result, "now": datetime.datetime.now, "UTC": datetime.UTC,
    }  # fmt: skip
    line = "(dumps(record(execution, result, duration_ms=0.01, now=now(UTC)), ensure_ascii=False) + '\\n')"
    stmt = f"log.write({line}.encode('utf-8', 'backslashreplace'))"
    return loop_timer(stmt, namespace)


def cases(smoke: bool) -> list[Case]:
    ok = succeeds_with(3)

    def both(name: str) -> list[tuple[str, dict[str, Any]]]:
        return [("timeout", {"default_ms": 30000}), ("audit", {"path": _audit_path(name)})]

    return [
        Bench(key="pipeline.l0", label="execute, 0 listeners", setup=_execute_timer, vs="limit.k0",
              target=Target(limit=1.5), expect=ok),
        Derived(key="pipeline.l0.contract", label="execute, 0 listeners, vs the contract floor",
                inputs=("pipeline.l0",), compute=lambda stats: stats["pipeline.l0"], vs="limit.contract"),
        Bench(key="pipeline.l1", label="execute, 1 no-op listener per waterfall (4 layers)",
              setup=lambda: _execute_timer(1), vs="limit.k4", expect=ok),
        Bench(key="pipeline.l10", label="execute, 10 no-op listeners per waterfall (40 layers)",
              setup=lambda: _execute_timer(10), vs="limit.k40", target=Target(limit=3.0), expect=ok),
        Derived(key="pipeline.l10.structural", label="execute, 10 no-op listeners per waterfall, vs the structural floor",
                inputs=("pipeline.l10",), compute=lambda stats: stats["pipeline.l10"], vs="limit.w40"),
        Bench(key="pipeline.l0.suspending", label="execute, 0 listeners, a body that suspends once",
              setup=lambda: _execute_timer(tools=[add_tool(execute=add_body_suspending)]), vs="limit.suspend",
              note="a body that can suspend makes the call enter one cancel scope linked to its signal", expect=ok),
        Bench(key="pipeline.l0.retry", label="execute, 0 listeners, the suspending body declaring a RetryPolicy",
              setup=lambda: _execute_timer(tools=[add_tool(execute=add_body_suspending, retry=RetryPolicy())]),
              vs="pipeline.l0.suspending",
              note="until a call fails, a retry costs its loop's frame; a tool that may pause between attempts "
                   "always takes the suspending path, so an inline body with a RetryPolicy costs about what this "
                   "row's baseline does", expect=ok),
        Bench(key="pipeline.l0.trace", label="execute, 0 listeners, trace_decisions=True",
              setup=lambda: _execute_timer(0, trace=True), vs="pipeline.l0", expect=ok),
        Bench(key="pipeline.l10.trace", label="execute, 10 listeners per waterfall, trace_decisions=True",
              setup=lambda: _execute_timer(10, trace=True), vs="pipeline.l10", expect=ok),
        Bench(key="pipeline.l0.json", label="execute, 0 listeners, args from JSON text (+ input object)",
              setup=_json_args_timer, vs="limit.k0.json", expect=ok),
        Bench(key="pipeline.timeout", label="execute + timeout plugin, tool without a budget",
              setup=lambda: _execute_timer(setups=[("timeout", {})]), vs="limit.k1", expect=ok),
        Bench(key="pipeline.timeout.budget", label="execute + timeout plugin, default_ms=30000 (deadline armed)",
              setup=lambda: _execute_timer(setups=[("timeout", {"default_ms": 30000})]), vs="limit.k1",
              note="the deadline path fuses a CancelSignal carrying the deadline; its shielding cancel scope is "
              "entered only when the dispatch can suspend (this add body cannot)", expect=ok),
        Bench(key="pipeline.audit", label="execute + audit plugin (JSON line to a tmp file)",
              setup=lambda: _execute_timer(setups=[("audit", {"path": _audit_path("audit")})]), vs="limit.k2",
              note="the audit rows include the plugin's own work: one JSON line per call, os.write to a tmp file; "
              "pipeline.audit_floor is that work alone", expect=ok),
        Bench(key="pipeline.audit_floor", label="audit floor: audit_record + encode + os.write, no pipeline",
              setup=_audit_floor_timer, vs="pipeline.l0"),
        Bench(key="pipeline.timeout_audit", label="execute + timeout (armed) + audit",
              setup=lambda: _execute_timer(setups=both("both")), vs="limit.k3", expect=ok),
        # What the two plugins add on top of the no-op listeners (the ratio is to the same call without them).
        Bench(key="pipeline.l1.timeout_audit",
              label="execute, 1 no-op listener per waterfall + timeout (armed) + audit",
              setup=lambda: _execute_timer(1, setups=both("both1")), vs="pipeline.l1", expect=ok),
        Bench(key="pipeline.l10.timeout_audit",
              label="execute, 10 no-op listeners per waterfall + timeout (armed) + audit",
              setup=lambda: _execute_timer(10, setups=both("both10")), vs="pipeline.l10", expect=ok),
    ]  # fmt: skip
