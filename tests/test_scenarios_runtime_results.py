"""Scenario catalogue S1-S42 (tools.spec, ToolRuntime): registration and schemas, the output
contract, post-execute decisions, wrapper-authored results, nested conclusion and ask routing.

Only the scenarios the rest of the suite does not already pin live here. ``echo_tool`` is the
catalogue's ``echo`` fixture: an optional ``text`` parameter, a string output rendered as one
text block, and a body that returns ``text`` (``""`` when absent).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from dsh_core import (
    Accept,
    Agent,
    Ask,
    Block,
    CancelSignal,
    Deny,
    DshError,
    ImageBlock,
    TextBlock,
    ToolDefinition,
    ToolDispatchExecution,
    ToolErrorInfo,
    ToolExecution,
    ToolExecutionFailure,
    ToolExecutionInput,
    ToolExecutionResult,
    ToolExecutionSuccess,
    ToolFailure,
    ToolNotFoundError,
    ToolOutput,
    ToolRunContext,
    ToolRuntime,
    UserMessage,
    define_tool,
    hookimpl,
)
from dsh_core.testing import Recorder, expect_failure, json_tool, make_input, make_runtime

Next = Callable[[], Awaitable[Any]]

OUTPUT_ERROR = ToolErrorInfo(name="ToolOutputError", code="INVALID_TOOL_OUTPUT")
UNKNOWN_ECHO = ToolFailure(
    message='unknown tool "echo"', info=ToolErrorInfo(name="ToolNotFoundError", code="UNKNOWN_TOOL")
)


def echo_tool(
    name: str = "echo",
    *,
    body: Callable[..., Awaitable[Any]] | None = None,
    meta: Callable[[Any, Any], Any] | None = None,
    **options: Any,
) -> ToolDefinition:
    async def echo(args: Any) -> Any:
        return args.get("text", "")

    return define_tool(
        name=name,
        description="echo arguments back",
        parameters={"text": {"type": "string"}},
        output=ToolOutput(
            schema={"type": "string"}, render=lambda args, value: [TextBlock(value)], presentation_meta=meta
        ),
        execute=body or echo,
        **options,
    )


def listener(hook: str, fn: Callable[..., Any], **marks: bool) -> object:
    """A plugin object whose only hookimpl is ``fn`` for ``hook``."""

    class Plugin:
        pass

    plugin = Plugin()
    setattr(plugin, hook, hookimpl(**marks)(fn))
    return plugin


def post_decision(decide: Callable[[ToolExecution, ToolExecutionResult], Any]) -> object:
    """A post-execute listener that lets the chain run, then returns ``decide(execution, result)``."""

    async def post(execution: ToolExecution, result: ToolExecutionResult, next: Next) -> Any:
        await next()
        return decide(execution, result)

    return listener("dsh_post_execute", post)


def ctx(text: str) -> UserMessage:
    return UserMessage([TextBlock(text)], source="test")



class Hostile:
    """A value whose inspection raises: the Python stand-in for an object with a throwing getter.

    ``isinstance`` falls back to ``__class__`` for a type it does not recognise directly, so any
    type check on this object runs the property and raises.
    """

    def __init__(self, message: str) -> None:
        self.message = message

    @property  # type: ignore[misc]
    def __class__(self) -> type:
        raise RuntimeError(self.message)


class ExplodingIterable:
    """An iterable whose iteration raises."""

    def __init__(self, message: str) -> None:
        self.message = message

    def __iter__(self) -> Iterator[Any]:
        raise RuntimeError(self.message)


async def _ok(args: Any) -> str:
    return "ok"


# -- registration and schemas --------------------------------------------------------------------


def test_registered_echo_projects_exactly_its_model_schema() -> None:
    """S1: registering echo yields exactly one model schema, and the model request lists only echo."""
    runtime = ToolRuntime()
    runtime.register(echo_tool())
    schemas = runtime.schemas()
    assert [schema.to_dict() for schema in schemas] == [
        {
            "name": "echo",
            "description": "echo arguments back",
            "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
        }
    ]
    assert not hasattr(schemas[0], "execute")
    request = runtime.model_tools()
    assert [schema.name for schema in request.schemas] == ["echo"]
    assert request.instructions == ""
    assert runtime.names() == ["echo"]


# -- success results and the output contract ----------------------------------------------------------


async def test_presentation_meta_is_projected_onto_the_result() -> None:
    """S5: a declared presentation_meta projector puts its value on the success, beside value and content."""
    tool = echo_tool(
        "meta-tool", body=_ok, meta=lambda args, value: {"diffs": [{"path": "a", "oldText": None, "newText": "x"}]}
    )
    result = await make_runtime(tool).execute(make_input("meta-tool"))
    assert result == ToolExecutionSuccess(
        value="ok",
        content=(TextBlock("ok"),),
        meta={"diffs": ({"path": "a", "oldText": None, "newText": "x"},)},
    )


async def test_non_json_presentation_meta_fails_before_observers_see_the_result() -> None:
    """S7: presentation_meta returning a function is INVALID_TOOL_OUTPUT, and observers see that failure."""
    recorder = Recorder()
    tool = echo_tool("meta-tool", body=_ok, meta=lambda args, value: lambda: None)
    runtime = make_runtime(tool, plugins=[recorder])
    result = expect_failure(await runtime.execute(make_input("meta-tool")))
    assert result.error.info == OUTPUT_ERROR
    assert result.error.message.startswith(
        'tool "meta-tool" returned invalid output: output.presentation_meta returned non-lossless JSON'
    )
    assert result.content == (TextBlock(f"Error: {result.error.message}"),)
    [(_, observed)] = recorder.results
    assert observed is result and observed.is_error


async def test_meta_whose_inspection_raises_still_reaches_the_finalizer_once() -> None:
    """S8: a meta value that raises while being snapshotted becomes a failure the finalizer still shapes."""
    calls: list[ToolExecutionResult] = []

    def truncate(execution: ToolExecution, result: ToolExecutionResult) -> Any:
        calls.append(result)
        first = result.content[0]
        assert isinstance(first, TextBlock)
        return [TextBlock(first.text[:32]), *result.content[1:]]

    tool = echo_tool(
        "throwing-meta", body=_ok, meta=lambda args, value: {"card": Hostile("m" * 1700)}, finalize_content=truncate
    )
    result = expect_failure(await make_runtime(tool).execute(make_input("throwing-meta")))
    [seen] = calls
    assert expect_failure(seen).error.message == (
        f'tool "throwing-meta" returned invalid output: output.presentation_meta failed: {"m" * 1700}'
    )
    assert result.error.info == OUTPUT_ERROR
    [block] = result.content
    assert isinstance(block, TextBlock)
    assert block.text == 'Error: tool "throwing-meta" retu'
    assert len(block.text) == 32


async def test_lossy_and_mismatched_body_values_are_invalid_output() -> None:
    """S11: a function value is not lossless JSON; 42 for a string output names the mismatch."""

    async def lossy(args: Any) -> Any:
        return lambda: None

    async def wrong(args: Any) -> Any:
        return 42

    runtime = make_runtime(
        json_tool("lossy-output", lossy, output={"type": "json"}),
        json_tool("wrong-output", wrong, output={"type": "string"}),
    )
    lossy_result = expect_failure(await runtime.execute(make_input("lossy-output")))
    wrong_result = expect_failure(await runtime.execute(make_input("wrong-output")))
    assert lossy_result.error.info == OUTPUT_ERROR
    assert wrong_result.error.info == OUTPUT_ERROR
    assert "not lossless JSON" in lossy_result.error.message
    assert '"value" must be a string' in wrong_result.error.message


async def test_body_value_whose_inspection_raises_is_invalid_output() -> None:
    """S12: a body value whose inspection raises is an INVALID_TOOL_OUTPUT failure, not an exception."""

    async def body(args: Any) -> Any:
        return {"payload": Hostile("body snapshot getter exploded")}

    result = expect_failure(await make_runtime(json_tool("t", body)).execute(make_input("t")))
    assert result.error.info == OUTPUT_ERROR
    assert "value snapshot failed: body snapshot getter exploded" in result.error.message


@pytest.mark.parametrize(
    ("seat", "projector"),
    [
        ("render", lambda args, value: ExplodingIterable("snapshot getter exploded")),
        ("presentation_meta", lambda args, value: {"card": Hostile("snapshot getter exploded")}),
    ],
)
async def test_projector_output_whose_inspection_raises_is_invalid_output(
    seat: str, projector: Callable[[Any, Any], Any]
) -> None:
    """S14: a projector whose returned value raises while being read fails the call as INVALID_TOOL_OUTPUT."""
    tool = json_tool("t", output=ToolOutput(schema={"type": "json"}, **{seat: projector}))
    result = expect_failure(await make_runtime(tool).execute(make_input("t")))
    assert result.error.info == OUTPUT_ERROR
    assert result.error.message == f'tool "t" returned invalid output: output.{seat} failed: snapshot getter exploded'
    assert not hasattr(result, "value")


# -- post-execute decisions -------------------------------------------------------------------------------


def projected_tool() -> ToolDefinition:
    async def body(args: Any) -> Any:
        return {"text": "body"}

    return define_tool(
        name="projected",
        description="projects its value",
        parameters={},
        output=ToolOutput(
            schema={
                "type": "object",
                "additionalProperties": False,
                "properties": {"text": {"type": "string", "required": True}},
            },
            render=lambda args, value: [TextBlock(f"render:{value['text']}")],
            presentation_meta=lambda args, value: {"projected": value["text"]},
        ),
        execute=body,
    )


async def test_accept_content_replaces_only_the_content() -> None:
    """S15: Accept(content=...) keeps the body's value and meta and swaps only the content."""
    runtime = make_runtime(
        projected_tool(), plugins=[post_decision(lambda e, r: Accept(content=[TextBlock("policy content")]))]
    )
    result = await runtime.execute(make_input("projected"))
    assert result == ToolExecutionSuccess(
        value={"text": "body"}, content=(TextBlock("policy content"),), meta={"projected": "body"}
    )


