"""The ``dsh-tools`` command line, through click's CliRunner and as a real subprocess.

Tools come from a small plugin module written to a temporary directory and
loaded with ``--no-plugins --plugin cli=<module>`` (or through a throw-away
distribution's entry points), so the installed plugins do not interfere.
"""

from __future__ import annotations

import gc
import gzip
import importlib
import json
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from click.testing import CliRunner, Result

# Shared with the loader tests: builds throw-away distributions on sys.path.
from test_plugin_loading import Dists

import dsh_core
from dsh_core import contract_fingerprint
from dsh_core._cli import cli, main
from dsh_core._session_log import read_session_log
from dsh_plugins.grants import read_grants

PLUGIN = """
from dsh_core import Ask, ImageBlock, ToolOutput, define_tool, hookimpl

async def _echo(args):
    return args

async def _boom(args):
    raise RuntimeError("it broke")

async def _picture(args):
    return "iVBORw0KGgo="

async def _slow(args):
    import trio
    await trio.sleep(0.01)
    return args.get("n")

TOOLS = [
    define_tool(
        name="echo", description="Echo the arguments.\\nSecond line is not shown.", parameters={},
        output={"type": "json"}, execute=_echo, timeout_ms=5000, is_concurrency_safe=lambda args: True),
    define_tool(name="boom", description="Always fails.", parameters={}, output={"type": "json"}, execute=_boom),
    define_tool(
        name="picture", description="An image.", parameters={}, execute=_picture,
        output=ToolOutput(schema={"type": "string"}, render=lambda args, value: [ImageBlock(value, "image/png")])),
    define_tool(
        name="guarded", description="Needs approval.", parameters={}, output={"type": "json"}, execute=_echo),
    define_tool(
        name="slow", description="Sleeps.", parameters={"n": {"type": "integer", "required": True}},
        output={"type": "integer"}, execute=_slow, is_concurrency_safe=lambda args: True),
]

class AskForGuarded:
    @hookimpl
    async def dsh_pre_execute(self, execution, next):
        if execution.name == "guarded":
            return Ask("guarded needs a yes")
        return await next()

@hookimpl
def dsh_setup(runtime, config):
    for tool in TOOLS:
        runtime.register(tool)
    runtime.plugins.register(AskForGuarded(), name="cli-ask-policy")
"""


@pytest.fixture
def dists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Dists]:
    root = tmp_path / "site"
    root.mkdir()
    factory = Dists(root)
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.chdir(tmp_path)  # no dsh.toml / pyproject.toml of the checkout
    monkeypatch.setenv("COLUMNS", "200")
    yield factory
    for name in [m for m in sys.modules if m.startswith(factory.prefix)]:
        del sys.modules[name]


@pytest.fixture
def tools(dists: Dists) -> list[str]:
    """Global options that load the test tools and nothing else."""
    module = dists.module("clitools", PLUGIN)
    return ["--no-plugins", "--plugin", f"cli={module}"]


def invoke(args: list[str], input: str | None = None) -> Result:
    return CliRunner().invoke(cli, args, input=input, catch_exceptions=False)


# -- list / schemas / sdk -------------------------------------------------------------


def test_list_shows_visible_tools(tools: list[str]) -> None:
    result = invoke([*tools, "list"])
    assert result.exit_code == 0, result.output
    out = result.stdout
    for name in ("echo", "boom", "picture", "guarded", "slow"):
        assert name in out
    assert "Echo the arguments." in out
    assert "Second line" not in out
    assert "5000 ms" in out
    assert "per call" in out
    assert "5 tools" in out


DEFERRED_PLUGIN = """
from dsh_core import RetryPolicy, define_tool, hookimpl

async def _echo(args):
    return args

@hookimpl
def dsh_setup(runtime, config):
    runtime.register(define_tool(
        name="rare", description="Rarely needed.", parameters={}, output={"type": "json"}, execute=_echo,
        defer_loading=True, retry=RetryPolicy(max_attempts=3), revert=lambda args, value: None))
    runtime.register(define_tool(
        name="common", description="Always shown.", parameters={}, output={"type": "json"}, execute=_echo))
"""


def test_list_marks_deferred_and_retried_tools(dists: Dists) -> None:
    module = dists.module("deferredtools", DEFERRED_PLUGIN)
    options = ["--no-plugins", "--plugin", f"deferred={module}"]
    rows = json.loads(invoke([*options, "list", "--json"]).stdout)
    assert [(row["name"], row["deferred"], row["retry_attempts"]) for row in rows] == [
        ("rare", True, 3),
        ("common", False, None),
    ]
    text = invoke([*options, "list"]).stdout
    assert "rare (deferred, 3 tries, undoable)" in text
    assert [schema["name"] for schema in json.loads(invoke([*options, "schemas", "--json"]).stdout)] == ["common"]
    sdk = invoke([*options, "sdk"]).stdout
    assert "def common(" in sdk and "rare" not in sdk


def test_list_json(tools: list[str]) -> None:
    result = invoke([*tools, "list", "--json"])
    assert result.exit_code == 0
    rows = json.loads(result.stdout)
    assert [row["name"] for row in rows] == ["echo", "boom", "picture", "guarded", "slow"]
    assert rows[0] == {
        "name": "echo",
        "description": "Echo the arguments.",
        "scope": None,
        "parallel": True,
        "timeout_ms": 5000,
        "timeout_source": "tool",
        "effects": None,
        "retry_attempts": None,
        "deferred": False,
        "revertible": False,
    }
    assert rows[1]["parallel"] is False and rows[1]["timeout_ms"] is None


def test_list_shows_the_timeout_plugins_default_for_tools_that_declare_none(
    tools: list[str], tmp_path: Path
) -> None:
    config = tmp_path / "t.toml"
    config.write_text("[plugins.timeout]\ndefault_ms = 300\n")
    args = [*tools, "--plugin", "timeout=dsh_plugins.timeout", "--config", str(config), "list"]
    rows = {row["name"]: row for row in json.loads(invoke([*args, "--json"]).stdout)}
    assert (rows["boom"]["timeout_ms"], rows["boom"]["timeout_source"]) == (300, "default")
    assert (rows["echo"]["timeout_ms"], rows["echo"]["timeout_source"]) == (5000, "tool")  # its own wins
    table = invoke(args).stdout
    assert "300 ms (default)" in table and "5000 ms" in table
    bare = {row["name"]: row for row in json.loads(invoke([*tools, "list", "--json"]).stdout)}
    assert (bare["boom"]["timeout_ms"], bare["boom"]["timeout_source"]) == (None, None)


def test_list_without_plugins_is_empty() -> None:
    result = invoke(["--no-plugins", "list", "--json"])
    assert result.exit_code == 0
    assert json.loads(result.stdout) == []


def test_schemas_json(tools: list[str]) -> None:
    result = invoke([*tools, "schemas", "--json"])
    assert result.exit_code == 0
    schemas = json.loads(result.stdout)
    slow = next(s for s in schemas if s["name"] == "slow")
    assert slow == {
        "name": "slow",
        "description": "Sleeps.",
        "parameters": {
            "type": "object",
            "properties": {"n": {"type": "integer"}},
            "required": ["n"],
        },
    }
    assert set(schemas[0]) == {"name", "description", "parameters"}


def test_schemas_pretty_is_json_too(tools: list[str]) -> None:
    result = invoke([*tools, "schemas"])
    assert result.exit_code == 0
    assert [s["name"] for s in json.loads(result.stdout)][:2] == ["echo", "boom"]


@pytest.mark.parametrize(("mode", "carried"), [("native", False), ("code", True), ("both", False)])
def test_schemas_print_what_a_request_carries_in_each_mode(tools: list[str], mode: str, carried: bool) -> None:
    result = invoke([*tools, "--mode", mode, "schemas", "--json"])
    assert result.exit_code == 0, result.output
    names = [schema["name"] for schema in json.loads(result.stdout)]
    if carried:  # Code Mode sends only run_code; the other tools are reached through its SDK
        assert names == ["run_code"]
    else:
        assert {"echo", "boom", "slow"} <= set(names)
        assert ("run_code" in names) == (mode == "both")
    assert ("also carries the Code Mode SDK text" in result.stderr) == (mode != "native")


def test_sdk_renders_the_visible_tools(tools: list[str]) -> None:
    result = invoke([*tools, "sdk"])
    assert result.exit_code == 0, result.output
    assert "async def echo" in result.stdout
    assert "async def slow" in result.stdout


def test_sdk_without_code_mode_is_a_clear_error(tools: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "dsh_core.code_mode", None)  # makes the import fail
    result = invoke([*tools, "sdk"])
    assert result.exit_code == 2
    assert "Code Mode is not available" in result.stderr


# -- optional extras: a missing one is a usage error naming it, not a traceback -------


