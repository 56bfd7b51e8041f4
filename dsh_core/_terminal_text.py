"""Text from tools, plugins and session logs, made safe to show on a terminal.

Tool output, tool and plugin names and logged events can hold ANSI escape
sequences (clear the screen, retitle the window, fake a prompt), carriage
returns that overwrite what came before, and bidi overrides that make a line
read differently from what it holds. Printed raw, they drive the terminal of
whoever runs ``dsh-tools``; shown through :func:`printable` they appear as the
escapes they are.
"""

from __future__ import annotations

import functools
import sys
import unicodedata

__all__ = ["markup_text", "printable"]

# Zero-width (non-)joiners are format characters too, but they build emoji and
# Indic text; they cannot move the cursor or reorder a line.
_KEPT = frozenset("\u200c\u200d")
_ESCAPED_CATEGORIES = ("Cc", "Cf", "Zl", "Zp", "Cs")


@functools.cache
def _escapes(one_line: bool) -> dict[int, str]:
    # Built on first use (a scan of every code point, ~0.1 s) so that long output is
    # escaped by str.translate rather than one Python step per character.
    kept = _KEPT if one_line else _KEPT | {"\n", "\t"}
    return {
        code: f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
        for code in range(sys.maxunicode + 1)
        if unicodedata.category(chr(code)) in _ESCAPED_CATEGORIES and chr(code) not in kept
    }


def printable(text: str, *, one_line: bool = False) -> str:
    """``text`` with control, format, separator and surrogate characters written as ``\\x1b``-style escapes.

    Newlines and tabs are kept unless ``one_line`` (a prompt, a table cell);
    everything else that ``str.isprintable`` refuses and that is not a space
    is escaped. Ordinary text comes back as the same object.
    """
    if text.isprintable():
        return text
    return text.translate(_escapes(one_line))


def markup_text(text: str) -> str:
    """``text`` for a rich markup string: :func:`printable`, then markup brackets escaped."""
    from rich.markup import escape  # rich is only needed where a terminal is

    return escape(printable(text))
