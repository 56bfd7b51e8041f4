"""Capability manifests: declared, reported, and enforced only under strict_capabilities."""

from __future__ import annotations

import importlib.metadata
import itertools
import json
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from dsh_core import ToolRuntime
from dsh_core._capabilities import Capabilities
from dsh_core._cli import cli
from dsh_core._config import DshConfig
from dsh_core._plugins import PluginReport, load_plugins
from dsh_core.testing import json_tool, make_input

_serial = itertools.count()

HEADER = """
from dsh_core import Accept, Allow, Block, Deny, TextBlock, ToolExecutionSuccess, define_tool, hookimpl

async def _echo(args):
    return args

def tool(name):
    return define_tool(name=name, description=name, parameters={}, output={"type": "json"}, execute=_echo)
"""

# Registers three tools and denies every call it sees whose name starts with "rm" or is "ls".
POLICY = (
    HEADER
    + """
DSH_CAPABILITIES = {"tools": ["fs_*"], "affects": ["fs_*", "rm*"]}

@hookimpl
async def dsh_pre_execute(execution, next):
    if execution.name.startswith("rm") or execution.name == "ls":
        return Deny("not today")
    return await next()

@hookimpl
def dsh_setup(runtime, config):
    runtime.register(tool("fs_read"))
    runtime.register(tool("fs_write"))
"""
)


class Loader:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.prefix = f"dshcap{next(_serial)}_"

    def module(self, name: str, source: str) -> str:
        full = self.prefix + name
        (self.root / f"{full}.py").write_text(textwrap.dedent(source))
        return full

    def load(
        self, plugins: dict[str, str], *, strict: bool, runtime: ToolRuntime | None = None
    ) -> tuple[ToolRuntime, PluginReport]:
        runtime = runtime or ToolRuntime()
        points = [
            importlib.metadata.EntryPoint(name=name, value=self.module(name, source), group="dsh")
            for name, source in plugins.items()
        ]
        return runtime, load_plugins(runtime, config=DshConfig(strict_capabilities=strict), entry_points=points)


@pytest.fixture
def loader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Loader]:
    monkeypatch.syspath_prepend(str(tmp_path))
    factory = Loader(tmp_path)
    yield factory
    for name in [m for m in sys.modules if m.startswith(factory.prefix)]:
        del sys.modules[name]


def tools_host(runtime: ToolRuntime, *names: str) -> ToolRuntime:
    for name in names:
        runtime.register(json_tool(name))
    return runtime


# -- the manifest ----------------------------------------------------------------------------


def test_the_manifest_is_reported(loader: Loader) -> None:
    _, report = loader.load({"policy": POLICY}, strict=False)
    assert report.ok
    assert report.loaded[0].capabilities == Capabilities(tools=("fs_*",), affects=("fs_*", "rm*"))


def test_a_plugin_without_a_manifest_reports_none(loader: Loader) -> None:
    _, report = loader.load({"plain": HEADER}, strict=False)
    assert report.loaded[0].capabilities is None


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        ('["fs_*"]', "must be a dict"),
        ('{"tools": "fs_*"}', '"tools" must be a list'),
        ('{"affects": [1]}', '"affects"[0] must be a non-empty string'),
        ('{"tool": ["x"]}', "unknown key(s) tool"),
    ],
)
def test_a_malformed_manifest_fails_the_plugin_at_import(loader: Loader, manifest: str, message: str) -> None:
    _, report = loader.load({"bad": HEADER + f"\nDSH_CAPABILITIES = {manifest}\n"}, strict=False)
    assert [(f.name, f.stage) for f in report.failed] == [("bad", "import")]
    assert message in report.failed[0].error


# -- off by default ----------------------------------------------------------------------------


async def test_without_strict_mode_nothing_is_enforced_or_wrapped(loader: Loader) -> None:
    source = POLICY.replace('runtime.register(tool("fs_write"))', 'runtime.register(tool("other"))')
    runtime, report = loader.load({"policy": source}, strict=False, runtime=tools_host(ToolRuntime(), "ls"))
    assert report.loaded[0].tools == ("fs_read", "other")
    result = await runtime.execute(make_input("ls"))
    assert result.is_error and result.code == "DENIED"
    impl = runtime.plugins.hook.dsh_pre_execute.get_hookimpls()[0]
    assert impl.function is sys.modules[loader.prefix + "policy"].dsh_pre_execute


# -- registrations -----------------------------------------------------------------------------


