"""Scoped tool registry: layers, shadowing, restrictions, guards and presentation modes.

One global layer plus one layer per scope key. A scope sees the global layer,
then its ancestors' layers (farthest first), then its own; nearer layers shadow
farther ones. Restrictions filter what a scope *inherits* and intersect across
the whole chain; a scope's own registrations are never filtered. Every
resolution is cached per scope and the cache is dropped on any change, so
lookups on the hot path are a dict access.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Hashable, Iterable
from typing import Any, Final, Literal, Self, TypeAlias, final

import attrs

from ._definition import ToolDefinition, ToolSchema
from ._errors import JsonSchemaError, RegistrationError, Violations
from ._execution import ScopeKey, ToolExecution, scope_chain
from ._json import safe_repr
from ._schema._subset import TOOL_ARGUMENTS_ROOT, assert_object_json_schema, assert_supported_json_schema

__all__ = ["RUN_CODE_NAME", "Disposer", "PresentationMode", "ToolGuard", "ToolRegistration", "ToolRestriction"]

RUN_CODE_NAME = "run_code"
PresentationMode: TypeAlias = Literal["native", "code", "both"]
PRESENTATION_MODES: tuple[str, ...] = ("native", "code", "both")
ToolGuard: TypeAlias = Callable[[ToolExecution], "str | None"]


def _names(value: object) -> frozenset[str] | None:
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise TypeError(f"a restriction filter must be a list of tool names, got {type(value).__name__}")
    names = tuple(value)
    for name in names:
        if type(name) is not str or not name:
            # No tool can be named "": an empty entry is a mistake (a split of an empty setting, say).
            raise TypeError(f"a restriction filter lists tool names (non-empty str), got {safe_repr(name)}")
    return frozenset(names)


@attrs.frozen(slots=True, kw_only=True)
class ToolRestriction:
    """A live filter over what a scope inherits: ``allow`` keeps only those names, ``deny`` removes names.

    Filters are compiled into private sets, so mutating the list you passed has no
    effect. A deny-only filter admits tools registered later; an allow filter
    excludes them.
    """

    allow: frozenset[str] | None = attrs.field(default=None, converter=_names)
    deny: frozenset[str] | None = attrs.field(default=None, converter=_names)

    def admits(self, name: str) -> bool:
        return (self.allow is None or name in self.allow) and (self.deny is None or name not in self.deny)


class Disposer:
    """Undoes exactly one registration. Idempotent; also a context manager.

    ``with runtime.register(tool):`` keeps the tool registered for the block.
    """

    __slots__ = ("_undo",)

    def __init__(self, undo: Callable[[], None]) -> None:
        self._undo: Callable[[], None] | None = undo

    def __call__(self) -> None:
        undo, self._undo = self._undo, None
        if undo is not None:
            undo()

    @property
    def disposed(self) -> bool:
        return self._undo is None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self()


@final
class ToolRegistration(Disposer):
    """What :meth:`~dsh_core.ToolRuntime.register` returns: its disposer, naming what it registered.

    ``definition`` is the tool as registered, which is not always the one
    passed in: a host's ``[tool_prefixes]`` renames a plugin's tools, so a
    plugin that tells the model to call one of its tools uses ``name``.
    """

    __slots__ = ("definition",)

    def __init__(self, undo: Callable[[], None], definition: ToolDefinition) -> None:
        super().__init__(undo)
        self.definition = definition

    @property
    def name(self) -> str:
        """The registered tool's name."""
        return self.definition.name


_MAX_CACHED_VIEWS: Final = 4096
"""Resolved views kept at once: past it the per-scope ones are dropped and rebuilt when next needed."""


class _Layer:
    __slots__ = ("deferring", "guards", "loaded", "mode", "restrictions", "stand_ins", "tools")

    def __init__(self) -> None:
        self.tools: dict[str, ToolDefinition] = {}
        # The registered tool a substitute() stands in for, by name, while it stands in: its
        # registration's disposer removes the stand-in, and no restore brings the tool back.
        self.stand_ins: dict[str, ToolDefinition] = {}
        self.restrictions: list[ToolRestriction] = []
        self.guards: list[ToolGuard] = []
        self.mode: PresentationMode | None = None
        # Deferred tools loaded for this scope, counted: each load_tools() disposer undoes its own.
        self.loaded: dict[str, int] = {}
        # defer_tools() patterns (fnmatch globs): tools they match are deferred here and below.
        self.deferring: list[tuple[str, ...]] = []

    def empty(self) -> bool:
        return not (self.tools or self.restrictions or self.guards or self.mode or self.loaded or self.deferring)


