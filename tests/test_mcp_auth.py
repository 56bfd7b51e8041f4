"""Bearer-token authentication of ``serve_http``, ``serve-mcp --http`` and the MCP client's ``token_env``.

Servers run in-process on hypercorn's trio worker (port 0), as in ``test_mcp.py``;
the CLI's token sources are tested with ``run_serve_mcp`` replaced, and one test
runs ``dsh-tools serve-mcp --http`` as a real process.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp")
pytest.importorskip("hypercorn")

import httpx2
import trio
from click.testing import CliRunner, Result
from mcp import Client

from dsh_core import ToolRuntime
from dsh_core._cli import cli
from dsh_core._mcp_bearer import BearerTokenGate
from dsh_core._mcp_server import serve_http
from dsh_core.testing import json_tool, make_input, make_runtime
from dsh_plugins.mcp_client import (
    MCP_SERVER_UNAVAILABLE,
    McpClientPlugin,
    McpClientSettings,
    McpServerSettings,
)

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


# -- dsh-tools serve-mcp: where the token comes from -----------------------------------------------


class FakeServe:
    """Stands in for ``run_serve_mcp``: records what the CLI passed and says it listens on a made-up URL."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, runtime: ToolRuntime, **options: Any) -> None:
        self.calls.append(options)
        on_listening = options["on_listening"]
        if options["http"]:
            on_listening(["http://127.0.0.1:8765"])


@pytest.fixture
def fake_serve(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeServe:
    import dsh_core._mcp_server

    fake = FakeServe()
    monkeypatch.setattr(dsh_core._mcp_server, "run_serve_mcp", fake)
    monkeypatch.delenv("DSH_MCP_TOKEN", raising=False)
    monkeypatch.chdir(tmp_path)  # no dsh.toml of the repository's
    return fake


def serve_mcp(*args: str) -> Result:
    return CliRunner().invoke(cli, ["--no-plugins", "serve-mcp", *args], catch_exceptions=False)


def token_file(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "token"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_serve_mcp_http_makes_a_token_and_prints_it_once(fake_serve: FakeServe) -> None:
    result = serve_mcp("--http")
    assert result.exit_code == 0, result.output
    (call,) = fake_serve.calls
    token = call["bearer_token"]
    assert isinstance(token, str) and len(token) >= 43  # secrets.token_urlsafe(32)
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        "serve-mcp: listening on http://127.0.0.1:8765/mcp",
        f"serve-mcp: clients must send the header: Authorization: Bearer {token}",
        "serve-mcp: the token is new for this run; set DSH_MCP_TOKEN or --token-file to choose one",
    ]
    assert serve_mcp("--http").exit_code == 0
    assert fake_serve.calls[1]["bearer_token"] != token  # a new one each run


def test_serve_mcp_http_takes_the_token_from_the_environment(
    fake_serve: FakeServe, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DSH_MCP_TOKEN", TOKEN)
    result = serve_mcp("--http")
    assert result.exit_code == 0, result.output
    assert fake_serve.calls[0]["bearer_token"] == TOKEN
    assert TOKEN not in result.output  # the user chose it: not printed
    assert "Authorization: Bearer <the token>" in result.stderr


def test_serve_mcp_http_takes_the_first_line_of_the_token_file_before_the_environment(
    fake_serve: FakeServe, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DSH_MCP_TOKEN", "from-the-environment")
    path = token_file(tmp_path, f"  {TOKEN}  \nsecond line\n")
    result = serve_mcp("--http", "--token-file", str(path))
    assert result.exit_code == 0, result.output
    assert fake_serve.calls[0]["bearer_token"] == TOKEN
    assert TOKEN not in result.output


@pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")
@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620, 0o644])
def test_serve_mcp_refuses_a_token_file_other_users_can_open(fake_serve: FakeServe, tmp_path: Path, mode: int) -> None:
    path = token_file(tmp_path, TOKEN, mode)
    result = serve_mcp("--http", "--token-file", str(path))
    assert result.exit_code == 2
    assert fake_serve.calls == []
    assert result.stderr.strip() == (
        f"Error: the token file {path} can be read or changed by other users (mode {mode:04o}): run chmod 600 {path}"
    )


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "is empty (the token is its first line)"),
        ("\n" + TOKEN, "is empty (the token is its first line)"),
        ("   \n", "is empty (the token is its first line)"),
    ],
)
def test_serve_mcp_refuses_an_empty_token_file(fake_serve: FakeServe, tmp_path: Path, text: str, problem: str) -> None:
    path = token_file(tmp_path, text)
    result = serve_mcp("--http", "--token-file", str(path))
    assert result.exit_code == 2
    assert result.stderr.strip() == f"Error: the token file {path} {problem}"
    assert fake_serve.calls == []


