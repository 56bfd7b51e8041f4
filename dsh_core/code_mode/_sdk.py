"""The Python SDK text for Code Mode: tool schemas rendered as typed stubs.

Under ``mode="code"`` the native tool schemas never reach the model, so the text
:func:`render_python_sdk` produces is the model's only description of each
tool's arguments and result. It is prompt text, not an importable module, but it
is always valid Python (``compile()`` accepts it: a list nested past
``_MAX_LIST_NESTING`` and a union of more than ``_MAX_UNION_OPERANDS``
distinct operands degrade to ``Any``) and it is
deterministic: an unchanged tool set renders byte-identical text, whatever order
the tools arrive in.

Python's own lexical rules apply throughout (SPEC §7):

- a name is a bare identifier when ``str.isidentifier()`` accepts it and
  NFKC leaves it unchanged (CPython normalises identifiers when it compiles
  them, JSON keys are compared as written); hard keywords and ``__debug__`` are
  reserved, soft keywords (``match``, ``case``, ``type``, ``_``) are not;
- descriptions collapse ``str.split()`` whitespace runs to one space and
  escape the control characters and lone surrogates that remain;
- string literals are double-quoted and escaped like ``repr``: every character
  ``str.isprintable()`` rejects becomes a ``\\x``/``\\u``/``\\U`` escape;
- the letters and symbols that draw nothing (``\\u3164`` Hangul filler,
  ``\\u2800`` blank Braille pattern, variation selectors but the emoji ones:
  the terminal's rule, :func:`~dsh_core._terminal_text.draws_nothing`) are
  escaped in descriptions and literals too, and a name holding one is not a
  bare identifier, so no text the model reads can hide part of itself;
- numbers are Python numbers: ints as exact digits, integral floats as int
  digits (``1e21`` -> ``1000000000000000000000``), other floats by ``repr``.

A schema outside the enforced subset (SPEC §2.2), or anything that is not a
schema at all, renders as ``Any``; nothing here raises on a schema. Every walk
uses an explicit stack, so chains tens of thousands of levels deep render in
linear time without ``RecursionError``.
"""

from __future__ import annotations

import json
import keyword
import math
import unicodedata
from collections.abc import Iterable, Mapping
from typing import Any, Final, TypeAlias

from .._terminal_text import draws_nothing, holds_invisible

__all__ = [
    "RUN_CODE_DESCRIPTION",
    "RUN_CODE_NAME",
    "render_python_sdk",
    "run_code_output_spec",
    "run_code_parameters_spec",
]

RUN_CODE_NAME: Final = "run_code"
"""The reserved name of the Code Mode transport tool."""

RUN_CODE_DESCRIPTION: Final = (
    "Execute a Python program that calls the tools listed in the SDK section. "
    "Two arguments are required: `code`, the BODY of an async Python function (top-level `await` and "
    "`return` both work), and `description`, a short summary shown to the user. Inside the program call a "
    "tool with `await tools.name(args)`. Report results with `print(...)` and/or `return <value>`; "
    "a successful tool result that contains an image is attached after the run."
)
"""Model-facing description of ``run_code`` when the code runtime speaks Python."""

_CODE_PARAMETER_DESCRIPTION: Final = "The program: the body of an async Python function."
_DESCRIPTION_PARAMETER_DESCRIPTION: Final = (
    "A 5-10 word summary of what the program does, in the active voice, shown in the UI. "
    'Examples: "Count TODO comments per file", "Fetch both pages and compare titles", '
    '"Rename the test fixtures in bulk".'
)


def run_code_parameters_spec() -> dict[str, Any]:
    """The ``run_code`` parameters in the author DSL (SPEC §2.1), a fresh dict per call.

    Both ``code`` and ``description`` are required strings; the descriptions are
    the Python flavour's.
    """
    return {
        "code": {"type": "string", "required": True, "description": _CODE_PARAMETER_DESCRIPTION},
        "description": {"type": "string", "required": True, "description": _DESCRIPTION_PARAMETER_DESCRIPTION},
    }


