"""The Code Mode Python SDK text: golden files, validity, determinism and the schema-to-type mapping.

Regenerate the golden files with ``DSH_UPDATE_GOLDEN=1 pytest tests/test_code_mode_sdk.py``
and review the diff by eye before committing it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dsh_core.code_mode import (
    RUN_CODE_DESCRIPTION,
    RUN_CODE_NAME,
    _sdk,
    render_python_sdk,
    run_code_output_spec,
    run_code_parameters_spec,
)

GOLDEN = Path(__file__).parent / "golden"


@attrs.frozen
class Tool:
    """A tool as the SDK reads it, with the result schema on ``output_schema``."""

    name: str
    parameters: Any = attrs.field(factory=lambda: {"type": "object", "properties": {}})
    output_schema: Any = attrs.field(factory=lambda: {"type": "string"})
    description: Any = ""


@attrs.frozen
class Output:
    schema: Any


@attrs.frozen
class Definition:
    """A tool shaped like a ToolDefinition: the result schema on ``output.schema``."""

    name: str
    parameters: Any
    output: Output
    description: str = ""


def obj(required: tuple[str, ...] = (), /, **properties: Any) -> dict[str, Any]:
    """A closed object schema."""
    schema: dict[str, Any] = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        schema["required"] = list(required)
    return schema


def open_obj(required: tuple[str, ...] = (), /, **properties: Any) -> dict[str, Any]:
    """An open object schema (``additionalProperties`` absent)."""
    schema = obj(required, **properties)
    del schema["additionalProperties"]
    return schema


STRING = {"type": "string"}


def block(text: str) -> str:
    """The Python code inside the SDK's fence."""
    match = re.search(r"```python\n(.*)\n```\Z", text, re.DOTALL)
    assert match is not None, text
    return match.group(1)


def run_block(text: str) -> dict[str, Any]:
    namespace: dict[str, Any] = {}
    # dont_inherit: this module's ``from __future__ import annotations`` must not leak in.
    exec(compile(block(text), "<sdk>", "exec", dont_inherit=True), namespace)
    return namespace


def output_annotation(schema: object) -> str:
    """The return annotation a lone tool ``t`` gets for ``schema``."""
    text = render_python_sdk([Tool("t", output_schema=schema)])
    match = re.search(r"    async def t\(self, args: [^\n]*\) -> (.*): \.\.\.$", text, re.MULTILINE)
    assert match is not None, text
    return match.group(1)


# ---------------------------------------------------------------------------
# Golden tool sets

