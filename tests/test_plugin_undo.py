"""Undo (dsh_plugins.undo) and the file tools' reverts: what is recorded, the order, and when a revert refuses."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from dsh_core import Agent, Block, ConfigError, ToolRuntime, define_tool, hookimpl, run_tool_calls
from dsh_core.testing import FakeCodeRuntime, expect_failure, expect_success, json_tool, make_input, make_runtime
from dsh_plugins import files, undo
from dsh_plugins.files import file_tools
from dsh_plugins.undo import PLUGIN_NAME, UndoLog, UndoOutcome


class Events:
    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    def __call__(self, event_type: str, data: Mapping[str, Any]) -> None:
        self.seen.append((event_type, dict(data)))


def with_undo(*tools: Any, max_entries: int = 1000) -> tuple[ToolRuntime, UndoLog, Events]:
    events = Events()
    runtime = make_runtime(*tools, event_sink=events)
    log = UndoLog(runtime, max_entries=max_entries)
    runtime.plugins.register(log, name=PLUGIN_NAME)
    return runtime, log, events


def counter_tool(name: str, state: list[str], *, fail_revert: bool = False) -> Any:
    async def body(args: Any) -> str:
        state.append(args["item"])
        return args["item"]

    def revert(args: Any, value: Any) -> None:
        if fail_revert:
            raise RuntimeError(f"cannot take {value} back")
        state.remove(value)

    return json_tool(name, body, revert=revert)


# -- the log ------------------------------------------------------------------------------------


async def test_undo_reverts_the_newest_calls_first() -> None:
    state: list[str] = []
    runtime, log, events = with_undo(counter_tool("add", state))
    for item in "abc":
        expect_success(await runtime.execute(make_input("add", {"item": item}, call_id=f"c-{item}")))
    assert [entry.call_id for entry in log.entries()] == ["c-a", "c-b", "c-c"]
    outcomes = await log.undo(2)
    assert outcomes == [
        UndoOutcome(call_id="c-c", tool="add", reverted=True),
        UndoOutcome(call_id="c-b", tool="add", reverted=True),
    ]
    assert state == ["a"]
    assert [entry.call_id for entry in log.entries()] == ["c-a"]
    assert [kind for kind, _ in events.seen] == ["tool/reverted", "tool/reverted"]
    assert events.seen[0][1] == {"call_id": "c-c", "root_call_id": "c-c", "tool": "add", "agent": None}


async def test_undo_to_reverts_that_call_and_everything_after_it() -> None:
    state: list[str] = []
    runtime, log, _ = with_undo(counter_tool("add", state))
    for item in "abcd":
        await runtime.execute(make_input("add", {"item": item}, call_id=f"c-{item}"))
    outcomes = await log.undo_to("c-b")
    assert [outcome.call_id for outcome in outcomes] == ["c-d", "c-c", "c-b"]
    assert state == ["a"]
    with pytest.raises(LookupError, match="no undoable call 'c-b'"):
        await log.undo_to("c-b")


async def test_a_failing_revert_stops_the_undo_and_keeps_what_is_left() -> None:
    kept: list[str] = []
    stuck: list[str] = []
    runtime, log, events = with_undo(counter_tool("add", kept), counter_tool("sticky", stuck, fail_revert=True))
    await runtime.execute(make_input("add", {"item": "a"}, call_id="c1"))
    await runtime.execute(make_input("sticky", {"item": "s"}, call_id="c2"))
    await runtime.execute(make_input("add", {"item": "b"}, call_id="c3"))
    outcomes = await log.undo(3)
    assert outcomes == [
        UndoOutcome(call_id="c3", tool="add", reverted=True),
        UndoOutcome(call_id="c2", tool="sticky", reverted=False, error="cannot take s back"),
    ]
    assert kept == ["a"] and stuck == ["s"]
    assert [entry.call_id for entry in log.entries()] == ["c1", "c2"]
    assert events.seen[-1] == (
        "tool/revert-failed",
        {"call_id": "c2", "root_call_id": "c2", "tool": "sticky", "agent": None, "error": "cannot take s back"},
    )


async def test_keep_going_attempts_every_entry_and_keeps_the_failed_ones() -> None:
    kept: list[str] = []
    stuck: list[str] = []
    runtime, log, _ = with_undo(counter_tool("add", kept), counter_tool("sticky", stuck, fail_revert=True))
    await runtime.execute(make_input("add", {"item": "a"}, call_id="c1"))
    await runtime.execute(make_input("sticky", {"item": "s"}, call_id="c2"))
    await runtime.execute(make_input("add", {"item": "b"}, call_id="c3"))
    outcomes = await log.undo_to("c1", keep_going=True)
    assert [(outcome.call_id, outcome.reverted) for outcome in outcomes] == [("c3", True), ("c2", False), ("c1", True)]
    assert kept == [] and stuck == ["s"]
    assert [entry.call_id for entry in log.entries()] == ["c2"]


async def test_only_successful_calls_of_tools_with_a_revert_are_recorded() -> None:
    async def boom(args: Any) -> Any:
        raise RuntimeError("no")

    state: list[str] = []
    runtime, log, _ = with_undo(
        counter_tool("add", state), json_tool("plain"), json_tool("boom", boom, revert=lambda a, v: None)
    )
    await runtime.execute(make_input("plain"))
    await runtime.execute(make_input("boom"))
    await runtime.execute(make_input("nope"))
    assert log.entries() == ()
    assert await log.undo() == []


async def test_a_result_a_policy_blocked_after_the_body_ran_can_still_be_undone() -> None:
    class BlockAll:
        @hookimpl
        async def dsh_post_execute(self, execution: Any, result: Any, next: Any) -> Any:
            return Block("the reviewer did not like it")

    state: list[str] = []
    runtime, log, _ = with_undo(counter_tool("add", state))
    runtime.plugins.register(BlockAll())
    blocked = await runtime.execute(make_input("add", {"item": "a"}, call_id="c1"))
    assert expect_failure(blocked).error.info.code == "DENIED" and state == ["a"]  # the body ran: its effect happened
    assert blocked.error.message == "the reviewer did not like it"
    assert [entry.call_id for entry in log.entries()] == ["c1"]
    assert (await log.undo())[0].reverted and state == []


async def test_a_raising_event_sink_does_not_hide_the_undo(caplog: pytest.LogCaptureFixture) -> None:
    state: list[str] = []
    runtime, log, _ = with_undo(counter_tool("add", state))
    expect_success(await runtime.execute(make_input("add", {"item": "a"}, call_id="c-a")))

    def broken_sink(event_type: str, data: Mapping[str, Any]) -> None:
        raise OSError("disk full")

    runtime.event_sink = broken_sink
    assert await log.undo() == [UndoOutcome(call_id="c-a", tool="add", reverted=True)]
    assert state == []
    assert log.entries() == ()
    assert "event sink failed for tool/reverted: disk full" in caplog.text


async def test_a_call_aborted_as_its_body_finished_can_still_be_undone() -> None:
    from dsh_core import CancelSignal

    state: list[str] = []
    signal = CancelSignal()

    async def body(args: Any) -> str:
        state.append(args["item"])
        with trio.CancelScope(shield=True):
            signal.cancel()  # stop pressed as the work completes
            await trio.lowlevel.checkpoint()
        return args["item"]

    runtime, log, _ = with_undo(json_tool("add", body, revert=lambda args, value: state.remove(value)))
    result = await runtime.execute(make_input("add", {"item": "a"}, call_id="c-a", signal=signal))
    assert result.is_error and state == ["a"]
    assert [entry.call_id for entry in log.entries()] == ["c-a"]
    assert await log.undo() == [UndoOutcome(call_id="c-a", tool="add", reverted=True)]
    assert state == []


async def test_a_call_whose_scope_was_cancelled_as_its_body_finished_can_still_be_undone(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The caller's own cancel scope fires while a shielded body finishes: the cancellation leaves the
    wrappers as an exception (an inner wrapper awaits after ``next()``), and the work is still recorded."""
    state: list[str] = []

    async def body(args: Any) -> str:
        with trio.CancelScope(shield=True):
            await trio.sleep(2)
            state.append(args["item"])
        return str(args["item"])

    class AwaitsAfterTheBody:
        @hookimpl(trylast=True)
        async def dsh_execute(self, execution: Any, next: Any) -> Any:
            result = await next()
            await trio.sleep(0)
            return result

    runtime, log, _ = with_undo(json_tool("add", body, revert=lambda args, value: state.remove(value)))
    runtime.plugins.register(AwaitsAfterTheBody(), name="awaits-after")
    with trio.move_on_after(1) as scope:
        await runtime.execute(make_input("add", {"item": "a"}, call_id="c-a"))
    assert scope.cancelled_caught and state == ["a"]
    assert [entry.call_id for entry in log.entries()] == ["c-a"]
    assert await log.undo() == [UndoOutcome(call_id="c-a", tool="add", reverted=True)]
    assert state == []


