"""What the wheel and the sdist carry, read from ``pyproject.toml``'s hatchling build rules.

Building needs hatchling, which the test environment does not install, so these
tests check the rules and the files they select rather than a built archive.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PYPROJECT: dict[str, Any] = tomllib.loads((REPO / "pyproject.toml").read_text())
TARGETS: dict[str, Any] = PYPROJECT["tool"]["hatch"]["build"]["targets"]


def test_both_packages_ship_py_typed_in_the_wheel() -> None:
    # A type checker treats an installed package without py.typed as untyped
    # (`from dsh_plugins.undo import UndoLog` would be import-untyped).
    wheel = TARGETS["wheel"]
    assert wheel["packages"] == ["dsh_core", "dsh_plugins"]
    assert not {"only-include", "exclude", "include"} & wheel.keys()  # every file of both packages
    for package in wheel["packages"]:
        marker = REPO / package / "py.typed"
        assert marker.is_file(), marker
        assert marker.read_text() == ""


def test_the_license_file_is_the_declared_license() -> None:
    assert PYPROJECT["project"]["license"] == "MIT"
    assert PYPROJECT["project"]["license-files"] == ["LICENSE"]  # into the wheel's .dist-info/licenses/
    text = (REPO / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("MIT License\n\nCopyright (c) 2026 the dsh-tools authors\n")
    assert 'THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND' in text


def test_the_sdist_carries_what_a_packager_needs_to_run_the_tests() -> None:
    include = TARGETS["sdist"]["include"]
    for needed in ("dsh_core", "dsh_plugins", "README.md", "CHANGELOG.md", "LICENSE", "noxfile.py"):
        assert needed in include
        assert (REPO / needed).exists(), needed
    # The tests read the examples (and install two of them) and check .ci/run against the README.
    for directory in ("tests", "examples", ".ci"):
        assert directory in include
        assert (REPO / directory).is_dir(), directory
    assert (REPO / "tests" / "conftest.py").is_file() and PYPROJECT["tool"]["pytest"]["ini_options"]["testpaths"] == [
        "tests"
    ]


def test_the_sdist_carries_the_benchmarks_its_noxfile_and_ci_script_run() -> None:
    include = TARGETS["sdist"]["include"]
    noxfile = (REPO / "noxfile.py").read_text(encoding="utf-8")
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert '"-m", "benchmarks"' in noxfile and "-m benchmarks --smoke" in ci  # what ships and uses them
    assert "benchmarks" in include and (REPO / "benchmarks" / "__main__.py").is_file()
    assert (REPO / "benchmarks" / "requirements-peers.txt").is_file()
    assert "BENCHMARKS.md" in include and (REPO / "BENCHMARKS.md").is_file()  # the results the README points to


def test_the_click_floor_has_the_cli_runner_the_tests_use() -> None:
    # CliRunner keeps stderr apart from stdout (result.stderr) from click 8.2 on; with 8.1 the CLI tests fail.
    from packaging.requirements import Requirement

    (click,) = [Requirement(r) for r in PYPROJECT["project"]["dependencies"] if Requirement(r).name == "click"]
    assert "8.2.0" in click.specifier
    assert "8.1.8" not in click.specifier
