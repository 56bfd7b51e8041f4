"""Standing approvals (dsh_plugins.grants): scoped, expiring, revocable and audited "always allow"."""

from __future__ import annotations

import errno
import fcntl
import gzip
import json
import logging
import os
import stat
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from dsh_core import (
    Agent,
    Ask,
    CancelSignal,
    Deny,
    NonJsonValueError,
    SessionLog,
    ToolExecution,
    ToolExecutionFailure,
    ToolExecutionResult,
    ToolExecutionToken,
    ToolRuntime,
    hookimpl,
    read_session_log,
)
from dsh_core._execution import new_execution
from dsh_core.testing import StaticApproval, json_tool, make_input, make_runtime
from dsh_plugins.approval import ApprovalStep, EscalatingApproval, TerminalApproval
from dsh_plugins.grants import ALLOWED_ALWAYS, GrantBook, GrantError, GrantingApproval, StandingGrant, read_grants

MAIN = Agent("main")
HELPER = Agent("helper")


class Clock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def execution(name: str = "shell", arguments: Any = None, agent: Any = MAIN, call_id: str = "c-1") -> ToolExecution:
    args = {"command": "ls"} if arguments is None else arguments
    return new_execution(call_id, call_id, name, args, CancelSignal(), ToolExecutionToken(), agent, None)


class AskEverything:
    @hookimpl
    async def dsh_pre_execute(self, execution: ToolExecution, next: Callable[[], Awaitable[Any]]) -> Any:
        return Ask("needs a human")


class DenyRm:
    @hookimpl
    async def dsh_pre_execute(self, execution: ToolExecution, next: Callable[[], Awaitable[Any]]) -> Any:
        if "rm" in str(execution.arguments.get("command", "")):
            return Deny("never rm")
        return await next()


class Scripted:
    """An approval service giving scripted answers; asking it more often than scripted fails the test."""

    def __init__(self, *answers: str) -> None:
        self.answers = list(answers)
        self.asked: list[str] = []

    async def request(self, execution: ToolExecution, reason: str | None) -> str:
        self.asked.append(execution.call_id)
        assert self.answers, f"asked again for {execution.call_id}"
        return self.answers.pop(0)


def runtime_with(service: Any, *plugins: Any) -> ToolRuntime:
    return make_runtime(json_tool("shell"), json_tool("deploy"), plugins=[AskEverything(), *plugins], approval=service)


def code(result: ToolExecutionResult) -> str | None:
    assert isinstance(result, ToolExecutionFailure), result
    return result.code


# --- what a grant covers ------------------------------------------------------------------


def test_a_grant_covers_its_tool_for_its_agent_only() -> None:
    book = GrantBook(clock=Clock())
    grant = book.grant("shell", agent="main", granted_by="ana")
    assert grant.covers(execution(), 1_000_000.0)
    assert not grant.covers(execution(name="deploy"), 1_000_000.0)
    assert not grant.covers(execution(agent=HELPER), 1_000_000.0)
    assert not grant.covers(execution(agent=None), 1_000_000.0)
    assert book.find(execution()) == grant
    assert book.find(execution(agent=HELPER)) is None


def test_a_grant_without_an_agent_covers_only_calls_without_one() -> None:
    book = GrantBook(clock=Clock())
    book.grant("shell", granted_by="ana")
    assert book.find(execution(agent=None)) is not None
    assert book.find(execution(agent=MAIN)) is None


def test_any_agent_covers_every_agent() -> None:
    book = GrantBook(clock=Clock())
    grant = book.grant("shell", any_agent=True, granted_by="ana")
    for agent in (MAIN, HELPER, None):
        assert book.find(execution(agent=agent)) == grant
    assert "every agent" in grant.describe()


def test_an_arguments_grant_covers_exactly_those_arguments() -> None:
    book = GrantBook(clock=Clock())
    book.grant("shell", agent="main", arguments={"command": "ls"}, granted_by="ana")
    assert book.find(execution(arguments={"command": "ls"})) is not None
    assert book.find(execution(arguments={"command": "ls -la"})) is None
    # One argument more is another call: a flag could change what it does.
    assert book.find(execution(arguments={"command": "ls", "sudo": True})) is None
    assert book.find(execution(arguments={})) is None


def test_a_grant_expires_after_its_ttl() -> None:
    clock = Clock()
    book = GrantBook(clock=clock)
    grant = book.grant("shell", agent="main", ttl_s=60, granted_by="ana")
    assert grant.expires_at == clock.now + 60
    clock.now += 59.9
    assert book.find(execution()) == grant
    clock.now += 0.1
    assert book.find(execution()) is None
    assert book.grants() == ()
    assert book.grants(include_inactive=True) == (grant,)
    assert "until 1970-01-12T13:47:40Z" in grant.describe()


def test_a_revoked_grant_allows_nothing_and_cannot_be_revoked_twice() -> None:
    book = GrantBook(clock=Clock())
    grant = book.grant("shell", agent="main", granted_by="ana")
    revoked = book.revoke(grant.id, by="security")
    assert (revoked.revoked_by, revoked.revoked_at) == ("security", 1_000_000.0)
    assert book.find(execution()) is None
    with pytest.raises(GrantError, match="already revoked by security") as caught:
        book.revoke(grant.id, by="ana")
    assert caught.value.code == "GRANT_ERROR"
    with pytest.raises(GrantError, match="there is no grant 'g-nope'"):
        book.revoke("g-nope", by="ana")


