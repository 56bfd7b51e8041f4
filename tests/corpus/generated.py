"""Corpus cases built by code: every position, deep, big, unicode, many-error and deep schemas.

The expected outcome of each generated call comes from :mod:`corpus.oracle`
(an independent statement of the rules), never from running dsh_core.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from typing import Any

import attrs

from . import CallCase, Case, SchemaCase, const
from .hostile_values import NON_JSON, NON_STR_KEYS, args_failure
from .oracle import Keys, arguments_message, dollar_path, expected_violations, quoted
from .tools import DEEP_SCHEMA_LEVELS, NESTED_VALID, nested_schema

__all__ = ["UNICODE_EDGES", "cases"]

DEEP = 100_000
WIDE = 100_000
BIG_STRING = 10 * 1024 * 1024

SUBSET_KEYWORDS = "(subset: type/oneOf/properties/required/additionalProperties/items/enum/const + annotations)"
SUBSET_TYPES = "object/array/string/number/integer/boolean/null"
DSL_TYPES = "string/number/integer/boolean/null/array/object/json"

# Wrong (or sometimes accidentally right) JSON values tried at every position.
JSON_PALETTE: list[tuple[str, object]] = [
    ("str", "s"),
    ("empty_str", ""),
    ("int", 7),
    ("neg_int", -1),
    ("big_int", 2**64),
    ("float", 1.5),
    ("integral_float", 2.0),
    ("true", True),
    ("false", False),
    ("null", None),
    ("list", []),
    ("list_of_int", [1]),
    ("dict", {}),
    ("dict_with_key", {"k": 1}),
]

# The non-JSON values tried at every position; the rest of NON_JSON is tried at the deepest one.
EVERYWHERE = ("nan", "neg_zero", "bytes", "set", "object", "int_sub", "touchy")
KEYS_EVERYWHERE = ("int", "tuple", "str_sub")
DEEPEST: Keys = ("config", "servers", 1, "tags", 1)

UNICODE_EDGES: list[tuple[str, str]] = [
    ("lone_high_surrogate", "\ud800"),
    ("lone_low_surrogate", "\udfff"),
    ("split_pair", "\ud83d x"),
    ("reversed_pair", "\ude00\ud83d"),
    ("nul", "\x00"),
    ("nul_inside", "a\x00b"),
    ("rtl_override", "\u202eabc"),
    ("arabic", "\u0645\u0631\u062d\u0628\u0627"),
    ("hebrew", "\u05e9\u05dc\u05d5\u05dd"),
    ("combining", "e\u0301"),
    ("combining_stack", "a" + "\u0300" * 50),
    ("zwj_sequence", "\U0001f469\u200d\U0001f4bb"),
    ("bom", "\ufeff"),
    ("noncharacter", "\uffff"),
    ("astral", "\U0001f600"),
    ("line_separators", "\u2028\u2029"),
    ("c1_controls", "\x85\x9b"),
    ("ansi_escape", "\x1b[31mred"),
    ("dot_and_brackets", 'a.b[0]"c'),
]


# -- helpers ---------------------------------------------------------------------------


def _positions(value: object, keys: Keys = ()) -> Iterator[Keys]:
    yield keys
    if type(value) is dict:
        for key, item in value.items():
            yield from _positions(item, (*keys, key))
    elif type(value) is list:
        for index, item in enumerate(value):
            yield from _positions(item, (*keys, index))


def _get(document: Any, keys: Keys) -> Any:
    for key in keys:
        document = document[key]
    return document


def _replace(document: Any, keys: Keys, new: object) -> Any:
    """A copy of ``document`` with the value at ``keys`` replaced (the root too)."""
    if not keys:
        return new
    copied = copy.deepcopy(document)
    _get(copied, keys[:-1])[keys[-1]] = new
    return copied


def _slug(keys: Keys) -> str:
    return ".".join(str(key) for key in keys) or "root"


def _nested_call(id: str, document_builder: Callable[[], object], document: object) -> CallCase:
    """A call of ``nested`` whose expected outcome is the oracle's verdict on ``document``."""
    violations = expected_violations(nested_schema(), document)
    if not violations:
        return CallCase(id=id, tool="nested", build=document_builder, value=document_builder)
    return CallCase(
        id=id,
        tool="nested",
        build=document_builder,
        code="INVALID_ARGS",
        name="ToolArgsError",
        message=arguments_message(violations),
    )


