"""The ``bash`` tool: run a shell command in the workspace, and leave no process behind.

Enable it through the ``shell`` entry point; configure it in ``[plugins.shell]``::

    [plugins.shell]
    root = "."                  # the workspace; required: without it no tool is registered (opt-in)
    timeout_ms = 120000         # default and maximum per-call deadline; also the tool's timeout_ms
    max_output_bytes = 262144   # output kept per call (head and tail), default 256 KiB
    kill_grace_ms = 2000        # SIGTERM -> SIGKILL grace when stopping a command
    shell = "bash"              # the shell run as `<shell> -c <command>`, looked up on PATH

Each call runs ``bash -c <command>`` through ``trio.run_process`` in a **new
session** (``start_new_session=True``), so everything the command starts stays
in a session the tool can end as a whole. The command inherits the host
process's environment (secrets included): start the host with only what
commands may see. Nor is it confined like the file tools: a command can write
any file the host's user can, the grants file and the audit log included, so
gate it with permissions (``action = "ask"``) and never grant it for good.
Standard input is
``/dev/null``; standard output and standard error are merged into one stream,
of which the first and last ``max_output_bytes / 2`` bytes are kept (with a
marker saying how much was left out between them). The value is::

    {"exit_code": 0 | null, "signal": "SIGTERM" | null, "output": "...",
     "truncated": false, "timed_out": false, "timeout_ms": 30000}

``exit_code`` is set when the command exited, ``signal`` when it was killed by
one (never both); ``timeout_ms`` is the deadline the call ran under.

**Deadlines.** The call's ``timeout_ms`` argument (default and maximum: the
configured ``timeout_ms``; larger values are capped) is the tool's own
deadline: when it passes, the process group is stopped and the call *succeeds*
with ``timed_out: true``, the signal that ended the command and the output
captured so far, so the model can see how far it got. The definition also
declares ``timeout_ms`` too, the configured one plus ``kill_grace_ms`` and a
second for the drain, so with the ``timeout`` plugin loaded a budget is
enforced from outside as well (``TOOL_TIMEOUT``) only when the tool's own
stopping hangs: a command that runs out of its time reports ``timed_out``.

**No survivors.** However the call ends (the command exited, the deadline
passed, the caller cancelled, the timeout plugin fired), the tool sends
SIGTERM to every process group of the command's session (job control, ``set
-m``, gives background jobs groups of their own inside it), waits up to
``kill_grace_ms`` for them to go, then sends SIGKILL, and only then returns.
The output is read all through the grace, so a ``trap ... TERM`` that prints
while it cleans up finishes (its output and exit status are the result's)
instead of dying of SIGPIPE.
Background jobs therefore do not outlive the call (start a daemon with
``setsid cmd > file 2>&1 &`` if it must: it then leaves the session and the
tool's control; its output must go elsewhere, for the command's pipe is closed
when the call returns and a daemon still writing to it dies of SIGPIPE).
Where there is no ``/proc`` to list the session, only the shell's own group is
stopped. Zombie members waiting for a reaper count as gone (some container
inits never reap orphans).

The tool is exclusive (never runs alongside other calls) and its presenters
give a ``TerminalCallView`` (the command, its ``description`` and ``cwd``) and
a ``TerminalResultView`` (output, exit code or signal) built from the durable
result meta.
"""

from __future__ import annotations

import codecs
import contextlib
import errno
import math
import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Mapping
from functools import partial
from typing import Annotated, Any, Final

import attrs
import trio

from dsh_core import (
    ConfigError,
    DshError,
    TableCheck,
    TextBlock,
    ToolDefinition,
    ToolEffects,
    ToolOutput,
    ToolRuntime,
    check_validator,
    define_tool,
    hookimpl,
    structure_table,
)
from dsh_core.presentation import TerminalCallView, TerminalResultView

from ._file_settings import PathSetting, kept_path
from ._quoted import quoted_path
from ._settings_warnings import report_inert_keys
from .files import Workspace

__all__ = ["ShellError", "ShellSettings", "bash_tool", "group_alive", "stop_group"]

# Capability manifest (enforced under strict_capabilities): the bash tool; it decides no calls.
DSH_CAPABILITIES: dict[str, list[str]] = {"tools": ["bash"], "affects": []}

