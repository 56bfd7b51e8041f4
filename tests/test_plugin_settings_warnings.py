"""``dsh-tools check`` warns about bundled plugins' settings that load fine and then do nothing.

A tool name that no registered tool answers to (a misspelt deny rule denies
nothing) and a key set while the plugin it belongs to stays off.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from click.testing import CliRunner

from dsh_core import ToolRuntime
from dsh_core._cli import cli
from dsh_core.testing import json_tool, make_runtime
from dsh_plugins import files, ledger, limits, otel, permissions, shell, spill, tool_search, undo

_CHECK_THE_NAME = "(check the name; a prefixed plugin's tools carry the prefix)"


def _diagnostics(runtime: ToolRuntime) -> list[str]:
    """What ``check`` collects: every registered plugin object's ``diagnostics()``."""
    out: list[str] = []
    for plugin in runtime.plugins.get_plugins():
        diagnostics = getattr(plugin, "diagnostics", None)
        if callable(diagnostics) and not isinstance(plugin, type):
            out.extend(str(item) for item in diagnostics())
    return out


def test_a_permissions_rule_whose_tool_matches_no_registered_tool_is_named() -> None:
    runtime = make_runtime(json_tool("calc"), json_tool("read_file"))
    permissions.dsh_setup(
        runtime,
        {
            "rules": [
                {"tool": "cacl", "action": "deny", "reason": "no arithmetic"},
                {"tool": "read_*", "action": "allow"},
                {"tool": "wirte_*", "action": "ask"},
                {"tool": "run_code", "action": "allow"},
            ]
        },
    )
    assert _diagnostics(runtime) == [
        f'permissions rule #1 names "cacl", which matches no registered tool, so it denies nothing {_CHECK_THE_NAME}',
        f'permissions rule #3 names "wirte_*", which matches no registered tool, so it asks about nothing '
        f"{_CHECK_THE_NAME}",
    ]


def test_spill_exempt_tools_names_that_are_not_registered_are_named(tmp_path: Path) -> None:
    runtime = make_runtime(json_tool("read_file"))
    spill.dsh_setup(
        runtime, {"max_inline_bytes": 100, "directory": str(tmp_path), "exempt_tools": ["read_file", "raed_file"]}
    )
    assert _diagnostics(runtime) == [
        f'exempt_tools names "raed_file", which is not a registered tool, so nothing is exempted for it '
        f"{_CHECK_THE_NAME}"
    ]


def test_spills_default_exempt_tools_is_no_warning_without_the_files_plugin(tmp_path: Path) -> None:
    runtime = make_runtime(json_tool("calc"))
    spill.dsh_setup(runtime, {"max_inline_bytes": 100, "directory": str(tmp_path)})
    assert _diagnostics(runtime) == []


def test_ledger_rerun_in_doubt_names_that_are_not_registered_are_named(tmp_path: Path) -> None:
    runtime = make_runtime(json_tool("read_file"))
    ledger.dsh_setup(runtime, {"path": str(tmp_path / "ledger.jsonl"), "rerun_in_doubt": ["read_file", "bsah"]})
    assert _diagnostics(runtime) == [
        f'rerun_in_doubt names "bsah", which is not a registered tool, so a call of that tool in doubt is never '
        f"run again {_CHECK_THE_NAME}"
    ]


def _check(tmp_path: Path, toml: str, *plugins: str) -> str:
    config = tmp_path / "dsh.toml"
    config.write_text(toml)
    loaded = [arg for name in plugins for arg in ("--plugin", f"{name}=dsh_plugins.{name}")]
    result = CliRunner().invoke(cli, ["--config", str(config), "--no-plugins", *loaded, "check"])
    return result.stdout


def test_check_names_a_misspelt_deny_rule_as_it_names_a_misspelt_budget(tmp_path: Path) -> None:
    out = _check(
        tmp_path,
        '[plugins.permissions]\nrules = [ { tool = "cacl", action = "deny", reason = "no arithmetic" } ]\n'
        "[plugins.limits]\nper_tool = { cacl = 1 }\n",
        "permissions",
        "limits",
    )
    assert (
        f'plugin permissions-policy: permissions rule #1 names "cacl", which matches no registered tool, so it '
        f"denies nothing {_CHECK_THE_NAME}" in out
    )
    assert (
        f'plugin call-limits: per_tool names "cacl", which is not a registered tool, so its budget limits nothing '
        f"{_CHECK_THE_NAME}" in out
    )


def _off(module: Any, config: dict[str, Any]) -> list[str]:
    runtime = ToolRuntime()
    module.dsh_setup(runtime, config)
    return _diagnostics(runtime)


