"""Rule-based permissions: allow, deny or ask for approval, from the configuration file.

Configure it in ``[plugins.permissions]``::

    [plugins.permissions]
    default = "allow"                        # "allow" | "deny" | "ask" when no rule matches

    [[plugins.permissions.rules]]
    tool = "read_*"                          # fnmatch glob on the tool name
    action = "allow"

    [[plugins.permissions.rules]]
    tool = "*_file"
    paths = { path = "secrets/*" }           # JSON path -> glob on the file that argument names
    action = "deny"
    reason = "secrets are not for the model"

    [[plugins.permissions.rules]]
    tool = "http_get"
    args = { url = "http://*" }              # JSON path -> glob on the argument's raw text
    action = "deny"

    [[plugins.permissions.rules]]
    tool = "bash"
    agent = "reviewer-*"                     # optional: glob on the calling Agent's id (or a parent's)
    action = "ask"

    [[plugins.permissions.rules]]
    tool = "*"
    effects = ["destructive"]                # optional: the tool declares all of these
    action = "ask"

Rules are tried in order and the **first match wins**. A rule matches when its
``tool`` glob matches the tool name, its optional ``agent`` glob matches the id
of the calling :class:`dsh_core.Agent` or of one it was made under (its
``parent``s: a child inherits its parent's rules; a call without an ``Agent``
never matches a rule that names one), every ``args`` entry matches, and the called
tool declares every effect the optional ``effects`` list names
(``read_only``, ``destructive``, ``idempotent``, ``open_world``; see
:class:`dsh_core.ToolEffects`): all of them, not any, so a rule for tools that
are destructive *or* open-world is two rules, one per effect (``dsh-tools
check`` names a rule on several effects that no registered tool declares
together). A tool that declares nothing matches no such
rule, except ``effects = ["undeclared"]``, which matches exactly those tools
(an MCP tool without annotations, say), so they cannot slip past rules written
for declared effects. Globs use
:func:`fnmatch.fnmatchcase` (``*``, ``?``, ``[seq]``; case-sensitive on every
platform), but for ``paths`` values on a file system that ignores case
(macOS and Windows by default), where ``SECRETS/key`` *is* ``secrets/key``:
there the real path and the glob are compared casefolded.

``args`` keys are JSON paths into the (already validated) arguments: ``path``,
``config.host``, ``items[0]``, ``headers["X-Token"]`` (a bracketed JSON string
for keys that contain ``.`` or ``[``). A string argument is matched as is; any
other value by its compact JSON text (``true``, ``3``, ``null``,
``["rm","-rf"]``). An array or object also matches a ``deny`` or ``ask`` rule
when any value inside it (at any depth, an object's keys included) matches,
and an ``allow`` rule when every one does, so wrapping a value in a list or an
object, as an item, a value or a key, never dodges a rule. A path that leads
nowhere does not match.

``args`` compares the raw text and nothing else: for an argument naming a file,
any other spelling of it (``./secrets/key``, ``x/../secrets/key``, an absolute
path, a symlink) dodges an ``args`` glob, and ``docs/../secrets/key`` passes an
allow glob ``docs/*``. Match files with ``paths`` instead (``dsh-tools check``
warns about an ``args`` glob with a ``/`` on a key named like a path). Its keys
are the same JSON paths; each value is resolved as the files tools resolve
it, ``realpath`` of it joined to the root (the ``files`` plugin's root on this
runtime, else the directory the host started in), and each glob is taken below
the same root unless it is absolute (``secrets/*`` is ``<root>/secrets/*``;
``*`` matches ``/`` too, so it covers every depth). A value that names no file
(a number, a NUL, a lone surrogate) or that, given relative, resolves outside
the root (``../x``, a symlink out) fails closed: it matches every ``deny`` and
``ask`` rule and no ``allow`` rule. Arrays and objects match as in ``args``
(any value for ``deny``/``ask``, every value for ``allow``); an empty one names
no file and matches nothing. Symlinks are read off the event loop, in a worker
thread, and only for calls a ``paths`` rule is written for. The check is made
when the call is decided, not atomically with the tool's I/O.

Decisions: ``deny`` is final for the call (inner pre-execute listeners do not
run); the message names the rule, numbered from 1 in file order (``denied by
permissions rule #2 (tool "write_*")``) unless the rule gives a ``reason``.
``allow`` means "no objection": the call continues down the waterfall, so inner
policies (a rate limit, say) and guards still apply. ``ask`` lets the inner
policies decide first (their denial stands and nobody is asked; a question, or
a standing grant answering it, never runs what another policy refuses), then
goes to the host's :class:`~dsh_core.ApprovalService`; without one (or for a
call without an agent) the runtime denies it.

The listener is registered plainly (no ``tryfirst``/``trylast``): like any
policy plugin, its place among other plain listeners follows load order.
"""

