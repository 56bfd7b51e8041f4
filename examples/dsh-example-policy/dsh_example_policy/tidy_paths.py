"""``tidy-paths``: rewrite untidy relative paths (``./a//b/./c`` becomes ``a/b/c``) before a call runs.

Configure it in ``[plugins.tidy-paths]`` (optional; the same keys and defaults
as the workspace guard's, :class:`~dsh_example_policy.workspace.PathArguments`)::

    [plugins.tidy-paths]
    tools = ["*"]                  # fnmatch globs of the tools it tidies (default: all)
    path_keys = ["path", "file"]   # argument names holding paths (default: DEFAULT_PATH_KEYS)

Every string under a top-level path argument, or in a list there, loses its
``./`` segments and repeated slashes. ``..`` segments are kept: removing them
could change which file a path names once symlinks are involved, and judging
them is the workspace guard's job.

Only what looks like a file-system path is tidied: a key such as ``source`` or
``target`` also carries URLs (``https://...``, ``s3://...``) and code, so a
value with a ``scheme:`` prefix, a leading ``//``, whitespace or a control
character is left as it is. A ``./`` in front of a name starting with ``-``
stays, since without it a command would read the name as an option.

It answers with ``Rewrite``, never by editing the arguments, so the whole
pre-execute stage and every guard run again on the tidy path: the workspace
guard judges the path that will be used, and the result tells the model what
was changed.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

from dsh_core import Allow, PreToolDecision, Rewrite, ToolExecution, ToolRuntime, hookimpl, structure_table

from .workspace import PathArguments

__all__ = ["TidyPaths", "TidySettings", "dsh_setup", "looks_like_path", "tidy"]

# The table is the guard's selection of tools and path keys, nothing more.
TidySettings = PathArguments

# Capability manifest: it may rewrite the path arguments of any tool.
DSH_CAPABILITIES: dict[str, list[str]] = {"tools": [], "affects": ["*"]}

_REPEATED_SLASHES = re.compile(r"/{2,}")
# RFC 3986's scheme: "https:", "s3:", "git+ssh:"... (a one-letter one is a Windows drive, no path here either).
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:")


def looks_like_path(text: str) -> bool:
    """Whether ``text`` could be a file-system path rather than a URL or code under a path-like key."""
    if _SCHEME.match(text) or text.startswith("//"):
        return False  # a URL, a scheme-relative URL or a network path: "//" is meaningful there
    return not any(char.isspace() or not char.isprintable() for char in text)


def tidy(path: str) -> str:
    """``path`` without ``.`` segments or repeated slashes; what does not :func:`looks_like_path` as it is.

    Absolute stays absolute, ``..`` and a trailing slash (a directory) stay, and
    an empty path stays empty: it is the tool's to refuse, not the workspace root.
    A leading ``./`` stays before a name starting with ``-``.
    """
    if not path or not looks_like_path(path):
        return path
    absolute = path.startswith("/")
    parts = [part for part in _REPEATED_SLASHES.sub("/", path).split("/") if part not in ("", ".")]
    tidied = "/".join(parts)
    if not tidied:
        return "/" if absolute else "."
    if path.endswith("/"):
        tidied += "/"
    if absolute:
        return "/" + tidied
    if tidied.startswith("-") and not path.startswith("-"):
        return "./" + tidied  # the "./" is what keeps "-rf" a file name for a command taking it
    return tidied


def _tidied(value: object) -> object:
    """``value`` tidied if it is a path or a list of them, else ``value`` itself."""
    if isinstance(value, str):
        return tidy(value)
    if isinstance(value, (list, tuple)):
        return [tidy(item) if isinstance(item, str) else item for item in value]
    return value


class TidyPaths:
    """The ``dsh_pre_execute`` listener; see the module docstring."""

    def __init__(self, settings: TidySettings | None = None) -> None:
        self.settings = settings or TidySettings()

    @hookimpl
    async def dsh_pre_execute(
        self, execution: ToolExecution, next: Callable[[], Awaitable[PreToolDecision]]
    ) -> PreToolDecision:
        decision = await next()
        arguments = execution.arguments
        if not isinstance(decision, Allow) or not isinstance(arguments, dict):
            return decision  # only a call the rest of the stage allows is worth tidying
        if not self.settings.covers(execution.name):
            return decision
        changed: dict[str, Any] = {}
        for key in dict.fromkeys(self.settings.path_keys):
            value = arguments.get(key)
            tidied = _tidied(value)
            if tidied != (list(value) if isinstance(value, tuple) else value):
                changed[key] = tidied
        if not changed:
            return decision
        shown = ", ".join(f"{key} {arguments[key]!r} -> {value!r}" for key, value in changed.items())
        return Rewrite({**arguments, **changed}, f"tidied {shown}")


@hookimpl
def dsh_setup(runtime: ToolRuntime, config: dict[str, Any]) -> None:
    """Register a :class:`TidyPaths` listener (named ``path-tidier``; the entry-point module itself is ``tidy-paths``)."""
    settings = structure_table(TidySettings, config, "[plugins.tidy-paths]")
    runtime.plugins.register(TidyPaths(settings), name="path-tidier")
