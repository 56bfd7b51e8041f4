"""Fuzz targets: the DSL compilers, ``assert_supported_json_schema`` and value validation.

Inputs are schema-shaped nested dicts (keywords of the DSL and of the raw
subset, with wrong types, unknown keywords and hostile values mixed in) and
arbitrary objects. The documented outcomes are the only ones allowed:

- ``value_schema_to_json_schema`` / ``parameter_schema_to_json_schema``:
  a plain-JSON compiled schema that passes ``assert_supported_json_schema``,
  or ``SchemaSpecError`` whose violations all name a path under ``schema`` /
  ``parameters``;
- ``assert_supported_json_schema`` / ``assert_object_json_schema``: ``None``
  or ``JsonSchemaError`` with every violation under ``schema``;
- ``validate_json_schema_value`` on an asserted schema: a tuple of messages
  for any value at all (never an exception), empty exactly when the fast
  fastjsonschema path also accepts a lossless value.
"""

from __future__ import annotations

import json
from typing import Any

from conftest_reliability import *  # noqa: F403 - fixtures
from fuzz_support import anything, fuzz, json_values, texts, with_cycles
from hypothesis import strategies as st

from dsh_core import JsonSchemaError, SchemaSpecError, snapshot_json
from dsh_core._schema._validate import CompiledValidator, report_violations
from dsh_core.schema import (
    assert_object_json_schema,
    assert_supported_json_schema,
    parameter_schema_to_json_schema,
    validate_json_schema_value,
    value_schema_to_json_schema,
)

DSL_TYPES = ["string", "number", "integer", "boolean", "null", "array", "object", "json"]
RAW_TYPES = ["string", "number", "integer", "boolean", "null", "array", "object"]
NAMES = st.sampled_from(["a", "b", "c", "a.b", "", "\u202e", "\ud800", "toString"])


def _node(types: list[str], children: st.SearchStrategy[Any], *, raw: bool) -> st.SearchStrategy[Any]:
    junk_types = st.one_of(st.sampled_from([*types, "oneOf", "weird", "json" if raw else "any"]), anything)
    optional: dict[str, st.SearchStrategy[Any]] = {
        "enum": st.one_of(st.lists(st.one_of(json_values, anything), max_size=3), anything),
        "const": st.one_of(json_values, anything),
        "items": children,
        "properties": st.one_of(st.dictionaries(NAMES, children, max_size=3), anything),
        "additionalProperties": st.sampled_from([True, False, 1, None, "no"]),
        "description": st.one_of(texts, anything),
        "title": texts,
        "default": st.one_of(json_values, anything),
        "examples": st.lists(json_values, max_size=2),
        "oneOf": st.one_of(st.lists(children, max_size=3), anything),
        "minimum": st.integers(),
        "$ref": texts,
        "required": st.one_of(st.lists(NAMES, max_size=3), st.booleans(), anything)
        if raw
        else st.one_of(st.just(True), st.booleans(), anything),
    }
    typed = st.fixed_dictionaries({"type": junk_types}, optional=optional)
    beside = {key: value for key, value in optional.items() if key != "oneOf"}
    one_of = st.fixed_dictionaries({"oneOf": st.lists(children, max_size=3)}, optional=beside)
    bare = st.fixed_dictionaries({}, optional=optional)
    return st.one_of(typed, typed, one_of, bare)


def schema_like(*, raw: bool) -> st.SearchStrategy[Any]:
    types = RAW_TYPES if raw else DSL_TYPES
    leaf = st.one_of(st.fixed_dictionaries({"type": st.sampled_from(types)}), st.builds(dict), anything)
    return st.recursive(leaf, lambda children: _node(types, children, raw=raw), max_leaves=12)


def _plain_json(value: Any) -> bool:
    try:
        return json.loads(json.dumps(value, allow_nan=False)) == value
    except (TypeError, ValueError):
        return False


def _check_compiled(compiled: Any, values: list[Any]) -> None:
    assert type(compiled) is dict and _plain_json(compiled)
    assert_supported_json_schema(compiled)
    _check_validation(compiled, values)


def _check_validation(schema: Any, values: list[Any]) -> None:
    validator = CompiledValidator(snapshot_json(schema))  # type: ignore[arg-type]
    for value in values:
        violations = validate_json_schema_value(schema, value)
        assert type(violations) is tuple and all(type(v) is str for v in violations)
        if validator.uses_fastjsonschema and validator.fast_path_accepts(value):
            assert report_violations(validator.schema, value) == (), "fast path accepted what the full check refuses"
        if violations == () and validator.uses_fastjsonschema and _lossless(value):
            assert validator.fast_path_accepts(value), "full check accepted what the fast path refuses"


def _lossless(value: Any) -> bool:
    try:
        snapshot_json(value)
    except ValueError:
        return False
    return True


def _violations_under(exc: Exception, root: str) -> None:
    violations = exc.violations  # type: ignore[attr-defined]
    assert violations, "an error with no violations"
    assert all(type(v) is str and v.startswith(root) for v in violations), violations


values = st.lists(st.one_of(json_values, with_cycles(anything)), max_size=4)


def value_dsl_target(data: tuple[Any, list[Any]]) -> None:
    spec, samples = data
    try:
        compiled = value_schema_to_json_schema(spec)
    except SchemaSpecError as exc:
        _violations_under(exc, "schema")
        return
    _check_compiled(compiled, samples)


def parameter_dsl_target(data: tuple[Any, list[Any]]) -> None:
    spec, samples = data
    try:
        compiled = parameter_schema_to_json_schema(spec)
    except SchemaSpecError as exc:
        _violations_under(exc, "parameters")
        return
    assert compiled["type"] == "object" and "properties" in compiled
    assert_object_json_schema(compiled)
    _check_compiled(compiled, samples)


def assert_target(data: tuple[Any, list[Any]]) -> None:
    schema, samples = data
    try:
        assert_supported_json_schema(schema)
    except JsonSchemaError as exc:
        _violations_under(exc, "schema")
        try:
            assert_object_json_schema(schema)
        except JsonSchemaError as again:
            assert list(again.violations) == list(exc.violations)
        else:  # pragma: no cover - the object check only ever adds violations
            raise AssertionError("assert_object_json_schema accepted what assert_supported_json_schema refused")
        return
    try:
        assert_object_json_schema(schema)
    except JsonSchemaError as exc:
        assert list(exc.violations) == ['schema.type must be "object" (structured output is object-rooted)']
    assert _lossless(schema), "an asserted schema is not lossless JSON"
    _check_validation(schema, samples)


def test_fuzz_value_schema_dsl() -> None:
    assert fuzz(st.tuples(with_cycles(schema_like(raw=False)), values), value_dsl_target) > 0


def test_fuzz_parameter_schema_dsl() -> None:
    properties = st.one_of(st.dictionaries(NAMES, schema_like(raw=False), max_size=4), anything)
    assert fuzz(st.tuples(properties, values), parameter_dsl_target) > 0


def test_fuzz_assert_supported_json_schema() -> None:
    assert fuzz(st.tuples(with_cycles(schema_like(raw=True)), values), assert_target) > 0


def test_fuzz_assert_supported_json_schema_on_anything() -> None:
    assert fuzz(st.tuples(with_cycles(anything), values), assert_target) > 0
