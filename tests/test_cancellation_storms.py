"""Cancellation storms: thousands of calls through ``run_tool_calls`` with signals firing at random.

Each *turn* is one ``run_tool_calls`` of 50 calls built from a seeded
``random.Random``: parallel, exclusive and resource-keyed tools whose bodies
sleep for random virtual times (some raise, some wait cooperatively for their
signal, some run a shielded cleanup when interrupted), policies that await at
random (a pre-execute gate that may deny, a wrapper that may install its own
deadline, a post-execute step), and signals (own, shared by several calls and
fused with ``CancelSignal.any``, or already fired) that fire at random
virtual times. Everything runs on trio's ``MockClock``, so a turn of hours of
virtual time takes milliseconds.

The oracle works from what was observed, never from dsh_core's code:

- every call yields exactly one result and exactly one ``dsh_result``
  notification, in model order, and the notified result is the returned one;
  when the caller's own scope cuts the turn, every call whose policy began
  hears exactly one of ``dsh_result`` and ``dsh_call_unwound``, and none hears
  ``dsh_call_unwound`` in a turn that returned;
- every body that started had exited before its result was notified;
- no task spawned during the turn is still alive (``TaskAudit``);
- a success only when no cancellation reached the call; a denial or a
  tool-owned error stays what it was; otherwise ``ABORTED`` exactly when the
  body started and ``ABORTED_BEFORE_DISPATCH`` exactly when it did not;
- exclusive bodies overlap nothing; conflicting keyed bodies never overlap
  and run in model order;
- a retried body that keeps failing runs exactly its policy's attempts, and
  a call cancelled in the pause before a retry is ``ABORTED``.

1 000 calls run by default; the 10 000-call storm is ``@pytest.mark.slow``.
"""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from conftest_reliability import *  # noqa: F403 - fixtures and FIGURES
from conftest_reliability import FIGURES, TaskAudit
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dsh_core import (
    CancelSignal,
    Deny,
    RetryPolicy,
    ToolDispatchExecution,
    ToolExecution,
    ToolExecutionFailure,
    ToolExecutionInput,
    ToolExecutionResult,
    ToolExecutionSuccess,
    ToolRunContext,
    ToolRuntime,
    define_tool,
    hookimpl,
    run_tool_calls,
)

Next = Callable[[], Awaitable[Any]]
CALLS_PER_TURN = 50
RETRY = RetryPolicy(max_attempts=2, initial_delay_s=0.5, jitter=0, retry_on=ValueError)
KEYS = ("a", "b", "c", "d")


@attrs.define
class Observed:
    """Everything the storm's tools, policies and observer saw of one call."""

    index: int
    tool: str
    prefired: bool = False  # the call's signal had fired before the turn started
    read: frozenset[str] = frozenset()
    write: frozenset[str] = frozenset()
    pre_entered: bool = False
    denied: bool = False
    body_entered: float | None = None
    body_exited: float | None = None
    raised: bool = False
    attempts: int = 0
    deadline_fired: bool = False
    notified: list[tuple[float, bool, ToolExecutionResult]] = attrs.field(factory=list)
    unwound: int = 0  # dsh_call_unwound notices


