"""Delivering a side event to a runtime's ``event_sink`` without letting the sink break the caller."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, TypeAlias

from ._results import error_message

__all__ = ["PIPELINE_EVENT_TYPES", "EventSink", "send_event"]

EventSink: TypeAlias = Callable[[str, Mapping[str, Any]], None]

# The event types dsh_core itself writes (the session log's call records, calls
# cut short, Code Mode dispatches, retries, orphaned threads). Readers of a session log parse
# them by their fields, so a plugin may not send one (ToolRuntime.send_event).
PIPELINE_EVENT_TYPES = frozenset(
    {
        "tool/call",
        "tool/result",
        "tool/unwound",
        "tool/code-dispatch-start",
        "tool/code-dispatch",
        "tool/retry",
        "tool/orphaned",
        "tool/orphan-finished",
    }
)


def send_event(sink: EventSink | None, event_type: str, data: Mapping[str, Any], log: logging.Logger) -> None:
    """``sink(event_type, data)``; a raising sink is logged as a warning on ``log`` and the caller goes on.

    The events are records of what already happened (a dispatch, an orphaned
    thread): a broken recorder must not change the outcome being recorded.
    """
    if sink is None:
        return
    try:
        sink(event_type, data)
    except Exception as exc:
        log.warning("event sink failed for %s: %s", event_type, error_message(exc))
