"""The author DSL compiler: output shapes, every rule's message, all-paths reporting."""

from __future__ import annotations

import math
import tracemalloc
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsh_core import define_tool
from dsh_core._errors import ErrorCode, JsonSchemaError, SchemaSpecError
from dsh_core._json import snapshot_json
from dsh_core._schema import _dsl
from dsh_core._schema._dsl import parameter_schema_to_json_schema, value_schema_to_json_schema
from dsh_core._schema._subset import assert_supported_json_schema

# ---------------------------------------------------------------------------
# Compiled output


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param({"type": "string"}, {"type": "string"}, id="bare-scalar"),
        pytest.param(
            {"type": "string", "enum": ["a", "b"], "const": "a", "description": "d", "title": "t"},
            {"type": "string", "description": "d", "title": "t", "enum": ["a", "b"], "const": "a"},
            id="scalar-constrained",
        ),
        pytest.param(
            {"type": "number", "default": 1.5, "examples": [1, 2.5]},
            {"type": "number", "default": 1.5, "examples": [1, 2.5]},
            id="number-annotations",
        ),
        pytest.param({"type": "integer", "enum": [1, 2.0]}, {"type": "integer", "enum": [1, 2.0]}, id="integral-float"),
        pytest.param({"type": "boolean", "const": False}, {"type": "boolean", "const": False}, id="boolean-const"),
        pytest.param({"type": "null", "enum": [None]}, {"type": "null", "enum": [None]}, id="null-enum"),
        pytest.param({"type": "array"}, {"type": "array"}, id="array-no-items"),
        pytest.param(
            {"type": "array", "items": {"type": "json"}, "description": "any"},
            {"type": "array", "description": "any", "items": {}},
            id="array-json-items",
        ),
        pytest.param(
            {"type": "object", "additionalProperties": True},
            {"type": "object", "additionalProperties": True},
            id="open-object-no-properties",
        ),
        pytest.param(
            {
                "type": "object",
                "additionalProperties": False,
                "title": "Server",
                "properties": {
                    "host": {"type": "string", "required": True},
                    "port": {"type": "integer"},
                    "tls": {"type": "boolean", "required": True},
                },
            },
            {
                "type": "object",
                "title": "Server",
                "additionalProperties": False,
                "properties": {"host": {"type": "string"}, "port": {"type": "integer"}, "tls": {"type": "boolean"}},
                "required": ["host", "tls"],
            },
            id="closed-object-required-in-property-order",
        ),
        pytest.param(
            {"type": "object", "additionalProperties": False, "properties": {"a": {"type": "string"}}},
            {"type": "object", "additionalProperties": False, "properties": {"a": {"type": "string"}}},
            id="object-without-required",
        ),
        pytest.param({"type": "json"}, {}, id="json-bare"),
        pytest.param(
            {"type": "json", "description": "d", "title": "t", "default": {"a": [1]}, "examples": [None]},
            {"description": "d", "title": "t", "default": {"a": [1]}, "examples": [None]},
            id="json-annotations-only",
        ),
        pytest.param(
            {"oneOf": [{"type": "string"}, {"type": "null"}], "description": "maybe"},
            {"oneOf": [{"type": "string"}, {"type": "null"}], "description": "maybe"},
            id="one-of",
        ),
        pytest.param(
            {"oneOf": ({"type": "json"}, {"type": "array", "items": {"type": "integer"}})},
            {"oneOf": [{}, {"type": "array", "items": {"type": "integer"}}]},
            id="one-of-tuple-branches",
        ),
    ],
)
def test_value_spec_compiles_to_exact_shape(spec: dict[str, Any], expected: dict[str, Any]) -> None:
    assert value_schema_to_json_schema(spec) == expected


def test_compiled_key_order_puts_type_first_then_annotations() -> None:
    spec = {"enum": ["x"], "title": "t", "type": "string", "description": "d"}
    assert list(value_schema_to_json_schema(spec)) == ["type", "description", "title", "enum"]


