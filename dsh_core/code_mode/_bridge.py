"""The ``run_code`` transport: one program's tool calls, each through the full pipeline.

Every SDK call the program makes becomes a sub-call ``<outer id>:code:<n>``
(numbered in submission order) carrying the outer execution's token as
``parent``. Sub-calls start in submission order; consecutive parallel-safe calls
overlap up to ``max_parallel_sub_calls``; an exclusive call waits for the pool
to drain, runs alone and holds later calls back until it has committed. A call
with resource keys is scheduled as in ``run_tool_calls``: its dispatch waits for
every earlier call it conflicts with, and overlaps the others.
Post-execute and finalisation (the commit) also run in submission order.

Sub-calls run in a nursery the bridge owns, not in the code runtime's tasks,
so a program that stops waiting for a call cannot orphan it: when the run
settles, a run-scoped signal fires, queued calls are abandoned (they log
nothing), started ones are cancelled and drained, and their logs are written,
before ``run_code`` returns.

A sub-call whose content holds an image comes back to the program as its value
only; the content itself is deferred to the outer call as a ``UserMessage`` with
``source="code-mode"``, so the model still sees the image after the run.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Generator, Iterable
from typing import TYPE_CHECKING, Any, Final, NoReturn

import attrs
import trio

from .. import _pipeline
from .._content import ContentBlock, ImageBlock, TextBlock, UserMessage, as_content
from .._definition import ToolDefinition, ToolOutput, contract_of, define_tool
from .._errors import CodeRunFailedError, DshError, NonJsonValueError
from .._events import send_event
from .._execution import Exclusive, Parallel, ToolExecution, ToolExecutionInput, ToolRunContext, input_of, scope_id
from .._json import FrozenDict, JsonValue, frozen_copy, json_text, snapshot_json
from .._jsoncodec import encode_json
from .._resources import KeyIndex, ResourceClaim, classify_call, settle_after, wait_for_settled
from .._results import ToolExecutionResult, ToolExecutionSuccess, error_message
from .._signal import CancelSignal
from .._waterfall import Chain, Listener, split_fatal
from ._sdk import RUN_CODE_DESCRIPTION, RUN_CODE_NAME, run_code_output_spec, run_code_parameters_spec

if TYPE_CHECKING:
    from .._runtime import ToolRuntime

__all__ = ["CodeDispatchLog", "build_run_code_tool", "checked_code_runtime", "render_run_code_value"]

logger = logging.getLogger("dsh_core.code_mode")

_INDENT_CAP_DEPTH = 5  # containers deeper than this render compactly (indentation capped at 10)
# json.dumps's own string encoder (C, non-ASCII kept): what json_text writes for a str.
_encode_string: Callable[[str], str] = json.encoder.encode_basestring


@attrs.frozen(slots=True, kw_only=True)
class CodeDispatchLog:
    """One settled ``run_code`` sub-call about to be logged (the ``dsh_code_dispatch_log`` payload).

    ``content`` is the sub-call's final model-facing content: what a native
    result would carry. Listeners may only change the *logged copy*.
    """

    execution: ToolExecution
    agent: Any
    sub_call_id: str
    name: str
    is_error: bool
    content: tuple[ContentBlock, ...]


class _ProgramFacingError(Exception):
    """Raised into the program as ``ToolCallError(tool_name, message)``."""


class _Ticket:
    __slots__ = (
        "call", "claim", "dispatched", "done", "error", "exclusive", "kind", "name", "number", "own_signal",
        "request", "started", "sub_call_id", "turn", "value",
    )  # fmt: skip

    def __init__(
        self, number: int, sub_call_id: str, name: str, request: ToolExecutionInput, own_signal: CancelSignal
    ) -> None:
        self.own_signal = own_signal  # its request's signal: fired by the run's, or by the program's cancel
        self.number = number
        self.sub_call_id = sub_call_id
        self.name = name
        self.request = request
        self.exclusive = False
        # How it was classified when it was admitted (parallel, exclusive or by its resource keys).
        self.kind: ResourceClaim | Parallel | Exclusive | None = None
        self.claim: trio.Event | None = None  # set once its keyed dispatch has settled
        self.started = False
        self.dispatched = False  # its dispatch stage is over: it waits to commit
        self.call: _pipeline.PreparedCall | None = None
        self.done: trio.Event | None = None  # only a ticket run by a worker task is waited for
        self.turn: trio.Event | None = None  # set when it reaches the head of the queue it waits in
        self.value: JsonValue = None
        self.error: str | None = None


class _Lane:
    """The per-run scheduler state.

    One ordered lane: a start (the start event and pre-execute) and a commit
    (post-execute and finish) never run at the same time, and a commit that is
    ready goes before the next start; only dispatches overlap. ``busy`` is held
    by whichever ordered stage runs. ``log_backlog`` counts settled sub-calls
    waiting for a log slot: they hold back later starts, never a program's value.

    A ticket behind another in ``pending`` or ``commits`` sleeps on its own
    ``turn`` until it reaches the head; only heads wait for a change of the
    lane's state. Waking every queued ticket on every change made a program
    that gathers thousands of sub-calls quadratic (4 000 took 25 s).
    """

    def __init__(self, runtime: ToolRuntime, cap: int, run_signal: CancelSignal) -> None:
        self.runtime = runtime
        self.cap = cap
        self.run_signal = run_signal
        self.pending: deque[_Ticket] = deque()
        self.commits: deque[_Ticket] = deque()
        self.busy = False
        self.log_backlog = 0
        self.in_flight = 0
        self.exclusive_active = False
        self.keys = KeyIndex()
        self._changed: trio.Event | None = None  # created only while someone waits for a change
        self.log_slots = trio.CapacityLimiter(cap)

    def notify(self) -> None:
        changed, self._changed = self._changed, None
        if changed is not None:
            changed.set()

    async def wait_for_turn(self, queue: deque[_Ticket], ticket: _Ticket) -> None:
        """Until ``ticket`` heads ``queue`` (or has left it: :meth:`abandon_pending` empties it)."""
        while queue and queue[0] is not ticket:
            ticket.turn = trio.Event()
            await ticket.turn.wait()
        ticket.turn = None

    def pop_head(self, queue: deque[_Ticket]) -> None:
        queue.popleft()
        if queue and queue[0].turn is not None:
            queue[0].turn.set()

    def leave(self, ticket: _Ticket, *, dispatching: bool) -> None:
        """``ticket``'s worker is unwinding (an interrupt) wherever it was: it gives up its place.

        Left in ``commits``, it would hold every later commit back for good, and the
        workers waiting for their commit are shielded: the run would never end.
        """
        if dispatching:
            self.in_flight -= 1
        if ticket in self.commits:
            if self.commits[0] is ticket:
                self.pop_head(self.commits)
            else:
                self.commits.remove(ticket)
            if ticket.exclusive:
                self.exclusive_active = False
        self.notify()

    def abandon_pending(self) -> None:
        """The run is over: every ticket that has not started leaves the queue at once."""
        abandoned = list(self.pending)
        self.pending.clear()
        for ticket in abandoned:
            if ticket.turn is not None:
                ticket.turn.set()
        self.notify()

    async def wait_until(self, condition: Callable[[], bool]) -> None:
        while not condition():
            if self._changed is None:
                self._changed = trio.Event()
            await self._changed.wait()

    def may_start(self, ticket: _Ticket) -> bool:
        if self.run_signal.cancelled:
            return True  # the worker abandons it
        if not self.pending or self.pending[0] is not ticket or self.busy or self.exclusive_active:
            return False
        if self.log_backlog or (self.commits and self.commits[0].dispatched):
            return False  # logs to make room for, or a commit to run first
        ticket.kind = classify_call(self.runtime, ticket.request)
        ticket.exclusive = isinstance(ticket.kind, Exclusive)
        if ticket.exclusive:
            return self.in_flight == 0 and not self.commits
        return self.in_flight < self.cap


class _ToolBinding:
    """``tools.<name>`` for one run: called with the arguments, it submits one sub-call.

    The call numbers and queues the sub-call at once; the awaitable it returns
    waits for the outcome. ``completes_at_once()`` tells the code runtime
    whether a call made now would finish without suspending, so it may serve
    the call in its reader instead of a task of its own.
    """

    __slots__ = ("__name__", "_bridge", "_name")

    def __init__(self, bridge: _Bridge, name: str) -> None:
        self._bridge = bridge
        self._name = name
        self.__name__ = f"tools.{name}"

    def __call__(self, raw_args: JsonValue) -> Awaitable[JsonValue]:
        return self._bridge.submit(self._name, raw_args)

    def completes_at_once(self) -> bool:
        return self._bridge.idle() and self._bridge.quiet(self._name)


class _SubCall:
    """What a binding returns: the awaitable of one sub-call's outcome, which the code runtime may cancel.

    ``cancel()`` (the program stopped waiting for it: ``asyncio.wait_for`` ran
    out, its task was cancelled) fires the sub-call's own signal: one not started
    yet never starts, one running ends ``ABORTED`` at its next checkpoint, and
    either way the calls after it commit in order without waiting for its body.
    """

    __slots__ = ("_outcome", "_ticket")

    def __init__(self, outcome: Coroutine[Any, Any, JsonValue], ticket: _Ticket) -> None:
        self._outcome = outcome
        self._ticket = ticket

    def __await__(self) -> Generator[Any, None, JsonValue]:
        return self._outcome.__await__()

    def cancel(self) -> None:
        self._ticket.own_signal.cancel("the program stopped waiting for this call")

    def close(self) -> None:
        self._outcome.close()


def _describe_reason(reason: object) -> str:
    return reason if isinstance(reason, str) else repr(reason)


async def _rejected(message: str) -> JsonValue:
    raise _ProgramFacingError(message)


class _Bridge:
    """The state of one ``run_code`` execution."""

    def __init__(self, runtime: ToolRuntime, run: ToolRunContext, nursery: trio.Nursery) -> None:
        self.runtime = runtime
        self.run = run
        self.nursery = nursery
        self.run_signal = CancelSignal()
        # The sub-calls not over yet, each with a signal of its own (the program may cancel one):
        # the run's signal fires them all. Plain signals, not each fused with the run's: a fused
        # one costs every check of every stage of every sub-call a look at two sources.
        self.live: dict[_Ticket, None] = {}
        self.run_signal.subscribe(self._abort_live)
        self.unsubscribe = run.signal.subscribe(lambda: self.run_signal.cancel(run.signal.reason))
        if run.signal.cancelled:
            self.run_signal.cancel(run.signal.reason)
        self.lane = _Lane(runtime, runtime.max_parallel_sub_calls, self.run_signal)
        self.numbers = itertools.count(1)
        # The latest submitted call whose awaitable has not been awaited yet, with its arguments:
        # it may still run inline when it is. A call made after it starts its worker instead,
        # since a program awaiting the later call first would otherwise wait on it for good.
        self.unawaited: tuple[_Ticket, JsonValue] | None = None

    def binding(self, name: str) -> _ToolBinding:
        return _ToolBinding(self, name)

    def _abort_live(self) -> None:
        reason = self.run_signal.reason
        for ticket in list(self.live):
            ticket.own_signal.cancel(reason)

    def submit(self, name: str, raw_args: object) -> Awaitable[JsonValue]:
        """Number and queue a call of ``name`` now; the awaitable waits for its outcome.

        Not a coroutine: numbers, starts and commits follow the order in which calls
        are made (the code runtime makes them in the order the program's frames
        arrive), not the order in which the tasks awaiting them happen to run.
        A call runs whether or not its awaitable is awaited in the meantime, once
        a later call is made (the latest one waits for its await, where it may run
        inline): a program that awaits a later call first, or never awaits one,
        does not wait on a call that was never started.
        """
        if self.run_signal.cancelled:
            return _rejected(f"run_code run is over ({_describe_reason(self.run_signal.reason)}); {name} not dispatched")
        try:
            arguments = snapshot_json(raw_args)
        except NonJsonValueError as exc:
            return _rejected(f"tool arguments must be lossless JSON: {exc}")
        outer = self.run
        number = next(self.numbers)
        sub_call_id = f"{outer.call_id}:code:{number}"
        own_signal = CancelSignal()
        request = ToolExecutionInput(
            call_id=sub_call_id,
            root_call_id=outer.root_call_id,
            name=name,
            arguments=arguments,
            agent=outer.agent,
            parent=outer.token,
            signal=own_signal,
        )
        ticket = _Ticket(number, sub_call_id, name, request, own_signal)
        self.live[ticket] = None
        self.lane.pending.append(ticket)
        if self.unawaited is not None:
            self._start_worker(*self.unawaited)
        self.unawaited = (ticket, arguments)
        return _SubCall(self._outcome(ticket, arguments), ticket)

    def _start_worker(self, ticket: _Ticket, arguments: JsonValue) -> None:
        ticket.done = trio.Event()
        self.nursery.start_soon(self.work, ticket, arguments)

    async def _outcome(self, ticket: _Ticket, arguments: JsonValue) -> JsonValue:
        lane = self.lane
        if self.unawaited is not None and self.unawaited[0] is ticket:
            self.unawaited = None
            if not lane.commits and not lane.in_flight and lane.may_start(ticket) and self.quiet(ticket.name):
                # Nothing in this sub-call can suspend and it is first in line: running it
                # right here is what its worker task would do, minus two task switches
                # (and the shield: code that cannot suspend cannot be cancelled either).
                await self._work(ticket, arguments, may_start=True)
            else:
                self._start_worker(ticket, arguments)
        if ticket.done is not None:
            await ticket.done.wait()
        if ticket.error is not None:
            raise _ProgramFacingError(ticket.error)
        return ticket.value

    def idle(self) -> bool:
        """Whether a sub-call submitted now would start and commit at once (nothing else in the lane)."""
        lane = self.lane
        return not (
            lane.pending or lane.commits or lane.in_flight or lane.busy or lane.exclusive_active or lane.log_backlog
        ) and not self.run_signal.cancelled

    def quiet(self, name: str) -> bool:
        """Whether nothing on a sub-call of ``name``'s way can suspend.

        Neither the pipeline (see :mod:`dsh_core._suspension`), an approval
        prompt nor a ``dsh_code_dispatch_log`` listener can give control back to trio.
        """
        runtime = self.runtime
        agent = self.run.agent
        hooks = runtime._chains.for_call(agent)
        if hooks.pre_suspends or hooks.execute_suspends or hooks.finish_suspends:
            return False
        if hooks.pre and runtime.approval is not None:
            return False  # a listener may ask, and the prompt would suspend
        if not self.logging_is_instant():
            return False
        tool = runtime._registry.view(agent).tools.get(name)
        return tool is None or not contract_of(tool).body_suspends

    def log_listeners(self) -> tuple[Listener, ...]:
        if self.runtime.event_sink is None:
            # They reshape only the logged copy, and without a sink nothing is logged (as in
            # the original, where a call without a session logs nothing): running them would
            # cost every sub-call a log slot for a copy nobody keeps.
            return ()
        return self.runtime._chains.listeners("dsh_code_dispatch_log", self.run.agent)

    def logging_is_instant(self, listeners: tuple[Listener, ...] | None = None) -> bool:
        """Whether no ``dsh_code_dispatch_log`` listener can suspend."""
        return not any(listener.suspends for listener in (self.log_listeners() if listeners is None else listeners))

    async def work(self, ticket: _Ticket, logged_arguments: JsonValue) -> None:
        # Shielded from the outer call's trio cancellation: a started sub-call must
        # still settle (as ABORTED, through the run signal) and be logged.
        with trio.CancelScope(shield=True):
            await self._work(ticket, logged_arguments)

    async def _work(self, ticket: _Ticket, logged_arguments: JsonValue, *, may_start: bool = False) -> None:
        lane = self.lane
        runtime = self.runtime
        call: _pipeline.PreparedCall | None = None
        dispatching = False  # counted in ``lane.in_flight``
        try:
            if not may_start:  # the caller just found that it may: do not classify the call again
                await lane.wait_for_turn(lane.pending, ticket)
                await lane.wait_until(lambda: lane.may_start(ticket))
            if (self.run_signal.cancelled or ticket.own_signal.cancelled) and not ticket.started:
                if lane.pending and lane.pending[0] is ticket:
                    lane.pop_head(lane.pending)
                if self.run_signal.cancelled:
                    ticket.error = (
                        f"run_code run is over ({_describe_reason(self.run_signal.reason)}); "
                        f"{ticket.name} tool call abandoned"
                    )
                else:
                    ticket.error = f"{ticket.name} tool call cancelled by the program before it started"
                return
            lane.pop_head(lane.pending)
            ticket.started = True
            lane.busy = True
            lane.in_flight += 1
            dispatching = True
            lane.commits.append(ticket)
            if ticket.exclusive:
                lane.exclusive_active = True
            lane.notify()
            started_at = trio.current_time()
            if self.runtime.event_sink is not None:
                self.emit(
                    "tool/code-dispatch-start",
                    {**self.ids(ticket), "name": ticket.name, "arguments": logged_arguments},
                )
            classified_at = runtime._registry.version
            after: list[trio.Event] = []
            try:
                call = await _pipeline.prepare(runtime, ticket.request)
                if (
                    (call.rewrites is not None or runtime._registry.version != classified_at)
                    and not ticket.exclusive
                    and call.step == "dispatch"
                    and classify_call(runtime, input_of(call.execution)) != ticket.kind
                ):
                    # A policy rewrote the arguments into a call that schedules otherwise (exclusive,
                    # or other keys), or the tool was replaced while the policies decided: it was
                    # admitted as something it no longer is. Nothing may start beside it, and it
                    # waits for what started before it to commit.
                    ticket.exclusive = True
                    lane.exclusive_active = True
                elif call.step == "dispatch" and isinstance(ticket.kind, ResourceClaim | Parallel):
                    # A tool replaced before the body runs (while it waits for a key, say) is
                    # refused by the body stage when this schedule does not cover it.
                    call.admitted = ticket.kind
                    if isinstance(ticket.kind, ResourceClaim):
                        # Claimed before the lane is free again, so claims follow submission order.
                        ticket.claim = trio.Event()
                        after = lane.keys.claim(ticket.kind, ticket.claim)
            finally:
                lane.busy = False
                lane.notify()
            if ticket.exclusive and not (lane.in_flight == 1 and lane.commits[0] is ticket):
                await lane.wait_until(lambda: lane.in_flight == 1 and lane.commits[0] is ticket)
            try:
                if after:
                    await wait_for_settled(ticket.own_signal, after)
                await _pipeline.dispatch(runtime, call)
            finally:
                if ticket.claim is not None:
                    await settle_after(after, ticket.claim)
                lane.in_flight -= 1
                dispatching = False
                ticket.dispatched = True
                lane.notify()
            await lane.wait_for_turn(lane.commits, ticket)
            await lane.wait_until(lambda: lane.commits[0] is ticket and not lane.busy)
            lane.busy = True
            try:
                result = await _pipeline.finalize(runtime, call)
            finally:
                lane.busy = False
                lane.pop_head(lane.commits)
                if ticket.exclusive:
                    lane.exclusive_active = False
                lane.notify()
            self.commit(ticket, result)
            listeners = self.log_listeners()
            if self.runtime.event_sink is None:
                pass  # nothing to log to (and so no listener: see log_listeners)
            elif self.logging_is_instant(listeners):
                await self.log(ticket, logged_arguments, result, started_at, slot=False)
            else:
                # A slow log listener never holds the program's value back: the program
                # goes on, and while the log has no slot, later sub-calls wait to start.
                if ticket.done is not None:
                    ticket.done.set()
                lane.log_backlog += 1
                try:
                    await lane.log_slots.acquire_on_behalf_of(ticket)
                finally:
                    lane.log_backlog -= 1
                    lane.notify()
                self.nursery.start_soon(self.log, ticket, logged_arguments, result, started_at)
        except BaseException as exc:
            if call is not None:
                # Cut between its stages (an interpreter exit: the worker is shielded), it has no result.
                _pipeline.unwound(call, exc)
            if ticket.started:
                lane.leave(ticket, dispatching=dispatching)
            if ticket.error is None:
                ticket.error = f"{ticket.name} tool call interrupted"  # not a value: it has none
            raise
        finally:
            self.live.pop(ticket, None)
            if ticket.done is not None:
                ticket.done.set()

    def commit(self, ticket: _Ticket, result: ToolExecutionResult) -> None:
        run = self.run
        if isinstance(result, ToolExecutionSuccess):
            if any(isinstance(block, ImageBlock) for block in result.content):
                run.defer_context(UserMessage(result.content, source="code-mode"))
            for context in result.additional_contexts:
                run.defer_context(context)
            if result.concludes_turn:
                run.conclude_turn()
            if self.run_signal.cancelled:
                ticket.error = (
                    f"run_code run is over ({_describe_reason(self.run_signal.reason)}); {ticket.name} result discarded"
                )
            else:
                ticket.value = result.value
        else:
            for context in result.additional_contexts:
                run.defer_context(context)
            ticket.error = result.error.message

    def ids(self, ticket: _Ticket) -> dict[str, str | None]:
        # The agent too: call ids are per conversation, so two agents' run_code calls may share one.
        return {
            "root_call_id": self.run.root_call_id,
            "parent_call_id": self.run.call_id,
            "sub_call_id": ticket.sub_call_id,
            "agent": scope_id(self.run.agent),
        }

    async def log(
        self,
        ticket: _Ticket,
        arguments: JsonValue,
        result: ToolExecutionResult,
        started_at: float,
        *,
        slot: bool = True,
    ) -> None:
        try:
            if not slot:
                # Inline (nothing in the log can suspend): there is nothing to shield.
                content = await self.logged_content(ticket, result)
                if self.runtime.event_sink is None:
                    return
            else:
                with trio.CancelScope(shield=True):
                    content = await self.logged_content(ticket, result)
            self.emit(
                "tool/code-dispatch",
                {
                    **self.ids(ticket),
                    "name": ticket.name,
                    "arguments": arguments,
                    "is_error": result.is_error,
                    "content": content,
                    "duration_s": trio.current_time() - started_at,
                },
            )
        finally:
            if slot:
                self.lane.log_slots.release_on_behalf_of(ticket)

    async def logged_content(self, ticket: _Ticket, result: ToolExecutionResult) -> tuple[ContentBlock, ...]:
        listeners = self.log_listeners()
        if not listeners:
            return result.content
        dispatch = CodeDispatchLog(
            execution=self.run.execution,
            agent=self.run.agent,
            sub_call_id=ticket.sub_call_id,
            name=ticket.name,
            is_error=result.is_error,
            content=result.content,
        )

        def check(outcome: object) -> str | None:
            try:
                as_content(outcome)
            except TypeError as exc:
                return f"dsh_code_dispatch_log must return content blocks: {exc}"
            return None

        chain = Chain(listeners, (dispatch,), check, outcome=result.content)
        try:
            return as_content(await chain.run())
        except BaseException as exc:
            fatal, error = split_fatal(exc)
            if error is not None:
                logger.warning(
                    "code-dispatch-log listener %s failed for %s: %s; logging the original settled content",
                    chain.blame_for(exc),
                    ticket.name,
                    error_message(error),
                )
            if fatal is not None:
                raise fatal  # noqa: B904 (a part of the exception being handled, not a new one)
            return result.content

    def emit(self, event_type: str, data: dict[str, Any]) -> None:
        send_event(self.runtime.event_sink, event_type, data, logger)

    def settle(self) -> None:
        self.run_signal.cancel("run_code settled")
        self.lane.abandon_pending()
        self.unsubscribe()


def render_run_code_value(args: object, value: JsonValue) -> list[ContentBlock]:
    """Printed lines, then the return value (strings raw, other JSON pretty-printed)."""
    assert isinstance(value, dict)
    raw_logs = value.get("logs")
    logs = tuple(str(line) for line in raw_logs) if isinstance(raw_logs, tuple) else ()
    parts = ["\n".join(logs)] if logs else []
    if "result" in value:
        result = value["result"]
        parts.append(result if isinstance(result, str) else pretty_json(result))
    text = "\n".join(part for part in parts if part)
    return [TextBlock(text or "(run_code completed with no output)")]


def pretty_json(value: JsonValue) -> str:
    """Two-space indented JSON whose indentation stops at depth 5 (deeper containers are compact).

    Iterative, so values nested thousands of levels deep render.
    """
    out: list[str] = []
    work: list[tuple[int, Any, int]] = [(0, value, 0)]  # (kind 0=value 1=literal, payload, depth)
    while work:
        kind, item, depth = work.pop()
        if kind == 1:
            out.append(item)
            continue
        if isinstance(item, (dict, list, tuple)) and depth >= _INDENT_CAP_DEPTH:
            out.append(encode_json(item, ascii_only=False))  # compact: [1,2], {"k":"v"}
            continue
        if isinstance(item, dict):
            if not item:
                out.append("{}")
                continue
            pad = "  " * (depth + 1)
            if _CONTAINER_KINDS.isdisjoint(map(type, item.values())):
                out.append(_flat_text(item, depth))  # an object of scalars: one C call
                continue
            entries = list(item.items())
            work.append((1, "\n" + "  " * depth + "}", depth))
            for index in range(len(entries) - 1, -1, -1):
                key, child = entries[index]
                work.append((0, child, depth + 1))
                work.append((1, ("," if index else "") + "\n" + pad + json_text(key) + ": ", depth))
            work.append((1, "{", depth))
        elif isinstance(item, (list, tuple)):
            if not item:
                out.append("[]")
                continue
            pad = "  " * (depth + 1)
            if _CONTAINER_KINDS.isdisjoint(map(type, item)):
                out.append(_flat_text(item, depth))  # scalars (a program's numbers): one C call
                continue
            rows = _rows_text(item, depth)
            if rows is not None:
                out.append(rows)
                continue
            work.append((1, "\n" + "  " * depth + "]", depth))
            for index in range(len(item) - 1, -1, -1):
                work.append((0, item[index], depth + 1))
                work.append((1, ("," if index else "") + "\n" + pad, depth))
            work.append((1, "[", depth))
        else:
            out.append(_scalar_text(item))
    return "".join(out)


_LITERALS: dict[object, str] = {True: "true", False: "false", None: "null"}
_FLAT_ENCODERS: dict[int, Callable[[object, int], Iterable[str]]] = {}
# What a snapshot's containers are (and what a plain value's would be).
_CONTAINER_KINDS: Final = frozenset({dict, list, tuple, FrozenDict})


def _refuse(value: object) -> NoReturn:
    raise TypeError(f"{type(value).__name__} is not JSON")


def _flat_text(container: Any, depth: int) -> str:
    """``container`` (non-empty; only scalars in it) at ``depth``, as pretty_json writes it, in one C call.

    The C encoder of the json module, built once per depth, with an item separator
    that carries the line break and the next level's indentation; its first and
    last characters (the brackets) are replaced by the bracket and a line break.
    """
    encode = _FLAT_ENCODERS.get(depth)
    if encode is None:
        separator = ",\n" + "  " * (depth + 1)
        make_encoder: Any = json.encoder.c_make_encoder  # type: ignore[attr-defined]
        encode = make_encoder(None, _refuse, json.encoder.encode_basestring, None, ": ", separator, False, False, False)
        _FLAT_ENCODERS[depth] = encode
    text = "".join(encode(container, 0))
    return text[0] + "\n" + "  " * (depth + 1) + text[1:-1] + "\n" + "  " * depth + text[-1]


def _rows_text(rows: Any, depth: int) -> str | None:
    """``rows`` (an array) at ``depth`` when each item is a scalar or holds only scalars, else None.

    A program's rows of objects, thousands of them, each written in one C call
    instead of an entry of the work stack per member.
    """
    texts: list[str] = []
    inner = depth + 1
    for row in rows:
        kind = type(row)
        if kind not in _CONTAINER_KINDS:
            texts.append(_scalar_text(row))
        elif inner >= _INDENT_CAP_DEPTH:
            texts.append(encode_json(row, ascii_only=False))
        elif not row:
            texts.append("[]" if kind is tuple or kind is list else "{}")
        elif _CONTAINER_KINDS.isdisjoint(map(type, row.values() if kind is dict or kind is FrozenDict else row)):
            texts.append(_flat_text(row, inner))
        else:
            return None
    pad = "  " * inner
    return "[\n" + pad + (",\n" + pad).join(texts) + "\n" + "  " * depth + "]"


def _scalar_text(value: JsonValue) -> str:
    """A JSON scalar's text as :func:`json_text` writes it, without its per-call encoder set-up."""
    if type(value) is str:
        return _encode_string(value)
    if type(value) is int:
        return int.__repr__(value)
    if type(value) is float:
        return float.__repr__(value)  # finite: a snapshot holds no NaN or infinity
    if type(value) is bool or value is None:
        return _LITERALS[value]
    return json_text(value)


