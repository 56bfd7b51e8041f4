"""Discovering and loading third-party plugins from the ``dsh`` entry-point group.

A distribution offers plugins by declaring entry points::

    [project.entry-points.dsh]
    permissions = "acme_dsh.permissions"          # a module
    audit = "acme_dsh.audit:plugin"               # an object in a module
    metrics = "acme_dsh.metrics:MetricsPlugin"    # a class: instantiated with no arguments

:func:`load_plugins` loads them one at a time, each contained: a plugin that
fails to import, register or set up is reported (:class:`PluginReport`) and
leaves nothing behind; the host keeps running. For every entry point, in
sorted (distribution name, entry-point name) order so hook order is the same
on every machine:

1. skip it when its name is in ``config.disabled_plugins`` (reported as
   disabled) or already taken by an earlier entry point or a plugin the host
   registered itself (reported as failed, stage ``"register"``; first wins,
   except that a name dsh-tools' own plugins take is theirs: another
   distribution's entry point of that name is the one skipped, wherever it sorts);
2. ``ep.load()`` (stage ``"import"``); a class is instantiated with no
   arguments. Everything the import raises is caught, ``SystemExit`` included;
   only ``KeyboardInterrupt`` propagates;
3. ``runtime.plugins.register(obj, name=ep.name)`` (stage ``"register"``);
   pluggy validates every hookimpl first, and the runtime's plugin manager
   refuses a hookimpl it would never run (of a hook that does not exist, a
   typo such as ``dsh_pre_exec``; a pluggy wrapper; an ``async def
   dsh_tools_change``), so a refused plugin leaves nothing. A plugin with no
   hookimpls at all could do nothing and fails too (a module whose hookimpls
   are methods of a class is one: its entry point should name the class);
4. the plugin's *own* ``dsh_setup(runtime, config)`` hookimpl, if it has one
   (stage ``"setup"``), with a fresh ``dict`` copy of its
   ``[plugins.<name>]`` table (``{}`` when there is none). If it raises, the
   plugin is rolled back: see *Rollback* below;
5. once all are loaded, every loaded plugin is checked for the hookimpls
   step 3 refuses (hooks that do not exist are what pluggy's
   ``check_pending`` finds; stage ``"validate"``; only a plain pluggy
   ``PluginManager`` given to the runtime lets one get this far). The
   offender is rolled back.

**Two plugin shapes.** A *stateless* plugin is a module whose functions are
marked with ``@dsh_core.hookimpl``. A plugin with *state* (per-runtime
caches, configuration, a handle to the runtime) should not keep it at module
level, because the module is shared by every runtime in the process. Its
entry-point module instead exposes a ``dsh_setup`` hookimpl that registers a
fresh instance for this runtime::

    @hookimpl
    def dsh_setup(runtime, config):
        settings = structure_table(Settings, config, "[plugins.permissions]")
        runtime.plugins.register(PermissionPolicy(runtime, settings), name="permissions-policy")

**Rollback.** While a plugin's ``dsh_setup`` runs, the loader records what it
adds to the runtime: every registration, restriction, guard and presentation
made through the runtime's methods (including ``runtime.scoped(...)`` views,
and whichever plugin's setup a method object was first taken in: what is
added belongs to the setup running at the time) and every plugin object it
registers with ``runtime.plugins``. When setup fails, or the
plugin later fails validation, all of it is undone in reverse order and the
entry-point plugin itself is unregistered. Registrations a plugin makes later
(outside ``dsh_setup``) are its own business.

Registrations the runtime refused during setup (a duplicate tool name, an
unsupported schema) are listed in :attr:`PluginReport.refused`, attributed to
the plugin that tried and, for a duplicate name, to the one that holds it,
whether or not the plugin caught the error.

**Capabilities.** A plugin may declare ``DSH_CAPABILITIES = {"tools": [...],
"affects": [...]}`` (see :mod:`dsh_core._capabilities`); a malformed manifest
fails the plugin at stage ``"import"``. The manifest is reported in
:attr:`LoadedPlugin.capabilities` and, with ``strict_capabilities = true``,
enforced: registrations outside ``tools`` during ``dsh_setup`` are refused
(listed in :attr:`PluginReport.refused`), and so are restrictions, deferrals
and presentations that reach beyond ``affects``; the plugin's listeners and
guards are wrapped after its setup so that decisions on tools outside
``affects`` fail the call with ``POLICY_ERROR``.

Nothing in-process protects the host from a plugin that hangs or crashes the
interpreter at import time. After adding or renaming entry points of an
*editable* install, reinstall it: the entry points live in its installed
metadata, not in ``pyproject.toml``.
"""

