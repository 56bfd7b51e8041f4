"""Send every MCP message as text UTF-8 can carry, lone surrogates replaced by U+FFFD.

A string a served tool hands back may hold a lone surrogate (see
``_well_formed``): a file read with ``surrogateescape`` gives one, and so does
a JSON ``"\\ud800"``. It may sit in a result's text, its structured content
(an object key too), a tool's description or schema. The SDK serialises
messages as UTF-8 and fails on it: over stdio its writer task raises, which
ends the server (every call in flight lost, exit status 1); over streamable
HTTP that response is lost, or sent in a form no client parses; a lone
surrogate in an object key fails the answer before any transport sees it.

Such a message goes out with every string made well-formed instead, a split
surrogate pair joined. The check is one serialisation by pydantic-core; a
message that passes (nearly every one) is sent as it is.

- :func:`answering_well_formed` wraps a request handler of the server: its
  answers are well-formed whatever the transport.
- :func:`sending_well_formed` wraps the write stream a server runs on (stdio),
  so that nothing the server writes there can end it: the SDK's own answers
  and errors, the server's requests, the answers to unreadable requests.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from ._mcp_stream_wrapper import StreamWrapper
from ._well_formed import well_formed_json

if TYPE_CHECKING:
    from mcp.shared._stream_protocols import WriteStream
    from mcp.shared.message import SessionMessage
    from pydantic import BaseModel

__all__ = ["answering_well_formed", "sending_well_formed"]

logger = logging.getLogger("dsh_core.mcp")

ModelT = TypeVar("ModelT", bound="BaseModel")
ContextT = TypeVar("ContextT")
ParamsT = TypeVar("ParamsT")


def sending_well_formed(write_stream: WriteStream[SessionMessage]) -> WriteStream[SessionMessage]:
    """``write_stream`` sending each message with a lone surrogate made well-formed first."""
    return _WellFormedWriteStream(write_stream)


class _WellFormedWriteStream(StreamWrapper["WriteStream[SessionMessage]"]):
    """A write stream that rebuilds, before sending it, a message UTF-8 cannot carry."""

    async def send(self, item: SessionMessage, /) -> None:
        if not _serialises(item.message):
            logger.warning("MCP: a message held a lone surrogate; it is sent with U+FFFD in its place")
            item = dataclasses.replace(item, message=_well_formed_model(item.message))
        await self._inner.send(item)


def answering_well_formed(
    handler: Callable[[ContextT, ParamsT], Awaitable[ModelT]],
) -> Callable[[ContextT, ParamsT], Awaitable[ModelT]]:
    """A server's request ``handler`` whose answer is made well-formed when it needs to be.

    The SDK turns an answer into JSON data itself, before any transport sees it
    (and whatever transport serves it); a lone surrogate in an object key fails
    already there, so the answer must be well-formed as the handler gives it.
    """

    @functools.wraps(handler)
    async def answer(ctx: ContextT, params: ParamsT) -> ModelT:
        result = await handler(ctx, params)
        if _serialises(result):
            return result
        logger.warning("MCP: an answer held a lone surrogate; it is sent with U+FFFD in its place")
        return _well_formed_model(result)

    return answer


def _serialises(model: BaseModel) -> bool:
    """Whether ``model`` serialises as it is, as the SDK's transports serialise it."""
    from pydantic_core import PydanticSerializationError

    try:
        # pydantic-core writes UTF-8 only: a lone surrogate is an error, never in its output.
        model.model_dump_json(by_alias=True, exclude_unset=True)
    except PydanticSerializationError:
        return False
    return True


def _well_formed_model(model: ModelT) -> ModelT:
    # The fields the model set, and only those, come back set: it serialises as before.
    plain = model.model_dump(by_alias=True, exclude_unset=True)
    return type(model).model_validate(well_formed_json(plain))
