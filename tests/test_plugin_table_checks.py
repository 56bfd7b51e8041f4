"""Bundled plugins report every problem of their table at once, each at its key's path.

Also ``dsh_core.TableCheck``, ``check_validator`` and ``keyed_check``, with which
they (and third-party plugins) declare those checks.
"""

from __future__ import annotations

from typing import Annotated, Any

import attrs
import pytest

from dsh_core import ConfigError, TableCheck, ToolRuntime, check_validator, keyed_check, structure_table
from dsh_plugins import files, limits, mcp_client, permissions, shell, spill, timeout, tool_search, undo
from dsh_plugins.mcp_client import McpClientPlugin, McpClientSettings, McpServerSettings


def _violations(module: Any, config: dict[str, Any]) -> tuple[str, ...]:
    with pytest.raises(ConfigError) as caught:
        module.dsh_setup(ToolRuntime(), config)
    return tuple(caught.value.violations)


def test_every_bad_key_of_the_shell_table_is_reported_with_its_key() -> None:
    assert _violations(shell, {"timeout_ms": 0, "max_output_bytes": 1, "kill_grace_ms": -5, "shell": ""}) == (
        "[plugins.shell].timeout_ms: must be from 1 to 2000000000, got 0",
        "[plugins.shell].max_output_bytes: must be at least 2, got 1",
        "[plugins.shell].kill_grace_ms: must be from 0 to 3600000, got -5",
        "[plugins.shell].shell: must name the shell to run (bash by default), got an empty string",
    )


def test_every_problem_of_the_mcp_servers_is_reported_at_once_with_its_path() -> None:
    servers = [
        {"name": "a b", "prefix": "x y", "timeout_ms": -1, "retry_attempts": 0, "command": "true"},
        {"name": "neither_command_nor_url"},
        {"name": "both", "command": "true", "url": "http://127.0.0.1:1/mcp"},
        {"name": "local", "command": "true", "token_env": "TOKEN"},
    ]
    assert _violations(mcp_client, {"servers": servers, "connect_timeout_s": 0}) == (
        "[plugins.mcp].connect_timeout_s: must be a positive number of seconds, got 0",
        "[plugins.mcp].servers[0].name: must be letters, digits, '_' or '-', got 'a b'",
        "[plugins.mcp].servers[0].prefix: must be letters, digits, '_' or '-', got 'x y'",
        "[plugins.mcp].servers[0].timeout_ms: must be a positive number of milliseconds, got -1",
        "[plugins.mcp].servers[0].retry_attempts: must be an integer from 1 to 10, got 0",
        "[plugins.mcp].servers[1]: give exactly one of command (stdio) or url (HTTP)",
        "[plugins.mcp].servers[2]: give exactly one of command (stdio) or url (HTTP)",
        "[plugins.mcp].servers[3].token_env: applies to an HTTP server (url); a stdio server gets its "
        "environment from env",
    )


def test_two_servers_of_one_name_are_reported_at_the_servers_key() -> None:
    servers = [{"name": "a", "command": "true"}, {"name": "a", "command": "false"}]
    assert _violations(mcp_client, {"servers": servers}) == ('[plugins.mcp].servers: two servers are named "a"',)


STDIO_ONLY = "applies to a stdio server (command); an HTTP server (url) is already running"


def test_stdio_keys_on_an_http_server_are_refused_with_their_paths() -> None:
    server = {"name": "web", "url": "http://127.0.0.1:8000/mcp", "args": ["--read-only"], "env": {"M": "r"}, "cwd": "/"}
    with pytest.raises(ConfigError) as caught:
        structure_table(McpClientSettings, {"servers": [server]}, "[plugins.mcp]")
    assert caught.value.violations == (
        f"[plugins.mcp].servers[0].args: {STDIO_ONLY}",
        f"[plugins.mcp].servers[0].env: {STDIO_ONLY}",
        f"[plugins.mcp].servers[0].cwd: {STDIO_ONLY}",
    )
    # The same entry built by a host, without structure_table.
    with pytest.raises(ValueError) as refused:
        McpClientPlugin(ToolRuntime(), McpClientSettings(servers=(McpServerSettings(**server),)))
    assert str(refused.value) == f'MCP server "web": args {STDIO_ONLY}'


