"""Scenario catalogue S253-S293 and S376-S387: the raw JSON Schema subset, value validation, the
author DSL, generated DSL properties, and the timeout policy (dsh_plugins.timeout).

JavaScript-only hostility (getters, Proxies, prototypes, sparse arrays) becomes its nearest Python
form: dict/list subclasses and containers whose iteration raises, which the subset refuses by type.
The property tests use hypothesis (already a test dependency), shaped like the original's generators.
"""

from __future__ import annotations

import collections
import datetime
import math
import string
import types
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsh_core import (
    CancelSignal,
    DshError,
    ErrorCode,
    SchemaSpecError,
    TextBlock,
    ToolErrorInfo,
    ToolExecutionFailure,
    ToolExecutionResult,
    ToolExecutionSuccess,
    ToolFailure,
    ToolOutput,
    ToolRunContext,
    ToolRuntime,
    discover_entry_points,
    hookimpl,
    load_plugins,
)
from dsh_core._schema._validate import report_violations
from dsh_core.schema import (
    JsonSchemaError,
    assert_object_json_schema,
    assert_supported_json_schema,
    parameter_schema_to_json_schema,
    validate_json_schema_value,
    value_schema_to_json_schema,
)
from dsh_core.testing import json_tool, make_input, make_runtime
from dsh_plugins import timeout

Next = Callable[[], Awaitable[Any]]

UNSUPPORTED = (
    "is not a supported keyword (subset: type/oneOf/properties/required/additionalProperties/items/enum/const"
    " + annotations)"
)
OBJECT_ROOT = 'schema.type must be "object" (structured output is object-rooted)'
AT_LEAST_TWO = "schema.oneOf must be an array of at least two schemas"


def violations_of(schema: object) -> list[str]:
    with pytest.raises(JsonSchemaError) as caught:
        assert_supported_json_schema(schema)
    return list(caught.value.violations)


def object_root_violations_of(schema: object) -> list[str]:
    with pytest.raises(JsonSchemaError) as caught:
        assert_object_json_schema(schema)
    return list(caught.value.violations)


def spec_violations_of(compile_spec: Callable[[object], object], spec: object) -> list[str]:
    with pytest.raises(SchemaSpecError) as caught:
        compile_spec(spec)
    return list(caught.value.violations)


class ListSubclass(list):  # type: ignore[type-arg]
    """The analogue of a JavaScript Array subclass: list-like, but not a plain list."""


class ExplodingList(list):  # type: ignore[type-arg]
    """The analogue of a Proxy whose traps throw: any inspection raises."""

    def __len__(self) -> int:
        raise RuntimeError("length trap exploded")

    def __iter__(self) -> Any:
        raise RuntimeError("iteration trap exploded")

    def __getitem__(self, index: Any) -> Any:
        raise RuntimeError("index trap exploded")


class ExplodingDict(dict):  # type: ignore[type-arg]
    """The analogue of a Proxy whose ownKeys / getters throw."""

    def __iter__(self) -> Any:
        raise RuntimeError("ownKeys trap exploded")

    def items(self) -> Any:
        raise RuntimeError("ownKeys trap exploded")

    def keys(self) -> Any:
        raise RuntimeError("ownKeys trap exploded")

    def __getitem__(self, key: Any) -> Any:
        raise RuntimeError("getter exploded")


class ForgedRecord(dict):  # type: ignore[type-arg]
    """The analogue of a record with a forged prototype: a dict, but not a plain one."""


# ---------------------------------------------------------------------------------------------------
# json-schema.spec: assertSupportedJsonSchema / assertObjectJsonSchema


@pytest.mark.parametrize(
    "schema",
    [
        pytest.param({"type": "string"}, id="string"),
        pytest.param({"type": "number"}, id="number"),
        pytest.param({"type": "integer"}, id="integer"),
        pytest.param({"type": "boolean"}, id="boolean"),
        pytest.param({"type": "null"}, id="null"),
        pytest.param({"type": "array", "items": {"type": "string"}}, id="array-of-string"),
        pytest.param(
            {
                "type": "object",
                "properties": {
                    "nested": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {"line": {"type": "integer"}},
                        "required": ["line"],
                    },
                    "free": {},
                },
                "required": ["nested"],
                "additionalProperties": True,
            },
            id="object-nested-closed-free-required-open",
        ),
        pytest.param({"oneOf": [{"type": "string"}, {"type": "number"}]}, id="oneOf-string-number"),
        pytest.param(
            {"description": "anything", "title": "Any", "default": None, "examples": [1, "x"]}, id="annotation-only"
        ),
    ],
)
def test_every_accepted_schema_form_passes_the_assertion(schema: dict[str, Any]) -> None:
    """S253: each accepted raw form (scalars, arrays, nested closed objects with a free node, oneOf, annotations) passes."""
    assert assert_supported_json_schema(schema) is None