class Storm:
    """The tools and plugins of one storm, recording into ``observed`` by call id."""

    def __init__(self) -> None:
        self.observed: dict[str, Observed] = {}
        self.order: list[str] = []
        self.runtime = ToolRuntime()
        for name, options in (
            ("sleepy", {"is_concurrency_safe": lambda args: True}),
            ("serial", {}),
            ("keyed", {"resource_keys": lambda args: {"read": args["read"], "write": args["write"]}}),
            # A raising plan raises on every attempt: it is retried once, after a pause that can be cancelled.
            ("retrying", {"is_concurrency_safe": lambda args: True, "retry": RETRY}),
        ):
            self.runtime.register(
                define_tool(
                    name=name,
                    description=f"storm tool {name}",
                    parameters={"id": {"type": "string", "required": True}, "plan": {"type": "json", "required": True}}
                    | ({"read": {"type": "json"}, "write": {"type": "json"}} if name == "keyed" else {}),
                    output={"type": "string"},
                    execute=self._body,
                    **options,
                )
            )
        self.runtime.plugins.register(self, name="storm")

    async def _body(self, args: Any, run: ToolRunContext) -> str:
        seen = self.observed[run.call_id]
        plan = args["plan"]
        seen.attempts += 1
        if seen.body_entered is None:  # a retried body's window runs from its first attempt to its last
            seen.body_entered = trio.current_time()
        try:
            if plan["coop"]:
                # Cooperative: ignores trio cancellation, watches its signal, returns normally.
                with trio.CancelScope(shield=True), trio.move_on_after(plan["body"]):
                    await run.signal.wait()
            else:
                await trio.sleep(plan["body"])
            if plan["raise"]:
                seen.raised = True
                raise ValueError(f"tool {run.call_id} failed by itself")
            return run.call_id
        finally:
            if plan["cleanup"]:
                with trio.CancelScope(shield=True):
                    await trio.sleep(plan["cleanup"])
            seen.body_exited = trio.current_time()

    @hookimpl
    async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
        seen = self.observed[execution.call_id]
        seen.pre_entered = True
        plan = execution.arguments["plan"]  # type: ignore[index]
        if plan["pre"]:
            await trio.sleep(plan["pre"])
        if plan["deny"]:
            seen.denied = True
            return Deny("the storm's gate said no")
        return await next()

    @hookimpl
    async def dsh_execute(self, execution: ToolDispatchExecution, next: Next) -> Any:
        seen = self.observed[execution.call_id]
        plan = execution.arguments["plan"]  # type: ignore[index]
        if plan["wrap_before"]:
            await trio.sleep(plan["wrap_before"])
        saved = execution.signal
        deadline = CancelSignal.after(plan["deadline"]) if plan["deadline"] else None
        if deadline is not None:
            execution.signal = CancelSignal.any(saved, deadline)
        try:
            result = await next()
        finally:
            execution.signal = saved
        if deadline is not None:
            seen.deadline_fired = deadline.cancelled
        if plan["wrap_after"]:
            await trio.sleep(plan["wrap_after"])
        return result

    @hookimpl
    async def dsh_post_execute(self, execution: ToolExecution, result: Any, next: Next) -> Any:
        plan = execution.arguments["plan"]  # type: ignore[index]
        if plan["post"]:
            await trio.sleep(plan["post"])
        return await next()

    @hookimpl
    def dsh_result(self, execution: ToolExecution, result: ToolExecutionResult) -> None:
        self.order.append(execution.call_id)
        seen = self.observed.get(execution.call_id)
        if seen is not None:
            seen.notified.append((trio.current_time(), execution.signal.cancelled, result))

    @hookimpl
    def dsh_call_unwound(self, execution: ToolExecution) -> None:
        seen = self.observed.get(execution.call_id)
        if seen is not None:
            seen.unwound += 1


@attrs.define
class Turn:
    inputs: list[ToolExecutionInput]
    fires: list[tuple[float, CancelSignal]]
    max_parallel: int
    outer_deadline: float | None  # cancel the caller's own scope at this time (None: never)


def _observed(index: int, tool: str, arguments: dict[str, Any], signal: CancelSignal) -> Observed:
    write = frozenset(arguments.get("write", ()))
    return Observed(
        index=index,
        tool=tool,
        prefired=signal.cancelled,
        read=frozenset(arguments.get("read", ())) - write,
        write=write,
    )


def _maybe(rng: random.Random, chance: float, low: float, high: float) -> float:
    return rng.uniform(low, high) if rng.random() < chance else 0