def test_strict_mode_refuses_registrations_outside_tools(loader: Loader) -> None:
    source = POLICY.replace(
        'runtime.register(tool("fs_write"))',
        'try:\n        runtime.register(tool("shell"))\n    except Exception:\n        pass',
    )
    runtime, report = loader.load({"policy": source}, strict=True)
    assert report.ok
    assert report.loaded[0].tools == ("fs_read",)
    assert [(r.plugin, r.tool) for r in report.refused] == [("policy", "shell")]
    assert "may not register tool" in report.refused[0].error and "fs_*" in report.refused[0].error
    assert runtime.names() == ["fs_read"]


def test_an_uncaught_refusal_rolls_the_plugin_back(loader: Loader) -> None:
    source = POLICY.replace('runtime.register(tool("fs_write"))', 'runtime.register(tool("shell"))')
    runtime, report = loader.load({"policy": source}, strict=True)
    assert [(f.name, f.stage) for f in report.failed] == [("policy", "setup")]
    assert runtime.names() == []


def test_a_plugin_without_a_manifest_may_register_nothing_in_strict_mode(loader: Loader) -> None:
    source = HEADER + "\n@hookimpl\ndef dsh_setup(runtime, config):\n    runtime.register(tool('x'))\n"
    _, report = loader.load({"plain": source}, strict=True)
    assert [(f.name, f.stage) for f in report.failed] == [("plain", "setup")]
    assert "its DSH_CAPABILITIES tools are none" in report.failed[0].error


# -- decisions ---------------------------------------------------------------------------------


async def test_a_decision_inside_affects_stands(loader: Loader) -> None:
    runtime, _ = loader.load({"policy": POLICY}, strict=True, runtime=tools_host(ToolRuntime(), "rm"))
    result = await runtime.execute(make_input("rm"))
    assert result.is_error and result.code == "DENIED"


async def test_a_decision_outside_affects_is_a_policy_error_naming_the_plugin(loader: Loader) -> None:
    runtime, _ = loader.load({"policy": POLICY}, strict=True, runtime=tools_host(ToolRuntime(), "ls"))
    result = await runtime.execute(make_input("ls"))
    assert result.is_error and result.code == "POLICY_ERROR"
    assert result.error.info is not None and result.error.info.plugin == "policy"
    assert 'plugin policy may not decide calls of tool "ls"' in result.error.message


async def test_passing_through_outside_affects_is_fine(loader: Loader) -> None:
    runtime, _ = loader.load({"policy": POLICY}, strict=True, runtime=tools_host(ToolRuntime(), "cat"))
    result = await runtime.execute(make_input("cat", {"x": 1}))
    assert not result.is_error


@pytest.mark.parametrize(
    "hook",
    [
        "@hookimpl\nasync def dsh_pre_execute(execution, next):\n    return Allow()\n",
        "@hookimpl\nasync def dsh_pre_execute(next):\n    await next()\n    return Deny('late')\n",
        "@hookimpl\nasync def dsh_execute(execution, next):\n    return ToolExecutionSuccess(value=1, content=())\n",
        "@hookimpl\nasync def dsh_post_execute(execution, result, next):\n"
        "    await next()\n    return Accept(content=[TextBlock('x')])\n",
        "@hookimpl\nasync def dsh_post_execute(execution, result, next):\n"
        "    return Block(feedback=[TextBlock('no')])\n",
    ],
    ids=["own-allow", "deny-after-next", "replaced-result", "replaced-content", "block"],
)
async def test_every_kind_of_decision_outside_affects_is_refused(loader: Loader, hook: str) -> None:
    source = HEADER + '\nDSH_CAPABILITIES = {"affects": ["mine"]}\n' + hook
    runtime, report = loader.load({"p": source}, strict=True, runtime=tools_host(ToolRuntime(), "mine", "theirs"))
    assert report.ok
    refused = await runtime.execute(make_input("theirs"))
    assert refused.is_error and refused.code == "POLICY_ERROR" and "plugin p may not decide" in refused.error.message
    allowed = await runtime.execute(make_input("mine"))
    assert not (allowed.is_error and allowed.code == "POLICY_ERROR")


async def test_listeners_of_plugins_registered_in_setup_are_guarded_too(loader: Loader) -> None:
    source = (
        HEADER
        + """
DSH_CAPABILITIES = {"affects": ["mine"]}

class Policy:
    @hookimpl
    async def dsh_pre_execute(self, execution, next):
        return Deny("no")

@hookimpl
def dsh_setup(runtime, config):
    runtime.plugins.register(Policy(), name="p-policy")
"""
    )
    runtime, _ = loader.load({"p": source}, strict=True, runtime=tools_host(ToolRuntime(), "mine", "theirs"))
    assert (await runtime.execute(make_input("mine"))).code == "DENIED"
    refused = await runtime.execute(make_input("theirs"))
    assert refused.code == "POLICY_ERROR"
    assert refused.error.info is not None and refused.error.info.plugin == "p-policy"
    assert "plugin p may not decide" in refused.error.message


