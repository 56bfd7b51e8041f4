"""The contract between a dsh-tools host and its plugins (pluggy project ``"dsh"``).

Every tool call runs through one ordered pipeline::

    snapshot + freeze arguments -> visibility -> validate arguments
      -> dsh_pre_execute (waterfall: Allow / Deny / Ask / Rewrite) -> approval (for Ask)
         (Rewrite: the new arguments are validated, then this stage runs again on them)
      -> guards (monotonic: may only deny)
      -> dsh_execute (around-dispatch waterfall) -> tool body
      -> output snapshot, validation, render, presentation meta
      -> dsh_post_execute (waterfall: Accept / Block)
      -> finalize_content -> freeze -> dsh_result (observers) -> returned

A call cut short by the host (its own trio cancel scope, Ctrl-C) has no
result: it ends in ``dsh_call_unwound`` instead of ``dsh_result``.

Write a plugin as a module or an object with functions named after these
specs, marked with :data:`dsh_core.hookimpl`, and register it with
``runtime.plugins.register(obj)`` or through the ``dsh`` entry-point group.
A hookimpl may declare any subset of a spec's arguments, by name. One the
runtime would never run is refused at registration: one whose name matches no
spec (a typo), unless it is marked ``@hookimpl(optionalhook=True)``; a pluggy
wrapper (see *Order*); an ``async def dsh_tools_change`` or
``dsh_call_unwound`` (both are called synchronously). (That is the
runtime's own ``PluginManager``; a plain pluggy one of the host's accepts them,
and then every call fails ``POLICY_ERROR`` naming the plugin until it is gone.)

**Waterfalls** (``dsh_pre_execute``, ``dsh_execute``, ``dsh_post_execute``,
``dsh_code_dispatch_log``) must be ``async def``. Each listener receives
``next``, an argument-less coroutine function that runs the rest of the chain
(ending in the built-in default) and returns its outcome. Return that outcome,
return your own to short-circuit everything inner, or inspect and change it.
``next`` may be awaited at most once, and only while your listener runs: a
second call, or a call of a ``next`` kept after your listener returned, raises
``PolicyError`` and runs nothing (the inner chain never runs twice, nor outside
its call). Left uncaught, that error, a wrong return type or any other
exception makes the call fail with ``POLICY_ERROR`` naming your plugin
(``ToolErrorInfo.plugin``), never lets it through.

**Cost**: the runtime reads each listener's code once. A listener whose
only ``await`` is ``await next()`` (on its ``next`` argument, called with no
arguments) cannot suspend by itself, and a call in which nothing can suspend
runs without a trio cancel scope. A listener that awaits anything else (I/O,
a sleep, an approval of its own) makes each call it sees enter one, so that
the caller's signal can interrupt it; that costs a few microseconds, nothing
to worry about next to real I/O.

**Order** is pluggy's own call order: ``tryfirst=True`` listeners are
outermost, then plain listeners with the *later-registered outermost*, then
``trylast=True`` listeners innermost (for entry-point plugins the host loads in
sorted (distribution, entry point) order, so the order is the same on every
machine). pluggy ``wrapper``/``hookwrapper`` impls are refused at registration
on every hook but ``dsh_tools_change``, the only one pluggy itself calls: the
runtime calls the others' listeners itself and would never run a wrapper. A
waterfall listener wraps the rest of its chain by awaiting ``next`` instead.

**Scoping**: a plugin object with a ``dsh_scope`` attribute (an ``Agent`` or
other scope key) only sees calls whose agent is that scope or a descendant.
Agents compare by identity: set ``dsh_scope`` to the very ``Agent`` object the
host's calls carry, since another ``Agent`` with the same ``id`` is another scope.

**Capabilities**: a plugin module may declare ``DSH_CAPABILITIES = {"tools":
[...], "affects": [...]}`` (globs). With ``strict_capabilities = true`` the host
refuses registrations outside ``tools`` and turns any decision a listener or
guard makes on a tool outside ``affects`` into a ``POLICY_ERROR`` naming the
plugin (see ``dsh_core._capabilities``).

Listeners are same-process trusted code, but their failures are contained:
only ``trio.Cancelled``, ``KeyboardInterrupt`` and ``SystemExit`` escape.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from ._content import ContentBlock
    from ._decisions import PostToolDecision, PreToolDecision
    from ._execution import ToolDispatchExecution, ToolExecution
    from ._results import ToolExecutionResult

__all__ = ["PROJECT_NAME", "hookimpl", "hookspec"]

PROJECT_NAME = "dsh"
hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)


@hookspec
async def dsh_pre_execute(
    execution: ToolExecution, next: Callable[[], Awaitable[PreToolDecision]]
) -> PreToolDecision:
    """Decide whether a call may run, before any guard or the body.

    Runs after the arguments were snapshotted, frozen and validated against the
    tool's schema, so listeners only ever see well-formed arguments of a visible
    tool. Return ``Allow()``, ``Deny(reason)``, ``Ask(reason=None)`` or
    ``Rewrite(arguments, reason)``; the default (``await next()`` at the end of
    the chain) is ``Allow()``. ``Ask`` consults the runtime's
    ``ApprovalService``: only ``"allowed-once"`` lets the call continue, and a
    runtime without a service, or a call without an agent, is denied.
    ``execution.arguments`` stay frozen: a listener that wants other arguments
    returns ``Rewrite``, the new arguments are validated against the schema,
    and this whole stage runs again on the rewritten call (every listener,
    approval and guard sees what will run; the result tells the model what
    changed). A ``Rewrite`` to the arguments the call already has stands for
    what the listeners inside its listener decide on that pass (see
    ``Rewrite``), never for an ``Allow`` past them. A listener can therefore see one call more than once: a listener
    that keeps state per call (a counter, a budget) keys it by
    ``execution.token``, which stays the same across the passes.

    Async listeners should watch ``execution.signal``; the runtime re-checks
    cancellation after the waterfall settles (``ABORTED_BEFORE_DISPATCH``) but
    never abandons a running listener. When the signal fires while a listener
    awaits, trio interrupts that await (``trio.Cancelled``: let it propagate);
    the call then ends ``ABORTED_BEFORE_DISPATCH`` and post-execute sees that,
    as it does when a listener notices the cancellation and returns. A raising
    listener fails the call (``POLICY_ERROR`` unless it raised a ``DshError``
    with its own code) and post-execute does not run.
    """
    raise NotImplementedError


@hookspec
async def dsh_execute(
    execution: ToolDispatchExecution, next: Callable[[], Awaitable[ToolExecutionResult]]
) -> ToolExecutionResult:
    """Wrap the dispatch of an allowed call (timeouts, metrics, tracing).

    ``next()`` runs at most once, so a wrapper cannot retry; a tool declares
    its retries (``define_tool(retry=RetryPolicy(...))``) and the body is re-run
    inside every wrapper, an outer deadline bounding all the attempts.

    ``next()`` returns the normalised result of the inner wrappers and the body;
    a raising body arrives as a failure result, not an exception. The caller's
    signal firing during the body is trio's cancellation, not a result: it
    raises ``trio.Cancelled`` out of ``next()`` (let it propagate; a ``finally``
    restoring the signal runs), and post-execute then sees the call ``ABORTED``.
    A signal of the wrapper's own firing (a deadline) comes back from ``next()``
    as an ``ABORTED`` result instead. A wrapper may
    assign ``execution.signal`` (and should restore it before returning); the
    runtime fuses the caller's signal back in before the body, so replacing it
    cannot detach caller cancellation. No other field can be assigned.

    After ``next()`` returns, ``execution.body_started`` says whether the body
    ran in this dispatch and ``execution.body_result`` what it produced (the
    success itself when cancellation then made the call ``ABORTED``): what a
    wrapper that records or compensates work needs, as the result alone
    cannot tell a body's own ``UNKNOWN_TOOL`` from a tool that was gone.
    Both hold when ``next()`` raises, too: a cancellation of the caller's
    scope, or an inner wrapper's exception, can arrive after the body
    returned a success, whose work then happened all the same.

    A success a wrapper builds itself has its ``value`` re-validated and
    re-rendered against the tool's output contract. A raising wrapper fails the
    call and post-execute does not run.
    """
    raise NotImplementedError


@hookspec
async def dsh_post_execute(
    execution: ToolExecution,
    result: ToolExecutionResult,
    next: Callable[[], Awaitable[PostToolDecision]],
) -> PostToolDecision:
    """Accept, replace or block a dispatched result.

    Reached by successes, tool failures and denials (not by failures of the
    pipeline itself, such as invalid arguments or a broken listener). Return
    ``Accept()`` (the default), ``Accept(content=...)`` (presentation only: the
    value and meta are kept), ``Accept(value=...)`` (revalidated and
    re-rendered; refused on a failed result) or ``Block(feedback)`` (a string
    or content blocks; the value and the tool's deferred contexts are dropped
    and the call fails ``DENIED`` with the feedback). Any of them may add ``additional_contexts``.
    """
    raise NotImplementedError


@hookspec
async def dsh_code_dispatch_log(dispatch: Any, next: Callable[[], Awaitable[list[ContentBlock]]]) -> list[ContentBlock]:
    """Reshape the *logged copy* of one settled ``run_code`` sub-call's content.

    ``dispatch`` is a ``dsh_core.code_mode.CodeDispatchLog`` (outer execution,
    agent, sub-call id, tool name, ``is_error``, rendered ``content``). ``next()``
    returns the content unchanged. Only the durable ``tool/code-dispatch`` event
    changes: the program already has the value and the model sees neither. A
    raising listener is contained and the original content is logged. Without
    a runtime ``event_sink`` nothing is logged and no listener runs.
    """
    raise NotImplementedError


@hookspec
def dsh_result(execution: ToolExecution, result: ToolExecutionResult) -> None:
    """Observe the final, frozen result of every call (exactly once per call).

    A call cut short from outside, which has no result, ends in
    ``dsh_call_unwound`` instead: a plugin hears of each call exactly one of the two.

    ``result`` is the very object ``ToolRuntime.execute`` returns; neither it nor
    ``execution`` can be changed. Observers may be ``async def`` (awaited in
    order). A raising observer is logged and the others still run. An async
    observer that can suspend runs in a cancel scope linked to the caller's
    signal, so it cannot hold the result back once the caller gave up.
    """
    raise NotImplementedError


@hookspec
def dsh_call_unwound(execution: ToolExecution, cause: BaseException, body_started: bool) -> None:
    """A call is leaving the pipeline without a result for this plugin (exactly once per such call).

    A cancellation from a scope *outside* the call (the host's turn deadline,
    its Ctrl-C handling), a ``KeyboardInterrupt``, ``SystemExit`` or a closed
    coroutine (``GeneratorExit``) goes straight through ``ToolRuntime.execute``
    (and ``run_tool_calls``, and a ``run_code`` sub-call): the call gets no
    result and ``dsh_result`` never runs. Whatever an observer opened for it
    (a span, an audit record's timing) is closed here instead. So, for every
    call that got as far as having its ``execution``, each plugin hears of its
    end exactly once: ``dsh_result``, or this, even when it was cut before any
    hook saw it (while its arguments were validated). A call cut earlier, while
    its arguments were still being copied and frozen, has no ``execution``: no
    hook ever sees it and nothing here is told. A call cut while its result was
    being published (an ``async`` observer awaiting) is told here only to the
    plugins whose ``dsh_result`` had not been called yet.

    ``cause`` is the exception unwinding the call (``trio.Cancelled``,
    ``KeyboardInterrupt``...; possibly an exception group holding one, when a
    scheduler's task group unwinds a cancellation; a lone interrupt or exit is
    given bare, as the host gets it). ``body_started`` says whether the tool
    body was invoked (its effect may have happened). A call the caller's own
    signal cancels is not unwound: it ends ``ABORTED`` and ``dsh_result`` sees
    it, unless the host's scope was cancelled at the same moment (trio then
    gives the cancellation to the outermost scope, and the call is told here).

    Called synchronously, as the call unwinds (an ``async def`` listener is
    refused at registration: an await would only be cancelled again).
    Listeners must not block. A listener that raises is logged (logger
    ``dsh_core``) and the others still run; the unwinding exception goes on
    unchanged, except that a ``KeyboardInterrupt`` or ``SystemExit`` raised in a
    listener while a cancellation unwinds propagates once every listener ran.
    """


@hookspec
def dsh_tools_change() -> None:
    """The visible tool set may have changed (a registration, restriction or presentation).

    Unfiltered: every listener hears every change, whatever scope it concerned.
    A listener that raises during ``register()`` rolls that registration back and
    the error propagates to the caller of ``register()``. Called synchronously
    (pluggy calls it, so a pluggy wrapper works here): an ``async def`` listener
    is refused at registration, since its coroutine would never run.
    """
    raise NotImplementedError


@hookspec
def dsh_setup(runtime: Any, config: Any) -> None:
    """Called once by ``load_plugins`` after the plugin is registered.

    Register tools, guards and restrictions here (``runtime.register(...)``).
    ``config`` is this plugin's own configuration table (a ``dict``, empty when
    none was given). A raising ``dsh_setup`` unregisters the plugin and is
    reported by ``load_plugins``; the host keeps running.
    """
