"""MCP interop: the client plugin (MCP tools as dsh tools) and serve_registry (dsh tools over MCP).

Servers run in-process (the SDK's in-memory transport) where that is enough,
and as real stdio subprocesses where the behaviour is about processes (start-up,
death, restart) or about what reaches the client as text (``mcp_raw_server.py``,
a server sending what the SDK's servers never would). Subprocess tests use the
real clock with short budgets. Run as a script, this module is the test MCP
server (``python tests/test_mcp.py``).
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import re
import runpy
import signal
import subprocess
import sys
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any

import pytest

pytest.importorskip("mcp")

import anyio
import mcp_types
import trio
import trio.testing
from mcp import Client
from mcp.server import Server
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import BaseModel, Field

from dsh_core import (
    Agent,
    Ask,
    Block,
    ConfigError,
    Deny,
    Exclusive,
    ImageBlock,
    JsonSchemaError,
    Parallel,
    RawSchema,
    Rewrite,
    TextBlock,
    ToolEffects,
    ToolExecution,
    ToolExecutionFailure,
    ToolExecutionSuccess,
    ToolRuntime,
    define_tool,
    hookimpl,
)
from dsh_core._config import load_config
from dsh_core._mcp_server import serve_http, serve_registry
from dsh_core.testing import Recorder, json_tool, make_input, make_runtime
from dsh_plugins import mcp_client, permissions
from dsh_plugins.mcp_client import (
    MCP_ERROR,
    MCP_SERVER_DIED,
    MCP_SERVER_UNAVAILABLE,
    PLUGIN_NAME,
    McpClientPlugin,
    downgrade_schema,
    dsh_setup,
)
from dsh_plugins.timeout import TimeoutPolicy

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent


# -- the test server ---------------------------------------------------------------------------


class Sum(BaseModel):
    total: int


class Point(BaseModel):
    x: int
    y: int


def build_test_server(events: list[str] | None = None) -> MCPServer:
    """An MCP server with one tool per behaviour under test; ``events`` records what its tools saw."""
    seen = events if events is not None else []
    server = MCPServer("dsh-test")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def add(a: int, b: int) -> Sum:
        """Add two integers."""
        return Sum(total=a + b)

    @server.tool(structured_output=False)
    def shout(text: str) -> str:
        """Upper-case the text."""
        return text.upper()

    @server.tool()
    def fail() -> str:
        """Always fails."""
        raise ToolError("the tool broke on purpose")

    @server.tool()
    def pid() -> int:
        """The server's process id."""
        return os.getpid()

    @server.tool()
    async def slow(seconds: float) -> str:
        """Sleep, then answer."""
        try:
            await anyio.sleep(seconds)  # the subprocess server runs on asyncio
        except BaseException:
            seen.append("slow cancelled")
            raise
        return "done"

    @server.tool()
    def constrained(code: Annotated[str, Field(pattern="^[a-z]+$", max_length=5)], n: int | None = None) -> str:
        """Echo a short lower-case code."""
        return code

    @server.tool()
    def nested(point: Point) -> str:
        """Takes a nested model (its schema uses $ref)."""
        return f"{point.x},{point.y}"

    @server.tool()
    async def grow(ctx: Context) -> str:
        """Add the tool "extra", drop "shout", and tell the client."""
        server.add_tool(lambda: "extra!", name="extra", description="Added at run time.")
        server.remove_tool("shout")
        await ctx.session.send_tool_list_changed()
        return "grown"

    return server


ODD_OUTPUT: dict[str, Any] = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def build_odd_server() -> Server[Any]:
    """A low-level MCP server sending what MCPServer never would: odd schemas, results that break them."""

    def tool(name: str, input_schema: dict[str, Any] | None = None, **options: Any) -> mcp_types.Tool:
        return mcp_types.Tool(name=name, input_schema=input_schema or {"type": "object"}, **options)

    tools = [
        tool("no_structured", output_schema=ODD_OUTPUT),
        tool("wrong_structured", output_schema=ODD_OUTPUT),
        tool("image_error"),
        tool("structured_error"),
        tool("vendor", {"type": "object", "properties": {"a": {"type": "string", "x-foo": 1}, "b": True}}),
        tool("never", {"type": "object", "properties": {"a": False}}),
    ]
    results = {
        "no_structured": mcp_types.CallToolResult(content=[mcp_types.TextContent(type="text", text="7")]),
        "wrong_structured": mcp_types.CallToolResult(content=[], structured_content={"n": "seven"}),
        "image_error": mcp_types.CallToolResult(
            content=[mcp_types.ImageContent(type="image", data="AAAA", mime_type="image/png")], is_error=True
        ),
        "structured_error": mcp_types.CallToolResult(
            content=[], structured_content={"reason": "quota", "left": 0}, is_error=True
        ),
    }

    async def list_tools(ctx: Any, params: Any) -> mcp_types.ListToolsResult:
        return mcp_types.ListToolsResult(tools=tools)

    async def call_tool(ctx: Any, params: mcp_types.CallToolRequestParams) -> mcp_types.CallToolResult:
        default = mcp_types.CallToolResult(content=[mcp_types.TextContent(type="text", text="ok")])
        return results.get(params.name, default)

    return Server("odd", on_list_tools=list_tools, on_call_tool=call_tool)


# -- helpers -------------------------------------------------------------------------------------


async def eventually(predicate: Callable[[], bool], timeout: float = 5.0) -> None:
    with trio.fail_after(timeout):
        while not predicate():
            await trio.sleep(0.01)


def mem_config(**options: Any) -> dict[str, Any]:
    return {"servers": [{"name": "mem", "prefix": "mem"}], **options}


def stdio_server_entry(**options: Any) -> dict[str, Any]:
    return {"name": "proc", "command": sys.executable, "args": [str(HERE)], "prefix": "proc", **options}


def raw_server_entry(**options: Any) -> dict[str, Any]:
    raw = str(HERE.parent / "mcp_raw_server.py")
    return {"name": "raw", "command": sys.executable, "args": [raw], "prefix": "raw", **options}


def text_value(*texts: str) -> dict[str, Any]:
    """The value of an MCP tool without an output schema whose result is these text blocks."""
    return {"content": tuple({"type": "text", "text": text} for text in texts)}


class DenyDeletes:
    @hookimpl
    async def dsh_pre_execute(self, execution: Any, next: Callable[[], Awaitable[Any]]) -> Any:
        if "delete" in execution.name:
            return Deny("nothing is deleted here")
        return await next()


class AskFirst:
    @hookimpl
    async def dsh_pre_execute(self, execution: Any, next: Callable[[], Awaitable[Any]]) -> Any:
        if execution.name.startswith("guarded"):
            return Ask("guarded needs a yes")
        return await next()


# -- schema downgrade ------------------------------------------------------------------------------


def test_narrowing_keywords_are_stripped_and_kept_as_text() -> None:
    schema = {
        "type": "object",
        "properties": {"code": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 5, "description": "A code."}},
        "required": ["code"],
    }
    result = downgrade_schema(schema, root="parameters", object_root=True)
    code = result.schema["properties"]["code"]
    assert "pattern" not in code and "maxLength" not in code
    assert code["description"] == 'A code. (checked by the server: pattern "^[a-z]+$"; maxLength 5)'
    assert result.stripped == ("parameters.properties.code.pattern", "parameters.properties.code.maxLength")


def test_non_object_parameters_are_refused_as_tool_arguments() -> None:
    with pytest.raises(JsonSchemaError) as caught:
        downgrade_schema({"type": "array", "items": {"type": "string"}}, root="parameters", object_root=True)
    assert caught.value.violations == ('parameters.type must be "object" (tool arguments are a JSON object)',)


def test_disjoint_any_of_is_rewritten_exactly_to_one_of() -> None:
    schema = {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None, "title": "N"}
    result = downgrade_schema(schema)
    assert result.schema == {"oneOf": [{"type": "integer"}, {"type": "null"}], "default": None, "title": "N"}
    assert result.stripped == ()
    assert result.rewritten == ("schema.anyOf",)


def test_a_type_list_of_disjoint_types_becomes_one_of() -> None:
    assert downgrade_schema({"type": ["string", "null"]}).schema == {"oneOf": [{"type": "string"}, {"type": "null"}]}


@pytest.mark.parametrize(
    ("schema", "fragment"),
    [
        ({"$ref": "#/$defs/Point", "$defs": {"Point": {"type": "object"}}}, "schema.$ref"),
        ({"anyOf": [{"type": "integer"}, {"type": "number"}]}, "schema.anyOf"),
        ({"anyOf": [{"type": "string", "maxLength": 3}, {"type": "string", "pattern": "x"}]}, "schema.anyOf"),
        ({"allOf": [{"type": "string"}]}, "schema.allOf"),
        ({"type": "object", "patternProperties": {"^x": {"type": "string"}}}, "schema.patternProperties"),
        ({"type": "array", "prefixItems": [{"type": "string"}]}, "schema.prefixItems"),
        ({"type": "string", "nullable": "yes"}, "schema.nullable"),
        ({"type": ["integer", "number"]}, "schema.type"),
    ],
)
def test_shape_keywords_are_refused(schema: dict[str, Any], fragment: str) -> None:
    with pytest.raises(JsonSchemaError) as caught:
        downgrade_schema(schema)
    assert any(fragment in violation for violation in caught.value.violations), caught.value.violations


@pytest.mark.parametrize(
    ("schema", "rewritten", "path"),
    [
        ({"enum": ["x", "y"]}, {"type": "string", "enum": ["x", "y"]}, "schema.enum"),
        ({"const": True, "title": "T"}, {"type": "boolean", "const": True, "title": "T"}, "schema.const"),
        ({"enum": [1, 2]}, {"type": "integer", "enum": [1, 2]}, "schema.enum"),
        ({"enum": [1, 2.5]}, {"type": "number", "enum": [1, 2.5]}, "schema.enum"),
        (
            {"enum": ["x", 1, None, "y"], "description": "D"},
            {
                "oneOf": [
                    {"type": "string", "enum": ["x", "y"]},
                    {"type": "integer", "enum": [1]},
                    {"type": "null", "enum": [None]},
                ],
                "description": "D",
            },
            "schema.enum",
        ),
        (
            {"type": ["string", "null"], "enum": ["x", None]},
            {"oneOf": [{"type": "string", "enum": ["x"]}, {"type": "null", "enum": [None]}]},
            "schema.type",
        ),
        # A type no member has accepts nothing more: the list narrows to the other type.
        ({"type": ["string", "null"], "enum": ["x", "y"]}, {"type": "string", "enum": ["x", "y"]}, "schema.type"),
        ({"type": ["integer", "null"], "const": 3}, {"type": "integer", "const": 3}, "schema.type"),
        (
            {"type": ["object", "null"], "properties": {"a": {"type": "string"}}, "additionalProperties": False},
            {
                "oneOf": [
                    {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": False},
                    {"type": "null"},
                ]
            },
            "schema.type",
        ),
        (
            {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a", "b"]},
            {"type": "object", "properties": {"a": {"type": "string"}, "b": {}}, "required": ["a", "b"]},
            "schema.required",
        ),
        (
            {"type": "object", "required": ["a"]},
            {"type": "object", "required": ["a"], "properties": {"a": {}}},
            "schema.required",
        ),
        ({"type": "string", "example": "x"}, {"type": "string", "examples": ["x"]}, "schema.example"),
    ],
)
def test_valid_schemas_outside_the_subset_are_rewritten_exactly(
    schema: dict[str, Any], rewritten: dict[str, Any], path: str
) -> None:
    result = downgrade_schema(schema)
    assert result.schema == rewritten
    assert result.rewritten == (path,)
    assert (result.stripped, result.dropped) == ((), ())


@pytest.mark.parametrize(
    ("schema", "violation"),
    [
        (
            {"type": ["string", "null"], "enum": [1, 2]},
            "schema.type: no value of the listed types is in enum or const (no value is valid)",
        ),
        # "b" is required but no property but "a" is allowed: no value is valid, and {} would accept one.
        (
            {"type": "object", "properties": {"a": {}}, "required": ["b"], "additionalProperties": False},
            'schema.required names "b" which is not in properties',
        ),
        ({"type": ["string", "null"], "items": {"type": "string"}}, "schema.type: a list of types"),
    ],
)
def test_rewrites_that_would_change_the_accepted_values_are_refused(schema: dict[str, Any], violation: str) -> None:
    with pytest.raises(JsonSchemaError) as caught:
        downgrade_schema(schema)
    assert any(v.startswith(violation) for v in caught.value.violations), caught.value.violations


@pytest.mark.parametrize(
    ("schema", "rewritten"),
    [
        ({"type": "string", "nullable": True}, {"oneOf": [{"type": "string"}, {"type": "null"}]}),
        (
            {"type": "object", "properties": {"a": {"type": "integer"}}, "nullable": True, "title": "T"},
            {"oneOf": [{"type": "object", "properties": {"a": {"type": "integer"}}}, {"type": "null"}], "title": "T"},
        ),
        (
            {"type": ["string", "integer"], "nullable": True},
            {"oneOf": [{"type": "string"}, {"type": "integer"}, {"type": "null"}]},
        ),
        # enum still decides: a null it leaves out stays refused, as OpenAPI 3.0.3 says.
        ({"type": "string", "enum": ["x", "y"], "nullable": True}, {"type": "string", "enum": ["x", "y"]}),
        (
            {"type": "string", "enum": ["x", None], "nullable": True},
            {"oneOf": [{"type": "string", "enum": ["x"]}, {"type": "null", "enum": [None]}]},
        ),
        # Without a type, and when false, it constrains nothing.
        ({"enum": ["x"], "nullable": True}, {"type": "string", "enum": ["x"]}),
        ({"type": "string", "nullable": False}, {"type": "string"}),
        ({"type": "null", "nullable": True}, {"type": "null"}),
    ],
)
def test_openapi_nullable_adds_null_to_the_declared_type(schema: dict[str, Any], rewritten: dict[str, Any]) -> None:
    result = downgrade_schema(schema)
    assert result.schema == rewritten
    assert "schema.nullable" in result.rewritten
    assert result.stripped == () and result.dropped == ()


async def test_a_nullable_parameter_accepts_null_through_the_registry() -> None:
    schema = {"type": "object", "properties": {"note": {"type": "string", "nullable": True}}, "required": ["note"]}
    parameters = downgrade_schema(schema, root="parameters", object_root=True).schema

    async def echo_note(args: Any) -> Any:
        return args["note"]

    runtime = make_runtime(json_tool("t", echo_note, parameters=RawSchema(parameters)))
    ok = await runtime.execute(make_input("t", {"note": None}))
    assert isinstance(ok, ToolExecutionSuccess) and ok.value is None
    bad = await runtime.execute(make_input("t", {"note": 3}))
    assert isinstance(bad, ToolExecutionFailure) and bad.error.info.code == "INVALID_ARGS"


def test_an_example_beside_examples_is_dropped_with_a_warning() -> None:
    result = downgrade_schema({"type": "string", "example": "x", "examples": ["y"]})
    assert result.schema == {"type": "string", "examples": ["y"]}
    assert result.dropped == ("schema.example",)


def test_parameters_must_stay_object_rooted() -> None:
    with pytest.raises(JsonSchemaError):
        downgrade_schema({"type": "string"}, object_root=True)


def test_vendor_keywords_are_dropped_and_reported() -> None:
    schema = {"type": "object", "x-origin": "gen", "properties": {"a": {"type": "string", "x-foo": 1}}}
    result = downgrade_schema(schema, root="parameters", object_root=True)
    assert result.schema == {"type": "object", "properties": {"a": {"type": "string"}}}
    assert result.dropped == ("parameters.x-origin", "parameters.properties.a.x-foo")
    assert result.stripped == ()


def test_a_true_subschema_is_rewritten_to_accept_anything() -> None:
    schema = {"type": "object", "properties": {"a": True, "b": {"type": "array", "items": True}}}
    result = downgrade_schema(schema, root="parameters", object_root=True)
    assert result.schema == {"type": "object", "properties": {"a": {}, "b": {"type": "array", "items": {}}}}
    assert result.rewritten == ("parameters.properties.a", "parameters.properties.b.items")


def test_a_false_subschema_is_refused() -> None:
    with pytest.raises(JsonSchemaError) as caught:
        downgrade_schema({"type": "object", "properties": {"a": False}}, root="parameters", object_root=True)
    (violation,) = caught.value.violations
    assert violation == "parameters.properties.a: false (no value is valid) cannot be downgraded safely"


def test_refusals_of_the_subset_check_name_the_same_root_as_downgrades() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "string", "discriminator": "kind"}}}
    with pytest.raises(JsonSchemaError) as caught:
        downgrade_schema(schema, root="parameters", object_root=True)
    assert [violation.split(" ")[0] for violation in caught.value.violations] == [
        "parameters.properties.a.discriminator"
    ]


