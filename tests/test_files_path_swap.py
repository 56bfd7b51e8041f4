"""A directory on the way to a checked path swapped for a symlink before the file is used: refused, not followed.

The file tools resolve a path with ``realpath`` and check it lies in the workspace; a shell the
model started in the background can then replace a directory on the way with a symlink to
somewhere else before the file is opened. An ``O_NOFOLLOW`` open guards only the last name, so
the resolved path is walked one directory at a time (``dsh_plugins._regular_file``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
from deep_trees import remove_deep_tree

from dsh_core import ToolExecutionFailure, ToolExecutionSuccess
from dsh_core.testing import make_input, make_runtime
from dsh_plugins import _regular_file, files
from dsh_plugins.files import file_tools

pytestmark = pytest.mark.skipif(not _regular_file._CAN_WALK, reason="directories cannot be walked by descriptor here")


@pytest.fixture
def places(tmp_path: Path) -> tuple[Path, Path]:
    workspace, outside = tmp_path / "ws", tmp_path / "outside"
    (workspace / "sub").mkdir(parents=True)
    (workspace / "sub" / "notes.txt").write_text("inside\n")
    outside.mkdir()
    (outside / "notes.txt").write_text("secret outside\n")
    return workspace, outside


def swap_for_symlink(directory: Path, target: Path) -> None:
    directory.rename(directory.with_name(directory.name + ".old"))
    directory.symlink_to(target, target_is_directory=True)


def test_a_write_after_the_swap_is_refused_and_lands_nowhere(places: tuple[Path, Path]) -> None:
    workspace, outside = places
    real = os.path.realpath(workspace / "sub" / "notes.txt")
    swap_for_symlink(workspace / "sub", outside)
    with pytest.raises(_regular_file.PathChangedError, match="changed since it was checked"):
        _regular_file.write_regular(real, b"planted\n")
    assert (outside / "notes.txt").read_text() == "secret outside\n"
    assert sorted(os.listdir(outside)) == ["notes.txt"]  # no temporary file either
    with pytest.raises(_regular_file.PathChangedError):
        _regular_file.write_regular(os.path.realpath(workspace) + "/sub/new.txt", b"planted\n")  # a new file too
    assert sorted(os.listdir(outside)) == ["notes.txt"]


def test_a_read_of_a_resolved_path_after_the_swap_is_refused(places: tuple[Path, Path]) -> None:
    workspace, outside = places
    real = os.path.realpath(workspace / "sub" / "notes.txt")
    swap_for_symlink(workspace / "sub", outside)
    with pytest.raises(_regular_file.PathChangedError):
        _regular_file.open_regular(real, resolved=True)
    with _regular_file.open_regular(real) as stream:  # a path not declared resolved keeps the old rule
        assert stream.read() == b"secret outside\n"


def test_a_resolved_path_with_no_swap_is_read_and_written_as_before(places: tuple[Path, Path]) -> None:
    workspace, _ = places
    real = os.path.realpath(workspace / "sub" / "notes.txt")
    _regular_file.write_regular(real, b"rewritten\n")
    with _regular_file.open_regular(real, resolved=True) as stream:
        assert stream.read() == b"rewritten\n"
    with pytest.raises(FileNotFoundError):
        _regular_file.write_regular(os.path.realpath(workspace) + "/missing/new.txt", b"x")
    (workspace / "plain").write_text("a file")
    with pytest.raises(NotADirectoryError):
        _regular_file.write_regular(os.path.realpath(workspace) + "/plain/new.txt", b"x")


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("write_file", {"path": "sub/notes.txt", "content": "planted\n"}),
        ("edit_file", {"path": "sub/notes.txt", "old_string": "secret outside", "new_string": "planted"}),
        ("read_file", {"path": "sub/notes.txt"}),
    ],
)
async def test_the_file_tools_refuse_a_path_swapped_after_their_check(
    places: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, tool: str, arguments: dict[str, Any]
) -> None:
    workspace, outside = places
    checked = files.Workspace.resolve

    def resolve_then_swap(self: files.Workspace, path: str) -> str:
        real = checked(self, path)
        if (workspace / "sub").is_dir() and not (workspace / "sub").is_symlink():
            swap_for_symlink(workspace / "sub", outside)  # the race, won by the attacker every time
        return real

    monkeypatch.setattr(files.Workspace, "resolve", resolve_then_swap)
    result = await make_runtime(*file_tools(workspace)).execute(make_input(tool, arguments))
    assert isinstance(result, ToolExecutionFailure), result
    assert result.code == "FILE_ERROR"
    assert "a directory on the way to it was replaced by a symlink" in result.error.message
    assert "secret outside" not in result.error.message
    assert (outside / "notes.txt").read_text() == "secret outside\n"


async def test_a_symlink_inside_the_workspace_still_works(places: tuple[Path, Path]) -> None:
    workspace, _ = places
    (workspace / "link").symlink_to(workspace / "sub", target_is_directory=True)
    runtime = make_runtime(*file_tools(workspace))
    written = await runtime.execute(make_input("write_file", {"path": "link/notes.txt", "content": "via link\n"}))
    assert isinstance(written, ToolExecutionSuccess), written
    assert (workspace / "sub" / "notes.txt").read_text() == "via link\n"


@pytest.mark.skipif(sys.platform != "linux" or os.geteuid() == 0, reason="needs O_PATH and a user permissions bind")
def test_a_directory_that_may_be_searched_but_not_listed_is_walked(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    (locked / "inner").mkdir(parents=True)
    target = os.path.realpath(locked / "inner") + "/f.txt"
    locked.chmod(0o111)
    try:
        _regular_file.write_regular(target, b"through a search-only directory")
        with _regular_file.open_regular(target, resolved=True) as stream:
            assert stream.read() == b"through a search-only directory"
    finally:
        locked.chmod(0o755)


def test_removing_a_resolved_path_after_the_swap_is_refused(places: tuple[Path, Path]) -> None:
    # What undo does to a file write_file created: the file beyond the swapped directory stays.
    workspace, outside = places
    real = os.path.realpath(workspace / "sub" / "notes.txt")
    swap_for_symlink(workspace / "sub", outside)
    with pytest.raises(_regular_file.PathChangedError):
        _regular_file.remove_resolved(real)
    assert (outside / "notes.txt").read_text() == "secret outside\n"
    os.unlink(workspace / "sub")
    (workspace / "sub.old").rename(workspace / "sub")
    _regular_file.remove_resolved(real)
    assert not (workspace / "sub" / "notes.txt").exists()


async def test_undoing_a_created_file_after_the_swap_leaves_the_file_beyond_it(
    places: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from dsh_plugins.undo import UndoLog

    workspace, outside = places
    (outside / "made.txt").write_text("not the model's\n")
    runtime = make_runtime(*file_tools(workspace))
    log = UndoLog(runtime)
    runtime.plugins.register(log)
    made = await runtime.execute(make_input("write_file", {"path": "sub/made.txt", "content": "not the model's\n"}))
    assert isinstance(made, ToolExecutionSuccess), made
    swap_for_symlink(workspace / "sub", outside)
    (outcome,) = await log.undo()
    assert not outcome.reverted
    assert (outside / "made.txt").read_text() == "not the model's\n"


def test_directories_for_a_new_file_are_not_made_through_a_swapped_directory(places: tuple[Path, Path]) -> None:
    """os.makedirs followed the symlink: the new directories appeared wherever it pointed."""
    workspace, outside = places
    real = os.path.realpath(workspace) + "/sub/a/b"
    swap_for_symlink(workspace / "sub", outside)
    with pytest.raises(_regular_file.PathChangedError):
        _regular_file.make_directories(real)
    assert sorted(os.listdir(outside)) == ["notes.txt"]


@pytest.mark.parametrize("walking", [True, False], ids=["by-descriptor", "by-path"])
def test_make_directories_makes_what_is_missing_and_refuses_a_file_in_the_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, walking: bool
) -> None:
    monkeypatch.setattr(_regular_file, "_CAN_MAKE", walking)
    base = os.path.realpath(tmp_path)
    deep = base + "/d" * 2000  # by path too: a loop, not os.makedirs' recursion
    try:
        _regular_file.make_directories(deep)
        assert os.path.isdir(deep)
    finally:
        if (tmp_path / "d").exists():
            remove_deep_tree(tmp_path / "d")  # pytest's own clean-up recurses per level
    _regular_file.make_directories(base + "/x/y/z")
    _regular_file.make_directories(base + "/x/y/z")  # already there: nothing to do
    assert (tmp_path / "x" / "y" / "z").is_dir()
    (tmp_path / "file").write_text("")
    with pytest.raises(FileExistsError):
        _regular_file.make_directories(base + "/file/below")


def test_write_file_makes_a_path_thousands_of_directories_deep_without_recursion(tmp_path: Path) -> None:
    """os.makedirs recursed once per directory: a 2 000-deep path failed TOOL_ERROR with a RecursionError."""
    import trio

    workspace = tmp_path / "ws"
    workspace.mkdir()
    runtime = make_runtime(plugins=[(files, {"root": str(workspace)})])
    deep = "d/" * 2000 + "f.txt"
    try:
        result = trio.run(runtime.execute, make_input("write_file", {"path": deep, "content": "deep\n"}))
        assert isinstance(result, ToolExecutionSuccess), result
        assert (workspace / deep).read_text() == "deep\n"
    finally:
        if (workspace / "d").exists():
            remove_deep_tree(workspace / "d")  # pytest's own clean-up recurses per level
