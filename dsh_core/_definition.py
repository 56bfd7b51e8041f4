"""Tool definitions: what a host registers, and ``define_tool`` to build one from the DSL."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, TypeAlias

import attrs

from ._checks import callable_or_none, instance_of, positive_finite
from ._content import ContentBlock, TextBlock, text_block
from ._errors import JsonSchemaError, NonJsonValueError, SchemaSpecError, ToolArgsError, Violations
from ._json import FrozenDict, JsonValue, json_text, snapshot_json
from ._retry import RetryPolicy
from ._schema._attrs_params import schema_from_attrs_class, structure_args
from ._schema._dsl import parameter_schema_to_json_schema, value_schema_to_json_schema
from ._schema._raw import RawSchema
from ._schema._subset import TOOL_ARGUMENTS_ROOT, assert_object_json_schema
from ._schema._validate import CompiledValidator, compile_validator
from ._suspension import can_suspend

if TYPE_CHECKING:
    from ._execution import ToolExecution, ToolRunContext
    from ._results import ToolExecutionResult

__all__ = ["ToolContract", "ToolDefinition", "ToolOutput", "ToolSchema", "contract_of", "default_render", "define_tool"]

Render: TypeAlias = Callable[[Any, JsonValue], Sequence[ContentBlock]]
PresentationMeta: TypeAlias = Callable[[Any, JsonValue], JsonValue]
Execute: TypeAlias = Callable[[Any, "ToolRunContext"], Awaitable[object]]
FinalizeContent: TypeAlias = Callable[["ToolExecution", "ToolExecutionResult"], Sequence[ContentBlock] | None]


_SCALAR_TEXT = {True: "true", False: "false", None: "null"}

# How a define_tool body adapter says the pipeline may structure its arguments in advance
# (see ToolContract.structure_arguments). Kept on the adapter itself, not the definition:
# a copy of the definition (a plugin's prefixed one, attrs.evolve) keeps the same adapter.
_STRUCTURE_ARGUMENTS = "dsh_structure_arguments"


def default_render(args: object, value: JsonValue) -> list[ContentBlock]:
    """One text block: a string value as is, anything else as compact JSON."""
    return [default_block(value)]


def default_block(value: JsonValue) -> TextBlock:
    """The one block :func:`default_render` makes (the pipeline calls this directly)."""
    kind = type(value)
    if kind is str:
        text = value
    elif kind is int:
        text = str(value)  # the JSON text of an int, without building an encoder
    elif kind is bool or value is None:
        text = _SCALAR_TEXT[value]  # type: ignore[index]
    else:
        text = json_text(value)
    return text_block(text)  # type: ignore[arg-type]


def _callable(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not callable(value):
        raise TypeError(f"{type(instance).__name__}.{attribute.name} must be callable, got {type(value).__name__}")


def _async_body(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    # The pipeline awaits what the body returns: a plain def would fail every call TOOL_ERROR.
    _callable(instance, attribute, value)
    if not is_async_callable(value):  # type: ignore[arg-type]
        name = getattr(instance, "name", "?")
        raise TypeError(
            f'tool "{name}" execute must be an async callable taking (args, run), got {type(value).__name__} '
            "(define_tool adapts a plain def)"
        )


def _name(instance: object, attribute: attrs.Attribute[str], value: object) -> None:
    if type(value) is not str or not value:
        raise TypeError(f"{type(instance).__name__}.{attribute.name} must be a non-empty str, got {value!r}")


def _schema_mapping(value: object) -> FrozenDict:
    if not isinstance(value, Mapping):
        raise TypeError(f"a schema must be a mapping, got {type(value).__name__}")
    frozen = snapshot_json(dict(value) if not isinstance(value, dict) else value)
    assert isinstance(frozen, FrozenDict)
    return frozen


def _output_schema(value: object, output: Any) -> FrozenDict:
    if isinstance(value, RawSchema):
        object.__setattr__(output, "_schema_is_raw", True)
        return value.node
    return _schema_mapping(value)


def _tool_parameters(value: object, definition: Any) -> FrozenDict:
    # A host registering many raw definitions (from MCP, say) must learn which one is broken:
    # ``name`` is set before this runs (fields convert in order), so the error can say.
    if isinstance(value, RawSchema):
        return value.node
    try:
        return _schema_mapping(value)
    except NonJsonValueError as exc:
        raise NonJsonValueError(
            f'tool "{definition.name}" parameters must be lossless JSON: {exc}', path=exc.path
        ) from None
    except TypeError as exc:
        raise TypeError(f'tool "{definition.name}" parameters: {exc}') from None


@attrs.frozen(slots=True)
class ToolSchema:
    """The model-facing projection of a tool: all a model request ever carries.

    ``parameters`` is a frozen raw JSON Schema (a ``dict`` subclass, so it
    serialises directly); ``thaw()`` it for a mutable copy.
    """

    name: str = attrs.field(validator=_name)
    description: str = attrs.field(validator=instance_of(str, exact=True))
    parameters: FrozenDict = attrs.field(converter=_schema_mapping)

    def to_dict(self) -> dict[str, Any]:
        """``{"name", "description", "parameters"}`` as plain JSON-ready data."""
        from ._json import thaw

        return {"name": self.name, "description": self.description, "parameters": thaw(self.parameters)}


@attrs.frozen(slots=True)
class ToolOutput:
    """A tool's canonical output contract.

    ``schema`` is enforced on every successful value. ``render(args, value)`` is
    the pure projection to model-facing content (default: the value as text or
    compact JSON). ``presentation_meta(args, value)``, when given, computes
    replayable UI metadata for top-level calls only. For ``define_tool`` the
    schema is written in the value DSL, or given as a :class:`RawSchema`; a raw
    ``ToolDefinition`` takes raw JSON Schema (a ``RawSchema`` too).
    """

    # Set by the schema's converter when it was given as a RawSchema: define_tool then
    # takes it as it is instead of compiling it as the DSL. (Declared first: attrs
    # assigns defaults in declaration order, and the converter runs after this.)
    _schema_is_raw: bool = attrs.field(init=False, default=False, eq=False, repr=False)
    schema: FrozenDict = attrs.field(converter=attrs.Converter(_output_schema, takes_self=True))  # type: ignore[misc]
    render: Render = attrs.field(default=default_render, validator=_callable)
    presentation_meta: PresentationMeta | None = attrs.field(default=None, validator=callable_or_none)


def _compiled_output(
    schema: Mapping[str, Any], render: Render = default_render, presentation_meta: PresentationMeta | None = None
) -> ToolOutput:
    """A ``ToolOutput`` over an already compiled JSON Schema, marked so.

    A tool's output can then be handed to ``define_tool`` again (a proxy declaring
    ``output=inner.output``) and is taken as it is, not re-read as the DSL.
    """
    output = ToolOutput(schema=schema, render=render, presentation_meta=presentation_meta)
    object.__setattr__(output, "_schema_is_raw", True)
    return output


def _positive_timeout(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is None:
        return
    if not positive_finite(value):
        name = getattr(instance, "name", "?")
        raise TypeError(f'tool "{name}" timeout_ms must be a positive finite number, got {value!r}')


def _output(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, ToolOutput):
        name = getattr(instance, "name", "?")
        raise TypeError(
            f'tool "{name}" must declare output=ToolOutput(schema=..., render=..., presentation_meta=...), '
            f"got {type(value).__name__}"
        )


@attrs.frozen(kw_only=True, slots=True)
class ToolEffects:
    """What running a tool does to the world, as its author declares it (MCP's tool annotations).

    - ``read_only``: it changes nothing.
    - ``destructive``: it may delete or overwrite (never together with ``read_only``).
    - ``idempotent``: running it again with the same arguments has no further effect.
    - ``open_world``: it reaches beyond the host (the network, other systems).

    Declarations, not guarantees: policies use them to choose (the permissions
    plugin matches them, the effect ledger re-runs a read-only or idempotent
    call whose outcome is unknown, the approval card shows them), so a wrong one
    misleads every policy that trusts it. A tool without ``effects`` declares
    nothing and is treated as possibly anything.
    """

    read_only: bool = attrs.field(default=False, validator=instance_of(bool))
    destructive: bool = attrs.field(default=False, validator=instance_of(bool))
    idempotent: bool = attrs.field(default=False, validator=instance_of(bool))
    open_world: bool = attrs.field(default=False, validator=instance_of(bool))

    def __attrs_post_init__(self) -> None:
        if self.read_only and self.destructive:
            raise ValueError("a tool cannot be both read_only and destructive")

    @property
    def names(self) -> tuple[str, ...]:
        """The declared effects by name, in field order (``("read_only", "idempotent")``)."""
        return tuple(name for name in ("read_only", "destructive", "idempotent", "open_world") if getattr(self, name))

    @property
    def reruns_safely(self) -> bool:
        """Whether running a call again cannot repeat a side effect (read-only or idempotent)."""
        return self.read_only or self.idempotent


def _effects(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and not isinstance(value, ToolEffects):
        raise TypeError(f"ToolDefinition.effects must be ToolEffects or None, got {type(value).__name__}")


def _retry(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and not isinstance(value, RetryPolicy):
        raise TypeError(f"ToolDefinition.retry must be a RetryPolicy or None, got {type(value).__name__}")


@attrs.frozen(slots=True, eq=False)
class ToolDefinition:
    """A registered tool: its model-facing schema, output contract, body and host-only metadata.

    None of ``output``, ``execute``, ``finalize_content``, ``timeout_ms``,
    ``is_concurrency_safe``, ``present_call``, ``present_result`` or
    ``resource_keys`` ever reaches the model: ``ToolRuntime.schemas()`` projects
    only name, description and parameters.

    - ``execute(args, run)``, an async callable (checked when the definition is
      built), returns the canonical JSON value; ``args`` are the frozen,
      already validated arguments.
    - ``finalize_content(execution, result)`` runs exactly once per outcome, even
      for failures, and may replace only the content (return ``None`` to keep it).
    - ``timeout_ms`` is a cooperative budget enforced by the timeout plugin.
    - ``is_concurrency_safe(args)`` must return exactly ``True`` to run in parallel.
    - ``present_call`` / ``present_result`` build UI cards; they must be pure.
    - ``resource_keys(args)`` may return ``{"read": [...], "write": [...]}`` for
      finer-grained scheduling in ``run_tool_calls``.
    - ``effects`` declares what running it does (:class:`ToolEffects`); ``None``
      declares nothing.
    - ``retry`` (a :class:`RetryPolicy`) re-runs the body after a failure the
      policy calls passing; ``None`` (the default) never retries.
    - ``revert(args, value)`` (plain or ``async``) undoes what a successful
      call with those arguments did, given its canonical value; it raises when
      it cannot (the world changed since). The ``undo`` plugin calls it.
    - ``defer_loading=True`` keeps the tool's schema out of what the model is
      sent (``schemas()``, ``model_tools()``, the Code Mode SDK) until a scope
      loads it (``ToolRuntime.load_tools``, which the ``tool_search`` plugin's
      search tool does); it stays callable, and every policy still applies.
    - ``inline`` declares that ``execute`` never suspends. ``define_tool`` sets
      it for a plain ``def`` body and for an ``async def`` one that awaits
      nothing; for a raw definition the runtime also reads ``execute`` itself
      (see :func:`contract_of`). A call in which nothing can suspend runs
      without a per-call trio cancel scope: nothing in it could be interrupted.
    """

    name: str = attrs.field(validator=_name)
    description: str = attrs.field(validator=instance_of(str, exact=True))
    # mypy's attrs plugin does not read Converter objects (it then accepts any argument, as the converter does).
    parameters: FrozenDict = attrs.field(converter=attrs.Converter(_tool_parameters, takes_self=True))  # type: ignore[misc]
    output: ToolOutput = attrs.field(validator=_output)
    execute: Execute = attrs.field(validator=_async_body)
    finalize_content: FinalizeContent | None = attrs.field(default=None, validator=callable_or_none)
    timeout_ms: float | None = attrs.field(default=None, validator=_positive_timeout)
    is_concurrency_safe: Callable[[Any], object] | None = attrs.field(default=None, validator=callable_or_none)
    present_call: Callable[[Any], object] | None = attrs.field(default=None, validator=callable_or_none)
    present_result: Callable[[Any, Any], object] | None = attrs.field(default=None, validator=callable_or_none)
    resource_keys: Callable[[Any], object] | None = attrs.field(default=None, validator=callable_or_none)
    inline: bool = attrs.field(default=False, validator=instance_of(bool))
    effects: ToolEffects | None = attrs.field(default=None, validator=_effects)
    retry: RetryPolicy | None = attrs.field(default=None, validator=_retry)
    defer_loading: bool = attrs.field(default=False, validator=instance_of(bool))
    revert: Callable[[Any, Any], object] | None = attrs.field(default=None, validator=callable_or_none)
    schema: ToolSchema = attrs.field(init=False)
    # The compiled checks, built on the first call (compiling costs ~1 ms per schema,
    # so registering many tools stays cheap); see contract_of.
    _contract: ToolContract | None = attrs.field(init=False, default=None, eq=False, repr=False)
    # Its contract fingerprint, once asked for (dsh_core.contract_fingerprint); needs no compilation.
    _fingerprint: str | None = attrs.field(init=False, default=None, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(
            self, "schema", ToolSchema(name=self.name, description=self.description, parameters=self.parameters)
        )


class ToolContract:
    """What the pipeline checks a definition's calls against, compiled once per definition.

    ``args``/``output`` are the full validators (every violation, with paths);
    ``args_fast``/``output_fast`` are their compiled fastjsonschema functions
    (``None`` when a schema is beyond fastjsonschema), valid only for values
    that are already lossless snapshots, which is all the pipeline passes them.
    ``read_arguments`` (``None`` unless the parameter schema is that simple and
    nothing structures the arguments) returns the frozen snapshot of
    raw arguments that a flat parameter schema plainly accepts, in one pass, and
    ``None`` for any other value, which then takes the snapshot-and-check path.
    ``body_suspends`` says whether ``execute`` can give control back to trio.
    ``structure_arguments`` (``None`` unless ``execute`` is a ``define_tool``
    adapter of an attrs parameter class or a ``@tool`` signature) turns valid
    arguments into the instance ``execute`` takes in their place, raising
    ``ToolArgsError`` for what the schema cannot say (a ``dict[str, int]``'s
    values, an attrs validator): the pipeline calls it with the schema check.
    """

    __slots__ = ("args", "args_fast", "body_suspends", "output", "output_fast", "read_arguments", "structure_arguments")

    def __init__(self, definition: ToolDefinition) -> None:
        self.args: CompiledValidator = compile_validator(definition.parameters)
        self.output: CompiledValidator = compile_validator(definition.output.schema)
        self.args_fast = self.args.fast_function
        self.output_fast = self.output.fast_function
        self.structure_arguments: Callable[[JsonValue], object] | None = getattr(
            definition.execute, _STRUCTURE_ARGUMENTS, None
        )
        # The one-pass reader is for calls with nothing left to check after it: a structuring
        # tool's calls take the full check, which structuring follows (so others never pay for it).
        self.read_arguments = self.args.flat_reader if self.structure_arguments is None else None
        # A retried body pauses between attempts even when each attempt runs inline.
        self.body_suspends = definition.retry is not None or (
            not definition.inline and can_suspend(definition.execute)
        )

    def argument_violations(self, arguments: JsonValue) -> tuple[str, ...]:
        """Every violation of the parameter schema by the (snapshotted) ``arguments``; paths start at the root."""
        return _violations(self.args_fast, self.args, arguments, "")

    def output_violations(self, value: JsonValue) -> tuple[str, ...]:
        """Every violation of the output schema by the (snapshotted) ``value``."""
        return _violations(self.output_fast, self.output, value, "value")


def _violations(
    fast: Callable[[Any], Any] | None, full: CompiledValidator, value: JsonValue, path: str
) -> tuple[str, ...]:
    # The compiled function answers a valid snapshot alone; only a failing one pays for the full report.
    if fast is not None:
        try:
            fast(value)
        except Exception:
            pass
        else:
            return ()
    return full(value, path)


def contract_of(definition: ToolDefinition) -> ToolContract:
    """The compiled contract of ``definition`` (built on first use, then kept on it)."""
    contract = definition._contract
    if contract is None:
        contract = ToolContract(definition)
        object.__setattr__(definition, "_contract", contract)
    return contract


def is_async_callable(fn: Callable[..., Any]) -> bool:
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(fn, "__call__", None)  # noqa: B004 - an object with an async __call__
    return call is not None and inspect.iscoroutinefunction(call)


def _takes_run(name: str, fn: Callable[..., Any]) -> bool:
    """Whether ``execute`` is called as ``(args, run)`` (else ``(args)``); refuses any other signature."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return True  # not introspectable (a builtin, say): the definition's own (args, run)
    for arguments in ((None, None), (None,)):
        try:
            signature.bind(*arguments)
        except TypeError:
            continue
        return len(arguments) == 2
    shown = f"{getattr(fn, '__qualname__', type(fn).__name__)}{signature.replace(return_annotation=signature.empty)}"
    raise TypeError(f'define_tool("{name}"): execute must take (args) or (args, run), got {shown}')


def _refuse_awaitable(name: str, value: object) -> NoReturn:
    # Awaiting it would run async work outside the cancel scope the runtime skips
    # for inline tools (or on a worker thread): refuse instead of hiding the bug.
    if inspect.iscoroutine(value):
        value.close()
    raise TypeError(f'tool "{name}": a plain def execute returned an awaitable; declare it async def')


def _is_async(callback: Callable[..., Any]) -> bool:
    """An ``async def`` function, or an object whose ``__call__`` is one."""
    return inspect.iscoroutinefunction(callback) or inspect.iscoroutinefunction(type(callback).__call__)


def _dsl(name: str, side: str, compile_spec: Callable[[object], dict[str, Any]], spec: object) -> dict[str, Any]:
    """``compile_spec(spec)``, its problems naming the tool and the side (a module defines many tools)."""
    try:
        return compile_spec(spec)
    except SchemaSpecError as exc:
        # The paths keep the compiler's labels ("schema" is the output's root, "parameters" the map's).
        wrapped = Violations([f'define_tool("{name}") {side}: {v}' for v in exc.violations], exc.omitted)
        raise SchemaSpecError(wrapped) from None


def define_tool(
    *,
    name: str,
    description: str,
    parameters: Mapping[str, Any] | type | RawSchema,
    output: ToolOutput | Mapping[str, Any] | RawSchema,
    execute: Callable[..., Any],
    finalize_content: FinalizeContent | None = None,
    timeout_ms: float | None = None,
    is_concurrency_safe: Callable[[Any], object] | None = None,
    present_call: Callable[[Any], object] | None = None,
    present_result: Callable[[Any, Any], object] | None = None,
    resource_keys: Callable[[Any], object] | None = None,
    in_thread: bool = False,
    effects: ToolEffects | None = None,
    retry: RetryPolicy | None = None,
    defer_loading: bool = False,
    revert: Callable[[Any, Any], object] | None = None,
) -> ToolDefinition:
    """Build a :class:`ToolDefinition` from the author DSL (or an attrs parameter class).

    ``parameters`` is a DSL parameter map (``{"path": {"type": "string",
    "required": True}}``) or an attrs class whose fields define the schema; in
    the latter case the body, renderers, presenters and classifiers receive a
    structured instance instead of the frozen dict. ``output`` is a
    :class:`ToolOutput` whose schema is a DSL value spec, or just the DSL value
    spec (then the default renderer is used). Either schema may instead be a
    :class:`RawSchema`: JSON Schema already in the enforced subset, taken as it
    is (parameters must be an object schema). ``execute`` may take ``(args)`` or
    ``(args, run)``; an ``async def`` body can await and be cancelled, a plain
    ``def`` body runs inline on the event loop (keep it quick: blocking work
    belongs in a worker thread). An ``async def`` body with no ``await`` is
    inline too: its calls need no cancel scope.

    ``retry=RetryPolicy(...)`` re-runs the body after a failure the policy
    names (:class:`TransientToolError`, a dropped connection...), pausing with
    exponential backoff; the attempts and pauses all run inside the call's
    signal and any wrapper's deadline.

    ``revert`` declares how to undo a successful call (see ``ToolDefinition``);
    it receives the same structured arguments as the body.

    ``in_thread=True`` runs a plain ``def`` body in a worker thread through
    :meth:`ToolRunContext.run_in_thread`: a cancelled or timed-out call
    resolves at once and a thread still running is reported as
    :class:`OrphanedWork` rather than holding the call open or leaking
    silently. (An ``async def`` body calls ``run.run_in_thread`` itself.)

    The runtime validates arguments against the compiled schema before any
    policy sees them (``INVALID_ARGS``), and structures them there too when the
    parameters are an attrs class, so what only the class checks (a
    ``dict[str, int]``'s values, a validator) is refused as early; the body gets
    that instance. It validates the body's value against the output schema
    (``INVALID_TOOL_OUTPUT``). Presenters and the concurrency
    classifier validate softly: invalid arguments give the generic card and an
    exclusive call instead of an error.

    Raises ``SchemaSpecError``/``JsonSchemaError`` for bad schemas and
    ``TypeError`` for a non-positive or non-finite ``timeout_ms``.
    """
    if timeout_ms is not None and (type(timeout_ms) not in (int, float) or not positive_finite(timeout_ms)):
        raise TypeError(f'define_tool("{name}"): timeout_ms must be a positive finite number, got {timeout_ms!r}')

    if not callable(execute):
        raise TypeError(f'define_tool("{name}"): execute must be callable, got {type(execute).__name__}')
    if any(inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn) for fn in (execute, type(execute).__call__)):
        # Every call would return a generator, never a value: INVALID_TOOL_OUTPUT or TOOL_ERROR each time.
        raise TypeError(
            f'define_tool("{name}"): execute is a generator function; a tool returns its whole value (a list, say)'
        )
    if type(in_thread) is not bool:
        raise TypeError(f'define_tool("{name}"): in_thread must be a bool, got {type(in_thread).__name__}')
    body_takes_run = _takes_run(name, execute)
    for option, callback in (
        ("is_concurrency_safe", is_concurrency_safe),
        ("present_call", present_call),
        ("present_result", present_result),
        ("resource_keys", resource_keys),
        ("revert", revert),
    ):
        if callback is not None and not callable(callback):
            hint = " (for every call: is_concurrency_safe=lambda args: True)" if option == "is_concurrency_safe" else ""
            raise TypeError(
                f'define_tool("{name}"): {option} must be callable or None, got {type(callback).__name__}{hint}'
            )
    for option, callback in (("is_concurrency_safe", is_concurrency_safe), ("resource_keys", resource_keys)):
        if callback is not None and _is_async(callback):
            # Called synchronously as each call is scheduled: a coroutine back would be "malformed",
            # and every call of the tool would quietly run alone.
            raise TypeError(
                f'define_tool("{name}"): {option} must be a plain function (it is called synchronously as '
                "each call is scheduled), not an async one"
            )

    params_class: type | None = None
    raw_parameters: Mapping[str, Any]
    if isinstance(parameters, type):
        params_class = parameters
        raw_parameters = schema_from_attrs_class(parameters)
    elif isinstance(parameters, RawSchema):
        try:
            assert_object_json_schema(parameters.node, reason=TOOL_ARGUMENTS_ROOT)
        except JsonSchemaError as exc:
            wrapped = Violations([f'define_tool("{name}") parameters: {v}' for v in exc.violations], exc.omitted)
            raise JsonSchemaError(wrapped) from None
        raw_parameters = parameters.node
    else:
        raw_parameters = _dsl(name, "parameters", parameter_schema_to_json_schema, parameters)

    if isinstance(output, RawSchema):
        raw_output = ToolOutput(schema=output)
    elif isinstance(output, ToolOutput) and output._schema_is_raw:
        raw_output = output
    elif isinstance(output, ToolOutput):
        raw_output = _compiled_output(
            _dsl(name, "output", value_schema_to_json_schema, output.schema), output.render, output.presentation_meta
        )
    else:
        raw_output = _compiled_output(_dsl(name, "output", value_schema_to_json_schema, output))

    validate_args = compile_validator(raw_parameters)

    def typed(args: Any) -> Any:
        if params_class is None or type(args) is params_class:
            # Already structured: the pipeline did it with the schema check, before any policy.
            return args
        return structure_args(params_class, args)

    body_is_async = is_async_callable(execute)
    if in_thread and body_is_async:
        raise TypeError(
            f'define_tool("{name}"): in_thread=True takes a plain def execute; '
            "an async def body awaits run.run_in_thread(...) for its blocking part"
        )
    # An async body that awaits nothing cannot suspend either: awaiting it inline is safe.
    inline = not in_thread and (not body_is_async or not can_suspend(execute))

    run_body: Execute
    if in_thread:

        def call_body(args: Any, run: ToolRunContext) -> object:
            typed_args = typed(args)
            value = execute(typed_args, run) if body_takes_run else execute(typed_args)
            if inspect.isawaitable(value):
                _refuse_awaitable(name, value)
            return value

        # Orphaned work names the author's function, not this adapter.
        functools.update_wrapper(call_body, execute)

        async def run_body(args: Any, run: ToolRunContext) -> object:
            return await run.run_in_thread(call_body, args, run)

    elif not body_is_async:
        # The same steps as call_body, inline: no extra frame on every call of a plain def tool.

        async def run_body(args: Any, run: ToolRunContext) -> object:
            typed_args = typed(args)
            value = execute(typed_args, run) if body_takes_run else execute(typed_args)
            if inspect.isawaitable(value):
                _refuse_awaitable(name, value)
            return value

    elif params_class is None and body_takes_run:
        # Already the definition's (args, run) signature: no adapter frame per call.
        run_body = execute
    elif params_class is None:

        async def run_body(args: Any, run: ToolRunContext) -> object:
            return await execute(args)

    else:

        async def run_body(args: Any, run: ToolRunContext) -> object:
            typed_args = typed(args)
            if body_takes_run:
                return await execute(typed_args, run)
            return await execute(typed_args)

    if params_class is not None:
        setattr(run_body, _STRUCTURE_ARGUMENTS, typed)

    def soft(fn: Callable[..., Any] | None, *, fallback: Any) -> Callable[..., Any] | None:
        if fn is None:
            return None

        def checked(args: Any, *rest: Any) -> Any:
            if validate_args(args):
                return fallback
            try:
                typed_args = typed(args)
            except ToolArgsError:
                # Valid for the schema but not for the class (a dict[str, int] holding a string):
                # as soft as a schema violation; the body's call reports it.
                return fallback
            return fn(typed_args, *rest)

        checked.__name__ = getattr(fn, "__name__", "checked")
        checked.__qualname__ = getattr(fn, "__qualname__", "checked")
        return checked

    if params_class is not None:
        user_render = raw_output.render
        user_meta = raw_output.presentation_meta
        raw_output = _compiled_output(
            raw_output.schema,
            # The default renderer ignores the arguments: do not structure them for it.
            user_render if user_render is default_render else lambda args, value: user_render(typed(args), value),
            (lambda args, value: user_meta(typed(args), value)) if user_meta else None,
        )

    return ToolDefinition(
        name=name,
        description=description,
        parameters=raw_parameters,
        output=raw_output,
        execute=run_body,
        inline=inline,
        finalize_content=finalize_content,
        timeout_ms=timeout_ms,
        is_concurrency_safe=soft(is_concurrency_safe, fallback=False),
        present_call=soft(present_call, fallback=None),
        present_result=soft(present_result, fallback=None),
        resource_keys=soft(resource_keys, fallback=None),
        effects=effects,
        retry=retry,
        defer_loading=defer_loading,
        revert=(lambda args, value: revert(typed(args), value)) if revert is not None and params_class is not None else revert,
    )