# -- settings ------------------------------------------------------------------------------------


@pytest.mark.parametrize("url", ["http://example.com/mcp", "http://10.0.0.1:8000/mcp", "ftp://127.0.0.1/x"])
def test_non_loopback_urls_are_refused(url: str) -> None:
    with pytest.raises(ConfigError) as caught:
        McpClientPlugin(ToolRuntime(), _settings({"servers": [{"name": "x", "url": url}]}))
    assert "[plugins.mcp].servers[0]" in str(caught.value)


@pytest.mark.parametrize("url", ["http://127.0.0.1:8000/mcp", "http://localhost/mcp", "http://[::1]:9/mcp"])
def test_loopback_urls_are_accepted(url: str) -> None:
    McpClientPlugin(ToolRuntime(), _settings({"servers": [{"name": "x", "url": url}]}))


def test_a_server_needs_exactly_one_of_command_and_url() -> None:
    with pytest.raises(ValueError, match="exactly one of command"):
        McpClientPlugin(ToolRuntime(), _settings({"servers": [{"name": "x", "command": "a", "url": "http://[::1]/"}]}))


def _settings(table: dict[str, Any]) -> Any:
    from dsh_plugins.mcp_client import _structure

    return _structure(table)


# -- the client plugin, in memory -------------------------------------------------------------------


async def test_server_tools_are_registered_with_their_prefix_and_called() -> None:
    runtime = ToolRuntime()
    async with McpClientPlugin.connect(runtime, mem_config(), in_process={"mem": build_test_server()}):
        assert {"mem__add", "mem__shout", "mem__fail", "mem__grow"} <= set(runtime.names())
        added = await runtime.execute(make_input("mem__add", {"a": 2, "b": 3}))
        assert not added.is_error
        assert added.value == {"total": 5}
        assert [block.text for block in added.content] == ['{"total": 5}']

        shouted = await runtime.execute(make_input("mem__shout", {"text": "hi"}))
        assert shouted.value == {"content": ({"type": "text", "text": "HI"},)}
        assert [block.text for block in shouted.content] == ["HI"]

        failed = await runtime.execute(make_input("mem__fail"))
        assert failed.is_error and failed.code == "TOOL_ERROR"
        assert "the tool broke on purpose" in failed.error.message
    assert "mem__add" not in runtime.names()  # connect() disposes what it registered


async def test_invalid_arguments_never_reach_the_server() -> None:
    events: list[str] = []
    runtime = ToolRuntime()
    async with McpClientPlugin.connect(runtime, mem_config(), in_process={"mem": build_test_server(events)}):
        result = await runtime.execute(make_input("mem__add", {"a": "two"}))
    assert result.code == "INVALID_ARGS"


def build_taking_server(received: list[Any]) -> Server[Any]:
    """A low-level MCP server with one tool, ``take``, that accepts any object and records it."""

    async def list_tools(ctx: Any, params: Any) -> mcp_types.ListToolsResult:
        return mcp_types.ListToolsResult(tools=[mcp_types.Tool(name="take", input_schema={"type": "object"})])

    async def call_tool(ctx: Any, params: mcp_types.CallToolRequestParams) -> mcp_types.CallToolResult:
        received.append(params.arguments)
        return mcp_types.CallToolResult(content=[mcp_types.TextContent(type="text", text="taken")])

    return Server("taking", on_list_tools=list_tools, on_call_tool=call_tool)


# An SDK server parses messages nested at most 200 levels deep; arguments sit two levels in
# ({"params": {"arguments": ...}}) and count one level themselves.
DEEPEST_ARGUMENT_LIST = 200 - 2 - 1


async def test_arguments_too_deep_for_mcp_are_refused_before_they_are_sent() -> None:
    received: list[Any] = []
    runtime = ToolRuntime()
    async with McpClientPlugin.connect(runtime, mem_config(), in_process={"mem": build_taking_server(received)}):
        deepest = await runtime.execute(make_input("mem__take", {"x": nested_list(DEEPEST_ARGUMENT_LIST)}))
        too_deep = [
            await runtime.execute(make_input("mem__take", {"x": nested_list(depth)}))
            for depth in (DEEPEST_ARGUMENT_LIST + 1, 100_000)
        ]
        after = await runtime.execute(make_input("mem__take", {"x": 1}))
    assert not deepest.is_error and not after.is_error
    for refused in too_deep:
        assert refused.code == "INVALID_ARGS"
        assert refused.error.message == (
            "invalid arguments: they nest more than 198 levels deep, deeper than an MCP message can carry; "
            'the call was not sent to MCP server "mem"'
        )
    assert received == [{"x": nested_list(DEEPEST_ARGUMENT_LIST)}, {"x": 1}]


@pytest.mark.parametrize(
    "arguments", [{"s": "a\ud800b"}, {"\udfff": 1}, {"x": [["\udc00"]]}], ids=["value", "key", "nested"]
)
async def test_arguments_with_a_lone_surrogate_are_refused_before_they_are_sent(arguments: dict[str, Any]) -> None:
    # Legal in JSON text as an escape, but the SDK encodes messages as UTF-8, which has no
    # form for it: over stdio the session broke and the server was blamed.
    received: list[Any] = []
    runtime = ToolRuntime()
    async with McpClientPlugin.connect(runtime, mem_config(), in_process={"mem": build_taking_server(received)}):
        refused = await runtime.execute(make_input("mem__take", arguments))
        paired = await runtime.execute(make_input("mem__take", {"s": "\U0001f600"}))
    assert refused.code == "INVALID_ARGS"
    assert refused.error.message == (
        "invalid arguments: a string in them holds a lone surrogate (\\ud800-\\udfff outside a pair), "
        'which an MCP message cannot carry; the call was not sent to MCP server "mem"'
    )
    assert not paired.is_error
    assert received == [{"s": "\U0001f600"}]


async def test_a_name_two_servers_list_is_reported_with_both_servers() -> None:
    runtime = ToolRuntime()
    config = {"servers": [{"name": "a"}, {"name": "c"}]}  # no prefixes: the same names twice
    in_process = {"a": build_test_server(), "c": build_test_server()}
    async with McpClientPlugin.connect(runtime, config, in_process=in_process) as plugin:
        messages = [str(note) for note in plugin.diagnostics() if note.tool == "add"]
    # The servers connect side by side: either may have listed "add" first.
    expected = [
        f'MCP server "{second}", tool "add": server "{first}" lists this name too and registered it first'
        for first, second in (("a", "c"), ("c", "a"))
    ]
    assert any(message.startswith(tuple(expected)) for message in messages), messages


async def test_read_only_hint_makes_a_tool_concurrency_safe() -> None:
    runtime = ToolRuntime()
    async with McpClientPlugin.connect(runtime, mem_config(), in_process={"mem": build_test_server()}):
        assert isinstance(runtime.execution_mode(make_input("mem__add", {"a": 1, "b": 2})), Parallel)
        assert isinstance(runtime.execution_mode(make_input("mem__shout", {"text": "x"})), Exclusive)


async def test_annotations_become_the_tools_effects() -> None:
    runtime = ToolRuntime()
    async with McpClientPlugin.connect(runtime, mem_config(), in_process={"mem": build_test_server()}):
        add, shout = runtime.get("mem__add"), runtime.get("mem__shout")
        # readOnlyHint alone: openWorldHint takes the specification's default (true)
        assert add is not None and add.effects == ToolEffects(read_only=True, open_world=True)
        assert shout is not None and shout.effects is None  # declared nothing


def test_contradictory_annotations_are_taken_as_the_more_dangerous() -> None:
    from dsh_plugins.mcp_client import _effects_of

    effects = _effects_of(ToolAnnotations(read_only_hint=True, destructive_hint=True, idempotent_hint=False))
    assert effects == ToolEffects(destructive=True, open_world=True)


@pytest.mark.parametrize(
    ("annotations", "effects"),
    [
        (None, None),
        (ToolAnnotations(title="Delete everything"), None),  # a title declares no effect
        (ToolAnnotations(idempotent_hint=True), ToolEffects(destructive=True, idempotent=True, open_world=True)),
        (ToolAnnotations(read_only_hint=False), ToolEffects(destructive=True, open_world=True)),
        (ToolAnnotations(destructive_hint=False, open_world_hint=False), ToolEffects()),
        (ToolAnnotations(read_only_hint=True, open_world_hint=False), ToolEffects(read_only=True)),
    ],
)
def test_hints_left_out_take_the_specifications_defaults(annotations: Any, effects: ToolEffects | None) -> None:
    from dsh_plugins.mcp_client import _effects_of

    assert _effects_of(annotations) == effects


async def test_serve_registry_publishes_declared_effects_as_annotations() -> None:
    async def drop(args: Any) -> str:
        return "dropped"

    runtime, _ = serving_runtime()
    runtime.register(
        json_tool("drop", drop, output={"type": "string"}, effects=ToolEffects(destructive=True, open_world=True))
    )
    async with Client(serve_registry(runtime), mode="legacy") as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    annotations = tools["drop"].annotations
    assert annotations is not None
    assert (annotations.read_only_hint, annotations.destructive_hint) == (False, True)
    assert (annotations.idempotent_hint, annotations.open_world_hint) == (False, True)
    assert tools["add"].annotations is None


async def test_downgraded_tool_is_registered_with_a_warning_and_the_server_still_validates() -> None:
    runtime = ToolRuntime()
    server = build_test_server()
    async with McpClientPlugin.connect(runtime, mem_config(), in_process={"mem": server}) as plugin:
        definition = runtime.get("mem__constrained")
        assert definition is not None
        code = definition.parameters["properties"]["code"]
        assert "pattern" not in code and "maxLength" not in code
        assert "checked by the server" in code["description"]
        assert "oneOf" in definition.parameters["properties"]["n"]
        warnings = [d for d in plugin.diagnostics() if d.tool == "mem__constrained"]
        assert [d.level for d in warnings] == ["warning"]
        assert "parameters.properties.code.pattern" in warnings[0].message

        accepted = await runtime.execute(make_input("mem__constrained", {"code": "abc"}))
        assert accepted.value == {"result": "abc"}
        # Our validator let it through (pattern stripped); the server's own check refuses it.
        refused = await runtime.execute(make_input("mem__constrained", {"code": "ABC"}))
        assert refused.is_error and refused.code == "TOOL_ERROR"
        assert "pattern" in refused.error.message


async def test_a_tool_whose_schema_cannot_be_downgraded_is_refused_and_reported() -> None:
    runtime = ToolRuntime()
    async with McpClientPlugin.connect(runtime, mem_config(), in_process={"mem": build_test_server()}) as plugin:
        assert runtime.get("mem__nested") is None
        problems = [d for d in plugin.diagnostics() if d.tool == "mem__nested"]
        assert [d.level for d in problems] == ["problem"]
        assert "$ref" in problems[0].message
        assert str(problems[0]).startswith('MCP server "mem", tool "mem__nested": not registered')


async def test_odd_schemas_are_downgraded_with_a_warning_or_refused() -> None:
    runtime = ToolRuntime()
    config = {"servers": [{"name": "odd"}]}
    async with McpClientPlugin.connect(runtime, config, in_process={"odd": build_odd_server()}) as plugin:
        vendor = runtime.get("vendor")
        assert vendor is not None
        assert vendor.parameters["properties"] == {"a": {"type": "string"}, "b": {}}
        assert (await runtime.execute(make_input("vendor", {"a": "x", "b": [1]}))).value == text_value("ok")
        assert runtime.get("never") is None
        notes = {note.tool: str(note) for note in plugin.diagnostics()}
    assert notes["vendor"] == (
        'MCP server "odd", tool "vendor": input schema downgraded: dropped the keywords '
        "parameters.properties.a.x-foo (annotations, not constraints)"
    )
    assert notes["never"] == (
        'MCP server "odd", tool "never": not registered: its input schema '
        "parameters.properties.a: false (no value is valid) cannot be downgraded safely"
    )


def test_a_remote_schemas_diagnosis_is_listed_within_bounds() -> None:
    from dsh_plugins import mcp_client

    hostile = {"type": "object", "properties": {f"p{index}" + "x" * 2000: False for index in range(500)}}
    with pytest.raises(JsonSchemaError) as caught:
        downgrade_schema(hostile, root="parameters", object_root=True)
    listed = mcp_client._schema_problems(caught.value)
    assert listed.endswith("; … and 480 more") and len(listed) < 20 * 300 + 100
    assert listed.split("; ")[0].startswith("parameters.properties.p0xxx") and "…" in listed.split("; ")[0]
    stripped = downgrade_schema({"type": "string", **{f"x-{index}": 1 for index in range(50)}})
    note = mcp_client._downgrade_note(stripped, "the server")
    assert note.endswith(", … and 30 more (annotations, not constraints)")
    few = downgrade_schema({"type": "string", "x-a": 1})
    assert mcp_client._downgrade_note(few, "the server") == "dropped the keywords schema.x-a (annotations, not constraints)"


async def test_a_result_the_sdk_refuses_is_an_mcp_error_in_one_line() -> None:
    runtime = ToolRuntime()
    config = {"servers": [{"name": "odd"}]}
    async with McpClientPlugin.connect(runtime, config, in_process={"odd": build_odd_server()}):
        missing = await runtime.execute(make_input("no_structured"))
        wrong = await runtime.execute(make_input("wrong_structured"))
    assert (missing.code, wrong.code) == (MCP_ERROR, MCP_ERROR)
    assert missing.error.message == (
        'MCP server "odd" sent an invalid result for "no_structured": '
        "Tool no_structured has an output schema but did not return structured content"
    )
    assert wrong.error.message == (
        'MCP server "odd" sent an invalid result for "wrong_structured": its structured content does not '
        "match the tool's output schema ('seven' is not of type 'integer' at $.n)"
    )


async def test_an_error_result_without_text_says_what_it_carries() -> None:
    runtime = ToolRuntime()
    config = {"servers": [{"name": "odd"}]}
    async with McpClientPlugin.connect(runtime, config, in_process={"odd": build_odd_server()}):
        image = await runtime.execute(make_input("image_error"))
        structured = await runtime.execute(make_input("structured_error"))
    assert (image.code, structured.code) == ("TOOL_ERROR", "TOOL_ERROR")
    assert image.error.message == "the MCP tool reported an error (with image content only)"
    assert structured.error.message == 'the MCP tool reported an error: {"reason": "quota", "left": 0}'


async def test_list_changed_resyncs_registrations_and_fires_tools_change() -> None:
    recorder = Recorder()
    runtime = make_runtime(plugins=[recorder])
    async with McpClientPlugin.connect(runtime, mem_config(), in_process={"mem": build_test_server()}):
        before = recorder.changes
        assert "mem__extra" not in runtime.names()
        result = await runtime.execute(make_input("mem__grow"))
        assert not result.is_error
        await eventually(lambda: "mem__extra" in runtime.names())
        await eventually(lambda: "mem__shout" not in runtime.names())
        assert recorder.changes >= before + 2  # one registration, one disposal
        extra = await runtime.execute(make_input("mem__extra"))
        assert extra.content[0].text == "extra!"


def build_restless_server(listings: list[int], version: list[int]) -> Server[Any]:
    """Lists one tool, ``v<version>``; answers each listing with another list_changed while ``version[1]``;
    ``poke`` bumps the version and announces it."""

    async def list_tools(ctx: Any, params: Any) -> mcp_types.ListToolsResult:
        listings.append(version[0])
        if version[1]:
            await ctx.session.send_tool_list_changed()
        tools = [mcp_types.Tool(name=name, input_schema={"type": "object"}) for name in (f"v{version[0]}", "poke")]
        return mcp_types.ListToolsResult(tools=tools)

    async def call_tool(ctx: Any, params: mcp_types.CallToolRequestParams) -> mcp_types.CallToolResult:
        if params.name == "poke":
            version[0] += 1
            await ctx.session.send_tool_list_changed()
        return mcp_types.CallToolResult(content=[mcp_types.TextContent(type="text", text=params.name)])

    return Server("restless", on_list_tools=list_tools, on_call_tool=call_tool)


