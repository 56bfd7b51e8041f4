"""The tool calls a session log records, each with its result and Code Mode dispatches.

Replay, ``explain`` and the policy simulator all read a log the same way: a
``tool/result`` (and a ``tool/code-dispatch``) belongs to the latest
``tool/call`` with its call id, since one file may hold several sessions
appended to each other; so does a ``tool/unwound`` (the call was cut short
and has no result: ``unwound`` instead of ``result``). A result, unwound
or dispatch event that names its ``agent`` (``null`` included) belongs to the
latest call of that agent with its id (a dispatch's ``parentCallId``), since
call ids are per conversation and two agents sharing a runtime may both have a
``call_1``; one without the key (a log written before it was) is paired by
call id alone. The identifying fields, and the shape of a result
(``content``, ``isError``, ``error``), are checked here, once, so a
hand-edited or foreign log is reported by ``seq`` instead of failing
somewhere downstream.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any, Final

import attrs

from ._content import ContentBlock
from ._json import FrozenDict, JsonValue, safe_repr
from ._session_log import SessionEvent, SessionLogError, SessionLogRead, structure_content, structure_contexts

__all__ = ["LoggedCall", "logged_calls", "session_events", "unsettled_note"]


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
    content: tuple[ContentBlock, ...] = ()  # the result's content as blocks
    dispatches: tuple[Mapping[str, Any], ...] = ()
    # The ``tool/unwound`` data when the call was cut short with no result (``None``: it was
    # not, or the log predates that event: then a call without a result just has none).
    unwound: Mapping[str, Any] | None = None

    def unsettled_note(self) -> str:
        """Why the call has no result, for a reader to show: cut short, or none recorded."""
        return unsettled_note(self.unwound)


def unsettled_note(unwound: Mapping[str, Any] | None) -> str:
    """Why a call without a result has none, from its ``tool/unwound`` data (``None``: no such event)."""
    if unwound is None:
        return "no result recorded"
    started = "after its body started" if unwound.get("bodyStarted") is True else "before its body started"
    return f"cut short ({unwound.get('cause')}) {started}: no result"


def logged_calls(events: Iterable[SessionEvent]) -> list[LoggedCall]:
    """Every ``tool/call`` of ``events`` in log order, paired as described in the module documentation.

    Raises:
        SessionLogError: a ``tool/call`` or ``tool/result`` lacks a non-empty
            ``callId``, or a call's ``name`` is not a ``str`` or its ``agent``
            neither ``null`` nor a non-empty ``str``, or its ``contract`` neither
            absent, ``null`` nor a non-empty ``str``; or a result's (or unwound
            event's, or a dispatch's) ``agent`` neither absent, ``null`` nor a non-empty ``str``; or a result's ``content``
            is not a list of content blocks, its ``isError`` not a boolean or its
            ``error`` neither ``null`` (or absent) nor ``{name, code, message}``
            of strs; or an unwound event lacks a non-empty ``callId``, a str
            ``cause`` or a boolean ``bodyStarted``; or a ``tool/code-dispatch``
            lacks a non-empty ``rootCallId``, ``parentCallId`` or ``subCallId``,
            a str ``name``, a boolean ``isError`` or a list of content blocks
            as ``content``. The message names the ``seq``.
    """
    calls: list[LoggedCall] = []
    results: list[tuple[FrozenDict | None, tuple[ContentBlock, ...]]] = []
    dispatches: list[list[FrozenDict]] = []
    unwound: dict[int, FrozenDict] = {}
    latest: dict[str, int] = {}  # call id -> index into the lists above
    latest_of_agent: dict[tuple[str | None, str], int] = {}  # (agent, call id) -> index

    def owning_call(event: SessionEvent, call_id: str) -> int | None:
        if "agent" not in event.data:
            return latest.get(call_id)
        return latest_of_agent.get((_optional_str(event, "agent"), call_id))

    for event in events:
        data = event.data
        if event.type == "tool/call":
            call = _call(event)
            latest[call.call_id] = latest_of_agent[(call.agent, call.call_id)] = len(calls)
            calls.append(call)
            results.append((None, ()))
            dispatches.append([])
        elif event.type == "tool/result":
            call_id, content = _result(event)
            index = owning_call(event, call_id)
            if index is not None:
                results[index] = (data, content)
        elif event.type == "tool/unwound":
            index = owning_call(event, _unwound(event))
            if index is not None:
                unwound[index] = data
        elif event.type == "tool/code-dispatch":
            index = owning_call(event, _dispatch(event))
            if index is not None:
                dispatches[index].append(data)
    return [
        attrs.evolve(call, result=result, content=content, dispatches=tuple(subs), unwound=unwound.get(index))
        for index, (call, (result, content), subs) in enumerate(zip(calls, results, dispatches, strict=True))
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


_ERROR_KEYS: Final = ("name", "code", "message")


def _result(event: SessionEvent) -> tuple[str, tuple[ContentBlock, ...]]:
    """The call id and content of a ``tool/result``, its shape checked against what ``append_result`` writes.

    ``meta``, ``trace`` and ``contexts`` are left to the readers that use them;
    an absent ``error`` reads as ``null``, as an absent ``meta`` does.
    """
    call_id = _call_id(event)
    blocks = _content(event)
    is_error = _required_bool(event, "isError")  # read with bool(), the string "false" was a failure
    error = event.data.get("error")
    if (error is not None) != is_error:
        # append_result writes an error exactly for a failure: explain printed "failed None: None".
        raise _malformed(event, "isError is true but error is null" if is_error else "isError is false but error is set")
    if error is not None:
        if not isinstance(error, Mapping):
            raise _malformed(event, f"error must be null or an object {{name, code, message}}, got {safe_repr(error)}")
        if set(error) != set(_ERROR_KEYS):
            keys = ", ".join(safe_repr(key) for key in error) or "none"
            raise _malformed(event, f"error must have exactly the keys name, code and message, got {keys}")
        for key in _ERROR_KEYS:
            if type(error[key]) is not str:
                raise _malformed(event, f"error.{key} must be a str, got {safe_repr(error[key])}")
    try:
        structure_contexts(event.data.get("contexts"))  # replay and simulate read them: refused here with the seq
    except SessionLogError as exc:
        raise _malformed(event, str(exc)) from None
    return call_id, blocks


def _unwound(event: SessionEvent) -> str:
    """The call id of a ``tool/unwound``, its ``cause`` and ``bodyStarted`` checked as ``append_unwound`` writes them."""
    call_id = _call_id(event)
    _required_str(event, "cause")
    _required_bool(event, "bodyStarted")  # read with bool(), the string "false" said the body ran
    return call_id


def _dispatch(event: SessionEvent) -> str:
    """The ``parentCallId`` of a ``tool/code-dispatch``, its identifying fields and outcome checked.

    A missing or non-str ``parentCallId`` read as ``str(...)`` attached the
    dispatch to a call named ``"None"`` or ``"7"``.
    """
    _required_str(event, "rootCallId", non_empty=True)
    parent = _required_str(event, "parentCallId", non_empty=True)
    _required_str(event, "subCallId", non_empty=True)
    _required_str(event, "name")
    _required_bool(event, "isError")
    _content(event)
    return parent


def _required_str(event: SessionEvent, key: str, *, non_empty: bool = False) -> str:
    value = _required(event, key)
    if type(value) is not str or (non_empty and not value):
        raise _malformed(event, f"{key} must be a {'non-empty ' if non_empty else ''}str, got {safe_repr(value)}")
    return value


def _required_bool(event: SessionEvent, key: str) -> bool:
    value = _required(event, key)
    if type(value) is not bool:
        raise _malformed(event, f"{key} must be true or false, got {safe_repr(value)}")
    return value


def _content(event: SessionEvent) -> tuple[ContentBlock, ...]:
    content = _required(event, "content")
    if not isinstance(content, (list, tuple)):
        raise _malformed(event, f"content must be a list of content blocks, got {safe_repr(content)}")
    try:
        return structure_content(content)
    except SessionLogError as exc:
        raise _malformed(event, str(exc)) from None


def _required(event: SessionEvent, key: str) -> Any:
    if key not in event.data:
        raise _malformed(event, f"{key} is missing")
    return event.data[key]


def _optional_str(event: SessionEvent, key: str) -> str | None:
    value = event.data.get(key)
    if value is not None and (type(value) is not str or not value):
        raise _malformed(event, f"{key} must be null or a non-empty str, got {safe_repr(value)}")
    return value


def _malformed(event: SessionEvent, problem: str) -> SessionLogError:
    return SessionLogError(f"seq {event.seq}: malformed {event.type} event: {problem}")
