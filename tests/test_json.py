"""Lossless JSON snapshots: what is accepted, what is refused (and where), and the deep-value guarantees."""

from __future__ import annotations

import collections
import copy
import decimal
import enum
import json
import math
import operator
import pickle
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsh_core._errors import NonJsonValueError
from dsh_core._json import FrozenDict, json_equal, json_path, nests_deeper_than, snapshot_json, thaw

DEEP = 100_000


def deep_array(depth: int) -> list[Any]:
    root: list[Any] = []
    current = root
    for _ in range(depth):
        child: list[Any] = []
        current.append(child)
        current = child
    return root


def deep_object(depth: int) -> dict[str, Any]:
    root: dict[str, Any] = {}
    current = root
    for _ in range(depth):
        child: dict[str, Any] = {}
        current["k"] = child
        current = child
    return root


def finite_floats() -> st.SearchStrategy[float]:
    # -0.0 has no lossless JSON form, so generated JSON never contains it.
    return st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: not (f == 0.0 and math.copysign(1, f) < 0))


def json_values() -> st.SearchStrategy[Any]:
    scalars = st.none() | st.booleans() | st.integers() | finite_floats() | st.text()
    return st.recursive(
        scalars,
        lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=5), children, max_size=5),
        max_leaves=30,
    )


def strictly_equal(left: Any, right: Any) -> bool:
    """Python equality plus exact types at every position (``True`` is not ``1``, ``1`` is not ``1.0``)."""
    return json.dumps(left) == json.dumps(right) and left == right


class Colour(enum.IntEnum):
    RED = 1


class Name(str):
    pass


class Ratio(float):
    pass


class Custom:
    pass


class MyList(list[Any]):
    pass


# --- accepted values ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [None, True, False, 0, -7, 10**40, 1.5, 0.0, -2.5e300, "", "ü ✓", "\ud800"],
    ids=repr,
)
def test_scalars_snapshot_to_themselves(value: object) -> None:
    snap = snapshot_json(value)
    assert snap is value or snap == value
    assert type(snap) is type(value)


def test_objects_become_frozen_dicts_and_arrays_tuples() -> None:
    snap = snapshot_json({"a": [1, {"b": (2, 3)}], "c": {}})
    assert type(snap) is FrozenDict
    assert type(snap["a"]) is tuple
    assert type(snap["a"][1]) is FrozenDict
    assert snap["a"][1]["b"] == (2, 3)


@pytest.mark.parametrize(
    "value",
    [
        [0.0, 1, "x", True, None, 2.5, -(10**4000)],
        list(range(-50, 50)),
        [0.0, 0.0, 1e308, -1e-308],
        ("a", "b"),
        [],
        {"rows": [[1, 2.0], [], ["x", None]], "flat": {"a": 1}},
    ],
)
def test_arrays_of_scalars_snapshot_to_equal_tuples(value: Any) -> None:
    snapshot = snapshot_json(value)
    assert thaw(snapshot) == thaw(snapshot_json({"wrapped": [value]}))["wrapped"][0]
    assert json.dumps(thaw(snapshot)) == json.dumps(value)
    if isinstance(value, (list, tuple)):
        assert type(snapshot) is tuple and snapshot == tuple(value)


def test_tuple_arrays_are_accepted() -> None:
    assert snapshot_json((1, [2, (3,)])) == (1, (2, (3,)))


def test_key_order_is_kept() -> None:
    source = {"z": 1, "a": 2, "10": 3, "1": 4, "m": {"y": 0, "b": 1}}
    snap = snapshot_json(source)
    assert isinstance(snap, FrozenDict)
    assert list(snap) == ["z", "a", "10", "1", "m"]
    assert list(snap["m"]) == ["y", "b"]  # type: ignore[arg-type]


def test_existing_frozen_dict_is_returned_as_is() -> None:
    frozen = snapshot_json({"a": [1]})
    assert snapshot_json(frozen) is frozen


def test_shared_sub_values_are_not_cycles() -> None:
    shared = [1, {"x": 2}]
    snap = snapshot_json({"a": shared, "b": shared, "c": [shared, shared]})
    assert snap == {"a": shared, "b": shared, "c": [shared, shared]}


# --- rejected values ------------------------------------------------------------------------------


