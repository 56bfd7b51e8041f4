"""Configuration: strict structuring of plugin tables and the dsh.toml / [tool.dsh] lookup."""

from __future__ import annotations

import collections.abc
import typing
from pathlib import Path
from typing import Any, Literal

import attrs
import pytest

from dsh_core import ConfigError
from dsh_core._config import CodeRuntimeSettings, DshConfig, load_config, structure_table


@attrs.frozen
class Rule:
    tool: str
    action: Literal["allow", "deny", "ask"]


@attrs.frozen
class Limits:
    calls: int = 10


@attrs.frozen
class PermissionsSettings:
    rules: list[Rule] = attrs.field(factory=list)
    ratio: float = 1.0
    verbose: bool = False
    limits: Limits | None = None
    weights: dict[str, int] = attrs.field(factory=dict)
    tags: tuple[str, ...] = ()
    note: str | None = None


def violations(cls: type, data: object, where: str = "[plugins.permissions]") -> tuple[str, ...]:
    with pytest.raises(ConfigError) as info:
        structure_table(cls, data, where)
    return info.value.violations


# -- structure_table ---------------------------------------------------------------


def test_structure_table_builds_nested_classes() -> None:
    data = {
        "rules": [{"tool": "shell", "action": "ask"}],
        "ratio": 0.5,
        "verbose": True,
        "limits": {"calls": 3},
        "weights": {"a": 1},
        "tags": ["x", "y"],
    }
    settings = structure_table(PermissionsSettings, data, "[plugins.permissions]")
    assert settings == PermissionsSettings(
        rules=[Rule("shell", "ask")], ratio=0.5, verbose=True, limits=Limits(3), weights={"a": 1}, tags=("x", "y")
    )


def test_structure_table_defaults_for_an_empty_table() -> None:
    assert structure_table(PermissionsSettings, {}, "[plugins.permissions]") == PermissionsSettings()


def test_int_is_accepted_for_a_float_field() -> None:
    settings = structure_table(PermissionsSettings, {"ratio": 2}, "[plugins.permissions]")
    assert settings.ratio == 2.0
    assert type(settings.ratio) is float


def test_the_documented_message_shape() -> None:
    data = {
        "rules": [{"tool": "a", "action": "allow"}, {"tool": "b", "action": "deny"}, {"tool": "c", "action": "maybe"}]
    }
    assert violations(PermissionsSettings, data) == (
        '[plugins.permissions].rules[2].action: expected one of allow/deny/ask, got "maybe"',
    )


def test_every_problem_is_listed_at_once_with_its_path() -> None:
    data = {
        "rules": [{"tool": 1, "action": "allow"}, {"action": "ask", "extra": True}, "shell"],
        "ratio": "1.5",
        "verbose": 1,
        "limits": {"calls": "3"},
        "weights": {"a": True},
        "tags": "x",
        "bogus": 1,
    }
    assert set(violations(PermissionsSettings, data)) == {
        "[plugins.permissions].rules[0].tool: expected a string, got 1",
        "[plugins.permissions].rules[1].tool: missing required key",
        '[plugins.permissions].rules[1]: unknown key "extra" (allowed: tool, action)',
        '[plugins.permissions].rules[2]: expected a table, got "shell"',
        '[plugins.permissions].ratio: expected a number, got "1.5"',
        "[plugins.permissions].verbose: expected a boolean (true or false), got 1",
        '[plugins.permissions].limits.calls: expected an integer, got "3"',
        "[plugins.permissions].weights['a']: expected an integer, got true",
        '[plugins.permissions].tags: expected an array, got "x"',
        '[plugins.permissions]: unknown key "bogus" (allowed: rules, ratio, verbose, limits, weights, tags, note)',
    }


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("ratio", True),  # a bool is not a number
        ("ratio", "1"),
        ("verbose", "true"),
        ("verbose", 0),
        ("note", 3),
        ("note", ["a"]),
        ("tags", ["a", 1]),
        ("rules", {"tool": "a", "action": "allow"}),  # a table is not an array of tables
    ],
)
def test_nothing_is_coerced(field: str, value: object) -> None:
    problems = violations(PermissionsSettings, {field: value})
    assert len(problems) == 1
    assert problems[0].startswith(f"[plugins.permissions].{field}")