def _json_builder(document: object) -> Callable[[], object]:
    # Plain JSON documents are rebuilt per call, so no case can see another's mutation.
    text = json.dumps(document)
    return lambda: json.loads(text)


def _non_json_call(id: str, document: Callable[[], object], path: str, problem: str) -> CallCase:
    return CallCase(
        id=id,
        tool="nested",
        build=document,
        code="INVALID_ARGS",
        name="NonJsonValueError",
        message=args_failure(path, problem),
    )


# -- every position of the nested schema -------------------------------------------------


def _wrong_json_everywhere() -> Iterator[Case]:
    for keys in _positions(NESTED_VALID):
        for label, wrong in JSON_PALETTE:
            document = _replace(NESTED_VALID, keys, wrong)
            yield _nested_call(f"position-{_slug(keys)}-{label}", _json_builder(document), document)


def _missing_and_extra() -> Iterator[Case]:
    for keys in _positions(NESTED_VALID):
        node = _get(NESTED_VALID, keys)
        if type(node) is not dict:
            continue
        for name in node:
            document = copy.deepcopy(NESTED_VALID)
            del _get(document, keys)[name]
            yield _nested_call(f"missing-{_slug((*keys, name))}", _json_builder(document), document)
        document = copy.deepcopy(NESTED_VALID)
        _get(document, keys)["zz_extra"] = 1
        yield _nested_call(f"extra-key-in-{_slug(keys)}", _json_builder(document), document)


def _everything_wrong_at_once() -> Iterator[Case]:
    # Every leaf wrong at the same time: the report must list them all, in walk order.
    leaves = [keys for keys in _positions(NESTED_VALID) if type(_get(NESTED_VALID, keys)) not in (dict, list)]
    for label, wrong in JSON_PALETTE:
        document = copy.deepcopy(NESTED_VALID)
        for keys in leaves:
            _get(document, keys[:-1])[keys[-1]] = wrong
        yield _nested_call(f"all-leaves-{label}", _json_builder(document), document)


def _non_json_everywhere() -> Iterator[Case]:
    palette = {id: (build, problem) for id, build, problem in NON_JSON}
    for keys in _positions(NESTED_VALID):
        chosen = list(palette) if keys == DEEPEST else list(EVERYWHERE)
        for id in chosen:
            build, problem = palette[id]
            yield _non_json_call(
                f"non-json-{_slug(keys)}-{id}",
                lambda keys=keys, build=build: _replace(NESTED_VALID, keys, build()),
                dollar_path(keys),
                problem,
            )
        keys_palette = NON_STR_KEYS if keys == DEEPEST else [k for k in NON_STR_KEYS if k[0] in KEYS_EVERYWHERE]
        for id, key in keys_palette:
            yield _non_json_call(
                f"non-str-key-{_slug(keys)}-{id}",
                lambda keys=keys, key=key: _replace(NESTED_VALID, keys, {key: 1}),
                dollar_path(keys),
                f"object key {key!r} is not a str",
            )
        yield _non_json_call(
            f"cycle-at-{_slug(keys)}",
            lambda keys=keys: _replace(NESTED_VALID, keys, _cycle()),
            dollar_path((*keys, 0)),
            "cycle: the value contains itself",
        )


def _cycle() -> list[Any]:
    box: list[Any] = []
    box.append(box)
    return box


# -- unicode ---------------------------------------------------------------------------------


