"""Approval services for ``Ask`` decisions: a terminal prompt and a non-interactive refusal.

These are services, not hooks: a host picks one and passes it as
``ToolRuntime(approval=...)`` (the CLI uses :class:`TerminalApproval` with
``--interactive`` and :class:`NonInteractiveApproval` otherwise). So this module has
no ``dsh_setup`` and no entry point: loading it as a plugin could not choose
between them, and an approval channel is a property of how the host runs, not
something a configuration table should switch on behind the host's back.

Both implement :class:`dsh_core.ApprovalService`: ``request`` returns
``"allowed-once"``, ``"denied"`` or ``"cancelled"`` (``TerminalApproval``), and
``"unavailable"`` (``NonInteractiveApproval``: nobody can be asked).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable
from typing import Final, Literal

import attrs
import trio

from dsh_core import APPROVAL_ANSWERS, ApprovalService, TextBlock, ToolExecution, ToolRuntime, json_text, safe_repr
from dsh_core.presentation import (
    UNREAD_OLD_TEXT,
    DiffCallView,
    FileDiff,
    GenericCallView,
    TerminalCallView,
    clipped,
    declared_effects,
    diff_hunks,
    printable,
    text_lines,
)

from ._line_reader import LineReader
from .grants import ALLOWED_ALWAYS, always_offer

__all__ = [
    "ApprovalStep",
    "EscalatingApproval",
    "NonInteractiveApproval",
    "TerminalApproval",
    "approval_card",
    "short_call",
]

SHORT_LIMIT: Final = 80
CARD_LINES: Final = 60
# Shown under a question that is withdrawn while on screen.
WITHDRAWN_NOTICE: Final = "\n(question withdrawn: an answer typed now does not count)\n"

logger = logging.getLogger("dsh_plugins.approval")


def _one_line(text: str) -> str:
    # Model-chosen arguments may hold ANSI escapes, carriage returns or bidi overrides
    # that would make the prompt say something other than what runs.
    return printable(text, one_line=True)


def _shorten(text: str, limit: int = SHORT_LIMIT) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _diff_lines(diff: FileDiff) -> list[str]:
    """The unified diff of one file change; its header alone, with a note, when no line changed.

    Bounded (:func:`~dsh_core.presentation.diff_hunks`): the model chose both texts,
    and this runs on the event loop.
    """
    source = UNREAD_OLD_TEXT if diff.old_text is None else f"a/{diff.path}"
    hunks = diff_hunks(diff.old_text or "", diff.new_text)
    # Writing an empty file, or the same text, has no diff lines: the card must still say which
    # file, since the question line may have cut the path short.
    return [f"--- {source}", f"+++ b/{diff.path}", *(hunks or ["(empty)" if not diff.new_text else "(unchanged)"])]


CallView = GenericCallView | TerminalCallView | DiffCallView


def _call_view(execution: ToolExecution, runtime: ToolRuntime | None) -> CallView | None:
    """The pending card the visible tool presents for this call (``None``: none, or its presenter failed)."""
    definition = runtime.get(execution.name, execution.agent) if runtime is not None else None
    if definition is None or definition.present_call is None:
        return None
    try:
        view = definition.present_call(execution.arguments)
    except Exception:
        return None
    return view if isinstance(view, (GenericCallView, TerminalCallView, DiffCallView)) else None


def _declared_effects(execution: ToolExecution, runtime: ToolRuntime | None) -> str:
    """The visible tool's :func:`~dsh_core.presentation.declared_effects` ("" when there is none)."""
    definition = runtime.get(execution.name, execution.agent) if runtime is not None else None
    return declared_effects(definition) if definition is not None else ""


def short_call(execution: ToolExecution, runtime: ToolRuntime | None = None) -> str:
    """``<tool> <short args>``: the call's presentation title when its tool has one, else compact JSON.

    The title comes from the visible definition's ``present_call`` (a raising or
    absent presenter falls back to the arguments). Always one line, at most
    about 80 characters of arguments, with control characters escaped.
    """
    return _short(execution, _call_view(execution, runtime))


def _short(execution: ToolExecution, view: CallView | None) -> str:
    detail = view.title if view is not None else json_text(execution.arguments)
    return f"{_one_line(execution.name)} {_shorten(_one_line(detail))}"


