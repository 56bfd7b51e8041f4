"""Value validation against the subset: every message, the path rules, the fast path's soundness, deep inputs, the cache."""

from __future__ import annotations

import collections
import copy
import decimal
import enum
import json
import math
import tracemalloc
from typing import Any

import fastjsonschema
import pytest
from corpus.regressions import HUGE_INT
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dsh_core import _jsoncodec
from dsh_core._errors import QUOTED_CHARS, JsonSchemaError, NonJsonValueError, elide_middle
from dsh_core._json import FrozenDict, snapshot_json
from dsh_core._schema import _validate
from dsh_core._schema._subset import assert_supported_json_schema
from dsh_core._schema._validate import compile_validator, report_violations, validate_json_schema_value


class Colour(enum.IntEnum):
    RED = 1


class Name(str):
    pass


class Custom:
    pass


def cyclic() -> list[Any]:
    value: list[Any] = []
    value.append(value)
    return value


STRING = {"type": "string"}
NUMBER = {"type": "number"}
INTEGER = {"type": "integer"}
BOOLEAN = {"type": "boolean"}
NULL = {"type": "null"}
OBJECT = {"type": "object"}
ARRAY = {"type": "array"}
ANY: dict[str, Any] = {}

SERVERS = {
    "type": "object",
    "properties": {
        "config": {"type": "object", "properties": {"host": STRING}, "required": ["host"]},
        "servers": {"type": "array", "items": {"type": "object", "properties": {"host": STRING}}},
    },
    "required": ["config"],
}


# --- one message per rule -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "value", "expected"),
    [
        # annotation-only nodes take any lossless JSON value
        pytest.param(ANY, math.nan, '"value" must be a lossless JSON value', id="any-nan"),
        pytest.param(ANY, math.inf, '"value" must be a lossless JSON value', id="any-inf"),
        pytest.param(ANY, -0.0, '"value" must be a lossless JSON value', id="any-neg-zero"),
        pytest.param(ANY, {1, 2}, '"value" must be a lossless JSON value', id="any-set"),
        pytest.param(ANY, b"x", '"value" must be a lossless JSON value', id="any-bytes"),
        pytest.param(ANY, Custom(), '"value" must be a lossless JSON value', id="any-object"),
        pytest.param(ANY, Colour.RED, '"value" must be a lossless JSON value', id="any-int-subclass"),
        pytest.param(ANY, {1: "x"}, '"value" must be a lossless JSON value', id="any-int-key"),
        pytest.param(ANY, [1, [math.nan]], '"value" must be a lossless JSON value', id="any-nested-nan"),
        pytest.param(ANY, cyclic(), '"value" must be a lossless JSON value', id="any-cycle"),
        pytest.param(
            {"description": "d", "default": 1},
            decimal.Decimal(1),
            '"value" must be a lossless JSON value',
            id="annotated-any",
        ),
        # oneOf is exactly one
        pytest.param(
            {"oneOf": [NUMBER, INTEGER]}, 1, '"value" must match exactly one oneOf branch (matched 2)', id="oneOf-2"
        ),
        pytest.param(
            {"oneOf": [STRING, NULL]}, 1, '"value" must match exactly one oneOf branch (matched 0)', id="oneOf-0"
        ),
        pytest.param(
            {"oneOf": [ANY, ANY, STRING]}, "x", '"value" must match exactly one oneOf branch (matched 3)', id="oneOf-3"
        ),
        # objects
        pytest.param(OBJECT, [], '"value" must be an object', id="object-list"),
        pytest.param(OBJECT, "x", '"value" must be an object', id="object-str"),
        pytest.param(OBJECT, None, '"value" must be an object', id="object-none"),
        pytest.param(OBJECT, collections.OrderedDict(a=1), '"value" must be an object', id="object-dict-subclass"),
        pytest.param(OBJECT, collections.UserDict(a=1), '"value" must be an object', id="object-mapping"),
        pytest.param(
            {"type": "object", "properties": {"b": ANY}, "required": ["b"]},
            {},
            'missing required property "value.b"',
            id="required",
        ),
        pytest.param(
            {"type": "object", "properties": {"a": STRING}, "additionalProperties": False},
            {"a": "x", "c": 1},
            '"value.c" is not a declared property (additionalProperties: false)',
            id="undeclared",
        ),
        pytest.param(OBJECT, {"x": math.nan}, '"value" must be a lossless JSON object', id="object-nan-inside"),
        pytest.param(OBJECT, {1: "a"}, '"value" must be a lossless JSON object', id="object-int-key"),
        pytest.param(
            {"type": "object", "additionalProperties": False},
            {1: "a"},
            '"value" must be a lossless JSON object',
            id="closed-object-int-key",  # not '"value.1" is not a declared property': 1 is no JSON key
        ),
        pytest.param(
            {"type": "object", "properties": {"a": ANY}},
            {"a": 1, "b": {2}},
            '"value" must be a lossless JSON object',
            id="object-undeclared-set",
        ),
        # arrays
        pytest.param(ARRAY, {}, '"value" must be an array', id="array-dict"),
        pytest.param(ARRAY, "abc", '"value" must be an array', id="array-str"),
        pytest.param(ARRAY, {1, 2}, '"value" must be an array', id="array-set"),
        pytest.param(ARRAY, collections.deque([1]), '"value" must be an array', id="array-deque"),
        pytest.param(ARRAY, [1, math.nan], '"value" must be a dense lossless JSON array', id="array-nan-inside"),
        pytest.param(ARRAY, [b"x"], '"value" must be a dense lossless JSON array', id="array-bytes-inside"),
        pytest.param({"type": "array", "items": STRING}, ["a", 1], '"value[1]" must be a string', id="items"),
        # scalars
        pytest.param(STRING, 1, '"value" must be a string', id="string-int"),
        pytest.param(STRING, b"x", '"value" must be a string', id="string-bytes"),
        pytest.param(STRING, Name("x"), '"value" must be a string', id="string-subclass"),
        pytest.param(NUMBER, "1", '"value" must be a number', id="number-str"),
        pytest.param(NUMBER, True, '"value" must be a number', id="number-bool"),
        pytest.param(NUMBER, None, '"value" must be a number', id="number-none"),
        pytest.param(NUMBER, decimal.Decimal("1"), '"value" must be a number', id="number-decimal"),
        pytest.param(NUMBER, Colour.RED, '"value" must be a number', id="number-int-subclass"),
        pytest.param(NUMBER, math.nan, '"value" must be a finite JSON number', id="number-nan"),
        pytest.param(NUMBER, -math.inf, '"value" must be a finite JSON number', id="number-inf"),
        pytest.param(NUMBER, -0.0, '"value" must be a finite JSON number', id="number-neg-zero"),
        pytest.param(INTEGER, 1.5, '"value" must be an integer', id="integer-fraction"),
        pytest.param(INTEGER, True, '"value" must be an integer', id="integer-bool"),
        pytest.param(INTEGER, "1", '"value" must be an integer', id="integer-str"),
        pytest.param(INTEGER, math.inf, '"value" must be an integer', id="integer-inf"),
        pytest.param(INTEGER, -0.0, '"value" must be an integer', id="integer-neg-zero"),
        pytest.param(INTEGER, Colour.RED, '"value" must be an integer', id="integer-int-subclass"),
        pytest.param(BOOLEAN, 0, '"value" must be a boolean', id="boolean-zero"),
        pytest.param(BOOLEAN, 1, '"value" must be a boolean', id="boolean-one"),
        pytest.param(BOOLEAN, "true", '"value" must be a boolean', id="boolean-str"),
        pytest.param(NULL, 0, '"value" must be null', id="null-zero"),
        pytest.param(NULL, False, '"value" must be null', id="null-false"),
        pytest.param(NULL, "", '"value" must be null', id="null-empty-str"),
        # enum and const
        pytest.param(
            {"type": "string", "enum": ["red", "green"]},
            "blue",
            '"value" must be one of ["red","green"]',
            id="enum-strings",
        ),
        pytest.param({"type": "integer", "enum": [1, 2]}, 3, '"value" must be one of [1,2]', id="enum-integers"),
        pytest.param(
            {"type": "string", "enum": ["ü", 'q"']}, "x", '"value" must be one of ["ü","q\\""]', id="enum-escaping"
        ),
        pytest.param({"type": "string", "const": "a"}, "b", '"value" must be "a"', id="const-string"),
        pytest.param({"type": "integer", "const": 1}, 2, '"value" must be 1', id="const-integer"),
        pytest.param({"type": "boolean", "const": True}, False, '"value" must be true', id="const-boolean"),
        pytest.param({"type": "boolean", "const": True}, 1, '"value" must be a boolean', id="const-type-first"),
        pytest.param({"type": "integer", "enum": [1]}, True, '"value" must be an integer', id="enum-type-first"),
        pytest.param(
            {"type": "string", "enum": ["a", "b"], "const": "a"},
            "c",
            '"value" must be one of ["a","b"]',
            id="enum-before-const",
        ),
        pytest.param(
            {"type": "string", "enum": ["a", "b"], "const": "a"}, "b", '"value" must be "a"', id="const-after-enum"
        ),
    ],
)
def test_violation_message(schema: object, value: object, expected: str) -> None:
    assert validate_json_schema_value(schema, value) == (expected,)


