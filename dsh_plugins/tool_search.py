"""Tool search: the model finds deferred tools by asking, instead of being sent every schema.

A host with hundreds of tools (a few MCP servers, say) spends a large part of
every request on schemas the model rarely needs. Tools declared
``defer_loading=True``, or deferred by this plugin's ``defer`` globs, are left
out of ``schemas()``, ``model_tools()`` and the Code Mode SDK; this plugin
registers one search tool, ``search_tools``, through which the model finds them by what they do.
The matches are loaded for the calling agent (``ToolRuntime.load_tools``), so
the host's next request carries their schemas, and the search answers with
their names, descriptions and parameters. A call without an agent loads them
for the global scope, which every agent inherits. The last 1024 scopes that
searched keep what they loaded; past that, the least recent one's loads are
released (it finds them again by searching), and
``ToolSearch.release_loaded()`` releases them all::

    [plugins.tool_search]
    enabled = true
    defer = ["github__*", "jira__*"]   # also defer these (globs); tools may declare defer_loading themselves
    max_results = 5                   # matches returned (and loaded) per search, 1 to 50

The search tool itself is never deferred, whatever ``defer`` says: a glob that
matches it (``"*"``, say) leaves it in the tool list, since a model shown no
search could find nothing, and ``dsh-tools check`` points the glob out.

Deferring is about what the model is shown, not what it may do: a deferred
tool is callable all along (a model that knows its name can call it), and every
policy, guard and approval applies to it as to any other. Use restrictions
(``ToolRuntime.restrict``) or the permissions plugin to take tools away.

Ranking is lexical and deterministic: each word of the query scores when it is
a word of a tool's name (3), of its description (1), or the start of one
(1.5 and 0.5), and the query naming a tool exactly puts that tool first. Ties
go to the shorter, then alphabetically first name.
"""

from __future__ import annotations

import bisect
import fnmatch
import re
import unicodedata
import weakref
from collections import OrderedDict
from typing import Annotated, Any, Final

import attrs

from dsh_core import (
    ConfigError,
    Disposer,
    DshError,
    ErrorCode,
    RegistrationError,
    ScopeKey,
    TableCheck,
    TextBlock,
    ToolDefinition,
    ToolEffects,
    ToolOutput,
    ToolRunContext,
    ToolRuntime,
    check_validator,
    define_tool,
    hookimpl,
    json_text,
    structure_table,
    thaw,
)

from ._settings_warnings import report_inert_keys

__all__ = [
    "DEFAULT_NAME",
    "MAX_LOADED_SCOPES",
    "LoadedSets",
    "SearchDiagnostic",
    "SearchMatch",
    "ToolSearch",
    "ToolSearchSettings",
    "rank_tools",
    "search_tool",
]

DEFAULT_NAME: Final = "search_tools"
MAX_RESULTS: Final = 50
MAX_QUERY_CHARS: Final = 1000
MAX_QUERY_WORDS: Final = 32
# Scopes whose searches stay loaded; the registry bounds its per-scope view cache the same way.
MAX_LOADED_SCOPES: Final = 1024
# A word is a run of letters and digits of any script: "задачу" and "résumé" are words
# (an ASCII-only word made a Cyrillic description unfindable and split "résumé" into "r", "sum").
_WORD = re.compile(r"[^\W_]+")
# Scripts written without spaces between words (Chinese, Japanese kana and kanji): each
# character is taken as a word, so "创建问题" finds "创建一个新的问题".
_UNSPACED = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")

# "affects" covers whatever the host's ``defer`` globs name (strict mode checks every
# deferral against it); the plugin decides no calls: it has no listeners or guards.
DSH_CAPABILITIES: dict[str, list[str]] = {"tools": [DEFAULT_NAME], "affects": ["*"]}


def _results_problem(value: int) -> str | None:
    if type(value) is not int or not 1 <= value <= MAX_RESULTS:
        return f"must be an integer from 1 to {MAX_RESULTS}, got {value!r}"
    return None


def _patterns_problem(value: tuple[str, ...]) -> str | None:
    return "lists tool names or globs; an empty one defers nothing" if "" in value else None


