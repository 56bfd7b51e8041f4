"""Lone surrogates: found, and replaced so that UTF-8 can carry the text.

A Python string can hold a lone surrogate (a code point in U+D800-U+DFFF that
is not half of a pair): JSON's ``"\\ud800"`` decodes to one, and so does a
file read with ``errors="surrogateescape"``. UTF-8 has no form for it, so
whatever writes the string as UTF-8 fails. A string made well-formed has each
lone surrogate replaced by U+FFFD, as JavaScript's ``toWellFormed`` does.

The walks here use an explicit work stack, never Python recursion: they see
values nested as deep as any other JSON value of the pipeline.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any, Final

__all__ = ["LONE_SURROGATE", "holds_lone_surrogate", "well_formed_json", "well_formed_text"]

LONE_SURROGATE: Final = re.compile("[\ud800-\udfff]")
"""Any surrogate code point: a Python string holds one only where it is not text (decoding joins pairs)."""


def well_formed_text(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD (and a split surrogate pair joined).

    Two halves of a pair that sit side by side as two code points (``"\\ud83d"
    + "\\ude00"``) become the one character they encode. Text without
    surrogates is returned as it is, at the cost of one encoding attempt.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16-le", errors="surrogatepass").decode("utf-16-le", errors="replace")
    return text


def holds_lone_surrogate(value: object) -> bool:
    """Whether a string anywhere in the JSON value ``value`` (object keys included) holds a surrogate."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if not item.isascii() and LONE_SURROGATE.search(item):
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
    return False


def well_formed_json(value: Any) -> Any:
    """A copy of the JSON value ``value`` (plain dicts and lists) with every string made well-formed.

    Object keys too: two keys that differ only in their lone surrogates become
    one, and the later value wins, as in a JSON object with a repeated key.
    Values that are not strings or containers are shared, not copied.
    """
    if isinstance(value, str):
        return well_formed_text(value)
    if not isinstance(value, (dict, list, tuple)):
        return value
    root: Any = {} if isinstance(value, dict) else []
    stack: list[tuple[Iterator[tuple[Any, Any]], Any]] = [(_entries(value), root)]
    while stack:
        entries, out = stack[-1]
        for key, item in entries:
            if isinstance(item, (dict, list, tuple)):
                child: Any = {} if isinstance(item, dict) else []
                _put(out, key, child)
                stack.append((_entries(item), child))
                break
            _put(out, key, well_formed_text(item) if isinstance(item, str) else item)
        else:
            stack.pop()
    return root


def _entries(container: dict[Any, Any] | list[Any] | tuple[Any, ...]) -> Iterator[tuple[Any, Any]]:
    return iter(container.items()) if isinstance(container, dict) else enumerate(container)


def _put(out: dict[Any, Any] | list[Any], key: Any, item: Any) -> None:
    if isinstance(out, dict):
        out[well_formed_text(key) if isinstance(key, str) else key] = item
    else:
        out.append(item)
