"""The permissions plugin (dsh_plugins.permissions): ordered rules, argument globs, defaults, ask."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from dsh_core import (
    Agent,
    Allow,
    Ask,
    CancelSignal,
    ConfigError,
    Deny,
    Rewrite,
    ToolEffects,
    ToolExecution,
    ToolExecutionFailure,
    ToolExecutionResult,
    ToolExecutionToken,
    ToolRuntime,
    hookimpl,
    trace_of,
)
from dsh_core._execution import new_execution
from dsh_core.testing import StaticApproval, json_tool, make_input, make_runtime
from dsh_plugins import permissions
from dsh_plugins.permissions import PathSyntaxError, parse_path

TOOLS = ("read_file", "write_file", "write_config", "shell")


def runtime_with(config: dict[str, Any], *, approval: StaticApproval | None = None) -> ToolRuntime:
    runtime = make_runtime(*(json_tool(name) for name in TOOLS), approval=approval)
    permissions.dsh_setup(runtime, config)
    return runtime


def denial(result: ToolExecutionResult) -> str:
    assert isinstance(result, ToolExecutionFailure), result
    assert result.code == "DENIED"
    assert result.error.info is not None
    return result.error.message


async def test_first_matching_rule_wins() -> None:
    runtime = runtime_with(
        {
            "rules": [
                {"tool": "write_config", "action": "allow"},
                {"tool": "write_*", "action": "deny"},
            ]
        }
    )
    assert not (await runtime.execute(make_input("write_config"))).is_error
    assert denial(await runtime.execute(make_input("write_file"))) == 'denied by permissions rule #2 (tool "write_*")'


async def test_rule_order_matters() -> None:
    runtime = runtime_with(
        {
            "rules": [
                {"tool": "write_*", "action": "deny"},
                {"tool": "write_config", "action": "allow"},
            ]
        }
    )
    assert denial(await runtime.execute(make_input("write_config"))) == 'denied by permissions rule #1 (tool "write_*")'


async def test_denial_is_blamed_on_the_permissions_plugin() -> None:
    runtime = runtime_with({"rules": [{"tool": "shell", "action": "deny"}]})
    result = await runtime.execute(make_input("shell"))
    assert isinstance(result, ToolExecutionFailure)
    assert result.error.info is not None and result.error.info.plugin == "permissions-policy"


async def test_rule_reason_replaces_the_default_message() -> None:
    runtime = runtime_with({"rules": [{"tool": "shell", "action": "deny", "reason": "no shell in CI"}]})
    assert denial(await runtime.execute(make_input("shell"))) == "no shell in CI"


async def test_tool_globs_are_case_sensitive() -> None:
    runtime = runtime_with({"rules": [{"tool": "SHELL", "action": "deny"}]})
    assert not (await runtime.execute(make_input("shell"))).is_error


@pytest.mark.parametrize(
    ("glob", "arguments", "denied"),
    [
        ("/etc/*", {"path": "/etc/passwd"}, True),
        ("/etc/*", {"path": "/home/me/notes"}, False),
        ("/etc/*", {}, False),  # a missing path never matches
        ("/etc/*", {"path": None}, False),  # null is matched as its JSON text "null"
        ("null", {"path": None}, True),
        ("true", {"path": True}, True),
        ("4?", {"path": 42}, True),
        ('*"rm"*', {"path": ["rm", "-rf"]}, True),  # containers by their compact JSON text
        # ... and by every value inside them: wrapping never dodges a deny rule
        ("/etc/*", {"path": ["/etc/passwd"]}, True),
        ("/etc/*", {"path": {"x": "/etc/passwd"}}, True),
        ("/etc/*", {"path": [[{"deep": ["/home/a", "/etc/shadow"]}]]}, True),
        ("/etc/*", {"path": ["/home/a", {"x": "/tmp/b"}]}, False),
        # An integral float is the integer to an "integer" schema and to the tool: 1.0 and 1e0 dodged "1".
        ("1", {"path": 1.0}, True),
        ("1", {"path": [2, 1.0]}, True),
        ("1", {"path": 1.5}, False),
        ("1.5", {"path": 1.5}, True),
    ],
)
async def test_argument_globs(glob: str, arguments: dict[str, Any], denied: bool) -> None:
    runtime = runtime_with({"rules": [{"tool": "write_file", "args": {"path": glob}, "action": "deny"}]})
    result = await runtime.execute(make_input("write_file", arguments))
    assert result.is_error is denied


@pytest.mark.parametrize(
    ("arguments", "allowed"),
    [
        ({"path": "/workspace/a"}, True),
        ({"path": ["/workspace/a", "/workspace/b"]}, True),
        ({"path": ["/workspace/a", "/etc/passwd"]}, False),  # one path outside must not ride along
        ({"path": {"x": "/workspace/a", "y": 3}}, False),
        ({"path": []}, False),
    ],
)
async def test_an_allow_rule_takes_a_container_only_when_every_value_inside_matches(
    arguments: dict[str, Any], allowed: bool
) -> None:
    runtime = runtime_with(
        {"rules": [{"tool": "write_file", "args": {"path": "/workspace/*"}, "action": "allow"}], "default": "deny"}
    )
    result = await runtime.execute(make_input("write_file", arguments))
    assert result.is_error is not allowed


@pytest.mark.parametrize(
    ("arguments", "allowed"),
    [
        ({"path": "/srv/docs/a.md"}, True),
        ({"path": ["/srv/docs/a.md", "/srv/docs/b.md"]}, True),
        # The container's own text matches the glob; the path outside it must not ride along on that.
        ({"path": ["/etc/shadow", "/srv/docs/a.md"]}, False),
        ({"path": {"x": "/srv/docs/a.md", "y": "/etc/shadow"}}, False),
        ({"path": [["/srv/docs/a.md"], "/etc/shadow"]}, False),
    ],
)
async def test_an_allow_glob_that_matches_a_containers_text_still_needs_every_value(
    arguments: dict[str, Any], allowed: bool
) -> None:
    runtime = runtime_with(
        {
            "rules": [
                {"tool": "write_file", "args": {"path": "*/docs/*"}, "action": "allow"},
                {"tool": "write_file", "action": "deny", "reason": "only docs"},
            ]
        }
    )
    result = await runtime.execute(make_input("write_file", arguments))
    assert result.is_error is not allowed


async def test_nested_and_indexed_argument_paths() -> None:
    runtime = runtime_with(
        {
            "rules": [
                {"tool": "shell", "args": {"config.host": "*.prod.example.com", "argv[0]": "ssh"}, "action": "deny"},
            ]
        }
    )
    prod = {"config": {"host": "db.prod.example.com"}, "argv": ["ssh", "root@db"]}
    assert (await runtime.execute(make_input("shell", prod))).is_error
    staging = {"config": {"host": "db.staging.example.com"}, "argv": ["ssh"]}
    assert not (await runtime.execute(make_input("shell", staging))).is_error
    # every args entry must match (AND)
    other_command = {"config": {"host": "db.prod.example.com"}, "argv": ["ls"]}
    assert not (await runtime.execute(make_input("shell", other_command))).is_error
    # an index past the end, or into a non-array, does not match
    assert not (
        await runtime.execute(make_input("shell", {"config": {"host": "x.prod.example.com"}, "argv": []}))
    ).is_error
    assert not (await runtime.execute(make_input("shell", {"config": "x.prod.example.com", "argv": ["ssh"]}))).is_error


async def test_quoted_keys_reach_keys_with_dots() -> None:
    runtime = runtime_with({"rules": [{"tool": "shell", "args": {'env["A.B"]': "secret*"}, "action": "deny"}]})
    assert (await runtime.execute(make_input("shell", {"env": {"A.B": "secret-1"}}))).is_error
    assert not (await runtime.execute(make_input("shell", {"env": {"A": {"B": "secret-1"}}}))).is_error


@pytest.mark.parametrize(
    ("text", "segments"),
    [
        ("path", ("path",)),
        ("config.host", ("config", "host")),
        ("items[0]", ("items", 0)),
        ("items[12].name", ("items", 12, "name")),
        ('headers["X-Token"]', ("headers", "X-Token")),
        ('["a.b"][1]', ("a.b", 1)),
    ],
)
def test_parse_path(text: str, segments: tuple[Any, ...]) -> None:
    assert parse_path(text) == segments


@pytest.mark.parametrize("text", ["", ".", "a.", ".a", "a..b", "a[", "a[x]", "a[-1]", "a]", 'a["b]', 'a["b"x]'])
def test_parse_path_rejects_malformed_paths(text: str) -> None:
    with pytest.raises(PathSyntaxError):
        parse_path(text)


async def test_agent_glob_matches_the_calling_agents_id() -> None:
    runtime = runtime_with({"rules": [{"tool": "shell", "agent": "reviewer-*", "action": "deny"}]})
    assert (await runtime.execute(make_input("shell", agent=Agent("reviewer-1")))).is_error
    assert not (await runtime.execute(make_input("shell", agent=Agent("builder")))).is_error
    # a call without an Agent never matches a rule that names one
    assert not (await runtime.execute(make_input("shell"))).is_error
    assert not (await runtime.execute(make_input("shell", agent="reviewer-1"))).is_error


async def test_an_agent_rule_covers_the_agents_made_under_it() -> None:
    """A child inherits its parent's scope: a helper made under "reviewer" ran what a rule for "reviewer" denied."""
    runtime = runtime_with({"rules": [{"tool": "shell", "agent": "reviewer", "action": "deny"}]})
    reviewer = Agent("reviewer")
    helper = Agent("helper", parent=reviewer)
    assert (await runtime.execute(make_input("shell", agent=helper))).is_error
    assert (await runtime.execute(make_input("shell", agent=Agent("sub", parent=helper)))).is_error
    assert not (await runtime.execute(make_input("shell", agent=Agent("helper")))).is_error


