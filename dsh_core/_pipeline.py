"""The execute pipeline: one call from input to frozen, observed result.

Stages, in order (each failure path noted where it leaves the pipeline):

1. snapshot + freeze the arguments (non-JSON: final ``INVALID_ARGS``)
2. cancellation before anything ran (final ``ABORTED_BEFORE_DISPATCH``)
3. visibility and the Code Mode collapse (final ``UNKNOWN_TOOL``)
4. argument validation against the tool's schema, and structuring for a tool
   whose parameters are a class (final ``INVALID_ARGS``)
5. ``dsh_pre_execute`` waterfall, approval for ``Ask``, guards
6. ``dsh_execute`` wrappers around the body, output contract
7. ``dsh_post_execute`` waterfall
8. ``finalize_content`` (exactly once, for every outcome), then ``dsh_result``

A call that leaves instead with an exception (a cancellation of a scope outside
it, an interpreter exit) has no result: :func:`unwound` tells the
``dsh_call_unwound`` listeners, once, wherever it was cut (:func:`execute`,
and the stage functions a scheduler drives, each on its own way out; the
scheduler for the calls it holds between them).

Stages 5-7 run inside one trio cancel scope linked to the caller's signal, so
firing the signal interrupts whatever is running (a listener, the approval
prompt, the body) at its next checkpoint; the scope is only left once that
work has unwound, so nothing is abandoned. What the cancellation interrupted
decides the code: before the body ran, ``ABORTED_BEFORE_DISPATCH``; after, a
success becomes ``ABORTED`` while any more specific failure stays.

The scope is entered only for a call in which something can suspend: a body
that can (see :mod:`dsh_core._suspension`), or a listener that can other than
by awaiting ``next()``. Entering one costs more than a whole call of a body
that cannot suspend, and in such a call nothing could be interrupted anyway:
the signal is still checked after every stage, exactly as with the scope. An
approval prompt, the one thing the pipeline itself awaits, then gets a scope of
its own, and so does each ``dsh_result`` observer that can suspend.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import attrs
import trio

from ._arguments_text import ArgumentsText
from ._content import TextBlock, UserMessage, as_content, text_of
from ._decisions import (
    APPROVAL_ANSWERS,
    MAX_REWRITES,
    POST_DECISION_TYPES,
    PRE_DECISION_TYPES,
    UNSET,
    Accept,
    Allow,
    Ask,
    Block,
    Deny,
    Rewrite,
)
from ._definition import ToolContract, ToolDefinition, contract_of, default_block, default_render
from ._errors import (
    QUOTED_CHARS,
    DshError,
    ErrorCode,
    NonJsonValueError,
    PolicyError,
    ToolArgsError,
    ToolNotFoundError,
    ToolOutputError,
    elide_middle,
)
from ._events import send_event
from ._execution import (
    Exclusive,
    Parallel,
    ScopeKey,
    ToolExecution,
    ToolExecutionInput,
    ToolExecutionToken,
    ToolRunContext,
    dispatch_view,
    input_of,
    new_execution,
    note_body,
    scope_id,
)
from ._json import JsonValue, json_equal, json_text, safe_repr, snapshot_json
from ._registry import RUN_CODE_NAME, Registry, ToolGuard
from ._resources import ResourceClaim, admits, classify_call
from ._results import (
    ToolExecutionFailure,
    ToolExecutionResult,
    ToolExecutionSuccess,
    error_message,
    failure_from_exception,
    failure_result,
    new_success,
    sole_exception,
)
from ._retry import AttemptTimedOut, RetryAttempt, RetryPolicy
from ._signal import CancelSignal
from ._trace import TraceRecorder
from ._waterfall import INTERRUPTED, CallHooks, Chain, Listener, is_fatal, lone_exit, split_fatal

if TYPE_CHECKING:
    from ._runtime import ToolRuntime

__all__ = ["PreparedCall", "dispatch", "execute", "finalize", "prepare", "settles_inline", "unwound"]

logger = logging.getLogger("dsh_core")

ABORTED_MESSAGE = "tool call aborted"
ABORTED_BEFORE_DISPATCH_MESSAGE = "tool call aborted before dispatch"


def aborted_result(*, body_invoked: bool, contexts: tuple[UserMessage, ...] = ()) -> ToolExecutionFailure:
    if body_invoked:
        return failure_result(ABORTED_MESSAGE, ErrorCode.ABORTED, additional_contexts=contexts)
    return failure_result(
        ABORTED_BEFORE_DISPATCH_MESSAGE, ErrorCode.ABORTED_BEFORE_DISPATCH, additional_contexts=contexts
    )


def _unknown_tool(name: str, route: str | None = None) -> ToolExecutionFailure:
    error = ToolNotFoundError(name, route)
    return failure_result(error.message, ErrorCode.UNKNOWN_TOOL, name="ToolNotFoundError")


def _replaced_tool(name: str, now: ResourceClaim | Parallel | Exclusive) -> ToolExecutionFailure:
    # Running it would break the schedule the calls beside it were started under: a replacement
    # that must run alone, or that touches keys no earlier call was ordered against.
    needs = "must run alone" if isinstance(now, Exclusive) else "declares other resource keys"
    return failure_result(
        f'tool "{elide_middle(name, QUOTED_CHARS)}" was replaced while this call waited to run, and the new tool {needs}; '
        "the call was not run: make it again",
        ErrorCode.TOOL_ERROR,
        name="ToolReplacedError",
    )


def _code_only_route(name: str) -> str:
    return (
        f"only `{RUN_CODE_NAME}` is callable directly — call `{name}` from inside a `{RUN_CODE_NAME}` program instead"
    )


def _kind(outcome: object) -> str:
    """Describe a wrong return value; bounded, so a hostile or very deep value cannot break it."""
    return safe_repr(outcome)


def _check_pre(outcome: object) -> str | None:
    if isinstance(outcome, PRE_DECISION_TYPES):
        return None
    return f"dsh_pre_execute must return Allow(), Deny(reason), Ask() or Rewrite(arguments, reason), got {_kind(outcome)}"


def _rewrites_nothing(outcome: object, execution: ToolExecution) -> Allow | None:
    # A normaliser settles by rewriting to what the call already has: its Rewrite then
    # stands for the decision of the layers inside it (see Chain), an Allow only on its own.
    if type(outcome) is Rewrite and json_equal(outcome.arguments, execution.arguments):
        return Allow()
    return None


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


class PreparedCall:
    """One call between stages: what ran, what runs next, and what finishes it.

    ``step`` is ``"policy"`` (stage 5 next), ``"dispatch"`` (run the wrappers
    and the body next), ``"post"`` (``result`` goes to post-execute next) or
    ``"final"`` (``result`` only needs finishing); then ``"ended"`` (published,
    or told unwound), or ``"publishing"`` while it unwinds out of its observers.
    ``latest`` is the most recent result, which a cancellation keeps when it is
    a failure; ``scoped`` says whether the running stage is inside a cancel
    scope linked to the signal.
    """

    __slots__ = (
        "admitted", "body_error", "body_invoked", "contract", "deferred", "execution", "finalizer", "hooks", "latest",
        "published_to", "registry_version", "result", "rewrites", "run", "scoped", "step", "structured",
        "superseded", "suspends", "tool", "trace",
    )  # fmt: skip

    def __init__(self, execution: ToolExecution, finalizer: Any, hooks: CallHooks) -> None:
        self.execution = execution
        self.finalizer = finalizer
        self.hooks = hooks
        self.tool: ToolDefinition | None = None
        self.contract: ToolContract | None = None
        self.registry_version = -1
        # What a scheduler let this call overlap as (its keys, or parallel); None: it runs alone.
        self.admitted: ResourceClaim | Parallel | None = None
        self.step = "final"
        self.result: ToolExecutionResult | None = None
        self.latest: ToolExecutionResult | None = None
        self.body_invoked = False
        self.deferred: list[UserMessage] | None = None
        self.run: ToolRunContext | None = None
        self.trace: TraceRecorder | None = None
        self.suspends = False
        self.scoped = False
        # What each Rewrite changed, told to the model on the result; None: never rewritten.
        self.rewrites: list[UserMessage] | None = None
        # body_error (set only when a body raises, so a call that never fails never pays for it):
        # the exception (the one inside a nursery's group of one), for a RetryPolicy to judge.
        self.body_error: BaseException | None
        # superseded (set only then): the body's success that cancellation replaced with
        # ABORTED, which dsh_execute wrappers see as execution.body_result.
        self.superseded: ToolExecutionSuccess
        # published_to (set only when a cancellation cuts the dsh_result observers): the
        # plugins whose observer had the result, which are not told the call unwound.
        self.published_to: frozenset[str]
        # structured (set only for a tool that structures its arguments, until its body takes it):
        # the instance made from the call's current arguments, so the body does not make another.
        self.structured: object

    @property
    def dispatch_suspends(self) -> bool:
        """Whether the wrappers or the body of this call can suspend (no tool resolved: assume so)."""
        contract = self.contract
        return self.hooks.execute_suspends or contract is None or contract.body_suspends

    def _settle(self, step: str, result: ToolExecutionResult | None) -> PreparedCall:
        self.step = step
        self.result = result
        return self


def begin(runtime: ToolRuntime, request: ToolExecutionInput) -> PreparedCall:
    """Stages 1-4: everything that needs no await. Reads each input field once.

    The call comes back at ``"policy"``, or at ``"dispatch"`` when stage 5 has
    nothing to run (no pre-execute listener, no guard, no trace to record).
    """
    if type(request) is not ToolExecutionInput and not isinstance(request, ToolExecutionInput):
        raise TypeError(f"execute() takes a ToolExecutionInput, got {type(request).__name__}")
    orphans = runtime._orphans
    if orphans._running:
        # A thread an earlier run orphaned announces its finish in this run, the one now using the sink.
        orphans.note_run()
    call_id = request.call_id
    name = request.name
    agent = request.agent
    parent = request.parent
    signal = request.signal
    root_call_id = request.root_call_id or call_id

    registry = runtime._registry
    view = registry.view(agent)
    visible = view.tools.get(name)
    collapsed = visible is not None and parent is None and view.mode == "code" and name != RUN_CODE_NAME
    # The finalizer is captured before anything else can run, so a later
    # unregistration cannot change which callback finalises this call.
    finalizer = visible.finalize_content if visible is not None else None
    hooks = runtime._chains.for_call(agent)

    # A flat call the compiled contract plainly accepts is checked and frozen in one pass.
    contract = visible._contract if visible is not None else None
    reader = contract.read_arguments if contract is not None else None
    arguments: JsonValue = reader(request.arguments) if reader is not None else None
    checked = arguments is not None
    try:
        if not checked:
            raw = request.arguments
            # The model's JSON text, for the runtime to parse: a bad text fails INVALID_ARGS below.
            arguments = raw.decode() if type(raw) is ArgumentsText else snapshot_json(raw)
    except BaseException as exc:
        if is_fatal(exc):
            raise
        execution = new_execution(call_id, root_call_id, name, None, signal, ToolExecutionToken(), agent, parent)
        if isinstance(exc, NonJsonValueError):
            failure = failure_result(
                f"tool execution arguments must be losslessly JSON-serializable: {exc}",
                ErrorCode.INVALID_ARGS,
                name="NonJsonValueError",
            )
        else:
            failure = failure_from_exception(exc, default_code=ErrorCode.INVALID_ARGS)
        if collapsed and not signal.cancelled:
            # The model called a code-only tool directly: its finaliser is not this call's.
            finalizer = None
        return PreparedCall(execution, finalizer, hooks)._settle("final", failure)

    execution = new_execution(call_id, root_call_id, name, arguments, signal, ToolExecutionToken(), agent, parent)
    call = PreparedCall(execution, finalizer, hooks)
    try:
        if collapsed:
            if signal.cancelled:
                return call._settle("final", aborted_result(body_invoked=False))
            call.finalizer = None
            return call._settle("final", _unknown_tool(name, _code_only_route(name)))
        if signal.cancelled:
            return call._settle("final", aborted_result(body_invoked=False))
        if visible is None:
            return call._settle("final", _unknown_tool(name))

        if contract is None:
            contract = contract_of(visible)
        if not checked:
            violations = contract.argument_violations(arguments)
            if violations:
                error = ToolArgsError(violations)
                failure = failure_result(error.message, ErrorCode.INVALID_ARGS, name="ToolArgsError")
                return call._settle("final", failure)
            # (A contract that structures has no one-pass reader: its calls all come this way.)
            structure = contract.structure_arguments
            if structure is not None:
                # What the schema cannot say (a dict's value type, an attrs validator) is refused
                # here too, before any policy sees the call.
                try:
                    call.structured = structure(arguments)
                except ToolArgsError as error:
                    failure = failure_result(error.message, ErrorCode.INVALID_ARGS, name="ToolArgsError")
                    return call._settle("final", failure)
        call.tool = visible
        call.contract = contract
        call.registry_version = registry.version
        call.suspends = contract.body_suspends or hooks.pre_suspends or hooks.execute_suspends or hooks.post_suspends
        if runtime.trace_decisions:
            call.trace = TraceRecorder()
            call.step = "policy"
        elif hooks.pre or view.guards:
            call.step = "policy"
        else:
            # Stage 5 has nothing to run: no listener, no guard, and the signal was
            # just checked, with nothing in between that could fire it.
            call.step = "dispatch"
        return call
    except BaseException as exc:
        # Cut with its execution made (a Ctrl-C while large arguments validate): every call
        # that has one hears of its end, even one no hook has seen yet.
        unwound(call, exc)
        raise


async def execute(runtime: ToolRuntime, request: ToolExecutionInput) -> ToolExecutionResult:
    """Run one call through the pipeline and return its frozen result.

    Every failure (unknown tool, invalid arguments, denial, a raising tool or
    listener, cancellation) is a ``ToolExecutionFailure``, never an exception;
    only a cancellation of the caller's own surrounding trio scope propagates,
    after the work this call started has unwound (``dsh_call_unwound`` is told).
    """
    call = begin(runtime, request)
    try:
        if call.step != "final":
            if call.suspends:
                # One cancel scope for every stage that can suspend.
                await _scoped_stage(runtime, call, _stages)
                if call.step == "post":
                    # The signal interrupted the gate or the dispatch.
                    await _scoped_stage(runtime, call, _post_stage)
            elif call.hooks.waterfalls_empty:
                # No listener, nothing that can suspend: the stages inline.
                if call.step == "policy":
                    _decide(runtime, call, _ALLOW, None)  # guards to ask, or a trace to keep
                if call.step == "dispatch":
                    # The body's dispatch looks at the signal after the body and nothing
                    # runs after it, so no later check could see anything new.
                    dispatched = await _dispatch_body(runtime, call, call.execution.signal)
                    if call.trace is not None:
                        call.trace.add("execute", call.execution.name, dispatched)
                    call.step = "final"
                    call.result = _with_deferred(call, dispatched) if call.deferred else dispatched
                else:
                    call.step = "final"  # denied or aborted before dispatch: no post-execute listener to see it
            else:
                # _stages, inline: a coroutine frame fewer on the path every listener takes.
                if call.step == "policy":
                    await _policy_stage(runtime, call)
                if call.step == "dispatch":
                    await _dispatch_stage(runtime, call)
                if call.step == "post":
                    await _post_stage(runtime, call)
        # finish(), without a coroutine of its own: most calls have no observer.
        result = _finished(call)
        observers = call.hooks.result
        if observers:
            await _notify(observers, call, result)
    except BaseException as exc:
        # (Entering a try costs nothing until something raises: the normal path does not pay for this.)
        _unwind(call, exc)
    return result


async def _stages(runtime: ToolRuntime, call: PreparedCall) -> None:
    if call.step == "policy":
        await _policy_stage(runtime, call)
    if call.step == "dispatch":
        await _dispatch_stage(runtime, call)
    if call.step == "post":
        await _post_stage(runtime, call)


def _resolve_cancelled(call: PreparedCall) -> None:
    """The caller's signal interrupted a stage: keep a specific failure, else abort.

    An interrupted gate or dispatch still goes to post-execute, as it does when
    the gate or the body notices the cancellation itself and returns: whether a
    post-execute listener sees an aborted call must not depend on where the
    cancellation happened to land. (Its listeners run under the fired signal,
    so one that awaits is interrupted in turn.)
    """
    latest = call.latest
    if latest is None or not latest.is_error:
        contexts = tuple(call.deferred or ()) + (latest.additional_contexts if latest is not None else ())
        latest = aborted_result(body_invoked=call.body_invoked, contexts=_dedupe(contexts))
    call.latest = latest
    call._settle("post" if call.step in ("policy", "dispatch") else "final", latest)


async def _scoped_stage(
    runtime: ToolRuntime, call: PreparedCall, stage: Callable[[ToolRuntime, PreparedCall], Awaitable[None]]
) -> None:
    call.scoped = True
    with trio.CancelScope() as scope:
        unlink = call.execution.signal.link(scope)
        try:
            await stage(runtime, call)
        finally:
            unlink()
    call.scoped = False
    if scope.cancelled_caught:
        _resolve_cancelled(call)


async def prepare(runtime: ToolRuntime, request: ToolExecutionInput) -> PreparedCall:
    """Stages 1-5 for a scheduler: policy runs here, in the caller's order.

    From its return until :func:`finalize` returns, the call is the
    scheduler's: one it drops as it unwinds must be passed to :func:`unwound`.
    """
    call = begin(runtime, request)
    if call.step == "policy":
        try:
            if call.hooks.pre_suspends:
                await _scoped_stage(runtime, call, _policy_stage)
            else:
                await _policy_stage(runtime, call)
        except BaseException as exc:
            _unwind(call, exc)
    return call


def settles_inline(runtime: ToolRuntime, request: ToolExecutionInput) -> bool:
    """Whether ``request``'s dispatch and commit cannot suspend (a scheduler may then just ``execute`` it).

    Only stage 5 may still suspend (a listener, an approval prompt): a scheduler
    runs that stage in its own loop anyway. Reads what :func:`begin` will read.
    """
    hooks = runtime._chains.for_call(request.agent)
    if hooks.execute_suspends or hooks.finish_suspends:
        return False
    tool = runtime._registry.view(request.agent).tools.get(request.name)
    return tool is None or not contract_of(tool).body_suspends


async def dispatch(runtime: ToolRuntime, call: PreparedCall) -> None:
    """Stage 6 for a scheduler (the only stage that may overlap with other calls)."""
    if call.step == "dispatch":
        if call.execution.signal.cancelled:
            # It fired while the call waited its turn (for a resource key, say): the call
            # ends as it does when it fires by the end of stage 5, before any wrapper runs.
            _abort_before_dispatch(call)
            return
        try:
            if call.dispatch_suspends:
                await _scoped_stage(runtime, call, _dispatch_stage)
            else:
                await _dispatch_stage(runtime, call)
        except BaseException as exc:
            _unwind(call, exc)


async def finalize(runtime: ToolRuntime, call: PreparedCall) -> ToolExecutionResult:
    """Stages 7-8 for a scheduler, in the caller's order."""
    try:
        if call.step == "post":
            if call.hooks.post_suspends:
                await _scoped_stage(runtime, call, _post_stage)
            else:
                await _post_stage(runtime, call)
        return await finish(runtime, call)
    except BaseException as exc:
        _unwind(call, exc)


