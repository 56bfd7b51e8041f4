"""MCP client: register the tools of Model Context Protocol servers as dsh-tools tools.

Needs the ``mcp`` extra (``pip install 'dsh-tools[mcp]'``). Configure servers in
``[plugins.mcp]``::

    [plugins.mcp]
    timeout_ms = 30000                 # default budget of every MCP tool (timeout plugin)

    [[plugins.mcp.servers]]
    name = "demo"                      # how messages and diagnostics name the server
    command = "python"                 # stdio: spawn this command ...
    args = ["demo_server.py"]          # ... with these arguments
    env = { DEMO_TOKEN = "x" }         # merged over the SDK's safe default environment
    prefix = "demo"                    # register "demo__add" instead of "add"

    [[plugins.mcp.servers]]
    name = "local-http"
    url = "http://127.0.0.1:8765/mcp"  # streamable HTTP; loopback hosts only
    token_env = "DSH_MCP_TOKEN"        # send this variable's value as the bearer token
    timeout_ms = 5000                  # this server's tools' budget
    retry_attempts = 3                 # retry read-only/idempotent tools when the server is gone
    max_event_bytes = 16777216         # the largest message (so result) taken from it (default 16 MiB)

Each tool a server lists becomes a raw :class:`~dsh_core.ToolDefinition` that
runs the full pipeline like any other (policies, guards, approval, the timeout
plugin): the permissions plugin sees ``demo__delete_everything`` like a local tool.

**Schemas.** The registry only enforces its raw subset (see
:mod:`dsh_core.schema`), and a keyword it would not enforce must never be
silently ignored. MCP input schemas (pydantic-generated, mostly) go through
:func:`downgrade_schema`:

- *exact rewrites*: ``anyOf`` (or a ``type`` list) whose branches each declare
  one distinct type (``Optional[int]`` → ``anyOf: [integer, null]``) is the
  same as ``oneOf`` and is rewritten to it (the keywords beside a ``type`` list,
  ``enum`` members included, go to the branch of their type); ``enum`` or
  ``const`` without a type get the type of their values (a ``oneOf`` of one
  branch per type if they have several); a ``required`` name missing from
  ``properties`` is declared there as ``{}`` (any value, as it was); and
  OpenAPI's ``example`` becomes ``examples: [...]`` (dropped with a warning
  beside ``examples``) and its ``nullable: true`` adds ``null`` to the declared
  ``type`` (``nullable: false`` is dropped: it constrains nothing);
- *downgrade*: keywords that only narrow the values of a node whose type stays
  declared (``pattern``, ``format``, ``minimum``, ``maxLength``, ``minItems``,
  ``uniqueItems``, ``additionalProperties`` given as a schema, ...) are stripped,
  because the MCP server validates its own arguments; the registry then checks a
  superset and never rejects a value the server accepts. The stripped
  constraints are appended to that node's ``description`` so the model still
  reads them, and each stripped tool gets a *warning* (``dsh-tools check``);
  vendor keywords (``x-``-prefixed annotations, which constrain nothing) are
  dropped with the same warning, and a ``true`` subschema (any value) is
  rewritten to ``{}``;
- *refusal*: keywords that decide a value's shape (``$ref``, non-disjoint
  ``anyOf``, ``allOf``, ``not``, ``if``/``then``/``else``, ``patternProperties``,
  ``prefixItems``, ...), and ``false`` subschemas (no value), cannot be dropped
  without changing what the model is told or what is accepted, so the tool is
  not registered and a *problem* is reported.

An output schema goes through the same rules; one that cannot be downgraded
leaves the tool registered with an any-JSON output contract and a warning (the
SDK itself validates structured content against the server's schema).

**Values.** A tool with an ``output_schema`` returns its structured content as
the value (rendered as JSON text). A tool without one returns the envelope
:data:`ENVELOPE_SCHEMA`: ``{"content": [{"type": "text", "text": ...} |
{"type": "image", "data": ..., "mime_type": ...} | {"type": <other>, ...}]}``,
rendered back to text and image blocks. A result with ``isError`` fails the call
(``TOOL_ERROR``, message = its text, else its structured content as JSON). A
result the SDK refuses (it does not parse, or its structured content is missing
or breaks the tool's output schema) is a protocol error, ``MCP_ERROR``.

A tool's annotations become its :class:`~dsh_core.ToolEffects`
(``readOnlyHint``, ``destructiveHint``, ``idempotentHint``, ``openWorldHint``).
Annotations with no hint at all (a title alone) declare nothing; a hint left
out takes the MCP specification's default, which assumes the worst
(``destructiveHint`` true unless the tool is read-only, ``openWorldHint`` true;
``idempotentHint`` false). A tool claiming both read-only and destructive is
taken as destructive; a read-only one is concurrency-safe (parallel in
``run_tool_calls``).

**Connections and background tasks.** An MCP session needs a task that reads
the server's messages for as long as the session lives, and trio allows no task
without a nursery someone waits for. So the plugin never starts one on its own:

- inside ``async with plugin.running():`` (or ``async with
  McpClientPlugin.connect(runtime, config) as plugin:`` for hosts that do not
  use entry points) the plugin owns a nursery. Every server is connected at
  entry, except one whose last attempt failed (a listing at setup that failed
  or timed out is not waited for twice); a session lives in its own task there,
  and calls are sent from the caller's task over that session. When a session
  is gone, the next call reconnects *lazily, inside the caller's task*
  (``nursery.start``, so the call's cancellation and timeout bound the
  start-up), serialised by a per-server ``trio.Lock``. ``tools/list_changed`` notifications re-list the
  server there and re-sync the registrations (removed tools disposed, new ones
  registered; each change fires ``dsh_tools_change``). Re-listings are paced: one
at a time, at least a second apart (the gap doubling, up to 30 s, while the
listings come back unchanged), changes announced meanwhile coalesced into the
next one, so a server announcing a change after every listing cannot keep the
host busy. A re-listing the server
  refuses (an error answer, an invalid listing) keeps the session and the tools
  listed before, with a logged warning; only a lost connection ends the session;
- outside it (the ``dsh-tools call`` / ``run`` commands), each call opens a
  short-lived session in the caller's task and closes it before returning. No
  notification can arrive then; the tool set is the one listed at setup.

``dsh_setup`` runs synchronously at load time, so it lists every server once in
a worker thread with its own ``trio.run`` (blocking the loader for the
servers' start-up) and registers what it found: ``dsh-tools list`` and
``check`` see MCP tools without any async host. A listing stops after 100
pages (a server whose cursors never end would be listed forever), with a
warning saying the server's tools were not all registered.

**Failures.** A server that dies during a call fails it with
``MCP_SERVER_DIED`` (the connection ended: the transport closed, a stdio
server's stdout closed or could not be read though the process lives, its
process exited though a process it started holds its stdout open, or the
HTTP transport gave up on a response stream); one that cannot be started or reached
fails it with ``MCP_SERVER_UNAVAILABLE``. An HTTP server that answers ``404`` to the
session's id no longer knows the session (it restarted): the session ends, and the
call, which that server never processed, is sent once more over a new one. A
result in a message larger than ``max_event_bytes`` fails that call alone with
``MCP_ERROR`` (the session and the calls in flight go on; it is not retried). From a
stdio server, where a message is a line, a line past ``max_event_bytes`` fails every
call in flight with ``MCP_ERROR`` and ends the session (what follows on that stdout
cannot be told apart from the rest of the line): the server is restarted on the next
call, after the backoff. An MCP protocol error is
``MCP_ERROR``: a JSON-RPC error answer (whatever its code, ``-32000`` included),
an invalid result, and a message no pending request can be matched to (a
response to an id this client never sent, or one the SDK cannot parse that may
be a response: an object with an ``id`` and no ``method``, or a line starting
with ``{`` that is not valid JSON), which fails every request then pending
instead of leaving it to wait forever. A line of plain text (a server printing
to stdout) is no message and is ignored, and so is a JSON line that cannot be a
response (a JSON log line without an ``id``, a malformed notification); bytes on
a stdio server's stdout that are not UTF-8 are read as U+FFFD. Arguments
nested more than :data:`MAX_ARGUMENT_DEPTH` levels deep, or holding a lone
surrogate (which UTF-8 cannot encode), are never sent: the call fails
``INVALID_ARGS`` (the SDK could not write or read them). After the
n-th consecutive failure the next start waits ``min(backoff_initial_s * 2**(n-1),
backoff_max_s)`` (inside the calling task, so cancellation and the timeout
plugin still apply). A failed listing counts as a failure; a successful
response or listing resets the count. A server with ``retry_attempts = n``
(n > 1) has its read-only and idempotent tools (by their annotations) retried
up to n attempts when the server was unavailable or died
(:class:`~dsh_core.RetryPolicy`, pausing like the reconnects); its other tools
are not, and ``dsh-tools check`` says so, since a second attempt could repeat
what the first did before the server died.

**Bearer tokens.** An HTTP server that requires one (``dsh-tools serve-mcp
--http`` does by default) gets ``Authorization: Bearer <value>``, the value
read from the environment variable ``token_env`` names at each connection
(the secret never sits in the configuration). A variable that is not set or
empty fails the server's setup and its calls (``MCP_SERVER_UNAVAILABLE``,
:class:`McpAuthenticationError`), and so does a server answering ``401``:
the messages name the variable, never its value, and nothing logs the value.

**Server output.** A stdio server's stderr is relayed to the host's stderr
a line at a time, prefixed ``[mcp:NAME]`` and with its control characters
escaped (see :mod:`dsh_plugins._mcp_stdio`).

**Cancellation.** A cancelled call (the caller's signal, the timeout plugin)
cancels the MCP request; the SDK then sends ``notifications/cancelled`` so the
server stops its work.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import ipaddress
import json
import logging
import math
import re
import threading
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from contextvars import ContextVar
from functools import partial
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal, Self, TypeAlias, TypeVar

import attrs
import trio

from dsh_core import (
    ConfigError,
    ContentBlock,
    DshError,
    ImageBlock,
    JsonSchemaError,
    JsonValue,
    RetryPolicy,
    TableCheck,
    TextBlock,
    ToolArgsError,
    ToolDefinition,
    ToolEffects,
    ToolOutput,
    ToolRunContext,
    ToolRuntime,
    bounded_listing,
    check_validator,
    hookimpl,
    json_text,
    keyed_check,
    nests_deeper_than,
    safe_repr,
    sole_exception,
    structure_table,
    thaw,
)
from dsh_core.schema import assert_object_json_schema, assert_supported_json_schema

if TYPE_CHECKING:
    import mcp_types
    from mcp import Client

    from dsh_core import Disposer

__all__ = [
    "DEFAULT_MAX_EVENT_BYTES",
    "ENVELOPE_SCHEMA",
    "MAX_ARGUMENT_DEPTH",
    "MCP_ERROR",
    "MCP_SERVER_DIED",
    "MCP_SERVER_UNAVAILABLE",
    "PLUGIN_NAME",
    "McpAuthenticationError",
    "McpClientError",
    "McpClientPlugin",
    "McpClientSettings",
    "McpDiagnostic",
    "McpServerSettings",
    "McpToolError",
    "SchemaDowngrade",
    "downgrade_schema",
]

# Capability manifest (enforced under strict_capabilities): tool names come from the configured servers; it decides no calls.
DSH_CAPABILITIES: dict[str, list[str]] = {"tools": ["*"], "affects": []}

logger = logging.getLogger("dsh_plugins.mcp_client")

PLUGIN_NAME: Final = "mcp-client"
MCP_SERVER_DIED: Final = "MCP_SERVER_DIED"
MCP_SERVER_UNAVAILABLE: Final = "MCP_SERVER_UNAVAILABLE"
MCP_ERROR: Final = "MCP_ERROR"

_LIST_PAGE_CAP: Final = 100
# Re-listings after tools/list_changed are paced: one at a time, at least this long apart (seconds),
# the gap doubling (up to the max) while the listings come back unchanged. A server answering each
# listing with another list_changed kept the host relisting back to back, at 100 % CPU.
_RELIST_INTERVAL_S: Final = 1.0
_RELIST_MAX_INTERVAL_S: Final = 30.0
_RELIST_UNCHANGED_WARNING: Final = 3  # warn (once a session) after this many unchanged listings in a row
MAX_ARGUMENT_DEPTH: Final = 200 - 2
"""The deepest arguments a call sends, counting the arguments object as one level.