def _unicode() -> Iterator[Case]:
    for id, text in UNICODE_EDGES:
        yield CallCase(id=f"unicode-text-{id}", tool="text", build=const({"s": text}), value=const(text))
        blob = _replace(NESTED_VALID, ("blob",), {text: text})
        yield CallCase(id=f"unicode-json-key-{id}", tool="nested", build=_json_builder(blob), value=_json_builder(blob))
        closed = copy.deepcopy(NESTED_VALID)
        closed["config"][text] = 1
        yield _nested_call(f"unicode-closed-key-{id}", _json_builder(closed), closed)
        enum = _replace(NESTED_VALID, ("mode",), "fast" + text)
        yield _nested_call(f"unicode-enum-{id}", _json_builder(enum), enum)
        yield CallCase(
            id=f"unicode-tool-name-{id}",
            tool=text,
            build=const({}),
            code="UNKNOWN_TOOL",
            name="ToolNotFoundError",
            message=f'unknown tool "{text}"',
        )
        yield CallCase(
            id=f"unicode-nan-under-key-{id}",
            tool="echo",
            build=lambda text=text: {"k": {text: float("nan")}},
            code="INVALID_ARGS",
            name="NonJsonValueError",
            message=args_failure(dollar_path(("k", text)), "nan is not a finite JSON number"),
        )


# -- deep and big values -----------------------------------------------------------------------


def _deep_list(depth: int, bottom: object = None) -> Any:
    node: Any = [] if bottom is None else [bottom]
    for _ in range(depth - 1):
        node = [node]
    return node


def _deep_dict(depth: int, bottom: object = None) -> Any:
    node: Any = {} if bottom is None else {"k": bottom}
    for _ in range(depth - 1):
        node = {"k": node}
    return node


def _deep_mixed(depth: int) -> Any:
    node: Any = "bottom"
    for level in range(depth):
        node = {"k": node} if level % 2 else [node]
    return node


def _deep_dict_cycle(depth: int) -> tuple[Any, int]:
    root: dict[str, Any] = {}
    node = root
    for _ in range(depth - 1):
        child: dict[str, Any] = {}
        node["k"] = child
        node = child
    node["k"] = root
    return root, depth


def _chain_args(levels: int, leaf: object, *, extra: bool = False, drop_leaf: bool = False) -> dict[str, Any]:
    bottom: dict[str, Any] = {} if drop_leaf else {"leaf": leaf}
    if extra:
        bottom["zz"] = 1
    node = bottom
    for _ in range(levels - 1):
        node = {"n": node}
    return node


def _rows(depth: int, bottom: object) -> Any:
    node: Any = bottom
    for _ in range(depth):
        node = [node]
    return node


def _deep_values(scale: int, *, slow: bool) -> Iterator[Case]:
    tag = f"{scale // 1000}k"
    yield CallCase(
        id=f"deep-list-{tag}-in-blob",
        tool="nested",
        build=lambda: _replace(NESTED_VALID, ("blob",), _deep_list(scale)),
        value=lambda: _replace(NESTED_VALID, ("blob",), _deep_list(scale)),
        slow=slow,
    )
    yield CallCase(
        id=f"deep-dict-{tag}-in-blob",
        tool="nested",
        build=lambda: _replace(NESTED_VALID, ("blob",), _deep_dict(scale)),
        value=lambda: _replace(NESTED_VALID, ("blob",), _deep_dict(scale)),
        slow=slow,
    )
    yield CallCase(
        id=f"deep-mixed-{tag}-echo",
        tool="echo",
        build=lambda: {"v": _deep_mixed(scale)},
        value=lambda: {"v": _deep_mixed(scale)},
        slow=slow,
    )
    yield CallCase(
        id=f"deep-list-{tag}-nan-at-bottom",
        tool="echo",
        build=lambda: {"blob": _deep_list(scale, float("nan"))},
        code="INVALID_ARGS",
        name="NonJsonValueError",
        message=lambda: args_failure("$.blob" + "[0]" * scale, "nan is not a finite JSON number"),
        slow=slow,
    )
    yield CallCase(
        id=f"deep-dict-{tag}-cycle-at-bottom",
        tool="echo",
        build=lambda: {"blob": _deep_dict_cycle(scale)[0]},
        code="INVALID_ARGS",
        name="NonJsonValueError",
        message=lambda: args_failure("$.blob" + ".k" * scale, "cycle: the value contains itself"),
        slow=slow,
    )
    yield CallCase(
        id=f"deep-dict-{tag}-non-str-key-at-bottom",
        tool="echo",
        build=lambda: {"blob": _deep_dict(scale, {1: 1})},
        code="INVALID_ARGS",
        name="NonJsonValueError",
        message=lambda: args_failure("$.blob" + ".k" * scale, "object key 1 is not a str"),
        slow=slow,
    )
    yield CallCase(
        id=f"deep-list-{tag}-where-string-expected",
        tool="nested",
        build=lambda: _replace(NESTED_VALID, ("tags",), _deep_list(scale)),
        code="INVALID_ARGS",
        name="ToolArgsError",
        message='invalid arguments: "tags[0]" must be a string',
        slow=slow,
    )
    yield CallCase(
        id=f"deep-list-{tag}-where-integer-expected",
        tool="nested",
        build=lambda: _replace(NESTED_VALID, ("count",), _deep_dict(scale)),
        code="INVALID_ARGS",
        name="ToolArgsError",
        message='invalid arguments: "count" must be an integer',
        slow=slow,
    )
    yield CallCase(
        id=f"deep-output-{tag}-invalid",
        tool="passthrough",
        build=lambda: {"value": _deep_list(scale)},
        code="INVALID_TOOL_OUTPUT",
        name="ToolOutputError",
        message='tool "passthrough" returned invalid output: "value[0]" must be a string',
        slow=slow,
    )