def _dedupe(contexts: tuple[UserMessage, ...]) -> tuple[UserMessage, ...]:
    seen: set[int] = set()
    out: list[UserMessage] = []
    for context in contexts:
        if id(context) not in seen:
            seen.add(id(context))
            out.append(context)
    return tuple(out)


def _broken(call: PreparedCall, exc: BaseException, chain: Chain) -> None:
    """A waterfall raised ``exc``: the call ends with its failure; a cancellation in it propagates.

    Each stage awaits its ``Chain`` itself rather than through a helper
    coroutine: one frame fewer per waterfall, on the path every listener takes.
    """
    fatal, error = split_fatal(exc)
    if error is not None:
        # Settled first: a cancellation that propagates below keeps this failure.
        failure = failure_from_exception(error, default_code=ErrorCode.POLICY_ERROR, plugin=chain.blame_for(exc))
        call._settle("final", _final(call, failure))
    if fatal is not None:
        raise fatal


async def _policy_stage(runtime: ToolRuntime, call: PreparedCall) -> None:
    trace = call.trace

    decision: object = _ALLOW
    decider: str | None = None
    listeners = call.hooks.pre
    while listeners:
        entries = None if trace is None else trace.chain("pre", _ALLOW)
        chain = Chain(listeners, (call.execution,), _check_pre, None, _ALLOW, entries, _rewrites_nothing)
        try:
            decision = await chain.run()
        except BaseException as exc:
            _broken(call, exc, chain)
            return
        decider = chain.decider
        if type(decision) is not Rewrite:
            break
        if not _rewrite(call, decision, decider):
            return
        # Rewritten: the whole stage runs again, on what will actually run.
    execution = call.execution

    if isinstance(decision, Ask):
        if trace is not None:
            trace.enter("approval")
        try:
            if call.scoped:
                decision, approval_cancelled = await _resolve_ask(runtime, execution, decision)
            else:
                # The stages run without a scope (nothing else in them can suspend);
                # the approval prompt can, so it gets one of its own.
                with trio.CancelScope() as scope:
                    unlink = execution.signal.link(scope)
                    try:
                        decision, approval_cancelled = await _resolve_ask(runtime, execution, decision)
                    finally:
                        unlink()
                if scope.cancelled_caught:
                    if trace is not None:
                        trace.add("approval", "approval", INTERRUPTED)
                    _resolve_cancelled(call)
                    return
        except BaseException as exc:
            fatal, error = split_fatal(exc)
            if error is not None:
                failure = failure_from_exception(error, default_code=ErrorCode.POLICY_ERROR, plugin="approval")
                call._settle("final", _final(call, failure))
            elif trace is not None:
                trace.add("approval", "approval", INTERRUPTED)
            if fatal is not None:
                raise fatal  # noqa: B904 (a part of the exception being handled, not a new one)
            return
        decider = "approval"
        if trace is not None:
            trace.add("approval", "approval", decision)
        if approval_cancelled and execution.signal.cancelled:
            _abort_before_dispatch(call)
            return

    _decide(runtime, call, decision, decider)