def run_code_output_spec() -> dict[str, Any]:
    """The ``run_code`` result value in the author DSL: ``{logs: [str, ...], result?: <any JSON>}``."""
    return {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "logs": {"type": "array", "items": {"type": "string"}, "required": True},
            "result": {"type": "json"},
        },
    }


_INSTRUCTIONS: Final = """\
## Writing code for run_code

`run_code` takes two required arguments: `code`, the body of an async Python function (top-level `await` and \
`return` both work), and `description`, a short summary of what the program does. When the program runs, \
exactly two of the names declared below are bound: `tools` and `ToolCallError`. Everything else is a static \
stub that documents argument and result types. The `TypedDict` classes do not exist at run time, so pass plain \
`dict` and `list` values: `await tools.name({"field": 1})`, never `FooArgs(field=1)`, which raises `NameError`.

- Call a tool with `await tools.name(args)`. A tool whose name is not a plain identifier, is a Python keyword \
or starts with `_` is listed as a comment; reach it by subscript: `await tools["my-tool"](args)`. Each call \
returns the tool's canonical result as plain JSON data (the return type below). Arguments must be lossless \
JSON: dicts with string keys, lists, strings, ints, finite floats, booleans and `None`.
- A failed call raises `ToolCallError`: its `tool_name` attribute names the tool and `str(error)` says what \
went wrong. Catch it with `try`/`except ToolCallError` to recover and carry on.
- Independent calls MAY overlap under `asyncio.gather` (calls that are safe together run concurrently; \
calls that could conflict, such as two writes to one file, run one after the other in the order they were \
made). Use plain `await` for steps that depend on an earlier result.
- A tool call the program stops waiting for (`asyncio.wait_for` runs out, `task.cancel()`) is cancelled on \
the host too: it is interrupted at its next pause, but what it already did stays done.
- Report with `print(...)` and/or a top-level `return <value>`; the returned value must be lossless JSON. Only \
what the program prints and returns comes back. A successful tool result that contains an image is attached \
after the run so it can be inspected on the next step; every other intermediate result stays inside the \
program, so extract just what is needed.

The available tools:"""

# Hard keywords: a tool named one of these cannot be an attribute, a field named
# one cannot be a class-syntax TypedDict key. ``__debug__`` is not a keyword but
# CPython refuses to bind it. Soft keywords are deliberately absent.
_RESERVED: Final = frozenset(keyword.kwlist) | {"__debug__"}

_TYPING_ORDER: Final = ("Any", "Literal", "NotRequired", "Protocol", "TypedDict")

# More than ~200 brackets open on one logical line is a tokenizer SyntaxError;
# past this many nested ``list[`` the item type degrades to ``Any``.
_MAX_LIST_NESTING: Final = 180
_MAX_CLASS_NAME: Final = 120
# CPython compiles ``A | B | ...`` as a left-nested chain of binary operations, and one
# of about 3 000 operands exhausts its compiler's recursion limit; past this many the
# union degrades to ``Any``.
_MAX_UNION_OPERANDS: Final = 1000
# A schema with more nodes than this (a shared sub-schema counts once per
# reference) renders as Any: it bounds the work, and the text, that a hostile
# DAG of shared nodes could otherwise blow up exponentially.
_MAX_SCHEMA_NODES: Final = 1_000_000  # well above the 100 000-level chains the SDK must render whole
# Ints beyond this many bits are not lossless JSON numbers and would brush
# against CPython's int-to-str digit limit.
_MAX_INT_BITS: Final = 4096

_SCALAR_TYPES: Final = {"string": "str", "number": "float", "integer": "int", "boolean": "bool", "null": "None"}
_STRUCTURAL: Final = frozenset(("properties", "required", "additionalProperties", "items", "enum", "const"))
_KEYWORDS: Final = _STRUCTURAL | {"type", "oneOf", "description", "title", "default", "examples"}
# Per ``type``: the structural keywords it may not carry.
_FORBIDDEN: Final = {
    "object": _STRUCTURAL - {"properties", "required", "additionalProperties"},
    "array": _STRUCTURAL - {"items"},
    **{scalar: _STRUCTURAL - {"enum", "const"} for scalar in _SCALAR_TYPES},
}