def _deep_schema_calls() -> Iterator[Case]:
    levels = DEEP_SCHEMA_LEVELS
    n_path = ".".join(["n"] * (levels - 1))
    yield CallCase(
        id="deep-schema-chain-valid", tool="deep_chain", build=lambda: _chain_args(levels, 5), value=const(5)
    )
    yield CallCase(
        id="deep-schema-chain-wrong-leaf",
        tool="deep_chain",
        build=lambda: _chain_args(levels, "5"),
        code="INVALID_ARGS",
        name="ToolArgsError",
        message=f'invalid arguments: "{quoted(n_path + ".leaf")}" must be an integer',
    )
    yield CallCase(
        id="deep-schema-chain-missing-leaf",
        tool="deep_chain",
        build=lambda: _chain_args(levels, 5, drop_leaf=True),
        code="INVALID_ARGS",
        name="ToolArgsError",
        message=f'invalid arguments: missing required property "{quoted(n_path + ".leaf")}"',
    )
    yield CallCase(
        id="deep-schema-chain-extra-key",
        tool="deep_chain",
        build=lambda: _chain_args(levels, 5, extra=True),
        code="INVALID_ARGS",
        name="ToolArgsError",
        message=f'invalid arguments: "{quoted(n_path + ".zz")}" is not a declared property (additionalProperties: false)',
    )
    yield CallCase(
        id="deep-schema-chain-deep-junk-leaf",
        tool="deep_chain",
        build=lambda: _chain_args(levels, _deep_list(DEEP)),
        code="INVALID_ARGS",
        name="ToolArgsError",
        message=f'invalid arguments: "{quoted(n_path + ".leaf")}" must be an integer',
        slow=True,
    )
    yield CallCase(
        id="deep-schema-chain-too-shallow",
        tool="deep_chain",
        build=lambda: _chain_args(levels - 1, 5),
        code="INVALID_ARGS",
        name="ToolArgsError",
        message=(
            f'invalid arguments: missing required property "{quoted(".".join(["n"] * (levels - 2)) + ".n")}"; '
            f'"{quoted(".".join(["n"] * (levels - 2)) + ".leaf")}" is not a declared property '
            "(additionalProperties: false)"
        ),
    )
    yield CallCase(
        id="deep-schema-items-valid",
        tool="deep_items",
        build=lambda: {"rows": _rows(levels, "s")},
        value=lambda: _rows(levels, "s"),
    )
    yield CallCase(
        id="deep-schema-items-one-level-too-deep",
        tool="deep_items",
        build=lambda: {"rows": _rows(levels + 1, "s")},
        code="INVALID_ARGS",
        name="ToolArgsError",
        message='invalid arguments: "' + quoted("rows" + "[0]" * levels) + '" must be a string',
    )
    yield CallCase(
        id="deep-schema-items-wrong-bottom",
        tool="deep_items",
        build=lambda: {"rows": _rows(levels, 1)},
        code="INVALID_ARGS",
        name="ToolArgsError",
        message='invalid arguments: "' + quoted("rows" + "[0]" * levels) + '" must be a string',
    )


