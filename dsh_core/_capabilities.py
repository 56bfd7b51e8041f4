"""Capability manifests: which tools a plugin adds and which tools its policies may decide.

A plugin module (or the object its entry point names) declares::

    DSH_CAPABILITIES = {
        "tools": ["read_file", "list_*"],     # tools its dsh_setup may register
        "affects": ["read_file", "write_*"],  # tools its listeners and guards may decide
    }

Entries are :func:`fnmatch.fnmatchcase` globs on tool names, the plugin's own
names: a tool the host renamed with a ``[tool_prefixes]`` prefix
(``<prefix>__<name>``) matches by its name with or without that prefix. A
missing list is empty. ``dsh-tools plugins --capabilities`` lists every
plugin's manifest.

The manifest is enforced only with ``strict_capabilities = true`` in the host
configuration; then, for each entry-point plugin (a plugin without a manifest
counts as declaring nothing):

* a registration during its ``dsh_setup`` whose tool name matches no
  ``tools`` glob is refused with :class:`~dsh_core.RegistrationError` (and
  listed in ``PluginReport.refused``);
* its ``dsh_pre_execute``, ``dsh_execute`` and ``dsh_post_execute`` listeners
  (those of the entry-point object and of every plugin object its
  ``dsh_setup`` registers), and the guards its ``dsh_setup`` adds, may decide
  only calls of tools matching an ``affects`` glob. On any other call a
  listener must return exactly what ``next()`` returned (or let an exception
  ``next()`` raised pass unchanged) and a guard must return ``None``: anything
  else (``Deny``, ``Ask``, its own ``Allow`` or ``Accept``, a ``Block``, a
  replaced content, value or result, a guard's reason, an exception of its
  own) is refused, and the call fails with ``POLICY_ERROR`` naming the plugin
  (and saying what it raised, when it raised). A refused decision never lets a
  call through. ``trio.Cancelled``, ``KeyboardInterrupt`` and ``SystemExit``
  pass as they are;
* on those calls its listeners and guards see the call's signal read-only:
  ``execution.signal`` is a :class:`~dsh_core.CancelSignal` that reports,
  awaits and links like the caller's (``cancelled``, ``reason``, ``wait()``,
  ``CancelSignal.any``) but whose ``cancel()`` (its sources' too) raises
  :class:`CapabilityError`, and a ``dsh_execute`` wrapper's assignment to
  ``execution.signal`` raises it and replaces nothing. Either attempt also
  fails the call, caught or not. (The listener gets a copy of the
  ``ToolExecution``: same fields and ``token``, another object.);
* its ``dsh_code_dispatch_log`` listeners may change the logged copy only of
  sub-calls of tools in ``affects``: on any other sub-call, content of their
  own (or an exception of their own) is ignored with a warning (logger
  ``dsh_core``) and the log gets what the rest of the chain returned;
* what its ``dsh_setup`` changes about other tools is held to ``affects``
  too, and refused with :class:`~dsh_core.RegistrationError` (listed in
  ``PluginReport.refused``) before anything changes: ``restrict()`` may deny
  only tools in ``affects``, and an ``allow`` list (it hides every other tool,
  later ones too) needs ``"*"``; ``defer_tools()`` takes only patterns
  ``affects`` surely covers (:meth:`Capabilities.may_affect_every_match`);
  ``present_as()`` changes how every tool of a scope is shown, so it needs
  ``"*"``. ``load_tools()`` only shows schemas a deferral hid: not checked.

Only what a plugin adds during its ``dsh_setup`` is attributed to it: a tool,
plugin object, guard, restriction, deferral or presentation it adds later
(through a runtime it kept, from another hook or a task of its own) is neither
refused nor wrapped. Strict mode keeps a
well-meaning plugin to what it declared; it does not contain hostile code,
which runs in the host's process.

The check is installed by wrapping those listeners once, at load time, so a
host without strict mode pays nothing per call. A wrapper carries the
listener it wraps as ``__dsh_suspends_like__``: it suspends exactly when that
listener does (see :mod:`dsh_core._suspension`).
"""

from __future__ import annotations

import fnmatch
import functools
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

import attrs
import pluggy

from . import hookspecs
from ._errors import PolicyError
from ._execution import ToolDispatchExecution, ToolExecution, new_execution
from ._json import safe_repr
from ._signal import CancelSignal
from ._waterfall import is_fatal

if TYPE_CHECKING:
    from ._registry import ToolGuard
    from ._results import ToolExecutionResult

