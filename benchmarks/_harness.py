"""The measuring loop, pooled statistics and the result table behind ``python -m benchmarks``.

A benchmark is a *case* with a stable key (``pipeline.l0``). Timed cases are
statements compiled into a ``for`` loop, the way ``timeit`` does it, and run
synchronously, under ``trio.run`` or under ``asyncio.run``; each repeat reports
µs per unit of work. The whole suite runs ``passes`` times in one process and
every repeat of every pass is pooled: *median* is the median of all repeats,
*min* the steadiest estimate of intrinsic cost (target verdicts use it).
Derived cases (the physical limit, an overhead) are computed from other
cases' medians and minimums.

Every figure is shown next to a ratio against another case of the same run
(``vs``), because only ratios carry over between machines and interpreters.
Targets are displayed as pass/miss and never asserted: ``--smoke`` runs use a
handful of iterations so that CI keeps the code alive, not to judge speed.

What is asserted is that every case measures what it claims: a case whose setup
raises, or whose statement (run once before timing) does not return what the
case's ``expect`` wants, fails the run with :class:`BenchmarkFailure`. A timed
failure (an unknown tool, an error string) is often cheaper than the success it
stands in for, so it would otherwise show up as a fast, passing row.
"""

from __future__ import annotations

import ast
import asyncio
import gc
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, TypeAlias

import attrs
import trio

__all__ = [
    "CLOCKS",
    "NO_VERDICT",
    "Bench",
    "BenchmarkFailure",
    "Case",
    "Clock",
    "Derived",
    "Expect",
    "LoopTimer",
    "Once",
    "Row",
    "Settings",
    "Skipped",
    "Target",
    "Timer",
    "compute_rows",
    "loop_timer",
    "machine_description",
    "render_table",
    "run_cases",
]

Runner: TypeAlias = Literal["sync", "trio", "asyncio"]
Clock: TypeAlias = Callable[[], float]
Timer: TypeAlias = Callable[[int, Clock], float]
"""``timer(n, clock)`` runs ``n`` iterations and returns the seconds ``clock`` saw pass in the timed part."""
Expect: TypeAlias = Callable[[Any], "str | None"]
"""``expect(value)``: why ``value`` is not what one iteration of the case must produce, or ``None``."""

NO_VERDICT = "no verdict: baseline <= 0 (noise)"
"""Shown instead of a ratio's verdict when the baseline came out <= 0: a derived
floor whose subtracted pieces outweigh it, as happens in a smoke run's noise."""


class BenchmarkFailure(Exception):
    """A case could not be measured as declared; the message names every such case and why."""


CLOCKS: dict[str, Clock] = {"cpu": time.process_time, "wall": time.perf_counter}
"""``cpu`` (default): this process's CPU time, so time spent descheduled on a shared
machine is not counted; ``wall``: ``perf_counter``. Cases that wait on other
processes (Code Mode) always use ``wall``."""


@attrs.frozen(kw_only=True)
class Settings:
    """How long and how often every timed case runs."""

    smoke: bool = False
    clock: str = "cpu"
    passes: int = 3
    repeats: int = 5
    repeat_seconds: float = 0.1  # calibration aims one repeat at this duration
    max_iterations: int = 1_000_000
    smoke_iterations: int = 2

    @classmethod
    def for_smoke(cls) -> Settings:
        return cls(smoke=True, passes=1, repeats=1, repeat_seconds=0.0)


@attrs.frozen(kw_only=True)
class Target:
    """A goal shown as pass/miss: the ratio (or, when ``absolute``, the value itself) must be ≤ ``limit``.

    ``at_least`` turns it around (≥ ``limit``): a peer's ratio to ours must be at
    least 1 for us to be the faster one.
    """

    limit: float
    absolute: bool = False
    at_least: bool = False

    def describe(self, unit: str) -> str:
        sign = "≥" if self.at_least else "≤"
        return f"{sign} {self.limit:g} {unit}" if self.absolute else f"{sign} {self.limit:g}×"

    def met(self, value: float, ratio: float | None) -> bool | None:
        measured = value if self.absolute else ratio
        if measured is None:
            return None
        return measured >= self.limit if self.at_least else measured <= self.limit


