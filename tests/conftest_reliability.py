"""Reliability figures shared by the corpus, faulty-plugin, storm and fuzz suites.

Each of those test modules does ``from conftest_reliability import *`` (the
fixtures must live in the module namespace for pytest to see them) and counts
what it did in :data:`FIGURES`. At the end of the session pytest prints the
figures under ``dsh reliability figures``; with ``DSH_RELIABILITY_JSON=<file>``
they are also written there as JSON (``RELIABILITY.md`` quotes such a run).

This is not ``conftest.py`` on purpose: the figures belong to these suites only,
and ``tests/conftest.py`` is shared by everyone.

Two more things live here because all four suites need them:

- :class:`TaskAudit`, a ``trio.abc.Instrument`` that counts task spawns and
  exits, so a test can assert that no task it started is still alive;
- the *slow gate*: a test marked ``@pytest.mark.slow`` runs only when the
  ``-m`` expression selects slow tests explicitly (``-m slow``,
  ``nox -s slow``); a bare ``pytest tests/test_corpus.py`` skips it, so the
  default run stays short whether or not ``-m 'not slow'`` is given.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.lowlevel
import trio.testing

__all__ = ["FIGURES", "Figures", "TaskAudit", "child_processes", "reliability_session", "slow_gate", "task_audit"]


@attrs.define
class Figures:
    """Counters of one test session (every figure RELIABILITY.md reports)."""

    corpus_cases: int = 0  # hostile inputs the corpus tried (each a full call or schema check)
    fuzz_examples: int = 0  # generated inputs the fuzz targets tried
    faults_injected: int = 0  # faulty plugin / listener / observer / finalizer behaviours
    storm_calls: int = 0  # calls executed by the cancellation storms
    cancellations: int = 0  # signals fired (or pre-fired) by the storms and hang tests
    results: int = 0  # results received from the pipeline in these suites
    results_lost: int = 0  # calls without exactly one result and one dsh_result notification
    bodies_not_drained: int = 0  # tool bodies still running when their result arrived
    tasks_spawned: int = 0  # trio tasks spawned while a TaskAudit was watching
    tasks_leaked: int = 0  # of those, tasks still alive when the audit ended
    processes_leaked: int = 0  # child processes alive at the end that were not there at the start
    started: float = attrs.field(factory=time.monotonic)

    def as_dict(self) -> dict[str, Any]:
        data = attrs.asdict(self)
        data["seconds"] = round(time.monotonic() - data.pop("started"), 1)
        return data


FIGURES = Figures()


def child_processes() -> set[int]:
    """PIDs of this process's live children (Linux ``/proc``; empty elsewhere)."""
    children: set[int] = set()
    for path in Path(f"/proc/{os.getpid()}/task").glob("*/children"):
        try:
            children.update(int(pid) for pid in path.read_text().split())
        except OSError:
            continue
    return children


class _SummaryPlugin:
    """Prints FIGURES after the run (registered once, by the first test that needs it)."""

    name = "dsh-reliability-summary"

    def __init__(self) -> None:
        self.baseline = child_processes()

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        FIGURES.processes_leaked = len(child_processes() - self.baseline)
        figures = FIGURES.as_dict()
        terminalreporter.section("dsh reliability figures")
        for key, value in figures.items():
            terminalreporter.write_line(f"{key:>20}: {value}")
        target = os.environ.get("DSH_RELIABILITY_JSON")
        if target:
            Path(target).write_text(json.dumps(figures, indent=2) + "\n")


@pytest.fixture(scope="session", autouse=True)
def reliability_session(request: pytest.FixtureRequest) -> Figures:
    """Make sure the summary plugin is registered; returns the shared figures."""
    manager = request.config.pluginmanager
    if not manager.has_plugin(_SummaryPlugin.name):
        manager.register(_SummaryPlugin(), _SummaryPlugin.name)
    return FIGURES


def _selects_slow(markexpr: str) -> bool:
    # "slow" named without a "not" in front of it: "-m slow", "-m 'slow or fuzz'".
    words = markexpr.replace("(", " ").replace(")", " ").split()
    return any(word == "slow" and (index == 0 or words[index - 1] != "not") for index, word in enumerate(words))


@pytest.fixture(autouse=True)
def slow_gate(request: pytest.FixtureRequest) -> None:
    """Skip ``@pytest.mark.slow`` tests unless ``-m`` selects them explicitly."""
    if request.node.get_closest_marker("slow") is None:
        return
    if not _selects_slow(request.config.getoption("markexpr") or ""):
        pytest.skip("slow variant: run with -m slow (nox -s slow)")


class TaskAudit(trio.abc.Instrument):
    """Counts the trio tasks spawned and exited while it is installed.

    ``live`` holds tasks spawned since installation that have not exited yet:
    after the work under audit is over it must be empty, or a task leaked.
    """

    def __init__(self) -> None:
        self.spawned = 0
        self.exited = 0
        self.live: set[trio.lowlevel.Task] = set()

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        self.spawned += 1
        self.live.add(task)

    def task_exited(self, task: trio.lowlevel.Task) -> None:
        self.exited += 1
        self.live.discard(task)

    def __enter__(self) -> TaskAudit:
        trio.lowlevel.add_instrument(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        trio.lowlevel.remove_instrument(self)
        FIGURES.tasks_spawned += self.spawned
        FIGURES.tasks_leaked += len(self.live)


@pytest.fixture
async def task_audit() -> AsyncIterator[TaskAudit]:
    """A TaskAudit around one async test; fails the test if a task it spawned outlives it.

    pytest-trio runs the test in its own task, spawned before this fixture's
    teardown begins and exited by then, so it does not count as a leak.
    """
    with TaskAudit() as audit:
        yield audit
        # Give tasks that are merely finishing their last step one scheduling round.
        await trio.testing.wait_all_tasks_blocked()
        leaked = {task.name for task in audit.live if task is not trio.lowlevel.current_task()}
    assert not leaked, f"tasks still running after the test: {sorted(leaked)}"
