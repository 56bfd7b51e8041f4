"""The author schema DSL: compact dict specs compiled to the raw JSON Schema subset.

A *value spec* is a plain ``dict`` node::

    {"type": "string", "enum": ["a", "b"], "description": "..."}
    {"type": "array", "items": {"type": "integer"}}
    {"type": "object", "additionalProperties": False,
     "properties": {"host": {"type": "string", "required": True}}}
    {"type": "json"}                      # any JSON value
    {"oneOf": [{"type": "string"}, {"type": "null"}]}

A *parameter spec* is the property map of an implicit open object root:
``{"path": {"type": "string", "required": True}, "limit": {"type": "integer"}}``.

The compiler walks with an explicit stack (so 5 000-deep chains compile), checks
the whole spec and reports every bad path at once in one
:class:`~dsh_core.SchemaSpecError`. Paths start at ``schema`` for a value spec and
at ``parameters`` for a parameter spec, and grow by ``.properties.<key>`` (a
parameter is ``parameters.<key>``), ``.items`` and ``.oneOf[<i>]``; keys are not
escaped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from .._errors import JsonSchemaError, NonJsonValueError, SchemaSpecError
from .._json import FrozenDict, safe_repr, snapshot_json, thaw
from ._path import LinkedPath
from ._subset import assert_supported_json_schema, same_scalar, scalar_matches

__all__ = ["parameter_schema_to_json_schema", "value_schema_to_json_schema"]

_ANNOTATIONS = ("description", "title", "default", "examples")
_SCALAR_TYPES = ("string", "number", "integer", "boolean", "null")

# Each node kind's own keywords, besides the annotations (and ``required`` in
# property positions). Output keys are emitted in this order after the annotations.
_KIND_KEYWORDS: dict[str, tuple[str, ...]] = {
    **{kind: ("type", "enum", "const") for kind in _SCALAR_TYPES},
    "array": ("type", "items"),
    "object": ("type", "additionalProperties", "properties"),
    "json": ("type",),
    "oneOf": ("oneOf",),
}
_DSL_KEYWORDS = frozenset({"type", "enum", "const", "items", "additionalProperties", "properties", "oneOf"})
_TYPE_CHOICES = "string/number/integer/boolean/null/array/object/json"


def value_schema_to_json_schema(spec: object) -> dict[str, Any]:
    """Compile one value spec (any root) into a raw JSON Schema subset node.

    The result is made of fresh plain ``dict``/``list`` objects that share nothing
    with ``spec``; ``{"type": "json"}`` compiles to an annotation-only node (``{}``
    when it has no annotations). Defaults are copied as annotations, never applied.

    Raises:
        SchemaSpecError: listing every problem of the spec (paths start at
            ``schema``). The compiled tree is also passed through
            :func:`~dsh_core.schema.assert_supported_json_schema` as a safety net;
            anything it found would be reported as a ``SchemaSpecError`` too, so
            callers only ever handle one error type for a bad author spec.
    """
    return _Compiler(parameters=False).run(spec)


def parameter_schema_to_json_schema(spec: object) -> dict[str, Any]:
    """Compile a parameter spec (a property map) into an object-rooted raw schema.

    The root is the implicit open object ``{"type": "object", "properties": {...},
    "required": [...]}``: ``properties`` is always present (``{}`` for an empty
    spec), ``required`` only when some parameter says ``required: True`` (in
    declaration order), and no ``additionalProperties`` is emitted.

    Raises:
        SchemaSpecError: listing every problem of the spec (paths start at
            ``parameters``), including anything the raw-subset safety net found;
            see :func:`value_schema_to_json_schema`.
    """
    return _Compiler(parameters=True).run(spec)


class _Visit(NamedTuple):
    node: object
    # Spelled out only in an error: a pending visit's path as text would cost
    # memory quadratic in the spec's depth.
    path: LinkedPath
    in_property: bool
    # Where the compiled node goes: ``sink[slot] = compiled``.
    sink: Any
    slot: str | int


class _Leave(NamedTuple):
    ident: int


class _Compiler:
    """One compilation: a pre-order walk that collects violations instead of stopping."""

    def __init__(self, *, parameters: bool) -> None:
        self.parameters = parameters
        self.errors: list[str] = []
        self.stack: list[_Visit | _Leave] = []
        self.ancestors: set[int] = set()

    def run(self, spec: object) -> dict[str, Any]:
        holder: dict[str, Any] = {}
        if self.parameters:
            holder["root"] = self._parameter_root(spec)
        else:
            self.stack.append(_Visit(spec, LinkedPath.root("schema"), False, holder, "root"))
        while self.stack:
            task = self.stack.pop()
            if isinstance(task, _Leave):
                self.ancestors.discard(task.ident)
            else:
                self._visit(task)
        if self.errors:
            raise SchemaSpecError(self.errors)
        compiled: dict[str, Any] = holder["root"]
        try:
            assert_supported_json_schema(compiled)
        except JsonSchemaError as exc:
            # The DSL checks cover the subset, so this is a safety net; relabel the
            # subset's ``schema`` paths so the violations name the author's spec.
            raise SchemaSpecError([self._relabel(v) for v in exc.violations]) from exc
        return compiled

    def _relabel(self, violation: str) -> str:
        if not self.parameters:
            return violation
        if violation.startswith("schema.properties."):
            return "parameters." + violation[len("schema.properties.") :]
        if violation.startswith("schema"):
            return "parameters" + violation[len("schema") :]
        return violation

    def _parameter_root(self, spec: object) -> dict[str, Any]:
        properties: dict[str, Any] = {}
        root: dict[str, Any] = {"type": "object", "properties": properties}
        path = LinkedPath.root("parameters")
        entries = self._property_map(spec, path)
        if entries is not None:
            required = _required_names(entries)
            if required:
                root["required"] = required
            self._push_properties(entries, path, ".", properties)
        return root

    def _property_map(self, value: object, path: LinkedPath) -> Mapping[str, object] | None:
        problem = _record_problem(value)
        if problem is not None:
            self.errors.append(f"{path} must be an object of value schemas{problem}")
            return None
        assert isinstance(value, dict)
        return value

    def _push_properties(
        self, entries: Mapping[str, object], path: LinkedPath, separator: str, sink: dict[str, Any]
    ) -> None:
        # Reversed so that the stack pops them in declaration order.
        for key in reversed(list(entries)):
            self.stack.append(_Visit(entries[key], path.child(separator + key), True, sink, key))

    def _visit(self, task: _Visit) -> None:
        node, path = task.node, task.path
        problem = _record_problem(node)
        if problem is not None:
            self.errors.append(f"{path} must be a value schema object{problem}")
            return
        assert isinstance(node, dict)
        if id(node) in self.ancestors:
            self.errors.append(f"{path} is circular")
            return
        kind = self._kind(node, path)
        if kind is None:
            return
        own = _KIND_KEYWORDS[kind]
        for key in node:
            if key in own or key in _ANNOTATIONS:
                continue
            if key == "required":
                if not task.in_property:
                    self.errors.append(
                        f"{path}.required is not supported by the value schema DSL "
                        "(required: True belongs on a property of an object)"
                    )
                elif node[key] is not True:
                    self.errors.append(f"{path}.required must be true when present")
            elif key in _DSL_KEYWORDS:
                where = "beside oneOf" if kind == "oneOf" else f'on type "{kind}"'
                self.errors.append(f"{path}.{key} is not supported {where}")
            else:
                self.errors.append(f"{path}.{key} is not supported by the value schema DSL")

        out: dict[str, Any] = {}
        if kind == "oneOf":
            branches = node["oneOf"]
            if type(branches) in (list, tuple) and len(branches) >= 2:
                slots: list[Any] = [None] * len(branches)
                out["oneOf"] = slots
                self._enter(node)
                for index in reversed(range(len(branches))):
                    self.stack.append(_Visit(branches[index], path.child(f".oneOf[{index}]"), False, slots, index))
            else:
                self.errors.append(f"{path}.oneOf must be an array of at least two value schemas")
        elif kind != "json":
            out["type"] = kind
        self._annotations(node, path, out)
        if kind in _SCALAR_TYPES:
            self._scalar(node, path, kind, out)
        elif kind == "array":
            if "items" in node:
                self._enter(node)
                self.stack.append(_Visit(node["items"], path.child(".items"), False, out, "items"))
        elif kind == "object":
            self._object(node, path, out)
        task.sink[task.slot] = out

    def _enter(self, node: dict[str, Any]) -> None:
        # Idempotent per node: the leave marker is pushed below the node's children.
        ident = id(node)
        if ident not in self.ancestors:
            self.ancestors.add(ident)
            self.stack.append(_Leave(ident))

    def _kind(self, node: dict[str, Any], path: LinkedPath) -> str | None:
        if "oneOf" in node:
            if "type" in node:
                self.errors.append(f"{path} cannot declare both type and oneOf")
                return None
            return "oneOf"
        kind = node.get("type")
        if type(kind) is not str or kind == "oneOf" or kind not in _KIND_KEYWORDS:
            self.errors.append(f"{path}.type must be {_TYPE_CHOICES}, or use oneOf")
            return None
        return kind

    def _annotations(self, node: dict[str, Any], path: LinkedPath, out: dict[str, Any]) -> None:
        for key in _ANNOTATIONS:
            if key not in node:
                continue
            value = node[key]
            if key in ("description", "title"):
                if type(value) is not str:
                    self.errors.append(f"{path}.{key} must be a string")
                    continue
                out[key] = value
                continue
            try:
                out[key] = thaw(snapshot_json(value))
            except NonJsonValueError as exc:
                self.errors.append(f"{path}.{key} annotation must be lossless JSON data ({exc})")

    def _scalar(self, node: dict[str, Any], path: LinkedPath, kind: str, out: dict[str, Any]) -> None:
        enum_ok = const_ok = False
        if "enum" in node:
            values = node["enum"]
            if type(values) in (list, tuple) and values and all(scalar_matches(kind, v) for v in values):
                out["enum"] = list(values)
                enum_ok = True
            else:
                self.errors.append(f"{path}.enum must be a non-empty array of {kind} values")
        if "const" in node:
            if scalar_matches(kind, node["const"]):
                out["const"] = node["const"]
                const_ok = True
            else:
                article = "an" if kind == "integer" else "a"
                self.errors.append(f"{path}.const must be {article} {kind} value")
        if enum_ok and const_ok and not any(same_scalar(node["const"], v) for v in node["enum"]):
            self.errors.append(f"{path}.const must be one of {path}.enum when both are declared")

    def _object(self, node: dict[str, Any], path: LinkedPath, out: dict[str, Any]) -> None:
        additional = node.get("additionalProperties")
        if additional is True or additional is False:
            out["additionalProperties"] = additional
        else:
            self.errors.append(f"{path}.additionalProperties must be explicitly true or false")
        if "properties" not in node:
            return
        properties_path = path.child(".properties")
        entries = self._property_map(node["properties"], properties_path)
        if entries is None:
            return
        properties: dict[str, Any] = {}
        out["properties"] = properties
        required = _required_names(entries)
        if required:
            out["required"] = required
        self._enter(node)
        self._push_properties(entries, properties_path, ".", properties)


def _record_problem(value: object) -> str | None:
    """Why ``value`` is not a plain spec record ('' for a plain wrong type), or None."""
    if type(value) is not dict and type(value) is not FrozenDict:
        return ""
    assert isinstance(value, dict)
    for key in value:
        if type(key) is not str:
            return f" (key {safe_repr(key)} is not a str)"
    return None


def _required_names(entries: Mapping[str, object]) -> list[str]:
    return [key for key, node in entries.items() if isinstance(node, dict) and node.get("required") is True]
