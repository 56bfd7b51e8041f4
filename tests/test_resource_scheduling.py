"""run_tool_calls with resource keys: disjoint calls overlap, conflicting ones serialise in model order."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given, settings
from hypothesis import strategies as st

from dsh_core import CancelSignal, _scheduling, run_tool_calls
from dsh_core._execution import PARALLEL
from dsh_core._resources import ResourceClaim, parse_claim
from dsh_core.testing import json_tool, make_input, make_runtime

Spans = dict[str, tuple[float, float]]


def keyed_tool(name: str, spans: Spans, keys: Any, *, seconds: float = 1, parallel: bool | None = None) -> Any:
    async def body(args: Any) -> str:
        start = trio.current_time()
        await trio.sleep(seconds)
        spans[args["id"]] = (start, trio.current_time())
        return str(args["id"])

    return json_tool(
        name,
        body,
        parameters={"id": {"type": "string", "required": True}, "keys": {"type": "json"}},
        output={"type": "string"},
        resource_keys=keys,
        is_concurrency_safe=(lambda args: parallel) if parallel is not None else None,
    )


def from_args(args: Any) -> Any:
    return args["keys"]


def call(call_id: str, read: tuple[str, ...] = (), write: tuple[str, ...] = (), name: str = "k") -> Any:
    return make_input(name, {"id": call_id, "keys": {"read": list(read), "write": list(write)}}, call_id=call_id)


def overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


async def test_writes_to_disjoint_keys_overlap(autojump_clock: trio.testing.MockClock) -> None:
    spans: Spans = {}
    runtime = make_runtime(keyed_tool("k", spans, from_args))
    await run_tool_calls(runtime, [call("a", write=("x",)), call("b", write=("y",)), call("c", write=("z",))])
    assert trio.current_time() == pytest.approx(1)


async def test_writes_to_one_key_serialise_in_model_order(autojump_clock: trio.testing.MockClock) -> None:
    spans: Spans = {}
    runtime = make_runtime(keyed_tool("k", spans, from_args))
    results = await run_tool_calls(runtime, [call("a", write=("x",)), call("b", write=("x",)), call("c", write=("x",))])
    assert trio.current_time() == pytest.approx(3)
    assert spans["a"][1] <= spans["b"][0] and spans["b"][1] <= spans["c"][0]
    assert [r.value for r in results] == ["a", "b", "c"]  # type: ignore[union-attr]


async def test_readers_of_one_key_overlap_but_wait_for_an_earlier_writer(
    autojump_clock: trio.testing.MockClock,
) -> None:
    spans: Spans = {}
    runtime = make_runtime(keyed_tool("k", spans, from_args))
    await run_tool_calls(
        runtime, [call("w", write=("x",)), call("r1", read=("x",)), call("r2", read=("x",)), call("w2", write=("x",))]
    )
    assert spans["r1"][0] >= spans["w"][1] and spans["r2"][0] >= spans["w"][1]
    assert overlap(spans["r1"], spans["r2"])
    assert spans["w2"][0] >= max(spans["r1"][1], spans["r2"][1])  # a write waits for the readers before it
    assert trio.current_time() == pytest.approx(3)


async def test_a_later_call_on_other_keys_does_not_wait_behind_a_blocked_one(
    autojump_clock: trio.testing.MockClock,
) -> None:
    spans: Spans = {}
    runtime = make_runtime(keyed_tool("k", spans, from_args))
    await run_tool_calls(runtime, [call("a", write=("x",)), call("b", write=("x",)), call("c", write=("y",))])
    assert spans["c"][0] == pytest.approx(0)
    assert spans["b"][0] == pytest.approx(1)


async def test_a_key_both_read_and_written_counts_as_a_write(autojump_clock: trio.testing.MockClock) -> None:
    spans: Spans = {}
    runtime = make_runtime(keyed_tool("k", spans, from_args))
    await run_tool_calls(runtime, [call("a", read=("x",), write=("x",)), call("b", read=("x",))])
    assert spans["b"][0] >= spans["a"][1]


async def test_an_unkeyed_exclusive_call_stays_a_full_barrier(autojump_clock: trio.testing.MockClock) -> None:
    spans: Spans = {}
    runtime = make_runtime(keyed_tool("k", spans, from_args), keyed_tool("plain", spans, None))
    inputs = [
        call("a", write=("x",)),
        make_input("plain", {"id": "barrier"}, call_id="barrier"),
        call("b", write=("y",)),
    ]
    await run_tool_calls(runtime, inputs)
    assert spans["barrier"][0] >= spans["a"][1]
    assert spans["b"][0] >= spans["barrier"][1]
    assert trio.current_time() == pytest.approx(3)


async def test_unkeyed_parallel_calls_overlap_with_keyed_ones(autojump_clock: trio.testing.MockClock) -> None:
    spans: Spans = {}
    runtime = make_runtime(keyed_tool("k", spans, from_args), keyed_tool("safe", spans, None, parallel=True))
    await run_tool_calls(
        runtime, [call("a", write=("x",)), make_input("safe", {"id": "s"}, call_id="s"), call("b", write=("x",))]
    )
    assert overlap(spans["a"], spans["s"])
    assert spans["b"][0] >= spans["a"][1]
    assert trio.current_time() == pytest.approx(2)


async def test_keys_take_precedence_over_is_concurrency_safe(autojump_clock: trio.testing.MockClock) -> None:
    spans: Spans = {}
    # Exclusive by its classifier, but its keys say the two calls are disjoint.
    runtime = make_runtime(keyed_tool("k", spans, from_args, parallel=False))
    await run_tool_calls(runtime, [call("a", write=("x",)), call("b", write=("y",))])
    assert trio.current_time() == pytest.approx(1)


@pytest.mark.parametrize(
    "keys",
    [
        lambda args: 42,
        lambda args: {"write": "x"},
        lambda args: {"write": [1]},
        lambda args: {"writes": ["x"]},
        lambda args: {"write": [""]},
        lambda args: _UnreadableMapping(),
        lambda args: {"write": _UnreadableList(["a"])},
    ],
)
async def test_malformed_keys_make_the_call_exclusive(autojump_clock: trio.testing.MockClock, keys: Any) -> None:
    spans: Spans = {}
    runtime = make_runtime(keyed_tool("bad", spans, keys, parallel=True))
    await run_tool_calls(runtime, [make_input("bad", {"id": str(i)}) for i in range(3)])
    assert trio.current_time() == pytest.approx(3)


class _UnreadableMapping(Mapping[str, Any]):
    """Keys that raise while the scheduler reads them: as malformed as any other garbage."""

    def __getitem__(self, key: str) -> Any:
        raise KeyError(key)

    def __len__(self) -> int:
        return 1

    def __iter__(self) -> Any:
        raise RuntimeError("garbage mapping")


class _UnreadableList(list[str]):
    def __iter__(self) -> Any:
        raise RuntimeError("garbage list")


async def test_raising_keys_make_the_call_exclusive(autojump_clock: trio.testing.MockClock) -> None:
    def boom(args: Any) -> Any:
        raise RuntimeError("no keys today")

    spans: Spans = {}
    runtime = make_runtime(keyed_tool("bad", spans, boom, parallel=True))
    await run_tool_calls(runtime, [make_input("bad", {"id": str(i)}) for i in range(2)])
    assert trio.current_time() == pytest.approx(2)


async def test_no_keys_for_these_arguments_falls_back_to_the_classifier(
    autojump_clock: trio.testing.MockClock,
) -> None:
    spans: Spans = {}
    runtime = make_runtime(keyed_tool("k", spans, lambda args: None, parallel=True))
    await run_tool_calls(runtime, [make_input("k", {"id": str(i)}) for i in range(3)])
    assert trio.current_time() == pytest.approx(1)


async def test_max_parallel_still_bounds_keyed_calls(autojump_clock: trio.testing.MockClock) -> None:
    spans: Spans = {}
    runtime = make_runtime(keyed_tool("k", spans, from_args))
    await run_tool_calls(runtime, [call(str(i), write=(f"key{i}",)) for i in range(6)], max_parallel=2)
    assert trio.current_time() == pytest.approx(3)


async def test_a_call_waiting_on_a_conflict_is_aborted_by_its_signal(autojump_clock: trio.testing.MockClock) -> None:
    spans: Spans = {}
    runtime = make_runtime(keyed_tool("k", spans, from_args, seconds=10))
    first = call("a", write=("x",))
    signal = CancelSignal()
    waiting = make_input("k", {"id": "b", "keys": {"write": ["x"]}}, call_id="b", signal=signal)

    async def stop() -> None:
        await trio.sleep(1)
        signal.cancel()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(stop)
        results = await run_tool_calls(runtime, [first, waiting])
    assert not results[0].is_error
    assert results[1].is_error and results[1].code == "ABORTED_BEFORE_DISPATCH"
    assert "b" not in spans


def test_claims_conflict_only_on_a_write() -> None:
    def claim(read: set[str], write: set[str]) -> ResourceClaim:
        return ResourceClaim(read=frozenset(read), write=frozenset(write))

    assert claim({"x"}, set()).conflicts_with(claim(set(), {"x"}))
    assert claim(set(), {"x"}).conflicts_with(claim(set(), {"x"}))
    assert not claim({"x"}, set()).conflicts_with(claim({"x"}, set()))
    assert not claim(set(), {"x"}).conflicts_with(claim(set(), {"y"}))
    assert parse_claim({"read": ["x"], "write": ["x"]}) == claim(set(), {"x"})
    assert parse_claim({}) == claim(set(), set())


# -- serial equivalence --------------------------------------------------------------------------

KEYS = ("a", "b", "c")

calls_strategy = st.lists(
    st.tuples(
        st.frozensets(st.sampled_from(KEYS), max_size=2),  # reads
        st.frozensets(st.sampled_from(KEYS), max_size=2),  # writes
        st.integers(min_value=0, max_value=3),  # delay before reading
        st.integers(min_value=0, max_value=3),  # delay between reading and writing
    ),
    min_size=1,
    max_size=8,
)


def run_against_store(
    specs: list[tuple[frozenset[str], frozenset[str], int, int]], *, max_parallel: int | None
) -> tuple[list[Any], dict[str, str], float]:
    """Run keyed read/write calls against an in-memory store: what each read saw, the final store, the time taken."""
    store = dict.fromkeys(KEYS, "initial")

    async def body(args: Any) -> Any:
        await trio.sleep(args["before"])
        seen = {key: store[key] for key in sorted(args["read"])}
        await trio.sleep(args["between"])
        for key in args["write"]:
            store[key] = args["id"]
        return seen

    tool = json_tool(
        "op",
        body,
        resource_keys=lambda args: {"read": list(args["read"]), "write": list(args["write"])},
    )
    runtime = make_runtime(tool)
    inputs = [
        make_input(
            "op",
            {"id": f"c{i}", "read": sorted(r), "write": sorted(w), "before": before, "between": between},
            call_id=f"c{i}",
        )
        for i, (r, w, before, between) in enumerate(specs)
    ]

    async def main() -> list[Any]:
        if max_parallel is None:  # the reference: one call after the other, in model order
            results = [await runtime.execute(request) for request in inputs]
        else:
            results = await run_tool_calls(runtime, inputs, max_parallel=max_parallel)
        return [result.value for result in results]  # type: ignore[union-attr]

    clock = trio.testing.MockClock(autojump_threshold=0)
    seen = trio.run(main, clock=clock)
    return seen, store, clock.current_time()


@settings(max_examples=150, deadline=None)
@given(specs=calls_strategy, max_parallel=st.integers(min_value=1, max_value=8))
def test_keyed_calls_have_the_effects_of_a_serial_run(
    specs: list[tuple[frozenset[str], frozenset[str], int, int]], max_parallel: int
) -> None:
    seen, store, _ = run_against_store(specs, max_parallel=max_parallel)
    serial_seen, serial_store, _ = run_against_store(specs, max_parallel=None)
    assert seen == serial_seen
    assert store == serial_store


def test_disjoint_calls_really_overlap_in_the_store_run() -> None:
    # Guards the property against a scheduler that is serial-equivalent only by being serial.
    specs = [(frozenset[str](), frozenset({key}), 1, 1) for key in KEYS]
    assert run_against_store(specs, max_parallel=8)[2] == pytest.approx(2)
    assert run_against_store(specs, max_parallel=None)[2] == pytest.approx(6)


def test_ignoring_the_keys_breaks_serial_equivalence(monkeypatch: pytest.MonkeyPatch) -> None:
    # The property can fail: with every call treated as parallel, a read overtakes an earlier write.
    specs = [(frozenset[str](), frozenset({"a"}), 0, 3), (frozenset({"a"}), frozenset[str](), 1, 0)]
    serial = run_against_store(specs, max_parallel=None)
    monkeypatch.setattr(_scheduling, "classify_call", lambda runtime, request: PARALLEL)
    ignoring = run_against_store(specs, max_parallel=8)
    assert serial[0] == [{}, {"a": "c0"}]
    assert ignoring[0] == [{}, {"a": "initial"}]


async def test_a_keyed_call_that_cannot_suspend_still_waits_for_an_earlier_conflicting_one(
    autojump_clock: trio.testing.MockClock,
) -> None:
    spans: Spans = {}
    order: list[str] = []

    async def instant(args: Any) -> str:
        order.append(str(args["id"]))
        spans[args["id"]] = (trio.current_time(), trio.current_time())
        return str(args["id"])

    quick = json_tool(
        "q", instant, parameters={"id": {"type": "string", "required": True}, "keys": {"type": "json"}},
        output={"type": "string"}, resource_keys=from_args,
    )  # fmt: skip
    runtime = make_runtime(keyed_tool("k", spans, from_args, seconds=2), quick)
    assert runtime.get("q").inline
    results = await run_tool_calls(
        runtime, [call("a", write=("x",)), call("b", write=("x",), name="q"), call("c", write=("y",), name="q")]
    )
    assert [r.value for r in results] == ["a", "b", "c"]  # type: ignore[union-attr]
    assert spans["b"][0] == pytest.approx(2)  # after the writer it conflicts with
    assert spans["c"][0] == pytest.approx(0)  # a disjoint key does not wait
    assert order == ["c", "b"]


@pytest.mark.parametrize("option", ["is_concurrency_safe", "resource_keys"])
def test_an_async_classifier_is_refused_when_the_tool_is_defined(option: str) -> None:
    """Accepted, it returned a coroutine as each call was scheduled: every call then ran alone, silently."""

    async def classify(args: Any) -> Any:
        return True

    class Classifier:
        async def __call__(self, args: Any) -> Any:
            return True

    for classifier in (classify, Classifier(), functools.partial(classify)):
        with pytest.raises(TypeError, match=f"{option} must be a plain function .* not an async one"):
            json_tool("t", **{option: classifier})
    json_tool("t", **{option: lambda args: None})  # a plain one is taken as before


def replacing_tool(spans: Spans, replacement: Any, runtime_box: list[Any]) -> Any:
    """A keyed writer whose first call replaces the tool (a hot reload, an MCP refresh) as it runs."""
    disposers: list[Any] = []

    async def body(args: Any) -> str:
        start = trio.current_time()
        if args["id"] == "first":
            disposers.pop()()
            runtime_box[0].register(replacement)
        await trio.sleep(1)
        spans[args["id"]] = (start, trio.current_time())
        return str(args["id"])

    tool = json_tool(
        "k", body, parameters={"id": {"type": "string", "required": True}, "keys": {"type": "json"}},
        output={"type": "string"}, resource_keys=from_args,
    )  # fmt: skip
    return tool, disposers


@pytest.mark.parametrize(
    ("replacement_keys", "refused"),
    [
        (None, True),  # no keys, not concurrency-safe: it must run alone
        (lambda args: {"write": ["other"]}, True),  # a key no earlier call was ordered against
        (lambda args: {"read": ["x"]}, False),  # within the claim it waited for: run as it is now
        (lambda args: None, False),  # no keys for these arguments, and concurrency-safe: parallel
    ],
    ids=["exclusive", "other-keys", "within-claim", "parallel"],
)
async def test_a_tool_replaced_while_a_call_waits_for_its_key_runs_only_within_its_schedule(
    autojump_clock: trio.testing.MockClock, replacement_keys: Any, refused: bool
) -> None:
    """The waiting call was admitted under the old tool's keys: a replacement outside them must not run.

    It used to run whatever was registered when the wait ended, so an exclusive replacement ran beside a
    parallel call still in flight.
    """
    spans: Spans = {}
    runtime_box: list[Any] = []
    replacement = keyed_tool("k", spans, replacement_keys, parallel=True if replacement_keys is not None else None)
    tool, disposers = replacing_tool(spans, replacement, runtime_box)
    runtime = make_runtime(keyed_tool("slow", spans, None, seconds=5, parallel=True))
    runtime_box.append(runtime)
    disposers.append(runtime.register(tool))
    slow = make_input("slow", {"id": "slow"}, call_id="slow")
    results = await run_tool_calls(runtime, [slow, call("first", write=("x",)), call("second", write=("x",))])
    assert [r.is_error for r in results[:2]] == [False, False]
    second = results[2]
    if refused:
        assert second.is_error
        assert second.error.info is not None and second.error.info.code == "TOOL_ERROR"  # type: ignore[union-attr]
        assert second.error.info.name == "ToolReplacedError"  # type: ignore[union-attr]
        assert 'tool "k" was replaced while this call waited to run' in second.error.message  # type: ignore[union-attr]
        assert "second" not in spans  # neither body ran
    else:
        assert not second.is_error, second
        assert spans["second"] == (pytest.approx(1), pytest.approx(2))  # the replacement, after "first"


def test_what_a_schedule_admits() -> None:
    from dsh_core._execution import EXCLUSIVE
    from dsh_core._resources import admits

    claim = ResourceClaim(read=frozenset({"r"}), write=frozenset({"w"}))
    assert admits(claim, PARALLEL) and admits(PARALLEL, PARALLEL)
    assert not admits(claim, EXCLUSIVE) and not admits(PARALLEL, EXCLUSIVE)
    assert admits(claim, ResourceClaim(read=frozenset({"r", "w"})))  # reading what it may write
    assert admits(claim, ResourceClaim(write=frozenset({"w"})))
    assert not admits(claim, ResourceClaim(write=frozenset({"r"})))  # writing what it only reads
    assert not admits(claim, ResourceClaim(read=frozenset({"elsewhere"})))
    assert admits(PARALLEL, ResourceClaim())  # keys that conflict with nothing
    assert not admits(PARALLEL, ResourceClaim(read=frozenset({"r"})))


def test_the_key_index_drops_readers_that_have_settled() -> None:
    """A Code Mode program reading one key over and over grew one list without bound (s20 capabilities audit)."""
    from dsh_core._resources import KeyIndex, ResourceClaim

    index = KeyIndex()
    read = ResourceClaim(read=frozenset({"config.json"}))
    pending = trio.Event()
    assert index.claim(read, pending) == []
    for _ in range(10_000):
        settled = trio.Event()
        index.claim(read, settled)
        settled.set()
    assert len(index._readers["config.json"]) <= 128
    # A writer still waits for the reader that has not settled, and only for it.
    assert index.claim(ResourceClaim(write=frozenset({"config.json"})), trio.Event()) == [pending]
