"""``@tool``: a tool from a typed Python function (its signature, return annotation and docstring).

::

    @tool(effects=ToolEffects(read_only=True))
    async def weather(city: str, days: int = 1) -> list[Forecast]:
        '''The forecast for a city.

        Args:
            city: the city's name, in English.
            days: how many days ahead (1 to 7).
        '''

The parameters become an attrs class (so everything
:func:`~dsh_core._schema._attrs_params.schema_from_attrs_class` supports works
here, strict structuring included), the return annotation becomes the
mandatory output schema, and the docstring's text before its first section
becomes the description; an ``Args:`` section (Google style; ``Keyword Args:``
too) or an ``Annotated[X, "text"]`` annotation describes a parameter. A
parameter annotated ``ToolRunContext`` receives the run context instead of a
model argument. Everything else is :func:`~dsh_core.define_tool`'s.

The return annotation is enforced, not only shown: where the output schema
cannot say all of it (a ``dict[str, int]``'s value type, an attrs class's
validators), the returned value is also structured as the annotation, strictly
as arguments are, and a value that does not fit fails the call
``INVALID_TOOL_OUTPUT``. A default must be a value of its parameter's
annotation (``int | None = None``, not ``int = None``), and each call gets its
own copy of a mutable one. Generator functions, and parameter names the
arguments class cannot hold (``self``, names starting with ``__``), are
refused when decorating.
"""

from __future__ import annotations

import copy
import inspect
import re
import typing
from collections.abc import Callable
from typing import Any, Final, overload

import attrs

from ._definition import ToolDefinition, ToolOutput, default_render, define_tool
from ._errors import SchemaSpecError, ToolOutputError
from ._execution import ToolRunContext
from ._plain import unstructure
from ._schema._attrs_params import _first_text, value_type
from ._schema._raw import RawSchema

__all__ = ["tool"]

# Google-style section headers (Napoleon's list): a header ends the section before it.
_SECTIONS: Final = frozenset(
    {
        "args", "arguments", "attention", "attributes", "caution", "danger", "error", "example", "examples",
        "hint", "important", "keyword args", "keyword arguments", "methods", "note", "notes", "other parameters",
        "parameters", "receive", "receives", "references", "return", "returns", "raise", "raises", "see also",
        "tip", "todo", "warning", "warnings", "warn", "warns", "yield", "yields",
    }
)  # fmt: skip
# The sections whose entries describe parameters.
_PARAMETER_SECTIONS: Final = frozenset(
    {"args", "arguments", "parameters", "keyword args", "keyword arguments", "other parameters"}
)
_HEADER: Final = re.compile(r"^([A-Z][A-Za-z ]*):$")
_ENTRY_NAME: Final = re.compile(r"^\*{0,2}([A-Za-z_][A-Za-z0-9_]*)\s*")
# Names the class built for the arguments cannot have as fields: its generated __init__ uses
# them itself, and Python mangles names starting with "__" in a class (or they are special).
_TAKEN_NAMES: Final = frozenset({"self", "_setattr", "_cached_setattr_get"})
# Defaults of these types cannot be changed by the body: no fresh copy per call needed.
_IMMUTABLE: Final = (str, int, float, bool, type(None))


def _section(line: str) -> str | None:
    """The section ``line`` opens (lower case), if it is a Google-style header."""
    header = _HEADER.match(line.strip())
    if header is None or header.group(1).lower() not in _SECTIONS:
        return None
    return header.group(1).lower()


def _entry(text: str) -> tuple[str, str] | None:
    """``name (type): description`` split into the name and the description, if ``text`` is an entry."""
    name = _ENTRY_NAME.match(text)
    if name is None:
        return None
    rest = text[name.end() :]
    if rest.startswith("("):
        # The type may hold parentheses of its own: dict(str, int).
        depth = 0
        for index, char in enumerate(rest):
            depth += (char == "(") - (char == ")")
            if depth == 0:
                rest = rest[index + 1 :].lstrip()
                break
        else:
            return None
    if not rest.startswith(":"):
        return None
    return name.group(1), rest[1:].strip()


