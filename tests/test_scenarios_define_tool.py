"""Scenario catalogue S86-S133 (tools.spec): the schema DSL, ``ToolRuntime.get``, argument
validation, ``define_tool`` validation and error normalisation, ``timeout_ms``, presenters.

Only the scenarios the rest of the suite does not already pin live here. The original's
``validateArgs(spec, args)`` is, in this port, the compiled DSL checked at the empty root path:
``validate_json_schema_value(parameter_schema_to_json_schema(spec), args, "")`` (see ``validate_args``).
The original's type-level checks become attrs parameter classes (SPEC 2.1).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Literal

import attrs
import pytest

from dsh_core import (
    DshError,
    TextBlock,
    ToolArgsError,
    ToolDefinition,
    ToolErrorInfo,
    ToolExecutionFailure,
    ToolExecutionSuccess,
    ToolFailure,
    ToolOutput,
    ToolRunContext,
    ToolSchema,
    define_tool,
    snapshot_json,
)
from dsh_core.presentation import GenericCallView, GenericResultView
from dsh_core.schema import (
    SchemaSpecError,
    parameter_schema_to_json_schema,
    validate_json_schema_value,
)
from dsh_core.testing import make_input, make_runtime


def validate_args(spec: dict[str, Any], arguments: object) -> tuple[str, ...]:
    """The port's ``validateArgs``: compile the parameter spec, validate at the ``arguments`` root."""
    return validate_json_schema_value(parameter_schema_to_json_schema(spec), arguments, "")


def string_tool(name: str, parameters: Any, body: Any, **options: Any) -> ToolDefinition:
    """A tool with a string output rendered as one text block."""
    return define_tool(
        name=name,
        description=f"test tool {name}",
        parameters=parameters,
        output=ToolOutput(schema={"type": "string"}, render=lambda args, value: [TextBlock(value)]),
        execute=body,
        **options,
    )


def content_tool(name: str, parameters: dict[str, Any], body: Any) -> ToolDefinition:
    """The catalogue's content fixture: the value is a list of JSON text blocks, rendered one to one."""
    return define_tool(
        name=name,
        description=f"content fixture {name}",
        parameters=parameters,
        output=ToolOutput(
            schema={"type": "array", "items": {"type": "json"}},
            render=lambda args, value: [TextBlock(block["text"]) for block in value],
        ),
        execute=body,
    )


async def _none_body(args: Any) -> None:
    return None


