"""Retrying a tool body that failed for a passing reason: the policy a tool declares and its schedule.

A retry belongs to the body, not to the execute waterfall: a wrapper's
``next()`` runs at most once (a second call would skip inner wrappers, which
is how a per-attempt budget would silently stop applying). So a tool declares
``retry=RetryPolicy(...)`` and the runtime re-runs the body alone, inside
whatever the wrappers installed: an outer timeout bounds every attempt and
every pause together (a pause it would cut is not begun: the failure stands
at once), and a cancelled caller stops the retrying at once.

Only failures the policy names are retried (``retry_on``; by default
:class:`TransientToolError`, ``ConnectionError`` and ``TimeoutError``), and a
failure of the output contract never is: the same body would return the
same wrong value. Retrying re-runs side effects, so declare it on tools whose
effects allow it (read-only, idempotent, or a body that raises
:class:`TransientToolError` only when nothing happened).

A body that returns ends the retrying (with a success, or with a value its
output contract refuses), even when the
attempt's own budget (``attempt_timeout_s``) ran out before it returned (a
shielded critical section, blocking work with no checkpoint): the budget is
there to cut short an attempt that hangs, and one that finished has done its
work, which another attempt would do again (a payment charged twice). Only
the caller's signal, or a wrapper's, replaces such a success (with
``ABORTED``, the success kept as ``execution.body_result``), and never
starts another attempt.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable
from typing import Any, Final

import attrs

from ._checks import callable_or_none
from ._errors import DshError, ErrorCode
from ._json import safe_repr
from ._results import error_message

__all__ = ["AttemptTimedOut", "RetryAttempt", "RetryPolicy", "TransientToolError"]

logger = logging.getLogger("dsh_core")

MAX_ATTEMPTS: Final = 100
"""The most attempts a policy may declare: more is a loop, not a retry."""


class TransientToolError(DshError):
    """Raised by a tool body for a failure that may pass: a rate limit, a dropped connection, a busy service.

    ``retry_after_s`` is how long the other side asked to be left alone
    (HTTP ``Retry-After``, say): the next attempt waits at least that long,
    and a request to wait longer than the policy's ``max_delay_s`` ends the
    retrying (the call fails now instead of outliving its usefulness). Without
    a ``retry`` policy on the tool it is an ordinary ``TOOL_ERROR``.

    A ``retry_after_s`` that is missing (a subclass with an ``__init__`` of its
    own) or invalid (assigned after construction, a raw header string) is
    taken as not asked, with a warning: the retrying follows the policy's own
    schedule, and the call still ends in the body's error.
    """

    code = ErrorCode.TOOL_ERROR.value

    def __init__(self, message: str, *, retry_after_s: float | None = None, code: str | None = None) -> None:
        if retry_after_s is not None and _duration(retry_after_s) is None:
            raise ValueError(f"retry_after_s must be a finite number of seconds >= 0, got {retry_after_s!r}")
        super().__init__(message, code=code)
        self.retry_after_s = retry_after_s


class AttemptTimedOut(DshError):
    """One attempt ran past its policy's ``attempt_timeout_s`` and was cancelled (``TOOL_TIMEOUT``)."""

    code = ErrorCode.TOOL_TIMEOUT.value