def test_one_of_key_comes_first() -> None:
    spec = {"description": "d", "oneOf": [{"type": "string"}, {"type": "null"}]}
    assert list(value_schema_to_json_schema(spec)) == ["oneOf", "description"]


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param({}, {"type": "object", "properties": {}}, id="empty"),
        pytest.param(
            {"path": {"type": "string", "required": True}, "limit": {"type": "integer"}},
            {
                "type": "object",
                "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}},
                "required": ["path"],
            },
            id="required-listed",
        ),
        pytest.param(
            {"a": {"type": "json", "required": True}, "b": {"oneOf": [{"type": "string"}, {"type": "integer"}]}},
            {
                "type": "object",
                "properties": {"a": {}, "b": {"oneOf": [{"type": "string"}, {"type": "integer"}]}},
                "required": ["a"],
            },
            id="json-and-one-of-properties",
        ),
    ],
)
def test_parameter_root_is_an_implicit_open_object(spec: dict[str, Any], expected: dict[str, Any]) -> None:
    compiled = parameter_schema_to_json_schema(spec)
    assert compiled == expected
    assert "additionalProperties" not in compiled


def test_omitted_keys_stay_omitted() -> None:
    compiled = parameter_schema_to_json_schema({"x": {"type": "string"}})
    assert compiled == {"type": "object", "properties": {"x": {"type": "string"}}}
    assert "required" not in compiled


def test_output_shares_nothing_with_the_spec() -> None:
    enum = ["a", "b"]
    default = {"nested": [1, 2]}
    spec = {"type": "string", "enum": enum, "default": default, "examples": [[1]]}
    compiled = value_schema_to_json_schema(spec)
    assert compiled["enum"] == enum and compiled["enum"] is not enum
    assert type(compiled["enum"]) is list
    assert compiled["default"] == default and compiled["default"] is not default
    assert compiled["default"]["nested"] is not default["nested"]
    compiled["enum"].append("c")
    compiled["default"]["nested"].append(3)
    assert enum == ["a", "b"] and default == {"nested": [1, 2]}


def test_frozen_spec_compiles_to_plain_containers() -> None:
    frozen = snapshot_json(
        {"type": "object", "additionalProperties": False, "properties": {"t": {"type": "string", "enum": ["x"]}}}
    )
    compiled = value_schema_to_json_schema(frozen)
    assert type(compiled) is dict
    assert type(compiled["properties"]) is dict
    assert type(compiled["properties"]["t"]["enum"]) is list


def test_sibling_reuse_is_not_a_cycle_and_yields_distinct_copies() -> None:
    shared = {"type": "array", "items": {"type": "string"}}
    compiled = value_schema_to_json_schema({"oneOf": [shared, shared]})
    first, second = compiled["oneOf"]
    assert first == second == {"type": "array", "items": {"type": "string"}}
    assert first is not second


def test_default_is_an_annotation_only() -> None:
    # A default is copied as is: it is neither applied nor checked against the type.
    compiled = value_schema_to_json_schema({"type": "integer", "default": "not an integer"})
    assert compiled == {"type": "integer", "default": "not an integer"}


# ---------------------------------------------------------------------------
# Author errors: one violation per rule

_TYPE_MESSAGE = "schema.type must be string/number/integer/boolean/null/array/object/json, or use oneOf"