def _rewrite(call: PreparedCall, rewrite: Rewrite, decider: str | None) -> bool:
    """Apply ``rewrite`` to the call: ``False`` when the rewrite failed the call.

    The chain already resolved a rewrite to the arguments the call has.
    """
    execution = call.execution
    arguments = rewrite.arguments
    who = decider or "a pre-execute listener"
    done = len(call.rewrites or ())
    contract = call.contract
    assert contract is not None
    violations = () if done >= MAX_REWRITES else contract.argument_violations(arguments)
    structure = contract.structure_arguments
    if structure is not None and done < MAX_REWRITES and not violations:
        # Validated as the call's own arguments were: structured too, and only what finally runs reaches the body.
        try:
            call.structured = structure(arguments)
        except ToolArgsError as exc:
            violations = exc.violations
    if done >= MAX_REWRITES or violations:
        if violations:
            message = f"arguments rewritten by {who} are invalid: {ToolArgsError(violations).message}"
            failure = failure_result(message, ErrorCode.INVALID_ARGS, name="ToolArgsError", plugin=decider)
        else:
            message = (
                f"pre-execute policies rewrote the arguments of {execution.name} {done} times without settling "
                f"(last by {who}: {rewrite.reason})"
            )
            failure = failure_result(message, ErrorCode.POLICY_ERROR, name="PolicyError", plugin=decider)
        call._settle("final", _final(call, failure))
        return False
    call.execution = new_execution(
        execution.call_id,
        execution.root_call_id,
        execution.name,
        arguments,
        execution.signal,
        execution.token,  # the same call: sub-calls and observers keep recognising it
        execution.agent,
        execution.parent,
    )
    note = UserMessage(
        [
            TextBlock(
                f"The arguments of this {execution.name} call were changed by {who}: {rewrite.reason}. "
                f"It ran with: {json_text(arguments)}"
            )
        ],
        source=decider or "policy",
        meta={"rewrite": {"by": decider, "reason": rewrite.reason, "from": execution.arguments, "to": arguments}},
    )
    if call.rewrites is None:
        call.rewrites = [note]
    else:
        call.rewrites.append(note)
    return True


