"""The stdio transport to an MCP server: the SDK's, except that its reader's end always reaches the session.

The SDK's ``stdio_client`` reads the server's stdout in a task of its own.
When that reading fails (an ``OSError`` from the pipe, a decode error, a line
the parser raises on), the task first drains the stdout to its end and only
then closes the session's read stream. While the server lives its stdout never
ends: the session looks live, and every call in flight waits for an answer the
drain throws away (until its budget, if it has one).

Here the read stream is closed as soon as the reading ends, whatever ended it,
so the client sees the same end as when the server exits: the calls in flight
fail ``MCP_SERVER_DIED`` and the next call reconnects. The drain still
follows, so a server blocked writing its output can still exit. Everything
else (starting the process, the writer, the shutdown that stops the server)
is the SDK's own: :func:`stdio_transport` is ``stdio_client`` with that
change, built from the helpers of the pinned ``mcp`` version.

The session also ends when the server process exits, even though its stdout
stays open (a process it started inherited the pipe and lives on): what it
wrote before it died is read (for up to :data:`_EXIT_READ_GRACE_S`), then the
read stream is closed, so the calls in flight fail ``MCP_SERVER_DIED``.

The reader also bounds what it holds: a line (one message) longer than
``max_line_bytes`` is not gathered further, :class:`MessageTooLarge` goes on the
read stream and the stream is closed (the session ends). Lines are assembled
from their pieces once they end, in linear time (the SDK re-copies the pending
line at every chunk: quadratic). A line that is not a message but holds one
after text the server printed without a newline (``progress 50%{"jsonrpc"...``)
is read as that message, with a logged warning showing the text. A UTF-8
byte-order mark opening the output (as .NET and PowerShell programs write) is
dropped: it is no text, and would make the first message unreadable.

When the session ends, whatever is left of the server's process group (it is
started in a session of its own, so the group is the server and what it
started) is terminated, then killed after a grace, whether the server itself
crashed, exited at once, or had to be killed: the SDK does that last only when
the server outlives its own grace, and a crashed server's helpers ran on.

The other change is the server's stderr. The SDK hands the server the host's
own, so whatever it prints (escape sequences that clear the screen or retitle
the window, a fake "all clear" line) reaches the user's terminal untouched,
and a host whose ``sys.stderr`` is no real file (a captured one) cannot start
the server at all. Here (on POSIX) the server writes into a pipe, and a task of
the transport relays it line by line to the host's ``sys.stderr`` as it is at
that moment: prefixed with the server's name (``[mcp:NAME] ...``), through
:func:`dsh_core.presentation.printable` (control characters escaped, as
everything else the CLI prints), a line longer than :data:`STDERR_LINE_BYTES`
cut with a note and the rest of it skipped unread into memory. The relay reads
as fast as the host's stderr takes the lines and drops nothing, so a server is
never held up by a full pipe unless the host's own stderr blocks. Lines the
server leaves in the pipe when it stops (a crash's traceback) are relayed
before the pipe is closed. On Windows the SDK's fallback process offers no
stderr stream to read, and the server keeps the host's stderr as before.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Final, TextIO

import anyio
import anyio.lowlevel
from anyio.abc import ByteReceiveStream, Process
from mcp.client._transport import TransportStreams
from mcp.client.stdio import (
    _WRITER_FLUSH_TIMEOUT,
    StdioServerParameters,
    _aclose_all,
    _close_pipe,
    _create_platform_compatible_process,
    _drain_stdout,
    _get_executable_command,
    _parse_line,
    _stop_server_process,
    get_default_environment,
)
from mcp.os.win32.utilities import ServerProcess
from mcp.shared.message import SessionMessage
from mcp_types import jsonrpc_message_adapter

from dsh_core.presentation import printable

__all__ = ["STDERR_LINE_BYTES", "MessageTooLarge", "stdio_transport"]

logger = logging.getLogger("dsh_plugins.mcp_client")

# Enough for a traceback's longest line; a server printing a gigabyte on one line costs no more.
STDERR_LINE_BYTES: Final = 4096
# How long a stopped server's last stderr lines may take to arrive (a descendant may hold the pipe open).
_STDERR_TAIL_TIMEOUT_S: Final = 2.0
# How long what a server wrote before it exited may take to be read, when its stdout stays open.
_EXIT_READ_GRACE_S: Final = 0.5
_EXIT_POLL_S: Final = 0.1
_UTF8_BOM: Final = b"\xef\xbb\xbf"
# How long what is left of a server's process group has to end on SIGTERM before SIGKILL (the SDK's grace).
_GROUP_GRACE_S: Final = 2.0
_GROUP_POLL_S: Final = 0.02


class _StderrRelay:
    """The server's stderr, one escaped and prefixed line at a time, onto the host's stderr."""

    def __init__(self, server_name: str, encoding: str, errlog: TextIO | None) -> None:
        self._prefix = f"[mcp:{server_name}] "
        self._encoding = encoding
        self._errlog = errlog
        self._line = bytearray()
        self._skipping = False  # the current line was relayed cut: the rest of it is read and dropped
        self.done = anyio.Event()

    async def run(self, stderr: ByteReceiveStream) -> None:
        try:
            async for chunk in stderr:
                *ended, rest = chunk.split(b"\n")
                for piece in ended:
                    self._take(piece)
                    if not self._skipping:
                        self._emit(self._line)
                    self._line.clear()
                    self._skipping = False
                self._take(rest)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            pass  # closed under the read by the shutdown, or the pipe failed: either way nothing more comes
        finally:
            if self._line and not self._skipping:
                self._emit(self._line)  # a last line the server never ended
            self._line.clear()
            self.done.set()

    def _take(self, piece: bytes) -> None:
        if self._skipping:
            return
        self._line += piece
        if len(self._line) > STDERR_LINE_BYTES:
            self._emit(self._line[:STDERR_LINE_BYTES], note=f" … (line cut at {STDERR_LINE_BYTES} bytes)")
            self._line.clear()
            self._skipping = True

    def _emit(self, line: bytes | bytearray, note: str = "") -> None:
        text = bytes(line).decode(self._encoding, errors="replace").removesuffix("\r")
        out = self._errlog if self._errlog is not None else sys.stderr
        if out is None:
            return  # no stderr at all (pythonw): nowhere to show it
        try:
            out.write(f"{printable(self._prefix + text, one_line=True)}{note}\n")
            out.flush()
        except (OSError, ValueError):
            pass  # a closed or broken host stderr loses the line, never the session


class MessageTooLarge(Exception):
    """The server wrote a line (one message) longer than the transport's limit: the session ends.

    Put on the read stream, as the SDK puts what it could not parse, just before
    the stream is closed: the client can tell the calls in flight why.
    """

    def __init__(self, limit: int) -> None:
        super().__init__(f"a message (line) longer than {limit} bytes")
        self.limit = limit


class _Lines:
    """The complete lines of a byte stream, assembled in linear time, none longer than ``limit`` bytes.

    Each chunk is split on its own newlines; the pieces of an unfinished line
    are kept in a list (never re-joined until the line ends), so a line of n
    bytes costs O(n), not O(n²). A line found longer than ``limit`` (without
    its newline) makes :meth:`feed` raise :class:`MessageTooLarge`, once no more
    than ``limit`` bytes of it are held.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._pieces: list[bytes] = []
        self._length = 0

    def feed(self, chunk: bytes) -> list[bytes]:
        *ended, rest = chunk.split(b"\n")
        lines = []
        for piece in ended:
            if self._length + len(piece) > self.limit:
                raise MessageTooLarge(self.limit)
            if self._pieces:
                self._pieces.append(piece)
                piece = b"".join(self._pieces)
                self._pieces.clear()
                self._length = 0
            lines.append(piece)
        if rest:
            if self._length + len(rest) > self.limit:
                raise MessageTooLarge(self.limit)
            self._pieces.append(rest)
            self._length += len(rest)
        return lines


