"""Policy dry-runs: replay a recorded session through a new policy stack, running no tool.

:func:`simulate` takes the ``tool/call`` events of a session log and runs each
call again through ``runtime.execute``, where ``runtime`` carries the policy
stack to try (typically plugins loaded from a new configuration into a
:class:`SimulationRuntime`). Nothing runs for real:

* every recorded tool name gets a stand-in definition with an any-JSON
  output, whose content is the recorded one. A tool registered under that
  name is replaced by a stand-in with its parameters, in its own scope: a
  :class:`SimulationRuntime` registers the plugins' tools that way, and in
  any other runtime the host's own tools are replaced for the length of the
  simulation (so the argument schema still applies, while the tool's output
  contract, renderer and ``finalize_content`` never see a replayed result).
  A name no global tool is registered under also gets a global stand-in,
  with open parameters;
* an outermost ``dsh_execute`` short-circuit answers every dispatch from the
  log, so neither the tool body nor any other ``dsh_execute`` wrapper runs.
  Post-execute policies see the recorded content (a recorded tool failure
  comes back as that failure; a call refused when recorded, whose body never
  ran, comes back as an empty success);
* ``Ask`` is answered ``"allowed-once"`` by a recording approval service, so
  guards and post-execute policies after the approval are evaluated too;
* ``dsh_result`` observers (and ``dsh_call_unwound`` listeners) are not
  called, in any runtime: no call happens, and a host's session recorder or
  audit trail would log the simulated results under the recorded calls' ids;
* a recorded agent id is the scope :func:`~dsh_core._runtime.agent_scope`
  finds for it (one the runtime's registry or plugins know, else a fresh
  ``Agent``).

Each call's outcome is reduced to a :class:`Verdict`, the same way for the
recorded and the simulated side:

* ``deny`` — the result failed with ``DENIED`` (a pre-execute ``Deny``, a guard,
  a denied approval, a post-execute ``Block``) or ``POLICY_ERROR`` (a policy
  broke or refused its contract; the call never ran unguarded). For the
  simulated side also ``UNKNOWN_TOOL``: every recorded name has a stand-in,
  so only the new stack (a restriction) can hide it, or a runtime that
  presents Code Mode, where no tool but ``run_code`` is called directly: such
  a call is not compared, with a note;
* ``ask`` — the decision trace shows an approval step (the policy asked),
  unless the denial came from a later stage; a recorded call has such a step
  only when its session was recorded with ``trace_decisions`` on;
* ``rewrite`` — allowed, but a pre-execute policy rewrote the arguments first
  (the decision trace shows the ``Rewrite``; its reason is the verdict's). A
  session recorded without ``trace_decisions`` shows it by the rewrite note in
  the result's ``contexts`` (``{"rewrite": {by, reason, from, to}}``); a note
  that does not say why leaves the recorded call not compared;
* ``allow`` — any other outcome: a success, or a failure of the tool itself
  (``TOOL_ERROR``, ``TOOL_TIMEOUT``, ``ABORTED``, ``INVALID_TOOL_OUTPUT``, ...);
* no verdict (not compared) — the policy never decided the recorded call
  (``INVALID_ARGS``, ``UNKNOWN_TOOL``, ``ABORTED_BEFORE_DISPATCH``, or no
  ``tool/result`` at all), or its untraced result holds a rewrite note that
  does not say why, or the call is a Code Mode ``run_code`` program
  (its sub-calls are not simulated).

A call *changes* when both verdicts exist and their decisions differ; a
different denial reason alone is not a change. A simulated call that never
reached policy (a tool registered now refuses the recorded arguments) is
noted with its failure code and, when the log holds the call's contract
fingerprint and the tool it met now enforces another contract, says so.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Mapping
from typing import Any, Final, Literal, TypeAlias

import attrs

from ._content import ContentBlock, UserMessage
from ._definition import ToolDefinition, ToolOutput, define_tool
from ._execution import ScopeKey, ToolExecution, ToolExecutionInput
from ._fingerprint import contract_changed
from ._json import JsonValue
from ._logged_calls import LoggedCall, logged_calls, session_events
from ._registry import RUN_CODE_NAME, Disposer, ToolRegistration, check_definition
from ._results import (
    ToolErrorInfo,
    ToolExecutionFailure,
    ToolExecutionResult,
    ToolExecutionSuccess,
    ToolFailure,
)
from ._runtime import ToolRuntime, agent_scope
from ._schema._raw import RawSchema
from ._session_log import SessionEvent, SessionLogError, SessionLogRead, structure_contexts
from ._signal import CancelSignal
from ._trace import DecisionTrace, trace_of
from ._waterfall import HookChains, Listener
from .hookspecs import hookimpl

__all__ = ["SimulatedCall", "SimulationReport", "SimulationRuntime", "Verdict", "simulate"]

Decision: TypeAlias = Literal["allow", "deny", "ask", "rewrite"]

REFUSED_CODES: Final = frozenset({"DENIED", "POLICY_ERROR"})
"""Failure codes that mean the pipeline refused the call."""
UNDECIDED_CODES: Final = frozenset({"INVALID_ARGS", "UNKNOWN_TOOL", "ABORTED_BEFORE_DISPATCH"})
"""Failure codes of recorded calls the policy never decided."""


@attrs.frozen(kw_only=True)
class Verdict:
    """What the policy stack decided for one call: ``allow``, ``deny``, ``ask`` or ``rewrite``.

    ``reason`` is the denial message or the ``Ask`` reason; ``actor`` the plugin,
    guard or approval that decided, when known.
    """

    decision: Decision
    reason: str | None = None
    actor: str | None = None

    def describe(self) -> str:
        return self.decision + (f": {self.reason}" if self.reason else "")


@attrs.frozen(kw_only=True)
class SimulatedCall:
    """One recorded call: its recorded and simulated verdicts (``None``: not compared, see ``note``)."""

    call_id: str
    name: str
    agent: str | None
    recorded: Verdict | None
    simulated: Verdict | None
    note: str | None = None

    @property
    def changed(self) -> bool:
        return (
            self.recorded is not None
            and self.simulated is not None
            and self.recorded.decision != self.simulated.decision
        )

    @property
    def summary(self) -> str:
        """``would now deny: <reason>``, ``would now ask: ...``, ``would now allow (was ...)``, or ``unchanged``."""
        if self.recorded is None or self.simulated is None:
            return f"not compared: {self.note}" if self.note else "not compared"
        if not self.changed:
            return "unchanged"
        if self.simulated.decision == "allow":
            return f"would now allow (was {self.recorded.describe()})"
        return f"would now {self.simulated.describe()}"


@attrs.frozen(kw_only=True)
class SimulationReport:
    """Every recorded call of a simulation, in log order."""

    calls: tuple[SimulatedCall, ...]

    @property
    def changes(self) -> tuple[SimulatedCall, ...]:
        return tuple(call for call in self.calls if call.changed)

    @property
    def changed(self) -> bool:
        """Whether the new policy stack would decide any call differently (the CI signal)."""
        return any(call.changed for call in self.calls)


def _classify(
    is_error: bool,
    code: str | None,
    message: str | None,
    plugin: str | None,
    trace: DecisionTrace | None,
    *,
    unknown_denies: bool,
) -> Verdict | None:
    if is_error and code in UNDECIDED_CODES and not (unknown_denies and code == "UNKNOWN_TOOL"):
        return None
    steps = tuple(trace) if trace is not None else ()
    asked = next((step for step in steps if step.stage == "pre" and step.outcome.startswith("ask")), None)
    approval = next((step for step in steps if step.stage == "approval"), None)
    if is_error and code in REFUSED_CODES | {"UNKNOWN_TOOL"}:
        decider = next((step for step in reversed(steps) if step.outcome.startswith(("deny", "block", "error"))), None)
        if approval is not None and decider is approval:
            return Verdict(decision="ask", reason=_ask_reason(asked), actor=asked.actor if asked else None)
        return Verdict(decision="deny", reason=message, actor=plugin or (decider.actor if decider else None))
    if approval is not None:
        return Verdict(decision="ask", reason=_ask_reason(asked), actor=asked.actor if asked else None)
    rewritten = next((step for step in steps if step.stage == "pre" and step.outcome.startswith("rewrite: ")), None)
    if rewritten is not None:
        return Verdict(decision="rewrite", reason=rewritten.outcome.removeprefix("rewrite: "), actor=rewritten.actor)
    return Verdict(decision="allow")


def _ask_reason(step: Any) -> str | None:
    if step is None or not step.outcome.startswith("ask: "):
        return None
    reason: str = step.outcome.removeprefix("ask: ")
    return reason


def recorded_verdict(result: Mapping[str, Any] | None) -> Verdict | None:
    """The verdict a logged ``tool/result`` event's data shows (``None``: no result, or not decided)."""
    if result is None:
        return None
    is_error = bool(result.get("isError"))
    error = result.get("error") or {}
    raw_trace = result.get("trace")
    trace = DecisionTrace.from_json(raw_trace) if raw_trace is not None else None
    verdict = _classify(is_error, error.get("code"), error.get("message"), None, trace, unknown_denies=False)
    if trace is not None or verdict is None or verdict.decision != "allow":
        return verdict
    return _noted_rewrite(structure_contexts(result.get("contexts")))


