"""The execute pipeline: one call from input to frozen, observed result.

Stages, in order (each failure path noted where it leaves the pipeline):

1. snapshot + freeze the arguments (non-JSON: final ``INVALID_ARGS``)
2. cancellation before anything ran (final ``ABORTED_BEFORE_DISPATCH``)
3. visibility and the Code Mode collapse (final ``UNKNOWN_TOOL``)
4. argument validation against the tool's schema (final ``INVALID_ARGS``)
5. ``dsh_pre_execute`` waterfall, approval for ``Ask``, guards
6. ``dsh_execute`` wrappers around the body, output contract
7. ``dsh_post_execute`` waterfall
8. ``finalize_content`` (exactly once, for every outcome), then ``dsh_result``

Stages 5-7 run inside one trio cancel scope linked to the caller's signal, so
firing the signal interrupts whatever is running (a listener, the approval
prompt, the body) at its next checkpoint; the scope is only left once that
work has unwound, so nothing is abandoned. What the cancellation interrupted
decides the code: before the body ran, ``ABORTED_BEFORE_DISPATCH``; after, a
success becomes ``ABORTED`` while any more specific failure stays.
"""

from __future__ import annotations

import inspect
import logging
import types
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ._content import UserMessage, as_content, text_of
from ._decisions import POST_DECISION_TYPES, PRE_DECISION_TYPES, UNSET, Accept, Allow, Ask, Block, Deny
from ._definition import ToolDefinition
from ._errors import ErrorCode, NonJsonValueError, PolicyError, ToolArgsError, ToolNotFoundError, ToolOutputError
from ._execution import (
    ToolDispatchExecution,
    ToolExecution,
    ToolExecutionInput,
    ToolExecutionToken,
    ToolRunContext,
)
from ._json import JsonValue, safe_repr, snapshot_json
from ._registry import RUN_CODE_NAME
from ._results import (
    ToolExecutionFailure,
    ToolExecutionResult,
    ToolExecutionSuccess,
    error_message,
    failure_from_exception,
    failure_result,
)
from ._signal import CancelSignal
from ._trace import TraceRecorder
from ._waterfall import CallHooks, Chain, Listener, is_fatal

if TYPE_CHECKING:
    from ._runtime import ToolRuntime

__all__ = ["PreparedCall", "dispatch", "execute", "finalize", "prepare"]

logger = logging.getLogger("dsh_core")

ABORTED_MESSAGE = "tool call aborted"
ABORTED_BEFORE_DISPATCH_MESSAGE = "tool call aborted before dispatch"
APPROVAL_OUTCOMES = ("allowed-once", "denied", "cancelled", "unavailable")


def aborted_result(*, body_invoked: bool, contexts: tuple[UserMessage, ...] = ()) -> ToolExecutionFailure:
    if body_invoked:
        return failure_result(ABORTED_MESSAGE, ErrorCode.ABORTED, additional_contexts=contexts)
    return failure_result(
        ABORTED_BEFORE_DISPATCH_MESSAGE, ErrorCode.ABORTED_BEFORE_DISPATCH, additional_contexts=contexts
    )


def _unknown_tool(name: str, route: str | None = None) -> ToolExecutionFailure:
    error = ToolNotFoundError(name, route)
    return failure_result(error.message, ErrorCode.UNKNOWN_TOOL, name="ToolNotFoundError")


def _code_only_route(name: str) -> str:
    return (
        f"only `{RUN_CODE_NAME}` is callable directly — call `{name}` from inside a `{RUN_CODE_NAME}` program instead"
    )


class _CallState:
    """What the pipeline knows about one call while it runs (for cancellation outcomes)."""

    __slots__ = ("body_invoked", "deferred", "hooks", "latest", "run", "trace")

    def __init__(self, hooks: CallHooks) -> None:
        self.hooks = hooks
        self.body_invoked = False
        self.deferred: list[UserMessage] = []
        self.latest: ToolExecutionResult | None = None
        self.run: ToolRunContext | None = None
        self.trace: TraceRecorder | None = None


def _kind(outcome: object) -> str:
    """Describe a wrong return value; bounded, so a hostile or very deep value cannot break it."""
    return safe_repr(outcome)


def _check_pre(outcome: object) -> str | None:
    if isinstance(outcome, PRE_DECISION_TYPES):
        return None
    return f"dsh_pre_execute must return Allow(), Deny(reason) or Ask(), got {_kind(outcome)}"


