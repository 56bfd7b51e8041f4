"""The identity of one tool call as it travels through the pipeline.

A caller builds a :class:`ToolExecutionInput`. The runtime turns it into one
frozen :class:`ToolExecution` (snapshotted arguments, a fresh token) that every
stage sees; around-dispatch wrappers get a :class:`ToolDispatchExecution` view
whose only writable field is ``signal``, and the body gets a
:class:`ToolRunContext` view that adds ``defer_context`` and ``conclude_turn``.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, Final, Literal, TypeAlias, TypeVar

import attrs
import trio

from ._content import UserMessage
from ._json import JsonValue, json_repr, safe_repr
from ._signal import CancelSignal

if TYPE_CHECKING:
    from ._orphans import OrphanTracker
    from ._results import ToolExecutionResult

__all__ = [
    "Agent",
    "Exclusive",
    "Parallel",
    "ScopeKey",
    "ToolDispatchExecution",
    "ToolExecution",
    "ToolExecutionInput",
    "ToolExecutionMode",
    "ToolExecutionToken",
    "ToolRunContext",
    "input_of",
    "new_execution",
    "scope_chain",
    "scope_id",
]

T = TypeVar("T")


class ToolExecutionToken:
    """An opaque identity for one execution; compare with ``is``, nothing else."""

    __slots__ = ("__weakref__",)

    def __repr__(self) -> str:
        return f"<ToolExecutionToken {id(self):#x}>"

    def __reduce__(self) -> Any:
        raise TypeError("a ToolExecutionToken is an in-process identity and cannot be serialised")


@attrs.frozen(slots=True, eq=False)
class Agent:
    """A scope key: the agent a call runs for. ``parent`` links a child to the scope it inherits from.

    Agents compare by identity, so two agents that share an ``id`` stay separate scopes.
    """

    id: str = attrs.field()
    parent: Agent | None = attrs.field(default=None)

    @id.validator
    def _check_id(self, attribute: attrs.Attribute[str], value: object) -> None:
        if type(value) is not str or not value:
            raise TypeError(f"Agent.id must be a non-empty str, got {safe_repr(value)}")

    @parent.validator
    def _check_parent(self, attribute: attrs.Attribute[Agent | None], value: object) -> None:
        if value is not None and not isinstance(value, Agent):
            raise TypeError(f"Agent.parent must be an Agent or None, got {type(value).__name__}")


ScopeKey: TypeAlias = Hashable


def scope_id(scope: ScopeKey | None) -> str | None:
    """The text naming ``scope`` in files that outlive the process (logs, ledgers).

    An :class:`Agent`'s ``id``, another key's ``str()``, ``None`` for the global
    view. Never raises: a key whose ``__str__`` fails is named
    ``"<unprintable TYPE scope>"``. Two agents sharing an id share this name,
    since identity does not survive a restart.
    """
    if scope is None:
        return None
    if isinstance(scope, Agent):
        return scope.id
    try:
        return str(scope)
    except Exception:
        return f"<unprintable {type(scope).__name__} scope>"


def scope_chain(scope: ScopeKey | None) -> tuple[Hashable, ...]:
    """The scope and its ancestors, nearest first (empty for the global view)."""
    if scope is None:
        return ()
    chain: list[Hashable] = []
    current: Any = scope
    seen: set[int] = set()
    while current is not None:
        if id(current) in seen:
            raise ValueError(f"scope parent chain of {scope!r} is circular")
        seen.add(id(current))
        chain.append(current)
        current = current.parent if isinstance(current, Agent) else None
    return tuple(chain)


# Not slotted: hosts build one per call, and the dict form constructs faster.
@attrs.frozen(slots=False)
class ToolExecutionInput:
    """One tool call as the caller (agent loop, CLI, Code Mode bridge) describes it.

    ``arguments`` are the parsed JSON arguments (plain dicts and lists are fine);
    ``signal`` is the caller-owned cancellation token and is required.
    ``root_call_id`` is left out for a model-requested call; nested dispatchers
    pass the enclosing value, together with the enclosing ``parent`` token.
    """

    call_id: str
    name: str
    arguments: object = attrs.field(repr=json_repr)
    signal: CancelSignal
    agent: ScopeKey | None = None
    root_call_id: str | None = None
    parent: ToolExecutionToken | None = None

    def __attrs_post_init__(self) -> None:
        # The host's part of the contract, checked here so a mistake fails where it is made, not
        # as an AttributeError deep in the pipeline (one check instead of six field validators:
        # an input is built for every call). ``name`` and ``arguments`` come from the model: any
        # str name is taken (an unknown one fails the call as UNKNOWN_TOOL) and the pipeline
        # validates the arguments.
        call_id, name, root_call_id = self.call_id, self.name, self.root_call_id
        if type(call_id) is not str or not call_id:
            raise TypeError(f"ToolExecutionInput.call_id must be a non-empty str, got {safe_repr(call_id)}")
        if type(name) is not str:
            raise TypeError(f"ToolExecutionInput.name must be a str, got {type(name).__name__}")
        if type(self.signal) is not CancelSignal and not isinstance(self.signal, CancelSignal):
            raise TypeError(
                f"ToolExecutionInput.signal must be a CancelSignal (the caller's cancellation), "
                f"got {type(self.signal).__name__}"
            )
        if root_call_id is not None and (type(root_call_id) is not str or not root_call_id):
            raise TypeError(f"ToolExecutionInput.root_call_id must be None or a non-empty str, got {safe_repr(root_call_id)}")
        if self.parent is not None and not isinstance(self.parent, ToolExecutionToken):
            raise TypeError(
                f"ToolExecutionInput.parent must be None or the enclosing call's ToolExecutionToken, "
                f"got {type(self.parent).__name__}"
            )
        if self.agent is not None and not isinstance(self.agent, Hashable):
            raise TypeError(f"ToolExecutionInput.agent must be None or a hashable scope key, got {type(self.agent).__name__}")
        arguments = self.__dict__.get("arguments")  # not through a subclass's getter: read once, later
        if type(arguments) is str and arguments[:64].lstrip()[:1] == "{":
            # The model may send a JSON string (a Code Mode program's tools.x("hello")), which fails the
            # call, told to the model; but text that opens an object is the provider's JSON text, passed
            # as it came by the host: every call fails.
            warnings.warn(
                "ToolExecutionInput.arguments is a str, which the call takes as a JSON string (no arguments "
                "object); if it is the provider's JSON text, pass ArgumentsText(text)",
                UserWarning,
                stacklevel=3,
            )


# Not slotted: one is built per call, and a frozen attrs class writes its
# instance dict directly, about twice as fast as its slotted form.
@attrs.frozen(slots=False, kw_only=True, eq=False)
class ToolExecution:
    """The pipeline-owned, immutable identity of one call, shared by every stage.

    ``arguments`` is the frozen lossless snapshot (``None`` when the input was not
    JSON and the call failed before policy); ``token`` is minted by the runtime.
    """

    call_id: str
    root_call_id: str
    name: str
    arguments: JsonValue = attrs.field(repr=json_repr)
    signal: CancelSignal
    token: ToolExecutionToken
    agent: ScopeKey | None = None
    parent: ToolExecutionToken | None = None


class ReadOnlyExecutionError(attrs.exceptions.FrozenInstanceError):
    """A listener assigned to a field of the immutable :class:`ToolExecution`."""

    def __init__(self, message: str) -> None:
        AttributeError.__init__(self, message)
        self.args = (message,)  # FrozenInstanceError fixes args at the class level


def _refuse_assignment(execution: ToolExecution, name: str, value: object = None) -> None:
    # attrs' own refusal says only "can't set attribute": say what to do instead.
    raise ReadOnlyExecutionError(
        f"ToolExecution.{name} is read-only; a dsh_pre_execute listener changes a call's arguments "
        "by returning Rewrite(arguments, reason)"
    )


# attrs refuses a custom __setattr__ on a frozen class, so it replaces attrs' refusal afterwards.
ToolExecution.__setattr__ = _refuse_assignment  # type: ignore[method-assign, assignment]
ToolExecution.__delattr__ = _refuse_assignment  # type: ignore[method-assign, assignment]

_new_object = object.__new__


def input_of(execution: ToolExecution) -> ToolExecutionInput:
    """The request that would produce ``execution`` now (a rewritten call's, to classify it again)."""
    return ToolExecutionInput(
        call_id=execution.call_id,
        name=execution.name,
        arguments=execution.arguments,
        signal=execution.signal,
        agent=execution.agent,
        root_call_id=execution.root_call_id,
        parent=execution.parent,
    )


def new_execution(
    call_id: str,
    root_call_id: str,
    name: str,
    arguments: JsonValue,
    signal: CancelSignal,
    token: ToolExecutionToken,
    agent: ScopeKey | None,
    parent: ToolExecutionToken | None,
) -> ToolExecution:
    """The pipeline's :class:`ToolExecution` constructor, positional (keyword parsing costs ~0.4 µs a call).

    The class has no validators or converters, so writing the instance dict
    directly builds exactly what ``ToolExecution(...)`` builds.
    """
    execution: ToolExecution = _new_object(ToolExecution)
    fields = execution.__dict__
    fields["call_id"] = call_id
    fields["root_call_id"] = root_call_id
    fields["name"] = name
    fields["arguments"] = arguments
    fields["signal"] = signal
    fields["token"] = token
    fields["agent"] = agent
    fields["parent"] = parent
    return execution


class _ExecutionView:
    """Read-through view of a ``ToolExecution`` (shared by the dispatch and run views)."""

    __slots__ = ("_execution",)

    _execution: ToolExecution

    @property
    def execution(self) -> ToolExecution:
        """The immutable execution this view belongs to."""
        return self._execution

    @property
    def call_id(self) -> str:
        return self._execution.call_id

    @property
    def root_call_id(self) -> str:
        return self._execution.root_call_id

    @property
    def name(self) -> str:
        return self._execution.name

    @property
    def arguments(self) -> JsonValue:
        return self._execution.arguments

    @property
    def agent(self) -> ScopeKey | None:
        return self._execution.agent

    @property
    def parent(self) -> ToolExecutionToken | None:
        return self._execution.parent

    @property
    def token(self) -> ToolExecutionToken:
        return self._execution.token


class ToolDispatchExecution(_ExecutionView):
    """What a ``dsh_execute`` wrapper sees: the execution, with a replaceable ``signal``.

    A wrapper may assign ``signal`` (for example a deadline fused with the current
    one) before calling ``next()`` and should restore it afterwards. Whatever it
    assigns, the runtime fuses the caller's own signal back in before the body
    runs, so a wrapper cannot detach caller cancellation. Every other field is
    read-only.
    """

    __slots__ = ("_body", "_may_suspend", "_signal")

    _signal: CancelSignal
    _may_suspend: bool
    # None until the body is invoked, then _BODY_STARTED, then what it produced.
    _body: object

    def __init__(self, execution: ToolExecution, *, may_suspend: bool = True) -> None:
        _set_execution(self, execution)
        _set_dispatch_signal(self, execution.signal)
        _set_may_suspend(self, may_suspend)
        _set_body(self, None)

    @property
    def body_started(self) -> bool:
        """Whether the tool's body was invoked in this dispatch (read it after ``next()``).

        ``False`` when nothing inner ran it: a wrapper answered (a cache, the
        effect ledger), the signal had fired, the tool was gone. A failure coded
        ``UNKNOWN_TOOL`` or ``ABORTED_BEFORE_DISPATCH`` with ``body_started``
        came from the body itself, which may have done its work.
        """
        return self._body is not None

    @property
    def body_result(self) -> ToolExecutionResult | None:
        """What the body itself produced in this dispatch (``None``: it did not run, or did not return).

        When cancellation replaced the body's success with ``ABORTED`` (the
        caller's signal fired as it returned), this is still that success: the
        work happened, and whatever records or compensates work (an effect
        ledger, an undo log) needs its value. After retries, the last attempt's.
        """
        body = self._body
        return None if body is None or body is _BODY_STARTED else body  # type: ignore[return-value]

    @property
    def signal(self) -> CancelSignal:
        return self._signal

    @signal.setter
    def signal(self, value: CancelSignal) -> None:
        if not isinstance(value, CancelSignal):
            raise TypeError(f"execution.signal must be a CancelSignal, got {type(value).__name__}")
        object.__setattr__(self, "_signal", value)

    @property
    def may_suspend(self) -> bool:
        """Whether the dispatch this wrapper surrounds (wrappers and body) can suspend.

        ``False`` only when the runtime has proven that nothing in it can give
        control back to trio (see ``ToolDefinition.inline``): a wrapper may
        then skip the cancel scopes it would enter to interrupt or shield that
        work, since there is nothing to interrupt. Signals still apply.
        """
        return self._may_suspend

    def __setattr__(self, name: str, value: object) -> None:
        if name == "signal":
            type(self).signal.__set__(self, value)  # type: ignore[attr-defined]
            return
        raise AttributeError(f"ToolDispatchExecution.{name} is read-only; a wrapper may replace only signal")

    def __repr__(self) -> str:
        return f"<ToolDispatchExecution {self.name} call_id={self.call_id!r}>"


# The slots' own setters: __setattr__ refuses writes, and going through
# object.__setattr__ by name costs more than the rest of building the view.
_set_execution = _ExecutionView.__dict__["_execution"].__set__
_set_dispatch_signal = ToolDispatchExecution.__dict__["_signal"].__set__
_set_may_suspend = ToolDispatchExecution.__dict__["_may_suspend"].__set__
_set_body = ToolDispatchExecution.__dict__["_body"].__set__
_new_object = object.__new__
_BODY_STARTED: Any = object()


def note_body(view: ToolDispatchExecution, result: ToolExecutionResult | None) -> None:
    """Record on the dispatch view that the body ran (and what it produced, when it returned)."""
    _set_body(view, _BODY_STARTED if result is None else result)


def dispatch_view(execution: ToolExecution, may_suspend: bool) -> ToolDispatchExecution:
    """``ToolDispatchExecution(execution, may_suspend=...)`` for the pipeline, once per call with wrappers."""
    view = _new_object(ToolDispatchExecution)
    _set_execution(view, execution)
    _set_dispatch_signal(view, execution.signal)
    _set_may_suspend(view, may_suspend)
    _set_body(view, None)
    return view


class ToolRunContext(_ExecutionView):
    """What a tool body receives: the execution plus ``defer_context`` and ``conclude_turn``.

    ``signal`` is the fused signal (caller + wrappers); a cooperative body polls it
    or awaits it, and the runtime also cancels the body's trio scope when it fires.
    """

    __slots__ = ("_concluded", "_deferred", "_orphans", "_signal")

    _signal: CancelSignal
    _deferred: list[UserMessage]
    _concluded: bool
    _orphans: OrphanTracker | None

    def __init__(
        self,
        execution: ToolExecution,
        signal: CancelSignal,
        deferred: list[UserMessage],
        orphans: OrphanTracker | None = None,
    ) -> None:
        # Public fields are read-only properties; only these private slots are ever written.
        self._execution = execution
        self._signal = signal
        self._deferred = deferred
        self._concluded = False
        self._orphans = orphans

    @property
    def signal(self) -> CancelSignal:
        return self._signal

    def defer_context(self, context: UserMessage) -> None:
        """Attach ``context`` to this call's own result (kept even if the body then fails)."""
        if not isinstance(context, UserMessage):
            raise TypeError(f"defer_context() takes a UserMessage, got {type(context).__name__}")
        self._deferred.append(context)

    def conclude_turn(self) -> None:
        """Mark a successful result as the last one of the agent's turn."""
        self._concluded = True

    @property
    def concluded(self) -> bool:
        return self._concluded

    async def run_in_thread(
        self, fn: Callable[..., T], *args: Any, limiter: trio.CapacityLimiter | None = None
    ) -> T:
        """``fn(*args)`` in a worker thread, without holding the call open when it is cancelled.

        Blocking work (a C library, a synchronous client) belongs here rather
        than on the event loop. When the call is cancelled (its caller's
        signal, a timeout) while ``fn`` runs, the call resolves at once and the
        thread, which nothing can stop, is left to finish: it is reported as
        :class:`~dsh_core.OrphanedWork` on the runtime
        (:meth:`ToolRuntime.orphaned_work`), announced through the runtime's
        ``event_sink`` as ``tool/orphaned`` and, when it returns, as
        ``tool/orphan-finished``, and logged as a warning. Work the call gave up
        on before a thread picked it up never starts. ``limiter`` is trio's
        (default: trio's shared limiter); an orphaned thread holds its slot
        until it returns.

        ``fn`` runs outside the event loop: it must not touch trio objects.
        Its return value or exception is this call's.
        """
        orphans = self._orphans
        if orphans is None:
            # A context built by hand (a unit test of a body) has no runtime to report to.
            from ._orphans import OrphanTracker

            orphans = self._orphans = OrphanTracker()
        execution = self._execution
        return await orphans.run_in_thread(
            fn,
            args,
            call_id=execution.call_id,
            tool=execution.name,
            agent=scope_id(execution.agent),
            limiter=limiter,
        )

    def __repr__(self) -> str:
        return f"<ToolRunContext {self.name} call_id={self.call_id!r}>"


@attrs.frozen(slots=True)
class Parallel:
    """The call may overlap with neighbouring parallel calls."""

    @property
    def kind(self) -> Literal["parallel"]:
        return "parallel"


@attrs.frozen(slots=True)
class Exclusive:
    """The call runs alone and is an ordering barrier."""

    @property
    def kind(self) -> Literal["exclusive"]:
        return "exclusive"


ToolExecutionMode: TypeAlias = Parallel | Exclusive
PARALLEL: Final = Parallel()
EXCLUSIVE: Final = Exclusive()
