"""Tool parameters declared as an attrs class: the derived schema and strict structuring.

An attrs class is the typed way to declare a tool's parameters::

    @attrs.frozen
    class ReadArgs:
        path: str = attrs.field(metadata={"description": "file to read"})
        limit: int | None = None

:func:`schema_from_attrs_class` derives the raw parameter schema the model sees,
and :func:`structure_args` turns already-validated arguments into an instance
with a strict cattrs converter. Both are cached per class. :func:`value_type`
does both for a single annotation (a function's parameter or return
annotation), and says whether its schema alone already checks everything.

Supported field annotations and what they become:

=============================  ================================================
``str`` / ``int`` / ``float``  ``string`` / ``integer`` / ``number``
``bool`` / ``None``            ``boolean`` / ``null``
``list[X]``, ``tuple[X, ...]`` ``array`` with ``items`` (bare ``list``/``tuple``:
                               any items)
``dict[str, X]``               an open ``object``; the subset cannot constrain
                               the values, so ``X`` is enforced by structuring
``Literal[...]``               ``enum`` of one scalar type, or a ``oneOf`` of one
                               ``enum`` per type when the values mix types
``enum.Enum`` subclass         the ``enum`` of its members' values (``str``,
                               ``int``, ``bool`` or ``None``), as ``Literal``;
                               structured to the member (not ``Flag``)
``datetime``, ``date``,        a ``string`` whose description names the form
``time``, ``UUID``, ``Path``   (ISO 8601, a UUID, a path); parsed strictly by
                               structuring, written back as that text
nested attrs class             a closed object (``additionalProperties: false``)
``TypedDict``                  a closed object; its required keys required
                               (``total=``, inherited keys, ``Required``,
                               ``NotRequired``)
``X | None``, ``Optional[X]``  ``oneOf: [X, null]`` (just ``X`` when ``X``
                               already admits null)
``Any``, ``JsonValue``         annotation-only (any JSON value)
``Annotated[X, ...]``          ``X`` (the metadata is ignored)
=============================  ================================================

A field with a default is optional, and a JSON default is shown as a ``default``
annotation (never applied by the schema: attrs applies it); a shown default must
be a value of the field's annotation. A field's
``metadata={"description": ...}`` becomes the property's description. The root,
like every nested class, is a closed object: an unknown key would otherwise be
dropped silently by structuring, so the schema rejects it up front instead.
Stringified annotations (``from __future__ import annotations``) are evaluated in
the namespace of the class that declares the field, without mutating the class.
"""

from __future__ import annotations

import datetime
import enum
import inspect
import json
import pathlib
import re
import sys
import types
import typing
import uuid
from collections.abc import Callable, Mapping
from typing import Any, Final, ForwardRef, Literal, NoReturn, TypeVar, Union, get_args, get_origin

import attrs
import cattrs
import cattrs.cols
import cattrs.gen
import cattrs.v

from .._errors import JsonSchemaError, NonJsonValueError, SchemaSpecError, ToolArgsError
from .._json import FrozenDict, FrozenList, JsonValue, json_equal, snapshot_json, thaw
from ._subset import assert_supported_json_schema

__all__ = ["ValueType", "schema_from_attrs_class", "structure_args", "value_schema_from_annotation", "value_type"]

T = TypeVar("T")

_NoneType = type(None)
_SUPPORTED = (
    "supported: str, int, float, bool, None, list[X], tuple[X, ...], dict[str, X], Literal[...], "
    "Enum, datetime, date, time, UUID, Path, X | None, nested attrs classes, TypedDict, Any, JsonValue"
)


@attrs.frozen
class _Derived:
    schema: FrozenDict
    converter: cattrs.Converter


_CACHE: dict[type, _Derived] = {}

#: How deeply annotations may nest (``list[list[...]]``, a class holding a class, ``X | None``:
#: each counts one level). Deriving and structuring walk Python types recursively, a few frames
#: per level; a fixed bound well under the recursion limit gives a declaration the same verdict
#: wherever it is made, and leaves room to structure its values on any call stack. Schemas
#: deeper than this are still fine as a RawSchema or in the DSL (walked iteratively).
MAX_ANNOTATION_DEPTH: Final = 100


def schema_from_attrs_class(cls: type) -> dict[str, Any]:
    """Derive the raw parameter schema (closed, object-rooted) of an attrs class.

    Returns a fresh plain ``dict`` on every call (the derivation itself is cached
    per class). The root is ``{"type": "object", "additionalProperties": False,
    "properties": {...}, "required": [...]}``; ``required`` lists the fields
    without a default, in field order, and is omitted when there are none.

    Raises:
        SchemaSpecError: ``cls`` is not an attrs class, some field annotations
            cannot be expressed, or a JSON default is not a value of its field's
            annotation (``limit: int = None``); the violations name every such
            field path, e.g. ``Args.servers[].port`` (``[]`` steps into an item
            or a dict value).
    """
    return thaw(_derive(cls).schema)  # type: ignore[no-any-return]


