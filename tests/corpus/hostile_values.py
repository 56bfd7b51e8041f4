"""Hand-written cases whose inputs JSON cannot spell: non-JSON Python values.

``NON_JSON`` and ``NON_STR_KEYS`` are the palettes ``generated.py`` places at
every position of the nested schema; ``CASES`` are the hand-written calls and
snapshots around them (roots, cycles, shared sub-values, frozen inputs).

``bool`` subclasses are missing on purpose: CPython refuses to subclass
``bool`` (``TypeError: type 'bool' is not an acceptable base type``), so no
such value can reach the runtime.
"""

from __future__ import annotations

import collections
import datetime
import decimal
import enum
import fractions
import http
from collections.abc import Callable
from typing import Any, NamedTuple

from dsh_core import FrozenDict

from . import CallCase, SnapshotCase, const
from .oracle import quoted

__all__ = ["CASES", "NON_JSON", "NON_STR_KEYS", "args_failure", "qualified"]

PREFIX = "tool execution arguments must be losslessly JSON-serializable: "


class Opaque:
    """A plain object with a stable repr (so messages that show a key are deterministic)."""

    def __repr__(self) -> str:
        return "<Opaque>"

    def __hash__(self) -> int:
        return 7


class Touchy:
    """An object that explodes when compared or printed: only its type may be looked at."""

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("Touchy.__eq__ called")

    def __hash__(self) -> int:
        return 11

    def __repr__(self) -> str:
        raise RuntimeError("Touchy.__repr__ called")

    def __str__(self) -> str:
        raise RuntimeError("Touchy.__str__ called")


class IntSub(int):
    pass


class StrSub(str):
    pass


class FloatSub(float):
    pass


class DictSub(dict):  # type: ignore[type-arg]
    pass


class ListSub(list):  # type: ignore[type-arg]
    pass


class Color(enum.StrEnum):
    RED = "red"


class Point(NamedTuple):
    x: int


def qualified(kind: type) -> str:
    """How dsh_core names a non-builtin type in messages (``module.QualName``)."""
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def _generator() -> Any:
    yield 1


def _function() -> None:
    return None


# (id, builder, the problem text after "<path>: ")
NON_JSON: list[tuple[str, Callable[[], object], str]] = [
    ("nan", lambda: float("nan"), "nan is not a finite JSON number"),
    ("inf", lambda: float("inf"), "inf is not a finite JSON number"),
    ("neg_inf", lambda: float("-inf"), "-inf is not a finite JSON number"),
    ("neg_zero", lambda: -0.0, "-0.0 has no lossless JSON form"),
    ("bytes", lambda: b"x", "bytes are not JSON (decode them to str first)"),
    ("bytearray", lambda: bytearray(b"x"), "bytes are not JSON (decode them to str first)"),
    ("memoryview", lambda: memoryview(b"x"), "bytes are not JSON (decode them to str first)"),
    ("set", lambda: {1}, "sets are not JSON (use a list)"),
    ("frozenset", lambda: frozenset({"a"}), "sets are not JSON (use a list)"),
    ("object", Opaque, f"{qualified(Opaque)} is not a JSON value"),
    ("touchy", Touchy, f"{qualified(Touchy)} is not a JSON value"),
    ("int_sub", lambda: IntSub(1), f"subclass {qualified(IntSub)} of int is not JSON"),
    ("int_enum", lambda: http.HTTPStatus.OK, "subclass http.HTTPStatus of int is not JSON"),
    ("str_sub", lambda: StrSub("s"), f"subclass {qualified(StrSub)} of str is not JSON"),
    ("str_enum", lambda: Color.RED, f"subclass {qualified(Color)} of str is not JSON"),
    ("float_sub", lambda: FloatSub(1.5), f"subclass {qualified(FloatSub)} of float is not JSON"),
    ("complex", lambda: complex(1, 2), "complex is not a JSON value"),
    ("decimal", lambda: decimal.Decimal("1.5"), "decimal.Decimal is not a JSON value"),
    ("fraction", lambda: fractions.Fraction(1, 3), "fractions.Fraction is not a JSON value"),
    ("datetime", lambda: datetime.datetime(2020, 1, 1), "datetime.datetime is not a JSON value"),
    ("ordered_dict", collections.OrderedDict, "collections.OrderedDict is not a JSON value"),
    ("defaultdict", lambda: collections.defaultdict(int), "collections.defaultdict is not a JSON value"),
    ("dict_sub", DictSub, f"{qualified(DictSub)} is not a JSON value"),
    ("list_sub", ListSub, f"{qualified(ListSub)} is not a JSON value"),
    ("namedtuple", lambda: Point(1), f"{qualified(Point)} is not a JSON value"),
    ("range", lambda: range(3), "range is not a JSON value"),
    ("function", lambda: _function, "function is not a JSON value"),
    ("type", lambda: int, "type is not a JSON value"),
    ("ellipsis", lambda: ..., "ellipsis is not a JSON value"),
    ("generator", _generator, "generator is not a JSON value"),
]