@pytest.mark.parametrize(
    ("default", "expected"),
    [
        ("allow", None),
        ("deny", 'denied by the permissions default: no rule matched tool "shell"'),
    ],
)
async def test_default_applies_when_no_rule_matches(default: str, expected: str | None) -> None:
    runtime = runtime_with({"default": default, "rules": [{"tool": "read_*", "action": "allow"}]})
    assert not (await runtime.execute(make_input("read_file"))).is_error
    result = await runtime.execute(make_input("shell"))
    if expected is None:
        assert not result.is_error
    else:
        assert denial(result) == expected


async def test_ask_goes_to_the_approval_service_with_the_rule_as_reason() -> None:
    approval = StaticApproval("allowed-once")
    runtime = runtime_with({"rules": [{"tool": "shell", "action": "ask"}]}, approval=approval)
    result = await runtime.execute(make_input("shell", {"cmd": "ls"}, agent=Agent("main")))
    assert not result.is_error
    assert approval.requests == [("shell", 'approval required by permissions rule #1 (tool "shell")')]


async def test_ask_denied_by_the_user_is_a_denial() -> None:
    approval = StaticApproval("denied")
    runtime = runtime_with(
        {"rules": [{"tool": "shell", "action": "ask", "reason": "shell needs a human"}]}, approval=approval
    )
    assert denial(await runtime.execute(make_input("shell", agent=Agent("main")))) == 'the user denied tool "shell"'
    assert approval.requests == [("shell", "shell needs a human")]