@attrs.frozen(kw_only=True)
class ToolSearchSettings:
    """The ``[plugins.tool_search]`` table."""

    enabled: bool = False
    defer: Annotated[tuple[str, ...], TableCheck(_patterns_problem)] = attrs.field(
        default=(), validator=check_validator(_patterns_problem)
    )
    max_results: Annotated[int, TableCheck(_results_problem)] = attrs.field(
        default=5, validator=check_validator(_results_problem)
    )


@attrs.frozen(kw_only=True, slots=True)
class SearchMatch:
    """One tool a query matched, with its score (higher first)."""

    tool: ToolDefinition
    score: float


def _words(text: str) -> list[str]:
    # snake_case, kebab-case, "prefix__name" and camelCase all split into words. NFKC and
    # casefold, so that "Résumé" typed composed or decomposed, or "STRASSE" for "Straße", meet.
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", text)
    spaced = _UNSPACED.sub(r" \g<0> ", unicodedata.normalize("NFKC", spaced))
    return _WORD.findall(spaced.casefold())


@attrs.frozen(slots=True)
class _Words:
    """A tool's name and description words, as a set (exact matches) and sorted (word starts)."""

    name: frozenset[str]
    name_sorted: tuple[str, ...]
    description: frozenset[str]
    description_sorted: tuple[str, ...]

    @classmethod
    def of(cls, tool: ToolDefinition) -> _Words:
        name, description = set(_words(tool.name)), set(_words(tool.description))
        return cls(frozenset(name), tuple(sorted(name)), frozenset(description), tuple(sorted(description)))


# Per definition, computed once: a search over many tools must not re-split every description each time.
_WORDS_CACHE: weakref.WeakKeyDictionary[ToolDefinition, _Words] = weakref.WeakKeyDictionary()


def _words_of(tool: ToolDefinition) -> _Words:
    words = _WORDS_CACHE.get(tool)
    if words is None:
        words = _WORDS_CACHE[tool] = _Words.of(tool)
    return words


def _starts_one(word: str, candidates: tuple[str, ...]) -> bool:
    """Whether some candidate starts with ``word`` (``candidates`` sorted)."""
    index = bisect.bisect_left(candidates, word)
    return index < len(candidates) and candidates[index].startswith(word)


def _score(query_words: list[str], words: _Words) -> float:
    score = 0.0
    for word in query_words:
        if word in words.name:
            score += 3
        elif len(word) >= 3 and _starts_one(word, words.name_sorted):
            score += 1.5
        if word in words.description:
            score += 1
        elif len(word) >= 3 and _starts_one(word, words.description_sorted):
            score += 0.5
    return score


def rank_tools(query: str, tools: list[ToolDefinition], limit: int) -> list[SearchMatch]:
    """The ``limit`` best matches of ``query`` among ``tools`` (none that share no word with it)."""
    query_words = list(dict.fromkeys(_words(query)))
    exact = query.strip()
    matches = []
    for tool in tools:
        score = _score(query_words, _words_of(tool))
        if tool.name == exact:
            score += 100
        if score > 0:
            matches.append(SearchMatch(tool=tool, score=score))
    matches.sort(key=lambda match: (-match.score, len(match.tool.name), match.tool.name))
    return matches[:limit]


def _render(args: Any, value: Any) -> list[TextBlock]:
    found = value["tools"]
    if not found:
        waiting = value["deferred"]
        return [
            TextBlock(
                f"No tool matches {args['query']!r} ({waiting} more tool{'s' if waiting != 1 else ''} can be found "
                "by searching; try other words for what you want to do)."
            )
        ]
    lines = [f"{len(found)} tool{'s' if len(found) != 1 else ''} found; you can call them now:"]
    for tool in found:
        # The parameters too: a host that does not refresh the tool list mid-turn (an MCP
        # client that missed the change, say) still leaves the model able to call them.
        lines.append(f"- {tool['name']}: {tool['description']}")
        lines.append(f"  parameters: {json_text(tool['parameters'])}")
    return [TextBlock("\n".join(lines))]