async def test_relisting_is_paced_when_every_listing_announces_another_change(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # Each listing's list_changed triggered the next listing at once: the host relisted back to back, forever.
    # Real time (not a MockClock): unpaced, the relisting never lets a mock clock jump.
    monkeypatch.setattr(mcp_client, "_RELIST_INTERVAL_S", 0.05)
    monkeypatch.setattr(mcp_client, "_RELIST_MAX_INTERVAL_S", 0.2)
    listings: list[int] = []
    runtime = ToolRuntime()
    server = build_restless_server(listings, [1, True])
    with trio.fail_after(20):
        async with McpClientPlugin.connect(runtime, mem_config(), in_process={"mem": server}):
            await trio.sleep(1.0)
            result = await runtime.execute(make_input("mem__v1"))
    assert result.value == text_value("v1")
    # 0.05 s, then 0.1, 0.2, 0.2, ... apart: about 7 in a second (unpaced: thousands).
    assert 3 <= len(listings) <= 12, len(listings)
    assert 'MCP server "mem" keeps announcing changes to its tool list that leave it unchanged' in caplog.text


async def test_changes_announced_while_relisting_is_paced_are_listed_at_the_end(
    autojump_clock: trio.testing.MockClock,
) -> None:
    listings: list[int] = []
    runtime = ToolRuntime()
    server = build_restless_server(listings, [1, False])
    async with McpClientPlugin.connect(runtime, mem_config(), in_process={"mem": server}):
        for _ in range(3):
            await runtime.execute(make_input("mem__poke"))
        await trio.sleep(10)
        assert "mem__v4" in runtime.names()
        assert not {"mem__v1", "mem__v2", "mem__v3"} & set(runtime.names())
        assert len(listings) <= 3  # the listing at entry, then at most one a second


def build_relisting_server(listings: list[str], answer_slow: trio.Event) -> Server[Any]:
    """A server that refuses its second listing with a JSON-RPC error; ``poke`` announces a changed list."""
    from mcp import MCPError

    tools = [mcp_types.Tool(name=name, input_schema={"type": "object"}) for name in ("slow", "poke")]

    async def list_tools(ctx: Any, params: Any) -> mcp_types.ListToolsResult:
        listings.append("listed")
        if len(listings) == 2:
            raise MCPError(-32603, "listing temporarily unavailable")
        return mcp_types.ListToolsResult(tools=tools)

    async def call_tool(ctx: Any, params: mcp_types.CallToolRequestParams) -> mcp_types.CallToolResult:
        if params.name == "poke":
            await ctx.session.send_tool_list_changed()
        else:
            await answer_slow.wait()
        return mcp_types.CallToolResult(content=[mcp_types.TextContent(type="text", text=params.name)])

    return Server("relisting", on_list_tools=list_tools, on_call_tool=call_tool)


async def test_a_relisting_the_server_answers_with_an_error_keeps_the_session(
    caplog: pytest.LogCaptureFixture, autojump_clock: trio.testing.MockClock
) -> None:
    listings: list[str] = []
    answer_slow = trio.Event()
    runtime = ToolRuntime()
    server = build_relisting_server(listings, answer_slow)
    async with McpClientPlugin.connect(runtime, mem_config(), in_process={"mem": server}):
        async with trio.open_nursery() as nursery:
            results: list[Any] = []

            async def call_slow() -> None:
                results.append(await runtime.execute(make_input("mem__slow")))

            nursery.start_soon(call_slow)
            await trio.sleep(0.1)
            poked = await runtime.execute(make_input("mem__poke"))
            await eventually(lambda: "re-listing its tools failed" in caplog.text)
            answer_slow.set()
        assert poked.value == text_value("poke")
        # The call in flight was answered over the same session, not reported MCP_SERVER_DIED.
        assert results[0].value == text_value("slow")
        assert {"mem__slow", "mem__poke"} <= set(runtime.names())  # the registrations stay
        assert "session ended" not in caplog.text
        [warning] = [r.getMessage() for r in caplog.records if "re-listing" in r.getMessage()]
        assert warning == (
            'MCP server "mem": re-listing its tools failed, the tools listed before stay registered: '
            "MCPError: listing temporarily unavailable"
        )
        # The next change is listed over the same session again (a reconnect would list once more).
        await runtime.execute(make_input("mem__poke"))
        await eventually(lambda: len(listings) == 3)
        await trio.sleep(0.1)
        assert len(listings) == 3


def build_paged_server(pages: int) -> Server[Any]:
    """A server listing one tool ``t<n>`` per page, ``pages`` pages."""

    async def list_tools(ctx: Any, params: Any) -> mcp_types.ListToolsResult:
        page = int(params.cursor) if params is not None and params.cursor else 0
        after = str(page + 1) if page + 1 < pages else None
        tools = [mcp_types.Tool(name=f"t{page}", input_schema={"type": "object"})]
        return mcp_types.ListToolsResult(tools=tools, next_cursor=after)

    async def call_tool(ctx: Any, params: mcp_types.CallToolRequestParams) -> mcp_types.CallToolResult:
        return mcp_types.CallToolResult(content=[])

    return Server("paged", on_list_tools=list_tools, on_call_tool=call_tool)


async def test_a_listing_cut_at_the_page_cap_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    runtime = ToolRuntime()
    in_process = {"mem": build_paged_server(102)}
    async with McpClientPlugin.connect(runtime, {"servers": [{"name": "mem"}]}, in_process=in_process) as plugin:
        assert sorted(runtime.names()) == sorted(f"t{page}" for page in range(100))
        [warning] = plugin.diagnostics()
    message = (
        "its tool list goes on for more than 100 pages; only the 100 tools on the first 100 pages are registered"
    )
    assert (warning.level, warning.tool, warning.message) == ("warning", None, message)
    assert f'MCP server "mem": {message}' in caplog.text


async def test_a_listing_of_exactly_the_page_cap_is_complete() -> None:
    runtime = ToolRuntime()
    in_process = {"mem": build_paged_server(100)}
    async with McpClientPlugin.connect(runtime, {"servers": [{"name": "mem"}]}, in_process=in_process) as plugin:
        assert len(runtime.names()) == 100
        assert plugin.diagnostics() == []


async def test_a_name_a_server_lists_twice_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    first = mcp_types.Tool(name="twice", input_schema={"type": "object"})
    last = mcp_types.Tool(name="twice", input_schema={"type": "object", "properties": {"z": {"type": "integer"}}})

    async def list_tools(ctx: Any, params: Any) -> mcp_types.ListToolsResult:
        return mcp_types.ListToolsResult(tools=[first, last])

    async def call_tool(ctx: Any, params: mcp_types.CallToolRequestParams) -> mcp_types.CallToolResult:
        return mcp_types.CallToolResult(content=[])

    runtime = ToolRuntime()
    in_process = {"mem": Server("twice", on_list_tools=list_tools, on_call_tool=call_tool)}
    async with McpClientPlugin.connect(runtime, {"servers": [{"name": "mem"}]}, in_process=in_process) as plugin:
        assert runtime.get("twice").parameters["properties"] == {"z": {"type": "integer"}}  # type: ignore[union-attr]
        [warning] = plugin.diagnostics()
    message = "the server lists this name 2 times; the last definition listed is registered"
    assert (warning.level, warning.tool, warning.message) == ("warning", "twice", message)
    assert f'MCP server "mem", tool "twice": {message}' in caplog.text


async def test_tool_names_model_providers_refuse_are_registered_under_names_they_take(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """MCP allows fs.read; one such name in the tool list made the provider refuse every request (s20 MCP audit)."""
    long_name = "x" * 80
    called: list[str] = []

    async def list_tools(ctx: Any, params: Any) -> mcp_types.ListToolsResult:
        names = ["fs.read", "get file", long_name, "a.b", "a_b", "fine-name"]
        return mcp_types.ListToolsResult(tools=[mcp_types.Tool(name=n, input_schema={"type": "object"}) for n in names])

    async def call_tool(ctx: Any, params: mcp_types.CallToolRequestParams) -> mcp_types.CallToolResult:
        called.append(params.name)
        return mcp_types.CallToolResult(content=[mcp_types.TextContent(type="text", text="ok")])

    runtime = ToolRuntime()
    in_process = {"mem": Server("odd", on_list_tools=list_tools, on_call_tool=call_tool)}
    async with McpClientPlugin.connect(runtime, {"servers": [{"name": "mem"}]}, in_process=in_process) as plugin:
        names = sorted(runtime.names())
        assert all(re.fullmatch(r"[a-zA-Z0-9_-]{1,64}", name) for name in names), names
        assert {"fs_read", "get_file", "a_b", "fine-name"} <= set(names) and len(names) == 5
        clipped = next(name for name in names if name.startswith("xxx"))
        assert len(clipped) == 64
        for name in ("fs_read", clipped):
            assert not (await runtime.execute(make_input(name))).is_error
        assert called == ["fs.read", long_name]  # the server is called by its own names
        warnings = {(note.tool, note.message) for note in plugin.diagnostics()}
    assert ("fs_read", "registered under this name for the server's tool 'fs.read', which model providers "
            "refuse (letters, digits, _ and - only, at most 64)") in warnings  # fmt: skip
    assert any(tool == "a_b" and "'a.b', 'a_b' all become this name" in message for tool, message in warnings)
    assert "is registered, but its name does not match" not in caplog.text  # nothing providers refuse


async def test_a_servers_image_a_provider_would_refuse_becomes_a_note() -> None:
    """Passed on as an image, it made the provider refuse that request and every later one (s20 MCP audit)."""

    async def list_tools(ctx: Any, params: Any) -> mcp_types.ListToolsResult:
        return mcp_types.ListToolsResult(tools=[mcp_types.Tool(name="shots", input_schema={"type": "object"})])

    async def call_tool(ctx: Any, params: mcp_types.CallToolRequestParams) -> mcp_types.CallToolResult:
        return mcp_types.CallToolResult(
            content=[
                mcp_types.ImageContent(type="image", data="iVBORw0KGgo=", mime_type="image/png"),
                mcp_types.ImageContent(type="image", data="!!!not base64", mime_type="image/png"),
                mcp_types.ImageContent(type="image", data="PGI+aGk8L2I+", mime_type="text/html"),
            ]
        )

    runtime = ToolRuntime()
    in_process = {"mem": Server("shots", on_list_tools=list_tools, on_call_tool=call_tool)}
    async with McpClientPlugin.connect(runtime, {"servers": [{"name": "mem"}]}, in_process=in_process):
        result = await runtime.execute(make_input("shots"))
    assert not result.is_error, result
    first, second, third = result.content
    assert isinstance(first, ImageBlock) and first.mime_type == "image/png"
    assert second == TextBlock("[an image the server returned was left out: its data is not base64]")
    assert isinstance(third, TextBlock) and third.text.startswith(
        "[an image the server returned was left out: its type 'text/html' is not one model providers take"
    )


async def test_cancelling_the_call_cancels_the_server_request() -> None:
    events: list[str] = []
    recorder = Recorder()
    runtime = make_runtime(plugins=[recorder])
    async with McpClientPlugin.connect(runtime, mem_config(), in_process={"mem": build_test_server(events)}):
        request = make_input("mem__slow", {"seconds": 10})
        async with trio.open_nursery() as nursery:
            results: list[Any] = []

            async def call() -> None:
                results.append(await runtime.execute(request))

            nursery.start_soon(call)
            await trio.sleep(0.2)
            request.signal.cancel()
        assert results[0].code == "ABORTED"
        await eventually(lambda: "slow cancelled" in events)


async def test_the_timeout_plugin_bounds_mcp_calls() -> None:
    events: list[str] = []
    runtime = ToolRuntime()
    runtime.plugins.register(TimeoutPolicy(runtime))
    config = mem_config(timeout_ms=150)
    async with McpClientPlugin.connect(runtime, config, in_process={"mem": build_test_server(events)}):
        assert runtime.get("mem__slow").timeout_ms == 150
        start = trio.current_time()
        result = await runtime.execute(make_input("mem__slow", {"seconds": 10}))
        assert result.code == "TOOL_TIMEOUT"
        assert trio.current_time() - start < 5
        await eventually(lambda: "slow cancelled" in events)


# -- the client plugin, over stdio subprocesses ------------------------------------------------------


async def test_stdio_server_is_listed_at_setup_and_restarted_after_dying_mid_call() -> None:
    runtime = ToolRuntime()
    config = {"servers": [stdio_server_entry()], "backoff_initial_s": 0.05, "connect_timeout_s": 60}
    dsh_setup(runtime, config)  # blocking discovery (a worker thread), as load_plugins runs it
    assert {"proc__add", "proc__slow", "proc__pid"} <= set(runtime.names())
    plugin = runtime.plugins.get_plugin(PLUGIN_NAME)
    assert isinstance(plugin, McpClientPlugin)

    async with plugin.running():
        assert (await runtime.execute(make_input("proc__add", {"a": 1, "b": 1}))).value == {"total": 2}
        first_pid = (await runtime.execute(make_input("proc__pid"))).value["result"]

        async with trio.open_nursery() as nursery:
            results: list[Any] = []

            async def call() -> None:
                results.append(await runtime.execute(make_input("proc__slow", {"seconds": 30})))

            nursery.start_soon(call)
            await trio.sleep(0.3)
            os.kill(first_pid, signal.SIGKILL)
        died = results[0]
        assert died.is_error and died.code == MCP_SERVER_DIED
        assert died.error.info.name == "McpClientError"
        assert 'MCP server "proc" died during the call to "slow"' in died.error.message

        second_pid = (await runtime.execute(make_input("proc__pid"))).value["result"]
        assert second_pid != first_pid


async def test_one_death_with_many_calls_in_flight_is_one_failure() -> None:
    """Each call the death took down counted one: after 8, the next connection waited 30 s, not the first step."""
    runtime = ToolRuntime()
    config = {"servers": [stdio_server_entry()], "backoff_initial_s": 0.5, "backoff_max_s": 30, "connect_timeout_s": 60}
    async with McpClientPlugin.connect(runtime, config) as plugin:
        pid = (await runtime.execute(make_input("proc__pid"))).value["result"]
        results: list[Any] = []

        async def call() -> None:
            results.append(await runtime.execute(make_input("proc__slow", {"seconds": 30})))

        async with trio.open_nursery() as nursery:
            for _ in range(8):
                nursery.start_soon(call)
            await trio.sleep(0.5)
            os.kill(pid, signal.SIGKILL)
        assert [result.code for result in results] == [MCP_SERVER_DIED] * 8
        assert plugin._servers[0].failures == 1


@pytest.mark.parametrize(
    ("tool", "problem"),
    [
        ("deep", "sent a message the MCP SDK could not parse (Invalid JSON: recursion limit exceeded"),
        ("wrong_id", "answered request id 12345, which this client never sent"),
        ("null_id", "answered with an error that names no request (-32600: Invalid Request)"),
        ("shapeless", "sent a message the MCP SDK could not parse (valid JSON, but not a JSON-RPC message)"),
    ],
)
async def test_an_answer_no_request_can_be_matched_to_fails_the_pending_call(tool: str, problem: str) -> None:
    runtime = ToolRuntime()
    with trio.fail_after(20):  # the call used to wait forever
        async with McpClientPlugin.connect(runtime, {"servers": [raw_server_entry()]}):
            failed = await runtime.execute(make_input(f"raw__{tool}"))
            calls = await runtime.execute(make_input("raw__calls"))
    assert failed.code == MCP_ERROR
    assert failed.error.message.startswith(f'MCP server "raw" {problem}')
    assert failed.error.message.endswith(f'; the call to "{tool}" was abandoned')
    assert calls.value == text_value("2")  # the same session goes on


async def test_a_tool_the_client_cannot_define_is_refused_alone() -> None:
    """An empty name raised out of the listing: every tool of the server failed MCP_SERVER_UNAVAILABLE, for good."""
    entry = raw_server_entry(env={"RAW_EXTRA_NAMES": '[""]'})
    del entry["prefix"]  # with a prefix the name is not empty
    runtime = ToolRuntime()
    with trio.fail_after(20):
        async with McpClientPlugin.connect(runtime, {"servers": [entry]}) as plugin:
            ok = await runtime.execute(make_input("ok"))
            problems = [str(note) for note in plugin.diagnostics() if note.level == "problem"]
    assert ok.value == text_value("ok")
    assert problems == ["MCP server \"raw\": not registered: ToolDefinition.name must be a non-empty str, got ''"]
    setup = ToolRuntime()
    mcp_client.dsh_setup(setup, {"servers": [entry]})  # it stopped the plugin's setup too
    assert setup.get("ok") is not None


@pytest.mark.parametrize(
    ("definition", "why"),
    [
        ({"name": "bad", "inputSchema": {"type": "object"}, "outputSchema": {"type": "string"}}, "outputSchema.type"),
        ({"name": "bad", "inputSchema": {"type": "array"}}, "inputSchema.type"),
        ({"name": "bad"}, "inputSchema: Field required"),
    ],
)
async def test_a_tool_definition_the_sdk_refuses_is_refused_alone(definition: dict[str, Any], why: str) -> None:
    """The SDK validates a listing as a whole: one such tool made every tool of the server unavailable."""
    entry = raw_server_entry(env={"RAW_EXTRA_TOOLS": json.dumps([definition])})
    runtime = ToolRuntime()
    with trio.fail_after(20):
        async with McpClientPlugin.connect(runtime, {"servers": [entry]}) as plugin:
            ok = await runtime.execute(make_input("raw__ok"))
            problems = [str(note) for note in plugin.diagnostics() if note.level == "problem"]
    assert ok.value == text_value("ok")
    assert runtime.get("raw__bad") is None
    assert len(problems) == 1, problems
    assert problems[0].startswith(
        'MCP server "raw", tool "raw__bad": not registered: the server\'s definition of it is invalid (' + why
    )
    assert "\n" not in problems[0] and "validation error" not in problems[0]
    setup = ToolRuntime()
    mcp_client.dsh_setup(setup, {"servers": [entry]})  # the listing at setup too
    assert setup.get("raw__ok") is not None


@pytest.mark.parametrize("tool", ["big", "flood"])
async def test_a_stdio_line_past_max_event_bytes_ends_the_session(tool: str) -> None:
    """max_event_bytes did nothing over stdio: a result of any size was taken, and a line that never
    ended (flood) was gathered forever, the host at 100 % CPU, the call waiting and the session live."""
    runtime = ToolRuntime()
    entry = raw_server_entry(max_event_bytes=1_000_000)
    with trio.fail_after(20):
        async with McpClientPlugin.connect(runtime, {"servers": [entry], "backoff_initial_s": 0.01}):
            failed = await runtime.execute(make_input(f"raw__{tool}"))
            calls = await runtime.execute(make_input("raw__calls"))
    assert failed.code == MCP_ERROR, failed.error.message
    assert failed.error.message.startswith(
        'MCP server "raw" sent a message larger than the client\'s limit of 1000000 bytes (max_event_bytes'
    )
    assert calls.value == text_value("1")  # the session was ended: a new process


async def test_a_stdio_line_within_max_event_bytes_is_taken_whole() -> None:
    runtime = ToolRuntime()
    with trio.fail_after(20):
        async with McpClientPlugin.connect(runtime, {"servers": [raw_server_entry(max_event_bytes=3_000_000)]}):
            big = await runtime.execute(make_input("raw__big"))
    assert big.value == text_value("b" * 2_000_000)


def test_stdio_lines_are_assembled_in_linear_time() -> None:
    """Each chunk re-copied the whole pending line: one line of 64 MB cost half a minute of CPU."""
    import time

    from dsh_plugins._mcp_stdio import MessageTooLarge, _Lines

    lines = _Lines(10)
    assert lines.feed(b"ab") == []
    assert lines.feed(b"c\nde\n\nf") == [b"abc", b"de", b""]
    assert lines.feed(b"g\n") == [b"fg"]
    with pytest.raises(MessageTooLarge):
        lines.feed(b"0123456789x")

    size, chunk = 64 * 1024 * 1024, b"x" * 65536
    lines = _Lines(size)
    started = time.process_time()
    for _ in range(size // len(chunk)):
        assert lines.feed(chunk) == []
    (line,) = lines.feed(b"\n")
    assert len(line) == size
    assert time.process_time() - started < 5  # quadratic: ~30 s


async def test_a_server_that_closes_its_stdout_but_lives_fails_the_call_in_flight_as_died() -> None:
    # Nothing can come back on a closed stdout: the call must not wait for its answer (or its budget).
    runtime = ToolRuntime()
    with trio.fail_after(20):
        async with McpClientPlugin.connect(runtime, {"servers": [raw_server_entry()]}):
            died = await runtime.execute(make_input("raw__close_stdout"))
            again = await runtime.execute(make_input("raw__calls"))
    assert died.code == MCP_SERVER_DIED, died.error.message
    assert 'MCP server "raw" died during the call to "close_stdout"' in died.error.message
    assert again.value == text_value("1")  # the next call reconnected: a new process


async def test_a_stdio_servers_stderr_reaches_the_host_escaped_prefixed_and_cut(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # The server used to inherit the host's stderr: its escapes reached the user's terminal raw.
    from dsh_plugins._mcp_stdio import STDERR_LINE_BYTES

    runtime = ToolRuntime()
    with trio.fail_after(20):
        async with McpClientPlugin.connect(runtime, {"servers": [raw_server_entry()]}):
            noisy = await runtime.execute(make_input("raw__stderr_noise"))
            calls = await runtime.execute(make_input("raw__calls"))
    assert noisy.value == text_value("fine")
    assert calls.value == text_value("2")  # a megabyte on stderr blocked nothing
    err = capsys.readouterr().err
    assert not {"\x1b", "\x07", "\r"} & set(err)
    lines = err.splitlines()
    relayed = [line for line in lines if line.startswith("[mcp:raw] ")]
    assert relayed == [
        "[mcp:raw] \\x1b[2J\\x1b]0;pwned\\x07boom\\x0dall clear",
        "[mcp:raw] " + "x" * STDERR_LINE_BYTES + f" … (line cut at {STDERR_LINE_BYTES} bytes)",
        "[mcp:raw] last words",  # the line the server never ended, relayed when the session closed
    ]


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts descriptors in /proc/self/fd")
async def test_stdio_sessions_close_every_pipe_they_open(capsys: pytest.CaptureFixture[str]) -> None:
    def open_descriptors() -> int:
        return len(os.listdir("/proc/self/fd"))

    async def one_session() -> None:
        runtime = ToolRuntime()
        async with McpClientPlugin.connect(runtime, {"servers": [raw_server_entry()]}):
            noisy = await runtime.execute(make_input("raw__stderr_noise"))
            assert isinstance(noisy, ToolExecutionSuccess), noisy.error
            assert noisy.value == text_value("fine")

    with trio.fail_after(30):
        await one_session()  # imports and the like, once
        gc.collect()
        before = open_descriptors()
        # A pipe left open may still be closed by the collector; here it must be closed by the transport.
        gc.disable()
        try:
            for _ in range(3):
                await one_session()
            assert open_descriptors() == before
        finally:
            gc.enable()
    assert capsys.readouterr().err.count("[mcp:raw] last words") == 4  # every process, stopped, had its say


async def test_a_server_that_dies_while_a_helper_holds_its_stdout_fails_the_call_in_flight_as_died() -> None:
    # Only the stdout's end was watched: the helper kept it open, and the call waited forever.
    runtime = ToolRuntime()
    with trio.fail_after(10):
        async with McpClientPlugin.connect(runtime, {"servers": [raw_server_entry()], "backoff_initial_s": 0.01}):
            died = await runtime.execute(make_input("raw__orphan_crash"))
            again = await runtime.execute(make_input("raw__calls"))
    assert died.code == MCP_SERVER_DIED, died.error.message
    assert 'MCP server "raw" died during the call to "orphan_crash"' in died.error.message
    assert again.value == text_value("1")  # the next call reconnected: a new process


def _running(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie waiting for its reaper is not)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
async def test_what_a_stdio_server_started_ends_with_its_session(tmp_path: Path) -> None:
    # A crashed server's helpers, and those of a server that exited at once on shutdown, ran on for good.
    pids_file = tmp_path / "helpers"
    entry = raw_server_entry(env={"RAW_HELPER_PIDS": str(pids_file)})
    runtime = ToolRuntime()
    try:
        with trio.fail_after(20):
            async with McpClientPlugin.connect(runtime, {"servers": [entry], "backoff_initial_s": 0.01}):
                crashed = await runtime.execute(make_input("raw__helper_crash"))
                started = await runtime.execute(make_input("raw__helper"))
        pids = [int(line) for line in pids_file.read_text().split()]
        assert len(pids) == 2
        with trio.move_on_after(5):  # the kill is prompt; their reaper (init) may take a moment
            while any(_running(pid) for pid in pids):
                await trio.sleep(0.05)
        assert not [pid for pid in pids if _running(pid)]  # they live HELPER_S (15 s) unless killed
    finally:
        for pid in [int(line) for line in pids_file.read_text().split()] if pids_file.exists() else []:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert crashed.code == MCP_SERVER_DIED, crashed.error.message
    assert started.value == text_value("started")


async def test_a_failed_read_of_the_servers_stdout_fails_the_call_in_flight_as_died(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The transport's reader used to drain the stdout of a server still alive before ending the
    # session: the call waited forever for an answer the drain threw away.
    from dsh_plugins import _mcp_stdio

    class FailingOnce(_mcp_stdio._Lines):
        failed = False

        def feed(self, chunk: bytes) -> list[bytes]:
            if b"debug:" in chunk and not FailingOnce.failed:
                FailingOnce.failed = True
                raise OSError(5, "Input/output error")  # the pipe failed under the read
            return super().feed(chunk)

    monkeypatch.setattr(_mcp_stdio, "_Lines", FailingOnce)
    runtime = ToolRuntime()
    with trio.fail_after(20):
        async with McpClientPlugin.connect(runtime, {"servers": [raw_server_entry()]}):
            died = await runtime.execute(make_input("raw__stray_text"))
            again = await runtime.execute(make_input("raw__calls"))
    assert FailingOnce.failed
    assert died.code == MCP_SERVER_DIED, died.error.message
    assert 'MCP server "raw" died during the call to "stray_text"' in died.error.message
    assert again.value == text_value("1")  # the next call reconnected: a new process


async def test_a_line_of_plain_text_on_stdout_is_not_taken_for_an_answer() -> None:
    runtime = ToolRuntime()
    with trio.fail_after(20):
        async with McpClientPlugin.connect(runtime, {"servers": [raw_server_entry()]}):
            result = await runtime.execute(make_input("raw__stray_text"))
    assert result.value == text_value("fine")


async def test_an_answer_after_text_printed_without_a_newline_is_kept(caplog: pytest.LogCaptureFixture) -> None:
    # "progress 50%{...answer...}" was read as plain text: the answer was dropped, the call waited forever.
    runtime = ToolRuntime()
    with trio.fail_after(20):
        async with McpClientPlugin.connect(runtime, {"servers": [raw_server_entry()]}):
            result = await runtime.execute(make_input("raw__glued"))
            calls = await runtime.execute(make_input("raw__calls"))
    assert result.value == text_value("fine")
    assert calls.value == text_value("2")
    assert 'MCP server "raw" printed text before a message on its stdout: progress 50%' in caplog.text


async def test_a_byte_order_mark_opening_a_stdio_servers_output_is_accepted(caplog: pytest.LogCaptureFixture) -> None:
    # The BOM made the initialize answer plain text: the server never connected (a start-up timeout).
    # Taken since for text printed before a message, it is no text: accepted without a warning.
    runtime = ToolRuntime()
    entry = raw_server_entry(env={"RAW_BOM": "1"})
    with trio.fail_after(20):
        async with McpClientPlugin.connect(runtime, {"servers": [entry], "connect_timeout_s": 5}) as plugin:
            result = await runtime.execute(make_input("raw__ok"))
    assert result.value == text_value("ok"), result.error.message
    assert plugin.diagnostics() == []
    assert "printed text before a message" not in caplog.text


async def test_bytes_that_are_not_utf8_on_stdout_are_replaced_and_the_session_goes_on() -> None:
    # A strict decoder used to kill the transport's reader while the session looked live:
    # this call and every later one waited forever.
    runtime = ToolRuntime()
    with trio.fail_after(20):
        async with McpClientPlugin.connect(runtime, {"servers": [raw_server_entry()]}):
            result = await runtime.execute(make_input("raw__bad_utf8"))
            calls = await runtime.execute(make_input("raw__calls"))
    assert result.value == text_value("a\ufffd\ufffdb")
    assert calls.value == text_value("2")  # the same session goes on


@pytest.mark.parametrize("tool", ["json_log", "bad_note"])
async def test_a_json_line_that_cannot_be_an_answer_is_not_taken_for_one(tool: str) -> None:
    # An object without an id, or a notification (it has a method), answers no request:
    # it used to fail every call in flight.
    runtime = ToolRuntime()
    with trio.fail_after(20):
        async with McpClientPlugin.connect(runtime, {"servers": [raw_server_entry()]}):
            result = await runtime.execute(make_input(f"raw__{tool}"))
            calls = await runtime.execute(make_input("raw__calls"))
    assert result.value == text_value("fine")
    assert calls.value == text_value("2")


@pytest.mark.parametrize(
    ("line", "may_answer"),
    [
        ('{"jsonrpc": "2.0", "id": 3, "result": "x"}', True),
        ('{"jsonrpc": "1.0", "id": 3, "result": {}}', True),
        ('{"jsonrpc": "2.0", "id": {"a": 1}, "result": {}}', True),
        ('[{"jsonrpc": "2.0", "id": 3, "result": "x"}]', True),  # a batch
        ('{"jsonrpc": "2.0", "id": 3, "result": {}', True),  # cut short
        ('{"level": "info", "msg": "x"}', False),
        ('{"jsonrpc": "2.0", "method": "notifications/message", "params": "oops"}', False),
        ('{"jsonrpc": "2.0", "id": 3, "method": "ping", "params": "oops"}', False),  # a request, not an answer
        ("[1, 2]", False),
        ("42", False),
        ("[INFO] starting", False),
    ],
)
def test_only_an_unparsable_message_that_may_be_a_response_counts_as_an_answer(line: str, may_answer: bool) -> None:
    from mcp.client.stdio import _parse_line

    from dsh_plugins.mcp_client import _unparsed_message

    refused = _parse_line(line)
    assert isinstance(refused, Exception)
    assert (_unparsed_message(refused) is not None) is may_answer


async def test_a_server_error_answer_is_an_mcp_error_and_never_retried() -> None:
    # -32000 is also the SDK's code for a closed connection; this one is the server's answer.
    events: list[str] = []
    runtime = ToolRuntime(event_sink=lambda kind, data: events.append(kind))
    with trio.fail_after(20):
        async with McpClientPlugin.connect(runtime, {"servers": [raw_server_entry(retry_attempts=3)]}):
            failed = await runtime.execute(make_input("raw__server_error"))
            calls = await runtime.execute(make_input("raw__calls"))
    assert failed.code == MCP_ERROR
    message = 'MCP server "raw" answered the call to "server_error" with error -32000: custom failure'
    assert failed.error.message == message
    assert events == []  # no retry
    assert calls.value == text_value("2")  # one attempt, and the server was not restarted


async def test_a_server_answer_in_the_sdks_words_for_a_lost_connection_is_still_the_servers() -> None:
    # Whether the connection is gone is judged by where the -32000 came from (the server sent
    # one for this request's id), never by its text.
    runtime = ToolRuntime()
    with trio.fail_after(20):
        async with McpClientPlugin.connect(runtime, {"servers": [raw_server_entry()]}):
            failed = await runtime.execute(make_input("raw__closed_error"))
            calls = await runtime.execute(make_input("raw__calls"))
    assert failed.code == MCP_ERROR
    assert failed.error.message == 'MCP server "raw" answered the call to "closed_error" with error -32000: Connection closed'
    assert calls.value == text_value("2")  # the same session goes on


async def test_a_result_that_does_not_parse_is_an_mcp_error_in_one_line() -> None:
    runtime = ToolRuntime()
    with trio.fail_after(20):
        async with McpClientPlugin.connect(runtime, {"servers": [raw_server_entry()]}):
            failed = await runtime.execute(make_input("raw__bad_result"))
    assert failed.code == MCP_ERROR
    assert failed.error.message == (
        'MCP server "raw" sent an invalid result for "bad_result": '
        "the result does not parse (content: Input should be a valid list)"
    )


async def test_without_running_each_call_uses_a_short_lived_session() -> None:
    events: list[str] = []
    runtime = ToolRuntime()
    plugin = McpClientPlugin(runtime, _settings(mem_config()), in_process={"mem": build_test_server(events)})
    await plugin.sync()
    assert "mem__add" in runtime.names()
    added = await runtime.execute(make_input("mem__add", {"a": 2, "b": 2}))
    failed = await runtime.execute(make_input("mem__fail"))
    assert added.value == {"total": 4}
    assert (
        failed.code == "TOOL_ERROR" and failed.error.message == "Error executing tool fail: the tool broke on purpose"
    )


async def test_an_unstartable_server_fails_calls_with_growing_backoff() -> None:
    runtime = ToolRuntime()
    entry = {"name": "gone", "command": str(REPO / "no-such-mcp-server"), "prefix": "gone"}
    plugin = McpClientPlugin(runtime, _settings({"servers": [entry], "backoff_initial_s": 0.1}))
    # Register one tool by hand, as if a previous listing had found it.
    from dsh_plugins.mcp_client import _Server

    server: _Server = plugin._servers[0]
    fake = {"name": "ping", "inputSchema": {"type": "object"}}
    import mcp_types

    plugin._sync(server, [mcp_types.Tool.model_validate(fake)])
    async with plugin.running():
        assert [d.level for d in plugin.diagnostics()] == ["problem"]  # the connect at entry failed
        durations = []
        for _ in range(2):
            start = trio.current_time()
            result = await runtime.execute(make_input("gone__ping"))
            durations.append(trio.current_time() - start)
            assert result.code == MCP_SERVER_UNAVAILABLE
            assert 'MCP server "gone" is unavailable' in result.error.message
        assert durations[1] >= 0.18  # the second consecutive failure doubled the 0.1 s delay
        assert durations[1] > durations[0]


async def test_a_server_that_failed_discovery_is_not_waited_for_again_at_entry(tmp_path: Path) -> None:
    # serve-mcp answers nothing until every lifespan is entered: a server that could not be
    # listed at setup used to hold it up a second time (twice connect_timeout_s when it hangs).
    starts = tmp_path / "starts"
    quitter = f"open({str(starts)!r}, 'a').write('start\\n')"  # starts, then exits without a word
    entry = {"name": "quits", "command": sys.executable, "args": ["-c", quitter], "prefix": "quits"}
    runtime = ToolRuntime()
    dsh_setup(runtime, {"servers": [entry], "backoff_initial_s": 0.01})
    plugin = runtime.plugins.get_plugin(PLUGIN_NAME)
    assert isinstance(plugin, McpClientPlugin)
    assert starts.read_text().count("start") == 1
    with trio.fail_after(20):
        async with plugin.running():
            assert starts.read_text().count("start") == 1  # not started again at entry
            [problem] = plugin.diagnostics()
            assert problem.level == "problem" and problem.message.startswith("could not be listed: ")
            # Calls still reconnect, as after any failure (the backoff first).
            from dsh_plugins.mcp_client import _Server

            server: _Server = plugin._servers[0]
            import mcp_types

            plugin._sync(server, [mcp_types.Tool.model_validate({"name": "ping", "inputSchema": {"type": "object"}})])
            failed = await runtime.execute(make_input("quits__ping"))
            assert failed.code == MCP_SERVER_UNAVAILABLE
            assert starts.read_text().count("start") == 2


async def test_retry_attempts_retry_read_only_tools_of_a_server_that_is_gone(caplog: pytest.LogCaptureFixture) -> None:
    runtime = ToolRuntime()
    entry = {"name": "gone", "command": str(REPO / "no-such-mcp-server"), "prefix": "gone", "retry_attempts": 3}
    plugin = McpClientPlugin(runtime, _settings({"servers": [entry], "backoff_initial_s": 0.01, "backoff_max_s": 0.05}))
    from dsh_plugins.mcp_client import _Server

    server: _Server = plugin._servers[0]
    import mcp_types

    plugin._sync(
        server,
        [
            mcp_types.Tool.model_validate(
                {"name": "ping", "inputSchema": {"type": "object"}, "annotations": {"readOnlyHint": True}}
            ),
            mcp_types.Tool.model_validate({"name": "poke", "inputSchema": {"type": "object"}}),
        ],
    )
    retried = runtime.get("gone__ping")
    assert retried is not None and retried.retry is not None and retried.retry.max_attempts == 3
    assert runtime.get("gone__poke").retry is None  # type: ignore[union-attr]
    warnings = [str(d) for d in plugin.diagnostics() if d.tool == "gone__poke"]
    assert warnings == [
        'MCP server "gone", tool "gone__poke": not retried (retry_attempts = 3): the server does not annotate '
        "it read-only or idempotent, so a second attempt could repeat its effect"
    ]
    assert "not retried" not in caplog.text  # a note for check, not a warning on every start
    events: list[str] = []
    runtime.event_sink = lambda kind, data: events.append(kind)
    async with plugin.running():
        ping = await runtime.execute(make_input("gone__ping"))
        assert ping.code == MCP_SERVER_UNAVAILABLE
        assert ping.error.message.endswith("(after 3 attempts)")
        assert events == ["tool/retry", "tool/retry"]
        events.clear()
        poke = await runtime.execute(make_input("gone__poke"))
        assert poke.code == MCP_SERVER_UNAVAILABLE and "attempts" not in poke.error.message
        assert events == []


@pytest.mark.parametrize("attempts", [0, 11, "3", True])
def test_retry_attempts_out_of_range_are_refused(attempts: Any) -> None:
    entry = {"name": "x", "command": "x", "retry_attempts": attempts}
    with pytest.raises(ConfigError, match="retry_attempts"):
        _settings({"servers": [entry]})


async def test_an_answer_from_the_server_is_not_retried_even_for_a_read_only_tool() -> None:
    server = MCPServer("flaky")
    answers = 0

    @server.tool(annotations=ToolAnnotations(readOnlyHint=True))
    def lookup() -> str:
        """Always fails."""
        nonlocal answers
        answers += 1
        raise ToolError("no such key")

    events: list[str] = []
    runtime = ToolRuntime(event_sink=lambda kind, data: events.append(kind))
    config = {"servers": [{"name": "flaky", "retry_attempts": 3}]}
    async with McpClientPlugin.connect(runtime, config, in_process={"flaky": server}):
        assert runtime.get("lookup").retry is not None  # type: ignore[union-attr]
        failed = await runtime.execute(make_input("lookup"))
    assert failed.code == "TOOL_ERROR" and "attempts" not in failed.error.message
    assert answers == 1 and events == []


async def test_the_example_config_denies_delete_and_calls_add() -> None:
    config = load_config(REPO / "examples" / "mcp" / "dsh.toml")
    demo = runpy.run_path(str(REPO / "examples" / "mcp" / "demo_server.py"))["server"]
    runtime = ToolRuntime()
    permissions.dsh_setup(runtime, config.plugin_config("permissions"))
    async with McpClientPlugin.connect(runtime, config.plugin_config("mcp"), in_process={"demo": demo}) as plugin:
        assert set(runtime.names()) == {"demo__add", "demo__shout", "demo__delete_everything"}
        assert plugin.diagnostics() == []
        denied = await runtime.execute(make_input("demo__delete_everything"))
        added = await runtime.execute(make_input("demo__add", {"a": 2, "b": 3}))
        shouted = await runtime.execute(make_input("demo__shout", {"text": "hey"}))
    assert denied.code == "DENIED"
    assert denied.error.message == "the demo server's delete_everything is off limits"
    assert added.value == {"total": 5}
    assert shouted.content[0].text == "HEY!"
    assert runtime.get("demo__add") is None


# -- serve_registry ----------------------------------------------------------------------------------


def serving_runtime(*plugins: object) -> tuple[ToolRuntime, list[str]]:
    seen: list[str] = []

    async def add(args: Any) -> int:
        return args["a"] + args["b"]

    async def wait(args: Any) -> str:
        try:
            await trio.sleep(10)
        except trio.Cancelled:
            seen.append("wait cancelled")
            raise
        return "waited"

    runtime = make_runtime(
        json_tool(
            "add",
            add,
            parameters={"a": {"type": "integer", "required": True}, "b": {"type": "integer", "required": True}},
            output={"type": "integer"},
        ),
        json_tool("delete_all"),
        json_tool("guarded"),
        json_tool("wait", wait, output={"type": "string"}),
        plugins=plugins,
    )
    return runtime, seen


async def test_serve_registry_lists_tools_with_their_schemas() -> None:
    runtime, _ = serving_runtime()
    async with Client(serve_registry(runtime), mode="legacy") as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert set(tools) == {"add", "delete_all", "guarded", "wait"}
    assert tools["add"].input_schema == json.loads(json.dumps(runtime.get("add").parameters))
    # Not an object: wrapped, since MCP output schemas are object-rooted.
    assert tools["add"].output_schema == {
        "type": "object",
        "properties": {"result": {"type": "integer"}},
        "required": ["result"],
        "additionalProperties": False,
    }


async def test_serve_registry_lists_deferred_tools_once_a_search_loads_them() -> None:
    from dsh_plugins.tool_search import search_tool

    runtime = make_runtime(json_tool("shown"), json_tool("rare_report", defer_loading=True))
    runtime.register(search_tool(runtime))
    async with Client(serve_registry(runtime), mode="legacy") as client:
        assert {tool.name for tool in (await client.list_tools()).tools} == {"shown", "search_tools"}
        found = await client.call_tool("search_tools", {"query": "report"})
        assert "rare_report" in found.content[0].text  # type: ignore[union-attr]
        assert "rare_report" in {tool.name for tool in (await client.list_tools()).tools}
        called = await client.call_tool("rare_report", {"x": 1})
    assert not called.is_error


def searchable_runtime() -> ToolRuntime:
    from dsh_plugins.tool_search import search_tool

    runtime = make_runtime(json_tool("shown"), json_tool("rare_report", defer_loading=True))
    runtime.register(search_tool(runtime))
    return runtime


async def test_a_search_that_loads_tools_notifies_listening_clients() -> None:
    async with Client(serve_registry(searchable_runtime())) as client:
        async with client.listen(tools_list_changed=True) as subscription:
            await client.call_tool("shown", {})  # changes nothing
            await client.call_tool("search_tools", {"query": "report"})
            with trio.fail_after(5):
                async for event in subscription:
                    assert type(event).__name__ == "ToolsListChanged"
                    break
        assert "rare_report" in {tool.name for tool in (await client.list_tools()).tools}


async def test_a_search_that_loads_tools_notifies_handshake_era_clients() -> None:
    seen: list[str] = []

    async def handler(message: Any) -> None:
        seen.append(type(message).__name__)

    server = serve_registry(searchable_runtime())
    async with Client(server, mode="legacy", message_handler=handler) as client:
        await client.call_tool("shown", {})
        assert "ToolListChangedNotification" not in seen  # a call that changes nothing says nothing
        await client.call_tool("search_tools", {"query": "report"})
        with trio.fail_after(5):
            while "ToolListChangedNotification" not in seen:
                await trio.sleep(0.01)


def tool_list_notices(seen: list[str]) -> Callable[[Any], Awaitable[None]]:
    """A client's message handler that records the kind of each message the server sends it."""

    async def handler(message: Any) -> None:
        seen.append(type(message).__name__)

    return handler


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_every_http_session_whose_list_changed_is_notified() -> None:
    seen_a: list[str] = []
    seen_b: list[str] = []
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            (base,) = await nursery.start(serve_http, searchable_runtime(), "127.0.0.1", 0)
            async with (
                Client(base + "/mcp", mode="legacy", message_handler=tool_list_notices(seen_a)) as a,
                Client(base + "/mcp", mode="legacy", message_handler=tool_list_notices(seen_b)) as b,
            ):
                assert {tool.name for tool in (await b.list_tools()).tools} == {"shown", "search_tools"}
                await a.call_tool("shown", {})  # changes nothing
                await a.call_tool("search_tools", {"query": "report"})
                await eventually(lambda: "ToolListChangedNotification" in seen_b)
                assert "rare_report" in {tool.name for tool in (await b.list_tools()).tools}
                await a.call_tool("search_tools", {"query": "report"})  # loads nothing new
                await b.call_tool("shown", {})
            nursery.cancel_scope.cancel()
    assert seen_a.count("ToolListChangedNotification") == 1
    assert seen_b.count("ToolListChangedNotification") == 1


async def test_a_tool_list_changed_by_no_call_of_the_session_is_notified() -> None:
    seen: list[str] = []
    runtime = make_runtime(json_tool("first"))
    async with Client(serve_registry(runtime), mode="legacy", message_handler=tool_list_notices(seen)) as client:
        assert [tool.name for tool in (await client.list_tools()).tools] == ["first"]
        runtime.register(json_tool("second"))
        await eventually(lambda: seen.count("ToolListChangedNotification") == 1)
        runtime.register(json_tool("elsewhere"), Agent(id="someone-else"))  # not in this server's list
        # From a worker thread (a tool body's), as from the trio thread.
        await trio.to_thread.run_sync(runtime.register, json_tool("third"))
        await eventually(lambda: seen.count("ToolListChangedNotification") == 2)
        assert [tool.name for tool in (await client.list_tools()).tools] == ["first", "second", "third"]
    assert seen.count("ToolListChangedNotification") == 2


def list_change_listeners(runtime: ToolRuntime) -> list[object]:
    from dsh_core._mcp_list_changed import _ChangeListener

    return [plugin for plugin in runtime.plugins.get_plugins() if isinstance(plugin, _ChangeListener)]


async def test_a_served_registry_listens_for_tool_changes_once_however_many_lifespans_run() -> None:
    runtime = make_runtime(json_tool("first"))
    server = serve_registry(runtime)
    seen: dict[str, list[str]] = {"a": [], "b": [], "c": []}

    async def session(label: str, tool: str) -> None:
        handler = tool_list_notices(seen[label])
        async with Client(server, mode="legacy", message_handler=handler) as client:
            await client.list_tools()
            assert len(list_change_listeners(runtime)) == 1
            runtime.register(json_tool(tool))
            await eventually(lambda: "ToolListChangedNotification" in seen[label])

    # One lifespan after the other (a server restarted in-process), then two at once.
    await session("a", "second")
    assert list_change_listeners(runtime) == []
    await session("b", "third")
    assert list_change_listeners(runtime) == []
    async with Client(server, mode="legacy", message_handler=tool_list_notices(seen["c"])) as other:
        await other.list_tools()
        await session("c", "fourth")
        assert len(list_change_listeners(runtime)) == 1  # the other lifespan still runs
        await eventually(lambda: seen["c"].count("ToolListChangedNotification") == 2)
    assert list_change_listeners(runtime) == []
    assert {label: notices.count("ToolListChangedNotification") for label, notices in seen.items()} == {
        "a": 1,
        "b": 1,
        "c": 2,  # each of its two sessions told once
    }


async def test_a_lifespan_that_fails_leaves_no_tool_change_listener_behind() -> None:
    runtime = make_runtime(json_tool("first"))
    server = serve_registry(runtime)
    with pytest.raises(BaseException) as raised:  # the SDK may wrap it in exception groups
        async with Client(server, mode="legacy"):
            assert len(list_change_listeners(runtime)) == 1
            raise RuntimeError("the host failed")
    assert "the host failed" in str(raised.value) or raised.group_contains(RuntimeError)
    assert list_change_listeners(runtime) == []


async def test_a_tool_list_that_fails_to_build_after_a_change_does_not_end_the_server(
    caplog: pytest.LogCaptureFixture,
) -> None:
    runtime = make_runtime(json_tool("first"))
    agent = Agent(id="coder")
    async with Client(serve_registry(runtime, scope=agent), mode="legacy") as client:
        assert [tool.name for tool in (await client.list_tools()).tools] == ["first"]
        undo = runtime.present_as("code", agent)  # and the runtime has no code runtime
        await eventually(lambda: "MCP: could not tell the clients" in caplog.text)
        undo()
        assert [tool.name for tool in (await client.list_tools()).tools] == ["first"]
    assert "requires a code runtime" in caplog.text


async def test_a_reexported_mcp_servers_list_change_reaches_the_served_clients() -> None:
    seen: list[str] = []
    runtime = ToolRuntime()
    async with McpClientPlugin.connect(runtime, mem_config(), in_process={"mem": build_test_server()}):
        server = serve_registry(runtime)
        async with Client(server, mode="legacy", message_handler=tool_list_notices(seen)) as client:
            assert "mem__extra" not in {tool.name for tool in (await client.list_tools()).tools}
            grown = await client.call_tool("mem__grow", {})
            assert not grown.is_error
            await eventually(lambda: "ToolListChangedNotification" in seen)
            listed = {tool.name for tool in (await client.list_tools()).tools}
    assert "mem__extra" in listed and "mem__shout" not in listed


async def test_serve_registry_runs_an_allowed_call_through_the_pipeline() -> None:
    recorder = Recorder()
    runtime, _ = serving_runtime(recorder)
    async with Client(serve_registry(runtime), mode="legacy") as client:
        result = await client.call_tool("add", {"a": 2, "b": 40})
    assert not result.is_error
    assert result.structured_content == {"result": 42}
    assert [block.text for block in result.content] == ["42"]
    assert recorder.hooks == ["dsh_pre_execute", "dsh_execute", "dsh_post_execute", "dsh_result"]


async def test_serve_registry_sends_the_contexts_that_follow_a_result() -> None:
    class Redirect:
        @hookimpl
        async def dsh_pre_execute(self, execution: Any, next: Any) -> Any:
            decision = await next()
            if execution.arguments.get("b") == 0:
                return Rewrite({"a": execution.arguments["a"], "b": 1}, "b must not be 0")
            return decision

    runtime, _ = serving_runtime()
    runtime.plugins.register(Redirect(), name="no-zero")
    async with Client(serve_registry(runtime), mode="legacy") as client:
        result = await client.call_tool("add", {"a": 2, "b": 0})
    assert not result.is_error
    assert result.structured_content == {"result": 3}
    first, note = (block.text for block in result.content)
    assert first == "3"
    assert note.startswith("[no-zero] The arguments of this add call were changed by no-zero: b must not be 0.")


def nested_list(depth: int) -> Any:
    value: Any = "leaf"
    for _ in range(depth):
        value = [value]
    return value


def deep_result_runtime() -> ToolRuntime:
    async def deep(args: Any) -> Any:
        return {"v": nested_list(args["depth"])}

    return make_runtime(json_tool("deep", deep, parameters={"depth": {"type": "integer", "required": True}}))


# SDK clients parse messages nested at most 200 levels deep, and structuredContent sits two
# levels in; {"result": {"v": [...]}} adds two more to the list's own depth.
DEEPEST_RESULT_LIST = 200 - 2 - 2


async def test_serve_registry_sends_the_deepest_result_mcp_can_carry_as_structured_content() -> None:
    async with Client(serve_registry(deep_result_runtime()), mode="legacy") as client:
        result = await client.call_tool("deep", {"depth": DEEPEST_RESULT_LIST})
    assert not result.is_error
    assert result.structured_content == {"result": {"v": nested_list(DEEPEST_RESULT_LIST)}}


@pytest.mark.parametrize("depth", [DEEPEST_RESULT_LIST + 1, 100_000])
async def test_serve_registry_answers_a_result_too_deep_for_mcp_with_an_error_carrying_its_text(depth: int) -> None:
    runtime = deep_result_runtime()
    rendered = (await runtime.execute(make_input("deep", {"depth": depth}))).content
    async with Client(serve_registry(runtime), mode="legacy") as client:
        result = await client.call_tool("deep", {"depth": depth})
        after = await client.call_tool("deep", {"depth": 1})
    assert not after.is_error
    assert result.is_error
    assert result.structured_content is None
    assert [block.text for block in result.content] == [  # type: ignore[union-attr]
        'Error: tool "deep" ran, but its result nests more than 198 levels deep, deeper than an MCP '
        "message can carry as structured content; its text follows.",
        *(block.text for block in rendered),  # type: ignore[union-attr]
    ]
    assert result.meta is not None
    assert result.meta["dsh/error"] == {"code": "INVALID_TOOL_OUTPUT", "name": "McpResultTooDeep", "plugin": None}


def schema_nesting(levels: int) -> dict[str, Any]:
    """An array schema nesting exactly ``levels`` levels deep (``{"type": "string"}`` nests one)."""
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels - 1):
        schema = {"type": "array", "items": schema}
    return schema


def deep_schema_tool(name: str, *, parameters: int = 3, output: int = 1) -> Any:
    """A tool whose parameter schema nests ``parameters`` levels deep and output schema ``output``."""

    async def body(args: Any) -> Any:
        return "ok"

    root = {"type": "object", "properties": {"x": schema_nesting(parameters - 2)}}
    return define_tool(
        name=name, description=name, parameters=RawSchema(root), output=schema_nesting(output), execute=body
    )


# SDK clients parse messages nested at most 200 levels deep, and a tool's schemas sit four levels
# into a tools/list answer: {"result": {"tools": [{"inputSchema": ...}]}}.
DEEPEST_LISTED_SCHEMA = 200 - 4


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_serve_http_leaves_out_the_tools_whose_schemas_no_client_could_read(
    caplog: pytest.LogCaptureFixture,
) -> None:
    runtime = make_runtime(
        json_tool("echo"),
        deep_schema_tool("deepest", parameters=DEEPEST_LISTED_SCHEMA),
        deep_schema_tool("deeper", parameters=DEEPEST_LISTED_SCHEMA + 1),
        # Not an object: listed wrapped in {"properties": {"result": ...}}, two levels more.
        deep_schema_tool("deepest_output", output=DEEPEST_LISTED_SCHEMA - 2),
        deep_schema_tool("deep_output", output=DEEPEST_LISTED_SCHEMA - 1),
    )
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            (base,) = await nursery.start(serve_http, runtime, "127.0.0.1", 0)
            async with Client(base + "/mcp", mode="legacy") as client:
                first = [tool.name for tool in (await client.list_tools()).tools]
                second = [tool.name for tool in (await client.list_tools()).tools]
                refused = await client.call_tool("deeper", {"x": []})
                echoed = await client.call_tool("echo", {"x": 1})
            nursery.cancel_scope.cancel()
    assert first == second == ["echo", "deepest", "deepest_output"]
    assert not echoed.is_error
    too_deep = f"nests more than {DEEPEST_LISTED_SCHEMA} levels deep, deeper than an MCP client can read"
    # Once per tool, not at every tools/list.
    assert [record.getMessage() for record in caplog.records if "left out" in record.getMessage()] == [
        f'MCP: tool "deeper" is left out of tools/list: its parameter schema {too_deep}',
        'MCP: tool "deep_output" is left out of tools/list: its output schema nests more than '
        f"{DEEPEST_LISTED_SCHEMA - 2} levels deep, deeper than an MCP client can read",
    ]
    assert refused.is_error
    assert [block.text for block in refused.content] == [  # type: ignore[union-attr]
        f'Error: tool "deeper" is not served over MCP: its parameter schema {too_deep}'
    ]
    assert refused.meta is not None
    assert refused.meta["dsh/error"] == {"code": "UNSUPPORTED_SCHEMA", "name": "McpSchemaTooDeep", "plugin": None}


async def test_serve_registry_checks_each_tools_schema_depth_once_until_the_registry_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dsh_core import _mcp_server

    checked: list[str] = []
    check = _mcp_server.mcp_listing_problem

    def counted(schema: Any, definition: Any) -> str | None:
        checked.append(schema.name)
        return check(schema, definition)

    monkeypatch.setattr(_mcp_server, "mcp_listing_problem", counted)
    runtime = make_runtime(json_tool("echo"))
    too_deep = runtime.register(deep_schema_tool("deeper", parameters=DEEPEST_LISTED_SCHEMA + 1))
    async with Client(serve_registry(runtime), mode="legacy") as client:
        assert [tool.name for tool in (await client.list_tools()).tools] == ["echo"]
        for _ in range(5):
            assert not (await client.call_tool("echo", {"x": 1})).is_error
            assert (await client.call_tool("deeper", {"x": []})).is_error
        assert [tool.name for tool in (await client.list_tools()).tools] == ["echo"]
        assert sorted(checked) == ["deeper", "echo"]  # the walk of a schema is done once per tool
        # A tool registered again under the same name may have another schema: its verdict is redone.
        too_deep()
        runtime.register(deep_schema_tool("deeper", parameters=3))
        checked.clear()
        served = [await client.call_tool("deeper", {"x": "shallow now"}) for _ in range(3)]
        assert [result.is_error for result in served] == [False, False, False]
        assert checked.count("deeper") == 1


async def test_serve_registry_reports_a_policy_denial_as_an_error_result() -> None:
    runtime, _ = serving_runtime(DenyDeletes())
    async with Client(serve_registry(runtime), mode="legacy") as client:
        result = await client.call_tool("delete_all", {})
    assert result.is_error
    assert [block.text for block in result.content] == ["Error: nothing is deleted here"]
    assert result.meta is not None and result.meta["dsh/error"]["code"] == "DENIED"


async def test_serve_registry_asks_through_elicitation_when_the_client_can_answer() -> None:
    runtime, _ = serving_runtime(AskFirst())
    asked: list[str] = []

    async def answer(context: Any, params: Any) -> Any:
        import mcp_types

        asked.append(params.message)
        return mcp_types.ElicitResult(action="accept", content={"allow": True})

    server = serve_registry(runtime, scope=Agent(id="mcp-test"), approval="elicit")
    async with Client(server, mode="legacy", elicitation_callback=answer) as client:
        result = await client.call_tool("guarded", {"x": 1})
    assert not result.is_error, result.content
    assert len(asked) == 1 and 'Allow the tool "guarded" to run? guarded needs a yes' in asked[0]


async def test_a_client_that_never_answers_the_approval_question_is_denied_after_the_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A client that went away (an HTTP client that dropped) held the call, and what it held, for good."""
    runtime, _ = serving_runtime(AskFirst())
    asked: list[float] = []

    async def never(context: Any, params: Any) -> Any:
        asked.append(trio.current_time())
        await trio.sleep_forever()

    server = serve_registry(runtime, scope=Agent(id="mcp-test"), approval="elicit", approval_timeout_s=30)
    async with Client(server, mode="legacy", elicitation_callback=never) as client:
        started = trio.current_time()
        result = await client.call_tool("guarded", {"x": 1})
        waited = trio.current_time() - started
    assert result.is_error and len(asked) == 1
    assert 30 <= waited < 31
    assert [block.text for block in result.content] == [
        'Error: tool "guarded" requires approval, but the MCP client gave no answer in 30 s'
    ]
    assert result.meta is not None and result.meta["dsh/error"]["code"] == "DENIED"


@pytest.mark.parametrize("timeout", [0, -1, math.inf, math.nan, "30", True])
def test_an_approval_timeout_that_is_not_a_positive_number_of_seconds_is_refused(timeout: Any) -> None:
    runtime, _ = serving_runtime(AskFirst())
    with pytest.raises(ValueError, match="approval_timeout_s must be a positive finite number of seconds"):
        serve_registry(runtime, approval="elicit", approval_timeout_s=timeout)


async def test_the_elicited_question_shows_the_declared_effects_and_undo() -> None:
    runtime, _ = serving_runtime(AskFirst())
    agent = Agent(id="mcp-test")
    runtime.register(
        json_tool("guarded_write", effects=ToolEffects(destructive=True), revert=lambda args, value: None), agent
    )
    asked: list[str] = []

    async def answer(context: Any, params: Any) -> Any:
        import mcp_types

        asked.append(params.message)
        return mcp_types.ElicitResult(action="decline")

    server = serve_registry(runtime, scope=agent, approval="elicit")
    async with Client(server, mode="legacy", elicitation_callback=answer) as client:
        await client.call_tool("guarded", {})
        await client.call_tool("guarded_write", {"path": "a"})
    assert "Effects" not in asked[0] and "undone" not in asked[0]  # the plain tool declares nothing
    assert asked[1].splitlines()[1] == "Effects: destructive; can be undone"


async def test_the_elicited_question_shows_control_characters_as_escapes() -> None:
    """The client shows the question to a person: arguments must not reorder or restyle it."""

    class AskWithAHostileReason:
        @hookimpl
        async def dsh_pre_execute(self, execution: Any, next: Callable[[], Awaitable[Any]]) -> Any:
            return Ask("because\u202e\x1b[2J\nfake line")

    runtime, _ = serving_runtime(AskWithAHostileReason())
    asked: list[str] = []

    async def answer(context: Any, params: Any) -> Any:
        import mcp_types

        asked.append(params.message)
        return mcp_types.ElicitResult(action="decline")

    server = serve_registry(runtime, scope=Agent(id="mcp-test"), approval="elicit")
    async with Client(server, mode="legacy", elicitation_callback=answer) as client:
        await client.call_tool("guarded", {"x": "a\u202eb\x9b31m\u2028c"})
    (message,) = asked
    assert message == (
        'Allow the tool "guarded" to run? because\\u202e\\x1b[2J\\x0afake line\n'
        'Arguments: {"x": "a\\u202eb\\u009b31m\\u2028c"}'
    )


async def test_the_elicited_question_cuts_a_huge_reason_short() -> None:
    class AskWithAHugeReason:
        @hookimpl
        async def dsh_pre_execute(self, execution: Any, next: Callable[[], Awaitable[Any]]) -> Any:
            return Ask("r" * 1_000_000)

    runtime, _ = serving_runtime(AskWithAHugeReason())
    asked: list[str] = []

    async def answer(context: Any, params: Any) -> Any:
        import mcp_types

        asked.append(params.message)
        return mcp_types.ElicitResult(action="decline")

    server = serve_registry(runtime, scope=Agent(id="mcp-test"), approval="elicit")
    async with Client(server, mode="legacy", elicitation_callback=answer) as client:
        await client.call_tool("guarded", {})
    (message,) = asked
    assert message == f'Allow the tool "guarded" to run? {"r" * 2000}… (998000 more characters not shown)\nArguments: {{}}'


async def test_serve_registry_denies_an_ask_it_is_not_allowed_to_put_to_the_client() -> None:
    runtime, _ = serving_runtime(AskFirst())
    server = serve_registry(runtime, scope=Agent(id="mcp-test"), approval="deny")
    async with Client(server, mode="legacy") as client:
        result = await client.call_tool("guarded", {})
    assert result.is_error
    assert result.content[0].text == 'Error: tool "guarded" requires approval, and this MCP server does not ask for it'


class _AsksForSubThenBlocksTheRun:
    @hookimpl
    async def dsh_pre_execute(self, execution: ToolExecution, next: Callable[[], Awaitable[Any]]) -> Any:
        return Ask("sub needs a yes") if execution.name == "sub" else await next()

    @hookimpl
    async def dsh_post_execute(self, execution: ToolExecution, result: Any, next: Callable[[], Awaitable[Any]]) -> Any:
        if execution.name == "run_code":
            return Block("the program output is too large: narrow the query")
        return await next()


async def test_a_sub_calls_approval_denial_does_not_replace_the_requests_own_failure() -> None:
    """The denial of a run_code program's sub-call stood in for a later Block's feedback."""
    from dsh_core.code_mode import CodeRunResult
    from dsh_core.testing import FakeCodeRuntime

    async def program(tools: Any) -> CodeRunResult:
        with contextlib.suppress(Exception):
            await tools["sub"]({})
        return CodeRunResult(value="fine", has_value=True)

    runtime = ToolRuntime(mode="code", code_runtime=FakeCodeRuntime(program))
    runtime.plugins.register(_AsksForSubThenBlocksTheRun(), name="pol")
    runtime.register(json_tool("sub"))
    async with Client(serve_registry(runtime, scope=Agent(id="a"), approval="deny"), mode="legacy") as client:
        result = await client.call_tool("run_code", {"code": "...", "description": "x"})
    assert result.is_error
    assert result.content[0].text == "the program output is too large: narrow the query"
    assert result.meta == {"dsh/error": {"code": "DENIED", "name": "PostExecuteBlock", "plugin": "pol"}}


async def test_serve_registry_applies_the_hosts_standing_grants_before_asking_the_client() -> None:
    from dsh_plugins.approval import NonInteractiveApproval
    from dsh_plugins.grants import GrantBook, GrantingApproval

    runtime, _ = serving_runtime(AskFirst())
    book = GrantBook()
    book.grant("guarded", agent="mcp-test", arguments={"x": 1}, granted_by="ops")
    runtime.approval = GrantingApproval(NonInteractiveApproval(), book)
    server = serve_registry(runtime, scope=Agent(id="mcp-test"), approval="deny")
    async with Client(server, mode="legacy") as client:
        granted = await client.call_tool("guarded", {"x": 1})
        other = await client.call_tool("guarded", {"x": 2})
    assert not granted.is_error, granted.content
    assert other.is_error  # no grant covers it, and this server does not ask
    assert other.content[0].text.endswith("and this MCP server does not ask for it")
    assert book.grants()[0].uses == 1


async def test_a_cancelled_mcp_request_cancels_the_call_signal() -> None:
    recorder = Recorder()
    runtime, seen = serving_runtime(recorder)
    async with Client(serve_registry(runtime), mode="legacy") as client:
        with trio.move_on_after(0.3):
            await client.call_tool("wait", {})
        await eventually(lambda: bool(recorder.results))
    execution, result = recorder.results[0]
    assert result.code == "ABORTED"
    assert execution.signal.cancelled and execution.signal.reason == "the MCP client cancelled the request"
    assert seen == ["wait cancelled"]


async def test_serve_registry_gives_calls_ids_unique_across_processes() -> None:
    # The effect ledger remembers calls by id across sessions: a second serve-mcp
    # process must not hand out the ids the first one did.
    recorder = Recorder()
    runtime, _ = serving_runtime(recorder)
    async with Client(serve_registry(runtime), mode="legacy") as client:
        await client.call_tool("add", {"a": 1, "b": 2})
        await client.call_tool("add", {"a": 3, "b": 4})
    first, second = (execution.call_id for execution, _ in recorder.results)
    assert re.fullmatch(r"mcp-[0-9a-f]{12}-\d+", first), first
    prefix = first.rsplit("-", 1)[0]
    assert second == f"{prefix}-{int(first.rsplit('-', 1)[1]) + 1}"  # one process: one prefix, counted

    code = "from dsh_core._mcp_server import _next_call_id; print(_next_call_id())"
    with trio.fail_after(30):
        other = await trio.run_process([sys.executable, "-c", code], capture_stdout=True, cwd=str(REPO))
    other_id = other.stdout.decode().strip()
    assert re.fullmatch(r"mcp-[0-9a-f]{12}-1", other_id), other_id
    assert not other_id.startswith(prefix)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_serve_registry_advertises_that_its_tool_list_can_change() -> None:
    runtime, _ = serving_runtime()
    async with Client(serve_registry(runtime), mode="legacy") as client:
        in_memory = client.server_capabilities.tools
    async with trio.open_nursery() as nursery:
        (base,) = await nursery.start(serve_http, runtime, "127.0.0.1", 0)
        async with Client(base + "/mcp", mode="legacy") as client:
            over_http = client.server_capabilities.tools
        nursery.cancel_scope.cancel()
    assert in_memory is not None and in_memory.list_changed is True
    assert over_http is not None and over_http.list_changed is True


async def test_serve_mcp_enters_the_plugins_lifespans_in_registration_order() -> None:
    from dsh_core._mcp_server import plugin_lifespans

    log: list[str] = []

    class Owning:
        def __init__(self, name: str) -> None:
            self.name = name

        @contextlib.asynccontextmanager
        async def dsh_lifespan(self) -> AsyncIterator[None]:
            log.append(f"enter {self.name}")
            yield
            log.append(f"exit {self.name}")

    runtime = ToolRuntime()
    names = [f"owner-{n}" for n in range(16)]  # a set of 16 plugins would iterate in another order
    for name in names:
        runtime.plugins.register(Owning(name), name=name)
    async with plugin_lifespans(runtime):
        log.append("serving")
    assert log == [*(f"enter {name}" for name in names), "serving", *(f"exit {name}" for name in reversed(names))]


async def test_serve_http_answers_an_sdk_client_on_loopback() -> None:
    runtime, _ = serving_runtime()
    async with trio.open_nursery() as nursery:
        (base,) = await nursery.start(serve_http, runtime, "127.0.0.1", 0)
        assert base.startswith("http://127.0.0.1:")
        async with Client(base + "/mcp", mode="auto") as client:
            result = await client.call_tool("add", {"a": 1, "b": 2})
        nursery.cancel_scope.cancel()
    assert result.structured_content == {"result": 3}


async def test_serve_stdio_runs_as_a_subprocess(tmp_path: Path) -> None:
    script = tmp_path / "serve.py"
    script.write_text(
        textwrap.dedent(
            """
            from dsh_core._mcp_server import run_serve_mcp
            from dsh_core.testing import json_tool, make_runtime

            async def shout(args):
                return args["text"].upper()

            runtime = make_runtime(json_tool("shout", shout, parameters={"text": {"type": "string"}}, output={"type": "string"}))
            run_serve_mcp(runtime, http=False, port=0, agent="stdio-test")
            """
        )
    )
    from mcp import StdioServerParameters

    params = StdioServerParameters(command=sys.executable, args=[str(script)], cwd=str(REPO))
    with trio.fail_after(60):
        async with Client(params, mode="legacy") as client:
            result = await client.call_tool("shout", {"text": "over stdio"})
    assert result.structured_content == {"result": "OVER STDIO"}


if __name__ == "__main__":
    build_test_server().run()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_round_trip_client_plugin_over_serve_http() -> None:
    served, _ = serving_runtime(DenyDeletes())
    runtime = ToolRuntime()
    async with trio.open_nursery() as nursery:
        (base,) = await nursery.start(serve_http, served, "127.0.0.1", 0)
        config = {"servers": [{"name": "loop", "url": base + "/mcp", "prefix": "loop"}]}
        async with McpClientPlugin.connect(runtime, config):
            assert {"loop__add", "loop__delete_all"} <= set(runtime.names())
            added = await runtime.execute(make_input("loop__add", {"a": 20, "b": 22}))
            denied = await runtime.execute(make_input("loop__delete_all"))
        nursery.cancel_scope.cancel()
    assert added.value == {"result": 42}
    assert denied.code == "TOOL_ERROR" and denied.error.message == "nothing is deleted here"


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_an_http_server_dying_mid_call_is_reported_as_died(tmp_path: Path) -> None:
    # The HTTP transport stands in for the lost response with a -32000 error of its
    # own; unlike a server's -32000 answer, that one means the server is gone.
    script = tmp_path / "serve_http.py"
    script.write_text(
        textwrap.dedent(
            """
            import trio
            from dsh_core._mcp_server import serve_http
            from dsh_core.testing import json_tool, make_runtime

            async def wait(args):
                print("started", flush=True)
                await trio.sleep(60)
                return "waited"

            async def main():
                runtime = make_runtime(json_tool("wait", wait, output={"type": "string"}))
                async with trio.open_nursery() as nursery:
                    (base,) = await nursery.start(serve_http, runtime, "127.0.0.1", 0)
                    print(base, flush=True)

            trio.run(main)
            """
        )
    )
    runtime = ToolRuntime()
    with trio.fail_after(60):
        process = await trio.lowlevel.open_process(
            [sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=str(REPO)
        )
        assert process.stdout is not None
        lines = line_reader(process.stdout)
        try:
            base = await lines()
            config = {"servers": [{"name": "web", "url": base + "/mcp"}]}
            async with McpClientPlugin.connect(runtime, config), trio.open_nursery() as nursery:
                results: list[Any] = []

                async def call() -> None:
                    results.append(await runtime.execute(make_input("wait", {"x": 1})))

                nursery.start_soon(call)
                assert await lines() == "started"
                process.kill()
        finally:
            process.kill()
            await process.wait()
    died = results[0]
    assert died.code == MCP_SERVER_DIED, died.error.message
    assert died.error.message == 'MCP server "web" died during the call to "wait"; it is restarted on the next call'


def line_reader(stream: trio.abc.ReceiveStream) -> Callable[[], Awaitable[str]]:
    """Read ``stream`` a line at a time."""
    buffer = bytearray()

    async def next_line() -> str:
        while b"\n" not in buffer:
            chunk = await stream.receive_some()
            if not chunk:
                raise EOFError("the stream ended before a full line")
            buffer.extend(chunk)
        line, _, rest = bytes(buffer).partition(b"\n")
        buffer[:] = rest
        return line.decode().strip()

    return next_line


async def test_cli_serve_mcp_over_stdio_runs_the_pipeline() -> None:
    from mcp import StdioServerParameters

    # The example tools come through entry points; the example policy's workspace
    # guard denies a path escaping the workspace, and the denial reaches the client.
    params = StdioServerParameters(command=sys.executable, args=["-m", "dsh_core._cli", "serve-mcp"], cwd=str(REPO))
    with trio.fail_after(60):
        async with Client(params, mode="legacy") as client:
            names = {tool.name for tool in (await client.list_tools()).tools}
            allowed = await client.call_tool("calc", {"op": "add", "a": 1, "b": 2})
            denied = await client.call_tool("read_file", {"path": "../../../etc/passwd"})
    assert {"calc", "read_file"} <= names
    assert allowed.is_error is False
    assert denied.is_error is True
    assert "outside the workspace" in denied.content[0].text  # type: ignore[union-attr]


ASKING_PLUGIN = """
from dsh_core import Ask, define_tool, hookimpl

async def _echo(args):
    return args

class AskFirst:
    @hookimpl
    async def dsh_pre_execute(self, execution, next):
        return Ask("needs a yes")

@hookimpl
def dsh_setup(runtime, config):
    runtime.register(define_tool(name="guarded", description="", parameters={}, output={"type": "json"}, execute=_echo))
    runtime.plugins.register(AskFirst(), name="ask-first")
"""


async def test_cli_serve_mcp_without_agent_asks_the_client_as_the_cli_agent(tmp_path: Path) -> None:
    """An Ask needs an agent to be routed; without --agent, serve-mcp's calls act as the agent "cli"."""
    from mcp import StdioServerParameters

    (tmp_path / "asking_plugin.py").write_text(ASKING_PLUGIN)
    asked: list[str] = []

    async def answer(context: Any, params: Any) -> Any:
        asked.append(params.message)
        return mcp_types.ElicitResult(action="accept", content={"allow": True})

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(tmp_path)])}
    args = ["-m", "dsh_core._cli", "--no-plugins", "--plugin", "asking=asking_plugin", "serve-mcp"]
    params = StdioServerParameters(command=sys.executable, args=args, cwd=str(tmp_path), env=env)
    with trio.fail_after(60):
        async with Client(params, mode="legacy", elicitation_callback=answer) as client:
            result = await client.call_tool("guarded", {"x": 1})
    assert not result.is_error, result.content
    assert result.structured_content == {"result": {"x": 1}}
    assert len(asked) == 1 and asked[0].startswith('Allow the tool "guarded" to run? needs a yes')


# -- serve-mcp over stdio: lines the SDK cannot parse ----------------------------------------------

DEEP_ARRAY_TEXT = "[" * 250 + "]" * 250
TOO_DEEP = "Parse error: the message nests more than 200 levels deep, deeper than this server reads"
LONE_SURROGATE = (
    "Parse error: a string in the message holds a lone surrogate (\\ud800-\\udfff outside a pair), which is not text"
)


def parse_error(request_id: Any, message: str, code: int = -32700) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "error": {"code": code, "message": message}}


