"""Parameters declared as attrs classes: the derived schema and strict structuring.

This module uses ``from __future__ import annotations`` on purpose: every class
defined at module level has stringified annotations, as user code often does.
Classes built with ``attrs.make_class`` carry real type objects instead.
"""

from __future__ import annotations

import enum
import inspect
import itertools
import sys
import typing
from typing import Annotated, Any, Literal, NotRequired, Optional, Required, TypedDict

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsh_core import define_tool
from dsh_core._errors import ErrorCode, JsonSchemaError, SchemaSpecError, ToolArgsError
from dsh_core._json import FrozenDict, JsonValue, snapshot_json
from dsh_core._schema import _attrs_params
from dsh_core._schema._attrs_params import schema_from_attrs_class, structure_args
from dsh_core._schema._subset import assert_supported_json_schema
from dsh_core._schema._validate import validate_json_schema_value

_names = itertools.count()


def _one_field(annotation: object, **field_options: Any) -> type:
    """A fresh attrs class with one field ``x`` annotated with the real type object."""
    return attrs.make_class(f"One{next(_names)}", {"x": attrs.field(type=annotation, **field_options)})


def _field_schema(annotation: object) -> dict[str, Any]:
    schema = schema_from_attrs_class(_one_field(annotation))
    node: dict[str, Any] = schema["properties"]["x"]
    return node


@attrs.frozen
class Server:
    host: str
    port: int = 80


@attrs.frozen
class Deploy:
    name: str = attrs.field(metadata={"description": "what to deploy"})
    servers: list[Server]
    primary: Server
    fallback: Optional[Server] = None  # noqa: UP045 - the typing spelling is tested too
    tags: tuple[str, ...] = ()
    env: dict[str, str] = attrs.Factory(dict)
    mode: Literal["fast", "safe"] = "safe"
    extra: JsonValue = None


# ---------------------------------------------------------------------------
# Derived schema


