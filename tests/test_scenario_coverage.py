"""The scenario catalogue's traceability map stays true.

``tests/SCENARIO_COVERAGE.txt`` maps every entry of the original's test catalogue
(``SCENARIOS.md``, 387 entries) to the tests that cover it, or says why it does
not apply to this port. This test keeps the map from rotting: every entry
appears exactly once, and every test it names exists.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterable
from pathlib import Path

TESTS = Path(__file__).parent
COVERAGE = TESTS / "SCENARIO_COVERAGE.txt"
ENTRIES = 387
STATUSES = frozenset({"covered", "added", "adapted", "fixed", "n/a"})
_LINE = re.compile(r"^S(\d+) \| ([a-z/]+) \| (.+)$")


def _rows(text: str) -> list[tuple[int, str, str]]:
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        match = _LINE.match(line)
        assert match is not None, f"line {number} is not 'S<n> | <status> | <tests or reason>': {line!r}"
        rows.append((int(match.group(1)), match.group(2), match.group(3)))
    return rows


@functools.cache
def _test_names(path: Path) -> frozenset[str]:
    """The tests pytest collects from ``path``: module-level ``test_*`` functions and ``Test*`` class methods.

    (A nested ``test_*`` helper or a method of another class is never collected, so it covers nothing.)
    """
    tree = ast.parse(path.read_text(encoding="utf-8"))
    functions = ast.FunctionDef | ast.AsyncFunctionDef
    names = {node.name for node in tree.body if isinstance(node, functions) and node.name.startswith("test_")}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            names.update(
                item.name for item in node.body if isinstance(item, functions) and item.name.startswith("test_")
            )
    return frozenset(names)


def _problems(rows: Iterable[tuple[int, str, str]], entries: int = ENTRIES) -> list[str]:
    rows = list(rows)
    problems = []
    numbers = sorted(number for number, _, _ in rows)
    if numbers != list(range(1, entries + 1)):
        missing = sorted(set(range(1, entries + 1)) - set(numbers))
        repeated = sorted({number for number in numbers if numbers.count(number) > 1})
        problems.append(f"entries missing {missing}, repeated {repeated}")
    for number, status, rest in rows:
        if status not in STATUSES:
            problems.append(f"S{number}: unknown status {status!r}")
            continue
        tests, _, note = rest.partition(" | ")
        if status == "n/a":
            if len(tests.strip()) < 10:
                problems.append(f"S{number}: n/a needs a reason")
            continue
        if status in {"adapted", "fixed"} and not note.strip():
            problems.append(f"S{number}: {status} needs a note saying how")
        for ref in (part.strip() for part in tests.split(",")):
            file, sep, name = ref.partition("::")
            path = TESTS.parent / file
            if not sep or not file.startswith("tests/") or not path.is_file():
                problems.append(f"S{number}: {ref!r} is not tests/<file>.py::<test>")
            elif name.split("[")[0] not in _test_names(path):
                problems.append(f"S{number}: {ref!r} does not exist")
    return problems


def test_every_entry_is_mapped_once_to_tests_that_exist() -> None:
    assert _problems(_rows(COVERAGE.read_text(encoding="utf-8"))) == []


def test_the_checks_catch_a_stale_map() -> None:
    this = "tests/test_scenario_coverage.py"
    rows = [
        (1, "covered", f"{this}::test_the_checks_catch_a_stale_map"),
        (2, "added", f"{this}::test_that_was_renamed"),
        (2, "n/a", "short"),
        (4, "fixed", f"{this}::test_every_entry_is_mapped_once_to_tests_that_exist"),
        (5, "done", "x"),
    ]
    assert _problems(rows, entries=5) == [
        "entries missing [3], repeated [2]",
        f"S2: '{this}::test_that_was_renamed' does not exist",
        "S2: n/a needs a reason",
        "S4: fixed needs a note saying how",
        "S5: unknown status 'done'",
    ]


def test_only_collected_tests_count(tmp_path: Path) -> None:
    source = tmp_path / "test_sample.py"
    source.write_text(
        "def test_top(): pass\n"
        "async def test_async_top(): pass\n"
        "class TestGroup:\n    def test_method(self): pass\n"
        "class Helper:\n    def test_not_collected_method(self): pass\n"
        "def helper():\n    def test_nested(): pass\n",
        encoding="utf-8",
    )
    assert _test_names(source) == {"test_top", "test_async_top", "test_method"}