async def test_accept_value_rerenders_content_and_meta_and_carries_contexts() -> None:
    """S15: Accept(value=...) re-renders content and re-projects meta from the new value; contexts ride along."""
    context = ctx("value context")
    decision = Accept(value={"text": "policy value"}, additional_contexts=[context])
    runtime = make_runtime(projected_tool(), plugins=[post_decision(lambda e, r: decision)])
    result = await runtime.execute(make_input("projected"))
    assert result == ToolExecutionSuccess(
        value={"text": "policy value"},
        content=(TextBlock("render:policy value"),),
        meta={"projected": "policy value"},
        additional_contexts=(context,),
    )


async def test_accept_replacing_both_value_and_content_is_a_policy_error() -> None:
    """S16: a post-execute Accept with both value and content fails the call as POLICY_ERROR."""
    decide = post_decision(lambda e, r: Accept(value="x", content=[TextBlock("y")]))
    runtime = make_runtime(echo_tool())
    runtime.plugins.register(decide, name="both")
    result = expect_failure(await runtime.execute(make_input("echo", {"text": "hi"})))
    assert result.error == ToolFailure(
        message="an Accept decision cannot replace both value and content",
        info=ToolErrorInfo(name="PolicyError", code="POLICY_ERROR", plugin="both"),
    )
    assert not hasattr(result, "value")


