"""``dsh-tools new-plugin``: the generated plugin loads, passes its own tests, and nothing is overwritten."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from dsh_core import DshConfig, ToolRuntime, load_plugins
from dsh_core._cli import cli
from dsh_core._scaffold import plugin_files
from dsh_core.testing import expect_failure, expect_success, make_input


def generate(tmp_path: Path, *args: str) -> Path:
    target = tmp_path / "dsh-word-guard"
    result = CliRunner().invoke(cli, ["new-plugin", str(target), *args])
    assert result.exit_code == 0, result.output
    assert "pip install -e '.[test]'" in result.output
    return target


def test_the_generated_plugin_passes_its_own_tests(tmp_path: Path) -> None:
    target = generate(tmp_path)
    environment = {**os.environ, "PYTHONPATH": str(target)}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(target / "tests")],
        cwd=target,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert "5 passed" in run.stdout


async def test_the_generated_plugin_loads_through_its_entry_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = generate(tmp_path)
    monkeypatch.syspath_prepend(str(target))
    project = tomllib.loads((target / "pyproject.toml").read_text())
    ((name, value),) = project["project"]["entry-points"]["dsh"].items()
    assert (name, value) == ("word-guard", "dsh_word_guard")
    point = importlib.metadata.EntryPoint(name=name, value=value, group="dsh")
    runtime = ToolRuntime()
    config = DshConfig(strict_capabilities=True, plugins={name: {"blocked_words": ["secret"]}})
    report = load_plugins(runtime, config=config, entry_points=[point])
    assert report.ok, report.failed
    ok = await runtime.execute(make_input("word_guard_word_count", {"text": "one two"}))
    assert expect_success(ok).value == 2
    denied = await runtime.execute(make_input("word_guard_word_count", {"text": "a secret"}))
    assert expect_failure(denied).code == "DENIED"
    for module in [m for m in sys.modules if m.startswith("dsh_word_guard")]:
        del sys.modules[module]


def test_nothing_is_overwritten(tmp_path: Path) -> None:
    target = tmp_path / "busy"
    target.mkdir()
    (target / "keep.txt").write_text("mine")
    result = CliRunner().invoke(cli, ["new-plugin", str(target)])
    assert result.exit_code == 2
    assert "exists and is not an empty directory; nothing was written" in result.output
    assert sorted(path.name for path in target.iterdir()) == ["keep.txt"]


@pytest.mark.parametrize("name", ["Upper", "1st", "has space", "trailing-", ""])
def test_a_name_that_cannot_be_an_entry_point_is_refused(tmp_path: Path, name: str) -> None:
    result = CliRunner().invoke(cli, ["new-plugin", str(tmp_path / "x"), "--name", name])
    assert result.exit_code == 2 and "a plugin name is lowercase letters and digits" in result.output
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(
    ("directory", "derived"), [("my.plugin", "my.plugin"), ("dsh-", ""), ("My Plugin", "my plugin")]
)
def test_a_bad_name_taken_from_the_directory_says_so_and_names_the_option(
    tmp_path: Path, directory: str, derived: str
) -> None:
    result = CliRunner().invoke(cli, ["new-plugin", str(tmp_path / directory)])
    assert result.exit_code == 2, result.output
    message = " ".join(result.output.split())
    assert f"got {derived!r}" in message
    assert f"(the name was taken from the directory {directory!r}; give one with --name NAME)" in message
    assert not (tmp_path / directory).exists()
    # A name given with --name is the user's own: no word about the directory.
    given = CliRunner().invoke(cli, ["new-plugin", str(tmp_path / "x"), "--name", "my.plugin"])
    assert given.exit_code == 2 and "taken from the directory" not in given.output


def test_a_name_whose_tool_name_would_be_too_long_is_refused(tmp_path: Path) -> None:
    longest = "a" * 53  # a_word_count-style tool names stop at 64 characters
    assert "_word_count" in plugin_files(longest)[f"dsh_{longest}/__init__.py"]
    result = CliRunner().invoke(cli, ["new-plugin", str(tmp_path / "x"), "--name", longest + "b"])
    assert result.exit_code == 2, result.output
    assert "a plugin name is at most 53 characters" in result.output and "got 54" in result.output
    assert not (tmp_path / "x").exists()


def test_plugin_files_lay_out_a_distribution() -> None:
    files = plugin_files("word_guard")
    assert set(files) == {
        "pyproject.toml",
        "dsh_word_guard/__init__.py",
        "tests/test_plugin.py",
        "noxfile.py",
        "README.md",
    }
    assert 'word_guard = "dsh_word_guard"' in files["pyproject.toml"]
    assert 'name = "dsh-word-guard"' in files["pyproject.toml"]


def test_the_noxfile_installs_dsh_tools_from_where_it_came_from() -> None:
    from dsh_core._scaffold import dsh_tools_source

    assert '"/opt/src/dsh-tools"' in plugin_files("x", source="/opt/src/dsh-tools")["noxfile.py"]
    assert 'os.environ.get("DSH_TOOLS_SOURCE", "dsh-tools")' in plugin_files("x")["noxfile.py"]
    source = dsh_tools_source()  # this checkout when installed from it (editable), else the index name
    assert source == "dsh-tools" or (Path(source) / "dsh_core" / "__init__.py").is_file()


NOXFILE_SETTINGS = """
import os, runpy, nox
runpy.run_path("noxfile.py")
print(os.environ.get("PYENV_VERSION"), os.environ.get("UV_PYTHON_DOWNLOADS"), nox.options.error_on_missing_interpreters)
"""


def run_noxfile(directory: Path, **environment: str) -> str:
    """What loading ``directory``'s noxfile sets: PYENV_VERSION, UV_PYTHON_DOWNLOADS, error_on_missing_interpreters."""
    base = {k: v for k, v in os.environ.items() if k not in {"PYENV_VERSION", "PYENV_ROOT", "UV_PYTHON_DOWNLOADS"}}
    run = subprocess.run(
        [sys.executable, "-c", NOXFILE_SETTINGS],
        cwd=directory,
        env={**base, **environment},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    return run.stdout.strip()


def test_the_noxfile_runs_every_python_of_the_matrix_or_fails(tmp_path: Path) -> None:
    # pyenv's python3.12/python3.13 shims fail unless PYENV_VERSION lists those versions; nox
    # then skipped those sessions and exited 0 while the README promises the matrix passes.
    pytest.importorskip("nox", reason="nox comes with the dev extra")
    target = generate(tmp_path)
    pyenv = tmp_path / "pyenv"
    for version in ("3.13.0", "3.11.7", "3.12.1", "3.10.4", "3.12-dev", "system"):
        (pyenv / "versions" / version).mkdir(parents=True)
    assert run_noxfile(target, PYENV_ROOT=str(pyenv)) == "3.11.7:3.12.1:3.13.0 never True"
    # The user's own choices win.
    chosen = run_noxfile(target, PYENV_ROOT=str(pyenv), PYENV_VERSION="3.12.1", UV_PYTHON_DOWNLOADS="automatic")
    assert chosen == "3.12.1 automatic True"
    # Without pyenv nothing is exposed, and a missing interpreter still fails the run.
    assert run_noxfile(target, PYENV_ROOT=str(tmp_path / "no-pyenv")) == "None never True"


@pytest.mark.parametrize(
    ("args", "taken"),
    [
        (["dsh-core"], "the package dsh_core"),  # the default name: the directory's, without dsh-
        (["dsh-plugins"], "the package dsh_plugins"),
        (["x", "--name", "core"], "the package dsh_core"),
        (["x", "--name", "plugins"], "the package dsh_plugins"),
        (["x", "--name", "tools"], "the distribution dsh-tools"),
    ],
)
def test_a_name_that_would_replace_dsh_tools_itself_is_refused(tmp_path: Path, args: list[str], taken: str) -> None:
    directory, *options = args
    result = CliRunner().invoke(cli, ["new-plugin", str(tmp_path / directory), *options])
    assert result.exit_code == 2, result.output
    assert f"would be {taken}, which is dsh-tools' own" in result.output
    assert "choose another name (--name)" in result.output
    assert not (tmp_path / directory).exists()


@pytest.mark.parametrize(
    ("args", "bundled"),
    [
        (["dsh-timeout"], "timeout"),  # the default name: the directory's, without dsh-
        (["x", "--name", "permissions"], "permissions"),
        (["x", "--name", "tool-search"], "tool_search"),  # the same name once - and _ are alike
        (["x", "--name", "mcp"], "mcp"),
    ],
)
def test_a_name_a_bundled_plugin_takes_is_refused(tmp_path: Path, args: list[str], bundled: str) -> None:
    """Installed, it would fight the bundled plugin for its entry-point name (and lose)."""
    assert bundled in {point.name for point in importlib.metadata.distribution("dsh-tools").entry_points}
    directory, *options = args
    result = CliRunner().invoke(cli, ["new-plugin", str(tmp_path / directory), *options])
    assert result.exit_code == 2, result.output
    message = " ".join(result.output.split())
    assert f"is the entry-point name of dsh-tools' bundled plugin {bundled!r}" in message
    assert "choose another name (--name)" in message
    assert not (tmp_path / directory).exists()


def test_a_file_system_error_is_a_clear_usage_error(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("not a directory")
    result = CliRunner().invoke(cli, ["new-plugin", str(tmp_path / "a-file" / "sub")], catch_exceptions=False)
    assert result.exit_code == 2
    assert f"cannot write the plugin in {tmp_path / 'a-file' / 'sub'}: " in result.output
    assert "Traceback" not in result.output
    read_only = tmp_path / "read-only"
    read_only.mkdir()
    read_only.chmod(0o500)
    try:
        result = CliRunner().invoke(cli, ["new-plugin", str(read_only / "p")], catch_exceptions=False)
    finally:
        read_only.chmod(0o700)
    if os.geteuid() != 0:  # root writes anywhere
        assert result.exit_code == 2
        assert "Permission denied" in result.output
