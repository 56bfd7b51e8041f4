"""Deferred tools (``defer_loading``, ``defer_tools``, ``load_tools``) and the ``tool_search`` plugin."""

from __future__ import annotations

from typing import Any

import pytest

from dsh_core import (
    Agent,
    ConfigError,
    DshConfig,
    RegistrationError,
    TextBlock,
    ToolRuntime,
    define_tool,
    discover_entry_points,
    hookimpl,
    load_plugins,
)
from dsh_core.testing import FakeCodeRuntime, json_tool, make_input, make_runtime
from dsh_plugins import tool_search
from dsh_plugins.tool_search import DEFAULT_NAME, MAX_QUERY_CHARS, MAX_QUERY_WORDS, rank_tools, search_tool


def described(name: str, description: str = "") -> Any:
    """A tool whose description is only ``description`` (json_tool's would repeat the name)."""

    async def body(args: Any) -> Any:
        return args

    return define_tool(name=name, description=description, parameters={}, output={"type": "json"}, execute=body)


def schema_names(runtime: ToolRuntime, scope: Any = None) -> list[str]:
    return [schema.name for schema in runtime.schemas(scope)]


class Changes:
    def __init__(self) -> None:
        self.count = 0

    @hookimpl
    def dsh_tools_change(self) -> None:
        self.count += 1


def tools_for_search() -> list[Any]:
    return [
        json_tool("read_file"),
        json_tool("github__create_issue", defer_loading=True),
        json_tool("github__list_pulls", defer_loading=True),
        json_tool("jira__create_ticket", defer_loading=True),
        json_tool("send_email", defer_loading=True),
    ]


# -- the registry: what is deferred and what is shown --------------------------------------------


async def test_a_deferred_tool_is_left_out_of_schemas_but_stays_callable() -> None:
    runtime = make_runtime(json_tool("shown"), json_tool("hidden", defer_loading=True))
    assert schema_names(runtime) == ["shown"]
    assert runtime.get("hidden") is not None and "hidden" in runtime.names()
    result = await runtime.execute(make_input("hidden", {"x": 1}))
    assert not result.is_error and result.value == {"x": 1}
    assert [tool.name for tool in runtime.deferred_tools()] == ["hidden"]


def test_loading_shows_the_schema_to_that_scope_only() -> None:
    a, b = Agent("a"), Agent("b")
    runtime = make_runtime(json_tool("hidden", defer_loading=True))
    disposer = runtime.load_tools(["hidden"], a)
    assert schema_names(runtime, a) == ["hidden"]
    assert schema_names(runtime, b) == [] and schema_names(runtime) == []
    assert runtime.deferred_tools(a) == [] and runtime.deferred_tools(a, include_loaded=True)[0].name == "hidden"
    disposer()
    assert schema_names(runtime, a) == []


def test_loading_for_every_scope_and_for_a_parent() -> None:
    parent = Agent("parent")
    child = Agent("child", parent=parent)
    runtime = make_runtime(json_tool("p", defer_loading=True), json_tool("g", defer_loading=True))
    runtime.load_tools(["p"], parent)
    runtime.load_tools(["g"])
    assert schema_names(runtime, child) == ["p", "g"]
    assert schema_names(runtime, parent) == ["p", "g"]
    assert schema_names(runtime) == ["g"]


def test_a_name_loaded_twice_stays_loaded_until_both_are_disposed() -> None:
    runtime = make_runtime(json_tool("hidden", defer_loading=True))
    first = runtime.load_tools(["hidden"])
    second = runtime.load_tools(["hidden", "hidden"])
    first()
    assert schema_names(runtime) == ["hidden"]
    second()
    assert schema_names(runtime) == []
    second()  # idempotent
    assert schema_names(runtime) == []


def test_loading_a_tool_that_is_not_deferred_changes_nothing() -> None:
    runtime = make_runtime(json_tool("shown"))
    runtime.load_tools(["shown"])
    assert schema_names(runtime) == ["shown"]