@attrs.frozen(slots=True)
class _View:
    """One scope's resolved tool set.

    ``derived`` caches what is computed from the view (the Code Mode SDK text,
    say): a change to the registry builds new views, so it never goes stale.
    """

    tools: dict[str, ToolDefinition]
    inherited_names: frozenset[str]
    schemas: tuple[ToolSchema, ...]
    deferrable: frozenset[str]  # deferred by declaration or pattern, loaded or not
    deferred: frozenset[str]  # of those, the ones not loaded: left out of ``schemas``
    guards: tuple[ToolGuard, ...]
    mode: PresentationMode
    derived: dict[str, Any] = attrs.field(factory=dict, eq=False, repr=False)


def check_definition(definition: object) -> ToolDefinition:
    """Refuse anything that is not a valid :class:`ToolDefinition`, with the reason."""
    if not isinstance(definition, ToolDefinition):
        raise RegistrationError(
            f"register() takes a ToolDefinition (see define_tool), got {type(definition).__name__}"
        )
    name = definition.name
    # The schemas first, as in the original: a broken definition is reported as broken whatever its name.
    try:
        assert_object_json_schema(definition.parameters, reason=TOOL_ARGUMENTS_ROOT)
    except JsonSchemaError as exc:
        wrapped = Violations([f'tool "{name}" parameters: {v}' for v in exc.violations], exc.omitted)
        raise JsonSchemaError(wrapped) from None
    try:
        assert_supported_json_schema(definition.output.schema)
    except JsonSchemaError as exc:
        wrapped = Violations([f'tool "{name}" output: {v}' for v in exc.violations], exc.omitted)
        raise JsonSchemaError(wrapped) from None
    if name == RUN_CODE_NAME:
        raise RegistrationError(
            f'tool name "{RUN_CODE_NAME}" is reserved for the Code Mode transport and cannot be registered or shadowed'
        )
    return definition


def _remove(entries: list[Any], entry: object) -> None:
    """Remove ``entry`` itself (equal entries are distinct registrations) if it is still there."""
    for index, existing in enumerate(entries):
        if existing is entry:
            del entries[index]
            return


