"""Faulty plugins, listeners, observers, finalizers and presenters: each fault is contained.

Every test injects one fault into a working runtime and checks three things:
the call still ends in exactly one structured result (or the fault is logged,
for observers and presenters), the fault is attributed to the plugin by name
(``result.error.info.plugin`` or the log record), and the same runtime then
serves an ordinary call. Hangs run on trio's virtual clock and are ended by
the caller's ``CancelSignal``.

``Evil`` is a ``BaseException`` that is neither an ``Exception`` nor trio's
cancellation: reading ``dsh_core._waterfall.is_fatal``, the runtime lets only
``trio.Cancelled``, ``KeyboardInterrupt``, ``SystemExit`` and ``GeneratorExit``
escape, so ``Evil`` must come back as a failure like any other error. Where it
does not, the test is a strict xfail naming the bug (RELIABILITY.md lists them).
"""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pluggy
import pytest
import trio
import trio.testing
from conftest_reliability import *  # noqa: F403 - fixtures and FIGURES
from conftest_reliability import FIGURES, TaskAudit

from dsh_core import (
    Accept,
    Agent,
    Allow,
    Ask,
    CancelSignal,
    Deny,
    DshError,
    ImageBlock,
    PolicyError,
    TextBlock,
    ToolDispatchExecution,
    ToolErrorInfo,
    ToolExecution,
    ToolExecutionFailure,
    ToolExecutionResult,
    ToolExecutionSuccess,
    ToolFailure,
    ToolOutput,
    ToolRunContext,
    ToolRuntime,
    UserMessage,
    hookimpl,
    json_equal,
    run_tool_calls,
)
from dsh_core._json import safe_repr
from dsh_core._results import failure_from_exception
from dsh_core.presentation import GenericCallView, TerminalCallView
from dsh_core.testing import StaticApproval, expect_failure, json_tool, make_input, make_runtime

Next = Callable[[], Awaitable[Any]]
FAULTY = "faulty"


class Evil(BaseException):
    """A BaseException that is not trio's cancellation (nor KeyboardInterrupt/SystemExit)."""


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("cannot print me")


def listener(hook: str, fn: Callable[..., Any], **marks: bool) -> object:
    """A plugin object whose only hookimpl is ``fn`` for ``hook``."""

    class Plugin:
        pass

    plugin = Plugin()
    setattr(plugin, hook, hookimpl(**marks)(fn))
    return plugin


class Tool:
    """A tool that records how often its body started and finished."""

    def __init__(self, name: str = "work", body: Callable[..., Awaitable[Any]] | None = None, **options: Any) -> None:
        self.entered = 0
        self.exited = 0

        async def default(args: Any, run: ToolRunContext) -> Any:
            return {"echo": args}

        inner = body or default

        async def tracked(args: Any, run: ToolRunContext) -> Any:
            self.entered += 1
            try:
                return await inner(args, run)
            finally:
                self.exited += 1

        self.definition = json_tool(name, tracked, **options)


def runtime_with(*plugins: object, tool: Tool | None = None, **options: Any) -> tuple[ToolRuntime, Tool]:
    tool = tool or Tool()
    runtime = make_runtime(tool.definition, json_tool("echo"), **options)
    for index, plugin in enumerate(plugins):
        runtime.plugins.register(plugin, name=FAULTY if index == 0 else f"{FAULTY}-{index}")
    return runtime, tool


def info(result: ToolExecutionResult) -> tuple[str | None, str | None, str | None]:
    """(code, name, plugin) of a failure."""
    error = expect_failure(result).error
    assert error.info is not None, error.message
    return error.info.code, error.info.name, error.info.plugin


async def still_serving(runtime: ToolRuntime) -> None:
    """The runtime that just contained a fault answers an ordinary call (through the same plugins)."""
    result = await runtime.execute(make_input("echo", {"after": "fault"}))
    FIGURES.results += 1
    if isinstance(result, ToolExecutionFailure):
        # A faulty plugin may legitimately fail every call; the runtime must still answer with a result.
        assert result.error.info is not None
        return
    assert json_equal(result.value, {"after": "fault"})


async def run(
    runtime: ToolRuntime, name: str = "work", arguments: object = None, **options: Any
) -> ToolExecutionResult:
    FIGURES.faults_injected += 1
    result = await runtime.execute(make_input(name, {"a": 1} if arguments is None else arguments, **options))
    FIGURES.results += 1
    return result


# -- listeners that raise --------------------------------------------------------------------------

RAISED: list[tuple[str, Callable[[], BaseException], str | None, str, str]] = [
    # (id, exception, code (None = the stage default), info name, message)
    ("value-error", lambda: ValueError("boom"), None, "ValueError", "boom"),
    ("evil-base-exception", lambda: Evil("boom"), None, "Evil", "boom"),
    ("dsh-error-keeps-code", lambda: DshError("boom", code="ACME_BROKE"), "ACME_BROKE", "DshError", "boom"),
    # A group of one (what a trio nursery raises for one failed task) is reported as its exception.
    ("exception-group", lambda: ExceptionGroup("grouped", [ValueError("a")]), None, "ValueError", "a"),
    ("base-exception-group", lambda: BaseExceptionGroup("grouped", [Evil("a")]), None, "Evil", "a"),
    (
        "nested-groups-of-one",
        lambda: ExceptionGroup("outer", [ExceptionGroup("inner", [DshError("deep", code="ACME_DEEP")])]),
        "ACME_DEEP",
        "DshError",
        "deep",
    ),
    (
        "exception-group-of-two",
        lambda: ExceptionGroup("grouped", [ValueError("a"), KeyError("b")]),
        None,
        "ExceptionGroup",
        "grouped (2 sub-exceptions)",
    ),
    ("unprintable", Unprintable, None, "Unprintable", "<unprintable exception>"),
    ("empty-message", lambda: RuntimeError(), None, "RuntimeError", "RuntimeError"),
    ("recursion-error", lambda: RecursionError("deep"), None, "RecursionError", "deep"),
]


