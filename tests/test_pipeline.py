"""The execute pipeline: stage order, decisions, guards, wrappers, results, finalisation, observers."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import pluggy
import pytest
import trio

from dsh_core import (
    Accept,
    Agent,
    Allow,
    Ask,
    Block,
    CancelSignal,
    DshError,
    FrozenDict,
    NonJsonValueError,
    PolicyError,
    TextBlock,
    ToolDispatchExecution,
    ToolErrorInfo,
    ToolExecution,
    ToolExecutionFailure,
    ToolExecutionInput,
    ToolExecutionResult,
    ToolExecutionSuccess,
    ToolFailure,
    ToolOutput,
    ToolRunContext,
    ToolRuntime,
    UserMessage,
    define_tool,
    hookimpl,
)
from dsh_core._decisions import Deny
from dsh_core.testing import Recorder, StaticApproval, json_tool, make_input, make_runtime

Next = Callable[[], Awaitable[Any]]


def add_tool(**options: Any) -> Any:
    async def add(args: Any) -> int:
        return args["a"] + args["b"]

    return define_tool(
        name="add",
        description="Add two integers",
        parameters={"a": {"type": "integer", "required": True}, "b": {"type": "integer", "required": True}},
        output=ToolOutput(schema={"type": "integer"}, render=lambda args, value: [TextBlock(str(value))]),
        execute=add,
        **options,
    )


def code(result: ToolExecutionResult) -> str | None:
    assert isinstance(result, ToolExecutionFailure), result
    return result.error.info.code if result.error.info else None


class Pre:
    """A pre-execute listener that records its label and returns a fixed decision (or delegates)."""

    def __init__(self, label: str, log: list[str], decision: object = None, **marks: bool) -> None:
        async def dsh_pre_execute(execution: ToolExecution, next: Next) -> Any:
            log.append(label)
            if decision is not None:
                return decision
            return await next()

        # A fresh function per instance: pluggy reads the marks from the function itself.
        self.dsh_pre_execute = hookimpl(**marks)(dsh_pre_execute)


# -- success path ------------------------------------------------------------------


async def test_success_carries_value_rendered_content_and_no_meta() -> None:
    runtime = make_runtime(add_tool())
    result = await runtime.execute(make_input("add", {"a": 1, "b": 2}))
    assert isinstance(result, ToolExecutionSuccess)
    assert result.value == 3
    assert result.content == (TextBlock("3"),)
    assert result.meta is None
    assert result.additional_contexts == ()
    assert result.concludes_turn is False


async def test_stage_order_is_pre_execute_post_result() -> None:
    recorder = Recorder()
    runtime = make_runtime(add_tool(), plugins=[recorder])
    await runtime.execute(make_input("add", {"a": 1, "b": 2}, call_id="c1"))
    assert recorder.events == [
        ("dsh_pre_execute", "c1"),
        ("dsh_execute", "c1"),
        ("dsh_post_execute", "c1"),
        ("dsh_result", "c1"),
    ]


async def test_one_execution_object_flows_through_every_stage() -> None:
    seen: list[Any] = []

    class Spy:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
            seen.append(execution.token)
            return await next()

        @hookimpl
        async def dsh_execute(self, execution: ToolDispatchExecution, next: Next) -> Any:
            seen.append(execution.token)
            return await next()

        @hookimpl
        async def dsh_post_execute(self, execution: ToolExecution, result: Any, next: Next) -> Any:
            seen.append(execution.token)
            return await next()

        @hookimpl
        def dsh_result(self, execution: ToolExecution, result: Any) -> None:
            seen.append(execution.token)

    runtime = make_runtime(add_tool(), plugins=[Spy()])
    await runtime.execute(make_input("add", {"a": 1, "b": 2}))
    assert len(seen) == 4 and all(token is seen[0] for token in seen)


async def test_arguments_are_frozen_snapshots_and_callers_dict_untouched() -> None:
    captured: dict[str, Any] = {}

    async def body(args: Any, run: ToolRunContext) -> None:
        captured["args"] = args
        with pytest.raises(TypeError):
            args["x"] = 2

    runtime = make_runtime(json_tool("t", body, output={"type": "null"}))
    original = {"x": 1, "nested": [1, 2]}
    await runtime.execute(make_input("t", original))
    assert isinstance(captured["args"], FrozenDict)
    assert captured["args"]["nested"] == (1, 2)
    original["x"] = 99
    assert captured["args"]["x"] == 1


async def test_root_call_id_defaults_to_call_id() -> None:
    recorder = Recorder()
    runtime = make_runtime(add_tool(), plugins=[recorder])
    await runtime.execute(make_input("add", {"a": 1, "b": 1}, call_id="root"))
    await runtime.execute(make_input("add", {"a": 1, "b": 1}, call_id="child", root_call_id="root"))
    assert [e.root_call_id for e, _ in recorder.results] == ["root", "root"]


# -- argument failures -----------------------------------------------------------------


async def test_non_json_arguments_fail_before_anything_runs() -> None:
    recorder = Recorder()
    runtime = make_runtime(add_tool(), plugins=[recorder])
    result = await runtime.execute(make_input("add", {"a": float("nan"), "b": 1}))
    assert code(result) == "INVALID_ARGS"
    assert "losslessly JSON-serializable" in result.error.message  # type: ignore[union-attr]
    assert "$.a" in result.error.message  # type: ignore[union-attr]
    assert recorder.hooks == ["dsh_result"]
    assert recorder.results[0][0].arguments is None


async def test_invalid_arguments_are_rejected_before_policies_see_them() -> None:
    recorder = Recorder()
    runtime = make_runtime(add_tool(), plugins=[recorder])
    result = await runtime.execute(make_input("add", {"a": "1", "c": 2}))
    assert code(result) == "INVALID_ARGS"
    message = result.error.message  # type: ignore[union-attr]
    assert message.startswith("invalid arguments: ")
    assert "missing required property" in message and '"a"' in message
    assert result.content == (TextBlock(f"Error: {message}"),)
    assert recorder.hooks == ["dsh_result"]


async def test_unknown_tool_is_a_structured_failure() -> None:
    recorder = Recorder()
    runtime = make_runtime(plugins=[recorder])
    result = await runtime.execute(make_input("nope"))
    assert code(result) == "UNKNOWN_TOOL"
    assert result.content == (TextBlock('Error: unknown tool "nope"'),)
    assert result.error.info.name == "ToolNotFoundError"  # type: ignore[union-attr]
    assert recorder.hooks == ["dsh_result"]


# -- pre-execute waterfall -------------------------------------------------------------


async def test_waterfall_order_follows_pluggy_tryfirst_registration_trylast() -> None:
    log: list[str] = []
    runtime = make_runtime(add_tool())
    for plugin in (
        Pre("n1", log),
        Pre("tf1", log, tryfirst=True),
        Pre("n2", log),
        Pre("tl1", log, trylast=True),
        Pre("tf2", log, tryfirst=True),
        Pre("tl2", log, trylast=True),
    ):
        runtime.plugins.register(plugin)
    await runtime.execute(make_input("add", {"a": 1, "b": 2}))
    assert log == ["tf2", "tf1", "n2", "n1", "tl1", "tl2"]


async def test_deny_short_circuits_inner_listeners_and_the_body() -> None:
    log: list[str] = []
    ran: list[bool] = []

    async def body(args: Any) -> None:
        ran.append(True)

    runtime = make_runtime(json_tool("t", body, output={"type": "null"}))
    runtime.plugins.register(Pre("inner", log))
    runtime.plugins.register(Pre("outer", log, Deny("not today")))
    result = await runtime.execute(make_input("t"))
    assert code(result) == "DENIED"
    assert result.error.message == "not today"  # type: ignore[union-attr]
    assert result.error.info.plugin is not None  # type: ignore[union-attr]
    assert result.content == (TextBlock("Error: not today"),)
    assert log == ["outer"] and ran == []


async def test_denial_still_reaches_post_execute() -> None:
    recorder = Recorder()
    runtime = make_runtime(add_tool(), plugins=[recorder])
    runtime.plugins.register(Pre("deny", [], Deny("no")))
    await runtime.execute(make_input("add", {"a": 1, "b": 2}))
    assert "dsh_post_execute" in recorder.hooks and "dsh_execute" not in recorder.hooks


async def test_raising_pre_listener_is_contained_and_attributed() -> None:
    class Broken:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
            raise RuntimeError("permission hook broke")

    recorder = Recorder()
    runtime = make_runtime(add_tool(), plugins=[recorder])
    runtime.plugins.register(Broken(), name="broken-policy")
    result = await runtime.execute(make_input("add", {"a": 1, "b": 2}))
    assert code(result) == "POLICY_ERROR"
    assert result.error.message == "permission hook broke"  # type: ignore[union-attr]
    assert result.error.info.plugin == "broken-policy"  # type: ignore[union-attr]
    assert result.error.info.name == "RuntimeError"  # type: ignore[union-attr]
    assert "dsh_post_execute" not in recorder.hooks[1:]  # final: no post-execute


async def test_dsh_error_from_listener_keeps_its_code() -> None:
    class Broken:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
            raise DshError("quota exhausted", code="QUOTA")

    runtime = make_runtime(add_tool(), plugins=[Broken()])
    result = await runtime.execute(make_input("add", {"a": 1, "b": 2}))
    assert code(result) == "QUOTA"


async def test_a_dsh_error_subclass_that_skips_dsh_error_init_keeps_its_message() -> None:
    class HttpStatus(DshError):
        code = "HTTP_STATUS"

        def __init__(self, status: int) -> None:
            Exception.__init__(self, f"HTTP {status}")

    async def body(args: Any) -> Any:
        raise HttpStatus(503)

    result = await make_runtime(json_tool("fetch", body)).execute(make_input("fetch"))
    assert isinstance(result, ToolExecutionFailure)
    assert (result.code, result.error.message) == ("HTTP_STATUS", "HTTP 503")


async def test_inner_listener_failure_is_blamed_on_the_inner_plugin() -> None:
    class Inner:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
            raise ValueError("inner broke")

    runtime = make_runtime(add_tool())
    runtime.plugins.register(Inner(), name="inner")
    runtime.plugins.register(Pre("outer", []), name="outer")
    result = await runtime.execute(make_input("add", {"a": 1, "b": 2}))
    assert result.error.info.plugin == "inner"  # type: ignore[union-attr]


async def test_next_called_twice_is_a_policy_error() -> None:
    class Twice:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
            await next()
            return await next()

    runtime = make_runtime(add_tool())
    runtime.plugins.register(Twice(), name="twice")
    result = await runtime.execute(make_input("add", {"a": 1, "b": 2}))
    assert code(result) == "POLICY_ERROR"
    assert "at most once" in result.error.message  # type: ignore[union-attr]
    assert result.error.info.plugin == "twice"  # type: ignore[union-attr]


@pytest.mark.parametrize("bad", [None, "allow", {"kind": "allow"}, Accept()])
async def test_wrong_decision_type_is_a_policy_error(bad: object) -> None:
    ran: list[bool] = []

    async def body(args: Any) -> None:
        ran.append(True)

    class Bad:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
            return bad

    runtime = make_runtime(json_tool("t", body, output={"type": "null"}))
    runtime.plugins.register(Bad(), name="bad")
    result = await runtime.execute(make_input("t"))
    assert code(result) == "POLICY_ERROR"
    assert result.error.info.plugin == "bad"  # type: ignore[union-attr]
    assert ran == []


@pytest.mark.parametrize("make_bad", [lambda: Deny(""), lambda: Deny(None), lambda: Accept(value=1, content=[])])
async def test_malformed_decisions_are_policy_errors(make_bad: Callable[[], Any]) -> None:
    class Bad:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
            return make_bad()

    runtime = make_runtime(add_tool(), plugins=[Bad()])
    result = await runtime.execute(make_input("add", {"a": 1, "b": 2}))
    assert code(result) == "POLICY_ERROR"


async def test_sync_waterfall_listener_is_refused_at_register_and_on_a_plain_manager_per_call() -> None:
    class Sync:
        @hookimpl
        def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
            return Allow()

    runtime = make_runtime(add_tool())
    with pytest.raises(pluggy.PluginValidationError, match="is not an async def"):
        runtime.plugins.register(Sync(), name="sync")
    pm = pluggy.PluginManager("dsh")
    runtime = ToolRuntime(plugins=pm)
    runtime.register(add_tool())
    pm.register(Sync(), name="sync")
    result = await runtime.execute(make_input("add", {"a": 1, "b": 2}))
    assert code(result) == "POLICY_ERROR"
    assert "must be async def" in result.error.message  # type: ignore[union-attr]


async def test_hookimpl_with_argument_subset() -> None:
    seen: list[str] = []

    class Subset:
        @hookimpl
        async def dsh_pre_execute(self, next: Next) -> Any:
            seen.append("ran")
            return await next()

    runtime = make_runtime(add_tool(), plugins=[Subset()])
    result = await runtime.execute(make_input("add", {"a": 1, "b": 2}))
    assert not result.is_error and seen == ["ran"]


async def test_scoped_listener_sees_only_its_agents_calls() -> None:
    seen: list[str] = []
    agent, other = Agent("a"), Agent("b")
    child = Agent("child", parent=agent)

    class Scoped:
        dsh_scope = agent

        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
            seen.append(execution.call_id)
            return await next()

    runtime = make_runtime(add_tool(), plugins=[Scoped()])
    for call_id, who in (("x", agent), ("y", other), ("z", None), ("w", child)):
        await runtime.execute(make_input("add", {"a": 1, "b": 2}, call_id=call_id, agent=who))
    assert seen == ["x", "w"]


# -- ask / approval ----------------------------------------------------------------------


async def test_ask_without_service_denies_with_reason() -> None:
    runtime = make_runtime(add_tool())
    runtime.plugins.register(Pre("ask", [], Ask("needs a human")))
    result = await runtime.execute(make_input("add", {"a": 1, "b": 2}, agent=Agent("a")))
    assert code(result) == "DENIED" and result.error.message == "needs a human"  # type: ignore[union-attr]


async def test_ask_without_service_or_reason_names_the_tool() -> None:
    runtime = make_runtime(add_tool())
    runtime.plugins.register(Pre("ask", [], Ask()))
    result = await runtime.execute(make_input("add", {"a": 1, "b": 2}, agent=Agent("a")))
    assert result.error.message == 'tool "add" requires approval, but no approval service is configured'  # type: ignore[union-attr]


async def test_ask_without_agent_denies_without_asking() -> None:
    approval = StaticApproval("allowed-once")
    runtime = make_runtime(add_tool(), approval=approval)
    runtime.plugins.register(Pre("ask", [], Ask()))
    result = await runtime.execute(make_input("add", {"a": 1, "b": 2}))
    assert "no agent to route it through" in result.error.message  # type: ignore[union-attr]
    assert approval.requests == []


async def test_ask_allowed_once_runs_the_call() -> None:
    approval = StaticApproval("allowed-once")
    runtime = make_runtime(add_tool(), approval=approval)
    runtime.plugins.register(Pre("ask", [], Ask("why")))
    result = await runtime.execute(make_input("add", {"a": 1, "b": 2}, agent=Agent("a")))
    assert not result.is_error
    assert approval.requests == [("add", "why")]


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("denied", 'the user denied tool "add"'),
        ("cancelled", 'approval for tool "add" was cancelled'),
        ("unavailable", 'tool "add" requires approval, but no approval channel is available'),
    ],
)
async def test_ask_other_answers_deny(answer: str, expected: str) -> None:
    runtime = make_runtime(add_tool(), approval=StaticApproval(answer))
    runtime.plugins.register(Pre("ask", [], Ask()))
    result = await runtime.execute(make_input("add", {"a": 1, "b": 2}, agent=Agent("a")))
    assert code(result) == "DENIED" and result.error.message == expected  # type: ignore[union-attr]


async def test_nonconforming_approval_answer_is_policy_error() -> None:
    runtime = make_runtime(add_tool(), approval=StaticApproval("maybe"))
    runtime.plugins.register(Pre("ask", [], Ask()))
    result = await runtime.execute(make_input("add", {"a": 1, "b": 2}, agent=Agent("a")))
    assert code(result) == "POLICY_ERROR" and "'maybe'" in result.error.message  # type: ignore[union-attr]


async def test_approved_call_is_still_subject_to_guards() -> None:
    runtime = make_runtime(add_tool(), approval=StaticApproval("allowed-once"))
    runtime.plugins.register(Pre("ask", [], Ask()))
    runtime.guard(lambda execution: "guard says no")
    result = await runtime.execute(make_input("add", {"a": 1, "b": 2}, agent=Agent("a")))
    assert code(result) == "DENIED" and result.error.message == "guard says no"  # type: ignore[union-attr]


# -- guards ----------------------------------------------------------------------------------


async def test_guard_denial_cannot_be_reallowed_by_listeners() -> None:
    runtime = make_runtime(add_tool())
    runtime.plugins.register(Pre("allow", [], Allow(), tryfirst=True))
    runtime.guard(lambda execution: "blocked by guard")
    result = await runtime.execute(make_input("add", {"a": 1, "b": 2}))
    assert code(result) == "DENIED"
    assert result.error.info.name == "GuardDenial"  # type: ignore[union-attr]


async def test_guards_run_global_first_then_chain_and_first_reason_wins() -> None:
    order: list[str] = []
    parent = Agent("p")
    child = Agent("c", parent=parent)

    def guard(label: str, reason: str | None = None) -> Callable[[ToolExecution], str | None]:
        def check(execution: ToolExecution) -> str | None:
            order.append(label)
            return reason

        return check

    runtime = make_runtime(add_tool())
    runtime.guard(guard("child", "child denies"), child)
    runtime.guard(guard("parent"), parent)
    runtime.guard(guard("global"))
    result = await runtime.execute(make_input("add", {"a": 1, "b": 2}, agent=child))
    assert order == ["global", "parent", "child"]
    assert result.error.message == "child denies"  # type: ignore[union-attr]


async def test_scoped_guard_ignores_other_agents_and_agentless_calls() -> None:
    runtime = make_runtime(add_tool())
    runtime.guard(lambda e: "no", Agent("a"))
    assert not (await runtime.execute(make_input("add", {"a": 1, "b": 2}))).is_error
    assert not (await runtime.execute(make_input("add", {"a": 1, "b": 2}, agent=Agent("b")))).is_error


async def test_guards_see_only_allowed_calls_and_raising_guard_fails_final() -> None:
    recorder = Recorder()
    runtime = make_runtime(add_tool(), plugins=[recorder])

    def boom(execution: ToolExecution) -> str | None:
        raise RuntimeError("guard exploded")

    runtime.guard(boom)
    result = await runtime.execute(make_input("add", {"a": 1, "b": 2}))
    assert code(result) == "POLICY_ERROR" and result.error.message == "guard exploded"  # type: ignore[union-attr]
    assert recorder.hooks == ["dsh_pre_execute", "dsh_result"]


@pytest.mark.parametrize("bad", ["", 0, ["no"]])
async def test_guard_returning_non_reason_is_policy_error(bad: object) -> None:
    runtime = make_runtime(add_tool())
    runtime.guard(lambda e: bad)  # type: ignore[arg-type, return-value]
    result = await runtime.execute(make_input("add", {"a": 1, "b": 2}))
    assert code(result) == "POLICY_ERROR"


async def test_disposed_guard_no_longer_runs() -> None:
    runtime = make_runtime(add_tool())
    dispose = runtime.guard(lambda e: "no")
    dispose()
    assert not (await runtime.execute(make_input("add", {"a": 1, "b": 2}))).is_error


# -- execute wrappers --------------------------------------------------------------------


async def test_wrapper_cannot_assign_fields_other_than_signal() -> None:
    problems: list[str] = []

    class Meddler:
        @hookimpl
        async def dsh_execute(self, execution: ToolDispatchExecution, next: Next) -> Any:
            for field in ("name", "call_id", "arguments", "agent", "token"):
                try:
                    setattr(execution, field, "x")
                except AttributeError:
                    problems.append(field)
            return await next()

    runtime = make_runtime(add_tool(), plugins=[Meddler()])
    result = await runtime.execute(make_input("add", {"a": 1, "b": 2}))
    assert not result.is_error
    assert problems == ["name", "call_id", "arguments", "agent", "token"]


async def test_the_wrappers_view_refuses_a_signal_that_is_not_one_and_matches_the_public_constructor() -> None:
    seen: list[ToolDispatchExecution] = []
    refusals: list[str] = []

    class Inspector:
        @hookimpl
        async def dsh_execute(self, execution: ToolDispatchExecution, next: Next) -> Any:
            seen.append(execution)
            try:
                execution.signal = "not a signal"  # type: ignore[assignment]
            except TypeError as exc:
                refusals.append(str(exc))
            try:
                execution._may_suspend = True  # type: ignore[misc]
            except AttributeError as exc:
                refusals.append(str(exc))
            return await next()

    runtime = make_runtime(add_tool(), plugins=[Inspector()])
    request = make_input("add", {"a": 1, "b": 2})
    result = await runtime.execute(request)
    assert not result.is_error
    assert refusals == [
        "execution.signal must be a CancelSignal, got str",
        "ToolDispatchExecution._may_suspend is read-only; a wrapper may replace only signal",
    ]
    (view,) = seen
    assert view.signal is request.signal and view.may_suspend is False  # the add body cannot suspend
    public = ToolDispatchExecution(view.execution, may_suspend=False)
    fields = ("execution", "call_id", "root_call_id", "name", "arguments", "agent", "parent", "token", "signal")
    assert [getattr(public, f) for f in fields] == [getattr(view, f) for f in fields]
    assert public.may_suspend is view.may_suspend and type(public) is type(view)
    assert repr(view) == repr(public) == f"<ToolDispatchExecution add call_id={request.call_id!r}>"
    assert public.body_started is False and public.body_result is None


class BodyWitness:
    """A wrapper recording what ``execution.body_started``/``body_result`` say before and after ``next()``."""

    def __init__(self) -> None:
        self.seen: list[tuple[bool, Any, bool, Any]] = []

    @hookimpl(tryfirst=True)
    async def dsh_execute(self, execution: ToolDispatchExecution, next: Next) -> Any:
        before = (execution.body_started, execution.body_result)
        try:
            return await next()
        finally:
            self.seen.append((*before, execution.body_started, execution.body_result))


async def test_a_wrapper_can_tell_what_the_body_itself_did() -> None:
    async def fails(args: Any) -> Any:
        raise DshError("gone", code="UNKNOWN_TOOL")

    class ShortCircuit:
        @hookimpl
        async def dsh_execute(self, execution: ToolDispatchExecution, next: Next) -> Any:
            if execution.name == "cached":
                return ToolExecutionSuccess(value=1, content=())
            return await next()

    witness = BodyWitness()
    runtime = make_runtime(
        add_tool(), json_tool("fails", fails), json_tool("cached"), plugins=[ShortCircuit(), witness]
    )
    ran = await runtime.execute(make_input("add", {"a": 1, "b": 2}))
    await runtime.execute(make_input("fails", {}))
    await runtime.execute(make_input("cached", {}))
    (added, failed, cached) = witness.seen
    assert added == (False, None, True, ran)
    assert failed[:3] == (False, None, True) and failed[3].error.info.code == "UNKNOWN_TOOL"  # raised by the body
    assert cached == (False, None, False, None)  # answered without the body


async def test_the_body_result_keeps_a_success_that_cancellation_replaced() -> None:
    signal = CancelSignal()

    async def finishes_as_cancelled(args: Any) -> Any:
        with trio.CancelScope(shield=True):
            signal.cancel()
            await trio.lowlevel.checkpoint()
        return "done"

    witness = BodyWitness()
    runtime = make_runtime(json_tool("t", finishes_as_cancelled), plugins=[witness])
    result = await runtime.execute(make_input("t", {}, signal=signal))
    assert isinstance(result, ToolExecutionFailure) and result.error.info is not None
    assert result.error.info.code == "ABORTED"
    ((_, _, started, body),) = witness.seen
    assert started is True and isinstance(body, ToolExecutionSuccess) and body.value == "done"


async def test_an_interrupted_body_counts_as_started_without_a_result() -> None:
    signal = CancelSignal()

    async def sleeps(args: Any) -> Any:
        signal.cancel()
        await trio.sleep_forever()

    witness = BodyWitness()
    runtime = make_runtime(json_tool("t", sleeps), plugins=[witness])
    await runtime.execute(make_input("t", {}, signal=signal))
    assert witness.seen == [(False, None, True, None)]


async def test_wrapper_short_circuit_skips_body_and_success_is_revalidated() -> None:
    ran: list[bool] = []

    async def body(args: Any) -> int:
        ran.append(True)
        return 1

    class Cache:
        @hookimpl
        async def dsh_execute(self, execution: ToolDispatchExecution, next: Next) -> Any:
            return ToolExecutionSuccess(value=41, content=(TextBlock("ignored"),))

    tool = define_tool(
        name="t",
        description="",
        parameters={},
        output=ToolOutput(schema={"type": "integer"}, render=lambda a, v: [TextBlock(f"={v}")]),
        execute=body,
    )
    runtime = make_runtime(tool, plugins=[Cache()])
    result = await runtime.execute(make_input("t"))
    assert ran == []
    assert result.content == (TextBlock("=41"),)  # re-rendered, the wrapper's content is discarded


async def test_wrapper_success_with_invalid_value_is_invalid_output() -> None:
    class Liar:
        @hookimpl
        async def dsh_execute(self, execution: ToolDispatchExecution, next: Next) -> Any:
            return ToolExecutionSuccess(value="not an int", content=())

    runtime = make_runtime(add_tool(), plugins=[Liar()])
    result = await runtime.execute(make_input("add", {"a": 1, "b": 2}))
    assert code(result) == "INVALID_TOOL_OUTPUT"


async def test_raising_wrapper_is_final_failure() -> None:
    recorder = Recorder()

    class Broken:
        @hookimpl(tryfirst=True)
        async def dsh_execute(self, execution: ToolDispatchExecution, next: Next) -> Any:
            raise RuntimeError("wrapper broke")

    runtime = make_runtime(add_tool(), plugins=[recorder, Broken()])
    result = await runtime.execute(make_input("add", {"a": 1, "b": 2}))
    assert result.content == (TextBlock("Error: wrapper broke"),)
    assert "dsh_post_execute" not in recorder.hooks


async def test_wrapper_sees_body_failure_as_a_result_not_an_exception() -> None:
    seen: list[ToolExecutionResult] = []

    async def body(args: Any) -> None:
        raise KeyError("kaboom")

    class Watch:
        @hookimpl
        async def dsh_execute(self, execution: ToolDispatchExecution, next: Next) -> Any:
            result = await next()
            seen.append(result)
            return result

    runtime = make_runtime(json_tool("t", body), plugins=[Watch()])
    result = await runtime.execute(make_input("t"))
    assert seen and seen[0].is_error
    assert code(result) == "TOOL_ERROR"
    assert result.error.info.name == "KeyError"  # type: ignore[union-attr]


async def test_wrapper_returning_garbage_is_policy_error() -> None:
    class Garbage:
        @hookimpl
        async def dsh_execute(self, execution: ToolDispatchExecution, next: Next) -> Any:
            await next()
            return "done"

    runtime = make_runtime(add_tool(), plugins=[Garbage()])
    result = await runtime.execute(make_input("add", {"a": 1, "b": 2}))
    assert code(result) == "POLICY_ERROR"


# -- output contract -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "fragment"),
    [("three", '"value" must be an integer'), (float("inf"), "not lossless JSON"), (object(), "not lossless JSON")],
)
async def test_invalid_body_value_is_invalid_tool_output(value: object, fragment: str) -> None:
    async def body(args: Any) -> object:
        return value

    tool = define_tool(name="t", description="", parameters={}, output={"type": "integer"}, execute=body)
    result = await make_runtime(tool).execute(make_input("t"))
    assert code(result) == "INVALID_TOOL_OUTPUT"
    assert result.error.message.startswith('tool "t" returned invalid output: ')  # type: ignore[union-attr]
    assert fragment in result.error.message  # type: ignore[union-attr]


async def test_render_failure_is_invalid_output() -> None:
    def render(args: Any, value: Any) -> Any:
        raise ValueError("bad render")

    tool = define_tool(
        name="t", description="", parameters={}, output=ToolOutput(schema={"type": "null"}, render=render),
        execute=_none_body,
    )  # fmt: skip
    result = await make_runtime(tool).execute(make_input("t"))
    assert "output.render failed: bad render" in result.error.message  # type: ignore[union-attr]


async def _none() -> None:
    return None


async def _none_body(args: Any) -> None:
    return None


async def _seven_body(args: Any) -> int:
    return 7


async def test_render_returning_non_blocks_is_invalid_output() -> None:
    tool = define_tool(
        name="t", description="", parameters={},
        output=ToolOutput(schema={"type": "null"}, render=lambda a, v: "text"),  # type: ignore[arg-type,return-value]
        execute=_none_body,
    )  # fmt: skip
    result = await make_runtime(tool).execute(make_input("t"))
    assert code(result) == "INVALID_TOOL_OUTPUT"


async def test_plain_def_body_runs_inline() -> None:
    def double(args: Any) -> int:
        return args["n"] * 2

    tool = define_tool(
        name="double", description="", parameters={"n": {"type": "integer", "required": True}},
        output={"type": "integer"}, execute=double,
    )  # fmt: skip
    assert tool.inline is True
    result = await make_runtime(tool).execute(make_input("double", {"n": 21}))
    assert result.value == 42  # type: ignore[union-attr]


async def test_plain_def_body_returning_an_awaitable_is_refused() -> None:
    tool = define_tool(
        name="sneaky", description="", parameters={}, output={"type": "null"}, execute=lambda args: _none(),
    )  # fmt: skip
    result = await make_runtime(tool).execute(make_input("sneaky"))
    assert code(result) == "TOOL_ERROR"
    assert "declare it async def" in result.error.message  # type: ignore[union-attr]


async def test_presentation_meta_only_for_top_level_calls() -> None:
    from dsh_core import ToolExecutionToken

    tool = define_tool(
        name="t", description="", parameters={},
        output=ToolOutput(schema={"type": "null"}, presentation_meta=lambda a, v: {"shown": True}),
        execute=_none_body,
    )  # fmt: skip
    runtime = make_runtime(tool)
    top = await runtime.execute(make_input("t"))
    nested = await runtime.execute(make_input("t", parent=ToolExecutionToken()))
    assert top.meta == {"shown": True}
    assert nested.meta is None


async def test_presentation_meta_failure_is_invalid_output() -> None:
    tool = define_tool(
        name="t", description="", parameters={},
        output=ToolOutput(schema={"type": "null"}, presentation_meta=lambda a, v: {1, 2}),
        execute=_none_body,
    )  # fmt: skip
    result = await make_runtime(tool).execute(make_input("t"))
    assert "output.presentation_meta returned non-lossless JSON" in result.error.message  # type: ignore[union-attr]


# -- post-execute ----------------------------------------------------------------------------


class Post:
    def __init__(self, decide: Callable[[ToolExecutionResult], Any]) -> None:
        self.decide = decide

    @hookimpl
    async def dsh_post_execute(self, execution: ToolExecution, result: ToolExecutionResult, next: Next) -> Any:
        await next()
        return self.decide(result)


async def test_accept_content_keeps_value_and_meta() -> None:
    tool = define_tool(
        name="t", description="", parameters={},
        output=ToolOutput(schema={"type": "integer"}, presentation_meta=lambda a, v: {"m": v}),
        execute=_seven_body,
    )  # fmt: skip
    runtime = make_runtime(tool, plugins=[Post(lambda r: Accept(content=[TextBlock("redacted")]))])
    result = await runtime.execute(make_input("t"))
    assert isinstance(result, ToolExecutionSuccess)
    assert result.value == 7 and result.meta == {"m": 7} and result.content == (TextBlock("redacted"),)


async def _seven() -> int:
    return 7


async def test_accept_value_is_revalidated_and_rerendered() -> None:
    runtime = make_runtime(add_tool(), plugins=[Post(lambda r: Accept(value=100))])
    result = await runtime.execute(make_input("add", {"a": 1, "b": 2}))
    assert isinstance(result, ToolExecutionSuccess)
    assert result.value == 100 and result.content == (TextBlock("100"),)


async def test_accept_invalid_value_is_invalid_output() -> None:
    runtime = make_runtime(add_tool(), plugins=[Post(lambda r: Accept(value="x"))])
    result = await runtime.execute(make_input("add", {"a": 1, "b": 2}))
    assert code(result) == "INVALID_TOOL_OUTPUT" and not hasattr(result, "value")


async def test_accept_value_on_failure_is_refused() -> None:
    runtime = make_runtime(plugins=[Post(lambda r: Accept(value=1))])
    runtime.register(add_tool())
    runtime.guard(lambda e: "denied")
    result = await runtime.execute(make_input("add", {"a": 1, "b": 2}))
    assert code(result) == "POLICY_ERROR"
    assert "cannot replace the value of a failed result" in result.error.message  # type: ignore[union-attr]


async def test_block_turns_success_into_failure_with_feedback() -> None:
    feedback = [TextBlock("try"), TextBlock("again")]
    runtime = make_runtime(add_tool(), plugins=[Post(lambda r: Block(feedback=feedback))])
    result = await runtime.execute(make_input("add", {"a": 1, "b": 2}))
    assert isinstance(result, ToolExecutionFailure)
    assert result.content == tuple(feedback)
    assert result.error.message == "try\nagain"


async def test_block_takes_its_feedback_positionally_and_a_string_as_one_text_block() -> None:
    # SPEC and the hookspec write Block(feedback); a str is the common case, as for Deny(reason).
    runtime = make_runtime(add_tool(), plugins=[Post(lambda r: Block("use smaller numbers"))])
    result = await runtime.execute(make_input("add", {"a": 1, "b": 2}))
    assert isinstance(result, ToolExecutionFailure)
    assert result.error.info.code == "DENIED" and result.error.info.name == "PostExecuteBlock"
    assert result.error.message == "use smaller numbers"
    assert result.content == (TextBlock("use smaller numbers"),)


def test_block_keeps_additional_contexts_keyword_only() -> None:
    with pytest.raises(TypeError):
        Block([TextBlock("x")], [])  # type: ignore[misc]


@pytest.mark.parametrize("feedback", ["", "   "])
def test_block_refuses_a_blank_feedback_string(feedback: str) -> None:
    with pytest.raises(PolicyError, match="Block feedback string must not be blank"):
        Block(feedback)


async def test_block_with_empty_feedback_uses_default_message() -> None:
    runtime = make_runtime(add_tool(), plugins=[Post(lambda r: Block(feedback=[]))])
    result = await runtime.execute(make_input("add", {"a": 1, "b": 2}))
    assert result.error.message == "tool result blocked by post-execute policy"  # type: ignore[union-attr]


async def test_raising_post_listener_is_contained() -> None:
    def boom(result: ToolExecutionResult) -> Any:
        raise RuntimeError("post hook broke")

    runtime = make_runtime(add_tool(), plugins=[Post(boom)])
    result = await runtime.execute(make_input("add", {"a": 1, "b": 2}))
    assert result.content == (TextBlock("Error: post hook broke"),)


async def test_post_execute_sees_frozen_results() -> None:
    def mutate(result: ToolExecutionResult) -> Any:
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            result.content = ()  # type: ignore[misc]
        return Accept()

    runtime = make_runtime(add_tool(), plugins=[Post(mutate)])
    assert not (await runtime.execute(make_input("add", {"a": 1, "b": 2}))).is_error


# -- contexts and conclude_turn ------------------------------------------------------------


def ctx(text: str) -> UserMessage:
    return UserMessage([TextBlock(text)], source="test")


async def test_context_order_deferred_then_wrapper_then_post() -> None:
    async def body(args: Any, run: ToolRunContext) -> None:
        run.defer_context(ctx("deferred-1"))
        run.defer_context(ctx("deferred-2"))

    class Wrap:
        @hookimpl
        async def dsh_execute(self, execution: ToolDispatchExecution, next: Next) -> Any:
            result = await next()
            return attrs.evolve(result, additional_contexts=(*result.additional_contexts, ctx("wrapper")))

    runtime = make_runtime(json_tool("t", body, output={"type": "null"}))
    runtime.plugins.register(Wrap())
    runtime.plugins.register(Post(lambda r: Accept(additional_contexts=[ctx("post")])))
    result = await runtime.execute(make_input("t"))
    assert [c.content[0].text for c in result.additional_contexts] == [  # type: ignore[union-attr]
        "deferred-1",
        "deferred-2",
        "wrapper",
        "post",
    ]


async def test_deferred_contexts_survive_a_failing_body() -> None:
    async def body(args: Any, run: ToolRunContext) -> None:
        run.defer_context(ctx("kept"))
        raise RuntimeError("body failed")

    result = await make_runtime(json_tool("t", body)).execute(make_input("t"))
    assert result.is_error
    assert [c.content[0].text for c in result.additional_contexts] == ["kept"]  # type: ignore[union-attr]


async def test_deferred_contexts_survive_a_post_execute_listener_that_raises() -> None:
    # BEHAVIOUR f.6 / f.9: the body ran and deferred; a broken post-execute listener fails the call
    # POLICY_ERROR, and the context the body deferred still rides the failure.
    async def body(args: Any, run: ToolRunContext) -> str:
        run.defer_context(ctx("image attached"))
        return "done"

    class Broken:
        @hookimpl
        async def dsh_post_execute(self, execution: ToolExecution, result: ToolExecutionResult, next: Next) -> Any:
            raise RuntimeError("post hook broke")

    runtime = make_runtime(json_tool("t", body, output={"type": "string"}), plugins=[Broken()])
    result = await runtime.execute(make_input("t"))
    assert code(result) == "POLICY_ERROR"
    assert [c.content[0].text for c in result.additional_contexts] == ["image attached"]  # type: ignore[union-attr]


async def test_deferred_contexts_survive_a_wrapper_success_that_fails_the_output_contract() -> None:
    # A wrapper-authored success goes through the tool's output contract again (f.9); when it fails
    # there, the contexts the body deferred stay on the INVALID_TOOL_OUTPUT failure.
    async def body(args: Any, run: ToolRunContext) -> str:
        run.defer_context(ctx("image attached"))
        return "done"

    class ReplacesWithWrongType:
        @hookimpl
        async def dsh_execute(self, execution: ToolDispatchExecution, next: Next) -> Any:
            await next()
            return ToolExecutionSuccess(value=5, content=())

    runtime = make_runtime(json_tool("t", body, output={"type": "string"}), plugins=[ReplacesWithWrongType()])
    result = await runtime.execute(make_input("t"))
    assert code(result) == "INVALID_TOOL_OUTPUT"
    assert [c.content[0].text for c in result.additional_contexts] == ["image attached"]  # type: ignore[union-attr]


@pytest.mark.parametrize("body_fails", [False, True])
async def test_block_discards_deferred_contexts_and_keeps_its_own(body_fails: bool) -> None:
    async def body(args: Any, run: ToolRunContext) -> None:
        run.defer_context(ctx("dropped"))
        if body_fails:
            raise RuntimeError("the body failed after deferring")

    runtime = make_runtime(
        json_tool("t", body, output={"type": "null"}),
        plugins=[Post(lambda r: Block(feedback=[TextBlock("no")], additional_contexts=[ctx("own")]))],
    )
    result = await runtime.execute(make_input("t"))
    assert result.is_error
    assert [c.content[0].text for c in result.additional_contexts] == ["own"]  # type: ignore[union-attr]


async def test_conclude_turn_marks_success_only() -> None:
    async def body(args: Any, run: ToolRunContext) -> None:
        run.conclude_turn()

    runtime = make_runtime(json_tool("ok", body, output={"type": "null"}))
    assert (await runtime.execute(make_input("ok"))).concludes_turn is True

    runtime_block = make_runtime(
        json_tool("ok", body, output={"type": "null"}), plugins=[Post(lambda r: Block(feedback=[TextBlock("x")]))]
    )
    assert (await runtime_block.execute(make_input("ok"))).concludes_turn is False

    async def failing(args: Any, run: ToolRunContext) -> None:
        run.conclude_turn()
        raise RuntimeError("no")

    assert (await make_runtime(json_tool("bad", failing)).execute(make_input("bad"))).concludes_turn is False


async def test_content_replacement_keeps_conclude_turn() -> None:
    async def body(args: Any, run: ToolRunContext) -> None:
        run.conclude_turn()

    runtime = make_runtime(
        json_tool("ok", body, output={"type": "null"}),
        plugins=[Post(lambda r: Accept(content=[TextBlock("replaced")]))],
    )
    assert (await runtime.execute(make_input("ok"))).concludes_turn is True


# -- finalize_content ------------------------------------------------------------------------


def counting_finalizer(calls: list[ToolExecutionResult], replacement: Any = None) -> Callable[..., Any]:
    def finalize(execution: ToolExecution, result: ToolExecutionResult) -> Any:
        calls.append(result)
        return replacement

    return finalize


@pytest.mark.parametrize(
    ("scenario", "arguments"),
    [("success", {"a": 1, "b": 2}), ("denial", {"a": 1, "b": 2}), ("invalid-args", {"a": "x"}),
     ("invalid-output", {"a": 1, "b": 2}), ("non-json-args", {"a": float("nan")})],
)  # fmt: skip
async def test_finalize_content_runs_exactly_once_for_every_outcome(scenario: str, arguments: Any) -> None:
    calls: list[ToolExecutionResult] = []

    async def add(args: Any) -> object:
        return "not an int" if scenario == "invalid-output" else args["a"] + args["b"]

    tool = define_tool(
        name="add", description="",
        parameters={"a": {"type": "integer", "required": True}, "b": {"type": "integer", "required": True}},
        output={"type": "integer"}, execute=add, finalize_content=counting_finalizer(calls),
    )  # fmt: skip
    runtime = make_runtime(tool)
    if scenario == "denial":
        runtime.guard(lambda e: "no")
    result = await runtime.execute(make_input("add", arguments))
    assert len(calls) == 1
    assert calls[0].is_error == (scenario != "success")
    assert result.is_error == (scenario != "success")


async def test_finalize_content_replaces_only_content() -> None:
    calls: list[ToolExecutionResult] = []
    tool = add_tool(finalize_content=counting_finalizer(calls, [TextBlock("final")]))
    result = await make_runtime(tool).execute(make_input("add", {"a": 1, "b": 2}))
    assert isinstance(result, ToolExecutionSuccess)
    assert result.content == (TextBlock("final"),) and result.value == 3


async def test_raising_finalizer_is_contained_and_not_called_twice() -> None:
    calls: list[int] = []

    def finalize(execution: ToolExecution, result: ToolExecutionResult) -> Any:
        calls.append(1)
        raise RuntimeError("boom")

    result = await make_runtime(add_tool(finalize_content=finalize)).execute(make_input("add", {"a": 1, "b": 2}))
    assert calls == [1]
    assert result.is_error and "finalize_content violated its total contract" in result.error.message  # type: ignore[union-attr]


async def test_finalizer_returning_garbage_is_contained() -> None:
    result = await make_runtime(add_tool(finalize_content=lambda e, r: "garbage")).execute(
        make_input("add", {"a": 1, "b": 2})
    )
    assert result.is_error and "finalize_content" in result.error.message  # type: ignore[union-attr]


async def test_finalizer_is_captured_before_policy_runs() -> None:
    calls: list[ToolExecutionResult] = []
    runtime = make_runtime()
    dispose = runtime.register(add_tool(finalize_content=counting_finalizer(calls)))

    class Unregister:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
            dispose()
            raise RuntimeError("unregistered then threw")

    runtime.plugins.register(Unregister())
    result = await runtime.execute(make_input("add", {"a": 1, "b": 2}))
    assert result.is_error and len(calls) == 1 and calls[0].is_error


# -- observers -------------------------------------------------------------------------------


async def test_observers_receive_the_identical_frozen_result() -> None:
    recorder = Recorder()
    runtime = make_runtime(add_tool(), plugins=[recorder])
    result = await runtime.execute(make_input("add", {"a": 1, "b": 2}))
    ((execution, observed),) = recorder.results
    assert observed is result
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        observed.value = 5  # type: ignore[misc]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        execution.name = "other"  # type: ignore[misc]


async def test_raising_observer_is_logged_and_others_still_run(caplog: pytest.LogCaptureFixture) -> None:
    class Bad:
        @hookimpl
        def dsh_result(self, execution: ToolExecution, result: ToolExecutionResult) -> None:
            raise RuntimeError("observer broke")

    recorder = Recorder()
    runtime = make_runtime(add_tool(), plugins=[recorder])
    runtime.plugins.register(Bad(), name="bad-observer")
    result = await runtime.execute(make_input("add", {"a": 1, "b": 2}))
    assert not result.is_error and len(recorder.results) == 1
    assert "bad-observer failed: observer broke" in caplog.text


async def test_async_observers_are_awaited() -> None:
    seen: list[str] = []

    class AsyncObserver:
        @hookimpl
        async def dsh_result(self, execution: ToolExecution, result: ToolExecutionResult) -> None:
            seen.append(execution.call_id)

    runtime = make_runtime(add_tool(), plugins=[AsyncObserver()])
    await runtime.execute(make_input("add", {"a": 1, "b": 2}, call_id="c"))
    assert seen == ["c"]


async def test_exactly_one_notification_per_call_on_every_path() -> None:
    recorder = Recorder()
    runtime = make_runtime(add_tool(), plugins=[recorder])
    await runtime.execute(make_input("add", {"a": 1, "b": 2}))
    await runtime.execute(make_input("add", {"a": "bad"}))
    await runtime.execute(make_input("nope"))
    assert recorder.hooks.count("dsh_result") == 3


class Observer:
    """A dsh_result observer that records its label (sync or async, with pluggy's ordering marks)."""

    def __init__(self, label: str, log: list[str], *, asynchronous: bool = False, **marks: bool) -> None:
        def observe(execution: ToolExecution, result: ToolExecutionResult) -> None:
            log.append(label)

        async def observe_async(execution: ToolExecution, result: ToolExecutionResult) -> None:
            await trio.sleep(0)
            log.append(label)

        self.dsh_result = hookimpl(**marks)(observe_async if asynchronous else observe)


async def test_observers_run_in_pluggy_order_among_plugins_for_one_call() -> None:
    # Same order as the waterfalls (hookspecs "Order"): tryfirst, then later-registered first, then trylast.
    # An async observer that suspends does not let a later one go ahead of it.
    log: list[str] = []
    runtime = make_runtime(add_tool())
    for plugin in (
        Observer("n1", log),
        Observer("tf1", log, tryfirst=True),
        Observer("n2", log, asynchronous=True),
        Observer("tl1", log, trylast=True),
        Observer("tf2", log, tryfirst=True, asynchronous=True),
        Observer("n3", log),
    ):
        runtime.plugins.register(plugin)
    await runtime.execute(make_input("add", {"a": 1, "b": 2}))
    assert log == ["tf2", "tf1", "n3", "n2", "n1", "tl1"]


# -- execution_mode ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("classifier", "expected"),
    [(None, "exclusive"), (lambda a: True, "parallel"), (lambda a: False, "exclusive"),
     (lambda a: "yes", "exclusive"), (lambda a: 1, "exclusive"), (lambda a: 1 / 0, "exclusive")],
)  # fmt: skip
def test_execution_mode_is_parallel_only_for_exact_true(classifier: Any, expected: str) -> None:
    runtime = make_runtime(add_tool(is_concurrency_safe=classifier))
    assert runtime.execution_mode(make_input("add", {"a": 1, "b": 2})).kind == expected