def value_schema_from_annotation(annotation: object, owner: Callable[..., Any], path: str) -> dict[str, Any]:
    """The raw schema of values of ``annotation`` (a return annotation, say), as a field of it would have.

    ``owner`` is the function the annotation belongs to: nested string
    annotations are evaluated in its module.

    Raises:
        SchemaSpecError: the annotation cannot be expressed (the violations name ``path``).
    """
    return value_type(annotation, owner, path).schema


@attrs.frozen
class ValueType:
    """The values an annotation allows: their raw schema, and the strict structuring that checks them."""

    schema: dict[str, Any]
    #: Whether the schema says all that structuring checks. It cannot say what a ``dict[str, X]``'s
    #: values are, nor what an attrs class's validators, converters or init hooks refuse.
    complete: bool
    _converter: cattrs.Converter = attrs.field(repr=False)
    _resolved: Any = attrs.field(repr=False)

    def violations(self, value: object, *, root: str = "$") -> list[str]:
        """Why the plain JSON-like ``value`` does not structure as the annotation (path-qualified from ``root``).

        Empty when it does. The same strict structuring as :func:`structure_args`:
        no coercion, unknown keys refused, attrs validators run.
        """
        try:
            self._converter.structure(value, self._resolved)
        except Exception as exc:
            return cattrs.transform_error(exc, path=root, format_exception=_format_exception)
        return []


def value_type(annotation: object, owner: Callable[..., Any], path: str) -> ValueType:
    """What ``annotation`` allows (a parameter's or a return annotation): its raw schema and strict check.

    ``owner`` is the function the annotation belongs to: nested string
    annotations are evaluated in its module.

    Raises:
        SchemaSpecError: the annotation cannot be expressed (the violations name ``path``).
    """
    deriver = _Deriver()
    namespace = type("_AnnotationOwner", (), {"__module__": getattr(owner, "__module__", __name__)})
    try:
        derived = deriver.type_schema(annotation, namespace, path, frozenset())
    except RecursionError:
        raise SchemaSpecError([_too_deep(path)]) from None
    if deriver.errors or derived is None:
        raise SchemaSpecError(deriver.errors)
    schema, resolved = derived
    return ValueType(schema, deriver.complete, deriver.converter, resolved)


def _nested_too_deep(path: str) -> str:
    return (
        f"{path}: annotations nested more than {MAX_ANNOTATION_DEPTH} levels deep are not supported "
        "(their values could not be structured reliably); declare deeper data as JsonValue, "
        "or use a RawSchema or the schema DSL"
    )


def _too_deep(path: str) -> str:
    # Past MAX_ANNOTATION_DEPTH the walk stops on its own; this is left for a declaration made
    # with the call stack already nearly at the recursion limit.
    return f"{path}: annotations nested too deeply to derive a schema from (past Python's recursion limit)"


def structure_args(cls: type[T], args: Mapping[str, object]) -> T:
    """Build an instance of the attrs class ``cls`` from validated arguments.

    ``args`` is what passed the schema of :func:`schema_from_attrs_class` (a
    ``FrozenDict`` or ``dict``; arrays may be tuples). Structuring never coerces:
    a ``str`` field only takes a ``str``, a ``bool`` only a ``bool``, an ``int``
    never a ``bool``. Two conversions follow the schema's number rules instead of
    failing: an integral float (``2.0``) for an ``int`` field becomes ``2``, and
    an int for a ``float`` field becomes a float when it has an exact float value
    (beyond 2**53 most do not: those are refused rather than rounded). ``Any`` and
    ``JsonValue`` fields keep the frozen JSON value as is.

    Raises:
        SchemaSpecError: the class itself is not usable (see
            :func:`schema_from_attrs_class`).
        ToolArgsError: the arguments do not structure (including a failing attrs
            validator of the class); ``violations`` are path-qualified, e.g.
            ``expected an integer, got a string @ $.count``.
    """
    derived = _derive(cls)
    try:
        return derived.converter.structure(args, cls)
    except Exception as exc:
        raise ToolArgsError(cattrs.transform_error(exc, path="$", format_exception=_format_exception)) from exc


