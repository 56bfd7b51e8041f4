"""The effect ledger (dsh_plugins.ledger): each call id resolves once, across crashes and resumes."""

from __future__ import annotations

import errno
import gzip
import json
import logging
import shutil
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from dsh_core import (
    Agent,
    CancelSignal,
    ConfigError,
    Deny,
    DshError,
    RetryPolicy,
    Rewrite,
    ToolDispatchExecution,
    ToolEffects,
    ToolExecution,
    ToolExecutionFailure,
    ToolExecutionResult,
    ToolExecutionSuccess,
    ToolNotFoundError,
    ToolRuntime,
    TransientToolError,
    contract_fingerprint,
    define_tool,
    failure_result,
    hookimpl,
    read_session_log,
    run_tool_calls,
)
from dsh_core.code_mode import CodeRunResult
from dsh_core.testing import FakeCodeRuntime, json_tool, make_input, make_runtime
from dsh_plugins import ledger as ledger_plugin
from dsh_plugins import limits, timeout
from dsh_plugins.ledger import EFFECT_IN_DOUBT, IDEMPOTENCY_CONFLICT, EffectLedger, LedgerError, read_ledger

Next = Callable[[], Awaitable[ToolExecutionResult]]

_OPENED: list[EffectLedger] = []


def open_ledger(path: Path, **options: Any) -> EffectLedger:
    ledger = EffectLedger(path, **options)
    _OPENED.append(ledger)
    return ledger


@pytest.fixture(autouse=True)
def _close_ledgers() -> Any:
    yield
    while _OPENED:
        _OPENED.pop().close()


class Effects:
    """A tool with an observable side effect: every run of its body is counted."""

    def __init__(self) -> None:
        self.runs: list[Any] = []

    def tool(self, name: str = "send", *, fail: bool = False, **options: Any) -> Any:
        async def body(args: Any) -> Any:
            self.runs.append(args)
            if fail:
                raise RuntimeError("the mail server said no")
            return {"sent": args["to"], "n": len(self.runs)}

        return json_tool(name, body, **options)


def code(result: ToolExecutionResult) -> str | None:
    assert isinstance(result, ToolExecutionFailure), result
    return result.error.info.code if result.error.info else None


def message(result: ToolExecutionResult) -> str:
    assert isinstance(result, ToolExecutionFailure), result
    return result.error.message


def with_ledger(path: Path, *tools: Any, **options: Any) -> tuple[ToolRuntime, EffectLedger]:
    runtime = make_runtime(*tools)
    ledger = open_ledger(path, runtime=runtime, **options)
    runtime.plugins.register(ledger, name=ledger_plugin.PLUGIN_NAME)
    return runtime, ledger


def events(path: Path) -> list[tuple[str, dict[str, Any]]]:
    return [(event.type, dict(event.data)) for event in read_session_log(path).events]


def snapshot_during_body(source: Path, copy: Path, effects: Effects, name: str = "send") -> Any:
    """A tool whose body copies the ledger file while it runs: the disk as a crash would leave it."""

    async def body(args: Any) -> Any:
        effects.runs.append(args)
        shutil.copyfile(source, copy)
        return {"sent": args["to"], "n": len(effects.runs)}

    return json_tool(name, body)


async def crash_during_c1(tmp_path: Path, effects: Effects) -> Path:
    """Run call ``c1`` (send to ann) and return the ledger as a crash during its body would leave it."""
    path, crashed = tmp_path / "effects.jsonl", tmp_path / "crashed.jsonl"
    runtime, ledger = with_ledger(path, snapshot_during_body(path, crashed, effects))
    await runtime.execute(make_input("send", {"to": "ann"}, call_id="c1"))
    ledger.close()
    return crashed


# --- recording and replaying ----------------------------------------------------------------


async def test_a_call_is_recorded_started_then_committed_before_the_result_returns(tmp_path: Path) -> None:
    effects = Effects()
    tool = effects.tool()
    runtime, ledger = with_ledger(tmp_path / "effects.jsonl", tool)
    result = await runtime.execute(make_input("send", {"to": "ann"}, call_id="c1"))
    assert isinstance(result, ToolExecutionSuccess) and result.value == {"sent": "ann", "n": 1}
    (started_type, started), (committed_type, committed) = events(tmp_path / "effects.jsonl")
    assert (started_type, committed_type) == ("effect/started", "effect/committed")
    assert started["key"] == "c1" and started["tool"] == "send" and started["agent"] is None
    assert started["contract"] == contract_fingerprint(tool)
    assert started["arguments"].startswith("sha256:")
    assert committed == {"key": "c1", "agent": None, "value": {"sent": "ann", "n": 1}}
    (entry,) = ledger.entries()
    assert entry.state == "committed" and not entry.in_doubt


async def test_a_resumed_call_returns_the_recorded_value_without_running_the_body(tmp_path: Path) -> None:
    effects = Effects()
    path = tmp_path / "effects.jsonl"
    runtime, ledger = with_ledger(path, effects.tool())
    first = await runtime.execute(make_input("send", {"to": "ann"}, call_id="c1"))
    ledger.close()

    # A new process: a fresh runtime and ledger over the same file.
    resumed, _ = with_ledger(path, effects.tool())
    again = await resumed.execute(make_input("send", {"to": "ann"}, call_id="c1"))
    assert len(effects.runs) == 1
    assert isinstance(again, ToolExecutionSuccess)
    assert again.value == first.value and again.content == first.content  # re-rendered the same way
    other = await resumed.execute(make_input("send", {"to": "bob"}, call_id="c2"))
    assert isinstance(other, ToolExecutionSuccess) and len(effects.runs) == 2


async def test_a_recorded_failure_is_returned_again_and_the_body_not_rerun(tmp_path: Path) -> None:
    effects = Effects()
    runtime, _ = with_ledger(tmp_path / "effects.jsonl", effects.tool(fail=True))
    first = await runtime.execute(make_input("send", {"to": "ann"}, call_id="c1"))
    second = await runtime.execute(make_input("send", {"to": "ann"}, call_id="c1"))
    assert code(first) == code(second) == "TOOL_ERROR"
    assert message(second) == message(first)
    assert second.content == first.content
    assert len(effects.runs) == 1
    assert [kind for kind, _ in events(tmp_path / "effects.jsonl")] == ["effect/started", "effect/failed"]


async def test_a_replayed_value_goes_through_the_current_output_contract(tmp_path: Path) -> None:
    path = tmp_path / "effects.jsonl"
    runtime, ledger = with_ledger(path, json_tool("count", output={"type": "json"}))
    await runtime.execute(make_input("count", {"to": "x"}, call_id="c1"))
    ledger.close()
    # The tool now promises an integer; the recorded object no longer fits.
    changed, _ = with_ledger(path, json_tool("count", output={"type": "integer"}))
    result = await changed.execute(make_input("count", {"to": "x"}, call_id="c1"))
    assert code(result) == "INVALID_TOOL_OUTPUT"


async def test_policy_still_decides_a_replayed_call(tmp_path: Path) -> None:
    class DenySend:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
            return Deny("sending is off now") if execution.name == "send" else await next()

    effects = Effects()
    path = tmp_path / "effects.jsonl"
    runtime, ledger = with_ledger(path, effects.tool())
    await runtime.execute(make_input("send", {"to": "ann"}, call_id="c1"))
    ledger.close()
    resumed, _ = with_ledger(path, effects.tool())
    resumed.plugins.register(DenySend(), name="deny-send")
    result = await resumed.execute(make_input("send", {"to": "ann"}, call_id="c1"))
    assert code(result) == "DENIED"
    assert "ann" not in json.dumps([block.text for block in result.content])  # the recorded value stays hidden


async def test_a_denied_call_leaves_nothing_in_the_ledger(tmp_path: Path) -> None:
    class DenyAll:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
            return Deny("no")

    runtime, ledger = with_ledger(tmp_path / "effects.jsonl", Effects().tool())
    runtime.plugins.register(DenyAll(), name="deny-all")
    await runtime.execute(make_input("send", {"to": "ann"}, call_id="c1"))
    assert ledger.entries() == ()
    assert events(tmp_path / "effects.jsonl") == []


async def test_keys_are_per_agent(tmp_path: Path) -> None:
    effects = Effects()
    runtime, ledger = with_ledger(tmp_path / "effects.jsonl", effects.tool())
    await runtime.execute(make_input("send", {"to": "ann"}, call_id="c1", agent=Agent("main")))
    await runtime.execute(make_input("send", {"to": "ann"}, call_id="c1", agent=Agent("helper")))
    await runtime.execute(make_input("send", {"to": "ann"}, call_id="c1", agent=Agent("main")))
    assert len(effects.runs) == 2
    assert {entry.agent for entry in ledger.entries()} == {"main", "helper"}
    assert ledger.get("c1", "helper") is not None and ledger.get("c1") is None


