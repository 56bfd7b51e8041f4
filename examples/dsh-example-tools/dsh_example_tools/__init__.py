"""Example tools for dsh-tools, registered by one plugin (entry point ``example-tools``).

Configure it in ``[plugins.example-tools]``::

    [plugins.example-tools]
    root = "."      # the workspace read_file may read (default: the working directory)
"""

from __future__ import annotations

import os
from typing import Any

import attrs

from dsh_core import ConfigError, ToolRuntime, hookimpl, structure_table

from .calc import calc_tool
from .http_status import http_status_tool
from .read_file import read_file_tool

__all__ = ["ExampleToolsSettings", "calc_tool", "dsh_setup", "http_status_tool", "read_file_tool"]

# Capability manifest: what a host running with strict_capabilities lets this plugin do.
DSH_CAPABILITIES: dict[str, list[str]] = {"tools": ["calc", "read_file", "http_status_lookup"], "affects": []}


@attrs.frozen(kw_only=True)
class ExampleToolsSettings:
    """The ``[plugins.example-tools]`` table."""

    root: str | None = None


@hookimpl
def dsh_setup(runtime: ToolRuntime, config: dict[str, Any]) -> None:
    """Register ``calc``, ``read_file`` and ``http_status_lookup`` globally."""
    settings = structure_table(ExampleToolsSettings, config, "[plugins.example-tools]")
    if settings.root is not None and not os.path.isdir(settings.root):
        raise ConfigError([f"[plugins.example-tools].root: {settings.root!r} is not a directory"])
    runtime.register(calc_tool())
    runtime.register(read_file_tool(settings.root))
    runtime.register(http_status_tool())