def test_object_root_guard_accepts_objects_and_refuses_every_other_root() -> None:
    """S254: an object root passes; {}, string, array and a oneOf root each get exactly the object-root message."""
    assert assert_object_json_schema({"type": "object"}) is None
    for schema in ({}, {"type": "string"}, {"type": "array"}, {"oneOf": [{"type": "string"}, {"type": "null"}]}):
        assert object_root_violations_of(schema) == [OBJECT_ROOT]


def test_oneof_vocabulary_rules() -> None:
    """S256: bad oneOf values, oneOf beside a type or items, a bad branch, and list-like/hostile oneOf containers."""
    for bad in ([], [{}], "x"):
        assert violations_of({"oneOf": bad}) == [AT_LEAST_TWO]
    assert violations_of({"type": "string", "oneOf": [{"type": "string"}, {"type": "null"}]}) == [
        "schema cannot declare both type and oneOf"
    ]
    assert violations_of({"oneOf": [{"type": "string"}, {"type": "number"}], "items": {}}) == [
        "schema.items is not supported beside oneOf"
    ]
    assert violations_of({"oneOf": [{"type": "string"}, {"type": "weird"}]})[0].startswith("schema.oneOf[1].type")
    # Python forms of the Array subclass and the Proxy whose traps throw: refused, never inspected.
    assert violations_of({"oneOf": ListSubclass([{"type": "string"}, {"type": "null"}])}) == [AT_LEAST_TWO]
    assert violations_of({"oneOf": ExplodingList([{"type": "string"}, {"type": "null"}])}) == [AT_LEAST_TWO]


@pytest.mark.parametrize("keyword", ["anyOf", "allOf", "not", "pattern", "minimum", "maxLength", "$ref"])
def test_unknown_keyword_on_an_object_is_named_first(keyword: str) -> None:
    """S257: every keyword outside the subset is reported as not supported, first."""
    assert violations_of({"type": "object", keyword: {}})[0] == f"schema.{keyword} {UNSUPPORTED}"


def test_misplaced_and_typeless_keywords() -> None:
    """S257: object/array/scalar keywords on the wrong type, and all six without a type, in keyword order."""
    assert violations_of({"type": "object", "items": {}}) == ['schema.items is not supported on type "object"']
    assert violations_of({"type": "array", "properties": {}}) == ['schema.properties is not supported on type "array"']
    assert violations_of({"type": "object", "enum": ["a"]}) == ['schema.enum is not supported on type "object"']
    assert violations_of({"type": "array", "const": 1}) == ['schema.const is not supported on type "array"']
    typeless = {
        "const": 1,
        "enum": [1],
        "items": {},
        "additionalProperties": True,
        "required": [],
        "properties": {},
    }
    assert violations_of(typeless) == [
        "schema.properties requires type or oneOf",
        "schema.required requires type or oneOf",
        "schema.additionalProperties requires type or oneOf",
        "schema.items requires type or oneOf",
        "schema.enum requires type or oneOf",
        "schema.const requires type or oneOf",
    ]


def test_object_keyword_checks() -> None:
    """S259: properties/required/additionalProperties shapes, each with its exact message, together in order."""
    assert violations_of({"type": "object", "properties": []}) == ["schema.properties must be an object of schemas"]
    assert violations_of({"type": "object", "properties": {"a": "x"}}) == [
        "schema.properties.a must be a schema object"
    ]
    for required in ("a", [1], ListSubclass(["a"])):
        assert violations_of({"type": "object", "properties": {"a": {}}, "required": required}) == [
            "schema.required must be an array of strings"
        ]
    assert violations_of({"type": "object", "properties": {}, "required": ["missing"]}) == [
        'schema.required names "missing" which is not in properties'
    ]
    assert violations_of({"type": "object", "additionalProperties": "yes"}) == [
        "schema.additionalProperties must be a boolean"
    ]
    assert violations_of({"type": "object", "properties": None}) == ["schema.properties must be an object of schemas"]
    assert violations_of({"type": "object", "properties": None, "required": ["missing"]}) == [
        "schema.properties must be an object of schemas",
        'schema.required names "missing" which is not in properties',
    ]


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "string", "enum": ["a", "b"], "const": "a"},
        {"type": "number", "enum": [1, 2.5], "const": 2.5},
        {"type": "integer", "enum": [1, 2], "const": 2},
        {"type": "boolean", "enum": [True], "const": True},
        {"type": "null", "enum": [None], "const": None},
    ],
    ids=["string", "number", "integer", "boolean", "null"],
)
def test_type_correct_enum_and_const_pass(schema: dict[str, Any]) -> None:
    """S260: a type-correct enum with a member const passes for every scalar type."""
    assert assert_supported_json_schema(schema) is None