@pytest.mark.parametrize(
    ("schema", "value"),
    [
        pytest.param(INTEGER, 1, id="integer-int"),
        pytest.param(INTEGER, 1.0, id="integer-integral-float"),
        pytest.param(INTEGER, 10**40, id="integer-huge"),
        pytest.param(INTEGER, -3e20, id="integer-big-float"),
        pytest.param(NUMBER, 0, id="number-int"),
        pytest.param(NUMBER, 0.0, id="number-zero"),
        pytest.param(NUMBER, -1.5e-300, id="number-tiny"),
        pytest.param({"type": "number", "enum": [1]}, 1.0, id="enum-numeric-equality"),
        pytest.param({"type": "integer", "const": 2.0}, 2, id="const-numeric-equality"),
        pytest.param({"type": "null", "const": None}, None, id="null-const"),
        pytest.param({"type": "boolean", "enum": [False]}, False, id="enum-false"),
        pytest.param({"oneOf": [NUMBER, INTEGER]}, 1.5, id="oneOf-exactly-one"),
        pytest.param(OBJECT, FrozenDict({"a": [1]}), id="frozen-dict-object"),
        pytest.param({"type": "array", "items": INTEGER}, (1, 2.0), id="tuple-array"),
        pytest.param(ARRAY, [[], {}, (1,)], id="array-any-items"),
        pytest.param(ANY, {"a": [None, True, "x", 1.5, {"b": ()}]}, id="any-json"),
        pytest.param({"type": "object", "properties": {"a": STRING}}, {"b": 1}, id="open-object-extra-key"),
        pytest.param({"type": "object", "additionalProperties": True}, {"b": [1]}, id="explicitly-open"),
        pytest.param({"type": "object", "properties": {"a": STRING}}, {}, id="optional-absent"),
        pytest.param({"type": "string", "default": "x"}, "", id="empty-string"),
    ],
)
def test_valid_values(schema: object, value: object) -> None:
    assert validate_json_schema_value(schema, value) == ()
    assert report_violations(snapshot_json(schema), value) == ()  # type: ignore[arg-type]