from __future__ import annotations

import contextlib
import fnmatch
import glob as glob_module
import json
import os
import posixpath
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import Annotated, Any, Final, Literal, TypeAlias

import attrs
import trio

from dsh_core import (
    Agent,
    Ask,
    Deny,
    JsonValue,
    PreToolDecision,
    Rewrite,
    TableCheck,
    ToolExecution,
    ToolRuntime,
    check_validator,
    hookimpl,
    json_equal,
    json_text,
    structure_table,
)

from ._case_folding import folded, folds_case
from ._settings_warnings import unknown_tool_warnings

__all__ = [
    "PLUGIN_NAME",
    "PathSyntaxError",
    "Permissions",
    "PermissionsSettings",
    "Rule",
    "parse_path",
    "resolve_path",
]

# Capability manifest (enforced under strict_capabilities): its rules may allow, deny or ask for any tool.
DSH_CAPABILITIES: dict[str, list[str]] = {"tools": [], "affects": ["*"]}

PLUGIN_NAME: Final = "permissions-policy"

Action: TypeAlias = Literal["allow", "deny", "ask"]
_DECIDES: Final[dict[str, str]] = {"allow": "allows", "deny": "denies", "ask": "asks about"}
EffectName: TypeAlias = Literal["read_only", "destructive", "idempotent", "open_world", "undeclared"]
Segment: TypeAlias = str | int


class _Missing:
    """Marks a path that leads nowhere (distinct from a JSON ``null``)."""

    __slots__ = ()


_MISSING: Final = _Missing()


class PathSyntaxError(ValueError):
    """An ``args`` key is not a JSON path this plugin understands."""


def parse_path(text: str) -> tuple[Segment, ...]:
    """Split ``config.items[0]["a.b"]`` into ``("config", "items", 0, "a.b")``.

    Raises :class:`PathSyntaxError` for an empty path, an empty name, an
    unclosed bracket or a bracket holding neither a non-negative integer nor a
    JSON string.
    """
    segments: list[Segment] = []
    index = 0
    length = len(text)
    expect_name = True  # at the start and after ".", a name must follow
    while index < length:
        char = text[index]
        if char == "[":
            close, segment = _bracket(text, index)
            segments.append(segment)
            index = close + 1
            expect_name = False
        elif char == "." and not expect_name:
            index += 1
            expect_name = True
        elif char in ".]":
            raise PathSyntaxError(f"unexpected {char!r} at position {index} in {text!r}")
        else:
            end = index
            while end < length and text[end] not in ".[]":
                end += 1
            segments.append(text[index:end])
            index = end
            expect_name = False
    if expect_name:
        raise PathSyntaxError(f"{text!r} is not a path: it is empty or ends with '.'")
    return tuple(segments)


def _bracket(text: str, start: int) -> tuple[int, Segment]:
    if text.startswith('"', start + 1):
        decoder = json.JSONDecoder()
        try:
            key, end = decoder.raw_decode(text, start + 1)
        except json.JSONDecodeError:
            raise PathSyntaxError(f"bad quoted key at position {start} in {text!r}") from None
        if not text.startswith("]", end):
            raise PathSyntaxError(f"expected ']' at position {end} in {text!r}")
        return end, key
    close = text.find("]", start)
    if close < 0:
        raise PathSyntaxError(f"unclosed '[' at position {start} in {text!r}")
    inner = text[start + 1 : close]
    if not (inner.isascii() and inner.isdigit()):
        raise PathSyntaxError(
            f'[{inner}] in {text!r} must be a non-negative index like [0] or a quoted key like ["a.b"]'
        )
    return close, int(inner)


