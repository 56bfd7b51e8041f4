"""Tell every MCP client whose tool list went stale that it changed.

A served tool list can change for reasons no request of the client caused:
another session's call loads deferred tools, a re-exported MCP server changes
its own list, a plugin registers a tool. Each such change fires
``dsh_tools_change`` (synchronously, from whichever thread made it).
:class:`ListChangeNotifier` wakes on it, reads the list once, and sends
``notifications/tools/list_changed`` to every handshake-era connection whose
list is no longer the one it last knew (the one it was last answered, or last
told about), and one ``ToolsListChanged`` event to the ``subscriptions/listen``
streams of the 2026 protocol (whose connections last one request: there is
none to send on).

A connection is known from its first ``tools/list`` or ``tools/call`` (a client
that made neither holds no list to go stale) until it closes. The
notifications go out from tasks of the server's lifespan, the one the
connection runs in, so a client that stops reading holds up no one else.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager, suppress
from typing import TYPE_CHECKING, Any

import attrs
import trio

from .hookspecs import hookimpl

if TYPE_CHECKING:
    from mcp.server.connection import Connection
    from mcp.server.session import ServerSession
    from mcp.server.subscriptions import SubscriptionBus

    from ._definition import ToolSchema
    from ._runtime import ToolRuntime

__all__ = ["ListChangeNotifier"]

logger = logging.getLogger("dsh_core.mcp")


@attrs.define(eq=False)
class _Watched:
    """A connection that holds a tool list: where to tell it, and the list it knows."""

    session: ServerSession  # its latest request's: any of them sends on the connection's own channel
    known: tuple[str, ...]
    nursery: trio.Nursery | None  # the lifespan's it runs in, for the sends; None: send inline


@attrs.define(eq=False)
class _LifespanState:
    """What a handler finds in ``ctx.lifespan_context`` while the notifier's lifespan runs."""

    nursery: trio.Nursery


