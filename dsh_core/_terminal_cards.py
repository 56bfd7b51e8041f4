"""Rendering presentation cards in a terminal with rich (used by ``dsh-tools replay``).

Each card kind gets the rendering a person expects: generic cards as panels,
terminal cards with an exit-status pill, diffs as coloured unified diffs, reads
with line numbers and syntax highlighting, searches grouped by file with the
truncation stated, so a partial result never looks complete.
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from ._content import ContentBlock, TextBlock
from ._diff_hunks import diff_hunks
from ._json import thaw
from ._jsoncodec import dumps_text
from ._logged_calls import unsettled_note
from ._replay import ReplayedCall
from ._terminal_text import clipped, printable, terminal_text
from .presentation import (
    UNREAD_OLD_TEXT,
    DiffCallView,
    DiffResultView,
    FileDiff,
    GenericCallView,
    GenericResultView,
    ReadResultView,
    SearchResultView,
    TerminalCallView,
    TerminalResultView,
    ToolCallView,
    WebResultView,
)

__all__ = ["render_replayed_call"]


# What one piece of a card shows at most. rich splits a text into lines in time quadratic in its
# length (13 MB of logged output took over a minute); the log keeps the whole text.
CARD_TEXT_CHARS = 100_000


def _text(value: str, style: str = "", *, one_line: bool = False) -> Text:
    # Everything shown here comes from a log: a tool's output, a model's arguments.
    return Text(printable(clipped(value, CARD_TEXT_CHARS), one_line=one_line), style=style)


def _content_text(content: Sequence[ContentBlock] | None) -> str:
    if not content:
        return ""
    return "\n".join(b.text if isinstance(b, TextBlock) else f"[{b.type} {b.mime_type}]" for b in content)


def _raw_input(value: object) -> str:
    if isinstance(value, str):
        return value
    # Logged arguments may nest deeper than json.dumps recurses: this falls back to compact text.
    return dumps_text(thaw(value), indent=2)  # type: ignore[arg-type]


def _diff(diffs: Sequence[FileDiff]) -> RenderableType:
    lines = Text()
    for diff in diffs:
        # Escaped on one line before it goes in the headers: the diff's lines are escaped with
        # their newlines kept, so a newline in a model's path would draw a header or hunk of its own.
        path = printable(diff.path, one_line=True)
        source = UNREAD_OLD_TEXT if diff.old_text is None else f"a/{path}"
        hunks = diff_hunks(diff.old_text or "", diff.new_text)  # bounded: the log may hold anything
        if not hunks:
            continue  # as unified diff draws a file whose lines did not change: not at all
        for line in (f"--- {source}", f"+++ b/{path}", *hunks):
            style = "green" if line.startswith("+") else "red" if line.startswith("-") else "cyan" if line.startswith("@@") else ""
            lines.append(printable(line + "\n"), style=style)
    return lines


def _call_card(view: ToolCallView) -> tuple[str, RenderableType | None]:
    if isinstance(view, TerminalCallView):
        body = _text(f"$ {view.title}", style="bold")
        if view.cwd:
            body.append(f"\n(in {printable(view.cwd, one_line=True)})", style="dim")
        return (view.description or "shell"), body
    if isinstance(view, DiffCallView):
        return view.title, _diff(view.diffs)
    assert isinstance(view, GenericCallView)
    detail = _content_text(view.content) or (_raw_input(view.raw_input) if view.raw_input is not None else "")
    return view.title, _text(detail) if detail else None


def _result_card(call: ReplayedCall) -> RenderableType:
    view = call.result_view
    result = call.result
    assert result is not None
    if isinstance(view, TerminalResultView):
        if view.exit_code is not None:
            pill = _text(f" exit {view.exit_code} ", style="white on green" if view.exit_code == 0 else "white on red")
        elif view.signal is not None:
            pill = _text(f" {view.signal} ", style="white on red")
        else:
            # Settled without either, as a command stopped before it started.
            pill = _text(" no exit status ", style="black on yellow")
        return Group(pill, _text(view.output or ""))
    if isinstance(view, DiffResultView):
        return _diff(view.diffs)
    if isinstance(view, ReadResultView):
        code = "\n".join(line.text for line in view.lines)
        header = _text(
            f"{view.path}  lines {view.offset}-{view.offset + max(len(view.lines) - 1, 0)} of {view.total_lines}",
            one_line=True,
        )
        if not view.lines:
            return Group(header, _text("(no lines in this window)", style="dim"))
        syntax = Syntax(printable(code), view.lang or "text", line_numbers=True, start_line=view.lines[0].number, word_wrap=True)
        return Group(header, syntax)
    if isinstance(view, SearchResultView):
        table = Table(show_header=False, box=None, pad_edge=False)
        if view.shape == "matches":
            for file in view.files or ():
                # One line per cell: a newline in a path or a matched line would draw a row that is not there.
                table.add_row(_text(file.path, style="bold magenta", one_line=True))
                for match in file.matches:
                    table.add_row(_text(f"  {match.line_number}: {match.line}", one_line=True))
        else:
            for path in view.paths or ():
                table.add_row(_text(path, one_line=True))
        shown = sum(len(f.matches) for f in view.files or ()) if view.shape == "matches" else len(view.paths or ())
        note = f"{shown} of {view.total} shown" + (" (truncated)" if view.truncated else "")
        return Group(table, _text(note, style="yellow" if view.truncated else "dim"))
    if isinstance(view, WebResultView):
        if view.kind == "fetch":
            return _text(f"{view.url} → {view.status_code}" + (" (truncated)" if view.truncated else ""), one_line=True)
        # A source per line: a newline in a page's title would draw a source that is not there.
        lines = [
            printable(f"• {source.title or source.url}  {source.url}", one_line=True) for source in view.sources or ()
        ]
        if view.answer:
            lines.insert(0, view.answer)
        return _text("\n".join(lines) + ("\n(truncated)" if view.truncated else ""))
    text = _content_text(view.content if isinstance(view, GenericResultView) and view.content is not None else result.content)
    # A failure's text is a message (a policy's reason, an exception's), which can be megabytes long.
    return _text(clipped(text) if result.is_error else text)


def render_replayed_call(call: ReplayedCall) -> RenderableType:
    """One call as a panel: the pending card, then the completed one (or a pending marker)."""
    title, detail = _call_card(call.call_view)
    parts: list[RenderableType] = []
    if detail is not None:
        parts.append(detail)
    if call.result is None:
        parts.append(_text(f"({unsettled_note(call.unwound)})", style="yellow"))
        border = "yellow"
    else:
        parts.append(_result_card(call))
        border = "red" if call.result.is_error else "green"
        if call.error:
            code = call.error.get("code") or "error"
            parts.append(_text(f"{code}", style="bold red", one_line=True))
    for context in call.contexts:
        # Notes to the model (a rewrite's reason, a plugin's context), not the call's output.
        parts.append(_text(f"[{context.source}] {clipped(_content_text(context.content))}", style="italic"))
    if call.contract_changed:
        parts.append(_text("(recorded against an earlier contract of this tool)", style="yellow"))
    for dispatch in call.dispatches:
        state = "error" if dispatch.get("isError") else "ok"
        line = f"  ↳ {dispatch.get('subCallId')} {dispatch.get('name')} [{state}]"
        parts.append(_text(line, style="dim", one_line=True))
    result_title = call.result_view.title if call.result_view is not None and getattr(call.result_view, "title", None) else None
    heading = terminal_text(f"{call.name} · {result_title or title}  ", (call.call_id, "dim"), one_line=True)
    return Panel(Group(*parts), title=heading, title_align="left", border_style=border)