def _check_post(outcome: object) -> str | None:
    if isinstance(outcome, POST_DECISION_TYPES):
        return None
    return f"dsh_post_execute must return Accept(...) or Block(...), got {_kind(outcome)}"


def _check_result(outcome: object) -> str | None:
    if isinstance(outcome, (ToolExecutionSuccess, ToolExecutionFailure)):
        return None
    return f"dsh_execute must return a ToolExecutionResult, got {_kind(outcome)}"


_ALLOW = Allow()
_ACCEPT = Accept()


async def _allow() -> Allow:
    return _ALLOW


async def _accept() -> Accept:
    return _ACCEPT


def _listener_failure(exc: BaseException, chain: Chain | None) -> ToolExecutionFailure:
    plugin = chain.blame_for(exc) if chain is not None else None
    return failure_from_exception(exc, default_code=ErrorCode.POLICY_ERROR, plugin=plugin)


class PreparedCall:
    """One call between stages: what ran, what runs next, and what finishes it.

    ``step`` is ``"dispatch"`` (run the wrappers and the body next), ``"post"``
    (``result`` goes to post-execute next) or ``"final"`` (``result`` only needs
    finishing).
    """

    __slots__ = ("execution", "finalizer", "hooks", "result", "state", "step", "tool")

    def __init__(self, execution: ToolExecution, finalizer: Any, hooks: CallHooks) -> None:
        self.execution = execution
        self.finalizer = finalizer
        self.hooks = hooks
        self.tool: ToolDefinition | None = None
        self.state = _CallState(hooks)
        self.step = "final"
        self.result: ToolExecutionResult | None = None

    def _settle(self, step: str, result: ToolExecutionResult | None) -> PreparedCall:
        self.step = step
        self.result = result
        return self


def begin(runtime: ToolRuntime, request: ToolExecutionInput) -> PreparedCall:
    """Stages 1-4: everything that needs no await. Reads each input field once."""
    call_id = request.call_id
    name = request.name
    agent = request.agent
    parent = request.parent
    signal = request.signal
    root_call_id = request.root_call_id or call_id
    token = ToolExecutionToken()

    view = runtime._registry.view(agent)
    visible = view.tools.get(name)
    collapsed = visible is not None and parent is None and view.mode == "code" and name != RUN_CODE_NAME
    # The finalizer is captured before anything else can run, so a later
    # unregistration cannot change which callback finalises this call.
    finalizer = visible.finalize_content if visible is not None else None

    try:
        arguments = snapshot_json(request.arguments)
    except BaseException as exc:
        if is_fatal(exc):
            raise
        execution = ToolExecution(
            call_id=call_id, root_call_id=root_call_id, name=name, arguments=None,
            signal=signal, token=token, agent=agent, parent=parent,
        )  # fmt: skip
        if isinstance(exc, NonJsonValueError):
            failure = failure_result(
                f"tool execution arguments must be losslessly JSON-serializable: {exc}",
                ErrorCode.INVALID_ARGS,
                name="NonJsonValueError",
            )
        else:
            failure = failure_from_exception(exc, default_code=ErrorCode.INVALID_ARGS)
        return PreparedCall(execution, finalizer, runtime._chains.for_call(agent))._settle("final", failure)

    execution = ToolExecution(
        call_id=call_id, root_call_id=root_call_id, name=name, arguments=arguments,
        signal=signal, token=token, agent=agent, parent=parent,
    )  # fmt: skip
    call = PreparedCall(execution, finalizer, runtime._chains.for_call(agent))
    if collapsed:
        if signal.cancelled:
            return call._settle("final", aborted_result(body_invoked=False))
        call.finalizer = None
        return call._settle("final", _unknown_tool(name, _code_only_route(name)))
    if signal.cancelled:
        return call._settle("final", aborted_result(body_invoked=False))
    if visible is None:
        return call._settle("final", _unknown_tool(name))

    violations = runtime._contract(visible).validate_args(arguments)
    if violations:
        error = ToolArgsError(violations)
        failure = failure_result(error.message, ErrorCode.INVALID_ARGS, name="ToolArgsError")
        return call._settle("final", failure)
    call.tool = visible
    call.state.trace = TraceRecorder() if runtime.trace_decisions else None
    return call._settle("policy", None)