class _Lines:
    """A read stream of what the SDK's stdio transport makes of each line: a message or its parse error."""

    def __init__(self, *lines: str) -> None:
        from mcp.shared.message import SessionMessage

        self.items: list[Any] = []
        for line in lines:
            try:
                self.items.append(SessionMessage(mcp_types.jsonrpc_message_adapter.validate_json(line, by_name=False)))
            except Exception as exc:
                self.items.append(exc)

    async def receive(self) -> Any:
        if not self.items:
            raise anyio.EndOfStream
        return self.items.pop(0)

    async def aclose(self) -> None:
        pass


class _Sent:
    def __init__(self) -> None:
        self.messages: list[dict[str, Any]] = []

    async def send(self, item: Any) -> None:
        self.messages.append(item.message.model_dump(by_alias=True, mode="json", exclude_unset=True))


def request_line(request_id: str, method: str, params: str) -> str:
    """A JSON-RPC request line; ``request_id`` and ``params`` are JSON text."""
    return '{"jsonrpc":"2.0","id":' + request_id + ',"method":"' + method + '","params":' + params + "}"


DEEP_PARAMS = '{"a":' + DEEP_ARRAY_TEXT + "}"
NOT_JSON_RPC = "Invalid request: not a JSON-RPC 2.0 message"
UNUSABLE_ID = (
    "Invalid request: the '%s' request has no id this server can answer under "
    "(a request id must be a string or an integer)"
)
LONG_INTEGER = "Parse error: the message holds an integer of 5000 digits, longer than the 4300 digits accepted"