def test_a_server_a_host_hands_over_still_needs_neither_command_nor_url() -> None:
    settings = structure_table(McpClientSettings, {"servers": [{"name": "mem"}]}, "[plugins.mcp]")
    assert settings.servers[0].command is None and settings.servers[0].url is None


def test_other_plugin_tables_report_every_bad_key_at_once() -> None:
    assert _violations(spill, {"max_inline_bytes": -1, "directory": "", "exempt_tools": [""]}) == (
        "[plugins.spill].max_inline_bytes: must be a non-negative integer (got -1)",
        "[plugins.spill].directory: must be a non-empty path without NUL characters (got '')",
        "[plugins.spill].exempt_tools: lists tool names; an empty one exempts nothing",
    )
    assert _violations(tool_search, {"enabled": True, "defer": [""], "max_results": 0}) == (
        "[plugins.tool_search].defer: lists tool names or globs; an empty one defers nothing",
        "[plugins.tool_search].max_results: must be an integer from 1 to 50, got 0",
    )
    assert _violations(limits, {"max_calls": -1, "per_tool": {"bash": -2}}) == (
        "[plugins.limits].max_calls: must be a whole number of calls >= 0, got -1",
        "[plugins.limits].per_tool['bash']: must be a whole number of calls >= 0, got -2",
    )
    assert _violations(undo, {"enabled": True, "max_entries": 0}) == (
        "[plugins.undo].max_entries: must be an integer from 1 to 100000, got 0",
    )
    assert _violations(timeout, {"default_ms": 0}) == (
        "[plugins.timeout].default_ms: must be a positive finite number of milliseconds, got 0",
    )


def test_every_bad_key_of_every_permissions_rule_is_reported_at_once() -> None:
    rules = [
        {"tool": "", "action": "deny", "reason": " "},
        {"tool": "x", "action": "ask", "args": {"a..b": "x"}, "paths": {"[": "y"}},
    ]
    assert _violations(permissions, {"rules": rules}) == (
        "[plugins.permissions].rules[0].tool: must be a non-empty glob",
        "[plugins.permissions].rules[0].reason: must be a non-empty text, got ' '; leave it out to have the rule named",
        "[plugins.permissions].rules[1].args: unexpected '.' at position 2 in 'a..b'",
        "[plugins.permissions].rules[1].paths: unclosed '[' at position 0 in '['",
    )


def test_defer_without_enabled_is_reported_at_the_defer_key() -> None:
    assert _violations(tool_search, {"defer": ["x*"]}) == (
        "[plugins.tool_search].defer: needs enabled = true (nothing could find those tools)",
    )


@pytest.mark.parametrize("module", [files, shell], ids=["files", "shell"])
@pytest.mark.parametrize("root", ["", "a\x00b"], ids=["empty", "nul"])
def test_a_root_that_names_no_directory_is_refused(module: Any, root: str) -> None:
    # "" used to mean the working directory: a workspace nobody chose.
    table = "files" if module is files else "shell"
    runtime = ToolRuntime()
    with pytest.raises(ConfigError) as caught:
        module.dsh_setup(runtime, {"root": root})
    assert caught.value.violations == (
        f"[plugins.{table}].root: must be a non-empty path without NUL characters (got {root!r})",
    )
    assert list(runtime.registrations()) == []


# -- the helpers themselves ----------------------------------------------------------------------


def _at_least_one(value: int) -> str | None:
    return None if value >= 1 else f"must be at least 1, got {value}"


def _one_of_a_or_b(item: Item) -> list[tuple[str, str]]:
    out = []
    if (item.a is None) == (item.b is None):
        out.append(("", "give exactly one of a or b"))
    if item.flag and item.b is None:
        out.append(("flag", "goes with b"))
    return out


@attrs.frozen(kw_only=True)
class Item:
    a: str | None = None
    b: str | None = None
    flag: bool = False
    size: Annotated[int, TableCheck(_at_least_one)] = attrs.field(default=1, validator=check_validator(_at_least_one))