async def test_default_ask_without_an_approval_service_denies_with_the_reason() -> None:
    runtime = runtime_with({"default": "ask"})
    message = denial(await runtime.execute(make_input("shell", agent=Agent("main"))))
    assert message == 'approval required by the permissions default: no rule matched tool "shell"'


async def test_allow_leaves_inner_policies_their_say() -> None:
    class InnerDeny:
        @hookimpl(trylast=True)
        async def dsh_pre_execute(self, execution: ToolExecution, next: Callable[[], Awaitable[Any]]) -> Any:
            return Deny("inner policy says no")

    runtime = runtime_with({"rules": [{"tool": "*", "action": "allow"}]})
    runtime.plugins.register(InnerDeny())
    assert denial(await runtime.execute(make_input("shell"))) == "inner policy says no"


@pytest.mark.parametrize("inner_first", [True, False], ids=["inner registered first", "inner registered last"])
async def test_an_ask_rule_never_stands_in_for_an_inner_denial(inner_first: bool) -> None:
    """An answer (or a standing grant) must not run what another policy refuses, whatever the load order."""

    class NeverRm:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Callable[[], Awaitable[Any]]) -> Any:
            if "rm" in execution.arguments.get("cmd", ""):
                return Deny("never rm")
            return await next()

    approval = StaticApproval("allowed-once")
    runtime = make_runtime(*(json_tool(name) for name in TOOLS), approval=approval)
    if inner_first:
        runtime.plugins.register(NeverRm())
    permissions.dsh_setup(runtime, {"rules": [{"tool": "shell", "action": "ask"}]})
    if not inner_first:
        runtime.plugins.register(NeverRm())
    assert denial(await runtime.execute(make_input("shell", {"cmd": "rm -rf /"}, agent=Agent("a")))) == "never rm"
    assert approval.requests == []  # nobody is asked about what is refused anyway
    assert not (await runtime.execute(make_input("shell", {"cmd": "ls"}, agent=Agent("a")))).is_error
    assert len(approval.requests) == 1


