"""Decision traces: what each layer did to a call, recorded only when asked for, and kept in session logs."""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from click.testing import CliRunner, Result

from dsh_core import (
    Accept,
    Allow,
    Ask,
    Block,
    CancelSignal,
    Deny,
    SessionLog,
    SessionRecorder,
    TextBlock,
    ToolErrorInfo,
    ToolExecution,
    ToolExecutionFailure,
    ToolExecutionSuccess,
    ToolFailure,
    _pipeline,
    hookimpl,
    read_session_log,
    run_tool_calls,
    thaw,
)
from dsh_core._cli import cli
from dsh_core._trace import DecisionTrace, TraceStep, trace_of
from dsh_core.testing import StaticApproval, json_tool, make_input, make_runtime

Next = Callable[[], Awaitable[Any]]


def steps(result: Any) -> list[tuple[str, str, str]]:
    trace = trace_of(result)
    assert trace is not None
    return [(step.stage, step.actor, step.outcome) for step in trace]


class Pre:
    def __init__(self, decide: Callable[[ToolExecution], Any] | None = None) -> None:
        self.decide = decide

    @hookimpl
    async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
        decision = self.decide(execution) if self.decide else None
        return decision if decision is not None else await next()


class Post:
    def __init__(self, decide: Callable[[Any], Any]) -> None:
        self.decide = decide

    @hookimpl
    async def dsh_post_execute(self, execution: ToolExecution, result: Any, next: Next) -> Any:
        return self.decide(await next())


class Wrapper:
    def __init__(self, replace: Callable[[Any], Any] | None = None) -> None:
        self.replace = replace

    @hookimpl
    async def dsh_execute(self, execution: Any, next: Next) -> Any:
        result = await next()
        return self.replace(result) if self.replace else result


def traced(*tools: Any, plugins: tuple[tuple[str, object], ...] | list[tuple[str, object]] = (), **options: Any) -> Any:
    runtime = make_runtime(*tools, trace_decisions=True, **options)
    for name, plugin in plugins:
        runtime.plugins.register(plugin, name=name)
    return runtime