def test_use_records_the_call_and_counts_it() -> None:
    book = GrantBook(clock=Clock())
    grant = book.grant("shell", agent="main", granted_by="ana")
    used = book.use(execution(call_id="c-7"))
    assert used is not None and used.id == grant.id and used.uses == 1
    assert book.use(execution(name="deploy")) is None
    assert book.get(grant.id) == used


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"tool": ""}, "tool must be a non-empty str"),
        ({"granted_by": ""}, "granted_by must be a non-empty str"),
        ({"agent": ""}, "agent must be a non-empty str or None"),
        ({"agent": "main", "any_agent": True}, "a grant for every agent names no agent"),
        ({"any_agent": 1}, "any_agent must be a bool"),
        ({"ttl_s": 0}, "ttl_s must be a positive finite number"),
        ({"ttl_s": float("inf")}, "ttl_s must be a positive finite number"),
        ({"ttl_s": True}, "ttl_s must be a positive finite number"),
        ({"ttl_s": 1e300}, "ttl_s must be a positive finite number of seconds, at most 100 years"),
        ({"arguments": ["ls"]}, "arguments must be a mapping or None"),
        ({"note": 3}, "note must be a str or None"),
    ],
)
def test_bad_grants_are_refused(options: dict[str, Any], message: str) -> None:
    book = GrantBook()
    call = {"tool": "shell", "granted_by": "ana"} | options
    tool = call.pop("tool")
    with pytest.raises(ValueError, match=message):
        book.grant(tool, **call)
    assert book.grants(include_inactive=True) == ()


def test_arguments_that_are_not_lossless_json_are_refused() -> None:
    book = GrantBook()
    with pytest.raises(NonJsonValueError):
        book.grant("shell", granted_by="ana", arguments={"n": float("nan")})
    assert book.grants() == ()


# --- the file -----------------------------------------------------------------------------


def test_grants_survive_a_restart_with_their_audit_trail(tmp_path: Path) -> None:
    path = tmp_path / "grants.jsonl"
    clock = Clock()
    first = GrantBook(path, clock=clock)
    grant = first.grant("shell", agent="main", granted_by="ana", note="routine listing")
    first.use(execution(call_id="c-1"))
    clock.now += 5
    first.use(execution(call_id="c-2"))

    again = GrantBook(path, clock=clock)
    [loaded] = again.grants()
    assert loaded == attrs_evolve(grant, uses=2)
    events = read_session_log(path).events
    assert [event.type for event in events] == ["grant/added", "grant/used", "grant/used"]
    assert events[1].data["callId"] == "c-1" and events[2].data["callId"] == "c-2"
    assert events[2].data["at"] == clock.now
    assert events[0].data["grantedBy"] == "ana" and events[0].data["note"] == "routine listing"
    assert read_grants(path) == (loaded,)


def attrs_evolve(grant: StandingGrant, **changes: Any) -> StandingGrant:
    import attrs

    return attrs.evolve(grant, **changes)


def test_a_revocation_by_another_process_applies_to_the_next_call(tmp_path: Path) -> None:
    path = tmp_path / "grants.jsonl"
    host = GrantBook(path, clock=Clock())
    grant = host.grant("shell", agent="main", granted_by="ana")
    assert host.use(execution()) is not None
    GrantBook(path, clock=Clock()).revoke(grant.id, by="security")  # e.g. dsh-tools grants revoke
    assert host.use(execution()) is None
    assert host.get(grant.id) is not None and host.get(grant.id).revoked_by == "security"  # type: ignore[union-attr]


def test_two_writers_interleave_without_losing_lines(tmp_path: Path) -> None:
    path = tmp_path / "grants.jsonl"
    one, two = GrantBook(path), GrantBook(path)
    first = one.grant("shell", agent="main", granted_by="ana")
    second = two.grant("deploy", agent="main", granted_by="bo")
    one.use(execution())
    two.use(execution(name="deploy"))
    assert {grant.id for grant in GrantBook(path).grants()} == {first.id, second.id}
    assert [event.seq for event in read_session_log(path).events] == [1, 2, 3, 4]


def test_a_torn_last_line_is_ignored_then_cut_off(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "grants.jsonl"
    book = GrantBook(path)
    grant = book.grant("shell", agent="main", granted_by="ana")
    with path.open("ab") as file:
        file.write(b'{"seq": 2, "type": "grant/revoked", "data": {"id": "')
    reader = GrantBook(path)
    assert reader.find(execution()) is not None  # a half-written revocation is not a revocation
    caplog.set_level(logging.WARNING, logger="dsh_plugins.grants")
    reader.revoke(grant.id, by="security")
    assert "cutting off a torn last line" in caplog.text
    assert [event.type for event in read_session_log(path).events] == ["grant/added", "grant/revoked"]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ({"type": "effect/started", "data": {"key": "x"}}, "unknown event type 'effect/started'"),
        ({"type": "grant/used", "data": {"id": "g-x"}}, "names grant g-x, which was never added"),
        ({"type": "grant/added", "data": {"id": "g-1", "tool": "", "anyAgent": False}}, "tool must be a non-empty"),
        (
            {"type": "grant/added", "data": {"id": "g-1", "tool": "t", "anyAgent": "no"}},
            "anyAgent must be true or false",
        ),
        (
            {
                "type": "grant/added",
                "data": {"id": "g-1", "tool": "t", "anyAgent": False, "grantedBy": "a", "grantedAt": "now"},
            },
            "grantedAt must be a number",
        ),
        (
            {
                "type": "grant/added",
                "data": {"id": "g-1", "tool": "t", "anyAgent": False, "grantedBy": "a", "grantedAt": 10**400},
            },
            "grantedAt must be a number a float can hold",  # it was a bare OverflowError
        ),
    ],
)
def test_a_file_that_is_not_a_grants_file_is_refused(tmp_path: Path, line: dict[str, Any], message: str) -> None:
    path = tmp_path / "grants.jsonl"
    path.write_text(json.dumps({"seq": 1, **line}) + "\n")
    with pytest.raises(GrantError, match=message):
        GrantBook(path)
    with pytest.raises(GrantError, match=message):
        read_grants(path)


