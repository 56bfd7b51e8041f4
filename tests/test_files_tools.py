"""The first-party file tools (dsh_plugins.files): confinement, each tool through the pipeline, presenters."""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import re
import shutil
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import given, settings
from hypothesis import strategies as st

from dsh_core import (
    CancelSignal,
    ConfigError,
    Exclusive,
    Parallel,
    ToolExecution,
    ToolExecutionFailure,
    ToolExecutionResult,
    ToolExecutionSuccess,
    ToolExecutionToken,
    ToolRuntime,
    snapshot_json,
)
from dsh_core.presentation import (
    DiffCallView,
    DiffResultView,
    FileDiff,
    FileLocation,
    GenericCallView,
    ReadFileLine,
    ReadResultView,
    SearchFileMatches,
    SearchMatch,
    SearchResultView,
)
from dsh_core.testing import make_input, make_runtime
from dsh_plugins import files
from dsh_plugins.approval import TerminalApproval
from dsh_plugins.files import MAX_LINE_CHARS, FileToolError, compile_glob, file_tools

REAL_RG = shutil.which("rg")


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "src").mkdir(parents=True)
    (root / "src" / "main.py").write_text("".join(f"line {n}\n" for n in range(1, 11)))
    (root / "README.md").write_text("# title\nhello world\n")
    (tmp_path / "outside.txt").write_text("secret\n")
    return root


def runtime_for(root: Path) -> ToolRuntime:
    return make_runtime(*file_tools(root))


async def run(root: Path, name: str, arguments: dict[str, Any]) -> ToolExecutionResult:
    return await runtime_for(root).execute(make_input(name, arguments))


def ok(result: ToolExecutionResult) -> Any:
    assert isinstance(result, ToolExecutionSuccess), result
    return result.value


def failed(result: ToolExecutionResult, code: str) -> str:
    assert isinstance(result, ToolExecutionFailure), result
    assert result.code == code, result.error
    return result.error.message


def tool(root: Path, name: str) -> Any:
    return next(t for t in file_tools(root) if t.name == name)


# --- confinement -------------------------------------------------------------------------

ESCAPES = {
    "read_file": lambda p: {"path": p},
    "write_file": lambda p: {"path": p, "content": "x"},
    "edit_file": lambda p: {"path": p, "old_string": "secret", "new_string": "x"},
    "glob": lambda p: {"pattern": "*", "path": p},
    "grep": lambda p: {"pattern": "secret", "path": p},
}


@pytest.fixture(params=["dotdot", "absolute", "symlink"])
def escape(request: pytest.FixtureRequest, workspace: Path) -> str:
    outside = workspace.parent / "outside.txt"
    if request.param == "dotdot":
        return "../outside.txt"
    if request.param == "absolute":
        return str(outside)
    (workspace / "link.txt").symlink_to(outside)
    return "link.txt"


@pytest.mark.parametrize("name", sorted(ESCAPES))
async def test_paths_outside_the_workspace_are_refused(workspace: Path, escape: str, name: str) -> None:
    arguments = ESCAPES[name](escape)
    message = failed(await run(workspace, name, arguments), "OUTSIDE_WORKSPACE")
    assert repr(escape) in message and "outside the workspace root" in message
    # Not where it leads: /proc/self/fd/N would name every file the host has open.
    assert "outside.txt" not in message.replace(repr(escape), "")
    assert (workspace.parent / "outside.txt").read_text() == "secret\n"


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs Linux's /proc")
async def test_a_refused_path_does_not_say_where_a_host_link_leads(workspace: Path, tmp_path: Path) -> None:
    with open(tmp_path / "host-private-audit.jsonl", "w") as host_file:
        message = failed(
            await run(workspace, "read_file", {"path": f"/proc/self/fd/{host_file.fileno()}"}), "OUTSIDE_WORKSPACE"
        )
    assert "host-private" not in message


@pytest.mark.skipif(os.geteuid() == 0 or not os.path.isdir("/proc/1"), reason="needs /proc/1/cwd to be unreadable")
async def test_a_link_the_path_cannot_follow_is_a_file_error(workspace: Path) -> None:
    """realpath's PermissionError escaped as a TOOL_ERROR."""
    (workspace / "inlink").symlink_to("/proc/1/cwd/etc")
    assert "permission denied" in failed(await run(workspace, "read_file", {"path": "inlink/passwd"}), "FILE_ERROR")


async def test_a_symlink_out_through_a_directory_is_refused_for_new_files(workspace: Path, tmp_path: Path) -> None:
    (tmp_path / "elsewhere").mkdir()
    (workspace / "out").symlink_to(tmp_path / "elsewhere")
    failed(await run(workspace, "write_file", {"path": "out/new.txt", "content": "x"}), "OUTSIDE_WORKSPACE")
    assert not (tmp_path / "elsewhere" / "new.txt").exists()


async def test_dotdot_that_stays_inside_and_symlinks_inside_are_fine(workspace: Path) -> None:
    (workspace / "alias.py").symlink_to(workspace / "src" / "main.py")
    assert ok(await run(workspace, "read_file", {"path": "src/../src/main.py", "limit": 1}))["path"] == "src/main.py"
    assert ok(await run(workspace, "read_file", {"path": "alias.py", "limit": 1}))["lines"] == (
        {"number": 1, "text": "line 1"},
    )
    assert ok(await run(workspace, "read_file", {"path": str(workspace / "README.md")}))["path"] == "README.md"


async def test_glob_patterns_cannot_climb_out(workspace: Path) -> None:
    message = failed(await run(workspace, "glob", {"pattern": "../*"}), "OUTSIDE_WORKSPACE")
    assert "'../*'" in message


# --- read_file -----------------------------------------------------------------------------


async def test_read_file_returns_a_numbered_window_and_the_total(workspace: Path) -> None:
    result = await run(workspace, "read_file", {"path": "src/main.py", "offset": 3, "limit": 2})
    assert ok(result) == {
        "path": "src/main.py",
        "offset": 3,
        "lines": ({"number": 3, "text": "line 3"}, {"number": 4, "text": "line 4"}),
        "total_lines": 10,
    }
    text = result.content[0].text  # type: ignore[union-attr]
    assert text.startswith("src/main.py (lines 3-4 of 10)\n     3\tline 3")
    assert "continue with offset=5" in text


async def test_integral_floats_are_taken_as_integers(workspace: Path) -> None:
    arguments = {"path": "src/main.py", "offset": 2.0, "limit": 1.0}
    result = await run(workspace, "read_file", arguments)
    assert ok(result)["offset"] == 2 and type(ok(result)["offset"]) is int
    assert tool(workspace, "read_file").present_result(arguments, result).offset == 2


async def test_read_file_names_the_lines_that_are_not_utf8(workspace: Path) -> None:
    """They read as U+FFFD with no word of it: rewritten from what was read, every byte was lost for good."""
    (workspace / "latin1.txt").write_bytes("# Résumé\nplain\ncafé\n".encode("latin-1"))
    result = await run(workspace, "read_file", {"path": "latin1.txt"})
    value = ok(result)
    assert value["not_utf8_lines"] == (1, 3)
    assert value["lines"][0]["text"] == "# R\ufffdsum\ufffd"
    text = result.content[0].text  # type: ignore[union-attr]
    assert text.endswith(
        "[not UTF-8: the bytes of line(s) 1, 3 that are not UTF-8 show as U+FFFD; writing this text back would "
        "replace them for good, and edit_file refuses the file]"
    )
    assert "not_utf8_lines" not in ok(await run(workspace, "read_file", {"path": "README.md"}))


async def test_a_line_cut_inside_a_character_is_not_called_not_utf8(workspace: Path) -> None:
    # One ASCII byte, then two-byte characters: the line's first 4 * MAX_LINE_CHARS + 4 bytes end inside one.
    (workspace / "long.txt").write_text("x" + "é" * (4 * MAX_LINE_CHARS) + "\n")
    assert (4 * MAX_LINE_CHARS + 4 - 1) % 2 == 1
    assert "not_utf8_lines" not in ok(await run(workspace, "read_file", {"path": "long.txt"}))