def _derive(cls: type) -> _Derived:
    if not isinstance(cls, type):
        raise SchemaSpecError([f"{cls!r} is not an attrs class"])
    cached = _CACHE.get(cls)
    if cached is not None:
        return cached
    if not attrs.has(cls):
        raise SchemaSpecError([f"{cls!r} is not an attrs class"])
    deriver = _Deriver()
    try:
        schema = deriver.class_schema(cls, cls.__qualname__, frozenset({cls}))
    except RecursionError:
        raise SchemaSpecError([_too_deep(cls.__qualname__)]) from None
    if deriver.errors or schema is None:
        raise SchemaSpecError(deriver.errors)
    try:
        assert_supported_json_schema(schema)
    except JsonSchemaError as exc:
        # A safety net: the derivation only emits the subset. Reported as the
        # same error type as every other problem of the class.
        raise SchemaSpecError(exc.violations) from exc
    frozen = snapshot_json(schema)
    assert isinstance(frozen, FrozenDict)
    derived = _Derived(schema=frozen, converter=deriver.converter)
    _CACHE[cls] = derived
    return derived


class _Deriver:
    """One derivation: walks the annotations, collecting every unsupported field path."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.converter = _strict_converter()
        # Nested classes met so far: their schema (None when they failed).
        self.classes: dict[type, dict[str, Any] | None] = {}
        # How many levels each of them nests below itself: met again deeper, it may be too deep.
        self.heights: dict[type, int] = {}
        # Whether the schemas derived so far say all that structuring checks (see ValueType.complete).
        self.complete = True
        # How many annotations enclose the one being derived (see MAX_ANNOTATION_DEPTH), and the
        # deepest level reached below the class being derived.
        self.depth = 0
        self.deepest = 0

    def class_schema(self, cls: type, path: str, ancestors: frozenset[type]) -> dict[str, Any] | None:
        if cls in self.classes:
            node = self.classes[cls]
            if node is not None:
                deepest = self.depth + self.heights[cls]
                if deepest > MAX_ANNOTATION_DEPTH:
                    self.errors.append(_nested_too_deep(path))
                    return None
                self.deepest = max(self.deepest, deepest)
            return node
        outer_deepest, self.deepest = self.deepest, self.depth
        try:
            node = self._class_schema(cls, path, ancestors)
        finally:
            self.heights[cls] = self.deepest - self.depth
            self.deepest = max(outer_deepest, self.deepest)
        self.classes[cls] = node
        return node

    def _class_schema(self, cls: type, path: str, ancestors: frozenset[type]) -> dict[str, Any] | None:
        if _checks_itself(cls):
            self.complete = False
        properties: dict[str, Any] = {}
        required: list[str] = []
        resolved: list[attrs.Attribute[Any]] = []
        ok = True
        for field in attrs.fields(cls):
            if not field.init:
                # cattrs never passes such fields to __init__, so they are not parameters.
                resolved.append(field)
                continue
            field_path = f"{path}.{field.name}"
            annotation = self._annotation(cls, field, field_path)
            derived = None if annotation is _FAILED else self.type_schema(annotation, cls, field_path, ancestors)
            description = field.metadata.get("description")
            if description is not None and type(description) is not str:
                self.errors.append(f'{field_path}: metadata "description" must be a str')
                ok = False
            if derived is None:
                ok = False
                continue
            schema, resolved_type = derived
            shown_default = _json_default(field.default)
            if shown_default is not _NOT_SHOWN:
                # The schema advertises it to the model, so it must be a value the field takes.
                wrong = self._violations(shown_default, resolved_type, "default")
                if wrong:
                    shown = repr(field.default)
                    self.errors.append(
                        f"{field_path}: the default {shown if len(shown) <= 60 else shown[:59] + '…'} "
                        f"is not a value of its annotation ({'; '.join(wrong)})"
                    )
                    ok = False
                    continue
            resolved.append(field.evolve(type=resolved_type))
            properties[field.name] = _annotate(schema, description, shown_default)
            if field.default is attrs.NOTHING:
                required.append(field.name)
        if not ok:
            return None
        node: dict[str, Any] = {"type": "object", "additionalProperties": False, "properties": properties}
        if required:
            node["required"] = required
        self._register_class_hook(cls, resolved)
        return node

    def _violations(self, value: object, resolved_type: Any, root: str) -> list[str]:
        try:
            self.converter.structure(value, resolved_type)
        except Exception as exc:
            return cattrs.transform_error(exc, path=root, format_exception=_format_exception)
        return []

    def _register_class_hook(self, cls: type, fields: list[attrs.Attribute[Any]]) -> None:
        # Built from our own resolved attributes: cattrs would otherwise resolve the
        # class's string annotations with typing.get_type_hints, which mutates the
        # class and cannot evaluate JsonValue's inner forward references.
        generated: Callable[[Mapping[str, Any], Any], Any] = cattrs.gen.make_dict_structure_fn_from_attrs(
            fields, cls, self.converter, _cattrs_forbid_extra_keys=True, _cattrs_detailed_validation=True
        )

        def structure_object(value: object, _: object) -> Any:
            if not isinstance(value, Mapping):
                _mismatch("an object", value)
            return generated(value, cls)

        # A predicate hook: register_structure_hook(cls, ...) would resolve the class's
        # annotations again with typing.get_type_hints.
        self.converter.register_structure_hook_func(lambda annotation: annotation is cls, structure_object)

    def _annotation(self, cls: type, field: attrs.Attribute[Any], path: str) -> object:
        annotation = field.type
        owner = _declaring_class(cls, field.name)
        if annotation is None:
            # attrs stores both "annotated with None" and "not annotated" as None.
            declared = inspect.get_annotations(owner)
            if field.name not in declared:
                self.errors.append(f"{path}: the field has no type annotation")
                return _FAILED
            annotation = declared[field.name]
        if isinstance(annotation, str):
            return self._evaluate(annotation, owner, path)
        return annotation

    def _evaluate(self, text: str, owner: type, path: str) -> object:
        module = sys.modules.get(owner.__module__)
        globalns = dict(vars(module)) if module is not None else {}
        try:
            # As inspect.get_annotations(eval_str=True) does: the declaring class's
            # namespace, then its module's. Nested forward references are resolved
            # lazily by type_schema, so JsonValue's own ones are never evaluated here.
            return eval(text, globalns, dict(vars(owner)))
        except Exception as exc:
            self.errors.append(f"{path}: cannot evaluate the annotation {text!r} ({type(exc).__name__}: {exc})")
            return _FAILED

    def type_schema(
        self, annotation: object, owner: type, path: str, ancestors: frozenset[type]
    ) -> tuple[dict[str, Any], Any] | None:
        """The schema of one annotation and the resolved type cattrs structures it as."""
        if self.depth >= MAX_ANNOTATION_DEPTH:
            self.errors.append(_nested_too_deep(path))
            return None
        self.depth += 1
        self.deepest = max(self.deepest, self.depth)
        try:
            return self._type_schema(annotation, owner, path, ancestors)
        finally:
            self.depth -= 1

    def _type_schema(
        self, annotation: object, owner: type, path: str, ancestors: frozenset[type]
    ) -> tuple[dict[str, Any], Any] | None:
        if isinstance(annotation, typing.ForwardRef):
            annotation = self._evaluate(annotation.__forward_arg__, owner, path)
            if annotation is _FAILED:
                return None
        if annotation is Any or _is_json_value(annotation):
            return {}, Any
        try:
            scalar = _SCALARS.get(annotation)
        except TypeError:  # an unhashable annotation object
            scalar = None
        if scalar is not None:
            return {"type": scalar[0]}, scalar[1]
        form = _STRING_FORMS.get(annotation) if isinstance(annotation, type) else None
        if form is not None:
            # The subset has no "format": the description tells the model, structuring checks.
            self.complete = False
            return {"type": "string", "description": form[0]}, annotation
        origin = get_origin(annotation)
        args = get_args(annotation)
        if origin is typing.Annotated:
            # Metadata only: not a level of the value.
            return self._type_schema(args[0], owner, path, ancestors)
        if origin is Literal:
            return self._literal(annotation, args, path)
        if origin is Union or origin is types.UnionType:
            return self._optional(annotation, args, owner, path, ancestors)
        if annotation is list or origin is list:
            return self._array(annotation, list, args, owner, path, ancestors)
        if annotation is tuple or origin is tuple:
            if args and (len(args) != 2 or args[1] is not Ellipsis):
                self.errors.append(f"{path}: fixed-length {_spell(annotation)} is not supported; use tuple[X, ...]")
                return None
            return self._array(annotation, tuple, args[:1], owner, path, ancestors)
        if annotation is dict or origin is dict:
            return self._mapping(annotation, args, owner, path, ancestors)
        if typing.is_typeddict(annotation):
            return self._typed_dict(annotation, owner, path, ancestors)
        if origin is None and isinstance(annotation, type) and issubclass(annotation, enum.Enum):
            return self._enum(annotation, path)
        if origin is None and isinstance(annotation, type) and attrs.has(annotation):
            if annotation in ancestors:
                self.errors.append(
                    f"{path}: the attrs class {annotation.__qualname__} contains itself, "
                    "which the schema subset cannot express (it has no references)"
                )
                return None
            schema = self.class_schema(annotation, path, ancestors | {annotation})
            return None if schema is None else (schema, annotation)
        self.errors.append(f"{path}: the annotation {_spell(annotation)} is not supported ({_SUPPORTED})")
        return None

    def _typed_dict(
        self, annotation: Any, owner: type, path: str, ancestors: frozenset[type]
    ) -> tuple[dict[str, Any], Any] | None:
        """A ``TypedDict``: a closed object, its required keys required (``NotRequired`` ones optional)."""
        if annotation in ancestors:
            self.errors.append(
                f"{path}: the TypedDict {annotation.__qualname__} contains itself, "
                "which the schema subset cannot express (it has no references)"
            )
            return None
        try:
            hints = _typed_dict_hints(annotation)
        except Exception as exc:
            self.errors.append(f"{path}: cannot evaluate the TypedDict {annotation.__qualname__} ({exc})")
            return None
        properties: dict[str, Any] = {}
        required: list[str] = []
        resolved: dict[str, Any] = {}
        ok = True
        for key, hint in hints.items():
            # __required_keys__ knows each key's own class's total= (the class's __total__ is only
            # its own), but with postponed annotations it cannot see a Required/NotRequired
            # written as text: the evaluated hint's qualifier, when there is one, decides.
            needed = key in annotation.__required_keys__
            while get_origin(hint) in (typing.Required, typing.NotRequired):
                needed = get_origin(hint) is typing.Required
                hint = get_args(hint)[0]
            derived = self.type_schema(hint, owner, f"{path}.{key}", ancestors | {annotation})
            if derived is None:
                ok = False
                continue
            properties[key] = _annotate(derived[0], _first_text(hint), _NOT_SHOWN)
            resolved[key] = derived[1]
            if needed:
                required.append(key)
        if not ok:
            return None
        self._register_typed_dict_hook(annotation, resolved, frozenset(required))
        node: dict[str, Any] = {"type": "object", "additionalProperties": False, "properties": properties}
        if required:
            node["required"] = required
        return node, annotation

    def _register_typed_dict_hook(self, annotation: Any, fields: dict[str, Any], required: frozenset[str]) -> None:
        # Our own hook: cattrs would take the required keys from __required_keys__, which
        # postponed annotations get wrong, and would resolve the hints again.
        converter = self.converter

        def structure_typed_dict(value: object, _: object) -> dict[str, Any]:
            if not isinstance(value, Mapping):
                _mismatch("an object", value)
            out: dict[str, Any] = {}
            for key, item in value.items():
                if key not in fields:
                    raise _StrictMismatch(f"unexpected key {key!r}")
                out[key] = converter.structure(item, fields[key])
            missing = sorted(required - out.keys())
            if missing:
                raise _StrictMismatch(f"missing required key {missing[0]!r}")
            return out

        converter.register_structure_hook_func(lambda candidate: candidate is annotation, structure_typed_dict)

    def _literal(self, annotation: object, values: tuple[Any, ...], path: str) -> tuple[dict[str, Any], Any] | None:
        schema = self._choices(values, path, "the Literal value")
        return None if schema is None else (schema, annotation)

    def _enum(self, annotation: type[enum.Enum], path: str) -> tuple[dict[str, Any], Any] | None:
        if issubclass(annotation, enum.Flag):
            # Its members combine into values no list holds: the schema could not say them.
            self.errors.append(f"{path}: the flag enum {_spell(annotation)} is not supported; use list[{_spell(annotation)}] of a plain Enum")
            return None
        members = list(annotation)
        if not members:
            self.errors.append(f"{path}: the enum {_spell(annotation)} has no members: no value could be given")
            return None
        schema = self._choices(tuple(member.value for member in members), path, f"the value of {_spell(annotation)}")
        if schema is None:
            return None
        # Registered for the class itself: an IntEnum or StrEnum would otherwise reach the
        # int or str hook (cattrs dispatches on the class's bases first) and stay a plain value.
        self.converter.register_structure_hook(annotation, _enum_structurer(annotation))
        return schema, annotation

    def _choices(self, values: tuple[Any, ...], path: str, what: str) -> dict[str, Any] | None:
        """``enum`` of ``values`` (one per JSON type in a ``oneOf`` when they mix types)."""
        groups: dict[str, list[Any]] = {}
        for value in values:
            kind = _LITERAL_KINDS.get(type(value))
            if kind is None:
                self.errors.append(f"{path}: {what} {value!r} is not JSON (use str, int, bool or None values)")
                return None
            groups.setdefault(kind, []).append(value)
        branches = [{"type": kind, "enum": members} for kind, members in groups.items()]
        return branches[0] if len(branches) == 1 else {"oneOf": branches}

    def _optional(
        self, annotation: object, members: tuple[Any, ...], owner: type, path: str, ancestors: frozenset[type]
    ) -> tuple[dict[str, Any], Any] | None:
        others = [member for member in members if member is not _NoneType]
        if len(others) != 1 or len(members) != 2:
            self.errors.append(
                f"{path}: the union {_spell(annotation)} is not supported (only X | None is; "
                "other unions cannot be told apart reliably when structuring)"
            )
            return None
        derived = self.type_schema(others[0], owner, path, ancestors)
        if derived is None:
            return None
        schema, resolved = derived
        if resolved is Any:
            return schema, Any
        if isinstance(resolved, type) and issubclass(resolved, enum.Enum):
            none_member = next((member for member in resolved if member.value is None), None)
            if none_member is not None:
                # JSON null would have to mean both None and the member: nothing in the
                # schema tells them apart, and structuring would always pick None.
                self.errors.append(
                    f"{path}: {_spell(annotation)} is ambiguous: null could be None or {none_member!r}, "
                    f"whose value is None; annotate {_spell(resolved)} alone (null gives that member)"
                )
                return None
        resolved_optional: Any = typing.Optional[resolved]  # noqa: UP045 - built at run time from a variable
        if _admits_null(schema):
            return schema, resolved_optional
        return {"oneOf": [schema, {"type": "null"}]}, resolved_optional

    def _array(
        self,
        annotation: object,
        container: type,
        args: tuple[Any, ...],
        owner: type,
        path: str,
        ancestors: frozenset[type],
    ) -> tuple[dict[str, Any], Any] | None:
        if not args:
            return {"type": "array"}, (list[Any] if container is list else tuple[Any, ...])
        derived = self.type_schema(args[0], owner, f"{path}[]", ancestors)
        if derived is None:
            return None
        items, item_type = derived
        resolved = list[item_type] if container is list else tuple[item_type, ...]  # type: ignore[valid-type]
        return {"type": "array", "items": items}, resolved

    def _mapping(
        self, annotation: object, args: tuple[Any, ...], owner: type, path: str, ancestors: frozenset[type]
    ) -> tuple[dict[str, Any], Any] | None:
        if not args:
            return {"type": "object"}, dict[str, Any]
        key, value = args
        if key is not str:
            self.errors.append(f"{path}: {_spell(annotation)} is not supported (JSON object keys are str)")
            return None
        derived = self.type_schema(value, owner, f"{path}[]", ancestors)
        if derived is None:
            return None
        # The subset has no schema for additional property values, so the schema
        # only says "object" and the strict structuring step enforces the values.
        if derived[1] is not Any:
            self.complete = False
        return {"type": "object"}, dict[str, derived[1]]  # type: ignore[valid-type]


class _Failed:
    """Marks an annotation that could not be evaluated (already reported)."""


_FAILED: Any = _Failed()

_SCALARS: dict[object, tuple[str, type]] = {
    str: ("string", str),
    int: ("integer", int),
    float: ("number", float),
    bool: ("boolean", bool),
    None: ("null", _NoneType),
    _NoneType: ("null", _NoneType),
}
_LITERAL_KINDS: dict[type, str] = {str: "string", bool: "boolean", int: "integer", _NoneType: "null"}

# Types a JSON string stands for: what the schema's description says the text is, and its parser.
_STRING_FORMS: Final[dict[type, tuple[str, Callable[[str], object]]]] = {
    datetime.datetime: ("an ISO 8601 date and time, e.g. 2026-12-05T16:30:00+00:00", datetime.datetime.fromisoformat),
    datetime.date: ("an ISO 8601 date, e.g. 2026-12-05", datetime.date.fromisoformat),
    datetime.time: ("an ISO 8601 time, e.g. 16:30:00", datetime.time.fromisoformat),
    uuid.UUID: ("a UUID, e.g. 123e4567-e89b-12d3-a456-426614174000", lambda text: _uuid(text)),
    pathlib.Path: ("a file system path", pathlib.Path),
}
_STRING_FORM_VALUES: Final = (datetime.date, datetime.time, uuid.UUID, pathlib.PurePath)
_UUID_TEXT: Final = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}")


def _uuid(text: str) -> uuid.UUID:
    """The UUID of its standard text only: uuid.UUID also took braces, "urn:uuid:", spaces, misplaced
    dashes and non-ASCII digits, so a truncated id became another, zero-padded one."""
    if not _UUID_TEXT.fullmatch(text):
        raise ValueError(text)
    return uuid.UUID(text)


def _form_text(value: datetime.date | datetime.time | uuid.UUID | pathlib.PurePath) -> str:
    """The JSON text of a string form's value (what a model would send for it)."""
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    return str(value)