class LoadedSets:
    """What searches loaded, per scope, kept with their disposers so it can be released.

    A host that makes a fresh ``Agent`` per task would otherwise keep, for
    every agent that ever searched, a registry layer holding its loaded names.
    At most ``max_scopes`` scopes keep what they loaded: past that, the scope
    that searched least recently has its loads released (its model no longer
    sees those schemas, and finds them again by searching).
    """

    def __init__(self, runtime: ToolRuntime, max_scopes: int = MAX_LOADED_SCOPES) -> None:
        if type(max_scopes) is not int or max_scopes < 1:
            raise ValueError(f"max_loaded_scopes must be a positive integer, got {max_scopes!r}")
        self.runtime = runtime
        self.max_scopes = max_scopes
        self._by_scope: OrderedDict[ScopeKey | None, list[Disposer]] = OrderedDict()

    def load(self, names: list[str], scope: ScopeKey | None) -> None:
        """Load ``names`` for ``scope`` (none: only mark it as the latest to search)."""
        # Loaded first: if loading raises, what the scope already holds stays recorded.
        disposer = self.runtime.load_tools(names, scope) if names else None
        disposers = self._by_scope.pop(scope, [])
        if disposer is not None:
            disposers.append(disposer)
        if disposers:
            self._by_scope[scope] = disposers
        while len(self._by_scope) > self.max_scopes:
            _, oldest = self._by_scope.popitem(last=False)
            _release(oldest)

    def release(self) -> None:
        """Unload everything searches loaded, for every scope."""
        while self._by_scope:
            _, disposers = self._by_scope.popitem(last=False)
            _release(disposers)


def _release(disposers: list[Disposer]) -> None:
    for disposer in disposers:
        disposer()


def search_tool(
    runtime: ToolRuntime,
    *,
    name: str = DEFAULT_NAME,
    max_results: int = 5,
    max_loaded_scopes: int = MAX_LOADED_SCOPES,
    loaded: LoadedSets | None = None,
) -> ToolDefinition:
    """The search tool over ``runtime``'s deferred tools, loading what it finds for the calling agent.

    A call with an agent loads its matches for that agent alone. A call without
    one loads them for the global scope: the only scope an agent-less host
    has, and one every agent inherits (in a host that also runs agents, search
    as the agent to keep them apart). What was loaded is kept in ``loaded``
    (a fresh :class:`LoadedSets` of ``max_loaded_scopes`` by default), which
    releases the least recently searching scope's loads past its bound.
    """
    sets = loaded if loaded is not None else LoadedSets(runtime, max_loaded_scopes)

    async def execute(args: Any, run: ToolRunContext) -> dict[str, Any]:
        agent = run.agent
        waiting = {tool.name for tool in runtime.deferred_tools(agent)}
        # Loaded ones too: searching again for a tool already found finds it again.
        # Never itself, by the name it was called under (a host's prefix renames it).
        searchable = [tool for tool in runtime.deferred_tools(agent, include_loaded=True) if tool.name != run.name]
        query = args["query"]
        # The model's text: bounded, since the ranking runs on the event loop.
        if len(query) > MAX_QUERY_CHARS or len(set(_words(query))) > MAX_QUERY_WORDS:
            raise DshError(
                f"the query is too long (at most {MAX_QUERY_CHARS} characters and {MAX_QUERY_WORDS} different "
                "words): describe what you want to do in a few words",
                code=ErrorCode.INVALID_ARGS,
            )
        asked = args.get("limit", max_results)
        if asked < 1:
            raise DshError(f"limit must be at least 1, got {asked}", code=ErrorCode.INVALID_ARGS)
        limit = min(int(asked), max_results)  # the schema's integer admits 2.0
        matches = rank_tools(query, searchable, limit)
        to_load = [match.tool.name for match in matches if match.tool.name in waiting]
        sets.load(to_load, agent)
        return {
            "tools": [
                {
                    "name": match.tool.name,
                    "description": match.tool.description,
                    "parameters": thaw(match.tool.parameters),
                }
                for match in matches
            ],
            "deferred": len(waiting) - len(to_load),
        }

    return define_tool(
        name=name,
        description=(
            "Find tools that are not in your tool list yet. Describe what you want to do in a few words "
            f"(for example: 'create a github issue'); the best matches (at most {max_results}) are added to "
            "your tools and you can call them right after this."
        ),
        parameters={
            "query": {"type": "string", "required": True, "description": "What you want to do, in a few words."},
            "limit": {"type": "integer", "description": f"At most this many tools (default and most: {max_results})."},
        },
        output=ToolOutput(
            schema={
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "tools": {
                        "type": "array",
                        "required": True,
                        "items": {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": {
                                "name": {"type": "string", "required": True},
                                "description": {"type": "string", "required": True},
                                "parameters": {"type": "json", "required": True},
                            },
                        },
                    },
                    "deferred": {"type": "integer", "required": True},
                },
            },
            render=_render,
        ),
        execute=execute,
        effects=ToolEffects(read_only=True, idempotent=True),
    )