def approval_card(execution: ToolExecution, runtime: ToolRuntime | None = None, *, max_lines: int = CARD_LINES) -> str:
    """What a person should see before answering, beyond the one-line question ("" when the line says it all).

    From the tool's pending card: the unified diff of a file change (with no
    changed line, as writing an empty file, its header and ``(empty)`` or
    ``(unchanged)``: the file is always named whole), the whole command line
    of a shell call whose title the question had to shorten, the content of a
    generic card (or, without content, its raw input or the call's arguments:
    the question line shows only the card's title); for a tool without a
    card, the arguments as pretty JSON when compact JSON did not fit the
    question. At most ``max_lines`` lines (the rest is counted, never silently dropped), broken
    only at newlines, every line with its control characters (``\\r``,
    ``\\x0c``, ``\\u2028`` too) escaped, so what is shown is what runs.
    """
    return _card(execution, _call_view(execution, runtime), max_lines)


def _card(execution: ToolExecution, view: CallView | None, max_lines: int) -> str:
    lines: list[str]
    if isinstance(view, DiffCallView):
        lines = [line for diff in view.diffs for line in _diff_lines(diff)]
    elif isinstance(view, TerminalCallView):
        # Measured as the question shows it: escaping (a zero-width space becomes \u200b) lengthens it.
        if len(_one_line(view.title)) <= SHORT_LIMIT and "\n" not in view.title and view.cwd is None:
            return ""
        lines = [f"$ {line}" for line in text_lines(view.title) or [""]]
        if view.cwd is not None:
            lines.append(f"(in {view.cwd})")
    elif isinstance(view, GenericCallView):
        text = "\n".join(block.text for block in view.content or () if isinstance(block, TextBlock))
        if not text and execution.arguments:
            # The question line shows the card's title instead of the arguments: show them here.
            shown = view.raw_input if view.raw_input is not None else execution.arguments
            text = shown if isinstance(shown, str) else json_text(shown, indent=2)
        lines = text_lines(text)
    else:
        compact = json_text(execution.arguments)
        if len(_one_line(compact)) <= SHORT_LIMIT:
            return ""
        lines = text_lines(json_text(execution.arguments, indent=2))
    if len(lines) > max_lines:
        hidden = len(lines) - max_lines
        lines = [*lines[:max_lines], f"... {hidden} more line{'s' if hidden != 1 else ''} not shown"]
    # Each line bounded too, as the reason is: one model-chosen line megabytes long (a command,
    # a file's content) would bury the question, written whole from the event loop's thread.
    return "\n".join(_one_line(clipped(line)) for line in lines)


