"""SubprocessPythonRuntime: real child processes, real clock, short budgets."""

from __future__ import annotations

import contextlib
import math
import os
import re
import signal
import sys
import time
import tracemalloc
from typing import Any

import pytest
import trio

from dsh_core import CodeRuntimeSettings, ErrorCode, FrozenDict, snapshot_json, thaw
from dsh_core._jsoncodec import decode_json, encode_json
from dsh_core.code_mode import CodeRunError, CodeRunResult, SubprocessPythonRuntime
from dsh_core.code_mode._child import TooManyValues, json_problem
from dsh_core.code_mode._runtime import _Call, _Done, _FrameError, _Log, _parse_frame

RUNTIME = SubprocessPythonRuntime(wall_budget_s=5.0, max_output_bytes=64 * 1024)


def writable_protocol_fd_program(payload: bytes | str) -> str:
    """A program that writes ``payload`` (bytes, or a bytes expression) straight onto the protocol channel, then idles.

    The channel is the only pipe above stderr that accepts a write (the copy of
    stdin is a read end, asyncio's self-pipe is a socket).
    """
    return (
        "import os, stat\n"
        "for fd in range(3, 256):\n"
        "    try:\n"
        "        if stat.S_ISFIFO(os.fstat(fd).st_mode):\n"
        f"            os.write(fd, {payload if isinstance(payload, str) else repr(payload)})\n"
        "    except OSError:\n"
        "        pass\n"
        "import time\n"
        "time.sleep(3)\n"
    )


async def echo(args: Any) -> Any:
    return args


async def fail(args: Any) -> Any:
    raise RuntimeError("the tool broke")


def assert_error(result: CodeRunResult, kind: str, *fragments: str) -> None:
    assert result.error is not None, result
    assert result.error.kind == kind, result.error
    for fragment in fragments:
        assert fragment in result.error.message, result.error.message
    assert not result.has_value
    assert result.value is None


# ---------------------------------------------------------------------------
# Values and logs


async def test_returned_value_comes_back_as_a_snapshot() -> None:
    result = await RUNTIME.run("return {'n': 42, 'items': [1, 2.5, None, True, 'x']}", {})
    assert result == CodeRunResult(value={"n": 42, "items": [1, 2.5, None, True, "x"]}, has_value=True)
    assert isinstance(result.value, FrozenDict)


@pytest.mark.parametrize("program", ["x = 1", "return None"])
async def test_no_return_value_means_no_value(program: str) -> None:
    result = await RUNTIME.run(program, {})
    assert result == CodeRunResult()
    assert not result.has_value


async def test_print_and_stderr_become_log_lines() -> None:
    program = (
        "import sys\n"
        "print('hello')\n"
        "print('a', 'b', sep='-', end='')\n"
        "print(' joined')\n"
        "print(file=sys.stderr)\n"
        "sys.stderr.write('to stderr\\n')\n"
        "print('tail without newline', end='')\n"
        "return 'done'"
    )
    result = await RUNTIME.run(program, {})
    assert result.logs == ("hello", "a-b joined", "", "to stderr", "tail without newline")
    assert result.value == "done"


@pytest.mark.parametrize(
    ("program", "expected"),
    [
        ("print('x' * 40000)\nprint('next')", ("x" * 32768, "x" * 7232, "next")),
        ("print('z' * 32768)\nprint('next')", ("z" * 32768, "next")),
        ("print('w' * 65536)", ("w" * 32768, "w" * 32768)),
        ("print('x' * 40000, 'y')", ("x" * 32768, "x" * 7232 + " y")),
        ("import sys\nsys.stdout.write('y' * 40000 + '\\n')\nprint('next')", ("y" * 32768, "y" * 7232, "next")),
    ],
    ids=["40000", "exactly-32768", "twice-32768", "more-after-the-cut", "one-write"],
)
async def test_a_long_printed_line_arrives_in_chunks_without_an_empty_entry(
    program: str, expected: tuple[str, ...]
) -> None:
    """print() of 32 768+ characters added an empty entry: its newline, written after the cut (s20 Code Mode audit)."""
    result = await SubprocessPythonRuntime(wall_budget_s=5.0).run(program, {})
    assert result.error is None, result.error
    assert [len(line) for line in result.logs] == [len(line) for line in expected]
    assert result.logs == expected


async def test_the_programs_stdout_has_what_programs_expect_of_a_text_stream() -> None:
    """``reconfigure``, ``buffer`` and ``fileno`` failed the run; ``csv`` rows kept their ``\\r`` (s20 Code Mode audit)."""
    program = (
        "import csv, faulthandler, os, subprocess, sys\n"
        "sys.stdout.reconfigure(encoding='UTF8', errors='replace', line_buffering=True)\n"
        "sys.stderr.reconfigure(write_through=True)\n"
        "out = sys.stdout.buffer\n"
        "out.write(b'caf\\xc3')\n"
        "out.write(bytearray(b'\\xa9 ok\\n'))\n"
        "out.write(b'bad \\xff\\n')\n"
        "out.write(b'cut \\xe2\\x82')\n"
        "print(' then text')\n"
        "print(sys.stdout.fileno(), sys.stderr.fileno(), sys.stdout.buffer.fileno())\n"
        "faulthandler.enable()\n"
        "os.write(sys.stderr.fileno(), b'through the descriptor\\n')\n"
        "subprocess.run(['echo', 'from a subprocess'], stdout=sys.stdout, check=True)\n"
        "csv.writer(sys.stdout).writerow(['a', 'b'])\n"
        "print('x' * 32768 + '\\r')\n"
        "try:\n"
        "    sys.stdout.reconfigure(encoding='latin-1')\n"
        "except ValueError as error:\n"
        "    print(error)\n"
        "out.write(b'last \\xe2')"
    )
    result = await SubprocessPythonRuntime(wall_budget_s=5.0).run(program, {})
    assert result.error is None, result.error
    # What went through the descriptors arrives on another pipe: in its own order only.
    written = ["through the descriptor", "from a subprocess"]
    assert [line for line in result.logs if line in written] == written
    assert tuple(line for line in result.logs if line not in written) == (
        "caf\u00e9 ok",
        "bad \ufffd",
        "cut \ufffd then text",
        "1 2 1",
        "a,b",
        "x" * 32768,
        "sys.stdout of a run_code program writes UTF-8 text to the run's logs; "
        "it cannot be reconfigured to encoding='latin-1' (only 'utf-8')",
        "last \ufffd",
    )


async def test_a_stream_the_program_wraps_around_stdout_is_flushed_when_it_ends() -> None:
    """What went through io.TextIOWrapper(sys.stdout.buffer) was lost: os._exit flushes nothing (s20 review)."""
    program = (
        "import io, sys\n"
        "sys.stdout = io.TextIOWrapper(sys.stdout.buffer, encoding='utf-8')\n"
        "sys.stderr = io.TextIOWrapper(sys.stderr.buffer, encoding='utf-8')\n"
        "print('h\u00e9llo')\n"
        "print('to stderr', file=sys.stderr)\n"
        "return 1"
    )
    result = await SubprocessPythonRuntime(wall_budget_s=5.0).run(program, {})
    assert result.error is None and result.value == 1, result.error
    assert sorted(result.logs) == sorted(["h\u00e9llo", "to stderr"])


async def test_top_level_await_works_and_line_numbers_are_the_programs() -> None:
    result = await RUNTIME.run("import asyncio\nawait asyncio.sleep(0)\n\n1 / 0", {})
    assert_error(result, "exception", "ZeroDivisionError: division by zero", "line 4")


# ---------------------------------------------------------------------------
# Bindings


async def test_binding_round_trip() -> None:
    seen: list[Any] = []

    async def record(args: Any) -> Any:
        seen.append(args)
        return {"echo": args, "extra": [1, 2]}

    result = await RUNTIME.run("r = await tools.record({'q': 'x', 'n': [1]})\nreturn r", {"record": record})
    assert seen == [{"q": "x", "n": [1]}]
    assert isinstance(seen[0], FrozenDict)
    assert result.value == {"echo": {"q": "x", "n": [1]}, "extra": [1, 2]}


async def test_exotic_names_by_subscript_and_unknown_names() -> None:
    program = (
        "a = await tools['my-tool']({'v': 1})\n"
        "b = await tools['__proto__']({'v': 2})\n"
        "names = sorted(tools)\n"
        "try:\n"
        "    tools.missing\n"
        "except AttributeError as exc:\n"
        "    c = str(exc)\n"
        "try:\n"
        "    tools['missing']\n"
        "except KeyError:\n"
        "    d = 'KeyError'\n"
        "return [a, b, names, c, d, 'my-tool' in tools]"
    )
    result = await RUNTIME.run(program, {"my-tool": echo, "__proto__": echo})
    assert result.value == ({"v": 1}, {"v": 2}, ("__proto__", "my-tool"), "no tool named 'missing'", "KeyError", True)


async def test_failing_binding_raises_tool_call_error_in_the_program() -> None:
    program = (
        "try:\n"
        "    await tools.fail({})\n"
        "except ToolCallError as exc:\n"
        "    return [exc.tool_name, str(exc), isinstance(exc, Exception)]"
    )
    result = await RUNTIME.run(program, {"fail": fail})
    assert result.value == ("fail", "the tool broke", True)


async def test_uncaught_tool_call_error_is_an_exception_naming_the_tool() -> None:
    result = await RUNTIME.run("print('before')\nawait tools.fail({})", {"fail": fail})
    assert_error(result, "exception", "ToolCallError: the tool broke", "'fail'", "line 2")
    assert result.logs == ("before",)


async def test_custom_global_and_error_class_names() -> None:
    program = "try:\n    await api.fail({})\nexcept Failure as exc:\n    return exc.tool_name"
    result = await RUNTIME.run(program, {"fail": fail}, global_name="api", error_class_name="Failure")
    assert result.value == "fail"


@pytest.mark.parametrize(
    ("global_name", "error_class_name"),
    [
        ("tools", "tools"),
        ("class", "E"),
        ("match", "E"),
        ("function", "E"),
        ("t", "__name__"),
        ("t-x", "E"),
        ("t", "É"),
    ],
)
async def test_non_portable_namespace_names_are_misuse(global_name: str, error_class_name: str) -> None:
    with pytest.raises(ValueError, match=r"portable identifier|both"):
        await RUNTIME.run("return 1", {}, global_name=global_name, error_class_name=error_class_name)


async def test_non_json_arguments_fail_in_the_program_without_a_call() -> None:
    calls: list[Any] = []

    async def record(args: Any) -> Any:
        calls.append(args)
        return None

    program = (
        "out = []\n"
        "for bad in ({1, 2}, {'x': float('nan')}, {'x': -0.0}, {1: 'int key'}):\n"
        "    try:\n"
        "        await tools.record(bad)\n"
        "    except ToolCallError as exc:\n"
        "        out.append(str(exc))\n"
        "return out"
    )
    result = await RUNTIME.run(program, {"record": record})
    assert calls == []
    assert isinstance(result.value, tuple)
    assert len(result.value) == 4
    assert all(isinstance(message, str) and "lossless JSON" in message for message in result.value)