# -- the schema DSL ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param(
            {
                "path": {"type": "string", "required": True, "description": "Absolute path"},
                "offset": {"type": "number"},
                "limit": {"type": "number", "description": "Max lines"},
            },
            {
                "type": "object",
                "properties": {
                    "path": {"type": "string", "description": "Absolute path"},
                    "offset": {"type": "number"},
                    "limit": {"type": "number", "description": "Max lines"},
                },
                "required": ["path"],
            },
            id="S86-required-and-descriptions",
        ),
        pytest.param(
            {
                "config": {
                    "type": "object",
                    "additionalProperties": True,
                    "required": True,
                    "properties": {"host": {"type": "string", "required": True}, "port": {"type": "number"}},
                }
            },
            {
                "type": "object",
                "properties": {
                    "config": {
                        "type": "object",
                        "additionalProperties": True,
                        "properties": {"host": {"type": "string"}, "port": {"type": "number"}},
                        "required": ["host"],
                    }
                },
                "required": ["config"],
            },
            id="S88-nested-object",
        ),
        pytest.param(
            {"color": {"type": "string", "enum": ["red", "green", "blue"], "description": "Color choice"}},
            {
                "type": "object",
                "properties": {
                    "color": {"type": "string", "enum": ["red", "green", "blue"], "description": "Color choice"}
                },
            },
            id="S93-enum",
        ),
        pytest.param(
            {"limit": {"type": "number", "default": 25}},
            {"type": "object", "properties": {"limit": {"type": "number", "default": 25}}},
            id="S94-default",
        ),
        pytest.param(
            {"tags": {"type": "array", "items": {"type": "string"}}},
            {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"}}}},
            id="S95-array-items",
        ),
        pytest.param(
            {"level": {"type": "string", "enum": ["low", "high"], "default": "low"}},
            {"type": "object", "properties": {"level": {"type": "string", "enum": ["low", "high"], "default": "low"}}},
            id="S96-enum-and-default",
        ),
        pytest.param(
            {
                "config": {
                    "type": "object",
                    "additionalProperties": True,
                    "properties": {"host": {"type": "string"}, "port": {"type": "number"}},
                }
            },
            {
                "type": "object",
                "properties": {
                    "config": {
                        "type": "object",
                        "additionalProperties": True,
                        "properties": {"host": {"type": "string"}, "port": {"type": "number"}},
                    }
                },
            },
            id="S99-all-optional-nested-object",
        ),
        pytest.param(
            {
                "servers": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "additionalProperties": True,
                        "properties": {"host": {"type": "string", "required": True}, "port": {"type": "number"}},
                    },
                }
            },
            {
                "type": "object",
                "properties": {
                    "servers": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "additionalProperties": True,
                            "properties": {"host": {"type": "string"}, "port": {"type": "number"}},
                            "required": ["host"],
                        },
                    }
                },
            },
            id="S102-array-of-objects",
        ),
    ],
)
def test_parameter_spec_compiles_to_the_exact_raw_schema(spec: dict[str, Any], expected: dict[str, Any]) -> None:
    """S86, S88, S93-S96, S99, S102: a parameter spec compiles to exactly this raw schema.

    Equality is exact, so a ``required`` list on an all-optional object, or a key that was not
    given (description/enum/default), fails the comparison.
    """
    assert parameter_schema_to_json_schema(spec) == expected


async def test_typed_tool_schema_is_the_compiled_form_and_the_body_gets_the_arguments() -> None:
    """S89: a DSL-typed tool projects its compiled schema and runs end to end."""

    async def body(args: Any) -> str:
        text: str = args["text"]
        return text.upper() if args.get("uppercase") else text

    runtime = make_runtime(
        string_tool(
            "typed-echo", {"text": {"type": "string", "required": True}, "uppercase": {"type": "boolean"}}, body
        )
    )
    assert runtime.schemas() == [
        ToolSchema(
            name="typed-echo",
            description="test tool typed-echo",
            parameters={
                "type": "object",
                "properties": {"text": {"type": "string"}, "uppercase": {"type": "boolean"}},
                "required": ["text"],
            },
        )
    ]
    result = await runtime.execute(make_input("typed-echo", {"text": "hello", "uppercase": True}))
    assert result == ToolExecutionSuccess(value="HELLO", content=(TextBlock("HELLO"),))


@attrs.frozen
class Required:
    a: str
    b: int | None = None


async def test_required_attrs_fields_reach_the_body_typed_and_present() -> None:
    """S90: with an attrs parameter class, a required field is non-optional and arrives typed."""
    seen: list[Required] = []

    async def body(args: Required) -> str:
        seen.append(args)
        return args.a

    tool = string_tool("typed", Required, body)
    assert tool.parameters == {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "a": {"type": "string"},
            "b": {"oneOf": [{"type": "integer"}, {"type": "null"}], "default": None},
        },
        "required": ["a"],
    }
    runtime = make_runtime(tool)
    result = await runtime.execute(make_input("typed", {"a": "x"}))
    assert result == ToolExecutionSuccess(value="x", content=(TextBlock("x"),))
    assert seen == [Required(a="x")]
    assert type(seen[0].a) is str
    missing = await runtime.execute(make_input("typed", {"b": 1}))
    assert isinstance(missing, ToolExecutionFailure)
    assert missing.error == ToolFailure(
        message='invalid arguments: missing required property "a"',
        info=ToolErrorInfo(name="ToolArgsError", code="INVALID_ARGS"),
    )
    assert len(seen) == 1