DEEP = "<too deep to print>"
"""Stands for a JSON array nested 100 000 levels deep in the line written."""
SHOWN_DEEP = "(((((((...),),),),),),)"


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"id": DEEP}, f"id must be a non-empty string, got {SHOWN_DEEP}"),
        (
            {"id": "g-1", "tool": "t", "anyAgent": True, "arguments": DEEP, "grantedBy": "a", "grantedAt": 1},
            f"arguments must be an object or null, got {SHOWN_DEEP}",
        ),
        ({"id": "g-1", "tool": "t", "anyAgent": DEEP}, f"anyAgent must be true or false, got {SHOWN_DEEP}"),
        (
            {"id": "g-1", "tool": "t", "anyAgent": True, "note": DEEP},
            f"note must be a string or null, got {SHOWN_DEEP}",
        ),
        (
            {"id": "g-1", "tool": "t", "anyAgent": True, "uses": DEEP},
            f"uses must be a non-negative integer, got {SHOWN_DEEP}",
        ),
        (
            {"id": "g-1", "tool": "t", "anyAgent": True, "grantedBy": "a", "grantedAt": DEEP},
            f"grantedAt must be a number, got {SHOWN_DEEP}",
        ),
    ],
    ids=["id", "arguments", "anyAgent", "note", "uses", "grantedAt"],
)
def test_a_field_too_deep_to_print_is_refused_naming_the_file(
    tmp_path: Path, data: dict[str, Any], message: str
) -> None:
    path = tmp_path / "grants.jsonl"
    line = json.dumps({"seq": 1, "type": "grant/added", "data": data})
    path.write_text(line.replace(json.dumps(DEEP), "[" * 100_000 + "]" * 100_000) + "\n")
    expected = f"{path}: event seq 1: {message}"
    with pytest.raises(GrantError) as opening:
        GrantBook(path)
    assert str(opening.value) == expected
    with pytest.raises(GrantError) as reading:
        read_grants(path)
    assert str(reading.value) == expected


def test_a_damaged_line_in_the_middle_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "grants.jsonl"
    GrantBook(path).grant("shell", granted_by="ana")
    text = path.read_text()
    path.write_text("not json\n" + text)
    with pytest.raises(GrantError, match="the grants file is damaged"):
        GrantBook(path)


@pytest.mark.parametrize(
    "content",
    [gzip.compress(b"important notes\n", mtime=0), b'\xff\xfe{"id":"a"}\n'],
    ids=["gzip", "utf16"],
)
def test_a_binary_file_given_as_the_grants_file_is_refused_and_left_alone(tmp_path: Path, content: bytes) -> None:
    """Its one line is not text, but no grant precedes it: not a torn line to cut off, someone else's file."""
    path = tmp_path / "victim.gz"
    path.write_bytes(content)
    with pytest.raises(GrantError, match=r"the grants file is damaged: .*not a session log line"):
        GrantBook(path)
    with pytest.raises(GrantError, match="not a session log line"):
        read_grants(path)
    from click.testing import CliRunner

    from dsh_core._cli import cli

    result = CliRunner().invoke(cli, ["--no-plugins", "grants", "add", str(path), "calc", "--agent", "a"])
    assert result.exit_code == 2, result.output
    assert "not a session log line" in result.output
    assert path.read_bytes() == content


