"""The hostile-input corpus (``tests/corpus/``): every case gets exactly the outcome it pins.

A call case must come back as a structured result (never an exception, never
a ``RecursionError``) with the exact code and message, and the same runtime
must still serve an ordinary call afterwards. Schema cases must raise exactly
the documented error with exactly the listed violations. Large variants are
``@pytest.mark.slow`` (run them with ``-m slow``).
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
from conftest_reliability import *  # noqa: F403 - fixtures and FIGURES
from conftest_reliability import FIGURES
from corpus import CallCase, Case, SchemaCase, SnapshotCase, all_cases
from corpus.regressions import HUGE_INT
from corpus.tools import build_runtime

from dsh_core import (
    JsonSchemaError,
    NonJsonValueError,
    SchemaSpecError,
    ToolDefinition,
    ToolExecutionFailure,
    ToolExecutionInput,
    ToolExecutionSuccess,
    ToolOutput,
    ToolRuntime,
    define_tool,
    json_equal,
    snapshot_json,
)
from dsh_core.schema import (
    assert_object_json_schema,
    assert_supported_json_schema,
    parameter_schema_to_json_schema,
    value_schema_to_json_schema,
)
from dsh_core.testing import make_input

CASES = all_cases()

_RUNTIME: ToolRuntime | None = None


def runtime() -> ToolRuntime:
    """One runtime for the whole module: every hostile case must leave it serving."""
    global _RUNTIME
    if _RUNTIME is None:
        _RUNTIME = build_runtime()
    return _RUNTIME


def _param(case: Case) -> Any:
    marks = []
    if case.slow:
        marks.append(pytest.mark.slow)
    if case.xfail:
        marks.append(pytest.mark.xfail(reason=case.xfail, strict=True))
    return pytest.param(case, id=case.id, marks=marks)


def _of(kind: type) -> list[Any]:
    return [_param(case) for case in CASES if isinstance(case, kind)]


def test_corpus_is_big_enough() -> None:
    fast = [case for case in CASES if not case.slow]
    assert len(fast) >= 500, len(fast)
    assert len({case.id for case in CASES}) == len(CASES)


async def _assert_still_serving(rt: ToolRuntime) -> None:
    result = await rt.execute(make_input("echo", {"ok": [1, "two"]}))
    assert isinstance(result, ToolExecutionSuccess), result.error
    assert json_equal(result.value, {"ok": [1, "two"]})
    FIGURES.results += 1


def _check_message(message: str, case: CallCase) -> None:
    expected = case.message() if callable(case.message) else case.message
    if expected is not None and message != expected:
        # Compare on a readable excerpt: some messages are megabytes long.
        at = next((i for i, (a, b) in enumerate(zip(message, expected, strict=False)) if a != b), None)
        at = min(len(message), len(expected)) if at is None else at
        pytest.fail(
            f"message differs at character {at} (lengths {len(message)} vs {len(expected)}):\n"
            f"  got:      {message[max(0, at - 60) : at + 60]!r}\n"
            f"  expected: {expected[max(0, at - 60) : at + 60]!r}"
        )
    position = 0
    for fragment in case.contains:
        found = message.find(fragment, position)
        assert found >= 0, f"{fragment!r} not in message {message[:300]!r}"
        position = found + len(fragment)


@pytest.mark.parametrize("case", _of(CallCase))
# A root string is a model's (hostile) arguments here, not a host passing provider text along.
@pytest.mark.filterwarnings("ignore:ToolExecutionInput.arguments is a str")
async def test_call_case(case: CallCase) -> None:
    FIGURES.corpus_cases += 1
    rt = runtime()
    request = ToolExecutionInput(
        call_id=f"corpus-{case.id}", name=case.tool, arguments=case.build(), signal=make_input("x").signal
    )
    result = await rt.execute(request)
    FIGURES.results += 1
    if case.code is None:
        assert isinstance(result, ToolExecutionSuccess), result.error.message[:500]  # type: ignore[union-attr]
        if case.value is not None:
            assert json_equal(result.value, case.value()), "value differs from the expected echo"
    else:
        assert isinstance(result, ToolExecutionFailure), "expected a failure, got a success"
        info = result.error.info
        assert info is not None, result.error.message[:500]
        assert (info.code, info.name) == (case.code, case.name or info.name), result.error.message[:500]
        _check_message(result.error.message, case)
        assert len(result.content) == 1 and result.content[0].text == "Error: " + result.error.message  # type: ignore[union-attr]
    await _assert_still_serving(rt)


def _run_schema_target(case: SchemaCase, schema: object) -> None:
    match case.target:
        case "assert":
            assert_supported_json_schema(schema)
        case "assert_object":
            assert_object_json_schema(schema)
        case "value_dsl":
            value_schema_to_json_schema(schema)
        case "parameter_dsl":
            parameter_schema_to_json_schema(schema)
        case "define_tool":
            define_tool(name="corpus_tool", description="", parameters=schema, output={"type": "json"}, execute=_body)  # type: ignore[arg-type]
        case "register" | "register_output":
            parameters, output = (schema, {}) if case.target == "register" else ({"type": "object"}, schema)
            definition = ToolDefinition(
                name="corpus_tool",
                description="",
                parameters=parameters,  # type: ignore[arg-type]
                output=ToolOutput(schema=output),  # type: ignore[arg-type]
                execute=_body,
            )
            disposer = runtime().register(definition)
            disposer()  # a case that registers cleanly leaves nothing behind
        case _:  # pragma: no cover - a typo in a case file
            raise AssertionError(f"unknown target {case.target!r}")


async def _body(args: object) -> object:
    return args


@pytest.mark.parametrize("case", _of(SchemaCase))
async def test_schema_case(case: SchemaCase) -> None:
    FIGURES.corpus_cases += 1
    schema = case.build()
    if case.error is None:
        _run_schema_target(case, schema)
    else:
        expected = JsonSchemaError if case.error == "JsonSchemaError" else SchemaSpecError
        with pytest.raises(expected) as raised:
            _run_schema_target(case, schema)
        assert type(raised.value) is expected
        violations = list(raised.value.violations)
        if case.target in ("register", "register_output"):
            prefix = 'tool "corpus_tool" ' + ("parameters: " if case.target == "register" else "output: ")
            assert all(v.startswith(prefix) for v in violations), violations[:3]
            violations = [v[len(prefix) :] for v in violations]
        if case.target == "define_tool" and case.error == "SchemaSpecError":
            prefix = 'define_tool("corpus_tool") parameters: '
            assert all(v.startswith(prefix) for v in violations), violations[:3]
            violations = [v[len(prefix) :] for v in violations]
        if case.violations is not None:
            assert violations == list(case.violations)
        if case.count is not None:
            assert len(violations) == case.count, violations[:3]
        joined = "\n".join(violations)
        for fragment in case.contains:
            assert fragment in joined, (fragment, joined[:300])
    await _assert_still_serving(runtime())


@pytest.mark.parametrize("case", _of(SnapshotCase))
def test_snapshot_case(case: SnapshotCase) -> None:
    FIGURES.corpus_cases += 1
    value = case.build()
    if case.path is None:
        assert json_equal(snapshot_json(value), value)
        return
    with pytest.raises(NonJsonValueError) as raised:
        snapshot_json(value)
    assert raised.value.path == case.path
    if case.problem is not None:
        assert str(raised.value) == f"{case.path}: {case.problem}"
    else:
        assert str(raised.value).startswith(f"{case.path}: ")


# -- R5: ints beyond json.dumps' 4 300-digit limit in schemas (see corpus/regressions.py) ------------


def test_huge_int_const_is_a_schema_error() -> None:
    FIGURES.corpus_cases += 1
    with pytest.raises((SchemaSpecError, JsonSchemaError)):
        define_tool(
            name="huge",
            description="",
            parameters={"n": {"type": "integer", "const": HUGE_INT}},
            output={"type": "json"},
            execute=_body,
        )


async def test_huge_int_annotation_never_breaks_the_runtime() -> None:
    FIGURES.corpus_cases += 1
    rt = build_runtime()
    try:
        rt.register(
            ToolDefinition(
                name="huge",
                description="",
                parameters={"type": "object", "properties": {"n": {"type": "integer", "default": HUGE_INT}}},
                output=ToolOutput(schema={}),
                execute=_body,
            )
        )
    except (JsonSchemaError, NonJsonValueError):
        pass  # refusing the definition (or its registration) is the right outcome
    else:
        result = await rt.execute(make_input("huge", {}))
        assert result is not None
    assert [schema.name for schema in rt.schemas()]  # the other tools are still listed
    await _assert_still_serving(rt)


def test_recursion_limit_is_untouched() -> None:
    # The deep cases must not have passed by raising the interpreter's limit.
    assert sys.getrecursionlimit() <= 10_000