async def test_round_trip_of_a_required_and_an_optional_described_parameter() -> None:
    """S91: the schema of ``req`` + described ``opt`` and a call that omits ``opt``."""

    async def body(args: Any) -> str:
        opt = args.get("opt")
        return f"{args['req']}:{'none' if opt is None else opt}"

    tool = string_tool(
        "roundtrip",
        {"req": {"type": "string", "required": True}, "opt": {"type": "number", "description": "Optional number"}},
        body,
    )
    runtime = make_runtime(tool)
    assert runtime.schemas()[0].parameters == {
        "type": "object",
        "properties": {"req": {"type": "string"}, "opt": {"type": "number", "description": "Optional number"}},
        "required": ["req"],
    }
    result = await runtime.execute(make_input("roundtrip", {"req": "hello"}))
    assert result.content == (TextBlock("hello:none"),)


async def test_raw_json_schema_definition_is_projected_unchanged_and_runs() -> None:
    """S92: a raw ToolDefinition keeps its raw parameters in schemas() and executes."""

    async def body(args: Any, run: ToolRunContext) -> str:
        path: str = args["path"]
        return path

    raw_parameters = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}
    tool = ToolDefinition(
        name="raw-tool",
        description="raw",
        parameters=raw_parameters,
        output=ToolOutput(schema={"type": "string"}),
        execute=body,
    )
    runtime = make_runtime(tool)
    assert [schema.to_dict() for schema in runtime.schemas()] == [
        {"name": "raw-tool", "description": "raw", "parameters": raw_parameters}
    ]
    result = await runtime.execute(make_input("raw-tool", {"path": "/tmp"}))
    assert result == ToolExecutionSuccess(value="/tmp", content=(TextBlock("/tmp"),))


@attrs.frozen
class Window:
    path: str
    limit: int | None = None


async def test_optional_parameters_may_be_omitted() -> None:
    """S100: an omitted optional parameter is absent (DSL dict) or its default (attrs class)."""
    received: list[object] = []

    async def body(args: Any) -> str:
        received.append(args)
        return "ok"

    dsl = string_tool("dsl", {"path": {"type": "string", "required": True}, "limit": {"type": "integer"}}, body)
    typed = string_tool("typed", Window, body)
    runtime = make_runtime(dsl, typed)
    for name in ("dsl", "typed"):
        result = await runtime.execute(make_input(name, {"path": "/tmp"}))
        assert result == ToolExecutionSuccess(value="ok", content=(TextBlock("ok"),))
    assert received == [{"path": "/tmp"}, Window(path="/tmp", limit=None)]
    assert "limit" not in received[0]  # type: ignore[operator]


# -- what a raised error becomes ----------------------------------------------------------------


class Denied(Exception):
    """An exception that carries nothing but its message (the original's ``{message}`` object)."""

    def __init__(self) -> None:
        super().__init__("denied by object")


def _raiser(make: Any) -> Any:
    async def body(args: Any) -> str:
        raise make()

    return body


async def test_raised_exception_with_a_message_becomes_error_text() -> None:
    """S103: a body raising an exception that only carries a message gives ``Error: <message>``."""
    result = await make_runtime(string_tool("t", {}, _raiser(Denied))).execute(make_input("t"))
    assert isinstance(result, ToolExecutionFailure)
    assert result.content == (TextBlock("Error: denied by object"),)
    assert result.error.message == "denied by object"


async def test_raising_a_non_exception_is_contained() -> None:
    """S104: Python cannot raise a string; the body's ``raise "kaboom"`` is a TypeError result, not a crash."""

    async def body(args: Any) -> str:
        not_an_exception: Any = "kaboom"
        raise not_an_exception

    result = await make_runtime(string_tool("t", {}, body)).execute(make_input("t"))
    assert result == ToolExecutionFailure(
        error=ToolFailure(
            message="exceptions must derive from BaseException",
            info=ToolErrorInfo(name="TypeError", code="TOOL_ERROR"),
        ),
        content=(TextBlock("Error: exceptions must derive from BaseException"),),
    )