@pytest.mark.parametrize(
    ("line", "answer"),
    [
        (request_line("7", "tools/call", DEEP_PARAMS), parse_error(7, TOO_DEEP)),
        (request_line('"abc"', "ping", DEEP_PARAMS), parse_error("abc", TOO_DEEP)),
        (request_line("8", "tools/call", '{"s":"a\\ud800b"}'), parse_error(8, LONE_SURROGATE)),
        # No answer could carry an id holding a lone surrogate back: JSON-RPC's null stands for it.
        (request_line('"\\ud800"', "ping", "{}"), parse_error(None, LONE_SURROGATE)),
        (request_line("true", "ping", DEEP_PARAMS), parse_error(None, TOO_DEEP)),
        ("not json", parse_error(None, "Parse error: the message is not JSON")),
        (DEEP_ARRAY_TEXT, parse_error(None, TOO_DEEP)),
        ('{"jsonrpc":"2.0","id":9,"method":5}', parse_error(9, NOT_JSON_RPC, code=-32600)),
        ("[1, 2]", parse_error(None, NOT_JSON_RPC, code=-32600)),
        # JSON-RPC answers no notification, whatever is wrong with it (a response: see below).
        ('{"jsonrpc":"2.0","method":"notifications/cancelled","params":' + DEEP_PARAMS + "}", None),
        ("   ", None),
        # Valid JSON Python will not convert by default: the request is answered under its id.
        (request_line("11", "tools/call", '{"a":' + "9" * 5000 + "}"), parse_error(11, LONG_INTEGER)),
        (request_line("9" * 5000, "ping", "{}"), parse_error(None, LONG_INTEGER)),
        # The SDK takes only string and integer ids: it read these as notifications, unanswered.
        (request_line("1.0", "tools/call", '{"name":"echo"}'), parse_error(None, UNUSABLE_ID % "tools/call", code=-32600)),
        (request_line("1e3", "ping", "{}"), parse_error(None, UNUSABLE_ID % "ping", code=-32600)),
        (request_line("null", "ping", "{}"), parse_error(None, UNUSABLE_ID % "ping", code=-32600)),
        (request_line('{"a":1}', "tools/list", "{}"), parse_error(None, UNUSABLE_ID % "tools/list", code=-32600)),
        ('{"jsonrpc":"2.0","method":"ping"}', parse_error(None, UNUSABLE_ID % "ping", code=-32600)),
        ('{"jsonrpc":"2.0","method":"notifications/initialized"}', "passed on"),
    ],
    ids=[
        "too-deep",
        "too-deep-string-id",
        "lone-surrogate",
        "lone-surrogate-id",
        "too-deep-bool-id",
        "not-json",
        "too-deep-not-an-object",
        "not-json-rpc",
        "not-an-object",
        "notification",
        "blank",
        "long-integer",
        "long-integer-id",
        "float-id",
        "exponent-id",
        "null-id",
        "object-id",
        "request-without-id",
        "real-notification",
    ],
)
async def test_an_unreadable_line_is_answered_with_its_id_and_the_next_message_still_read(
    line: str, answer: dict[str, Any] | str | None
) -> None:
    from dsh_core._mcp_unreadable import answering_unreadable

    sent = _Sent()
    stream, _ = answering_unreadable(_Lines(line, '{"jsonrpc":"2.0","id":10,"method":"ping"}'), sent)  # type: ignore[arg-type]
    if answer == "passed on":
        assert isinstance((await stream.receive()).message, mcp_types.JSONRPCNotification)  # type: ignore[union-attr]
        answer = None
    following = await stream.receive()
    assert following.message == mcp_types.JSONRPCRequest(jsonrpc="2.0", id=10, method="ping")  # type: ignore[union-attr]
    assert sent.messages == ([answer] if answer is not None else [])


