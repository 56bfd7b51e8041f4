"""Contract fingerprints: a stable name for what a tool accepts and returns.

A session log outlives the code that wrote it. When a tool's parameter or
output schema changes, a logged call may no longer mean what it meant (its
arguments may not validate, its recorded content may follow an old shape), and
a replay or audit should be able to say so instead of presenting it as if
nothing had changed. :func:`contract_fingerprint` hashes the two schemas
together, so two definitions share a fingerprint exactly when they enforce the
same contract text.

The hash is over a canonical JSON text: keys sorted, no whitespace, ASCII
escapes, and an integral float written as the integer it equals (JSON Schema
treats ``1`` and ``1.0`` alike, so ``{"minimum": 1.0}`` and ``{"minimum": 1}``
fingerprint the same). The description, the name and the body are not part of
it: none of them changes which calls are valid or what their values look like.

It errs towards "changed": the schemas' annotations (a parameter's
``description``, a ``default``) and the order of ``required`` or ``enum``
entries are part of the text, so editing them changes the fingerprint though
the calls accepted stay the same. Constraints outside the schemas (the value
type of a ``dict[str, int]`` parameter, attrs validators, both enforced by
structuring) are not part of it.
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Final

from ._definition import ToolDefinition

__all__ = ["FINGERPRINT_PREFIX", "canonical_json", "contract_changed", "contract_fingerprint"]

FINGERPRINT_PREFIX: Final = "sha256:"

_SCALAR_TEXT: Final = {True: "true", False: "false", None: "null"}


def contract_fingerprint(definition: ToolDefinition) -> str:
    """``"sha256:<64 hex digits>"`` of ``definition``'s parameter and output schemas.

    Computed once per definition and kept on it.
    """
    if not isinstance(definition, ToolDefinition):
        raise TypeError(f"contract_fingerprint() takes a ToolDefinition, got {type(definition).__name__}")
    fingerprint = definition._fingerprint
    if fingerprint is None:
        text = canonical_json({"output": definition.output.schema, "parameters": definition.parameters})
        fingerprint = FINGERPRINT_PREFIX + hashlib.sha256(text.encode("ascii")).hexdigest()
        object.__setattr__(definition, "_fingerprint", fingerprint)
    return fingerprint


def contract_changed(tool: ToolDefinition | None, recorded: str | None) -> bool | None:
    """Whether ``tool`` now enforces another contract than the ``recorded`` fingerprint; ``None``: nothing to compare."""
    if tool is None or recorded is None:
        return None
    return contract_fingerprint(tool) != recorded


def canonical_json(value: object) -> str:
    """The canonical text of a JSON value (a snapshot), at any depth.

    Raises ``ValueError`` for a non-finite float and ``TypeError`` for anything
    that is not JSON (a snapshot has neither).
    """
    out: list[str] = []
    # A str on the stack is literal output; anything else is a value still to write.
    stack: list[object] = [_Pending(value)]
    while stack:
        item = stack.pop()
        if type(item) is str:
            out.append(item)
            continue
        assert isinstance(item, _Pending)
        current = item.value
        if isinstance(current, dict):
            stack.append("}")
            keys = sorted(current)
            for index in range(len(keys) - 1, -1, -1):
                key = keys[index]
                if type(key) is not str:
                    raise TypeError(f"object key {key!r} is not a str")
                stack.append(_Pending(current[key]))
                stack.append(("," if index else "") + json.dumps(key) + ":")
            stack.append("{")
        elif isinstance(current, (list, tuple)):
            stack.append("]")
            for index in range(len(current) - 1, -1, -1):
                stack.append(_Pending(current[index]))
                if index:
                    stack.append(",")
            stack.append("[")
        else:
            out.append(_scalar_text(current))
    return "".join(out)


class _Pending:
    """A value still to be written (kept apart from literal text on the work stack)."""

    __slots__ = ("value",)

    def __init__(self, value: object) -> None:
        self.value = value


def _scalar_text(value: object) -> str:
    if value is True or value is False or value is None:
        return _SCALAR_TEXT[value]
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} is not a JSON number")
        return str(int(value)) if value.is_integer() else repr(value)
    raise TypeError(f"{type(value).__name__} is not a JSON value")