def _raising(hook: str, where: str, make: Callable[[], BaseException]) -> object:
    if hook == "dsh_pre_execute":

        async def pre(execution: ToolExecution, next: Next) -> Any:
            raise make()

        return listener(hook, pre)
    if hook == "dsh_execute":

        async def wrapper(execution: ToolDispatchExecution, next: Next) -> Any:
            if where == "after":
                await next()
            raise make()

        return listener(hook, wrapper)

    async def post(execution: ToolExecution, result: Any, next: Next) -> Any:
        raise make()

    return listener(hook, post)


STAGES = [
    ("dsh_pre_execute", "before", 0),
    ("dsh_execute", "before", 0),
    ("dsh_execute", "after", 1),
    ("dsh_post_execute", "after", 1),
]


@pytest.mark.parametrize(("hook", "where", "bodies"), STAGES, ids=[f"{h}-{w}" for h, w, _ in STAGES])
@pytest.mark.parametrize(("id", "make", "code", "name", "message"), RAISED, ids=[r[0] for r in RAISED])
async def test_raising_listener_is_contained_and_blamed(
    hook: str,
    where: str,
    bodies: int,
    id: str,
    make: Callable[[], BaseException],
    code: str | None,
    name: str,
    message: str,
) -> None:
    runtime, tool = runtime_with(_raising(hook, where, make))
    result = await run(runtime)
    assert info(result) == (code or "POLICY_ERROR", name, FAULTY)
    assert expect_failure(result).error.message == message
    assert expect_failure(result).content == (TextBlock(f"Error: {message}"),)
    assert (tool.entered, tool.exited) == (bodies, bodies)
    await still_serving(runtime)


async def test_raising_guard_is_blamed_by_its_name() -> None:
    def no_evil_allowed(execution: ToolExecution) -> str | None:
        raise Evil("guard broke")

    runtime, tool = runtime_with()
    runtime.guard(no_evil_allowed)
    result = await run(runtime)
    code, name, plugin = info(result)
    assert (code, name) == ("POLICY_ERROR", "Evil")
    assert plugin is not None and plugin.endswith("no_evil_allowed")
    assert tool.entered == 0


@pytest.mark.parametrize("depth", [3, 100_000], ids=["shallow", "too-deep-to-print"])
async def test_guard_returning_a_non_string_is_blamed_by_its_name(depth: int) -> None:
    reason = _deep_list(depth)

    def returns_a_list(execution: ToolExecution) -> Any:
        return reason

    runtime, tool = runtime_with()
    runtime.guard(returns_a_list)
    result = await run(runtime)
    code, name, plugin = info(result)
    assert (code, name) == ("POLICY_ERROR", "PolicyError")
    assert plugin is not None and plugin.endswith("returns_a_list")
    message = expect_failure(result).error.message
    assert message == f"guard {plugin} must return None or a non-empty reason string, got {safe_repr(reason)}"
    assert tool.entered == 0
    await still_serving(runtime)


@pytest.mark.parametrize(
    "make", [lambda: ValueError("approval broke"), lambda: Evil("approval broke")], ids=["error", "evil"]
)
async def test_raising_approval_service_is_blamed_as_approval(make: Callable[[], BaseException]) -> None:
    class Broken:
        async def request(self, execution: ToolExecution, reason: str | None) -> str:
            raise make()

    async def ask(execution: ToolExecution, next: Next) -> Any:
        return Ask("please")

    runtime, tool = runtime_with(listener("dsh_pre_execute", ask), approval=Broken())
    result = await run(runtime, agent=Agent("a"))
    assert info(result)[0::2] == ("POLICY_ERROR", "approval")
    assert expect_failure(result).error.message == "approval broke"
    assert tool.entered == 0
    await still_serving(runtime)


@pytest.mark.parametrize("answer", ["yes", "", None, 1, "ALLOWED-ONCE", "allowed-once "])
async def test_approval_service_returning_garbage_denies_as_policy_error(answer: object) -> None:
    async def ask(execution: ToolExecution, next: Next) -> Any:
        return Ask()

    runtime, tool = runtime_with(listener("dsh_pre_execute", ask), approval=StaticApproval(answer))  # type: ignore[arg-type]
    result = await run(runtime, agent=Agent("a"))
    assert info(result) == ("POLICY_ERROR", "PolicyError", "approval")
    assert expect_failure(result).error.message.startswith(f"approval service returned {answer!r}")
    assert tool.entered == 0


# -- listeners that return the wrong thing ----------------------------------------------------------

SUCCESS = ToolExecutionSuccess(value=1, content=())
GARBAGE: dict[str, list[tuple[str, object]]] = {
    "dsh_pre_execute": [
        ("none", None),
        ("true", True),
        ("string", "allow"),
        ("dict", {"kind": "allow"}),
        ("accept", Accept()),
        ("block", "Block"),
        ("result", SUCCESS),
        ("class-not-instance", Allow),
    ],
    "dsh_execute": [
        ("none", None),
        ("value", {"echo": 1}),
        ("allow", Allow()),
        ("accept", Accept()),
        ("class-not-instance", ToolExecutionSuccess),
    ],
    "dsh_post_execute": [
        ("none", None),
        ("allow", Allow()),
        ("deny", Deny("no")),
        ("result", SUCCESS),
        ("content-list", [TextBlock("x")]),
    ],
}
EXPECTED_SHAPE = {
    "dsh_pre_execute": "dsh_pre_execute must return Allow(), Deny(reason), Ask() or Rewrite(arguments, reason)",
    "dsh_execute": "dsh_execute must return a ToolExecutionResult",
    "dsh_post_execute": "dsh_post_execute must return Accept(...) or Block(...)",
}


def _returning(hook: str, garbage: object) -> object:
    if hook == "dsh_post_execute":

        async def post(execution: ToolExecution, result: Any, next: Next) -> Any:
            return garbage

        return listener(hook, post)

    async def other(execution: Any, next: Next) -> Any:
        return garbage

    return listener(hook, other)