# Where a JSON object starts after text the server printed without a newline ("progress 50%{...").
_OBJECT_START: Final = re.compile(r'\{\s*"')
_STRAY_TEXT_SHOWN: Final = 200


def _parse(line: str, name: str) -> SessionMessage | Exception:
    """``_parse_line``, also taking a message that follows text printed without a newline.

    A server (or a library in it) printing a banner or a progress note with no
    newline glues it to its next message: read whole, that line is plain text,
    and the answer it holds would be lost, the call waiting for it forever.
    """
    if not line.lstrip().startswith("{"):
        found = _OBJECT_START.search(line)
        if found is not None:
            try:
                message = jsonrpc_message_adapter.validate_json(line[found.start() :], by_name=False)
            except ValueError:
                pass  # not a message either: the whole line is read as before
            else:
                stray = printable(line[: found.start()][:_STRAY_TEXT_SHOWN], one_line=True)
                logger.warning('MCP server "%s" printed text before a message on its stdout: %s', name, stray)
                return SessionMessage(message)
    return _parse_line(line)


async def _end_process_group(pgid: int) -> None:
    """Terminate what is left of process group ``pgid``; kill it after :data:`_GROUP_GRACE_S`.

    The SDK's ``terminate_posix_process_tree``, except that members that have
    exited count as gone: an orphan's zombie waits for its reaper (init, which
    in a container may be slow, or never reap), and the group would seem to
    live on for the whole grace.
    """
    import signal

    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return  # nothing left of it
    except PermissionError:
        pass  # never proves the group gone: wait, and escalate
    with anyio.move_on_after(_GROUP_GRACE_S):
        while _group_running(pgid):
            await anyio.sleep(_GROUP_POLL_S)
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _group_running(pgid: int) -> bool:
    """Whether a process of group ``pgid`` still runs (on Linux, zombies do not count)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if not sys.platform.startswith("linux"):
        return True
    try:
        entries = os.listdir("/proc")
    except OSError:
        return True
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                fields = stat.read().rpartition(b")")[2].split()
        except OSError:
            continue  # gone meanwhile
        if len(fields) > 2 and fields[2] == str(pgid).encode() and fields[0] != b"Z":
            return True
    return False


async def _exited(process: Process) -> None:
    """Return once ``process`` has exited (not once its pipes end: a descendant may hold them)."""
    import sniffio

    if sniffio.current_async_library() == "trio":
        await process.wait()  # trio waits for the process alone (a pidfd on Linux)
        return
    while process.returncode is None:  # asyncio's wait() waits for the pipes' EOF too
        await anyio.sleep(_EXIT_POLL_S)


@asynccontextmanager
async def stdio_transport(
    server: StdioServerParameters, *, name: str, errlog: TextIO | None = None, max_line_bytes: int
) -> AsyncIterator[TransportStreams]:
    """Spawn the server and connect to it over its stdin and stdout (``mcp.client.stdio.stdio_client``'s contract).

    ``name`` prefixes the server's stderr lines, relayed to ``errlog`` (by
    default the ``sys.stderr`` of the moment each line arrives).
    ``max_line_bytes``: the longest line (one message) taken from the server's
    stdout; a longer one ends the session: :class:`MessageTooLarge` is put on
    the read stream, which is then closed (the rest is drained unread).
    """
    command = await _get_executable_command(server.command)
    env = get_default_environment() | (server.env or {})
    process: ServerProcess
    if sys.platform == "win32":  # pragma: no cover
        process = await _create_platform_compatible_process(
            command=command, args=server.args, env=env, errlog=errlog or sys.stderr, cwd=server.cwd
        )
    else:
        # _create_platform_compatible_process's POSIX spawn, with the stderr piped to the relay.
        process = await anyio.open_process(
            [command, *server.args], env=env, stderr=subprocess.PIPE, cwd=server.cwd, start_new_session=True
        )
    stderr = process.stderr if isinstance(process, Process) else None
    relay = _StderrRelay(name, server.encoding, errlog)

    # The spawn succeeded; no awaits until the task group is entered, or a
    # cancellation delivered in the gap would leak the live process.
    read_stream_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_stream_reader = anyio.create_memory_object_stream[SessionMessage](0)

    shutting_down = False
    writer_done = anyio.Event()
    reading_done = anyio.Event()  # the reader closed the read stream (it may still be draining)

    async def stdout_reader() -> None:
        assert process.stdout, "Opened process is missing stdout"

        lines = _Lines(max_line_bytes)
        at_start = True  # a UTF-8 byte-order mark may open the stream (.NET, PowerShell): it is no text
        try:
            try:
                # Closed on every way out, before the drain: the session must not outlive the reading.
                async with read_stream_writer:
                    async for chunk in process.stdout:
                        try:
                            ended = lines.feed(chunk)
                        except MessageTooLarge as exc:
                            # The client reports it (the read watch); logged here for a client that does not.
                            logger.debug('MCP server "%s" sent %s; the session is ended', name, exc)
                            with contextlib.suppress(anyio.ClosedResourceError, anyio.BrokenResourceError):
                                await read_stream_writer.send(exc)
                            return  # closes the read stream: the drain below reads the rest unkept
                        for raw in ended:
                            if at_start:
                                raw = raw.removeprefix(_UTF8_BOM)
                                at_start = False
                            # Split on bytes, decoded a line at a time: a newline byte is never part of
                            # a longer character in the encodings a server speaks (UTF-8).
                            line = raw.decode(server.encoding, errors=server.encoding_error_handler)
                            try:
                                await read_stream_writer.send(_parse(line, name))
                            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                                return  # the session is gone; only the drain below remains
            finally:
                reading_done.set()
                await _drain_stdout(process)
        except anyio.ClosedResourceError:
            pass  # our own shutdown closed the stdout stream under the read
        except (anyio.BrokenResourceError, ConnectionError):
            # Teardown noise during shutdown, a real failure otherwise (anything else
            # goes on to the task group, and so to the session's task, as in the SDK).
            if not shutting_down:
                logger.exception("Reading from the MCP server's stdout failed mid-session")

    async def stdin_writer() -> None:
        assert process.stdin, "Opened process is missing stdin"

        try:
            async with write_stream_reader:
                async for session_message in write_stream_reader:
                    json = session_message.message.model_dump_json(by_alias=True, exclude_unset=True)
                    data = (json + "\n").encode(encoding=server.encoding, errors=server.encoding_error_handler)
                    await process.stdin.send(data)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            # The server may still be alive: close the read stream so the session
            # sees the connection end instead of a request hanging forever.
            await read_stream_writer.aclose()
        finally:
            writer_done.set()

    async def exit_watch() -> None:
        # A server that died while a process it started still holds its stdout sends no EOF:
        # without this, the session would look live and the calls in flight wait forever.
        await _exited(process)
        with anyio.move_on_after(_EXIT_READ_GRACE_S):
            await reading_done.wait()  # what it wrote before it died is read first
        if not reading_done.is_set() and not shutting_down:
            logger.warning(
                'MCP server "%s" exited (status %s), but its stdout is still open (held by a process it started); '
                "its session is ended",
                name,
                process.returncode,
            )
        await read_stream_writer.aclose()

    async def shutdown() -> None:
        # Unblock the reader into its drain: a server stuck writing stdout cannot
        # read its stdin, so draining is what lets the flush below complete.
        read_stream.close()
        write_stream.close()
        with anyio.move_on_after(_WRITER_FLUSH_TIMEOUT) as flush_scope:
            await writer_done.wait()
        if flush_scope.cancelled_caught:
            await anyio.lowlevel.cancel_shielded_checkpoint()
        await _stop_server_process(process)
        if sys.platform != "win32" and isinstance(process, Process):
            # The SDK kills the server's process group only when the server outlives its grace:
            # one that crashed, or exited at once, left whatever it started running, for good.
            await _end_process_group(process.pid)
        if stderr is not None:
            # The server is gone: what it left in the pipe (a crash's traceback) is relayed, then the pipe closed.
            with anyio.move_on_after(_STDERR_TAIL_TIMEOUT_S):
                await relay.done.wait()
            await _close_pipe(stderr)
        await _aclose_all(read_stream, write_stream, read_stream_writer, write_stream_reader)
        await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg:
        if stderr is not None:
            tg.start_soon(relay.run, stderr)
        tg.start_soon(stdout_reader)
        tg.start_soon(stdin_writer)
        if isinstance(process, Process):
            tg.start_soon(exit_watch)
        try:
            yield read_stream, write_stream
        finally:
            shutting_down = True
            # Shutdown must finish even under the caller's cancellation, or the server process would leak.
            with anyio.CancelScope(shield=True):
                await shutdown()
            tg.cancel_scope.cancel()
    await anyio.lowlevel.cancel_shielded_checkpoint()