@pytest.mark.parametrize(
    ("make", "text"),
    [
        pytest.param(lambda: Exception({"code": 500}), "Error: {'code': 500}", id="non-string-payload"),
        pytest.param(RuntimeError, "Error: RuntimeError", id="no-message"),
    ],
)
async def test_exception_without_a_string_message_uses_its_string_form(make: Any, text: str) -> None:
    """S105: the message of an exception without a string message is its ``str()`` (or its class name)."""
    result = await make_runtime(string_tool("t", {}, _raiser(make))).execute(make_input("t"))
    assert isinstance(result, ToolExecutionFailure)
    assert result.content == (TextBlock(text),)
    assert result.error.message == text.removeprefix("Error: ")


# -- validateArgs ----------------------------------------------------------------------------------

PATH_LIMIT = {"path": {"type": "string", "required": True}, "limit": {"type": "number"}}


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        pytest.param({"path": "/tmp"}, (), id="S108-valid"),
        pytest.param({"path": "/tmp", "limit": 5}, (), id="S108-valid-with-limit"),
        pytest.param(None, ('"arguments" must be an object',), id="S108-null"),
        pytest.param("nope", ('"arguments" must be an object',), id="S108-string"),
        pytest.param([], ('"arguments" must be an object',), id="S108-list"),
        pytest.param({}, ('missing required property "path"',), id="S109-missing"),
        pytest.param({"path": "/tmp", "extra": 1}, (), id="S110-extra-keys-allowed"),
    ],
)
def test_validate_args_is_total_and_reports_at_the_arguments_root(arguments: object, expected: tuple[str, ...]) -> None:
    """S108-S110: every input gets a verdict (no raise); non-objects are exactly one violation.

    S109's ``{path: undefined}`` has no Python counterpart (``None`` is JSON null, a present value).
    """
    assert validate_args(PATH_LIMIT, arguments) == expected


def test_validate_args_never_applies_defaults() -> None:
    """S111: a default is not applied, and an absent optional parameter with a default is valid."""
    arguments: dict[str, Any] = {}
    assert validate_args({"limit": {"type": "number", "default": 25}}, arguments) == ()
    assert arguments == {}


@pytest.mark.parametrize(
    ("spec", "arguments", "expected"),
    [
        pytest.param({"s": {"type": "string"}}, {"s": 1}, ('"s" must be a string',), id="S112-string"),
        pytest.param({"n": {"type": "number"}}, {"n": "x"}, ('"n" must be a number',), id="S112-number"),
        pytest.param({"b": {"type": "boolean"}}, {"b": "x"}, ('"b" must be a boolean',), id="S112-boolean"),
        pytest.param({"color": {"type": "string", "enum": ["red", "green"]}}, {"color": "red"}, (), id="S113-member"),
        pytest.param(
            {"color": {"type": "string", "enum": ["red", "green"]}},
            {"color": "blue"},
            ('"color" must be one of ["red","green"]',),
            id="S113-non-member",
        ),
        pytest.param({"n": {"type": "number", "enum": [1, 2]}}, {"n": 1}, (), id="S114-numeric-member"),
        pytest.param(
            {"n": {"type": "number", "enum": [1, 2]}}, {"n": 3}, ('"n" must be one of [1,2]',), id="S114-numeric"
        ),
    ],
)
def test_validate_args_primitive_and_enum_messages(
    spec: dict[str, Any], arguments: object, expected: tuple[str, ...]
) -> None:
    """S112-S114: type and enum violations name the argument path without a root label."""
    assert validate_args(spec, arguments) == expected


@pytest.mark.parametrize(
    ("spec", "violation"),
    [
        pytest.param(
            {"n": {"type": "number", "enum": ["1", "2"]}},
            "parameters.n.enum must be a non-empty array of number values",
            id="S114-string-enum-on-number",
        ),
        pytest.param(
            {"x": {"type": "weird"}},
            "parameters.x.type must be string/number/integer/boolean/null/array/object/json, or use oneOf",
            id="S115-unknown-type",
        ),
    ],
)
def test_validate_args_with_a_bad_spec_raises(spec: dict[str, Any], violation: str) -> None:
    """S114, S115: a bad spec raises instead of validating (SchemaSpecError here, SPEC 2.1)."""
    with pytest.raises(SchemaSpecError) as caught:
        validate_args(spec, {"n": 1, "x": 1})
    assert caught.value.violations == (violation,)


