"""``read_spilled_output``: the model reads a spilled result back in windows or by search.

The spill notice tells the model to read the saved output in parts; this is
the tool it does that with, whatever other tools the host has (the spill
directory is usually outside any workspace a file tool may read). It reads only
files directly inside the spill directory, never follows a symlink, and keeps
its own answers within the same byte budget that made the output spill, so
reading a spill never spills again. Called from a ``run_code`` program, its
window is sized so that its value, returned as the program's result (which
``run_code`` shows as indented JSON), fits that budget too.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Callable
from typing import Any, BinaryIO, Final

import trio

from dsh_core import (
    DshError,
    FrozenDict,
    TextBlock,
    ToolDefinition,
    ToolEffects,
    ToolOutput,
    ToolRunContext,
    define_tool,
    json_text,
)
from dsh_core.code_mode import render_run_code_value

from ._regular_file import NotRegularFileError, open_regular

__all__ = ["READ_TOOL_NAME", "SpillReadError", "read_spilled", "read_tool", "untrusted_directory"]

READ_TOOL_NAME: Final = "read_spilled_output"
DEFAULT_MAX_LINES: Final = 200
# A window always has room for some text, even under a tiny max_inline_bytes.
MIN_BUDGET: Final = 256
# Room left in the budget for the rendered header line, and per line for its number (a
# first estimate: every answer is measured as rendered and trimmed to the cap, see _fit).
_HEADER_ROOM: Final = 160
_LINE_ROOM: Final = 8
# Per line of the value as run_code shows it (indented JSON, besides the line's number and JSON
# string): '\n    {\n      "number": ', ',\n      "text": ', '\n    }' and the comma between lines.
_JSON_LINE_ROOM: Final = 46
# How much of a `contains` text the header quotes: at most this many characters, and this many
# bytes as quoted (repr writes an unprintable character as up to 10 bytes, \U000e0080).
_SEARCH_SHOWN: Final = 40
_SEARCH_SHOWN_BYTES: Final = 64


class SpillReadError(DshError, ValueError):
    """The path is not a spill file, or the window asked for is not valid."""

    code = "SPILL_READ_ERROR"


def untrusted_directory(info: os.stat_result) -> str | None:
    """Why a spill directory (its ``lstat``) may hold files someone else put there, or ``None``.

    Spills may hold secrets and the reader shows whatever is in the directory:
    it must be a real directory of the current user that nobody else may write to.
    """
    if stat.S_ISLNK(info.st_mode):
        return "is a symlink"
    if not stat.S_ISDIR(info.st_mode):
        return "is not a directory"
    if hasattr(os, "getuid"):  # POSIX owners and modes; elsewhere the directory is taken as it is
        if info.st_uid != os.getuid():
            return "belongs to another user"
        if info.st_mode & 0o022:
            return f"is writable by other users (mode {stat.S_IMODE(info.st_mode):o})"
    return None


# What SpillStore names a file: "<call id>-<tool>" made safe, a dash and six hex digits, ".txt".
_SPILL_NAME: Final = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*-[0-9a-f]{6}\.txt")


def _resolve(directory: str | None, path: str) -> str:
    """The spill file ``path`` names (a full path from a notice, or a bare file name), checked."""
    if not path or "\x00" in path:
        raise SpillReadError("path must name a spilled output file")
    name = os.path.basename(path)
    if directory is None:  # the private directory is made by the first spill
        raise SpillReadError(f"there is no spilled output {name!r}: nothing has been spilled yet")
    if os.path.dirname(path) not in ("", directory) or _SPILL_NAME.fullmatch(name) is None:
        # Only the names a store gives: a directory configured beside other files (the host's .env,
        # its grants file) is no place for the model to read them from.
        raise SpillReadError(f"{path!r} is not a spilled output: spilled outputs are saved in {directory}")
    try:
        folder = os.lstat(directory)
    except FileNotFoundError:
        raise SpillReadError(f"there is no spilled output {name!r}: nothing has been spilled yet") from None
    problem = untrusted_directory(folder)
    if problem is not None:
        raise SpillReadError(f"the spill directory {directory} {problem}")
    candidate = os.path.join(directory, name)
    try:
        info = os.lstat(candidate)
    except FileNotFoundError:
        raise SpillReadError(f"there is no spilled output {name!r} in {directory}") from None
    if not stat.S_ISREG(info.st_mode):
        raise SpillReadError(f"{name!r} in {directory} is not a regular file")
    return candidate


def _open(file_path: str) -> BinaryIO:
    """``file_path`` (a checked spill file) opened for reading, if it is still a regular file.

    A symlink or FIFO swapped in after _resolve's check is refused, neither followed nor waited on.
    """
    name, directory = os.path.basename(file_path), os.path.dirname(file_path)
    try:
        return open_regular(file_path)
    except FileNotFoundError:
        raise SpillReadError(f"there is no spilled output {name!r} in {directory}") from None
    except NotRegularFileError:
        raise SpillReadError(f"{name!r} in {directory} is not a regular file") from None


def _encoded_size(text: str) -> int:
    return len(text.encode("utf-8", errors="surrogatepass"))


def _cut(text: str, budget: int) -> str:
    data = text.encode("utf-8", errors="surrogatepass")[:budget]
    return data.decode("utf-8", errors="ignore")


def read_spilled(
    directory: str | None,
    path: str,
    *,
    start_line: int = 1,
    start_column: int = 1,
    max_lines: int = DEFAULT_MAX_LINES,
    contains: str | None = None,
    budget: int,
    line_counts: dict[tuple[str, int, int], int] | None = None,
    as_value: bool = False,
) -> dict[str, Any]:
    """One window of a spilled output in ``directory`` (``None``: none made yet): numbered lines from ``start_line``.

    With ``contains``, only the lines that contain it. ``start_column`` (1-based,
    in characters) is where the text of ``start_line`` starts; such a line has
    its ``column`` in the window.

    At most ``max_lines`` lines and about ``budget`` UTF-8 bytes of line text;
    a single line longer than the budget is cut (``cut_lines`` lists it).
    ``next_line`` is where the next window starts (``None`` at the end), and
    ``next_column`` the character of that line, when the window ends inside a
    line it cut (not in a search: there the next window starts at the next line).
    ``line_counts`` caches each file's line count between calls. With
    ``as_value``, lines are sized as the window's JSON shows them (escapes
    included), and its path is taken out of the budget: a program gets the
    window as a value. Blocks: run it in a thread.
    """
    if start_line < 1:
        raise SpillReadError(f"start_line must be at least 1, got {start_line}")
    if start_column < 1:
        raise SpillReadError(f"start_column must be at least 1, got {start_column}")
    if max_lines < 1:
        raise SpillReadError(f"max_lines must be at least 1, got {max_lines}")
    if contains == "":
        raise SpillReadError("contains must not be empty (omit it to read every line)")
    file_path = _resolve(directory, path)
    if as_value:
        budget = max(budget - _encoded_size(json_text(file_path)), 0)
    lines: list[dict[str, Any]] = []
    cut_lines: list[int] = []
    used = 0
    next_line: int | None = None
    next_column: int | None = None
    total = 0
    with _open(file_path) as file:
        status = os.fstat(file.fileno())
        # Spill files are written once: a window after the first stops at its last line
        # instead of scanning to the end again to count them.
        key = (file_path, status.st_size, status.st_mtime_ns)
        known = line_counts.get(key) if line_counts is not None else None
        for number, raw in enumerate(file, 1):
            total = number
            if number < start_line:
                continue
            if next_line is not None:
                if known is not None:
                    break
                continue
            try:
                text = raw.decode("utf-8", errors="surrogatepass").rstrip("\n")
            except UnicodeDecodeError:
                # Not what the store writes, but the directory may hold a file from elsewhere
                # (a configured, shared one): shown with U+FFFD, not failing the window.
                text = raw.decode("utf-8", errors="replace").rstrip("\n")
            column = 1
            if number == start_line and start_column > 1:
                if start_column > len(text) + 1:
                    raise SpillReadError(
                        f"start_column {start_column} is past the end of line {number}: it has {len(text)} characters"
                    )
                column, text = start_column, text[start_column - 1 :]
            if contains is not None and contains not in text:
                continue
            if as_value:
                room = _JSON_LINE_ROOM + len(str(number))
                size = _encoded_size(json_text(text)) + room
            else:
                # The rendered line: its number padded to six digits (more past 999 999), a tab, a newline.
                room = max(_LINE_ROOM, len(str(number)) + 2)
                size = _encoded_size(text) + room
            if len(lines) == max_lines or (lines and used + size > budget):
                next_line = number
                continue
            if size > budget:
                if contains:
                    # The line's head may not hold the match (one minified line, say): the window
                    # starts a little before it, marked with an ellipsis, so the search shows it.
                    start = max(0, text.find(contains) - max(budget - room, 0) // 4)
                    if start:
                        text = "…" + text[start:]
                text = _cut(text, max(budget - room, 0))  # escapes may still take more: _fit measures
                cut_lines.append(number)
                size = budget
                if contains is None:
                    # The rest of the line comes next: a long line is read in windows too.
                    next_line, next_column = number, column + len(text)
            line: dict[str, Any] = {"number": number, "text": text}
            if column > 1:
                line["column"] = column
            lines.append(line)
            used += size
    if known is not None:
        total = known
    elif line_counts is not None:
        line_counts[key] = total
    if start_line > max(total, 1):
        raise SpillReadError(f"start_line {start_line} is past the end: the output has {total} lines")
    return {
        "path": file_path,
        "total_lines": total,
        "lines": lines,
        "next_line": next_line,
        "next_column": next_column,
        "cut_lines": cut_lines,
    }


def _shown(search: str, limit: int = _SEARCH_SHOWN_BYTES) -> str:
    """``search`` quoted, or the longest start of it whose quote takes at most ``limit`` bytes, then ``...``."""
    # The model wrote it and may have written a lot, or characters that quote long.
    if len(search) <= _SEARCH_SHOWN and _encoded_size(repr(search)) <= limit:
        return repr(search)
    low, high = 0, min(len(search), _SEARCH_SHOWN)  # the start that fits has low characters
    while low < high:
        middle = (low + high + 1) // 2
        if _encoded_size(repr(search[:middle])) <= limit:
            low = middle
        else:
            high = middle - 1
    return (repr(search[:low]) if low else "") + "..."


def _render(args: Any, value: Any, cap: int | None = None) -> list[TextBlock]:
    """The window as text; with ``cap``, its quote of ``contains`` shortened as far as fitting ``cap`` takes.

    The lines give way first (see :func:`_fit`, which measures with the whole
    quote); the quote only when the header alone is too long for ``cap``.
    """
    search = args.get("contains")
    text = _window_text(args, value, _shown(search) if search is not None else "")
    if cap is not None and search is not None:
        excess = _encoded_size(text) - cap
        if excess > 0:
            shown = _shown(search)
            # Room for the "..." a shorter quote ends with: it shrinks by at least ``excess``.
            text = _window_text(args, value, _shown(search, _encoded_size(shown) - excess - 3))
    return [TextBlock(text)]


def _window_text(args: Any, value: Any, shown: str) -> str:
    lines = value["lines"]
    total = value["total_lines"]
    searched = args.get("contains") is not None
    if not lines:
        where = f" containing {shown}" if searched else ""
        return f"[no lines{where} from line {args.get('start_line', 1)} of {total}]"
    body = "\n".join(f"{line['number']:>6}\t{line['text']}" for line in lines)
    span = f"lines {lines[0]['number']}-{lines[-1]['number']} of {total}"
    if "column" in lines[0]:
        span += f" (line {lines[0]['number']} from column {lines[0]['column']})"
    if searched:
        span = f"{len(lines)} line(s) containing {shown}, {span}"
    notes = []
    if value["next_column"] is not None:
        notes.append(f"more from start_line={value['next_line']}, start_column={value['next_column']}")
    elif value["next_line"] is not None:
        notes.append(f"more from start_line={value['next_line']}")
    if value["cut_lines"]:
        notes.append(f"cut to fit: line(s) {', '.join(map(str, value['cut_lines']))}")
    suffix = f"; {'; '.join(notes)}" if notes else ""
    return f"[{span}{suffix}]\n{body}"


def _rendered_size(args: Any, value: dict[str, Any], as_value: bool) -> int:
    # With the whole quote of ``contains``: the lines give way before it does.
    size = _encoded_size(_render(args, value)[0].text)
    if as_value:
        # What run_code shows for a program that returns the window.
        shown = render_run_code_value(None, FrozenDict({"logs": (), "result": value}))
        size = max(size, sum(_encoded_size(block.text) for block in shown if isinstance(block, TextBlock)))
    return size


def _fit(args: Any, value: dict[str, Any], cap: int, *, as_value: bool = False) -> dict[str, Any]:
    """``value`` with lines dropped from its end (then its one line cut) until its answer fits ``cap`` bytes.

    With ``as_value``, until its JSON as ``run_code`` shows a program's result
    fits too. The policy never spills this tool's answers, so this is what
    bounds them, with :func:`_render`, which shortens the header's quote of
    ``contains`` when the header alone is too long. Only a cap smaller than the
    header without that quote (a notice would not fit either, so nothing spills
    under it) leaves an answer over it.
    """
    lines: list[dict[str, Any]] = value["lines"]
    while len(lines) > 1 and _rendered_size(args, value, as_value) > cap:
        dropped = lines.pop()["number"]
        value["next_line"] = dropped
        value["next_column"] = None  # only a line the window begins can start past column 1
        if dropped in value["cut_lines"]:
            value["cut_lines"].remove(dropped)
    excess = _rendered_size(args, value, as_value) - cap
    if lines and excess > 0:
        # Cutting n bytes of text shortens either rendering by at least n (JSON escapes only add).
        line = lines[0]
        line["text"] = _cut(line["text"], max(_encoded_size(line["text"]) - excess, 0))
        if line["number"] not in value["cut_lines"]:
            value["cut_lines"].append(line["number"])
        _continue_after(args, value, line)
        excess = _rendered_size(args, value, as_value) - cap
        if excess > 0:  # the notes about the cut line took room too
            line["text"] = _cut(line["text"], max(_encoded_size(line["text"]) - excess, 0))
            _continue_after(args, value, line)
    return value


def _continue_after(args: Any, value: dict[str, Any], line: dict[str, Any]) -> None:
    """Have the next window start where ``line``, cut, now ends (a search goes on at the next line)."""
    if args.get("contains") is None:
        value["next_line"] = line["number"]
        value["next_column"] = line.get("column", 1) + len(line["text"])


def read_tool(directory: Callable[[], str | None], max_inline_bytes: int) -> ToolDefinition:
    """The ``read_spilled_output`` tool for spills saved in the directory ``directory()`` names.

    ``directory()`` is ``None`` while there is none yet (the store makes a
    private one on its first spill).
    """
    budget = max(max_inline_bytes - _HEADER_ROOM, MIN_BUDGET)
    line_counts: dict[tuple[str, int, int], int] = {}

    async def execute(args: Any, run: ToolRunContext) -> dict[str, Any]:
        # A nested call hands the window to a program, which may return it whole.
        as_value = run.parent is not None
        value = await trio.to_thread.run_sync(
            lambda: read_spilled(
                directory(),
                args["path"],
                # The schema's integer admits 2.0, which no slice takes.
                start_line=int(args.get("start_line", 1)),
                start_column=int(args.get("start_column", 1)),
                max_lines=int(args.get("max_lines", DEFAULT_MAX_LINES)),
                contains=args.get("contains"),
                budget=budget,
                line_counts=line_counts,
                as_value=as_value,
            )
        )
        return _fit(args, value, max_inline_bytes, as_value=as_value)

    return define_tool(
        name=READ_TOOL_NAME,
        description=(
            "Read an output that was too large to show and was saved to a file (the notice in its place names "
            "the file). Returns numbered lines from `start_line` (1-based, default 1), at most `max_lines` "
            f"(default {DEFAULT_MAX_LINES}); with `contains`, only the lines that contain that text. When more "
            "follows, the answer says which start_line (and, inside a line too long for one answer, which "
            "start_column) to continue from."
        ),
        parameters={
            "path": {"type": "string", "required": True, "description": "The saved file, as the notice names it."},
            "start_line": {"type": "integer", "description": "First line to read, 1-based (default 1)."},
            "start_column": {
                "type": "integer",
                "description": "Character of start_line to start from, 1-based (default 1): to read on in a long line.",
            },
            "max_lines": {"type": "integer", "description": f"At most this many lines (default {DEFAULT_MAX_LINES})."},
            "contains": {"type": "string", "description": "Only lines containing this text (plain text, not a regex)."},
        },
        output=ToolOutput(
            schema={
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "path": {"type": "string", "required": True},
                    "total_lines": {"type": "integer", "required": True},
                    "lines": {
                        "type": "array",
                        "required": True,
                        "items": {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": {
                                "number": {"type": "integer", "required": True},
                                "column": {"type": "integer"},
                                "text": {"type": "string", "required": True},
                            },
                        },
                    },
                    "next_line": {"oneOf": [{"type": "integer"}, {"type": "null"}], "required": True},
                    "next_column": {"oneOf": [{"type": "integer"}, {"type": "null"}], "required": True},
                    "cut_lines": {"type": "array", "required": True, "items": {"type": "integer"}},
                },
            },
            render=lambda args, value: _render(args, value, max_inline_bytes),
        ),
        execute=execute,
        is_concurrency_safe=lambda args: True,
        effects=ToolEffects(read_only=True),
    )
