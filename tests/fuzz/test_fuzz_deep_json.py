"""Fuzz target: deep JSON values through every stack-safe entry point.

Values with one spine up to a thousand containers deep (lists, dicts or
both, with siblings along the spine) go through ``snapshot_json``, ``thaw``,
``json_equal``, ``FrozenDict`` (equality, hash, repr, deepcopy, ``|``),
``json_text``, the codec, ``nests_deeper_than``, ``validate_json_schema_value``,
``ArgumentsText`` and whole ``execute()`` calls: none may raise
``RecursionError`` or lose anything. The default run keeps to
:data:`DEFAULT_DEPTHS` (just past the recursion limit; indented ``json_text``
costs quadratic time in the depth, so only values up to
:data:`INDENTED_DEPTH_CAP` deep are indented) so the time budget gets several
examples; the slow variants (``-m slow``) go to tens of thousands of
levels. A third target checks that ``FrozenDict`` equality and hash agree with ``json_equal``.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import trio
from conftest_reliability import *  # noqa: F403 - fixtures
from conftest_reliability import FIGURES
from fuzz_support import fuzz
from hypothesis import strategies as st

from dsh_core import (
    ArgumentsText,
    CancelSignal,
    FrozenDict,
    ToolExecutionInput,
    ToolRuntime,
    define_tool,
    json_equal,
    snapshot_json,
    thaw,
)
from dsh_core._json import json_text, nests_deeper_than
from dsh_core._jsoncodec import decode_json, encode_json
from dsh_core.schema import validate_json_schema_value

DEFAULT_DEPTHS = (1, 2, 30, 300, 999, 1001)
# Well past the interpreter's recursion limit, several times over.
# Indented text grows (and costs) quadratically in the depth: the default run
# indents values up to 300 deep, the slow run up to 2500 (12 MB of text).
INDENTED_DEPTH_CAP = 300
SLOW_INDENTED_DEPTH_CAP = 2500
SLOW_DEPTHS = (*DEFAULT_DEPTHS, 2500, 5000, 12000, 30000)

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**30), 10**30),
    st.floats(allow_nan=False, allow_infinity=False).filter(lambda f: not (f == 0 and str(f).startswith("-"))),
    st.text(max_size=4),
)


@st.composite
def deep_values(draw: Any, depths: tuple[int, ...] = DEFAULT_DEPTHS) -> tuple[Any, int]:
    """A value with one spine ``depth`` containers deep (mixed dict/list), random siblings along it."""
    depth = draw(st.sampled_from(depths))
    kinds = draw(st.sampled_from(["list", "dict", "mixed"]))
    leaf = draw(scalars)
    side_every = draw(st.sampled_from([0, 1, 7, 500]))
    side = draw(st.lists(scalars, max_size=3))
    keyname = draw(st.sampled_from(["k", "", "a.b", "é", "\ud800", "0"]))
    value: Any = leaf
    for level in range(depth):
        kind = kinds if kinds != "mixed" else ("list" if level % 3 else "dict")
        extra = side_every and level % side_every == 0
        if kind == "list":
            value = [*(side if extra else []), value]
        else:
            node: dict[str, Any] = {f"s{i}": s for i, s in enumerate(side)} if extra else {}
            node[keyname] = value
            value = node
    return value, depth


def _depth(value: Any) -> int:
    best = 0
    stack = [(value, 0)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, (dict, list, tuple)):
            level += 1
            best = max(best, level)
            stack.extend((child, level) for child in (node.values() if isinstance(node, dict) else node))
    return best


def stack_safe_target(drawn: tuple[tuple[Any, int], int], indented_depth_cap: int = INDENTED_DEPTH_CAP) -> None:
    (value, depth_drawn), probe = drawn
    snap = snapshot_json(value)
    assert json_equal(snap, value) and json_equal(value, snap)
    again = snapshot_json(thaw(snap))
    assert json_equal(again, snap)
    if isinstance(snap, FrozenDict):
        assert again == snap
        assert (again != snap) is False  # __ne__ walks the value too
        assert hash(again) == hash(snap)
        assert repr(snap).startswith("FrozenDict(")
        assert copy.deepcopy(snap) is snap
        merged = snap | {"zz": 1}
        assert merged["zz"] == 1
    text = json_text(snap)
    assert json_equal(decode_json(text), snap)
    assert json_equal(decode_json(encode_json(snap)), snap)
    if depth_drawn <= indented_depth_cap:
        assert json_equal(decode_json(json_text(snap, indent=2)), snap)
    assert nests_deeper_than(snap, probe) == (_depth(value) > probe)
    assert validate_json_schema_value({}, snap) == ()
    if isinstance(snap, FrozenDict):
        got = ArgumentsText(text).decode()
        assert json_equal(got, snap)


TOOL_PARAMS = {"x": {"type": "json", "required": True}}


def _runtime() -> ToolRuntime:
    runtime = ToolRuntime()

    async def body(args: Any, run: Any) -> Any:
        return {"echo": args["x"]}

    runtime.register(
        define_tool(
            name="echo",
            description="echo",
            parameters=TOOL_PARAMS,
            output={
                "type": "object",
                "additionalProperties": False,
                "properties": {"echo": {"type": "json", "required": True}},
            },
            execute=body,
        )
    )
    return runtime


def execute_target(drawn: tuple[tuple[Any, int], bool]) -> None:
    (value, _depth_drawn), as_text = drawn
    runtime = _runtime()
    arguments: Any = {"x": value}
    if as_text:
        arguments = ArgumentsText(json_text(snapshot_json(arguments)))

    async def main() -> Any:
        return await runtime.execute(
            ToolExecutionInput(call_id="c", name="echo", arguments=arguments, signal=CancelSignal())
        )

    result = trio.run(main)
    FIGURES.results += 1
    assert not result.is_error, result.error.message[:500]
    assert json_equal(result.value["echo"], value)
    assert result.content


tiny = st.recursive(
    st.sampled_from([0, 1, 1.0, True, False, None, "", "a", 10**20, 1e20, 2**53 + 1, float(2**53)]),
    lambda kids: st.one_of(st.lists(kids, max_size=2), st.dictionaries(st.sampled_from(["a", "b"]), kids, max_size=2)),
    max_leaves=5,
)


def frozen_eq_target(pair: tuple[Any, Any]) -> None:
    a, b = pair
    fa, fb = snapshot_json({"v": a}), snapshot_json({"v": b})
    eq = json_equal(a, b)
    assert (fa == fb) == eq and (fa != fb) == (not eq)
    assert ({"v": a} == fb) == eq  # reflected: FrozenDict's own __eq__
    if eq:
        assert hash(fa) == hash(fb), (a, b)
    # json_equal is the equality of the JSON texts' meaning
    assert eq == (json.loads(json_text(fa)) == json.loads(json_text(fb)) and _same_types(a, b)), (a, b)


def _same_types(a: Any, b: Any) -> bool:
    """Booleans never equal numbers (JSON), everything else as Python compares decoded JSON."""
    pending = [(a, b)]
    while pending:
        x, y = pending.pop()
        if isinstance(x, dict) and isinstance(y, dict):
            pending.extend((x[k], y[k]) for k in x if k in y)
        elif isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)):
            pending.extend(zip(x, y, strict=False))
        elif (type(x) is bool) != (type(y) is bool):
            return False
    return True


def test_fuzz_deep_values_are_stack_safe() -> None:
    assert fuzz(st.tuples(deep_values(), st.integers(0, 40000)), stack_safe_target) > 0


@pytest.mark.slow
def test_fuzz_very_deep_values_are_stack_safe() -> None:
    def target(drawn: tuple[tuple[Any, int], int]) -> None:
        stack_safe_target(drawn, SLOW_INDENTED_DEPTH_CAP)

    assert fuzz(st.tuples(deep_values(SLOW_DEPTHS), st.integers(0, 40000)), target) > 0


def test_fuzz_deep_arguments_through_execute() -> None:
    assert fuzz(st.tuples(deep_values(), st.booleans()), execute_target) > 0


@pytest.mark.slow
def test_fuzz_very_deep_arguments_through_execute() -> None:
    assert fuzz(st.tuples(deep_values(SLOW_DEPTHS), st.booleans()), execute_target) > 0


def test_fuzz_frozen_dict_equality_and_hash_agree_with_json_equal() -> None:
    assert fuzz(st.tuples(tiny, tiny), frozen_eq_target) > 0
