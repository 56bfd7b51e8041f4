"""Arguments a tool's declaration refuses are refused before any policy sees them, and structured once.

A tool whose parameters are an attrs class (or a ``@tool`` signature) checks
more than its JSON schema says: a ``dict[str, int]``'s values, a ``float``'s
exactness, an attrs validator. Those checks run with the schema's, before
``dsh_pre_execute``, guards and approval, and the body gets that same instance.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import pytest

import dsh_core._definition as definition_module
from dsh_core import (
    RetryPolicy,
    Rewrite,
    ToolExecution,
    TransientToolError,
    define_tool,
    hookimpl,
    run_tool_calls,
    tool,
)
from dsh_core.testing import expect_failure, expect_success, make_input, make_runtime

Next = Callable[[], Awaitable[Any]]


class SeesCalls:
    """A pre-execute policy that records every call it is asked about."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    @hookimpl
    async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
        self.seen.append(dict(execution.arguments))
        return await next()


@attrs.frozen
class DeleteArgs:
    count: int = attrs.field(validator=attrs.validators.gt(0))


def _tools(ran: list[str]) -> list[Any]:
    @tool
    def set_limits(limits: dict[str, int]) -> str:
        """Set per-user limits."""
        ran.append("set_limits")
        return "ok"

    @tool
    def scale(factor: float) -> float:
        """Scale."""
        ran.append("scale")
        return factor

    async def delete(args: DeleteArgs) -> str:
        ran.append("delete")
        return "deleted"

    delete_tool = define_tool(
        name="delete", description="d", parameters=DeleteArgs, output={"type": "string"}, execute=delete
    )
    return [set_limits, scale, delete_tool]


@pytest.mark.parametrize(
    ("name", "arguments", "message"),
    [
        (
            "set_limits",
            {"limits": {"alice": "unlimited"}},
            "invalid arguments: expected an integer, got a string @ $.limits['alice']",
        ),
        (
            "scale",
            {"factor": 2**53 + 1},
            "invalid arguments: the integer 9007199254740993 has no exact float value @ $.factor",
        ),
        ("delete", {"count": -5}, "invalid arguments: invalid value ('count' must be > 0: -5) @ $"),
    ],
    ids=["dict-value-type", "inexact-float", "attrs-validator"],
)
async def test_arguments_the_declaration_refuses_never_reach_a_policy(
    name: str, arguments: dict[str, Any], message: str
) -> None:
    ran: list[str] = []
    policy = SeesCalls()
    guarded: list[str] = []
    runtime = make_runtime(*_tools(ran), plugins=[policy])
    runtime.guard(lambda execution: guarded.append(execution.name))
    failure = expect_failure(await runtime.execute(make_input(name, arguments)))
    assert (failure.code, failure.error.info.name, failure.error.message) == ("INVALID_ARGS", "ToolArgsError", message)
    assert policy.seen == []
    assert guarded == []
    assert ran == []


async def test_the_scheduler_refuses_them_before_policies_too() -> None:
    ran: list[str] = []
    policy = SeesCalls()
    runtime = make_runtime(*_tools(ran), plugins=[policy])
    results = await run_tool_calls(runtime, [make_input("delete", {"count": -5}), make_input("delete", {"count": 2})])
    assert [expect_failure(results[0]).code, expect_success(results[1]).value] == ["INVALID_ARGS", "deleted"]
    assert policy.seen == [{"count": 2}]
    assert ran == ["delete"]