def test_execution_mode_unknown_hidden_or_invalid_args_is_exclusive() -> None:
    runtime = make_runtime(add_tool(is_concurrency_safe=lambda a: True))
    assert runtime.execution_mode(make_input("nope")).kind == "exclusive"
    assert runtime.execution_mode(make_input("add", {"a": "x"})).kind == "exclusive"
    agent = Agent("a")
    runtime.restrict(__import__("dsh_core").ToolRestriction(deny=["add"]), agent)
    assert runtime.execution_mode(make_input("add", {"a": 1, "b": 2}, agent=agent)).kind == "exclusive"


@pytest.mark.parametrize("request_", [{"name": "add"}, "add", None], ids=["dict", "str", "None"])
def test_execution_mode_of_something_that_is_not_a_request_names_it(request_: Any) -> None:
    runtime = make_runtime(add_tool())
    with pytest.raises(TypeError) as raised:
        runtime.execution_mode(request_)
    assert str(raised.value) == f"execution_mode() takes a ToolExecutionInput, got {type(request_).__name__}"


def test_runtime_rejects_foreign_plugin_manager() -> None:
    import pluggy

    with pytest.raises(ValueError, match='PluginManager\\("dsh"\\)'):
        ToolRuntime(plugins=pluggy.PluginManager("other"))


