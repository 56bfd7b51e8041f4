"""Violation reports stay bounded however much the model's arguments (or a tool's output) get wrong.

A failure message goes back to the model and into logs: it must not grow with
the input (300 KB of arguments once made a 15 MB message), nor quote a key or a
path of megabytes whole. Small reports read exactly as before.
"""

from __future__ import annotations

from typing import Any

from dsh_core import ArgumentsText, ToolArgsError, define_tool, tool
from dsh_core._errors import (
    KEPT_VIOLATIONS,
    MESSAGE_VIOLATIONS,
    QUOTED_CHARS,
    VIOLATION_CHARS,
    ToolOutputError,
    Violations,
    elide_middle,
)
from dsh_core._schema._validate import validate_json_schema_value
from dsh_core.schema import RawSchema
from dsh_core.testing import expect_failure, make_input, make_runtime

EDIT = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"path": {"type": "string", "required": True}, "new": {"type": "string", "required": True}},
}


async def _done(args: Any) -> str:
    return "ok"


multi_edit = define_tool(
    name="multi_edit",
    description="Edit files.",
    parameters={"edits": {"type": "array", "required": True, "items": EDIT}},
    output={"type": "string"},
    execute=_done,
)


@tool
def anything(x: Any) -> str:
    """Takes anything."""
    return "ok"


def _missing(index: int) -> list[str]:
    return [f'missing required property "edits[{index}].{name}"' for name in ("path", "new")]


def test_elide_middle_keeps_both_ends_within_the_limit() -> None:
    assert elide_middle("abcdef", 6) == "abcdef"
    assert elide_middle("abcdefg", 6) == "ab…efg"
    assert len(elide_middle("x" * 10_000, 200)) == 200