class TerminalApproval:
    """Ask the person at the terminal: ``Allow <tool> <short args>? [y/N/a]``.

    When the tool declares its :class:`~dsh_core.ToolEffects`, they are shown
    first (``effects: destructive, open world``), then the call's card (see
    :func:`approval_card`). ``y`` (or ``yes``) allows this call, ``a`` (or
    ``always``) allows it and every later call of that tool name through this
    service object (for the process, when the host makes one service per
    process, as the CLI does);
    anything else, an empty line, end of input or an unreadable terminal
    denies. The line just above the question says what ``a`` covers
    (:meth:`always_covers`): ``a = always allow <tool> (every agent, any
    arguments) for this session``, or, with ``report_always``, the grant the
    :class:`~dsh_plugins.grants.GrantingApproval` around it would record. The ``reason`` of the ``Ask``, when given, is shown on the line
    above the question (its first 2000 characters, and how many more there are).

    ``show`` writes the question (default: to standard output, flushed); it is
    called in the event loop's thread, so it must not block (a terminal
    write). ``readline`` returns the next line typed (default: a line of
    standard input; ``""``, ``EOFError`` or ``OSError`` end the input, and
    every later question is denied). One thread reads ``readline``, started
    at the first question and kept for the life of the service, one line at a
    time and only while a question waits: the event loop keeps serving other
    calls, and a question that expires (an :class:`EscalatingApproval` budget)
    or is cancelled leaves no thread of its own behind. A line goes to the
    question on screen when it is read: one typed after a question expired
    answers the question shown since, and one read once its question expired
    with no other shown yet is discarded, never kept for a later question.
    Lines piped in ahead (scripted answers) are read one per question.
    Prompts are serialised, one question at a time.

    ``prompt`` is the older form, for scripted answers: a blocking callable
    that shows the question and returns the answer, run in a worker thread of
    its own for each question. A question that expires or is cancelled leaves
    that thread waiting, and the line it eventually reads is lost: do not use
    it on a terminal shared by questions that can expire.

    Pass ``runtime`` to have the question use the tools' ``present_call``
    titles. With ``report_always=True``, ``a`` is answered as
    :data:`dsh_plugins.grants.ALLOWED_ALWAYS` instead of being remembered here,
    for a :class:`~dsh_plugins.grants.GrantingApproval` to record as a scoped,
    revocable, audited grant (use it only behind one: the runtime refuses that
    answer).

    Cancellation: a call whose signal has already fired gets ``"cancelled"``
    without a question, and so does one cancelled while the answer was being
    typed (the late answer is discarded). When the call's cancel scope fires
    during the question, ``trio.Cancelled`` propagates as trio requires and the
    call resolves as ``ABORTED_BEFORE_DISPATCH`` at once. A question withdrawn
    that way, or by an escalation moving on, is followed on screen by
    :data:`WITHDRAWN_NOTICE`, so nobody answers it believing the answer counts
    (a line typed then, with no other question shown, is discarded with a
    warning in the log).
    """

    def __init__(
        self,
        runtime: ToolRuntime | None = None,
        *,
        show: Callable[[str], None] | None = None,
        readline: Callable[[], str] | None = None,
        prompt: Callable[[str], str] | None = None,
        report_always: bool = False,
    ) -> None:
        if type(report_always) is not bool:
            raise TypeError(f"report_always must be a bool, got {type(report_always).__name__}")
        if prompt is not None and (show is not None or readline is not None):
            raise TypeError("pass either prompt or show/readline, not both")
        self.runtime = runtime
        self.prompt = prompt
        self.show = show if show is not None else _show_on_stdout
        self.lines = LineReader(readline if readline is not None else _read_stdin_line)
        self.report_always = report_always
        self.always: set[str] = set()
        self._lock = trio.Lock()

    def question(self, execution: ToolExecution, reason: str | None) -> str:
        """The text shown for one request: the reason line (if any), the card (if any), then the question."""
        parts = [_one_line(clipped(reason))] if reason else []
        declared = _declared_effects(execution, self.runtime)
        if declared:
            parts.append(declared)
        view = _call_view(execution, self.runtime)  # the tool's presenter runs once per question
        card = _card(execution, view, CARD_LINES)
        if card:
            parts.append(card)
        parts.append(_one_line(self.always_covers(execution)))
        parts.append(f"Allow {_short(execution, view)}? [y/N/a] ")
        return "\n".join(parts)

    def always_covers(self, execution: ToolExecution) -> str:
        """The line saying what answering ``a`` allows, from what this service (or the grant around it) does."""
        if not self.report_always:
            # self.always is keyed by the tool name alone: every agent, any arguments, while this object lives.
            return f"a = always allow {execution.name} (every agent, any arguments) for this session"
        offer = always_offer()
        if offer is None:
            return f"a = always allow {execution.name}: refused here, no grant book records it"
        return offer

    async def _answer(self, question: str) -> str | None:
        """The line typed in answer to ``question`` (``None``: the input has ended)."""
        if self.prompt is not None:
            return await trio.to_thread.run_sync(self.prompt, question, abandon_on_cancel=True)
        shown = False

        def show() -> None:
            nonlocal shown
            self.show(question)
            shown = True

        try:
            return await self.lines.next_line(show)
        except trio.Cancelled:
            # Withdrawn (the call was cancelled, or an escalation asked the next step): the question
            # stays on screen, and a person who answers it now must not think the answer counts.
            if shown:
                try:
                    self.show(WITHDRAWN_NOTICE)
                except Exception as exc:  # a closed terminal: the cancellation goes on all the same
                    logger.debug("could not say that an approval question was withdrawn: %s", exc)
            raise

    async def request(self, execution: ToolExecution, reason: str | None) -> str:
        """Ask, and answer ``"allowed-once"``, ``"denied"`` or ``"cancelled"``."""
        name = execution.name
        if execution.signal.cancelled:
            return "cancelled"
        if name in self.always:
            return "allowed-once"
        async with self._lock:
            # Another prompt may have answered "always" while this one waited.
            if name in self.always:
                return "allowed-once"
            if execution.signal.cancelled:
                return "cancelled"
            try:
                answer = await self._answer(self.question(execution, reason))
            except (EOFError, OSError):
                return "denied"
            if answer is None:
                return "denied"
        if execution.signal.cancelled:
            return "cancelled"
        choice = answer.strip().lower()
        if choice in ("a", "always"):
            if self.report_always:
                return ALLOWED_ALWAYS
            self.always.add(name)
            return "allowed-once"
        if choice in ("y", "yes"):
            return "allowed-once"
        return "denied"