def _first_text(annotation: object) -> str | None:
    """The first plain string in an ``Annotated[X, ...]``'s metadata (a description)."""
    if get_origin(annotation) is typing.Annotated:
        return next((item for item in get_args(annotation)[1:] if isinstance(item, str)), None)
    return None


def _checks_itself(cls: type) -> bool:
    """Whether building an instance of the attrs class ``cls`` runs its own code, which may refuse a value."""
    if any(field.validator is not None or field.converter is not None for field in attrs.fields(cls)):
        return True
    # attrs' init hooks, or a hand-written __init__ (a class declared init=False).
    code = getattr(vars(cls).get("__init__"), "__code__", None)
    generated = code is not None and code.co_filename.startswith("<attrs generated")
    return not generated or hasattr(cls, "__attrs_pre_init__") or hasattr(cls, "__attrs_post_init__")


def _typed_dict_hints(annotation: Any) -> dict[str, Any]:
    """A TypedDict's evaluated annotations.

    ``get_type_hints`` evaluates the forward references inside an alias too, in the
    TypedDict's module: a key typed ``JsonValue`` failed where that module had not
    imported ``FrozenDict``. Only then are JsonValue's own names lent to it.
    """
    try:
        return typing.get_type_hints(annotation, include_extras=True)
    except NameError:
        names = {"FrozenDict": FrozenDict, "FrozenList": FrozenList, "JsonValue": JsonValue}
        return typing.get_type_hints(annotation, localns=names, include_extras=True)