async def test_value_replacement_manufactures_no_context() -> None:
    """S18: Accept(value=...) alone yields the re-rendered success with no additional contexts."""
    runtime = make_runtime(echo_tool(), plugins=[post_decision(lambda e, r: Accept(value="replacement"))])
    result = await runtime.execute(make_input("echo", {"text": "hi"}))
    assert result == ToolExecutionSuccess(value="replacement", content=(TextBlock("replacement"),))
    assert result.additional_contexts == ()


@pytest.mark.parametrize(
    ("feedback", "message"),
    [
        ([ImageBlock("aGk=", "image/png")], "[image content]"),
        ([TextBlock("look"), ImageBlock("aGk=", "image/png")], "look\n[image content]"),
    ],
    ids=["image-only", "text-then-image"],
)
async def test_block_message_names_non_text_feedback_blocks(feedback: list[Any], message: str) -> None:
    """S19: the block message spells a non-text feedback block as ``[<type> content]``."""
    runtime = make_runtime(echo_tool(), plugins=[post_decision(lambda e, r: Block(feedback=feedback))])
    result = expect_failure(await runtime.execute(make_input("echo", {"text": "hi"})))
    assert result.error.message == message
    assert result.content == tuple(feedback)


async def test_block_with_feedback_that_is_not_content_is_refused() -> None:
    """S20: Block feedback holding a non-content item (a function) fails the call instead of leaking it."""
    decide = post_decision(lambda e, r: Block(feedback=[TextBlock("ok"), lambda: None]))
    runtime = make_runtime(echo_tool())
    runtime.plugins.register(decide, name="bad-feedback")
    result = expect_failure(await runtime.execute(make_input("echo", {"text": "hi"})))
    assert result.error == ToolFailure(
        message="content[1] must be a TextBlock or ImageBlock, got function",
        info=ToolErrorInfo(name="PolicyError", code="POLICY_ERROR", plugin="bad-feedback"),
    )
    assert result.content == (TextBlock(f"Error: {result.error.message}"),)


