"""The durable session log: append-only events, one JSON object per line.

Each line is ``{"seq": n, "type": "...", "data": {...}}`` followed by a newline;
``seq`` counts from 1 without gaps. A line is committed once its newline is on
disk, so a crash can only ever damage the *last* line: the reader skips such a
torn tail and reports it, and reopening the log for appending cuts it off so
the next event starts on a clean line. Damage anywhere else is corruption and
raises :class:`SessionLogError` naming the line.

The tool pipeline writes five event types, each with a typed helper on
:class:`SessionLog`. Their ``data`` uses the camelCase wire names of the
presentation vocabulary:

* ``tool/call`` — ``{callId, name, arguments, agent}``, plus ``contract``, the
  called tool's contract fingerprint, when the recorder knew the tool (an
  absent ``contract`` reads as ``null``)
* ``tool/result`` — ``{callId, agent, content, isError, error, meta}``, the durable
  projection of a result (never its canonical value); ``error`` is
  ``{name, code, message}`` or ``null``, ``meta`` the presentation meta or ``null``;
  plus ``trace``, the decision trace (``[{stage, actor, outcome}, ...]``), when
  the runtime traced the call. The key is written only then: readers treat an
  absent ``trace`` as ``null``. ``agent`` is the call's agent, as in its
  ``tool/call``: call ids are per conversation, so two agents' calls may share
  one, and a result is paired with the latest call of the same agent and id. A
  result without the key (a log from before it was written) is paired by
  ``callId`` alone; and ``contexts``, the result's additional contexts (the
  rewrite notes ``simulate`` reads when there is no trace), when it has any
* ``tool/unwound`` — ``{callId, agent, cause, bodyStarted}``: the call was cut short
  from outside (the host's cancel scope, ``KeyboardInterrupt``, an interpreter
  exit) and has no result, ever; ``cause`` names what cut it (``"Cancelled"``,
  ``"KeyboardInterrupt"``...), ``bodyStarted`` whether its body ran (its effect
  may have happened). A ``tool/call`` with neither this nor a ``tool/result``
  after it was still running when the process stopped (a crash, or a log
  written before this event existed); ``agent`` as in ``tool/result``
* ``tool/code-dispatch-start`` — ``{rootCallId, parentCallId, subCallId, agent, name, arguments}``;
  ``agent`` is the agent of the ``run_code`` call ``parentCallId``, and the event
  belongs to the latest call of that agent with that id, as a result does (one
  without the key, from an older log, is paired by ``parentCallId`` alone)
* ``tool/code-dispatch`` — the same plus ``isError`` and ``content``

``content`` is a list of content blocks in the presentation wire form
(``{"type": "text", "text": ...}``, ``{"type": "image", "data": ..., "mimeType": ...}``);
:func:`structure_content` turns it back into blocks.

JSON is written and read without recursion limits: values nested far deeper
than ``json`` handles (5 000-deep tool arguments) are logged and read back
intact.
"""

from __future__ import annotations

import errno
import os
import stat
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, Final, Literal, NamedTuple, TypeAlias, final

import attrs
import cattrs

from ._content import ContentBlock, UserMessage, as_content
from ._decisions import UNSET, _Unset
from ._errors import DshError, NonJsonValueError
from ._json import FrozenDict, JsonValue, safe_repr, snapshot_json
from ._jsoncodec import IntegerTooLongError, decode_json, encode_json
from ._schema._attrs_params import _describe as describe_json_value
from ._terminal_text import json_printable
from .presentation import _configure_content, _configure_strict

__all__ = [
    "FsyncPolicy",
    "SessionEvent",
    "SessionLog",
    "SessionLogError",
    "SessionLogRead",
    "TornLine",
    "read_session_log",
    "structure_content",
]

FsyncPolicy: TypeAlias = Literal["never", "always", "close"]
"""When :class:`SessionLog` asks the OS to put the file on disk: never, after every line, or once when closed."""

_POLICIES: Final = ("never", "always", "close")
_CHUNK: Final = 1 << 16