async def test_a_call_whose_inner_wrapper_raised_after_the_body_returned_can_still_be_undone() -> None:
    state: list[str] = []

    class Breaks:
        @hookimpl
        async def dsh_execute(self, execution: Any, next: Any) -> Any:
            await next()
            raise RuntimeError("broke after the body")

    runtime, log, _ = with_undo(counter_tool("add", state))
    runtime.plugins.register(Breaks(), name="breaks")
    result = await runtime.execute(make_input("add", {"item": "a"}, call_id="c-a"))
    assert result.is_error and state == ["a"]
    assert [entry.call_id for entry in log.entries()] == ["c-a"]


async def test_an_answer_given_without_running_the_body_here_is_not_recorded(tmp_path: Path) -> None:
    """The effect ledger answers a call id an earlier process ran: this process did nothing to undo."""
    from dsh_plugins.ledger import EffectLedger

    state: list[str] = []
    path = tmp_path / "effects.jsonl"
    for _ in range(2):  # two processes, one after the other
        runtime = make_runtime(counter_tool("add", state))
        ledger = EffectLedger(str(path), runtime=runtime)
        log = UndoLog(runtime, max_entries=10)
        runtime.plugins.register(ledger, name="effect-ledger")
        runtime.plugins.register(log, name=PLUGIN_NAME)  # outside the ledger's answer
        try:
            expect_success(await runtime.execute(make_input("add", {"item": "a"}, call_id="c-a")))
        finally:
            ledger.close()
    assert state == ["a"]  # the second process replayed the recorded value
    assert log.entries() == ()


