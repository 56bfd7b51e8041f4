"""Answer the MCP messages the SDK cannot read, so that no client waits forever.

The SDK's stdio transport parses each line with pydantic-core. A line it
cannot parse (nested more than :data:`SDK_PARSER_MAX_DEPTH` levels, a lone
surrogate escape such as ``"\\ud800"``, not JSON at all) or that is JSON but
no JSON-RPC message reaches the server as an exception, which the server only
logs: a request sent that way is never answered. :func:`answering_unreadable`
wraps the transport's read stream so that such a line is answered with a
JSON-RPC error, ``-32700`` (parse error) or ``-32600`` (invalid request),
carrying the request's ``id`` when the line still shows one (``null`` for an
id holding a lone surrogate, which no answer could carry back). The line is
read again with the project's own decoder, which has neither limit.

A request whose ``id`` is neither a string nor an integer (``1.0``, ``true``,
``null``) is read by the SDK as a notification, and nothing would answer it:
it is answered ``-32600`` with a null id (a notification's method always
starts with ``notifications/``, a request's never does).

Not every unreadable line gets an answer, as JSON-RPC says: a notification
(a ``method`` without an ``id``) is only logged, and so is a blank line. A
response to one of the server's own requests (``result`` or ``error``: the
client's answer to an approval question, say) is not answered either, but the
server must not wait for it forever: the request it answers fails, as if the
client had answered it with the parse error (every request still unanswered
when the line shows no usable id, since it could answer any of them). For
that, the server writes through the stream :func:`answering_unreadable` gives
back, which notes the requests it sends.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar

import attrs

from ._json import nests_deeper_than
from ._jsoncodec import IntegerTooLongError, decode_json
from ._mcp_request_ids import unusable_id_message
from ._mcp_stream_wrapper import StreamWrapper
from ._well_formed import holds_lone_surrogate

if TYPE_CHECKING:
    import mcp_types
    from mcp.shared._stream_protocols import ReadStream, WriteStream
    from mcp.shared.message import SessionMessage
    from mcp_types import RequestId

__all__ = ["SDK_PARSER_MAX_DEPTH", "answering_unreadable"]

logger = logging.getLogger("dsh_core.mcp")

SDK_PARSER_MAX_DEPTH: Final = 200
"""The deepest message pydantic-core's JSON parser reads (its fixed recursion limit).

