"""The file tools replace a file whole (dsh_plugins._regular_file.write_regular): never half written, nothing lost."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dsh_core import ToolExecutionFailure, ToolExecutionResult, ToolExecutionSuccess
from dsh_core.testing import make_input, make_runtime
from dsh_plugins import _regular_file
from dsh_plugins.files import file_tools
from dsh_plugins.undo import PLUGIN_NAME, UndoLog

ORIGINAL = "keep me\n" * 1000
NEW = "NEW " * 5000


@pytest.fixture
def root(tmp_path: Path) -> Path:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "notes.txt").write_text(ORIGINAL)
    return workspace


@pytest.fixture
def umask() -> Iterator[None]:
    previous = os.umask(0o022)
    yield
    os.umask(previous)


async def run(root: Path, name: str, arguments: dict[str, Any]) -> ToolExecutionResult:
    return await make_runtime(*file_tools(root)).execute(make_input(name, arguments))


def failed(result: ToolExecutionResult) -> str:
    assert isinstance(result, ToolExecutionFailure), result
    assert result.code == "FILE_ERROR", result.error
    return result.error.message


def ok(result: ToolExecutionResult) -> Any:
    assert isinstance(result, ToolExecutionSuccess), result
    return result.value


def temp_files(directory: Path) -> list[str]:
    return sorted(name for name in os.listdir(directory) if ".dsh-" in name)


CHANGES = {
    "write_file": {"path": "notes.txt", "content": NEW},
    "edit_file": {"path": "notes.txt", "old_string": ORIGINAL, "new_string": NEW},
}


def fail_after_part(monkeypatch: pytest.MonkeyPatch, marker: bytes) -> list[int]:
    """``os.write`` of bytes starting with ``marker`` writes part of them, then fails as a full disk does."""
    real_write = os.write
    calls: list[int] = []

    def write(fd: int, data: Any) -> int:
        if bytes(data[: len(marker)]) != marker:
            return real_write(fd, data)
        calls.append(fd)
        if len(calls) == 1:
            return real_write(fd, data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", write)
    return calls


@pytest.mark.parametrize("name", sorted(CHANGES))
async def test_a_write_failing_part_way_leaves_the_original_and_no_temporary_file(
    root: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    calls = fail_after_part(monkeypatch, b"NEW ")
    message = failed(await run(root, name, CHANGES[name]))
    assert message == "cannot access 'notes.txt': No space left on device"
    assert len(calls) == 2  # the failure came after part of the bytes was written
    assert (root / "notes.txt").read_text() == ORIGINAL
    assert temp_files(root) == []


@pytest.mark.parametrize("name", sorted(CHANGES))
async def test_a_write_replaces_the_file_and_keeps_its_permission_bits(root: Path, name: str) -> None:
    target = root / "notes.txt"
    target.chmod(0o640)
    before = target.stat().st_ino
    ok(await run(root, name, CHANGES[name]))
    assert target.read_text() == NEW
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert target.stat().st_ino != before  # a new file renamed over the old one, not the old one rewritten
    assert temp_files(root) == []


async def test_set_id_and_sticky_bits_are_kept(root: Path) -> None:
    target = root / "notes.txt"
    target.chmod(0o7751)
    ok(await run(root, "edit_file", CHANGES["edit_file"]))
    assert stat.S_IMODE(target.stat().st_mode) == 0o7751


async def test_a_write_only_file_is_still_replaced(root: Path) -> None:
    target = root / "notes.txt"
    target.chmod(0o200)
    value = ok(await run(root, "write_file", CHANGES["write_file"]))
    assert value["created"] is False
    assert value["old_text"] == (ORIGINAL if os.geteuid() == 0 else None)  # root reads it all the same
    target.chmod(0o600)
    assert target.read_text() == NEW


@pytest.mark.parametrize("name", sorted(CHANGES))
async def test_a_hard_linked_file_is_written_in_place_and_keeps_its_link(root: Path, name: str) -> None:
    target, link = root / "notes.txt", root / "link.txt"
    os.link(target, link)
    before = target.stat().st_ino
    ok(await run(root, name, CHANGES[name]))
    assert link.read_text() == target.read_text() == NEW
    assert target.stat().st_ino == link.stat().st_ino == before and target.stat().st_nlink == 2
    assert temp_files(root) == []


async def test_a_symlinked_file_is_replaced_where_it_points_and_the_link_stays(root: Path) -> None:
    (root / "link.txt").symlink_to("notes.txt")
    ok(await run(root, "write_file", {"path": "link.txt", "content": NEW}))
    assert os.readlink(root / "link.txt") == "notes.txt"
    assert (root / "notes.txt").read_text() == NEW


@pytest.mark.parametrize(("mask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
async def test_a_new_file_mode_follows_the_umask(root: Path, umask: None, mask: int, mode: int) -> None:
    os.umask(mask)
    value = ok(await run(root, "write_file", {"path": "sub/new.txt", "content": "hi"}))
    assert value["created"] is True
    assert stat.S_IMODE((root / "sub" / "new.txt").stat().st_mode) == mode


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in a read-only directory")
async def test_a_file_in_a_read_only_directory_is_written_in_place_with_no_litter(root: Path) -> None:
    (root / "ro").mkdir()
    (root / "ro" / "f.txt").write_text(ORIGINAL)
    (root / "ro").chmod(0o555)
    try:
        ok(await run(root, "edit_file", {**CHANGES["edit_file"], "path": "ro/f.txt"}))
        assert (root / "ro" / "f.txt").read_text() == NEW
        assert temp_files(root / "ro") == []
    finally:
        (root / "ro").chmod(0o755)


def refuse_temporary_files(monkeypatch: pytest.MonkeyPatch) -> None:
    # What a read-only directory does for a user who is not root.
    real_open = os.open

    def open_(path: Any, flags: int, mode: int = 0o777, **kwargs: Any) -> int:
        if b".dsh-" in os.fsencode(path):
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real_open(path, flags, mode, **kwargs)

    monkeypatch.setattr(os, "open", open_)


async def test_a_writable_file_in_a_directory_refusing_the_temporary_file_is_written_in_place(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = root / "notes.txt"
    before = target.stat()
    refuse_temporary_files(monkeypatch)
    ok(await run(root, "edit_file", CHANGES["edit_file"]))
    assert target.read_text() == NEW
    assert target.stat().st_ino == before.st_ino  # the same file, rewritten
    assert temp_files(root) == []


async def test_a_new_file_in_a_directory_refusing_files_is_refused(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    refuse_temporary_files(monkeypatch)
    message = failed(await run(root, "write_file", {"path": "fresh.txt", "content": "x"}))
    assert message == "permission denied for 'fresh.txt'"
    assert not (root / "fresh.txt").exists()
    assert temp_files(root) == []


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give a file to another user")
async def test_another_users_file_keeps_its_owner(root: Path) -> None:
    target = root / "notes.txt"
    os.chown(target, 4321, 4322)
    ok(await run(root, "edit_file", CHANGES["edit_file"]))
    assert (target.stat().st_uid, target.stat().st_gid) == (4321, 4322)
    assert target.read_text() == NEW


@pytest.mark.parametrize("name", sorted(CHANGES))
async def test_a_file_whose_owner_cannot_be_kept_is_written_in_place(
    root: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    # A process that is not root may write another user's file, but cannot give a new file to that user.
    def refuse(fd: int, uid: int, gid: int) -> None:
        raise PermissionError(errno.EPERM, "Operation not permitted")

    target = root / "notes.txt"
    if os.geteuid() == 0:
        os.chown(target, 4321, 4322)
    monkeypatch.setattr(os, "fchown", refuse)
    before = target.stat()
    ok(await run(root, name, CHANGES[name]))
    after = target.stat()
    assert target.read_text() == NEW
    assert (after.st_ino, after.st_uid, after.st_gid) == (before.st_ino, before.st_uid, before.st_gid)
    assert temp_files(root) == []


# --- undo's reverts ----------------------------------------------------------------------------


def with_undo(root: Path) -> tuple[Any, UndoLog]:
    runtime = make_runtime(*file_tools(root))
    log = UndoLog(runtime)
    runtime.plugins.register(log, name=PLUGIN_NAME)
    return runtime, log


@pytest.mark.parametrize("name", sorted(CHANGES))
async def test_a_revert_failing_part_way_leaves_the_file_as_the_call_left_it(
    root: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    runtime, log = with_undo(root)
    ok(await runtime.execute(make_input(name, CHANGES[name])))
    calls = fail_after_part(monkeypatch, b"keep me")
    (outcome,) = await log.undo()
    assert not outcome.reverted and outcome.error == "cannot access 'notes.txt': No space left on device"
    assert len(calls) == 2
    assert (root / "notes.txt").read_text() == NEW
    assert temp_files(root) == []
    monkeypatch.undo()
    assert (await log.undo())[0].reverted  # the entry stayed: a later undo takes it back
    assert (root / "notes.txt").read_text() == ORIGINAL


@pytest.mark.parametrize("name", sorted(CHANGES))
async def test_a_revert_replaces_the_file_and_keeps_its_permission_bits(root: Path, name: str) -> None:
    runtime, log = with_undo(root)
    target = root / "notes.txt"
    ok(await runtime.execute(make_input(name, CHANGES[name])))
    target.chmod(0o604)
    before = target.stat().st_ino
    assert (await log.undo())[0].reverted
    assert target.read_text() == ORIGINAL
    assert stat.S_IMODE(target.stat().st_mode) == 0o604 and target.stat().st_ino != before


# --- the writer itself ---------------------------------------------------------------------------


def test_the_temporary_file_name_is_hidden_recognisable_and_fits_a_long_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[bytes] = []
    real_replace = os.replace

    def replace(source: Any, target: Any, **dir_fds: Any) -> None:
        seen.append(os.path.basename(os.fsencode(source)))
        real_replace(source, target, **dir_fds)

    monkeypatch.setattr(os, "replace", replace)
    long_name = "é" * 127  # 254 bytes: at the limit of a name
    target = tmp_path / long_name
    target.write_text("old")
    _regular_file.write_regular(str(target), b"new")
    _regular_file.write_regular(str(tmp_path / "a.txt"), b"new")
    assert target.read_bytes() == b"new"
    assert len(seen[0]) < 255 and seen[0].startswith(b"." + "é".encode() * 64) and seen[0].endswith(b".tmp")
    assert (
        seen[1].startswith(b".a.txt.dsh-") and seen[1].endswith(b".tmp") and len(seen[1]) == len(".a.txt.dsh-.tmp") + 16
    )
    assert sorted(os.listdir(tmp_path)) == sorted([long_name, "a.txt"])


def test_a_temporary_file_is_created_only_for_its_owner_until_it_is_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    modes: list[int] = []
    real_open = os.open

    def open_(path: Any, flags: int, mode: int = 0o777, **kwargs: Any) -> int:
        if b".dsh-" in os.fsencode(path):
            assert flags & os.O_EXCL and flags & os.O_CREAT and flags & os.O_NOFOLLOW
            modes.append(mode)
        return real_open(path, flags, mode, **kwargs)

    monkeypatch.setattr(os, "open", open_)
    target = tmp_path / "f"
    target.write_text("old")
    target.chmod(0o666)
    _regular_file.write_regular(str(target), b"new")
    assert modes == [0o600]
    assert stat.S_IMODE(target.stat().st_mode) == 0o666


@pytest.mark.parametrize("name", ["é" * 200, "a" + "日" * 100, "x" * 127 + "😀" * 10, "plain" * 40])
def test_a_temporary_files_name_never_cuts_a_character(name: str) -> None:
    from dsh_plugins._regular_file import _TEMP_NAME_KEPT_BYTES, _name_start

    start = _name_start(name.encode())
    assert len(start) <= _TEMP_NAME_KEPT_BYTES
    assert name.startswith(start.decode("utf-8"))  # whole characters only
    assert len(start) > _TEMP_NAME_KEPT_BYTES - 4  # and no more cut than one character
