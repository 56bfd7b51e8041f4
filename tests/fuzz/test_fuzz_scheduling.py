"""Fuzz target: whole turns through ``run_tool_calls`` with a mix of scheduling classes.

Each turn mixes parallel, exclusive, inline, keyed, misclassified and
retrying tools with policies (deny, sleep, rewrite, re-register, swap to an
exclusive stand-in), ``ArgumentsText`` inputs (whole, cut, duplicate key),
optional async observers, post-execute delays and a timeout budget, and
fires per-call, shared and caller-scope cancellations at random virtual
times (``MockClock``).

Invariants: no exception escapes; every call gets exactly one result, in
input order, and one ``dsh_result``, in model order; every started body is
drained before ``run_tool_calls`` returns; no task is left running;
exclusive bodies (by the arguments they actually ran with) overlap nothing;
conflicting keyed bodies run one after the other in model order;
``ABORTED_BEFORE_DISPATCH`` means the body never started.
"""

from __future__ import annotations

import json
from typing import Any

import attrs
import trio
import trio.testing
from conftest_reliability import *  # noqa: F403 - fixtures
from conftest_reliability import FIGURES, TaskAudit
from fuzz_support import fuzz
from hypothesis import event
from hypothesis import strategies as st

from dsh_core import (
    ArgumentsText,
    CancelSignal,
    Deny,
    RetryPolicy,
    Rewrite,
    ToolExecutionInput,
    ToolRuntime,
    TransientToolError,
    define_tool,
    hookimpl,
    run_tool_calls,
)

KEYS = ["A", "B", "C"]
TOOLS = ["par", "ser", "inl", "key", "keyx", "keyrx", "rty"]


@attrs.define
class Run:
    tool: str
    start: float
    end: float | None = None
    args: Any = None


def claim_of(tool: str, args: Any) -> Any:
    """('x',) exclusive, ('p',) parallel, ('k', read, write) keyed — as documented, from the args."""
    if tool in ("ser", "par_x", "key_x"):
        return ("x",)
    if tool in ("par", "inl"):
        return ("p",)
    if tool == "keyx":
        if args["n"] % 3 == 0:
            return ("p",)
        if args["n"] % 3 == 1:
            return ("x",)
    if tool == "keyrx":
        return ("x",)  # resource_keys returns a malformed mapping
    write = frozenset(args["w"])
    return ("k", frozenset(args["r"]) - write, write)


def runs_tool(world: dict[str, Any], cid: str) -> str:
    return world["runs"][cid].tool if cid in world["runs"] else "?"


def conflict(a: Any, b: Any) -> bool:
    if a[0] != "k" or b[0] != "k":
        return False
    return bool(a[2] & b[2] or a[2] & b[1] or a[1] & b[2])