def _show_on_stdout(question: str) -> None:
    discard_typed_ahead()
    sys.stdout.write(question)
    sys.stdout.flush()


def discard_typed_ahead(stream: object = None) -> None:
    """Drop what was typed on the terminal ``stream`` (default: ``sys.stdin``) and not read yet.

    Called just before a question is shown, so keys pressed before it
    appeared (an ``a`` typed ahead) cannot answer it, as ``sudo`` does for its
    password. A no-op when the stream is not a terminal: answers piped in
    ahead are meant for the questions to come.
    """
    stream = sys.stdin if stream is None else stream
    try:
        fd = stream.fileno()  # type: ignore[union-attr]
        if not os.isatty(fd):
            return
        import termios

        termios.tcflush(fd, termios.TCIFLUSH)
    except (AttributeError, ImportError, OSError, ValueError):
        return  # no terminal to flush (a replaced stream, Windows): nothing typed ahead can be told apart


def _read_stdin_line() -> str:
    # Looked up at each read: a host (or a test runner) may replace sys.stdin.
    return sys.stdin.readline()


class NonInteractiveApproval:
    """The approval service of a run nobody can answer (a pipe, CI, a batch file): always ``"unavailable"``.

    With it, an ``Ask`` never waits on a prompt that no one will see: the call
    fails at once as a denial (code ``DENIED``, the decider ``approval``) whose
    text tells the model the truth:
    ``tool "<name>" requires approval, but no approval channel is available``.
    """

    async def request(self, execution: ToolExecution, reason: str | None) -> str:
        """Always ``"unavailable"``; never blocks."""
        return "unavailable"


@attrs.frozen(kw_only=True, slots=True)
class ApprovalStep:
    """What happened at one step of an :class:`EscalatingApproval` question.

    ``answer`` is the service's answer, ``"timed-out"`` when it gave none
    within its budget, ``"failed"`` when its ``request`` raised; then
    ``error`` says what it raised (its message, else the exception's type name),
    or ``"malformed"`` when it returned something that is not an approval
    answer; then ``error`` is ``not an approval answer: <bounded repr>`` (and the
    call fails ``POLICY_ERROR``, as with any service); or ``"interrupted"``
    when the question was cut while this step asked (the call's signal, the
    host's cancel scope, ``KeyboardInterrupt``): ``error`` names the cause's type.
    ``waited_s`` is the time spent on this step (trio's clock).
    """

    call_id: str
    tool: str
    step: int
    answer: str
    waited_s: float
    error: str | None = None