class Trimmer:
    """A normaliser that settles by rewriting to what the call has (it never compares).

    ``defers``: it passes on what the layers inside it decide unless they allow; else it ignores it.
    """

    def __init__(self, defers: bool) -> None:
        self.defers = defers

    @hookimpl
    async def dsh_pre_execute(self, execution: ToolExecution, next: Callable[[], Awaitable[Any]]) -> Any:
        decision = await next()
        if self.defers and not isinstance(decision, Allow):
            return decision
        return Rewrite({**execution.arguments, "cmd": execution.arguments["cmd"].strip()}, "trimmed")


def runtime_around_a_trimmer(
    config: dict[str, Any], *, trimmer_outside: bool, defers: bool, approval: StaticApproval, ran: list[Any]
) -> ToolRuntime:
    async def body(args: Any) -> Any:
        ran.append(dict(args))
        return "ran"

    runtime = make_runtime(json_tool("shell", body), approval=approval, trace_decisions=True)
    if not trimmer_outside:
        runtime.plugins.register(Trimmer(defers), name="trimmer")
    permissions.dsh_setup(runtime, config)  # the last registered is the outermost
    if trimmer_outside:
        runtime.plugins.register(Trimmer(defers), name="trimmer")
    return runtime


SETTLING = pytest.mark.parametrize(
    ("trimmer_outside", "defers"),
    [(False, True), (False, False), (True, True), (True, False)],
    ids=["trimmer-inside-deferring", "trimmer-inside", "trimmer-outside-deferring", "trimmer-outside"],
)
CMDS = pytest.mark.parametrize("cmd", ["rm -rf /", "  rm -rf /  "], ids=["already-trimmed", "trimmed"])


@SETTLING
@CMDS
async def test_an_ask_rule_is_asked_once_around_a_settling_normaliser(
    trimmer_outside: bool, defers: bool, cmd: str
) -> None:
    approval, ran = StaticApproval("denied"), []
    runtime = runtime_around_a_trimmer(
        {"rules": [{"tool": "shell", "action": "ask"}]},
        trimmer_outside=trimmer_outside,
        defers=defers,
        approval=approval,
        ran=ran,
    )
    result = await runtime.execute(make_input("shell", {"cmd": cmd}, agent=Agent("a")))
    assert denial(result) == 'the user denied tool "shell"'
    assert approval.requests == [("shell", 'approval required by permissions rule #1 (tool "shell")')]
    assert ran == []
    trace = trace_of(result)
    assert trace is not None
    # (An outside trimmer that ignores the question rewrites the untrimmed call over it: asked on both passes.)
    asked = {(step.actor, step.outcome) for step in trace.stage("pre") if step.outcome.startswith("ask")}
    assert asked == {("permissions-policy", 'ask: approval required by permissions rule #1 (tool "shell")')}
    last = trace.steps[-1]
    assert (last.stage, last.actor, last.outcome) == ("approval", "approval", 'deny: the user denied tool "shell"')


@SETTLING
@CMDS
async def test_a_deny_rule_stands_around_a_settling_normaliser(trimmer_outside: bool, defers: bool, cmd: str) -> None:
    approval, ran = StaticApproval("allowed-once"), []
    runtime = runtime_around_a_trimmer(
        {"rules": [{"tool": "shell", "args": {"cmd": "rm *"}, "action": "deny"}]},
        trimmer_outside=trimmer_outside,
        defers=defers,
        approval=approval,
        ran=ran,
    )
    result = await runtime.execute(make_input("shell", {"cmd": cmd}, agent=Agent("a")))
    assert denial(result) == 'denied by permissions rule #1 (tool "shell")'
    assert isinstance(result, ToolExecutionFailure) and result.error.info is not None
    assert result.error.info.plugin == "permissions-policy"
    assert approval.requests == []
    assert ran == []


