"""``dsh-tools new-plugin``: a plugin distribution to start from, with its tests and nox matrix.

The generated package registers one tool (``@tool``) and one policy from its
``dsh_setup``, reads its own ``[plugins.<name>]`` table strictly, declares its
capability manifest, and comes with pytest-trio tests written with
:mod:`dsh_core.testing` and a ``noxfile.py`` for Python 3.11 to 3.13. It
passes its own tests and ``dsh-tools check`` as generated.
"""

from __future__ import annotations

import importlib.metadata
import json
import re
import urllib.parse
from pathlib import Path
from typing import Final

from ._plugins import own_plugin_names

__all__ = ["check_plugin_name", "dsh_tools_source", "plugin_files", "write_plugin"]

_NAME = re.compile(r"^[a-z][a-z0-9]*(?:[-_][a-z0-9]+)*$")
_MAX_TOOL_NAME = 64  # what providers accept (the check command warns past it)

# dsh-tools' own packages. A plugin's package is "dsh_<name>": it can never shadow a
# standard-library module, only these (and its distribution "dsh-<name>" only dsh-tools).
_OWN_PACKAGES: Final = frozenset({"dsh_core", "dsh_plugins"})

_PYPROJECT: Final = """\
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "{distribution}"
version = "0.1.0"
description = "A dsh-tools plugin: {name}."
requires-python = ">=3.11"
dependencies = ["dsh-tools"]

[project.optional-dependencies]
test = ["pytest", "pytest-trio"]

# The host discovers the plugin here; its settings are the host's [plugins.{name}] table.
[project.entry-points.dsh]
{name} = "{package}"

[tool.hatch.build.targets.wheel]
packages = ["{package}"]

[tool.pytest.ini_options]
trio_mode = true
"""

_MODULE: Final = '''\
"""{name}: a dsh-tools plugin (one tool and one policy; change both to yours).

Configure it in the host's ``dsh.toml``::

    [plugins.{name}]
    blocked_words = ["rm -rf"]
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs
from dsh_core import (
    Deny,
    PreToolDecision,
    ToolEffects,
    ToolExecution,
    hookimpl,
    structure_table,
    tool,
)

# What this plugin may register and which tools its policy may decide
# (``dsh-tools plugins --capabilities``); strict_capabilities hosts enforce it.
DSH_CAPABILITIES = {{"tools": ["{tool}"], "affects": ["*"]}}


@attrs.frozen(kw_only=True)
class Settings:
    """The ``[plugins.{name}]`` table (unknown keys and wrong types are errors)."""

    blocked_words: tuple[str, ...] = ()


@tool(effects=ToolEffects(read_only=True, idempotent=True))
def {tool}(text: str) -> int:
    """Count the words in a text.

    Args:
        text: the text to count the words of.
    """
    return len(text.split())


class BlockWords:
    """Denies any call whose arguments contain one of the configured words."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings

    @hookimpl
    async def dsh_pre_execute(
        self, execution: ToolExecution, next: Callable[[], Awaitable[PreToolDecision]]
    ) -> PreToolDecision:
        texts = argument_strings(execution.arguments)
        for word in self.settings.blocked_words:
            if any(word in text for text in texts):
                return Deny(f"{{word!r}} is not allowed in a tool call")
        return await next()


def argument_strings(arguments: object) -> list[str]:
    """Every string value in the arguments, nested ones included.

    The values themselves, not their JSON text, where quotes, backslashes and
    newlines are escaped and would never match; keys are names, not text.
    (A loop, not recursion: the arguments may be nested arbitrarily deep.)
    """
    found: list[str] = []
    stack = [arguments]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            found.append(value)
        elif isinstance(value, Mapping):
            stack.extend(value.values())
        elif isinstance(value, (list, tuple)):
            stack.extend(value)
    return found


@hookimpl
def dsh_setup(runtime: Any, config: dict[str, Any]) -> None:
    """Register the tool and the policy (the policy object needs a name of its own)."""
    settings = structure_table(Settings, config, "[plugins.{name}]")
    runtime.register({tool})
    runtime.plugins.register(BlockWords(settings), name="{name}-policy")
'''

