"""Helpers for testing tools and policy plugins the way dsh-tools tests itself.

Typical use in a pytest-trio test::

    from dsh_core.testing import Recorder, make_input, make_runtime, json_tool

    async def test_my_policy_denies_rm():
        recorder = Recorder()
        runtime = make_runtime(json_tool("shell"), plugins=[MyPolicy(), recorder])
        result = await runtime.execute(make_input("shell", {"cmd": "rm -rf /"}))
        assert result.is_error and result.code == "DENIED"
        assert recorder.hooks == ["dsh_pre_execute", "dsh_post_execute", "dsh_result"]
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ._definition import ToolDefinition, ToolOutput, define_tool
from ._execution import ScopeKey, ToolExecution, ToolExecutionInput, ToolExecutionToken
from ._json import thaw
from ._plugins import run_own_setup
from ._registry import PresentationMode
from ._results import ToolExecutionFailure, ToolExecutionResult, ToolExecutionSuccess
from ._runtime import ApprovalService, ToolRuntime
from ._signal import CancelSignal
from .hookspecs import hookimpl

if TYPE_CHECKING:
    from .code_mode import CodeRunResult

__all__ = [
    "FakeCodeRuntime",
    "Recorder",
    "StaticApproval",
    "ToolCallError",
    "expect_failure",
    "expect_success",
    "json_tool",
    "make_input",
    "make_runtime",
]

_call_ids = itertools.count(1)


def make_input(
    name: str,
    arguments: object = None,
    *,
    call_id: str | None = None,
    agent: ScopeKey | None = None,
    signal: CancelSignal | None = None,
    parent: ToolExecutionToken | None = None,
    root_call_id: str | None = None,
) -> ToolExecutionInput:
    """A ``ToolExecutionInput`` with a fresh signal and call id unless given (``arguments`` default ``{}``)."""
    return ToolExecutionInput(
        call_id=call_id or f"call-{next(_call_ids)}",
        name=name,
        arguments={} if arguments is None else arguments,
        signal=signal or CancelSignal(),
        agent=agent,
        parent=parent,
        root_call_id=root_call_id,
    )


def expect_failure(result: object) -> ToolExecutionFailure:
    """``result`` typed as a failure, or an ``AssertionError`` showing what it was instead.

    ``assert expect_failure(result).code == "DENIED"`` reads as the test means
    and gives type checkers the failure's fields. (A plain ``raise``, not
    ``assert``: it still checks under ``python -O``.)
    """
    if not isinstance(result, ToolExecutionFailure):
        raise AssertionError(f"expected a failure, got {result!r}")
    return result


def expect_success(result: object) -> ToolExecutionSuccess:
    """``result`` typed as a success, or an ``AssertionError`` showing the failure instead."""
    if not isinstance(result, ToolExecutionSuccess):
        raise AssertionError(f"expected a success, got {result!r}")
    return result


_PluginEntry = object | tuple[object, Mapping[str, Any]]


def make_runtime(
    *tools: ToolDefinition,
    plugins: Iterable[_PluginEntry] | Mapping[str, _PluginEntry] = (),
    approval: ApprovalService | None = None,
    mode: PresentationMode = "native",
    **options: Any,
) -> ToolRuntime:
    """A ``ToolRuntime`` with ``tools`` registered globally and ``plugins`` registered in order.

    ``plugins`` is a list, or a mapping from plugin name to entry: the name
    the plugin is registered under, and so the one a call it decides or
    breaks blames (``error.info.plugin``); from a list, a module is named after
    itself and any other object after its class and its id
    (``NoDeletes-7f8e3571c390``, different in every run): use the mapping form to
    assert on blame. A plugin with its own
    ``dsh_setup`` (an entry-point module, say) is set up right after it is
    registered, as ``load_plugins`` would: with an empty configuration table,
    or with ``table`` when the entry is ``(plugin, table)``. Unlike
    ``load_plugins``, a failing ``dsh_setup`` raises, for the test to see.
    """
    runtime = ToolRuntime(approval=approval, mode=mode, **options)
    named: Iterable[tuple[str | None, _PluginEntry]]
    if isinstance(plugins, Mapping):
        for name in plugins:
            if not isinstance(name, str):
                raise TypeError(f"make_runtime: a plugins mapping is keyed by plugin name, got {type(name).__name__}")
        named = plugins.items()
    else:
        named = ((None, entry) for entry in plugins)
    for name, entry in named:
        plugin, table = entry if isinstance(entry, tuple) else (entry, {})
        if not isinstance(table, Mapping):
            raise TypeError(f"make_runtime: a (plugin, table) entry takes a mapping table, got {type(table).__name__}")
        runtime.plugins.register(plugin, name=name)
        run_own_setup(runtime, plugin, dict(table))
    for tool in tools:
        runtime.register(tool)
    return runtime


def json_tool(
    name: str,
    body: Callable[..., Awaitable[Any]] | None = None,
    *,
    parameters: Mapping[str, Any] | None = None,
    output: Mapping[str, Any] | ToolOutput | None = None,
    **options: Any,
) -> ToolDefinition:
    """A tool with open parameters and any-JSON output; the default body echoes its arguments."""

    async def echo(args: Any) -> Any:
        return args

    return define_tool(
        name=name,
        description=f"test tool {name}",
        parameters=parameters or {},
        output=output or {"type": "json"},
        execute=body or echo,
        **options,
    )


@attrs.define
class Recorder:
    """A plugin recording every hook it sees, in order (register it last to be outermost)."""

    events: list[tuple[str, str]] = attrs.field(factory=list)
    results: list[tuple[ToolExecution, ToolExecutionResult]] = attrs.field(factory=list)
    changes: int = 0

    @property
    def hooks(self) -> list[str]:
        return [hook for hook, _ in self.events]

    @hookimpl
    async def dsh_pre_execute(self, execution: ToolExecution, next: Callable[[], Awaitable[Any]]) -> Any:
        self.events.append(("dsh_pre_execute", execution.call_id))
        return await next()

    @hookimpl
    async def dsh_execute(self, execution: Any, next: Callable[[], Awaitable[Any]]) -> Any:
        self.events.append(("dsh_execute", execution.call_id))
        return await next()

    @hookimpl
    async def dsh_post_execute(self, execution: ToolExecution, result: Any, next: Callable[[], Awaitable[Any]]) -> Any:
        self.events.append(("dsh_post_execute", execution.call_id))
        return await next()

    @hookimpl
    def dsh_result(self, execution: ToolExecution, result: ToolExecutionResult) -> None:
        self.events.append(("dsh_result", execution.call_id))
        self.results.append((execution, result))

    @hookimpl
    def dsh_call_unwound(self, execution: ToolExecution) -> None:
        self.events.append(("dsh_call_unwound", execution.call_id))

    @hookimpl
    def dsh_tools_change(self) -> None:
        self.changes += 1


@attrs.define
class StaticApproval:
    """An ``ApprovalService`` that always gives ``answer`` and records what it was asked.

    An ``Ask`` is routed to the approver only for a call that has an agent
    (``make_input(..., agent=Agent("a"))``); a call without one is denied
    before the approver is asked, so ``requests`` stays empty.
    """

    answer: str = "allowed-once"
    requests: list[tuple[str, str | None]] = attrs.field(factory=list)

    async def request(self, execution: ToolExecution, reason: str | None) -> str:
        self.requests.append((execution.name, reason))
        return self.answer


@attrs.define
class FakeCodeRuntime:
    """A Code Mode runtime whose "program" is a Python coroutine function over the bindings.

    Tests policies on ``run_code`` sub-calls without a child process: ``program``
    receives ``{tool name: binding}`` and awaits ``binding(args)`` as a program
    would await ``tools.name(args)``; a failed call raises :class:`ToolCallError`
    (``tool_name``, the message), which the program may catch. It returns the
    run's ``CodeRunResult`` (``None``: the program returned nothing); an
    exception it lets escape fails the run ``CODE_RUN_FAILED``, as a real
    program's does. ``runs`` counts the runs, ``names`` and ``namespace`` are
    what the last one was given.
    """

    program: Callable[[Mapping[str, Callable[[Any], Awaitable[Any]]]], Awaitable[CodeRunResult | None]] | None = None
    language: str = "python"
    isolation: str = "in-process-fake"
    runs: int = 0
    names: list[str] | None = None
    namespace: tuple[str, str] | None = None

    async def run(
        self,
        program: str,
        bindings: Mapping[str, Any],
        *,
        global_name: str = "tools",
        error_class_name: str = "ToolCallError",
    ) -> CodeRunResult:
        from .code_mode import CodeRunError, CodeRunResult

        self.runs += 1
        self.names = list(bindings)
        self.namespace = (global_name, error_class_name)
        if self.program is None:
            return CodeRunResult()
        try:
            outcome = await self.program({name: _ProgramBinding(name, b) for name, b in bindings.items()})
        except Exception as exc:
            # What a real runtime reports for a program that raised: a failed run, not a raising tool.
            text = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, ToolCallError):
                text += f" (tool {exc.tool_name!r})"
            return CodeRunResult(error=CodeRunError(kind="exception", message=text))
        return CodeRunResult() if outcome is None else outcome


class ToolCallError(Exception):
    """What a :class:`FakeCodeRuntime` program's failed tool call raises, as a real program's does."""

    def __init__(self, tool_name: str, message: str) -> None:
        super().__init__(message)
        self.tool_name = tool_name


class _ProgramBinding:
    """A binding as a program sees it: a failed call raises :class:`ToolCallError`."""

    __slots__ = ("_binding", "_name")

    def __init__(self, name: str, binding: Callable[[Any], Awaitable[Any]]) -> None:
        self._name = name
        self._binding = binding

    def __call__(self, args: Any) -> Awaitable[Any]:
        # The binding is called now, as a real runtime calls it when the program makes the
        # call: the bridge numbers and queues a call when it is made, not when it is awaited.
        try:
            outcome = self._binding(args)
        except Exception as exc:
            return self._raise(exc)
        return self._settle(outcome)

    async def _settle(self, outcome: Awaitable[Any]) -> Any:
        try:
            value = await outcome
        except trio.Cancelled:
            # The program stopped waiting for the call (a cancel scope around the await): a real
            # runtime tells the host, which cancels the sub-call, as here.
            cancel = getattr(outcome, "cancel", None)
            if cancel is not None:
                cancel()
            raise
        except Exception as exc:
            raise ToolCallError(self._name, str(exc) or type(exc).__name__) from None
        # What a real program gets: plain, mutable dicts and lists (it decodes the JSON it is sent),
        # not the frozen value (a tuple is no list: r["items"] == [1, 2] was False).
        return thaw(value)

    async def _raise(self, exc: Exception) -> Any:
        raise ToolCallError(self._name, str(exc) or type(exc).__name__) from None

    def __getattr__(self, attribute: str) -> Any:
        return getattr(self._binding, attribute)  # completes_at_once(), __name__