def _decide(runtime: ToolRuntime, call: PreparedCall, decision: object, decider: str | None) -> None:
    """The end of stage 5: a denial, the guards, then a last look at the signal."""
    execution = call.execution
    trace = call.trace
    if isinstance(decision, Deny):
        denial = failure_result(decision.reason, ErrorCode.DENIED, name="PolicyDenial", plugin=decider)
        call._settle("post", _latest(call, denial))
        return
    if trace is not None:
        trace.enter("guard")
    registry = runtime._registry
    guards = registry.view(execution.agent).guards
    for guard in _live_guards(registry, execution.agent, guards) if guards else ():
        label = getattr(guard, "label", None)
        try:
            reason = guard(execution)
        except BaseException as exc:
            if is_fatal(exc):
                raise
            failure = failure_from_exception(exc, default_code=ErrorCode.POLICY_ERROR, plugin=label)
            call._settle("final", _final(call, failure))
            return
        if trace is not None:
            trace.add("guard", label or guard, reason)
        if reason is None:
            continue
        if type(reason) is not str or not reason:
            problem = failure_result(
                f"guard {label} must return None or a non-empty reason string, got {safe_repr(reason)}",
                ErrorCode.POLICY_ERROR,
                name="PolicyError",
                plugin=label,
            )
            call._settle("final", _final(call, problem))
            return
        denial = failure_result(reason, ErrorCode.DENIED, name="GuardDenial", plugin=label)
        call._settle("post", _latest(call, denial))
        return
    if execution.signal.cancelled:
        _abort_before_dispatch(call)
        return
    call.step = "dispatch"