@attrs.frozen(kw_only=True)
class Table:
    items: tuple[Annotated[Item, keyed_check(_one_of_a_or_b)], ...] = ()
    count: Annotated[int, TableCheck(_at_least_one)] = attrs.field(default=1, validator=check_validator(_at_least_one))


def test_checks_in_the_types_report_every_problem_with_its_path() -> None:
    data = {"count": 0, "items": [{"a": "x", "size": 0}, {}, {"a": "x", "flag": True}, {"b": "y", "flag": True}]}
    with pytest.raises(ConfigError) as caught:
        structure_table(Table, data, "[plugins.x]")
    assert caught.value.violations == (
        "[plugins.x].items[0].size: must be at least 1, got 0",
        "[plugins.x].items[1]: give exactly one of a or b",
        "[plugins.x].items[2].flag: goes with b",
        "[plugins.x].count: must be at least 1, got 0",
    )
    assert structure_table(Table, {"items": [{"b": "y", "flag": True}]}, "[plugins.x]") == Table(
        items=(Item(b="y", flag=True),)
    )


def test_check_validator_refuses_the_same_value_when_a_host_builds_the_class() -> None:
    with pytest.raises(ValueError, match=r"^size must be at least 1, got 0$"):
        Item(size=0)
    assert Item(size=2).size == 2


def test_a_timeout_default_over_the_maximum_reads_after_its_key() -> None:
    (violation,) = _violations(timeout, {"default_ms": 99_999_999_999})
    assert violation == (
        "[plugins.timeout].default_ms: 99999999999 ms exceeds the timeout policy's maximum of 2147483647 ms "
        "(about 24.8 days); declare no timeout instead of a huge one"
    )
    with pytest.raises(ValueError, match=r"^default_ms 99999999999 ms exceeds the timeout policy's maximum"):
        timeout.TimeoutSettings(default_ms=99_999_999_999)


def _raises(value: str) -> str | None:
    int(value)  # a check calling something that raises on a bad value
    return None


def _says_false(value: int) -> str | None:
    return value > 0 and "must be at most 0"  # type: ignore[return-value]  # False for 0: a wrong return type


@attrs.frozen(kw_only=True)
class _Odd:
    port: Annotated[str, TableCheck(_raises)] = "1"
    size: Annotated[int, TableCheck(_says_false)] = 0


def test_a_check_that_raises_or_returns_no_str_is_reported_with_its_value_path() -> None:
    with pytest.raises(ConfigError) as caught:
        structure_table(_Odd, {"port": "eighty", "size": 0}, "[plugins.odd]")
    assert caught.value.violations == (
        "[plugins.odd].port: the check _raises failed on this value: ValueError: invalid literal for int() "
        "with base 10: 'eighty'",
        "[plugins.odd].size: the check _says_false returned False; a check returns the problem as a str, or None",
    )


def test_check_validator_refuses_a_check_returning_no_str() -> None:
    @attrs.frozen
    class Hand:
        size: int = attrs.field(validator=check_validator(_says_false))

    with pytest.raises(TypeError, match=r"^the check of size returned False; a check returns a str or None$"):
        Hand(0)
    with pytest.raises(ValueError, match=r"^size must be at most 0$"):
        Hand(1)


def test_keyed_validator_refuses_what_keyed_check_refuses_when_a_host_builds_the_class() -> None:
    from dsh_core import keyed_validator

    @attrs.frozen(kw_only=True)
    class HandItem:
        a: str | None = None
        b: str | None = None
        flag: bool = False

        def __attrs_post_init__(self) -> None:
            keyed_validator(_one_of_a_or_b)(self)  # type: ignore[arg-type]  # same fields as Item

    with pytest.raises(ValueError, match=r"^give exactly one of a or b; flag goes with b$"):
        HandItem(flag=True)
    assert HandItem(b="y", flag=True).b == "y"

    def many(value: object) -> list[tuple[str, str]]:
        return [(f"k{index}", "is wrong") for index in range(50)]

    with pytest.raises(ValueError) as caught:
        keyed_validator(many)(object())
    assert str(caught.value).endswith("k19 is wrong; … and 30 more")