@attrs.frozen
class SearchDiagnostic:
    """A warning for ``dsh-tools check``."""

    message: str
    level: str = "warning"

    def __str__(self) -> str:
        return self.message


class ToolSearch:
    """The plugin object ``dsh_setup`` registers (as ``tool-search``): it reports what ``check`` should show."""

    def __init__(
        self, runtime: ToolRuntime, defer: tuple[str, ...], name: str = DEFAULT_NAME, loaded: LoadedSets | None = None
    ) -> None:
        self.runtime = runtime
        self.defer = defer
        self.name = name  # as registered: a host's [tool_prefixes] may have renamed it
        self.loaded = loaded

    def release_loaded(self) -> None:
        """Unload every tool a search loaded, for every agent (a host ending a session, or dropping the plugin)."""
        if self.loaded is not None:
            self.loaded.release()

    def diagnostics(self) -> list[SearchDiagnostic]:
        """``defer`` globs that match no registered tool or the search tool, and a search with nothing to find."""
        search = self.name
        names = {definition.name for _, definition in self.runtime.registrations()} - {search}
        out = []
        for pattern in self.defer:
            other = "no registered tool"
            if fnmatch.fnmatchcase(search, pattern):
                out.append(
                    SearchDiagnostic(
                        f"defer pattern {pattern!r} matches {search} itself, which stays in the tool list: "
                        "the model needs it to find the deferred tools"
                    )
                )
                other = "no other registered tool"
            if not any(fnmatch.fnmatchcase(name, pattern) for name in names):
                out.append(SearchDiagnostic(f"defer pattern {pattern!r} matches {other}"))
        if not [tool for tool in self.runtime.deferred_tools(include_loaded=True) if tool.name != search]:
            out.append(SearchDiagnostic(f"{search} has nothing to find: no tool is deferred"))
        return out


@hookimpl
def dsh_setup(runtime: ToolRuntime, config: dict[str, Any]) -> None:
    """Register the search tool (never deferred) and defer the ``defer`` globs when ``enabled = true``."""
    settings = structure_table(ToolSearchSettings, config, "[plugins.tool_search]")
    if not settings.enabled:
        if settings.defer:
            # Deferred tools with no way to find them would be lost to the model.
            raise ConfigError(["[plugins.tool_search].defer: needs enabled = true (nothing could find those tools)"])
        report_inert_keys(
            runtime, "tool_search", config, "enabled", "tool search is off: set enabled = true to turn it on"
        )
        return
    try:
        loaded = LoadedSets(runtime)
        name = runtime.register(search_tool(runtime, max_results=settings.max_results, loaded=loaded)).name
        # Loaded for every scope before anything is deferred, so no glob here (or a
        # host's defer_tools later) ever hides the one tool that finds the others.
        runtime.load_tools([name])
        if settings.defer:
            runtime.defer_tools(settings.defer)
    except RegistrationError as exc:
        raise ConfigError([f"[plugins.tool_search]: {exc}"]) from None
    runtime.plugins.register(ToolSearch(runtime, settings.defer, name, loaded), name="tool-search")