def _live_guards(registry: Registry, agent: ScopeKey | None, guards: tuple[ToolGuard, ...]) -> Iterator[ToolGuard]:
    """``guards`` (the call's, in order), live: one registered while they run is consulted too.

    Guards can only deny, so consulting a guard added mid-evaluation (by an earlier
    guard, say) is the conservative reading; one removed before its turn is not asked.
    Costs one version comparison per guard while nothing changes.
    """
    version = registry.version
    asked: list[ToolGuard] = []  # kept alive, so their ids stay theirs
    index = 0
    while index < len(guards):
        guard = guards[index]
        index += 1
        yield guard
        if registry.version != version:
            asked += guards[:index]
            skip = set(map(id, asked))
            guards = tuple(g for g in registry.view(agent).guards if id(g) not in skip)
            version = registry.version
            index = 0


def _latest(call: PreparedCall, result: ToolExecutionResult) -> ToolExecutionResult:
    call.latest = result
    return result


def _abort_before_dispatch(call: PreparedCall) -> None:
    """End a call the gates let through but whose signal fired before dispatch: post-execute sees the abort."""
    if call.trace is not None:
        call.trace.not_dispatched(call.execution.signal.reason)
    call._settle("post", _latest(call, aborted_result(body_invoked=False)))


async def _dispatch_stage(runtime: ToolRuntime, call: PreparedCall) -> None:
    if not call.hooks.execute:
        _settle_dispatched(call, await _dispatch_body(runtime, call, call.execution.signal))
        return
    dispatched = await _dispatch_chain(runtime, call)
    if dispatched is None:
        call._settle("final", call.latest)
        return
    _settle_dispatched(call, dispatched)


def _with_deferred(call: PreparedCall, result: ToolExecutionResult) -> ToolExecutionResult:
    if call.deferred:
        return attrs.evolve(result, additional_contexts=tuple(call.deferred) + result.additional_contexts)
    return result


def _settle_dispatched(call: PreparedCall, dispatched: ToolExecutionResult) -> None:
    """The wrappers and the body are done: the result heads for post-execute."""
    if call.trace is not None and not call.hooks.execute:
        call.trace.add("execute", call.execution.name, dispatched)
    dispatched = _with_deferred(call, dispatched)
    if call.execution.signal.cancelled and not dispatched.is_error:
        dispatched = aborted_result(body_invoked=call.body_invoked, contexts=dispatched.additional_contexts)
    call.step = "post"
    call.result = call.latest = dispatched


async def _post_stage(runtime: ToolRuntime, call: PreparedCall) -> None:
    result = call.result
    assert result is not None
    execution = call.execution
    listeners = call.hooks.post
    if not listeners:
        call._settle("final", _after_post(execution, result, call))
        return

    trace = call.trace
    entries = None if trace is None else trace.chain("post", _ACCEPT)
    chain = Chain(listeners, (execution, result), _check_post, None, _ACCEPT, entries)
    try:
        decision = await chain.run()
    except BaseException as exc:
        _broken(call, exc, chain)
        return
    applied = _apply_post(runtime, execution, result, decision, chain.decider, call)
    call.latest = applied
    call._settle("final", _after_post(execution, applied, call))


def _final(call: PreparedCall, result: ToolExecutionResult) -> ToolExecutionResult:
    """A failure that bypasses post-execute; deferred contexts still ride it."""
    if call.deferred and isinstance(result, ToolExecutionFailure):
        result = attrs.evolve(result, additional_contexts=_dedupe(tuple(call.deferred) + result.additional_contexts))
    if call.trace is not None and isinstance(result, ToolExecutionFailure):
        call.trace.fail(result)
    call.latest = result
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
        return Deny(approval_unavailable_reason(name)), False
    raise _approval_error(answer)


def approval_unavailable_reason(name: str) -> str:
    """The denial of an ``Ask`` for tool ``name`` that the approval service could put to no one ("unavailable").

    A host that knows how its user could answer (the CLI's ``--interactive``)
    recognises the denial by it and says so next to it.
    """
    return f'tool "{name}" requires approval, but no approval channel is available'


