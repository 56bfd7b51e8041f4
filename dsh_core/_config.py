"""Host configuration: the ``dsh.toml`` file and strict structuring of plugin tables.

Two things live here:

* :func:`structure_table` turns a plain TOML table (or any ``dict`` of plain
  values) into an attrs class with a *strict* cattrs converter, so that a
  plugin's ``[plugins.<name>]`` table is checked the same way everywhere.
* :class:`DshConfig` and :func:`load_config`: the host's own settings, read from
  ``dsh.toml`` or ``[tool.dsh]`` in ``pyproject.toml``.

The layout of a configuration file::

    mode = "native"                 # "native" | "code" | "both"
    disabled_plugins = ["timeout"]  # entry-point names not to load
    strict_capabilities = false
    session_log = "calls.jsonl"

    [tool_prefixes]                 # register a plugin's tools as "<prefix>__<name>"
    dsh-example-tools = "ex"        # (two plugins offering the same tool name can then both load)

    [plugins.permissions]           # handed, as a dict, to that plugin's dsh_setup
    rules = [{ tool = "bash", action = "ask" }]
"""

from __future__ import annotations

import codecs
import collections.abc
import datetime
import json
import math
import os
import re
import tomllib
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Final, Literal, TypeVar, get_args, get_origin

import attrs
import cattrs
import cattrs.cols
import cattrs.gen
from cattrs.errors import AttributeValidationNote, ClassValidationError, ForbiddenExtraKeysError

from ._checks import (
    instance_of,
    memory_limit_problem,
    one_of,
    positive_finite,
    resource_limit_problem,
    usable_path,
)
from ._errors import QUOTED_CHARS, ConfigError, bounded_listing, elide_middle
from ._json import safe_repr

__all__ = ["DshConfig", "load_config", "structure_table"]

T = TypeVar("T")

_NoneType = type(None)

# Separates a formatted message from the path ``cattrs.transform_error`` appends
# (``"<message> @ <path>"``). Values are rendered with ``json.dumps``, which
# escapes NUL, so no message can contain the marker.
_END = "\x00"


class _Mismatch(TypeError):
    """A value of the wrong kind; its message is shown to the user as is."""


# -- rendering values in messages --------------------------------------------------


