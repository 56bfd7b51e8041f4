"""First-party file tools, confined to one workspace root: read, write, edit, glob, grep.

Enable them through the ``files`` entry point; configure the root in
``[plugins.files]``::

    [plugins.files]
    root = "."                  # required: without it no tool is registered (opt-in)
    allow_git_writes = false    # true lets write_file and edit_file write inside .git (see below)

**Confinement.** Every path a tool receives is taken relative to the root (an
absolute path is taken as is), resolved with ``os.path.realpath`` (so ``..``
and symlinks are followed) and refused, with a ``OUTSIDE_WORKSPACE`` tool
error naming the path, unless the result is the root or below it
(``os.path.commonpath``). A symlink inside the workspace that points inside it
is fine; one that points out is refused like any other escape. The check is
made when the call runs, not atomically with the I/O: a process that swaps a
directory for a symlink between the check and the open can still race it, so
this is a guard against model mistakes and honest paths, not a sandbox.

**Files the host keeps.** ``write_file`` and ``edit_file`` (and their
reverts) refuse, with a ``KEPT_FILE`` tool error saying what it is, a file the
runtime's host keeps (:meth:`dsh_core.ToolRuntime.kept_file`): the grants file
of a ``GrantingApproval``, the audit log, the effect ledger, and whatever the
host adds to ``runtime.kept_files`` (``dsh-tools`` adds its configuration file
and session log). A forged line in the grants file would otherwise be a
standing grant of every tool. Names are compared after ``realpath`` and by
inode, so another spelling, a symlink or a hard link does not dodge it.

**Git directories.** ``write_file`` and ``edit_file`` (and their reverts)
refuse, with a ``FILE_ERROR`` naming the path and why, a path whose resolved
real path has a component naming ``.git``: the repository's directory (of the
workspace or any nested repository) or a ``.git`` gitfile. Git runs files from
there the next time the user runs it: a hook (``.git/hooks/pre-commit``) or a
program ``.git/config`` names (``core.hooksPath``, ``core.fsmonitor``), outside
any approval the write itself went through. Names are compared as git guards
its own trees: casefolded (``.GIT`` on a case-insensitive file system), without
the code points HFS+ ignores, trailing dots and spaces, and ``GIT~1``. A
symlink into ``.git`` is resolved first, so it does not dodge the check; a
workspace root inside a ``.git`` directory refuses every write. Two more
places of the nearest repository holding the path are refused too: the git
directory a gitfile names under another name (``gitdir: meta``, from ``git init
--separate-git-dir``), and the directory its config's ``core.hooksPath`` names
(husky's ``.husky``); see ``dsh_plugins._git_places`` for what is read. So is
a hard link, under any name, of a file git runs in that repository (its config,
its hooks, the ``core.hooksPath`` directory's files): a multiply-linked file is
written in place, which would change the hook itself. ``.gitignore``,
``.github/`` or ``my.git`` are ordinary names. Reading is allowed. A host that
means the model to change git's files uses the ``bash`` tool, which permissions
and approval gate, or sets ``allow_git_writes = true`` (``file_tools(...,
allow_git_writes=True)`` when registering by hand).

**Writing.** ``write_file``, ``edit_file`` and their reverts never leave a
file half written: the new bytes go to a temporary file beside it
(``.NAME.dsh-<random>.tmp``), which takes the file's permission bits, owner and
group, is flushed to disk and renamed over it. A crash, a kill or a full disk
part-way leaves the original as it was. A new file's mode follows the umask.
Three files are rewritten in place instead, as before: one with more than one
hard link (a rename would split the link), one whose owner or group the process
cannot give the new file (another user's file: a rename would hand it to the
process's user), and a writable file in a directory the process cannot create
a file in (there is nowhere to put the temporary file). A path is resolved first,
so writing through a symlink replaces the file it points to and keeps the
link. See ``dsh_plugins._regular_file``.

**Tools** (all paths in results are workspace-relative, ``/``-separated):

- ``read_file(path, offset=1, limit=2000)``: a window of numbered lines and
  the file's total line count; lines over 2000 characters are cut. Parallel-safe.
- ``write_file(path, content)``: create or overwrite a file, creating parents.
- ``edit_file(path, old_string, new_string, replace_all=False)``: exact string
  replacement; refuses a missing or (without ``replace_all``) repeated
  ``old_string``, saying how many times it occurs.
- ``glob(pattern, path=".", limit=200)``: matching *files*, most recently
  modified first (ties by path), ``.git`` skipped. Parallel-safe.
- ``grep(pattern, path=".", glob=None, ignore_case=False, limit=100)``: matching
  lines grouped by file in path order, with ``total`` and ``truncated``. Uses
  ``rg --json`` when ``shutil.which("rg")`` finds ripgrep (which honours
  ``.gitignore``); otherwise a built-in search (Python ``re``, no ``.gitignore``
  support). Both skip hidden and binary files and never follow symlinks.
  Parallel-safe.

``glob`` and ``grep`` count files whose paths are not UTF-8 (``names_not_utf8``)
instead of listing them: such a path is no text a model could send back.

Each ``limit`` is at most ten times its default (``MAX_READ_LIMIT``,
``MAX_GLOB_LIMIT``, ``MAX_GREP_LIMIT``); a larger one is refused with a
``FILE_ERROR`` before any I/O, so one call cannot hold a whole big file's lines.

All file I/O runs in the runtime's worker threads (``run.run_in_thread``),
which check for cancellation between files and between chunks of a long line:
the event loop is never blocked, a cancelled or timed-out call resolves at
once, and a thread still inside one indivisible step (a slow regular
expression of the built-in grep) is reported as orphaned work until it ends.
Glob patterns are matched by an automaton in time linear in the path (never
a backtracking regex), and a line of any length is read in bounded memory.

**Presentation.** Each tool's presentation meta is its value, so its result
presenter works from the durable ``{content, isError, meta}`` record alone
(live or replayed): ``ReadResultView``, ``DiffCallView``/``DiffResultView`` and
``SearchResultView`` (``shape="paths"`` for glob, ``"matches"`` for grep).
"""

from __future__ import annotations

import base64
import hashlib
import importlib
import json
import os
import re
import shutil
import stat
import subprocess
import weakref
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from typing import Any, BinaryIO, Final

import attrs
import regex
import trio

