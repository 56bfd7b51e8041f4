"""Decision traces: which listener, approval, guard, wrapper and finaliser shaped one call.

With ``ToolRuntime(trace_decisions=True)`` every result carries a
:class:`DecisionTrace` in ``result.trace`` (``None`` when tracing is off: the
pipeline then records nothing at all). It is host-side data: it never reaches
the model-facing content, and a :class:`~dsh_core.SessionRecorder` writes it
into the ``tool/result`` event so ``dsh-tools explain`` can show it later.

Steps come in pipeline order, and within one waterfall outermost listener
first. Each is ``(stage, actor, outcome)``:

========== ======================== ==========================================================
stage      actor                    outcome
========== ======================== ==========================================================
pre        listener's plugin name   ``allow`` (its own ``Allow()``), ``deny: <reason>``,
                                    ``ask`` / ``ask: <reason>``, ``pass`` (returned ``next()``'s),
                                    ``interrupted``
approval   ``approval``             ``allow`` (``"allowed-once"``), ``deny: <reason>``,
                                    ``interrupted``
guard      the guard's name         ``pass`` or ``deny: <reason>``
execute    wrapper's plugin name    ``pass``, ``replace`` (its own success),
                                    ``fail: <CODE>: <message>`` (its own failure), ``interrupted``
execute    ``<tool> (attempt <n>)`` ``retry in <s> s: fail: <CODE>: <message>``: a failed
                                    attempt of a tool with a ``RetryPolicy``, before the body step
execute    ``<tool> (body)``        ``ok`` or ``fail: <CODE>: <message>``
execute    ``dispatch``             ``cancelled: <reason>``: the call's signal fired after the gates
                                    let it through; no wrapper or body ran (ABORTED_BEFORE_DISPATCH)
post       listener's plugin name   ``accept``, ``accept(content)``, ``accept(value)``,
                                    ``block: <feedback>``, ``pass``, ``interrupted``
finalize   ``finalize_content``     ``pass`` or ``replace(content)``
any        plugin name / runtime    ``error: <CODE>: <message>``: a listener, guard, approval
                                    service or finaliser broke its contract, ending the call
========== ======================== ==========================================================

``accept``/``allow`` mean the listener returned a decision of its own without
delegating (inner listeners did not run or were overridden); ``pass`` means
it returned what ``next()`` gave it. A stage that did not run has no steps.

``interrupted`` is a listener or approval prompt that was running when the
call's cancellation landed (or a cancellation unwound through it): it decided
nothing, but it touched the call. A body interrupted so shows
``fail: ABORTED: tool call aborted``, the same as when the body's own scope
catches the cancellation. A listener whose failure is grouped with the
cancellation is not ``interrupted``: its ``error`` step says what it did.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Final, Literal, TypeAlias, cast

import attrs
import cattrs

from ._checks import instance_of
from ._content import text_of
from ._decisions import UNSET, Accept, Allow, Ask, Block, Deny, Rewrite
from ._results import ToolExecutionFailure, ToolExecutionResult, with_trace
from ._retry import RetryAttempt
from ._waterfall import INTERRUPTED
from .presentation import _configure_strict

__all__ = ["STAGES", "DecisionTrace", "TraceRecorder", "TraceStage", "TraceStep", "trace_of"]

TraceStage: TypeAlias = Literal["pre", "approval", "guard", "execute", "post", "finalize"]
STAGES: Final[tuple[TraceStage, ...]] = ("pre", "approval", "guard", "execute", "post", "finalize")


def _stage(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value not in STAGES:
        raise ValueError(f"TraceStep.stage must be one of {', '.join(STAGES)}, got {value!r}")


_text = instance_of(str, exact=True)


@attrs.frozen(slots=True, kw_only=True)
class TraceStep:
    """One layer's part in a call's outcome: the stage, who acted, and what it did (see the module table)."""

    stage: TraceStage = attrs.field(validator=_stage)
    actor: str = attrs.field(validator=_text)
    outcome: str = attrs.field(validator=_text)

    @property
    def decisive(self) -> bool:
        """Whether this step decided something itself (anything but ``pass``, ``ok``, ``interrupted``)."""
        return self.outcome not in ("pass", "ok", "interrupted")

    @property
    def verdict(self) -> str:
        """The outcome without its free text: ``fail: TOOL_ERROR``, ``deny``, ``block``, ``retry in 0.5 s: fail: X``.

        The reason, message or feedback after the verdict often quotes the
        call's arguments or its output; this is what can go where content must
        not (a trace exporter that records no content).
        """
        coded = _CODED_OUTCOME.match(self.outcome)
        if coded is not None:
            return coded.group(1)
        return self.outcome.split(": ", 1)[0][:_VERDICT_CHARS]


# ``fail: CODE: message`` / ``error: CODE: message`` (the formats below), maybe after ``retry in <s> s: ``.
_CODED_OUTCOME: Final = re.compile(r"((?:retry in [^:]{1,32} s: )?(?:fail|error): [A-Za-z0-9_.-]{1,64})(?:: |$)")
_VERDICT_CHARS: Final = 64


def _steps(value: Iterable[TraceStep]) -> tuple[TraceStep, ...]:
    steps = tuple(value)
    for index, step in enumerate(steps):
        if not isinstance(step, TraceStep):
            raise TypeError(f"DecisionTrace steps[{index}] must be a TraceStep, got {type(step).__name__}")
    return steps


@attrs.frozen(slots=True, eq=False)
class DecisionTrace:
    """The ordered :class:`TraceStep`\\ s of one call; iterable, and JSON-round-trippable for session logs.

    A trace on a pipeline result is formatted from the call's raw recording
    the first time its steps are read, so tracing costs a call a few list
    appends; it compares equal to a trace built from the same steps.
    """

    steps: tuple[TraceStep, ...] = attrs.field(converter=_steps)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DecisionTrace):
            return NotImplemented
        return self.steps == other.steps

    def __hash__(self) -> int:
        return hash(self.steps)

    def __iter__(self) -> Iterator[TraceStep]:
        return iter(self.steps)

    def __len__(self) -> int:
        return len(self.steps)

    def stage(self, stage: TraceStage) -> tuple[TraceStep, ...]:
        """The steps of one stage, in order."""
        return tuple(step for step in self.steps if step.stage == stage)

    def to_json(self) -> list[dict[str, str]]:
        """``[{"stage", "actor", "outcome"}, ...]``: what the ``tool/result`` event's ``trace`` holds."""
        return [{"stage": s.stage, "actor": s.actor, "outcome": s.outcome} for s in self.steps]

    @classmethod
    def from_json(cls, data: object) -> DecisionTrace:
        """The inverse of :meth:`to_json`.

        Raises:
            ValueError: ``data`` is not a list of step objects; the message names each bad path.
        """
        if not isinstance(data, list | tuple):
            raise ValueError(f"invalid decision trace: expected a list of steps, got {type(data).__name__}")
        try:
            steps = _converter.structure(data, tuple[TraceStep, ...])
        except Exception as exc:
            raise ValueError("invalid decision trace: " + "; ".join(cattrs.transform_error(exc, "$"))) from None
        return cls(steps)


