"""``unstructure``: a typed function's return value as plain data, at any nesting depth.

``@tool`` bodies return attrs or dataclass instances, enums and plain JSON
alike; cattrs turns them into plain data. cattrs copies plain ``dict``/``list``
containers recursively, one Python frame per level, so a JSON document nested
a few hundred levels deep would fail after the body ran. Here plain
containers are copied with an explicit stack instead; cattrs only handles the
objects inside them that are not plain data (and recurses only as deep as those
objects nest in one another).
"""

from __future__ import annotations

import datetime
import enum
import pathlib
import uuid
from collections.abc import Iterator
from typing import Any, Final

import cattrs

from ._json import FrozenDict

__all__ = ["unstructure"]

# Unstructured the way cattrs does by default (tuples become lists, a FrozenDict a dict).
_CONTAINERS: Final = frozenset({dict, FrozenDict, list, tuple})
# Returned as they are, by cattrs as here.
_SCALARS: Final = frozenset({str, int, float, bool, type(None)})

_converter = cattrs.Converter()


def unstructure(value: object) -> Any:
    """``value`` with attrs/dataclass instances, enums... turned into plain data, as cattrs does.

    Plain containers are copied at any depth without recursion. A container
    that contains itself becomes a copy that contains itself (cattrs would raise
    ``RecursionError``), for the JSON check downstream to name.
    """
    return _converter.unstructure(value)


def _copy_plain(root: Any) -> Any:
    copy = _empty(root)
    copies = {id(root): copy}  # of the containers being copied: the path from the root
    # A frame is (entries, the copy being filled, id of the container copied).
    stack: list[tuple[Iterator[tuple[Any, Any]], Any, int]] = [(_entries(root), copy, id(root))]
    while stack:
        entries, out, ident = stack[-1]
        for key, item in entries:
            if type(key) not in _SCALARS:
                key = _converter.unstructure(key)  # an enum key, say (list indices are ints)
            kind = type(item)
            if kind in _CONTAINERS:
                cycle = copies.get(id(item))
                if cycle is not None:
                    _put(out, key, cycle)
                    continue
                child = copies[id(item)] = _empty(item)
                _put(out, key, child)
                stack.append((_entries(item), child, id(item)))
                break
            _put(out, key, item if kind in _SCALARS else _converter.unstructure(item))
        else:
            stack.pop()
            del copies[ident]
    return copy


def _empty(container: Any) -> Any:
    return {} if isinstance(container, dict) else []


def _entries(container: Any) -> Iterator[tuple[Any, Any]]:
    return iter(container.items()) if isinstance(container, dict) else enumerate(container)


def _put(out: Any, key: Any, item: Any) -> None:
    if type(out) is dict:
        out[key] = item
    else:
        out.append(item)


def _is_plain_container(cls: Any) -> bool:
    # Identity, not ``in``: cattrs asks about every annotation, and some do not hash.
    return cls is dict or cls is list or cls is tuple or cls is FrozenDict


# Also reached from inside attrs instances: an ``Any`` field holding a list is unstructured by its runtime type.
_converter.register_unstructure_hook_func(_is_plain_container, _copy_plain)
# What @tool parameters take as text (dsh_core._schema._attrs_params) goes back out as that text.
_converter.register_unstructure_hook(datetime.date, lambda value: value.isoformat())  # a datetime is a date
_converter.register_unstructure_hook(datetime.time, lambda value: value.isoformat())
_converter.register_unstructure_hook(uuid.UUID, str)
_converter.register_unstructure_hook(pathlib.PurePath, str)


def _member_value(member: enum.Enum) -> Any:
    return _converter.unstructure(member.value)


def _scalar_or_member(value: Any) -> Any:
    # A StrEnum's (or a (str, Enum) mixin's) member reaches str's hook first: cattrs dispatches by
    # the class's MRO, where str comes before Enum, and passed the member through (not JSON).
    return _member_value(value) if isinstance(value, enum.Enum) else value


_converter.register_unstructure_hook_func(lambda cls: isinstance(cls, type) and issubclass(cls, enum.Enum), _member_value)
for _scalar in (str, int, float):
    _converter.register_unstructure_hook(_scalar, _scalar_or_member)
