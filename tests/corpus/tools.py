"""The tools corpus calls run against, and the schemas the generators walk.

Every tool echoes (part of) its arguments, so a success can be checked value
for value. ``NESTED_SPEC`` is the nested parameter schema whose every position
``generated.py`` fills with wrong values; ``NESTED_VALID`` is a value that
satisfies it and touches every position.
"""

from __future__ import annotations

import functools
from typing import Any

from dsh_core import ToolDefinition, ToolOutput, ToolRuntime, define_tool
from dsh_core.schema import parameter_schema_to_json_schema

__all__ = [
    "DEEP_SCHEMA_LEVELS",
    "NESTED_SPEC",
    "NESTED_VALID",
    "build_runtime",
    "deep_chain_spec",
    "deep_items_spec",
    "nested_schema",
]

DEEP_SCHEMA_LEVELS = 1000

NESTED_SPEC: dict[str, Any] = {
    "name": {"type": "string", "required": True},
    "count": {"type": "integer", "required": True},
    "ratio": {"type": "number"},
    "flag": {"type": "boolean"},
    "nothing": {"type": "null"},
    "mode": {"type": "string", "enum": ["fast", "slow"]},
    "level": {"type": "integer", "const": 3},
    "tags": {"type": "array", "items": {"type": "string"}},
    "matrix": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
    "choice": {"oneOf": [{"type": "string"}, {"type": "integer"}]},
    "blob": {"type": "json"},
    "config": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "host": {"type": "string", "required": True},
            "port": {"type": "integer"},
            "servers": {
                "type": "array",
                "items": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "host": {"type": "string", "required": True},
                        "weight": {"type": "number"},
                        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b"]}},
                    },
                },
            },
            "extra": {"type": "object", "additionalProperties": True, "properties": {"note": {"type": "string"}}},
        },
    },
}

NESTED_VALID: dict[str, Any] = {
    "name": "n",
    "count": 2,
    "ratio": 0.5,
    "flag": True,
    "nothing": None,
    "mode": "fast",
    "level": 3,
    "tags": ["x", "y"],
    "matrix": [[1, 2.5], [3]],
    "choice": "c",
    "blob": {"any": [1, None]},
    "config": {
        "host": "h",
        "port": 80,
        "servers": [{"host": "a", "weight": 1.5, "tags": ["a"]}, {"host": "b", "tags": ["b", "a"]}],
        "extra": {"note": "n", "free": 1},
    },
}


@functools.cache
def nested_schema() -> dict[str, Any]:
    """The raw JSON Schema the runtime validates ``nested`` arguments against (do not mutate)."""
    return parameter_schema_to_json_schema(NESTED_SPEC)


def deep_chain_spec(levels: int = DEEP_SCHEMA_LEVELS) -> dict[str, Any]:
    """A parameter spec ``levels`` objects deep: ``{"n": {"n": ... {"leaf": integer}}}``, built iteratively."""
    node: dict[str, Any] = {
        "type": "object",
        "additionalProperties": False,
        "properties": {"leaf": {"type": "integer", "required": True}},
    }
    for _ in range(levels - 2):
        node = {"type": "object", "additionalProperties": False, "properties": {"n": {**node, "required": True}}}
    return {"n": {**node, "required": True}}


def deep_items_spec(levels: int = DEEP_SCHEMA_LEVELS) -> dict[str, Any]:
    """A value spec of ``levels`` nested arrays of strings."""
    node: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        node = {"type": "array", "items": node}
    return node


async def _echo(args: Any) -> Any:
    return args


async def _leaf(args: Any) -> Any:
    node = args
    while "n" in node:
        node = node["n"]
    return node["leaf"]


async def _rows(args: Any) -> Any:
    return args["rows"]


async def _text(args: Any) -> Any:
    return args["s"]


def _tools() -> list[ToolDefinition]:
    return [
        define_tool(
            name="echo", description="echo any arguments", parameters={}, output={"type": "json"}, execute=_echo
        ),
        define_tool(
            name="nested", description="nested schema", parameters=NESTED_SPEC, output={"type": "json"}, execute=_echo
        ),
        define_tool(
            name="text",
            description="one string",
            parameters={"s": {"type": "string", "required": True}},
            output=ToolOutput(schema={"type": "string"}),
            execute=_text,
        ),
        define_tool(
            name="deep_chain",
            description="1 000-level object schema",
            parameters=deep_chain_spec(),
            output={"type": "integer"},
            execute=_leaf,
        ),
        define_tool(
            name="deep_items",
            description="1 000-level array schema",
            parameters={"rows": {**deep_items_spec(), "required": True}},
            output=deep_items_spec(),
            execute=_rows,
        ),
        define_tool(
            name="passthrough",
            description="returns its 'value' argument as its output, checked against a string array",
            parameters={"value": {"type": "json", "required": True}},
            output={"type": "array", "items": {"type": "string"}},
            execute=_passthrough,
        ),
    ]


async def _passthrough(args: Any) -> Any:
    return args["value"]


_DEFINITIONS: list[ToolDefinition] | None = None


def build_runtime() -> ToolRuntime:
    """A fresh runtime holding the corpus tools (definitions are built once per session)."""
    global _DEFINITIONS
    if _DEFINITIONS is None:
        _DEFINITIONS = _tools()
    runtime = ToolRuntime()
    for definition in _DEFINITIONS:
        runtime.register(definition)
    return runtime