async def test_where_selects_the_entries_to_undo() -> None:
    state: list[str] = []
    runtime, log, _ = with_undo(counter_tool("add", state))
    for item in "abc":
        await runtime.execute(make_input("add", {"item": item}))
    await log.undo(5, where=lambda entry: entry.value != "b")
    assert state == ["b"]


async def test_async_reverts_are_awaited() -> None:
    state: list[str] = []

    async def body(args: Any) -> str:
        state.append("x")
        return "x"

    async def revert(args: Any, value: Any) -> None:
        state.remove(value)

    runtime, log, _ = with_undo(json_tool("t", body, revert=revert))
    await runtime.execute(make_input("t"))
    assert (await log.undo())[0].reverted and state == []


def slow_counter(state: list[str], reverted: list[str]) -> Any:
    """A tool whose revert takes a while (an HTTP DELETE), so undo requests can overlap."""

    async def body(args: Any) -> str:
        state.append(args["item"])
        return args["item"]

    async def revert(args: Any, value: Any) -> None:
        await trio.sleep(1)
        state.remove(value)
        reverted.append(value)

    return json_tool("add", body, revert=revert)


async def test_overlapping_undo_requests_revert_each_entry_once_newest_first(autojump_clock: Any) -> None:
    state: list[str] = []
    reverted: list[str] = []
    runtime, log, _ = with_undo(slow_counter(state, reverted))
    for item in "abc":
        await runtime.execute(make_input("add", {"item": item}, call_id=f"c-{item}"))
    results: list[list[UndoOutcome]] = []

    async def click() -> None:
        results.append(await log.undo(1))

    async with trio.open_nursery() as nursery:  # two clicks on an "undo" button
        nursery.start_soon(click)
        nursery.start_soon(click)
    assert results == [
        [UndoOutcome(call_id="c-c", tool="add", reverted=True)],
        [UndoOutcome(call_id="c-b", tool="add", reverted=True)],
    ]
    assert reverted == ["c", "b"] and state == ["a"]
    assert [entry.call_id for entry in log.entries()] == ["c-a"]


