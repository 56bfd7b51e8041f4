"""Argument rewrites (Rewrite): validated, re-decided by every policy, told to the model, scheduled safely."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from dsh_core import (
    MAX_REWRITES,
    Agent,
    Allow,
    Ask,
    CancelSignal,
    Deny,
    Rewrite,
    ToolExecution,
    ToolExecutionToken,
    ToolRuntime,
    define_tool,
    hookimpl,
    run_tool_calls,
    trace_of,
)
from dsh_core.testing import (
    FakeCodeRuntime,
    Recorder,
    StaticApproval,
    expect_failure,
    expect_success,
    make_input,
    make_runtime,
)

Next = Callable[[], Awaitable[Any]]
MAIN = Agent("main")


def path_tool(name: str = "read", seen: list[Any] | None = None, **options: Any) -> Any:
    async def body(args: Any) -> str:
        if seen is not None:
            seen.append(dict(args))
        return f"read {args['path']}"

    return define_tool(
        name=name,
        description="reads a path",
        parameters={"path": {"type": "string", "required": True}, "lines": {"type": "integer"}},
        output={"type": "string"},
        execute=body,
        **options,
    )


class RewritePath:
    """Rewrites ``path`` values it knows; records the arguments it saw on each pass."""

    def __init__(self, mapping: Mapping[str, str], reason: str = "normalised the path") -> None:
        self.mapping = dict(mapping)
        self.reason = reason
        self.seen: list[dict[str, Any]] = []
        self.tokens: list[object] = []

    @hookimpl
    async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
        self.seen.append(dict(execution.arguments))
        self.tokens.append(execution.token)
        decision = await next()
        path = execution.arguments.get("path")
        if isinstance(decision, Allow) and path in self.mapping:
            return Rewrite({**execution.arguments, "path": self.mapping[path]}, self.reason)
        return decision


class DenyEtc:
    def __init__(self) -> None:
        self.seen: list[str] = []

    @hookimpl
    async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
        self.seen.append(execution.arguments["path"])
        if execution.arguments["path"].startswith("/etc"):
            return Deny("nothing under /etc")
        return await next()




@pytest.mark.parametrize("field", ["arguments", "name"])
async def test_assigning_to_the_execution_fails_naming_rewrite(field: str) -> None:
    # "can't set attribute" told neither the plugin's author nor the model what to do instead.
    class AssignsArguments:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
            setattr(execution, field, {"path": "b"})
            return await next()

    seen: list[Any] = []
    runtime = make_runtime(path_tool(seen=seen))
    runtime.plugins.register(AssignsArguments(), name="assigns")
    failure = expect_failure(await runtime.execute(make_input("read", {"path": "a"})))
    assert failure.error.info.code == "POLICY_ERROR" and failure.error.info.plugin == "assigns"
    assert failure.error.message == (
        f"ToolExecution.{field} is read-only; a dsh_pre_execute listener changes a call's arguments "
        "by returning Rewrite(arguments, reason)"
    )
    assert seen == []


def test_the_execution_refusal_is_still_a_frozen_instance_error() -> None:
    execution = ToolExecution(
        call_id="c", root_call_id="c", name="t", arguments={}, signal=CancelSignal(), token=ToolExecutionToken()
    )
    with pytest.raises(attrs.exceptions.FrozenInstanceError, match=r"ToolExecution\.arguments is read-only"):
        execution.arguments = {}  # type: ignore[misc]
    with pytest.raises(attrs.exceptions.FrozenInstanceError, match=r"ToolExecution\.name is read-only"):
        del execution.name  # type: ignore[misc]


async def test_the_body_runs_with_the_rewritten_arguments_and_the_model_is_told() -> None:
    seen: list[Any] = []
    rewriter = RewritePath({"./a.txt": "a.txt"})
    runtime = make_runtime(path_tool(seen=seen))
    runtime.plugins.register(rewriter, name="paths")
    result = expect_success(await runtime.execute(make_input("read", {"path": "./a.txt", "lines": 3}, call_id="c-1")))
    assert seen == [{"path": "a.txt", "lines": 3}]
    assert result.value == "read a.txt"
    [note] = result.additional_contexts
    text = note.content[0].text  # type: ignore[union-attr]
    assert "changed by" in text and "normalised the path" in text
    assert '"path": "a.txt"' in text
    assert note.meta == {  # what a host's log or UI needs to show the change
        "rewrite": {
            "by": "paths",
            "reason": "normalised the path",
            "from": {"path": "./a.txt", "lines": 3},
            "to": {"path": "a.txt", "lines": 3},
        }
    }
    # Two passes: the original, then the rewritten call, which the rewriter leaves alone.
    assert rewriter.seen == [{"path": "./a.txt", "lines": 3}, {"path": "a.txt", "lines": 3}]
    assert rewriter.tokens[0] is rewriter.tokens[1]


@pytest.mark.parametrize("deny_first", [True, False], ids=["denier-registered-first", "denier-registered-last"])
async def test_a_rewrite_cannot_carry_a_call_past_another_policy(deny_first: bool) -> None:
    seen: list[Any] = []
    rewriter, denier = RewritePath({"notes.txt": "/etc/shadow"}), DenyEtc()
    plugins = [denier, rewriter] if deny_first else [rewriter, denier]
    runtime = make_runtime(path_tool(seen=seen), plugins=plugins)
    result = expect_failure(await runtime.execute(make_input("read", {"path": "notes.txt"})))
    assert result.code == "DENIED"
    assert result.error.message == "nothing under /etc"
    assert seen == []
    assert denier.seen == ["notes.txt", "/etc/shadow"]
    [note] = result.additional_contexts  # the model learns what was judged
    assert "/etc/shadow" in note.content[0].text  # type: ignore[union-attr]


async def test_guards_judge_the_rewritten_arguments() -> None:
    runtime = make_runtime(path_tool(), plugins=[RewritePath({"a": "secret"})])
    runtime.guard(lambda execution: "no secrets" if execution.arguments["path"] == "secret" else None)
    result = expect_failure(await runtime.execute(make_input("read", {"path": "a"})))
    assert (result.code, result.error.message) == ("DENIED", "no secrets")


async def test_approval_is_asked_about_the_rewritten_call() -> None:
    asked: list[Any] = []

    class AskAlways:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
            decision = await next()
            return Ask("check it") if isinstance(decision, Allow) else decision

    class Approver(StaticApproval):
        async def request(self, execution: ToolExecution, reason: str | None) -> str:
            asked.append(execution.arguments["path"])
            return "allowed-once"

    # The rewriter is innermost: the asker passes its Rewrite on, and asks on the second pass.
    runtime = make_runtime(path_tool(), plugins=[RewritePath({"a": "b"}), AskAlways()], approval=Approver())
    result = expect_success(await runtime.execute(make_input("read", {"path": "a"}, agent=MAIN)))
    assert result.value == "read b"
    assert asked == ["b"]


async def test_rewritten_arguments_that_break_the_schema_fail_naming_the_plugin() -> None:
    class Breaks:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
            await next()
            return Rewrite({"path": 42}, "made it a number")

    seen: list[Any] = []
    runtime = make_runtime(path_tool(seen=seen))
    runtime.plugins.register(Breaks(), name="breaks-things")
    result = expect_failure(await runtime.execute(make_input("read", {"path": "a"})))
    assert result.code == "INVALID_ARGS"
    assert result.error.message.startswith("arguments rewritten by breaks-things are invalid:")
    assert result.error.info is not None and result.error.info.plugin == "breaks-things"
    assert seen == []


def _deep_list(depth: int) -> list[Any]:
    node: list[Any] = []
    for _ in range(depth):
        node = [node]
    return node


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: Rewrite({"path": float("nan")}, "r"), "Rewrite arguments must be lossless JSON"),
        (lambda: Rewrite(["a"], "r"), "Rewrite arguments must be an object"),
        (lambda: Rewrite({"path": "a"}, ""), "Rewrite needs a non-empty reason string"),
        (lambda: Rewrite({"path": "a"}, None), "Rewrite needs a non-empty reason string"),
        (lambda: Rewrite({"path": "a"}, _deep_list(100_000)), "Rewrite needs a non-empty reason string"),
        (lambda: Deny(_deep_list(100_000)), "Deny needs a non-empty reason string"),  # type: ignore[arg-type]
    ],
    ids=["nan", "array", "empty-reason", "no-reason", "reason-too-deep-to-print", "deny-reason-too-deep-to-print"],
)
async def test_a_malformed_rewrite_is_a_policy_error_of_its_listener(build: Callable[[], Any], message: str) -> None:
    class Malformed:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
            return build()

    runtime = make_runtime(path_tool())
    runtime.plugins.register(Malformed(), name="malformed")
    result = expect_failure(await runtime.execute(make_input("read", {"path": "a"})))
    assert result.code == "POLICY_ERROR"
    assert message in result.error.message
    assert result.error.info is not None and result.error.info.plugin == "malformed"


async def test_rewriting_to_the_same_arguments_is_an_allow() -> None:
    class Normaliser:
        def __init__(self) -> None:
            self.passes = 0

        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
            self.passes += 1
            await next()
            return Rewrite({**execution.arguments, "path": execution.arguments["path"].strip()}, "trimmed")

    normaliser = Normaliser()
    seen: list[Any] = []
    runtime = make_runtime(path_tool(seen=seen), plugins=[normaliser])
    result = expect_success(await runtime.execute(make_input("read", {"path": "  a  "})))
    assert seen == [{"path": "a"}]
    assert normaliser.passes == 2
    assert len(result.additional_contexts) == 1  # one real change, one note

    untouched = expect_success(await runtime.execute(make_input("read", {"path": "b"})))
    assert untouched.additional_contexts == ()


class Trimmer:
    """Normalises ``path`` on every pass, without comparing: settles by rewriting to what the call has.

    ``consults``: whether it asks the layers inside it first (``await next()``), never calls
    ``next()`` (``False``), or calls it without running what it returns (``"unawaited"``).
    """

    def __init__(self, consults: bool | str = True) -> None:
        self.consults = consults

    @hookimpl
    async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
        if self.consults == "unawaited":
            next().close()  # type: ignore[attr-defined]
        elif self.consults:
            await next()
        return Rewrite({**execution.arguments, "path": execution.arguments["path"].strip()}, "trimmed")


class AskAlways:
    """Asks about every call the layers inside it allow."""

    @hookimpl
    async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
        decision = await next()
        return Ask("check it") if isinstance(decision, Allow) else decision


@pytest.mark.parametrize("consults", [True, False, "unawaited"], ids=["awaits-next", "no-next", "unawaited-next"])
@pytest.mark.parametrize("path", ["/etc/shadow", "  /etc/shadow"], ids=["already-trimmed", "trimmed"])
async def test_a_rewrite_to_the_same_arguments_keeps_an_inner_deny(consults: bool | str, path: str) -> None:
    seen: list[Any] = []
    denier = DenyEtc()
    runtime = make_runtime(path_tool(seen=seen), trace_decisions=True)
    runtime.plugins.register(denier, name="denier")
    runtime.plugins.register(Trimmer(consults), name="trimmer")  # outermost
    result = expect_failure(await runtime.execute(make_input("read", {"path": path})))
    assert (result.code, result.error.message) == ("DENIED", "nothing under /etc")
    assert result.error.info is not None and result.error.info.plugin == "denier"
    assert seen == []
    assert denier.seen[-1] == "/etc/shadow"  # the layer inside judged the arguments that would run
    trace = trace_of(result)
    assert trace is not None
    last_pass = [(step.actor, step.outcome) for step in trace.stage("pre")][-2:]
    assert last_pass == [("trimmer", "pass"), ("denier", "deny: nothing under /etc")]


@pytest.mark.parametrize("consults", [True, False, "unawaited"], ids=["awaits-next", "no-next", "unawaited-next"])
@pytest.mark.parametrize("path", ["a", "  a  "], ids=["already-trimmed", "trimmed"])
async def test_a_rewrite_to_the_same_arguments_keeps_an_inner_ask(consults: bool | str, path: str) -> None:
    seen: list[Any] = []
    approval = StaticApproval("denied")
    runtime = make_runtime(path_tool(seen=seen), approval=approval, trace_decisions=True)
    runtime.plugins.register(AskAlways(), name="asker")
    runtime.plugins.register(Trimmer(consults), name="trimmer")  # outermost
    result = expect_failure(await runtime.execute(make_input("read", {"path": path}, agent=MAIN)))
    assert result.code == "DENIED"
    assert result.error.info is not None and result.error.info.plugin == "approval"
    assert seen == []
    assert approval.requests == [("read", "check it")]  # asked once, on the settled pass
    trace = trace_of(result)
    assert trace is not None
    steps = [(step.stage, step.actor, step.outcome) for step in trace]
    assert steps[-3:-1] == [("pre", "trimmer", "pass"), ("pre", "asker", "ask: check it")]
    assert steps[-1][:2] == ("approval", "approval")


@pytest.mark.parametrize("path", ["a", "  a  "], ids=["already-trimmed", "trimmed"])
async def test_an_outer_listener_decides_on_what_a_same_arguments_rewrite_stands_for(path: str) -> None:
    seen: list[Any] = []
    approval = StaticApproval("denied")
    runtime = make_runtime(path_tool(seen=seen), approval=approval)
    runtime.plugins.register(Trimmer(), name="trimmer")
    runtime.plugins.register(AskAlways(), name="asker")  # outermost: sees the trimmer's settled Allow
    result = expect_failure(await runtime.execute(make_input("read", {"path": path}, agent=MAIN)))
    assert result.code == "DENIED"
    assert seen == []
    assert approval.requests == [("read", "check it")]


async def test_a_call_a_normaliser_leaves_alone_shows_no_rewrite() -> None:
    runtime = make_runtime(path_tool(), trace_decisions=True)
    runtime.plugins.register(Trimmer(), name="trimmer")
    result = expect_success(await runtime.execute(make_input("read", {"path": "a"})))
    trace = trace_of(result)
    assert trace is not None
    assert [(step.actor, step.outcome) for step in trace.stage("pre")] == [("trimmer", "pass")]
    assert result.additional_contexts == ()


async def test_a_same_arguments_rewrite_over_a_swallowed_inner_failure_is_its_listeners_allow() -> None:
    class Broken:
        def __init__(self) -> None:
            self.runs = 0

        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
            self.runs += 1
            raise RuntimeError("inner broke")

    class Forgiving:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
            with contextlib.suppress(RuntimeError):
                await next()
            return Rewrite(dict(execution.arguments), "kept")

    seen: list[Any] = []
    broken = Broken()
    runtime = make_runtime(path_tool(seen=seen), trace_decisions=True)
    runtime.plugins.register(broken, name="broken")
    runtime.plugins.register(Forgiving(), name="forgiving")
    result = expect_success(await runtime.execute(make_input("read", {"path": "a"})))
    assert seen == [{"path": "a"}]
    assert broken.runs == 1  # not run again on the listener's behalf
    trace = trace_of(result)
    assert trace is not None
    assert [(step.actor, step.outcome) for step in trace.stage("pre")] == [("forgiving", "allow")]


async def test_a_policy_that_never_settles_fails_the_call_after_max_rewrites() -> None:
    passes: list[str] = []

    class Counter:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
            passes.append(execution.arguments["path"])
            await next()
            return Rewrite({"path": execution.arguments["path"] + "+"}, "one more")

    seen: list[Any] = []
    runtime = make_runtime(path_tool(seen=seen))
    runtime.plugins.register(Counter(), name="counter")
    result = expect_failure(await runtime.execute(make_input("read", {"path": "a"})))
    assert result.code == "POLICY_ERROR"
    # The literal 3 is README's documented MAX_REWRITES, not the constant: changing it is a visible change.
    assert MAX_REWRITES == 3
    assert result.error.message == (
        "pre-execute policies rewrote the arguments of read 3 times without settling (last by counter: one more)"
    )
    assert passes == ["a", "a+", "a++", "a+++"]  # the first pass and one after each of the 3 rewrites applied
    assert seen == []
    assert len(result.additional_contexts) == 3


async def test_an_outer_listener_can_overrule_an_inner_rewrite() -> None:
    class DenyAll:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
            await next()
            return Deny("closed")

    runtime = make_runtime(path_tool(), plugins=[RewritePath({"a": "b"}), DenyAll()])
    result = expect_failure(await runtime.execute(make_input("read", {"path": "a"})))
    assert result.error.message == "closed"
    assert result.additional_contexts == ()


async def test_later_stages_see_the_rewritten_call() -> None:
    recorder = Recorder()
    runtime = make_runtime(path_tool(), plugins=[RewritePath({"a": "b"}), recorder])
    await runtime.execute(make_input("read", {"path": "a"}, call_id="c-9"))
    [(execution, _)] = recorder.results
    assert execution.call_id == "c-9"
    assert execution.arguments == {"path": "b"}


async def test_the_trace_shows_the_rewrite_and_the_second_pass() -> None:
    runtime = make_runtime(path_tool(), trace_decisions=True)
    runtime.plugins.register(RewritePath({"a": "b"}, reason="use b"), name="rewriter")
    result = await runtime.execute(make_input("read", {"path": "a"}))
    trace = trace_of(result)
    assert trace is not None
    pre = [(step.actor, step.outcome) for step in trace.stage("pre")]
    assert pre == [("rewriter", "rewrite: use b"), ("rewriter", "pass")]


# --- scheduling -----------------------------------------------------------------------------


def keyed_tool(log: list[tuple[str, str, float]]) -> Any:
    async def body(args: Any) -> str:
        log.append(("start", args["path"], trio.current_time()))
        await trio.sleep(1)
        log.append(("end", args["path"], trio.current_time()))
        return args["path"]

    return define_tool(
        name="write",
        description="writes a path",
        parameters={"path": {"type": "string", "required": True}},
        output={"type": "string"},
        execute=body,
        resource_keys=lambda args: {"write": [args["path"]]},
    )


async def test_a_call_rewritten_onto_another_key_waits_for_what_runs(autojump_clock: trio.testing.MockClock) -> None:
    log: list[tuple[str, str, float]] = []
    runtime = make_runtime(keyed_tool(log), plugins=[RewritePath({"b": "a"})])
    first = make_input("write", {"path": "a"})
    second = make_input("write", {"path": "b"})  # admitted for key "b", rewritten onto "a"
    third = make_input("write", {"path": "c"})
    results = await run_tool_calls(runtime, [first, second, third])
    assert [expect_success(result).value for result in results] == ["a", "a", "c"]
    starts = {(path, time) for kind, path, time in log if kind == "start"}
    # The rewritten call starts only once the first has finished; nothing overlaps it.
    assert [entry for entry in log if entry[0] == "start"][:2] == [("start", "a", 0), ("start", "a", 1)]
    assert ("c", 2) in starts


async def test_without_a_rewrite_disjoint_keys_still_overlap(autojump_clock: trio.testing.MockClock) -> None:
    log: list[tuple[str, str, float]] = []
    runtime = make_runtime(keyed_tool(log), plugins=[RewritePath({})])
    await run_tool_calls(runtime, [make_input("write", {"path": "a"}), make_input("write", {"path": "b"})])
    assert [time for kind, _, time in log if kind == "start"] == [0, 0]


async def test_a_code_mode_sub_call_rewritten_into_an_exclusive_one_runs_alone(
    autojump_clock: trio.testing.MockClock,
) -> None:
    log: list[tuple[str, str, float]] = []

    async def body(args: Any) -> str:
        log.append(("start", args["path"], trio.current_time()))
        await trio.sleep(1)
        log.append(("end", args["path"], trio.current_time()))
        return args["path"]

    tool = define_tool(
        name="touch",
        description="touches a path",
        parameters={"path": {"type": "string", "required": True}},
        output={"type": "string"},
        execute=body,
        is_concurrency_safe=lambda args: not args["path"].startswith("/"),
    )

    async def program(tools: Mapping[str, Callable[[Any], Awaitable[Any]]]) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(tools["touch"], {"path": "x"})
            await trio.sleep(0.1)
            nursery.start_soon(tools["touch"], {"path": "y"})  # parallel-safe as asked, exclusive once rewritten

    runtime = ToolRuntime(mode="code", code_runtime=FakeCodeRuntime(program))
    runtime.register(tool)
    runtime.plugins.register(RewritePath({"y": "/y"}))
    result = await runtime.execute(make_input("run_code", {"code": "...", "description": "d"}))
    assert not result.is_error, result
    starts = [(path, time) for kind, path, time in log if kind == "start"]
    assert starts[0] == ("x", 0)
    assert starts[1][0] == "/y" and starts[1][1] >= 1  # waited for x to finish


async def test_a_rewritten_code_mode_sub_call_tells_the_model_through_run_code() -> None:
    seen: list[Any] = []

    async def program(tools: Mapping[str, Callable[[Any], Awaitable[Any]]]) -> None:
        await tools["read"]({"path": "a"})

    runtime = ToolRuntime(mode="code", code_runtime=FakeCodeRuntime(program))
    runtime.register(path_tool(seen=seen))
    runtime.plugins.register(RewritePath({"a": "b"}), name="paths")
    result = await runtime.execute(make_input("run_code", {"code": "...", "description": "d"}))
    assert not result.is_error, result
    assert seen == [{"path": "b"}]
    notes = [c for c in result.additional_contexts if c.source == "paths"]
    assert len(notes) == 1 and "changed by paths" in notes[0].content[0].text  # type: ignore[union-attr]
