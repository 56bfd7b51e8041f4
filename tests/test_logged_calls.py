"""Reading the calls of a session log: pairing results with calls, and refusing malformed call events."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from click.testing import CliRunner

from dsh_core import Agent, SessionLog, SessionLogError, SessionRecorder, ToolRuntime, read_session_log, replay
from dsh_core._cli import cli
from dsh_core._logged_calls import logged_calls
from dsh_core._session_log import structure_content
from dsh_core._simulate import simulate
from dsh_core.code_mode import CodeRunResult
from dsh_core.testing import FakeCodeRuntime, json_tool, make_input, make_runtime

TEXT = [{"type": "text", "text": "ok"}]


def write(path: Path, *events: tuple[str, dict[str, Any]]) -> Path:
    """A log written line by line, bypassing SessionLog's own checks (what a foreign or edited file holds)."""
    lines = [json.dumps({"seq": seq, "type": kind, "data": data}) for seq, (kind, data) in enumerate(events, 1)]
    path.write_text("".join(line + "\n" for line in lines))
    return path


def call(call_id: object = "c1", name: object = "echo", agent: object = None) -> tuple[str, dict[str, Any]]:
    return "tool/call", {"callId": call_id, "name": name, "arguments": {}, "agent": agent}


def result(call_id: object = "c1", text: str = "ok") -> tuple[str, dict[str, Any]]:
    content = [{"type": "text", "text": text}]
    return "tool/result", {"callId": call_id, "content": content, "isError": False, "error": None, "meta": None}


def dispatch(parent: object = "c1", **changes: Any) -> dict[str, Any]:
    data = {"rootCallId": parent, "parentCallId": parent, "subCallId": f"{parent}:code:1", "name": "echo"}
    data |= {"arguments": {}, "isError": False, "content": TEXT}
    for key, value in changes.items():
        if value is ...:
            del data[key]
        else:
            data[key] = value
    return data


def test_a_result_belongs_to_the_latest_call_with_its_id(tmp_path: Path) -> None:
    """Two sessions appended to one file reuse call ids: each result settles the call just before it."""
    log = write(
        tmp_path / "log.jsonl",
        call("c1"), result("c1", "first"), call("c2"), call("c1"), result("c1", "second"), result("zz"),
        ("tool/code-dispatch", dispatch("c2")),
    )  # fmt: skip
    calls = logged_calls(read_session_log(log).events)
    assert [(c.seq, c.call_id) for c in calls] == [(1, "c1"), (3, "c2"), (4, "c1")]
    assert [c.result["content"][0]["text"] if c.result else None for c in calls] == ["first", None, "second"]
    assert [len(c.dispatches) for c in calls] == [0, 1, 0]


MALFORMED = pytest.mark.parametrize(
    ("event", "problem"),
    [
        (call(call_id=""), "seq 1: malformed tool/call event: callId must be a non-empty str, got ''"),
        (call(call_id=7), "seq 1: malformed tool/call event: callId must be a non-empty str, got 7"),
        (call(name=5), "seq 1: malformed tool/call event: name must be a str, got 5"),
        (call(agent=""), "seq 1: malformed tool/call event: agent must be null or a non-empty str, got ''"),
        (result(call_id=None), "seq 1: malformed tool/result event: callId must be a non-empty str, got None"),
    ],
    ids=["empty-call-id", "int-call-id", "int-name", "empty-agent", "result-without-call-id"],
)


@MALFORMED
async def test_malformed_call_events_are_refused_by_every_reader(
    tmp_path: Path, event: tuple[str, dict[str, Any]], problem: str
) -> None:
    """Replay, simulate and explain used to coerce these with str() (or crash building the input)."""
    log = write(tmp_path / "log.jsonl", event, result())
    events = read_session_log(log).events
    for reader in (lambda: logged_calls(events), lambda: replay(events, ToolRuntime())):
        with pytest.raises(SessionLogError) as raised:
            reader()
        assert str(raised.value) == problem
    with pytest.raises(SessionLogError) as raised:
        await simulate(events, make_runtime(json_tool("echo")))
    assert str(raised.value) == problem


@MALFORMED
def test_the_cli_reports_a_malformed_call_event_as_a_usage_problem(
    tmp_path: Path, event: tuple[str, dict[str, Any]], problem: str
) -> None:
    log = write(tmp_path / "log.jsonl", event, result())
    runner = CliRunner()
    for command in (["replay", str(log)], ["simulate", str(log)], ["explain", str(log), "c1"]):
        outcome = runner.invoke(cli, ["--no-plugins", *command])
        assert outcome.exit_code == 2, (command, outcome.output)
        assert problem in outcome.output
        assert outcome.exception is None or isinstance(outcome.exception, SystemExit)


