"""The one-pass reader of flat argument objects: which schemas get one, and that it only ever says what both walks say."""

from __future__ import annotations

import math
from typing import Any

import pytest
from corpus.regressions import HUGE_INT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_schema_validate import NAMES, Name, fitting_values, tricky_values

from dsh_core import CancelSignal, ToolExecutionInput, ToolExecutionSuccess, ToolRuntime, define_tool
from dsh_core._definition import contract_of
from dsh_core._errors import NonJsonValueError
from dsh_core._json import FrozenDict, snapshot_json
from dsh_core._schema._validate import compile_validator, report_violations

ADD = {
    "type": "object",
    "properties": {"a": {"type": "integer", "description": "first"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
}
MIXED = {
    "type": "object",
    "title": "mixed",
    "properties": {
        "s": {"type": "string"},
        "n": {"type": "number"},
        "i": {"type": "integer"},
        "t": {"type": "boolean"},
        "z": {"type": "null"},
        "mode": {"type": "string", "enum": ["read", "write"], "default": "read"},
    },
    "required": ["s"],
    "additionalProperties": False,
}


def reader_for(schema: dict[str, Any]) -> Any:
    reader = compile_validator(schema).flat_reader
    assert reader is not None
    return reader


class EvilKey:
    """Hashes like "s": looking it up among the declared names would run its __eq__."""

    def __hash__(self) -> int:
        return hash("s")

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("__eq__ ran")


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "array", "items": {"type": "integer"}},
        {"type": "object", "properties": {"a": {"type": "object"}}},
        {"type": "object", "properties": {"a": {"type": "array"}}},
        {"type": "object", "properties": {"a": {}}},
        {"type": "object", "properties": {"a": {"oneOf": [{"type": "string"}, {"type": "null"}]}}},
        {"type": "object", "properties": {"a": {"type": "integer", "const": 1}}},
        {"type": "object", "properties": {"a": {"type": "integer", "enum": [1, 2]}}},
        {"oneOf": [{"type": "object"}, {"type": "null"}]},
        {},
    ],
)
def test_schemas_beyond_a_flat_object_of_scalars_get_no_reader(schema: dict[str, Any]) -> None:
    assert compile_validator(schema).flat_reader is None


def test_flat_object_schemas_get_a_reader() -> None:
    for schema in (ADD, MIXED, {"type": "object"}, {"type": "object", "properties": {}}):
        assert compile_validator(schema).flat_reader is not None


def test_reader_freezes_a_plain_valid_object_in_key_order() -> None:
    raw = {"b": 2, "a": 1}
    frozen = reader_for(ADD)(raw)
    assert type(frozen) is FrozenDict
    assert list(frozen.items()) == [("b", 2), ("a", 1)]
    raw["a"] = 99  # the copy is the caller's no longer
    assert frozen["a"] == 1


def test_reader_returns_a_frozen_dict_as_it_is() -> None:
    frozen = FrozenDict({"a": 1, "b": 2})
    assert reader_for(ADD)(frozen) is frozen


@pytest.mark.parametrize(
    "value",
    [
        {"s": "x"},
        {"s": "", "n": 1, "i": -3, "t": True, "z": None, "mode": "write"},
        {"s": "x", "n": 1.5, "i": 0},
        {"mode": "read", "s": "\ud800"},  # a lone surrogate is a str as far as JSON values here go
    ],
)
def test_reader_accepts_what_both_walks_accept(value: dict[str, Any]) -> None:
    frozen = reader_for(MIXED)(value)
    assert frozen == snapshot_json(value)
    assert report_violations(compile_validator(MIXED).schema, value) == ()


@pytest.mark.parametrize(
    "value",
    [
        pytest.param({"s": "x", "i": 1.0}, id="integral float for integer: valid, but the general path's call"),
        pytest.param({"s": "x", "extra": 1}, id="undeclared property"),
        pytest.param({"n": 1}, id="required property missing"),
        pytest.param({"s": 1}, id="wrong type"),
        pytest.param({"s": "x", "i": True}, id="bool is not an integer"),
        pytest.param({"s": "x", "n": False}, id="bool is not a number"),
        pytest.param({"s": "x", "n": math.nan}, id="nan"),
        pytest.param({"s": "x", "n": math.inf}, id="inf"),
        pytest.param({"s": "x", "n": -0.0}, id="negative zero"),
        pytest.param({"s": "x", "i": HUGE_INT}, id="int too long for JSON text"),
        pytest.param({"s": Name("x")}, id="str subclass value"),
        pytest.param({Name("s"): "x"}, id="str subclass key"),
        pytest.param({"s": "x", "mode": "delete"}, id="not in the enum"),
        pytest.param({EvilKey(): "x"}, id="a key whose comparison raises"),
        pytest.param([("s", "x")], id="not a dict"),
    ],
)
def test_reader_leaves_everything_else_to_the_general_path(value: Any) -> None:
    assert reader_for(MIXED)(value) is None