@pytest.mark.parametrize(
    ("annotation", "expected"),
    [
        pytest.param(str, {"type": "string"}, id="str"),
        pytest.param(int, {"type": "integer"}, id="int"),
        pytest.param(float, {"type": "number"}, id="float"),
        pytest.param(bool, {"type": "boolean"}, id="bool"),
        pytest.param(type(None), {"type": "null"}, id="NoneType"),
        pytest.param(list[int], {"type": "array", "items": {"type": "integer"}}, id="list"),
        pytest.param(typing.List[str], {"type": "array", "items": {"type": "string"}}, id="typing.List"),  # noqa: UP006
        pytest.param(list, {"type": "array"}, id="bare-list"),
        pytest.param(tuple[bool, ...], {"type": "array", "items": {"type": "boolean"}}, id="tuple"),
        pytest.param(tuple, {"type": "array"}, id="bare-tuple"),
        pytest.param(
            list[list[float]],
            {"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
            id="nested-list",
        ),
        pytest.param(dict[str, int], {"type": "object"}, id="dict"),
        pytest.param(dict, {"type": "object"}, id="bare-dict"),
        pytest.param(Literal["a", "b"], {"type": "string", "enum": ["a", "b"]}, id="literal-str"),
        pytest.param(Literal[1, 2], {"type": "integer", "enum": [1, 2]}, id="literal-int"),
        pytest.param(Literal[True], {"type": "boolean", "enum": [True]}, id="literal-bool"),
        pytest.param(Literal[None], {"type": "null", "enum": [None]}, id="literal-none"),
        pytest.param(
            Literal["a", 1, True, None, "b"],
            {
                "oneOf": [
                    {"type": "string", "enum": ["a", "b"]},
                    {"type": "integer", "enum": [1]},
                    {"type": "boolean", "enum": [True]},
                    {"type": "null", "enum": [None]},
                ]
            },
            id="literal-mixed",
        ),
        pytest.param(int | None, {"oneOf": [{"type": "integer"}, {"type": "null"}]}, id="pipe-optional"),
        pytest.param(Optional[str], {"oneOf": [{"type": "string"}, {"type": "null"}]}, id="Optional"),  # noqa: UP045
        pytest.param(
            list[str] | None,
            {"oneOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}]},
            id="optional-list",
        ),
        pytest.param(
            Literal["a", None] | None,
            {"oneOf": [{"type": "string", "enum": ["a"]}, {"type": "null", "enum": [None]}]},
            id="optional-literal-with-none-keeps-one-null",
        ),
        pytest.param(Any, {}, id="Any"),
        pytest.param(JsonValue, {}, id="JsonValue"),
        pytest.param(Optional[Any], {}, id="optional-Any"),  # noqa: UP045
        pytest.param(list[JsonValue], {"type": "array", "items": {}}, id="list-of-JsonValue"),
        pytest.param(JsonValue | None, {}, id="optional-JsonValue"),
        pytest.param(Annotated[int, "meta"], {"type": "integer"}, id="Annotated"),
    ],
)
def test_each_supported_annotation_maps_to_its_schema(annotation: object, expected: dict[str, Any]) -> None:
    assert _field_schema(annotation) == expected


def test_nested_classes_are_closed_objects_and_stringified_annotations_resolve() -> None:
    server = {
        "type": "object",
        "additionalProperties": False,
        "properties": {"host": {"type": "string"}, "port": {"type": "integer", "default": 80}},
        "required": ["host"],
    }
    assert schema_from_attrs_class(Deploy) == {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "name": {"type": "string", "description": "what to deploy"},
            "servers": {"type": "array", "items": server},
            "primary": server,
            "fallback": {"oneOf": [server, {"type": "null"}], "default": None},
            "tags": {"type": "array", "items": {"type": "string"}, "default": []},
            "env": {"type": "object"},
            "mode": {"type": "string", "enum": ["fast", "safe"], "default": "safe"},
            "extra": {"default": None},
        },
        "required": ["name", "servers", "primary"],
    }


def test_derived_schema_is_accepted_by_the_subset() -> None:
    assert_supported_json_schema(schema_from_attrs_class(Deploy))


def test_class_without_required_fields_omits_required() -> None:
    cls = attrs.make_class("AllOptional", {"a": attrs.field(type=int, default=1)})
    assert schema_from_attrs_class(cls) == {
        "type": "object",
        "additionalProperties": False,
        "properties": {"a": {"type": "integer", "default": 1}},
    }


def test_empty_class_has_empty_properties() -> None:
    cls = attrs.make_class("Nothing", {})
    assert schema_from_attrs_class(cls) == {"type": "object", "additionalProperties": False, "properties": {}}


def test_non_json_and_factory_defaults_are_not_shown() -> None:
    cls = attrs.make_class(
        "Defaults",
        {
            "made": attrs.field(type=list[int], factory=list),
            "weird": attrs.field(type=Any, default=object()),
            "plain": attrs.field(type=float, default=0.5),
        },
    )
    properties = schema_from_attrs_class(cls)["properties"]
    assert properties == {
        "made": {"type": "array", "items": {"type": "integer"}},
        "weird": {},
        "plain": {"type": "number", "default": 0.5},
    }


def test_init_false_fields_are_not_parameters() -> None:
    cls = attrs.make_class("Hidden", {"a": attrs.field(type=int), "b": attrs.field(type=int, init=False, default=0)})
    assert list(schema_from_attrs_class(cls)["properties"]) == ["a"]
    assert structure_args(cls, {"a": 1}).a == 1


def test_inherited_fields_resolve_in_their_own_class() -> None:
    @attrs.frozen
    class Child(Server):
        tls: bool = False

    assert list(schema_from_attrs_class(Child)["properties"]) == ["host", "port", "tls"]
    assert structure_args(Child, {"host": "h", "tls": True}) == Child(host="h", port=80, tls=True)


def test_schema_is_a_fresh_copy_each_time() -> None:
    first = schema_from_attrs_class(Deploy)
    first["properties"]["name"]["type"] = "integer"
    first["required"].clear()
    second = schema_from_attrs_class(Deploy)
    assert second["properties"]["name"]["type"] == "string"
    assert second["required"] == ["name", "servers", "primary"]
    assert type(second["properties"]) is dict


def test_derivation_and_converter_are_cached_per_class() -> None:
    cls = _one_field(int)
    derived = _attrs_params._derive(cls)
    assert _attrs_params._derive(cls) is derived
    structure_args(cls, {"x": 1})
    assert _attrs_params._derive(cls) is derived
    assert _attrs_params._derive(_one_field(int)) is not derived


# ---------------------------------------------------------------------------
# Unsupported declarations


@attrs.define
class Nulls:
    nothing: None
    maybe: None | int  # noqa: RUF036 - None first must work as well


@attrs.define
class Unannotated:
    x = attrs.field()


@attrs.define
class Node:
    children: list[Node]


@attrs.define
class UsesMissing:
    x: NotDefinedAnywhere  # type: ignore[name-defined]  # noqa: F821


@attrs.define
class Port:
    number: bytes


@attrs.define
class Cluster:
    ports: list[Port]
    weights: dict[int, float]
    ok: str


class Unset(enum.Enum):
    UNSET = None
    SET = 1


@pytest.mark.parametrize(
    ("annotation", "fragment"),
    [
        pytest.param(bytes, "the annotation bytes is not supported", id="bytes"),
        pytest.param(set[int], "the annotation set[int] is not supported", id="set"),
        pytest.param(object, "the annotation object is not supported", id="object"),
        pytest.param(
            tuple[int, str], "fixed-length tuple[int, str] is not supported; use tuple[X, ...]", id="fixed-tuple"
        ),
        pytest.param(dict[int, str], "dict[int, str] is not supported (JSON object keys are str)", id="int-keys"),
        pytest.param(int | str, "the union int | str is not supported (only X | None is", id="union"),
        pytest.param(int | str | None, "the union int | str | None is not supported", id="union-with-none"),
        pytest.param(Literal[b"x"], "the Literal value b'x' is not JSON", id="literal-bytes"),
        pytest.param(enum.IntFlag, "the flag enum IntFlag is not supported", id="flag-enum"),
        pytest.param(
            Optional[Unset],  # noqa: UP045 - the spelling an author writes
            "is ambiguous: null could be None or <Unset.UNSET: None>",
            id="optional-enum-with-none-member",
        ),
        pytest.param(dict[str, Unset | None], "Unset | None is ambiguous", id="nested-optional-enum-with-none-member"),
        pytest.param(list[bytes], "x[]: the annotation bytes is not supported", id="nested-in-list"),
    ],
)
def test_unsupported_annotations_raise_naming_the_field(annotation: object, fragment: str) -> None:
    cls = _one_field(annotation)
    with pytest.raises(SchemaSpecError) as info:
        schema_from_attrs_class(cls)
    (violation,) = info.value.violations
    assert violation.startswith(f"{cls.__qualname__}.x")
    assert fragment in violation


def test_unsupported_item_path_steps_into_the_list() -> None:
    cls = _one_field(list[dict[str, bytes]])
    with pytest.raises(SchemaSpecError) as info:
        schema_from_attrs_class(cls)
    assert info.value.violations[0].startswith(f"{cls.__qualname__}.x[][]: the annotation bytes is not supported")


def test_every_unsupported_field_is_reported_with_its_path() -> None:
    with pytest.raises(SchemaSpecError) as info:
        schema_from_attrs_class(Cluster)
    violations = info.value.violations
    assert len(violations) == 2
    assert violations[0].startswith("Cluster.ports[].number: the annotation bytes is not supported")
    assert violations[1].startswith("Cluster.weights: dict[int, float] is not supported")
    assert info.value.code == ErrorCode.INVALID_SCHEMA_SPEC.value


def test_recursive_class_is_refused() -> None:
    with pytest.raises(SchemaSpecError) as info:
        schema_from_attrs_class(Node)
    assert info.value.violations == (
        "Node.children[]: the attrs class Node contains itself, which the schema subset cannot express "
        "(it has no references)",
    )


def test_none_annotation_is_null_and_a_missing_annotation_is_refused() -> None:
    assert schema_from_attrs_class(Nulls)["properties"] == {
        "nothing": {"type": "null"},
        "maybe": {"oneOf": [{"type": "integer"}, {"type": "null"}]},
    }
    assert structure_args(Nulls, {"nothing": None, "maybe": None}) == Nulls(None, None)
    with pytest.raises(SchemaSpecError) as info:
        schema_from_attrs_class(Unannotated)
    assert info.value.violations == ("Unannotated.x: the field has no type annotation",)


def test_unresolvable_annotation_is_reported() -> None:
    with pytest.raises(SchemaSpecError) as info:
        schema_from_attrs_class(UsesMissing)
    (violation,) = info.value.violations
    assert violation.startswith("UsesMissing.x: cannot evaluate the annotation 'NotDefinedAnywhere' (NameError")


def test_non_string_description_is_reported() -> None:
    cls = _one_field(int, metadata={"description": 3})
    with pytest.raises(SchemaSpecError) as info:
        schema_from_attrs_class(cls)
    assert info.value.violations == (f'{cls.__qualname__}.x: metadata "description" must be a str',)


@pytest.mark.parametrize("not_attrs", [int, dict, object(), "Deploy", [Deploy]])
def test_non_attrs_class_is_refused(not_attrs: Any) -> None:
    with pytest.raises(SchemaSpecError, match="is not an attrs class"):
        schema_from_attrs_class(not_attrs)


def test_subset_violations_of_the_derived_schema_become_a_schema_spec_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def reject(schema: object) -> None:
        raise JsonSchemaError(["schema.properties.x is wrong"])

    monkeypatch.setattr(_attrs_params, "assert_supported_json_schema", reject)
    with pytest.raises(SchemaSpecError) as info:
        schema_from_attrs_class(_one_field(int))
    assert info.value.violations == ("schema.properties.x is wrong",)
    assert isinstance(info.value.__cause__, JsonSchemaError)


def test_failed_class_is_not_cached() -> None:
    cls = _one_field(bytes)
    for _ in range(2):
        with pytest.raises(SchemaSpecError):
            schema_from_attrs_class(cls)
    with pytest.raises(SchemaSpecError):
        structure_args(cls, {"x": b""})


# ---------------------------------------------------------------------------
# Strict structuring


def test_validated_args_structure_into_an_instance() -> None:
    args = snapshot_json(
        {
            "name": "web",
            "servers": [{"host": "a"}, {"host": "b", "port": 8080}],
            "primary": {"host": "a", "port": 1},
            "tags": ["x", "y"],
            "env": {"K": "V"},
            "mode": "fast",
            "extra": {"free": [1, None]},
        }
    )
    assert validate_json_schema_value(schema_from_attrs_class(Deploy), args) == ()
    deploy = structure_args(Deploy, args)
    assert deploy == Deploy(
        name="web",
        servers=[Server("a"), Server("b", 8080)],
        primary=Server("a", 1),
        tags=("x", "y"),
        env={"K": "V"},
        mode="fast",
        extra=FrozenDict({"free": [1, None]}),
    )
    assert type(deploy.servers) is list
    assert type(deploy.tags) is tuple
    assert type(deploy.extra) is FrozenDict  # JSON fields keep the frozen value


@pytest.mark.parametrize(
    ("annotation", "value", "expected"),
    [
        pytest.param(int, 2.0, 2, id="integral-float-to-int"),
        pytest.param(int, 7, 7, id="int"),
        pytest.param(float, 1, 1.0, id="int-to-float"),
        pytest.param(float, 2**53, float(2**53), id="exact-big-int-to-float"),
        pytest.param(Literal[1, 2], 2.0, 2, id="literal-integral-float"),
        pytest.param(int | None, None, None, id="optional-none"),
        pytest.param(int | None, 3.0, 3, id="optional-int"),
        pytest.param(list[int], (1, 2.0), [1, 2], id="tuple-to-list"),
        pytest.param(tuple[str, ...], ["a"], ("a",), id="list-to-tuple"),
        pytest.param(type(None), None, None, id="none"),
    ],
)
def test_structuring_follows_the_schema_number_rules(annotation: object, value: object, expected: object) -> None:
    result = structure_args(_one_field(annotation), {"x": value}).x  # type: ignore[attr-defined]
    assert result == expected
    assert type(result) is type(expected)
    if isinstance(result, list):
        assert [type(item) for item in result] == [type(item) for item in expected]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("annotation", "value", "violation"),
    [
        pytest.param(int, "1", "expected an integer, got a string @ $.x", id="str-for-int"),
        pytest.param(int, 1.5, "expected an integer, got the number 1.5 @ $.x", id="fraction-for-int"),
        pytest.param(int, True, "expected an integer, got a boolean @ $.x", id="bool-for-int"),
        pytest.param(float, True, "expected a number, got a boolean @ $.x", id="bool-for-float"),
        pytest.param(float, "1.5", "expected a number, got a string @ $.x", id="str-for-float"),
        pytest.param(float, 2**53 + 1, "the integer 9007199254740993 has no exact float value @ $.x", id="inexact"),
        pytest.param(float, 10**400, "has no exact float value @ $.x", id="overflow"),
        pytest.param(str, 1, "expected a string, got the number 1 @ $.x", id="int-for-str"),
        pytest.param(str, None, "expected a string, got null @ $.x", id="none-for-str"),
        pytest.param(bool, 1, "expected a boolean, got the number 1 @ $.x", id="int-for-bool"),
        pytest.param(bool, "false", "expected a boolean, got a string @ $.x", id="str-for-bool"),
        pytest.param(type(None), 0, "expected null, got the number 0 @ $.x", id="zero-for-none"),
        pytest.param(list[str], "ab", "expected an array, got a string @ $.x", id="str-for-list"),
        pytest.param(list[int], [1, "2"], "expected an integer, got a string @ $.x[1]", id="list-item"),
        pytest.param(tuple[int, ...], {"a": 1}, "expected an array, got an object @ $.x", id="dict-for-tuple"),
        pytest.param(dict[str, int], [1], "expected an object, got an array @ $.x", id="list-for-dict"),
        pytest.param(dict[str, int], {"k": "v"}, "expected an integer, got a string @ $.x['k']", id="dict-value"),
        pytest.param(Literal[1], True, "expected one of [1], got a boolean @ $.x", id="bool-for-literal-1"),
        pytest.param(Literal["a"], "b", 'expected one of ["a"], got a string @ $.x', id="literal-miss"),
        pytest.param(int | None, "3", "expected an integer, got a string @ $.x", id="optional-inner"),
        pytest.param(Server, "host", "expected an object, got a string @ $.x", id="str-for-class"),
        pytest.param(Server, {"host": 1}, "expected a string, got the number 1 @ $.x.host", id="nested-field"),
        pytest.param(Server, {"port": 1}, "required field missing @ $.x.host", id="nested-missing"),
        pytest.param(Server, {"host": "h", "bogus": 1}, "extra fields found (bogus) @ $.x", id="nested-extra"),
    ],
)
def test_structuring_never_coerces(annotation: object, value: object, violation: str) -> None:
    with pytest.raises(ToolArgsError) as info:
        structure_args(_one_field(annotation), {"x": value})
    error = info.value
    assert len(error.violations) == 1
    assert error.violations[0].endswith(violation)
    assert error.code == ErrorCode.INVALID_ARGS.value
    assert str(error).startswith("invalid arguments: ")


