"""Writes into the places git runs files from that are not named .git: a gitfile's git directory, core.hooksPath."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from dsh_core import ToolExecutionFailure, ToolExecutionSuccess
from dsh_core.testing import make_input, make_runtime
from dsh_plugins import files


async def write(root: Path, path: str) -> Any:
    runtime = make_runtime(plugins=[(files, {"root": str(root)})])
    return await runtime.execute(make_input("write_file", {"path": path, "content": "echo planted\n"}))


def refused(result: Any) -> str:
    assert isinstance(result, ToolExecutionFailure), result
    assert result.code == "FILE_ERROR"
    return result.error.message


def separate_git_dir(root: Path) -> None:
    (root / "meta" / "hooks").mkdir(parents=True)
    (root / "meta" / "config").write_text("[core]\n\tbare = false\n")
    (root / ".git").write_text("gitdir: meta\n")


@pytest.mark.parametrize("path", ["meta/config", "meta/hooks/pre-commit", "sub/../meta/hooks/x"])
async def test_the_git_directory_a_gitfile_names_is_refused(tmp_path: Path, path: str) -> None:
    separate_git_dir(tmp_path)
    (tmp_path / "sub").mkdir()
    message = refused(await write(tmp_path, path))
    assert f"inside {str(tmp_path / 'meta')!r}, where the repository's git runs files from" in message
    assert not (tmp_path / "meta" / "hooks" / "pre-commit").exists()


async def test_files_beside_a_gitfiles_directory_are_written(tmp_path: Path) -> None:
    separate_git_dir(tmp_path)
    assert isinstance(await write(tmp_path, "metadata.txt"), ToolExecutionSuccess)
    assert isinstance(await write(tmp_path, "src/meta/config"), ToolExecutionSuccess)


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
async def test_a_real_separate_git_dir_is_refused(tmp_path: Path) -> None:
    work, store = tmp_path / "work", tmp_path / "work" / "store"
    subprocess.run(["git", "init", "-q", "--separate-git-dir", str(store), str(work)], check=True)
    refused(await write(work, "store/hooks/pre-commit"))
    refused(await write(work, "store/config"))
    assert isinstance(await write(work, "README.md"), ToolExecutionSuccess)


@pytest.mark.parametrize(
    "config",
    [
        "[core]\n\thooksPath = .husky\n",
        '[CORE]\n  HooksPath = ".husky" ; set by husky\n',
        "[user]\n\tname = x\n[core]\n\tbare = false\n\thookspath=.husky # comment\n",
    ],
)
async def test_the_directory_core_hooks_path_names_is_refused(tmp_path: Path, config: str) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "config").write_text(config)
    (tmp_path / ".husky").mkdir()
    message = refused(await write(tmp_path, ".husky/pre-commit"))
    assert str(tmp_path / ".husky") in message
    assert not (tmp_path / ".husky" / "pre-commit").exists()
    assert isinstance(await write(tmp_path, ".husky/../src/x.py"), ToolExecutionSuccess)


@pytest.mark.parametrize(
    "config",
    ["", "[core]\n\tbare = false\n", '[core "x"]\n\thooksPath = .husky\n', "[user]\n\thooksPath = .husky\n"],
)
async def test_without_core_hooks_path_a_husky_directory_is_ordinary(tmp_path: Path, config: str) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "config").write_text(config)
    assert isinstance(await write(tmp_path, ".husky/pre-commit"), ToolExecutionSuccess)


async def test_the_nearest_repository_decides(tmp_path: Path) -> None:
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "config").write_text("[core]\n\thooksPath = hooks\n")
    nested = tmp_path / "vendor" / "lib"
    (nested / ".git").mkdir(parents=True)
    refused(await write(tmp_path, "hooks/pre-commit"))
    # vendor/lib is its own repository, without a hooksPath: its hooks/ is an ordinary directory.
    assert isinstance(await write(tmp_path, "vendor/lib/hooks/pre-commit"), ToolExecutionSuccess)


async def test_an_outer_repositorys_hooks_path_inside_a_nested_checkout_is_refused(tmp_path: Path) -> None:
    """Hooks shared as a submodule: only the nearest repository (tools/, no hooksPath) was looked at."""
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "config").write_text("[core]\n\thooksPath = tools/hooks\n")
    (tmp_path / "tools" / "hooks").mkdir(parents=True)
    (tmp_path / "tools" / ".git").write_text("gitdir: ../.git/modules/tools\n")
    (tmp_path / "tools" / "hooks" / "pre-commit").write_text("#!/bin/sh\nexit 0\n")
    message = refused(await write(tmp_path, "tools/hooks/pre-commit"))
    assert f"inside {str(tmp_path / 'tools' / 'hooks')!r}, where the repository's git runs files from" in message
    assert (tmp_path / "tools" / "hooks" / "pre-commit").read_text() == "#!/bin/sh\nexit 0\n"
    (tmp_path / "tools" / "notes.txt").hardlink_to(tmp_path / "tools" / "hooks" / "pre-commit")
    assert "is a hard link of" in refused(await write(tmp_path, "tools/notes.txt"))
    assert isinstance(await write(tmp_path, "tools/README.md"), ToolExecutionSuccess)


def git_directory_layout(directory: Path) -> None:
    (directory / "hooks").mkdir(parents=True)
    (directory / "objects").mkdir()
    (directory / "refs").mkdir()
    (directory / "HEAD").write_text("ref: refs/heads/main\n")
    (directory / "config").write_text("[core]\n\tbare = false\n")


@pytest.mark.parametrize("path", ["proj/.git/hooks/pre-commit", "proj/.git/config", "store/proj.gitdir/hooks/x"])
async def test_a_git_directory_reached_through_a_dot_git_symlink_is_refused(tmp_path: Path, path: str) -> None:
    """proj/.git -> ../store/proj.gitdir: the resolved path named no .git, and no repository was found above it."""
    git_directory_layout(tmp_path / "store" / "proj.gitdir")
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / ".git").symlink_to("../store/proj.gitdir")
    refused(await write(tmp_path, path))
    assert not (tmp_path / "store" / "proj.gitdir" / "hooks" / "pre-commit").exists()
    assert (tmp_path / "store" / "proj.gitdir" / "config").read_text() == "[core]\n\tbare = false\n"
    assert isinstance(await write(tmp_path, "proj/src/main.py"), ToolExecutionSuccess)


async def test_a_directory_laid_out_as_a_git_directory_is_refused_whatever_its_name(tmp_path: Path) -> None:
    git_directory_layout(tmp_path / "mirror.git")
    message = refused(await write(tmp_path, "mirror.git/hooks/post-update"))
    assert f"inside {str(tmp_path / 'mirror.git')!r}, where the repository's git runs files from" in message
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "HEAD").write_text("not git\n")  # a HEAD alone is not a git directory
    assert isinstance(await write(tmp_path, "notes/todo.txt"), ToolExecutionSuccess)


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
async def test_a_real_separate_git_dir_beside_its_work_tree_is_refused(tmp_path: Path) -> None:
    """Found only when it lay inside the work tree: gitdirs/proj beside proj/ was writable."""
    work, store = tmp_path / "proj", tmp_path / "gitdirs" / "proj"
    store.parent.mkdir()
    subprocess.run(["git", "init", "-q", "--separate-git-dir", str(store), str(work)], check=True)
    refused(await write(tmp_path, "gitdirs/proj/hooks/pre-commit"))
    refused(await write(tmp_path, "gitdirs/proj/config"))
    assert isinstance(await write(tmp_path, "proj/README.md"), ToolExecutionSuccess)


async def test_allow_git_writes_lets_both_places_be_written(tmp_path: Path) -> None:
    separate_git_dir(tmp_path)
    runtime = make_runtime(plugins=[(files, {"root": str(tmp_path), "allow_git_writes": True})])
    result = await runtime.execute(make_input("write_file", {"path": "meta/hooks/pre-commit", "content": "x"}))
    assert isinstance(result, ToolExecutionSuccess)


@pytest.mark.parametrize(("spelling", "place"), [(".HUSKY/pre-commit", ".husky"), ("Meta/hooks/pre-commit", "meta")])
async def test_on_a_case_folding_file_system_another_case_names_the_same_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spelling: str, place: str
) -> None:
    """On macOS ``.HUSKY/pre-commit`` is the hook ``.husky/pre-commit``: a case-sensitive compare let it be planted."""
    from dsh_plugins import _git_places

    monkeypatch.setattr(_git_places, "folds_case", lambda directory: True, raising=False)
    if place == ".husky":
        (tmp_path / ".git").mkdir()
        (tmp_path / ".git" / "config").write_text("[core]\n\thooksPath = .husky\n")
        (tmp_path / ".husky").mkdir()
    else:
        separate_git_dir(tmp_path)
    message = refused(await write(tmp_path, spelling))
    assert str(tmp_path / place) in message
    assert isinstance(await write(tmp_path, "src/x.py"), ToolExecutionSuccess)


@pytest.mark.parametrize(
    "target",
    [".git/hooks/pre-commit", ".git/config", ".husky/pre-commit", "meta/hooks/post-checkout"],
)
@pytest.mark.parametrize("tool", ["write_file", "edit_file"])
async def test_a_hard_link_of_a_file_git_runs_is_refused(tmp_path: Path, target: str, tool: str) -> None:
    """Written in place (hard links are kept), the link changed the hook itself."""
    if target.startswith("meta/"):
        separate_git_dir(tmp_path)
    else:
        (tmp_path / ".git" / "hooks").mkdir(parents=True)
        (tmp_path / ".git" / "config").write_text("[core]\n\thooksPath = .husky\n")
        (tmp_path / ".husky").mkdir()
    (tmp_path / target).write_text("#!/bin/sh\nexit 0\n")
    (tmp_path / "notes.txt").hardlink_to(tmp_path / target)
    runtime = make_runtime(plugins=[(files, {"root": str(tmp_path)})])
    arguments = (
        {"path": "notes.txt", "content": "echo planted\n"}
        if tool == "write_file"
        else {"path": "notes.txt", "old_string": "exit 0", "new_string": "echo planted"}
    )
    message = refused(await runtime.execute(make_input(tool, arguments)))
    assert f"is a hard link of '{tmp_path / target}', a file of the repository's git" in message
    assert (tmp_path / target).read_text() == "#!/bin/sh\nexit 0\n"


async def test_a_hard_link_of_an_ordinary_file_is_written_in_place(tmp_path: Path) -> None:
    (tmp_path / ".git" / "hooks").mkdir(parents=True)
    (tmp_path / "a.txt").write_text("old\n")
    (tmp_path / "b.txt").hardlink_to(tmp_path / "a.txt")
    assert isinstance(await write(tmp_path, "b.txt"), ToolExecutionSuccess)
    assert (tmp_path / "a.txt").read_text() == "echo planted\n"  # the other name sees it, as before
