"""The exception hierarchy and the stable error codes carried into tool results."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from typing import Final

#: How many violations an error's message spells out; the rest are counted ("… and 7 more").
MESSAGE_VIOLATIONS: Final = 20
#: How many violations an error keeps in ``violations`` (the rest are counted in ``omitted``).
KEPT_VIOLATIONS: Final = 100
#: How long one kept violation may be; a longer one keeps its start and end around an ellipsis.
VIOLATION_CHARS: Final = 2000
#: How long a quoted key or path may be in a violation (the middle is elided past this).
QUOTED_CHARS: Final = 200


class ErrorCode(enum.StrEnum):
    """Machine-readable codes a failed tool result can carry in ``ToolErrorInfo.code``."""

    UNKNOWN_TOOL = "UNKNOWN_TOOL"
    INVALID_ARGS = "INVALID_ARGS"
    INVALID_TOOL_OUTPUT = "INVALID_TOOL_OUTPUT"
    ABORTED_BEFORE_DISPATCH = "ABORTED_BEFORE_DISPATCH"
    ABORTED = "ABORTED"
    TOOL_TIMEOUT = "TOOL_TIMEOUT"
    CODE_RUN_FAILED = "CODE_RUN_FAILED"
    DENIED = "DENIED"
    TOOL_ERROR = "TOOL_ERROR"
    POLICY_ERROR = "POLICY_ERROR"
    UNSUPPORTED_SCHEMA = "UNSUPPORTED_SCHEMA"
    INVALID_SCHEMA_SPEC = "INVALID_SCHEMA_SPEC"
    NON_JSON_VALUE = "NON_JSON_VALUE"
    REGISTRATION_ERROR = "REGISTRATION_ERROR"
    CONFIG_ERROR = "CONFIG_ERROR"


class DshError(Exception):
    """Base of every error dsh-tools raises on purpose.

    ``code`` is stable and machine-readable; when the error ends a tool call, the
    pipeline copies ``type(err).__name__`` and ``code`` into the failure's
    ``ToolErrorInfo``. Plugin authors may subclass it (or pass ``code=``) so their
    own failures keep a code of their choosing.
    """

    code: str = ErrorCode.TOOL_ERROR.value

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = str(code)

    def __str__(self) -> str:
        # A subclass whose own __init__ calls Exception.__init__ (not ours) has no
        # message attribute: its arguments are still its message.
        message = getattr(self, "message", None)
        return message if isinstance(message, str) else super().__str__()


def elide_middle(text: str, limit: int) -> str:
    """``text``, or when longer than ``limit`` its start and end joined by ``…`` (``limit`` chars in all)."""
    if len(text) <= limit:
        return text
    head = (limit - 1) // 2
    return text[:head] + "…" + text[len(text) - (limit - 1 - head) :]


class Violations(tuple[str, ...]):
    """Violations a check reported, with ``omitted`` counting those found past the ones kept.

    A plain tuple of messages otherwise (it compares equal to one): a checker that
    stops spelling out violations after :data:`KEPT_VIOLATIONS` returns one, so
    an error built from it can still say how many there were.
    """

    omitted: int

    def __new__(cls, violations: Iterable[str] = (), omitted: int = 0) -> Violations:
        self = super().__new__(cls, violations)
        self.omitted = omitted
        return self


def bound_violations(violations: Iterable[str]) -> tuple[tuple[str, ...], int]:
    """The first :data:`KEPT_VIOLATIONS` of ``violations``, each at most :data:`VIOLATION_CHARS` long, and how many more."""
    kept: list[str] = []
    omitted = getattr(violations, "omitted", 0)
    for violation in violations:
        if len(kept) < KEPT_VIOLATIONS:
            kept.append(elide_middle(violation, VIOLATION_CHARS))
        else:
            omitted += 1
    return tuple(kept), omitted


def bounded_listing(
    items: Sequence[str], *, omitted: int = 0, separator: str = "; ", item_chars: int = VIOLATION_CHARS
) -> str:
    """The first 20 of ``items`` joined by ``separator``, then ``… and N more``: a bounded message part.

    The rule dsh-tools' own error messages follow, public for plugins that list
    what a model or a server named (paths, keys, problems). Each shown item
    longer than ``item_chars`` (default 2,000) keeps its start and end around an
    ellipsis; ``N`` counts the items not shown plus ``omitted`` (those a
    checker found but never listed). ``bounded_listing(["a", "b"])`` is ``"a; b"``.
    """
    shown = separator.join(elide_middle(item, item_chars) for item in items[:MESSAGE_VIOLATIONS])
    rest = max(len(items) - MESSAGE_VIOLATIONS, 0) + omitted
    return f"{shown}{separator}… and {rest} more" if rest else shown


class _ViolationsError(DshError):
    """An error that carries every problem found, not just the first.

    ``omitted`` counts those a checker found but did not spell out (see
    :class:`Violations`). ``violations`` keeps every problem, but the message,
    shown on a terminal and logged, is bounded by :func:`bounded_listing`: a
    schema or configuration with thousands of problems, or huge keys, must not
    make it megabytes long.
    """

    prefix: str = ""

    def __init__(self, violations: Iterable[str]) -> None:
        self.violations: tuple[str, ...] = tuple(violations)
        self.omitted: int = getattr(violations, "omitted", 0)
        super().__init__(self.prefix + bounded_listing(self.violations, omitted=self.omitted))


class NonJsonValueError(DshError, ValueError):
    """A value is not lossless JSON; ``path`` names where (``$.items[3].x``)."""

    code = ErrorCode.NON_JSON_VALUE.value

    def __init__(self, message: str, *, path: str = "$") -> None:
        super().__init__(message)
        self.path = path


class JsonSchemaError(_ViolationsError, ValueError):
    """A raw JSON Schema uses keywords or shapes outside the enforced subset.

    ``errors`` (the name SPEC gives it) and ``violations`` are the same tuple:
    every unsupported or malformed path, in walk order.
    """

    code = ErrorCode.UNSUPPORTED_SCHEMA.value
    prefix = "unsupported JSON schema: "

    @property
    def errors(self) -> tuple[str, ...]:
        return self.violations


class SchemaSpecError(_ViolationsError, ValueError):
    """An author DSL spec is malformed; ``violations`` lists every bad path."""

    code = ErrorCode.INVALID_SCHEMA_SPEC.value
    prefix = "invalid schema spec: "


class ToolArgsError(_ViolationsError):
    """The model's arguments do not match the tool's parameter schema.

    Its message goes back to the model and into logs, and arguments can fail in
    as many ways as they have parts: ``violations`` keeps the first
    :data:`KEPT_VIOLATIONS` (each at most :data:`VIOLATION_CHARS` long),
    ``omitted`` counts the others, and the message spells out the first
    :data:`MESSAGE_VIOLATIONS` and counts the rest (``… and 7 more``).
    """

    code = ErrorCode.INVALID_ARGS.value
    prefix = "invalid arguments: "

    def __init__(self, violations: Iterable[str]) -> None:
        kept, omitted = bound_violations(violations)
        DshError.__init__(self, self.prefix + bounded_listing(kept, omitted=omitted))
        self.violations, self.omitted = kept, omitted


class ToolOutputError(DshError):
    """A tool body (or a post-execute value replacement) produced an invalid value.

    ``violations`` and the message are bounded as :class:`ToolArgsError`'s are.
    """

    code = ErrorCode.INVALID_TOOL_OUTPUT.value

    def __init__(self, tool_name: str, violations: Iterable[str]) -> None:
        self.tool_name = tool_name
        # Bounded as ToolArgsError's are: the message goes back to the model.
        self.violations, self.omitted = bound_violations(violations)
        super().__init__(
            f'tool "{tool_name}" returned invalid output: ' + bounded_listing(self.violations, omitted=self.omitted)
        )


class ToolNotFoundError(DshError):
    """No tool of that name is visible to the calling scope."""

    code = ErrorCode.UNKNOWN_TOOL.value

    def __init__(self, name: str, route: str | None = None) -> None:
        self.tool_name = name
        # The name is the model's text, any length: the message, which goes back to it, quotes its ends.
        message = f'unknown tool "{elide_middle(name, QUOTED_CHARS)}"'
        if route:
            message += f": {route}"
        super().__init__(message)


class AbortError(DshError):
    """The caller cancelled the call (``ABORTED`` or ``ABORTED_BEFORE_DISPATCH``)."""

    code = ErrorCode.ABORTED.value


class ToolTimeoutError(DshError):
    """The timeout plugin's own deadline fired."""

    code = ErrorCode.TOOL_TIMEOUT.value


class CodeRunFailedError(DshError):
    """A ``run_code`` program failed (exception, timeout, crash, output limit...)."""

    code = ErrorCode.CODE_RUN_FAILED.value


class PolicyError(DshError):
    """A policy listener broke the waterfall contract (bad decision, ``next()`` twice...)."""

    code = ErrorCode.POLICY_ERROR.value


class RegistrationError(DshError, ValueError):
    """A registration, restriction, guard or presentation declaration was refused."""

    code = ErrorCode.REGISTRATION_ERROR.value


class ConfigError(_ViolationsError, ValueError):
    """A configuration file is invalid; ``violations`` lists every bad path."""

    code = ErrorCode.CONFIG_ERROR.value
    prefix = "invalid configuration: "