def build(
    world: dict[str, Any], policy: dict[str, str], extras: tuple[bool, bool, bool] = (False, False, False)
) -> ToolRuntime:
    runtime = ToolRuntime()
    params = {
        "n": {"type": "integer", "required": True},
        "d": {"type": "number", "required": True},
        "r": {"type": "array", "items": {"type": "string"}, "required": True},
        "w": {"type": "array", "items": {"type": "string"}, "required": True},
        "mode": {"type": "string", "required": True},
    }

    def make(tool: str) -> Any:
        if tool == "inl":

            def body(args: Any, run: Any) -> Any:
                world["runs"][run.call_id] = Run(tool, trio.current_time(), trio.current_time(), args)
                if args["mode"] == "raise":
                    raise ValueError("inline boom")
                return {"id": run.call_id}

            return body

        async def body(args: Any, run: Any) -> Any:
            world["attempts"][run.call_id] = world["attempts"].get(run.call_id, 0) + 1
            rec = world["runs"].get(run.call_id)
            if rec is None:
                rec = world["runs"][run.call_id] = Run(tool, trio.current_time(), None, args)
            rec.end = None
            try:
                if args["mode"] == "coop":
                    with trio.CancelScope(shield=True), trio.move_on_after(args["d"]):
                        await run.signal.wait()
                else:
                    await trio.sleep(args["d"])
                if args["mode"] == "raise":
                    raise TransientToolError("try again") if tool == "rty" else ValueError("boom")
                return {"id": run.call_id}
            finally:
                rec.end = trio.current_time()

        return body

    def keys_x(a: Any) -> Any:
        if a["n"] % 3 == 0:
            return None
        if a["n"] % 3 == 1:
            raise RuntimeError("classifier broke")
        return {"read": a["r"], "write": a["w"]}

    extra = {
        "par": {"is_concurrency_safe": lambda a: True},
        "ser": {},
        "inl": {"is_concurrency_safe": lambda a: True},
        "key": {"resource_keys": lambda a: {"read": a["r"], "write": a["w"]}},
        "keyx": {"resource_keys": keys_x, "is_concurrency_safe": lambda a: True},
        "keyrx": {"resource_keys": lambda a: {"read": a["r"], "write": a["w"], "other": []}},
        "rty": {
            "resource_keys": lambda a: {"read": a["r"], "write": a["w"]},
            "retry": RetryPolicy(max_attempts=3, initial_delay_s=0.3, jitter=0.0),
        },
    }
    if extras[2]:
        for name in ("par", "key", "rty"):
            extra[name] = dict(extra[name], timeout_ms=800)
    definitions = {}
    for tool in TOOLS:
        definitions[tool] = define_tool(
            name=tool,
            description=tool,
            parameters=params,
            output={
                "type": "object",
                "additionalProperties": False,
                "properties": {"id": {"type": "string", "required": True}},
            },
            execute=make(tool),
            **extra[tool],
        )
        world["disposers"][tool] = runtime.register(definitions[tool])
    # exclusive stand-ins registered under the same names by the "swap" policy
    for tool in ("par", "key"):
        definitions[tool + "_x"] = define_tool(
            name=tool,
            description=tool,
            parameters=params,
            output={
                "type": "object",
                "additionalProperties": False,
                "properties": {"id": {"type": "string", "required": True}},
            },
            execute=make(tool + "_x"),
        )

    class Policy:
        @hookimpl
        async def dsh_pre_execute(self, execution: Any, next: Any) -> Any:
            what = policy.get(execution.call_id, "pass")
            args = execution.arguments
            if what == "deny":
                return Deny("no")
            if what == "sleep":
                await trio.sleep(0.7)
            if what == "swap" and execution.name in ("par", "key"):
                name = execution.name
                world["disposers"][name]()
                current = world.setdefault("current", {}).get(name, name)
                other = name + "_x" if current == name else name
                world["current"][name] = other
                world["disposers"][name] = runtime.register(definitions[other])
            if what == "reregister" and execution.name in world["disposers"]:
                world["disposers"][execution.name]()
                world["disposers"][execution.name] = runtime.register(definitions[execution.name])
            if what.startswith("rewrite") and args["n"] < 1000:
                new = dict(args)
                new["n"] = args["n"] + 1000 + (1 if what == "rewrite_shift" else 0)
                new["w"] = ["A"] if what == "rewrite_keys" else list(args["w"])
                return Rewrite(new, "policy changed it")
            return await next()

    class Observer:
        @hookimpl
        def dsh_result(self, execution: Any, result: Any) -> None:
            world["order"].append(execution.call_id)

    class AsyncObserver:
        @hookimpl
        async def dsh_result(self, execution: Any, result: Any) -> None:
            world["order"].append(execution.call_id)
            if int(execution.call_id[1:]) % 2:
                await trio.sleep(0.4)

    class Post:
        @hookimpl
        async def dsh_post_execute(self, execution: Any, result: Any, next: Any) -> Any:
            if int(execution.call_id[1:]) % 3 == 1:
                await trio.sleep(0.5)
            return await next()

    if extras[2]:
        from dsh_plugins.timeout import TimeoutPolicy

        runtime.plugins.register(TimeoutPolicy(runtime), name="timeout-policy")
    runtime.plugins.register(Policy(), name="policy")
    runtime.plugins.register(AsyncObserver() if extras[0] else Observer(), name="observer")
    if extras[1]:
        runtime.plugins.register(Post(), name="post")
    return runtime


