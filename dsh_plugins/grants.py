"""Standing approvals: "always allow" answers that are scoped, expire, can be revoked and are audited.

An approver who answers "always" for a tool should not be asked again, but that
answer is a security decision: it must say exactly what it covers, it must be
possible to take it back while the host runs, and every call it lets through
must be traceable to it. Here:

- a :class:`StandingGrant` covers one tool, for one agent (or, when granted so,
  for every agent), for any arguments or only for calls with exactly the
  arguments it names, optionally until an expiry time;
- a :class:`GrantBook` keeps grants in an append-only file (or in memory) in
  which every grant, revocation and use is a line (``grant/added``,
  ``grant/revoked``, ``grant/used``) with who and when. Several hosts and the
  ``dsh-tools grants`` command may share one file: each write takes the lock
  of ``<file>.lock`` (kept beside it; it holds nothing) for the length of the
  write, and every lookup first reads what others appended, so a revocation
  made in another shell applies to the next call. The grants file is created
  ``0600``;
- :class:`GrantingApproval` wraps any approval service: a call a live grant
  covers is allowed without asking (and the use recorded); otherwise the inner
  service is asked, and its answer :data:`ALLOWED_ALWAYS` becomes a new grant
  (the call itself proceeds as ``"allowed-once"``).

Grants never override a denial: they only answer ``Ask`` decisions, so a
policy that denies outright still denies, and a grant can only allow a call a
policy chose to ask about.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Final, Literal, NamedTuple, TypeVar

import attrs
import trio

from dsh_core import (
    RUN_CODE_NAME,
    ApprovalService,
    DshError,
    FrozenDict,
    SessionEvent,
    SessionLog,
    SessionLogError,
    SessionLogRead,
    ToolExecution,
    ToolRuntime,
    json_equal,
    json_text,
    read_session_log,
    safe_repr,
    scope_id,
    snapshot_json,
)
from dsh_core.schema import JsonSchemaError, validate_json_schema_value

__all__ = [
    "ALLOWED_ALWAYS",
    "LOCK_SUFFIX",
    "GrantBook",
    "GrantError",
    "GrantingApproval",
    "StandingGrant",
    "always_offer",
    "read_grants",
    "unmatchable_arguments",
]

ALLOWED_ALWAYS: Final = "allowed-always"
"""The answer an approval service wrapped by :class:`GrantingApproval` gives to mean "allow, and do not ask again"."""

_ALWAYS_OFFER: ContextVar[str | None] = ContextVar("dsh_grants_always_offer", default=None)


def always_offer() -> str | None:
    """What an "always" answer grants for the call being asked about now (``None``: no grant would record it).

    Set by :meth:`GrantingApproval.request` while its inner services ask (an
    :class:`~dsh_plugins.approval.EscalatingApproval` between them too), so a
    prompt can state the scope of the grant instead of guessing it.
    """
    return _ALWAYS_OFFER.get()


LOCK_SUFFIX: Final = ".lock"
# How often a call waiting for a grants file another process holds looks again (doubling up to the max).
_LOCK_POLL_FIRST_S: Final = 0.01
_LOCK_POLL_MAX_S: Final = 0.25
_T = TypeVar("_T")
"""The grants file ``grants.jsonl`` is locked through ``grants.jsonl.lock`` (kept; it holds nothing)."""

logger = logging.getLogger("dsh_plugins.grants")

_CLOEXEC: Final = getattr(os, "O_CLOEXEC", 0)

_ADDED: Final = "grant/added"
_REVOKED: Final = "grant/revoked"
_USED: Final = "grant/used"

Clock = Callable[[], float]


class GrantError(DshError, ValueError):
    """The grants file is damaged or is not a grants file, or a grant cannot be changed as asked."""

    code = "GRANT_ERROR"


@attrs.frozen(kw_only=True, slots=True)
class StandingGrant:
    """One "always allow" decision and what it covers.

    ``agent`` is the :func:`~dsh_core.scope_id` of the agent it was granted
    for (``None``: calls made without an agent), unless ``any_agent`` makes it
    cover every agent. ``arguments`` are the arguments a call must have
    (JSON equality of the whole object: a call with one more argument is not
    covered); ``None`` covers any arguments. ``expires_at`` and the other
    times are wall-clock epoch seconds. ``uses`` counts the calls it allowed.
    """

    id: str
    tool: str
    agent: str | None
    any_agent: bool
    arguments: FrozenDict | None
    granted_by: str
    granted_at: float
    expires_at: float | None
    note: str | None
    revoked_at: float | None = None
    revoked_by: str | None = None
    uses: int = 0

    def active(self, now: float) -> bool:
        """Not revoked and not expired at ``now``."""
        return self.revoked_at is None and (self.expires_at is None or now < self.expires_at)

    def covers(self, execution: ToolExecution, now: float) -> bool:
        """Whether this grant, active at ``now``, answers an ``Ask`` for ``execution``."""
        if not self.active(now) or execution.name != self.tool:
            return False
        if not self.any_agent and scope_id(execution.agent) != self.agent:
            return False
        return self.arguments is None or json_equal(execution.arguments, self.arguments)

    def describe(self, *, arguments: str | None = None) -> str:
        """One line: what the grant covers, for prompts, logs and the CLI.

        ``arguments`` replaces the JSON of the arguments it requires (the
        approval question says "only these exact arguments": they are on screen).
        """
        who = (
            "every agent"
            if self.any_agent
            else "calls without an agent"
            if self.agent is None
            else f"agent {self.agent}"
        )
        what = (
            "any arguments"
            if self.arguments is None
            else arguments
            if arguments is not None
            else f"arguments {json_text(self.arguments)}"
        )
        until = "" if self.expires_at is None else f" until {_timestamp(self.expires_at)}"
        return f"{self.tool} for {who}, {what}{until}"

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "tool": self.tool,
            "agent": self.agent,
            "anyAgent": self.any_agent,
            "arguments": self.arguments,
            "grantedBy": self.granted_by,
            "grantedAt": self.granted_at,
            "expiresAt": self.expires_at,
            "note": self.note,
            "revokedAt": self.revoked_at,
            "revokedBy": self.revoked_by,
            "uses": self.uses,
        }


MAX_TTL_S: Final = 100 * 365 * 24 * 3600
"""The longest ``ttl_s`` a grant takes (a hundred years); one that should never expire has none."""


def _check_ttl(ttl_s: object) -> None:
    if ttl_s is None or ((type(ttl_s) is int or type(ttl_s) is float) and 0 < ttl_s <= MAX_TTL_S):
        return
    # Past what a calendar shows (1e300 s), the grant was written and then every description of it failed.
    raise ValueError(f"ttl_s must be a positive finite number of seconds, at most 100 years, or None, got {ttl_s!r}")


def _timestamp(epoch: float) -> str:
    try:
        return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))
    except (OverflowError, OSError, ValueError):  # a file from elsewhere may hold any finite time
        return f"{epoch:.6g} s after 1970"


class _Malformed(Exception):
    pass


def _text(data: Mapping[str, Any], key: str, *, optional: bool = False) -> Any:
    value = data.get(key)
    if value is None and optional:
        return None
    if type(value) is not str or not value:
        raise _Malformed(f"{key} must be a non-empty string, got {safe_repr(value)}")
    return value


def _number(data: Mapping[str, Any], key: str, *, optional: bool = False) -> Any:
    value = data.get(key)
    if value is None and optional:
        return None
    if type(value) is not int and type(value) is not float:
        raise _Malformed(f"{key} must be a number, got {safe_repr(value)}")
    try:
        return float(value)
    except OverflowError:  # an int past float's range: no time or count this file means
        raise _Malformed(f"{key} must be a number a float can hold, got {safe_repr(value)}") from None


def _apply(grants: dict[str, StandingGrant], event_type: str, data: Mapping[str, Any]) -> None:
    """Fold one event into ``grants``: the same transition for loading and for live writes."""
    if event_type == _ADDED:
        grant_id = _text(data, "id")
        if grant_id in grants:
            raise _Malformed(f"grant {grant_id} is added twice")
        arguments = data.get("arguments")
        if arguments is not None and not isinstance(arguments, FrozenDict):
            raise _Malformed(f"arguments must be an object or null, got {safe_repr(arguments)}")
        any_agent = data.get("anyAgent")
        if type(any_agent) is not bool:
            raise _Malformed(f"anyAgent must be true or false, got {safe_repr(any_agent)}")
        note = data.get("note")
        if note is not None and type(note) is not str:
            raise _Malformed(f"note must be a string or null, got {safe_repr(note)}")
        # A compacted file carries the count of the uses it left in its archive.
        uses = data.get("uses", 0)
        if type(uses) is not int or uses < 0:
            raise _Malformed(f"uses must be a non-negative integer, got {safe_repr(uses)}")
        grants[grant_id] = StandingGrant(
            id=grant_id,
            tool=_text(data, "tool"),
            agent=_text(data, "agent", optional=True),
            any_agent=any_agent,
            arguments=arguments,
            granted_by=_text(data, "grantedBy"),
            granted_at=_number(data, "grantedAt"),
            expires_at=_number(data, "expiresAt", optional=True),
            note=note,
            uses=uses,
        )
        return
    if event_type not in (_REVOKED, _USED):
        raise _Malformed(f"unknown event type {safe_repr(event_type)} (not a grants file?)")
    grant_id = _text(data, "id")
    grant = grants.get(grant_id)
    if grant is None:
        raise _Malformed(f"{event_type} names grant {grant_id}, which was never added")
    if event_type == _REVOKED:
        grants[grant_id] = attrs.evolve(grant, revoked_at=_number(data, "at"), revoked_by=_text(data, "by"))
    else:
        grants[grant_id] = attrs.evolve(grant, uses=grant.uses + 1)


def _load_read(path: str) -> tuple[dict[str, StandingGrant], SessionLogRead]:
    try:
        read = read_session_log(path)
    except SessionLogError as exc:
        if exc.not_regular is not None:
            raise GrantError(f"{path} is {exc.not_regular}, not a regular file; a grants file must be one") from None
        raise GrantError(f"the grants file is damaged: {exc}") from None
    grants: dict[str, StandingGrant] = {}
    for event in read.events:
        try:
            _apply(grants, event.type, event.data)
        except _Malformed as exc:
            raise GrantError(f"{path}: event seq {event.seq}: {exc}") from None
    # A torn last line is a write another process has not finished (or a crash
    # cut short): it is not part of the book until it is whole.
    return grants, read


def unmatchable_arguments(runtime: ToolRuntime, tool: str, arguments: Mapping[str, object] | None) -> tuple[str, ...]:
    """Why a grant of ``tool`` for exactly ``arguments`` could answer no call ``runtime`` makes.

    The pipeline asks for approval only once a call's arguments satisfy its
    tool's parameter schema, and a grant covers only arguments equal to its
    own: arguments the schema refuses are never equal to a call's. The answer
    is the schema's violations, or ``()`` when some registration of ``tool``
    (in any scope) accepts them, the tool is not registered, or the grant
    covers any arguments.
    """
    if arguments is None:
        return ()
    violations: list[str] = []
    for _, definition in runtime.registrations():
        if definition.name != tool:
            continue
        try:
            found = validate_json_schema_value(definition.parameters, arguments, "")
        except JsonSchemaError:  # a schema the registry would refuse; nothing to say about the grant
            return ()
        if not found:
            return ()
        violations.extend(v for v in found if v not in violations)
    return tuple(violations)


def read_grants(path: str | os.PathLike[str]) -> tuple[StandingGrant, ...]:
    """Every grant in the file at ``path`` (revoked and expired ones too), in the order granted.

    Raises:
        GrantError: the file is damaged or is not a grants file.
        OSError: the file cannot be read.
    """
    return tuple(_load_read(os.fspath(path))[0].values())


class GrantBook:
    """The standing grants of one deployment, in a shared append-only file or in memory.

    ``GrantBook("grants.jsonl")`` reads the file (creating it on the first
    write); ``GrantBook()`` keeps grants for the life of the object only.
    ``clock`` gives wall-clock epoch seconds (for expiry and the audit times).

    Raises:
        GrantError: the file is damaged or is not a grants file.
        OSError: the file exists but cannot be read.
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, *, clock: Clock = time.time) -> None:
        self.path = None if path is None else os.path.abspath(os.fspath(path))
        self._clock = clock
        self._grants: dict[str, StandingGrant] = {}
        self._seen: _Stamp | None = None
        # The file as last read (its last event and end offset): where the next read starts.
        self._read: SessionLogRead | None = None
        self._tail = b""  # the bytes just before that offset, to tell an append from a rewrite
        # GrantingApproval works on worker threads (file I/O and fsync stay off the event loop).
        self._mutex = threading.RLock()
        if self.path is not None:
            directory = os.path.dirname(self.path)
            if not os.path.isdir(directory):
                raise GrantError(f"cannot use the grants file {self.path}: the directory {directory} does not exist")
            self._refresh()

    # --- reading -----------------------------------------------------------------------

    def grants(self, *, include_inactive: bool = False) -> tuple[StandingGrant, ...]:
        """The grants in force now (every grant ever made with ``include_inactive=True``)."""
        with self._mutex:
            self._refresh()
            now = self._clock()
            return tuple(grant for grant in self._grants.values() if include_inactive or grant.active(now))

    def get(self, grant_id: str) -> StandingGrant | None:
        with self._mutex:
            self._refresh()
            return self._grants.get(grant_id)

    def diagnostics(self, runtime: ToolRuntime) -> list[str]:
        """Warnings for ``dsh-tools check``: grants in force that can answer no call of ``runtime``.

        A grant for a tool ``runtime`` does not register, or for arguments its
        parameter schema refuses (see :func:`unmatchable_arguments`), is
        harmless, but it is most likely a misspelt name (``dsh-tools grants add
        FILE shel``) or argument, and the call it was meant for is still asked
        about every time.
        """
        known = {definition.name for _, definition in runtime.registrations()} | {RUN_CODE_NAME}
        warnings = []
        for grant in self.grants():
            if grant.tool not in known:
                warnings.append(
                    f'grant {grant.id} is for tool "{grant.tool}", which is not registered, so it never applies '
                    "(revoke it and grant the tool's exact name)"
                )
            elif violations := unmatchable_arguments(runtime, grant.tool, grant.arguments):
                warnings.append(
                    f'grant {grant.id} for tool "{grant.tool}" names arguments its parameter schema refuses, so it '
                    f"never applies: {'; '.join(violations)} (revoke it and grant arguments a call can have)"
                )
        return warnings

    def find(self, execution: ToolExecution) -> StandingGrant | None:
        """The oldest grant in force that covers ``execution``, or ``None``."""
        with self._mutex:
            self._refresh()
            now = self._clock()
            return next((grant for grant in self._grants.values() if grant.covers(execution, now)), None)

    # --- writing -----------------------------------------------------------------------

    def grant(
        self,
        tool: str,
        *,
        granted_by: str,
        agent: str | None = None,
        any_agent: bool = False,
        arguments: Mapping[str, object] | None = None,
        ttl_s: float | None = None,
        note: str | None = None,
    ) -> StandingGrant:
        """Record a new grant and return it.

        ``agent`` is a :func:`~dsh_core.scope_id` (``None``: calls made
        without an agent); ``any_agent=True`` covers every agent instead
        (``agent`` must then be ``None``);
        ``arguments`` the exact arguments a call must have (``None``: any
        arguments; they are snapshotted, so they must be lossless JSON); ``ttl_s``
        how long it lasts (``None``: until revoked).

        Raises:
            ValueError: an empty ``tool`` or ``granted_by``, or a ``ttl_s`` that
                is not a positive finite number.
            NonJsonValueError: ``arguments`` are not lossless JSON.
        """
        candidate = self._candidate(tool, granted_by, agent, any_agent, arguments, ttl_s, note)
        return self._add(candidate, wait=True)

    def _candidate(
        self,
        tool: str,
        granted_by: str,
        agent: str | None,
        any_agent: bool,
        arguments: Mapping[str, object] | None,
        ttl_s: float | None,
        note: str | None,
    ) -> StandingGrant:
        """The grant :meth:`grant` records, checked and built (nothing written yet)."""
        if type(tool) is not str or not tool:
            raise ValueError(f"tool must be a non-empty str, got {tool!r}")
        if type(granted_by) is not str or not granted_by:
            raise ValueError(f"granted_by must be a non-empty str, got {granted_by!r}")
        if agent is not None and (type(agent) is not str or not agent):
            raise ValueError(f"agent must be a non-empty str or None, got {agent!r}")
        if type(any_agent) is not bool:
            raise ValueError(f"any_agent must be a bool, got {safe_repr(any_agent)}")
        if any_agent and agent is not None:
            raise ValueError(f"a grant for every agent names no agent, got agent={agent!r}")
        if note is not None and type(note) is not str:
            raise ValueError(f"note must be a str or None, got {safe_repr(note)}")
        _check_ttl(ttl_s)
        if arguments is not None and not isinstance(arguments, Mapping):
            raise ValueError(f"arguments must be a mapping or None, got {type(arguments).__name__}")
        now = self._clock()
        frozen = None if arguments is None else snapshot_json(dict(arguments))
        assert frozen is None or isinstance(frozen, FrozenDict)
        return StandingGrant(
            id=f"g-{uuid.uuid4().hex[:12]}",
            tool=tool,
            agent=agent,
            any_agent=any_agent,
            arguments=frozen,
            granted_by=granted_by,
            granted_at=now,
            expires_at=None if ttl_s is None else now + ttl_s,
            note=note,
        )

    def _add(self, candidate: StandingGrant, *, wait: bool) -> StandingGrant:
        """Record ``candidate``; raises :class:`_Busy` without waiting when ``wait`` is false and the lock is held."""
        with self._locked(wait=wait):
            self._append(_ADDED, _added_data(candidate))
            grant = self._grants[candidate.id]
        logger.info("standing grant %s added by %s: %s", grant.id, grant.granted_by, grant.describe())
        return grant

    def revoke(self, grant_id: str, *, by: str) -> StandingGrant:
        """Take back grant ``grant_id``; from now on it allows nothing.

        Raises:
            GrantError: there is no such grant, or it was already revoked.
        """
        if type(by) is not str or not by:
            raise ValueError(f"by must be a non-empty str, got {by!r}")
        with self._locked():
            grant = self._grants.get(grant_id)
            if grant is None:
                raise GrantError(f"there is no grant {grant_id!r}")
            if grant.revoked_at is not None:
                raise GrantError(f"grant {grant_id} was already revoked by {grant.revoked_by}")
            self._append(_REVOKED, {"id": grant_id, "by": by, "at": self._clock()})
            revoked = self._grants[grant_id]
        logger.info("standing grant %s revoked by %s", grant_id, by)
        return revoked

    def use(self, execution: ToolExecution) -> StandingGrant | None:
        """The grant in force that covers ``execution``, its use recorded; ``None`` when none does.

        Looking up and recording happen under the file's lock, so a grant
        revoked by another process a moment earlier is not used.
        """
        return self._use(execution, wait=True)

    def _use(self, execution: ToolExecution, *, wait: bool) -> StandingGrant | None:
        """:meth:`use`; raises :class:`_Busy` without waiting when ``wait`` is false and the lock is held."""
        with self._locked(wait=wait):
            now = self._clock()
            grant = next((grant for grant in self._grants.values() if grant.covers(execution, now)), None)
            if grant is None:
                return None
            self._append(
                _USED,
                {
                    "id": grant.id,
                    "callId": execution.call_id,
                    "name": execution.name,
                    "agent": scope_id(execution.agent),
                    "at": now,
                },
            )
            return self._grants[grant.id]

    def compact(self, archive: str | os.PathLike[str] | None = None) -> str | None:
        """Copy the file's history to ``archive`` and keep only the grants in force, with their use counts.

        The grants file grows by a line for every use. Compacting keeps the
        file as it is under the name ``archive`` (default ``<path>.<UTC
        time>``; a hard link, or a ``0600`` copy where links fail), the
        complete audit trail, and replaces the grants file in one atomic step
        with one holding a ``grant/added`` line per grant still in force,
        carrying its ``uses``; revoked and expired grants stay in the archive
        only. There is never a moment without a grants file, and the lock is
        held throughout, so a grant written by another host waits and lands in
        the new file; hosts sharing the file see it at their next lookup.
        Returns the archive's path (``None`` for a book without a file, or a
        file that does not exist yet).

        Raises:
            GrantError: the archive exists already.
            OSError: the directory cannot be written (the grants file is then
                left as it was).
        """
        if self.path is None:
            return None
        with self._locked():
            if not os.path.exists(self.path):
                return None
            moved = (
                os.fspath(archive)
                if archive is not None
                else f"{self.path}.{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}"
            )
            if os.path.exists(moved):
                raise GrantError(f"the archive {moved} exists already")
            now = self._clock()
            kept = [grant for grant in self._grants.values() if grant.active(now)]
            # A name nobody can guess, and the file checked to be the one written before it is
            # installed: at "<path>.compacting" the model's write_file (the name is no kept file)
            # swapped in a forged grants file, which the rename then put in force.
            directory, base = os.path.split(self.path)
            for leftover in _compaction_leftovers(directory, base):
                with contextlib.suppress(OSError):
                    os.unlink(leftover)  # left by a compaction that crashed: never in force
            fresh = os.path.join(directory, f".{base}.compacting-{uuid.uuid4().hex}")
            _create_private(fresh)
            made = os.lstat(fresh)
            with SessionLog(fresh, fsync="always") as log:
                for grant in kept:
                    log.append({"type": _ADDED, "data": _added_data(grant)})
            try:
                written = os.lstat(fresh)
            except FileNotFoundError:
                written = None
            if written is None or not os.path.samestat(made, written) or written.st_nlink != 1:
                with contextlib.suppress(OSError):
                    os.unlink(fresh)
                raise GrantError(
                    f"the compacted grants file {fresh} was replaced while it was written; "
                    f"{self.path} was left as it was"
                )
            _archive(self.path, moved)
            try:
                # One rename over the old file: a crash leaves either the old file or the new one.
                os.replace(fresh, self.path)
            except BaseException:
                for leftover in (moved, fresh):  # as if nothing happened: compacting again may reuse the name
                    with contextlib.suppress(OSError):
                        os.unlink(leftover)
                raise
            _sync_directory(self.path)
            self._grants, self._read = _load_read(self.path)
            self._tail = _tail(self.path, self._read.end)
            self._seen = _stamp(self.path)
        logger.info("grants file %s compacted: %d grant(s) in force kept, history in %s", self.path, len(kept), moved)
        return moved

    def _append(self, event_type: str, data: dict[str, Any]) -> None:
        # Validate and fold first: a line that would not load again is never written.
        snapshot = snapshot_json(data)
        assert isinstance(snapshot, FrozenDict)
        updated = dict(self._grants)
        try:
            _apply(updated, event_type, snapshot)
        except _Malformed as exc:
            raise GrantError(str(exc)) from None
        if self.path is not None:
            _create_private(self.path)  # SessionLog would create it readable by all (the umask's mode)
            # Written (and fsynced) before it counts: a failed write leaves the book as it was.
            with SessionLog(self.path, fsync="always") as log:
                if log.torn is not None:
                    logger.warning("grants file %s: cutting off a torn last line: %s", self.path, log.torn)
                seq = log.append({"type": event_type, "data": snapshot})
            self._seen = stamp = _stamp(self.path)
            assert stamp is not None  # just written, under the lock: nobody else writes now
            # This book has seen the file up to its own line: later reads pick up after it.
            self._read = SessionLogRead(
                events=(SessionEvent(seq=seq, type=event_type, data=snapshot),), torn=None, end=stamp.size
            )
            self._tail = _tail(self.path, stamp.size)
        self._grants = updated

    @contextmanager
    def _locked(self, *, wait: bool = True) -> Iterator[None]:
        """Hold this book's mutex and the file's lock, and see everything written before they were taken.

        Raises :class:`_Busy` instead of waiting for either when ``wait`` is false.
        """
        if not self._mutex.acquire(blocking=wait):
            raise _Busy
        try:
            if self.path is None:
                yield
                return
            fd = _lock(self.path, wait=wait)
            try:
                self._refresh()
                yield
            finally:
                os.close(fd)
        finally:
            self._mutex.release()

    def _refresh(self) -> None:
        """Catch up with what other writers appended since this book last saw the file.

        Reads only the new lines (the file is append-only); a file that shrank
        or was replaced is read again whole.
        """
        if self.path is None:
            return
        stamp = _stamp(self.path)
        if stamp == self._seen:
            return
        read = self._read
        if stamp is None:
            self._grants, self._read = {}, None
        elif read is not None and stamp.size >= read.end and _tail(self.path, read.end) == self._tail:
            try:
                self._follow(read_session_log(self.path, after=read))
            except (SessionLogError, GrantError):
                self._grants, self._read = _load_read(self.path)
        else:
            # Shorter, or not the bytes this book read last: not an append, so read it all again.
            self._grants, self._read = _load_read(self.path)
        if self._read is not None:
            self._tail = _tail(self.path, self._read.end)
        self._seen = stamp

    def _follow(self, new: SessionLogRead) -> None:
        grants = dict(self._grants)
        for event in new.events:
            try:
                _apply(grants, event.type, event.data)
            except _Malformed as exc:
                raise GrantError(f"{self.path}: event seq {event.seq}: {exc}") from None
        assert self._read is not None
        last = new.events[-1:] or self._read.events
        self._grants, self._read = grants, SessionLogRead(events=last, torn=None, end=new.end)


