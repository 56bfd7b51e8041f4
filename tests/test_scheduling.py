"""run_tool_calls: bounded overlap of parallel calls, exclusive barriers, model order."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio
import trio.testing

from dsh_core import CancelSignal, ToolExecution, hookimpl, run_tool_calls
from dsh_core.testing import Recorder, json_tool, make_input, make_runtime

Next = Callable[[], Awaitable[Any]]


def timed_tool(name: str, seconds: float, spans: dict[str, tuple[float, float]], *, parallel: bool) -> Any:
    async def body(args: Any) -> str:
        start = trio.current_time()
        await trio.sleep(seconds)
        spans[args["id"]] = (start, trio.current_time())
        return args["id"]

    return json_tool(
        name,
        body,
        parameters={"id": {"type": "string", "required": True}},
        output={"type": "string"},
        is_concurrency_safe=(lambda args: True) if parallel else None,
    )


async def test_ten_parallel_calls_of_one_second_finish_at_one_second(autojump_clock: trio.testing.MockClock) -> None:
    spans: dict[str, tuple[float, float]] = {}
    runtime = make_runtime(timed_tool("read", 1, spans, parallel=True))
    results = await run_tool_calls(runtime, [make_input("read", {"id": str(i)}) for i in range(10)])
    assert [r.value for r in results] == [str(i) for i in range(10)]  # type: ignore[union-attr]
    assert trio.current_time() == pytest.approx(1)


async def test_exclusive_call_in_the_middle_splits_the_pool(autojump_clock: trio.testing.MockClock) -> None:
    spans: dict[str, tuple[float, float]] = {}
    runtime = make_runtime(timed_tool("read", 1, spans, parallel=True), timed_tool("write", 1, spans, parallel=False))
    inputs = [make_input("read", {"id": f"r{i}"}) for i in range(5)]
    inputs.append(make_input("write", {"id": "w"}))
    inputs += [make_input("read", {"id": f"s{i}"}) for i in range(5)]
    results = await run_tool_calls(runtime, inputs)
    assert trio.current_time() == pytest.approx(3)
    assert spans["w"] == (pytest.approx(1), pytest.approx(2))
    assert all(spans[f"r{i}"][1] <= spans["w"][0] for i in range(5))
    assert all(spans[f"s{i}"][0] >= spans["w"][1] for i in range(5))
    assert [r.value for r in results] == [i.arguments["id"] for i in inputs]  # type: ignore[union-attr, index]


async def test_pool_is_bounded_by_max_parallel(autojump_clock: trio.testing.MockClock) -> None:
    spans: dict[str, tuple[float, float]] = {}
    runtime = make_runtime(timed_tool("read", 1, spans, parallel=True))
    await run_tool_calls(runtime, [make_input("read", {"id": str(i)}) for i in range(10)], max_parallel=3)
    assert trio.current_time() == pytest.approx(4)  # ceil(10 / 3) rounds of a rolling pool


async def test_max_parallel_one_is_serial(autojump_clock: trio.testing.MockClock) -> None:
    spans: dict[str, tuple[float, float]] = {}
    runtime = make_runtime(timed_tool("read", 1, spans, parallel=True))
    await run_tool_calls(runtime, [make_input("read", {"id": str(i)}) for i in range(4)], max_parallel=1)
    assert trio.current_time() == pytest.approx(4)


async def test_results_and_observers_keep_model_order_when_completion_order_differs(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def body(args: Any) -> int:
        await trio.sleep(args["delay"])
        return int(args["delay"])

    recorder = Recorder()
    runtime = make_runtime(
        json_tool("t", body, output={"type": "integer"}, is_concurrency_safe=lambda a: True), plugins=[recorder]
    )
    delays = [5, 1, 3, 2, 4]
    inputs = [make_input("t", {"delay": d}, call_id=f"c{i}") for i, d in enumerate(delays)]
    results = await run_tool_calls(runtime, inputs)
    assert [r.value for r in results] == delays  # type: ignore[union-attr]
    observed = [call_id for hook, call_id in recorder.events if hook == "dsh_result"]
    assert observed == [f"c{i}" for i in range(5)]
    pre = [call_id for hook, call_id in recorder.events if hook == "dsh_pre_execute"]
    assert pre == [f"c{i}" for i in range(5)]


async def test_policies_are_decided_in_model_order_even_when_slow(autojump_clock: trio.testing.MockClock) -> None:
    decided: list[str] = []

    class SlowFirst:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
            if execution.call_id == "c0":
                await trio.sleep(5)
            decided.append(execution.call_id)
            return await next()

    runtime = make_runtime(json_tool("t", is_concurrency_safe=lambda a: True), plugins=[SlowFirst()])
    await run_tool_calls(runtime, [make_input("t", call_id=f"c{i}") for i in range(3)])
    assert decided == ["c0", "c1", "c2"]


async def test_every_call_gets_a_result_when_the_signal_fires(autojump_clock: trio.testing.MockClock) -> None:
    spans: dict[str, tuple[float, float]] = {}
    recorder = Recorder()
    runtime = make_runtime(timed_tool("read", 10, spans, parallel=True), plugins=[recorder])
    signal = CancelSignal()
    inputs = [make_input("read", {"id": str(i)}, signal=signal) for i in range(6)]

    async def stop() -> None:
        await trio.sleep(1)
        signal.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(stop)
        results = await run_tool_calls(runtime, inputs, max_parallel=2)
    codes = [r.error.info.code for r in results if r.is_error and r.error.info]  # type: ignore[union-attr]
    assert codes == ["ABORTED", "ABORTED"] + ["ABORTED_BEFORE_DISPATCH"] * 4
    assert recorder.hooks.count("dsh_result") == 6
    assert trio.current_time() == pytest.approx(1)


async def test_reclassification_before_each_start_honours_registry_changes() -> None:
    runtime = make_runtime()
    runtime.register(json_tool("t", is_concurrency_safe=lambda a: True))
    results = await run_tool_calls(runtime, [make_input("t"), make_input("missing"), make_input("t")])
    assert [r.is_error for r in results] == [False, True, False]


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True, False])
async def test_max_parallel_must_be_positive_integer(bad: Any) -> None:
    with pytest.raises(ValueError, match="max_parallel must be a positive integer"):
        await run_tool_calls(make_runtime(), [], max_parallel=bad)


async def test_a_max_parallel_beyond_the_batch_is_just_no_limit(autojump_clock: trio.testing.MockClock) -> None:
    spans: dict[str, tuple[float, float]] = {}
    runtime = make_runtime(timed_tool("read", 1, spans, parallel=True))
    await run_tool_calls(runtime, [make_input("read", {"id": str(i)}) for i in range(5)], max_parallel=10**100)
    assert trio.current_time() == pytest.approx(1)


async def test_a_raising_classifier_makes_its_calls_exclusive_not_failed(autojump_clock: trio.testing.MockClock) -> None:
    spans: dict[str, tuple[float, float]] = {}

    def broken(args: Any) -> bool:
        raise RuntimeError("classifier broke")

    async def body(args: Any) -> str:
        start = trio.current_time()
        await trio.sleep(1)
        spans[args["id"]] = (start, trio.current_time())
        return args["id"]

    runtime = make_runtime(json_tool("t", body, output={"type": "string"}, is_concurrency_safe=broken))
    results = await run_tool_calls(runtime, [make_input("t", {"id": str(i)}) for i in range(3)])
    assert [result.value for result in results] == ["0", "1", "2"]  # type: ignore[union-attr]
    assert [spans[str(i)] for i in range(3)] == [(i, i + 1) for i in range(3)]  # one at a time, in order


async def test_items_that_are_not_inputs_are_refused_before_any_call_runs() -> None:
    runs: list[str] = []

    async def body(args: Any) -> None:
        runs.append("ran")

    runtime = make_runtime(json_tool("t", body))
    with pytest.raises(TypeError) as raised:
        await run_tool_calls(runtime, [make_input("t"), {"call_id": "c2", "name": "t"}])  # type: ignore[list-item]
    assert str(raised.value) == "run_tool_calls() takes ToolExecutionInput items, got dict at position 1"
    assert runs == []


@pytest.mark.parametrize("runtime", [None, object()], ids=["None", "object"])
async def test_a_runtime_that_is_not_one_is_named(runtime: Any) -> None:
    with pytest.raises(TypeError) as raised:
        await run_tool_calls(runtime, [make_input("t")])
    assert str(raised.value) == f"run_tool_calls() takes a ToolRuntime first, got {type(runtime).__name__}"


async def test_empty_batch() -> None:
    assert await run_tool_calls(make_runtime(), []) == []


def mixed_runtime(log: list[str], recorder: Recorder) -> Any:
    """``slow`` suspends for ``delay`` seconds; ``fast`` cannot suspend (the scheduler runs it in its loop)."""

    async def slow(args: Any) -> str:
        await trio.sleep(args["delay"])
        log.append(f"slow {args['id']}")
        return str(args["id"])

    async def fast(args: Any) -> str:
        log.append(f"fast {args['id']}")
        return str(args["id"])

    parameters = {"id": {"type": "string", "required": True}, "delay": {"type": "number"}}
    return make_runtime(
        json_tool("slow", slow, parameters=parameters, output={"type": "string"}, is_concurrency_safe=lambda a: True),
        json_tool("fast", fast, parameters=parameters, output={"type": "string"}, is_concurrency_safe=lambda a: True),
        plugins=[recorder],
    )


async def test_calls_that_cannot_suspend_still_commit_in_model_order_behind_slower_ones(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log: list[str] = []
    recorder = Recorder()
    runtime = mixed_runtime(log, recorder)
    assert runtime.get("fast").inline and not runtime.get("slow").inline
    inputs = [
        make_input("slow", {"id": "c0", "delay": 2}, call_id="c0"),
        make_input("fast", {"id": "c1"}, call_id="c1"),
        make_input("slow", {"id": "c2", "delay": 1}, call_id="c2"),
        make_input("fast", {"id": "c3"}, call_id="c3"),
    ]
    results = await run_tool_calls(runtime, inputs)
    assert [r.value for r in results] == ["c0", "c1", "c2", "c3"]  # type: ignore[union-attr]
    # The fast calls ran at once, overlapping the slow ones ...
    assert log == ["fast c1", "fast c3", "slow c2", "slow c0"]
    assert trio.current_time() == pytest.approx(2)
    # ... but post-execute and the observers still saw every call in model order.
    observed = [call_id for hook, call_id in recorder.events if hook == "dsh_result"]
    assert observed == ["c0", "c1", "c2", "c3"]
    post = [call_id for hook, call_id in recorder.events if hook == "dsh_post_execute"]
    assert post == ["c0", "c1", "c2", "c3"]


class Clock:
    """Records when each call's policy ran, that is, when the scheduler started it."""

    def __init__(self) -> None:
        self.started: list[tuple[str, float]] = []

    @hookimpl
    async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
        self.started.append((execution.call_id, trio.current_time()))
        return await next()