_converter = cattrs.Converter(forbid_extra_keys=True)
_configure_strict(_converter)


def trace_of(result: ToolExecutionResult) -> DecisionTrace | None:
    """The decision trace ``result`` carries (``None`` when the runtime did not trace)."""
    trace: object = result.trace
    return trace if isinstance(trace, DecisionTrace) else None


# -- recording (the pipeline's side) ----------------------------------------------------------

_CHAIN: Final = object()  # marks an entry holding one waterfall's listener outcomes
_ENTER: Final = object()  # marks the start of a stage that may fail before recording a step
_REASON_CHARS: Final = 200  # a cancel reason is any object a host passed: its repr may be huge
_NOT_DISPATCHED: Final = object()  # marks a call cancelled between its gates and its dispatch
_FAIL: Final = object()  # marks the failure that ended the call early
_NOT_RUN: Final = object()  # the execute chain's base when the body never ran


class TraceRecorder:
    """What the pipeline records for one call while tracing is on: raw outcomes, formatted later.

    Recording only appends references (no formatting, no copies), so a traced
    call pays a few list appends per stage; an untraced call has no recorder.
    """

    __slots__ = ("_entries",)

    def __init__(self) -> None:
        self._entries: list[tuple[TraceStage, object, object]] = []

    def chain(self, stage: TraceStage, base: object) -> list[tuple[str, Any]]:
        """A list for one waterfall's ``Chain.trace``; ``base`` is the built-in default outcome."""
        entries: list[tuple[str, Any]] = []
        self._entries.append((stage, _CHAIN, (entries, base)))
        return entries

    def enter(self, stage: TraceStage) -> None:
        """Note that ``stage`` started (so a failure in it is attributed to it)."""
        self._entries.append((stage, _ENTER, None))

    def not_dispatched(self, reason: object) -> None:
        """Note that the call was cancelled (for ``reason``) after the gates allowed it, before dispatch."""
        self._entries.append(("execute", _NOT_DISPATCHED, reason))

    def add(self, stage: TraceStage, actor: object, outcome: object) -> None:
        """One non-waterfall step: approval, a guard, the body, the finaliser."""
        self._entries.append((stage, actor, outcome))

    def fail(self, result: ToolExecutionResult) -> None:
        """The failure that ended the call without post-execute (a broken contract)."""
        self._entries.append(("pre", _FAIL, result))

    def attach(self, result: ToolExecutionResult) -> ToolExecutionResult:
        """A copy of ``result`` carrying this recording as its trace (formatted when first read)."""
        return with_trace(result, _RecordedTrace(self))

    def build(self) -> DecisionTrace:
        """Format the recorded outcomes into a :class:`DecisionTrace`."""
        entries = self._entries
        # The execute chain's base is the body, recorded (after the chain's marker) when it ran.
        body = next((o for s, a, o in entries if s == "execute" and isinstance(a, str)), _NOT_RUN)
        steps: list[TraceStep] = []
        current: TraceStage = "pre"
        for stage, actor, outcome in entries:
            if actor is _FAIL:
                assert isinstance(outcome, ToolExecutionFailure)
                info = outcome.error.info
                who = (info.plugin if info is not None else None) or "runtime"
                steps.append(TraceStep(stage=current, actor=who, outcome=_failure("error", outcome)))
                continue
            current = stage
            if actor is _ENTER:
                continue
            if actor is _NOT_DISPATCHED:
                steps.append(TraceStep(stage=stage, actor="dispatch", outcome=_cancelled(outcome)))
                continue
            if actor is _CHAIN:
                listeners, base = cast(tuple[list[tuple[str, Any]], object], outcome)
                steps.extend(_chain_steps(stage, listeners, body if stage == "execute" else base))
            elif isinstance(actor, RetryAttempt):
                steps.append(
                    TraceStep(
                        stage=stage,
                        actor=f"{actor.tool} (attempt {actor.attempt})",
                        outcome=f"retry in {actor.pause_s:.3g} s: fail: {actor.code}: {actor.message}",
                    )
                )
            elif stage == "execute":
                steps.append(TraceStep(stage=stage, actor=f"{actor} (body)", outcome=_body(outcome)))
            elif stage == "guard" and not (outcome is None or (type(outcome) is str and outcome)):
                continue  # a malformed verdict: the failure step that follows says so
            else:
                steps.append(TraceStep(stage=stage, actor=_actor(actor), outcome=_single(stage, outcome)))
        return DecisionTrace(steps)


