"""``ToolRuntime``: the registry and the pipeline behind one host."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Final, Protocol, runtime_checkable

import attrs
import pluggy

from . import _pipeline, hookspecs
from ._arguments_text import model_arguments
from ._definition import ToolDefinition, ToolSchema, is_async_callable
from ._events import PIPELINE_EVENT_TYPES, send_event
from ._execution import (
    EXCLUSIVE,
    PARALLEL,
    Agent,
    ScopeKey,
    ToolExecution,
    ToolExecutionInput,
    ToolExecutionMode,
    scope_chain,
    scope_id,
)
from ._kept_files import KeptFiles, kept_by
from ._orphans import OrphanedWork, OrphanTracker
from ._registry import (
    RUN_CODE_NAME,
    Disposer,
    PresentationMode,
    Registry,
    ToolGuard,
    ToolRegistration,
    ToolRestriction,
    _View,
)
from ._waterfall import is_fatal

_events_logger = logging.getLogger("dsh_core")

PROVIDER_TOOL_NAME: Final = re.compile(r"[a-zA-Z0-9_-]{1,64}")
"""The tool names model providers accept (OpenAI's and Anthropic's rule)."""

__all__ = ["ApprovalService", "ModelTools", "ScopedToolRuntime", "ToolRuntime"]


@runtime_checkable
class ApprovalService(Protocol):
    """Answers ``Ask`` decisions: ``"allowed-once"``, ``"denied"``, ``"cancelled"`` or ``"unavailable"``.

    Only ``"allowed-once"`` lets the call continue; ``"unavailable"`` says no one
    can answer (a non-interactive run) and denies with that reason.

    ``request`` runs inside the call's cancel scope: when the caller's signal
    fires, it is cancelled like any other stage.

    A service may also offer ``async def standing_answer(execution) -> str |
    None``: an answer that needs no one to ask (a standing grant), or ``None``.
    Hosts that put questions to someone else first (``serve_registry`` asks
    the MCP client) consult it before asking.

    A service that keeps files of its own (a grants file) may name them in a
    ``kept_files`` mapping of path to what it is: the runtime's file tools
    refuse to write them (see :meth:`ToolRuntime.kept_file`).
    """

    async def request(self, execution: ToolExecution, reason: str | None) -> str: ...


def _checked_approval(service: object) -> ApprovalService | None:
    # Refused where it is configured: otherwise every Ask it answers fails POLICY_ERROR.
    if service is None:
        return None
    what = "approval must be an ApprovalService (an object with an async request method)"
    if not isinstance(service, ApprovalService):
        raise TypeError(f"{what}, got {type(service).__name__}")
    if not is_async_callable(service.request):
        raise TypeError(f"{what}: {type(service).__name__}.request is not async")
    return service


class RegistrationRecorder(Protocol):
    """Sees every change made through a runtime's registration methods while it is installed.

    The plugin loader installs one around a plugin's ``dsh_setup`` (see
    :meth:`ToolRuntime._recording`) so a failed plugin can be rolled back and
    its refusals reported. ``admit`` returns what to register (the definition
    itself, or a renamed copy) or raises to refuse it (it is then reported to
    ``refused`` like any other refusal), ``wrap_guard`` may replace a guard
    before it is added; ``admit_restriction``, ``admit_deferral`` and
    ``admit_presentation`` raise to refuse such a change before it is made;
    ``added`` gets the disposer of every change that went through.
    """

    def admit(self, definition: object, scope: ScopeKey | None) -> object: ...

    def admit_restriction(self, restriction: object, scope: ScopeKey | None) -> None: ...

    def admit_deferral(self, patterns: tuple[object, ...], scope: ScopeKey | None) -> None: ...

    def admit_presentation(self, mode: object, scope: ScopeKey | None) -> None: ...

    def refused(self, definition: object, scope: ScopeKey | None, error: Exception) -> None: ...

    def registered(self, definition: object, scope: ScopeKey | None, disposer: Disposer) -> None: ...

    def wrap_guard(self, guard: ToolGuard) -> ToolGuard: ...

    def added(self, disposer: Disposer) -> None: ...


@attrs.frozen(slots=True, kw_only=True)
class ModelTools:
    """The tools part of one model request: schemas and the instructions that go with them."""

    schemas: tuple[ToolSchema, ...]
    instructions: str


class ToolRuntime:
    """The tool registry and execution pipeline of one host.

    ``plugins`` is the pluggy ``PluginManager`` the pipeline's hooks come from
    (a fresh ``DshPluginManager`` when omitted; register hookimpl objects with
    ``runtime.plugins.register(obj)``). A host's own ``PluginManager("dsh")``
    is given the dsh hookspecs it lacks; it refuses nothing at ``register()``,
    so a hookimpl the runtime would never run (a misspelt hook, a wrapper)
    fails every call ``POLICY_ERROR`` naming its plugin instead. ``approval`` answers ``Ask``
    decisions; without it they deny. ``mode`` is the deployment-wide
    presentation (``"native"``, ``"code"`` or ``"both"``); Code Mode also needs
    ``code_runtime`` (see :mod:`dsh_core.code_mode`), whose sub-calls overlap up
    to ``max_parallel_sub_calls``. ``trace_decisions`` records on every result
    which listener, approval, guard and finaliser decided it. ``event_sink``
    is called ``(event_type, data)`` with Code Mode's durable dispatch events
    for every ``run_code`` sub-call (with or without an agent: the sink belongs
    to the runtime, not to an agent's session as in the original), the side
    events of orphaned threads, retries and reverts, and plugins'
    :meth:`send_event`. To keep them in a session log pass a
    ``SessionRecorder(log).event_sink``; ``SessionLog.append`` takes one
    ``{"type", "data"}`` mapping and is not a sink.
    """

    def __init__(
        self,
        plugins: pluggy.PluginManager | None = None,
        approval: ApprovalService | None = None,
        mode: PresentationMode = "native",
        *,
        code_runtime: Any = None,
        max_parallel_sub_calls: int = 10,
        trace_decisions: bool = False,
        event_sink: Callable[[str, Mapping[str, Any]], None] | None = None,
    ) -> None:
        from ._waterfall import DshPluginManager, HookChains, add_missing_hookspecs

        if plugins is None:
            plugins = DshPluginManager()
        elif not isinstance(plugins, pluggy.PluginManager):
            raise TypeError(f"plugins must be a pluggy.PluginManager, got {type(plugins).__name__}")
        elif plugins.project_name != hookspecs.PROJECT_NAME:
            raise ValueError(f'plugins must be a PluginManager("{hookspecs.PROJECT_NAME}"), got "{plugins.project_name}"')
        else:
            add_missing_hookspecs(plugins)
        approval = _checked_approval(approval)
        if type(trace_decisions) is not bool:
            raise TypeError(f"trace_decisions must be a bool, got {type(trace_decisions).__name__}")
        if event_sink is not None and not callable(event_sink):
            raise TypeError(f"event_sink must be callable or None, got {type(event_sink).__name__}")
        if type(max_parallel_sub_calls) is not int or max_parallel_sub_calls < 1:
            raise ValueError(f"max_parallel_sub_calls must be a positive integer, got {max_parallel_sub_calls!r}")
        self.plugins: pluggy.PluginManager = plugins
        self._approval = approval
        self.trace_decisions = trace_decisions
        self.max_parallel_sub_calls = max_parallel_sub_calls
        self.code_runtime = code_runtime
        # Receives durable side events (``tool/code-dispatch-start``, ``tool/code-dispatch``).
        self.event_sink = event_sink
        self._registry = Registry(default_mode=mode, on_change=self._notify_change)
        self._orphans = OrphanTracker(lambda: self.event_sink)
        self._chains = HookChains(plugins)
        # Innermost last: a plugin's setup may load plugins of its own.
        self._recorders: list[RegistrationRecorder] = []
        # Entry-point name -> the plugin object load_plugins registered under it, to refuse loading it twice.
        self._entry_point_plugins: dict[str, object] = {}
        # Files the host keeps (logs, ledger, configuration): the model's file tools must not write them.
        self.kept_files = KeptFiles()
        if code_runtime is not None or mode != "native":
            self._install_code_mode()

    def _install_code_mode(self) -> None:
        from .code_mode._bridge import build_run_code_tool

        self._registry.run_code = build_run_code_tool(self)
        self._registry._changed(notify=False)

    @property
    def approval(self) -> ApprovalService | None:
        """Answers ``Ask`` decisions (``None``: they deny); assigning it is checked as the constructor checks it."""
        return self._approval

    @approval.setter
    def approval(self, service: ApprovalService | None) -> None:
        self._approval = _checked_approval(service)

    def kept_file(self, path: str) -> str | None:
        """What ``path`` is when the host keeps it ("the audit log"), else ``None``: a file tool must not write it.

        The files of :attr:`kept_files` and those the approval service names in
        its optional ``kept_files`` mapping (a grants file), compared after
        ``realpath`` and by inode. Blocks on the file system: call it from a
        worker thread.
        """
        approval_files = getattr(self._approval, "kept_files", None)
        files = self.kept_files.items()
        if isinstance(approval_files, Mapping):
            files += [(str(name), str(what)) for name, what in approval_files.items()]
        return kept_by(path, files)

    @property
    def dry_run(self) -> bool:
        """Whether this runtime only rehearses calls (``dsh-tools simulate``): nothing it runs happens.

        A plugin that keeps durable records (an audit trail, an effect ledger,
        an exporter) checks it in ``dsh_setup`` and stays out of a dry run;
        ``dsh_result`` observers are not called in one.
        """
        return False

    def send_event(self, event_type: str, data: Mapping[str, Any]) -> None:
        """Deliver a plugin's side event to ``event_sink``, as the runtime delivers its own.

        Nothing happens without a sink. A sink that raises is logged as a warning
        (logger ``dsh_core``) and the caller goes on: an event records something
        that already happened, and a broken recorder must not undo or hide it.

        ``event_type`` may not be one the pipeline records itself (``tool/call``,
        ``tool/result``, ``tool/unwound``, ``tool/code-dispatch-start``, ``tool/code-dispatch``,
        ``tool/retry``, ``tool/orphaned``, ``tool/orphan-finished``): that is a
        ``ValueError``, since a session log holding a plugin's one could no
        longer be replayed, explained or simulated. Name events after the
        plugin (``"my-plugin/flushed"``).
        """
        if type(event_type) is not str or not event_type:
            raise TypeError(f"event_type must be a non-empty str, got {event_type!r}")
        if event_type in PIPELINE_EVENT_TYPES:
            raise ValueError(
                f'event type "{event_type}" is one the pipeline itself records (a session log would read it as '
                'its own and could not be replayed): give the event a name of its own, such as "my-plugin/flushed"'
            )
        if not isinstance(data, Mapping):
            raise TypeError(f"event data must be a Mapping, got {type(data).__name__}")
        send_event(self.event_sink, event_type, data, _events_logger)

    # -- registration ------------------------------------------------------------

    def register(self, definition: ToolDefinition, scope: ScopeKey | None = None) -> ToolRegistration:
        """Register ``definition`` globally or in ``scope``; returns its disposer.

        The disposer is a :class:`ToolRegistration` naming the tool as
        registered: under a host's ``[tool_prefixes]`` a plugin's tool is
        renamed, and ``registration.name`` is what the model calls.

        A scoped tool shadows a global of the same name for that scope and its
        descendants. Refused (``RegistrationError``/``JsonSchemaError``): anything
        that is not a ``ToolDefinition``, the reserved name ``run_code``, a
        duplicate name in the same layer, an unsupported parameter or output schema.
        """
        recorders = self._recorders
        if not recorders:
            disposer = self._registry.register(definition, scope)
        else:
            admitted: object = definition
            try:
                for recorder in reversed(recorders):
                    admitted = recorder.admit(admitted, scope)
                disposer = self._registry.register(admitted, scope)
            except Exception as exc:
                for recorder in recorders:
                    recorder.refused(admitted, scope, exc)
                raise
            for recorder in recorders:
                recorder.registered(admitted, scope, disposer)
        if PROVIDER_TOOL_NAME.fullmatch(disposer.name) is None:
            # A host without the CLI's `check` hears of it only here; the model provider refuses the
            # whole request that lists it, not just this tool.
            _events_logger.warning(
                'tool "%s" is registered, but its name does not match ^%s$, which model providers '
                "(OpenAI, Anthropic) require: a request listing it will be refused",
                disposer.name,
                PROVIDER_TOOL_NAME.pattern,
            )
        return disposer

    def restrict(self, restriction: ToolRestriction, scope: ScopeKey) -> Disposer:
        """Filter what ``scope`` inherits (its own registrations stay visible)."""
        for recorder in reversed(self._recorders):
            recorder.admit_restriction(restriction, scope)
        return self._recorded(self._registry.restrict(restriction, scope))

    def guard(self, guard: ToolGuard, scope: ScopeKey | None = None) -> Disposer:
        """Add a monotonic guard: it runs after the pre-execute waterfall and may only deny.

        ``guard(execution)`` returns ``None`` to leave the call alone or a reason
        string to deny it. Global guards see every call; scoped ones only calls of
        that scope and its descendants. Evaluation is live: a guard registered while
        a call's guards run (by an earlier guard, say) is consulted for that call
        too, and one removed before its turn is not.
        """
        if callable(guard) and is_async_callable(guard):
            # Checked before any wrapping hides it: its coroutine would be taken for the
            # reason and fail every call, never awaited.
            label = getattr(guard, "__qualname__", None) or type(guard).__qualname__
            raise TypeError(
                f"guard() takes a plain function returning None or a reason; {label} is async "
                "(a check that must await belongs in a dsh_pre_execute listener)"
            )
        for recorder in reversed(self._recorders):
            guard = recorder.wrap_guard(guard)
        return self._recorded(self._registry.guard(guard, scope))

    def present_as(self, mode: PresentationMode, scope: ScopeKey) -> Disposer:
        """Present ``scope``'s tools in ``mode`` (nearest declaration on the chain wins)."""
        for recorder in reversed(self._recorders):
            recorder.admit_presentation(mode, scope)
        if mode in ("code", "both") and self._registry.run_code is None:
            # Before the change is announced: a listener reading the scope's tools then sees run_code.
            # (Installed for good: only a scope presented in code or both ever shows it.)
            self._install_code_mode()
        return self._recorded(self._registry.present_as(mode, scope))

    def defer_tools(self, patterns: Iterable[str], scope: ScopeKey | None = None) -> Disposer:
        """Defer the tools matching these names or globs (``"demo__*"``) for ``scope`` and below.

        The same as each matching tool declaring ``defer_loading=True``, for
        tools registered by others (an MCP server's, a plugin's); it applies to
        tools registered later too (``run_code`` itself is never deferred).
        Returns the disposer that lifts it.

        Raises:
            RegistrationError: no patterns.
            TypeError: ``patterns`` is a string or holds something other than non-empty strings.
        """
        if self._recorders and not isinstance(patterns, str | bytes) and isinstance(patterns, Iterable):
            patterns = tuple(patterns)  # read once: the recorders and the registry see the same patterns
            for recorder in reversed(self._recorders):
                recorder.admit_deferral(patterns, scope)
        return self._recorded(self._registry.defer(patterns, scope))

    def load_tools(self, names: Iterable[str], scope: ScopeKey | None = None) -> Disposer:
        """Show ``scope`` the schemas of these deferred tools (``defer_loading=True``) from now on.

        Loading for ``None`` loads for every scope; a scope also sees what its
        ancestors loaded. The change fires ``dsh_tools_change`` (the model's next
        request should carry the new schemas). Naming a tool that is not
        deferred is allowed and changes nothing; the disposer unloads exactly
        this call's names (a name loaded twice stays loaded until both are
        disposed).

        Raises:
            RegistrationError: a name is not a tool ``scope`` can see.
            TypeError: ``names`` is a string or holds something other than strings.
        """
        return self._recorded(self._registry.load(names, scope))

    def deferred_tools(self, scope: ScopeKey | None = None, *, include_loaded: bool = False) -> list[ToolDefinition]:
        """The tools ``scope`` can call whose schemas it is not shown yet (deferred and not loaded).

        ``include_loaded=True`` adds the deferred tools already loaded for it.
        """
        view = self._registry.view(scope)
        names = view.deferrable if include_loaded else view.deferred
        return [tool for name, tool in view.tools.items() if name in names]

    def _recorded(self, disposer: Disposer) -> Disposer:
        for recorder in self._recorders:
            recorder.added(disposer)
        return disposer

    @contextmanager
    def _recording(self, recorder: RegistrationRecorder) -> Iterator[None]:
        """Report every registration, restriction, guard and presentation to ``recorder`` while the block runs."""
        self._recorders.append(recorder)
        try:
            yield
        finally:
            self._recorders.remove(recorder)

    # -- lookups -----------------------------------------------------------------

    @property
    def mode(self) -> PresentationMode:
        """The deployment-wide presentation mode."""
        return self._registry.default_mode

    def effective_mode(self, scope: ScopeKey | None = None) -> PresentationMode:
        """The presentation mode ``scope`` sees."""
        return self._registry.view(scope).mode

    def get(self, name: str, scope: ScopeKey | None = None) -> ToolDefinition | None:
        """The definition ``scope`` resolves for ``name``, or ``None`` when none is visible."""
        return self._registry.view(scope).tools.get(name)

    def schemas(self, scope: ScopeKey | None = None) -> list[ToolSchema]:
        """The model-facing schemas visible to ``scope`` (``run_code`` last when presented).

        Deferred tools (``defer_loading=True`` or :meth:`defer_tools`) are left
        out until loaded for the scope (:meth:`load_tools`). Each ``ToolSchema``
        holds only name, description and parameters, all immutable; the list is
        a fresh one each call, built from a cache that any registry change
        invalidates.
        """
        return list(self._registry.view(scope).schemas)

    def model_tools(self, scope: ScopeKey | None = None) -> ModelTools:
        """What a model request for ``scope`` carries: tool schemas and prompt instructions.

        ``native``: every visible schema, no instructions. ``code``: only the
        ``run_code`` schema, plus the SDK text and the rule that ``run_code`` is
        the only directly callable tool. ``both``: every schema and the SDK text.
        The SDK text is byte-identical while the visible tool set is unchanged;
        it is rendered once per visible tool set and reused until a change.
        """
        view = self._registry.view(scope)
        if view.mode == "native":
            return ModelTools(schemas=view.schemas, instructions="")
        cached: ModelTools | None = view.derived.get("model_tools")
        if cached is None:
            cached = view.derived["model_tools"] = self._code_model_tools(view)
        return cached

    def _code_model_tools(self, view: _View) -> ModelTools:
        from .code_mode import render_python_sdk
        from .code_mode._bridge import checked_code_runtime

        checked_code_runtime(self, view.mode)  # before rendering: a wire without a usable run_code is an error
        tools = [tool for name, tool in view.tools.items() if name != RUN_CODE_NAME and name not in view.deferred]
        sdk = render_python_sdk(tools)
        if view.mode == "code":
            rule = (
                f"`{RUN_CODE_NAME}` is the only tool you can call directly. Calling any other tool by name fails; "
                f"reach the tools below from inside a `{RUN_CODE_NAME}` program."
            )
            run_code = view.tools[RUN_CODE_NAME].schema
            return ModelTools(schemas=(run_code,), instructions=rule + "\n\n" + sdk)
        return ModelTools(schemas=view.schemas, instructions=sdk)

    def names(self, scope: ScopeKey | None = None) -> list[str]:
        """The visible tool names, in the order ``schemas()`` lists them."""
        return list(self._registry.view(scope).tools)

    def execution_mode(self, request: ToolExecutionInput) -> ToolExecutionMode:
        """``Parallel()`` only when the visible tool's classifier returns exactly ``True``.

        Unknown, hidden, collapsed, unclassified, raising or non-``True`` → ``Exclusive()``.
        """
        try:
            view = self._registry.view(request.agent)
        except AttributeError:
            if isinstance(request, ToolExecutionInput):
                raise
            # Checked only when it has already failed: this runs for every call of a turn.
            raise TypeError(f"execution_mode() takes a ToolExecutionInput, got {type(request).__name__}") from None
        tool = view.tools.get(request.name)
        if tool is None or tool.is_concurrency_safe is None:
            return EXCLUSIVE
        if request.parent is None and view.mode == "code" and request.name != RUN_CODE_NAME:
            return EXCLUSIVE
        try:
            verdict = tool.is_concurrency_safe(model_arguments(request.arguments))
        except BaseException as exc:
            if is_fatal(exc):
                raise
            return EXCLUSIVE
        return PARALLEL if verdict is True else EXCLUSIVE

    def present_call(self, name: str, arguments: Any, scope: ScopeKey | None = None) -> Any:
        """The pending UI card for a call, via the scope-visible tool's presenter (generic fallback)."""
        from ._replay import present_call

        return present_call(self, name, arguments, scope)

    def present_result(self, name: str, arguments: Any, result: Any, scope: ScopeKey | None = None) -> Any:
        """The completed UI card (``None``: keep the pending title and show the raw content).

        ``result`` is a ``ToolExecutionResult`` or the durable ``ToolResult`` projection.
        """
        from ._replay import ToolResult, present_result

        durable = result if isinstance(result, ToolResult) else ToolResult.of(result)
        return present_result(self, name, arguments, durable, scope)

    def orphaned_work(self) -> list[OrphanedWork]:
        """Worker threads still running for calls that were cancelled and have resolved.

        Filled by :meth:`ToolRunContext.run_in_thread`: a thread cannot be
        stopped, so a call cancelled while its thread ran resolves on time and
        leaves the thread here until it returns. Empty when nothing leaked.
        """
        return list(self._orphans.running())

    async def wait_for_orphans(self) -> None:
        """Wait until every orphaned worker thread has returned (at once when none runs).

        Works from any trio run, also a later one than the run whose call left
        the thread, and returns after the ``tool/orphan-finished`` events were
        sent. Bound it with ``trio.move_on_after`` before exiting: whatever is still
        listed by :meth:`orphaned_work` afterwards dies with the process.
        """
        await self._orphans.wait_idle()

    def scoped(self, scope: ScopeKey) -> ScopedToolRuntime:
        """A view of this runtime whose methods are bound to ``scope``."""
        return ScopedToolRuntime(self, scope)

    # -- execution ---------------------------------------------------------------

    # The pipeline function itself is the method: a wrapper would add a coroutine frame to every call.
    execute = _pipeline.execute

    # -- internals -----------------------------------------------------------------

    def _notify_change(self) -> None:
        self.plugins.hook.dsh_tools_change()

    def registrations(self) -> list[tuple[ScopeKey | None, ToolDefinition]]:
        """Every registered definition with its scope (``None`` = global), for diagnostics."""
        return self._registry.all_definitions()


def agent_scope(runtime: ToolRuntime, agent_id: str | None) -> ScopeKey | None:
    """The scope an agent id names (``--agent``, a logged call's ``agent``): a known scope, else a fresh ``Agent``.

    Known are the scopes the registry holds anything for (a tool, guard,
    restriction, presentation or deferral), those plugins are scoped to
    (``dsh_scope``), and their ancestors; one is named ``agent_id`` when its
    :func:`scope_id` is, the text logs record it by (an ``Agent``'s ``id``, a
    string key itself). The first found wins, registry scopes before plugins'.
    A fresh ``Agent`` inherits nothing: a scope holding only a guard or a
    restriction must be found, or the call runs without it.
    """
    if agent_id is None:
        return None
    for scope in _known_scopes(runtime):
        if scope_id(scope) == agent_id:
            return scope
    return Agent(id=agent_id)


def _known_scopes(runtime: ToolRuntime) -> Iterator[ScopeKey]:
    owners = runtime._registry.scopes()
    # list_name_plugin keeps registration order (get_plugins is a set); a blocked name maps to None.
    plugins = [plugin for _, plugin in runtime.plugins.list_name_plugin() if plugin is not None]
    owners += [getattr(plugin, "dsh_scope", None) for plugin in plugins]
    for owner in owners:
        if owner is not None:
            yield from scope_chain(owner)


class ScopedToolRuntime:
    """``ToolRuntime`` methods bound to one scope (``runtime.scoped(agent)``)."""

    __slots__ = ("_runtime", "scope")

    def __init__(self, runtime: ToolRuntime, scope: ScopeKey) -> None:
        self._runtime = runtime
        self.scope = scope

    @property
    def runtime(self) -> ToolRuntime:
        return self._runtime

    def register(self, definition: ToolDefinition) -> ToolRegistration:
        return self._runtime.register(definition, self.scope)

    def restrict(self, restriction: ToolRestriction) -> Disposer:
        return self._runtime.restrict(restriction, self.scope)

    def guard(self, guard: ToolGuard) -> Disposer:
        return self._runtime.guard(guard, self.scope)

    def present_as(self, mode: PresentationMode) -> Disposer:
        return self._runtime.present_as(mode, self.scope)

    def get(self, name: str) -> ToolDefinition | None:
        return self._runtime.get(name, self.scope)

    def schemas(self) -> list[ToolSchema]:
        return self._runtime.schemas(self.scope)

    def defer_tools(self, patterns: Iterable[str]) -> Disposer:
        return self._runtime.defer_tools(patterns, self.scope)

    def load_tools(self, names: Iterable[str]) -> Disposer:
        return self._runtime.load_tools(names, self.scope)

    def deferred_tools(self, *, include_loaded: bool = False) -> list[ToolDefinition]:
        return self._runtime.deferred_tools(self.scope, include_loaded=include_loaded)

    def effective_mode(self) -> PresentationMode:
        return self._runtime.effective_mode(self.scope)

    def names(self) -> list[str]:
        return self._runtime.names(self.scope)

    def model_tools(self) -> ModelTools:
        return self._runtime.model_tools(self.scope)
