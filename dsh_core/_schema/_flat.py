"""One pass that checks and freezes a flat argument object.

Most tools take a flat object of scalars (``{"a": 1, "b": 2}``), which the
general path handles in two walks: ``snapshot_json`` copies and checks it is
lossless JSON, then the compiled validator checks the copy against the schema.
For a parameter schema simple enough to read at a glance (an object of scalar
properties, each with a ``type`` and perhaps a string ``enum``), both questions
have the same cheap answer per entry, so :func:`compile_flat_reader` builds a
reader that answers them in one loop and copies the object once.

The reader only ever says *yes* when both walks would: it returns the frozen
snapshot of a value that is lossless JSON and valid, and ``None`` for anything
else, an invalid value or merely an unusual one (an integral ``1.0`` for an
``integer``, an unknown property the schema allows), which then takes the
general path and gets its full report. The test suite checks that agreement
on generated schemas and values.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Final

from .._json import FrozenDict, frozen_copy, int_fits_json
from ._subset import ANNOTATION_KEYWORDS, JsonSchemaNode

__all__ = ["FlatReader", "compile_flat_reader"]

FlatReader = Callable[[object], "FrozenDict | None"]

_ROOT_KEYWORDS: Final = frozenset({"type", "properties", "required", "additionalProperties"}) | ANNOTATION_KEYWORDS
_PROPERTY_KEYWORDS: Final = frozenset({"type", "enum"}) | ANNOTATION_KEYWORDS
# The Python types each scalar schema type takes on the fast path. ``integer``
# leaves integral floats to the general path, which knows they count.
_PYTHON_TYPES: Final[Mapping[str, frozenset[type]]] = {
    "string": frozenset({str}),
    "integer": frozenset({int}),
    "number": frozenset({int, float}),
    "boolean": frozenset({bool}),
    "null": frozenset({type(None)}),
}


def compile_flat_reader(schema: JsonSchemaNode) -> FlatReader | None:
    """A one-pass check-and-freeze for ``schema``'s simplest values, or ``None`` when it has none.

    ``schema`` must already be an asserted snapshot of the enforced subset. The
    reader exists for an object schema whose properties are all scalars with a
    ``type`` (and, for strings, perhaps an ``enum``): it returns the
    ``FrozenDict`` snapshot of a value that is an exact ``dict`` (or a
    ``FrozenDict``) holding only declared properties, every one of its type,
    every required one present; ``None`` for any other value.
    """
    if schema.get("type") != "object" or not schema.keys() <= _ROOT_KEYWORDS:
        return None
    fields: dict[str, tuple[frozenset[type], frozenset[str] | None]] = {}
    for name, node in schema.get("properties", {}).items():
        field = _field(node)
        if field is None:
            return None
        fields[name] = field
    required = frozenset(schema.get("required", ()))
    return _reader(fields, required)


def _field(node: Mapping[str, Any]) -> tuple[frozenset[type], frozenset[str] | None] | None:
    if not node.keys() <= _PROPERTY_KEYWORDS:
        return None
    python_types = _PYTHON_TYPES.get(node.get("type"))  # type: ignore[arg-type]
    if python_types is None:
        return None
    if "enum" not in node:
        return python_types, None
    members = node["enum"]
    if python_types is not _PYTHON_TYPES["string"] or any(type(member) is not str for member in members):
        return None
    return python_types, frozenset(members)


def _reader(fields: dict[str, tuple[frozenset[type], frozenset[str] | None]], required: frozenset[str]) -> FlatReader:
    required_count = len(required)

    def read(value: object) -> FrozenDict | None:
        kind = type(value)
        if kind is not dict and kind is not FrozenDict:
            return None
        present = 0
        for key, item in value.items():  # type: ignore[attr-defined]
            if type(key) is not str:
                return None  # checked first: hashing any other key could run its code
            field = fields.get(key)
            if field is None:
                return None  # undeclared: maybe allowed, maybe not; the general path knows
            item_kind = type(item)
            if item_kind not in field[0]:
                return None
            if item_kind is int:
                if not int_fits_json(item):
                    return None
            elif item_kind is float:
                if not math.isfinite(item) or (item == 0.0 and math.copysign(1.0, item) < 0):
                    return None
            elif field[1] is not None and item not in field[1]:
                return None
            if key in required:
                present += 1
        if present != required_count:
            return None
        return value if kind is FrozenDict else frozen_copy(value)  # type: ignore[return-value,arg-type]

    return read