from dsh_core import (
    ConfigError,
    DshError,
    TextBlock,
    ToolDefinition,
    ToolEffects,
    ToolOutput,
    ToolRunContext,
    ToolRuntime,
    define_tool,
    hookimpl,
    safe_repr,
    structure_table,
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

from ._file_settings import PathSetting, kept_path
from ._git_places import git_file_linked, git_run_place
from ._quoted import quoted_path
from ._regular_file import (
    PATH_MAX,
    NotRegularFileError,
    PathChangedError,
    make_directories,
    open_regular,
    remove_resolved,
    write_regular,
)
from ._settings_warnings import report_inert_keys

__all__ = [
    "DEFAULT_GLOB_LIMIT",
    "DEFAULT_GREP_LIMIT",
    "DEFAULT_READ_LIMIT",
    "GREP_LINE_BYTES",
    "MAX_GLOB_LIMIT",
    "MAX_GREP_LIMIT",
    "MAX_LINE_CHARS",
    "MAX_READ_LIMIT",
    "FileToolError",
    "FilesSettings",
    "GlobMatcher",
    "KeptFileError",
    "Workspace",
    "WorkspaceError",
    "compile_glob",
    "file_tools",
    "language_of",
    "workspace_of",
]

# Capability manifest (enforced under strict_capabilities): the five file tools; it decides no calls.
DSH_CAPABILITIES: dict[str, list[str]] = {"tools": ["read_file", "write_file", "edit_file", "glob", "grep"], "affects": []}

DEFAULT_READ_LIMIT: Final = 2000
DEFAULT_GLOB_LIMIT: Final = 200
DEFAULT_GREP_LIMIT: Final = 100
# The largest `limit` each tool takes: ten times its default. Past it one call would hold a
# whole big file's lines (or matches) as values, and freeze the event loop presenting them.
MAX_READ_LIMIT: Final = 10 * DEFAULT_READ_LIMIT
MAX_GLOB_LIMIT: Final = 10 * DEFAULT_GLOB_LIMIT
MAX_GREP_LIMIT: Final = 10 * DEFAULT_GREP_LIMIT
MAX_LINE_CHARS: Final = 2000
"""Lines of ``read_file`` longer than this are cut (minified files would flood the context)."""
# Bounds on a model-written glob: its length, and how many patterns its {a,b} braces expand to.
MAX_GLOB_CHARS: Final = 1000
MAX_GLOB_ALTERNATIVES: Final = 256
# A grep pattern longer than this is refused, for both backends: ripgrep takes it as one
# argument, and the kernel refuses an argument past 128 KiB (10 000 characters of UTF-8 fit).
MAX_GREP_PATTERN_CHARS: Final = 10_000
MAX_MATCH_CHARS: Final = 500
"""Matching lines of ``grep`` longer than this are cut."""
MAX_BEFORE_IMAGE_BYTES: Final = 256 * 1024
"""``write_file`` keeps the replaced text for the diff card only up to this size."""
MAX_KEPT_POSITIONS: Final = 1000
"""``edit_file`` keeps where each replacement went (for its revert) only up to this many replacements."""
MAX_EDIT_BYTES: Final = 64 * 1024 * 1024
"""The largest file ``edit_file`` (and a revert of one) edits: it holds the file several times over in memory."""
_BINARY_SNIFF_BYTES: Final = 8192
_SKIPPED_DIRS: Final = frozenset({".git"})


class WorkspaceError(DshError):
    """A path resolves outside the workspace root."""

    code = "OUTSIDE_WORKSPACE"


class KeptFileError(DshError):
    """A writing file tool was asked to write a file the host keeps (grants, a log, the ledger, its configuration)."""

    code = "KEPT_FILE"


class FileToolError(DshError):
    """A file tool cannot do what was asked: missing file, not text, ambiguous edit, bad pattern."""

    code = "FILE_ERROR"



# --- the workspace ------------------------------------------------------------------------


def _realpath(value: str | os.PathLike[str]) -> str:
    return os.path.realpath(os.fspath(value))


@attrs.frozen
class Workspace:
    """The directory the tools are confined to; ``root`` is stored resolved (``realpath``).

    ``kept`` says what a resolved path is when the host keeps it (usually
    :meth:`ToolRuntime.kept_file <dsh_core.ToolRuntime.kept_file>`), else
    ``None``; :meth:`resolve_writable` refuses such paths, and (unless
    ``allow_git_writes``) paths inside a git directory.
    """

    root: str = attrs.field(converter=_realpath)
    kept: Callable[[str], str | None] | None = attrs.field(default=None, kw_only=True)
    allow_git_writes: bool = attrs.field(default=False, kw_only=True)

    def resolve(self, path: str) -> str:
        """The real path of ``path`` (relative to the root, or absolute), refusing escapes.

        Blocks on the file system (``realpath`` reads symlinks): call it from a
        worker thread. Raises :class:`WorkspaceError` naming ``path`` when the
        result is not the root or inside it.
        """
        if "\x00" in path:
            raise WorkspaceError(f"path {quoted_path(path)} contains a NUL character")
        if not path.isascii():
            try:
                path.encode("utf-8")
            except UnicodeEncodeError:
                # JSON allows "\ud800"; no file system path can hold it.
                raise FileToolError(f"path {quoted_path(path)} is not valid Unicode text (it holds a lone surrogate)") from None
        try:
            real = os.path.realpath(os.path.join(self.root, path))
        except OSError as exc:  # a link it cannot read on the way (/proc/1/cwd)
            raise _os_error(exc, path) from None
        if os.path.commonpath([self.root, real]) != self.root:
            # Not where it leads: /proc/self/fd/N would name every file the host has open
            # (its audit log, its grants file), /proc/self/cwd its directory, to the model.
            raise WorkspaceError(
                f"path {quoted_path(path)} resolves outside the workspace root {self.root!r}; "
                "only files inside the workspace can be used"
            )
        return real

    def resolve_writable(self, path: str) -> str:
        """:meth:`resolve`, also refusing a file the host keeps and a path inside a git directory.

        Every tool that writes goes through here: one allowed write of the
        grants file would otherwise grant the model every tool, and one of
        ``.git/hooks/pre-commit`` would run the model's code the next time the
        user commits. Raises :class:`KeptFileError` saying what the file is, or
        :class:`FileToolError` for a git directory (unless ``allow_git_writes``).
        """
        real = self.resolve(path)
        what = self.kept(real) if self.kept is not None else None
        if what is not None:
            raise KeptFileError(
                f"path {quoted_path(path)} is {what} ({real}), which the host keeps for itself; "
                "the file tools do not write it"
            )
        if self.allow_git_writes:
            return real
        # The path as given names .git too: a .git that is a symlink to the git directory
        # resolves to a path without one (proj/.git -> ../store/proj.git).
        given = os.path.normpath(os.path.join(self.root, path))
        if any(_names_git(part) for part in real.split(os.sep)) or any(_names_git(part) for part in given.split(os.sep)):
            where = f"inside a git directory ({quoted_path(real)})"
        else:
            place = git_run_place(real)
            linked = git_file_linked(real) if place is None else None
            if place is not None:
                where = f"inside {quoted_path(place)}, where the repository's git runs files from ({quoted_path(real)})"
            elif linked is not None:
                where = f"a hard link of {quoted_path(linked)}, a file of the repository's git"
            else:
                return real
        raise FileToolError(
            f"path {quoted_path(path)} is {where}: git runs files there (hooks, and programs .git/config names) the "
            "next time the user runs git, outside any approval; the file tools do not write it. Use the "
            "shell tool, which permissions and approval gate, or set [plugins.files] allow_git_writes = true"
        )

    def contains(self, real: str) -> bool:
        """Whether the already resolved ``real`` is the root or inside it."""
        return os.path.commonpath([self.root, real]) == self.root

    def display(self, real: str) -> str:
        """``real`` relative to the root, ``/``-separated (``"."`` for the root itself)."""
        relative = os.path.relpath(real, self.root)
        return "." if relative == os.curdir else relative.replace(os.sep, "/")


# Code points HFS+ ignores in a name, so that ".g\u200cit" opens ".git" there (git's is_hfs_dotgit).
_HFS_IGNORED: Final = dict.fromkeys(
    [*range(0x200C, 0x2010), *range(0x202A, 0x202F), *range(0x206A, 0x2070), 0xFEFF]
)


def _names_git(name: str) -> bool:
    """Whether a path component names a ``.git`` directory (or gitfile) on some file system git runs on.

    Compared as git itself guards its trees: casefolded (case-insensitive file
    systems), without the code points HFS+ ignores, without the trailing dots and
    spaces NTFS drops, and NTFS's 8.3 short name ``GIT~1``.
    """
    folded = name.translate(_HFS_IGNORED).rstrip(". ").casefold()
    return folded in {".git", "git~1"}


# --- shared helpers -----------------------------------------------------------------------


def _check_cancelled() -> None:
    # Raises trio.Cancelled inside the worker thread when the calling task was cancelled.
    trio.from_thread.check_cancelled()


def _is_binary(head: bytes) -> bool:
    return b"\x00" in head


def _cut_around(text: str, limit: int, length: int | None, at: int | None) -> str:
    """``_cut``, but a match past the first ``limit`` characters is shown, with some of the line before it.

    A minified file's match on character 9 000 showed the line's first 500 characters:
    the model was told a match was there and never saw it.
    """
    if at is None or at < limit * 3 // 4 or len(text) <= limit:
        return _cut(text, limit, length)
    begin = at - limit // 4
    total = len(text) if length is None else length
    return f"…{text[begin : begin + limit]}… [line cut: {total} characters; shown from character {begin + 1}]"


def _cut(text: str, limit: int, length: int | None = None) -> str:
    """``text`` cut to ``limit`` characters, saying how long the line was (``length``: when longer than ``text``)."""
    length = len(text) if length is None else length
    if length <= limit:
        return text
    return f"{text[:limit]}… [line cut: {length} characters]"


# How much of one line read_file reads: enough for MAX_LINE_CHARS characters of any UTF-8.
_LINE_HEAD_BYTES: Final = 4 * MAX_LINE_CHARS + 4
_CHUNK_BYTES: Final = 1 << 20
# bytes.translate deletes these, leaving a chunk's UTF-8 continuation bytes to count.
_NOT_CONTINUATION: Final = bytes(byte for byte in range(256) if not 0x80 <= byte <= 0xBF)


def _skip_line(stream: Any) -> int:
    """Read past the rest of the current line in bounded chunks; returns its length in characters."""
    characters = 0
    while chunk := stream.readline(_CHUNK_BYTES):
        _check_cancelled()
        body = chunk.rstrip(b"\n").rstrip(b"\r") if chunk.endswith(b"\n") else chunk
        characters += len(body) - len(body.translate(None, _NOT_CONTINUATION))
        if chunk.endswith(b"\n"):
            break
    return characters


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _count_lines(text: str) -> int:
    return text.count("\n") + (1 if text and not text.endswith("\n") else 0)


def _positive(value: float, name: str, maximum: int | None = None) -> int:
    if value < 1:
        raise FileToolError(f"{name} must be at least 1, got {value}")
    if maximum is not None and value > maximum:
        raise FileToolError(f"{name} must be at most {maximum}, got {value}")
    return int(value)  # the schema's integer admits 2.0


def _os_error(exc: OSError, path: str) -> FileToolError:
    if isinstance(exc, PathChangedError):
        return FileToolError(
            f"{quoted_path(path)} changed while it was being used: a directory on the way to it was replaced by a "
            "symlink after the path was checked, so it was not followed"
        )
    if isinstance(exc, NotRegularFileError):
        return FileToolError(f"{quoted_path(path)} is a directory" if exc.is_directory else f"{quoted_path(path)} is not a regular file")
    if isinstance(exc, FileNotFoundError):
        return FileToolError(f"{quoted_path(path)} does not exist (use glob to find files)")
    if isinstance(exc, IsADirectoryError):
        return FileToolError(f"{quoted_path(path)} is a directory")
    if isinstance(exc, NotADirectoryError):
        return FileToolError(f"a parent of {quoted_path(path)} is not a directory")
    if isinstance(exc, PermissionError):
        return FileToolError(f"permission denied for {quoted_path(path)}")
    return FileToolError(f"cannot access {quoted_path(path)}: {exc.strerror or exc}")


def _check_regular(real: str, path: str) -> bool:
    """Whether ``real`` exists; raises unless it is a regular file (opening a FIFO would block forever)."""
    try:
        mode = os.stat(real).st_mode
    except FileNotFoundError:
        return False
    if stat.S_ISDIR(mode):
        raise FileToolError(f"{quoted_path(path)} is a directory")
    if not stat.S_ISREG(mode):
        raise FileToolError(f"{quoted_path(path)} is not a regular file")
    return True


async def _in_thread(run: ToolRunContext, fn: Callable[[], Any]) -> Any:
    # The runtime's worker thread: a cancelled or timed-out call resolves at once, and a
    # thread still busy (one huge line, one slow regex) is reported as orphaned work while
    # it runs to its next cancellation check, instead of holding the call open.
    return await run.run_in_thread(fn)


def _settled_meta(result: object) -> Mapping[str, Any] | None:
    """The presentation meta of a successful result: a live result or a durable ``{content, isError, meta}`` record."""
    if isinstance(result, Mapping):
        if result.get("isError", False):
            return None
        meta = result.get("meta")
    else:
        if getattr(result, "is_error", True):
            return None
        meta = getattr(result, "meta", None)
    return meta if isinstance(meta, Mapping) else None


def _value_as_meta(args: Any, value: Any) -> Any:
    return value


_LANGS: Final[Mapping[str, str]] = {
    ".py": "python", ".pyi": "python", ".js": "javascript", ".mjs": "javascript", ".cjs": "javascript",
    ".jsx": "jsx", ".ts": "typescript", ".tsx": "tsx", ".json": "json", ".jsonl": "json", ".md": "markdown",
    ".toml": "toml", ".yaml": "yaml", ".yml": "yaml", ".rs": "rust", ".go": "go", ".c": "c", ".h": "c",
    ".cc": "cpp", ".cpp": "cpp", ".hpp": "cpp", ".java": "java", ".kt": "kotlin", ".rb": "ruby", ".php": "php",
    ".sh": "shell", ".bash": "shell", ".zsh": "shell", ".html": "html", ".css": "css", ".scss": "scss",
    ".sql": "sql", ".swift": "swift", ".lua": "lua", ".xml": "xml", ".ini": "ini", ".cfg": "ini", ".txt": "text",
}  # fmt: skip
_LANG_NAMES: Final[Mapping[str, str]] = {"Makefile": "makefile", "Dockerfile": "dockerfile"}


def language_of(path: str) -> str | None:
    """A syntax-highlighting hint for ``path`` from its extension (or well-known name), else ``None``."""
    name = path.rsplit("/", 1)[-1]
    if name in _LANG_NAMES:
        return _LANG_NAMES[name]
    _, ext = os.path.splitext(name)
    return _LANGS.get(ext.lower())


# --- glob patterns ------------------------------------------------------------------------


def _closing_bracket(pattern: str, start: int) -> int:
    """Index of the ``]`` closing the class opened at ``start``, or -1."""
    i = start + 1
    if i < len(pattern) and pattern[i] in "!^":
        i += 1
    if i < len(pattern) and pattern[i] == "]":
        i += 1
    end = pattern.find("]", i)
    return end


def _brace_alternatives(pattern: str, start: int) -> tuple[list[str], int] | None:
    """The top-level comma-separated alternatives of the ``{...}`` opened at ``start`` and its end index."""
    depth = 0
    pieces: list[str] = []
    piece_start = start + 1
    for i in range(start, len(pattern)):
        char = pattern[i]
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                pieces.append(pattern[piece_start:i])
                return pieces, i
        elif char == "," and depth == 1:
            pieces.append(pattern[piece_start:i])
            piece_start = i + 1
    return None


# Between two pieces a brace expansion put side by side where their "*"s would otherwise read as
# one "**" (``*{,x}*`` is two single-segment stars either way). Never in a pattern: it is refused.
_BOUNDARY: Final = "\x00"


def _joined(*pieces: str) -> str:
    out = pieces[0]
    for piece in pieces[1:]:
        if out.endswith("*") and piece.startswith("*"):
            out += _BOUNDARY
        out += piece
    return out


def _expand_braces(pattern: str) -> list[str]:
    """``a{b,c{d,e}}`` as ``["ab", "acd", "ace"]``: an explicit work list, bounded in size."""
    done: list[str] = []
    work = [pattern]
    while work:
        current = work.pop()
        i = 0
        while i < len(current):
            if current[i] == "[" and (end := _closing_bracket(current, i)) != -1:
                i = end + 1  # a brace inside a class is a character
                continue
            if current[i] == "{" and (braces := _brace_alternatives(current, i)) is not None:
                alternatives, end = braces
                work.extend(_joined(current[:i], alt, current[end + 1 :]) for alt in reversed(alternatives))
                if len(work) + len(done) > MAX_GLOB_ALTERNATIVES:
                    raise FileToolError(
                        f"glob pattern has more than {MAX_GLOB_ALTERNATIVES} {{...}} alternatives; split it up"
                    )
                break
            i += 1
        else:
            done.append(current)
    return done


# A bound on the states of a glob's automata in all (its alternatives' positions): matching costs
# up to that much work per character of a path.
MAX_GLOB_STATES: Final = 5000
# How many automaton states a match steps through between two checks for cancellation.
_GLOB_WORK_PER_CHECK: Final = 1 << 14

# One step of a glob automaton: (what the character must be, the state it leads to). The
# predicate is "any", "segment" (anything but "/"), a literal character, or a compiled class.
_Step = tuple[Any, int]


class _GlobAutomaton:
    """One brace-free glob alternative as a small NFA, run in time linear in the path.

    Python's ``re`` backtracks: ``*a*a*a*a*b`` against a long name of ``a``s takes
    hours, and the model writes both the pattern and (through write_file) the
    names. Simulating every state at once takes ``len(path) * len(pattern)``.
    """

    __slots__ = ("accept", "epsilon", "steps")

    def __init__(self, pattern: str) -> None:
        self.steps: list[list[_Step]] = []
        self.epsilon: list[list[int]] = []
        i = 0
        while i < len(pattern):
            state = self._state()
            if pattern.startswith("**/", i):
                # (?:[^/]*/)*: any run of whole directories, none included.
                inside = self._state()
                self.epsilon[state].append(inside + 1)
                self.steps[state] += [("/", state), ("segment", inside)]
                self.steps[inside] += [("/", state), ("segment", inside)]
                i += 3
                continue
            if pattern.startswith("**", i):
                self.epsilon[state].append(state + 1)
                self.steps[state].append(("any", state))
                i += 2
                continue
            char = pattern[i]
            if char == _BOUNDARY:
                self.epsilon[state].append(state + 1)  # matches nothing: it only keeps two stars apart
            elif char == "*":
                self.epsilon[state].append(state + 1)
                self.steps[state].append(("segment", state))
            elif char == "?":
                self.steps[state].append(("segment", state + 1))
            elif char == "[" and (end := _closing_bracket(pattern, i)) != -1:
                self.steps[state].append((_character_class(pattern[i + 1 : end]), state + 1))
                i = end + 1
                continue
            else:
                self.steps[state].append((char, state + 1))
            i += 1
        self.accept = self._state()

    def _state(self) -> int:
        self.steps.append([])
        self.epsilon.append([])
        return len(self.steps) - 1

    def _closure(self, states: set[int]) -> set[int]:
        pending = list(states)
        while pending:
            for target in self.epsilon[pending.pop()]:
                if target not in states:
                    states.add(target)
                    pending.append(target)
        return states

    def match(self, path: str, check: Callable[[], None] | None = None) -> bool:
        """Whether ``path`` matches, calling ``check`` every so many steps (a long name can take a while)."""
        current = self._closure({0})
        work = 0
        for char in path:
            work += len(current)
            if check is not None and work >= _GLOB_WORK_PER_CHECK:
                check()
                work = 0
            following: set[int] = set()
            for state in current:
                for want, target in self.steps[state]:
                    if (
                        want == "any"
                        or (want == "segment" and char != "/")
                        or want == char
                        or (not isinstance(want, str) and want.fullmatch(char))
                    ):
                        following.add(target)
            if not following:
                return False
            current = self._closure(following)
        return self.accept in current


def _character_class(body: str) -> re.Pattern[str]:
    negate = body[:1] in ("!", "^")
    body = body[1:] if negate else body
    try:
        # One character against one class: nothing for re to backtrack over.
        # Every member escaped but a range's "-": a leading "]" is a member, not the class's end,
        # even after the "^/" a negation adds (where re would read it as the end).
        members = "".join(char if char == "-" else re.escape(char) for char in body)
        return re.compile(f"[{'^/' if negate else ''}{members}]")
    except re.error:
        raise FileToolError(f"glob character class [{'!' if negate else ''}{body}] is not valid") from None


@attrs.frozen
class GlobMatcher:
    """Matches ``/``-separated relative paths against one glob pattern (see :func:`compile_glob`)."""

    pattern: str
    _alternatives: tuple[_GlobAutomaton, ...] = attrs.field(repr=False)

    def match(self, path: str, check: Callable[[], None] | None = None) -> bool:
        """Whether ``path`` matches; ``check`` (e.g. a cancellation check) is called as a long match goes."""
        return any(alternative.match(path, check) for alternative in self._alternatives)


def compile_glob(pattern: str) -> GlobMatcher:
    """A matcher of ``/``-separated relative paths for a glob pattern, linear in the path's length.

    ``*`` and ``?`` stay within one path segment, ``**`` crosses segments
    (``**/`` also matches no directory at all), ``[abc]``/``[!abc]`` (or ``[^abc]``) are
    character classes and ``{a,b}`` alternatives (nesting allowed, at most
    ``MAX_GLOB_ALTERNATIVES`` in all). Raises :class:`FileToolError` for a
    pattern longer than ``MAX_GLOB_CHARS``, one whose alternatives add up to
    more than ``MAX_GLOB_STATES`` positions (states of their automata: matching
    costs up to that much per character of a path), or an invalid character class.
    """
    if len(pattern) > MAX_GLOB_CHARS:
        raise FileToolError(f"glob pattern is {len(pattern)} characters long; at most {MAX_GLOB_CHARS} are taken")
    if _BOUNDARY in pattern:
        raise FileToolError("glob pattern must not contain a NUL character (no path holds one)")
    automata: list[_GlobAutomaton] = []
    states = 0
    for alternative in _expand_braces(pattern):
        automata.append(_GlobAutomaton(alternative))
        states += len(automata[-1].steps)
        if states > MAX_GLOB_STATES:
            # Refused as soon as the sum passes the bound: building the rest would cost as much.
            raise FileToolError(
                f"glob pattern is too complex: its {{...}} alternatives expand to more than {MAX_GLOB_STATES} "
                "pattern positions in all; use fewer alternatives or shorter ones"
            )
    return GlobMatcher(pattern, tuple(automata))


def _check_pattern(pattern: str) -> None:
    if not pattern:
        raise FileToolError("pattern must not be empty")
    if pattern.startswith("/") or any(part == ".." for part in pattern.split("/")):
        raise WorkspaceError(
            f"glob pattern {pattern!r} must be relative and must not contain '..'; choose the directory with path"
        )


# --- read_file ----------------------------------------------------------------------------


def _read_window(workspace: Workspace, path: str, offset: int, limit: int) -> dict[str, Any]:
    real = workspace.resolve(path)
    lines: list[dict[str, Any]] = []
    not_utf8: list[int] = []  # shown lines whose bytes are not UTF-8
    total = 0
    last = offset + limit - 1
    try:
        with open_regular(real, resolved=True) as stream:
            if _is_binary(stream.read(_BINARY_SNIFF_BYTES)):
                raise FileToolError(
                    f"{quoted_path(path)} looks like a binary file (it contains NUL bytes); it cannot be read as text"
                )
            stream.seek(0)
            while raw := stream.readline(_LINE_HEAD_BYTES):
                total += 1
                if total % 4096 == 0:
                    _check_cancelled()
                rest = 0
                if len(raw) == _LINE_HEAD_BYTES and not raw.endswith(b"\n"):
                    # An overlong line: its rest is counted, never held (one line may be gigabytes).
                    rest = _skip_line(stream)
                if offset <= total <= last:
                    text, whole = _line_text(raw.rstrip(b"\n").rstrip(b"\r"), cut=rest > 0)
                    lines.append({"number": total, "text": _cut(text, MAX_LINE_CHARS, len(text) + rest)})
                    if not whole:
                        not_utf8.append(total)
    except OSError as exc:
        raise _os_error(exc, path) from None
    value = {"path": workspace.display(real), "offset": offset, "lines": lines, "total_lines": total}
    if not_utf8:
        value["not_utf8_lines"] = not_utf8
    return value


def _line_text(raw: bytes, *, cut: bool) -> tuple[str, bool]:
    """A line's text, and whether its bytes were UTF-8 (else each bad byte shows as U+FFFD).

    A line cut at its first bytes may end in the middle of a character: that is
    not the file's fault.
    """
    try:
        return raw.decode("utf-8"), True
    except UnicodeDecodeError as exc:
        partial_end = cut and exc.reason == "unexpected end of data" and exc.start >= len(raw) - 3
        return raw.decode("utf-8", errors="replace"), partial_end


def _render_read(args: Any, value: Any) -> list[TextBlock]:
    lines = value["lines"]
    if not lines:
        return [
            TextBlock(
                f"{value['path']}: no lines from line {value['offset']} (the file has {value['total_lines']} lines)"
            )
        ]
    first, last = lines[0]["number"], lines[-1]["number"]
    header = f"{value['path']} (lines {first}-{last} of {value['total_lines']})"
    body = "\n".join(f"{line['number']:>6}\t{line['text']}" for line in lines)
    more = ""
    if last < value["total_lines"]:
        more = f"\n[{value['total_lines'] - last} more lines; continue with offset={last + 1}]"
    bad = value.get("not_utf8_lines")
    if bad:
        # Else the model rewrites the file from what it read, and every such byte becomes U+FFFD on disk.
        shown = ", ".join(str(number) for number in bad[:20]) + (", ..." if len(bad) > 20 else "")
        more += (
            f"\n[not UTF-8: the bytes of line(s) {shown} that are not UTF-8 show as U+FFFD; writing this text "
            "back would replace them for good, and edit_file refuses the file]"
        )
    return [TextBlock(f"{header}\n{body}{more}")]


def _read_file_tool(workspace: Workspace) -> ToolDefinition:
    async def read_file(args: Any, run: ToolRunContext) -> dict[str, Any]:
        offset = _positive(args.get("offset", 1), "offset")
        limit = _positive(args.get("limit", DEFAULT_READ_LIMIT), "limit", MAX_READ_LIMIT)
        value: dict[str, Any] = await _in_thread(run, partial(_read_window, workspace, args["path"], offset, limit))
        return value

    def present_call(args: Any) -> GenericCallView:
        line = args.get("offset")
        return GenericCallView(
            title=f"Read {args['path']}", kind="read", locations=[FileLocation(path=args["path"], line=line)]
        )

    def present_result(args: Any, result: Any) -> ReadResultView | None:
        meta = _settled_meta(result)
        if meta is None:
            return None
        return ReadResultView(
            path=meta["path"],
            offset=meta["offset"],
            lines=[ReadFileLine(number=line["number"], text=line["text"]) for line in meta["lines"]],
            total_lines=meta["total_lines"],
            lang=language_of(meta["path"]),
        )

    return define_tool(
        name="read_file",
        description=(
            "Read a UTF-8 text file in the workspace. Returns numbered lines starting at 1-based line `offset` "
            f"(default 1), at most `limit` lines (default {DEFAULT_READ_LIMIT}, at most {MAX_READ_LIMIT}), and the file's "
            "total line count. "
            f"Lines longer than {MAX_LINE_CHARS} characters are cut. For a long file, read it in windows by "
            "calling again with a larger offset. Paths are relative to the workspace root; paths outside it are "
            "refused, and binary files cannot be read. Bytes that are not UTF-8 show as U+FFFD, and "
            "`not_utf8_lines` lists the lines holding them."
        ),
        parameters={
            "path": {"type": "string", "required": True, "description": "File path, relative to the workspace root."},
            "offset": {"type": "integer", "description": "First line to return, 1-based (default 1)."},
            "limit": {
                "type": "integer",
                "description": f"Maximum number of lines (default {DEFAULT_READ_LIMIT}, at most {MAX_READ_LIMIT}).",
            },
        },
        output=ToolOutput(
            schema={
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "path": {"type": "string", "required": True},
                    "offset": {"type": "integer", "required": True},
                    "lines": {
                        "type": "array",
                        "required": True,
                        "items": {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": {
                                "number": {"type": "integer", "required": True},
                                "text": {"type": "string", "required": True},
                            },
                        },
                    },
                    "total_lines": {"type": "integer", "required": True},
                    "not_utf8_lines": {"type": "array", "items": {"type": "integer"}},
                },
            },
            render=_render_read,
            presentation_meta=_value_as_meta,
        ),
        execute=read_file,
        is_concurrency_safe=lambda args: True,
        effects=ToolEffects(read_only=True),
        present_call=present_call,
        present_result=present_result,
    )