def _is_json_value(annotation: object, *, inner: bool = False) -> bool:
    """Whether ``annotation`` is ``JsonValue``, as written or as ``typing.get_type_hints`` hands it back.

    ``JsonValue | None`` flattens into a new Union equal to JsonValue (it already holds
    None). ``get_type_hints`` (which ``@tool`` reads a function with) evaluates the
    forward references inside it: ``"FrozenDict"`` becomes the class and the array
    member's ``"JsonValue"`` a copy of the Union, so neither ``is`` nor ``==`` held.
    """
    if annotation is JsonValue:
        return True
    if get_origin(annotation) is not Union:
        return False
    members: set[object] = set()
    for member in get_args(annotation):
        if isinstance(member, ForwardRef):
            members.add(member.__forward_arg__)
        elif member is FrozenDict:
            members.add("FrozenDict")
        elif get_origin(member) is tuple:
            items = get_args(member)
            is_list = len(items) == 2 and items[1] is Ellipsis and (
                inner  # one level down is enough to tell the alias apart
                or items[0] == "JsonValue"  # tuple[...] keeps a string as it is
                or (isinstance(items[0], ForwardRef) and items[0].__forward_arg__ == "JsonValue")
                or _is_json_value(items[0], inner=True)
            )
            if not is_list:
                return False
            members.add("FrozenList")
        else:
            members.add(member)
    return members == _JSON_VALUE_MEMBERS