def build_turn(storm: Storm, rng: random.Random, turn: int, *, outer: bool = False) -> Turn:
    """A random turn; the call ids are registered in ``storm.observed``."""
    shared = [CancelSignal() for _ in range(3)]
    fires: list[tuple[float, CancelSignal]] = [
        (rng.uniform(0.5, 40), signal) for signal in shared if rng.random() < 0.5
    ]
    tools = rng.choice(
        [
            ("sleepy",),
            ("sleepy", "serial"),
            ("sleepy", "keyed"),
            ("sleepy", "serial", "keyed"),
            ("sleepy", "serial", "retrying"),
            ("retrying", "keyed"),
            ("retrying",),
        ]
    )
    inputs = []
    for index in range(CALLS_PER_TURN):
        call_id = f"t{turn}-c{index}"
        tool = rng.choice(tools)
        plan = {
            "pre": _maybe(rng, 0.3, 0.1, 3),
            "deny": rng.random() < 0.08,
            "wrap_before": _maybe(rng, 0.2, 0.1, 3),
            "deadline": _maybe(rng, 0.1, 0.5, 8),
            "body": rng.uniform(0.1, 10),
            "coop": rng.random() < 0.15,
            "raise": rng.random() < 0.1,
            "cleanup": _maybe(rng, 0.15, 0.1, 4),
            "wrap_after": _maybe(rng, 0.2, 0.1, 3),
            "post": _maybe(rng, 0.3, 0.1, 3),
        }
        arguments: dict[str, Any] = {"id": call_id, "plan": plan}
        if tool == "keyed":
            arguments["read"] = rng.sample(KEYS, rng.randint(0, 2))
            arguments["write"] = rng.sample(KEYS, rng.randint(0, 1))
        own = CancelSignal()
        kind = rng.random()
        if kind < 0.05:
            own.cancel("fired before the turn")
            FIGURES.cancellations += 1
            signal = own
        elif kind < 0.45:
            fires.append((rng.uniform(0.1, 60), own))
            signal = own
        elif kind < 0.7 and shared:
            signal = CancelSignal.any(rng.choice(shared), own)
        else:
            signal = own  # never fires
        storm.observed[call_id] = _observed(index, tool, arguments, signal)
        inputs.append(ToolExecutionInput(call_id=call_id, name=tool, arguments=arguments, signal=signal))
    fires.sort(key=lambda fire: fire[0])
    return Turn(
        inputs=inputs,
        fires=fires,
        max_parallel=rng.choice([1, 3, 10, 50]),
        outer_deadline=rng.uniform(1, 60) if outer else None,
    )


async def run_turn(storm: Storm, turn: Turn) -> list[ToolExecutionResult] | None:
    """Run one turn with its signal firings; ``None`` when the outer deadline interrupted it."""
    start = trio.current_time()
    results: list[ToolExecutionResult] | None = None
    with TaskAudit() as audit:
        async with trio.open_nursery() as nursery:

            async def fire_all() -> None:
                for at, signal in turn.fires:
                    await trio.sleep_until(start + at)
                    signal.cancel("storm")
                    FIGURES.cancellations += 1

            nursery.start_soon(fire_all)
            with trio.move_on_at(start + turn.outer_deadline if turn.outer_deadline is not None else float("inf")):
                results = await run_tool_calls(storm.runtime, turn.inputs, max_parallel=turn.max_parallel)
            nursery.cancel_scope.cancel()
        leaked = {task.name for task in audit.live}
    FIGURES.storm_calls += len(turn.inputs)
    assert not leaked, f"tasks still alive after the turn: {sorted(leaked)}"
    return results