def test_literal_membership_is_type_strict() -> None:
    @attrs.frozen
    class Level:
        level: Literal[1, 2]

    assert structure_table(Level, {"level": 2}, "[x]") == Level(2)
    assert violations(Level, {"level": True}, "[x]") == ("[x].level: expected one of 1/2, got true",)


def test_a_non_table_is_refused() -> None:
    assert violations(PermissionsSettings, ["a"]) == ("[plugins.permissions]: expected a table, got an array",)


def test_an_attrs_validator_failure_is_reported() -> None:
    @attrs.frozen
    class Positive:
        n: int = attrs.field(validator=attrs.validators.gt(0))

    (problem,) = violations(Positive, {"n": -1}, "[plugins.p]")
    assert problem.startswith("[plugins.p]: invalid value (")
    assert "-1" in problem


def test_an_empty_where_gives_bare_paths() -> None:
    assert violations(PermissionsSettings, {"ratio": "x"}, "") == ('ratio: expected a number, got "x"',)


def test_union_of_scalars_takes_the_first_matching_member() -> None:
    @attrs.frozen
    class Either:
        value: int | str

    assert structure_table(Either, {"value": "a"}, "[e]").value == "a"
    assert structure_table(Either, {"value": 3}, "[e]").value == 3
    assert violations(Either, {"value": 1.5}, "[e]") == ("[e].value: expected an integer or a string, got 1.5",)


def test_any_fields_pass_values_through() -> None:
    @attrs.frozen
    class Loose:
        anything: Any = None

    assert structure_table(Loose, {"anything": {"deep": [1]}}, "[l]").anything == {"deep": [1]}


def holding(annotation: object) -> type:
    """An attrs class whose one field ``v`` is annotated ``annotation``."""
    return attrs.make_class("Holder", {"v": attrs.field(type=annotation)}, frozen=True)


ARRAY_TYPES = [
    list,
    list[str],
    typing.List,  # noqa: UP006 - the typing spelling must be checked too
    tuple,
    tuple[str, ...],
    tuple[str, str],
    collections.abc.Sequence[str],
    collections.abc.MutableSequence[str],
    set,
    set[str],
    frozenset,
    frozenset[str],
    typing.AbstractSet[str],
    collections.abc.MutableSet[str],
]


@pytest.mark.parametrize("annotation", ARRAY_TYPES, ids=str)
@pytest.mark.parametrize(("value", "shown"), [("ab", '"ab"'), ({"a": 1}, "a table")], ids=["string", "table"])
def test_an_array_field_takes_only_an_array(annotation: object, value: object, shown: str) -> None:
    # Not a string's characters, not a table's keys: every array type, bare or parametrised.
    assert violations(holding(annotation), {"v": value}, "[x]") == (f"[x].v: expected an array, got {shown}",)


@pytest.mark.parametrize(
    ("annotation", "value", "expected"),
    [
        (list, ["a", 1], ["a", 1]),
        (set[int], [1, 2, 2], {1, 2}),
        (frozenset[str], ["a", "b"], frozenset({"a", "b"})),
        (frozenset, [1, "a"], frozenset({1, "a"})),
        (typing.AbstractSet[str], ["a"], frozenset({"a"})),
        (tuple, ["a", 1], ("a", 1)),
        (tuple[str, int], ["a", 1], ("a", 1)),
        (collections.abc.Sequence[int], [1], (1,)),
    ],
    ids=str,
)
def test_an_array_structures_into_its_fields_container(annotation: object, value: object, expected: object) -> None:
    structured = structure_table(holding(annotation), {"v": value}, "[x]").v
    assert structured == expected and type(structured) is type(expected)


def test_an_array_for_a_set_is_checked_item_by_item() -> None:
    assert violations(holding(set[int]), {"v": [1, "2", True]}, "[x]") == (
        '[x].v[1]: expected an integer, got "2"',
        "[x].v[2]: expected an integer, got true",
    )
    assert violations(holding(set), {"v": ["a", ["b"]]}, "[x]") == (
        "[x].v: expected an array of strings, numbers, booleans or dates (a set holds no arrays or tables),"
        " got an array in it",
    )


