"""Text from tools, plugins and session logs, made safe to show on a terminal.

Tool output, tool and plugin names and logged events can hold ANSI escape
sequences (clear the screen, retitle the window, fake a prompt), carriage
returns that overwrite what came before, bidi overrides that make a line read
differently from what it holds, and letters that draw nothing (a Hangul
filler, a blank Braille pattern) that make an argument look empty. Printed
raw, they drive the terminal of whoever runs ``dsh-tools`` or hide text from
it; shown through :func:`printable` they appear as the escapes they are.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.text import Text

__all__ = ["MESSAGE_CHARS", "clipped", "json_printable", "printable", "terminal_text"]

# Zero-width (non-)joiners are format characters too, but they build emoji and
# Indic text; they cannot move the cursor or reorder a line.
_KEPT = frozenset("\u200c\u200d")
# Every category str.isprintable refuses except Zs (spaces other than " " move nothing).
_ESCAPED_CATEGORIES = frozenset(("Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"))
# Characters str.isprintable accepts that draw nothing: the Default_Ignorable_Code_Point
# ones outside Cf/Cn (Unicode's DerivedCoreProperties.txt; unicodedata does not expose the
# property) and blank glyphs. The emoji presentation selectors U+FE0E/U+FE0F are kept, as
# the joiners are: they build emoji, and escaping them would garble ordinary output.
_INVISIBLE_RANGES = (
    (0x034F, 0x034F),  # combining grapheme joiner
    (0x115F, 0x1160),  # Hangul choseong/jungseong fillers
    (0x17B4, 0x17B5),  # Khmer inherent vowels
    (0x180B, 0x180D),  # Mongolian free variation selectors
    (0x180F, 0x180F),
    (0x2800, 0x2800),  # Braille pattern blank
    (0x3164, 0x3164),  # Hangul filler
    (0xFE00, 0xFE0D),  # variation selectors 1-14
    (0xFFA0, 0xFFA0),  # halfwidth Hangul filler
    (0x1D159, 0x1D159),  # musical symbol null notehead
    (0xE0100, 0xE01EF),  # variation selectors 17-256
)
_INVISIBLE = frozenset(chr(code) for first, last in _INVISIBLE_RANGES for code in range(first, last + 1))
# One pass in C, as str.isprintable is, to keep the fast path for ordinary text.
_INVISIBLE_SEARCH = re.compile(
    "[" + "".join(f"\\U{first:08x}-\\U{last:08x}" for first, last in _INVISIBLE_RANGES) + "]"
).search


def draws_nothing(char: str) -> bool:
    """Whether ``char`` is one of the letters and symbols ``str.isprintable`` accepts that draw nothing.

    ``\\u3164`` Hangul filler, ``\\u2800`` blank Braille pattern, the variation
    selectors but the emoji ones...: the one rule for every text a person or a
    model reads (the terminal here, the Code Mode SDK), so none of them can
    hide content the others show.
    """
    return char in _INVISIBLE


def holds_invisible(text: str) -> bool:
    """Whether any character of ``text`` :func:`draws_nothing` (one pass in C)."""
    return _INVISIBLE_SEARCH(text) is not None


# Distinct characters remembered per table (a few MB at most): even CJK text uses fewer,
# and text built to hold every code point must not grow the table to a million entries.
_REMEMBERED = 1 << 16


def _python_escape(code: int) -> str:
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _json_escape(code: int) -> str:
    if code < 0x10000:
        return f"\\u{code:04x}"
    # Beyond the BMP JSON has only UTF-16 surrogate pairs (what ensure_ascii writes).
    code -= 0x10000
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


class _Escapes(dict[int, str]):
    """A ``str.translate`` table filled in as characters are met.

    ``translate`` looks a character up in C; only the first sight of one runs
    Python, so long output costs one dict lookup per character, without a scan
    of every code point up front.
    """

    def __init__(self, kept: frozenset[str], escape: Callable[[int], str]) -> None:
        super().__init__()
        self._kept = kept
        self._escape = escape

    def __missing__(self, code: int) -> str:
        char = chr(code)
        shown = char
        if char not in self._kept and (draws_nothing(char) or unicodedata.category(char) in _ESCAPED_CATEGORIES):
            shown = self._escape(code)
        if len(self) < _REMEMBERED:
            self[code] = shown
        return shown


@functools.cache
def _escapes(one_line: bool) -> _Escapes:
    return _Escapes(_KEPT if one_line else _KEPT | {"\n", "\t"}, _python_escape)


# Raw newlines in JSON text are layout (json escapes those inside strings), so they stay.
_JSON_ESCAPES = _Escapes(_KEPT | {"\n"}, _json_escape)


MESSAGE_CHARS = 2000
"""How much of a message (a policy's reason, a failure's text) a card or a question shows."""


def clipped(text: str, limit: int = MESSAGE_CHARS) -> str:
    """``text``, or its first ``limit`` characters and a note of how many more are not shown.

    For what is put in front of a person: a reason the model can make megabytes
    long would bury the question it comes with (the data it came from is kept whole).
    """
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text) - limit} more characters not shown)"


def _shown_as_is(text: str) -> bool:
    return text.isprintable() and not holds_invisible(text)


def printable(text: str, *, one_line: bool = False) -> str:
    """``text`` with control, format, separator, surrogate, private-use, unassigned and invisible characters as escapes.

    Newlines and tabs are kept unless ``one_line`` (a prompt, a table cell);
    everything else that ``str.isprintable`` refuses and that is not a space,
    and the letters and symbols that draw nothing (``\\u3164`` Hangul filler,
    ``\\u2800`` blank Braille pattern, variation selectors but the emoji ones),
    is written as a ``\\x1b``/``\\u202e``/``\\U000f0000`` escape. Ordinary text
    comes back as the same object.
    """
    if _shown_as_is(text):
        return text
    return text.translate(_escapes(one_line))


def json_printable(json_text: str) -> str:
    """JSON text with what :func:`printable` would escape written as JSON ``\\u`` escapes.

    It decodes to the same value, and it can be shown on a terminal or written
    to any UTF-8 stream: a lone surrogate (legal in JSON text, but not
    encodable) becomes ``\\ud800``, a bidi override ``\\u202e``.
    """
    if _shown_as_is(json_text):
        return json_text
    return json_text.translate(_JSON_ESCAPES)


def terminal_text(*pieces: str | tuple[str, str], one_line: bool = False) -> Text:
    """A rich ``Text`` of ``pieces`` (text, or ``(text, style)``), each through :func:`printable`.

    Nothing in it is read as markup: text from a tool or a log is shown as it
    is, whatever brackets or trailing backslashes it holds (in a markup string
    ``name\\`` would escape the tag after it), and styles come from the pieces.
    ``one_line`` for a table cell or a title, where a newline would draw a
    row or a border that is not there.
    """
    from rich.text import Text  # rich is only needed where a terminal is

    return Text.assemble(
        *(
            (printable(text, one_line=one_line), style)
            for text, style in ((piece, "") if isinstance(piece, str) else piece for piece in pieces)
        )
    )
