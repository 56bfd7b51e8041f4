"""Presentation through the registry, session recording and replay from the log alone."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from dsh_core import (
    Agent,
    Rewrite,
    SessionLog,
    SessionLogError,
    SessionRecorder,
    TextBlock,
    ToolOutput,
    ToolResult,
    UserMessage,
    define_tool,
    hookimpl,
    read_session_log,
    replay,
    run_tool_calls,
    simulate,
)
from dsh_core._cli import _Recorder
from dsh_core.presentation import GenericCallView, ReadFileLine, ReadResultView, TerminalCallView
from dsh_core.testing import json_tool, make_input, make_runtime


def read_tool() -> Any:
    async def read(args: Any) -> dict[str, Any]:
        return {"path": args["path"], "lines": ["alpha", "beta"]}

    def present_result(args: Any, result: ToolResult) -> ReadResultView | None:
        if result.is_error:
            return None
        lines = result.content[0].text.splitlines()  # type: ignore[union-attr]
        return ReadResultView(
            path=args["path"],
            offset=1,
            lines=tuple(ReadFileLine(number=i + 1, text=t) for i, t in enumerate(lines)),
            total_lines=len(lines),
        )

    return define_tool(
        name="read",
        description="read a file",
        parameters={"path": {"type": "string", "required": True}},
        output=ToolOutput(schema={"type": "json"}, render=lambda a, v: [TextBlock("\n".join(v["lines"]))]),
        execute=read,
        present_call=lambda args: TerminalCallView(title=f"cat {args['path']}"),
        present_result=present_result,
    )


def test_missing_presenter_falls_back_to_generic_card() -> None:
    runtime = make_runtime(json_tool("plain"))
    view = runtime.present_call("plain", {"x": 1})
    assert view == GenericCallView(title="plain", raw_input={"x": 1})
    assert runtime.present_call("unknown", None) == GenericCallView(title="unknown")


def test_raising_or_wrong_presenter_falls_back(caplog: pytest.LogCaptureFixture) -> None:
    def boom(args: Any) -> Any:
        raise RuntimeError("presenter broke")

    runtime = make_runtime(json_tool("a", present_call=boom), json_tool("b", present_call=lambda args: "not a view"))
    assert runtime.present_call("a", {}) == GenericCallView(title="a", raw_input={})
    assert runtime.present_call("b", {}) == GenericCallView(title="b", raw_input={})
    assert "presenter broke" in caplog.text


def test_present_call_with_invalid_args_is_soft() -> None:
    runtime = make_runtime(read_tool())
    assert runtime.present_call("read", {"path": 3}) == GenericCallView(title="read", raw_input={"path": 3})


async def test_replay_of_a_recorded_session_equals_the_live_presentation(tmp_path: Path) -> None:
    log_path = tmp_path / "session.jsonl"
    runtime = make_runtime(read_tool())
    live: list[tuple[Any, Any]] = []
    with SessionLog(log_path) as log:
        recorder = SessionRecorder(log)
        runtime.plugins.register(recorder)
        for args in ({"path": "a.txt"}, {"path": 5}):
            request = make_input("read", args)
            recorder.record_call(request)
            result = await runtime.execute(request)
            live.append((runtime.present_call("read", request.arguments), runtime.present_result("read", args, result)))
    replayed = replay(read_session_log(log_path), make_runtime(read_tool()))
    assert [(r.call_view, r.result_view) for r in replayed] == live
    assert replayed[0].result is not None and not replayed[0].result.is_error
    assert replayed[1].error is not None and replayed[1].error["code"] == "INVALID_ARGS"


async def test_recorder_never_logs_the_canonical_value(tmp_path: Path) -> None:
    log_path = tmp_path / "s.jsonl"

    async def secret(args: Any) -> dict[str, str]:
        return {"token": "s3cr3t"}

    tool = define_tool(
        name="secret", description="", parameters={},
        output=ToolOutput(schema={"type": "json"}, render=lambda a, v: [TextBlock("[redacted]")]), execute=secret,
    )  # fmt: skip
    runtime = make_runtime(tool)
    with SessionLog(log_path) as log:
        recorder = SessionRecorder(log)
        runtime.plugins.register(recorder)
        request = make_input("secret")
        recorder.record_call(request)
        await runtime.execute(request)
    assert "s3cr3t" not in log_path.read_text()


async def test_a_recorder_as_event_sink_keeps_a_plugin_event_and_replay_passes_over_it(tmp_path: Path) -> None:
    # README: a plugin's runtime.send_event(...) reaches the host's event_sink, "a session log keeps it".
    log_path = tmp_path / "s.jsonl"
    with SessionLog(log_path) as log:
        recorder = SessionRecorder(log)
        runtime = make_runtime(read_tool())
        runtime.event_sink = recorder.event_sink
        runtime.plugins.register(recorder)
        runtime.send_event("my-plugin/flushed", {"rows": 3})
        request = make_input("read", {"path": "a.txt"}, call_id="c1")
        recorder.record_call(request)
        await runtime.execute(request)
    events = read_session_log(log_path).events
    assert [(e.type, e.data) for e in events][:1] == [("my-plugin/flushed", {"rows": 3})]
    assert [e.type for e in events] == ["my-plugin/flushed", "tool/call", "tool/result"]
    (call,) = replay(read_session_log(log_path), make_runtime(read_tool()))
    assert call.call_id == "c1" and call.result is not None


@pytest.mark.parametrize("log", ["session.jsonl", Path("session.jsonl")], ids=["str", "path"])
def test_a_recorder_or_replay_given_a_path_says_what_to_pass(log: Any) -> None:
    with pytest.raises(TypeError) as raised:
        SessionRecorder(log)
    assert str(raised.value) == f"SessionRecorder() records into an open SessionLog(path), got {type(log).__name__}"
    with pytest.raises(TypeError) as raised:
        replay(log, make_runtime())
    assert str(raised.value) == (
        f"replay() reads the events of a session log: pass read_session_log(path), got {type(log).__name__}"
    )


@pytest.mark.parametrize(
    ("log", "message"),
    [
        (None, "replay() reads the events of a session log: pass read_session_log(path), got NoneType"),
        ([{"type": "tool/call"}], "replay() reads the events of a session log: log[0] is dict, not a SessionEvent"),
    ],
    ids=["None", "dicts"],
)
def test_replay_of_something_that_is_not_a_log_names_it(log: Any, message: str) -> None:
    with pytest.raises(TypeError) as raised:
        replay(log, make_runtime())
    assert str(raised.value) == message


def test_a_recorder_checks_its_runtime(tmp_path: Path) -> None:
    with SessionLog(tmp_path / "s.jsonl") as log, pytest.raises(TypeError) as raised:
        SessionRecorder(log, "runtime")  # type: ignore[arg-type]
    assert str(raised.value) == "SessionRecorder() takes the ToolRuntime the calls run in or None, got str"


async def test_replay_keeps_a_call_whose_result_was_never_logged(tmp_path: Path) -> None:
    log_path = tmp_path / "s.jsonl"
    with SessionLog(log_path) as log:
        log.append_call("c1", "read", {"path": "x"})
    (call,) = replay(read_session_log(log_path), make_runtime(read_tool()))
    assert call.result is None and call.call_view == TerminalCallView(title="cat x")


async def test_contexts_that_followed_a_result_are_logged_and_replayed(tmp_path: Path) -> None:
    log_path = tmp_path / "s.jsonl"

    async def body(args: Any, run: Any) -> str:
        run.defer_context(UserMessage([TextBlock("remember to close the file")], source="opener", meta={"n": 1}))
        return "opened"

    class Tidy:
        @hookimpl
        async def dsh_pre_execute(self, execution: Any, next: Any) -> Any:
            decision = await next()
            if execution.arguments.get("path") == "./a":
                return Rewrite({"path": "a"}, "tidied")
            return decision

    tool = define_tool(
        name="open", description="", parameters={"path": {"type": "string"}}, output={"type": "string"}, execute=body
    )
    runtime = make_runtime(tool)
    runtime.plugins.register(Tidy(), name="tidy")
    with SessionLog(log_path) as log:
        recorder = SessionRecorder(log)
        runtime.plugins.register(recorder)
        for call_id, path in (("c1", "./a"), ("c2", "b")):
            request = make_input("open", {"path": path}, call_id=call_id)
            recorder.record_call(request)
            live = await runtime.execute(request)
    assert len(live.additional_contexts) == 1
    events = read_session_log(log_path).events
    rewritten = events[1].data["contexts"]
    assert [context["source"] for context in rewritten] == ["tidy", "opener"]
    assert rewritten[1] == {
        "source": "opener",
        "content": [{"type": "text", "text": "remember to close the file"}],
        "meta": {"n": 1},
    }
    first, second = replay(read_session_log(log_path), runtime)
    assert [context.source for context in first.contexts] == ["tidy", "opener"]
    assert first.contexts[1].content == (TextBlock("remember to close the file"),)
    assert first.contexts[1].meta == {"n": 1}
    assert [context.source for context in second.contexts] == ["opener"]


async def test_a_result_without_contexts_writes_no_contexts_key(tmp_path: Path) -> None:
    log_path = tmp_path / "s.jsonl"
    runtime = make_runtime(json_tool("t"))
    with SessionLog(log_path) as log:
        recorder = SessionRecorder(log)
        runtime.plugins.register(recorder)
        request = make_input("t")
        recorder.record_call(request)
        await runtime.execute(request)
    assert "contexts" not in read_session_log(log_path).events[1].data


def test_a_user_message_needs_a_source() -> None:
    """The source says who produced the message: an empty one was accepted, logged, and refused by replay."""
    with pytest.raises(ValueError, match=r"^UserMessage.source must not be empty \(name who produced the message\)$"):
        UserMessage([TextBlock("note")], source="")


@pytest.mark.parametrize("source", ["tool", " ", "plugin:spill", "ünïcode\nsource"])
async def test_every_context_a_result_can_carry_is_logged_and_replayed(tmp_path: Path, source: str) -> None:
    log_path = tmp_path / "s.jsonl"
    context = UserMessage([TextBlock("note")], source=source, meta={"k": [1]})

    async def body(args: Any, run: Any) -> str:
        run.defer_context(context)
        return "ok"

    runtime = make_runtime(define_tool(name="t", description="", parameters={}, output={"type": "string"}, execute=body))
    with SessionLog(log_path) as log:
        recorder = SessionRecorder(log)
        runtime.plugins.register(recorder)
        request = make_input("t", call_id="c1")
        recorder.record_call(request)
        live = await runtime.execute(request)
    (replayed,) = replay(read_session_log(log_path), runtime)
    assert live.additional_contexts == (context,)
    assert replayed.contexts == live.additional_contexts


async def test_a_body_deferring_a_context_without_a_source_fails_and_its_log_replays(tmp_path: Path) -> None:
    log_path = tmp_path / "s.jsonl"

    async def body(args: Any, run: Any) -> str:
        run.defer_context(UserMessage([TextBlock("note")], source=""))
        return "ok"

    runtime = make_runtime(define_tool(name="t", description="", parameters={}, output={"type": "string"}, execute=body))
    with SessionLog(log_path) as log:
        recorder = SessionRecorder(log)
        runtime.plugins.register(recorder)
        request = make_input("t", call_id="c1")
        recorder.record_call(request)
        live = await runtime.execute(request)
    assert live.is_error and live.error.info is not None and live.error.info.code == "TOOL_ERROR"
    assert live.error.message == "UserMessage.source must not be empty (name who produced the message)"
    (replayed,) = replay(read_session_log(log_path), runtime)
    assert replayed.result is not None and replayed.result.is_error
    assert replayed.error is not None and replayed.error["code"] == "TOOL_ERROR"
    assert replayed.contexts == ()


@pytest.mark.parametrize(
    ("contexts", "message"),
    [
        ("nope", "expected a list"),
        ([{"source": "", "content": []}], "source must be a non-empty str"),
        ([{"source": "s", "content": [{"type": "text"}]}], "invalid logged content"),
        ([{"source": "s", "content": [], "extra": 1}], "is not a {source, content, meta} object"),
    ],
)
def test_malformed_logged_contexts_are_refused(tmp_path: Path, contexts: Any, message: str) -> None:
    log_path = tmp_path / "s.jsonl"
    with SessionLog(log_path) as log:
        log.append_call("c1", "t", {})
        log.append(
            {
                "type": "tool/result",
                "data": {
                    "callId": "c1",
                    "content": [],
                    "isError": False,
                    "error": None,
                    "meta": None,
                    "contexts": contexts,
                },
            }
        )
    with pytest.raises(SessionLogError, match=re.escape(message)):
        replay(read_session_log(log_path), make_runtime(json_tool("t")))


def test_record_call_names_agents_as_every_other_log_does(tmp_path: Path) -> None:
    class Team:
        id = "not-the-name"

        def __str__(self) -> str:
            return "team-blue"

    class Unprintable:
        def __str__(self) -> str:
            raise RuntimeError("no")

    log_path = tmp_path / "s.jsonl"
    with SessionLog(log_path) as log:
        recorder = SessionRecorder(log)
        for call_id, agent in (("a", Agent("main")), ("b", Team()), ("c", Unprintable()), ("d", None)):
            recorder.record_call(make_input("t", call_id=call_id, agent=agent))
    logged = [event.data["agent"] for event in read_session_log(log_path).events]
    # The same names the audit log and the effect ledger use (scope_id), never an exception.
    assert logged == ["main", "team-blue", "<unprintable Unprintable scope>", None]


async def test_a_call_cut_short_is_logged_as_unwound_and_readers_say_so(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async def interrupted(args: Any) -> str:
        raise KeyboardInterrupt

    async def slow(args: Any) -> str:
        await trio.sleep(10)
        return "done"

    log_path = tmp_path / "s.jsonl"
    runtime = make_runtime(json_tool("interrupted", interrupted), json_tool("slow", slow), json_tool("echo"))
    with SessionLog(log_path) as log:
        recorder = SessionRecorder(log, runtime)
        runtime.plugins.register(recorder)
        first, second = make_input("interrupted", call_id="c1"), make_input("slow", call_id="c2")
        recorder.record_call(first)
        with pytest.raises(KeyboardInterrupt):
            await runtime.execute(first)
        recorder.record_call(second)
        with trio.move_on_after(1) as turn:  # the host's turn deadline
            await runtime.execute(second)
        assert turn.cancelled_caught
        recorder.record_call(make_input("echo", call_id="c3"))  # the process stopped while it ran
    events = read_session_log(log_path).events
    assert [(e.type, e.data) for e in events if e.type != "tool/call"] == [
        ("tool/unwound", {"callId": "c1", "agent": None, "cause": "KeyboardInterrupt", "bodyStarted": True}),
        ("tool/unwound", {"callId": "c2", "agent": None, "cause": "Cancelled", "bodyStarted": True}),
    ]
    replayed = replay(events, runtime)
    assert [(call.call_id, call.result, call.unwound) for call in replayed] == [
        ("c1", None, {"callId": "c1", "agent": None, "cause": "KeyboardInterrupt", "bodyStarted": True}),
        ("c2", None, {"callId": "c2", "agent": None, "cause": "Cancelled", "bodyStarted": True}),
        ("c3", None, None),
    ]
    report = await simulate(events, runtime)
    assert [call.note for call in report.calls] == [
        "cut short (KeyboardInterrupt) after its body started: no result",
        "cut short (Cancelled) after its body started: no result",
        "no result was recorded",
    ]


async def test_recorded_calls_a_cut_turn_never_began_are_logged_as_unwound_before_their_body(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async def slow(args: Any) -> str:
        await trio.sleep(10)
        return "done"

    log_path = tmp_path / "s.jsonl"
    # "slow" is exclusive: nothing after it starts before it settles, so the deadline leaves c3 and c4 unbegun.
    runtime = make_runtime(json_tool("echo"), json_tool("slow", slow))
    calls = [
        make_input("echo", call_id="c1"),
        make_input("slow", call_id="c2"),
        make_input("echo", call_id="c3", agent=Agent("helper")),
        make_input("echo", call_id="c3"),
    ]
    with SessionLog(log_path) as log:
        recorder = SessionRecorder(log, runtime)
        runtime.plugins.register(recorder)
        for call in calls:
            recorder.record_call(call)
        cancelled: BaseException | None = None
        with trio.move_on_after(1):
            try:
                await run_tool_calls(runtime, calls)
            except trio.Cancelled as exc:
                cancelled = exc
                assert recorder.record_unbegun(exc) == 2
                raise
        assert cancelled is not None
        assert recorder.record_unbegun(cancelled) == 0  # each is written once
    events = read_session_log(log_path).events
    assert [(e.data["callId"], e.data["agent"], e.data["bodyStarted"]) for e in events if e.type == "tool/unwound"] == [
        ("c2", None, True),
        ("c3", "helper", False),
        ("c3", None, False),
    ]
    replayed = replay(events, runtime)
    assert [(call.call_id, call.result is not None, call.unwound is not None) for call in replayed] == [
        ("c1", True, False),
        ("c2", False, True),
        ("c3", False, True),
        ("c3", False, True),
    ]
    with pytest.raises(TypeError, match="record_unbegun\\(\\) takes the exception that ended the turn, got str"):
        recorder.record_unbegun("cancelled")  # type: ignore[arg-type]


def test_an_unwound_event_for_an_unknown_call_is_passed_over_and_a_bad_one_is_reported(tmp_path: Path) -> None:
    log_path = tmp_path / "s.jsonl"
    with SessionLog(log_path) as log:
        log.append_unwound("elsewhere", cause="Cancelled", body_started=False)
        log.append_call("c1", "echo", {})
        log.append({"type": "tool/unwound", "data": {"cause": "Cancelled"}})
    events = read_session_log(log_path).events
    with pytest.raises(SessionLogError, match=r"seq 3: malformed tool/unwound event: callId must be a non-empty str"):
        replay(events, make_runtime(json_tool("echo")))
    assert replay(events[:2], make_runtime(json_tool("echo")))[0].unwound is None


async def test_a_result_the_log_cannot_take_is_kept_on_the_recorder_for_the_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import dsh_core._session_log as session_log_module

    def disk_full(descriptor: int) -> None:
        raise OSError(28, "No space left on device")

    log_path = tmp_path / "session.jsonl"
    runtime = make_runtime(json_tool("echo"))
    with SessionLog(log_path, fsync="always") as log:
        recorder = SessionRecorder(log)
        runtime.plugins.register(recorder)
        request = make_input("echo", {"a": 1}, call_id="c1")
        recorder.record_call(request)
        recorder.check()  # nothing failed yet
        assert recorder.failure is None
        monkeypatch.setattr(session_log_module.os, "fsync", disk_full)
        result = await runtime.execute(request)  # an observer's failure does not fail the call
        monkeypatch.undo()
        assert not result.is_error
        assert isinstance(recorder.failure, OSError) and recorder.failure.errno == 28
        with pytest.raises(SessionLogError, match=r"the log is incomplete") as raised:
            recorder.check()
        assert "No space left on device" in str(raised.value)
        assert raised.value.__cause__ is recorder.failure
        # The next record refuses too, and the first failure is the one kept.
        with pytest.raises(SessionLogError, match="an earlier write failed"):
            recorder.record_call(make_input("echo", {"b": 2}, call_id="c2"))
        assert isinstance(recorder.failure, OSError)


@pytest.mark.parametrize("recorder_class", [SessionRecorder, _Recorder], ids=["SessionRecorder", "cli"])
async def test_an_unwound_event_the_log_cannot_take_is_kept_on_the_recorder_for_the_host(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    autojump_clock: trio.testing.MockClock,
    recorder_class: type[SessionRecorder],
) -> None:
    """A call cut short is told to ``dsh_call_unwound``: its failed write must fail ``check()`` like a result's."""

    async def slow(args: Any) -> None:
        await trio.sleep(10)

    def disk_full(*args: object, **kwargs: object) -> int:
        raise OSError(28, "No space left on device")

    runtime = make_runtime(json_tool("slow", slow))
    with SessionLog(tmp_path / "session.jsonl") as log:
        recorder = recorder_class(log, runtime)
        runtime.plugins.register(recorder, name="rec")
        request = make_input("slow", {}, call_id="c1")
        recorder.record_call(request)
        monkeypatch.setattr(log, "append_unwound", disk_full)
        with trio.move_on_after(1) as turn:  # the host's turn deadline cuts the call
            await runtime.execute(request)
        assert turn.cancelled_caught
        assert isinstance(recorder.failure, OSError) and recorder.failure.errno == 28
        with pytest.raises(SessionLogError, match=r"No space left on device\); the log is incomplete") as raised:
            recorder.check()
        assert raised.value.__cause__ is recorder.failure
    # The CLI reports the failure itself, once the command's output is written: no warning before it.
    warned = [r.getMessage() for r in caplog.records if "listener rec failed" in r.getMessage()]
    expected = 'tool "slow" (c1): dsh_call_unwound listener rec failed: [Errno 28] No space left on device'
    assert warned == ([] if recorder_class is _Recorder else [expected])