def test_garbage_after_a_grant_is_cut_off_as_torn(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "grants.jsonl"
    grant = GrantBook(path).grant("shell", agent="main", granted_by="ana")
    clean = path.read_bytes()
    with path.open("ab") as file:
        file.write(b"\x00\x00\xff\xfe")  # what a crash left where the file grew
    book = GrantBook(path)
    assert path.read_bytes().startswith(clean) and len(path.read_bytes()) == len(clean) + 4  # reading cuts nothing
    caplog.set_level(logging.WARNING, logger="dsh_plugins.grants")
    book.revoke(grant.id, by="security")
    assert "cutting off a torn last line" in caplog.text
    assert [event.type for event in read_session_log(path).events] == ["grant/added", "grant/revoked"]


def test_a_missing_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(GrantError, match="does not exist"):
        GrantBook(tmp_path / "nope" / "grants.jsonl")


def test_a_new_file_is_created_on_the_first_write_only(tmp_path: Path) -> None:
    path = tmp_path / "grants.jsonl"
    book = GrantBook(path)
    assert book.grants() == ()
    assert book.find(execution()) is None
    assert book.use(execution()) is None
    assert not path.exists()  # looking up writes nothing, and the lock is a file of its own
    book.grant("shell", agent="main", granted_by="ana")
    assert len(read_session_log(path).events) == 1


def test_the_grants_file_and_its_lock_are_private_whatever_the_umask(tmp_path: Path) -> None:
    path = tmp_path / "grants.jsonl"
    previous = os.umask(0)
    try:
        book = GrantBook(path)
        book.grant("shell", agent="main", granted_by="ana")
        book.compact(tmp_path / "old.jsonl")
    finally:
        os.umask(previous)
    for private in (path, tmp_path / "grants.jsonl.lock", tmp_path / "old.jsonl"):
        assert stat.S_IMODE(private.stat().st_mode) == 0o600, private


# --- GrantingApproval in the pipeline -----------------------------------------------------


async def test_always_becomes_a_grant_and_later_calls_are_not_asked() -> None:
    inner = Scripted(ALLOWED_ALWAYS)
    book = GrantBook(clock=Clock())
    runtime = runtime_with(GrantingApproval(inner, book, granted_by="ana"))
    first = await runtime.execute(make_input("shell", {"command": "ls"}, agent=MAIN, call_id="c-1"))
    second = await runtime.execute(make_input("shell", {"command": "pwd"}, agent=MAIN, call_id="c-2"))
    assert not first.is_error and not second.is_error
    assert inner.asked == ["c-1"]
    [grant] = book.grants()
    assert (grant.tool, grant.agent, grant.any_agent, grant.arguments) == ("shell", "main", False, None)
    assert grant.granted_by == "ana" and grant.note == "answered for call c-1"
    assert grant.uses == 2  # the answered call and the one it spared a question


async def test_the_grant_stays_within_its_tool_and_agent() -> None:
    inner = Scripted(ALLOWED_ALWAYS, "denied", "denied")
    runtime = runtime_with(GrantingApproval(inner, GrantBook()))
    await runtime.execute(make_input("shell", agent=MAIN, call_id="c-1"))
    assert code(await runtime.execute(make_input("deploy", agent=MAIN, call_id="c-2"))) == "DENIED"
    assert code(await runtime.execute(make_input("shell", agent=HELPER, call_id="c-3"))) == "DENIED"
    assert inner.asked == ["c-1", "c-2", "c-3"]


async def test_all_agents_grants_for_every_agent() -> None:
    inner = Scripted(ALLOWED_ALWAYS)
    runtime = runtime_with(GrantingApproval(inner, GrantBook(), all_agents=True))
    await runtime.execute(make_input("shell", agent=MAIN, call_id="c-1"))
    assert not (await runtime.execute(make_input("shell", agent=HELPER, call_id="c-2"))).is_error
    assert inner.asked == ["c-1"]


async def test_arguments_scope_asks_again_for_other_arguments() -> None:
    inner = Scripted(ALLOWED_ALWAYS, "denied")
    runtime = runtime_with(GrantingApproval(inner, GrantBook(), scope="arguments"))
    await runtime.execute(make_input("shell", {"command": "ls"}, agent=MAIN, call_id="c-1"))
    assert not (await runtime.execute(make_input("shell", {"command": "ls"}, agent=MAIN, call_id="c-2"))).is_error
    result = await runtime.execute(make_input("shell", {"command": "ls /"}, agent=MAIN, call_id="c-3"))
    assert code(result) == "DENIED"
    assert inner.asked == ["c-1", "c-3"]


async def test_an_expired_grant_asks_again() -> None:
    clock = Clock()
    inner = Scripted(ALLOWED_ALWAYS, "allowed-once")
    book = GrantBook(clock=clock)
    runtime = runtime_with(GrantingApproval(inner, book, ttl_s=3600))
    await runtime.execute(make_input("shell", agent=MAIN, call_id="c-1"))
    clock.now += 3600
    await runtime.execute(make_input("shell", agent=MAIN, call_id="c-2"))
    assert inner.asked == ["c-1", "c-2"]
    assert len(book.grants(include_inactive=True)) == 1


async def test_a_revoked_grant_asks_again() -> None:
    inner = Scripted(ALLOWED_ALWAYS, "denied")
    book = GrantBook()
    runtime = runtime_with(GrantingApproval(inner, book))
    await runtime.execute(make_input("shell", agent=MAIN, call_id="c-1"))
    [grant] = book.grants()
    book.revoke(grant.id, by="security")
    assert code(await runtime.execute(make_input("shell", agent=MAIN, call_id="c-2"))) == "DENIED"
    assert inner.asked == ["c-1", "c-2"]


@pytest.mark.parametrize("answer", ["allowed-once", "denied", "unavailable", "cancelled"])
async def test_other_answers_pass_through_and_grant_nothing(answer: str) -> None:
    inner = Scripted(answer)
    book = GrantBook()
    service = GrantingApproval(inner, book)
    assert await service.request(execution(), None) == answer
    assert book.grants(include_inactive=True) == ()


async def test_a_grant_never_overrides_a_denial() -> None:
    book = GrantBook()
    book.grant("shell", agent="main", granted_by="ana")
    runtime = make_runtime(json_tool("shell"), plugins=[DenyRm()], approval=GrantingApproval(Scripted(), book))
    result = await runtime.execute(make_input("shell", {"command": "rm -rf /"}, agent=MAIN))
    assert code(result) == "DENIED"
    assert book.grants()[0].uses == 0


async def test_a_cancelled_call_is_not_looked_up_or_recorded() -> None:
    book = GrantBook()
    book.grant("shell", agent="main", granted_by="ana")
    call = execution()
    call.signal.cancel("gone")
    assert await GrantingApproval(Scripted(), book).request(call, None) == "cancelled"
    assert book.grants()[0].uses == 0


async def test_a_call_cancelled_while_the_approver_answered_grants_nothing() -> None:
    call = execution()

    class AnswersLate:
        async def request(self, execution: ToolExecution, reason: str | None) -> str:
            execution.signal.cancel("caller gave up")
            return ALLOWED_ALWAYS

    book = GrantBook()
    assert await GrantingApproval(AnswersLate(), book).request(call, None) == "cancelled"
    assert book.grants(include_inactive=True) == ()


async def test_a_book_that_cannot_be_written_fails_the_call_instead_of_allowing_it(tmp_path: Path) -> None:
    path = tmp_path / "grants.jsonl"
    book = GrantBook(path)
    book.grant("shell", agent="main", granted_by="ana")
    path.write_text("garbage in the middle\n" + path.read_text())
    runtime = runtime_with(GrantingApproval(Scripted(), book))
    result = await runtime.execute(make_input("shell", agent=MAIN))
    assert result.is_error
    assert "the grants file is damaged" in result.error.message


async def test_allowed_always_without_a_granting_wrapper_is_a_clear_error() -> None:
    runtime = runtime_with(StaticApproval(ALLOWED_ALWAYS))
    result = await runtime.execute(make_input("shell", agent=MAIN))
    assert result.is_error
    assert "approval service returned 'allowed-always'" in result.error.message


def test_granting_approval_refuses_bad_settings() -> None:
    with pytest.raises(TypeError, match="inner must be an ApprovalService"):
        GrantingApproval(object(), GrantBook())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="scope must be 'tool' or 'arguments'"):
        GrantingApproval(Scripted(), GrantBook(), scope="everything")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ttl_s must be a positive finite number"):
        GrantingApproval(Scripted(), GrantBook(), ttl_s=-1)
    with pytest.raises(TypeError, match="book must be a GrantBook, got str"):
        GrantingApproval(Scripted(), "grants.jsonl")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="all_agents must be a bool, got 'no'"):
        GrantingApproval(Scripted(), GrantBook(), all_agents="no")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="granted_by must be a non-empty str"):
        GrantingApproval(Scripted(), GrantBook(), granted_by="")