async def test_an_ask_rule_passes_on_only_a_rewrite_that_changes_the_call() -> None:
    """The rewritten call comes back through the rule; a rewrite to the same arguments never does."""
    rules = (permissions.Rule(tool="shell", action="ask"),)
    listener = permissions.Permissions(permissions.PermissionsSettings(rules=rules))
    execution = new_execution("c", "c", "shell", {"cmd": "ls"}, CancelSignal(), ToolExecutionToken(), None, None)

    async def rewritten_to(arguments: dict[str, Any]) -> Any:
        async def inner() -> Any:
            return Rewrite(arguments, "normalised")

        return await listener.dsh_pre_execute(execution, inner)

    changed = await rewritten_to({"cmd": "ls -a"})
    assert isinstance(changed, Rewrite) and changed.arguments == {"cmd": "ls -a"}
    assert await rewritten_to({"cmd": "ls"}) == Ask('approval required by permissions rule #1 (tool "shell")')


async def test_deny_short_circuits_inner_policies() -> None:
    seen: list[str] = []

    class Inner:
        @hookimpl(trylast=True)
        async def dsh_pre_execute(self, execution: ToolExecution, next: Callable[[], Awaitable[Any]]) -> Any:
            seen.append(execution.name)
            return await next()

    runtime = runtime_with({"rules": [{"tool": "shell", "action": "deny"}]})
    runtime.plugins.register(Inner())
    await runtime.execute(make_input("shell"))
    await runtime.execute(make_input("read_file"))
    assert seen == ["read_file"]


@pytest.mark.parametrize(
    ("config", "fragments"),
    [
        ({"default": "maybe"}, ["[plugins.permissions].default: expected one of allow/deny/ask"]),
        ({"rules": [{"tool": "x", "action": "block"}]}, ["rules[0].action: expected one of allow/deny/ask"]),
        ({"rules": [{"action": "deny"}]}, ["rules[0].tool: missing required key"]),
        ({"rules": [{"tool": "x", "action": "deny", "args": {"a[": "*"}}]}, ["rules[0]", "unclosed '['"]),
        ({"rules": [{"tool": "x", "action": "deny", "args": {"a": 1}}]}, ["rules[0].args", "expected a string, got 1"]),
        ({"rules": [{"tool": "", "action": "deny"}]}, ["rules[0].tool: must be a non-empty glob"]),
        ({"rules": [{"tool": "x", "action": "deny", "reason": ""}]}, ["rules[0].reason: must be a non-empty text"]),
        ({"rules": [{"tool": "x", "action": "ask", "reason": "  "}]}, ["rules[0].reason: must be a non-empty text"]),
        ({"rule": []}, ['unknown key "rule"']),
    ],
)
def test_bad_config_lists_the_offending_path(config: dict[str, Any], fragments: list[str]) -> None:
    runtime = make_runtime()
    with pytest.raises(ConfigError) as caught:
        permissions.dsh_setup(runtime, config)
    for fragment in fragments:
        assert fragment in str(caught.value)
    assert runtime.plugins.get_plugin("permissions-policy") is None


def test_every_bad_rule_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as caught:
        permissions.dsh_setup(
            make_runtime(), {"rules": [{"tool": "a", "action": "nope"}, {"tool": 3, "action": "deny"}]}
        )
    assert len(caught.value.violations) == 2


def test_each_runtime_gets_its_own_listener() -> None:
    first, second = make_runtime(), make_runtime()
    permissions.dsh_setup(first, {"default": "deny"})
    permissions.dsh_setup(second, {})
    a, b = first.plugins.get_plugin("permissions-policy"), second.plugins.get_plugin("permissions-policy")
    assert isinstance(a, permissions.Permissions) and isinstance(b, permissions.Permissions)
    assert a is not b and a.settings.default == "deny" and b.settings.default == "allow"


# --- rules on declared effects ------------------------------------------------------------


def effects_runtime(config: dict[str, Any]) -> ToolRuntime:
    runtime = make_runtime(
        json_tool("drop_table", effects=ToolEffects(destructive=True, open_world=True)),
        json_tool("rm", effects=ToolEffects(destructive=True)),
        json_tool("cat", effects=ToolEffects(read_only=True)),
        json_tool("mystery"),
    )
    permissions.dsh_setup(runtime, config)
    return runtime