def test_serve_mcp_refuses_a_missing_token_file(fake_serve: FakeServe, tmp_path: Path) -> None:
    path = tmp_path / "nowhere"
    result = serve_mcp("--http", "--token-file", str(path))
    assert result.exit_code == 2
    assert result.stderr.strip() == f"Error: cannot read the token file {path}: No such file or directory"
    assert fake_serve.calls == []


def test_serve_mcp_refuses_a_token_with_spaces_without_showing_it(fake_serve: FakeServe, tmp_path: Path) -> None:
    path = token_file(tmp_path, "two secret-words\n")
    result = serve_mcp("--http", "--token-file", str(path))
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        f"Error: the token in {path} cannot be used: the bearer token must be visible ASCII characters only "
        "(no spaces, no control characters)"
    )
    assert "secret" not in result.stderr


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "DSH_MCP_TOKEN is set but empty: set it to the token, or unset it to have one made"),
        (
            "secret\tword",
            "DSH_MCP_TOKEN cannot be used: the bearer token must be visible ASCII characters only "
            "(no spaces, no control characters)",
        ),
    ],
)
def test_serve_mcp_refuses_an_unusable_environment_token(
    fake_serve: FakeServe, monkeypatch: pytest.MonkeyPatch, value: str, message: str
) -> None:
    monkeypatch.setenv("DSH_MCP_TOKEN", value)
    result = serve_mcp("--http")
    assert result.exit_code == 2
    assert result.stderr.strip() == f"Error: {message}"
    assert fake_serve.calls == []


def test_serve_mcp_no_auth_serves_without_a_token_and_warns(fake_serve: FakeServe) -> None:
    result = serve_mcp("--http", "--no-auth")
    assert result.exit_code == 0, result.output
    assert fake_serve.calls[0]["bearer_token"] is None
    assert result.stderr.splitlines() == [
        "serve-mcp: listening on http://127.0.0.1:8765/mcp",
        "warning: no authentication (--no-auth): any local process can call these tools",
    ]


def test_serve_mcp_help_says_what_no_auth_lets_in(fake_serve: FakeServe) -> None:
    result = serve_mcp("--help")
    assert result.exit_code == 0
    assert "Any process of any user on this machine can then call every tool" in " ".join(result.stdout.split())