async def test_binding_returning_non_json_fails_the_call() -> None:
    async def bad(args: Any) -> Any:
        return {"when": object()}

    program = "try:\n    await tools.bad({})\nexcept ToolCallError as exc:\n    return str(exc)"
    result = await RUNTIME.run(program, {"bad": bad})
    assert isinstance(result.value, str)
    assert "non-JSON" in result.value


async def test_concurrent_calls_overlap() -> None:
    arrived = 0
    both_arrived = trio.Event()

    async def meet(args: Any) -> Any:
        nonlocal arrived
        arrived += 1
        if arrived == 2:
            both_arrived.set()
        # Deadlocks (and the run times out) unless the second call is served
        # while the first is still waiting.
        await both_arrived.wait()
        return args["who"]

    program = "import asyncio\nreturn list(await asyncio.gather(tools.a({'who': 'a'}), tools.b({'who': 'b'})))"
    runtime = SubprocessPythonRuntime(wall_budget_s=3.0)
    result = await runtime.run(program, {"a": meet, "b": meet})
    assert result.value == ("a", "b")


async def test_calls_still_in_flight_are_cancelled_when_the_run_ends() -> None:
    started = trio.Event()
    cancelled = False

    async def slow(args: Any) -> Any:
        nonlocal cancelled
        started.set()
        try:
            await trio.sleep(30)
        except trio.Cancelled:
            cancelled = True
            raise
        return None

    async def ready(args: Any) -> Any:
        await started.wait()
        return None

    program = "import asyncio\nasyncio.ensure_future(tools.slow({}))\nawait tools.ready({})\nreturn 'left'"
    start = time.monotonic()
    result = await RUNTIME.run(program, {"slow": slow, "ready": ready})
    assert result.value == "left"
    assert cancelled
    assert time.monotonic() - start < 3


@pytest.mark.slow
async def test_a_value_nested_100_000_deep_is_checked_in_little_memory() -> None:
    # Passed to a tool and returned: the child checks it both times, under a 256 MiB address-space limit.
    program = (
        "v = 1\n"
        "for _ in range(100_000):\n"
        "    v = [v]\n"
        "echoed = (await tools.echo({'x': v}))['x']\n"
        "return [echoed]"
    )
    runtime = SubprocessPythonRuntime(wall_budget_s=30.0, max_memory_bytes=256 * 1024 * 1024)
    result = await runtime.run(program, {"echo": echo})
    assert result.error is None, result.error
    depth, value = 0, result.value
    while isinstance(value, tuple):
        assert len(value) == 1
        value = value[0]
        depth += 1
    assert (depth, value) == (100_001, 1)


async def test_a_returned_key_too_deep_to_print_is_invalid_output() -> None:
    program = "k = ()\nfor _ in range(100_000):\n    k = (k,)\nreturn {'a': {k: 1}}"
    result = await SubprocessPythonRuntime(wall_budget_s=30.0).run(program, {})
    assert_error(result, "invalid-output", '$["a"]: object key (((((((...),),),),),),) is not a str')


async def test_running_out_of_memory_encoding_the_returned_value_is_invalid_output() -> None:
    # 150 MB of text fits under the limit once, not twice: encoding it fails in the child.
    runtime = SubprocessPythonRuntime(wall_budget_s=30.0, max_memory_bytes=256 * 1024 * 1024)
    result = await runtime.run("return 'x' * 150_000_000", {})
    assert_error(result, "invalid-output", "the program returned a value that could not be checked", "MemoryError")


async def test_deep_values_cross_the_channel_intact() -> None:
    program = (
        "x = []\n"
        "for _ in range(2000):\n"
        "    x = [x]\n"
        "y = (await tools.echo({'x': x}))['x']\n"
        "depth = 0\n"
        "while y:\n"
        "    y = y[0]\n"
        "    depth += 1\n"
        "print(depth)\n"
        "return x"
    )
    runtime = SubprocessPythonRuntime(wall_budget_s=5.0)
    result = await runtime.run(program, {"echo": echo})
    assert result.logs == ("2000",)
    depth, value = 0, result.value
    while value:
        assert isinstance(value, tuple)
        value = value[0]
        depth += 1
    assert depth == 2000


# ---------------------------------------------------------------------------
# Failures


@pytest.mark.parametrize(
    ("program", "fragments"),
    [
        ("raise ValueError('bad input')", ("ValueError: bad input", "line 1")),
        ("def f(:\n    pass", ("SyntaxError",)),
        ("yield 1", ("SyntaxError", "yield")),
        ("import sys\nsys.exit(3)", ("SystemExit: 3",)),
        (
            "import asyncio\nasync def boom():\n    raise KeyError('k')\nasync with asyncio.TaskGroup() as g:\n"
            "    g.create_task(boom())",
            ("ExceptionGroup", "KeyError: 'k'"),
        ),
    ],
)
async def test_program_exceptions(program: str, fragments: tuple[str, ...]) -> None:
    assert_error(await RUNTIME.run(program, {}), "exception", *fragments)


@pytest.mark.parametrize(
    ("raised", "fragment"),
    [
        ("SystemExit('disk full, giving up')", "SystemExit: disk full, giving up"),
        ("KeyboardInterrupt()", "KeyboardInterrupt"),
    ],
)
@pytest.mark.parametrize("where", ["task", "callback"])
async def test_an_exit_raised_in_a_task_or_callback_is_the_outcome_not_the_cancellation(
    raised: str, fragment: str, where: str
) -> None:
    # It leaves the event loop, whose shutdown would cancel the waiting main coroutine.
    start = "asyncio.create_task(worker())" if where == "task" else "asyncio.get_running_loop().call_soon(worker)"
    program = (
        "import asyncio\n"
        f"{'async ' if where == 'task' else ''}def worker():\n"
        f"    raise {raised}\n"
        f"{start}\n"
        "await asyncio.sleep(5)\n"
        "return 'unreached'"
    )
    result = await RUNTIME.run(program, {})
    assert_error(result, "exception", f"{fragment} (line 3)")
    assert result.error is not None and "CancelledError" not in result.error.message


@pytest.mark.skipif(os.name != "posix", reason="ulimit")
async def test_a_program_that_used_up_its_descriptors_still_reports_its_own_error(tmp_path: Any) -> None:
    # No import in the program: the child has loaded nothing for describing a failure yet.
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nulimit -n 64\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    program = (
        "keep = []\n"
        "try:\n"
        "    while True:\n"
        "        keep.append(open('/dev/null'))\n"
        "except OSError:\n"
        "    pass\n"
        "raise ValueError('my real error')"
    )
    result = await SubprocessPythonRuntime(wall_budget_s=5.0, python=str(python)).run(program, {})
    assert_error(result, "exception")
    assert result.error is not None and result.error.message == "ValueError: my real error (line 7)"


@pytest.mark.parametrize(
    ("raising", "message"),
    [
        ("class Oops(Exception):\n    pass\nraise Oops('a\\nb')", "Oops: a\nb (line 3)"),
        (  # a class of a function of the program: named as a script's traceback names it
            "def f():\n    class Inner(Exception):\n        pass\n    raise Inner('x')\nf()",
            "f.<locals>.Inner: x (line 4)",
        ),
        ("raise ValueError()", "ValueError (line 1)"),
        ("e = KeyError('k')\ne.add_note('a note')\nraise e", "KeyError: 'k' (line 3)"),  # the note is not the error
        (
            "class Unprintable(Exception):\n    def __str__(self):\n        raise RuntimeError\nraise Unprintable()",
            "Unprintable: <exception str() failed> (line 4)",
        ),
        (
            "await tools.fail({})",
            "ToolCallError: the tool broke (tool 'fail', line 1)",
        ),
    ],
)
async def test_how_a_program_exception_is_described(raising: str, message: str) -> None:
    result = await RUNTIME.run(raising, {"fail": fail})
    assert_error(result, "exception")
    assert result.error is not None and result.error.message == message


@pytest.mark.parametrize("value", ["{1, 2}", "(lambda: [l := [], l.append(l), l][-1])()"])
async def test_non_json_return_is_invalid_output(value: str) -> None:
    assert_error(await RUNTIME.run(f"return {value}", {}), "invalid-output", "lossless JSON")


async def test_the_programs_own_classes_are_named_without_the_wrapper_function() -> None:
    """They were ``__run_code__.__dsh_main__.<locals>.Row`` in model-facing messages (s20 Code Mode audit)."""
    program = "class Row:\n    pass\nreturn {'rows': [Row()]}"
    result = await RUNTIME.run(program, {})
    assert_error(result, "invalid-output")
    assert result.error is not None
    assert result.error.message.endswith('$["rows"][0]: Row is not a JSON value'), result.error.message
    result = await RUNTIME.run("import collections\nreturn collections.OrderedDict()", {})
    assert result.error is not None and "$: collections.OrderedDict is not a JSON value" in result.error.message


async def test_infinite_loop_times_out_within_budget() -> None:
    runtime = SubprocessPythonRuntime(wall_budget_s=1.0)
    start = time.monotonic()
    result = await runtime.run("print('spinning')\nwhile True:\n    pass", {})
    elapsed = time.monotonic() - start
    assert_error(result, "timeout", "1 s")
    assert result.logs == ("spinning",)
    assert 1.0 <= elapsed < 2.5


@pytest.mark.parametrize(
    "program",
    [
        "for _ in range(100_000):\n    print('x' * 1000)",
        "print('y' * 100_000_000)",
    ],
)
async def test_output_flood_stops_at_the_limit(program: str) -> None:
    runtime = SubprocessPythonRuntime(wall_budget_s=5.0, max_output_bytes=10_000)
    start = time.monotonic()
    result = await runtime.run(program, {})
    assert_error(result, "output-limit", "10000 bytes")
    assert time.monotonic() - start < 3
    # The logs kept are the prefix that fitted.
    assert sum(len(line.encode()) + 1 for line in result.logs) <= 10_000
    assert sum(len(line) for line in result.logs) > 9_000


async def test_logs_and_value_share_the_output_limit() -> None:
    runtime = SubprocessPythonRuntime(max_output_bytes=100)
    fits = await runtime.run("print('x' * 40)\nreturn 'y' * 40", {})
    assert fits.value == "y" * 40
    over = await runtime.run("print('x' * 40)\nreturn 'y' * 60", {})
    assert_error(over, "output-limit")
    assert over.logs == ("x" * 40,)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("e", 1),
        ("é", 2),
        ("€", 3),
        ("😀", 4),
        ("\ud800", 3),  # a lone surrogate: counted as the host counts it
    ],
    ids=["ascii", "2-byte", "3-byte", "astral", "lone-surrogate"],
)
async def test_the_returned_value_is_capped_by_its_utf8_size_not_its_escaped_frame(text: str, size: int) -> None:
    # The value's compact JSON, quotes included, fills the cap exactly, then passes it by one byte.
    cap = 1000
    count, padding = divmod(cap - 2, size)
    value = text * count + "e" * padding
    runtime = SubprocessPythonRuntime(wall_budget_s=5.0, max_output_bytes=cap)
    fits = await runtime.run(f"return {value!r}", {})
    assert fits.error is None, fits.error
    assert fits.value == value
    assert_error(await runtime.run(f"return {value + 'e'!r}", {}), "output-limit", f"{cap} bytes")