from __future__ import annotations

import difflib
import importlib.metadata
import inspect
import re
import sys
import traceback
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal, NoReturn

import attrs
import pluggy

from ._capabilities import MANIFEST_NAME, Capabilities, capabilities_of, guard_guard, guard_listeners
from ._config import DshConfig
from ._definition import ToolDefinition
from ._errors import ConfigError, RegistrationError
from ._json import safe_repr
from ._registry import PRESENTATION_MODES, Disposer, ToolGuard, ToolRestriction
from ._waterfall import registration_problems, unknown_hooks

if TYPE_CHECKING:
    from ._execution import ScopeKey
    from ._runtime import ToolRuntime

__all__ = [
    "FailedPlugin",
    "LoadedPlugin",
    "PluginReport",
    "RefusedRegistration",
    "discover_entry_points",
    "load_plugins",
    "unknown_hooks",
]

Stage = Literal["import", "register", "setup", "validate", "config"]


@attrs.frozen(kw_only=True)
class LoadedPlugin:
    """An entry point that loaded, registered and set up.

    ``tools`` names the tools its ``dsh_setup`` registered (in order);
    ``plugins`` the pluggy names of the plugin objects it registered (itself first);
    ``capabilities`` its ``DSH_CAPABILITIES`` manifest (``None`` when it declares none).
    """

    name: str
    value: str
    distribution: str | None
    version: str | None
    tools: tuple[str, ...] = ()
    plugins: tuple[str, ...] = ()
    capabilities: Capabilities | None = None


@attrs.frozen(kw_only=True)
class FailedPlugin:
    """An entry point that did not load; nothing of it stays registered.

    ``stage`` says how far it got; ``error`` is one line (``"ModuleNotFoundError:
    No module named 'x'"``); ``traceback`` the formatted traceback, when there was one.
    ``configured``: the configuration has a ``[plugins.<name>]`` table for it;
    ``violations``: every problem its ``dsh_setup`` found in that table, when it
    raised :class:`~dsh_core.ConfigError`. ``shadowed_by``: skipped because an
    earlier entry point with other code, or dsh-tools' own plugin, has its name,
    that one as ``"distribution (module:attr)"``.

    Stage ``"config"`` is no entry point but a ``[plugins.<name>]`` table that
    no plugin reads (:attr:`PluginReport.unmatched_tables`): ``name`` is the
    table's, ``value`` is empty and ``suggestion`` the closest plugin name, if any.
    """

    name: str
    value: str
    distribution: str | None
    version: str | None
    stage: Stage
    error: str
    traceback: str | None = attrs.field(default=None, eq=False, repr=False)
    configured: bool = False
    violations: tuple[str, ...] = ()
    shadowed_by: str | None = None
    suggestion: str | None = None


@attrs.frozen(kw_only=True)
class RefusedRegistration:
    """A registration the runtime refused while a plugin's ``dsh_setup`` ran.

    ``conflicts_with`` names the plugin that already holds the tool name (``None``
    when the refusal had another reason, ``"<host>"`` when the host registered it).
    ``tool`` is ``None`` for a restriction, deferral or presentation strict
    capabilities refused (``error`` says which).
    """

    plugin: str
    tool: str | None
    scope: Any
    error: str
    conflicts_with: str | None = None
    definition: ToolDefinition | None = attrs.field(default=None, eq=False, repr=False)