__all__ = [
    "MANIFEST_NAME",
    "Capabilities",
    "CapabilityError",
    "capabilities_of",
    "guard_guard",
    "guard_listeners",
]

logger = logging.getLogger("dsh_core")

MANIFEST_NAME: Final = "DSH_CAPABILITIES"
# The waterfalls whose listeners decide calls.
DECISION_HOOKS: Final = ("dsh_pre_execute", "dsh_execute", "dsh_post_execute")
LOG_HOOK: Final = "dsh_code_dispatch_log"
GUARDED_HOOKS: Final = (*DECISION_HOOKS, LOG_HOOK)
# Set on every listener wrapper: the listener whose code says whether the wrapper can suspend.
SUSPENDS_LIKE: Final = "__dsh_suspends_like__"


class CapabilityError(PolicyError):
    """A plugin acted outside its declared capabilities (``POLICY_ERROR``)."""


def _globs(value: object, key: str, problems: list[str]) -> tuple[str, ...]:
    if isinstance(value, str | bytes) or not isinstance(value, list | tuple):
        problems.append(f'"{key}" must be a list of tool-name globs, got {type(value).__name__}')
        return ()
    out: list[str] = []
    for index, item in enumerate(value):
        if type(item) is not str or not item:
            problems.append(f'"{key}"[{index}] must be a non-empty string, got {safe_repr(item)}')
        else:
            out.append(item)
    return tuple(out)


@attrs.frozen(kw_only=True)
class Capabilities:
    """A plugin's declared capabilities: the tools it adds and the tools its policies affect (globs)."""

    tools: tuple[str, ...] = ()
    affects: tuple[str, ...] = ()

    @classmethod
    def from_manifest(cls, manifest: object) -> Capabilities:
        """Parse a ``DSH_CAPABILITIES`` value.

        Raises:
            ValueError: it is not a mapping of ``tools``/``affects`` to lists of
                non-empty strings; the message lists every problem.
        """
        if not isinstance(manifest, Mapping):
            raise ValueError(f"{MANIFEST_NAME} must be a dict with tools and affects, got {type(manifest).__name__}")
        problems: list[str] = []
        unknown = sorted(str(key) for key in manifest if key not in ("tools", "affects"))
        if unknown:
            problems.append(f"unknown key(s) {', '.join(unknown)} (allowed: tools, affects)")
        tools = _globs(manifest.get("tools", ()), "tools", problems)
        affects = _globs(manifest.get("affects", ()), "affects", problems)
        if problems:
            raise ValueError(f"invalid {MANIFEST_NAME}: " + "; ".join(problems))
        return cls(tools=tools, affects=affects)

    def may_register(self, tool: str) -> bool:
        """Whether ``tool`` matches a ``tools`` glob."""
        return any(fnmatch.fnmatchcase(tool, glob) for glob in self.tools)

    def may_affect(self, tool: str, prefix: str | None = None) -> bool:
        """Whether ``tool`` matches an ``affects`` glob.

        ``prefix`` is the plugin's ``[tool_prefixes]`` prefix: a ``<prefix>__<name>``
        tool then also matches by ``<name>``, the name the plugin gave it.
        """
        if any(fnmatch.fnmatchcase(tool, glob) for glob in self.affects):
            return True
        if prefix is None:
            return False
        head = f"{prefix}__"
        return tool.startswith(head) and any(fnmatch.fnmatchcase(tool[len(head) :], glob) for glob in self.affects)

    def affects_every_tool(self) -> bool:
        """Whether an ``affects`` glob matches every tool name (``"*"``)."""
        return any(not glob.strip("*") for glob in self.affects)

    def may_affect_every_match(self, pattern: str, prefix: str | None = None) -> bool:
        """Whether every tool name the glob ``pattern`` matches is sure to match an ``affects`` glob.

        Conservative: ``pattern`` must be an ``affects`` glob itself, a name one
        matches, or lie under a ``<literal>*`` one (``fs_big_*`` under ``fs_*``);
        ``prefix`` as in :meth:`may_affect`.
        """
        if any(_within(pattern, glob) for glob in self.affects):
            return True
        if prefix is None:
            return False
        head = f"{prefix}__"
        return pattern.startswith(head) and any(_within(pattern[len(head) :], glob) for glob in self.affects)


_WILDCARDS: Final = frozenset("*?[")


