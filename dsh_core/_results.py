"""Tool execution results: the one frozen outcome every caller and observer sees."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Literal, TypeAlias

import attrs

from ._checks import instance_of
from ._content import ContentBlock, UserMessage, as_content, text_block
from ._errors import DshError, ErrorCode
from ._json import JsonValue, json_repr, snapshot_json

if TYPE_CHECKING:
    from ._trace import DecisionTrace

__all__ = [
    "ToolErrorInfo",
    "ToolExecutionFailure",
    "ToolExecutionResult",
    "ToolExecutionSuccess",
    "ToolFailure",
    "failure_from_exception",
    "failure_result",
    "new_success",
    "sole_exception",
    "with_trace",
]


def _content(blocks: object) -> tuple[ContentBlock, ...]:
    return as_content(blocks, what="result content")


def _contexts(contexts: Iterable[object]) -> tuple[UserMessage, ...]:
    out = tuple(contexts)
    for index, context in enumerate(out):
        if type(context) is not UserMessage:
            raise TypeError(f"additional_contexts[{index}] must be a UserMessage, got {type(context).__name__}")
    return out  # type: ignore[return-value]  # every item checked above


# Results are built by plugins too (a dsh_execute wrapper may return its own), so every field
# is checked and frozen on construction: whatever reaches observers and the caller is lossless
# and immutable, and a malformed one fails where it is made, blamed on whoever made it. The
# pipeline's own hot path builds successes from checked parts with new_success instead.


@attrs.frozen(slots=True)
class ToolErrorInfo:
    """Machine-readable identity of a failure: the error class name and its stable code.

    ``plugin`` names the plugin (pluggy plugin name) whose listener caused the
    failure, when a listener did.
    """

    name: str = attrs.field(validator=instance_of(str))
    code: str = attrs.field(validator=instance_of(str))
    plugin: str | None = attrs.field(
        default=None, validator=instance_of(str, optional=True)
    )


@attrs.frozen(slots=True)
class ToolFailure:
    """Why a call failed: the message (without the ``Error: `` prefix) and its info."""

    message: str = attrs.field(validator=instance_of(str))
    info: ToolErrorInfo | None = attrs.field(
        default=None, validator=instance_of(ToolErrorInfo, optional=True)
    )


# Results are not slotted: one is built per call, and a frozen attrs class
# writes its instance dict directly, about twice as fast as its slotted form.
@attrs.frozen(slots=False)
class ToolExecutionSuccess:
    """A successful call: the canonical ``value`` plus its model-facing ``content``.

    ``value`` is execution-local (durable logs keep only ``content`` and ``meta``).
    ``meta`` is ``None`` when the tool declared no presentation metadata.
    ``trace`` is the decision trace when the runtime records them (not part of equality).
    """

    value: JsonValue = attrs.field(converter=snapshot_json, repr=json_repr)  # the pipeline also checks it against the output schema
    content: tuple[ContentBlock, ...] = attrs.field(converter=_content)
    meta: JsonValue = attrs.field(default=None, converter=snapshot_json, repr=json_repr)
    additional_contexts: tuple[UserMessage, ...] = attrs.field(default=(), converter=_contexts)
    concludes_turn: bool = attrs.field(default=False, validator=instance_of(bool))
    trace: DecisionTrace | None = attrs.field(default=None, eq=False, repr=False)

    @property
    def is_error(self) -> Literal[False]:
        return False

    @property
    def error(self) -> None:
        return None


@attrs.frozen(slots=False)
class ToolExecutionFailure:
    """A failed call; it never carries a value and never concludes the turn."""

    error: ToolFailure = attrs.field(validator=instance_of(ToolFailure))
    content: tuple[ContentBlock, ...] = attrs.field(converter=_content)
    meta: JsonValue = attrs.field(default=None, converter=snapshot_json, repr=json_repr)
    additional_contexts: tuple[UserMessage, ...] = attrs.field(default=(), converter=_contexts)
    trace: DecisionTrace | None = attrs.field(default=None, eq=False, repr=False)

    @property
    def is_error(self) -> Literal[True]:
        return True

    @property
    def concludes_turn(self) -> Literal[False]:
        return False

    @property
    def code(self) -> str | None:
        """Shortcut for ``error.info.code``."""
        return self.error.info.code if self.error.info else None


ToolExecutionResult: TypeAlias = ToolExecutionSuccess | ToolExecutionFailure

_new_object = object.__new__


def new_success(
    value: JsonValue, content: tuple[ContentBlock, ...], meta: JsonValue, concludes_turn: bool
) -> ToolExecutionSuccess:
    """The pipeline's success constructor for checked values (the class has no validators to skip)."""
    success: ToolExecutionSuccess = _new_object(ToolExecutionSuccess)
    fields = success.__dict__
    fields["value"] = value
    fields["content"] = content
    fields["meta"] = meta
    fields["additional_contexts"] = ()
    fields["concludes_turn"] = concludes_turn
    fields["trace"] = None
    return success