def test_every_structuring_failure_is_reported_with_its_path() -> None:
    args = {"name": 1, "servers": [{"host": "a"}, {"host": "b", "port": "80"}], "primary": "x", "mode": "slow"}
    with pytest.raises(ToolArgsError) as info:
        structure_args(Deploy, args)
    assert set(info.value.violations) == {
        "expected a string, got the number 1 @ $.name",
        "expected an integer, got a string @ $.servers[1].port",
        "expected an object, got a string @ $.primary",
        'expected one of ["fast", "safe"], got a string @ $.mode',
    }


def test_root_rejects_unknown_and_missing_keys() -> None:
    with pytest.raises(ToolArgsError) as info:
        structure_args(Server, {"port": 1, "colour": "red"})
    assert set(info.value.violations) == {"required field missing @ $.host", "extra fields found (colour) @ $"}


def test_root_must_be_an_object() -> None:
    with pytest.raises(ToolArgsError) as info:
        structure_args(Server, ["host"])  # type: ignore[arg-type]
    assert info.value.violations == ("expected an object, got an array @ $",)


def test_a_failing_attrs_validator_is_an_args_error() -> None:
    cls = _one_field(int, validator=attrs.validators.gt(0))
    with pytest.raises(ToolArgsError) as info:
        structure_args(cls, {"x": 0})
    (violation,) = info.value.violations
    assert "'x' must be > 0" in violation