def test_a_fixed_length_array_has_that_many_items() -> None:
    assert violations(holding(tuple[str, int]), {"v": ["a"]}, "[x]") == ("[x].v: expected 2 items, got 1",)
    assert violations(holding(tuple[str, int]), {"v": ["a", "b"]}, "[x]") == (
        '[x].v[1]: expected an integer, got "b"',
    )


@pytest.mark.parametrize("annotation", [dict, collections.abc.Mapping, dict[str, int]], ids=str)
def test_a_table_field_takes_only_a_table(annotation: object) -> None:
    assert violations(holding(annotation), {"v": [1]}, "[x]") == ("[x].v: expected a table, got an array",)


@attrs.frozen
class Aliased:
    _token_env: str = "TOKEN"  # attrs alias: token_env
    retries: int = attrs.field(default=1, alias="max_retries")
    limit: int = 1


def test_keys_are_the_attribute_aliases_the_class_takes() -> None:
    # The unknown-key message lists aliases; the keys accepted and the paths shown are the same ones.
    assert structure_table(Aliased, {"token_env": "X", "max_retries": 3}, "[x]") == Aliased(
        token_env="X", max_retries=3
    )
    assert violations(Aliased, {"_token_env": "X", "retries": 3}, "[x]") == (
        '[x]: unknown keys "_token_env", "retries" (allowed: token_env, max_retries, limit)',
    )
    assert violations(Aliased, {"token_env": 1, "max_retries": "3", "limit": "2"}, "[x]") == (
        "[x].token_env: expected a string, got 1",
        '[x].max_retries: expected an integer, got "3"',
        '[x].limit: expected an integer, got "2"',
    )


def test_a_missing_aliased_key_is_reported_by_its_alias() -> None:
    @attrs.frozen
    class Needs:
        _secret: str

    assert violations(Needs, {}, "[x]") == ("[x].secret: missing required key",)


# -- DshConfig ---------------------------------------------------------------------


def test_defaults() -> None:
    config = DshConfig()
    assert (config.mode, config.disabled_plugins, config.strict_capabilities, config.session_log) == (
        "native",
        (),
        False,
        None,
    )
    assert dict(config.plugins) == {}


def test_plugin_config_is_a_fresh_plain_dict() -> None:
    config = DshConfig(plugins={"p": {"rules": [{"a": 1}]}})
    first = config.plugin_config("p")
    assert type(first) is dict and first == {"rules": [{"a": 1}]}
    first["rules"][0]["a"] = 2
    assert config.plugin_config("p") == {"rules": [{"a": 1}]}
    assert config.plugin_config("absent") == {}


@pytest.mark.parametrize(
    ("plugins", "message"),
    [
        ({1: {}}, "DshConfig.plugins: a plugin name must be a non-empty str, got 1"),
        ({"": {}}, "DshConfig.plugins: a plugin name must be a non-empty str, got ''"),
        ({"p": {1: True}}, "DshConfig.plugins.p: a key must be a str, got 1"),
        ({"p": 1}, "DshConfig.plugins.p must be a table (a mapping), got int"),
        ([("p", {})], "DshConfig.plugins must map plugin names to tables, got list"),
    ],
)
def test_plugins_keys_must_be_plugin_names_and_str(plugins: Any, message: str) -> None:
    with pytest.raises(TypeError) as info:
        DshConfig(plugins=plugins)
    assert str(info.value) == message


@attrs.frozen(kw_only=True)
class _Durations:
    timeout_s: float = 1.0
    limit: float | None = None


@pytest.mark.parametrize("literal", ["nan", "+nan", "-nan", "inf", "+inf", "-inf"])
def test_toml_nan_and_inf_are_refused_for_a_float_field(tmp_path: Path, literal: str) -> None:
    (tmp_path / "dsh.toml").write_text(f"[plugins.p]\ntimeout_s = {literal}\nlimit = {literal}\n")
    table = load_config(cwd=tmp_path).plugin_config("p")
    with pytest.raises(ConfigError) as info:
        structure_table(_Durations, table, "[plugins.p]")
    shown = repr(table["timeout_s"])
    expected = f"expected a finite number (TOML's nan and inf are not), got {shown}"
    assert info.value.violations == (f"[plugins.p].timeout_s: {expected}", f"[plugins.p].limit: {expected}")


def test_plugins_mapping_is_read_only() -> None:
    config = DshConfig(plugins={"p": {}})
    with pytest.raises(TypeError):
        config.plugins["q"] = {}  # type: ignore[index]