def _cyclic_list() -> list[Any]:
    value: list[Any] = [1]
    value.append(value)
    return value


def _cyclic_dict() -> dict[str, Any]:
    value: dict[str, Any] = {}
    value["self"] = value
    return value


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        pytest.param({1: "x"}, "object key 1 is not a str", id="int-key"),
        pytest.param({None: "x"}, "object key None is not a str", id="none-key"),
        pytest.param({Name("k"): 1}, "is not a str", id="str-subclass-key"),
        pytest.param(math.nan, "not a finite JSON number", id="nan"),
        pytest.param(math.inf, "not a finite JSON number", id="inf"),
        pytest.param(-math.inf, "not a finite JSON number", id="-inf"),
        pytest.param(-0.0, "-0.0 has no lossless JSON form", id="negative-zero"),
        pytest.param(b"abc", "bytes are not JSON", id="bytes"),
        pytest.param(bytearray(b"a"), "bytes are not JSON", id="bytearray"),
        pytest.param({1, 2}, "sets are not JSON", id="set"),
        pytest.param(frozenset(), "sets are not JSON", id="frozenset"),
        pytest.param(Custom(), "Custom is not a JSON value", id="custom-object"),
        pytest.param(decimal.Decimal("1.5"), "Decimal is not a JSON value", id="decimal"),
        pytest.param(1j, "complex is not a JSON value", id="complex"),
        pytest.param(Colour.RED, "Colour of int is not JSON", id="int-subclass"),
        pytest.param(Name("x"), "Name of str is not JSON", id="str-subclass"),
        pytest.param(Ratio(0.5), "Ratio of float is not JSON", id="float-subclass"),
        pytest.param(collections.OrderedDict(a=1), "OrderedDict is not a JSON value", id="dict-subclass"),
        pytest.param(MyList([1]), "MyList is not a JSON value", id="list-subclass"),
        pytest.param(_cyclic_list(), "cycle", id="cyclic-list"),
        pytest.param(_cyclic_dict(), "cycle", id="cyclic-dict"),
    ],
)
def test_non_json_values_are_refused(value: object, fragment: str) -> None:
    with pytest.raises(NonJsonValueError, match=None) as caught:
        snapshot_json(value)
    assert fragment in str(caught.value)
    assert isinstance(caught.value, ValueError)


# ``bool`` cannot be subclassed in Python, so the "bool subclass" case of the
# specification cannot arise; int/str/float subclasses are covered above.


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ({"items": [0, 1, 2, {"x": math.nan}]}, "$.items[3].x"),
        ([[[b"x"]]], "$[0][0][0]"),
        ({"a b": {"c": {2: 0}}}, '$["a b"].c'),
        ({"ok": 1, "bad": {"deep": [1, Colour.RED]}}, "$.bad.deep[1]"),
        ({"self": [_cyclic_list()]}, "$.self[0][1]"),
        ({"k": -0.0}, "$.k"),
        (math.inf, "$"),
        # Arrays of scalars only are checked in one go: what it refuses still names its item.
        ([1.5, 0.0, 2.5, -0.0], "$[3]"),
        ((0.0, math.nan), "$[1]"),
        ([1, "a", -math.inf, None], "$[2]"),
        ({"rows": [[1, 2], [3, 10**5000]]}, "$.rows[1][1]"),
        ([True, -(10**5000)], "$[1]"),
        ([1, 2, Colour.RED], "$[2]"),
        ([0.5, Ratio(0.5)], "$[1]"),
        (["a", Name("b")], "$[1]"),
        ([[], [0.0, -0.0]], "$[1][1]"),
    ],
)
def test_refusal_names_the_json_path(value: object, path: str) -> None:
    with pytest.raises(NonJsonValueError) as caught:
        snapshot_json(value)
    assert caught.value.path == path
    assert str(caught.value).startswith(f"{path}: ")


@pytest.mark.parametrize(
    ("keys", "expected"),
    [
        ([], "$"),
        (["items", 3, "x"], "$.items[3].x"),
        (["a b"], '$["a b"]'),
        (["", 0], '$[""][0]'),
        (["ü"], "$.ü"),
    ],
)
def test_json_path_spelling(keys: list[str | int], expected: str) -> None:
    assert json_path(keys) == expected


# --- detachment and immutability ------------------------------------------------------------------