@pytest.mark.parametrize("hook", ["pre", "post"])
async def test_a_listener_that_swallows_next_failure_and_returns_none_is_a_policy_error(hook: str) -> None:
    ran: list[str] = []

    class Swallower:
        @hookimpl(tryfirst=True)
        async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
            if hook != "pre":
                return await next()
            try:
                return await next()
            except DshError:
                return None  # neither a decision nor next()'s outcome: must not read as "passed through"

        @hookimpl(tryfirst=True)
        async def dsh_post_execute(self, execution: ToolExecution, result: ToolExecutionResult, next: Next) -> Any:
            if hook != "post":
                return await next()
            try:
                return await next()
            except DshError:
                return None

    class Raiser:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
            if hook == "pre":
                raise DshError("inner listener broke")
            return await next()

        @hookimpl
        async def dsh_post_execute(self, execution: ToolExecution, result: ToolExecutionResult, next: Next) -> Any:
            if hook == "post":
                raise DshError("inner listener broke")
            return await next()

    async def body(args: Any) -> int:
        ran.append("body")
        return 3

    tool = define_tool(
        name="add", description="Add", parameters={}, output={"type": "integer"}, execute=body,
    )  # fmt: skip
    runtime = make_runtime(tool, plugins=[Raiser(), Swallower()])
    result = await runtime.execute(make_input("add", {}))
    assert isinstance(result, ToolExecutionFailure)
    assert result.code == "POLICY_ERROR"
    assert result.error.info is not None and result.error.info.plugin is not None
    assert ran == ([] if hook == "pre" else ["body"])