TOOL_SETS: dict[str, list[Any]] = {
    "empty": [],
    "basic": [
        Tool(
            "bash",
            obj(("command",), command={"type": "string", "description": "The command line."}),
            description="Run a shell command.",
        ),
        Tool("my-mcp.tool", {"type": "object"}, description="Exotic name."),
        Tool("class", obj(("value",), value=STRING), description="A keyword."),
        Tool(
            "search",
            open_obj(
                ("query",),
                query={"type": "string", "description": "What to search for."},
                limit={"type": "number", "description": "Max results."},
                mode={"type": "string", "enum": ["fast", "slow"]},
                match=STRING,
                type=STRING,
            ),
            output_schema={"type": "array", "items": obj(("path",), path=STRING, line={"type": "integer"})},
            description="Search files.\n\n  Returns   matches.",
        ),
        Definition(
            "workflow",
            obj(
                ("meta",),
                meta=obj(
                    ("name",),
                    name=STRING,
                    phases={"type": "array", "items": obj(("title",), title=STRING)},
                ),
                open=open_obj(("x",), x=STRING),
                closedEmpty={"type": "object", "additionalProperties": False},
                anything={"description": "Any JSON value."},
                opts={"type": "object"},
            ),
            Output(
                {
                    "oneOf": [
                        obj(("ok",), ok={"type": "boolean", "const": True}),
                        obj(("ok", "error"), ok={"type": "boolean", "const": False}, error=STRING),
                        {"type": "null"},
                    ]
                }
            ),
            description='Run a workflow; ends in a quote"',
        ),
        Tool("no_output", output_schema=None),
    ],
    "names": [
        Tool("my-tool", obj(x=STRING)),
        Tool("my.tool", obj(y=STRING)),
        Tool("1st-tool", {"type": "object", "properties": {"p": {"type": "string", "description": 42}}}),
        Tool("_private", obj(x=STRING), description="Underscore."),
        Tool("__meta__", obj(__meta__=STRING)),
        Tool("match", obj(case=STRING)),
        Tool("搜索", obj(("路径",), 路径=STRING, opts=obj(深度={"type": "number"}))),
        Tool("ﬁnd", obj(x=STRING)),
        Tool("\u0301abc", obj(x=STRING)),
        Tool("foo", obj(phase=obj(a=STRING), phase2=obj(b=STRING), Phase=obj(c=STRING))),
        Tool("weird_fields", obj(**{"a-b": STRING})),
        Tool("mangler", obj(__token=STRING)),
        Tool("x_" + "a" * 200, obj(deep=obj(deeper=obj(deepest=STRING)))),
    ],
    "literals": [
        Tool(
            "literals",
            obj(
                quoted={"type": "string", "const": 'say "hi"\n'},
                backslash={"type": "string", "const": "ends\\"},
                control={"type": "string", "enum": ["a\x00b", "a\ud800b", "a\u2028b", "a\x85b", "tab\t"]},
                big={"type": "integer", "enum": [2**60, -(2**60), 9007199254740991]},
                floats={"type": "number", "enum": [1.5, 1e-7, 1e21, 100.0]},
                flags={"type": "boolean", "enum": [False]},
                nothing={"type": "null", "const": None},
            ),
            output_schema={"type": "string", "const": "fixed"},
            description="Controls: bell\x07 nul\x00 del\x7f nel\x85 surrogate\ud800 zero\u200bwidth; backslash \\",
        ),
    ],
}


@pytest.mark.parametrize("name", sorted(TOOL_SETS))
def test_golden_text(name: str) -> None:
    text = render_python_sdk(TOOL_SETS[name])
    path = GOLDEN / f"code_mode_sdk_{name}.md"
    if os.environ.get("DSH_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8", newline="")
    assert text == path.read_text(encoding="utf-8")


@pytest.mark.parametrize("name", sorted(TOOL_SETS))
def test_sdk_block_compiles_and_runs(name: str) -> None:
    namespace = run_block(render_python_sdk(TOOL_SETS[name]))
    assert isinstance(namespace["Tools"], type)
    assert issubclass(namespace["ToolCallError"], Exception)
    assert namespace["__annotations__"] == {"tools": namespace["Tools"]}


@given(st.permutations(TOOL_SETS["basic"] + TOOL_SETS["names"]))
def test_input_order_does_not_change_the_text(tools: list[Any]) -> None:
    assert render_python_sdk(tools) == render_python_sdk(TOOL_SETS["basic"] + TOOL_SETS["names"])


def test_duplicate_names_render_independently_of_order() -> None:
    first, second = Tool("dup", description="first"), Tool("dup", description="second")
    assert render_python_sdk([first, second]) == render_python_sdk([second, first])


def test_any_iterable_is_accepted() -> None:
    tools = TOOL_SETS["basic"]

    def generate() -> Iterator[Any]:
        yield from tools

    assert render_python_sdk(generate()) == render_python_sdk(tools)


def test_instructions_name_the_contract() -> None:
    text = render_python_sdk([])
    assert text.startswith("## Writing code for run_code\n")
    for phrase in (
        "two required arguments",
        "`code`",
        "`description`",
        "top-level `await`",
        "exactly two of the names declared below are bound: `tools` and `ToolCallError`",
        "never `FooArgs(field=1)`, which raises `NameError`",
        'await tools["my-tool"](args)',
        "`tool_name`",
        "MAY overlap under `asyncio.gather`",
        # A timed-out call ran on and held later calls back, undocumented (s20 Code Mode audit).
        "is cancelled on the host too",
        "what it already did stays done",
        "lossless JSON",
        "`print(...)`",
        "`return <value>`",
    ):
        assert phrase in text
    assert "The available tools:\n\n```python\n" in text
    assert text.endswith("\n\ntools: Tools\n```")