def _noted_rewrite(contexts: Iterable[UserMessage]) -> Verdict | None:
    """An untraced result's verdict from the rewrite note the pipeline adds to every rewritten call.

    No note: the arguments ran as the model sent them (``allow``). A note that
    does not say who rewrote them and why gives no verdict: ``allow`` would hide a change.
    """
    for context in contexts:
        meta = context.meta
        if not isinstance(meta, Mapping) or "rewrite" not in meta:
            continue
        note = meta["rewrite"]
        if not isinstance(note, Mapping):
            return None
        reason, by = note.get("reason"), note.get("by")
        if not isinstance(reason, str):
            return None
        return Verdict(decision="rewrite", reason=reason, actor=by if isinstance(by, str) else None)
    return Verdict(decision="allow")


def simulated_verdict(result: ToolExecutionResult) -> Verdict | None:
    """The verdict of a simulated result (``UNKNOWN_TOOL`` counts as a denial: stand-ins cover every name)."""
    if isinstance(result, ToolExecutionFailure):
        info = result.error.info
        code, plugin = (info.code, info.plugin) if info is not None else (None, None)
        return _classify(True, code, result.error.message, plugin, trace_of(result), unknown_denies=True)
    return _classify(False, None, None, None, trace_of(result), unknown_denies=True)