@attrs.frozen(kw_only=True)
class PluginReport:
    """What :func:`load_plugins` did, entry point by entry point, in load order."""

    loaded: tuple[LoadedPlugin, ...] = ()
    failed: tuple[FailedPlugin, ...] = ()
    disabled: tuple[str, ...] = ()
    refused: tuple[RefusedRegistration, ...] = ()
    # A misspelt table configures nothing: the policy it meant to set up would be silently off.
    unmatched_tables: tuple[FailedPlugin, ...] = ()
    # Loaded plugins with a [plugins.<name>] table but no dsh_setup taking ``config``: the table has no effect.
    ignored_tables: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """No entry point failed (disabled ones and caught refusals do not count)."""
        return not self.failed

    @property
    def config_failures(self) -> tuple[FailedPlugin, ...]:
        """The failures a host should not run without: a plugin it configured is missing.

        A failed plugin counts when its ``dsh_setup`` rejected its configuration
        (``violations``) or the configuration has a table for it (``configured``)
        and no plugin of that name loaded: a policy the file sets up, such as
        ``[plugins.permissions]``, would otherwise be silently off. A configured
        name that two entry points with different code provide counts too
        (``shadowed_by``): which one loaded depends on how the distributions
        sort, so an unrelated package could have replaced the policy. So does
        a table no plugin reads (:attr:`unmatched_tables`, stage ``"config"``):
        a misspelt ``[plugins.permisions]`` sets up no policy at all.
        """
        loaded = {plugin.name for plugin in self.loaded}
        failures = tuple(
            failed
            for failed in self.failed
            if (failed.violations or failed.configured)
            and (failed.name not in loaded or (failed.configured and failed.shadowed_by is not None))
        )
        return failures + self.unmatched_tables


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# The distribution whose entry points are the bundled plugins (pyproject.toml's [project.entry-points.dsh]).
OWN_DISTRIBUTION: Final = "dsh-tools"


def _is_own(ep: importlib.metadata.EntryPoint) -> bool:
    dist_name, _ = _dist_of(ep)
    return dist_name is not None and _normalize(dist_name) == OWN_DISTRIBUTION


def own_plugin_names(group: str = "dsh") -> frozenset[str]:
    """The entry-point names dsh-tools' own plugins take in ``group`` (none when it is not installed).

    Read from the installed distribution, so they are the ones a host would load.
    """
    try:
        points = importlib.metadata.distribution(OWN_DISTRIBUTION).entry_points
    except importlib.metadata.PackageNotFoundError:
        return frozenset()
    return frozenset(point.name for point in points if point.group == group)


def _dist_of(ep: importlib.metadata.EntryPoint) -> tuple[str | None, str | None]:
    dist = ep.dist
    if dist is None:
        return None, None
    return dist.name, dist.version


def discover_entry_points(group: str = "dsh") -> list[importlib.metadata.EntryPoint]:
    """The entry points of ``group``, sorted by (distribution name, entry-point name).

    ``importlib.metadata`` lists them in file-system order, which differs
    between machines; sorting makes the hook order reproducible.
    """

    def key(ep: importlib.metadata.EntryPoint) -> tuple[str, str]:
        dist_name, _ = _dist_of(ep)
        return (_normalize(dist_name) if dist_name else "", ep.name)

    return sorted(importlib.metadata.entry_points(group=group), key=key)


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, SystemExit):
        return f"SystemExit({safe_repr(exc.code)}): the plugin tried to exit the host"
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _import_path_hint(ep: importlib.metadata.EntryPoint, exc: BaseException) -> str:
    """Why a module sitting in the working directory was not found, when that is the cause.

    ``dsh-tools --plugin mymod:Cls`` next to ``mymod.py`` fails: a console
    script's import path starts at its own directory, not the working one
    (``python -m`` and the REPL differ, which makes it puzzling).
    """
    top = ep.module.partition(".")[0]
    if not isinstance(exc, ModuleNotFoundError) or exc.name != top:
        return ""
    cwd = Path.cwd()
    found = next((shown for shown, f in ((f"{top}.py", f"{top}.py"), (f"{top}/", f"{top}/__init__.py"))
                  if (cwd / f).is_file()), None)  # fmt: skip
    if found is None or any(Path(entry or ".").resolve() == cwd.resolve() for entry in sys.path):
        return ""
    return (
        f" ({found} is in the current directory, which is not on Python's import path: "
        "run with PYTHONPATH=. or install its project with pip install -e .)"
    )


def _format_traceback(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))


class _Ownership:
    """Everything one entry-point plugin added to the runtime, in order."""

    def __init__(self, name: str, plugin: object, capabilities: Capabilities | None = None) -> None:
        self.name = name
        self.plugin = plugin
        self.capabilities = capabilities
        self.plugins: list[object] = [plugin]
        self.disposers: list[Disposer] = []
        self.tools: list[tuple[ScopeKey | None, str]] = []
        self.reads_config = False  # one of its own dsh_setup hookimpls takes ``config``


