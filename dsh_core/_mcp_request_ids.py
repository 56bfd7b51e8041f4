"""Answer an HTTP request whose JSON-RPC ``id`` the SDK cannot take, instead of losing it.

The SDK takes a string or an integer as a request id. With any other (``1.0``,
``1e3``, ``true``, ``null``, an object) it drops the id as an unknown field and
reads the request as a notification: over streamable HTTP it answers ``202
Accepted``, and nothing runs or answers. Every MCP notification's method starts
with ``notifications/``, so a POSTed message with another method and no usable
id is such a request: :class:`AnsweringUnusableIds` answers it ``400`` with a
JSON-RPC ``-32600`` error (id ``null``: the id it had is no id to answer under),
as the stdio transport does (see ``_mcp_unreadable``).

Only a body of at most :data:`CHECKED_BODY_BYTES` is looked at (the SDK reads
the whole body anyway); a longer one, or one that is not JSON, goes to the SDK
as it came, and the SDK answers it.
"""

from __future__ import annotations

import json
from typing import Final

from ._jsoncodec import decode_json
from ._mcp_bearer import App, Message, Receive, Scope, Send

__all__ = ["CHECKED_BODY_BYTES", "AnsweringUnusableIds", "unusable_id_message"]

CHECKED_BODY_BYTES: Final = 1024 * 1024
"""The longest request body whose id is checked before the SDK reads it."""

_INVALID_REQUEST: Final = -32600


def unusable_id_message(method: str) -> str:
    """The error message for a ``method`` request whose id is neither a string nor an integer."""
    return (
        f"Invalid request: the {method!r} request has no id this server can answer under "
        "(a request id must be a string or an integer)"
    )


def unusable_id_method(body: bytes) -> str | None:
    """The method of a request ``body`` holds with no usable id, or ``None`` (anything else, the SDK's to answer)."""
    try:
        document = decode_json(body.decode("utf-8"))
    except (ValueError, RecursionError):  # not UTF-8, not JSON, an integer too long...
        return None
    if not isinstance(document, dict):
        return None
    method = document.get("method")
    if not isinstance(method, str) or method.startswith("notifications/"):
        return None
    request_id = document.get("id")
    if type(request_id) is str or type(request_id) is int:  # a bool is no id
        return None
    return method


class AnsweringUnusableIds:
    """An ASGI app in front of ``app`` that answers a POSTed request with an unusable id itself (``400``)."""

    def __init__(self, app: App) -> None:
        self._app = app

    def __repr__(self) -> str:
        return f"AnsweringUnusableIds({self._app!r})"

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST":
            await self._app(scope, receive, send)
            return
        taken: list[Message] = []
        body = bytearray()
        whole = False
        while len(body) <= CHECKED_BODY_BYTES:
            message = await receive()
            taken.append(message)
            if message["type"] != "http.request":
                break  # the client went away: the SDK hears it from the messages handed on
            body += message.get("body", b"")
            if not message.get("more_body", False):
                whole = True
                break
        method = unusable_id_method(bytes(body)) if whole and len(body) <= CHECKED_BODY_BYTES else None
        if method is not None:
            await _answer(send, method)
            return
        await self._app(scope, _Replaying(taken, receive), send)


class _Replaying:
    """``receive`` for the app: the messages already taken, in order, then the client's own."""

    def __init__(self, taken: list[Message], receive: Receive) -> None:
        self._taken = taken
        self._receive = receive

    async def __call__(self) -> Message:
        if self._taken:
            return self._taken.pop(0)
        return await self._receive()


async def _answer(send: Send, method: str) -> None:
    error = {"jsonrpc": "2.0", "id": None, "error": {"code": _INVALID_REQUEST, "message": unusable_id_message(method)}}
    body = json.dumps(error).encode("utf-8")
    await send(
        {
            "type": "http.response.start",
            "status": 400,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode("ascii"))],
        }
    )
    await send({"type": "http.response.body", "body": body})