async def test_nothing_is_recorded_when_tracing_is_off(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse() -> None:
        raise AssertionError("a trace was recorded with trace_decisions off")

    monkeypatch.setattr(_pipeline, "TraceRecorder", refuse)
    runtime = make_runtime(json_tool("t"), plugins=[Pre(), Wrapper(), Post(lambda r: r)])
    runtime.guard(lambda execution: None)
    result = await runtime.execute(make_input("t"))
    assert not result.is_error
    assert result.trace is None


async def test_a_plain_call_records_the_body() -> None:
    result = await traced(json_tool("t")).execute(make_input("t"))
    assert steps(result) == [("execute", "t (body)", "ok")]


async def test_a_pre_execute_deny_is_attributed_to_its_plugin() -> None:
    runtime = traced(json_tool("rm"), plugins=[("policy", Pre(lambda e: Deny("no rm")))])
    result = await runtime.execute(make_input("rm"))
    assert result.is_error and result.code == "DENIED"
    assert steps(result) == [("pre", "policy", "deny: no rm")]


async def test_waterfall_steps_run_outermost_first_and_pass_through_is_pass() -> None:
    runtime = traced(
        json_tool("t"),
        plugins=[("inner", Pre(lambda e: Allow())), ("middle", Pre()), ("outer", Pre())],
    )
    result = await runtime.execute(make_input("t"))
    assert steps(result) == [
        ("pre", "outer", "pass"),
        ("pre", "middle", "pass"),
        ("pre", "inner", "allow"),
        ("execute", "t (body)", "ok"),
    ]


async def test_a_listener_that_only_delegates_to_the_default_passes() -> None:
    result = await traced(json_tool("t"), plugins=[("p", Pre())]).execute(make_input("t"))
    assert steps(result)[0] == ("pre", "p", "pass")


async def test_an_approved_ask_records_the_approval() -> None:
    runtime = traced(
        json_tool("t"), plugins=[("ask", Pre(lambda e: Ask("sure?")))], approval=StaticApproval("allowed-once")
    )
    result = await runtime.execute(make_input("t", agent="main"))
    assert steps(result) == [
        ("pre", "ask", "ask: sure?"),
        ("approval", "approval", "allow"),
        ("execute", "t (body)", "ok"),
    ]


async def test_a_denied_ask_records_the_approval_denial() -> None:
    runtime = traced(json_tool("t"), plugins=[("ask", Pre(lambda e: Ask()))], approval=StaticApproval("denied"))
    result = await runtime.execute(make_input("t", agent="main"))
    assert steps(result) == [("pre", "ask", "ask"), ("approval", "approval", 'deny: the user denied tool "t"')]


async def test_guards_are_recorded_by_label() -> None:
    def allow_all(execution: ToolExecution) -> None:
        return None

    def no_secrets(execution: ToolExecution) -> str | None:
        return "no secrets" if execution.arguments.get("secret") else None  # type: ignore[union-attr]

    runtime = traced(json_tool("t"))
    runtime.guard(allow_all)
    runtime.guard(no_secrets)
    result = await runtime.execute(make_input("t", {"secret": True}))
    assert result.is_error and result.code == "DENIED"
    assert steps(result) == [
        ("guard", allow_all.__qualname__, "pass"),
        ("guard", no_secrets.__qualname__, "deny: no secrets"),
    ]


async def test_wrappers_traversed_are_recorded_around_the_body() -> None:
    runtime = traced(json_tool("t"), plugins=[("inner-wrap", Wrapper()), ("outer-wrap", Wrapper())])
    result = await runtime.execute(make_input("t"))
    assert steps(result) == [
        ("execute", "outer-wrap", "pass"),
        ("execute", "inner-wrap", "pass"),
        ("execute", "t (body)", "ok"),
    ]


@pytest.mark.parametrize(
    ("replace", "outcome"),
    [
        (lambda r: ToolExecutionSuccess(value=1, content=()), "replace"),
        (
            lambda r: ToolExecutionFailure(
                error=ToolFailure(message="too slow", info=ToolErrorInfo(name="T", code="TOOL_TIMEOUT")),
                content=(TextBlock("Error: too slow"),),
            ),
            "fail: TOOL_TIMEOUT: too slow",
        ),
    ],
)
async def test_a_wrapper_that_replaces_the_result_is_recorded(replace: Any, outcome: str) -> None:
    runtime = traced(json_tool("t"), plugins=[("wrap", Wrapper(replace))])
    result = await runtime.execute(make_input("t"))
    assert steps(result)[:2] == [("execute", "wrap", outcome), ("execute", "t (body)", "ok")]


async def test_a_failing_body_is_recorded_with_its_code() -> None:
    async def boom(args: Any) -> Any:
        raise RuntimeError("it broke")

    result = await traced(json_tool("t", boom)).execute(make_input("t"))
    assert steps(result) == [("execute", "t (body)", "fail: TOOL_ERROR: it broke")]


@pytest.mark.parametrize(
    ("decide", "outcome"),
    [
        (lambda r: Accept(), "accept"),
        (lambda r: Accept(content=[TextBlock("redacted")]), "accept(content)"),
        (lambda r: Accept(value={"x": 1}), "accept(value)"),
        (lambda r: Block(feedback=[TextBlock("try again")]), "block: try again"),
        (lambda r: r, "pass"),
    ],
)
async def test_post_execute_decisions(decide: Any, outcome: str) -> None:
    runtime = traced(json_tool("t"), plugins=[("post", Post(decide))])
    result = await runtime.execute(make_input("t"))
    assert steps(result)[-1] == ("post", "post", outcome)


async def test_finalize_content_is_recorded() -> None:
    replacing = json_tool("r", finalize_content=lambda execution, result: [TextBlock("final")])
    keeping = json_tool("k", finalize_content=lambda execution, result: None)

    def broken(execution: Any, result: Any) -> None:
        raise ValueError("oops")

    failing = json_tool("f", finalize_content=broken)
    runtime = traced(replacing, keeping, failing)
    assert steps(await runtime.execute(make_input("r")))[-1] == ("finalize", "finalize_content", "replace(content)")
    assert steps(await runtime.execute(make_input("k")))[-1] == ("finalize", "finalize_content", "pass")
    last = steps(await runtime.execute(make_input("f")))[-1]
    assert last[:2] == ("finalize", "finalize_content") and last[2].startswith("error: TOOL_ERROR: finalize_content")


async def test_a_raising_listener_ends_the_trace_with_an_error_step() -> None:
    def explode(execution: ToolExecution) -> Any:
        raise RuntimeError("policy crashed")

    runtime = traced(json_tool("t"), plugins=[("broken", Pre(explode)), ("outer", Pre())])
    result = await runtime.execute(make_input("t"))
    assert result.is_error and result.code == "POLICY_ERROR"
    assert steps(result) == [("pre", "broken", "error: POLICY_ERROR: policy crashed")]


async def test_a_raising_guard_is_attributed_to_the_guard_stage() -> None:
    def crashing(execution: ToolExecution) -> None:
        raise RuntimeError("guard crashed")

    runtime = traced(json_tool("t"), plugins=[("p", Pre())])
    runtime.guard(crashing)
    result = await runtime.execute(make_input("t"))
    assert steps(result)[-1] == ("guard", crashing.__qualname__, "error: POLICY_ERROR: guard crashed")


async def test_the_trace_is_not_part_of_equality_or_content() -> None:
    plain = await make_runtime(json_tool("t")).execute(make_input("t", {"a": 1}))
    traced_result = await traced(json_tool("t")).execute(make_input("t", {"a": 1}))
    assert traced_result == plain
    assert traced_result.content == plain.content


def test_trace_json_round_trip() -> None:
    trace = DecisionTrace(
        [TraceStep(stage="pre", actor="p", outcome="deny: x"), TraceStep(stage="post", actor="q", outcome="pass")]
    )
    assert DecisionTrace.from_json(trace.to_json()) == trace
    assert trace.stage("post") == (TraceStep(stage="post", actor="q", outcome="pass"),)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([{"stage": "later", "actor": "p", "outcome": "pass"}], "$[0].stage"),
        ([{"stage": "pre", "actor": 3, "outcome": "pass"}], "$[0].actor"),
        ([{"stage": "pre", "actor": "p"}], "$[0].outcome"),
        ({"stage": "pre"}, "expected a list"),
    ],
)
def test_malformed_trace_json_is_rejected_with_its_path(data: object, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("$", r"\$").replace("[", r"\[")):
        DecisionTrace.from_json(data)