@pytest.mark.parametrize(
    ("program", "expected"),
    [
        ("return 'é' * 3_000_000", "é" * 3_000_000),  # 6 MB of UTF-8, 18 MB escaped to ASCII
        ("return '😀' * 1_500_000", "😀" * 1_500_000),  # 6 MB of UTF-8, 18 MB escaped
        ("return '\\ud800' * 5_000_000", "\ud800" * 5_000_000),  # 15 MB as the host counts it, 30 MB escaped
    ],
    ids=["2-byte", "astral", "lone-surrogate"],
)
async def test_a_value_within_the_cap_comes_through_however_long_its_ascii_escape(program: str, expected: str) -> None:
    # max_output_bytes is the limit a user sets: a value within it must arrive, whatever its
    # escaped form would cost. The child sends it as UTF-8, so its frame is its size plus the envelope.
    runtime = SubprocessPythonRuntime(wall_budget_s=10.0, max_output_bytes=16_000_000)
    assert runtime.max_frame_bytes < 18_000_000
    result = await runtime.run(program, {})
    assert result.error is None, result.error
    assert result.value == expected


async def test_child_crash_is_worker_exit_with_stderr() -> None:
    result = await RUNTIME.run("import os\nprint('last words')\nos.write(2, b'crashing now')\nos._exit(3)", {})
    assert_error(result, "worker-exit", "exited with code 3", "crashing now")
    assert result.logs == ("last words", "crashing now")  # written to descriptor 2: a log line too


@pytest.mark.skipif(os.name != "posix", reason="process groups")
async def test_what_a_child_started_before_exiting_does_not_outlive_the_run(tmp_path: Any) -> None:
    pid_file = tmp_path / "pid"
    program = (
        "import os, subprocess\n"
        "child = subprocess.Popen(['sleep', '30'])\n"
        f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
        "os._exit(3)\n"
    )
    result = await RUNTIME.run(program, {})
    assert_error(result, "worker-exit", "exited with code 3")
    pid = int(pid_file.read_text())
    for _ in range(100):  # the kill is sent before run() returns; the kernel may take a moment
        try:
            with open(f"/proc/{pid}/stat", "rb") as stat_file:
                state = stat_file.read().rsplit(b")", 1)[1].split()[0]
        except FileNotFoundError:
            break
        if state in (b"Z", b"X"):
            break
        await trio.sleep(0.02)
    else:
        raise AssertionError(f"the grandchild {pid} outlived the run")


FORK_THEN_EXIT = (
    "import os, time\nif os.fork() == 0:\n    time.sleep(30)\n    os._exit(0)\nprint('forked')\nos._exit(3)"
)
MP_THEN_KILLED = (
    "import multiprocessing as mp, os, signal, time\n"
    "worker = mp.get_context('fork').Process(target=time.sleep, args=(30,))\n"
    "worker.start()\n"
    "os.kill(os.getpid(), signal.SIGKILL)"
)


@pytest.mark.skipif(os.name != "posix", reason="fork")
@pytest.mark.parametrize(
    ("program", "fragment"),
    [(FORK_THEN_EXIT, "exited with code 3"), (MP_THEN_KILLED, "killed by signal 9")],
    ids=["os.fork", "multiprocessing"],
)
async def test_a_fork_holding_the_channel_does_not_turn_a_crash_into_a_timeout(program: str, fragment: str) -> None:
    # The fork keeps a copy of the protocol descriptor: the host never sees the end of the stream.
    runtime = SubprocessPythonRuntime(wall_budget_s=5.0)
    start = time.monotonic()
    result = await runtime.run(program, {})
    assert_error(result, "worker-exit", fragment)
    assert time.monotonic() - start < 2.5


def escaped_fork_program(pid_file: Any, ending: str) -> str:
    """A program whose fork leaves the process group (so the host cannot kill it to end the stream), then ``ending``."""
    return (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        f"    open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
        "    time.sleep(30)\n"
        "    os._exit(0)\n"
        f"while not os.path.getsize({str(pid_file)!r}) if os.path.exists({str(pid_file)!r}) else True:\n"
        "    time.sleep(0.01)\n"
        "print('forked')\n"
        f"{ending}"
    )


@pytest.mark.skipif(os.name != "posix", reason="fork, sessions")
async def test_a_result_written_just_before_exit_is_kept_beside_a_fork_holding_the_channel(tmp_path: Any) -> None:
    runtime = SubprocessPythonRuntime(wall_budget_s=5.0, max_output_bytes=2_000_000)
    pid_files = [tmp_path / "returns", tmp_path / "crashes"]
    try:
        start = time.monotonic()
        # Larger than the pipe: most of it is still unread when the child exits.
        result = await runtime.run(escaped_fork_program(pid_files[0], "return 'v' * 1_000_000"), {})
        assert result.error is None, result.error
        assert result.value == "v" * 1_000_000
        assert result.logs == ("forked",)
        assert time.monotonic() - start < 2.5
        start = time.monotonic()
        crashed = await runtime.run(escaped_fork_program(pid_files[1], "os._exit(3)"), {})
        assert_error(crashed, "worker-exit", "exited with code 3")
        assert crashed.logs == ("forked",)
        assert time.monotonic() - start < 2.5
    finally:
        for pid_file in pid_files:
            if pid_file.exists() and pid_file.read_text():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid_file.read_text()), signal.SIGKILL)


FORK_WORKERS_PRINT = (
    "import multiprocessing as mp, sys\n"
    "def work(i):\n"
    "    for k in range(50):\n"
    "        print(str(i) * 5000)\n"
    "    sys.stderr.write(f'worker {i} done\\n')\n"
    "ctx = mp.get_context('fork')\n"
    "workers = [ctx.Process(target=work, args=(i,)) for i in range(4)]\n"
    "for worker in workers:\n"
    "    worker.start()\n"
    "got = [(await tools.echo({'i': i}))['i'] for i in range(20)]\n"
    "for worker in workers:\n"
    "    worker.join()\n"
    "print('joined')\n"
    "return [got, [worker.exitcode for worker in workers]]"
)


@pytest.mark.skipif(os.name != "posix", reason="fork")
async def test_forked_workers_print_to_the_logs_without_touching_the_protocol() -> None:
    """Their log frames, larger than the pipe's atomic write, interleaved: protocol error (s20 Code Mode audit)."""
    result = await SubprocessPythonRuntime(wall_budget_s=10.0, max_output_bytes=4_000_000).run(
        FORK_WORKERS_PRINT, {"echo": echo}
    )
    assert result.error is None, result.error
    assert result.value == (tuple(range(20)), (0, 0, 0, 0))
    text = "".join(result.logs)
    for i in range(4):  # descriptor 2 may interleave lines longer than the pipe's atomic write, but keeps every byte
        assert text.count(str(i)) == 50 * 5000 + 1
    assert "joined" in result.logs


@pytest.mark.skipif(os.name != "posix", reason="fork")
async def test_a_fork_that_runs_on_to_the_programs_end_leaves_the_outcome_to_the_program() -> None:
    program = (
        "import os\n"
        "pid = os.fork()\n"
        "print('in the fork' if pid == 0 else 'in the program')\n"
        "if pid == 0:\n"
        "    try:\n"
        "        await tools.echo({})\n"
        "    except ToolCallError as error:\n"
        "        print(error)\n"
        "    return 'from the fork'\n"
        "os.waitpid(pid, 0)\n"
        "return await tools.echo('from the program')"
    )
    result = await SubprocessPythonRuntime(wall_budget_s=5.0).run(program, {"echo": echo})
    assert result.error is None, result.error
    assert result.value == "from the program"
    assert sorted(result.logs) == sorted(
        [
            "in the fork",
            "in the program",
            "tools cannot be called from a forked process (os.fork, multiprocessing's 'fork' start method); "
            "only the program's own process can call them: send what the worker needs back to it "
            "(a return value, a multiprocessing Queue) and make the call there",
        ]
    )


async def test_an_error_message_from_the_child_is_bounded() -> None:
    payload = (
        '(__import__("json").dumps({"type": "done", "error": {"kind": "exception", "message": "A" * 10_000_000}})'
        ' + "\\n").encode()'
    )
    result = await RUNTIME.run(writable_protocol_fd_program(payload), {})
    assert result.error is not None
    assert len(result.error.message) < 17 * 1024
    assert result.error.message.endswith("more characters not shown]")


async def test_child_killed_by_a_signal_is_worker_exit() -> None:
    result = await RUNTIME.run("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", {})
    assert_error(result, "worker-exit", "killed by signal 9")


async def test_unusable_interpreter_is_worker_exit() -> None:
    result = await SubprocessPythonRuntime(python="/nonexistent/python").run("return 1", {})
    assert_error(result, "worker-exit", "/nonexistent/python")


async def test_stray_writes_to_fd_1_do_not_touch_the_protocol() -> None:
    result = await RUNTIME.run(
        "import os\nos.write(1, b'not a frame\\n')\nos.system('echo from a subprocess')\nreturn 5", {}
    )
    # Neither is a frame; both are the program's output, and were lost (a subprocess's output too).
    assert result == CodeRunResult(value=5, has_value=True, logs=("not a frame", "from a subprocess"))


async def test_what_subprocesses_write_is_logged_within_the_output_limit() -> None:
    runtime = SubprocessPythonRuntime(wall_budget_s=20, max_output_bytes=1000)
    program = (
        "import os, subprocess\n"
        "print('printed')\n"
        "subprocess.run(['printf', 'one\\r\\ntwo\\n'])\n"
        "os.write(2, b'x' * 5000 + b'\\n')\n"
        "os.write(1, b'no newline at the end')\n"
        "return 1"
    )
    result = await runtime.run(program, {})
    assert result.error is None and result.value == 1
    assert set(result.logs[:3]) == {"printed", "one", "two"}  # the two streams interleave as they arrive
    assert result.logs[3:] == (
        "[5022 more bytes written to descriptors 1 and 2 were not kept: past max_output_bytes or 100000 lines]",
    )


@pytest.mark.parametrize("ending", ["return 1", "raise ValueError('late')"])
async def test_what_a_program_printed_through_c_stdio_is_logged(ending: str) -> None:
    """libc's printf buffers in C's stdio, which os._exit dropped: the program's output was lost."""
    program = f"import ctypes\nlibc = ctypes.CDLL(None)\nlibc.printf(b'from printf\\n')\nlibc.puts(b'from puts')\n{ending}"
    result = await RUNTIME.run(program, {})
    assert result.logs[:2] == ("from printf", "from puts")