def test_serve_mcp_without_the_mcp_extra_is_a_usage_error(tools: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mcp", None)  # as if the [mcp] extra were not installed
    result = invoke([*tools, "serve-mcp"])
    assert result.exit_code == 2, result.output
    assert "serve-mcp needs the MCP extra: pip install 'dsh-tools[mcp]'" in result.stderr
    assert "Traceback" not in result.output


def test_serve_mcp_http_on_a_port_in_use_is_a_usage_error(tools: list[str]) -> None:
    pytest.importorskip("hypercorn")
    import socket

    with socket.socket() as taken, warnings.catch_warnings():
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = invoke([*tools, "serve-mcp", "--http", "--port", str(port)])
        exit_code, stdout, stderr = result.exit_code, result.stdout, result.stderr
        # hypercorn leaves the socket it failed to bind unclosed (the process would end here), and
        # the result's exception chain holds it: collected now, not in a later test.
        del result
        warnings.simplefilter("ignore", ResourceWarning)
        gc.collect()
    assert exit_code == 2, stderr
    assert stdout == ""
    assert "Traceback" not in stderr
    (line,) = stderr.strip().splitlines()
    assert line.startswith(f"Error: cannot listen on 127.0.0.1:{port}: ")
    assert "in use" in line


def test_serve_mcp_http_without_hypercorn_is_a_usage_error(tools: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "hypercorn", None)
    result = invoke([*tools, "serve-mcp", "--http"])
    assert result.exit_code == 2, result.output
    assert "serve-mcp --http needs hypercorn, part of the MCP extra: pip install 'dsh-tools[mcp]'" in result.stderr


def test_mcp_servers_configured_without_the_mcp_extra_name_the_extra(
    tools: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "mcp", None)
    config = tmp_path / "mcp.toml"
    config.write_text('[[plugins.mcp.servers]]\nname = "demo"\ncommand = "python"\n')
    result = invoke(["--config", str(config), *tools, "--plugin", "mcp=dsh_plugins.mcp_client", "call", "echo", "{}"])
    assert result.exit_code == 2, result.output
    assert (
        "[plugins.mcp]: MCP servers are configured, but the mcp extra is not installed "
        "(pip install 'dsh-tools[mcp]')" in result.stderr
    )
    assert "Traceback" not in result.output


def test_otel_enabled_without_the_otel_extra_names_the_extra(
    tools: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    config = tmp_path / "otel.toml"
    config.write_text("[plugins.otel]\nenabled = true\n")
    result = invoke(["--config", str(config), *tools, "--plugin", "otel=dsh_plugins.otel", "call", "echo", "{}"])
    assert result.exit_code == 2, result.output
    assert "[plugins.otel]: opentelemetry-api is not installed (pip install 'dsh-tools[otel]')" in result.stderr
    assert "Traceback" not in result.output


def test_code_mode_from_config(tools: list[str], tmp_path: Path) -> None:
    (tmp_path / "dsh.toml").write_text('mode = "code"\n')
    listed = json.loads(invoke([*tools, "list", "--json"]).stdout)
    assert [row["name"] for row in listed][-1] == "run_code"
    direct = invoke([*tools, "call", "echo", "{}"])
    assert direct.exit_code == 1 and "UNKNOWN_TOOL" in direct.stderr
    program = json.dumps({"code": "return await tools.echo({'k': 2})", "description": "echo via code"})
    result = invoke([*tools, "call", "run_code", program])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"k": 2}


# -- call ------------------------------------------------------------------------------


def test_call_success_prints_content(tools: list[str]) -> None:
    result = invoke([*tools, "call", "echo", '{"x": 1}'])
    assert result.exit_code == 0
    assert json.loads(result.stdout) == {"x": 1}
    assert result.stderr == ""


def test_call_defaults_to_empty_arguments(tools: list[str]) -> None:
    result = invoke([*tools, "call", "echo"])
    assert result.exit_code == 0
    assert json.loads(result.stdout) == {}


def test_call_image_content(tools: list[str]) -> None:
    result = invoke([*tools, "call", "picture"])
    assert result.exit_code == 0
    assert result.stdout.strip() == "[image image/png]"


def test_call_failure_exits_1_with_the_code_on_stderr(tools: list[str]) -> None:
    result = invoke([*tools, "call", "boom", "{}"])
    assert result.exit_code == 1
    assert result.stdout.strip() == "Error: it broke"
    assert "TOOL_ERROR" in result.stderr


def test_call_unknown_tool(tools: list[str]) -> None:
    result = invoke([*tools, "call", "nope"])
    assert result.exit_code == 1
    assert "UNKNOWN_TOOL" in result.stderr


def test_call_invalid_arguments_fail_validation(tools: list[str]) -> None:
    result = invoke([*tools, "call", "slow", '{"n": "x"}'])
    assert result.exit_code == 1
    assert "INVALID_ARGS" in result.stderr


def test_call_bad_json_is_a_usage_error(tools: list[str]) -> None:
    result = invoke([*tools, "call", "echo", "{not json"])
    assert result.exit_code == 2
    assert "JSON_ARGS" in result.stderr
    assert "not valid JSON" in result.stderr


def test_call_parses_arguments_nested_deeper_than_the_c_parser_goes(tools: list[str]) -> None:
    depth = 5_000  # json.loads raises RecursionError long before this
    result = invoke([*tools, "call", "echo", '{"x": ' + "[" * depth + "]" * depth + "}"])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().replace(" ", "") == '{"x":' + "[" * depth + "]" * depth + "}"


def test_call_refuses_nan_as_json(tools: list[str]) -> None:
    result = invoke([*tools, "call", "echo", '{"x": NaN}'])
    assert result.exit_code == 2
    assert "not valid JSON: NaN is not a JSON number" in result.stderr


def test_call_refuses_a_repeated_key_as_the_pipeline_refuses_it_in_model_text(tools: list[str]) -> None:
    """Last-wins would let a policy and the tool read different values; a model's text is refused."""
    for args in (
        '{"a": 1, "a": 5}',
        '{"x": {"a": 1, "a": 5}}',
        '{"x": ' + "[" * 5_000 + '{"a": 1, "a": 2}' + "]" * 5_000 + "}",
    ):
        result = invoke([*tools, "call", "echo", args])
        assert result.exit_code == 2, result.output
        assert result.stdout == ""
        assert "JSON_ARGS" in result.stderr
        assert 'arguments give the key "a" twice in one object' in result.stderr


def test_ask_is_denied_without_interactive(tools: list[str]) -> None:
    result = invoke([*tools, "call", "guarded", "{}"])
    assert result.exit_code == 1
    assert "DENIED" in result.stderr


_NOBODY_ASKED = (
    "hint: nobody could be asked for approval: add --interactive to answer at this terminal, or --grants FILE to "
    "answer from standing grants (dsh-tools grants add FILE {tool} --agent {agent})"
)


def test_an_ask_nobody_can_answer_says_how_to_answer_it(tools: list[str]) -> None:
    """The denial is the approval step's, not a plugin's, and the person is told the next step."""
    result = invoke([*tools, "call", "guarded", "{}", "--agent", "helper"])
    assert result.exit_code == 1
    assert result.stdout == 'Error: tool "guarded" requires approval, but no approval channel is available\n'
    assert result.stderr.splitlines() == ["error: DENIED (approval)", _NOBODY_ASKED.format(tool="guarded", agent="helper")]


def test_an_ask_no_grant_covers_says_so(tools: list[str], tmp_path: Path) -> None:
    book = tmp_path / "grants.jsonl"
    assert invoke(["grants", "add", str(book), "guarded", "--agent", "helper"]).exit_code == 0
    result = invoke([*tools, "--grants", str(book), "call", "guarded", "{}"])
    assert result.exit_code == 1
    assert result.stderr.splitlines() == [
        "error: DENIED (approval)",
        f"hint: no grant in force in {book} covers this call (dsh-tools grants show {book} lists them); "
        "add --interactive to be asked at this terminal",
    ]


def test_a_batch_says_once_how_to_answer_the_asks_nobody_could(tools: list[str], tmp_path: Path) -> None:
    batch = write_batch(
        tmp_path / "calls.jsonl",
        {"id": "c1", "name": "guarded", "arguments": {}},
        {"id": "c2", "name": "echo", "arguments": {}},
        {"id": "c3", "name": "guarded", "arguments": {"a": 1}},
    )
    result = invoke([*tools, "run", str(batch)])
    assert result.exit_code == 0
    denied = [json.loads(line)["error"] for line in result.stdout.splitlines()]
    assert [error and (error["code"], error["plugin"]) for error in denied] == [
        ("DENIED", "approval"), None, ("DENIED", "approval")
    ]
    assert result.stderr.splitlines() == [
        "hint: 2 call(s) needed approval, and nobody could be asked: "
        + _NOBODY_ASKED.format(tool="guarded", agent="cli").split(": ", 2)[2]
    ]


def test_interactive_approval_prompts_on_stderr(tools: list[str]) -> None:
    allowed = invoke([*tools, "--interactive", "call", "guarded", '{"a": 1}'], input="y\n")
    assert allowed.exit_code == 0, allowed.output
    assert json.loads(allowed.stdout) == {"a": 1}
    assert "Allow guarded" in allowed.stderr
    assert "a = always allow guarded (every agent, any arguments) for this session\n" in allowed.stderr
    denied = invoke([*tools, "--interactive", "call", "guarded", "{}"], input="n\n")
    assert denied.exit_code == 1
    assert "DENIED" in denied.stderr


def test_call_records_a_session(tools: list[str], tmp_path: Path) -> None:
    log = tmp_path / "session.jsonl"
    result = invoke([*tools, "call", "boom", "{}", "--session", str(log)])
    assert result.exit_code == 1
    events = read_session_log(log).events
    assert [e.type for e in events] == ["tool/call", "tool/result"]
    assert events[0].data["name"] == "boom"
    assert events[1].data["isError"] is True
    assert events[1].data["error"]["code"] == "TOOL_ERROR"


def test_a_recorded_call_carries_its_tools_contract_and_replay_flags_a_change(
    tools: list[str], dists: Dists, tmp_path: Path
) -> None:
    log = tmp_path / "session.jsonl"
    assert invoke([*tools, "call", "echo", '{"a": 1}', "--session", str(log)]).exit_code == 0
    (call, _result) = read_session_log(log).events
    echo = next(tool for tool in importlib.import_module(tools[-1].split("=")[1]).TOOLS if tool.name == "echo")
    assert call.data["contract"] == contract_fingerprint(echo)

    marker = "recorded against an earlier contract"
    unchanged = invoke([*tools, "replay", str(log)])
    assert unchanged.exit_code == 0 and "echo" in unchanged.stdout and marker not in unchanged.stdout
    stale = tmp_path / "stale.jsonl"
    stale.write_text(log.read_text().replace(call.data["contract"], "sha256:" + "0" * 64))
    changed = invoke([*tools, "replay", str(stale)])
    assert changed.exit_code == 0 and marker in changed.stdout


def test_session_log_from_config(tools: list[str], tmp_path: Path) -> None:
    (tmp_path / "dsh.toml").write_text('session_log = "from-config.jsonl"\n')
    result = invoke([*tools, "call", "echo", "{}"])
    assert result.exit_code == 0
    assert len(read_session_log(tmp_path / "from-config.jsonl").events) == 2


def test_a_session_log_in_another_records_file_is_refused_and_check_says_so(tools: list[str], tmp_path: Path) -> None:
    """The audit plugin's lines went into the session log, which no command could read again (s20 logs audit)."""
    (tmp_path / "dsh.toml").write_text('session_log = "shared.jsonl"\n[plugins.audit]\npath = "shared.jsonl"\n')
    tools = [*tools, "--plugin", "audit=dsh_plugins.audit"]
    checked = invoke([*tools, "check"])
    assert checked.exit_code == 1, checked.output
    assert f"problem: session_log {str(tmp_path / 'shared.jsonl')!r} is the audit log: two writers in one file" in checked.stdout
    result = invoke([*tools, "call", "echo", "{}"])
    assert result.exit_code == 2
    assert "is the audit log; give it a file of its own" in result.stderr
    assert (tmp_path / "shared.jsonl").read_text() == ""  # nothing ran, nothing was written


# -- run -------------------------------------------------------------------------------


def write_batch(path: Path, *records: object) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def test_run_writes_one_result_line_per_call(tools: list[str], tmp_path: Path) -> None:
    batch = write_batch(
        tmp_path / "calls.jsonl",
        {"id": "c1", "name": "slow", "arguments": {"n": 1}},
        {"id": "c2", "name": "slow", "arguments": '{"n": 2}'},
        {"id": "c3", "name": "echo", "arguments": ""},
        {"id": "c4", "name": "boom", "arguments": {}},
        {"id": "c5", "name": "echo", "arguments": "{broken"},
        "",
        {"id": "c6", "name": "picture"},
    )
    result = invoke([*tools, "run", str(batch), "--max-parallel", "2"])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [line["id"] for line in lines] == ["c1", "c2", "c3", "c4", "c5", "c6"]
    assert lines[0] == {
        "id": "c1",
        "name": "slow",
        "is_error": False,
        "content": [{"type": "text", "text": "1"}],
        "error": None,
        "meta": None,
        "contexts": [],
    }
    assert lines[1]["content"] == [{"type": "text", "text": "2"}]
    assert lines[2]["is_error"] is False and json.loads(lines[2]["content"][0]["text"]) == {}
    assert lines[3]["is_error"] is True
    assert lines[3]["error"] == {"message": "it broke", "code": "TOOL_ERROR", "name": "RuntimeError", "plugin": None}
    # An unparsable arguments string reaches the tool as a string; echo accepts anything... but
    # the open parameter root is an object, so validation reports it.
    assert lines[4]["is_error"] is True and lines[4]["error"]["code"] == "INVALID_ARGS"
    assert lines[5]["content"] == [{"type": "image", "data": "iVBORw0KGgo=", "mimeType": "image/png"}]


def test_run_parses_deep_batch_lines_and_argument_texts(tools: list[str], tmp_path: Path) -> None:
    depth = 5_000
    nested = "[" * depth + "]" * depth
    batch = tmp_path / "calls.jsonl"
    batch.write_text(
        '{"id": "c1", "name": "echo", "arguments": {"x": ' + nested + "}}\n"
        + json.dumps({"id": "c2", "name": "echo", "arguments": '{"y": ' + nested + "}"}) + "\n",
        encoding="utf-8",
    )
    result = invoke([*tools, "run", str(batch)])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert [line["is_error"] for line in lines] == [False, False]
    assert [line["content"][0]["text"].replace(" ", "") for line in lines] == [
        '{"x":' + nested + "}",
        '{"y":' + nested + "}",
    ]


def test_run_records_a_session(tools: list[str], tmp_path: Path) -> None:
    batch = write_batch(tmp_path / "calls.jsonl", {"id": "a", "name": "echo"}, {"id": "b", "name": "boom"})
    log = tmp_path / "s.jsonl"
    assert invoke([*tools, "run", str(batch), "--session", str(log)]).exit_code == 0
    events = read_session_log(log).events
    assert [(e.type, e.data["callId"]) for e in events] == [
        ("tool/call", "a"),
        ("tool/call", "b"),
        ("tool/result", "a"),
        ("tool/result", "b"),
    ]


def test_run_reports_every_bad_line_and_runs_nothing(tools: list[str], tmp_path: Path) -> None:
    log = tmp_path / "s.jsonl"
    batch = write_batch(
        tmp_path / "bad.jsonl",
        {"id": "ok", "name": "echo"},
        "{nope",
        {"id": 3, "name": "echo"},
        {"id": "ok", "name": "echo"},
        ["not", "an", "object"],
        {"id": "x", "name": "echo", "args": {}},
    )
    result = invoke([*tools, "run", str(batch), "--session", str(log)])
    assert result.exit_code == 2
    assert result.stdout == ""
    err = result.stderr
    assert f"{batch}:2: not valid JSON" in err
    assert f'{batch}:3: "id" must be a non-empty string' in err
    assert f'{batch}:4: duplicate id "ok"' in err
    assert f"{batch}:5: expected an object" in err
    assert f"{batch}:6: unknown key(s) args" in err
    assert not log.exists()


def test_run_lists_the_first_twenty_bad_lines_and_counts_the_rest(tools: list[str], tmp_path: Path) -> None:
    """A file of 100 000 bad records printed 6.6 MB of problems."""
    batch = write_batch(tmp_path / "bad.jsonl", *(["not", "an", "object"] for _ in range(1000)), '{"n": ' + "1" * 5000 + "}")
    result = invoke([*tools, "run", str(batch)])
    assert result.exit_code == 2
    listed = [line for line in result.stderr.splitlines() if f"{batch}:" in line][1:]  # under the heading
    assert len(listed) == 20 and listed[-1].endswith(f"{batch}:20: expected an object with id, name and arguments")
    assert "… and 981 more" in result.stderr
    single = write_batch(tmp_path / "one.jsonl", '{"n": ' + "1" * 5000 + "}")
    assert (
        f"{single}:1: cannot be read: it holds an integer of 5000 digits, longer than the 4300 digits accepted"
        in " ".join(invoke([*tools, "run", str(single)]).stderr.split())
    )


def test_run_splits_lines_only_at_line_feeds(tools: list[str], tmp_path: Path) -> None:
    """U+2028, U+2029 and U+0085 are legal raw in a JSON string (ensure_ascii=False writes them)."""
    batch = tmp_path / "calls.jsonl"
    records = [
        {"id": "a", "name": "echo", "arguments": {"note": "x\u2028y"}},
        {"id": "b", "name": "echo", "arguments": json.dumps({"note": "x\u0085y\u2029z"}, ensure_ascii=False)},
    ]
    text = "".join(json.dumps(r, ensure_ascii=False) + "\r\n" for r in records) + '{"id": "c", "name": 1}\n'
    batch.write_bytes(text.encode("utf-8"))
    refused = invoke([*tools, "run", str(batch)])
    assert refused.exit_code == 2
    assert f'{batch}:3: "name" must be a non-empty string' in refused.stderr
    assert f"{batch}:1" not in refused.stderr and f"{batch}:2" not in refused.stderr
    batch.write_bytes(text.rsplit("{", 1)[0].encode("utf-8"))
    result = invoke([*tools, "run", str(batch)])
    assert result.exit_code == 0, result.output
    lines = [json.loads(line) for line in result.stdout.split("\n") if line]
    assert [(line["id"], json.loads(line["content"][0]["text"])) for line in lines] == [
        ("a", {"note": "x\u2028y"}),
        ("b", {"note": "x\u0085y\u2029z"}),
    ]


def test_run_refuses_repeated_keys_in_records_and_argument_objects(tools: list[str], tmp_path: Path) -> None:
    batch = write_batch(
        tmp_path / "dup.jsonl",
        '{"id": "s", "name": "echo", "arguments": "{\\"a\\": 1, \\"a\\": 5}"}',
        '{"id": "o", "name": "echo", "arguments": {"a": 1, "b": {"c": 1, "c": 2}}}',
        '{"id": "x", "id": "y", "name": "echo"}',
        '{"id": "n", "name": "echo", "name": "boom"}',
    )
    result = invoke([*tools, "run", str(batch)])
    assert result.exit_code == 2 and result.stdout == ""
    err = result.stderr
    assert f"{batch}:1" not in err  # as a model's text: the call itself fails INVALID_ARGS
    assert f'{batch}:2: the key "c" is given twice in one object' in err
    assert f'{batch}:3: the key "id" is given twice in one object' in err
    assert f'{batch}:4: the key "name" is given twice in one object' in err
    text = write_batch(tmp_path / "text.jsonl", '{"id": "s", "name": "echo", "arguments": "{\\"a\\": 1, \\"a\\": 5}"}')
    (line,) = [json.loads(line) for line in invoke([*tools, "run", str(text)]).stdout.splitlines()]
    assert line["is_error"] is True and line["error"]["code"] == "INVALID_ARGS"
    assert 'arguments give the key "a" twice in one object' in line["content"][0]["text"]


def test_run_missing_file_is_a_usage_error(tools: list[str], tmp_path: Path) -> None:
    result = invoke([*tools, "run", str(tmp_path / "absent.jsonl")])
    assert result.exit_code == 2
    assert "cannot read" in result.stderr


def test_run_max_parallel_must_be_positive(tools: list[str], tmp_path: Path) -> None:
    batch = write_batch(tmp_path / "calls.jsonl", {"id": "a", "name": "echo"})
    assert invoke([*tools, "run", str(batch), "--max-parallel", "0"]).exit_code == 2


# -- plugins / check -------------------------------------------------------------------------

BROKEN_IMPORT = "import missing_dependency_for_cli_test\n"

LINT_BAIT = """
from dsh_core import define_tool, hookimpl

async def _body(args):
    return None

def _tool(name):
    return define_tool(name=name, description="", parameters={}, output={"type": "json"}, execute=_body)

@hookimpl
def dsh_setup(runtime, config):
    runtime.register(_tool("bad.name"))
    try:
        runtime.register(_tool("echo"))  # taken by the "cli" plugin
    except Exception:
        pass
"""

# Plugins register() refuses: each fails to load, and check names why.
SYNC_POLICY = """
from dsh_core import hookimpl

@hookimpl
def dsh_pre_execute(execution, next):  # not async
    return next()
"""

UNMARKED = """
def dsh_result(execution, result):  # forgot @hookimpl
    pass
"""


def test_plugins_command(tools: list[str], dists: Dists) -> None:
    broken = dists.module("broken", BROKEN_IMPORT)
    result = invoke([*tools, "--plugin", f"broken={broken}", "plugins", "--json"])
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert [(p["name"], p["tools"]) for p in data["loaded"]] == [
        ("cli", ["echo", "boom", "picture", "guarded", "slow"])
    ]
    (failed,) = data["failed"]
    assert failed["name"] == "broken" and failed["stage"] == "import"
    assert "missing_dependency_for_cli_test" in failed["error"]
    assert "traceback" not in failed
    table = invoke([*tools, "--plugin", f"broken={broken}", "plugins"])
    assert table.exit_code == 0
    assert "cli" in table.stdout and "failed: broken" in table.stdout


def test_entry_point_plugins_are_loaded_and_disabled_by_config(dists: Dists, tmp_path: Path) -> None:
    dists.module("clitools", PLUGIN)
    dists.module("broken", BROKEN_IMPORT)
    dists.dist("dsh-cli-test", {"cli": "{p}clitools", "broken": "{p}broken"}, version="0.7")
    result = invoke(["--group", dists.group, "plugins", "--json"])
    data = json.loads(result.stdout)
    assert [(p["name"], p["distribution"], p["version"]) for p in data["loaded"]] == [("cli", "dsh-cli-test", "0.7")]
    assert [p["name"] for p in data["failed"]] == ["broken"]
    # Ordinary commands warn about the failed plugin on stderr and carry on.
    listed = invoke(["--group", dists.group, "list", "--json"])
    assert listed.exit_code == 0
    assert "warning: plugin broken failed (import)" in listed.stderr
    (tmp_path / "dsh.toml").write_text('disabled_plugins = ["broken"]\n')
    data = json.loads(invoke(["--group", dists.group, "plugins", "--json"]).stdout)
    assert data["disabled"] == ["broken"] and data["failed"] == []


def test_check_clean_exits_0(tools: list[str]) -> None:
    result = invoke([*tools, "check"])
    assert result.exit_code == 0, result.output
    assert "1 plugin(s) loaded, 0 failed" in result.stdout
    assert "5 tool(s) registered" in result.stdout
    assert "0 problem(s)" in result.stdout


def test_check_lists_every_problem(tools: list[str], dists: Dists) -> None:
    broken = dists.module("broken", BROKEN_IMPORT)
    bait = dists.module("bait", LINT_BAIT)
    typo = dists.module("typo", "from dsh_core import hookimpl\n\n@hookimpl\ndef dsh_tools_chnage():\n    pass\n")
    sync_policy = dists.module("sync_policy", SYNC_POLICY)
    unmarked = dists.module("unmarked", UNMARKED)
    result = invoke(
        [*tools, "--plugin", f"broken={broken}", "--plugin", f"bait={bait}", "--plugin", f"typo={typo}",
         "--plugin", f"lint-sync-policy={sync_policy}", "--plugin", f"lint-unmarked={unmarked}", "check"]
    )  # fmt: skip
    assert result.exit_code == 1
    out = result.stdout
    assert "problem: plugin broken" in out and "failed at import" in out
    assert (
        'problem: plugin bait: tool "echo" is already registered by plugin cli (duplicate tool name; to load both, '
        'give one a prefix: [tool_prefixes] bait = "..." in dsh.toml)'
    ) in out
    assert "problem: plugin lint-sync-policy (" in out and (
        'failed at register: PluginValidationError: '
        'dsh_pre_execute of plugin "lint-sync-policy" is not an async def, but its listeners are awaited'
    ) in out
    assert "problem: plugin typo" in out and 'unknown hook "dsh_tools_chnage"' in out
    assert 'warning: plugin bait: tool name "bad.name" does not match' in out
    assert "problem: plugin lint-unmarked (" in out and (
        'failed at register: PluginValidationError: '
        'dsh_result of plugin "lint-unmarked" is not marked @hookimpl, so it would never be called'
    ) in out
    assert "5 problem(s), 1 warning(s)" in out


def test_check_shows_a_module_plugin_whose_hookimpls_are_in_a_class(tools: list[str], dists: Dists) -> None:
    policy = dists.module(
        "policy",
        "from dsh_core import Deny, hookimpl\n\n\nclass NoDeletes:\n    @hookimpl\n"
        "    async def dsh_pre_execute(self, execution, next):\n        return Deny('no')\n",
    )
    result = invoke([*tools, "--plugin", f"no-deletes={policy}", "check"])
    assert result.exit_code == 1
    assert (
        f"problem: plugin no-deletes ({policy}) failed at register: {policy} has no hookimpls, so it could do "
        f'nothing; its class NoDeletes has some: point the entry point at "{policy}:NoDeletes" (a class is '
        "instantiated with no arguments)"
    ) in result.stdout


DEEP_SCHEMAS = """
from dsh_core import RawSchema, define_tool, hookimpl

async def _body(args):
    return None

def _nesting(levels):
    schema = {"type": "string"}
    for _ in range(levels - 1):
        schema = {"type": "array", "items": schema}
    return schema

@hookimpl
def dsh_setup(runtime, config):
    # 196 levels is the deepest schema an MCP client reads in a tools/list answer.
    parameters = {"type": "object", "properties": {"x": _nesting(195)}}
    runtime.register(define_tool(
        name="deep_in", description="", parameters=RawSchema(parameters), output={"type": "json"}, execute=_body))
    runtime.register(define_tool(
        name="deep_out", description="", parameters={}, output=_nesting(195), execute=_body))
"""


def test_check_warns_about_tools_whose_schemas_serve_mcp_leaves_out(tools: list[str], dists: Dists) -> None:
    deep = dists.module("deep", DEEP_SCHEMAS)
    result = invoke([*tools, "--plugin", f"deep={deep}", "check"])
    assert result.exit_code == 0, result.output
    assert (
        'warning: plugin deep: tool "deep_in" cannot be served over MCP: its parameter schema nests more than 196 '
        "levels deep, deeper than an MCP client can read (serve-mcp leaves it out of its tool list)"
    ) in result.stdout
    assert (
        'warning: plugin deep: tool "deep_out" cannot be served over MCP: its output schema nests more than 194 '
        "levels deep, deeper than an MCP client can read (serve-mcp leaves it out of its tool list)"
    ) in result.stdout
    assert "0 problem(s), 2 warning(s)" in result.stdout


def test_check_strict_fails_on_warnings(tools: list[str], dists: Dists, tmp_path: Path) -> None:
    (tmp_path / "dsh.toml").write_text('disabled_plugins = ["no-such-plugin"]\n')
    relaxed = invoke([*tools, "check"])
    assert relaxed.exit_code == 0
    assert 'warning: disabled_plugins names "no-such-plugin"' in relaxed.stdout
    assert invoke([*tools, "check", "--strict"]).exit_code == 1


# -- configuration and usage errors ----------------------------------------------------------


def test_invalid_config_is_a_usage_error(tools: list[str], tmp_path: Path) -> None:
    (tmp_path / "dsh.toml").write_text('mode = "fast"\n')
    result = invoke([*tools, "list"])
    assert result.exit_code == 2
    assert 'mode: expected one of native/code/both, got "fast"' in result.stderr


def test_missing_config_file_is_a_usage_error(tools: list[str], tmp_path: Path) -> None:
    result = invoke(["--config", str(tmp_path / "none.toml"), *tools, "list"])
    assert result.exit_code == 2
    assert "configuration file not found" in result.stderr


def test_plugin_tables_reach_setup(dists: Dists, tmp_path: Path) -> None:
    module = dists.module(
        "configured",
        """
        import attrs
        from dsh_core import define_tool, hookimpl
        from dsh_core._config import structure_table

        @attrs.frozen
        class Settings:
            greeting: str

        @hookimpl
        def dsh_setup(runtime, config):
            settings = structure_table(Settings, config, "[plugins.hello]")

            async def body(args):
                return settings.greeting

            runtime.register(define_tool(
                name="hello", description="", parameters={}, output={"type": "string"}, execute=body))
        """,
    )
    config = tmp_path / "custom.toml"
    config.write_text('[plugins.hello]\ngreeting = "hi there"\n')
    ok = invoke(["--config", str(config), "--no-plugins", "--plugin", f"hello={module}", "call", "hello"])
    assert ok.exit_code == 0 and ok.stdout.strip() == "hi there"
    config.write_text("[plugins.hello]\ngreeting = 1\n")
    bad = invoke(["--config", str(config), "--no-plugins", "--plugin", f"hello={module}", "plugins", "--json"])
    (failed,) = json.loads(bad.stdout)["failed"]
    assert failed["stage"] == "setup"
    assert "[plugins.hello].greeting: expected a string, got 1" in failed["error"]


@pytest.mark.parametrize("spec", ["=x", "mod:", "a=b c", ":", "mod:attr:more", "a=.b", "m:a-b"])
def test_bad_plugin_option(tools: list[str], spec: str) -> None:
    result = invoke([*tools, "--plugin", spec, "list"])
    assert result.exit_code == 2
    assert "--plugin" in result.stderr
    assert "expected [NAME=]MODULE[:ATTR]" in result.stderr


def test_a_plugin_option_may_name_an_attribute(dists: Dists) -> None:
    module = dists.module("attrtools", PLUGIN)
    result = invoke(["--no-plugins", "--plugin", f"ask = {module} : AskForGuarded", "plugins", "--json"])
    assert result.exit_code == 0, result.output
    (loaded,) = json.loads(result.stdout)["loaded"]
    assert (loaded["name"], loaded["value"]) == ("ask", f"{module}:AskForGuarded")


# -- the installed script ------------------------------------------------------------------------


def test_real_subprocess_run(tools: list[str], dists: Dists, tmp_path: Path) -> None:
    batch = write_batch(tmp_path / "calls.jsonl", {"id": "s1", "name": "echo", "arguments": '{"v": true}'})
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(dists.root), os.environ.get("PYTHONPATH", "")]))
    script = Path(sys.executable).with_name("dsh-tools")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "dsh_core._cli"]
    done = subprocess.run(
        [*command, *tools, "run", str(batch)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60
    )
    assert done.returncode == 0, done.stderr
    (line,) = [json.loads(text) for text in done.stdout.splitlines()]
    assert line["id"] == "s1" and line["is_error"] is False
    assert json.loads(line["content"][0]["text"]) == {"v": True}
    failing = subprocess.run(
        [sys.executable, "-m", "dsh_core._cli", *tools, "call", "boom"],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=60,
    )
    assert failing.returncode == 1
    assert "TOOL_ERROR" in failing.stderr


@pytest.mark.parametrize("command", [["list"], ["schemas"], ["call", "calc", "{}"], ["run", "calls.jsonl"]])
def test_an_empty_agent_id_is_a_usage_error(command: list[str]) -> None:
    """No scope can be named by an empty id (Agent refuses one): a usage error, not a traceback."""
    result = CliRunner().invoke(cli, ["--no-plugins", *command[:1], "--agent", "", *command[1:]])
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--agent': an agent id cannot be empty" in result.output


WORKER_GUARD_PLUGIN = """
from dsh_core import Agent, define_tool, hookimpl

async def _echo(args):
    return args

@hookimpl
def dsh_setup(runtime, config):
    runtime.register(define_tool(name="echo", description="Echo.", parameters={}, output={"type": "json"}, execute=_echo))
    # The worker's scope holds a guard and no tool of its own.
    runtime.guard(lambda execution: "workers may not echo", scope=Agent(id="worker"))
"""


@pytest.mark.parametrize("command", ["call", "run"])
def test_agent_runs_as_the_scope_holding_its_guard(dists: Dists, tmp_path: Path, command: str) -> None:
    """``--agent worker`` is the plugin's worker scope even when that scope registers no tool."""
    module = dists.module("workerguard", WORKER_GUARD_PLUGIN)
    options = ["--no-plugins", "--plugin", f"workerguard={module}"]
    batch = tmp_path / "calls.jsonl"
    batch.write_text(json.dumps({"id": "c1", "name": "echo", "arguments": {}}) + "\n")
    if command == "call":
        denied = invoke([*options, "call", "echo", "{}", "--agent", "worker"])
        assert denied.exit_code == 1, denied.output
        assert "DENIED" in denied.stderr and "workers may not echo" in denied.stdout
        assert invoke([*options, "call", "echo", "{}", "--agent", "lead"]).exit_code == 0
    else:
        # run exits 0 once the batch ran: the result line says what happened.
        denied = invoke([*options, "run", str(batch), "--agent", "worker"])
        assert json.loads(denied.stdout)["error"]["code"] == "DENIED"
        assert json.loads(denied.stdout)["error"]["message"] == "workers may not echo"
        allowed = invoke([*options, "run", str(batch), "--agent", "lead"])
        assert json.loads(allowed.stdout)["is_error"] is False


STUCK_PLUGIN = """
import threading

from dsh_core import define_tool, hookimpl
from dsh_plugins import timeout

STARTED = threading.Event()
RELEASE = threading.Event()

def _stuck(args):
    STARTED.set()
    RELEASE.wait(10)
    return "late"

@hookimpl
def dsh_setup(runtime, config):
    runtime.register(define_tool(
        name="stuck", description="Blocks in a worker thread.", parameters={}, output={"type": "string"},
        execute=_stuck, in_thread=True, timeout_ms=300))
    timeout.dsh_setup(runtime, {})
"""


def test_call_warns_about_a_worker_thread_left_running_and_logs_it(dists: Dists, tmp_path: Path) -> None:
    module_name = dists.module("stucktools", STUCK_PLUGIN)
    log = tmp_path / "session.jsonl"
    try:
        result = invoke(["--no-plugins", "--plugin", f"stuck={module_name}", "call", "stuck", "--session", str(log)])
        module = importlib.import_module(module_name)
        assert module.STARTED.is_set()
    finally:
        importlib.import_module(module_name).RELEASE.set()
    assert result.exit_code == 1
    assert "TOOL_TIMEOUT" in result.stderr
    assert "warning: call cli-" in result.stderr
    assert "(stuck) was cancelled while a worker thread ran" in result.stderr
    assert "_stuck" in result.stderr
    types = [event.type for event in read_session_log(log).events]
    assert types == ["tool/call", "tool/orphaned", "tool/result"]


def test_call_without_orphans_prints_no_warning(tools: list[str]) -> None:
    result = invoke([*tools, "call", "echo", "{}"])
    assert result.exit_code == 0
    assert "warning" not in result.stderr


# -- standing approvals (grants) ---------------------------------------------------------


def test_a_granted_tool_runs_without_asking_even_non_interactively(tools: list[str], tmp_path: Path) -> None:
    book = tmp_path / "grants.jsonl"
    added = invoke(["grants", "add", str(book), "guarded", "--agent", "cli", "--by", "ana", "--note", "safe echo"])
    assert added.exit_code == 0, added.output
    assert "guarded for agent cli, any arguments" in added.stdout
    allowed = invoke([*tools, "--grants", str(book), "call", "guarded", '{"a": 1}'])
    assert allowed.exit_code == 0, allowed.output
    assert json.loads(allowed.stdout) == {"a": 1}
    other_agent = invoke([*tools, "--grants", str(book), "call", "guarded", "{}", "--agent", "helper"])
    assert other_agent.exit_code == 1 and "DENIED" in other_agent.stderr
    [grant] = read_grants(book)
    assert (grant.granted_by, grant.note, grant.uses) == ("ana", "safe echo", 1)


def test_answering_always_records_a_grant_the_next_run_uses(tools: list[str], tmp_path: Path) -> None:
    book = tmp_path / "grants.jsonl"
    first = invoke([*tools, "--interactive", "--grants", str(book), "call", "guarded", "{}"], input="a\n")
    assert first.exit_code == 0, first.output
    assert "Allow guarded" in first.stderr
    assert "a = grant: always allow guarded for agent cli, any arguments (recorded, revocable)\n" in first.stderr
    second = invoke([*tools, "--interactive", "--grants", str(book), "call", "guarded", "{}"], input="")
    assert second.exit_code == 0, second.output
    assert "Allow guarded" not in second.stderr  # not asked again
    [grant] = read_grants(book)
    assert (grant.tool, grant.agent, grant.uses) == ("guarded", "cli", 2)
    assert grant.granted_by.endswith("(dsh-tools)")


def test_grants_show_and_revoke(tools: list[str], tmp_path: Path) -> None:
    book = tmp_path / "grants.jsonl"
    invoke(["grants", "add", str(book), "guarded", "--any-agent", "--arguments", '{"a": 1}', "--ttl", "3600"])
    [grant] = read_grants(book)
    shown = invoke(["grants", "show", str(book)])
    assert shown.exit_code == 0
    assert grant.id in shown.stdout and "active" in shown.stdout and '{"a": 1}' in shown.stdout
    as_json = json.loads(invoke(["grants", "show", str(book), "--json"]).stdout)
    assert as_json["grants"][0]["id"] == grant.id
    assert as_json["grants"][0]["anyAgent"] is True and as_json["grants"][0]["active"] is True

    revoked = invoke(["grants", "revoke", str(book), grant.id, "--by", "security"])
    assert revoked.exit_code == 0 and f"{grant.id}: revoked" in revoked.stdout
    assert "0 grant(s)" in invoke(["grants", "show", str(book)]).stdout
    everything = invoke(["grants", "show", str(book), "--all"]).stdout
    assert "revoked by security" in everything
    denied = invoke([*tools, "--grants", str(book), "call", "guarded", '{"a": 1}'])
    assert denied.exit_code == 1 and "DENIED" in denied.stderr


def test_check_warns_about_a_grant_for_a_tool_that_is_not_registered(tools: list[str], tmp_path: Path) -> None:
    book = tmp_path / "grants.jsonl"
    assert invoke(["grants", "add", str(book), "guardd", "--any-agent"]).exit_code == 0  # misspelt
    result = invoke([*tools, "--grants", str(book), "check"])
    assert f"grants {book}: grant " in result.stdout + result.stderr
    assert 'is for tool "guardd", which is not registered' in result.stdout + result.stderr


def test_grants_add_warns_about_a_tool_no_loaded_plugin_registers(tools: list[str], tmp_path: Path) -> None:
    book = tmp_path / "grants.jsonl"
    misspelt = invoke([*tools, "grants", "add", str(book), "guardd", "--any-agent"])
    assert misspelt.exit_code == 0, misspelt.output  # granted all the same: its plugin may not be loaded here
    assert (
        'warning: no loaded tool is named "guardd"; the grant applies only if such a tool is registered later'
    ) in misspelt.stderr
    assert [grant.tool for grant in read_grants(book)] == ["guardd"]
    known = invoke([*tools, "grants", "add", str(book), "guarded", "--any-agent"])
    assert known.exit_code == 0 and "warning" not in known.stderr


def test_grants_add_refuses_arguments_no_call_of_the_tool_can_have(tools: list[str], tmp_path: Path) -> None:
    """A call's arguments always satisfy its tool's schema, and a grant covers only exactly equal ones."""
    book = tmp_path / "grants.jsonl"
    refused = invoke([*tools, "grants", "add", str(book), "slow", "--any-agent", "--arguments", '{"n": "one"}'])
    assert refused.exit_code == 2
    assert refused.stderr.splitlines()[-1] == (
        'Error: --arguments can never match a call of tool "slow", whose parameter schema refuses them: '
        '"n" must be an integer; nothing was granted'
    )
    assert not book.exists() or read_grants(book) == ()
    granted = invoke([*tools, "grants", "add", str(book), "slow", "--any-agent", "--arguments", '{"n": 1}'])
    assert granted.exit_code == 0, granted.output
    assert [grant.arguments for grant in read_grants(book)] == [{"n": 1}]


def test_check_warns_about_a_grant_whose_arguments_no_call_can_have(tools: list[str], tmp_path: Path) -> None:
    from dsh_plugins.grants import GrantBook

    book = tmp_path / "grants.jsonl"
    (grant,) = [GrantBook(book).grant("slow", granted_by="ana", any_agent=True, arguments={"m": 1})]
    result = invoke([*tools, "--grants", str(book), "check"])
    assert (
        f'warning: grants {book}: grant {grant.id} for tool "slow" names arguments its parameter schema refuses, '
        'so it never applies: missing required property "n" (revoke it and grant arguments a call can have)'
    ) in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["guarded"], "pass either --agent ID or --any-agent"),
        (["guarded", "--agent", "a", "--any-agent"], "pass either --agent ID or --any-agent"),
        (["guarded", "--agent", "a", "--arguments", "{nope"], "--arguments is not JSON"),
        (["guarded", "--agent", "a", "--arguments", "[1]"], "--arguments must be a JSON object (a call's whole"),
        (
            ["guarded", "--agent", "a", "--arguments", '{"op": "add", "x": {"n": 1}, "op": "rm"}'],
            '--arguments gives the key "op" twice in one object',
        ),
        (["guarded", "--agent", "a", "--arguments", '{"n": ' + "7" * 5000 + "}"], "an integer of 5000 digits"),
        (["guarded", "--agent", "a", "--ttl", "0"], "--ttl must be a positive number of seconds, at most 100 years, got 0"),
        (["guarded", "--agent", "a", "--ttl", "-5"], "at most 100 years, got -5"),
        (["guarded", "--agent", "a", "--ttl", "nan"], "at most 100 years, got nan"),
        (["guarded", "--agent", "a", "--ttl", "inf"], "--ttl must be a positive number of seconds, at most 100 years"),
        (["guarded", "--agent", "a", "--ttl", "1e300"], "--ttl must be a positive number of seconds, at most 100 years"),
    ],
)
def test_grants_add_refuses_bad_options(tmp_path: Path, args: list[str], message: str) -> None:
    """Named as the command line names them (not ttl_s), and before any warning about the tool."""
    book = tmp_path / "grants.jsonl"
    result = invoke(["grants", "add", str(book), *args])
    assert result.exit_code == 2
    assert message in result.stderr
    assert "warning" not in result.stderr
    assert not book.exists() or read_grants(book) == ()