@pytest.mark.parametrize(
    ("hook", "garbage"),
    [(hook, value) for hook, values in GARBAGE.items() for _, value in values],
    ids=[f"{hook}-{id}" for hook, values in GARBAGE.items() for id, _ in values],
)
async def test_wrong_return_type_is_a_policy_error_naming_the_plugin(hook: str, garbage: object) -> None:
    runtime, tool = runtime_with(_returning(hook, garbage))
    result = await run(runtime)
    assert info(result) == ("POLICY_ERROR", "PolicyError", FAULTY)
    assert expect_failure(result).error.message == f"{FAULTY}: {EXPECTED_SHAPE[hook]}, got {safe_repr(garbage)}"
    assert tool.entered == (1 if hook == "dsh_post_execute" else 0)
    await still_serving(runtime)


def _deep_list(depth: int) -> list[Any]:
    node: list[Any] = []
    for _ in range(depth):
        node = [node]
    return node


@pytest.mark.parametrize("hook", list(GARBAGE))
async def test_wrong_return_type_too_deep_to_print_is_still_blamed(hook: str) -> None:
    runtime, _ = runtime_with(_returning(hook, _deep_list(100_000)))
    result = await run(runtime)
    assert info(result) == ("POLICY_ERROR", "PolicyError", FAULTY)
    assert expect_failure(result).error.message.startswith(f"{FAULTY}: {EXPECTED_SHAPE[hook]}, got ")


async def test_sync_listener_on_a_waterfall_fails_every_call_by_name() -> None:
    def not_async(execution: ToolExecution, next: Next) -> Any:
        return Allow()

    # The runtime's own manager refuses it at register() (test_plugin_registration); a host's
    # plain pluggy manager takes it, and then every call fails, naming it.
    tool = Tool()
    pm = pluggy.PluginManager("dsh")
    runtime = ToolRuntime(plugins=pm)
    runtime.register(tool.definition)
    runtime.register(json_tool("echo"))
    pm.register(listener("dsh_pre_execute", not_async), name=FAULTY)
    for _ in range(2):
        result = await run(runtime)
        assert info(result) == ("POLICY_ERROR", "PolicyError", FAULTY)
        assert expect_failure(result).error.message == f"{FAULTY}: dsh_pre_execute listeners must be async def"
    assert tool.entered == 0


# -- next() twice, or never --------------------------------------------------------------------------


def _twice(hook: str, *, swallow: bool) -> object:
    async def call_twice(next: Next) -> Any:
        first = await next()
        try:
            await next()
        except DshError:
            if swallow:
                return first
            raise
        return first

    if hook == "dsh_post_execute":

        async def post(execution: ToolExecution, result: Any, next: Next) -> Any:
            return await call_twice(next)

        return listener(hook, post)

    async def other(execution: Any, next: Next) -> Any:
        return await call_twice(next)

    return listener(hook, other)


@pytest.mark.parametrize("hook", list(GARBAGE))
async def test_next_called_twice_fails_and_runs_nothing_twice(hook: str) -> None:
    inner_calls: list[str] = []

    async def inner(execution: Any, next: Next) -> Any:
        inner_calls.append(hook)
        return await next()

    inner_plugin = listener(hook, inner if hook != "dsh_post_execute" else _inner_post(inner_calls), trylast=True)
    runtime, tool = runtime_with(_twice(hook, swallow=False), inner_plugin)
    result = await run(runtime)
    assert info(result) == ("POLICY_ERROR", "PolicyError", FAULTY)
    assert expect_failure(result).error.message == f"{FAULTY}: next() may be called at most once per listener"
    assert inner_calls == [hook]  # the inner listener ran once, not twice
    assert tool.entered == tool.exited == (0 if hook == "dsh_pre_execute" else 1)
    await still_serving(runtime)


def _inner_post(log: list[str]) -> Callable[..., Any]:
    async def inner(execution: ToolExecution, result: Any, next: Next) -> Any:
        log.append("dsh_post_execute")
        return await next()

    return inner


@pytest.mark.parametrize("hook", list(GARBAGE))
async def test_second_next_error_can_be_caught_and_the_first_outcome_kept(hook: str) -> None:
    runtime, tool = runtime_with(_twice(hook, swallow=True))
    result = await run(runtime)
    assert isinstance(result, ToolExecutionSuccess)
    assert json_equal(result.value, {"echo": {"a": 1}})
    assert tool.entered == 1


def _keeps_next(hook: str, kept: list[Next]) -> object:
    """A listener that keeps its ``next`` for later and short-circuits without calling it."""
    if hook == "dsh_post_execute":

        async def post(execution: ToolExecution, result: Any, next: Next) -> Any:
            kept.append(next)
            return Accept()

        return listener(hook, post)

    async def other(execution: Any, next: Next) -> Any:
        kept.append(next)
        if hook == "dsh_pre_execute":
            return Deny("not now")
        return failure_from_exception(RuntimeError("not now"))

    return listener(hook, other)


@pytest.mark.parametrize("hook", ["dsh_pre_execute", "dsh_execute", "dsh_post_execute"])
async def test_a_next_kept_after_its_listener_returned_runs_nothing(hook: str) -> None:
    kept: list[Next] = []
    runtime, tool = runtime_with(_keeps_next(hook, kept))
    await run(runtime)
    entered = tool.entered
    with pytest.raises(PolicyError) as raised:
        await kept[0]()
    assert str(raised.value) == f"{FAULTY}: next() called after its listener returned"
    assert tool.entered == entered  # the body did not run outside its call


