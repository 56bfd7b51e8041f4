"""The code runtime seam and its subprocess backend for Python programs.

A *code runtime* runs one ``run_code`` program: the body of an async function
(top-level ``await`` and ``return`` work) that may call the host back through
*bindings*, awaitable functions taking and returning lossless JSON. The result
is always a :class:`CodeRunResult`; a program's failure is a value
(:class:`CodeRunError`), never an exception.

:class:`SubprocessPythonRuntime` runs each program in a fresh ``python -I``
process started with :func:`trio.run_process`; no state survives from one run
to the next, and whatever the program started in its process group is killed
with it. **A subprocess isolates state and crashes, it is not a security
sandbox**: the program runs with the host user's rights and can read files,
open sockets and start processes. It gets an empty environment by default, so
secrets in the host's environment are not handed to it (though where the
platform lets one process read another's ``/proc/<pid>/environ``, it can read
the host's there).

Wire protocol
-------------
JSON-lines, one compact JSON object per line, on the child's stdin (host to
child) and stdout (child to host). Every frame is ASCII but the child's ``done``
frame carrying a value: that one is UTF-8 (lone surrogates encoded as
``surrogatepass`` does), so that its size is the value's size as
``max_output_bytes`` counts it, plus its envelope. The child moves both onto private
descriptors before the program runs and points descriptor 1 at its stderr, so
neither ``print`` nor a stray write to descriptor 1 can corrupt a frame. The host
logs each line that reaches the child's stderr (a subprocess's output, a stray
write), as it logs ``log`` frames.

Host to child:

- ``{"type": "run", "program", "names": [...], "global", "error_class",
  "max_output_bytes", "max_frame_bytes", "max_json_values", "limits"}``: first and only once
  (``limits``: ``{memory_bytes, cpu_s, file_bytes, subprocesses, network,
  file_writes}``); ``names`` are
  the binding names reachable as ``<global>.name`` / ``<global>["name"]``.
- ``{"type": "reply", "id", "ok": true, "value"}`` or
  ``{"type": "reply", "id", "ok": false, "message"}``: one per ``call``, in the
  order the bindings finish. What does not fit the child's stdin waits in a
  queue, counted against ``MAX_CALL_BYTES_IN_FLIGHT``: while it and the calls in
  flight fill that, the host reads no further call, and the child (under
  asyncio) reads its replies while a frame it sends waits for the pipe.

Child to host:

- ``{"type": "call", "id", "name", "args"}``: the program awaits a binding;
  ids are unique among calls in flight, and many may be in flight at once.
- ``{"type": "cancel", "id"}``: the program stopped waiting for that call
  (``asyncio.wait_for`` ran out, its task was cancelled). The host cancels it
  when its binding's awaitable has a ``cancel()`` method (the bridge's does:
  the sub-call ends ``ABORTED``, or is never started); its reply, if one is
  still sent, is ignored. A cancel for an id not in flight is ignored.
- ``{"type": "log", "text"}``: one line the program wrote to ``sys.stdout`` or
  ``sys.stderr``, without its newline.
- ``{"type": "done"}``, ``{"type": "done", "value"}`` or
  ``{"type": "done", "error": {"kind", "message"}}`` with kind ``exception``,
  ``invalid-output`` or ``output-limit``: the last frame.

The host treats every frame as hostile: a line that is not one well-formed frame
of the shapes above, is longer than the frame cap, or holds more JSON values
than a call's arguments or a returned value may (``max_json_values``, plus the
frame's own), ends the run with kind ``protocol``; it counts them before
decoding the line. A large frame is decoded and checked on a worker thread,
so that the host's event loop keeps running and the wall-clock budget holds.
Time, output size and the child's death are observed on the host side and
never sent as frames.
"""

from __future__ import annotations

import contextlib
import keyword
import os
import re
import signal
import subprocess
import sys
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping
from functools import partial
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar, Final, Literal, Protocol, TypeAlias

import attrs
import trio

from .._checks import instance_of, memory_limit_problem, one_of, positive_finite, resource_limit_problem
from .._errors import NonJsonValueError
from .._json import FrozenDict, JsonValue, safe_repr, snapshot_json
from .._jsoncodec import decode_json, encode_json

__all__ = [
    "Binding",
    "CodeRunError",
    "CodeRunErrorKind",
    "CodeRunResult",
    "CodeRuntime",
    "SubprocessPythonRuntime",
]

Binding: TypeAlias = Callable[[JsonValue], Awaitable[JsonValue]]
"""A host function a program can call: lossless JSON arguments in, lossless JSON out.

The runtime calls a binding as soon as the program's call reaches the host,
in the order the program made its calls, and awaits what it returns later
(often in a task of its own): a binding that numbers or queues its calls when
called sees them in the program's order. Every awaitable it returns is awaited.

A binding object may also have a ``completes_at_once() -> bool`` method: when it
returns ``True``, a call made right now finishes without suspending, and the
runtime may serve it without starting a task for it.
"""

CodeRunErrorKind: TypeAlias = Literal[
    "exception", "timeout", "abort", "worker-exit", "invalid-output", "output-limit", "protocol"
]

_KINDS: Final = frozenset(
    ("exception", "timeout", "abort", "worker-exit", "invalid-output", "output-limit", "protocol")
)
_CHILD_KINDS: Final = frozenset(("exception", "invalid-output", "output-limit"))
_CHILD_PATH: Final = str(Path(__file__).with_name("_child.py"))
# Started as a script, the child would be compiled from source on every run (a script
# gets no cached bytecode): a few milliseconds of each start-up. Loaded as a module,
# it uses its cached bytecode like any import.
_BOOTSTRAP: Final = (
    "import sys\n"
    "from importlib.machinery import SourceFileLoader\n"
    "child = sys.modules['_dsh_child'] = type(sys)('_dsh_child')\n"
    "child.__file__ = sys.argv[1]\n"
    "SourceFileLoader('_dsh_child', sys.argv[1]).exec_module(child)\n"
    "child.main()\n"
)