def test_config_is_hashable_and_frozen() -> None:
    config = DshConfig(mode="code")
    hash(config)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        config.mode = "native"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"mode": "fast"}, "DshConfig.mode must be one of 'both', 'code', 'native', got 'fast'"),
        ({"disabled_plugins": "timeout"}, "DshConfig.disabled_plugins must be a list of plugin names, got str"),
        ({"disabled_plugins": ["timeout", 3]}, "DshConfig.disabled_plugins lists plugin names (non-empty str), got 3"),
        ({"strict_capabilities": "yes"}, "DshConfig.strict_capabilities must be a bool, got str"),
        ({"session_log": Path("log.jsonl")}, "DshConfig.session_log must be a str or None, got PosixPath"),
        ({"code_runtime": {"max_cpu_s": 1}}, "DshConfig.code_runtime must be a CodeRuntimeSettings, got dict"),
        ({"code_runtime": None}, "DshConfig.code_runtime must be a CodeRuntimeSettings, got NoneType"),
    ],
    ids=["mode", "names-as-str", "a-non-name", "strict", "session-log", "code-runtime-dict", "code-runtime-none"],
)
def test_a_host_building_settings_gets_the_same_checks_as_a_file(settings: dict[str, Any], message: str) -> None:
    with pytest.raises((TypeError, ValueError)) as raised:
        DshConfig(**settings)
    assert str(raised.value) == message


@pytest.mark.parametrize(("text", "shown"), [('""', '""'), ('"calls\\u0000.jsonl"', '"calls\\u0000.jsonl"')])
def test_session_log_must_be_a_usable_path(tmp_path: Path, text: str, shown: str) -> None:
    # Accepted here, either would fail only when a command opens the log (a NUL as a traceback).
    (tmp_path / "dsh.toml").write_text(f"session_log = {text}\n")
    with pytest.raises(ConfigError) as info:
        load_config(cwd=tmp_path)
    assert info.value.violations == (
        f"{tmp_path / 'dsh.toml'}: session_log: expected a non-empty path without NUL characters, got {shown}",
    )


@pytest.mark.parametrize("value", ["", "calls\x00.jsonl"])
def test_a_host_gets_the_same_session_log_check(value: str) -> None:
    with pytest.raises(ValueError) as raised:
        DshConfig(session_log=value)
    assert str(raised.value).startswith("DshConfig.session_log: expected a non-empty path without NUL characters, got ")


def test_disabled_plugins_may_be_given_as_a_list() -> None:
    assert DshConfig(disabled_plugins=["timeout"]).disabled_plugins == ("timeout",)


# -- load_config -------------------------------------------------------------------

FULL = """
mode = "both"
disabled_plugins = ["timeout"]
strict_capabilities = true
session_log = "logs/session.jsonl"

[plugins.permissions]
rules = [{ tool = "shell", action = "ask" }]
"""


def test_load_dsh_toml(tmp_path: Path) -> None:
    (tmp_path / "dsh.toml").write_text(FULL)
    config = load_config(cwd=tmp_path)
    assert config.mode == "both"
    assert config.disabled_plugins == ("timeout",)
    assert config.strict_capabilities is True
    assert config.session_log == str(tmp_path / "logs" / "session.jsonl")
    assert config.plugin_config("permissions") == {"rules": [{"tool": "shell", "action": "ask"}]}


def test_explicit_path_wins_over_discovery(tmp_path: Path) -> None:
    (tmp_path / "dsh.toml").write_text('mode = "code"\n')
    (tmp_path / "other.toml").write_text('mode = "both"\n')
    assert load_config("other.toml", cwd=tmp_path).mode == "both"
    assert load_config(tmp_path / "other.toml").mode == "both"


def test_dsh_toml_wins_over_pyproject(tmp_path: Path) -> None:
    (tmp_path / "dsh.toml").write_text('mode = "code"\n')
    (tmp_path / "pyproject.toml").write_text('[tool.dsh]\nmode = "both"\n')
    assert load_config(cwd=tmp_path).mode == "code"


def test_pyproject_tool_dsh_is_used_without_dsh_toml(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\n\n[tool.dsh]\nmode = "both"\n\n[tool.dsh.plugins.audit]\npath = "a.log"\n'
    )
    config = load_config(cwd=tmp_path)
    assert config.mode == "both"
    assert config.plugin_config("audit") == {"path": str(tmp_path / "a.log")}


