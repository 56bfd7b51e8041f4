"""Reading a spilled output back (read_spilled_output): windows, search, confinement, bounded answers."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import trio
from test_spill import BIG, CAP, ContentReplacer, default_spill, isolated_temp_dir, only_text, text_tool, with_spill

from dsh_core import DshConfig, TextBlock, ToolExecutionResult, ToolRuntime, load_plugins
from dsh_core.code_mode import CodeRunResult, SubprocessPythonRuntime
from dsh_core.testing import FakeCodeRuntime, expect_failure, expect_success, make_input, make_runtime
from dsh_plugins import _spill_read as spill_read
from dsh_plugins import spill
from dsh_plugins._spill_read import SpillReadError, read_spilled

SPILLED: Any = object()  # stands for the spilled file's name in parameters


async def spilled(runtime: ToolRuntime, tool: str = "dump") -> str:
    text = only_text(await runtime.execute(make_input(tool, call_id="call-7")))
    match = re.search(r"saved at (\S+);", text)
    assert match, text
    return match.group(1)


async def read(runtime: ToolRuntime, **arguments: Any) -> ToolExecutionResult:
    return await runtime.execute(make_input("read_spilled_output", arguments))


async def test_the_notice_names_the_tool_and_windows_read_everything_back(tmp_path: Path) -> None:
    runtime = with_spill(tmp_path / "spill", text_tool("dump", BIG))
    notice = only_text(await runtime.execute(make_input("dump", call_id="call-7")))
    assert "read it in parts with read_spilled_output (a range of lines" in notice
    path = await spilled(runtime)

    seen: list[str] = []
    start: int | None = 1
    windows = 0
    while start is not None:
        result = expect_success(await read(runtime, path=path, start_line=start))
        windows += 1
        assert len(only_text(result).encode()) <= CAP  # an answer never needs spilling itself
        value = result.value
        assert value["total_lines"] == 500 and value["cut_lines"] == ()
        numbers = [line["number"] for line in value["lines"]]
        assert numbers == list(range(start, start + len(numbers)))
        seen.extend(line["text"] for line in value["lines"])
        start = value["next_line"]
    assert "\n".join(seen) + "\n" == BIG
    assert windows > 1
    assert not any(name.startswith("call-") and "read_spilled" in name for name in os.listdir(tmp_path / "spill"))


async def test_a_window_is_rendered_with_line_numbers_and_where_to_continue(tmp_path: Path) -> None:
    runtime = with_spill(tmp_path / "spill", text_tool("dump", BIG))
    path = await spilled(runtime)
    text = only_text(expect_success(await read(runtime, path=path, start_line=10, max_lines=3)))
    assert text == (
        "[lines 10-12 of 500; more from start_line=13]\n"
        "    10\tline 00010 of a long result\n"
        "    11\tline 00011 of a long result\n"
        "    12\tline 00012 of a long result"
    )


async def test_contains_returns_only_matching_lines_with_their_numbers(tmp_path: Path) -> None:
    runtime = with_spill(tmp_path / "spill", text_tool("dump", BIG))
    path = await spilled(runtime)
    value = expect_success(await read(runtime, path=path, contains="line 0012", max_lines=5)).value
    assert [line["number"] for line in value["lines"]] == [120, 121, 122, 123, 124]
    assert value["next_line"] == 125
    rest = expect_success(await read(runtime, path=path, contains="line 0012", start_line=125)).value
    assert [line["number"] for line in rest["lines"]] == [125, 126, 127, 128, 129]
    assert rest["next_line"] is None
    none = expect_success(await read(runtime, path=path, contains="no such text"))
    assert only_text(none) == "[no lines containing 'no such text' from line 1 of 500]"


async def test_a_bare_file_name_is_enough(tmp_path: Path) -> None:
    runtime = with_spill(tmp_path / "spill", text_tool("dump", BIG))
    path = await spilled(runtime)
    value = expect_success(await read(runtime, path=os.path.basename(path), max_lines=1)).value
    assert value["lines"] == ({"number": 1, "text": "line 00001 of a long result"},)


async def test_a_line_longer_than_the_budget_is_cut_and_reported(tmp_path: Path) -> None:
    long_line = "x" * 5000 + "\nshort\n"
    runtime = with_spill(tmp_path / "spill", text_tool("dump", long_line))
    path = await spilled(runtime)
    result = expect_success(await read(runtime, path=path))
    assert result.value["cut_lines"] == (1,)
    assert result.value["lines"][0]["text"] == "x" * len(result.value["lines"][0]["text"])
    assert len(only_text(result).encode()) <= CAP
    assert "cut to fit: line(s) 1" in only_text(result)
    # The window ends inside the line: the next one reads on from there, not from line 2.
    shown = len(result.value["lines"][0]["text"])
    assert (result.value["next_line"], result.value["next_column"]) == (1, shown + 1)
    assert f"more from start_line=1, start_column={shown + 1}" in only_text(result)
    pieces, start, column = [], 1, 1
    while start == 1:
        answer = expect_success(await read(runtime, path=path, start_line=start, start_column=column))
        assert len(only_text(answer).encode()) <= CAP
        window = answer.value
        assert window["lines"][0].get("column", 1) == column
        pieces.append(window["lines"][0]["text"])
        start, column = window["next_line"], window["next_column"]
    assert "".join(pieces) == "x" * 5000 and len(pieces) > 2
    assert window["lines"][-1]["text"] == "short" or (start, column) == (2, None)


async def test_integral_floats_are_taken_as_the_integers_they_are(tmp_path: Path) -> None:
    """The schema's integer admits 2.0, which no slice takes."""
    runtime = with_spill(tmp_path / "spill", text_tool("dump", BIG))
    path = await spilled(runtime)
    value = expect_success(await read(runtime, path=path, start_line=2.0, start_column=3.0, max_lines=2.0)).value
    assert value["lines"] == ({"number": 2, "column": 3, "text": "ne 00002 of a long result"},
                              {"number": 3, "text": "line 00003 of a long result"})  # fmt: skip