@pytest.mark.parametrize(
    ("names", "error", "message"),
    [
        (["nope"], RegistrationError, 'load_tools\\(\\) names tools this scope cannot see: "nope"'),
        ("hidden", TypeError, "takes a list of tool names, got str"),
        ([1], TypeError, "takes tool names \\(str\\), got 1"),
    ],
)
def test_load_tools_refuses_what_it_cannot_load(names: Any, error: type[Exception], message: str) -> None:
    runtime = make_runtime(json_tool("hidden", defer_loading=True))
    with pytest.raises(error, match=message):
        runtime.load_tools(names)
    assert schema_names(runtime) == []


def test_load_tools_cannot_reach_a_tool_another_scope_registered() -> None:
    a, b = Agent("a"), Agent("b")
    runtime = make_runtime()
    runtime.register(json_tool("private", defer_loading=True), a)
    with pytest.raises(RegistrationError, match="cannot see"):
        runtime.load_tools(["private"], b)


def test_defer_tools_defers_by_glob_including_later_registrations() -> None:
    runtime = make_runtime(json_tool("github__a"), json_tool("local"))
    lift = runtime.defer_tools(["github__*"])
    runtime.register(json_tool("github__b"))
    assert schema_names(runtime) == ["local"]
    assert sorted(tool.name for tool in runtime.deferred_tools()) == ["github__a", "github__b"]
    lift()
    assert schema_names(runtime) == ["github__a", "local", "github__b"]


def test_defer_tools_in_a_scope_applies_to_it_and_below() -> None:
    parent = Agent("parent")
    child = Agent("child", parent=parent)
    runtime = make_runtime(json_tool("x"))
    runtime.defer_tools(["x"], parent)
    assert schema_names(runtime, child) == [] and schema_names(runtime, parent) == []
    assert schema_names(runtime) == ["x"]