def with_trace(result: ToolExecutionResult, trace: DecisionTrace) -> ToolExecutionResult:
    """A copy of ``result`` carrying ``trace`` (``attrs.evolve`` without re-running ``__init__``)."""
    kind = type(result)
    if kind is not ToolExecutionSuccess and kind is not ToolExecutionFailure:
        return attrs.evolve(result, trace=trace)  # a subclass may keep fields outside its __dict__
    copy: ToolExecutionResult = _new_object(kind)
    fields = copy.__dict__
    fields.update(result.__dict__)
    fields["trace"] = trace
    return copy


def failure_result(
    message: str,
    code: str | ErrorCode | None,
    *,
    name: str | None = None,
    plugin: str | None = None,
    additional_contexts: tuple[UserMessage, ...] = (),
) -> ToolExecutionFailure:
    """A failure whose content is exactly ``[TextBlock("Error: <message>")]``."""
    info = None
    if code is not None:
        code_text = code.value if isinstance(code, ErrorCode) else str(code)
        info = ToolErrorInfo(name=name or _default_name(code_text), code=code_text, plugin=plugin)
    return ToolExecutionFailure(
        error=ToolFailure(message=message, info=info),
        content=(text_block(f"Error: {message}"),),
        additional_contexts=additional_contexts,
    )


def _default_name(code: str) -> str:
    return {
        "UNKNOWN_TOOL": "ToolNotFoundError",
        "INVALID_ARGS": "ToolArgsError",
        "INVALID_TOOL_OUTPUT": "ToolOutputError",
        "ABORTED": "AbortError",
        "ABORTED_BEFORE_DISPATCH": "AbortError",
        "TOOL_TIMEOUT": "ToolTimeoutError",
        "CODE_RUN_FAILED": "CodeRunFailedError",
        "DENIED": "PolicyDenial",
        "POLICY_ERROR": "PolicyError",
    }.get(code, "ToolError")


def error_message(exc: BaseException) -> str:
    """A message for any raised value; never raises itself."""
    try:
        text = str(exc)
    except BaseException:
        return "<unprintable exception>"
    return text or type(exc).__name__


def sole_exception(exc: BaseException) -> BaseException:
    """``exc``, or the one exception inside it when it is a group of one (at any depth).

    A trio nursery groups even a single child's error: the failure reports that
    error, and a retry policy must judge the same one. Public for plugins whose
    own nurseries (or a library's task groups) wrap the one error they mean to
    handle. A group of several is returned as it is (opened down to it).
    """
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return exc


def failure_from_exception(
    exc: BaseException,
    *,
    default_code: ErrorCode,
    plugin: str | None = None,
    additional_contexts: tuple[UserMessage, ...] = (),
) -> ToolExecutionFailure:
    """Normalise a raised exception: a ``DshError`` keeps its code, others get ``default_code``.

    An exception group holding a single exception (what a trio nursery raises when
    one task failed) is reported as that exception: its name, message and code.
    """
    exc = sole_exception(exc)
    code = exc.code if isinstance(exc, DshError) else default_code.value
    return failure_result(
        error_message(exc),
        code,
        name=type(exc).__name__,
        plugin=plugin,
        additional_contexts=additional_contexts,
    )
