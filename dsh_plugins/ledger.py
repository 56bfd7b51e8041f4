"""The effect ledger: every call id resolves once, even across a crash and a resume.

A host that resumes an interrupted turn, retries it or replays it runs the same
tool calls again, with the same call ids. Without a record of what already
happened, a ``send_email`` that completed before the crash is sent twice. The
ledger is that record: a durable, append-only file keyed by call id. Enable it
in ``[plugins.ledger]``::

    [plugins.ledger]
    path = "effects.jsonl"            # one ledger per conversation (relative: to the config file's directory)
    rerun_in_doubt = ["read_file"]    # tools that are safe to run again (default: none)
    fsync = "always"                  # "always" (default), "close" or "never"

**What it does.** An outermost (``tryfirst``) ``dsh_execute`` wrapper, so every
call the policy stages allowed passes through it, and only those: a replayed
call is checked by the current policy like any other, and a call that is now
denied does not reveal what was recorded. For each call it looks up the key
(the call id, with the agent's id when there is one):

- *not seen*: it writes ``effect/started`` (on disk before the body runs, with
  ``fsync = "always"``), runs the call and writes its outcome.
- *committed* (the call succeeded earlier): the recorded value is returned and
  the body is not run. The runtime passes that value through the tool's current
  output contract, so a value that no longer fits fails ``INVALID_TOOL_OUTPUT``
  instead of being presented in an old shape.
- *failed* (the body ended with a failure): the same failure is returned, code
  and message included. The body ran to an end; running it again could repeat
  whatever it did before it failed.
- *in doubt* (``effect/started`` with no outcome, because the process died, or
  an outcome of ``ABORTED``/``TOOL_TIMEOUT``/a wrapper raising after the body
  started, because the body was stopped part-way; a body that returned a
  success is *committed* however the call then ends): the call fails with ``EFFECT_IN_DOUBT`` and the body is
  not run, unless the tool is listed in ``rerun_in_doubt``, declares
  ``ToolEffects(read_only=True)`` or ``ToolEffects(idempotent=True)`` (when the
  ledger knows its runtime, as the entry point's does), or is ``run_code``
  (a Code Mode program's own sub-calls carry their own keys, ``<call
  id>:code:<n>``, so running the program again replays what it already did and
  stops at the first sub-call that is in doubt). Even such a tool is not run
  again while a worker thread its earlier attempt left behind still runs
  (:meth:`ToolRuntime.orphaned_work <dsh_core.ToolRuntime.orphaned_work>`, matched
  by call id, agent and tool): the call fails ``EFFECT_IN_DOUBT`` until the
  thread returns. The entry stays in doubt when it does (the thread's outcome
  is not recorded). A person who has checked what happened settles the entry
  with :meth:`EffectLedger.resolve` or :meth:`EffectLedger.forget`.
- *the key was recorded for another tool or other arguments*: the call fails
  with ``IDEMPOTENCY_CONFLICT``. For a Code Mode sub-call this means the program
  took another path on the re-run (it diverged); it stops there instead of
  mixing two runs' effects.

A call that never reached the body (``execution.body_started`` is false:
``ABORTED_BEFORE_DISPATCH``, ``UNKNOWN_TOOL`` at dispatch, or a failure or
exception of an inner wrapper, such as ``call-limits`` refusing a call at
dispatch or the timeout policy refusing a tool's ``timeout_ms``) releases its
key: nothing happened, so a later call with that id runs. Two concurrent calls with one key in one process run
one after the other; the second gets the first's outcome.

**Durability and failure.** The file is a :class:`dsh_core.SessionLog` (one
JSON line per event) locked against a second writer. With ``fsync = "always"``
each event is written and synced from a worker thread, so a slow disk holds the
call being recorded and nothing else; the call waits for it, cancelled or not,
and a cancellation that came meanwhile stops it before the body runs. (A test on
trio's ``MockClock`` with autojump passes ``fsync="close"``: the virtual clock
jumps to the next deadline while a thread syncs.) A torn last line is
skipped on open and cut off before the first write, so a command that fails
(settling a call the ledger does not have) leaves the file as it was. A failure to record ``effect/started`` fails the call with
``LEDGER_ERROR`` (blamed on ``effect-ledger``) before its body runs: the ledger never lets an effect happen
unrecorded. A failure to record the outcome leaves the entry in doubt, which is
what it is, and logs a warning; the call's result is returned unchanged. The
next write first reopens the file, which cuts off whatever the failed write
left: a disk full for a moment costs the event that failed, not the ledger.

**Keys are only as unique as call ids.** A provider that numbers calls ``0``,
``1``, ... afresh every turn would make a later ``get_time`` replay an earlier
turn's answer; such hosts pass ``key=`` to derive unique keys (a turn number
plus the call id, say), or return ``None`` from it for calls that should not
be recorded. The file grows with every call: use one ledger per conversation,
or :meth:`EffectLedger.compact` one that lives longer.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import hashlib
import logging
import os
import shutil
import threading
import weakref
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, Final, Literal, TypeAlias

import attrs
import trio

from dsh_core import (
    RUN_CODE_NAME,
    ConfigError,
    DshError,
    ErrorCode,
    JsonValue,
    OrphanedWork,
    SessionLog,
    SessionLogError,
    ToolDefinition,
    ToolDispatchExecution,
    ToolExecutionFailure,
    ToolExecutionResult,
    ToolExecutionSuccess,
    ToolRuntime,
    canonical_json,
    contract_fingerprint,
    failure_result,
    hookimpl,
    read_session_log,
    safe_repr,
    scope_id,
    snapshot_json,
    structure_table,
)

from ._cut_short import what_cut
from ._file_settings import PathSetting, kept_path
from ._settings_warnings import report_inert_keys, unknown_tool_warnings

__all__ = [
    "EFFECT_IN_DOUBT",
    "IDEMPOTENCY_CONFLICT",
    "PLUGIN_NAME",
    "EffectLedger",
    "LedgerEntry",
    "LedgerError",
    "LedgerSettings",
    "LedgerState",
    "read_ledger",
]

# Capability manifest (enforced under strict_capabilities): it may answer any call from its record.
DSH_CAPABILITIES: dict[str, list[str]] = {"tools": [], "affects": ["*"]}

PLUGIN_NAME: Final = "effect-ledger"
LOCK_SUFFIX: Final = ".lock"
"""The ledger ``effects.jsonl`` is locked through ``effects.jsonl.lock`` (kept; it holds nothing)."""
EFFECT_IN_DOUBT: Final = "EFFECT_IN_DOUBT"
IDEMPOTENCY_CONFLICT: Final = "IDEMPOTENCY_CONFLICT"

logger = logging.getLogger("dsh_plugins.ledger")

LedgerState: TypeAlias = Literal["started", "committed", "failed", "interrupted"]
"""Where a key stands: running (or died running), succeeded, failed after running, stopped part-way."""

_STARTED: Final = "effect/started"
_COMMITTED: Final = "effect/committed"
_FAILED: Final = "effect/failed"
_INTERRUPTED: Final = "effect/interrupted"
_RELEASED: Final = "effect/released"
_OUTCOMES: Final[dict[str, LedgerState]] = {_COMMITTED: "committed", _FAILED: "failed", _INTERRUPTED: "interrupted"}

# The body was stopped part-way: what it did is unknown.
_CUT_SHORT: Final = frozenset({ErrorCode.ABORTED.value, ErrorCode.TOOL_TIMEOUT.value})

KeyFunction: TypeAlias = Callable[[ToolDispatchExecution], "str | None"]


class LedgerError(DshError, ValueError):
    """The ledger file is not a ledger, is damaged, is in use, or a key cannot be settled."""

    code = "LEDGER_ERROR"


@attrs.frozen(kw_only=True, slots=True)
class LedgerEntry:
    """What the ledger knows about one key.

    ``value`` is the committed value (``None`` otherwise); ``error_code``,
    ``error_message``, ``error_name`` and ``error_plugin`` describe a recorded
    failure or interruption. ``at`` is when the call started (ISO 8601, UTC).
    """

    key: str
    agent: str | None
    tool: str
    arguments_digest: str
    contract: str | None
    state: LedgerState
    at: str
    value: JsonValue = None
    error_code: str | None = None
    error_message: str | None = None
    error_name: str | None = None
    error_plugin: str | None = None

    @property
    def in_doubt(self) -> bool:
        """Whether the effect may or may not have happened (no outcome, or the body was cut short)."""
        return self.state in ("started", "interrupted")


@attrs.frozen(kw_only=True)
class LedgerSettings:
    """The ``[plugins.ledger]`` table."""

    path: PathSetting | None = attrs.field(default=None, validator=kept_path)
    rerun_in_doubt: tuple[str, ...] = ()
    fsync: Literal["always", "close", "never"] = "always"


def arguments_digest(arguments: object) -> str:
    """``"sha256:<hex>"`` of the canonical JSON of a call's (snapshotted) arguments."""
    return "sha256:" + hashlib.sha256(canonical_json(arguments).encode("ascii")).hexdigest()


