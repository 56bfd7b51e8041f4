"""Checks a plugin's settings class declares once, so a table reports all its problems at once.

An attrs validator runs only after every field has structured, stops at the
first problem and has no path below the table (``[plugins.shell]: invalid
value (...)``). A check written into the field's type instead runs while
:func:`~dsh_core.structure_table` structures the table, so each bad key is
reported with its path, together with every other problem::

    def at_least_one(value: int) -> str | None:
        return None if value >= 1 else f"must be at least 1, got {value}"

    @attrs.frozen(kw_only=True)
    class Settings:
        # structure_table checks the type; the validator checks what a host builds itself.
        timeout_ms: Annotated[int, TableCheck(at_least_one)] = attrs.field(
            default=1000, validator=check_validator(at_least_one)
        )

A check that needs several fields at once (``command`` or ``url``, not both) is
a :func:`keyed_check` on the class itself, ``Annotated[Server, keyed_check(...)]``
where the class is used (an array's items, a field); each of its problems names
the key it is about.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import attrs
from cattrs.errors import AttributeValidationNote, ClassValidationError

from ._config import _Check, _Mismatch
from ._errors import bounded_listing

__all__ = ["TableCheck", "check_validator", "keyed_check", "keyed_validator"]

T = TypeVar("T")


@attrs.frozen
class TableCheck(_Check):
    """``Annotated[X, TableCheck(problem)]``: a value of type X that ``problem`` must also accept.

    ``problem(value)`` gets the structured value and returns what is wrong
    (``"must be at least 1, got 0"``, shown after the value's path:
    ``[plugins.x].timeout_ms: must be at least 1, got 0``) or ``None``; only
    ``None`` passes. A check that raises (an ``int()`` or ``re.compile`` it
    calls), or returns anything but a ``str`` or ``None``, is reported as the
    value's problem, naming the check and what it raised or returned. Used by
    :func:`~dsh_core.structure_table` only; pair it with :func:`check_validator`
    so that the class refuses the same values when a host constructs it directly.
    """


def check_validator(problem: Callable[[Any], str | None]) -> Callable[[Any, attrs.Attribute[Any], Any], None]:
    """The same check as an attrs validator: ``ValueError("<key> <problem>")``; ``None`` passes.

    The key (the attribute's alias) comes first, so a problem worded to follow
    it (``must be at least 1, got 0``) reads as one sentence either way.
    """

    def validate(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        message = None if value is None else problem(value)
        if message is not None:
            if not isinstance(message, str):
                raise TypeError(f"the check of {attribute.alias} returned {message!r}; a check returns a str or None")
            raise ValueError(f"{attribute.alias} {message}")

    return validate


def keyed_check(problems: Callable[[T], Iterable[tuple[str, str]]]) -> TableCheck:
    """A :class:`TableCheck` on a whole table whose problems each name a key.

    ``problems(value)`` yields ``(key, message)`` for each thing wrong with the
    structured table; each is reported at ``<table path>.<key>``, or at the
    table's own path when ``key`` is ``""``. It runs only once every key of the
    table structured (it needs their values), but beside the problems of the
    other tables around it (another array item, say).
    """

    def problem(value: T) -> str | None:
        found = list(problems(value))
        if not found:
            return None
        errors: list[Exception] = []
        for key, message in found:
            error = _Mismatch(message)
            if key:
                error.__notes__ = [AttributeValidationNote(f"Checking {key}", key, None)]
            errors.append(error)
        raise ClassValidationError(f"While checking {type(value).__name__}", errors, type(value))

    return TableCheck(problem)


def keyed_validator(problems: Callable[[T], Iterable[tuple[str, str]]]) -> Callable[[T], None]:
    """The same check as :func:`keyed_check`, for a class a host builds itself: call it in ``__attrs_post_init__``.

    It raises ``ValueError`` listing every problem, each as ``"<key> <message>"``
    (the message alone for ``""``), bounded like dsh-tools' own messages::

        server_problems = ...  # yields (key, message)

        @attrs.frozen
        class Server:
            command: str | None = None
            url: str | None = None

            def __attrs_post_init__(self) -> None:
                keyed_validator(server_problems)(self)
    """

    def validate(value: T) -> None:
        found = [f"{key} {message}" if key else message for key, message in problems(value)]
        if found:
            raise ValueError(bounded_listing(found))

    return validate