async def test_read_file_past_the_end_keeps_the_offset(workspace: Path) -> None:
    value = ok(await run(workspace, "read_file", {"path": "src/main.py", "offset": 50}))
    assert value["lines"] == () and value["offset"] == 50 and value["total_lines"] == 10


async def test_read_file_defaults_to_2000_lines(workspace: Path) -> None:
    (workspace / "big.txt").write_text("x\n" * 2500)
    value = ok(await run(workspace, "read_file", {"path": "big.txt"}))
    assert len(value["lines"]) == 2000 and value["total_lines"] == 2500


async def test_read_file_cuts_very_long_lines(workspace: Path) -> None:
    (workspace / "min.js").write_text("a" * (MAX_LINE_CHARS + 10) + "\r\n")
    line = ok(await run(workspace, "read_file", {"path": "min.js"}))["lines"][0]["text"]
    assert line.startswith("a" * MAX_LINE_CHARS) and f"{MAX_LINE_CHARS + 10} characters" in line


async def test_a_line_of_many_megabytes_is_read_in_bounded_memory_and_counted(workspace: Path) -> None:
    import tracemalloc

    size = 30 * 1024 * 1024
    with open(workspace / "huge.min.js", "wb") as stream:
        stream.write("é".encode() * (size // 2) + b"\r\nsecond line\n" + b"x" * (size // 4))
    tracemalloc.start()
    try:
        value = ok(await run(workspace, "read_file", {"path": "huge.min.js", "limit": 2}))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * 1024 * 1024  # the file is 37 MiB; no line of it is held whole
    first, second = value["lines"]
    assert first["text"] == "é" * MAX_LINE_CHARS + f"… [line cut: {size // 2} characters]"
    assert second["text"] == "second line"
    assert value["total_lines"] == 3


@pytest.mark.parametrize("path", ["newdir/", "newdir/.", "newdir/./", "src/newdir/..", ".", ""])
async def test_write_file_refuses_a_path_that_names_a_directory(workspace: Path, path: str) -> None:
    """"newdir/." is "newdir/" to realpath: a file named newdir was written."""
    message = failed(await run(workspace, "write_file", {"path": path, "content": "x"}), "FILE_ERROR")
    assert "names a directory" in message
    assert not (workspace / "newdir").exists() and not (workspace / "src" / "newdir").exists()


@pytest.mark.parametrize("name", ["read_file", "write_file", "edit_file", "glob", "grep"])
async def test_a_path_holding_a_lone_surrogate_is_a_file_error(workspace: Path, name: str) -> None:
    arguments = ESCAPES[name]("bad\ud800.txt")
    message = failed(await run(workspace, name, arguments), "FILE_ERROR")
    assert "lone surrogate" in message


async def test_a_file_tool_past_its_deadline_resolves_on_time_and_reports_its_thread(workspace: Path) -> None:
    """Work a worker thread cannot stop mid-way (one huge line) never holds a timed-out call open."""
    from dsh_plugins import timeout

    with open(workspace / "big.txt", "wb") as stream:
        stream.write(b"a" * (100 * 1024 * 1024))
    runtime = runtime_for(workspace)
    timeout.dsh_setup(runtime, {"default_ms": 20})
    started = trio.current_time()
    result = await runtime.execute(make_input("read_file", {"path": "big.txt"}))
    assert failed(result, "TOOL_TIMEOUT")
    assert trio.current_time() - started < 5  # the read itself takes longer than the budget
    await trio.sleep(0)
    orphans = runtime.orphaned_work()
    assert [orphan.tool for orphan in orphans] in ([], ["read_file"])  # reported while it still runs


@pytest.mark.parametrize(
    ("setup", "arguments", "fragment"),
    [
        (lambda root: (root / "blob.bin").write_bytes(b"\x00\x01"), {"path": "blob.bin"}, "binary"),
        (lambda root: None, {"path": "missing.txt"}, "does not exist"),
        (lambda root: None, {"path": "src"}, "is a directory"),
        (lambda root: None, {"path": "README.md", "offset": 0}, "offset must be at least 1"),
        (lambda root: None, {"path": "README.md", "limit": 0}, "limit must be at least 1"),
    ],
)
async def test_read_file_errors_say_what_is_wrong(
    workspace: Path, setup: Any, arguments: dict[str, Any], fragment: str
) -> None:
    setup(workspace)
    assert fragment in failed(await run(workspace, "read_file", arguments), "FILE_ERROR")


# --- write_file / edit_file ------------------------------------------------------------------


async def test_write_file_creates_parents_and_reports_a_new_file(workspace: Path) -> None:
    value = ok(await run(workspace, "write_file", {"path": "a/b/c.txt", "content": "héllo\n"}))
    assert value == {"path": "a/b/c.txt", "created": True, "bytes_written": 7, "old_text": None}
    assert (workspace / "a" / "b" / "c.txt").read_bytes() == "héllo\n".encode()


async def test_write_file_overwrite_keeps_the_before_image_and_line_endings(workspace: Path) -> None:
    value = ok(await run(workspace, "write_file", {"path": "README.md", "content": "new\r\n"}))
    assert value["created"] is False and value["old_text"] == "# title\nhello world\n"
    assert (workspace / "README.md").read_bytes() == b"new\r\n"


async def test_write_file_refuses_a_directory(workspace: Path) -> None:
    assert "is a directory" in failed(await run(workspace, "write_file", {"path": "src", "content": "x"}), "FILE_ERROR")


@pytest.mark.parametrize(
    ("name", "arguments"),
    [
        ("read_file", {"path": "pipe"}),
        ("write_file", {"path": "pipe", "content": "x"}),
        ("edit_file", {"path": "pipe", "old_string": "a", "new_string": "b"}),
    ],
)
async def test_special_files_are_refused_instead_of_blocking(
    workspace: Path, name: str, arguments: dict[str, Any]
) -> None:
    os.mkfifo(workspace / "pipe")
    with trio.fail_after(5):
        assert "not a regular file" in failed(await run(workspace, name, arguments), "FILE_ERROR")


@pytest.fixture
def fifos() -> Iterator[list[Path]]:
    """FIFOs a test makes; opened for both ends afterwards, so no thread stays blocked opening one."""
    made: list[Path] = []
    yield made
    for fifo in made:
        with contextlib.suppress(OSError):
            os.close(os.open(fifo, os.O_RDWR | os.O_NONBLOCK))


def swap_for_a_fifo(file: Path, fifos: list[Path]) -> None:
    file.unlink()
    os.mkfifo(file)
    fifos.append(file)


@pytest.mark.parametrize(
    ("name", "arguments"),
    [
        ("read_file", {"path": "README.md"}),
        ("write_file", {"path": "README.md", "content": "x"}),
        ("edit_file", {"path": "README.md", "old_string": "hello", "new_string": "bye"}),
    ],
)
async def test_a_fifo_swapped_in_after_the_checks_is_refused_not_opened(
    workspace: Path,
    monkeypatch: pytest.MonkeyPatch,
    fifos: list[Path],
    name: str,
    arguments: dict[str, Any],
) -> None:
    # Another process (a bash job left running) swaps the file for a FIFO between the
    # tool's checks and its open: a plain open() would block its worker thread forever.
    resolve = files.Workspace.resolve

    def resolve_then_swap(self: files.Workspace, path: str) -> str:
        real = resolve(self, path)
        swap_for_a_fifo(workspace / "README.md", fifos)
        return real

    monkeypatch.setattr(files.Workspace, "resolve", resolve_then_swap)
    monkeypatch.setattr(files, "_check_regular", lambda real, path: True)  # what a stat before the swap saw
    with trio.fail_after(5):
        message = failed(await run(workspace, name, arguments), "FILE_ERROR")
    assert message == "'README.md' is not a regular file"
    assert stat.S_ISFIFO(os.lstat(workspace / "README.md").st_mode)


async def test_a_symlink_swapped_in_after_resolving_is_not_followed(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    resolve = files.Workspace.resolve

    def resolve_then_swap(self: files.Workspace, path: str) -> str:
        real = resolve(self, path)
        (workspace / "README.md").unlink()
        (workspace / "README.md").symlink_to(workspace.parent / "outside.txt")
        return real

    monkeypatch.setattr(files.Workspace, "resolve", resolve_then_swap)
    message = failed(await run(workspace, "write_file", {"path": "README.md", "content": "x"}), "FILE_ERROR")
    assert message == "'README.md' is not a regular file"
    assert (workspace.parent / "outside.txt").read_text() == "secret\n"


async def test_edit_file_replaces_a_unique_string(workspace: Path) -> None:
    value = ok(await run(workspace, "edit_file", {"path": "README.md", "old_string": "hello", "new_string": "bye"}))
    assert value == {
        "path": "README.md",
        "replacements": 1,
        "positions": (8,),
        "sha256": hashlib.sha256(b"# title\nbye world\n").hexdigest(),
        "before_sha256": hashlib.sha256(b"# title\nhello world\n").hexdigest(),
    }
    assert (workspace / "README.md").read_text() == "# title\nbye world\n"


@pytest.mark.parametrize(("text", "old", "places", "separate"), [("aaa", "aa", 2, 1), ("aaaa", "aa", 3, 2), ("ababa", "aba", 2, 1)])
async def test_overlapping_occurrences_make_an_edit_ambiguous(
    workspace: Path, text: str, old: str, places: int, separate: int
) -> None:
    """The count quoted was the overlapping one, and replace_all, as advised, then replaced another number."""
    (workspace / "a.txt").write_text(text)
    message = failed(
        await run(workspace, "edit_file", {"path": "a.txt", "old_string": old, "new_string": "b"}), "FILE_ERROR"
    )
    assert message == (
        f"old_string occurs at {places} overlapping places in 'a.txt'; include more surrounding text to make it "
        f"unique (replace_all=true would replace {separate}, left to right, none overlapping)"
    )
    assert (workspace / "a.txt").read_text() == text
    arguments = {"path": "a.txt", "old_string": old, "new_string": "b", "replace_all": True}
    assert ok(await run(workspace, "edit_file", arguments))["replacements"] == separate


async def test_edit_file_refuses_an_ambiguous_string_and_says_how_many(workspace: Path) -> None:
    before = (workspace / "src" / "main.py").read_text()
    arguments = {"path": "src/main.py", "old_string": "line 1", "new_string": "x"}
    message = failed(await run(workspace, "edit_file", arguments), "FILE_ERROR")
    assert "occurs 2 times" in message and "replace_all" in message  # "line 1" and "line 10"
    assert (workspace / "src" / "main.py").read_text() == before


async def test_edit_file_replace_all_replaces_every_occurrence(workspace: Path) -> None:
    arguments = {"path": "src/main.py", "old_string": "line", "new_string": "row", "replace_all": True}
    assert ok(await run(workspace, "edit_file", arguments))["replacements"] == 10
    assert "line" not in (workspace / "src" / "main.py").read_text()


@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        ({"old_string": "absent", "new_string": "x"}, "was not found"),
        ({"old_string": "", "new_string": "x"}, "must not be empty"),
        ({"old_string": "hello", "new_string": "hello"}, "identical"),
    ],
)
async def test_edit_file_refusals(workspace: Path, arguments: dict[str, Any], fragment: str) -> None:
    message = failed(await run(workspace, "edit_file", {"path": "README.md", **arguments}), "FILE_ERROR")
    assert fragment in message
    assert (workspace / "README.md").read_text() == "# title\nhello world\n"


async def test_edit_file_refuses_a_file_read_file_calls_binary(workspace: Path) -> None:
    (workspace / "blob.bin").write_bytes(b"header\x00needle\n")
    arguments = {"path": "blob.bin", "old_string": "needle", "new_string": "x"}
    assert "looks like a binary file" in failed(await run(workspace, "edit_file", arguments), "FILE_ERROR")
    assert (workspace / "blob.bin").read_bytes() == b"header\x00needle\n"


@pytest.mark.parametrize("pattern", ["./*.md", "././*.md", ".//*.md"])
async def test_a_glob_starting_with_dot_slash_matches_as_without_it(workspace: Path, pattern: str) -> None:
    """Paths are matched relative to `path`: "./*.md" matched nothing."""
    assert ok(await run(workspace, "glob", {"pattern": pattern}))["paths"] == ("README.md",)


async def test_edit_file_hints_at_crlf_line_endings(workspace: Path) -> None:
    (workspace / "dos.txt").write_bytes(b"one\r\ntwo\r\n")
    arguments = {"path": "dos.txt", "old_string": "one\ntwo", "new_string": "x"}
    assert "CRLF" in failed(await run(workspace, "edit_file", arguments), "FILE_ERROR")


async def test_edit_file_refuses_non_utf8_files(workspace: Path) -> None:
    (workspace / "latin1.txt").write_bytes(b"caf\xe9\n")
    arguments = {"path": "latin1.txt", "old_string": "caf", "new_string": "x"}
    assert "not UTF-8" in failed(await run(workspace, "edit_file", arguments), "FILE_ERROR")


async def test_edit_file_refuses_a_file_larger_than_it_edits(workspace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """It read any file whole, several times over in memory: a model-named 300 MB log took 1.2 GB."""
    monkeypatch.setattr(files, "MAX_EDIT_BYTES", 1000)
    (workspace / "fits.txt").write_bytes(b"needle" + b"x" * 994)
    (workspace / "big.txt").write_bytes(b"needle" + b"x" * 995)
    with open(workspace / "sparse.log", "wb") as sparse:
        sparse.truncate(1 << 40)  # a terabyte that takes no disk: refused before anything is read
    arguments = {"old_string": "needle", "new_string": "pin"}
    assert ok(await run(workspace, "edit_file", {"path": "fits.txt", **arguments}))["replacements"] == 1
    for name, size in (("big.txt", 1001), ("sparse.log", 1 << 40)):
        message = failed(await run(workspace, "edit_file", {"path": name, **arguments}), "FILE_ERROR")
        assert message == (
            f"'{name}' is {size} bytes, more than the 1000 bytes edit_file edits; "
            "use write_file, or a shell tool, for a file that large"
        )
    assert (workspace / "big.txt").read_bytes() == b"needle" + b"x" * 995


async def test_a_revert_of_an_edit_refuses_a_file_grown_past_the_edit_limit(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dsh_plugins.undo import PLUGIN_NAME, UndoLog

    runtime = runtime_for(workspace)
    log = UndoLog(runtime)
    runtime.plugins.register(log, name=PLUGIN_NAME)
    arguments = {"path": "README.md", "old_string": "hello", "new_string": "bye"}
    ok(await runtime.execute(make_input("edit_file", arguments)))
    monkeypatch.setattr(files, "MAX_EDIT_BYTES", 10)
    (outcome,) = await log.undo()
    assert not outcome.reverted
    assert outcome.error == "'README.md' is 18 bytes, more than the 10 bytes edit_file edits; the edit_file call was not reverted"


# --- glob ----------------------------------------------------------------------------------


def touch(path: Path, mtime: float) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("x\n")
    os.utime(path, (mtime, mtime))


async def test_glob_sorts_newest_first_and_recurses_with_double_star(tmp_path: Path) -> None:
    touch(tmp_path / "old.py", 1_000)
    touch(tmp_path / "pkg" / "new.py", 3_000)
    touch(tmp_path / "pkg" / "deep" / "mid.py", 2_000)
    touch(tmp_path / "notes.txt", 4_000)
    value = ok(await run(tmp_path, "glob", {"pattern": "**/*.py"}))
    assert value == {"paths": ("pkg/new.py", "pkg/deep/mid.py", "old.py"), "total": 3, "truncated": False}
    assert ok(await run(tmp_path, "glob", {"pattern": "*.py"}))["paths"] == ("old.py",)
    assert ok(await run(tmp_path, "glob", {"pattern": "*.py", "path": "pkg"}))["paths"] == ("pkg/new.py",)


async def test_glob_limit_reports_truncation_and_total(tmp_path: Path) -> None:
    for n in range(5):
        touch(tmp_path / f"f{n}.txt", 1_000 + n)
    value = ok(await run(tmp_path, "glob", {"pattern": "*.txt", "limit": 2}))
    assert value == {"paths": ("f4.txt", "f3.txt"), "total": 5, "truncated": True}
    assert "showing 2 of 5 files" in (await run(tmp_path, "glob", {"pattern": "*", "limit": 2})).content[0].text  # type: ignore[union-attr]


async def test_glob_skips_git_and_symlinks_out_and_returns_only_files(tmp_path: Path) -> None:
    root = tmp_path / "ws"
    touch(root / ".git" / "config.py", 1)
    touch(root / "a.py", 1)
    touch(tmp_path / "outside.py", 1)
    (root / "link.py").symlink_to(tmp_path / "outside.py")
    (root / "dir.py").mkdir()
    assert ok(await run(root, "glob", {"pattern": "**/*.py"}))["paths"] == ("a.py",)


@pytest.mark.parametrize(
    ("pattern", "path", "expected"),
    [
        ("*.py", "a.py", True),
        ("*.py", "d/a.py", False),
        ("**/*.py", "a.py", True),
        ("**/*.py", "d/e/a.py", True),
        ("src/**", "src/x/y", True),
        ("*.{ts,tsx}", "a.tsx", True),
        ("*.{ts,tsx}", "a.js", False),
        ("file?.txt", "file1.txt", True),
        ("file[!0-9].txt", "file1.txt", False),
        ("file[ab].txt", "fileb.txt", True),
        ("a+b.txt", "a+b.txt", True),
        ("a+b.txt", "aab.txt", False),
        # A class's leading "]" is a member, negated or not (the negated one used to match nothing).
        ("[!]a]x", "bx", True),
        ("[!]a]x", "]x", False),
        ("[!]]", "b", True),
        ("[]a]x", "]x", True),
        ("[[]x", "[x", True),
        ("[a&&b]", "&", True),
        ("[\\]", "\\", True),
        # Braces never join two stars into one "**" (the empty alternative used to cross segments).
        ("*{}*", "/", False),
        ("a*{,x}*", "ab/c", False),
        ("a*{,x}*", "abxc", True),
        ("*{*/x,}", "a/x", True),
        ("*{*/x,}", "a/b/x", False),
    ],
)
def test_glob_syntax(pattern: str, path: str, expected: bool) -> None:
    assert bool(compile_glob(pattern).match(path)) is expected


def _reference_regex(pattern: str) -> str:
    """The glob as a backtracking regex, the way the matcher used to be built: the meaning to keep."""
    out: list[str] = []
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:[^/]*/)*")
            i += 3
            continue
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            continue
        char = pattern[i]
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "{" and "}" in pattern[i:]:
            end = pattern.index("}", i)
            out.append("(?:" + "|".join(_reference_regex(alt) for alt in pattern[i + 1 : end].split(",")) + ")")
            i = end + 1
            continue
        else:
            out.append(re.escape(char))
        i += 1
    return "".join(out)


@settings(max_examples=400, deadline=None)
@given(
    pattern=st.text(alphabet="ab/*?{},", max_size=10).filter(lambda p: "{" not in p or ("}" in p and "{{" not in p)),
    path=st.text(alphabet="ab/", max_size=10),
)
def test_glob_matching_agrees_with_the_regex_it_replaced(pattern: str, path: str) -> None:
    if re.search(r"\{[^}]*\{|\}[^{]*\}", pattern) or "**{" in pattern or re.search(r"\{[^}]*\*\*", pattern):
        # Nested or stray braces, or a group right after ** (expanded, "**{}/" is "**/", which also
        # matches no directory), or ** inside a group ("{**}/" expands to "**/" too): the simple
        # reference does not model them.
        return
    reference = re.fullmatch(f"(?s:{_reference_regex(pattern)})", path) is not None
    assert compile_glob(pattern).match(path) is reference


def test_a_pattern_made_to_backtrack_is_matched_in_linear_time() -> None:
    name = "a" * 5000
    matcher = compile_glob("*a*a*a*a*a*a*a*b")
    assert matcher.match(name) is False
    assert matcher.match(name + "b") is True


# Braces that multiply a long pattern: 256 alternatives of about 960 positions each.
COSTLY_GLOB = "{*,?}" * 8 + "*a" * 476 + "b"


def test_a_glob_whose_alternatives_add_up_to_too_many_positions_is_refused() -> None:
    with pytest.raises(FileToolError, match=re.escape(f"more than {files.MAX_GLOB_STATES} pattern positions")):
        compile_glob(COSTLY_GLOB)
    many_short = compile_glob("{a,b}" * 8)  # 256 alternatives, but short ones
    assert many_short.match("ab" * 4) and not many_short.match("ab" * 3)


async def test_glob_refuses_a_pattern_too_costly_to_match(tmp_path: Path) -> None:
    (tmp_path / ("a" * 240)).write_text("x")
    message = failed(await run(tmp_path, "glob", {"pattern": COSTLY_GLOB}), "FILE_ERROR")
    assert message.startswith("glob pattern is too complex") and "5000" in message


def test_a_long_glob_match_checks_for_cancellation_as_it_goes() -> None:
    checks: list[int] = []
    matcher = compile_glob("*a*a*a*a*a*a*a*b")
    assert matcher.match("a" * 5000, check=lambda: checks.append(1)) is False
    assert len(checks) >= 2  # several times along one name, not once per call

    class Stop(Exception):
        pass

    def cancelled() -> None:
        raise Stop

    with pytest.raises(Stop):
        matcher.match("a" * 5000, check=cancelled)
    assert compile_glob("*.py").match("a.py", check=cancelled)  # a short match finishes first


async def test_a_cancelled_glob_stops_between_files_of_one_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for n in range(5):
        (tmp_path / f"f{n}.txt").write_text("x")
    matched: list[str] = []
    real_compile = files.compile_glob

    class Recording:
        def __init__(self, pattern: str) -> None:
            self.matcher = real_compile(pattern)

        def match(self, path: str, **options: Any) -> bool:
            matched.append(path)
            return self.matcher.match(path, **options)

    started, resume = threading.Event(), threading.Event()

    def check_cancelled() -> None:
        started.set()
        resume.wait(10)
        trio.from_thread.check_cancelled()

    monkeypatch.setattr(files, "compile_glob", Recording)
    monkeypatch.setattr(files, "_check_cancelled", check_cancelled)
    runtime, signal = runtime_for(tmp_path), CancelSignal()

    async def cancel_once_checking() -> None:
        with trio.fail_after(10):
            await trio.to_thread.run_sync(started.wait)
        signal.cancel("user")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancel_once_checking)
        result = await runtime.execute(make_input("glob", {"pattern": "*"}, signal=signal))
    assert failed(result, "ABORTED")
    resume.set()
    with trio.fail_after(10):
        await runtime.wait_for_orphans()
    assert matched == []  # checked before the first file, not once the whole directory was matched


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        ("file[z-a].txt", "glob character class [z-a] is not valid"),
        ("a\x00b", "must not contain a NUL character"),
        ("x" * 1001, "at most 1000 are taken"),
        ("{a,b}" * 9, "more than 256 {...} alternatives"),
        ("{" * 400 + "a,b" + "}" * 400, None),  # deep nesting: no RecursionError
    ],
)
def test_glob_patterns_that_cannot_be_used_are_refused_clearly(pattern: str, message: str | None) -> None:
    if message is None:
        matcher = compile_glob(pattern)
        assert matcher.match("a") and matcher.match("b") and not matcher.match("{a")
        return
    with pytest.raises(FileToolError, match=re.escape(message)):
        compile_glob(pattern)