def _within(pattern: str, glob: str) -> bool:
    """Whether every name ``pattern`` matches surely matches ``glob`` (``False`` when unsure)."""
    if not glob.strip("*") or pattern == glob:
        return True
    if not _WILDCARDS & set(pattern):
        return fnmatch.fnmatchcase(pattern, glob)
    # Under "<literal>*": every match of a pattern that starts with that literal starts with it too.
    head = glob[:-1]
    return glob.endswith("*") and not _WILDCARDS & set(head) and pattern.startswith(head)


def capabilities_of(plugin: object, module: object = None) -> Capabilities | None:
    """The manifest ``plugin`` (or else ``module``, its entry point's module) declares, or ``None``.

    Raises ``ValueError`` for a malformed manifest.
    """
    manifest = getattr(plugin, MANIFEST_NAME, None)
    if manifest is None and module is not None:
        manifest = getattr(module, MANIFEST_NAME, None)
    return None if manifest is None else Capabilities.from_manifest(manifest)


def _refusal(plugin: str, capabilities: Capabilities, tool: str, what: str, detail: str = "") -> CapabilityError:
    declared = ", ".join(capabilities.affects) or "nothing"
    return CapabilityError(
        f'plugin {plugin} may not {what} calls of tool "{tool}": its {MANIFEST_NAME} affects {declared} '
        f"(strict_capabilities){'; ' + detail if detail else ''}"
    )


def _raised(what: str, exc: BaseException) -> str:
    try:
        text = str(exc)
    except Exception:
        text = ""
    return f"{what} raised {type(exc).__name__}" + (f": {text}" if text else "")


class _Watch:
    """One run of a listener or guard on a call outside its plugin's ``affects``: what it tried that it may not."""

    __slots__ = ("capabilities", "plugin", "refusal", "tool")

    def __init__(self, plugin: str, capabilities: Capabilities, tool: str) -> None:
        self.plugin = plugin
        self.capabilities = capabilities
        self.tool = tool
        self.refusal: CapabilityError | None = None

    def refuse(self, what: str) -> CapabilityError:
        """The refusal of ``what``; the first one is kept, to fail the call even if the listener catches it."""
        error = _refusal(self.plugin, self.capabilities, self.tool, what)
        if self.refusal is None:
            self.refusal = error
        return error


class _ReadOnlySignal(CancelSignal):
    """A call's signal as a listener outside its plugin's ``affects`` sees it: everything but firing it.

    A plain signal's view asks the signal itself (``_of``); a fused signal's view
    is fused from views of its sources, so ``sources`` hands out no signal that
    can be fired either.
    """

    __slots__ = ("_of", "_watch")

    def __init__(self, of: CancelSignal | None, watch: _Watch) -> None:
        super().__init__()
        self._of = of
        self._watch = watch
        if of is not None:
            # Read by a linked scope and by CancelSignal.any.
            self._deadline, self._deadline_on = of._deadline, of._deadline_on

    @property
    def cancelled(self) -> bool:
        of = self._of
        if of is None:
            return super().cancelled
        if not of.cancelled:
            return False
        if not self._fired_at:
            # What a fused signal built on this view reads to tell which source fired first.
            self._fired_at = of._fired_at
            self._fired_when = of._fired_when
            self._reason = of.reason
        return True

    def cancel(self, reason: object = None) -> None:
        raise self._watch.refuse("cancel")

    async def wait(self) -> None:
        of = self._of
        if of is None:
            await super().wait()
        else:
            await of.wait()

    def subscribe(self, listener: Callable[[], None]) -> Callable[[], None]:
        of = self._of
        return super().subscribe(listener) if of is None else of.subscribe(listener)

    def _add_listener(self, listener: Callable[[], None]) -> Callable[[], None]:
        of = self._of
        return super()._add_listener(listener) if of is None else of.subscribe(listener)


def _read_only(signal: CancelSignal, watch: _Watch) -> CancelSignal:
    sources = signal._sources
    if not sources:
        return _ReadOnlySignal(signal, watch)
    view = _ReadOnlySignal(None, watch)
    view._sources = tuple(_ReadOnlySignal(source, watch) for source in sources)
    view._deadline, view._deadline_on = signal._deadline, signal._deadline_on
    return view


def _read_only_execution(execution: ToolExecution, watch: _Watch) -> ToolExecution:
    return new_execution(
        execution.call_id,
        execution.root_call_id,
        execution.name,
        execution.arguments,
        _read_only(execution.signal, watch),
        execution.token,
        execution.agent,
        execution.parent,
    )