async def test_guards_added_in_setup_may_deny_only_inside_affects(loader: Loader) -> None:
    source = (
        HEADER
        + """
DSH_CAPABILITIES = {"affects": ["mine"]}

def deny_everything(execution):
    return "denied by the guard"

@hookimpl
def dsh_setup(runtime, config):
    runtime.guard(deny_everything)
"""
    )
    runtime, _ = loader.load({"p": source}, strict=True, runtime=tools_host(ToolRuntime(), "mine", "theirs"))
    assert (await runtime.execute(make_input("mine"))).code == "DENIED"
    refused = await runtime.execute(make_input("theirs"))
    assert refused.code == "POLICY_ERROR" and 'plugin p may not deny calls of tool "theirs"' in refused.error.message


def test_an_async_guard_is_refused_before_strict_mode_wraps_it(loader: Loader) -> None:
    """The strict-mode wrapper is a plain function: the check must see the guard as the plugin gave it."""
    source = (
        HEADER
        + """
DSH_CAPABILITIES = {"affects": ["mine"]}

async def deny_everything(execution):
    return "denied by the guard"

@hookimpl
def dsh_setup(runtime, config):
    runtime.guard(deny_everything)
"""
    )
    runtime, report = loader.load({"p": source}, strict=True, runtime=tools_host(ToolRuntime(), "mine"))
    (failed,) = report.failed
    assert (failed.name, failed.stage) == ("p", "setup")
    assert "deny_everything is async" in failed.error
    assert runtime._registry.view(None).guards == ()


async def test_a_plugin_without_a_manifest_decides_nothing_in_strict_mode(loader: Loader) -> None:
    source = HEADER + "\n@hookimpl\nasync def dsh_pre_execute(execution, next):\n    return Deny('no')\n"
    runtime, _ = loader.load({"plain": source}, strict=True, runtime=tools_host(ToolRuntime(), "t"))
    assert (await runtime.execute(make_input("t"))).code == "POLICY_ERROR"


# -- the CLI -----------------------------------------------------------------------------------


@pytest.fixture
def cli_plugin(loader: Loader, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "200")
    return [
        "--no-plugins",
        "--plugin",
        f"policy={loader.module('policy', POLICY)}",
        "--plugin",
        f"plain={loader.module('plain', HEADER)}",
    ]


def test_plugins_capabilities_lists_the_manifests(cli_plugin: list[str]) -> None:
    result = CliRunner().invoke(cli, [*cli_plugin, "plugins", "--capabilities"], catch_exceptions=False)
    assert result.exit_code == 0
    assert "fs_*, rm*" in result.stdout and "fs_read, fs_write" in result.stdout
    assert "not declared" in result.stdout


def test_plugins_capabilities_json(cli_plugin: list[str]) -> None:
    result = CliRunner().invoke(cli, [*cli_plugin, "plugins", "--capabilities", "--json"], catch_exceptions=False)
    data: dict[str, Any] = json.loads(result.stdout)
    assert data["strict"] is False
    assert data["plugins"] == [
        {
            "plugin": "policy",
            "declared": True,
            "tools": ["fs_*"],
            "affects": ["fs_*", "rm*"],
            "registered": ["fs_read", "fs_write"],
        },
        {"plugin": "plain", "declared": False, "tools": [], "affects": [], "registered": []},
    ]


def test_check_warns_about_undeclared_plugins_in_strict_mode(cli_plugin: list[str], tmp_path: Path) -> None:
    (tmp_path / "dsh.toml").write_text("strict_capabilities = true\n")
    result = CliRunner().invoke(cli, [*cli_plugin, "check"], catch_exceptions=False)
    assert "plugin plain declares no DSH_CAPABILITIES" in result.stdout
    assert "plugin policy declares no" not in result.stdout


def _first_party_modules() -> list[str]:
    import importlib.metadata

    # From the installed entry points, so a new first-party plugin cannot be left out of this check.
    values = {point.value for point in importlib.metadata.entry_points(group="dsh")}
    return sorted(value for value in values if value.startswith("dsh_plugins."))


def test_every_first_party_module_is_an_entry_point() -> None:
    assert {"dsh_plugins.timeout", "dsh_plugins.ledger", "dsh_plugins.mcp_client"} <= set(_first_party_modules())


@pytest.mark.parametrize("module", _first_party_modules())
def test_first_party_plugins_declare_a_valid_manifest(module: str) -> None:
    import importlib

    from dsh_core._capabilities import capabilities_of

    loaded = importlib.import_module(module)
    assert capabilities_of(loaded) is not None
