"""A tool call's arguments as the model emitted them: JSON text the runtime parses.

Providers hand a host each tool call's arguments as a JSON string. A host that
parses it itself has to invent what the model is told when the text is not
JSON; wrapped in :class:`ArgumentsText`, the text is parsed by the runtime, and
a text that does not parse fails the call ``INVALID_ARGS`` through the whole
pipeline (observers, audit and session logs see it) with a message the model
can act on. The commonest cause gets its own words: a text that ends before its
JSON does was cut off, usually at the model's output token limit, and the
model is told to send a smaller call instead of the same one again.

Only JSON's own whitespace (space, tab, line feed, carriage return) counts as
whitespace: a text of nothing else is "no arguments", ``{}``, and anything else
after the document (a form feed, a no-break space, U+2028) is extra text, not a
sign the call was cut off. An object that repeats a key (``{"a": 1, "a": 2}``)
is refused: parsers disagree on which value wins, so a policy or log that read
the text one way could pass a call the tool reads the other way.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any, Final, NoReturn

import attrs

from ._errors import QUOTED_CHARS, DshError, ErrorCode, NonJsonValueError
from ._json import FrozenDict, JsonValue, snapshot_json
from ._jsoncodec import decode_json, integer_too_long, syntax_error_beyond

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

    An empty (or all JSON whitespace) text means no arguments, ``{}``, as several
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
            ArgumentsJsonError: the text is not one JSON document (or an object
                in it repeats a key); the message says where and, when the text
                stops early, that it was cut off.
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


# JSON's whitespace; str.strip() and str.isspace() know many more characters.
_JSON_SPACE: Final = " \t\n\r"


class _RepeatedKeyError(ValueError):
    """An object of the document gives a key twice."""

    def __init__(self, key: str) -> None:
        # The key is the model's own, any length: quoted in full it could be megabytes. The
        # ellipsis goes between the quoted ends, not into the quoting (which would escape it).
        if len(key) <= QUOTED_CHARS:
            quoted = json.dumps(key)
        else:
            head = (QUOTED_CHARS - 1) // 2
            tail = QUOTED_CHARS - 1 - head
            quoted = json.dumps(key[:head])[:-1] + "…" + json.dumps(key[-tail:])[1:]
        super().__init__(f"arguments give the key {quoted} twice in one object; send each key once")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    value = dict(pairs)
    if len(value) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _RepeatedKeyError(key)
            seen.add(key)
    return value


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a JSON number")


# decode_json's strict decoder, refusing repeated keys too.
_DECODE: Final = json.JSONDecoder(parse_constant=_reject_constant, object_pairs_hook=_unique_keys).decode


def _parse(text: str) -> JsonValue | _Problem:
    if not text.strip(_JSON_SPACE):
        return FrozenDict()
    try:
        value = _decode(text)
    except json.JSONDecodeError as exc:
        return _not_json(text, exc.msg, exc.pos)
    except _RepeatedKeyError as exc:
        return _Problem(str(exc))
    except ValueError as exc:
        too_long = integer_too_long(exc)
        if too_long is not None:
            broken = syntax_error_beyond(text)
            if broken is not None:  # cut off, too: the advice for a cut-off call is what helps
                return _not_json(text, broken.msg, broken.pos)
            return _Problem(f"arguments hold {too_long}")
        # The iterative parser of documents too deep for the C one says where it stopped
        # in its own words: read the position back to tell a cut-off text from a mistake.
        deep = _DEEP_ERROR.fullmatch(str(exc))
        if deep is not None:
            return _not_json(text, deep.group(1), int(deep.group(2)))
        return _Problem(f"arguments are not valid JSON: {exc}")
    return snapshot_json(value)


def _decode(text: str) -> Any:
    try:
        return _DECODE(text)
    except RecursionError:
        pass
    # Too deep for the C decoder: the codec's iterative parser, then a look for repeated keys
    # (its own objects keep the last value of a key).
    value = decode_json(text)
    key = _repeated_key(text)
    if key is not None:
        raise _RepeatedKeyError(key)
    return value


# Where the codec's iterative parser stopped: "unexpected character at 12".
_DEEP_ERROR: Final = re.compile(r"(.+) at ([0-9]+)")
_STRUCTURE: Final = re.compile(r'[{}\[\],"]')
# The C string scanner the json module itself uses (typeshed does not declare it).
_scanstring: Final[Callable[[str, int, bool], tuple[str, int]]] = json.decoder.scanstring  # type: ignore[attr-defined]


def _repeated_key(text: str) -> str | None:
    """The first key an object of ``text`` (a valid JSON document) gives twice, at any depth."""
    keys: list[set[str] | None] = []  # per open container: its keys so far (None for an array)
    expecting_key = False
    position = 0
    while (found := _STRUCTURE.search(text, position)) is not None:
        char, position = found.group(), found.end()
        if char == '"':
            string, position = _scanstring(text, position, True)
            seen = keys[-1] if expecting_key else None
            if seen is not None:
                if string in seen:
                    return string
                seen.add(string)
            expecting_key = False
        elif char in "{[":
            keys.append(set() if char == "{" else None)
            expecting_key = char == "{"
        elif char in "}]":
            keys.pop()
            expecting_key = False
        else:  # a comma: a key comes next inside an object
            expecting_key = keys[-1] is not None
    return None


def _not_json(text: str, message: str, position: int) -> _Problem:
    where = f"{message} (character {position} of {len(text)})"
    hint = f": {TRUNCATED_HINT}" if _ends_early(text, message, position) else ""
    return _Problem(f"arguments are not valid JSON: {where}{hint}")


# What is left where the parser stopped, when a number was cut after its sign, point or exponent.
_CUT_NUMBER: Final = re.compile(r"-|\.|[eE][+-]?")
_LITERALS: Final = ("true", "false", "null")
# ... and where the text stops in or right after a \uXXXX escape (a surrogate pair cut in two).
_CUT_ESCAPE: Final = re.compile(r"\\?u[0-9a-fA-F]{0,4}")


def _ends_early(text: str, message: str, position: int) -> bool:
    """Whether ``text`` is a valid JSON document cut short (rather than one with a mistake in it)."""
    if message.startswith("Unterminated string"):
        return True
    if message.lower().startswith("extra data"):
        # The document is complete: what follows it is a mistake, whatever it looks like.
        return False
    rest = text[position:].rstrip(_JSON_SPACE)
    if message.startswith("Invalid \\uXXXX escape"):
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