def _docstring(fn: Callable[..., Any]) -> tuple[str, dict[str, str]]:
    """The description (text before the first section) and the parameter descriptions of ``fn``.

    Google style: the entries of ``Args:`` (also ``Arguments:``, ``Parameters:``,
    ``Keyword Args:``...) are the lines indented under the header; any other
    section, or a line back at the header's indentation, ends them.
    """
    lines = (inspect.getdoc(fn) or "").splitlines()
    description: list[str] = []
    arguments: dict[str, str] = {}
    index = 0
    while index < len(lines) and _section(lines[index]) is None:
        description.append(lines[index])
        index += 1
    header_indent: int | None = None  # of the current parameter section's header; None outside one
    entry_indent = 0
    current: str | None = None
    for number, line in enumerate(lines[index:], start=index):
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        section = _section(line)
        if section is not None:
            # A header on the docstring's first line lost its indentation (the quotes preceded
            # it, the lines after it were dedented on their own): its entries may be at 0.
            header_indent = (-1 if number == 0 else indent) if section in _PARAMETER_SECTIONS else None
            current = None
            continue
        if header_indent is None:
            continue
        if indent <= header_indent:
            # Text back at the header's level is no longer part of the section.
            header_indent = current = None
            continue
        entry = _entry(line.strip())
        if entry is not None and (current is None or indent <= entry_indent):
            current, arguments[entry[0]] = entry
            entry_indent = indent
        elif current is not None:
            arguments[current] = (arguments[current] + " " + line.strip()).strip()
    return "\n".join(description).strip(), arguments


def _build(
    fn: Callable[..., Any], name: str | None, description: str | None, options: dict[str, Any]
) -> ToolDefinition:
    tool_name = name or getattr(fn, "__name__", None)
    if not isinstance(tool_name, str) or not callable(fn):
        raise TypeError(f"@tool decorates a function, got {fn!r}")
    where = f'@tool "{tool_name}"'
    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        # Its calls would return a generator, never a value the output schema could accept.
        raise TypeError(f"{where}: a generator function cannot be a tool; return the whole value (a list, say)")
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception as exc:
        raise SchemaSpecError([f"{where}: cannot evaluate its annotations ({type(exc).__name__}: {exc})"]) from None
    summary, documented = _docstring(fn)
    description = description if description is not None else summary
    if not description:
        raise TypeError(f"{where}: give the model a description: a docstring, or description=...")
    if "return" not in hints:
        raise TypeError(f"{where}: annotate what it returns; the return annotation is the tool's output schema")

    fields: dict[str, Any] = {}
    fresh_defaults: dict[str, Any] = {}
    run_parameter: str | None = None
    problems: list[str] = []
    for parameter in inspect.signature(fn).parameters.values():
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD, parameter.POSITIONAL_ONLY):
            problems.append(f"{where}: parameter {parameter.name!r} must be passable by name (no *args, **kwargs or /)")
            continue
        annotation = hints.get(parameter.name)
        if annotation is None:
            problems.append(f"{where}: parameter {parameter.name!r} has no type annotation")
            continue
        if annotation is ToolRunContext:
            if run_parameter is not None:
                # Only one parameter can receive the run context; another would be left without a value.
                problems.append(
                    f"{where}: parameters {run_parameter!r} and {parameter.name!r} both ask for the "
                    "ToolRunContext; declare it once"
                )
                continue
            run_parameter = parameter.name
            continue
        if parameter.name in _TAKEN_NAMES or parameter.name.startswith("__"):
            problems.append(
                f"{where}: parameter {parameter.name!r} needs another name: "
                "'self', '_setattr', '_cached_setattr_get' and names starting with '__' cannot be argument names"
            )
            continue
        try:
            allowed = value_type(annotation, fn, f"{tool_name}.{parameter.name}")
        except SchemaSpecError as exc:
            problems.extend(exc.violations)
            continue
        default = attrs.NOTHING if parameter.default is parameter.empty else parameter.default
        if default is not attrs.NOTHING:
            # The schema advertises the default and the body gets it: it must be a value of the type.
            wrong = allowed.violations(unstructure(default), root="default")
            if wrong:
                shown = repr(default)
                problems.append(
                    f"{where}: the default of parameter {parameter.name!r}, "
                    f"{shown if len(shown) <= 60 else shown[:59] + '…'}, "
                    f"is not a value of its annotation ({'; '.join(wrong)})"
                )
                continue
            if type(default) not in _IMMUTABLE:
                fresh_defaults[parameter.name] = default
        text = documented.get(parameter.name) or _first_text(annotation)
        # alias: __init__ takes the parameter's own name (attrs would turn "_x" into "x").
        fields[parameter.name] = attrs.field(
            type=annotation, default=default, alias=parameter.name, metadata={"description": text} if text else {}
        )
    try:
        returns = value_type(hints["return"], fn, f"{tool_name} -> return")
    except SchemaSpecError as exc:
        problems.extend(exc.violations)
    if problems:
        raise SchemaSpecError(problems)
    # kw_only: the body is called by keyword, and any valid signature (a keyword-only
    # parameter without a default after one with a default) must make a class.
    arguments_class = attrs.make_class(f"{tool_name}_arguments", fields, frozen=True, slots=True, kw_only=True)
    arguments_class.__module__ = getattr(fn, "__module__", __name__)
    names = tuple(fields)

    def keywords(args: Any, run: ToolRunContext | None) -> dict[str, Any]:
        given = {field: getattr(args, field) for field in names}
        for field, default in fresh_defaults.items():
            if given[field] is default:
                # Python shares a mutable default between calls; each call gets its own copy.
                given[field] = copy.deepcopy(default)
        if run_parameter is not None:
            given[run_parameter] = run
        return given

    def plain_output(value: object) -> object:
        plain = unstructure(value)
        if not returns.complete:
            # The output schema cannot say all the annotation does (a dict's value type, a
            # validator): the value is structured as the annotation, as arguments are.
            wrong = returns.violations(plain, root="value")
            if wrong:
                raise ToolOutputError(tool_name, wrong)
        return plain

    execute: Callable[..., Any]
    if inspect.iscoroutinefunction(fn):

        async def execute(args: Any, run: ToolRunContext) -> object:
            return plain_output(await fn(**keywords(args, run)))

    else:

        def execute(args: Any, run: ToolRunContext) -> object:
            return plain_output(fn(**keywords(args, run)))

    execute.__name__ = getattr(fn, "__name__", "execute")
    execute.__qualname__ = getattr(fn, "__qualname__", "execute")
    output = options.pop("output", None)
    if output is not None:
        raise TypeError(f"{where}: the output schema comes from the return annotation; drop output=")
    return define_tool(
        name=tool_name,
        description=description,
        parameters=arguments_class,
        output=ToolOutput(
            schema=RawSchema(returns.schema),
            render=options.pop("render", None) or default_render,
            presentation_meta=options.pop("presentation_meta", None),
        ),
        execute=execute,
        **options,
    )


