"""The unified-diff hunks of one file change, at a cost bounded whatever the texts.

A model chooses both texts of an edit, and ``difflib``'s matcher grows about
quadratically on texts of repeated lines (10 000 of them take seconds). An
edit usually changes one stretch of a file, so the lines both texts share at
their start and end are set aside first (a linear scan) and only what lies
between, with its context, is compared: a small change in a long file is still
diffed in full. When even that stretch is too long, the hunk says so and shows
the start of each side instead.
"""

from __future__ import annotations

import difflib
import re
from typing import Final

__all__ = ["DIFF_COMPARE_LINES", "NO_FINAL_NEWLINE", "diff_hunks", "text_lines"]

DIFF_COMPARE_LINES: Final = 2000
"""Past this many changed lines (both sides together), the texts are not compared line by line."""

_CONTEXT: Final = 3
_HUNK_HEADER: Final = re.compile(r"@@ -(\d+)((?:,\d+)?) \+(\d+)((?:,\d+)?) @@")


def text_lines(text: str) -> list[str]:
    """``text`` as lines without their newlines, broken at ``\\n`` only.

    ``str.splitlines`` also breaks at ``\\r``, ``\\x0c``, ``\\u2028`` and more: drawn as
    a line break, such a character would split one line of the file in two.
    """
    lines = text.split("\n")
    return lines[:-1] if lines[-1] == "" else lines


NO_FINAL_NEWLINE: Final = "\\ No newline at end of file"
"""The line after a hunk's last line of a text that does not end with a newline (as ``diff`` writes it)."""


def diff_hunks(
    old_text: str, new_text: str, *, compare_lines: int = DIFF_COMPARE_LINES, side_lines: int = 25
) -> list[str]:
    """The hunks (``@@`` lines and ``-``/``+``/`` `` lines, no file headers, no newlines) from one text to the other.

    Empty when the texts are the same (a change of the final newline alone is a
    hunk of the last line, marked :data:`NO_FINAL_NEWLINE`). When the stretch between the lines
    they share at their start and end has more than ``compare_lines`` lines in
    all, one hunk covers it, its ``@@`` line saying it was not compared, with
    the first ``side_lines`` lines of each side and how many more there are.
    """
    old, new = text_lines(old_text), text_lines(new_text)
    shared = min(len(old), len(new))
    start = 0
    while start < shared and old[start] == new[start]:
        start += 1
    end = 0  # lines shared at the end, not overlapping those at the start
    while end < shared - start and old[-1 - end] == new[-1 - end]:
        end += 1
    old_changed, new_changed = old[start : len(old) - end], new[start : len(new) - end]
    if not old_changed and not new_changed:
        if old_text == new_text or not old:
            return []
        # The same lines, but one text ends with a newline and the other does not: shown as diff
        # shows it. Called unchanged, an edit of "#x" to "#x\n" (uncommenting the rest of the
        # line it was applied to) read as a no-op on the approval card.
        last = len(old)
        return [
            f"@@ -{last} +{last} @@",
            f"-{old[-1]}",
            *([] if old_text.endswith("\n") else [NO_FINAL_NEWLINE]),
            f"+{new[-1]}",
            *([] if new_text.endswith("\n") else [NO_FINAL_NEWLINE]),
        ]
    if len(old_changed) + len(new_changed) > compare_lines:
        return [
            f"@@ -{_range(start, len(old_changed))} +{_range(start, len(new_changed))} @@ "
            "too long to compare line by line: the start of each side",
            *_side("-", old_changed, side_lines, "removed"),
            *_side("+", new_changed, side_lines, "added"),
        ]
    first = max(start - _CONTEXT, 0)
    old_window = old[first : min(len(old) - end + _CONTEXT, len(old))]
    new_window = new[first : min(len(new) - end + _CONTEXT, len(new))]
    hunks = list(difflib.unified_diff(old_window, new_window, lineterm="", n=_CONTEXT))[2:]
    return [_shifted(line, first) if line.startswith("@@") else line for line in hunks]


def _range(start: int, length: int) -> str:
    # As difflib numbers a hunk: 1-based, and an empty side names the line before it.
    return f"{start + 1 if length else start},{length}"


def _shifted(header: str, by: int) -> str:
    """A hunk header of the compared window, numbered as lines of the whole texts."""
    match = _HUNK_HEADER.fullmatch(header)
    assert match is not None, header
    old_start, old_length, new_start, new_length = match.groups()
    return f"@@ -{int(old_start) + by}{old_length} +{int(new_start) + by}{new_length} @@"


def _side(mark: str, lines: list[str], shown: int, what: str) -> list[str]:
    kept = [f"{mark}{line}" for line in lines[:shown]]
    hidden = len(lines) - shown
    return [*kept, f"... {hidden} more {what} line{'s' if hidden != 1 else ''}"] if hidden > 0 else kept
