"""An independent model of the argument checks, to compute what the corpus expects.

This re-states BEHAVIOUR §a (lossless JSON) and §c.4 (validation messages and
their order) in a few lines of plain recursive Python, for the shallow nested
schema the generators use. It deliberately shares no code with
``dsh_core._schema._validate`` or ``dsh_core._json``: if the two disagree,
the corpus case fails and one of them is wrong.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["arguments_message", "dollar_path", "expected_violations", "label", "quoted", "validator_path"]

Keys = tuple[str | int, ...]


def validator_path(keys: Keys) -> str:
    """The argument path the validator reports: ``config.servers[1].host`` (root: empty)."""
    path = ""
    for key in keys:
        if isinstance(key, int):
            path += f"[{key}]"
        elif key == "":
            path += '[""]'  # never blank, never a dangling dot
        else:
            path = f"{path}.{key}" if path else key
    return path


def label(path: str) -> str:
    return path or "arguments"


def quoted(path: str) -> str:
    """A path (or key) as a message quotes it: past 200 characters, its first 99 and last 100 around "…"."""
    return path if len(path) <= 200 else path[:99] + "…" + path[-100:]


def arguments_message(violations: list[str]) -> str:
    """The INVALID_ARGS message: the first 20 violations, then how many more there are."""
    shown = "; ".join(violations[:20])
    rest = len(violations) - 20
    return "invalid arguments: " + (f"{shown}; … and {rest} more" if rest > 0 else shown)


def dollar_path(keys: Keys) -> str:
    """The snapshot path of NonJsonValueError: ``$.config.servers[1].host``, odd keys quoted."""
    out = "$"
    for key in keys:
        if isinstance(key, int):
            out += f"[{key}]"
        elif key.isidentifier():
            out += f".{key}"
        else:
            out += "[" + json.dumps(key, ensure_ascii=False) + "]"
    return out


def _compact(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _same(a: object, b: object) -> bool:
    if type(a) is bool or type(b) is bool:
        return type(a) is type(b) and a == b
    return a == b and type(a) in (int, float, str, type(None)) and type(b) in (int, float, str, type(None))


def _is_integer(value: object) -> bool:
    return type(value) is int or (type(value) is float and value.is_integer())  # type: ignore[union-attr]


def expected_violations(schema: dict[str, Any], value: Any, keys: Keys = ()) -> list[str]:
    """Every violation of JSON ``value`` against the raw ``schema``, in the order §c.4 fixes."""
    path = validator_path(keys)
    where = f'"{quoted(label(path))}"'
    if "oneOf" in schema:
        matched = sum(not expected_violations(branch, value, keys) for branch in schema["oneOf"])
        return [] if matched == 1 else [f"{where} must match exactly one oneOf branch (matched {matched})"]
    kind = schema.get("type")
    if kind is None:
        return []
    if kind == "object":
        if type(value) is not dict:
            return [f"{where} must be an object"]
        properties = schema.get("properties", {})
        out = [
            f'missing required property "{quoted(validator_path((*keys, name)))}"'
            for name in schema.get("required", [])
            if name not in value
        ]
        for name, child in properties.items():
            if name in value:
                out += expected_violations(child, value[name], (*keys, name))
        if schema.get("additionalProperties") is False:
            out += [
                f'"{quoted(validator_path((*keys, name)))}" is not a declared property (additionalProperties: false)'
                for name in value
                if name not in properties
            ]
        return out
    if kind == "array":
        if type(value) is not list:
            return [f"{where} must be an array"]
        out = []
        if "items" in schema:
            for index, item in enumerate(value):
                out += expected_violations(schema["items"], item, (*keys, index))
        return out
    if kind == "number":
        if type(value) not in (int, float):
            return [f"{where} must be a number"]
    elif kind == "integer":
        if not _is_integer(value):
            return [f"{where} must be an integer"]
    elif kind == "string":
        if type(value) is not str:
            return [f"{where} must be a string"]
    elif kind == "boolean":
        if type(value) is not bool:
            return [f"{where} must be a boolean"]
    elif kind == "null" and value is not None:
        return [f"{where} must be null"]
    if "enum" in schema and not any(_same(value, entry) for entry in schema["enum"]):
        return [f"{where} must be one of {_compact(schema['enum'])}"]
    if "const" in schema and not _same(value, schema["const"]):
        return [f"{where} must be {_compact(schema['const'])}"]
    return []
