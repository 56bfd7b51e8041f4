"""The spill policy: move oversized text results out of the model's context into files.

Enable it through the ``spill`` entry point; configure it in ``[plugins.spill]``::

    [plugins.spill]
    max_inline_bytes = 32768          # UTF-8 bytes; omit it and the plugin does nothing
    directory = "/var/tmp/dsh-spill"  # default: a private directory per runtime, see below
    read_tool = true                  # register read_spilled_output (default)
    exempt_tools = ["read_file"]      # tools whose answers are never spilled (default)

Without ``max_inline_bytes`` the plugin registers nothing. A value that is not
a non-negative integer fails the load with a ``ConfigError``.

**Where spills go.** Without ``directory``, each runtime gets a private
directory of its own, made on its first spill by ``tempfile.mkdtemp``
(``<system temp dir>/dsh-spill-<random>``, mode ``0700``): no other user can
claim its name first, and no other session can read its files through
``read_spilled_output``. It is not removed at exit, and a new process does not
read the old one's spills back: configure ``directory`` for spills that outlive
the process. A configured directory is created ``0700`` if missing; it must be
a directory of the current user, not a symlink, that group and others cannot
write to (the reader shows whatever it holds). Otherwise nothing is spilled:
a warning is logged and oversized results stay inline.

**What is bounded.** The model-facing content of a *top-level* call
(``execution.parent is None``) whose accepted decision keeps the value (an
``Accept`` without ``value=``; never a ``Block``), when every content block is
text and their texts (joined by newlines) exceed ``max_inline_bytes``. Also,
through ``dsh_code_dispatch_log``, the *logged copy* of each ``run_code``
sub-call's content, when the runtime has an ``event_sink`` to log it to
(without one there is no log, and nothing is written for it). Images, mixed
content and content within the cap are left alone, and so are nested calls in
post-execute (their content is not model context: the program gets the value).
The answers of the tools named in ``exempt_tools`` (names as registered,
prefixes included) and of the spill reader are never spilled either: a file
reader that reads a spill file back would otherwise spill it again. They are
bounded in the dispatch log all the same (a log copy is not model context).

**What it becomes.** The full text is written to
``<directory>/<call id>-<tool>-<random>.txt`` (the sub-call id for the dispatch
log; unsafe characters become ``_``; ``<random>`` is six hex digits, so call ids
that repeat never run out of names and a name cannot be guessed from its call
id; an existing file is never overwritten; files are created ``0600`` in a
``0700`` directory, since results may hold secrets; the text is saved as UTF-8,
a lone surrogate as U+FFFD, and the preview shows the same). The content is
replaced by one text block: the head of the text, a notice, and its tail::

    <head>

    [41877 of 52000 bytes omitted here. The full output (1311 lines, 52000 bytes)
    is saved at /var/tmp/dsh-spill/call-7-grep-3f9a1c.txt; read it in parts (a range
    of lines, or a search) rather than all at once.]

    <tail>

The replacement never exceeds ``max_inline_bytes`` (head and tail are cut on
UTF-8 character boundaries); if even the notice alone does not fit, the
original content is kept, the file is removed and a warning is logged. The
canonical value, the meta and the decision's ``additional_contexts`` are never
touched. A failure of the spill machinery (``OSError`` while saving) is logged
as a warning and keeps the original content: spilling never turns a success
into an error. A call cancelled while its output is being saved (the call ends
``ABORTED``, or the listener is cancelled) leaves no file behind: the save runs
to its end in its thread, then the file is removed.

**Reading it back.** Unless ``read_tool = false``, the plugin also registers
``read_spilled_output`` and the notice names it: the model reads a spilled
output in windows of numbered lines (``start_line``, ``max_lines``) or only the
lines containing a text (``contains``), from files directly inside the spill
directory only. Its answers fit the same ``max_inline_bytes`` and are never
spilled themselves: a line too long for one answer is cut (listed in
``cut_lines``), and the answer's ``next_line`` and ``next_column`` say where the
next window reads on inside it (``start_column``); a search goes on at the next
line instead.
Called from a ``run_code`` program, it sizes its window so that the value fits
too when the program returns it (``run_code`` shows it as indented JSON, larger
than the text rendering): following the notice in Code Mode ends.

**Order.** Both listeners are ``tryfirst`` (outermost) and call ``next()``
first, so they bound whatever inner listeners and tools produced.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import secrets
import tempfile
import threading
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Annotated, Any, Final

import attrs
import trio

from dsh_core import (
    UNSET,
    Accept,
    ContentBlock,
    PostToolDecision,
    TableCheck,
    TextBlock,
    ToolExecution,
    ToolExecutionResult,
    ToolRuntime,
    check_validator,
    hookimpl,
    structure_table,
    well_formed_text,
)
from dsh_core.code_mode import CodeDispatchLog

from ._file_settings import PathSetting, kept_path
from ._settings_warnings import register_settings_warnings, report_inert_keys, unknown_tool_warnings
from ._spill_read import READ_TOOL_NAME, read_tool, untrusted_directory

__all__ = ["PLUGIN_NAME", "SpillPolicy", "SpillSettings", "SpillStore", "bounded_replacement"]

# Capability manifest (enforced under strict_capabilities): it may replace the content of any oversized result.
DSH_CAPABILITIES: dict[str, list[str]] = {"tools": [READ_TOOL_NAME], "affects": ["*"]}

PLUGIN_NAME: Final = "spill-policy"

logger = logging.getLogger("dsh_plugins.spill")

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
_MAX_NAME: Final = 120
# Random names to try before giving up: with 16.7 million per call id and tool, a taken one is rare.
NAME_ATTEMPTS: Final = 4
_FILE_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)


def _non_negative_problem(value: int) -> str | None:
    return f"must be a non-negative integer (got {value})" if value < 0 else None


def _tool_names_problem(value: tuple[str, ...]) -> str | None:
    return "lists tool names; an empty one exempts nothing" if "" in value else None


@attrs.frozen(kw_only=True)
class SpillSettings:
    """The ``[plugins.spill]`` table."""

    max_inline_bytes: Annotated[int, TableCheck(_non_negative_problem)] | None = attrs.field(
        default=None, validator=check_validator(_non_negative_problem)
    )
    directory: PathSetting | None = attrs.field(default=None, validator=kept_path)
    read_tool: bool = True
    # Readers of files: reading a spill file back with one must not spill it again.
    exempt_tools: Annotated[tuple[str, ...], TableCheck(_tool_names_problem)] = attrs.field(
        default=("read_file",), validator=check_validator(_tool_names_problem)
    )


# --- sizes and previews --------------------------------------------------------------------


def _utf8(text: str) -> bytes:
    # surrogatepass: a lone surrogate (JSON allows "\ud800") is sized, not an error.
    return text.encode("utf-8", errors="surrogatepass")


def _is_continuation(byte: int) -> bool:
    return 0x80 <= byte <= 0xBF


def _head(data: bytes, size: int) -> bytes:
    cut = min(size, len(data))
    while 0 < cut < len(data) and _is_continuation(data[cut]):
        cut -= 1
    return data[:cut]


def _tail(data: bytes, size: int) -> bytes:
    start = max(0, len(data) - size)
    while start < len(data) and _is_continuation(data[start]):
        start += 1
    return data[start:]


def _count_lines(text: str) -> int:
    return text.count("\n") + (1 if text and not text.endswith("\n") else 0)


def bounded_replacement(text: str, cap: int, locator: str, reader: str | None = None) -> str | None:
    """Head, notice and tail of ``text`` within ``cap`` UTF-8 bytes, or ``None`` when the notice alone does not fit.

    The notice names ``locator``, the total size in bytes and lines, how many
    bytes were left out between head and tail, and the tool to read it with
    (``reader``), when there is one.
    """
    how = f"with {reader} " if reader is not None else ""
    data = _utf8(text)
    total = len(data)
    lines = _count_lines(text)

    def notice(omitted: int) -> str:
        return (
            f"[{omitted} of {total} bytes omitted here. The full output ({lines} line{'' if lines == 1 else 's'}, "
            f"{total} bytes) is saved "
            f"at {locator}; read it in parts {how}(a range of lines, or a search) rather than all at once.]"
        )

    # Price the notice with the largest omitted count it can show, plus both "\n\n" joins.
    budget = cap - len(_utf8(notice(total))) - 4
    head = _head(data, (budget + 1) // 2) if budget > 0 else b""
    tail = _tail(data, budget // 2) if budget > 0 else b""
    parts = [part.decode("utf-8", errors="surrogatepass") for part in (head, tail)]
    middle = notice(total - len(head) - len(tail))
    replacement = "\n\n".join(part for part in (parts[0], middle, parts[1]) if part)
    if len(_utf8(replacement)) > cap:
        return None
    return replacement


def _all_text(content: Sequence[ContentBlock]) -> str | None:
    if not content or not all(isinstance(block, TextBlock) for block in content):
        return None
    return "\n".join(block.text for block in content if isinstance(block, TextBlock))


# --- the store -----------------------------------------------------------------------------


def _safe_name(call_id: str, tool: str) -> str:
    name = _UNSAFE.sub("_", f"{call_id}-{tool}").lstrip(".")[:_MAX_NAME]
    return name or "result"


class SpillStore:
    """Writes spilled texts as files in one directory.

    ``directory`` is a configured path, created ``0700`` on first use, or
    ``None``: a private directory of this store's own, made by
    ``tempfile.mkdtemp`` (``<system temp dir>/dsh-spill-<random>``, ``0700``) on
    the first spill. Either way it must be a directory of the current user, not
    a symlink, that nobody else may write to.
    """

    def __init__(self, directory: str | None = None) -> None:
        # Absolute and without a trailing slash: the reader compares the directory a notice names.
        self._configured = os.path.abspath(directory) if directory is not None else None
        self._private: str | None = None
        self._making = threading.Lock()  # saves run in worker threads: make one private directory, not two

    @property
    def directory(self) -> str | None:
        """Where spills are saved; ``None`` until the private directory is made."""
        return self._configured if self._configured is not None else self._private

    def _ready_directory(self) -> str:
        if self._configured is not None:
            os.makedirs(self._configured, mode=0o700, exist_ok=True)
            directory = self._configured
        else:
            with self._making:
                if self._private is not None and not os.path.lexists(self._private):
                    # Removed under us (a temp cleaner ageing /tmp on a long-running host): without a
                    # new one, every later oversized result would go to the model whole.
                    self._private = None
                if self._private is None:
                    self._private = tempfile.mkdtemp(prefix="dsh-spill-")
                directory = self._private
        problem = untrusted_directory(os.lstat(directory))
        if problem is not None:
            # In a shared temp dir another user could have planted it to read our spills, or
            # to plant files of their own for the reader to show.
            raise PermissionError(f"spill directory {directory!r} {problem}")
        return directory

    def save(self, call_id: str, tool: str, text: str) -> str:
        """Write ``text`` to a new file named after the call and tool; returns its path. Blocks: run it in a thread.

        The name is ``<call id>-<tool>-<6 random hex digits>.txt``; an existing
        file is never overwritten (another random part is tried, a few times).
        The file is valid UTF-8: a lone surrogate is written as U+FFFD.

        Raises ``OSError`` when the directory or file cannot be created or written
        (a partly written file is removed), or the directory is not private.
        """
        directory = self._ready_directory()
        base = _safe_name(call_id, tool)
        # A spill file holds valid UTF-8: what the TypeScript original's encoder writes for the same string.
        data = well_formed_text(text).encode("utf-8")
        for _ in range(NAME_ATTEMPTS):
            # The random part keeps names free when call ids repeat (providers whose ids restart at
            # call_0 every session) and makes a spill's name unguessable from its call id.
            path = os.path.join(directory, f"{base}-{secrets.token_hex(3)}.txt")
            try:
                fd = os.open(path, _FILE_FLAGS, 0o600)
            except FileExistsError:
                continue  # never overwrite an earlier spill: its notice may still be in a transcript
            try:
                with os.fdopen(fd, "wb") as stream:
                    stream.write(data)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(path)
                raise
            return path
        raise FileExistsError(f"no free spill file name for {base!r} in {directory!r}")

    def discard(self, path: str) -> None:
        """Remove a spill file nobody will point at (best effort)."""
        with contextlib.suppress(OSError):
            os.unlink(path)


# --- the policy ----------------------------------------------------------------------------


class SpillPolicy:
    """The ``dsh_post_execute`` and ``dsh_code_dispatch_log`` listeners of one runtime."""

    def __init__(
        self,
        max_inline_bytes: int,
        store: SpillStore,
        *,
        reader: str | None = None,
        exempt: Iterable[str] = (),
    ) -> None:
        self.max_inline_bytes = max_inline_bytes
        self.store = store
        # The read-back tool's name, when it is registered: notices point to it, and
        # its own answers are never spilled (they are bounded by the same budget).
        self.reader = reader
        # Tools whose answers the model sees whole (the reader's too).
        self.exempt = frozenset(exempt) | ({reader} if reader is not None else set())

    async def bound(
        self,
        content: Sequence[ContentBlock],
        call_id: str,
        tool: str,
        label: str,
        unseen: Callable[[], bool] = lambda: False,
        seen_though_stopped: bool = False,
    ) -> str | None:
        """The replacement text for ``content``, or ``None`` to keep it (within the cap, not all text, or a fallback).

        ``unseen()`` tells whether the replacement can no longer reach anyone
        (the call will end ``ABORTED`` instead): asked again once the file is
        saved, which takes a while, and then the file is removed. So is a file
        whose save was cancelled, unless ``seen_though_stopped``: a failure
        whose call's signal fired stays the call's result, and post-execute
        runs under that signal's cancel scope, so its save (local, bounded
        I/O) is shielded and finished, or the whole of it would reach the model.
        """
        text = _all_text(content)
        if text is None:
            return None
        text = well_formed_text(text)
        if len(_utf8(text)) <= self.max_inline_bytes or unseen():
            return None
        saved: list[str] = []

        def save() -> str:
            path = self.store.save(call_id, tool, text)
            saved.append(path)
            return path

        try:
            if seen_though_stopped:
                with trio.CancelScope(shield=True):
                    path = await trio.to_thread.run_sync(save)
            else:
                path = await trio.to_thread.run_sync(save)
                # run_sync waits for the thread through a cancellation, which surfaces here:
                # whatever awaited this notice is going away without it.
                await trio.lowlevel.checkpoint_if_cancelled()
        except BaseException as exc:
            with trio.CancelScope(shield=True):
                for orphan in saved:
                    await trio.to_thread.run_sync(self.store.discard, orphan)
            if not isinstance(exc, Exception):
                raise
            # Not only OSError: whatever breaks in the machinery, the result it was bounding stands.
            logger.warning(
                "spill-policy: cannot save the %s of %s (%s): %s; keeping the inline content", label, tool, call_id, exc
            )
            return None
        if unseen():
            await trio.to_thread.run_sync(self.store.discard, path)
            return None
        replacement = bounded_replacement(text, self.max_inline_bytes, path, self.reader)
        if replacement is None:
            logger.warning(
                "spill-policy: the spill notice for the %s of %s (%s) exceeds max_inline_bytes=%d; keeping the inline content",
                label,
                tool,
                call_id,
                self.max_inline_bytes,
            )
            await trio.to_thread.run_sync(self.store.discard, path)
        return replacement

    @hookimpl(tryfirst=True)
    async def dsh_post_execute(
        self,
        execution: ToolExecution,
        result: ToolExecutionResult,
        next: Callable[[], Awaitable[PostToolDecision]],
    ) -> PostToolDecision:
        decision = await next()
        if not isinstance(decision, Accept) or decision.value is not UNSET or execution.parent is not None:
            return decision
        if execution.name in self.exempt:
            return decision
        content = decision.content if decision.content is not None else result.content

        def unseen() -> bool:
            # The core turns a success whose signal has fired into ABORTED, content and all.
            return execution.signal.cancelled and not result.is_error

        stopped_failure = result.is_error and execution.signal.cancelled
        replacement = await self.bound(
            content, execution.call_id, execution.name, "result", unseen, seen_though_stopped=stopped_failure
        )
        if replacement is None:
            return decision
        return Accept(content=[TextBlock(replacement)], additional_contexts=decision.additional_contexts)

    @hookimpl(tryfirst=True)
    async def dsh_code_dispatch_log(
        self, dispatch: CodeDispatchLog, next: Callable[[], Awaitable[Sequence[ContentBlock]]]
    ) -> list[ContentBlock]:
        # Called only when the runtime has an event_sink to log this copy to (the bridge runs no
        # dispatch-log listener without one), so a spill file here is always referenced.
        content = list(await next())
        replacement = await self.bound(content, dispatch.sub_call_id, dispatch.name, "dispatch")
        return content if replacement is None else [TextBlock(replacement)]


@hookimpl
def dsh_setup(runtime: ToolRuntime, config: dict[str, Any]) -> None:
    """Register a :class:`SpillPolicy` (named ``spill-policy``) when ``max_inline_bytes`` is configured."""
    settings = structure_table(SpillSettings, config, "[plugins.spill]")
    if settings.max_inline_bytes is None:
        report_inert_keys(
            runtime, "spill", config, "max_inline_bytes", "spilling is off: set max_inline_bytes to turn it on"
        )
        return
    if "exempt_tools" in config:  # the default names read_file, which a host without the files plugin lacks
        exempt = settings.exempt_tools
        register_settings_warnings(
            runtime,
            "spill",
            lambda: unknown_tool_warnings(runtime, "exempt_tools", exempt, "nothing is exempted for it"),
        )
    store = SpillStore(os.path.abspath(settings.directory) if settings.directory is not None else None)
    reader = None
    if settings.read_tool:
        # The name it was registered under: a host's [tool_prefixes] renames it, and
        # notices must name the tool the model can call.
        reader = runtime.register(read_tool(lambda: store.directory, settings.max_inline_bytes)).name
    policy = SpillPolicy(settings.max_inline_bytes, store, reader=reader, exempt=settings.exempt_tools)
    runtime.plugins.register(policy, name=PLUGIN_NAME)