async def test_a_body_whose_nursery_raised_one_error_is_reported_as_that_error() -> None:
    # trio wraps a failed task's exception in an ExceptionGroup; the model should read the error, not the wrapper.
    async def body(args: object) -> None:
        async def fail() -> None:
            raise PermissionError("no access to /etc/shadow")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(fail)

    runtime = ToolRuntime()
    runtime.register(define_tool(name="grouped", description="d", parameters={}, output={"type": "json"}, execute=body))
    result = await runtime.execute(make_input("grouped", {}))
    assert isinstance(result, ToolExecutionFailure)
    assert result.error == ToolFailure("no access to /etc/shadow", ToolErrorInfo("PermissionError", "TOOL_ERROR"))
    assert result.content == (TextBlock("Error: no access to /etc/shadow"),)


async def test_a_group_of_several_errors_is_reported_as_the_group() -> None:
    async def body(args: object) -> None:
        raise ExceptionGroup("two things broke", [ValueError("one"), KeyError("two")])

    runtime = ToolRuntime()
    runtime.register(define_tool(name="grouped", description="d", parameters={}, output={"type": "json"}, execute=body))
    result = await runtime.execute(make_input("grouped", {}))
    assert isinstance(result, ToolExecutionFailure)
    assert result.error.info == ToolErrorInfo("ExceptionGroup", "TOOL_ERROR")
    assert result.error.message == "two things broke (2 sub-exceptions)"