# --- paths ----------------------------------------------------------------------------------------


def test_empty_root_path_reads_as_arguments_and_children_are_dotless() -> None:
    assert validate_json_schema_value(SERVERS, [], "") == ('"arguments" must be an object',)
    assert validate_json_schema_value(SERVERS, {}, "") == ('missing required property "config"',)
    assert validate_json_schema_value(
        SERVERS, {"config": {"host": 1}, "servers": [{"host": "a"}, {"host": 2}]}, ""
    ) == (
        '"config.host" must be a string',
        '"servers[1].host" must be a string',
    )
    assert validate_json_schema_value(SERVERS, {"config": {}}, "") == ('missing required property "config.host"',)


def test_empty_root_array_items() -> None:
    assert validate_json_schema_value({"type": "array", "items": STRING}, [1], "") == ('"[0]" must be a string',)


def test_the_empty_property_name_is_named_in_bracket_form() -> None:
    """Never a blank child path: under the blank root that read as the whole "arguments"."""
    schema = {
        "type": "object",
        "properties": {"": STRING, "a": {"type": "object", "properties": {"": INTEGER}, "additionalProperties": False}},
        "required": [""],
    }
    assert validate_json_schema_value(schema, {"": 5}, "") == ('"[""]" must be a string',)
    assert validate_json_schema_value(schema, {}, "") == ('missing required property "[""]"',)
    assert validate_json_schema_value(schema, {"": "x", "a": {"": "x"}}, "") == ('"a[""]" must be an integer',)
    assert validate_json_schema_value(schema, {"": 5, "a": {"": 1}}) == ('"value[""]" must be a string',)
    closed = {"type": "object", "properties": {"a": STRING}, "additionalProperties": False}
    assert validate_json_schema_value(closed, {"": 1}, "") == (
        '"[""]" is not a declared property (additionalProperties: false)',
    )


def test_custom_root_label() -> None:
    assert validate_json_schema_value(SERVERS, {"config": {"host": 1}}, "args") == (
        '"args.config.host" must be a string',
    )
    assert validate_json_schema_value(NUMBER, "x", "result") == ('"result" must be a number',)


def test_default_root_label_is_value() -> None:
    assert validate_json_schema_value(SERVERS, {"config": {"host": 1}}) == ('"value.config.host" must be a string',)


# --- multi-error reports --------------------------------------------------------------------------


def test_object_report_order_is_required_then_children_then_undeclared() -> None:
    schema = {
        "type": "object",
        "additionalProperties": False,
        "required": ["a", "b", "z"],
        "properties": {
            "a": STRING,
            "b": INTEGER,
            "c": {"oneOf": [NUMBER, INTEGER]},
            "e": {"type": "string", "enum": ["red", "green"]},
            "k": {"type": "string", "const": "a"},
            "z": ANY,
        },
    }
    value = {"y": 0, "a": 1, "c": 1, "x": 2, "e": "blue", "k": "b"}
    assert validate_json_schema_value(schema, value) == (
        'missing required property "value.b"',
        'missing required property "value.z"',
        '"value.a" must be a string',
        '"value.c" must match exactly one oneOf branch (matched 2)',
        '"value.e" must be one of ["red","green"]',
        '"value.k" must be "a"',
        '"value.y" is not a declared property (additionalProperties: false)',
        '"value.x" is not a declared property (additionalProperties: false)',
    )


def test_nested_report_in_walk_order() -> None:
    schema = {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {"tags": {"type": "array", "items": STRING}, "n": INTEGER},
            "required": ["n"],
        },
    }
    value = [{"tags": ["a", 1, None], "n": 1.5}, {"n": 2}, {"tags": "x"}]
    assert validate_json_schema_value(schema, value) == (
        '"value[0].tags[1]" must be a string',
        '"value[0].tags[2]" must be a string',
        '"value[0].n" must be an integer',
        'missing required property "value[2].n"',
        '"value[2].tags" must be an array',
    )


def test_lossless_object_check_only_when_nothing_else_failed() -> None:
    schema = {"type": "object", "properties": {"a": STRING}}
    assert validate_json_schema_value(schema, {"a": 1, "x": math.nan}) == ('"value.a" must be a string',)
    assert validate_json_schema_value(schema, {"a": "s", "x": math.nan}) == ('"value" must be a lossless JSON object',)


def test_branch_violations_are_not_reported() -> None:
    schema = {"oneOf": [{"type": "object", "properties": {"a": STRING}, "required": ["a"]}, NULL]}
    assert validate_json_schema_value(schema, {"a": 1}) == ('"value" must match exactly one oneOf branch (matched 0)',)


def test_inspection_errors_are_contained() -> None:
    class HostileKey:
        # Collides with "a" in the dict so the lookup has to call __eq__.
        def __hash__(self) -> int:
            return hash("a")

        def __eq__(self, other: object) -> bool:
            raise RuntimeError("boom")

    value = {HostileKey(): 1}
    schema = {"type": "object", "properties": {"a": ANY}, "required": ["a"]}
    assert validate_json_schema_value(schema, value) == ('"value" must be a lossless JSON value',)
    nested = {"type": "object", "properties": {"x": schema, "y": STRING}}
    assert validate_json_schema_value(nested, {"x": value, "y": 1}) == (
        '"value.x" must be a lossless JSON value',
        '"value.y" must be a string',
    )


