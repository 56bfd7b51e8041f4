"""The timeout policy: enforce each tool's ``timeout_ms`` as a cooperative deadline.

Enable it through the ``timeout`` entry point (on by default for the first-party
distribution); configure it in ``[plugins.timeout]``::

    [plugins.timeout]
    default_ms = 30000   # budget for tools that declare no timeout_ms (default: none)

For each dispatched call the policy looks up the definition the caller's scope
sees. Without a budget the call passes through untouched, and the body sees the
caller's own signal object. With one, the policy installs
``CancelSignal.any(current, deadline)`` as ``execution.signal`` for the inner
wrappers and the body, and restores the previous signal afterwards. The runtime
turns the deadline into the body's cancel-scope deadline, so a trio body is
interrupted at its first checkpoint after the budget.

If the deadline fired first, the call fails with ``TOOL_TIMEOUT``
(``tool call timed out after <ms>ms``), whatever the inner chain returned (the
registry's ``ABORTED``, a body's own failure raised while unwinding, or even a
success that ignored the signal). A cancellation of the current signal before
the deadline keeps its own outcome (the registry's ``ABORTED``), also when it
came from another thread while the body held the loop past the deadline (what
counts is when each fired, not when the run noticed); one that
arrives while the body is still unwinding from the timeout does not turn the
timeout into ``ABORTED`` (a more specific failure always wins over cancellation).
An earlier deadline installed by an outer wrapper reads as a plain cancellation
too: only this policy's own deadline, marked by a per-call
:class:`TimeoutReason`, produces ``TOOL_TIMEOUT``.

The policy is cooperative and never abandons the body: a body that shields its
cleanup from cancellation is awaited to the end, and the call resolves only
then. Declaring ``timeout_ms`` asserts that the tool cooperates.

**Order**: the wrapper is registered ``trylast``, so it is the innermost
``dsh_execute`` wrapper, closest to the body. ``timeout_ms`` is a property of
the tool, so it bounds the tool's own work: time an outer wrapper spends before
calling ``next()`` (waiting for a concurrency slot, say) does not eat into the
budget, and outer wrappers (metrics, the audit log) see the ``TOOL_TIMEOUT``
result and time it like any other. A wrapper that wants a deadline around
everything installs its own. (The TypeScript original registers a plain
listener, whose position then depends on load order; ``trylast`` makes it the
same everywhere.)
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Final

import attrs
import trio

from dsh_core import (
    CancelSignal,
    ErrorCode,
    PolicyError,
    TableCheck,
    ToolDispatchExecution,
    ToolExecutionResult,
    ToolRuntime,
    check_validator,
    failure_result,
    hookimpl,
    structure_table,
)

__all__ = ["MAX_TIMEOUT_MS", "PLUGIN_NAME", "TOOL_TIMEOUT", "TimeoutPolicy", "TimeoutReason", "TimeoutSettings"]

# Capability manifest (enforced under strict_capabilities): it may replace any budgeted call's result with TOOL_TIMEOUT.
DSH_CAPABILITIES: dict[str, list[str]] = {"tools": [], "affects": ["*"]}

PLUGIN_NAME: Final = "timeout-policy"
TOOL_TIMEOUT: Final = ErrorCode.TOOL_TIMEOUT.value

MAX_TIMEOUT_MS: Final = 2_147_483_647
"""The largest budget accepted (2**31 - 1 ms, about 24.8 days).