CONFIG_BAG = {
    "config": {
        "type": "object",
        "additionalProperties": False,
        "required": True,
        "properties": {"host": {"type": "string", "required": True}, "port": {"type": "number"}},
    },
    "bag": {"type": "object", "additionalProperties": True},
}


@pytest.mark.parametrize(
    ("spec", "arguments", "expected"),
    [
        pytest.param(CONFIG_BAG, {"config": {"host": "h"}, "bag": {"anything": True}}, (), id="S116-valid"),
        pytest.param(
            CONFIG_BAG,
            {"config": {"port": 9}, "bag": 5},
            ('missing required property "config.host"', '"bag" must be an object'),
            id="S116-invalid",
        ),
        pytest.param(
            {"tags": {"type": "array", "items": {"type": "string"}}, "raw": {"type": "array"}},
            {"tags": ["a", "b"], "raw": [1, {}, "x"]},
            (),
            id="S117-valid",
        ),
        pytest.param(
            {"tags": {"type": "array", "items": {"type": "string"}}},
            {"tags": ["a", 2]},
            ('"tags[1]" must be a string',),
            id="S117-bad-item",
        ),
        pytest.param(
            {"tags": {"type": "array", "items": {"type": "string"}}},
            {"tags": "nope"},
            ('"tags" must be an array',),
            id="S117-not-an-array",
        ),
        pytest.param(
            {
                "servers": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "additionalProperties": True,
                        "properties": {"host": {"type": "string", "required": True}},
                    },
                }
            },
            {"servers": [{"host": "a"}, {}]},
            ('missing required property "servers[1].host"',),
            id="S118-array-of-objects",
        ),
    ],
)
def test_validate_args_nested_paths(spec: dict[str, Any], arguments: object, expected: tuple[str, ...]) -> None:
    """S116-S118: nested objects and arrays report dotted and indexed paths, in walk order."""
    assert validate_args(spec, arguments) == expected


# -- define_tool validation ------------------------------------------------------------------------


def reader() -> ToolDefinition:
    async def read(args: Any) -> list[dict[str, str]]:
        return [{"type": "text", "text": f"read {args['path']}"}]

    return content_tool("reader", {"path": {"type": "string", "required": True}}, read)


async def test_bad_arguments_become_a_structured_args_failure() -> None:
    """S119, S122: missing ``path`` is an INVALID_ARGS failure with the literal message and text."""
    result = await make_runtime(reader()).execute(make_input("reader", {}))
    message = 'invalid arguments: missing required property "path"'
    assert result == ToolExecutionFailure(
        error=ToolFailure(message=message, info=ToolErrorInfo(name="ToolArgsError", code="INVALID_ARGS")),
        content=(TextBlock(f"Error: {message}"),),
    )


async def test_valid_arguments_run_the_body() -> None:
    """S120: valid arguments run the body; the value is the block list, the content its rendering."""
    result = await make_runtime(reader()).execute(make_input("reader", {"path": "/x"}))
    assert result == ToolExecutionSuccess(
        value=snapshot_json([{"type": "text", "text": "read /x"}]), content=(TextBlock("read /x"),)
    )


def test_tool_args_error_carries_code_violations_and_joined_message() -> None:
    """S121: ToolArgsError is an Exception with code INVALID_ARGS, its violations, and a joined message."""
    violations = ['missing required property "a"', '"b" must be a number']
    error = ToolArgsError(violations)
    assert isinstance(error, Exception)
    assert type(error).__name__ == "ToolArgsError"
    assert error.code == "INVALID_ARGS"
    assert error.violations == tuple(violations)
    assert str(error) == 'invalid arguments: missing required property "a"; "b" must be a number'


class HarnessError(DshError):
    """A tool's own structured error (the original's ``HarnessError``)."""