class _SetupRecorder:
    """What the runtime reports while one plugin's ``dsh_setup`` runs, kept in its ownership."""

    def __init__(self, loader: _Loader, owned: _Ownership) -> None:
        self.loader = loader
        self.owned = owned
        self.strict = loader.config.strict_capabilities
        self.granted = owned.capabilities or Capabilities()

    def admit(self, definition: object, scope: ScopeKey | None) -> object:
        name = getattr(definition, "name", None)
        if self.strict and isinstance(name, str) and not self.granted.may_register(name):
            declared = ", ".join(self.granted.tools) or "none"
            raise RegistrationError(
                f'plugin {self.owned.name} may not register tool "{name}": its {MANIFEST_NAME} tools are '
                f"{declared} (strict_capabilities)"
            )
        prefix = self.loader.config.tool_prefixes.get(self.owned.name)
        if prefix is not None and isinstance(definition, ToolDefinition):
            # The manifest names the plugin's own tool names; the host renames them on the way in.
            return attrs.evolve(definition, name=f"{prefix}__{definition.name}")
        return definition

    def refused(self, definition: object, scope: ScopeKey | None, error: Exception) -> None:
        self.loader.note_refusal(self.owned, definition, scope, error)

    # A restriction, deferral or presentation changes which of the scope's tools can be
    # called or how the model sees them: in strict mode, only tools the plugin's "affects"
    # covers. Anything malformed is left for the registry to refuse in its own words.

    def admit_restriction(self, restriction: object, scope: ScopeKey | None) -> None:
        if not self.strict or not isinstance(restriction, ToolRestriction):
            return
        if restriction.allow is not None and not self.granted.affects_every_tool():
            what = "restrict a scope to an allow list, which hides every other tool"
            self._refuse(scope, what, need='an allow list needs "*"')
        prefix = self.loader.config.tool_prefixes.get(self.owned.name)
        for name in sorted(restriction.deny or ()):
            if not self.granted.may_affect(name, prefix):
                self._refuse(scope, f'restrict tool "{name}"')

    def admit_deferral(self, patterns: tuple[object, ...], scope: ScopeKey | None) -> None:
        if not self.strict:
            return
        prefix = self.loader.config.tool_prefixes.get(self.owned.name)
        for pattern in patterns:
            if isinstance(pattern, str) and pattern and not self.granted.may_affect_every_match(pattern, prefix):
                self._refuse(scope, f'defer tools matching "{pattern}"')

    def admit_presentation(self, mode: object, scope: ScopeKey | None) -> None:
        if not self.strict or mode not in PRESENTATION_MODES or scope is None:
            return
        if not self.granted.affects_every_tool():
            what = f'present a scope\'s tools as "{mode}", which affects every tool of the scope'
            self._refuse(scope, what, need='a presentation needs "*"')

    def _refuse(self, scope: ScopeKey | None, what: str, *, need: str = "") -> NoReturn:
        """Refuse the change ``what`` (listed in ``PluginReport.refused`` even if the plugin catches it)."""
        declared = ", ".join(self.granted.affects) or "nothing"
        error = RegistrationError(
            f"plugin {self.owned.name} may not {what}: its {MANIFEST_NAME} affects {declared}"
            f" (strict_capabilities{'; ' + need if need else ''})"
        )
        self.loader.note_refusal(self.owned, None, scope, error)
        raise error

    def registered(self, definition: object, scope: ScopeKey | None, disposer: Disposer) -> None:
        self.owned.disposers.append(disposer)
        name = getattr(definition, "name", None)
        if isinstance(name, str):
            self.owned.tools.append((scope, name))
            self.loader.holders.setdefault((scope, name), self.owned.name)

    def wrap_guard(self, guard: ToolGuard) -> ToolGuard:
        if self.strict and callable(guard):
            prefix = self.loader.config.tool_prefixes.get(self.owned.name)
            return guard_guard(guard, self.owned.name, self.granted, prefix=prefix)
        return guard

    def added(self, disposer: Disposer) -> None:
        self.owned.disposers.append(disposer)