def test_grants_revoke_of_an_unknown_grant_and_a_damaged_file(tools: list[str], tmp_path: Path) -> None:
    book = tmp_path / "grants.jsonl"
    invoke(["grants", "add", str(book), "guarded", "--agent", "cli"])
    unknown = invoke(["grants", "revoke", str(book), "g-nope"])
    assert unknown.exit_code == 2 and "there is no grant 'g-nope'" in unknown.stderr
    book.write_text("garbage\n" + book.read_text())
    for args in (["grants", "show", str(book)], [*tools, "--grants", str(book), "call", "guarded", "{}"]):
        damaged = invoke(args)
        assert damaged.exit_code == 2
        assert "the grants file is damaged" in damaged.stderr


def test_code_runtime_settings_reach_the_code_mode_runtime(tools: list[str], tmp_path: Path) -> None:
    (tmp_path / "code.toml").write_text('mode = "code"\n[code_runtime]\nallow_subprocesses = false\n')
    program = "import os\nos.system('true')\nreturn 1"
    arguments = json.dumps({"code": program, "description": "d"})
    result = invoke(["--config", str(tmp_path / "code.toml"), *tools, "call", "run_code", arguments])
    assert result.exit_code == 1
    assert "may not start other programs (os.system)" in result.stdout


@pytest.mark.parametrize("mode", ["native", "code"])
def test_every_invalid_code_runtime_setting_is_a_usage_error_in_any_mode(
    tools: list[str], tmp_path: Path, mode: str
) -> None:
    (tmp_path / "code.toml").write_text(
        f'mode = "{mode}"\n[code_runtime]\nmax_cpu_s = 0\nwall_budget_s = -1\nmax_memory_bytes = 1\n'
        '[tool_prefixes]\ncli = "c c"\n'
    )
    result = invoke(["--config", str(tmp_path / "code.toml"), *tools, "list"])
    assert result.exit_code == 2
    for problem in (
        "code_runtime.max_cpu_s: expected a positive integer, got 0",
        "code_runtime.wall_budget_s: expected a positive number of seconds, got -1",
        "code_runtime.max_memory_bytes: expected at least 16777216",
        "tool_prefixes['cli']: a prefix is 1-32 letters",
    ):
        assert problem in result.stderr


