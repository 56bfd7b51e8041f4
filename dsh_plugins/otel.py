"""OpenTelemetry: one span per tool call, Code Mode sub-calls nested under their ``run_code``.

Needs ``opentelemetry-api`` (``pip install 'dsh-tools[otel]'``); the host sets
up the SDK and its exporter as usual, and this plugin only asks for a tracer.
Enable it in ``[plugins.otel]``::

    [plugins.otel]
    enabled = true
    record_content = false   # true: arguments and result text go into span attributes

**Spans.** A call's span starts when the policy stages begin (the first
pre-execute listener) and ends when its final result is published
(``dsh_result``), so it covers policy, approval, the body and post-processing.
Its parent is whatever span is current in the caller (a host's "agent turn"
span, say); a Code Mode sub-call's parent is its ``run_code`` call's span.
While the body runs, the call's span is the current span, so the tool's own
instrumentation (an HTTP client's spans) nests under it. A call that fails
before any policy sees it (``UNKNOWN_TOOL``, ``INVALID_ARGS``) still gets a
span, started and ended when its result is published.

A call the host's own trio cancel scope cuts short (a turn deadline, Ctrl-C
handling) has no result: ``trio.Cancelled`` leaves ``execute`` and
``dsh_result`` never runs. Its span is ended as the call unwinds
(``dsh_call_unwound``), wherever it was cut (a policy, awaiting approval, the
dispatch, post-execute, waiting in ``run_tool_calls`` to be committed), with an
``ERROR`` status saying what cut it, ``error.type = "cancelled"`` and
``dsh.body_started`` (whether the body was invoked); the same for a
``KeyboardInterrupt`` or ``SystemExit``, and for a call whose own signal fired
as the host cut it. Nothing is held for a call once it ended either way.

Names and attributes follow OpenTelemetry's GenAI conventions: the span is
``execute_tool <name>`` with ``gen_ai.operation.name = "execute_tool"``,
``gen_ai.tool.name``, ``gen_ai.tool.call.id`` and ``gen_ai.tool.type``; dsh
adds ``dsh.agent``, ``dsh.root_call_id`` and, for a failure, ``error.type`` (the
error code), ``dsh.plugin`` (the plugin blamed, if any) and an ``ERROR`` status.
A name no registered tool has is the model's text, not a tool: its span is
named plain ``execute_tool`` (span names must stay few) and its
``gen_ai.tool.name`` is cut to :data:`MAX_NAME_CHARS`.
With ``ToolRuntime(trace_decisions=True)`` each decision
step (listener, approval, guard, retry) is a ``dsh.decision`` span event.
Each policy ``Rewrite`` of the call's arguments is a ``dsh.rewrite`` span event
(``dsh.rewrite.by``; with ``record_content`` also ``dsh.rewrite.reason``, free
text that often quotes the arguments, and the arguments it replaced as
``dsh.rewrite.from``: the model's for the first rewrite, the previous
rewrite's for a later one).
Arguments and results are not recorded unless ``record_content = true``: they
are the model's input and the tool's output, which an exporter ships off the
host. A failure's message and the free text of a decision step (a body's
``fail: <CODE>: <message>``, a ``block: <feedback>``, a ``deny: <reason>``)
often quote one or the other, so without ``record_content`` the status
description is the error code and a step's ``dsh.outcome`` keeps only its
verdict (``fail: TOOL_ERROR``, ``block``, ``deny``); with it they are recorded
cut to :data:`MAX_CONTENT_CHARS`. A finished call's ``gen_ai.tool.call.arguments`` are the ones that ran
(after any rewrite); a call cut short keeps the model's.

Observing never changes an outcome: a tracer that raises is logged and the
call goes on.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Final

import attrs

from dsh_core import (
    ConfigError,
    TextBlock,
    ToolDispatchExecution,
    ToolExecution,
    ToolExecutionResult,
    __version__,
    hookimpl,
    json_text,
    scope_id,
    structure_table,
    trace_of,
)

from ._cut_short import cut_short_message
from ._settings_warnings import report_inert_keys

if TYPE_CHECKING:
    from opentelemetry.trace import Span, Tracer

    from dsh_core import PreToolDecision, ToolExecutionToken

__all__ = ["PLUGIN_NAME", "OtelSettings", "OtelTracing"]

PLUGIN_NAME: Final = "otel-tracing"  # the entry point's module is registered as "otel"
MAX_CONTENT_CHARS: Final = 8192
"""Recorded arguments and results are cut to this many characters (span attributes are not a store)."""
MAX_NAME_CHARS: Final = 128
"""A tool name no registered tool has (the model's text) is cut to this many characters."""

DSH_CAPABILITIES: dict[str, list[str]] = {"tools": [], "affects": []}

logger = logging.getLogger("dsh_plugins.otel")


@attrs.frozen(kw_only=True)
class OtelSettings:
    """The ``[plugins.otel]`` table."""

    enabled: bool = False
    record_content: bool = False


def _text(result: ToolExecutionResult) -> str:
    return "\n".join(b.text if isinstance(b, TextBlock) else f"[{b.type} content]" for b in result.content)


def _cut(text: str, limit: int = MAX_CONTENT_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"




class OtelTracing:
    """The plugin object: register it with ``runtime.plugins.register(OtelTracing(), name="otel-tracing")``.

    Args:
        tracer: the tracer to use (default: ``opentelemetry.trace.get_tracer("dsh-tools")``
            from the global tracer provider, looked up when each span starts so
            a provider installed later is used).
        record_content: record the call's arguments and its result's text
            (cut to :data:`MAX_CONTENT_CHARS`).
    """

    def __init__(self, tracer: Tracer | None = None, *, record_content: bool = False) -> None:
        from opentelemetry import trace  # the optional dependency, needed only once the plugin is used

        self._trace = trace
        self._tracer = tracer
        self.record_content = record_content
        # Each call ends in dsh_result or dsh_call_unwound, which drop its span; weak keys, so that
        # a call that never ends (a task left suspended until the process exits) does not keep it either.
        self._spans: weakref.WeakKeyDictionary[ToolExecutionToken, Span] = weakref.WeakKeyDictionary()

    def diagnostics(self) -> list[str]:
        """What ``dsh-tools check`` should say: spans that would go nowhere."""
        trace = self._trace
        if self._tracer is not None:
            if isinstance(self._tracer, trace.NoOpTracer):
                return ["the tracer given to OtelTracing is a NoOpTracer, so every span is dropped"]
            return []
        provider = trace.get_tracer_provider()
        if isinstance(provider, trace.ProxyTracerProvider):
            return [
                "no OpenTelemetry tracer provider is set, so every span is dropped: set one up in the host "
                "(the SDK and an exporter), or run under opentelemetry-instrument"
            ]
        if isinstance(provider, trace.NoOpTracerProvider):
            return [
                "the OpenTelemetry tracer provider is the no-op one (NoOpTracerProvider, perhaps from "
                "OTEL_SDK_DISABLED or OTEL_TRACES_EXPORTER=none), so every span is dropped"
            ]
        return []

    def _tracer_now(self) -> Tracer:
        return self._tracer if self._tracer is not None else self._trace.get_tracer("dsh-tools", __version__)

    def _start(self, execution: ToolExecution, *, registered: bool = True) -> Span:
        parent = self._spans.get(execution.parent) if execution.parent is not None else None
        context = self._trace.set_span_in_context(parent) if parent is not None else None
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": execution.name if registered else _cut(execution.name, MAX_NAME_CHARS),
            "gen_ai.tool.call.id": execution.call_id,
            "gen_ai.tool.type": "function",
            "dsh.root_call_id": execution.root_call_id,
        }
        agent = scope_id(execution.agent)
        if agent is not None:
            attributes["dsh.agent"] = agent
        if self.record_content:
            attributes["gen_ai.tool.call.arguments"] = _cut(json_text(execution.arguments))
        name = f"execute_tool {execution.name}" if registered else "execute_tool"
        span = self._tracer_now().start_span(name, context=context, attributes=attributes)
        self._spans[execution.token] = span
        return span

    @hookimpl(tryfirst=True)
    async def dsh_pre_execute(
        self, execution: ToolExecution, next: Callable[[], Awaitable[PreToolDecision]]
    ) -> PreToolDecision:
        # A rewritten call runs this stage again with the same token: one span per call.
        if execution.token not in self._spans:
            try:
                self._start(execution)
            except Exception as exc:
                logger.warning("otel: cannot start the span of call %s: %s", execution.call_id, exc)
        return await next()

    @hookimpl(tryfirst=True)
    async def dsh_execute(
        self, execution: ToolDispatchExecution, next: Callable[[], Awaitable[ToolExecutionResult]]
    ) -> ToolExecutionResult:
        span = self._spans.get(execution.token)
        if span is None:
            return await next()
        from opentelemetry import context

        # The body's own spans (an HTTP client's, a sub-call's) nest under this call's.
        attached = context.attach(self._trace.set_span_in_context(span))
        try:
            return await next()
        finally:
            context.detach(attached)

    @hookimpl
    def dsh_result(self, execution: ToolExecution, result: ToolExecutionResult) -> None:
        span = self._spans.pop(execution.token, None)
        try:
            if span is None:  # failed before any policy saw it
                info = result.error.info if result.is_error else None
                span = self._start(execution, registered=info is None or info.code != "UNKNOWN_TOOL")
                self._spans.pop(execution.token, None)
            self._finish(span, execution, result)
        except Exception as exc:
            logger.warning("otel: cannot record the span of call %s: %s", execution.call_id, exc)

    @hookimpl
    def dsh_call_unwound(self, execution: ToolExecution, cause: BaseException, body_started: bool) -> None:
        """End the span of a call cut short with no result: now, or never; never raises."""
        span = self._spans.pop(execution.token, None)
        try:
            if span is None:  # cut before any policy saw it: whether the tool exists is not known here
                span = self._start(execution, registered=False)
                self._spans.pop(execution.token, None)
            from opentelemetry.trace import Status, StatusCode

            try:
                span.set_attribute("error.type", "cancelled")
                span.set_attribute("dsh.body_started", body_started)
                span.set_status(Status(StatusCode.ERROR, cut_short_message(cause)))
            finally:
                span.end()
        except Exception as error:  # contained by the runtime too, but with less to say
            logger.warning("otel: cannot end the span of call %s cut short: %s", execution.call_id, error)

    def _finish(self, span: Span, execution: ToolExecution, result: ToolExecutionResult) -> None:
        from opentelemetry.trace import Status, StatusCode

        try:
            trace = trace_of(result)
            if trace is not None:
                for step in trace.steps:
                    outcome = _cut(step.outcome) if self.record_content else step.verdict
                    span.add_event(
                        "dsh.decision", {"dsh.stage": step.stage, "dsh.actor": step.actor, "dsh.outcome": outcome}
                    )
            self._add_rewrites(span, result)
            if self.record_content:
                # A policy's Rewrite replaced the model's arguments: the span shows what ran.
                span.set_attribute("gen_ai.tool.call.arguments", _cut(json_text(execution.arguments)))
                span.set_attribute("gen_ai.tool.call.result", _cut(_text(result)))
            if result.is_error:
                info = result.error.info
                span_code = info.code if info is not None else "TOOL_ERROR"
                span.set_attribute("error.type", span_code)
                if info is not None and info.plugin:
                    span.set_attribute("dsh.plugin", info.plugin)
                # The message often quotes the tool's output or the model's arguments: content.
                description = _cut(result.error.message) if self.record_content else span_code
                span.set_status(Status(StatusCode.ERROR, description))
        finally:
            span.end()

    def _add_rewrites(self, span: Span, result: ToolExecutionResult) -> None:
        """One ``dsh.rewrite`` event per policy ``Rewrite``, from the notes the result carries."""
        for context in result.additional_contexts:
            meta = context.meta
            note = meta.get("rewrite") if isinstance(meta, Mapping) else None
            if not isinstance(note, Mapping):
                continue
            # The reason is free text, and often quotes what it rewrote ("tidied path './a/../b'"):
            # content, like the arguments, as a deny's reason is.
            keys = ("by", "reason") if self.record_content else ("by",)
            attributes = {f"dsh.rewrite.{key}": _cut(value) for key in keys if isinstance(value := note.get(key), str)}
            if self.record_content:  # what the model asked for is content, like the arguments
                attributes["dsh.rewrite.from"] = _cut(json_text(note.get("from")))
            span.add_event("dsh.rewrite", attributes)


@hookimpl
def dsh_setup(runtime: Any, config: dict[str, Any]) -> None:
    """Register :class:`OtelTracing` when ``enabled = true``."""
    settings = structure_table(OtelSettings, config, "[plugins.otel]")
    if not settings.enabled:
        report_inert_keys(runtime, "otel", config, "enabled", "tracing is off: set enabled = true to turn it on")
        return
    if getattr(runtime, "dry_run", False):
        return  # off, or a rehearsal (dsh-tools simulate): no call happens, so no span to export
    try:
        tracing = OtelTracing(record_content=settings.record_content)
    except ImportError:
        raise ConfigError(
            ["[plugins.otel]: opentelemetry-api is not installed (pip install 'dsh-tools[otel]')"]
        ) from None
    runtime.plugins.register(tracing, name=PLUGIN_NAME)
