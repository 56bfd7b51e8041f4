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
becomes the description; an ``Args:`` section (Google style) or an
``Annotated[X, "text"]`` annotation describes a parameter. A parameter
annotated ``ToolRunContext`` receives the run context instead of a model
argument. Everything else is :func:`~dsh_core.define_tool`'s.
"""

from __future__ import annotations

import inspect
import re
import typing
from collections.abc import Callable
from typing import Any, overload

import attrs
import cattrs

from ._definition import ToolDefinition, ToolOutput, default_render, define_tool
from ._errors import SchemaSpecError
from ._execution import ToolRunContext
from ._schema._attrs_params import _first_text, value_schema_from_annotation
from ._schema._raw import RawSchema

__all__ = ["tool"]

_SECTION = re.compile(r"^(Args|Arguments|Parameters|Returns|Yields|Raises|Examples?|Notes?|See Also):\s*$")
_ARG_LINE = re.compile(r"^(\*{0,2}[A-Za-z_][A-Za-z0-9_]*)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_unstructure = cattrs.Converter().unstructure


def _docstring(fn: Callable[..., Any]) -> tuple[str, dict[str, str]]:
    """The description (text before the first section) and the ``Args:`` descriptions of ``fn``."""
    text = inspect.getdoc(fn) or ""
    lines = text.splitlines()
    description: list[str] = []
    arguments: dict[str, str] = {}
    index = 0
    while index < len(lines) and not _SECTION.match(lines[index]):
        description.append(lines[index])
        index += 1
    section = None
    current: str | None = None
    arguments_indent = 0
    for line in lines[index:]:
        header = _SECTION.match(line)
        if header:
            section, current = header.group(1), None
            continue
        if section not in ("Args", "Arguments", "Parameters") or not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        match = _ARG_LINE.match(line.strip())
        if match and (current is None or indent <= arguments_indent):
            current = match.group(1).lstrip("*")
            arguments_indent = indent
            arguments[current] = match.group(2).strip()
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
            run_parameter = parameter.name
            continue
        text = documented.get(parameter.name) or _first_text(annotation)
        default = attrs.NOTHING if parameter.default is parameter.empty else parameter.default
        fields[parameter.name] = attrs.field(
            type=annotation, default=default, metadata={"description": text} if text else {}
        )
    if problems:
        raise SchemaSpecError(problems)
    arguments_class = attrs.make_class(f"{tool_name}_arguments", fields, frozen=True, slots=True)
    arguments_class.__module__ = getattr(fn, "__module__", __name__)
    output_schema = RawSchema(value_schema_from_annotation(hints["return"], fn, f"{tool_name} -> return"))
    names = tuple(fields)

    def keywords(args: Any, run: ToolRunContext | None) -> dict[str, Any]:
        given = {field: getattr(args, field) for field in names}
        if run_parameter is not None:
            given[run_parameter] = run
        return given

    execute: Callable[..., Any]
    if inspect.iscoroutinefunction(fn):

        async def execute(args: Any, run: ToolRunContext) -> object:
            return _unstructure(await fn(**keywords(args, run)))

    else:

        def execute(args: Any, run: ToolRunContext) -> object:
            return _unstructure(fn(**keywords(args, run)))

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
            schema=output_schema,
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
        TypeError: no description, no return annotation, ``output=``, or not a function.
        SchemaSpecError: a parameter without an annotation, ``*args``/``**kwargs``,
            or an annotation the schema cannot express (every problem listed).
    """
    if fn is not None:
        return _build(fn, name, description, dict(options))

    def decorate(function: Callable[..., Any]) -> ToolDefinition:
        return _build(function, name, description, dict(options))

    return decorate