trio itself has no such limit; the cap catches unit mistakes (a budget written
in microseconds) with a clear error instead of a deadline nobody meant, and
matches the original's limit. A larger ``default_ms`` is a configuration error;
a tool declaring a larger ``timeout_ms`` fails each call with ``POLICY_ERROR``
(blamed on ``timeout-policy``) before its body runs.
"""


def format_ms(ms: float) -> str:
    """``5`` and ``5.0`` as ``5``, ``2.5`` as ``2.5`` (the way a budget reads in messages)."""
    if type(ms) is int and ms.bit_length() > 64:
        # Beyond a float's range (and, past 4300 digits, beyond what str() will print).
        return f"about {'-' if ms < 0 else ''}2**{ms.bit_length() - 1}"
    return str(int(ms)) if float(ms).is_integer() else repr(float(ms))


def _check_budget(ms: float, what: str) -> str | None:
    if type(ms) not in (int, float) or not (ms > 0 if type(ms) is int else math.isfinite(ms) and ms > 0):
        # A number shown as budgets are everywhere (5.0 as 5): the table's -1 arrives here as -1.0.
        shown = format_ms(ms) if type(ms) is int or (type(ms) is float and math.isfinite(ms)) else repr(ms)
        return f"{what} must be a positive finite number of milliseconds, got {shown}"
    if ms > MAX_TIMEOUT_MS:
        given = f"{what} = {format_ms(ms)} ms" if what else f"{format_ms(ms)} ms"
        return (
            f"{given} exceeds the timeout policy's maximum of "
            f"{MAX_TIMEOUT_MS} ms (about 24.8 days); declare no timeout instead of a huge one"
        )
    return None


def _default_ms_problem(value: float) -> str | None:
    # Worded to follow the key: "default_ms must be ...", "[plugins.timeout].default_ms: must be ...".
    problem = _check_budget(value, "")
    return None if problem is None else problem.strip()


@attrs.frozen(kw_only=True)
class TimeoutSettings:
    """The ``[plugins.timeout]`` table: ``default_ms`` applies to tools without ``timeout_ms``."""

    default_ms: Annotated[float, TableCheck(_default_ms_problem)] | None = attrs.field(
        default=None, validator=check_validator(_default_ms_problem)
    )


@attrs.frozen(slots=True, eq=False)
class TimeoutReason:
    """The reason a timeout deadline fires with: this policy's own mark, compared by identity.

    A fresh object per call, so nested deadlines (another wrapper's, an outer
    call's) can never be mistaken for this call's.
    """

    budget_ms: float
    code: str = TOOL_TIMEOUT

    def __str__(self) -> str:
        return f"tool call timed out after {format_ms(self.budget_ms)}ms"


class TimeoutPolicy:
    """The ``dsh_execute`` wrapper of one runtime (state lives here, never on the module).

    Reentrant: concurrent calls share nothing but the settings.
    """

    def __init__(self, runtime: ToolRuntime, settings: TimeoutSettings | None = None) -> None:
        self.runtime = runtime
        self.settings = settings or TimeoutSettings()

    @property
    def default_ms(self) -> float | None:
        """The budget of tools that declare no ``timeout_ms`` (``None``: they run unbounded)."""
        return self.settings.default_ms

    def budget_ms(self, execution: ToolDispatchExecution) -> float | None:
        """The budget of this call: the visible definition's ``timeout_ms``, else ``default_ms``."""
        definition = self.runtime.get(execution.name, execution.agent)
        if definition is None:
            return None  # the runtime fails the call as UNKNOWN_TOOL; nothing to time
        if definition.timeout_ms is not None:
            return definition.timeout_ms
        return self.settings.default_ms

    @hookimpl(trylast=True)
    async def dsh_execute(
        self, execution: ToolDispatchExecution, next: Callable[[], Awaitable[ToolExecutionResult]]
    ) -> ToolExecutionResult:
        budget = self.budget_ms(execution)
        if budget is None:
            return await next()
        problem = _check_budget(budget, f'tool "{execution.name}" timeout_ms')
        if problem is not None:
            raise PolicyError(problem)

        saved = execution.signal
        reason = TimeoutReason(budget)
        deadline = CancelSignal.after(budget / 1000, reason=reason)
        # Only a dispatch that can suspend has anything to shield (see on_upstream_cancel);
        # one that cannot still sees the deadline through its signal.
        guard = trio.CancelScope() if execution.may_suspend else None

        signal = CancelSignal.any(saved, deadline)

        def timed_out_first() -> bool:
            # Ask the signals which fired first by when each fired, not by what a
            # listener sees when it runs: a cancel from another thread is timed at
            # its call, though the run may hear of it only after the deadline (the
            # body held the loop). Reading a signal fires a deadline that passed.
            return signal.reason is reason

        def on_upstream_cancel() -> None:
            # The current signal fired explicitly.
            if timed_out_first():
                # The timeout came first and the body is unwinding from it. Keep
                # the caller's cancellation from erasing that outcome: the body is
                # already cancelled by its own deadline, so shielding only decides
                # that its Cancelled ends inside this call and the result reads
                # TOOL_TIMEOUT (failures are never replaced by cancellation).
                if guard is not None:
                    guard.shield = True
            else:
                # The caller came first: the deadline takes over its reason, so
                # the outcome reads as the caller's cancellation.
                deadline.cancel(saved.reason)

        unsubscribe = saved.subscribe(on_upstream_cancel)
        execution.signal = signal
        try:
            if guard is None:
                result = await next()
            else:
                with guard:
                    result = await next()
        finally:
            execution.signal = saved
            unsubscribe()

        # An earlier deadline on the current signal (an outer timeout) fired
        # first: that is a plain cancellation from this policy's point of view.
        upstream_first = saved.deadline <= deadline.deadline

        if timed_out_first() and not upstream_first:
            return failure_result(
                str(reason),
                ErrorCode.TOOL_TIMEOUT,
                name="ToolTimeoutError",
                plugin=PLUGIN_NAME,
                additional_contexts=result.additional_contexts,
            )
        return result


@hookimpl
def dsh_setup(runtime: ToolRuntime, config: dict[str, Any]) -> None:
    """Register a fresh :class:`TimeoutPolicy` for ``runtime`` (named ``timeout-policy``; the entry-point module itself is ``timeout``)."""
    settings = structure_table(TimeoutSettings, config, "[plugins.timeout]")
    runtime.plugins.register(TimeoutPolicy(runtime, settings), name=PLUGIN_NAME)