CARD_PLUGIN = """
from dsh_core import Ask, define_tool, hookimpl
from dsh_core.presentation import TerminalCallView

async def _run(args):
    return "ran"

class AskAll:
    @hookimpl
    async def dsh_pre_execute(self, execution, next):
        return Ask("check it")

@hookimpl
def dsh_setup(runtime, config):
    runtime.register(define_tool(
        name="sh", description="d", parameters={"command": {"type": "string", "required": True}},
        output={"type": "string"}, execute=_run,
        present_call=lambda args: TerminalCallView(title=args["command"])))
    runtime.plugins.register(AskAll(), name="ask-all")
"""


def test_the_prompt_shows_the_tools_card_also_behind_grants(dists: Dists, tmp_path: Path) -> None:
    module = dists.module("cardtools", CARD_PLUGIN)
    book = tmp_path / "grants.jsonl"
    args = ["--no-plugins", "--plugin", f"cards={module}", "--interactive", "--grants", str(book)]
    result = invoke([*args, "call", "sh", '{"command": "make test"}'], input="n\n")
    assert "Allow sh make test? [y/N/a]" in result.stderr  # the card's title, not {"command": ...}


def test_check_warns_about_tools_an_effects_rule_cannot_see(tools: list[str], tmp_path: Path) -> None:
    config = tmp_path / "dsh.toml"
    config.write_text(
        '[plugins.permissions]\nrules = [{ tool = "*", effects = ["destructive"], action = "ask" }]\n'
    )
    args = ["--config", str(config), *tools, "--plugin", "permissions=dsh_plugins.permissions", "check"]
    result = invoke(args)
    assert "matches on declared effects, but boom, echo, guarded, picture, slow declare none" in result.stdout
    assert invoke([*args, "--strict"]).exit_code == 1