class _Replayer:
    """The outermost ``dsh_execute`` wrapper: answers each dispatch from the log, never calling ``next``."""

    def __init__(self) -> None:
        self.call: LoggedCall | None = None  # the recorded call being simulated

    def content(self) -> tuple[ContentBlock, ...]:
        return self.call.content if self.call is not None else ()

    @hookimpl(tryfirst=True)
    async def dsh_execute(self, execution: Any, next: Any) -> ToolExecutionResult:
        recorded = self.call.result if self.call is not None else None
        error = (recorded.get("error") if recorded is not None else None) or {}
        code = error.get("code")
        if recorded is not None and recorded.get("isError") and code not in REFUSED_CODES | UNDECIDED_CODES:
            # The tool itself failed when recorded: hand post-execute that failure.
            info = ToolErrorInfo(name=str(error.get("name") or "ToolError"), code=str(code or "TOOL_ERROR"))
            return ToolExecutionFailure(
                error=ToolFailure(message=str(error.get("message") or ""), info=info), content=self.content()
            )
        return ToolExecutionSuccess(value=None, content=())


class _Approver:
    """Answers every ``Ask`` with ``"allowed-once"`` (the trace keeps that it asked)."""

    async def request(self, execution: ToolExecution, reason: str | None) -> str:
        return "allowed-once"


async def _never(args: Any) -> JsonValue:
    raise AssertionError("a policy simulation never runs a tool body")


# Stand-ins have their own open contract: comparing it with a recorded one would say nothing.
_STAND_INS: weakref.WeakSet[ToolDefinition] = weakref.WeakSet()


# A SimulationRuntime's stand-in for a plugin's tool, mapped to that tool: its contract is the one to compare.
_STOOD_IN_FOR: weakref.WeakKeyDictionary[ToolDefinition, ToolDefinition] = weakref.WeakKeyDictionary()


def _stand_in(name: str, replayer: _Replayer, real: ToolDefinition | None = None) -> ToolDefinition:
    """A tool of that name whose body never runs: open parameters, or ``real``'s (so its schema still applies)."""
    tool = define_tool(
        name=name,
        description=f"stand-in for {name} in a policy simulation",
        parameters=RawSchema(real.parameters) if real is not None else {},
        output=ToolOutput(schema={"type": "json"}, render=lambda args, value: replayer.content()),
        execute=_never,
    )
    if real is None:
        _STAND_INS.add(tool)
    else:
        _STOOD_IN_FOR[tool] = real
    return tool


