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
is the SDK's own: :func:`stdio_transport` is ``stdio_client`` with that one
change, built from the helpers of the pinned ``mcp`` version.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TextIO

import anyio
import anyio.lowlevel
from anyio.streams.text import TextReceiveStream
from mcp.client._transport import TransportStreams
from mcp.client.stdio import (
    _WRITER_FLUSH_TIMEOUT,
    StdioServerParameters,
    _aclose_all,
    _create_platform_compatible_process,
    _drain_stdout,
    _get_executable_command,
    _parse_line,
    _stop_server_process,
    get_default_environment,
)
from mcp.shared.message import SessionMessage

__all__ = ["stdio_transport"]

logger = logging.getLogger("dsh_plugins.mcp_client")


@asynccontextmanager
async def stdio_transport(
    server: StdioServerParameters, errlog: TextIO = sys.stderr
) -> AsyncIterator[TransportStreams]:
    """Spawn the server and connect to it over its stdin and stdout (``mcp.client.stdio.stdio_client``'s contract)."""
    command = await _get_executable_command(server.command)
    process = await _create_platform_compatible_process(
        command=command,
        args=server.args,
        env=get_default_environment() | (server.env or {}),
        errlog=errlog,
        cwd=server.cwd,
    )

    # The spawn succeeded; no awaits until the task group is entered, or a
    # cancellation delivered in the gap would leak the live process.
    read_stream_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_stream_reader = anyio.create_memory_object_stream[SessionMessage](0)

    shutting_down = False
    writer_done = anyio.Event()

    async def stdout_reader() -> None:
        assert process.stdout, "Opened process is missing stdout"

        stdout = TextReceiveStream(process.stdout, encoding=server.encoding, errors=server.encoding_error_handler)
        try:
            try:
                # Closed on every way out, before the drain: the session must not outlive the reading.
                async with read_stream_writer:
                    buffer = ""
                    async for chunk in stdout:
                        lines = (buffer + chunk).split("\n")
                        buffer = lines.pop()
                        for line in lines:
                            try:
                                await read_stream_writer.send(_parse_line(line))
                            except (anyio.ClosedResourceError, anyio.BrokenResourceError):
                                return  # the session is gone; only the drain below remains
            finally:
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
        await _aclose_all(read_stream, write_stream, read_stream_writer, write_stream_reader)
        await anyio.lowlevel.checkpoint()

    async with anyio.create_task_group() as tg:
        tg.start_soon(stdout_reader)
        tg.start_soon(stdin_writer)
        try:
            yield read_stream, write_stream
        finally:
            shutting_down = True
            # Shutdown must finish even under the caller's cancellation, or the server process would leak.
            with anyio.CancelScope(shield=True):
                await shutdown()
            tg.cancel_scope.cancel()
    await anyio.lowlevel.cancel_shielded_checkpoint()