_POLL_S: Final = 0.02
_DRAIN_S: Final = 0.5
"""After the group is gone, how long to wait for a process outside it (``setsid``) to release the pipe."""


class ShellError(DshError):
    """The command could not be started (bad ``cwd``, no ``bash``, a NUL in the command)."""

    code = "SHELL_ERROR"


def _at_least(minimum: int) -> Callable[[int], str | None]:
    def problem(value: int) -> str | None:
        return None if value >= minimum else f"must be at least {minimum}, got {value}"

    return problem


_positive, _two_or_more, _non_negative = _at_least(1), _at_least(2), _at_least(0)

MAX_SHELL_TIMEOUT_MS: Final = 2_000_000_000
"""The largest ``timeout_ms`` (about 23 days): the budget declared to the timeout plugin (this, the kill
grace and the drain) must stay within its 2**31 - 1 ms, or every call failed ``POLICY_ERROR``."""
MAX_KILL_GRACE_MS: Final = 3_600_000
# What the declared budget adds to the tool's own deadline besides the kill grace: the drain and a margin.
_CLEANUP_ROOM_MS: Final = int(_DRAIN_S * 1000) + 500


def _in_range(minimum: int, maximum: int) -> Callable[[int], str | None]:
    def problem(value: int) -> str | None:
        return None if minimum <= value <= maximum else f"must be from {minimum} to {maximum}, got {value}"

    return problem


def _shell_problem(value: str) -> str | None:
    return None if value.strip() else "must name the shell to run (bash by default), got an empty string"


_timeout_range, _grace_range = _in_range(1, MAX_SHELL_TIMEOUT_MS), _in_range(0, MAX_KILL_GRACE_MS)


@attrs.frozen(kw_only=True)
class ShellSettings:
    """The ``[plugins.shell]`` table."""

    root: PathSetting | None = attrs.field(default=None, validator=kept_path)
    timeout_ms: Annotated[int, TableCheck(_timeout_range)] = attrs.field(
        default=120_000, validator=check_validator(_timeout_range)
    )
    max_output_bytes: Annotated[int, TableCheck(_two_or_more)] = attrs.field(
        default=256 * 1024, validator=check_validator(_two_or_more)
    )
    kill_grace_ms: Annotated[int, TableCheck(_grace_range)] = attrs.field(
        default=2_000, validator=check_validator(_grace_range)
    )
    shell: Annotated[str, TableCheck(_shell_problem)] = attrs.field(
        default="bash", validator=check_validator(_shell_problem)
    )


# --- the process group ---------------------------------------------------------------------


def _live_groups(leader: int) -> set[int] | None:
    """The process groups with a live (non-zombie) member in the session or group ``leader`` leads.

    ``None`` where there is no ``/proc`` to read. The command's shell leads a new
    session, and ``set -m`` (job control) puts each background job in a process
    group of its own inside that session: the session, not the shell's group, is
    what holds everything the command started (short of ``setsid``).
    """
    try:
        entries = os.listdir("/proc")
    except OSError:
        return None
    groups: set[int] = set()
    for name in entries:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stream:
                data = stream.read()
        except OSError:
            continue  # exited meanwhile
        # "pid (comm) state ppid pgrp session ...": comm may hold anything, so split after its last ")".
        fields = data[data.rfind(b")") + 2 :].split()
        if len(fields) > 3 and (fields[0] not in (b"Z", b"X") or _threads_live(name)):
            pgrp, session = int(fields[2]), int(fields[3])
            if pgrp == leader or session == leader:
                groups.add(pgrp)
    return groups


def _threads_live(pid: str) -> bool:
    """Whether a process /proc shows as a zombie still runs threads: its main thread exited, not it.

    Its stat shows the main thread's state; a program that ended its main thread
    (pthread_exit) and kept workers was taken for gone, never signalled, and ran on.
    """
    try:
        return len(os.listdir(f"/proc/{pid}/task")) > 1
    except OSError:
        return False


async def _groups_left(leader: int) -> set[int]:
    groups = await trio.to_thread.run_sync(_live_groups, leader)
    if groups is not None:
        return groups
    try:  # no /proc: only the leader's own group can be seen
        os.killpg(leader, 0)
    except ProcessLookupError:
        return set()
    except PermissionError:
        pass
    return {leader}