# ---------------------------------------------------------------------------
# Round trip: whatever the derived schema accepts, structuring accepts

_SAFE_INTS = st.integers(-(2**53), 2**53)
_json = st.recursive(
    st.none() | st.booleans() | _SAFE_INTS | st.floats(-1e9, 1e9).filter(lambda f: f != 0) | st.text(max_size=3),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=3), children, max_size=3),
    max_leaves=8,
)
_literal_values = st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=2)
_leaves = st.sampled_from([str, int, float, bool, type(None), Any, JsonValue]) | st.lists(
    _literal_values, min_size=1, max_size=4
).map(lambda values: Literal[tuple(values)])


def _classes(children: st.SearchStrategy[Any]) -> st.SearchStrategy[type]:
    fields = st.dictionaries(st.sampled_from("abcde"), st.tuples(children, st.booleans()), max_size=4)
    return fields.map(
        lambda spec: attrs.make_class(
            f"Gen{next(_names)}",
            {
                # An optional field admits its default: a None default of a non-null type is refused.
                name: attrs.field(type=Optional[tp], default=None) if optional else attrs.field(type=tp)  # noqa: UP045
                for name, (tp, optional) in spec.items()
            },
            kw_only=True,
        )
    )


def _annotations(typed_dicts: bool) -> st.SearchStrategy[Any]:
    def extend(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        dict_values = children if typed_dicts else st.just(Any)
        return (
            children.map(lambda tp: list[tp])  # type: ignore[valid-type]
            | children.map(lambda tp: tuple[tp, ...])  # type: ignore[valid-type]
            | dict_values.map(lambda tp: dict[str, tp])  # type: ignore[valid-type]
            | children.map(lambda tp: Optional[tp])  # noqa: UP045
            | _classes(children)
        )

    return st.recursive(_leaves, extend, max_leaves=8)


def _values(tp: Any) -> st.SearchStrategy[Any]:
    """JSON values of the shape ``tp`` describes (what a well-behaved model would send)."""
    if tp is Any or tp == JsonValue:
        return _json
    if tp is type(None):
        return st.none()
    simple: dict[Any, st.SearchStrategy[Any]] = {
        str: st.text(max_size=4),
        int: _SAFE_INTS | _SAFE_INTS.map(float),
        float: st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: f != 0) | _SAFE_INTS,
        bool: st.booleans(),
    }
    if tp in simple:
        return simple[tp]
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return st.sampled_from(args)
    if origin is list or origin is tuple:
        items = st.lists(_values(args[0]), max_size=3)
        return items | items.map(tuple)
    if origin is dict:
        return st.dictionaries(st.text(max_size=3), _values(args[1]), max_size=3)
    if origin is typing.Union:
        (inner,) = [arg for arg in args if arg is not type(None)]
        return st.none() | _values(inner)
    assert attrs.has(tp)
    required = {f.name: _values(f.type) for f in attrs.fields(tp) if f.default is attrs.NOTHING}
    optional = {f.name: _values(f.type) for f in attrs.fields(tp) if f.default is not attrs.NOTHING}
    return st.fixed_dictionaries(required, optional=optional)