def test_reader_refuses_dict_subclasses() -> None:
    class Args(dict[str, Any]):
        pass

    assert reader_for(ADD)(Args(a=1, b=2)) is None


def flat_schemas() -> st.SearchStrategy[dict[str, Any]]:
    scalar = st.sampled_from(["string", "number", "integer", "boolean", "null"]).map(lambda t: {"type": t})
    string_enum = st.lists(st.sampled_from(["a", "b", "", "{q}"]), min_size=1, max_size=3).map(
        lambda members: {"type": "string", "enum": members}
    )

    def build(properties: dict[str, Any], closed: bool | None, data: st.DataObject) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": "object", "properties": properties}
        if closed is not None:
            schema["additionalProperties"] = closed
        if properties:
            schema["required"] = data.draw(st.lists(st.sampled_from(sorted(properties)), unique=True))
        return schema

    return st.builds(
        build,
        st.dictionaries(st.sampled_from(NAMES), scalar | string_enum, max_size=4),
        st.none() | st.booleans(),
        st.data(),
    )


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_reader_never_says_what_the_two_walks_would_not(data: st.DataObject) -> None:
    schema = data.draw(flat_schemas())
    value = data.draw(fitting_values(schema) | tricky_values())
    validator = compile_validator(schema)
    reader = validator.flat_reader
    assert reader is not None
    frozen = reader(value)
    if frozen is None:
        return
    # Sound: a snapshot would succeed, equal in content and key order, and the full checker finds nothing.
    snapshot = snapshot_json(value)
    assert type(frozen) is FrozenDict
    assert list(frozen.items()) == list(snapshot.items())  # type: ignore[union-attr]
    assert report_violations(validator.schema, value) == ()


def test_snapshot_would_fail_whenever_a_lossy_value_reaches_the_reader() -> None:
    # The lossy cases above are refused by the reader and by snapshot_json alike.
    for value in ({"s": "x", "n": math.nan}, {"s": "x", "i": HUGE_INT}, {Name("s"): "x"}):
        assert reader_for(MIXED)(value) is None
        with pytest.raises(NonJsonValueError):
            snapshot_json(value)


def add_runtime() -> ToolRuntime:
    async def add(args: Any) -> Any:
        return args["a"] + args["b"]

    runtime = ToolRuntime()
    runtime.register(
        define_tool(
            name="add",
            description="add",
            parameters={"a": {"type": "integer", "required": True}, "b": {"type": "number", "required": True}},
            output={"type": "number"},
            execute=add,
        )
    )
    return runtime


async def call(runtime: ToolRuntime, arguments: Any) -> Any:
    return await runtime.execute(
        ToolExecutionInput(call_id="c", name="add", arguments=arguments, signal=CancelSignal())
    )


async def test_pipeline_results_are_the_same_through_the_reader_and_around_it() -> None:
    runtime = add_runtime()
    first = await call(runtime, {"a": 1, "b": 2})  # compiles the contract: the general path
    second = await call(runtime, {"a": 1, "b": 2})  # the reader
    assert first == second == ToolExecutionSuccess(value=3, content=first.content)
    assert (await call(runtime, {"a": 1.0, "b": 2})).value == 3.0  # integral float: the general path accepts it
    refused = await call(runtime, {"a": True, "b": 2})
    assert refused.error.info.code == "INVALID_ARGS"
    assert refused.error.message == 'invalid arguments: "a" must be an integer'


async def test_the_body_gets_the_frozen_copy_not_the_callers_dict() -> None:
    seen: list[Any] = []

    async def keep(args: Any) -> Any:
        seen.append(args)
        return 0

    runtime = ToolRuntime()
    runtime.register(
        define_tool(
            name="keep",
            description="keep",
            parameters={"a": {"type": "integer"}},
            output={"type": "integer"},
            execute=keep,
        )
    )
    raw = {"a": 1}
    for _ in range(2):
        await runtime.execute(ToolExecutionInput(call_id="c", name="keep", arguments=raw, signal=CancelSignal()))
    assert [type(args) for args in seen] == [FrozenDict, FrozenDict]
    assert all(args is not raw and args == raw for args in seen)


async def test_a_call_the_reader_accepts_is_not_checked_again() -> None:
    runtime = add_runtime()
    await call(runtime, {"a": 1, "b": 2})
    contract = contract_of(runtime.registrations()[0][1])
    assert contract.read_arguments is not None and contract.args_fast is not None
    calls: list[str] = []
    read, check = contract.read_arguments, contract.args_fast

    def counted_read(value: object) -> Any:
        calls.append("read")
        return read(value)

    def counted_check(value: object) -> Any:
        calls.append("check")
        return check(value)

    contract.read_arguments, contract.args_fast = counted_read, counted_check
    assert (await call(runtime, {"a": 1, "b": 2})).value == 3
    assert calls == ["read"]
    assert (await call(runtime, {"a": 1.0, "b": 2})).value == 3.0
    assert calls == ["read", "read", "check"]