async def group_alive(pgid: int) -> bool:
    """Whether the session or process group ``pgid`` leads still has a member that is not a zombie."""
    return bool(await _groups_left(pgid))


def _signal_groups(groups: set[int], signum: signal.Signals) -> None:
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signum)
            if signum == signal.SIGTERM:
                # A stopped job (kill -STOP, Ctrl-Z) keeps SIGTERM pending until it runs again: its
                # TERM trap never ran and the call waited the whole grace for the SIGKILL.
                os.killpg(group, signal.SIGCONT)


async def stop_group(pgid: int, grace_s: float) -> None:
    """SIGTERM every process of the session (or group) ``pgid`` leads, then SIGKILL what is left after ``grace_s``.

    Every process group of the session is signalled, so background jobs that
    job control moved to groups of their own end too. Returns at once when
    nothing is left. Call it shielded from cancellation when it is cleanup.
    """
    groups = await _groups_left(pgid)
    if not groups:
        return
    _signal_groups(groups, signal.SIGTERM)
    signalled = set(groups)
    with trio.move_on_after(grace_s):
        while groups := await _groups_left(pgid):
            # Once each: a group that appeared since (a job started late) gets its SIGTERM too.
            _signal_groups(groups - signalled, signal.SIGTERM)
            signalled |= groups
            await trio.sleep(_POLL_S)
        return
    _signal_groups(await _groups_left(pgid), signal.SIGKILL)


# --- output capture ------------------------------------------------------------------------


class _Capture:
    """The merged output: the first and last bytes within the cap, and how many there were."""

    def __init__(self, cap: int) -> None:
        self.head_cap = (cap + 1) // 2
        self.tail_cap = cap // 2
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0
        self.closed = trio.Event()

    def add(self, chunk: bytes | bytearray) -> None:
        self.total += len(chunk)
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > self.tail_cap:
                del self.tail[: len(self.tail) - self.tail_cap]

    async def pump(self, stream: trio.abc.ReceiveStream, scope: trio.CancelScope) -> None:
        """Read ``stream`` to its end, or until ``scope`` is cancelled."""
        try:
            with scope:
                async with stream:
                    async for chunk in stream:
                        self.add(chunk)
        finally:
            self.closed.set()

    @property
    def truncated(self) -> bool:
        return self.total > len(self.head) + len(self.tail)

    def text(self) -> str:
        if not self.truncated:
            return bytes(self.head + self.tail).decode("utf-8", errors="replace")
        # Cut on character boundaries: an incomplete sequence at the head's end stays
        # buffered in the decoder, continuation bytes at the tail's start are skipped.
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        head = decoder.decode(bytes(self.head), final=False)
        # Bytes of the head the text shows: what the decoder consumed, not the re-encoded text
        # (an invalid byte shown as U+FFFD is one byte of output, three once encoded).
        shown_head = len(self.head) - len(decoder.getstate()[0])
        start = 0
        while start < min(3, len(self.tail)) and 0x80 <= self.tail[start] <= 0xBF:
            start += 1
        tail = bytes(self.tail[start:]).decode("utf-8", errors="replace")
        omitted = self.total - shown_head - (len(self.tail) - start)
        return f"{head}\n[... {omitted} bytes of output omitted ...]\n{tail}"


# --- the tool ------------------------------------------------------------------------------


def _resolve_cwd(workspace: Workspace, cwd: str | None) -> str:
    real = workspace.resolve(cwd) if cwd is not None else workspace.root
    if not os.path.isdir(real):
        shown = quoted_path(cwd) if cwd is not None else f"(the workspace root, {real})"
        raise ShellError(f"cwd {shown} is not a directory")
    return real


