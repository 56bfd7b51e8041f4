"""The raw JSON Schema subset assertion: one test per rule, walk order, multi-error reports, deep schemas."""

from __future__ import annotations

import collections
import copy
import enum
import json
import math
import tracemalloc
from typing import Any

import pytest

from dsh_core._errors import JsonSchemaError
from dsh_core._json import snapshot_json
from dsh_core._schema._subset import TOOL_ARGUMENTS_ROOT, assert_object_json_schema, assert_supported_json_schema

UNSUPPORTED = (
    "is not a supported keyword (subset: type/oneOf/properties/required/additionalProperties/items/enum/const"
    " + annotations)"
)
TYPES = "object/array/string/number/integer/boolean/null"


class Colour(enum.IntEnum):
    RED = 1


class Name(str):
    pass


def violations_of(schema: object) -> tuple[str, ...]:
    with pytest.raises(JsonSchemaError) as caught:
        assert_supported_json_schema(schema)
    return caught.value.violations


def circular_items() -> dict[str, Any]:
    node: dict[str, Any] = {"type": "array"}
    node["items"] = node
    return node


def circular_branch() -> dict[str, Any]:
    node: dict[str, Any] = {"oneOf": [{"type": "null"}]}
    node["oneOf"].append({"type": "object", "properties": {"again": node}})
    return node


@pytest.mark.parametrize(
    "schema",
    [
        pytest.param({}, id="annotation-only"),
        pytest.param(
            {"description": "any", "title": "t", "default": [1, {"a": None}], "examples": [1, "x"]}, id="annotations"
        ),
        pytest.param({"type": "null"}, id="scalar-root"),
        pytest.param({"type": "array"}, id="array-without-items"),
        pytest.param({"type": "array", "items": {}}, id="array-any-items"),
        pytest.param({"type": "object"}, id="bare-object"),
        pytest.param({"type": "object", "additionalProperties": True}, id="open-object"),
        pytest.param(
            {
                "type": "object",
                "additionalProperties": False,
                "properties": {"a": {"type": "string"}, "b": {"type": "integer", "default": 3}},
                "required": ["a"],
            },
            id="closed-object",
        ),
        pytest.param({"oneOf": [{"type": "string"}, {"type": "null"}], "description": "x"}, id="oneOf"),
        pytest.param({"oneOf": ({"type": "string"}, {})}, id="oneOf-tuple"),
        pytest.param({"type": "string", "enum": ("a", "b"), "const": "a"}, id="enum-tuple-with-const"),
        pytest.param({"type": "integer", "enum": [1, 2.0, 10**30]}, id="integer-enum-integral-float"),
        pytest.param({"type": "number", "enum": [1.0, 2.5], "const": 1}, id="const-in-enum-numerically"),
        pytest.param({"type": "boolean", "enum": [True, False], "const": False}, id="boolean-enum"),
        pytest.param({"type": "null", "enum": [None], "const": None}, id="null-const"),
        pytest.param({"type": "object", "properties": {}, "required": []}, id="empty-required"),
        pytest.param(
            {"type": "object", "properties": {"x y": {}, "": {}, "ü": {}}, "required": ["x y", ""]}, id="odd-names"
        ),
    ],
)
def test_supported_schemas_pass(schema: object) -> None:
    assert_supported_json_schema(schema)
    assert_supported_json_schema(snapshot_json(schema))


