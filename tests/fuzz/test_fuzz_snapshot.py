"""Fuzz target: ``snapshot_json`` on arbitrary nested Python objects.

The only exception allowed is ``NonJsonValueError``, at exactly the path an
independent recursive model (``first_offender``) names. Accepted values come
back deeply immutable, equal to the input, and survive a ``json`` round trip.
"""

from __future__ import annotations

import json
import math
from typing import Any

from conftest_reliability import *  # noqa: F403 - fixtures
from corpus.oracle import Keys, dollar_path
from fuzz_support import anything, fuzz, with_cycles
from hypothesis import strategies as st

from dsh_core import FrozenDict, NonJsonValueError, json_equal, snapshot_json, thaw


def first_offender(value: Any) -> tuple[Keys, str] | None:
    """Where the first non-JSON part of ``value`` is, in walk order, and what it is."""

    def walk(node: Any, keys: Keys, ancestors: tuple[int, ...]) -> tuple[Keys, str] | None:
        kind = type(node)
        if node is None or kind in (str, int, bool):
            return None
        if kind is float:
            if math.isnan(node) or math.isinf(node):
                return keys, "not a finite JSON number"
            if node == 0 and math.copysign(1, node) < 0:
                return keys, "-0.0"
            return None
        if kind in (dict, list, tuple):
            if id(node) in ancestors:
                return keys, "cycle"
            inner = (*ancestors, id(node))
            items = node.items() if kind is dict else enumerate(node)
            for key, item in items:
                if kind is dict and type(key) is not str:
                    return keys, "object key"
                found = walk(item, (*keys, key), inner)
                if found is not None:
                    return found
            return None
        return keys, "not JSON"

    return walk(value, (), ())


def _immutable(value: Any) -> bool:
    pending = [value]
    while pending:
        node = pending.pop()
        if type(node) is FrozenDict:
            pending.extend(node.values())
        elif type(node) is tuple:
            pending.extend(node)
        elif not (node is None or type(node) in (str, int, bool, float)):
            return False
    return True


def snapshot_target(value: Any) -> None:
    expected = first_offender(value)
    try:
        snapshot = snapshot_json(value)
    except NonJsonValueError as exc:
        assert expected is not None, f"rejected a JSON value: {exc}"
        path = dollar_path(expected[0])
        assert exc.path == path, (exc.path, path)
        assert str(exc).startswith(f"{path}: ")
        assert expected[1] in str(exc) or expected[1] == "not JSON", (expected, str(exc))
        return
    assert expected is None, f"accepted a non-JSON value (expected a failure at {dollar_path(expected[0])})"
    assert _immutable(snapshot)
    assert json_equal(snapshot, value)
    assert snapshot_json(snapshot) == snapshot
    text = json.dumps(thaw(snapshot), allow_nan=False)
    assert json_equal(json.loads(text), snapshot)


def test_fuzz_snapshot_json() -> None:
    assert fuzz(with_cycles(anything), snapshot_target) > 0


def test_fuzz_snapshot_json_of_plain_json_never_fails() -> None:
    from fuzz_support import json_values

    assert fuzz(st.one_of(json_values, st.lists(json_values).map(tuple)), snapshot_target) > 0