def _count_structuring(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    structured: list[Any] = []
    real = definition_module.structure_args

    def counting(cls: Any, args: Any) -> Any:
        structured.append(dict(args))
        return real(cls, args)

    monkeypatch.setattr(definition_module, "structure_args", counting)
    return structured


async def test_the_body_gets_the_instance_structured_before_the_policies(monkeypatch: pytest.MonkeyPatch) -> None:
    structured = _count_structuring(monkeypatch)
    events: list[str] = []

    async def delete(args: DeleteArgs) -> str:
        events.append(f"body {args!r} after {len(structured)} structuring")
        return "deleted"

    delete_tool = define_tool(
        name="delete", description="d", parameters=DeleteArgs, output={"type": "string"}, execute=delete
    )

    class Policy:
        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
            events.append(f"policy after {len(structured)} structuring")
            return await next()

    runtime = make_runtime(delete_tool, plugins=[Policy()])
    assert expect_success(await runtime.execute(make_input("delete", {"count": 3}))).value == "deleted"
    assert events == ["policy after 1 structuring", "body DeleteArgs(count=3) after 1 structuring"]
    assert structured == [{"count": 3}]


class RewriteCount:
    """Rewrites ``count`` to ``to`` once."""

    def __init__(self, to: Any) -> None:
        self.to = to

    @hookimpl
    async def dsh_pre_execute(self, execution: ToolExecution, next: Next) -> Any:
        decision = await next()
        if execution.arguments["count"] != self.to:
            return Rewrite({"count": self.to}, "adjusted the count")
        return decision


async def test_a_rewrite_the_declaration_refuses_fails_invalid_args_and_the_body_never_runs() -> None:
    ran: list[str] = []
    runtime = make_runtime(*_tools(ran))
    runtime.plugins.register(RewriteCount(-1), name="shrinks")
    failure = expect_failure(await runtime.execute(make_input("delete", {"count": 2})))
    assert failure.code == "INVALID_ARGS"
    assert failure.error.message == (
        "arguments rewritten by shrinks are invalid: invalid arguments: invalid value ('count' must be > 0: -1) @ $"
    )
    assert failure.error.info is not None and failure.error.info.plugin == "shrinks"
    assert ran == []


async def test_only_the_rewritten_arguments_instance_reaches_the_body(monkeypatch: pytest.MonkeyPatch) -> None:
    structured = _count_structuring(monkeypatch)
    received: list[Any] = []

    async def delete(args: DeleteArgs) -> str:
        received.append(args)
        return "deleted"

    delete_tool = define_tool(
        name="delete", description="d", parameters=DeleteArgs, output={"type": "string"}, execute=delete
    )
    runtime = make_runtime(delete_tool, plugins=[RewriteCount(7)])
    expect_success(await runtime.execute(make_input("delete", {"count": 2})))
    assert received == [DeleteArgs(count=7)]
    # The call's arguments, then the rewrite's: each structured once, none again for the body.
    assert structured == [{"count": 2}, {"count": 7}]


@attrs.define
class Batch:
    items: list[int]


async def test_each_retry_attempt_gets_a_fresh_instance() -> None:
    # A mutable arguments object the first attempt changed must not carry into the next.
    received: list[list[int]] = []

    def take(args: Batch) -> str:
        received.append(list(args.items))
        args.items.append(0)
        if len(received) == 1:
            raise TransientToolError("try again")
        return "taken"

    take_tool = define_tool(
        name="take",
        description="t",
        parameters=Batch,
        output={"type": "string"},
        execute=take,
        retry=RetryPolicy(initial_delay_s=0, jitter=0),
    )
    runtime = make_runtime(take_tool, plugins=[SeesCalls()])
    assert expect_success(await runtime.execute(make_input("take", {"items": [1, 2]}))).value == "taken"
    assert received == [[1, 2], [1, 2]]


async def test_a_tool_replaced_before_dispatch_structures_its_own_arguments() -> None:
    @attrs.frozen
    class Other:
        count: int

    received: list[Any] = []

    async def other(args: Other) -> str:
        received.append(args)
        return "other"

    ran: list[str] = []
    runtime = make_runtime()
    remove_original = runtime.register(_tools(ran)[2])
    replacement = define_tool(
        name="delete", description="d", parameters=Other, output={"type": "string"}, execute=other
    )

    def replace(execution: ToolExecution) -> None:
        remove_original()
        runtime.register(replacement)

    runtime.guard(replace)
    assert expect_success(await runtime.execute(make_input("delete", {"count": 4}))).value == "other"
    assert received == [Other(count=4)]
    assert ran == []