def test_grants_compact_keeps_the_grants_in_force(tmp_path: Path) -> None:
    book = tmp_path / "grants.jsonl"
    invoke(["grants", "add", str(book), "guarded", "--agent", "cli"])
    invoke(["grants", "add", str(book), "echo", "--agent", "cli"])
    [first, second] = read_grants(book)
    invoke(["grants", "revoke", str(book), second.id])
    result = invoke(["grants", "compact", str(book), "--archive", str(tmp_path / "old.jsonl")])
    assert result.exit_code == 0, result.output
    assert "1 grant(s) in force kept" in result.stdout
    assert [grant.id for grant in read_grants(book)] == [first.id]
    assert len(read_grants(tmp_path / "old.jsonl")) == 2
    again = invoke(["grants", "compact", str(book), "--archive", str(tmp_path / "old.jsonl")])
    assert again.exit_code == 2 and "exists already" in again.stderr


def test_check_warns_about_defer_patterns_that_match_nothing(tools: list[str], tmp_path: Path) -> None:
    config = tmp_path / "dsh.toml"
    config.write_text('[plugins.tool_search]\nenabled = true\ndefer = ["sl*", "github__*"]\n')
    args = ["--config", str(config), *tools, "--plugin", "tool_search=dsh_plugins.tool_search", "check"]
    result = invoke(args)
    assert "plugin tool-search: defer pattern 'github__*' matches no registered tool" in result.stdout
    assert "'sl*'" not in result.stdout
    assert "has nothing to find" not in result.stdout  # slow is deferred


def test_check_warns_when_the_search_has_nothing_to_find(tools: list[str], tmp_path: Path) -> None:
    config = tmp_path / "dsh.toml"
    config.write_text("[plugins.tool_search]\nenabled = true\n")
    args = ["--config", str(config), *tools, "--plugin", "tool_search=dsh_plugins.tool_search", "check"]
    assert "search_tools has nothing to find: no tool is deferred" in invoke(args).stdout


RETRYING_PLUGIN = """
from dsh_core import RetryPolicy, ToolEffects, define_tool, hookimpl

async def _echo(args):
    return args

@hookimpl
def dsh_setup(runtime, config):
    runtime.register(define_tool(
        name="charge_card", description="Charges.", parameters={}, output={"type": "json"}, execute=_echo,
        effects=ToolEffects(destructive=True), retry=RetryPolicy()))
    runtime.register(define_tool(
        name="put_object", description="Writes.", parameters={}, output={"type": "json"}, execute=_echo,
        effects=ToolEffects(destructive=True, idempotent=True), retry=RetryPolicy()))
"""


def test_check_warns_about_retrying_a_destructive_non_idempotent_tool(dists: Dists) -> None:
    module = dists.module("retrying", RETRYING_PLUGIN)
    result = invoke(["--no-plugins", "--plugin", f"retrying={module}", "check"])
    assert 'tool "charge_card" retries a destructive, non-idempotent body' in result.stdout
    assert "put_object" not in result.stdout


def test_check_warns_about_tool_prefixes_that_cannot_apply(tools: list[str], tmp_path: Path) -> None:
    config = tmp_path / "dsh.toml"
    config.write_text('[tool_prefixes]\ncli = "c"\ntypo = "t"\nmcp = "m"\n')
    mcp = ["--plugin", "mcp=dsh_plugins.mcp_client"]
    out = invoke(["--config", str(config), *tools, *mcp, "check"]).stdout
    assert 'tool_prefixes names "typo", but no such plugin is loaded' in out
    assert 'tool_prefixes names "mcp": it prefixes only the tools listed at setup' in out
    assert '"cli"' not in out
    assert "c__echo" in invoke(["--config", str(config), *tools, "list"]).stdout


# -- a configured plugin that failed ---------------------------------------------------------

PERMISSIONS = ["--plugin", "permissions=dsh_plugins.permissions"]


@pytest.fixture
def misconfigured(tmp_path: Path) -> Path:
    config = tmp_path / "bad.toml"
    config.write_text('[plugins.permissions]\nrules = [{ tool = "echo", action = "dny" }]\n')
    return config


def test_a_configured_plugin_that_failed_stops_every_command_that_runs_calls(
    tools: list[str], tmp_path: Path, misconfigured: Path
) -> None:
    log = tmp_path / "session.jsonl"
    assert invoke([*tools, "call", "echo", "{}", "--session", str(log)]).exit_code == 0
    batch = write_batch(tmp_path / "calls.jsonl", {"id": "c1", "name": "echo", "arguments": {}})
    problem = (
        f"plugin permissions: {misconfigured}: "
        '[plugins.permissions].rules[0].action: expected one of allow/deny/ask, got "dny"'
    )
    options = ["--config", str(misconfigured), *tools, *PERMISSIONS]
    for command in (["call", "echo", "{}"], ["run", str(batch)], ["serve-mcp"], ["simulate", str(log), "--json"]):
        result = invoke([*options, *command])
        assert result.exit_code == 2, (command, result.output)
        assert "a plugin the configuration sets up failed to load, so nothing was run" in result.stderr
        assert problem in result.stderr
        # simulate --json must not report "changed": false for a policy that never loaded.
        assert result.stdout == ""
    # The simulator's own --config is the policy under test.
    tried = invoke([*tools, *PERMISSIONS, "simulate", str(log), "--config", str(misconfigured), "--json"])
    assert tried.exit_code == 2 and tried.stdout == ""
    assert len(read_session_log(log).events) == 2  # nothing more was recorded


def test_commands_that_run_nothing_still_work_and_check_lists_each_problem(
    tools: list[str], misconfigured: Path
) -> None:
    options = ["--config", str(misconfigured), *tools, *PERMISSIONS]
    listed = invoke([*options, "list"])
    assert listed.exit_code == 0 and "echo" in listed.stdout
    assert "warning: plugin permissions failed (setup)" in listed.stderr
    checked = invoke([*options, "check"])
    assert checked.exit_code == 1
    assert (
        f"plugin permissions (dsh_plugins.permissions) failed at setup: invalid configuration: {misconfigured}: "
        '[plugins.permissions].rules[0].action: expected one of allow/deny/ask, got "dny"'
    ) in checked.stdout


def test_an_installed_plugin_failing_without_a_table_is_only_a_warning_but_a_configured_one_stops_calls(
    dists: Dists, tmp_path: Path
) -> None:
    dists.module("clitools", PLUGIN)
    dists.dist("dsh-cli-ghost", {"cli": "{p}clitools", "ghost": "dsh_no_such_module"})
    installed = ["--group", dists.group]
    warned = invoke([*installed, "call", "echo", '{"a": 1}'])
    assert warned.exit_code == 0 and json.loads(warned.stdout) == {"a": 1}
    assert "warning: plugin ghost failed (import)" in warned.stderr
    (tmp_path / "dsh.toml").write_text("[plugins.ghost]\nlevel = 3\n")
    refused = invoke([*installed, "call", "echo", "{}"])
    assert refused.exit_code == 2 and refused.stdout == ""
    assert "plugin ghost ([plugins.ghost] is set) failed at import: ModuleNotFoundError" in refused.stderr


def test_a_table_for_a_plugin_that_reads_no_configuration_is_warned_about(dists: Dists, tmp_path: Path) -> None:
    dists.module("clitools", PLUGIN)
    dists.module("squat", SQUAT)  # no dsh_setup at all
    dists.dist("dsh-cli-unread", {"cli": "{p}clitools", "unread": "{p}squat"})
    (tmp_path / "dsh.toml").write_text('[plugins.unread]\nblock = ["echo"]\n')
    warning = (
        "plugin unread reads no configuration (it has no dsh_setup taking a config argument), "
        "so its table [plugins.unread] has no effect"
    )
    called = invoke(["--group", dists.group, "call", "echo", '{"a": 1}'])
    assert called.exit_code == 0 and json.loads(called.stdout) == {"a": 1}
    assert f"warning: {warning}" in called.stderr
    checked = invoke(["--group", dists.group, "check"])
    assert f"warning: {warning}" in checked.stdout
    assert invoke(["--group", dists.group, "check", "--strict"]).exit_code == 1