The SDK's JSON parser (pydantic-core), which MCP servers built on it read every
message with, refuses messages nested more than 200 levels deep, and the
arguments sit two levels in (``{"params": {"arguments": ...}}``). Deeper
arguments would never be read, so they are refused before sending
(``INVALID_ARGS``): the server is not to blame.
"""
MAX_RETRY_ATTEMPTS: Final = 10
"""The most attempts ``retry_attempts`` may ask for (a server down for longer is down)."""

DEFAULT_MAX_EVENT_BYTES: Final = 16 * 1024 * 1024
"""The default ``max_event_bytes``: the largest message a server may send (an HTTP event, a stdio line).

The SDK's own default (1 MiB) fails any result over about half a MiB from a
server that sends a result's value twice (as text and as structured content),
as dsh-tools' own does.
"""


# -- errors -----------------------------------------------------------------------------------


class McpClientError(DshError):
    """A call could not be completed by its MCP server (code ``MCP_SERVER_DIED``, ``MCP_SERVER_UNAVAILABLE`` or ``MCP_ERROR``)."""


class McpAuthenticationError(McpClientError):
    """An HTTP server could not be authenticated with: its token variable is unset or empty, or it answered 401.

    Code ``MCP_SERVER_UNAVAILABLE``. The message names the variable, never its value.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message, code=MCP_SERVER_UNAVAILABLE)


def _server_gone(error: BaseException) -> bool:
    """A call failed because its server could not be reached or died, not because it answered."""
    return isinstance(error, McpClientError) and error.code in (MCP_SERVER_DIED, MCP_SERVER_UNAVAILABLE)


class McpToolError(DshError):
    """The MCP server answered the call with ``isError: true``; the message says what the result carries."""


# -- settings ---------------------------------------------------------------------------------

_NAME = re.compile(r"^[A-Za-z0-9_-]+$")


def _name_problem(value: str) -> str | None:
    return None if _NAME.match(value) else f"must be letters, digits, '_' or '-', got {value!r}"


def _milliseconds_problem(value: float) -> str | None:
    if not math.isfinite(value) or value <= 0:
        return f"must be a positive number of milliseconds, got {_as_written(value)}"
    return None


def _seconds_problem(value: float) -> str | None:
    if math.isfinite(value) and value > 0:
        return None
    return f"must be a positive number of seconds, got {_as_written(value)}"


def _as_written(value: float) -> str:
    # A float field gets the table's -1 as -1.0: an integral value is shown as the integer it was.
    return str(int(value)) if type(value) is float and value.is_integer() else repr(value)


def _attempts_problem(value: int) -> str | None:
    if type(value) is not int or not 1 <= value <= MAX_RETRY_ATTEMPTS:
        return f"must be an integer from 1 to {MAX_RETRY_ATTEMPTS}, got {value!r}"
    return None


_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def _env_name_problem(value: str) -> str | None:
    if _ENV_NAME.match(value):
        return None
    return f"must name an environment variable (letters, digits, '_'; not starting with a digit), got {value!r}"


def _bytes_problem(value: int) -> str | None:
    return None if type(value) is int and value > 0 else f"must be a positive whole number of bytes, got {value!r}"


def _url_problem(value: str) -> str | None:
    problem = loopback_problem(value)
    return None if problem is None else problem.removeprefix("url ")


# Each check twice over: in the type, for structure_table to report every bad key of the table at
# once with its path; as a validator, for settings a host constructs itself.
_Name: TypeAlias = Annotated[str, TableCheck(_name_problem)]
_Milliseconds: TypeAlias = Annotated[float, TableCheck(_milliseconds_problem)]
_Seconds: TypeAlias = Annotated[float, TableCheck(_seconds_problem)]
_check_name = check_validator(_name_problem)
_check_timeout = check_validator(_milliseconds_problem)
_check_positive = check_validator(_seconds_problem)


def loopback_problem(url: str) -> str | None:
    """Why ``url`` is not an ``http(s)`` URL on a loopback host, or ``None`` when it is.

    Hosts are never resolved: only ``localhost`` and literal loopback addresses
    (``127.0.0.0/8``, ``::1``) pass, so a DNS answer cannot redirect a call.
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https"):
        return f"url must be http:// or https://, got {url!r}"
    host = parts.hostname
    if host is None:
        return f"url has no host: {url!r}"
    if host == "localhost":
        return None
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return f"url host {host!r} is not a loopback address (only localhost, 127.0.0.0/8 and ::1 are allowed)"
    if not address.is_loopback:
        return f"url host {host!r} is not a loopback address (only localhost, 127.0.0.0/8 and ::1 are allowed)"
    return None


@attrs.frozen(kw_only=True)
class McpServerSettings:
    """One ``[[plugins.mcp.servers]]`` entry: a stdio ``command`` or a loopback ``url``."""

    name: _Name = attrs.field(validator=_check_name)
    command: str | None = None
    args: tuple[str, ...] = ()
    env: dict[str, str] | None = None
    cwd: str | None = None
    url: Annotated[str, TableCheck(_url_problem)] | None = attrs.field(
        default=None, validator=check_validator(_url_problem)
    )
    # The name of the variable holding the bearer token, never the token: settings get logged and shown.
    token_env: Annotated[str, TableCheck(_env_name_problem)] | None = attrs.field(
        default=None, validator=check_validator(_env_name_problem)
    )
    prefix: _Name | None = attrs.field(default=None, validator=_check_name)
    timeout_ms: _Milliseconds | None = attrs.field(default=None, validator=_check_timeout)
    retry_attempts: Annotated[int, TableCheck(_attempts_problem)] = attrs.field(
        default=1, validator=check_validator(_attempts_problem)
    )
    max_event_bytes: Annotated[int, TableCheck(_bytes_problem)] = attrs.field(
        default=DEFAULT_MAX_EVENT_BYTES, validator=check_validator(_bytes_problem)
    )

    def tool_name(self, mcp_name: str) -> str:
        """The registered name of the server's tool ``mcp_name``: one model providers take.

        MCP allows names they refuse (``fs.read``, a space, 65 characters), and
        one such name in the tool list makes the provider refuse every request:
        each other character becomes ``_``, and a name still too long keeps its
        head and a digest of the whole (calls still reach the server's own name).
        """
        return _provider_safe(self.prefixed(mcp_name))

    def prefixed(self, mcp_name: str) -> str:
        """``mcp_name`` with this server's prefix, as written (before it is made one providers take)."""
        return f"{self.prefix}__{mcp_name}" if self.prefix else mcp_name


def _provider_safe(name: str) -> str:
    if not name or _PROVIDER_NAME.fullmatch(name):
        return name  # an empty name stays empty: no tool can have it, and the registry says so
    safe = _PROVIDER_UNSAFE.sub("_", name)
    if len(safe) > _PROVIDER_NAME_CHARS:
        digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
        safe = f"{safe[: _PROVIDER_NAME_CHARS - 9]}_{digest}"
    return safe


# What OpenAI and Anthropic accept as a tool name (dsh_core's registry warns about others).
_PROVIDER_NAME_CHARS: Final = 64
_PROVIDER_NAME: Final = re.compile(r"[a-zA-Z0-9_-]{1,64}")
_PROVIDER_UNSAFE: Final = re.compile(r"[^a-zA-Z0-9_-]")


_STDIO_ONLY: Final = ("args", "env", "cwd")


def _transport_problems(server: McpServerSettings, *, in_process: bool = False) -> list[tuple[str, str]]:
    """What the entry's keys say against each other, as ``(key, problem)`` (``""``: the entry itself).

    A server is a stdio ``command`` or an HTTP ``url``, and each takes only
    its own keys: ``token_env`` only with ``url``; ``args``, ``env`` and ``cwd``
    only with ``command`` (a ``url`` server would ignore them). With
    ``in_process`` (a host hands the server over) neither is needed.
    """
    out = []
    if not in_process and (server.command is None) == (server.url is None):
        out.append(("", "give exactly one of command (stdio) or url (HTTP)"))
    if server.token_env is not None and server.url is None:
        out.append(("token_env", "applies to an HTTP server (url); a stdio server gets its environment from env"))
    if server.url is not None and server.command is None:
        set_keys = {"args": server.args != (), "env": server.env is not None, "cwd": server.cwd is not None}
        out.extend(
            (key, "applies to a stdio server (command); an HTTP server (url) is already running")
            for key in _STDIO_ONLY
            if set_keys[key]
        )
    return out


def _servers_problem(value: tuple[McpServerSettings, ...]) -> str | None:
    seen: set[str] = set()
    for server in value:
        if server.name in seen:
            return f'two servers are named "{server.name}"'
        seen.add(server.name)
    return None


def _check_servers(instance: object, attribute: attrs.Attribute[Any], value: tuple[McpServerSettings, ...]) -> None:
    problem = _servers_problem(value)
    if problem is not None:
        raise ValueError(problem)


_ServerEntry: TypeAlias = Annotated[McpServerSettings, keyed_check(partial(_transport_problems, in_process=True))]


@attrs.frozen(kw_only=True)
class McpClientSettings:
    """The ``[plugins.mcp]`` table."""

    servers: Annotated[tuple[_ServerEntry, ...], TableCheck(_servers_problem)] = attrs.field(
        default=(), validator=_check_servers
    )
    timeout_ms: _Milliseconds | None = attrs.field(default=None, validator=_check_timeout)
    connect_timeout_s: _Seconds = attrs.field(default=30.0, validator=_check_positive)
    backoff_initial_s: _Seconds = attrs.field(default=0.5, validator=_check_positive)
    backoff_max_s: _Seconds = attrs.field(default=30.0, validator=_check_positive)


_FileServerEntry: TypeAlias = Annotated[McpServerSettings, keyed_check(_transport_problems)]


@attrs.frozen(kw_only=True)
class _McpFileSettings(McpClientSettings):
    """The table as a configuration file gives it: no host hands a server over, so each needs command or url."""

    servers: Annotated[tuple[_FileServerEntry, ...], TableCheck(_servers_problem)] = attrs.field(
        default=(), validator=_check_servers
    )


@attrs.frozen(kw_only=True)
class McpDiagnostic:
    """Something ``dsh-tools check`` should show: a ``"warning"`` or a ``"problem"``."""

    level: Literal["warning", "problem"]
    server: str
    message: str
    tool: str | None = None
    # False: shown by ``dsh-tools check`` only, not logged each time the server is listed
    # (a note about the configuration, not about what the server sent).
    logged: bool = True

    def __str__(self) -> str:
        where = f'MCP server "{self.server}"' + (f', tool "{self.tool}"' if self.tool else "")
        return f"{where}: {self.message}"


# -- schema downgrade -----------------------------------------------------------------------------

NARROWING_KEYWORDS: Final = frozenset(
    {
        "pattern",
        "format",
        "minLength",
        "maxLength",
        "minimum",
        "maximum",
        "exclusiveMinimum",
        "exclusiveMaximum",
        "multipleOf",
        "minItems",
        "maxItems",
        "uniqueItems",
        "contains",
        "minContains",
        "maxContains",
        "minProperties",
        "maxProperties",
        "propertyNames",
        "dependentRequired",
        "contentEncoding",
        "contentMediaType",
        "contentSchema",
    }
)
"""Keywords that only narrow the values a typed node accepts: stripped (the server checks them)."""

IGNORED_KEYWORDS: Final = frozenset(
    {"$schema", "$id", "$comment", "$defs", "definitions", "deprecated", "readOnly", "writeOnly"}
)
"""Keywords that constrain nothing once ``$ref`` is refused: dropped without a warning."""

STRUCTURAL_KEYWORDS: Final = frozenset(
    {
        "$ref",
        "$dynamicRef",
        "$anchor",
        "$dynamicAnchor",
        "anyOf",
        "allOf",
        "not",
        "if",
        "then",
        "else",
        "dependentSchemas",
        "dependencies",
        "patternProperties",
        "prefixItems",
        "additionalItems",
        "unevaluatedProperties",
        "unevaluatedItems",
    }
)
"""Keywords that decide a value's shape: a schema using them (beyond the exact rewrites) is refused."""

_SCHEMA_VALUED_NARROWING: Final = frozenset({"contains", "propertyNames", "contentSchema"})
_DISJOINT_TYPES: Final = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})