async def execute(runtime: ToolRuntime, request: ToolExecutionInput) -> ToolExecutionResult:
    """Run one call through the whole pipeline; see the module docstring for the stages."""
    call = begin(runtime, request)
    if call.step != "final":
        if _cannot_suspend(runtime, call):
            # Nothing in these stages can reach a checkpoint, so there is nothing a
            # cancel scope could interrupt: skip its per-call cost.
            await _policy_stage(runtime, call)
            if call.step == "dispatch":
                await _dispatch_stage(runtime, call)
            if call.step == "post":
                await _post_stage(runtime, call)
            return await finish(runtime, call)
        # One cancel scope for every stage that can suspend.
        with trio.CancelScope() as scope:
            unlink = call.execution.signal.link(scope)
            try:
                await _policy_stage(runtime, call)
                if call.step == "dispatch":
                    await _dispatch_stage(runtime, call)
                if call.step == "post":
                    await _post_stage(runtime, call)
            finally:
                unlink()
        if scope.cancelled_caught:
            _resolve_cancelled(call)
    return await finish(runtime, call)


def _cannot_suspend(runtime: ToolRuntime, call: PreparedCall) -> bool:
    """An inline tool and no waterfall listener: every stage runs without awaiting anything."""
    tool = call.tool
    return tool is not None and tool.inline and call.hooks.waterfalls_empty


def _resolve_cancelled(call: PreparedCall) -> None:
    """The caller's signal interrupted a stage: keep a specific failure, else abort."""
    state = call.state
    latest = state.latest
    if latest is None or not latest.is_error:
        contexts = tuple(state.deferred) + (latest.additional_contexts if latest is not None else ())
        call._settle("final", aborted_result(body_invoked=state.body_invoked, contexts=_dedupe(contexts)))
    else:
        call._settle("final", latest)


async def _scoped_stage(runtime: ToolRuntime, call: PreparedCall, stage: Any) -> None:
    with trio.CancelScope() as scope:
        unlink = call.execution.signal.link(scope)
        try:
            await stage(runtime, call)
        finally:
            unlink()
    if scope.cancelled_caught:
        _resolve_cancelled(call)


async def prepare(runtime: ToolRuntime, request: ToolExecutionInput) -> PreparedCall:
    """Stages 1-5 for a scheduler: policy runs here, in the caller's order."""
    call = begin(runtime, request)
    if call.step == "policy":
        await _scoped_stage(runtime, call, _policy_stage)
    return call


async def dispatch(runtime: ToolRuntime, call: PreparedCall) -> None:
    """Stage 6 for a scheduler (the only stage that may overlap with other calls)."""
    if call.step == "dispatch":
        await _scoped_stage(runtime, call, _dispatch_stage)


async def finalize(runtime: ToolRuntime, call: PreparedCall) -> ToolExecutionResult:
    """Stages 7-8 for a scheduler, in the caller's order."""
    if call.step == "post":
        await _scoped_stage(runtime, call, _post_stage)
    return await finish(runtime, call)


def _dedupe(contexts: tuple[UserMessage, ...]) -> tuple[UserMessage, ...]:
    seen: set[int] = set()
    out: list[UserMessage] = []
    for context in contexts:
        if id(context) not in seen:
            seen.add(id(context))
            out.append(context)
    return tuple(out)