def test_keys_of_a_plugin_that_stays_off_are_named_as_having_no_effect() -> None:
    assert _off(spill, {"directory": "spills", "read_tool": False}) == [
        "[plugins.spill].directory has no effect: spilling is off: set max_inline_bytes to turn it on",
        "[plugins.spill].read_tool has no effect: spilling is off: set max_inline_bytes to turn it on",
    ]
    assert _off(undo, {"max_entries": 5}) == [
        "[plugins.undo].max_entries has no effect: the undo log is off: set enabled = true to turn it on"
    ]
    assert _off(undo, {"enabled": False, "max_entries": 5}) == [
        "[plugins.undo].max_entries has no effect: the undo log is off: set enabled = true to turn it on"
    ]
    assert _off(tool_search, {"max_results": 3}) == [
        "[plugins.tool_search].max_results has no effect: tool search is off: set enabled = true to turn it on"
    ]
    assert _off(otel, {"record_content": True}) == [
        "[plugins.otel].record_content has no effect: tracing is off: set enabled = true to turn it on"
    ]
    assert _off(ledger, {"rerun_in_doubt": ["bash"]}) == [
        "[plugins.ledger].rerun_in_doubt has no effect: there is no ledger: set path to keep one"
    ]
    assert _off(files, {"allow_git_writes": True}) == [
        "[plugins.files].allow_git_writes has no effect: no file tool is registered: set root to register them"
    ]
    assert _off(shell, {"timeout_ms": 5000}) == [
        "[plugins.shell].timeout_ms has no effect: no bash tool is registered: set root to register it"
    ]
    assert _off(limits, {"count_sub_calls": False, "per_tool": {}}) == [
        "[plugins.limits].count_sub_calls has no effect: no budget is set: set max_calls or per_tool to limit calls",
        "[plugins.limits].per_tool has no effect: no budget is set: set max_calls or per_tool to limit calls",
    ]


def test_a_plugin_that_stays_off_with_only_its_switch_or_nothing_says_nothing() -> None:
    assert _off(undo, {"enabled": False}) == []
    assert _off(spill, {}) == []
    assert _off(otel, {"enabled": False}) == []
    assert _off(limits, {}) == []


def test_check_warns_about_each_inert_key_and_still_passes(tmp_path: Path) -> None:
    out = _check(
        tmp_path,
        '[plugins.spill]\ndirectory = "spills"\n[plugins.undo]\nmax_entries = 5\n',
        "spill",
        "undo",
    )
    assert (
        "plugin spill-settings: [plugins.spill].directory has no effect: spilling is off: set max_inline_bytes "
        "to turn it on" in out
    )
    assert (
        "plugin undo-settings: [plugins.undo].max_entries has no effect: the undo log is off: set enabled = true "
        "to turn it on" in out
    )
    assert "0 problem(s), 2 warning(s)" in out


def test_names_an_unlisted_mcp_server_may_hold_are_not_called_typos(tmp_path: Path) -> None:
    # A server down while check runs: its tools are unknown, so a rule naming one may be spelt right.
    (tmp_path / "dsh.toml").write_text(
        '[plugins.permissions]\nrules = [{tool = "srv__do", action = "deny"}, {tool = "cacl", action = "deny"}]\n'
        '[plugins.limits]\nper_tool = { "srv__do" = 2 }\n'
        '[[plugins.mcp.servers]]\nname = "srv"\nprefix = "srv"\ncommand = "/nonexistent/dsh-test-server"\n'
    )
    result = CliRunner().invoke(cli, ["--config", str(tmp_path / "dsh.toml"), "check"], catch_exceptions=False)
    unlisted = 'it could not be checked, as MCP server "srv" (whose tools it may name) could not be listed'
    assert f'permissions rule #1 names "srv__do", which matches no registered tool now; {unlisted}' in result.stdout
    assert f'per_tool names "srv__do", which is not a registered tool now; {unlisted}' in result.stdout
    assert result.stdout.count(_CHECK_THE_NAME) == 1  # only cacl, outside the server's prefix
    assert 'permissions rule #2 names "cacl"' in result.stdout


def test_a_server_without_a_prefix_leaves_every_unknown_name_unchecked() -> None:
    class Unlisted:
        def unlisted_servers(self) -> list[tuple[str, str | None]]:
            return [("bare", None)]

    runtime = make_runtime(json_tool("calc"))
    runtime.plugins.register(Unlisted(), name="mcp-client")
    from dsh_plugins._settings_warnings import unknown_tool_warnings

    (warning,) = unknown_tool_warnings(runtime, "per_tool", ["calc", "anything"], "its budget limits nothing")
    assert warning.startswith('per_tool names "anything", which is not a registered tool now; it could not be checked')
    assert 'MCP server "bare"' in warning