async def _unblocked(work: Callable[[], _T]) -> _T:
    """``work`` (a book operation that takes the lock without waiting) on a worker thread, until the lock is free.

    The book reads, locks and fsyncs a file: on a worker thread, never on the
    event loop. A thread blocked on a lock another process holds could be
    neither cancelled nor abandoned (abandoned, it would still record what the
    call no longer wants), so the waiting happens here, where the call's
    cancellation can end it.
    """
    pause = _LOCK_POLL_FIRST_S
    while True:
        try:
            return await trio.to_thread.run_sync(work)
        except _Busy:
            await trio.sleep(pause)
            pause = min(pause * 2, _LOCK_POLL_MAX_S)


class _Busy(Exception):
    """The book's lock is held (by another process, or another thread here), and the taker would not wait."""


def _lock(path: str, *, wait: bool = True) -> int:
    """Take ``<path>.lock`` exclusively (creating it ``0600``), waiting for other holders; returns its fd.

    Raises :class:`_Busy` instead of waiting when ``wait`` is false.

    The lock lives in a file of its own, not in the grants file: ``compact``
    replaces the grants file, and a lock on the replaced file would lock
    nothing. Taking it never creates the grants file either.
    """
    fd = os.open(path + LOCK_SUFFIX, os.O_RDWR | os.O_CREAT | _CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise _Busy from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def _compaction_leftovers(directory: str, base: str) -> list[str]:
    prefix = f".{base}.compacting-"
    try:
        return [os.path.join(directory or ".", name) for name in os.listdir(directory or ".") if name.startswith(prefix)]
    except OSError:
        return []


def _create_private(path: str) -> None:
    """Create ``path`` empty and ``0600`` unless it exists, its directory entry on disk: grants are not for all."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _CLOEXEC, 0o600)
    except FileExistsError:
        return
    os.close(fd)
    _sync_directory(path)


def _archive(path: str, archive: str) -> None:
    """Give the file at ``path`` the name ``archive`` too: a hard link, or a ``0600`` copy where links fail."""
    try:
        os.link(path, archive)
    except FileExistsError:
        raise GrantError(f"the archive {archive} exists already") from None
    except OSError:  # another file system (EXDEV), or one without hard links
        try:
            fd = os.open(archive, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _CLOEXEC, 0o600)
        except FileExistsError:
            raise GrantError(f"the archive {archive} exists already") from None
        try:
            with open(fd, "wb") as target, open(path, "rb") as source:
                shutil.copyfileobj(source, target)
                target.flush()
                os.fsync(target.fileno())
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(archive)  # a partial archive is no audit trail
            raise
    _sync_directory(os.path.abspath(archive))  # a bare file name has no directory part to open


_TAIL_BYTES: Final = 64


def _tail(path: str, end: int) -> bytes:
    """The (up to) 64 bytes of ``path`` before offset ``end``."""
    with open(path, "rb") as file:
        start = max(0, end - _TAIL_BYTES)
        file.seek(start)
        return file.read(end - start)


def _offer_text(grant: StandingGrant | GrantError) -> str:
    """The "always" choice of an approval question, stating the grant an answer records (or why none can be)."""
    if isinstance(grant, GrantError):
        return f"a = grant: none can be recorded for this call ({grant})"
    return f"a = grant: always allow {grant.describe(arguments='only these exact arguments')} (recorded, revocable)"


def _added_data(grant: StandingGrant) -> dict[str, Any]:
    """The ``grant/added`` line of ``grant``: its JSON form without revocation, ``uses`` only when counted."""
    data = grant.to_json()
    del data["revokedAt"], data["revokedBy"]
    if not grant.uses:
        del data["uses"]
    return data


def _sync_directory(path: str) -> None:
    directory = os.open(os.path.dirname(path), os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


class _Stamp(NamedTuple):
    """What tells one version of the file from another.

    Size and mtime alone missed a compaction (a new file of the same size within one
    coarse mtime tick), and a grant revoked before it stayed in force.
    """

    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int


def _stamp(path: str) -> _Stamp | None:
    try:
        status = os.stat(path)
    except FileNotFoundError:
        return None
    return _Stamp(status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns, status.st_ctime_ns)


Scope = Literal["tool", "arguments"]


class GrantingApproval:
    """An approval service that answers from standing grants and turns "always" into one.

    ``GrantingApproval(TerminalApproval(report_always=True), GrantBook("grants.jsonl"))``:

    - a call a grant in force covers gets ``"allowed-once"`` without asking, and
      the use is recorded in the book;
    - otherwise ``inner`` is asked; when it answers :data:`ALLOWED_ALWAYS`, a
      grant is recorded and the call gets ``"allowed-once"``. The grant covers
      the call's tool for the call's agent (``all_agents=True``: for every
      agent), for any arguments (``scope="tool"``) or only for these exact
      arguments (``scope="arguments"``), for ``ttl_s`` seconds (``None``: until
      revoked), granted by ``granted_by``;
    - every other answer is passed on unchanged.

    Questions about one tool for one agent (for any agent, with ``all_agents``)
    are asked one at a time: a call waiting for its turn is allowed without a
    question when the answer to the one before it granted what covers it. A call already cancelled gets ``"cancelled"``
    without a lookup. When the
    book cannot be read or written (a damaged file, a full disk) the error
    propagates: the call fails instead of being allowed without its audit
    line or asked again as if nothing had been granted.

    Raises:
        ValueError: a bad ``scope`` or ``ttl_s``, or an empty ``granted_by``.
        TypeError: ``inner`` is not an approval service, ``book`` not a
            :class:`GrantBook`, or ``all_agents`` not a bool.
    """

    def __init__(
        self,
        inner: ApprovalService,
        book: GrantBook,
        *,
        scope: Scope = "tool",
        all_agents: bool = False,
        ttl_s: float | None = None,
        granted_by: str = "approver",
    ) -> None:
        if not isinstance(inner, ApprovalService):
            raise TypeError(f"inner must be an ApprovalService, got {type(inner).__name__}")
        # Checked now, not when the first "always" arrives: that call would fail instead of being granted.
        if not isinstance(book, GrantBook):
            raise TypeError(f"book must be a GrantBook, got {type(book).__name__}")
        if type(all_agents) is not bool:
            raise TypeError(f"all_agents must be a bool, got {all_agents!r}")
        if type(granted_by) is not str or not granted_by:
            raise ValueError(f"granted_by must be a non-empty str (who answers), got {granted_by!r}")
        if scope not in ("tool", "arguments"):
            raise ValueError(f"scope must be 'tool' or 'arguments', got {scope!r}")
        _check_ttl(ttl_s)
        self.inner = inner
        self.book = book
        self.scope: Scope = scope
        self.all_agents = all_agents
        self.ttl_s = ttl_s
        self.granted_by = granted_by
        # Per tool (and agent), the questions asked or waiting to be: one at a time, so the answer
        # to one (a grant) covers the others instead of their being asked (and granted) again.
        self._asking: dict[tuple[str, str | None], tuple[trio.Lock, list[int]]] = {}

    @property
    def kept_files(self) -> dict[str, str]:
        """The grants file and its lock, which the runtime's file tools refuse to write.

        A forged line in the file would be a grant; a lock file replaced by another
        would let two writers append at once, and a torn file answers no one.
        """
        if self.book.path is None:
            return {}
        return {self.book.path: "the standing grants file", self.book.path + LOCK_SUFFIX: "the standing grants file's lock"}

    async def standing_answer(self, execution: ToolExecution) -> str | None:
        """``"allowed-once"`` when a grant in force covers the call (its use recorded), else ``None``.

        What hosts that ask someone else first consult (``serve_registry`` asks
        the MCP client only about calls no grant covers).
        """
        if execution.signal.cancelled:
            return "cancelled"
        grant = await _unblocked(functools.partial(self.book._use, execution, wait=False))
        return None if grant is None else "allowed-once"

    def offer(self, execution: ToolExecution) -> str:
        """What answering "always" would grant for this call, as the approval question states it.

        Built from the very grant :meth:`request` would record, so the question
        cannot promise more or less than the grant covers.
        """
        try:
            grant = self._grant_for(execution)
        except GrantError as exc:
            return _offer_text(exc)
        return _offer_text(grant)

    def _grant_for(self, execution: ToolExecution) -> StandingGrant:
        """The grant an "always" answer for ``execution`` records (nothing written yet)."""
        arguments = execution.arguments if self.scope == "arguments" else None
        if arguments is not None and not isinstance(arguments, Mapping):
            raise GrantError(f"cannot grant call {execution.call_id}: its arguments are not an object")
        return self.book._candidate(
            execution.name,
            self.granted_by,
            None if self.all_agents else scope_id(execution.agent),
            self.all_agents,
            arguments,
            self.ttl_s,
            f"answered for call {execution.call_id}",
        )

    async def request(self, execution: ToolExecution, reason: str | None) -> str:
        standing = await self.standing_answer(execution)
        if standing is not None:
            return standing
        # The calls one answer could cover: of this tool, and of this agent unless grants cover every agent.
        covered_together = (execution.name, None if self.all_agents else scope_id(execution.agent))
        async with self._turn(covered_together) as waited:
            if waited:
                # A grant recorded while this call waited for its turn covers it too.
                standing = await self.standing_answer(execution)
                if standing is not None:
                    return standing
            return await self._ask(execution, reason)

    @contextlib.asynccontextmanager
    async def _turn(self, covered_together: tuple[str, str | None]) -> AsyncIterator[bool]:
        """Hold the turn to ask about these calls (yields whether another had it first); forgotten when none waits."""
        lock, holders = self._asking.setdefault(covered_together, (trio.Lock(), [0]))
        waited = holders[0] > 0
        holders[0] += 1
        try:
            async with lock:
                yield waited
        finally:
            holders[0] -= 1
            if not holders[0]:
                del self._asking[covered_together]

    async def _ask(self, execution: ToolExecution, reason: str | None) -> str:
        # The very grant the question states is the one recorded: built again after the answer,
        # its expiry counted from the answer, an hour late, outlived what the person read.
        candidate: StandingGrant | GrantError
        try:
            candidate = self._grant_for(execution)
        except GrantError as exc:
            candidate = exc
        offered = _ALWAYS_OFFER.set(_offer_text(candidate))
        try:
            answer = await self.inner.request(execution, reason)
        finally:
            _ALWAYS_OFFER.reset(offered)
        if answer != ALLOWED_ALWAYS:
            return answer
        if execution.signal.cancelled:
            return "cancelled"
        if isinstance(candidate, GrantError):
            raise candidate
        book = self.book
        await _unblocked(functools.partial(book._add, candidate, wait=False))
        # The call the grant was answered for is its first use, so the audit trail
        # lists every call a grant let through. The person allowed this call
        # either way: it proceeds even if another process revoked the grant already.
        await _unblocked(functools.partial(book._use, execution, wait=False))
        return "allowed-once"
