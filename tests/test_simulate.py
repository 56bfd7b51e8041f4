"""Policy dry-runs: a recorded session replayed through a new policy stack, running no tool."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from dsh_core import (
    Agent,
    Ask,
    Block,
    Deny,
    Rewrite,
    SessionLog,
    SessionLogError,
    SessionRecorder,
    TextBlock,
    ToolExecution,
    ToolRestriction,
    ToolRuntime,
    UserMessage,
    hookimpl,
    read_session_log,
)
from dsh_core._cli import cli
from dsh_core._runtime import agent_scope
from dsh_core._simulate import SimulationRuntime, Verdict, recorded_verdict, simulate
from dsh_core.testing import StaticApproval, json_tool, make_input, make_runtime

# Tools whose bodies leave a mark: a simulation must never run them.
TOOLS_PLUGIN = """
import pathlib
from dsh_core import define_tool, hookimpl

async def _run(args):
    with pathlib.Path("bodies-ran").open("a") as marks:
        marks.write("x")
    return "done"

@hookimpl
def dsh_setup(runtime, config):
    params = {"path": {"type": "string"}, "cmd": {"type": "string"}}
    for name in ("read_file", "write_file", "shell"):
        runtime.register(define_tool(name=name, description=name, parameters=params, output={"type": "string"}, execute=_run))
"""

RECORDED_POLICY = """
[plugins.permissions]
default = "allow"

[[plugins.permissions.rules]]
tool = "write_file"
args = { path = "/etc/*" }
action = "deny"
reason = "never write under /etc"
"""

# Two calls flip: writes under /tmp are now denied, and shell asks.
NEW_POLICY = (
    RECORDED_POLICY
    + """
[[plugins.permissions.rules]]
tool = "write_file"
args = { path = "/tmp/*" }
action = "deny"
reason = "no more scratch writes"