async def test_a_search_goes_on_at_the_next_line_after_a_cut_one(tmp_path: Path) -> None:
    runtime = with_spill(tmp_path / "spill", text_tool("dump", "x" * 5000 + "needle\nneedle too\n"))
    path = await spilled(runtime)
    value = expect_success(await read(runtime, path=path, contains="needle", max_lines=1)).value
    assert value["cut_lines"] == (1,) and value["lines"][0]["text"].endswith("needle")
    assert (value["next_line"], value["next_column"]) == (2, None)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"start_column": 0}, "start_column must be at least 1, got 0"),
        ({"start_line": 2, "start_column": 7}, "start_column 7 is past the end of line 2: it has 5 characters"),
    ],
)
async def test_a_start_column_outside_its_line_is_refused(tmp_path: Path, arguments: Any, message: str) -> None:
    runtime = with_spill(tmp_path / "spill", text_tool("dump", BIG.replace("line 00002 of a long result", "short")))
    path = await spilled(runtime)
    failure = await read(runtime, path=path, **arguments)
    assert failure.is_error and message in failure.error.message  # type: ignore[union-attr]
    assert not (await read(runtime, path=path, start_line=2, start_column=6)).is_error  # just past its end: empty


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"path": "/etc/passwd"}, "is not a spilled output"),
        ({"path": "../passwd"}, "is not a spilled output"),
        ({"path": ".."}, "is not a spilled output"),
        ({"path": ""}, "must name a spilled output file"),
        ({"path": "nope-abcdef.txt"}, "there is no spilled output 'nope-abcdef.txt'"),
        ({"path": SPILLED, "start_line": 0}, "start_line must be at least 1"),
        ({"path": SPILLED, "start_line": 501}, "start_line 501 is past the end: the output has 500 lines"),
        ({"path": SPILLED, "max_lines": 0}, "max_lines must be at least 1"),
        ({"path": SPILLED, "contains": ""}, "contains must not be empty"),
    ],
)
async def test_bad_requests_fail_with_a_clear_message(tmp_path: Path, arguments: dict[str, Any], message: str) -> None:
    runtime = with_spill(tmp_path / "spill", text_tool("dump", BIG))
    name = os.path.basename(await spilled(runtime))
    arguments = {key: name if value is SPILLED else value for key, value in arguments.items()}
    result = expect_failure(await read(runtime, **arguments))
    assert message in result.error.message
    assert result.code == "SPILL_READ_ERROR"


async def test_a_symlink_in_the_spill_directory_is_not_followed(tmp_path: Path) -> None:
    runtime = with_spill(tmp_path / "spill", text_tool("dump", BIG))
    await spilled(runtime)
    secret = tmp_path / "secret.txt"
    secret.write_text("password\n")
    (tmp_path / "spill" / "link-abcdef.txt").symlink_to(secret)
    result = expect_failure(await read(runtime, path="link-abcdef.txt"))
    assert "is not a regular file" in result.error.message