@pytest.mark.parametrize(
    ("spec", "violation"),
    [
        pytest.param(None, "schema must be a value schema object", id="none-node"),
        pytest.param([{"type": "string"}], "schema must be a value schema object", id="list-node"),
        pytest.param("string", "schema must be a value schema object", id="str-node"),
        pytest.param(
            {1: "x", "type": "string"}, "schema must be a value schema object (key 1 is not a str)", id="int-key"
        ),
        pytest.param({}, _TYPE_MESSAGE, id="no-type"),
        pytest.param({"type": "weird"}, _TYPE_MESSAGE, id="unknown-type"),
        pytest.param({"type": ["string", "null"]}, _TYPE_MESSAGE, id="type-array"),
        pytest.param({"type": "oneOf"}, _TYPE_MESSAGE, id="type-named-oneOf"),
        pytest.param({"description": "only"}, _TYPE_MESSAGE, id="annotation-only"),
        pytest.param(
            {"type": "string", "oneOf": [{"type": "string"}, {"type": "null"}]},
            "schema cannot declare both type and oneOf",
            id="type-and-oneOf",
        ),
        pytest.param(
            {"type": "string", "pattern": "x"}, "schema.pattern is not supported by the value schema DSL", id="pattern"
        ),
        pytest.param(
            {"type": "number", "minimum": 0}, "schema.minimum is not supported by the value schema DSL", id="minimum"
        ),
        pytest.param(
            {"type": "string", "items": {"type": "string"}},
            'schema.items is not supported on type "string"',
            id="items-on-string",
        ),
        pytest.param(
            {"type": "array", "enum": [[1]]}, 'schema.enum is not supported on type "array"', id="enum-on-array"
        ),
        pytest.param(
            {"type": "json", "properties": {}}, 'schema.properties is not supported on type "json"', id="json-keyword"
        ),
        pytest.param(
            {"oneOf": [{"type": "string"}, {"type": "null"}], "enum": ["a"]},
            "schema.enum is not supported beside oneOf",
            id="enum-beside-oneOf",
        ),
        pytest.param(
            {"type": "string", "required": True},
            "schema.required is not supported by the value schema DSL "
            "(required: True belongs on a property of an object)",
            id="required-on-root",
        ),
        pytest.param(
            {"type": "array", "items": {"type": "string", "required": True}},
            "schema.items.required is not supported by the value schema DSL "
            "(required: True belongs on a property of an object)",
            id="required-on-items",
        ),
        pytest.param(
            {"oneOf": [{"type": "string", "required": True}, {"type": "null"}]},
            "schema.oneOf[0].required is not supported by the value schema DSL "
            "(required: True belongs on a property of an object)",
            id="required-on-branch",
        ),
        pytest.param(
            {
                "type": "object",
                "additionalProperties": True,
                "required": ["a"],
                "properties": {"a": {"type": "string"}},
            },
            "schema.required is not supported by the value schema DSL "
            "(required: True belongs on a property of an object)",
            id="json-schema-style-required",
        ),
        pytest.param({"oneOf": "x"}, "schema.oneOf must be an array of at least two value schemas", id="oneOf-str"),
        pytest.param({"oneOf": []}, "schema.oneOf must be an array of at least two value schemas", id="oneOf-empty"),
        pytest.param(
            {"oneOf": [{"type": "string"}]},
            "schema.oneOf must be an array of at least two value schemas",
            id="oneOf-single",
        ),
        pytest.param(
            {"oneOf": {"a": {"type": "string"}}},
            "schema.oneOf must be an array of at least two value schemas",
            id="oneOf-dict",
        ),
        pytest.param(
            {"type": "object"}, "schema.additionalProperties must be explicitly true or false", id="ap-missing"
        ),
        pytest.param(
            {"type": "object", "additionalProperties": 1},
            "schema.additionalProperties must be explicitly true or false",
            id="ap-int",
        ),
        pytest.param(
            {"type": "object", "additionalProperties": "false"},
            "schema.additionalProperties must be explicitly true or false",
            id="ap-str",
        ),
        pytest.param(
            {"type": "object", "additionalProperties": None},
            "schema.additionalProperties must be explicitly true or false",
            id="ap-none",
        ),
        pytest.param(
            {"type": "object", "additionalProperties": True, "properties": [{"type": "string"}]},
            "schema.properties must be an object of value schemas",
            id="properties-list",
        ),
        pytest.param(
            {"type": "object", "additionalProperties": True, "properties": {2: {"type": "string"}}},
            "schema.properties must be an object of value schemas (key 2 is not a str)",
            id="properties-int-key",
        ),
        pytest.param(
            {"type": "object", "additionalProperties": True, "properties": {"a": "string"}},
            "schema.properties.a must be a value schema object",
            id="property-not-a-node",
        ),
        pytest.param(
            {"type": "string", "enum": "a"}, "schema.enum must be a non-empty array of string values", id="enum-str"
        ),
        pytest.param(
            {"type": "string", "enum": []}, "schema.enum must be a non-empty array of string values", id="enum-empty"
        ),
        pytest.param(
            {"type": "number", "enum": ["1"]},
            "schema.enum must be a non-empty array of number values",
            id="enum-str-in-number",
        ),
        pytest.param(
            {"type": "number", "enum": [True]},
            "schema.enum must be a non-empty array of number values",
            id="bool-not-number",
        ),
        pytest.param(
            {"type": "integer", "enum": [1, False]},
            "schema.enum must be a non-empty array of integer values",
            id="bool-not-integer",
        ),
        pytest.param(
            {"type": "integer", "enum": [1.5]}, "schema.enum must be a non-empty array of integer values", id="fraction"
        ),
        pytest.param(
            {"type": "number", "enum": [math.nan]}, "schema.enum must be a non-empty array of number values", id="nan"
        ),
        pytest.param(
            {"type": "number", "enum": [-0.0]},
            "schema.enum must be a non-empty array of number values",
            id="negative-zero",
        ),
        pytest.param(
            {"type": "boolean", "enum": [0, 1]},
            "schema.enum must be a non-empty array of boolean values",
            id="ints-not-bool",
        ),
        pytest.param(
            {"type": "null", "enum": [0]}, "schema.enum must be a non-empty array of null values", id="null-enum"
        ),
        pytest.param({"type": "integer", "const": 1.5}, "schema.const must be an integer value", id="const-fraction"),
        pytest.param({"type": "integer", "const": True}, "schema.const must be an integer value", id="const-bool-int"),
        pytest.param({"type": "boolean", "const": 1}, "schema.const must be a boolean value", id="const-int-bool"),
        pytest.param({"type": "string", "const": None}, "schema.const must be a string value", id="const-none"),
        pytest.param({"type": "number", "const": math.inf}, "schema.const must be a number value", id="const-infinity"),
        pytest.param(
            {"type": "string", "enum": ["a"], "const": "b"},
            "schema.const must be one of schema.enum when both are declared",
            id="const-not-in-enum",
        ),
        pytest.param(
            {"type": "integer", "enum": [1], "const": True},
            "schema.const must be an integer value",
            id="const-bool-vs-int-enum",
        ),
        pytest.param({"type": "string", "description": 1}, "schema.description must be a string", id="description"),
        pytest.param({"type": "json", "title": None}, "schema.title must be a string", id="title"),
    ],
)
def test_each_rule_reports_its_violation(spec: object, violation: str) -> None:
    with pytest.raises(SchemaSpecError) as info:
        value_schema_to_json_schema(spec)
    assert info.value.violations == (violation,)