[[plugins.permissions.rules]]
tool = "shell"
action = "ask"
reason = "shell needs a human"
"""
)

CALLS = [
    {"id": "c1", "name": "read_file", "arguments": {"path": "a.txt"}},
    {"id": "c2", "name": "write_file", "arguments": {"path": "/etc/passwd"}},
    {"id": "c3", "name": "write_file", "arguments": {"path": "/tmp/scratch"}},
    {"id": "c4", "name": "shell", "arguments": {"cmd": "ls"}},
]


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    (tmp_path / "dsh_sim_tools.py").write_text(TOOLS_PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "250")
    yield tmp_path
    sys.modules.pop("dsh_sim_tools", None)


PLUGINS = ["--no-plugins", "--plugin", "tools=dsh_sim_tools", "--plugin", "permissions=dsh_plugins.permissions"]


def invoke(args: list[str]) -> Result:
    return CliRunner().invoke(cli, args, catch_exceptions=False)


def record(workdir: Path, policy: str = RECORDED_POLICY) -> Path:
    """Run CALLS under ``policy`` with the real tools, recording a session."""
    (workdir / "recorded.toml").write_text(policy)
    batch = workdir / "calls.jsonl"
    batch.write_text("".join(json.dumps(call) + "\n" for call in CALLS))
    log = workdir / "session.jsonl"
    result = invoke(["--config", "recorded.toml", *PLUGINS, "run", str(batch), "--session", str(log)])
    assert result.exit_code == 0, result.output
    (workdir / "bodies-ran").unlink()  # the recording ran the allowed calls for real
    return log


def test_a_permissions_change_that_flips_two_calls_exits_1(workdir: Path) -> None:
    log = record(workdir)
    (workdir / "new.toml").write_text(NEW_POLICY)
    result = invoke([*PLUGINS, "simulate", str(log), "--config", "new.toml"])
    assert result.exit_code == 1, result.output
    out = result.stdout
    assert "2 of 4 call(s) would be decided differently" in out
    assert "would now deny: no more scratch writes" in out
    assert "would now ask: shell needs a human" in out
    assert "4 call(s) compared, 2 would change" in out
    assert not (workdir / "bodies-ran").exists()


def test_simulate_json_reports_each_call(workdir: Path) -> None:
    log = record(workdir)
    (workdir / "new.toml").write_text(NEW_POLICY)
    result = invoke([*PLUGINS, "simulate", str(log), "--config", "new.toml", "--json"])
    assert result.exit_code == 1
    data = json.loads(result.stdout)
    assert data["changed"] is True
    assert [(c["callId"], c["changed"], c["summary"]) for c in data["calls"]] == [
        ("c1", False, "unchanged"),
        ("c2", False, "unchanged"),
        ("c3", True, "would now deny: no more scratch writes"),
        ("c4", True, "would now ask: shell needs a human"),
    ]
    assert data["calls"][2]["simulated"] == {
        "decision": "deny",
        "reason": "no more scratch writes",
        "actor": "permissions-policy",
    }


def test_the_recorded_policy_changes_nothing_and_exits_0(workdir: Path) -> None:
    log = record(workdir)
    result = invoke([*PLUGINS, "simulate", str(log), "--config", "recorded.toml"])
    assert result.exit_code == 0, result.output
    assert "4 call(s) compared, 0 would change" in result.stdout
    assert not (workdir / "bodies-ran").exists()


def test_lifting_a_rule_reports_would_now_allow(workdir: Path) -> None:
    log = record(workdir)
    (workdir / "open.toml").write_text('[plugins.permissions]\ndefault = "allow"\n')
    result = invoke([*PLUGINS, "simulate", str(log), "--config", "open.toml", "--json"])
    assert result.exit_code == 1
    changed = [c for c in json.loads(result.stdout)["calls"] if c["changed"]]
    assert [(c["callId"], c["summary"]) for c in changed] == [
        ("c2", "would now allow (was deny: never write under /etc)")
    ]


# -- the library function ----------------------------------------------------------------------


class Policy:
    def __init__(self, decide: Callable[[ToolExecution], Any]) -> None:
        self.decide = decide

    @hookimpl
    async def dsh_pre_execute(self, execution: ToolExecution, next: Any) -> Any:
        decision = self.decide(execution)
        return decision if decision is not None else await next()


async def write_session(path: Path, runtime: ToolRuntime, calls: list[Any]) -> Path:
    with SessionLog(path) as log:
        recorder = SessionRecorder(log)
        runtime.plugins.register(recorder)
        for request in calls:
            recorder.record_call(request)
            await runtime.execute(request)
        runtime.plugins.unregister(recorder)
    return path


def never(args: Any) -> Any:
    raise AssertionError("the body ran")


async def test_calls_the_policy_never_decided_are_not_compared(tmp_path: Path) -> None:
    runtime = make_runtime(json_tool("t", parameters={"n": {"type": "integer"}}))
    log = await write_session(
        tmp_path / "s.jsonl",
        runtime,
        [make_input("t", {"n": "x"}, call_id="bad-args"), make_input("gone", call_id="unknown")],
    )
    report = await simulate(read_session_log(log), SimulationRuntime())
    assert [(c.call_id, c.recorded, c.simulated, c.changed) for c in report.calls] == [
        ("bad-args", None, None, False),
        ("unknown", None, None, False),
    ]
    assert "INVALID_ARGS" in (report.calls[0].note or "")
    assert not report.changed


@pytest.mark.parametrize("runtime_class", [ToolRuntime, SimulationRuntime])
async def test_a_runtime_in_code_mode_leaves_direct_calls_not_compared(tmp_path: Path, runtime_class: Any) -> None:
    """Every recorded direct call read "would now deny" (UNKNOWN_TOOL) with no policy at all."""
    from dsh_core.testing import FakeCodeRuntime

    log = await write_session(tmp_path / "s.jsonl", make_runtime(json_tool("t")), [make_input("t", call_id="c1")])
    runtime = runtime_class(mode="code", code_runtime=FakeCodeRuntime())
    if runtime_class is ToolRuntime:
        runtime.register(json_tool("t"))
    report = await simulate(read_session_log(log), runtime)
    (call,) = report.calls
    assert (call.recorded is not None, call.simulated, call.changed) == (True, None, False)
    assert "presents Code Mode" in (call.note or "") and not report.changed


async def test_simulate_leaves_the_runtime_as_it_was(tmp_path: Path) -> None:
    recorded = make_runtime(json_tool("t"))
    with SessionLog(tmp_path / "s.jsonl") as log:
        recorder = SessionRecorder(log)
        recorded.plugins.register(recorder)
        request = make_input("t", call_id="c1")
        recorder.record_call(request)
        await recorded.execute(request)
    approval = StaticApproval()
    runtime = make_runtime(approval=approval, plugins=[Policy(lambda e: Deny("nope"))])
    report = await simulate(read_session_log(tmp_path / "s.jsonl"), runtime)
    assert [c.summary for c in report.calls] == ["would now deny: nope"]
    assert runtime.names() == [] and runtime.approval is approval and runtime.trace_decisions is False
    assert not any(runtime.plugins.get_name(p) == "dsh-simulate-replayer" for p in runtime.plugins.get_plugins())


async def test_an_existing_tool_of_the_name_is_used_but_its_body_never_runs(tmp_path: Path) -> None:
    calls: list[str] = []

    async def body(args: Any) -> Any:
        calls.append("ran")
        return "x"

    log = tmp_path / "s.jsonl"
    with SessionLog(log) as session:
        session.append_call("c1", "t", {})
        session.append_result("c1", content=[TextBlock("x")], is_error=False)
    runtime = make_runtime(json_tool("t", body))
    report = await simulate(read_session_log(log), runtime)
    assert [c.summary for c in report.calls] == ["unchanged"]
    assert calls == []


async def test_a_call_the_current_tool_refuses_says_whether_its_contract_changed(tmp_path: Path) -> None:
    old = make_runtime(json_tool("t", parameters={"n": {"type": "integer"}}), json_tool("u"))
    log = tmp_path / "s.jsonl"
    with SessionLog(log) as session:
        recorder = SessionRecorder(session, old)
        old.plugins.register(recorder)
        for request in (make_input("t", {"n": 1}, call_id="changed"), make_input("u", {"n": 1}, call_id="kept")):
            recorder.record_call(request)
            await old.execute(request)
        session.append_call("unfingerprinted", "t", {"n": 1})
        session.append_result("unfingerprinted", content=[TextBlock("1")], is_error=False)

    new = make_runtime(json_tool("t", parameters={"n": {"type": "string"}}), json_tool("u"))  # t now takes a string
    report = await simulate(read_session_log(log), new)
    assert [(call.call_id, call.summary) for call in report.calls] == [
        (
            "changed",
            "not compared: the simulated call never reached policy (INVALID_ARGS); "
            "the tool's contract changed since the call was recorded",
        ),
        ("kept", "unchanged"),
        ("unfingerprinted", "not compared: the simulated call never reached policy (INVALID_ARGS)"),
    ]
    assert not report.changed

    # Stand-ins (a SimulationRuntime) take any object, and their open contract is never compared.
    stand_ins = await simulate(read_session_log(log), SimulationRuntime())
    assert [call.summary for call in stand_ins.calls] == ["unchanged"] * 3
    hand_edited = tmp_path / "edited.jsonl"
    with SessionLog(hand_edited) as session:
        session.append_call("list-args", "t", [1], contract="sha256:" + "0" * 64)
        session.append_result("list-args", content=[TextBlock("1")], is_error=False)
    (refused,) = (await simulate(read_session_log(hand_edited), SimulationRuntime())).calls
    assert refused.summary == "not compared: the simulated call never reached policy (INVALID_ARGS)"

    # A plugin's tool in a SimulationRuntime (what `dsh-tools simulate` loads) keeps its parameters.
    loaded = SimulationRuntime()
    loaded.register(json_tool("t", parameters={"n": {"type": "string"}}))
    loaded.register(json_tool("u"))
    from_plugins = await simulate(read_session_log(log), loaded)
    assert [(call.call_id, call.summary) for call in from_plugins.calls] == [
        (
            "changed",
            "not compared: the simulated call never reached policy (INVALID_ARGS); "
            "the tool's contract changed since the call was recorded",
        ),
        ("kept", "unchanged"),
        ("unfingerprinted", "not compared: the simulated call never reached policy (INVALID_ARGS)"),
    ]


async def test_a_restriction_in_the_new_stack_is_a_denial(tmp_path: Path) -> None:
    log = tmp_path / "s.jsonl"
    with SessionLog(log) as session:
        session.append_call("c1", "t", {}, agent="worker")
        session.append_result("c1", content=[TextBlock("x")], is_error=False)
    runtime = SimulationRuntime()
    worker = Agent(id="worker")
    runtime.register(json_tool("t"))  # set aside: a stand-in takes its name
    runtime.restrict(ToolRestriction(deny=["t"]), worker)
    runtime.register(json_tool("other"), worker)  # makes "worker" a known scope
    report = await simulate(read_session_log(log), runtime)
    assert report.calls[0].simulated is not None and report.calls[0].simulated.decision == "deny"
    assert report.calls[0].summary.startswith('would now deny: unknown tool "t"')


async def test_post_execute_policies_see_the_recorded_content(tmp_path: Path) -> None:
    class NoSecrets:
        @hookimpl
        async def dsh_post_execute(self, execution: Any, result: Any, next: Any) -> Any:
            if any("secret" in getattr(block, "text", "") for block in result.content):
                return Block(feedback=[TextBlock("redacted")])
            return await next()

    log = tmp_path / "s.jsonl"
    with SessionLog(log) as session:
        for call_id, text in (("c1", "the secret is 42"), ("c2", "nothing here")):
            session.append_call(call_id, "read", {})
            session.append_result(call_id, content=[TextBlock(text)], is_error=False)
    runtime = SimulationRuntime()
    runtime.plugins.register(NoSecrets())
    report = await simulate(read_session_log(log), runtime)
    assert [c.summary for c in report.calls] == ["would now deny: redacted", "unchanged"]


async def test_a_recorded_trace_tells_an_approved_ask_from_a_plain_allow(tmp_path: Path) -> None:
    recorded = make_runtime(
        json_tool("shell"),
        plugins=[Policy(lambda e: Ask("confirm"))],
        approval=StaticApproval("allowed-once"),
        trace_decisions=True,
    )
    log = await write_session(tmp_path / "s.jsonl", recorded, [make_input("shell", call_id="c1", agent=Agent(id="a"))])
    result = read_session_log(log).events[1].data
    verdict = recorded_verdict(result)
    assert verdict is not None and (verdict.decision, verdict.reason) == ("ask", "confirm")
    same = await simulate(read_session_log(log), make_runtime(plugins=[Policy(lambda e: Ask("confirm"))]))
    assert [c.summary for c in same.calls] == ["unchanged"]
    relaxed = await simulate(read_session_log(log), make_runtime())
    assert [c.summary for c in relaxed.calls] == ["would now allow (was ask: confirm)"]


@pytest.mark.parametrize(
    ("result", "decision"),
    [
        ({"isError": False, "content": []}, "allow"),
        ({"isError": True, "error": {"code": "DENIED", "message": "no", "name": "PolicyDenial"}}, "deny"),
        ({"isError": True, "error": {"code": "POLICY_ERROR", "message": "bad", "name": "PolicyError"}}, "deny"),
        ({"isError": True, "error": {"code": "TOOL_ERROR", "message": "boom", "name": "RuntimeError"}}, "allow"),
        ({"isError": True, "error": {"code": "TOOL_TIMEOUT", "message": "slow", "name": "T"}}, "allow"),
        ({"isError": True, "error": {"code": "INVALID_ARGS", "message": "x", "name": "ToolArgsError"}}, None),
        ({"isError": True, "error": {"code": "UNKNOWN_TOOL", "message": "x", "name": "ToolNotFoundError"}}, None),
        ({"isError": True, "error": {"code": "ABORTED_BEFORE_DISPATCH", "message": "x", "name": "AbortError"}}, None),
        (None, None),
    ],
)
def test_recorded_verdicts(result: Any, decision: str | None) -> None:
    verdict = recorded_verdict(result)
    assert (verdict.decision if verdict is not None else None) == decision


async def test_a_new_rewriting_policy_is_reported_as_a_rewrite(tmp_path: Path) -> None:
    log = tmp_path / "s.jsonl"
    with SessionLog(log) as session:
        session.append_call("c1", "t", {"path": "./a"})
        session.append_result("c1", content=[TextBlock("x")], is_error=False)
        session.append_call("c2", "t", {"path": "b"})
        session.append_result("c2", content=[TextBlock("y")], is_error=False)

    def normalise(execution: ToolExecution) -> Any:
        path = execution.arguments["path"]
        return Rewrite({"path": path.removeprefix("./")}, "dropped ./") if path.startswith("./") else None

    runtime = SimulationRuntime()
    runtime.register(json_tool("t", parameters={"path": {"type": "string", "required": True}}))
    runtime.plugins.register(Policy(normalise), name="normaliser")
    report = await simulate(read_session_log(log), runtime)
    first, second = report.calls
    assert first.simulated is not None
    assert (first.simulated.decision, first.simulated.reason, first.simulated.actor) == (
        "rewrite",
        "dropped ./",
        "normaliser",
    )
    assert first.changed and first.summary == "would now rewrite: dropped ./"
    assert not second.changed


async def test_a_dry_run_calls_no_observer_and_opens_no_ledger(tmp_path: Path) -> None:
    """Nothing happens in a simulation: nothing for an audit trail or an effect ledger to record."""
    from dsh_plugins import ledger

    runtime = make_runtime(json_tool("t"))
    log = await write_session(tmp_path / "s.jsonl", runtime, [make_input("t", call_id="c1")])
    observed: list[str] = []

    class Observer:
        @hookimpl
        def dsh_result(self, execution: Any, result: Any) -> None:
            observed.append(execution.call_id)

    dry = SimulationRuntime()
    assert dry.dry_run is True and make_runtime().dry_run is False
    dry.plugins.register(Observer())
    ledger.dsh_setup(dry, {"path": str(tmp_path / "effects.jsonl")})
    report = await simulate(read_session_log(log), dry)
    assert [call.call_id for call in report.calls] == ["c1"]
    assert observed == []
    assert not (tmp_path / "effects.jsonl").exists() and not (tmp_path / "effects.jsonl.lock").exists()


async def test_simulating_a_path_says_to_read_the_log_first() -> None:
    with pytest.raises(TypeError) as raised:
        await simulate("session.jsonl", make_runtime())  # type: ignore[arg-type]
    assert str(raised.value) == (
        "simulate() reads the events of a session log: pass read_session_log(path), got str"
    )


# -- scopes: a recorded agent id finds every scope the new stack knows ------------------------


class DenyShell:
    """A plugin scoped to one agent (``dsh_scope``) that denies its shell calls."""

    def __init__(self, scope: Any) -> None:
        self.dsh_scope = scope

    @hookimpl
    async def dsh_pre_execute(self, execution: ToolExecution, next: Any) -> Any:
        return Deny("no shell in this scope") if execution.name == "shell" else await next()


def guard_only(runtime: ToolRuntime, scope: Any) -> None:
    runtime.guard(lambda execution: "no shell in this scope", scope=scope)


def restriction_only(runtime: ToolRuntime, scope: Any) -> None:
    runtime.restrict(ToolRestriction(deny=["shell"]), scope)


def scoped_plugin(runtime: ToolRuntime, scope: Any) -> None:
    runtime.plugins.register(DenyShell(scope))


def worker_under_guarded_root(runtime: ToolRuntime, root: Any) -> None:
    """The recorded "worker" holds nothing: it is known as the parent of a scope that does, and inherits a guard."""
    guard_only(runtime, root)
    worker = Agent(id="worker", parent=root)
    runtime.register(json_tool("other"), Agent(id="helper", parent=worker))


SCOPED_POLICIES = [
    pytest.param(Agent(id="worker"), guard_only, "no shell in this scope", id="agent-guard"),
    pytest.param(Agent(id="worker"), restriction_only, 'unknown tool "shell"', id="agent-restriction"),
    pytest.param(Agent(id="worker"), scoped_plugin, "no shell in this scope", id="agent-plugin"),
    pytest.param("worker", guard_only, "no shell in this scope", id="str-guard"),
    pytest.param("worker", scoped_plugin, "no shell in this scope", id="str-plugin"),
    pytest.param(Agent(id="root"), worker_under_guarded_root, "no shell in this scope", id="known-as-a-parent"),
]


@pytest.mark.parametrize("runtime_class", [ToolRuntime, SimulationRuntime])
@pytest.mark.parametrize(("scope", "setup", "reason"), SCOPED_POLICIES)
async def test_a_scoped_policy_applies_to_its_agents_recorded_calls(
    tmp_path: Path, runtime_class: type[ToolRuntime], scope: Any, setup: Any, reason: str
) -> None:
    log = tmp_path / "s.jsonl"
    with SessionLog(log) as session:
        session.append_call("c1", "shell", {"cmd": "ls"}, agent="worker")
        session.append_result("c1", content=[TextBlock("ok")], is_error=False)
        session.append_call("c2", "shell", {"cmd": "ls"}, agent="lead")
        session.append_result("c2", content=[TextBlock("ok")], is_error=False)
    runtime = runtime_class()
    runtime.register(json_tool("shell"))
    setup(runtime, scope)
    report = await simulate(read_session_log(log), runtime)
    worker, lead = report.calls
    assert worker.simulated is not None and worker.simulated.decision == "deny"
    assert worker.summary.startswith(f"would now deny: {reason}")
    assert lead.summary == "unchanged"
    assert report.changed


@pytest.mark.parametrize(("scope", "setup", "reason"), SCOPED_POLICIES)
def test_agent_scope_finds_a_scope_that_holds_no_tool(scope: Any, setup: Any, reason: str) -> None:
    """What ``--agent worker`` and replay resolve: the scope the policy was set up for, not a fresh Agent."""
    runtime = ToolRuntime()
    runtime.register(json_tool("shell"))
    setup(runtime, scope)
    found = agent_scope(runtime, "worker")
    if scope == "worker" or (isinstance(scope, Agent) and scope.id == "worker"):
        assert found is scope
    else:
        assert isinstance(found, Agent) and found.id == "worker" and found.parent is scope
    lead = agent_scope(runtime, "lead")
    assert isinstance(lead, Agent) and lead.id == "lead" and lead.parent is None
    assert agent_scope(runtime, None) is None


# -- a host runtime: its own tools and observers stay out of the simulation -------------------


class BlockSecrets:
    @hookimpl
    async def dsh_post_execute(self, execution: Any, result: Any, next: Any) -> Any:
        if any("secret" in getattr(block, "text", "") for block in result.content):
            return Block(feedback=[TextBlock("no secrets")])
        return await next()


async def secret_session(path: Path) -> Path:
    with SessionLog(path) as session:
        session.append_call("c1", "read", {"path": "a"})
        session.append_result("c1", content=[TextBlock("secret: 42")], is_error=False)
        session.append_call("c2", "read", {"path": "b"}, agent="worker")
        session.append_result("c2", content=[TextBlock("secret: 43")], is_error=False)
        session.append_call("c3", "read", {"path": "c"})
        session.append_result("c3", content=[TextBlock("nothing here")], is_error=False)
    return path


async def test_post_execute_sees_the_recorded_content_through_a_registered_tool(tmp_path: Path) -> None:
    """A tool of the host's own is stood in for: its output contract and finaliser never see the replay."""
    touched: list[str] = []

    async def body(args: Any) -> Any:
        touched.append("body")
        return "secret"

    def finalize(execution: Any, result: Any) -> None:
        touched.append("finalize")

    def read_tool() -> Any:
        parameters = {"path": {"type": "string", "required": True}}
        return json_tool("read", body, parameters=parameters, output={"type": "string"}, finalize_content=finalize)

    host = make_runtime(read_tool(), plugins=[BlockSecrets()])
    worker = Agent(id="worker")
    host.register(read_tool(), worker)  # the worker's own variant
    global_read, worker_read = host.get("read"), host.get("read", worker)
    report = await simulate(read_session_log(await secret_session(tmp_path / "s.jsonl")), host)
    assert [(c.call_id, c.summary) for c in report.calls] == [
        ("c1", "would now deny: no secrets"),
        ("c2", "would now deny: no secrets"),
        ("c3", "unchanged"),
    ]
    assert touched == []
    assert host.get("read") is global_read and host.get("read", worker) is worker_read
    live = await host.execute(make_input("read", {"path": "a"}))
    assert live.is_error and live.error.info is not None and live.error.info.code == "DENIED"
    assert touched == ["body", "finalize"]


