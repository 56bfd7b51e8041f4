"""``RawSchema``: JSON Schema in the enforced subset handed to ``define_tool`` as it is."""

from __future__ import annotations

import tracemalloc
from typing import Any

import attrs
import pytest

from dsh_core import (
    NonJsonValueError,
    RawSchema,
    TextBlock,
    ToolDefinition,
    ToolOutput,
    define_tool,
    thaw,
)
from dsh_core.schema import JsonSchemaError, SchemaSpecError
from dsh_core.testing import expect_failure, expect_success, make_input, make_runtime

# Written the way an OpenAPI operation or another framework's tool declares it: `required` as a
# list, no `additionalProperties` on the output (open), neither accepted by the author DSL.
SEARCH_PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "query": {"type": "string", "description": "what to look for"},
        "limit": {"type": "integer"},
    },
    "required": ["query"],
    "additionalProperties": False,
}
SEARCH_OUTPUT: dict[str, Any] = {
    "type": "object",
    "properties": {"hits": {"type": "array", "items": {"type": "string"}}},
    "required": ["hits"],
}


def search_tool(body: Any = None, **options: Any) -> ToolDefinition:
    async def search(args: Any) -> Any:
        return {"hits": [args["query"]] * args.get("limit", 1)}

    return define_tool(
        name="search",
        description="Search the index.",
        parameters=RawSchema(SEARCH_PARAMETERS),
        output=options.pop("output", RawSchema(SEARCH_OUTPUT)),
        execute=body or search,
        **options,
    )


def test_the_model_sees_the_parameters_exactly_as_given() -> None:
    tool = search_tool()
    assert thaw(tool.schema.parameters) == SEARCH_PARAMETERS
    assert thaw(tool.output.schema) == SEARCH_OUTPUT


def test_the_author_dsl_refuses_the_same_schemas() -> None:
    # Why RawSchema exists: without it these schemas are read as the DSL and refused.
    with pytest.raises(SchemaSpecError):
        define_tool(name="search", description="d", parameters=SEARCH_PARAMETERS, output={}, execute=print)
    with pytest.raises(SchemaSpecError):
        define_tool(name="search", description="d", parameters={}, output=SEARCH_OUTPUT, execute=print)


async def test_arguments_are_validated_against_the_raw_schema() -> None:
    runtime = make_runtime(search_tool())
    result = expect_success(await runtime.execute(make_input("search", {"query": "trio", "limit": 2})))
    assert thaw(result.value) == {"hits": ["trio", "trio"]}
    failure = expect_failure(await runtime.execute(make_input("search", {"limit": "2", "extra": 1})))
    assert failure.error.info.code == "INVALID_ARGS"
    for problem in ("query", "limit", "extra"):
        assert problem in failure.error.message


async def test_the_value_is_validated_against_the_raw_output_schema() -> None:
    async def wrong(args: Any) -> Any:
        return {"hits": [1]}

    failure = expect_failure(await make_runtime(search_tool(wrong)).execute(make_input("search", {"query": "q"})))
    assert failure.error.info.code == "INVALID_TOOL_OUTPUT"
    assert "value.hits[0]" in failure.error.message


async def test_a_tool_output_with_a_raw_schema_keeps_its_renderer() -> None:
    def render(args: Any, value: Any) -> list[TextBlock]:
        return [TextBlock(f"{len(value['hits'])} hits for {args['query']}")]

    tool = search_tool(output=ToolOutput(schema=RawSchema(SEARCH_OUTPUT), render=render))
    assert thaw(tool.output.schema) == SEARCH_OUTPUT
    result = expect_success(await make_runtime(tool).execute(make_input("search", {"query": "q", "limit": 3})))
    assert result.content == (TextBlock("3 hits for q"),)


def test_a_tool_output_with_a_dsl_schema_is_still_compiled() -> None:
    tool = define_tool(
        name="t", description="d", parameters={}, output=ToolOutput(schema={"type": "string"}), execute=print
    )
    assert thaw(tool.output.schema) == {"type": "string"}
    with pytest.raises(SchemaSpecError):
        define_tool(
            name="t", description="d", parameters={}, output=ToolOutput(schema={"type": "object"}), execute=print
        )