_TESTS: Final = '''\
"""Tests of the {name} plugin, with dsh_core.testing (run: nox, or pytest)."""

from __future__ import annotations

import pytest
from dsh_core import ConfigError, ToolRuntime
from dsh_core.testing import expect_failure, expect_success, make_input

import {package}


def runtime_with(config: dict[str, object]) -> ToolRuntime:
    runtime = ToolRuntime()
    {package}.dsh_setup(runtime, config)
    return runtime


async def test_the_tool_counts_words() -> None:
    call = make_input("{tool}", {{"text": "one two three"}})
    result = expect_success(await runtime_with({{}}).execute(call))
    assert result.value == 3


async def test_arguments_are_checked_before_the_tool_runs() -> None:
    call = make_input("{tool}", {{"text": 3}})
    result = expect_failure(await runtime_with({{}}).execute(call))
    assert result.code == "INVALID_ARGS"


async def test_the_policy_denies_blocked_words() -> None:
    runtime = runtime_with({{"blocked_words": ["secret"]}})
    call = make_input("{tool}", {{"text": "a secret"}})
    result = expect_failure(await runtime.execute(call))
    assert result.code == "DENIED"
    assert result.error.info is not None
    assert result.error.info.plugin == "{name}-policy"


async def test_the_policy_sees_the_text_as_written() -> None:
    runtime = runtime_with({{"blocked_words": ['say "hi"', "a\\\\b"]}})
    for text in ['please say "hi"', "path a\\\\b"]:
        call = make_input("{tool}", {{"text": text}})
        result = expect_failure(await runtime.execute(call))
        assert result.code == "DENIED"
    # An argument's name is not its text.
    named = runtime_with({{"blocked_words": ["text"]}})
    call = make_input("{tool}", {{"text": "one"}})
    assert expect_success(await named.execute(call)).value == 1


def test_a_bad_setting_is_a_configuration_error() -> None:
    with pytest.raises(ConfigError):
        runtime_with({{"blocked_word": ["typo"]}})
'''

_NOXFILE: Final = '''\
"""The test matrix: ``nox`` (Python 3.11, 3.12 and 3.13; a missing one fails the run), ``nox -s tests-3.12``."""

import glob
import os

import nox

PYTHONS = ["3.11", "3.12", "3.13"]

# A missing interpreter must fail the run: otherwise nox skips the session and exits 0.
nox.options.error_on_missing_interpreters = True

# pyenv's shims for non-global versions fail ("pyenv: python3.12: command not found")
# unless PYENV_VERSION lists them; expose every installed CPython of the matrix.
_pyenv_root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
_versions = sorted(
    os.path.basename(path)
    for version in PYTHONS
    for path in glob.glob(os.path.join(_pyenv_root, "versions", f"{{version}}.*"))
    if os.path.basename(path).replace(".", "").isdigit()
)
if _versions and "PYENV_VERSION" not in os.environ:
    os.environ["PYENV_VERSION"] = ":".join(_versions)
os.environ.setdefault("UV_PYTHON_DOWNLOADS", "never")  # never fetch CPython builds

# Where dsh-tools comes from: a package index, or the checkout this plugin was made with.
DSH_TOOLS = os.environ.get("DSH_TOOLS_SOURCE", {source})


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    session.install(DSH_TOOLS)
    session.install("-e", ".[test]")
    session.run("pytest", "-q", *session.posargs)
'''

_README: Final = """\
# {distribution}

A dsh-tools plugin: the `{tool}` tool and a policy denying configured words.

    pip install -e '.[test]'    # (dsh-tools first, if your index does not have it)
    dsh-tools list              # shows {tool}
    nox                         # the tests on Python 3.11, 3.12 and 3.13 (all three needed)

Settings (`dsh.toml` of the host):

```toml
[plugins.{name}]
blocked_words = ["rm -rf"]
```
"""