async def test_simulating_in_a_host_runtime_calls_none_of_its_observers(tmp_path: Path) -> None:
    """A session recorder or audit trail of the host must not log simulated results under real call ids."""
    observed: list[str] = []

    class Observer:
        @hookimpl
        def dsh_result(self, execution: Any, result: Any) -> None:
            observed.append(execution.call_id)

    host = make_runtime(json_tool("read"), plugins=[Observer(), BlockSecrets()])
    report = await simulate(read_session_log(await secret_session(tmp_path / "s.jsonl")), host)
    assert [c.call_id for c in report.calls] == ["c1", "c2", "c3"]
    assert observed == []
    await host.execute(make_input("read", call_id="live"))
    assert observed == ["live"]


async def test_a_simulation_that_fails_puts_the_hosts_tools_and_observers_back(tmp_path: Path) -> None:
    observed: list[str] = []

    class Observer:
        @hookimpl
        def dsh_result(self, execution: Any, result: Any) -> None:
            observed.append(execution.call_id)

    log = tmp_path / "s.jsonl"
    with SessionLog(log) as session:
        session.append_call("c1", "read", {})
        session.append_result("c1", content=[TextBlock("x")], is_error=False, trace=[{"stage": "nonsense"}])
    real = json_tool("read")
    host = make_runtime(real, plugins=[Observer()])
    with pytest.raises(SessionLogError, match="call c1"):
        await simulate(read_session_log(log), host)
    assert host.get("read") is real
    assert not any(host.plugins.get_name(p) == "dsh-simulate-replayer" for p in host.plugins.get_plugins())
    await host.execute(make_input("read", call_id="live"))
    assert observed == ["live"]