def test_unasserted_unknown_type_is_not_contained() -> None:
    with pytest.raises(ValueError, match="weird"):
        report_violations({"type": "weird"}, 1)


# --- schema assertion, cache, mutation ------------------------------------------------------------


@pytest.mark.parametrize(
    "schema",
    [{"type": "weird"}, {"pattern": "x"}, {"type": "integer", "const": Colour.RED}, {"default": math.nan}, 5, None],
    ids=["unknown-type", "unknown-keyword", "int-subclass-const", "nan-default", "int", "none"],
)
def test_unsupported_schema_raises(schema: object) -> None:
    with pytest.raises(JsonSchemaError) as caught:
        validate_json_schema_value(schema, 1)
    with pytest.raises(JsonSchemaError) as again:
        compile_validator(schema)
    assert caught.value.violations == again.value.violations
    with pytest.raises(JsonSchemaError):
        assert_supported_json_schema(schema)


def test_cyclic_schema_raises_with_the_assertion_message() -> None:
    node: dict[str, Any] = {"type": "array"}
    node["items"] = node
    with pytest.raises(JsonSchemaError) as caught:
        compile_validator(node)
    assert caught.value.violations == ("schema.items is circular",)


def test_cache_hit_returns_the_same_validator() -> None:
    schema = {"type": "object", "properties": {"cache-hit": STRING}, "required": ["cache-hit"]}
    first = compile_validator(schema)
    assert compile_validator(copy.deepcopy(schema)) is first
    assert compile_validator(snapshot_json(schema)) is first
    assert (
        compile_validator({"type": "object", "properties": {"cache-hit": STRING}, "required": ("cache-hit",)}) is first
    )
    assert compile_validator({**schema, "required": []}) is not first


def test_cache_key_is_type_strict() -> None:
    as_int = compile_validator({"type": "number", "const": 1})
    as_float = compile_validator({"type": "number", "const": 1.0})
    assert as_int is not as_float
    assert as_int(2) == ('"value" must be 1',)
    assert as_float(2) == ('"value" must be 1.0',)
    compile_validator({"type": "integer", "const": 1})
    with pytest.raises(JsonSchemaError):
        compile_validator({"type": "integer", "const": Colour.RED})


def test_declaration_order_decides_report_order() -> None:
    ab = {"type": "object", "properties": {"a": STRING, "b": STRING}}
    ba = {"type": "object", "properties": {"b": STRING, "a": STRING}}
    assert validate_json_schema_value(ab, {"a": 1, "b": 2}) == (
        '"value.a" must be a string',
        '"value.b" must be a string',
    )
    assert validate_json_schema_value(ba, {"a": 1, "b": 2}) == (
        '"value.b" must be a string',
        '"value.a" must be a string',
    )


def test_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_validate, "_CACHE_LIMIT", 3)
    validators = [compile_validator({"type": "string", "const": f"bounded-{i}"}) for i in range(5)]
    assert len(_validate._cache) <= 3
    assert compile_validator({"type": "string", "const": "bounded-4"}) is validators[4]
    assert compile_validator({"type": "string", "const": "bounded-0"}) is not validators[0]


def test_mutating_the_schema_later_does_not_change_the_validator() -> None:
    schema: dict[str, Any] = {"type": "object", "properties": {"later": STRING}}
    validator = compile_validator(schema)
    schema["properties"]["later"] = INTEGER
    schema["additionalProperties"] = False
    assert validator({"later": "x", "other": 1}) == ()
    assert validator({"later": 1}) == ('"value.later" must be a string',)


DEFAULTS = {
    "type": "object",
    "properties": {
        "mode": {"type": "string", "default": "fast"},
        "nested": {"type": "object", "properties": {"x": {"type": "integer", "default": 7}}, "default": {}},
        "n": {"type": "integer", "default": 1},
    },
    "required": ["n"],
}


@pytest.mark.parametrize(
    "value",
    [{"n": 1, "nested": {}}, {"nested": {"x": "bad"}}, {"n": 1, "nested": {"x": 2}, "extra": [1]}],
    ids=["valid", "invalid", "valid-extra"],
)
def test_defaults_are_never_applied_and_input_is_not_mutated(value: dict[str, Any]) -> None:
    before = copy.deepcopy(value)
    schema_before = copy.deepcopy(DEFAULTS)
    validate_json_schema_value(DEFAULTS, value)
    assert json.dumps(value) == json.dumps(before)
    assert json.dumps(DEFAULTS) == json.dumps(schema_before)


def test_missing_property_with_default_is_still_missing() -> None:
    assert validate_json_schema_value(DEFAULTS, {"mode": "x"}) == ('missing required property "value.n"',)


# --- fast path ------------------------------------------------------------------------------------


def test_ordinary_schemas_use_fastjsonschema() -> None:
    validator = compile_validator(SERVERS)
    assert validator.uses_fastjsonschema
    assert validator.fast_path_accepts({"config": {"host": "h"}})
    assert not validator.fast_path_accepts({"config": {"host": 1}})