class ListChangeNotifier:
    """Sends ``tools/list_changed`` to the clients of one served registry whose list changed.

    ``schemas`` gives the visible tool schemas (the same tuple object until the
    registry changes, so an unchanged list costs one identity check) and
    ``served`` whether ``tools/list`` names one of them.
    """

    def __init__(
        self,
        schemas: Callable[[], Sequence[ToolSchema]],
        served: Callable[[ToolSchema], bool],
        bus: SubscriptionBus,
    ) -> None:
        self._schemas = schemas
        self._served = served
        self._bus = bus
        self._read_from: Sequence[ToolSchema] | None = None
        self._names: tuple[str, ...] = ()
        self._watched: dict[Connection, _Watched] = {}
        self._streams_know = self.names()
        self._listening: dict[trio.lowlevel.TrioToken, _Listening] = {}

    def names(self) -> tuple[str, ...]:
        """The names ``tools/list`` answers now."""
        schemas = self._schemas()
        if schemas is not self._read_from:
            self._read_from = schemas
            self._names = tuple(schema.name for schema in schemas if self._served(schema))
        return self._names

    def listed(self, ctx: Any, names: tuple[str, ...]) -> None:
        """``ctx``'s connection was just answered ``names`` to a ``tools/list``."""
        watched = self._watch(ctx, names)
        if watched is not None:
            watched.known = names

    def watch(self, ctx: Any) -> None:
        """Know ``ctx``'s connection (from a ``tools/call``), if it is not known yet, as knowing the list as it is."""
        try:
            names = self.names()
        except Exception:  # no list to know (publish reports why): the next one that can be read is news
            names = ()
        self._watch(ctx, names)

    async def publish(self, calling: Any = None) -> None:
        """Tell every client whose list changed; ``calling``'s connection before this returns.

        ``calling`` is the context of the request that may have changed the
        list: its client hears of the change before its answer. The others
        hear of it from tasks of their own lifespan.
        """
        try:
            names = self.names()
        except Exception as exc:  # a tools/list reports it to its client; this must not end a call or the server
            logger.warning("MCP: could not tell the clients their tool list changed: %s", exc)
            return
        if self._streams_know != names:
            self._streams_know = names
            from mcp.server.subscriptions import ToolsListChanged

            await self._bus.publish(ToolsListChanged())
        own = _connection_of(calling.session) if calling is not None else None
        inline: list[_Watched] = []
        for connection, watched in self._watched.items():
            if watched.known is names or watched.known == names:
                continue
            watched.known = names  # before any send: a second publish must not tell it again
            if connection is own or watched.nursery is None:
                inline.append(watched)
                continue
            with suppress(RuntimeError):  # its lifespan is closing: so is the connection
                watched.nursery.start_soon(_tell, watched.session)
        for watched in inline:
            await _tell(watched.session)

    def lifespan(self, runtime: ToolRuntime) -> Callable[[Any], Any]:
        """The ``lifespan`` of the ``mcp.server.Server``: publishes on every ``dsh_tools_change`` while it runs.

        The SDK enters it once per connection of an in-process client or stdio
        run, so several may run at once: they share one listener plugin
        (registered by the first, unregistered when the last ends, however it
        ends), and each change is published once, by whichever wakes first.
        """

        @asynccontextmanager
        async def lifespan(server: Any) -> AsyncIterator[_LifespanState]:
            listening = self._listen(runtime)
            try:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._publish_changes, listening)
                    try:
                        yield _LifespanState(nursery)
                    finally:
                        nursery.cancel_scope.cancel()
            finally:
                self._stop_listening(runtime, listening)

        return lifespan

    def _listen(self, runtime: ToolRuntime) -> _Listening:
        # One listener per trio run: it wakes the run it was made in.
        token = trio.lowlevel.current_trio_token()
        listening = self._listening.get(token)
        if listening is None:
            listening = _Listening(token)
            runtime.plugins.register(listening.listener, name=f"dsh-mcp-list-changed-{id(listening):x}")
            self._listening[token] = listening
        listening.lifespans += 1
        return listening

    def _stop_listening(self, runtime: ToolRuntime, listening: _Listening) -> None:
        listening.lifespans -= 1
        if listening.lifespans == 0:
            del self._listening[listening.listener.token]
            runtime.plugins.unregister(listening.listener)

    async def _publish_changes(self, listening: _Listening) -> None:
        while True:
            if listening.published == listening.changes:
                await listening.changed.wait()
                continue
            # Before publishing: a change from here on is published again, by this task or another.
            listening.published = listening.changes
            try:
                await self.publish()
            except BaseException:
                listening.wake()  # this lifespan is ending mid-publish: another running one finishes it
                raise

    def _watch(self, ctx: Any, known: tuple[str, ...]) -> _Watched | None:
        from mcp_types.version import MODERN_PROTOCOL_VERSIONS

        session: ServerSession = ctx.session
        if session.protocol_version in MODERN_PROTOCOL_VERSIONS:
            return None  # a connection of one request: its client listens on subscriptions/listen
        connection = _connection_of(session)
        watched = self._watched.get(connection)
        if watched is None:
            state = ctx.lifespan_context
            nursery = state.nursery if isinstance(state, _LifespanState) else None
            watched = self._watched[connection] = _Watched(session, known, nursery)
            connection.exit_stack.callback(self._watched.pop, connection, None)
        else:
            watched.session = session
        return watched


class _Listening:
    """The running lifespans of one trio run, and the changes their listener heard."""

    def __init__(self, token: trio.lowlevel.TrioToken) -> None:
        self.listener = _ChangeListener(token, self.wake)
        self.lifespans = 0
        self.changes = 0  # heard by the listener
        self.published = 0  # the changes a publish has started for
        self.changed = trio.Event()

    def wake(self) -> None:
        self.changes += 1
        changed, self.changed = self.changed, trio.Event()
        changed.set()


class _ChangeListener:
    """The plugin that hears ``dsh_tools_change`` for the running lifespans of one trio run, from any thread."""

    def __init__(self, token: trio.lowlevel.TrioToken, wake: Callable[[], None]) -> None:
        self.token = token
        self._wake = wake

    @hookimpl
    def dsh_tools_change(self) -> None:
        # Called synchronously by whatever changed the registry, maybe a worker thread:
        # the trio run wakes the publishing task in its own thread.
        with suppress(trio.RunFinishedError):  # the run ended: nothing is served anymore
            self.token.run_sync_soon(self._wake)


def _connection_of(session: ServerSession) -> Connection:
    # mcp 2.3 hands a low-level handler a ServerSession per request; the connection it
    # serves, the one thing that lasts from one request of a client to the next, is
    # reachable only through it (the SDK's own Context.connection is not given to them).
    connection: Connection = session._connection
    return connection


async def _tell(session: ServerSession) -> None:
    try:
        await session.send_tool_list_changed()
    except Exception as exc:  # one client's closed connection must not keep the others uninformed
        logger.debug("MCP: could not send tools/list_changed: %s", exc)