async def test_undo_to_waits_for_an_undo_under_way(autojump_clock: Any) -> None:
    state: list[str] = []
    reverted: list[str] = []
    runtime, log, _ = with_undo(slow_counter(state, reverted))
    for item in "abc":
        await runtime.execute(make_input("add", {"item": item}, call_id=f"c-{item}"))
    results: dict[str, list[UndoOutcome]] = {}

    async def undo_last() -> None:
        results["undo"] = await log.undo(1)

    async def undo_to_b() -> None:
        results["undo_to"] = await log.undo_to("c-b")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(undo_last)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(undo_to_b)
    assert [outcome.call_id for outcome in results["undo"]] == ["c-c"]
    assert [outcome.call_id for outcome in results["undo_to"]] == ["c-b"]  # c-c was already undone
    assert reverted == ["c", "b"] and state == ["a"]


async def test_a_revert_cancelled_part_way_leaves_its_entry_in_the_log(autojump_clock: Any) -> None:
    state: list[str] = []
    reverted: list[str] = []
    runtime, log, events = with_undo(slow_counter(state, reverted))
    for item in "ab":
        await runtime.execute(make_input("add", {"item": item}, call_id=f"c-{item}"))
    with trio.move_on_after(0.5) as scope:
        await log.undo(2)
    assert scope.cancelled_caught
    # Not known to be undone: it stays undoable, and nothing claims it was reverted or refused.
    assert [entry.call_id for entry in log.entries()] == ["c-a", "c-b"]
    assert reverted == [] and events.seen == []
    # The next request is not locked out by the cancelled one.
    assert await log.undo(1) == [UndoOutcome(call_id="c-b", tool="add", reverted=True)]
    assert [entry.call_id for entry in log.entries()] == ["c-a"]


async def test_the_oldest_entries_are_forgotten_past_max_entries() -> None:
    state: list[str] = []
    runtime, log, _ = with_undo(counter_tool("add", state), max_entries=2)
    for item in "abc":
        await runtime.execute(make_input("add", {"item": item}, call_id=item))
    assert [entry.call_id for entry in log.entries()] == ["b", "c"] and log.forgotten == 1


async def test_code_mode_sub_calls_are_undoable() -> None:
    state: list[str] = []

    async def program(tools: Any) -> None:
        await tools["add"]({"item": "p"})
        await tools["add"]({"item": "q"})

    runtime = ToolRuntime(mode="code", code_runtime=FakeCodeRuntime(program))
    runtime.register(counter_tool("add", state))
    log = UndoLog(runtime)
    runtime.plugins.register(log)
    expect_success(await runtime.execute(make_input("run_code", {"code": "...", "description": "d"}, call_id="run")))
    assert [entry.root_call_id for entry in log.entries()] == ["run", "run"]
    outcomes = await log.undo_to("run")  # the run_code call's id: its sub-calls
    assert [outcome.reverted for outcome in outcomes] == [True, True]
    assert state == []


def reused_id_runtime(state: list[str], items: list[str]) -> tuple[ToolRuntime, UndoLog]:
    """A runtime whose run_code programs each add the next two of ``items``."""
    supply = iter(items)

    async def program(tools: Any) -> None:
        await tools["add"]({"item": next(supply)})
        await tools["add"]({"item": next(supply)})

    runtime = ToolRuntime(mode="both", code_runtime=FakeCodeRuntime(program))
    runtime.register(counter_tool("add", state))
    log = UndoLog(runtime)
    runtime.plugins.register(log)
    return runtime, log


def run_code_call(call_id: str) -> Any:
    return make_input("run_code", {"code": "...", "description": "d"}, call_id=call_id)


async def test_undo_to_a_reused_run_code_id_means_its_newest_run() -> None:
    """It started at the first run with that id: everything since that first turn was undone."""
    state: list[str] = []
    runtime, log = reused_id_runtime(state, ["p", "q", "r", "s"])
    expect_success(await runtime.execute(run_code_call("call_1")))
    expect_success(await runtime.execute(make_input("add", {"item": "x"}, call_id="call_2")))
    expect_success(await runtime.execute(run_code_call("call_1")))  # a provider reusing the id
    outcomes = await log.undo_to("call_1")
    assert [outcome.call_id for outcome in outcomes] == ["call_1:code:2", "call_1:code:1"]
    assert state == ["p", "q", "x"]