@pytest.mark.parametrize(
    "value",
    [math.nan, math.inf, -0.0, [math.nan], {"x": -0.0}, Colour.RED, Name("x"), collections.OrderedDict(), {1: 2}],
    ids=repr,
)
def test_fast_path_refuses_values_fastjsonschema_would_accept(value: object) -> None:
    for schema in (ANY, {"oneOf": [NUMBER, STRING]}, NUMBER, OBJECT, ARRAY):
        validator = compile_validator(schema)
        assert validator.uses_fastjsonschema
        assert not validator.fast_path_accepts(value)
        assert validator(value) != ()


@pytest.mark.parametrize(
    ("schema", "value", "expected"),
    [
        pytest.param(INTEGER, HUGE_INT, '"value"', id="integer"),
        pytest.param(NUMBER, -HUGE_INT, '"value"', id="number-negative"),
        pytest.param(STRING, HUGE_INT, '"value"', id="wrong-type-too"),
        pytest.param({"type": "array", "items": INTEGER}, [1, HUGE_INT], '"value[1]"', id="array-item"),
        pytest.param({"type": "object", "properties": {"n": INTEGER}}, {"n": HUGE_INT}, '"value.n"', id="property"),
    ],
)
def test_ints_too_long_for_json_text_are_not_valid(schema: dict[str, Any], value: object, expected: str) -> None:
    """snapshot_json refuses them, so no validator may call them valid (fastjsonschema would)."""
    with pytest.raises(NonJsonValueError):
        snapshot_json(value)
    validator = compile_validator(schema)
    assert validator.uses_fastjsonschema
    assert not validator.fast_path_accepts(value)
    (violation,) = validator(value)
    assert violation.startswith(f"{expected} must be a lossless JSON value: an int of ")
    assert violation.endswith("bits has more digits than JSON text can carry here")


@pytest.mark.parametrize("value", [HUGE_INT, [HUGE_INT], {"a": {"b": -HUGE_INT}}], ids=["top", "in-array", "nested"])
def test_ints_too_long_for_json_text_are_not_lossless(value: object) -> None:
    assert not _validate._is_lossless(value)
    assert validate_json_schema_value(ANY, value) == ('"value" must be a lossless JSON value',)


def test_compile_failure_falls_back_to_the_iterative_checker(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise SyntaxError("too many statically nested blocks")

    monkeypatch.setattr(fastjsonschema, "compile", refuse)
    validator = compile_validator({"type": "array", "items": {"type": "string", "const": "fallback"}})
    assert not validator.uses_fastjsonschema
    assert validator(["fallback"]) == ()
    assert validator(["other", 1]) == ('"value[0]" must be "fallback"', '"value[1]" must be a string')


@pytest.mark.parametrize("name", ["{q}", "{data_x}", 'a"b', "a\nb", "a'b", "\\", "ü", "", "$ref", "id"])
def test_odd_property_names(name: str) -> None:
    schema = {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {name: STRING},
            "required": [name],
            "additionalProperties": False,
        },
    }
    validator = compile_validator(schema)
    assert validator([{name: "x"}]) == ()
    assert validator.fast_path_accepts([{name: "x"}]) is validator.uses_fastjsonschema
    spelled = '[""]' if name == "" else f".{name}"
    assert validator([{name: 1}]) == (f'"value[0]{spelled}" must be a string',)
    assert validator([{}]) == (f'missing required property "value[0]{spelled}"',)


# --- deep schemas and deep values -----------------------------------------------------------------


def nest(depth: int, kind: str, leaf: dict[str, Any]) -> dict[str, Any]:
    node = leaf
    for _ in range(depth):
        if kind == "properties":
            node = {"type": "object", "properties": {"p": node}, "required": ["p"], "additionalProperties": False}
        elif kind == "items":
            node = {"type": "array", "items": node}
        else:
            node = {"oneOf": [node, NULL]}
    return node


def nest_value(depth: int, kind: str, leaf: object) -> Any:
    value = leaf
    for _ in range(depth):
        if kind == "properties":
            value = {"p": value}
        elif kind == "items":
            value = [value]
    return value


def leaf_path(depth: int, kind: str) -> str:
    """The leaf's path as a violation quotes it: elided in the middle past QUOTED_CHARS."""
    path = "value" + {"properties": ".p", "items": "[0]", "oneOf": ""}[kind] * depth
    return elide_middle(path, QUOTED_CHARS)


@pytest.mark.parametrize("kind", ["properties", "items"])
@pytest.mark.parametrize("depth", [1000, 5000])
def test_deep_container_schemas(kind: str, depth: int) -> None:
    validator = compile_validator(nest(depth, kind, STRING))
    assert not validator.uses_fastjsonschema
    assert validator(nest_value(depth, kind, "x")) == ()
    assert validator(nest_value(depth, kind, 1)) == (f'"{leaf_path(depth, kind)}" must be a string',)


@pytest.mark.parametrize("depth", [1000, 5000])
def test_deep_oneOf_schemas(depth: int) -> None:
    validator = compile_validator(nest(depth, "oneOf", STRING))
    assert not validator.uses_fastjsonschema
    assert validator("x") == ()
    assert validator(None) == ('"value" must match exactly one oneOf branch (matched 2)',)
    assert validator(1) == ('"value" must match exactly one oneOf branch (matched 0)',)


@pytest.mark.parametrize("kind", ["properties", "items", "oneOf"])
@pytest.mark.parametrize("depth", [14, 16, 17, 40])
def test_schemas_near_the_fastjsonschema_depth_limit(kind: str, depth: int) -> None:
    validator = compile_validator(nest(depth, kind, {"type": "string", "enum": ["x", f"near-{kind}-{depth}"]}))
    assert validator.uses_fastjsonschema is (depth + 1 <= _validate._FAST_MAX_DEPTH)
    assert validator(nest_value(depth, kind, "x")) == ()
    assert validator(nest_value(depth, kind, "y")) != ()