@overload
def tool(fn: Callable[..., Any], /) -> ToolDefinition: ...


@overload
def tool(
    *, name: str | None = None, description: str | None = None, **options: Any
) -> Callable[[Callable[..., Any]], ToolDefinition]: ...


def tool(
    fn: Callable[..., Any] | None = None, /, *, name: str | None = None, description: str | None = None, **options: Any
) -> ToolDefinition | Callable[[Callable[..., Any]], ToolDefinition]:
    """Make a :class:`ToolDefinition` from a typed function: ``@tool`` or ``@tool(name=..., **options)``.

    ``options`` are :func:`define_tool`'s (``effects``, ``retry``,
    ``timeout_ms``, ``in_thread``, ``is_concurrency_safe``, ``present_call``,
    ...), plus ``render`` and ``presentation_meta`` for the output. Callbacks
    that receive arguments get the structured arguments object (its fields are
    the function's parameters).

    Raises:
        TypeError: no description, no return annotation, ``output=``, a
            generator function, or not a function.
        SchemaSpecError: a parameter without an annotation, ``*args``/``**kwargs``,
            a name the arguments class cannot hold, a default that is not a value
            of its annotation, a second ``ToolRunContext`` parameter, or an
            annotation the schema cannot express (every problem listed).
    """
    if fn is not None:
        return _build(fn, name, description, dict(options))

    def decorate(function: Callable[..., Any]) -> ToolDefinition:
        return _build(function, name, description, dict(options))

    return decorate
