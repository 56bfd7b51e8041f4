"""Fuzz target: ``ArgumentsText`` on model-like texts, whole, cut short, or garbled.

Texts are JSON documents serialised the way providers do, then either kept,
cut at a random point (what a token limit does), or given a random edit. For
every text the runtime must return one structured result, never raise: a
success whose value is exactly what ``json.loads`` reads when the text parses
to an object with each key once, ``INVALID_ARGS`` otherwise (a key sent twice
is refused, not resolved the way ``json.loads`` does); and a strict prefix of a document
that does not parse must be called cut off, since that is what tells the model
to send a smaller call instead of the same one.
"""

from __future__ import annotations

import json
import math
from typing import Any

import trio
from conftest_reliability import *  # noqa: F403 - fixtures
from conftest_reliability import FIGURES
from fuzz_support import fuzz, json_values
from hypothesis import strategies as st

from dsh_core import ArgumentsText, ToolExecutionFailure, ToolExecutionSuccess, json_equal
from dsh_core.testing import json_tool, make_input, make_runtime

RUNTIME = make_runtime(json_tool("open"))


def _finite(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value) and not (value == 0 and math.copysign(1, value) < 0)
    if isinstance(value, dict):
        return all(_finite(item) for item in value.values())
    if isinstance(value, list):
        return all(_finite(item) for item in value)
    return True


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError("a key sent twice")  # the runtime refuses it: no reading is safe to guess
    return dict(pairs)


documents = st.dictionaries(st.text(max_size=6), json_values, max_size=4).filter(_finite)


@st.composite
def model_texts(draw: Any) -> tuple[str, bool]:
    """A text and whether it is a strict prefix of a valid document (a cut-off call)."""
    text = json.dumps(draw(documents), ensure_ascii=draw(st.booleans()), indent=draw(st.sampled_from([None, 2])))
    how = draw(st.sampled_from(["whole", "cut", "cut", "edit"]))
    if how == "cut" and len(text) > 1:
        return text[: draw(st.integers(1, len(text) - 1))], True
    if how == "edit":
        at = draw(st.integers(0, len(text)))
        return text[:at] + draw(st.text(max_size=3)) + text[at + 1 :], False
    return text, False


def call_target(case: tuple[str, bool]) -> None:
    text, cut = case

    async def main() -> Any:
        return await RUNTIME.execute(make_input("open", ArgumentsText(text)))

    result = trio.run(main)
    FIGURES.results += 1
    try:
        expected = json.loads(text, object_pairs_hook=_unique_keys) if text.strip() else {}
    except ValueError:
        expected = None
    if isinstance(expected, dict) and _finite(expected):
        assert isinstance(result, ToolExecutionSuccess), result
        assert json_equal(result.value, expected)
        return
    assert isinstance(result, ToolExecutionFailure) and result.error.info is not None
    assert result.error.info.code == "INVALID_ARGS"
    if cut and expected is None:
        assert "cut off" in result.error.message, (text, result.error.message)


def test_fuzz_arguments_text() -> None:
    assert fuzz(model_texts(), call_target) > 0