def test_enum_with_nan_is_not_a_number_enum() -> None:
    """S260: a number enum holding NaN is refused with the enum message (alongside the other enum/const rules)."""
    assert violations_of({"type": "number", "enum": [math.nan]}) == [
        "schema.enum must be a non-empty array of number values"
    ]
    assert violations_of({"type": "integer", "enum": [1.5]}) == [
        "schema.enum must be a non-empty array of integer values"
    ]
    assert violations_of({"type": "number", "const": -0.0}) == ["schema.const must be a number value"]


def _cyclic_list() -> list[Any]:
    cycle: list[Any] = []
    cycle.append(cycle)
    return cycle


@pytest.mark.parametrize(
    ("key", "value"),
    [
        pytest.param("default", math.inf, id="default-infinity"),
        pytest.param("examples", [object()], id="examples-undefined-like"),
        pytest.param("examples", [datetime.date(2024, 1, 2)], id="examples-date"),
        pytest.param("default", _cyclic_list(), id="default-cyclic"),
        pytest.param("default", ExplodingDict(a=1), id="default-hostile-mapping"),
        pytest.param("default", {("tuple", "key"): 1}, id="default-non-str-key"),
    ],
)
def test_non_lossless_annotations_are_one_violation_each(key: str, value: object) -> None:
    """S261: a default/examples annotation that is not lossless JSON (or whose inspection would raise) is refused."""
    assert violations_of({key: value}) == [f"schema.{key} annotation must be lossless JSON data"]


def test_cycles_exotic_property_maps_and_forged_records() -> None:
    """S263: a self-containing properties map is circular, sibling reuse is fine, exotic maps/records are refused."""
    node: dict[str, Any] = {"type": "object"}
    node["properties"] = {"self": node}
    assert violations_of(node) == ["schema.properties.self is circular"]
    leaf = {"type": "string"}
    assert assert_supported_json_schema({"type": "object", "properties": {"a": leaf, "b": leaf}}) is None
    for mapping in (collections.OrderedDict(), types.MappingProxyType({}), collections.UserDict()):
        assert violations_of({"type": "object", "properties": mapping}) == [
            "schema.properties must be an object of schemas"
        ]
    assert violations_of({"type": "object", "properties": {"at": datetime.date(2024, 1, 2)}}) == [
        "schema.properties.at must be a schema object"
    ]
    for forged in (
        ForgedRecord(type="object"),
        ExplodingDict(type="object"),
        types.MappingProxyType({"type": "object"}),
    ):
        assert violations_of(forged) == ["schema must be a schema object"]
        assert object_root_violations_of(forged) == ["schema must be a schema object"]


def test_required_names_must_be_declared_properties_not_dict_attributes() -> None:
    """S265: required names that are attributes of dict itself are still not in an empty properties map."""
    assert violations_of({"type": "object", "properties": {}, "required": ["toString", "keys", "__class__"]}) == [
        'schema.required names "toString" which is not in properties',
        'schema.required names "keys" which is not in properties',
        'schema.required names "__class__" which is not in properties',
    ]


# ---------------------------------------------------------------------------------------------------
# json-schema.spec: validateJsonSchemaValue


@pytest.mark.parametrize(
    ("schema", "value"),
    [
        ({"type": "string"}, "x"),
        ({"type": "number"}, 1.5),
        ({"type": "integer"}, 2),
        ({"type": "boolean"}, True),
        ({"type": "null"}, None),
        ({"type": "array", "items": {"type": "string"}}, ["x"]),
        ({"type": "object", "properties": {"x": {"type": "integer"}}}, {"x": 1}),
    ],
    ids=["string", "number", "integer", "boolean", "null", "array", "object"],
)
def test_valid_root_values_have_no_violations(schema: dict[str, Any], value: object) -> None:
    """S266: a valid value of every root type yields no violation."""
    assert validate_json_schema_value(schema, value) == ()


FILE_SCHEMA = {
    "type": "object",
    "properties": {
        "file": {"type": "string"},
        "nested": {
            "type": "object",
            "additionalProperties": False,
            "properties": {"line": {"type": "integer"}},
            "required": ["line"],
        },
    },
    "required": ["file"],
}


