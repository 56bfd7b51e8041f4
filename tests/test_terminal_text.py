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
from dsh_core._jsoncodec import dumps_text
from dsh_core._terminal_text import json_printable
from dsh_core.presentation import printable

HOSTILE = "ok\x1b[2J\x1b]0;pwned\x07\rfake prompt $ \u202eevil\u2028\x9b31m"
# What str.isprintable refuses, but for spaces.
HIDDEN = ("Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn")
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


# Letters and symbols str.isprintable accepts that draw nothing (Default_Ignorable_Code_Point
# outside Cf/Cn, and blank glyphs): an argument made of them would look empty.
INVISIBLE = (
    "\u034f\u115f\u1160\u17b4\u17b5\u180b\u180c\u180d\u180f\u2800\u3164\ufe00\ufe0d\uffa0"
    "\U0001d159\U000e0100\U000e01ef"
)


@given(st.text())
@example("\x1b[0m\u202e\u2066\ufeff\x85\x7f")
@example("rm -rf /\u3164\u2800 x\U000e0100")
def test_nothing_that_could_drive_a_terminal_survives(text: str) -> None:
    for one_line in (False, True):
        kept = {"\u200c", "\u200d"} | (set() if one_line else {"\n", "\t"})
        shown = printable(text, one_line=one_line)
        assert all(char in kept or unicodedata.category(char) not in HIDDEN for char in shown)
        assert not any(char in INVISIBLE for char in shown)
        if all((char.isprintable() and char not in INVISIBLE) or char in kept for char in text):
            assert shown == text  # nothing else is touched


@pytest.mark.parametrize("char", INVISIBLE)
def test_printable_escapes_characters_that_draw_nothing(char: str) -> None:
    code = ord(char)
    escape = f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
    assert printable(f"x={char}!") == f"x={escape}!"
    assert printable(char, one_line=True) == escape
    assert json.loads(json_printable(json.dumps(char, ensure_ascii=False))) == char
    assert json_printable(json.dumps(char, ensure_ascii=False)) == f'"{json.dumps(char)[1:-1]}"'


def test_emoji_presentation_selectors_are_kept() -> None:
    text = "warning \u26a0\ufe0f and text style \u2764\ufe0e"
    assert printable(text) is text


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("private \ue000 and \U000f0000", "private \\ue000 and \\U000f0000"),
        ("unassigned \u0378 and \U000e0080", "unassigned \\u0378 and \\U000e0080"),
        ("isolate \u2066", "isolate \\u2066"),
        ("wide\u3000space", "wide\u3000space"),
    ],
    ids=["private-use", "unassigned", "isolate", "ideographic-space"],
)
def test_printable_escapes_everything_isprintable_refuses_but_spaces(text: str, shown: str) -> None:
    assert printable(text) == shown


# A tool whose texts carry what an MCP server could send: bidi, C1 and ANSI controls, a lone surrogate.
NASTY = "A\u202eevil\u202c B\x9b31mC1 \x1b[31mESC \u2028LS \ud800 \U000e0001"
RAW = ("\x1b", "\x9b", "\u202e", "\u2028", "\ud800", "\U000e0001")

NASTY_PLUGIN = f"""
from dsh_core import define_tool, hookimpl

async def _echo(args):
    return args["text"]

@hookimpl
def dsh_setup(runtime, config):
    runtime.register(define_tool(
        name="echo", description={NASTY!r},
        parameters={{"text": {{"type": "string", "required": True, "description": {NASTY!r}}}}},
        output={{"type": "string"}}, execute=_echo))
"""