def test_empty_tool_set() -> None:
    assert block(render_python_sdk([])) == (
        "from typing import Protocol\n\n"
        "class ToolCallError(Exception):\n    tool_name: str\n\n"
        "class Tools(Protocol):\n    pass\n\n"
        "tools: Tools"
    )


# ---------------------------------------------------------------------------
# Members


def test_identifier_tools_are_methods_with_docstrings() -> None:
    text = render_python_sdk([Tool("bash", obj(("command",), command=STRING), description="Run a shell command.")])
    assert '    async def bash(self, args: BashArgs) -> str:\n        """Run a shell command."""\n' in text
    assert run_block(text)["Tools"].bash.__doc__ == "Run a shell command."


@pytest.mark.parametrize(
    "name", ["my-mcp.tool", "class", "None", "__debug__", "_foo", "__meta__", "__token", "a\ud800b"]
)
def test_other_names_are_subscript_comments(name: str) -> None:
    text = render_python_sdk([Tool(name, description="Exotic.")])
    quoted = name.replace("\ud800", "\\ud800")
    assert f'    # tools["{quoted}"](args: dict[str, Any]) -> str\n    #   Exotic.\n' in text
    assert "async def" not in text
    # Comments are not statements: the class body still needs one.
    assert "class Tools(Protocol):\n    pass\n" in text
    run_block(text)


def test_soft_keywords_are_ordinary_names() -> None:
    text = render_python_sdk([Tool("match", obj(("case",), case=STRING, type=STRING, _=STRING))])
    assert "    async def match(self, args: MatchArgs) -> str: ..." in text
    assert "    case: str\n    type: NotRequired[str]\n    _: NotRequired[str]\n" in text


def test_members_are_one_stream_in_name_order() -> None:
    text = render_python_sdk([Tool("z"), Tool("a-tool"), Tool("b")])
    lines = [line for line in text.splitlines() if line.startswith("    async def") or line.startswith("    # tools[")]
    assert lines == [
        '    # tools["a-tool"](args: dict[str, Any]) -> str',
        "    async def b(self, args: dict[str, Any]) -> str: ...",
        "    async def z(self, args: dict[str, Any]) -> str: ...",
    ]
    assert "    pass" not in text


@pytest.mark.parametrize("description", ["", " \t\n ", "   ", None, 42])
def test_blank_or_missing_descriptions_render_no_docstring(description: object) -> None:
    text = render_python_sdk([Tool("plain", description=description), Tool("weird-name", description=description)])
    assert "    async def plain(self, args: dict[str, Any]) -> str: ...\n" in text
    assert '"""' not in text
    assert "    #   " not in text


@pytest.mark.parametrize(
    ("description", "docstring", "runtime_doc"),
    [
        ('ends in a quote"', '"""ends in a quote\\""""', 'ends in a quote"'),
        ("ends in a backslash\\", '"""ends in a backslash\\\\"""', "ends in a backslash\\"),
        ('contains """ triple', '"""contains \\"\\"\\" triple"""', 'contains """ triple'),
        ("before\x00after", '"""before\\\\x00after"""', "before\\x00after"),
        ("lone\udfffsurrogate", '"""lone\\\\udfffsurrogate"""', "lone\\udfffsurrogate"),
        ("tab\tnewline\ncr\r  end", '"""tab newline cr end"""', "tab newline cr end"),
        ("emoji 😀 and zero\u200bwidth", '"""emoji 😀 and zero\u200bwidth"""', "emoji 😀 and zero\u200bwidth"),
    ],
)
def test_docstrings_are_escaped(description: str, docstring: str, runtime_doc: str) -> None:
    text = render_python_sdk([Tool("t", description=description)])
    assert f"    async def t(self, args: dict[str, Any]) -> str:\n        {docstring}\n" in text
    assert run_block(text)["Tools"].t.__doc__ == runtime_doc