@pytest.mark.parametrize(
    ("annotation", "value"),
    [
        pytest.param("default", math.nan, id="default-nan"),
        pytest.param("default", {1, 2}, id="default-set"),
        pytest.param("examples", [object()], id="examples-object"),
        pytest.param("default", {"k": b"bytes"}, id="default-bytes"),
    ],
)
def test_annotations_must_be_lossless_json(annotation: str, value: object) -> None:
    with pytest.raises(SchemaSpecError) as info:
        value_schema_to_json_schema({"type": "json", annotation: value})
    (violation,) = info.value.violations
    assert violation.startswith(f"schema.{annotation} annotation must be lossless JSON data (")


@pytest.mark.parametrize("value", [False, "yes", 1, None])
def test_property_required_must_be_literally_true(value: object) -> None:
    with pytest.raises(SchemaSpecError) as info:
        parameter_schema_to_json_schema({"a": {"type": "string", "required": value}})
    assert info.value.violations == ("parameters.a.required must be true when present",)


@pytest.mark.parametrize("spec", [None, [], "x", {1: {"type": "string"}}])
def test_parameter_root_must_be_a_property_map(spec: object) -> None:
    with pytest.raises(SchemaSpecError) as info:
        parameter_schema_to_json_schema(spec)
    (violation,) = info.value.violations
    assert violation.startswith("parameters must be an object of value schemas")


def test_parameter_paths_name_the_author_spec() -> None:
    spec = {
        "path": {"type": "strin"},
        "opts": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"depth": {"type": "integer", "const": "deep"}},
        },
        "tags": {"type": "array", "items": {"type": "string", "maxItems": 3}},
        "mode": {"oneOf": [{"type": "string"}, {"type": "boolean", "enum": []}]},
    }
    with pytest.raises(SchemaSpecError) as info:
        parameter_schema_to_json_schema(spec)
    assert info.value.violations == (
        "parameters.path.type must be string/number/integer/boolean/null/array/object/json, or use oneOf",
        "parameters.opts.properties.depth.const must be an integer value",
        "parameters.tags.items.maxItems is not supported by the value schema DSL",
        "parameters.mode.oneOf[1].enum must be a non-empty array of boolean values",
    )


