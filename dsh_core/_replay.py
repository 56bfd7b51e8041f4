"""Presenting calls live and from a session log, with the same presenters.

Presenters depend only on the call's arguments and the *durable* result
projection (content, failure state, meta), never on the canonical value, so a
session log alone reproduces what a UI showed live. A missing or raising
presenter falls back to the generic card; presentation never breaks a call.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from ._arguments_text import ArgumentsText, model_arguments
from ._content import ContentBlock, UserMessage
from ._decisions import UNSET
from ._execution import ScopeKey, ToolExecution, ToolExecutionInput, scope_id
from ._fingerprint import contract_changed, contract_fingerprint
from ._json import JsonValue, thaw
from ._logged_calls import logged_calls, session_events
from ._results import ToolExecutionResult, error_message
from ._session_log import SessionEvent, SessionLog, SessionLogError, SessionLogRead, structure_contexts
from ._trace import trace_of
from ._waterfall import is_fatal
from .hookspecs import hookimpl
from .presentation import GenericCallView, ToolCallView, ToolResultView

if TYPE_CHECKING:
    from ._runtime import ToolRuntime

__all__ = ["ReplayedCall", "SessionRecorder", "ToolResult", "present_call", "present_result", "replay"]

logger = logging.getLogger("dsh_core.presentation")

_CALL_VIEWS = ToolCallView.__args__
_RESULT_VIEWS = ToolResultView.__args__


@attrs.frozen(slots=True, kw_only=True)
class ToolResult:
    """The durable projection of a result a result presenter sees: what a log keeps."""

    content: tuple[ContentBlock, ...]
    is_error: bool
    meta: JsonValue = None

    @classmethod
    def of(cls, result: ToolExecutionResult) -> ToolResult:
        return cls(content=result.content, is_error=result.is_error, meta=result.meta)


def present_call(runtime: ToolRuntime, name: str, arguments: JsonValue, scope: ScopeKey | None = None) -> ToolCallView:
    """The pending card for a call: the visible tool's ``present_call``, else the generic card."""
    fallback = GenericCallView(title=name, raw_input=arguments)
    tool = runtime.get(name, scope)
    if tool is None or tool.present_call is None:
        return fallback
    try:
        view = tool.present_call(arguments)
    except BaseException as exc:
        if is_fatal(exc):
            raise
        logger.warning('tool "%s": present_call failed: %s; using the generic card', name, error_message(exc))
        return fallback
    if view is None:
        return fallback
    if not isinstance(view, _CALL_VIEWS):
        logger.warning('tool "%s": present_call returned %r, not a ToolCallView; using the generic card', name, view)
        return fallback
    checked: ToolCallView = view
    return checked


def present_result(
    runtime: ToolRuntime, name: str, arguments: JsonValue, result: ToolResult, scope: ScopeKey | None = None
) -> ToolResultView | None:
    """The completed card, or ``None`` to keep the pending title and show the raw content."""
    tool = runtime.get(name, scope)
    if tool is None or tool.present_result is None:
        return None
    try:
        view = tool.present_result(arguments, result)
    except BaseException as exc:
        if is_fatal(exc):
            raise
        logger.warning('tool "%s": present_result failed: %s; showing the raw content', name, error_message(exc))
        return None
    if view is not None and not isinstance(view, _RESULT_VIEWS):
        logger.warning('tool "%s": present_result returned %r, not a ToolResultView', name, view)
        return None
    return view


@attrs.frozen(slots=True, kw_only=True)
class ReplayedCall:
    """One model-requested call as a session log tells it, with its cards."""

    call_id: str
    name: str
    arguments: JsonValue
    agent: str | None
    call_view: ToolCallView
    result: ToolResult | None
    result_view: ToolResultView | None
    error: Mapping[str, Any] | None
    dispatches: tuple[Mapping[str, Any], ...] = ()
    # The messages that followed the result in the model's context (deferred contexts, rewrite notes).
    contexts: tuple[UserMessage, ...] = ()
    # The ``tool/unwound`` data of a call cut short with no result (see ``LoggedCall.unwound``).
    unwound: Mapping[str, Any] | None = None
    # Whether the tool's contract differs from the one the call was recorded against;
    # None when the log has no fingerprint for the call or no such tool is registered now.
    contract_changed: bool | None = None