async def test_value_replacement_of_a_failed_dispatch_is_refused() -> None:
    """S21: a body that raised cannot have its value replaced by post-execute."""

    async def body(args: Any) -> Any:
        raise RuntimeError("body failed")

    runtime = make_runtime(echo_tool(body=body), plugins=[post_decision(lambda e, r: Accept(value="replacement"))])
    result = expect_failure(await runtime.execute(make_input("echo", {"text": "hi"})))
    assert result.error.message == "dsh_post_execute cannot replace the value of a failed result"
    assert result.error.info is not None and result.error.info.code == "POLICY_ERROR"


async def test_value_replacement_after_the_tool_vanished_is_unknown_tool() -> None:
    """S22: a post listener that unregisters the tool, then replaces the value, gets UNKNOWN_TOOL."""
    runtime = ToolRuntime()
    dispose = runtime.register(echo_tool())

    def decide(execution: ToolExecution, result: ToolExecutionResult) -> Any:
        dispose()
        return Accept(value="replacement")

    runtime.plugins.register(post_decision(decide))
    result = expect_failure(await runtime.execute(make_input("echo", {"text": "hi"})))
    assert result.error == UNKNOWN_ECHO
    assert result.content == (TextBlock('Error: unknown tool "echo"'),)


# -- results authored by dsh_execute wrappers -------------------------------------------------------------


def short_circuit(make: Callable[[], ToolExecutionResult], before: Callable[[], object] = lambda: None) -> object:
    async def wrapper(execution: ToolDispatchExecution, next: Next) -> Any:
        before()
        return make()

    return listener("dsh_execute", wrapper)


async def test_wrapper_authored_failure_is_kept_field_for_field() -> None:
    """S23: a failure a wrapper builds itself comes back with its message, content, meta and contexts."""
    context = ctx("wrapper context")

    def authored() -> ToolExecutionResult:
        return ToolExecutionFailure(
            error=ToolFailure("wrapped failure"),
            content=(TextBlock("wrapper content"),),
            meta={"wrapped": True},
            additional_contexts=(context,),
        )

    runtime = make_runtime(echo_tool(), plugins=[short_circuit(authored)])
    result = await runtime.execute(make_input("echo", {"text": "hi"}))
    assert result == ToolExecutionFailure(
        error=ToolFailure("wrapped failure"),
        content=(TextBlock("wrapper content"),),
        meta={"wrapped": True},
        additional_contexts=(context,),
    )


async def test_wrapper_authored_failure_is_frozen_before_it_is_returned() -> None:
    """S23: the wrapper's failure is materialised: its meta is an immutable snapshot, not the wrapper's dict."""
    meta = {"wrapped": True}
    runtime = make_runtime(
        echo_tool(),
        plugins=[
            short_circuit(lambda: ToolExecutionFailure(error=ToolFailure("wrapped failure"), content=(), meta=meta))
        ],
    )
    result = await runtime.execute(make_input("echo", {"text": "hi"}))
    assert result.meta is not meta
    with pytest.raises(TypeError):
        result.meta["wrapped"] = False  # type: ignore[index]


@pytest.mark.parametrize(
    ("authored", "message", "code"),
    [
        (
            lambda: ToolExecutionFailure(error=ToolFailure("wrapped failure"), content=(), meta={"bad": {1, 2}}),
            "$.bad: sets are not JSON (use a list)",
            "NON_JSON_VALUE",
        ),
        (
            lambda: ToolExecutionFailure(error=ToolFailure("wrapped failure"), content=(TextBlock("ok"), "junk")),  # type: ignore[arg-type]
            "result content[1] must be a TextBlock or ImageBlock, got str",
            "POLICY_ERROR",
        ),
    ],
    ids=["set-in-meta", "str-in-content"],
)
async def test_wrapper_authored_failure_with_non_json_fields_is_replaced(
    authored: Callable[[], ToolExecutionResult], message: str, code: str
) -> None:
    """S23: a wrapper's failure whose fields are not lossless JSON content becomes a fresh, clean failure.

    Python adaptation: results check and freeze their fields when they are built, so the
    malformed result never exists; the wrapper that tried fails the call, named as its plugin.
    """
    runtime = make_runtime(echo_tool())
    runtime.plugins.register(short_circuit(authored), name="sloppy-wrapper")
    result = expect_failure(await runtime.execute(make_input("echo", {"text": "hi"})))
    assert result.error.message == message
    assert result.error.info is not None
    assert (result.error.info.code, result.error.info.plugin) == (code, "sloppy-wrapper")
    assert result.content == (TextBlock(f"Error: {message}"),)
    assert result.meta is None