class _Loader:
    def __init__(
        self,
        runtime: ToolRuntime,
        config: DshConfig,
        points: Iterable[importlib.metadata.EntryPoint] = (),
        group: str = "dsh",
    ) -> None:
        self.runtime = runtime
        self.group = group
        self.points = list(points)
        # dsh-tools' own entry points by name: theirs whatever the others sort before them.
        self.own: dict[str, importlib.metadata.EntryPoint] = {}
        for point in self.points:
            if _is_own(point):
                self.own.setdefault(point.name, point)
        self.pm: pluggy.PluginManager = runtime.plugins
        self.config = config
        self.loaded: list[tuple[importlib.metadata.EntryPoint, _Ownership]] = []
        self.failed: list[FailedPlugin] = []
        self.disabled: list[str] = []
        self.refused: list[RefusedRegistration] = []
        # Who registered a tool name, per scope, for duplicate attribution.
        self.holders: dict[tuple[Any, str], str] = {}
        for scope, definition in runtime.registrations():
            self.holders[(scope, definition.name)] = "<host>"

    def fail(
        self,
        ep: importlib.metadata.EntryPoint,
        stage: Stage,
        error: str,
        exc: BaseException | None = None,
        *,
        shadowed_by: str | None = None,
    ) -> None:
        dist, version = _dist_of(ep)
        violations: tuple[str, ...] = ()
        if isinstance(exc, ConfigError):
            violations = tuple(self.in_config_file(violation) for violation in exc.violations)
            if violations:  # ``error`` quotes the exception: quote the problems where the file has them
                error = error.replace(_one_line(exc), _one_line(ConfigError(list(violations))))
        self.failed.append(
            FailedPlugin(
                name=ep.name,
                value=ep.value,
                distribution=dist,
                version=version,
                stage=stage,
                error=error,
                traceback=_format_traceback(exc) if exc is not None else None,
                configured=ep.name in self.config.plugins,
                violations=violations,
                shadowed_by=shadowed_by,
            )
        )

    def in_config_file(self, violation: str) -> str:
        """A plugin's table problem as the file has it: its path first, and its table as spelt there.

        A plugin names its table ``[plugins.<name>]`` whichever file holds it;
        in a ``pyproject.toml`` that table is ``[tool.dsh.plugins.<name>]``.
        """
        source = self.config.source
        if source is None:
            return violation
        if violation.startswith("[plugins."):
            spelt = self.config.plugin_table("")[: -len("]")]  # "[plugins." or "[tool.dsh.plugins."
            violation = spelt + violation[len("[plugins.") :]
        return f"{source}: {violation}"

    # -- one entry point ----------------------------------------------------------

    def load(self, ep: importlib.metadata.EntryPoint, seen: dict[str, importlib.metadata.EntryPoint]) -> None:
        if ep.name in self.config.disabled_plugins:
            if ep.name not in self.disabled:
                self.disabled.append(ep.name)
            return
        own = self.own.get(ep.name)
        if own is not None and not _is_own(ep):
            # Not first come, first served: a distribution sorting before dsh-tools would
            # otherwise turn a bundled policy (timeout, permissions...) off with a warning.
            own_dist, _ = _dist_of(own)
            dist, _ = _dist_of(ep)
            self.fail(
                ep,
                "register",
                f'duplicate plugin name "{ep.name}": it is {own_dist}\' own plugin ({own.value}), which keeps it; '
                f"{dist or 'an entry point'} ({ep.value}) was skipped: uninstall it or rename its entry point",
                shadowed_by=f"{own_dist} ({own.value})" if own.value != ep.value else None,
            )
            return
        first = seen.get(ep.name)
        if first is not None:
            first_dist, _ = _dist_of(first)
            provider = f"{first_dist or 'an entry point'} ({first.value})"
            self.fail(
                ep,
                "register",
                f'duplicate plugin name "{ep.name}": already provided by {provider}; this one was skipped',
                # The same code under two names (a renamed distribution) reads the same table.
                shadowed_by=provider if first.value != ep.value else None,
            )
            return
        seen[ep.name] = ep
        if self.pm.is_blocked(ep.name):
            self.disabled.append(ep.name)
            return
        if self.pm.has_plugin(ep.name):
            holder = self.pm.get_plugin(ep.name)
            owner = next((o.name for _, o in self.loaded if any(p is holder for p in o.plugins)), None)
            by = f"by plugin {owner}'s dsh_setup" if owner else "by the host"
            self.fail(ep, "register", f'a plugin named "{ep.name}" is already registered {by}; skipped')
            return

        try:
            plugin = ep.load()
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            self.fail(ep, "import", _one_line(exc) + _import_path_hint(ep, exc), exc)
            return
        if isinstance(plugin, type):
            try:
                plugin = plugin()
            except BaseException as exc:
                if isinstance(exc, KeyboardInterrupt):
                    raise
                self.fail(
                    ep,
                    "import",
                    f"the entry point names the class {plugin.__qualname__}, which could not be "
                    f"instantiated without arguments: {_one_line(exc)}",
                    exc,
                )
                return

        if plugin is None:
            # pluggy's register(None) registers nothing and says so with None: the name read as disabled.
            self.fail(ep, "import", f"the entry point {ep.value} names None, not a plugin")
            return
        try:
            capabilities = capabilities_of(plugin, sys.modules.get(ep.module))
        except ValueError as exc:
            self.fail(ep, "import", str(exc))
            return
        except BaseException as exc:
            # Looking its manifest up ran the plugin's code (a lazy proxy's __getattr__): its fault, not the host's.
            if isinstance(exc, KeyboardInterrupt):
                raise
            self.fail(ep, "import", f"reading its capabilities failed: {_one_line(exc)}", exc)
            return

        holder = self.pm.get_name(plugin)
        if holder is not None:
            # pluggy's own message lists every registered plugin's repr: kilobytes over several lines.
            self.fail(
                ep,
                "register",
                f"{ep.value} is already loaded as plugin {holder!r}; one object is registered once "
                "(two entry points, or two --plugin options, name it)",
            )
            return
        try:
            registered = self.pm.register(plugin, name=ep.name)
        except BaseException as exc:
            if isinstance(exc, KeyboardInterrupt):
                raise
            self.fail(ep, "register", _one_line(exc), exc)
            return
        if registered is None:  # blocked between the check and now
            self.disabled.append(ep.name)
            return
        if not self.pm.get_hookcallers(plugin):
            # It could neither set anything up nor decide anything: loaded "ok", a policy would be silently off.
            self.pm.unregister(plugin)
            self.fail(ep, "register", self.inert(ep, plugin))
            return

        owned = _Ownership(ep.name, plugin, capabilities)
        try:
            with self.recording(owned):
                self.setup(plugin, self.config.plugin_config(ep.name), owned)
            if self.config.strict_capabilities:
                # Wrapped once here, so strict mode costs nothing per call when it is off.
                granted = owned.capabilities or Capabilities()
                # The manifest names the plugin's own tools; the host may have prefixed them.
                prefix = self.config.tool_prefixes.get(owned.name)
                for obj in owned.plugins:
                    guard_listeners(self.pm, obj, owned.name, granted, prefix=prefix)
        except BaseException as exc:
            self.rollback(owned)
            if isinstance(exc, KeyboardInterrupt):
                raise
            self.fail(ep, "setup", f"dsh_setup failed: {_one_line(exc)}", exc)
            return
        self.loaded.append((ep, owned))

    def inert(self, ep: importlib.metadata.EntryPoint, plugin: object) -> str:
        """Why a plugin without hookimpls failed, naming the classes to point at when its module has some.

        pluggy looks at the registered object's own attributes only, so a
        module whose hookimpls are methods of a class registers as nothing.
        """
        message = f"{ep.value} has no hookimpls, so it could do nothing"
        if not inspect.ismodule(plugin):
            return message
        classes = [
            name
            for name, value in vars(plugin).items()
            if isinstance(value, type) and value.__module__ == plugin.__name__ and self.has_hookimpls(value)
        ]
        if not classes:
            return message
        its = f"its class {classes[0]} has some" if len(classes) == 1 else f"its classes {', '.join(classes)} have some"
        targets = " or ".join(f'"{ep.value}:{name}"' for name in classes)
        return f"{message}; {its}: point the entry point at {targets} (a class is instantiated with no arguments)"

    def has_hookimpls(self, cls: type) -> bool:
        for name in dir(cls):
            try:
                if self.pm.parse_hookimpl_opts(cls, name) is not None:
                    return True
            except Exception:  # an attribute that raises when read is no hookimpl
                continue
        return False

    def setup(self, plugin: object, table: dict[str, Any], owned: _Ownership) -> None:
        impls = self.runtime.plugins.hook.dsh_setup.get_hookimpls()
        owned.reads_config = any(impl.plugin is plugin and "config" in impl.argnames for impl in impls)
        run_own_setup(self.runtime, plugin, table)

    @contextmanager
    def recording(self, owned: _Ownership) -> Iterator[None]:
        """Record what the plugin adds to the runtime while the block runs."""
        before = {id(obj) for obj in self.pm.get_plugins()}
        try:
            with self.runtime._recording(_SetupRecorder(self, owned)):
                yield
        finally:
            owned.plugins.extend(
                obj for obj in self.pm.get_plugins() if id(obj) not in before and obj is not owned.plugin
            )

    def note_refusal(self, owned: _Ownership, definition: object, scope: ScopeKey | None, exc: Exception) -> None:
        name = getattr(definition, "name", None)
        tool = name if isinstance(name, str) else None
        holder = None
        if tool is not None and isinstance(exc, RegistrationError) and "already registered" in str(exc):
            holder = self.holders.get((scope, tool))
        self.refused.append(
            RefusedRegistration(
                plugin=owned.name,
                tool=tool,
                scope=scope,
                error=str(exc),
                conflicts_with=holder,
                definition=definition if isinstance(definition, ToolDefinition) else None,
            )
        )

    def rollback(self, owned: _Ownership) -> None:
        """Undo what ``owned`` added, newest first; a failing undo does not stop the rest."""
        for disposer in reversed(owned.disposers):
            with suppress(Exception):
                disposer()
        for plugin in reversed(owned.plugins):
            with suppress(Exception):
                if self.pm.is_registered(plugin):
                    self.pm.unregister(plugin)
        for key, holder in list(self.holders.items()):
            if holder == owned.name:
                del self.holders[key]

    # -- after all entry points -----------------------------------------------------

    def validate(self) -> None:
        """Roll back loaded plugins with hookimpls the runtime would never run (see ``registration_problems``)."""
        problems: dict[int, list[str]] = {}
        for plugin, message in registration_problems(self.pm):
            problems.setdefault(id(plugin), []).append(message)
        if not problems:
            return
        kept: list[tuple[importlib.metadata.EntryPoint, _Ownership]] = []
        for ep, owned in self.loaded:
            messages = [m for obj in owned.plugins for m in problems.pop(id(obj), [])]
            if messages:
                self.rollback(owned)
                self.fail(ep, "validate", "; ".join(messages))
            else:
                kept.append((ep, owned))
        self.loaded = kept

    def report(self) -> PluginReport:
        loaded = []
        for ep, owned in self.loaded:
            dist, version = _dist_of(ep)
            loaded.append(
                LoadedPlugin(
                    name=ep.name,
                    value=ep.value,
                    distribution=dist,
                    version=version,
                    tools=tuple(name for _, name in owned.tools),
                    plugins=tuple(self.pm.get_name(obj) or "?" for obj in owned.plugins if self.pm.is_registered(obj)),
                    capabilities=owned.capabilities,
                )
            )
        return PluginReport(
            loaded=tuple(loaded),
            failed=tuple(self.failed),
            disabled=tuple(self.disabled),
            # Kept for rolled-back plugins too: a refusal often explains the failure.
            refused=tuple(self.refused),
            unmatched_tables=tuple(self.unmatched_tables(loaded)),
            ignored_tables=tuple(
                ep.name for ep, owned in self.loaded if ep.name in self.config.plugins and not owned.reads_config
            ),
        )

    def unmatched_tables(self, loaded: Iterable[LoadedPlugin]) -> Iterator[FailedPlugin]:
        """The ``[plugins.<name>]`` tables no plugin reads, each with the closest plugin name.

        Every installed entry point of the group counts, even one the host left
        out of this load: its table is right, only not used this time.
        """
        known = {point.name for point in importlib.metadata.entry_points(group=self.group)}
        known |= {point.name for point in self.points} | {plugin.name for plugin in loaded}
        known |= set(self.disabled) | {failed.name for failed in self.failed}
        for table in self.config.plugins:
            if table in known:
                continue
            close = difflib.get_close_matches(table, sorted(known), n=1)
            hint = f' (did you mean "{close[0]}"?)' if close else ""
            yield FailedPlugin(
                name=table,
                value="",
                distribution=None,
                version=None,
                stage="config",
                error=f"{self.config.plugin_table(table)} configures no installed plugin{hint}",
                configured=True,
                suggestion=close[0] if close else None,
            )