def _present_call(args: Any) -> Any:
    try:
        from ..presentation import GenericCallView
    except ImportError:  # pragma: no cover - presentation ships with the package
        return None
    return GenericCallView(title=args["description"], kind="execute", raw_input=args["code"])


SDK_LANGUAGES: tuple[str, ...] = ("python",)
"""Code runtime languages this package renders an SDK and a ``run_code`` description for."""


def checked_code_runtime(runtime: ToolRuntime, mode: str) -> Any:
    """``runtime.code_runtime``, when a Code Mode presentation can use it.

    Raises ``DshError`` (``CODE_RUNTIME_MISSING``) when none is mounted, and
    (``CODE_RUNTIME_UNSUPPORTED``) when its ``language`` has no SDK renderer:
    offering the model a ``run_code`` that cannot run, or an SDK in the wrong
    language, would only fail later and less clearly.
    """
    code_runtime = runtime.code_runtime
    if code_runtime is None:
        raise DshError(
            f'mode "{mode}" requires a code runtime: '
            'pass ToolRuntime(code_runtime=SubprocessPythonRuntime()) or use mode="native"',
            code="CODE_RUNTIME_MISSING",
        )
    language = getattr(code_runtime, "language", None)
    if language not in SDK_LANGUAGES:
        shown = f'"{language}"' if isinstance(language, str) else repr(language)
        known = ", ".join(f'"{name}"' for name in SDK_LANGUAGES)
        raise DshError(
            f"no SDK renderer registered for runtime language {shown} (known: {known})",
            code="CODE_RUNTIME_UNSUPPORTED",
        )
    return code_runtime


