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
import sys
from collections.abc import Callable, Mapping
from typing import Final

from .._json import FrozenDict, frozen_copy, int_json_limit
from ._subset import ANNOTATION_KEYWORDS, JsonSchemaNode

__all__ = ["FlatReader", "compile_flat_reader"]

FlatReader = Callable[[object], "FrozenDict | None"]

_ROOT_KEYWORDS: Final = frozenset({"type", "properties", "required", "additionalProperties"}) | ANNOTATION_KEYWORDS
_PROPERTY_KEYWORDS: Final = frozenset({"type", "enum"}) | ANNOTATION_KEYWORDS
# The exact Python type each scalar schema type takes on the fast path; ``float``
# stands for ``number``, which also takes an ``int``. ``integer`` leaves
# integral floats to the general path, which knows they count.
_PYTHON_TYPE: Final[Mapping[str, type]] = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "null": type(None),
}
# Past this magnitude a float is inf (and NaN compares false): neither is JSON.
_MAX_FLOAT: Final = sys.float_info.max
_NO_INT_LIMIT: Final = math.inf


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
    kinds: dict[str, type] = {}
    enums: dict[str, frozenset[str]] = {}
    for name, node in schema.get("properties", {}).items():
        if not node.keys() <= _PROPERTY_KEYWORDS or node.get("type") not in _PYTHON_TYPE:
            return None
        kinds[name] = _PYTHON_TYPE[node["type"]]
        if "enum" in node:
            members = node["enum"]
            if kinds[name] is not str or any(type(member) is not str for member in members):
                return None
            enums[name] = frozenset(members)
    return _reader(kinds, enums, frozenset(schema.get("required", ())))


def _reader(kinds: dict[str, type], enums: dict[str, frozenset[str]], required: frozenset[str]) -> FlatReader:
    limit = int_json_limit() or _NO_INT_LIMIT
    # With every property required, a value of as many declared keys has them all: nothing to count.
    counting = required != kinds.keys()
    size = len(kinds)
    required_count = len(required)

    def read(value: object) -> FrozenDict | None:
        kind = type(value)
        if kind is not dict and kind is not FrozenDict:
            return None
        if not counting and len(value) != size:  # type: ignore[arg-type]
            return None
        present = 0
        for key, item in value.items():  # type: ignore[attr-defined]
            if type(key) is not str:
                return None  # checked first: looking up any other key could run its code
            expected = kinds.get(key)  # None for an undeclared key: maybe allowed, the general path knows
            item_kind = type(item)
            if item_kind is not expected and (expected is not float or item_kind is not int):
                return None
            if item_kind is int:
                if not -limit <= item <= limit:
                    return None
            elif item_kind is float:
                if not -_MAX_FLOAT <= item <= _MAX_FLOAT or (item == 0.0 and math.copysign(1.0, item) < 0):
                    return None
            elif enums and key in enums and item not in enums[key]:
                return None
            if counting and key in required:
                present += 1
        if counting and present != required_count:
            return None
        return value if kind is FrozenDict else frozen_copy(value)  # type: ignore[return-value,arg-type]

    return read