_round_trip_settings = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_round_trip_settings
@given(_annotations(typed_dicts=True).flatmap(lambda tp: st.tuples(st.just(tp), _values(tp))))
def test_values_of_the_declared_shape_validate_and_structure(case: tuple[Any, Any]) -> None:
    annotation, value = case
    cls = _one_field(annotation)
    args = snapshot_json({"x": value})
    assert validate_json_schema_value(schema_from_attrs_class(cls), args) == ()
    assert isinstance(structure_args(cls, args), cls)


@_round_trip_settings
@given(_annotations(typed_dicts=False), _json)
def test_any_json_the_schema_accepts_structures(annotation: Any, value: Any) -> None:
    # dict[str, X] values are checked only by structuring (the subset cannot say
    # "every value is X"), so this property draws dicts with unconstrained values.
    cls = _one_field(annotation)
    args = snapshot_json({"x": value})
    if validate_json_schema_value(schema_from_attrs_class(cls), args) == ():
        assert isinstance(structure_args(cls, args), cls)


def test_dict_values_are_enforced_by_structuring_not_by_the_schema() -> None:
    cls = _one_field(dict[str, int])
    args = snapshot_json({"x": {"k": "v"}})
    assert validate_json_schema_value(schema_from_attrs_class(cls), args) == ()
    with pytest.raises(ToolArgsError):
        structure_args(cls, args)