def test_pyproject_found_by_the_lookup_names_the_dsh_toml_that_would_replace_it(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[tool.dsh]\nmode = "both"\n')
    config = load_config(cwd=tmp_path)
    assert config.source == str(tmp_path / "pyproject.toml")
    assert config.preferred_paths == (str(tmp_path / "dsh.toml"),)
    # Read first, or named explicitly, nothing would replace the file.
    assert load_config(tmp_path / "pyproject.toml").preferred_paths == ()
    (tmp_path / "dsh.toml").write_text('mode = "code"\n')
    assert load_config(cwd=tmp_path).preferred_paths == ()


@pytest.mark.parametrize("name", ["dsh.toml", "pyproject.toml"])
def test_a_dangling_symlink_in_the_lookup_is_an_error_not_skipped(tmp_path: Path, name: str) -> None:
    # A shared policy on an unmounted path: running with the defaults would drop the policy silently.
    (tmp_path / name).symlink_to(tmp_path / "unmounted" / "dsh.toml")
    with pytest.raises(ConfigError) as caught:
        load_config(cwd=tmp_path)
    assert caught.value.violations == (
        f"{tmp_path / name}: is a symbolic link to {tmp_path / 'unmounted' / 'dsh.toml'}, which does not exist",
    )


@pytest.mark.parametrize("name", ["dsh.toml", "pyproject.toml"])
def test_a_directory_in_the_lookup_is_an_error_not_skipped(tmp_path: Path, name: str) -> None:
    (tmp_path / name).mkdir()
    with pytest.raises(ConfigError) as caught:
        load_config(cwd=tmp_path)
    assert caught.value.violations == (f"{tmp_path / name}: is a directory, not a configuration file",)


def test_pyproject_without_tool_dsh_gives_defaults(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    assert load_config(cwd=tmp_path) == DshConfig()


def test_no_file_gives_defaults(tmp_path: Path) -> None:
    assert load_config(cwd=tmp_path) == DshConfig()


def test_cwd_defaults_to_the_current_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "dsh.toml").write_text('mode = "code"\n')
    monkeypatch.chdir(tmp_path)
    assert load_config().mode == "code"


def test_missing_explicit_path_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="configuration file not found") as info:
        load_config(tmp_path / "nope.toml")
    assert str(tmp_path / "nope.toml") in str(info.value)


def test_toml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "dsh.toml").write_text('mode = "native"\n\nstrict_capabilities = = true\n')
    with pytest.raises(ConfigError) as info:
        load_config(cwd=tmp_path)
    (problem,) = info.value.violations
    assert problem.startswith(f"{tmp_path / 'dsh.toml'}: invalid TOML: ")
    assert "line 3" in problem


def test_bad_settings_are_all_reported_with_the_file(tmp_path: Path) -> None:
    (tmp_path / "dsh.toml").write_text(
        'mode = "fast"\ndisabled_plugins = "timeout"\nstrict_capabilities = "yes"\ncolour = 1\nplugins = 3\n'
    )
    with pytest.raises(ConfigError) as info:
        load_config(cwd=tmp_path)
    prefix = f"{tmp_path / 'dsh.toml'}: "
    assert set(info.value.violations) == {
        prefix + 'mode: expected one of native/code/both, got "fast"',
        prefix + 'disabled_plugins: expected an array, got "timeout"',
        prefix + 'strict_capabilities: expected a boolean (true or false), got "yes"',
        prefix + "plugins: expected a table, got 3",
        prefix
        + 'unknown key "colour" (allowed: mode, disabled_plugins, strict_capabilities, plugins, session_log, '
        "code_runtime, tool_prefixes)",
    }


def test_an_empty_disabled_plugin_name_is_reported_with_the_file(tmp_path: Path) -> None:
    (tmp_path / "dsh.toml").write_text('disabled_plugins = ["timeout", ""]\n')
    with pytest.raises(ConfigError) as info:
        load_config(cwd=tmp_path)
    assert info.value.violations == (
        f"{tmp_path / 'dsh.toml'}: disabled_plugins[1]: expected a plugin name, got an empty string",
    )