async def test_a_subprocess_flooding_short_lines_keeps_a_bounded_number_of_them() -> None:
    """``yes`` writes tens of millions of lines a second: one string each would exhaust the host's memory."""
    from dsh_core.code_mode._runtime import MAX_WRITTEN_LINES

    runtime = SubprocessPythonRuntime(wall_budget_s=20)
    result = await runtime.run("import os\nos.system('yes 2>/dev/null | head -c 20000000')\nreturn 1", {})
    assert result.error is None and result.value == 1
    assert len(result.logs) == MAX_WRITTEN_LINES + 1 and set(result.logs[:-1]) == {"y"}
    assert result.logs[-1] == (
        f"[{20_000_000 - 2 * MAX_WRITTEN_LINES} more bytes written to descriptors 1 and 2 were not kept: "
        f"past max_output_bytes or {MAX_WRITTEN_LINES} lines]"
    )


async def test_a_subprocess_line_ends_a_line_the_program_flushed_unfinished() -> None:
    """It jumped ahead of the flushed part, which was then glued to the program's next print.

    Printed text and a subprocess's output arrive on two pipes, read by two tasks (README: their
    lines "may appear in either order"); the pauses give the host time to take each before the
    next even on a busy machine, where either reader may lag (CI on 3.13 saw both orders).
    """
    program = (
        "import subprocess, time\n"
        "print('progress: ', end='', flush=True)\n"
        "time.sleep(0.3)\n"
        "subprocess.run(['echo', 'child-output'])\n"
        "time.sleep(0.3)\n"
        "print('end')\n"
        "return 1"
    )
    for _ in range(3):
        result = await RUNTIME.run(program, {})
        assert result.logs == ("progress: child-output", "end"), result.logs


async def test_what_went_through_the_original_stdout_is_logged() -> None:
    """Buffered in the child, it died with os._exit: a library holding sys.__stdout__ printed nothing."""
    program = "import sys\nsys.__stdout__.write('via __stdout__\\n')\nreturn 1"
    assert (await RUNTIME.run(program, {})).logs == ("via __stdout__",)


async def test_a_tool_call_from_another_threads_event_loop_is_refused_before_the_tool_runs() -> None:
    """It ran on the host while the program was told it failed (s20 Code Mode audit): a retry wrote twice."""
    calls: list[Any] = []

    async def record(args: Any) -> Any:
        calls.append(args)
        return args

    program = (
        "import asyncio, threading\n"
        "out = []\n"
        "def worker(i):\n"
        "    try:\n"
        "        out.append(asyncio.run(tools.record({'thread': i})))\n"
        "    except ToolCallError as error:\n"
        "        out.append(str(error))\n"
        "threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]\n"
        "for thread in threads:\n"
        "    thread.start()\n"
        "for thread in threads:\n"
        "    thread.join()\n"
        "loop = asyncio.get_running_loop()\n"
        "def threadsafe(i):\n"
        "    return asyncio.run_coroutine_threadsafe(tools.record({'safe': i}), loop).result()\n"
        "safe = await asyncio.gather(*(asyncio.to_thread(threadsafe, i) for i in range(5)))\n"
        "return [out, safe]"
    )
    result = await RUNTIME.run(program, {"record": record})
    assert result.error is None, result.error
    assert isinstance(result.value, tuple)
    refused, safe = result.value
    assert len(refused) == 3
    for message in refused:
        assert "only be called on the program's own event loop" in message
        assert "asyncio.run_coroutine_threadsafe(" in message
    assert sorted(item["safe"] for item in safe) == list(range(5))
    assert sorted(call["safe"] for call in calls) == list(range(5))  # no call from the threads reached the host


async def test_lines_printed_from_threads_each_arrive_once() -> None:
    program = (
        "import sys, threading\n"
        "sys.setswitchinterval(1e-6)\n"
        "def work(t):\n"
        "    for i in range(3000):\n"
        "        print(f'<{t}:{i}>')\n"
        "threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]\n"
        "for thread in threads: thread.start()\n"
        "for thread in threads: thread.join()\n"
        "return 1"
    )
    result = await SubprocessPythonRuntime(wall_budget_s=30).run(program, {})
    assert result.error is None
    # print() writes its text and its newline separately, so lines may share an entry (as on any
    # stream); what must hold is that each text arrives exactly once. It came twice, or never.
    printed = re.findall(r"<\d+:\d+>", "".join(result.logs))
    assert sorted(printed) == sorted(f"<{t}:{i}>" for t in range(4) for i in range(3000))


@pytest.mark.parametrize("raised", ["KeyboardInterrupt", "SystemExit"])
async def test_an_exception_whose_str_raises_a_base_exception_is_still_described(raised: str) -> None:
    """The BaseException escaped the description: an opaque worker-exit, with the output lost."""
    program = (
        "class E(Exception):\n"
        f"    def __str__(self): raise {raised}()\n"
        "print('before')\n"
        "raise E()"
    )
    result = await RUNTIME.run(program, {})
    assert_error(result, "exception", "E: <exception str() failed> (line 4)")
    assert result.logs == ("before",)


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="POSIX interval timers")
async def test_a_signal_handler_that_raises_never_cuts_a_frame() -> None:
    """A SIGALRM "timeout" handler ran mid-write: frames cut in half (protocol) or the lock left held (a hang)."""
    # The handler raises only inside the print's try (under load a tick also lands on the loop's
    # own lines, where the program, not the runtime, would fail).
    program = (
        "import signal\n"
        "class Tick(Exception): pass\n"
        "inside = [False]\n"
        "def on_alarm(*args):\n"
        "    if inside[0]: raise Tick()\n"
        "signal.signal(signal.SIGALRM, on_alarm)\n"
        "signal.setitimer(signal.ITIMER_REAL, 0.0005, 0.0005)\n"
        "ticks = 0\n"
        "for i in range(300):\n"
        "    try:\n"
        "        inside[0] = True\n"
        "        print('x' * 20000)\n"
        "        inside[0] = False\n"
        "    except Tick:\n"
        "        inside[0] = False\n"
        "        ticks += 1\n"
        "signal.setitimer(signal.ITIMER_REAL, 0)\n"
        "return 'done'"
    )
    runtime = SubprocessPythonRuntime(wall_budget_s=20)
    for _ in range(3):
        result = await runtime.run(program, {})
        assert result.error is None and result.value == "done", result.error
        assert all(set(line) <= {"x"} for line in result.logs)


async def test_a_done_frame_behind_calls_waiting_for_room_is_honoured() -> None:
    """The reader, parked until a call in flight was answered, was cut when the child exited: done lost."""

    async def slow(args: Any) -> int:
        await trio.sleep(2)
        return 1

    program = (
        "import asyncio\n"
        "tasks = [asyncio.ensure_future(tools.slow({'i': i})) for i in range(1100)]\n"
        "await asyncio.sleep(0.2)\n"
        "return 'the value'"
    )
    result = await SubprocessPythonRuntime(wall_budget_s=20).run(program, {"slow": slow})
    assert result.error is None and result.value == "the value"


async def test_a_reply_of_many_megabytes_arrives_whole_under_asyncio() -> None:
    """A reply spanning hundreds of reads arrives whole (each read now searches only what is new)."""

    async def big(args: Any) -> str:
        return "y" * (24 * 1024 * 1024)

    program = "import asyncio\nvalue = await tools.big({})\nreturn len(value)"
    result = await SubprocessPythonRuntime(wall_budget_s=20).run(program, {"big": big})
    assert result.error is None and result.value == 24 * 1024 * 1024


async def test_an_unfinished_written_line_is_kept() -> None:
    result = await RUNTIME.run("import os\nos.write(1, b'working...')\nreturn 2", {})
    assert result == CodeRunResult(value=2, has_value=True, logs=("working...",))


@pytest.mark.parametrize(
    ("payload", "fragment"),
    [
        (b"garbage\n", "'garbage'"),
        (b'{"type": "done", "value": 1, "error": {"kind": "exception", "message": "m"}}\n', "not both"),
    ],
)
async def test_hostile_frames_are_protocol_errors(payload: bytes, fragment: str) -> None:
    start = time.monotonic()
    result = await RUNTIME.run(writable_protocol_fd_program(payload), {"echo": echo})
    assert_error(result, "protocol", fragment)
    assert time.monotonic() - start < 2.5


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        (b"garbage", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (b'{"type": "done", "value": NaN}', "not JSON"),
        (b"[1]", "not a JSON object"),
        (b'{"type": "surprise"}', "unknown frame type 'surprise'"),
        (b'{"text": "no type"}', "unknown frame type None"),
        (b'{"type": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "unknown frame type [[[[[[[...]]]]]]]"),
        (b'{"type": "call", "id": true, "name": "echo", "args": {}}', "int id"),
        (b'{"type": "call", "id": -1, "name": "echo", "args": {}}', "int id"),
        (b'{"type": "call", "id": 1.0, "name": "echo", "args": {}}', "int id"),
        (b'{"type": "call", "id": 1, "name": 7, "args": {}}', "str name"),
        (b'{"type": "call", "id": 1, "name": "echo"}', "exactly"),
        (b'{"type": "call", "id": 1, "name": "echo", "args": {}, "extra": 1}', "exactly"),
        (b'{"type": "log", "text": 1}', "str text"),
        (b'{"type": "log", "text": "x", "truncated": true}', "str text"),
        (b'{"type": "done", "value": 1, "error": {"kind": "exception", "message": "m"}}', "not both"),
        (b'{"type": "done", "error": {"kind": "timeout", "message": "m"}}', "known kind"),
        (b'{"type": "done", "error": {"kind": "exception"}}', "known kind"),
        (b'{"type": "done", "error": "boom"}', "known kind"),
        (b'{"type": "done", "extra": 1}', "not both"),
    ],
)
def test_frame_validator_rejects_every_malformed_shape(line: bytes, fragment: str) -> None:
    with pytest.raises(_FrameError, match=re.escape(fragment)):
        _parse_frame(line)


def test_frame_validator_accepts_the_documented_frames() -> None:
    assert _parse_frame(b'{"type": "call", "id": 3, "name": "x", "args": null}') == _Call(3, "x", None)
    assert _parse_frame(b'{"type": "log", "text": "hi"}') == _Log("hi")
    assert _parse_frame(b'{"type": "done"}') == _Done(None, False, None)
    assert _parse_frame(b'{"type": "done", "value": null}') == _Done(None, True, None)
    # A returned value goes as UTF-8, its lone surrogates as surrogatepass writes them.
    raw = '{"type":"done","value":"é😀\ud800"}'.encode("utf-8", "surrogatepass")
    assert _parse_frame(raw) == _Done("é😀\ud800", True, None)
    error = CodeRunError(kind="output-limit", message="m")
    assert _parse_frame(b'{"type": "done", "error": {"kind": "output-limit", "message": "m"}}') == _Done(
        None, False, error
    )


async def test_overlong_line_is_a_protocol_error() -> None:
    runtime = SubprocessPythonRuntime(max_output_bytes=100)
    result = await runtime.run(writable_protocol_fd_program(f"b'{{' * {runtime.max_frame_bytes + 10}"), {})
    assert_error(result, "protocol", "longer than", "'{{{{")