def resolve_path(value: JsonValue, path: tuple[Segment, ...]) -> JsonValue | _Missing:
    """The value at ``path`` inside ``value``, or a private sentinel when there is none."""
    current: JsonValue = value
    for segment in path:
        if isinstance(segment, int):
            if not isinstance(current, (tuple, list)) or segment >= len(current):
                return _MISSING
            current = current[segment]
        else:
            if not isinstance(current, Mapping) or segment not in current:
                return _MISSING
            current = current[segment]
    return current


def _agent_matches(agent: object, glob: str) -> bool:
    """Whether the calling agent, or one it was made under (its ``parent``s), has an id the glob matches.

    A child agent inherits its parent's scope: with the caller's own id only, a
    helper made under "reviewer" ran what a rule for "reviewer" denied.
    """
    seen = 0
    while isinstance(agent, Agent) and seen < 1000:  # (a chain of parents is finite; bounded all the same)
        if fnmatch.fnmatchcase(agent.id, glob):
            return True
        agent, seen = agent.parent, seen + 1
    return False


def _match_text(value: JsonValue) -> str:
    if isinstance(value, str):
        return value
    if type(value) is float and value.is_integer():
        # 1.0 (or 1e0) is the integer 1 to an "integer" schema and to the tool: a rule for "1" must see it.
        return str(int(value))
    return json_text(value)


def _scalars(value: JsonValue) -> list[JsonValue]:
    """Every scalar inside an array or object, at any depth, its objects' keys included.

    A key is the model's text as much as a value is: ``{"secrets/key": "x"}``
    names the file as surely as ``["secrets/key"]`` does (an explicit stack:
    values may be deep).
    """
    out: list[JsonValue] = []
    stack: list[JsonValue] = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, Mapping):
            for key, inner in reversed(list(item.items())):
                stack.append(inner)
                stack.append(key)
        elif isinstance(item, (list, tuple)):
            stack.extend(reversed(item))
        else:
            out.append(item)
    return out


def _value_matches(value: JsonValue, glob: str, action: str) -> bool:
    """Whether an argument value matches an ``args`` glob, so that wrapping it never helps a model.

    A scalar matches when its text does. A container matches a ``deny`` or
    ``ask`` rule when its compact JSON text or any scalar inside it does
    (``["/etc/passwd"]`` is still ``/etc/passwd``), and an ``allow`` rule only
    when every scalar inside it does (one path outside the glob must not ride
    along with one inside it, not even when the container's whole text fits a
    glob like ``*/docs/*``); an empty container matches by its text.
    """
    if not isinstance(value, (Mapping, list, tuple)):
        return fnmatch.fnmatchcase(_match_text(value), glob)
    scalars = _scalars(value)
    if action == "allow" and scalars:
        # Not the container's text: ``*/docs/*`` matches '["/etc/shadow","/srv/docs/a"]'.
        return all(fnmatch.fnmatchcase(_match_text(item), glob) for item in scalars)
    if fnmatch.fnmatchcase(json_text(value), glob):
        return True
    return action != "allow" and any(fnmatch.fnmatchcase(_match_text(item), glob) for item in scalars)


class _Unresolvable:
    """A ``paths`` value that is no path (a number, a NUL, a lone surrogate) or escapes the root: it fails closed."""

    __slots__ = ()


_UNRESOLVABLE: Final = _Unresolvable()
# An ``args`` key whose name holds one of these probably holds a path (``dsh-tools check`` says so).
_PATH_KEY_WORDS: Final = ("path", "file", "dir")


class _FoldedPath(str):
    """A real path on a file system that ignores case: compared casefolded (and NFC), as that file system does."""


# A resolved ``paths`` value: its real path, or _UNRESOLVABLE.
Resolved: TypeAlias = str | _Unresolvable


