"""Lossless JSON values: the one materialisation boundary of the pipeline.

Every walk here uses an explicit work stack, never Python recursion, so values
nested hundreds of thousands of levels deep snapshot, thaw, compare (with
:func:`json_equal`, and ``FrozenDict.__eq__``, which uses it), hash and print
without reaching the interpreter's recursion limit. Arrays are plain tuples:
``==`` between two of them is Python's own tuple comparison, recursive and not
JSON-strict (``(True,) == (1,)``); compare arrays with :func:`json_equal`.
"""

from __future__ import annotations

import json
import math
import reprlib
import sys
from collections.abc import Iterator, Mapping
from typing import Any, NoReturn, TypeAlias, Union

from ._errors import QUOTED_CHARS, NonJsonValueError, elide_middle
from ._jsoncodec import dumps_text, holds_only_scalars

__all__ = [
    "FrozenDict",
    "FrozenList",
    "JsonValue",
    "json_equal",
    "json_path",
    "json_text",
    "nests_deeper_than",
    "snapshot_json",
    "thaw",
]

FrozenList: TypeAlias = tuple["JsonValue", ...]
JsonValue: TypeAlias = Union[bool, int, float, str, FrozenList, "FrozenDict", None]

_NUMBERS = (int, float)


def json_path(keys: list[str | int] | tuple[str | int, ...], root: str = "$") -> str:
    """Spell a JSON path: ``$.items[3].x``; keys that are not identifiers are quoted."""
    parts = [root]
    for key in keys:
        if isinstance(key, int):
            parts.append(f"[{key}]")
        elif key.isidentifier():
            parts.append(f".{key}")
        else:
            parts.append(f"[{json.dumps(key, ensure_ascii=False)}]")
    return "".join(parts)