async def test_a_kept_pre_execute_next_called_from_a_later_stage_fails_that_call() -> None:
    kept: list[Next] = []

    async def pre(execution: Any, next: Next) -> Any:
        kept.append(next)
        return Allow()

    async def post(execution: ToolExecution, result: Any, next: Next) -> Any:
        await kept[-1]()
        return await next()

    runtime, _ = runtime_with(listener("dsh_pre_execute", pre), listener("dsh_post_execute", post))
    result = await run(runtime)
    assert info(result) == ("POLICY_ERROR", "PolicyError", f"{FAULTY}-1")
    assert expect_failure(result).error.message == f"{FAULTY}: next() called after its listener returned"


async def test_pre_listener_that_never_calls_next_still_lets_guards_run() -> None:
    inner_calls: list[str] = []

    async def outer(execution: ToolExecution, next: Next) -> Any:
        return Allow()

    async def inner(execution: ToolExecution, next: Next) -> Any:
        inner_calls.append("inner")
        return await next()

    runtime, tool = runtime_with(listener("dsh_pre_execute", outer, tryfirst=True), listener("dsh_pre_execute", inner))
    runtime.guard(lambda execution: "guard still says no")
    result = await run(runtime)
    assert info(result)[0] == "DENIED" and expect_failure(result).error.message == "guard still says no"
    assert inner_calls == [] and tool.entered == 0


WRAPPER_FAILURE = ToolExecutionFailure(
    error=ToolFailure(message="no", info=ToolErrorInfo(name="WrapperSaidNo", code="WRAPPER_SAID_NO")),
    content=(TextBlock("Error: no"),),
)


@pytest.mark.parametrize(
    ("returned", "expected"),
    [
        (lambda: ToolExecutionSuccess(value={"forged": True}, content=(TextBlock("ignored"),)), {"forged": True}),
        # Results snapshot their fields when built: the wrapper's own construction fails, blamed on it.
        (lambda: ToolExecutionSuccess(value=float("nan"), content=()), "NON_JSON_VALUE"),
        (lambda: WRAPPER_FAILURE, "WRAPPER_SAID_NO"),
    ],
    ids=["forged-success-is-revalidated", "forged-non-json-value", "short-circuit-failure"],
)
async def test_wrapper_that_never_calls_next_skips_the_body(
    returned: Callable[[], ToolExecutionResult], expected: object
) -> None:
    async def short_circuit(execution: ToolDispatchExecution, next: Next) -> Any:
        return returned()

    runtime, tool = runtime_with(listener("dsh_execute", short_circuit))
    result = await run(runtime)
    assert tool.entered == 0
    if isinstance(expected, dict):
        assert isinstance(result, ToolExecutionSuccess) and json_equal(result.value, expected)
        assert result.content != (TextBlock("ignored"),)  # re-rendered from the value, not the wrapper's content
    else:
        assert info(result)[0] == expected
        assert info(result)[2] == (FAULTY if expected == "NON_JSON_VALUE" else None)


# -- hangs, ended by the caller's signal --------------------------------------------------------------

HANG_SEATS = [
    # (seat, expected code, body entered)
    ("pre", "ABORTED_BEFORE_DISPATCH", 0),
    ("approval", "ABORTED_BEFORE_DISPATCH", 0),
    ("wrapper-before-next", "ABORTED_BEFORE_DISPATCH", 0),
    ("body", "ABORTED", 1),
    ("wrapper-after-next", "ABORTED", 1),
    ("post", "ABORTED", 1),
]


def _hanging(seat: str, log: list[str], *, shield_for: float) -> tuple[list[object], dict[str, Any]]:
    """Plugins (and runtime options) with a listener that hangs at ``seat``."""

    async def hang() -> None:
        log.append(f"{seat}:enter")
        try:
            await trio.sleep_forever()
        finally:
            if shield_for:
                # An uncooperative listener: its cleanup ignores the cancellation for a while.
                with trio.CancelScope(shield=True):
                    await trio.sleep(shield_for)
            log.append(f"{seat}:exit")

    async def pre(execution: ToolExecution, next: Next) -> Any:
        if seat == "pre":
            await hang()
        return Ask() if seat == "approval" else await next()

    async def wrapper(execution: ToolDispatchExecution, next: Next) -> Any:
        if seat == "wrapper-before-next":
            await hang()
        outcome = await next()
        if seat == "wrapper-after-next":
            await hang()
        return outcome

    async def post(execution: ToolExecution, result: Any, next: Next) -> Any:
        if seat == "post":
            await hang()
        return await next()

    class Approval:
        async def request(self, execution: ToolExecution, reason: str | None) -> str:
            await hang()
            return "allowed-once"

    plugins = [listener("dsh_pre_execute", pre), listener("dsh_execute", wrapper), listener("dsh_post_execute", post)]
    return plugins, {"approval": Approval()}


@pytest.mark.parametrize("shield_for", [0, 10], ids=["cooperative", "uncooperative-cleanup"])
@pytest.mark.parametrize(("seat", "code", "bodies"), HANG_SEATS, ids=[s[0] for s in HANG_SEATS])
async def test_hang_is_ended_by_the_caller_signal_and_drained(
    autojump_clock: trio.testing.MockClock, task_audit: TaskAudit, seat: str, code: str, bodies: int, shield_for: float
) -> None:
    log: list[str] = []
    plugins, options = _hanging(seat, log, shield_for=shield_for)

    async def body(args: Any, run: ToolRunContext) -> Any:
        if seat == "body":
            await _hang_body(log, shield_for)
        return "done"

    runtime, tool = runtime_with(*plugins, tool=Tool(body=body), **options)
    signal = CancelSignal()
    outcome: list[ToolExecutionResult] = []

    async def call() -> None:
        outcome.append(await run(runtime, signal=signal, agent=Agent("a")))
        log.append("result")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(call)
        await trio.sleep(5)
        signal.cancel("user pressed stop")
        FIGURES.cancellations += 1
    assert info(outcome[0])[0] == code
    assert (tool.entered, tool.exited) == (bodies, bodies)
    assert log == [f"{seat}:enter", f"{seat}:exit", "result"]  # the hang unwound before the result
    assert trio.current_time() == pytest.approx(5 + shield_for)
    for plugin in plugins:  # they would hang the next call too
        runtime.plugins.unregister(plugin)
    await still_serving(runtime)