class _ReadOnlyDispatch(ToolDispatchExecution):
    """A ``dsh_execute`` wrapper's view of a call outside its plugin's ``affects``: ``signal`` read-only too.

    Reads go to the dispatch's own view (the signal an inner or outer wrapper
    installed, what the body produced); assigning ``signal`` raises.
    """

    __slots__ = ("_copy", "_held", "_view", "_watch")

    _view: ToolDispatchExecution
    _watch: _Watch
    _held: tuple[CancelSignal, CancelSignal] | None
    _copy: ToolExecution | None

    def __init__(self, view: ToolDispatchExecution, watch: _Watch) -> None:
        # The fields read through _execution are the call's; only the execution handed out is a copy.
        _set_execution(self, view.execution)
        _set_view(self, view)
        _set_watch(self, watch)
        _set_held(self, None)
        _set_copy(self, None)

    @property
    def execution(self) -> ToolExecution:
        copy = self._copy
        if copy is None:
            copy = _read_only_execution(self._execution, self._watch)
            _set_copy(self, copy)
        return copy

    @property
    def signal(self) -> CancelSignal:
        current = self._view.signal
        held = self._held
        if held is None or held[0] is not current:
            held = (current, _read_only(current, self._watch))
            _set_held(self, held)
        return held[1]

    @signal.setter
    def signal(self, value: CancelSignal) -> None:
        raise self._watch.refuse("replace the signal of")

    @property
    def body_started(self) -> bool:
        return self._view.body_started

    @property
    def body_result(self) -> ToolExecutionResult | None:
        return self._view.body_result

    @property
    def may_suspend(self) -> bool:
        return self._view.may_suspend


# The slots' own setters (ToolDispatchExecution.__setattr__ refuses writes).
_set_execution = next(
    k.__dict__["_execution"] for k in ToolDispatchExecution.__mro__ if "_execution" in k.__dict__
).__set__
_set_view = _ReadOnlyDispatch.__dict__["_view"].__set__
_set_watch = _ReadOnlyDispatch.__dict__["_watch"].__set__
_set_held = _ReadOnlyDispatch.__dict__["_held"].__set__
_set_copy = _ReadOnlyDispatch.__dict__["_copy"].__set__


def _read_only_subject(subject: Any, hook_name: str, watch: _Watch) -> Any:
    """What a listener outside ``affects`` gets as its first argument: the same, with a read-only signal."""
    if isinstance(subject, ToolDispatchExecution):
        return _ReadOnlyDispatch(subject, watch)
    if isinstance(subject, ToolExecution):
        return _read_only_execution(subject, watch)
    execution = getattr(subject, "execution", None)
    if hook_name == LOG_HOOK and isinstance(execution, ToolExecution) and attrs.has(type(subject)):
        # A CodeDispatchLog: its execution is the run_code call's.
        return attrs.evolve(subject, execution=_read_only_execution(execution, watch))
    return subject


class _TrackedNext:
    """The listener's ``next``, remembering what it returned or raised (to recognise a pass-through)."""

    __slots__ = ("_next", "called", "error", "result")

    def __init__(self, nxt: Callable[[], Awaitable[Any]]) -> None:
        self._next = nxt
        self.called = False
        self.result: Any = None
        self.error: BaseException | None = None

    async def __call__(self) -> Any:
        try:
            result = await self._next()
        except BaseException as exc:
            self.error = exc
            raise
        self.called = True
        self.result = result
        return result

    def raised(self, exc: BaseException) -> bool:
        """Whether ``exc`` is what ``next()`` raised (alone or in exception groups of nothing else)."""
        inner = self.error
        if inner is None:
            return False
        if exc is inner:
            return True
        if isinstance(exc, BaseExceptionGroup):
            return all(self.raised(leaf) for leaf in exc.exceptions)
        return False