def test_every_bad_path_is_reported_at_once_in_walk_order() -> None:
    spec = {
        "type": "object",
        "pattern": "x",
        "properties": {
            "a": {"type": "weird"},
            "b": {"type": "string", "minimum": 1, "required": 2},
            "c": {"type": "array", "items": {"oneOf": [{"type": "string"}]}},
        },
    }
    with pytest.raises(SchemaSpecError) as info:
        value_schema_to_json_schema(spec)
    error = info.value
    assert error.violations == (
        "schema.pattern is not supported by the value schema DSL",
        "schema.additionalProperties must be explicitly true or false",
        _TYPE_MESSAGE.replace("schema.", "schema.properties.a.", 1),
        "schema.properties.b.minimum is not supported by the value schema DSL",
        "schema.properties.b.required must be true when present",
        "schema.properties.c.items.oneOf must be an array of at least two value schemas",
    )
    assert error.code == ErrorCode.INVALID_SCHEMA_SPEC.value
    assert str(error) == "invalid schema spec: " + "; ".join(error.violations)
    assert isinstance(error, ValueError)


def test_one_node_reports_all_its_own_problems() -> None:
    spec = {"type": "integer", "enum": [True], "const": "x", "description": 3, "bogus": 1}
    with pytest.raises(SchemaSpecError) as info:
        value_schema_to_json_schema(spec)
    assert info.value.violations == (
        "schema.bogus is not supported by the value schema DSL",
        "schema.description must be a string",
        "schema.enum must be a non-empty array of integer values",
        "schema.const must be an integer value",
    )


# ---------------------------------------------------------------------------
# Cycles and depth


def test_array_cycle_is_reported() -> None:
    node: dict[str, Any] = {"type": "array"}
    node["items"] = node
    with pytest.raises(SchemaSpecError) as info:
        value_schema_to_json_schema(node)
    assert info.value.violations == ("schema.items is circular",)


def test_one_of_cycle_is_reported() -> None:
    node: dict[str, Any] = {"oneOf": [{"type": "null"}]}
    node["oneOf"].append({"type": "array", "items": node})
    with pytest.raises(SchemaSpecError) as info:
        value_schema_to_json_schema(node)
    assert info.value.violations == ("schema.oneOf[1].items is circular",)


def test_cycle_through_the_parameter_root_is_reported() -> None:
    params: dict[str, Any] = {}
    params["self"] = {"type": "object", "additionalProperties": True, "properties": params}
    with pytest.raises(SchemaSpecError) as info:
        parameter_schema_to_json_schema(params)
    assert info.value.violations == ("parameters.self.properties.self is circular",)


def _depth(schema: dict[str, Any], key: str) -> int:
    depth = 0
    node: Any = schema
    while node:
        depth += 1
        if key == "oneOf":
            node = node["oneOf"][0] if "oneOf" in node else None
        elif key == "items":
            node = node.get("items")
        else:
            node = node.get("properties", {}).get("x")
    return depth


_DEPTH = 5_000


def _wrap_one_of(node: dict[str, Any]) -> dict[str, Any]:
    return {"oneOf": [node, {"type": "null"}]}


