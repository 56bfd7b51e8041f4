"""Serve a runtime's tools over MCP (the Model Context Protocol), on trio.

Needs the ``mcp`` extra (``pip install 'dsh-tools[mcp]'``; :func:`serve_http`
also uses its ``hypercorn``). :func:`serve_registry` builds an
``mcp.server.Server`` (the SDK's low-level server) that exposes exactly what a
model request for ``scope`` carries (:meth:`ToolRuntime.model_tools`): every
visible tool's name, description and parameter schema, plus its output schema.
MCP requires object-rooted output schemas, so a tool whose output is not an
object is listed with ``{"type": "object", "properties": {"result": <schema>}}``
and its structured content is ``{"result": <value>}``.

Every ``tools/call`` runs ``runtime.execute`` with ``agent=scope``: the full
pipeline, policies, guards and observers included. Its call id,
``mcp-<12 random hex digits>-<n>``, is unique across processes too (the effect
ledger remembers calls by id from one session to the next). The result maps
onto MCP as:

- success: ``content`` = the rendered blocks (text, image), ``structuredContent``
  = the value (wrapped as above when needed), ``isError: false``;
- failure: ``content`` = the failure content (``Error: <message>``),
  ``isError: true`` and ``_meta["dsh/error"] = {code, name, plugin}``;
- a success whose structured content would nest more than 198 levels deep
  (deeper than the SDK's JSON parser reads): ``isError: true``, ``content`` =
  a notice that the tool ran and why its value is not sent, then the rendered
  blocks; ``_meta["dsh/error"]`` has code ``INVALID_TOOL_OUTPUT`` and name
  ``McpResultTooDeep``. (A success must carry structured content matching
  the listed output schema; only an error result may go without it.)

**Schemas too deep to read.** A tool whose parameter or output schema nests
more than 196 levels deep would make the whole ``tools/list`` answer
unreadable to SDK clients (every tool of the server lost with it): it is left
out of the list, with a warning logged once, and a call to it is answered with
an error saying why (``_meta["dsh/error"]`` code ``UNSUPPORTED_SCHEMA``, name
``McpSchemaTooDeep``). ``dsh-tools check`` warns about such tools.

**Approval.** An ``Ask`` decision from an MCP call never reaches the host's own
approval service (a terminal prompt would read the protocol's stdin). With
``approval="elicit"`` the client is asked through MCP elicitation (a form with
one boolean ``allow`` field) when it declared the capability and the
connection can carry server-to-client requests (the handshake-era protocol;
the 2026 per-request protocol cannot); otherwise, and with ``approval="deny"``,
the call is denied with a message saying why. A client that does not answer
within ``approval_timeout_s`` (default :data:`DEFAULT_APPROVAL_TIMEOUT_S`, ten
minutes) is taken as a no: the call is denied, so a client that went away
(an HTTP client that dropped its connection) does not hold the call, and
what it holds, for good. The pipeline denies any ``Ask``
of a call without an agent before asking anyone, so pass a ``scope`` (an
``Agent``) for approvals to be possible. To route approvals, serving installs
a small router as ``runtime.approval`` that hands non-MCP calls to the service
that was there before.

**Cancellation.** When the client cancels a request (``notifications/cancelled``)
the SDK cancels the handler; the handler turns that into firing the call's
:class:`~dsh_core.CancelSignal` and lets the pipeline finish with its
``ABORTED`` result (so observers such as the audit log see the call settle)
before the cancellation continues.

**Lone surrogates.** A string holding one (a file read with ``surrogateescape``
gives them) has no UTF-8 form, and the SDK fails on it: it is sent with U+FFFD
in its place, in every answer of the server (any transport) and in anything
written over stdio (see ``_mcp_well_formed``).

**Contexts.** MCP has no place for the messages that follow a result in the
model's context (``additional_contexts``: a tool's deferred context, a
policy's rewrite note), and the model must not lose them (it would retry a
call it does not know was rewritten): their text is appended to the result's
``content`` as ``[<source>] <text>`` blocks, after the result's own blocks.
"""

