"""Routine tasks: ``nox -s tests`` (3.11-3.13), ``lint``, ``typecheck``, ``bench``, ``slow``, ``fuzz``."""

from __future__ import annotations

import glob
import os

import nox

PYTHONS = ["3.11", "3.12", "3.13"]

nox.options.default_venv_backend = "uv|virtualenv"
nox.options.reuse_venv = "yes"
nox.options.sessions = ["tests", "lint", "typecheck"]
# A missing interpreter must fail the run: otherwise nox skips the session and exits 0.
nox.options.error_on_missing_interpreters = True

# pyenv's shims for non-global versions fail ("pyenv: python3.12: command not found")
# unless PYENV_VERSION lists them; expose every installed CPython of the matrix.
_pyenv_root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
_versions = sorted(
    os.path.basename(path)
    for version in PYTHONS
    for path in glob.glob(os.path.join(_pyenv_root, "versions", f"{version}.*"))
    if os.path.basename(path).replace(".", "").isdigit()
)
if _versions and "PYENV_VERSION" not in os.environ:
    os.environ["PYENV_VERSION"] = ":".join(_versions)
os.environ.setdefault("UV_PYTHON_DOWNLOADS", "never")  # never fetch CPython builds


@nox.session(python=PYTHONS)
def tests(session: nox.Session) -> None:
    """The test suite on each supported Python (slow tests excluded unless -- -m slow)."""
    session.install("-e", ".[test,mcp]")
    session.install("-e", "examples/dsh-example-tools", "-e", "examples/dsh-example-policy")
    session.run("pytest", "-q", *_unless_marks_chosen(["-m", "not slow"], session.posargs), *session.posargs)


def _unless_marks_chosen(default: list[str], posargs: list[str]) -> list[str]:
    """``default`` (a ``-m`` selection), unless the arguments choose their own with ``-m``."""
    chosen = any(arg.startswith("-m") for arg in posargs)  # "-m slow" or "-mslow"; not "--maxfail"
    return [] if chosen else default


@nox.session(python="3.11")
def lint(session: nox.Session) -> None:
    """ruff over the package, plugins, tests and examples."""
    session.install("ruff==0.17.6")
    session.run("ruff", "check", "dsh_core", "dsh_plugins", "tests", "examples", "benchmarks", "noxfile.py")


@nox.session(python="3.11")
def typecheck(session: nox.Session) -> None:
    """mypy --strict on dsh_core and dsh_plugins."""
    session.install("-e", ".[test,mcp]", "mypy==2.4.1", "types-regex==2026.11.8.20261109")
    session.run("mypy", "--strict", "dsh_core", "dsh_plugins")


@nox.session(python="3.11")
def bench(session: nox.Session) -> None:
    """Benchmarks, printed as ratios against baselines measured in the same run."""
    session.install("-e", ".[test]", "-r", "benchmarks/requirements-peers.txt", "pyinstrument==5.1.3")
    session.run("python", "-m", "benchmarks", *session.posargs)


@nox.session(python="3.11")
def slow(session: nox.Session) -> None:
    """The long reliability suites (cancellation storms, large corpora)."""
    session.install("-e", ".[test]")
    session.run("pytest", "-q", "-m", "slow", *session.posargs)


@nox.session(python="3.11")
def fuzz(session: nox.Session) -> None:
    """A longer hypothesis fuzz session (``-- --seconds 600 --seed 1 --rounds 3`` to go further)."""
    session.install("-e", ".[test]")
    session.run("python", "tests/fuzz/run.py", *(session.posargs or ["--seconds", "60"]))