key_lists = st.lists(st.sampled_from(KEYS), max_size=2)
calls = st.lists(
    st.fixed_dictionaries(
        {
            "tool": st.sampled_from(TOOLS),
            "n": st.integers(0, 8),
            "d": st.sampled_from([0, 0.25, 1.0, 3.0]),
            "r": key_lists,
            "w": key_lists,
            "mode": st.sampled_from(["ok", "ok", "raise", "coop"]),
            "fire": st.none() | st.just(-1.0) | st.floats(0, 6).map(lambda x: round(x, 2)),
            "shared": st.booleans(),
            "policy": st.sampled_from(
                ["pass", "pass", "pass", "deny", "sleep", "rewrite_keys", "rewrite_shift", "reregister", "swap"]
            ),
            "text": st.sampled_from([None, None, "ok", "bad", "dup"]),
        }
    ),
    min_size=1,
    max_size=9,
)

turns = st.tuples(
    calls,
    st.sampled_from([1, 2, 3, 10]),
    st.none() | st.floats(0, 6).map(lambda x: round(x, 2)),
    st.none() | st.floats(0, 6).map(lambda x: round(x, 2)),
    st.tuples(st.booleans(), st.booleans(), st.booleans()),
)


def turn_target(case: tuple[list[dict[str, Any]], int, float | None, float | None, tuple[bool, bool, bool]]) -> None:
    plan, max_parallel, shared_fire, outer_cancel, extras = case
    world: dict[str, Any] = {"runs": {}, "order": [], "disposers": {}, "attempts": {}}
    policy = {f"c{i}": c["policy"] for i, c in enumerate(plan)}
    runtime = build(world, policy, extras)
    state: dict[str, Any] = {}
    shared = CancelSignal()
    signals: list[CancelSignal] = []

    async def main() -> None:
        inputs = []
        timed = []
        if shared_fire is not None:
            timed.append((shared_fire, shared))
        for i, c in enumerate(plan):
            own = CancelSignal()
            if c["fire"] == -1.0:
                own.cancel("pre")
            elif c["fire"] is not None:
                timed.append((c["fire"], own))
            signal = CancelSignal.any(own, shared) if c["shared"] else own
            signals.append(signal)
            args: Any = {k: c[k] for k in ("n", "d", "r", "w", "mode")}
            if c["text"] == "ok":
                args = ArgumentsText(json.dumps(args))
            elif c["text"] == "bad":
                args = ArgumentsText(json.dumps(args)[:-3])
            elif c["text"] == "dup":
                args = ArgumentsText(json.dumps(args)[:-1] + ', "n": 5}')
            inputs.append(ToolExecutionInput(call_id=f"c{i}", name=c["tool"], arguments=args, signal=signal))
        state["pre"] = [s.cancelled for s in signals]
        async with trio.open_nursery() as nursery:

            async def fire_all() -> None:
                for at, sig in sorted(timed, key=lambda x: x[0]):
                    await trio.sleep_until(at)
                    sig.cancel("fired")

            nursery.start_soon(fire_all)
            with (
                TaskAudit() as audit,
                trio.CancelScope(deadline=outer_cancel if outer_cancel is not None else float("inf")) as scope,
            ):
                state["results"] = await run_tool_calls(runtime, inputs, max_parallel=max_parallel)
            state["live"] = [t.name for t in audit.live]
            state["outer_hit"] = scope.cancelled_caught
            state["undrained"] = [k for k, r in world["runs"].items() if r.end is None]
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    FIGURES.cancellations += sum(c["fire"] is not None for c in plan) + (shared_fire is not None)
    problems: list[str] = []
    if state["live"]:
        problems.append(f"tasks left running: {state['live']}")
    if state["undrained"]:
        problems.append(f"bodies not drained: {state['undrained']}")
    ids = [f"c{i}" for i in range(len(plan))]
    results = state.get("results")
    if results is not None:
        FIGURES.results += len(results)
    if state["outer_hit"]:
        event("outer cancel")
        if results is not None:
            problems.append("results although the caller's scope was cancelled")
        if world["order"] != ids[: len(world["order"])]:
            problems.append(f"observer order {world['order']}")
    else:
        if results is None or len(results) != len(plan):
            problems.append(f"{None if results is None else len(results)} results for {len(plan)} calls")
        elif world["order"] != ids:
            problems.append(f"observer order {world['order']} != {ids}")
        else:
            for i, (cid, r) in enumerate(zip(ids, results, strict=False)):
                event(f"code={getattr(r, 'code', 'ok')}")
                ran = cid in world["runs"]
                if not r.is_error and r.value["id"] != cid:
                    problems.append(f"{cid}: result of {r.value['id']}")
                if r.is_error and r.code == "ABORTED_BEFORE_DISPATCH" and ran:
                    problems.append(f"{cid}: ABORTED_BEFORE_DISPATCH although its body ran")
                if r.is_error and r.code == "ABORTED" and not ran:
                    problems.append(f"{cid}: ABORTED although its body never ran")
                # BEHAVIOUR: argument-materialisation failure > everything (a bad/dup text wins over a pre-fired signal)
                expect = "INVALID_ARGS" if plan[i]["text"] in ("bad", "dup") else "ABORTED_BEFORE_DISPATCH"
                if state["pre"][i] and (ran or not r.is_error or r.code != expect):
                    problems.append(f"{cid}: pre-fired call got {r!r}")
                denied_ok = r.is_error and (
                    r.code == "DENIED" or (signals[i].cancelled and r.code == "ABORTED_BEFORE_DISPATCH")
                )
                if (
                    plan[i]["policy"] == "deny"
                    and plan[i]["text"] not in ("bad", "dup")
                    and not state["pre"][i]
                    and not denied_ok
                ):
                    problems.append(f"{cid}: denied call got {getattr(r, 'code', 'ok')}")
    for cid, n in world["attempts"].items():
        if n > 3 or (n > 1 and runs_tool(world, cid) != "rty"):
            problems.append(f"{cid}: body ran {n} times")
    if results is not None and not state["outer_hit"]:
        for i, (cid, r) in enumerate(zip(ids, results, strict=False)):
            if r.is_error and r.code == "TOOL_TIMEOUT":
                run = world["runs"].get(cid)
                if not extras[2] or run is None or run.tool not in ("par", "key", "rty"):
                    problems.append(f"{cid}: TOOL_TIMEOUT without a budget")
                elif (
                    run.tool != "rty" and run.end is not None and run.end - run.start < 0.8 - 1e-9
                ):  # rty: pauses count too
                    problems.append(f"{cid}: TOOL_TIMEOUT after {run.end - run.start}")
            if (
                plan[i]["tool"] == "rty"
                and plan[i]["mode"] == "raise"
                and not signals[i].cancelled
                and not extras[2]
                and r.is_error
                and r.code == "TOOL_ERROR"
                and world["attempts"].get(cid) != 3
            ):
                problems.append(f"{cid}: transient failure retried {world['attempts'].get(cid)} times, not 3")
    # scheduling, by the arguments each body ran with
    runs = world["runs"]
    claims = {cid: claim_of(run.tool, run.args) for cid, run in runs.items()}
    ran_ids = [c for c in ids if c in runs]
    for a_index, a in enumerate(ran_ids):
        for b in ran_ids[a_index + 1 :]:
            ra, rb = runs[a], runs[b]
            if ra.end is None or rb.end is None:
                continue
            overlap = ra.start < rb.end and rb.start < ra.end
            if overlap and ("x",) in (claims[a], claims[b]):
                problems.append(f"exclusive overlap {a}({claims[a]}) {b}({claims[b]}) {ra} {rb}")
            if conflict(claims[a], claims[b]) and rb.start < ra.end:
                problems.append(f"conflicting keyed {b} started at {rb.start} before {a} ended at {ra.end}")
    if state["undrained"]:
        FIGURES.bodies_not_drained += len(state["undrained"])
    if not state["outer_hit"] and (results is None or len(results) != len(plan)):
        FIGURES.results_lost += 1
    assert not problems, "\n".join(problems[:10])


def test_fuzz_run_tool_calls_scheduling() -> None:
    assert fuzz(turns, turn_target) > 0