async def test_undo_to_an_id_reused_by_a_plain_call_and_a_later_run_means_the_run() -> None:
    state: list[str] = []
    runtime, log = reused_id_runtime(state, ["r", "s"])
    expect_success(await runtime.execute(make_input("add", {"item": "p"}, call_id="call_1")))
    expect_success(await runtime.execute(make_input("add", {"item": "x"}, call_id="call_2")))
    expect_success(await runtime.execute(run_code_call("call_1")))
    await log.undo_to("call_1")
    assert state == ["p", "x"]
    await log.undo_to("call_1")  # now the plain call is the newest with that id: it and what came after
    assert state == []


async def test_undo_to_a_run_takes_every_sub_call_whatever_order_they_finished_in() -> None:
    """Parallel sub-calls finish out of order: the walk took a larger number before a smaller for an earlier run (s20)."""
    state: list[str] = []
    first_may_finish = trio.Event()

    async def add(args: Any) -> str:
        if args["item"] == "A":
            await first_may_finish.wait()  # the first call made finishes last
        state.append(args["item"])
        return str(args["item"])

    def revert(args: Any, value: Any) -> None:
        state.remove(value)

    async def program(tools: Any) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(tools["add"], {"item": "A"})
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(tools["add"], {"item": "B"})
            await trio.testing.wait_all_tasks_blocked()
            first_may_finish.set()

    runtime = ToolRuntime(mode="code", code_runtime=FakeCodeRuntime(program))
    runtime.register(json_tool("add", add, revert=revert, is_concurrency_safe=lambda args: True))
    log = UndoLog(runtime)
    runtime.plugins.register(log)
    expect_success(await runtime.execute(run_code_call("run")))
    # Kept in the order the program made them, though the second finished first.
    assert [entry.call_id for entry in log.entries()] == ["run:code:1", "run:code:2"] and state == ["B", "A"]
    outcomes = await log.undo_to("run")
    assert [(outcome.call_id, outcome.reverted) for outcome in outcomes] == [("run:code:2", True), ("run:code:1", True)]
    assert state == [] and log.entries() == ()