def _approval_error(answer: object) -> Exception:
    return PolicyError(
        f"approval service returned {safe_repr(answer)}; expected one of {', '.join(APPROVAL_ANSWERS)}"
    )


async def _dispatch_chain(runtime: ToolRuntime, call: PreparedCall) -> ToolExecutionResult | None:
    """Run the wrappers around the body. ``None`` means a final failure is in ``call.latest``."""
    execution = call.execution
    trace = call.trace
    view = dispatch_view(execution, call.dispatch_suspends)

    async def base() -> ToolExecutionResult:
        try:
            outcome = await _dispatch_body(runtime, call, view.signal)
        finally:
            if call.body_invoked:
                note_body(view, None)  # started; interrupted bodies stay "started"
        if call.body_invoked:
            # The success cancellation replaced, if it did: the work happened.
            note_body(view, getattr(call, "superseded", outcome) if outcome.is_error else outcome)
        if trace is not None:
            trace.add("execute", execution.name, outcome)
        call.latest = outcome
        return outcome

    entries = None if trace is None else trace.chain("execute", None)
    chain = Chain(call.hooks.execute, (view,), _check_result, base, None, entries)
    try:
        result: ToolExecutionResult = await chain.run()
    except BaseException as exc:
        _broken(call, exc, chain)
        return None
    if isinstance(result, ToolExecutionSuccess) and result is not call.latest:
        # A wrapper-authored success: its value goes through the tool's contract again.
        live = runtime._registry.view(execution.agent).tools.get(execution.name)
        if live is None:
            _final(call, _unknown_tool(execution.name))
            return None
        rebuilt = _build_success(live, contract_of(live), execution, result.value, call.run)
        if rebuilt.is_error:
            _final(call, rebuilt)
            return None
        result = attrs.evolve(rebuilt, additional_contexts=result.additional_contexts)
    call.latest = result
    return result


async def _dispatch_body(
    runtime: ToolRuntime, call: PreparedCall, current: CancelSignal, *, attempt: CancelSignal | None = None
) -> ToolExecutionResult:
    """Run the body once (or, for a tool with a ``RetryPolicy``, until the policy is done: ``attempt=None``).

    ``attempt`` is, for one attempt of a retrying call, the call's signal without
    the attempt's own budget: only that one replaces a success the body
    returned (see :mod:`dsh_core._retry`). A raising body's exception is kept
    in ``call.body_error`` for the retry loop to judge.
    """
    execution = call.execution
    caller = execution.signal
    fused = caller if current is caller else CancelSignal.any(caller, current)
    if fused.cancelled:
        return aborted_result(body_invoked=False)
    registry = runtime._registry
    tool = call.tool
    contract = call.contract
    if registry.version != call.registry_version:
        # The registry changed since the call was resolved (a listener or guard
        # unregistered or replaced the tool): dispatch what is visible now.
        view = registry.view(execution.agent)
        tool = view.tools.get(execution.name)
        if tool is None or (execution.parent is None and view.mode == "code" and execution.name != RUN_CODE_NAME):
            return _unknown_tool(execution.name)
        if call.admitted is not None and tool is not call.tool:
            now = classify_call(runtime, input_of(execution))
            if not admits(call.admitted, now):
                return _replaced_tool(execution.name, now)
        contract = contract_of(tool)
        if tool is not call.tool:
            # Checked against the tool that was resolved, not this one: its body trusts its own schema.
            violations = contract.argument_violations(execution.arguments)
            if violations:
                refusal = ToolArgsError(violations)
                return failure_result(
                    f"{refusal.message} (the tool was replaced while the call waited; its arguments were checked "
                    "against the new definition)",
                    ErrorCode.INVALID_ARGS,
                    name="ToolArgsError",
                )
    assert tool is not None and contract is not None
    if tool.retry is not None and attempt is None:
        return await _dispatch_retrying(runtime, call, current, fused, tool.retry)
    deferred: list[UserMessage] = []
    call.deferred = deferred
    run = ToolRunContext(execution, fused, deferred, runtime._orphans)
    call.run = run
    call.body_invoked = True
    arguments = execution.arguments if contract.structure_arguments is None else _body_arguments(call, tool)
    try:
        if not contract.body_suspends or (fused is caller and call.scoped):
            value = await tool.execute(arguments, run)
        else:
            # A wrapper installed its own signal (a deadline, say): interrupt the
            # body when that fires too, not only when the caller's does. (Or the
            # body suspends although the stages run unscoped: the tool was
            # replaced after the call was resolved.)
            with trio.CancelScope() as body_scope:
                unlink = fused.link(body_scope)
                try:
                    value = await tool.execute(arguments, run)
                finally:
                    unlink()
            if body_scope.cancelled_caught:
                return aborted_result(body_invoked=True)
    except BaseException as exc:
        fatal, error = split_fatal(exc)
        if error is None:
            if call.trace is not None:
                # Nothing records a body that does not return: traced as the abort it becomes,
                # as it is when the cancellation lands in the body's own scope.
                call.trace.add("execute", execution.name, aborted_result(body_invoked=True))
            raise
        call.body_error = sole_exception(error)
        failure = failure_from_exception(error, default_code=ErrorCode.TOOL_ERROR)
        if fatal is None:
            return failure
        call.latest = failure  # what the cancellation propagating now keeps (_resolve_cancelled)
        if call.trace is not None:
            call.trace.add("execute", execution.name, failure)
        raise fatal  # noqa: B904 (a part of the exception being handled, not a new one)
    result = _build_success(tool, contract, execution, value, run)
    if not result.is_error and (fused if attempt is None else attempt).cancelled:
        call.superseded = result
        return aborted_result(body_invoked=True)
    return result


def _body_arguments(call: PreparedCall, tool: ToolDefinition) -> object:
    """The instance structured from the call's arguments, for its body only and only once.

    A retried attempt, or a tool that replaced the one the call was resolved to,
    gets the arguments and structures them itself: a fresh instance, of its own class.
    """
    structured = getattr(call, "structured", None)
    if structured is None or tool is not call.tool:
        return call.execution.arguments
    del call.structured
    return structured