async def test_a_rule_on_effects_matches_tools_declaring_all_of_them() -> None:
    runtime = effects_runtime(
        {
            "rules": [
                {"tool": "*", "effects": ["destructive", "open_world"], "action": "deny", "reason": "remote drop"},
                {"tool": "*", "effects": ["destructive"], "action": "deny"},
            ]
        }
    )
    assert denial(await runtime.execute(make_input("drop_table"))) == "remote drop"
    assert denial(await runtime.execute(make_input("rm"))) == 'denied by permissions rule #2 (tool "*")'
    assert not (await runtime.execute(make_input("cat"))).is_error
    # A tool that declares nothing matches no effects rule: pair such rules with a default.
    assert not (await runtime.execute(make_input("mystery"))).is_error


def test_an_unknown_effect_name_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"rules\[0\]\.effects"):
        permissions.dsh_setup(make_runtime(), {"rules": [{"tool": "*", "effects": ["scary"], "action": "deny"}]})


def test_effects_rules_need_the_runtime() -> None:
    settings = permissions.PermissionsSettings(
        rules=(permissions.Rule(tool="*", action="deny", effects=("destructive",)),)
    )
    with pytest.raises(ValueError, match="need the runtime"):
        permissions.Permissions(settings)


async def test_undeclared_matches_exactly_the_tools_that_declare_nothing() -> None:
    runtime = effects_runtime(
        {
            "rules": [
                {"tool": "*", "effects": ["undeclared"], "action": "deny", "reason": "declare your effects"},
                {"tool": "*", "effects": ["destructive"], "action": "deny"},
            ]
        }
    )
    assert denial(await runtime.execute(make_input("mystery"))) == "declare your effects"
    assert denial(await runtime.execute(make_input("rm"))) == 'denied by permissions rule #2 (tool "*")'
    assert not (await runtime.execute(make_input("cat"))).is_error


def test_undeclared_cannot_be_combined_with_an_effect() -> None:
    with pytest.raises(ConfigError, match="cannot be combined"):
        permissions.dsh_setup(
            make_runtime(), {"rules": [{"tool": "*", "effects": ["undeclared", "destructive"], "action": "deny"}]}
        )


def test_diagnostics_name_the_tools_an_effects_rule_cannot_see() -> None:
    runtime = effects_runtime({"rules": [{"tool": "*", "effects": ["destructive"], "action": "ask"}]})
    policy = runtime.plugins.get_plugin("permissions-policy")
    [warning] = policy.diagnostics()
    assert warning.startswith('permissions rule #1 (tool "*") matches on declared effects, but mystery declare none')
    covered = effects_runtime(
        {
            "rules": [
                {"tool": "*", "effects": ["undeclared"], "action": "ask"},
                {"tool": "*", "effects": ["destructive"], "action": "ask"},
            ]
        }
    )
    assert covered.plugins.get_plugin("permissions-policy").diagnostics() == []
    plain = effects_runtime({"rules": [{"tool": "rm", "action": "deny"}]})
    assert plain.plugins.get_plugin("permissions-policy").diagnostics() == []


def test_diagnostics_name_a_rule_on_several_effects_that_no_tool_declares_together() -> None:
    # effects = [a, b] needs both (AND): a rule written to mean "either" misses the tools declaring one.
    runtime = make_runtime(
        json_tool("rm", effects=ToolEffects(destructive=True)),
        json_tool("fetch", effects=ToolEffects(read_only=True, open_world=True)),
    )
    permissions.dsh_setup(
        runtime,
        {
            "rules": [
                {"tool": "*", "effects": ["destructive", "open_world"], "action": "ask"},
                {"tool": "*", "effects": ["read_only", "open_world"], "action": "allow"},
            ]
        },
    )
    assert runtime.plugins.get_plugin("permissions-policy").diagnostics() == [
        'permissions rule #1 (tool "*") matches only tools that declare all of destructive, open_world, and no '
        "registered tool it names does; to match a tool that declares any one of them, write one rule per effect"
    ]
    # A tool declaring both makes the rule live: nothing to say.
    assert effects_runtime(
        {"rules": [{"tool": "*", "effects": ["destructive", "open_world"], "action": "ask"}, *UNDECLARED_RULE]}
    ).plugins.get_plugin("permissions-policy").diagnostics() == []


UNDECLARED_RULE = [{"tool": "*", "effects": ["undeclared"], "action": "ask"}]