class _RecordedTrace(DecisionTrace):
    """A :class:`DecisionTrace` whose steps are formatted from a recording on first access."""

    __slots__ = ("_formatted", "_recorder")

    _formatted: tuple[TraceStep, ...] | None
    _recorder: TraceRecorder | None

    def __init__(self, recorder: TraceRecorder) -> None:
        object.__setattr__(self, "_recorder", recorder)
        object.__setattr__(self, "_formatted", None)

    @property
    def steps(self) -> tuple[TraceStep, ...]:
        formatted = self._formatted
        if formatted is None:
            assert self._recorder is not None
            formatted = self._recorder.build().steps
            object.__setattr__(self, "_formatted", formatted)
            object.__setattr__(self, "_recorder", None)  # the raw outcomes are no longer needed
        return formatted

    def __repr__(self) -> str:
        return f"DecisionTrace(steps={self.steps!r})"


def _actor(actor: object) -> str:
    if isinstance(actor, str):
        return actor
    return str(getattr(actor, "__qualname__", None) or getattr(type(actor), "__qualname__", "guard"))


def _failure(prefix: str, result: ToolExecutionFailure) -> str:
    info = result.error.info
    code = info.code if info is not None else "ERROR"
    return f"{prefix}: {code}: {result.error.message}"


def _cancelled(reason: object) -> str:
    text = reason if isinstance(reason, str) else repr(reason)
    if len(text) > _REASON_CHARS:
        text = text[:_REASON_CHARS] + "..."
    return f"cancelled: {text}"