def test_snapshot_is_detached_from_its_source() -> None:
    source: dict[str, Any] = {"a": [1, {"b": 2}], "c": "x"}
    snap = snapshot_json(source)
    source["a"][1]["b"] = 99
    source["a"].append(3)
    source["new"] = True
    assert thaw(snap) == {"a": [1, {"b": 2}], "c": "x"}


def test_frozen_dict_constructor_snapshots_its_input() -> None:
    inner = [1]
    frozen = FrozenDict({"a": inner}, b={"c": 2})
    inner.append(2)
    assert frozen == {"a": [1], "b": {"c": 2}}
    assert type(frozen["a"]) is tuple
    with pytest.raises(NonJsonValueError):
        FrozenDict({"a": math.nan})


@pytest.mark.parametrize(
    "mutate",
    [
        pytest.param(lambda d: d.__setitem__("a", 2), id="setitem"),
        pytest.param(lambda d: d.__delitem__("a"), id="delitem"),
        pytest.param(lambda d: d.__ior__({"b": 1}), id="ior"),
        pytest.param(lambda d: d.clear(), id="clear"),
        pytest.param(lambda d: d.pop("a"), id="pop"),
        pytest.param(lambda d: d.popitem(), id="popitem"),
        pytest.param(lambda d: d.setdefault("b", 1), id="setdefault"),
        pytest.param(lambda d: d.update(b=1), id="update"),
    ],
)
def test_frozen_dict_mutators_raise(mutate: Any) -> None:
    frozen = snapshot_json({"a": 1})
    with pytest.raises(TypeError, match="immutable"):
        mutate(frozen)
    assert frozen == {"a": 1}


def test_frozen_dict_in_place_or_operator_raises() -> None:
    frozen = snapshot_json({"a": 1})
    alias = frozen
    with pytest.raises(TypeError):
        alias |= {"b": 2}  # type: ignore[misc]
    assert frozen == {"a": 1}


def test_frozen_dict_or_returns_a_new_snapshot() -> None:
    frozen = snapshot_json({"a": 1})
    assert isinstance(frozen, FrozenDict)
    merged = frozen | {"b": [2]}
    assert type(merged) is FrozenDict
    assert merged == {"a": 1, "b": [2]}
    assert frozen == {"a": 1}


def test_frozen_dict_is_a_dict_for_json_dumps() -> None:
    frozen = snapshot_json({"a": [1, {"b": None}]})
    assert isinstance(frozen, dict)
    assert json.dumps(frozen) == '{"a": [1, {"b": null}]}'


def test_frozen_dict_copies_and_pickles() -> None:
    frozen = snapshot_json({"a": [1, {"b": 2}]})
    assert copy.copy(frozen) is frozen
    assert copy.deepcopy(frozen) is frozen
    restored = pickle.loads(pickle.dumps(frozen))
    assert type(restored) is FrozenDict
    assert restored == frozen


def test_thaw_gives_plain_mutable_containers() -> None:
    plain = thaw(snapshot_json({"a": [1, {"b": (2,)}]}))
    assert type(plain) is dict
    assert type(plain["a"]) is list
    assert type(plain["a"][1]) is dict
    assert type(plain["a"][1]["b"]) is list
    plain["a"].append(3)  # mutable


# --- equality and hashing -------------------------------------------------------------------------


def test_frozen_dict_equality_is_json_strict() -> None:
    assert snapshot_json({"a": True}) != snapshot_json({"a": 1})
    assert snapshot_json({"a": [1]}) != snapshot_json({"a": [True]})
    assert snapshot_json({"a": 1}) == snapshot_json({"a": 1.0})
    assert snapshot_json({"a": 1, "b": 2}) == snapshot_json({"b": 2, "a": 1})
    assert snapshot_json({"a": (1,)}) == {"a": [1]}
    assert operator.eq({"a": [1]}, snapshot_json({"a": (1,)}))  # a plain dict on the left
    assert snapshot_json({"a": "1"}) != {"a": 1}
    assert snapshot_json({}) != []


def test_frozen_dict_hash_agrees_with_equality() -> None:
    assert hash(snapshot_json({"a": 1, "b": [2]})) == hash(snapshot_json({"b": [2], "a": 1.0}))
    assert len({snapshot_json({"a": 1}), snapshot_json({"a": 1.0}), snapshot_json({"a": True})}) == 2