def build_run_code_tool(runtime: ToolRuntime) -> ToolDefinition:
    """The ``run_code`` definition bound to ``runtime`` (its code runtime and registry)."""

    async def run_code(args: Any, run: ToolRunContext) -> dict[str, Any]:
        code_runtime = checked_code_runtime(runtime, runtime.effective_mode(run.agent))
        description = args["description"]
        if not description.strip():
            raise ValueError("invalid description: expected a non-empty string")
        names = [name for name in runtime.names(run.agent) if name != RUN_CODE_NAME]
        async with trio.open_nursery() as nursery:
            bridge = _Bridge(runtime, run, nursery)
            try:
                outcome = await code_runtime.run(
                    args["code"], {name: bridge.binding(name) for name in names}
                )
            finally:
                bridge.settle()
        if outcome.error is not None:
            message = f"code run failed ({outcome.error.kind}): {outcome.error.message}"
            if outcome.logs:
                message += "\nCaptured output:\n" + "\n".join(outcome.logs)
            raise CodeRunFailedError(message)
        # Built frozen, so the pipeline takes it as it is: CodeRunResult snapshotted its value
        # already, and walking a program's 200 000 rows again held the event loop.
        value: dict[str, JsonValue] = {"logs": snapshot_json(outcome.logs)}
        if outcome.has_value:
            value["result"] = outcome.value
        return frozen_copy(value)

    tool = define_tool(
        name=RUN_CODE_NAME,
        description=RUN_CODE_DESCRIPTION,
        parameters=run_code_parameters_spec(),
        output=ToolOutput(schema=run_code_output_spec(), render=render_run_code_value),
        execute=run_code,
        present_call=_present_call,
    )
    return tool