def test_the_writer_refuses_ids_a_reader_could_not_pair(tmp_path: Path) -> None:
    with SessionLog(tmp_path / "log.jsonl") as log:
        with pytest.raises(ValueError, match="call_id must not be empty"):
            log.append_call("", "echo", {})
        with pytest.raises(ValueError, match="agent must not be empty"):
            log.append_call("c1", "echo", {}, agent="")
        with pytest.raises(ValueError, match="call_id must not be empty"):
            log.append_result("", content=(), is_error=False)
        with pytest.raises(ValueError, match="sub_call_id must not be empty"):
            log.append_dispatch_start("c1", "c1", "", "echo", {})
        assert log.append_call("c1", "", {}) == 1  # a name is the model's: an empty one is still recorded


def bad_result(**fields: object) -> tuple[str, dict[str, Any]]:
    """A result for c1 with ``fields`` replaced (``...``: the key left out)."""
    data = {"callId": "c1", "content": TEXT, "isError": False, "error": None, "meta": None} | fields
    return "tool/result", {key: value for key, value in data.items() if value is not ...}


MALFORMED_RESULTS = pytest.mark.parametrize(
    ("event", "problem"),
    [
        (bad_result(content=...), "content is missing"),
        (bad_result(content=None), "content must be a list of content blocks, got None"),
        (bad_result(content="ok"), "content must be a list of content blocks, got 'ok'"),
        (bad_result(content=[{"type": "text"}]), "invalid logged content: required field missing @ $[0].text"),
        (bad_result(isError=...), "isError is missing"),
        (bad_result(isError="false"), "isError must be true or false, got 'false'"),
        (bad_result(isError=0), "isError must be true or false, got 0"),
        (bad_result(isError=True, error="boom"), "error must be null or an object {name, code, message}, got 'boom'"),
        (bad_result(isError=True, error=[]), "error must be null or an object {name, code, message}, got ()"),
        (
            bad_result(isError=True, error={"code": "DENIED", "message": "no"}),
            "error must have exactly the keys name, code and message, got 'code', 'message'",
        ),
        (
            bad_result(isError=True, error={"name": "E", "code": 5, "message": "no"}),
            "error.code must be a str, got 5",
        ),
        (bad_result(isError=True), "isError is true but error is null"),
        (
            bad_result(error={"name": "E", "code": "DENIED", "message": "no"}),
            "isError is false but error is set",
        ),
        (bad_result(contexts={"source": "x"}), "invalid logged contexts: expected a list, got an object"),
        (bad_result(contexts="note"), "invalid logged contexts: expected a list, got a string"),
        (
            bad_result(contexts=[{"source": "", "content": TEXT}]),
            "invalid logged contexts: $[0].source must be a non-empty str",
        ),
    ],
    ids=[
        "no-content",
        "null-content",
        "str-content",
        "block-without-text",
        "no-is-error",
        "str-is-error",
        "int-is-error",
        "str-error",
        "list-error",
        "error-without-name",
        "int-error-code",
        "failure-without-error",
        "success-with-error",
        "object-contexts",
        "str-contexts",
        "contexts-without-source",
    ],
)


@MALFORMED_RESULTS
async def test_malformed_results_are_refused_by_every_reader_naming_the_seq(
    tmp_path: Path, event: tuple[str, dict[str, Any]], problem: str
) -> None:
    """Replay raised KeyError or AttributeError, or took "false" for a failure; explain and simulate crashed too."""
    log = write(tmp_path / "log.jsonl", call(), event)
    await refused_by_every_reader(read_session_log(log).events, f"seq 2: malformed tool/result event: {problem}")


async def refused_by_every_reader(events: Any, message: str) -> None:
    """logged_calls, replay (explain) and simulate all raise SessionLogError(message)."""
    for reader in (lambda: logged_calls(events), lambda: replay(events, ToolRuntime())):
        with pytest.raises(SessionLogError) as raised:
            reader()
        assert str(raised.value) == message
    with pytest.raises(SessionLogError) as raised:
        await simulate(events, make_runtime(json_tool("echo")))
    assert str(raised.value) == message


