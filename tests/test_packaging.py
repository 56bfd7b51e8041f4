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