from __future__ import annotations

import contextvars
import functools
import ipaddress
import itertools
import logging
import math
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING, Any, Final, Literal

import trio

from ._content import ImageBlock, TextBlock, text_of
from ._definition import ToolDefinition, ToolEffects, ToolSchema
from ._errors import ErrorCode
from ._execution import ScopeKey, ToolExecution, ToolExecutionInput
from ._json import FrozenDict, json_text, nests_deeper_than, thaw
from ._mcp_bearer import App as AsgiApp
from ._mcp_bearer import BearerTokenGate, bearer_token_problem
from ._mcp_list_changed import ListChangeNotifier
from ._mcp_request_ids import AnsweringUnusableIds
from ._mcp_unreadable import SDK_PARSER_MAX_DEPTH, answering_unreadable
from ._mcp_well_formed import answering_well_formed, sending_well_formed
from ._results import ToolExecutionResult
from ._signal import CancelSignal
from ._terminal_text import clipped, json_printable, printable
from ._well_formed import well_formed_text
from .presentation import declared_effects

if TYPE_CHECKING:
    import mcp_types
    from mcp.server import NotificationOptions, Server
    from mcp.server.context import ServerRequestContext
    from mcp.server.models import InitializationOptions
    from mcp.server.session import ServerSession

    from ._runtime import ApprovalService, ToolRuntime

__all__ = [
    "DEFAULT_HTTP_PORT",
    "ApprovalMode",
    "mcp_listing_problem",
    "plugin_lifespans",
    "run_serve_mcp",
    "serve_http",
    "serve_registry",
    "serve_stdio",
]

logger = logging.getLogger("dsh_core.mcp")

ApprovalMode = Literal["deny", "elicit"]
DEFAULT_HTTP_PORT: Final = 8765
CANCELLED_REASON: Final = "the MCP client cancelled the request"
# SDK clients cannot parse a message nested deeper than SDK_PARSER_MAX_DEPTH (and the SDK's
# serializer stops near 255). structuredContent sits two levels into a response
# ({"result": {"structuredContent": ...}}), so a deeper value could be written but never read.
_MAX_STRUCTURED_DEPTH: Final = SDK_PARSER_MAX_DEPTH - 2
# A tool's schemas sit four levels into a tools/list answer ({"result": {"tools": [{"inputSchema": ...}]}}):
# one schema deeper than that makes the whole answer unreadable, every other tool lost with it.
_MAX_LISTED_SCHEMA_DEPTH: Final = SDK_PARSER_MAX_DEPTH - 4
_APPROVAL_SCHEMA: Final = {
    "type": "object",
    "properties": {"allow": {"type": "boolean", "title": "Allow this tool call"}},
    "required": ["allow"],
}

# Call ids must differ between processes, not only within one: the effect ledger keys
# what it records by call id across sessions. A random per-process part keeps them
# unique; the counter after it keeps one session's calls readable and ordered.
_CALL_ID_PREFIX: Final = f"mcp-{uuid.uuid4().hex[:12]}-"
_call_numbers = itertools.count(1)


def _next_call_id() -> str:
    return f"{_CALL_ID_PREFIX}{next(_call_numbers)}"


DEFAULT_APPROVAL_TIMEOUT_S: Final = 600.0
"""How long an MCP client has to answer an approval question before the call is denied."""


def _checked_approval_timeout(value: object) -> float:
    if (type(value) is int or type(value) is float) and 0 < value < math.inf:
        return float(value)
    raise ValueError(f"approval_timeout_s must be a positive finite number of seconds, got {value!r}")


