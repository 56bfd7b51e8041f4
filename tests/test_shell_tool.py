"""The bash tool (dsh_plugins.shell): real subprocesses on the real clock, with short budgets.

trio's MockClock would jump over real pipe waits and kill grace periods, so
nothing here uses it. "Alive" means a process that exists and is not a zombie:
this machine's init may never reap orphans, so a killed grandchild can linger
as a zombie forever.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from dsh_core import (
    CancelSignal,
    ConfigError,
    Exclusive,
    ToolExecutionFailure,
    ToolExecutionResult,
    ToolExecutionSuccess,
    ToolRuntime,
)
from dsh_core.presentation import TerminalCallView, TerminalResultView
from dsh_core.testing import make_input, make_runtime
from dsh_plugins import shell, timeout
from dsh_plugins.files import Workspace
from dsh_plugins.shell import ShellSettings, bash_tool

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc"), reason="process checks read /proc")


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as stream:
            data = stream.read()
    except FileNotFoundError:
        return False
    return data[data.rfind(b")") + 2 :].split()[0] not in (b"Z", b"X")


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes whose process group is ``pgid``."""
    members = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stream:
                data = stream.read()
        except OSError:
            continue
        fields = data[data.rfind(b")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            members.append(int(name))
    return members


def runtime(root: Path, **settings: Any) -> ToolRuntime:
    options = {"kill_grace_ms": 200, **settings}
    return make_runtime(bash_tool(Workspace(root), ShellSettings(**options)))


async def bash(root: Path, arguments: dict[str, Any], **settings: Any) -> ToolExecutionResult:
    return await runtime(root, **settings).execute(make_input("bash", arguments))


def ok(result: ToolExecutionResult) -> Any:
    assert isinstance(result, ToolExecutionSuccess), result
    return result.value


async def wait_for_file(path: Path, lines: int = 1) -> list[int]:
    with trio.fail_after(5):
        while not path.exists() or len(path.read_text().split()) < lines:
            await trio.sleep(0.01)
    return [int(word) for word in path.read_text().split()]


# --- outcomes ------------------------------------------------------------------------------


async def test_exit_code_and_merged_output(tmp_path: Path) -> None:
    result = await bash(tmp_path, {"command": "echo out; echo err >&2; exit 3"})
    value = ok(result)
    assert value["exit_code"] == 3 and value["signal"] is None
    assert value["output"] == "out\nerr\n" and value["truncated"] is False and value["timed_out"] is False
    assert result.content[0].text == "out\nerr\n[exit code 3]"  # type: ignore[union-attr]


async def test_a_command_killed_by_a_signal_reports_the_signal(tmp_path: Path) -> None:
    value = ok(await bash(tmp_path, {"command": "kill -KILL $$"}))
    assert value["exit_code"] is None and value["signal"] == "SIGKILL"


async def test_output_over_the_cap_keeps_head_and_tail(tmp_path: Path) -> None:
    command = "printf 'HEAD'; head -c 5000 /dev/zero | tr '\\0' x; printf 'TAIL'"
    value = ok(await bash(tmp_path, {"command": command}, max_output_bytes=100))
    assert value["truncated"] is True
    head, marker, tail = value["output"].split("\n")
    assert head == "HEAD" + "x" * 46 and tail == "x" * 46 + "TAIL"
    assert marker == "[... 4908 bytes of output omitted ...]"


async def test_output_cap_cuts_on_character_boundaries(tmp_path: Path) -> None:
    value = ok(await bash(tmp_path, {"command": "for i in $(seq 100); do printf 'é'; done"}, max_output_bytes=11))
    head, marker, tail = value["output"].split("\n")
    # 6 head bytes are 3 whole characters; of 5 tail bytes the split first one is dropped.
    assert head == "é" * 3 and tail == "é" * 2
    assert marker == "[... 190 bytes of output omitted ...]"


async def test_the_omitted_count_is_in_output_bytes_even_when_they_are_not_utf8(tmp_path: Path) -> None:
    command = "printf '\\377%.0s' $(seq 8); printf 'x%.0s' $(seq 20)"  # 8 invalid bytes, then 20 x: 28 bytes
    value = ok(await bash(tmp_path, {"command": command}, max_output_bytes=10))
    head, marker, tail = value["output"].split("\n")
    assert head == "\ufffd" * 5 and tail == "x" * 5
    assert marker == "[... 18 bytes of output omitted ...]"


async def test_cwd_is_resolved_inside_the_workspace(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    assert ok(await bash(tmp_path, {"command": "pwd", "cwd": "sub"}))["output"] == f"{tmp_path / 'sub'}\n"
    assert ok(await bash(tmp_path, {"command": "pwd"}))["output"] == f"{tmp_path}\n"


@pytest.mark.parametrize(
    ("cwd", "code"), [("..", "OUTSIDE_WORKSPACE"), ("/", "OUTSIDE_WORKSPACE"), ("nope", "SHELL_ERROR")]
)
async def test_bad_cwd_is_refused(tmp_path: Path, cwd: str, code: str) -> None:
    (tmp_path / "ws").mkdir()
    result = await bash(tmp_path / "ws", {"command": "pwd", "cwd": cwd})
    assert isinstance(result, ToolExecutionFailure) and result.code == code


async def test_a_shell_that_cannot_start_is_a_shell_error(tmp_path: Path) -> None:
    broken = tmp_path / "broken-shell"
    broken.write_text("#!/definitely/not/here\n")
    broken.chmod(0o755)
    result = await bash(tmp_path, {"command": "true"}, shell=str(broken))
    assert isinstance(result, ToolExecutionFailure) and result.code == "SHELL_ERROR"
    assert result.error.message.startswith(f"cannot start {broken}: [Errno 2]")


async def test_a_nul_in_the_command_is_refused_before_anything_runs(tmp_path: Path) -> None:
    result = await bash(tmp_path, {"command": "touch made\x00; echo hi"})
    assert isinstance(result, ToolExecutionFailure) and result.code == "SHELL_ERROR"
    assert "NUL" in result.error.message and "position 10" in result.error.message
    assert not (tmp_path / "made").exists()


async def test_a_lone_surrogate_in_the_command_is_refused_before_anything_runs(tmp_path: Path) -> None:
    """Valid JSON no argv can carry: it failed as a bare UnicodeEncodeError (TOOL_ERROR)."""
    result = await bash(tmp_path, {"command": "touch made; echo \ud800"})
    assert isinstance(result, ToolExecutionFailure) and result.code == "SHELL_ERROR"
    assert result.error.message == (
        "command holds a lone surrogate (at position 17), which is not text; bash cannot be given one"
    )
    assert not (tmp_path / "made").exists()


@pytest.mark.skipif(sys.platform != "linux", reason="Linux caps one argument at 128 KiB; other systems only the total")
async def test_a_command_too_long_for_one_argument_says_what_to_do(tmp_path: Path) -> None:
    result = await bash(tmp_path, {"command": "echo " + "x" * 200_000})
    assert isinstance(result, ToolExecutionFailure) and result.code == "SHELL_ERROR"
    assert result.error.message == (
        "the command is 200005 bytes, more than the system passes to a program as one argument; "
        "write it to a script file and run that"
    )


async def test_a_long_cwd_is_quoted_by_its_ends(tmp_path: Path) -> None:
    result = await bash(tmp_path, {"command": "true", "cwd": "c" * 1_000_000})
    assert isinstance(result, ToolExecutionFailure) and result.code == "SHELL_ERROR"
    assert result.error.message == f"cwd {'c' * 150 + '…' + 'c' * 150!r} is not a directory"


async def test_stdin_is_empty(tmp_path: Path) -> None:
    assert ok(await bash(tmp_path, {"command": "cat; echo done"}))["output"] == "done\n"


# --- deadlines -----------------------------------------------------------------------------


async def test_the_tools_own_deadline_stops_the_command_and_succeeds(tmp_path: Path) -> None:
    start = trio.current_time()
    result = await bash(tmp_path, {"command": "echo started; sleep 30", "timeout_ms": 300})
    value = ok(result)
    assert trio.current_time() - start < 5
    assert value["timed_out"] is True and value["signal"] == "SIGTERM" and value["exit_code"] is None
    assert value["output"] == "started\n" and value["timeout_ms"] == 300
    assert "timed out after 300 ms" in result.content[0].text  # type: ignore[union-attr]


TERM_CLEANUP = "touch lock; trap 'echo cleaning up; rm -f lock; exit 1' TERM; sleep 30 & wait"


async def test_at_the_deadline_a_term_handler_runs_to_completion_and_its_output_is_kept(tmp_path: Path) -> None:
    # The output pipe stays read through the SIGTERM grace: a handler that prints is not killed by SIGPIPE.
    value = ok(await bash(tmp_path, {"command": TERM_CLEANUP, "timeout_ms": 300}, kill_grace_ms=2_000))
    assert value["timed_out"] is True
    assert value["exit_code"] == 1 and value["signal"] is None
    assert value["output"] == "cleaning up\n"
    assert not (tmp_path / "lock").exists()


async def test_the_deadline_argument_is_capped_by_the_configured_maximum(tmp_path: Path) -> None:
    value = ok(await bash(tmp_path, {"command": "sleep 30", "timeout_ms": 600_000}, timeout_ms=300))
    assert value["timed_out"] is True and value["timeout_ms"] == 300


async def test_a_deadline_argument_beyond_any_float_is_capped_too(tmp_path: Path) -> None:
    value = ok(await bash(tmp_path, {"command": "true", "timeout_ms": 10**400}, timeout_ms=5_000))
    assert value["timed_out"] is False and value["timeout_ms"] == 5_000


async def test_a_fast_command_is_not_timed_out(tmp_path: Path) -> None:
    value = ok(await bash(tmp_path, {"command": "true", "timeout_ms": 5_000}))
    assert value["timed_out"] is False and value["exit_code"] == 0


async def test_with_the_timeout_plugin_the_tools_own_deadline_still_reports_timed_out(tmp_path: Path) -> None:
    """The declared budget leaves room for the kill grace: a TERM trap ran into it and the output was lost."""
    pids = tmp_path / "pids"
    rt = runtime(tmp_path, timeout_ms=400, kill_grace_ms=1_000)
    timeout.dsh_setup(rt, {})
    command = f"trap 'echo cleaning; sleep 0.5; echo cleaned; exit 1' TERM; echo $$ > {pids}; echo start; sleep 30 & wait"
    value = ok(await rt.execute(make_input("bash", {"command": command})))
    assert value["timed_out"] is True and value["output"] == "start\ncleaning\ncleaned\n"
    (pgid,) = await wait_for_file(pids)
    assert group_members(pgid) == []


# --- no survivors ----------------------------------------------------------------------------


async def test_cancellation_kills_the_whole_process_group(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    signal = CancelSignal()
    rt = runtime(tmp_path)
    command = f"sleep 30 & echo $$ $! > {pids}; sleep 30"
    outcome: list[ToolExecutionResult] = []

    async def call() -> None:
        outcome.append(await rt.execute(make_input("bash", {"command": command}, signal=signal)))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(call)
        pgid, background = await wait_for_file(pids, lines=2)
        assert group_members(pgid) != [] and pid_alive(background)
        signal.cancel("user pressed stop")
    (result,) = outcome
    assert isinstance(result, ToolExecutionFailure) and result.code == "ABORTED"
    assert group_members(pgid) == [] and not pid_alive(background)


async def test_on_cancellation_a_term_handler_that_prints_still_finishes_its_cleanup(tmp_path: Path) -> None:
    signal = CancelSignal()
    rt = runtime(tmp_path, kill_grace_ms=2_000)
    outcome: list[ToolExecutionResult] = []

    async def call() -> None:
        outcome.append(await rt.execute(make_input("bash", {"command": TERM_CLEANUP}, signal=signal)))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(call)
        with trio.fail_after(5):
            while not (tmp_path / "lock").exists():
                await trio.sleep(0.01)
        await trio.sleep(0.1)  # let bash reach its trap and `wait`
        signal.cancel("user pressed stop")
    (result,) = outcome
    assert isinstance(result, ToolExecutionFailure) and result.code == "ABORTED"
    assert not (tmp_path / "lock").exists()


async def test_children_that_ignore_sigterm_are_killed_after_the_grace(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    command = f"trap '' TERM; sleep 30 & echo $$ $! > {pids}; sleep 30"
    start = trio.current_time()
    value = ok(await bash(tmp_path, {"command": command, "timeout_ms": 300}, kill_grace_ms=300))
    assert value["timed_out"] is True and value["signal"] == "SIGKILL"
    assert trio.current_time() - start < 5
    pgid, background = await wait_for_file(pids, lines=2)
    assert group_members(pgid) == [] and not pid_alive(background)


async def test_background_jobs_do_not_outlive_a_normal_exit(tmp_path: Path) -> None:
    start = trio.current_time()
    value = ok(await bash(tmp_path, {"command": "sleep 30 & echo $!"}))
    assert trio.current_time() - start < 5
    assert value["exit_code"] == 0 and not pid_alive(int(value["output"]))


async def test_a_stopped_job_is_continued_so_its_term_trap_runs(tmp_path: Path) -> None:
    """A stopped process keeps SIGTERM pending: the trap never ran and the call waited the grace for SIGKILL."""
    log = tmp_path / "log"
    command = (
        f"bash -c 'trap \"echo cleaned >> {log}; exit 0\" TERM; while :; do sleep 0.05; done' & "
        "sleep 0.2; kill -STOP $!; exit 0"
    )
    start = trio.current_time()
    value = ok(await bash(tmp_path, {"command": command}, kill_grace_ms=3_000))
    assert value["exit_code"] == 0
    assert trio.current_time() - start < 2.5  # not the whole 3 s grace
    assert log.read_text() == "cleaned\n"


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="the session is listed through /proc")
async def test_jobs_in_groups_of_their_own_do_not_outlive_the_call(tmp_path: Path) -> None:
    """Job control (set -m) gives each background job its own process group inside the session."""
    value = ok(await bash(tmp_path, {"command": "set -m; sleep 30 >/dev/null 2>&1 & echo $!"}))
    job = int(value["output"])
    assert value["exit_code"] == 0
    for _ in range(100):  # the kill is sent before the call returns; reaping may lag a moment
        if not pid_alive(job):
            break
        await trio.sleep(0.02)
    assert not pid_alive(job)


async def test_a_process_whose_main_thread_exited_is_still_stopped(tmp_path: Path) -> None:
    """/proc shows such a process as a zombie while its threads run: it was taken for gone and wrote on."""
    script = tmp_path / "zthread.py"
    script.write_text(
        "import ctypes, sys, threading, time\n"
        "def work():\n"
        "    while True:\n"
        "        with open(sys.argv[1], 'a') as out:\n"
        "            out.write('x\\n')\n"
        "        time.sleep(0.05)\n"
        "threading.Thread(target=work).start()\n"
        "time.sleep(0.1)\n"
        "ctypes.CDLL(None).pthread_exit(None)\n"
    )
    log = tmp_path / "log"
    ok(await bash(tmp_path, {"command": f"{sys.executable} {script} {log} & sleep 0.4; echo done"}))
    written = log.read_text().count("x")
    await trio.sleep(0.3)  # real time: the process would keep writing every 50 ms
    assert log.read_text().count("x") == written


@pytest.mark.parametrize("budget_ms", [1, 2, 5])
async def test_a_deadline_shorter_than_the_shells_start_is_a_timed_out_result(tmp_path: Path, budget_ms: int) -> None:
    for _ in range(5):
        value = ok(await bash(tmp_path, {"command": "sleep 2", "timeout_ms": budget_ms}))
        assert value["timed_out"] is True and value["timeout_ms"] == budget_ms


# --- presentation, scheduling, configuration ------------------------------------------------


async def test_presenters_give_terminal_cards(tmp_path: Path) -> None:
    tool = bash_tool(Workspace(tmp_path))
    arguments = {"command": "echo hi; exit 2", "description": "Say hi", "cwd": "."}
    assert tool.present_call is not None and tool.present_result is not None
    assert tool.present_call(arguments) == TerminalCallView(title="echo hi; exit 2", description="Say hi", cwd=".")
    result = await make_runtime(tool).execute(make_input("bash", arguments))
    assert tool.present_result(arguments, result) == TerminalResultView(output="hi\n", exit_code=2)
    killed = await make_runtime(tool).execute(make_input("bash", {"command": "kill -TERM $$"}))
    assert tool.present_result({"command": "kill -TERM $$"}, killed) == TerminalResultView(output="", signal="SIGTERM")


def test_bash_is_exclusive_and_declares_its_budget(tmp_path: Path) -> None:
    rt = make_runtime()
    shell.dsh_setup(rt, {"root": str(tmp_path), "timeout_ms": 5_000})
    unconfigured = ToolRuntime()
    shell.dsh_setup(unconfigured, {})
    assert unconfigured.names() == []  # opt-in: no root, no shell
    definition = rt.get("bash")
    # Its own 5 s, then the kill grace (2 s) and the drain: the timeout plugin is the backstop.
    assert definition is not None and definition.timeout_ms == 5_000 + 2_000 + 1_000
    assert rt.execution_mode(make_input("bash", {"command": "ls"})) == Exclusive()


def test_the_default_budget_is_two_minutes(tmp_path: Path) -> None:
    assert bash_tool(Workspace(tmp_path)).timeout_ms == 120_000 + 2_000 + 1_000


@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        ({"timeout_ms": 0}, r"\[plugins\.shell\]\.timeout_ms: must be from 1 to 2000000000, got 0"),
        # Past it, the budget declared to the timeout plugin failed every call POLICY_ERROR.
        ({"timeout_ms": 2**31}, r"\[plugins\.shell\]\.timeout_ms: must be from 1 to 2000000000, got 2147483648"),
        ({"max_output_bytes": "big"}, "expected an integer"),
        ({"kill_grace_ms": -1}, r"\[plugins\.shell\]\.kill_grace_ms: must be from 0 to 3600000, got -1"),
        ({"shell": " "}, r"\[plugins\.shell\]\.shell: must name the shell to run"),
        ({"root": "/definitely/not/here"}, "is not a directory"),
        ({"timeout": 5}, "unknown key"),
    ],
)
def test_bad_config_is_refused(config: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        shell.dsh_setup(make_runtime(), config)
