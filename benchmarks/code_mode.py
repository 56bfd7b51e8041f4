"""Code Mode: the ``run_code`` bridge's start-up and its overhead per tool sub-call.

Measured only when ``ToolRuntime(mode="code", code_runtime=SubprocessPythonRuntime())``
exposes a working ``run_code`` tool; otherwise the rows are skipped with the
reason. Start-up is a ``run_code`` of a program that only returns, compared
with spawning ``python -I -c pass``; the per-sub-call overhead is a program
making 1 000 sequential ``await tools.add(...)`` calls, minus start-up, per
call, compared with one direct ``execute``.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

import trio

from dsh_core import ToolRuntime

from ._fixtures import add_tool, make_input
from ._harness import Bench, Case, Derived, Skipped, Target, Timer, loop_timer

GROUP = "code_mode"

SUB_CALLS = 1000
_EMPTY_PROGRAM = "return 1"
_CALLS_PROGRAM = f'for _ in range({SUB_CALLS}):\n    await tools.add({{"a": 1, "b": 2}})\nreturn 1'


def _runtime() -> ToolRuntime:
    from dsh_core.code_mode import SubprocessPythonRuntime

    runtime = ToolRuntime(mode="code", code_runtime=SubprocessPythonRuntime())
    runtime.register(add_tool())
    return runtime


def _request(code: str) -> Any:
    return make_input("run_code", {"code": code, "description": "benchmark program"})


def _probe() -> str | None:
    """Why the bridge cannot be measured here, or ``None`` when a program with one sub-call succeeds."""
    try:
        runtime = _runtime()
        if runtime.get("run_code") is None:
            return "ToolRuntime(mode='code') presents no run_code tool"
        result = trio.run(runtime.execute, _request('return await tools.add({"a": 1, "b": 2})'))
    except Exception as exc:
        return f"the run_code bridge is not available ({type(exc).__name__}: {exc})"
    if result.is_error:
        return f"run_code failed: {result.error}"
    return None


def _run_code_timer(code: str) -> Timer:
    runtime = _runtime()
    return loop_timer("await runtime.execute(request)", {"runtime": runtime, "request": _request(code)}, "trio")


def _spawn_timer() -> Timer:
    namespace = {"run_process": trio.run_process, "ARGV": [sys.executable, "-I", "-c", "pass"],
                 "DEVNULL": subprocess.DEVNULL}  # fmt: skip
    return loop_timer("await run_process(ARGV, stdout=DEVNULL, stderr=DEVNULL)", namespace, "trio")


def _per_call(stats: Mapping[str, float]) -> float:
    return (stats["code_mode.calls"] - stats["code_mode.startup"]) / SUB_CALLS


# The architecture's floor: a child that writes a call line and blocks reading the reply,
# a trio host that answers each line at once. No JSON work, no pipeline, no bookkeeping.
_ECHO_CHILD = f"""
import os
out = os.dup(1)
replies = os.fdopen(os.dup(0), "rb")
for _ in range({SUB_CALLS}):
    os.write(out, b'{{"type":"call","id":1,"name":"add","args":{{"a":1,"b":2}}}}\\n')
    replies.readline()
"""


async def _echo_round_trips() -> None:
    async with trio.open_nursery() as nursery:
        process: trio.Process = await nursery.start(
            functools.partial(
                trio.run_process, [sys.executable, "-I", "-c", _ECHO_CHILD], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
            )
        )  # fmt: skip
        assert process.stdin is not None and process.stdout is not None
        pending = b""
        answered = 0
        while answered < SUB_CALLS:
            chunk = await process.stdout.receive_some(65536)
            if not chunk:
                raise RuntimeError("the echo child stopped early")
            pending += chunk
            while b"\n" in pending:
                _, pending = pending.split(b"\n", 1)
                answered += 1
                await process.stdin.send_all(b'{"type":"reply","id":1,"ok":true,"value":3}\n')
        await process.stdin.aclose()


def _echo_timer() -> Timer:
    return loop_timer("await echo()", {"echo": _echo_round_trips}, "trio")


def _echo_per_round_trip(stats: Mapping[str, float]) -> float:
    return (stats["code_mode.echo"] - stats["code_mode.spawn"]) / SUB_CALLS


def cases(smoke: bool) -> list[Case]:
    problem = _probe()
    if problem is not None:
        note = f"skipped: {problem}"
        return [
            Skipped(key="code_mode.startup", label="run_code start-up", note=note),
            Skipped(key="code_mode.per_call", label="run_code bridge overhead per sub-call", note=note),
        ]
    return [
        Bench(key="code_mode.spawn", label="floor: spawn python -I -c pass (trio.run_process)", setup=_spawn_timer,
              wall_clock=True),
        Bench(key="code_mode.startup", label="run_code start-up (program: return 1)",
              setup=lambda: _run_code_timer(_EMPTY_PROGRAM), vs="code_mode.spawn", wall_clock=True,
              target=Target(limit=60_000, absolute=True)),
        Bench(key="code_mode.calls", label=f"run_code, program making {SUB_CALLS} sub-calls",
              setup=lambda: _run_code_timer(_CALLS_PROGRAM), vs="code_mode.startup", wall_clock=True),
        Bench(key="code_mode.echo", label=f"floor: {SUB_CALLS} JSON-line round trips with a bare child (spawn included)",
              setup=_echo_timer, vs="code_mode.spawn", wall_clock=True),
        Derived(key="code_mode.echo_per_trip", label="floor: one host-child round trip (bare echo)",
                inputs=("code_mode.echo", "code_mode.spawn"), compute=_echo_per_round_trip, vs="pipeline.l0"),
        Derived(key="code_mode.per_call", label="run_code bridge cost per sub-call",
                inputs=("code_mode.calls", "code_mode.startup"), compute=_per_call, vs="code_mode.echo_per_trip",
                target=Target(limit=150, absolute=True)),
    ]  # fmt: skip