# --- write_file ---------------------------------------------------------------------------


def _before_image(real: str, path: str) -> tuple[bool, str | None]:
    """Whether ``real`` exists, and its text when it is small UTF-8 text (for the diff card)."""
    try:
        stream = open_regular(real, resolved=True)
    except FileNotFoundError:
        return False, None
    except PermissionError:
        return _check_regular(real, path), None  # a write-only file can still be overwritten
    with stream:
        if os.fstat(stream.fileno()).st_size > MAX_BEFORE_IMAGE_BYTES:
            return True, None
        try:
            return True, stream.read().decode("utf-8")
        except (OSError, UnicodeDecodeError):
            return True, None


def _write(workspace: Workspace, path: str, content: str) -> dict[str, Any]:
    if path.endswith(("/", os.sep)):
        # realpath would drop the slash and write a file where a directory was meant.
        raise FileToolError(f"{quoted_path(path)} names a directory (it ends with '/'); write_file writes files")
    if os.path.basename(path.rstrip("/" + os.sep)) in (os.curdir, os.pardir) or not path.strip():
        # "newdir/." is "newdir/" to realpath too: a file named newdir was written.
        raise FileToolError(f"{quoted_path(path)} names a directory (it ends with '.' or '..'); write_file writes files")
    try:
        data = content.encode("utf-8")
    except UnicodeEncodeError:
        raise FileToolError("content is not valid Unicode text (it contains a lone surrogate)") from None
    real = workspace.resolve_writable(path)
    if len(os.fsencode(real)) >= PATH_MAX:
        # Written by directory descriptor it would exist, but no path-based call (read_file,
        # ripgrep, the host's own tools) could reach it.
        raise FileToolError(
            f"{quoted_path(path)} resolves to a path of {len(os.fsencode(real))} bytes; paths are limited to {PATH_MAX - 1} here"
        )
    try:
        existed, old_text = _before_image(real, path)
        make_directories(os.path.dirname(real))
        write_regular(real, data)
    except OSError as exc:
        raise _os_error(exc, path) from None
    return {"path": workspace.display(real), "created": not existed, "bytes_written": len(data), "old_text": old_text}