async def test_structured_error_from_the_body_keeps_its_name_and_code() -> None:
    """S123: a DshError subclass raised by the body surfaces its class name and own code."""
    tool = string_tool("t", {}, _raiser(lambda: HarnessError("disk full", code="ENOSPC")))
    result = await make_runtime(tool).execute(make_input("t"))
    assert result == ToolExecutionFailure(
        error=ToolFailure(message="disk full", info=ToolErrorInfo(name="HarnessError", code="ENOSPC")),
        content=(TextBlock("Error: disk full"),),
    )


async def test_plain_exception_from_the_body_is_a_tool_error() -> None:
    """S124: a plain exception gives its message; the port adds info ``TOOL_ERROR`` (README error-code table).

    The original leaves ``info`` out for a plain Error; this port documents ``TOOL_ERROR`` for
    "the body raised a plain exception", with the exception's class name.
    """
    tool = string_tool("t", {}, _raiser(lambda: RuntimeError("just a message")))
    result = await make_runtime(tool).execute(make_input("t"))
    assert result == ToolExecutionFailure(
        error=ToolFailure(message="just a message", info=ToolErrorInfo(name="RuntimeError", code="TOOL_ERROR")),
        content=(TextBlock("Error: just a message"),),
    )


async def test_raw_tool_arguments_are_validated_by_the_registry() -> None:
    """S125 (adapted): the original runs a raw tool without validating its arguments; this port
    validates every tool's arguments before any policy (README: "Arguments validated before any
    policy sees them"), so the body never runs."""
    runs: list[object] = []

    async def body(args: Any, run: ToolRunContext) -> str:
        runs.append(args)
        return type(args).__name__

    tool = ToolDefinition(
        name="raw",
        description="raw",
        parameters={"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        output=ToolOutput(schema={"type": "string"}),
        execute=body,
    )
    result = await make_runtime(tool).execute(make_input("raw", {}))
    assert isinstance(result, ToolExecutionFailure)
    assert result.error == ToolFailure(
        message='invalid arguments: missing required property "path"',
        info=ToolErrorInfo(name="ToolArgsError", code="INVALID_ARGS"),
    )
    assert runs == []


def test_define_tool_attaches_timeout_ms_only_when_given() -> None:
    """S126, S127: ``timeout_ms`` is kept as given, and is ``None`` when omitted."""
    budgeted = define_tool(name="b", description="", parameters={}, output={"type": "null"}, execute=_none_body,
                           timeout_ms=30000)  # fmt: skip
    plain = define_tool(name="p", description="", parameters={}, output={"type": "null"}, execute=_none_body)
    assert budgeted.timeout_ms == 30000
    assert plain.timeout_ms is None


@pytest.mark.parametrize("bad", [0, -5, float("inf")], ids=["zero", "negative", "infinity"])
def test_define_tool_refuses_a_non_positive_or_non_finite_timeout(bad: float) -> None:
    """S128, S129: zero, negative and infinite budgets are refused by define_tool itself."""
    with pytest.raises(TypeError) as caught:
        define_tool(name="b", description="", parameters={}, output={"type": "null"}, execute=_none_body,
                    timeout_ms=bad)  # fmt: skip
    assert str(caught.value) == f'define_tool("b"): timeout_ms must be a positive finite number, got {bad!r}'


@pytest.mark.parametrize("bad", [float("nan"), True, "5", None.__class__], ids=["nan", "bool", "str", "type"])
def test_define_tool_refuses_a_timeout_that_is_not_a_number(bad: Any) -> None:
    with pytest.raises(TypeError) as caught:
        define_tool(name="b", description="", parameters={}, output={"type": "null"}, execute=_none_body,
                    timeout_ms=bad)  # fmt: skip
    assert str(caught.value) == f'define_tool("b"): timeout_ms must be a positive finite number, got {bad!r}'


def test_an_int_timeout_beyond_a_floats_range_is_finite_and_kept() -> None:
    """Python ints have no infinity: 10**400 is a (silly) finite budget, not an OverflowError."""
    huge = 10**400
    defined = define_tool(name="b", description="", parameters={}, output={"type": "null"}, execute=_none_body,
                          timeout_ms=huge)  # fmt: skip
    assert defined.timeout_ms == huge
    assert ToolDefinition(name="r", description="", parameters={"type": "object"}, output=ToolOutput(schema={}),
                          execute=_raw_body, timeout_ms=huge).timeout_ms == huge  # fmt: skip
    with pytest.raises(TypeError, match="timeout_ms must be a positive finite number, got -"):
        ToolDefinition(name="r", description="", parameters={"type": "object"}, output=ToolOutput(schema={}),
                       execute=_raw_body, timeout_ms=-huge)  # fmt: skip


async def _raw_body(args: Any, run: Any) -> None:
    return None


def _args_only(args: Any) -> None:
    return None


def _args_and_run(args: Any, run: Any) -> None:
    return None


def _args_and_optional_run(args: Any, run: Any = None) -> None:
    return None


def _no_parameters() -> None:
    return None


def _three_parameters(args: Any, run: Any, extra: Any) -> None:
    return None


def _keyword_only(*, args: Any) -> None:
    return None


@pytest.mark.parametrize(
    ("execute", "takes_run"),
    [(_args_only, False), (_args_and_run, True), (_args_and_optional_run, True), (lambda *values: None, True)],
    ids=["args", "args-run", "optional-run", "varargs"],
)
async def test_define_tool_passes_run_exactly_when_execute_can_take_it(execute: Any, takes_run: bool) -> None:
    seen: list[int] = []

    def body(*values: Any) -> None:
        seen.append(len(values))
        return execute(*values)

    body.__signature__ = inspect.signature(execute)  # type: ignore[attr-defined]
    runtime = make_runtime(define_tool(name="t", description="", parameters={}, output={"type": "null"}, execute=body))
    assert not (await runtime.execute(make_input("t"))).is_error
    assert seen == [2 if takes_run else 1]


def _rows(args: Any) -> Any:
    yield 1


async def _async_rows(args: Any) -> Any:
    yield 1


class _RowsObject:
    def __call__(self, args: Any) -> Any:
        yield 1


_GENERATOR = 'define_tool("t"): execute is a generator function; a tool returns its whole value (a list, say)'


@pytest.mark.parametrize(
    ("execute", "message"),
    [
        (None, 'define_tool("t"): execute must be callable, got NoneType'),
        ("run", 'define_tool("t"): execute must be callable, got str'),
        (_no_parameters, 'define_tool("t"): execute must take (args) or (args, run), got _no_parameters()'),
        (_three_parameters, 'define_tool("t"): execute must take (args) or (args, run), got '
                            "_three_parameters(args: 'Any', run: 'Any', extra: 'Any')"),
        (_keyword_only, 'define_tool("t"): execute must take (args) or (args, run), got '
                        "_keyword_only(*, args: 'Any')"),
        (_rows, _GENERATOR), (_async_rows, _GENERATOR), (functools.partial(_rows), _GENERATOR), (_RowsObject(), _GENERATOR),
    ],
    ids=["none", "str", "no-parameters", "three-parameters", "keyword-only", "generator", "async-generator",
         "partial-generator", "generator-call"],
)  # fmt: skip
def test_define_tool_refuses_an_execute_it_could_not_call(execute: Any, message: str) -> None:
    """Refused where the tool is declared, not as a TOOL_ERROR on every call."""
    with pytest.raises(TypeError) as caught:
        define_tool(name="t", description="", parameters={}, output={"type": "null"}, execute=execute)
    assert str(caught.value) == message


@pytest.mark.parametrize("option", ["is_concurrency_safe", "present_call", "present_result", "resource_keys"])
def test_define_tool_refuses_callbacks_that_are_not_callable(option: str) -> None:
    with pytest.raises(TypeError) as caught:
        define_tool(name="t", description="", parameters={}, output={"type": "null"}, execute=_none_body,
                    **{option: True})  # fmt: skip
    hint = " (for every call: is_concurrency_safe=lambda args: True)" if option == "is_concurrency_safe" else ""
    assert str(caught.value) == f'define_tool("t"): {option} must be callable or None, got bool{hint}'


# -- define_tool presentation ----------------------------------------------------------------------


@attrs.frozen
class Mode:
    mode: Literal["read", "write"]
    attempt: Literal[1] | None = None


async def test_literal_fields_become_enums_and_reach_the_body_as_values() -> None:
    """S130: Literal-typed attrs fields compile to enums; the body sees the literal values."""
    seen: list[Mode] = []

    async def body(args: Mode) -> None:
        seen.append(args)

    tool = define_tool(name="mode", description="", parameters=Mode, output={"type": "null"}, execute=body)
    assert tool.parameters == {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "mode": {"type": "string", "enum": ["read", "write"]},
            "attempt": {"oneOf": [{"type": "integer", "enum": [1]}, {"type": "null"}], "default": None},
        },
        "required": ["mode"],
    }
    runtime = make_runtime(tool)
    result = await runtime.execute(make_input("mode", {"mode": "read", "attempt": 1}))
    assert result == ToolExecutionSuccess(value=None, content=(TextBlock("null"),))
    assert seen == [Mode(mode="read", attempt=1)]
    wrong = await runtime.execute(make_input("mode", {"mode": "delete"}))
    assert isinstance(wrong, ToolExecutionFailure)
    assert wrong.error.message == 'invalid arguments: "mode" must be one of ["read","write"]'


