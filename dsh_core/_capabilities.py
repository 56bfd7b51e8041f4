"""Capability manifests: which tools a plugin adds and which tools its policies may decide.

A plugin module (or the object its entry point names) declares::

    DSH_CAPABILITIES = {
        "tools": ["read_file", "list_*"],     # tools its dsh_setup may register
        "affects": ["read_file", "write_*"],  # tools its listeners and guards may decide
    }

Entries are :func:`fnmatch.fnmatchcase` globs on tool names; a missing list is
empty. ``dsh-tools plugins --capabilities`` lists every plugin's manifest.

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
  listener must return exactly what ``next()`` returned and a guard must
  return ``None``: anything else (``Deny``, ``Ask``, its own ``Allow`` or
  ``Accept``, a ``Block``, a replaced content, value or result, a guard's
  reason) is refused, and the call fails with ``POLICY_ERROR`` naming the
  plugin. A refused decision never lets a call through.

The check is installed by wrapping those listeners once, at load time, so a
host without strict mode pays nothing per call.
"""

from __future__ import annotations

import fnmatch
import functools
import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

import attrs
import pluggy

from . import hookspecs
from ._errors import PolicyError

if TYPE_CHECKING:
    from ._execution import ToolExecution
    from ._registry import ToolGuard

__all__ = [
    "MANIFEST_NAME",
    "Capabilities",
    "CapabilityError",
    "capabilities_of",
    "guard_guard",
    "guard_listeners",
]

MANIFEST_NAME: Final = "DSH_CAPABILITIES"
GUARDED_HOOKS: Final = ("dsh_pre_execute", "dsh_execute", "dsh_post_execute")


class CapabilityError(PolicyError):
    """A plugin acted outside its declared capabilities (``POLICY_ERROR``)."""


def _globs(value: object, key: str, problems: list[str]) -> tuple[str, ...]:
    if isinstance(value, str | bytes) or not isinstance(value, list | tuple):
        problems.append(f'"{key}" must be a list of tool-name globs, got {type(value).__name__}')
        return ()
    out: list[str] = []
    for index, item in enumerate(value):
        if type(item) is not str or not item:
            problems.append(f'"{key}"[{index}] must be a non-empty string, got {item!r}')
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

    def may_affect(self, tool: str) -> bool:
        """Whether ``tool`` matches an ``affects`` glob."""
        return any(fnmatch.fnmatchcase(tool, glob) for glob in self.affects)


def capabilities_of(plugin: object, module: object = None) -> Capabilities | None:
    """The manifest ``plugin`` (or else ``module``, its entry point's module) declares, or ``None``.

    Raises ``ValueError`` for a malformed manifest.
    """
    manifest = getattr(plugin, MANIFEST_NAME, None)
    if manifest is None and module is not None:
        manifest = getattr(module, MANIFEST_NAME, None)
    return None if manifest is None else Capabilities.from_manifest(manifest)


def _refusal(plugin: str, capabilities: Capabilities, tool: str, what: str) -> CapabilityError:
    declared = ", ".join(capabilities.affects) or "nothing"
    return CapabilityError(
        f'plugin {plugin} may not {what} calls of tool "{tool}": its {MANIFEST_NAME} affects {declared} '
        "(strict_capabilities)"
    )


class _TrackedNext:
    """The listener's ``next``, remembering what it returned (to recognise a pass-through)."""

    __slots__ = ("_next", "called", "result")

    def __init__(self, nxt: Callable[[], Awaitable[Any]]) -> None:
        self._next = nxt
        self.called = False
        self.result: Any = None

    async def __call__(self) -> Any:
        result = await self._next()
        self.called = True
        self.result = result
        return result


def _guarded(
    original: Callable[..., Awaitable[Any]],
    argnames: tuple[str, ...],
    spec_args: tuple[str, ...],
    plugin: str,
    capabilities: Capabilities,
) -> Callable[..., Awaitable[Any]]:
    positions = tuple(spec_args.index(name) for name in argnames)
    next_at = spec_args.index("next")

    def own(ordered: tuple[Any, ...]) -> dict[str, Any]:
        return {name: ordered[index] for name, index in zip(argnames, positions, strict=True)}

    @functools.wraps(original)
    async def guarded(*ordered: Any) -> Any:
        tool = ordered[0].name  # every guarded hook's first argument is the execution
        if capabilities.may_affect(tool):
            return await original(**own(ordered))
        tracked = _TrackedNext(ordered[next_at])
        outcome = await original(**own((*ordered[:next_at], tracked, *ordered[next_at + 1 :])))
        if tracked.called and outcome is tracked.result:
            return outcome
        raise _refusal(plugin, capabilities, tool, "decide")

    return guarded


def guard_listeners(pm: pluggy.PluginManager, owner: object, plugin: str, capabilities: Capabilities) -> int:
    """Wrap ``owner``'s waterfall listeners so they may decide only tools in ``capabilities.affects``.

    Listeners the runtime refuses anyway (not ``async def``, unknown argument
    names, pluggy wrappers) are left as they are so the refusal keeps its own
    message. Returns how many listeners were wrapped.
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
            guarded = _guarded(impl.function, tuple(impl.argnames), spec_args, plugin, capabilities)
            # The runtime reads listeners from pluggy's hookimpls; the wrapper takes every spec argument.
            object.__setattr__(impl, "function", guarded)
            object.__setattr__(impl, "argnames", spec_args)
            wrapped += 1
    if wrapped and hasattr(pm, "dsh_version"):
        pm.dsh_version += 1  # drop the runtime's cached listener chains
    return wrapped


def guard_guard(guard: ToolGuard, plugin: str, capabilities: Capabilities) -> ToolGuard:
    """Wrap a guard so it may deny only tools in ``capabilities.affects``."""

    @functools.wraps(guard)
    def checked(execution: ToolExecution) -> str | None:
        reason = guard(execution)
        if reason is None or capabilities.may_affect(execution.name):
            return reason
        raise _refusal(plugin, capabilities, execution.name, "deny")

    return checked
