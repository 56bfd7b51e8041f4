"""The exception hierarchy and the stable error codes carried into tool results."""

from __future__ import annotations

import enum
from collections.abc import Sequence


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


class _ViolationsError(DshError):
    """An error that carries every problem found, not just the first."""

    prefix: str = ""

    def __init__(self, violations: Sequence[str]) -> None:
        self.violations: tuple[str, ...] = tuple(violations)
        super().__init__(self.prefix + "; ".join(self.violations))


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
    """The model's arguments do not match the tool's parameter schema."""

    code = ErrorCode.INVALID_ARGS.value
    prefix = "invalid arguments: "


class ToolOutputError(DshError):
    """A tool body (or a post-execute value replacement) produced an invalid value."""

    code = ErrorCode.INVALID_TOOL_OUTPUT.value

    def __init__(self, tool_name: str, violations: Sequence[str]) -> None:
        self.tool_name = tool_name
        self.violations: tuple[str, ...] = tuple(violations)
        super().__init__(f'tool "{tool_name}" returned invalid output: ' + "; ".join(self.violations))


class ToolNotFoundError(DshError):
    """No tool of that name is visible to the calling scope."""

    code = ErrorCode.UNKNOWN_TOOL.value

    def __init__(self, name: str, route: str | None = None) -> None:
        self.tool_name = name
        message = f'unknown tool "{name}"'
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