def _read_current(real: str, path: str, tool: str) -> bytes:
    """The file's bytes now, for a revert; a file gone or no longer a regular file cannot be reverted."""
    try:
        if not _check_regular(real, path):
            raise FileToolError(f"{quoted_path(path)} no longer exists; the {tool} call was not reverted")
        with open_regular(real, resolved=True) as stream:
            return _read_editable(stream, path, f"the {tool} call was not reverted")
    except OSError as exc:
        raise _os_error(exc, path) from None


def _bytes_text(count: int) -> str:
    return f"{count // (1024 * 1024)} MiB" if count % (1024 * 1024) == 0 else f"{count} bytes"


def _read_editable(stream: BinaryIO, path: str, outcome: str) -> bytes:
    """The whole file, if it is no larger than MAX_EDIT_BYTES (a model-named multi-GB log would exhaust memory)."""
    size = os.fstat(stream.fileno()).st_size
    # One byte past the cap at most, not trusting the size: the file may grow meanwhile.
    raw = b"" if size > MAX_EDIT_BYTES else stream.read(MAX_EDIT_BYTES + 1)
    if size > MAX_EDIT_BYTES or len(raw) > MAX_EDIT_BYTES:
        raise FileToolError(
            f"{quoted_path(path)} is {max(size, len(raw))} bytes, more than the {_bytes_text(MAX_EDIT_BYTES)} "
            f"edit_file edits; {outcome}"
        )
    return raw


def _unwrite(workspace: Workspace, path: str, content: str, created: bool, old_text: str | None) -> None:
    """Undo one write_file: remove the file it created, or put back the text it replaced."""
    real = workspace.resolve_writable(path)
    if _read_current(real, path, "write_file") != content.encode("utf-8"):
        raise FileToolError(f"{quoted_path(path)} changed since write_file wrote it; not reverted, so that change is kept")
    if not created and old_text is None:
        raise FileToolError(
            f"the content write_file replaced in {quoted_path(path)} was not kept (not UTF-8 text, or over "
            f"{MAX_BEFORE_IMAGE_BYTES // 1024} KiB); not reverted"
        )
    try:
        if created:
            remove_resolved(real)
        else:
            assert old_text is not None
            write_regular(real, old_text.encode("utf-8"))
    except OSError as exc:
        raise _os_error(exc, path) from None


def _render_write(args: Any, value: Any) -> list[TextBlock]:
    verb = "Created" if value["created"] else "Overwrote"
    lines = _count_lines(args["content"])
    return [TextBlock(f"{verb} {value['path']} ({value['bytes_written']} bytes, {_plural(lines, 'line')})")]


def _write_file_tool(workspace: Workspace) -> ToolDefinition:
    async def write_file(args: Any, run: ToolRunContext) -> dict[str, Any]:
        value: dict[str, Any] = await _in_thread(run, partial(_write, workspace, args["path"], args["content"]))
        return value

    async def revert(args: Any, value: Any) -> None:
        await trio.to_thread.run_sync(
            partial(_unwrite, workspace, args["path"], args["content"], value["created"], value["old_text"])
        )

    def present_call(args: Any) -> DiffCallView:
        # Pending cards are pure: the before-image is not read here, so the diff is whole-file.
        return DiffCallView(
            title=f"Write {args['path']}",
            diffs=[FileDiff(path=args["path"], old_text=None, new_text=args["content"])],
            locations=[FileLocation(path=args["path"])],
        )

    def present_result(args: Any, result: Any) -> DiffResultView | None:
        meta = _settled_meta(result)
        if meta is None:
            return None
        verb = "Created" if meta["created"] else "Overwrote"
        return DiffResultView(
            title=f"{verb} {meta['path']}",
            diffs=[FileDiff(path=meta["path"], old_text=meta["old_text"], new_text=args["content"])],
        )

    return define_tool(
        name="write_file",
        description=(
            "Create or overwrite a text file in the workspace with exactly `content` (written as UTF-8, line "
            "endings kept as given). Missing parent directories are created. Overwriting replaces the whole "
            "file: to change part of an existing file, use edit_file instead. Paths outside the workspace are refused."
        ),
        parameters={
            "path": {"type": "string", "required": True, "description": "File path, relative to the workspace root."},
            "content": {"type": "string", "required": True, "description": "The complete new file content."},
        },
        output=ToolOutput(
            schema={
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "path": {"type": "string", "required": True},
                    "created": {"type": "boolean", "required": True, "description": "False when a file was replaced."},
                    "bytes_written": {"type": "integer", "required": True},
                    "old_text": {
                        "oneOf": [{"type": "string"}, {"type": "null"}],
                        "required": True,
                        "description": "The replaced text, when it was UTF-8 text of at most 256 KiB (for diffs).",
                    },
                },
            },
            render=_render_write,
            presentation_meta=_value_as_meta,
        ),
        execute=write_file,
        revert=revert,
        effects=ToolEffects(destructive=True, idempotent=True),
        present_call=present_call,
        present_result=present_result,
    )


# --- edit_file ----------------------------------------------------------------------------


def _occurrences(text: str, old: str) -> int:
    """How many places ``old`` starts at, overlapping ones included (``"aa"`` is at two places in ``"aaa"``)."""
    count, start = 0, text.find(old)
    while start != -1:
        count += 1
        if count % 4096 == 0:
            _check_cancelled()
        start = text.find(old, start + 1)
    return count