class _Bash:
    def __init__(self, workspace: Workspace, settings: ShellSettings) -> None:
        self.workspace = workspace
        self.settings = settings
        self.grace_s = settings.kill_grace_ms / 1000

    async def deliver_cancel(self, process: trio.Process) -> None:
        # trio.run_process calls this when the call is cancelled; it stops waiting
        # for us as soon as the leader exits, so the finally in run() finishes the job.
        await stop_group(process.pid, self.grace_s)

    async def run(self, args: Any) -> dict[str, Any]:
        command: str = args["command"]
        if "\x00" in command:
            # argv strings are C strings: the OS cannot pass a NUL to bash, so say so instead of a ValueError.
            raise ShellError(
                f"command contains a NUL character (at position {command.index(chr(0))}); bash cannot be given one"
            )
        if not command.isascii():
            try:
                command.encode("utf-8")
            except UnicodeEncodeError as exc:
                # JSON allows "\ud800"; no argv can carry it (it failed as a bare UnicodeEncodeError).
                raise ShellError(
                    f"command holds a lone surrogate (at position {exc.start}), which is not text; bash cannot be given one"
                ) from None
        requested = args.get("timeout_ms")
        # An int of any size is finite (math.isfinite would overflow on a huge one from the model).
        if requested is not None and not (requested >= 1 and (type(requested) is int or math.isfinite(requested))):
            raise ShellError(f"timeout_ms must be at least 1, got {requested!r}")
        budget_ms = self.settings.timeout_ms if requested is None else min(int(requested), self.settings.timeout_ms)
        shell = shutil.which(self.settings.shell)
        if shell is None:
            raise ShellError(f"cannot run commands: {self.settings.shell!r} was not found on PATH")
        cwd: str = await trio.to_thread.run_sync(_resolve_cwd, self.workspace, args.get("cwd"))

        capture = _Capture(self.settings.max_output_bytes)
        # The pump runs outside the deadline's scope and shielded from the caller's cancellation:
        # closing the read end while the group is in its SIGTERM grace would kill a TERM handler
        # that prints with SIGPIPE before it has cleaned up. It is stopped once the group is gone.
        pump_scope = trio.CancelScope(shield=True)
        process: trio.Process | None = None
        exited = False
        try:
            async with trio.open_nursery() as pumps:
                try:
                    with trio.move_on_after(budget_ms / 1000) as deadline:
                        async with trio.open_nursery() as nursery:
                            process = await nursery.start(
                                partial(
                                    trio.run_process,
                                    [shell, "-c", command],
                                    stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT,
                                    cwd=cwd,
                                    start_new_session=True,
                                    check=False,
                                    deliver_cancel=self.deliver_cancel,
                                )
                            )
                            assert process.stdout is not None
                            pumps.start_soon(capture.pump, process.stdout, pump_scope)
                            await process.wait()
                            exited = True
                finally:
                    if process is not None:
                        with trio.CancelScope(shield=True):
                            # Background jobs (or a group still in its grace) hold the pipe open:
                            # end them, then drain what they wrote.
                            await stop_group(process.pid, self.grace_s)
                            with trio.move_on_after(_DRAIN_S):
                                await capture.closed.wait()
                    pump_scope.cancel()
        except* OSError as group:
            cause = _first_leaf(group)
            if isinstance(cause, OSError) and cause.errno == errno.E2BIG:
                # The command is one argument of bash's, and the kernel caps one argument (128 KiB on Linux).
                raise ShellError(
                    f"the command is {len(command.encode('utf-8', 'surrogateescape'))} bytes, more than the "
                    "system passes to a program as one argument; write it to a script file and run that"
                ) from None
            raise ShellError(f"cannot start {self.settings.shell}: {cause}") from None

        if process is None:
            # The deadline passed before the shell had even started (a budget of a millisecond
            # or two): trio.run_process ended whatever it had spawned.
            return {
                "exit_code": None,
                "signal": None,
                "output": "",
                "truncated": False,
                "timed_out": True,
                "timeout_ms": budget_ms,
            }
        assert process.returncode is not None
        code = process.returncode
        return {
            "exit_code": code if code >= 0 else None,
            "signal": _signal_name(-code) if code < 0 else None,
            "output": capture.text(),
            "truncated": capture.truncated,
            "timed_out": deadline.cancelled_caught and not exited,
            "timeout_ms": budget_ms,
        }


def _first_leaf(group: BaseExceptionGroup[OSError]) -> BaseException:
    """The first exception in ``group`` that is not itself a group (nurseries nest them)."""
    # Unlike dsh_core.sole_exception, a group of several still yields a leaf: the message names one cause.
    found: BaseException = group
    while isinstance(found, BaseExceptionGroup):
        found = found.exceptions[0]
    return found


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _render(args: Any, value: Any) -> list[TextBlock]:
    output = value["output"] or "(no output)"
    if value["timed_out"]:
        status = (
            f"[timed out after {value['timeout_ms']} ms; the command and its child processes were stopped"
            f" ({value['signal'] or 'exited'})]"
        )
    elif value["signal"] is not None:
        status = f"[killed by {value['signal']}]"
    else:
        status = f"[exit code {value['exit_code']}]"
    return [TextBlock(f"{output.rstrip(chr(10))}\n{status}")]


