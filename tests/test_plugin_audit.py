"""The audit log (dsh_plugins.audit): one JSON line per call, never breaking the pipeline."""

from __future__ import annotations

import datetime
import errno
import json
import logging
import os
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from dsh_core import (
    Agent,
    Ask,
    CancelSignal,
    ConfigError,
    Deny,
    Rewrite,
    ToolExecution,
    ToolExecutionResult,
    ToolRuntime,
    failure_result,
    hookimpl,
    run_tool_calls,
)
from dsh_core.testing import json_tool, make_input, make_runtime
from dsh_plugins import audit
from dsh_plugins.audit import AuditLog

FIELDS = [
    "ts",
    "call_id",
    "root_call_id",
    "tool",
    "agent",
    "arguments",
    "outcome",
    "error_code",
    "error_message",
    "plugin",
    "duration_ms",
]


def audited(tmp_path: Path, *tools: Any) -> tuple[ToolRuntime, Path]:
    path = tmp_path / "audit.jsonl"
    runtime = make_runtime(*(tools or (json_tool("echo"),)))
    audit.dsh_setup(runtime, {"path": str(path)})
    return runtime, path


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


async def test_one_line_per_successful_call_with_every_field(tmp_path: Path) -> None:
    runtime, path = audited(tmp_path)
    await runtime.execute(make_input("echo", {"x": [1, "ü"]}, call_id="c1", agent=Agent("main")))
    (record,) = lines(path)
    assert list(record) == FIELDS
    assert record["call_id"] == "c1" and record["root_call_id"] == "c1"
    assert record["tool"] == "echo"
    assert record["agent"] == "main"
    assert record["arguments"] == {"x": [1, "ü"]}
    assert record["outcome"] == "success"
    assert record["error_code"] is None and record["error_message"] is None and record["plugin"] is None
    ts = datetime.datetime.fromisoformat(record["ts"])
    assert ts.utcoffset() == datetime.timedelta(0)
    assert "ü" in path.read_text(encoding="utf-8")  # ensure_ascii=False


async def test_failures_are_recorded_with_code_message_and_blame(tmp_path: Path) -> None:
    class NoShell:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Callable[[], Awaitable[Any]]) -> Any:
            return Deny("no shell") if execution.name == "shell" else await next()

    runtime, path = audited(tmp_path, json_tool("shell"), json_tool("typed", parameters={"n": {"type": "integer"}}))
    runtime.plugins.register(NoShell(), name="no-shell")
    await runtime.execute(make_input("shell", {}, call_id="denied"))
    await runtime.execute(make_input("typed", {"n": "x"}, call_id="invalid"))
    await runtime.execute(make_input("nope", {}, call_id="unknown"))
    denied, invalid, unknown = lines(path)
    assert (denied["outcome"], denied["error_code"], denied["error_message"], denied["plugin"]) == (
        "error",
        "DENIED",
        "no shell",
        "no-shell",
    )
    assert invalid["error_code"] == "INVALID_ARGS" and invalid["agent"] is None
    assert unknown["error_code"] == "UNKNOWN_TOOL" and unknown["error_message"] == 'unknown tool "nope"'
    assert denied["duration_ms"] is None and invalid["duration_ms"] is None


async def test_duration_is_the_dispatch_time_on_trios_clock(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    async def slow(args: Any) -> str:
        await trio.sleep(1.5)
        return "ok"

    runtime, path = audited(tmp_path, json_tool("slow", slow))
    await runtime.execute(make_input("slow"))
    (record,) = lines(path)
    assert record["duration_ms"] == pytest.approx(1500)


async def test_a_raising_observer_does_not_cost_the_audit_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    class Broken:
        @hookimpl
        def dsh_result(self, execution: ToolExecution, result: ToolExecutionResult) -> None:
            raise RuntimeError("observer broke")

    path = tmp_path / "audit.jsonl"
    runtime = make_runtime(json_tool("echo"), plugins=[Broken()])
    audit.dsh_setup(runtime, {"path": str(path)})
    runtime.plugins.register(Broken(), name="broken-after")  # one before, one after the audit observer
    for index in range(3):
        result = await runtime.execute(make_input("echo", {"i": index}))
        assert not result.is_error
    assert [record["arguments"] for record in lines(path)] == [{"i": 0}, {"i": 1}, {"i": 2}]
    assert "observer broke" in caplog.text


def failing_write(monkeypatch: pytest.MonkeyPatch, log: AuditLog, error: int) -> list[bytes]:
    """Make ``os.write`` fail with ``error`` on the audit descriptor only; returns what was attempted."""
    real_write = os.write
    attempted: list[bytes] = []

    def write(fd: int, data: Any) -> int:
        if fd == log._fd:
            attempted.append(bytes(data))
            raise OSError(error, os.strerror(error))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)
    return attempted