def test_result_classes_check_and_freeze_their_fields() -> None:
    # Plugins build results too: a malformed one must fail where it is made, not reach observers.
    meta = {"diff": ["a", "b"]}
    success = ToolExecutionSuccess("v", [TextBlock("v")], meta=meta)
    assert success.content == (TextBlock("v"),)
    assert type(success.meta) is FrozenDict and success.meta == {"diff": ("a", "b")}
    meta["diff"].append("c")
    assert success.meta == {"diff": ("a", "b")}  # a snapshot, not the caller's dict
    assert ToolExecutionSuccess([1, {"k": [2]}], ()).value == (1, {"k": (2,)})
    with pytest.raises(NonJsonValueError, match=r"\$\[0\]"):
        ToolExecutionSuccess([float("nan")], ())

    error = ToolFailure("broke")
    with pytest.raises(TypeError, match=r"result content\[1\] must be a TextBlock or ImageBlock, got str"):
        ToolExecutionFailure(error, (TextBlock("ok"), "junk"))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="result content must be a list of content blocks, got str"):
        ToolExecutionSuccess("v", "v")  # type: ignore[arg-type]
    with pytest.raises(NonJsonValueError, match=r"\$\.bad"):
        ToolExecutionFailure(error, (), meta={"bad": {1, 2}})
    with pytest.raises(TypeError, match=r"additional_contexts\[0\] must be a UserMessage, got str"):
        ToolExecutionFailure(error, (), additional_contexts=("later",))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ToolExecutionFailure("broke", ())  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ToolExecutionSuccess("v", (), concludes_turn=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ToolFailure(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ToolFailure("m", info="CODE")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ToolErrorInfo("Name", 7)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ToolErrorInfo("Name", "CODE", plugin=3)  # type: ignore[arg-type]


# -- the caller's input -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("call_id", 1, "ToolExecutionInput.call_id must be a non-empty str, got 1"),
        ("call_id", "", "ToolExecutionInput.call_id must be a non-empty str, got ''"),
        ("name", None, "ToolExecutionInput.name must be a str, got NoneType"),
        ("signal", None, "ToolExecutionInput.signal must be a CancelSignal (the caller's cancellation), got NoneType"),
        ("root_call_id", "", "ToolExecutionInput.root_call_id must be None or a non-empty str, got ''"),
        ("root_call_id", 5, "ToolExecutionInput.root_call_id must be None or a non-empty str, got 5"),
        ("parent", "c0", "ToolExecutionInput.parent must be None or the enclosing call's ToolExecutionToken, got str"),
        ("agent", ["worker"], "ToolExecutionInput.agent must be None or a hashable scope key, got list"),
    ],
)
def test_the_hosts_part_of_the_input_is_checked_where_it_is_built(field: str, value: object, message: str) -> None:
    fields: dict[str, Any] = {"call_id": "c1", "name": "echo", "arguments": {}, "signal": CancelSignal()}
    fields[field] = value
    with pytest.raises(TypeError) as raised:
        ToolExecutionInput(**fields)
    assert str(raised.value) == message