def test_sibling_reuse_is_not_circular() -> None:
    shared = {"type": "string"}
    assert_supported_json_schema(
        {
            "type": "object",
            "properties": {"a": shared, "b": shared, "c": {"type": "array", "items": shared}},
        }
    )
    assert_supported_json_schema({"oneOf": [shared, shared]})


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        # 1. node shape
        pytest.param(None, ["schema must be a schema object"], id="none-root"),
        pytest.param("string", ["schema must be a schema object"], id="str-root"),
        pytest.param([{"type": "string"}], ["schema must be a schema object"], id="list-root"),
        pytest.param(True, ["schema must be a schema object"], id="bool-root"),
        pytest.param(collections.OrderedDict(type="string"), ["schema must be a schema object"], id="dict-subclass"),
        pytest.param({1: "x"}, ["schema must be a schema object"], id="non-str-key"),
        pytest.param({Name("type"): "string"}, ["schema must be a schema object"], id="str-subclass-key"),
        pytest.param({"type": "array", "items": 5}, ["schema.items must be a schema object"], id="items-not-node"),
        pytest.param(
            {"oneOf": [{"type": "null"}, "x"]}, ["schema.oneOf[1] must be a schema object"], id="branch-not-node"
        ),
        # 2. cycles
        pytest.param(circular_items(), ["schema.items is circular"], id="circular-items"),
        pytest.param(circular_branch(), ["schema.oneOf[1].properties.again is circular"], id="circular-branch"),
        # 3. keywords and annotations
        pytest.param({"pattern": "x"}, [f"schema.pattern {UNSUPPORTED}"], id="unknown-pattern"),
        pytest.param({"$ref": "#/x"}, [f"schema.$ref {UNSUPPORTED}"], id="unknown-ref"),
        pytest.param({"type": "integer", "minimum": 1}, [f"schema.minimum {UNSUPPORTED}"], id="unknown-minimum"),
        pytest.param({"anyOf": [{}, {}]}, [f"schema.anyOf {UNSUPPORTED}"], id="unknown-anyOf"),
        pytest.param({"default": math.nan}, ["schema.default annotation must be lossless JSON data"], id="default-nan"),
        pytest.param(
            {"examples": [1, {2, 3}]}, ["schema.examples annotation must be lossless JSON data"], id="examples-set"
        ),
        pytest.param(
            {"default": -0.0}, ["schema.default annotation must be lossless JSON data"], id="default-neg-zero"
        ),
        pytest.param(
            {"default": {1: "a"}}, ["schema.default annotation must be lossless JSON data"], id="default-int-key"
        ),
        # 4. description and title
        pytest.param({"description": 5}, ["schema.description must be a string"], id="description-int"),
        pytest.param({"title": ["t"]}, ["schema.title must be a string"], id="title-list"),
        pytest.param({"examples": "notalist"}, ["schema.examples must be an array"], id="examples-string"),
        pytest.param({"examples": {"a": 1}}, ["schema.examples must be an array"], id="examples-object"),
        pytest.param(
            {"description": b"x"},
            ["schema.description annotation must be lossless JSON data", "schema.description must be a string"],
            id="description-bytes-both",
        ),
        # 5. type beside oneOf; children not visited
        pytest.param(
            {"type": "string", "oneOf": [{"type": "weird"}, {}]},
            ["schema cannot declare both type and oneOf"],
            id="type-and-oneOf",
        ),
        # 6. constraints without type or oneOf, in keyword order; children not visited
        pytest.param(
            {"const": 1, "items": {"type": "weird"}, "properties": {}},
            [
                "schema.properties requires type or oneOf",
                "schema.items requires type or oneOf",
                "schema.const requires type or oneOf",
            ],
            id="constraints-without-type",
        ),
        pytest.param(
            {"required": [], "additionalProperties": True, "enum": [1]},
            [
                "schema.required requires type or oneOf",
                "schema.additionalProperties requires type or oneOf",
                "schema.enum requires type or oneOf",
            ],
            id="object-keywords-without-type",
        ),
        # 7. oneOf
        pytest.param({"oneOf": []}, ["schema.oneOf must be an array of at least two schemas"], id="oneOf-empty"),
        pytest.param({"oneOf": [{}]}, ["schema.oneOf must be an array of at least two schemas"], id="oneOf-single"),
        pytest.param({"oneOf": "x"}, ["schema.oneOf must be an array of at least two schemas"], id="oneOf-str"),
        pytest.param(
            {"oneOf": {"a": {}, "b": {}}}, ["schema.oneOf must be an array of at least two schemas"], id="oneOf-dict"
        ),
        pytest.param(
            {"oneOf": collections.UserList([{}, {}])},
            ["schema.oneOf must be an array of at least two schemas"],
            id="oneOf-list-like",
        ),
        pytest.param(
            {"oneOf": [{"type": "weird"}, {}], "items": {}, "enum": [1]},
            [
                f"schema.oneOf[0].type must be one of {TYPES}",
                "schema.items is not supported beside oneOf",
                "schema.enum is not supported beside oneOf",
            ],
            id="oneOf-siblings-after-branches",
        ),
        pytest.param(
            {"oneOf": [], "const": 1},
            ["schema.oneOf must be an array of at least two schemas", "schema.const is not supported beside oneOf"],
            id="oneOf-invalid-and-sibling",
        ),
        # 8. type
        pytest.param(
            {"type": ["string", "null"]},
            ["schema.type must be a single type string (type arrays are not supported)"],
            id="type-array",
        ),
        pytest.param(
            {"type": ("string",)},
            ["schema.type must be a single type string (type arrays are not supported)"],
            id="type-tuple",
        ),
        pytest.param({"type": "weird"}, [f"schema.type must be one of {TYPES}"], id="type-unknown"),
        pytest.param({"type": "json"}, [f"schema.type must be one of {TYPES}"], id="type-json-is-dsl-only"),
        pytest.param({"type": None}, [f"schema.type must be one of {TYPES}"], id="type-none"),
        pytest.param({"type": Name("string")}, [f"schema.type must be one of {TYPES}"], id="type-str-subclass"),
        pytest.param(
            {"type": "weird", "items": 5, "enum": []}, [f"schema.type must be one of {TYPES}"], id="type-invalid-stops"
        ),
        # 9. misplaced keywords
        pytest.param(
            {"type": "string", "items": {"type": "weird"}, "properties": {}},
            ['schema.properties is not supported on type "string"', 'schema.items is not supported on type "string"'],
            id="misplaced-on-string",
        ),
        pytest.param(
            {"type": "object", "const": "a", "enum": ["a"]},
            ['schema.enum is not supported on type "object"', 'schema.const is not supported on type "object"'],
            id="misplaced-on-object",
        ),
        pytest.param(
            {"type": "array", "required": [], "additionalProperties": False},
            [
                'schema.required is not supported on type "array"',
                'schema.additionalProperties is not supported on type "array"',
            ],
            id="misplaced-on-array",
        ),
        # 10. object
        pytest.param(
            {"type": "object", "properties": [{"type": "string"}]},
            ["schema.properties must be an object of schemas"],
            id="properties-list",
        ),
        pytest.param(
            {"type": "object", "properties": None},
            ["schema.properties must be an object of schemas"],
            id="properties-none",
        ),
        pytest.param(
            {"type": "object", "properties": {1: {}}},
            ["schema.properties must be an object of schemas"],
            id="properties-int-key",
        ),
        pytest.param(
            {"type": "object", "properties": {"a": {"type": "weird"}}},
            [f"schema.properties.a.type must be one of {TYPES}"],
            id="property-visited",
        ),
        pytest.param(
            {"type": "object", "properties": {"a": {}}, "required": "a"},
            ["schema.required must be an array of strings"],
            id="required-str",
        ),
        pytest.param(
            {"type": "object", "properties": {"a": {}}, "required": ["a", 1]},
            ["schema.required must be an array of strings"],
            id="required-int-entry",
        ),
        pytest.param(
            {"type": "object", "properties": {"a": {}}, "required": ["a", "b"]},
            ['schema.required names "b" which is not in properties'],
            id="required-undeclared",
        ),
        pytest.param(
            {"type": "object", "required": ["a"]},
            ['schema.required names "a" which is not in properties'],
            id="required-without-properties",
        ),
        pytest.param(
            {"type": "object", "properties": [], "required": ["a"]},
            ["schema.properties must be an object of schemas", 'schema.required names "a" which is not in properties'],
            id="required-with-invalid-properties",
        ),
        pytest.param(
            {"type": "object", "additionalProperties": "no"},
            ["schema.additionalProperties must be a boolean"],
            id="additionalProperties-str",
        ),
        pytest.param(
            {"type": "object", "additionalProperties": 0},
            ["schema.additionalProperties must be a boolean"],
            id="additionalProperties-zero",
        ),
        pytest.param(
            {"type": "object", "additionalProperties": {"type": "string"}},
            ["schema.additionalProperties must be a boolean"],
            id="additionalProperties-schema",
        ),
        # 11. array
        pytest.param(
            {"type": "array", "items": {"type": "weird"}},
            [f"schema.items.type must be one of {TYPES}"],
            id="items-visited",
        ),
        # 12. scalar enum / const
        pytest.param(
            {"type": "number", "enum": ["1"]},
            ["schema.enum must be a non-empty array of number values"],
            id="enum-wrong-type",
        ),
        pytest.param(
            {"type": "string", "enum": []}, ["schema.enum must be a non-empty array of string values"], id="enum-empty"
        ),
        pytest.param(
            {"type": "string", "enum": "a"},
            ["schema.enum must be a non-empty array of string values"],
            id="enum-not-array",
        ),
        pytest.param(
            {"type": "string", "enum": None}, ["schema.enum must be a non-empty array of string values"], id="enum-none"
        ),
        pytest.param(
            {"type": "integer", "enum": [1, 1.5]},
            ["schema.enum must be a non-empty array of integer values"],
            id="enum-non-integral",
        ),
        pytest.param(
            {"type": "integer", "enum": [True]},
            ["schema.enum must be a non-empty array of integer values"],
            id="enum-bool-as-int",
        ),
        pytest.param(
            {"type": "number", "enum": [False, 0]},
            ["schema.enum must be a non-empty array of number values"],
            id="enum-bool-as-number",
        ),
        pytest.param(
            {"type": "integer", "enum": [Colour.RED]},
            ["schema.enum must be a non-empty array of integer values"],
            id="enum-int-subclass",
        ),
        pytest.param(
            {"type": "number", "enum": [math.inf]},
            ["schema.enum must be a non-empty array of number values"],
            id="enum-inf",
        ),
        pytest.param(
            {"type": "number", "enum": [-0.0]},
            ["schema.enum must be a non-empty array of number values"],
            id="enum-neg-zero",
        ),
        pytest.param(
            {"type": "boolean", "enum": [1]},
            ["schema.enum must be a non-empty array of boolean values"],
            id="enum-int-as-bool",
        ),
        pytest.param(
            {"type": "null", "enum": [0]},
            ["schema.enum must be a non-empty array of null values"],
            id="enum-zero-as-null",
        ),
        pytest.param(
            {"type": "integer", "const": 1.5}, ["schema.const must be a integer value"], id="const-non-integral"
        ),
        pytest.param({"type": "number", "const": -0.0}, ["schema.const must be a number value"], id="const-neg-zero"),
        pytest.param({"type": "number", "const": math.nan}, ["schema.const must be a number value"], id="const-nan"),
        pytest.param({"type": "boolean", "const": 1}, ["schema.const must be a boolean value"], id="const-int-as-bool"),
        pytest.param(
            {"type": "integer", "const": False}, ["schema.const must be a integer value"], id="const-bool-as-int"
        ),
        pytest.param(
            {"type": "string", "const": Name("a")}, ["schema.const must be a string value"], id="const-str-subclass"
        ),
        pytest.param({"type": "null", "const": "null"}, ["schema.const must be a null value"], id="const-str-as-null"),
        pytest.param(
            {"type": "string", "enum": ["a"], "const": "b"},
            ["schema.const must be one of schema.enum when both are declared"],
            id="const-not-in-enum",
        ),
        pytest.param(
            {"type": "integer", "enum": [0], "const": 1},
            ["schema.const must be one of schema.enum when both are declared"],
            id="const-not-in-integer-enum",
        ),
        pytest.param(
            {"type": "string", "enum": [1], "const": "a"},
            ["schema.enum must be a non-empty array of string values"],
            id="invalid-enum-skips-membership",
        ),
        pytest.param(
            {"type": "string", "enum": ["a"], "const": 1},
            ["schema.const must be a string value"],
            id="invalid-const-skips-membership",
        ),
    ],
)
def test_rule_violation(schema: object, expected: list[str]) -> None:
    assert list(violations_of(schema)) == expected