_JSON_VALUE_MEMBERS: Final[frozenset[object]] = frozenset({bool, int, float, str, "FrozenList", "FrozenDict", type(None)})


def _declaring_class(cls: type, name: str) -> type:
    for base in cls.__mro__:
        if name in inspect.get_annotations(base):
            return base
    return cls


_NOT_SHOWN: Any = object()


def _json_default(default: object) -> object:
    """The JSON form of a field's default the schema shows, or ``_NOT_SHOWN``."""
    if default is attrs.NOTHING or isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        return _NOT_SHOWN
    if isinstance(default, enum.Enum):
        default = default.value  # what the model would send for it
    elif isinstance(default, _STRING_FORM_VALUES):
        default = _form_text(default)
    try:
        return thaw(snapshot_json(default))
    except NonJsonValueError:
        # Only an annotation: a default that is not JSON simply is not shown.
        return _NOT_SHOWN


def _annotate(schema: dict[str, Any], description: str | None, default: object) -> dict[str, Any]:
    node = dict(schema)
    if description is not None:
        # A string form's own description (its format) stays, after the field's.
        node["description"] = f"{description} ({node['description']})" if "description" in node else description
    if default is not _NOT_SHOWN:
        node["default"] = default
    return node


def _admits_null(schema: dict[str, Any]) -> bool:
    if "oneOf" in schema:
        return any(_admits_null(branch) for branch in schema["oneOf"])
    return "type" not in schema or schema["type"] == "null"


