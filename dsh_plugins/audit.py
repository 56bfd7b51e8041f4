"""The audit log: one JSON line per tool call, appended to a file.

Configure it in ``[plugins.audit]``::

    [plugins.audit]
    path = "dsh-audit.jsonl"   # relative to the configuration file's directory

Every call that reaches ``ToolRuntime.execute`` produces exactly one line
(denied, invalid, unknown and aborted calls included, and calls cut short: see
below; only a call cut while its arguments are still being copied, before it
has an execution, reaches no hook and gets none), written when its final
result is observed (``dsh_result``)::

    {"ts": "2026-05-01T12:00:00.123+00:00", "call_id": "c1", "root_call_id": "c1",
     "tool": "read_file", "agent": "main", "arguments": {"path": "README.md"},
     "outcome": "error", "error_code": "DENIED", "error_message": "...",
     "plugin": "permissions", "duration_ms": null}

``agent`` is the :class:`dsh_core.Agent` id (another scope key as ``str()``;
``null`` without one); ``arguments`` is ``null`` when the call's arguments were
not JSON; ``plugin`` is the plugin the failure is blamed on. ``duration_ms`` is
the dispatch time (wrappers, body and output checks), measured on trio's clock
by an outermost (``tryfirst``) ``dsh_execute`` wrapper; it is ``null`` for a
call that was never dispatched (denied, invalid arguments, unknown tool), so
time spent waiting for an approval never counts as tool time.

When a policy rewrote the call's arguments (``Rewrite``), ``arguments`` are
the ones that ran and a ``"rewrites"`` list records each change as
``{"by", "reason", "from", "to"}``, so the line also shows what the model asked for
(a ``from`` or ``to`` nested deeper than ``MAX_DEPTH`` is ``null``, with a
``from_omitted`` or ``to_omitted`` note, as such arguments are).

A call the host's own trio cancel scope cuts short (a turn deadline, Ctrl-C
handling) has no result: ``trio.Cancelled`` leaves ``execute`` and
``dsh_result`` never runs. It still gets exactly one line, written as it
unwinds (``dsh_call_unwound``), wherever it was cut: in a policy, awaiting
approval, in its dispatch, in a post-execute listener, or in
``run_tool_calls`` waiting for a resource key or to be committed in model
order behind a slower call. ``outcome`` is ``"cancelled"``, ``error_code`` and
``plugin`` are ``null``, ``error_message`` names what cut it, ``duration_ms``
is the dispatch time until then (``null`` when it was never dispatched), and an
extra ``"body_started"`` says whether the body was invoked (its effect may have
happened). The same holds for a ``KeyboardInterrupt`` or ``SystemExit``, and
for a call whose own signal fired as the host cut it. A call
``run_tool_calls`` had not begun (its policy had not started) gets no line: it
never reached the pipeline.

The log never blocks or breaks the pipeline. Each line is one ``os.write`` on a
descriptor opened with ``O_APPEND`` (lines of concurrent writers do not
interleave; a small write to a local file does not stall the event loop). A
failed write (full disk, ``ENOSPC``; a vanished mount) is logged as a warning
once per kind of error and the call goes on; a line cut short by a failure is
terminated before the next one, so later lines stay parseable. The same holds
across processes: a file that ends in a partial line (a writer crashed
mid-line) gets that line terminated, with a warning, before the first new
record, so that record is not glued to it and lost. Arguments
nested deeper than :data:`MAX_DEPTH` levels, or that cannot be serialised at
all, are written as ``null`` with an ``"arguments_omitted"`` note saying why.
The file is created ``0600``: arguments may contain secrets.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import json
import logging
import os
import stat
import time
import weakref
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Final

import attrs
import trio

from dsh_core import (
    ConfigError,
    ToolDispatchExecution,
    ToolExecution,
    ToolExecutionResult,
    ToolExecutionToken,
    ToolRuntime,
    hookimpl,
    nests_deeper_than,
    scope_id,
    structure_table,
)
from dsh_core.presentation import json_printable

from ._cut_short import cut_short_message
from ._file_settings import PathSetting, kept_path

__all__ = ["MAX_DEPTH", "PLUGIN_NAME", "AuditLog", "AuditSettings", "audit_record"]

# Capability manifest (enforced under strict_capabilities): an observer: it registers no tools and decides nothing.
DSH_CAPABILITIES: dict[str, list[str]] = {"tools": [], "affects": []}

PLUGIN_NAME: Final = "audit-log"

logger = logging.getLogger("dsh_plugins.audit")

# How often a write looks whether the audit path still names the file it writes to.
_PATH_CHECK_SECONDS: Final = 1.0

_OPEN_FLAGS: Final = os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)


@attrs.frozen(kw_only=True)
class AuditSettings:
    """The ``[plugins.audit]`` table."""

    path: PathSetting | None = attrs.field(default=None, validator=kept_path)


MAX_DEPTH: Final = 200
"""Arguments nested deeper than this are omitted from the line.