async def test_forged_done_value_is_still_checked() -> None:
    result = await RUNTIME.run(writable_protocol_fd_program(b'{"type": "done", "value": -0.0}\n'), {})
    assert_error(result, "invalid-output", "-0.0")


# ---------------------------------------------------------------------------
# JSON values per frame

FEW_VALUES = SubprocessPythonRuntime(wall_budget_s=5.0, max_json_values=100)


async def test_a_returned_value_of_more_json_values_than_the_cap_is_an_output_limit() -> None:
    result = await FEW_VALUES.run("return [0] * 100", {})  # the list and its 100 items
    assert_error(result, "output-limit", "the returned value holds more than 100 JSON values (max_json_values)")


async def test_a_returned_value_of_exactly_the_cap_comes_back() -> None:
    result = await FEW_VALUES.run("return {'a': [0] * 49, 'b': [''] * 48}", {})
    assert result.error is None, result.error
    assert result.value == {"a": (0,) * 49, "b": ("",) * 48}


async def test_commas_and_brackets_inside_strings_are_not_json_values() -> None:
    result = await FEW_VALUES.run("return ['[{,\"\\\\' * 1000] * 10", {})
    assert result.error is None, result.error
    assert result.value == ('[{,"\\' * 1000,) * 10


async def test_call_arguments_of_more_json_values_than_the_cap_fail_the_call_only() -> None:
    calls: list[Any] = []

    async def record(args: Any) -> Any:
        calls.append(args)
        return len(args["a"])

    program = (
        "try:\n"
        "    await tools.record({'a': [0] * 99})\n"
        "except ToolCallError as exc:\n"
        "    message = str(exc)\n"
        "return [message, await tools.record({'a': [0] * 98})]"
    )
    result = await FEW_VALUES.run(program, {"record": record})
    assert result.error is None, result.error
    assert result.value == ("tool arguments hold more than 100 JSON values (max_json_values)", 98)
    assert calls == [{"a": (0,) * 98}]


@pytest.mark.parametrize("head", [b'{"type":"done","value":[', b'{"type":"call","id":1,"name":"echo","args":['])
async def test_a_frame_of_more_json_values_than_the_cap_is_refused_before_it_is_decoded(head: bytes) -> None:
    payload = f"{head!r} + b','.join([b'[]'] * 200) + b']}}\\n'"
    result = await FEW_VALUES.run(writable_protocol_fd_program(payload), {"echo": echo})
    assert_error(result, "protocol", "the child sent a frame holding more than 100 JSON values (max_json_values)")


async def test_a_large_frame_does_not_hold_the_host_loop_past_the_wall_budget() -> None:
    # 900 000 values (within the default cap) take the host seconds to check: not on its loop.
    runtime = SubprocessPythonRuntime(wall_budget_s=0.5)
    payload = "b'{\"type\":\"done\",\"value\":[' + b','.join([b'{\"a\":1}'] * 450_000) + b']}\\n'"
    stalls: list[float] = []

    async def measure_stalls() -> None:
        last = time.monotonic()
        while True:
            await trio.sleep(0.01)
            now = time.monotonic()
            stalls.append(now - last)
            last = now

    async with trio.open_nursery() as nursery:
        nursery.start_soon(measure_stalls)
        start = time.monotonic()
        result = await runtime.run(writable_protocol_fd_program(payload), {})
        elapsed = time.monotonic() - start
        nursery.cancel_scope.cancel()
    assert_error(result, "timeout", "0.5 s wall-clock budget")
    assert elapsed < 1.5  # inline, the run ended when the check did, seconds late
    assert max(stalls) < 1.0  # what is left: decoding itself, one C call


async def test_a_large_value_decoded_after_the_child_exited_still_comes_back() -> None:
    # The child ends right after its done frame; checking the value outlasts EXIT_GRACE_S.
    program = "return [{'a': i} for i in range(300_000)]"
    result = await SubprocessPythonRuntime(wall_budget_s=30.0).run(program, {})
    assert result.error is None, result.error
    assert len(result.value) == 300_000 and result.value[-1] == {"a": 299_999}


@pytest.mark.parametrize("value", [0, -1, 1.5, True])
def test_max_json_values_must_be_a_positive_int(value: Any) -> None:
    with pytest.raises(ValueError, match="max_json_values must be a positive int"):
        SubprocessPythonRuntime(max_json_values=value)
    with pytest.raises(ValueError, match="max_json_values"):
        CodeRuntimeSettings(max_json_values=value)


def test_max_json_values_comes_from_the_code_runtime_settings() -> None:
    assert SubprocessPythonRuntime().max_json_values == 1_000_000
    options = CodeRuntimeSettings(max_json_values=5000).options()
    assert options == {"max_json_values": 5000}
    assert SubprocessPythonRuntime(**options).max_json_values == 5000


# ---------------------------------------------------------------------------
# Processes


async def test_outer_cancellation_kills_and_reaps_the_child() -> None:
    pids: list[int] = []
    reported = trio.Event()

    async def report(args: Any) -> Any:
        pids.append(args["pid"])
        reported.set()
        return None

    # A blocking sleep: the child would outlive the test unless it is killed.
    program = "import os, time\nawait tools.report({'pid': os.getpid()})\ntime.sleep(10)"
    start = time.monotonic()
    with trio.move_on_after(5) as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(RUNTIME.run, program, {"report": report})
            await reported.wait()
            await trio.sleep(0.3)  # let the reply land; the program is now in time.sleep
            nursery.cancel_scope.cancel()
    assert not scope.cancelled_caught
    assert time.monotonic() - start < 3
    # Reaped, not a zombie: the pid no longer exists at all.
    with pytest.raises(ProcessLookupError):
        os.kill(pids[0], 0)


async def test_cancellation_during_a_binding_call_reaps_the_child() -> None:
    pids: list[int] = []
    in_call = trio.Event()

    async def hang(args: Any) -> Any:
        pids.append(args["pid"])
        in_call.set()
        await trio.sleep_forever()

    # Closing the channel fails the pending call; the program shrugs that off.
    program = (
        "import os, time\ntry:\n    await tools.hang({'pid': os.getpid()})\nexcept ToolCallError:\n    time.sleep(10)"
    )
    start = time.monotonic()
    with trio.move_on_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(RUNTIME.run, program, {"hang": hang})
            await in_call.wait()
            nursery.cancel_scope.cancel()
    assert time.monotonic() - start < 3
    with pytest.raises(ProcessLookupError):
        os.kill(pids[0], 0)


async def test_every_run_gets_a_fresh_process() -> None:
    program = (
        "import os, builtins\nseen = getattr(builtins, 'marker', None)\nbuiltins.marker = 1\nreturn [os.getpid(), seen]"
    )
    first = await RUNTIME.run(program, {})
    second = await RUNTIME.run(program, {})
    assert isinstance(first.value, tuple) and isinstance(second.value, tuple)
    assert first.value[1] is None and second.value[1] is None
    assert first.value[0] != second.value[0]


async def test_environment_is_empty_unless_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DSH_HOST_SECRET", "hunter2")
    program = "import os\nreturn [os.environ.get('DSH_HOST_SECRET'), os.environ.get('GIVEN')]"
    assert (await RUNTIME.run(program, {})).value == (None, None)
    given = SubprocessPythonRuntime(env={"GIVEN": "yes"})
    assert (await given.run(program, {})).value == (None, "yes")


# ---------------------------------------------------------------------------
# Values without a process


def test_runtime_options_are_validated() -> None:
    for bad in ({"wall_budget_s": 0}, {"wall_budget_s": math.inf}, {"wall_budget_s": True}, {"max_output_bytes": 3}):
        with pytest.raises(ValueError):
            SubprocessPythonRuntime(**bad)
    runtime = SubprocessPythonRuntime()
    assert (runtime.language, runtime.isolation, runtime.wall_budget_s) == ("python", "process", 30.0)
    assert runtime.max_output_bytes == 64 * 1024 * 1024
    assert dict(runtime.env) == {}


def test_result_invariants() -> None:
    with pytest.raises(ValueError, match="no value"):
        CodeRunResult(value=1, has_value=True, error=CodeRunError(kind="exception", message="m"))
    with pytest.raises(ValueError, match="has_value"):
        CodeRunResult(value=1)
    with pytest.raises(ValueError):
        CodeRunError(kind="nope", message="m")  # type: ignore[arg-type]
    assert CodeRunResult(logs=["a"]).logs == ("a",)


def test_codec_round_trips_deep_values_and_rejects_nan() -> None:
    value: Any = {"k": "v\u2028\ud800"}
    for _ in range(3000):  # well past the C codec's recursion limit
        value = [value, {"n": 1.5}]
    text = encode_json(value)
    assert text.isascii()
    # Compared through the text: == itself would recurse 40 000 levels.
    assert encode_json(decode_json(text)) == text
    with pytest.raises(ValueError):
        decode_json('{"x": NaN}')
    with pytest.raises(ValueError):
        decode_json("[" * 3000 + "]" * 2999)
    with pytest.raises(ValueError):
        encode_json(math.inf)


def test_json_problem_names_the_path() -> None:
    assert json_problem({"a": [1, {"b": -0.0}]}) == '$["a"][1]["b"]: -0.0 has no lossless JSON form'
    assert json_problem({"a": (1, None, True, "s", 2.5)}) is None
    cycle: list[Any] = []
    cycle.append(cycle)
    assert json_problem(cycle) == "$[0]: the value contains itself"


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ([0.0, 1.5, -0.0], "$[2]: -0.0 has no lossless JSON form"),
        ({"a": [1, "x", float("inf")]}, '$["a"][2]: inf is not a finite JSON number'),
        ([[1, 2], [3, 10**5000]], "$[1][1]: an int of 16610 bits has more digits than JSON text can carry here"),
        ((True, 1, b"x"), "$[2]: bytes is not a JSON value"),
        ([1, ErrorCode.DENIED], "$[1]: dsh_core._errors.ErrorCode is not a JSON value"),
        ([[0.0] * 5, [0.0, -0.0]], "$[1][1]: -0.0 has no lossless JSON form"),
        ([list(range(10)), ("a", None, 2.5)], None),
    ],
)
def test_json_problem_checks_arrays_of_scalars_whole_and_names_the_bad_item(value: Any, problem: str | None) -> None:
    """Arrays holding only scalars are checked in one C-level pass; a problem found sends them to the walk."""
    assert json_problem(value) == problem


def test_json_problem_counts_the_values_of_arrays_of_scalars() -> None:
    assert json_problem([1] * 9, max_values=10) is None
    with pytest.raises(TooManyValues):
        json_problem([1] * 10, max_values=10)
    assert json_problem({"a": [1] * 8}, max_values=10) is None
    with pytest.raises(TooManyValues):
        json_problem({"a": [1] * 9}, max_values=10)