UNREAD_TOO_DEEP = "its answer could not be read: the message nests more than 200 levels deep, deeper than this server reads"
UNREAD_NOT_JSON_RPC = "its answer could not be read: not a JSON-RPC 2.0 message"


@pytest.mark.parametrize(
    ("line", "failure"),
    [
        ('{"jsonrpc":"2.0","id":3,"result":' + DEEP_PARAMS + "}", parse_error(3, UNREAD_TOO_DEEP)),
        (
            '{"jsonrpc":"2.0","id":3,"result":{"action":"accept","content":{"note":"\\ud800"}}}',
            parse_error(3, "its answer could not be read: " + LONE_SURROGATE.removeprefix("Parse error: ")),
        ),
        ('{"jsonrpc":"2.0","id":3,"result":5}', parse_error(3, UNREAD_NOT_JSON_RPC, code=-32600)),
        (
            '{"jsonrpc":"2.0","id":3,"result":{"action":"accept","content":{"n":' + "9" * 5000 + "}}}",
            parse_error(3, "its answer could not be read: " + LONG_INTEGER.removeprefix("Parse error: ")),
        ),
    ],
    ids=["too-deep", "lone-surrogate", "not-json-rpc", "long-integer"],
)
async def test_an_unreadable_response_fails_the_request_it_answers(line: str, failure: dict[str, Any]) -> None:
    """JSON-RPC answers no response; but the server's request it answers must not wait forever."""
    from dsh_core._mcp_unreadable import answering_unreadable

    sent = _Sent()
    stream, _ = answering_unreadable(_Lines(line, '{"jsonrpc":"2.0","id":10,"method":"ping"}'), sent)  # type: ignore[arg-type]
    failed = await stream.receive()
    following = await stream.receive()
    assert failed.message.model_dump(by_alias=True, mode="json", exclude_unset=True) == failure  # type: ignore[union-attr]
    assert following.message == mcp_types.JSONRPCRequest(jsonrpc="2.0", id=10, method="ping")  # type: ignore[union-attr]
    assert sent.messages == []  # nothing answers a response


