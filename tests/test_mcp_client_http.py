"""The MCP client over streamable HTTP (and its request bookkeeping): what a failure means.

Servers are dsh's own ``serve_http`` in this process (hypercorn on trio), or a
fake one (:func:`fake_http_server`) answering with what no SDK server would.
The real clock with short budgets: hypercorn and the HTTP client run on it.
"""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")

import trio

from dsh_core import ToolEffects, ToolRuntime
from dsh_core._mcp_server import serve_http
from dsh_core.testing import json_tool, make_input, make_runtime
from dsh_plugins import mcp_client
from dsh_plugins.mcp_client import (
    MCP_ERROR,
    MCP_SERVER_DIED,
    MCP_SERVER_UNAVAILABLE,
    McpClientPlugin,
    McpClientSettings,
    McpServerSettings,
)

HERE = Path(__file__).resolve()

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

READ_ONLY = ToolEffects(read_only=True)


def http_entry(base: str, **options: Any) -> dict[str, Any]:
    return {"name": "loop", "url": base + "/mcp", "prefix": "loop", **options}


# -- a result larger than the client takes -------------------------------------------------------


async def test_a_result_over_the_event_limit_fails_that_call_alone_and_is_not_retried() -> None:
    runs = {"big": 0, "slow": 0}
    slow_started = trio.Event()

    async def big(args: Any) -> str:
        runs["big"] += 1
        return "x" * 100_000

    async def slow(args: Any) -> str:
        runs["slow"] += 1
        slow_started.set()
        await trio.sleep(0.5)
        return "slow done"

    served = make_runtime(
        json_tool("big", big, output={"type": "string"}, effects=READ_ONLY),
        json_tool("slow", slow, output={"type": "string"}),
    )
    runtime = ToolRuntime()
    results: dict[str, Any] = {}
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            (base,) = await nursery.start(serve_http, served, "127.0.0.1", 0)
            config = {"servers": [http_entry(base, max_event_bytes=64 * 1024, retry_attempts=3)]}
            async with McpClientPlugin.connect(runtime, config):
                async with trio.open_nursery() as calls:

                    async def call(name: str) -> None:
                        results[name] = await runtime.execute(make_input(f"loop__{name}"))

                    calls.start_soon(call, "slow")
                    await slow_started.wait()
                    calls.start_soon(call, "big")
                after = await runtime.execute(make_input("loop__slow"))
            nursery.cancel_scope.cancel()
    big_result = results["big"]
    assert big_result.code == MCP_ERROR
    assert big_result.error.message == (
        'MCP server "loop" sent a result for "big" larger than the client\'s limit of 65536 bytes '
        "(max_event_bytes in its [[plugins.mcp.servers]] entry)"
    )
    assert runs["big"] == 1  # not retried
    assert results["slow"].value == {"result": "slow done"}  # the session lived on for the call in flight
    assert after.value == {"result": "slow done"}
    assert runs["slow"] == 2


async def test_a_result_of_a_few_mebibytes_fits_the_default_limit() -> None:
    async def big(args: Any) -> str:
        return "x" * (2 * 1024 * 1024)

    served = make_runtime(json_tool("big", big, output={"type": "string"}))
    runtime = ToolRuntime()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            (base,) = await nursery.start(serve_http, served, "127.0.0.1", 0)
            async with McpClientPlugin.connect(runtime, {"servers": [http_entry(base)]}):
                result = await runtime.execute(make_input("loop__big"))
            nursery.cancel_scope.cancel()
    assert not result.is_error, result.error.message
    assert result.value == {"result": "x" * (2 * 1024 * 1024)}


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "big"])
def test_max_event_bytes_must_be_a_positive_integer(value: Any) -> None:
    with pytest.raises(ValueError, match="max_event_bytes"):
        McpServerSettings(name="s", url="http://127.0.0.1:1/mcp", max_event_bytes=value)


# -- a fake HTTP server -----------------------------------------------------------------------------

Answer = Callable[[dict[str, Any]], Awaitable[dict[str, Any] | None]]