async def _policy_stage(runtime: ToolRuntime, call: PreparedCall) -> None:
    execution = call.execution
    tool = call.tool
    assert tool is not None
    state = call.state
    signal = execution.signal
    agent = execution.agent

    decision: object = _ALLOW
    decider: str | None = None
    listeners = call.hooks.pre
    if listeners:
        chain = Chain(listeners, (execution,), _allow, _check_pre)
        if state.trace is not None:
            chain.trace = state.trace.chain("pre", _ALLOW)
        try:
            decision = await chain.run()
        except BaseException as exc:
            if is_fatal(exc):
                raise
            call._settle("final", _final(state, _listener_failure(exc, chain)))
            return
        decider = chain.decider

    approval_cancelled = False
    if isinstance(decision, Ask):
        if state.trace is not None:
            state.trace.enter("approval")
        try:
            decision, approval_cancelled = await _resolve_ask(runtime, execution, decision)
        except BaseException as exc:
            if is_fatal(exc):
                raise
            failure = failure_from_exception(exc, default_code=ErrorCode.POLICY_ERROR, plugin="approval")
            call._settle("final", _final(state, failure))
            return
        decider = "approval"
        if state.trace is not None:
            state.trace.add("approval", "approval", decision)

    if approval_cancelled and signal.cancelled:
        call._settle("post", _latest(state, aborted_result(body_invoked=False)))
        return

    if isinstance(decision, Deny):
        denial = failure_result(decision.reason, ErrorCode.DENIED, name="PolicyDenial", plugin=decider)
        call._settle("post", _latest(state, denial))
        return
    if state.trace is not None:
        state.trace.enter("guard")
    for guard in runtime._registry.view(agent).guards:
        label = getattr(guard, "label", None)
        try:
            reason = guard(execution)
        except BaseException as exc:
            if is_fatal(exc):
                raise
            failure = failure_from_exception(exc, default_code=ErrorCode.POLICY_ERROR, plugin=label)
            call._settle("final", _final(state, failure))
            return
        if state.trace is not None:
            state.trace.add("guard", label or guard, reason)
        if reason is None:
            continue
        if type(reason) is not str or not reason:
            problem = failure_result(
                f"guard {label} must return None or a non-empty reason string, got {reason!r}",
                ErrorCode.POLICY_ERROR,
                name="PolicyError",
                plugin=label,
            )
            call._settle("final", _final(state, problem))
            return
        denial = failure_result(reason, ErrorCode.DENIED, name="GuardDenial", plugin=label)
        call._settle("post", _latest(state, denial))
        return
    if signal.cancelled:
        call._settle("post", _latest(state, aborted_result(body_invoked=False)))
        return
    call._settle("dispatch", None)


def _latest(state: _CallState, result: ToolExecutionResult) -> ToolExecutionResult:
    state.latest = result
    return result


async def _dispatch_stage(runtime: ToolRuntime, call: PreparedCall) -> None:
    tool = call.tool
    assert tool is not None
    execution = call.execution
    state = call.state
    dispatched = await _dispatch(runtime, execution, tool, state)
    if dispatched is None:
        call._settle("final", state.latest)
        return
    if execution.signal.cancelled and not dispatched.is_error:
        dispatched = aborted_result(body_invoked=state.body_invoked, contexts=dispatched.additional_contexts)
    call._settle("post", _latest(state, dispatched))


async def _post_stage(runtime: ToolRuntime, call: PreparedCall) -> None:
    tool = call.tool
    assert tool is not None and call.result is not None
    result = await _post_execute(runtime, call.execution, tool, call.result, call.state)
    call._settle("final", result)


def _final(state: _CallState, result: ToolExecutionResult) -> ToolExecutionResult:
    """A failure that bypasses post-execute; deferred contexts still ride it."""
    if state.deferred and isinstance(result, ToolExecutionFailure):
        result = attrs.evolve(result, additional_contexts=_dedupe(tuple(state.deferred) + result.additional_contexts))
    if state.trace is not None and isinstance(result, ToolExecutionFailure):
        state.trace.fail(result)
    state.latest = result
    return result


async def _resolve_ask(runtime: ToolRuntime, execution: ToolExecution, ask: Ask) -> tuple[Allow | Deny, bool]:
    service = runtime.approval
    name = execution.name
    if service is None:
        return Deny(ask.reason or f'tool "{name}" requires approval, but no approval service is configured'), False
    if execution.agent is None:
        return Deny(f'tool "{name}" requires approval, but the call has no agent to route it through'), False
    answer = await service.request(execution, ask.reason)
    if answer == "allowed-once":
        return _ALLOW, False
    if answer == "denied":
        return Deny(f'the user denied tool "{name}"'), False
    if answer == "cancelled":
        return Deny(f'approval for tool "{name}" was cancelled'), True
    if answer == "unavailable":
        return Deny(f'tool "{name}" requires approval, but no approval channel is available'), False
    raise _approval_error(answer)


def _approval_error(answer: object) -> Exception:
    return PolicyError(
        f"approval service returned {safe_repr(answer)}; expected one of {', '.join(APPROVAL_OUTCOMES)}"
    )