def _default_key(execution: ToolDispatchExecution) -> str | None:
    return execution.call_id


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="milliseconds")


def _text(data: Mapping[str, Any], field: str, *, optional: bool = False) -> Any:
    value = data.get(field)
    if value is None and optional:
        return None
    if type(value) is not str:
        raise _Malformed(f'"{field}" must be a string, got {safe_repr(value)}')
    return value


class _Malformed(Exception):
    pass


def _interruption(exc: BaseException) -> str:
    """What cut a call short while its body ran, for its record (shown to the model on a repeat).

    A cancellation is named as one: its own text names trio's task objects and
    their addresses ("cancelled due to explicit from task <Task ... at 0x...>").
    """
    cause = what_cut(exc)
    if cause == "trio.Cancelled":
        return "cancelled while its body ran"
    if cause in ("KeyboardInterrupt", "SystemExit", "GeneratorExit"):
        return f"{cause} while its body ran"
    return f"{type(exc).__name__}: {exc}"


def _apply(entries: dict[tuple[str | None, str], LedgerEntry], event_type: str, data: Mapping[str, Any]) -> None:
    if event_type not in (_STARTED, _RELEASED, *_OUTCOMES):
        raise _Malformed(f"unknown event type {safe_repr(event_type)}: this file is not an effect ledger")
    agent = _text(data, "agent", optional=True)
    key = (agent, _text(data, "key"))
    if event_type == _STARTED:
        entries.pop(key, None)  # to the end: entries() are in the order each was last started
        entries[key] = LedgerEntry(
            key=key[1],
            agent=agent,
            tool=_text(data, "tool"),
            arguments_digest=_text(data, "arguments"),
            contract=_text(data, "contract", optional=True),
            state="started",
            at=_text(data, "at"),
        )
        return
    entry = entries.get(key)
    if entry is None:
        raise _Malformed(f"{event_type} for key {safe_repr(key[1])}, which was never started")
    if event_type == _RELEASED:
        del entries[key]
    elif event_type == _COMMITTED:
        if "value" not in data:
            raise _Malformed('"value" is missing')
        # A resolved in-doubt call keeps no error: it is committed, as if it had returned.
        entries[key] = attrs.evolve(
            entry,
            state="committed",
            value=data["value"],
            error_code=None,
            error_message=None,
            error_name=None,
            error_plugin=None,
        )
    else:
        entries[key] = attrs.evolve(
            entry,
            state=_OUTCOMES[event_type],
            error_code=_text(data, "code", optional=True),
            error_message=_text(data, "message"),
            error_name=_text(data, "name", optional=True),
            error_plugin=_text(data, "plugin", optional=True),
        )


