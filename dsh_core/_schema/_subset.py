"""The raw JSON Schema subset dsh-tools enforces, and the assertion that checks a schema against it.

A raw schema is plain JSON data: nested ``dict`` (or :class:`~dsh_core._json.FrozenDict`)
nodes whose keywords come from a small vocabulary. Everything outside that
vocabulary is rejected rather than ignored, because a keyword the validator does
not enforce would be a promise the registry cannot keep. The walk uses an
explicit work stack, so schemas nested thousands of levels deep are checked
without touching the interpreter's recursion limit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final, TypeAlias

from .._errors import JsonSchemaError, NonJsonValueError
from .._json import FrozenDict, int_fits_json, snapshot_json
from ._path import LinkedPath

__all__ = [
    "ANNOTATION_KEYWORDS",
    "CONSTRAINT_KEYWORDS",
    "SCALAR_TYPES",
    "SCHEMA_TYPES",
    "TOOL_ARGUMENTS_ROOT",
    "JsonSchemaNode",
    "assert_object_json_schema",
    "assert_supported_json_schema",
    "is_schema_array",
    "is_schema_record",
    "same_scalar",
    "scalar_key",
    "scalar_matches",
]

JsonSchemaNode: TypeAlias = Mapping[str, Any]
"""One raw schema node of the enforced subset (a ``dict`` or ``FrozenDict``).

Only :func:`assert_supported_json_schema` makes a mapping trustworthy; the alias
itself promises nothing about its content.
"""

CONSTRAINT_KEYWORDS: Final = frozenset(
    {"type", "oneOf", "properties", "required", "additionalProperties", "items", "enum", "const"}
)
ANNOTATION_KEYWORDS: Final = frozenset({"description", "title", "default", "examples"})
SCHEMA_TYPES: Final = ("object", "array", "string", "number", "integer", "boolean", "null")
SCALAR_TYPES: Final = frozenset({"string", "number", "integer", "boolean", "null"})

# The keywords that only make sense under a particular ``type``, in the order
# their misuse is reported (the same order as beside ``oneOf`` or without a type).
_TYPED_KEYWORDS: Final = ("properties", "required", "additionalProperties", "items", "enum", "const")
_ALLOWED_ON: Final[Mapping[str, frozenset[str]]] = {
    "properties": frozenset({"object"}),
    "required": frozenset({"object"}),
    "additionalProperties": frozenset({"object"}),
    "items": frozenset({"array"}),
    "enum": SCALAR_TYPES,
    "const": SCALAR_TYPES,
}
_UNSUPPORTED_KEYWORD: Final = (
    "is not a supported keyword (subset: type/oneOf/properties/required/additionalProperties/items/enum/const"
    " + annotations)"
)
STRUCTURED_OUTPUT_ROOT: Final = "structured output is object-rooted"
TOOL_ARGUMENTS_ROOT: Final = "tool arguments are a JSON object"
"""The reason :func:`assert_object_json_schema` gives when checking a tool's parameter schema."""

_ARRAY_TYPES: Final = (list, tuple)


def is_schema_record(value: object) -> bool:
    """Whether ``value`` can be a schema node or property map: an exact ``dict``/``FrozenDict`` with ``str`` keys."""
    if type(value) is FrozenDict:
        return True  # a snapshot only ever holds str keys
    return type(value) is dict and all(type(key) is str for key in value)


def is_schema_array(value: object) -> bool:
    """Whether ``value`` is an array in a schema (``oneOf``, ``enum``, ``required``): an exact ``list`` or ``tuple``."""
    return type(value) in _ARRAY_TYPES


def _is_json_number(value: object) -> bool:
    kind = type(value)
    if kind is int:
        return int_fits_json(value)  # type: ignore[arg-type]
    if kind is float:
        number: float = value  # type: ignore[assignment]
        return math.isfinite(number) and not (number == 0.0 and math.copysign(1.0, number) < 0)
    return False


def scalar_matches(schema_type: str, value: object) -> bool:
    """Whether ``value`` is a valid ``enum``/``const`` entry for a scalar ``schema_type``.

    Types are exact: a ``bool`` is never a number or an integer, an ``int``
    subclass is not an integer, and numbers must be finite and not ``-0.0``.
    ``integer`` takes an ``int`` or an integral ``float`` (``1.0``), as JSON
    Schema does.
    """
    if schema_type == "string":
        return type(value) is str
    if schema_type == "number":
        return _is_json_number(value)
    if schema_type == "integer":
        return _is_json_number(value) and (type(value) is int or float(value).is_integer())  # type: ignore[arg-type]
    if schema_type == "boolean":
        return type(value) is bool
    if schema_type == "null":
        return value is None
    raise ValueError(f"not a scalar schema type: {schema_type!r}")