async def test_a_call_that_cannot_suspend_waits_for_a_free_slot_before_its_policy(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log: list[str] = []
    recorder = Recorder()
    runtime = mixed_runtime(log, recorder)
    inputs = [
        make_input("slow", {"id": "c0", "delay": 3}, call_id="c0"),
        make_input("fast", {"id": "c1"}, call_id="c1"),
    ]
    clock = Clock()
    runtime.plugins.register(clock)
    await run_tool_calls(runtime, inputs, max_parallel=1)
    assert clock.started == [("c0", 0), ("c1", 3)]
    assert log == ["slow c0", "fast c1"]


class SlowWrapper:
    """A dsh_execute wrapper that suspends around the body (the tool itself cannot)."""

    @hookimpl
    async def dsh_execute(self, execution: Any, next: Next) -> Any:
        await trio.sleep(1)
        return await next()


class SlowObserver:
    """An async dsh_result observer that suspends: committing a call can wait on it."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, float]] = []

    @hookimpl
    async def dsh_result(self, execution: ToolExecution, result: Any) -> None:
        await trio.sleep(1)
        self.seen.append((execution.call_id, trio.current_time()))


def fast_calls(count: int) -> list[Any]:
    return [make_input("fast", {"id": f"c{n}"}, call_id=f"c{n}") for n in range(count)]


async def test_inline_tools_still_overlap_when_a_wrapper_can_suspend(autojump_clock: trio.testing.MockClock) -> None:
    """A tool body that cannot suspend is not enough to run a call in the loop: its wrappers must not either."""
    runtime = mixed_runtime([], Recorder())
    clock = Clock()
    runtime.plugins.register(SlowWrapper())
    runtime.plugins.register(clock)
    results = await run_tool_calls(runtime, fast_calls(4))
    assert [r.value for r in results] == ["c0", "c1", "c2", "c3"]  # type: ignore[union-attr]
    assert clock.started == [(f"c{n}", 0) for n in range(4)]
    assert trio.current_time() == pytest.approx(1)  # four one-second waits overlapped


async def test_a_slow_observer_holds_back_commits_not_later_calls(autojump_clock: trio.testing.MockClock) -> None:
    """Observers see calls one by one in model order; the calls behind them start at once all the same."""
    runtime = mixed_runtime([], Recorder())
    clock, observer = Clock(), SlowObserver()
    runtime.plugins.register(observer)
    runtime.plugins.register(clock)
    results = await run_tool_calls(runtime, fast_calls(4))
    assert [r.value for r in results] == ["c0", "c1", "c2", "c3"]  # type: ignore[union-attr]
    assert clock.started == [(f"c{n}", 0) for n in range(4)]
    assert observer.seen == [(f"c{n}", n + 1) for n in range(4)]


async def test_a_tool_replaced_by_an_exclusive_one_while_policies_decide_runs_alone(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A host that hot-reloads a tool between classification and dispatch: the new contract is honoured."""
    from dsh_core import ToolRuntime, define_tool

    active: set[str] = set()
    overlaps: list[str] = []

    def version(exclusive: bool) -> Any:
        async def body(args: Any, run: Any) -> str:
            if active:
                overlaps.append(f"{run.call_id} (exclusive={exclusive}) beside {sorted(active)}")
            active.add(run.call_id)
            try:
                await trio.sleep(1)
            finally:
                active.discard(run.call_id)
            return "ok"

        return define_tool(name="t", description="t", parameters={}, output={"type": "string"}, execute=body,
                           is_concurrency_safe=None if exclusive else (lambda args: True))  # fmt: skip

    runtime = ToolRuntime()
    disposers = [runtime.register(version(exclusive=False))]

    class SlowGate:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
            await trio.sleep(0.1)
            return await next()

    runtime.plugins.register(SlowGate(), name="gate")

    async def swap() -> None:
        await trio.sleep(0.15)
        disposers[0]()
        runtime.register(version(exclusive=True))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(swap)
        results = await run_tool_calls(runtime, [make_input("t", call_id=f"c{i}") for i in range(1, 4)])
    assert [result.is_error for result in results] == [False, False, False]
    assert [o for o in overlaps if "exclusive=True" in o] == []


class CountingEvent:
    """A ``trio.Event`` that counts how often anyone asks whether it is set (``trio.Event`` cannot be subclassed)."""

    def __init__(self, reads: list[int]) -> None:
        self._event = trio.Event()
        self._reads = reads

    def is_set(self) -> bool:
        self._reads[0] += 1
        return self._event.is_set()

    def set(self) -> None:
        self._event.set()

    async def wait(self) -> None:
        await self._event.wait()


@pytest.mark.parametrize("keyed", [False, True])
async def test_starting_a_call_does_not_rescan_the_calls_already_in_flight(
    keyed: bool, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each dispatch's bookkeeping costs O(1): a scan of the in-flight calls per start made a turn quadratic."""
    import types

    from dsh_core import _scheduling

    reads = [0]

    class SchedulerEvent(CountingEvent):
        def __init__(self) -> None:
            super().__init__(reads)

    scheduler_trio = types.ModuleType("trio")
    scheduler_trio.__dict__.update(vars(trio))
    scheduler_trio.Event = SchedulerEvent  # type: ignore[attr-defined]
    monkeypatch.setattr(_scheduling, "trio", scheduler_trio)

    async def body(args: Any) -> str:
        await trio.sleep(1)
        return str(args["id"])

    calls = 300
    runtime = make_runtime(
        json_tool(
            "t",
            body,
            parameters={"id": {"type": "string", "required": True}},
            output={"type": "string"},
            is_concurrency_safe=lambda a: True,
            resource_keys=(lambda a: {"read": ["x"]}) if keyed else None,
        )
    )
    results = await run_tool_calls(runtime, [make_input("t", {"id": str(i)}) for i in range(calls)], max_parallel=calls)
    assert [r.value for r in results] == [str(i) for i in range(calls)]  # type: ignore[union-attr]
    assert trio.current_time() == pytest.approx(1)
    # A rescan on every start reads ~calls²/2 events (45 000 here); bookkeeping per call reads a constant few.
    assert reads[0] <= 2 * calls


@pytest.mark.parametrize("parallel", [True, False], ids=["parallel-safe", "exclusive"])
async def test_a_turn_of_inline_calls_stops_beginning_calls_once_its_scope_is_cancelled(parallel: bool) -> None:
    """Calls that settle inline never suspended: a cancelled turn ran every one, and returned them all."""
    ran: list[int] = []
    scope = trio.CancelScope()

    def body(args: Any) -> int:
        ran.append(args["i"])
        if args["i"] == 5:
            scope.cancel()  # the host's deadline passing while call 5 runs
        return int(args["i"])

    tool = json_tool("t", body, parameters={"i": {"type": "integer"}}, output={"type": "integer"},
                     is_concurrency_safe=(lambda args: True) if parallel else None)  # fmt: skip
    recorder = Recorder()
    runtime = make_runtime(tool, plugins=[recorder])
    with scope:
        await run_tool_calls(runtime, [make_input("t", {"i": i}) for i in range(100)])
    assert scope.cancelled_caught
    assert ran == list(range(6))  # call 6 was never begun


async def test_a_long_turn_of_inline_calls_lets_other_tasks_run() -> None:
    """2 000 calls that settle inline held the event loop for the whole turn: a heartbeat never ran."""
    from dsh_core import _scheduling

    beats = 0
    during: list[int] = []

    async def heartbeat() -> None:
        nonlocal beats
        while True:
            beats += 1
            await trio.lowlevel.checkpoint()

    def body(args: Any) -> int:
        during.append(beats)
        return 0

    tool = json_tool("t", body, output={"type": "integer"}, is_concurrency_safe=lambda args: True)
    runtime = make_runtime(tool)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(heartbeat)
        await trio.lowlevel.checkpoint()
        await run_tool_calls(runtime, [make_input("t", {}, call_id=f"c{n}") for n in range(2000)])
        nursery.cancel_scope.cancel()
    assert during[-1] - during[0] >= 2000 // _scheduling._CALLS_PER_YIELD - 2


@pytest.mark.parametrize("parallel", [True, False], ids=["parallel-safe", "exclusive"])
async def test_a_cut_turn_raises_a_bare_cancelled_whatever_its_calls_were(
    autojump_clock: trio.testing.MockClock, parallel: bool
) -> None:
    """A turn with tasks raised a group of Cancelled: a host's ``except trio.Cancelled`` missed it."""

    async def slow(args: Any) -> str:
        await trio.sleep(10)
        return "done"

    tool = json_tool("slow", slow, is_concurrency_safe=(lambda args: True) if parallel else None)
    runtime = make_runtime(tool)
    caught: list[BaseException] = []
    with trio.move_on_after(1):
        try:
            await run_tool_calls(runtime, [make_input("slow", call_id=f"c{n}") for n in range(3)])
        except trio.Cancelled as exc:
            caught.append(exc)
            raise
    assert len(caught) == 1


async def test_a_call_rewritten_into_the_exclusive_class_runs_as_an_exclusive_call_does(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """It was held apart only while its body ran: it overlapped an earlier call's post-execute, and later
    bodies ran during its own. Now it waits for earlier commits and holds later calls through its own."""
    from dsh_core import Rewrite

    spans: list[tuple[str, str, float, float]] = []

    async def body(args: Any) -> str:
        start = trio.current_time()
        await trio.sleep(1)
        spans.append((args["id"], "body", start, trio.current_time()))
        return str(args["id"])

    class RewriteAndSlowPost:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
            if execution.arguments["id"] == "R" and not execution.arguments.get("excl"):
                return Rewrite({**execution.arguments, "excl": True}, "must run alone")
            return await next()

        @hookimpl
        async def dsh_post_execute(self, execution: ToolExecution, result: Any, next: Next) -> Any:
            start = trio.current_time()
            await trio.sleep(2)
            spans.append((execution.arguments["id"], "post", start, trio.current_time()))
            return await next()

    tool = json_tool("t", body, parameters={"id": {"type": "string"}, "excl": {"type": "boolean"}},
                     output={"type": "string"}, is_concurrency_safe=lambda args: not args.get("excl", False))  # fmt: skip
    runtime = make_runtime(tool, plugins=[RewriteAndSlowPost()])
    outcomes: dict[str, list[tuple[str, float, float]]] = {}
    for name, middle in (("rewritten", {"id": "R"}), ("exclusive", {"id": "X", "excl": True})):
        spans.clear()
        begin = trio.current_time()
        await run_tool_calls(runtime, [make_input("t", {"id": "A"}), make_input("t", middle), make_input("t", {"id": "B"})])
        outcomes[name] = sorted((stage, s - begin, e - begin) for _, stage, s, e in spans)
    assert outcomes["rewritten"] == outcomes["exclusive"]
    # A's post-execute, then the middle call's body and post-execute, then B's body: one after another.
    assert outcomes["exclusive"] == [
        ("body", 0.0, 1.0), ("body", 3.0, 4.0), ("body", 6.0, 7.0),
        ("post", 1.0, 3.0), ("post", 4.0, 6.0), ("post", 7.0, 9.0),
    ]  # fmt: skip