class ForceDryRun:
    @hookimpl
    async def dsh_pre_execute(self, execution: Any, next: Any) -> Any:
        if execution.name == "shell" and execution.arguments.get("dry") is not True:
            return Rewrite({**execution.arguments, "dry": True}, reason="always dry-run")
        return await next()


async def untraced_rewrite_session(path: Path) -> Path:
    """A session recorded with ``trace_decisions`` off: only the rewrite note says the arguments changed."""
    recorded = make_runtime(json_tool("shell"))
    recorded.plugins.register(ForceDryRun(), name="force-dry")
    with SessionLog(path) as log:
        recorder = SessionRecorder(log)
        recorded.plugins.register(recorder)
        for call_id, cmd in (("c1", "ls"), ("c2", "make")):
            request = make_input("shell", {"cmd": cmd, "dry": cmd == "make"}, call_id=call_id)
            recorder.record_call(request)
            await recorded.execute(request)
    return path


async def test_a_rewrite_recorded_without_a_trace_is_read_from_its_note(tmp_path: Path) -> None:
    log = read_session_log(await untraced_rewrite_session(tmp_path / "s.jsonl"))
    assert all("trace" not in e.data for e in log.events if e.type == "tool/result")
    rewritten, untouched = (e.data for e in log.events if e.type == "tool/result")
    assert recorded_verdict(rewritten) == Verdict(decision="rewrite", reason="always dry-run", actor="force-dry")
    assert recorded_verdict(untouched) == Verdict(decision="allow")
    same = await simulate(log, make_runtime(plugins=[ForceDryRun()]))
    assert [(c.call_id, c.recorded and c.recorded.decision, c.summary) for c in same.calls] == [
        ("c1", "rewrite", "unchanged"),
        ("c2", "allow", "unchanged"),
    ]
    assert not same.changed
    removed = await simulate(log, make_runtime())
    assert [(c.call_id, c.summary) for c in removed.calls] == [
        ("c1", "would now allow (was rewrite: always dry-run)"),
        ("c2", "unchanged"),
    ]
    assert removed.changed


async def test_an_untraced_result_whose_rewrite_note_is_unreadable_is_not_compared(tmp_path: Path) -> None:
    """Such a result says it was rewritten without saying how: calling it allowed would hide a change."""
    path = tmp_path / "s.jsonl"
    note = UserMessage([TextBlock("changed")], source="policy", meta={"rewrite": "yes"})
    with SessionLog(path) as log:
        log.append_call("c1", "shell", {"cmd": "ls"})
        log.append_result("c1", content=[TextBlock("ok")], is_error=False, contexts=[note])
    (call,) = (await simulate(read_session_log(path), make_runtime())).calls
    assert call.recorded is None and call.simulated is None
    assert call.summary == "not compared: the recorded result does not show what the policy decided"