def test_pyproject_paths_are_qualified_with_tool_dsh(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.dsh]\nmode = 1\n\n[tool.dsh.plugins]\naudit = 2\n")
    with pytest.raises(ConfigError) as info:
        load_config(cwd=tmp_path)
    prefix = f"{tmp_path / 'pyproject.toml'}: [tool.dsh]"
    assert set(info.value.violations) == {
        prefix + ".mode: expected one of native/code/both, got 1",
        prefix + ".plugins['audit']: expected a table, got 2",
    }


def test_config_error_carries_its_code(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "missing.toml")
    assert info.value.code == "CONFIG_ERROR"
    assert str(info.value).startswith("invalid configuration: ")


def test_code_runtime_settings_are_read_and_checked(tmp_path: Path) -> None:
    (tmp_path / "dsh.toml").write_text(
        "[code_runtime]\nwall_budget_s = 10\nmax_memory_bytes = 536870912\nallow_subprocesses = false\n"
    )
    config = load_config(cwd=tmp_path)
    assert config.code_runtime.options() == {
        "wall_budget_s": 10,
        "max_memory_bytes": 536870912,
        "allow_subprocesses": False,
    }
    (tmp_path / "dsh.toml").write_text("[code_runtime]\nmax_memory = 5\n")
    with pytest.raises(ConfigError, match=r'code_runtime: unknown key "max_memory"|code_runtime.*max_memory'):
        load_config(cwd=tmp_path)
    (tmp_path / "empty").mkdir()
    assert load_config(cwd=tmp_path / "empty").code_runtime.options() == {}


def test_tool_prefixes_are_read_and_checked(tmp_path: Path) -> None:
    (tmp_path / "dsh.toml").write_text('[tool_prefixes]\nweather = "wx"\n')
    assert dict(load_config(cwd=tmp_path).tool_prefixes) == {"weather": "wx"}
    (tmp_path / "dsh.toml").write_text('[tool_prefixes]\nweather = "w x"\n')
    with pytest.raises(ConfigError) as info:
        load_config(cwd=tmp_path)
    assert info.value.violations == (
        f"{tmp_path / 'dsh.toml'}: tool_prefixes['weather']: a prefix is 1-32 letters, digits, '_' or '-', got \"w x\"",
    )
    (tmp_path / "dsh.toml").write_text("[tool_prefixes]\nweather = 3\n")
    with pytest.raises(ConfigError, match="tool_prefixes"):
        load_config(cwd=tmp_path)
    # "$" matched before a final newline: "ab\n" was taken, and every tool was named "ab\n__...".
    (tmp_path / "dsh.toml").write_text('[tool_prefixes]\nweather = "ab\\n"\n')
    with pytest.raises(ConfigError, match=r"tool_prefixes\['weather'\]: a prefix is 1-32 letters"):
        load_config(cwd=tmp_path)
    with pytest.raises((ConfigError, ValueError), match="a prefix is 1-32 letters"):
        DshConfig(tool_prefixes={"weather": "ab\n"})