class SessionLogError(DshError, ValueError):
    """A session log is corrupt (``line`` names the first bad line) or can no longer be appended to.

    ``not_regular`` says what ``path`` is when it is not a regular file (``"a FIFO
    (named pipe)"``): formats built on the log (a ledger, a grants file) name
    that in their own terms instead of calling the file damaged.
    """

    code = "SESSION_LOG_ERROR"

    def __init__(
        self, message: str, *, path: str | None = None, line: int | None = None, not_regular: str | None = None
    ) -> None:
        self.path = path
        self.line = line
        self.not_regular = not_regular
        where = "" if path is None else f"{path}: " if line is None else f"{path}: line {line}: "
        super().__init__(where + message)


@final
@attrs.frozen(kw_only=True, slots=True)
class SessionEvent:
    """One committed line of a session log."""

    seq: int
    type: str
    data: FrozenDict


@final
@attrs.frozen(kw_only=True, slots=True)
class TornLine:
    """The damaged last line of a log: where it starts, how long it is and what is wrong with it."""

    line: int
    offset: int
    size: int
    reason: str

    def __str__(self) -> str:
        return f"line {self.line} (byte {self.offset}, {self.size} bytes) {self.reason}"


@final
@attrs.frozen(kw_only=True, slots=True)
class SessionLogRead:
    """What :func:`read_session_log` found: the committed ``events`` and the skipped ``torn`` tail, if any."""

    events: tuple[SessionEvent, ...]
    torn: TornLine | None
    # The byte offset just past the last committed event: where a later read picks up.
    end: int = 0
    # The seq the next event will have: a read that found nothing new keeps it, so the
    # read after it still knows where the numbering stands.
    next_seq: int = attrs.field(
        default=attrs.Factory(lambda self: self.events[-1].seq + 1 if self.events else 1, takes_self=True)
    )


# --- lines --------------------------------------------------------------------------------


class _BadLine(Exception):
    """Why one line is not a committed event."""


def _encode_line(seq: int, event_type: str, data: JsonValue) -> bytes:
    record = {"seq": seq, "type": event_type, "data": data}
    try:
        # A model's C1 controls and bidi overrides as \u escapes: the log is read on terminals too.
        return (json_printable(encode_json(record, ascii_only=False)) + "\n").encode("utf-8")
    except UnicodeEncodeError:
        # A lone surrogate has no UTF-8 form; its \\u escape is still lossless JSON.
        return (encode_json(record, ascii_only=True) + "\n").encode("ascii")


def _parse_line(raw: bytes) -> SessionEvent:
    if not raw.endswith(b"\n"):
        raise _BadLine("has no newline: the write was interrupted")
    try:
        text = raw[:-1].decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _BadLine(f"is not UTF-8: {exc}") from None
    if not text.strip():
        raise _BadLine("is empty")
    try:
        record = decode_json(text)
    except IntegerTooLongError as exc:
        raise _BadLine(f"cannot be read: it holds {exc}") from None
    except ValueError as exc:
        raise _BadLine(f"is not valid JSON: {exc}") from None
    if type(record) is not dict or record.keys() != {"seq", "type", "data"}:
        raise _BadLine('is not an event object {"seq", "type", "data"}')
    seq, event_type, data = record["seq"], record["type"], record["data"]
    if type(seq) is not int or seq < 1:
        raise _BadLine(f"has an invalid seq {safe_repr(seq)}")
    if type(event_type) is not str or not event_type:
        raise _BadLine(f"has an invalid type {safe_repr(event_type)}")
    if type(data) is not dict:
        raise _BadLine("has data that is not an object")
    try:
        frozen = snapshot_json(data)
    except NonJsonValueError as exc:
        raise _BadLine(f"holds a value that is not lossless JSON: {exc}") from None
    assert isinstance(frozen, FrozenDict)
    return SessionEvent(seq=seq, type=event_type, data=frozen)


