"""``RawSchema``: a schema handed to ``define_tool`` already written in the enforced subset."""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from .._json import FrozenDict, snapshot_json
from ._subset import assert_supported_json_schema

__all__ = ["RawSchema"]


def _checked_node(value: object) -> FrozenDict:
    if not isinstance(value, Mapping):
        raise TypeError(f"RawSchema takes a JSON Schema mapping, got {type(value).__name__}")
    node = snapshot_json(value if isinstance(value, dict) else dict(value))
    assert isinstance(node, FrozenDict)
    # Checked here, where the author wrote it, rather than at registration.
    assert_supported_json_schema(node)
    return node


@attrs.frozen(slots=True)
class RawSchema:
    """A JSON Schema in the raw subset, which ``define_tool`` takes as it is instead of compiling the DSL.

    For schemas that already exist (an OpenAPI operation, a generator's output,
    another framework's tool): ``define_tool(parameters=RawSchema({...}),
    output=RawSchema({...}))``, or ``ToolOutput(schema=RawSchema({...}),
    render=...)``. The node is snapshotted and checked when built: every keyword
    the subset would not enforce is a :class:`JsonSchemaError` listing each
    offending path, never silently ignored. Parameters must also be an object
    schema (checked by ``define_tool``).
    """

    node: FrozenDict = attrs.field(converter=_checked_node)