@pytest.mark.parametrize(
    ("patterns", "error", "message"),
    [
        ([], RegistrationError, "defers nothing"),
        ("x*", TypeError, "got str"),
        ([""], TypeError, "non-empty str"),
        ([None], TypeError, "non-empty str"),
    ],
)
def test_defer_tools_refuses_bad_patterns(patterns: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        make_runtime(json_tool("x")).defer_tools(patterns)


def test_loading_and_deferring_are_tool_set_changes() -> None:
    changes = Changes()
    runtime = make_runtime(json_tool("hidden", defer_loading=True), plugins=[changes])
    before = changes.count
    unload = runtime.load_tools(["hidden"])
    lift = runtime.defer_tools(["other"])
    unload()
    lift()
    assert changes.count == before + 4


async def test_code_mode_renders_only_what_is_loaded_in_the_sdk() -> None:
    async def program(tools: Any) -> None:
        return None

    runtime = ToolRuntime(mode="both", code_runtime=FakeCodeRuntime(program))
    runtime.register(json_tool("shown"))
    runtime.register(json_tool("hidden_tool", defer_loading=True))
    runtime.defer_tools(["*"])  # "*" matches run_code too, which is never deferred
    tools = runtime.model_tools()
    assert [schema.name for schema in tools.schemas] == ["run_code"]
    assert "hidden_tool" not in tools.instructions and "shown" not in tools.instructions
    runtime.load_tools(["hidden_tool"])
    tools = runtime.model_tools()
    assert [schema.name for schema in tools.schemas] == ["hidden_tool", "run_code"]
    assert "hidden_tool" in tools.instructions and "def shown" not in tools.instructions


# -- ranking ------------------------------------------------------------------------------------


def test_a_word_of_the_name_outranks_a_word_of_the_description() -> None:
    tools = [described("send_email"), described("notify", "Send a message to a channel")]
    ranked = rank_tools("send", tools, 5)
    assert [match.tool.name for match in ranked] == ["send_email", "notify"]
    assert ranked[0].score == 3 and ranked[1].score == 1


def test_the_query_naming_a_tool_puts_it_first() -> None:
    tools = [described("issue_create_issue_now"), described("create_issue")]
    ranked = rank_tools("create_issue", tools, 5)
    assert ranked[0].tool.name == "create_issue"


def test_word_starts_match_and_unrelated_tools_are_left_out() -> None:
    tools = [described("github__list_pulls"), described("deleteEverything"), described("weather")]
    assert [m.tool.name for m in rank_tools("pull", tools, 5)] == ["github__list_pulls"]
    assert [m.tool.name for m in rank_tools("delete everything", tools, 5)] == ["deleteEverything"]
    assert rank_tools("zz", tools, 5) == []
    assert rank_tools("", tools, 5) == []


def test_words_of_any_script_are_words() -> None:
    tools = [
        described("zadacha", "Создать задачу в трекере"),
        described("kaiyi", "创建一个新的问题"),
        described("resumer", "Résumé d'un document"),
        described("summarize", "Summarize text"),
        described("strassen", "Straße sperren"),
    ]
    assert [m.tool.name for m in rank_tools("создать задачу", tools, 5)] == ["zadacha"]
    assert [m.tool.name for m in rank_tools("Создать", tools, 5)] == ["zadacha"]
    assert [m.tool.name for m in rank_tools("创建问题", tools, 5)] == ["kaiyi"]
    # One word, not "r" and "sum" (which matched Summarize), composed or decomposed alike.
    assert [m.tool.name for m in rank_tools("résumé", tools, 5)] == ["resumer"]
    assert [m.tool.name for m in rank_tools("re\u0301sume\u0301", tools, 5)] == ["resumer"]
    assert [m.tool.name for m in rank_tools("STRASSE", tools, 5)] == ["strassen"]


def test_ties_go_to_the_shorter_then_first_name_and_limit_cuts() -> None:
    tools = [described("b_issue"), described("a_issue"), described("issue_long")]
    assert [m.tool.name for m in rank_tools("issue", tools, 2)] == ["a_issue", "b_issue"]


# -- the search tool ------------------------------------------------------------------------------


async def test_searching_loads_the_matches_for_the_calling_agent() -> None:
    agent = Agent("a")
    runtime = make_runtime(*tools_for_search())
    runtime.register(search_tool(runtime, max_results=3))
    assert schema_names(runtime, agent) == ["read_file", DEFAULT_NAME]
    result = await runtime.execute(make_input(DEFAULT_NAME, {"query": "create a github issue"}, agent=agent))
    assert not result.is_error, result
    names = [tool["name"] for tool in result.value["tools"]]
    assert names == ["github__create_issue", "github__list_pulls", "jira__create_ticket"]
    assert result.value["tools"][0]["parameters"] == {"type": "object", "properties": {}}
    assert result.value["deferred"] == 1  # send_email is still waiting
    assert set(schema_names(runtime, agent)) == {"read_file", DEFAULT_NAME, *names}
    assert schema_names(runtime) == ["read_file", DEFAULT_NAME]  # another agent still sees none
    assert isinstance(result.content[0], TextBlock)
    assert result.content[0].text.startswith(
        "3 tools found; you can call them now:\n- github__create_issue: test tool github__create_issue\n"
        '  parameters: {"type": "object", "properties": {}}\n'
    )


async def test_a_second_search_finds_loaded_tools_again() -> None:
    runtime = make_runtime(*tools_for_search())
    runtime.register(search_tool(runtime))
    await runtime.execute(make_input(DEFAULT_NAME, {"query": "email"}))
    again = await runtime.execute(make_input(DEFAULT_NAME, {"query": "email"}))
    assert [tool["name"] for tool in again.value["tools"]] == ["send_email"]
    assert again.value["deferred"] == 3


async def test_no_match_says_how_many_tools_remain_to_be_found() -> None:
    runtime = make_runtime(*tools_for_search())
    runtime.register(search_tool(runtime))
    result = await runtime.execute(make_input(DEFAULT_NAME, {"query": "weather"}))
    assert result.value == {"tools": [], "deferred": 4}
    assert result.content[0].text.startswith("No tool matches 'weather' (4 more tools can be found")  # type: ignore[union-attr]


async def test_limit_is_capped_by_max_results() -> None:
    runtime = make_runtime(*tools_for_search())
    runtime.register(search_tool(runtime, max_results=1))
    result = await runtime.execute(make_input(DEFAULT_NAME, {"query": "create", "limit": 10}))
    assert len(result.value["tools"]) == 1


@pytest.mark.parametrize("limit", [1.0, 1e300])
async def test_an_integral_float_limit_is_the_integer_it_is(limit: float) -> None:
    """The schema's integer takes 1.0, which then failed as a slice index (an internal TypeError)."""
    runtime = make_runtime(*tools_for_search())
    runtime.register(search_tool(runtime))
    result = await runtime.execute(make_input(DEFAULT_NAME, {"query": "create", "limit": limit}))
    assert not result.is_error, result
    assert len(result.value["tools"]) == (1 if limit == 1 else 2)


@pytest.mark.parametrize("limit", [0, -3])
async def test_a_limit_below_one_is_the_models_mistake_and_says_so(limit: int) -> None:
    runtime = make_runtime(*tools_for_search())
    runtime.register(search_tool(runtime))
    result = await runtime.execute(make_input(DEFAULT_NAME, {"query": "create", "limit": limit}))
    assert result.code == "INVALID_ARGS"
    assert result.error.message == f"limit must be at least 1, got {limit}"
    assert runtime.deferred_tools() != []  # nothing was loaded


@pytest.mark.parametrize("query", ["x" * (MAX_QUERY_CHARS + 1), " ".join(f"w{n}" for n in range(MAX_QUERY_WORDS + 1))])
async def test_a_query_past_its_bounds_is_refused_before_any_ranking(query: str) -> None:
    runtime = make_runtime(*tools_for_search())
    runtime.register(search_tool(runtime))
    result = await runtime.execute(make_input(DEFAULT_NAME, {"query": query}))
    assert result.code == "INVALID_ARGS" and "the query is too long" in result.error.message


async def test_a_query_at_its_bounds_is_ranked() -> None:
    runtime = make_runtime(*tools_for_search())
    runtime.register(search_tool(runtime))
    words = " ".join(["email", *(f"w{n}" for n in range(MAX_QUERY_WORDS - 1))])
    result = await runtime.execute(make_input(DEFAULT_NAME, {"query": words}))
    assert [tool["name"] for tool in result.value["tools"]] == ["send_email"]


async def test_the_search_never_lists_tools_that_are_not_deferred() -> None:
    runtime = make_runtime(json_tool("create_file"), json_tool("create_issue", defer_loading=True))
    runtime.register(search_tool(runtime))
    result = await runtime.execute(make_input(DEFAULT_NAME, {"query": "create"}))
    assert [tool["name"] for tool in result.value["tools"]] == ["create_issue"]


async def test_a_code_mode_program_can_search_then_call_what_it_found() -> None:
    found: list[Any] = []

    async def program(tools: Any) -> None:
        found.append(await tools[DEFAULT_NAME]({"query": "email"}))
        found.append(await tools["send_email"]({"to": "x"}))

    runtime = ToolRuntime(mode="code", code_runtime=FakeCodeRuntime(program))
    for tool in tools_for_search():
        runtime.register(tool)
    runtime.register(search_tool(runtime))
    result = await runtime.execute(make_input("run_code", {"code": "...", "description": "d"}))
    assert not result.is_error, result
    assert [tool["name"] for tool in found[0]["tools"]] == ["send_email"]
    assert found[1] == {"to": "x"}


# -- the plugin -----------------------------------------------------------------------------------


def test_the_plugin_does_nothing_unless_enabled() -> None:
    runtime = ToolRuntime()
    tool_search.dsh_setup(runtime, {})
    assert runtime.names() == []


def test_defer_without_enabled_is_a_configuration_error() -> None:
    with pytest.raises(ConfigError, match=r"\[plugins\.tool_search\]\.defer: needs enabled = true"):
        tool_search.dsh_setup(ToolRuntime(), {"defer": ["x*"]})


@pytest.mark.parametrize("table", [{"enabled": True, "max_results": 0}, {"enabled": True, "max_results": 51}])
def test_max_results_out_of_range_is_a_configuration_error(table: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="max_results"):
        tool_search.dsh_setup(ToolRuntime(), table)


def test_an_unknown_key_is_a_configuration_error() -> None:
    with pytest.raises(ConfigError, match="limit"):
        tool_search.dsh_setup(ToolRuntime(), {"enabled": True, "limit": 3})


def test_the_entry_point_defers_the_configured_globs_and_registers_the_search() -> None:
    runtime = make_runtime(json_tool("github__a"), json_tool("local"))
    config = DshConfig(plugins={"tool_search": {"enabled": True, "defer": ["github__*"]}})
    (point,) = [point for point in discover_entry_points() if point.name == "tool_search"]
    report = load_plugins(runtime, config=config, entry_points=[point])
    assert list(report.failed) == []
    assert schema_names(runtime) == ["local", DEFAULT_NAME]
    assert [tool.name for tool in runtime.deferred_tools()] == ["github__a"]


async def test_under_a_tool_prefix_the_search_is_loaded_finds_and_diagnoses_under_its_registered_name() -> None:
    runtime = make_runtime(json_tool("github__a"), json_tool("local"))
    config = DshConfig(
        plugins={"tool_search": {"enabled": True, "defer": ["*"]}}, tool_prefixes={"tool_search": "ts"}
    )
    (point,) = [point for point in discover_entry_points() if point.name == "tool_search"]
    report = load_plugins(runtime, config=config, entry_points=[point])
    assert [plugin.tools for plugin in report.loaded] == [("ts__search_tools",)]
    # Loaded before the "*" glob deferred everything: the model can still see the search.
    assert schema_names(runtime) == ["ts__search_tools"]
    result = await runtime.execute(make_input("ts__search_tools", {"query": "search tools github local"}))
    assert sorted(tool["name"] for tool in result.value["tools"]) == ["github__a", "local"]  # never itself
    plugin = runtime.plugins.get_plugin("tool-search")
    assert isinstance(plugin, tool_search.ToolSearch)
    assert [str(d) for d in plugin.diagnostics()] == [
        "defer pattern '*' matches ts__search_tools itself, which stays in the tool list: "
        "the model needs it to find the deferred tools"
    ]


async def test_a_defer_glob_never_hides_the_search_tool_itself() -> None:
    runtime = make_runtime(json_tool("github__a"), json_tool("local"))
    tool_search.dsh_setup(runtime, {"enabled": True, "defer": ["*"]})
    runtime.defer_tools([DEFAULT_NAME], Agent("a"))  # nor a host's deferring, in any scope
    assert schema_names(runtime) == [DEFAULT_NAME]
    assert schema_names(runtime, Agent("a")) == [DEFAULT_NAME]
    result = await runtime.execute(make_input(DEFAULT_NAME, {"query": "github"}))
    assert [tool["name"] for tool in result.value["tools"]] == ["github__a"]
    assert result.value["deferred"] == 1  # local; the search is not counted as a tool to find


def test_diagnostics_say_the_search_tool_stays_listed_when_a_defer_glob_matches_it() -> None:
    runtime = make_runtime(json_tool("github__a"))
    tool_search.dsh_setup(runtime, {"enabled": True, "defer": ["*", "search_*", "github__*"]})
    plugin = runtime.plugins.get_plugin("tool-search")
    assert isinstance(plugin, tool_search.ToolSearch)
    assert [str(diagnostic) for diagnostic in plugin.diagnostics()] == [
        f"defer pattern '*' matches {DEFAULT_NAME} itself, which stays in the tool list: "
        "the model needs it to find the deferred tools",
        f"defer pattern 'search_*' matches {DEFAULT_NAME} itself, which stays in the tool list: "
        "the model needs it to find the deferred tools",
        "defer pattern 'search_*' matches no other registered tool",
    ]


def test_the_search_tool_alone_is_not_something_to_find() -> None:
    runtime = make_runtime(json_tool("local"))
    tool_search.dsh_setup(runtime, {"enabled": True, "defer": ["search_*"]})
    plugin = runtime.plugins.get_plugin("tool-search")
    assert isinstance(plugin, tool_search.ToolSearch)
    assert f"{DEFAULT_NAME} has nothing to find: no tool is deferred" in map(str, plugin.diagnostics())


# -- what searches loaded, and for whom ----------------------------------------------------------


async def search_as(runtime: ToolRuntime, agent: Any, query: str = "email") -> None:
    result = await runtime.execute(make_input(DEFAULT_NAME, {"query": query}, agent=agent))
    assert not result.is_error, result


async def test_an_agents_search_is_shown_to_that_agent_only() -> None:
    searcher, other = Agent("searcher"), Agent("other")
    runtime = make_runtime(*tools_for_search())
    runtime.register(search_tool(runtime))
    await search_as(runtime, searcher)
    assert "send_email" in schema_names(runtime, searcher)
    assert "send_email" not in schema_names(runtime, other)
    assert "send_email" not in schema_names(runtime)


async def test_a_search_without_an_agent_loads_for_the_global_scope() -> None:
    # Documented: a call without an agent has only the global scope, which every agent inherits.
    runtime = make_runtime(*tools_for_search())
    runtime.register(search_tool(runtime))
    await search_as(runtime, None)
    assert "send_email" in schema_names(runtime)
    assert "send_email" in schema_names(runtime, Agent("any"))


async def test_past_the_bound_the_least_recently_searching_agent_loses_its_loaded_tools() -> None:
    first, second, third = Agent("first"), Agent("second"), Agent("third")
    runtime = make_runtime(*tools_for_search())
    runtime.register(search_tool(runtime, max_loaded_scopes=2))
    await search_as(runtime, first)
    await search_as(runtime, second)
    await search_as(runtime, first, "jira ticket")  # first searched last: second is the oldest now
    await search_as(runtime, third)
    assert {"send_email", "jira__create_ticket"} <= set(schema_names(runtime, first))
    assert "send_email" in schema_names(runtime, third)
    assert "send_email" not in schema_names(runtime, second)  # released: it can search again
    assert "send_email" in [tool.name for tool in runtime.deferred_tools(second)]
    assert second not in runtime._registry._layers  # its layer held nothing else: reclaimed, not kept forever
    assert first in runtime._registry._layers


async def test_the_plugin_releases_every_loaded_set() -> None:
    runtime = make_runtime(*tools_for_search())
    config = DshConfig(plugins={"tool_search": {"enabled": True}})
    (point,) = [point for point in discover_entry_points() if point.name == "tool_search"]
    load_plugins(runtime, config=config, entry_points=[point])
    agents = [Agent(f"a{index}") for index in range(3)]
    for agent in [*agents, None]:
        await search_as(runtime, agent)
    plugin = runtime.plugins.get_plugin("tool-search")
    assert isinstance(plugin, tool_search.ToolSearch)
    plugin.release_loaded()
    assert all("send_email" not in schema_names(runtime, agent) for agent in [*agents, None])
    assert not any(agent in runtime._registry._layers for agent in agents)
    assert DEFAULT_NAME in schema_names(runtime)  # the search itself stays loaded