@pytest.fixture
def nasty(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    (tmp_path / "nasty_tool.py").write_text(NASTY_PLUGIN, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    return ["--no-plugins", "--plugin", "nasty_tool"]


def _printed(arguments: list[str]) -> str:
    outcome = CliRunner().invoke(cli, arguments)
    assert outcome.exception is None, outcome.exception
    assert outcome.exit_code == 0, outcome.output
    return outcome.stdout


@given(st.text())
@example("lone \ud800 and \udfff, \u202e\x9b\x1b\x7f\u2028\ue000\u0378\U000e0001 and 👨\u200d👩")
def test_json_printable_decodes_to_the_same_value(text: str) -> None:
    for indent in (None, 2):
        shown = json_printable(dumps_text({"k": [text]}, indent=indent))
        assert json.loads(shown) == {"k": [text]}
        assert all(char in "\n\u200c\u200d" or unicodedata.category(char) not in HIDDEN for char in shown)


def test_run_prints_every_result_line_when_a_result_holds_a_lone_surrogate(nasty: list[str], tmp_path: Path) -> None:
    batch = tmp_path / "calls.jsonl"
    batch.write_text(
        '{"id": "c1", "name": "echo", "arguments": {"text": "ok"}}\n'
        '{"id": "c2", "name": "echo", "arguments": "{\\"text\\": \\"lone \\\\ud800\\"}"}\n'
        '{"id": "c3", "name": "echo", "arguments": {"text": "third \\u202e\\u009b\\u001b[2J"}}\n'
    )
    lines = _printed([*nasty, "run", str(batch)]).splitlines()
    assert [json.loads(line)["content"] for line in lines] == [
        [{"type": "text", "text": "ok"}],
        [{"type": "text", "text": "lone \ud800"}],
        [{"type": "text", "text": "third \u202e\x9b\x1b[2J"}],
    ]
    assert not any(raw in line for raw in RAW for line in lines)


@pytest.mark.parametrize("command", [["list", "--json"], ["schemas", "--json"], ["schemas"]])
def test_json_output_shows_hostile_tool_texts_as_json_escapes(nasty: list[str], command: list[str]) -> None:
    printed = _printed([*nasty, *command])
    assert not any(raw in printed for raw in RAW)
    described = json.loads(printed)[0]["description"]
    assert described == (NASTY if command[0] == "schemas" else NASTY.splitlines()[0])


def test_call_into_a_pipe_writes_a_lone_surrogate_as_an_escape(nasty: list[str]) -> None:
    printed = _printed([*nasty, "call", "echo", '{"text": "lone \\ud800 \\u202e"}'])
    assert printed == "lone \\ud800 \u202e\n"  # exact but for what no encoding can write


def test_sdk_on_a_terminal_escapes_hostile_descriptions(nasty: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("dsh_core.code_mode")
    piped = _printed([*nasty, "sdk"])
    assert "\u202e" in piped  # prompt text for the model: exact
    monkeypatch.setattr("dsh_core._cli._stdout_is_terminal", lambda: True)
    shown = _printed([*nasty, "sdk"])
    assert not any(raw in shown for raw in RAW)
    assert "A\\u202eevil" in shown


def test_a_configured_plugin_failing_with_terminal_controls_is_refused_with_escapes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "failing_setup.py").write_text(
        "from dsh_core import hookimpl\n"
        "@hookimpl\n"
        "def dsh_setup(runtime, config):\n"
        "    raise RuntimeError('boom \\x1b]0;pwned\\x07\\x1b[2J\\u202e')\n"
    )
    (tmp_path / "dsh.toml").write_text("[plugins.failing]\nx = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    batch = tmp_path / "calls.jsonl"
    batch.write_text('{"id": "c1", "name": "echo"}\n')
    for command in (["call", "echo"], ["run", str(batch)], ["serve-mcp"]):
        outcome = CliRunner().invoke(cli, ["--no-plugins", "--plugin", "failing=failing_setup", *command])
        assert outcome.exit_code == 2, outcome.output
        shown = "failed at setup: dsh_setup failed: RuntimeError: boom \\x1b]0;pwned\\x07\\x1b[2J\\u202e"
        assert shown in outcome.stderr
        assert not any(raw in outcome.stderr for raw in ("\x1b", "\x07", "\u202e"))


# Texts that rich markup reads as an escape of the tag after them, and one that is a tag.
BACKSLASHES = "x\\\\\\"
TAGGED = "[/red] \x1b]0;pwned\x07 [bold]"


def _backslashed_log(path: Path) -> Path:
    b = BACKSLASHES
    events = [
        ("tool/call", {"callId": "c1" + b, "name": "echo" + b, "arguments": {}, "agent": None}),
        ("tool/result", {"callId": "c1" + b, "content": [{"type": "text", "text": "t"}], "isError": True,
                         "error": {"name": "E", "code": "X" + b, "message": "m" + b}, "meta": None,
                         "trace": [{"stage": "pre", "actor": "p" + b, "outcome": "deny: " + b}]}),
    ]  # fmt: skip
    path.write_text("".join(json.dumps({"seq": n, "type": t, "data": d}) + "\n" for n, (t, d) in enumerate(events, 1)))
    return path


def test_explain_and_replay_show_backslashes_before_their_styling_exactly(tmp_path: Path) -> None:
    log = str(_backslashed_log(tmp_path / "log.jsonl"))
    b = BACKSLASHES
    explained = CliRunner().invoke(cli, ["--no-plugins", "explain", log, "c1" + b])
    assert explained.exception is None, explained.output
    assert f"call c1{b}: echo{b}: failed X{b}: m{b}" in explained.output
    assert f"deny: {b} " in explained.output and "[/" not in explained.output
    replayed = CliRunner().invoke(cli, ["--no-plugins", "replay", log])
    assert replayed.exception is None, replayed.output
    assert f"echo{b} · echo{b}  c1{b} " in replayed.output and "[/dim]" not in replayed.output


def test_a_tool_name_ending_in_a_backslash_is_listed_as_it_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "odd_names.py").write_text(
        "from dsh_core import define_tool, hookimpl\n"
        "async def body(args):\n"
        "    return ''\n"
        "@hookimpl\n"
        "def dsh_setup(runtime, config):\n"
        "    runtime.register(define_tool(name='slash\\\\', description='ends in \\\\', parameters={}, "
        "output={'type': 'string'}, execute=body))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("COLUMNS", "200")
    listed = _printed(["--no-plugins", "--plugin", "odd_names", "list"])
    assert "slash\\ " in listed and "ends in \\ " in listed and "\\\\" not in listed


def test_ledger_show_prints_hand_edited_entries_as_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dsh_core._session_log import SessionLog

    path = tmp_path / "effects.jsonl"
    with SessionLog(path) as log:
        started = {"key": "c1", "agent": None, "tool": "t", "arguments": "d", "contract": None, "at": TAGGED}
        log.append({"type": "effect/started", "data": started})
    monkeypatch.setenv("COLUMNS", "200")
    outcome = CliRunner().invoke(cli, ["ledger", "show", str(path)])
    assert outcome.exit_code == 1, outcome.output  # the call is in doubt
    assert outcome.exception is None or isinstance(outcome.exception, SystemExit), outcome.exception
    assert "[/red] \\x1b]0;pwned\\x07 [bold]" in outcome.stdout and "\x1b" not in outcome.stdout


FORGING_NAME = "read_file\ncall c2: read_file: succeeded"


@pytest.mark.parametrize("command", ["explain", "simulate"])
def test_a_newline_in_a_recorded_tool_name_cannot_forge_a_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: str
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "300")
    Path("calls.jsonl").write_text(json.dumps({"id": "c1", "name": FORGING_NAME, "arguments": {}}) + "\n")
    recorded = CliRunner().invoke(cli, ["--no-plugins", "run", "--session", "log.jsonl", "calls.jsonl"])
    assert recorded.exit_code == 0, recorded.output
    arguments = ["explain", "log.jsonl", "c1"] if command == "explain" else ["--no-plugins", "simulate", "log.jsonl"]
    shown = CliRunner().invoke(cli, arguments).stdout.splitlines()
    name = "read_file\\x0acall c2: read_file: succeeded"
    if command == "explain":
        assert shown == [f'call c1: {name} (agent cli): failed UNKNOWN_TOOL: unknown tool "{name}"']
    else:
        assert shown == [
            f"c1 ({name}): not compared: the recorded call never reached policy (UNKNOWN_TOOL)",
            "0 call(s) compared, 0 would change, 1 not compared",
        ]