def test_the_three_violation_example() -> None:
    schema = {
        "type": "object",
        "pattern": "x",
        "properties": {"a": {"type": "weird"}, "b": {"type": "string", "minimum": 1}},
    }
    assert violations_of(schema) == (
        f"schema.pattern {UNSUPPORTED}",
        f"schema.properties.a.type must be one of {TYPES}",
        f"schema.properties.b.minimum {UNSUPPORTED}",
    )


def test_the_error_lists_every_problem_as_errors_the_name_spec_gives() -> None:
    # SPEC §2.2 names the list `.errors`; `.violations` is the same tuple under the name the other schema errors use.
    with pytest.raises(JsonSchemaError) as caught:
        assert_supported_json_schema({"type": "object", "properties": {"a": {"$ref": "x"}}, "required": ["c"]})
    assert caught.value.errors == (
        f"schema.properties.a.$ref {UNSUPPORTED}",
        'schema.required names "c" which is not in properties',
    )
    assert caught.value.errors is caught.value.violations


def test_every_violation_is_reported_in_walk_order() -> None:
    schema = {
        "type": "object",
        "format": "x",
        "properties": {
            "first": {"type": "array", "items": {"type": "string", "enum": []}},
            "second": {
                "oneOf": [{"type": "integer", "const": 1.5}, {"type": "object", "required": ["z"]}],
                "required": ["q"],
            },
            "third": {"type": "boolean", "title": 3},
        },
        "required": ["first", "missing"],
        "additionalProperties": "yes",
    }
    assert violations_of(schema) == (
        f"schema.format {UNSUPPORTED}",
        "schema.properties.first.items.enum must be a non-empty array of string values",
        "schema.properties.second.oneOf[0].const must be a integer value",
        'schema.properties.second.oneOf[1].required names "z" which is not in properties',
        "schema.properties.second.required is not supported beside oneOf",
        "schema.properties.third.title must be a string",
        'schema.required names "missing" which is not in properties',
        "schema.additionalProperties must be a boolean",
    )


