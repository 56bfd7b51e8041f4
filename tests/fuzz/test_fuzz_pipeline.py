"""Fuzz target: whole calls through ``ToolRuntime.execute`` with generated arguments.

Arguments are the corpus' valid ``nested`` document with random positions
replaced by random JSON or hostile values. Every call must return one
structured result: a success echoing the arguments exactly when the corpus
oracle finds no violation, ``INVALID_ARGS`` with exactly the oracle's
messages otherwise, and ``INVALID_ARGS`` naming the first non-JSON path when
the arguments are not lossless JSON.
"""

from __future__ import annotations

import copy
from typing import Any

import trio
from conftest_reliability import *  # noqa: F403 - fixtures
from conftest_reliability import FIGURES
from corpus.oracle import arguments_message, expected_violations
from corpus.tools import NESTED_VALID, build_runtime, nested_schema
from fuzz_support import anything, fuzz, json_values, with_cycles
from hypothesis import strategies as st
from test_fuzz_snapshot import dollar_path, first_offender

from dsh_core import ToolExecutionFailure, ToolExecutionInput, ToolExecutionSuccess, json_equal, snapshot_json, thaw
from dsh_core.testing import make_input

RUNTIME = build_runtime()


def _positions(value: Any, keys: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    found = [keys]
    if type(value) is dict:
        for key, item in value.items():
            found += _positions(item, (*keys, key))
    elif type(value) is list:
        for index, item in enumerate(value):
            found += _positions(item, (*keys, index))
    return found


POSITIONS = _positions(NESTED_VALID)


@st.composite
def arguments(draw: Any) -> Any:
    document: Any = copy.deepcopy(NESTED_VALID)
    for _ in range(draw(st.integers(0, 4))):
        keys = draw(st.sampled_from(POSITIONS))
        replacement = draw(st.one_of(json_values, json_values, with_cycles(anything)))
        if not keys:
            document = replacement
            continue
        try:
            parent = document
            for key in keys[:-1]:
                parent = parent[key]
            parent[keys[-1]] = replacement
        except (KeyError, IndexError, TypeError):
            continue  # an earlier replacement removed this position
    if draw(st.booleans()) and type(document) is dict:
        document[draw(st.sampled_from(["zz", "config", "\ud800"]))] = draw(json_values)
    return document


def call_target(document: Any) -> None:
    async def main() -> Any:
        signal = make_input("nested").signal
        return await RUNTIME.execute(
            ToolExecutionInput(call_id="fuzz", name="nested", arguments=document, signal=signal)
        )

    offender = first_offender(document)
    result = trio.run(main)
    FIGURES.results += 1
    if offender is not None:
        assert isinstance(result, ToolExecutionFailure) and result.error.info is not None
        assert result.error.info.code == "INVALID_ARGS"
        assert result.error.message.startswith(
            f"tool execution arguments must be losslessly JSON-serializable: {dollar_path(offender[0])}: "
        ), result.error.message
        return
    # The oracle speaks plain JSON (lists, not the tuples snapshot_json also accepts as arrays).
    violations = expected_violations(nested_schema(), thaw(snapshot_json(document)))
    if not violations:
        assert isinstance(result, ToolExecutionSuccess), result.error
        assert json_equal(result.value, document)
    else:
        assert isinstance(result, ToolExecutionFailure) and result.error.info is not None
        assert result.error.info.code == "INVALID_ARGS"
        assert result.error.message == arguments_message(violations)


def test_fuzz_execute_arguments() -> None:
    assert fuzz(arguments(), call_target) > 0