# --- conflicts ------------------------------------------------------------------------------


async def test_a_call_id_reused_with_other_arguments_is_a_conflict(tmp_path: Path) -> None:
    effects = Effects()
    runtime, _ = with_ledger(tmp_path / "effects.jsonl", effects.tool(), Effects().tool("other"))
    await runtime.execute(make_input("send", {"to": "ann"}, call_id="c1"))
    other_args = await runtime.execute(make_input("send", {"to": "bob"}, call_id="c1"))
    other_tool = await runtime.execute(make_input("other", {"to": "ann"}, call_id="c1"))
    assert code(other_args) == code(other_tool) == IDEMPOTENCY_CONFLICT
    assert "used for a call of 'send' with other arguments;" in message(other_args)
    assert "used for a call of 'send', not 'other';" in message(other_tool)
    assert isinstance(other_args, ToolExecutionFailure) and other_args.error.info is not None
    assert other_args.error.info.plugin == "effect-ledger"
    assert len(effects.runs) == 1


async def test_argument_key_order_does_not_make_a_conflict(tmp_path: Path) -> None:
    effects = Effects()
    runtime, _ = with_ledger(tmp_path / "effects.jsonl", effects.tool())
    await runtime.execute(make_input("send", {"to": "ann", "cc": 1.0}, call_id="c1"))
    again = await runtime.execute(make_input("send", {"cc": 1, "to": "ann"}, call_id="c1"))
    assert isinstance(again, ToolExecutionSuccess) and len(effects.runs) == 1


# --- in doubt -------------------------------------------------------------------------------


async def test_a_call_that_died_running_is_in_doubt_and_not_run_again(tmp_path: Path) -> None:
    effects = Effects()
    crashed = await crash_during_c1(tmp_path, effects)

    resumed, ledger = with_ledger(crashed, effects.tool())
    (entry,) = ledger.in_doubt()
    assert entry.key == "c1" and entry.state == "started"
    result = await resumed.execute(make_input("send", {"to": "ann"}, call_id="c1"))
    assert code(result) == EFFECT_IN_DOUBT
    assert "may or may not have happened" in message(result) and "'send'" in message(result)
    assert len(effects.runs) == 1  # only the run before the "crash"


async def test_rerun_in_doubt_runs_a_listed_tool_again(tmp_path: Path) -> None:
    effects = Effects()
    crashed = await crash_during_c1(tmp_path, effects)
    resumed, ledger = with_ledger(crashed, effects.tool(), rerun_in_doubt=["send"])
    result = await resumed.execute(make_input("send", {"to": "ann"}, call_id="c1"))
    assert isinstance(result, ToolExecutionSuccess) and len(effects.runs) == 2
    assert ledger.get("c1") is not None and ledger.get("c1").state == "committed"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("declared", "reruns"),
    [
        (ToolEffects(read_only=True), True),
        (ToolEffects(idempotent=True), True),
        (ToolEffects(destructive=True, open_world=True), False),
        (None, False),
    ],
)
async def test_a_tool_declared_safe_to_rerun_is_run_again_when_in_doubt(
    tmp_path: Path, declared: ToolEffects | None, reruns: bool
) -> None:
    effects = Effects()
    crashed = await crash_during_c1(tmp_path, effects)
    resumed, _ = with_ledger(crashed, effects.tool(effects=declared))
    result = await resumed.execute(make_input("send", {"to": "ann"}, call_id="c1"))
    if reruns:
        assert isinstance(result, ToolExecutionSuccess) and len(effects.runs) == 2
    else:
        assert code(result) == EFFECT_IN_DOUBT and len(effects.runs) == 1


async def test_resolve_records_that_the_effect_happened(tmp_path: Path) -> None:
    effects = Effects()
    crashed = await crash_during_c1(tmp_path, effects)
    resumed, ledger = with_ledger(crashed, effects.tool())
    settled = ledger.resolve("c1", {"sent": "ann", "n": 1})
    assert settled.state == "committed"
    result = await resumed.execute(make_input("send", {"to": "ann"}, call_id="c1"))
    assert isinstance(result, ToolExecutionSuccess) and result.value == {"sent": "ann", "n": 1}
    assert len(effects.runs) == 1
    with pytest.raises(LedgerError, match="is committed, not in doubt"):
        ledger.resolve("c1", 1)
    with pytest.raises(LedgerError, match=r"no call 'nope' without an agent$"):
        ledger.forget("nope")
    ledger.close()
    reopened = open_ledger(crashed)  # the settlement is in the file, not only in memory
    assert reopened.get("c1").state == "committed"  # type: ignore[union-attr]


async def test_forget_records_that_the_effect_did_not_happen(tmp_path: Path) -> None:
    effects = Effects()
    crashed = await crash_during_c1(tmp_path, effects)
    resumed, ledger = with_ledger(crashed, effects.tool())
    ledger.forget("c1")
    assert ledger.get("c1") is None
    result = await resumed.execute(make_input("send", {"to": "ann"}, call_id="c1"))
    assert isinstance(result, ToolExecutionSuccess) and len(effects.runs) == 2


async def test_a_timed_out_call_is_in_doubt(tmp_path: Path, autojump_clock: trio.testing.MockClock) -> None:
    effects = Effects()

    async def slow(args: Any) -> Any:
        effects.runs.append(args)
        await trio.sleep(10)
        return {}

    runtime, ledger = with_ledger(tmp_path / "effects.jsonl", json_tool("slow", slow, timeout_ms=100))
    timeout.dsh_setup(runtime, {})
    first = await runtime.execute(make_input("slow", {}, call_id="c1"))
    assert code(first) == "TOOL_TIMEOUT"
    entry = ledger.get("c1")
    assert entry is not None and entry.state == "interrupted" and entry.in_doubt
    assert entry.error_code == "TOOL_TIMEOUT"
    second = await runtime.execute(make_input("slow", {}, call_id="c1"))
    assert code(second) == EFFECT_IN_DOUBT and "cut short (TOOL_TIMEOUT" in message(second)
    assert len(effects.runs) == 1


async def test_a_call_cancelled_while_its_body_runs_is_in_doubt(tmp_path: Path) -> None:
    started = trio.Event()

    async def waits(args: Any) -> Any:
        started.set()
        await trio.sleep_forever()

    runtime, ledger = with_ledger(tmp_path / "effects.jsonl", json_tool("waits", waits))
    signal = CancelSignal()
    results: list[ToolExecutionResult] = []
    async with trio.open_nursery() as nursery:

        async def call() -> None:
            results.append(await runtime.execute(make_input("waits", {}, call_id="c1", signal=signal)))

        nursery.start_soon(call)
        await started.wait()
        signal.cancel()
    assert code(results[0]) == "ABORTED"
    assert ledger.get("c1").state == "interrupted"  # type: ignore[union-attr]