DEEP = 100_000


@pytest.mark.parametrize(
    ("schema", "bad_report"),
    [
        (ANY, '"value" must be a lossless JSON value'),
        (
            {"oneOf": [{"type": "array", "items": ARRAY}, NULL]},
            '"value" must match exactly one oneOf branch (matched 0)',
        ),
        (nest(1000, "items", ARRAY), f'"{leaf_path(1000, "items")}" must be a dense lossless JSON array'),
    ],
    ids=["any", "oneOf-of-arrays", "deep-schema"],
)
def test_deep_values(schema: dict[str, Any], bad_report: str) -> None:
    value = nest_value(DEEP, "items", [])
    assert validate_json_schema_value(schema, value) == ()
    bad = nest_value(DEEP, "items", [math.nan])
    assert validate_json_schema_value(schema, bad) == (bad_report,)


def test_deep_snapshot_value() -> None:
    value = snapshot_json(nest_value(DEEP, "items", []))
    assert validate_json_schema_value({"type": "array", "items": ARRAY}, value) == ()


def test_deep_object_value_reports_at_the_right_level() -> None:
    schema = {"type": "object", "properties": {"p": OBJECT}}
    value = {"p": nest_value(DEEP, "properties", {"bad": math.inf})}
    assert validate_json_schema_value(schema, value) == ('"value.p" must be a lossless JSON object',)
    assert validate_json_schema_value(schema, {"p": nest_value(DEEP, "properties", {})}) == ()


def test_a_deep_value_under_a_deep_schema_is_reported_in_memory_linear_in_depth() -> None:
    # Paths kept as text took 100 MB at this depth (and gigabytes at 40 000).
    depth = 10_000
    schema = snapshot_json(nest(depth, "properties", STRING))
    assert_supported_json_schema(schema)
    tracemalloc.start()
    try:
        assert report_violations(schema, nest_value(depth, "properties", 1)) == (  # type: ignore[arg-type]
            f'"{leaf_path(depth, "properties")}" must be a string',
        )
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 16 * 1024 * 1024, peak


def test_deep_cyclic_value_is_rejected_under_a_finite_schema() -> None:
    value: dict[str, Any] = {}
    value["p"] = value
    schema = nest(20, "properties", OBJECT)
    assert validate_json_schema_value(schema, value) == (
        f'"{leaf_path(20, "properties")}" must be a lossless JSON object',
    )


# --- fast path versus iterative checker -----------------------------------------------------------

# "ab", "a b" and "" collide in fastjsonschema's generated variable names.
NAMES = ["a", "b", "ab", "a b", "", "{q}", "keys", 'q"']
LITERALS = ["a", "b", "", 0, 1, 2, 1.0, 1.5, -2, True, False, None]


def tricky_values() -> st.SearchStrategy[Any]:
    scalars = st.sampled_from(
        [
            None,
            True,
            False,
            0,
            1,
            -1,
            2,
            1.0,
            2.0,
            1.5,
            0.0,
            -0.0,
            math.nan,
            math.inf,
            -math.inf,
            10**30,
            1e300,
            "",
            "a",
            "b",
            "{q}",
            Colour.RED,
            Name("a"),
            b"a",
            decimal.Decimal(1),
            Custom(),
        ]
    )
    # More digits than JSON text can carry: not lossless (mapped, because a strategy's repr shows its
    # values and this int has no repr).
    too_long = st.booleans().map(lambda negative: -HUGE_INT if negative else HUGE_INT)
    return st.recursive(
        scalars | too_long | st.integers() | st.text(max_size=3),
        lambda children: (
            st.lists(children, max_size=3)
            | st.lists(children, max_size=3).map(tuple)
            | st.dictionaries(st.sampled_from(NAMES), children, max_size=3)
            | st.dictionaries(st.sampled_from(NAMES), children, max_size=3).map(
                lambda d: FrozenDict(d) if validate_json_schema_value(ANY, d) == () else collections.OrderedDict(d)
            )
        ),
        max_leaves=8,
    )


def scalar_schemas() -> st.SearchStrategy[dict[str, Any]]:
    def constrained(schema_type: str) -> st.SearchStrategy[dict[str, Any]]:
        probe = compile_validator({"type": schema_type})
        fitting = [literal for literal in LITERALS if probe(literal) == ()]
        base = {"type": schema_type}
        options = [st.just(base)]
        if fitting:
            options.append(
                st.lists(st.sampled_from(fitting), min_size=1, max_size=3).map(lambda e: {**base, "enum": e})
            )
            options.append(st.sampled_from(fitting).map(lambda c: {**base, "const": c}))
        return st.one_of(options)

    return st.sampled_from(["string", "number", "integer", "boolean", "null"]).flatmap(constrained)