def _unreached(result: ToolExecutionResult, tool: ToolDefinition | None, recorded_contract: str | None) -> str:
    """Why a simulated call never reached policy, and whether its tool's contract moved since it was recorded."""
    info = result.error.info if isinstance(result, ToolExecutionFailure) else None
    note = "the simulated call never reached policy" + (f" ({info.code})" if info is not None else "")
    real = _STOOD_IN_FOR.get(tool) if tool is not None else None
    if real is not None:
        tool = real
    if tool not in _STAND_INS and contract_changed(tool, recorded_contract):
        note += "; the tool's contract changed since the call was recorded"
    return note


class SimulationRuntime(ToolRuntime):
    """A :class:`ToolRuntime` for dry-runs: every tool registered is replaced by its stand-in.

    Load the policy plugins into it as into a real host: their listeners,
    guards and restrictions take effect, and each tool they register is
    checked as usual, kept in :attr:`set_aside` (``(scope, definition)``) and
    registered, in the same scope, as a stand-in of the same name (the same
    parameters, any-JSON output, a body that never runs). Restrictions and
    shadowing therefore see the same names as in the real host, and a recorded
    call the tool's parameters refuse now is noted as such (with whether its
    contract changed since it was recorded).

    It is a dry run (:attr:`dry_run` is true): ``dsh_result`` observers (and
    ``dsh_call_unwound`` listeners) are not called, since no call happens, and
    plugins that keep durable records (the audit log, the effect ledger) do not
    open them.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.set_aside: list[tuple[ScopeKey | None, ToolDefinition]] = []
        self._replayer = _Replayer()
        # No call happens in a dry run: nothing for a dsh_result observer (an audit trail,
        # a tracing exporter) to record.
        self._chains = _WithoutObservers(self.plugins)

    @property
    def dry_run(self) -> bool:
        return True

    def register(self, definition: ToolDefinition, scope: ScopeKey | None = None) -> ToolRegistration:
        tool = check_definition(definition)
        disposer = super().register(_stand_in(tool.name, self._replayer, tool), scope)
        entry = (scope, tool)
        self.set_aside.append(entry)

        def remove() -> None:
            disposer()
            if entry in self.set_aside:
                self.set_aside.remove(entry)

        return ToolRegistration(remove, disposer.definition)


_OBSERVERS = ("dsh_result", "dsh_call_unwound")


class _WithoutObservers(HookChains):
    """The runtime's hook chains with no ``dsh_result`` observers nor ``dsh_call_unwound`` listeners."""

    def listeners(self, hook_name: str, agent: ScopeKey | None) -> tuple[Listener, ...]:
        return () if hook_name in _OBSERVERS else super().listeners(hook_name, agent)


class _Scopes:
    """Recorded agent ids to scopes (see :func:`agent_scope`), each id resolved once per simulation."""

    def __init__(self, runtime: ToolRuntime) -> None:
        self._runtime = runtime
        self._known: dict[str, ScopeKey | None] = {}

    def __call__(self, agent: object) -> ScopeKey | None:
        if agent is None:
            return None
        key = str(agent)
        if key not in self._known:
            # One scope per id: a stateful policy (a rate limit, a grant's uses) sees one agent.
            self._known[key] = agent_scope(self._runtime, key)
        return self._known[key]