def test_comment_descriptions_escape_controls_but_not_quotes() -> None:
    text = render_python_sdk([Tool("x-y", description='say "hi"\x00\x1b\ud800 \\ done')])
    assert '    #   say "hi"\\x00\\x1b\\ud800 \\ done\n' in text
    compile(block(text), "<sdk>", "exec")


# Letters and symbols str.isprintable accepts that draw nothing (the terminal's rule, _terminal_text).
INVISIBLE = ["\u3164", "\u2800", "\u115f", "\u1160", "\ufe00", "\U000e0100", "\uffa0"]


@pytest.mark.parametrize("char", INVISIBLE)
def test_descriptions_escape_characters_that_draw_nothing(char: str) -> None:
    """A description cannot hide text from whoever reads the SDK: ``a\\u3164b`` reads as the escape, not ``ab``."""
    escaped = f"\\u{ord(char):04x}" if ord(char) < 0x10000 else f"\\U{ord(char):08x}"
    text = render_python_sdk([Tool("t", description=f"a{char}b"), Tool("t-c", description=f"a{char}b")])
    assert f'        """a\\{escaped}b"""\n' in text
    assert f"    #   a{escaped}b\n" in text
    assert char not in text
    assert run_block(text)["Tools"].t.__doc__ == f"a{escaped}b"


@pytest.mark.parametrize("char", INVISIBLE)
def test_names_and_literals_escape_characters_that_draw_nothing(char: str) -> None:
    """A name with one is no method (an identifier cannot show an escape): it is quoted, escaped, like an enum value."""
    name = f"get{char}file"
    escaped = f"\\u{ord(char):04x}" if ord(char) < 0x10000 else f"\\U{ord(char):08x}"
    mode = {"type": "string", "enum": [f"on{char}"]}
    named = render_python_sdk([Tool(name, obj(("mode", f"x{char}"), mode=mode, **{f"x{char}": STRING}))])
    # A field name with one degrades its object as any key that cannot be a class-syntax field does.
    assert f'    # tools["get{escaped}file"](args: dict[str, Any]) -> str\n' in named
    assert char not in named
    assert "async def" not in named
    text = render_python_sdk([Tool("t", obj(("mode",), mode=mode))])
    assert f'    mode: Literal["on{escaped}"]\n' in text
    assert char not in text
    assert run_block(text)["TArgs"].__annotations__["mode"].__args__ == (f"on{char}",)


def test_emoji_presentation_selectors_and_joiners_stay_as_they_are() -> None:
    emoji = "\u2764\ufe0f and \U0001f469\u200d\U0001f4bb"
    text = render_python_sdk([Tool("t", description=emoji)])
    assert f'        """{emoji}"""\n' in text


def test_typing_import_lists_only_used_symbols() -> None:
    def imports(*tools: Any) -> str:
        return block(render_python_sdk(tools)).split("\n", 1)[0]

    assert imports(Tool("a", obj(("x",), x=STRING))) == "from typing import Protocol, TypedDict"
    assert imports(Tool("a", obj(x=STRING))) == "from typing import NotRequired, Protocol, TypedDict"
    assert imports(Tool("a", obj(("m",), m={"type": "string", "enum": ["p"]}))) == (
        "from typing import Literal, Protocol, TypedDict"
    )
    assert imports(Tool("a", obj(("x",), x=STRING), output_schema={})) == "from typing import Any, Protocol, TypedDict"


def test_non_str_tool_name_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="name"):
        render_python_sdk([Tool(7)])  # type: ignore[arg-type]


def test_result_schema_sources() -> None:
    text = render_python_sdk(
        [
            Definition("a", {"type": "object"}, Output({"type": "integer"})),
            Tool("b", output_schema={"type": "boolean"}),
            attrs.make_class("Bare", {"name": attrs.field(), "parameters": attrs.field()})("c", {"type": "object"}),
        ]
    )
    assert "async def a(self, args: dict[str, Any]) -> int: ..." in text
    assert "async def b(self, args: dict[str, Any]) -> bool: ..." in text
    assert "async def c(self, args: dict[str, Any]) -> Any: ..." in text