async def test_a_cancellation_that_unwinds_through_the_ledger_is_recorded_as_one(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """trio's text named its task objects and their addresses, which the model then read on a repeat."""

    async def flaky(args: Any) -> Any:
        raise TransientToolError("busy")

    tool = json_tool("flaky", flaky, retry=RetryPolicy(max_attempts=5, initial_delay_s=1, jitter=0))
    runtime, ledger = with_ledger(tmp_path / "effects.jsonl", tool, fsync="close")
    timeout.dsh_setup(runtime, {"default_ms": 60_000})
    signal = CancelSignal()
    async with trio.open_nursery() as nursery:

        async def stop() -> None:
            await trio.sleep(1.5)  # in the retry's pause
            signal.cancel("user stop")

        nursery.start_soon(stop)
        first = await runtime.execute(make_input("flaky", {}, call_id="c1", signal=signal))
    assert code(first) == "ABORTED"
    entry = ledger.get("c1")
    assert entry is not None and entry.state == "interrupted"
    assert (entry.error_code, entry.error_message) == (None, "cancelled while its body ran")
    again = await runtime.execute(make_input("flaky", {}, call_id="c1"))
    assert "was cut short (no code: cancelled while its body ran)" in message(again)


async def test_a_call_stopped_before_its_body_releases_the_key(tmp_path: Path) -> None:
    class StopsFirst:
        def __init__(self) -> None:
            self.on = True

        @hookimpl
        async def dsh_execute(self, execution: ToolDispatchExecution, next: Next) -> ToolExecutionResult:
            if self.on:
                return failure_result("tool call aborted before dispatch", "ABORTED_BEFORE_DISPATCH")
            return await next()

    effects = Effects()
    runtime, ledger = with_ledger(tmp_path / "effects.jsonl", effects.tool())
    stops = StopsFirst()
    runtime.plugins.register(stops, name="stops-first")
    first = await runtime.execute(make_input("send", {"to": "ann"}, call_id="c1"))
    assert code(first) == "ABORTED_BEFORE_DISPATCH" and ledger.entries() == ()
    stops.on = False
    second = await runtime.execute(make_input("send", {"to": "ann"}, call_id="c1"))
    assert isinstance(second, ToolExecutionSuccess) and len(effects.runs) == 1
    kinds = [kind for kind, _ in events(tmp_path / "effects.jsonl")]
    assert kinds == ["effect/started", "effect/released", "effect/started", "effect/committed"]


@pytest.mark.parametrize("error", [ToolNotFoundError("other"), DshError("gone", code="ABORTED_BEFORE_DISPATCH")])
async def test_a_body_that_did_its_work_then_raised_a_not_dispatched_code_is_recorded_failed(
    tmp_path: Path, error: DshError
) -> None:
    """Only a call whose body never ran releases its key: a body's own error code says nothing about that."""
    runs: list[Any] = []

    async def body(args: Any) -> Any:
        runs.append(args)  # the effect
        raise error

    runtime, ledger = with_ledger(tmp_path / "effects.jsonl", json_tool("send", body))
    for _ in range(3):
        await runtime.execute(make_input("send", {"to": "ann"}, call_id="c1"))
    assert len(runs) == 1
    assert ledger.get("c1").state == "failed"  # type: ignore[union-attr]


async def test_a_body_that_finished_as_the_caller_cancelled_is_committed(tmp_path: Path) -> None:
    """The body's work completed; the caller's signal made the call ABORTED: the ledger records the effect."""
    signal = CancelSignal()
    runs: list[Any] = []

    async def body(args: Any) -> Any:
        runs.append(args)
        with trio.CancelScope(shield=True):
            signal.cancel()  # the user presses stop as the work finishes
            await trio.lowlevel.checkpoint()
        return {"sent": args["to"]}

    runtime, ledger = with_ledger(tmp_path / "effects.jsonl", json_tool("send", body))
    first = await runtime.execute(make_input("send", {"to": "ann"}, call_id="c1", signal=signal))
    assert code(first) == "ABORTED"
    entry = ledger.get("c1")
    assert entry is not None and entry.state == "committed" and entry.value == {"sent": "ann"}
    again = await runtime.execute(make_input("send", {"to": "ann"}, call_id="c1"))
    assert isinstance(again, ToolExecutionSuccess) and again.value == {"sent": "ann"}
    assert len(runs) == 1


class AwaitsAfterTheBody:
    """An ordinary inner wrapper that awaits once more after ``next()`` (flushing a metric, say)."""

    @hookimpl(trylast=True)
    async def dsh_execute(self, execution: ToolDispatchExecution, next: Next) -> ToolExecutionResult:
        result = await next()
        await trio.sleep(0)
        return result


async def test_a_body_that_finished_as_the_callers_scope_was_cancelled_is_committed(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """The caller's own cancel scope fires while a shielded body finishes: the cancellation leaves the
    wrappers as an exception, not as an ABORTED result, and the effect is still recorded once."""
    runs: list[Any] = []

    async def body(args: Any) -> Any:
        with trio.CancelScope(shield=True):
            await trio.sleep(2)
            runs.append(args)
        return {"sent": args["to"]}

    # Not synced: the virtual clock would jump to the deadline while a worker thread synced the start.
    runtime, ledger = with_ledger(tmp_path / "effects.jsonl", json_tool("send", body), fsync="close")
    runtime.plugins.register(AwaitsAfterTheBody(), name="awaits-after")
    with trio.move_on_after(1) as scope:
        await runtime.execute(make_input("send", {"to": "ann"}, call_id="c1"))
    assert scope.cancelled_caught
    entry = ledger.get("c1")
    assert entry is not None and entry.state == "committed" and entry.value == {"sent": "ann"}
    again = await runtime.execute(make_input("send", {"to": "ann"}, call_id="c1"))
    assert isinstance(again, ToolExecutionSuccess) and again.value == {"sent": "ann"}
    assert len(runs) == 1


async def test_an_inner_wrapper_that_raises_before_the_body_returns_leaves_the_call_in_doubt(
    tmp_path: Path,
) -> None:
    class Breaks:
        @hookimpl
        async def dsh_execute(self, execution: ToolDispatchExecution, next: Next) -> ToolExecutionResult:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(next)
                await trio.sleep(0)
                raise RuntimeError("broke while the body ran")

    started: list[Any] = []

    async def body(args: Any) -> Any:
        started.append(args)
        await trio.sleep(1)
        return {"sent": args["to"]}

    runtime, ledger = with_ledger(tmp_path / "effects.jsonl", json_tool("send", body))
    runtime.plugins.register(Breaks(), name="breaks")
    result = await runtime.execute(make_input("send", {"to": "ann"}, call_id="c1"))
    assert code(result) == "POLICY_ERROR"
    entry = ledger.get("c1")
    assert entry is not None and entry.state == "interrupted" and entry.in_doubt  # stopped part-way
    assert len(started) == 1


async def test_an_inner_wrapper_that_raises_after_the_body_returned_commits_the_call(tmp_path: Path) -> None:
    class Breaks:
        @hookimpl
        async def dsh_execute(self, execution: ToolDispatchExecution, next: Next) -> ToolExecutionResult:
            await next()
            raise RuntimeError("broke after the body")

    effects = Effects()
    runtime, ledger = with_ledger(tmp_path / "effects.jsonl", effects.tool())
    runtime.plugins.register(Breaks(), name="breaks")
    result = await runtime.execute(make_input("send", {"to": "ann"}, call_id="c1"))
    assert code(result) == "POLICY_ERROR"
    entry = ledger.get("c1")
    # The body's work happened, once: a later call with this id gets its value, not EFFECT_IN_DOUBT.
    assert entry is not None and entry.state == "committed" and entry.value == {"sent": "ann", "n": 1}
    assert len(effects.runs) == 1


async def test_a_call_an_inner_wrapper_refused_before_the_body_releases_the_key(tmp_path: Path) -> None:
    """call-limits refusing the loser of a race at dispatch: nothing ran, so the call id is free again."""
    effects = Effects()
    runtime = make_runtime(
        effects.tool(is_concurrency_safe=lambda arguments: True), plugins=[(limits, {"max_calls": 1})]
    )
    ledger = open_ledger(tmp_path / "effects.jsonl", runtime=runtime)
    runtime.plugins.register(ledger, name=ledger_plugin.PLUGIN_NAME)
    calls = [make_input("send", {"to": to}, call_id=call_id) for call_id, to in (("c1", "ann"), ("c2", "bob"))]
    results = await run_tool_calls(runtime, calls, max_parallel=2)
    refused = [(call, result) for call, result in zip(calls, results, strict=True) if result.is_error]
    assert len(refused) == 1 and len(effects.runs) == 1
    call, result = refused[0]
    assert code(result) == "DENIED" and "call budget spent" in message(result)
    assert ledger.get(call.call_id) is None
    limits_plugin = runtime.plugins.get_plugin(limits.PLUGIN_NAME)
    assert isinstance(limits_plugin, limits.CallLimits)
    limits_plugin.reset()
    again = await runtime.execute(call)
    assert isinstance(again, ToolExecutionSuccess) and len(effects.runs) == 2
    assert ledger.get(call.call_id).state == "committed"  # type: ignore[union-attr]


async def test_a_call_an_inner_wrapper_raised_on_before_the_body_releases_the_key(tmp_path: Path) -> None:
    """The timeout policy refusing a tool's timeout_ms raises before the body: nothing is in doubt."""
    effects = Effects()
    runtime, ledger = with_ledger(tmp_path / "effects.jsonl", effects.tool(timeout_ms=3_000_000_000))
    timeout.dsh_setup(runtime, {})
    for _ in range(2):
        result = await runtime.execute(make_input("send", {"to": "ann"}, call_id="c1"))
        assert code(result) == "POLICY_ERROR" and "timeout" in message(result)
        assert ledger.entries() == ()
    assert effects.runs == []
    kinds = [kind for kind, _ in events(tmp_path / "effects.jsonl")]
    assert kinds == ["effect/started", "effect/released"] * 2


async def test_a_call_cancelled_in_an_inner_wrapper_before_the_body_releases_the_key(tmp_path: Path) -> None:
    class Waits:
        def __init__(self) -> None:
            self.entered = trio.Event()

        @hookimpl
        async def dsh_execute(self, execution: ToolDispatchExecution, next: Next) -> ToolExecutionResult:
            self.entered.set()
            await trio.sleep_forever()
            return await next()

    effects = Effects()
    runtime, ledger = with_ledger(tmp_path / "effects.jsonl", effects.tool())
    waits = Waits()
    runtime.plugins.register(waits, name="waits")
    signal = CancelSignal()
    results: list[ToolExecutionResult] = []
    async with trio.open_nursery() as nursery:

        async def call() -> None:
            results.append(await runtime.execute(make_input("send", {"to": "ann"}, call_id="c1", signal=signal)))

        nursery.start_soon(call)
        await waits.entered.wait()
        signal.cancel()
    assert code(results[0]) == "ABORTED_BEFORE_DISPATCH"
    assert ledger.entries() == () and effects.runs == []


# --- concurrency ----------------------------------------------------------------------------


async def test_concurrent_calls_with_one_key_run_the_body_once(tmp_path: Path) -> None:
    effects = Effects()
    gate = trio.Event()

    async def gated(args: Any) -> Any:
        effects.runs.append(args)
        await gate.wait()
        return {"n": len(effects.runs)}

    runtime, _ = with_ledger(tmp_path / "effects.jsonl", json_tool("gated", gated))
    results: list[ToolExecutionResult] = []

    async def call() -> None:
        results.append(await runtime.execute(make_input("gated", {}, call_id="same")))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(call)
        nursery.start_soon(call)
        await trio.testing.wait_all_tasks_blocked()
        gate.set()
    assert len(effects.runs) == 1
    assert [result.value for result in results if isinstance(result, ToolExecutionSuccess)] == [{"n": 1}, {"n": 1}]


# --- writing fails --------------------------------------------------------------------------


async def test_a_ledger_that_cannot_record_the_start_stops_the_call_before_its_body(tmp_path: Path) -> None:
    effects = Effects()
    runtime, ledger = with_ledger(tmp_path / "effects.jsonl", effects.tool())
    ledger.close()
    result = await runtime.execute(make_input("send", {"to": "ann"}, call_id="c1"))
    assert code(result) == "LEDGER_ERROR" and "closed" in message(result)
    assert isinstance(result, ToolExecutionFailure) and result.error.info is not None
    assert result.error.info.plugin == "effect-ledger"
    assert effects.runs == []


async def test_an_unrecordable_outcome_is_logged_and_left_in_doubt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    effects = Effects()
    runtime, ledger = with_ledger(tmp_path / "effects.jsonl", effects.tool())
    log = ledger._writable_log()  # opened by the first write: open it now to wrap it
    assert log is not None
    real_append = log.append

    def append(event: Mapping[str, Any]) -> int:
        if event["type"] != "effect/started":
            raise OSError(28, "No space left on device")
        return real_append(event)

    log.append = append  # type: ignore[method-assign]
    with caplog.at_level(logging.WARNING, logger="dsh_plugins.ledger"):
        result = await runtime.execute(make_input("send", {"to": "ann"}, call_id="c1"))
    assert isinstance(result, ToolExecutionSuccess)  # the effect happened: its result is not lost
    assert ledger.get("c1").state == "started"  # type: ignore[union-attr]
    assert "cannot record the outcome of call 'c1'" in caplog.text


class TearsOneWrite:
    """The ledger's file, whose first write of an ``event_type`` line stops part-way, as on a full disk."""

    def __init__(self, file: Any, event_type: str) -> None:
        self._file = file
        self._event_type = event_type.encode()
        self.torn = False

    def write(self, data: Any) -> int:
        line = bytes(data)
        if self.torn or self._event_type not in line:
            written: int = self._file.write(line)
            return written
        self.torn = True
        self._file.write(line[:9])
        raise OSError(errno.ENOSPC, "No space left on device")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._file, name)


def tear_one_write(ledger: EffectLedger, event_type: str) -> TearsOneWrite:
    log = ledger._writable_log()  # opened by the first write: open it now to wrap it
    assert log is not None and log._file is not None
    tears = TearsOneWrite(log._file, event_type)
    log._file = tears  # type: ignore[assignment]
    return tears


async def test_a_torn_outcome_write_is_cut_off_and_later_calls_are_recorded(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    effects = Effects()
    path = tmp_path / "effects.jsonl"
    runtime, ledger = with_ledger(path, effects.tool())
    tears = tear_one_write(ledger, "effect/committed")
    with caplog.at_level(logging.WARNING, logger="dsh_plugins.ledger"):
        first = await runtime.execute(make_input("send", {"to": "ann"}, call_id="c1"))
    assert tears.torn and isinstance(first, ToolExecutionSuccess)
    assert ledger.get("c1").state == "started"  # type: ignore[union-attr]
    assert "cannot record the outcome of call 'c1'" in caplog.text and "No space left" in caplog.text
    for call_id, to in (("c2", "bob"), ("c3", "cy")):
        later = await runtime.execute(make_input("send", {"to": to}, call_id=call_id))
        assert isinstance(later, ToolExecutionSuccess), later
        assert ledger.get(call_id).state == "committed"  # type: ignore[union-attr]
    assert len(effects.runs) == 3
    read = read_session_log(path)
    assert read.torn is None  # the half line was cut off before the next event
    assert [(event.type, event.data["key"]) for event in read.events] == [
        ("effect/started", "c1"),
        ("effect/started", "c2"),
        ("effect/committed", "c2"),
        ("effect/started", "c3"),
        ("effect/committed", "c3"),
    ]
    ledger.close()
    assert [entry.state for entry in open_ledger(path).entries()] == ["started", "committed", "committed"]


async def test_a_torn_start_write_fails_the_call_and_the_same_call_then_runs(tmp_path: Path) -> None:
    effects = Effects()
    path = tmp_path / "effects.jsonl"
    runtime, ledger = with_ledger(path, effects.tool())
    tear_one_write(ledger, "effect/started")
    first = await runtime.execute(make_input("send", {"to": "ann"}, call_id="c1"))
    assert code(first) == "LEDGER_ERROR" and "No space left on device" in message(first)
    assert isinstance(first, ToolExecutionFailure) and first.error.info is not None
    assert first.error.info.plugin == "effect-ledger"
    assert effects.runs == [] and ledger.entries() == ()
    second = await runtime.execute(make_input("send", {"to": "ann"}, call_id="c1"))
    assert isinstance(second, ToolExecutionSuccess) and len(effects.runs) == 1
    assert [kind for kind, _ in events(path)] == ["effect/started", "effect/committed"]


# --- keys -----------------------------------------------------------------------------------


async def test_a_key_function_scopes_keys_and_can_skip_calls(tmp_path: Path) -> None:
    effects = Effects()
    turn = {"n": 1}

    def key(execution: ToolDispatchExecution) -> str | None:
        return None if execution.name == "clock" else f"turn{turn['n']}/{execution.call_id}"

    runtime, ledger = with_ledger(tmp_path / "effects.jsonl", effects.tool(), json_tool("clock"), key=key)
    await runtime.execute(make_input("send", {"to": "ann"}, call_id="0"))
    turn["n"] = 2
    await runtime.execute(make_input("send", {"to": "ann"}, call_id="0"))  # a provider reusing ids per turn
    await runtime.execute(make_input("clock", {}, call_id="1"))
    assert len(effects.runs) == 2
    assert [entry.key for entry in ledger.entries()] == ["turn1/0", "turn2/0"]


async def test_a_key_function_returning_garbage_fails_the_call(tmp_path: Path) -> None:
    effects = Effects()
    runtime, _ = with_ledger(tmp_path / "effects.jsonl", effects.tool(), key=lambda execution: "")
    result = await runtime.execute(make_input("send", {"to": "ann"}, call_id="c1"))
    assert code(result) == "LEDGER_ERROR" and "expected a non-empty str" in message(result)
    assert effects.runs == []


# --- Code Mode ------------------------------------------------------------------------------


def code_mode(path: Path, effects: Effects, program: Any, **options: Any) -> tuple[ToolRuntime, EffectLedger]:
    runtime = ToolRuntime(mode="code", code_runtime=FakeCodeRuntime(program))
    runtime.register(effects.tool())
    ledger = open_ledger(path, runtime=runtime, **options)
    runtime.plugins.register(ledger, name=ledger_plugin.PLUGIN_NAME)
    return runtime, ledger


RUN = {"code": "send to ann and bob", "description": "send two mails"}


async def test_a_rerun_program_replays_its_committed_sub_calls_and_stops_at_one_in_doubt(tmp_path: Path) -> None:
    effects = Effects()
    path, crashed = tmp_path / "effects.jsonl", tmp_path / "crashed.jsonl"
    seen: list[Any] = []

    async def program(tools: Mapping[str, Callable[[Any], Awaitable[Any]]]) -> CodeRunResult:
        for to in ("ann", "bob"):
            if to == "bob":
                shutil.copyfile(path, crashed)  # the disk as a crash during the second send leaves it
            try:
                seen.append(await tools["send"]({"to": to}))
            except Exception as exc:
                seen.append(f"error: {exc}")
        return CodeRunResult(value=len(seen), has_value=True)

    runtime, _ = code_mode(path, effects, program)
    first = await runtime.execute(make_input("run_code", RUN, call_id="r1"))
    assert isinstance(first, ToolExecutionSuccess) and len(effects.runs) == 2
    subs = [data["key"] for kind, data in events(path) if kind == "effect/started"]
    assert subs == ["r1", "r1:code:1", "r1:code:2"]

    # The crashed copy: run_code and ann's send are recorded, bob's send had not started.
    resumed, ledger = code_mode(crashed, effects, program)
    assert {entry.key: entry.state for entry in ledger.entries()} == {"r1": "started", "r1:code:1": "committed"}
    seen.clear()
    again = await resumed.execute(make_input("run_code", RUN, call_id="r1"))
    assert isinstance(again, ToolExecutionSuccess)
    assert seen[0] == {"sent": "ann", "n": 1}  # replayed, not sent again
    assert [args["to"] for args in effects.runs] == ["ann", "bob", "bob"]  # only bob's unrecorded send ran


async def test_a_sub_call_in_doubt_fails_inside_the_rerun_program(tmp_path: Path) -> None:
    effects = Effects()
    path, crashed = tmp_path / "effects.jsonl", tmp_path / "crashed.jsonl"
    seen: list[Any] = []

    async def program(tools: Mapping[str, Callable[[Any], Awaitable[Any]]]) -> CodeRunResult:
        try:
            seen.append(await tools["snap"]({"to": "ann"}))
        except Exception as exc:
            seen.append(f"error: {exc}")
        return CodeRunResult()

    runtime = ToolRuntime(mode="code", code_runtime=FakeCodeRuntime(program))
    runtime.register(snapshot_during_body(path, crashed, effects, name="snap"))
    ledger = open_ledger(path, runtime=runtime)
    runtime.plugins.register(ledger, name=ledger_plugin.PLUGIN_NAME)
    await runtime.execute(make_input("run_code", RUN, call_id="r1"))

    resumed = ToolRuntime(mode="code", code_runtime=FakeCodeRuntime(program))
    resumed.register(snapshot_during_body(path, tmp_path / "unused.jsonl", effects, name="snap"))
    resumed.plugins.register(open_ledger(crashed, runtime=resumed), name=ledger_plugin.PLUGIN_NAME)
    seen.clear()
    result = await resumed.execute(make_input("run_code", RUN, call_id="r1"))
    assert isinstance(result, ToolExecutionSuccess)  # run_code itself may run again
    assert len(seen) == 1 and "may or may not have happened" in str(seen[0])
    assert len(effects.runs) == 1


async def test_a_changed_program_under_the_same_call_id_is_a_conflict(tmp_path: Path) -> None:
    async def program(tools: Mapping[str, Callable[[Any], Awaitable[Any]]]) -> CodeRunResult:
        return CodeRunResult()

    runtime, _ = code_mode(tmp_path / "effects.jsonl", Effects(), program)
    await runtime.execute(make_input("run_code", RUN, call_id="r1"))
    changed = await runtime.execute(make_input("run_code", {**RUN, "code": "something else"}, call_id="r1"))
    assert code(changed) == IDEMPOTENCY_CONFLICT


# --- the file -------------------------------------------------------------------------------


def test_a_second_ledger_on_the_same_file_is_refused(tmp_path: Path) -> None:
    first = open_ledger(tmp_path / "effects.jsonl")
    with pytest.raises(LedgerError, match="in use by another ledger"):
        open_ledger(tmp_path / "effects.jsonl")
    first.close()
    open_ledger(tmp_path / "effects.jsonl").close()  # the lock went with close()


def test_a_file_that_is_not_a_ledger_is_refused_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "session.jsonl"
    path.write_text('{"seq":1,"type":"tool/call","data":{"key":"c1"}}\n', encoding="utf-8")
    with pytest.raises(LedgerError, match=r"line 1: .*not an effect ledger"):
        open_ledger(path)


def test_a_field_too_deep_to_print_is_refused_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "effects.jsonl"
    deep = "[" * 100_000 + "1" + "]" * 100_000
    data = '"data":{"key":' + deep + ',"agent":null,"tool":"t","arguments":"x","at":"now"}'
    path.write_text('{"seq":1,"type":"effect/started",' + data + "}\n", encoding="utf-8")
    expected = f'{path}: line 1: "key" must be a string, got (((((((...),),),),),),)'
    with pytest.raises(LedgerError) as opening:
        open_ledger(path)
    assert str(opening.value) == expected
    with pytest.raises(LedgerError) as reading:
        read_ledger(path)
    assert str(reading.value) == expected


def test_an_outcome_for_a_key_never_started_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "effects.jsonl"
    path.write_text('{"seq":1,"type":"effect/committed","data":{"key":"c1","value":1}}\n', encoding="utf-8")
    with pytest.raises(LedgerError, match="never started"):
        open_ledger(path)


async def test_a_torn_last_line_is_cut_off_and_the_ledger_goes_on(tmp_path: Path) -> None:
    effects = Effects()
    path = tmp_path / "effects.jsonl"
    runtime, ledger = with_ledger(path, effects.tool())
    await runtime.execute(make_input("send", {"to": "ann"}, call_id="c1"))
    ledger.close()
    with open(path, "ab") as file:
        file.write(b'{"seq":3,"type":"effect/started","da')  # the crash hit mid-write
    resumed, reopened = with_ledger(path, effects.tool())
    assert [entry.state for entry in reopened.entries()] == ["committed"]
    await resumed.execute(make_input("send", {"to": "bob"}, call_id="c2"))
    assert [kind for kind, _ in events(path)][-2:] == ["effect/started", "effect/committed"]


def test_a_ledger_file_is_private(tmp_path: Path) -> None:
    open_ledger(tmp_path / "effects.jsonl").close()
    assert (tmp_path / "effects.jsonl").stat().st_mode & 0o777 == 0o600


# --- configuration --------------------------------------------------------------------------


def test_setup_without_a_path_registers_nothing() -> None:
    runtime = make_runtime()
    ledger_plugin.dsh_setup(runtime, {})
    assert runtime.plugins.get_plugin(ledger_plugin.PLUGIN_NAME) is None


def test_setup_registers_a_configured_ledger(tmp_path: Path) -> None:
    runtime = make_runtime()
    ledger_plugin.dsh_setup(
        runtime, {"path": str(tmp_path / "effects.jsonl"), "rerun_in_doubt": ["read_file"], "fsync": "close"}
    )
    registered = runtime.plugins.get_plugin(ledger_plugin.PLUGIN_NAME)
    assert isinstance(registered, EffectLedger)
    _OPENED.append(registered)
    assert registered.rerun_in_doubt == {"read_file", "run_code"} and registered.runtime is runtime
    registered.close()


@pytest.mark.parametrize(
    ("table", "fragment"),
    [
        ({"path": 3}, "[plugins.ledger].path"),
        ({"path": "x", "fsync": "sometimes"}, "[plugins.ledger].fsync"),
        ({"path": "x", "rerun_in_doubt": "read_file"}, "[plugins.ledger].rerun_in_doubt"),
        ({"path": "x", "colour": "red"}, "colour"),
        ({"path": "/no/such/directory/effects.jsonl"}, "does not exist"),
        ({"path": "effects\x00.jsonl"}, "[plugins.ledger].path: must be a non-empty path without NUL characters"),
    ],
)
def test_setup_refuses_a_bad_table(table: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        ledger_plugin.dsh_setup(make_runtime(), table)
    assert fragment in str(caught.value)


@pytest.mark.parametrize("path", ["", ".", "{work}"])
def test_setup_refuses_a_directory_and_creates_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """A lock beside the directory, outside the configuration's, was left behind before the error.

    Run in a directory of its own: ``""`` means the working directory.
    """
    work = tmp_path / "project"
    work.mkdir()
    monkeypatch.chdir(work)
    with pytest.raises(ConfigError) as caught:
        ledger_plugin.dsh_setup(make_runtime(), {"path": path.format(work=work)})
    (violation,) = caught.value.violations
    if path:
        assert (
            violation
            == f"[plugins.ledger].path: cannot open the effect ledger: {work} is a directory; name a file (in it, say)"
        )
    else:
        assert (
            violation
            == "[plugins.ledger].path: must be a non-empty path without NUL characters (got '')"
        )
    assert [entry.name for entry in tmp_path.iterdir()] == ["project"] and list(work.iterdir()) == []


def test_a_ledger_refuses_a_directory_before_taking_a_lock(tmp_path: Path) -> None:
    directory = tmp_path / "ledgers"
    directory.mkdir()
    with pytest.raises(LedgerError, match="ledgers is a directory; name a file"):
        EffectLedger(directory)
    with pytest.raises(LedgerError, match="no path"):
        EffectLedger("")
    assert [entry.name for entry in tmp_path.iterdir()] == ["ledgers"] and list(directory.iterdir()) == []


def test_a_locked_ledger_is_a_config_error_at_setup(tmp_path: Path) -> None:
    held = open_ledger(tmp_path / "effects.jsonl")
    with pytest.raises(ConfigError, match="in use"):
        ledger_plugin.dsh_setup(make_runtime(), {"path": str(tmp_path / "effects.jsonl")})
    held.close()


async def test_a_define_tool_definition_is_recorded_like_any_other(tmp_path: Path) -> None:
    async def add(args: Any) -> int:
        return int(args["a"]) + int(args["b"])

    tool = define_tool(
        name="add",
        description="add",
        parameters={"a": {"type": "integer", "required": True}, "b": {"type": "integer", "required": True}},
        output={"type": "integer"},
        execute=add,
    )
    runtime, ledger = with_ledger(tmp_path / "effects.jsonl", tool)
    await runtime.execute(make_input("add", {"a": 1, "b": 2}, call_id="c1"))
    result = await runtime.execute(make_input("add", {"a": 1, "b": 2}, call_id="c1"))
    assert isinstance(result, ToolExecutionSuccess) and result.value == 3
    assert ledger.get("c1").value == 3  # type: ignore[union-attr]


# --- the command line -----------------------------------------------------------------------


def _cli(args: list[str]) -> Any:
    from click.testing import CliRunner

    from dsh_core._cli import cli

    return CliRunner().invoke(cli, args, catch_exceptions=False)


async def _crashed_ledger(tmp_path: Path) -> tuple[Path, Effects]:
    effects = Effects()
    path, crashed = tmp_path / "effects.jsonl", tmp_path / "crashed.jsonl"
    runtime, ledger = with_ledger(path, snapshot_during_body(path, crashed, effects))
    await runtime.execute(make_input("send", {"to": "ann"}, call_id="done"))
    await runtime.execute(make_input("send", {"to": "bob"}, call_id="doubt"))
    ledger.close()
    return crashed, effects


async def test_cli_show_lists_entries_and_fails_while_any_is_in_doubt(tmp_path: Path) -> None:
    crashed, _ = await _crashed_ledger(tmp_path)
    shown = _cli(["ledger", "show", str(crashed), "--json"])
    assert shown.exit_code == 1
    rows = {row["key"]: row for row in json.loads(shown.output)["entries"]}
    assert rows["done"]["state"] == "committed" and rows["done"]["value"] == {"sent": "ann", "n": 1}
    assert rows["doubt"]["state"] == "started" and rows["doubt"]["inDoubt"] is True
    table = _cli(["ledger", "show", str(crashed)])
    assert table.exit_code == 1 and "in doubt" in table.output


async def test_cli_resolve_and_forget_settle_in_doubt_calls(tmp_path: Path) -> None:
    crashed, effects = await _crashed_ledger(tmp_path)
    bad = _cli(["ledger", "resolve", str(crashed), "doubt", "{not json"])
    assert bad.exit_code != 0 and "VALUE is not JSON" in bad.output
    not_in_doubt = _cli(["ledger", "forget", str(crashed), "done"])
    assert not_in_doubt.exit_code != 0 and "not in doubt" in not_in_doubt.output
    resolved = _cli(["ledger", "resolve", str(crashed), "doubt", '{"sent": "bob", "n": 2}'])
    assert resolved.exit_code == 0, resolved.output
    assert _cli(["ledger", "show", str(crashed)]).exit_code == 0  # nothing in doubt any more
    runtime, _ = with_ledger(crashed, effects.tool())
    replayed = await runtime.execute(make_input("send", {"to": "bob"}, call_id="doubt"))
    assert isinstance(replayed, ToolExecutionSuccess) and replayed.value == {"sent": "bob", "n": 2}
    assert len(effects.runs) == 2  # the two runs before the "crash"; the settled call did not run


async def test_cli_forget_lets_the_call_run_again(tmp_path: Path) -> None:
    crashed, effects = await _crashed_ledger(tmp_path)
    assert _cli(["ledger", "forget", str(crashed), "doubt"]).exit_code == 0
    runtime, _ = with_ledger(crashed, effects.tool())
    await runtime.execute(make_input("send", {"to": "bob"}, call_id="doubt"))
    assert len(effects.runs) == 3


def test_cli_refuses_a_file_that_is_not_a_ledger(tmp_path: Path) -> None:
    path = tmp_path / "session.jsonl"
    path.write_text('{"seq":1,"type":"tool/call","data":{"key":"c1"}}\n', encoding="utf-8")
    result = _cli(["ledger", "show", str(path)])
    assert result.exit_code != 0 and "not an effect ledger" in result.output


def test_cli_run_twice_with_a_ledger_replays_the_second_time(tmp_path: Path) -> None:
    ledger_path = tmp_path / "effects.jsonl"
    config = tmp_path / "dsh.toml"
    # strict_capabilities: the ledger's manifest must allow it to answer calls of other plugins' tools.
    config.write_text(f'strict_capabilities = true\n[plugins.ledger]\npath = "{ledger_path}"\n', encoding="utf-8")
    batch = tmp_path / "calls.jsonl"
    batch.write_text(
        json.dumps({"id": "t1", "name": "calc", "arguments": {"op": "add", "a": 1, "b": 2}}) + "\n", encoding="utf-8"
    )
    first = _cli(["--config", str(config), "run", str(batch)])
    second = _cli(["--config", str(config), "run", str(batch)])
    assert first.exit_code == second.exit_code == 0, first.output + second.output
    assert json.loads(first.stdout) == json.loads(second.stdout)
    assert [kind for kind, _ in events(ledger_path)] == ["effect/started", "effect/committed"]  # ran once


async def test_cli_show_reads_a_ledger_a_host_is_using(tmp_path: Path) -> None:
    runtime, _ = with_ledger(tmp_path / "effects.jsonl", Effects().tool())
    await runtime.execute(make_input("send", {"to": "ann"}, call_id="c1"))
    shown = _cli(["ledger", "show", str(tmp_path / "effects.jsonl"), "--json"])
    assert shown.exit_code == 0, shown.output
    assert [row["key"] for row in json.loads(shown.output)["entries"]] == ["c1"]
    busy = _cli(["ledger", "forget", str(tmp_path / "effects.jsonl"), "c1"])
    assert busy.exit_code != 0 and "in use" in busy.output  # settling needs the lock


async def test_deeply_nested_arguments_and_values_are_recorded_and_replayed(tmp_path: Path) -> None:
    deep: Any = "leaf"
    for _ in range(5000):
        deep = {"d": [deep]}
    effects = Effects()

    async def keep(args: Any) -> Any:
        effects.runs.append(1)
        return args["payload"]

    path = tmp_path / "effects.jsonl"
    runtime, ledger = with_ledger(path, json_tool("keep", keep))
    first = await runtime.execute(make_input("keep", {"payload": deep}, call_id="c1"))
    assert isinstance(first, ToolExecutionSuccess)
    ledger.close()
    resumed, _ = with_ledger(path, json_tool("keep", keep))  # reads the deep line back
    again = await resumed.execute(make_input("keep", {"payload": deep}, call_id="c1"))
    assert isinstance(again, ToolExecutionSuccess) and again.value == first.value
    assert len(effects.runs) == 1


async def test_settling_a_call_of_an_agent_names_the_agent_to_pass(tmp_path: Path) -> None:
    effects = Effects()
    path, crashed = tmp_path / "effects.jsonl", tmp_path / "crashed.jsonl"
    runtime, first = with_ledger(path, snapshot_during_body(path, crashed, effects))
    await runtime.execute(make_input("send", {"to": "ann"}, call_id="c1", agent=Agent("cli")))
    first.close()
    ledger = open_ledger(crashed)
    with pytest.raises(
        LedgerError, match=r"no call 'c1' without an agent; it has one of agent 'cli' \(pass that agent\)"
    ):
        ledger.forget("c1")
    ledger.forget("c1", agent="cli")
    assert ledger.entries() == ()


async def test_a_ledger_is_a_context_manager_that_releases_its_lock(tmp_path: Path) -> None:
    runtime = make_runtime(Effects().tool())
    with EffectLedger(tmp_path / "effects.jsonl", runtime=runtime) as ledger:
        runtime.plugins.register(ledger, name=ledger_plugin.PLUGIN_NAME)
        assert not (await runtime.execute(make_input("send", {"to": "ann"}, call_id="c1"))).is_error
    after = await runtime.execute(make_input("send", {"to": "bob"}, call_id="c2"))
    assert code(after) == "LEDGER_ERROR" and "closed" in message(after)
    assert [entry.key for entry in open_ledger(tmp_path / "effects.jsonl").entries()] == ["c1"]  # lock released


# --- with argument rewrites -------------------------------------------------------------------


class LowerCase:
    """Rewrites the recipient to lower case (a policy normalising arguments)."""

    @hookimpl
    async def dsh_pre_execute(self, execution: ToolExecution, next: Callable[[], Awaitable[Any]]) -> Any:
        decision = await next()
        to = execution.arguments.get("to")
        if isinstance(to, str) and to != to.lower():
            return Rewrite({**execution.arguments, "to": to.lower()}, "recipients are lower case")
        return decision


async def test_a_rewritten_call_resumes_from_what_ran(tmp_path: Path) -> None:
    effects = Effects()
    path = tmp_path / "effects.jsonl"
    runtime, ledger = with_ledger(path, effects.tool())
    runtime.plugins.register(LowerCase())
    first = await runtime.execute(make_input("send", {"to": "ANN"}, call_id="c1"))
    assert effects.runs == [{"to": "ann"}]  # the ledger recorded the arguments that ran
    ledger.close()

    resumed, _ = with_ledger(path, effects.tool())
    resumed.plugins.register(LowerCase())
    again = await resumed.execute(make_input("send", {"to": "ANN"}, call_id="c1"))
    assert len(effects.runs) == 1  # the same model call, rewritten the same way: replayed, not re-sent
    assert isinstance(again, ToolExecutionSuccess) and again.value == first.value
    assert len(again.additional_contexts) == 1  # the model is told about the rewrite again


async def test_a_rewrite_that_changed_since_the_call_is_a_conflict(tmp_path: Path) -> None:
    effects = Effects()
    path = tmp_path / "effects.jsonl"
    runtime, ledger = with_ledger(path, effects.tool())
    await runtime.execute(make_input("send", {"to": "ANN"}, call_id="c1"))  # no rewriting policy then
    ledger.close()

    resumed, _ = with_ledger(path, effects.tool())
    resumed.plugins.register(LowerCase())  # now the call would run with other arguments
    result = await resumed.execute(make_input("send", {"to": "ANN"}, call_id="c1"))
    assert code(result) == IDEMPOTENCY_CONFLICT
    assert len(effects.runs) == 1


# --- compaction -------------------------------------------------------------------------------------


async def ledger_with_every_state(path: Path, effects: Effects) -> tuple[ToolRuntime, EffectLedger]:
    """c1 committed, c2 failed, c3 interrupted (timed out), c4 in doubt, c5 released."""
    runtime, ledger = with_ledger(path, effects.tool(), effects.tool("broken", fail=True))
    await runtime.execute(make_input("send", {"to": "ann"}, call_id="c1"))
    await runtime.execute(make_input("broken", {"to": "bob"}, call_id="c2"))
    ledger._append("effect/started", {"key": "c3", "agent": None, "tool": "send", "arguments": "sha256:x",
                                       "contract": None, "at": "2026-01-01T00:00:00.000+00:00"})  # fmt: skip
    ledger._append("effect/interrupted", {"key": "c3", "agent": None, "code": "TOOL_TIMEOUT", "message": "late",
                                          "name": "ToolTimeoutError", "plugin": "timeout-policy"})  # fmt: skip
    ledger._append("effect/started", {"key": "c4", "agent": "a1", "tool": "send", "arguments": "sha256:y",
                                       "contract": None, "at": "2026-01-01T00:00:01.000+00:00"})  # fmt: skip
    ledger._append("effect/started", {"key": "c5", "agent": None, "tool": "send", "arguments": "sha256:z",
                                       "contract": None, "at": "2026-01-01T00:00:02.000+00:00"})  # fmt: skip
    ledger.forget("c5")
    return runtime, ledger


async def test_compaction_keeps_every_entry_and_drops_released_ones(tmp_path: Path) -> None:
    path = tmp_path / "effects.jsonl"
    effects = Effects()
    _, ledger = await ledger_with_every_state(path, effects)
    before = ledger.entries()
    assert ledger.compact() == (9, 7)
    assert ledger.entries() == before
    reread = read_ledger(path)
    assert [(e.key, e.agent, e.state) for e in reread] == [
        ("c1", None, "committed"),
        ("c2", None, "failed"),
        ("c3", None, "interrupted"),
        ("c4", "a1", "started"),
    ]
    assert reread == before  # values, failures, start times and digests included
    assert ledger.compact() == (7, 7)  # nothing more to drop


async def test_the_ledger_goes_on_after_compaction(tmp_path: Path) -> None:
    path = tmp_path / "effects.jsonl"
    effects = Effects()
    runtime, ledger = await ledger_with_every_state(path, effects)
    ledger.compact()
    again = await runtime.execute(make_input("send", {"to": "ann"}, call_id="c1"))
    assert isinstance(again, ToolExecutionSuccess) and len(effects.runs) == 2  # replayed, not re-sent
    fresh = await runtime.execute(make_input("send", {"to": "cy"}, call_id="c6"))
    assert isinstance(fresh, ToolExecutionSuccess)
    ledger.close()
    assert [entry.key for entry in read_ledger(path)] == ["c1", "c2", "c3", "c4", "c6"]


async def test_a_second_ledger_is_still_refused_after_compaction(tmp_path: Path) -> None:
    path = tmp_path / "effects.jsonl"
    _, ledger = await ledger_with_every_state(path, Effects())
    ledger.compact()
    with pytest.raises(LedgerError, match="in use by another ledger"):
        open_ledger(path)  # the lock is in effects.jsonl.lock, which compaction does not replace


async def test_compaction_can_keep_the_old_file(tmp_path: Path) -> None:
    path, archive = tmp_path / "effects.jsonl", tmp_path / "effects.old.jsonl"
    _, ledger = await ledger_with_every_state(path, Effects())
    ledger.compact(archive=archive)
    assert len(read_session_log(archive).events) == 9
    with pytest.raises(LedgerError, match="exists already"):
        ledger.compact(archive=archive)


async def test_compaction_waits_for_running_calls(tmp_path: Path) -> None:
    release = trio.Event()
    outcome: list[Any] = []

    async def slow(args: Any) -> str:
        await release.wait()
        return "done"

    runtime, ledger = with_ledger(tmp_path / "effects.jsonl", json_tool("slow", slow))
    async with trio.open_nursery() as nursery:

        async def call() -> None:
            outcome.append(await runtime.execute(make_input("slow", call_id="s1")))

        nursery.start_soon(call)
        await trio.testing.wait_all_tasks_blocked()
        with pytest.raises(LedgerError, match="running"):
            ledger.compact()
        release.set()
    assert ledger.compact() == (2, 2)


def test_cli_ledger_compact(tmp_path: Path) -> None:
    path = tmp_path / "effects.jsonl"
    ledger = open_ledger(path)
    for key in ("k1", "k2"):
        ledger._append("effect/started", {"key": key, "agent": None, "tool": "t", "arguments": "sha256:x",
                                          "contract": None, "at": "2026-01-01T00:00:00.000+00:00"})  # fmt: skip
    ledger.forget("k1")
    ledger.close()
    result = _cli(["ledger", "compact", str(path), "--archive", str(tmp_path / "old.jsonl")])
    assert result.exit_code == 0, result.output
    assert "3 line(s) -> 1" in " ".join(result.output.split())
    assert [entry.key for entry in read_ledger(path)] == ["k2"]


async def test_a_compacted_ledger_stays_private(tmp_path: Path) -> None:
    import os

    path = tmp_path / "effects.jsonl"
    old = os.umask(0o022)
    try:
        _, ledger = await ledger_with_every_state(path, Effects())
        ledger.compact(archive=tmp_path / "old.jsonl")
    finally:
        os.umask(old)
    assert path.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "old.jsonl").stat().st_mode & 0o777 == 0o600


async def test_an_archive_that_cannot_be_kept_changes_nothing_and_leaves_no_copy(tmp_path: Path) -> None:
    path = tmp_path / "effects.jsonl"
    _, ledger = await ledger_with_every_state(path, Effects())
    before = path.read_bytes()
    with pytest.raises(LedgerError, match="cannot keep the archive"):
        ledger.compact(archive=tmp_path / "no-such-dir" / "old.jsonl")
    assert path.read_bytes() == before
    assert not (tmp_path / "effects.jsonl.compacting").exists()
    assert ledger.get("c1") is not None  # and the ledger still works
    assert ledger.compact() == (9, 7)


def test_a_symlink_to_the_ledger_takes_the_same_lock(tmp_path: Path) -> None:
    path = tmp_path / "effects.jsonl"
    (tmp_path / "alias.jsonl").symlink_to(path)
    first = open_ledger(path)
    with pytest.raises(LedgerError, match="in use by another ledger"):
        open_ledger(tmp_path / "alias.jsonl")
    first.close()


async def test_a_resolved_call_keeps_no_error(tmp_path: Path) -> None:
    path = tmp_path / "effects.jsonl"
    _, ledger = await ledger_with_every_state(path, Effects())
    settled = ledger.resolve("c3", {"sent": "late"})
    assert (settled.state, settled.error_code, settled.error_message) == ("committed", None, None)
    ledger.close()
    (reread,) = [entry for entry in read_ledger(path) if entry.key == "c3"]
    assert (reread.state, reread.error_code, reread.error_message) == ("committed", None, None)


def test_cli_ledger_forget_leaves_a_file_that_is_not_a_ledger_alone(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_bytes(b'{"important":"config"}')
    from click.testing import CliRunner

    result = CliRunner().invoke(_cli_group(), ["--no-plugins", "ledger", "forget", str(path), "c1"])
    assert result.exit_code == 2, result.output
    assert path.read_bytes() == b'{"important":"config"}'


@pytest.mark.parametrize(
    "content",
    [gzip.compress(b"important notes\n", mtime=0), b'\xff\xfe{"id":"a"}\n'],
    ids=["gzip", "utf16"],
)
def test_a_binary_file_given_as_the_ledger_is_refused_and_left_alone(tmp_path: Path, content: bytes) -> None:
    """Its one line is not text, but no event precedes it: someone else's file, not a torn line to cut off."""
    path = tmp_path / "victim.gz"
    path.write_bytes(content)
    with pytest.raises(LedgerError, match="not a session log line"):
        open_ledger(path)
    with pytest.raises(LedgerError, match="not a session log line"):
        read_ledger(path)
    for command in (["forget", str(path), "nosuch-call"], ["resolve", str(path), "c1", "1"], ["show", str(path)]):
        result = _cli(["--no-plugins", "ledger", *command])
        assert result.exit_code == 2, result.output
        assert "not a session log line" in result.output
        assert path.read_bytes() == content


async def test_settling_an_unknown_call_leaves_a_torn_tail_alone(tmp_path: Path) -> None:
    """The torn tail is cut off only when an event is about to be written, not by a command that fails first."""
    crashed, _ = await _crashed_ledger(tmp_path)
    with open(crashed, "ab") as file:
        file.write(b'{"seq":4,"type":"effect/comm')
    content = crashed.read_bytes()
    for command in (["forget", str(crashed), "nosuch-call"], ["resolve", str(crashed), "nosuch-call", "1"]):
        result = _cli(["ledger", *command])
        assert result.exit_code == 2 and "the ledger has no call 'nosuch-call'" in result.output
        assert crashed.read_bytes() == content
    with open_ledger(crashed) as ledger, pytest.raises(LedgerError, match="not in doubt"):
        ledger.forget("done")
    assert crashed.read_bytes() == content
    assert _cli(["ledger", "forget", str(crashed), "doubt"]).exit_code == 0
    read = read_session_log(crashed)
    assert read.torn is None  # cut off before the settling line was written
    assert [event.type for event in read.events][-1] == "effect/released"


async def test_garbage_after_ledger_events_is_cut_off_before_the_next_write(tmp_path: Path) -> None:
    effects = Effects()
    path = tmp_path / "effects.jsonl"
    runtime, ledger = with_ledger(path, effects.tool())
    await runtime.execute(make_input("send", {"to": "ann"}, call_id="c1"))
    ledger.close()
    with open(path, "ab") as file:
        file.write(b"\x00\x00\xff\xfe\x00")  # what a crash left where the file grew
    resumed, _ = with_ledger(path, effects.tool())
    await resumed.execute(make_input("send", {"to": "bob"}, call_id="c2"))
    read = read_session_log(path)
    assert read.torn is None
    assert [(event.type, event.data["key"]) for event in read.events][-2:] == [
        ("effect/started", "c2"),
        ("effect/committed", "c2"),
    ]


def _cli_group() -> Any:
    from dsh_core._cli import cli

    return cli


# --- writing off the event loop -------------------------------------------------------------


class StalledDisk:
    """``os.fsync`` held until released: a loaded disk or a stalled NFS server, under the test's control."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import os
        import threading

        self.entered = threading.Event()
        self.release = threading.Event()
        self.released_in_time: list[bool] = []
        real_fsync = os.fsync

        def fsync(fd: int) -> None:
            self.entered.set()
            # On the event loop, nothing could release it: it gives up, and the test sees that.
            self.released_in_time.append(self.release.wait(2))
            real_fsync(fd)

        monkeypatch.setattr(os, "fsync", fsync)


class StalledLedger:
    """A ledgered ``send`` tool on a :class:`StalledDisk`, and call ``c1`` of it to start in tasks."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.effects = Effects()
        self.runtime, self.ledger = with_ledger(tmp_path / "effects.jsonl", self.effects.tool())
        self.disk = StalledDisk(monkeypatch)
        self.results: list[ToolExecutionResult] = []

    async def call(self) -> None:
        self.results.append(await self.runtime.execute(make_input("send", {"to": "ann"}, call_id="c1")))


async def test_a_synced_record_does_not_hold_the_event_loop(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each fsync ran on the trio thread: a slow disk froze every other task (calls, deadlines, streams)."""
    stalled = StalledLedger(tmp_path, monkeypatch)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(stalled.call)
        await trio.to_thread.run_sync(stalled.disk.entered.wait)
        assert stalled.effects.runs == []  # on disk before the body runs, still
        stalled.disk.release.set()  # from another task, while the record is being synced
    assert stalled.disk.released_in_time and all(stalled.disk.released_in_time)
    assert isinstance(stalled.results[0], ToolExecutionSuccess)
    assert [event for event, _ in events(tmp_path / "effects.jsonl")] == ["effect/started", "effect/committed"]
    entry = stalled.ledger.get("c1")
    assert entry is not None and entry.state == "committed"


async def test_a_call_cancelled_while_its_start_is_synced_is_recorded_and_released(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record finishes (shielded) and the body never runs: the file and the entries agree."""
    effects = Effects()
    runtime, ledger = with_ledger(tmp_path / "effects.jsonl", effects.tool())
    disk = StalledDisk(monkeypatch)
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(runtime.execute, make_input("send", {"to": "ann"}, call_id="c1"))
            await trio.to_thread.run_sync(disk.entered.wait)
            scope.cancel()
            disk.release.set()
    assert effects.runs == []
    assert [event for event, _ in events(tmp_path / "effects.jsonl")] == ["effect/started", "effect/released"]
    assert ledger.get("c1") is None or not ledger.get("c1").in_doubt  # type: ignore[union-attr]
    ledger.close()
    assert {entry.key: entry.state for entry in read_ledger(tmp_path / "effects.jsonl")} == {
        entry.key: entry.state for entry in ledger.entries()
    }


async def test_two_calls_with_one_key_while_the_first_start_is_synced_run_the_body_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second waits for the first from before the first's record is on disk (now an await)."""
    stalled = StalledLedger(tmp_path, monkeypatch)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(stalled.call)
        await trio.to_thread.run_sync(stalled.disk.entered.wait)
        nursery.start_soon(stalled.call)
        await trio.sleep(0.05)
        stalled.disk.release.set()
    assert len(stalled.effects.runs) == 1
    assert [r.value for r in stalled.results] == [{"sent": "ann", "n": 1}] * 2  # type: ignore[union-attr]