@attrs.frozen
class LoopTimer:
    """A :data:`Timer` that can also run its statement once and hand back what it produced."""

    loop: Timer
    once: Callable[[], Any]

    def __call__(self, n: int, clock: Clock) -> float:
        return self.loop(n, clock)


def loop_timer(
    stmt: str, namespace: dict[str, Any], runner: Runner = "sync", *, result: str | None = None
) -> LoopTimer:
    """Compile ``stmt`` into a timed ``for`` loop over ``namespace`` (its globals).

    The loop's own cost (0.02-0.03 µs per iteration) is included; the
    ``limit.loop``/``limit.aloop`` cases measure it for the sums that subtract it.
    ``once()`` evaluates ``result`` (default: ``stmt`` itself, when it is an
    expression) outside the timed loop, so a case can check what it times.
    """
    prefix = "" if runner == "sync" else "async "
    if result is None:
        try:
            ast.parse(stmt, mode="eval")
        except SyntaxError:
            pass  # a statement: once() runs it and returns None
        else:
            result = stmt
    once_body = f"return {result}" if result is not None else f"{stmt}\n    return None"
    source = (
        f"{prefix}def _bench_loop(_n, _clock):\n"
        "    _start = _clock()\n"
        "    for _ in range(_n):\n"
        f"        {stmt}\n"
        "    return _clock() - _start\n"
        f"{prefix}def _bench_once():\n"
        f"    {once_body}\n"
    )
    exec(compile(source, f"<bench: {stmt}>", "exec"), namespace)
    loop = namespace["_bench_loop"]
    once = namespace["_bench_once"]
    if runner == "sync":
        return LoopTimer(lambda n, clock: float(loop(n, clock)), once)
    if runner == "trio":
        return LoopTimer(lambda n, clock: float(trio.run(loop, n, clock)), lambda: trio.run(once))
    return LoopTimer(lambda n, clock: float(asyncio.run(loop(n, clock))), lambda: asyncio.run(once()))


@attrs.define(kw_only=True, eq=False)
class Bench:
    """A timed case. ``setup()`` builds its timer once, before any timing starts.

    ``per`` is how many units of work one iteration does (1 000 calls per
    ``run_tool_calls`` iteration, say); figures are µs per unit. ``expect``
    checks what one iteration produces before any timing (the timer must be a
    :class:`LoopTimer`).
    """

    key: str
    label: str
    setup: Callable[[], Timer]
    per: int = 1
    vs: str | None = None
    target: Target | None = None
    note: str | None = None
    unit: str = "µs"
    wall_clock: bool = False  # the work waits on another process: CPU time would miss it
    expect: Expect | None = None
    timer: Timer | None = attrs.field(default=None, init=False)
    iterations: int = attrs.field(default=0, init=False)
    samples: list[float] = attrs.field(factory=list, init=False)

    @property
    def needs(self) -> tuple[str, ...]:
        return (self.vs,) if self.vs else ()

    def clock(self, settings: Settings) -> Clock:
        return CLOCKS["wall" if self.wall_clock else settings.clock]

    def prepare(self, settings: Settings) -> None:
        self.timer = self.setup()
        if self.expect is not None:
            if not isinstance(self.timer, LoopTimer):
                raise TypeError("the case declares an expected result, but its timer cannot run its statement once")
            problem = self.expect(self.timer.once())
            if problem is not None:
                raise BenchmarkFailure(problem)
        self.timer(1, self.clock(settings))  # warm-up: first-call caches, imports, compiled validators
        self.iterations = settings.smoke_iterations if settings.smoke else self._calibrate(settings)

    def _calibrate(self, settings: Settings) -> int:
        assert self.timer is not None
        clock = self.clock(settings)
        n = 1
        while True:
            elapsed = self.timer(n, clock)
            if elapsed >= 0.01 or n >= settings.max_iterations:
                break
            n = min(n * 10, settings.max_iterations)
        wanted = math.ceil(n * settings.repeat_seconds / max(elapsed, 1e-9))
        return max(1, min(settings.max_iterations, wanted))

    def run(self, settings: Settings) -> None:
        assert self.timer is not None
        clock = self.clock(settings)
        for _ in range(settings.repeats):
            elapsed = self.timer(self.iterations, clock)
            self.samples.append(elapsed * 1e6 / (self.iterations * self.per))