class _McpCall:
    """The MCP request a pipeline run is serving, for the approval router."""

    __slots__ = ("approval", "approval_timeout_s", "call_id", "denial", "request_id", "runtime", "session")

    def __init__(
        self,
        runtime: ToolRuntime,
        session: ServerSession,
        request_id: Any,
        approval: ApprovalMode,
        approval_timeout_s: float = DEFAULT_APPROVAL_TIMEOUT_S,
        call_id: str = "",
    ) -> None:
        self.call_id = call_id  # the request's own call (a run_code program's sub-calls are asked about too)
        self.runtime = runtime
        self.session = session
        self.request_id = request_id
        self.approval = approval
        self.approval_timeout_s = approval_timeout_s
        self.denial: str | None = None  # why the request's own call's Ask was denied without asking anyone

    async def ask(self, execution: ToolExecution, reason: str | None) -> str:
        answer, denial = await self._answer(execution, reason)
        if denial is not None and execution.call_id == self.call_id:
            # A sub-call's denial is its program's to handle: the request's answer keeps its own.
            self.denial = denial
        return answer

    async def _answer(self, execution: ToolExecution, reason: str | None) -> tuple[str, str | None]:
        name = execution.name
        if self.approval == "deny":
            return "denied", f'tool "{name}" requires approval, and this MCP server does not ask for it'
        session = self.session
        capabilities = session.client_capabilities
        if capabilities is None or capabilities.elicitation is None or not session.can_send_request:
            return "denied", f'tool "{name}" requires approval, but the MCP client cannot be asked (no elicitation)'
        # The client shows this to a person: what the model chose (arguments, the reason a
        # policy quotes from them) must not reorder, restyle or add lines to the question.
        message = f'Allow the tool "{printable(name, one_line=True)}" to run?'
        if reason:
            message += f" {printable(clipped(reason), one_line=True)}"
        definition = self.runtime.get(name, execution.agent)
        declared = declared_effects(definition) if definition is not None else ""
        if declared:
            message += f"\n{declared[0].upper()}{declared[1:]}"
        message += f"\nArguments: {json_printable(json_text(execution.arguments))}"
        answer = None
        try:
            with trio.move_on_after(self.approval_timeout_s):
                answer = await session.elicit_form(message, _APPROVAL_SCHEMA, related_request_id=self.request_id)
        except Exception as exc:
            return "denied", f'tool "{name}" requires approval, but asking the MCP client failed: {exc}'
        if answer is None:  # the deadline passed before any answer
            return "denied", (
                f'tool "{name}" requires approval, but the MCP client gave no answer in {self.approval_timeout_s:g} s'
            )
        if answer.action == "accept" and isinstance(answer.content, Mapping) and answer.content.get("allow") is True:
            return "allowed-once", None
        return ("cancelled" if answer.action == "cancel" else "denied"), None


_current_call: contextvars.ContextVar[_McpCall | None] = contextvars.ContextVar("dsh_mcp_call", default=None)


class _ApprovalRouter:
    """``runtime.approval`` while serving: MCP calls ask their client, others the previous service."""

    def __init__(self, fallback: ApprovalService | None) -> None:
        self.fallback = fallback

    async def request(self, execution: ToolExecution, reason: str | None) -> str:
        call = _current_call.get()
        if call is not None:
            # A host's standing answers (GrantingApproval's grants) need no one to ask,
            # so they apply to MCP calls too; only what they leave open goes to the client.
            standing = getattr(self.fallback, "standing_answer", None)
            if standing is not None:
                answer = await standing(execution)
                if answer is not None:
                    return str(answer)
            return await call.ask(execution, reason)
        if self.fallback is None:
            return "denied"
        return await self.fallback.request(execution, reason)


def _install_router(runtime: ToolRuntime) -> None:
    if not isinstance(runtime.approval, _ApprovalRouter):
        runtime.approval = _ApprovalRouter(runtime.approval)


def _needs_wrapping(schema: Mapping[str, Any]) -> bool:
    return schema.get("type") != "object"