@attrs.frozen(kw_only=True)
class SchemaDowngrade:
    """A schema made to fit the enforced subset, and what was changed to get there.

    ``stripped`` names each removed narrowing keyword by path and ``dropped`` each
    removed annotation (``x-`` keywords, an ``example`` beside ``examples``; warn
    about these); ``rewritten`` each exact rewrite (``anyOf`` → ``oneOf``,
    ``true`` → ``{}``, a type given to ``enum``, ...), which changes nothing.
    """

    schema: dict[str, Any]
    stripped: tuple[str, ...] = ()
    rewritten: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()


class _Downgrader:
    def __init__(self) -> None:
        self.stripped: list[str] = []
        self.rewritten: list[str] = []
        self.dropped: list[str] = []
        self.refused: list[str] = []

    def node(self, node: object, path: str) -> object:
        if node is True:  # the schema every value matches
            self.rewritten.append(path)
            return {}
        if node is False:
            self.refused.append(f"{path}: false (no value is valid) cannot be downgraded safely")
            return node
        if not isinstance(node, Mapping):
            return node  # the subset check reports it
        out: dict[str, Any] = {}
        notes: list[str] = []
        example: list[object] = []
        nullable = False
        for key, value in node.items():
            where = f"{path}.{key}"
            if key == "example":  # OpenAPI's single example: JSON Schema says examples
                example.append(value)
            elif key == "nullable" and isinstance(value, bool):
                nullable = value
                self.rewritten.append(where)
            elif key in STRUCTURAL_KEYWORDS and key != "anyOf":
                self.refused.append(f"{where}: {key} decides the value's shape and cannot be downgraded safely")
            elif key in IGNORED_KEYWORDS:
                continue
            elif isinstance(key, str) and key.startswith("x-"):
                # A vendor annotation: validators ignore it, so dropping it accepts the same values.
                self.dropped.append(where)
            elif key in NARROWING_KEYWORDS:
                self.stripped.append(where)
                notes.append(key if key in _SCHEMA_VALUED_NARROWING else f"{key} {json_text(_plain(value))}")
            elif key == "additionalProperties" and isinstance(value, Mapping):
                self.stripped.append(where)
                notes.append("additionalProperties " + json_text(_plain(value)))
            elif key == "properties" and isinstance(value, Mapping):
                out[key] = {name: self.node(item, f"{where}.{name}") for name, item in value.items()}
            elif key == "items" and isinstance(value, (Mapping, bool)):
                out[key] = self.node(value, where)
            elif key == "items" and isinstance(value, list):
                self.refused.append(f"{where}: tuple-form items cannot be downgraded safely")
            elif key in ("oneOf", "anyOf") and isinstance(value, list):
                out[key] = [self.node(item, f"{where}[{index}]") for index, item in enumerate(value)]
            else:
                out[key] = value
        if example:
            self.example(out, example[0], path)
        if nullable:
            self.allow_null(out)
        if "anyOf" in out:
            self.any_of(out, path)
        if isinstance(out.get("type"), list):
            self.type_list(out, path)
        elif "type" not in out and "oneOf" not in out and ("enum" in out or "const" in out):
            self.untyped_values(out, path)
        elif out.get("type") == "object":
            self.required_properties(out, path)
        if notes:
            described = out.get("description")
            note = "(checked by the server: " + "; ".join(notes) + ")"
            out["description"] = f"{described} {note}" if isinstance(described, str) and described else note
        return out

    def any_of(self, node: dict[str, Any], path: str) -> None:
        branches = node["anyOf"]
        if "type" in node or "oneOf" in node or not _disjoint(branches):
            self.refused.append(
                f"{path}.anyOf: only an anyOf whose branches each declare one distinct type "
                "can be rewritten (overlapping branches cannot be downgraded safely)"
            )
            return
        node["oneOf"] = node.pop("anyOf")
        self.rewritten.append(f"{path}.anyOf")

    def type_list(self, node: dict[str, Any], path: str) -> None:
        types = node["type"]
        # Each keyword that only applies to one type goes to that type's branch; one that
        # applies to none of the listed types would be a constraint left behind.
        stray = [key for key, kind in _TYPE_OF_KEYWORD.items() if key in node and kind not in types]
        odd_enum = "enum" in node and not isinstance(node["enum"], list)
        if stray or odd_enum or "oneOf" in node or len(types) < 2 or not _disjoint([{"type": t} for t in types]):
            self.refused.append(
                f"{path}.type: a list of types can only be rewritten when the types are disjoint "
                "and every keyword beside it applies to one of them"
            )
            return
        self.split_by_type(node, types, path, f"{path}.type")

    def untyped_values(self, node: dict[str, Any], path: str) -> None:
        """``enum``/``const`` without a type: the type of their values, one branch per type if several."""
        enum = node.get("enum", [])
        if not isinstance(enum, list):
            return  # the subset check says what is wrong
        values = [*enum, *([node["const"]] if "const" in node else [])]
        types = list(dict.fromkeys(_json_type(value) for value in values))
        if not values or any(t in (None, "object", "array") for t in types):
            return  # the subset check refuses it (enum and const only take scalars)
        if "integer" in types and "number" in types:
            types = [t for t in types if t != "integer"]  # a number branch holds the integers too
        self.split_by_type(node, types, path, f"{path}.enum" if "enum" in node else f"{path}.const")

    def split_by_type(self, node: dict[str, Any], types: list[Any], path: str, rewritten: str) -> None:
        """Give ``node`` one branch per type of ``types`` (one ``type`` if only one), exactly.

        A branch takes the keywords of its type and the ``enum`` members and
        ``const`` of its type; a type left with no value of ``enum`` or ``const``
        accepted nothing, so it gets no branch.
        """
        branches: list[dict[str, Any]] = []
        for kind in types:
            branch: dict[str, Any] = {"type": kind}
            for key, key_kind in _TYPE_OF_KEYWORD.items():
                if key in node and key_kind == kind:
                    branch[key] = node[key]
            if "enum" in node:
                members = [value for value in node["enum"] if _of_type(value, kind)]
                if not members:
                    continue
                branch["enum"] = members
            if "const" in node:
                if not _of_type(node["const"], kind):
                    continue
                branch["const"] = node["const"]
            if kind == "object":
                self.required_properties(branch, path)
            branches.append(branch)
        if not branches:
            self.refused.append(f"{path}.type: no value of the listed types is in enum or const (no value is valid)")
            return
        for key in ("type", "enum", "const", *_TYPE_OF_KEYWORD):
            node.pop(key, None)
        if len(branches) == 1:
            node.update(branches[0])
        else:
            node["oneOf"] = branches
        self.rewritten.append(rewritten)

    def required_properties(self, node: dict[str, Any], path: str) -> None:
        """Declare each required property ``properties`` leaves out as ``{}`` (any value), as it is."""
        required, properties = node.get("required"), node.get("properties", {})
        if not isinstance(required, list) or not isinstance(properties, Mapping):
            return  # the subset check says what is wrong
        missing = [name for name in required if isinstance(name, str) and name not in properties]
        # Without additionalProperties: false a required name left out accepts any value; with it,
        # no object is valid, and declaring the name would accept some.
        if not missing or node.get("additionalProperties") is False:
            return
        node["properties"] = {**properties, **{name: {} for name in missing}}
        self.rewritten.append(f"{path}.required")

    def allow_null(self, node: dict[str, Any]) -> None:
        """OpenAPI 3.0's ``nullable: true``: ``null`` joins the declared types.

        It only acts beside a ``type`` (OpenAPI 3.0.3), and ``enum``/``const``
        still decide: a ``null`` they leave out stays refused (the type-list
        rewrite gives it no branch). A server that reads the schema as plain
        JSON Schema ignores ``nullable`` and may refuse ``null`` itself; the
        registry then accepts a superset, as it does for stripped keywords.
        """
        declared = node.get("type")
        if isinstance(declared, str) and declared != "null":
            node["type"] = [declared, "null"]
        elif isinstance(declared, list) and "null" not in declared:
            node["type"] = [*declared, "null"]

    def example(self, node: dict[str, Any], example: object, path: str) -> None:
        if "examples" in node:
            self.dropped.append(f"{path}.example")  # the examples already show the model some
        else:
            node["examples"] = [example]
            self.rewritten.append(f"{path}.example")


_TYPE_OF_KEYWORD: Final = {
    "properties": "object",
    "required": "object",
    "additionalProperties": "object",
    "items": "array",
}
"""The keywords that apply to values of one type only (besides ``enum`` and ``const``)."""