def replay(log: SessionLogRead | Iterable[SessionEvent], runtime: ToolRuntime) -> list[ReplayedCall]:
    """Rebuild every call's presentation from a session log alone.

    Cards come from the tools registered in ``runtime`` now (the presenters are
    pure), resolved as the call's agent sees them (its own variant of a tool, if
    it has one; the global tool otherwise). A call whose result was never logged
    (the host stopped mid-call) has ``result=None``; one cut short while the
    host went on (its cancel scope, ``KeyboardInterrupt``) also has ``unwound``,
    the logged ``{callId, cause, bodyStarted}``. Code Mode sub-calls are
    attached to their outer call as ``dispatches``. ``contract_changed`` says
    whether the tool's parameter or output schema changed since the call was
    recorded (the cards then come from presenters written for the new contract).
    """
    from ._runtime import agent_scope  # local: the runtime module uses the presenters here

    events = session_events(log, "replay")
    out: list[ReplayedCall] = []
    for call in logged_calls(events):
        # The tool as the calling agent saw it (its own variant, if it had one).
        scope = agent_scope(runtime, call.agent)
        durable: ToolResult | None = None
        view: ToolResultView | None = None
        error = None
        contexts: tuple[UserMessage, ...] = ()
        if call.result is not None:
            logged = call.result
            durable = ToolResult(content=call.content, is_error=logged["isError"], meta=logged.get("meta"))
            view = present_result(runtime, call.name, call.arguments, durable, scope)
            error = logged.get("error")
            contexts = structure_contexts(logged.get("contexts"))
        out.append(
            ReplayedCall(
                call_id=call.call_id,
                name=call.name,
                arguments=call.arguments,
                agent=call.agent,
                call_view=present_call(runtime, call.name, call.arguments, scope),
                result=durable,
                result_view=view,
                error=error,
                dispatches=call.dispatches,
                contexts=contexts,
                contract_changed=contract_changed(runtime.get(call.name, scope), call.contract),
                unwound=call.unwound,
            )
        )
    return out