async def simulate(log: SessionLogRead | Iterable[SessionEvent], runtime: ToolRuntime) -> SimulationReport:
    """Replay every recorded ``tool/call`` through ``runtime``'s policies without running any tool.

    See the module documentation for what runs, what is stood in, and how
    verdicts are compared. ``runtime`` is left as it was: the stand-ins, the
    short-circuit and the approval answerer are removed again, its own tools
    put back, and its ``approval``, ``trace_decisions`` and observers restored.
    While it runs, ``runtime`` serves no real call: give it none (a host's
    runtime is best simulated between turns, or a :class:`SimulationRuntime`
    loaded with the same plugins used instead).

    Raises:
        SessionLogError: a logged result's content, trace or contexts are malformed.
    """
    events = session_events(log, "simulate")
    recorded_calls = logged_calls(events)
    replayer = runtime._replayer if isinstance(runtime, SimulationRuntime) else _Replayer()
    scopes = _Scopes(runtime)
    disposers: list[Disposer] = []
    notes: dict[str, str] = {}
    saved = (runtime.approval, runtime.trace_decisions, runtime._chains)
    out: list[SimulatedCall] = []
    try:
        _stand_in_for_registered(runtime, {call.name for call in recorded_calls}, replayer, disposers, notes)
        for call in recorded_calls:
            name = call.name
            if name == RUN_CODE_NAME or name in notes or runtime.get(name) is not None:
                continue
            try:
                disposers.append(ToolRuntime.register(runtime, _stand_in(name, replayer)))
            except Exception as exc:
                notes[name] = f"cannot stand in for this tool: {exc}"
        runtime.approval, runtime.trace_decisions = _Approver(), True
        if not isinstance(runtime._chains, _WithoutObservers):
            # A host's own observers (a session recorder, an audit trail) would log the
            # simulated results under the recorded calls' ids, as if they had run again.
            runtime._chains = _WithoutObservers(runtime.plugins)
        runtime.plugins.register(replayer, name="dsh-simulate-replayer")
        for call in recorded_calls:
            call_id, name, agent_id, result = call.call_id, call.name, call.agent, call.result
            try:
                recorded = recorded_verdict(result)
            except ValueError as exc:
                raise SessionLogError(f"call {call_id}: {exc}") from exc
            note = notes.get(name)
            if name == RUN_CODE_NAME:
                note = "a Code Mode program; its sub-calls are not simulated"
            elif result is None:
                note = "no result was recorded" if call.unwound is None else call.unsettled_note()
            elif recorded is None and not result.get("isError"):
                note = "the recorded result does not show what the policy decided"
            elif recorded is None:
                note = f"the recorded call never reached policy ({(result.get('error') or {}).get('code')})"
            simulated = None
            if note is None:
                replayer.call = call
                request = ToolExecutionInput(
                    call_id=call_id,
                    name=name,
                    arguments=call.arguments,
                    signal=CancelSignal(),
                    agent=scopes(agent_id),
                )
                simulated_result = await runtime.execute(request)
                simulated = simulated_verdict(simulated_result)
                if _hidden_by_code_mode(runtime, simulated_result, name, request.agent):
                    # The presentation mode is no policy: every direct call would read "would now deny".
                    simulated, note = None, _CODE_MODE_NOTE
                elif simulated is None:
                    note = _unreached(simulated_result, runtime.get(name, request.agent), call.contract)
            out.append(
                SimulatedCall(
                    call_id=call_id, name=name, agent=agent_id, recorded=recorded, simulated=simulated, note=note
                )
            )
    finally:
        if runtime.plugins.is_registered(replayer):
            runtime.plugins.unregister(replayer)
        runtime.approval, runtime.trace_decisions, runtime._chains = saved
        for disposer in reversed(disposers):
            disposer()
    return SimulationReport(calls=tuple(out))


_CODE_MODE_NOTE: Final = (
    "this runtime presents Code Mode to the agent, where tools are called from run_code programs, not "
    "directly (simulate on a runtime in native mode)"
)


def _hidden_by_code_mode(runtime: ToolRuntime, result: ToolExecutionResult, name: str, scope: ScopeKey | None) -> bool:
    """Whether ``result`` is ``UNKNOWN_TOOL`` only because the scope sees Code Mode (the tool is there)."""
    if not isinstance(result, ToolExecutionFailure) or result.error.info is None:
        return False
    return (
        result.error.info.code == "UNKNOWN_TOOL"
        and name != RUN_CODE_NAME
        and runtime.effective_mode(scope) == "code"
        and runtime.get(name, scope) is not None
    )


def _stand_in_for_registered(
    runtime: ToolRuntime, names: set[str], replayer: _Replayer, disposers: list[Disposer], notes: dict[str, str]
) -> None:
    """Put a stand-in in the place of every tool of the host's own registered under one of ``names``.

    In the tool's own scope and with its parameters, so the names each scope
    sees and the arguments each tool accepts stay as they are. The stand-in
    has none of the tool's output contract, renderer or finaliser: the recorded
    content reaches post-execute as it was logged (through the tool's output
    contract a replayed result would fail ``INVALID_TOOL_OUTPUT``, which skips
    post-execute), and no finaliser of the host's runs on it.
    """
    for scope, tool in runtime.registrations():
        name = tool.name
        if name not in names or name in notes or tool in _STAND_INS or tool in _STOOD_IN_FOR:
            continue  # not recorded, not replaceable, or a SimulationRuntime's stand-in already
        try:
            disposers.append(runtime._registry.substitute(_stand_in(name, replayer, tool), scope))
        except Exception as exc:
            notes[name] = f"cannot stand in for this tool: {exc}"