async def test_soft_callbacks_fall_back_when_valid_arguments_do_not_structure() -> None:
    """b.6: presenters and the classifier never raise on arguments the class refuses; the call itself says why."""
    from dsh_core.testing import expect_failure, make_input, make_runtime

    cls = _one_field(dict[str, int])
    seen: list[Any] = []

    def classify(args: Any) -> bool:
        seen.append(args)
        return True

    tool = define_tool(
        name="t",
        description="d",
        parameters=cls,
        output={"type": "json"},
        execute=lambda args: None,
        is_concurrency_safe=classify,
        present_call=lambda args: seen.append(args),
        resource_keys=lambda args: seen.append(args),
    )
    refused = snapshot_json({"x": {"k": "v"}})
    assert tool.is_concurrency_safe is not None and tool.present_call is not None
    assert tool.resource_keys is not None
    assert tool.is_concurrency_safe(refused) is False
    assert tool.present_call(refused) is None
    assert tool.resource_keys(refused) is None
    assert seen == []  # never called with what the class refuses
    assert tool.is_concurrency_safe(snapshot_json({"x": {"k": 1}})) is True
    failure = expect_failure(await make_runtime(tool).execute(make_input("t", {"x": {"k": "v"}})))
    assert failure.code == "INVALID_ARGS"


def test_annotations_nested_past_the_recursion_limit_are_a_schema_spec_error() -> None:
    deep: Any = int
    for _ in range(3000):
        deep = list[deep]
    cls = _one_field(deep)
    with pytest.raises(SchemaSpecError, match="annotations nested more than 100 levels deep"):
        schema_from_attrs_class(cls)

    def fn() -> None: ...

    with pytest.raises(SchemaSpecError, match="annotations nested more than 100 levels deep"):
        _attrs_params.value_schema_from_annotation(deep, fn, "f -> return")


# ---------------------------------------------------------------------------
# TypedDict required keys: total=, inheritance and qualifiers (postponed annotations here)


class TotalBase(TypedDict):
    a: int


class PartialExtension(TotalBase, total=False):
    b: str