def _edit(workspace: Workspace, path: str, old: str, new: str, replace_all: bool) -> dict[str, Any]:
    if not old:
        raise FileToolError("old_string must not be empty; use write_file to create or replace a whole file")
    if old == new:
        raise FileToolError("old_string and new_string are identical; there is nothing to change")
    real = workspace.resolve_writable(path)
    try:
        with open_regular(real, resolved=True) as stream:
            raw = _read_editable(stream, path, "use write_file, or a shell tool, for a file that large")
    except OSError as exc:
        raise _os_error(exc, path) from None
    if _is_binary(raw[:_BINARY_SNIFF_BYTES]):
        # As read_file judges it: a file the model cannot read is not one it should edit.
        raise FileToolError(f"{quoted_path(path)} looks like a binary file (it contains NUL bytes); edit_file only edits text files")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise FileToolError(f"{quoted_path(path)} is not UTF-8 text; edit_file only edits text files") from None
    # Every occurrence replaced: str.replace's left-to-right, non-overlapping ones, counted the same way.
    places = text.count(old) if replace_all else _occurrences(text, old)
    if places == 0:
        hint = ""
        if "\r\n" in text and "\n" in old and "\r\n" not in old:
            hint = " (the file uses CRLF line endings; include the \\r characters)"
        raise FileToolError(
            f"old_string was not found in {quoted_path(path)}{hint}; it must match exactly, including whitespace. "
            "Read the file first to copy the exact text."
        )
    if places > 1 and not replace_all:
        separate = text.count(old)  # what replace_all would replace: left to right, none overlapping
        if separate == places:
            raise FileToolError(
                f"old_string occurs {places} times in {quoted_path(path)}; include more surrounding text to make it "
                "unique, or pass replace_all=true to replace every occurrence"
            )
        # "aa" in "aaaa": quoting 3 and then replacing 2 would tell the model two different things.
        raise FileToolError(
            f"old_string occurs at {places} overlapping places in {quoted_path(path)}; include more surrounding text "
            f"to make it unique (replace_all=true would replace {separate}, left to right, none overlapping)"
        )
    replacements = places if replace_all else 1
    updated = text.replace(old, new, replacements)
    # Where each replacement lands in the new text, so that a revert puts the old text back exactly
    # there and nowhere else. Past MAX_KEPT_POSITIONS the list (which goes to the session and audit
    # logs) is not kept: the revert then rebuilds the text by replacing new with old, and takes it
    # only if it hashes to what the file held before.
    positions: list[int] | None = None
    if replacements <= MAX_KEPT_POSITIONS:
        positions = []
        cursor = 0
        for _ in range(replacements):
            found = text.find(old, cursor)
            positions.append(found + len(positions) * (len(new) - len(old)))
            cursor = found + len(old)
    try:
        data = updated.encode("utf-8")
    except UnicodeEncodeError:
        raise FileToolError("new_string is not valid Unicode text (it contains a lone surrogate)") from None
    try:
        write_regular(real, data)
    except OSError as exc:
        raise _os_error(exc, path) from None
    return {
        "path": workspace.display(real),
        "replacements": replacements,
        "positions": positions,
        "sha256": hashlib.sha256(data).hexdigest(),
        "before_sha256": hashlib.sha256(raw).hexdigest(),
    }


def _unedit(workspace: Workspace, path: str, old: str, new: str, value: Mapping[str, Any]) -> None:
    """Undo one edit_file: put ``old`` back where the edit put ``new``, when the file is exactly as the edit left it."""
    real = workspace.resolve_writable(path)
    current = _read_current(real, path, "edit_file")
    if hashlib.sha256(current).hexdigest() != value["sha256"]:
        raise FileToolError(f"{quoted_path(path)} changed since edit_file edited it; not reverted, so that change is kept")
    text = current.decode("utf-8")
    positions: list[int] | None = value["positions"]
    count: int = value["replacements"]
    if positions is not None:
        pieces: list[str] = []
        cursor = 0
        for position in positions:
            assert text[position : position + len(new)] == new  # the file is byte for byte what the edit wrote
            pieces += [text[cursor:position], old]
            cursor = position + len(new)
        pieces.append(text[cursor:])
        restored = "".join(pieces)
    elif new and text.count(new) == count:
        restored = text.replace(new, old)
    else:
        restored = None  # new_string is empty, or also occurs where no replacement put it
    before = value.get("before_sha256")  # absent from a value recorded before it was kept
    data = None if restored is None else restored.encode("utf-8")
    if data is None or (before is not None and hashlib.sha256(data).hexdigest() != before):
        raise FileToolError(
            f"edit_file replaced {_plural(count, 'occurrence')} in {quoted_path(path)}, more than the {MAX_KEPT_POSITIONS} "
            "whose places it keeps, and the text before it cannot be rebuilt without them; not reverted"
        )
    try:
        write_regular(real, data)
    except OSError as exc:
        raise _os_error(exc, path) from None


def _render_edit(args: Any, value: Any) -> list[TextBlock]:
    count = value["replacements"]
    return [TextBlock(f"Edited {value['path']}: replaced {_plural(count, 'occurrence')}")]


def _edit_file_tool(workspace: Workspace) -> ToolDefinition:
    async def edit_file(args: Any, run: ToolRunContext) -> dict[str, Any]:
        value: dict[str, Any] = await _in_thread(
            run,
            partial(
                _edit, workspace, args["path"], args["old_string"], args["new_string"], args.get("replace_all", False)
            )
        )
        return value

    async def revert(args: Any, value: Any) -> None:
        await trio.to_thread.run_sync(
            partial(_unedit, workspace, args["path"], args["old_string"], args["new_string"], value)
        )

    def hunk(args: Any) -> FileDiff:
        return FileDiff(path=args["path"], old_text=args["old_string"], new_text=args["new_string"])

    def present_call(args: Any) -> DiffCallView:
        # The hunk of an every-occurrence edit is the same as a single edit's: only the title can tell
        # the approver, and it says so before the path, which a question line may cut short.
        what = "every occurrence in " if args.get("replace_all") is True else ""
        return DiffCallView(
            title=f"Edit {what}{args['path']}", diffs=[hunk(args)], locations=[FileLocation(path=args["path"])]
        )

    def present_result(args: Any, result: Any) -> DiffResultView | None:
        meta = _settled_meta(result)
        if meta is None:
            return None
        count = meta["replacements"]
        title = f"Edited {meta['path']}" + (f" ({count} replacements)" if count != 1 else "")
        return DiffResultView(title=title, diffs=[hunk(args)])

    return define_tool(
        name="edit_file",
        description=(
            "Replace an exact string in a UTF-8 text file in the workspace. `old_string` must occur exactly once "
            "(include enough surrounding lines to make it unique) unless `replace_all` is true, which replaces "
            "every occurrence. Matching is literal, not a regex, and must reproduce whitespace and indentation "
            "exactly, so read the file first. When `old_string` is missing or ambiguous the file is left unchanged "
            "and the error says how many times it occurs."
        ),
        parameters={
            "path": {"type": "string", "required": True, "description": "File path, relative to the workspace root."},
            "old_string": {"type": "string", "required": True, "description": "The exact text to replace."},
            "new_string": {"type": "string", "required": True, "description": "The replacement text."},
            "replace_all": {"type": "boolean", "description": "Replace every occurrence (default false)."},
        },
        output=ToolOutput(
            schema={
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "path": {"type": "string", "required": True},
                    "replacements": {"type": "integer", "required": True},
                    # Where the new text starts in the edited file (null past MAX_KEPT_POSITIONS
                    # replacements), and the file's digests after and before the edit: what a
                    # revert needs to undo exactly this edit, or refuse.
                    "positions": {
                        "oneOf": [{"type": "array", "items": {"type": "integer"}}, {"type": "null"}],
                        "required": True,
                    },
                    "sha256": {"type": "string", "required": True},
                    "before_sha256": {"type": "string", "required": True},
                },
            },
            render=_render_edit,
            presentation_meta=_value_as_meta,
        ),
        execute=edit_file,
        revert=revert,
        effects=ToolEffects(destructive=True),
        present_call=present_call,
        present_result=present_result,
    )


# --- glob ---------------------------------------------------------------------------------


def _sorted_entries(directory: str) -> Iterator[os.DirEntry[str]]:
    try:
        with os.scandir(directory) as scan:
            entries = sorted(scan, key=lambda entry: entry.name)
    except OSError:
        entries = []  # an unreadable directory is skipped, as rg and find do
    return iter(entries)


def _walk_files(base: str, *, hidden_dirs: bool, file_links: bool = True) -> Iterator[str]:
    """Every file below ``base`` in path order (each directory's entries by name, descending where met).

    Symlinked directories are not followed, symlinked files only with
    ``file_links``; ``.git`` is never entered, nor other hidden directories
    unless ``hidden_dirs``.
    """
    stack = [_sorted_entries(base)]
    while stack:
        entry = next(stack[-1], None)
        if entry is None:
            stack.pop()
            _check_cancelled()
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                if entry.name not in _SKIPPED_DIRS and (hidden_dirs or not entry.name.startswith(".")):
                    stack.append(_sorted_entries(entry.path))
            elif entry.is_file(follow_symlinks=file_links):
                yield entry.path
        except OSError:
            continue


def _relative_glob(pattern: str) -> str:
    """``pattern`` without leading ``./``: paths are matched relative to ``path``, so "./*.py" matched nothing."""
    while pattern.startswith("./"):
        pattern = pattern[2:].lstrip("/")
    return pattern


def _utf8_name(shown: str) -> bool:
    """Whether a listed path is text: a name whose bytes are not UTF-8 decodes to lone surrogates.

    Such a path could not be sent to a model (no UTF-8 encoder takes it), and no
    tool here opens it: one shown as U+FFFD names another file. It is counted, not listed.
    """
    if shown.isascii():
        return True
    try:
        shown.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


_NOT_UTF8_NAMES_NOTE: Final = "a path that is not UTF-8 text cannot be passed to any tool here"


def _glob(workspace: Workspace, pattern: str, path: str, limit: int) -> dict[str, Any]:
    pattern = _relative_glob(pattern)
    _check_pattern(pattern)
    base = workspace.resolve(path)
    if not os.path.isdir(base):
        raise FileToolError(f"{quoted_path(path)} is not a directory")
    matcher = compile_glob(pattern)
    found: list[tuple[float, str]] = []
    unnamed = 0
    for file in _walk_files(base, hidden_dirs=True):
        # Per file and along a long match: one directory's matches can take seconds.
        _check_cancelled()
        relative = os.path.relpath(file, base).replace(os.sep, "/")
        if not matcher.match(relative, check=_check_cancelled):
            continue
        real = os.path.realpath(file)
        if not workspace.contains(real):
            continue  # a symlink pointing out of the workspace
        try:
            mtime = os.stat(real).st_mtime
        except OSError:
            continue
        shown = workspace.display(file)
        if not _utf8_name(shown):
            unnamed += 1
            continue
        found.append((mtime, shown))
    found.sort(key=lambda item: (-item[0], item[1]))
    paths = [shown for _, shown in found[:limit]]
    value: dict[str, Any] = {"paths": paths, "total": len(found), "truncated": len(found) > limit}
    if unnamed:
        value["names_not_utf8"] = unnamed
    return value


def _unnamed_note(value: Any, what: str = "matching file(s)") -> str:
    unnamed = value.get("names_not_utf8")
    if not unnamed:
        return ""
    return f"\n[{unnamed} {what} left out: {_NOT_UTF8_NAMES_NOTE}]"


def _render_glob(args: Any, value: Any) -> list[TextBlock]:
    if not value["paths"]:
        return [TextBlock(f"No files match {args['pattern']!r}{_unnamed_note(value)}")]
    text = "\n".join(value["paths"])
    if value["truncated"]:
        text += f"\n[showing {len(value['paths'])} of {value['total']} files; narrow the pattern or raise limit]"
    return [TextBlock(text + _unnamed_note(value))]


