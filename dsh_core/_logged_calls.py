"""The tool calls a session log records, each with its result and Code Mode dispatches.

Replay, ``explain`` and the policy simulator all read a log the same way: a
``tool/result`` (and a ``tool/code-dispatch``) belongs to the latest
``tool/call`` with its call id, since one file may hold several sessions
appended to each other. The identifying fields are checked here, once, so a
hand-edited or foreign log is reported by ``seq`` instead of failing
somewhere downstream.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

import attrs

from ._json import FrozenDict, JsonValue, safe_repr
from ._session_log import SessionEvent, SessionLogError, SessionLogRead

__all__ = ["LoggedCall", "logged_calls", "session_events"]


def session_events(log: object, caller: str) -> tuple[SessionEvent, ...]:
    """The events of ``log`` (a :class:`SessionLogRead` or an iterable of events), for ``caller``'s errors.

    A path (a str is iterable too) or anything else is refused with what to pass,
    instead of failing on its first item.
    """
    if isinstance(log, SessionLogRead):
        return log.events
    what = f"{caller}() reads the events of a session log"
    if isinstance(log, (str, bytes, os.PathLike)) or not isinstance(log, Iterable):
        raise TypeError(f"{what}: pass read_session_log(path), got {type(log).__name__}")
    events = tuple(log)
    for index, event in enumerate(events):
        if not isinstance(event, SessionEvent):
            raise TypeError(f"{what}: log[{index}] is {type(event).__name__}, not a SessionEvent")
    return events


@attrs.frozen(kw_only=True, slots=True)
class LoggedCall:
    """One ``tool/call`` event, checked, with the ``tool/result`` data that settled it (``None``: never settled)."""

    seq: int
    call_id: str
    name: str
    arguments: JsonValue
    agent: str | None
    contract: str | None = None  # the tool's contract fingerprint when the call was recorded
    result: Mapping[str, Any] | None = None  # the event's FrozenDict
    dispatches: tuple[Mapping[str, Any], ...] = ()


def logged_calls(events: Iterable[SessionEvent]) -> list[LoggedCall]:
    """Every ``tool/call`` of ``events`` in log order, paired as described in the module documentation.

    Raises:
        SessionLogError: a ``tool/call`` or ``tool/result`` lacks a non-empty
            ``callId``, or a call's ``name`` is not a ``str`` or its ``agent``
            neither ``null`` nor a non-empty ``str``, or its ``contract`` neither
            absent, ``null`` nor a non-empty ``str``; the message names the ``seq``.
    """
    calls: list[LoggedCall] = []
    results: list[FrozenDict | None] = []
    dispatches: list[list[FrozenDict]] = []
    latest: dict[str, int] = {}  # call id -> index into the lists above
    for event in events:
        data = event.data
        if event.type == "tool/call":
            call = _call(event)
            latest[call.call_id] = len(calls)
            calls.append(call)
            results.append(None)
            dispatches.append([])
        elif event.type == "tool/result":
            index = latest.get(_call_id(event))
            if index is not None:
                results[index] = data
        elif event.type == "tool/code-dispatch":
            index = latest.get(str(data.get("parentCallId")))
            if index is not None:
                dispatches[index].append(data)
    return [
        attrs.evolve(call, result=result, dispatches=tuple(subs))
        for call, result, subs in zip(calls, results, dispatches, strict=True)
    ]


def _call_id(event: SessionEvent) -> str:
    call_id = event.data.get("callId")
    if type(call_id) is not str or not call_id:
        raise _malformed(event, f"callId must be a non-empty str, got {safe_repr(call_id)}")
    return call_id


def _call(event: SessionEvent) -> LoggedCall:
    data = event.data
    name = data.get("name")
    if type(name) is not str:
        raise _malformed(event, f"name must be a str, got {safe_repr(name)}")
    agent = _optional_str(event, "agent")  # checked before callId, as it always was
    return LoggedCall(
        seq=event.seq,
        call_id=_call_id(event),
        name=name,
        arguments=data.get("arguments"),
        agent=agent,
        contract=_optional_str(event, "contract"),
    )


def _optional_str(event: SessionEvent, key: str) -> str | None:
    value = event.data.get(key)
    if value is not None and (type(value) is not str or not value):
        raise _malformed(event, f"{key} must be null or a non-empty str, got {safe_repr(value)}")
    return value


def _malformed(event: SessionEvent, problem: str) -> SessionLogError:
    return SessionLogError(f"seq {event.seq}: malformed {event.type} event: {problem}")