# ---------------------------------------------------------------------------
# Text helpers


def _nfkc(text: str) -> str:
    return unicodedata.normalize("NFKC", text)


def _is_bare_identifier(name: str) -> bool:
    # An identifier cannot show an escape: one holding a character that draws
    # nothing (``get\u3164file``) is quoted instead, where the escape shows.
    return name.isidentifier() and _nfkc(name) == name and not holds_invisible(name)


def _is_field_name(name: str) -> bool:
    # ``__token`` would be name-mangled inside the class body and describe
    # another key; dunders are not mangled.
    if not _is_bare_identifier(name) or name in _RESERVED:
        return False
    return not (name.startswith("__") and not name.endswith("__"))


def _is_method_name(name: str) -> bool:
    # Underscore-leading names go through the subscript path: ``__x`` mangles at
    # the call site and dunders on ``object`` resolve before ``__getattr__``.
    return _is_bare_identifier(name) and name not in _RESERVED and not name.startswith("_")


def _escape_char(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def _shown_in_literal(char: str) -> bool:
    return char.isprintable() and not draws_nothing(char)


def _quote(text: str) -> str:
    """A double-quoted Python string literal for ``text``, escaped like ``repr`` and for what draws nothing."""
    if text.isprintable() and not holds_invisible(text) and '"' not in text and "\\" not in text:
        return f'"{text}"'
    out = ['"']
    for char in text:
        if char == '"' or char == "\\":
            out.append("\\" + char)
        elif char == "\n":
            out.append("\\n")
        elif char == "\r":
            out.append("\\r")
        elif char == "\t":
            out.append("\\t")
        elif _shown_in_literal(char):
            out.append(char)
        else:
            out.append(_escape_char(char))
    out.append('"')
    return "".join(out)


def _describe(description: object) -> str | None:
    """One line of description text safe in a ``#`` comment, or None when there is none.

    Whitespace runs collapse to one space; the control characters and lone
    surrogates left over (a NUL or a surrogate anywhere makes the source
    uncompilable) and the letters and symbols that draw nothing (the terminal's
    rule: a Hangul filler would hide text from whoever reads the SDK) become
    visible escapes. Format characters (zero-width space, bidi marks) pass.
    """
    if not isinstance(description, str):
        return None
    collapsed = " ".join(description.split())
    if not collapsed:
        return None
    if collapsed.isprintable() and not holds_invisible(collapsed):
        return collapsed
    return "".join(_escape_char(char) if _escaped_in_description(char) else char for char in collapsed)


def _escaped_in_description(char: str) -> bool:
    return unicodedata.category(char) in ("Cc", "Cs") or draws_nothing(char)


def _docstring(description: object) -> str | None:
    text = _describe(description)
    if text is None:
        return None
    # Backslashes first, so the escapes ``_describe`` wrote stay literal text and
    # a trailing backslash or quote cannot reach the closing triple quote.
    return '"""' + text.replace("\\", "\\\\").replace('"', '\\"') + '"""'


def _camel(raw: str) -> str:
    """A class-name segment from a tool or field name: ``my-tool`` -> ``MyTool``, ``1st`` -> ``Tool1st``."""
    parts: list[str] = []
    word: list[str] = []
    for char in raw:
        if char != "_" and ("a" + char).isidentifier():
            word.append(char)
        elif word:
            parts.append("".join(word))
            word = []
    if word:
        parts.append("".join(word))
    # ``str.upper`` is a full case mapping (``ﬁ`` -> ``FI``) and may produce
    # characters outside the identifier set; those are dropped.
    joined = "".join(part[0].upper() + part[1:] for part in parts)
    joined = _nfkc("".join(char for char in joined if ("a" + char).isidentifier() and not draws_nothing(char)))
    # NFKC turns the Hangul fillers U+3164/U+FFA0 (dropped above) into U+1160, which draws nothing too.
    joined = "".join(char for char in joined if not draws_nothing(char))
    if not joined[:1].isidentifier() or joined[:1] == "_":
        joined = "Tool" + joined
    # Normalise after the prefix too: ``Tool`` + a combining mark composes.
    return _nfkc(joined)


def _cap(base: str) -> str:
    # Class names derive from their parent's; the cap keeps every name, and so
    # the whole text, linear in schema depth.
    if len(base) <= _MAX_CLASS_NAME:
        return base
    return _nfkc(base[:_MAX_CLASS_NAME])


def _child_base(parent: str, segment: str) -> str:
    # NFKC at the join: a Hangul jamo head can compose with the parent's tail.
    return _cap(_nfkc(parent + segment))


def _literal(value: object) -> str:
    if value is True:
        return "True"
    if value is False:
        return "False"
    if isinstance(value, str):
        return _quote(value)
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    return str(value)


# ---------------------------------------------------------------------------
# Schema subset, parsed into a small trusted tree


class _Unsupported(Exception):
    """Raised inside the parser; the whole schema then renders as ``Any``."""


class _Leaf:
    __slots__ = ("text", "typing")

    def __init__(self, text: str, typing: tuple[str, ...] = ()) -> None:
        self.text = text
        self.typing = typing


class _Union:
    __slots__ = ("children",)

    def __init__(self, size: int) -> None:
        self.children: list[_Node | None] = [None] * size


class _Array:
    __slots__ = ("children",)

    def __init__(self) -> None:
        self.children: list[_Node | None] = [None]


class _Object:
    __slots__ = ("children", "closed", "descriptions", "names", "required")

    def __init__(
        self, names: list[str], descriptions: list[str | None], required: frozenset[str], closed: bool
    ) -> None:
        self.names = names
        self.descriptions = descriptions
        self.children: list[_Node | None] = [None] * len(names)
        self.required = required
        self.closed = closed


_Node: TypeAlias = "_Leaf | _Union | _Array | _Object"
_ANY: Final = _Leaf("Any", ("Any",))
_LIST_ANY: Final = _Leaf("list[Any]", ("Any",))


def _scalar_matches(kind: str, value: object) -> bool:
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "null":
        return value is None
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return value.bit_length() <= _MAX_INT_BITS
    if isinstance(value, float):
        return math.isfinite(value) and (kind == "number" or value.is_integer())
    return False


def _same_scalar(left: object, right: object) -> bool:
    # Type-strict membership: True is not 1.
    return (type(left) is bool) == (type(right) is bool) and left == right


def _parse(root: object) -> _Node:
    """Check ``root`` against the enforced subset and build the render tree; raise ``_Unsupported``."""
    holder: list[_Node | None] = [None]
    # A task parses ``raw`` into ``slots[index]``; a task with ``leaving`` set
    # instead marks the walk leaving that node (cycle detection on the path).
    tasks: list[tuple[object, list[_Node | None], int, int]] = [(root, holder, 0, 0)]
    on_path: set[int] = set()
    budget = _MAX_SCHEMA_NODES
    while tasks:
        raw, slots, index, leaving = tasks.pop()
        if leaving:
            on_path.discard(leaving)
            continue
        budget -= 1
        if budget < 0 or (type(raw) is not dict and not isinstance(raw, Mapping)):
            raise _Unsupported
        key = id(raw)
        if key in on_path:
            raise _Unsupported
        node, children = _parse_node(raw)
        slots[index] = node
        if isinstance(node, _Leaf):
            continue
        on_path.add(key)
        tasks.append((None, holder, 0, key))
        for position in range(len(children) - 1, -1, -1):
            tasks.append((children[position], node.children, position, 0))
    result = holder[0]
    assert result is not None
    return result


def _parse_node(raw: Mapping[Any, Any]) -> tuple[_Node, list[object]]:
    """One schema node's own checks, and the raw child schemas its ``children`` take in order."""
    if not _KEYWORDS.issuperset(raw):
        raise _Unsupported
    for name in ("description", "title"):
        if name in raw and not isinstance(raw[name], str):
            raise _Unsupported
    if "oneOf" in raw:
        branches = raw["oneOf"]
        if "type" in raw or not _STRUCTURAL.isdisjoint(raw):
            raise _Unsupported
        if not isinstance(branches, (list, tuple)) or len(branches) < 2:
            raise _Unsupported
        return _Union(len(branches)), list(branches)
    if "type" not in raw:
        if not _STRUCTURAL.isdisjoint(raw):
            raise _Unsupported
        return _ANY, []
    kind = raw["type"]
    forbidden = _FORBIDDEN.get(kind) if isinstance(kind, str) else None
    if forbidden is None or not forbidden.isdisjoint(raw):
        raise _Unsupported
    if kind == "array":
        return (_Array(), [raw["items"]]) if "items" in raw else (_LIST_ANY, [])
    if kind == "object":
        return _parse_object(raw)
    return _parse_scalar(raw, kind), []


def _parse_object(raw: Mapping[Any, Any]) -> tuple[_Object, list[object]]:
    properties = raw.get("properties", {})
    if not isinstance(properties, Mapping) or not all(isinstance(name, str) for name in properties):
        raise _Unsupported
    names = list(properties)
    required = raw.get("required", ())
    if not isinstance(required, (list, tuple)) or not all(
        isinstance(name, str) and name in properties for name in required
    ):
        raise _Unsupported
    closed = raw.get("additionalProperties", True)
    if not isinstance(closed, bool):
        raise _Unsupported
    children = list(properties.values())
    descriptions = [_describe(child.get("description")) if isinstance(child, Mapping) else None for child in children]
    return _Object(names, descriptions, frozenset(required), not closed), children


def _parse_scalar(raw: Mapping[Any, Any], kind: str) -> _Leaf:
    choices = raw.get("enum")
    if "enum" in raw and (
        not isinstance(choices, (list, tuple))
        or not choices
        or not all(_scalar_matches(kind, choice) for choice in choices)
    ):
        raise _Unsupported
    if "const" in raw:
        const = raw["const"]
        if not _scalar_matches(kind, const):
            raise _Unsupported
        if choices is not None and not any(_same_scalar(const, choice) for choice in choices):
            raise _Unsupported
        if kind != "null":
            return _Leaf(f"Literal[{_literal(const)}]", ("Literal",))
    elif choices is not None and kind != "null":
        return _Leaf("Literal[" + ", ".join(_literal(choice) for choice in choices) + "]", ("Literal",))
    return _Leaf(_SCALAR_TYPES[kind])


# ---------------------------------------------------------------------------
# Rendering


class _Sdk:
    """Collects the TypedDict declarations, the taken class names and the typing symbols of one render."""

    def __init__(self) -> None:
        self.classes: list[str] = []
        self.typing: set[str] = {"Protocol"}
        self._taken: set[str] = set()
        self._next_suffix: dict[str, int] = {}

    def allocate(self, base: str) -> str:
        base = _cap(base)
        name = base
        if name in self._taken:
            suffix = self._next_suffix.get(base, 2)
            while f"{base}{suffix}" in self._taken:
                suffix += 1
            name = f"{base}{suffix}"
            self._next_suffix[base] = suffix + 1
        self._taken.add(name)
        return name

    def annotation(self, schema: object, base: str) -> str:
        """The annotation for ``schema``, declaring the classes it needs; ``Any`` when unsupported."""
        try:
            tree = _parse(schema)
        except Exception:
            # Anything at all that goes wrong while reading a schema (including
            # a hostile Mapping raising from ``__getitem__``) degrades the
            # annotation; the parse emits nothing, so there is nothing to undo.
            self.typing.add("Any")
            return "Any"
        return self._render(tree, base)

    def _render(self, root: _Node, base: str) -> str:
        # A task list in emission order (popped from the end): annotation text
        # is written to the innermost open buffer as the walk reaches it, so
        # even a 100 000-branch union is built in linear time. Each TypedDict
        # field opens its own buffer; a class is declared once all its fields
        # (and so all classes they name) are done, nested classes first.
        buffers: list[list[str]] = [[]]
        tasks: list[tuple[Any, ...]] = [("node", root, base, 0)]
        while tasks:
            task = tasks.pop()
            op = task[0]
            if op == "text":
                buffers[-1].append(task[1])
            elif op == "open":
                buffers.append([])
            elif op == "close":
                field_types, position = task[1], task[2]
                field_types[position] = "".join(buffers.pop())
            elif op == "class":
                self.classes.append(self._declare(task[1], task[2], task[3]))
            else:
                self._visit(task[1], task[2], task[3], buffers[-1], tasks)
        return "".join(buffers[0])

    def _visit(self, node: _Node, base: str, depth: int, out: list[str], tasks: list[tuple[Any, ...]]) -> None:
        if isinstance(node, _Leaf):
            self.typing.update(node.typing)
            out.append(node.text)
        elif isinstance(node, _Union):
            operands = _union_operands(node, base)
            if operands is None:
                self.typing.add("Any")
                out.append("Any")
                return
            # A union opens no bracket, so branches keep the enclosing depth.
            for position in range(len(operands) - 1, -1, -1):
                branch, branch_base = operands[position]
                if isinstance(branch, _Leaf):
                    tasks.append(("text", branch.text))
                    self.typing.update(branch.typing)
                else:
                    tasks.append(("node", branch, branch_base, depth))
                if position:
                    tasks.append(("text", " | "))
        elif isinstance(node, _Array):
            if depth >= _MAX_LIST_NESTING:
                self.typing.add("Any")
                out.append("Any")
                return
            # The item class is named after the array itself (field ``phases``
            # of ``XArgsMeta`` -> ``XArgsMetaPhases``).
            out.append("list[")
            tasks.append(("text", "]"))
            tasks.append(("node", node.children[0], base, depth + 1))
        elif (not node.names and not node.closed) or not all(_is_field_name(name) for name in node.names):
            # Open with no fields is any dict; a field name that cannot be a
            # class-syntax key degrades the whole object.
            self.typing.add("Any")
            out.append("dict[str, Any]")
        else:
            # Pre-order allocation: a parent takes its name before its children.
            name = self.allocate(base)
            self.typing.add("TypedDict")
            out.append(name)
            field_types: list[str] = [""] * len(node.names)
            tasks.append(("class", node, name, field_types))
            for position in range(len(node.names) - 1, -1, -1):
                child = _child_base(name, _camel(node.names[position]))
                # A field is its own logical line: nesting restarts at 1, which
                # reserves the bracket of a ``NotRequired[...]`` around it.
                tasks.append(("close", field_types, position))
                tasks.append(("node", node.children[position], child, 1))
                tasks.append(("open",))

    def _declare(self, node: _Object, name: str, field_types: list[str]) -> str:
        lines = [f"class {name}(TypedDict):"]
        for field, description, annotation in zip(node.names, node.descriptions, field_types, strict=True):
            if description is not None:
                lines.append(f"    # {description}")
            if field in node.required:
                lines.append(f"    {field}: {annotation}")
            else:
                self.typing.add("NotRequired")
                lines.append(f"    {field}: NotRequired[{annotation}]")
        if not node.closed:
            # TypedDict cannot say "open"; the model still needs to know.
            lines.append("    # Additional keys beyond those declared are allowed.")
        if len(lines) == 1:
            lines.append("    pass")
        return "\n".join(lines)


def _union_operands(union: _Union, base: str) -> list[tuple[_Node, str]] | None:
    """The operands of ``union`` as one ``A | B | ...`` chain, each with its class-name base.

    A ``oneOf`` nested directly in a branch joins the chain (``A | (B | C)`` is
    ``A | B | C``), and a leaf already in it is left out (``str | None | None``
    says nothing ``str | None`` does not). ``None`` when more than
    :data:`_MAX_UNION_OPERANDS` remain: the chain would not compile.
    """
    operands: list[tuple[_Node, str]] = []
    leaves: set[str] = set()
    pending: list[tuple[_Node, str]] = [(union, base)]
    while pending:
        node, node_base = pending.pop()
        if isinstance(node, _Union):
            for position in range(len(node.children) - 1, -1, -1):
                child = node.children[position]
                assert child is not None
                # A leaf names no class: no base to build for it.
                child_base = node_base if isinstance(child, _Leaf) else _child_base(node_base, str(position + 1))
                pending.append((child, child_base))
        elif isinstance(node, _Leaf) and node.text in leaves:
            continue
        else:
            if isinstance(node, _Leaf):
                leaves.add(node.text)
            operands.append((node, node_base))
            if len(operands) > _MAX_UNION_OPERANDS:
                return None
    return operands


def _tool_parts(tool: object) -> tuple[str, object, object, object]:
    name = getattr(tool, "name", None)
    if not isinstance(name, str):
        raise TypeError(f"render_python_sdk: tool {tool!r} has no str `name`")
    output: object = None
    definition = getattr(tool, "output", None)
    if definition is not None and hasattr(definition, "schema"):
        output = definition.schema
    elif hasattr(tool, "output_schema"):
        output = tool.output_schema
    return name, getattr(tool, "description", None), getattr(tool, "parameters", None), output


def _tie_break(parts: tuple[str, object, object, object]) -> str:
    try:
        return json.dumps(parts, sort_keys=True, ensure_ascii=True)
    except (TypeError, ValueError, RecursionError):
        return ""


def _sorted_tools(tools: Iterable[object]) -> list[tuple[str, object, object, object]]:
    parts = [_tool_parts(tool) for tool in tools]
    parts.sort(key=lambda entry: entry[0])
    # Names are unique in a registry; should two tools share one anyway, order
    # them by content so the text still does not depend on input order.
    index = 0
    while index < len(parts):
        end = index + 1
        while end < len(parts) and parts[end][0] == parts[index][0]:
            end += 1
        if end - index > 1:
            parts[index:end] = sorted(parts[index:end], key=_tie_break)
        index = end
    return parts


def render_python_sdk(tools: Iterable[object]) -> str:
    """Render the Code Mode SDK section for ``tools``: instructions plus a fenced Python block.

    Each tool is read by duck typing: ``name`` (a ``str``; anything else raises
    ``TypeError``), ``description``, ``parameters`` (a raw JSON Schema) and the
    result schema from ``output.schema`` or ``output_schema`` (absent: ``Any``).
    Tools are sorted by name. For each, the argument then the result schema
    becomes an annotation, declaring one ``TypedDict`` per object shape named
    after the tool (``<Tool>Args``, ``<Tool>Output``, nested ``<Parent><Field>``,
    numbered on collision). A tool whose name is a plain, non-keyword identifier
    not starting with ``_`` becomes an ``async def`` on ``class Tools(Protocol)``;
    any other is a ``# tools["name"](...)`` comment line. The text never depends
    on the input order and the function never raises on a schema.
    """
    sdk = _Sdk()
    members: list[str] = []
    methods = 0
    for name, description, parameters, output in _sorted_tools(tools):
        camel = _camel(name)
        args = sdk.annotation(parameters, camel + "Args")
        result = sdk.annotation(output, camel + "Output")
        if _is_method_name(name):
            methods += 1
            doc = _docstring(description)
            if doc is None:
                members.append(f"    async def {name}(self, args: {args}) -> {result}: ...")
            else:
                members.append(f"    async def {name}(self, args: {args}) -> {result}:")
                members.append(f"        {doc}")
        else:
            members.append(f"    # tools[{_quote(name)}](args: {args}) -> {result}")
            text = _describe(description)
            if text is not None:
                members.append(f"    #   {text}")
    if not methods:
        # Comments are not statements; a class body needs one.
        members.insert(0, "    pass")
    imports = ", ".join(symbol for symbol in _TYPING_ORDER if symbol in sdk.typing)
    blocks = [
        f"from typing import {imports}",
        "class ToolCallError(Exception):\n    tool_name: str",
        *sdk.classes,
        "class Tools(Protocol):\n" + "\n".join(members),
        "tools: Tools",
    ]
    return f"{_INSTRUCTIONS}\n\n```python\n" + "\n\n".join(blocks) + "\n```"