class EscalatingApproval:
    """Ask a chain of approval services, each within a deadline; silence hands the question on.

    ``EscalatingApproval((TerminalApproval(), 60), (pager, 600))`` asks the
    person at the terminal; if they do not answer within a minute (or the
    service answers ``"unavailable"``, or raises), the pager service is asked,
    for ten minutes. The first ``"allowed-once"``, ``"denied"`` or
    ``"cancelled"`` is the answer (or :data:`~dsh_plugins.grants.ALLOWED_ALWAYS`,
    for a :class:`~dsh_plugins.grants.GrantingApproval` around the chain to
    record). A service that raises an ``Exception`` (a pager's HTTP error) gave
    no answer: it is logged, recorded as ``"failed"``, and the next step is
    asked; a cancellation or an interrupt (``KeyboardInterrupt``) is not a
    failed step and ends the question. When every step timed out, was
    unavailable or failed, the answer is ``on_exhausted`` (default ``"unavailable"``: the call is denied as having no
    one to approve it, never allowed by default).

    A pending question therefore never waits forever, and every step is
    recorded: ``on_step`` (if given) receives an :class:`ApprovalStep` for each
    one, in order, so a host can audit who was asked, who answered and how long
    it took. An exception from ``on_step`` propagates (an audit trail that
    cannot be written should not be skipped silently).

    A step's deadline is its own: when the call's signal fires (the caller's
    cancel scope), the question is cancelled as a whole, as for any service.
    A :class:`TerminalApproval` step that timed out leaves nothing waiting for
    its answer: a line read after its question expired goes to the question
    shown since, or is discarded when none is.

    Raises:
        ValueError: no steps, a budget that is not a positive finite number of
            seconds, or an ``on_exhausted`` that is not an approval answer.
        TypeError: a step that is not a ``(service, seconds)`` pair, a service
            without an async ``request`` method, or an ``on_step`` that is not
            callable.
    """

    def __init__(
        self,
        *steps: tuple[ApprovalService, float],
        on_exhausted: Literal["denied", "unavailable"] = "unavailable",
        on_step: Callable[[ApprovalStep], None] | None = None,
    ) -> None:
        if not steps:
            raise ValueError("EscalatingApproval needs at least one (service, seconds) step")
        # Checked now: a bad step would otherwise fail only when a call reaches it, maybe rarely.
        for index, step in enumerate(steps):
            if not (isinstance(step, tuple) and len(step) == 2):
                raise TypeError(f"step {index}: expected a (service, seconds) pair, got {step!r}")
            service, seconds = step
            if not isinstance(service, ApprovalService):
                raise TypeError(
                    f"step {index}: the service must be an ApprovalService (an object with an async request "
                    f"method), got {type(service).__name__}"
                )
            if type(seconds) not in (int, float) or not (0 < seconds < float("inf")):
                raise ValueError(
                    f"step {index}: the budget must be a positive finite number of seconds, got {seconds!r}"
                )
        if on_exhausted not in ("denied", "unavailable"):
            raise ValueError(f"on_exhausted must be 'denied' or 'unavailable', got {on_exhausted!r}")
        if on_step is not None and not callable(on_step):
            raise TypeError(f"on_step must be callable or None, got {type(on_step).__name__}")
        self.steps = steps
        self.on_exhausted = on_exhausted
        self.on_step = on_step

    async def request(self, execution: ToolExecution, reason: str | None) -> str:
        """Ask each service in turn until one answers within its budget."""
        for index, (service, seconds) in enumerate(self.steps):
            start = trio.current_time()
            answer = "timed-out"
            error: str | None = None
            try:
                with trio.move_on_after(seconds):  # absorbs this step's own deadline
                    try:
                        answer = await service.request(execution, reason)
                    except Exception as exc:
                        # Only Exception: a Cancelled (alone or in a group) and KeyboardInterrupt are
                        # BaseExceptions, the deadline's or the caller's to handle, never a failed step.
                        answer = "failed"
                        error = str(exc) or type(exc).__name__
                        logger.warning(
                            "approval step %d (%s) failed for %s call %s: %s; asking the next step",
                            index,
                            type(service).__name__,
                            execution.name,
                            execution.call_id,
                            error,
                            exc_info=exc,
                        )
            except BaseException as cut:
                # Cut from outside while this step asked: the trail still shows where the question was,
                # and a trail that cannot take it must not replace the cause.
                try:
                    self._record(execution, index, "interrupted", start, type(cut).__name__)
                except Exception:
                    logger.warning("on_step failed recording an interrupted approval step", exc_info=True)
                raise
            malformed = error is None and answer not in APPROVAL_ANSWERS and answer not in ("timed-out", ALLOWED_ALWAYS)
            # Whatever the service returned may be any object: the trail holds its bounded repr.
            self._record(
                execution,
                index,
                "malformed" if malformed else answer,
                start,
                f"not an approval answer: {safe_repr(answer)}" if malformed else error,
            )
            if malformed:
                return answer  # the runtime reports a malformed answer, naming it
            if answer in ("allowed-once", "denied", "cancelled", ALLOWED_ALWAYS):
                return answer
        return self.on_exhausted

    def _record(self, execution: ToolExecution, index: int, answer: str, start: float, error: str | None) -> None:
        if self.on_step is not None:
            self.on_step(
                ApprovalStep(
                    call_id=execution.call_id,
                    tool=execution.name,
                    step=index,
                    answer=answer,
                    waited_s=trio.current_time() - start,
                    error=error,
                )
            )