@pytest.mark.parametrize(
    ("spec", "compiled", "value"),
    [
        ({"type": "json"}, {}, {"any": ["json"]}),
        ({"type": "integer"}, {"type": "integer"}, 7),
        (
            {
                "type": "object",
                "additionalProperties": False,
                "properties": {"x": {"type": "string", "required": True}},
            },
            {
                "type": "object",
                "additionalProperties": False,
                "properties": {"x": {"type": "string"}},
                "required": ["x"],
            },
            {"x": "1"},
        ),
    ],
    ids=["json", "integer", "object"],
)
async def test_another_tools_compiled_output_is_reused_as_it_is(spec: Any, compiled: Any, value: Any) -> None:
    # A proxy declares the output of the tool it wraps: that output is already JSON Schema, not the DSL.
    def render(args: Any, value: Any) -> list[TextBlock]:
        return [TextBlock("rendered")]

    inner = define_tool(
        name="inner", description="d", parameters={}, output=ToolOutput(schema=spec, render=render), execute=print
    )
    assert thaw(inner.output.schema) == compiled
    proxy = define_tool(name="proxy", description="d", parameters={}, output=inner.output, execute=lambda a: value)
    assert proxy.output is inner.output
    result = expect_success(await make_runtime(proxy).execute(make_input("proxy")))
    assert result.value == value and result.content == (TextBlock("rendered"),)


def test_the_compiled_output_of_a_tool_with_a_parameters_class_is_reused_as_it_is() -> None:
    @attrs.frozen
    class Params:
        n: int

    inner = define_tool(name="inner", description="d", parameters=Params, output={"type": "json"}, execute=print)
    proxy = define_tool(name="proxy", description="d", parameters={}, output=inner.output, execute=print)
    assert thaw(proxy.output.schema) == {}


def test_a_raw_definition_takes_raw_schemas_too() -> None:
    async def body(args: Any, run: Any) -> Any:
        return {"hits": []}

    tool = ToolDefinition(
        name="search",
        description="d",
        parameters=RawSchema(SEARCH_PARAMETERS),
        output=ToolOutput(schema=RawSchema(SEARCH_OUTPUT)),
        execute=body,
    )
    assert thaw(tool.parameters) == SEARCH_PARAMETERS
    make_runtime(tool)


def test_unsupported_keywords_are_listed_when_the_schema_is_wrapped() -> None:
    with pytest.raises(JsonSchemaError) as raised:
        RawSchema({"type": "object", "properties": {"a": {"$ref": "#/defs/a"}}, "anyOf": [{}, {}]})
    assert [v.split(" ")[0] for v in raised.value.violations] == ["schema.anyOf", "schema.properties.a.$ref"]


def test_parameters_must_be_an_object_schema() -> None:
    with pytest.raises(JsonSchemaError) as raised:
        define_tool(name="t", description="d", parameters=RawSchema({"type": "string"}), output={}, execute=print)
    assert raised.value.violations == (
        'define_tool("t") parameters: schema.type must be "object" (tool arguments are a JSON object)',
    )


def test_any_output_root_is_accepted() -> None:
    tool = define_tool(name="t", description="d", parameters={}, output=RawSchema({"type": "integer"}), execute=print)
    assert thaw(tool.output.schema) == {"type": "integer"}


@pytest.mark.parametrize(
    ("node", "error", "message"),
    [
        ([("type", "object")], TypeError, "RawSchema takes a JSON Schema mapping, got list"),
        ("{}", TypeError, "RawSchema takes a JSON Schema mapping, got str"),
        ({"type": "object", "default": float("nan")}, NonJsonValueError, "$.default"),
    ],
)
def test_what_is_not_a_json_schema_mapping_is_refused(node: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error) as raised:
        RawSchema(node)
    assert message in str(raised.value)


def test_the_node_is_a_snapshot_of_what_was_given() -> None:
    given: dict[str, Any] = {"type": "object", "properties": {"a": {"type": "string"}}}
    raw = RawSchema(given)
    given["properties"]["a"]["type"] = "integer"
    assert thaw(raw.node) == {"type": "object", "properties": {"a": {"type": "string"}}}


def test_a_deeply_nested_raw_schema_is_checked_without_recursion() -> None:
    depth = 5000
    node: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        node = {"type": "array", "items": node}
    raw = RawSchema({"type": "object", "properties": {"deep": node}})
    tool = define_tool(name="deep", description="d", parameters=raw, output={"type": "json"}, execute=print)
    assert tool.parameters["properties"]["deep"]["type"] == "array"


@pytest.mark.slow
def test_a_raw_schema_40_000_deep_compiles_in_bounded_memory() -> None:
    node: dict[str, Any] = {"type": "string"}
    for _ in range(40_000):
        node = {"type": "object", "properties": {"a": node}, "required": ["a"], "additionalProperties": False}
    tracemalloc.start()
    try:
        raw = RawSchema({"type": "object", "properties": {"deep": node}})
        tool = define_tool(name="deep", description="d", parameters=raw, output=RawSchema(node), execute=print)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert tool.parameters["properties"]["deep"]["required"] == ("a",)
    # The schemas themselves take about 60 MB; a path string per pending node took gigabytes.
    assert peak < 200 * 1024 * 1024, peak