async def fake_http_server(answer: Answer, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve JSON-RPC over HTTP, one JSON response per POST (``answer`` gives its ``result`` or ``error``).

    A reply's ``"status"`` is the HTTP status (200 unless given), its ``"session"`` an ``mcp-session-id``.
    """

    async def handle(stream: trio.SocketStream) -> None:
        try:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    return
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            lengths = [
                line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
            ]
            length = int(lengths[0]) if lengths else 0
            while len(body) < length:
                body += await stream.receive_some(65536)
            request = json.loads(body) if body else {}
            if request.get("id") is None:
                await stream.send_all(b"HTTP/1.1 202 Accepted\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                return
            reply = dict(await answer(request) or {})
            status = reply.pop("status", 200)
            session = f"mcp-session-id: {reply.pop('session')}\r\n".encode() if "session" in reply else b""
            out = json.dumps({"jsonrpc": "2.0", "id": request["id"], **reply}).encode()
            await stream.send_all(
                b"HTTP/1.1 %d X\r\ncontent-type: application/json\r\ncontent-length: %d\r\n%b"
                b"connection: close\r\n\r\n" % (status, len(out), session) + out
            )
        finally:
            await stream.aclose()

    async with trio.open_nursery() as nursery:
        (listener,) = await nursery.start(partial(trio.serve_tcp, handle, 0, host="127.0.0.1"))
        task_status.started(f"http://127.0.0.1:{listener.socket.getsockname()[1]}")


INITIALIZED = {
    "result": {
        "protocolVersion": "2025-06-18",
        "capabilities": {"tools": {}},
        "serverInfo": {"name": "fake", "version": "1"},
    }
}
ECHO_LISTED = {"result": {"tools": [{"name": "echo", "inputSchema": {"type": "object"}}]}}


async def test_a_server_error_in_the_transports_own_words_is_still_the_servers_answer() -> None:
    # The HTTP transport stands in for a lost response with a -32000 "SSE stream ..." error of its
    # own; a server answering those words itself has not lost its connection.
    calls: list[str] = []

    async def answer(request: dict[str, Any]) -> dict[str, Any] | None:
        if request["method"] == "initialize":
            return INITIALIZED
        if request["method"] == "tools/list":
            return ECHO_LISTED
        calls.append(request["method"])
        return {"error": {"code": -32000, "message": "SSE stream ended without a response"}}

    runtime = ToolRuntime()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            base = await nursery.start(fake_http_server, answer)
            config = {"servers": [{"name": "fake", "url": base + "/mcp", "retry_attempts": 3}]}
            async with McpClientPlugin.connect(runtime, config) as plugin:
                session = plugin._servers[0].session
                failed = await runtime.execute(make_input("echo"))
                assert plugin._servers[0].session is session  # not ended
            nursery.cancel_scope.cancel()
    assert failed.code == MCP_ERROR
    assert failed.error.message == (
        'MCP server "fake" answered the call to "echo" with error -32000: SSE stream ended without a response'
    )
    assert calls == ["tools/call"]


# -- server-supplied text is bounded ---------------------------------------------------------------

HUGE = "server says: " + "A" * 3_000_000


async def test_an_unavailable_servers_own_words_are_cut_short_everywhere(caplog: pytest.LogCaptureFixture) -> None:
    async def answer(request: dict[str, Any]) -> dict[str, Any] | None:
        return {"error": {"code": -32603, "message": HUGE}}

    caplog.set_level(logging.WARNING)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            base = await nursery.start(fake_http_server, answer)
            runtime = ToolRuntime()
            server = McpServerSettings(name="s", url=base + "/mcp")
            settings = McpClientSettings(servers=(server,), connect_timeout_s=5, backoff_initial_s=0.01)
            plugin = McpClientPlugin(runtime, settings)
            await plugin.sync()  # a listing that fails: a diagnostic and a logged warning
            diagnostics = [str(d) for d in plugin.diagnostics()]
            async with plugin.running():
                body = plugin._body(plugin._servers[0], "echo", False)

                async def echo(args: Any, run: Any) -> object:
                    return await body(args, run)

                runtime.register(json_tool("s__echo", echo))
                result = await runtime.execute(make_input("s__echo"))
            nursery.cancel_scope.cancel()
    assert result.code == MCP_SERVER_UNAVAILABLE
    assert result.error.message.startswith('MCP server "s" is unavailable: ')
    assert "server says: AAA" in result.error.message
    assert len(result.error.message) < 700
    assert diagnostics and all(len(d) < 700 for d in diagnostics)
    assert "server says: AAA" in diagnostics[0]
    assert caplog.records and all(len(record.getMessage()) < 700 for record in caplog.records)


# -- request ids ----------------------------------------------------------------------------------


async def test_a_call_outlived_by_many_others_still_gets_its_answer_over_http(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mcp_client, "_SENT_IDS_KEPT", 8)
    release = trio.Event()

    async def slow(args: Any) -> str:
        await release.wait()
        return "slow done"

    async def fast(args: Any) -> str:
        return "ok"

    served = make_runtime(
        json_tool("slow", slow, output={"type": "string"}), json_tool("fast", fast, output={"type": "string"})
    )
    runtime = ToolRuntime()
    out: dict[str, Any] = {}
    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            (base,) = await nursery.start(serve_http, served, "127.0.0.1", 0)
            async with McpClientPlugin.connect(runtime, {"servers": [http_entry(base)]}) as plugin:
                async with trio.open_nursery() as calls:

                    async def long_call() -> None:
                        out["slow"] = await runtime.execute(make_input("loop__slow"))

                    calls.start_soon(long_call)
                    await trio.sleep(0.3)
                    fast = [await runtime.execute(make_input("loop__fast")) for _ in range(20)]
                    release.set()
                session = plugin._servers[0].session
                assert session is not None
                assert not session.sent  # every request settled
                assert len(session.settled) <= 8
            nursery.cancel_scope.cancel()
    assert [r.value for r in fast] == [{"result": "ok"}] * 20
    assert out["slow"].value == {"result": "slow done"}


async def test_a_call_outlived_by_many_others_still_gets_its_answer_over_stdio(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mcp_client, "_SENT_IDS_KEPT", 8)
    entry = {"name": "proc", "command": sys.executable, "args": [str(HERE.parent / "test_mcp.py")], "prefix": "proc"}
    runtime = ToolRuntime()
    out: dict[str, Any] = {}
    with trio.fail_after(60):
        async with McpClientPlugin.connect(runtime, {"servers": [entry]}), trio.open_nursery() as calls:

            async def long_call() -> None:
                out["slow"] = await runtime.execute(make_input("proc__slow", {"seconds": 1.5}))

            calls.start_soon(long_call)
            await trio.sleep(0.2)
            added = [await runtime.execute(make_input("proc__add", {"a": i, "b": 1})) for i in range(20)]
    assert [r.value for r in added] == [{"total": i + 1} for i in range(20)]
    assert out["slow"].value == {"result": "done"}


# -- a server that restarted ----------------------------------------------------------------------


async def test_a_call_to_a_restarted_server_starts_a_new_session_and_is_sent_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The restarted server no longer knows the session id and answers 404: the request was
    # not processed, so it is sent once more over a new session.
    runs: list[int] = []

    async def add(args: Any) -> int:
        runs.append(args["b"])
        return int(args["a"] + args["b"])

    def served() -> ToolRuntime:
        return make_runtime(json_tool("add", add, output={"type": "integer"}))

    runtime = ToolRuntime()
    results: list[Any] = []
    with trio.fail_after(60):
        async with trio.open_nursery() as outer:
            first_server = trio.CancelScope()

            async def run_first(task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
                with first_server:
                    await serve_http(served(), "127.0.0.1", 0, task_status=task_status)

            (base,) = await outer.start(run_first)
            port = int(base.rsplit(":", 1)[1])
            config = {"servers": [http_entry(base)], "backoff_initial_s": 0.05}
            async with McpClientPlugin.connect(runtime, config) as plugin:
                results.append(await runtime.execute(make_input("loop__add", {"a": 1, "b": 0})))
                old_session = plugin._servers[0].session
                first_server.cancel()
                await trio.sleep(0.3)
                await outer.start(serve_http, served(), "127.0.0.1", port)
                for b in (1, 2):
                    results.append(await runtime.execute(make_input("loop__add", {"a": 1, "b": b})))
                assert plugin._servers[0].session is not old_session
            outer.cancel_scope.cancel()
    assert [r.value if not r.is_error else r.error.message for r in results] == [{"result": n} for n in (1, 2, 3)]
    assert runs == [0, 1, 2]  # each call ran once
    # Quietly: the old session is not torn down as if it had failed, nor ended with the server.
    warnings = [
        r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith(("dsh", "mcp"))
    ]
    assert warnings == []


async def test_a_call_the_server_refuses_for_a_new_session_too_fails_as_died() -> None:
    # Sent again once only: a server answering 404 to every session is not sent the call forever.
    seen: list[str] = []

    async def answer(request: dict[str, Any]) -> dict[str, Any] | None:
        seen.append(request["method"])
        if request["method"] == "initialize":
            return {**INITIALIZED, "session": f"s{len(seen)}"}
        if request["method"] == "tools/list":
            return ECHO_LISTED
        return {"status": 404, "error": {"code": -32600, "message": "Session not found"}}

    runtime = ToolRuntime()
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            base = await nursery.start(fake_http_server, answer)
            config = {"servers": [{"name": "fake", "url": base + "/mcp"}], "backoff_initial_s": 0.01}
            async with McpClientPlugin.connect(runtime, config):
                failed = await runtime.execute(make_input("echo"))
            nursery.cancel_scope.cancel()
    assert failed.code == MCP_SERVER_DIED
    assert failed.error.message == 'MCP server "fake" died during the call to "echo"; it is restarted on the next call'
    calls = [method for method in seen if method in ("initialize", "tools/call")]
    assert calls == ["initialize", "tools/call", "initialize", "tools/call"]
