"""``ToolRuntime.execute`` of ``add`` against the physical limit with the same number of hook layers.

Rows: 0, 1 and 10 no-op listeners on every waterfall (pre, execute, post and a
``dsh_result`` observer), decision tracing on and off, arguments arriving as
JSON text, and the first-party timeout and audit plugins set up through their
``dsh_setup(runtime, config)`` (skipped while they cannot be imported), alone
and on top of 1 and 10 listeners.
"""

from __future__ import annotations

import atexit
import datetime
import functools
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

from ._fixtures import ARGS, ARGS_TEXT, add_body_suspending, add_tool, make_input, optional_module, runtime_with
from ._harness import Bench, Case, Derived, Skipped, Target, Timer, loop_timer

GROUP = "pipeline"

_EXECUTE = "await runtime.execute(request)"


def _execute_timer(
    listeners: int = 0,
    *,
    trace: bool = False,
    setups: Iterable[tuple[ModuleType, dict[str, Any]]] = (),
    tools: Iterable[ToolDefinition] | None = None,
) -> Timer:
    runtime = runtime_with(listeners, trace=trace, setups=setups, tools=tools)
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


def _audit_floor_timer(audit: ModuleType) -> Timer:
    """One audit line without the pipeline: build the record, encode it as the plugin does, ``os.write`` it."""
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
    out: list[Case] = [
        Bench(key="pipeline.l0", label="execute, 0 listeners", setup=_execute_timer, vs="limit.k0",
              target=Target(limit=1.5)),
        Derived(key="pipeline.l0.contract", label="execute, 0 listeners, vs the contract floor",
                inputs=("pipeline.l0",), compute=lambda stats: stats["pipeline.l0"], vs="limit.contract"),
        Bench(key="pipeline.l1", label="execute, 1 no-op listener per waterfall (4 layers)",
              setup=lambda: _execute_timer(1), vs="limit.k4"),
        Bench(key="pipeline.l10", label="execute, 10 no-op listeners per waterfall (40 layers)",
              setup=lambda: _execute_timer(10), vs="limit.k40", target=Target(limit=3.0)),
        Derived(key="pipeline.l10.structural", label="execute, 10 no-op listeners per waterfall, vs the structural floor",
                inputs=("pipeline.l10",), compute=lambda stats: stats["pipeline.l10"], vs="limit.w40"),
        Bench(key="pipeline.l0.suspending", label="execute, 0 listeners, a body that suspends once",
              setup=lambda: _execute_timer(tools=[add_tool(execute=add_body_suspending)]), vs="limit.suspend",
              note="a body that can suspend makes the call enter one cancel scope linked to its signal"),
        Bench(key="pipeline.l0.retry", label="execute, 0 listeners, the suspending body declaring a RetryPolicy",
              setup=lambda: _execute_timer(tools=[add_tool(execute=add_body_suspending, retry=RetryPolicy())]),
              vs="pipeline.l0.suspending",
              note="until a call fails, a retry costs its loop's frame; a tool that may pause between attempts "
                   "always takes the suspending path, so an inline body with a RetryPolicy costs about what this "
                   "row's baseline does"),
        Bench(key="pipeline.l0.trace", label="execute, 0 listeners, trace_decisions=True",
              setup=lambda: _execute_timer(0, trace=True), vs="pipeline.l0"),
        Bench(key="pipeline.l10.trace", label="execute, 10 listeners per waterfall, trace_decisions=True",
              setup=lambda: _execute_timer(10, trace=True), vs="pipeline.l10"),
        Bench(key="pipeline.l0.json", label="execute, 0 listeners, args from JSON text (+ input object)",
              setup=_json_args_timer, vs="limit.k0.json"),
    ]  # fmt: skip
    timeout, timeout_missing = optional_module("dsh_plugins.timeout")
    audit, audit_missing = optional_module("dsh_plugins.audit")
    if timeout is None:
        out.append(Skipped(key="pipeline.timeout", label="execute + timeout plugin", note=str(timeout_missing)))
    else:
        out += [
            Bench(key="pipeline.timeout", label="execute + timeout plugin, tool without a budget",
                  setup=lambda: _execute_timer(setups=[(timeout, {})]), vs="limit.k1"),
            Bench(key="pipeline.timeout.budget", label="execute + timeout plugin, default_ms=30000 (deadline armed)",
                  setup=lambda: _execute_timer(setups=[(timeout, {"default_ms": 30000})]), vs="limit.k1",
                  note="the deadline path fuses a CancelSignal carrying the deadline; its shielding cancel scope is "
                  "entered only when the dispatch can suspend (this add body cannot)"),
        ]  # fmt: skip
    if audit is None:
        out.append(Skipped(key="pipeline.audit", label="execute + audit plugin", note=str(audit_missing)))
    else:
        out += [
            Bench(key="pipeline.audit", label="execute + audit plugin (JSON line to a tmp file)",
                  setup=lambda: _execute_timer(setups=[(audit, {"path": _audit_path("audit")})]), vs="limit.k2",
                  note="the audit rows include the plugin's own work: one JSON line per call, os.write to a tmp file; "
                  "pipeline.audit_floor is that work alone"),
            Bench(key="pipeline.audit_floor", label="audit floor: audit_record + encode + os.write, no pipeline",
                  setup=lambda: _audit_floor_timer(audit), vs="pipeline.l0"),
        ]  # fmt: skip
    if timeout is not None and audit is not None:

        def both(name: str) -> list[tuple[ModuleType, dict[str, Any]]]:
            return [(timeout, {"default_ms": 30000}), (audit, {"path": _audit_path(name)})]

        out += [
            Bench(key="pipeline.timeout_audit", label="execute + timeout (armed) + audit",
                  setup=lambda: _execute_timer(setups=both("both")), vs="limit.k3"),
            # What the two plugins add on top of the no-op listeners (the ratio is to the same call without them).
            Bench(key="pipeline.l1.timeout_audit",
                  label="execute, 1 no-op listener per waterfall + timeout (armed) + audit",
                  setup=lambda: _execute_timer(1, setups=both("both1")), vs="pipeline.l1"),
            Bench(key="pipeline.l10.timeout_audit",
                  label="execute, 10 no-op listeners per waterfall + timeout (armed) + audit",
                  setup=lambda: _execute_timer(10, setups=both("both10")), vs="pipeline.l10"),
        ]  # fmt: skip
    return out