def test_serve_mcp_no_auth_with_a_token_source_is_a_usage_error(
    fake_serve: FakeServe, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = token_file(tmp_path, TOKEN)
    with_file = serve_mcp("--http", "--no-auth", "--token-file", str(path))
    monkeypatch.setenv("DSH_MCP_TOKEN", TOKEN)
    with_env = serve_mcp("--http", "--no-auth")
    assert (with_file.exit_code, with_env.exit_code) == (2, 2)
    assert (
        with_file.stderr.strip() == "Error: --no-auth turns authentication off: it cannot be combined with --token-file"
    )
    assert with_env.stderr.strip() == (
        "Error: --no-auth turns authentication off, but DSH_MCP_TOKEN is set: unset it or drop --no-auth"
    )
    assert TOKEN not in with_env.stderr
    assert fake_serve.calls == []


@pytest.mark.parametrize("option", ["--no-auth", "--token-file"])
def test_serve_mcp_token_options_without_http_are_usage_errors(
    fake_serve: FakeServe, tmp_path: Path, option: str
) -> None:
    args = [option] if option == "--no-auth" else [option, str(token_file(tmp_path, TOKEN))]
    result = serve_mcp(*args)
    assert result.exit_code == 2
    assert result.stderr.strip() == (
        f"Error: {option} applies to serve-mcp --http only (over stdio only the process that started "
        "the server can talk to it)"
    )
    assert fake_serve.calls == []


def test_serve_mcp_over_stdio_ignores_the_environment_token(
    fake_serve: FakeServe, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DSH_MCP_TOKEN", TOKEN)
    result = serve_mcp()
    assert result.exit_code == 0, result.output
    assert fake_serve.calls[0]["http"] is False and fake_serve.calls[0]["bearer_token"] is None
    assert result.stderr == ""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


async def test_cli_serve_mcp_http_requires_the_token_it_prints(tmp_path: Path) -> None:
    port = free_port()
    env = {key: value for key, value in os.environ.items() if key != "DSH_MCP_TOKEN"}
    env["PYTHONPATH"] = str(REPO)
    args = [sys.executable, "-m", "dsh_core._cli", "--no-plugins", "serve-mcp", "--http", "--port", str(port)]
    with trio.fail_after(60):
        process = await trio.lowlevel.open_process(args, cwd=str(tmp_path), env=env, stderr=subprocess.PIPE)
        assert process.stderr is not None
        try:
            seen = b""
            while b"Authorization: Bearer " not in seen or not seen.endswith(b"\n"):
                chunk = await process.stderr.receive_some()
                assert chunk, seen
                seen += chunk
            (line,) = [line for line in seen.decode().splitlines() if "Authorization: Bearer " in line]
            token = line.rsplit(" ", 1)[1]
            url = f"http://127.0.0.1:{port}/mcp"
            refused = await post(url)
            wrong = await post(url, {"Authorization": f"Bearer {token[:-1]}"})
            accepted = await post(url, {"Authorization": f"Bearer {token}"})
        finally:
            process.terminate()
            await process.wait()
            await process.stderr.aclose()
    assert (refused.status_code, wrong.status_code, accepted.status_code) == (401, 401, 200)
    assert f"listening on http://127.0.0.1:{port}/mcp" in seen.decode()


# -- the MCP client: token_env ---------------------------------------------------------------------


def client_config(base: str, token_env: str | None = "TEST_MCP_TOKEN") -> dict[str, Any]:
    server: dict[str, Any] = {"name": "guarded", "url": base + "/mcp", "prefix": "g"}
    if token_env is not None:
        server["token_env"] = token_env
    return {"servers": [server], "backoff_initial_s": 0.001, "backoff_max_s": 0.001}


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the SDK's SSE reader, as in test_mcp
async def test_the_client_sends_the_token_env_value_and_calls_a_tool(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("TEST_MCP_TOKEN", TOKEN)
    caplog.set_level("DEBUG")
    runtime = ToolRuntime()
    async with serving() as base, McpClientPlugin.connect(runtime, client_config(base)) as plugin:
        assert "g__add" in runtime.names()
        result = await runtime.execute(make_input("g__add", {"a": 40, "b": 2}))
        settings = repr(plugin.settings)
    assert result.value == {"result": 42}
    assert "token_env='TEST_MCP_TOKEN'" in settings
    assert TOKEN not in settings
    assert TOKEN not in caplog.text


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("value", [None, ""])
async def test_a_missing_or_empty_token_env_fails_the_server_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, value: str | None
) -> None:
    if value is None:
        monkeypatch.delenv("TEST_MCP_TOKEN", raising=False)
    else:
        monkeypatch.setenv("TEST_MCP_TOKEN", value)
    runtime = ToolRuntime()
    async with serving() as base, McpClientPlugin.connect(runtime, client_config(base)) as plugin:
        diagnosed = [str(note) for note in plugin.diagnostics()]
    assert "g__add" not in runtime.names()
    assert diagnosed == [
        'MCP server "guarded": MCP server "guarded" is unavailable: the environment variable TEST_MCP_TOKEN '
        "(token_env) is not set or empty: it must hold the server's bearer token"
    ]


def test_discovery_at_setup_reports_the_missing_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TEST_MCP_TOKEN", raising=False)
    settings = McpClientSettings(
        servers=(McpServerSettings(name="guarded", url="http://127.0.0.1:9/mcp", token_env="TEST_MCP_TOKEN"),)
    )
    plugin = McpClientPlugin(ToolRuntime(), settings)
    plugin.discover()
    assert [str(note) for note in plugin.diagnostics()] == [
        'MCP server "guarded": could not be listed: the environment variable TEST_MCP_TOKEN (token_env) '
        "is not set or empty: it must hold the server's bearer token"
    ]


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_a_wrong_token_is_reported_as_an_authentication_failure_without_the_token(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = "not-the-token-but-also-secret"
    monkeypatch.setenv("TEST_MCP_TOKEN", wrong)
    caplog.set_level("DEBUG")
    runtime = ToolRuntime()
    async with serving() as base, McpClientPlugin.connect(runtime, client_config(base)) as plugin:
        diagnosed = [str(note) for note in plugin.diagnostics()]
    assert "g__add" not in runtime.names()
    assert diagnosed == [
        'MCP server "guarded": MCP server "guarded" is unavailable: the server refused the bearer token '
        "(HTTP 401): check that TEST_MCP_TOKEN (token_env) holds the token the server requires"
    ]
    assert wrong not in caplog.text and TOKEN not in caplog.text


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_a_server_requiring_a_token_tells_a_client_without_token_env(monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = ToolRuntime()
    async with serving() as base, McpClientPlugin.connect(runtime, client_config(base, token_env=None)) as plugin:
        diagnosed = [str(note) for note in plugin.diagnostics()]
    assert diagnosed == [
        'MCP server "guarded": MCP server "guarded" is unavailable: the server requires authentication '
        "(HTTP 401): name the environment variable holding its bearer token with token_env"
    ]


class SwitchedApp:
    """An ASGI app passing each request to whichever app ``current`` is (a server changing its token)."""

    def __init__(self, current: Any) -> None:
        self.current = current

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.current(scope, receive, send)


@asynccontextmanager
async def serving_switchable() -> AsyncIterator[tuple[str, SwitchedApp, Any]]:
    """``adding_runtime()`` over HTTP behind a gate taking ``TOKEN``, which the block may swap: (base URL, switch, app)."""
    import hypercorn.config
    import hypercorn.trio

    from dsh_core._mcp_server import serve_registry

    mcp_app = serve_registry(adding_runtime()).streamable_http_app(streamable_http_path="/mcp", host="127.0.0.1")
    switched = SwitchedApp(BearerTokenGate(mcp_app, TOKEN))
    config = hypercorn.config.Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.graceful_timeout = 1.0
    async with trio.open_nursery() as nursery:
        (base,) = await nursery.start(partial(hypercorn.trio.serve, switched, config))  # type: ignore[arg-type]
        yield base, switched, mcp_app
        nursery.cancel_scope.cancel()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_a_server_that_stops_taking_the_token_fails_calls_as_authentication(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("TEST_MCP_TOKEN", TOKEN)
    caplog.set_level("DEBUG")
    runtime = ToolRuntime()
    async with (
        serving_switchable() as (base, switched, mcp_app),
        McpClientPlugin.connect(runtime, client_config(base)),
    ):
        before = await runtime.execute(make_input("g__add", {"a": 1, "b": 1}))
        switched.current = BearerTokenGate(mcp_app, "another-token")
        refused = await runtime.execute(make_input("g__add", {"a": 1, "b": 1}))
        again = await runtime.execute(make_input("g__add", {"a": 1, "b": 1}))  # reconnects: refused at once
    assert before.value == {"result": 2}
    assert (refused.code, refused.error.info.name) == (MCP_SERVER_UNAVAILABLE, "McpAuthenticationError")
    assert refused.error.message == (
        'MCP server "guarded" refused the call to "add": the server refused the bearer token (HTTP 401): '
        "check that TEST_MCP_TOKEN (token_env) holds the token the server requires"
    )
    assert (again.code, again.error.info.name) == (MCP_SERVER_UNAVAILABLE, "McpAuthenticationError")
    assert again.error.message == (
        'MCP server "guarded" is unavailable: the server refused the bearer token (HTTP 401): '
        "check that TEST_MCP_TOKEN (token_env) holds the token the server requires"
    )
    assert TOKEN not in caplog.text


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_one_refused_token_with_many_calls_in_flight_is_one_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each call the 401 turned away counted one: after 8, the next connection waited 30 s, not the first step."""
    monkeypatch.setenv("TEST_MCP_TOKEN", TOKEN)
    runtime = ToolRuntime()
    async with serving_switchable() as (base, switched, mcp_app):
        settings = {**client_config(base), "backoff_initial_s": 0.5, "backoff_max_s": 30}
        async with McpClientPlugin.connect(runtime, settings) as plugin:
            assert (await runtime.execute(make_input("g__add", {"a": 1, "b": 1}))).value == {"result": 2}
            switched.current = BearerTokenGate(mcp_app, "another-token")
            results: list[Any] = []

            async def call() -> None:
                results.append(await runtime.execute(make_input("g__add", {"a": 1, "b": 1})))

            async with trio.open_nursery() as calls:
                for _ in range(8):
                    calls.start_soon(call)
            failures = plugin._servers[0].failures
    assert [(result.code, result.error.info.name) for result in results] == [
        (MCP_SERVER_UNAVAILABLE, "McpAuthenticationError")
    ] * 8
    assert failures == 1


@pytest.mark.parametrize(
    ("server", "message"),
    [
        (
            {"name": "s", "command": "python", "token_env": "X"},
            'MCP server "s": token_env applies to an HTTP server (url); a stdio server gets its environment from env',
        ),
    ],
)
def test_token_env_on_a_stdio_server_is_refused(server: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError) as caught:
        McpClientPlugin(ToolRuntime(), McpClientSettings(servers=(McpServerSettings(**server),)))
    assert str(caught.value) == message


@pytest.mark.parametrize("name", ["", "1ABC", "A-B", "A B", "A=B"])
def test_token_env_must_name_a_variable(name: str) -> None:
    with pytest.raises(ValueError, match="token_env must name an environment variable"):
        McpServerSettings(name="s", url="http://127.0.0.1:1/mcp", token_env=name)


# -- DNS rebinding and the port ----------------------------------------------------------------------

REBOUND = {"Host": "attacker.example:80", "Origin": "http://attacker.example"}


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "127.1.2.3"])
async def test_every_loopback_host_refuses_a_rebound_host_header(host: str) -> None:
    # The SDK protects only 127.0.0.1, localhost and ::1 by itself; all of 127.0.0.0/8 is loopback.
    async with trio.open_nursery() as nursery:
        (base,) = await nursery.start(
            lambda task_status: serve_http(adding_runtime(), host, 0, bearer_token=TOKEN, task_status=task_status)
        )
        authorized = {"Authorization": f"Bearer {TOKEN}"}
        rebound = await post(base + "/mcp", {**authorized, **REBOUND})
        direct = await post(base + "/mcp", authorized)
        nursery.cancel_scope.cancel()
    assert rebound.status_code == 421
    assert direct.status_code == 200


def test_serve_mcp_port_without_http_is_a_usage_error(fake_serve: FakeServe) -> None:
    result = serve_mcp("--port", "8766")
    assert result.exit_code == 2
    assert "--port needs --http" in result.output
    assert fake_serve.calls == []


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="POSIX FIFOs")
def test_serve_mcp_refuses_a_fifo_token_file_without_waiting_for_a_writer(fake_serve: FakeServe, tmp_path: Path) -> None:
    fifo = tmp_path / "token"
    os.mkfifo(fifo, 0o600)
    result = serve_mcp("--http", "--token-file", str(fifo))  # opened blocking, this would hang
    assert result.exit_code == 2
    assert f"the token file {fifo} is not a regular file" in result.output
    assert fake_serve.calls == []


def test_an_ipv4_mapped_loopback_host_is_protected_as_loopback() -> None:
    from dsh_core._mcp_server import _loopback_security

    settings = _loopback_security("::ffff:127.0.0.1")
    assert settings is not None and settings.enable_dns_rebinding_protection
    assert "[::ffff:127.0.0.1]:*" in settings.allowed_hosts
    assert _loopback_security("192.0.2.1") is None