def run_own_setup(runtime: ToolRuntime, plugin: object, table: dict[str, Any]) -> None:
    """Call ``plugin``'s own ``dsh_setup`` hookimpls (a registered plugin), in pluggy's order.

    Only this plugin's: broadcasting ``hook.dsh_setup`` would set up every
    earlier plugin again.
    """
    arguments = {"runtime": runtime, "config": table}
    impls = [impl for impl in runtime.plugins.hook.dsh_setup.get_hookimpls() if impl.plugin is plugin]
    for impl in reversed(impls):  # pluggy's call order
        if _deferred_body(impl.function):
            # Refused before the call: nothing is made that would then need closing.
            raise TypeError(_NOT_PLAIN)
        outcome = impl.function(**{name: arguments[name] for name in impl.argnames})
        if inspect.isasyncgen(outcome):
            # Its body never ran and it holds nothing; an unstarted async generator is
            # dropped without a warning (its aclose() would itself need awaiting).
            raise TypeError(_NOT_PLAIN)
        if inspect.isawaitable(outcome) or inspect.isgenerator(outcome):
            close = getattr(outcome, "close", None)
            if close is not None:
                close()
            raise TypeError(_NOT_PLAIN)


_NOT_PLAIN: Final = "dsh_setup must be a plain (synchronous) function; it runs once at load time"