async def test_a_symlink_swapped_in_after_the_check_is_not_followed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = tmp_path / "secret.txt"
    secret.write_text("password\n")
    (tmp_path / "spill").mkdir(mode=0o700)
    link = tmp_path / "spill" / "link-abcdef.txt"
    link.symlink_to(secret)
    # What a swap between the check and the open looks like: the checked name is a symlink by now.
    monkeypatch.setattr(spill_read, "_resolve", lambda directory, path: str(link))
    with pytest.raises(SpillReadError, match=r"'link-abcdef\.txt' in .* is not a regular file"):
        read_spilled(str(tmp_path / "spill"), "link-abcdef.txt", budget=1000)


async def test_nothing_spilled_yet_is_a_clear_error(tmp_path: Path) -> None:
    runtime = with_spill(tmp_path / "never-created", text_tool("dump", "small"))
    result = expect_failure(await read(runtime, path="call-1-dump-abcdef.txt"))
    assert "nothing has been spilled yet" in result.error.message


async def test_by_default_the_reader_reads_its_own_runtimes_spills_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    isolated_temp_dir(tmp_path, monkeypatch)
    mine, other = default_spill(text_tool("dump", BIG)), default_spill(text_tool("dump", BIG))
    nothing_yet = expect_failure(await read(mine, path="call-7-dump-abcdef.txt"))
    assert "nothing has been spilled yet" in nothing_yet.error.message
    path = await spilled(mine)
    their_path = await spilled(other)
    assert expect_success(await read(mine, path=path, max_lines=1)).value["lines"][0]["number"] == 1
    refused = expect_failure(await read(mine, path=their_path))
    assert "is not a spilled output" in refused.error.message
    by_name = expect_failure(await read(mine, path=os.path.basename(their_path)))
    assert "there is no spilled output" in by_name.error.message


def test_a_spill_directory_others_may_write_to_is_refused(tmp_path: Path) -> None:
    (tmp_path / "spill").mkdir()
    (tmp_path / "spill" / "a-abcdef.txt").write_text("x\n")
    (tmp_path / "spill").chmod(0o777)
    with pytest.raises(SpillReadError, match="is writable by other users \\(mode 777\\)"):
        read_spilled(str(tmp_path / "spill"), "a-abcdef.txt", budget=1000)


def test_a_spill_directory_that_is_a_symlink_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (real / "a-abcdef.txt").write_text("x\n")
    (tmp_path / "spill").symlink_to(real)
    with pytest.raises(SpillReadError, match="is a symlink"):
        read_spilled(str(tmp_path / "spill"), "a-abcdef.txt", budget=1000)


async def test_read_tool_false_registers_no_tool_and_the_notice_names_none(tmp_path: Path) -> None:
    runtime = with_spill(tmp_path / "spill", text_tool("dump", BIG), read_tool=False)
    assert runtime.get("read_spilled_output") is None
    notice = only_text(await runtime.execute(make_input("dump")))
    assert "read it in parts (a range of lines" in notice


async def test_answers_of_the_read_tool_are_never_spilled_even_under_a_tiny_cap(tmp_path: Path) -> None:
    runtime = with_spill(tmp_path / "spill", text_tool("dump", BIG), cap=400)
    path = await spilled(runtime)
    files_before = sorted(os.listdir(tmp_path / "spill"))
    result = expect_success(await read(runtime, path=path))
    assert "saved at" not in only_text(result)
    assert result.value["lines"]  # at least some text per window, whatever the cap
    assert sorted(os.listdir(tmp_path / "spill")) == files_before


async def test_a_long_contains_text_is_quoted_short_and_the_answer_stays_within_the_cap(tmp_path: Path) -> None:
    runtime = with_spill(tmp_path / "spill", text_tool("dump", BIG))
    path = await spilled(runtime)
    for needle in ("x" * 40_000, "é" * 3_000, "line 0001"):
        text = only_text(expect_success(await read(runtime, path=path, contains=needle)))
        assert len(text.encode()) <= CAP, (needle[:10], len(text.encode()))
    text = only_text(expect_success(await read(runtime, path=path, contains="x" * 40_000)))
    assert text == f"[no lines containing {'x' * 40!r}... from line 1 of 500]"


# repr() writes an unassigned code point as \U000e0080 (10 bytes) and NUL as \x00 (4 bytes).
HOSTILE_NEEDLES = ("\U000e0080" * 40, "\x00" * 40 + "zz", "\u4e00" * 40, "line 00012\x00" * 8, "\U000e0080" * 3)