async def _dispatch_retrying(
    runtime: ToolRuntime, call: PreparedCall, current: CancelSignal, fused: CancelSignal, policy: RetryPolicy
) -> ToolExecutionResult:
    """Run the body until it succeeds, fails for good, or the policy runs out of attempts or patience.

    Each attempt is one ordinary dispatch of the body (a fresh run context: a
    failed attempt's deferred contexts go with it), under the attempt's own
    budget when the policy has one. Every pause runs in a scope linked to
    ``fused`` (the caller's signal and any wrapper's): cancelling ends the
    retrying at once.
    """
    execution = call.execution
    attempt = 1
    while True:
        budget = None
        signal = current
        if policy.attempt_timeout_s is not None:
            budget = CancelSignal.after(policy.attempt_timeout_s, reason="attempt budget")
            signal = CancelSignal.any(current, budget)
        call.body_error = None
        if hasattr(call, "superseded"):
            # Only this attempt's success may stand for the body's work.
            del call.superseded
        result = await _dispatch_body(runtime, call, signal, attempt=fused)
        if not result.is_error:
            return result
        error: BaseException | None = call.body_error
        if budget is not None and budget.cancelled and not fused.cancelled and error is None and _cut_short(result):
            # The attempt's own budget stopped the body. (One that returned, however late, has
            # done its work: its outcome stands, an output-contract failure included.)
            error = AttemptTimedOut(f"the attempt ran past its {policy.attempt_timeout_s:g} s budget")
            result = failure_from_exception(error, default_code=ErrorCode.TOOL_TIMEOUT)
        if error is None or fused.cancelled or not policy.retries(error):
            # Not the body's own failure (an output contract, a cancellation), or not one to retry.
            return _failed_after(result, attempt) if error is not None else result
        if _still_running(runtime, execution):
            # The attempt left a worker thread that nothing can stop: another attempt
            # would do the same work beside it (the side effect twice, at once).
            assert isinstance(result, ToolExecutionFailure)
            info = result.error.info
            return _failed_after(
                failure_result(
                    f"{result.error.message}; not retried while its worker thread still runs",
                    info.code if info is not None else ErrorCode.TOOL_ERROR,
                    name=info.name if info is not None else None,
                ),
                attempt,
            )
        pause = policy.pause_before(attempt + 1, error)
        if pause is None:
            return _failed_after(result, attempt)
        if trio.current_time() + pause >= fused.deadline:
            # The call's own deadline (a timeout policy's) would cut the pause: the model gets
            # this failure now, not a timeout in place of it once the deadline passes.
            return _failed_after(result, attempt)
        info = result.error.info if isinstance(result, ToolExecutionFailure) else None
        record = RetryAttempt(
            call_id=execution.call_id,
            root_call_id=execution.root_call_id,
            tool=execution.name,
            attempt=attempt,
            pause_s=pause,
            code=info.code if info is not None else ErrorCode.TOOL_ERROR.value,
            message=result.error.message if isinstance(result, ToolExecutionFailure) else "",
        )
        if call.trace is not None:
            call.trace.add("execute", record, None)
        send_event(runtime.event_sink, "tool/retry", record.to_json(), logger)
        with trio.CancelScope() as pause_scope:
            unlink = fused.link(pause_scope)
            try:
                await trio.sleep(pause)
            finally:
                unlink()
        if pause_scope.cancelled_caught or fused.cancelled:
            return aborted_result(body_invoked=True)
        attempt += 1


def _cut_short(result: ToolExecutionResult) -> bool:
    """Whether ``result`` is the abort of a body a cancellation stopped (not a failure the body came to)."""
    return (
        isinstance(result, ToolExecutionFailure)
        and result.error.info is not None
        and result.error.info.code == ErrorCode.ABORTED.value
    )


def _still_running(runtime: ToolRuntime, execution: ToolExecution) -> bool:
    """Whether a worker thread this call abandoned (``run_in_thread``) is still running."""
    agent = scope_id(execution.agent)
    return any(
        work.call_id == execution.call_id and work.tool == execution.name and work.agent == agent
        for work in runtime._orphans.running()
    )


def _failed_after(failure: ToolExecutionResult, attempts: int) -> ToolExecutionResult:
    """The last attempt's failure, saying how many attempts it took (so the model does not try again at once)."""
    if attempts == 1 or not isinstance(failure, ToolExecutionFailure):
        return failure
    info = failure.error.info
    return failure_result(
        f"{failure.error.message} (after {attempts} attempts)",
        info.code if info is not None else ErrorCode.TOOL_ERROR,
        name=info.name if info is not None else None,
    )


def _build_success(
    tool: ToolDefinition,
    contract: ToolContract,
    execution: ToolExecution,
    candidate: object,
    run: ToolRunContext | None,
) -> ToolExecutionResult:
    """Snapshot, validate, render and project a value into a success (or an output failure)."""
    try:
        value = snapshot_json(candidate)
    except NonJsonValueError as exc:
        return _output_failure(tool.name, [f"value is not lossless JSON: {exc}"])
    except BaseException as exc:
        # Inspecting the value ran its code (a __class__ property, an __eq__...) and that raised.
        if is_fatal(exc):
            raise
        return _output_failure(tool.name, [f"value snapshot failed: {error_message(exc)}"])
    violations = contract.output_violations(value)
    if violations:
        return _output_failure(tool.name, violations)
    output = tool.output
    render = output.render
    if render is default_render:
        content: tuple[Any, ...] = (default_block(value),)
    else:
        try:
            content = as_content(render(execution.arguments, value), what="output.render result")
        except BaseException as exc:
            if is_fatal(exc):
                raise
            return _output_failure(tool.name, [f"output.render failed: {error_message(exc)}"])
    meta: JsonValue = None
    projector = output.presentation_meta
    if projector is not None and execution.parent is None:
        try:
            meta = snapshot_json(projector(execution.arguments, value))
        except NonJsonValueError as exc:
            return _output_failure(tool.name, [f"output.presentation_meta returned non-lossless JSON: {exc}"])
        except BaseException as exc:
            if is_fatal(exc):
                raise
            return _output_failure(tool.name, [f"output.presentation_meta failed: {error_message(exc)}"])
    return new_success(value, content, meta, run is not None and run._concluded)