def test_object_values_report_missing_wrong_and_undeclared_properties() -> None:
    """S269: open outer object accepts extra keys; missing, wrong-typed, nested-missing and undeclared are each named."""
    assert validate_json_schema_value(FILE_SCHEMA, {"file": "a.py", "extra": [1], "nested": {"line": 3}}) == ()
    assert validate_json_schema_value(FILE_SCHEMA, {}) == ('missing required property "value.file"',)
    assert validate_json_schema_value(FILE_SCHEMA, {"file": 1, "nested": {}}) == (
        '"value.file" must be a string',
        'missing required property "value.nested.line"',
    )
    assert validate_json_schema_value(FILE_SCHEMA, {"file": "a", "nested": {"line": 1, "extra": 2}}) == (
        '"value.nested.extra" is not a declared property (additionalProperties: false)',
    )
    assert validate_json_schema_value(FILE_SCHEMA, "x") == ('"value" must be an object',)


def test_non_json_members_and_non_dict_objects() -> None:
    """S270: a non-JSON member fails the object's losslessness; a date is not an object at all."""
    assert validate_json_schema_value({"type": "object", "properties": {"x": {}}, "required": ["x"]}, {}) == (
        'missing required property "value.x"',
    )
    assert validate_json_schema_value({"type": "object"}, {"x": object()}) == (
        '"value" must be a lossless JSON object',
    )
    assert validate_json_schema_value({"type": "object"}, datetime.date(2024, 1, 2)) == ('"value" must be an object',)


def test_array_items_are_checked_by_index() -> None:
    """S272: integer items accept [1, 2], name the non-integral element, and refuse a non-array."""
    schema = {"type": "array", "items": {"type": "integer"}}
    assert validate_json_schema_value(schema, [1, 2]) == ()
    assert validate_json_schema_value(schema, (1, 2)) == ()
    assert validate_json_schema_value(schema, [1, 1.5]) == ('"value[1]" must be an integer',)
    assert validate_json_schema_value(schema, "x") == ('"value" must be an array',)


def test_required_and_declared_names_are_own_keys_not_dict_attributes() -> None:
    """S276: names that are attributes of dict are only ever matched against the value's own keys."""
    required = {"type": "object", "properties": {"keys": {}}, "required": ["keys"]}
    assert validate_json_schema_value(required, {}) == ('missing required property "value.keys"',)
    closed = {"type": "object", "properties": {}, "additionalProperties": False}
    assert validate_json_schema_value(closed, {"keys": 1}) == (
        '"value.keys" is not a declared property (additionalProperties: false)',
    )
    declared = {"type": "object", "properties": {"__class__": {"type": "string"}}}
    assert validate_json_schema_value(declared, {}) == ()


def test_unasserted_node_treats_absent_properties_and_required_as_empty() -> None:
    """S276: on an unasserted node ``properties: None`` / ``required: None`` read as empty, not as errors."""
    node = {"type": "object", "properties": None, "required": None}
    assert report_violations(node, {}) == ()
    assert report_violations(node, {"anything": 1}) == ()
    assert report_violations(node, "x") == ('"value" must be an object',)


# ---------------------------------------------------------------------------------------------------
# schema.spec: the author DSL


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (
            {"type": "string", "enum": ["a", "b"], "const": "a"},
            {"type": "string", "enum": ["a", "b"], "const": "a"},
        ),
        ({"type": "number"}, {"type": "number"}),
        ({"type": "integer"}, {"type": "integer"}),
        ({"type": "boolean"}, {"type": "boolean"}),
        ({"type": "null"}, {"type": "null"}),
        ({"type": "array", "items": {"type": "json"}}, {"type": "array", "items": {}}),
        (
            {"type": "object", "additionalProperties": False, "properties": {}},
            {"type": "object", "additionalProperties": False, "properties": {}},
        ),
        (
            {"type": "json", "description": "d", "title": "t", "default": None, "examples": [1]},
            {"description": "d", "title": "t", "default": None, "examples": [1]},
        ),
        (
            {"oneOf": [{"type": "string"}, {"type": "null"}]},
            {"oneOf": [{"type": "string"}, {"type": "null"}]},
        ),
    ],
    ids=["string", "number", "integer", "boolean", "null", "array-json", "closed-empty-object", "json", "oneOf"],
)
def test_every_value_root_compiles_to_its_raw_form(spec: dict[str, Any], expected: dict[str, Any]) -> None:
    """S278: each DSL root compiles to exactly its raw subset node."""
    assert value_schema_to_json_schema(spec) == expected