def test_diagnostics_name_grants_for_tools_that_are_not_registered() -> None:
    book = GrantBook()
    book.grant("shell", agent="main", granted_by="ana")
    typo = book.grant("shel", agent="main", granted_by="ana")
    book.grant("run_code", any_agent=True, granted_by="ana")  # the runtime's own tool: known
    book.revoke(book.grant("gone", agent="main", granted_by="ana").id, by="ana")  # not in force: not reported
    runtime = runtime_with(GrantingApproval(Scripted(), book))
    assert book.diagnostics(runtime) == [
        f'grant {typo.id} is for tool "shel", which is not registered, so it never applies '
        "(revoke it and grant the tool's exact name)"
    ]


# --- the approval services that can say "always" ------------------------------------------


async def test_terminal_always_is_reported_for_a_grant_instead_of_remembered() -> None:
    asked: list[str] = []

    def prompt(question: str) -> str:
        asked.append(question)
        return "a"

    terminal = TerminalApproval(prompt=prompt, report_always=True)
    book = GrantBook()
    runtime = runtime_with(GrantingApproval(terminal, book))
    await runtime.execute(make_input("shell", agent=MAIN, call_id="c-1"))
    await runtime.execute(make_input("shell", agent=MAIN, call_id="c-2"))
    assert len(asked) == 1
    assert terminal.always == set()
    assert book.grants()[0].uses == 2
    with pytest.raises(TypeError, match="report_always must be a bool"):
        TerminalApproval(report_always="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "offer"),
    [
        ({}, "a = grant: always allow shell for agent main, any arguments (recorded, revocable)"),
        (
            {"scope": "arguments", "all_agents": True, "ttl_s": 3600},
            "a = grant: always allow shell for every agent, only these exact arguments until 1970-01-01T01:00:00Z "
            "(recorded, revocable)",
        ),
    ],
)
async def test_the_question_says_what_answering_always_grants(options: Any, offer: str) -> None:
    asked: list[str] = []

    def prompt(question: str) -> str:
        asked.append(question)
        return "a"

    book = GrantBook(clock=lambda: 0.0)
    chain = EscalatingApproval((TerminalApproval(prompt=prompt, report_always=True), 10))
    await GrantingApproval(chain, book, **options).request(execution(), None)
    assert asked[0].splitlines()[-2:] == [offer, 'Allow shell {"command": "ls"}? [y/N/a] ']
    [grant] = book.grants()
    assert (grant.any_agent, grant.arguments is not None) == (options.get("all_agents", False), "scope" in options)


async def test_the_grant_recorded_is_the_one_the_question_stated_however_late_the_answer() -> None:
    """Built again after the answer, its expiry counted from then: answered an hour late, it outlived the promise."""
    now = [0.0]
    asked: list[str] = []

    class LatePerson:
        async def request(self, execution: ToolExecution, reason: str | None) -> str:
            from dsh_plugins.grants import always_offer

            asked.append(always_offer() or "")
            now[0] += 3600  # the person answers an hour later
            return ALLOWED_ALWAYS

    book = GrantBook(clock=lambda: now[0])
    await GrantingApproval(LatePerson(), book, ttl_s=8 * 3600).request(execution(), None)
    [grant] = book.grants()
    assert "until 1970-01-01T08:00:00Z" in asked[0]
    assert grant.expires_at == 8 * 3600
    assert grant.describe() in asked[0]


async def test_the_question_says_always_cannot_be_recorded_without_a_grant_book() -> None:
    asked: list[str] = []

    def prompt(question: str) -> str:
        asked.append(question)
        return "n"

    await TerminalApproval(prompt=prompt, report_always=True).request(execution(), None)
    assert asked[0].splitlines()[-2] == "a = always allow shell: refused here, no grant book records it"


async def test_escalation_passes_always_on_and_records_the_step() -> None:
    steps: list[ApprovalStep] = []
    chain = EscalatingApproval(
        (StaticApproval("unavailable"), 10), (Scripted(ALLOWED_ALWAYS), 10), on_step=steps.append
    )
    book = GrantBook()
    with trio.fail_after(5):
        assert await GrantingApproval(chain, book).request(execution(), None) == "allowed-once"
    assert [step.answer for step in steps] == ["unavailable", ALLOWED_ALWAYS]
    assert len(book.grants()) == 1