@pytest.mark.parametrize(
    ("left", "right", "equal"),
    [
        (1, 1.0, True),
        (True, 1, False),
        (0, False, False),
        ([1, 2], (1, 2), True),
        ({"a": [1]}, {"a": (1,)}, True),
        ({"a": 1}, {"a": 1, "b": 2}, False),
        ([1], [1, 2], False),
        ({}, [], False),
        (None, None, True),
        ("a", "a", True),
        ("1", 1, False),
    ],
)
def test_json_equal(left: object, right: object, equal: bool) -> None:
    assert json_equal(left, right) is equal
    assert json_equal(right, left) is equal


@given(json_values(), json_values())
def test_equal_frozen_dicts_hash_equally(left: Any, right: Any) -> None:
    a = snapshot_json({"v": left})
    b = snapshot_json({"v": right})
    assert (a == b) == json_equal(left, right)
    if a == b:
        assert hash(a) == hash(b)
    assert hash(a) == hash(snapshot_json({"v": left}))


@given(json_values())
def test_snapshot_round_trips_through_thaw(value: Any) -> None:
    snap = snapshot_json(value)
    assert strictly_equal(thaw(snap), value)
    assert json_equal(snap, value)


# --- deep values ----------------------------------------------------------------------------------


def test_deep_array_snapshot_thaw_equal() -> None:
    source = deep_array(DEEP)
    snap = snapshot_json(source)
    assert type(snap) is tuple
    plain = thaw(snap)
    assert type(plain) is list
    assert json_equal(snap, source)
    assert json_equal(plain, source)
    assert not json_equal(snap, deep_array(DEEP - 1))


def test_deep_object_snapshot_thaw_equal_hash() -> None:
    source = deep_object(DEEP)
    snap = snapshot_json(source)
    assert type(snap) is FrozenDict
    assert type(thaw(snap)) is dict
    assert snap == source
    other = snapshot_json(deep_object(DEEP))
    assert snap == other
    assert hash(snap) == hash(other)
    assert snap != snapshot_json(deep_object(DEEP - 1))


def test_deep_array_inside_frozen_dict_hashes() -> None:
    left = snapshot_json({"a": deep_array(DEEP)})
    right = snapshot_json({"a": deep_array(DEEP)})
    assert hash(left) == hash(right)
    assert left == right


def test_deep_cycle_is_found() -> None:
    source = deep_array(1000)
    innermost = source
    while innermost:
        innermost = innermost[0]
    innermost.append(source)
    with pytest.raises(NonJsonValueError, match="cycle"):
        snapshot_json(source)


def test_deep_refusal_at_the_bottom() -> None:
    source = deep_object(DEEP)
    innermost = source
    while innermost:
        innermost = innermost["k"]
    innermost["bad"] = math.nan
    with pytest.raises(NonJsonValueError) as caught:
        snapshot_json(source)
    assert caught.value.path == "$" + ".k" * DEEP + ".bad"


def test_a_deep_frozen_dict_prints_without_recursion_error() -> None:
    value: Any = {}
    for _ in range(50_000):
        value = {"a": value}
    text = repr(snapshot_json(value))
    assert text.startswith("FrozenDict({'a': FrozenDict(")
    assert text.count('"a"') + text.count("'a'") == 50_000
    assert repr(snapshot_json({"a": [1, True]})) == "FrozenDict({'a': (1, True)})"


@pytest.mark.parametrize(
    ("value", "levels"),
    [(1, 0), ("x", 0), ([], 1), ({"a": 1}, 1), ([[1]], 2), ({"a": [1, {"b": ()}]}, 4), ([1, [2, [3]], []], 3)],
)
def test_nests_deeper_than_counts_each_container_as_one_level(value: Any, levels: int) -> None:
    assert not nests_deeper_than(value, levels)
    if levels:
        assert nests_deeper_than(value, levels - 1)


def test_nests_deeper_than_measures_deep_values_without_recursion_error() -> None:
    assert nests_deeper_than(deep_array(DEEP), 198)
    frozen = snapshot_json(deep_object(DEEP))  # DEEP + 1 levels: the root and DEEP children
    assert nests_deeper_than(frozen, DEEP)
    assert not nests_deeper_than(frozen, DEEP + 1)