# ---------------------------------------------------------------------------
# Type mapping


@pytest.mark.parametrize(
    ("schema", "annotation"),
    [
        ({"type": "string"}, "str"),
        ({"type": "number"}, "float"),
        ({"type": "integer"}, "int"),
        ({"type": "boolean"}, "bool"),
        ({"type": "null"}, "None"),
        ({"type": "null", "const": None}, "None"),
        ({}, "Any"),
        ({"description": "anything", "title": "t", "default": 1, "examples": [1]}, "Any"),
        ({"type": "string", "const": "fixed"}, 'Literal["fixed"]'),
        ({"type": "string", "enum": ["a", "b"], "const": "a"}, 'Literal["a"]'),
        ({"type": "string", "enum": ["a", "b"]}, 'Literal["a", "b"]'),
        ({"type": "boolean", "const": True}, "Literal[True]"),
        ({"type": "boolean", "enum": [False]}, "Literal[False]"),
        ({"type": "number", "const": 1.5}, "Literal[1.5]"),
        ({"type": "number", "const": 1e-7}, "Literal[1e-07]"),
        ({"type": "number", "const": 1e21}, "Literal[1000000000000000000000]"),
        ({"type": "integer", "const": 1e21}, "Literal[1000000000000000000000]"),
        ({"type": "integer", "const": 2.0}, "Literal[2]"),
        ({"type": "integer", "enum": [2**60, -(2**60)]}, "Literal[1152921504606846976, -1152921504606846976]"),
        ({"type": "string", "const": 'say "hi"\n'}, 'Literal["say \\"hi\\"\\n"]'),
        ({"type": "string", "const": "ends\\"}, 'Literal["ends\\\\"]'),
        ({"type": "string", "const": "a\x00b"}, 'Literal["a\\x00b"]'),
        ({"type": "string", "const": "a\ud800b"}, 'Literal["a\\ud800b"]'),
        ({"type": "string", "const": "a\u2028b\x85c\xa0d"}, 'Literal["a\\u2028b\\x85c\\xa0d"]'),
        ({"type": "string", "const": "路径 😀"}, 'Literal["路径 😀"]'),
        ({"oneOf": [{"type": "string"}, {"type": "null"}]}, "str | None"),
        ({"type": "array"}, "list[Any]"),
        ({"type": "array", "items": {"type": "number"}}, "list[float]"),
        ({"type": "array", "items": {"type": "string", "enum": ["x", "y"]}}, 'list[Literal["x", "y"]]'),
        ({"type": "array", "items": {"oneOf": [{"type": "string"}, {"type": "integer"}]}}, "list[str | int]"),
        ({"type": "object"}, "dict[str, Any]"),
        ({"type": "object", "properties": {}}, "dict[str, Any]"),
        ({"type": "object", "additionalProperties": False}, "TOutput"),
        (obj(x=STRING), "TOutput"),
        ({"oneOf": [obj(x=STRING), obj(y=STRING)]}, "TOutput1 | TOutput2"),
        ({"type": "array", "items": obj(x=STRING)}, "list[TOutput]"),
        (obj(**{"a-b": STRING}), "dict[str, Any]"),
        (obj(**{"class": STRING}), "dict[str, Any]"),
        (obj(__token=STRING), "dict[str, Any]"),
        (obj(**{"__debug__": STRING}), "dict[str, Any]"),
        # Python would NFKC-fold this keyword argument to ``field``; the key must stay ``ﬁeld``.
        (obj(**{"ﬁeld": STRING}), "dict[str, Any]"),
    ],
)
def test_schema_annotations(schema: object, annotation: str) -> None:
    assert output_annotation(schema) == annotation


