"""Call budgets (dsh_plugins.limits): what counts, when a call is refused, and that no race exceeds a budget."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
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
    Rewrite,
    ToolExecution,
    ToolRuntime,
    hookimpl,
    run_tool_calls,
)
from dsh_core.testing import FakeCodeRuntime, json_tool, make_input, make_runtime
from dsh_plugins import limits
from dsh_plugins.ledger import EffectLedger
from dsh_plugins.limits import PLUGIN_NAME, CallLimits, LimitsSettings


def limited(*tools: Any, **settings: Any) -> tuple[ToolRuntime, CallLimits]:
    runtime = make_runtime(*tools)
    plugin = CallLimits(LimitsSettings(**settings))
    runtime.plugins.register(plugin, name=PLUGIN_NAME)
    return runtime, plugin


async def test_calls_past_the_total_budget_are_denied_with_a_reason() -> None:
    runtime, plugin = limited(json_tool("a"), json_tool("b"), max_calls=2)
    assert not (await runtime.execute(make_input("a"))).is_error
    assert not (await runtime.execute(make_input("b"))).is_error
    third = await runtime.execute(make_input("a"))
    assert third.code == "DENIED"
    assert third.error.message == "call budget spent: this agent made 2 of 2 tool calls"
    assert plugin.used() == 2 and plugin.used(None, "a") == 1


async def test_a_per_tool_budget_leaves_other_tools_alone() -> None:
    runtime, _ = limited(json_tool("bash"), json_tool("read"), per_tool={"bash": 1})
    await runtime.execute(make_input("bash"))
    second = await runtime.execute(make_input("bash"))
    assert second.code == "DENIED"
    assert second.error.message == "call budget spent: bash made 1 of 1 calls for this agent"
    assert not (await runtime.execute(make_input("read"))).is_error


async def test_budgets_are_per_agent_and_reset_per_agent_or_all() -> None:
    a, b = Agent("a"), Agent("b")
    runtime, plugin = limited(json_tool("t"), max_calls=1)
    await runtime.execute(make_input("t", agent=a))
    assert (await runtime.execute(make_input("t", agent=a))).code == "DENIED"
    assert not (await runtime.execute(make_input("t", agent=b))).is_error
    plugin.reset_agent("a")
    assert not (await runtime.execute(make_input("t", agent=a))).is_error
    assert (await runtime.execute(make_input("t", agent=b))).code == "DENIED"
    plugin.reset()
    assert not (await runtime.execute(make_input("t", agent=b))).is_error


async def test_budgets_are_read_and_reset_by_the_agent_itself_too() -> None:
    a, b = Agent("a"), Agent("b")
    runtime, plugin = limited(json_tool("t"), max_calls=1)
    await runtime.execute(make_input("t", agent=a))
    await runtime.execute(make_input("t", agent=b))
    assert plugin.used(a) == plugin.used("a") == 1
    assert plugin.used(a, "t") == 1
    plugin.reset_agent(a)  # it used to look for the Agent object among the ids, silently find none
    assert plugin.used(a) == 0 and plugin.used(b) == 1
    assert not (await runtime.execute(make_input("t", agent=a))).is_error


async def test_a_denied_call_costs_nothing() -> None:
    class DenyFirst:
        def __init__(self) -> None:
            self.denied = False

        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Callable[[], Awaitable[Any]]) -> Any:
            if not self.denied:
                self.denied = True
                return Deny("not yet")
            return await next()

    runtime, plugin = limited(json_tool("t"), max_calls=1)
    runtime.plugins.register(DenyFirst())
    assert (await runtime.execute(make_input("t"))).error.message == "not yet"
    assert plugin.used() == 0
    assert not (await runtime.execute(make_input("t"))).is_error


async def test_a_rewritten_call_counts_once() -> None:
    class Tidy:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Callable[[], Awaitable[Any]]) -> Any:
            if execution.arguments.get("p") == "a":
                return Rewrite({"p": "b"}, "tidy")
            return await next()

    runtime, plugin = limited(json_tool("t"), max_calls=5)
    runtime.plugins.register(Tidy())
    await runtime.execute(make_input("t", {"p": "a"}))
    assert plugin.used() == 1


async def test_parallel_calls_never_exceed_the_budget(autojump_clock: trio.testing.MockClock) -> None:
    async def slow(args: Any) -> str:
        await trio.sleep(0.01)
        return "ok"

    tool = json_tool("fetch", slow, is_concurrency_safe=lambda args: True)
    runtime, plugin = limited(tool, max_calls=3)
    calls = [make_input("fetch", {"n": n}) for n in range(10)]
    results = await run_tool_calls(runtime, calls)
    assert sum(not result.is_error for result in results) == 3
    refused = [result for result in results if result.is_error]
    assert {result.code for result in refused} == {"DENIED"}
    assert plugin.used() == 3


async def test_the_dispatch_check_holds_when_the_policy_check_was_passed_by_many() -> None:
    # Every call passes pre-execute while nothing has been dispatched yet (an approval is pending for all).
    release = trio.Event()

    class SlowApproval:
        @hookimpl(tryfirst=True)
        async def dsh_pre_execute(self, execution: ToolExecution, next: Callable[[], Awaitable[Any]]) -> Any:
            decision = await next()
            await release.wait()
            return decision

    runtime, plugin = limited(json_tool("t"), max_calls=2)
    runtime.plugins.register(SlowApproval())
    results: list[Any] = []

    async def call(n: int) -> None:
        results.append(await runtime.execute(make_input("t", {"n": n})))

    async with trio.open_nursery() as nursery:
        for n in range(5):
            nursery.start_soon(call, n)
        await trio.testing.wait_all_tasks_blocked()
        release.set()
    assert sum(not result.is_error for result in results) == 2
    late = [result for result in results if result.is_error]
    assert len(late) == 3 and all(result.code == "DENIED" for result in late)
    assert all(result.error.info.plugin == PLUGIN_NAME for result in late)
    assert plugin.used() == 2


async def test_a_call_stopped_while_it_waits_in_the_ledger_gives_its_count_back(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    runs: list[Any] = []

    async def send(args: Any) -> Any:
        runs.append(args["n"])
        await trio.sleep(5)
        return {"n": args["n"]}

    runtime = make_runtime(json_tool("send", send, is_concurrency_safe=lambda args: True))
    ledger = EffectLedger(tmp_path / "effects.jsonl", runtime=runtime)
    plugin = CallLimits(LimitsSettings(per_tool={"send": 2}))
    runtime.plugins.register(ledger, name="effect-ledger")
    runtime.plugins.register(plugin, name=PLUGIN_NAME)
    signal = CancelSignal()

    async def stop_soon() -> None:
        await trio.sleep(1)
        signal.cancel("user pressed stop")

    results: list[Any] = []

    async def call(request: Any) -> None:
        results.append(await runtime.execute(request))

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(call, make_input("send", {"n": 1}, call_id="c1"))
            await trio.testing.wait_all_tasks_blocked()  # the first call's body runs
            nursery.start_soon(stop_soon)
            # A repeated call id: the second waits in the ledger for the first, and is then stopped.
            nursery.start_soon(call, make_input("send", {"n": 1}, call_id="c1", signal=signal))
        assert [result.code if result.is_error else "ok" for result in results] == ["ABORTED_BEFORE_DISPATCH", "ok"]
        assert runs == [1]
        assert plugin.used() == 1 and plugin.used(None, "send") == 1
        assert not (await runtime.execute(make_input("send", {"n": 3}, call_id="c3"))).is_error
    finally:
        ledger.close()


async def test_a_call_the_effect_ledger_answers_from_its_record_costs_nothing(tmp_path: Path) -> None:
    runs: list[Any] = []

    async def send(args: Any) -> Any:
        runs.append(args["to"])
        return {"sent": args["to"]}

    runtime = make_runtime(json_tool("send", send))
    ledger = EffectLedger(tmp_path / "effects.jsonl", runtime=runtime)
    plugin = CallLimits(LimitsSettings(per_tool={"send": 2}))
    runtime.plugins.register(ledger, name="effect-ledger")
    runtime.plugins.register(plugin, name=PLUGIN_NAME)  # outside the ledger, as the entry points load them
    try:
        for call_id, to in [("c1", "ann"), ("c1", "ann"), ("c2", "bob")]:
            assert not (await runtime.execute(make_input("send", {"to": to}, call_id=call_id))).is_error
        assert runs == ["ann", "bob"]
        assert plugin.used(None, "send") == 2
    finally:
        ledger.close()


class WaitsBeforeTheBody:
    """An inner wrapper that makes a call with ``wait`` wait before ``next()`` (for a slot, say)."""

    @hookimpl
    async def dsh_execute(self, execution: Any, next: Callable[[], Awaitable[Any]]) -> Any:
        if execution.arguments.get("wait"):
            await trio.sleep(5)
        return await next()


async def test_a_call_whose_scope_is_cancelled_before_its_body_gives_its_count_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runtime, plugin = limited(json_tool("t"), max_calls=1)
    runtime.plugins.register(WaitsBeforeTheBody())
    with trio.move_on_after(1) as scope:
        await runtime.execute(make_input("t", {"wait": True}))
    assert scope.cancelled_caught
    assert plugin.used() == 0 and plugin.used(None, "t") == 0
    assert not (await runtime.execute(make_input("t"))).is_error
    assert plugin.used() == 1


async def test_a_call_an_inner_wrapper_refused_before_the_body_gives_its_count_back() -> None:
    class Refuses:
        @hookimpl
        async def dsh_execute(self, execution: Any, next: Callable[[], Awaitable[Any]]) -> Any:
            raise RuntimeError("no slot")

    runtime, plugin = limited(json_tool("t"), max_calls=1)
    runtime.plugins.register(Refuses(), name="refuses")
    assert (await runtime.execute(make_input("t"))).code == "POLICY_ERROR"
    assert plugin.used() == 0
    runtime.plugins.unregister(name="refuses")
    assert not (await runtime.execute(make_input("t"))).is_error


async def test_a_reset_while_a_call_waits_is_not_undone_by_its_count_coming_back(
    autojump_clock: trio.testing.MockClock,
) -> None:
    runtime, plugin = limited(json_tool("t"), max_calls=2)
    runtime.plugins.register(WaitsBeforeTheBody())
    with trio.move_on_after(1):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(runtime.execute, make_input("t", {"wait": True}))
            await trio.sleep(0.5)
            plugin.reset()  # a new turn starts while the call still waits
            assert not (await runtime.execute(make_input("t"))).is_error
            await trio.sleep_forever()
    # The waiting call's count went with the reset: the new turn's call still counts.
    assert plugin.used() == 1


async def test_code_mode_sub_calls_count_unless_told_not_to() -> None:
    async def program(tools: Any) -> None:
        for n in range(3):
            await tools["t"]({"n": n})

    for count_sub_calls, expected in ((True, 4), (False, 1)):
        runtime = ToolRuntime(mode="code", code_runtime=FakeCodeRuntime(program))
        runtime.register(json_tool("t"))
        plugin = CallLimits(LimitsSettings(max_calls=100, count_sub_calls=count_sub_calls))
        runtime.plugins.register(plugin)
        result = await runtime.execute(make_input("run_code", {"code": "...", "description": "d"}))
        assert not result.is_error, result
        assert plugin.used() == expected


async def test_a_program_past_its_budget_sees_its_sub_calls_denied() -> None:
    seen: list[Any] = []

    async def program(tools: Any) -> None:
        for n in range(3):
            try:
                seen.append(await tools["t"]({"n": n}))
            except Exception as exc:
                seen.append(str(exc))

    runtime = ToolRuntime(mode="code", code_runtime=FakeCodeRuntime(program))
    runtime.register(json_tool("t"))
    runtime.plugins.register(CallLimits(LimitsSettings(per_tool={"t": 2})))
    await runtime.execute(make_input("run_code", {"code": "...", "description": "d"}))
    assert seen[:2] == [{"n": 0}, {"n": 1}]
    assert "call budget spent: t made 2 of 2 calls" in str(seen[2])


async def test_the_decision_trace_names_the_budget() -> None:
    runtime = make_runtime(json_tool("t"), trace_decisions=True)
    runtime.plugins.register(CallLimits(LimitsSettings(max_calls=0)), name=PLUGIN_NAME)
    result = await runtime.execute(make_input("t"))
    assert result.trace is not None
    assert [(s.stage, s.actor, s.outcome) for s in result.trace.steps] == [
        ("pre", PLUGIN_NAME, "deny: call budget spent: this agent made 0 of 0 tool calls")
    ]


def test_the_plugin_registers_only_with_a_budget() -> None:
    runtime = ToolRuntime()
    limits.dsh_setup(runtime, {})
    assert runtime.plugins.get_plugin(PLUGIN_NAME) is None
    limits.dsh_setup(runtime, {"per_tool": {"bash": 3}})
    assert isinstance(runtime.plugins.get_plugin(PLUGIN_NAME), CallLimits)


def test_diagnostics_name_per_tool_budgets_for_tools_that_are_not_registered() -> None:
    runtime = make_runtime(json_tool("bash"))
    limits.dsh_setup(runtime, {"per_tool": {"bash": 3, "bsh": 3, "run_code": 2}})
    plugin = runtime.plugins.get_plugin(PLUGIN_NAME)
    assert isinstance(plugin, CallLimits)
    assert plugin.diagnostics() == [
        'per_tool names "bsh", which is not a registered tool, so its budget limits nothing '
        "(check the name; a prefixed plugin's tools carry the prefix)"
    ]
    assert CallLimits(LimitsSettings(per_tool={"bsh": 1})).diagnostics() == []  # no runtime to check against


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ({"max_calls": -1}, "[plugins.limits].max_calls: must be a whole number of calls >= 0"),
        ({"max_calls": 1.5}, "max_calls"),
        ({"per_tool": {"bash": -2}}, "[plugins.limits].per_tool['bash']: must be a whole number"),
        ({"per_tool": {"": 2}}, "empty name"),
        ({"max_call": 3}, "max_call"),
    ],
)
def test_bad_settings_are_configuration_errors(table: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        limits.dsh_setup(ToolRuntime(), table)


async def test_resetting_one_agent_still_gives_back_another_agents_call_that_never_ran() -> None:
    """reset_agent(A) bumped one generation for all: B's refused call stayed charged and its next call was DENIED."""
    import trio.testing

    from dsh_core import failure_result, hookimpl
    from dsh_plugins.limits import PLUGIN_NAME, CallLimits, LimitsSettings

    gate = trio.Event()

    class Refuser:  # an inner wrapper that holds B's call, then refuses it: its body never runs
        @hookimpl
        async def dsh_execute(self, execution: Any, next: Any) -> Any:
            if execution.arguments.get("hold"):
                await gate.wait()
                return failure_result("refused by an inner wrapper", "DENIED")
            return await next()

    runtime = make_runtime(json_tool("t"))
    limits = CallLimits(LimitsSettings(max_calls=1), runtime)
    runtime.plugins.register(Refuser())
    runtime.plugins.register(limits, name=PLUGIN_NAME)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(runtime.execute, make_input("t", {"hold": True}, call_id="b1", agent="agent-b"))
        await trio.testing.wait_all_tasks_blocked()
        assert limits.used("agent-b") == 1
        limits.reset_agent("agent-a")
        gate.set()
    assert limits.used("agent-b") == 0
    assert not (await runtime.execute(make_input("t", {}, call_id="b2", agent="agent-b"))).is_error