def _failure_fields(result: ToolExecutionFailure) -> dict[str, Any]:
    info = result.error.info
    return {
        "code": None if info is None else info.code,
        "message": result.error.message,
        "name": None if info is None else info.name,
        "plugin": None if info is None else info.plugin,
    }


class EffectLedger:
    """The ledger of one runtime, kept in one file (see the module documentation).

    Opening reads the whole file (skipping a torn last line, which the first
    write cuts off) and locks the file against a second ledger (in this process
    or another) until :meth:`close`.

    Args:
        path: the ledger file; created if missing (its directory must exist).
        rerun_in_doubt: tool names that are safe to run again when their earlier
            call is in doubt (reads, idempotent writes). ``run_code`` always is.
        fsync: ``"always"`` (each event is on disk before the call goes on; the
            default), ``"close"`` or ``"never"``, as for :class:`SessionLog`.
        key: derives a call's key from the dispatch view (default: its call id);
            ``None`` leaves that call unrecorded.
        runtime: the runtime the ledger serves, so each ``effect/started``
            records the called tool's :func:`~dsh_core.contract_fingerprint`
            (``dsh_setup`` passes it).

    Raises:
        LedgerError: the file is damaged, is not a ledger or is locked.
        OSError: the file cannot be opened.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        rerun_in_doubt: Iterable[str] = (),
        fsync: Literal["always", "close", "never"] = "always",
        key: KeyFunction = _default_key,
        runtime: ToolRuntime | None = None,
    ) -> None:
        if not os.fspath(path):
            raise LedgerError("the effect ledger was given no path; name its file")
        # The real path: a symlink to the ledger must lock (and compact) the same file.
        self.path = os.path.realpath(os.fspath(path))
        self.runtime = runtime
        self.rerun_in_doubt = frozenset(rerun_in_doubt) | {RUN_CODE_NAME}
        self._key = key
        self._fsync: Literal["always", "close", "never"] = fsync
        self._held = _Held(_lock(self.path, sync_directory=fsync != "never"))
        try:
            self._entries = _load(self.path) if os.path.exists(self.path) else {}
        except BaseException:
            self._held.release()
            raise
        # The log is opened (and a torn tail cut off) by the first write, not here: a
        # command that fails before writing must leave the file as it found it.
        self._write_failed = False
        self._running: dict[tuple[str | None, str], trio.Event] = {}
        # A host that never calls close() (a CLI run ending) still releases the file and the lock.
        self._closer = weakref.finalize(self, self._held.release)

    # --- reading and settling -------------------------------------------------------------

    def entries(self) -> tuple[LedgerEntry, ...]:
        """Every recorded key, in the order each was (last) started."""
        return tuple(self._entries.values())

    def get(self, key: str, agent: str | None = None) -> LedgerEntry | None:
        """The entry of ``key`` (for ``agent``'s calls), or ``None``."""
        return self._entries.get((agent, key))

    def in_doubt(self) -> tuple[LedgerEntry, ...]:
        """The entries whose effect may or may not have happened."""
        return tuple(entry for entry in self._entries.values() if entry.in_doubt)

    def resolve(self, key: str, value: object, *, agent: str | None = None) -> LedgerEntry:
        """Record that the in-doubt call ``key`` did happen, with ``value`` as its result.

        Later calls with that key return ``value`` (through the tool's output
        contract, like any recorded value) without running the body.

        Raises:
            LedgerError: there is no such key, it is not in doubt, or it cannot be written.
            NonJsonValueError: ``value`` is not lossless JSON.
        """
        self._settleable(key, agent)
        self._append(_COMMITTED, {"key": key, "agent": agent, "value": snapshot_json(value)})
        return self._entries[(agent, key)]

    def forget(self, key: str, *, agent: str | None = None) -> None:
        """Record that the in-doubt call ``key`` did not happen: a later call with that key runs.

        Raises:
            LedgerError: there is no such key, it is not in doubt, or it cannot be written.
        """
        self._settleable(key, agent)
        self._append(_RELEASED, {"key": key, "agent": agent})

    def _settleable(self, key: str, agent: str | None) -> LedgerEntry:
        entry = self._entries.get((agent, key))
        if entry is None:
            others = sorted(repr(other) for other, known in self._entries if known == key and other is not None)
            where = "without an agent" if agent is None else f"of agent {agent!r}"
            hint = f"; it has one of agent {', '.join(others)} (pass that agent)" if others else ""
            raise LedgerError(f"the ledger has no call {key!r} {where}{hint}")
        if not entry.in_doubt:
            raise LedgerError(f"call {key!r} is {entry.state}, not in doubt; only an in-doubt call can be settled")
        if (agent, key) in self._running:
            raise LedgerError(f"call {key!r} is running now; settle it after it ends")
        return entry

    def compact(self, *, archive: str | os.PathLike[str] | None = None) -> tuple[int, int]:
        """Rewrite the file as what it knows: one ``effect/started`` line per key and its outcome.

        A released key (settled as never done) and the lines superseded by
        later ones go; every entry keeps its state, value, failure and start
        time. The new file is written and checked beside the old one, then
        replaces it in one rename; ``archive`` (a path that must not exist yet)
        keeps the old file. Returns the number of lines before and after.

        Raises:
            LedgerError: the ledger is closed, a call is running, the archive
                exists, or the rewritten file would not read back as the same
                entries (the old file is then left as it was).
            OSError: the directory cannot be written.
        """
        self._check_open()
        if self._running:
            raise LedgerError(f"{len(self._running)} call(s) are running; compact the ledger between calls")
        archive_path = os.path.abspath(os.fspath(archive)) if archive is not None else None
        if archive_path is not None and os.path.exists(archive_path):
            raise LedgerError(f"the archive {archive_path} exists already; choose another path")
        before = len(read_session_log(self.path).events)
        temporary = self.path + ".compacting"
        with contextlib.suppress(FileNotFoundError):
            os.remove(temporary)
        events = [event for entry in self._entries.values() for event in _events_of(entry)]
        with SessionLog(temporary, fsync="always") as out:
            for event_type, data in events:
                out.append({"type": event_type, "data": data})
        if _comparable(_load(temporary)) != _comparable(self._entries):
            os.remove(temporary)
            raise LedgerError("the compacted ledger would not read back as the same entries; nothing was changed")
        with self._held.turn:
            # The open log's descriptor would go on writing to the replaced file: the next write opens the new one.
            self._held.close_log()
            try:
                if archive_path is not None:
                    _keep_archive(self.path, archive_path)  # the old file, under its new name, before it is replaced
                os.replace(temporary, self.path)
                self._write_failed = False  # what a failed write left went with the old file
                if self._fsync != "never":
                    _sync_directory(os.path.dirname(self.path))
            except BaseException:
                # Nothing replaced: the copy of every value must not stay behind.
                with contextlib.suppress(FileNotFoundError):
                    os.remove(temporary)
                raise
        return before, len(events)

    def __enter__(self) -> EffectLedger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def diagnostics(self) -> list[str]:
        """Warnings for ``dsh-tools check``: ``rerun_in_doubt`` names that are not registered tools.

        A misspelt name is accepted, and the tool it was meant for is then never
        run again when its earlier call is in doubt.
        """
        if self.runtime is None:
            return []
        return unknown_tool_warnings(
            self.runtime,
            "rerun_in_doubt",
            sorted(self.rerun_in_doubt - {RUN_CODE_NAME}),
            "a call of that tool in doubt is never run again",
        )

    def close(self) -> None:
        """Close the file and release the lock; later calls fail ``LEDGER_ERROR``. Idempotent."""
        self._closer()

    def _append(self, event_type: str, data: dict[str, Any]) -> None:
        """Write one event, then apply it to the entries the same way loading the file does.

        Raises:
            LedgerError: the ledger is closed, or the write failed (the entries
                are then unchanged, and the next append reopens the file first).
        """
        self._write(event_type, data)
        _apply(self._entries, event_type, data)

    async def _record(self, event_type: str, data: dict[str, Any]) -> None:
        """:meth:`_append` for the wrapper: an event synced to disk is written from a worker thread.

        An fsync can take seconds on a loaded disk, and on the event loop it would
        hold every task (other calls, deadlines, a server's streams) for that long.
        Shielded, so the event is on disk (or has failed) before the call goes
        on, cancelled or not: a record is never left half-known.
        """
        if self._fsync == "always":
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(self._write, event_type, data)
        else:
            self._write(event_type, data)  # no sync: a write to the page cache does not wait for the disk
        _apply(self._entries, event_type, data)

    def _write(self, event_type: str, data: dict[str, Any]) -> None:
        """Append one event to the file (from any thread: writes, reopening and closing take turns)."""
        with self._held.turn:
            log = self._writable_log()
            try:
                log.append({"type": event_type, "data": data})
            except BaseException as exc:
                # Part of the line may be in the file, and the log refuses every later
                # append until it is reopened, which cuts that part off.
                self._write_failed = True
                if isinstance(exc, (OSError, SessionLogError)):
                    raise LedgerError(f"cannot write to the effect ledger {self.path}: {exc}") from exc
                raise

    def _check_open(self) -> None:
        if self._held.lock_fd is None:
            raise LedgerError(f"the effect ledger {self.path} is closed")

    def _writable_log(self) -> SessionLog:
        """The log to append to: opened by the first write, and again after a write to it failed."""
        self._check_open()
        if self._held.log is None or self._write_failed:
            self._open_log()
        assert self._held.log is not None
        return self._held.log

    def _open_log(self) -> None:
        """Open the log, cutting off a torn last line or what a failed write left (the lock stays held)."""
        after_failure = self._write_failed
        with contextlib.suppress(OSError):
            self._held.close_log()  # its closing sync can fail as the write did; the file is closed either way
        try:
            log = SessionLog(self.path, fsync=self._fsync)
        except (OSError, SessionLogError) as exc:
            # Still marked failed (or not yet open): the next append tries again.
            if after_failure:
                raise LedgerError(f"cannot reopen the effect ledger {self.path} after a failed write: {exc}") from exc
            raise LedgerError(f"cannot open the effect ledger {self.path} for writing: {exc}") from exc
        self._held.log = log
        self._write_failed = False
        if log.torn is not None:
            what = "what a failed write left" if after_failure else "a torn last line"
            logger.warning("effect ledger %s: cut off %s: %s", self.path, what, log.torn)

    # --- the wrapper ----------------------------------------------------------------------

    @hookimpl(tryfirst=True)
    async def dsh_execute(
        self, execution: ToolDispatchExecution, next: Callable[[], Awaitable[ToolExecutionResult]]
    ) -> ToolExecutionResult:
        key = self._key(execution)
        if key is None:
            return await next()
        if type(key) is not str or not key:
            raise LedgerError(f"the ledger's key function returned {key!r}; expected a non-empty str or None")
        slot = (scope_id(execution.agent), key)
        while (running := self._running.get(slot)) is not None:
            await running.wait()  # the same key is running in this process: take its outcome
        entry = self._entries.get(slot)
        if entry is not None:
            answer = self._recorded(execution, entry)
            if answer is not None:
                return answer
        return await self._run(execution, slot, next)

    def _declared_safe(self, execution: ToolDispatchExecution) -> bool:
        """Whether the called tool declares that running it again repeats nothing (ToolEffects)."""
        if self.runtime is None:
            return False
        definition = self.runtime.get(execution.name, execution.agent)
        effects = definition.effects if definition is not None else None
        return effects is not None and effects.reruns_safely

    def _earlier_attempt_running(self, execution: ToolDispatchExecution) -> OrphanedWork | None:
        """A worker thread an earlier attempt of this call left running, when the runtime lists one.

        Matched by call id, agent and tool, as the runtime records orphaned work:
        a re-run beside it would run the effect twice at once.
        """
        if self.runtime is None:
            return None
        agent = scope_id(execution.agent)
        for work in self.runtime.orphaned_work():
            if (work.call_id, work.agent, work.tool) == (execution.call_id, agent, execution.name):
                return work
        return None

    def _recorded(self, execution: ToolDispatchExecution, entry: LedgerEntry) -> ToolExecutionResult | None:
        """The recorded answer for a known key, or ``None`` when the call should run (again)."""
        if entry.tool != execution.name or entry.arguments_digest != arguments_digest(execution.arguments):
            what = f", not {execution.name!r}" if entry.tool != execution.name else " with other arguments"
            return failure_result(
                f"call id {entry.key!r} was already used for a call of {entry.tool!r}{what}; "
                "a call id names one call (a Code Mode program that takes another path when run again "
                "diverges here)",
                IDEMPOTENCY_CONFLICT,
                name="IdempotencyConflict",
                plugin=PLUGIN_NAME,
            )
        if entry.state == "committed":
            return ToolExecutionSuccess(value=entry.value, content=())
        if entry.state == "failed":
            return failure_result(
                entry.error_message or "",
                entry.error_code,
                name=entry.error_name,
                plugin=entry.error_plugin,
            )
        if execution.name in self.rerun_in_doubt or self._declared_safe(execution):
            orphan = self._earlier_attempt_running(execution)
            if orphan is None:
                return None
            return failure_result(
                f"call {entry.key!r} of {entry.tool!r} is in doubt, and its earlier attempt still runs in a "
                f"worker thread it left behind ({orphan.function}); it is not run again while that thread "
                "runs: try again once it returns (a host can wait with ToolRuntime.wait_for_orphans())",
                EFFECT_IN_DOUBT,
                name="EffectInDoubt",
                plugin=PLUGIN_NAME,
            )
        how = (
            "has no recorded outcome"
            if entry.state == "started"
            else f"was cut short ({entry.error_code or 'no code'}: {entry.error_message})"
        )
        return failure_result(
            f"call {entry.key!r} of {entry.tool!r} started at {entry.at} and {how}; its effect may or may "
            "not have happened, so it is not run again until someone settles it in the effect ledger",
            EFFECT_IN_DOUBT,
            name="EffectInDoubt",
            plugin=PLUGIN_NAME,
        )

    async def _run(
        self,
        execution: ToolDispatchExecution,
        slot: tuple[str | None, str],
        next: Callable[[], Awaitable[ToolExecutionResult]],
    ) -> ToolExecutionResult:
        agent, key = slot
        definition = self._definition(execution)
        started = {
            "key": key,
            "agent": agent,
            "tool": execution.name,
            "arguments": arguments_digest(execution.arguments),
            "contract": None if definition is None else contract_fingerprint(definition),
            "at": _now(),
        }
        # Running from before its record is written: a second call with the key waits for this one.
        done = self._running[slot] = trio.Event()
        try:
            await self._record(_STARTED, started)  # raising here fails the call before the body runs
            try:
                # A cancellation that came while the record was synced stops the call here: an inline
                # body would not look for it before it ran.
                await trio.lowlevel.checkpoint_if_cancelled()
                result = await next()
            except BaseException as exc:
                body = execution.body_result
                if isinstance(body, ToolExecutionSuccess):
                    # The body returned, then the caller's scope was cancelled (or an inner wrapper
                    # raised) on the way out: the effect happened, once. Recorded (shielded) before
                    # re-raising, so the cancellation cannot cut the record short.
                    await self._settle(slot, _COMMITTED, {"value": body.value})
                elif not execution.body_started:
                    # Cancelled or raised on in an inner wrapper (the timeout policy refusing a
                    # tool's timeout, say) before the body: nothing happened.
                    await self._settle(slot, _RELEASED, {})
                else:
                    # Cancelled, or an inner wrapper raised: the body may have run part-way.
                    fields = {"code": None, "message": _interruption(exc)}
                    await self._settle(slot, _INTERRUPTED, fields)
                raise
            body = execution.body_result
            if isinstance(result, ToolExecutionSuccess):
                await self._settle(slot, _COMMITTED, {"value": result.value})
            elif isinstance(body, ToolExecutionSuccess):
                # The body finished its work, then the caller's signal turned the call ABORTED:
                # the effect happened, once; a later call with this id gets its value.
                await self._settle(slot, _COMMITTED, {"value": body.value})
            elif not execution.body_started:
                # Stopped before dispatch, the tool gone, or refused by an inner wrapper (call-limits):
                # nothing ran, so the key is free. Only the view can tell: a body may itself have done
                # its work and then failed UNKNOWN_TOOL or ABORTED_BEFORE_DISPATCH.
                await self._settle(slot, _RELEASED, {})
            else:
                assert isinstance(result, ToolExecutionFailure)
                fields = _failure_fields(result)
                await self._settle(slot, _INTERRUPTED if fields["code"] in _CUT_SHORT else _FAILED, fields)
            return result
        finally:
            del self._running[slot]
            done.set()

    def _definition(self, execution: ToolDispatchExecution) -> ToolDefinition | None:
        runtime = self.runtime
        return None if runtime is None else runtime.get(execution.name, execution.agent)

    async def _settle(self, slot: tuple[str | None, str], event_type: str, fields: dict[str, Any]) -> None:
        try:
            await self._record(event_type, {"key": slot[1], "agent": slot[0], **fields})
        except Exception as exc:
            # The effect happened (or may have); the entry stays "started", i.e. in doubt, which is the truth.
            logger.warning("effect ledger %s: cannot record the outcome of call %r: %s", self.path, slot[1], exc)


def _keep_archive(path: str, archive: str) -> None:
    """Keep the ledger file at ``path`` also as ``archive``: a hard link, or a private copy across file systems."""
    try:
        os.link(path, archive)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise LedgerError(f"cannot keep the archive {archive}: {exc.strerror or exc}; nothing was changed") from None
        descriptor = os.open(archive, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
        with os.fdopen(descriptor, "wb") as out, open(path, "rb") as source:
            shutil.copyfileobj(source, out)
            out.flush()
            os.fsync(out.fileno())


class _Held:
    """What an open ledger holds: the lock, and the log once a write has opened it.

    ``turn`` is held while the log is written, opened or closed: writes that
    sync to disk run in worker threads, and closing must wait for the one
    under way.
    """

    def __init__(self, lock_fd: int) -> None:
        self.lock_fd: int | None = lock_fd
        self.log: SessionLog | None = None
        self.turn = threading.RLock()

    def close_log(self) -> None:
        with self.turn:
            log, self.log = self.log, None
            if log is not None:
                log.close()

    def release(self) -> None:
        with self.turn:
            lock_fd, self.lock_fd = self.lock_fd, None
            try:
                self.close_log()
            finally:
                if lock_fd is not None:
                    os.close(lock_fd)


def _lock(path: str, *, sync_directory: bool) -> int:
    """Take ``<path>.lock`` for this ledger (and create the ledger file if missing); returns the lock's fd.

    The lock lives in a file of its own, not in the ledger: :meth:`EffectLedger.compact`
    replaces the ledger file, and a lock on the replaced file would lock nothing.
    """
    import fcntl  # POSIX; imported here so the module still imports elsewhere and fails only when used

    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        raise LedgerError(f"cannot open the effect ledger {path}: the directory {directory} does not exist")
    if os.path.isdir(path):
        # Checked before the lock is made: it would land beside the directory, outside it.
        raise LedgerError(f"cannot open the effect ledger: {path} is a directory; name a file (in it, say)")
    fd = os.open(path + LOCK_SUFFIX, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if not os.path.exists(path):
            # Created here, before SessionLog sees it: make its directory entry durable now.
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600))
            if sync_directory:
                _sync_directory(directory)
    except BlockingIOError:
        os.close(fd)
        raise LedgerError(f"the effect ledger {path} is in use by another ledger (one writer per file)") from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def _sync_directory(directory: str) -> None:
    directory_fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(directory_fd)
    finally:
        os.close(directory_fd)


def _events_of(entry: LedgerEntry) -> list[tuple[str, dict[str, Any]]]:
    """The lines that rebuild ``entry``: its start and, when it has one, its outcome."""
    slot = {"key": entry.key, "agent": entry.agent}
    started = {
        **slot,
        "tool": entry.tool,
        "arguments": entry.arguments_digest,
        "contract": entry.contract,
        "at": entry.at,
    }
    events: list[tuple[str, dict[str, Any]]] = [(_STARTED, started)]
    if entry.state == "committed":
        events.append((_COMMITTED, {**slot, "value": entry.value}))
    elif entry.state in ("failed", "interrupted"):
        failure = {
            "code": entry.error_code,
            "message": entry.error_message,
            "name": entry.error_name,
            "plugin": entry.error_plugin,
        }
        events.append((_FAILED if entry.state == "failed" else _INTERRUPTED, {**slot, **failure}))
    return events


def _comparable(entries: dict[tuple[str | None, str], LedgerEntry]) -> list[str]:
    """The entries as canonical JSON, in order (values compare as JSON, whatever their container types)."""
    return [canonical_json(_events_of(entry)) for entry in entries.values()]


def read_ledger(path: str | os.PathLike[str]) -> tuple[LedgerEntry, ...]:
    """The entries of the ledger at ``path``, read without taking its lock.

    For looking at a ledger a running host holds (``dsh-tools ledger show``):
    the result is what was on disk when it was read. A torn last line is
    skipped, not cut off.

    Raises:
        LedgerError: the file is damaged or is not a ledger.
        OSError: the file cannot be read.
    """
    return tuple(_load(os.fspath(path)).values())


def _load(path: str) -> dict[tuple[str | None, str], LedgerEntry]:
    try:
        read = read_session_log(path)
    except SessionLogError as exc:
        if exc.not_regular is not None:
            raise LedgerError(f"{path} is {exc.not_regular}, not a regular file; an effect ledger must be one") from None
        raise LedgerError(f"the effect ledger is damaged: {exc}") from None
    entries: dict[tuple[str | None, str], LedgerEntry] = {}
    for number, event in enumerate(read.events, 1):
        try:
            _apply(entries, event.type, event.data)
        except _Malformed as exc:
            raise LedgerError(f"{path}: line {number}: {exc}") from None
    if read.torn is not None:
        logger.warning("effect ledger %s: skipping a torn last line (a write cuts it off): %s", path, read.torn)
    return entries


@hookimpl
def dsh_setup(runtime: ToolRuntime, config: dict[str, Any]) -> None:
    """Register an :class:`EffectLedger` for ``runtime`` when ``[plugins.ledger].path`` is set."""
    settings = structure_table(LedgerSettings, config, "[plugins.ledger]")
    if settings.path is None:
        report_inert_keys(runtime, "ledger", config, "path", "there is no ledger: set path to keep one")
        return  # opt-in, like the audit log: installing the package must not start writing files
    if runtime.dry_run:
        return  # a rehearsal (dsh-tools simulate) runs nothing: no effect to record, no file to hold
    clash = runtime.kept_file(os.path.abspath(settings.path))
    if clash is not None:
        raise ConfigError(
            [f"[plugins.ledger].path: {settings.path!r} is {clash}; the effect ledger needs a file of its own"]
        )
    try:
        ledger = EffectLedger(
            settings.path, rerun_in_doubt=settings.rerun_in_doubt, fsync=settings.fsync, runtime=runtime
        )
    except (LedgerError, OSError) as exc:
        raise ConfigError([f"[plugins.ledger].path: {exc}"]) from None
    runtime.plugins.register(ledger, name=PLUGIN_NAME)
    # A forged "done" entry would stop a call from running again: not the model's file tools' to write.
    runtime.kept_files.add(ledger.path, "the effect ledger")
    # Its lock too: replaced by another file, a second ledger process would take a lock of its
    # own and append to the same file beside this one.
    runtime.kept_files.add(ledger.path + LOCK_SUFFIX, "the effect ledger's lock")