def _json_type(value: object) -> str | None:
    """The JSON type of a value (``integer`` for integral numbers), or ``None`` for no JSON value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, str):
        return "string"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if value.is_integer() else "number"
    if isinstance(value, Mapping):
        return "object"
    if isinstance(value, (list, tuple)):
        return "array"
    return None


def _of_type(value: object, kind: str) -> bool:
    """Whether a value is of JSON type ``kind`` (an integer is also a number)."""
    actual = _json_type(value)
    return actual == kind or (kind == "number" and actual == "integer")


def _disjoint(branches: object) -> bool:
    if not isinstance(branches, list) or len(branches) < 2:
        return False
    seen: set[str] = set()
    for branch in branches:
        kind = branch.get("type") if isinstance(branch, Mapping) else None
        if not isinstance(kind, str) or kind not in _DISJOINT_TYPES or kind in seen:
            return False
        seen.add(kind)
    return not {"integer", "number"} <= seen


def _plain(value: object) -> JsonValue:
    from dsh_core import snapshot_json

    try:
        return snapshot_json(value)
    except ValueError:
        return repr(value)


def downgrade_schema(schema: Mapping[str, Any], *, root: str = "schema", object_root: bool = False) -> SchemaDowngrade:
    """Fit an MCP tool's JSON Schema into the enforced subset (see the module docstring).

    ``root`` names the schema in paths (``"parameters"``); ``object_root``
    requires ``type: "object"`` at the root, as parameters do.

    Raises:
        JsonSchemaError: ``violations`` lists every keyword that could not be
            downgraded safely and every remaining violation of the subset.
    """
    downgrader = _Downgrader()
    try:
        result = downgrader.node(schema, root)
    except RecursionError:
        raise JsonSchemaError([f"{root}: nested too deeply to downgrade"]) from None
    if downgrader.refused:
        raise JsonSchemaError(downgrader.refused)
    try:
        if object_root:
            assert_object_json_schema(result, reason="tool arguments are a JSON object")
        else:
            assert_supported_json_schema(result)
    except JsonSchemaError as exc:
        # The subset check names its root "schema"; say ``root`` like the refusals above.
        raise JsonSchemaError([_relabel(violation, root) for violation in exc.violations]) from None
    assert isinstance(result, dict)  # the check accepted it
    return SchemaDowngrade(
        schema=result,
        stripped=tuple(downgrader.stripped),
        rewritten=tuple(downgrader.rewritten),
        dropped=tuple(downgrader.dropped),
    )


def _downgrade_note(result: SchemaDowngrade, checked_by: str) -> str:
    parts = []
    if result.stripped:
        parts.append(f"stripped {_keywords(result.stripped)} ({checked_by})")
    if result.dropped:
        parts.append(f"dropped the keywords {_keywords(result.dropped)} (annotations, not constraints)")
    return "; ".join(parts)


#: How long one listed keyword or problem of a remote schema may be (its middle is elided past this).
_LISTED_CHARS: Final = 300


def _keywords(paths: Sequence[str]) -> str:
    return bounded_listing(paths, separator=", ", item_chars=_LISTED_CHARS)


def _schema_problems(exc: JsonSchemaError) -> str:
    """The first problems of a remote schema, each cut short, then how many more.

    The schema is the server's: thousands of keywords, or paths thousands of
    levels deep, must not make a diagnostic (shown by ``check``, logged) megabytes long.
    """
    return bounded_listing(exc.violations, omitted=exc.omitted, item_chars=_LISTED_CHARS)


def _relabel(violation: str, root: str) -> str:
    if violation == "schema" or violation.startswith(("schema.", "schema ", "schema[")):
        return root + violation[len("schema") :]
    return violation


# -- the result envelope ----------------------------------------------------------------------------

_STRING: Final = {"type": "string"}
ENVELOPE_SCHEMA: Final[dict[str, Any]] = {
    "type": "object",
    "additionalProperties": False,
    "required": ["content"],
    "properties": {
        "content": {
            "type": "array",
            "items": {
                "oneOf": [
                    {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["type", "text"],
                        "properties": {"type": {"type": "string", "const": "text"}, "text": _STRING},
                    },
                    {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["type", "data", "mime_type"],
                        "properties": {
                            "type": {"type": "string", "const": "image"},
                            "data": _STRING,
                            "mime_type": _STRING,
                        },
                    },
                    {
                        "type": "object",
                        "required": ["type"],
                        "properties": {"type": {"type": "string", "enum": ["audio", "resource", "resource_link"]}},
                    },
                ]
            },
        }
    },
}
"""The value of an MCP tool that declares no output schema: its content items, as JSON."""


def _content_item(block: mcp_types.ContentBlock) -> dict[str, Any]:
    import mcp_types

    if isinstance(block, mcp_types.TextContent):
        return {"type": "text", "text": block.text}
    if isinstance(block, mcp_types.ImageContent):
        problem = _image_problem(block.data, block.mime_type)
        if problem is not None:
            # A provider refuses the whole request holding it, and every later one of the conversation.
            return {"type": "text", "text": f"[an image the server returned was left out: {problem}]"}
        return {"type": "image", "data": block.data, "mime_type": block.mime_type}
    item: dict[str, Any] = block.model_dump(mode="json", exclude_none=True)
    return item


# The image types model providers take (Anthropic's list; OpenAI's is the same four).
_IMAGE_TYPES: Final = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})


def _image_problem(data: str, mime_type: str) -> str | None:
    """Why a server's image cannot go to a model as one, or ``None``."""
    if mime_type not in _IMAGE_TYPES:
        return f"its type {safe_repr(mime_type)[:80]} is not one model providers take ({', '.join(sorted(_IMAGE_TYPES))})"
    try:
        base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return "its data is not base64"
    return None


def render_envelope(args: object, value: JsonValue) -> list[ContentBlock]:
    """Text and image items as blocks; any other item as its JSON text."""
    assert isinstance(value, Mapping)
    items = value["content"]
    assert isinstance(items, (list, tuple))
    blocks: list[ContentBlock] = []
    for item in items:
        assert isinstance(item, Mapping)
        if item["type"] == "text":
            blocks.append(TextBlock(str(item["text"])))
        elif item["type"] == "image":
            blocks.append(ImageBlock(str(item["data"]), str(item["mime_type"])))
        else:
            blocks.append(TextBlock(json_text(item)))
    return blocks


_DETAIL_CAP: Final = 500
"""The most characters of a server's structured detail or refusal quoted in a message."""


def _bounded(text: str, cap: int = _DETAIL_CAP) -> str:
    return text if len(text) <= cap else text[: cap - 1] + "…"


def _result_text(result: mcp_types.CallToolResult) -> str:
    """The message of an ``isError`` result: its text, else what else it carries."""
    import mcp_types

    texts = [block.text for block in result.content if isinstance(block, mcp_types.TextContent)]
    # A dsh-tools server (and many others) already prefix their failure text.
    text = "\n".join(texts).removeprefix("Error: ")
    if text:
        return text
    if result.structured_content is not None:
        return "the MCP tool reported an error: " + _bounded(json_text(_plain(result.structured_content)))
    kinds = sorted({block.type for block in result.content})
    if kinds:
        return f"the MCP tool reported an error (with {', '.join(kinds)} content only)"
    return "the MCP tool reported an error"


def _invalid_result(exc: Exception) -> str:
    """One line saying why the SDK refused a tool result (its exceptions carry multi-line dumps)."""
    from pydantic import ValidationError

    if isinstance(exc, ValidationError):
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"]) or "the result"
        return _bounded(f"the result does not parse ({where}: {first['msg']})")
    # The SDK raises RuntimeError from the jsonschema error that says what broke where.
    cause = exc.__cause__
    message, path = getattr(cause, "message", None), getattr(cause, "json_path", None)
    if isinstance(message, str) and isinstance(path, str):
        return _bounded(f"its structured content does not match the tool's output schema ({message} at {path})")
    lines = str(exc).strip().splitlines()
    return _bounded(lines[0] if lines else type(exc).__name__)


