"""Where git runs files from, beyond directories named ``.git``: what the files tools must not write.

A path component named ``.git`` is the common case (``files._names_git``). A
directory laid out as a git directory (``HEAD``, ``objects/``, ``refs/``) is one
whatever its name, however the path reached it (a ``.git`` symlink to it). Two
more places hold files git runs, found from each repository the path is in (every
ancestor directory holding a ``.git`` entry, the nearest first):

- the directory a *gitfile* names: ``.git`` as a file reading ``gitdir: PATH``
  (``git init --separate-git-dir``, worktrees, submodules) puts the hooks and
  the config at PATH, under any name;
- the directory ``core.hooksPath`` names in that repository's config (husky's
  ``.husky``, say), relative to the work tree when relative.

A file can also be one of those under another name: a hard link made outside
them (``git_file_linked``). Only the files git runs or reads for what to run
are compared: the git directory's own (the config), its hooks and the
``core.hooksPath`` directory's, by device and inode.

The config is read minimally: the ``[core]`` section's ``hooksPath`` key, with
git's case-insensitive section and key names, quotes and comments; ``[include]``
and ``[includeIf]`` files, the global and system configs and ``GIT_DIR`` are
not followed. Reads are bounded and never block (FIFOs are refused as not
regular files); an unreadable or malformed file names no place.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterator
from typing import Final

from ._case_folding import folded, folds_case
from ._regular_file import open_regular

__all__ = ["git_file_linked", "git_run_place"]

# A gitfile holds one short line; a config past this size is read no further.
_GITFILE_BYTES: Final = 4096
_CONFIG_BYTES: Final = 1 << 20
# Entries looked at per directory when looking for a hard link's other name (a hooks directory
# holds a few dozen; past this, the rest is not compared).
_LINKED_ENTRIES: Final = 4096
_SECTION: Final = re.compile(r'^\s*\[\s*([A-Za-z0-9.-]+)(\s+"[^"]*")?\s*\]')
_ENTRY: Final = re.compile(r"^\s*([A-Za-z][A-Za-z0-9-]*)\s*(?:=\s*(.*))?$")


def git_run_place(real: str) -> str | None:
    """The directory git runs files from that holds ``real`` (a resolved path), or ``None``.

    Looks at every repository holding ``real``, the nearest first: a gitfile's
    git directory, and the directory its ``core.hooksPath`` names. Not only the
    nearest: hooks shared as a nested checkout (``tools/``, a submodule) are
    the outer repository's ``core.hooksPath`` while ``tools/`` has its own ``.git``.
    """
    found = _git_directory_holding(real)
    if found is not None:
        return found
    for work_tree, dot_git in _repositories_of(real):
        place = _place_in(real, work_tree, dot_git)
        if place is not None:
            return place
    return None


def _git_directory_holding(real: str) -> str | None:
    """The git directory that holds ``real``, recognised by its layout (``HEAD``, ``objects/``, ``refs/``), or ``None``.

    Whatever it is named and however it is reached: a ``.git`` symlink's target
    (``proj/.git -> ../store/proj.gitdir``), a bare repository, a worktree's
    git directory under ``.git/worktrees`` reached by another name.
    """
    directory = os.path.dirname(real)
    while True:
        if (
            os.path.isfile(os.path.join(directory, "HEAD"))
            and os.path.isdir(os.path.join(directory, "objects"))
            and os.path.isdir(os.path.join(directory, "refs"))
        ):
            return directory
        parent = os.path.dirname(directory)
        if parent == directory:
            return None
        directory = parent


def git_file_linked(real: str) -> str | None:
    """The file git runs (or reads for what to run) that ``real`` is another name of, or ``None``.

    ``real`` is a resolved path; only a regular file with more than one link is
    looked into, against the git directory of each repository holding it (its
    config, its hooks) and its ``core.hooksPath`` directory. A write in place
    through such a link (the file tools keep hard links) would change the hook itself.
    """
    try:
        info = os.lstat(real)
    except OSError:
        return None
    if not stat.S_ISREG(info.st_mode) or info.st_nlink < 2:
        return None
    for work_tree, dot_git in _repositories_of(real):
        git_directory = dot_git if os.path.isdir(dot_git) else _gitfile_target(work_tree, dot_git)
        if git_directory is None:
            continue
        places = [git_directory, os.path.join(git_directory, "hooks")]
        hooks = _hooks_path(os.path.join(git_directory, "config"))
        if hooks is not None:
            places.append(os.path.realpath(os.path.join(work_tree, os.path.expanduser(hooks))))
        for place in places:
            found = _same_file_in(place, info)
            if found is not None:
                return found
    return None


def _repositories_of(real: str) -> Iterator[tuple[str, str]]:
    """Each work tree holding ``real``, the nearest first, with its ``.git`` entry (a directory or a gitfile)."""
    directory = os.path.dirname(real)
    while True:
        dot_git = os.path.join(directory, ".git")
        if os.path.lexists(dot_git):
            yield directory, dot_git
        parent = os.path.dirname(directory)
        if parent == directory:
            return
        directory = parent


def _same_file_in(directory: str, info: os.stat_result) -> str | None:
    """The entry of ``directory`` (not below it) that is the file ``info`` describes, or ``None``."""
    try:
        with os.scandir(directory) as entries:
            for count, entry in enumerate(entries):
                if count >= _LINKED_ENTRIES:
                    return None
                if entry.inode() != info.st_ino:
                    continue
                try:
                    other = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if other.st_dev == info.st_dev:
                    return entry.path
    except OSError:
        return None
    return None


def _place_in(real: str, work_tree: str, dot_git: str) -> str | None:
    git_directory = dot_git if os.path.isdir(dot_git) else _gitfile_target(work_tree, dot_git)
    if git_directory is None:
        return None
    if git_directory != dot_git and _inside(real, git_directory):
        return git_directory
    hooks = _hooks_path(os.path.join(git_directory, "config"))
    if hooks is None:
        return None
    hooks = os.path.realpath(os.path.join(work_tree, os.path.expanduser(hooks)))
    return hooks if _inside(real, hooks) else None


def _gitfile_target(work_tree: str, gitfile: str) -> str | None:
    text = _read(gitfile, _GITFILE_BYTES)
    if text is None:
        return None
    first = text.splitlines()[0].strip() if text.strip() else ""
    if not first.startswith("gitdir:"):
        return None
    target = first.removeprefix("gitdir:").strip()
    return os.path.realpath(os.path.join(work_tree, target)) if target else None


def _hooks_path(config: str) -> str | None:
    text = _read(config, _CONFIG_BYTES)
    if text is None:
        return None
    found = None
    in_core = False
    for line in text.splitlines():
        section = _SECTION.match(line)
        if section is not None:
            in_core = section.group(1).lower() == "core" and section.group(2) is None
            line = line[section.end() :]
        if not in_core:
            continue
        entry = _ENTRY.match(line)
        if entry is not None and entry.group(1).lower() == "hookspath" and entry.group(2) is not None:
            found = _value(entry.group(2)) or None  # the last one wins, as in git
    return found


def _value(raw: str) -> str:
    """A config value: quotes removed, a comment (``#``/``;`` outside quotes) cut off, escapes kept simple."""
    out: list[str] = []
    quoted = False
    index = 0
    while index < len(raw):
        character = raw[index]
        if character == '"':
            quoted = not quoted
        elif character in "#;" and not quoted:
            break
        elif character == "\\" and index + 1 < len(raw):
            index += 1
            out.append({"n": "\n", "t": "\t"}.get(raw[index], raw[index]))
        else:
            out.append(character)
        index += 1
    return "".join(out).strip()


def _read(path: str, limit: int) -> str | None:
    try:
        with open_regular(path, follow_symlinks=True) as stream:
            return stream.read(limit).decode("utf-8", "replace")
    except OSError:
        return None


def _inside(real: str, directory: str) -> bool:
    if folds_case(directory):
        # There ``.HUSKY/pre-commit`` is the hook ``.husky/pre-commit`` (realpath keeps the spelling).
        real, directory = folded(real), folded(directory)
    return os.path.commonpath([real, directory]) == directory