def _lines_backwards(file: BinaryIO, size: int) -> Iterator[tuple[int, bytes]]:
    """Yield ``(offset, line)`` for the lines of ``file``, last first; each keeps its newline (the last may lack one)."""
    pos = end = size
    later: list[bytes] = []  # pieces of the line ending at ``end`` read so far, last piece first
    while pos > 0:
        step = min(_CHUNK, pos)
        pos -= step
        file.seek(pos)
        block = file.read(step)
        cut = min(len(block), end - pos)
        # The newline at end - 1 is the current line's own; search before it.
        limit = min(len(block), end - 1 - pos)
        while limit > 0 and (index := block.rfind(b"\n", 0, limit)) >= 0:
            later.append(block[index + 1 : cut])
            yield pos + index + 1, b"".join(reversed(later))
            later = []
            end = pos + index + 1
            cut, limit = index + 1, index
        later.append(block[:cut])
    if end > 0:
        yield 0, b"".join(reversed(later))


_LINE_START: Final = b'{"seq":'


def _could_be_torn(raw: bytes, *, after_event: bool) -> bool:
    """Whether ``raw`` (a bad last line) is crash damage to a log line rather than someone else's data.

    Each event is one write of a whole line starting ``{"seq":``: a write cut
    short leaves a start of that, and a crash can leave zero bytes where the
    file had grown (after such a start, or instead of it). Only ``after_event``
    (a committed event precedes the line) is other binary garbage crash damage
    too: a file whose first line is not text and no event's start is someone
    else's (a gzip archive, a UTF-16 file), like a readable line that is not
    ours (the notes or batch file given as a log by mistake), and must not be
    cut off.
    """
    terminated = raw.endswith(b"\n")
    body = raw[:-1] if terminated else raw
    start = body.rstrip(b"\x00")  # zero fill past the end of what was written
    if not start.strip():
        return True
    if terminated and b"\x00" not in body and _decodes(body):
        # A whole line of JSON (an event from a newer writer, with a key this one does not know):
        # no cut write leaves that, and cutting it off would delete what was committed.
        return False
    if start.startswith(_LINE_START) or (not terminated and _LINE_START.startswith(start)):
        return True
    if not after_event:
        return False
    if b"\x00" in body:
        return True
    try:
        body.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def _decodes(body: bytes) -> bool:
    try:
        decode_json(body.decode("utf-8"))
    except IntegerTooLongError:
        return True  # valid JSON this reader cannot convert: refused, never cut off
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return False
    return True