def _output_schema(schema: FrozenDict) -> dict[str, Any]:
    plain = thaw(schema)
    assert isinstance(plain, dict)
    if not _needs_wrapping(schema):
        return plain
    return {"type": "object", "properties": {"result": plain}, "required": ["result"], "additionalProperties": False}


def mcp_listing_problem(schema: ToolSchema, definition: ToolDefinition | None) -> str | None:
    """Why no MCP client could read a ``tools/list`` answer naming this tool, or None when one can."""
    limits: list[tuple[str, Mapping[str, Any], int]] = [("parameter", schema.parameters, _MAX_LISTED_SCHEMA_DEPTH)]
    if definition is not None:
        output = definition.output.schema
        # A schema that is not an object is listed inside {"properties": {"result": ...}}, two levels in.
        limits.append(("output", output, _MAX_LISTED_SCHEMA_DEPTH - (2 if _needs_wrapping(output) else 0)))
    for what, listed, limit in limits:
        if nests_deeper_than(listed, limit):
            return f"its {what} schema nests more than {limit} levels deep, deeper than an MCP client can read"
    return None


class _ListingVerdicts:
    """Each tool's :func:`mcp_listing_problem` for one served registry, worked out once per tool.

    The check walks a tool's whole schema, and ``tools/list``, every ``tools/call``
    and the list-change notifier all ask for it. A verdict holds until the registry
    changes (its version moves: a re-registration may bring a new schema under the
    same name); it is also kept with the schema and definition it judged, since a
    worker thread may change the registry between a handler's lookup and this one.
    """

    def __init__(self, runtime: ToolRuntime) -> None:
        self._runtime = runtime
        self._version = -1
        self._verdicts: dict[str, tuple[ToolSchema, ToolDefinition | None, str | None]] = {}

    def problem(self, schema: ToolSchema, definition: ToolDefinition | None) -> str | None:
        version = self._runtime._registry.version
        if version != self._version:
            self._verdicts.clear()
            self._version = version
        cached = self._verdicts.get(schema.name)
        if cached is not None and cached[0] is schema and cached[1] is definition:
            return cached[2]
        problem = mcp_listing_problem(schema, definition)
        self._verdicts[schema.name] = (schema, definition, problem)
        return problem


def _unserved_result(name: str, problem: str) -> mcp_types.CallToolResult:
    import mcp_types

    text = f'Error: tool "{name}" is not served over MCP: {problem}'
    meta = {"dsh/error": {"code": ErrorCode.UNSUPPORTED_SCHEMA.value, "name": "McpSchemaTooDeep", "plugin": None}}
    return mcp_types.CallToolResult(content=[mcp_types.TextContent(type="text", text=text)], is_error=True, _meta=meta)


def _annotations(effects: ToolEffects | None) -> mcp_types.ToolAnnotations | None:
    """A tool's declared effects as MCP annotations (every hint explicit: MCP's defaults assume the worst)."""
    import mcp_types

    if effects is None:
        return None
    return mcp_types.ToolAnnotations(
        read_only_hint=effects.read_only,
        destructive_hint=effects.destructive,
        idempotent_hint=effects.idempotent,
        open_world_hint=effects.open_world,
    )


def _mcp_content(result: ToolExecutionResult) -> list[mcp_types.TextContent | mcp_types.ImageContent]:
    import mcp_types

    blocks: list[mcp_types.TextContent | mcp_types.ImageContent] = []
    for block in result.content:
        if isinstance(block, TextBlock):
            blocks.append(mcp_types.TextContent(type="text", text=block.text))
        elif isinstance(block, ImageBlock):
            blocks.append(mcp_types.ImageContent(type="image", data=block.data, mime_type=block.mime_type))
    return blocks


def _mcp_contexts(result: ToolExecutionResult) -> list[mcp_types.TextContent]:
    import mcp_types

    return [
        mcp_types.TextContent(type="text", text=f"[{context.source}] {text_of(context.content)}")
        for context in result.additional_contexts
    ]