def _is_lossless(value: object) -> bool:
    try:
        snapshot_json(value)
    except NonJsonValueError:
        return False
    return True


# Work items of the walk. Each is a tuple whose first element says what to do:
#   (_ENTER, node, path)                  check one node and schedule its children
#   (_LEAVE, node_id)                     the node's subtree is done: it is no longer an ancestor
#   (_ONE_OF_TAIL, node, path)            report keywords that may not sit beside oneOf
#   (_OBJECT_TAIL, node, path, props)     check required/additionalProperties after the properties
# A path is a LinkedPath, spelled out only in a violation: the tails wait for
# their whole subtree, so paths kept as text would cost memory quadratic in depth.
_ENTER: Final = 0
_LEAVE: Final = 1
_ONE_OF_TAIL: Final = 2
_OBJECT_TAIL: Final = 3


def _collect_violations(root: object, root_path: str) -> list[str]:
    violations: list[str] = []
    ancestors: set[int] = set()
    tasks: list[tuple[Any, ...]] = [(_ENTER, root, LinkedPath.root(root_path))]
    while tasks:
        task = tasks.pop()
        action = task[0]
        if action == _LEAVE:
            ancestors.discard(task[1])
        elif action == _ONE_OF_TAIL:
            node, path = task[1], task[2]
            violations.extend(f"{path}.{key} is not supported beside oneOf" for key in _TYPED_KEYWORDS if key in node)
        elif action == _OBJECT_TAIL:
            _check_object_tail(task[1], task[2], task[3], violations)
        else:
            _enter(task[1], task[2], tasks, ancestors, violations)
    return violations


def _enter(
    node: Any,
    path: LinkedPath,
    tasks: list[tuple[Any, ...]],
    ancestors: set[int],
    violations: list[str],
) -> None:
    if not is_schema_record(node):
        violations.append(f"{path} must be a schema object")
        return
    # Identity, not equality: the same dict reused by two siblings is fine,
    # only a node reachable from itself is a cycle.
    node_id = id(node)
    if node_id in ancestors:
        violations.append(f"{path} is circular")
        return
    ancestors.add(node_id)
    # Pushed first so it runs after every task the node schedules below.
    tasks.append((_LEAVE, node_id))

    for key, item in node.items():
        if key in CONSTRAINT_KEYWORDS:
            continue
        if key in ANNOTATION_KEYWORDS:
            if not _is_lossless(item):
                violations.append(f"{path}.{key} annotation must be lossless JSON data")
            continue
        violations.append(f"{path}.{key} {_UNSUPPORTED_KEYWORD}")
    if "description" in node and not isinstance(node["description"], str):
        violations.append(f"{path}.description must be a string")
    if "title" in node and not isinstance(node["title"], str):
        violations.append(f"{path}.title must be a string")
    if "examples" in node and not isinstance(node["examples"], (list, tuple)):
        # JSON Schema's examples is an array of values; a provider may refuse the tool over one that is not.
        violations.append(f"{path}.examples must be an array")

    has_type = "type" in node
    has_one_of = "oneOf" in node
    if has_type and has_one_of:
        violations.append(f"{path} cannot declare both type and oneOf")
        return
    if not has_type and not has_one_of:
        # An annotation-only node accepts any JSON value; constraints need a type to mean anything.
        violations.extend(f"{path}.{key} requires type or oneOf" for key in _TYPED_KEYWORDS if key in node)
        return

    if has_one_of:
        branches = node["oneOf"]
        tasks.append((_ONE_OF_TAIL, node, path))
        if not is_schema_array(branches) or len(branches) < 2:
            violations.append(f"{path}.oneOf must be an array of at least two schemas")
            return
        for index in range(len(branches) - 1, -1, -1):
            tasks.append((_ENTER, branches[index], path.child(f".oneOf[{index}]")))
        return

    schema_type = node["type"]
    if type(schema_type) is not str or schema_type not in SCHEMA_TYPES:
        if is_schema_array(schema_type):
            violations.append(f"{path}.type must be a single type string (type arrays are not supported)")
        else:
            violations.append(f"{path}.type must be one of {'/'.join(SCHEMA_TYPES)}")
        return
    for key in _TYPED_KEYWORDS:
        if key in node and schema_type not in _ALLOWED_ON[key]:
            violations.append(f'{path}.{key} is not supported on type "{schema_type}"')

    if schema_type == "object":
        properties = node.get("properties")
        tasks.append((_OBJECT_TAIL, node, path, properties))
        if "properties" in node:
            if not is_schema_record(properties):
                violations.append(f"{path}.properties must be an object of schemas")
            else:
                for name, child in reversed(list(properties.items())):
                    tasks.append((_ENTER, child, path.child(f".properties.{name}")))
    elif schema_type == "array":
        if "items" in node:
            tasks.append((_ENTER, node["items"], path.child(".items")))
    else:
        _check_scalar_constraints(node, path, schema_type, violations)