def _glob_tool(workspace: Workspace) -> ToolDefinition:
    async def glob(args: Any, run: ToolRunContext) -> dict[str, Any]:
        limit = _positive(args.get("limit", DEFAULT_GLOB_LIMIT), "limit", MAX_GLOB_LIMIT)
        value: dict[str, Any] = await _in_thread(
            run,
            partial(_glob, workspace, args["pattern"], args.get("path", "."), limit)
        )
        return value

    def present_result(args: Any, result: Any) -> SearchResultView | None:
        meta = _settled_meta(result)
        if meta is None:
            return None
        return SearchResultView(
            shape="paths",
            title=f"Glob {args['pattern']}",
            paths=list(meta["paths"]),
            truncated=meta["truncated"],
            total=meta["total"],
        )

    return define_tool(
        name="glob",
        description=(
            "Find files in the workspace by path pattern, relative to directory `path` (default: the workspace "
            "root). `*` and `?` match within one path segment, `**` matches across directories (use `**/*.py` "
            "for every Python file at any depth; `*.py` only matches directly in `path`), `[abc]` is a character "
            "class and `{a,b}` an alternative. Returns file paths (not directories), most recently modified first, "
            f"at most `limit` (default {DEFAULT_GLOB_LIMIT}, at most {MAX_GLOB_LIMIT}), with the total count. The .git "
            "directory is skipped. Files whose paths are not UTF-8 are not listed: `names_not_utf8` counts them."
        ),
        parameters={
            "pattern": {"type": "string", "required": True, "description": "Glob pattern, e.g. `src/**/*.ts`."},
            "path": {"type": "string", "description": "Directory to search from, relative to the workspace root."},
            "limit": {
                "type": "integer",
                "description": f"Maximum number of paths (default {DEFAULT_GLOB_LIMIT}, at most {MAX_GLOB_LIMIT}).",
            },
        },
        output=ToolOutput(
            schema={
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "paths": {"type": "array", "required": True, "items": {"type": "string"}},
                    "total": {"type": "integer", "required": True},
                    "truncated": {"type": "boolean", "required": True},
                    "names_not_utf8": {"type": "integer"},
                },
            },
            render=_render_glob,
            presentation_meta=_value_as_meta,
        ),
        execute=glob,
        is_concurrency_safe=lambda args: True,
        effects=ToolEffects(read_only=True),
        present_call=lambda args: GenericCallView(title=f"Glob {args['pattern']}", kind="search"),
        present_result=present_result,
    )


# --- grep ---------------------------------------------------------------------------------


@attrs.define
class _Matches:
    """Matches grouped by file in first-seen order, keeping at most ``limit`` lines and counting all."""

    limit: int
    files: dict[str, list[dict[str, Any]]] = attrs.field(factory=dict)
    total: int = 0
    unnamed: int = 0  # files with matches whose names are not UTF-8 (each file's matches come together)
    _last_unnamed: str = ""

    def add(self, path: str, line_number: int, line: str, length: int | None = None, at: int | None = None) -> None:
        """Count a match, keeping it while under the limit.

        ``length``: the line's, when ``line`` is only its head; ``at``: where the
        match starts in ``line`` (characters), to show it on a line too long to show whole.
        """
        if not _utf8_name(path):
            if path != self._last_unnamed:
                self.unnamed += 1
                self._last_unnamed = path
            return
        self.total += 1
        if self.total <= self.limit:
            shown = _cut_around(line, MAX_MATCH_CHARS, length, at)
            self.files.setdefault(path, []).append({"line_number": line_number, "line": shown})

    def mark(self) -> tuple[int, int]:
        """Where the counts stand, for :meth:`drop_since`."""
        return self.total, self.unnamed

    def drop_since(self, mark: tuple[int, int], path: str) -> None:
        """Take back what ``path``'s matches added since ``mark`` (it turned out to be binary)."""
        total, unnamed = mark
        kept = self.files.get(path)
        if kept is not None:
            del kept[len(kept) - (min(self.total, self.limit) - min(total, self.limit)) :]
            if not kept:
                del self.files[path]
        self.total, self.unnamed = total, unnamed
        if self._last_unnamed == path:
            self._last_unnamed = ""

    def value(self) -> dict[str, Any]:
        value: dict[str, Any] = {
            "files": [{"path": path, "matches": matches} for path, matches in self.files.items()],
            "total": self.total,
            "truncated": self.total > self.limit,
        }
        if self.unnamed:
            value["names_not_utf8"] = self.unnamed
        return value


def _search_root_is_dir(base: str, path: str) -> bool:
    """Whether grep's resolved ``base`` is a directory (else a regular file); raises for anything else.

    A FIFO or a device would block or never end the search (ripgrep opens what it is given).
    """
    try:
        mode = os.stat(base).st_mode
    except FileNotFoundError:
        raise FileToolError(f"{quoted_path(path)} does not exist (use glob to find files)") from None
    except OSError as exc:
        raise _os_error(exc, path) from None
    if stat.S_ISDIR(mode):
        return True
    if not stat.S_ISREG(mode):
        raise FileToolError(f"{quoted_path(path)} is not a regular file or a directory")
    return False


GREP_LINE_BYTES: Final = 1024 * 1024
"""The built-in grep searches this much of each line (ripgrep, whole lines).

The rest of a longer line (a minified bundle, a data dump) is counted, not
held in memory or searched.
"""
# It checks for cancellation after so many lines, or sooner after a megabyte of them.
_GREP_LINES_PER_CHECK: Final = 1024


def _grep_lines(stream: Any) -> Iterator[tuple[int, str, int | None]]:
    """Each line's number, text (of a long one, its head) and, when cut, its length in characters."""
    number = since_check = 0
    while raw := stream.readline(GREP_LINE_BYTES):
        number += 1
        since_check += len(raw)
        if number % _GREP_LINES_PER_CHECK == 0 or since_check >= _CHUNK_BYTES:
            _check_cancelled()
            since_check = 0
        rest = 0
        if len(raw) == GREP_LINE_BYTES and not raw.endswith(b"\n"):
            rest = _skip_line(stream)  # one line may be gigabytes
        text = raw.rstrip(b"\n").rstrip(b"\r").decode("utf-8", errors="replace")
        yield number, text, (len(text) + rest if rest else None)


# ``re``'s own parser (no public API): it reads a pattern into a tree without compiling it.
_RE_PARSER: Final[Any] = importlib.import_module("re._parser")
# The most pattern positions a grep pattern may expand to once its counted repetitions are
# multiplied out: regex's compiler does that, and (a{65535}){65535} exhausted the host's memory.
_MAX_REGEX_POSITIONS: Final = 100_000
_REPEATS: Final = frozenset(("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"))


def _expanded_size(parsed: Any, limit: int) -> int:
    """How many positions a parsed pattern holds with its counted repeats multiplied out (stops past ``limit``).

    A repeat counts its upper bound, or its lower bound when it has none
    (``a{3,}`` expands three copies; ``a*`` one). A loop, not recursion: the
    tree is as deep as the pattern nests.
    """
    total = 0
    stack: list[tuple[Any, int]] = [(parsed, 1)]
    while stack:
        items, factor = stack.pop()
        for op, value in items:
            name = str(op)
            if name in _REPEATS:
                low, high, inner = value
                count = high if high != _RE_PARSER.MAXREPEAT else low
                stack.append((inner, factor * max(count, 1)))
            elif name == "SUBPATTERN":
                stack.append((value[3], factor))
            elif name == "BRANCH":
                stack.extend((branch, factor) for branch in value[1])
            elif name == "ATOMIC_GROUP":
                stack.append((value, factor))
            elif name in ("ASSERT", "ASSERT_NOT"):
                stack.append((value[1], factor))
            elif name == "GROUPREF_EXISTS":
                stack.extend((branch, factor) for branch in value[1:] if branch is not None)
            else:
                total += factor
                if total > limit:
                    return total
    return total


# How long the built-in grep lets its regular expression run on one line. The pattern is the
# model's: one that backtracks catastrophically ("(a+)+$") would otherwise run for ever.
GREP_LINE_REGEX_SECONDS: Final = 1.0


def _grep_python(
    workspace: Workspace, pattern: str, path: str, file_glob: str | None, ignore_case: bool, limit: int
) -> dict[str, Any]:
    # The third-party ``regex`` engine matches, not ``re``: ``re`` holds the GIL while it matches,
    # so a catastrophic pattern froze the whole host (every call, every agent), and it has no
    # timeout. The pattern is read with ``re``'s parser first, though: what it accepts is the
    # syntax this tool has always taken, and ``regex`` multiplies nested counts out when it
    # compiles, which the parse tree lets us bound first.
    try:
        size = _expanded_size(_RE_PARSER.parse(pattern, re.IGNORECASE if ignore_case else 0), _MAX_REGEX_POSITIONS)
        if size > _MAX_REGEX_POSITIONS:
            raise FileToolError(
                f"the regular expression {safe_repr(pattern)} is too large: its counted repetitions multiply "
                f"out to more than {_MAX_REGEX_POSITIONS} positions (nested counts such as (a{{1000}}){{1000}}); "
                "use + or * instead of large counts"
            )
        # Not kept in regex's module cache (500 patterns): a model sending many large patterns
        # would have it hold gigabytes.
        compiled = regex.compile(pattern, regex.IGNORECASE if ignore_case else 0, cache_pattern=False)
    except (re.error, regex.error) as exc:
        raise FileToolError(f"invalid regular expression {safe_repr(pattern)}: {exc}") from None
    except (RecursionError, OverflowError) as exc:
        # re's parser recurses once per nested group, and a repetition count past
        # its C limit overflows: the pattern is what is wrong, not the tool.
        problem = "it nests too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise FileToolError(f"invalid regular expression {safe_repr(pattern)}: {problem}") from None
    base = workspace.resolve(path)
    matcher = compile_glob(file_glob) if file_glob else None
    if _search_root_is_dir(base, path):
        candidates: Iterator[str] = _walk_files(base, hidden_dirs=False, file_links=False)
    else:
        candidates = iter([base])
    found = _Matches(limit)
    # Like rg's --glob: a pattern without "/" matches the file name at any depth, and
    # a hidden file is searched only when the glob names it (hidden dirs never are).
    by_name = file_glob is not None and "/" not in file_glob
    for file in candidates:
        _check_cancelled()
        if file != base:
            relative = os.path.relpath(file, base).replace(os.sep, "/")
            name = relative.rsplit("/", 1)[-1]
            selected = matcher is not None and matcher.match(name if by_name else relative, check=_check_cancelled)
            if not selected and (matcher is not None or name.startswith(".")):
                continue
        real = os.path.realpath(file)
        if not workspace.contains(real):
            continue
        shown = workspace.display(real) if file == base else workspace.display(file)
        try:
            with open_regular(real, resolved=True) as stream:
                if _is_binary(stream.read(_BINARY_SNIFF_BYTES)):
                    continue
                stream.seek(0)
                mark = found.mark()
                for number, line, length in _grep_lines(stream):
                    if "\x00" in line and file != base:
                        # Binary after all (ripgrep drops a file it meets a NUL in while it walks a
                        # directory; one named by path it searches whole, and so does this search).
                        found.drop_since(mark, shown)
                        break
                    try:
                        matched = compiled.search(line, timeout=GREP_LINE_REGEX_SECONDS, concurrent=True)
                    except TimeoutError:
                        raise FileToolError(
                            f"the regular expression {safe_repr(pattern)} ran for more than "
                            f"{GREP_LINE_REGEX_SECONDS:g} s on line {number} of {shown} (it backtracks "
                            "catastrophically, as nested repetition like (a+)+ does): simplify it"
                        ) from None
                    if matched:
                        found.add(shown, number, line, length, matched.start())
        except OSError:
            continue
    return found.value()