async def test_full_disk_logs_one_warning_and_calls_go_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    runtime, path = audited(tmp_path)
    log = runtime.plugins.get_plugin("audit-log")
    assert isinstance(log, AuditLog)
    attempted = failing_write(monkeypatch, log, errno.ENOSPC)
    with caplog.at_level(logging.WARNING, logger="dsh_plugins.audit"):
        for _ in range(3):
            assert not (await runtime.execute(make_input("echo", {"n": 1}))).is_error
    assert len(attempted) == 3
    warnings = [r for r in caplog.records if r.name == "dsh_plugins.audit"]
    assert len(warnings) == 1 and "ENOSPC" in warnings[0].getMessage()
    # The disk has room again: logging resumes and the file stays parseable.
    monkeypatch.undo()
    await runtime.execute(make_input("echo", {"n": 2}, call_id="after"))
    assert [record["call_id"] for record in lines(path)] == ["after"]


async def test_each_kind_of_error_is_warned_about_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    runtime, _ = audited(tmp_path)
    log = runtime.plugins.get_plugin("audit-log")
    assert isinstance(log, AuditLog)
    with caplog.at_level(logging.WARNING, logger="dsh_plugins.audit"):
        for error in (errno.ENOSPC, errno.EIO, errno.ENOSPC, errno.EIO):
            failing_write(monkeypatch, log, error)
            await runtime.execute(make_input("echo"))
            monkeypatch.undo()
    kinds = [r.getMessage() for r in caplog.records if r.name == "dsh_plugins.audit"]
    assert len(kinds) == 2 and "ENOSPC" in kinds[0] and "EIO" in kinds[1]