def test_serve_mcp_and_simulate_json_warn_on_stderr_about_a_plugin_that_failed(
    dists: Dists, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A long-running server must not hide an installed policy that failed: stderr is not the protocol.
    import dsh_core._mcp_server as mcp_server

    served: list[object] = []
    monkeypatch.setattr(mcp_server, "run_serve_mcp", lambda runtime, **_: served.append(runtime))
    dists.module("clitools", PLUGIN)
    dists.dist("dsh-cli-ghost", {"cli": "{p}clitools", "ghost": "dsh_no_such_module"})
    served_result = invoke(["--group", dists.group, "serve-mcp"])
    assert served_result.exit_code == 0 and len(served) == 1
    assert served_result.stdout == ""
    assert "warning: plugin ghost failed (import): ModuleNotFoundError" in served_result.stderr
    log = tmp_path / "session.jsonl"
    assert invoke(["--group", dists.group, "call", "echo", "{}", "--session", str(log)]).exit_code == 0
    simulated = invoke(["--group", dists.group, "simulate", str(log), "--json"])
    assert simulated.exit_code == 0
    json.loads(simulated.stdout)
    assert "warning: plugin ghost failed (import): ModuleNotFoundError" in simulated.stderr


def test_serve_mcp_passes_its_approval_timeout_and_refuses_a_bad_one(
    dists: Dists, monkeypatch: pytest.MonkeyPatch
) -> None:
    import dsh_core._mcp_server as mcp_server

    served: list[dict[str, object]] = []
    monkeypatch.setattr(mcp_server, "run_serve_mcp", lambda runtime, **options: served.append(options))
    dists.module("clitools", PLUGIN)
    dists.dist("dsh-cli-timeout", {"cli": "{p}clitools"})
    assert invoke(["--group", dists.group, "serve-mcp"]).exit_code == 0
    assert invoke(["--group", dists.group, "serve-mcp", "--approval-timeout", "45"]).exit_code == 0
    assert [options["approval_timeout_s"] for options in served] == [600.0, 45.0]
    refused = invoke(["--group", dists.group, "serve-mcp", "--approval-timeout", "0"])
    assert refused.exit_code == 2 and "--approval-timeout" in refused.stderr and len(served) == 2


def test_commands_that_run_calls_warn_about_misspelt_plugin_names(dists: Dists, tmp_path: Path) -> None:
    dists.module("clitools", PLUGIN)
    dists.module("squat", SQUAT)
    dists.dist("dsh-cli-names", {"cli": "{p}clitools", "example-tools": "{p}squat"})
    (tmp_path / "dsh.toml").write_text('disabled_plugins = ["example_tools"]\n[tool_prefixes]\nexmaple-tools = "ex"\n')
    result = invoke(["--group", dists.group, "call", "echo", '{"a": 1}'])
    assert result.exit_code == 0 and json.loads(result.stdout) == {"a": 1}
    assert (
        'warning: disabled_plugins names "example_tools", but no such plugin is installed '
        '(did you mean "example-tools"?)'
    ) in result.stderr
    assert (
        'warning: tool_prefixes names "exmaple-tools", but no such plugin is installed (did you mean "example-tools"?)'
    ) in result.stderr
    # Commands that run nothing warn too, as check does (README: "Other commands only warn").
    listed = invoke(["--group", dists.group, "list"])
    assert listed.exit_code == 0
    assert 'warning: disabled_plugins names "example_tools"' in listed.stderr


@pytest.mark.parametrize("command", [["list"], ["schemas"], ["sdk"], ["plugins"], ["plugins", "--json"]])
def test_commands_that_run_no_calls_warn_about_a_misspelt_table(
    dists: Dists, tmp_path: Path, command: list[str]
) -> None:
    dists.module("clitools", PLUGIN)
    dists.dist("dsh-cli-tables", {"cli": "{p}clitools"})
    (tmp_path / "dsh.toml").write_text("[plugins.clitool]\nx = 1\n")
    result = invoke(["--group", dists.group, *command])
    assert result.exit_code == 0, result.output
    assert result.stderr.count("[plugins.clitool]") == 1
    assert (
        'warning: [plugins.clitool] configures no installed plugin: it is ignored (did you mean "cli"?)'
    ) in result.stderr
    if "--json" in command:
        json.loads(result.stdout)  # stdout stays the document


SQUAT = """
from dsh_core import hookimpl

@hookimpl
def dsh_result(execution, result):
    pass
"""


def test_a_configured_plugin_name_two_distributions_provide_stops_every_command_that_runs_calls(
    dists: Dists, tmp_path: Path
) -> None:
    """A distribution whose entry point takes a configured plugin's name must not silently replace it."""
    dists.module("clitools", PLUGIN)
    squat = dists.module("squat", SQUAT)
    dists.dist("acme-squat", {"cli": "{p}squat"})
    dists.dist("dsh-cli-real", {"cli": "{p}clitools", "extra": "{p}clitools"})
    installed = ["--group", dists.group]
    batch = write_batch(tmp_path / "calls.jsonl", {"id": "c1", "name": "echo", "arguments": {}})
    log = tmp_path / "session.jsonl"
    # Without a table the skipped one is a warning, as before.
    warned = invoke([*installed, "call", "echo", '{"a": 1}', "--session", str(log)])
    assert warned.exit_code == 0 and json.loads(warned.stdout) == {"a": 1}
    assert 'warning: plugin cli failed (register): duplicate plugin name "cli"' in warned.stderr
    (tmp_path / "dsh.toml").write_text("[plugins.cli]\n")
    for command in (["call", "echo", "{}"], ["run", str(batch)], ["serve-mcp"], ["simulate", str(log), "--json"]):
        result = invoke([*installed, *command])
        assert result.exit_code == 2, (command, result.output)
        assert result.stdout == ""
        assert "a plugin the configuration sets up failed to load, so nothing was run" in result.stderr
        assert (
            f"plugin cli ([plugins.cli] is set) is provided by two distributions: acme-squat ({squat}) took the name "
            f"and dsh-cli-real ({dists.prefix}clitools) was skipped; uninstall the one you do not mean"
        ) in result.stderr


def test_a_bundled_plugin_keeps_its_name_and_check_shows_the_squatter(dists: Dists, tmp_path: Path) -> None:
    """``dsh-cli`` sorts before ``dsh-tools``: it used to take the name and turn the bundled plugin off."""
    dists.module("clitools", PLUGIN)
    squat = dists.module("squat", SQUAT)
    dists.dist("dsh-tools", {"cli": "{p}clitools"})
    dists.dist("dsh-cli", {"cli": "{p}squat"})
    installed = ["--group", dists.group]
    ran = invoke([*installed, "call", "echo", '{"a": 1}'])
    assert ran.exit_code == 0 and json.loads(ran.stdout) == {"a": 1}
    skipped = (
        f"it is dsh-tools' own plugin ({dists.prefix}clitools), which keeps it; dsh-cli ({squat}) was skipped: "
        "uninstall it or rename its entry point"
    )
    assert f'warning: plugin cli failed (register): duplicate plugin name "cli": {skipped}' in ran.stderr
    checked = invoke([*installed, "check"])
    assert checked.exit_code == 1, checked.output
    assert f"problem: plugin cli ({squat} from dsh-cli 1.0) failed at register: " in checked.stdout
    assert skipped in checked.stdout


ECHO_TOO = """
from dsh_core import define_tool, hookimpl

async def _echo(args):
    return {"second": True}

@hookimpl
def dsh_setup(runtime, config):
    runtime.register(define_tool(
        name="echo", description="Another echo.", parameters={}, output={"type": "json"}, execute=_echo))
"""


def test_a_plugin_refused_for_a_duplicate_tool_gets_checks_fix_from_the_commands_that_run_calls(
    dists: Dists, tmp_path: Path
) -> None:
    """Not the registry's hint for plugin authors: the holder, and the [tool_prefixes] that loads both."""
    dists.module("clitools", PLUGIN)
    dists.module("echotoo", ECHO_TOO)
    dists.dist("dsh-cli-a", {"cli": "{p}clitools"})
    dists.dist("dsh-cli-b", {"second": "{p}echotoo"})
    installed = ["--group", dists.group]
    fix = (
        'plugin second: tool "echo" is already registered by plugin cli (duplicate tool name; to load both, '
        'give one a prefix: [tool_prefixes] second = "..." in dsh.toml)'
    )
    warned = invoke([*installed, "call", "echo", '{"a": 1}'])
    assert warned.exit_code == 0 and json.loads(warned.stdout) == {"a": 1}
    assert f"warning: {fix}" in warned.stderr
    (tmp_path / "dsh.toml").write_text("[plugins.second]\n")
    batch = write_batch(tmp_path / "calls.jsonl", {"id": "c1", "name": "echo", "arguments": {}})
    for command in (["call", "echo", "{}"], ["run", str(batch)]):
        refused = invoke([*installed, *command])
        assert refused.exit_code == 2, (command, refused.output)
        assert refused.stdout == ""
        assert "a plugin the configuration sets up failed to load, so nothing was run" in refused.stderr
        assert fix in refused.stderr
        assert "per-agent variant" not in refused.stderr
    (tmp_path / "dsh.toml").write_text('[plugins.second]\n[tool_prefixes]\nsecond = "two"\n')
    assert json.loads(invoke([*installed, "call", "two__echo", "{}"]).stdout) == {"second": True}


def _refusal(stderr: str) -> list[str]:
    """The lines of a refusal to run, without click's "Error: " and the indentation."""
    return [line.removeprefix("Error: ").strip() for line in stderr.splitlines()]


REFUSED_HEADING = "a plugin the configuration sets up failed to load, so nothing was run:"


def test_a_configured_plugin_whose_table_is_refused_is_told_to_fix_its_table(
    tools: list[str], misconfigured: Path
) -> None:
    """Each failure gets the fix for its cause: only a table problem is fixed in its table."""
    table = invoke(["--config", str(misconfigured), *tools, *PERMISSIONS, "call", "echo", "{}"])
    assert table.exit_code == 2 and table.stdout == ""
    assert _refusal(table.stderr) == [
        REFUSED_HEADING,
        f"plugin permissions: {misconfigured}: "
        '[plugins.permissions].rules[0].action: expected one of allow/deny/ask, got "dny"',
        'hint: fix its table [plugins.permissions], or list "permissions" in disabled_plugins to run without it',
    ]


def test_a_refused_table_in_pyproject_is_named_as_it_is_spelt_there(
    tools: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text('[tool.dsh.plugins.permissions]\ndefault = "maybe"\n')
    result = invoke([*tools, *PERMISSIONS, "call", "echo", "{}"])
    assert result.exit_code == 2 and result.stdout == ""
    assert _refusal(result.stderr) == [
        REFUSED_HEADING,
        f"plugin permissions: {tmp_path / 'pyproject.toml'}: "
        '[tool.dsh.plugins.permissions].default: expected one of allow/deny/ask, got "maybe"',
        'hint: fix its table [tool.dsh.plugins.permissions], or list "permissions" in disabled_plugins to run without it',
    ]


def test_a_configured_plugin_that_cannot_be_imported_is_not_blamed_on_its_table(
    dists: Dists, tmp_path: Path
) -> None:
    dists.module("broken", BROKEN_IMPORT)
    dists.dist("dsh-broken", {"broken": "{p}broken"})
    (tmp_path / "dsh.toml").write_text("[plugins.broken]\n")
    result = invoke(["--group", dists.group, "call", "echo", "{}"])
    assert result.exit_code == 2 and result.stdout == ""
    assert _refusal(result.stderr) == [
        REFUSED_HEADING,
        "plugin broken ([plugins.broken] is set) failed at import: "
        "ModuleNotFoundError: No module named 'missing_dependency_for_cli_test'",
        'hint: the plugin itself failed, not its table: fix or reinstall it, or list "broken" in disabled_plugins '
        "to run without it",
    ]


SETUP_RAISES = """
from dsh_core import hookimpl

@hookimpl
def dsh_setup(runtime, config):
    raise RuntimeError("no token in the environment")
"""

ECHO_TWICE = """
from dsh_core import define_tool, hookimpl

async def _echo(args):
    return {}

@hookimpl
def dsh_setup(runtime, config):
    for _ in range(2):
        runtime.register(define_tool(
            name="twice", description="Twice.", parameters={}, output={"type": "json"}, execute=_echo))
"""


@pytest.mark.parametrize(
    ("source", "problem", "hint"),
    [
        (
            SETUP_RAISES,
            "failed at setup: dsh_setup failed: RuntimeError: no token in the environment",
            "hint: its dsh_setup failed (see its error): fix the plugin or its table [plugins.odd], "
            'or list "odd" in disabled_plugins to run without it',
        ),
        (
            ECHO_TWICE,
            'plugin odd: tool "twice" is registered twice by this plugin itself',
            "hint: the plugin registers one tool name twice (its own bug): fix or update it, "
            'or list "odd" in disabled_plugins to run without it',
        ),
    ],
)
def test_a_configured_plugin_whose_setup_failed_gets_the_hint_of_its_cause(
    dists: Dists, tmp_path: Path, source: str, problem: str, hint: str
) -> None:
    dists.module("odd", source)
    dists.dist("dsh-odd", {"odd": "{p}odd"})
    (tmp_path / "dsh.toml").write_text("[plugins.odd]\n")
    result = invoke(["--group", dists.group, "call", "echo", "{}"])
    assert result.exit_code == 2 and result.stdout == ""
    lines = _refusal(result.stderr)
    assert lines[0] == REFUSED_HEADING and len(lines) == 3, lines
    assert problem in lines[1]
    assert lines[2] == hint


def test_a_configured_plugin_refused_for_a_duplicate_tool_is_told_to_prefix_not_to_fix_its_table(
    dists: Dists, tmp_path: Path
) -> None:
    dists.module("clitools", PLUGIN)
    dists.module("echotoo", ECHO_TOO)
    dists.dist("dsh-cli-a", {"cli": "{p}clitools"})
    dists.dist("dsh-cli-b", {"second": "{p}echotoo"})
    (tmp_path / "dsh.toml").write_text("[plugins.second]\n")
    result = invoke(["--group", dists.group, "call", "echo", "{}"])
    assert result.exit_code == 2 and result.stdout == ""
    assert _refusal(result.stderr) == [
        REFUSED_HEADING,
        'plugin second: tool "echo" is already registered by plugin cli (duplicate tool name; to load both, '
        'give one a prefix: [tool_prefixes] second = "..." in dsh.toml)',
        'hint: a tool name clash, not a table problem: rename as above, or list "second" in disabled_plugins '
        "to run without it",
    ]


def test_a_configured_plugin_name_two_distributions_provide_is_told_to_uninstall_one(
    dists: Dists, tmp_path: Path
) -> None:
    dists.module("clitools", PLUGIN)
    squat = dists.module("squat", SQUAT)
    dists.dist("acme-squat", {"cli": "{p}squat"})
    dists.dist("dsh-cli-real", {"cli": "{p}clitools"})
    (tmp_path / "dsh.toml").write_text("[plugins.cli]\n")
    result = invoke(["--group", dists.group, "call", "echo", "{}"])
    assert result.exit_code == 2 and result.stdout == ""
    assert _refusal(result.stderr) == [
        REFUSED_HEADING,
        f"plugin cli ([plugins.cli] is set) is provided by two distributions: acme-squat ({squat}) took the name "
        f"and dsh-cli-real ({dists.prefix}clitools) was skipped; uninstall the one you do not mean "
        "(or, for a --plugin one, give it another NAME=)",
        "hint: a plugin name clash, not a table problem: uninstall one distribution as above, "
        'or list "cli" in disabled_plugins to run without it',
    ]


def test_check_says_a_plugin_refused_for_a_duplicate_tool_once(dists: Dists) -> None:
    """One line per problem: the holder and the fix, not also the registry's hint for plugin authors."""
    dists.module("clitools", PLUGIN)
    echotoo = dists.module("echotoo", ECHO_TOO)
    dists.dist("dsh-cli-a", {"cli": "{p}clitools"})
    dists.dist("dsh-cli-b", {"second": "{p}echotoo"})
    result = invoke(["--group", dists.group, "check"])
    assert result.exit_code == 1, result.output
    problems = [line for line in result.stdout.splitlines() if line.startswith("problem:")]
    assert problems == [
        f'problem: plugin second ({echotoo} from dsh-cli-b 1.0) failed at setup: tool "echo" is already registered '
        'by plugin cli (duplicate tool name; to load both, give one a prefix: [tool_prefixes] second = "..." in '
        "dsh.toml)"
    ]
    assert "per-agent variant" not in result.output
    assert "1 plugin(s) loaded, 1 failed" in result.stdout and "1 problem(s)" in result.stdout


DENY_ALL = """
from dsh_core import Deny, hookimpl

@hookimpl
async def dsh_pre_execute(execution, next):
    return Deny("deny-all says no")
"""


def test_a_plugin_named_by_option_that_fails_stops_every_command_that_runs_calls(
    tools: list[str], dists: Dists, tmp_path: Path
) -> None:
    """A mistyped ``--plugin`` must not leave the policy it names silently off."""
    log = tmp_path / "session.jsonl"
    assert invoke([*tools, "call", "echo", "{}", "--session", str(log)]).exit_code == 0
    batch = write_batch(tmp_path / "calls.jsonl", {"id": "c1", "name": "echo", "arguments": {}})
    module = dists.module("denyall", DENY_ALL)
    typo = ["--plugin", f"{module}_typo"]
    for command in (["call", "echo", "{}"], ["run", str(batch)], ["serve-mcp"], ["simulate", str(log), "--json"]):
        result = invoke([*tools, *typo, *command])
        assert result.exit_code == 2, (command, result.output)
        assert result.stdout == ""
        assert "a plugin named by --plugin failed to load, so nothing was run:" in result.stderr
        assert f"plugin {module}_typo ({module}_typo) failed at import: ModuleNotFoundError" in result.stderr
        assert "warning:" not in result.stderr
    # Commands that run nothing still only warn.
    listed = invoke([*tools, *typo, "list"])
    assert listed.exit_code == 0 and f"warning: plugin {module}_typo failed (import)" in listed.stderr
    assert len(read_session_log(log).events) == 2


def test_a_plugin_named_by_option_whose_name_is_taken_is_refused(dists: Dists, tmp_path: Path) -> None:
    """The installed plugin keeps its name; the one given with ``--plugin`` is not quietly skipped."""
    dists.module("clitools", PLUGIN)
    dists.dist("dsh-cli-taken", {"cli": "{p}clitools"})
    module = dists.module("denyall", DENY_ALL)
    result = invoke(["--group", dists.group, "--plugin", f"cli={module}", "call", "echo", "{}"])
    assert result.exit_code == 2 and result.stdout == ""
    assert f'plugin cli ({module}) failed at register: duplicate plugin name "cli"' in result.stderr
    assert "an installed plugin of the same name takes priority: give yours another NAME=" in result.stderr
    renamed = invoke(["--group", dists.group, "--plugin", f"deny={module}", "call", "echo", "{}"])
    assert renamed.exit_code == 1 and "DENIED (plugin deny)" in renamed.stderr


def test_a_plugin_named_by_option_that_the_configuration_disables_is_refused(
    tools: list[str], dists: Dists, tmp_path: Path
) -> None:
    module = dists.module("denyall", DENY_ALL)
    (tmp_path / "dsh.toml").write_text('disabled_plugins = ["deny"]\n')
    result = invoke([*tools, "--plugin", f"deny={module}", "call", "echo", "{}"])
    assert result.exit_code == 2 and result.stdout == ""
    assert "plugin deny: disabled_plugins names it" in result.stderr


# -- session logs the CLI appends to ---------------------------------------------------------


def test_session_refuses_a_target_that_is_not_a_regular_file(tools: list[str], tmp_path: Path) -> None:
    batch = write_batch(tmp_path / "calls.jsonl", {"id": "c1", "name": "echo", "arguments": {}})
    fifo = tmp_path / "log.fifo"
    if hasattr(os, "mkfifo"):
        os.mkfifo(fifo)
    for command in (["call", "echo", '{"a": 1}'], ["run", str(batch)]):
        for target in (os.devnull, *([str(fifo)] if fifo.exists() else [])):  # a directory is click's own error
            result = invoke([*tools, *command, "--session", target])
            assert result.exit_code == 2, (command, target, result.output)
            assert result.stdout == ""
            assert f"cannot use {target} as the session log: not a regular file" in result.stderr


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
@pytest.mark.parametrize("command", [["replay"], ["explain", "c1"], ["simulate"]])
async def test_reading_a_fifo_as_the_session_log_fails_fast(
    tools: list[str], tmp_path: Path, command: list[str]
) -> None:
    fifo = tmp_path / "log.fifo"
    os.mkfifo(fifo)
    args = [*tools, command[0], str(fifo), *command[1:]]
    # Real time: the open this guards against blocks in the OS, out of reach of a mock clock.
    with trio.fail_after(20):
        result = await trio.to_thread.run_sync(invoke, args, abandon_on_cancel=True)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert (
        f"cannot read session log {fifo}: {fifo}: not a regular file but a FIFO (named pipe); "
        "a session log must be one"
    ) in result.stderr


async def test_a_fifo_or_device_as_ledger_or_grants_file_is_named_so_not_called_damaged(
    tools: list[str], tmp_path: Path
) -> None:
    """Both read "is damaged: ...; a session log must be one": the file is not damaged, nor a session log."""
    fifo = tmp_path / "ledger.fifo"
    os.mkfifo(fifo)
    with trio.fail_after(20):  # real time: a blocking open is out of reach of a mock clock
        shown = await trio.to_thread.run_sync(invoke, ["ledger", "show", str(fifo)], abandon_on_cancel=True)
    assert shown.exit_code == 2
    assert f"{fifo} is a FIFO (named pipe), not a regular file; an effect ledger must be one" in " ".join(
        shown.stderr.split()
    )
    listed = invoke([*tools, "--grants", "/dev/null", "list"])
    assert listed.exit_code == 2
    assert "/dev/null is a character device, not a regular file; a grants file must be one" in " ".join(
        listed.stderr.split()
    )
    assert "damaged" not in shown.stderr + listed.stderr


def _disk_full(*args: object, **kwargs: object) -> None:
    raise OSError(28, "No space left on device")


def test_a_call_the_session_log_cannot_record_is_not_run(
    tools: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dsh_core._session_log import SessionLog

    log = tmp_path / "s.jsonl"
    monkeypatch.setattr(SessionLog, "append_call", _disk_full)
    batch = write_batch(tmp_path / "calls.jsonl", {"id": "c1", "name": "echo", "arguments": {}})
    for command in (["call", "echo", '{"a": 1}'], ["run", str(batch)]):
        result = invoke([*tools, *command, "--session", str(log)])
        assert result.exit_code == 2, (command, result.output)
        assert result.stdout == ""
        assert result.stderr.strip().splitlines()[-1] == (
            f"Error: cannot write session log {log}: OSError: [Errno 28] No space left on device; nothing was run"
        )


def test_a_result_the_session_log_cannot_record_is_still_shown_then_reported(
    tools: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dsh_core import _session_log

    log = tmp_path / "s.jsonl"
    monkeypatch.setattr(_session_log.SessionLog, "append_result", _disk_full)
    result = invoke([*tools, "call", "echo", '{"a": 1}', "--session", str(log)])
    assert result.exit_code == 2, result.output
    assert json.loads(result.stdout) == {"a": 1}
    assert (
        f"Error: cannot write session log {log}: OSError: [Errno 28] No space left on device; "
        "the calls ran but the log is incomplete"
    ) in result.stderr
    monkeypatch.undo()
    monkeypatch.setattr(_session_log.os, "fsync", _disk_full)
    batch = write_batch(tmp_path / "calls.jsonl", {"id": "c1", "name": "echo", "arguments": {"b": 2}})
    ran = invoke([*tools, "run", str(batch), "--session", str(tmp_path / "new.jsonl")])
    assert ran.exit_code == 2, ran.output
    assert json.loads(ran.stdout)["id"] == "c1"
    assert "Traceback" not in ran.stderr
    assert f"cannot write session log {tmp_path / 'new.jsonl'}: OSError: [Errno 28]" in ran.stderr


@pytest.mark.parametrize(
    "content",
    [
        '{"id": "c1", "name": "echo", "arguments": {}}\n',  # a batch file, given as --session by mistake
        "notes: remember the milk",  # one line, no newline
        "line one\nline two\n",
    ],
    ids=["batch", "notes", "two-lines"],
)
def test_session_refuses_a_file_that_is_not_a_session_log(tools: list[str], tmp_path: Path, content: str) -> None:
    other = tmp_path / "other.jsonl"
    other.write_text(content)
    batch = write_batch(tmp_path / "b.jsonl", {"id": "x", "name": "echo"})
    for command in (["call", "echo", "{}"], ["run", str(batch)]):
        result = invoke([*tools, *command, "--session", str(other)])
        assert result.exit_code == 2, result.output
        assert f"cannot use {other} as the session log" in result.stderr
        assert "not a session log line" in result.stderr and "nothing was written to it" in result.stderr
        assert other.read_text() == content  # not one byte cut
        assert result.stdout == ""


@pytest.mark.parametrize(
    "content",
    [gzip.compress(b"important notes\n", mtime=0), b'\xff\xfe{"id":"a"}\n'],
    ids=["gzip", "utf16"],
)
def test_session_refuses_a_binary_file_and_leaves_it_alone(tools: list[str], tmp_path: Path, content: bytes) -> None:
    """Its one line is not text, but no event precedes it: not a torn line, someone else's file."""
    other = tmp_path / "victim.gz"
    other.write_bytes(content)
    result = invoke([*tools, "call", "echo", "{}", "--session", str(other)])
    assert result.exit_code == 2, result.output
    assert "not a session log line" in result.stderr and "nothing was written to it" in result.stderr
    assert other.read_bytes() == content


def test_session_warns_when_it_cuts_a_torn_last_line(tools: list[str], tmp_path: Path) -> None:
    log = tmp_path / "session.jsonl"
    assert invoke([*tools, "call", "echo", "{}", "--session", str(log)]).exit_code == 0
    with log.open("a") as file:
        file.write('{"seq": 3, "type": "tool/ca')  # a write interrupted by a crash
    result = invoke([*tools, "call", "echo", "{}", "--session", str(log)])
    assert result.exit_code == 0, result.output
    assert f"warning: session log {log}: cut off a torn last line: line 3" in result.stderr.replace("\n", "")
    assert [event.seq for event in read_session_log(log).events] == [1, 2, 3, 4]


def test_session_appends_to_an_empty_file(tools: list[str], tmp_path: Path) -> None:
    log = tmp_path / "session.jsonl"
    log.touch()
    result = invoke([*tools, "call", "echo", "{}", "--session", str(log)])
    assert result.exit_code == 0 and result.stderr == ""
    assert len(read_session_log(log).events) == 2


def test_replay_renders_arguments_nested_deeper_than_json_dumps_goes(tools: list[str], tmp_path: Path) -> None:
    log = tmp_path / "session.jsonl"
    depth = 3_000
    deep = '{"x": ' + "[" * depth + "]" * depth + "}"
    assert invoke([*tools, "call", "echo", deep, "--session", str(log)]).exit_code == 0
    result = invoke([*tools, "replay", str(log)])
    assert result.exit_code == 0, result.output
    assert "[[[[" in result.stdout


# -- Ctrl-C --------------------------------------------------------------------------------------

INTERRUPTED_PLUGIN = """
from dsh_core import define_tool, hookimpl

async def _interrupted(args):
    raise KeyboardInterrupt  # what trio raises in a task when Ctrl-C arrives

@hookimpl
def dsh_setup(runtime, config):
    for name in ("stop", "stop_too"):
        runtime.register(define_tool(
            name=name, description="", parameters={}, output={"type": "json"}, execute=_interrupted,
            is_concurrency_safe=lambda args: True))
"""


def test_ctrl_c_during_run_aborts_with_status_130_without_a_traceback(dists: Dists, tmp_path: Path) -> None:
    module = dists.module("interrupted", INTERRUPTED_PLUGIN)
    batch = write_batch(
        tmp_path / "calls.jsonl", {"id": "a", "name": "stop", "arguments": {}}, {"id": "b", "name": "stop_too"}
    )
    for command in (["run", str(batch)], ["call", "stop"]):
        result = invoke(["--no-plugins", "--plugin", f"i={module}", *command])
        assert result.exit_code == 130, (command, result.output)  # 128 + SIGINT, as a shell reports it
        assert result.stderr.strip() == "Aborted!"


def test_ctrl_c_during_a_recorded_run_leaves_no_call_without_an_outcome(dists: Dists, tmp_path: Path) -> None:
    """Every call was logged before the turn ran; one the interrupt kept from starting had no event at all."""
    module = dists.module("interrupted_log", INTERRUPTED_PLUGIN)
    batch = write_batch(
        tmp_path / "calls.jsonl", {"id": "a", "name": "stop", "arguments": {}}, {"id": "b", "name": "stop_too"}
    )
    log = tmp_path / "session.jsonl"
    result = invoke(["--no-plugins", "--plugin", f"i={module}", "run", str(batch), "--session", str(log)])
    assert result.exit_code == 130, result.output
    events = read_session_log(log).events
    outcomes = [(e.data["callId"], e.data["bodyStarted"]) for e in events if e.type == "tool/unwound"]
    assert outcomes == [("a", True), ("b", False)]
    assert {e.data["cause"] for e in events if e.type == "tool/unwound"} == {"KeyboardInterrupt"}
    replayed = invoke(["replay", str(log)])
    assert "cut short (KeyboardInterrupt) before its body started" in replayed.stdout


def test_ctrl_c_exits_the_console_script_with_status_130(
    dists: Dists, capsys: pytest.CaptureFixture[str]
) -> None:
    module = dists.module("interrupted_main", INTERRUPTED_PLUGIN)
    with pytest.raises(SystemExit) as exited:
        main(["--no-plugins", "--plugin", f"i={module}", "call", "stop"])
    assert exited.value.code == 130
    captured = capsys.readouterr()
    assert captured.err.strip() == "Aborted!"
    assert captured.out == ""


# -- check -----------------------------------------------------------------------------------


def test_check_warns_about_a_table_that_configures_no_plugin(tools: list[str], tmp_path: Path) -> None:
    (tmp_path / "dsh.toml").write_text(
        '[plugins.permision]\ndefault = "deny"\n[plugins.cli]\n[plugins.permissions]\ndefault = "allow"\n'
    )
    out = invoke([*tools, "check"]).stdout
    assert '[plugins.permision] configures no installed plugin: it is ignored (did you mean "permissions"?)' in out
    assert "[plugins.cli]" not in out  # loaded through --plugin
    assert "[plugins.permissions]" not in out  # installed (an entry point), though not loaded here
    assert invoke([*tools, "check", "--strict"]).exit_code == 1


def test_a_table_that_configures_no_plugin_stops_every_command_that_runs_calls(
    tools: list[str], tmp_path: Path
) -> None:
    """A misspelt ``[plugins.<name>]`` table must not leave the policy it meant silently off."""
    log = tmp_path / "session.jsonl"
    assert invoke([*tools, "call", "echo", "{}", "--session", str(log)]).exit_code == 0
    batch = write_batch(tmp_path / "calls.jsonl", {"id": "c1", "name": "echo", "arguments": {}})
    typo = tmp_path / "typo.toml"
    typo.write_text('[plugins.permisions]\ndefault = "deny"\n')
    options = ["--config", str(typo), *tools]
    for command in (["call", "echo", "{}"], ["run", str(batch)], ["serve-mcp"], ["simulate", str(log), "--json"]):
        result = invoke([*options, *command])
        assert result.exit_code == 2, (command, result.output)
        assert result.stdout == ""
        assert "a [plugins.<name>] table configures no installed plugin, so nothing was run" in result.stderr
        assert '[plugins.permisions] configures no installed plugin (did you mean "permissions"?)' in result.stderr
    tried = invoke([*tools, "simulate", str(log), "--config", str(typo), "--json"])
    assert tried.exit_code == 2 and tried.stdout == ""
    assert len(read_session_log(log).events) == 2  # nothing more was recorded
    # Commands that run nothing only warn (check does), as before.
    assert invoke([*options, "list"]).exit_code == 0
    checked = invoke([*options, "check"])
    assert checked.exit_code == 0 and "[plugins.permisions] configures no installed plugin" in checked.stdout


def test_a_table_for_an_installed_but_disabled_plugin_does_not_stop_calls(tools: list[str], tmp_path: Path) -> None:
    (tmp_path / "dsh.toml").write_text('disabled_plugins = ["permissions"]\n[plugins.permissions]\ndefault = "deny"\n')
    result = invoke([*tools, "call", "echo", '{"a": 1}'])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"a": 1}


SELF_DUPLICATE_PLUGIN = """
from dsh_core import define_tool, hookimpl

async def _echo(args):
    return args

@hookimpl
def dsh_setup(runtime, config):
    for _ in range(2):
        try:
            runtime.register(define_tool(name="twice", description="", parameters={}, output={"type": "json"},
                                         execute=_echo))
        except ValueError:
            pass
"""


def test_check_says_when_a_plugin_duplicates_its_own_tool(dists: Dists) -> None:
    module = dists.module("selfdup", SELF_DUPLICATE_PLUGIN)
    out = invoke(["--no-plugins", "--plugin", f"dup={module}", "check"]).stdout
    assert (
        'plugin dup: tool "twice" is registered twice by this plugin itself (its own duplicate: the second '
        "registration was refused)"
    ) in out
    assert "tool_prefixes" not in out
    # The MCP client registers every server's tools: two servers listing one name need server prefixes.
    out = invoke(["--no-plugins", "--plugin", f"mcp={module}", "check"]).stdout
    assert (
        'plugin mcp: tool "twice" was listed by an MCP server while another of its servers already registered it'
    ) in out
    assert "give each [[plugins.mcp.servers]] entry its own prefix" in out


# -- configuration files -------------------------------------------------------------------------


def test_config_may_name_a_pyproject_toml(tools: list[str], tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    pyproject = tmp_path / "sub" / "pyproject.toml"
    pyproject.write_text('[project]\nname = "x"\n\n[tool.dsh]\n[tool.dsh.tool_prefixes]\ncli = "c"\n')
    result = invoke(["--config", str(pyproject), *tools, "list"])
    assert result.exit_code == 0, result.output
    assert "c__echo" in result.stdout
    assert "pyproject.toml is read from its [tool.dsh] table" in " ".join(invoke(["--help"]).stdout.split())


def test_toml_nested_too_deeply_is_a_usage_error(tools: list[str], tmp_path: Path) -> None:
    (tmp_path / "dsh.toml").write_text("[plugins.permissions]\nrules = " + "[" * 600 + "]" * 600 + "\n")
    result = invoke([*tools, "list"])
    assert result.exit_code == 2
    assert "invalid TOML: arrays or tables nested too deeply" in result.stderr


def test_a_byte_order_mark_is_a_one_line_usage_error(tools: list[str], tmp_path: Path) -> None:
    (tmp_path / "dsh.toml").write_bytes(b'\xef\xbb\xbfmode = "native"\n')
    result = invoke([*tools, "list"])
    assert result.exit_code == 2
    problem = [line.strip() for line in result.stderr.splitlines() if "dsh.toml" in line]
    assert problem == [
        f"{tmp_path / 'dsh.toml'}: starts with a UTF-8 byte-order mark, which TOML does not allow:"
        " save it as UTF-8 without a BOM"
    ]


def test_a_command_releases_what_its_plugins_hold_when_it_ends(tools: list[str], tmp_path: Path) -> None:
    # The effect ledger locks its file while its runtime lives: a second command in the same
    # process must find it free, as a second process would.
    (tmp_path / "dsh.toml").write_text('[plugins.ledger]\npath = "effects.jsonl"\n')
    options = [*tools, "--plugin", "ledger=dsh_plugins.ledger", "call", "echo", '{"n": 1}']
    for _ in range(2):
        result = invoke(options)
        assert result.exit_code == 0, result.output
    assert (tmp_path / "effects.jsonl").read_text().count("effect/committed") == 2  # two calls, two ids


HOSTILE_NAME = "x $(touch pwned)\x1b]0;owned\x07"
HOSTILE_PLUGIN = f"""
from dsh_core import Ask, define_tool, hookimpl

async def _echo(args):
    return args

class AskAll:
    @hookimpl
    async def dsh_pre_execute(self, execution, next):
        return Ask("needs a yes")

@hookimpl
def dsh_setup(runtime, config):
    runtime.register(define_tool(
        name={HOSTILE_NAME!r}, description="Needs approval.", parameters={{}}, output={{"type": "json"}},
        execute=_echo))
    runtime.plugins.register(AskAll(), name="ask-all")
"""
# As shlex.quote writes it, then escaped for the terminal: pasted back, it is the name again.
_HOSTILE_QUOTED = "'x $(touch pwned)\\x1b]0;owned\\x07'"


def test_the_approval_hint_quotes_and_escapes_a_hostile_tool_name(dists: Dists, tmp_path: Path) -> None:
    """A name an MCP server chose must neither drive the terminal nor run code when the hint is pasted."""
    module = dists.module("hostiletools", HOSTILE_PLUGIN)
    options = ["--no-plugins", "--plugin", f"hostile={module}"]
    called = invoke([*options, "call", HOSTILE_NAME, "{}", "--agent", "my helper"])
    batch = write_batch(tmp_path / "calls.jsonl", {"id": "c1", "name": HOSTILE_NAME, "arguments": {}})
    ran = invoke([*options, "run", str(batch)])
    for result, agent in ((called, "'my helper'"), (ran, "cli")):
        assert "\x1b" not in result.stderr
        assert "\x07" not in result.stderr
        hint = result.stderr.splitlines()[-1]
        assert hint.endswith(f"(dsh-tools grants add FILE {_HOSTILE_QUOTED} --agent {agent})"), hint


LOGGING_PLUGIN = """
import logging
from dsh_core import hookimpl

@hookimpl
def dsh_setup(runtime, config):
    logging.getLogger("dsh_plugins.mcp_client").warning(
        "server %s lists a tool %s", "evil", "x\\x1b]0;owned\\x07\\nerror: forged line")
    try:
        raise ValueError("bad\\x1b[2J")
    except ValueError:
        logging.getLogger("dsh_core").exception("listener failed")
"""


def test_a_warning_logged_with_no_logging_configured_reaches_stderr_escaped(dists: Dists, tmp_path: Path) -> None:
    """Python's last-resort handler would print it raw: an MCP server's tool name could drive the terminal."""
    module = dists.module("loggingplugin", LOGGING_PLUGIN)
    checkout = Path(dsh_core.__file__).parents[1]  # this checkout's, not the one installed
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(checkout), str(dists.root)]))
    done = subprocess.run(
        [sys.executable, "-c", "from dsh_core._cli import main; main()", "--no-plugins", "--plugin",
         f"logs={module}", "list", "--json"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "\x1b" not in done.stderr, done.stderr
    lines = done.stderr.splitlines()
    # The message alone, as the last resort writes it, on one line; the traceback keeps its lines.
    assert lines[0] == "server evil lists a tool x\\x1b]0;owned\\x07\\x0aerror: forged line"
    assert lines[1] == "listener failed"
    assert lines[2] == "Traceback (most recent call last):"
    assert lines[-1] == "ValueError: bad\\x1b[2J"
    assert not any(line.startswith("error:") for line in lines)


def test_check_warns_about_a_table_of_a_disabled_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "dsh.toml").write_text('disabled_plugins = ["audit"]\n[plugins.audit]\npath = "a.jsonl"\n')
    result = invoke(["check"])
    assert result.exit_code == 0, result.output
    assert "warning: [plugins.audit] is configured, but audit is in disabled_plugins: the table has no effect" in (
        result.stdout
    )
    assert invoke(["check", "--strict"]).exit_code == 1


def test_call_with_json_args_ending_early_gets_the_hint_for_a_person(tools: list[str]) -> None:
    result = invoke([*tools, "call", "echo", '{"a":'])
    assert result.exit_code == 2
    assert result.stderr.splitlines()[-1] == (
        "Error: Invalid value for JSON_ARGS: arguments are not valid JSON: Expecting value (character 5 of 5): "
        "the text ends before the JSON does (check its quoting in your shell)"
    )
    assert "output token limit" not in result.stderr  # that advice is for a model's call


def test_an_approval_question_shown_under_a_live_display_is_written_literally() -> None:
    """rich's stderr proxy printed the question's unfinished last line as markup: a model's
    "[black on black]" hid text, ":warning:" became an emoji, and "[/]" failed the question."""
    import io

    from rich.console import Console
    from rich.progress import Progress

    from dsh_core._cli import _show_on_stderr

    real = io.StringIO()
    question = 'Allow echo {"t": "[black on black]rm -rf ~/x[/] :warning: [/]"}? [y/N/a] '
    saved = sys.stderr
    sys.stderr = real
    try:
        with Progress(console=Console(file=io.StringIO(), force_terminal=True), transient=True):
            assert sys.stderr is not real  # the live display put its proxy there
            _show_on_stderr(question)
    finally:
        sys.stderr = saved
    assert real.getvalue() == question


def test_run_with_interactive_approval_shows_no_progress_bar(
    monkeypatch: pytest.MonkeyPatch, tools: list[str], tmp_path: Path
) -> None:
    """A bar redrawn while a question waits would draw over it."""
    from rich.console import Console

    import dsh_core._cli as cli_module

    shown: list[bool] = []
    real_progress = cli_module.Progress

    def recording(*columns: object, **options: object) -> object:
        shown.append(not options["disable"])
        return real_progress(*columns, **options)

    monkeypatch.setattr(cli_module, "Progress", recording)
    monkeypatch.setattr(cli_module, "_stderr", lambda: Console(stderr=True, force_terminal=True))
    batch = write_batch(tmp_path / "calls.jsonl", {"id": "a", "name": "echo", "arguments": {}})
    assert invoke([*tools, "run", str(batch)]).exit_code == 0
    assert invoke([*tools, "--interactive", "run", str(batch)]).exit_code == 0
    assert shown == [True, False]
