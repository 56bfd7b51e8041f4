"""Text from tools, plugins and session logs, made safe to show on a terminal.

Tool output, tool and plugin names and logged events can hold ANSI escape
sequences (clear the screen, retitle the window, fake a prompt), carriage
returns that overwrite what came before, and bidi overrides that make a line
read differently from what it holds. Printed raw, they drive the terminal of
whoever runs ``dsh-tools``; shown through :func:`printable` they appear as the
escapes they are.
"""

from __future__ import annotations

import unicodedata

__all__ = ["markup_text", "printable"]

# Zero-width (non-)joiners are format characters too, but they build emoji and
# Indic text; they cannot move the cursor or reorder a line.
_JOINERS = frozenset("\u200c\u200d")
_LAYOUT = frozenset("\n\t")


def printable(text: str, *, one_line: bool = False) -> str:
    """``text`` with control, format, separator and surrogate characters written as ``\\x1b``-style escapes.

    Newlines and tabs are kept unless ``one_line`` (a prompt, a table cell);
    everything else that ``str.isprintable`` refuses and that is not a space
    is escaped. Ordinary text comes back as the same object.
    """
    if text.isprintable():
        return text
    out: list[str] = []
    for char in text:
        if char.isprintable() or char in _JOINERS or (char in _LAYOUT and not one_line):
            out.append(char)
            continue
        category = unicodedata.category(char)
        if category in ("Cc", "Cf", "Zl", "Zp", "Cs"):
            code = ord(char)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
        else:
            out.append(char)  # a space other than " ", an unassigned or private-use character
    return "".join(out)


def markup_text(text: str) -> str:
    """``text`` for a rich markup string: :func:`printable`, then markup brackets escaped."""
    from rich.markup import escape  # rich is only needed where a terminal is

    return escape(printable(text))