async def test_a_line_cut_short_is_terminated_before_the_next(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runtime, path = audited(tmp_path)
    log = runtime.plugins.get_plugin("audit-log")
    assert isinstance(log, AuditLog)
    real_write = os.write
    calls = 0

    def short_then_full_disk(fd: int, data: Any) -> int:
        nonlocal calls
        if fd != log._fd:
            return real_write(fd, data)
        calls += 1
        if calls == 1:
            return real_write(fd, bytes(data)[:10])  # a short write...
        raise OSError(errno.ENOSPC, "No space left on device")  # ...then the disk is full

    monkeypatch.setattr(os, "write", short_then_full_disk)
    await runtime.execute(make_input("echo", call_id="cut"))
    monkeypatch.undo()
    await runtime.execute(make_input("echo", call_id="whole"))
    raw = path.read_text(encoding="utf-8").splitlines()
    assert len(raw) == 2
    assert json.loads(raw[1])["call_id"] == "whole"


async def test_a_partial_line_left_by_a_crash_is_terminated_before_the_first_record(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "audit.jsonl"
    path.write_bytes(b'{"call_id": "old"}\n{"call_id": "torn", "argu')  # a writer died mid-line
    runtime, _ = audited(tmp_path)
    with caplog.at_level(logging.WARNING, logger="dsh_plugins.audit"):
        await runtime.execute(make_input("echo", call_id="c1"))
        await runtime.execute(make_input("echo", call_id="c2"))
    raw = path.read_text(encoding="utf-8").splitlines()
    assert raw[:2] == ['{"call_id": "old"}', '{"call_id": "torn", "argu']
    assert [json.loads(line)["call_id"] for line in raw[2:]] == ["c1", "c2"]
    assert "ends in a partial line" in caplog.text


async def test_deep_arguments_are_summarised_not_fatal(tmp_path: Path) -> None:
    deep: Any = "leaf"
    for _ in range(10_000):
        deep = [deep]
    runtime, path = audited(tmp_path)
    result = await runtime.execute(make_input("echo", {"deep": deep}, call_id="deep"))
    assert not result.is_error
    (record,) = lines(path)
    assert record["call_id"] == "deep"
    assert record["arguments"] is None
    assert "nested deeper than 200 levels" in record["arguments_omitted"]


async def test_moderately_nested_arguments_are_kept(tmp_path: Path) -> None:
    nested: Any = 1
    for _ in range(150):
        nested = {"n": nested}
    runtime, path = audited(tmp_path)
    await runtime.execute(make_input("echo", {"v": nested}))
    (record,) = lines(path)
    assert record["arguments"] == {"v": nested}


@pytest.mark.parametrize(("levels", "kept"), [(audit.MAX_DEPTH, True), (audit.MAX_DEPTH + 1, False)])
async def test_arguments_are_kept_up_to_max_depth_levels_counting_the_arguments_object(
    tmp_path: Path, levels: int, kept: bool
) -> None:
    nested: Any = "leaf"
    for _ in range(levels - 1):  # the arguments object is the first level
        nested = [nested]
    runtime, path = audited(tmp_path)
    await runtime.execute(make_input("echo", {"v": nested}))
    (record,) = lines(path)
    assert record["arguments"] == ({"v": nested} if kept else None)
    assert ("arguments_omitted" in record) is not kept


async def test_lone_surrogates_still_give_valid_json(tmp_path: Path) -> None:
    runtime, path = audited(tmp_path)
    await runtime.execute(make_input("echo", {"s": "a\ud800b"}))
    (record,) = lines(path)
    assert record["arguments"] == {"s": "a\ud800b"}


def test_file_is_created_private_and_appended_to(tmp_path: Path) -> None:
    path = tmp_path / "audit.jsonl"
    path.write_text('{"old": true}\n', encoding="utf-8")
    path.chmod(0o600)
    log = AuditLog(path)
    log.write(b'{"new": true}\n')
    log.close()
    assert path.read_text(encoding="utf-8") == '{"old": true}\n{"new": true}\n'
    fresh = tmp_path / "fresh.jsonl"
    log = AuditLog(fresh)
    assert not fresh.exists()  # nothing is created before the first line
    log.write(b"{}\n")
    log.close()
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o600


async def test_closed_log_records_nothing_and_raises_nothing(tmp_path: Path) -> None:
    runtime, path = audited(tmp_path)
    log = runtime.plugins.get_plugin("audit-log")
    assert isinstance(log, AuditLog)
    log.close()
    log.close()
    assert not (await runtime.execute(make_input("echo"))).is_error
    assert not path.exists()


def test_path_in_a_missing_directory_is_a_config_error(tmp_path: Path) -> None:
    runtime = make_runtime()
    with pytest.raises(ConfigError, match="does not exist"):
        audit.dsh_setup(runtime, {"path": str(tmp_path / "missing-dir" / "audit.jsonl")})
    assert runtime.plugins.get_plugin("audit-log") is None


def test_a_directory_is_not_a_log_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not a writable file"):
        audit.dsh_setup(make_runtime(), {"path": str(tmp_path)})


async def test_a_file_that_cannot_be_opened_later_is_a_warning_not_a_failure(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "logs"
    directory.mkdir()
    runtime, _ = audited(directory)
    directory.rename(tmp_path / "moved")  # the directory vanished after setup
    with caplog.at_level(logging.WARNING, logger="dsh_plugins.audit"):
        assert not (await runtime.execute(make_input("echo"))).is_error
    assert "ENOENT" in caplog.text


async def test_reopen_after_rotation_writes_a_fresh_file(tmp_path: Path) -> None:
    runtime, path = audited(tmp_path)
    await runtime.execute(make_input("echo", call_id="before"))
    path.rename(tmp_path / "audit.jsonl.1")
    log = runtime.plugins.get_plugin("audit-log")
    assert isinstance(log, AuditLog)
    log.reopen()
    await runtime.execute(make_input("echo", call_id="after"))
    assert [r["call_id"] for r in lines(path)] == ["after"]
    assert [r["call_id"] for r in lines(tmp_path / "audit.jsonl.1")] == ["before"]


@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        ({"path": 3}, "expected a string"),
        ({"path": ""}, "non-empty"),
        ({"path": "audit\x00.jsonl"}, "[plugins.audit].path: must be a non-empty path without NUL characters"),
        ({"file": "x"}, 'unknown key "file"'),
    ],
)
def test_bad_config_is_refused(config: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigError, match=r"\[plugins\.audit\]") as caught:
        audit.dsh_setup(make_runtime(), config)
    assert fragment in str(caught.value)


def test_audit_is_opt_in_without_a_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    runtime = make_runtime()
    audit.dsh_setup(runtime, {})
    assert runtime.plugins.get_plugin("audit-log") is None
    assert list(tmp_path.iterdir()) == []


def test_relative_path_is_fixed_at_setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    runtime = make_runtime()
    audit.dsh_setup(runtime, {"path": "dsh-audit.jsonl"})
    log = runtime.plugins.get_plugin("audit-log")
    assert isinstance(log, AuditLog)
    monkeypatch.chdir(tmp_path.parent)  # a later chdir does not move the log
    log.write(b"{}\n")
    log.close()
    assert (tmp_path / "dsh-audit.jsonl").exists()


async def test_a_rewritten_call_records_what_ran_and_what_was_asked(tmp_path: Path) -> None:
    class Redirect:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Callable[[], Awaitable[Any]]) -> Any:
            decision = await next()
            if execution.arguments.get("path") == "old":
                return Rewrite({"path": "new"}, "moved")
            return decision

    runtime, path = audited(tmp_path)
    runtime.plugins.register(Redirect(), name="redirect")
    await runtime.execute(make_input("echo", {"path": "old"}, call_id="c1"))
    await runtime.execute(make_input("echo", {"path": "other"}, call_id="c2"))
    rewritten, plain = lines(path)
    assert rewritten["arguments"] == {"path": "new"}
    assert rewritten["rewrites"] == [{"by": "redirect", "reason": "moved", "from": {"path": "old"}, "to": {"path": "new"}}]
    assert list(plain) == FIELDS  # no rewrite, no extra field