def _resolve_value(value: JsonValue, root: str) -> Resolved:
    """The real path ``value`` names, as the files tools resolve it (``realpath`` of it joined to ``root``).

    Blocks on the file system (symlinks are read): the listener calls it from a worker thread.
    A relative value that resolves outside ``root`` (``../x``, a symlink out) is unresolvable.
    """
    if not isinstance(value, str) or "\x00" in value:
        return _UNRESOLVABLE
    try:
        value.encode("utf-8")
        real = os.path.realpath(os.path.join(root, value))
    except (UnicodeEncodeError, ValueError, OSError):
        return _UNRESOLVABLE
    if not os.path.isabs(value) and os.path.commonpath([root, real]) != root:
        return _UNRESOLVABLE
    # Where the value lives, not the root: a case-folding mount (vfat, exFAT, an ext4 casefold
    # directory) inside a case-sensitive root let SECRETS/key past a deny rule on secrets/*.
    return _FoldedPath(folded(real)) if folds_case(os.path.dirname(real)) else real


def _path_pattern(glob: str, root: str, *, resolve: bool = False) -> str:
    """A ``paths`` glob as an absolute pattern: relative ones are taken below ``root`` (``./a/../b/*`` is ``<root>/b/*``).

    The root is a directory, not a pattern: a ``[``, ``*`` or ``?`` in its name
    (``proj [v2]``) is escaped, or every relative rule would stop matching.
    With ``resolve`` (blocks: symlinks are read), the glob's literal head, the
    directories before its first wildcard, is resolved as the values are:
    ``secrets/*`` with ``secrets`` a symlink to ``.vault`` matched no value
    (each resolves into ``.vault``), and ``/etc/*`` none on macOS (``/private/etc``).
    """
    joined = posixpath.normpath(posixpath.join(root, glob))
    # What came from the root is literal whatever it holds (a glob climbing out of it, "../*.env",
    # keeps only the root's part that it shares); then the glob's parts until a wildcard.
    literal = "/" if posixpath.isabs(glob) else posixpath.commonpath([posixpath.normpath(root), joined])
    rest = [part for part in joined[len(literal) :].split("/") if part]
    taken = 0
    while taken < len(rest) and not glob_module.has_magic(rest[taken]):
        taken += 1
    head, rest = posixpath.join(literal, *rest[:taken]), rest[taken:]
    if resolve:
        with contextlib.suppress(OSError, ValueError):  # else matched as written
            head = os.path.realpath(head)
    escaped = glob_module.escape(head)
    return posixpath.join(escaped, *rest) if rest else escaped


def _path_matches(value: JsonValue, pattern: str, action: str, resolved: Mapping[str, Resolved]) -> bool:
    """Whether a ``paths`` value matches; one that is no path, or escapes the root, fails closed.

    It matches every ``deny`` and ``ask`` rule and no ``allow`` rule. An array or
    object matches ``deny``/``ask`` when any value inside it does and ``allow``
    when every one does; an empty one names no path and matches nothing.
    """
    items = _scalars(value) if isinstance(value, (Mapping, list, tuple)) else [value]
    if not items:
        return False

    def one(item: JsonValue) -> bool:
        real = resolved.get(item, _UNRESOLVABLE) if isinstance(item, str) else _UNRESOLVABLE
        if isinstance(real, _Unresolvable):
            return action != "allow"
        if isinstance(real, _FoldedPath):
            return fnmatch.fnmatchcase(real, folded(pattern))
        return fnmatch.fnmatchcase(real, pattern)

    if action == "allow":
        return all(one(item) for item in items)
    return any(one(item) for item in items)


def _keys_problem(value: dict[str, str]) -> str | None:
    for key in value:
        try:
            parse_path(key)
        except PathSyntaxError as exc:
            return str(exc)
    return None


def _check_args(instance: object, attribute: attrs.Attribute[Any], value: dict[str, str] | None) -> None:
    problem = None if value is None else _keys_problem(value)
    if problem is not None:
        raise ValueError(f"{attribute.alias}: {problem}")


def _glob_problem(value: str) -> str | None:
    return None if value else "must be a non-empty glob"


def _reason_problem(value: str) -> str | None:
    # Refused here, not at the first matching call: a denial needs words the model can read.
    if type(value) is not str or not value.strip():
        return f"must be a non-empty text, got {value!r}; leave it out to have the rule named"
    return None


