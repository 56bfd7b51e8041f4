"""The project's ``noxfile.py``: what ``nox -s tests -- <args>`` hands to pytest."""

from __future__ import annotations

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

    def install(self, *args: str) -> None:
        pass

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