async def test_a_rewrite_of_deep_arguments_keeps_what_ran_and_omits_only_the_deep_side(tmp_path: Path) -> None:
    """The deep "from" failed the line's encoding: what ran was dropped, the rewrites written as a repr string."""
    deep: Any = "leaf"
    for _ in range(5_000):
        deep = [deep]

    class Strip:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Callable[[], Awaitable[Any]]) -> Any:
            decision = await next()
            return Rewrite({"data": "stripped"}, "dropped the payload") if "deep" in execution.arguments else decision

    runtime, path = audited(tmp_path)
    runtime.plugins.register(Strip(), name="strip")
    await runtime.execute(make_input("echo", {"deep": deep}, call_id="c1"))
    (record,) = lines(path)
    assert record["arguments"] == {"data": "stripped"} and "arguments_omitted" not in record
    assert record["rewrites"] == [
        {"by": "strip", "reason": "dropped the payload", "from": None, "to": {"data": "stripped"},
         "from_omitted": "nested deeper than 200 levels"}
    ]  # fmt: skip


def sleeping(name: str, seconds: float, effects: list[str] | None = None) -> Any:
    async def body(args: Any) -> str:
        if effects is not None:
            effects.append(name)
        await trio.sleep(seconds)
        return "done"

    return json_tool(name, body, is_concurrency_safe=lambda args: True)


CUT_SHORT_MESSAGE = "cut short by trio.Cancelled from outside the call; it has no result"


