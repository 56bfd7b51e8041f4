"""``tidy-paths``: rewrite untidy relative paths (``./a//b/./c`` becomes ``a/b/c``) before a call runs.

No configuration. Every string under a top-level path-like argument (the keys
of :data:`~dsh_example_policy.workspace.DEFAULT_PATH_KEYS`), or in a list
there, loses its ``./`` segments and repeated slashes. ``..`` segments are kept: removing them could
change which file a path names once symlinks are involved, and judging them is
the workspace guard's job.

It answers with ``Rewrite``, never by editing the arguments, so the whole
pre-execute stage and every guard run again on the tidy path: the workspace
guard judges the path that will be used, and the result tells the model what
was changed.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from typing import Any

from dsh_core import Allow, PreToolDecision, Rewrite, ToolExecution, ToolRuntime, hookimpl

from .workspace import DEFAULT_PATH_KEYS

__all__ = ["TidyPaths", "dsh_setup", "tidy"]

# Capability manifest: it may rewrite the path arguments of any tool.
DSH_CAPABILITIES: dict[str, list[str]] = {"tools": [], "affects": ["*"]}

_REPEATED_SLASHES = re.compile(r"/{2,}")


def tidy(path: str) -> str:
    """``path`` without ``.`` segments or repeated slashes.

    Absolute stays absolute, ``..`` and a trailing slash (a directory) stay, and
    an empty path stays empty: it is the tool's to refuse, not the workspace root.
    """
    if not path:
        return path
    absolute = path.startswith("/")
    parts = [part for part in _REPEATED_SLASHES.sub("/", path).split("/") if part not in ("", ".")]
    tidied = "/".join(parts)
    if not tidied:
        return "/" if absolute else "."
    if path.endswith("/"):
        tidied += "/"
    return "/" + tidied if absolute else tidied


def _tidied(value: object) -> object:
    """``value`` tidied if it is a path or a list of them, else ``value`` itself."""
    if isinstance(value, str):
        return tidy(value)
    if isinstance(value, (list, tuple)):
        return [tidy(item) if isinstance(item, str) else item for item in value]
    return value


class TidyPaths:
    """The ``dsh_pre_execute`` listener; see the module docstring."""

    @hookimpl
    async def dsh_pre_execute(
        self, execution: ToolExecution, next: Callable[[], Awaitable[PreToolDecision]]
    ) -> PreToolDecision:
        decision = await next()
        arguments = execution.arguments
        if not isinstance(decision, Allow) or not isinstance(arguments, dict):
            return decision  # only a call the rest of the stage allows is worth tidying
        changed: dict[str, Any] = {}
        for key in DEFAULT_PATH_KEYS:
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
    runtime.plugins.register(TidyPaths(), name="path-tidier")