def test_json_problem_costs_memory_linear_in_depth() -> None:
    value: Any = 1
    for _ in range(10_000):
        value = [value]
    tracemalloc.start()
    try:
        assert json_problem(value) is None
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # One path string per level kept until its subtree is done would take ~150 MB here.
    assert peak < 8 * 1024 * 1024, peak
    bottom: Any = [float("nan")]
    for _ in range(10_000):
        bottom = {"k": bottom}
    assert json_problem(bottom) == "$" + '["k"]' * 10_000 + "[0]: nan is not a finite JSON number"


def test_json_problem_names_a_deep_non_str_key_briefly() -> None:
    key: Any = ()
    for _ in range(100_000):
        key = (key,)
    assert json_problem({"a": {key: 1}}) == '$["a"]: object key (((((((...),),),),),),) is not a str'


# -- the child's two drivers -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("program", "needs_loop"),
    [
        ("return 1", False),
        ("x = await tools.add({'a': 1})\nfor i in range(3):\n    print(i)\nreturn x", False),
        ("try:\n    await tools.t({})\nexcept ToolCallError as e:\n    return str(e)", False),
        ("import asyncio\nawait asyncio.sleep(0)", True),
        ("from asyncio import gather", True),
        ("def f():\n    import json\nreturn 1", True),
        ("m = __import__('asyncio')", True),
        ("exec('import asyncio')", True),
        ("eval('1')", True),
        ("g = globals()", True),
        ("b = __builtins__", True),
        ("f = tools.add.__globals__", True),
        ("class X:\n    def __await__(self):\n        yield 1\nawait X()", False),
    ],
)
def test_only_a_program_that_can_reach_an_import_gets_an_event_loop(program: str, needs_loop: bool) -> None:
    import ast

    from dsh_core.code_mode._child import needs_event_loop

    assert needs_event_loop(ast.parse(program)) is needs_loop


async def test_awaiting_something_other_than_a_tool_without_asyncio_fails_clearly() -> None:
    program = "class X:\n    def __await__(self):\n        yield 1\nawait X()"
    result = await RUNTIME.run(program, {})
    assert result.error is not None and result.error.kind == "exception"
    assert "not a tool call" in result.error.message and "import asyncio" in result.error.message


async def test_the_same_program_runs_alike_with_and_without_an_event_loop() -> None:
    async def add(args: Any) -> Any:
        if args["a"] < 0:
            raise ValueError("negative")
        return args["a"] + args["b"]

    body = (
        "total = 0\n"
        "for a in range(5):\n"
        "    total += await tools.add({'a': a, 'b': 1})\n"
        "try:\n"
        "    await tools.add({'a': -1, 'b': 0})\n"
        "except ToolCallError as error:\n"
        "    print('caught', error.tool_name, error)\n"
        "return total\n"
    )
    direct = await RUNTIME.run(body, {"add": add})
    looped = await RUNTIME.run("import asyncio\n" + body, {"add": add})
    assert direct == looped
    assert direct.value == 15 and direct.logs == ("caught add negative",)


async def test_a_binding_that_completes_at_once_is_served_without_a_task(monkeypatch: pytest.MonkeyPatch) -> None:
    from dsh_core.code_mode import _runtime

    served: list[str] = []
    tasks: list[trio.lowlevel.Task] = []

    class AtOnce:
        def __init__(self, at_once: bool) -> None:
            self.at_once = at_once

        def completes_at_once(self) -> bool:
            return self.at_once

        async def __call__(self, args: Any) -> Any:
            served.append("called")
            return 1

    original = _runtime._Session._serve

    async def tracking(self: Any, *args: Any) -> None:
        tasks.append(trio.lowlevel.current_task())
        await original(self, *args)

    monkeypatch.setattr(_runtime._Session, "_serve", tracking)
    program = "return await tools.fast({}) + await tools.slow({})"
    result = await RUNTIME.run(program, {"fast": AtOnce(True), "slow": AtOnce(False)})
    assert result.value == 2 and served == ["called", "called"]
    # The first call was served by the reader (this task, which drives the run), the second by a task of its own.
    reader = trio.lowlevel.current_task()
    assert tasks[0] is reader and tasks[1] is not reader


async def test_a_reply_larger_than_the_pipe_buffer_arrives_whole() -> None:
    # The host writes a reply straight to the pipe and hands what did not fit to send_all.
    async def big(args: Any) -> Any:
        return "x" * 300_000 + "end"

    result = await RUNTIME.run("text = await tools.big({})\nreturn [len(text), text[-3:]]", {"big": big})
    assert result.error is None, result.error
    assert result.value == (300_003, "end")


async def test_bindings_are_called_in_the_order_the_program_made_the_calls() -> None:
    # A binding may number or queue a call when it is called (the run_code bridge does): the
    # runtime calls them as the frames arrive, not as the tasks that await them happen to run.
    called: list[int] = []

    class Recording:
        def __call__(self, args: Any) -> Any:
            called.append(args["n"])
            return self.answer(args)

        async def answer(self, args: Any) -> Any:
            await trio.lowlevel.checkpoint()
            return args["n"]

    program = "import asyncio\nreturn await asyncio.gather(*[tools.note({'n': n}) for n in range(20)])"
    for _ in range(3):
        called.clear()
        result = await RUNTIME.run(program, {"note": Recording()})
        assert result.error is None, result.error
        assert result.value == tuple(range(20))
        assert called == list(range(20))


async def test_a_call_served_by_the_reader_never_stops_it_reading_while_its_reply_waits_for_the_pipe() -> None:
    # The reply does not fit the child's stdin pipe, and the program prints more than its
    # stdout pipe holds before it reads replies again: the reader must go on reading.
    class Big:
        def completes_at_once(self) -> bool:
            return True

        async def __call__(self, args: Any) -> Any:
            return "x" * 300_000

    program = (
        "import asyncio\n"
        "task = asyncio.ensure_future(tools.big({}))\n"
        "await asyncio.sleep(0)\n"
        "for i in range(5000):\n"
        "    print('line %06d ' % i + 'y' * 50)\n"
        "return len(await task)\n"
    )
    runtime = SubprocessPythonRuntime(wall_budget_s=5.0, max_output_bytes=1024 * 1024)
    result = await runtime.run(program, {"big": Big()})
    assert result.error is None, result.error
    assert result.value == 300_000 and len(result.logs) == 5000


async def test_replies_larger_than_the_pipe_buffer_arrive_whole_and_in_the_order_they_were_sent() -> None:
    async def big(args: Any) -> Any:
        await trio.sleep(0.01 * (5 - args["n"]))  # the last call answers first
        return str(args["n"]) * 200_000

    program = (
        "import asyncio\n"
        "texts = await asyncio.gather(*[tools.big({'n': n}) for n in range(5)])\n"
        "return [[len(t), t[0], t[-1]] for t in texts]\n"
    )
    runtime = SubprocessPythonRuntime(wall_budget_s=5.0, max_output_bytes=64 * 1024)
    result = await runtime.run(program, {"big": big})
    assert result.error is None, result.error
    assert result.value == tuple((200_000, str(n), str(n)) for n in range(5))


async def test_calls_in_flight_are_capped_by_their_bytes_too(monkeypatch: pytest.MonkeyPatch) -> None:
    # Past the cap the host reads no further frame until a call is answered, so a program
    # flooding it with large arguments is slowed down instead of growing the host's memory.
    from dsh_core.code_mode import _runtime

    monkeypatch.setattr(_runtime, "MAX_CALL_BYTES_IN_FLIGHT", 2500)
    inside = 0
    most_inside = 0

    async def store(args: Any) -> Any:
        nonlocal inside, most_inside
        inside += 1
        most_inside = max(most_inside, inside)
        await trio.sleep(0.05)
        inside -= 1
        return len(args["blob"])

    program = (
        "import asyncio\n"
        "return await asyncio.gather(*[tools.store({'blob': 'x' * 1000}) for _ in range(10)])\n"
    )
    result = await RUNTIME.run(program, {"store": store})
    assert result.error is None, result.error
    assert result.value == (1000,) * 10
    assert most_inside == 2  # each frame is a little over 1000 bytes: two fit under 2500