@pytest.mark.parametrize("cap", [400, 600])
@pytest.mark.parametrize("needle", HOSTILE_NEEDLES, ids=["unassigned", "nul", "cjk", "nul-in-line", "short"])
async def test_a_contains_text_that_renders_long_is_quoted_within_the_cap(
    tmp_path: Path, cap: int, needle: str
) -> None:
    runtime = with_spill(tmp_path / "spill", text_tool("dump", BIG), cap=cap)
    path = await spilled(runtime)
    for extra in ({}, {"start_line": 499}, {"max_lines": 1}):
        text = only_text(expect_success(await read(runtime, path=path, contains=needle, **extra)))
        assert len(text.encode()) <= cap, (needle[:3], extra, len(text.encode()))
        header = text.split("\n")[0]
        assert len(header.encode()) < 200, header


async def test_a_quote_too_long_as_rendered_is_cut_with_an_ellipsis() -> None:
    assert spill_read._shown("\U000e0080" * 40) == repr("\U000e0080" * 6) + "..."
    assert spill_read._shown("\x00" * 40 + "zz") == repr("\x00" * 15) + "..."
    assert spill_read._shown("ab\x00") == repr("ab\x00")
    assert spill_read._shown("abc", limit=0) == "..."


async def test_under_a_cap_smaller_than_the_quote_the_quote_gives_way(tmp_path: Path) -> None:
    # The directory already holds a spill (made under a larger cap): the reader's answers still fit.
    runtime = with_spill(tmp_path / "spill", text_tool("dump", BIG), cap=400)
    path = await spilled(runtime)
    unassigned = "\U000e0080"
    tiny, small = with_spill(tmp_path / "spill", cap=50), with_spill(tmp_path / "spill", cap=60)
    text = only_text(expect_success(await read(tiny, path=path, contains=unassigned * 40)))
    assert text == "[no lines containing ... from line 1 of 500]"
    text = only_text(expect_success(await read(small, path=path, contains=unassigned * 2)))
    assert text == f"[no lines containing {unassigned!r}... from line 1 of 500]"
    assert len(text.encode()) <= 60


async def test_answers_with_line_numbers_of_seven_digits_stay_within_the_cap(tmp_path: Path) -> None:
    lines = 1_010_000
    runtime = with_spill(tmp_path / "spill", text_tool("dump", "ab\n" * lines), cap=32768)
    path = await spilled(runtime)
    result = expect_success(await read(runtime, path=path, start_line=1_000_000, max_lines=100_000))
    text = only_text(result)
    assert len(text.encode()) <= 32768
    numbers = [line["number"] for line in result.value["lines"]]
    assert numbers == list(range(1_000_000, 1_000_000 + len(numbers)))
    assert result.value["next_line"] == numbers[-1] + 1
    assert f"\n{1_000_000}\tab\n" in text


@pytest.mark.parametrize("cap", [400, 600, 2000])
async def test_every_window_fits_a_small_cap_and_together_they_read_everything(tmp_path: Path, cap: int) -> None:
    long_lines = "".join(f"{n:04d} " + "y" * (n * 37 % 900) + "\n" for n in range(1, 60))
    runtime = with_spill(tmp_path / "spill", text_tool("dump", long_lines), cap=cap)
    path = await spilled(runtime)
    start: int | None = 1
    column: int | None = None
    read_back: dict[int, str] = {}
    while start is not None:
        result = expect_success(await read(runtime, path=path, start_line=start, start_column=column or 1))
        assert len(only_text(result).encode()) <= cap
        for line in result.value["lines"]:
            assert line.get("column", 1) == len(read_back.get(line["number"], "")) + 1
            read_back[line["number"]] = read_back.get(line["number"], "") + line["text"]
        start, column = result.value["next_line"], result.value["next_column"]
    assert "".join(f"{read_back[n]}\n" for n in sorted(read_back)) == long_lines  # every line, whole


async def test_the_policy_never_spills_its_readers_answers(tmp_path: Path) -> None:
    runtime = make_runtime(text_tool("reader", BIG), text_tool("other", BIG))
    policy = spill.SpillPolicy(CAP, spill.SpillStore(str(tmp_path)), reader="reader")
    runtime.plugins.register(policy)
    assert only_text(await runtime.execute(make_input("reader"))) == BIG
    assert "saved at" in only_text(await runtime.execute(make_input("other")))