# --- grep ----------------------------------------------------------------------------------


@pytest.fixture(params=["rg", "python"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    if request.param == "rg":
        if REAL_RG is None:
            pytest.skip("ripgrep (rg) is not installed")
    else:
        monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    yield request.param


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    (root / "a").mkdir(parents=True)
    (root / "c").mkdir()
    (root / "a" / "x.py").write_text("needle one\nhay\nNeedle two\n")
    (root / "b.txt").write_text("hay\nneedle three\n")
    (root / "c" / "y.py").write_text("needle four\nneedle five\n")
    (root / ".hidden.py").write_text("needle hidden\n")
    (root / "blob.bin").write_bytes(b"\x00needle binary\n")
    return root


async def test_grep_groups_matches_by_file_in_path_order(tree: Path, backend: str) -> None:
    value = ok(await run(tree, "grep", {"pattern": "needle"}))
    assert value == {
        "files": (
            {"path": "a/x.py", "matches": ({"line_number": 1, "line": "needle one"},)},
            {"path": "b.txt", "matches": ({"line_number": 2, "line": "needle three"},)},
            {
                "path": "c/y.py",
                "matches": ({"line_number": 1, "line": "needle four"}, {"line_number": 2, "line": "needle five"}),
            },
        ),
        "total": 4,
        "truncated": False,
    }


async def test_grep_limit_keeps_the_first_matches_and_counts_all(tree: Path, backend: str) -> None:
    result = await run(tree, "grep", {"pattern": "needle", "limit": 2, "ignore_case": True})
    value = ok(result)
    assert value["total"] == 5 and value["truncated"] is True
    assert value["files"] == (
        {
            "path": "a/x.py",
            "matches": ({"line_number": 1, "line": "needle one"}, {"line_number": 3, "line": "Needle two"}),
        },
    )
    assert "showing 2 of 5 matching lines" in result.content[0].text  # type: ignore[union-attr]


async def test_grep_glob_filter_and_single_file(tree: Path, backend: str) -> None:
    by_glob = ok(await run(tree, "grep", {"pattern": "needle", "glob": "*.py"}))
    # As in rg, a glob that names a hidden file searches it.
    assert [f["path"] for f in by_glob["files"]] == [".hidden.py", "a/x.py", "c/y.py"] and by_glob["total"] == 4
    nested = ok(await run(tree, "grep", {"pattern": "needle", "glob": "c/*.py"}))
    assert [f["path"] for f in nested["files"]] == ["c/y.py"]
    one = ok(await run(tree, "grep", {"pattern": "needle", "path": "b.txt"}))
    assert one["files"] == ({"path": "b.txt", "matches": ({"line_number": 2, "line": "needle three"},)},)


async def test_grep_skips_a_binary_file_even_when_named_by_path(tree: Path, backend: str) -> None:
    # ripgrep searches a file it is given by name without its binary detection.
    assert ok(await run(tree, "grep", {"pattern": "needle", "path": "blob.bin"})) == {
        "files": (),
        "total": 0,
        "truncated": False,
    }


async def test_grep_skips_a_file_with_a_nul_past_its_first_bytes_while_walking(tmp_path: Path, backend: str) -> None:
    # ripgrep drops such a file as binary wherever the NUL is; the built-in search listed its matches.
    late_nul = b"needle early\n" + b"x" * 20_000 + b"\n\x00 needle late\n"
    (tmp_path / "a_late_nul.txt").write_bytes(late_nul)
    (tmp_path / "b.txt").write_bytes(b"needle b\n" * 3)
    value = ok(await run(tmp_path, "grep", {"pattern": "needle", "limit": 2}))
    assert value == {
        "files": ({"path": "b.txt", "matches": ({"line_number": 1, "line": "needle b"}, {"line_number": 2, "line": "needle b"})},),
        "total": 3,
        "truncated": True,
    }
    # Named by path, both search it whole.
    named = ok(await run(tmp_path, "grep", {"pattern": "needle", "path": "a_late_nul.txt"}))
    assert [match["line_number"] for match in named["files"][0]["matches"]] == [1, 3] and named["total"] == 2


async def test_grep_shows_a_line_that_is_not_utf8_with_replacement_characters(tmp_path: Path, backend: str) -> None:
    (tmp_path / "latin1.txt").write_bytes(b"caf\xe9 needle\n")
    value = ok(await run(tmp_path, "grep", {"pattern": "needle"}))
    # Not a lone surrogate (which no UTF-8 encoder takes): the same text on both backends.
    assert value["files"] == ({"path": "latin1.txt", "matches": ({"line_number": 1, "line": "caf\ufffd needle"},)},)


async def test_grep_counts_files_whose_names_are_not_utf8_instead_of_listing_them(
    tmp_path: Path, backend: str
) -> None:
    # Listed, such a name held a lone surrogate: no UTF-8 encoder takes it (the model's request,
    # a log line), and read_file refuses it; shown with U+FFFD it names another file.
    (tmp_path / "ok.txt").write_text("needle\n")
    for name in (b"bad\xff.txt", b"worse\xfe.txt"):
        with open(os.path.join(os.fsencode(tmp_path), name), "wb") as stream:
            stream.write(b"needle\nneedle\n")
    os.mkdir(os.path.join(os.fsencode(tmp_path), b"dir\xff"))
    with open(os.path.join(os.fsencode(tmp_path), b"dir\xff", b"inner.txt"), "wb") as stream:
        stream.write(b"needle\n")
    result = await run(tmp_path, "grep", {"pattern": "needle"})
    value = ok(result)
    assert value == {
        "files": ({"path": "ok.txt", "matches": ({"line_number": 1, "line": "needle"},)},),
        "total": 1,
        "truncated": False,
        "names_not_utf8": 3,
    }
    json.dumps(value, ensure_ascii=False).encode("utf-8")
    text = result.content[0].text  # type: ignore[union-attr]
    assert text.endswith("[3 file(s) with matches left out: a path that is not UTF-8 text cannot be passed to any tool here]")
    text.encode("utf-8")
    none = await run(tmp_path, "grep", {"pattern": "needle", "glob": "bad*"})
    assert ok(none) == {"files": (), "total": 0, "truncated": False, "names_not_utf8": 1}
    assert none.content[0].text.startswith("No matches for 'needle'\n[1 file(s) with matches left out")  # type: ignore[union-attr]


async def test_glob_counts_files_whose_names_are_not_utf8_instead_of_listing_them(tmp_path: Path) -> None:
    (tmp_path / "ok.txt").write_text("x\n")
    with open(os.path.join(os.fsencode(tmp_path), b"bad\xff.txt"), "wb") as stream:
        stream.write(b"x\n")
    result = await run(tmp_path, "glob", {"pattern": "*.txt"})
    assert ok(result) == {"paths": ("ok.txt",), "total": 1, "truncated": False, "names_not_utf8": 1}
    assert result.content[0].text == (  # type: ignore[union-attr]
        "ok.txt\n[1 matching file(s) left out: a path that is not UTF-8 text cannot be passed to any tool here]"
    )
    only = await run(tmp_path, "glob", {"pattern": "bad*"})
    assert ok(only) == {"paths": (), "total": 0, "truncated": False, "names_not_utf8": 1}
    assert ok(await run(tmp_path, "glob", {"pattern": "ok*"})) == {"paths": ("ok.txt",), "total": 1, "truncated": False}


async def test_grep_without_matches(tree: Path, backend: str) -> None:
    result = await run(tree, "grep", {"pattern": "absent"})
    assert ok(result) == {"files": (), "total": 0, "truncated": False}
    assert result.content[0].text == "No matches for 'absent'"  # type: ignore[union-attr]


async def test_grep_invalid_regex_is_a_tool_error(tree: Path, backend: str) -> None:
    failed(await run(tree, "grep", {"pattern": "needle("}), "FILE_ERROR")


@pytest.mark.parametrize(
    "pattern",
    ["(" * 2000 + "needle" + ")" * 2000, "needle{4294967296}"],
    ids=["nested-2000-deep", "huge-repetition"],
)
async def test_grep_regex_too_deep_or_too_large_is_invalid(tree: Path, backend: str, pattern: str) -> None:
    # Python's re.compile raises RecursionError / OverflowError for these, not re.error;
    # ripgrep refuses them as a regex parse error.
    message = failed(await run(tree, "grep", {"pattern": pattern}), "FILE_ERROR")
    expected = "invalid regular expression" if backend == "python" else "grep failed: regex parse error"
    assert message.startswith(expected)
    if backend == "python":
        assert len(message) < 200  # the pattern is quoted shortened, not in full


async def test_grep_catastrophic_pattern_is_stopped_without_freezing_the_host(
    tree: Path, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With re, "(a+)+$" on a long line of a's held the GIL for good: the host's event loop froze with it."""
    (tree / "c" / "long.txt").write_text("a" * 5000 + "!\n")
    monkeypatch.setattr(files, "GREP_LINE_REGEX_SECONDS", 0.3)
    ticks = 0

    async def heartbeat() -> None:
        nonlocal ticks
        while True:
            await trio.sleep(0.01)
            ticks += 1

    started = time.monotonic()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(heartbeat)
        with trio.fail_after(10):
            result = await run(tree, "grep", {"pattern": "(a+)+$", "path": "c"})
        nursery.cancel_scope.cancel()
    elapsed = time.monotonic() - started
    if backend == "python":
        message = failed(result, "FILE_ERROR")
        assert message.startswith("the regular expression '(a+)+$' ran for more than 0.3 s on line 1 of c/long.txt")
        assert 0.25 <= elapsed < 5  # (the engine measures its own time)
        assert ticks >= 10  # the loop kept running while the pattern did
    else:
        assert ok(result)["total"] == 0  # ripgrep's engine does not backtrack


@pytest.mark.parametrize("pattern", ["(?:a{65535}){65535}", "(a{1000}){1000}", "((x{50}){50}){50}|y", "(?:ab{400}){300,}"])
async def test_grep_pattern_whose_counts_multiply_out_too_far_is_refused(tree: Path, backend: str, pattern: str) -> None:
    """regex multiplies nested counts out when it compiles: the first of these exhausted the host's memory."""
    with trio.fail_after(20):
        result = await run(tree, "grep", {"pattern": pattern})
    if backend == "python":
        message = failed(result, "FILE_ERROR")
        assert message.startswith(f"the regular expression {pattern!r} is too large: its counted repetitions")
    # ripgrep bounds its compiled size itself: it refuses a pattern past that, or searches in linear time.


async def test_grep_patterns_are_not_kept_in_the_regex_modules_cache(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """regex caches 500 compiled patterns: large ones sent by a model would pile up there."""
    import regex

    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    regex.purge()
    for n in range(3):
        ok(await run(tree, "grep", {"pattern": f"(?:needle|x{{{9000 + n}}})"}))
    assert len(regex._main._cache) == 0


@pytest.mark.parametrize("pattern", ["needle{1,3}", "n(e{2})dle", "x{9999}|needle", "(?:needle|hay){1,2}"])
async def test_grep_patterns_with_counts_within_the_bound_still_search(
    tree: Path, backend: str, pattern: str
) -> None:
    assert ok(await run(tree, "grep", {"pattern": pattern}))["total"] >= 1


async def test_grep_pattern_too_long_for_an_argument_is_refused_by_both_backends(tree: Path, backend: str) -> None:
    """ripgrep got it as one argument: past 128 KiB the kernel refused it (E2BIG) and the call failed TOOL_ERROR."""
    longest = "(?:" + "x" * (files.MAX_GREP_PATTERN_CHARS - 11) + ")?needle"
    assert len(longest) == files.MAX_GREP_PATTERN_CHARS
    assert ok(await run(tree, "grep", {"pattern": longest}))["total"] >= 1
    message = failed(await run(tree, "grep", {"pattern": "é" * 200_000}), "FILE_ERROR")
    assert message == f"pattern is 200000 characters long; at most {files.MAX_GREP_PATTERN_CHARS} are taken"


async def test_grep_anchors_at_the_end_of_a_crlf_line_with_both_backends(tree: Path, backend: str) -> None:
    """ripgrep's "$" stopped before "\n" only: on CRLF files every "...$" search found nothing."""
    (tree / "dos.txt").write_bytes(b"first needle\r\nsecond\r\n")
    value = ok(await run(tree, "grep", {"pattern": "needle$", "glob": "dos.txt"}))
    assert value["files"] == ({"path": "dos.txt", "matches": ({"line_number": 1, "line": "first needle"},)},)


async def test_grep_takes_a_glob_starting_with_dot_slash_with_both_backends(tree: Path, backend: str) -> None:
    value = ok(await run(tree, "grep", {"pattern": "needle", "glob": "./a/*.py"}))
    assert [file["path"] for file in value["files"]] == ["a/x.py"]


async def test_grep_shows_a_match_far_into_a_long_line_with_both_backends(tree: Path, backend: str) -> None:
    """A minified file's match showed the line's first 500 characters, never the match."""
    (tree / "min.js").write_text("x" * 5000 + "needle" + "y" * 3000 + "\n" + "needle early" + "z" * 1000 + "\n")
    value = ok(await run(tree, "grep", {"pattern": "needle", "glob": "min.js"}))
    far, early = value["files"][0]["matches"]
    start = 5000 - files.MAX_MATCH_CHARS // 4
    assert far["line"] == (
        "…" + ("x" * 5000 + "needle" + "y" * 3000)[start : start + files.MAX_MATCH_CHARS]
        + f"… [line cut: 8006 characters; shown from character {start + 1}]"
    )
    assert "needle" in far["line"]
    assert early["line"].startswith("needle early") and early["line"].endswith("[line cut: 1012 characters]")


async def test_grep_refuses_a_negated_glob_with_both_backends(tree: Path, backend: str) -> None:
    """ripgrep searched every file but *.py, the built-in search files named "!...": two answers."""
    message = failed(await run(tree, "grep", {"pattern": "needle", "glob": "!*.py"}), "FILE_ERROR")
    assert message == "glob must name the files to search; a leading '!' (every file but) is not supported"


def make_path_too_long_to_name(root: Path) -> None:
    """Directories nested past PATH_MAX, made by descriptor (no path-based call reaches the last one)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(20):
            os.mkdir("y" * 250, dir_fd=fd)
            deeper = os.open("y" * 250, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = deeper
        os.close(os.open("f.txt", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
    finally:
        os.close(fd)


async def test_grep_skips_what_it_cannot_open_instead_of_failing_the_search(tree: Path, backend: str) -> None:
    """ripgrep ran with --no-messages: one unreachable file made it exit 2 with nothing said ("ripgrep failed")."""
    make_path_too_long_to_name(tree)
    assert ok(await run(tree, "grep", {"pattern": "absent"}))["total"] == 0
    assert ok(await run(tree, "grep", {"pattern": "needle"}))["total"] >= 1


async def test_write_file_refuses_a_path_no_other_call_could_reach(tree: Path) -> None:
    deep = "/".join(["z" * 250] * 20) + "/f.txt"
    message = failed(await run(tree, "write_file", {"path": deep, "content": "x"}), "FILE_ERROR")
    assert f"paths are limited to {files.PATH_MAX - 1} here" in message
    assert not (tree / ("z" * 250)).exists()


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("read_file", {"path": "x" * 1_000_000}),
        ("write_file", {"path": "y/" * 300_000, "content": ""}),
        ("edit_file", {"path": "q" * 1_000_000, "old_string": "a", "new_string": "b"}),
        ("glob", {"pattern": "*", "path": "z" * 1_000_000}),
        ("read_file", {"path": "../" * 300_000}),
    ],
)
async def test_an_error_quotes_a_models_long_path_by_its_ends(tree: Path, tool: str, arguments: dict[str, Any]) -> None:
    """The message goes back to the model: a megabyte path came back whole, once or twice."""
    result = await run(tree, tool, arguments)
    assert isinstance(result, ToolExecutionFailure), result
    path = arguments["path"]
    assert repr(path[:150])[:-1] in result.error.message and "…" in result.error.message
    assert len(result.error.message) < 1500


async def test_grep_missing_path(tree: Path, backend: str) -> None:
    assert "does not exist" in failed(await run(tree, "grep", {"pattern": "x", "path": "nope"}), "FILE_ERROR")


async def test_grep_refuses_a_fifo_instead_of_blocking_on_it(tree: Path, backend: str) -> None:
    os.mkfifo(tree / "pipe")
    with trio.fail_after(5):
        message = failed(await run(tree, "grep", {"pattern": "x", "path": "pipe"}), "FILE_ERROR")
    assert message == "'pipe' is not a regular file or a directory"


async def test_grep_fallback_skips_a_file_swapped_for_a_fifo_after_the_walk(
    tree: Path, monkeypatch: pytest.MonkeyPatch, fifos: list[Path]
) -> None:
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    walk = files._walk_files

    def walk_then_swap(*args: Any, **kwargs: Any) -> Iterator[str]:
        for file in walk(*args, **kwargs):
            if file.endswith("b.txt"):
                swap_for_a_fifo(Path(file), fifos)
            yield file

    monkeypatch.setattr(files, "_walk_files", walk_then_swap)
    with trio.fail_after(5):
        value = ok(await run(tree, "grep", {"pattern": "needle"}))
    assert [f["path"] for f in value["files"]] == ["a/x.py", "c/y.py"]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"pattern": "nee\x00dle"}, "pattern must not contain a NUL character (binary files are not searched)"),
        (
            {"pattern": "needle", "glob": "*.t\x00xt"},
            "glob pattern must not contain a NUL character (no path holds one)",
        ),
    ],
)
async def test_grep_refuses_a_nul_character_in_its_pattern_or_glob(
    tree: Path, backend: str, arguments: dict[str, Any], message: str
) -> None:
    # On the ripgrep path a NUL reached argv, and the call failed as an unexplained TOOL_ERROR.
    assert failed(await run(tree, "grep", arguments), "FILE_ERROR") == message


@pytest.mark.parametrize(
    ("glob", "message"),
    [
        ("{a,b}" * 9, "glob pattern has more than 256 {...} alternatives; split it up"),
        ("x" * 1001, "glob pattern is 1001 characters long; at most 1000 are taken"),
    ],
)
async def test_grep_glob_bounds_hold_with_either_backend(tree: Path, backend: str, glob: str, message: str) -> None:
    """ripgrep took a glob the built-in search refuses, and quietly matched it to nothing."""
    assert failed(await run(tree, "grep", {"pattern": "needle", "glob": glob}), "FILE_ERROR") == message


async def test_grep_says_which_glob_ripgrep_cannot_read(tree: Path) -> None:
    if shutil.which("rg") is None:
        pytest.skip("ripgrep is not installed")
    message = failed(await run(tree, "grep", {"pattern": "needle", "glob": "{a,{b}}"}), "FILE_ERROR")
    assert message == "invalid glob pattern: '{a,{b}}': nested alternate groups are not allowed"


async def test_grep_never_follows_a_symlinked_file(tree: Path, backend: str) -> None:
    (tree / "link.txt").symlink_to(tree / "b.txt")
    value = ok(await run(tree, "grep", {"pattern": "needle three"}))
    assert [f["path"] for f in value["files"]] == ["b.txt"]


async def test_grep_keeps_the_head_of_a_line_megabytes_long_in_bounded_memory(tmp_path: Path, backend: str) -> None:
    import tracemalloc


    size = 16 * 1024 * 1024
    escaped = 'é"\t\\' * (1 << 20)  # characters JSON escapes, and one of two bytes
    with open(tmp_path / "min.js", "wb") as stream:
        stream.write(b"needle" + b"x" * size + b"\n")
        stream.write(b"short needle\n")
        stream.write(escaped.encode() + b"needle\n")
    tracemalloc.start()
    try:
        value = ok(await run(tmp_path, "grep", {"pattern": "needle"}))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * 1024 * 1024  # the lines are 16 and 5 MiB; neither is held whole
    (file,) = value["files"]
    assert file["path"] == "min.js"
    long, short, *special = file["matches"]
    assert long == {"line_number": 1, "line": "needle" + "x" * 494 + f"… [line cut: {size + 6} characters]"}
    assert short == {"line_number": 2, "line": "short needle"}
    if backend == "rg":
        assert special == [{"line_number": 3, "line": escaped[:500] + f"… [line cut: {len(escaped) + 6} characters]"}]
    else:  # the built-in search matches only a long line's head, and "needle" is at its end
        assert special == []


async def test_grep_finds_a_match_deep_in_a_long_line_with_either_backend(tmp_path: Path, backend: str) -> None:
    """The built-in search matched only a line's first 64 KiB: a match past it was missed, silently."""
    from dsh_plugins.files import GREP_LINE_BYTES

    (tmp_path / "bundle.min.js").write_bytes(b"x" * (GREP_LINE_BYTES - 100) + b"needle\n")
    (file,) = ok(await run(tmp_path, "grep", {"pattern": "needle"}))["files"]
    assert [match["line_number"] for match in file["matches"]] == [1]


async def test_grep_without_rg_counts_a_line_of_hundreds_of_megabytes_without_holding_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tracemalloc

    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    size = 256 * 1024 * 1024
    with open(tmp_path / "huge.log", "wb") as stream:
        stream.write(b"needle" + b"x" * 10_000)
        stream.truncate(size)  # sparse: one line, NULs past the head (which the binary sniff reads)
    tracemalloc.start()
    try:
        # Named by path: found while walking, a file with a NUL anywhere is skipped as binary.
        value = ok(await run(tmp_path, "grep", {"pattern": "needle", "path": "huge.log"}))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 8 * 1024 * 1024
    assert value["files"] == (
        {"path": "huge.log", "matches": ({"line_number": 1, "line": "needle" + "x" * 494 + f"… [line cut: {size} characters]"},)},
    )


async def test_a_cancelled_grep_without_rg_stops_inside_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    (tmp_path / "big.log").write_text("hay\n" * (3 * files._GREP_LINES_PER_CHECK))
    checks: list[int] = []
    started, resume = threading.Event(), threading.Event()

    def check_cancelled() -> None:
        checks.append(1)
        if len(checks) == 2:  # the first check inside the file (the first is before opening it)
            started.set()
            resume.wait(10)
        trio.from_thread.check_cancelled()

    monkeypatch.setattr(files, "_check_cancelled", check_cancelled)
    runtime, signal = runtime_for(tmp_path), CancelSignal()

    async def cancel_once_checking() -> None:
        await trio.to_thread.run_sync(started.wait, abandon_on_cancel=True)
        signal.cancel("user")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancel_once_checking)
        with trio.fail_after(10):
            result = await runtime.execute(make_input("grep", {"pattern": "needle", "path": "big.log"}, signal=signal))
        nursery.cancel_scope.cancel()
    assert failed(result, "ABORTED")
    resume.set()
    with trio.fail_after(10):
        await runtime.wait_for_orphans()
    assert len(checks) == 2  # it stopped there, before the rest of the file


@settings(max_examples=300, deadline=None)
@given(
    line=st.text(alphabet='a"\\\r\t\x01é€😀', max_size=60),
    ending=st.sampled_from(["\n", "\r\n", ""]),
    chunk=st.integers(min_value=1, max_value=17),
    as_bytes=st.booleans(),
)
def test_rg_messages_clip_an_oversized_match_wherever_the_chunks_fall(
    line: str, ending: str, chunk: int, as_bytes: bool
) -> None:
    text = line + ending
    # rg writes a line that is not UTF-8 as base64; the length is then counted in bytes.
    field = {"bytes": base64.b64encode(text.encode()).decode()} if as_bytes else {"text": text}
    match = {"type": "match", "data": {"path": {"text": "d/a.txt"}, "lines": field,
             "line_number": 7, "absolute_offset": 0, "submatches": [{"match": {"text": "a"}, "start": 0, "end": 1}]}}  # fmt: skip
    output = "\n".join(json.dumps(m, ensure_ascii=False, separators=(",", ":")) for m in ({"type": "begin"}, match, {"type": "end"}))
    data = (output + "\n").encode()
    seen: list[tuple[Any, int | None]] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(files, "_RG_MESSAGE_CAP", 40)  # every match message is oversized
        patch.setattr(files, "_RG_LINE_HEAD_BYTES", 24)
        messages = files._RgMessages(lambda message, length: seen.append((message, length)))
        for start in range(0, len(data), chunk):
            messages.feed(data[start : start + chunk])
        messages.close()
    assert [message["type"] for message, _ in seen] == ["begin", "match", "end"]
    clipped, length = seen[1]
    whole: str | bytes = text.encode() if as_bytes else text
    assert length == len(whole) - text.endswith("\n") - text.endswith("\r\n")  # without the line ending
    assert clipped["data"]["line_number"] == 7 and clipped["data"]["path"] == {"text": "d/a.txt"}
    lines = clipped["data"]["lines"]
    head = base64.b64decode(lines["bytes"]) if as_bytes else lines["text"]
    assert whole.startswith(head) and len(head) >= min(len(whole), 4)  # type: ignore[arg-type]


async def test_grep_asks_for_rg_and_falls_back_without_it(monkeypatch: pytest.MonkeyPatch, tree: Path) -> None:
    asked: list[str] = []

    def which(name: str, *args: Any, **kwargs: Any) -> None:
        asked.append(name)

    monkeypatch.setattr(shutil, "which", which)
    assert ok(await run(tree, "grep", {"pattern": "needle"}))["total"] == 4
    assert asked == ["rg"]


# --- presenters and scheduling ---------------------------------------------------------------


async def test_read_file_presents_a_read_card_from_the_durable_meta(workspace: Path) -> None:
    arguments = {"path": "src/main.py", "limit": 1}
    result = await run(workspace, "read_file", arguments)
    view = ReadResultView(
        path="src/main.py", offset=1, lines=[ReadFileLine(number=1, text="line 1")], total_lines=10, lang="python"
    )
    read = tool(workspace, "read_file")
    assert read.present_result(arguments, result) == view
    durable = {"content": [], "isError": False, "meta": result.meta}
    assert read.present_result(arguments, durable) == view
    assert read.present_result({"path": "x"}, await run(workspace, "read_file", {"path": "x"})) is None
    assert isinstance(read.present_call(arguments), GenericCallView)


async def test_write_and_edit_present_diffs(workspace: Path) -> None:
    write, edit = tool(workspace, "write_file"), tool(workspace, "edit_file")
    new = {"path": "n.txt", "content": "hi\n"}
    assert write.present_call(new) == DiffCallView(
        title="Write n.txt",
        diffs=[FileDiff(path="n.txt", old_text=None, new_text="hi\n")],
        locations=[FileLocation(path="n.txt")],
    )
    created = write.present_result(new, await run(workspace, "write_file", new))
    assert created == DiffResultView(
        title="Created n.txt", diffs=[FileDiff(path="n.txt", old_text=None, new_text="hi\n")]
    )
    again = {"path": "n.txt", "content": "ho\n"}
    replaced = write.present_result(again, await run(workspace, "write_file", again))
    assert replaced.diffs == (FileDiff(path="n.txt", old_text="hi\n", new_text="ho\n"),)

    change = {"path": "n.txt", "old_string": "ho", "new_string": "hey"}
    hunk = FileDiff(path="n.txt", old_text="ho", new_text="hey")
    assert edit.present_call(change).diffs == (hunk,)
    assert edit.present_result(change, await run(workspace, "edit_file", change)) == DiffResultView(
        title="Edited n.txt", diffs=[hunk]
    )


def test_an_edit_of_every_occurrence_is_asked_as_one(workspace: Path) -> None:
    """The hunk is the same as a single edit's: the question must say that every place changes."""
    approval = TerminalApproval(runtime_for(workspace))

    def question(arguments: dict[str, Any]) -> str:
        execution = ToolExecution(
            call_id="c1", root_call_id="c1", name="edit_file", arguments=snapshot_json(arguments),
            signal=CancelSignal(), token=ToolExecutionToken(), agent=None,
        )  # fmt: skip
        return approval.question(execution, "edits need a yes")

    once = {"path": "deploy.sh", "old_string": "--dry-run", "new_string": ""}
    every = {**once, "replace_all": True}
    assert question(once).splitlines()[-1] == "Allow edit_file Edit deploy.sh? [y/N/a] "
    assert question(every).splitlines()[-1] == "Allow edit_file Edit every occurrence in deploy.sh? [y/N/a] "
    assert question({**once, "replace_all": False}) == question(once)
    # The qualifier comes first, so that shortening a long path cannot cut it off.
    long = {**every, "path": "d/" * 60 + "deploy.sh"}
    assert "Edit every occurrence in d/d/" in question(long).splitlines()[-1]
    assert tool(workspace, "edit_file").present_call(every).diffs == (
        FileDiff(path="deploy.sh", old_text="--dry-run", new_text=""),
    )


async def test_glob_and_grep_present_search_cards(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)
    arguments = {"pattern": "*.txt"}
    assert tool(tree, "glob").present_result(arguments, await run(tree, "glob", arguments)) == SearchResultView(
        shape="paths", title="Glob *.txt", paths=["b.txt"], truncated=False, total=1
    )
    arguments = {"pattern": "three"}
    assert tool(tree, "grep").present_result(arguments, await run(tree, "grep", arguments)) == SearchResultView(
        shape="matches",
        title="Grep three",
        files=[SearchFileMatches(path="b.txt", matches=[SearchMatch(line_number=2, line="needle three")])],
        truncated=False,
        total=1,
    )


@pytest.mark.parametrize(
    ("name", "arguments", "mode"),
    [
        ("read_file", {"path": "x"}, Parallel()),
        ("glob", {"pattern": "*"}, Parallel()),
        ("grep", {"pattern": "x"}, Parallel()),
        ("write_file", {"path": "x", "content": "y"}, Exclusive()),
        ("edit_file", {"path": "x", "old_string": "a", "new_string": "b"}, Exclusive()),
    ],
)
def test_reads_are_parallel_safe_and_writes_exclusive(
    tmp_path: Path, name: str, arguments: dict[str, Any], mode: Any
) -> None:
    assert runtime_for(tmp_path).execution_mode(make_input(name, arguments)) == mode


# --- the plugin entry point ------------------------------------------------------------------


def test_dsh_setup_registers_the_five_tools_for_the_root(tmp_path: Path) -> None:
    runtime = make_runtime()
    files.dsh_setup(runtime, {"root": str(tmp_path)})
    unconfigured = ToolRuntime()
    files.dsh_setup(unconfigured, {})
    assert unconfigured.names() == []  # opt-in: no root, no file tools
    assert sorted(runtime.names()) == ["edit_file", "glob", "grep", "read_file", "write_file"]


@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        ({"root": "/definitely/not/here"}, "is not a directory"),
        ({"roots": "."}, "unknown key"),
        ({"root": 1}, "string"),
    ],
)
def test_dsh_setup_rejects_bad_config(config: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        files.dsh_setup(make_runtime(), config)


def test_each_file_tool_declares_its_effects(tmp_path: Path) -> None:
    from dsh_core import ToolEffects
    from dsh_plugins.shell import bash_tool

    runtime = runtime_for(tmp_path)
    declared = {name: runtime.get(name).effects for name in runtime.names()}  # type: ignore[union-attr]
    assert declared == {
        "read_file": ToolEffects(read_only=True),
        "write_file": ToolEffects(destructive=True, idempotent=True),
        "edit_file": ToolEffects(destructive=True),
        "glob": ToolEffects(read_only=True),
        "grep": ToolEffects(read_only=True),
    }
    assert bash_tool(files.Workspace(str(tmp_path))).effects == ToolEffects(destructive=True, open_world=True)


# --- bounded limits --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "arguments", "maximum"),
    [
        ("read_file", {"path": "README.md"}, files.MAX_READ_LIMIT),
        ("glob", {"pattern": "*"}, files.MAX_GLOB_LIMIT),
        ("grep", {"pattern": "hello"}, files.MAX_GREP_LIMIT),
    ],
)
async def test_a_limit_past_the_maximum_is_refused_before_any_io(
    workspace: Path, monkeypatch: pytest.MonkeyPatch, name: str, arguments: dict[str, Any], maximum: int
) -> None:
    # One call with limit=10**9 once held every line of a big file as a dict (a gigabyte, and
    # seconds of event loop): the limit is refused before a thread is started.
    def no_io(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the call did I/O")

    monkeypatch.setattr(files.Workspace, "resolve", no_io)
    message = failed(await run(workspace, name, {**arguments, "limit": 10**9}), "FILE_ERROR")
    assert message == f"limit must be at most {maximum}, got 1000000000"
    assert f"at most {maximum}" in tool(workspace, name).parameters["properties"]["limit"]["description"]


async def test_the_maximum_limit_itself_is_taken(workspace: Path) -> None:
    value = ok(await run(workspace, "read_file", {"path": "README.md", "limit": files.MAX_READ_LIMIT}))
    assert value["total_lines"] == 2 and len(value["lines"]) == 2
    assert ok(await run(workspace, "glob", {"pattern": "*.md", "limit": files.MAX_GLOB_LIMIT}))["paths"] == ("README.md",)
    assert ok(await run(workspace, "grep", {"pattern": "hello", "limit": files.MAX_GREP_LIMIT}))["total"] == 1