@MALFORMED_RESULTS
def test_the_cli_reports_a_malformed_result_in_one_line(
    tmp_path: Path, event: tuple[str, dict[str, Any]], problem: str
) -> None:
    log = write(tmp_path / "log.jsonl", call(), event)
    runner = CliRunner()
    for command, prefix in (
        (["replay", str(log)], "cannot read session log"),
        (["simulate", str(log)], "cannot simulate"),
        (["explain", str(log), "c1"], "cannot read session log"),
    ):
        outcome = runner.invoke(cli, ["--no-plugins", *command], terminal_width=1000)
        assert outcome.exit_code == 2, (command, outcome.output)
        assert outcome.exception is None or isinstance(outcome.exception, SystemExit), outcome.exception
        assert outcome.output.splitlines() == [
            f"Error: {prefix} {log}: seq 2: malformed tool/result event: {problem}"
        ], command


def test_every_result_the_writer_can_write_is_read_back(tmp_path: Path) -> None:
    """The reader's checks are the writer's: a success, a failure, images and an empty content all pass."""
    image = [{"type": "image", "data": "aGk=", "mimeType": "image/png"}]
    with SessionLog(tmp_path / "log.jsonl") as log:
        log.append_call("c1", "echo", {})
        log.append_result("c1", content=(), is_error=False)
        log.append_call("c2", "echo", {})
        failure = {"name": "ToolError", "code": "", "message": "boom"}
        log.append_result("c2", content=structure_content(TEXT + image), is_error=True, error=failure, meta={"m": 1})
    first, second = logged_calls(read_session_log(tmp_path / "log.jsonl").events)
    assert first.result is not None and first.result["isError"] is False and first.result["error"] is None
    assert second.result is not None and second.result["error"] == failure
    assert second.result["content"] == tuple(TEXT + image)
    replayed = replay(read_session_log(tmp_path / "log.jsonl"), ToolRuntime())
    assert [call.result.is_error for call in replayed if call.result is not None] == [False, True]
    assert replayed[1].result is not None and replayed[1].result.content == structure_content(TEXT + image)


def test_a_result_without_error_reads_as_a_null_error(tmp_path: Path) -> None:
    """``error`` and ``meta`` may be absent, as ``trace`` and ``contexts`` may: they read as null."""
    log = write(tmp_path / "log.jsonl", call(), bad_result(error=..., meta=...))
    (replayed,) = replay(read_session_log(log).events, ToolRuntime())
    assert replayed.error is None and replayed.result is not None and replayed.result.is_error is False


