"""What ``dsh-tools check`` says about a bundled plugin's own settings that the table's types cannot catch.

Two kinds of mistake load without a problem and then quietly do nothing:

* a setting that names a tool no plugin registered (``[plugins.limits]
  per_tool``, a ``[plugins.permissions]`` rule's ``tool``, ``[plugins.spill]
  exempt_tools``, ``[plugins.ledger] rerun_in_doubt``): a misspelt name limits,
  denies or exempts nothing while the tool it was meant for runs as if unnamed;
* a key set while the key that turns the plugin on is missing (``directory``
  without ``max_inline_bytes``, say): the plugin stays off and the key with it.

Both are warnings, not problems: a tool may come from a plugin this ``check``
did not load, and a table may be kept ready with the plugin switched off.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable, Mapping

from dsh_core import RUN_CODE_NAME, ToolRuntime

__all__ = ["SettingsWarnings", "no_effect", "register_settings_warnings", "report_inert_keys", "unknown_tool_warnings"]


def unknown_tool_warnings(
    runtime: ToolRuntime, setting: str, names: Iterable[str], consequence: str, *, globs: bool = False
) -> list[str]:
    """One warning per name in ``names`` that no registered tool (nor ``run_code``) answers to.

    ``setting`` says where the name is written (``per_tool``), ``consequence``
    what the mistake costs (``its budget limits nothing``). With ``globs`` each
    name is an :func:`fnmatch.fnmatchcase` pattern, as the setting reads it.
    """
    known = {definition.name for _, definition in runtime.registrations()} | {RUN_CODE_NAME}
    unlisted = _unlisted_servers(runtime)
    out = []
    for name in names:
        if globs:
            if any(fnmatch.fnmatchcase(tool, name) for tool in known):
                continue
            what = "which matches no registered tool"
        elif name in known:
            continue
        else:
            what = "which is not a registered tool"
        server = next((server for server, prefix in unlisted if not prefix or name.startswith(f"{prefix}__")), None)
        if server is not None:
            # Spelt right, perhaps: the tool may be the server's, and the server is down. No typo hint.
            out.append(
                f'{setting} names "{name}", {what} now; it could not be checked, as MCP server "{server}" '
                "(whose tools it may name) could not be listed"
            )
            continue
        out.append(
            f'{setting} names "{name}", {what}, so {consequence} '
            "(check the name; a prefixed plugin's tools carry the prefix)"
        )
    return out


def _unlisted_servers(runtime: ToolRuntime) -> list[tuple[str, str | None]]:
    """``(name, prefix)`` of the MCP servers that could not be listed (their tools' names are unknown)."""
    unlisted = getattr(runtime.plugins.get_plugin("mcp-client"), "unlisted_servers", None)
    return list(unlisted()) if callable(unlisted) else []


def no_effect(table: str, key: str, why: str) -> str:
    """The warning for ``key`` of ``[plugins.<table>]`` set where it cannot take effect."""
    return f"[plugins.{table}].{key} has no effect: {why}"


class SettingsWarnings:
    """A plugin object with only ``diagnostics``: registered for a plugin whose own object may not exist.

    A plugin that stays off (no ``max_inline_bytes``, no ``path``) registers
    nothing else, so this is where ``check`` finds what its table got wrong.
    ``warnings`` is called when ``check`` asks, after every plugin registered
    its tools.
    """

    def __init__(self, warnings: Callable[[], list[str]]) -> None:
        self._warnings = warnings

    def diagnostics(self) -> list[str]:
        return self._warnings()


def register_settings_warnings(runtime: ToolRuntime, name: str, warnings: Callable[[], list[str]]) -> None:
    """Register a :class:`SettingsWarnings` as ``<name>-settings`` (``name``: the plugin's entry-point name)."""
    runtime.plugins.register(SettingsWarnings(warnings), name=f"{name}-settings")


def report_inert_keys(runtime: ToolRuntime, table: str, config: Mapping[str, object], switch: str, why: str) -> None:
    """For a plugin that stays off: warn about every key of its table but ``switch``, the one that turns it on.

    ``why`` says what is off and what turns it on (``spilling is off: set
    max_inline_bytes``). Nothing is registered when no other key is set.
    """
    warnings = [no_effect(table, key, why) for key in config if key != switch]
    if warnings:
        register_settings_warnings(runtime, table, lambda: warnings)