def _body(result: object) -> str:
    if isinstance(result, ToolExecutionFailure):
        return _failure("fail", result)
    return "ok"


def _single(stage: TraceStage, outcome: object) -> str:
    if stage == "guard":
        return "pass" if outcome is None else f"deny: {outcome}"
    if stage == "finalize":
        before, after = cast(tuple[object, object], outcome)
        if after is before:
            return "pass"
        if isinstance(after, ToolExecutionFailure) and (
            not isinstance(before, ToolExecutionFailure) or after.error is not before.error
        ):
            return _failure("error", after)  # the finaliser raised: the call became a failure
        return "replace(content)"
    return _decision(outcome)


def _decision(outcome: object) -> str:
    if outcome is INTERRUPTED:
        return "interrupted"
    match outcome:
        case Allow():
            return "allow"
        case Deny(reason=reason):
            return f"deny: {reason}"
        case Ask(reason=reason):
            return f"ask: {reason}" if reason else "ask"
        case Rewrite(reason=reason):
            return f"rewrite: {reason}"
        case Block(feedback=feedback):
            text = text_of(feedback)
            return f"block: {text}" if text else "block"
        case Accept():
            if outcome.value is not UNSET:
                kind = "accept(value)"
            elif outcome.content is not None:
                kind = "accept(content)"
            else:
                kind = "accept"
            contexts = len(outcome.additional_contexts)
            return kind + (f" +{contexts} context{'s' if contexts != 1 else ''}" if contexts else "")
        case ToolExecutionFailure():
            return _failure("fail", outcome)
        case _:
            return "replace"


def _chain_steps(stage: TraceStage, entries: Sequence[tuple[str, Any]], base: object) -> list[TraceStep]:
    # Chain appends each listener's outcome when it returns, so ``entries`` runs
    # innermost first; a listener passed when it returned its inner neighbour's
    # (or, innermost, the base's) outcome object itself.
    steps: list[TraceStep] = []
    outer_first = list(reversed(entries))
    for index, (plugin, outcome) in enumerate(outer_first):
        inner = outer_first[index + 1][1] if index + 1 < len(outer_first) else base
        passed = outcome is inner and outcome is not INTERRUPTED
        steps.append(TraceStep(stage=stage, actor=plugin, outcome="pass" if passed else _decision(outcome)))
    return steps