def test_error_carries_code_and_joined_message() -> None:
    with pytest.raises(JsonSchemaError) as caught:
        assert_supported_json_schema({"type": "weird", "x": 1})
    error = caught.value
    assert error.code == "UNSUPPORTED_SCHEMA"
    assert isinstance(error, ValueError)
    assert str(error) == "unsupported JSON schema: " + "; ".join(error.violations)
    assert len(error.violations) == 2


def test_frozen_snapshot_schemas_are_checked_alike() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "weird"}}, "required": ["b"]}
    assert violations_of(snapshot_json(schema)) == violations_of(schema)


def test_assertion_does_not_modify_the_schema() -> None:
    schema = {
        "type": "object",
        "properties": {"a": {"type": "string", "default": "x"}, "b": {"type": "weird"}},
        "required": ["a"],
    }
    before = copy.deepcopy(schema)
    violations_of(schema)
    assert json.dumps(schema) == json.dumps(before)


# --- object-rooted assertion ----------------------------------------------------------------------

OBJECT_ROOT = 'schema.type must be "object" (structured output is object-rooted)'


@pytest.mark.parametrize(
    "schema",
    [
        {},
        {"type": "string"},
        {"type": "array", "items": {"type": "object"}},
        {"oneOf": [{"type": "object"}, {"type": "object"}]},
    ],
    ids=["annotation-only", "string", "array-of-objects", "oneOf-of-objects"],
)
def test_object_root_is_required(schema: object) -> None:
    with pytest.raises(JsonSchemaError) as caught:
        assert_object_json_schema(schema)
    assert caught.value.violations == (OBJECT_ROOT,)