async def _hang_body(log: list[str], shield_for: float) -> None:
    log.append("body:enter")
    try:
        await trio.sleep_forever()
    finally:
        if shield_for:
            with trio.CancelScope(shield=True):
                await trio.sleep(shield_for)
        log.append("body:exit")


async def test_outer_cancel_scope_propagates_after_the_hang_unwound(autojump_clock: trio.testing.MockClock) -> None:
    log: list[str] = []
    plugins, _ = _hanging("pre", log, shield_for=3)
    runtime, _ = runtime_with(*plugins)
    with trio.move_on_after(5) as scope:
        await run(runtime)
    assert scope.cancelled_caught  # trio.Cancelled of the caller's own scope is not swallowed
    assert log == ["pre:enter", "pre:exit"]
    assert trio.current_time() == pytest.approx(8)
    for plugin in plugins:
        runtime.plugins.unregister(plugin)
    await still_serving(runtime)


class HangingObserver:
    def __init__(self) -> None:
        self.started = 0

    @hookimpl
    async def dsh_result(self, execution: ToolExecution, result: ToolExecutionResult) -> None:
        self.started += 1
        await trio.sleep_forever()


async def test_hanging_observer_is_ended_by_the_caller_signal(autojump_clock: trio.testing.MockClock) -> None:
    observer = HangingObserver()
    runtime, _ = runtime_with(observer)
    signal = CancelSignal()
    outcome: list[ToolExecutionResult] = []
    with trio.move_on_after(60):
        async with trio.open_nursery() as nursery:

            async def call() -> None:
                outcome.append(await run(runtime, signal=signal))

            nursery.start_soon(call)
            await trio.sleep(5)
            signal.cancel()
            FIGURES.cancellations += 1
    assert observer.started == 1
    assert outcome, "execute() never returned: the observer hang was not ended by the signal"


# -- mutation attempts fail inside the listener -----------------------------------------------------


def _attempts(target: Any, attempts: list[Callable[[Any], object]]) -> list[str]:
    """Run each mutation on ``target``; return the ones that did NOT raise."""
    survived = []
    FIGURES.faults_injected += len(attempts)
    for attempt in attempts:
        try:
            attempt(target)
        except (TypeError, AttributeError):
            continue
        survived.append(attempt.__name__ if hasattr(attempt, "__name__") else repr(attempt))
    return survived


def _set(target: Any, key: Any, value: Any) -> None:
    target[key] = value


def _setattr(target: Any, name: str, value: Any) -> None:
    setattr(target, name, value)


EXECUTION_MUTATIONS: list[Callable[[Any], object]] = [
    lambda e: _set(e.arguments, "a", 2),
    lambda e: _set(e.arguments, "new", 1),
    lambda e: e.arguments.pop("a"),
    lambda e: e.arguments.update(a=3),
    lambda e: e.arguments.setdefault("b", 1),
    lambda e: e.arguments.clear(),
    lambda e: e.arguments.__delitem__("a"),
    lambda e: e.arguments.__ior__({"x": 1}),
    lambda e: _set(e.arguments["nested"], "k", 0),
    lambda e: e.arguments["nested"]["list"].append(4),
    lambda e: _set(e.arguments["nested"]["list"], 0, 9),
    lambda e: _setattr(e, "name", "other"),
    lambda e: _setattr(e, "arguments", {}),
    lambda e: _setattr(e, "call_id", "forged"),
    lambda e: _setattr(e, "token", object()),
    lambda e: _setattr(e, "agent", Agent("root")),
]
RESULT_MUTATIONS: list[Callable[[Any], object]] = [
    lambda r: _setattr(r, "value", 1),
    lambda r: _setattr(r, "content", ()),
    lambda r: _set(r.value, "echo", 1),
    lambda r: _set(r.value["echo"], "a", 5),
    lambda r: _setattr(r.content[0], "text", "forged"),
    lambda r: r.content.append(TextBlock("x")),
    lambda r: _setattr(r, "additional_contexts", (UserMessage([TextBlock("x")]),)),
    lambda r: _setattr(r, "concludes_turn", True),
]
ARGUMENTS = {"a": 1, "nested": {"k": "v", "list": [1, 2, 3]}}


async def test_every_stage_gets_frozen_inputs_and_mutations_fail_inside_it() -> None:
    survivors: dict[str, list[str]] = {}

    async def pre(execution: ToolExecution, next: Next) -> Any:
        survivors["pre"] = _attempts(execution, EXECUTION_MUTATIONS)
        return await next()

    async def wrapper(execution: ToolDispatchExecution, next: Next) -> Any:
        survivors["execute"] = _attempts(
            execution, [*EXECUTION_MUTATIONS, lambda e: _setattr(e, "signal", "not a signal")]
        )
        result = await next()
        survivors["execute-result"] = _attempts(result, RESULT_MUTATIONS)
        return result

    async def post(execution: ToolExecution, result: Any, next: Next) -> Any:
        survivors["post"] = _attempts(execution, EXECUTION_MUTATIONS) + _attempts(result, RESULT_MUTATIONS)
        return await next()

    def observe(execution: ToolExecution, result: ToolExecutionResult) -> None:
        survivors["observer"] = _attempts(execution, EXECUTION_MUTATIONS) + _attempts(result, RESULT_MUTATIONS)

    def finalize(execution: ToolExecution, result: ToolExecutionResult) -> None:
        survivors["finalize"] = _attempts(execution, EXECUTION_MUTATIONS) + _attempts(result, RESULT_MUTATIONS)

    async def body(args: Any, run: ToolRunContext) -> Any:
        survivors["body"] = _attempts(run, [m for m in EXECUTION_MUTATIONS[:11]]) + _attempts(
            run, [lambda r: _setattr(r, "call_id", "x"), lambda r: _setattr(r, "signal", CancelSignal())]
        )
        return {"echo": args}

    tool = Tool(body=body, finalize_content=finalize)
    plugins = [
        listener("dsh_pre_execute", pre),
        listener("dsh_execute", wrapper),
        listener("dsh_post_execute", post),
        listener("dsh_result", observe),
    ]
    runtime, _ = runtime_with(*plugins, tool=tool)
    caller_arguments = {"a": 1, "nested": {"k": "v", "list": [1, 2, 3]}}
    result = await run(runtime, arguments=caller_arguments)
    assert isinstance(result, ToolExecutionSuccess)
    assert set(survivors) == {"pre", "execute", "execute-result", "post", "observer", "finalize", "body"}
    assert {seat: left for seat, left in survivors.items() if left} == {}
    assert json_equal(result.value, {"echo": ARGUMENTS})
    assert caller_arguments == ARGUMENTS  # the caller's own objects were never touched either