async def test_under_a_tool_prefix_the_notice_and_the_exemption_use_the_prefixed_name(tmp_path: Path) -> None:
    runtime = ToolRuntime()
    runtime.register(text_tool("dump", BIG))
    # An inner listener that makes every answer oversized, the reader's too.
    runtime.plugins.register(ContentReplacer([TextBlock(BIG)]))
    config = DshConfig(
        plugins={"spill": {"max_inline_bytes": CAP, "directory": str(tmp_path / "spill")}},
        tool_prefixes={"spill": "sp"},
    )
    point = importlib.metadata.EntryPoint(name="spill", value="dsh_plugins.spill", group="dsh")
    report = load_plugins(runtime, config=config, entry_points=[point])
    assert [plugin.tools for plugin in report.loaded] == [("sp__read_spilled_output",)]

    notice = only_text(await runtime.execute(make_input("dump", call_id="call-7")))
    assert "read it in parts with sp__read_spilled_output (a range of lines" in notice
    path = re.search(r"saved at (\S+);", notice).group(1)  # type: ignore[union-attr]
    answer = await runtime.execute(make_input("sp__read_spilled_output", {"path": path}))
    assert only_text(answer) == BIG  # the reader's own answer is never spilled, under its registered name
    assert len(os.listdir(tmp_path / "spill")) == 1


# --- Code Mode: the model reads through run_code -------------------------------------------

# Quotes, backslashes, tabs and control characters grow in JSON (\" \\ \t \u0001); non-ASCII does not.
AWKWARD = "".join(
    f'{n:04d} "quoted" \\path\\ \x01\x02 tab\there é€ ' + "z" * (n * 13 % 300) + "\n" for n in range(1, 400)
)


def code_mode_with_spill(tmp_path: Path, text: str, cap: int, program: Any) -> ToolRuntime:
    runtime = ToolRuntime(mode="code", code_runtime=FakeCodeRuntime(program))
    runtime.register(text_tool("dump", text))
    spill.dsh_setup(runtime, {"max_inline_bytes": cap, "directory": str(tmp_path / "spill")})
    return runtime


async def run_code(runtime: ToolRuntime, call_id: str, code: str = "...") -> str:
    result = await runtime.execute(make_input("run_code", {"code": code, "description": "d"}, call_id=call_id))
    return only_text(expect_success(result))


@pytest.mark.parametrize("text", [BIG, AWKWARD], ids=["plain", "awkward"])
@pytest.mark.parametrize("cap", [600, 2000, 32768])
async def test_a_window_a_program_returns_fits_the_cap_so_following_the_notice_ends(
    tmp_path: Path, text: str, cap: int
) -> None:
    reads: list[dict[str, Any]] = []

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        if not reads:  # the first run returns the whole output: run_code's answer is spilled
            return CodeRunResult(value=await tools["dump"]({}), has_value=True)
        # What the notice leads to: read a window and return it (run_code shows it as indented JSON).
        return CodeRunResult(value=await tools["read_spilled_output"](reads[-1]), has_value=True)

    runtime = code_mode_with_spill(tmp_path, text * 3 if cap == 32768 else text, cap, program)
    notice = await run_code(runtime, "r0")
    assert "read it in parts with read_spilled_output" in notice
    path = re.search(r"saved at (\S+);", notice).group(1)  # type: ignore[union-attr]
    files = sorted(os.listdir(tmp_path / "spill"))

    saved = Path(path).read_text().split("\n")[:-1]
    read_back: dict[int, str] = {}
    start: int | None = 1
    column: int | None = None
    while start is not None:
        reads.append({"path": path, "start_line": start, "start_column": column or 1})
        answer = await run_code(runtime, f"r{len(reads)}")
        assert len(answer.encode()) <= cap and "saved at" not in answer
        window = json.loads(answer)
        for line in window["lines"]:
            # A line longer than a window is cut (and listed), and read on from where it was cut.
            assert line.get("column", 1) == len(read_back.get(line["number"], "")) + 1
            read_back[line["number"]] = read_back.get(line["number"], "") + line["text"]
        start, column = window["next_line"], window["next_column"]
    assert [read_back[n] for n in sorted(read_back)] == saved
    assert sorted(os.listdir(tmp_path / "spill")) == files  # no window was spilled again


