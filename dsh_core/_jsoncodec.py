"""Stack-safe, strict JSON text: one codec for every place the project reads or writes it.

``encode_json``/``decode_json`` use the C encoder and decoder and fall back to
iterative ones when a document is too deep for them, so values nested
thousands of levels deep round-trip instead of raising ``RecursionError``.
``NaN``/``Infinity`` are refused both ways.

Standard library only, and no package-relative import: the Code Mode child
(:mod:`dsh_core.code_mode._child`) runs in a bare interpreter and loads this
file by path, so both ends of its pipe speak exactly this codec.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from typing import Any, Final, NoReturn

__all__ = [
    "IntegerTooLongError",
    "decode_json",
    "dumps_text",
    "encode_json",
    "holds_only_scalars",
    "integer_too_long",
    "syntax_error_beyond",
]

# json.dumps and json.loads with options build an encoder or decoder per call; every frame of
# every sub-call goes through these, so both ends reuse prebuilt ones.
_ENCODERS: Final = {
    ascii_only: json.JSONEncoder(ensure_ascii=ascii_only, separators=(",", ":"), allow_nan=False).encode
    for ascii_only in (True, False)
}


def encode_json(value: object, *, ascii_only: bool = True) -> str:
    """Compact JSON for ``value``; ``NaN``/``inf`` raise ``ValueError``.

    Callers pass values already checked to be JSON (``str`` keys): the C
    encoder would turn an ``int`` key into a string, the deep path refuses it.
    """
    try:
        return _ENCODERS[ascii_only](value)
    except RecursionError:
        return _encode_deep(value, ascii_only)


# json.dumps builds an encoder per call; the common case (no indent) reuses one with its settings.
_DUMPS_ENCODER: Final = json.JSONEncoder(ensure_ascii=False, allow_nan=False).encode


def dumps_text(value: object, *, indent: int | None = None) -> str:
    """``json.dumps`` text for people (non-ASCII kept, ``NaN`` refused), at any depth.

    A value too deep for the C encoder comes out compact, from the iterative one.
    """
    try:
        if indent is None:
            return _DUMPS_ENCODER(value)
        return json.dumps(value, ensure_ascii=False, allow_nan=False, indent=indent)
    except RecursionError:
        return _encode_deep(value, ascii_only=False)


def _encode_deep(value: object, ascii_only: bool) -> str:
    """Compact JSON for ``value`` with an explicit stack: any depth, no ``RecursionError``."""
    out: list[str] = []
    # (True, text) is literal output; (False, value) is a value still to encode.
    tasks: list[tuple[bool, object]] = [(False, value)]
    while tasks:
        literal, item = tasks.pop()
        if literal:
            out.append(item)  # type: ignore[arg-type]
        elif isinstance(item, dict):
            entries = list(item.items())
            tasks.append((True, "}"))
            for index in range(len(entries) - 1, -1, -1):
                key, child = entries[index]
                if not isinstance(key, str):
                    raise TypeError(f"object key {key!r} is not a str")
                tasks.append((False, child))
                tasks.append((True, ("," if index else "") + json.dumps(key, ensure_ascii=ascii_only) + ":"))
            tasks.append((True, "{"))
        elif isinstance(item, (list, tuple)):
            tasks.append((True, "]"))
            for index in range(len(item) - 1, -1, -1):
                tasks.append((False, item[index]))
                if index:
                    tasks.append((True, ","))
            tasks.append((True, "["))
        else:
            out.append(json.dumps(item, ensure_ascii=ascii_only, allow_nan=False))
    return "".join(out)


_SCALAR_KINDS: Final = frozenset({str, int, float, bool, type(None)})


def holds_only_scalars(items: Sequence[Any], int_limit: int | None) -> bool:
    """Whether every item of an array is a lossless JSON scalar (no container), tested over the whole array in C.

    Its set of item types, the range of its ints (``int_limit``: the largest
    magnitude JSON text may carry here, ``None`` for no limit) and the
    finiteness of its floats; only zeros among floats (``-0.0`` is no JSON
    value) and ints mixed with other kinds are looked at one by one. False for
    an array holding a problem too: the caller's walk then names its path.
    Shared by the host's snapshot and the Code Mode child's check.
    """
    kinds = set(map(type, items))
    if not kinds <= _SCALAR_KINDS:
        return False
    if int in kinds and int_limit is not None:
        ints = items if len(kinds) == 1 else [item for item in items if type(item) is int]
        if min(ints) < -int_limit or max(ints) > int_limit:
            return False
    if float in kinds:
        floats = items if len(kinds) == 1 else [item for item in items if type(item) is float]
        if not all(map(math.isfinite, floats)):
            return False
        if 0.0 in floats and any(item == 0.0 and math.copysign(1.0, item) < 0 for item in floats):
            return False
    return True


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a JSON number")


_DECODE: Final = json.JSONDecoder(parse_constant=_reject_constant).decode


class IntegerTooLongError(ValueError):
    """Valid JSON holding an integer with more digits than the interpreter converts (``sys.get_int_max_str_digits``).

    Python's own message calls it a conversion limit and tells the reader to
    call ``sys.set_int_max_str_digits()``: no help to a CLI user or a model.
    """


def _zero(digits: str) -> int:
    return 0


_DECODE_INTS_AS_ZERO: Final = json.JSONDecoder(parse_int=_zero).decode


def syntax_error_beyond(document: str) -> json.JSONDecodeError | None:
    """The syntax error of ``document`` when its integers are left unconverted, or None (valid, or too deep to tell).

    The integer-digits limit stops the parser at the first long integer, before it
    sees that the text is cut off further on: that is what to report then.
    """
    try:
        _DECODE_INTS_AS_ZERO(document)
    except json.JSONDecodeError as exc:
        return exc
    except (ValueError, RecursionError):
        return None
    return None


def integer_too_long(exc: ValueError) -> IntegerTooLongError | None:
    """``exc`` said in this project's words when it is the interpreter's integer-digits limit, else None."""
    text = str(exc)
    if isinstance(exc, IntegerTooLongError):
        return exc
    if not text.startswith("Exceeds the limit (") or "for integer string conversion" not in text:
        return None
    import sys

    digits = text.partition("value has ")[2].partition(" digits")[0]
    size = f"an integer of {digits} digits" if digits.isdigit() else "an integer"
    return IntegerTooLongError(f"{size}, longer than the {sys.get_int_max_str_digits()} digits accepted")


def decode_json(text: str) -> Any:
    """Parse one JSON document; ``NaN``/``Infinity`` and malformed text raise ``ValueError``.

    Raises:
        IntegerTooLongError: (a ``ValueError``) the text holds an integer too long to convert.
        ValueError: the text is not one JSON document.
    """
    try:
        return _DECODE(text)
    except RecursionError:
        try:
            return _decode_deep(text)
        except ValueError as exc:
            raise integer_too_long(exc) or exc from None
    except json.JSONDecodeError:
        raise
    except ValueError as exc:
        too_long = integer_too_long(exc)
        if too_long is None:
            raise
        raise syntax_error_beyond(text) or too_long from None


# The C string scanner the json module itself uses (typeshed does not declare it).
_scanstring: Final[Callable[[str, int, bool], tuple[str, int]]] = json.decoder.scanstring  # type: ignore[attr-defined]
_WORDS = {"true": True, "false": False, "null": None}


def _decode_deep(text: str) -> Any:
    """An iterative JSON parser for documents too deep for the C decoder."""
    import re  # only for such documents: keep it out of the child's start-up

    _SPACE = re.compile(r"[ \t\n\r]*")
    _NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?")
    containers: list[list[Any] | dict[str, Any]] = []
    keys: list[str] = []

    def skip(position: int) -> int:
        match = _SPACE.match(text, position)
        assert match is not None
        return match.end()

    def key_at(position: int) -> tuple[str, int]:
        if text[position : position + 1] != '"':
            raise ValueError(f"expected an object key at {position}")
        key, position = _scanstring(text, position + 1, True)
        position = skip(position)
        if text[position : position + 1] != ":":
            raise ValueError(f"expected ':' at {position}")
        return key, skip(position + 1)

    position = skip(0)
    while True:
        char = text[position : position + 1]
        value: Any
        if char == "{":
            position = skip(position + 1)
            if text[position : position + 1] != "}":
                key, position = key_at(position)
                containers.append({})
                keys.append(key)
                continue
            value, position = {}, position + 1
        elif char == "[":
            position = skip(position + 1)
            if text[position : position + 1] != "]":
                containers.append([])
                keys.append("")
                continue
            value, position = [], position + 1
        elif char == '"':
            value, position = _scanstring(text, position + 1, True)
        elif (number := _NUMBER.match(text, position)) is not None:
            value = float(number.group()) if number.group(1) or number.group(2) else int(number.group())
            position = number.end()
        else:
            for word, constant in _WORDS.items():
                if text.startswith(word, position):
                    value, position = constant, position + len(word)
                    break
            else:
                raise ValueError(f"unexpected character at {position}")
        # A value is complete: hand it up, closing every container it ends.
        while True:
            if not containers:
                if skip(position) != len(text):
                    raise ValueError(f"extra data at {position}")
                return value
            parent = containers[-1]
            if isinstance(parent, list):
                parent.append(value)
            else:
                parent[keys[-1]] = value
            position = skip(position)
            char = text[position : position + 1]
            if char == ",":
                position = skip(position + 1)
                if isinstance(parent, dict):
                    keys[-1], position = key_at(position)
                break
            if char != ("]" if isinstance(parent, list) else "}"):
                raise ValueError(f"expected ',' or a closing bracket at {position}")
            position += 1
            value = containers.pop()
            keys.pop()