def check_turn(
    storm: Storm, turn: Turn, results: list[ToolExecutionResult] | None, *, keyed_order: bool = True
) -> None:
    """The oracle (see the module docstring); ``keyed_order=False`` skips the keyed-order check."""
    ids = [request.call_id for request in turn.inputs]
    seen = [storm.observed[call_id] for call_id in ids]
    problems: list[str] = []

    def problem(call_id: str, text: str) -> None:
        problems.append(f"{call_id}: {text}")

    # Drained: a started body has exited, and before its result was published.
    for call_id, obs in zip(ids, seen, strict=True):
        if obs.body_entered is not None and obs.body_exited is None:
            FIGURES.bodies_not_drained += 1
            problem(call_id, "body still running")
        if obs.body_exited is not None and obs.notified and obs.notified[0][0] < obs.body_exited:
            FIGURES.bodies_not_drained += 1
            problem(call_id, "result published before the body exited")

    if results is None:
        # The caller's own scope was cancelled: trio.Cancelled propagated. Nothing may be
        # notified twice, and everything that started was drained (checked above). A call
        # that got as far as its policy ends either way (a result, or told it unwound), once.
        for call_id, obs in zip(ids, seen, strict=True):
            ends = len(obs.notified) + obs.unwound
            if ends > 1:
                problem(call_id, f"ended {ends} times ({len(obs.notified)} results, {obs.unwound} unwound)")
            elif ends == 0 and (obs.pre_entered or obs.body_entered is not None):
                problem(call_id, "began but neither got a result nor was told it unwound")
        assert not problems, "\n".join(problems[:20])
        return

    FIGURES.results += len(results)
    lost = len(ids) - len(results) + sum(1 for obs in seen if len(obs.notified) != 1)
    FIGURES.results_lost += max(lost, 0)
    assert len(results) == len(ids), f"{len(ids) - len(results)} results lost"
    assert not [call_id for call_id, obs in zip(ids, seen, strict=True) if obs.unwound], "told unwound with a result"
    notified_order = [call_id for call_id in storm.order if call_id in set(ids)]
    assert notified_order == ids, "dsh_result notifications are not exactly one per call, in model order"

    for call_id, obs, result in zip(ids, seen, results, strict=True):
        if len(obs.notified) != 1 or obs.notified[0][2] is not result:
            problem(call_id, "the notified result is not the returned one")
            continue
        _, cancelled, _ = obs.notified[0]
        interrupted = cancelled or obs.deadline_fired
        started = obs.body_entered is not None
        if obs.prefired and (obs.pre_entered or started):
            problem(call_id, "a call whose signal fired before the turn reached its policies or body")
        if isinstance(result, ToolExecutionSuccess):
            if interrupted or obs.denied or obs.raised or not started or result.value != call_id:
                problem(call_id, f"unexpected success {obs}")
            continue
        assert isinstance(result, ToolExecutionFailure)
        code = result.error.info.code if result.error.info else None
        expected: str
        if obs.denied:
            expected = "DENIED"
        elif obs.raised and obs.tool == "retrying" and interrupted and code == "ABORTED":
            expected = "ABORTED"  # cancelled in the pause before the retry: nothing the body returned is lost
        elif obs.raised:
            expected = "TOOL_ERROR"
            if obs.tool == "retrying" and not interrupted and obs.attempts != RETRY.max_attempts:
                problem(call_id, f"a failing retried body ran {obs.attempts} times, not {RETRY.max_attempts}")
        elif not interrupted:
            expected = "<success>"
        else:
            expected = "ABORTED" if started else "ABORTED_BEFORE_DISPATCH"
        if code != expected:
            problem(call_id, f"got {code}, expected {expected} ({obs}, cancelled={cancelled})")

    _check_scheduling(ids, seen, problems, keyed_order=keyed_order)
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems[:20])


def _overlap(a: Observed, b: Observed) -> bool:
    assert a.body_entered is not None and a.body_exited is not None
    assert b.body_entered is not None and b.body_exited is not None
    return a.body_entered < b.body_exited and b.body_entered < a.body_exited


def _check_scheduling(ids: list[str], seen: list[Observed], problems: list[str], *, keyed_order: bool) -> None:
    ran = [(call_id, obs) for call_id, obs in zip(ids, seen, strict=True) if obs.body_entered is not None]
    for position, (call_id, obs) in enumerate(ran):
        for other_id, other in ran[position + 1 :]:
            if obs.tool == "serial" or other.tool == "serial":
                if _overlap(obs, other):
                    problems.append(f"{call_id} / {other_id}: an exclusive body overlapped another")
            elif (
                keyed_order
                and obs.tool == other.tool == "keyed"
                and _conflict(obs, other)
                and obs.body_exited > other.body_entered  # type: ignore[operator]
            ):
                problems.append(f"{call_id} / {other_id}: conflicting keyed bodies out of model order")


def _conflict(a: Observed, b: Observed) -> bool:
    return bool(a.write & b.write or a.write & b.read or a.read & b.write)


async def storm(seed: int, turns: int, *, outer_every: int = 0, keyed_order: bool = True) -> None:
    rng = random.Random(seed)
    state = Storm()
    for number in range(turns):
        outer = bool(outer_every) and number % outer_every == outer_every - 1
        turn = build_turn(state, rng, number, outer=outer)
        results = await run_turn(state, turn)
        check_turn(state, turn, results, keyed_order=keyed_order)


@pytest.mark.parametrize("seed", range(4))
async def test_storm_of_250_calls(autojump_clock: trio.testing.MockClock, seed: int) -> None:
    await storm(seed, turns=5)


async def test_storm_with_the_callers_own_scope_cancelled(autojump_clock: trio.testing.MockClock) -> None:
    # Every other turn is cut short by cancelling the scope around run_tool_calls.
    await storm(1000, turns=4, outer_every=2)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(100, 110))
