"""Scenario catalogue S294-S355 (py-types.spec): the Code Mode Python SDK text.

Most of the slice is covered by ``tests/test_code_mode_sdk.py``; these are the gaps. The port has
no context-free ``jsonSchemaToPy``, so type mappings are read off the SDK text ``render_python_sdk``
produces. Where the original follows JavaScript lexical rules (UTF-16 lengths, ECMAScript whitespace,
``JSON.stringify`` quoting) the expectations here use Python's own rules, as SPEC.md prescribes.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

import attrs
import pytest

# The SDK-fence helpers of the SDK tests, shared rather than copied.
from test_code_mode_sdk import block, run_block

from dsh_core.code_mode import render_python_sdk

STRING: dict[str, Any] = {"type": "string"}
PREAMBLE = "class ToolCallError(Exception):\n    tool_name: str\n\n"


@attrs.frozen
class Tool:
    """A tool as the SDK reads it (duck-typed), result schema on ``output_schema``."""

    name: str
    parameters: Any = attrs.field(factory=lambda: {"type": "object", "properties": {}})
    output_schema: Any = attrs.field(factory=lambda: dict(STRING))
    description: Any = ""


def closed(required: tuple[str, ...] = (), /, **properties: Any) -> dict[str, Any]:
    """A closed object schema with ``properties`` in declaration order."""
    schema: dict[str, Any] = {"type": "object", "additionalProperties": False, "properties": properties}
    if required:
        schema["required"] = list(required)
    return schema


def class_names(text: str) -> list[str]:
    return re.findall(r"^class (\S+)\(TypedDict\):$", text, re.MULTILINE)


def nested_arrays(depth: int, leaf: dict[str, Any]) -> dict[str, Any]:
    schema = leaf
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


def chain(depth: int, inner: str) -> str:
    return "list[" * depth + inner + "]" * depth


# ---------------------------------------------------------------------------
# Class naming


def test_tool_prefix_names_the_output_class_of_a_malformed_args_tool() -> None:
    """S302: `1st-tool` with a non-string parameter description and a closed output object."""
    parameters = closed(p={"type": "string", "description": 42})
    output = closed(("ok",), ok={"type": "boolean"})
    text = render_python_sdk([Tool("1st-tool", parameters, output)])
    assert block(text) == (
        f"from typing import Any, Protocol, TypedDict\n\n{PREAMBLE}"
        "class Tool1stToolOutput(TypedDict):\n    ok: bool\n\n"
        "class Tools(Protocol):\n"
        "    pass\n"
        '    # tools["1st-tool"](args: Any) -> Tool1stToolOutput\n\n'
        "tools: Tools"
    )


def test_enum_field_of_an_underscored_tool() -> None:
    """S304: `mode_tool` with a required enum field: ModeToolArgs, a Literal field, Literal imported."""
    parameters = closed(("mode",), mode={"type": "string", "enum": ["fast", "slow"]})
    text = render_python_sdk([Tool("mode_tool", parameters)])
    assert block(text) == (
        f"from typing import Literal, Protocol, TypedDict\n\n{PREAMBLE}"
        'class ModeToolArgs(TypedDict):\n    mode: Literal["fast", "slow"]\n\n'
        "class Tools(Protocol):\n"
        "    async def mode_tool(self, args: ModeToolArgs) -> str: ...\n\n"
        "tools: Tools"
    )


def test_astral_tool_names_are_capped_by_code_points() -> None:
    """S319: class names from 200-letter astral tool names are capped (Python: 120 code points, not UTF-16 units)."""
    gothic = "\U00010330"
    field = closed(("f",), f=STRING)
    text = render_python_sdk([Tool(gothic * 200, field), Tool("x" + gothic * 200, field)])
    capped, prefixed = gothic * 120, "X" + gothic * 119
    assert class_names(text) == [prefixed, capped]
    assert len(prefixed) == 120
    assert f"    async def {'x' + gothic * 200}(self, args: {prefixed}) -> str: ...\n" in text
    assert f"    async def {gothic * 200}(self, args: {capped}) -> str: ...\n" in text
    run_block(text)


def test_nfkc_composes_jamo_at_class_name_joins() -> None:
    """S321: a join whose L+V jamo compose is normalised; a join that composes nothing stays byte-identical."""
    inner = closed(("\u1161x",), **{"\u1161x": closed(q=STRING)})
    text = render_python_sdk([Tool("x", closed(("\uac00\u1100",), **{"\uac00\u1100": inner}))])
    assert block(text) == (
        f"from typing import NotRequired, Protocol, TypedDict\n\n{PREAMBLE}"
        "class XArgs\uac00\uac00x(TypedDict):\n    q: NotRequired[str]\n\n"
        "class XArgs\uac00\u1100(TypedDict):\n    \u1161x: XArgs\uac00\uac00x\n\n"
        "class XArgs(TypedDict):\n    \uac00\u1100: XArgs\uac00\u1100\n\n"
        "class Tools(Protocol):\n"
        "    async def x(self, args: XArgs) -> str: ...\n\n"
        "tools: Tools"
    )
    assert "\u1100\u1161" not in text
    run_block(text)


def test_case_mapping_of_the_first_letter_follows_the_unicode_tables() -> None:
    """S318: tool `ƛ` (U+019B) uppercases to U+A7DC from Unicode 16.0 on; older tables leave it as is."""
    unicode_16 = tuple(int(part) for part in unicodedata.unidata_version.split(".")) >= (16, 0, 0)
    expected = ("\ua7dc" if unicode_16 else "\u019b") + "Args"
    text = render_python_sdk([Tool("\u019b", closed(("f",), f=STRING))])
    assert class_names(text) == [expected]
    assert f"    async def \u019b(self, args: {expected}) -> str: ...\n" in text
    if unicode_16:
        assert "class \u019bArgs" not in text


def test_zwnj_is_a_tail_but_never_a_head() -> None:
    """S316: ZWNJ continues an identifier (Unicode >= 15.1) but cannot start one: `\\u200cb` stays a subscript."""
    field = {"type": "object", "properties": {"a\u200cb": STRING}}
    text = render_python_sdk([Tool("ping", field), Tool("\u200cb", field)])
    if "a\u200cb".isidentifier():  # Unicode 15.1 (Python >= 3.13)
        assert "    async def ping(self, args: PingArgs) -> str: ...\n" in text
        assert "class PingArgs(TypedDict):\n    a\u200cb: NotRequired[str]\n" in text
        assert "class Tool\u200cbArgs(TypedDict):\n    a\u200cb: NotRequired[str]\n" in text
        assert '    # tools["\\u200cb"](args: Tool\u200cbArgs) -> str\n' in text
    else:  # the field name is no identifier here: both objects degrade
        assert "    async def ping(self, args: dict[str, Any]) -> str: ...\n" in text
        assert '    # tools["\\u200cb"](args: dict[str, Any]) -> str\n' in text
        assert "TypedDict):" not in text
    assert "async def \u200cb" not in text
    run_block(text)


# ---------------------------------------------------------------------------
# Objects


def test_nfkc_unstable_field_degrades_the_argument_object() -> None:
    """S315: field `ﬁeld` would be folded to `field` by CPython, so the arguments degrade to dict[str, Any]."""
    text = render_python_sdk([Tool("ligature", closed(("\ufb01eld",), **{"\ufb01eld": STRING}))])
    assert "    async def ligature(self, args: dict[str, Any]) -> str: ...\n" in text
    assert "\ufb01eld:" not in text
    assert "field:" not in text
    assert "TypedDict):" not in text


def test_debug_field_degrades_the_argument_object() -> None:
    """S341: a `__debug__` field cannot be assigned by CPython: dict[str, Any], and the name appears nowhere."""
    text = render_python_sdk([Tool("debugger", closed(("__debug__",), **{"__debug__": STRING}))])
    assert "    async def debugger(self, args: dict[str, Any]) -> str: ...\n" in text
    assert "__debug__" not in text
    run_block(text)


def test_one_of_objects_on_the_argument_side() -> None:
    """S323: a oneOf of two closed objects as parameters declares XArgs1 and XArgs2."""
    parameters = {"oneOf": [closed(("a",), a=STRING), closed(("b",), b={"type": "integer"})]}
    text = render_python_sdk([Tool("x", parameters)])
    assert block(text) == (
        f"from typing import Protocol, TypedDict\n\n{PREAMBLE}"
        "class XArgs1(TypedDict):\n    a: str\n\n"
        "class XArgs2(TypedDict):\n    b: int\n\n"
        "class Tools(Protocol):\n"
        "    async def x(self, args: XArgs1 | XArgs2) -> str: ...\n\n"
        "tools: Tools"
    )


# ---------------------------------------------------------------------------
# Depth


def test_field_chain_just_under_the_cap_stays_exact() -> None:
    """S334: 179 nested arrays under a required field render exactly, around `str`."""
    text = render_python_sdk([Tool("deep_field", closed(("rows",), rows=nested_arrays(179, STRING)))])
    assert "    rows: " + chain(179, "str") + "\n" in text
    compile(block(text), "<sdk>", "exec")


def test_argument_annotation_cap_with_the_parameter_paren_open() -> None:
    """S335: array-rooted parameters: 180 lists stay exact, 181 degrade the item, unions inherit the depth."""
    const_x = {"type": "string", "const": "x"}
    worst = render_python_sdk([Tool("rooted", nested_arrays(180, const_x))])
    exact = chain(180, 'Literal["x"]')
    assert f"    async def rooted(self, args: {exact}) -> str: ...\n" in worst
    annotation = worst.split("async def rooted(self, args: ")[1].split(") -> str:")[0]
    assert annotation.count("[") == 181
    compile(block(worst), "<sdk>", "exec")

    deeper = render_python_sdk([Tool("rooted", nested_arrays(181, const_x))])
    assert f"    async def rooted(self, args: {chain(180, 'Any')}) -> str: ...\n" in deeper

    spine: dict[str, Any] = nested_arrays(180, const_x)
    for _ in range(3):
        spine = {"oneOf": [spine, dict(STRING)]}
    unions = render_python_sdk([Tool("rooted", spine)])
    # A repeated operand is written once (the original repeats it: ``| str | str | str``).
    assert f"    async def rooted(self, args: {exact} | str) -> str: ...\n" in unions
    compile(block(unions), "<sdk>", "exec")

    boxed_schema = {"type": "object", "properties": {"rows": nested_arrays(180, const_x)}, "required": ["rows"]}
    boxed = render_python_sdk([Tool("rooted", boxed_schema)])
    assert "    rows: " + chain(179, "Any") + "\n" in boxed


def test_hundred_thousand_deep_union_renders_without_recursion_and_compiles() -> None:
    """S336 (adapted): a 100 000-deep oneOf(chain | null) renders; the original writes `str | None | ... | None`
    (length 3 + 7 * depth), which CPython cannot compile: each operand is written once here."""
    depth = 100_000
    schema: dict[str, Any] = dict(STRING)
    for _ in range(depth):
        schema = {"oneOf": [schema, {"type": "null"}]}
    text = render_python_sdk([Tool("t", output_schema=schema)])
    match = re.search(r"^    async def t\(self, args: dict\[str, Any\]\) -> (.*): \.\.\.$", text, re.MULTILINE)
    assert match is not None
    assert match.group(1) == "str | None"
    compile(block(text), "<sdk>", "exec")


def test_sixty_thousand_deep_union_of_objects_keeps_class_names_bounded() -> None:
    """S337: a 60 000-level oneOf chain of closed empty objects under field `root`: names stay <= 140 chars."""
    depth = 60_000
    empty = {"type": "object", "additionalProperties": False, "properties": {}}
    schema: dict[str, Any] = dict(empty)
    for _ in range(depth):
        schema = {"oneOf": [schema, dict(empty)]}
    text = render_python_sdk([Tool("deep", closed(("root",), root=schema))])
    names = class_names(text)
    # 60 001 distinct operands would not compile as one chain: the union is Any.
    assert names == ["DeepArgs"]
    assert "    root: Any\n" in text
    assert "class Tools(Protocol):\n    async def deep(self, args: DeepArgs) -> str: ...\n" in text
    compile(block(text), "<sdk>", "exec")


# ---------------------------------------------------------------------------
# Descriptions


def test_whitespace_only_descriptions_render_like_empty_ones() -> None:
    """S331: blank descriptions are absent: the text is byte-identical to the undescribed one."""
    undescribed = render_python_sdk([Tool("plain"), Tool("weird-name")])
    blank = render_python_sdk([Tool("plain", description=" \t\n "), Tool("weird-name", description="   ")])
    assert blank == undescribed
    assert "    async def plain(self, args: dict[str, Any]) -> str: ...\n" in undescribed
    assert '    # tools["weird-name"](args: dict[str, Any]) -> str\n' in undescribed
    assert '"""' not in undescribed
    assert not [line for line in undescribed.splitlines() if line.startswith("    #   ")]