async def test_two_agents_calls_with_one_id_each_get_their_own_result(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """Call ids are per conversation: agents sharing one runtime and log may both have ``call_1``."""

    async def read(args: Any) -> str:
        await trio.sleep(args["t"])
        return f"secret of {args['who']}"

    path = tmp_path / "s.jsonl"
    runtime = make_runtime(json_tool("read", read))
    with SessionLog(path) as log:
        recorder = SessionRecorder(log, runtime)
        runtime.plugins.register(recorder, name="rec")
        alice = make_input("read", {"who": "alice", "t": 2}, call_id="call_1", agent=Agent(id="alice"))
        bob = make_input("read", {"who": "bob", "t": 0}, call_id="call_1", agent=Agent(id="bob"))
        async with trio.open_nursery() as nursery:  # both agents' turns run side by side; bob settles first
            for request in (alice, bob):
                recorder.record_call(request)
                nursery.start_soon(runtime.execute, request)
                await trio.sleep(0.1)
    read_back = read_session_log(path)
    results = [e for e in read_back.events if e.type == "tool/result"]
    assert [(e.data["agent"], e.data["callId"]) for e in results] == [("bob", "call_1"), ("alice", "call_1")]
    calls = logged_calls(read_back.events)
    assert [(c.agent, c.result["content"][0]["text"] if c.result else None) for c in calls] == [
        ("alice", "secret of alice"),
        ("bob", "secret of bob"),
    ]
    replayed = replay(read_back, runtime)
    assert [(c.agent, c.result.content[0].text if c.result else None) for c in replayed] == [  # type: ignore[union-attr]
        ("alice", "secret of alice"),
        ("bob", "secret of bob"),
    ]
    simulated = await simulate(read_back, make_runtime(json_tool("read")))
    assert [(c.agent, c.summary) for c in simulated.calls] == [("alice", "unchanged"), ("bob", "unchanged")]


def test_an_unwound_call_is_paired_by_its_agent_too(tmp_path: Path) -> None:
    log = tmp_path / "s.jsonl"
    with SessionLog(log) as session:
        session.append_call("c1", "echo", {}, agent="alice")
        session.append_call("c1", "echo", {}, agent="bob")
        session.append_unwound("c1", cause="Cancelled", body_started=True, agent="alice")
        session.append_result("c1", content=structure_content(TEXT), is_error=False, agent="bob")
    alice, bob = logged_calls(read_session_log(log).events)
    assert alice.unwound is not None and alice.unwound["cause"] == "Cancelled" and alice.result is None
    assert bob.unwound is None and bob.result is not None and bob.result["agent"] == "bob"


def test_a_result_of_the_global_scope_is_not_given_to_an_agents_call(tmp_path: Path) -> None:
    """``agent: null`` is a scope too: the global call's result stays with it though an agent's call came later."""
    log = write(
        tmp_path / "log.jsonl",
        call("c1"), call("c1", agent="worker"),
        ("tool/result", {**result("c1", "global")[1], "agent": None}),
    )  # fmt: skip
    first, second = logged_calls(read_session_log(log).events)
    assert first.result is not None and first.result["content"][0]["text"] == "global"
    assert second.result is None


def test_a_log_written_before_results_named_their_agent_pairs_by_call_id(tmp_path: Path) -> None:
    """Older logs (and results written without ``agent=``) have no agent key: the latest call with the id takes it."""
    log = write(
        tmp_path / "log.jsonl",
        call("c1", agent="alice"), call("c1", agent="bob"), result("c1", "late"),
        call("c2", agent="alice"), ("tool/unwound", {"callId": "c2", "cause": "Cancelled", "bodyStarted": False}),
    )  # fmt: skip
    calls = logged_calls(read_session_log(log).events)
    assert [(c.agent, c.result["content"][0]["text"] if c.result else None) for c in calls] == [
        ("alice", None),
        ("bob", "late"),
        ("alice", None),
    ]
    assert calls[2].unwound is not None and calls[2].unwound["cause"] == "Cancelled"
    with SessionLog(tmp_path / "direct.jsonl") as session:
        session.append_call("c1", "echo", {}, agent="alice")
        session.append_result("c1", content=structure_content(TEXT), is_error=False)
    (direct,) = logged_calls(read_session_log(tmp_path / "direct.jsonl").events)
    assert direct.result is not None and "agent" not in direct.result


def test_a_result_naming_a_malformed_agent_is_refused(tmp_path: Path) -> None:
    log = write(tmp_path / "log.jsonl", call("c1"), ("tool/result", {**result("c1")[1], "agent": 5}))
    with pytest.raises(
        SessionLogError, match="seq 2: malformed tool/result event: agent must be null or a non-empty str, got 5"
    ):
        logged_calls(read_session_log(log).events)


async def test_two_agents_run_code_calls_with_one_id_each_get_their_own_sub_calls(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The sub-calls of a Code Mode run were given to the latest call with its id, whatever its agent."""

    async def read(args: Any) -> str:
        await trio.sleep(args["t"])
        return f"secret of {args['who']}"

    who = iter([{"who": "alice", "t": 2}, {"who": "bob", "t": 0}])

    async def program(tools: Any) -> CodeRunResult:
        return CodeRunResult(value=await tools["read"](next(who)), has_value=True)

    path = tmp_path / "s.jsonl"
    with SessionLog(path) as log:
        recorder = SessionRecorder(log)
        runtime = ToolRuntime(mode="code", code_runtime=FakeCodeRuntime(program), event_sink=recorder.event_sink)
        runtime.register(json_tool("read", read))
        runtime.plugins.register(recorder, name="rec")
        code = {"code": "...", "description": "read"}
        alice = make_input("run_code", code, call_id="call_1", agent=Agent(id="alice"))
        bob = make_input("run_code", code, call_id="call_1", agent=Agent(id="bob"))
        async with trio.open_nursery() as nursery:  # bob's call is logged before alice's sub-call settles
            for request in (alice, bob):
                recorder.record_call(request)
                nursery.start_soon(runtime.execute, request)
                await trio.sleep(0.1)
    read_back = read_session_log(path)
    dispatches = [e for e in read_back.events if e.type == "tool/code-dispatch"]
    assert [(e.data["agent"], e.data["parentCallId"]) for e in dispatches] == [("bob", "call_1"), ("alice", "call_1")]
    calls = logged_calls(read_back.events)
    assert [(c.agent, [d["content"][0]["text"] for d in c.dispatches]) for c in calls] == [
        ("alice", ["secret of alice"]),
        ("bob", ["secret of bob"]),
    ]


def test_a_log_written_before_dispatches_named_their_agent_pairs_them_by_parent_call_id(tmp_path: Path) -> None:
    dispatch = {"rootCallId": "c1", "parentCallId": "c1", "subCallId": "c1:code:1", "name": "echo", "arguments": {}}
    log = write(
        tmp_path / "log.jsonl",
        call("c1", agent="alice"), call("c1", agent="bob"),
        ("tool/code-dispatch", {**dispatch, "isError": False, "content": TEXT}),
        ("tool/code-dispatch", {**dispatch, "agent": "alice", "isError": False, "content": TEXT}),
    )  # fmt: skip
    alice, bob = logged_calls(read_session_log(log).events)
    assert [d.get("agent") for d in alice.dispatches] == ["alice"]
    assert [d.get("agent", "none") for d in bob.dispatches] == ["none"]


def test_a_dispatch_naming_a_malformed_agent_is_refused(tmp_path: Path) -> None:
    log = write(tmp_path / "log.jsonl", call("c1"), ("tool/code-dispatch", dispatch(agent="")))
    problem = "seq 2: malformed tool/code-dispatch event: agent must be null or a non-empty str, got ''"
    with pytest.raises(SessionLogError, match=problem):
        logged_calls(read_session_log(log).events)


@pytest.mark.parametrize(
    ("event", "problem"),
    [
        (("tool/code-dispatch", dispatch(parentCallId=...)), "parentCallId is missing"),
        (("tool/code-dispatch", dispatch(parentCallId=7)), "parentCallId must be a non-empty str, got 7"),
        (("tool/code-dispatch", dispatch(parentCallId=None)), "parentCallId must be a non-empty str, got None"),
        (("tool/code-dispatch", dispatch(subCallId="")), "subCallId must be a non-empty str, got ''"),
        (("tool/code-dispatch", dispatch(rootCallId=...)), "rootCallId is missing"),
        (("tool/code-dispatch", dispatch(name=3)), "name must be a str, got 3"),
        (("tool/code-dispatch", dispatch(isError="false")), "isError must be true or false, got 'false'"),
        (("tool/code-dispatch", dispatch(isError=...)), "isError is missing"),
        (("tool/code-dispatch", dispatch(content="ok")), "content must be a list of content blocks, got 'ok'"),
        (
            ("tool/code-dispatch", dispatch(content=[{"type": "text"}])),
            "invalid logged content: required field missing @ $[0].text",
        ),
        (("tool/unwound", {"callId": "c1", "bodyStarted": False}), "cause is missing"),
        (("tool/unwound", {"callId": "c1", "cause": 1, "bodyStarted": False}), "cause must be a str, got 1"),
        (
            ("tool/unwound", {"callId": "c1", "cause": "Cancelled", "bodyStarted": "false"}),
            "bodyStarted must be true or false, got 'false'",
        ),
        (("tool/unwound", {"callId": "c1", "cause": "Cancelled"}), "bodyStarted is missing"),
        (
            ("tool/unwound", {"callId": 5, "cause": "Cancelled", "bodyStarted": True}),
            "callId must be a non-empty str, got 5",
        ),
    ],
)
async def test_malformed_dispatch_and_unwound_events_are_refused_naming_the_seq(
    tmp_path: Path, event: tuple[str, dict[str, Any]], problem: str
) -> None:
    """A dispatch without a str parentCallId was attached to a call named "None" or "7"; "false" read as true."""
    log = write(tmp_path / "log.jsonl", call("c1"), call("None"), call("7"), event)
    await refused_by_every_reader(read_session_log(log).events, f"seq 4: malformed {event[0]} event: {problem}")


def test_every_dispatch_and_unwound_event_the_writer_can_write_is_read_back(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    with SessionLog(path) as session:
        session.append_call("c1", "run_code", {})
        session.append_dispatch_start("c1", "c1", "c1:code:1", "echo", {"x": 1})
        session.append_dispatch(
            "c1", "c1", "c1:code:1", "echo", {"x": 1}, content=structure_content(TEXT), is_error=True
        )
        session.append_unwound("c1", cause="KeyboardInterrupt", body_started=True)
    (logged,) = logged_calls(read_session_log(path).events)
    assert [(d["subCallId"], d["isError"]) for d in logged.dispatches] == [("c1:code:1", True)]
    assert logged.unwound is not None and logged.unwound["bodyStarted"] is True
