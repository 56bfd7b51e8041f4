"""Bearer-token authentication for ``serve_http``: an ASGI gate in front of the whole MCP app.

Loopback binding and the SDK's Host/Origin checks keep other machines and web
pages out, but not the other processes and users of this machine; a shared
secret does. The gate wraps the app rather than one route, so every path the
app serves (the MCP endpoint, and anything the SDK adds beside it) is behind it.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, Final

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

# RFC 7235: the scheme is case-insensitive; one space separates it from the token.
_SCHEME: Final = b"bearer "
# Visible ASCII: what an HTTP header carries unchanged, with no space to split it at.
_TOKEN_CHARACTERS: Final = frozenset(range(0x21, 0x7F))
# RFC 6455's close code for a policy violation, the WebSocket counterpart of a 401.
_POLICY_VIOLATION: Final = 1008


def bearer_token_problem(token: str) -> str | None:
    """Why ``token`` cannot be a bearer token, or ``None`` when it can (never quotes the token)."""
    if not token:
        return "the bearer token is empty"
    if not all(ord(character) in _TOKEN_CHARACTERS for character in token):
        return "the bearer token must be visible ASCII characters only (no spaces, no control characters)"
    return None


class BearerTokenGate:
    """An ASGI app that passes a request on to ``app`` only when it carries ``Authorization: Bearer <token>``.

    Anything else is answered ``401`` with ``WWW-Authenticate: Bearer`` and a
    short JSON body, before ``app`` sees it (a WebSocket is closed with 1008).
    The token is compared in constant time, and exactly: a prefix of it is as
    wrong as any other string. Lifespan events always pass.
    """

    def __init__(self, app: App, token: str) -> None:
        problem = bearer_token_problem(token)
        if problem is not None:
            raise ValueError(problem)
        self._app = app
        self._token = token.encode("ascii")

    def __repr__(self) -> str:
        return f"BearerTokenGate({self._app!r})"  # never the token

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self._app(scope, receive, send)
            return
        given = _given_token(scope)
        if given is not None and hmac.compare_digest(given, self._token):
            await self._app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": _POLICY_VIOLATION})
            return
        await _refuse(send, token_given=given is not None)


def _given_token(scope: Scope) -> bytes | None:
    """The token of the request's one ``Authorization: Bearer`` header; ``None`` when there is not exactly one."""
    values = [value for name, value in scope.get("headers", ()) if name.lower() == b"authorization"]
    if len(values) != 1 or values[0][: len(_SCHEME)].lower() != _SCHEME:
        return None
    return bytes(values[0][len(_SCHEME) :])


async def _refuse(send: Send, *, token_given: bool) -> None:
    # RFC 6750: a request with no credentials gets no error code, a wrong token "invalid_token".
    challenge = b'Bearer error="invalid_token"' if token_given else b"Bearer"
    body = json.dumps(
        {"error": "invalid_token" if token_given else "unauthorized", "error_description": _DESCRIPTION}
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 401,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"www-authenticate", challenge),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


_DESCRIPTION: Final = "this MCP server needs the header 'Authorization: Bearer <token>' with its token"