def _effects_problem(value: tuple[str, ...]) -> str | None:
    if "undeclared" in value and len(value) > 1:
        return '"undeclared" matches tools that declare no effects: it cannot be combined with others'
    return None


def _check_effects(instance: object, attribute: attrs.Attribute[Any], value: tuple[str, ...] | None) -> None:
    problem = None if value is None else _effects_problem(value)
    if problem is not None:
        raise ValueError(problem)


# Checked in the types too, so a table's every bad rule key is reported at once with its path.
_Glob: TypeAlias = Annotated[str, TableCheck(_glob_problem)]
_PathKeys: TypeAlias = Annotated[dict[str, str], TableCheck(_keys_problem)]
_check_glob = check_validator(_glob_problem)


@attrs.frozen(kw_only=True)
class Rule:
    """One ``[[plugins.permissions.rules]]`` entry."""

    tool: _Glob = attrs.field(validator=_check_glob)
    action: Action
    args: _PathKeys | None = attrs.field(default=None, validator=_check_args)
    paths: _PathKeys | None = attrs.field(default=None, validator=_check_args)
    agent: _Glob | None = attrs.field(default=None, validator=_check_glob)
    effects: Annotated[tuple[EffectName, ...], TableCheck(_effects_problem)] | None = attrs.field(
        default=None, validator=_check_effects
    )
    reason: Annotated[str, TableCheck(_reason_problem)] | None = attrs.field(
        default=None, validator=check_validator(_reason_problem)
    )


@attrs.frozen(kw_only=True)
class PermissionsSettings:
    """The ``[plugins.permissions]`` table."""

    default: Action = "allow"
    rules: tuple[Rule, ...] = ()


@attrs.frozen(slots=True)
class _CompiledRule:
    number: int  # 1-based, as messages show it
    rule: Rule
    args: tuple[tuple[tuple[Segment, ...], str], ...]
    paths: tuple[tuple[tuple[Segment, ...], str], ...] = ()

    def path_values(self, execution: ToolExecution) -> list[str]:
        """The strings at this rule's ``paths`` keys, when the rule is for this tool (no file system access)."""
        if not self.paths or not fnmatch.fnmatchcase(execution.name, self.rule.tool):
            return []
        out: list[str] = []
        for path, _ in self.paths:
            found = resolve_path(execution.arguments, path)
            if isinstance(found, _Missing):
                continue
            items = _scalars(found) if isinstance(found, (Mapping, list, tuple)) else [found]
            out.extend(item for item in items if isinstance(item, str))
        return out

    def matches(
        self,
        execution: ToolExecution,
        runtime: ToolRuntime | None,
        root: str,
        resolved: Mapping[str, Resolved],
        patterns: Mapping[str, str] | None = None,
    ) -> bool:
        """Whether this rule decides the call; ``resolved`` maps each ``paths`` value to its real path.

        ``patterns`` maps each ``paths`` glob to its pattern with its literal head resolved
        (see :func:`_path_pattern`); a glob missing from it is matched as written.
        """
        rule = self.rule
        if not fnmatch.fnmatchcase(execution.name, rule.tool):
            return False
        if rule.effects:
            assert runtime is not None  # Permissions refuses such rules without one
            definition = runtime.get(execution.name, execution.agent)
            declared = definition.effects if definition is not None else None
            if rule.effects == ("undeclared",):
                if declared is not None:
                    return False
            elif declared is None or not all(getattr(declared, name) for name in rule.effects):
                return False
        if rule.agent is not None and not _agent_matches(execution.agent, rule.agent):
            return False
        for path, glob in self.args:
            found = resolve_path(execution.arguments, path)
            if isinstance(found, _Missing) or not _value_matches(found, glob, rule.action):
                return False
        if self.paths:
            for path, glob in self.paths:
                found = resolve_path(execution.arguments, path)
                pattern = patterns.get(glob) if patterns is not None else None
                if isinstance(found, _Missing) or not _path_matches(
                    found, pattern or _path_pattern(glob, root), rule.action, resolved
                ):
                    return False
        return True

    def label(self) -> str:
        return f'permissions rule #{self.number} (tool "{self.rule.tool}")'