@attrs.define(kw_only=True, eq=False)
class Derived:
    """A case computed from other cases' statistics (applied to medians, then to minimums)."""

    key: str
    label: str
    inputs: tuple[str, ...]
    compute: Callable[[Mapping[str, float]], float]
    vs: str | None = None
    target: Target | None = None
    note: str | None = None
    unit: str = "µs"

    @property
    def needs(self) -> tuple[str, ...]:
        return (*self.inputs, *((self.vs,) if self.vs else ()))


@attrs.define(kw_only=True, eq=False)
class Once:
    """A quantity measured once, before timing starts (memory, say)."""

    key: str
    label: str
    measure: Callable[[], float]
    vs: str | None = None
    target: Target | None = None
    note: str | None = None
    unit: str = "B"
    value: float | None = attrs.field(default=None, init=False)

    @property
    def needs(self) -> tuple[str, ...]:
        return (self.vs,) if self.vs else ()

    def prepare(self, settings: Settings) -> None:
        self.value = self.measure()


@attrs.define(kw_only=True, eq=False)
class Skipped:
    """A case that cannot run here: a peer whose distribution is not installed.

    Never for first-party code: it ships with the package, so a first-party case
    that cannot run is a failure of the run, not a skipped row.
    """

    key: str
    label: str
    note: str
    unit: str = "µs"

    @property
    def needs(self) -> tuple[str, ...]:
        return ()


Case: TypeAlias = Bench | Derived | Once | Skipped


@attrs.frozen(kw_only=True)
class Row:
    """One line of the result table (and of the ``--json`` file)."""

    key: str
    group: str
    label: str
    unit: str
    median: float | None
    low: float | None
    high: float | None
    ratio: float | None  # median / the baseline's median
    ratio_min: float | None  # minimum / the baseline's minimum: what the target verdict uses
    vs: str | None
    target: str | None
    status: str | None  # "pass", "MISS", NO_VERDICT (a ratio whose baseline is <= 0) or None
    note: str | None
    samples: tuple[float, ...] = ()
    iterations: int = 0


def run_cases(cases: Sequence[Case], settings: Settings, *, log: Callable[[str], None]) -> None:
    """Prepare every case, freeze the heap, then time every pass (all of it in this process).

    Raises :class:`BenchmarkFailure` naming every case whose preparation failed
    (setup raised, or its result was not the expected one) before timing any.
    """
    failures: list[str] = []
    for case in cases:
        if isinstance(case, (Bench, Once)):
            log(f"  setup {case.key}")
            try:
                case.prepare(settings)
            except Exception as exc:
                reason = str(exc) if isinstance(exc, BenchmarkFailure) else f"{type(exc).__name__}: {exc}"
                failures.append(f"{case.key} ({case.label}): {reason}")
    if failures:
        raise BenchmarkFailure("\n".join(failures))
    # The imports and fixtures above are permanent for the run: keep gen-2
    # collections from rescanning them while timing (see PERF-ANCHORS.md).
    gc.collect()
    gc.freeze()
    benches = [case for case in cases if isinstance(case, Bench)]
    for index in range(settings.passes):
        log(f"  pass {index + 1}/{settings.passes}")
        for bench in benches:
            bench.run(settings)