# rg --json writes each match as one line of JSON holding the whole matching line; past this
# size a message is not kept whole (a path, even escaped, fits well within it).
_RG_MESSAGE_CAP: Final = 64 * 1024
# How much of an oversized match's JSON string is kept: MAX_MATCH_CHARS characters, even escaped.
_RG_LINE_HEAD_BYTES: Final = 6 * MAX_MATCH_CHARS + 6
_RG_LINES_FIELD: Final = re.compile(rb',"lines":\{"(text|bytes)":"')
_RG_LINE_NUMBER: Final = re.compile(rb'\s*\}\s*,\s*"line_number"\s*:\s*(\d+)')
# The quote closing a JSON string: one after an even run of backslashes (each pair is one "\\").
_JSON_CLOSING_QUOTE: Final = re.compile(rb'(?:^|[^\\])(?:\\\\)*"')
_BACKSLASH: Final = ord("\\")


def _backslash_run(raw: bytes, end: int) -> int:
    """How many backslashes end ``raw[:end]``."""
    start = end
    while start > 0 and raw[start - 1] == _BACKSLASH:
        start -= 1
    return end - start


def _closing_quote(piece: bytes) -> int:
    """Where the quote closing a JSON string is in ``piece`` (starting between escapes), or -1."""
    position = 0
    for _ in range(16):  # quotes are rare in most lines: find them at memchr's speed
        quote = piece.find(b'"', position)
        if quote == -1 or _backslash_run(piece, quote) % 2 == 0:
            return quote
        position = quote + 1
    # Many escaped quotes: one regular expression pass (the escaped quote before starts it).
    found = _JSON_CLOSING_QUOTE.search(piece, position - 1)
    return -1 if found is None else found.end() - 1


def _whole_escapes_end(raw: bytes) -> int:
    """Where an escape that ``raw`` cuts short begins (``len(raw)`` if none); ``raw`` starts between escapes."""
    last = raw.rfind(b"\\", max(len(raw) - 6, 0))
    if last == -1 or _backslash_run(raw, last + 1) % 2 == 0:
        return len(raw)  # no backslash near the end, or the last one closes a "\\"
    if last == len(raw) - 1 or (raw[last + 1 : last + 2] == b"u" and len(raw) - last < 6):
        return last
    return len(raw)


def _ends_with_escape(raw: bytes, letter: bytes) -> bool:
    """Whether ``raw`` (starting between escapes) ends with the escape ``\\`` + ``letter``."""
    return raw.endswith(b"\\" + letter) and _backslash_run(raw, len(raw) - 1) % 2 == 1


def _json_characters(raw: bytes) -> int:
    """How many characters the JSON string body ``raw`` (whole escapes only) stands for."""
    characters = len(raw) - len(raw.translate(None, _NOT_CONTINUATION))
    # Left to right, as a JSON reader pairs them: what is left are the other escapes' backslashes.
    pairs = raw.count(b"\\\\")
    rest = raw.replace(b"\\\\", b"")
    return characters - pairs - rest.count(b"\\") - 4 * rest.count(b"\\u")