class PartialBase(TypedDict, total=False):
    a: int


class TotalExtension(PartialBase):
    b: str
    c: NotRequired[str]


class PartialWithRequired(PartialBase, total=False):
    b: Required[str]


@pytest.mark.parametrize(
    ("typed_dict", "required"),
    [
        pytest.param(PartialExtension, ["a"], id="total-base-partial-extension"),
        pytest.param(TotalExtension, ["b"], id="partial-base-total-extension"),
        pytest.param(PartialWithRequired, ["b"], id="required-in-a-partial-extension"),
    ],
)
def test_each_typed_dict_key_is_required_as_its_own_class_says(typed_dict: type, required: list[str]) -> None:
    # A key is required per the total= of the class that declares it, unless Required/NotRequired says.
    cls = _one_field(typed_dict)
    assert schema_from_attrs_class(cls)["properties"]["x"].get("required", []) == required
    full = {"a": 1, "b": "b"}
    assert structure_args(cls, {"x": full}).x == full
    for key in required:
        with pytest.raises(ToolArgsError, match=f"missing required key '{key}'"):
            structure_args(cls, {"x": {other: value for other, value in full.items() if other != key}})
    optional = {key: value for key, value in full.items() if key in required}
    assert structure_args(cls, {"x": optional}).x == optional


# ---------------------------------------------------------------------------
# value_type: an annotation's schema and the strict check of the rest


def _owner() -> None: ...


@attrs.frozen
class Positive:
    n: int = attrs.field(validator=attrs.validators.gt(0))


@attrs.frozen
class Converted:
    n: int = attrs.field(converter=int)


@attrs.frozen
class Checked:
    n: int

    def __attrs_post_init__(self) -> None:
        if self.n < 0:
            raise ValueError("n must not be negative")


@pytest.mark.parametrize(
    ("annotation", "complete"),
    [
        pytest.param(int, True, id="int"),
        pytest.param(list[Server], True, id="attrs-class-without-checks"),
        pytest.param(dict[str, Any], True, id="dict-of-any"),
        pytest.param(dict[str, JsonValue], True, id="dict-of-json"),
        pytest.param(dict, True, id="bare-dict"),
        pytest.param(TotalExtension, True, id="typed-dict"),
        pytest.param(Literal["a", 1] | None, True, id="literal"),
        pytest.param(dict[str, int], False, id="dict-of-int"),
        pytest.param(list[Optional[dict[str, str]]], False, id="nested-dict-of-str"),  # noqa: UP045
        pytest.param(Positive, False, id="validator"),
        pytest.param(list[Converted], False, id="converter"),
        pytest.param(Checked | None, False, id="post-init"),
    ],
)
def test_a_value_type_says_whether_its_schema_says_everything(annotation: object, complete: bool) -> None:
    assert _attrs_params.value_type(annotation, _owner, "f").complete is complete


def test_a_value_type_checks_what_its_schema_cannot_say() -> None:
    values = _attrs_params.value_type(dict[str, list[int]], _owner, "f")
    assert values.schema == {"type": "object"}
    assert values.violations({"a": [1, 2]}) == []
    assert values.violations({"a": [1, "2"]}, root="value") == ["expected an integer, got a string @ value['a'][1]"]
    positive = _attrs_params.value_type(list[Positive], _owner, "f")
    assert positive.violations([{"n": 1}]) == []
    [violation] = positive.violations([{"n": 1}, {"n": 0}])
    assert "'n' must be > 0" in violation and violation.endswith("@ $[1]")
    assert _attrs_params.value_type(Checked, _owner, "f").violations({"n": -1}) == [
        "invalid value (n must not be negative) @ $"
    ]


# ---------------------------------------------------------------------------
# Defaults the schema shows


def test_a_shown_default_that_is_not_a_value_of_its_field_is_refused_with_every_other_problem() -> None:
    inner = attrs.make_class("BadInner", {"n": attrs.field(type=int, default="one")})
    cls = attrs.make_class(
        "BadDefaults",
        {
            "limit": attrs.field(type=int, default=None),
            "tags": attrs.field(type=list[str], default=["a", 2]),
            "inner": attrs.field(type=inner),
            "fine": attrs.field(type=int | None, default=None),
        },
        kw_only=True,
    )
    with pytest.raises(SchemaSpecError) as info:
        schema_from_attrs_class(cls)
    assert info.value.violations == (
        "BadDefaults.limit: the default None is not a value of its annotation (expected an integer, got null @ default)",
        "BadDefaults.tags: the default ['a', 2] is not a value of its annotation "
        "(expected a string, got the number 2 @ default[1])",
        "BadDefaults.inner.n: the default 'one' is not a value of its annotation "
        "(expected an integer, got a string @ default)",
    )