def _output_failure(name: str, violations: Sequence[str]) -> ToolExecutionFailure:
    error = ToolOutputError(name, violations)
    return failure_result(error.message, ErrorCode.INVALID_TOOL_OUTPUT, name="ToolOutputError")


def _after_post(execution: ToolExecution, result: ToolExecutionResult, call: PreparedCall) -> ToolExecutionResult:
    if execution.signal.cancelled and not result.is_error:
        return aborted_result(body_invoked=call.body_invoked, contexts=result.additional_contexts)
    return result


def _apply_post(
    runtime: ToolRuntime,
    execution: ToolExecution,
    result: ToolExecutionResult,
    decision: Accept | Block,
    decider: str | None,
    call: PreparedCall,
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
        rebuilt = _build_success(live, contract_of(live), execution, decision.value, call.run)
        return attrs.evolve(rebuilt, additional_contexts=contexts)
    if decision.content is not None:
        return attrs.evolve(result, content=decision.content, additional_contexts=contexts)
    if decision.additional_contexts:
        return attrs.evolve(result, additional_contexts=contexts)
    return result


async def finish(runtime: ToolRuntime, call: PreparedCall) -> ToolExecutionResult:
    """Stage 8: ``finalize_content`` exactly once, then ``dsh_result`` observers."""
    result = _finished(call)
    await _notify(call.hooks.result, call, result)
    call.step = "ended"
    return result


def _finished(call: PreparedCall) -> ToolExecutionResult:
    """The settled result after ``finalize_content`` and with its trace (when either applies)."""
    result = call.result
    assert result is not None
    if call.finalizer is not None or call.trace is not None:
        result = _finalized(call, result)
    if call.rewrites is not None:
        result = attrs.evolve(result, additional_contexts=(*call.rewrites, *result.additional_contexts))
    return result


def _finalized(call: PreparedCall, settled: ToolExecutionResult) -> ToolExecutionResult:
    execution = call.execution
    finalizer = call.finalizer
    trace = call.trace
    result = settled
    if finalizer is not None:
        try:
            replacement = finalizer(execution, result)
            if replacement is not None:
                result = attrs.evolve(result, content=as_content(replacement, what="finalize_content result"))
        except BaseException as exc:
            if is_fatal(exc):
                raise
            # A DshError keeps its own code, as it does wherever else it is raised.
            code = exc.code if isinstance(exc, DshError) and isinstance(exc.code, str) else ErrorCode.TOOL_ERROR
            result = failure_result(
                f"finalize_content violated its total contract: {error_message(exc)}", code, name=type(exc).__name__
            )
        if trace is not None:
            trace.add("finalize", "finalize_content", (settled, result))
    if trace is not None:
        result = trace.attach(result)
    return result


async def _notify(observers: tuple[Listener, ...], call: PreparedCall, result: ToolExecutionResult) -> None:
    execution = call.execution
    ordered = (execution, result)
    for listener in observers:
        try:
            outcome = listener.fn(execution, result) if listener.positional else listener.call(ordered)
            if outcome is None:
                continue
            if not listener.suspends:
                # An async def observer that awaits nothing: no checkpoint to interrupt.
                await outcome
                continue
            if not inspect.isawaitable(outcome):
                continue
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
            fatal, error = split_fatal(exc)
            if error is not None:
                logger.warning(
                    'tool "%s" (%s): dsh_result observer %s failed: %s',
                    execution.name,
                    execution.call_id,
                    listener.plugin_name,
                    error_message(error),
                )
            if fatal is not None:
                # Cut while publishing: the observers so far (this one too) had the result;
                # the others' plugins are told the call unwound instead (see unwound()).
                call.step = "publishing"
                call.published_to = frozenset(seen.plugin_name for seen in observers[: observers.index(listener) + 1])
                raise fatal  # noqa: B904 (a part of the exception being handled, not a new one)


_EXITS = (KeyboardInterrupt, SystemExit)


def _is_exit(exc: BaseException) -> bool:
    if isinstance(exc, BaseExceptionGroup):
        return exc.subgroup(_EXITS) is not None
    return isinstance(exc, _EXITS)


def _unwind(call: PreparedCall, exc: BaseException) -> NoReturn:
    """``call`` leaves its stage with ``exc``: tell :func:`unwound`, then raise it on.

    A lone interrupt or exit grouped by a task group inside the call (a
    ``run_code`` run's) goes on bare, as it does out of a call that ran none.
    """
    cause = lone_exit(exc)
    unwound(call, cause)
    if cause is exc:
        raise exc
    raise cause from None


def unwound(call: PreparedCall, cause: BaseException) -> None:
    """``call`` is leaving the pipeline with ``cause`` and no result: tell ``dsh_call_unwound``, once.

    Does nothing for a call that ended already (published, or told), so every
    way out may call it. Synchronous: an await while a cancellation unwinds
    would only be cancelled again. A listener's error is logged and the others
    still run: it must not replace ``cause``, which the caller re-raises. Only
    an interpreter exit raised in a listener while something else unwinds (a
    cancellation) is raised here, once every listener ran.
    """
    step = call.step
    if step == "ended":
        return
    call.step = "ended"
    listeners = call.hooks.unwound
    if not listeners:
        return
    if step == "publishing":
        published_to = call.published_to
        listeners = tuple(listener for listener in listeners if listener.plugin_name not in published_to)
    execution = call.execution
    ordered = (execution, cause, call.body_invoked)
    exit_: BaseException | None = None
    for listener in listeners:
        try:
            if listener.positional:
                listener.fn(*ordered)
            else:
                listener.call(ordered)
        except BaseException as exc:
            if isinstance(exc, _EXITS):
                exit_ = exit_ or exc
                continue
            logger.warning(
                'tool "%s" (%s): dsh_call_unwound listener %s failed: %s',
                execution.name,
                execution.call_id,
                listener.plugin_name,
                error_message(exc),
            )
    if exit_ is not None and not _is_exit(cause):
        raise exit_