def _wrap_array(node: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": node}


def _wrap_object(node: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": False, "properties": {"x": {**node, "required": True}}}


@pytest.mark.parametrize(
    ("wrap", "key"), [(_wrap_one_of, "oneOf"), (_wrap_array, "items"), (_wrap_object, "properties")]
)
def test_deep_chain_compiles_without_recursion(wrap: Any, key: str) -> None:
    node: dict[str, Any] = {"type": "string"}
    for _ in range(_DEPTH):
        node = wrap(node)
    compiled = value_schema_to_json_schema(node)
    assert _depth(compiled, key) == _DEPTH + 1


def test_deep_chain_reports_the_deep_violation() -> None:
    node: dict[str, Any] = {"type": "string", "bogus": True}
    for _ in range(_DEPTH):
        node = _wrap_array(node)
    with pytest.raises(SchemaSpecError) as info:
        value_schema_to_json_schema(node)
    assert info.value.violations == ("schema" + ".items" * _DEPTH + ".bogus is not supported by the value schema DSL",)


def test_a_deep_chain_compiles_in_memory_linear_in_depth() -> None:
    node: dict[str, Any] = {"type": "string"}
    for _ in range(10_000):
        node = _wrap_object(node)
    tracemalloc.start()
    try:
        compiled = value_schema_to_json_schema(node)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert _depth(compiled, "properties") == 10_001
    # The compiled schema takes about 8 MB; paths kept as text took hundreds.
    assert peak < 32 * 1024 * 1024, peak


@pytest.mark.slow
def test_define_tool_compiles_a_40_000_deep_spec_in_bounded_memory() -> None:
    node: dict[str, Any] = {"type": "string"}
    for _ in range(40_000):
        node = _wrap_object(node)
    tracemalloc.start()
    try:
        tool = define_tool(
            name="deep", description="d", parameters={"x": {**node, "required": True}}, output=node, execute=print
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert _depth(tool.output.schema, "properties") == 40_001
    # The compiled schemas themselves take about 60 MB; a path string per pending node took gigabytes.
    assert peak < 200 * 1024 * 1024, peak


# ---------------------------------------------------------------------------
# The raw-subset safety net


def test_compiled_schema_goes_through_the_subset_assertion(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[object] = []
    monkeypatch.setattr(_dsl, "assert_supported_json_schema", seen.append)
    compiled = parameter_schema_to_json_schema({"a": {"type": "string"}})
    assert seen == [compiled]
    assert seen[0] is compiled


@pytest.mark.parametrize(
    ("compile_spec", "spec", "raw", "expected"),
    [
        pytest.param(
            parameter_schema_to_json_schema,
            {"a": {"type": "string"}},
            ["schema.properties.a.enum is wrong", "schema.required is wrong"],
            ("parameters.a.enum is wrong", "parameters.required is wrong"),
            id="parameters-relabelled",
        ),
        pytest.param(
            value_schema_to_json_schema,
            {"type": "string"},
            ["schema.enum is wrong"],
            ("schema.enum is wrong",),
            id="value-unchanged",
        ),
    ],
)
def test_subset_violations_become_a_schema_spec_error(
    monkeypatch: pytest.MonkeyPatch, compile_spec: Any, spec: dict[str, Any], raw: list[str], expected: tuple[str, ...]
) -> None:
    def reject(schema: object) -> None:
        raise JsonSchemaError(raw)

    monkeypatch.setattr(_dsl, "assert_supported_json_schema", reject)
    with pytest.raises(SchemaSpecError) as info:
        compile_spec(spec)
    assert info.value.violations == expected
    assert isinstance(info.value.__cause__, JsonSchemaError)


def test_subset_is_not_consulted_when_the_spec_already_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[object] = []
    monkeypatch.setattr(_dsl, "assert_supported_json_schema", seen.append)
    with pytest.raises(SchemaSpecError):
        value_schema_to_json_schema({"type": "nope"})
    assert seen == []


# ---------------------------------------------------------------------------
# Property: every valid spec compiles to an accepted raw schema

_SCALAR_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "string": st.text(max_size=5),
    "number": st.integers(-1000, 1000)
    | st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: f != 0 or math.copysign(1, f) > 0),
    "integer": st.integers() | st.integers(-(2**53), 2**53).map(float),
    "boolean": st.booleans(),
    "null": st.none(),
}
_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=4) | st.floats(-1e6, 1e6).filter(lambda f: f != 0),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=4), children, max_size=3),
    max_leaves=6,
)
# Plain keys keep the dotted paths unambiguous (a key "a.items" would alias a path).
_keys = st.text(alphabet="abxyz_", max_size=5)
_annotations = st.fixed_dictionaries(
    {},
    optional={
        "description": st.text(max_size=8),
        "title": st.text(max_size=8),
        "default": _json_values,
        "examples": st.lists(_json_values, max_size=2),
    },
)


@st.composite
def _scalar_specs(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(sorted(_SCALAR_VALUES)))
    node: dict[str, Any] = {"type": kind, **draw(_annotations)}
    values = _SCALAR_VALUES[kind]
    mode = draw(st.sampled_from(["plain", "enum", "const", "both"]))
    if mode in ("enum", "both"):
        node["enum"] = draw(st.lists(values, min_size=1, max_size=4))
    if mode == "const":
        node["const"] = draw(values)
    if mode == "both":
        node["const"] = draw(st.sampled_from(node["enum"]))
    return node