async def test_storm_of_10000_calls(autojump_clock: trio.testing.MockClock, seed: int) -> None:
    await storm(seed, turns=20, outer_every=5)


async def test_storm_keeps_conflicting_keyed_calls_in_model_order(autojump_clock: trio.testing.MockClock) -> None:
    await storm(3, turns=5, keyed_order=True)


async def test_writer_waits_for_a_reader_even_when_the_writer_between_them_was_aborted(
    autojump_clock: trio.testing.MockClock,
) -> None:
    spans: dict[str, tuple[float, float]] = {}

    async def body(args: Any) -> str:
        start = trio.current_time()
        await trio.sleep(args["d"])
        spans[args["id"]] = (start, trio.current_time())
        return str(args["id"])

    runtime = ToolRuntime()
    runtime.register(
        define_tool(
            name="kv",
            description="keyed",
            parameters={
                "id": {"type": "string"},
                "d": {"type": "number"},
                "r": {"type": "json"},
                "w": {"type": "json"},
            },
            output={"type": "string"},
            execute=body,
            resource_keys=lambda args: {"read": args["r"], "write": args["w"]},
        )
    )
    stop = CancelSignal()
    calls = [
        ToolExecutionInput(
            call_id="0", name="kv", arguments={"id": "reader", "d": 2, "r": ["k"], "w": []}, signal=CancelSignal()
        ),
        ToolExecutionInput(
            call_id="1", name="kv", arguments={"id": "writer1", "d": 1, "r": [], "w": ["k"]}, signal=stop
        ),
        ToolExecutionInput(
            call_id="2", name="kv", arguments={"id": "writer2", "d": 1, "r": [], "w": ["k"]}, signal=CancelSignal()
        ),
    ]
    async with trio.open_nursery() as nursery:

        async def fire() -> None:
            await trio.sleep(0.5)
            stop.cancel()

        nursery.start_soon(fire)
        results = await run_tool_calls(runtime, calls)
    assert [r.is_error for r in results] == [False, True, False]
    assert spans["writer2"][0] >= spans["reader"][1], spans  # the write happens after the earlier read


# -- hypothesis: small generated turns, each in its own trio run ---------------------------------------

plans = st.fixed_dictionaries(
    {
        "pre": st.sampled_from([0, 0.5, 2.5]),
        "deny": st.booleans(),
        "wrap_before": st.sampled_from([0, 1.5]),
        "deadline": st.sampled_from([0, 0, 2.25]),
        "body": st.sampled_from([0.25, 1.75, 6.5]),
        "coop": st.booleans(),
        "raise": st.booleans(),
        "cleanup": st.sampled_from([0, 0.75]),
        "wrap_after": st.sampled_from([0, 1.25]),
        "post": st.sampled_from([0, 0.6]),
    }
)
calls = st.lists(
    st.tuples(
        st.sampled_from(["sleepy", "serial", "keyed"]),
        plans,
        st.one_of(st.none(), st.just(-1.0), st.floats(0.05, 20, allow_nan=False)),  # fire time; -1 = pre-fired
        st.lists(st.sampled_from(KEYS), max_size=2, unique=True),
        st.lists(st.sampled_from(KEYS), max_size=1, unique=True),
    ),
    min_size=1,
    max_size=12,
)


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(calls=calls, max_parallel=st.sampled_from([1, 2, 10]))
def test_generated_turns_keep_every_invariant(calls: list[Any], max_parallel: int) -> None:
    async def main() -> None:
        state = Storm()
        inputs = []
        fires = []
        for index, (tool, plan, fire, read, write) in enumerate(calls):
            call_id = f"h-c{index}"
            signal = CancelSignal()
            if fire == -1.0:
                signal.cancel()
            elif fire is not None:
                fires.append((fire, signal))
            arguments: dict[str, Any] = {"id": call_id, "plan": plan}
            if tool == "keyed":
                arguments |= {"read": read, "write": write}
            state.observed[call_id] = _observed(index, tool, arguments, signal)
            inputs.append(ToolExecutionInput(call_id=call_id, name=tool, arguments=arguments, signal=signal))
        turn = Turn(
            inputs=inputs, fires=sorted(fires, key=lambda f: f[0]), max_parallel=max_parallel, outer_deadline=None
        )
        check_turn(state, turn, await run_turn(state, turn))

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