def _big_values(size: int, wide: int, *, slow: bool) -> Iterator[Case]:
    tag = f"{size // (1024 * 1024)}mb"
    yield CallCase(
        id=f"big-string-{tag}", tool="text", build=lambda: {"s": "x" * size}, value=lambda: "x" * size, slow=slow
    )
    yield CallCase(
        id=f"big-string-{tag}-hostile-chars",
        tool="text",
        build=lambda: {"s": _hostile_text(size)},
        value=lambda: _hostile_text(size),
        slow=slow,
    )
    yield CallCase(
        id=f"big-string-{tag}-as-key",
        tool="echo",
        build=lambda: {"k" * size: 1},
        value=lambda: {"k" * size: 1},
        slow=slow,
    )
    yield CallCase(
        id=f"big-string-{tag}-where-integer-expected",
        tool="nested",
        build=lambda: _replace(NESTED_VALID, ("count",), "9" * size),
        code="INVALID_ARGS",
        name="ToolArgsError",
        message='invalid arguments: "count" must be an integer',
        slow=slow,
    )
    yield CallCase(
        id=f"big-string-{tag}-as-undeclared-key",
        tool="nested",
        build=lambda: _with_config_keys(["k" * size]),
        code="INVALID_ARGS",
        name="ToolArgsError",
        message=lambda: (
            f'invalid arguments: "{quoted("config." + "k" * size)}" is not a declared property '
            "(additionalProperties: false)"
        ),
        slow=slow,
    )
    wtag = f"{wide // 1000}k"

    def keys() -> list[str]:
        return [f"k{i}" for i in range(wide)]

    yield CallCase(
        id=f"wide-object-{wtag}-keys",
        tool="echo",
        build=lambda: {key: i for i, key in enumerate(keys())},
        value=lambda: {key: i for i, key in enumerate(keys())},
        slow=slow,
    )
    yield CallCase(
        id=f"wide-object-{wtag}-nested-values",
        tool="nested",
        build=lambda: _replace(NESTED_VALID, ("blob",), {key: [i, {"v": key}] for i, key in enumerate(keys())}),
        value=lambda: _replace(NESTED_VALID, ("blob",), {key: [i, {"v": key}] for i, key in enumerate(keys())}),
        slow=True,
    )
    yield CallCase(
        id=f"wide-object-{wtag}-nan-in-last-key",
        tool="echo",
        build=lambda: {"blob": {**{key: 1 for key in keys()}, f"k{wide - 1}": float("nan")}},
        code="INVALID_ARGS",
        name="NonJsonValueError",
        message=args_failure(f"$.blob.k{wide - 1}", "nan is not a finite JSON number"),
        slow=slow,
    )
    yield CallCase(
        id=f"wide-object-{wtag}-undeclared-keys",
        tool="nested",
        build=lambda: _with_config_keys(keys()),
        code="INVALID_ARGS",
        name="ToolArgsError",
        message=lambda: arguments_message(
            [f'"config.{key}" is not a declared property (additionalProperties: false)' for key in keys()]
        ),
        slow=slow,
    )
    yield CallCase(
        id=f"wide-array-{wtag}-last-element-wrong",
        tool="nested",
        build=lambda: _replace(NESTED_VALID, ("tags",), ["t"] * (wide - 1) + [1]),
        code="INVALID_ARGS",
        name="ToolArgsError",
        message=f'invalid arguments: "tags[{wide - 1}]" must be a string',
        slow=slow,
    )
    yield CallCase(
        id=f"wide-array-{wtag}-every-element-wrong",
        tool="nested",
        build=lambda: _replace(NESTED_VALID, ("tags",), list(range(wide))),
        code="INVALID_ARGS",
        name="ToolArgsError",
        message=lambda: arguments_message([f'"tags[{i}]" must be a string' for i in range(wide)]),
        slow=slow,
    )