def test_concurrent_uses_from_worker_threads_are_all_counted(tmp_path: Path) -> None:
    for book in (GrantBook(), GrantBook(tmp_path / "grants.jsonl")):
        grant = book.grant("shell", agent="main", granted_by="ana")

        def use_many(book: GrantBook = book) -> None:
            for index in range(25):
                assert book.use(execution(call_id=f"c-{threading.get_ident()}-{index}")) is not None

        threads = [threading.Thread(target=use_many) for _ in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert book.get(grant.id).uses == 150  # type: ignore[union-attr]
    assert len(read_session_log(tmp_path / "grants.jsonl").events) == 151


async def test_granting_approval_keeps_file_work_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    loop_thread = threading.current_thread()
    used_on: list[tuple[str, threading.Thread]] = []
    book = GrantBook()
    real_use, real_add = book._use, book._add

    def recording_use(call: ToolExecution, *, wait: bool) -> Any:
        used_on.append(("use", threading.current_thread()))
        return real_use(call, wait=wait)

    def recording_add(candidate: Any, *, wait: bool) -> Any:
        used_on.append(("add", threading.current_thread()))
        return real_add(candidate, wait=wait)

    monkeypatch.setattr(book, "_use", recording_use)
    monkeypatch.setattr(book, "_add", recording_add)
    await GrantingApproval(Scripted(ALLOWED_ALWAYS), book).request(execution(), None)
    assert [what for what, _ in used_on] == ["use", "add", "use"]  # the lookup, the grant, its first use
    assert all(thread is not loop_thread for _, thread in used_on)


async def test_a_call_waiting_for_a_grants_file_another_process_holds_can_be_cancelled(
    tmp_path: Path, autojump_clock: Any
) -> None:
    book = GrantBook(tmp_path / "grants.jsonl")
    book.grant("shell", agent="main", granted_by="ana")
    runtime = runtime_with(GrantingApproval(Scripted(), book))
    # Another process holding the lock (flock conflicts between two opens in one process too).
    holder = os.open(str(tmp_path / "grants.jsonl.lock"), os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        stop = CancelSignal()
        async with trio.open_nursery() as nursery:

            async def cancel_later() -> None:
                await trio.sleep(1)
                stop.cancel("user pressed stop")

            nursery.start_soon(cancel_later)
            result = await runtime.execute(make_input("shell", {"command": "ls"}, agent=MAIN, signal=stop))
        # It used to wait in a worker thread until the holder let go, whatever the signal said.
        assert code(result) == "ABORTED_BEFORE_DISPATCH"
        assert trio.current_time() < 2
    finally:
        os.close(holder)
    assert book.grants()[0].uses == 0  # the cancelled call recorded no use


async def test_a_call_waiting_for_a_held_grants_file_goes_on_once_it_is_free(
    tmp_path: Path, autojump_clock: Any
) -> None:
    book = GrantBook(tmp_path / "grants.jsonl")
    book.grant("shell", agent="main", granted_by="ana")
    runtime = runtime_with(GrantingApproval(Scripted(), book))
    holder = os.open(str(tmp_path / "grants.jsonl.lock"), os.O_RDWR | os.O_CREAT)
    fcntl.flock(holder, fcntl.LOCK_EX)
    async with trio.open_nursery() as nursery:

        async def release_later() -> None:
            await trio.sleep(3)
            os.close(holder)

        nursery.start_soon(release_later)
        result = await runtime.execute(make_input("shell", {"command": "ls"}, agent=MAIN))
    assert not result.is_error
    assert trio.current_time() >= 3
    assert book.grants()[0].uses == 1


def test_a_book_reads_only_what_others_appended(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dsh_plugins import grants as grants_module

    path = tmp_path / "grants.jsonl"
    host, other = GrantBook(path), GrantBook(path)
    grant = host.grant("shell", agent="main", granted_by="ana")
    assert other.get(grant.id) is not None

    def no_full_reads(path: str) -> Any:
        raise AssertionError("the whole file was read again")

    monkeypatch.setattr(grants_module, "_load_read", no_full_reads)
    for index in range(3):
        assert other.use(execution(call_id=f"c{index}")) is not None
    assert host.get(grant.id).uses == 3  # type: ignore[union-attr]
    host.revoke(grant.id, by="security")
    assert other.use(execution()) is None


def test_a_rewritten_file_is_read_again_whole(tmp_path: Path) -> None:
    path = tmp_path / "grants.jsonl"
    book = GrantBook(path)
    book.grant("shell", agent="main", granted_by="ana")
    replacement = GrantBook(tmp_path / "other.jsonl")
    replacement.grant("deploy", agent="main", granted_by="bo", note="a longer note so the file grows")
    (tmp_path / "other.jsonl").replace(path)  # not an append: another file in its place
    assert [grant.tool for grant in book.grants()] == ["deploy"]


# --- compaction -------------------------------------------------------------------------------


def test_compact_keeps_the_grants_in_force_with_their_uses_and_archives_the_history(tmp_path: Path) -> None:
    path = tmp_path / "grants.jsonl"
    clock = Clock()
    book = GrantBook(path, clock=clock)
    kept = book.grant("shell", agent="main", granted_by="ana")
    revoked = book.grant("deploy", agent="main", granted_by="ana")
    expiring = book.grant("read", agent="main", granted_by="ana", ttl_s=10)
    for index in range(4):
        book.use(execution(call_id=f"c{index}"))
    book.revoke(revoked.id, by="security")
    clock.now += 10  # the third one has expired
    archive = book.compact(tmp_path / "history.jsonl")
    assert archive == str(tmp_path / "history.jsonl")
    assert [grant.id for grant in read_grants(archive)] == [kept.id, revoked.id, expiring.id]  # all history kept
    assert len(read_session_log(archive).events) == 3 + 4 + 1
    events = read_session_log(path).events
    assert [event.type for event in events] == ["grant/added"]
    [survivor] = book.grants(include_inactive=True)
    assert survivor.id == kept.id and survivor.uses == 4
    assert book.use(execution(call_id="c9")) is not None
    assert book.get(kept.id).uses == 5  # type: ignore[union-attr]
    assert GrantBook(path, clock=clock).get(kept.id).uses == 5  # type: ignore[union-attr]


def test_a_book_sharing_the_file_follows_a_compaction(tmp_path: Path) -> None:
    path = tmp_path / "grants.jsonl"
    host, other = GrantBook(path), GrantBook(path)
    grant = host.grant("shell", agent="main", granted_by="ana")
    for index in range(3):
        other.use(execution(call_id=f"c{index}"))
    archive = host.compact()
    assert archive is not None and archive.startswith(str(path) + ".")
    assert other.use(execution(call_id="after")) is not None  # appends to the new file, not the archive
    assert len(read_session_log(archive).events) == 4
    assert host.get(grant.id).uses == 4  # type: ignore[union-attr]


def pause_when_moved(monkeypatch: pytest.MonkeyPatch, path: Path) -> tuple[threading.Event, threading.Event]:
    """Make the first rename to or from ``path`` stop right after it, until told to go on."""
    paused, resume = threading.Event(), threading.Event()

    def pausing(real: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
        def move(source: Any, target: Any) -> None:
            real(source, target)
            if str(path) in (os.fspath(source), os.fspath(target)) and not paused.is_set():
                paused.set()
                assert resume.wait(5)

        return move

    monkeypatch.setattr(os, "rename", pausing(os.rename))
    monkeypatch.setattr(os, "replace", pausing(os.replace))
    return paused, resume


def test_a_grant_made_by_another_book_during_a_compaction_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "grants.jsonl"
    host, other = GrantBook(path), GrantBook(path)
    first = host.grant("shell", agent="main", granted_by="ana")
    paused, resume = pause_when_moved(monkeypatch, path)
    compacting = threading.Thread(target=host.compact, args=(tmp_path / "old.jsonl",))
    compacting.start()
    assert paused.wait(5)
    assert path.exists()  # never a moment without the grants file
    granted: list[StandingGrant] = []
    granting = threading.Thread(target=lambda: granted.append(other.grant("deploy", agent="main", granted_by="bob")))
    granting.start()
    granting.join(0.2)
    assert granting.is_alive()  # it waits for the compaction's lock
    resume.set()
    compacting.join(5)
    granting.join(5)
    assert [grant.id for grant in read_grants(path)] == [first.id, granted[0].id]
    assert [grant.tool for grant in GrantBook(path).grants()] == ["shell", "deploy"]


def test_a_compaction_that_fails_to_replace_the_file_leaves_it_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "grants.jsonl"
    book = GrantBook(path)
    grant = book.grant("shell", agent="main", granted_by="ana")
    book.use(execution())
    real_rename, real_replace = os.rename, os.replace

    def crash_into(real: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
        def move(source: Any, target: Any) -> None:
            if os.fspath(target) == str(path):
                raise OSError(errno.EIO, "the disk went away")  # as if the process died here
            real(source, target)

        return move

    monkeypatch.setattr(os, "rename", crash_into(real_rename))
    monkeypatch.setattr(os, "replace", crash_into(real_replace))
    with pytest.raises(OSError, match="the disk went away"):
        book.compact(tmp_path / "old.jsonl")
    monkeypatch.undo()
    assert len(read_session_log(path).events) == 2  # the grant and its use, where they were
    assert GrantBook(path).get(grant.id) is not None
    assert not (tmp_path / "old.jsonl").exists()  # so the same archive name can be used again
    assert book.compact(tmp_path / "old.jsonl") is not None


def test_a_compaction_file_replaced_while_it_is_written_is_never_installed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At the guessable "<path>.compacting" the model's write_file swapped in a forged grants file."""
    path = tmp_path / "grants.jsonl"
    book = GrantBook(path)
    book.grant("read_file", agent="main", granted_by="ana")
    forged = json.dumps({"seq": 1, "type": "grant/added", "data": {"id": "g-forged"}}) + "\n"
    real_append = SessionLog.append

    def swap_then_append(log: SessionLog, event: Any) -> int:
        # What write_file does: a new file renamed over the name (the log keeps its own descriptor).
        name = os.fspath(log.path)
        (tmp_path / "forged.tmp").write_text(forged)
        os.replace(tmp_path / "forged.tmp", name)
        return real_append(log, event)

    monkeypatch.setattr(SessionLog, "append", swap_then_append)
    with pytest.raises(GrantError, match=r"was replaced while it was written; .* was left as it was"):
        book.compact(tmp_path / "old.jsonl")
    monkeypatch.undo()
    assert [grant.tool for grant in GrantBook(path).grants()] == ["read_file"]
    assert not [name for name in os.listdir(tmp_path) if "compacting" in name]
    assert not (tmp_path / "grants.jsonl.compacting").exists()


def test_a_book_notices_a_compaction_to_the_same_size_within_one_mtime_tick(tmp_path: Path) -> None:
    """Seen by size and mtime only, the new file (another inode) read as unchanged: a revoked grant stayed in force."""
    path = tmp_path / "grants.jsonl"
    writer = GrantBook(path, clock=lambda: 1_800_000_000.0)
    revoked = writer.grant("shell", agent="main", granted_by="ana")
    host = GrantBook(path)
    assert host.find(execution()) is not None
    seen = path.stat()
    writer.revoke(revoked.id, by="ana")
    writer.compact(tmp_path / "old-1.jsonl")
    # Another grant whose note pads the compacted file to the size the host saw last.
    empty_size = path.stat().st_size
    probe = writer.grant("other", agent="main", granted_by="ana", note="")
    line = path.stat().st_size - empty_size
    writer.revoke(probe.id, by="ana")
    writer.compact(tmp_path / "old-2.jsonl")
    writer.grant("other", agent="main", granted_by="ana", note="n" * (seen.st_size - path.stat().st_size - line))
    assert path.stat().st_size == seen.st_size and path.stat().st_ino != seen.st_ino
    os.utime(path, ns=(seen.st_mtime_ns, seen.st_mtime_ns))  # a coarse clock's single tick
    assert host.find(execution()) is None


def test_an_archive_on_a_file_system_without_hard_links_is_a_private_copy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "grants.jsonl"
    book = GrantBook(path)
    book.grant("shell", agent="main", granted_by="ana")
    history = path.read_bytes()

    def no_links(source: Any, target: Any) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", no_links)
    archive = tmp_path / "old.jsonl"
    assert book.compact(archive) == str(archive)
    assert archive.read_bytes() == history
    assert stat.S_IMODE(archive.stat().st_mode) == 0o600


def test_compact_refuses_an_existing_archive_and_needs_a_file(tmp_path: Path) -> None:
    path = tmp_path / "grants.jsonl"
    book = GrantBook(path)
    assert book.compact() is None  # nothing written yet
    assert GrantBook().compact() is None
    book.grant("shell", agent="main", granted_by="ana")
    (tmp_path / "taken.jsonl").write_text("")
    with pytest.raises(GrantError, match="exists already"):
        book.compact(tmp_path / "taken.jsonl")
    assert len(read_session_log(path).events) == 1  # untouched


def test_a_grant_expiring_past_any_calendar_is_still_described(tmp_path: Path) -> None:
    """A file from elsewhere may hold any finite expiresAt: describing it raised OverflowError (grants show crashed)."""
    from dsh_plugins import grants as grants_module

    assert grants_module._timestamp(1e300) == "1e+300 s after 1970"
    assert grants_module._timestamp(0) == "1970-01-01T00:00:00Z"
    book = GrantBook(str(tmp_path / "g.jsonl"))
    grant = book.grant("shell", granted_by="ana", any_agent=True, ttl_s=grants_module.MAX_TTL_S)
    assert "until" in grant.describe()


class SlowScripted(Scripted):
    """Scripted answers that take a moment each, counting the questions asked at once.

    The book works on worker threads, so these tests run on the real clock (a virtual
    one jumps while a thread runs); nothing in them waits on time for its outcome.
    """

    def __init__(self, *answers: str, together: int = 1) -> None:
        super().__init__(*answers)
        self.active = self.peak = 0
        self.together = together  # hold each question until this many are asked at once
        self.all_in = trio.Event()

    async def request(self, execution: ToolExecution, reason: str | None) -> str:
        self.active += 1
        self.peak = max(self.peak, self.active)
        try:
            if self.active >= self.together:
                self.all_in.set()
            await self.all_in.wait()
            await trio.sleep(0.01)  # room for another question to come in beside this one
            return await super().request(execution, reason)
        finally:
            self.active -= 1


async def ask_at_once(service: GrantingApproval, *executions: ToolExecution) -> dict[str, str]:
    answers: dict[str, str] = {}

    async def ask(one: ToolExecution) -> None:
        answers[one.call_id] = await service.request(one, None)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for one in executions:
                nursery.start_soon(ask, one)
    return answers


async def test_an_always_answer_covers_a_question_about_the_tool_that_waited_for_it() -> None:
    """Asked at once, the second question was shown after the first was answered "always", and granted again."""
    inner = SlowScripted(ALLOWED_ALWAYS)
    book = GrantBook()
    service = GrantingApproval(inner, book)
    answers = await ask_at_once(service, execution(call_id="c-1"), execution(arguments={"command": "pwd"}, call_id="c-2"))
    assert answers == {"c-1": "allowed-once", "c-2": "allowed-once"}
    assert len(inner.asked) == 1  # whichever came first (trio starts tasks in any order)
    [grant] = book.grants()
    assert grant.uses == 2
    assert service._asking == {}  # nothing kept for a tool no call waits on


async def test_questions_about_other_tools_are_asked_side_by_side() -> None:
    # Each question is held until both are asked: one at a time, the first would wait for good.
    inner = SlowScripted("allowed-once", "allowed-once", together=2)
    service = GrantingApproval(inner, GrantBook())
    await ask_at_once(service, execution("shell", call_id="c-1"), execution("deploy", call_id="c-2"))
    assert inner.peak == 2


async def test_questions_about_one_tool_for_other_agents_are_asked_side_by_side() -> None:
    """An answer for one agent grants nothing to another: its question need not wait (a person per agent)."""
    inner = SlowScripted("allowed-once", "allowed-once", together=2)
    service = GrantingApproval(inner, GrantBook())
    await ask_at_once(service, execution(agent=MAIN, call_id="c-1"), execution(agent=HELPER, call_id="c-2"))
    assert inner.peak == 2


async def test_with_all_agents_one_answer_covers_another_agents_waiting_question() -> None:
    inner = SlowScripted(ALLOWED_ALWAYS)
    book = GrantBook()
    service = GrantingApproval(inner, book, all_agents=True)
    answers = await ask_at_once(service, execution(agent=MAIN, call_id="c-1"), execution(agent=HELPER, call_id="c-2"))
    assert answers == {"c-1": "allowed-once", "c-2": "allowed-once"}
    assert len(inner.asked) == 1 and len(book.grants()) == 1


async def test_questions_about_one_tool_an_answer_does_not_cover_are_each_asked() -> None:
    inner = SlowScripted(ALLOWED_ALWAYS, ALLOWED_ALWAYS)
    book = GrantBook()
    service = GrantingApproval(inner, book, scope="arguments")
    answers = await ask_at_once(service, execution(call_id="c-1"), execution(arguments={"command": "pwd"}, call_id="c-2"))
    assert answers == {"c-1": "allowed-once", "c-2": "allowed-once"}
    assert inner.peak == 1 and len(inner.asked) == 2  # one at a time
    assert sorted(grant.arguments["command"] for grant in book.grants()) == ["ls", "pwd"]  # type: ignore[index]