def _mcp_result(
    runtime: ToolRuntime, scope: ScopeKey | None, name: str, result: ToolExecutionResult, call: _McpCall
) -> mcp_types.CallToolResult:
    import mcp_types

    if result.is_error:
        failure = result.error
        info = failure.info
        content: list[Any] = _mcp_content(result)
        if call.denial is not None and info is not None and info.code == "DENIED" and info.plugin == "approval":
            content = [mcp_types.TextContent(type="text", text=f"Error: {call.denial}")]
        meta = {"dsh/error": {"code": info.code, "name": info.name, "plugin": info.plugin}} if info else None
        return mcp_types.CallToolResult(content=[*content, *_mcp_contexts(result)], is_error=True, _meta=meta)
    definition = runtime.get(name, scope)
    value: Any = result.value
    if definition is not None and _needs_wrapping(definition.output.schema):
        value = {"result": value}
    content = [*_mcp_content(result), *_mcp_contexts(result)]
    if nests_deeper_than(value, _MAX_STRUCTURED_DEPTH):
        if definition is None:  # no output schema was listed: the text alone is a valid success
            return mcp_types.CallToolResult(content=content, is_error=False)
        # The listed output schema makes structuredContent mandatory on a success (SDK
        # clients raise without it), and an error result is the one that may lack it.
        # The tool did run: its text goes along, so the model need not call it again.
        notice = (
            f'Error: tool "{name}" ran, but its result nests more than {_MAX_STRUCTURED_DEPTH} levels deep, '
            "deeper than an MCP message can carry as structured content; its text follows."
        )
        meta = {"dsh/error": {"code": ErrorCode.INVALID_TOOL_OUTPUT.value, "name": "McpResultTooDeep", "plugin": None}}
        return mcp_types.CallToolResult(
            content=[mcp_types.TextContent(type="text", text=notice), *content], is_error=True, _meta=meta
        )
    plain = thaw(value)
    structured = plain if isinstance(plain, dict) else None
    return mcp_types.CallToolResult(content=content, structured_content=structured, is_error=False)


async def _execute(runtime: ToolRuntime, request: ToolExecutionInput) -> ToolExecutionResult:
    """``runtime.execute`` that turns a cancellation of this task into firing the call's signal.

    The pipeline runs shielded, so it settles (``ABORTED``, observers notified)
    before the task's own cancellation resumes at the nursery's exit.
    """
    result: ToolExecutionResult | None = None

    async def forward_cancellation() -> None:
        try:
            await trio.sleep_forever()
        finally:
            if result is None:  # cancelled while the call ran, not because it finished
                request.signal.cancel(CANCELLED_REASON)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(forward_cancellation)
        with trio.CancelScope(shield=True):
            result = await runtime.execute(request)
        nursery.cancel_scope.cancel()
    assert result is not None
    return result