def _deferred_body(function: Callable[..., object]) -> bool:
    """Whether calling ``function`` would only make a coroutine or (async) generator, running none of it."""
    return (
        inspect.iscoroutinefunction(function)
        or inspect.isgeneratorfunction(function)
        or inspect.isasyncgenfunction(function)
    )


def load_plugins(
    runtime: ToolRuntime,
    group: str = "dsh",
    config: DshConfig | None = None,
    *,
    entry_points: Iterable[importlib.metadata.EntryPoint] | None = None,
) -> PluginReport:
    """Load every plugin of the entry-point ``group`` into ``runtime``, each contained.

    ``config`` supplies ``disabled_plugins`` and each plugin's
    ``[plugins.<name>]`` table. ``entry_points`` replaces discovery with an
    explicit list, loaded in the order given (for hosts that add their own,
    and for tests); by default :func:`discover_entry_points` is used.

    Never raises for a plugin's fault: every failure is in the returned
    report, and a failed plugin leaves nothing registered (see the module
    documentation). Only ``KeyboardInterrupt`` propagates, after the plugin
    being loaded has been rolled back.

    That includes configuration errors: a plugin whose ``dsh_setup`` rejects
    its table fails like any other, so a host can still list, check and report
    what loaded. Before running calls, a host should refuse to go on while
    :attr:`PluginReport.config_failures` is not empty (the ``dsh-tools``
    commands that run calls do), since a configured policy would be missing.

    A runtime's plugins are loaded once: ``RuntimeError`` (before anything is
    loaded) when ``entry_points`` (or discovery) names a plugin that an earlier
    call loaded into this runtime and that is still registered. A later call
    may load others.
    """
    from ._runtime import ToolRuntime

    if not isinstance(runtime, ToolRuntime):
        raise TypeError(f"load_plugins() takes a ToolRuntime, got {type(runtime).__name__}")
    if config is not None and not isinstance(config, DshConfig):
        raise TypeError(f"config must be a DshConfig (see load_config) or None, got {type(config).__name__}")
    if type(group) is not str or not group:
        raise TypeError(f"group must be a non-empty entry-point group name, got {group!r}")
    points = discover_entry_points(group) if entry_points is None else list(entry_points)
    for position, point in enumerate(points):
        if not isinstance(point, importlib.metadata.EntryPoint):
            raise TypeError(f"entry_points holds importlib.metadata.EntryPoint items, got {type(point).__name__} "
                            f"at position {position}")  # fmt: skip
    # Loaded again, each would fail as "already registered by the host" and the host would refuse to start.
    again = [name for name in dict.fromkeys(point.name for point in points) if _loaded_before(runtime, name)]
    if again:
        raise RuntimeError(
            f"plugins were already loaded into this runtime by an earlier load_plugins() call: {', '.join(again)}; "
            "load a runtime's plugins once (entry_points= loads others)"
        )
    loader = _Loader(runtime, config if config is not None else DshConfig(), points, group)
    seen: dict[str, importlib.metadata.EntryPoint] = {}
    for ep in points:
        loader.load(ep, seen)
    loader.validate()
    # The loaded plugins are clean now; a remaining offender belongs to the host.
    with suppress(pluggy.PluginValidationError):
        runtime.plugins.check_pending()
    report = loader.report()
    for loaded in report.loaded:
        runtime._entry_point_plugins[loaded.name] = runtime.plugins.get_plugin(loaded.name)
    return report


def _loaded_before(runtime: ToolRuntime, name: str) -> bool:
    """Whether an earlier ``load_plugins`` registered the plugin that still holds ``name``."""
    plugin = runtime.plugins.get_plugin(name)
    return plugin is not None and runtime._entry_point_plugins.get(name) is plugin
