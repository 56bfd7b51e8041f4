"""The hostile-input corpus: every case with the precise outcome it must produce.

Cases come from four places, all collected by :func:`all_cases`:

- ``arguments.json`` and ``schemas.json``: hand-written cases whose inputs are
  plain JSON (unicode edge cases spelled as ``\\u`` escapes, lone surrogates
  included, which ``json.loads`` accepts);
- ``hostile_values.py``: hand-written cases that need Python objects JSON
  cannot spell (NaN, ``-0.0``, bytes, sets, subclasses, cycles, odd keys);
- ``generated.py``: cases built by code (a wrong value at every position of a
  nested schema, deep and big values, schemas with many errors, schemas
  1 000 levels deep);
- ``regressions.py``: inputs the fuzz targets or corpus work found crashing,
  kept so they stay fixed.

Three kinds of case:

- :class:`CallCase`: run one call on a runtime holding the corpus tools
  (``tools.py``) and expect either success (with the value) or a failure with
  an exact code and message (or message fragments, for messages megabytes long);
- :class:`SchemaCase`: run a schema check (``assert_supported_json_schema``,
  ``assert_object_json_schema``, a DSL compiler, ``define_tool`` or
  ``ToolRuntime.register``) and expect its exact error type and violations;
- :class:`SnapshotCase`: ``snapshot_json`` on a value, expecting a
  ``NonJsonValueError`` at an exact path (or success).

Inputs are built lazily (``build()``) so that collecting the corpus does not
allocate the 10 MB strings and 100 000-deep values.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

import attrs

__all__ = ["CallCase", "Case", "SchemaCase", "SnapshotCase", "all_cases", "const"]

HERE = Path(__file__).parent

SchemaTarget = Literal["assert", "assert_object", "value_dsl", "parameter_dsl", "define_tool", "register"]


def const(value: object) -> Callable[[], object]:
    """A builder for an input that is cheap to keep around."""
    return lambda: value


@attrs.frozen(kw_only=True)
class CallCase:
    """One call of corpus tool ``tool`` with ``build()`` as its arguments.

    ``code is None`` expects a success whose value is ``value`` (when given).
    Otherwise the failure must carry ``code`` and ``name`` in its info, and its
    message must equal ``message`` (when given; a callable builds a message
    megabytes long only when the case runs) and contain every ``contains``
    fragment, in order.
    """

    id: str
    tool: str
    build: Callable[[], object] = attrs.field(repr=False)
    code: str | None = None
    name: str | None = None
    message: str | Callable[[], str] | None = attrs.field(default=None, repr=False)
    contains: tuple[str, ...] = ()
    value: Callable[[], object] | None = attrs.field(default=None, repr=False)
    slow: bool = False
    xfail: str | None = None  # a known dsh_core bug: the case pins the intended outcome


@attrs.frozen(kw_only=True)
class SchemaCase:
    """A schema check on ``build()``; ``error is None`` means it must pass.

    ``violations`` is the exact list expected (for ``register``, without the
    ``tool "<name>" parameters: `` prefix the registry adds); ``count`` and
    ``contains`` stand in for it when the list is thousands of entries long.
    """

    id: str
    target: SchemaTarget
    build: Callable[[], object] = attrs.field(repr=False)
    error: Literal["JsonSchemaError", "SchemaSpecError"] | None = None
    violations: tuple[str, ...] | None = None
    count: int | None = None
    contains: tuple[str, ...] = ()
    slow: bool = False
    xfail: str | None = None


@attrs.frozen(kw_only=True)
class SnapshotCase:
    """``snapshot_json(build())``: ``path is None`` expects success, else a NonJsonValueError there."""

    id: str
    build: Callable[[], object] = attrs.field(repr=False)
    path: str | None = None
    problem: str | None = None  # the message after "<path>: "
    slow: bool = False
    xfail: str | None = None


Case = CallCase | SchemaCase | SnapshotCase


def _json_cases(filename: str) -> Iterator[Case]:
    for entry in json.loads((HERE / filename).read_text(encoding="utf-8")):
        data: dict[str, Any] = dict(entry)
        data.pop("comment", None)
        if "tool" in data:
            arguments = data.pop("arguments")
            value = data.pop("value", None)
            yield CallCase(
                build=const(arguments),
                value=const(value) if "value" in entry else None,
                contains=tuple(data.pop("contains", ())),
                **data,
            )
        else:
            schema = data.pop("schema")
            violations = data.pop("violations", None)
            yield SchemaCase(
                build=const(schema),
                violations=tuple(violations) if violations is not None else None,
                contains=tuple(data.pop("contains", ())),
                **data,
            )


def all_cases() -> list[Case]:
    """Every corpus case, hand-written first; ids are unique."""
    from . import generated, hostile_values, regressions

    cases: list[Case] = [
        *_json_cases("arguments.json"),
        *_json_cases("schemas.json"),
        *hostile_values.CASES,
        *generated.cases(),
        *regressions.CASES,
    ]
    seen: set[str] = set()
    for case in cases:
        if case.id in seen:
            raise ValueError(f"duplicate corpus case id {case.id!r}")
        seen.add(case.id)
    return cases