def _hostile_text(size: int) -> str:
    unit = "ab\x00\ud800\u202e\u0301\U0001f600\ufeff"
    return (unit * (size // len(unit) + 1))[:size]


def _with_config_keys(keys: list[str]) -> dict[str, Any]:
    document = copy.deepcopy(NESTED_VALID)
    for key in keys:
        document["config"][key] = 1
    return document


# -- schemas with many errors ---------------------------------------------------------------------

# (raw node, violations relative to its path "{p}")
_SUBSET_TEMPLATES: list[tuple[object, list[str]]] = [
    ({"type": "weird"}, [f"{{p}}.type must be one of {SUBSET_TYPES}"]),
    ({"type": ["string", "null"]}, ["{p}.type must be a single type string (type arrays are not supported)"]),
    ({"type": "string", "minLength": 1}, [f"{{p}}.minLength is not a supported keyword {SUBSET_KEYWORDS}"]),
    ({"type": "string", "enum": []}, ["{p}.enum must be a non-empty array of string values"]),
    ({"type": "integer", "const": 1.5}, ["{p}.const must be a integer value"]),
    ({"type": "string", "items": {}}, ['{p}.items is not supported on type "string"']),
    ({"oneOf": [{}]}, ["{p}.oneOf must be an array of at least two schemas"]),
    ({"type": "string", "oneOf": [{}, {}]}, ["{p} cannot declare both type and oneOf"]),
    ({"enum": ["a"]}, ["{p}.enum requires type or oneOf"]),
    ({"type": "object", "required": ["x"]}, ['{p}.required names "x" which is not in properties']),
    ({"type": "object", "additionalProperties": 1}, ["{p}.additionalProperties must be a boolean"]),
    ({"type": "string", "description": 5}, ["{p}.description must be a string"]),
    ("not a schema", ["{p} must be a schema object"]),
    ({"$ref": "#"}, [f"{{p}}.$ref is not a supported keyword {SUBSET_KEYWORDS}"]),
    ({"type": "array", "items": "x"}, ["{p}.items must be a schema object"]),
    (
        {"oneOf": [{"type": "x"}, {"type": "string"}], "items": {}},
        [f"{{p}}.oneOf[0].type must be one of {SUBSET_TYPES}", "{p}.items is not supported beside oneOf"],
    ),
]

_DSL_TEMPLATES: list[tuple[object, list[str]]] = [
    ({"type": "weird"}, [f"{{p}}.type must be {DSL_TYPES}, or use oneOf"]),
    ({"type": "object"}, ["{p}.additionalProperties must be explicitly true or false"]),
    ({"type": "string", "minLength": 1}, ["{p}.minLength is not supported by the value schema DSL"]),
    ({"type": "string", "items": {"type": "string"}}, ['{p}.items is not supported on type "string"']),
    ({"type": "string", "required": "yes"}, ["{p}.required must be true when present"]),
    ({"type": "integer", "enum": ["a"]}, ["{p}.enum must be a non-empty array of integer values"]),
    ({"type": "integer", "const": "a"}, ["{p}.const must be an integer value"]),
    ({"type": "string", "enum": ["a"], "const": "b"}, ["{p}.const must be one of {p}.enum when both are declared"]),
    ({"oneOf": [{"type": "string"}]}, ["{p}.oneOf must be an array of at least two value schemas"]),
    ({"type": "string", "oneOf": [{"type": "string"}, {"type": "null"}]}, ["{p} cannot declare both type and oneOf"]),
    ("x", ["{p} must be a value schema object"]),
    ({"type": "string", "description": 1}, ["{p}.description must be a string"]),
    (
        {"type": "array", "items": {"type": "string", "required": True}},
        [
            "{p}.items.required is not supported by the value schema DSL (required: True belongs on a property of an object)"
        ],
    ),
    ({"oneOf": [{"type": "string"}, {"type": "nope"}]}, [f"{{p}}.oneOf[1].type must be {DSL_TYPES}, or use oneOf"]),
]


def _many_errors(
    templates: list[tuple[object, list[str]]], count: int, path: Callable[[str], str]
) -> tuple[dict[str, Any], list[str]]:
    properties: dict[str, Any] = {}
    expected: list[str] = []
    for index in range(count):
        node, violations = templates[index % len(templates)]
        name = f"p{index}"
        properties[name] = copy.deepcopy(node)
        expected += [v.replace("{p}", path(name)) for v in violations]
    return properties, expected


def _schema_many_errors() -> Iterator[Case]:
    for count in (len(_SUBSET_TEMPLATES), 200):
        properties, expected = _many_errors(_SUBSET_TEMPLATES, count, lambda name: f"schema.properties.{name}")
        schema = {"type": "object", "properties": properties}
        for target in ("assert", "assert_object", "register"):
            yield SchemaCase(
                id=f"many-errors-{count}-{target}",
                target=target,  # type: ignore[arg-type]
                build=_json_builder(schema),
                error="JsonSchemaError",
                violations=tuple(expected),
            )
    for count in (len(_DSL_TEMPLATES), 200):
        properties, expected = _many_errors(_DSL_TEMPLATES, count, lambda name: f"parameters.{name}")
        for target in ("parameter_dsl", "define_tool"):
            yield SchemaCase(
                id=f"many-dsl-errors-{count}-{target}",
                target=target,  # type: ignore[arg-type]
                build=_json_builder(properties),
                error="SchemaSpecError",
                violations=tuple(expected),
            )
        value_spec = {
            "type": "object",
            "additionalProperties": False,
            "properties": _many_errors(_DSL_TEMPLATES, count, str)[0],
        }
        value_expected = _many_errors(_DSL_TEMPLATES, count, lambda name: f"schema.properties.{name}")[1]
        yield SchemaCase(
            id=f"many-dsl-errors-{count}-value_dsl",
            target="value_dsl",
            build=_json_builder(value_spec),
            error="SchemaSpecError",
            violations=tuple(value_expected),
        )


# -- schemas 1 000 levels deep -------------------------------------------------------------------


def _raw_chain(levels: int, bottom: dict[str, Any], *, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    node = bottom
    for _ in range(levels - 1):
        node = {"type": "object", "properties": {"n": node}, **(extra or {})}
    return node


def _items_chain(levels: int, bottom: object) -> Any:
    node = bottom
    for _ in range(levels - 1):
        node = {"type": "array", "items": node}
    return node


def _one_of_chain(levels: int, bottom: object) -> Any:
    node = bottom
    for _ in range(levels - 1):
        node = {"oneOf": [{"type": "null"}, node]}
    return node


def _circular_items(levels: int) -> dict[str, Any]:
    root: dict[str, Any] = {"type": "array"}
    node = root
    for _ in range(levels - 1):
        child: dict[str, Any] = {"type": "array"}
        node["items"] = child
        node = child
    node["items"] = root
    return root


def _dsl_chain(levels: int, bottom: dict[str, Any]) -> dict[str, Any]:
    node = bottom
    for _ in range(levels - 2):
        node = {"type": "object", "additionalProperties": False, "properties": {"n": node}}
    return {"n": node}


def _deep_schemas(levels: int, *, slow: bool) -> Iterator[Case]:
    tag = f"{levels}"
    props = "".join([".properties.n"] * (levels - 1))
    yield SchemaCase(
        id=f"deep-schema-{tag}-valid", target="assert", build=lambda: _raw_chain(levels, {"type": "string"}), slow=slow
    )
    yield SchemaCase(
        id=f"deep-schema-{tag}-bad-bottom",
        target="assert",
        build=lambda: _raw_chain(levels, {"type": "strin"}),
        error="JsonSchemaError",
        violations=(f"schema{props}.type must be one of {SUBSET_TYPES}",),
        slow=slow,
    )
    every_level = f"minimum is not a supported keyword {SUBSET_KEYWORDS}"
    yield SchemaCase(
        id=f"deep-schema-{tag}-bad-every-level",
        target="assert",
        build=lambda: _raw_chain(levels, {"type": "string", "minimum": 1}, extra={"minimum": 1}),
        error="JsonSchemaError",
        # The full list is levels * levels/2 path characters: exact for 1 000 levels, sampled beyond.
        violations=tuple(f"schema{'.properties.n' * depth}.{every_level}" for depth in range(levels))
        if levels <= DEEP_SCHEMA_LEVELS
        else None,
        count=levels,
        contains=(f"schema.{every_level}", f"schema.properties.n.{every_level}", f"schema{props}.{every_level}"),
        slow=slow,
    )
    yield SchemaCase(
        id=f"deep-schema-{tag}-bad-bottom-registered",
        target="register",
        build=lambda: _raw_chain(levels, {"type": "strin"}),
        error="JsonSchemaError",
        violations=(f"schema{props}.type must be one of {SUBSET_TYPES}",),
        slow=slow,
    )
    yield SchemaCase(
        id=f"deep-schema-{tag}-one-of-chain-bad-bottom",
        target="assert",
        build=lambda: _one_of_chain(levels, {"oneOf": [{}]}),
        error="JsonSchemaError",
        violations=("schema" + ".oneOf[1]" * (levels - 1) + ".oneOf must be an array of at least two schemas",),
        slow=slow,
    )
    yield SchemaCase(
        id=f"deep-schema-{tag}-circular-bottom",
        target="assert",
        build=lambda: _circular_items(levels),
        error="JsonSchemaError",
        violations=("schema" + ".items" * levels + " is circular",),
        slow=slow,
    )
    yield SchemaCase(
        id=f"deep-schema-{tag}-value-dsl-valid",
        target="value_dsl",
        build=lambda: _items_chain(levels, {"type": "string"}),
        slow=slow,
    )
    yield SchemaCase(
        id=f"deep-schema-{tag}-value-dsl-bad-bottom",
        target="value_dsl",
        build=lambda: _items_chain(levels, {"type": "strin"}),
        error="SchemaSpecError",
        violations=("schema" + ".items" * (levels - 1) + f".type must be {DSL_TYPES}, or use oneOf",),
        slow=slow,
    )
    dsl_props = "parameters.n" + "".join([".properties.n"] * (levels - 2))
    yield SchemaCase(
        id=f"deep-schema-{tag}-parameter-dsl-missing-additional",
        target="parameter_dsl",
        build=lambda: _dsl_chain(levels, {"type": "object", "properties": {}}),
        error="SchemaSpecError",
        violations=(f"{dsl_props}.additionalProperties must be explicitly true or false",),
        slow=slow,
    )
    yield SchemaCase(
        id=f"deep-schema-{tag}-define-tool-bad-bottom",
        target="define_tool",
        build=lambda: _dsl_chain(levels, {"type": "strin"}),
        error="SchemaSpecError",
        violations=(f"{dsl_props}.type must be {DSL_TYPES}, or use oneOf",),
        slow=slow,
    )


# -- all together --------------------------------------------------------------------------------

# 100 000-deep cases cost seconds each (mostly the cyclic GC walking the deep
# structure); the default run keeps one array case and one object case, the
# rest (and the 200 000-container wide object) run with -m slow.
DEEP_FAST = frozenset({"deep-list-100k-nan-at-bottom", "deep-dict-100k-cycle-at-bottom"})


def _only_some_fast(generated: Iterator[Case], fast: frozenset[str]) -> Iterator[Case]:
    for case in generated:
        yield case if case.id in fast else attrs.evolve(case, slow=True)


def cases() -> list[Case]:
    return [
        *_wrong_json_everywhere(),
        *_missing_and_extra(),
        *_everything_wrong_at_once(),
        *_non_json_everywhere(),
        *_unicode(),
        *_only_some_fast(_deep_values(DEEP, slow=False), DEEP_FAST),
        *_deep_values(1_000_000, slow=True),
        *_deep_schema_calls(),
        *_big_values(BIG_STRING, WIDE, slow=False),
        *_big_values(5 * BIG_STRING, 10 * WIDE, slow=True),
        *_schema_many_errors(),
        *_deep_schemas(DEEP_SCHEMA_LEVELS, slow=False),
        *_deep_schemas(10_000, slow=True),
    ]