def serve_registry(
    runtime: ToolRuntime,
    *,
    scope: ScopeKey | None = None,
    approval: ApprovalMode = "deny",
    name: str = "dsh-tools",
    approval_timeout_s: float = DEFAULT_APPROVAL_TIMEOUT_S,
) -> Server[Any]:
    """An MCP server (``mcp.server.Server``) exposing ``scope``'s tools; see the module docstring.

    Serve it with :func:`serve_stdio` / :func:`serve_http`, or connect to it
    in-process with ``mcp.Client(server)``. The tool list is read at every
    ``tools/list``, so registrations made later show up. Whatever changes the
    list (a call of any session, ``search_tools`` loading deferred tools, a
    registration by a plugin) is followed by ``notifications/tools/list_changed``
    to every handshake-era session whose list changed (the calling session's
    before its answer), and on ``subscriptions/listen`` streams for the others
    (see ``_mcp_list_changed``).
    """
    import mcp_types
    from mcp.server.subscriptions import InMemorySubscriptionBus, ListenHandler

    from . import __version__

    if approval not in ("deny", "elicit"):
        raise ValueError(f'approval must be "deny" or "elicit", got {approval!r}')
    approval_timeout_s = _checked_approval_timeout(approval_timeout_s)
    _install_router(runtime)
    left_out: set[str] = set()  # the tools a warning already named
    verdicts = _ListingVerdicts(runtime)

    async def list_tools(
        ctx: ServerRequestContext[Any], params: mcp_types.PaginatedRequestParams | None
    ) -> mcp_types.ListToolsResult:
        tools: list[mcp_types.Tool] = []
        for schema in runtime.model_tools(scope).schemas:
            definition = runtime.get(schema.name, scope)
            problem = verdicts.problem(schema, definition)
            if problem is not None:
                if schema.name not in left_out:
                    left_out.add(schema.name)
                    logger.warning('MCP: tool "%s" is left out of tools/list: %s', schema.name, problem)
                continue
            parameters = thaw(schema.parameters)
            assert isinstance(parameters, dict)
            tools.append(
                mcp_types.Tool(
                    name=schema.name,
                    description=schema.description,
                    input_schema=parameters,
                    output_schema=_output_schema(definition.output.schema) if definition is not None else None,
                    annotations=_annotations(definition.effects) if definition is not None else None,
                )
            )
        notifier.listed(ctx, tuple(tool.name for tool in tools))
        return mcp_types.ListToolsResult(tools=tools)

    async def call_tool(
        ctx: ServerRequestContext[Any], params: mcp_types.CallToolRequestParams
    ) -> mcp_types.CallToolResult:
        definition = runtime.get(params.name, scope)
        problem = verdicts.problem(definition.schema, definition) if definition is not None else None
        if problem is not None:
            return _unserved_result(params.name, problem)
        call_id = _next_call_id()
        call = _McpCall(runtime, ctx.session, ctx.request_id, approval, approval_timeout_s, call_id)
        request = ToolExecutionInput(
            call_id=call_id,
            name=params.name,
            arguments=params.arguments if params.arguments is not None else {},
            signal=CancelSignal(),
            agent=scope,
        )
        notifier.watch(ctx)
        token = _current_call.set(call)
        try:
            result = await _execute(runtime, request)
        finally:
            _current_call.reset(token)
        await notifier.publish(calling=ctx)
        return _mcp_result(runtime, scope, params.name, result, call)

    def served(schema: ToolSchema) -> bool:
        return verdicts.problem(schema, runtime.get(schema.name, scope)) is None

    instructions = runtime.model_tools(scope).instructions or None
    bus = InMemorySubscriptionBus()
    notifier = ListChangeNotifier(lambda: runtime.model_tools(scope).schemas, served, bus)
    return _server_class()(
        name,
        version=__version__,
        instructions=well_formed_text(instructions) if instructions is not None else None,
        # What a tool returns or declares may hold a lone surrogate, which no MCP message can carry.
        on_list_tools=answering_well_formed(list_tools),
        on_call_tool=answering_well_formed(call_tool),
        on_subscriptions_listen=ListenHandler(bus),
        lifespan=notifier.lifespan(runtime),
    )


@functools.cache
def _server_class() -> type[Server[Any]]:
    """``mcp.server.Server`` that tells handshake-era clients its tool list can change.

    Every transport builds the ``initialize`` answer from
    ``create_initialization_options()``, but only stdio lets the caller pass
    options: HTTP sessions and in-memory clients call it with none. So the
    default is changed here, for all of them.
    """
    from mcp.server import NotificationOptions, Server

    class ListChangingServer(Server[Any]):
        def create_initialization_options(
            self,
            notification_options: NotificationOptions | None = None,
            experimental_capabilities: dict[str, dict[str, Any]] | None = None,
            extensions: dict[str, dict[str, Any]] | None = None,
        ) -> InitializationOptions:
            return super().create_initialization_options(
                notification_options or NotificationOptions(tools_changed=True), experimental_capabilities, extensions
            )

    return ListChangingServer