def demo_tool(**presenters: Any) -> ToolDefinition:
    return define_tool(
        name="demo",
        description="",
        parameters={"path": {"type": "string", "required": True}, "n": {"type": "number"}},
        output={"type": "null"},
        execute=_none_body,
        **presenters,
    )


def _present_call(args: Any) -> GenericCallView:
    return GenericCallView(title=f"Open {args['path']}", kind="read", raw_input=args["path"])


def _present_result(args: Any, result: Any) -> GenericResultView:
    return GenericResultView(title=f"Opened {args['path']}", content=result.content)


def test_presenters_are_threaded_through_define_tool() -> None:
    """S131: present_call / present_result are kept and get the (valid) arguments."""
    tool = demo_tool(present_call=_present_call, present_result=_present_result)
    assert tool.present_call is not None and tool.present_result is not None
    assert tool.present_call({"path": "/a", "n": 2}) == GenericCallView(title="Open /a", kind="read", raw_input="/a")
    outcome = ToolExecutionSuccess(value=None, content=(TextBlock("x"),))
    assert tool.present_result({"path": "/a"}, outcome) == GenericResultView(
        title="Opened /a", content=(TextBlock("x"),)
    )


def test_no_presenters_means_none() -> None:
    """S132: a tool declared without presenters has neither."""
    tool = demo_tool()
    assert (tool.present_call, tool.present_result) == (None, None)