async def test_the_models_part_of_the_input_fails_the_call_not_the_host() -> None:
    """Any str name and any arguments are taken: an unknown name or bad arguments end the call, not the caller."""
    runtime = make_runtime(json_tool("echo"))
    for name, arguments, code in (
        ("", {}, "UNKNOWN_TOOL"),
        ("echo", {1: 2}, "INVALID_ARGS"),
        ("echo", b"x", "INVALID_ARGS"),
    ):
        result = await runtime.execute(
            ToolExecutionInput(call_id="c1", name=name, arguments=arguments, signal=CancelSignal())
        )
        assert result.is_error and result.code == code


@pytest.mark.parametrize(
    ("build", "error", "message"),
    [
        (lambda: ToolErrorInfo(name=1, code="X"), TypeError, "ToolErrorInfo.name must be a str, got int"),
        (lambda: ToolErrorInfo(name="E", code="X", plugin=3), TypeError,
         "ToolErrorInfo.plugin must be a str or None, got int"),
        (lambda: ToolFailure("m", info={}), TypeError, "ToolFailure.info must be a ToolErrorInfo or None, got dict"),
        (lambda: ToolExecutionSuccess(1, [], concludes_turn=1), TypeError,
         "ToolExecutionSuccess.concludes_turn must be a bool, got int"),
        (lambda: ToolExecutionFailure(error="boom", content=[]), TypeError,
         "ToolExecutionFailure.error must be a ToolFailure, got str"),
    ],
    ids=["info-name", "info-plugin", "failure-info", "success-concludes", "failure-error"],
)  # fmt: skip
def test_result_classes_name_the_field_a_wrong_value_was_given_for(
    build: Callable[[], object], error: type[Exception], message: str
) -> None:
    """The messages say which field and what it got (attrs' own are a tuple of the message and its context)."""
    with pytest.raises(error) as raised:
        build()
    assert str(raised.value) == message