# -- Evil in every seat ------------------------------------------------------------------------------


async def test_evil_in_the_body_is_a_tool_error() -> None:
    async def body(args: Any, run: ToolRunContext) -> Any:
        raise Evil("body went evil")

    runtime, tool = runtime_with(tool=Tool(body=body))
    result = await run(runtime)
    assert info(result) == ("TOOL_ERROR", "Evil", None)
    assert (tool.entered, tool.exited) == (1, 1)
    await still_serving(runtime)


@pytest.mark.parametrize(
    ("seat", "expected"),
    [
        ("render", 'tool "work" returned invalid output: output.render failed: evil'),
        ("presentation_meta", 'tool "work" returned invalid output: output.presentation_meta failed: evil'),
    ],
)
async def test_evil_in_the_output_contract_is_invalid_output(seat: str, expected: str) -> None:
    def evil(args: Any, value: Any) -> Any:
        raise Evil("evil")

    output = ToolOutput(schema={"type": "json"}, **{seat: evil})
    runtime, _ = runtime_with(tool=Tool(output=output))
    result = await run(runtime)
    assert info(result)[:2] == ("INVALID_TOOL_OUTPUT", "ToolOutputError")
    assert expect_failure(result).error.message == expected
    await still_serving(runtime)


# -- observers that raise ------------------------------------------------------------------------------


def _observer(make: Callable[[], BaseException], *, is_async: bool) -> Callable[..., Any]:
    if is_async:

        async def async_observer(execution: ToolExecution, result: ToolExecutionResult) -> None:
            await trio.sleep(0)
            raise make()

        return async_observer

    def observer(execution: ToolExecution, result: ToolExecutionResult) -> None:
        raise make()

    return observer


@pytest.mark.parametrize("is_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize(
    ("make", "logged"),
    [(lambda: ValueError("boom"), "boom"), (lambda: Evil("boom"), "boom"), (Unprintable, "<unprintable exception>")],
    ids=["error", "evil", "unprintable"],
)
async def test_raising_observer_is_logged_by_name_and_others_still_see_the_result(
    caplog: pytest.LogCaptureFixture, make: Callable[[], BaseException], logged: str, is_async: bool
) -> None:
    seen: list[tuple[str, ToolExecutionResult]] = []

    def before(execution: ToolExecution, result: ToolExecutionResult) -> None:
        seen.append(("before", result))

    def after(execution: ToolExecution, result: ToolExecutionResult) -> None:
        seen.append(("after", result))

    runtime = make_runtime(Tool().definition, json_tool("echo"))
    runtime.plugins.register(listener("dsh_result", after), name="after")
    runtime.plugins.register(listener("dsh_result", _observer(make, is_async=is_async)), name=FAULTY)
    runtime.plugins.register(listener("dsh_result", before), name="before")
    with caplog.at_level(logging.WARNING, logger="dsh_core"):
        result = await run(runtime, call_id="obs-1")
    assert isinstance(result, ToolExecutionSuccess)
    assert [(who, r is result) for who, r in seen] == [("before", True), ("after", True)]
    messages = [record.getMessage() for record in caplog.records if record.name == "dsh_core"]
    assert messages == [f'tool "work" (obs-1): dsh_result observer {FAULTY} failed: {logged}']
    await still_serving(runtime)


# -- finalize_content that raises or returns garbage ---------------------------------------------------


class _ExplodingIterable:
    def __iter__(self) -> Iterator[Any]:
        yield TextBlock("fine")
        raise ValueError("iteration exploded")


FINALIZERS: list[tuple[str, Callable[..., Any], str, str]] = [
    ("raises", lambda e, r: (_ for _ in ()).throw(ValueError("nope")), "ValueError", "nope"),
    ("raises-evil", lambda e, r: (_ for _ in ()).throw(Evil("nope")), "Evil", "nope"),
    (
        "string",
        lambda e, r: "Error: text",
        "TypeError",
        "finalize_content result must be a list of content blocks, got str",
    ),
    ("bytes", lambda e, r: b"x", "TypeError", "finalize_content result must be a list of content blocks, got bytes"),
    ("int", lambda e, r: 5, "TypeError", "finalize_content result must be a list of content blocks, got int"),
    (
        "dict-block",
        lambda e, r: [{"type": "text", "text": "x"}],
        "TypeError",
        "finalize_content result[0] must be a TextBlock or ImageBlock, got dict",
    ),
    (
        "mixed",
        lambda e, r: [TextBlock("a"), "b"],
        "TypeError",
        "finalize_content result[1] must be a TextBlock or ImageBlock, got str",
    ),
    ("exploding-iterable", lambda e, r: _ExplodingIterable(), "ValueError", "iteration exploded"),
    ("unprintable", lambda e, r: (_ for _ in ()).throw(Unprintable()), "Unprintable", "<unprintable exception>"),
]