def _show(value: object) -> str:
    """A short TOML-flavoured rendering of ``value`` for an error message."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        text = json.dumps(value, ensure_ascii=False)
        return text if len(text) <= 60 else text[:56] + '..."'
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, datetime.date | datetime.time):
        return f"a date/time ({value.isoformat()})"
    if isinstance(value, list | tuple):
        return "an array"
    if isinstance(value, Mapping):
        return "a table"
    if value is None:
        return "nothing (None)"
    return f"a {type(value).__name__}"


def _mismatch(expected: str, value: object) -> typing.NoReturn:
    raise _Mismatch(f"expected {expected}, got {_show(value)}")


# -- strict scalar hooks --------------------------------------------------------------


def _structure_str(value: object, _: object) -> str:
    if type(value) is not str:
        _mismatch("a string", value)
    return value


def _structure_bool(value: object, _: object) -> bool:
    if type(value) is not bool:
        _mismatch("a boolean (true or false)", value)
    return value


def _structure_int(value: object, _: object) -> int:
    if type(value) is not int:
        _mismatch("an integer", value)
    return value


def _structure_float(value: object, _: object) -> float:
    if type(value) is float:
        # TOML has nan and inf literals; no setting (a duration, a limit, a size) means
        # either, and nan compares false with everything, so a check written later
        # (``value > 0``) would quietly let it through.
        if not math.isfinite(value):
            _mismatch("a finite number (TOML's nan and inf are not)", value)
        return value
    if type(value) is int:
        try:
            return float(value)
        except OverflowError:
            raise _Mismatch(f"the integer {value} is too large for a float") from None
    _mismatch("a number", value)


def _structure_none(value: object, _: object) -> None:
    if value is not None:
        _mismatch("nothing (None)", value)


def _passthrough(value: object, _: object) -> object:
    return value


# -- strict hook factories ------------------------------------------------------------


def _is_literal(annotation: Any) -> bool:
    return get_origin(annotation) is Literal


def _literal_hook(annotation: Any) -> Callable[[object, object], object]:
    members = get_args(annotation)
    if all(type(member) is str for member in members):
        expected = "one of " + "/".join(members)
    else:
        expected = "one of " + "/".join(_show(member) for member in members)

    def structure_literal(value: object, _: object) -> object:
        for member in members:
            # Type-strict: true is not 1, 1 is not "1".
            if type(member) is type(value) and member == value:
                return member
        _mismatch(expected, value)

    return structure_literal


def _is_union(annotation: Any) -> bool:
    return get_origin(annotation) in (typing.Union, types.UnionType)


def _describe_type(annotation: Any) -> str:
    names = {str: "a string", bool: "a boolean", int: "an integer", float: "a number", _NoneType: "nothing"}
    if annotation in names:
        return names[annotation]
    if attrs.has(annotation) or _is_table_type(annotation):
        return "a table"
    if _array_kind(annotation) is not None:
        return "an array"
    if _is_literal(annotation):
        return "one of " + "/".join(str(m) if type(m) is str else _show(m) for m in get_args(annotation))
    return str(annotation)


def _union_hook(annotation: Any, converter: cattrs.BaseConverter) -> Callable[[object, object], object]:
    members = get_args(annotation)
    optional = _NoneType in members
    others = [member for member in members if member is not _NoneType]
    if len(others) == 1:
        # ``X | None``: structure as X so nested problems keep their own paths.
        (only,) = others

        def structure_optional(value: object, _: object) -> object:
            if value is None and optional:
                return None
            return converter.structure(value, only)

        return structure_optional

    expected = " or ".join(_describe_type(member) for member in members)

    def structure_union(value: object, _: object) -> object:
        if value is None and optional:
            return None
        # First member that structures strictly wins, in declaration order.
        for member in others:
            try:
                return converter.structure(value, member)
            except Exception:
                continue
        _mismatch(expected, value)

    return structure_union


def _checked(
    accepted: tuple[type, ...], expected: str, factory: Callable[[Any, Any], Any]
) -> Callable[[Any, cattrs.BaseConverter], Callable[[object, object], object]]:
    """Wrap a cattrs container factory so it refuses values of the wrong shape.

    cattrs iterates any iterable (a string would become a list of characters)
    and would try to read any object's ``keys()``.
    """

    def make(annotation: Any, converter: cattrs.BaseConverter) -> Callable[[object, object], object]:
        inner = factory(annotation, converter)

        def structure_checked(value: object, _: object) -> object:
            if not isinstance(value, accepted):
                _mismatch(expected, value)
            return inner(value, annotation)

        return structure_checked

    return make


def _is_table_type(annotation: Any) -> bool:
    """``dict``/``Mapping``, bare or parametrised."""
    return (get_origin(annotation) or annotation) in (dict, collections.abc.Mapping)


# What a TOML array structures into, by the annotation (or its origin): bare or
# parametrised, ``typing`` or ``collections.abc`` spelling.
_ARRAY_KINDS: Final[tuple[tuple[type, tuple[Any, ...]], ...]] = (
    (list, (list, collections.abc.MutableSequence)),
    (tuple, (tuple, collections.abc.Sequence)),
    (set, (set, collections.abc.MutableSet)),
    (frozenset, (frozenset, collections.abc.Set)),
)


def _array_kind(annotation: Any) -> type | None:
    """The container an array field structures into (``list``, ``tuple``, ``set``, ``frozenset``), or ``None``."""
    origin = get_origin(annotation) or annotation
    for kind, origins in _ARRAY_KINDS:
        if origin in origins:
            return kind
    return None


def _array_factory(annotation: Any, converter: cattrs.BaseConverter) -> Callable[[object, object], object]:
    """Structure an array (already known to be a list or tuple) item by item, into the field's container.

    Every array type comes here, so none falls back to cattrs' own hooks, which
    iterate whatever they get: a string's characters, a table's keys.
    """
    kind = _array_kind(annotation)
    members = get_args(annotation)
    if kind is tuple and members and members[-1] is not Ellipsis:
        fixed = cattrs.gen.make_hetero_tuple_structure_fn(annotation, converter)

        def structure_fixed(value: Any, _: object) -> object:
            if len(value) != len(members):
                raise _Mismatch(f"expected {len(members)} items, got {len(value)}")
            return fixed(value, annotation)

        return structure_fixed
    items = list[members[0]] if members else list[Any]  # type: ignore[valid-type]
    structure_items = cattrs.cols.list_structure_factory(items, converter)

    def structure_array(value: object, _: object) -> object:
        structured = structure_items(value, items)
        if kind is list:
            return structured
        if kind is tuple:
            return tuple(structured)
        for item in structured:
            if not isinstance(item, collections.abc.Hashable):
                raise _Mismatch(
                    "expected an array of strings, numbers, booleans or dates (a set holds no arrays or tables),"
                    f" got {_show(item)} in it"
                )
        return (set if kind is set else frozenset)(structured)

    return structure_array


def _attrs_factory(cls: Any, converter: cattrs.BaseConverter) -> Any:
    """Structure an attrs class from a table whose keys are its attributes' aliases.

    The alias is what the class's ``__init__`` takes (``_token`` is ``token``) and
    what the unknown-key message lists, so it is also the key a user writes and
    the name a problem's path shows.
    """
    structure = cattrs.gen.make_dict_structure_fn(cls, converter, _cattrs_use_alias=True)
    aliases = {a.name: a.alias for a in attrs.fields(get_origin(cls) or cls) if a.alias != a.name}
    if not aliases:
        return structure

    def structure_by_alias(value: Mapping[str, Any], annotation: object) -> object:
        try:
            return structure(value, annotation)
        except ClassValidationError as exc:
            # cattrs notes each failed attribute by its name; the path should show the key.
            for problem in exc.exceptions:
                problem.__notes__ = [_by_alias(note, aliases) for note in getattr(problem, "__notes__", [])]
            raise

    return structure_by_alias


def _by_alias(note: str, aliases: Mapping[str, str]) -> str:
    if type(note) is AttributeValidationNote and note.name in aliases:
        return AttributeValidationNote(str(note), aliases[note.name], note.type)
    return note


@attrs.frozen
class _Check:
    """``Annotated[X, _Check(problem)]``: a value of type X that ``problem`` must also accept.

    ``problem(value)`` returns what is wrong (``"expected ..., got ..."``) or
    ``None``. Checked while the table is structured, so a bad value is reported
    together with every other problem, each with its path (an attrs validator
    runs only once every field has structured, and stops at the first).
    """

    problem: Callable[[Any], str | None]


def _ask(problem: Callable[[Any], str | None], value: object) -> str | None:
    """What ``problem`` says of ``value``, its own failure included.

    Raised inside structuring, a check's exception (an ``int()`` or
    ``re.compile`` it calls) or a wrong return type would come out as cattrs'
    "invalid value for type", naming neither: both become the problem's text.
    """
    name = getattr(problem, "__qualname__", None) or repr(problem)
    try:
        found = problem(value)
    except (_Mismatch, ClassValidationError):
        raise  # a keyed check's own report
    except Exception as exc:
        return f"the check {name} failed on this value: {type(exc).__name__}: {elide_middle(str(exc), 500)}"
    if found is not None and not isinstance(found, str):
        return f"the check {name} returned {safe_repr(found)}; a check returns the problem as a str, or None"
    return found


def _is_checked(annotation: Any) -> bool:
    return get_origin(annotation) is Annotated and any(isinstance(m, _Check) for m in annotation.__metadata__)


def _checked_hook(annotation: Any, converter: cattrs.BaseConverter) -> Callable[[object, object], object]:
    base = get_args(annotation)[0]
    checks = [m for m in annotation.__metadata__ if isinstance(m, _Check)]

    def structure_checked_value(value: object, _: object) -> object:
        structured = converter.structure(value, base)
        for check in checks:
            problem = _ask(check.problem, structured)
            if problem is not None:
                raise _Mismatch(problem)
        return structured

    return structure_checked_value


def _make_converter() -> cattrs.Converter:
    converter = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
    converter.register_structure_hook(str, _structure_str)
    converter.register_structure_hook(bool, _structure_bool)
    converter.register_structure_hook(int, _structure_int)
    converter.register_structure_hook(float, _structure_float)
    converter.register_structure_hook(_NoneType, _structure_none)
    converter.register_structure_hook(Any, _passthrough)
    converter.register_structure_hook_factory(_is_literal, _literal_hook)
    converter.register_structure_hook_factory(_is_union, _union_hook)
    converter.register_structure_hook_factory(_is_checked, _checked_hook)
    converter.register_structure_hook_factory(
        lambda annotation: _array_kind(annotation) is not None,
        _checked((list, tuple), "an array", _array_factory),
    )
    converter.register_structure_hook_factory(
        _is_table_type, _checked((Mapping,), "a table", cattrs.cols.mapping_structure_factory)
    )
    converter.register_structure_hook_factory(attrs.has, _checked((Mapping,), "a table", _attrs_factory))
    return converter


_converter = _make_converter()


def _format(exc: BaseException, annotation: Any) -> str:
    if isinstance(exc, _Mismatch):
        message = str(exc)
    elif isinstance(exc, ForbiddenExtraKeysError):
        # Bounded: a table of hundreds of stray keys, or of huge ones, must not make a huge message.
        quoted = [elide_middle(json.dumps(key, ensure_ascii=False), QUOTED_CHARS) for key in sorted(exc.extra_fields)]
        keys = bounded_listing(quoted, separator=", ")
        # Only the keys a table may hold: a derived field (init=False) is no key.
        allowed = ", ".join(a.alias for a in attrs.fields(exc.cl) if a.init) if attrs.has(exc.cl) else ""
        message = f"unknown key{'s' if len(exc.extra_fields) > 1 else ''} {keys}"
        message += f" (allowed: {allowed})" if allowed else " (no keys allowed)"
    elif isinstance(exc, KeyError):
        message = "missing required key"
    elif isinstance(exc, ValueError | TypeError) and annotation is None and str(exc):
        # Raised by the class itself (an attrs validator): its own words say most.
        message = f"invalid value ({exc})"
    else:
        message = cattrs.v.format_exception(exc, annotation)
    return message + _END


def structure_table(cls: type[T], data: object, where: str) -> T:
    """Structure the plain table ``data`` into the attrs class ``cls``, strictly.

    ``where`` names the table in messages (``"[plugins.permissions]"``); paths
    below it follow (``[plugins.permissions].rules[2].action``). Nothing is
    coerced: ``"1"`` is not an integer, ``1`` is not a boolean, an integer is
    accepted for a ``float`` field, ``nan`` and ``inf`` are not. Unknown keys are refused. Supported field
    types: ``str``, ``int``, ``float``, ``bool``, ``Any``, ``Literal[...]``,
    ``X | None`` (and other unions, first matching member wins), arrays as
    ``list``, ``tuple`` (``tuple[X, ...]`` or fixed ``tuple[X, Y]``),
    ``Sequence``, ``set`` and ``frozenset`` (bare or of ``X``; only an array
    is accepted, never a string or table), ``dict``/``Mapping`` with ``str``
    keys and nested attrs classes. An attrs validator that raises is reported
    as an invalid value.

    Raises:
        ConfigError: ``violations`` lists *every* problem, each as
            ``<path>: <message>``, e.g.
            ``[plugins.permissions].rules[2].action: expected one of allow/deny/ask, got "maybe"``.
    """
    try:
        return _converter.structure(data, cls)
    except Exception as exc:
        lines = cattrs.transform_error(exc, path=where, format_exception=_format)
        raise ConfigError([_reorder(line, where) for line in lines]) from exc


def _reorder(line: str, where: str) -> str:
    """``"<message>␀ @ <path>"`` → ``"<path>: <message>"``."""
    message, marker, path = line.partition(_END + " @ ")
    if not marker:  # Not formatted by ``_format`` (defensive): keep cattrs' words.
        return line
    if not where:
        path = path.removeprefix(".")
    return f"{path}: {message}" if path else message


# -- the host configuration -------------------------------------------------------------


_MODES = ("native", "code", "both")


def _plugin_names(value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise TypeError(f"DshConfig.disabled_plugins must be a list of plugin names, got {type(value).__name__}")
    for name in value:
        if type(name) is not str or not name:
            raise TypeError(f"DshConfig.disabled_plugins lists plugin names (non-empty str), got {safe_repr(name)}")
    return tuple(value)


# fullmatch: "$" also matches before a final newline, and "ab\n" was taken.
_PREFIX = re.compile(r"[A-Za-z0-9_-]{1,32}")


def _tool_prefixes(value: object) -> Mapping[str, str]:
    if not isinstance(value, Mapping):
        raise TypeError(f"DshConfig.tool_prefixes must map plugin names to prefixes, got {type(value).__name__}")
    for plugin, prefix in value.items():
        if type(plugin) is not str or not plugin:
            raise TypeError(f"DshConfig.tool_prefixes: a plugin name must be a non-empty str, got {safe_repr(plugin)}")
        if type(prefix) is not str or not _PREFIX.fullmatch(prefix):
            raise ValueError(
                f"tool_prefixes.{plugin}: a prefix is 1-32 letters, digits, '_' or '-', got {safe_repr(prefix)}"
            )
    return types.MappingProxyType(dict(value))


def _plain_tables(value: object) -> Mapping[str, Mapping[str, Any]]:
    if not isinstance(value, Mapping):
        raise TypeError(f"DshConfig.plugins must map plugin names to tables, got {type(value).__name__}")
    for name, table in value.items():
        if type(name) is not str or not name:
            raise TypeError(f"DshConfig.plugins: a plugin name must be a non-empty str, got {safe_repr(name)}")
        if not isinstance(table, Mapping):
            raise TypeError(f"DshConfig.plugins.{name} must be a table (a mapping), got {type(table).__name__}")
        for key in table:
            # A plugin's structure_table and its messages take keys as TOML gives them: str.
            if type(key) is not str:
                raise TypeError(f"DshConfig.plugins.{name}: a key must be a str, got {safe_repr(key)}")
    return types.MappingProxyType({name: types.MappingProxyType(dict(table)) for name, table in value.items()})


# -- checks a value must pass besides its type (the file's and a host's own settings) --------


def _plugin_name_problem(value: str) -> str | None:
    return None if value else "expected a plugin name, got an empty string"


def _path_problem(value: str) -> str | None:
    return None if usable_path(value) else f"expected a non-empty path without NUL characters, got {_show(value)}"


def _prefix_problem(value: str) -> str | None:
    return None if _PREFIX.fullmatch(value) else f"a prefix is 1-32 letters, digits, '_' or '-', got {_show(value)}"


def _seconds_problem(value: float) -> str | None:
    if positive_finite(value):
        return None
    # A float field gets the table's -1 as -1.0: an integral value is shown as the integer it was.
    shown = str(int(value)) if type(value) is float and value.is_integer() else _show(value)
    return f"expected a positive number of seconds, got {shown}"


def _limit_problem(value: int) -> str | None:
    if value < 1:
        return f"expected a positive integer, got {_show(value)}"
    return resource_limit_problem(value)


def _count_problem(value: int) -> str | None:
    return None if type(value) is int and value >= 1 else f"expected a positive integer, got {_show(value)}"


def _output_problem(value: int) -> str | None:
    # The runtime's own floor: room for the smallest value and a log line's newline.
    return None if value >= 4 else f"expected at least 4 (bytes), got {_show(value)}"


_memory_problem: Final = memory_limit_problem


def _validated(
    problem: Callable[[Any], str | None], kind: type | tuple[type, ...] = int
) -> Callable[[Any, attrs.Attribute[Any], Any], None]:
    """The same check as an attrs validator, for settings a host builds itself (``None`` passes).

    The type first, as the file's structuring checks it: ``True`` is no count
    (bool is an int to Python), and ``"5"`` failed with a bare ``TypeError``.
    """

    def validate(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value is None:
            return
        if type(value) is bool or not isinstance(value, kind):
            expected = "an integer" if kind is int else "a string" if kind is str else "a number"
            raise ValueError(f"{type(instance).__name__}.{attribute.name}: expected {expected}, got {value!r}")
        message = problem(value)
        if message is not None:
            raise ValueError(f"{type(instance).__name__}.{attribute.name}: {message}")

    return validate


def _optional_bool(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and type(value) is not bool:
        raise ValueError(f"{type(instance).__name__}.{attribute.name}: expected true or false, got {value!r}")


_PluginName = Annotated[str, _Check(_plugin_name_problem)]
_Prefix = Annotated[str, _Check(_prefix_problem)]
_KeptPath = Annotated[str, _Check(_path_problem)]


@attrs.frozen(kw_only=True)
class CodeRuntimeSettings:
    """The ``[code_runtime]`` table: options of the Code Mode subprocess runtime (unset: its defaults).

    The keys are :class:`~dsh_core.code_mode.SubprocessPythonRuntime`'s:
    ``wall_budget_s``, ``max_output_bytes``, ``max_memory_bytes``,
    ``max_cpu_s``, ``max_file_bytes``, ``allow_subprocesses``, ``allow_network``,
    ``allow_file_writes``, ``max_json_values``. Their values are checked here, whatever the mode, so
    a file's mistakes show before Code Mode is ever turned on:
    ``wall_budget_s`` is a positive number, the byte and second counts are
    positive integers, ``max_output_bytes`` is at least 4,
    ``max_memory_bytes`` at least 16 MiB (less cannot run the interpreter) and
    no resource limit (memory, CPU, file size) above ``2**63 - 2``, the
    largest the system takes.
    """

    wall_budget_s: Annotated[float, _Check(_seconds_problem)] | None = attrs.field(
        default=None, validator=_validated(_seconds_problem, (int, float))
    )
    max_output_bytes: Annotated[int, _Check(_output_problem)] | None = attrs.field(
        default=None, validator=_validated(_output_problem)
    )
    max_memory_bytes: Annotated[int, _Check(_memory_problem)] | None = attrs.field(
        default=None, validator=_validated(_memory_problem)
    )
    max_cpu_s: Annotated[int, _Check(_limit_problem)] | None = attrs.field(
        default=None, validator=_validated(_limit_problem)
    )
    max_file_bytes: Annotated[int, _Check(_limit_problem)] | None = attrs.field(
        default=None, validator=_validated(_limit_problem)
    )
    allow_subprocesses: bool | None = attrs.field(default=None, validator=_optional_bool)
    allow_network: bool | None = attrs.field(default=None, validator=_optional_bool)
    allow_file_writes: bool | None = attrs.field(default=None, validator=_optional_bool)
    max_json_values: Annotated[int, _Check(_count_problem)] | None = attrs.field(
        default=None, validator=_validated(_count_problem)
    )

    def options(self) -> dict[str, Any]:
        """The settings given, as keyword arguments for ``SubprocessPythonRuntime``."""
        return {
            field.name: value for field in attrs.fields(type(self)) if (value := getattr(self, field.name)) is not None
        }


@attrs.frozen(kw_only=True)
class DshConfig:
    """The host's settings (``dsh.toml`` or ``[tool.dsh]``); every field has a default.

    ``plugins`` maps an entry-point name to that plugin's raw table: the loader
    hands a plain ``dict`` copy of it to the plugin's ``dsh_setup`` as ``config``
    (``{}`` when the file has no table for it), and the plugin structures it
    (:func:`structure_table`). The mapping itself is read-only.

    ``tool_prefixes`` maps an entry-point name to a prefix: every tool that
    plugin registers in its ``dsh_setup`` is registered as ``<prefix>__<name>``
    (the way MCP servers' tools are), so two plugins offering a tool of the same
    name can both load. (The MCP client also registers tools later, when a
    server's list changes: give its servers their own ``prefix`` instead.)

    ``source`` is the file :func:`load_config` read (absolute; ``None`` for
    defaults); ``preferred_paths`` the files its lookup would have read instead,
    had they existed (absolute; for ``pyproject.toml`` found by the lookup, the
    ``dsh.toml`` next to it). Neither is compared.
    """

    mode: Literal["native", "code", "both"] = attrs.field(default="native", validator=one_of(_MODES))
    disabled_plugins: tuple[str, ...] = attrs.field(default=(), converter=_plugin_names)
    strict_capabilities: bool = attrs.field(default=False, validator=instance_of(bool))
    plugins: Mapping[str, Mapping[str, Any]] = attrs.field(factory=dict, converter=_plain_tables, hash=False)
    session_log: str | None = attrs.field(
        default=None, validator=[instance_of(str, optional=True), _validated(_path_problem, str)]
    )
    code_runtime: CodeRuntimeSettings = attrs.field(
        factory=CodeRuntimeSettings, validator=instance_of(CodeRuntimeSettings)
    )
    tool_prefixes: Mapping[str, str] = attrs.field(factory=dict, converter=_tool_prefixes, hash=False)
    # Not a setting: where load_config read them, so a host can keep the model's file tools off it.
    source: str | None = attrs.field(default=None, eq=False, validator=instance_of(str, optional=True))
    # Creating one of them would replace the settings wholesale: a host keeps them too.
    preferred_paths: tuple[str, ...] = attrs.field(
        default=(),
        eq=False,
        validator=attrs.validators.deep_iterable(attrs.validators.instance_of(str), attrs.validators.instance_of(tuple)),
    )

    def plugin_table(self, name: str) -> str:
        """How the file spells ``[plugins.<name>]``: ``[tool.dsh.plugins.<name>]`` in a ``pyproject.toml``."""
        within = "tool.dsh." if self.source is not None and Path(self.source).name == "pyproject.toml" else ""
        return f"[{within}plugins.{name}]"

    def plugin_config(self, name: str) -> dict[str, Any]:
        """A fresh, deep plain-``dict`` copy of ``[plugins.<name>]`` (``{}`` when absent)."""
        table: dict[str, Any] = _deep_copy(self.plugins.get(name, {}))
        return table


def _deep_copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _deep_copy(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_deep_copy(item) for item in value]
    return value


@attrs.frozen(kw_only=True)
class _ConfigFile:
    """The file layout; ``plugins`` tables stay raw (each plugin checks its own)."""

    mode: Literal["native", "code", "both"] = "native"
    disabled_plugins: tuple[_PluginName, ...] = ()
    strict_capabilities: bool = False
    plugins: dict[_PluginName, dict[str, Any]] = attrs.field(factory=dict)
    session_log: _KeptPath | None = None
    code_runtime: CodeRuntimeSettings = attrs.field(factory=CodeRuntimeSettings)
    tool_prefixes: dict[_PluginName, _Prefix] = attrs.field(factory=dict)


# Files first-party plugins keep, as (entry-point name, key). Like ``session_log``, a
# relative path there means the configuration file's directory: the same file must
# find the same logs whichever directory the host starts in. (Workspace roots and MCP
# command lines are where the work happens: they stay relative to the working directory.)
_FILE_SETTINGS: Final = (("audit", "path"), ("ledger", "path"), ("spill", "directory"))


def load_config(path: str | os.PathLike[str] | None = None, *, cwd: str | os.PathLike[str] | None = None) -> DshConfig:
    """Read the host configuration.

    Lookup: the explicit ``path`` (a missing file is an error; a file named
    ``pyproject.toml`` is read as below: its ``[tool.dsh]`` table, which must
    be there); else ``dsh.toml`` in ``cwd`` (default: the current directory);
    else the ``[tool.dsh]`` table of ``pyproject.toml`` there; else all
    defaults. Only the first file found is read: settings are not merged across
    files.

    Relative paths of files the host keeps resolve against the directory of the
    configuration file, not the working directory: ``session_log``,
    ``[plugins.audit] path``, ``[plugins.ledger] path`` and
    ``[plugins.spill] directory``.

    Raises:
        ConfigError: the file is missing (explicit ``path`` only), not a regular
            file (a ``dsh.toml`` or ``pyproject.toml`` the lookup finds that is a
            dangling symbolic link or a directory is not skipped), unreadable, not
            valid TOML (the message names the file, line and column) or has
            invalid settings (every problem listed, each with its key path).
    """
    if cwd is not None:
        base = Path(os.fspath(cwd))
    elif path is not None and os.path.isabs(os.fspath(path)):
        base = Path(os.fspath(path)).parent  # no working directory needed (it may have been removed)
    else:
        try:
            base = Path.cwd()
        except OSError as exc:
            raise ConfigError(
                [f"the current directory cannot be read ({exc.strerror or exc}): it may have been removed; "
                 "change to an existing directory, or name the configuration file by an absolute path"]
            ) from None
    if path is not None:
        file = base / os.fspath(path)
        if not file.is_file():
            raise ConfigError([_not_a_file(file) if os.path.lexists(file) else f"{file}: configuration file not found"])
        if file.name == "pyproject.toml":
            table = _tool_dsh(_read_toml(file))
            if table is None:
                raise ConfigError([f"{file}: no [tool.dsh] table (a pyproject.toml holds the configuration there)"])
            return _parse(file, table, where="[tool.dsh]")
        return _parse(file, _read_toml(file), where="")
    candidate = base / "dsh.toml"
    pyproject = base / "pyproject.toml"
    for found in (candidate, pyproject):
        # Skipped, it would leave the host on another file's settings or none (a policy on an unmounted share).
        if os.path.lexists(found) and not found.is_file():
            raise ConfigError([_not_a_file(found)])
    if candidate.is_file():
        return _parse(candidate, _read_toml(candidate), where="")
    if pyproject.is_file():
        table = _tool_dsh(_read_toml(pyproject))
        if table is not None:
            config = _parse(pyproject, table, where="[tool.dsh]")
            return attrs.evolve(config, preferred_paths=(str(candidate.absolute()),))
    return DshConfig()


def _not_a_file(file: Path) -> str:
    """Why ``file``, which exists as a name, cannot be read as a configuration file."""
    if file.is_symlink() and not file.exists():
        return f"{file}: is a symbolic link to {os.readlink(file)}, which does not exist"
    if file.is_dir():
        return f"{file}: is a directory, not a configuration file"
    return f"{file}: is not a regular file, so it cannot be read as a configuration file"


def _tool_dsh(document: dict[str, Any]) -> object:
    """The ``[tool.dsh]`` table of a ``pyproject.toml`` (``None`` when it has none)."""
    tool = document.get("tool", {})
    return tool.get("dsh") if isinstance(tool, Mapping) else None


def _read_toml(file: Path) -> dict[str, Any]:
    try:
        raw = file.read_bytes()
        if raw.startswith(codecs.BOM_UTF8):
            # TOML forbids it, and tomllib's "Invalid statement (at line 1, column 1)" hides why.
            raise ConfigError(
                [f"{file}: starts with a UTF-8 byte-order mark, which TOML does not allow: save it as UTF-8 without a BOM"]
            )
        data: dict[str, Any] = tomllib.loads(raw.decode("utf-8"))
        return data
    except tomllib.TOMLDecodeError as exc:
        # tomllib's message already ends with "(at line L, column C)".
        raise ConfigError([f"{file}: invalid TOML: {exc}"]) from exc
    except RecursionError:
        # tomllib parses nested arrays and inline tables recursively.
        raise ConfigError([f"{file}: invalid TOML: arrays or tables nested too deeply"]) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f"{file}: cannot read: {exc}"]) from exc


def _parse(file: Path, table: object, *, where: str) -> DshConfig:
    try:
        raw = structure_table(_ConfigFile, table, where)
    except ConfigError as exc:
        raise ConfigError([f"{file}: {violation}" for violation in exc.violations]) from exc
    session_log = raw.session_log
    if session_log is not None:
        session_log = str(file.parent / session_log)
    plugins = dict(raw.plugins)
    for plugin, key in _FILE_SETTINGS:
        value = plugins.get(plugin, {}).get(key)
        # Only a usable relative path: anything else is left for the plugin to report.
        if isinstance(value, str) and usable_path(value) and not os.path.isabs(value):
            plugins[plugin] = {**plugins[plugin], key: str(file.parent / value)}
    try:
        return DshConfig(
            mode=raw.mode,
            disabled_plugins=raw.disabled_plugins,
            strict_capabilities=raw.strict_capabilities,
            plugins=plugins,
            session_log=session_log,
            code_runtime=raw.code_runtime,
            tool_prefixes=raw.tool_prefixes,
            source=str(file.absolute()),
        )
    except (TypeError, ValueError) as exc:  # what the file's types allow but the settings do not
        raise ConfigError([f"{file}: {exc}"]) from exc