@pytest.mark.parametrize(
    ("description", "collapsed"),
    [
        ("before\x00after", "before\\x00after"),
        ("bell\x07esc\x1bdel\x7f", "bell\\x07esc\\x1bdel\\x7f"),
        ("tab\tnewline\ncr\r", "tab newline cr"),
        ("c1 \x9b\x9c\x9f end", "c1 \\x9b\\x9c\\x9f end"),
        ("nb\xa0sp", "nb sp"),
        ("zero\u200bwidth", "zero\u200bwidth"),
        # SPEC: Python's whitespace set applies, and it includes NEL (the original escapes it as \x85).
        ("a\x85b", "a b"),
    ],
)
def test_control_characters_in_descriptions(description: str, collapsed: str) -> None:
    """S345: controls are escaped as \\xNN (docstring doubles the backslash), whitespace runs collapse."""
    text = render_python_sdk([Tool("t", description=description), Tool("t-c", description=description)])
    docstring = '"""' + collapsed.replace("\\", "\\\\") + '"""'
    assert f"    async def t(self, args: dict[str, Any]) -> str:\n        {docstring}\n" in text
    assert f'    # tools["t-c"](args: dict[str, Any]) -> str\n    #   {collapsed}\n' in text
    assert not [char for char in text if unicodedata.category(char) == "Cc" and char != "\n"]
    assert run_block(text)["Tools"].t.__doc__ == collapsed


def test_description_of_only_nel_is_absent() -> None:
    """S345: ` \\x85 ` is whitespace only under Python's rules (SPEC), so no docstring and no comment line."""
    text = render_python_sdk([Tool("t", description=" \x85 "), Tool("t-c", description=" \x85 ")])
    assert block(text).endswith(
        "class Tools(Protocol):\n"
        "    async def t(self, args: dict[str, Any]) -> str: ...\n"
        '    # tools["t-c"](args: dict[str, Any]) -> str\n\n'
        "tools: Tools"
    )