def test_parameter_root_is_open_and_explicit_openness_is_kept() -> None:
    """S279: the implicit root stays open (no additionalProperties); nested closed/open objects keep theirs."""
    spec = {
        "closed": {
            "type": "object",
            "additionalProperties": False,
            "required": True,
            "properties": {"id": {"type": "integer", "required": True}},
        },
        "open": {"type": "object", "additionalProperties": True},
    }
    assert parameter_schema_to_json_schema(spec) == {
        "type": "object",
        "properties": {
            "closed": {
                "type": "object",
                "additionalProperties": False,
                "properties": {"id": {"type": "integer"}},
                "required": ["id"],
            },
            "open": {"type": "object", "additionalProperties": True},
        },
        "required": ["closed"],
    }


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param({"type": "array", "items": 42}, ["schema.items must be a value schema object"], id="items-42"),
        pytest.param(
            {"type": "string", "enum": ListSubclass(["a"])},
            ["schema.enum must be a non-empty array of string values"],
            id="decorated-enum-array",
        ),
        pytest.param(
            {"oneOf": ListSubclass([{"type": "string"}, {"type": "null"}])},
            ["schema.oneOf must be an array of at least two value schemas"],
            id="list-like-oneOf",
        ),
        pytest.param(
            {"oneOf": ExplodingList([{"type": "string"}, {"type": "null"}])},
            ["schema.oneOf must be an array of at least two value schemas"],
            id="hostile-oneOf",
        ),
        pytest.param(ForgedRecord(type="string"), ["schema must be a value schema object"], id="forged-record"),
    ],
)
def test_forged_value_forms_are_refused(spec: object, expected: list[str]) -> None:
    """S280: forged author forms are refused with SchemaSpecError naming the path (the rest: tests/test_schema_dsl.py)."""
    assert spec_violations_of(value_schema_to_json_schema, spec) == expected


def test_forged_parameter_forms_are_refused() -> None:
    """S280: a property that is not a node, ``required: False``, a null root and a non-str key are refused."""
    assert spec_violations_of(parameter_schema_to_json_schema, {"x": 42}) == [
        "parameters.x must be a value schema object"
    ]
    assert spec_violations_of(parameter_schema_to_json_schema, {"x": {"type": "string", "required": False}}) == [
        "parameters.x.required must be true when present"
    ]
    assert spec_violations_of(parameter_schema_to_json_schema, None) == [
        "parameters must be an object of value schemas"
    ]
    assert spec_violations_of(parameter_schema_to_json_schema, {1: {"type": "string"}}) == [
        "parameters must be an object of value schemas (key 1 is not a str)"
    ]


def test_deep_oneof_chain_compiles_down_to_its_leaf() -> None:
    """S282: a 5 000-deep oneOf chain compiles, and following the first branch reaches {type: string}."""
    node: dict[str, Any] = {"type": "string"}
    for _ in range(5000):
        node = {"oneOf": [node, {"type": "null"}]}
    compiled: Any = value_schema_to_json_schema(node)
    for _ in range(5000):
        assert compiled["oneOf"][1] == {"type": "null"}
        compiled = compiled["oneOf"][0]
    assert compiled == {"type": "string"}


@pytest.mark.parametrize("name", ["__proto__", "__class__", "__dict__", "keys"])
def test_magic_looking_property_names_are_ordinary_properties(name: str) -> None:
    """S283: a property named like an object internal (``__proto__``, ``__class__``) is kept and can be required."""
    compiled = parameter_schema_to_json_schema({name: {"type": "string", "required": True}})
    assert compiled == {"type": "object", "properties": {name: {"type": "string"}}, "required": [name]}
    assert validate_json_schema_value(compiled, {}, "") == (f'missing required property "{name}"',)
    assert validate_json_schema_value(compiled, {name: "x"}, "") == ()


# ---------------------------------------------------------------------------------------------------
# properties.spec: generated DSL specs (hypothesis; the original used fast-check)

_names = st.text(alphabet=string.ascii_lowercase + "_", min_size=1, max_size=6)
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-1000, 1000) | st.text(max_size=4),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(_names, children, max_size=3),
    max_leaves=5,
)
_LEAVES = [
    {"type": "string"},
    {"type": "number"},
    {"type": "integer"},
    {"type": "boolean"},
    {"type": "null"},
    {"type": "json"},
    {"type": "string", "enum": ["red", "green"]},
    {"type": "integer", "enum": [1, 2, 3]},
    {"type": "string", "const": "fixed"},
    {"type": "boolean", "const": True},
    {"oneOf": [{"type": "string"}, {"type": "null"}]},
]


