"""``python -m benchmarks``: run the selected groups and print one table of ratios."""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from collections.abc import Sequence

import attrs

from . import GROUPS
from ._harness import (
    CLOCKS,
    BenchmarkFailure,
    Case,
    Settings,
    compute_rows,
    machine_description,
    render_table,
    run_cases,
)


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--smoke", action="store_true", help="tiny iteration counts (CI: keeps the code alive, < 60 s); "
                        "without --only, the --profile code runs too")  # fmt: skip
    parser.add_argument("--only", metavar="GROUP,...", help=f"groups to run (of {', '.join(GROUPS)}); "
                        "the cases their ratios refer to run too")  # fmt: skip
    parser.add_argument("--json", metavar="FILE", help="also write every row and repeat to FILE")
    parser.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="cpu",
        help="cpu: this process's CPU time (default, robust on a shared machine); wall: perf_counter",
    )
    parser.add_argument("--passes", type=int, metavar="N", help="passes over the suite, pooled (default 3)")
    parser.add_argument("--profile", action="store_true", help="profile the pipeline hot path instead")
    args = parser.parse_args(argv)
    if args.only:
        unknown = [name for name in args.only.split(",") if name not in GROUPS]
        if unknown:
            parser.error(f"unknown group(s) {', '.join(unknown)}; choose from {', '.join(GROUPS)}")
    if args.passes is not None and args.passes < 1:
        parser.error("--passes must be at least 1")
    return args


def select(groups: Sequence[str], *, smoke: bool) -> list[Case]:
    """The cases of ``groups`` plus every case their ratios and sums need, in run order."""
    built: dict[str, dict[str, Case]] = {}

    def group(name: str) -> dict[str, Case]:
        if name not in built:
            module = importlib.import_module(f"{__package__}.{name}")
            built[name] = {case.key: case for case in module.cases(smoke)}
        return built[name]

    wanted: set[str] = set()
    pending = [key for name in groups for key in group(name)]
    while pending:
        key = pending.pop()
        if key in wanted:
            continue
        wanted.add(key)
        case = group(key.split(".", 1)[0]).get(key)
        if case is None:
            raise LookupError(f"a benchmark refers to the unknown case {key!r}")
        pending.extend(case.needs)
    return [case for name in GROUPS if name in built for key, case in built[name].items() if key in wanted]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmarks; 1 when a case could not be measured as declared (the reason on stderr)."""
    try:
        return _run(_parse(argv))
    except BenchmarkFailure as failure:
        print(f"benchmarks: FAILED, these cases cannot run as declared:\n{failure}", file=sys.stderr, flush=True)
        return 1


def _run(args: argparse.Namespace) -> int:
    settings = attrs.evolve(Settings.for_smoke() if args.smoke else Settings(), clock=args.clock)
    if args.passes is not None:
        settings = attrs.evolve(settings, passes=args.passes)
    if args.profile:
        from ._profile import profile

        profile(smoke=args.smoke)
        return 0

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    started = time.perf_counter()
    groups = args.only.split(",") if args.only else list(GROUPS)
    cases = select(groups, smoke=args.smoke)
    log(f"benchmarks: {len(cases)} cases, {settings.passes} pass(es) x {settings.repeats} repeat(s)")
    run_cases(cases, settings, log=log)
    rows = compute_rows(cases)
    machine = machine_description()
    wall = time.perf_counter() - started
    print(
        f"dsh-tools benchmarks: Python {machine['python']} ({machine['implementation']}, {machine['build']}), "
        f"trio {machine['trio']}, {machine['cpus']} CPUs, {machine['platform']}"
    )
    print(
        f"{settings.passes} pass(es) x {settings.repeats} repeat(s) pooled, {settings.clock} clock "
        f"(Code Mode rows: wall), {wall:.0f} s wall"
        + ("; SMOKE RUN: figures are not meaningful" if settings.smoke else "")
    )
    print()
    print(render_table(rows))
    if args.json:
        document = {
            "machine": machine,
            "settings": attrs.asdict(settings),
            "wall_seconds": wall,
            "rows": [attrs.asdict(row) for row in rows],
        }
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump(document, file, indent=1, ensure_ascii=False)
            file.write("\n")
    if settings.smoke and not args.only:
        # The profile has its own code (the breakdown reaches into private functions): keep it alive too.
        from ._profile import profile

        print()
        profile(smoke=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