async def test_an_unreadable_response_without_a_usable_id_fails_every_unanswered_request() -> None:
    from mcp.shared.message import SessionMessage

    from dsh_core._mcp_unreadable import answering_unreadable

    lines = _Lines(
        '{"jsonrpc":"2.0","id":2,"result":{}}',
        '{"jsonrpc":"2.0","id":"\\ud800","result":' + DEEP_PARAMS + "}",
        '{"jsonrpc":"2.0","id":10,"method":"ping"}',
    )
    sent = _Sent()
    stream, writable = answering_unreadable(lines, sent)  # type: ignore[arg-type]
    for request_id in (1, 2, 3):
        await writable.send(SessionMessage(mcp_types.JSONRPCRequest(jsonrpc="2.0", id=request_id, method="ping")))
    answered = await stream.receive()
    failures = [await stream.receive(), await stream.receive()]
    following = await stream.receive()
    assert answered.message == mcp_types.JSONRPCResponse(jsonrpc="2.0", id=2, result={})  # type: ignore[union-attr]
    assert [failure.message.model_dump(by_alias=True, mode="json", exclude_unset=True) for failure in failures] == [  # type: ignore[union-attr]
        parse_error(1, UNREAD_TOO_DEEP),
        parse_error(3, UNREAD_TOO_DEEP),
    ]
    assert following.message == mcp_types.JSONRPCRequest(jsonrpc="2.0", id=10, method="ping")  # type: ignore[union-attr]
    assert [message["id"] for message in sent.messages] == [1, 2, 3]  # the requests, and no answer