def test_a_step_rejects_an_unknown_stage() -> None:
    with pytest.raises(ValueError, match="stage"):
        TraceStep(stage="later", actor="p", outcome="pass")  # type: ignore[arg-type]


async def test_the_session_recorder_writes_the_trace_into_tool_result(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    with SessionLog(path) as log:
        recorder = SessionRecorder(log)
        runtime = traced(json_tool("rm"), plugins=[("policy", Pre(lambda e: Deny("no rm"))), ("session", recorder)])
        request = make_input("rm", call_id="c1")
        recorder.record_call(request)
        await runtime.execute(request)
    result = read_session_log(path).events[1]
    assert result.type == "tool/result"
    assert thaw(result.data["trace"]) == [{"stage": "pre", "actor": "policy", "outcome": "deny: no rm"}]
    assert "no rm" in result.data["content"][0]["text"] and "policy" not in result.data["content"][0]["text"]


async def test_an_untraced_result_has_no_trace_key(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    with SessionLog(path) as log:
        recorder = SessionRecorder(log)
        runtime = make_runtime(json_tool("t"), plugins=[recorder])
        await runtime.execute(make_input("t", call_id="c1"))
    assert "trace" not in read_session_log(path).events[0].data


# -- dsh-tools explain --------------------------------------------------------------------

EXPLAIN_PLUGIN = """
from dsh_core import Deny, define_tool, hookimpl

async def _echo(args):
    return args

class NoRm:
    @hookimpl
    async def dsh_pre_execute(self, execution, next):
        if execution.name == "rm":
            return Deny("rm is not allowed here")
        return await next()

@hookimpl
def dsh_setup(runtime, config):
    for name in ("rm", "ls"):
        runtime.register(define_tool(name=name, description=name, parameters={}, output={"type": "json"}, execute=_echo))
    runtime.plugins.register(NoRm(), name="no-rm-policy")
"""


@pytest.fixture
def explain_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    (tmp_path / "dsh_explain_plugin.py").write_text(EXPLAIN_PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "200")
    yield ["--no-plugins", "--plugin", "explain=dsh_explain_plugin"]
    sys.modules.pop("dsh_explain_plugin", None)


def invoke(args: list[str]) -> Result:
    return CliRunner().invoke(cli, args, catch_exceptions=False)


def call_id_of(log: Path, name: str) -> str:
    return next(
        str(e.data["callId"]) for e in read_session_log(log).events if e.type == "tool/call" and e.data["name"] == name
    )


def test_explain_shows_the_recorded_trace_of_a_cli_session(explain_tools: list[str], tmp_path: Path) -> None:
    log = tmp_path / "s.jsonl"
    assert invoke([*explain_tools, "call", "rm", "{}", "--session", str(log)]).exit_code == 1
    result = invoke(["explain", str(log), call_id_of(log, "rm")])
    assert result.exit_code == 0, result.output
    assert "DENIED" in result.stdout
    assert "no-rm-policy" in result.stdout and "deny: rm is not allowed here" in result.stdout
    assert "pre" in result.stdout


def test_explain_json(explain_tools: list[str], tmp_path: Path) -> None:
    log = tmp_path / "s.jsonl"
    invoke([*explain_tools, "call", "ls", "{}", "--session", str(log)])
    result = invoke(["explain", str(log), call_id_of(log, "ls"), "--json"])
    assert result.exit_code == 0
    data = json.loads(result.stdout)
    assert data["trace"] == [
        {"stage": "pre", "actor": "no-rm-policy", "outcome": "pass"},
        {"stage": "execute", "actor": "ls (body)", "outcome": "ok"},
    ]


def test_explain_without_a_trace_exits_1(tmp_path: Path) -> None:
    log = tmp_path / "s.jsonl"
    with SessionLog(log) as session:
        session.append_call("c1", "ls", {})
        session.append_result("c1", content=[TextBlock("[]")], is_error=False)
    result = invoke(["explain", str(log), "c1"])
    assert result.exit_code == 1
    assert "no decision trace" in result.stderr


def test_explain_cuts_a_huge_failure_message_short_as_replay_does(tmp_path: Path) -> None:
    """The message of a logged failure is the model's or a tool's: 10 MB of it was printed on one line."""
    log = tmp_path / "s.jsonl"
    message = "no " * 1_000_000
    with SessionLog(log) as session:
        session.append_call("c1", "ls", {})
        error = {"name": "ToolError", "code": "DENIED", "message": message}
        session.append_result("c1", content=[TextBlock("Error: no")], is_error=True, error=error)
    result = invoke(["explain", str(log), "c1"])
    assert result.exit_code == 1  # no trace
    (line,) = [line for line in result.stdout.splitlines() if line.startswith("call c1")]
    assert line == f"call c1: ls: failed DENIED: {message[:2000]}… (2998000 more characters not shown)"
    assert json.loads(invoke(["explain", str(log), "c1", "--json"]).stdout)["error"]["message"] == message


def test_explain_an_unknown_call_is_a_usage_error(tmp_path: Path) -> None:
    log = tmp_path / "s.jsonl"
    with SessionLog(log) as session:
        session.append_call("c1", "ls", {})
    result = invoke(["explain", str(log), "nope"])
    assert result.exit_code == 2
    assert 'no tool call "nope"' in result.stderr


def two_agents_log(path: Path, *, global_call: bool = False) -> Path:
    """Call ``c1`` made by alice (denied) and bob (allowed), and by the global scope (failed) if asked."""
    deny = {"name": "ToolError", "code": "DENIED", "message": "no"}
    with SessionLog(path) as session:
        for agent, error in (("alice", deny), ("bob", None), *(((None, deny),) if global_call else ())):
            session.append_call("c1", "ls", {}, agent=agent)
            content = [TextBlock("Error: no" if error else "[]")]
            session.append_result("c1", content=content, is_error=error is not None, error=error, agent=agent)
    return path


def test_explain_refuses_a_call_id_two_agents_used_without_agent(tmp_path: Path) -> None:
    # It used to explain the latest call with the id, whichever agent made it.
    log = two_agents_log(tmp_path / "s.jsonl", global_call=True)
    result = invoke(["explain", str(log), "c1"])
    assert result.exit_code == 2
    assert (
        f'call id "c1" was used by more than one agent in {log}: "alice", "bob" and the global scope;'
        " pass --agent ID (--agent '' for the global scope)"
    ) in " ".join(result.stderr.split())


@pytest.mark.parametrize(
    ("agent", "outcome"), [("alice", "failed DENIED"), ("bob", "succeeded"), ("", "failed DENIED")]
)
def test_explain_agent_picks_that_agents_call(tmp_path: Path, agent: str, outcome: str) -> None:
    log = two_agents_log(tmp_path / "s.jsonl", global_call=True)
    result = invoke(["explain", str(log), "c1", "--agent", agent, "--json"])
    assert result.exit_code == 1  # none of them has a trace
    data = json.loads(result.stdout)
    assert (data["agent"], data["isError"]) == (agent or None, outcome != "succeeded")
    shown = invoke(["explain", str(log), "c1", "--agent", agent])
    assert f"call c1: ls{f' (agent {agent})' if agent else ''}: {outcome}" in shown.stdout


def test_explain_agent_that_made_no_such_call_is_a_usage_error(tmp_path: Path) -> None:
    log = two_agents_log(tmp_path / "s.jsonl")
    result = invoke(["explain", str(log), "c1", "--agent", "carol"])
    assert result.exit_code == 2
    message = f'no tool call "c1" of agent "carol" in {log} (made by "alice" and "bob")'
    assert message in " ".join(result.stderr.split())


def test_explain_without_agent_takes_the_one_agent_that_used_the_id(tmp_path: Path) -> None:
    log = tmp_path / "s.jsonl"
    with SessionLog(log) as session:
        session.append_call("c1", "ls", {}, agent="alice")
        error = {"name": "E", "code": "X", "message": "m"}
        session.append_result("c1", content=[TextBlock("m")], is_error=True, error=error, agent="alice")
        # A second session appended to the file: its call with the id is the one shown.
        session.append_call("c1", "ls", {}, agent="alice")
        session.append_result("c1", content=[TextBlock("[]")], is_error=False, agent="alice")
    data = json.loads(invoke(["explain", str(log), "c1", "--json"]).stdout)
    assert (data["agent"], data["isError"]) == ("alice", False)


async def test_a_malformed_guard_verdict_is_one_error_step() -> None:
    def sloppy(execution: ToolExecution) -> Any:
        return 42

    runtime = traced(json_tool("t"))
    runtime.guard(sloppy)
    result = await runtime.execute(make_input("t"))
    [(stage, actor, outcome)] = steps(result)
    assert (stage, actor) == ("guard", sloppy.__qualname__)
    assert outcome.startswith("error: POLICY_ERROR: guard") and "42" in outcome


async def test_a_results_trace_is_formatted_when_first_read_and_equals_a_built_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from dsh_core._trace import TraceRecorder

    builds: list[int] = []
    original = TraceRecorder.build

    def counting(self: TraceRecorder) -> DecisionTrace:
        builds.append(1)
        return original(self)

    monkeypatch.setattr(TraceRecorder, "build", counting)
    runtime = make_runtime(json_tool("echo"), plugins=[Pre(lambda execution: None)])
    runtime.trace_decisions = True
    result = await runtime.execute(make_input("echo", {"x": 1}))
    assert builds == []  # nothing formatted while the call ran
    trace = trace_of(result)
    assert trace is not None
    first = trace.steps
    assert builds == [1]
    assert trace.steps is first and len(trace) == len(first) and builds == [1]
    rebuilt = DecisionTrace(first)
    assert trace == rebuilt and rebuilt == trace and hash(trace) == hash(rebuilt)
    assert repr(trace) == repr(rebuilt)
    assert DecisionTrace.from_json(trace.to_json()) == trace


# -- cancellation: the layer that was running when the signal fired still has its step -----------


class SlowPre:
    @hookimpl
    async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
        await trio.sleep(10)
        return await next()


class SlowPost:
    @hookimpl
    async def dsh_post_execute(self, execution: ToolExecution, result: Any, next: Next) -> Any:
        await trio.sleep(10)
        return await next()


class SlowApproval:
    async def request(self, execution: ToolExecution, reason: str | None) -> str:
        await trio.sleep(10)
        return "allowed-once"


async def slow_body(args: Any) -> str:
    await trio.sleep(10)
    return "ok"


async def cancelled_at_one_second(runtime: Any, *, via: str = "execute", agent: str | None = None) -> Any:
    signal = CancelSignal()
    async with trio.open_nursery() as nursery:

        async def cancel() -> None:
            await trio.sleep(1)
            signal.cancel()

        nursery.start_soon(cancel)
        if via == "execute":
            result = await runtime.execute(make_input("t", signal=signal, agent=agent))
        else:
            # Two parallel calls: the scheduler dispatches them in tasks of its own.
            inputs = [make_input("t", signal=signal, call_id=f"c{n}", agent=agent) for n in range(2)]
            result, other = await run_tool_calls(runtime, inputs)
            assert other == result
    return result


ABORTED_BODY = ("execute", "t (body)", "fail: ABORTED: tool call aborted")


@pytest.mark.parametrize("via", ["execute", "run_tool_calls"])
async def test_a_body_the_cancellation_interrupts_is_recorded_aborted(
    via: str, autojump_clock: trio.testing.MockClock
) -> None:
    tool = json_tool("t", slow_body, is_concurrency_safe=lambda a: True)
    runtime = traced(tool, plugins=[("pre", Pre()), ("post", Post(lambda r: r))])
    result = await cancelled_at_one_second(runtime, via=via)
    assert result.code == "ABORTED"
    assert steps(result) == [("pre", "pre", "pass"), ABORTED_BODY, ("post", "post", "pass")]


async def test_wrappers_a_cancellation_unwinds_through_are_interrupted(autojump_clock: trio.testing.MockClock) -> None:
    runtime = traced(json_tool("t", slow_body), plugins=[("inner-wrap", Wrapper()), ("outer-wrap", Wrapper())])
    result = await cancelled_at_one_second(runtime)
    assert result.code == "ABORTED"
    assert steps(result) == [
        ("execute", "outer-wrap", "interrupted"),
        ("execute", "inner-wrap", "interrupted"),
        ABORTED_BODY,
    ]


async def test_pre_execute_listeners_a_cancellation_interrupts_are_recorded(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runtime = traced(json_tool("t"), plugins=[("slow", SlowPre()), ("outer", Pre()), ("post", Post(lambda r: r))])
    result = await cancelled_at_one_second(runtime)
    assert result.code == "ABORTED_BEFORE_DISPATCH"
    assert steps(result) == [("pre", "outer", "interrupted"), ("pre", "slow", "interrupted"), ("post", "post", "pass")]
    assert [step.decisive for step in result.trace] == [False, False, False]  # an interrupted listener decided nothing


async def test_a_post_execute_listener_a_cancellation_interrupts_is_recorded(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runtime = traced(json_tool("t"), plugins=[("slow", SlowPost()), ("outer", Post(lambda r: r))])
    result = await cancelled_at_one_second(runtime)
    assert result.code == "ABORTED"
    assert steps(result) == [
        ("execute", "t (body)", "ok"),
        ("post", "outer", "interrupted"),
        ("post", "slow", "interrupted"),
    ]


@pytest.mark.parametrize("body", [None, slow_body], ids=["inline-tool", "suspending-tool"])
async def test_an_approval_prompt_a_cancellation_interrupts_is_recorded(
    body: Any, autojump_clock: trio.testing.MockClock
) -> None:
    # An inline tool's stages run unscoped (the prompt gets a scope of its own); a suspending one's run in one scope.
    tool = json_tool("t", body) if body is not None else json_tool("t")
    runtime = traced(tool, plugins=[("ask", Pre(lambda e: Ask("sure?")))], approval=SlowApproval())
    result = await cancelled_at_one_second(runtime, agent="main")
    assert result.code == "ABORTED_BEFORE_DISPATCH"
    assert steps(result) == [("pre", "ask", "ask: sure?"), ("approval", "approval", "interrupted")]


async def test_a_listener_that_fails_as_it_is_cancelled_is_an_error_not_interrupted(
    autojump_clock: trio.testing.MockClock,
) -> None:
    class FailsInCleanup:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(trio.sleep_forever)
                try:
                    await trio.sleep(10)
                finally:
                    raise RuntimeError("cleanup broke")
            return await next()

    runtime = traced(json_tool("t"), plugins=[("broken", FailsInCleanup())])
    result = await cancelled_at_one_second(runtime)
    assert result.code == "POLICY_ERROR"
    assert steps(result) == [("pre", "broken", "error: POLICY_ERROR: cleanup broke")]


async def test_a_body_that_fails_as_it_is_cancelled_is_recorded_with_its_failure(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def fails_in_cleanup(args: Any) -> str:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.sleep_forever)
            try:
                await trio.sleep(10)
            finally:
                raise RuntimeError("cleanup broke")
        return "ok"

    result = await cancelled_at_one_second(traced(json_tool("t", fails_in_cleanup), plugins=[("wrap", Wrapper())]))
    assert result.code == "TOOL_ERROR"
    assert steps(result) == [("execute", "wrap", "interrupted"), ("execute", "t (body)", "fail: TOOL_ERROR: cleanup broke")]


async def test_an_untraced_cancelled_call_records_nothing_and_ends_as_a_traced_one(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    plugins = [("pre", Pre()), ("wrap", Wrapper()), ("post", Post(lambda r: r))]
    with_trace = await cancelled_at_one_second(traced(json_tool("t", slow_body), plugins=plugins))

    def refuse() -> None:
        raise AssertionError("a trace was recorded with trace_decisions off")

    monkeypatch.setattr(_pipeline, "TraceRecorder", refuse)
    runtime = traced(json_tool("t", slow_body), plugins=plugins)
    runtime.trace_decisions = False
    without = await cancelled_at_one_second(runtime)
    assert without.trace is None
    assert without == with_trace and without.code == "ABORTED"


def test_explain_and_replay_show_a_call_cut_short(tmp_path: Path) -> None:
    log = tmp_path / "s.jsonl"
    with SessionLog(log) as session:
        session.append_call("c1", "ls", {})
        session.append_unwound("c1", cause="KeyboardInterrupt", body_started=False)
    explained = invoke(["explain", str(log), "c1"])
    assert "call c1: ls: cut short (KeyboardInterrupt) before its body started: no result" in explained.stdout
    as_json = json.loads(invoke(["explain", str(log), "c1", "--json"]).stdout)
    assert as_json["unwound"] == {"callId": "c1", "cause": "KeyboardInterrupt", "bodyStarted": False}
    replayed = invoke(["replay", str(log)])
    assert "(cut short (KeyboardInterrupt) before its body started: no result)" in replayed.stdout


async def test_a_plugin_registered_without_a_name_is_traced_by_its_class() -> None:
    runtime = make_runtime(json_tool("t"), trace_decisions=True)
    first, second = Pre(lambda execution: Allow()), Pre()
    first_name = runtime.plugins.register(first)
    second_name = runtime.plugins.register(second)
    assert first_name != second_name  # two instances of one class still get a name each
    result = await runtime.execute(make_input("t"))
    # pluggy calls the plugin registered last first.
    assert [(actor, outcome) for stage, actor, outcome in steps(result) if stage == "pre"] == [
        (second_name, "pass"),
        (first_name, "allow"),
    ]
    assert first_name == f"Pre-{id(first):x}"


async def test_a_plugin_with_its_own_name_keeps_it_when_registered_without_one() -> None:
    import types

    module = types.ModuleType("my_policy_module")

    @hookimpl
    async def dsh_pre_execute(execution: ToolExecution, next: Next) -> Any:
        return await next()

    module.dsh_pre_execute = dsh_pre_execute  # type: ignore[attr-defined]
    runtime = make_runtime(json_tool("t"))
    assert runtime.plugins.register(module) == "my_policy_module"


async def test_a_call_cancelled_while_it_waits_for_a_resource_key_says_so(
    autojump_clock: trio.testing.MockClock,
) -> None:
    tool = json_tool(
        "t", slow_body, is_concurrency_safe=lambda a: True, resource_keys=lambda a: {"write": ["same-file"]}
    )
    runtime = traced(tool, plugins=[("gate", Pre(lambda execution: Allow()))])
    first_signal, second_signal = CancelSignal(), CancelSignal()
    async with trio.open_nursery() as nursery:

        async def cancel_the_waiting_call() -> None:
            await trio.sleep(1)  # the first call holds the key; the second waits for it
            second_signal.cancel("the user moved on")

        nursery.start_soon(cancel_the_waiting_call)
        first, second = await run_tool_calls(
            runtime,
            [make_input("t", signal=first_signal, call_id="c1"), make_input("t", signal=second_signal, call_id="c2")],
        )
    assert not first.is_error
    assert second.code == "ABORTED_BEFORE_DISPATCH"
    assert steps(second) == [("pre", "gate", "allow"), ("execute", "dispatch", "cancelled: the user moved on")]


async def test_a_huge_cancel_reason_is_cut_in_the_trace() -> None:
    signal = CancelSignal()

    def cancel_then_pass(execution: ToolExecution) -> None:
        signal.cancel(["x" * 10] * 10_000)  # any object: the trace shows a bounded repr of it

    runtime = traced(json_tool("t"))
    runtime.guard(cancel_then_pass)
    result = await runtime.execute(make_input("t", signal=signal))
    assert result.code == "ABORTED_BEFORE_DISPATCH"
    dispatch = trace_of(result).stage("execute")  # type: ignore[union-attr]
    assert [step.actor for step in dispatch] == ["dispatch"]
    assert dispatch[0].outcome.startswith("cancelled: ['xxxxxxxxxx', ")
    assert dispatch[0].outcome.endswith("...") and len(dispatch[0].outcome) == len("cancelled: ") + 200 + 3