async def test_a_report_of_a_few_violations_lists_them_all() -> None:
    edits = [{}] * (MESSAGE_VIOLATIONS // 2)
    failure = expect_failure(await make_runtime(multi_edit).execute(make_input("multi_edit", {"edits": edits})))
    expected = [violation for index in range(len(edits)) for violation in _missing(index)]
    assert len(expected) == MESSAGE_VIOLATIONS
    assert failure.error.message == "invalid arguments: " + "; ".join(expected)


async def test_past_the_first_twenty_violations_the_message_counts_the_rest() -> None:
    edits = [{}] * 10_000
    failure = expect_failure(await make_runtime(multi_edit).execute(make_input("multi_edit", {"edits": edits})))
    shown = [violation for index in range(10) for violation in _missing(index)]
    assert failure.code == "INVALID_ARGS"
    assert failure.error.message == "invalid arguments: " + "; ".join(shown) + "; … and 19980 more"


def test_a_report_keeps_the_first_hundred_and_counts_the_others() -> None:
    schema = {"type": "object", "additionalProperties": False, "properties": {}}
    report = validate_json_schema_value(schema, {f"k{index}": index for index in range(250)})
    assert isinstance(report, Violations)
    assert len(report) == KEPT_VIOLATIONS
    assert report.omitted == 150
    assert report[0] == '"value.k0" is not a declared property (additionalProperties: false)'
    assert report[-1] == '"value.k99" is not a declared property (additionalProperties: false)'
    error = ToolArgsError(report)
    assert (len(error.violations), error.omitted) == (KEPT_VIOLATIONS, 150)
    assert error.message.endswith(
        '"value.k19" is not a declared property (additionalProperties: false); … and 230 more'
    )


async def test_deep_paths_are_quoted_by_their_ends() -> None:
    depth, items = 3000, 3000
    schema: dict[str, Any] = {"type": "array", "items": {"type": "string"}}
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    deep = define_tool(
        name="deep",
        description="d",
        parameters=RawSchema({"type": "object", "properties": {"x": schema}, "required": ["x"]}),
        output={"type": "string"},
        execute=_done,
    )
    text = '{"x": ' + "[" * depth + "[" + ",".join(["0"] * items) + "]" + "]" * depth + "}"
    failure = expect_failure(await make_runtime(deep).execute(make_input("deep", ArgumentsText(text))))
    shown = [
        f'"{elide_middle("x" + "[0]" * depth + f"[{index}]", QUOTED_CHARS)}" must be a string' for index in range(20)
    ]
    assert failure.error.message == "invalid arguments: " + "; ".join(shown) + f"; … and {items - 20} more"


async def test_a_huge_undeclared_key_is_quoted_by_its_ends() -> None:
    big = "k" * 2_000_000
    failure = expect_failure(await make_runtime(anything).execute(make_input("anything", {"x": 1, big: 1})))
    assert failure.error.message == (
        f'invalid arguments: "{elide_middle(big, QUOTED_CHARS)}" is not a declared property (additionalProperties: false)'
    )


async def test_a_huge_repeated_key_is_quoted_by_its_ends() -> None:
    big = "k" * 2_000_000
    text = ArgumentsText(f'{{"x": 1, "{big}": 1, "{big}": 2}}')
    failure = expect_failure(await make_runtime(anything).execute(make_input("anything", text)))
    assert failure.code == "INVALID_ARGS"
    assert failure.error.message == (
        f'arguments give the key "{elide_middle(big, QUOTED_CHARS)}" twice in one object; send each key once'
    )


async def test_a_value_that_is_not_json_under_a_huge_key_is_placed_by_the_paths_ends() -> None:
    big = "k" * 2_000_000
    failure = expect_failure(await make_runtime(anything).execute(make_input("anything", {"x": {big: float("nan")}})))
    assert failure.code == "INVALID_ARGS"
    assert elide_middle(f"$.x.{big}", QUOTED_CHARS) + ": " in failure.error.message
    assert len(failure.error.message) < 2 * QUOTED_CHARS


def test_each_kept_violation_is_bounded_in_length() -> None:
    error = ToolArgsError(["a" * 5000, "b"])
    assert error.violations == (elide_middle("a" * 5000, VIOLATION_CHARS), "b")
    assert error.message == f"invalid arguments: {elide_middle('a' * 5000, VIOLATION_CHARS)}; b"


async def test_an_invalid_output_is_reported_within_the_same_bounds() -> None:
    @tool
    def numbers() -> list[int]:
        """Numbers."""
        return ["no"] * 500  # type: ignore[list-item]

    failure = expect_failure(await make_runtime(numbers).execute(make_input("numbers", {})))
    assert failure.code == "INVALID_TOOL_OUTPUT"
    shown = "; ".join(f'"value[{index}]" must be an integer' for index in range(20))
    assert failure.error.message == f'tool "numbers" returned invalid output: {shown}; … and 480 more'
    error = ToolOutputError("numbers", [f"v{index}" for index in range(150)])
    assert (len(error.violations), error.omitted) == (KEPT_VIOLATIONS, 50)


def test_bounded_listing_is_public_and_lists_the_first_items_then_counts_the_rest() -> None:
    # Plugin authors listing what a model or a server named use the rule error messages use.
    from dsh_core import bounded_listing

    assert bounded_listing(["a", "b"]) == "a; b"
    assert bounded_listing([]) == ""
    items = [f"item{n}" for n in range(MESSAGE_VIOLATIONS + 5)]
    assert bounded_listing(items, separator=", ") == ", ".join(items[:MESSAGE_VIOLATIONS]) + ", … and 5 more"
    assert bounded_listing(["a"], omitted=3) == "a; … and 3 more"
    assert bounded_listing(["x" * 50 + "END"], item_chars=21) == "x" * 10 + "…" + "x" * 7 + "END"
    assert bounded_listing(["y" * (VIOLATION_CHARS + 1)]) == elide_middle("y" * (VIOLATION_CHARS + 1), VIOLATION_CHARS)