def test_presenters_validate_softly() -> None:
    """S133: invalid arguments give ``None`` (the generic fallback) without calling the presenter or raising."""
    calls: list[object] = []

    def present_call(args: Any) -> GenericCallView:
        calls.append(args)
        return _present_call(args)

    def present_result(args: Any, result: Any) -> GenericResultView:
        calls.append(args)
        return _present_result(args, result)

    tool = demo_tool(present_call=present_call, present_result=present_result)
    assert tool.present_call is not None and tool.present_result is not None
    assert tool.present_call({}) is None
    assert tool.present_result({"wrong": 1}, ToolExecutionSuccess(value=None, content=())) is None
    assert calls == []


@pytest.mark.parametrize(
    ("parameters", "output", "expected"),
    [
        ({}, {"type": "object"}, 'define_tool("acme") output: schema.additionalProperties must be explicitly true or false'),
        (
            {"user": {"type": "object"}},
            {"type": "json"},
            'define_tool("acme") parameters: parameters.user.additionalProperties must be explicitly true or false',
        ),
    ],
    ids=["output", "parameters"],
)
def test_a_bad_dsl_spec_names_the_tool_and_the_side(parameters: Any, output: Any, expected: str) -> None:
    """A plugin module defining several tools failed with a path that named neither."""
    with pytest.raises(SchemaSpecError) as raised:
        define_tool(name="acme", description="d", parameters=parameters, output=output, execute=lambda args: {})
    assert raised.value.violations == (expected,)