async def test_wrapper_authored_success_after_the_tool_vanished_is_unknown_tool() -> None:
    """S24: a wrapper that unregisters the tool, then returns its own success, gets UNKNOWN_TOOL."""
    runtime = ToolRuntime()
    dispose = runtime.register(echo_tool())
    runtime.plugins.register(
        short_circuit(lambda: ToolExecutionSuccess(value="replacement", content=()), before=dispose)
    )
    result = expect_failure(await runtime.execute(make_input("echo", {"text": "hi"})))
    assert result.error == UNKNOWN_ECHO
    assert result.content == (TextBlock('Error: unknown tool "echo"'),)


# -- nested calls and conclude_turn ------------------------------------------------------------------------


async def test_nested_conclusion_is_forwarded_unless_policy_blocked_it() -> None:
    """S26: a composite forwards a nested call's concludes_turn; a block on the nested call removes it."""
    runtime = ToolRuntime()

    async def terminal(args: Any, run: ToolRunContext) -> None:
        run.conclude_turn()

    async def composite(args: Any, run: ToolRunContext) -> str:
        nested = await runtime.execute(
            ToolExecutionInput(
                call_id=f"{run.call_id}:nested",
                name="terminal-nested",
                arguments={},
                signal=run.signal,
                agent=run.agent,
                parent=run.token,
            )
        )
        if nested.concludes_turn:
            run.conclude_turn()
        return "composite finished"

    runtime.register(json_tool("terminal-nested", terminal, output={"type": "null"}))
    runtime.register(json_tool("composite", composite, output={"type": "string"}))
    blocker = post_decision(
        lambda e, r: Block(feedback=[TextBlock("not yet")]) if e.name == "terminal-nested" else Accept()
    )
    runtime.plugins.register(blocker)
    blocked = await runtime.execute(make_input("composite"))
    assert blocked == ToolExecutionSuccess(value="composite finished", content=(TextBlock("composite finished"),))
    assert blocked.concludes_turn is False

    runtime.plugins.unregister(blocker)
    lifted = await runtime.execute(make_input("composite"))
    assert lifted == ToolExecutionSuccess(
        value="composite finished", content=(TextBlock("composite finished"),), concludes_turn=True
    )


# -- failures of the tool itself ------------------------------------------------------------------------


async def test_unknown_and_throwing_tools_are_structured_failures() -> None:
    """S27: an unknown name and a raising body both come back as failures with ``Error: <message>`` text."""

    async def boom(args: Any) -> Any:
        raise RuntimeError("exploded")

    runtime = make_runtime(json_tool("boom", boom))
    unknown = expect_failure(await runtime.execute(make_input("nope")))
    assert unknown.content == (TextBlock('Error: unknown tool "nope"'),)
    assert unknown.error == ToolFailure(
        message='unknown tool "nope"', info=ToolErrorInfo(name="ToolNotFoundError", code="UNKNOWN_TOOL")
    )
    thrown = expect_failure(await runtime.execute(make_input("boom")))
    assert thrown.content == (TextBlock("Error: exploded"),)
    assert thrown.error.message == "exploded"


async def test_body_raising_an_unprintable_exception_still_resolves() -> None:
    """S28: a body raising an exception whose ``__str__`` raises resolves to a failure with placeholder text."""

    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("cannot print me")

    async def body(args: Any) -> Any:
        raise Unprintable()

    result = expect_failure(await make_runtime(json_tool("hostile", body)).execute(make_input("hostile")))
    assert result.content == (TextBlock("Error: <unprintable exception>"),)
    assert result.error.message == "<unprintable exception>"


def test_tool_not_found_error_is_a_dsh_error_with_a_stable_code() -> None:
    """S29: ToolNotFoundError("ghost") is a DshError named ToolNotFoundError with code UNKNOWN_TOOL."""
    error = ToolNotFoundError("ghost")
    assert isinstance(error, DshError)
    assert type(error).__name__ == "ToolNotFoundError"
    assert error.code == "UNKNOWN_TOOL"
    assert error.message == str(error) == 'unknown tool "ghost"'


# -- pre-execute and approval --------------------------------------------------------------------------