def _settled_meta(result: object) -> Mapping[str, Any] | None:
    if isinstance(result, Mapping):
        meta = None if result.get("isError", False) else result.get("meta")
    else:
        meta = None if getattr(result, "is_error", True) else getattr(result, "meta", None)
    return meta if isinstance(meta, Mapping) else None


def _present_call(args: Any) -> TerminalCallView:
    return TerminalCallView(title=args["command"], description=args.get("description"), cwd=args.get("cwd"))


def _present_result(args: Any, result: Any) -> TerminalResultView | None:
    meta = _settled_meta(result)
    if meta is None:
        return None
    return TerminalResultView(output=meta["output"], exit_code=meta["exit_code"], signal=meta["signal"])


def _nullable(kind: str) -> dict[str, Any]:
    return {"oneOf": [{"type": kind}, {"type": "null"}], "required": True}


def bash_tool(workspace: Workspace, settings: ShellSettings | None = None) -> ToolDefinition:
    """The ``bash`` definition running commands in ``workspace`` with ``settings`` (defaults when omitted)."""
    settings = settings or ShellSettings()
    bash = _Bash(workspace, settings)
    half = settings.max_output_bytes // 2
    return define_tool(
        name="bash",
        description=(
            "Run a bash command (`bash -c`) in the workspace and return its combined stdout and stderr with its "
            "exit code. Standard input is empty, so interactive prompts fail instead of waiting: pass flags such "
            "as `-y` or `--no-pager`. The command stops after `timeout_ms` (default and maximum "
            f"{settings.timeout_ms} ms); then it and every process it started are killed and the result says "
            f"timed_out. Output over {settings.max_output_bytes} bytes keeps only its first and last {half} "
            "bytes, so redirect long output to a file and search it. Background jobs are ended when the command "
            "returns. `cwd` is a directory inside the workspace (default: the workspace root)."
        ),
        parameters={
            "command": {"type": "string", "required": True, "description": "The bash command line to run."},
            "description": {
                "type": "string",
                "description": "What the command does, in a few words (shown to the user).",
            },
            "cwd": {"type": "string", "description": "Working directory, relative to the workspace root."},
            "timeout_ms": {
                "type": "integer",
                "description": f"Deadline in milliseconds (default and maximum {settings.timeout_ms}).",
            },
        },
        output=ToolOutput(
            schema={
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "exit_code": _nullable("integer"),
                    "signal": _nullable("string"),
                    "output": {"type": "string", "required": True},
                    "truncated": {"type": "boolean", "required": True},
                    "timed_out": {"type": "boolean", "required": True},
                    "timeout_ms": {"type": "integer", "required": True, "description": "The deadline applied."},
                },
            },
            render=_render,
            presentation_meta=lambda args, value: value,
        ),
        execute=bash.run,
        effects=ToolEffects(destructive=True, open_world=True),
        # Room for the tool's own deadline to finish its work (the kill grace, the drain): the
        # timeout plugin steps in only when that cleanup itself hangs. With the two budgets equal,
        # a command's TERM trap ran into the plugin's deadline and its output was lost.
        timeout_ms=settings.timeout_ms + settings.kill_grace_ms + _CLEANUP_ROOM_MS,
        present_call=_present_call,
        present_result=_present_result,
    )


@hookimpl
def dsh_setup(runtime: ToolRuntime, config: dict[str, Any]) -> None:
    """Register the ``bash`` tool for the configured workspace.

    Opt-in: without ``[plugins.shell] root`` nothing is registered (a shell tool
    must never appear just because the package is installed).
    """
    settings = structure_table(ShellSettings, config, "[plugins.shell]")
    if settings.root is None:
        report_inert_keys(runtime, "shell", config, "root", "no bash tool is registered: set root to register it")
        return
    root = os.path.abspath(settings.root)
    if not os.path.isdir(root):
        raise ConfigError([f"[plugins.shell].root: {root!r} is not a directory"])
    runtime.register(bash_tool(Workspace(root), settings))