async def test_parallel_calls_are_undone_from_the_one_named_in_the_order_they_were_made(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Recorded as they finished, undo_to("c2") left c3, made after c2 but finished first (s20 spill/undo audit)."""
    state: list[str] = []

    async def add(args: Any) -> str:
        await trio.sleep(args["delay"])
        state.append(args["item"])
        return str(args["item"])

    def revert(args: Any, value: Any) -> None:
        state.remove(value)

    tool = json_tool("add", add, revert=revert, is_concurrency_safe=lambda args: True)
    runtime, log, _ = with_undo(tool)
    calls = [
        make_input("add", {"item": item, "delay": delay}, call_id=call_id)
        for call_id, item, delay in (("c1", "one", 0), ("c2", "two", 5), ("c3", "three", 1))
    ]
    await run_tool_calls(runtime, calls, max_parallel=3)
    assert [entry.call_id for entry in log.entries()] == ["c1", "c2", "c3"]
    assert [outcome.call_id for outcome in await log.undo_to("c2")] == ["c3", "c2"]
    assert state == ["one"]


async def test_undo_to_with_an_agent_undoes_that_agents_call_and_its_later_calls_only() -> None:
    """Call ids are per agent: the newest call_1, another agent's, was undone, and the rejected turn stayed (s20)."""
    state: list[str] = []
    runtime, log, _ = with_undo(counter_tool("add", state))
    ann, bob = Agent("ann"), Agent("bob")
    expect_success(await runtime.execute(make_input("add", {"item": "A1"}, call_id="call_1", agent=ann)))
    expect_success(await runtime.execute(make_input("add", {"item": "A2"}, call_id="call_2", agent=ann)))
    expect_success(await runtime.execute(make_input("add", {"item": "B1"}, call_id="call_1", agent=bob)))
    outcomes = await log.undo_to("call_1", agent=ann)
    assert [outcome.call_id for outcome in outcomes] == ["call_2", "call_1"]
    assert state == ["B1"]
    with pytest.raises(LookupError, match="no undoable call 'call_2' of agent 'bob'"):
        await log.undo_to("call_2", agent=bob)
    assert [outcome.call_id for outcome in await log.undo_to("call_1")] == ["call_1"]  # any agent: the newest
    assert state == []


async def test_undo_to_a_run_takes_the_calls_recorded_between_its_sub_calls_too() -> None:
    state: list[str] = []

    async def program(tools: Any) -> None:
        await tools["add"]({"item": "p"})
        await tools["elsewhere"]({})
        await tools["add"]({"item": "q"})

    async def elsewhere(args: Any) -> str:
        # Another call committed while the program runs (a parallel turn, another agent).
        expect_success(await runtime.execute(make_input("add", {"item": "between"}, call_id="other")))
        return "ok"

    runtime = ToolRuntime(mode="both", code_runtime=FakeCodeRuntime(program))
    runtime.register(counter_tool("add", state))
    runtime.register(json_tool("elsewhere", elsewhere))
    log = UndoLog(runtime)
    runtime.plugins.register(log)
    expect_success(await runtime.execute(run_code_call("run")))
    assert state == ["p", "between", "q"]
    outcomes = await log.undo_to("run")
    assert [outcome.call_id for outcome in outcomes] == ["run:code:3", "other", "run:code:1"]
    assert state == []


async def test_an_async_where_is_refused_instead_of_selecting_everything() -> None:
    state: list[str] = []
    runtime, log, _ = with_undo(counter_tool("add", state))
    for item in "abc":
        await runtime.execute(make_input("add", {"item": item}))

    async def only_b(entry: Any) -> bool:
        return bool(entry.value == "b")

    with pytest.raises(TypeError, match="plain function returning a bool, not an async one"):
        await log.undo(3, where=only_b)  # type: ignore[arg-type]
    assert state == ["a", "b", "c"] and len(log.entries()) == 3


async def test_a_revert_receives_structured_arguments_for_an_attrs_parameter_class() -> None:
    @attrs.define
    class Params:
        item: str

    seen: list[Any] = []

    async def body(args: Params) -> str:
        return args.item

    def revert(args: Params, value: Any) -> None:
        seen.append((args, value))

    tool = define_tool(
        name="typed", description="d", parameters=Params, output={"type": "string"}, execute=body, revert=revert
    )
    runtime, log, _ = with_undo(tool)
    await runtime.execute(make_input("typed", {"item": "z"}))
    await log.undo()
    assert seen == [(Params(item="z"), "z")]


def test_a_revert_that_is_not_callable_is_refused() -> None:
    with pytest.raises(TypeError, match="revert must be callable or None"):
        json_tool("t", revert="undo it")


@pytest.mark.parametrize("count", [0, -1, 1.5, True])
async def test_undo_count_must_be_a_positive_integer(count: Any) -> None:
    _, log, _ = with_undo()
    with pytest.raises(ValueError, match="count must be a positive integer"):
        await log.undo(count)


def test_the_plugin_registers_only_when_enabled() -> None:
    runtime = ToolRuntime()
    undo.dsh_setup(runtime, {})
    assert runtime.plugins.get_plugin(PLUGIN_NAME) is None
    undo.dsh_setup(runtime, {"enabled": True, "max_entries": 5})
    assert isinstance(runtime.plugins.get_plugin(PLUGIN_NAME), UndoLog)


@pytest.mark.parametrize("table", [{"enabled": True, "max_entries": 0}, {"enabled": True, "size": 3}])
def test_bad_settings_are_configuration_errors(table: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        undo.dsh_setup(ToolRuntime(), table)


# -- the file tools' reverts ------------------------------------------------------------------------


@pytest.fixture
def root(tmp_path: Path) -> Path:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "notes.txt").write_text("one\ntwo\nthree\n")
    return workspace


def file_undo(root: Path) -> tuple[ToolRuntime, UndoLog]:
    runtime, log, _ = with_undo(*file_tools(root))
    return runtime, log


async def test_undoing_a_created_file_removes_it(root: Path) -> None:
    runtime, log = file_undo(root)
    expect_success(await runtime.execute(make_input("write_file", {"path": "new/a.txt", "content": "hi"})))
    assert (await log.undo())[0].reverted
    assert not (root / "new" / "a.txt").exists()


async def test_undoing_an_overwrite_puts_the_old_text_back(root: Path) -> None:
    runtime, log = file_undo(root)
    await runtime.execute(make_input("write_file", {"path": "notes.txt", "content": "replaced"}))
    assert (await log.undo())[0].reverted
    assert (root / "notes.txt").read_text() == "one\ntwo\nthree\n"


async def test_a_file_changed_since_the_write_is_not_reverted(root: Path) -> None:
    runtime, log = file_undo(root)
    await runtime.execute(make_input("write_file", {"path": "notes.txt", "content": "replaced"}))
    (root / "notes.txt").write_text("someone else's work")
    (outcome,) = await log.undo()
    assert not outcome.reverted and "changed since write_file wrote it" in (outcome.error or "")
    assert (root / "notes.txt").read_text() == "someone else's work"
    assert len(log.entries()) == 1


@pytest.mark.parametrize("tool", ["write_file", "edit_file"])
async def test_a_revert_refuses_a_file_swapped_for_a_fifo_after_its_check(
    root: Path, monkeypatch: pytest.MonkeyPatch, tool: str
) -> None:
    # A job left running swaps the file for a FIFO between the revert's check and its open:
    # a plain open() would block the undo's worker thread forever.
    runtime, log = file_undo(root)
    arguments = (
        {"path": "notes.txt", "content": "replaced"}
        if tool == "write_file"
        else {"path": "notes.txt", "old_string": "two", "new_string": "2"}
    )
    expect_success(await runtime.execute(make_input(tool, arguments)))
    fifo = root / "notes.txt"

    def checked_then_swapped(real: str, path: str) -> bool:
        fifo.unlink()
        os.mkfifo(fifo)
        return True

    monkeypatch.setattr(files, "_check_regular", checked_then_swapped)
    try:
        with trio.fail_after(5):
            (outcome,) = await log.undo()
    finally:
        with contextlib.suppress(OSError):  # never leave a thread blocked on the FIFO
            os.close(os.open(fifo, os.O_RDWR | os.O_NONBLOCK))
    assert not outcome.reverted and "is not a regular file" in (outcome.error or "")


async def test_a_write_over_binary_content_cannot_be_reverted(root: Path) -> None:
    (root / "blob.bin").write_bytes(b"\xff\xfe\x00binary")
    runtime, log = file_undo(root)
    await runtime.execute(make_input("write_file", {"path": "blob.bin", "content": "text"}))
    (outcome,) = await log.undo()
    assert not outcome.reverted and "was not kept" in (outcome.error or "")
    assert (root / "blob.bin").read_text() == "text"


async def test_a_deleted_file_cannot_be_reverted(root: Path) -> None:
    runtime, log = file_undo(root)
    await runtime.execute(make_input("write_file", {"path": "gone.txt", "content": "x"}))
    (root / "gone.txt").unlink()
    (outcome,) = await log.undo()
    assert not outcome.reverted and "no longer exists" in (outcome.error or "")


async def test_undoing_an_edit_puts_the_old_string_back(root: Path) -> None:
    runtime, log = file_undo(root)
    await runtime.execute(make_input("edit_file", {"path": "notes.txt", "old_string": "two", "new_string": "2"}))
    await runtime.execute(
        make_input("edit_file", {"path": "notes.txt", "old_string": "e", "new_string": "E!", "replace_all": True})
    )
    assert (root / "notes.txt").read_text() == "onE!\n2\nthrE!E!\n"
    assert [outcome.reverted for outcome in await log.undo(2)] == [True, True]
    assert (root / "notes.txt").read_text() == "one\ntwo\nthree\n"


async def test_an_edit_whose_new_text_was_there_before_is_reverted_where_it_was_made(root: Path) -> None:
    runtime, log = file_undo(root)
    await runtime.execute(make_input("edit_file", {"path": "notes.txt", "old_string": "two", "new_string": "one"}))
    assert (root / "notes.txt").read_text() == "one\none\nthree\n"
    assert [outcome.reverted for outcome in await log.undo()] == [True]
    assert (root / "notes.txt").read_text() == "one\ntwo\nthree\n"  # not the first "one"


async def test_an_edit_that_deleted_text_is_reverted_too(root: Path) -> None:
    runtime, log = file_undo(root)
    await runtime.execute(make_input("edit_file", {"path": "notes.txt", "old_string": "two\n", "new_string": ""}))
    assert [outcome.reverted for outcome in await log.undo()] == [True]
    assert (root / "notes.txt").read_text() == "one\ntwo\nthree\n"


async def test_an_edit_whose_new_text_overlaps_its_surroundings_is_reverted_exactly(root: Path) -> None:
    (root / "a.txt").write_text("aX")
    runtime, log = file_undo(root)
    await runtime.execute(make_input("edit_file", {"path": "a.txt", "old_string": "X", "new_string": "aa"}))
    assert (root / "a.txt").read_text() == "aaa"
    assert [outcome.reverted for outcome in await log.undo()] == [True]
    assert (root / "a.txt").read_text() == "aX"


async def test_an_edit_of_many_occurrences_is_reverted_exactly_with_a_bounded_value(root: Path) -> None:
    text = "a\tb\n" * 100_000
    (root / "data.tsv").write_text(text)
    runtime, log = file_undo(root)
    arguments = {"path": "data.tsv", "old_string": "\t", "new_string": ",", "replace_all": True}
    value = expect_success(await runtime.execute(make_input("edit_file", arguments))).value
    # Where each replacement went is not kept past MAX_KEPT_POSITIONS: the value goes to the logs.
    assert value["replacements"] == 100_000 and value["positions"] is None
    assert len(json.dumps(dict(value))) < 300
    assert (root / "data.tsv").read_text() == text.replace("\t", ",")
    assert [outcome.reverted for outcome in await log.undo()] == [True]
    assert (root / "data.tsv").read_text() == text


@pytest.mark.parametrize(
    ("before", "old", "new"),
    [
        ("a,b\tc\n" * 5_000, "\t", ","),  # the new text was there before
        ("ab\n" * 5_000, "b", ""),  # a deletion: nothing marks where it was
    ],
)
async def test_an_edit_of_many_occurrences_that_cannot_be_rebuilt_is_not_reverted(
    root: Path, before: str, old: str, new: str
) -> None:
    (root / "data.txt").write_text(before)
    runtime, log = file_undo(root)
    arguments = {"path": "data.txt", "old_string": old, "new_string": new, "replace_all": True}
    expect_success(await runtime.execute(make_input("edit_file", arguments)))
    (outcome,) = await log.undo()
    assert not outcome.reverted
    assert "replaced 5000 occurrences" in (outcome.error or "") and "not reverted" in (outcome.error or "")
    assert (root / "data.txt").read_text() == before.replace(old, new)


async def test_an_edit_of_a_few_occurrences_whose_new_text_was_there_is_reverted_exactly(root: Path) -> None:
    (root / "data.txt").write_text("a,b\tc\n" * 50)
    runtime, log = file_undo(root)
    arguments = {"path": "data.txt", "old_string": "\t", "new_string": ",", "replace_all": True}
    expect_success(await runtime.execute(make_input("edit_file", arguments)))
    assert [outcome.reverted for outcome in await log.undo()] == [True]
    assert (root / "data.txt").read_text() == "a,b\tc\n" * 50


async def test_an_edited_file_changed_since_is_left_alone(root: Path) -> None:
    (root / "conf.py").write_text("x = 1\ny = 0\n")
    runtime, log = file_undo(root)
    await runtime.execute(make_input("edit_file", {"path": "conf.py", "old_string": "x = 1", "new_string": "x = 2"}))
    # Someone else's change that still holds the edit's new text (once, as the edit made it).
    (root / "conf.py").write_text("x = 3\ny = 0  # was x = 2\n")
    (outcome,) = await log.undo()
    assert not outcome.reverted and "changed since edit_file edited it" in (outcome.error or "")
    assert (root / "conf.py").read_text() == "x = 3\ny = 0  # was x = 2\n"


async def test_the_session_log_keeps_what_was_undone(tmp_path: Path) -> None:
    from dsh_core import SessionLog, SessionRecorder, read_session_log

    state: list[str] = []
    with SessionLog(tmp_path / "s.jsonl") as session:
        runtime = make_runtime(counter_tool("add", state))
        recorder = SessionRecorder(session, runtime)
        runtime.event_sink = recorder.event_sink
        log = UndoLog(runtime)
        runtime.plugins.register(log)
        await runtime.execute(make_input("add", {"item": "a"}, call_id="c1"))
        await log.undo()
    events = read_session_log(tmp_path / "s.jsonl").events
    assert [(event.type, event.data.get("call_id")) for event in events] == [("tool/reverted", "c1")]
