"""``no-writes-outside-workspace``: a guard refusing paths that resolve outside the workspace root.

Configure it in ``[plugins.no-writes-outside-workspace]``::

    [plugins.no-writes-outside-workspace]
    root = "."                     # the workspace (default: the working directory)
    tools = ["*"]                  # fnmatch globs of the tools it guards (default: all)
    path_keys = ["path", "file"]   # argument names holding paths (default: the list below)

Every string (or list of strings) found under a path-like key anywhere in the
arguments is resolved against ``root`` with symlinks followed
(``os.path.realpath``); one that lands outside denies the call. It guards every
tool by default, so nothing outside the workspace is read either; set
``tools = ["write_*", "edit_*"]`` to confine it to writes.

It is a *guard* (``runtime.guard``), not a listener: guards run after the
pre-execute waterfall and can only deny, so no other policy can re-allow what
it refuses.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterator
from typing import Any

import attrs

from dsh_core import ConfigError, JsonValue, ToolExecution, ToolRuntime, hookimpl, structure_table

__all__ = ["DEFAULT_PATH_KEYS", "GUARD_NAME", "PathArguments", "WorkspaceGuard", "WorkspaceSettings", "dsh_setup"]

# Capability manifest: the guard may refuse a call of any tool that has a path argument.
DSH_CAPABILITIES: dict[str, list[str]] = {"tools": [], "affects": ["*"]}

GUARD_NAME = "no-writes-outside-workspace"

DEFAULT_PATH_KEYS = (
    "path",
    "paths",
    "file",
    "file_path",
    "filename",
    "files",
    "dir",
    "directory",
    "cwd",
    "source",
    "target",
    "destination",
    "dest",
)


@attrs.frozen(kw_only=True)
class PathArguments:
    """Which tools' arguments hold paths, and under which names: ``tools`` and ``path_keys``.

    The guard's settings and ``tidy-paths``' whole table, so that both read the
    same keys with the same defaults.
    """

    tools: tuple[str, ...] = ("*",)
    path_keys: tuple[str, ...] = DEFAULT_PATH_KEYS

    def covers(self, tool_name: str) -> bool:
        """Whether ``tool_name`` matches one of the ``tools`` globs."""
        return any(fnmatch.fnmatchcase(tool_name, glob) for glob in self.tools)


@attrs.frozen(kw_only=True)
class WorkspaceSettings(PathArguments):
    """The ``[plugins.no-writes-outside-workspace]`` table."""

    root: str | None = None


def path_arguments(arguments: JsonValue, keys: frozenset[str]) -> Iterator[tuple[str, str]]:
    """Every ``(key, path)`` under a key in ``keys``, anywhere in ``arguments`` (iteratively)."""
    stack: list[JsonValue] = [arguments]
    while stack:
        current = stack.pop()
        if isinstance(current, dict):
            for key, value in current.items():
                if key in keys:
                    if isinstance(value, str):
                        yield key, value
                    elif isinstance(value, (list, tuple)):
                        yield from ((key, item) for item in value if isinstance(item, str))
                stack.append(value)
        elif isinstance(current, (list, tuple)):
            stack.extend(current)


class WorkspaceGuard:
    """The guard: ``guard(execution)`` is ``None`` (no objection) or the reason for refusing."""

    def __init__(self, settings: WorkspaceSettings | None = None) -> None:
        self.settings = settings or WorkspaceSettings()
        self.root = os.path.realpath(self.settings.root if self.settings.root is not None else os.getcwd())
        self._keys = frozenset(self.settings.path_keys)
        self.__qualname__ = GUARD_NAME  # the runtime names a guard by its qualname in denials

    def outside(self, path: str) -> bool:
        """Whether ``path`` (relative to the root, or absolute) resolves outside the root."""
        if "\x00" in path:
            return True  # not a path any file system accepts; refuse rather than guess
        resolved = os.path.realpath(os.path.join(self.root, path))
        return os.path.commonpath([resolved, self.root]) != self.root

    def __call__(self, execution: ToolExecution) -> str | None:
        if not self.settings.covers(execution.name):
            return None
        for key, path in path_arguments(execution.arguments, self._keys):
            if self.outside(path):
                return f'{execution.name}: argument "{key}" ({path!r}) resolves outside the workspace'
        return None


@hookimpl
def dsh_setup(runtime: ToolRuntime, config: dict[str, Any]) -> None:
    """Add a fresh :class:`WorkspaceGuard` to ``runtime`` (global: it sees every call)."""
    settings = structure_table(WorkspaceSettings, config, f"[plugins.{GUARD_NAME}]")
    if settings.root is not None and not os.path.isdir(settings.root):
        raise ConfigError([f"[plugins.{GUARD_NAME}].root: {settings.root!r} is not a directory"])
    runtime.guard(WorkspaceGuard(settings))
