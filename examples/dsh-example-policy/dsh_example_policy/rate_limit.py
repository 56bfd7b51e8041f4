"""``rate-limit``: at most ``max_calls`` calls per tool in any ``window_s`` seconds.

Configure it in ``[plugins.rate-limit]``::

    [plugins.rate-limit]
    max_calls = 30        # per tool name (default 30)
    window_s = 60         # sliding window, in seconds of trio's clock (default 60)
    tools = ["*"]         # fnmatch globs of the tools it limits (default: all)

A call counts when this listener lets it through, before inner listeners and
guards decide; a call this listener denies does not count, and a call it sees
again (a policy rewrote its arguments, so the pre-execute stage runs once more)
counts once. The window slides:
a slot frees ``window_s`` seconds after the call that took it. Time is
``trio.current_time()``, so tests drive it with ``trio.testing.MockClock``.
"""

from __future__ import annotations

import collections
import fnmatch
import math
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio

from dsh_core import Deny, PreToolDecision, ToolExecution, ToolExecutionToken, ToolRuntime, hookimpl, structure_table

__all__ = ["RateLimitSettings", "RateLimiter", "dsh_setup"]

# Capability manifest: the limiter may deny a call of any tool.
DSH_CAPABILITIES: dict[str, list[str]] = {"tools": [], "affects": ["*"]}


def _positive(instance: object, attribute: attrs.Attribute[Any], value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{attribute.name} must be a positive number, got {value!r}")


@attrs.frozen(kw_only=True)
class RateLimitSettings:
    """The ``[plugins.rate-limit]`` table."""

    max_calls: int = attrs.field(default=30, validator=_positive)
    window_s: float = attrs.field(default=60.0, validator=_positive)
    tools: tuple[str, ...] = ("*",)


class RateLimiter:
    """The per-runtime limiter: one sliding window of call times per tool name."""

    def __init__(self, settings: RateLimitSettings | None = None) -> None:
        self.settings = settings or RateLimitSettings()
        self._calls: dict[str, collections.deque[float]] = {}
        # The calls already let through: a rewritten call comes back with the same token.
        self._admitted: weakref.WeakSet[ToolExecutionToken] = weakref.WeakSet()

    def _limited(self, name: str) -> bool:
        return any(fnmatch.fnmatchcase(name, glob) for glob in self.settings.tools)

    @hookimpl
    async def dsh_pre_execute(
        self, execution: ToolExecution, next: Callable[[], Awaitable[PreToolDecision]]
    ) -> PreToolDecision:
        name = execution.name
        if not self._limited(name) or execution.token in self._admitted:
            return await next()
        settings = self.settings
        now = trio.current_time()
        calls = self._calls.setdefault(name, collections.deque())
        while calls and calls[0] <= now - settings.window_s:
            calls.popleft()
        if len(calls) >= settings.max_calls:
            wait = calls[0] + settings.window_s - now
            return Deny(
                f'rate limit: tool "{name}" may run at most {settings.max_calls} times per '
                f"{settings.window_s:g} s; try again in {wait:.1f} s"
            )
        calls.append(now)
        self._admitted.add(execution.token)
        return await next()


@hookimpl
def dsh_setup(runtime: ToolRuntime, config: dict[str, Any]) -> None:
    """Register a fresh :class:`RateLimiter` for ``runtime`` (named ``rate-limiter``)."""
    settings = structure_table(RateLimitSettings, config, "[plugins.rate-limit]")
    runtime.plugins.register(RateLimiter(settings), name="rate-limiter")
