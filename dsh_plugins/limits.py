"""Call budgets: at most so many tool calls per agent, in all and per tool.

A model in a loop, or a Code Mode program iterating over more than it should,
can make thousands of calls. Enable budgets in ``[plugins.limits]``::

    [plugins.limits]
    max_calls = 200                        # calls per agent, every tool together
    per_tool = { bash = 20, web_fetch = 50 }
    count_sub_calls = true                 # Code Mode sub-calls count as calls (default)

**What counts** is a dispatched call: one that every policy, the approval and
the guards let through and whose body is about to run. A denied call costs
nothing; a rewritten call is one call. A call is counted as it is dispatched
(so that parallel calls cannot all take the last one) and given back if its
body never ran after all: stopped while an inner wrapper kept it waiting
(``ABORTED_BEFORE_DISPATCH``), refused by an inner wrapper, or answered without
the body (the effect ledger replaying a recorded outcome). A spent budget is checked before
that, in pre-execute, so once it is spent a call the ledger would have answered from its record
(a resumed turn repeating its call ids) is denied too: reset the budget to resume. Budgets are per agent (``scope_id``;
agent-less calls share one budget), for the runtime's life unless the host
starts afresh with :meth:`CallLimits.reset` or :meth:`CallLimits.reset_agent` (at the start of a turn or a
conversation, say).

**When a budget is spent** the pre-execute listener denies the call with a
reason the model can act on (``call budget spent: bash made 20 of 20 calls
for this agent``), so ``simulate`` and ``explain`` show it like any policy.
Calls already past that check when the budget ran out (a batch of parallel
calls racing for the last one) are refused at dispatch with the same
``DENIED`` result: a budget is never exceeded, by any interleaving.

``per_tool`` names tools exactly (prefixed names included, ``gh__create_issue``);
``dsh-tools check`` warns about a name no registered tool has, whose budget
would limit nothing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Annotated, Any, Final

import attrs

from dsh_core import (
    Deny,
    ErrorCode,
    PreToolDecision,
    ScopeKey,
    TableCheck,
    ToolDispatchExecution,
    ToolExecution,
    ToolExecutionResult,
    ToolRuntime,
    check_validator,
    failure_result,
    hookimpl,
    scope_id,
    structure_table,
)

from ._settings_warnings import report_inert_keys, unknown_tool_warnings

__all__ = ["PLUGIN_NAME", "CallLimits", "LimitsSettings"]

PLUGIN_NAME: Final = "call-limits"

# It denies any tool's calls once a budget is spent.
DSH_CAPABILITIES: dict[str, list[str]] = {"tools": [], "affects": ["*"]}


def _budget_problem(value: object) -> str | None:
    if type(value) is not int or value < 0:
        return f"must be a whole number of calls >= 0, got {value!r}"
    return None


def _per_tool_problem(value: Mapping[str, int]) -> str | None:
    # The names first: each budget is checked (with its own path) as it structures.
    if "" in value:
        return "names a tool with an empty name"
    for name, budget in value.items():
        problem = _budget_problem(budget)
        if problem is not None:
            return f"{name} {problem}"
    return None


@attrs.frozen(kw_only=True)
class LimitsSettings:
    """The ``[plugins.limits]`` table (no budget set: the plugin registers nothing)."""

    max_calls: Annotated[int, TableCheck(_budget_problem)] | None = attrs.field(
        default=None, validator=check_validator(_budget_problem)
    )
    per_tool: Annotated[dict[str, Annotated[int, TableCheck(_budget_problem)]], TableCheck(_per_tool_problem)] = (
        attrs.field(factory=dict, validator=check_validator(_per_tool_problem))
    )
    count_sub_calls: bool = True


class CallLimits:
    """Counts each agent's dispatched calls and refuses those past a budget (see the module documentation)."""

    def __init__(self, settings: LimitsSettings, runtime: ToolRuntime | None = None) -> None:
        self.settings = settings
        # Only for diagnostics(): which tools per_tool can mean.
        self.runtime = runtime
        # (agent id, tool) -> dispatched calls; tool None is the agent's total.
        self._counts: dict[tuple[str | None, str | None], int] = {}
        # Bumped by every reset: a count taken before one is not given back after it. Per
        # agent too, so that resetting one agent does not keep another's never-run calls charged.
        self._generation = 0
        self._agent_generations: dict[str | None, int] = {}

    def used(self, agent: ScopeKey | None = None, tool: str | None = None) -> int:
        """Calls ``agent`` (the scope key itself, an ``Agent`` say, or its ``scope_id``) made, of ``tool`` or of all."""
        return self._counts.get((scope_id(agent), tool), 0)

    def reset(self) -> None:
        """Start every agent's budgets afresh (a new turn or conversation)."""
        self._counts.clear()
        self._generation += 1

    def reset_agent(self, agent: ScopeKey | None) -> None:
        """Start one agent's budgets afresh (the key or its ``scope_id``; ``None``: the agent-less calls)."""
        name = scope_id(agent)
        for key in [key for key in self._counts if key[0] == name]:
            del self._counts[key]
        self._agent_generations[name] = self._agent_generations.get(name, 0) + 1

    def diagnostics(self) -> list[str]:
        """Warnings for ``dsh-tools check``: ``per_tool`` budgets for tools that are not registered.

        A misspelt name is accepted by the configuration, and its budget then
        limits nothing while the tool it was meant for runs unlimited.
        """
        if self.runtime is None:
            return []
        return unknown_tool_warnings(self.runtime, "per_tool", self.settings.per_tool, "its budget limits nothing")

    def _counted(self, execution: ToolExecution | ToolDispatchExecution) -> bool:
        return self.settings.count_sub_calls or execution.parent is None

    def _spent(self, agent: str | None, tool: str) -> str | None:
        """Why a call of ``tool`` for ``agent`` may not run, or ``None`` when its budgets allow one more."""
        per_tool = self.settings.per_tool.get(tool)
        if per_tool is not None and self.used(agent, tool) >= per_tool:
            return f"call budget spent: {tool} made {self.used(agent, tool)} of {per_tool} calls for this agent"
        total = self.settings.max_calls
        if total is not None and self.used(agent) >= total:
            return f"call budget spent: this agent made {self.used(agent)} of {total} tool calls"
        return None

    @hookimpl(trylast=True)
    async def dsh_pre_execute(
        self, execution: ToolExecution, next: Callable[[], Awaitable[PreToolDecision]]
    ) -> PreToolDecision:
        if self._counted(execution):
            reason = self._spent(scope_id(execution.agent), execution.name)
            if reason is not None:
                return Deny(reason)
        return await next()

    @hookimpl(tryfirst=True)
    async def dsh_execute(
        self, execution: ToolDispatchExecution, next: Callable[[], Awaitable[ToolExecutionResult]]
    ) -> ToolExecutionResult:
        if not self._counted(execution):
            return await next()
        agent = scope_id(execution.agent)
        # Checked and counted with no await in between: concurrent calls cannot both take the last one.
        reason = self._spent(agent, execution.name)
        if reason is not None:
            return failure_result(reason, ErrorCode.DENIED, plugin=PLUGIN_NAME)
        self._counts[(agent, None)] = self.used(agent) + 1
        self._counts[(agent, execution.name)] = self.used(agent, execution.name) + 1
        generation = self._generation, self._agent_generations.get(agent, 0)
        try:
            return await next()
        finally:
            if not execution.body_started and generation == (self._generation, self._agent_generations.get(agent, 0)):
                # The body never ran (stopped while waiting, refused, or answered by an
                # inner wrapper): the call was not made, so it costs nothing.
                self._counts[(agent, None)] -= 1
                self._counts[(agent, execution.name)] -= 1


@hookimpl
def dsh_setup(runtime: ToolRuntime, config: dict[str, Any]) -> None:
    """Register :class:`CallLimits` when a budget is configured."""
    settings = structure_table(LimitsSettings, config, "[plugins.limits]")
    if settings.max_calls is None and not settings.per_tool:
        why = "no budget is set: set max_calls or per_tool to limit calls"
        report_inert_keys(runtime, "limits", config, "max_calls", why)
        return
    runtime.plugins.register(CallLimits(settings, runtime), name=PLUGIN_NAME)