class Registry:
    """The layered store behind ``ToolRuntime``; every mutation calls ``on_change``."""

    def __init__(self, *, default_mode: PresentationMode, on_change: Callable[[], None]) -> None:
        if default_mode not in PRESENTATION_MODES:
            raise ValueError(f"mode must be one of {PRESENTATION_MODES}, got {default_mode!r}")
        self.default_mode: PresentationMode = default_mode
        self._global = _Layer()
        self._layers: dict[Hashable, _Layer] = {}
        self._views: dict[Hashable, _View] = {}
        self._on_change = on_change
        self.run_code: ToolDefinition | None = None
        self.version = 0

    # -- mutation --------------------------------------------------------------

    def _layer(self, scope: ScopeKey | None, *, create: bool) -> _Layer | None:
        if scope is None:
            return self._global
        try:
            layer = self._layers.get(scope)
        except TypeError:
            raise TypeError(f"a scope must be None, an Agent or a hashable key, got {type(scope).__name__}") from None
        if layer is None and create:
            layer = self._layers[scope] = _Layer()
        return layer

    def _reclaim(self, scope: ScopeKey | None) -> None:
        if scope is not None:
            layer = self._layers.get(scope)
            if layer is not None and layer.empty():
                del self._layers[scope]

    def _changed(self, *, notify: bool = True) -> None:
        self._views.clear()
        self.version += 1
        if notify:
            self._on_change()

    def _announce(self, undo: Callable[[], object], scope: ScopeKey | None) -> None:
        """Notify a change just made; a tools-change listener that raises refuses it.

        The change is then undone (and that announced) before the listener's
        error reaches the caller, who gets no disposer: a change kept without
        one could never be taken back.
        """
        try:
            self._changed()
        except BaseException as refusal:
            undo()
            self._reclaim(scope)
            try:
                self._changed()
            finally:
                # The refusal is the caller's answer, not a second failure of the same listener.
                raise refusal

    def register(self, definition: object, scope: ScopeKey | None) -> ToolRegistration:
        tool = check_definition(definition)
        layer = self._layer(scope, create=True)
        assert layer is not None
        if tool.name in layer.tools:
            self._reclaim(scope)
            if scope is None:
                raise RegistrationError(
                    f'tool "{tool.name}" is already registered (for a per-agent variant, register it in that agent\'s scope)'
                )
            raise RegistrationError(f'tool "{tool.name}" is already registered in this scope')
        layer.tools[tool.name] = tool

        def unregister() -> None:
            current = self._layer(scope, create=False)
            if current is None:
                return
            entry = current.tools.get(tool.name)
            if entry is tool or (entry is not None and current.stand_ins.get(tool.name) is tool):
                del current.tools[tool.name]
                current.stand_ins.pop(tool.name, None)
                self._reclaim(scope)
                self._changed()

        def refused() -> None:
            if layer.tools.get(tool.name) is tool:
                del layer.tools[tool.name]

        self._announce(refused, scope)
        return ToolRegistration(unregister, tool)

    def substitute(self, definition: object, scope: ScopeKey | None) -> Disposer:
        """Put ``definition`` in the place of the tool of its name in ``scope``'s layer until the disposer runs.

        Every scope keeps the names it sees (restrictions and shadowing apply
        as before), so nothing is announced to ``dsh_tools_change``: a stand-in
        is a passing change, not a new tool set for the model. The disposer
        puts the original back if the substitute is still in its place; the
        original's own disposer, run meanwhile, removes the stand-in with it.

        Raises:
            RegistrationError: no tool of that name is registered in ``scope`` itself.
        """
        tool = check_definition(definition)
        layer = self._layer(scope, create=False)
        original = layer.tools.get(tool.name) if layer is not None else None
        if layer is None or original is None:
            raise RegistrationError(f'no tool "{tool.name}" is registered in this scope to substitute')
        layer.tools[tool.name] = tool  # the same key: the tool keeps its place in the listing
        layer.stand_ins.setdefault(tool.name, original)  # a stand-in for a stand-in: still the registered one
        self._changed(notify=False)

        def restore() -> None:
            current = self._layer(scope, create=False)
            if current is not None and current.tools.get(tool.name) is tool:
                current.tools[tool.name] = original
                if current.stand_ins.get(tool.name) is original:
                    del current.stand_ins[tool.name]
                self._changed(notify=False)

        return Disposer(restore)

    def restrict(self, restriction: ToolRestriction, scope: ScopeKey | None) -> Disposer:
        if not isinstance(restriction, ToolRestriction):
            raise TypeError(f"restrict() takes a ToolRestriction, got {type(restriction).__name__}")
        if scope is None:
            raise RegistrationError(
                "restrict() requires a scope: a global restriction would mask every agent; "
                "restrict the intended agent's scope instead"
            )
        if restriction.allow is None and restriction.deny is None:
            raise RegistrationError(
                "restrict(ToolRestriction()) is a no-op: pass allow and/or deny "
                "(an empty filter is almost always a configuration bug)"
            )
        named = sorted((restriction.allow or frozenset()) | (restriction.deny or frozenset()))
        if RUN_CODE_NAME in named:
            raise RegistrationError(
                f'restrict() cannot name the reserved Code Mode transport "{RUN_CODE_NAME}"; '
                "restrict end-capability tools instead"
            )
        known = self.view(scope).inherited_names
        unknown = [name for name in named if name not in known]
        if unknown:
            listed = ", ".join(f'"{n}"' for n in unknown)
            noun = "tool" if len(unknown) == 1 else "tools"
            known_text = ", ".join(sorted(known)) or "(none)"
            raise RegistrationError(
                f"restrict() names unknown inherited {noun} {listed}; known inherited tools: {known_text}"
            )
        layer = self._layer(scope, create=True)
        assert layer is not None
        layer.restrictions.append(restriction)

        def lift() -> None:
            current = self._layer(scope, create=False)
            if current is not None:
                for index, entry in enumerate(current.restrictions):
                    if entry is restriction:
                        del current.restrictions[index]
                        break
                else:
                    return
                self._reclaim(scope)
                self._changed()

        self._announce(lambda: _remove(layer.restrictions, restriction), scope)
        return Disposer(lift)

    def guard(self, guard: ToolGuard, scope: ScopeKey | None) -> Disposer:
        if not callable(guard):
            raise TypeError(f"guard() takes a callable, got {type(guard).__name__}")
        layer = self._layer(scope, create=True)
        assert layer is not None
        # A wrapper object makes duplicate registrations of one function independent.
        entry = _GuardEntry(guard)
        layer.guards.append(entry)

        def remove() -> None:
            current = self._layer(scope, create=False)
            if current is not None:
                for index, existing in enumerate(current.guards):
                    if existing is entry:
                        del current.guards[index]
                        self._reclaim(scope)
                        self._changed(notify=False)
                        return

        self._changed(notify=False)  # guards are not part of the visible tool set
        return Disposer(remove)

    def present_as(self, mode: PresentationMode, scope: ScopeKey | None) -> Disposer:
        if mode not in PRESENTATION_MODES:
            raise ValueError(f"present_as() mode must be one of {PRESENTATION_MODES}, got {mode!r}")
        if scope is None:
            raise RegistrationError(
                "present_as() requires a scope: the deployment-wide presentation is ToolRuntime(mode=...)"
            )
        layer = self._layer(scope, create=True)
        assert layer is not None
        if layer.mode is not None:
            raise RegistrationError(
                f'present_as("{mode}") conflicts with "{layer.mode}" already declared for this scope; '
                "one scope selects one presentation"
            )
        layer.mode = mode

        def restore() -> None:
            current = self._layer(scope, create=False)
            if current is not None and current.mode == mode:
                current.mode = None
                self._reclaim(scope)
                self._changed()

        def refused() -> None:
            if layer.mode == mode:
                layer.mode = None

        self._announce(refused, scope)
        return Disposer(restore)

    def defer(self, patterns: Iterable[str], scope: ScopeKey | None) -> Disposer:
        if isinstance(patterns, (str, bytes)) or not isinstance(patterns, Iterable):
            raise TypeError(f"defer_tools() takes a list of tool names or globs, got {type(patterns).__name__}")
        entry = tuple(patterns)
        for pattern in entry:
            if type(pattern) is not str or not pattern:
                raise TypeError(f"defer_tools() takes tool names or globs (non-empty str), got {safe_repr(pattern)}")
        if not entry:
            raise RegistrationError("defer_tools([]) defers nothing: pass tool names or globs")
        layer = self._layer(scope, create=True)
        assert layer is not None
        layer.deferring.append(entry)

        def undefer() -> None:
            current = self._layer(scope, create=False)
            if current is not None:
                for index, existing in enumerate(current.deferring):
                    if existing is entry:
                        del current.deferring[index]
                        self._reclaim(scope)
                        self._changed()
                        return

        self._announce(lambda: _remove(layer.deferring, entry), scope)
        return Disposer(undefer)

    def load(self, names: Iterable[str], scope: ScopeKey | None) -> Disposer:
        if isinstance(names, (str, bytes)) or not isinstance(names, Iterable):
            raise TypeError(f"load_tools() takes a list of tool names, got {type(names).__name__}")
        wanted = list(dict.fromkeys(names))
        for name in wanted:
            if type(name) is not str:
                raise TypeError(f"load_tools() takes tool names (str), got {safe_repr(name)}")
        visible = self.view(scope).tools
        unknown = [name for name in wanted if name not in visible]
        if unknown:
            raise RegistrationError(
                "load_tools() names tools this scope cannot see: " + ", ".join(f'"{name}"' for name in unknown)
            )
        if not wanted:
            return Disposer(lambda: None)
        layer = self._layer(scope, create=True)
        assert layer is not None
        for name in wanted:
            layer.loaded[name] = layer.loaded.get(name, 0) + 1

        def release(holder: _Layer) -> None:
            for name in wanted:
                count = holder.loaded.get(name, 0)
                if count <= 1:
                    holder.loaded.pop(name, None)
                else:
                    holder.loaded[name] = count - 1

        def unload() -> None:
            current = self._layer(scope, create=False)
            if current is None:
                return
            release(current)
            self._reclaim(scope)
            self._changed()

        self._announce(lambda: release(layer), scope)
        return Disposer(unload)

    # -- resolution ------------------------------------------------------------

    def view(self, scope: ScopeKey | None) -> _View:
        try:
            view = self._views.get(scope)
        except TypeError:
            raise TypeError(f"a scope must be None, an Agent or a hashable key, got {type(scope).__name__}") from None
        if view is None:
            if len(self._views) >= _MAX_CACHED_VIEWS:
                # Agents may churn (one per task, equal only to themselves): keep the cache
                # bounded, as the hook chains' memo is; the global view is the one most used.
                shared = self._views.get(None)
                self._views.clear()
                if shared is not None:
                    self._views[None] = shared
            view = self._views[scope] = self._resolve(scope)
        return view

    def _resolve(self, scope: ScopeKey | None) -> _View:
        chain = scope_chain(scope)  # nearest first
        layers = [layer for key in reversed(chain) if (layer := self._layers.get(key)) is not None]
        own = self._layers.get(scope) if scope is not None else None
        inherited: dict[str, ToolDefinition] = dict(self._global.tools)
        for layer in layers:
            if layer is not own:
                inherited.update(layer.tools)
        restrictions = [r for layer in layers for r in layer.restrictions]
        tools = {name: tool for name, tool in inherited.items() if all(r.admits(name) for r in restrictions)}
        if own is not None:
            tools.update(own.tools)
        mode = self.default_mode
        for key in chain:
            layer = self._layers.get(key)
            if layer is not None and layer.mode is not None:
                mode = layer.mode
                break
        if mode != "native" and self.run_code is not None:
            tools[RUN_CODE_NAME] = self.run_code
        guards = tuple(self._global.guards) + tuple(g for layer in layers for g in layer.guards)
        deferrable: frozenset[str] = frozenset()
        deferred: frozenset[str] = frozenset()
        patterns = [p for entry in self._global.deferring for p in entry]
        patterns += [p for layer in layers for entry in layer.deferring for p in entry]
        if patterns or any(tool.defer_loading for tool in tools.values()):
            deferrable = frozenset(
                name
                for name, tool in tools.items()
                if name != RUN_CODE_NAME
                and (tool.defer_loading or any(fnmatch.fnmatchcase(name, p) for p in patterns))
            )
            # Loaded for this scope, an ancestor or every scope (the global layer).
            loaded = set(self._global.loaded).union(*(layer.loaded for layer in layers))
            deferred = deferrable - loaded
        return _View(
            tools=tools,
            inherited_names=frozenset(inherited),
            schemas=tuple(tool.schema for name, tool in tools.items() if name not in deferred),
            deferrable=deferrable,
            deferred=deferred,
            guards=guards,
            mode=mode,
        )

    def scopes(self) -> list[Hashable]:
        """Every scope holding anything (a tool, guard, restriction, presentation, deferral or load), oldest first."""
        return list(self._layers)

    def all_definitions(self) -> list[tuple[ScopeKey | None, ToolDefinition]]:
        """Every registration, global first, for diagnostics (``dsh-tools check``)."""
        out: list[tuple[ScopeKey | None, ToolDefinition]] = [(None, t) for t in self._global.tools.values()]
        for scope, layer in self._layers.items():
            out.extend((scope, t) for t in layer.tools.values())
        return out


class _GuardEntry:
    __slots__ = ("fn",)

    def __init__(self, fn: ToolGuard) -> None:
        self.fn = fn

    def __call__(self, execution: ToolExecution) -> Any:
        return self.fn(execution)

    @property
    def label(self) -> str:
        return getattr(self.fn, "__qualname__", None) or repr(self.fn)