async def test_a_call_larger_than_the_byte_cap_is_admitted_when_nothing_else_is_in_flight(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dsh_core.code_mode import _runtime

    monkeypatch.setattr(_runtime, "MAX_CALL_BYTES_IN_FLIGHT", 2500)

    async def store(args: Any) -> Any:
        await trio.sleep(0.01)
        return len(args["blob"])

    program = (
        "import asyncio\n"
        "small = asyncio.ensure_future(tools.store({'blob': 'x' * 10}))\n"
        "await asyncio.sleep(0)\n"
        "return [await tools.store({'blob': 'x' * 10_000}), await small]\n"
    )
    result = await RUNTIME.run(program, {"store": store})
    assert result.error is None, result.error
    assert result.value == (10_000, 10)


async def test_replies_the_child_leaves_unread_hold_back_its_further_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    # A child that keeps calling but never reads its replies: they wait in the host, and count
    # against the bytes in flight, so the host stops serving its calls instead of queueing
    # replies without end, and the wall-clock budget ends the run, saying why it stalled.
    from dsh_core.code_mode import _runtime

    monkeypatch.setattr(_runtime, "MAX_CALL_BYTES_IN_FLIGHT", 1_000_000)
    served = 0

    async def big(args: Any) -> Any:
        nonlocal served
        served += 1
        return "x" * 100_000

    program = (
        "import os, stat, time\n"
        "def call(n):\n"
        "    return b'{\"type\":\"call\",\"id\":%d,\"name\":\"big\",\"args\":{}}\\n' % n\n"
        "def sent_to(fd):\n"  # the channel is the only pipe above stderr that takes a write
        "    try:\n"
        "        return stat.S_ISFIFO(os.fstat(fd).st_mode) and os.write(fd, call(1)) > 0\n"
        "    except OSError:\n"
        "        return False\n"
        "fd = next(fd for fd in range(3, 256) if sent_to(fd))\n"
        "for n in range(2, 121):\n"
        "    time.sleep(0.004)\n"
        "    os.write(fd, call(n))\n"
        "time.sleep(5)\n"
    )
    runtime = SubprocessPythonRuntime(wall_budget_s=1.0, max_output_bytes=64 * 1024)
    result = await runtime.run(program, {"big": big})
    assert_error(result, "timeout", "stopped reading the results of its tool calls", "held its further calls back")
    # 1 MB of unread replies (plus what the child's stdin pipe took) stops it, not 120 calls.
    assert 5 <= served <= 15, served


async def test_a_child_blocked_sending_calls_still_reads_its_replies(monkeypatch: pytest.MonkeyPatch) -> None:
    # More calls than the pipe to the host holds, sent at once, and replies that fill the bytes in
    # flight: the host holds the next call back until the child reads, and the child, blocked
    # sending that call, reads its replies meanwhile, so neither waits for the other.
    from dsh_core.code_mode import _runtime

    monkeypatch.setattr(_runtime, "MAX_CALL_BYTES_IN_FLIGHT", 1_000_000)

    async def big(args: Any) -> Any:
        return str(args["n"] % 10) * 10_000

    program = (
        "import asyncio\n"
        "texts = await asyncio.gather(*[tools.big({'n': n, 'pad': 'p' * 50}) for n in range(2000)])\n"
        "return [sum(map(len, texts)), ''.join(t[0] for t in texts[:12])]\n"
    )
    result = await RUNTIME.run(program, {"big": big})
    assert result.error is None, result.error
    assert result.value == (20_000_000, "012345678901")


async def test_the_child_reads_its_replies_while_a_thread_of_its_own_holds_the_channel(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A thread prints more than the pipe holds while the host holds a call back: the thread's
    # line waits for the pipe, holding the channel, and the loop, waiting to send its next call,
    # must still read the replies that make the host go on.
    from dsh_core.code_mode import _runtime

    monkeypatch.setattr(_runtime, "MAX_CALL_BYTES_IN_FLIGHT", 1_000_000)

    async def big(args: Any) -> Any:
        return "x" * 10_000

    program = (
        "import asyncio\n"
        "def chatter():\n"
        "    for i in range(3000):\n"
        "        print('line', i, 'y' * 100)\n"
        "printing = asyncio.ensure_future(asyncio.to_thread(chatter))\n"
        "texts = await asyncio.gather(*[tools.big({'n': n, 'pad': 'p' * 50}) for n in range(2000)])\n"
        "await printing\n"
        "return sum(map(len, texts))\n"
    )
    runtime = SubprocessPythonRuntime(wall_budget_s=5.0, max_output_bytes=1_000_000)
    result = await runtime.run(program, {"big": big})
    assert result.error is None, result.error
    assert result.value == 20_000_000
    assert len(result.logs) == 3000 and result.logs[-1] == "line 2999 " + "y" * 100


def test_a_code_run_error_kind_must_be_one_of_the_documented_kinds() -> None:
    with pytest.raises(ValueError) as raised:
        CodeRunError(kind="crash", message="m")  # type: ignore[arg-type]
    assert str(raised.value) == (
        "CodeRunError.kind must be one of 'abort', 'exception', 'invalid-output', 'output-limit', 'protocol', "
        "'timeout', 'worker-exit', got 'crash'"
    )


# --- resource limits ----------------------------------------------------------------------


LIMITED = SubprocessPythonRuntime(
    wall_budget_s=10.0, max_memory_bytes=512 * 1024 * 1024, max_file_bytes=1000, allow_subprocesses=False
)


async def test_a_memory_limit_turns_a_huge_allocation_into_a_memory_error() -> None:
    result = await LIMITED.run("x = bytearray(4_000_000_000)\nreturn 1", {})
    assert_error(result, "exception", "MemoryError")


@pytest.mark.parametrize(
    ("program", "event"),
    [
        ("import subprocess\nsubprocess.run(['true'])", "subprocess.Popen"),
        ("import os\nos.system('true')", "os.system"),
        ("import os\nos.fork()", "os.fork"),
        ("import os\nos.execv('/bin/true', ['true'])", "os.exec"),
        ("import ctypes\nctypes.CDLL(None)", "ctypes.dlopen"),
    ],
)
async def test_starting_another_program_is_refused_when_subprocesses_are_not_allowed(program: str, event: str) -> None:
    result = await LIMITED.run(program + "\nreturn 1", {})
    assert_error(result, "exception", "PermissionError", f"may not start other programs ({event})")


async def test_a_file_size_limit_fails_the_write(tmp_path: Any) -> None:
    target = tmp_path / "big.txt"
    program = f"with open({str(target)!r}, 'w') as f:\n    f.write('x' * 5000)\nreturn 1"
    result = await LIMITED.run(program, {})
    assert_error(result, "exception", "File too large")


async def test_limits_leave_ordinary_programs_alone() -> None:
    result = await LIMITED.run("print('hi')\nreturn sum(range(10))", {})
    assert result.error is None and result.value == 45 and result.logs == ("hi",)


async def test_limits_are_lowered_soft_and_hard() -> None:
    program = (
        "import resource\n"
        "soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)\n"
        "return [soft, hard]"
    )
    result = await LIMITED.run(program, {})
    assert result.error is None and result.value == (1000, 1000)  # hard == soft: lowered for good


@pytest.mark.slow
async def test_a_cpu_limit_kills_a_spinning_program_and_says_why() -> None:
    runtime = SubprocessPythonRuntime(wall_budget_s=20.0, max_cpu_s=1)
    result = await runtime.run("while True:\n    pass", {})
    assert_error(result, "worker-exit", "used up its CPU budget, max_cpu_s=1")


@pytest.mark.slow
async def test_a_thread_printing_into_a_full_pipe_does_not_stop_the_program_reading_its_replies() -> None:
    """The loop thread waited on stdout's lock without reading replies; the host held the pipe: a hang (s20 audit)."""

    async def big(args: Any) -> str:
        return "z" * (2 * 1024 * 1024)

    async def small(args: Any) -> int:
        return 1

    program = (
        "import asyncio, threading, time\n"
        "futures = [asyncio.ensure_future(tools.big({})) for _ in range(40)]\n"
        "await asyncio.sleep(0)\n"
        "time.sleep(2)  # ~80 MB of replies wait on the host, which then holds further calls back\n"
        "last = asyncio.ensure_future(tools.small({}))\n"
        "await asyncio.sleep(0)\n"
        "def spam():\n"
        "    for _ in range(100000):\n"
        "        print('t' * 1000)\n"
        "threading.Thread(target=spam, daemon=True).start()\n"
        "time.sleep(0.5)  # the thread holds stdout's lock, its frame waiting for the pipe\n"
        "print('from the loop thread')\n"
        "await last\n"
        "return [len(await f) for f in futures][:3]"
    )
    result = await SubprocessPythonRuntime(wall_budget_s=20.0).run(program, {"big": big, "small": small})
    assert result.error is None, result.error
    assert result.value == (2 * 1024 * 1024,) * 3


async def test_a_raising_signal_handler_never_leaves_stdout_held_for_other_threads() -> None:
    """The writer's Python-level lock left a gap a raising SIGALRM handler hit: other threads' prints hung (s20 review)."""
    program = (
        "import signal, asyncio, sys\n"
        "def on_alarm(signum, frame):\n"
        "    raise TimeoutError('step took too long')\n"
        "signal.signal(signal.SIGALRM, on_alarm)\n"
        "n = 0\n"
        "for attempt in range(4):\n"
        "    signal.setitimer(signal.ITIMER_REAL, 0.02)\n"
        "    try:\n"
        "        while True:\n"
        "            sys.stdout.write('.'); n += 1\n"
        "    except TimeoutError:\n"
        "        pass\n"
        "def work(i):\n"
        "    print('worker', i, 'done')\n"
        "    return i\n"
        "return sum(await asyncio.gather(*(asyncio.to_thread(work, i) for i in range(3))))\n"
    )
    for _ in range(2):
        result = await SubprocessPythonRuntime(wall_budget_s=10.0, max_output_bytes=50_000_000).run(program, {})
        assert result.error is None and result.value == 3, result.error


@pytest.mark.slow
async def test_a_cpu_limit_reached_inside_one_long_c_call_still_names_the_budget() -> None:
    """The budget's warning reaches Python code only between bytecodes: SIGKILL came, unexplained (s20 review)."""
    runtime = SubprocessPythonRuntime(wall_budget_s=20.0, max_cpu_s=1)
    result = await runtime.run("return sum(range(10**13))", {})
    assert_error(result, "worker-exit", "killed by signal 9", "most likely its CPU budget, max_cpu_s=1")


@pytest.mark.parametrize("field", ["max_memory_bytes", "max_cpu_s", "max_file_bytes"])
@pytest.mark.parametrize("value", [0, -1, 1.5, True])
def test_limits_must_be_positive_ints(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=f"{field} must be a positive int or None"):
        SubprocessPythonRuntime(**{field: value})


@pytest.mark.parametrize("field", ["max_memory_bytes", "max_cpu_s", "max_file_bytes"])
def test_limits_beyond_what_setrlimit_takes_are_refused(field: str) -> None:
    message = f"^{field}: expected at most 9223372036854775806 .*, got 9223372036854775807$"
    with pytest.raises(ValueError, match=message):
        SubprocessPythonRuntime(**{field: 2**63 - 1})
    assert getattr(SubprocessPythonRuntime(**{field: 2**63 - 2}), field) == 2**63 - 2


async def test_the_largest_accepted_limits_apply_in_the_child() -> None:
    largest = 2**63 - 2
    runtime = SubprocessPythonRuntime(
        wall_budget_s=20.0, max_memory_bytes=largest, max_cpu_s=largest, max_file_bytes=largest
    )
    result = await runtime.run("print('ran')", {})
    assert result.error is None and result.logs == ("ran",)


SEALED = SubprocessPythonRuntime(wall_budget_s=10.0, allow_network=False, allow_file_writes=False)


@pytest.mark.parametrize(
    ("program", "fragment"),
    [
        ("import socket\nsocket.getaddrinfo('example.com', 80)", "use the network, only its tools may (socket.getaddrinfo)"),
        (
            "import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect('/tmp/dsh-no-such-socket')",
            "use the network, only its tools may (socket.connect)",
        ),
        ("open('/tmp/dsh-sealed.txt', 'w')", "change files, only its tools may (open '/tmp/dsh-sealed.txt')"),
        ("import os\nos.open('/tmp/dsh-sealed.txt', os.O_WRONLY | os.O_CREAT)", "change files, only its tools may"),
        ("import os\nos.remove('/tmp/dsh-no-such-file')", "change files, only its tools may (os.remove)"),
        ("import os\nos.mkdir('/tmp/dsh-sealed-dir')", "change files, only its tools may (os.mkdir)"),
        (
            "import os\nos.setxattr('/tmp/dsh-no-such-file', 'user.x', b'1')",
            "change files, only its tools may (os.setxattr)",
        ),
        (
            "import os\nos.removexattr('/tmp/dsh-no-such-file', 'user.x')",
            "change files, only its tools may (os.removexattr)",
        ),
        # Not even listening: an unbound socket's listen() binds an ephemeral port on every interface.
        ("import socket\nsocket.socket().listen()", "use the network, only its tools may (socket.__new__)"),
        (
            "import socket\nsocket.socket(socket.AF_INET6, socket.SOCK_DGRAM)",
            "use the network, only its tools may (socket.__new__)",
        ),
    ],
)
async def test_a_sealed_program_reaches_the_world_only_through_its_tools(program: str, fragment: str) -> None:
    result = await SEALED.run(program + "\nreturn 1", {})
    assert_error(result, "exception", "PermissionError", fragment)


@pytest.mark.parametrize(
    ("call", "event"),
    [("os.mknod(path)", "os.mknod"), ("os.mkfifo(path)", "os.mkfifo"), ("posix.mkfifo(path)", "os.mkfifo")],
)
async def test_a_sealed_program_cannot_make_special_files(tmp_path: Any, call: str, event: str) -> None:
    # Python raises no audit event for these two: the child stands in for them.
    target = tmp_path / "made"
    result = await SEALED.run(f"import os, posix\npath = {str(target)!r}\n{call}\nreturn 1", {})
    assert_error(result, "exception", "PermissionError", f"change files, only its tools may ({event})")
    assert not target.exists()


READ_ONLY = SubprocessPythonRuntime(wall_budget_s=10.0, allow_file_writes=False)  # the network stays open


async def test_a_program_refused_file_writes_cannot_bind_a_socket_to_a_path(tmp_path: Any) -> None:
    target = tmp_path / "sock"
    program = f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.bind({str(target)!r})\nreturn 1"
    result = await READ_ONLY.run(program, {})
    assert_error(result, "exception", "PermissionError", "change files, only its tools may (bind ")
    assert not target.exists()


async def test_a_program_refused_file_writes_binds_an_abstract_socket_name() -> None:
    program = "import socket\ns = socket.socket(socket.AF_UNIX)\ns.bind('\\0dsh-test-abstract')\nreturn 1"
    result = await READ_ONLY.run(program, {})
    assert result.error is None and result.value == 1


async def test_a_sealed_program_keeps_local_socket_pairs() -> None:
    program = "import socket\na, b = socket.socketpair()\na.sendall(b'hi')\nreturn b.recv(2).decode()"
    result = await SEALED.run(program, {})
    assert result.error is None and result.value == "hi"


async def test_a_program_allowed_to_write_makes_special_files(tmp_path: Any) -> None:
    target = tmp_path / "fifo"
    result = await LIMITED.run(f"import os\nos.mkfifo({str(target)!r})\nreturn 1", {})
    assert result.error is None and result.value == 1
    assert target.exists()


async def test_a_sealed_program_still_reads_imports_and_calls_its_tools() -> None:
    program = (
        "import json, asyncio\n"
        "text = open(__import__('os').devnull).read()\n"
        "values = await asyncio.gather(tools.echo({'n': 1}), tools.echo({'n': 2}))\n"
        "return [json.dumps(v) for v in values] + [text]"
    )
    result = await SEALED.run(program, {"echo": echo})
    assert result.error is None, result.error
    assert result.value == ('{"n": 1}', '{"n": 2}', "")


@pytest.mark.parametrize("value", [1, 16 * 1024 * 1024 - 1])
def test_a_memory_limit_below_the_config_loaders_floor_is_refused(value: int) -> None:
    message = f"^max_memory_bytes: expected at least 16777216 \\(16 MiB; the value is in bytes\\), got {value}$"
    with pytest.raises(ValueError, match=message):
        SubprocessPythonRuntime(max_memory_bytes=value)
    assert SubprocessPythonRuntime(max_memory_bytes=16 * 1024 * 1024).max_memory_bytes == 16 * 1024 * 1024
    assert CodeRuntimeSettings(max_memory_bytes=16 * 1024 * 1024).max_memory_bytes == 16 * 1024 * 1024
    with pytest.raises(ValueError, match="expected at least 16777216"):
        CodeRuntimeSettings(max_memory_bytes=value)


# ---------------------------------------------------------------------------
# Ints past the host's digit limit


LIFT_LIMIT = "import sys\nsys.set_int_max_str_digits(0)\nbig = 10 ** (sys.get_int_max_str_digits() or 4300) * 10 ** 4400\n"


async def test_a_returned_int_the_host_cannot_parse_is_invalid_output_not_a_protocol_failure() -> None:
    """A program that lifts its own int-to-str limit wrote the int; the host could not read it back."""
    result = await RUNTIME.run(LIFT_LIMIT + "return {'n': big}", {})
    assert_error(result, "invalid-output", '$["n"]: an int of', "bits has more digits than JSON text can carry")


async def test_a_sub_call_with_such_an_int_fails_in_the_program_which_may_catch_it() -> None:
    calls: list[Any] = []

    async def record(args: Any) -> Any:
        calls.append(args)
        return "unreachable"

    program = LIFT_LIMIT + (
        "try:\n    await tools.record({'n': big})\nexcept ToolCallError as exc:\n    return str(exc)\nreturn 'sent'"
    )
    result = await RUNTIME.run(program, {"record": record})
    assert result.error is None, result.error
    assert isinstance(result.value, str) and "bits has more digits than JSON text can carry" in result.value
    assert calls == []


async def test_an_int_at_the_hosts_digit_limit_still_comes_back() -> None:
    digits = sys.get_int_max_str_digits()
    result = await RUNTIME.run(f"import sys\nsys.set_int_max_str_digits(0)\nreturn 10 ** {digits} - 1", {})
    assert result.error is None, result.error
    assert result.value == 10**digits - 1


# ---------------------------------------------------------------------------
# Flushed, unfinished lines


async def test_a_flushed_unfinished_line_survives_a_timeout() -> None:
    """The program's last words were lost with the child when it never ended the line."""
    runtime = SubprocessPythonRuntime(wall_budget_s=1.0)
    program = "print('done: 1')\nprint('working on 2...', end='', flush=True)\nwhile True:\n    pass"
    result = await runtime.run(program, {})
    assert_error(result, "timeout")
    assert result.logs == ("done: 1", "working on 2...")


async def test_flushed_parts_of_a_line_come_back_as_one_entry() -> None:
    program = (
        "import sys\n"
        "print('a', end='', flush=True)\n"
        "sys.stdout.flush()\n"  # nothing new: no empty part
        "print('b', end='')\n"
        "sys.stdout.flush()\n"
        "print('c')\n"
        "print('tail', end='', flush=True)\n"
        "return 1"
    )
    result = await RUNTIME.run(program, {})
    assert result.error is None, result.error
    assert result.logs == ("abc", "tail")


async def test_flushed_parts_count_against_the_output_limit() -> None:
    runtime = SubprocessPythonRuntime(wall_budget_s=5.0, max_output_bytes=100)
    result = await runtime.run("for _ in range(200):\n    print('x', end='', flush=True)", {})
    assert_error(result, "output-limit")
    assert result.logs == ("x" * 99,)  # one byte kept for the line's newline


@pytest.mark.parametrize(
    "frame",
    [b'{"type": "log", "text": "x", "partial": false}', b'{"type": "log", "text": "x", "partial": 1}'],
)
def test_a_log_frames_partial_flag_is_true_when_present(frame: bytes) -> None:
    with pytest.raises(_FrameError, match="partial is true when present"):
        _parse_frame(frame)
    assert _parse_frame(b'{"type": "log", "text": "x", "partial": true}') == _Log("x", True)


@pytest.mark.parametrize("count", [1, 2, 19_999, 20_000, 20_001, 45_001])
def test_the_size_of_a_wide_array_of_scalars_is_its_compact_utf8_size(count: int) -> None:
    """Measured a slice at a time (one encode per item took 1.5 s for a million numbers): the sum must be exact."""
    from dsh_core._jsoncodec import encode_json
    from dsh_core.code_mode._runtime import _compact_size

    pool = [0, -7, 1.5, "é", "\ud800", "x,y", True, None, 10**20, ""]
    value = snapshot_json([pool[index % len(pool)] for index in range(count)])
    nested = snapshot_json({"rows": [value, value], "n": 1})
    for checked in (value, nested):
        expected = len(encode_json(thaw(checked), ascii_only=False).encode("utf-8", "surrogatepass"))
        assert _compact_size(checked) == expected


async def test_a_million_numbers_come_back_whole() -> None:
    runtime = SubprocessPythonRuntime(wall_budget_s=60)
    result = await runtime.run("return list(range(999_990))", {})
    assert result.error is None and result.value == tuple(range(999_990))


def _running_with(marker: str) -> list[int]:
    """The live processes whose command line holds ``marker``."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as cmdline:
                command = cmdline.read()
            with open(f"/proc/{name}/stat", "rb") as stat:
                zombie = stat.read().rpartition(b")")[2].split()[0] == b"Z"
        except OSError:
            continue
        if marker.encode() in command and not zombie:
            found.append(int(name))
    return found


_NEW_SESSION_PROGRAMS = {
    "popen-then-return": (
        "import subprocess\n"
        "subprocess.Popen(['sleep', '{marker}'], start_new_session=True, stdout=subprocess.DEVNULL)\n"
        "return 'ok'"
    ),
    "popen-then-timeout": (
        "import subprocess, time\n"
        "subprocess.Popen(['sleep', '{marker}'], start_new_session=True, stdout=subprocess.DEVNULL)\n"
        "time.sleep(100)"
    ),
    "popen-then-os-exit": (
        "import os, subprocess\n"
        "subprocess.Popen(['sleep', '{marker}'], start_new_session=True, stdout=subprocess.DEVNULL)\n"
        "os._exit(0)"
    ),
    "fork-setsid-then-timeout": (
        "import os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    os.execvp('sleep', ['sleep', '{marker}'])\n"
        "time.sleep(100)"
    ),
}


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="descendants are found through Linux's /proc")
@pytest.mark.parametrize("program", sorted(_NEW_SESSION_PROGRAMS))
async def test_a_process_started_in_a_session_of_its_own_does_not_outlive_the_run(program: str) -> None:
    """The process group kill missed it: a daemon a program started lived on after the run (s18 Code Mode audit)."""
    import random

    marker = f"{random.randrange(10**6, 10**7)}.25"  # a unique sleep length to find it by
    runtime = SubprocessPythonRuntime(wall_budget_s=1.5)
    try:
        result = await runtime.run(_NEW_SESSION_PROGRAMS[program].format(marker=marker), {})
        assert (result.error is None) == (program == "popen-then-return"), result
        with trio.move_on_after(5):  # real time: a killed process is gone within milliseconds
            while _running_with(f"sleep\0{marker}"):
                await trio.sleep(0.05)
        assert _running_with(f"sleep\0{marker}") == []
    finally:
        for pid in _running_with(f"sleep\0{marker}"):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="descendants are found through Linux's /proc")
async def test_a_process_started_in_a_session_of_its_own_does_not_outlive_a_cpu_limit_kill() -> None:
    """The child died of SIGXCPU without looking its descendants up (s20 Code Mode audit)."""
    import random

    marker = f"{random.randrange(10**6, 10**7)}.75"
    program = (
        "import subprocess\n"
        f"subprocess.Popen(['sleep', '{marker}'], start_new_session=True, stdout=subprocess.DEVNULL)\n"
        "while True:\n"
        "    pass"
    )
    try:
        result = await SubprocessPythonRuntime(wall_budget_s=10.0, max_cpu_s=1).run(program, {})
        assert_error(result, "worker-exit", "killed by signal", "used up its CPU budget, max_cpu_s=1")
        with trio.move_on_after(5):
            while _running_with(f"sleep\0{marker}"):
                await trio.sleep(0.05)
        assert _running_with(f"sleep\0{marker}") == []
    finally:
        for pid in _running_with(f"sleep\0{marker}"):
            os.kill(pid, signal.SIGKILL)
