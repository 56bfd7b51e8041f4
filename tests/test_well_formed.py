"""Lone surrogates: found anywhere in a JSON value, and replaced so that UTF-8 can carry the text."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsh_core import well_formed_text
from dsh_core._well_formed import holds_lone_surrogate, well_formed_json

DEEP = 100_000

# Every code point, surrogates included (hypothesis leaves those out of text by default).
any_text = st.text(st.characters(exclude_categories=()))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a\ud800b", "a\ufffdb"),
        ("\udc00", "\ufffd"),
        ("\ud800\ud800", "\ufffd\ufffd"),
        ("x\ud83d\ude00y", "x\U0001f600y"),  # the halves of a pair, apart as two code points
        ("\ude00\ud83d", "\ufffd\ufffd"),  # the halves in the wrong order pair nothing
        ("caf\xe9 \U0001f600", "caf\xe9 \U0001f600"),
    ],
)
def test_well_formed_text_replaces_each_lone_surrogate_and_joins_split_pairs(text: str, expected: str) -> None:
    assert well_formed_text(text) == expected


def test_well_formed_text_returns_text_without_surrogates_as_it_is() -> None:
    text = "caf\xe9" * 10
    assert well_formed_text(text) is text


@given(any_text)
def test_well_formed_text_always_encodes_and_changes_only_what_does_not(text: str) -> None:
    result = well_formed_text(text)
    result.encode("utf-8")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        assert holds_lone_surrogate(text)
    else:
        assert result == text and not holds_lone_surrogate(text)


@pytest.mark.parametrize(
    "value",
    ["\ud800", ["ok", ("\udfff",)], {"k\udc80": 1}, {"a": [{"b": "x\ud800"}]}],
    ids=["string", "in-a-tuple", "in-a-key", "deep-inside"],
)
def test_holds_lone_surrogate_looks_everywhere(value: Any) -> None:
    assert holds_lone_surrogate(value)


@pytest.mark.parametrize("value", ["caf\xe9", ["\U0001f600", 1, None, True], {"k": {"v": 1.5}}, 7])
def test_holds_lone_surrogate_is_false_for_text(value: Any) -> None:
    assert not holds_lone_surrogate(value)


def test_well_formed_json_copies_with_keys_and_values_well_formed() -> None:
    shared = object()
    value = {"k\ud800": ["a\udc00b", ("t\udfff",), 1, None, shared], "plain": {"x": "y"}}
    result = well_formed_json(value)
    assert result == {"k\ufffd": ["a\ufffdb", ["t\ufffd"], 1, None, shared], "plain": {"x": "y"}}
    assert result["k\ufffd"][4] is shared
    assert value["k\ud800"][0] == "a\udc00b"  # the original is left as it was


def test_well_formed_json_of_a_scalar() -> None:
    assert well_formed_json("\ud800") == "\ufffd"
    assert well_formed_json(3) == 3


def test_well_formed_json_copies_deep_values_without_recursion_error() -> None:
    value: Any = "a\ud800"
    for _ in range(DEEP):
        value = {"k": [value]}
    result = well_formed_json(value)
    assert not holds_lone_surrogate(result)
    for _ in range(DEEP):
        result = result["k"][0]
    assert result == "a\ufffd"


@given(st.recursive(any_text | st.integers(), lambda inner: st.lists(inner) | st.dictionaries(any_text, inner)))
def test_well_formed_json_always_serialises_as_utf8(value: Any) -> None:
    result = well_formed_json(value)
    json.dumps(result, ensure_ascii=False).encode("utf-8")
    assert not holds_lone_surrogate(result)