def _attempts(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if type(value) is not int or not 1 <= value <= MAX_ATTEMPTS:
        raise ValueError(f"RetryPolicy.max_attempts must be an int from 1 to {MAX_ATTEMPTS}, got {value!r}")


def _number(value: object) -> float | None:
    """``value`` as a finite float when it is a finite int or float (not a bool), else ``None``."""
    if type(value) not in (int, float):
        return None
    try:
        number = float(value)  # type: ignore[arg-type]
    except OverflowError:  # an int beyond a float's range
        return None
    return number if math.isfinite(number) else None


def _duration(value: object) -> float | None:
    """``value`` as seconds when it is a finite int or float >= 0 (not a bool), else ``None``."""
    number = _number(value)
    return number if number is not None and number >= 0 else None


def _asked_pause(error: BaseException) -> float | None:
    """The wait ``error`` asks for (``TransientToolError.retry_after_s``), or ``None`` when it asks none.

    The attribute is read with the care the constructor's check deserves: it
    can be skipped (a subclass's own ``__init__``) or overwritten after
    construction, and a bad value must not turn the body's failure into an
    exception out of ``execute``. Such a value is logged and taken as not asked.
    """
    if not isinstance(error, TransientToolError):
        return None
    try:
        asked = getattr(error, "retry_after_s", None)
    except Exception as exc:
        logger.warning(
            "%s (%s): reading retry_after_s raised %s: %s; retrying on the policy's own schedule",
            type(error).__name__, error_message(error), type(exc).__name__, error_message(exc),
        )  # fmt: skip
        return None
    if asked is None:
        return None
    seconds = _duration(asked)
    if seconds is None:
        logger.warning(
            "%s (%s) has retry_after_s=%s, not a finite number of seconds >= 0; retrying on the policy's own schedule",
            type(error).__name__, error_message(error), safe_repr(asked),
        )  # fmt: skip
    return seconds


def _seconds(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    number = _number(value)
    if number is None or number < 0:
        raise ValueError(f"RetryPolicy.{attribute.name} must be a finite number of seconds >= 0, got {value!r}")


def _optional_budget(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is None:
        return
    number = _number(value)
    if number is None or number <= 0:
        raise ValueError(f"RetryPolicy.attempt_timeout_s must be a positive finite number or None, got {value!r}")


def _multiplier(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    number = _number(value)
    if number is None or number < 1:
        raise ValueError(f"RetryPolicy.multiplier must be a finite number >= 1, got {value!r}")


def _jitter(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    number = _number(value)
    if number is None or not 0 <= number <= 1:
        raise ValueError(f"RetryPolicy.jitter must be a fraction from 0 to 1, got {value!r}")


def _retry_on(value: object) -> tuple[type[BaseException], ...]:
    classes = (value,) if isinstance(value, type) else value
    if not isinstance(classes, tuple) or not classes:
        raise TypeError(f"RetryPolicy.retry_on must be an exception class or a non-empty tuple of them, got {value!r}")
    for cls in classes:
        if not (isinstance(cls, type) and issubclass(cls, Exception)):
            raise TypeError(f"RetryPolicy.retry_on: {cls!r} is not an Exception subclass")
    return classes


@attrs.frozen(kw_only=True, slots=True)
class RetryPolicy:
    """How a tool's body is retried when it fails for a passing reason.

    - ``max_attempts``: attempts in all, the first included (``1`` never retries).
    - ``initial_delay_s``, ``multiplier``, ``max_delay_s``: the pause before
      attempt *n* + 1 is ``initial_delay_s * multiplier ** (n - 1)``, at most
      ``max_delay_s`` (exponential backoff).
    - ``jitter``: up to this fraction of each pause is taken off at random, so
      agents that failed together do not come back together (``0``: exact).
    - ``retry_on``: the exception classes worth another attempt, and
      ``retry_if`` (optional) a further test of such an error (a status code,
      an error code) that must return exactly ``True``.
    - ``attempt_timeout_s``: a budget for each attempt; one that runs past it
      is cancelled and counts as a passing failure (``TOOL_TIMEOUT`` if it was
      the last), unless it returns a success all the same: that success
      stands and is not run again. A budget for the call as a whole is the timeout plugin's
      ``timeout_ms``, which covers every attempt and pause.

    Raises:
        ValueError: a count or duration out of range.
        TypeError: ``retry_on`` holds something other than Exception classes.
    """

    max_attempts: int = attrs.field(default=3, validator=_attempts)
    initial_delay_s: float = attrs.field(default=0.5, validator=_seconds)
    multiplier: float = attrs.field(default=2.0, validator=_multiplier)
    max_delay_s: float = attrs.field(default=30.0, validator=_seconds)
    jitter: float = attrs.field(default=0.2, validator=_jitter)
    retry_on: tuple[type[BaseException], ...] = attrs.field(
        default=(TransientToolError, ConnectionError, TimeoutError), converter=_retry_on
    )
    attempt_timeout_s: float | None = attrs.field(default=None, validator=_optional_budget)
    retry_if: Callable[[BaseException], bool] | None = attrs.field(default=None, validator=callable_or_none)

    def retries(self, error: BaseException) -> bool:
        """Whether ``error`` is worth another attempt under this policy.

        A ``retry_if`` that raises is taken as "no" (and logged): the call then
        fails with the body's own error, not the predicate's.
        """
        if isinstance(error, AttemptTimedOut):
            return True
        if not isinstance(error, self.retry_on):
            return False
        if self.retry_if is None:
            return True
        try:
            return self.retry_if(error) is True
        except Exception as exc:
            logger.warning("RetryPolicy.retry_if raised %s: %s; not retrying", type(exc).__name__, exc)
            return False

    def _backoff(self, steps: int) -> float:
        """``initial_delay_s * multiplier ** steps``, at most ``max_delay_s``.

        Grown one step at a time and stopped at the cap: the power itself can
        exceed a float long before the attempts run out (``2000 ** 95``), and
        must not turn a retry into an ``OverflowError``.
        """
        delay = float(self.initial_delay_s)
        for _ in range(steps):
            if delay >= self.max_delay_s:
                break
            delay *= self.multiplier  # at worst inf, never an error: min() below caps it
        return min(delay, self.max_delay_s)

    def pause_before(
        self, attempt: int, error: BaseException, *, uniform: Callable[[], float] = random.random
    ) -> float | None:
        """Seconds to wait before attempt ``attempt`` (2 or more), or ``None`` to stop retrying.

        ``None`` when ``attempt`` is past ``max_attempts``, or when ``error``
        asks for a longer wait (``retry_after_s``) than ``max_delay_s`` allows.
        A missing or invalid ``retry_after_s`` asks for nothing (and is logged).
        """
        if attempt > self.max_attempts:
            return None
        backoff = self._backoff(attempt - 2)
        backoff -= backoff * self.jitter * uniform()
        asked = _asked_pause(error)
        if asked is not None:
            if asked > self.max_delay_s:
                return None
            return max(backoff, asked)
        return backoff


@attrs.frozen(kw_only=True, slots=True)
class RetryAttempt:
    """One failed attempt that was retried: sent as a ``tool/retry`` event and kept in the decision trace.

    ``attempt`` is the number of the attempt that failed (1 for the first),
    ``pause_s`` the wait before the next one, ``code``/``message`` the failure.
    """

    call_id: str
    root_call_id: str
    tool: str
    attempt: int
    pause_s: float
    code: str
    message: str

    def to_json(self) -> dict[str, Any]:
        return {
            "call_id": self.call_id,
            "root_call_id": self.root_call_id,
            "tool": self.tool,
            "attempt": self.attempt,
            "pause_s": self.pause_s,
            "code": self.code,
            "message": self.message,
        }