def _lock_exclusively(file: BinaryIO, path: Path) -> None:
    """Hold an exclusive lock on the log for as long as ``file`` is open: one writer per file."""
    try:
        import fcntl
    except ImportError:  # not POSIX: nothing to lock with
        return
    try:
        fcntl.flock(file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        raise SessionLogError(
            "another writer has this session log open (one writer per file; give each session its own log)",
            path=os.fspath(path),
        ) from None


def _line_number(file: BinaryIO, offset: int) -> int:
    """The 1-based number of the line starting at ``offset`` (counts the newlines before it)."""
    file.seek(0)
    count, remaining = 1, offset
    while remaining > 0:
        block = file.read(min(_CHUNK, remaining))
        if not block:
            break
        count += block.count(b"\n")
        remaining -= len(block)
    return count


def read_session_log(path: str | os.PathLike[str], *, after: SessionLogRead | None = None) -> SessionLogRead:
    """Read every committed event of the log at ``path`` (with ``after``: only those written since).

    A torn last line (crash damage: the start of an event line, zero bytes,
    or, after a committed event, bytes that are not text) is skipped and
    described in ``torn``. ``after`` is an earlier read of the same file: the
    read starts at its ``end`` and its seq numbering, so a reader following a
    growing log pays for the new lines only (line numbers in errors then count
    from that point).

    Raises:
        SessionLogError: a line is damaged (the last one only when no interrupted
            write can have left it: the file is not a session log), or the ``seq``
            numbers do not run 1, 2, 3, ... (on from ``after``'s); the message
            names the line. Also when the file is shorter than ``after.end``
            (it was replaced or cut). Also when ``path`` is not a regular file
            (a FIFO, a device, a directory): refused at once, never waited on.
        OSError: the file cannot be read.
    """
    name = os.fspath(path)
    events: list[SessionEvent] = []
    bad: TornLine | None = None
    offset = after.end if after is not None else 0
    first_seq = after.next_seq if after is not None else 1
    with os.fdopen(_open_regular_file(path, os.O_RDONLY), "rb") as file:
        if offset and file.seek(0, os.SEEK_END) < offset:
            raise SessionLogError(f"the file is shorter than the {offset} bytes read before", path=name)
        file.seek(offset)
        end = offset
        for number, raw in enumerate(file, 1):
            if bad is not None:
                raise SessionLogError(f"{bad.reason}; only the last line may be torn", path=name, line=bad.line)
            try:
                event = _parse_line(raw)
            except _BadLine as exc:
                bad = TornLine(line=number, offset=offset, size=len(raw), reason=str(exc))
                if not _could_be_torn(raw, after_event=first_seq + len(events) > 1):
                    raise SessionLogError(
                        f"{_foreign_reason(raw, bad.reason)}: this is not a session log line "
                        "(nor the start of one a crash cut short)",
                        path=name,
                        line=number,
                    ) from None
            else:
                expected = first_seq + len(events)
                if event.seq != expected:
                    raise SessionLogError(f"seq {event.seq} where {expected} was expected", path=name, line=number)
                events.append(event)
                end = offset + len(raw)
            offset += len(raw)
    return SessionLogRead(events=tuple(events), torn=bad, end=end, next_seq=first_seq + len(events))


# --- the writer ---------------------------------------------------------------------------


class _BadTail(NamedTuple):
    """The bad last line the writer found, and whether it is torn only if a committed event precedes it."""

    offset: int
    raw: bytes
    reason: str
    needs_event: bool


def _foreign_reason(raw: bytes, reason: str) -> str:
    """What is wrong with a line that is not ours: its content, not the missing newline a torn write would explain."""
    if raw.endswith(b"\n"):
        return reason
    try:
        _parse_line(raw + b"\n")
    except _BadLine as exc:
        return str(exc)
    return reason


def _not_a_log(raw: bytes, reason: str, path: str, line: int) -> SessionLogError:
    return SessionLogError(
        f"{_foreign_reason(raw, reason)}: this is not a session log line (nor the start of one a crash cut short); "
        "the file was left as it is",
        path=path,
        line=line,
    )


_converter = cattrs.Converter(forbid_extra_keys=True)
_configure_strict(_converter)
_configure_content(_converter)


def _content_json(content: object, what: str) -> list[Any]:
    return [_converter.unstructure(block) for block in as_content(content, what=what)]


def _context_json(context: object) -> dict[str, Any]:
    if not isinstance(context, UserMessage):
        raise TypeError(f"contexts must hold UserMessage items, got {type(context).__name__}")
    return {"source": context.source, "content": _content_json(context.content, "contexts"), "meta": context.meta}


def structure_contexts(value: object) -> tuple[UserMessage, ...]:
    """The ``contexts`` of a logged ``tool/result`` (absent or ``null``: none).

    Raises:
        SessionLogError: ``value`` is not a list of ``{source, content, meta}`` objects.
    """
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)):
        raise SessionLogError(f"invalid logged contexts: expected a list, got {describe_json_value(value)}")
    out: list[UserMessage] = []
    for index, item in enumerate(value):
        if not isinstance(item, Mapping) or not set(item) <= {"source", "content", "meta"}:
            raise SessionLogError(f"invalid logged contexts: $[{index}] is not a {{source, content, meta}} object")
        source = item.get("source")
        if type(source) is not str or not source:
            raise SessionLogError(f"invalid logged contexts: $[{index}].source must be a non-empty str")
        out.append(UserMessage(structure_content(item.get("content")), source=source, meta=item.get("meta")))
    return tuple(out)


def structure_content(value: object) -> tuple[ContentBlock, ...]:
    """Content blocks from their logged form (the ``content`` of ``tool/result`` and ``tool/code-dispatch``).

    Raises:
        SessionLogError: ``value`` is not a list of content blocks; the message names each bad path.
    """
    try:
        blocks: tuple[ContentBlock, ...] = _converter.structure(value, tuple[ContentBlock, ...])
    except Exception as exc:
        errors = cattrs.transform_error(exc, "$")
        raise SessionLogError("invalid logged content: " + "; ".join(errors)) from exc
    return blocks


