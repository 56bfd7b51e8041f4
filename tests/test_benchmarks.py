"""``benchmarks/``: a case that cannot measure what it claims fails the run, naming the case.

CI runs ``python -m benchmarks --smoke`` so that the benchmark code cannot rot; these
tests pin what that run catches: a timed call that returns a failure, a first-party
module that no longer imports, an installed peer whose recipe broke, a profile block
that no longer runs. They also pin the table's marker for a baseline <= 0.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

REPO = Path(__file__).resolve().parent.parent
if importlib.util.find_spec("benchmarks") is None:  # a plain `pytest` from an sdist: the repo is not on sys.path
    sys.path.append(str(REPO))

import benchmarks.pipeline  # noqa: E402
from benchmarks import _profile, peers, scheduling  # noqa: E402
from benchmarks.__main__ import main  # noqa: E402
from benchmarks._fixtures import add_tool, make_input, runtime_with, succeeds_with  # noqa: E402
from benchmarks._harness import (  # noqa: E402
    NO_VERDICT,
    Bench,
    BenchmarkFailure,
    Derived,
    Settings,
    Skipped,
    Target,
    compute_rows,
    loop_timer,
    render_table,
    run_cases,
)


def _quiet(message: str) -> None:
    pass


def test_a_timed_call_that_fails_fails_the_run_naming_the_case() -> None:
    runtime = runtime_with()
    bench = Bench(
        key="pipeline.unknown",
        label="execute of a tool nobody registered",
        setup=lambda: loop_timer(
            "await runtime.execute(request)",
            {"runtime": runtime, "request": make_input("no_such_tool", {"a": 1, "b": 2})},
            "trio",
        ),
        expect=succeeds_with(3),
    )
    with pytest.raises(BenchmarkFailure) as failure:
        run_cases([bench], Settings.for_smoke(), log=_quiet)
    message = str(failure.value)
    assert message.startswith("pipeline.unknown (execute of a tool nobody registered): the call failed: ")
    assert 'unknown tool "no_such_tool"' in message and "(UNKNOWN_TOOL)" in message
    assert bench.samples == []  # nothing was timed


def test_a_wrong_value_fails_the_run_and_a_right_one_is_timed() -> None:
    def adder(body_result: int) -> Bench:
        async def body(args: Any) -> int:
            return body_result

        runtime = runtime_with(tools=[add_tool(execute=body)])
        request = make_input("add", {"a": 1, "b": 2})
        return Bench(
            key=f"add.returns{body_result}",
            label="add",
            setup=lambda: loop_timer(
                "await runtime.execute(request)", {"runtime": runtime, "request": request}, "trio"
            ),
            expect=succeeds_with(3),
        )

    wrong, right = adder(4), adder(3)
    with pytest.raises(BenchmarkFailure, match=r"^add\.returns4 \(add\): expected the value 3, got 4$"):
        run_cases([right, wrong], Settings.for_smoke(), log=_quiet)
    run_cases([right], Settings.for_smoke(), log=_quiet)
    assert len(right.samples) == 1


def test_main_exits_1_naming_the_failing_case(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = benchmarks.pipeline.make_input
    monkeypatch.setattr(benchmarks.pipeline, "make_input", lambda name, args, **kw: real("no_such_tool", args, **kw))
    assert main(["--smoke", "--only", "pipeline"]) == 1
    err = capsys.readouterr().err
    assert "benchmarks: FAILED, these cases cannot run as declared:" in err
    assert '\npipeline.l0 (execute, 0 listeners): the call failed: unknown tool "no_such_tool"' in err


def test_a_first_party_plugin_that_cannot_import_fails_the_run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "dsh_plugins.audit", None)  # an import of it raises ImportError
    assert main(["--smoke", "--only", "pipeline"]) == 1
    err = capsys.readouterr().err
    assert "\npipeline.audit (execute + audit plugin (JSON line to a tmp file)): ModuleNotFoundError: " in err
    assert "\npipeline.timeout_audit (" in err
    assert "\npipeline.timeout (" not in err  # the timeout plugin still imports: its rows ran


def test_a_peer_is_skipped_only_when_its_distribution_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(peers, "_version", lambda distribution: None)
    rows = peers.cases(smoke=True)
    assert rows and all(isinstance(row, Skipped) for row in rows)
    assert rows[0].note == (
        "skipped: mcp is not installed (pip install -r benchmarks/requirements-peers.txt)"  # type: ignore[union-attr]
    )

    # Installed, but the recipe's module moved: a failure, not a skipped row.
    monkeypatch.setattr(peers, "_version", lambda distribution: "2.3.0")
    monkeypatch.setattr(peers, "_PEERS", (("peers.mcp", "mcp", ("mcp.no_such_module",), peers._mcp_timer, "x"),))
    (case,) = peers.cases(smoke=True)
    assert isinstance(case, Bench)
    with pytest.raises(BenchmarkFailure, match=r"^peers\.mcp \(mcp\): ModuleNotFoundError: No module named 'mcp\."):
        run_cases([case], Settings.for_smoke(), log=_quiet)


def test_a_peer_returning_an_error_string_fails_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    async def error_string(modules: dict[str, Any]) -> str:
        return "An error occurred while running the tool. Please try again."

    def make(modules: dict[str, Any]) -> Any:
        return loop_timer("await call(None)", {"call": error_string}, "asyncio")

    monkeypatch.setattr(peers, "_version", lambda distribution: "0.24.0")
    monkeypatch.setattr(peers, "_PEERS", (("peers.openai_agents", "openai-agents", (), make, "x"),))
    (case,) = peers.cases(smoke=True)
    with pytest.raises(BenchmarkFailure, match=r"returned 'An error occurred while running the tool\. Please try"):
        run_cases([case], Settings.for_smoke(), log=_quiet)


def test_a_profile_block_that_no_longer_runs_fails_the_profile(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(_profile, "_BLOCKS", (*_profile._BLOCKS[:1], ("renamed", "P.no_such_function()", "sync")))
    with pytest.raises(BenchmarkFailure, match=r"^profile block 'renamed': AttributeError: .*no_such_function"):
        _profile._breakdown(iterations=2, best_of=1)
    out = capsys.readouterr().out
    assert "execute, 0 listeners (whole call)" in out and "n/a (AttributeError" in out


def test_the_scheduling_rows_measure_the_path_their_labels_name(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[object] = []
    start_soon = trio.Nursery.start_soon

    def counting(self: trio.Nursery, fn: Any, *args: Any, **kwargs: Any) -> None:
        started.append(fn)
        start_soon(self, fn, *args, **kwargs)

    monkeypatch.setattr(trio.Nursery, "start_soon", counting)
    inline = scheduling._parallel_timer()
    suspending = scheduling._parallel_timer(scheduling.add_body_suspending)
    assert len(inline.once()) == scheduling.CALLS
    inline_tasks = len(started)
    started.clear()
    assert len(suspending.once()) == scheduling.CALLS
    assert inline_tasks <= 1  # the commit task alone: every call ran inline
    assert len(started) >= scheduling.CALLS  # a task per call


def test_a_baseline_at_or_below_zero_says_there_is_no_verdict() -> None:
    base = Bench(key="g.base", label="base", setup=lambda: loop_timer("pass", {}))
    base.samples = [1.0]
    cases = [
        base,
        Derived(key="g.floor", label="floor", inputs=("g.base",), compute=lambda stats: stats["g.base"] - 2.0),
        Derived(
            key="g.judged",
            label="judged",
            inputs=("g.base",),
            compute=lambda stats: 1.0,
            vs="g.floor",
            target=Target(limit=1.5),
        ),
        Derived(key="g.shown", label="shown", inputs=("g.base",), compute=lambda stats: 1.0, vs="g.floor"),
        Derived(
            key="g.fine",
            label="fine",
            inputs=("g.base",),
            compute=lambda stats: 1.0,
            vs="g.base",
            target=Target(limit=1.5),
        ),
    ]
    rows = {row.key: row for row in compute_rows(cases)}
    assert rows["g.judged"].ratio_min is None and rows["g.judged"].status == NO_VERDICT
    assert rows["g.shown"].status == NO_VERDICT
    assert rows["g.fine"].status == "pass"
    table = render_table(rows.values())
    assert "| g | judged | 1.00 | 1.00 | µs | – | – | g.floor | ≤ 1.5× no verdict: baseline <= 0 (noise) |" in table
    assert "| g | shown | 1.00 | 1.00 | µs | – | – | g.floor | no verdict: baseline <= 0 (noise) |" in table