class SessionRecorder:
    """Records model-requested calls and their durable results into a :class:`SessionLog`.

    Register it as a plugin (it observes ``dsh_result``), call :meth:`record_call`
    before executing each model call so the call is durable before it runs, and
    pass :meth:`event_sink` as ``ToolRuntime(event_sink=...)`` for Code Mode's
    dispatch events and every side event (plugins' ``send_event`` included).
    A result's decision trace (``trace_decisions=True``) is written into its
    ``tool/result`` event. A call cut short with no result (``dsh_call_unwound``:
    the host's cancel scope, ``KeyboardInterrupt``) gets a ``tool/unwound`` event
    instead, so a reader can tell it from a call the process never finished.

    Given the ``runtime`` the calls run in, each ``tool/call`` also records the
    :func:`~dsh_core.contract_fingerprint` of the tool the call's agent sees,
    so :func:`replay` can tell a call whose tool has changed since.

    A write the log cannot take (disk full, EIO) raises from the method that
    wrote; but the pipeline only logs a ``dsh_result`` observer (or a
    ``dsh_call_unwound`` listener) that raises,
    so the first such failure is also kept in :attr:`failure`. Call
    :meth:`check` when the session ends: a host that replays the log must
    know it is incomplete.
    """

    failure: BaseException | None = None
    """The first write the log could not take (``OSError`` or :class:`SessionLogError`), or ``None``."""

    def check(self) -> None:
        """Raise :class:`SessionLogError` (caused by :attr:`failure`) if a write failed."""
        failure = self.failure
        if failure is not None:
            raise SessionLogError(
                f"a write failed ({type(failure).__name__}: {failure}); the log is incomplete", path=str(self.log.path)
            ) from failure

    def _failed(self, exc: BaseException) -> None:
        if self.failure is None:
            self.failure = exc

    def __init__(self, log: SessionLog, runtime: ToolRuntime | None = None) -> None:
        from ._runtime import ToolRuntime  # local: the runtime module uses the presenters here

        if not isinstance(log, SessionLog):
            raise TypeError(f"SessionRecorder() records into an open SessionLog(path), got {type(log).__name__}")
        if runtime is not None and not isinstance(runtime, ToolRuntime):
            raise TypeError(
                f"SessionRecorder() takes the ToolRuntime the calls run in or None, got {type(runtime).__name__}"
            )
        self.log = log
        self.runtime = runtime
        # (agent, call id) -> how many recorded calls with that identity have neither a result nor
        # an unwound event yet: what record_unbegun() settles when a turn ends early.
        self._unsettled: dict[tuple[str | None, str], int] = {}

    def _settled(self, agent: str | None, call_id: str) -> None:
        key = (agent, call_id)
        left = self._unsettled.get(key, 0)
        if left > 1:
            self._unsettled[key] = left - 1
        else:
            self._unsettled.pop(key, None)

    def record_unbegun(self, cause: BaseException) -> int:
        """Write ``tool/unwound`` (``bodyStarted: false``) for each recorded call still without an outcome.

        :func:`~dsh_core.run_tool_calls` cut short tells ``dsh_call_unwound``
        only the calls it had begun; a call recorded with :meth:`record_call`
        but never reached has no event at all, and a reader would take it for a
        call the process died running (its effect unknown). Call this where the
        turn's cancellation or interrupt ``cause`` is caught, before re-raising
        it. Returns how many events it wrote; the calls are forgotten either way.
        """
        if not isinstance(cause, BaseException):
            raise TypeError(f"record_unbegun() takes the exception that ended the turn, got {type(cause).__name__}")
        pending, self._unsettled = self._unsettled, {}
        name = _cause_name(cause)
        written = 0
        for (agent, call_id), count in pending.items():
            for _ in range(count):
                try:
                    self.log.append_unwound(call_id, cause=name, body_started=False, agent=agent)
                except (OSError, SessionLogError) as exc:
                    self._failed(exc)
                    raise
                written += 1
        return written

    def record_call(self, request: ToolExecutionInput) -> int:
        arguments: Any = model_arguments(request.arguments)
        if isinstance(arguments, ArgumentsText):
            arguments = arguments.text  # not JSON: the model's text itself is what it sent
        agent = scope_id(request.agent)
        tool = self.runtime.get(request.name, request.agent) if self.runtime is not None else None
        contract = contract_fingerprint(tool) if tool is not None else None
        try:
            try:
                seq = self.log.append_call(request.call_id, request.name, arguments, agent=agent, contract=contract)
            except SessionLogError:
                raise
            except (TypeError, ValueError):
                # The arguments are not JSON (the call will fail INVALID_ARGS): log what can be logged.
                seq = self.log.append_call(request.call_id, request.name, None, agent=agent, contract=contract)
        except (OSError, SessionLogError) as exc:
            self._failed(exc)
            raise
        key = (agent, request.call_id)
        self._unsettled[key] = self._unsettled.get(key, 0) + 1
        return seq

    @hookimpl
    def dsh_result(self, execution: ToolExecution, result: ToolExecutionResult) -> None:
        if execution.parent is not None:
            return
        self._settled(scope_id(execution.agent), execution.call_id)
        error = None
        if result.is_error:
            info = result.error.info
            error = {
                "message": result.error.message,
                "name": info.name if info else "ToolError",
                "code": info.code if info else "",
            }
        trace = trace_of(result)
        try:
            self.log.append_result(
                execution.call_id,
                content=result.content,
                is_error=result.is_error,
                error=error,
                meta=result.meta,
                trace=trace.to_json() if trace is not None else None,
                contexts=result.additional_contexts,
                agent=scope_id(execution.agent),
            )
        except (OSError, SessionLogError) as exc:
            self._failed(exc)
            raise

    @hookimpl
    def dsh_call_unwound(self, execution: ToolExecution, cause: BaseException, body_started: bool) -> None:
        if execution.parent is not None:
            return  # a Code Mode sub-call: its outer call is told too, and it is the one in the log
        self._settled(scope_id(execution.agent), execution.call_id)
        try:
            self.log.append_unwound(
                execution.call_id, cause=_cause_name(cause), body_started=body_started, agent=scope_id(execution.agent)
            )
        except (OSError, SessionLogError) as exc:
            self._failed(exc)
            raise

    def event_sink(self, event_type: str, data: Mapping[str, Any]) -> None:
        """Pass as ``ToolRuntime(event_sink=...)``: every event the runtime or a plugin sends is logged."""
        try:
            self._sink(event_type, data)
        except (OSError, SessionLogError) as exc:
            self._failed(exc)
            raise

    def _sink(self, event_type: str, data: Mapping[str, Any]) -> None:
        if event_type != "tool/code-dispatch-start" and event_type != "tool/code-dispatch":
            # Side records as sent: a worker thread that outlived its call (or has now returned),
            # a retried attempt, an undone call, a plugin's own runtime.send_event(...).
            self.log.append({"type": event_type, "data": data})
            return
        ids = (data["root_call_id"], data["parent_call_id"], data["sub_call_id"], data["name"])
        arguments = thaw(data["arguments"])
        agent = data.get("agent", UNSET)  # a host sending dispatch events of its own may leave it out
        if event_type == "tool/code-dispatch-start":
            self.log.append_dispatch_start(*ids, arguments, agent=agent)
        else:
            self.log.append_dispatch(*ids, arguments, content=data["content"], is_error=data["is_error"], agent=agent)


def _cause_name(cause: BaseException) -> str:
    """What cut a call short, by name; a task group's exceptions joined (``"Cancelled|KeyboardInterrupt"``)."""
    if isinstance(cause, BaseExceptionGroup):
        return "|".join(sorted({_cause_name(inner) for inner in cause.exceptions}))
    return type(cause).__name__