def _unsendable(arguments: dict[str, Any]) -> str | None:
    """Why ``arguments`` cannot go out in an MCP message, or None when they can.

    Found before sending, so that the server is not blamed for the client's own
    failure (or for never answering a message it could not read).
    """
    if nests_deeper_than(arguments, MAX_ARGUMENT_DEPTH):
        return f"they nest more than {MAX_ARGUMENT_DEPTH} levels deep, deeper than an MCP message can carry"
    try:
        # The SDK writes messages as UTF-8, which has no form for a lone surrogate (JSON's "\ud800").
        json.dumps(arguments, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return (
            "a string in them holds a lone surrogate (\\ud800-\\udfff outside a pair), "
            "which an MCP message cannot carry"
        )
    return None


def _effects_of(annotations: Any) -> ToolEffects | None:
    """A server's tool annotations as ToolEffects (``None``: it declared none).

    Annotations that carry no hint (a title alone) declare nothing, so rules for
    undeclared tools apply. A hint left out takes the MCP specification's
    default, which assumes the worst: ``destructiveHint`` true unless the tool
    is read-only, ``openWorldHint`` true.
    """
    hints = (
        annotations.read_only_hint,
        annotations.destructive_hint,
        annotations.idempotent_hint,
        annotations.open_world_hint,
    ) if annotations is not None else (None, None, None, None)  # fmt: skip
    if all(hint is None for hint in hints):
        return None
    read_only_hint, destructive_hint, idempotent_hint, open_world_hint = hints
    read_only = read_only_hint is True
    # Contradictory hints (read-only and destructive): trust the more dangerous one.
    destructive = destructive_hint is True if read_only else destructive_hint is not False
    return ToolEffects(
        read_only=read_only and not destructive,
        destructive=destructive,
        idempotent=idempotent_hint is True,
        open_world=open_world_hint is not False,
    )


def _always(args: object) -> bool:
    return True


# -- one server -------------------------------------------------------------------------------------


class _StreamWatch:
    """A transport stream, passed through, that tells its session what only the stream sees."""

    def __init__(self, stream: Any, session: _Session) -> None:
        self._stream = stream
        self._session = session

    def __getattr__(self, name: str) -> Any:  # ``last_context`` and friends
        return getattr(self._stream, name)

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


class _ReadWatch(_StreamWatch):
    """A transport's read stream that reports its end and the messages nobody waits for.

    Its end (the server closed the connection), and the messages no pending
    request can be matched to: the SDK would drop those or hand them to the
    message handler, and the request waiting for its answer would wait forever.
    """

    def __init__(self, stream: Any, session: _Session, *, one_stream: bool) -> None:
        super().__init__(stream, session)
        # Over stdio every message shares one stream, so one that does not parse may be
        # any request's answer. Over HTTP an answer that does not parse comes back as its
        # own request's error; one failing alone here came on the notification stream.
        self._unparsed_may_answer = one_stream

    async def receive(self) -> Any:
        import anyio

        try:
            item = await self._stream.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._session.end()
            raise
        self._check(item)
        return item

    def _check(self, item: object) -> None:
        from mcp.shared.dispatcher import coerce_request_id
        from mcp_types import JSONRPCError, JSONRPCResponse

        from ._mcp_stdio import MessageTooLarge

        session = self._session
        if isinstance(item, MessageTooLarge):  # the stdio transport ends the session after it
            session.protocol_failure = True
            session.unmatched(
                f"sent a message larger than the client's limit of {item.limit} bytes (max_event_bytes in its "
                "[[plugins.mcp.servers]] entry); its session was ended"
            )
            return
        if isinstance(item, Exception):  # what the transport could not parse
            problem = _unparsed_message(item) if self._unparsed_may_answer else None
            if problem is not None:
                session.unmatched(f"sent a message the MCP SDK could not parse ({problem})")
            return
        message = getattr(item, "message", None)
        if not isinstance(message, (JSONRPCResponse, JSONRPCError)):
            return
        if isinstance(message, JSONRPCResponse):
            method = session.watched_methods.pop(coerce_request_id(message.id), None)
            if method == "initialize" and isinstance(message.result.get("protocolVersion"), str):
                session.protocol_version = message.result["protocolVersion"]
            elif method == "tools/list":
                _drop_invalid_tools(message.result, session)
        if message.id is None:  # JSON-RPC's answer to a request it could not read
            assert isinstance(message, JSONRPCError)
            error = message.error
            problem = f"answered with an error that names no request ({error.code}: {_bounded(error.message)})"
            session.unmatched(problem)
            return
        request_id = coerce_request_id(message.id)
        if not session.knows(request_id):
            session.unmatched(f"answered request id {message.id!r}, which this client never sent")
            return
        if isinstance(message, JSONRPCError):
            session.note_error(request_id)
        session.settle(request_id)

    def __aiter__(self) -> _ReadWatch:
        return self

    async def __anext__(self) -> Any:
        import anyio

        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None


class _WriteWatch(_StreamWatch):
    """A transport's write stream that notes each request id sent, and reports a broken connection."""

    async def send(self, item: Any) -> None:
        import anyio
        from mcp.shared.dispatcher import coerce_request_id
        from mcp_types import JSONRPCRequest

        message = getattr(item, "message", None)
        if isinstance(message, JSONRPCRequest):
            request_id = coerce_request_id(message.id)
            self._session.note_sent(request_id)
            if message.method in ("initialize", "tools/list"):
                self._session.watched_methods[request_id] = message.method
            pending = _CURRENT_REQUEST.get()
            if pending is not None:  # sent from the task of one session.request()
                pending.ids.append(request_id)
        try:
            await self._stream.send(item)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            # The transport's writer is gone; the read side may not have noticed yet.
            self._session.end()
            raise


def _drop_invalid_tools(result: dict[str, Any], session: _Session) -> None:
    """Take out of a ``tools/list`` result each tool the SDK would refuse, noting why on ``session``.

    The SDK validates a listing as a whole: one tool it refuses (no
    ``inputSchema``, an ``outputSchema`` that is not an object schema) would fail
    the listing, and so make every tool of the server unavailable. Here that one
    tool is refused alone (:attr:`_Session.refused_tools`), and the rest of the
    listing goes on to the SDK.
    """
    tools = result.get("tools")
    if not isinstance(tools, list):
        return  # no listing at all: the SDK refuses it, as before
    kept: list[Any] = []
    for index, tool in enumerate(tools):
        why = _tool_problem(tool, session.protocol_version)
        if why is None:
            kept.append(tool)
            continue
        name = tool.get("name") if isinstance(tool, Mapping) else None
        if isinstance(name, str) and name:
            session.refused_tools.append((name, why))
        else:
            session.refused_tools.append(("", f"tool {index + 1} of the listing: {why}"))
    if len(kept) != len(tools):
        result["tools"] = kept


def _tool_problem(tool: object, version: str | None) -> str | None:
    """Why the SDK would refuse a listing holding ``tool`` (one line), or ``None``."""
    import mcp_types
    from mcp_types.methods import validate_server_result
    from pydantic import ValidationError

    try:
        if version is not None:
            try:  # what the SDK checks first: the listing as the negotiated version defines it
                validate_server_result("tools/list", version, {"tools": [tool]})
            except ValidationError:
                raise
            except (KeyError, ValueError):
                pass  # a version it does not know: the SDK skips that check too (or refuses the session)
        mcp_types.Tool.model_validate(tool, by_name=False)
    except ValidationError as exc:
        return _validation_line(exc, within=("tools", 0))
    return None


def _validation_line(exc: Any, *, within: tuple[object, ...] = ()) -> str:
    """One line for a pydantic ``ValidationError`` (where, and what), its locations taken relative to ``within``."""
    errors = exc.errors(include_url=False)
    first = errors[0]
    loc = tuple(first["loc"])
    if loc[: len(within)] == within:
        loc = loc[len(within) :]
    where = ".".join(str(part) for part in loc) or "the definition"
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return _bounded(f"{where}: {first['msg']}{more}")


def _unparsed_message(exc: Exception) -> str | None:
    """What to say about an item the transport could not parse; ``None`` when it cannot be an answer.

    A server printing a line of text to stdout sent no message, nor did one
    logging a JSON object without an ``id``, nor one sending a malformed
    notification (the SDK logs each). A line starting with ``{`` that is not
    valid JSON (garbled, cut short), or an object with an ``id`` and no
    ``method``, may be the answer a request waits for.
    """
    from pydantic import ValidationError

    if not isinstance(exc, ValidationError):
        return _bounded(_describe(exc))
    errors = exc.errors(include_url=False)
    invalid = [error for error in errors if error["type"] == "json_invalid"]
    if invalid:
        text = invalid[0].get("input")
        if isinstance(text, str) and not text.lstrip().startswith("{"):
            return None
        return _bounded(invalid[0]["msg"])  # garbled or cut short: it may well be an answer
    message = _refused_value(errors)
    if message is not _UNKNOWN and not _may_answer(message):
        return None
    return "valid JSON, but not a JSON-RPC message"


_UNKNOWN: Final = object()


def _refused_value(errors: Sequence[Any]) -> object:
    """The JSON value the SDK refused, when its validation errors show it (else ``_UNKNOWN``).

    The SDK validates against a union of the four message kinds, so an error
    at one of them (``loc`` = the kind) carries the whole value as its input,
    and so does a field missing from the top-level object (``loc`` = kind, field).
    """
    for error in errors:
        loc = error["loc"]
        if len(loc) == 1 or (len(loc) == 2 and error["type"] == "missing"):
            return error.get("input", _UNKNOWN)
    return _UNKNOWN


def _may_answer(message: object) -> bool:
    """Whether a JSON value could be a response: an object with an ``id`` and no ``method``, or a batch holding one."""
    if isinstance(message, Mapping):
        return "id" in message and "method" not in message
    if isinstance(message, list):
        return any(isinstance(item, Mapping) and _may_answer(item) for item in message)
    return False


_SENT_IDS_KEPT: Final = 4096
"""How many ids of settled requests a session remembers (their late answers are no stranger's)."""

_T = TypeVar("_T")


class _Pending:
    """A request in flight on a session, failed by cancelling its scope."""

    def __init__(self) -> None:
        self.scope = trio.CancelScope()
        self.problem: str | None = None
        self.ids: list[object] = []  # the JSON-RPC ids it was sent under (through a watched transport)


_CURRENT_REQUEST: ContextVar[_Pending | None] = ContextVar("dsh_mcp_current_request", default=None)


class _SessionGone(Exception):
    """The server no longer knows the session (it restarted): the request was not processed."""


class _StandIn(Exception):
    """The HTTP transport gave up on the response itself (``reason``: its words), not the server.

    Either the response was larger than its limit on one event (``oversized``),
    or the response stream ended or broke: the server is gone, or cut the connection.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason

    @property
    def oversized(self) -> bool:
        # The SDK's words for an event over its limit (httpx2's SSEError), read only in what the
        # transport reported as its own: a server's answer never gets here, whatever its text.
        return "byte limit" in self.reason


class _Session:
    """One connection attempt to a server: its client, once up, and what its streams noticed."""

    def __init__(self, server_name: str) -> None:
        self.server_name = server_name
        self.client: Client | None = None
        self.ended = False
        self.failure_noted = False  # this session's end (lost, or its token refused) was counted as a failure
        self.protocol_failure = False  # ended by the transport for what the server sent (a line too long)
        self.list_changed = False
        self.wake = trio.Event()
        # Ids of the requests sent and not yet settled: an answer to an id the client
        # never sent matches no request. Never dropped while their request waits, however
        # many others come and go, or its own answer would pass for a stranger's.
        self.sent: set[object] = set()
        # Ids of requests answered or abandoned (the most recent ones): a late answer to one
        # is harmless. Insertion-ordered, so the oldest is dropped first.
        self.settled: dict[object, None] = {}
        # Ids the server answered with an error (the most recent ones).
        self.errored: dict[object, None] = {}
        self.auth_refused = False  # the HTTP server answered 401
        # Requests the HTTP transport failed itself, with its words (see _mcp_http).
        self.stand_ins: dict[object, str] = {}
        # Requests the server refused because it no longer knows the session (not processed).
        self.gone: set[object] = set()
        self.pending: set[_Pending] = set()
        # The initialize and tools/list requests in flight (id -> method), the protocol version the
        # server answered initialize with, and the tools of tools/list answers the SDK would refuse
        # ((name, why)), taken out of the listing so that the server's other tools still register.
        self.watched_methods: dict[object, str] = {}
        self.protocol_version: str | None = None
        self.refused_tools: list[tuple[str, str]] = []

    def end(self) -> None:
        self.ended = True
        self.wake.set()

    def changed(self) -> None:
        self.list_changed = True
        self.wake.set()

    @property
    def live(self) -> bool:
        return self.client is not None and not self.ended

    def note_sent(self, request_id: object) -> None:
        self.sent.add(request_id)
        self.settled.pop(request_id, None)

    def knows(self, request_id: object) -> bool:
        """Whether ``request_id`` is one this client sent (pending, or settled lately)."""
        return request_id in self.sent or request_id in self.settled

    def settle(self, request_id: object) -> None:
        """The request is answered or abandoned: remember its id a while longer, among the settled."""
        self.watched_methods.pop(request_id, None)
        if request_id not in self.sent:
            return
        self.sent.discard(request_id)
        self.settled[request_id] = None
        if len(self.settled) > _SENT_IDS_KEPT:
            del self.settled[next(iter(self.settled))]

    def note_stand_in(self, request_id: object, reason: str) -> None:
        self.stand_ins[request_id] = reason

    def note_session_gone(self, request_id: object | None) -> None:
        """The server answered 404 to this session's id: it no longer knows the session."""
        if request_id is None:
            self.end()  # no request waits for this answer (the notification stream, a notification)
        else:
            # Ended by the request once its answer is read: ended now, the transport's task
            # would find the read stream closed as it hands that answer on.
            self.gone.add(request_id)

    def note_error(self, request_id: object) -> None:
        self.errored[request_id] = None
        if len(self.errored) > _SENT_IDS_KEPT:
            del self.errored[next(iter(self.errored))]

    def unmatched(self, problem: str) -> None:
        """The server sent something no pending request can be matched to: fail every pending request.

        Whichever request that message answered would otherwise wait forever,
        and which one it was cannot be known.
        """
        logger.warning('MCP server "%s" %s', self.server_name, problem)
        for pending in self.pending:
            pending.problem = problem
            pending.scope.cancel()

    async def request(self, send: Callable[[], Awaitable[_T]], what: str) -> _T:
        """``await send()``, failed with ``MCP_ERROR`` if :meth:`unmatched` fires meanwhile."""
        from mcp import MCPError
        from mcp_types import CONNECTION_CLOSED

        pending = _Pending()
        self.pending.add(pending)
        token = _CURRENT_REQUEST.set(pending)
        try:
            with pending.scope:
                return await send()
        except Exception as exc:
            if any(i in self.gone for i in pending.ids):
                self.end()
                raise _SessionGone() from exc
            if not isinstance(exc, MCPError):
                raise
            stand_in = next((self.stand_ins[i] for i in pending.ids if i in self.stand_ins), None)
            if stand_in is not None and exc.message == stand_in and exc.code == CONNECTION_CLOSED:
                raise _StandIn(stand_in) from exc
            # -32000 is the SDK's CONNECTION_CLOSED and JSON-RPC's "server error" alike. One
            # the server never sent for this request is the SDK's own: the connection is gone,
            # whichever of the streams, the transport's tasks or this request learns it first.
            if exc.code == CONNECTION_CLOSED and pending.ids and not any(i in self.errored for i in pending.ids):
                self.end()
            raise
        finally:
            _CURRENT_REQUEST.reset(token)
            self.pending.discard(pending)
            for request_id in pending.ids:
                self.settle(request_id)
                self.stand_ins.pop(request_id, None)
                self.gone.discard(request_id)
        # Only reached when unmatched() cancelled the scope (an outer cancellation propagates).
        raise McpClientError(f'MCP server "{self.server_name}" {pending.problem}; {what} was abandoned', code=MCP_ERROR)


class _Server:
    """A configured server: its settings, registrations, failures and current session."""

    def __init__(
        self, settings: McpServerSettings, in_process: object | None, default_timeout_ms: float | None
    ) -> None:
        self.settings = settings
        self.in_process = in_process
        self.timeout_ms = settings.timeout_ms if settings.timeout_ms is not None else default_timeout_ms
        self.listed: dict[str, tuple[dict[str, Any], Disposer]] = {}  # registered name -> (tool dump, disposer)
        self.notes: dict[str, list[McpDiagnostic]] = {}  # registered name -> its warnings and problems
        self.connect_problem: McpDiagnostic | None = None
        self.listing_notes: list[McpDiagnostic] = []  # about the last listing as a whole
        self.failures = 0
        self.retry_at = -math.inf
        self.session: _Session | None = None
        self.lock = trio.Lock()

    @property
    def name(self) -> str:
        return self.settings.name

    def new_session(self) -> _Session:
        return _Session(self.name)

    def transport(self, session: _Session) -> Any:
        """What ``mcp.Client`` connects to for ``session``."""
        from mcp.client.stdio import StdioServerParameters

        from ._mcp_stdio import stdio_transport

        if self.in_process is not None:
            return self.in_process  # in memory: cannot die, and passes objects, not text to parse
        settings = self.settings
        if settings.url is not None:
            inner = _http_transport(settings, session)
        else:
            assert settings.command is not None
            # "replace": with the default "strict", one byte that is not UTF-8 on the server's stdout
            # kills the transport's reader, and so the session with every call in flight. Replaced,
            # the line still parses (or is plain text) and the session goes on.
            # Writes are unaffected: arguments UTF-8 cannot carry are refused before sending.
            params = StdioServerParameters(
                command=settings.command,
                args=list(settings.args),
                env=settings.env,
                cwd=settings.cwd,
                encoding_error_handler="replace",
            )
            # Not the SDK's stdio_client: a reader that dies there leaves the session looking live.
            inner = stdio_transport(params, name=settings.name, max_line_bytes=settings.max_event_bytes)
        return _WatchedTransport(inner, session, one_stream=settings.url is None)


# Visible ASCII: what an HTTP header carries unchanged (a newline would end the header).
_TOKEN_CHARACTERS: Final = frozenset(range(0x21, 0x7F))


def _bearer_token(settings: McpServerSettings) -> str:
    """The value of ``settings.token_env``; refused (naming the variable only) when unset, empty or unsendable."""
    import os

    assert settings.token_env is not None
    token = os.environ.get(settings.token_env, "")
    if not token:
        raise McpAuthenticationError(
            f"the environment variable {settings.token_env} (token_env) is not set or empty: "
            "it must hold the server's bearer token"
        )
    if not all(ord(character) in _TOKEN_CHARACTERS for character in token):
        raise McpAuthenticationError(
            f"the environment variable {settings.token_env} (token_env) cannot be sent as a bearer token: "
            "it holds a space, a control character or a character that is not ASCII"
        )
    return token


@asynccontextmanager
async def _http_transport(settings: McpServerSettings, session: _Session) -> AsyncIterator[Any]:
    """The SDK's streamable HTTP transport, sending the bearer token if any and telling ``session`` of a 401."""
    from mcp.shared._httpx_utils import create_mcp_http_client

    from ._mcp_http import http_transport

    assert settings.url is not None
    headers = {"Authorization": f"Bearer {_bearer_token(settings)}"} if settings.token_env is not None else None

    async def note_status(response: Any) -> None:
        if response.status_code == 401:
            session.auth_refused = True

    # The SDK's own default client, plus the header and the hook; the SDK follows no redirect
    # off the endpoint's origin, so the token goes nowhere else.
    http = create_mcp_http_client(headers=headers)
    http.event_hooks = {"response": [note_status]}
    async with http, http_transport(
        settings.url,
        max_event_bytes=settings.max_event_bytes,
        on_stand_in=session.note_stand_in,
        on_session_gone=session.note_session_gone,
        http_client=http,
    ) as streams:
        yield streams


def _refused_message(settings: McpServerSettings) -> str:
    """Why a server answered 401, and what to check (the variable's name, never its value)."""
    if settings.token_env is None:
        return (
            "the server requires authentication (HTTP 401): name the environment variable holding its "
            "bearer token with token_env"
        )
    return (
        f"the server refused the bearer token (HTTP 401): check that {settings.token_env} (token_env) "
        "holds the token the server requires"
    )


class _WatchedTransport:
    """A transport whose streams report to the session (see :class:`_ReadWatch`, :class:`_WriteWatch`)."""

    def __init__(self, inner: Any, session: _Session, *, one_stream: bool) -> None:
        self._inner = inner
        self._session = session
        self._one_stream = one_stream

    async def __aenter__(self) -> tuple[Any, Any]:
        read, write = await self._inner.__aenter__()
        return _ReadWatch(read, self._session, one_stream=self._one_stream), _WriteWatch(write, self._session)

    async def __aexit__(self, *exc: Any) -> bool | None:
        result: bool | None = await self._inner.__aexit__(*exc)
        return result


def _describe(exc: BaseException) -> str:
    """One line for an exception, looking inside exception groups (anyio task groups wrap).

    Unlike ``sole_exception`` alone, a group of several is described leaf by leaf.

    Cut to :data:`_DETAIL_CAP`: the text is often the server's (an error answer
    to ``initialize``), and it reaches the model, ``check`` and the log.
    """
    exc = sole_exception(exc)
    if isinstance(exc, BaseExceptionGroup):
        return _bounded("; ".join(_describe(inner) for inner in exc.exceptions))
    if isinstance(exc, McpAuthenticationError):
        return exc.message  # says what it is already
    text = str(exc).strip()
    return _bounded(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)


def _unavailable(server_name: str, exc: BaseException) -> McpClientError:
    """The ``MCP_SERVER_UNAVAILABLE`` error of a connection that failed with ``exc``."""
    message = f'MCP server "{server_name}" is unavailable: {_describe(exc)}'
    if isinstance(sole_exception(exc), McpAuthenticationError):
        return McpAuthenticationError(message)
    return McpClientError(message, code=MCP_SERVER_UNAVAILABLE)


def _connection_lost(exc: BaseException, session: _Session) -> bool:
    """Whether a failed request means the connection is gone, rather than that the server answered.

    The SDK fails a request with -32000 (its ``CONNECTION_CLOSED``) when the
    connection ends, but -32000 is also JSON-RPC's "server error", which a
    server may answer with in any words; so only the watched streams
    (``session.ended``) prove the end, plus the HTTP transport's own
    stand-ins for a response stream that ended (as the transport reported
    them, never by their text).
    """
    import anyio

    if session.ended:
        return True
    if isinstance(exc, _StandIn):
        return not exc.oversized
    return isinstance(exc, (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream, OSError))


# -- the plugin -------------------------------------------------------------------------------------


Body: TypeAlias = Callable[[Any, ToolRunContext], Awaitable[object]]


class McpClientPlugin:
    """The MCP client of one runtime: registers its servers' tools and carries their calls.

    Construct it with the runtime and :class:`McpClientSettings`; ``in_process``
    maps a server name to an in-process ``mcp.server.Server`` or ``MCPServer``
    (tests, embedding) used instead of that entry's command or URL. Then either
    :meth:`discover` (blocking, what ``dsh_setup`` does), :meth:`sync` (async),
    or enter :meth:`running`, which connects every server and owns the
    sessions' tasks until it exits.
    """

    def __init__(
        self,
        runtime: ToolRuntime,
        settings: McpClientSettings | None = None,
        *,
        in_process: Mapping[str, object] | None = None,
    ) -> None:
        self.runtime = runtime
        self.settings = settings or McpClientSettings()
        in_process = dict(in_process or {})
        self._servers: list[_Server] = []
        for server in self.settings.servers:
            target = in_process.pop(server.name, None)
            for key, problem in _transport_problems(server, in_process=target is not None)[:1]:
                raise ValueError(f'MCP server "{server.name}": ' + (f"{key} {problem}" if key else problem))
            self._servers.append(_Server(server, target, self.settings.timeout_ms))
        if in_process:
            raise ValueError(f"in_process names no configured server: {', '.join(sorted(in_process))}")
        self._nursery: trio.Nursery | None = None
        self._in_setup = False

    @classmethod
    @asynccontextmanager
    async def connect(
        cls,
        runtime: ToolRuntime,
        config: Mapping[str, Any] | McpClientSettings | None = None,
        *,
        in_process: Mapping[str, object] | None = None,
    ) -> AsyncIterator[McpClientPlugin]:
        """Register a plugin for ``runtime``, connect its servers, and tear everything down on exit.

        For hosts that build the plugin themselves instead of loading the
        ``mcp`` entry point. ``config`` is a ``[plugins.mcp]``-shaped table or
        settings. On exit the sessions close, the tools are disposed and the
        plugin is unregistered.
        """
        settings = config if isinstance(config, McpClientSettings) else _structure(config or {})
        plugin = cls(runtime, settings, in_process=in_process)
        runtime.plugins.register(plugin)
        try:
            async with plugin.running():
                yield plugin
        finally:
            plugin.dispose()
            runtime.plugins.unregister(plugin)

    # -- discovery and registrations ----------------------------------------------------------

    def discover(self) -> None:
        """List every server once and register its tools, blocking (for ``dsh_setup``).

        Runs its own ``trio.run`` in a worker thread, so it works with or
        without a running event loop (which it blocks meanwhile). A server that
        cannot be listed is reported in :meth:`diagnostics`.
        """
        listings: dict[str, _Listing | BaseException] = {}

        async def list_all() -> None:
            async with trio.open_nursery() as nursery:
                for server in self._servers:
                    nursery.start_soon(self._list_once, server, listings)

        failure: list[BaseException] = []

        def worker() -> None:
            try:
                trio.run(list_all)
            except BaseException as exc:
                failure.append(exc)

        thread = threading.Thread(target=worker, name="dsh-mcp-discover", daemon=True)
        thread.start()
        thread.join()
        if failure:
            raise failure[0]
        for server in self._servers:
            self._apply_listing(server, listings[server.name])
        # The worker's run has ended: nothing of it may be reused by the host's run.
        for server in self._servers:
            server.lock = trio.Lock()

    async def sync(self) -> None:
        """List every server once (a short-lived session each) and re-sync the registrations."""
        listings: dict[str, _Listing | BaseException] = {}
        async with trio.open_nursery() as nursery:
            for server in self._servers:
                nursery.start_soon(self._list_once, server, listings)
        for server in self._servers:
            self._apply_listing(server, listings[server.name])

    async def _list_once(self, server: _Server, out: dict[str, _Listing | BaseException]) -> None:
        session = server.new_session()
        try:
            with trio.fail_after(self.settings.connect_timeout_s):
                async with self._client(server, session) as client:
                    out[server.name] = await _list_tools(session, client)
        except Exception as exc:
            out[server.name] = exc

    def _apply_listing(self, server: _Server, listing: _Listing | BaseException) -> None:
        if isinstance(listing, BaseException):
            message = f"could not be listed: {_describe(listing)}"
            logger.warning('MCP server "%s" %s', server.name, message)
            server.connect_problem = McpDiagnostic(level="problem", server=server.name, message=message)
            self._note_failure(server)
            return
        server.connect_problem = None
        self._note_success(server)
        self._sync(server, listing.tools, cut_short=listing.cut_short, refused=listing.refused)

    def _sync(
        self,
        server: _Server,
        listing: Sequence[mcp_types.Tool],
        *,
        cut_short: bool = False,
        refused: Sequence[tuple[str, str]] = (),
    ) -> None:
        """Make the registrations match ``listing``: dispose what went or changed, register what is new.

        Each registration and disposal fires ``dsh_tools_change``. A tool that
        was refused is retried at every sync. ``cut_short``: the server had more
        pages than were listed (a warning). A name listed more than once gets a
        warning, and its last definition is registered.
        """
        server.listing_notes = self._listing_notes(server, listing, cut_short=cut_short)
        for note in server.listing_notes:
            logger.warning("%s", note)
        wanted: dict[str, tuple[mcp_types.Tool, dict[str, Any]]] = {}
        for tool in listing:
            wanted[server.settings.tool_name(tool.name)] = (tool, tool.model_dump(mode="json", by_alias=True))
        for name in list(server.listed):
            dump, disposer = server.listed[name]
            if name not in wanted or wanted[name][1] != dump:
                disposer()
                del server.listed[name]
        server.notes = {name: notes for name, notes in server.notes.items() if name in server.listed}
        for name, (tool, dump) in wanted.items():
            if name in server.listed:
                continue
            definition, notes = self._definition(server, name, tool)
            if definition is not None:
                try:
                    disposer = self.runtime.register(definition)
                except Exception as exc:
                    if not self._in_setup:  # the plugin loader reports refusals during setup itself
                        notes.append(
                            McpDiagnostic(level="problem", server=server.name, tool=name, message=f"refused: {exc}")
                        )
                    # Only this plugin knows which of its servers holds the name (the loader sees "mcp").
                    holder = next((other.name for other in self._servers if name in other.listed), None)
                    if holder is not None:
                        notes.append(
                            McpDiagnostic(
                                level="warning",
                                server=server.name,
                                tool=name,
                                message=f'server "{holder}" lists this name too and registered it first; give '
                                "one of the two [[plugins.mcp.servers]] entries a prefix to load both",
                                logged=False,
                            )
                        )
                    logger.warning('MCP server "%s": tool "%s" refused: %s', server.name, name, exc)
                else:
                    server.listed[name] = (dump, disposer)
            if notes:
                server.notes[name] = notes
            for note in notes:
                if note.logged:
                    logger.warning("%s", note)
        for mcp_name, why in refused:
            # The SDK would have refused the whole listing for it: this tool alone is left out.
            note = McpDiagnostic(
                level="problem",
                server=server.name,
                tool=server.settings.tool_name(mcp_name) if mcp_name else None,
                message=f"not registered: the server's definition of it is invalid ({why})",
            )
            server.notes.setdefault(note.tool or "", []).append(note)
            logger.warning("%s", note)

    def _listing_notes(
        self, server: _Server, listing: Sequence[mcp_types.Tool], *, cut_short: bool
    ) -> list[McpDiagnostic]:
        """Warnings about a listing as a whole: cut at the page cap, a name listed more than once."""
        notes: list[McpDiagnostic] = []

        def warn(tool: str | None, message: str) -> None:
            notes.append(McpDiagnostic(level="warning", server=server.name, tool=tool, message=message))

        if cut_short:
            warn(
                None,
                f"its tool list goes on for more than {_LIST_PAGE_CAP} pages; only the {len(listing)} "
                f"tools on the first {_LIST_PAGE_CAP} pages are registered",
            )
        counts: dict[str, int] = {}
        for tool in listing:
            counts[tool.name] = counts.get(tool.name, 0) + 1
        spelled: dict[str, list[str]] = {}  # registered name -> the server's names that became it
        for mcp_name in counts:
            spelled.setdefault(server.settings.tool_name(mcp_name), []).append(mcp_name)
        for registered, mcp_names in spelled.items():
            if len(mcp_names) > 1:
                warn(
                    registered,
                    f"the server's tools {', '.join(map(repr, mcp_names))} all become this name "
                    "(model providers take letters, digits, _ and - only); the last listed is registered",
                )
            elif registered != server.settings.prefixed(mcp_names[0]):
                warn(
                    registered,
                    f"registered under this name for the server's tool {mcp_names[0]!r}, which model "
                    "providers refuse (letters, digits, _ and - only, at most 64)",
                )
        for mcp_name, count in counts.items():
            if count > 1:
                # Which definition the server itself applies cannot be known; the last one wins, as before.
                warn(
                    server.settings.tool_name(mcp_name),
                    f"the server lists this name {count} times; the last definition listed is registered",
                )
        return notes

    def _definition(
        self, server: _Server, name: str, tool: mcp_types.Tool
    ) -> tuple[ToolDefinition | None, list[McpDiagnostic]]:
        notes: list[McpDiagnostic] = []

        def note(level: Literal["warning", "problem"], message: str) -> None:
            notes.append(McpDiagnostic(level=level, server=server.name, tool=name, message=message))

        try:
            parameters = downgrade_schema(tool.input_schema, root="parameters", object_root=True)
        except JsonSchemaError as exc:
            note("problem", "not registered: its input schema " + _schema_problems(exc))
            return None, notes
        if parameters.stripped or parameters.dropped:
            note("warning", "input schema downgraded: " + _downgrade_note(parameters, "the MCP server checks them"))

        structured = tool.output_schema is not None
        if tool.output_schema is not None:
            try:
                result = downgrade_schema(tool.output_schema, root="output")
                output = ToolOutput(schema=result.schema)
                if result.stripped or result.dropped:
                    note("warning", "output schema downgraded: " + _downgrade_note(result, "the MCP SDK checks them"))
            except JsonSchemaError as exc:
                output = ToolOutput(schema={"description": "structured content (validated by the MCP SDK)"})
                note(
                    "warning",
                    "output schema not enforced by dsh-tools (" + _schema_problems(exc) + "); "
                    "the MCP SDK still validates structured content against it",
                )
        else:
            output = ToolOutput(schema=ENVELOPE_SCHEMA, render=render_envelope)

        effects = _effects_of(tool.annotations)
        retry = None
        if server.settings.retry_attempts > 1:
            if effects is not None and (effects.read_only or effects.idempotent):
                retry = RetryPolicy(
                    max_attempts=server.settings.retry_attempts,
                    initial_delay_s=self.settings.backoff_initial_s,
                    max_delay_s=self.settings.backoff_max_s,
                    retry_on=McpClientError,
                    retry_if=_server_gone,
                )
            else:
                notes.append(
                    McpDiagnostic(
                        level="warning",
                        server=server.name,
                        tool=name,
                        message=f"not retried (retry_attempts = {server.settings.retry_attempts}): the server "
                        "does not annotate it read-only or idempotent, so a second attempt could repeat its effect",
                        logged=False,
                    )
                )
        try:
            definition = ToolDefinition(
                name=name,
                description=tool.description or tool.title or "",
                parameters=parameters.schema,
                output=output,
                execute=self._body(server, tool.name, structured),
                timeout_ms=server.timeout_ms,
                is_concurrency_safe=_always if effects is not None and effects.read_only else None,
                effects=effects,
                retry=retry,
            )
        except Exception as exc:
            # The server's listing is not ours to trust (an empty name, say): this one tool is refused,
            # its server's other tools still register, and a reconnect does not fail on it again.
            note("problem", f"not registered: {exc}")
            return None, notes
        return definition, notes

    def dispose(self) -> None:
        """Unregister every tool this plugin registered."""
        for server in self._servers:
            for _, disposer in server.listed.values():
                disposer()
            server.listed.clear()

    def unlisted_servers(self) -> list[tuple[str, str | None]]:
        """``(name, prefix)`` of each server whose tools could not be listed: what it would register is unknown."""
        return [(server.name, server.settings.prefix) for server in self._servers if server.connect_problem is not None]

    def diagnostics(self) -> list[McpDiagnostic]:
        """Every warning and problem found so far (``dsh-tools check`` lists them)."""
        out: list[McpDiagnostic] = []
        for server in self._servers:
            if server.connect_problem is not None:
                out.append(server.connect_problem)
            out.extend(server.listing_notes)
            for notes in server.notes.values():
                out.extend(notes)
        return out

    # -- sessions -------------------------------------------------------------------------------

    @asynccontextmanager
    async def _client(self, server: _Server, session: _Session) -> AsyncIterator[Client]:
        from mcp import Client
        from mcp_types import Implementation

        from dsh_core import __version__

        async def on_message(message: object) -> None:
            import mcp_types

            # Transport exceptions (unparseable messages) arrive here too; the
            # transport's read watch has already dealt with them.
            if isinstance(message, mcp_types.ToolListChangedNotification):
                session.changed()

        client = Client(
            server.transport(session),
            mode="legacy",
            cache=None,
            message_handler=on_message,
            client_info=Implementation(name="dsh-tools", version=__version__),
        )
        entered = False
        try:
            async with client:
                entered = True
                yield client
        except Exception as exc:
            # The SDK turns a 401 into a generic error answer: say what it was.
            if not entered and session.auth_refused:
                raise McpAuthenticationError(_refused_message(server.settings)) from exc
            raise

    @asynccontextmanager
    async def running(self) -> AsyncIterator[McpClientPlugin]:
        """Own the servers' sessions until the block exits (see the module docstring).

        At entry every server is connected (concurrently; one that fails is
        reported in :meth:`diagnostics` and retried on its next call) and its
        registrations re-synced with what it lists now. A server whose last
        attempt failed (its listing at setup, say) is not tried at entry, which
        would hold up the host once more (``serve-mcp`` answers nothing until
        entry is done): its next call reconnects, after the backoff. Not reentrant.
        """
        if self._nursery is not None:
            raise RuntimeError("McpClientPlugin.running() is already active")
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for server in self._servers:
                server.lock = trio.Lock()
            try:
                async with trio.open_nursery() as starting:
                    for server in self._servers:
                        starting.start_soon(self._connect_at_entry, server)
                yield self
            finally:
                self._nursery = None
                nursery.cancel_scope.cancel()

    def dsh_lifespan(self) -> Any:
        """The host lifespan protocol (``serve-mcp`` enters it): same as :meth:`running`."""
        return self.running()

    async def _connect_at_entry(self, server: _Server) -> None:
        if server.failures:
            return  # known down (connect_problem says why): left to its next call
        try:
            await self._ensure_session(server)
        except McpClientError as exc:
            server.connect_problem = McpDiagnostic(level="problem", server=server.name, message=exc.message)

    async def _ensure_session(self, server: _Server) -> _Session:
        """The live session of ``server`` (its client set), connecting first (in the caller's task) if needed."""
        nursery = self._nursery
        assert nursery is not None
        async with server.lock:
            current = server.session
            if current is not None and current.live:
                return current
            await self._wait_backoff(server)
            session = server.new_session()
            try:
                with trio.fail_after(self.settings.connect_timeout_s):
                    await nursery.start(self._serve, server, session)
            except Exception as exc:
                self._note_failure(server)
                raise _unavailable(server.name, exc) from exc
            server.connect_problem = None
            return session

    async def _serve(
        self, server: _Server, session: _Session, *, task_status: trio.TaskStatus[Client] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """One session's task: list and register, hand the client over, then follow notifications."""
        started = False
        try:
            async with self._client(server, session) as client:
                listing = await _list_tools(session, client)
                session.client = client
                server.session = session
                self._sync(server, listing.tools, cut_short=listing.cut_short, refused=listing.refused)
                started = True
                task_status.started(client)
                await self._follow_changes(server, session, client, listing)
        except BaseException as exc:
            if not started:
                raise
            # After start-up this task has no caller to fail; the next call reconnects. A
            # transport failure can arrive grouped with the Cancelled of the plugin's own
            # shutdown (a server that died while the client closed): only the Cancelled goes on.
            cancelled, failure = exc.split(trio.Cancelled) if isinstance(exc, BaseExceptionGroup) else (None, exc)
            if failure is not None and not isinstance(failure, Exception):
                raise
            if failure is not None:
                logger.warning('MCP server "%s": session ended: %s', server.name, _describe(failure))
            if cancelled is not None:
                raise cancelled from None
        finally:
            session.ended = True
            if session.protocol_failure:
                self._note_session_failure(server, session)  # restarted after the backoff, like a crash
            if server.session is session:
                server.session = None

    async def _follow_changes(self, server: _Server, session: _Session, client: Client, listing: _Listing) -> None:
        """Re-list the server after each ``tools/list_changed``, paced, until the session ends.

        One re-listing at a time, and the next no sooner than ``_RELIST_INTERVAL_S``
        after the last (doubling while the listings come back unchanged); changes
        announced meanwhile are coalesced into that next one, never dropped.
        """
        previous = _listing_dump(listing)
        interval = _RELIST_INTERVAL_S
        next_relist = -math.inf
        unchanged = 0
        while True:
            wait = next_relist - trio.current_time() if session.list_changed else math.inf
            if wait > 0:
                with trio.move_on_after(wait):
                    await session.wake.wait()  # the session's end, or a change to list when the time comes
                session.wake = trio.Event()
            if session.ended:
                return
            if not session.list_changed or trio.current_time() < next_relist:
                continue
            session.list_changed = False
            relisted = await self._relist(server, session, client)
            if relisted is not None:
                dump = _listing_dump(relisted)
                if dump == previous:
                    unchanged += 1
                    interval = min(interval * 2, _RELIST_MAX_INTERVAL_S)
                    if unchanged == _RELIST_UNCHANGED_WARNING:
                        logger.warning(
                            'MCP server "%s" keeps announcing changes to its tool list that leave it unchanged; '
                            "it is re-listed at most every %g s meanwhile",
                            server.name,
                            _RELIST_MAX_INTERVAL_S,
                        )
                else:
                    previous, interval, unchanged = dump, _RELIST_INTERVAL_S, 0
            next_relist = trio.current_time() + interval

    async def _relist(self, server: _Server, session: _Session, client: Client) -> _Listing | None:
        """Re-sync after ``tools/list_changed``; a listing the server refuses keeps the tools listed before.

        Returns what was listed (``None``: the server refused the listing).
        """
        try:
            listing = await _list_tools(session, client)
        except Exception as exc:
            if _connection_lost(exc, session):
                raise  # the session is gone: its task ends, the next call reconnects
            # The server answered (an error, a listing the SDK refuses, a message no request
            # matches): the connection is fine, and ending it would fail the calls in flight.
            logger.warning(
                'MCP server "%s": re-listing its tools failed, the tools listed before stay registered: %s',
                server.name,
                _describe(exc),
            )
            return None
        self._sync(server, listing.tools, cut_short=listing.cut_short, refused=listing.refused)
        return listing

    async def _wait_backoff(self, server: _Server) -> None:
        # The system clock, not trio's: a plugin outlives trio.run() calls, and
        # each run's clock has its own offset.
        delay = server.retry_at - time.monotonic()
        if delay > 0:
            await trio.sleep(delay)

    def _note_success(self, server: _Server) -> None:
        server.failures = 0
        server.retry_at = -math.inf

    def _note_failure(self, server: _Server) -> None:
        server.failures += 1
        delay = min(self.settings.backoff_initial_s * 2 ** (server.failures - 1), self.settings.backoff_max_s)
        server.retry_at = time.monotonic() + delay

    def _note_session_failure(self, server: _Server, session: _Session) -> None:
        """Count the end of ``session`` as one failure, however many calls in flight it took down with it.

        Counted per call, eight calls in flight made the next attempt wait 30 s, not 0.5.
        """
        if not session.failure_noted:
            session.failure_noted = True
            self._note_failure(server)

    # -- calls ------------------------------------------------------------------------------------

    def _body(self, server: _Server, mcp_name: str, structured: bool) -> Body:
        async def execute(args: Any, run: ToolRunContext) -> object:
            arguments = thaw(args)
            assert isinstance(arguments, dict)
            problem = _unsendable(arguments)
            if problem is not None:
                raise ToolArgsError([f'{problem}; the call was not sent to MCP server "{server.name}"'])
            result = await self._call(server, mcp_name, arguments)
            if result.is_error:
                raise McpToolError(_result_text(result))
            if structured:
                return result.structured_content  # snapshotted and validated by the pipeline
            return {"content": [_content_item(block) for block in result.content]}

        execute.__qualname__ = f"mcp:{server.name}:{mcp_name}"
        return execute

    async def _call(self, server: _Server, mcp_name: str, arguments: dict[str, Any]) -> mcp_types.CallToolResult:
        if self._nursery is None:
            return await self._call_once(server, mcp_name, arguments)
        session = await self._ensure_session(server)
        assert session.client is not None
        try:
            return await self._send(server, session, session.client, mcp_name, arguments)
        except _SessionGone:
            # The server no longer knows the session (it restarted) and so never processed
            # the request: sending it once more, over a new session, cannot repeat its effect.
            logger.info(
                'MCP server "%s" no longer knows its session; the call to "%s" is sent again', server.name, mcp_name
            )
        session = await self._ensure_session(server)
        assert session.client is not None
        try:
            return await self._send(server, session, session.client, mcp_name, arguments)
        except _SessionGone as exc:
            raise _died(server, mcp_name) from exc

    async def _call_once(self, server: _Server, mcp_name: str, arguments: dict[str, Any]) -> mcp_types.CallToolResult:
        """A call over a session opened and closed in the caller's task (no ``running()`` block)."""
        await self._wait_backoff(server)
        session = server.new_session()
        entered = False
        outcome: mcp_types.CallToolResult | None = None
        error: Exception | None = None
        try:
            with trio.fail_after(self.settings.connect_timeout_s) as connecting:
                async with self._client(server, session) as client:
                    entered = True
                    connecting.deadline = math.inf  # the budget covers start-up, not the call
                    try:
                        outcome = await self._send(server, session, client, mcp_name, arguments)
                    except _SessionGone as exc:
                        error = _died(server, mcp_name)  # a new session is the next call's
                        error.__cause__ = exc
                    except Exception as exc:
                        # Raised through the client's task groups it would come out wrapped.
                        error = exc
        except Exception as exc:
            if not entered:
                self._note_failure(server)
                raise _unavailable(server.name, exc) from exc
            if error is None and outcome is None:
                raise
            logger.warning('MCP server "%s": closing the session failed: %s', server.name, _describe(exc))
        if error is not None:
            raise error
        assert outcome is not None
        return outcome

    async def _send(
        self, server: _Server, session: _Session, client: Client, mcp_name: str, arguments: dict[str, Any]
    ) -> mcp_types.CallToolResult:
        from mcp import MCPError

        try:
            result = await session.request(partial(client.call_tool, mcp_name, arguments), f'the call to "{mcp_name}"')
        except (McpClientError, _SessionGone):
            raise  # the session matched no request to what the server sent; or the caller sends again
        except Exception as exc:
            if session.auth_refused:  # the server no longer takes the token (restarted with another)
                self._note_session_failure(server, session)
                session.end()
                raise McpAuthenticationError(
                    f'MCP server "{server.name}" refused the call to "{mcp_name}": '
                    + _refused_message(server.settings)
                ) from exc
            if _connection_lost(exc, session):
                self._note_session_failure(server, session)
                session.end()
                raise _died(server, mcp_name) from exc
            if isinstance(exc, _StandIn):  # oversized: this response alone is dropped, the session goes on
                raise McpClientError(
                    f'MCP server "{server.name}" sent a result for "{mcp_name}" larger than the client\'s limit '
                    f"of {server.settings.max_event_bytes} bytes (max_event_bytes in its [[plugins.mcp.servers]] entry)",
                    code=MCP_ERROR,
                ) from exc
            if isinstance(exc, MCPError):
                raise McpClientError(
                    f'MCP server "{server.name}" answered the call to "{mcp_name}" with error {exc.code}: '
                    + _bounded(str(exc)),
                    code=MCP_ERROR,
                ) from exc
            # The SDK refused the result: a protocol error, not the tool's own failure.
            raise McpClientError(
                f'MCP server "{server.name}" sent an invalid result for "{mcp_name}": {_invalid_result(exc)}',
                code=MCP_ERROR,
            ) from exc
        self._note_success(server)
        return result


def _died(server: _Server, mcp_name: str) -> McpClientError:
    return McpClientError(
        f'MCP server "{server.name}" died during the call to "{mcp_name}"; it is restarted on the next call',
        code=MCP_SERVER_DIED,
    )


@attrs.frozen
class _Listing:
    """What a server listed; ``cut_short`` when it had pages beyond :data:`_LIST_PAGE_CAP`."""

    tools: list[mcp_types.Tool]
    cut_short: bool = False
    # (name, why) of each listed tool the SDK would refuse, left out of ``tools`` (see _drop_invalid_tools).
    refused: tuple[tuple[str, str], ...] = ()


def _listing_dump(listing: _Listing) -> object:
    """What a listing says, comparable with another's."""
    tools = [tool.model_dump(mode="json", by_alias=True) for tool in listing.tools]
    return (tools, listing.cut_short, listing.refused)


async def _list_tools(session: _Session, client: Client) -> _Listing:
    tools: list[mcp_types.Tool] = []
    cursor: str | None = None
    session.refused_tools = []
    cut_short = True
    for _ in range(_LIST_PAGE_CAP):
        page = await session.request(partial(client.list_tools, cursor=cursor), "tools/list")
        tools.extend(page.tools)
        cursor = page.next_cursor
        if cursor is None:
            cut_short = False
            break
    # A server whose cursors never end would be listed forever: stop, and say so (cut_short).
    return _Listing(tools, cut_short=cut_short, refused=tuple(session.refused_tools))


def _structure(config: Mapping[str, Any], *, from_file: bool = False) -> McpClientSettings:
    if not from_file:
        return structure_table(McpClientSettings, dict(config), "[plugins.mcp]")
    settings = structure_table(_McpFileSettings, dict(config), "[plugins.mcp]")
    return McpClientSettings(**{field.name: getattr(settings, field.name) for field in attrs.fields(McpClientSettings)})


@hookimpl
def dsh_setup(runtime: ToolRuntime, config: dict[str, Any]) -> None:
    """Register an :class:`McpClientPlugin` (named ``mcp-client``) and the tools its servers list now.

    Does nothing when no server is configured; raises ``ConfigError`` when
    servers are configured but the ``mcp`` extra is missing.
    """
    settings = _structure(config, from_file=True)
    if not settings.servers:
        return  # nothing configured: works without the mcp extra too
    try:
        import mcp  # noqa: F401
    except ImportError:
        raise ConfigError(
            [
                "[plugins.mcp]: MCP servers are configured, but the mcp extra is not installed "
                "(pip install 'dsh-tools[mcp]')"
            ]
        ) from None
    plugin = McpClientPlugin(runtime, settings)
    runtime.plugins.register(plugin, name=PLUGIN_NAME)
    plugin._in_setup = True
    try:
        plugin.discover()
    finally:
        plugin._in_setup = False
