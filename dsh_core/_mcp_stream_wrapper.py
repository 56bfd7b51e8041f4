"""What every stream wrapper around the MCP SDK's memory streams shares.

The SDK's sessions take any object with the stream protocol; the wrappers that
check or repair messages on the way through differ only in ``send`` or
``receive``. Closing, and use as an async context manager, go to the wrapped
stream the same way for all of them.
"""

from __future__ import annotations

from types import TracebackType
from typing import Generic, Protocol, Self, TypeVar

__all__ = ["StreamWrapper"]


class _Closable(Protocol):
    async def aclose(self) -> None: ...


InnerT = TypeVar("InnerT", bound=_Closable)


class StreamWrapper(Generic[InnerT]):
    """Closes the stream it wraps; a subclass adds ``send`` or ``receive``."""

    def __init__(self, inner: InnerT) -> None:
        self._inner = inner

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc_val: BaseException | None, exc_tb: TracebackType | None
    ) -> bool | None:
        await self.aclose()
        return None