def _spell(annotation: object) -> str:
    if isinstance(annotation, type) and not get_args(annotation):
        return annotation.__qualname__
    return repr(annotation).replace("typing.", "")


# ---------------------------------------------------------------------------
# The strict converter


class _StrictMismatch(TypeError):
    """A value of the wrong JSON type; its message is shown as is."""


def _mismatch(expected: str, value: object) -> NoReturn:
    raise _StrictMismatch(f"expected {expected}, got {_describe(value)}")


def _describe(value: object) -> str:
    if value is None:
        return "null"
    if type(value) is bool:
        return "a boolean"
    if type(value) in (int, float):
        return f"the number {value!r}"
    if type(value) is str:
        return "a string"
    if isinstance(value, (list, tuple)):
        return "an array"
    if isinstance(value, Mapping):
        return "an object"
    return type(value).__name__


def _structure_str(value: object, _: object) -> str:
    if type(value) is not str:
        _mismatch("a string", value)
    return value


def _structure_bool(value: object, _: object) -> bool:
    if type(value) is not bool:
        _mismatch("a boolean", value)
    return value


def _structure_int(value: object, _: object) -> int:
    if type(value) is int:
        return value
    # The schema's integer is "an integral number", so 2.0 passed validation.
    if type(value) is float and value.is_integer():
        return int(value)
    _mismatch("an integer", value)


