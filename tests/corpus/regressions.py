"""Inputs that crashed dsh_core when the corpus and fuzz targets were built.

Each case pins the outcome the runtime *should* produce. While the bug is
open the case is an ``xfail(strict=True)`` naming it (see RELIABILITY.md,
"Bugs found"); once dsh_core is fixed the case starts passing, strict xfail
turns that into a failure, and the ``xfail=`` line must be deleted.

How each was found:

- R1, R2: the snapshot fuzz target's key strategy (tuples as keys) plus
  reading ``_reject``, which formats a non-``str`` key with ``repr()``;
- R3, R4: the same ``repr()`` reached through schema annotations and DSL specs;
- R5, R6: the corpus' number palette: ``snapshot_json`` accepts ints of any
  size, but ``json.dumps`` refuses more than 4 300 digits, and the validator
  cache key and the default renderer are built with it. R5's tests live in
  ``test_corpus.py`` (refusal may come from the definition or the registry).
"""

from __future__ import annotations

from typing import Any

from . import CallCase, SchemaCase, SnapshotCase

__all__ = ["CASES", "HUGE_INT", "deep_tuple"]

HUGE_INT = 10**5000

_R1 = "R1: snapshot_json formats a non-str key with repr(); a 100 000-deep tuple key raises RecursionError"
_R2 = "R2: snapshot_json formats a non-str key with repr(); a key whose __repr__ raises escapes as that error"
_R3 = "R3: assert_supported_json_schema lets R1's RecursionError out of an annotation check"
_R4 = "R4: the DSL compilers format a non-str spec key with repr() (RecursionError)"
_R6 = (
    "R6: snapshot_json's flat-object fast path skips the int-size check, so {'n': 10**5000} passes and the"
    " default renderer fails (INVALID_TOOL_OUTPUT, not INVALID_ARGS)"
)


def deep_tuple(depth: int = 100_000) -> tuple[Any, ...]:
    node: tuple[Any, ...] = ()
    for _ in range(depth):
        node = (node,)
    return node


class ReprBomb:
    def __hash__(self) -> int:
        return 3

    def __repr__(self) -> str:
        raise ValueError("ReprBomb.__repr__ exploded")


CASES: list[CallCase | SchemaCase | SnapshotCase] = [
    SnapshotCase(id="regression-deep-tuple-key", build=lambda: {deep_tuple(): 1}, path="$"),
    SnapshotCase(id="regression-repr-bomb-key", build=lambda: {ReprBomb(): 1}, path="$"),
    CallCase(
        id="regression-deep-tuple-key-in-arguments",
        tool="echo",
        build=lambda: {"a": {deep_tuple(): 1}},
        code="INVALID_ARGS",
        name="NonJsonValueError",
        contains=("tool execution arguments must be losslessly JSON-serializable: $.a: object key",),
    ),
    CallCase(
        id="regression-repr-bomb-key-in-arguments",
        tool="echo",
        build=lambda: {"a": {ReprBomb(): 1}},
        code="INVALID_ARGS",
        name="NonJsonValueError",
        contains=("tool execution arguments must be losslessly JSON-serializable: $.a: object key",),
    ),
    SchemaCase(
        id="regression-deep-tuple-key-in-annotation",
        target="assert",
        build=lambda: {"type": "string", "default": {deep_tuple(): 1}},
        error="JsonSchemaError",
        violations=("schema.default annotation must be lossless JSON data",),
    ),
    SchemaCase(
        id="regression-deep-tuple-key-in-value-spec",
        target="value_dsl",
        build=lambda: {deep_tuple(): 1},
        error="SchemaSpecError",
        count=1,
        contains=("schema must be a value schema object (key ",),
    ),
    SchemaCase(
        id="regression-deep-tuple-key-in-parameter-spec",
        target="parameter_dsl",
        build=lambda: {deep_tuple(): 1},
        error="SchemaSpecError",
        count=1,
        contains=("parameters must be an object of value schemas (key ",),
    ),
    CallCase(
        id="regression-huge-int-argument",
        tool="echo",
        build=lambda: {"n": HUGE_INT},
        code="INVALID_ARGS",
        name="NonJsonValueError",
        contains=("tool execution arguments must be losslessly JSON-serializable: $.n: ",),
    ),
    # The largest int json.dumps still writes must keep round-tripping.
    CallCase(
        id="huge-int-4300-digits-is-fine", tool="echo", build=lambda: {"n": 10**4299}, value=lambda: {"n": 10**4299}
    ),
]
