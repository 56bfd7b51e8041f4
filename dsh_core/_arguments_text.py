"""A tool call's arguments as the model emitted them: JSON text the runtime parses.

Providers hand a host each tool call's arguments as a JSON string. A host that
parses it itself has to invent what the model is told when the text is not
JSON; wrapped in :class:`ArgumentsText`, the text is parsed by the runtime, and
a text that does not parse fails the call ``INVALID_ARGS`` through the whole
pipeline (observers, audit and session logs see it) with a message the model
can act on. The commonest cause gets its own words: a text that ends before its
JSON does was cut off, usually at the model's output token limit, and the
model is told to send a smaller call instead of the same one again.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

import attrs

from ._errors import DshError, ErrorCode, NonJsonValueError
from ._json import FrozenDict, JsonValue, snapshot_json
from ._jsoncodec import decode_json

__all__ = ["ArgumentsJsonError", "ArgumentsText", "model_arguments"]

TRUNCATED_HINT: Final = (
    "the text ends before the JSON does, so the call was probably cut off at the output token limit; "
    "send a smaller call (split large content over several calls) rather than the same one again"
)


class ArgumentsJsonError(DshError, ValueError):
    """The arguments text of a call is not one JSON document (code ``INVALID_ARGS``)."""

    code = ErrorCode.INVALID_ARGS.value


def _text(instance: object, attribute: attrs.Attribute[str], value: object) -> None:
    if type(value) is not str:
        raise TypeError(f"ArgumentsText takes the JSON text as a str, got {type(value).__name__}")


_UNPARSED: Final = object()


@attrs.frozen(slots=True)
class ArgumentsText:
    """``ToolExecutionInput(arguments=ArgumentsText(raw))``: let the runtime parse the model's JSON text.

    An empty (or all-whitespace) text means no arguments, ``{}``, as several
    providers send for a tool without parameters. The text is parsed once,
    whoever asks first (the scheduler classifying the call, the session
    recorder, the pipeline).
    """

    text: str = attrs.field(validator=_text)
    # The frozen arguments, or the message of the error the text gives; set on first decode().
    _parsed: Any = attrs.field(init=False, default=_UNPARSED, eq=False, repr=False)

    def decode(self) -> JsonValue:
        """The parsed arguments, as a frozen snapshot (deep documents included).

        Raises:
            ArgumentsJsonError: the text is not one JSON document; the message
                says where and, when the text stops early, that it was cut off.
            NonJsonValueError: the JSON holds a value that is not lossless
                (a number too large for a float, say).
        """
        parsed = self._parsed
        if parsed is _UNPARSED:
            parsed = _parse(self.text)
            object.__setattr__(self, "_parsed", parsed)
        if isinstance(parsed, _Problem):
            raise ArgumentsJsonError(parsed.message)
        return parsed  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        shown = self.text if len(self.text) <= 60 else self.text[:59] + "…"
        return f"ArgumentsText({shown!r})"


@attrs.frozen(slots=True)
class _Problem:
    message: str


def _parse(text: str) -> JsonValue | _Problem:
    if not text.strip():
        return FrozenDict()
    try:
        value = decode_json(text)
    except json.JSONDecodeError as exc:
        truncated = _ends_early(text, exc)
        where = f"{exc.msg} (character {exc.pos} of {len(text)})"
        return _Problem(f"arguments are not valid JSON: {where}" + (f": {TRUNCATED_HINT}" if truncated else ""))
    except ValueError as exc:
        return _Problem(f"arguments are not valid JSON: {exc}")
    return snapshot_json(value)


# What is left where the parser stopped, when a number was cut after its sign, point or exponent.
_CUT_NUMBER: Final = re.compile(r"-|\.|[eE][+-]?")
_LITERALS: Final = ("true", "false", "null")
# ... and where the text stops in or right after a \uXXXX escape (a surrogate pair cut in two).
_CUT_ESCAPE: Final = re.compile(r"\\?u[0-9a-fA-F]{0,4}")


def _ends_early(text: str, error: json.JSONDecodeError) -> bool:
    """Whether ``text`` is a valid JSON document cut short (rather than one with a mistake in it)."""
    if error.msg.startswith("Unterminated string"):
        return True
    rest = text[error.pos :].rstrip()
    if error.msg.startswith("Invalid \\uXXXX escape"):
        return _CUT_ESCAPE.fullmatch(rest) is not None
    return (
        not rest
        or _CUT_NUMBER.fullmatch(rest) is not None
        or any(literal != rest and literal.startswith(rest) for literal in _LITERALS)
    )


def model_arguments(arguments: object) -> object:
    """``arguments``, with an :class:`ArgumentsText` parsed (left as it is when its text is not JSON).

    For the code that looks at a request before the pipeline does (scheduling
    classifiers, the session recorder): a text that does not parse stays an
    ``ArgumentsText``, which no schema accepts, so the call is classified like
    any other invalid one and fails ``INVALID_ARGS`` when it runs.
    """
    if type(arguments) is not ArgumentsText:
        return arguments
    try:
        return arguments.decode()
    except (ArgumentsJsonError, NonJsonValueError):
        return arguments