``json.dumps`` raises ``RecursionError`` on deep values on some Python versions
and not on others; a fixed limit makes every version write the same line.
"""


def audit_record(
    execution: ToolExecution, result: ToolExecutionResult, *, duration_ms: float | None, now: datetime.datetime
) -> dict[str, Any]:
    """The audit entry of one call as JSON-ready data (``arguments`` is the call's frozen snapshot)."""
    info = result.error.info if result.is_error and result.error is not None else None
    # A policy's Rewrite: the audit shows what the model asked for, not only what ran.
    rewrites = [
        _bounded_rewrite(context.meta["rewrite"])
        for context in result.additional_contexts
        if isinstance(context.meta, Mapping) and "rewrite" in context.meta
    ]
    return _record(
        execution,
        now,
        "error" if result.is_error else "success",
        info.code if info is not None else None,
        result.error.message if result.error is not None else None,
        info.plugin if info is not None else None,
        duration_ms,
        {"rewrites": rewrites} if rewrites else None,
    )


def _bounded_rewrite(note: Any) -> Any:
    """A rewrite's note with a ``from`` or ``to`` nested past :data:`MAX_DEPTH` omitted, as arguments are.

    Written whole, it failed the line's encoding, which then dropped the (small)
    arguments that ran and wrote the rewrites as one Python repr string.
    """
    if not isinstance(note, Mapping):
        return note
    deep = [side for side in ("from", "to") if nests_deeper_than(note.get(side), MAX_DEPTH)]
    if not deep:
        return note
    bounded = dict(note)
    for side in deep:
        bounded[side] = None
        bounded[f"{side}_omitted"] = f"nested deeper than {MAX_DEPTH} levels"
    return bounded


def _cut_short_record(
    execution: ToolExecution,
    *,
    cause: BaseException,
    body_started: bool,
    duration_ms: float | None,
    now: datetime.datetime,
) -> dict[str, Any]:
    """The audit entry of a call cut short, which has no result.

    (The notes of a ``Rewrite`` ride the result, so this entry has none: its
    ``arguments`` are the ones the call had when it was cut.)
    """
    message = cut_short_message(cause)
    return _record(execution, now, "cancelled", None, message, None, duration_ms, {"body_started": body_started})


def _record(
    execution: ToolExecution,
    now: datetime.datetime,
    outcome: str,
    error_code: str | None,
    error_message: str | None,
    plugin: str | None,
    duration_ms: float | None,
    extra: dict[str, Any] | None,
) -> dict[str, Any]:
    arguments = execution.arguments
    omitted: dict[str, Any] = {}
    if nests_deeper_than(arguments, MAX_DEPTH):  # checked on the frozen value, before paying for a copy
        arguments = None
        omitted["arguments_omitted"] = f"arguments nested deeper than {MAX_DEPTH} levels"
    return {
        "ts": now.astimezone(datetime.UTC).isoformat(timespec="milliseconds"),
        "call_id": execution.call_id,
        "root_call_id": execution.root_call_id,
        "tool": execution.name,
        "agent": scope_id(execution.agent),
        # A frozen snapshot serialises as is (FrozenDict is a dict, arrays are tuples): no copy.
        "arguments": arguments,
        "outcome": outcome,
        "error_code": error_code,
        "error_message": error_message,
        "plugin": plugin,
        "duration_ms": duration_ms,
        **omitted,
        **(extra or {}),
    }


# json.dumps builds an encoder per call; one line per tool call reuses this one.
_ENCODER: Final = json.JSONEncoder(ensure_ascii=False, allow_nan=False)


def _dumps(record: dict[str, Any]) -> str:
    return _ENCODER.encode(record)


def _encode(record: dict[str, Any]) -> bytes:
    """One line of UTF-8 JSON; never raises.

    Lone surrogates (legal in Python strings, not in UTF-8) are written as
    ``\\udXXX`` escapes, which is still valid JSON since they only occur inside
    JSON strings.
    """
    try:
        text = _dumps(record)
    except Exception as exc:  # RecursionError (deep arguments), ValueError, TypeError
        note = f"{type(exc).__name__}: arguments could not be serialised ({exc})"
        record = {**record, "arguments": None, "arguments_omitted": note}
        try:
            text = _dumps(record)
        except Exception:
            safe = {key: value if value is None or type(value) in (str, int, float, bool) else repr(value)
                    for key, value in record.items()}  # fmt: skip
            text = json.dumps(safe, ensure_ascii=True, default=repr)
    # A model's C1 controls and bidi overrides as \u escapes: the file is read on terminals
    # (tail -f, jq), which act on them raw.
    return (json_printable(text) + "\n").encode("utf-8", "backslashreplace")


class AuditLog:
    """The audit observer of one runtime, writing to one file.

    ``path`` is made absolute at construction (a later ``chdir`` does not move
    the log) and checked: its directory must exist and be writable, else
    :class:`ConfigError`. The file itself is opened (created ``0600``) at the
    first line, so a host that runs no call leaves no empty log behind; a
    failure to open it then is reported like a failed write. The descriptor is
    closed by :meth:`close` or when the object is collected; :meth:`reopen`
    supports log rotation.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.path.abspath(os.fspath(path))
        _check_writable(self.path)
        self._fd: int | None = None
        self._closed = False
        self._closer: weakref.finalize[Any, Any] | None = None
        self._durations: weakref.WeakKeyDictionary[ToolExecutionToken, float] = weakref.WeakKeyDictionary()
        self._warned: set[str] = set()
        self._broken_line = False
        self._next_path_check = 0.0  # when to look again whether the path still names the open file

    def _descriptor(self) -> int:
        if self._fd is None:
            self._fd = _open_regular(self.path)
            self._closer = weakref.finalize(self, _close_quietly, self._fd)
            if _ends_mid_line(self._fd, self.path):
                # An earlier writer died mid-line: end that line first, or the
                # next record would be glued to it and unreadable too.
                self._broken_line = True
                logger.warning(
                    "audit log %s ends in a partial line (an earlier writer stopped mid-line); "
                    "terminating it so new records start on a line of their own",
                    self.path,
                )
        return self._fd

    def _follow_path(self) -> None:
        """Reopen ``path`` when it no longer names the open file (deleted, or rotated away and recreated).

        Written on regardless, the records went to an unlinked file, lost, or
        into the rotated one; looked at once a second at most.
        """
        self._next_path_check = time.monotonic() + _PATH_CHECK_SECONDS
        assert self._fd is not None
        try:
            now = os.stat(self.path)
        except FileNotFoundError:
            now = None
        except OSError:
            return  # cannot tell: keep writing where it writes
        held = os.fstat(self._fd)
        if now is not None and (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
            return
        logger.warning(
            "audit log %s was %s while open; writing to a new file at that path",
            self.path,
            "deleted or moved away" if now is None else "replaced by another file",
        )
        self.reopen()

    def close(self) -> None:
        """Close the file; later results are not recorded. Idempotent."""
        self._closed = True
        self._release()

    def reopen(self) -> None:
        """Close the file and write to ``path`` afresh (after a log rotation moved it away)."""
        self._release()
        self._closed = False
        self._broken_line = False

    def _release(self) -> None:
        if self._closer is not None:
            self._closer()
        self._fd = None
        self._closer = None

    @hookimpl(tryfirst=True)
    async def dsh_execute(
        self, execution: ToolDispatchExecution, next: Callable[[], Awaitable[ToolExecutionResult]]
    ) -> ToolExecutionResult:
        start = trio.current_time()
        try:
            return await next()
        finally:
            # Also when the dispatch is cut short: the line written as the call unwinds keeps it.
            self._durations[execution.token] = (trio.current_time() - start) * 1000

    @hookimpl
    def dsh_result(self, execution: ToolExecution, result: ToolExecutionResult) -> None:
        duration = self._durations.pop(execution.token, None)
        record = audit_record(execution, result, duration_ms=duration, now=datetime.datetime.now(datetime.UTC))
        self.write(_encode(record))

    @hookimpl
    def dsh_call_unwound(self, execution: ToolExecution, cause: BaseException, body_started: bool) -> None:
        """A call cut short with no result: its line is written now, or never; never raises.

        Synchronous, and so is the write: an await while a cancellation unwinds
        would only be cancelled again.
        """
        try:
            record = _cut_short_record(
                execution,
                cause=cause,
                body_started=body_started,
                duration_ms=self._durations.pop(execution.token, None),
                now=datetime.datetime.now(datetime.UTC),
            )
            self.write(_encode(record))
        except Exception as error:  # contained by the runtime too, but with less to say
            logger.warning("audit log %s: cannot record call %s cut short: %s", self.path, execution.call_id, error)

    def write(self, line: bytes) -> None:
        """Append one encoded line; failures are logged (once per kind) and swallowed."""
        if self._closed:
            return
        written = ended = 0
        try:
            if self._fd is not None and time.monotonic() >= self._next_path_check:
                self._follow_path()
            fd = self._descriptor()  # first: opening the file may find a partial line to end
            if self._broken_line:
                line, ended = b"\n" + line, 1
            while written < len(line):  # a short write: finish the line, so it is not joined to the next
                more = os.write(fd, line[written:])
                if more <= 0:
                    raise OSError(errno.EIO, "the file accepted no more bytes")
                written += more
                # Kept current after every write, so an exception at any point leaves it right: only
                # bytes of the record in the file make a partial line to end; a write refused whole
                # (or a file that did not open) leaves the file, and so the flag, as it was.
                self._broken_line = written > ended
            self._broken_line = False
        except OSError as exc:
            kind = errno.errorcode.get(exc.errno, type(exc).__name__) if exc.errno else type(exc).__name__
            if kind not in self._warned:
                self._warned.add(kind)
                logger.warning("audit log %s: cannot write (%s): %s; calls continue unrecorded", self.path, kind, exc)


def _open_regular(path: str) -> int:
    """``path`` opened for appending, if it is a regular file; raises ``OSError`` otherwise.

    Opened without blocking and checked by the descriptor: a FIFO there (made
    after start-up, say) blocked the first record's open, and the whole host
    with it, until something read it; a device would swallow the records.
    """
    fd = os.open(path, _OPEN_FLAGS | getattr(os, "O_NONBLOCK", 0), 0o600)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file (a FIFO, a device or a socket); an audit log must be one")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_writable(path: str) -> None:
    directory = os.path.dirname(path)
    if os.path.exists(path):
        if os.path.isdir(path) or not os.access(path, os.W_OK):
            raise ConfigError([f"[plugins.audit].path: {path!r} is not a writable file"])
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise ConfigError([f"[plugins.audit].path: {path!r} is not a regular file (a FIFO, a device or a socket)"])
    elif not os.path.isdir(directory):
        raise ConfigError([f"[plugins.audit].path: cannot create {path!r}: the directory {directory!r} does not exist"])
    elif not os.access(directory, os.W_OK):
        raise ConfigError([f"[plugins.audit].path: cannot create {path!r}: the directory is not writable"])


def _ends_mid_line(fd: int, path: str) -> bool:
    """Whether the file open as ``fd`` is non-empty and its last byte is not a newline."""
    size = os.fstat(fd).st_size
    if size == 0:
        return False
    try:
        # ``fd`` is write-only; a log we may append to but not read is left as it is.
        with open(path, "rb") as reader:
            reader.seek(size - 1)
            last = reader.read(1)
    except OSError:
        return False
    return last not in (b"\n", b"")  # b"": the file shrank meanwhile (rotated, truncated)


def _close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


@hookimpl
def dsh_setup(runtime: ToolRuntime, config: dict[str, Any]) -> None:
    """Register a fresh :class:`AuditLog` for ``runtime`` (named ``audit-log``; the entry-point module itself is ``audit``)."""
    settings = structure_table(AuditSettings, config, "[plugins.audit]")
    if settings.path is None:
        # Opt-in: installing the package must not start writing files in every
        # working directory; configure [plugins.audit] path = "..." to audit.
        return
    if runtime.dry_run:
        return  # a rehearsal (dsh-tools simulate): no call happens, nothing to audit
    log = AuditLog(settings.path)
    clash = runtime.kept_file(log.path)
    if clash is not None:
        # Two writers of two formats in one file: the other's reader refuses it from the first line.
        raise ConfigError([f"[plugins.audit].path: {log.path!r} is {clash}; the audit log needs a file of its own"])
    runtime.plugins.register(log, name=PLUGIN_NAME)
    runtime.kept_files.add(log.path, "the audit log")  # the model's file tools must not rewrite its record