def test_every_problem_of_a_file_is_reported_in_one_pass(tmp_path: Path) -> None:
    # Type errors, value checks and [code_runtime] limits, whatever the mode: all at once.
    (tmp_path / "dsh.toml").write_text(
        'mode = "fast"\ndisabled_plugins = [""]\n'
        '[tool_prefixes]\nweather = "w x"\n'
        "[code_runtime]\nwall_budget_s = -1\nmax_memory_bytes = 1\nmax_output_bytes = 2\nmax_cpu_s = 0\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config(cwd=tmp_path)
    prefix = f"{tmp_path / 'dsh.toml'}: "
    assert set(info.value.violations) == {
        prefix + 'mode: expected one of native/code/both, got "fast"',
        prefix + "disabled_plugins[0]: expected a plugin name, got an empty string",
        prefix + "tool_prefixes['weather']: a prefix is 1-32 letters, digits, '_' or '-', got \"w x\"",
        prefix + "code_runtime.wall_budget_s: expected a positive number of seconds, got -1",
        prefix + "code_runtime.max_memory_bytes: expected at least 16777216 (16 MiB; the value is in bytes), got 1",
        prefix + "code_runtime.max_output_bytes: expected at least 4 (bytes), got 2",
        prefix + "code_runtime.max_cpu_s: expected a positive integer, got 0",
    }


def test_a_host_building_code_runtime_settings_gets_the_same_checks() -> None:
    with pytest.raises(ValueError, match=r"CodeRuntimeSettings.max_memory_bytes: expected at least 16777216"):
        CodeRuntimeSettings(max_memory_bytes=1)
    assert CodeRuntimeSettings(wall_budget_s=0.5, max_memory_bytes=1 << 30).options() == {
        "wall_budget_s": 0.5,
        "max_memory_bytes": 1 << 30,
    }


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"max_cpu_s": True}, "CodeRuntimeSettings.max_cpu_s: expected an integer, got True"),
        ({"max_output_bytes": "5"}, "CodeRuntimeSettings.max_output_bytes: expected an integer, got '5'"),
        ({"wall_budget_s": "1"}, "CodeRuntimeSettings.wall_budget_s: expected a number, got '1'"),
        ({"allow_network": 1}, "CodeRuntimeSettings.allow_network: expected true or false, got 1"),
    ],
)
def test_a_host_building_code_runtime_settings_gets_the_types_checked(options: dict[str, Any], message: str) -> None:
    """True passed as a count and 1 as a flag until Code Mode was on; "5" failed with a bare TypeError."""
    with pytest.raises(ValueError) as refused:
        CodeRuntimeSettings(**options)
    assert str(refused.value) == message


def test_an_empty_plugin_table_name_is_reported_with_the_other_problems(tmp_path: Path) -> None:
    """It read "DshConfig.plugins: ..." (a class, not the file's key) and only once the rest was right."""
    (tmp_path / "dsh.toml").write_text('mode = "x"\n[plugins.""]\na = 1\n')
    with pytest.raises(ConfigError) as refused:
        load_config(cwd=tmp_path)
    where = f"{tmp_path / 'dsh.toml'}: "
    assert set(refused.value.violations) == {
        where + 'mode: expected one of native/code/both, got "x"',
        where + "plugins['']: expected a plugin name, got an empty string",
    }


def test_a_derived_field_is_not_listed_as_an_allowed_key() -> None:
    @attrs.frozen
    class Settings:
        pattern: str = "x"
        compiled: object = attrs.field(init=False, default=None)

    with pytest.raises(ConfigError) as refused:
        structure_table(Settings, {"compiled": 1}, where="[plugins.x]")
    assert refused.value.violations == ('[plugins.x]: unknown key "compiled" (allowed: pattern)',)


def test_a_removed_working_directory_is_named_and_an_absolute_config_needs_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "dsh.toml").write_text('mode = "native"\n')
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    assert load_config(tmp_path / "dsh.toml").mode == "native"
    with pytest.raises(ConfigError, match=r"the current directory cannot be read .*: it may have been removed"):
        load_config()


@pytest.mark.parametrize("key", ["max_memory_bytes", "max_cpu_s", "max_file_bytes"])
def test_a_resource_limit_beyond_what_the_system_takes_is_refused_at_load(tmp_path: Path, key: str) -> None:
    # setrlimit takes a signed 64-bit count; a larger one used to pass here and fail every run_code.
    (tmp_path / "dsh.toml").write_text(f"[code_runtime]\n{key} = 99999999999999999999999\n")
    with pytest.raises(ConfigError) as info:
        load_config(cwd=tmp_path)
    assert info.value.violations == (
        f"{tmp_path / 'dsh.toml'}: code_runtime.{key}: expected at most 9223372036854775806"
        " (the largest resource limit), got 99999999999999999999999",
    )
    with pytest.raises(ValueError, match=rf"^CodeRuntimeSettings.{key}: expected at most 9223372036854775806"):
        CodeRuntimeSettings(**{key: 2**63 - 1})
    assert CodeRuntimeSettings(**{key: 2**63 - 2}).options() == {key: 2**63 - 2}


@pytest.mark.parametrize("value", ["[" * 500 + "]" * 500, "{a = " * 500 + "1" + "}" * 500])
def test_toml_nested_too_deeply_is_invalid_toml(tmp_path: Path, value: str) -> None:
    (tmp_path / "dsh.toml").write_text(f"[plugins.permissions]\nrules = {value}\n")
    with pytest.raises(ConfigError) as info:
        load_config(cwd=tmp_path)
    assert info.value.violations == (f"{tmp_path / 'dsh.toml'}: invalid TOML: arrays or tables nested too deeply",)


