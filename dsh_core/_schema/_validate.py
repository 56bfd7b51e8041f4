"""Validating values against the enforced JSON Schema subset.

Two checkers agree on one set of rules. The fast one is a fastjsonschema
function, compiled once per schema content and cached; it only says yes or no.
The full one is an iterative walk that reports every violation with its path.
A value is checked by the fast one first; only when it says no (or cannot be
built for the schema) does the full one run, so a passing call costs one
compiled check and a failing call still gets the complete report.

fastjsonschema follows draft-07, which differs from the subset in a few places:
it accepts ``NaN``, ``±inf`` and ``-0.0`` as numbers, dict/str/int subclasses,
``Decimal`` and anything at all under an annotation-only node. The fast path
therefore first requires the value to be lossless JSON (a ``FrozenDict`` is by
construction); on lossless values the two agree, which the test suite checks
with generated schemas and values.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final

import fastjsonschema

from .._errors import KEPT_VIOLATIONS, QUOTED_CHARS, JsonSchemaError, NonJsonValueError, Violations
from .._json import FrozenDict, int_fits_json, int_json_problem, is_flat_json_object, snapshot_json
from .._jsoncodec import encode_json
from ._flat import FlatReader, compile_flat_reader
from ._path import LinkedPath
from ._subset import JsonSchemaNode, assert_supported_json_schema, same_scalar, scalar_key, scalar_matches

__all__ = [
    "CompiledValidator",
    "compile_validator",
    "report_violations",
    "validate_json_schema_value",
]

# fastjsonschema generates nested Python blocks for nested schema levels, and
# CPython refuses more than 20 statically nested blocks or 100 indentation
# levels. Measured with fastjsonschema 2.22.3 on 3.11: a oneOf chain fails at
# 20 levels, an items chain at 21, properties at 49, and thousands of random
# mixes of the three compiled at 18. Past the limit (or if compiling fails for
# any other reason) the iterative checker does the whole job.
_FAST_MAX_DEPTH: Final = 16
# Compiling costs roughly 0.5 ms per node (a 1 000-property schema takes about a
# second); past this size the iterative checker alone is the better deal.
_FAST_MAX_NODES: Final = 1000
# fastjsonschema tests an enum as a chain of comparisons, one per entry
# (measured: about 25 ns per string entry, 80 ns per number entry, so a
# 600-value enum costs 15-50 us per checked value). Past _FAST_MAX_STRING_ENUM
# distinct entries a string enum is handed to it as a custom format testing
# membership in a set (about 100 ns whatever the size); a schema holding a
# number/integer enum of more than _FAST_MAX_ENUM distinct entries gets no fast
# path, since the iterative checker (a few us per value, membership in a set,
# see _EnumCheck) is then the cheaper one.
_FAST_MAX_STRING_ENUM: Final = 8
_FAST_MAX_ENUM: Final = 32
_CACHE_LIMIT: Final = 4096


def _is_lossless(value: object) -> bool:
    """Whether ``snapshot_json(value)`` would succeed, found without building the snapshot."""
    kind = type(value)
    if kind is str or kind is bool or value is None or kind is FrozenDict:
        return True
    if kind is int:
        return int_fits_json(value)  # type: ignore[arg-type]
    if kind is float:
        return _is_json_float(value)  # type: ignore[arg-type]
    if kind is not dict and kind is not list and kind is not tuple:
        return False
    if kind is dict and is_flat_json_object(value):  # type: ignore[arg-type]
        return True  # the common argument object, without setting up the walk
    # A frame is (entries, id of the container, is it an object); ``on_path``
    # holds the containers being walked, so a container inside itself is a cycle.
    on_path = {id(value)}
    stack: list[tuple[Iterator[Any], int, bool]] = [_entries(value)]
    while stack:
        entries, ident, is_object = stack[-1]
        for entry in entries:
            if is_object:
                key, item = entry
                if type(key) is not str:
                    return False
            else:
                item = entry
            item_kind = type(item)
            if item_kind is str or item_kind is bool or item is None or item_kind is FrozenDict:
                continue
            if item_kind is int:
                if not int_fits_json(item):
                    return False
                continue
            if item_kind is float:
                if not _is_json_float(item):
                    return False
                continue
            if item_kind is dict or item_kind is list or item_kind is tuple:
                if id(item) in on_path:
                    return False
                on_path.add(id(item))
                stack.append(_entries(item))
                break
            return False
        else:
            stack.pop()
            on_path.discard(ident)
    return True


def _entries(container: Any) -> tuple[Iterator[Any], int, bool]:
    if type(container) is dict:
        return iter(container.items()), id(container), True
    return iter(container), id(container), False


def _is_json_float(number: float) -> bool:
    return math.isfinite(number) and not (number == 0.0 and math.copysign(1.0, number) < 0)


def _child_path(path: LinkedPath, key: object) -> LinkedPath:
    """The path of property ``key`` under ``path``: ``.key`` (``key`` under a blank root), ``[""]`` for ``""``.

    The empty name is spelled in bracket form, so a child path is never blank:
    under the parameter validator's blank root, a blank path would read as the
    whole ``arguments``, and elsewhere as a dangling ``value.``.
    """
    if key == "":
        return path.child('[""]')
    return path.child(str(key) if path.blank else f".{key}")


class _Violation:
    """One violation found: spelled out only if it is among those reported.

    A failing value can hold a violation for every part of it, each quoting a
    path that may be thousands of levels deep: the walk keeps these (a path
    link and the words around it) and spells out only the first few, each
    path elided in the middle past :data:`QUOTED_CHARS`.
    """

    __slots__ = ("after", "before", "labelled", "path")

    def __init__(self, path: LinkedPath, after: str, *, before: str = '"', labelled: bool = True) -> None:
        self.before = before
        self.path = path
        self.after = after
        # The parameter validator passes an empty root path; as a subject it reads as "arguments".
        self.labelled = labelled

    def __str__(self) -> str:
        spelled = "arguments" if self.labelled and self.path.blank else self.path.shortened(QUOTED_CHARS)
        return f"{self.before}{spelled}{self.after}"


def _at(path: LinkedPath, problem: str) -> list[_Violation]:
    """``"<path>" <problem>``: the one violation of a value."""
    return [_Violation(path, f'" {problem}')]


def _kept(violations: list[_Violation], found: list[_Violation]) -> int:
    """Append ``found`` to ``violations`` up to KEPT_VIOLATIONS; return how many did not fit.

    A frame's violations stay together and in order in its parent's, so one
    that is not among a frame's first KEPT_VIOLATIONS is never among the
    reported ones: counting it is enough.
    """
    room = max(KEPT_VIOLATIONS - len(violations), 0)
    if len(found) <= room:
        violations.extend(found)
        return 0
    violations.extend(found[:room])
    return len(found) - room


class _EnumCheck:
    """The membership test of one ``enum`` node: a set of :func:`scalar_key` keys, O(1) per value.

    ``keys`` is None when an entry has no key (the subset only allows scalars,
    so only for a schema that was never asserted): membership then falls back
    to comparing with every entry, as :func:`same_scalar` does.
    """

    __slots__ = ("_text", "allowed", "keys")

    def __init__(self, allowed: Any) -> None:
        self.allowed = allowed
        keys = [scalar_key(entry) for entry in allowed]
        self.keys: frozenset[tuple[object, ...]] | None = (
            None if None in keys else frozenset(key for key in keys if key is not None)
        )
        self._text: str | None = None

    def admits(self, value: object) -> bool:
        keys = self.keys
        if keys is None:
            return any(same_scalar(value, entry) for entry in self.allowed)
        key = scalar_key(value)
        # Without a key the value is no plain JSON scalar, which equals no entry.
        return key is not None and key in keys

    @property
    def text(self) -> str:
        """The entries as JSON, encoded once however many values miss them."""
        if self._text is None:
            self._text = encode_json(self.allowed, ascii_only=False)
        return self._text


_EnumChecks = dict[int, tuple[JsonSchemaNode, _EnumCheck]]
"""``id(node)`` of each ``enum`` node → the node (kept alive, so the id stays its own) and its check."""


def _enum_checks(schema: JsonSchemaNode) -> _EnumChecks:
    """The membership test of every ``enum`` node of an asserted ``schema``, walked without recursion."""
    checks: _EnumChecks = {}
    stack = [schema]
    while stack:
        node = stack.pop()
        if "enum" in node:
            checks[id(node)] = (node, _EnumCheck(node["enum"]))
        if "properties" in node:
            stack.extend(node["properties"].values())
        if "items" in node:
            stack.append(node["items"])
        if "oneOf" in node:
            stack.extend(node["oneOf"])
    return checks


def _enum_check(checks: _EnumChecks, node: JsonSchemaNode) -> _EnumCheck:
    known = checks.get(id(node))
    if known is not None and known[0] is node:
        return known[1]
    check = _EnumCheck(node["enum"])
    checks[id(node)] = (node, check)
    return check


class _UnassertedSchemaError(ValueError):
    """A node the subset assertion would have refused reached the checker."""


# Frame kinds of the iterative checker.
_UNSTARTED: Final = 0
_ONE_OF: Final = 1
_OBJECT: Final = 2
_ARRAY: Final = 3


class _Frame:
    """One pending (node, value) check; ``pending`` holds its children, last first.

    Paths are :class:`LinkedPath` links, spelled out only in a message: a frame
    waits for its whole subtree, so paths kept as text would cost memory
    quadratic in depth.
    """

    __slots__ = ("kind", "matches", "node", "omitted", "path", "pending", "value", "violations")

    def __init__(self, node: JsonSchemaNode, value: object, path: LinkedPath) -> None:
        self.node = node
        self.value = value
        self.path = path
        self.kind = _UNSTARTED
        self.pending: list[tuple[JsonSchemaNode, object, LinkedPath]] = []
        # The first KEPT_VIOLATIONS violations found, and how many others.
        self.violations: list[_Violation] = []
        self.omitted = 0
        self.matches = 0


def report_violations(
    schema: JsonSchemaNode, value: object, path: str = "value", *, enums: _EnumChecks | None = None
) -> tuple[str, ...]:
    """Every violation of ``value`` against an *asserted* ``schema``, in walk order (up to a bound).

    This is the full-report checker on its own, without the schema assertion,
    the cache or the fastjsonschema fast path; :func:`validate_json_schema_value`
    is the public entry point. It walks with explicit frames, so neither deep
    schemas nor deep values reach the recursion limit. Any exception raised while
    inspecting the value is contained and reported as ``"<path>" must be a
    lossless JSON value``. The first ``KEPT_VIOLATIONS`` (100) are spelled out,
    each quoted path elided in the middle past ``QUOTED_CHARS`` (200); when
    there were more, the tuple is a :class:`~dsh_core._errors.Violations` whose
    ``omitted`` counts them. ``enums`` holds the ``enum`` membership sets
    :class:`CompiledValidator` built for ``schema``; without it they are built
    as the walk meets each ``enum`` node.
    """
    if enums is None:
        enums = {}
    frames = [_Frame(schema, value, LinkedPath.root(path))]
    while True:
        frame = frames[-1]
        outcome: list[_Violation] | None
        try:
            if frame.kind == _UNSTARTED:
                outcome = _start(frame, enums)
            elif frame.pending:
                frames.append(_Frame(*frame.pending.pop()))
                continue
            else:
                outcome = _finish(frame)
        except _UnassertedSchemaError:
            raise
        except Exception:
            # Only the top frame was running, so only it is abandoned.
            outcome = _at(frame.path, "must be a lossless JSON value")
            frame.omitted = 0
        if outcome is None:
            continue
        frames.pop()
        if not frames:
            spelled = (str(violation) for violation in outcome)
            return Violations(spelled, frame.omitted) if frame.omitted else tuple(spelled)
        parent = frames[-1]
        if parent.kind == _ONE_OF:
            # A branch's own violations never surface: only whether it matched.
            if not outcome:
                parent.matches += 1
        else:
            parent.omitted += _kept(parent.violations, outcome) + frame.omitted


def _start(frame: _Frame, enums: _EnumChecks) -> list[_Violation] | None:
    """Check what can be checked at once; return the result, or None after scheduling children."""
    node, value, path = frame.node, frame.value, frame.path
    if "oneOf" in node:
        frame.kind = _ONE_OF
        frame.pending = [(branch, value, path) for branch in reversed(node["oneOf"])]
        return None
    if "type" not in node:
        return [] if _is_lossless(value) else _at(path, "must be a lossless JSON value")

    schema_type = node["type"]
    kind = type(value)
    if schema_type == "object":
        if kind is not dict and kind is not FrozenDict:
            return _at(path, "must be an object")
        properties: Mapping[str, JsonSchemaNode] = node.get("properties") or {}
        frame.kind = _OBJECT
        frame.omitted = _kept(
            frame.violations,
            [
                _Violation(_child_path(path, name), '"', before='missing required property "', labelled=False)
                for name in node.get("required") or ()
                if name not in value  # type: ignore[operator]
            ],
        )
        frame.pending = [
            (child, value[name], _child_path(path, name))  # type: ignore[index]
            for name, child in reversed(list(properties.items()))
            if name in value  # type: ignore[operator]
        ]
        return None
    if schema_type == "array":
        if kind is not list and kind is not tuple:
            return _at(path, "must be an array")
        if "items" not in node:
            return [] if _is_lossless(value) else _at(path, "must be a dense lossless JSON array")
        items = node["items"]
        elements: list[object] = list(value)  # type: ignore[call-overload]
        frame.kind = _ARRAY
        frame.pending = [
            (items, elements[index], path.child(f"[{index}]")) for index in range(len(elements) - 1, -1, -1)
        ]
        return None
    if kind is int and not int_fits_json(value):  # type: ignore[arg-type]
        return _at(path, f"must be a lossless JSON value: {int_json_problem(value)}")  # type: ignore[arg-type]
    if schema_type == "string":
        ok = kind is str
    elif schema_type == "number":
        if kind is bool or (kind is not int and kind is not float):
            return _at(path, "must be a number")
        ok = scalar_matches("number", value)
        if not ok:
            return _at(path, "must be a finite JSON number")
    elif schema_type in ("integer", "boolean", "null"):
        ok = scalar_matches(schema_type, value)
    else:
        raise _UnassertedSchemaError(f"unreachable schema type {schema_type!r}: assert the schema first")
    if not ok:
        article = "an" if schema_type == "integer" else "a"
        noun = "null" if schema_type == "null" else f"{article} {schema_type}"
        return _at(path, f"must be {noun}")
    return _scalar_constraints(node, value, path, enums)


def _scalar_constraints(node: JsonSchemaNode, value: object, path: LinkedPath, enums: _EnumChecks) -> list[_Violation]:
    if "enum" in node:
        check = _enum_check(enums, node)
        if not check.admits(value):
            return _at(path, f"must be one of {check.text}")
    if "const" in node and not same_scalar(value, node["const"]):
        return _at(path, f"must be {encode_json(node['const'], ascii_only=False)}")
    return []


def _finish(frame: _Frame) -> list[_Violation]:
    """Conclude a frame whose children have all reported."""
    if frame.kind == _ONE_OF:
        if frame.matches == 1:
            return []
        return _at(frame.path, f"must match exactly one oneOf branch (matched {frame.matches})")
    violations = frame.violations
    if frame.kind == _OBJECT and frame.node.get("additionalProperties") is False:
        # After the declared properties' own violations. A key that is not a str is
        # not a property at all: the check below reports it.
        properties: Mapping[str, JsonSchemaNode] = frame.node.get("properties") or {}
        path = frame.path
        frame.omitted += _kept(
            violations,
            [
                _Violation(
                    _child_path(path, key), '" is not a declared property (additionalProperties: false)', labelled=False
                )
                for key in frame.value  # type: ignore[attr-defined]
                if type(key) is str and key not in properties
            ],
        )
    if frame.kind == _OBJECT and type(frame.value) is dict and any(type(key) is not str for key in frame.value):
        frame.omitted += _kept(violations, _at(frame.path, "must be a lossless JSON object"))
        return violations
    if violations or frame.kind == _ARRAY:
        # Every element of an items-checked array was validated, and a valid
        # child is lossless JSON, so nothing is left to check.
        return violations
    value: Any = frame.value
    if type(value) is FrozenDict:
        return []
    # Declared properties were validated as children; what remains unchecked
    # is the key types and the values of undeclared keys (open objects).
    declared = frame.node.get("properties") or {}
    for key, item in value.items():
        if type(key) is not str or (key not in declared and not _is_lossless(item)):
            return _at(frame.path, "must be a lossless JSON object")
    return []


_Formats = dict[str, Callable[[str], bool]]


def _fastjsonschema_form(schema: JsonSchemaNode) -> tuple[dict[str, Any], _Formats] | None:
    """The plain-dict schema to hand fastjsonschema and its custom formats, or None when it gets no fast path.

    None when the schema is too deep or too big to compile, or holds a
    non-string ``enum`` of more than ``_FAST_MAX_ENUM`` distinct entries. A
    string ``enum`` of more than ``_FAST_MAX_STRING_ENUM`` becomes a custom
    ``format`` testing membership in a set (fastjsonschema applies a format to
    strings only, and the node's type already refuses anything else).

    Annotations are left out: they never affect validation, and fastjsonschema's
    reference resolver would otherwise walk (recursively) into ``default`` and
    ``examples`` data.
    """
    root: dict[str, Any] = {}
    formats: _Formats = {}
    nodes = 0
    stack: list[tuple[JsonSchemaNode, dict[str, Any], int]] = [(schema, root, 1)]
    while stack:
        node, out, depth = stack.pop()
        nodes += 1
        if depth > _FAST_MAX_DEPTH or nodes > _FAST_MAX_NODES:
            return None
        for key, item in node.items():
            if key == "properties":
                children: dict[str, Any] = {}
                for name, child in item.items():
                    child_out: dict[str, Any] = {}
                    children[name] = child_out
                    stack.append((child, child_out, depth + 1))
                out[key] = children
            elif key == "items":
                item_out: dict[str, Any] = {}
                out[key] = item_out
                stack.append((item, item_out, depth + 1))
            elif key == "oneOf":
                branches: list[dict[str, Any]] = []
                for branch in item:
                    branch_out: dict[str, Any] = {}
                    branches.append(branch_out)
                    stack.append((branch, branch_out, depth + 1))
                out[key] = branches
            elif key == "enum":
                entries = _distinct(item)
                if node.get("type") == "string" and len(entries) > _FAST_MAX_STRING_ENUM:
                    name = f"dsh-enum-{len(formats)}"
                    formats[name] = frozenset(entries).__contains__
                    out["format"] = name
                elif len(entries) > _FAST_MAX_ENUM:
                    return None
                else:
                    out[key] = entries
            elif key == "required":
                out[key] = list(item)
            elif key in ("type", "additionalProperties", "const"):
                out[key] = item
    return root, formats


def _distinct(entries: Any) -> list[Any]:
    """``entries`` without repeats (by JSON equality), in order: the same enum in fewer comparisons."""
    seen: set[tuple[object, ...]] = set()
    kept: list[Any] = []
    for entry in entries:
        key = scalar_key(entry)
        if key is None:
            kept.append(entry)
        elif key not in seen:
            seen.add(key)
            kept.append(entry)
    return kept


def _compile_fast(schema: JsonSchemaNode) -> Callable[[Any], Any] | None:
    found = _fastjsonschema_form(schema)
    if found is None:
        return None
    form, formats = found
    try:
        # use_default=False: the default (True) writes schema defaults into the
        # caller's value. The subset has no formats: the only ones are the
        # enum sets the form names itself.
        validate: Callable[[Any], Any] = fastjsonschema.compile(
            form, formats=formats, use_default=False, use_formats=bool(formats)
        )
    except Exception:
        # SyntaxError/IndentationError from generated code nested too deeply,
        # RecursionError/MemoryError, JsonSchemaDefinitionException, or a
        # fastjsonschema bug: the iterative checker covers every schema alone.
        return None
    return validate


class CompiledValidator:
    """A validator bound to one asserted schema; call it with a value to get its violations.

    Obtain one from :func:`compile_validator`. Calling it returns ``()`` for a
    valid value and otherwise every violation, exactly as
    :func:`validate_json_schema_value` does. ``schema`` is the immutable
    snapshot it validates against; ``uses_fastjsonschema`` says whether the
    compiled fast path is in use (False for schemas too deep or too large for
    fastjsonschema to compile). ``flat_reader`` checks and freezes the simplest
    values of a flat object schema in one pass (``None`` for other schemas).
    """

    __slots__ = ("_enums", "_fast", "flat_reader", "schema")

    def __init__(self, schema: JsonSchemaNode) -> None:
        self.schema = schema
        self._enums = _enum_checks(schema)
        self._fast = _compile_fast(schema)
        self.flat_reader: FlatReader | None = compile_flat_reader(schema)

    @property
    def uses_fastjsonschema(self) -> bool:
        """Whether a compiled fastjsonschema function answers valid values."""
        return self._fast is not None

    @property
    def fast_function(self) -> Callable[[Any], Any] | None:
        """The compiled fastjsonschema function, for values already known to be lossless JSON.

        It raises on an invalid value and says nothing about why (the full
        checker does); ``None`` when the schema has no fast path.
        """
        return self._fast

    def __call__(self, value: object, path: str = "value") -> tuple[str, ...]:
        reader = self.flat_reader
        if (reader is not None and reader(value) is not None) or self.fast_path_accepts(value):
            return ()
        return report_violations(self.schema, value, path, enums=self._enums)

    def fast_path_accepts(self, value: object) -> bool:
        """Whether the compiled fast path alone accepts ``value`` (False when there is no fast path)."""
        validate = self._fast
        if validate is None or not _is_lossless(value):
            return False
        try:
            validate(value)
        except Exception:
            # JsonSchemaValueException, or generated code tripping over an odd
            # property name: either way the full checker decides.
            return False
        return True

    def __repr__(self) -> str:
        return f"<CompiledValidator {encode_json(self.schema, ascii_only=False)[:80]}>"


_cache: dict[str, CompiledValidator] = {}
# Immutable schemas are also found by identity, which skips the key computation;
# each entry keeps its schema alive, so an id is never reused while it is here.
_by_identity: dict[int, tuple[FrozenDict, CompiledValidator]] = {}
_cache_lock = threading.Lock()


def compile_validator(schema: object) -> CompiledValidator:
    """Assert ``schema`` once and return a cached validator for its content.

    The returned :class:`CompiledValidator` is a callable
    ``(value, path="value") -> tuple[str, ...]``. Validators are cached by
    schema content (key order included, since it fixes the order of reported
    violations), so equal schemas share one validator object; the cache keeps
    the most recently used few thousand. The schema is snapshotted, so mutating
    it afterwards does not change the validator.

    Raises:
        JsonSchemaError: the schema is outside the enforced subset (see
            :func:`~dsh_core.schema.assert_supported_json_schema`).
    """
    if type(schema) is FrozenDict:
        known = _by_identity.get(id(schema))
        if known is not None and known[0] is schema:
            return known[1]
    try:
        snapshot = snapshot_json(schema)
    except NonJsonValueError:
        # Not lossless: the assertion explains why, path by path.
        assert_supported_json_schema(schema)
        raise JsonSchemaError(["schema must be lossless JSON data"]) from None
    key = encode_json(snapshot, ascii_only=False)  # any depth: the codec falls back to an iterative encoder
    with _cache_lock:
        validator = _cache.pop(key, None)
        if validator is not None:
            _cache[key] = validator  # most recently used goes last
    if validator is None:
        assert_supported_json_schema(snapshot)
        validator = CompiledValidator(snapshot)  # type: ignore[arg-type]
        with _cache_lock:
            validator = _cache.setdefault(key, validator)
            while len(_cache) > _CACHE_LIMIT:
                del _cache[next(iter(_cache))]
    if snapshot is schema and isinstance(snapshot, FrozenDict):
        with _cache_lock:
            _by_identity[id(snapshot)] = (snapshot, validator)
            while len(_by_identity) > _CACHE_LIMIT:
                del _by_identity[next(iter(_by_identity))]
    return validator


def validate_json_schema_value(schema: object, value: object, path: str = "value") -> tuple[str, ...]:
    """Every way ``value`` violates ``schema`` (the first 100, see :func:`report_violations`); ``()`` means valid.

    Messages quote the JSON path of the offending value (``"value.a" must be a
    string``, ``missing required property "value.b"``). ``path`` is the root
    label; the empty string reads as ``arguments`` and makes child paths start
    without a dot (``config.host``, ``servers[1].host``). The empty property
    name is spelled ``[""]`` (``config[""]``). Any Python value may
    be given: one that is not lossless JSON is a violation, never an exception.
    ``integer`` accepts integral floats (``1.0``), ``bool`` never satisfies
    ``number`` or ``integer``, and ``enum``/``const`` compare type-strictly
    (``True`` is not ``1``; ``1`` equals ``1.0``). Defaults are never applied
    and ``value`` is never modified.

    Raises:
        JsonSchemaError: the schema is outside the enforced subset.
    """
    return compile_validator(schema)(value, path)