def compute_rows(cases: Sequence[Case]) -> list[Row]:
    """Statistics, ratios and target verdicts for every case, in the given order."""
    medians: dict[str, float] = {}
    lows: dict[str, float] = {}
    highs: dict[str, float] = {}
    for case in cases:
        if isinstance(case, Bench) and case.samples:
            medians[case.key] = statistics.median(case.samples)
            lows[case.key] = min(case.samples)
            highs[case.key] = max(case.samples)
        elif isinstance(case, Once) and case.value is not None:
            medians[case.key] = lows[case.key] = highs[case.key] = case.value
        elif isinstance(case, Derived) and all(key in medians for key in case.inputs):
            medians[case.key] = case.compute(medians)
            lows[case.key] = case.compute(lows)

    def ratio_of(stats: Mapping[str, float], key: str, vs: str | None) -> float | None:
        if key not in stats or vs is None or vs not in stats or stats[vs] <= 0:
            return None
        return stats[key] / stats[vs]

    def baseline_not_positive(stats: Mapping[str, float], key: str, vs: str | None) -> bool:
        return key in stats and vs is not None and vs in stats and stats[vs] <= 0

    rows: list[Row] = []
    for case in cases:
        median = medians.get(case.key)
        low = lows.get(case.key)
        vs = getattr(case, "vs", None)
        ratio_min = ratio_of(lows, case.key, vs)
        target: Target | None = getattr(case, "target", None)
        # Verdicts use the minimums: on a shared machine they are the steadiest estimate of intrinsic cost.
        verdict = target.met(low, ratio_min) if target is not None and low is not None else None
        status = None if verdict is None else ("pass" if verdict else "MISS")
        # A ratio missing for a baseline <= 0 must not read as "nothing to judge": say why there is none.
        if target is None:
            if baseline_not_positive(lows, case.key, vs) or baseline_not_positive(medians, case.key, vs):
                status = NO_VERDICT
        elif not target.absolute and baseline_not_positive(lows, case.key, vs):
            status = NO_VERDICT
        rows.append(
            Row(
                key=case.key,
                group=case.key.split(".", 1)[0],
                label=case.label,
                unit=case.unit,
                median=median,
                low=low,
                high=highs.get(case.key),
                ratio=ratio_of(medians, case.key, vs),
                ratio_min=ratio_min,
                vs=vs,
                target=target.describe(case.unit) if target is not None else None,
                status=status,
                note=case.note,
                samples=tuple(case.samples) if isinstance(case, Bench) else (),
                iterations=case.iterations if isinstance(case, Bench) else 0,
            )
        )
    return rows


def _number(value: float | None, unit: str) -> str:
    if value is None:
        return "–"
    if unit == "B":
        return f"{value:,.0f}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def _ratio(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.2f}×" if value < 10 else f"{value:.1f}×" if value < 100 else f"{value:,.0f}×"


def render_table(rows: Iterable[Row]) -> str:
    """One Markdown table for the whole run; notes become numbered footnotes under it."""
    lines = [
        "| group | case | median | min – max | unit | ratio | ratio of mins | vs | target (on mins) |",
        "|---|---|---:|---:|---|---:|---:|---|---|",
    ]
    notes: list[str] = []
    for row in rows:
        label = row.label
        if row.note:
            notes.append(row.note)
            label = f"{label} [{len(notes)}]"
        spread = "–" if row.low is None else _number(row.low, row.unit)
        if row.high is not None and row.high != row.low:
            spread += f" – {_number(row.high, row.unit)}"
        target = f"{row.target or ''} {row.status or ''}".strip()
        lines.append(
            f"| {row.group} | {label} | {_number(row.median, row.unit)} | {spread} | {row.unit} "
            f"| {_ratio(row.ratio)} | {_ratio(row.ratio_min)} | {row.vs or ''} | {target} |"
        )
    if notes:
        lines.append("")
        lines.extend(f"[{index}] {note}" for index, note in enumerate(notes, 1))
    return "\n".join(lines)


def machine_description() -> dict[str, Any]:
    """What the figures were measured on (the absolute µs depend on all of it)."""
    return {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "build": " ".join(platform.python_build()),
        "executable": sys.executable,
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "trio": trio.__version__,
    }
