"""The project's ``noxfile.py``: what ``nox -s tests -- <args>`` hands to pytest."""

from __future__ import annotations

import itertools
import runpy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parent.parent


class RecordingSession:
    """Stands in for ``nox.Session``: records the commands instead of running them."""

    def __init__(self, posargs: list[str]) -> None:
        self.posargs = posargs
        self.runs: list[tuple[str, ...]] = []
        self.installs: list[tuple[str, ...]] = []

    def install(self, *args: str) -> None:
        self.installs.append(args)

    def run(self, *args: str) -> None:
        self.runs.append(args)


@pytest.fixture(scope="module")
def noxfile() -> Iterator[dict[str, Any]]:
    pytest.importorskip("nox", reason="nox comes with the dev extra")
    # Loaded once: nox registers each session globally. Loading sets these
    # for nox's subprocesses; keep them out of this process.
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv("PYENV_VERSION", "3.11.7")
        monkeypatch.setenv("UV_PYTHON_DOWNLOADS", "never")
        yield runpy.run_path(str(REPO / "noxfile.py"))


@pytest.mark.parametrize(
    ("posargs", "pytest_args"),
    [
        ([], ("-m", "not slow")),
        (["tests/test_corpus.py"], ("-m", "not slow", "tests/test_corpus.py")),
        (["-x", "-k", "storm"], ("-m", "not slow", "-x", "-k", "storm")),
        (["-m", "slow"], ("-m", "slow")),
        (["tests/test_corpus.py", "-mslow"], ("tests/test_corpus.py", "-mslow")),
    ],
)
def test_tests_session_excludes_slow_tests_unless_told_otherwise(
    noxfile: dict[str, Any], posargs: list[str], pytest_args: tuple[str, ...]
) -> None:
    session = RecordingSession(posargs)
    noxfile["tests"](session)
    assert session.runs == [("pytest", "-q", *pytest_args)]


def test_bench_session_pins_every_package_it_installs_by_name(noxfile: dict[str, Any]) -> None:
    # An unpinned profiler changes the --profile output between runs that BENCHMARKS.md compares.
    session = RecordingSession([])
    noxfile["bench"](session)
    (install,) = session.installs
    # Requirements named on the command line: neither an option nor the value of -e/-r (a path).
    named = [arg for flag, arg in itertools.pairwise(("", *install)) if flag not in ("-e", "-r")]
    named = [arg for arg in named if not arg.startswith("-")]
    assert named and all("==" in requirement for requirement in named), named
    assert "pyinstrument==5.1.3" in named
    assert ("-r", "benchmarks/requirements-peers.txt") in itertools.pairwise(install)
    assert session.runs == [("python", "-m", "benchmarks")]