def _guarded(
    original: Callable[..., Awaitable[Any]],
    hook_name: str,
    argnames: tuple[str, ...],
    spec_args: tuple[str, ...],
    plugin: str,
    capabilities: Capabilities,
    prefix: str | None,
) -> Callable[..., Awaitable[Any]]:
    positions = tuple(spec_args.index(name) for name in argnames)
    next_at = spec_args.index("next")
    logs = hook_name == LOG_HOOK

    def own(ordered: tuple[Any, ...]) -> dict[str, Any]:
        return {name: ordered[index] for name, index in zip(argnames, positions, strict=True)}

    async def ignored(tracked: _TrackedNext, tool: str, what: str) -> Any:
        """A log listener's content of its own: logged as a warning, the rest of the chain's goes on."""
        logger.warning(
            "%s; logging what the rest of the chain returned",
            _refusal(plugin, capabilities, tool, "replace the logged content of", what),
        )
        if tracked.called:
            return tracked.result
        if tracked.error is not None:
            raise tracked.error  # the listener swallowed the chain's failure: it is the chain's to report
        return await tracked()

    @functools.wraps(original)
    async def guarded(*ordered: Any) -> Any:
        subject = ordered[0]  # the execution (the sub-call's log entry for the dispatch log)
        tool = subject.name
        if capabilities.may_affect(tool, prefix):
            return await original(**own(ordered))
        watch = _Watch(plugin, capabilities, tool)
        tracked = _TrackedNext(ordered[next_at])
        seen = (_read_only_subject(subject, hook_name, watch), *ordered[1:next_at], tracked, *ordered[next_at + 1 :])
        try:
            outcome = await original(**own(seen))
        except BaseException as exc:
            if is_fatal(exc) or tracked.raised(exc):
                raise  # cancellation, or the rest of the chain's failure passed on
            if logs:
                return await ignored(tracked, tool, _raised(f"its {hook_name} listener", exc))
            if watch.refusal is not None:
                raise watch.refusal from (None if exc is watch.refusal else exc)
            raise _refusal(plugin, capabilities, tool, "decide", _raised(f"its {hook_name} listener", exc)) from exc
        if watch.refusal is not None:
            if logs:
                return await ignored(tracked, tool, str(watch.refusal))
            raise watch.refusal  # it caught the refusal: the attempt still fails the call
        if tracked.called and outcome is tracked.result:
            return outcome
        if logs:
            return await ignored(tracked, tool, f"its {hook_name} listener returned content of its own")
        raise _refusal(plugin, capabilities, tool, "decide")

    setattr(guarded, SUSPENDS_LIKE, original)
    return guarded


def guard_listeners(
    pm: pluggy.PluginManager, owner: object, plugin: str, capabilities: Capabilities, *, prefix: str | None = None
) -> int:
    """Wrap ``owner``'s waterfall listeners so they may decide only tools in ``capabilities.affects``.

    ``prefix`` is the plugin's ``[tool_prefixes]`` prefix, if it has one (see
    :meth:`Capabilities.may_affect`). Listeners the runtime refuses anyway (not
    ``async def``, unknown argument names, pluggy wrappers) are left as they are
    so the refusal keeps its own message. Returns how many listeners were wrapped.
    """
    wrapped = 0
    for hook_name in GUARDED_HOOKS:
        caller = getattr(pm.hook, hook_name, None)
        if caller is None:
            continue
        spec_args = tuple(inspect.signature(getattr(hookspecs, hook_name)).parameters)
        for impl in caller.get_hookimpls():
            if impl.plugin is not owner or impl.wrapper or impl.hookwrapper:
                continue
            if not inspect.iscoroutinefunction(impl.function) or not set(impl.argnames) <= set(spec_args):
                continue
            guarded = _guarded(impl.function, hook_name, tuple(impl.argnames), spec_args, plugin, capabilities, prefix)
            # The runtime reads listeners from pluggy's hookimpls; the wrapper takes every spec argument.
            object.__setattr__(impl, "function", guarded)
            object.__setattr__(impl, "argnames", spec_args)
            wrapped += 1
    if wrapped and hasattr(pm, "dsh_version"):
        pm.dsh_version += 1  # drop the runtime's cached listener chains
    return wrapped


def guard_guard(guard: ToolGuard, plugin: str, capabilities: Capabilities, *, prefix: str | None = None) -> ToolGuard:
    """Wrap a guard so it may deny only tools in ``capabilities.affects`` (``prefix``: see ``guard_listeners``)."""

    @functools.wraps(guard)
    def checked(execution: ToolExecution) -> str | None:
        tool = execution.name
        if capabilities.may_affect(tool, prefix):
            return guard(execution)
        watch = _Watch(plugin, capabilities, tool)
        try:
            reason = guard(_read_only_execution(execution, watch))
        except BaseException as exc:
            if is_fatal(exc):
                raise
            if watch.refusal is not None:
                raise watch.refusal from (None if exc is watch.refusal else exc)
            raise _refusal(plugin, capabilities, tool, "deny", _raised("its guard", exc)) from exc
        if watch.refusal is not None:
            raise watch.refusal
        if reason is None:
            return None
        raise _refusal(plugin, capabilities, tool, "deny")

    return checked