class ExplodingMapping(Mapping[str, Any]):
    def __getitem__(self, key: str) -> Any:
        raise RuntimeError("getter exploded")

    def __iter__(self) -> Iterator[str]:
        return iter(["type"])

    def __len__(self) -> int:
        return 1


def _cyclic() -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "array"}
    schema["items"] = schema
    return schema


@pytest.mark.parametrize(
    "schema",
    [
        None,
        42,
        "string",
        [],
        {"$ref": "#/x"},
        {"type": "string", "format": "uri"},
        {"type": ["string", "null"]},
        {"type": "date"},
        {"oneOf": 7},
        {"oneOf": []},
        {"oneOf": [{"type": "string"}]},
        {"oneOf": [{"type": "string"}, {"type": "null"}], "type": "string"},
        {"oneOf": [{"type": "string"}, {"type": "nope"}]},
        {"type": "object", "properties": 7},
        {"type": "object", "properties": {"x": 7}},
        {"type": "object", "properties": {"x": STRING}, "required": ["y"]},
        {"type": "object", "required": "x"},
        {"type": "object", "additionalProperties": {"type": "string"}},
        {"type": "string", "enum": [1, 2]},
        {"type": "string", "enum": []},
        {"type": "integer", "enum": [True]},
        {"type": "integer", "const": 1.5},
        {"type": "number", "const": float("nan")},
        {"type": "string", "enum": ["a"], "const": "b"},
        {"type": "string", "items": STRING},
        {"type": "array", "items": {"type": "string", "pattern": "x"}},
        {"type": "string", "description": 42},
        {"type": "integer", "const": 10**5000},
        {"items": STRING},
        _cyclic(),
        ExplodingMapping(),
    ],
)
def test_unsupported_schemas_render_any(schema: object) -> None:
    assert output_annotation(schema) == "Any"


def test_an_unsupported_argument_schema_leaves_no_trace() -> None:
    # The failure is found deep inside after an object was seen: no class may be declared.
    schema = obj(("inner",), inner=obj(("bad",), bad={"type": "string", "format": "x"}))
    text = render_python_sdk([Tool("t", schema)])
    assert "async def t(self, args: Any) -> str: ..." in text
    assert "TypedDict" not in block(text)


# ---------------------------------------------------------------------------
# Objects and class names


def test_nested_classes_precede_their_parents() -> None:
    text = render_python_sdk(TOOL_SETS["basic"])
    order = [text.index(f"class {name}(TypedDict):") for name in ("WorkflowArgsMetaPhases", "WorkflowArgsMeta")]
    assert order == sorted(order)
    assert text.index("class WorkflowArgs(TypedDict):") < text.index("class Tools(Protocol):")
    assert "    meta: WorkflowArgsMeta\n" in text
    assert "    phases: NotRequired[list[WorkflowArgsMetaPhases]]\n" in text


def test_required_optional_and_field_comments() -> None:
    text = render_python_sdk(TOOL_SETS["basic"])
    assert "    # What to search for.\n    query: str\n    # Max results.\n    limit: NotRequired[float]\n" in text


def test_missing_required_array_means_all_optional() -> None:
    assert "    flag: NotRequired[bool]\n" in render_python_sdk([Tool("t", obj(flag={"type": "boolean"}))])


def test_openness_marker_and_closed_empty_class() -> None:
    text = render_python_sdk(TOOL_SETS["basic"])
    assert (
        "class WorkflowArgsOpen(TypedDict):\n    x: str\n    # Additional keys beyond those declared are allowed.\n\n"
    ) in text
    assert "class WorkflowArgsClosedEmpty(TypedDict):\n    pass\n\n" in text
    assert "    opts: NotRequired[dict[str, Any]]\n" in text


def test_class_name_collisions_are_numbered() -> None:
    text = render_python_sdk(TOOL_SETS["names"])
    assert "class MyToolArgs(TypedDict):\n    x: NotRequired[str]" in text
    assert "class MyToolArgs2(TypedDict):\n    y: NotRequired[str]" in text
    # ``phase2`` takes FooArgsPhase2 first, so ``Phase`` skips to 3.
    for name, field in (("FooArgsPhase", "a"), ("FooArgsPhase2", "b"), ("FooArgsPhase3", "c")):
        assert f"class {name}(TypedDict):\n    {field}: NotRequired[str]" in text