@pytest.mark.parametrize("outcome", ["success", "tool-failure", "invalid-args"])
@pytest.mark.parametrize(("id", "finalize", "name", "why"), FINALIZERS, ids=[f[0] for f in FINALIZERS])
async def test_faulty_finalize_content_becomes_one_failure_and_runs_once(
    id: str, finalize: Callable[..., Any], name: str, why: str, outcome: str
) -> None:
    calls: list[bool] = []

    def counted(execution: ToolExecution, result: ToolExecutionResult) -> Any:
        calls.append(result.is_error)
        return finalize(execution, result)

    async def body(args: Any, run: ToolRunContext) -> Any:
        if outcome == "tool-failure":
            raise ValueError("tool failed first")
        return "ok"

    tool = Tool(body=body, finalize_content=counted, parameters={"a": {"type": "integer"}})
    runtime, _ = runtime_with(tool=tool)
    result = await run(runtime, arguments={"a": "not an int"} if outcome == "invalid-args" else {"a": 1})
    assert calls == [outcome != "success"]  # exactly once, seeing the real outcome
    assert info(result) == ("TOOL_ERROR", name, None)
    assert expect_failure(result).error.message == f"finalize_content violated its total contract: {why}"
    await still_serving(runtime)


async def test_a_finalizer_raising_a_dsh_error_keeps_its_code() -> None:
    class LedgerDown(DshError):
        code = "LEDGER_DOWN"

    def finalize(execution: ToolExecution, result: ToolExecutionResult) -> Any:
        raise LedgerDown("cannot record the outcome")

    runtime, _ = runtime_with(tool=Tool(finalize_content=finalize))
    result = await run(runtime)
    assert info(result) == ("LEDGER_DOWN", "LedgerDown", None)
    assert (
        expect_failure(result).error.message
        == "finalize_content violated its total contract: cannot record the outcome"
    )


async def test_finalize_content_may_replace_content_with_images() -> None:
    def finalize(execution: ToolExecution, result: ToolExecutionResult) -> Any:
        return (ImageBlock("aGk=", "image/png"),)

    runtime, _ = runtime_with(tool=Tool(finalize_content=finalize))
    result = await run(runtime)
    assert isinstance(result, ToolExecutionSuccess) and result.content == (ImageBlock("aGk=", "image/png"),)


# -- presenters --------------------------------------------------------------------------------------


PRESENTER_FAULTS: list[tuple[str, Callable[..., Any], str]] = [
    ("raises", lambda *a: (_ for _ in ()).throw(ValueError("card broke")), "failed: card broke"),
    ("raises-evil", lambda *a: (_ for _ in ()).throw(Evil("card broke")), "failed: card broke"),
    ("returns-dict", lambda *a: {"card": "terminal"}, "returned {'card': 'terminal'}"),
    ("returns-string", lambda *a: "title", "returned 'title'"),
]


@pytest.mark.parametrize(("id", "presenter", "logged"), PRESENTER_FAULTS, ids=[p[0] for p in PRESENTER_FAULTS])
async def test_faulty_present_call_falls_back_to_the_generic_card_and_logs_the_tool(
    caplog: pytest.LogCaptureFixture, id: str, presenter: Callable[..., Any], logged: str
) -> None:
    FIGURES.faults_injected += 1
    runtime, _ = runtime_with(tool=Tool(present_call=presenter))
    with caplog.at_level(logging.WARNING, logger="dsh_core.presentation"):
        view = runtime.present_call("work", {"a": 1})
    assert view == GenericCallView(title="work", raw_input={"a": 1})
    messages = [r.getMessage() for r in caplog.records if r.name == "dsh_core.presentation"]
    assert len(messages) == 1 and messages[0].startswith('tool "work": present_call ') and logged in messages[0]
    await still_serving(runtime)


@pytest.mark.parametrize(("id", "presenter", "logged"), PRESENTER_FAULTS, ids=[p[0] for p in PRESENTER_FAULTS])
async def test_faulty_present_result_keeps_the_raw_content_and_logs_the_tool(
    caplog: pytest.LogCaptureFixture, id: str, presenter: Callable[..., Any], logged: str
) -> None:
    FIGURES.faults_injected += 1
    runtime, _ = runtime_with(tool=Tool(present_result=presenter))
    result = await run(runtime)
    with caplog.at_level(logging.WARNING, logger="dsh_core.presentation"):
        view = runtime.present_result("work", {"a": 1}, result)
    assert view is None
    messages = [r.getMessage() for r in caplog.records if r.name == "dsh_core.presentation"]
    assert len(messages) == 1 and messages[0].startswith('tool "work": present_result ') and logged in messages[0]


async def test_presenter_of_a_tool_is_soft_on_invalid_arguments() -> None:
    views: list[Any] = []

    def present(args: Any) -> Any:
        views.append(args)
        return TerminalCallView(title="t", command="c")

    runtime, _ = runtime_with(tool=Tool(present_call=present, parameters={"a": {"type": "integer", "required": True}}))
    assert runtime.present_call("work", {"a": "x"}) == GenericCallView(title="work", raw_input={"a": "x"})
    assert views == []  # define_tool never hands invalid arguments to the presenter


# -- concurrency classifiers (run_tool_calls) ------------------------------------------------------


CLASSIFIER_FAULTS: list[tuple[str, dict[str, Any]]] = [
    ("safe-raises", {"is_concurrency_safe": lambda a: (_ for _ in ()).throw(ValueError("x"))}),
    ("safe-truthy-not-true", {"is_concurrency_safe": lambda a: 1}),
    ("safe-returns-string", {"is_concurrency_safe": lambda a: "yes"}),
    ("keys-raise", {"resource_keys": lambda a: (_ for _ in ()).throw(ValueError("x"))}),
    ("keys-string", {"resource_keys": lambda a: "path"}),
    ("keys-unknown-field", {"resource_keys": lambda a: {"delete": ["x"]}}),
    ("keys-non-string-key", {"resource_keys": lambda a: {"write": [1]}}),
    ("keys-empty-key", {"resource_keys": lambda a: {"read": [""]}}),
    ("keys-read-is-string", {"resource_keys": lambda a: {"read": "abc"}}),
]


