"""``http_status_lookup``: the reason phrase and class of an HTTP status code, from an offline table."""

from __future__ import annotations

import http
from typing import Any

from dsh_core import DshError, TextBlock, ToolDefinition, ToolEffects, ToolOutput, define_tool

CLASSES = {1: "informational", 2: "success", 3: "redirection", 4: "client error", 5: "server error"}

# The stdlib's registry (RFC 9110 and friends), frozen at import: no network, no state.
PHRASES: dict[int, str] = {status.value: status.phrase for status in http.HTTPStatus}


class UnknownStatusError(DshError):
    """A number that is not an HTTP status code at all (outside 100-599)."""

    code = "UNKNOWN_STATUS"


def lookup(code: int) -> dict[str, Any]:
    """``{code, phrase, class, registered}``; ``phrase`` is ``None`` for an unregistered code of a valid class."""
    if not 100 <= code <= 599:
        raise UnknownStatusError(f"{code} is not an HTTP status code (they run from 100 to 599)")
    phrase = PHRASES.get(code)
    return {"code": code, "phrase": phrase, "class": CLASSES[code // 100], "registered": phrase is not None}


async def _run(args: Any) -> dict[str, Any]:
    return lookup(int(args["code"]))


def _render(args: Any, value: Any) -> list[TextBlock]:
    phrase = value["phrase"] or "(no registered reason phrase)"
    return [TextBlock(f"{value['code']} {phrase}: {value['class']}")]


def http_status_tool() -> ToolDefinition:
    """The ``http_status_lookup`` definition (pure and parallel-safe)."""
    return define_tool(
        name="http_status_lookup",
        description="Look up the reason phrase and class (success, client error, ...) of an HTTP status code.",
        parameters={"code": {"type": "integer", "required": True, "description": "The status code, e.g. 404."}},
        output=ToolOutput(
            schema={
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "code": {"type": "integer", "required": True},
                    "phrase": {"oneOf": [{"type": "string"}, {"type": "null"}], "required": True},
                    "class": {
                        "type": "string",
                        "enum": list(CLASSES.values()),
                        "required": True,
                    },
                    "registered": {"type": "boolean", "required": True},
                },
            },
            render=_render,
        ),
        execute=_run,
        is_concurrency_safe=lambda args: True,
        effects=ToolEffects(read_only=True),
    )