async def test_pre_execute_denial_reaches_post_execute_as_a_frozen_result() -> None:
    """S30: a denial fails with ``Error: <reason>`` and post-execute sees it as an immutable result."""
    mutations: list[str] = []

    async def deny(execution: ToolExecution, next: Next) -> Any:
        return Deny("denied by policy")

    async def post(execution: ToolExecution, result: ToolExecutionResult, next: Next) -> Any:
        try:
            result.content = ()  # type: ignore[misc]
        except attrs.exceptions.FrozenInstanceError:
            mutations.append("refused")
        else:
            mutations.append("accepted")
        return await next()

    runtime = make_runtime(echo_tool(), plugins=[listener("dsh_pre_execute", deny), listener("dsh_post_execute", post)])
    result = expect_failure(await runtime.execute(make_input("echo", {"text": "hi"})))
    assert result.content == (TextBlock("Error: denied by policy"),)
    assert result.error.message == "denied by policy"
    assert mutations == ["refused"]


async def test_ask_allowed_once_dispatches_and_routes_the_callers_identity() -> None:
    """S33: an allowed-once answer runs the call; the service was asked once, with agent, call id, reason, signal."""
    asked: list[tuple[ToolExecution, str | None]] = []

    class Answerer:
        async def request(self, execution: ToolExecution, reason: str | None) -> str:
            asked.append((execution, reason))
            return "allowed-once"

    async def ask(execution: ToolExecution, next: Next) -> Any:
        return Ask("hook wants a human")

    agent = Agent("main")
    signal = CancelSignal()
    runtime = make_runtime(echo_tool(), plugins=[listener("dsh_pre_execute", ask)], approval=Answerer())
    result = await runtime.execute(
        ToolExecutionInput(call_id="c1", name="echo", arguments={"text": "hi"}, signal=signal, agent=agent)
    )
    assert result == ToolExecutionSuccess(value="hi", content=(TextBlock("hi"),))
    [(execution, reason)] = asked
    assert (execution.agent, execution.name, execution.call_id, reason) == (agent, "echo", "c1", "hook wants a human")
    assert execution.signal is signal


async def test_caller_cancel_overtakes_a_late_approval(autojump_clock: trio.testing.MockClock) -> None:
    """S36: an approval answering allowed-once after the caller cancelled still ends ABORTED_BEFORE_DISPATCH."""
    runs: list[str] = []

    class LateAnswerer:
        async def request(self, execution: ToolExecution, reason: str | None) -> str:
            with trio.CancelScope(shield=True):  # ignores the cancellation, answers anyway
                await execution.signal.wait()
                await trio.sleep(1)
            return "allowed-once"

    async def ask(execution: ToolExecution, next: Next) -> Any:
        return Ask("needs a human")

    async def body(args: Any) -> str:
        runs.append("body")
        await trio.sleep(0)
        return "ran"

    async def cancel_soon(signal: CancelSignal) -> None:
        await trio.sleep(5)
        signal.cancel("user pressed stop")

    runtime = make_runtime(echo_tool(body=body), plugins=[listener("dsh_pre_execute", ask)], approval=LateAnswerer())
    signal = CancelSignal()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancel_soon, signal)
        result = expect_failure(await runtime.execute(make_input("echo", signal=signal, agent=Agent("main"))))
    assert result.error.info is not None
    assert (result.error.info.name, result.error.info.code) == ("AbortError", "ABORTED_BEFORE_DISPATCH")
    assert runs == []


# -- finalize_content after a pipeline failure ----------------------------------------------------------


async def test_snapshotted_finalizer_shapes_a_pipeline_failure() -> None:
    """S42: the finalizer captured before policy still runs when a listener unregistered the tool and raised."""
    seen: list[tuple[str, bool]] = []

    def finalize(execution: ToolExecution, result: ToolExecutionResult) -> Any:
        seen.append((execution.name, result.is_error))
        return [TextBlock("bounded failure")]

    runtime = ToolRuntime()
    dispose = runtime.register(json_tool("bounded", finalize_content=finalize))

    async def unregister_then_fail(execution: ToolExecution, next: Next) -> Any:
        dispose()
        raise DshError("policy failed", code="POLICY_FAILED")

    runtime.plugins.register(listener("dsh_pre_execute", unregister_then_fail), name="policy")
    result = await runtime.execute(make_input("bounded"))
    assert result == ToolExecutionFailure(
        error=ToolFailure(
            message="policy failed", info=ToolErrorInfo(name="DshError", code="POLICY_FAILED", plugin="policy")
        ),
        content=(TextBlock("bounded failure"),),
    )
    assert seen == [("bounded", True)]