The MCP SDK reads every message with it, on both ends of every transport.
"""

T = TypeVar("T")


def answering_unreadable(
    read_stream: ReadStream[SessionMessage | Exception], write_stream: WriteStream[SessionMessage]
) -> tuple[ReadStream[SessionMessage | Exception], WriteStream[SessionMessage]]:
    """``read_stream`` with every unreadable line answered on ``write_stream``, and the stream to write on.

    An unreadable request is answered and dropped; an unreadable response
    becomes an error response to the request it answers. The server must
    write through the returned write stream, which notes the requests it
    sends, so that a response showing no usable id fails them all.
    """
    unanswered: set[RequestId] = set()
    return _AnsweringReadStream(read_stream, write_stream, unanswered), _NotingWriteStream(write_stream, unanswered)


class _NotingWriteStream(StreamWrapper["WriteStream[SessionMessage]"]):
    """A write stream that notes the id of each request it sends, until its answer is read."""

    def __init__(self, inner: WriteStream[SessionMessage], unanswered: set[RequestId]) -> None:
        super().__init__(inner)
        self._unanswered = unanswered

    async def send(self, item: SessionMessage, /) -> None:
        import mcp_types

        if isinstance(item.message, mcp_types.JSONRPCRequest):
            self._unanswered.add(item.message.id)
        await self._inner.send(item)


class _AnsweringReadStream(StreamWrapper["ReadStream[T | Exception]"], Generic[T]):
    """A read stream that answers the exceptions of its inner one instead of passing them on."""

    def __init__(
        self, inner: ReadStream[T | Exception], write_stream: WriteStream[SessionMessage], unanswered: set[RequestId]
    ) -> None:
        super().__init__(inner)
        self._write_stream = write_stream
        self._unanswered = unanswered
        self._failed: list[SessionMessage] = []  # error responses standing in for an unreadable one

    @property
    def last_context(self) -> Any:
        # The SDK restores each message's sender context from this attribute when present.
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> T | SessionMessage | Exception:
        import mcp_types
        from mcp.shared.message import SessionMessage

        while True:
            if self._failed:
                return self._failed.pop(0)
            item = await self._inner.receive()
            if not isinstance(item, Exception):
                message = getattr(item, "message", None)
                if isinstance(message, (mcp_types.JSONRPCResponse, mcp_types.JSONRPCError)):
                    self._unanswered.discard(message.id)
                elif isinstance(message, mcp_types.JSONRPCNotification) and not message.method.startswith(
                    "notifications/"
                ):
                    await self._send(_unusable_id_error(message.method))
                    continue
                return item
            verdict = _answer(item)
            if verdict is None:
                continue
            if not verdict.answers_a_request:
                await self._send(verdict.error)
                continue
            if verdict.error.id is not None:
                self._unanswered.discard(verdict.error.id)
                return SessionMessage(verdict.error)
            # No id to tell which request it answers: it could answer any, so none may wait for it.
            for request_id in sorted(self._unanswered, key=str):
                self._failed.append(SessionMessage(verdict.error.model_copy(update={"id": request_id})))
            self._unanswered.clear()

    async def _send(self, answer: mcp_types.JSONRPCError) -> None:
        import anyio
        from mcp.shared.message import SessionMessage

        try:
            await self._write_stream.send(SessionMessage(answer))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            logger.debug("MCP: the connection closed before an unreadable request was answered")

    def __aiter__(self) -> _AnsweringReadStream[T]:
        return self

    async def __anext__(self) -> T | SessionMessage | Exception:
        import anyio

        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None


@attrs.frozen
class _Verdict:
    """What becomes of an unreadable line: an error answering it, or standing in for it."""

    error: mcp_types.JSONRPCError
    answers_a_request: bool  # the line was a response: the error goes to the server, as the client's answer


def _answer(exc: Exception) -> _Verdict | None:
    """What to do with the line behind ``exc``, or None when nothing may answer it."""
    import mcp_types
    from pydantic import ValidationError

    if not isinstance(exc, ValidationError):
        logger.warning("MCP: the transport failed to read a message: %s", exc)
        return None
    errors = exc.errors(include_url=False)
    first = errors[0] if errors else None
    if first is not None and first["type"] == "json_invalid" and isinstance(first["input"], str):
        line: str = first["input"]
        if not line.strip():
            return None
        try:
            document = decode_json(line)
        except IntegerTooLongError as too_long:
            why = f"the message holds {too_long}"
            # Valid JSON all the same: read once more with such numbers left out, for the id.
            try:
                document = _decode_keeping_long_integers_out(line)
            except (ValueError, RecursionError):
                return _Verdict(_error(None, mcp_types.PARSE_ERROR, f"Parse error: {why}"), False)
            return _answer_document(document, mcp_types.PARSE_ERROR, "Parse error", why)
        except ValueError:
            return _Verdict(_error(None, mcp_types.PARSE_ERROR, "Parse error: the message is not JSON"), False)
        return _answer_document(document, mcp_types.PARSE_ERROR, "Parse error", _why_unparsed(document, first))
    document = _validated_message(errors)
    if document is None:
        logger.warning("MCP: dropped a message that is not JSON-RPC and shows no id: %s", exc)
        return None
    return _answer_document(document, mcp_types.INVALID_REQUEST, "Invalid request", "not a JSON-RPC 2.0 message")


def _unusable_id_error(method: str) -> mcp_types.JSONRPCError:
    """The answer to a request whose ``id`` the SDK could not take, so that it read it as a notification.

    The SDK takes a string or an integer; any other id (``1.0``, ``true``, ``null``,
    an object) is dropped as an unknown field, and the request became a
    notification nobody answers. Every MCP notification's method starts with
    ``notifications/``, so one that does not is such a request. Its id is gone
    with the parse: the answer carries null.
    """
    import mcp_types

    logger.warning("MCP: answered a %r request whose id is not a string or an integer", method)
    return _error(None, mcp_types.INVALID_REQUEST, unusable_id_message(method))


# Stands in for an integer too long to convert: no id, so an answer carries null for it.
_LONG_INTEGER: Final = object()


def _int_or_stand_in(digits: str) -> object:
    try:
        return int(digits)
    except ValueError:
        return _LONG_INTEGER


def _decode_keeping_long_integers_out(line: str) -> object:
    """``line`` decoded with every integer too long to convert replaced by a stand-in (a message's id survives)."""
    import json

    return json.JSONDecoder(parse_int=_int_or_stand_in).decode(line)


def _answer_document(document: object, code: int, kind: str, why: str) -> _Verdict | None:
    message = f"{kind}: {why}"
    if not isinstance(document, Mapping):
        return _Verdict(_error(None, code, message), False)
    request_id = document.get("id")
    # An id holding a lone surrogate is no text either: no answer could carry it back unchanged.
    valid_id = (type(request_id) is int) or (isinstance(request_id, str) and not holds_lone_surrogate(request_id))
    if "method" not in document and ("result" in document or "error" in document):
        # A response to one of the server's own requests: answering it would answer nothing,
        # but the request it answers would wait for it forever.
        logger.warning("MCP: an unreadable response from the client fails the request it answers (%s)", message)
        return _Verdict(_error(request_id if valid_id else None, code, f"its answer could not be read: {why}"), True)
    if "method" in document and "id" not in document:
        logger.warning("MCP: dropped an unreadable notification (%s)", message)
        return None
    return _Verdict(_error(request_id if valid_id else None, code, message), False)


def _why_unparsed(document: object, error: Mapping[str, Any]) -> str:
    if nests_deeper_than(document, SDK_PARSER_MAX_DEPTH):
        return f"the message nests more than {SDK_PARSER_MAX_DEPTH} levels deep, deeper than this server reads"
    if holds_lone_surrogate(document):
        return "a string in the message holds a lone surrogate (\\ud800-\\udfff outside a pair), which is not text"
    return str(error["msg"])


def _validated_message(errors: list[Any]) -> object | None:
    """The message a JSON-RPC validation failed on, found in its errors, or None.

    pydantic reports a union's failure per branch; an error about a branch as a
    whole (``loc`` is the branch) or about a field missing from it (``loc`` is
    branch and field) carries the whole message as its input.
    """
    for error in errors:
        location = error["loc"]
        if len(location) == 1 or (len(location) == 2 and error["type"] == "missing"):
            document: object = error["input"]
            return document
    return None


def _error(request_id: str | int | None, code: int, message: str) -> mcp_types.JSONRPCError:
    import mcp_types

    return mcp_types.JSONRPCError(jsonrpc="2.0", id=request_id, error=mcp_types.ErrorData(code=code, message=message))
