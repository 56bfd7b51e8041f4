"""Async waterfalls built from pluggy's ordered hookimpls.

pluggy calls hooks synchronously and cannot await, so the runtime takes each
hook's implementations in pluggy's own call order and chains them itself: the
first listener receives a ``next`` that runs the second, and so on down to a
built-in base. Chains are cached per hook and rebuilt only when the plugin set
changes, so a waterfall with no listeners costs nothing per call.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any, Final

import attrs
import pluggy
import trio

from . import hookspecs
from ._errors import PolicyError
from ._execution import ScopeKey, scope_chain
from ._results import sole_exception
from ._suspension import can_suspend, suspends_beyond_next

__all__ = [
    "INTERRUPTED",
    "CallHooks",
    "Chain",
    "DshPluginManager",
    "HookChains",
    "Listener",
    "add_missing_hookspecs",
    "is_fatal",
    "lone_exit",
    "plain_waterfall_listeners",
    "registration_problems",
    "split_fatal",
    "unknown_hooks",
    "unmarked_hooks",
    "unsupported_hookimpls",
]

_FATAL = (trio.Cancelled, KeyboardInterrupt, SystemExit, GeneratorExit)

# A traced listener's outcome when a cancellation unwound through it: it decided nothing, but it ran.
INTERRUPTED: Final = object()

WATERFALLS = ("dsh_pre_execute", "dsh_execute", "dsh_post_execute", "dsh_code_dispatch_log")
_PIPELINE_HOOKS = ("dsh_pre_execute", "dsh_execute", "dsh_post_execute", "dsh_result", "dsh_call_unwound")
SPEC_NAMES = tuple(name for name in dir(hookspecs) if name.startswith("dsh_"))
# The one hook the runtime calls through pluggy: pluggy's wrappers run there and nowhere else,
# and pluggy calls it synchronously, so a coroutine it got back would never run.
_CALLED_BY_PLUGGY = ("dsh_tools_change",)
# Hooks whose listeners are called synchronously (by pluggy, or by the runtime as a call unwinds,
# when an await would only be cancelled again): an async def listener's coroutine would never run.
_SYNC_HOOKS = ("dsh_tools_change", "dsh_call_unwound")


def is_fatal(exc: BaseException) -> bool:
    """Whether an exception must escape containment (cancellation, interpreter exit).

    dsh_plugins._cut_short.what_cut walks a group the same way but names the cause for a record.
    """
    pending: list[BaseException] = [exc]
    while pending:
        current = pending.pop()
        if isinstance(current, _FATAL):
            return True
        if isinstance(current, BaseExceptionGroup):
            pending.extend(current.exceptions)
    return False


def split_fatal(exc: BaseException) -> tuple[BaseException | None, BaseException | None]:
    """``exc`` as (the part that must propagate, the part a failure result holds).

    Unlike :func:`sole_exception`, it keeps every exception of a group, sorted into two.

    A task group inside a body or a listener whose cleanup fails while a
    cancellation unwinds it raises both at once, grouped: the ``Cancelled`` must
    still reach the cancel scope that owns it, and the failure must not be lost
    with it (nor escape ``execute`` once that scope has taken its part).
    """
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(_FATAL)
    return (exc, None) if isinstance(exc, _FATAL) else (None, exc)


def lone_exit(exc: BaseException) -> BaseException:
    """``exc``, or the ``KeyboardInterrupt``/``SystemExit`` it groups when that is all it holds (at any depth).

    A task group inside the call (a ``run_code`` run, a body's own nursery, a
    scheduler's) groups even a lone interrupt; trio itself lets one out of
    ``trio.run`` bare. A host catching ``KeyboardInterrupt`` must see the same
    exception whether or not the call it was cut in ran tasks.
    """
    inner = sole_exception(exc)
    return inner if isinstance(inner, _EXITS) else exc


_EXITS = (KeyboardInterrupt, SystemExit)


class DshPluginManager(pluggy.PluginManager):
    """A pluggy ``PluginManager("dsh")`` with the dsh hookspecs, versioned for chain caching."""

    def __init__(self, project_name: str = hookspecs.PROJECT_NAME) -> None:
        super().__init__(project_name)
        self.dsh_version = 0
        self.add_hookspecs(hookspecs)

    def register(self, plugin: object, name: str | None = None) -> str | None:
        """Register ``plugin``; refused (``PluginValidationError``) when a hookimpl would never run.

        A misspelt hook (``dsh_pre_exec``) would otherwise never be called: a
        policy that silently does not apply. A hookimpl marked
        ``optionalhook=True`` may name a hook that does not exist (yet). So are
        the shapes the runtime never runs (see :func:`unsupported_hookimpls`),
        such as a policy class registered instead of an instance of it.
        """
        holder = self.get_plugin(name) if name is not None else None
        if holder is not None:
            # pluggy's own message appends every registered plugin's repr: unreadable in a report.
            raise ValueError(
                f"plugin name {name!r} is already taken by {type(holder).__qualname__} "
                f"{getattr(holder, '__name__', '')}".rstrip()
                + "; register this object under another name"
            )
        result = super().register(plugin, name)
        self.dsh_version += 1
        if result is not None:
            found = registration_problems(self, plugin) + plain_waterfall_listeners(self, plugin)
            problems = [message for _, message in found + unmarked_hooks(self, plugin)]
            if problems:
                super().unregister(plugin)
                raise pluggy.PluginValidationError(plugin, "; ".join(problems))
        return result

    def get_canonical_name(self, plugin: object) -> str:
        """The name a plugin registered without one gets: its class and a per-object suffix.

        pluggy's default for an instance is ``str(id(plugin))``, a bare number
        that traces, reports and errors would show in place of the policy.
        """
        own_name = getattr(plugin, "__name__", None)
        if isinstance(own_name, str) and own_name:
            return own_name
        return f"{type(plugin).__qualname__}-{id(plugin):x}"

    def unregister(self, plugin: object | None = None, name: str | None = None) -> Any:
        result = super().unregister(plugin, name)
        self.dsh_version += 1
        return result

    def set_blocked(self, name: str) -> None:
        super().set_blocked(name)
        self.dsh_version += 1


def add_missing_hookspecs(pm: pluggy.PluginManager) -> None:
    """Give ``pm`` every dsh hookspec it does not have yet.

    Asking whether ``pm.hook`` has an attribute is not enough: registering a
    hookimpl before its spec makes pluggy create a spec-less caller for it.
    pluggy attaches a spec added later to such a caller (and validates the
    hookimpls it holds against it).
    """
    missing = [name for name in SPEC_NAMES if not _has_spec(pm, name)]
    if len(missing) == len(SPEC_NAMES):
        pm.add_hookspecs(hookspecs)
    elif missing:
        pm.add_hookspecs(type("MissingDshHookspecs", (), {name: getattr(hookspecs, name) for name in missing}))


def _has_spec(pm: pluggy.PluginManager, hook_name: str) -> bool:
    caller = getattr(pm.hook, hook_name, None)
    return caller is not None and caller.has_spec()


def unknown_hooks(pm: pluggy.PluginManager, plugin: object | None = None) -> list[tuple[object, str]]:
    """Every hookimpl (of ``plugin``, when given) of a hook that has no spec, as ``(plugin, message)``.

    What ``pm.check_pending()`` checks, but listing all offenders instead of
    raising for the first; ``optionalhook=True`` impls are exempt.
    """
    found: list[tuple[object, str]] = []
    for hook_name in list(vars(pm.hook)):
        if hook_name.startswith("_"):
            continue
        caller = getattr(pm.hook, hook_name)
        if caller.has_spec():
            continue
        for impl in caller.get_hookimpls():
            if impl.optionalhook or (plugin is not None and impl.plugin is not plugin):
                continue
            hint = difflib.get_close_matches(hook_name, SPEC_NAMES, n=1)
            found.append(
                (impl.plugin, f'unknown hook "{hook_name}"' + (f' (did you mean "{hint[0]}"?)' if hint else ""))
            )
    return found


def unsupported_hookimpls(pm: pluggy.PluginManager, plugin: object | None = None) -> list[tuple[object, str]]:
    """Every hookimpl (of ``plugin``, when given) of a dsh hook that the runtime never runs as written.

    The runtime calls the listeners of every dsh hook but ``dsh_tools_change``
    itself, so a pluggy ``wrapper``/``hookwrapper`` on one of them would never
    run; ``dsh_tools_change`` (by pluggy) and ``dsh_call_unwound`` (by the
    runtime) are called synchronously, so an ``async def`` (or generator) one
    would hand back a coroutine nobody runs. Each message
    names the hook and the plugin.
    """
    found: list[tuple[object, str]] = []
    for hook_name in SPEC_NAMES:
        caller = getattr(pm.hook, hook_name, None)
        if caller is None:
            continue
        for impl in caller.get_hookimpls():
            if plugin is not None and impl.plugin is not plugin:
                continue
            problem = _never_runs(hook_name, impl)
            if problem is not None:
                found.append((impl.plugin, f'{hook_name} of plugin "{impl.plugin_name}" {problem}'))
    return found


def plain_waterfall_listeners(pm: pluggy.PluginManager, plugin: object) -> list[tuple[object, str]]:
    """Waterfall hookimpls of ``plugin`` that are not ``async def``, as ``(plugin, message)``.

    Such a listener fails every call it sees (``POLICY_ERROR``), even one that
    returns ``next()``: refused at ``register()`` instead, as its mirror case,
    an ``async def`` on a hook called synchronously, is. (A plain pluggy
    manager has no ``register()`` of ours: there each call fails, naming it.)
    """
    found: list[tuple[object, str]] = []
    for hook_name in WATERFALLS:
        caller = getattr(pm.hook, hook_name, None)
        for impl in caller.get_hookimpls() if caller is not None else ():
            function = impl.function
            if (
                impl.plugin is plugin
                and not (impl.wrapper or impl.hookwrapper)  # refused as such
                and not (inspect.isasyncgenfunction(function) or inspect.isgeneratorfunction(function))  # likewise
                and not inspect.iscoroutinefunction(function)
            ):
                found.append(
                    (plugin, f'{hook_name} of plugin "{impl.plugin_name}" is not an async def, but its listeners are awaited: make it async def')
                )
    return found


def unmarked_hooks(pm: pluggy.PluginManager, plugin: object) -> list[tuple[object, str]]:
    """Callables of ``plugin`` named after a dsh hook but not marked ``@hookimpl``, as ``(plugin, message)``.

    pluggy registers only marked attributes: a policy whose decorator was
    forgotten registers fine and never runs.
    """
    found: list[tuple[object, str]] = []
    for hook_name in SPEC_NAMES:
        # Only what the object defines: a Mock or a proxy whose __getattr__ answers any name
        # defines no hook (and pluggy registers only what it finds on the object itself).
        if inspect.getattr_static(plugin, hook_name, None) is None:
            continue
        try:
            value = getattr(plugin, hook_name, None)
            marked = pm.parse_hookimpl_opts(plugin, hook_name) is not None
        except Exception:  # an attribute that raises when read is no hook
            continue
        if not callable(value) or marked:
            continue
        name = pm.get_name(plugin)
        if hasattr(value, f"{pm.project_name}_impl"):
            # Marked, but no function: pluggy takes routines only (a functools.partial, a callable object).
            problem = "is marked @hookimpl but is not a function, so pluggy never registers it: make it a def"
        else:
            problem = "is not marked @hookimpl, so it would never be called: decorate it with @hookimpl (from dsh_core import hookimpl)"
        found.append((plugin, f'{hook_name} of plugin "{name}" {problem}'))
    return found


def _never_runs(hook_name: str, impl: pluggy.HookImpl) -> str | None:
    if isinstance(impl.plugin, type) and _takes_self(impl.plugin, impl.function):
        # pluggy drops the unbound self from the argument names, so the call
        # itself fails, with a TypeError that says nothing about the cause.
        cls = impl.plugin.__qualname__
        return (
            f"is a method of the class {cls}, which was registered instead of an instance "
            f"(self would take the call's first argument): register an instance: {cls}()"
        )
    if impl.wrapper or impl.hookwrapper:
        if hook_name in _CALLED_BY_PLUGGY:
            return None
        flag = "wrapper=True" if impl.wrapper else "hookwrapper=True"
        if hook_name in WATERFALLS:
            instead = "a waterfall listener is an async def that wraps the rest of the chain by awaiting next()"
        else:
            instead = "write a plain hookimpl"
        return f"is a pluggy wrapper ({flag}), which the runtime never runs on {hook_name}: {instead}"
    if hook_name in _SYNC_HOOKS:
        if inspect.iscoroutinefunction(impl.function):
            kind, product = "an async def", "coroutine"
        elif inspect.isasyncgenfunction(impl.function):
            kind, product = "an async generator", "async generator"
        elif inspect.isgeneratorfunction(impl.function):
            kind, product = "a generator function", "generator"
        else:
            return None
        return f"is {kind}, but {hook_name} is called synchronously and its {product} would never run: make it a plain def"
    if hook_name != "dsh_setup" and (inspect.isasyncgenfunction(impl.function) or inspect.isgeneratorfunction(impl.function)):
        # (dsh_setup has its own refusal, with what setup must be, when the loader calls it.)
        # Calling it makes a generator nobody iterates: an audit observer wrote nothing, silently.
        kind = "an async generator" if inspect.isasyncgenfunction(impl.function) else "a generator function"
        return f"is {kind} (it yields), so its body would never run on {hook_name}: remove the yield"
    return None


def _takes_self(cls: type, function: Any) -> bool:
    """Whether ``function`` is a plain function of ``cls`` (not a static or class method) taking ``self``."""
    if not any(inspect.getattr_static(cls, attribute, None) is function for attribute in dir(cls)):
        return False
    try:
        first = next(iter(inspect.signature(function).parameters), None)
    except (TypeError, ValueError):
        return False
    return first == "self"


def registration_problems(pm: pluggy.PluginManager, plugin: object | None = None) -> list[tuple[object, str]]:
    """Every hookimpl (of ``plugin``, when given) the runtime would never run, as ``(plugin, message)``.

    :func:`unknown_hooks` and :func:`unsupported_hookimpls`: what
    ``DshPluginManager.register`` refuses and ``load_plugins`` rolls back.
    """
    return unknown_hooks(pm, plugin) + unsupported_hookimpls(pm, plugin)


@attrs.frozen(slots=True)
class Listener:
    """One hookimpl, prepared for direct calls."""

    fn: Callable[..., Any]
    plugin_name: str
    argnames: tuple[str, ...]
    positions: tuple[int, ...]  # where each of argnames sits in the spec's argument list
    positional: bool
    scope: ScopeKey | None
    problem: str | None  # why the listener cannot run (e.g. not async); calls then fail
    # Whether the listener can give control back to trio by itself (for a
    # waterfall: other than by awaiting next()); see _suspension.
    suspends: bool = True

    def call(self, ordered: tuple[Any, ...]) -> Any:
        """Call with the spec's arguments in spec order (a hookimpl may take a subset, by name)."""
        if self.positional:
            return self.fn(*ordered)
        return self.fn(**{name: ordered[index] for name, index in zip(self.argnames, self.positions, strict=True)})


async def _never_called() -> None:
    """The function of a listener with a ``problem``: the chain fails on reaching it instead."""


@attrs.frozen(slots=True)
class _HookListeners:
    listeners: tuple[Listener, ...]
    scoped: bool


class CallHooks:
    """The listeners one call sees on each pipeline hook, looked up once per call.

    The flags are computed once per plugin-set version: ``waterfalls_empty``
    (no listener on any waterfall) and, per waterfall, whether one of its
    listeners can suspend by itself (so a cancel scope is worth entering).
    """

    __slots__ = ("execute", "execute_suspends", "finish_suspends", "post", "post_suspends", "pre", "pre_suspends",
                 "result", "unwound", "waterfalls_empty")  # fmt: skip

    def __init__(
        self,
        pre: tuple[Listener, ...],
        execute: tuple[Listener, ...],
        post: tuple[Listener, ...],
        result: tuple[Listener, ...],
        unwound: tuple[Listener, ...],
    ) -> None:
        self.pre = pre
        self.execute = execute
        self.post = post
        self.result = result
        self.unwound = unwound
        self.waterfalls_empty = not (pre or execute or post)
        self.pre_suspends = any(listener.suspends for listener in pre)
        self.execute_suspends = any(listener.suspends for listener in execute)
        self.post_suspends = any(listener.suspends for listener in post)
        # Whether post-execute or an async observer can hold the call's ending up (a
        # scheduling hint: a plain def observer runs to its end when called).
        self.finish_suspends = self.post_suspends or any(
            listener.suspends and inspect.iscoroutinefunction(listener.fn) for listener in result
        )


class HookChains:
    """Per-hook listener lists in call order, cached while the plugin set is unchanged."""

    def __init__(self, plugins: pluggy.PluginManager) -> None:
        self._plugins = plugins
        self._cache: dict[str, _HookListeners] = {}
        self._version: int | None = None
        self._spec_args: dict[str, tuple[str, ...]] = {}
        self._call_hooks: dict[object, CallHooks] = {}
        # The hooks every agent sees when no listener is scoped (the common case): one attribute read per call.
        self._shared: CallHooks | None = None

    def for_call(self, agent: ScopeKey | None) -> CallHooks:
        """The pipeline hooks' listeners for a call of ``agent`` (cached per plugin-set version)."""
        version = getattr(self._plugins, "dsh_version", None)
        if version is not None and version == self._version:
            hooks = self._shared or self._call_hooks.get(agent)
            if hooks is not None:
                return hooks
        pre = self.listeners("dsh_pre_execute", agent)
        if not isinstance(self._plugins, DshPluginManager):
            pre = self._refusals() + pre
        hooks = CallHooks(
            pre,
            self.listeners("dsh_execute", agent),
            self.listeners("dsh_post_execute", agent),
            self.listeners("dsh_result", agent),
            self.listeners("dsh_call_unwound", agent),
        )
        if version is not None and version == self._version:
            scoped = any(self._cache[name].scoped for name in _PIPELINE_HOOKS if name in self._cache)
            if not scoped:
                self._shared = hooks
            else:
                if len(self._call_hooks) > 4096:
                    self._call_hooks.clear()  # agents may churn; keep the memo bounded
                self._call_hooks[agent] = hooks
        return hooks

    def _refusals(self) -> tuple[Listener, ...]:
        """A host's own manager's hookimpls that would never run, as outermost listeners that fail the call.

        ``DshPluginManager`` refuses them at ``register()``; a plain pluggy
        manager accepts them, and a policy that silently does not apply is
        worse than none, so every call fails ``POLICY_ERROR`` naming the plugin
        until it is removed. (Such a manager's listeners are looked up on every
        call anyway: it has no version to cache them by.)
        """
        pm = self._plugins
        problems = [(plugin, f"{pm.get_name(plugin)}: {message}") for plugin, message in unknown_hooks(pm)]
        problems += unsupported_hookimpls(pm)
        return tuple(
            Listener(
                fn=_never_called,
                plugin_name=pm.get_name(plugin) or "?",
                argnames=(),
                positions=(),
                positional=False,
                scope=None,
                problem=message,
                suspends=False,
            )
            for plugin, message in problems
        )

    def _hook_listeners(self, hook_name: str) -> _HookListeners:
        version = getattr(self._plugins, "dsh_version", None)
        if version is None or version != self._version:
            self._cache.clear()
            self._call_hooks.clear()
            self._shared = None
            self._version = version
        cached = self._cache.get(hook_name) if version is not None else None
        if cached is None:
            cached = self._build(hook_name)
            if version is not None:
                self._cache[hook_name] = cached
        return cached

    def listeners(self, hook_name: str, agent: ScopeKey | None) -> tuple[Listener, ...]:
        """The listeners of ``hook_name`` that see a call for ``agent``, outermost first."""
        version = getattr(self._plugins, "dsh_version", None)
        entry = self._cache.get(hook_name) if version is not None and version == self._version else None
        if entry is None:
            entry = self._hook_listeners(hook_name)
        if not entry.scoped:
            return entry.listeners
        chain = scope_chain(agent)
        return tuple(
            listener
            for listener in entry.listeners
            if listener.scope is None or any(listener.scope is key or listener.scope == key for key in chain)
        )

    def spec_args(self, hook_name: str) -> tuple[str, ...]:
        args = self._spec_args.get(hook_name)
        if args is None:
            spec = getattr(hookspecs, hook_name)
            args = self._spec_args[hook_name] = tuple(inspect.signature(spec).parameters)
        return args

    def _build(self, hook_name: str) -> _HookListeners:
        caller = getattr(self._plugins.hook, hook_name, None)
        if caller is None:
            return _HookListeners((), False)
        spec_args = self.spec_args(hook_name)
        waterfall = hook_name in WATERFALLS
        out: list[Listener] = []
        for impl in reversed(caller.get_hookimpls()):
            problem = None
            if impl.wrapper or impl.hookwrapper:
                if waterfall:
                    problem = f"{impl.plugin_name}: pluggy wrapper hookimpls are not supported on {hook_name}"
                else:
                    continue
            elif waterfall and not inspect.iscoroutinefunction(impl.function):
                problem = f"{impl.plugin_name}: {hook_name} listeners must be async def"
            argnames = tuple(impl.argnames)
            unknown = [name for name in argnames if name not in spec_args]
            if unknown and problem is None:
                problem = f"{impl.plugin_name}: {hook_name} has no argument(s) {', '.join(unknown)}"
            if problem is not None:
                suspends = False  # it never runs: the chain fails when it reaches it
            elif waterfall:
                suspends = suspends_beyond_next(impl.function)
            else:
                # An observer: only an async def one is awaited without a scope,
                # and only when it provably awaits nothing.
                suspends = can_suspend(impl.function)
            out.append(
                Listener(
                    fn=impl.function,
                    plugin_name=impl.plugin_name,
                    argnames=argnames,
                    positions=tuple(spec_args.index(name) if name in spec_args else -1 for name in argnames),
                    positional=argnames == spec_args,
                    scope=getattr(impl.plugin, "dsh_scope", None),
                    problem=problem,
                    suspends=suspends,
                )
            )
        return _HookListeners(tuple(out), any(listener.scope is not None for listener in out))


# States of _Next.result before the inner step has returned. Neither can be a
# listener's outcome, so "outcome is not nxt.result" alone tells a listener that
# returned its own outcome (or swallowed next()'s exception) from one that passed.
_UNCALLED: Any = object()
_PENDING: Any = object()
# Its coroutine ran and raised: the inner layers ran, and failed.
_STARTED: Any = object()
# Its listener returned (or raised) without calling it: the chain it would start is over.
_EXPIRED: Any = object()


class _Next:
    """The ``next`` handed to one listener: starts the rest of the chain, at most once.

    Calling it returns the inner step's coroutine instead of wrapping it in
    one of its own, so a waterfall layer costs the listener's frame and one
    step frame; the inner step reports its outcome back through ``result``.
    """

    __slots__ = ("_chain", "_index", "result")

    def __init__(self, chain: Chain, index: int) -> None:
        self._chain = chain
        self._index = index
        self.result: Any = _UNCALLED

    @property
    def called(self) -> bool:
        return self.result is not _UNCALLED and self.result is not _EXPIRED

    def __call__(self) -> Coroutine[Any, Any, Any]:
        if self.result is not _UNCALLED:
            owner = self._chain._listeners[self._index - 1].plugin_name
            if self.result is _EXPIRED:
                # Kept and called later (after the call's result was published, say), it
                # would run the rest of the chain, the body included, outside the call.
                raise PolicyError(f"{owner}: next() called after its listener returned")
            raise PolicyError(f"{owner}: next() may be called at most once per listener")
        self.result = _PENDING
        return self._chain._step(self._index, self)


class Chain:
    """One run of a waterfall: listeners, their arguments, the base and the result check.

    The base is ``base()`` awaited, or, without ``base``, the constant
    ``outcome`` (an allow-everything default needs no coroutine of its own).
    After the run, ``decider`` names the listener that produced the final
    outcome (``None`` when the base did) and ``blame`` the listener an
    exception came from.

    ``unchanged(outcome, first_argument)`` (pre-execute's: a ``Rewrite`` to the
    arguments the call has) returns ``None`` for a listener's own outcome that
    changes something, else the outcome it amounts to on its own (an
    ``Allow``). An outcome that changes nothing stands for what the layers
    inside its listener decided, and the listeners outside it see that in its
    place: the outcome ``next()`` returned; when the listener never called
    ``next()`` (or never awaited it), the inner layers run now (changing
    nothing is no way to skip them); when it swallowed ``next()``'s exception,
    the outcome it amounts to on its own (its decision over a failure, as any
    outcome it returns then is).
    """

    __slots__ = (
        "_base", "_check", "_count", "_first", "_listeners", "_ordered", "_outcome", "_second", "_unchanged", "blame",
        "blamed", "decider", "trace",
    )  # fmt: skip

    def __init__(
        self,
        listeners: Sequence[Listener],
        ordered: tuple[Any, ...],
        check: Callable[[Any], str | None],
        base: Callable[[], Awaitable[Any]] | None = None,
        outcome: object = None,
        trace: list[tuple[str, Any]] | None = None,
        unchanged: Callable[[Any, Any], Any] | None = None,
    ) -> None:
        self._listeners = listeners
        self._count = len(listeners)
        self._ordered = ordered
        # Every waterfall takes one or two arguments before next: pass them without building a tuple per layer.
        self._first = ordered[0]
        self._second = ordered[1] if len(ordered) == 2 else _UNCALLED
        self._base = base
        self._outcome = outcome
        self._check = check
        self._unchanged = unchanged
        self.decider: str | None = None
        self.blame: str | None = None
        self.blamed: BaseException | None = None
        # Each listener's (plugin name, outcome) as it returns, or (plugin name, INTERRUPTED) as a cancellation unwinds it.
        self.trace = trace

    def run(self) -> Coroutine[Any, Any, Any]:
        """The whole chain, outermost listener first."""
        return self._step(0, None)

    async def _step(self, index: int, caller: _Next | None) -> Any:
        try:
            if index == self._count:
                base = self._base
                outcome = self._outcome if base is None else await base()
            else:
                listener = self._listeners[index]
                if listener.problem is not None:
                    error = PolicyError(listener.problem)
                    self._blame(error, listener)
                    raise error
                nxt = _Next(self, index + 1)
                try:
                    if not listener.positional:
                        outcome = await listener.call((*self._ordered, nxt))
                    elif self._second is _UNCALLED:
                        outcome = await listener.fn(self._first, nxt)
                    else:
                        outcome = await listener.fn(self._first, self._second, nxt)
                except BaseException as exc:
                    if nxt.result is _UNCALLED:
                        nxt.result = _EXPIRED
                    # Blamed even when fatal: a failure grouped with a cancellation is still this listener's.
                    self._blame(exc, listener)
                    if self.trace is not None and split_fatal(exc)[1] is None:
                        # The listener returns no outcome to trace, but it was running. (A failure grouped
                        # with the cancellation is the call's failure instead, traced as its error step.)
                        self.trace.append((listener.plugin_name, INTERRUPTED))
                    raise
                if nxt.result is _UNCALLED:
                    nxt.result = _EXPIRED
                if outcome is not nxt.result:
                    problem = self._check(outcome)
                    if problem is not None:
                        error = PolicyError(f"{listener.plugin_name}: {problem}")
                        self._blame(error, listener)
                        raise error
                    alone = None if self._unchanged is None else self._unchanged(outcome, self._first)
                    if alone is None:
                        self.decider = listener.plugin_name
                    elif nxt.result is _EXPIRED or nxt.result is _PENDING:  # the inner layers never started
                        outcome = await self._step(index + 1, None)
                    elif nxt.result is _STARTED:  # they raised, and the listener swallowed it
                        outcome = alone
                        self.decider = listener.plugin_name
                    else:
                        outcome = nxt.result  # its decider, the inner layer's, is already set
                if self.trace is not None:
                    self.trace.append((listener.plugin_name, outcome))
            if caller is not None:
                caller.result = outcome
        except BaseException:
            if caller is not None:
                # Its inner layers ran and raised (entering this try costs nothing until then):
                # a listener that swallowed it and changes nothing decides on its own.
                caller.result = _STARTED
            raise
        return outcome

    def _blame(self, exc: BaseException, listener: Listener) -> None:
        if exc is not self.blamed:
            self.blamed = exc
            self.blame = listener.plugin_name

    def blame_for(self, exc: BaseException) -> str | None:
        return self.blame if exc is self.blamed else None
