"""Code Mode: the ``run_code`` bridge's start-up and its overhead per tool sub-call.

Measured through ``ToolRuntime(mode="code", code_runtime=SubprocessPythonRuntime())``;
a bridge that cannot run fails the run (it ships with the package). Start-up is
a ``run_code`` of a program that only returns, compared with spawning
``python -I -c pass``; the per-sub-call overhead is a program making 1 000
sequential ``await tools.add(...)`` calls, minus start-up, per call, compared
with one bare host-child round trip. ``add``'s body cannot suspend, so the host
serves those sub-calls without a task; the same program against a body that
suspends once measures the other path. Two programs return a wide value (many
numbers, many small rows): what the child's check, the host's sizing, snapshot
and rendering cost per value. Each program is run once before timing and must
return its expected result.
"""

from __future__ import annotations

import functools
import subprocess
import sys
from collections.abc import Mapping
from typing import Any

import trio

from dsh_core import ToolExecutionFailure, ToolRuntime

from ._fixtures import add_body, add_body_suspending, add_tool, make_input
from ._harness import Bench, Case, Derived, Expect, Target, Timer, loop_timer

GROUP = "code_mode"

SUB_CALLS = 1000
_EMPTY_PROGRAM = "return 1"
# The sum proves every sub-call returned add's 3 (one int addition per call, next to a process round trip).
_CALLS_PROGRAM = (
    f'total = 0\nfor _ in range({SUB_CALLS}):\n    total += await tools.add({{"a": 1, "b": 2}})\nreturn total'
)


def _runtime(body: Any = add_body) -> ToolRuntime:
    from dsh_core.code_mode import SubprocessPythonRuntime

    runtime = ToolRuntime(mode="code", code_runtime=SubprocessPythonRuntime())
    runtime.register(add_tool(execute=body))
    return runtime


def _request(code: str) -> Any:
    return make_input("run_code", {"code": code, "description": "benchmark program"})


def _returns(value: int) -> Expect:
    """A check that one ``run_code`` succeeded and its program returned ``value``."""

    def check(result: Any) -> str | None:
        if isinstance(result, ToolExecutionFailure):
            return f"run_code failed: {result.error.message}"
        returned = result.value.get("result") if isinstance(result.value, Mapping) else None
        return None if returned == value else f"the program returned {returned!r}, expected {value!r}"

    return check


WIDE_NUMBERS = 200_000
WIDE_ROWS = 20_000
_NUMBERS_PROGRAM = f"return list(range({WIDE_NUMBERS}))"
_ROWS_PROGRAM = f"return [{{'id': i, 'name': 'row', 'ok': True}} for i in range({WIDE_ROWS})]"


def _returns_wide(expected: Any) -> Expect:
    """A check that one ``run_code`` returned ``expected`` (a wide array), compared whole."""

    def check(result: Any) -> str | None:
        if isinstance(result, ToolExecutionFailure):
            return f"run_code failed: {result.error.message}"
        returned = result.value.get("result") if isinstance(result.value, Mapping) else None
        return None if returned == expected else "the program's wide value did not come back whole"

    return check


def _run_code_timer(code: str, body: Any = add_body) -> Timer:
    runtime = _runtime(body)
    return loop_timer("await runtime.execute(request)", {"runtime": runtime, "request": _request(code)}, "trio")


def _spawn_timer() -> Timer:
    namespace = {"run_process": trio.run_process, "ARGV": [sys.executable, "-I", "-c", "pass"],
                 "DEVNULL": subprocess.DEVNULL}  # fmt: skip
    return loop_timer("await run_process(ARGV, stdout=DEVNULL, stderr=DEVNULL)", namespace, "trio")


def _per_call(stats: Mapping[str, float], calls: str = "code_mode.calls") -> float:
    return (stats[calls] - stats["code_mode.startup"]) / SUB_CALLS


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
    return [
        Bench(key="code_mode.spawn", label="floor: spawn python -I -c pass (trio.run_process)", setup=_spawn_timer,
              wall_clock=True),
        Bench(key="code_mode.startup", label="run_code start-up (program: return 1)",
              setup=lambda: _run_code_timer(_EMPTY_PROGRAM), vs="code_mode.spawn", wall_clock=True,
              target=Target(limit=60_000, absolute=True), expect=_returns(1)),
        Bench(key="code_mode.calls", label=f"run_code, program making {SUB_CALLS} sub-calls",
              setup=lambda: _run_code_timer(_CALLS_PROGRAM), vs="code_mode.startup", wall_clock=True,
              expect=_returns(3 * SUB_CALLS)),
        Bench(key="code_mode.echo", label=f"floor: {SUB_CALLS} JSON-line round trips with a bare child (spawn included)",
              setup=_echo_timer, vs="code_mode.spawn", wall_clock=True),
        Derived(key="code_mode.echo_per_trip", label="floor: one host-child round trip (bare echo)",
                inputs=("code_mode.echo", "code_mode.spawn"), compute=_echo_per_round_trip, vs="pipeline.l0"),
        Derived(key="code_mode.per_call", label="run_code bridge cost per sub-call",
                inputs=("code_mode.calls", "code_mode.startup"), compute=_per_call, vs="code_mode.echo_per_trip",
                target=Target(limit=150, absolute=True)),
        Bench(key="code_mode.calls.suspending",
              label=f"run_code, program making {SUB_CALLS} sub-calls to a body that suspends once",
              setup=lambda: _run_code_timer(_CALLS_PROGRAM, add_body_suspending), vs="code_mode.calls",
              wall_clock=True, expect=_returns(3 * SUB_CALLS)),
        Derived(key="code_mode.per_call.suspending", label="run_code bridge cost per sub-call, a body that suspends once",
                inputs=("code_mode.calls.suspending", "code_mode.startup"),
                compute=functools.partial(_per_call, calls="code_mode.calls.suspending"), vs="code_mode.per_call"),
        Bench(key="code_mode.wide_numbers", label=f"run_code returning {WIDE_NUMBERS:,} numbers (checked, sized, rendered)",
              setup=lambda: _run_code_timer(_NUMBERS_PROGRAM), vs="code_mode.startup", wall_clock=True,
              expect=_returns_wide(tuple(range(WIDE_NUMBERS)))),
        Bench(key="code_mode.wide_rows", label=f"run_code returning {WIDE_ROWS:,} rows of 3 members",
              setup=lambda: _run_code_timer(_ROWS_PROGRAM), vs="code_mode.startup", wall_clock=True,
              expect=_returns_wide(tuple({"id": i, "name": "row", "ok": True} for i in range(WIDE_ROWS)))),
    ]  # fmt: skip