@attrs.define
class _OversizedMatch:
    """An rg match message too long to keep: its head, and its line's JSON string scanned in chunks.

    Each chunk is cut between two escapes (an escape cut in two waits for the next), so
    that counting and finding the closing quote need no state but the previous chunk's ending.
    """

    head: bytes  # the message up to the opening quote of its line's JSON string
    encoding: bytes  # b"text" (a JSON string) or b"bytes" (base64)
    kept: bytearray = attrs.field(factory=bytearray)
    kept_all: bool = True  # whether ``kept`` is still all of the string so far
    carry: bytes = b""
    length: int = 0  # characters of the line (for base64, bytes), its line ending included
    ending: int = 0  # how much of ``length`` the line ending is
    last_piece: bytes = b""  # the end of the string so far (base64: its last eight characters)
    after: bytearray | None = None  # once the string closed: what follows it, up to the line number

    def feed(self, data: bytes) -> int:
        """Take ``data`` up to the message's newline; returns how much of it was the message's (-1: all)."""
        start = 0
        if self.after is None:
            carried = len(self.carry)
            closed = self._scan_string(self.carry + data)
            if closed == -1:
                return -1
            start = closed - carried  # the closing quote is in data: the carry holds none
            self.after = bytearray()
        newline = data.find(b"\n", start)
        end = len(data) if newline == -1 else newline
        self.after += data[start : min(end, start + max(256 - len(self.after), 0))]
        return -1 if newline == -1 else newline + 1

    def _scan_string(self, piece: bytes) -> int:
        """Keep and count ``piece`` of the line's string; returns the index past its closing quote, or -1."""
        quote = _closing_quote(piece)
        if quote == -1:
            end = _whole_escapes_end(piece)
            body, self.carry = piece[:end], piece[end:]
        else:
            body, self.carry = piece[:quote], b""
        if self.kept_all:
            room = _RG_LINE_HEAD_BYTES - len(self.kept)
            taken = body[:room]
            if len(body) > room:
                taken = taken[: _whole_escapes_end(taken)]
                self.kept_all = False
            self.kept += taken
        if body:
            self._count(body)
        return -1 if quote == -1 else quote + 1

    def _count(self, body: bytes) -> None:
        if self.encoding == b"bytes":
            self.length += len(body)  # base64 characters until message() turns them into bytes
            self.last_piece = (self.last_piece + body)[-8:]  # two whole quads: room for "\r\n"
            return
        self.length += _json_characters(body)
        newline = _ends_with_escape(body, b"n")
        if newline and len(body) == 2:
            carriage_return = _ends_with_escape(self.last_piece, b"r")
        else:
            carriage_return = newline and _ends_with_escape(body[:-2], b"r")
        self.ending = int(newline) + int(carriage_return)
        self.last_piece = body

    def message(self) -> tuple[dict[str, Any], int] | None:
        """The message with only the kept head of its line, and the line's length; None if cut short."""
        number = _RG_LINE_NUMBER.match(self.after or b"")
        lines = _RG_LINES_FIELD.search(self.head)
        if number is None or lines is None:
            return None
        message: dict[str, Any] = json.loads(self.head[: lines.start()] + b"}}")
        length, ending = self.length, self.ending
        if self.encoding == b"text":
            line = {"text": json.loads('"' + self.kept.decode("utf-8", errors="ignore") + '"')}
        else:
            line = {"bytes": self.kept[: len(self.kept) // 4 * 4].decode("ascii")}
            # Counted in bytes: the line is not UTF-8, and decoding all of it to count is what is avoided.
            length = length // 4 * 3 - self.last_piece.count(b"=")
            tail = base64.b64decode(self.last_piece[len(self.last_piece) % 4 :])
            ending = tail.endswith(b"\n") + tail.endswith(b"\r\n")
        message["data"].update(lines=line, line_number=int(number.group(1)))
        return message, length - ending


class _RgMessages:
    """``rg --json`` output split into messages, in time linear in its length and bounded memory.

    Only new bytes are searched for the newline ending a message. A message longer than
    ``_RG_MESSAGE_CAP`` (a match on a line megabytes long) is not kept whole: see
    :class:`_OversizedMatch`; it reaches ``on_message`` with the head of its line and
    the line's length in characters.
    """

    def __init__(self, on_message: Callable[[dict[str, Any], int | None], None]) -> None:
        self._on_message = on_message
        self._pending = bytearray()
        self._oversized: _OversizedMatch | None = None
        self._skipping = False  # an oversized message that is not a match: dropped to its newline

    def feed(self, data: bytes) -> None:
        start = 0
        while start < len(data):
            if self._oversized is not None:
                used = self._oversized.feed(data[start:] if start else data)
                if used == -1:
                    return
                self._finish_oversized()
                start += used
                continue
            newline = data.find(b"\n", start)
            if newline == -1:
                if not self._skipping:
                    self._pending += data[start:] if start else data
                    if len(self._pending) > _RG_MESSAGE_CAP:
                        self._start_oversized()
                return
            if self._skipping:
                self._skipping = False
            else:
                self._pending += data[start:newline]
                self._parse(bytes(self._pending))
            self._pending.clear()
            start = newline + 1

    def close(self) -> None:
        if self._oversized is not None:
            self._finish_oversized()
        elif not self._skipping:
            self._parse(bytes(self._pending))

    def _parse(self, line: bytes) -> None:
        if line.strip():
            self._on_message(json.loads(line), None)

    def _start_oversized(self) -> None:
        head = bytes(self._pending)
        lines = _RG_LINES_FIELD.search(head)
        if lines is None and len(head) <= 4 * _RG_MESSAGE_CAP and head.startswith(b'{"type":"match"'):
            return  # a path longer than usual: wait for the line's field
        self._pending.clear()
        if lines is None or not head.startswith(b'{"type":"match"'):
            self._skipping = True
            return
        self._oversized = _OversizedMatch(head[: lines.end()], lines.group(1))
        self._oversized.feed(head[lines.end() :])

    def _finish_oversized(self) -> None:
        assert self._oversized is not None
        oversized, self._oversized = self._oversized, None
        if (clipped := oversized.message()) is not None:
            self._on_message(*clipped)


def _rg_match_start(data: Mapping[str, Any], line: str) -> int | None:
    """Where rg's first submatch starts in ``line``, in characters (rg gives bytes), when the line is long."""
    if len(line) <= MAX_MATCH_CHARS:
        return None
    submatches = data.get("submatches")
    if not submatches or not isinstance(submatches[0].get("start"), int):
        return None  # an oversized message: only its line's head was kept
    start: int = submatches[0]["start"]
    return len(line.encode("utf-8", "surrogatepass")[:start].decode("utf-8", "replace"))


def _rg_text(field: Mapping[str, Any], *, line: bool = False) -> str:
    """A text field of rg's JSON, given as ``bytes`` (base64) when it is not UTF-8.

    A path keeps its bytes (``os.fsdecode``: it must name the file); a line shows
    U+FFFD for them, as the built-in search does: a lone surrogate is text no
    UTF-8 encoder takes, and it would reach the model and every log.
    """
    if "text" in field:
        text: str = field["text"]
        return text
    raw = base64.b64decode(field.get("bytes", ""))
    return raw.decode("utf-8", errors="replace") if line else os.fsdecode(raw)


def _sniffs_binary(real: str) -> bool:
    try:
        with open(real, "rb") as stream:
            return _is_binary(stream.read(_BINARY_SNIFF_BYTES))
    except OSError:
        return False  # rg reports why it cannot read it


async def _grep_rg(
    run: ToolRunContext,
    rg: str,
    workspace: Workspace,
    pattern: str,
    path: str,
    file_glob: str | None,
    ignore_case: bool,
    limit: int,
) -> dict[str, Any]:
    base = await _in_thread(run, partial(workspace.resolve, path))
    is_dir = await _in_thread(run, partial(_search_root_is_dir, base, path))
    # rg searches a file named on its command line even when it is binary; skip it as the fallback does.
    if not is_dir and await _in_thread(run, partial(_sniffs_binary, base)):
        return _Matches(limit).value()
    # --sort path makes the file order deterministic (and equal to the fallback's).
    # --crlf: "$" matches before "\r\n" too, as in the built-in search (which strips the "\r").
    argv = [rg, "--json", "--no-config", "--sort", "path", "--no-messages", "--crlf"]
    if ignore_case:
        argv.append("--ignore-case")
    if file_glob:
        argv += ["--glob", file_glob]
    argv += ["-e", pattern, "--", base]
    found = _Matches(limit)
    errors = bytearray()

    async def read_matches(stream: trio.abc.ReceiveStream) -> None:
        messages = _RgMessages(parse)
        async with stream:
            async for chunk in stream:
                messages.feed(bytes(chunk))
            messages.close()

    def parse(message: dict[str, Any], length: int | None) -> None:
        if message.get("type") != "match":
            return
        data = message["data"]
        # rg prints paths as given: below the absolute ``base``, so absolute too.
        shown = workspace.display(os.path.join(base, _rg_text(data["path"])))
        line = _rg_text(data["lines"], line=True).rstrip("\n").rstrip("\r")
        found.add(shown, data["line_number"], line, length, _rg_match_start(data, line))

    async def read_errors(stream: trio.abc.ReceiveStream) -> None:
        async with stream:
            async for chunk in stream:
                if len(errors) < 4096:
                    errors.extend(chunk)

    async with trio.open_nursery() as nursery:
        process: trio.Process = await nursery.start(
            partial(
                trio.run_process,
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=workspace.root,
                check=False,
            )
        )
        assert process.stdout is not None and process.stderr is not None
        nursery.start_soon(read_matches, process.stdout)
        nursery.start_soon(read_errors, process.stderr)
    # rg: 0 = matches, 1 = none, 2 = an error (possibly after some matches, e.g. one unreadable file).
    if process.returncode == 2 and found.total == 0:
        message = errors.decode("utf-8", errors="replace").strip()
        if message.startswith("error parsing glob"):
            raise FileToolError(f"invalid glob pattern: {message.removeprefix('error parsing glob ')}")
        if message:
            raise FileToolError(f"grep failed: {message}")
        # Silent under --no-messages: only a file or directory it could not open or read (a
        # path too long, permission denied), which the built-in search skips too. The search
        # itself went through.
    return found.value()


def _render_grep(args: Any, value: Any) -> list[TextBlock]:
    if not value["files"]:
        return [TextBlock(f"No matches for {args['pattern']!r}{_unnamed_note(value, 'file(s) with matches')}")]
    parts: list[str] = []
    for file in value["files"]:
        parts.append(file["path"])
        parts.extend(f"  {match['line_number']}: {match['line']}" for match in file["matches"])
    if value["truncated"]:
        shown = sum(len(file["matches"]) for file in value["files"])
        parts.append(
            f"[showing {shown} of {value['total']} matching lines; narrow the pattern, path or glob, or raise limit]"
        )
    return [TextBlock("\n".join(parts) + _unnamed_note(value, "file(s) with matches"))]


def _grep_tool(workspace: Workspace) -> ToolDefinition:
    async def grep(args: Any, run: ToolRunContext) -> dict[str, Any]:
        limit = _positive(args.get("limit", DEFAULT_GREP_LIMIT), "limit", MAX_GREP_LIMIT)
        pattern: str = args["pattern"]
        path: str = args.get("path", ".")
        file_glob: str | None = args.get("glob")
        ignore_case: bool = args.get("ignore_case", False)
        if not pattern:
            raise FileToolError("pattern must not be empty")
        if len(pattern) > MAX_GREP_PATTERN_CHARS:
            raise FileToolError(
                f"pattern is {len(pattern)} characters long; at most {MAX_GREP_PATTERN_CHARS} are taken"
            )
        # Refused for both backends alike, before one reaches ripgrep's argv (where it cannot go):
        # a NUL only occurs in binary files, which are skipped, and in no path.
        if "\x00" in pattern:
            raise FileToolError("pattern must not contain a NUL character (binary files are not searched)")
        if file_glob is not None:
            file_glob = _relative_glob(file_glob)
            _check_pattern(file_glob)
            if "\x00" in file_glob:
                raise FileToolError("glob pattern must not contain a NUL character (no path holds one)")
            if file_glob.startswith("!"):
                # ripgrep read it as "every file but" these, the built-in search as a name starting with "!".
                raise FileToolError("glob must name the files to search; a leading '!' (every file but) is not supported")
            # Its bounds (length, alternatives) hold whichever backend searches: ripgrep took a
            # glob the built-in search refuses, and matched it to nothing, silently.
            compile_glob(file_glob)
        rg = shutil.which("rg")
        if rg is not None:
            return await _grep_rg(run, rg, workspace, pattern, path, file_glob, ignore_case, limit)
        value: dict[str, Any] = await _in_thread(
            run,
            partial(_grep_python, workspace, pattern, path, file_glob, ignore_case, limit)
        )
        return value

    def present_result(args: Any, result: Any) -> SearchResultView | None:
        meta = _settled_meta(result)
        if meta is None:
            return None
        files = [
            SearchFileMatches(
                path=file["path"],
                matches=[SearchMatch(line_number=m["line_number"], line=m["line"]) for m in file["matches"]],
            )
            for file in meta["files"]
        ]
        return SearchResultView(
            shape="matches",
            title=f"Grep {args['pattern']}",
            files=files,
            truncated=meta["truncated"],
            total=meta["total"],
        )

    match_schema = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "line_number": {"type": "integer", "required": True},
            "line": {"type": "string", "required": True},
        },
    }
    return define_tool(
        name="grep",
        description=(
            "Search the contents of workspace files for a regular expression. Returns matching lines grouped by "
            f"file (with 1-based line numbers), at most `limit` lines (default {DEFAULT_GREP_LIMIT}, at most "
            f"{MAX_GREP_LIMIT}), plus the "
            "total number of matching lines. `path` is a file or directory (default: the workspace root); `glob` "
            "keeps only files whose name matches (e.g. `*.py`; a pattern with `/` such as `src/**/*.ts` matches "
            "the path below `path`). Binary files are skipped; hidden files too unless `glob` matches them (`*` "
            "does), and files ignored by .gitignore when ripgrep is installed (unless `glob` names them). A `glob` "
            "starting with `./` is taken without it. Files whose paths are not UTF-8 are not listed: `names_not_utf8` "
            "counts them. Use plain regex syntax (classes, `\\b`, `|`, groups; no look-around or "
            "backreferences), and escape literal characters such as `(` or `.`."
        ),
        parameters={
            "pattern": {"type": "string", "required": True, "description": "Regular expression to search for."},
            "path": {"type": "string", "description": "File or directory to search, relative to the workspace root."},
            "glob": {"type": "string", "description": "Only search files matching this glob, e.g. `*.py`."},
            "ignore_case": {"type": "boolean", "description": "Match case-insensitively (default false)."},
            "limit": {
                "type": "integer",
                "description": f"Maximum matching lines (default {DEFAULT_GREP_LIMIT}, at most {MAX_GREP_LIMIT}).",
            },
        },
        output=ToolOutput(
            schema={
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "files": {
                        "type": "array",
                        "required": True,
                        "items": {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": {
                                "path": {"type": "string", "required": True},
                                "matches": {"type": "array", "required": True, "items": match_schema},
                            },
                        },
                    },
                    "total": {"type": "integer", "required": True},
                    "truncated": {"type": "boolean", "required": True},
                    "names_not_utf8": {"type": "integer"},
                },
            },
            render=_render_grep,
            presentation_meta=_value_as_meta,
        ),
        execute=grep,
        is_concurrency_safe=lambda args: True,
        effects=ToolEffects(read_only=True),
        present_call=lambda args: GenericCallView(title=f"Grep {args['pattern']}", kind="search"),
        present_result=present_result,
    )


# --- the plugin ---------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class FilesSettings:
    """The ``[plugins.files]`` table: ``root`` is the workspace; without it the plugin registers nothing.

    ``allow_git_writes`` lets ``write_file`` and ``edit_file`` write inside a ``.git`` directory.
    """

    root: PathSetting | None = attrs.field(default=None, validator=kept_path)
    allow_git_writes: bool = False


def file_tools(
    root: str | os.PathLike[str] | None = None,
    *,
    runtime: ToolRuntime | None = None,
    allow_git_writes: bool = False,
) -> list[ToolDefinition]:
    """The five file tools confined to ``root`` (default: the current directory), for hosts that register by hand.

    With ``runtime``, ``write_file`` and ``edit_file`` refuse the files its host
    keeps (:meth:`ToolRuntime.kept_file <dsh_core.ToolRuntime.kept_file>`); they
    refuse paths inside a git directory unless ``allow_git_writes``.
    """
    workspace = Workspace(
        os.getcwd() if root is None else root,
        kept=None if runtime is None else runtime.kept_file,
        allow_git_writes=allow_git_writes,
    )
    return _tools(workspace)


def _tools(workspace: Workspace) -> list[ToolDefinition]:
    return [
        _read_file_tool(workspace),
        _write_file_tool(workspace),
        _edit_file_tool(workspace),
        _glob_tool(workspace),
        _grep_tool(workspace),
    ]


@hookimpl
def dsh_setup(runtime: ToolRuntime, config: dict[str, Any]) -> None:
    """Register ``read_file``, ``write_file``, ``edit_file``, ``glob`` and ``grep`` for the configured root.

    Opt-in: without ``[plugins.files] root`` nothing is registered, so installing
    dsh-tools never hands a model file access a host did not ask for.
    """
    settings = structure_table(FilesSettings, config, "[plugins.files]")
    if settings.root is None:
        report_inert_keys(runtime, "files", config, "root", "no file tool is registered: set root to register them")
        return
    root = os.path.abspath(settings.root)
    if not os.path.isdir(root):
        raise ConfigError([f"[plugins.files].root: {root!r} is not a directory"])
    workspace = Workspace(root, kept=runtime.kept_file, allow_git_writes=settings.allow_git_writes)
    _WORKSPACES[runtime] = workspace
    for tool in _tools(workspace):
        runtime.register(tool)


# The workspace the plugin set up for each runtime: permissions rules on paths resolve against its root.
_WORKSPACES: weakref.WeakKeyDictionary[ToolRuntime, Workspace] = weakref.WeakKeyDictionary()


def workspace_of(runtime: ToolRuntime) -> Workspace | None:
    """The workspace this plugin's ``dsh_setup`` confined ``runtime``'s file tools to (``None``: not set up)."""
    return _WORKSPACES.get(runtime)