def test_a_byte_order_mark_is_refused_with_a_message_that_says_so(tmp_path: Path) -> None:
    (tmp_path / "dsh.toml").write_bytes(b'\xef\xbb\xbfmode = "code"\n')
    with pytest.raises(ConfigError) as info:
        load_config(cwd=tmp_path)
    assert info.value.violations == (
        f"{tmp_path / 'dsh.toml'}: starts with a UTF-8 byte-order mark, which TOML does not allow:"
        " save it as UTF-8 without a BOM",
    )


def test_an_explicit_pyproject_is_read_through_its_tool_dsh_table(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    pyproject = tmp_path / "sub" / "pyproject.toml"
    pyproject.write_text('[project]\nname = "x"\n\n[tool.dsh]\nmode = "code"\nsession_log = "s.jsonl"\n')
    config = load_config(pyproject)
    assert (config.mode, config.session_log) == ("code", str(tmp_path / "sub" / "s.jsonl"))
    pyproject.write_text("[tool.dsh]\nmode = 1\n")
    with pytest.raises(ConfigError) as info:
        load_config(pyproject)
    assert info.value.violations == (f"{pyproject}: [tool.dsh].mode: expected one of native/code/both, got 1",)
    pyproject.write_text('[project]\nname = "x"\n')
    with pytest.raises(ConfigError) as info:
        load_config(pyproject)
    assert info.value.violations == (
        f"{pyproject}: no [tool.dsh] table (a pyproject.toml holds the configuration there)",
    )


def test_relative_paths_of_kept_files_resolve_against_the_config_files_directory(tmp_path: Path) -> None:
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "dsh.toml").write_text(
        'session_log = "s.jsonl"\n'
        '[plugins.audit]\npath = "logs/audit.jsonl"\n'
        '[plugins.ledger]\npath = "/abs/effects.jsonl"\n'
        '[plugins.spill]\ndirectory = "spill"\n'
        '[plugins.files]\nroot = "."\n'
    )
    config = load_config("conf/dsh.toml", cwd=tmp_path)
    conf = tmp_path / "conf"
    assert config.session_log == str(conf / "s.jsonl")
    assert config.plugin_config("audit") == {"path": str(conf / "logs" / "audit.jsonl")}
    assert config.plugin_config("ledger") == {"path": "/abs/effects.jsonl"}
    assert config.plugin_config("spill") == {"directory": str(conf / "spill")}
    # A workspace root is where the work happens: the working directory, as before.
    assert config.plugin_config("files") == {"root": "."}


def test_a_table_of_many_unknown_keys_gives_a_bounded_message() -> None:
    # A config with hundreds of stray keys must not make a message (shown on the
    # terminal, logged) hundreds of keys long; the first keys say enough.
    data = {f"stray_{n:03d}": 1 for n in range(500)}
    with pytest.raises(ConfigError) as info:
        structure_table(Limits, data, "[x]")
    (violation,) = info.value.violations
    assert violation.startswith('[x]: unknown keys "stray_000", "stray_001", ')
    assert '"stray_019", … and 480 more (allowed: calls)' in violation
    assert len(str(info.value)) < 2000


def test_huge_unknown_keys_are_elided_in_the_middle() -> None:
    data = {"a" * 100_000 + str(n): 1 for n in range(3)}
    with pytest.raises(ConfigError) as info:
        structure_table(Limits, data, "[x]")
    message = str(info.value)
    assert message.startswith('invalid configuration: [x]: unknown keys "aaa')
    assert "a…a" in message and message.endswith("a2\" (allowed: calls)")
    assert len(message) < 2000


def test_a_config_error_message_shows_the_first_problems_and_counts_the_rest() -> None:
    data = {"rules": [{"tool": n, "action": "allow"} for n in range(500)]}
    with pytest.raises(ConfigError) as info:
        structure_table(PermissionsSettings, data, "[p]")
    assert len(info.value.violations) == 500  # every problem is still on the exception
    message = str(info.value)
    assert message.startswith("invalid configuration: [p].rules[0].tool: expected a string, got 0; ")
    assert message.endswith("[p].rules[19].tool: expected a string, got 19; … and 480 more")
    assert len(message) < 3000