def _structure_float(value: object, _: object) -> float:
    if type(value) is float:
        return value
    if type(value) is int:
        try:
            converted = float(value)
        except OverflowError:
            converted = None
        if converted is not None and int(converted) == value:
            return converted
        raise _StrictMismatch(f"the integer {value!r} has no exact float value")
    _mismatch("a number", value)


def _structure_none(value: object, _: object) -> None:
    if value is not None:
        _mismatch("null", value)


def _is_literal(annotation: Any) -> bool:
    return get_origin(annotation) is Literal


def _literal_factory(annotation: Any) -> Callable[[object, object], object]:
    members = get_args(annotation)

    def structure_literal(value: object, _: object) -> object:
        for member in members:
            # JSON equality: type-strict for booleans, 1.0 equals the member 1.
            if json_equal(member, value):
                return member
        raise _StrictMismatch(f"expected one of {json.dumps(list(members))}, got {_describe(value)}")

    return structure_literal


def _enum_structurer(annotation: type[enum.Enum]) -> Callable[[object, object], object]:
    members = list(annotation)

    def structure_enum(value: object, _: object) -> object:
        for member in members:
            # As a Literal: the member whose value equals the JSON value (1.0 is 1, true is not 1).
            if json_equal(member.value, value):
                return member
        values = json.dumps([member.value for member in members])
        raise _StrictMismatch(f"expected one of {values}, got {_describe(value)}")

    return structure_enum


def _string_form_structurer(what: str, parse: Callable[[str], object]) -> Callable[[object, object], object]:
    short = what.partition(", e.g.")[0]

    def structure_string_form(value: object, _: object) -> object:
        if type(value) is not str:
            _mismatch(f"a string ({short})", value)
        # A path with a NUL byte opens nothing; uuid.UUID would also take "{...}" and "urn:uuid:" forms.
        if "\0" in value or not value:
            raise _StrictMismatch(f"expected {short}, got {json.dumps(value[:80])}")
        try:
            return parse(value)
        except ValueError:
            raise _StrictMismatch(f"expected {short}, got {json.dumps(value[:80])}") from None

    return structure_string_form


def _container_factory(
    accepted: tuple[type, ...], expected: str, factory: Callable[[Any, cattrs.BaseConverter], Any]
) -> Callable[[Any, cattrs.BaseConverter], Callable[[object, object], object]]:
    def make(annotation: Any, converter: cattrs.BaseConverter) -> Callable[[object, object], object]:
        inner = factory(annotation, converter)

        def structure_container(value: object, _: object) -> object:
            # cattrs would iterate any iterable: a str would become a list of characters.
            if not isinstance(value, accepted):
                _mismatch(expected, value)
            return inner(value, annotation)

        return structure_container

    return make


def _origin_is(container: type) -> Callable[[Any], bool]:
    return lambda annotation: get_origin(annotation) is container


def _strict_converter() -> cattrs.Converter:
    converter = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
    converter.register_structure_hook(str, _structure_str)
    converter.register_structure_hook(bool, _structure_bool)
    converter.register_structure_hook(int, _structure_int)
    converter.register_structure_hook(float, _structure_float)
    converter.register_structure_hook(_NoneType, _structure_none)
    for form, (what, parse) in _STRING_FORMS.items():
        converter.register_structure_hook(form, _string_form_structurer(what, parse))
    converter.register_structure_hook_factory(_is_literal, _literal_factory)
    converter.register_structure_hook_factory(
        _origin_is(list), _container_factory((list, tuple), "an array", cattrs.cols.list_structure_factory)
    )
    converter.register_structure_hook_factory(
        _origin_is(tuple),
        _container_factory((list, tuple), "an array", cattrs.cols.homogenous_tuple_structure_factory),
    )
    converter.register_structure_hook_factory(
        _origin_is(dict), _container_factory((dict,), "an object", cattrs.cols.mapping_structure_factory)
    )
    return converter


def _format_exception(exc: BaseException, annotation: type | None) -> str:
    if isinstance(exc, _StrictMismatch):
        return str(exc)
    if isinstance(exc, (ValueError, TypeError)) and annotation is None and str(exc):
        # Raised by the class itself (an attrs validator): its own words say most.
        return f"invalid value ({exc})"
    return cattrs.v.format_exception(exc, annotation)