@attrs.frozen(kw_only=True)
class CodeRunError:
    """Why a run failed: a machine-readable ``kind`` and a message for the model.

    ``exception``: the program raised; ``timeout``: the wall-clock budget ran
    out; ``abort``: the caller stopped the run (reserved for runtimes that
    report it; :class:`SubprocessPythonRuntime` lets trio's ``Cancelled``
    propagate instead); ``worker-exit``: the process died before finishing;
    ``invalid-output``: the program returned something that is not lossless
    JSON; ``output-limit``: printed and returned output together passed the
    byte cap; ``protocol``: the process sent something that is not a frame.
    """

    kind: CodeRunErrorKind = attrs.field(validator=one_of(_KINDS))
    message: str = attrs.field(validator=instance_of(str))


def _to_logs(logs: Iterable[str]) -> tuple[str, ...]:
    return tuple(logs)


def _check_result(instance: CodeRunResult, attribute: object, value: object) -> None:
    if instance.has_value and instance.error is not None:
        raise ValueError("a failed run has no value")
    if not instance.has_value and instance.value is not None:
        raise ValueError("value must be None when has_value is False")


@attrs.frozen(kw_only=True)
class CodeRunResult:
    """How one run ended: its ``logs`` (one entry per line of output) and its value or error.

    ``has_value`` says whether the program returned something: a program that
    returns nothing (or ``None``) has no value, and a failed run never has one.
    Logs are kept on failure too, up to the point the run stopped.
    """

    logs: tuple[str, ...] = attrs.field(default=(), converter=_to_logs)
    value: JsonValue = attrs.field(default=None, converter=snapshot_json)
    has_value: bool = attrs.field(default=False, validator=_check_result)
    error: CodeRunError | None = None


def _returned(logs: tuple[str, ...] | list[str], value: JsonValue) -> CodeRunResult:
    """The result of a run that returned ``value``, a snapshot already: not walked again on the event loop.

    The converter would snapshot it once more (a tuple is not known to be frozen),
    item by item for a program's 200 000 rows.
    """
    result = CodeRunResult(logs=logs)
    object.__setattr__(result, "value", value)
    object.__setattr__(result, "has_value", True)
    return result


class CodeRuntime(Protocol):
    """What the ``run_code`` bridge needs from a code runtime."""

    @property
    def language(self) -> str:
        """Lower-case language name, e.g. ``"python"``; it picks the SDK renderer."""
        ...

    @property
    def isolation(self) -> str:
        """Informational: ``"process"``, ``"worker-thread"``, ``"container"``..."""
        ...

    async def run(
        self,
        program: str,
        bindings: Mapping[str, Binding],
        *,
        global_name: str = "tools",
        error_class_name: str = "ToolCallError",
    ) -> CodeRunResult:
        """Run ``program``; program failures are results, only misuse raises.

        Each binding returns an awaitable of the call's outcome. When the
        program stops waiting for a call (a timeout, a cancelled task), a
        runtime calls that awaitable's ``cancel()`` if it has one: the bridge's
        cancels the sub-call, so the calls made after it do not wait for its body.
        """
        ...


# Names a runtime may not use for the bindings' global or the error class, on
# any backend: reserved words of Python (soft keywords included) and of
# ECMAScript, and globals the runtimes themselves need.
_PORTABLE_IDENTIFIER: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_RESERVED_WORDS: Final = frozenset(keyword.kwlist) | {
    *("match", "case", "type", "_"),
    *("catch", "const", "debugger", "default", "delete", "do", "enum", "export", "extends", "false"),
    *("function", "instanceof", "new", "null", "super", "switch", "this", "throw", "true", "typeof"),
    *("var", "void", "let", "static", "implements", "interface", "package", "private", "protected"),
    *("public", "arguments", "eval"),
    *("console", "__dsh_main__", "__builtins__", "__name__", "__debug__"),
}


def _check_namespace(global_name: str, error_class_name: str) -> None:
    for role, name in (("global_name", global_name), ("error_class_name", error_class_name)):
        if not isinstance(name, str) or not _PORTABLE_IDENTIFIER.fullmatch(name) or name in _RESERVED_WORDS:
            raise ValueError(f"{role} {name!r} is not a portable identifier (ASCII, not a reserved word)")
    if global_name == error_class_name:
        raise ValueError(f"global_name and error_class_name are both {global_name!r}")