def test_object_root_reason_names_the_caller() -> None:
    with pytest.raises(JsonSchemaError) as caught:
        assert_object_json_schema({"type": "array"}, reason=TOOL_ARGUMENTS_ROOT)
    assert caught.value.violations == ('schema.type must be "object" (tool arguments are a JSON object)',)
    assert_object_json_schema({"type": "object"}, reason=TOOL_ARGUMENTS_ROOT)


def test_object_root_accepts_object_schemas() -> None:
    assert_object_json_schema({"type": "object"})
    assert_object_json_schema(snapshot_json({"type": "object", "properties": {"a": {}}, "required": ["a"]}))


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        ({"type": "array", "x": 1}, (f"schema.x {UNSUPPORTED}",)),
        (5, ("schema must be a schema object",)),
        ({"type": "object", "required": ["a"]}, ('schema.required names "a" which is not in properties',)),
    ],
)
def test_object_root_rule_only_when_otherwise_valid(schema: object, expected: tuple[str, ...]) -> None:
    with pytest.raises(JsonSchemaError) as caught:
        assert_object_json_schema(schema)
    assert caught.value.violations == expected


# --- deep schemas ---------------------------------------------------------------------------------


def nest(depth: int, kind: str, leaf: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """A schema ``depth`` levels deep through ``kind``, and the path of its leaf."""
    node = leaf
    steps = {"properties": ".properties.p", "items": ".items", "oneOf": ".oneOf[0]"}
    for _ in range(depth):
        if kind == "properties":
            node = {"type": "object", "properties": {"p": node}, "required": ["p"]}
        elif kind == "items":
            node = {"type": "array", "items": node}
        else:
            node = {"oneOf": [node, {"type": "null"}]}
    return node, "schema" + steps[kind] * depth


@pytest.mark.parametrize("kind", ["properties", "items", "oneOf"])
@pytest.mark.parametrize("depth", [1000, 5000])
def test_deep_schemas_are_walked_iteratively(kind: str, depth: int) -> None:
    schema, _ = nest(depth, kind, {"type": "string"})
    assert_supported_json_schema(schema)
    bad, leaf_path = nest(depth, kind, {"type": "string", "minLength": 1})
    assert violations_of(bad) == (f"{leaf_path}.minLength {UNSUPPORTED}",)


@pytest.mark.parametrize("kind", ["properties", "oneOf", "items"])
def test_deep_schemas_are_checked_in_memory_linear_in_depth(kind: str) -> None:
    # A path string kept per pending node took 650 MB at this depth (and 40 000 levels ran out of memory).
    schema, leaf_path = nest(10_000, kind, {"type": "string", "minLength": 1})
    tracemalloc.start()
    try:
        assert violations_of(schema) == (f"{leaf_path}.minLength {UNSUPPORTED}",)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * 1024 * 1024, peak


def test_deep_cycle_is_found() -> None:
    schema, _ = nest(3000, "items", {"type": "array"})
    leaf = schema
    while "items" in leaf:
        leaf = leaf["items"]
    leaf["items"] = schema
    assert violations_of(schema) == ("schema" + ".items" * 3001 + " is circular",)