async def test_a_call_the_hosts_scope_cuts_short_in_its_body_gets_a_cancelled_line(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    effects: list[str] = []
    runtime, path = audited(tmp_path, sleeping("send", 10, effects))
    with trio.move_on_after(1) as turn:  # the host's turn budget, not the call's signal
        await runtime.execute(make_input("send", {"to": "ceo"}, call_id="c1", agent=Agent("main")))
    assert turn.cancelled_caught and effects == ["send"]
    (record,) = lines(path)
    assert list(record) == [*FIELDS, "body_started"]
    assert record["call_id"] == "c1" and record["tool"] == "send" and record["agent"] == "main"
    assert record["arguments"] == {"to": "ceo"}
    assert (record["outcome"], record["error_code"], record["error_message"], record["plugin"]) == (
        "cancelled",
        None,
        CUT_SHORT_MESSAGE,
        None,
    )
    assert record["duration_ms"] == pytest.approx(1000)
    assert record["body_started"] is True


async def test_a_dispatch_cut_short_before_the_body_says_the_body_did_not_start(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    class SlowGate:
        @hookimpl
        async def dsh_execute(self, execution: Any, next: Callable[[], Awaitable[Any]]) -> Any:
            await trio.sleep(5)  # an inner wrapper still waiting (for a lock, a rate limit)
            return await next()

    runtime, path = audited(tmp_path, sleeping("send", 0))
    runtime.plugins.register(SlowGate(), name="slow-gate")
    with trio.move_on_after(2):
        await runtime.execute(make_input("send", call_id="c1"))
    (record,) = lines(path)
    assert (record["outcome"], record["body_started"]) == ("cancelled", False)
    assert record["duration_ms"] == pytest.approx(2000)


async def test_the_calls_own_signal_still_gives_its_aborted_result_line_and_no_other(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    runtime, path = audited(tmp_path, sleeping("send", 10))
    signal = CancelSignal()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(runtime.execute, make_input("send", call_id="c1", signal=signal))
        await trio.sleep(1)
        signal.cancel()
    (record,) = lines(path)
    assert (record["outcome"], record["error_code"], record["duration_ms"]) == ("error", "ABORTED", 1000.0)
    assert list(record) == FIELDS


async def test_a_turn_cut_short_records_the_calls_it_had_dispatched_and_none_it_had_not_begun(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    runtime, path = audited(tmp_path, sleeping("fast", 0), sleeping("slow", 10))
    calls = [make_input("fast", call_id="done"), make_input("slow", call_id="a"), make_input("slow", call_id="b")]
    calls += [make_input("slow", call_id="queued")]  # waits for one of the two slots: never begun
    with trio.move_on_after(1):
        await run_tool_calls(runtime, calls, max_parallel=2)
    done, *cut = [(record["call_id"], record["outcome"], record.get("body_started")) for record in lines(path)]
    assert done == ("done", "success", None)
    assert sorted(cut) == [("a", "cancelled", True), ("b", "cancelled", True)]  # in whichever order trio unwinds them


async def test_a_cancellation_an_outer_wrapper_turns_into_a_result_still_gives_one_line(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    class OwnDeadline:  # outside the audit wrapper, with a trio scope of its own instead of a signal
        @hookimpl(tryfirst=True)
        async def dsh_execute(self, execution: Any, next: Callable[[], Awaitable[Any]]) -> Any:
            with trio.move_on_after(1):
                return await next()
            return failure_result("too slow", "TOOL_TIMEOUT")

    runtime, path = audited(tmp_path, sleeping("send", 10))
    runtime.plugins.register(OwnDeadline(), name="own-deadline")
    result = await runtime.execute(make_input("send", call_id="c1"))
    assert result.is_error
    (record,) = lines(path)
    # The call has a result after all: the line records it, as for any other call.
    assert (record["call_id"], record["outcome"], record["error_code"]) == ("c1", "error", "TOOL_TIMEOUT")
    assert record["duration_ms"] == pytest.approx(1000) and list(record) == FIELDS


class AskFirst:
    @hookimpl
    async def dsh_pre_execute(self, execution: ToolExecution, next: Callable[[], Awaitable[Any]]) -> Any:
        return Ask("send it?")


class NoAnswer:
    async def request(self, execution: ToolExecution, reason: str | None) -> str:
        await trio.sleep_forever()
        raise AssertionError("unreachable")


class SlowPost:
    @hookimpl
    async def dsh_post_execute(self, execution: ToolExecution, result: Any, next: Callable[[], Awaitable[Any]]) -> Any:
        await trio.sleep(5)  # reports the result to a slow service
        return await next()


async def test_a_call_cut_while_its_approval_waits_gets_a_cancelled_line_without_dispatch_time(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    effects: list[str] = []
    runtime, path = audited(tmp_path, sleeping("send", 0, effects))
    runtime.plugins.register(AskFirst(), name="ask")
    runtime.approval = NoAnswer()
    with trio.move_on_after(1) as turn:
        await runtime.execute(make_input("send", {"to": "ceo"}, call_id="c1", agent=Agent("main")))
    assert turn.cancelled_caught and effects == []
    (record,) = lines(path)
    assert (record["call_id"], record["outcome"], record["error_message"]) == ("c1", "cancelled", CUT_SHORT_MESSAGE)
    assert (record["duration_ms"], record["body_started"]) == (None, False)
    assert record["arguments"] == {"to": "ceo"}


async def test_a_call_cut_in_a_post_execute_listener_gets_a_cancelled_line_with_its_dispatch_time(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    runtime, path = audited(tmp_path, sleeping("send", 2))
    runtime.plugins.register(SlowPost(), name="slow-post")
    with trio.move_on_after(3) as turn:  # the body took 2 s; post-execute is still reporting
        await runtime.execute(make_input("send", call_id="c1"))
    assert turn.cancelled_caught
    (record,) = lines(path)
    assert (record["outcome"], record["body_started"]) == ("cancelled", True)
    assert record["duration_ms"] == pytest.approx(2000)


async def test_a_call_cut_while_it_waits_to_be_committed_in_a_turn_gets_a_cancelled_line(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    runtime, path = audited(tmp_path, sleeping("slow", 10), sleeping("quick", 0.5))
    with trio.move_on_after(1):
        await run_tool_calls(runtime, [make_input("slow", call_id="slow"), make_input("quick", call_id="quick")])
    cut = {record["call_id"]: (record["outcome"], record["body_started"], record["duration_ms"]) for record in lines(path)}
    # "quick" ran to its end and waited to be committed in model order behind "slow".
    assert cut == {"slow": ("cancelled", True, pytest.approx(1000)), "quick": ("cancelled", True, pytest.approx(500))}


async def test_the_host_cutting_a_call_whose_own_signal_fired_still_gets_one_line(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    runtime, path = audited(tmp_path, sleeping("send", 10))
    signal = CancelSignal()
    with trio.CancelScope() as turn:

        async def cut_both() -> None:
            await trio.sleep(1)
            signal.cancel()  # the user pressed stop...
            turn.cancel()  # ...as the host gave up on the turn: trio hands the Cancelled to the host's scope

        async with trio.open_nursery() as nursery:
            nursery.start_soon(cut_both)
            await runtime.execute(make_input("send", call_id="c1", signal=signal))
    (record,) = lines(path)
    assert (record["outcome"], record["body_started"]) == ("cancelled", True)


async def test_a_call_cut_while_a_slower_observer_runs_first_gets_a_cancelled_line(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    class Shipper:  # registered after the audit log, so its observer runs first
        @hookimpl
        async def dsh_result(self, execution: ToolExecution, result: ToolExecutionResult) -> None:
            await trio.sleep(5)

    runtime, path = audited(tmp_path, sleeping("send", 0))
    runtime.plugins.register(Shipper(), name="shipper")
    with trio.move_on_after(1):
        await runtime.execute(make_input("send", call_id="c1"))
    (record,) = lines(path)
    assert (record["call_id"], record["outcome"], record["body_started"]) == ("c1", "cancelled", True)


async def test_a_keyboard_interrupt_after_the_dispatch_gets_a_line_and_still_propagates(tmp_path: Path) -> None:
    class Interrupted:
        @hookimpl
        async def dsh_post_execute(self, execution: Any, result: Any, next: Callable[[], Awaitable[Any]]) -> Any:
            raise KeyboardInterrupt  # Ctrl-C lands in a post-execute listener

    runtime, path = audited(tmp_path)
    runtime.plugins.register(Interrupted(), name="interrupted")
    with pytest.raises(KeyboardInterrupt):
        await runtime.execute(make_input("echo", call_id="c1"))
    (record,) = lines(path)
    assert (record["outcome"], record["body_started"]) == ("cancelled", True)
    assert record["error_message"] == "cut short by KeyboardInterrupt from outside the call; it has no result"


async def test_a_line_that_cannot_be_built_does_not_stop_the_cancellation(
    tmp_path: Path,
    autojump_clock: trio.testing.MockClock,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("clock broke")

    monkeypatch.setattr(audit, "_cut_short_record", broken)
    runtime, path = audited(tmp_path, sleeping("send", 10))
    with trio.move_on_after(1) as turn:
        await runtime.execute(make_input("send", call_id="c1"))
    assert turn.cancelled_caught  # the host's Cancelled reached its scope, not an error in its place
    assert not path.exists()
    assert "cannot record call c1 cut short: clock broke" in caplog.text


def strict_lines(path: Path) -> list[dict[str, Any]]:
    """Every line of the file parsed, a blank one included: what a strict JSONL reader does."""
    raw = path.read_bytes()
    assert raw.endswith(b"\n")
    return [json.loads(line) for line in raw.decode("utf-8").split("\n")[:-1]]


async def test_a_write_refused_whole_leaves_no_blank_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk that took no byte of a record left no partial line: the next record needs no newline first."""
    runtime, path = audited(tmp_path)
    log = runtime.plugins.get_plugin("audit-log")
    assert isinstance(log, AuditLog)
    await runtime.execute(make_input("echo", call_id="before"))
    attempted = failing_write(monkeypatch, log, errno.ENOSPC)
    await runtime.execute(make_input("echo", call_id="lost"))
    await runtime.execute(make_input("echo", call_id="lost too"))
    monkeypatch.undo()
    assert len(attempted) == 2 and all(not line.startswith(b"\n") for line in attempted)
    await runtime.execute(make_input("echo", call_id="after"))
    assert [record["call_id"] for record in strict_lines(path)] == ["before", "after"]


async def test_a_file_that_could_not_be_opened_gets_no_blank_first_line(tmp_path: Path) -> None:
    directory = tmp_path / "logs"
    directory.mkdir()
    runtime, path = audited(directory)
    directory.rmdir()  # the file cannot be created for a while (a rotation moved the directory away)
    await runtime.execute(make_input("echo", call_id="lost"))
    directory.mkdir()
    await runtime.execute(make_input("echo", call_id="after"))
    assert [record["call_id"] for record in strict_lines(path)] == ["after"]


async def test_a_partial_line_stays_to_be_ended_after_a_write_refused_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime, path = audited(tmp_path)
    log = runtime.plugins.get_plugin("audit-log")
    assert isinstance(log, AuditLog)
    real_write = os.write
    calls = 0

    def short_then_full_disk(fd: int, data: Any) -> int:
        nonlocal calls
        if fd != log._fd:
            return real_write(fd, data)
        calls += 1
        if calls == 1:
            return real_write(fd, bytes(data)[:10])  # a short write...
        raise OSError(errno.ENOSPC, "No space left on device")  # ...then the disk is full, for two records

    monkeypatch.setattr(os, "write", short_then_full_disk)
    await runtime.execute(make_input("echo", call_id="cut"))
    await runtime.execute(make_input("echo", call_id="lost"))
    monkeypatch.undo()
    await runtime.execute(make_input("echo", call_id="whole"))
    raw = path.read_bytes().split(b"\n")
    assert len(raw) == 3 and raw[2] == b"" and len(raw[0]) == 10
    assert json.loads(raw[1])["call_id"] == "whole"


async def test_a_write_that_only_ended_the_partial_line_leaves_no_blank_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "audit.jsonl"
    path.write_bytes(b'{"call_id": "old"}\n{"call_id": "torn"')  # a writer died mid-line
    runtime, _ = audited(tmp_path)
    log = runtime.plugins.get_plugin("audit-log")
    assert isinstance(log, AuditLog)
    real_write = os.write

    def newline_then_full_disk(fd: int, data: Any) -> int:
        if fd != log._fd:
            return real_write(fd, data)
        if bytes(data).startswith(b"\n"):
            return real_write(fd, b"\n")  # only the newline ending the torn line fits...
        raise OSError(errno.ENOSPC, "No space left on device")  # ...then the disk is full

    monkeypatch.setattr(os, "write", newline_then_full_disk)
    await runtime.execute(make_input("echo", call_id="lost"))
    monkeypatch.undo()
    await runtime.execute(make_input("echo", call_id="after"))
    assert path.read_bytes().split(b"\n")[:2] == [b'{"call_id": "old"}', b'{"call_id": "torn"']
    assert [json.loads(line)["call_id"] for line in path.read_bytes().split(b"\n")[2:-1]] == ["after"]


def test_an_audit_path_that_is_a_fifo_is_refused_at_setup(tmp_path: Path) -> None:
    """Its first record's open blocked the whole host until something read the FIFO (s20 logs audit)."""
    fifo = tmp_path / "audit.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(ConfigError, match="is not a regular file"):
        AuditLog(fifo)


async def test_a_fifo_put_in_place_later_costs_a_warning_not_a_hang(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    runtime, path = audited(tmp_path, json_tool("echo"))
    os.mkfifo(path)  # before the first record opens the file: the model's bash could
    with caplog.at_level(logging.WARNING, logger="dsh_core"):
        result = await runtime.execute(make_input("echo", {"x": 1}))
    assert not result.is_error
    assert any("cannot write" in record.getMessage() for record in caplog.records), caplog.text


def test_an_audit_path_another_record_keeps_is_refused(tmp_path: Path) -> None:
    """Pointed at the session log (or the ledger), it wrote lines that made that file unreadable."""
    from dsh_plugins import ledger

    runtime = make_runtime()
    runtime.kept_files.add(tmp_path / "session.jsonl", "the session log")
    with pytest.raises(ConfigError, match="is the session log; the audit log needs a file of its own"):
        audit.dsh_setup(runtime, {"path": str(tmp_path / "session.jsonl")})
    audit.dsh_setup(runtime, {"path": str(tmp_path / "audit.jsonl")})
    with pytest.raises(ConfigError, match="is the audit log; the effect ledger needs a file of its own"):
        ledger.dsh_setup(runtime, {"path": str(tmp_path / "audit.jsonl")})


async def test_c1_controls_and_bidi_overrides_are_escaped_in_the_file(tmp_path: Path) -> None:
    """Written raw, a model's CSI cleared the screen of whoever ran tail -f on the log (s20 logs audit)."""
    runtime, path = audited(tmp_path, json_tool("echo"))
    hostile = "\u009b2J\u009b1;31mAPPROVED \u202etxt.exe \u0085 Grüße 日本"
    await runtime.execute(make_input("echo", {"x": hostile}))
    raw = path.read_bytes()
    assert "\u009b".encode() not in raw and "\u202e".encode() not in raw and "\u0085".encode() not in raw
    assert "Grüße 日本".encode() in raw  # printable text stays as it is
    assert lines(path)[0]["arguments"] == {"x": hostile}


@pytest.mark.parametrize("how", ["moved", "deleted", "replaced"])
async def test_records_follow_the_path_once_the_file_is_rotated_or_deleted(
    tmp_path: Path, how: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """They went on into the rotated file, or into a deleted one, lost, without a word (s20 logs audit)."""
    monkeypatch.setattr(audit, "_PATH_CHECK_SECONDS", 0.0)
    runtime, path = audited(tmp_path, json_tool("echo"))
    await runtime.execute(make_input("echo", {"n": 1}, call_id="before"))
    if how == "moved":
        path.rename(tmp_path / "audit.jsonl.1")
    elif how == "deleted":
        path.unlink()
    else:
        path.rename(tmp_path / "audit.jsonl.1")
        path.write_text("")
    with caplog.at_level(logging.WARNING):
        await runtime.execute(make_input("echo", {"n": 2}, call_id="after"))
    assert [line["call_id"] for line in lines(path)] == ["after"]
    assert "writing to a new file at that path" in caplog.text
    if how != "deleted":
        assert [line["call_id"] for line in lines(tmp_path / "audit.jsonl.1")] == ["before"]