def _positive_budget(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if not positive_finite(value):
        raise ValueError(f"{attribute.name} must be a positive finite number of seconds, not {value!r}")


def _output_cap(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 4:
        raise ValueError(f"{attribute.name} must be an int of at least 4, not {value!r}")


def _optional_resource_limit(instance: object, attribute: attrs.Attribute[int | None], value: object) -> None:
    if value is None:
        return
    if type(value) is not int or value < 1:
        raise ValueError(f"{attribute.name} must be a positive int or None, not {value!r}")
    problem = resource_limit_problem(value)
    if problem is not None:
        raise ValueError(f"{attribute.name}: {problem}")


def _optional_memory_limit(instance: object, attribute: attrs.Attribute[int | None], value: object) -> None:
    _optional_resource_limit(instance, attribute, value)
    problem = None if value is None else memory_limit_problem(value)  # type: ignore[arg-type]  # an int: checked above
    if problem is not None:
        raise ValueError(f"{attribute.name}: {problem}")


def _positive_count(instance: object, attribute: attrs.Attribute[int], value: object) -> None:
    if type(value) is not int or value < 1:
        raise ValueError(f"{attribute.name} must be a positive int, not {value!r}")


def _interpreter(python: str | None) -> str:
    return sys.executable if python is None else str(python)


def _default_env(env: Mapping[str, str] | None) -> Mapping[str, str]:
    if env is None:
        # Windows cannot start Python without SYSTEMROOT.
        env = {"SYSTEMROOT": os.environ["SYSTEMROOT"]} if os.name == "nt" and "SYSTEMROOT" in os.environ else {}
    return MappingProxyType(dict(env))


@attrs.frozen(kw_only=True, eq=False)
class SubprocessPythonRuntime:
    """Runs each program in a fresh ``python -I`` subprocess (see the module docstring).

    ``wall_budget_s`` bounds each run from spawn to result (``timeout``).
    ``max_output_bytes`` caps the UTF-8 size of every log line (plus one byte
    each) and the compact JSON of the returned value, together
    (``output-limit``, with the logs that fitted); a value within it always fits
    its frame (:attr:`max_frame_bytes`). ``max_json_values`` caps the JSON
    values (each container and each scalar counts one) in one call's arguments
    (the call fails in the program) and in the returned value
    (``output-limit``): what a value costs the host to check and copy is per
    value, not per byte. ``python`` is the interpreter
    (default: the host's own); ``env`` the child's whole environment (default:
    empty).

    Each line the program prints is one log entry (a line longer than 32 KiB
    characters arrives as several); a last line without a newline is kept when
    the program finishes. Returning ``None`` (or nothing) means no value.

    A child that dies is ``worker-exit`` at once, even when a fork of it (made
    without exec) still holds the channel open: once the child has exited, its
    process group is killed and what it wrote is read for at most
    ``EXIT_GRACE_S`` more.

    Cancelling the surrounding trio scope kills the child and reaps it before
    ``Cancelled`` propagates. Binding calls still in flight when a run ends are
    cancelled.

    Resource limits (each a positive int, at most ``2**63 - 2``, the largest
    the system takes; ``max_memory_bytes`` at least 16 MiB, which the
    interpreter alone needs, the same floor ``[code_runtime]`` sets), applied in the child before the program is compiled (soft
    and hard, so the program cannot raise them back unless it runs as root):
    ``max_memory_bytes`` (address space: an allocation beyond it raises
    ``MemoryError`` in the program), ``max_cpu_s`` (CPU seconds: the child is
    killed, ``worker-exit``), ``max_file_bytes`` (a file write beyond it fails
    with ``OSError``), and ``allow_subprocesses=False`` (an audit hook refuses
    ``subprocess``, ``os.system``, ``os.fork``, ``os.exec*``, ``posix_spawn``
    and loading C libraries through ``ctypes`` with ``PermissionError``).
    ``allow_network=False`` and ``allow_file_writes=False`` refuse sockets
    other than ``AF_UNIX`` ones, sockets' connect/bind/send and name lookups,
    and opening files for writing or creating, removing, renaming or changing
    them, so a well-meaning program's effects go through its tools and the
    pipeline's policies. They
    bound runaway and careless programs, not hostile ones: the hook runs in
    the program's own interpreter, which a program can reach (through the
    garbage collector or C-level calls), and it lists only the common ways
    out (``sqlite3`` opening a file, for one, is not refused). Like the
    process itself they are not a security sandbox. A limit the platform
    cannot apply fails the run (``exception``) instead of running without it.
    """

    language: ClassVar[str] = "python"
    isolation: ClassVar[str] = "process"

    wall_budget_s: float = attrs.field(default=30.0, validator=_positive_budget)
    max_output_bytes: int = attrs.field(default=64 * 1024 * 1024, validator=_output_cap)
    python: str = attrs.field(default=None, converter=_interpreter)
    env: Mapping[str, str] = attrs.field(default=None, converter=_default_env, repr=False)
    max_memory_bytes: int | None = attrs.field(default=None, validator=_optional_memory_limit)
    max_cpu_s: int | None = attrs.field(default=None, validator=_optional_resource_limit)
    max_file_bytes: int | None = attrs.field(default=None, validator=_optional_resource_limit)
    allow_subprocesses: bool = attrs.field(default=True, validator=instance_of(bool))
    allow_network: bool = attrs.field(default=True, validator=instance_of(bool))
    allow_file_writes: bool = attrs.field(default=True, validator=instance_of(bool))
    max_json_values: int = attrs.field(default=1_000_000, validator=_positive_count)

    @property
    def max_frame_bytes(self) -> int:
        """The longest line accepted from the child; call arguments are bounded by it too.

        Above ``max_output_bytes`` by a margin, so that a ``done`` frame whose value is
        within the cap always fits (it carries the value's UTF-8, not an ASCII escape).
        """
        return max(self.max_output_bytes, 16 * 1024 * 1024) + 1024 * 1024

    async def run(
        self,
        program: str,
        bindings: Mapping[str, Binding],
        *,
        global_name: str = "tools",
        error_class_name: str = "ToolCallError",
    ) -> CodeRunResult:
        """Run ``program`` with ``bindings`` reachable as ``<global_name>.name`` and ``<global_name>["name"]``.

        A binding that raises makes the program's call raise
        ``<error_class_name>(tool_name, str(exc))``. Raises ``ValueError`` or
        ``TypeError`` only for misuse (a non-portable global or error class
        name, a non-``str`` program or binding name, a non-callable binding).
        """
        _check_namespace(global_name, error_class_name)
        if not isinstance(program, str):
            raise TypeError(f"program must be a str, not {type(program).__name__}")
        for name, binding in bindings.items():
            if not isinstance(name, str) or not callable(binding):
                raise TypeError(f"binding {name!r} must be a callable under a str name")
        run_frame = {
            "type": "run",
            "program": program,
            "names": list(bindings),
            "global": global_name,
            "error_class": error_class_name,
            "max_output_bytes": self.max_output_bytes,
            "max_frame_bytes": self.max_frame_bytes,
            "max_json_values": self.max_json_values,
            # The child refuses an int the host could not parse back, though a program lifts its own limit.
            "max_int_digits": sys.get_int_max_str_digits(),
            "limits": {
                "memory_bytes": self.max_memory_bytes,
                "cpu_s": self.max_cpu_s,
                "file_bytes": self.max_file_bytes,
                "subprocesses": self.allow_subprocesses,
                "network": self.allow_network,
                "file_writes": self.allow_file_writes,
            },
        }
        session = _Session(self, dict(bindings))
        async with trio.open_nursery() as nursery:
            try:
                process: trio.Process = await nursery.start(
                    partial(
                        trio.run_process,
                        [self.python, "-I", "-c", _BOOTSTRAP, _CHILD_PATH],
                        stdin=subprocess.PIPE,
                        stdout=subprocess.PIPE,
                        stderr=subprocess.PIPE,
                        env=dict(self.env),
                        check=False,
                        deliver_cancel=_deliver_cancel,
                        **_NEW_SESSION,
                    )
                )
            except OSError as exc:
                return session.fail("worker-exit", f"could not start {self.python!r}: {exc}")
            try:
                with trio.move_on_after(self.wall_budget_s) as deadline:
                    result = await session.drive(process, (encode_json(run_frame) + "\n").encode("ascii"))
                if deadline.cancelled_caught:
                    result = session.fail(
                        "timeout",
                        f"the program ran out of its {self.wall_budget_s:g} s wall-clock budget{session.stall_note()}",
                    )
            finally:
                # Synchronous, so it happens even while Cancelled is on its way
                # out; run_process then reaps the child before the nursery exits.
                _kill(process)
                with trio.CancelScope(shield=True):
                    for stream in (process.stdin, process.stdout, process.stderr):
                        if stream is not None:
                            await stream.aclose()
        return result


_NEW_SESSION: Final[dict[str, Any]] = {"start_new_session": True} if os.name == "posix" else {}


def _kill(process: trio.Process) -> None:
    """SIGKILL the child and, on POSIX, everything it started in its session."""
    if process.returncode is not None:
        # The child is gone, but what it started may live on in its process group (a
        # Popen before os._exit). A pid is not reused while a group of that id exists,
        # so while the group has members its id is still the child's.
        if os.name == "posix":
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
        return
    if os.name == "posix":
        from ._child import descendants

        # Looked for while the child lives: a process the program started in a session or
        # group of its own is not in the child's group, and loses its parent with the child.
        strays = descendants(process.pid)
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            with contextlib.suppress(ProcessLookupError):
                process.kill()
        for pid in strays:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        return
    with contextlib.suppress(ProcessLookupError):
        process.kill()


# How long the host keeps reading after the child has exited and its process group was killed,
# when the stream still has not ended: a descendant that left the group (setsid) holds a copy of
# the protocol descriptor. What the child wrote is at most a pipe's worth, read in far less.
EXIT_GRACE_S: Final = 0.5
# An unfinished line written to descriptor 1 or 2 is logged once this long, as a printed one is.
_WRITTEN_LINE_BYTES: Final = 32 * 1024
MAX_WRITTEN_LINES: Final = 100_000
"""Lines written to descriptors 1 and 2 (a subprocess's output) kept in a run's logs."""


async def _stop_reading_after_exit(process: trio.Process, reading: trio.CancelScope, session: _Session) -> None:
    """Cancel ``reading`` once the child has exited, if the end of its stream does not come first.

    The stream ends when every copy of the write end is closed, and a fork made without exec
    (``os.fork``, ``multiprocessing``) holds one: without this, a crash beside such a fork
    would be reported as ``timeout`` after the whole budget instead of ``worker-exit``.
    """
    await process.wait()
    # The program is over whatever it wrote last (``done`` is its last act): what it left
    # behind in its group goes now, so that the stream ends once what is in the pipe is read.
    _kill(process)
    session.child_exited()
    # Cut only a reader that has stopped going on: one still taking what the child wrote (a
    # frame being decoded, calls it no longer serves) may be on its way to the done frame,
    # which must not be lost. The wall-clock budget bounds this.
    while True:
        seen = session.progress()
        await trio.sleep(EXIT_GRACE_S)
        await session.frame_decoded()
        if session.progress() == seen:
            break
    reading.cancel()


async def _deliver_cancel(process: trio.Process) -> None:
    # The child holds nothing worth a graceful exit: no SIGTERM grace period.
    _kill(process)


class _FrameError(Exception):
    """An inbound line is not a valid frame."""


class _TooManyValues(_FrameError):
    """An inbound line holds more JSON values than a frame may."""


@attrs.frozen
class _Call:
    id: int
    name: str
    args: Any


@attrs.frozen
class _Log:
    text: str
    partial: bool = False  # the program flushed a line it has not ended: more of it may follow


@attrs.frozen
class _Cancel:
    id: int


@attrs.frozen
class _Done:
    value: Any
    has_value: bool
    error: CodeRunError | None


_Frame: TypeAlias = "_Call | _Cancel | _Log | _Done"


def _parse_frame(line: bytes) -> _Frame:
    try:
        # surrogatepass: a returned value's lone surrogates arrive as the bytes they were counted as.
        frame = decode_json(line.decode("utf-8", "surrogatepass"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise _FrameError(f"not JSON ({exc})") from None
    if not isinstance(frame, dict):
        raise _FrameError("not a JSON object")
    kind = frame.get("type")
    keys = set(frame)
    if kind == "call":
        call_id = frame.get("id")
        if keys != {"type", "id", "name", "args"}:
            raise _FrameError("a call frame has exactly type, id, name and args")
        if type(call_id) is not int or not 0 <= call_id < 2**53 or not isinstance(frame["name"], str):
            raise _FrameError("a call frame needs an int id and a str name")
        return _Call(call_id, frame["name"], frame["args"])
    if kind == "cancel":
        call_id = frame.get("id")
        if keys != {"type", "id"} or type(call_id) is not int:
            raise _FrameError("a cancel frame has exactly type and an int id")
        return _Cancel(call_id)
    if kind == "log":
        if not ({"type", "text"} <= keys <= {"type", "text", "partial"}) or not isinstance(frame["text"], str):
            raise _FrameError("a log frame has type, a str text and, for a flushed unfinished line, partial")
        if "partial" in keys and frame["partial"] is not True:
            raise _FrameError("a log frame's partial is true when present")
        return _Log(frame["text"], "partial" in keys)
    if kind == "done":
        if not keys <= {"type", "value", "error"} or keys >= {"value", "error"}:
            raise _FrameError("a done frame has a value or an error, not both")
        if "error" not in frame:
            return _Done(frame.get("value"), "value" in frame, None)
        error = frame["error"]
        if (
            not isinstance(error, dict)
            or set(error) != {"kind", "message"}
            or error["kind"] not in _CHILD_KINDS
            or not isinstance(error["message"], str)
        ):
            raise _FrameError("a done error has exactly a known kind and a str message")
        return _Done(None, False, CodeRunError(kind=error["kind"], message=_capped(error["message"])))
    raise _FrameError(f"unknown frame type {safe_repr(kind)}")


# Frames up to this size are decoded on the event loop: most frames are far smaller (a sub-call's
# whole round trip costs tens of microseconds), and one this size takes a few milliseconds.
_INLINE_FRAME_BYTES: Final = 64 * 1024
# The JSON values of a frame beside those of its arguments or value: a call frame's object,
# type, id and name (a done frame's object and type are fewer).
_ENVELOPE_VALUES: Final = 4
# A JSON string once its escaped backslashes and quotes are gone (one left open runs to the end).
_BARE_JSON_STRING: Final = re.compile(rb'"[^"]*(?:"|\Z)')
# Counting values past strings goes a slice this long at a time, so that a worker thread
# doing it lets the event loop's thread in between (a line of short strings takes seconds).
_COUNT_SLICE: Final = 64 * 1024


@attrs.frozen
class _Payload:
    """A call's arguments or a returned value, checked: its snapshot, or why it is not lossless JSON.

    ``size``: the UTF-8 size of its compact JSON (measured for a returned value only).
    """

    value: JsonValue = None
    problem: str | None = None
    size: int = 0


def _decode_frame(line: bytes, max_values: int) -> tuple[_Frame, _Payload | None]:
    """The frame ``line`` holds and its payload checked; raises :class:`_FrameError`.

    All the work a frame costs in proportion to its size, so that it can run
    off the event loop: counting its values (before anything is decoded),
    decoding it, and snapshotting its call arguments or returned value.
    """
    if _holds_more_values(line, max_values + _ENVELOPE_VALUES):
        raise _TooManyValues
    frame = _parse_frame(line)
    if isinstance(frame, _Call):
        return frame, _checked(frame.args, measure=False)
    if isinstance(frame, _Done) and frame.has_value:
        return frame, _checked(frame.value, measure=True, text_bytes=len(line))
    return frame, None


def _checked(raw: Any, *, measure: bool, text_bytes: int | None = None) -> _Payload:
    try:
        value = snapshot_json(raw)
    except NonJsonValueError as exc:
        return _Payload(problem=str(exc))
    return _Payload(value, size=_compact_size(value, text_bytes=text_bytes) if measure else 0)


_CONTAINER_KINDS: Final = frozenset({tuple, FrozenDict})
# The text _compact_size encodes in one C call when it can tell items are small: a slice of
# items about this long, so the lock is never held for long (milliseconds).
_SLICE_BYTES: Final = 256 * 1024
# Items this long or shorter on average (by the frame's length) are encoded a slice at a time.
_SMALL_ITEM_BYTES: Final = 4096
# How many scalars make a slice when there is no frame length to go by.
_SCALARS_PER_SLICE: Final = 20_000


def _compact_size(value: JsonValue, levels: int = 2, text_bytes: int | None = None) -> int:
    """The UTF-8 size of ``value``'s compact JSON (a snapshot's), encoding its outer containers a part at a time.

    Encoding is one C call that holds the interpreter's lock all along: on a
    worker thread, a wide value encoded in one go would stall the event loop's
    thread as long. The outer ``levels`` are split, where a wide value's width is:
    an array's items a slice at a time when they are scalars or, by
    ``text_bytes`` (the length of the text the value was read from, a hint
    that bounds its size), small on average; else one by one (one call per
    item was 1.5 s for a million numbers, 1 s for 200 000 small objects).
    """
    if levels and type(value) is tuple and value:
        if _CONTAINER_KINDS.isdisjoint(map(type, value)):
            step = _SCALARS_PER_SLICE
        elif text_bytes is not None and text_bytes // len(value) <= _SMALL_ITEM_BYTES:
            step = max(1, _SLICE_BYTES // max(text_bytes // len(value), 1))
        else:
            return len(value) + 1 + sum(_compact_size(item, levels - 1, text_bytes) for item in value)
        # A slice's text is its items, the commas between them and two brackets; the slices
        # are joined by commas.
        slices = range(0, len(value), step)
        items = sum(_utf8_size(encode_json(value[start : start + step], ascii_only=False)) - 2 for start in slices)
        return 2 + items + len(slices) - 1
    if levels and type(value) is FrozenDict and value:
        members = sum(
            _utf8_size(encode_json(key, ascii_only=False)) + 1 + _compact_size(item, levels - 1, text_bytes)
            for key, item in value.items()
        )
        return len(value) + 1 + members
    return _utf8_size(encode_json(value, ascii_only=False))


def _holds_more_values(line: bytes, limit: int) -> bool:
    """Whether the JSON document ``line`` holds more than ``limit`` values (or, when it is not JSON, might).

    A value takes a byte of its own, so a line no longer than ``limit`` cannot.
    Characters inside strings only add to the quick count, so strings are
    skipped (slowly) only when it passes ``limit``.
    """
    if len(line) <= limit or _json_values(line) <= limit:
        return False
    return _json_values_past_strings(line) > limit


def _json_values(text: bytes) -> int:
    """How many JSON values ``text`` holds: exact for compact JSON with no string, never below otherwise.

    A value is the document itself, an array item or an object member's value:
    one more than the commas and the containers that are not empty.
    """
    opened = text.count(b"[") + text.count(b"{") - text.count(b"[]") - text.count(b"{}")
    return 1 + text.count(b",") + opened


def _json_values_past_strings(line: bytes) -> int:
    """:func:`_json_values` with every string's content left out: exact for compact JSON."""
    # With escaped backslashes and quotes gone, every quote opens or closes a string.
    text = line.replace(b"\\\\", b"").replace(b'\\"', b"")
    values = 1
    in_string = False
    for start in range(0, len(text), _COUNT_SLICE):
        part = text[start : start + _COUNT_SLICE]
        if in_string:
            part = b'"' + part
        # Each string becomes "" (not nothing: ["a"] must not turn into an empty array). A
        # container cut in two by a slice's end counts as not empty: a value too many, at most.
        values += _json_values(_BARE_JSON_STRING.sub(b'""', part)) - 1
        in_string = part.count(b'"') % 2 == 1
    return values


_MAX_ERROR_CHARS: Final = 16 * 1024
# Tool calls a program may have waiting on the host at once, by number and by the bytes of
# their call frames plus the replies the child has not read yet. Each call costs the host a
# task or two and holds its arguments, each unread reply its frame; past either cap the host
# reads no further frame until a call is answered or a reply read, so a program that fires
# calls in a loop without awaiting them, or without reading what they return, is slowed down
# (or stopped until its wall-clock budget ends the run), not able to exhaust the host's
# memory. A call larger than the byte cap (up to ``max_frame_bytes``) is read when nothing
# else is in flight or unread. (Answers never wait for the reader nor for the child to read
# them, and the child reads its replies while a frame it sends waits for the pipe, so a
# child that reads its replies never waits for the host while the host waits for it.)
MAX_CALLS_IN_FLIGHT: Final = 1024
MAX_CALL_BYTES_IN_FLIGHT: Final = 64 * 1024 * 1024


def _capped(message: str) -> str:
    """A program's error message, bounded: the program writes it, and the model reads it."""
    if len(message) <= _MAX_ERROR_CHARS:
        return message
    return f"{message[:_MAX_ERROR_CHARS]}… [{len(message) - _MAX_ERROR_CHARS} more characters not shown]"


class _LineTooLong(Exception):
    def __init__(self, prefix: bytes) -> None:
        super().__init__()
        self.prefix = prefix


class _LineReader:
    """Splits a byte stream into ``\\n``-terminated lines of at most ``limit`` bytes."""

    def __init__(self, stream: trio.abc.ReceiveStream, limit: int) -> None:
        self._stream = stream
        self._limit = limit
        self._buffer = bytearray()
        self._scanned = 0
        self.received = 0  # bytes taken from the stream so far: how the reader is seen to go on

    async def receive_line(self) -> bytes | None:
        """The next line without its newline; None at end of stream (a partial last line is dropped)."""
        while True:
            newline = self._buffer.find(b"\n", self._scanned)
            if newline >= 0:
                if newline > self._limit:
                    raise _LineTooLong(bytes(self._buffer[:80]))
                line = bytes(self._buffer[:newline])
                del self._buffer[: newline + 1]
                self._scanned = 0
                return line
            self._scanned = len(self._buffer)
            if self._scanned > self._limit:
                raise _LineTooLong(bytes(self._buffer[:80]))
            chunk = await self._stream.receive_some(256 * 1024)
            if not chunk:
                return None
            self.received += len(chunk)
            self._buffer += chunk


def _utf8_size(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))


def _cut_utf8(text: str, limit: int) -> str:
    return text.encode("utf-8", "surrogatepass")[: max(limit, 0)].decode("utf-8", "ignore")


@attrs.frozen
class _Refusal:
    """A call that failed before there was anything to await: the message of its reply."""

    message: str


def _binding_message(exc: Exception) -> str:
    try:
        message = str(exc)
    except Exception:
        message = ""
    return message or type(exc).__name__


class _Session:
    """The host's side of one run: the log ledger, the calls in flight, the child's stderr tail."""

    _STDERR_TAIL: ClassVar[int] = 4096

    def __init__(self, runtime: SubprocessPythonRuntime, bindings: dict[str, Binding]) -> None:
        self._bindings = bindings
        self._max_output = runtime.max_output_bytes
        self._max_frame = runtime.max_frame_bytes
        self._max_values = runtime.max_json_values
        self._max_cpu_s = runtime.max_cpu_s
        self._logs: list[str] = []
        self._line: list[str] = []  # the flushed parts of a line the program has not ended yet
        self._used = 0
        self._in_flight: set[int] = set()
        # The awaitable of each call in flight that can be cancelled (see the cancel frame).
        self._cancellable: dict[int, Callable[[], object]] = {}
        self._bytes_in_flight = 0
        self._room: trio.Event | None = None  # set when a call in flight is answered or a reply written
        # Frames for the child not yet written, in order; the head may be partly written.
        self._outbox: deque[bytes] = deque()
        self._outbox_bytes = 0  # their size: held against MAX_CALL_BYTES_IN_FLIGHT
        self._outbox_filled: trio.Event | None = None  # what the idle writer waits on; _send sets it
        self._stdin_fd: int | None = None
        self._stdin_gone = False
        self._stderr = bytearray()
        self._stderr_closed = trio.Event()
        # What reached descriptors 1 and 2 (a subprocess's output, os.write): its unfinished line,
        # and how many bytes of it the output limit left out.
        self._written = bytearray()
        self._written_lines = 0
        self._written_dropped = 0
        self._decoding: trio.Event | None = None  # while a frame is decoded off the loop: set when it is
        self._reader: _LineReader | None = None
        self._frames = 0  # frames the reader has taken
        self._child_exited = False

    def fail(self, kind: CodeRunErrorKind, message: str) -> CodeRunResult:
        # A line the program flushed but never ended (its last words before a timeout) is kept.
        self._end_line()
        return CodeRunResult(logs=self._logs_with_written(), error=CodeRunError(kind=kind, message=message))

    async def drive(self, process: trio.Process, run_frame: bytes) -> CodeRunResult:
        assert process.stdin is not None and process.stdout is not None and process.stderr is not None
        fileno = getattr(process.stdin, "fileno", None)
        self._stdin_fd = fileno() if fileno is not None else None
        async with trio.open_nursery() as tasks:
            tasks.start_soon(self._drain_stderr, process.stderr)
            tasks.start_soon(self._write_out, process.stdin)
            self._send(run_frame)
            ended: CodeRunResult | Callable[[], CodeRunResult] | None = None
            with trio.CancelScope() as reading:
                tasks.start_soon(_stop_reading_after_exit, process, reading, self)
                ended = await self._read(process, process.stdout, tasks)
            if ended is None:
                result = await self._worker_exit(process)
            elif isinstance(ended, CodeRunResult):
                result = ended
            else:
                # Done: the child leaves right after its done frame, and what it left running in its
                # group is killed then (_stop_reading_after_exit), so the stderr pipe, holding what its
                # subprocesses wrote, ends at once (unless a process that left the group holds it).
                with trio.move_on_after(EXIT_GRACE_S):
                    await self._stderr_closed.wait()
                result = ended()
            # The run is over: binding calls still in flight are abandoned.
            tasks.cancel_scope.cancel()
        return result

    async def _read(
        self, process: trio.Process, stdout: trio.abc.ReceiveStream, tasks: trio.Nursery
    ) -> CodeRunResult | Callable[[], CodeRunResult]:
        """Serve the child's frames: how the run failed, or (done) what makes its result once stderr is read."""
        reader = self._reader = _LineReader(stdout, self._max_frame)
        while True:
            try:
                line = await reader.receive_line()
            except _LineTooLong as exc:
                return self.fail(
                    "protocol",
                    f"the child sent a line longer than {self._max_frame} bytes, starting {_show(exc.prefix)}",
                )
            if line is None:
                return await self._worker_exit(process)
            try:
                frame, payload = await self._decode(line)
            except _TooManyValues:
                return self.fail(
                    "protocol",
                    f"the child sent a frame holding more than {self._max_values} JSON values"
                    f" (max_json_values), starting {_show(line[:80])}",
                )
            except _FrameError as exc:
                return self.fail("protocol", f"the child sent a malformed frame ({exc}): {_show(line[:80])}")
            self._frames += 1
            match frame:
                case _Call(id=call_id):
                    if call_id in self._in_flight:
                        return self.fail("protocol", f"the child reused call id {call_id} while it was in flight")
                    if self._child_exited:
                        continue  # nobody is left to answer: read on, to the done frame it may have sent
                    size = len(line)
                    while not self._has_room_for(size):
                        self._room = trio.Event()
                        await self._room.wait()
                        if self._child_exited:
                            break
                    if self._child_exited:
                        continue
                    self._in_flight.add(call_id)
                    self._bytes_in_flight += size
                    completes_at_once = getattr(self._bindings.get(frame.name), "completes_at_once", None)
                    at_once = completes_at_once is not None and completes_at_once()
                    # Called here, in the order the program made its calls: what the binding
                    # does on a call (number it, queue it) follows that order.
                    answer = self._call_binding(frame, payload)
                    cancel = getattr(answer, "cancel", None)
                    if callable(cancel):
                        self._cancellable[call_id] = cancel
                    if at_once:
                        await self._serve(frame, size, answer)  # it cannot hold the reader up
                    else:
                        tasks.start_soon(self._serve, frame, size, answer)
                case _Cancel(id=call_id):
                    cancel = self._cancellable.pop(call_id, None)
                    if cancel is not None:
                        cancel()
                case _Log(text=text, partial=partial):
                    if not self._log(text, partial):
                        return self.fail("output-limit", f"program output exceeded {self._max_output} bytes")
                case _Done(error=CodeRunError() as error):
                    self._end_line()
                    return lambda: CodeRunResult(logs=self._logs_with_written(), error=error)
                case _Done(has_value=False):
                    self._end_line()
                    return lambda: CodeRunResult(logs=self._logs_with_written())
                case _Done():
                    self._end_line()
                    return lambda: self._with_value(payload)

    async def _decode(self, line: bytes) -> tuple[_Frame, _Payload | None]:
        """``line`` as a frame, and its call arguments or returned value checked (see :func:`_decode_frame`)."""
        if len(line) <= _INLINE_FRAME_BYTES:
            return _decode_frame(line, self._max_values)
        # Decoding and snapshotting a large frame takes seconds, per value: on the loop it would
        # hold every other task of the host, and the run's own deadline, until it was done.
        # Abandoned when the deadline cancels the run (the value cap bounds what it still costs).
        decoding = self._decoding = trio.Event()
        try:
            return await trio.to_thread.run_sync(_decode_frame, line, self._max_values, abandon_on_cancel=True)
        finally:
            decoding.set()
            self._decoding = None

    def child_exited(self) -> None:
        """The child is gone: calls still to read are not served, and a reader waiting for room reads on."""
        self._child_exited = True
        self._made_room()

    def progress(self) -> int:
        """Grows while the reader goes on (bytes read, frames taken): see :func:`_stop_reading_after_exit`."""
        return (self._reader.received if self._reader is not None else 0) + self._frames

    async def frame_decoded(self) -> None:
        """Until the frame being decoded off the loop, if one is, has been."""
        if self._decoding is not None:
            await self._decoding.wait()

    def _log(self, text: str, partial: bool = False) -> bool:
        """Take one log entry, or (``partial``) a flushed part of one; ``False`` once the output limit is hit.

        Each entry counts its newline, a line sent in parts with its first part.
        """
        newline = 0 if self._line else 1
        size = _utf8_size(text) + newline
        if self._used + size > self._max_output:
            prefix = _cut_utf8(text, self._max_output - self._used - newline)
            if prefix:
                self._line.append(prefix)
            self._end_line()
            self._used = self._max_output
            return False
        self._used += size
        self._line.append(text)
        if not partial:
            self._end_line()
        return True

    def _end_line(self) -> None:
        if self._line:
            self._logs.append("".join(self._line))
            self._line.clear()

    def _with_value(self, returned: _Payload | None) -> CodeRunResult:
        assert returned is not None  # _decode_frame checks every done frame's value
        if returned.problem is not None:
            return self.fail(
                "invalid-output", f"the program returned a value that is not lossless JSON: {returned.problem}"
            )
        if self._used + returned.size > self._max_output:
            return self.fail("output-limit", f"program output exceeded {self._max_output} bytes")
        return _returned(self._logs_with_written(), returned.value)

    def _has_room_for(self, size: int) -> bool:
        if not self._in_flight and not self._outbox_bytes:
            return True  # one call is always let in, however large: nothing else can make room
        held = self._bytes_in_flight + self._outbox_bytes
        return len(self._in_flight) < MAX_CALLS_IN_FLIGHT and held + size <= MAX_CALL_BYTES_IN_FLIGHT

    def _made_room(self) -> None:
        if self._room is not None:
            self._room.set()
            self._room = None

    def stall_note(self) -> str:
        """Why the run was stuck when its budget ran out, if the host was holding its calls back."""
        if self._room is None or not self._outbox_bytes:
            return ""  # the reader is not waiting for room, or not for the child to read
        return (
            f"; it had stopped reading the results of its tool calls ({self._outbox_bytes} bytes of them"
            " waiting), so the host held its further calls back"
        )

    async def _serve(self, call: _Call, size: int, answer: Awaitable[JsonValue] | _Refusal) -> None:
        try:
            if isinstance(answer, _Refusal):
                reply = {"type": "reply", "id": call.id, "ok": False, "message": answer.message}
            else:
                reply = await self._reply(call, answer)
        finally:
            self._in_flight.discard(call.id)
            self._cancellable.pop(call.id, None)
            self._bytes_in_flight -= size
            self._made_room()
        try:
            data = encode_json(reply)
        except (ValueError, TypeError) as exc:
            data = encode_json(
                {"type": "reply", "id": call.id, "ok": False, "message": f"result cannot be sent: {exc}"}
            )
        self._send((data + "\n").encode("ascii"))

    def _call_binding(self, call: _Call, arguments: _Payload | None) -> Awaitable[JsonValue] | _Refusal:
        """What calling the binding returned, to await; or why the call failed at once."""
        assert arguments is not None  # _decode_frame checks every call's arguments
        binding = self._bindings.get(call.name)
        if binding is None:
            return _Refusal(f"unknown tool {call.name!r}")
        if arguments.problem is not None:
            return _Refusal(f"tool arguments must be lossless JSON: {arguments.problem}")
        try:
            return binding(arguments.value)
        except Exception as exc:
            return _Refusal(_binding_message(exc))

    async def _reply(self, call: _Call, answer: Awaitable[JsonValue]) -> dict[str, Any]:
        try:
            value = await answer
        except Exception as exc:
            return {"type": "reply", "id": call.id, "ok": False, "message": _binding_message(exc)}
        try:
            value = snapshot_json(value)
        except NonJsonValueError as exc:
            return {
                "type": "reply",
                "id": call.id,
                "ok": False,
                "message": f"the tool returned a non-JSON value: {exc}",
            }
        return {"type": "reply", "id": call.id, "ok": True, "value": value}

    def _send(self, data: bytes) -> None:
        """Write ``data`` to the child, or queue it for :meth:`_write_out`; never waits.

        The reader sends too (a call it serves itself), and a child that prints
        without reading its replies must not stop the reader reading what it prints.
        """
        if self._stdin_gone:
            return  # the child is gone: the reader sees the end of the stream
        if not self._outbox and self._stdin_fd is not None:
            # A reply usually fits the pipe at once: write it straight away instead of
            # waking the writer (a scheduler round). With nothing queued, this is in order.
            try:
                written = os.write(self._stdin_fd, data)
            except BlockingIOError:
                written = 0
            except OSError:
                self._stdin_gone = True
                return
            if written == len(data):
                return
            data = data[written:]
        self._outbox.append(data)
        self._outbox_bytes += len(data)
        if self._outbox_filled is not None:
            self._outbox_filled.set()
            self._outbox_filled = None

    async def _write_out(self, stdin: trio.abc.SendStream) -> None:
        """Write the queued frames in order, as the child reads them."""
        try:
            while True:
                while self._outbox:
                    # Left at the head while it is written, so that _send queues behind it.
                    await stdin.send_all(self._outbox[0])
                    self._outbox_bytes -= len(self._outbox.popleft())
                    self._made_room()
                self._outbox_filled = trio.Event()
                await self._outbox_filled.wait()
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._stdin_gone = True  # a child that is gone shows up as end of stream on the reader
            self._outbox.clear()
            self._outbox_bytes = 0
            self._made_room()

    async def _drain_stderr(self, stderr: trio.abc.ReceiveStream) -> None:
        try:
            while chunk := await stderr.receive_some(64 * 1024):
                self._stderr += chunk
                del self._stderr[: -self._STDERR_TAIL]
                self._take_written(chunk)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self._stderr_closed.set()

    def _take_written(self, chunk: bytes | bytearray) -> None:
        """Log each complete line written to descriptor 1 or 2 (``sys.stdout`` and ``sys.stderr`` send frames).

        A subprocess the program runs (``os.system``, ``subprocess.run`` without
        capturing) writes there. Its lines count against ``max_output_bytes`` as
        printed ones do, and at most ``MAX_WRITTEN_LINES`` are kept (``yes`` writes
        tens of millions a second, each a string here); past either they are
        counted, not kept, and the run goes on.
        """
        if self._written_dropped:
            self._written_dropped += len(chunk)  # past the limit: nothing more is split or kept
            return
        self._written += chunk
        start = 0
        while (newline := self._written.find(b"\n", start)) >= 0:
            self._log_written(bytes(self._written[start:newline]))
            start = newline + 1
        del self._written[:start]
        if len(self._written) >= _WRITTEN_LINE_BYTES:
            self._log_written(bytes(self._written), ended=False)
            self._written.clear()

    def _log_written(self, line: bytes, *, ended: bool = True) -> None:
        text = line.removesuffix(b"\r").decode("utf-8", "replace")
        # An entry counts its newline, as a printed line does; one that ends a line the program
        # printed and flushed unfinished joins it (as a terminal shows it), whose newline counted.
        size = _utf8_size(text) + (0 if self._line else 1)
        if self._written_dropped or self._used + size > self._max_output or self._written_lines == MAX_WRITTEN_LINES:
            self._written_dropped += len(line) + ended
            return
        self._used += size
        self._written_lines += 1
        self._line.append(text)
        self._end_line()

    def _logs_with_written(self) -> list[str]:
        """The logs, with an unfinished written line and a note of what the limit left out."""
        if self._written:
            self._log_written(bytes(self._written), ended=False)
            self._written.clear()
        if self._written_dropped:
            self._logs.append(
                f"[{self._written_dropped} more bytes written to descriptors 1 and 2 were not kept: past "
                f"max_output_bytes or {MAX_WRITTEN_LINES} lines]"
            )
            self._written_dropped = 0
        return self._logs

    async def _worker_exit(self, process: trio.Process) -> CodeRunResult:
        code = await process.wait()
        # A grandchild may hold stderr open; do not wait for it long.
        with trio.move_on_after(0.5):
            await self._stderr_closed.wait()
        status = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        message = f"the Python process {status} before the program finished"
        if code == -getattr(signal, "SIGXCPU", -1) and self._max_cpu_s is not None:
            message += f" (it used up its CPU budget, max_cpu_s={self._max_cpu_s})"
        elif code == -signal.SIGKILL and self._max_cpu_s is not None:
            # The child ends its processes on the budget's warning (SIGXCPU), which reaches Python
            # code only between two bytecodes: inside one long C call the hard limit kills it.
            message += (
                f" (most likely its CPU budget, max_cpu_s={self._max_cpu_s}, ran out inside one long call, "
                "and the hard limit a second later killed it; the system's out-of-memory killer sends SIGKILL too)"
            )
        tail = self._stderr.decode("utf-8", "replace").strip()
        if tail:
            message += f"; its stderr ends with:\n{tail[-2000:]}"
        return self.fail("worker-exit", message)


def _show(data: bytes) -> str:
    return repr(data.decode("utf-8", "replace"))