def test_class_names_from_unusual_tool_names() -> None:
    text = render_python_sdk(TOOL_SETS["names"])
    assert '    # tools["1st-tool"](args: Any) -> str' in text
    assert "    async def 搜索(self, args: 搜索Args) -> str: ..." in text
    assert "class 搜索ArgsOpts(TypedDict):\n    深度: NotRequired[float]" in text
    # NFKC-unstable names take the subscript path; derived class names are normalised.
    assert '    # tools["ﬁnd"](args: FIndArgs) -> str' in text
    assert "class Too\u013aabcArgs(TypedDict):" in text
    assert "Tool\u0301" not in text


def test_nfkc_folds_are_caught_by_the_collision_counter() -> None:
    schema = obj(("\uac00", "\u1100"), **{"\uac00": obj(a=STRING), "\u1100": obj(**{"\u1161": obj(b=STRING)})})
    text = render_python_sdk([Tool("x", schema)])
    # XArgs + ᄀ + ᅡ composes to XArgs가, already taken by the first field's class.
    assert "class XArgs\uac00(TypedDict):\n    a: NotRequired[str]" in text
    assert "class XArgs\uac002(TypedDict):\n    b: NotRequired[str]" in text
    assert "    \u1161: NotRequired[XArgs\uac002]" in text
    run_block(text)


def test_long_names_are_capped() -> None:
    text = render_python_sdk([Tool("x" * 300, obj(inner=obj(leaf=STRING)))])
    names = re.findall(r"^class (\w+)\(TypedDict\):", text, re.MULTILINE)
    # The nested base is cut back to the parent's own name, so it takes a suffix.
    assert names == ["X" + "x" * 119 + "2", "X" + "x" * 119]
    run_block(text)


def test_deep_object_chain_stays_linear() -> None:
    schema: dict[str, Any] = STRING
    for _ in range(4000):
        schema = obj(("inner",), inner=schema)
    text = render_python_sdk([Tool("t", schema)])
    names = re.findall(r"^class (\w+)\(TypedDict\):", text, re.MULTILINE)
    assert len(names) == len(set(names)) == 4000
    assert max(map(len, names)) <= 140
    assert len(text) < 4000 * 400
    compile(block(text), "<sdk>", "exec")


# ---------------------------------------------------------------------------
# Depth


def test_deep_one_of_chain_renders_without_recursion() -> None:
    schema: dict[str, Any] = STRING
    for _ in range(5000):
        schema = {"oneOf": [schema, {"type": "null"}]}
    annotation = output_annotation(schema)
    assert annotation == "str | None"  # each operand once: the chain flattens


def test_schema_size_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    # A DAG of shared schemas (only Python code can build one) would expand
    # exponentially: 2**12 leaves behind 12 shared levels.
    monkeypatch.setattr(_sdk, "_MAX_SCHEMA_NODES", 1000)
    schema: dict[str, Any] = STRING
    for _ in range(12):
        schema = {"oneOf": [schema, schema]}
    assert output_annotation(schema) == "Any"
    chain: dict[str, Any] = STRING
    for _ in range(499):  # 999 nodes: just fits
        chain = {"oneOf": [chain, {"type": "null"}]}
    assert output_annotation(chain) == "str | None"


def test_shared_schemas_render_once_per_reference() -> None:
    shared = obj(x=STRING)
    assert output_annotation({"oneOf": [shared, shared]}) == "TOutput1 | TOutput2"


