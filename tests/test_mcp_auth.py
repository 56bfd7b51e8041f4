"""Bearer-token authentication of ``serve_http``, ``serve-mcp --http`` and the MCP client's ``token_env``.

Servers run in-process on hypercorn's trio worker (port 0), as in ``test_mcp.py``;
the CLI's token sources are tested with ``run_serve_mcp`` replaced, and one test
runs ``dsh-tools serve-mcp --http`` as a real process.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")
pytest.importorskip("hypercorn")

import httpx2
import trio
from mcp import Client

from dsh_core import ToolRuntime
from dsh_core._mcp_bearer import BearerTokenGate
from dsh_core._mcp_server import serve_http
from dsh_core.testing import json_tool, make_runtime

TOKEN = "s3cret-token_for-tests~0123456789"
REPO = Path(__file__).resolve().parent.parent

INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-06-18",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "0"},
    },
}
MCP_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def adding_runtime() -> ToolRuntime:
    async def add(args: dict[str, Any]) -> int:
        return int(args["a"]) + int(args["b"])

    return make_runtime(
        json_tool(
            "add", add, parameters={"a": {"type": "integer"}, "b": {"type": "integer"}}, output={"type": "integer"}
        )
    )


@asynccontextmanager
async def serving(token: str | None = TOKEN) -> AsyncIterator[str]:
    """The base URL of ``adding_runtime()`` served over HTTP with ``token``, until the block ends."""
    async with trio.open_nursery() as nursery:
        (base,) = await nursery.start(
            lambda task_status: serve_http(
                adding_runtime(), "127.0.0.1", 0, bearer_token=token, task_status=task_status
            )
        )
        yield base
        nursery.cancel_scope.cancel()


async def post(url: str, headers: dict[str, str] | None = None) -> httpx2.Response:
    async with httpx2.AsyncClient() as http:
        return await http.post(url, json=INITIALIZE, headers={**MCP_HEADERS, **(headers or {})})


# -- serve_http ------------------------------------------------------------------------------------


async def test_a_request_without_the_token_is_refused_before_the_mcp_app() -> None:
    async with serving() as base:
        response = await post(base + "/mcp")
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == "Bearer"
    assert response.headers["content-type"] == "application/json"
    assert response.json() == {
        "error": "unauthorized",
        "error_description": "this MCP server needs the header 'Authorization: Bearer <token>' with its token",
    }


@pytest.mark.parametrize(
    "authorization",
    [
        "Bearer wrong",
        f"Bearer {TOKEN[:-1]}",  # a prefix: compared exactly, not as far as it goes
        f"Bearer {TOKEN}x",
        f"Basic {TOKEN}",
        TOKEN,
        f"Bearer  {TOKEN}",
    ],
)
async def test_a_request_with_a_wrong_token_is_refused(authorization: str) -> None:
    async with serving() as base:
        response = await post(base + "/mcp", {"Authorization": authorization})
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer")
    assert TOKEN not in response.text


async def test_a_request_with_the_token_reaches_the_mcp_app() -> None:
    async with serving() as base:
        response = await post(base + "/mcp", {"Authorization": f"Bearer {TOKEN}"})
        lower_scheme = await post(base + "/mcp", {"Authorization": f"bearer {TOKEN}"})
    assert response.status_code == 200, response.text
    assert "www-authenticate" not in response.headers
    assert lower_scheme.status_code == 200  # RFC 7235: the scheme is case-insensitive


async def test_every_path_the_app_serves_is_behind_the_token() -> None:
    async with serving() as base, httpx2.AsyncClient() as http:
        other = await http.get(base + "/somewhere-else")
        get = await http.get(base + "/mcp", headers={"Accept": "text/event-stream"})
        delete = await http.delete(base + "/mcp")
        behind = await http.get(base + "/somewhere-else", headers={"Authorization": f"Bearer {TOKEN}"})
    assert [other.status_code, get.status_code, delete.status_code] == [401, 401, 401]
    assert behind.status_code == 404  # with the token, the app itself answers


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the SDK's SSE reader, as in test_mcp
async def test_an_sdk_client_sending_the_token_calls_a_tool() -> None:
    async with serving() as base, httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        from mcp.client.streamable_http import streamable_http_client

        async with Client(streamable_http_client(base + "/mcp", http_client=http), mode="legacy") as client:
            result = await client.call_tool("add", {"a": 2, "b": 3})
    assert result.structured_content == {"result": 5}


async def test_without_a_token_serve_http_serves_everyone() -> None:
    async with serving(token=None) as base:
        response = await post(base + "/mcp")
    assert response.status_code == 200


@pytest.mark.parametrize("token", ["", " ", "two words", "line\nbreak", "tab\t", "nul\x00", "caf\u00e9"])
async def test_serve_http_refuses_a_token_no_header_could_carry(token: str) -> None:
    with pytest.raises(ValueError, match="bearer token") as caught:
        await serve_http(adding_runtime(), "127.0.0.1", 0, bearer_token=token)
    if token.strip():
        assert token not in str(caught.value)


def test_the_gate_never_shows_its_token() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        pass

    assert TOKEN not in repr(BearerTokenGate(app, TOKEN))