def schemas() -> st.SearchStrategy[dict[str, Any]]:
    leaves = scalar_schemas() | st.sampled_from([ANY, ARRAY, OBJECT, {"type": "object", "additionalProperties": False}])

    def objects(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
        def build(properties: dict[str, Any], closed: bool | None, data: st.DataObject) -> dict[str, Any]:
            schema: dict[str, Any] = {"type": "object", "properties": properties}
            if closed is not None:
                schema["additionalProperties"] = closed
            required = data.draw(st.lists(st.sampled_from(sorted(properties)), unique=True)) if properties else []
            if required:
                schema["required"] = required
            return schema

        return st.builds(
            build, st.dictionaries(st.sampled_from(NAMES), children, max_size=3), st.none() | st.booleans(), st.data()
        )

    return st.recursive(
        leaves,
        lambda children: (
            objects(children)
            | children.map(lambda items: {"type": "array", "items": items})
            | st.lists(children, min_size=2, max_size=3).map(lambda branches: {"oneOf": branches})
        ),
        max_leaves=8,
    )


def fitting_values(schema: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values built to (mostly) fit ``schema``, with a chance of a tricky value at every level."""
    noise = tricky_values()
    if "oneOf" in schema:
        return st.one_of([fitting_values(branch) for branch in schema["oneOf"]])
    schema_type = schema.get("type")
    if schema_type is None:
        return noise
    if "enum" in schema:
        exact: st.SearchStrategy[Any] = st.sampled_from(schema["enum"])
    elif "const" in schema:
        exact = st.just(schema["const"])
    elif schema_type == "object":
        properties = schema.get("properties", {})
        required = set(schema.get("required", ()))
        exact = st.fixed_dictionaries(
            {name: fitting_values(child) for name, child in properties.items() if name in required},
            optional={name: fitting_values(child) for name, child in properties.items() if name not in required},
        )
        if schema.get("additionalProperties", True) is not False:
            exact = st.tuples(exact, st.dictionaries(st.sampled_from(NAMES), noise, max_size=2)).map(
                lambda pair: {**pair[1], **pair[0]}
            )
    elif schema_type == "array":
        items = fitting_values(schema["items"]) if "items" in schema else noise
        exact = st.lists(items, max_size=3) | st.lists(items, max_size=3).map(tuple)
    else:
        exact = {
            "string": st.text(max_size=3),
            "number": st.integers() | st.floats(),
            "integer": st.integers() | st.floats().filter(lambda f: math.isfinite(f) and f.is_integer()),
            "boolean": st.booleans(),
            "null": st.none(),
        }[schema_type]
    return st.one_of(exact, exact, exact, noise)


# Each generated schema costs a fastjsonschema compile (milliseconds), so the
# example count is modest; a 3 000-example run agreed completely.
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_fast_path_agrees_with_the_iterative_checker(data: st.DataObject) -> None:
    schema = data.draw(schemas())
    value = data.draw(fitting_values(schema))
    validator = compile_validator(schema)
    assert validator.uses_fastjsonschema
    slow = report_violations(validator.schema, value)
    # Soundness: the fast path never lets through what the rules refuse, and
    # completeness: it never refuses what the rules accept.
    assert validator.fast_path_accepts(value) == (slow == ())
    assert (validator(value) == ()) == (slow == ())
    assert validator(value) == slow


FIXED_SCHEMAS = [
    SERVERS,
    {"oneOf": [NUMBER, INTEGER, {"type": "string", "enum": ["1"]}]},
    {"type": "array", "items": {"oneOf": [{"type": "boolean", "const": True}, {"type": "integer", "enum": [1, 0]}]}},
    {
        "type": "object",
        "additionalProperties": False,
        "required": ["a"],
        "properties": {"a": {"type": "number", "const": 1}, "b": {"type": "array"}, "c": ANY},
    },
    {"type": "array", "items": {"type": "string", "enum": ["", "a", "{q}", *(f"filler-{n}" for n in range(40))]}},
    ANY,
]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(FIXED_SCHEMAS), tricky_values())
def test_fast_path_agrees_on_fixed_schemas(schema: dict[str, Any], value: object) -> None:
    validator = compile_validator(schema)
    slow = report_violations(validator.schema, value)
    assert (compile_validator(schema)(value) == ()) == (slow == ())
    assert validator.fast_path_accepts(value) == (slow == ())


@given(tricky_values())
def test_losslessness_pre_check_matches_snapshot_json(value: object) -> None:
    try:
        snapshot_json(value)
    except NonJsonValueError:
        lossless = False
    else:
        lossless = True
    assert _validate._is_lossless(value) is lossless


@given(tricky_values().filter(lambda v: validate_json_schema_value(ANY, v) == ()))
@example({"ключ": ["значение", '"quoted"\n', 1.5, None]})
def test_iterative_encoder_writes_what_json_dumps_writes(value: object) -> None:
    # Deep schemas' cache keys and messages come from this fallback: it must be the same text.
    for ascii_only in (False, True):
        expected = json.dumps(value, ensure_ascii=ascii_only, separators=(",", ":"))
        assert _jsoncodec._encode_deep(value, ascii_only) == expected


def test_deep_schema_cache_key_falls_back_to_the_iterative_encoder() -> None:
    schema = nest(3000, "items", {"type": "string", "const": "deep-key"})
    # json.dumps raises RecursionError here on 3.11/3.12 (3.13 copes): the cache key must not care.
    validator = compile_validator(schema)
    assert compile_validator(nest(3000, "items", {"type": "string", "const": "deep-key"})) is validator
    assert compile_validator(nest(3000, "items", {"type": "string", "const": "deep-key-2"})) is not validator


# --- enum membership --------------------------------------------------------------------------------

# Enough distinct entries to leave fastjsonschema's comparison chain (strings go to a set format,
# numbers to the iterative checker): the large form of each enum below.
FILLER_COUNT = 2 * _validate._FAST_MAX_ENUM
ENUM_VALUES = [
    *LITERALS,
    -0.0,
    0.0,
    2.5,
    3.0,
    3,
    2**53,
    2**53 + 1,
    float(2**53),
    "1",
    "é",
    "e\u0301",
    "É",
    "a\x00",
    "A",
    "a ",
    Name("a"),
    Colour.RED,
]


def _padded(schema_type: str, entries: list[Any], large: bool) -> list[Any]:
    if not large:
        return entries
    if schema_type == "string":
        return [*entries, *(f"filler-{index}" for index in range(FILLER_COUNT))]
    if schema_type in ("number", "integer"):
        return [*entries, *range(10_000, 10_000 + FILLER_COUNT)]
    return entries * FILLER_COUNT  # booleans and null repeat: still one or two distinct entries


ENUM_SCHEMAS = [
    ("number", [1, 2.5, 0]),
    ("number", [1.0, 2**53 + 1]),
    ("integer", [1, 3.0, 2**53 + 1]),
    ("integer", [0, 2**53]),
    ("string", ["a", "1", "é", ""]),
    ("string", ["e\u0301", "a\x00"]),
    ("boolean", [True]),
    ("boolean", [False, True]),
    ("null", [None]),
]


@pytest.mark.parametrize("large", [False, True], ids=["small", "large"])
@pytest.mark.parametrize(("schema_type", "entries"), ENUM_SCHEMAS, ids=repr)
def test_enum_membership_is_json_equality(schema_type: str, entries: list[Any], large: bool) -> None:
    """1 equals 1.0, a bool only a bool, strings compare exactly (no normalisation), whatever the enum's size."""
    from dsh_core._schema._subset import same_scalar

    allowed = _padded(schema_type, entries, large)
    validator = compile_validator({"type": schema_type, "enum": allowed})
    of_type = compile_validator({"type": schema_type})
    for value in ENUM_VALUES:
        expected = of_type(value) == () and any(same_scalar(value, entry) for entry in allowed)
        report = validator(value)
        assert (report == ()) is expected, (value, report)
        assert report_violations(validator.schema, value) == report
        if validator.uses_fastjsonschema:
            assert validator.fast_path_accepts(value) is expected, value
        # Inside an array and beside a oneOf sibling, where the fast path and the checker recurse.
        assert (compile_validator({"type": "array", "items": validator.schema})([value, value]) == ()) is expected


def test_enum_equality_across_oneOf_branches() -> None:
    schema = {
        "type": "array",
        "items": {
            "oneOf": [
                {"type": "boolean", "enum": _padded("boolean", [True], large=True)},
                {"type": "integer", "enum": _padded("integer", [1], large=True)},
                {"type": "null", "enum": [None]},
            ]
        },
    }
    validator = compile_validator(schema)
    assert validator([True, 1, 1.0, None]) == ()
    assert validator([False, 0, 2.0]) == tuple(
        f'"value[{index}]" must match exactly one oneOf branch (matched 0)' for index in range(3)
    )


def test_large_enum_membership_is_one_set_lookup_per_value(monkeypatch: pytest.MonkeyPatch) -> None:
    """The full checker tests a value against a set built once per enum node, never entry by entry."""
    allowed = [f"Zone/{index}" for index in range(600)]
    validator = compile_validator({"type": "array", "items": {"type": "string", "enum": allowed}})
    ((node, check),) = validator._enums.values()
    assert node is validator.schema["items"]
    assert isinstance(check.keys, frozenset)
    assert len(check.keys) == 600

    keyed: list[object] = []
    compared: list[object] = []

    def counting_key(value: object) -> object:
        keyed.append(value)
        return real_key(value)

    def counting_same(left: object, right: object) -> bool:
        compared.append(left)
        return real_same(left, right)

    real_key, real_same = _validate.scalar_key, _validate.same_scalar
    monkeypatch.setattr(_validate, "scalar_key", counting_key)
    monkeypatch.setattr(_validate, "same_scalar", counting_same)
    value = [allowed[-1]] * 999 + ["Zone/none"]
    report = validator(value)
    assert report == (f'"value[999]" must be one of {json.dumps(allowed, separators=(",", ":"))}',)
    assert compared == []
    assert len(keyed) == len(value)


@pytest.mark.parametrize("schema_type", ["string", "number", "integer", "boolean", "null"])
def test_large_enums_leave_the_fastjsonschema_comparison_chain(schema_type: str) -> None:
    """fastjsonschema compares a value with each enum entry in turn: it only sees short enums."""
    entries: list[Any] = {
        "string": [f"Zone/{index}" for index in range(600)],
        "number": list(range(600)),
        "integer": list(range(600)),
        "boolean": [False, True] * 300,
        "null": [None] * 600,
    }[schema_type]
    schema = {"type": "object", "properties": {"v": {"type": "array", "items": {"type": schema_type, "enum": entries}}}}
    validator = compile_validator(schema)
    found = _validate._fastjsonschema_form(validator.schema)
    if schema_type in ("number", "integer"):
        assert found is None
        assert not validator.uses_fastjsonschema
    else:
        assert found is not None
        form, formats = found
        items = form["properties"]["v"]["items"]
        assert len(items.get("enum", ())) <= _validate._FAST_MAX_STRING_ENUM
        assert validator.uses_fastjsonschema
        assert validator.fast_path_accepts({"v": [entries[-1]] * 3})
        if schema_type == "string":
            assert set(formats) == {items["format"]}
            assert not validator.fast_path_accepts({"v": [entries[-1], "Zone/x"]})
    assert validator({"v": [entries[-1]] * 3}) == ()