def test_define_tool_refuses_a_parameters_class_whose_default_its_schema_refuses() -> None:
    @attrs.frozen
    class Args:
        limit: int = None  # type: ignore[assignment]

    async def body(args: Args) -> str:
        return repr(args.limit)

    with pytest.raises(SchemaSpecError, match=r"Args\.limit: the default None is not a value of its annotation"):
        define_tool(name="t", description="d", parameters=Args, output={"type": "string"}, execute=body)


# ---------------------------------------------------------------------------
# Nesting depth: a fixed bound, whatever the caller's stack


def _nested_lists(levels: int, leaf: Any = int) -> Any:
    """``list[list[...[int]]]``: ``levels`` annotations in all, the leaf included."""
    annotation: Any = leaf
    for _ in range(levels - 1):
        annotation = list[annotation]
    return annotation


def _nested_classes(levels: int) -> type:
    """A class whose field holds a class ... down to an ``int`` field: ``levels`` annotations below the root."""
    cls = attrs.make_class("Level0", {"v": attrs.field(type=int)})
    for level in range(1, levels):
        cls = attrs.make_class(f"Level{level}", {"c": attrs.field(type=cls)})
    return cls


def _nested_value(levels: int) -> Any:
    value: Any = {"v": 1}
    for _ in range(levels - 1):
        value = {"c": value}
    return value


def _with_free_frames(free: int, call: Any) -> Any:
    """Run ``call`` with only about ``free`` frames left below the recursion limit."""

    def descend(remaining: int) -> Any:
        return call() if remaining <= 0 else descend(remaining - 1)

    return descend(sys.getrecursionlimit() - len(inspect.stack(0)) - free)


def test_annotations_nested_past_the_limit_are_refused_naming_it() -> None:
    assert _attrs_params.MAX_ANNOTATION_DEPTH == 100
    schema_from_attrs_class(_one_field(_nested_lists(100)))
    schema_from_attrs_class(_nested_classes(100))
    with pytest.raises(SchemaSpecError) as info:
        schema_from_attrs_class(_one_field(_nested_lists(101)))
    ((violation,),) = [info.value.violations]
    assert violation.startswith("One")
    assert violation.endswith(
        ".x" + "[]" * 100 + ": annotations nested more than 100 levels deep are not supported (their values could "
        "not be structured reliably); declare deeper data as JsonValue, or use a RawSchema or the schema DSL"
    )
    with pytest.raises(SchemaSpecError, match=r"^invalid schema spec: Level100(\.c){100}\.v: annotations nested more"):
        schema_from_attrs_class(_nested_classes(101))


def test_a_class_met_again_deeper_counts_its_own_nesting() -> None:
    inner = _nested_classes(90)
    cls = attrs.make_class(
        "Reused", {"shallow": attrs.field(type=inner), "deep": attrs.field(type=_nested_lists(11, inner))}
    )
    with pytest.raises(SchemaSpecError) as info:
        schema_from_attrs_class(cls)
    assert info.value.violations == (
        "Reused.deep" + "[]" * 10 + ": annotations nested more than 100 levels deep are not supported "
        "(their values could not be structured reliably); declare deeper data as JsonValue, or use a RawSchema "
        "or the schema DSL",
    )
    schema_from_attrs_class(
        attrs.make_class("ReusedFits", {"a": attrs.field(type=inner), "b": attrs.field(type=list[list[inner]])})
    )


@pytest.mark.parametrize("levels", [100, 101])
def test_the_verdict_does_not_depend_on_the_callers_stack(levels: int) -> None:
    def verdict() -> tuple[str, ...]:
        try:
            schema_from_attrs_class(_nested_classes(levels))
            _attrs_params.value_type(_nested_lists(levels), verdict, "f.x")
        except SchemaSpecError as exc:
            return exc.violations
        return ()

    shallow = verdict()
    assert shallow == _with_free_frames(500, verdict)
    assert (shallow == ()) == (levels == 100)


async def test_valid_values_of_the_deepest_accepted_declaration_structure() -> None:
    from dsh_core.testing import expect_success, make_input, make_runtime

    async def body(args: Any) -> str:
        return "ok"

    tool = define_tool(
        name="deep", description="d", parameters=_nested_classes(100), output={"type": "string"}, execute=body
    )
    result = await make_runtime(tool).execute(make_input("deep", _nested_value(100)))
    assert expect_success(result).value == "ok"
    assert _with_free_frames(500, lambda: structure_args(_nested_classes(100), _nested_value(100))) is not None