async def _dispatch(
    runtime: ToolRuntime, execution: ToolExecution, tool: ToolDefinition, state: _CallState
) -> ToolExecutionResult | None:
    """Run the wrappers and the body. ``None`` means a final failure is in ``state.latest``."""
    listeners = state.hooks.execute
    if not listeners:
        result = await _dispatch_body(runtime, execution, execution.signal, state)
        if state.trace is not None:
            state.trace.add("execute", execution.name, result)
        state.latest = result
        return _with_deferred(result, state)

    view = ToolDispatchExecution(execution)

    async def base() -> ToolExecutionResult:
        outcome = await _dispatch_body(runtime, execution, view.signal, state)
        if state.trace is not None:
            state.trace.add("execute", execution.name, outcome)
        state.latest = outcome
        return outcome

    chain = Chain(listeners, (view,), base, _check_result)
    if state.trace is not None:
        chain.trace = state.trace.chain("execute", None)
    try:
        result = await chain.run()
    except BaseException as exc:
        if is_fatal(exc):
            raise
        _final(state, _listener_failure(exc, chain))
        return None
    if isinstance(result, ToolExecutionSuccess) and result is not state.latest:
        # A wrapper-authored success: its value goes through the tool's contract again.
        live = runtime._registry.view(execution.agent).tools.get(execution.name)
        if live is None:
            _final(state, _unknown_tool(execution.name))
            return None
        rebuilt = _build_success(runtime, live, execution, result.value, state.run)
        if rebuilt.is_error:
            _final(state, rebuilt)
            return None
        result = attrs.evolve(rebuilt, additional_contexts=result.additional_contexts)
    state.latest = result
    return _with_deferred(result, state)


def _with_deferred(result: ToolExecutionResult, state: _CallState) -> ToolExecutionResult:
    if state.deferred:
        return attrs.evolve(result, additional_contexts=tuple(state.deferred) + result.additional_contexts)
    return result


async def _dispatch_body(
    runtime: ToolRuntime, execution: ToolExecution, current: CancelSignal, state: _CallState
) -> ToolExecutionResult:
    caller = execution.signal
    fused = caller if current is caller else CancelSignal.any(caller, current)
    if fused.cancelled:
        return aborted_result(body_invoked=False)
    view = runtime._registry.view(execution.agent)
    tool = view.tools.get(execution.name)
    if tool is None or (
        execution.parent is None and view.mode == "code" and execution.name != RUN_CODE_NAME
    ):
        return _unknown_tool(execution.name)
    run = ToolRunContext(execution, fused, state.deferred)
    state.run = run
    state.body_invoked = True
    try:
        if fused is caller:
            value = await tool.execute(execution.arguments, run)
        else:
            # A wrapper installed its own signal (a deadline, say): interrupt the
            # body when that fires too, not only when the caller's does.
            with trio.CancelScope() as body_scope:
                unlink = fused.link(body_scope)
                try:
                    value = await tool.execute(execution.arguments, run)
                finally:
                    unlink()
            if body_scope.cancelled_caught:
                return aborted_result(body_invoked=True)
    except BaseException as exc:
        if is_fatal(exc):
            raise
        return failure_from_exception(exc, default_code=ErrorCode.TOOL_ERROR)
    result = _build_success(runtime, tool, execution, value, run)
    if fused.cancelled and not result.is_error:
        return aborted_result(body_invoked=True)
    return result


def _build_success(
    runtime: ToolRuntime,
    tool: ToolDefinition,
    execution: ToolExecution,
    candidate: object,
    run: ToolRunContext | None,
) -> ToolExecutionResult:
    """Snapshot, validate, render and project a value into a success (or an output failure)."""
    name = tool.name
    try:
        value = snapshot_json(candidate)
    except NonJsonValueError as exc:
        return _output_failure(name, [f"value is not lossless JSON: {exc}"])
    violations = runtime._contract(tool).validate_output(value)
    if violations:
        return _output_failure(name, violations)
    args = execution.arguments
    try:
        content = as_content(tool.output.render(args, value), what="output.render result")
    except BaseException as exc:
        if is_fatal(exc):
            raise
        return _output_failure(name, [f"output.render failed: {error_message(exc)}"])
    meta: JsonValue = None
    projector = tool.output.presentation_meta
    if projector is not None and execution.parent is None:
        try:
            meta = snapshot_json(projector(args, value))
        except NonJsonValueError as exc:
            return _output_failure(name, [f"output.presentation_meta returned non-lossless JSON: {exc}"])
        except BaseException as exc:
            if is_fatal(exc):
                raise
            return _output_failure(name, [f"output.presentation_meta failed: {error_message(exc)}"])
    return ToolExecutionSuccess(
        value=value, content=content, meta=meta, concludes_turn=run is not None and run.concluded
    )


def _output_failure(name: str, violations: Sequence[str]) -> ToolExecutionFailure:
    error = ToolOutputError(name, violations)
    return failure_result(error.message, ErrorCode.INVALID_TOOL_OUTPUT, name="ToolOutputError")