@contextlib.asynccontextmanager
async def serving_stdio(
    tmp_path: Path, script_text: str, capabilities: dict[str, Any] | None = None
) -> AsyncIterator[tuple[trio.abc.SendStream, Callable[[], Awaitable[str]]]]:
    """``script_text`` run as a serve-mcp stdio process, initialized: its stdin and a line reader."""
    script = tmp_path / "serve.py"
    script.write_text(script_text)
    # The code under test, not whatever copy the environment would import.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    process = await trio.lowlevel.open_process(
        [sys.executable, str(script)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=str(tmp_path),
        env=env,
    )
    assert process.stdin is not None and process.stdout is not None
    lines = line_reader(process.stdout)
    try:
        initialize = {
            "protocolVersion": "2025-06-18",
            "capabilities": capabilities or {},
            "clientInfo": {"name": "t", "version": "1"},
        }
        request = {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": initialize}
        await process.stdin.send_all(json.dumps(request).encode() + b"\n")
        await lines()
        await process.stdin.send_all(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
        yield process.stdin, lines
    finally:
        process.kill()
        await process.wait()


SERVE_DEEP_SCRIPT = """
from dsh_core._mcp_server import run_serve_mcp
from dsh_core.testing import json_tool, make_runtime

async def deep(args):
    value = "leaf"
    for _ in range(args["depth"]):
        value = [value]
    return {"v": value}

depth = {"depth": {"type": "integer", "required": True}}
runtime = make_runtime(json_tool("echo"), json_tool("deep", deep, parameters=depth))
run_serve_mcp(runtime, http=False, port=0, agent=None)
"""


async def test_serve_stdio_answers_the_requests_the_sdk_cannot_parse(tmp_path: Path) -> None:
    def call(request_id: Any, name: str, arguments: str) -> str:
        return request_line(
            json.dumps(request_id), "tools/call", '{"name":"' + name + '","arguments":' + arguments + "}"
        )

    with trio.fail_after(60):
        async with serving_stdio(tmp_path, SERVE_DEEP_SCRIPT) as (stdin, lines):

            async def ask(line: str) -> Any:
                await stdin.send_all(line.encode() + b"\n")
                return json.loads(await lines())

            assert await ask(call(1, "echo", DEEP_PARAMS)) == parse_error(1, TOO_DEEP)
            assert await ask(call("two", "echo", '{"s":"a\\ud800b"}')) == parse_error("two", LONE_SURROGATE)
            assert await ask("not json") == parse_error(None, "Parse error: the message is not JSON")
            # A notification is not answered: the next line answers the next request.
            await stdin.send_all(
                ('{"jsonrpc":"2.0","method":"notifications/x","params":' + DEEP_PARAMS + "}\n").encode()
            )
            echoed = await ask(call(3, "echo", '{"x":1}'))
            assert echoed["id"] == 3 and echoed["result"]["structuredContent"] == {"result": {"x": 1}}

            # The deepest result serve-mcp sends as structured content is one an SDK client reads.
            await stdin.send_all(call(4, "deep", json.dumps({"depth": DEEPEST_RESULT_LIST})).encode() + b"\n")
            deepest = mcp_types.jsonrpc_message_adapter.validate_json(await lines(), by_name=False)
            assert isinstance(deepest, mcp_types.JSONRPCResponse) and deepest.id == 4
            assert deepest.result["structuredContent"] == {"result": {"v": nested_list(DEEPEST_RESULT_LIST)}}
            deeper = await ask(call(5, "deep", json.dumps({"depth": DEEPEST_RESULT_LIST + 1})))
            assert deeper["result"]["isError"] is True and "structuredContent" not in deeper["result"]


SERVE_ASK_SCRIPT = """
from dsh_core import Ask, hookimpl
from dsh_core._mcp_server import run_serve_mcp
from dsh_core.testing import json_tool, make_runtime

class AskFirst:
    @hookimpl
    async def dsh_pre_execute(self, execution, next):
        return Ask("needs a yes")

runtime = make_runtime(json_tool("guarded"), plugins=[AskFirst()])
run_serve_mcp(runtime, http=False, port=0, agent="someone")
"""


async def test_serve_stdio_answers_a_call_whose_approval_answer_it_cannot_read(tmp_path: Path) -> None:
    with trio.fail_after(60):
        async with serving_stdio(tmp_path, SERVE_ASK_SCRIPT, {"elicitation": {}}) as (stdin, lines):
            call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "guarded", "arguments": {}}}
            await stdin.send_all(json.dumps(call).encode() + b"\n")
            asked = json.loads(await lines())
            assert asked["method"] == "elicitation/create"
            answer = '{"jsonrpc":"2.0","id":%s,"result":{"action":"accept","content":{"allow":true,"note":"\\ud800"}}}'
            await stdin.send_all((answer % json.dumps(asked["id"])).encode() + b"\n")
            answered = json.loads(await lines())
    assert answered["id"] == 2
    assert answered["result"]["isError"] is True
    assert answered["result"]["content"] == [
        {
            "type": "text",
            "text": 'Error: tool "guarded" requires approval, but asking the MCP client failed: its answer could '
            "not be read: a string in the message holds a lone surrogate (\\ud800-\\udfff outside a pair), which is "
            "not text",
        }
    ]


# -- serve-mcp: strings UTF-8 cannot carry -----------------------------------------------------------

# Lone surrogates (a file read with surrogateescape gives them) in what the served tools return and
# declare; written as escapes, so that the script's source holds them as Python string escapes.
SERVE_SURROGATES_SCRIPT = r"""
from dsh_core import define_tool
from dsh_core._mcp_server import run_serve_mcp
from dsh_core.testing import json_tool, make_runtime

async def lone(args):
    return "a\ud800b"

async def split_pair(args):
    return "\ud83d" + "\ude00"

async def deep(args):
    value = "a\udc80b"
    for _ in range(args["depth"]):
        value = [value]
    return {"v": value, "k\udcff": 1}

async def quiet(args):
    return None

runtime = make_runtime(
    json_tool("echo"),
    json_tool("lone", lone, output={"type": "string"}),
    json_tool("split_pair", split_pair, output={"type": "string"}),
    json_tool("deep", deep, parameters={"depth": {"type": "integer", "required": True}}),
    define_tool(name="odd", description="reads \udcff bytes", parameters={}, output={"type": "json"}, execute=quiet),
)
run_serve_mcp(runtime, http=False, port=0, agent=None)
"""


async def test_serve_stdio_sends_lone_surrogates_as_replacement_characters_and_keeps_serving(
    tmp_path: Path,
) -> None:
    def call(request_id: int, name: str, arguments: dict[str, Any]) -> str:
        params = {"name": name, "arguments": arguments}
        return json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params})

    with trio.fail_after(60):
        async with serving_stdio(tmp_path, SERVE_SURROGATES_SCRIPT) as (stdin, lines):

            async def ask(line: str) -> Any:
                await stdin.send_all(line.encode() + b"\n")
                # What an SDK client reads, not only what json.loads accepts.
                message = mcp_types.jsonrpc_message_adapter.validate_json(await lines(), by_name=False)
                return message.model_dump(by_alias=True, mode="json", exclude_unset=True)

            listed = await ask('{"jsonrpc":"2.0","id":1,"method":"tools/list"}')
            descriptions = {tool["name"]: tool["description"] for tool in listed["result"]["tools"]}
            assert descriptions["odd"] == "reads \ufffd bytes"
            assert set(descriptions) == {"echo", "lone", "split_pair", "deep", "odd"}

            lone = await ask(call(2, "lone", {}))
            assert lone["id"] == 2
            assert lone["result"]["content"] == [{"type": "text", "text": "a\ufffdb"}]
            assert lone["result"]["structuredContent"] == {"result": "a\ufffdb"}

            echoed = await ask(call(3, "echo", {"x": 1}))
            assert echoed["id"] == 3 and echoed["result"]["structuredContent"] == {"result": {"x": 1}}

            # The two halves of a pair, apart in the string's code points, are sent as the one character.
            paired = await ask(call(4, "split_pair", {}))
            assert paired["result"]["structuredContent"] == {"result": "\U0001f600"}

            value: Any = "a\ufffdb"
            for _ in range(DEEPEST_RESULT_LIST - 1):
                value = [value]
            deepest = await ask(call(5, "deep", {"depth": DEEPEST_RESULT_LIST - 1}))
            assert deepest["id"] == 5 and deepest["result"]["isError"] is False
            assert deepest["result"]["structuredContent"] == {"result": {"v": value, "k\ufffd": 1}}


class _Written:
    """A write stream that keeps what it is sent."""

    def __init__(self) -> None:
        self.items: list[Any] = []

    async def send(self, item: Any) -> None:
        self.items.append(item)


async def test_sending_well_formed_rebuilds_only_the_messages_utf8_cannot_carry() -> None:
    from mcp.shared.message import ServerMessageMetadata, SessionMessage

    from dsh_core._mcp_well_formed import sending_well_formed

    deep: Any = "a\udc00b"
    for _ in range(DEEPEST_RESULT_LIST):
        deep = [deep]
    fine = SessionMessage(mcp_types.JSONRPCResponse(jsonrpc="2.0", id=1, result={"text": "caf\xe9 \U0001f600"}))
    error = SessionMessage(
        mcp_types.JSONRPCError(jsonrpc="2.0", id=2, error=mcp_types.ErrorData(code=0, message="no \ud800 here")),
        metadata=ServerMessageMetadata(related_request_id=2),
    )
    request = SessionMessage(
        mcp_types.JSONRPCRequest(jsonrpc="2.0", id=3, method="elicitation/create", params={"message": deep})
    )
    written = _Written()
    stream = sending_well_formed(written)  # type: ignore[arg-type]
    for item in (fine, error, request):
        await stream.send(item)

    assert written.items[0] is fine
    sent_error, sent_request = written.items[1:]
    assert sent_error.metadata is error.metadata
    assert sent_error.message == mcp_types.JSONRPCError(
        jsonrpc="2.0", id=2, error=mcp_types.ErrorData(code=0, message="no \ufffd here")
    )
    value: Any = "a\ufffdb"
    for _ in range(DEEPEST_RESULT_LIST):
        value = [value]
    assert sent_request.message == mcp_types.JSONRPCRequest(
        jsonrpc="2.0", id=3, method="elicitation/create", params={"message": value}
    )
    # As the SDK's stdio writer serialises them: nothing the rebuilt messages did not set appears.
    assert sent_error.message.model_dump_json(by_alias=True, exclude_unset=True) == (
        '{"jsonrpc":"2.0","id":2,"error":{"code":0,"message":"no \ufffd here"}}'
    )


def surrogate_runtime() -> ToolRuntime:
    async def lone(args: Any) -> Any:
        return {"k\udcff": "a\ud800b"}

    async def quiet(args: Any) -> None:
        return None

    odd = define_tool(
        name="odd", description="reads \udcff bytes", parameters={}, output={"type": "json"}, execute=quiet
    )
    return make_runtime(json_tool("lone", lone), odd)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_serve_http_sends_lone_surrogates_as_replacement_characters(mode: Any) -> None:
    async with trio.open_nursery() as nursery:
        (base,) = await nursery.start(serve_http, surrogate_runtime(), "127.0.0.1", 0)
        async with Client(base + "/mcp", mode=mode) as client:
            listed = {tool.name: tool.description for tool in (await client.list_tools()).tools}
            result = await client.call_tool("lone", {})
        nursery.cancel_scope.cancel()
    assert listed == {"lone": "test tool lone", "odd": "reads \ufffd bytes"}
    assert result.is_error is False
    assert result.structured_content == {"result": {"k\ufffd": "a\ufffdb"}}
    assert result.content[0].text == '{"k\ufffd": "a\ufffdb"}'  # type: ignore[union-attr]


async def test_serve_registry_answers_in_process_clients_with_lone_surrogates_replaced() -> None:
    async with Client(serve_registry(surrogate_runtime()), mode="legacy") as client:
        listed = {tool.name: tool.description for tool in (await client.list_tools()).tools}
        result = await client.call_tool("lone", {})
    assert listed["odd"] == "reads \ufffd bytes"
    assert result.structured_content == {"result": {"k\ufffd": "a\ufffdb"}}


# -- serve_http: a request whose id the SDK cannot take -------------------------------------------


class _Inner:
    """An ASGI app that records what it received."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        self.bodies.append(body)
        await send({"type": "http.response.start", "status": 202, "headers": []})
        await send({"type": "http.response.body", "body": b""})


async def _post(app: Any, *chunks: bytes) -> tuple[int, bytes]:
    messages = [{"type": "http.request", "body": chunk, "more_body": index < len(chunks) - 1} for index, chunk in enumerate(chunks)]
    sent: list[dict[str, Any]] = []

    async def receive() -> Any:
        return messages.pop(0)

    async def send(message: Any) -> None:
        sent.append(message)

    await app({"type": "http", "method": "POST", "path": "/mcp", "headers": []}, receive, send)
    return sent[0]["status"], b"".join(message.get("body", b"") for message in sent[1:])


@pytest.mark.parametrize("request_id", ["1.0", "1e3", "true", "null", '{"a":1}', "[1]", None])
async def test_over_http_a_request_with_an_unusable_id_is_answered_400_not_taken_for_a_notification(
    request_id: str | None,
) -> None:
    from dsh_core._mcp_request_ids import AnsweringUnusableIds

    inner = _Inner()
    app = AnsweringUnusableIds(inner)
    id_part = "" if request_id is None else f'"id":{request_id},'
    status, body = await _post(app, ('{"jsonrpc":"2.0",' + id_part + '"method":"tools/call","params":{}}').encode())
    assert status == 400 and inner.bodies == []
    assert json.loads(body) == {
        "jsonrpc": "2.0",
        "id": None,
        "error": {"code": -32600, "message": UNUSABLE_ID % "tools/call"},
    }


async def test_over_http_every_other_body_reaches_the_sdk_whole() -> None:
    from dsh_core._mcp_request_ids import CHECKED_BODY_BYTES, AnsweringUnusableIds

    inner = _Inner()
    app = AnsweringUnusableIds(inner)
    request = b'{"jsonrpc":"2.0","id":7,"method":"ping"}'
    notification = b'{"jsonrpc":"2.0","method":"notifications/initialized"}'
    big = b'{"jsonrpc":"2.0","id":1.0,"method":"ping","params":{"pad":"' + b"x" * CHECKED_BODY_BYTES + b'"}}'
    for chunks in ((request,), (request[:10], request[10:]), (notification,), (b"not json",), (big[:100], big[100:])):
        status, _ = await _post(app, *chunks)
        assert status == 202 and inner.bodies[-1] == b"".join(chunks)


async def test_serve_http_answers_a_request_with_an_unusable_id_instead_of_dropping_it() -> None:
    runtime, _ = serving_runtime()
    body = b'{"jsonrpc":"2.0","id":1.0,"method":"tools/call","params":{"name":"echo","arguments":{}}}'
    async with trio.open_nursery() as nursery:
        (base,) = await nursery.start(serve_http, runtime, "127.0.0.1", 0)
        host, port = base.removeprefix("http://").rsplit(":", 1)
        stream = await trio.open_tcp_stream(host, int(port))
        async with stream:
            await stream.send_all(
                b"POST /mcp HTTP/1.1\r\nHost: " + f"{host}:{port}".encode() + b"\r\n"
                b"Accept: application/json, text/event-stream\r\nContent-Type: application/json\r\n"
                b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body
            )
            response = b""
            while chunk := await stream.receive_some():
                response += chunk
        nursery.cancel_scope.cancel()
    head, _, payload = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400")
    assert json.loads(payload)["error"] == {"code": -32600, "message": UNUSABLE_ID % "tools/call"}