def _str(value: object, what: str, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if type(value) is not str:
        raise TypeError(f"{what} must be a str{' or None' if optional else ''}, got {type(value).__name__}")


def _id(value: object, what: str, *, optional: bool = False) -> None:
    """A call id or agent id: what readers pair events by, so never empty."""
    _str(value, what, optional=optional)
    if value == "":
        raise ValueError(f"{what} must not be empty")


def _agent_json(agent: str | _Unset | None) -> dict[str, str | None]:
    """The ``agent`` key of a result or unwound event; none when the writer left it out."""
    if agent is UNSET:
        return {}
    _id(agent, "agent", optional=True)
    assert not isinstance(agent, _Unset)
    return {"agent": agent}


def _error_json(error: Mapping[str, str] | None, is_error: bool) -> dict[str, str] | None:
    if type(is_error) is not bool:
        raise TypeError(f"is_error must be a bool, got {type(is_error).__name__}")
    if error is None:
        if is_error:
            raise ValueError("a failed result (is_error=True) needs its error {name, code, message}")
        return None
    if not is_error:
        raise ValueError("a successful result (is_error=False) cannot carry an error")
    if not isinstance(error, Mapping) or set(error) != {"name", "code", "message"}:
        raise ValueError("error must be a mapping with exactly the keys name, code and message")
    for key in ("name", "code", "message"):
        _str(error[key], f"error[{key!r}]")
    return {"name": error["name"], "code": error["code"], "message": error["message"]}


# O_NONBLOCK: a FIFO swapped in after the check by path does not hang the open (it is refused
# once open); it changes nothing for a regular file, and is cleared once the file is checked.
_NONBLOCK: Final = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC: Final = getattr(os, "O_CLOEXEC", 0)
_APPEND_FLAGS: Final = os.O_WRONLY | os.O_APPEND | os.O_CREAT


def _what_it_is(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a special file"


def _not_regular(path: str | os.PathLike[str], mode: int | None) -> SessionLogError:
    kind = " (a directory, a device or a FIFO)" if mode is None else f" but {_what_it_is(mode)}"
    what = "a directory, a device or a FIFO" if mode is None else _what_it_is(mode)
    return SessionLogError(
        f"not a regular file{kind}; a session log must be one", path=os.fspath(path), not_regular=what
    )


def refuse_non_regular_target(path: str | os.PathLike[str]) -> None:
    """Raise :class:`SessionLogError` if ``path`` exists and is not a regular file (after symlinks).

    Appended to a device (``/dev/null``) the events are lost; opening a FIFO
    blocks until something is at its other end; a directory fails only at the
    open. Checked before anything is run or written, by the log and by the CLI,
    and before the reader opens anything.
    """
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return  # to be created
    if not stat.S_ISREG(mode):
        raise _not_regular(path, mode)


def _open_regular_file(path: str | os.PathLike[str], flags: int) -> int:
    """A blocking descriptor of ``path`` opened with ``flags``, if it is a regular file.

    The writer and the reader share this: checked by path first (a device is
    never opened), then opened without blocking and checked again by the
    descriptor, so a FIFO swapped in between neither hangs the open nor is used.
    """
    # Unlike dsh_plugins._regular_file's opener: stat by path first, symlinks always followed, mode 0o600, SessionLogError.
    refuse_non_regular_target(path)
    try:
        descriptor = os.open(path, flags | _NONBLOCK | _CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno in (errno.ENXIO, errno.EISDIR):  # a FIFO with no reader, a directory: swapped in
            try:
                mode: int | None = os.stat(path).st_mode
            except OSError:
                mode = None
            raise _not_regular(path, mode) from None
        raise
    try:
        mode = os.fstat(descriptor).st_mode
        if not stat.S_ISREG(mode):
            raise _not_regular(path, mode)
        if _NONBLOCK:
            os.set_blocking(descriptor, True)
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


@final
class SessionLog:
    """An append-only session log file, opened for appending.

    Opening an existing log continues its ``seq`` numbering; if its last line is
    torn, that line is cut off first and described in :attr:`torn`. Each event
    is one ``write`` of the whole line, newline included, with no user-space
    buffer (a crashed process leaves nothing behind unwritten); ``fsync`` says
    when the OS is asked to put it on disk: ``"always"`` after every line,
    ``"close"`` once on :meth:`close` (the default), ``"never"``.

    One writer per file: the log holds an exclusive lock on it while open, so a
    second ``SessionLog`` on the same file (in this process or another) is
    refused rather than interleaving its numbering. Appending is thread-safe
    (events from several threads get consecutive ``seq`` in write order). A new file is created
    readable by its owner only (it holds arguments and results). Use it as a
    context manager::

        with SessionLog(path) as log:
            seq = log.append_call("call-1", "read_file", {"path": "a.txt"})

    Only a last line that a crash can have damaged (the start of an event line,
    zero bytes, or, after a committed event, bytes that are not text) is taken
    as torn and cut off; any other line that is not an event means the file is
    not a session log (a notes, batch or gzip file given by mistake), and it is
    left alone. Opening checks the end of the file; readers check every line.

    Raises:
        SessionLogError: the file is not a session log, another writer holds it, or
            ``path`` is not a regular file (a device, a FIFO or a directory).
        ValueError: ``fsync`` is not a policy.
        OSError: the file cannot be opened.
    """

    def __init__(self, path: str | os.PathLike[str], *, fsync: FsyncPolicy = "close") -> None:
        if fsync not in _POLICIES:
            raise ValueError(f"fsync must be one of {', '.join(map(repr, _POLICIES))}, got {fsync!r}")
        self.path = Path(path)
        self.fsync: FsyncPolicy = fsync
        # Orphaned worker threads announce their finish from their own threads, so two
        # writers can race for the same seq: one lock covers take-seq, write, advance.
        self._lock = threading.Lock()
        self._new_file = not self.path.exists()
        # Unbuffered: every write goes straight to the OS, so a failed or interrupted
        # write can never be completed later by a buffer flush in the middle of the file.
        descriptor = _open_regular_file(self.path, _APPEND_FLAGS)
        self._file: BinaryIO | None = os.fdopen(descriptor, "ab", buffering=0)
        try:
            _lock_exclusively(self._file, self.path)
            self.torn: TornLine | None
            self._next_seq: int
            self.torn, self._next_seq = (None, 1) if self._new_file else self._recover()
        except BaseException:
            self._file.close()
            self._file = None
            raise
        self._broken: str | None = None
        # How long the file is, by this log's own writes: shorter than that, it was truncated under
        # it (": > log", logrotate's copytruncate), and lines numbered on from here would make a
        # file whose reader refuses it from its first line.
        self._end = os.fstat(self._file.fileno()).st_size
        self._dirty = self._new_file or self.torn is not None
        if self.fsync == "always" and self._dirty:
            self._sync()

    def _recover(self) -> tuple[TornLine | None, int]:
        name = os.fspath(self.path)
        with open(self.path, "r+b") as file:
            size = file.seek(0, os.SEEK_END)
            torn: _BadTail | None = None
            next_seq = 1
            for offset, raw in _lines_backwards(file, size):
                try:
                    event = _parse_line(raw)
                except _BadLine as exc:
                    if torn is None and _could_be_torn(raw, after_event=True):
                        torn = _BadTail(offset, raw, str(exc), not _could_be_torn(raw, after_event=False))
                        continue
                    line = _line_number(file, offset)
                    if torn is None or torn.needs_event:
                        # The last line is not ours, or is garbage with no committed event before it.
                        raise _not_a_log(raw, str(exc), name, line) from None
                    raise SessionLogError(f"{exc}; only the last line may be torn", path=name, line=line) from None
                next_seq = event.seq + 1
                break
            else:
                if torn is not None and torn.needs_event:
                    raise _not_a_log(torn.raw, torn.reason, name, 1)  # the file is that one line
            if torn is None:
                return None, next_seq
            line = _line_number(file, torn.offset)
            described = TornLine(line=line, offset=torn.offset, size=len(torn.raw), reason=torn.reason)
            file.truncate(torn.offset)
            return described, next_seq

    @property
    def next_seq(self) -> int:
        """The ``seq`` the next appended event will get."""
        return self._next_seq

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` has run."""
        return self._file is None

    def __enter__(self) -> SessionLog:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the file, first syncing it under the ``"close"`` policy; idempotent."""
        with self._lock:
            file = self._file
            if file is None:
                return
            try:
                if self.fsync == "close" and self._dirty:
                    self._sync()
            finally:
                self._file = None
                file.close()

    def append(self, event: Mapping[str, Any]) -> int:
        """Append ``{"type": str, "data": {...}}`` as the next line and return its ``seq``.

        ``data`` must be a lossless JSON object (it is snapshotted first, so a bad
        value never reaches the file).

        Raises:
            TypeError: ``event`` is not a mapping of exactly ``type`` and ``data``,
                or ``type`` is not a non-empty str.
            NonJsonValueError: ``data`` is not lossless JSON.
            SessionLogError: an earlier write failed, so the file may end in a
                torn line; reopen the log to repair it.
            ValueError: the log is closed.
        """
        if not isinstance(event, Mapping) or set(event) != {"type", "data"}:
            raise TypeError('an event is a mapping with exactly the keys "type" and "data"')
        event_type, data = event["type"], event["data"]
        if type(event_type) is not str or not event_type:
            raise TypeError(f"event type must be a non-empty str, got {event_type!r}")
        if not isinstance(data, Mapping):
            raise TypeError(f"event data must be a mapping, got {type(data).__name__}")
        return self._write(event_type, snapshot_json(data if type(data) is FrozenDict else dict(data)))

    def append_call(
        self, call_id: str, name: str, arguments: object, *, agent: str | None = None, contract: str | None = None
    ) -> int:
        """Append ``tool/call``: the model asked for ``name`` with ``arguments``; returns its ``seq``.

        ``contract`` is the called tool's :func:`~dsh_core.contract_fingerprint`
        when it was known (``None``: no ``contract`` key is written).
        """
        _id(call_id, "call_id")
        _str(name, "name")
        _id(agent, "agent", optional=True)
        _id(contract, "contract", optional=True)
        data = {"callId": call_id, "name": name, "arguments": arguments, "agent": agent}
        if contract is not None:
            data["contract"] = contract
        return self._write("tool/call", snapshot_json(data))

    def append_result(
        self,
        call_id: str,
        *,
        content: Sequence[ContentBlock],
        is_error: bool,
        error: Mapping[str, str] | None = None,
        meta: object = None,
        trace: Sequence[Mapping[str, str]] | None = None,
        contexts: Sequence[UserMessage] = (),
        agent: str | _Unset | None = UNSET,
    ) -> int:
        """Append ``tool/result``, the durable projection of a settled call; returns its ``seq``.

        ``content`` is what the model saw, ``error`` the failure's
        ``{name, code, message}`` (required exactly when ``is_error``), ``meta``
        the presentation meta (``None`` for none), ``trace`` the decision trace
        as ``DecisionTrace.to_json()`` gives it (``None``: no ``trace`` key is
        written), ``contexts`` the messages that followed the result in the
        model's context (a deferred context, a policy's rewrite note), written
        as ``[{source, content, meta}]`` (none: no ``contexts`` key). ``agent``
        is the agent given to :meth:`append_call` (``None`` for the global
        scope): pass it whenever several agents' calls share the log, since
        their call ids may collide; left out (``UNSET``), no ``agent`` key is
        written and readers pair the result by call id alone. The
        canonical value is never logged: replay presents results from this
        projection alone.
        """
        _id(call_id, "call_id")
        data: dict[str, Any] = {"callId": call_id, **_agent_json(agent)}
        data |= {
            "content": _content_json(content, "content"),
            "isError": is_error,
            "error": _error_json(error, is_error),
            "meta": meta,
        }
        if trace is not None:
            data["trace"] = [dict(step) for step in trace]
        if contexts:
            data["contexts"] = [_context_json(context) for context in contexts]
        return self._write("tool/result", snapshot_json(data))

    def append_unwound(
        self, call_id: str, *, cause: str, body_started: bool, agent: str | _Unset | None = UNSET
    ) -> int:
        """Append ``tool/unwound``: call ``call_id`` was cut short by ``cause`` and has no result.

        ``agent`` as for :meth:`append_result`.
        """
        _id(call_id, "call_id")
        _str(cause, "cause")
        if type(body_started) is not bool:
            raise TypeError(f"body_started must be a bool, got {type(body_started).__name__}")
        data = {"callId": call_id, **_agent_json(agent), "cause": cause, "bodyStarted": body_started}
        return self._write("tool/unwound", snapshot_json(data))

    def append_dispatch_start(
        self,
        root_call_id: str,
        parent_call_id: str,
        sub_call_id: str,
        name: str,
        arguments: object,
        *,
        agent: str | _Unset | None = UNSET,
    ) -> int:
        """Append ``tool/code-dispatch-start``: a Code Mode program started sub-call ``sub_call_id``.

        ``agent`` is the agent of the ``run_code`` call ``parent_call_id``, as for :meth:`append_result`.
        """
        data = self._dispatch_ids(root_call_id, parent_call_id, sub_call_id, name, agent) | {"arguments": arguments}
        return self._write("tool/code-dispatch-start", snapshot_json(data))

    def append_dispatch(
        self,
        root_call_id: str,
        parent_call_id: str,
        sub_call_id: str,
        name: str,
        arguments: object,
        *,
        content: Sequence[ContentBlock],
        is_error: bool,
        agent: str | _Unset | None = UNSET,
    ) -> int:
        """Append ``tool/code-dispatch``: sub-call ``sub_call_id`` settled with ``content``.

        ``agent`` as for :meth:`append_dispatch_start`.
        """
        if type(is_error) is not bool:
            raise TypeError(f"is_error must be a bool, got {type(is_error).__name__}")
        data = self._dispatch_ids(root_call_id, parent_call_id, sub_call_id, name, agent) | {
            "arguments": arguments,
            "isError": is_error,
            "content": _content_json(content, "content"),
        }
        return self._write("tool/code-dispatch", snapshot_json(data))

    @staticmethod
    def _dispatch_ids(
        root_call_id: str, parent_call_id: str, sub_call_id: str, name: str, agent: str | _Unset | None
    ) -> dict[str, Any]:
        _id(root_call_id, "root_call_id")
        _id(parent_call_id, "parent_call_id")
        _id(sub_call_id, "sub_call_id")
        _str(name, "name")
        ids = {"rootCallId": root_call_id, "parentCallId": parent_call_id, "subCallId": sub_call_id}
        return ids | _agent_json(agent) | {"name": name}

    def _write(self, event_type: str, data: JsonValue) -> int:
        with self._lock:
            return self._write_locked(event_type, data)

    def _write_locked(self, event_type: str, data: JsonValue) -> int:
        file = self._file
        if file is None:
            raise ValueError(f"session log {self.path} is closed")
        if self._broken is not None:
            raise SessionLogError(
                f"an earlier write failed ({self._broken}); reopen the log to repair it", path=str(self.path)
            )
        seq = self._next_seq
        line = _encode_line(seq, event_type, data)
        size = os.fstat(file.fileno()).st_size
        if size < self._end:
            self._broken = f"the file was truncated while open ({size} bytes where this log had written {self._end})"
            raise SessionLogError(
                f"{self._broken}: events written from here would not read as a log; reopen it to start "
                "a log of its own, or keep truncating tools away from it",
                path=str(self.path),
            )
        try:
            view = memoryview(line)
            while view:
                written = file.write(view)
                if not written:  # only a non-blocking file can return None or 0
                    raise OSError("the file accepted no bytes")
                view = view[written:]
            self._next_seq = seq + 1
            self._end = max(self._end, size) + len(line)
            self._dirty = True
        except BaseException as exc:
            # Part of the line may be in the file: appending more would bury a torn line mid-log.
            self._broken = f"{type(exc).__name__}: {exc}"
            raise
        if self.fsync == "always":
            try:
                self._sync()
            except OSError as exc:
                # The line is whole, but the disk said it may not keep it (and may not say so again).
                self._broken = f"{type(exc).__name__}: {exc}"
                raise
            # An interrupt here (Ctrl-C) leaves a whole line behind: the log can go on, and the
            # next sync, or the close, flushes it.
        return seq

    def _sync(self) -> None:
        assert self._file is not None
        os.fsync(self._file.fileno())
        if self._new_file and os.name == "posix":
            # A new file is only durable once its directory entry is.
            directory = os.open(self.path.parent, os.O_RDONLY)
            try:
                os.fsync(directory)
            finally:
                os.close(directory)
        self._new_file = False
        self._dirty = False