async def _post_execute(
    runtime: ToolRuntime,
    execution: ToolExecution,
    tool: ToolDefinition,
    result: ToolExecutionResult,
    state: _CallState,
) -> ToolExecutionResult:
    state.latest = result
    listeners = state.hooks.post
    if not listeners:
        return _after_post(execution, result, state)

    async def base() -> Accept:
        return _ACCEPT

    chain = Chain(listeners, (execution, result), base, _check_post)
    if state.trace is not None:
        chain.trace = state.trace.chain("post", _ACCEPT)
    try:
        decision = await chain.run()
    except BaseException as exc:
        if is_fatal(exc):
            raise
        return _final(state, _listener_failure(exc, chain))
    applied = _apply_post(runtime, execution, result, decision, chain.decider, state)
    state.latest = applied
    return _after_post(execution, applied, state)


def _after_post(execution: ToolExecution, result: ToolExecutionResult, state: _CallState) -> ToolExecutionResult:
    if execution.signal.cancelled and not result.is_error:
        return aborted_result(body_invoked=state.body_invoked, contexts=result.additional_contexts)
    return result


def _apply_post(
    runtime: ToolRuntime,
    execution: ToolExecution,
    result: ToolExecutionResult,
    decision: Accept | Block,
    decider: str | None,
    state: _CallState,
) -> ToolExecutionResult:
    if isinstance(decision, Block):
        message = text_of(decision.feedback) or "tool result blocked by post-execute policy"
        return ToolExecutionFailure(
            error=failure_result(message, ErrorCode.DENIED, name="PostExecuteBlock", plugin=decider).error,
            content=decision.feedback,
            additional_contexts=decision.additional_contexts,
        )
    contexts = result.additional_contexts + decision.additional_contexts
    if decision.value is not UNSET:
        if result.is_error:
            return failure_result(
                "dsh_post_execute cannot replace the value of a failed result",
                ErrorCode.POLICY_ERROR,
                name="PolicyError",
                plugin=decider,
            )
        live = runtime._registry.view(execution.agent).tools.get(execution.name)
        if live is None:
            return _unknown_tool(execution.name)
        rebuilt = _build_success(runtime, live, execution, decision.value, state.run)
        return attrs.evolve(rebuilt, additional_contexts=contexts)
    if decision.content is not None:
        return attrs.evolve(result, content=decision.content, additional_contexts=contexts)
    if decision.additional_contexts:
        return attrs.evolve(result, additional_contexts=contexts)
    return result


async def finish(runtime: ToolRuntime, call: PreparedCall) -> ToolExecutionResult:
    """Stage 8: ``finalize_content`` exactly once, then ``dsh_result`` observers."""
    assert call.result is not None
    execution = call.execution
    result = call.result
    finalizer = call.finalizer
    trace = call.state.trace
    if finalizer is not None:
        try:
            replacement = finalizer(execution, result)
            if replacement is not None:
                result = attrs.evolve(result, content=as_content(replacement, what="finalize_content result"))
        except BaseException as exc:
            if is_fatal(exc):
                raise
            result = failure_result(
                f"finalize_content violated its total contract: {error_message(exc)}",
                ErrorCode.TOOL_ERROR,
                name=type(exc).__name__,
            )
        if trace is not None:
            trace.add("finalize", "finalize_content", (call.result, result))
    if trace is not None:
        result = trace.attach(result)
    await _notify(call.hooks.result, execution, result)
    return result


async def _notify(observers: tuple[Listener, ...], execution: ToolExecution, result: ToolExecutionResult) -> None:
    for listener in observers:
        try:
            outcome = listener.call((execution, result))
            if outcome is not None and (type(outcome) is types.CoroutineType or inspect.isawaitable(outcome)):
                # An async observer must not hold the result back once the caller gave up.
                with trio.CancelScope() as scope:
                    unlink = execution.signal.link(scope)
                    try:
                        await outcome
                    finally:
                        unlink()
                if scope.cancelled_caught:
                    logger.warning(
                        'tool "%s" (%s): dsh_result observer %s was cancelled with the call',
                        execution.name, execution.call_id, listener.plugin_name,
                    )  # fmt: skip
        except BaseException as exc:
            if is_fatal(exc):
                raise
            logger.warning(
                'tool "%s" (%s): dsh_result observer %s failed: %s',
                execution.name,
                execution.call_id,
                listener.plugin_name,
                error_message(exc),
            )