def dsh_tools_source() -> str:
    """What ``pip install`` needs for the dsh-tools running now: its checkout when installed from one."""
    try:
        direct = importlib.metadata.distribution("dsh-tools").read_text("direct_url.json")
        url = json.loads(direct)["url"] if direct else ""
    except (importlib.metadata.PackageNotFoundError, ValueError, KeyError, TypeError):
        url = ""
    if url.startswith("file://"):
        return urllib.parse.unquote(url.removeprefix("file://"))
    return "dsh-tools"


def check_plugin_name(name: str) -> None:
    """Whether ``name`` can be a new plugin's entry-point name.

    Raises:
        ValueError: ``name`` is not lowercase letters and digits, optionally joined by ``-`` or ``_``,
            or its package or distribution would be dsh-tools' own (``core``, ``plugins``, ``tools``),
            or a bundled plugin has its entry-point name (``timeout``, ``permissions``...).
    """
    if not _NAME.match(name):
        raise ValueError(f"a plugin name is lowercase letters and digits joined by '-' or '_', got {name!r}")
    package = "dsh_" + name.replace("-", "_")
    tool_name = f"{package.removeprefix('dsh_')}_word_count"
    if len(tool_name) > _MAX_TOOL_NAME:
        raise ValueError(
            f"a plugin name is at most {_MAX_TOOL_NAME - len('_word_count')} characters (its tool, {tool_name!r}, "
            f"would pass the {_MAX_TOOL_NAME}-character limit of a tool name), got {len(name)}"
        )
    distribution = "dsh-" + name.replace("_", "-")
    taken = f"the package {package}" if package in _OWN_PACKAGES else None
    if distribution == "dsh-tools":
        taken = f"the distribution {distribution}"
    if taken is not None:
        raise ValueError(
            f"a plugin named {name!r} would be {taken}, which is dsh-tools' own: installing it would break "
            "dsh-tools; choose another name (--name)"
        )
    bundled = next((own for own in sorted(own_plugin_names()) if own.replace("-", "_") == package[len("dsh_") :]), None)
    if bundled is not None:
        raise ValueError(
            f"a plugin named {name!r} is the entry-point name of dsh-tools' bundled plugin {bundled!r}: installed, "
            "it would be skipped and the bundled one kept; choose another name (--name)"
        )


def plugin_files(name: str, *, source: str = "dsh-tools") -> dict[str, str]:
    """The files of a new plugin named ``name`` (its entry-point name), by relative path.

    ``source`` is what its ``noxfile.py`` installs dsh-tools from (a package
    name or a local checkout; ``DSH_TOOLS_SOURCE`` overrides it when nox runs).

    Raises:
        ValueError: ``name`` is not one :func:`check_plugin_name` accepts.
    """
    check_plugin_name(name)
    package = "dsh_" + name.replace("-", "_")
    fields = {
        "name": name,
        "package": package,
        "distribution": "dsh-" + name.replace("_", "-"),
        "tool": f"{package.removeprefix('dsh_')}_word_count",
    }
    return {
        "pyproject.toml": _PYPROJECT.format(**fields),
        f"{package}/__init__.py": _MODULE.format(**fields),
        "tests/test_plugin.py": _TESTS.format(**fields),
        # A JSON string is a Python string literal, in the double quotes formatters want.
        "noxfile.py": _NOXFILE.format(source=json.dumps(source)),
        "README.md": _README.format(**fields),
    }


def write_plugin(directory: Path, name: str, *, source: str | None = None) -> list[Path]:
    """Write :func:`plugin_files` under ``directory``; returns the paths written.

    ``source`` defaults to :func:`dsh_tools_source`.

    Raises:
        ValueError: a bad name, or ``directory`` exists and is not empty (nothing is overwritten).
        OSError: a file or directory could not be created (the files written before stay).
    """
    files = plugin_files(name, source=source if source is not None else dsh_tools_source())
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise ValueError(f"{directory} exists and is not an empty directory; nothing was written")
    written = []
    for relative, text in files.items():
        path = directory / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