@pytest.mark.parametrize(("id", "options"), CLASSIFIER_FAULTS, ids=[c[0] for c in CLASSIFIER_FAULTS])
async def test_faulty_classifier_makes_the_call_exclusive_and_loses_nothing(
    autojump_clock: trio.testing.MockClock, id: str, options: dict[str, Any]
) -> None:
    spans: list[tuple[float, float]] = []

    async def body(args: Any, run: ToolRunContext) -> Any:
        start = trio.current_time()
        await trio.sleep(1)
        spans.append((start, trio.current_time()))
        return args["i"]

    runtime, _ = runtime_with(tool=Tool(body=body, **options))
    FIGURES.faults_injected += 1
    results = await run_tool_calls(runtime, [make_input("work", {"i": i}) for i in range(4)])
    FIGURES.results += len(results)
    assert [r.value for r in results] == [0, 1, 2, 3]  # type: ignore[union-attr]
    assert spans == [(i, i + 1) for i in range(4)]  # exclusive: one after another


async def test_resource_keys_with_unhashable_entries_is_exclusive(autojump_clock: trio.testing.MockClock) -> None:
    runtime, _ = runtime_with(tool=Tool(resource_keys=lambda a: {"read": [["not", "hashable"]]}))
    results = await run_tool_calls(runtime, [make_input("work", {"i": i}) for i in range(3)])
    assert len(results) == 3


@pytest.mark.parametrize("option", ["is_concurrency_safe", "resource_keys"])
async def test_evil_classifier_loses_no_result(autojump_clock: trio.testing.MockClock, option: str) -> None:
    def classifier(args: Any) -> Any:
        if args.get("evil"):
            raise Evil("classifier")
        return True if option == "is_concurrency_safe" else {"read": ["k"]}

    runtime, tool = runtime_with(tool=Tool(body=_sleep_one, **{option: classifier}))
    inputs = [make_input("work", {"i": 0}), make_input("work", {"i": 1, "evil": True})]
    results = await run_tool_calls(runtime, inputs)
    assert len(results) == 2 and tool.entered == tool.exited


async def _sleep_one(args: Any, run: ToolRunContext) -> Any:
    await trio.sleep(1)
    return args["i"]


# -- plugins that fail at import or setup -------------------------------------------------------------

GOOD_PLUGIN = """
from dsh_core import hookimpl
from dsh_core.testing import json_tool

@hookimpl
def dsh_setup(runtime, config):
    runtime.register(json_tool("good_tool"))
"""

PLUGIN_SOURCES: list[tuple[str, str, str, str]] = [
    # (id, module source, stage, error text expected in the report)
    ("import-error", "import no_such_module_for_dsh_faults\n", "import", "ModuleNotFoundError: No module named"),
    ("syntax-error", "def broken(:\n", "import", "SyntaxError"),
    ("import-raises-evil", "class Evil(BaseException): pass\nraise Evil('at import')\n", "import", "Evil: at import"),
    ("import-exits", "raise SystemExit(3)\n", "import", "SystemExit(3): the plugin tried to exit the host"),
    (
        "setup-raises",
        "from dsh_core import hookimpl\n@hookimpl\ndef dsh_setup(runtime, config):\n    raise RuntimeError('setup broke')\n",
        "setup",
        "dsh_setup failed: RuntimeError: setup broke",
    ),
    (
        "setup-raises-evil-after-registering",
        "from dsh_core import hookimpl\nfrom dsh_core.testing import json_tool\n"
        "class Evil(BaseException): pass\n"
        "@hookimpl\ndef dsh_setup(runtime, config):\n"
        "    runtime.register(json_tool('left_behind'))\n    raise Evil('half way')\n",
        "setup",
        "dsh_setup failed: Evil: half way",
    ),
    (
        "setup-is-async",
        "from dsh_core import hookimpl\n@hookimpl\nasync def dsh_setup(runtime, config):\n    pass\n",
        "setup",
        "dsh_setup must be a plain (synchronous) function",
    ),
    (
        "unknown-hook",
        "from dsh_core import hookimpl\n@hookimpl\nasync def dsh_pre_exec(execution, next):\n    return await next()\n",
        "register",
        'PluginValidationError: unknown hook "dsh_pre_exec" (did you mean "dsh_pre_execute"?)',
    ),
    (
        "class-needs-arguments",
        "class Plugin:\n    def __init__(self, required):\n        pass\n",
        "import",
        "could not be instantiated without arguments",
    ),
]


@pytest.mark.parametrize(("id", "source", "stage", "error"), PLUGIN_SOURCES, ids=[p[0] for p in PLUGIN_SOURCES])
async def test_plugin_failing_at_load_is_reported_by_name_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, id: str, source: str, stage: str, error: str
) -> None:
    from dsh_core._plugins import load_plugins

    module = f"dsh_faulty_{id.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(source)
    (tmp_path / f"{module}_good.py").write_text(GOOD_PLUGIN)
    monkeypatch.syspath_prepend(str(tmp_path))
    target = f"{module}:Plugin" if id == "class-needs-arguments" else module
    entry_points = [
        importlib.metadata.EntryPoint(name=id, value=target, group="dsh"),
        importlib.metadata.EntryPoint(name="good", value=f"{module}_good", group="dsh"),
    ]
    runtime, _ = runtime_with()
    FIGURES.faults_injected += 1
    before = set(runtime.names())
    report = load_plugins(runtime, entry_points=entry_points)
    assert [f.name for f in report.failed] == [id]
    assert report.failed[0].stage == stage
    assert error in report.failed[0].error
    assert [p.name for p in report.loaded] == ["good"]  # a later plugin still loads
    assert set(runtime.names()) == before | {"good_tool"}  # nothing of the failed plugin stayed registered
    good = await runtime.execute(make_input("good_tool", {"x": 1}))
    assert isinstance(good, ToolExecutionSuccess)
    assert not runtime.plugins.has_plugin(id)
    await still_serving(runtime)