class Permissions:
    """The ``dsh_pre_execute`` listener of one runtime, built from :class:`PermissionsSettings`."""

    def __init__(self, settings: PermissionsSettings | None = None, runtime: ToolRuntime | None = None) -> None:
        self.settings = settings or PermissionsSettings()
        # Rules on declared effects read the called tool's definition from here.
        self.runtime = runtime
        if runtime is None and any(rule.effects for rule in self.settings.rules):
            raise ValueError("permissions rules with effects need the runtime: Permissions(settings, runtime)")
        self._rules = tuple(
            _CompiledRule(
                number,
                rule,
                tuple((parse_path(key), glob) for key, glob in (rule.args or {}).items()),
                tuple((parse_path(key), glob) for key, glob in (rule.paths or {}).items()),
            )
            for number, rule in enumerate(self.settings.rules, start=1)
        )
        # Where relative ``paths`` resolve without a files workspace: the directory the host started in.
        self._cwd = os.path.realpath(os.getcwd())

    def path_root(self) -> str:
        """What relative ``paths`` values and globs are taken below: the files plugin's root, else the start cwd."""
        if self.runtime is not None:
            from dsh_plugins.files import workspace_of

            workspace = workspace_of(self.runtime)
            if workspace is not None:
                return workspace.root
        return self._cwd

    def resolve_paths(self, execution: ToolExecution) -> dict[str, Resolved]:
        """The real path of every value a ``paths`` rule for this tool names (blocks: symlinks are read)."""
        root = self.path_root()
        return {value: _resolve_value(value, root) for c in self._rules for value in c.path_values(execution)}

    def resolve_patterns(self) -> dict[str, str]:
        """Each ``paths`` glob's pattern with its literal head resolved (blocks: symlinks are read)."""
        root = self.path_root()
        return {glob: _path_pattern(glob, root, resolve=True) for c in self._rules for _, glob in c.paths}

    def _resolve_call(self, execution: ToolExecution) -> tuple[dict[str, Resolved], dict[str, str]]:
        return self.resolve_paths(execution), self.resolve_patterns()

    def decide(
        self,
        execution: ToolExecution,
        resolved: Mapping[str, Resolved] | None = None,
        patterns: Mapping[str, str] | None = None,
    ) -> tuple[Action, str | None]:
        """The action for this call and the reason to give (``None`` for allow).

        ``resolved`` is :meth:`resolve_paths` of the call and ``patterns``
        :meth:`resolve_patterns`, worked out off the event loop; without
        ``resolved`` both are worked out here.
        """
        root = self.path_root()
        if resolved is None:
            resolved, patterns = self._resolve_call(execution)
        for compiled in self._rules:
            if compiled.matches(execution, self.runtime, root, resolved, patterns):
                action = compiled.rule.action
                if action == "allow":
                    return action, None
                if compiled.rule.reason is not None:
                    return action, compiled.rule.reason
                verb = "denied by" if action == "deny" else "approval required by"
                return action, f"{verb} {compiled.label()}"
        default = self.settings.default
        if default == "deny":
            return default, f'denied by the permissions default: no rule matched tool "{execution.name}"'
        if default == "ask":
            return default, f'approval required by the permissions default: no rule matched tool "{execution.name}"'
        return default, None

    def diagnostics(self) -> list[str]:
        """Warnings for ``dsh-tools check``: effects rules that match less than they seem to.

        A rule on several effects needs a tool to declare all of them; one that no
        registered tool it names satisfies is named, since it was most likely meant
        as "any of these". A rule on declared effects never matches a tool that
        declares none; unless an ``effects = ["undeclared"]`` rule covers such
        tools, each rule is named with the tools it cannot see.
        """
        raw_paths = self._raw_path_patterns()
        if self.runtime is None:
            return raw_paths
        rules = [compiled for compiled in self._rules if compiled.rule.effects]
        return raw_paths + self._unknown_tools() + self._unsatisfied_conjunctions(rules) + self._blind_spots(rules)

    def _unknown_tools(self) -> list[str]:
        """Rules whose ``tool`` glob matches no registered tool: a misspelt deny denies nothing."""
        assert self.runtime is not None
        return [
            warning
            for compiled in self._rules
            for warning in unknown_tool_warnings(
                self.runtime,
                f"permissions rule #{compiled.number}",
                [compiled.rule.tool],
                f"it {_DECIDES[compiled.rule.action]} nothing",
                globs=True,
            )
        ]

    def _raw_path_patterns(self) -> list[str]:
        """``args`` globs that look like path patterns on a key that looks like a path: they compare raw text."""
        out = []
        for compiled in self._rules:
            for key, glob in (compiled.rule.args or {}).items():
                name = str(parse_path(key)[-1]).lower()
                if "/" in glob and any(word in name for word in _PATH_KEY_WORDS):
                    out.append(
                        f'{compiled.label()} matches args {key} = "{glob}" against the raw text, so another '
                        "spelling of the same file (a ./ prefix, x/../, an absolute path) dodges it; write "
                        f'paths = {{ {key} = "{glob}" }} to match it as a path'
                    )
        return out

    def _unsatisfied_conjunctions(self, rules: list[_CompiledRule]) -> list[str]:
        assert self.runtime is not None
        declared = [
            (definition.name, definition.effects)
            for _, definition in self.runtime.registrations()
            if definition.effects is not None
        ]
        out = []
        for compiled in rules:
            effects = compiled.rule.effects or ()
            if len(effects) < 2:
                continue
            if not any(
                fnmatch.fnmatchcase(name, compiled.rule.tool) and all(getattr(tool_effects, e) for e in effects)
                for name, tool_effects in declared
            ):
                out.append(
                    f"{compiled.label()} matches only tools that declare all of {', '.join(effects)}, and no "
                    "registered tool it names does; to match a tool that declares any one of them, write one "
                    "rule per effect"
                )
        return out

    def _blind_spots(self, rules: list[_CompiledRule]) -> list[str]:
        assert self.runtime is not None
        if not rules or any(compiled.rule.effects == ("undeclared",) for compiled in rules):
            return []
        undeclared = sorted(
            definition.name for _, definition in self.runtime.registrations() if definition.effects is None
        )
        out = []
        for compiled in rules:
            blind = [name for name in undeclared if fnmatch.fnmatchcase(name, compiled.rule.tool)]
            if blind:
                shown = ", ".join(blind[:5]) + (f" and {len(blind) - 5} more" if len(blind) > 5 else "")
                out.append(
                    f"{compiled.label()} matches on declared effects, but {shown} declare none, so it never "
                    'applies to them; add a rule with effects = ["undeclared"] to decide those'
                )
        return out

    @hookimpl
    async def dsh_pre_execute(
        self, execution: ToolExecution, next: Callable[[], Awaitable[PreToolDecision]]
    ) -> PreToolDecision:
        resolved: dict[str, Resolved] = {}
        patterns: dict[str, str] | None = None
        if any(compiled.path_values(execution) for compiled in self._rules):
            # realpath reads symlinks: not on the event loop.
            resolved, patterns = await trio.to_thread.run_sync(partial(self._resolve_call, execution))
        action, reason = self.decide(execution, resolved, patterns)
        match action:
            case "deny":
                assert reason is not None
                return Deny(reason)
            case "ask":
                # The policies inside still decide first: a question must never stand in for
                # their denial (an answer, or a standing grant, would then run what they refuse).
                inner = await next()
                if isinstance(inner, Deny):
                    return inner
                if isinstance(inner, Rewrite) and not json_equal(inner.arguments, execution.arguments):
                    return inner  # the rewritten call comes back through this listener: it is asked about then
                # A rewrite to the arguments the call has brings nothing back: ask now. (The runtime
                # already resolves such a rewrite before it gets here; this rule does not rely on it.)
                return Ask(reason)
            case _:
                return await next()


@hookimpl
def dsh_setup(runtime: ToolRuntime, config: dict[str, Any]) -> None:
    """Register a fresh :class:`Permissions` listener for ``runtime`` (named ``permissions-policy``; the entry-point module itself is ``permissions``)."""
    settings = structure_table(PermissionsSettings, config, "[plugins.permissions]")
    runtime.plugins.register(Permissions(settings, runtime), name=PLUGIN_NAME)