# (id, key) for a one-entry object {key: 1}; the failure names the object's own path.
NON_STR_KEYS: list[tuple[str, object]] = [
    ("int", 1),
    ("float", 1.5),
    ("none", None),
    ("bool", True),
    ("tuple", (1, "a")),
    ("bytes", b"k"),
    ("frozenset", frozenset()),
    ("str_sub", StrSub("k")),
    ("object", Opaque()),
]


def args_failure(path: str, problem: str) -> str:
    """The failure message of a call whose arguments are not lossless JSON."""
    return f"{PREFIX}{quoted(path)}: {problem}"


def _self_list() -> list[Any]:
    box: list[Any] = []
    box.append(box)
    return box


def _self_dict() -> dict[str, Any]:
    box: dict[str, Any] = {}
    box["me"] = box
    return box


def _mutual() -> dict[str, Any]:
    a: dict[str, Any] = {}
    b: dict[str, Any] = {"a": a}
    a["b"] = [1, b]
    return {"root": a}


def _shared() -> dict[str, Any]:
    # The same list twice is a DAG, not a cycle: it is copied twice.
    shared = [1, 2]
    return {"x": shared, "y": [shared, {"z": shared}]}


def _bad(id: str, arguments: Callable[[], object], path: str, problem: str) -> CallCase:
    return CallCase(
        id=id,
        tool="echo",
        build=arguments,
        code="INVALID_ARGS",
        name="NonJsonValueError",
        message=args_failure(path, problem),
    )


CASES: list[CallCase | SnapshotCase] = [
    # Non-JSON values as the whole arguments.
    *(_bad(f"root-{id}", build, "$", problem) for id, build, problem in NON_JSON),
    # Cycles and shared sub-values.
    _bad("cycle-self-list", lambda: {"x": _self_list()}, "$.x[0]", "cycle: the value contains itself"),
    _bad("cycle-self-dict", lambda: {"x": _self_dict()}, "$.x.me", "cycle: the value contains itself"),
    _bad("cycle-root", _self_dict, "$.me", "cycle: the value contains itself"),
    _bad("cycle-mutual", _mutual, "$.root.b[1].a", "cycle: the value contains itself"),
    CallCase(id="shared-subvalue-is-not-a-cycle", tool="echo", build=_shared, value=_shared),
    # The first offender in walk order is the one reported (keys in insertion order).
    _bad(
        "first-offender-wins",
        lambda: {"a": [1, {"b": float("nan")}], "c": b"x"},
        "$.a[1].b",
        "nan is not a finite JSON number",
    ),
    _bad("key-checked-before-value", lambda: {"a": {1: float("nan")}}, "$.a", "object key 1 is not a str"),
    _bad(
        "odd-key-is-quoted-in-path",
        lambda: {"a b": {"x-y": [{"\u202e": float("inf")}]}},
        '$["a b"]["x-y"][0]["\u202e"]',
        "inf is not a finite JSON number",
    ),
    _bad("digit-key-is-quoted", lambda: {"0": {"1x": -0.0}}, '$["0"]["1x"]', "-0.0 has no lossless JSON form"),
    # Already-frozen inputs are accepted as they are.
    CallCase(
        id="frozen-dict-input",
        tool="echo",
        build=lambda: FrozenDict({"a": [1, {"b": None}]}),
        value=const({"a": [1, {"b": None}]}),
    ),
    CallCase(id="tuple-arrays-accepted", tool="echo", build=const({"a": (1, (2, 3))}), value=const({"a": [1, [2, 3]]})),
    # Exact floats that are JSON: kept bit for bit.
    CallCase(
        id="float-extremes",
        tool="echo",
        build=const({"v": [5e-324, 1.7976931348623157e308, 0.0, -1.5, 2**53 + 1]}),
        value=const({"v": [5e-324, 1.7976931348623157e308, 0.0, -1.5, 2**53 + 1]}),
    ),
    # snapshot_json on its own, at the root.
    *(
        SnapshotCase(id=f"snapshot-root-{id}", build=build, path="$", problem=problem)
        for id, build, problem in NON_JSON
    ),
    *(
        SnapshotCase(
            id=f"snapshot-key-{id}",
            build=(lambda key=key: {key: 1}),
            path="$",
            problem=f"object key {key!r} is not a str",
        )
        for id, key in NON_STR_KEYS
    ),
    SnapshotCase(id="snapshot-plain-json", build=const({"a": [1, 2.5, "x", None, True, {"b": []}]})),
    SnapshotCase(
        id="snapshot-nested-cycle",
        build=lambda: [[_self_list()]],
        path="$[0][0][0]",
        problem="cycle: the value contains itself",
    ),
]