def _with_required(node: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    return st.tuples(node, st.booleans()).map(lambda pair: {**pair[0], "required": True} if pair[1] else pair[0])


def _containers(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    arrays = st.builds(
        lambda annotations, items: {"type": "array", **annotations, **items},
        _annotations,
        st.fixed_dictionaries({}, optional={"items": children}),
    )
    objects = st.builds(
        lambda annotations, closed, properties: {
            "type": "object",
            **annotations,
            "additionalProperties": closed,
            **properties,
        },
        _annotations,
        st.booleans(),
        st.fixed_dictionaries(
            {}, optional={"properties": st.dictionaries(_keys, _with_required(children), max_size=4)}
        ),
    )
    one_ofs = st.builds(
        lambda annotations, branches: {"oneOf": branches, **annotations},
        _annotations,
        st.lists(children, min_size=2, max_size=3),
    )
    return arrays | objects | one_ofs


value_specs = st.recursive(
    _scalar_specs() | st.builds(lambda a: {"type": "json", **a}, _annotations), _containers, max_leaves=12
)
parameter_specs = st.dictionaries(_keys, _with_required(value_specs), max_size=5)


def _ids(tree: object) -> set[int]:
    found: set[int] = set()
    pending = [tree]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            found.add(id(item))
            pending.extend(item.values())
        elif isinstance(item, list):
            found.add(id(item))
            pending.extend(item)
    return found


_property_settings = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_property_settings
@given(value_specs)
def test_every_valid_value_spec_compiles_to_a_supported_schema(spec: dict[str, Any]) -> None:
    compiled = value_schema_to_json_schema(spec)
    assert_supported_json_schema(compiled)
    assert not _ids(compiled) & _ids(spec)


@_property_settings
@given(parameter_specs)
def test_every_valid_parameter_spec_compiles_to_a_supported_object_schema(spec: dict[str, Any]) -> None:
    compiled = parameter_schema_to_json_schema(spec)
    assert_supported_json_schema(compiled)
    assert compiled["type"] == "object"
    assert list(compiled["properties"]) == list(spec)
    assert compiled.get("required", []) == [key for key, node in spec.items() if node.get("required") is True]


def _nodes_with_paths(spec: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    found: list[tuple[str, dict[str, Any]]] = []
    pending: list[tuple[str, dict[str, Any]]] = [("schema", spec)]
    while pending:
        path, node = pending.pop()
        found.append((path, node))
        if "items" in node:
            pending.append((f"{path}.items", node["items"]))
        for key, child in node.get("properties", {}).items():
            pending.append((f"{path}.properties.{key}", child))
        for index, branch in enumerate(node.get("oneOf", ())):
            pending.append((f"{path}.oneOf[{index}]", branch))
    return found


@_property_settings
@given(value_specs, st.data())
def test_every_bad_node_is_named(spec: dict[str, Any], data: st.DataObject) -> None:
    nodes = _nodes_with_paths(spec)
    chosen = data.draw(st.sets(st.sampled_from(range(len(nodes))), min_size=1))
    # Rebuild the spec with an unknown keyword on each chosen node (the nodes may be shared).
    bad = {nodes[index][0] for index in chosen}
    poisoned = _poison(spec, "schema", bad)
    with pytest.raises(SchemaSpecError) as info:
        value_schema_to_json_schema(poisoned)
    assert sorted(info.value.violations) == sorted(
        f"{path}.bogus is not supported by the value schema DSL" for path in bad
    )


def _poison(node: dict[str, Any], path: str, bad: set[str]) -> dict[str, Any]:
    out = dict(node)
    if "items" in out:
        out["items"] = _poison(out["items"], f"{path}.items", bad)
    if "properties" in out:
        out["properties"] = {k: _poison(v, f"{path}.properties.{k}", bad) for k, v in out["properties"].items()}
    if "oneOf" in out:
        out["oneOf"] = [_poison(b, f"{path}.oneOf[{i}]", bad) for i, b in enumerate(out["oneOf"])]
    if path in bad:
        out["bogus"] = 1
    return out


def test_a_spec_with_many_problems_gives_a_bounded_message() -> None:
    spec = {f"p{n:03d}": {"type": "strin"} for n in range(500)}
    with pytest.raises(SchemaSpecError) as info:
        parameter_schema_to_json_schema(spec)
    assert len(info.value.violations) == 500  # every problem is still on the exception
    message = str(info.value)
    assert message.startswith("invalid schema spec: parameters.p000.type ")
    assert message.endswith("; … and 480 more")
    assert message.count("parameters.p") == 20
    assert len(message) < 5000


def test_a_huge_problem_is_elided_in_the_middle_of_the_message() -> None:
    spec = {"p" + "x" * 100_000: {"type": "strin"}}
    with pytest.raises(SchemaSpecError) as info:
        parameter_schema_to_json_schema(spec)
    (violation,) = info.value.violations
    message = str(info.value)
    assert len(message) < 2100
    assert message.startswith("invalid schema spec: parameters.pxxx") and "x…x" in message
    assert message.endswith(violation[-20:])