async def test_a_window_read_natively_is_sized_for_its_text_as_before(tmp_path: Path) -> None:
    # Only a program gets the value to return as JSON: a native read keeps its fuller windows.
    runtime = with_spill(tmp_path / "spill", text_tool("dump", BIG), cap=2000)
    path = await spilled(runtime)
    answer = expect_success(await read(runtime, path=path))
    # 52 lines of about 35 rendered bytes each; sized for JSON (about 80 bytes a line) it would be 21.
    assert len(answer.value["lines"]) == 52 and len(only_text(answer).encode()) <= 2000


async def test_a_real_program_that_returns_a_window_is_not_spilled_again(tmp_path: Path) -> None:
    runtime = ToolRuntime(mode="code", code_runtime=SubprocessPythonRuntime(wall_budget_s=20))
    runtime.register(text_tool("dump", AWKWARD))
    spill.dsh_setup(runtime, {"max_inline_bytes": 2000, "directory": str(tmp_path / "spill")})
    notice = await run_code(runtime, "r0", "return await tools.dump({})")
    path = re.search(r"saved at (\S+);", notice).group(1)  # type: ignore[union-attr]
    answer = await run_code(runtime, "r1", f"return await tools.read_spilled_output({{'path': {path!r}}})")
    assert len(answer.encode()) <= 2000 and "saved at" not in answer
    window = json.loads(answer)
    assert window["lines"][0]["text"] == AWKWARD.split("\n", 1)[0] and window["next_line"] > 1
    assert len(os.listdir(tmp_path / "spill")) == 1


def test_a_line_that_is_not_utf8_is_shown_with_replacement_characters(tmp_path: Path) -> None:
    """A file from elsewhere in a configured directory failed every window reaching it with a bare UnicodeDecodeError."""
    directory = tmp_path / "spill"
    directory.mkdir(mode=0o700)
    (directory / "foreign-abcdef.txt").write_bytes(b"one\nlatin1 caf\xe9\nthree\n")
    window = read_spilled(str(directory), "foreign-abcdef.txt", budget=1000)
    assert [line["text"] for line in window["lines"]] == ["one", "latin1 caf\ufffd", "three"]
    found = read_spilled(str(directory), "foreign-abcdef.txt", budget=1000, contains="three")
    assert [line["number"] for line in found["lines"]] == [3]


def test_a_search_in_a_line_too_long_to_show_shows_the_part_around_the_match(tmp_path: Path) -> None:
    """One minified line: every window, the search's too, showed its first kilobytes, never the match in the middle."""
    directory = tmp_path / "spill"
    directory.mkdir(mode=0o700)
    line = "".join(f'{{"id": "item-{n}"}},' for n in range(2000))
    (directory / "api-abcdef.txt").write_text(line + "\n")
    window = read_spilled(str(directory), "api-abcdef.txt", budget=1000, contains='"item-1500"')
    (shown,) = window["lines"]
    assert shown["text"].startswith("…") and '"item-1500"' in shown["text"]
    assert window["cut_lines"] == [1]
    head = read_spilled(str(directory), "api-abcdef.txt", budget=1000)["lines"][0]["text"]
    assert head.startswith('{"id": "item-0"}')  # without a search the window starts at the line's head, as before


def test_only_the_names_a_store_gives_are_read_from_the_spill_directory(tmp_path: Path) -> None:
    """A directory configured beside the host's files let the model read its .env (s20 spill/undo audit)."""
    directory = tmp_path / "spill"
    directory.mkdir(mode=0o700)
    (directory / ".env").write_text("OPENAI_API_KEY=sk-secret\n")
    (directory / "grants.jsonl").write_text("{}\n")
    (directory / "call-1-dump-0a1b2c.txt").write_text("spilled\n")
    for name in (".env", "grants.jsonl", str(directory / ".env")):
        with pytest.raises(SpillReadError, match="is not a spilled output"):
            read_spilled(str(directory), name, budget=1000)
    assert read_spilled(str(directory), "call-1-dump-0a1b2c.txt", budget=1000)["lines"][0]["text"] == "spilled"


async def test_a_store_given_a_directory_with_a_trailing_slash_names_paths_its_reader_takes(tmp_path: Path) -> None:
    """The notice named <dir>//<file>, and the reader refused it as not in <dir>/ (s20 spill/undo audit)."""
    store = spill.SpillStore(str(tmp_path / "spill") + "/")
    saved = await trio.to_thread.run_sync(store.save, "call-1", "dump", "line\n")
    assert store.directory is not None
    assert read_spilled(store.directory, saved, budget=1000)["lines"][0]["text"] == "line"
