"""Text from tools and logs shown on a terminal: escapes instead of terminal control."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import example, given
from hypothesis import strategies as st

from dsh_core._cli import cli
from dsh_core.presentation import printable

HOSTILE = "ok\x1b[2J\x1b]0;pwned\x07\rfake prompt $ \u202eevil\u2028\x9b31m"
SHOWN = "ok\\x1b[2J\\x1b]0;pwned\\x07\\x0dfake prompt $ \\u202eevil\\u2028\\x9b31m"


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("plain text, ünïcode, 漢字", "plain text, ünïcode, 漢字"),
        ("two\nlines\tand a tab", "two\nlines\tand a tab"),
        (HOSTILE, SHOWN),
        ("family 👨\u200d👩\u200d👧", "family 👨\u200d👩\u200d👧"),  # joiners build emoji: kept
        ("no\u00a0break", "no\u00a0break"),
        ("lone \ud800", "lone \\ud800"),
    ],
    ids=["plain", "layout", "hostile", "emoji", "nbsp", "surrogate"],
)
def test_printable_escapes_what_could_drive_a_terminal(text: str, shown: str) -> None:
    assert printable(text) == shown


def test_one_line_escapes_layout_too() -> None:
    assert printable("a\nb\tc", one_line=True) == "a\\x0ab\\x09c"


def test_ordinary_text_is_returned_as_is() -> None:
    text = "nothing to escape"
    assert printable(text) is text


def _log(path: Path) -> Path:
    events = [
        ("tool/call", {"callId": "c1", "name": "echo\x1b[31m", "arguments": {"x": "\u202e"}, "agent": None}),
        ("tool/result", {"callId": "c1", "content": [{"type": "text", "text": HOSTILE}], "isError": True,
                         "error": {"name": "E", "code": "X\x1b[5m", "message": "m"}, "meta": None,
                         "trace": [{"stage": "pre", "actor": "p\x1b[8m", "outcome": "deny: \x1b[2K"}]}),
    ]  # fmt: skip
    path.write_text("".join(json.dumps({"seq": n, "type": t, "data": d}) + "\n" for n, (t, d) in enumerate(events, 1)))
    return path


@pytest.mark.parametrize("command", ["replay", "explain"])
def test_replayed_and_explained_calls_cannot_drive_the_terminal(tmp_path: Path, command: str) -> None:
    log = str(_log(tmp_path / "log.jsonl"))
    outcome = CliRunner().invoke(cli, ["--no-plugins", command, log] + (["c1"] if command == "explain" else []))
    assert outcome.exception is None or isinstance(outcome.exception, SystemExit), outcome.output
    for raw in ("\x1b", "\x07", "\r", "\u202e", "\x9b"):
        assert raw not in outcome.output
    assert "echo\\x1b[31m" in outcome.output


def test_call_escapes_tool_output_on_a_terminal_and_keeps_it_exact_in_a_pipe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plugin = tmp_path / "hostile_tool.py"
    plugin.write_text(
        "from dsh_core import define_tool, hookimpl\n"
        "async def body(args):\n"
        f"    return {HOSTILE!r}\n"
        "@hookimpl\n"
        "def dsh_setup(runtime, config):\n"
        "    runtime.register(define_tool(name='hostile', description='', parameters={}, "
        "output={'type': 'string'}, execute=body))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    arguments = ["--no-plugins", "--plugin", "hostile_tool", "call", "hostile"]
    piped = CliRunner().invoke(cli, arguments)
    assert piped.output == HOSTILE + "\n"
    monkeypatch.setattr("dsh_core._cli._stdout_is_terminal", lambda: True)
    shown = CliRunner().invoke(cli, arguments)
    assert shown.output == SHOWN + "\n"


@given(st.text())
@example("\x1b[0m\u202e\u2066\ufeff\x85\x7f")
def test_nothing_that_could_drive_a_terminal_survives(text: str) -> None:
    for one_line in (False, True):
        kept = {"\u200c", "\u200d"} | (set() if one_line else {"\n", "\t"})
        shown = printable(text, one_line=one_line)
        assert all(
            char in kept or unicodedata.category(char) not in ("Cc", "Cf", "Zl", "Zp", "Cs") for char in shown
        )
        if all(char.isprintable() or char in kept for char in text):
            assert shown == text  # nothing else is touched