async def serve_stdio(
    runtime: ToolRuntime,
    *,
    scope: ScopeKey | None = None,
    approval: ApprovalMode = "elicit",
    approval_timeout_s: float = DEFAULT_APPROVAL_TIMEOUT_S,
) -> None:
    """Serve ``scope``'s tools over this process's stdin/stdout until the client closes stdin.

    Nothing else may write to stdout meanwhile: it carries the protocol. A
    request line the SDK cannot parse (too deep, a lone surrogate, not JSON) is
    answered with a JSON-RPC error carrying its ``id``, and an answer of the
    client's it cannot read fails the request it answers, so that an approval
    asked through elicitation is denied rather than waited for forever (see
    ``_mcp_unreadable``).
    A message holding a lone surrogate is sent with U+FFFD in its place (see
    ``_mcp_well_formed``).
    """
    from mcp.server.stdio import stdio_server

    server = serve_registry(runtime, scope=scope, approval=approval, approval_timeout_s=approval_timeout_s)
    async with stdio_server() as (read_stream, sdk_write_stream):
        # The SDK's writer raises on a lone surrogate, and its failure ends the server.
        write_stream = sending_well_formed(sdk_write_stream)
        # The SDK drops a line it cannot parse; its sender would wait for an answer forever,
        # and so would the server for the client's answer to one of its own requests.
        readable, writable = answering_unreadable(read_stream, write_stream)
        # The options say the tool list can change (see _server_class).
        await server.run(readable, writable, server.create_initialization_options())