@pytest.mark.parametrize("nested", [True, False], ids=["chained", "flat"])
def test_a_union_of_distinct_operands_compiles_up_to_the_cap_and_is_any_past_it(nested: bool) -> None:
    """CPython cannot compile a chain of ~3 000 ``|`` operands: past the cap the union is ``Any``."""

    def union(size: int) -> dict[str, Any]:
        if not nested:
            return {"oneOf": [obj(**{f"f{i}": STRING}) for i in range(size)]}
        schema: dict[str, Any] = obj(f0=STRING)
        for i in range(1, size):
            schema = {"oneOf": [schema, obj(**{f"f{i}": STRING})]}
        return schema

    cap = _sdk._MAX_UNION_OPERANDS
    text = render_python_sdk([Tool("t", obj(("root",), root=union(cap)))])
    names = re.findall(r"^class (\w+)\(TypedDict\):", text, re.MULTILINE)
    assert len(names) == len(set(names)) == cap + 1
    assert max(map(len, names)) <= 140
    compile(block(text), "<sdk>", "exec")
    past = render_python_sdk([Tool("t", obj(("root",), root=union(cap + 1)))])
    assert "    root: Any\n" in past
    compile(block(past), "<sdk>", "exec")
    huge = render_python_sdk([Tool("t", obj(("root",), root=union(3000)))])
    compile(block(huge), "<sdk>", "exec")


def test_repeated_leaves_in_a_union_are_written_once_in_their_first_place() -> None:
    schema = {"oneOf": [STRING, {"type": "null"}, {"oneOf": [{"type": "integer"}, STRING]}, {"type": "null"}]}
    assert output_annotation(schema) == "str | None | int"


def nested_arrays(depth: int, leaf: dict[str, Any]) -> dict[str, Any]:
    schema = leaf
    for _ in range(depth):
        schema = {"type": "array", "items": schema}
    return schema


def test_deep_array_chain_is_capped_at_180_lists() -> None:
    annotation = output_annotation(nested_arrays(20_000, STRING))
    assert annotation == "list[" * 180 + "Any" + "]" * 180


def test_arrays_just_under_the_cap_stay_exact() -> None:
    assert output_annotation(nested_arrays(179, STRING)) == "list[" * 179 + "str" + "]" * 179
    assert output_annotation(nested_arrays(180, STRING)) == "list[" * 180 + "str" + "]" * 180


def test_capped_chains_compile_in_every_position() -> None:
    # The worst case for open brackets: an argument annotation inside ``(``.
    rooted = nested_arrays(181, {"type": "string", "const": "x"})
    fielded = obj(("rows",), rows=nested_arrays(500, STRING))
    optional = obj(rows=nested_arrays(500, STRING))
    text = render_python_sdk([Tool("rooted", rooted, rooted), Tool("fielded", fielded), Tool("optional", optional)])
    assert "    rows: " + "list[" * 179 + "Any" + "]" * 179 + "\n" in text
    assert "    rows: NotRequired[" + "list[" * 179 + "Any" + "]" * 179 + "]\n" in text
    compile(block(text), "<sdk>", "exec")


# ---------------------------------------------------------------------------
# The run_code tool


def test_run_code_description_is_the_python_flavour() -> None:
    assert RUN_CODE_NAME == "run_code"
    for phrase in ("Execute a Python program", "`code`", "`description`", "top-level `await`", "`return <value>`"):
        assert phrase in RUN_CODE_DESCRIPTION
    assert "await tools.name(args)" in RUN_CODE_DESCRIPTION
    assert "TypeScript" not in RUN_CODE_DESCRIPTION


def test_run_code_parameters_spec() -> None:
    spec = run_code_parameters_spec()
    assert list(spec) == ["code", "description"]
    assert spec["code"] == {
        "type": "string",
        "required": True,
        "description": "The program: the body of an async Python function.",
    }
    assert spec["description"]["required"] is True
    assert "5-10 word" in spec["description"]["description"]
    spec["code"]["type"] = "changed"
    assert run_code_parameters_spec()["code"]["type"] == "string"


def test_run_code_output_spec() -> None:
    spec = run_code_output_spec()
    assert spec["additionalProperties"] is False
    assert spec["properties"]["logs"] == {"type": "array", "items": {"type": "string"}, "required": True}
    assert spec["properties"]["result"] == {"type": "json"}