def _value_specs(depth: int) -> st.SearchStrategy[dict[str, Any]]:
    leaves = st.sampled_from(_LEAVES).map(dict)
    if depth == 0:
        return leaves
    inner = _value_specs(depth - 1)
    arrays = st.one_of(
        st.just({"type": "array"}),
        inner.map(lambda items: {"type": "array", "items": items}),
    )
    objects = st.builds(
        lambda closed, properties: {"type": "object", "additionalProperties": closed, "properties": properties},
        st.booleans(),
        _property_maps(depth - 1),
    )
    return st.one_of(leaves, arrays, objects)


def _property_maps(depth: int) -> st.SearchStrategy[dict[str, Any]]:
    entry = st.tuples(_value_specs(depth), st.booleans()).map(
        lambda pair: {**pair[0], "required": True} if pair[1] else pair[0]
    )
    return st.dictionaries(_names, entry, max_size=3)


_parameter_specs = _property_maps(3)


def _plain_values_for(spec: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values the spec accepts: required keys always present, optional keys about half the time."""
    if "oneOf" in spec:
        return st.one_of(st.text(max_size=4), st.none())
    if "const" in spec:
        return st.just(spec["const"])
    if "enum" in spec:
        return st.sampled_from(spec["enum"])
    kind = spec["type"]
    if kind == "string":
        return st.text(max_size=4)
    if kind == "number":
        return st.integers(-1000, 1000) | st.floats(allow_nan=False, allow_infinity=False).map(lambda f: f + 0.0)
    if kind == "integer":
        return st.integers()
    if kind == "boolean":
        return st.booleans()
    if kind == "null":
        return st.none()
    if kind == "json":
        return _json
    if kind == "array":
        return st.lists(_plain_values_for(spec["items"]) if "items" in spec else _json, max_size=3)
    return _args_for(spec.get("properties", {}))


def _args_for(properties: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    required = {name: _plain_values_for(node) for name, node in properties.items() if node.get("required") is True}
    optional = {name: _plain_values_for(node) for name, node in properties.items() if node.get("required") is not True}
    return st.fixed_dictionaries(required, optional=optional)


def _validate_args(spec: dict[str, Any], args: object) -> tuple[str, ...]:
    # The analogue of the original's validateArgs: compile, then validate at the empty root label.
    return validate_json_schema_value(parameter_schema_to_json_schema(spec), args, "")


_any_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=4)
    | st.binary(max_size=2)
    | st.sampled_from([object(), datetime.date(2024, 1, 2), ListSubclass([1]), ForgedRecord(a=1)]),
    lambda children: (
        st.lists(children, max_size=3)
        | st.lists(children, max_size=3).map(tuple)
        | st.dictionaries(_names | st.integers(), children, max_size=3)
        | st.frozensets(st.integers(), max_size=2)
    ),
    max_leaves=8,
)

_generated = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _required_sets(spec: dict[str, Any], compiled: dict[str, Any]) -> list[tuple[set[str], set[str]]]:
    """(declared required keys, compiled required keys) for every object level of ``spec``."""
    pairs: list[tuple[set[str], set[str]]] = []
    pending: list[tuple[dict[str, Any], dict[str, Any]]] = [(spec, compiled)]
    while pending:
        properties, node = pending.pop()
        pairs.append(
            (
                {name for name, child in properties.items() if child.get("required") is True},
                set(node.get("required", [])),
            )
        )
        for name, child in properties.items():
            compiled_child = node["properties"][name]
            while child.get("type") == "array" and "items" in child:
                child, compiled_child = child["items"], compiled_child["items"]
            if child.get("type") == "object":
                pending.append((child.get("properties", {}), compiled_child))
    return pairs


@_generated
@given(_parameter_specs)
def test_compiled_required_matches_the_required_flags_at_every_level(spec: dict[str, Any]) -> None:
    """S288, S289: every generated spec compiles, and each object level's required list is its required: true keys."""
    compiled = parameter_schema_to_json_schema(spec)
    assert compiled["type"] == "object"
    for declared, emitted in _required_sets(spec, compiled):
        assert emitted == declared


@_generated
@given(_parameter_specs, _any_values)
def test_argument_validation_is_total_over_any_input(spec: dict[str, Any], value: object) -> None:
    """S290: validating any Python value against any generated spec returns violations, never raises."""
    violations = _validate_args(spec, value)
    assert type(violations) is tuple
    assert all(type(violation) is str for violation in violations)


@_generated
@given(st.data())
def test_generated_valid_arguments_pass(data: st.DataObject) -> None:
    """S291: arguments generated to fit a spec have no violations."""
    spec = data.draw(_parameter_specs)
    args = data.draw(_args_for(spec))
    assert _validate_args(spec, args) == ()


@_generated
@given(st.data())
def test_dropping_a_required_key_names_it(data: st.DataObject) -> None:
    """S292: removing the first required key from valid arguments yields a violation quoting that key."""
    spec = data.draw(_parameter_specs.filter(lambda s: any(node.get("required") is True for node in s.values())))
    args = data.draw(_args_for(spec))
    first = next(name for name, node in spec.items() if node.get("required") is True)
    del args[first]
    violations = _validate_args(spec, args)
    assert f'missing required property "{first}"' in violations
    assert any(f'"{first}"' in violation for violation in violations)


@_generated
@given(
    _parameter_specs,
    st.one_of(st.text(max_size=4), st.integers(), st.booleans(), st.none(), st.lists(st.integers(), max_size=2)),
)
def test_a_non_object_argument_root_is_always_a_violation(spec: dict[str, Any], value: object) -> None:
    """S293: a string, integer, boolean, null or array at the top level is reported."""
    assert _validate_args(spec, value) == ('"arguments" must be an object',)


# ---------------------------------------------------------------------------------------------------
# timeout-policy.spec (dsh_plugins.timeout)


def with_timeout(*tools: Any) -> ToolRuntime:
    runtime = make_runtime(*tools)
    timeout.dsh_setup(runtime, {})
    return runtime


def signal_probe(name: str, seen: list[CancelSignal], **options: Any) -> Any:
    async def body(args: Any, run: ToolRunContext) -> str:
        seen.append(run.signal)
        await trio.sleep(0)
        return "ok"

    return json_tool(name, body, **options)


def timeout_failure(ms: int) -> ToolExecutionFailure:
    message = f"tool call timed out after {ms}ms"
    return ToolExecutionFailure(
        error=ToolFailure(
            message=message,
            # plugin is the Python port's attribution of listener-made failures (ToolErrorInfo.plugin).
            info=ToolErrorInfo(name="ToolTimeoutError", code="TOOL_TIMEOUT", plugin="timeout-policy"),
        ),
        content=(TextBlock(f"Error: {message}"),),
    )


def content_fixture(name: str, **options: Any) -> Any:
    """The content fixture: output is an array of JSON blocks and the value IS the content list."""

    async def body(args: Any) -> list[dict[str, str]]:
        await trio.sleep(0)
        return [{"type": "text", "text": "ok"}]

    output = ToolOutput(
        schema={"type": "array", "items": {"type": "json"}},
        render=lambda args, value: [TextBlock(block["text"]) for block in value],
    )
    return json_tool(name, body, output=output, **options)


async def test_fast_budgeted_tool_returns_its_ordinary_success(autojump_clock: trio.testing.MockClock) -> None:
    """S377: a budgeted tool finishing in time returns exactly the success it would return unwrapped."""
    runtime = with_timeout(content_fixture("fast", timeout_ms=10_000))
    result = await runtime.execute(make_input("fast"))
    assert result == ToolExecutionSuccess(value=[{"type": "text", "text": "ok"}], content=(TextBlock("ok"),))


async def test_post_execute_sees_the_callers_signal_after_the_wrapper(autojump_clock: trio.testing.MockClock) -> None:
    """S379: the body got the derived signal, yet post-execute sees the caller's own signal again."""
    seen_by_post: list[CancelSignal] = []

    class PostSpy:
        @hookimpl
        async def dsh_post_execute(self, execution: Any, result: Any, next: Next) -> Any:
            seen_by_post.append(execution.signal)
            return await next()

    seen_by_body: list[CancelSignal] = []
    runtime = with_timeout(signal_probe("probe", seen_by_body, timeout_ms=10_000))
    runtime.plugins.register(PostSpy())
    request = make_input("probe")
    assert not (await runtime.execute(request)).is_error
    assert seen_by_body[0] is not request.signal
    assert seen_by_post == [request.signal]
    assert seen_by_post[0] is request.signal


async def test_provider_abort_error_after_the_deadline_becomes_tool_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """S381: a body that reacts to its signal with its own abort error is reported as TOOL_TIMEOUT."""

    async def aborter(args: Any, run: ToolRunContext) -> str:
        with trio.CancelScope(shield=True):
            await run.signal.wait()
        raise DshError("provider request aborted", code="WEB_ABORTED")

    runtime = with_timeout(json_tool("aborter", aborter, timeout_ms=100))
    start = trio.current_time()
    result = await runtime.execute(make_input("aborter"))
    assert trio.current_time() - start == pytest.approx(0.1)
    assert result == timeout_failure(100)


async def test_caller_abort_before_the_deadline_is_the_registrys_aborted_error(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """S382: the caller aborting a started body before the deadline yields exactly the ABORTED failure."""
    started = trio.Event()

    async def body(args: Any) -> str:
        started.set()
        await trio.sleep(100)
        return "unreachable"

    runtime = with_timeout(json_tool("slow", body, timeout_ms=100))
    signal = CancelSignal()
    start = trio.current_time()
    async with trio.open_nursery() as nursery:

        async def abort_once_started() -> None:
            await started.wait()
            signal.cancel()

        nursery.start_soon(abort_once_started)
        result = await runtime.execute(make_input("slow", signal=signal))
    assert trio.current_time() == start
    assert result == ToolExecutionFailure(
        error=ToolFailure(message="tool call aborted", info=ToolErrorInfo(name="AbortError", code="ABORTED")),
        content=(TextBlock("Error: tool call aborted"),),
    )


async def test_deadline_then_caller_abort_then_successful_cleanup_stays_tool_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """S383: deadline fires, caller aborts during the body's cleanup, the body then returns success: TOOL_TIMEOUT."""
    in_cleanup = trio.Event()
    release = trio.Event()

    async def body(args: Any, run: ToolRunContext) -> str:
        with trio.CancelScope(shield=True):
            await run.signal.wait()
            in_cleanup.set()
            await release.wait()
        return "cleaned up fine"

    runtime = with_timeout(json_tool("cleanup", body, timeout_ms=100))
    signal = CancelSignal()
    start = trio.current_time()
    async with trio.open_nursery() as nursery:

        async def drive() -> None:
            await in_cleanup.wait()
            assert trio.current_time() - start == pytest.approx(0.1)
            signal.cancel("caller gave up")
            await trio.sleep(1)
            release.set()

        nursery.start_soon(drive)
        result = await runtime.execute(make_input("cleanup", signal=signal))
    assert result == timeout_failure(100)


def test_tool_timeout_code_is_the_stable_string() -> None:
    """S384: the exported code constant is the string TOOL_TIMEOUT."""
    assert timeout.TOOL_TIMEOUT == "TOOL_TIMEOUT"
    assert ErrorCode.TOOL_TIMEOUT.value == "TOOL_TIMEOUT"


async def test_unregistering_the_policy_gives_budgeted_bodies_the_callers_signal(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """S385: before disposal a budgeted body sees a derived signal; after unregistering, the caller's own."""
    seen: list[CancelSignal] = []
    runtime = with_timeout(signal_probe("probe", seen, timeout_ms=10_000))
    first = make_input("probe")
    assert not (await runtime.execute(first)).is_error
    assert seen[0] is not first.signal
    runtime.plugins.unregister(name=timeout.PLUGIN_NAME)
    second = make_input("probe")
    assert not (await runtime.execute(second)).is_error
    assert seen[1] is second.signal


def _timeout_entry_point() -> Any:
    points = [ep for ep in discover_entry_points("dsh") if ep.name == "timeout"]
    assert len(points) == 1
    return points[0]


def test_timeout_entry_point_is_a_setup_module_not_a_listener() -> None:
    """S386: the entry point loads the module, which offers dsh_setup (named timeout-policy) and no module listener."""
    ep = _timeout_entry_point()
    assert ep.value == "dsh_plugins.timeout"
    module = ep.load()
    assert module is timeout
    assert module.PLUGIN_NAME == "timeout-policy"
    runtime = make_runtime()
    assert runtime.plugins.parse_hookimpl_opts(module, "dsh_setup") is not None
    assert not hasattr(module, "dsh_execute")


async def test_loading_the_timeout_entry_point_wraps_budgeted_tools_and_unloads(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """S387: booting the real entry point wraps a budgeted fast tool (success), and unloading it works."""
    seen: list[CancelSignal] = []
    runtime = make_runtime(signal_probe("fast", seen, timeout_ms=10_000))
    report = load_plugins(runtime, entry_points=[_timeout_entry_point()])
    assert report.failed == ()
    assert [(loaded.name, loaded.plugins) for loaded in report.loaded] == [("timeout", ("timeout", "timeout-policy"))]
    request = make_input("fast")
    result: ToolExecutionResult = await runtime.execute(request)
    assert result == ToolExecutionSuccess(value="ok", content=(TextBlock("ok"),))
    assert seen[0] is not request.signal
    for name in reversed(report.loaded[0].plugins):
        runtime.plugins.unregister(name=name)
    assert runtime.plugins.get_plugin("timeout-policy") is None
    again = make_input("fast")
    assert not (await runtime.execute(again)).is_error
    assert seen[1] is again.signal