def _check_object_tail(node: Any, path: LinkedPath, properties: Any, violations: list[str]) -> None:
    if "required" in node:
        required = node["required"]
        if not is_schema_array(required) or any(type(name) is not str for name in required):
            violations.append(f"{path}.required must be an array of strings")
        else:
            declared = properties if is_schema_record(properties) else {}
            violations.extend(
                f'{path}.required names "{name}" which is not in properties'
                for name in required
                if name not in declared
            )
    if "additionalProperties" in node and type(node["additionalProperties"]) is not bool:
        violations.append(f"{path}.additionalProperties must be a boolean")


def _check_scalar_constraints(node: Any, path: LinkedPath, schema_type: str, violations: list[str]) -> None:
    allowed = node.get("enum")
    enum_valid = (
        is_schema_array(allowed) and len(allowed) > 0 and all(scalar_matches(schema_type, entry) for entry in allowed)
    )
    if "enum" in node and not enum_valid:
        violations.append(f"{path}.enum must be a non-empty array of {schema_type} values")
    if "const" not in node:
        return
    const = node["const"]
    if not scalar_matches(schema_type, const):
        violations.append(f"{path}.const must be a {schema_type} value")
    elif enum_valid and not any(same_scalar(const, entry) for entry in allowed):
        violations.append(f"{path}.const must be one of {path}.enum when both are declared")


def same_scalar(left: object, right: object) -> bool:
    """JSON equality of two scalars: ``1 == 1.0``, but a ``bool`` only ever equals a ``bool``."""
    left_kind, right_kind = type(left), type(right)
    if left_kind is bool or right_kind is bool:
        return left_kind is right_kind and left == right
    if left_kind in (int, float) and right_kind in (int, float):
        return left == right
    return left_kind is right_kind and left == right


def scalar_key(value: object) -> tuple[object, ...] | None:
    """A hashable key that two JSON scalars share exactly when :func:`same_scalar` calls them equal.

    ``1`` and ``1.0`` share one (they hash alike), a ``bool`` never shares one
    with a number, a string only with the same string. ``None`` for anything
    else (a subclass, a container, a non-finite float), which only
    :func:`same_scalar` itself can compare.
    """
    kind = type(value)
    if kind is str:
        return ("s", value)
    if kind is bool:
        return ("b", value)
    if kind is int:
        return ("n", value)
    if kind is float:
        return ("n", value) if math.isfinite(value) else None  # type: ignore[arg-type]
    if value is None:
        return ("z",)
    return None


def assert_supported_json_schema(schema: object) -> None:
    """Check that ``schema`` uses only the enforced subset; raise listing every problem.

    Accepted keywords are ``type`` (one of ``object``, ``array``, ``string``,
    ``number``, ``integer``, ``boolean``, ``null``), ``oneOf`` (two or more
    branches), ``properties``/``required``/``additionalProperties`` (objects
    only), ``items`` (arrays only), type-correct ``enum``/``const`` (scalars
    only) and the annotations ``description``, ``title``, ``default`` and
    ``examples`` (lossless JSON, never applied). A node with neither ``type``
    nor ``oneOf`` accepts any JSON value. Any root is allowed.

    Raises:
        JsonSchemaError: with ``violations`` naming every offending path
            (``schema``, ``schema.properties.a``, ``schema.items``,
            ``schema.oneOf[0]``), in walk order: each node's own checks, then its
            children in declaration order, then the node's checks that depend on
            its children.
    """
    violations = _collect_violations(schema, "schema")
    if violations:
        raise JsonSchemaError(violations)


def assert_object_json_schema(schema: object, *, reason: str = STRUCTURED_OUTPUT_ROOT) -> None:
    """Like :func:`assert_supported_json_schema`, and the root must also declare ``type: "object"``.

    Structured outputs (subagents, workflows) and tool parameters use this;
    tool outputs accept any root. ``reason`` says why the root must be an
    object, in parentheses after the rule: structured output's by default,
    :data:`TOOL_ARGUMENTS_ROOT` (``tool arguments are a JSON object``) for a
    parameter schema.

    Raises:
        JsonSchemaError: every subset violation, or, when there is none and the
            root is not an object schema, ``schema.type must be "object" (<reason>)``.
    """
    violations = _collect_violations(schema, "schema")
    if not violations and not (is_schema_record(schema) and schema.get("type") == "object"):  # type: ignore[attr-defined]
        violations.append(f'schema.type must be "object" ({reason})')
    if violations:
        raise JsonSchemaError(violations)