async def test_execute_refuses_what_is_not_an_input() -> None:
    runtime = make_runtime(json_tool("echo"))
    with pytest.raises(TypeError) as raised:
        await runtime.execute({"call_id": "c1", "name": "echo"})  # type: ignore[arg-type]
    assert str(raised.value) == "execute() takes a ToolExecutionInput, got dict"


async def test_a_tool_replaced_while_its_call_waits_checks_the_arguments_against_the_new_schema() -> None:
    """They were checked against the replaced tool only: the new body got a tuple where its schema says string."""
    seen: list[Any] = []

    async def strict_body(args: Any) -> str:
        seen.append(args)
        return str(args["path"]).upper()

    loose = json_tool("write", parameters={"path": {"type": "json"}}, output={"type": "string"})
    strict = json_tool(
        "write", strict_body, parameters={"path": {"type": "string", "required": True}}, output={"type": "string"}
    )
    runtime = make_runtime()
    unregister = runtime.register(loose)

    class ReplaceWhileAsking:
        @hookimpl
        async def dsh_pre_execute(self, execution: Any, next: Callable[[], Awaitable[Any]]) -> Any:
            # A plugin reload, or an MCP server's list_changed, while the call waits (for approval, say).
            unregister()
            runtime.register(strict)
            await trio.sleep(0)
            return await next()

    runtime.plugins.register(ReplaceWhileAsking())
    failure = await runtime.execute(make_input("write", {"path": ["not", "a", "string"]}))
    assert failure.is_error and failure.code == "INVALID_ARGS"
    assert failure.error.message == (
        'invalid arguments: "path" must be a string (the tool was replaced while the call waited; '
        "its arguments were checked against the new definition)"
    )
    assert seen == []


async def test_calls_and_results_holding_deep_arrays_print_without_recursion_error() -> None:
    """A model's array 5 000 levels deep made repr(result) raise, and with it a failing test's message."""
    from dsh_core.testing import expect_failure

    deep: Any = []
    for _ in range(5000):
        deep = [deep]
    printed: list[str] = []

    class Prints:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Callable[[], Awaitable[Any]]) -> Any:
            printed.append(repr(execution))
            return await next()

    runtime = make_runtime(json_tool("echo", lambda args: args["x"], parameters={"x": {"type": "json"}}), plugins=[Prints()])
    request = make_input("echo", {"x": deep})
    result = await runtime.execute(request)
    # Printed whole (as JSON text) where the builtin repr gives up, or as Python 3.13+ shortens it.
    assert repr(request).startswith("ToolExecutionInput(") and "[[[[[" in repr(request)
    assert printed[0].startswith("ToolExecution(") and "arguments=FrozenDict({" in printed[0]
    assert "value=[[[" in repr(result) or "value=(((" in repr(result)
    with pytest.raises(AssertionError):
        expect_failure(result)  # its message shows the result: it must print