class FrozenDict(dict[str, "JsonValue"]):
    """A read-only, hashable JSON object that keeps its key order.

    It is a ``dict`` subclass, so ``json.dumps``, ``**`` unpacking and every
    ``isinstance(x, dict)`` check keep working at full speed, but each mutating
    method raises ``TypeError``. Constructing one snapshots its input, so a
    ``FrozenDict`` only ever holds lossless JSON; ``snapshot_json`` therefore
    returns an existing one as is. Equality and hashing walk iteratively, so
    values nested 100 000 levels deep compare without ``RecursionError``; they
    follow JSON rather than Python's numeric tower (``True`` is not ``1``).
    """

    __slots__ = ("_hash",)

    _hash: int | None

    def __new__(cls, source: Mapping[str, Any] | None = None, /, **kwargs: Any) -> FrozenDict:
        if source is None and not kwargs:
            return _EMPTY
        merged = dict(source or {}, **kwargs)
        value = snapshot_json(merged)
        assert isinstance(value, FrozenDict)
        return value

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Content was filled in by __new__; dict.__init__ would re-insert it.
        pass

    def _immutable(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("FrozenDict is immutable; thaw() it for a mutable copy")

    __setitem__ = _immutable
    __delitem__ = _immutable
    __ior__ = _immutable
    clear = _immutable
    pop = _immutable
    popitem = _immutable
    setdefault = _immutable
    update = _immutable

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if isinstance(other, dict):
            return json_equal(self, other)
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        if isinstance(other, dict):
            return not json_equal(self, other)
        return NotImplemented

    def __hash__(self) -> int:  # type: ignore[override]
        cached = self._hash
        if cached is None:
            cached = _json_hash(self)
            self._hash = cached
        return cached

    def __repr__(self) -> str:
        try:
            return f"FrozenDict({dict.__repr__(self)})"
        except RecursionError:
            # Too deep for the builtin repr: the same content, as JSON text.
            return f"FrozenDict({json_text(self)})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenDict, (thaw(self),))

    def __copy__(self) -> FrozenDict:
        return self

    def __deepcopy__(self, memo: object) -> FrozenDict:
        return self

    def __or__(self, other: Mapping[str, Any]) -> FrozenDict:  # type: ignore[override]
        merged = dict(self)
        merged.update(other)
        value = snapshot_json(merged)
        assert isinstance(value, FrozenDict)
        return value


_dict_new = dict.__new__
_dict_update = dict.update


def frozen_copy(source: dict[str, JsonValue]) -> FrozenDict:
    """A ``FrozenDict`` of ``source``'s entries, which must already be lossless JSON (no checks)."""
    frozen = _dict_new(FrozenDict)
    _dict_update(frozen, source)
    frozen._hash = None
    return frozen


_EMPTY = frozen_copy({})


_REPR = reprlib.Repr()
_REPR.maxstring = 80
_REPR.maxother = 80


def json_repr(value: object) -> str:
    """``repr(value)`` of a snapshot, or its JSON text when it nests too deep for the builtin repr.

    For attrs classes' ``repr=`` of JSON fields: a model's array 5 000 levels deep
    made ``repr(result)`` (and a failing test's message) raise ``RecursionError``.
    """
    try:
        return repr(value)
    except RecursionError:
        try:
            return json_text(value)  # type: ignore[arg-type]
        except Exception:  # not JSON after all (a caller's input): bounded, whatever it is
            return safe_repr(value)


def safe_repr(value: object) -> str:
    """A bounded repr that survives hostile ``__repr__`` methods and values nested arbitrarily deep."""
    try:
        return _REPR.repr(value)
    except Exception:
        return f"<{_describe(value)}>"


def _reject(message: str, keys: list[str | int]) -> NonJsonValueError:
    path = json_path(keys)
    # The keys can be a model's, any length: the message quotes the path's ends only.
    return NonJsonValueError(f"{elide_middle(path, QUOTED_CHARS)}: {message}", path=path)


def _describe(value: object) -> str:
    kind = type(value)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


# Python refuses to print (and so to serialise) ints with more digits than this,
# so a larger int could never leave the process as JSON: it is not lossless.
# (0 means the interpreter was configured without a limit.)
_MAX_DIGITS = sys.get_int_max_str_digits()
_MAX_JSON_INT = 10**_MAX_DIGITS - 1 if _MAX_DIGITS else None


def int_json_limit() -> int | None:
    """The largest magnitude an int written as JSON text may have here (``None``: no limit)."""
    return _MAX_JSON_INT


def int_fits_json(value: int) -> bool:
    """Whether ``value`` has few enough digits to be written as JSON text here."""
    return _MAX_JSON_INT is None or -_MAX_JSON_INT <= value <= _MAX_JSON_INT


def int_json_problem(value: int) -> str | None:
    """Why ``value`` cannot be written as JSON text, or None when it can."""
    if not int_fits_json(value):
        return f"an int of {value.bit_length()} bits has more digits than JSON text can carry here"
    return None


def _scalar_problem(value: object) -> str | None:
    """Why a non-container value is not lossless JSON, or None when it is."""
    kind = type(value)
    if kind is int:
        return int_json_problem(value)  # type: ignore[arg-type]
    if kind is str or kind is bool or value is None:
        return None
    if kind is float:
        if math.isnan(value) or math.isinf(value):  # type: ignore[arg-type]
            return f"{value!r} is not a finite JSON number"
        if value == 0.0 and math.copysign(1.0, value) < 0:
            return "-0.0 has no lossless JSON form"
        return None
    if isinstance(value, bool):
        return f"bool subclass {_describe(value)} is not JSON"
    if isinstance(value, (int, str, float)):
        # Name the JSON-like builtin it derives from, not its direct base (IntEnum -> int).
        base = next(base for base in (int, float, str) if isinstance(value, base))
        return f"subclass {_describe(value)} of {base.__name__} is not JSON"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "bytes are not JSON (decode them to str first)"
    if isinstance(value, (set, frozenset)):
        return "sets are not JSON (use a list)"
    return f"{_describe(value)} is not a JSON value"


def snapshot_json(value: object) -> JsonValue:
    """Deep-copy ``value`` into immutable lossless JSON.

    Objects become :class:`FrozenDict` and arrays become ``tuple``; key order is
    kept. Only exact ``dict`` (or ``FrozenDict``) objects with ``str`` keys,
    ``list``/``tuple`` arrays, ``str``, ``int``, finite non-negative-zero
    ``float``, ``bool`` and ``None`` are accepted: subclasses, ``NaN``,
    ``±inf``, ``-0.0``, ``bytes``, sets, cycles and every other object raise
    :class:`NonJsonValueError` naming the JSON path. A ``FrozenDict`` is already
    a snapshot and is returned as is.
    """
    kind = type(value)
    if kind is str or kind is bool or value is None or kind is FrozenDict:
        return value  # type: ignore[return-value]
    if kind is int and (_MAX_JSON_INT is None or -_MAX_JSON_INT <= value <= _MAX_JSON_INT):
        return value  # type: ignore[return-value]
    if kind is int or kind is float:
        problem = _scalar_problem(value)
        if problem is not None:
            raise _reject(problem, [])
        return value  # type: ignore[return-value]
    if kind is dict and is_flat_json_object(value):  # type: ignore[arg-type]
        # The common argument object, every value a plain scalar: copy it in one go.
        return frozen_copy(value)  # type: ignore[arg-type]
    if (kind is list or kind is tuple) and _is_flat_json_array(value):  # type: ignore[arg-type]
        return tuple(value)  # type: ignore[arg-type]
    if kind is dict or kind is list or kind is tuple:
        return _snapshot_container(value)
    raise _reject(_scalar_problem(value) or f"{_describe(value)} is not a JSON value", [])


def _is_flat_json_array(value: list[Any] | tuple[Any, ...]) -> bool:
    """Whether every item is a lossless scalar (no container): the array is copied in one go.

    A program's million numbers were checked one by one through the general walk
    (1.7 s on the event loop); :func:`holds_only_scalars` tests them in C-level passes.
    """
    return holds_only_scalars(value, _MAX_JSON_INT)


def is_flat_json_object(value: dict[Any, Any]) -> bool:
    """Whether every key is a ``str`` and every value a lossless scalar (no container)."""
    limit = _MAX_JSON_INT
    for key, item in value.items():
        if type(key) is not str:
            return False
        item_kind = type(item)
        if item_kind is str or item_kind is bool or item is None:
            continue
        if item_kind is int:
            if limit is not None and not -limit <= item <= limit:
                return False
        elif item_kind is not float or _scalar_problem(item) is not None:
            return False
    return True


def _snapshot_container(root: object) -> JsonValue:
    # A frame is [iterator, output, is_dict, id(source)]; ``keys`` mirrors the path.
    limit = _MAX_JSON_INT
    keys: list[str | int] = []
    on_path: set[int] = {id(root)}
    stack: list[list[Any]] = [_open_frame(root)]
    while True:
        frame = stack[-1]
        iterator, out, is_dict = frame[0], frame[1], frame[2]
        for entry in iterator:
            if is_dict:
                key, item = entry
                if type(key) is not str:
                    raise _reject(f"object key {safe_repr(key)} is not a str", keys)
                keys.append(key)
            else:
                key, item = entry
                keys.append(key)
            item_kind = type(item)
            if item_kind is str or item_kind is bool or item is None or item_kind is FrozenDict:
                snap: Any = item
            elif item_kind is int and (limit is None or -limit <= item <= limit):
                snap = item
            elif (item_kind is list or item_kind is tuple) and _is_flat_json_array(item):
                snap = tuple(item)  # holds no container, so no cycle either
            elif item_kind is dict and is_flat_json_object(item):
                snap = frozen_copy(item)
            elif item_kind is dict or item_kind is list or item_kind is tuple:
                ident = id(item)
                if ident in on_path:
                    raise _reject("cycle: the value contains itself", keys)
                on_path.add(ident)
                stack.append(_open_frame(item))
                break
            else:
                problem = _scalar_problem(item)
                if problem is not None:
                    raise _reject(problem, keys)
                snap = item
            keys.pop()
            if is_dict:
                out[key] = snap
            else:
                out.append(snap)
        else:
            # Frame exhausted: seal it and hand it to its parent.
            stack.pop()
            on_path.discard(frame[3])
            sealed: JsonValue = frozen_copy(out) if is_dict else tuple(out)
            if not stack:
                return sealed
            key = keys.pop()
            parent = stack[-1]
            if parent[2]:
                parent[1][key] = sealed
            else:
                parent[1].append(sealed)


def _open_frame(container: Any) -> list[Any]:
    if type(container) is dict:
        return [iter(container.items()), {}, True, id(container)]
    return [enumerate(container), [], False, id(container)]


def thaw(value: JsonValue) -> Any:
    """Plain ``dict``/``list`` copies of a snapshot, e.g. for ``json.dumps``."""
    if not isinstance(value, (FrozenDict, tuple, dict, list)):
        return value
    root_out: Any = {} if isinstance(value, (FrozenDict, dict)) else []
    stack: list[tuple[Any, Any]] = [(_items(value), root_out)]
    while stack:
        iterator, out = stack[-1]
        for key, item in iterator:
            if isinstance(item, (FrozenDict, tuple, dict, list)):
                child: Any = {} if isinstance(item, (FrozenDict, dict)) else []
                _put(out, key, child)
                stack.append((_items(item), child))
                break
            _put(out, key, item)
        else:
            stack.pop()
    return root_out


def nests_deeper_than(value: object, levels: int) -> bool:
    """Whether ``value`` holds containers (dict, list, tuple) nested more than ``levels`` deep.

    A scalar nests 0 levels, ``[]`` and ``{"a": 1}`` one, ``[[1]]`` two. The walk
    is iterative and stops at the first container past ``levels``, so a value
    nested 100 000 levels deep costs no more than one ``levels + 1`` deep.
    """
    if not isinstance(value, (dict, list, tuple)):
        return False
    if levels < 1:
        return True
    stack: list[Iterator[Any]] = [_children(value)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, (dict, list, tuple)):
                if len(stack) >= levels:
                    return True
                stack.append(_children(item))
                break
        else:
            stack.pop()
    return False


def _children(container: dict[Any, Any] | list[Any] | tuple[Any, ...]) -> Iterator[Any]:
    return iter(container.values() if isinstance(container, dict) else container)


def _items(container: Any) -> Iterator[tuple[Any, Any]]:
    if isinstance(container, (FrozenDict, dict)):
        return iter(container.items())
    return enumerate(container)


def _put(out: Any, key: Any, item: Any) -> None:
    if isinstance(out, dict):
        out[key] = item
    else:
        out.append(item)


def json_equal(left: object, right: object) -> bool:
    """Deep equality of JSON values, iterative and JSON-strict (``True != 1``, ``1 == 1.0``).

    ``dict``/``FrozenDict`` compare as objects (key order ignored) and
    ``list``/``tuple`` as arrays.
    """
    pending: list[tuple[object, object]] = [(left, right)]
    while pending:
        a, b = pending.pop()
        if a is b:
            continue
        a_obj = isinstance(a, (FrozenDict, dict))
        b_obj = isinstance(b, (FrozenDict, dict))
        if a_obj or b_obj:
            if not (a_obj and b_obj):
                return False
            assert isinstance(a, Mapping) and isinstance(b, Mapping)
            if len(a) != len(b):
                return False
            for key, item in a.items():
                if key not in b:
                    return False
                pending.append((item, b[key]))
            continue
        a_arr = isinstance(a, (tuple, list))
        b_arr = isinstance(b, (tuple, list))
        if a_arr or b_arr:
            if not (a_arr and b_arr):
                return False
            assert isinstance(a, (tuple, list)) and isinstance(b, (tuple, list))
            if len(a) != len(b):
                return False
            pending.extend(zip(a, b, strict=True))
            continue
        a_kind, b_kind = type(a), type(b)
        if a_kind is bool or b_kind is bool:
            if a_kind is not b_kind or a != b:
                return False
        elif a_kind in _NUMBERS and b_kind in _NUMBERS:
            if a != b:
                return False
        elif a_kind is not b_kind or a != b:
            return False
    return True


def _json_hash(root: object) -> int:
    # Order-insensitive for object keys (equal FrozenDicts hash equally), iterative.
    total = 0
    pending: list[tuple[object, int]] = [(root, 1)]
    while pending:
        value, weight = pending.pop()
        if isinstance(value, FrozenDict):
            total ^= hash(("obj", len(value), weight))
            for key, item in value.items():
                pending.append((item, hash((key, weight)) & 0xFFFFFFFF))
        elif isinstance(value, tuple):
            total ^= hash(("arr", len(value), weight))
            for index, item in enumerate(value):
                pending.append((item, hash((index, weight)) & 0xFFFFFFFF))
        elif type(value) is bool:
            total ^= hash(("bool", value, weight))
        else:
            # int and float share a hash when equal, as json_equal treats them.
            total ^= hash((value, weight))
    return total


def json_text(value: JsonValue, *, indent: int | None = None) -> str:
    """Serialise a JSON value (``json.dumps`` semantics, non-ASCII kept).

    Values too deep for ``json.dumps``'s recursion fall back to an iterative
    encoder (compact output), so serialising never raises ``RecursionError``.
    """
    return dumps_text(value, indent=indent)