async def serve_http(
    runtime: ToolRuntime,
    host: str = "127.0.0.1",
    port: int = DEFAULT_HTTP_PORT,
    *,
    scope: ScopeKey | None = None,
    approval: ApprovalMode = "elicit",
    path: str = "/mcp",
    bearer_token: str | None = None,
    approval_timeout_s: float = DEFAULT_APPROVAL_TIMEOUT_S,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``scope``'s tools over streamable HTTP at ``http://host:port/mcp`` until cancelled.

    Binds the loopback interface unless told otherwise; on any loopback host
    (``localhost``, ``::1``, all of 127.0.0.0/8) DNS-rebinding protection is on:
    a request whose ``Host`` or ``Origin`` names another host is refused (421). ``port=0`` picks a free port;
    ``await nursery.start(serve_http, runtime, ...)`` returns the bound base
    URLs (``["http://127.0.0.1:49321"]``). Runs on hypercorn's trio worker.

    Loopback keeps other machines out, not the other processes and users of
    this one. With ``bearer_token``, every HTTP request, to any path, must
    carry ``Authorization: Bearer <bearer_token>`` (compared in constant time,
    exactly); any other is answered ``401`` with ``WWW-Authenticate: Bearer``
    and a short JSON error before the MCP app sees it. A token that is empty
    or holds anything but visible ASCII (a space, a control character) is
    refused with ``ValueError``. Without one, anyone who can reach the port
    can call every tool served.
    """
    try:
        import hypercorn.config
        import hypercorn.trio
    except ImportError as exc:  # pragma: no cover - the mcp extra installs it
        raise RuntimeError("serve_http needs hypercorn: pip install 'dsh-tools[mcp]'") from exc

    if bearer_token is not None:
        problem = bearer_token_problem(bearer_token)
        if problem is not None:
            raise ValueError(problem)  # before anything is served, or the runtime's approval router installed
    server = serve_registry(runtime, scope=scope, approval=approval, approval_timeout_s=approval_timeout_s)
    app: AsgiApp = server.streamable_http_app(
        streamable_http_path=path, host=host, transport_security=_loopback_security(host)
    )
    # The SDK reads a request whose id it cannot take as a notification (202, never run).
    app = AnsweringUnusableIds(app)
    if bearer_token is not None:
        app = BearerTokenGate(app, bearer_token)  # outermost: nothing is read before the token is checked
    config = hypercorn.config.Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    config.graceful_timeout = 1.0
    await hypercorn.trio.serve(app, config, task_status=task_status)  # type: ignore[arg-type]


def _loopback_security(host: str) -> Any:
    """DNS-rebinding protection for any loopback ``host``, or ``None`` (the SDK's choice) for another.

    The SDK turns the protection on only for the exact hosts ``127.0.0.1``,
    ``localhost`` and ``::1``: bound to ``127.0.0.2`` (all of 127.0.0.0/8 is
    loopback), a page on a rebound domain could drive the server.
    """
    from mcp.server.transport_security import TransportSecuritySettings

    if host == "localhost":
        loopback = True
    else:
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            loopback = False
        else:
            # Before Python 3.13 an IPv4-mapped address (::ffff:127.0.0.1) is not is_loopback.
            mapped = getattr(address, "ipv4_mapped", None)
            loopback = address.is_loopback or (mapped is not None and mapped.is_loopback)
    if not loopback:
        return None
    hosts = {"127.0.0.1", "localhost", "[::1]", f"[{host}]" if ":" in host else host}
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=sorted(f"{name}:*" for name in hosts),
        allowed_origins=sorted(f"http://{name}:*" for name in hosts),
    )


def run_serve_mcp(
    runtime: ToolRuntime,
    *,
    http: bool,
    port: int,
    agent: str | None,
    bearer_token: str | None = None,
    on_listening: Callable[[list[str]], None] | None = None,
    approval_timeout_s: float = DEFAULT_APPROVAL_TIMEOUT_S,
) -> None:
    """Serve the runtime over MCP until interrupted: the ``dsh-tools serve-mcp`` command.

    stdio by default, streamable HTTP on ``127.0.0.1:port`` with ``http=True``
    (requiring ``bearer_token`` when one is given, see :func:`serve_http`;
    ``on_listening`` is called with the base URLs once bound); calls act as ``agent`` (its scope's tools and policies) and ask for approval
    through elicitation. With ``agent=None`` the pipeline denies every ``Ask``
    without asking anyone (``dsh-tools serve-mcp`` passes ``"cli"`` when no
    ``--agent`` is given). Plugins that own
    background tasks (those with a ``dsh_lifespan()`` method returning an async
    context manager, such as the MCP client) run inside it for the whole session,
    entered in registration order (see :func:`plugin_lifespans`).
    """
    from ._runtime import agent_scope

    scope = agent_scope(runtime, agent)
    approval_timeout_s = _checked_approval_timeout(approval_timeout_s)
    if type(port) is not int or not 0 <= port <= 65535:
        raise ValueError(f"port must be an integer between 0 and 65535, got {port!r}")

    if bearer_token is not None:
        problem = bearer_token_problem(bearer_token)
        if problem is not None:
            raise ValueError(problem)

    async def main() -> None:
        async with plugin_lifespans(runtime):
            if http:
                async with trio.open_nursery() as nursery:
                    serving = functools.partial(
                        serve_http,
                        runtime,
                        port=port,
                        scope=scope,
                        bearer_token=bearer_token,
                        approval_timeout_s=approval_timeout_s,
                    )
                    urls = await nursery.start(serving)
                    if on_listening is not None:
                        on_listening(urls)
            else:
                await serve_stdio(runtime, scope=scope, approval_timeout_s=approval_timeout_s)

    trio.run(main)


@asynccontextmanager
async def plugin_lifespans(runtime: ToolRuntime) -> AsyncIterator[None]:
    """Every plugin's ``dsh_lifespan()`` entered, in the order the plugins were registered (left in reverse)."""
    # list_name_plugin keeps registration order (get_plugins is a set); a blocked name maps to None.
    plugins = [plugin for _, plugin in runtime.plugins.list_name_plugin() if plugin is not None]
    async with AsyncExitStack() as stack:
        for plugin in plugins:
            lifespan = getattr(plugin, "dsh_lifespan", None)
            if callable(lifespan):
                await stack.enter_async_context(lifespan())
        yield
