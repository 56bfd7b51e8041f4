"""The streamable HTTP transport to an MCP server: the SDK's, except that it says which failures were its own.

The SDK's transport fails a request whose response can never arrive (the
response stream ended, an event was larger than its limit, the server
answered 202) by putting a JSON-RPC error of its own on the read stream, in
the same form as a server's answer. A server can answer with the very same
code and words, so the client could only guess from the text which it was, and
a server's "SSE stream ..." error would pass for a lost connection. Here the
transport tells the caller each request it stood in for, and why
(``on_stand_in``), before the error is read.

It also tells the caller each request the server refused with ``404`` under a
session id (``on_session_gone``): the server no longer knows the session (it
restarted, or expired it), and did not process the request. The SDK hands that
on as an ordinary error answer (``Session not found``, say), with the status
left behind.

Everything else is the SDK's own: :func:`http_transport` is
``mcp.client.streamable_http.streamable_http_client`` with those two reports,
built from the helpers of the pinned ``mcp`` version.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import anyio
import httpx2
from mcp.client._transport import TransportStreams
from mcp.client.streamable_http import MCP_SESSION_ID, StreamableHTTPTransport, StreamWriter
from mcp.shared._compat import resync_tracer
from mcp.shared._context_streams import create_context_streams
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.dispatcher import coerce_request_id
from mcp.shared.message import SessionMessage
from mcp_types import CONNECTION_CLOSED, RequestId

__all__ = ["http_transport"]

StandInReport = Callable[[object, str], None]
"""Called with a request's id and the transport's words, before its stand-in error is read."""

SessionGoneReport = Callable[[object | None], None]
"""Called with the id of the request the server refused for an unknown session (``None``: not a request)."""


class _ReportingTransport(StreamableHTTPTransport):
    def __init__(self, url: str, *, max_sse_event_size: int, on_stand_in: StandInReport) -> None:
        super().__init__(url, max_sse_event_size=max_sse_event_size)
        self._on_stand_in = on_stand_in

    async def _resolve_abandoned_request(
        self, read_stream_writer: StreamWriter, request_id: RequestId, message: str, *, code: int = CONNECTION_CLOSED
    ) -> None:
        self._on_stand_in(coerce_request_id(request_id), message)
        await super()._resolve_abandoned_request(read_stream_writer, request_id, message, code=code)


def _session_gone_hook(on_session_gone: SessionGoneReport) -> Callable[[httpx2.Response], object]:
    async def check(response: httpx2.Response) -> None:
        request = response.request
        # Without a session id, 404 is the server not knowing the method (the SDK says so).
        if (
            response.status_code != 404
            or MCP_SESSION_ID not in request.headers
            or request.method not in ("POST", "GET")
        ):
            return
        request_id: object | None = None
        if request.method == "POST":
            try:
                message = json.loads(request.content)
            except ValueError:
                message = None
            if isinstance(message, dict) and "method" in message and message.get("id") is not None:
                request_id = coerce_request_id(message["id"])
        on_session_gone(request_id)

    return check


@asynccontextmanager
async def http_transport(
    url: str,
    *,
    max_event_bytes: int,
    on_stand_in: StandInReport,
    on_session_gone: SessionGoneReport,
    http_client: httpx2.AsyncClient | None = None,
) -> AsyncIterator[TransportStreams]:
    """Connect to the server at ``url`` (``streamable_http_client``'s contract, session ended on exit).

    ``max_event_bytes``: the largest server-sent event (so the largest result)
    taken; ``http_client``: a configured client (the SDK's default otherwise).
    """
    client = http_client if http_client is not None else create_mcp_http_client()
    gone: list[object | None] = []

    def session_gone(request_id: object | None) -> None:
        gone.append(request_id)
        on_session_gone(request_id)

    client.event_hooks["response"].append(_session_gone_hook(session_gone))
    transport = _ReportingTransport(url, max_sse_event_size=max_event_bytes, on_stand_in=on_stand_in)

    async with contextlib.AsyncExitStack() as stack:
        if http_client is None:
            await stack.enter_async_context(client)
        read_stream_writer, read_stream = create_context_streams[SessionMessage | Exception](0)
        write_stream, write_stream_reader = create_context_streams[SessionMessage](0)
        async with read_stream_writer, read_stream, write_stream, write_stream_reader, anyio.create_task_group() as tg:

            def start_get_stream() -> None:
                tg.start_soon(transport.handle_get_stream, client, read_stream_writer)

            tg.start_soon(
                transport.post_writer,
                client,
                write_stream_reader,
                read_stream_writer,
                write_stream,
                start_get_stream,
                tg,
            )
            try:
                yield read_stream, write_stream
            finally:
                if transport.session_id and not gone:  # a session the server forgot has nothing to end
                    await transport.terminate_session(client)
                tg.cancel_scope.cancel()
        await resync_tracer()
