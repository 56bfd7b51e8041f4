"""Policy decisions returned by the pre- and post-execute waterfalls.

Malformed decisions raise :class:`PolicyError` at construction, inside the
listener that built them, so the resulting failure carries ``POLICY_ERROR`` and
names that listener's plugin: a broken decision can never let a call through.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, TypeAlias

import attrs

from ._content import ContentBlock, TextBlock, UserMessage, as_content
from ._errors import NonJsonValueError, PolicyError
from ._json import JsonValue, safe_repr, snapshot_json

__all__ = ["APPROVAL_ANSWERS", "UNSET", "Accept", "Allow", "Ask", "Block", "Deny", "PostToolDecision", "PreToolDecision", "Rewrite"]


class _Unset:
    __slots__ = ()

    def __repr__(self) -> str:
        return "UNSET"

    def __bool__(self) -> bool:
        return False


UNSET: Final = _Unset()
"""Marks an ``Accept`` that keeps the value (``value=None`` would replace it with JSON null)."""


def _contexts(value: object) -> tuple[UserMessage, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise PolicyError(f"additional_contexts must be a sequence of UserMessage, got {type(value).__name__}")
    out = tuple(value)
    for index, item in enumerate(out):
        if not isinstance(item, UserMessage):
            raise PolicyError(f"additional_contexts[{index}] must be a UserMessage, got {type(item).__name__}")
    return out


def _policy_content(value: object) -> tuple[ContentBlock, ...]:
    try:
        return as_content(value)
    except TypeError as exc:
        raise PolicyError(str(exc)) from None


def _optional_policy_content(value: object) -> tuple[ContentBlock, ...] | None:
    return None if value is None else _policy_content(value)


@attrs.frozen(slots=True)
class Allow:
    """Let the call proceed (guards still apply)."""


@attrs.frozen(slots=True)
class Deny:
    """Refuse the call; ``reason`` becomes the failure message the model reads."""

    reason: str = attrs.field()

    @reason.validator
    def _check(self, attribute: attrs.Attribute[str], value: object) -> None:
        if type(value) is not str or not value.strip():
            raise PolicyError(f"Deny needs a non-empty reason string, got {safe_repr(value)}")


APPROVAL_ANSWERS: Final = ("allowed-once", "denied", "cancelled", "unavailable")
"""Every answer an ``ApprovalService`` may give to an :class:`Ask`; anything else fails the call ``POLICY_ERROR``."""


@attrs.frozen(slots=True)
class Ask:
    """Ask the approval service; the call runs only on ``"allowed-once"``."""

    reason: str | None = attrs.field(default=None)

    @reason.validator
    def _check(self, attribute: attrs.Attribute[str | None], value: object) -> None:
        if value is not None and type(value) is not str:
            raise PolicyError(f"Ask.reason must be a str or None, got {type(value).__name__}")


def _rewritten_arguments(value: object) -> JsonValue:
    try:
        arguments = snapshot_json(value)
    except NonJsonValueError as exc:
        raise PolicyError(f"Rewrite arguments must be lossless JSON: {exc}") from None
    if not isinstance(arguments, Mapping):
        raise PolicyError(f"Rewrite arguments must be an object, got {type(value).__name__}")
    return arguments


@attrs.frozen(slots=True)
class Rewrite:
    """Run the call with other ``arguments``, once every policy has approved them.

    The runtime validates the new arguments against the tool's schema
    (``INVALID_ARGS`` naming the rewriting plugin when they do not fit), then
    runs the whole pre-execute stage again on the rewritten call: every
    listener, approval and guard decides on what will actually run, so a
    rewrite can never carry a call past a policy. A rewrite to the arguments the
    call already has changes nothing: it stands for the decision of the
    listeners inside the rewriting one on that pass (what its ``next()``
    returned, or, when it never called ``next()``, what they decide when run
    then; an ``Allow`` only when it caught an exception from ``next()``), and
    the listeners outside it see that decision. More than :data:`MAX_REWRITES`
    rewrites of one call fail it (``POLICY_ERROR``). ``reason`` is required: the result
    tells the model its arguments were changed, by whom and why, and what ran.
    """

    arguments: JsonValue = attrs.field(converter=_rewritten_arguments)
    reason: str = attrs.field()

    @reason.validator
    def _check(self, attribute: attrs.Attribute[str], value: object) -> None:
        if type(value) is not str or not value.strip():
            raise PolicyError(f"Rewrite needs a non-empty reason string, got {safe_repr(value)}")


MAX_REWRITES: Final = 3
"""How many times the pre-execute stage may rewrite one call's arguments before the call fails."""


@attrs.frozen(slots=True, kw_only=True)
class Accept:
    """Accept the result, optionally replacing its ``content`` xor its ``value``.

    A content replacement keeps the canonical value and meta (presentation, not
    confidentiality); a value replacement is revalidated against the tool's output
    schema and re-rendered. ``additional_contexts`` ride the result either way.
    """

    content: tuple[ContentBlock, ...] | None = attrs.field(default=None, converter=_optional_policy_content)
    value: JsonValue | _Unset = UNSET
    additional_contexts: tuple[UserMessage, ...] = attrs.field(default=(), converter=_contexts)

    def __attrs_post_init__(self) -> None:
        if self.content is not None and self.value is not UNSET:
            raise PolicyError("an Accept decision cannot replace both value and content")


def _feedback(value: object) -> tuple[ContentBlock, ...]:
    # A plain string is the common case, as for Deny(reason): it is the one text block.
    if type(value) is str:
        if not value.strip():
            raise PolicyError("Block feedback string must not be blank (pass [] for the default message)")
        return (TextBlock(value),)
    return _policy_content(value)


@attrs.frozen(slots=True)
class Block:
    """Turn the result into a failure carrying corrective ``feedback`` for the model.

    ``feedback`` is a string or a list of content blocks. The value is dropped,
    and so are contexts the tool deferred: only this decision's own
    ``additional_contexts`` survive.
    """

    feedback: tuple[ContentBlock, ...] = attrs.field(converter=_feedback)
    additional_contexts: tuple[UserMessage, ...] = attrs.field(default=(), converter=_contexts, kw_only=True)


PreToolDecision: TypeAlias = Allow | Deny | Ask | Rewrite
PostToolDecision: TypeAlias = Accept | Block

PRE_DECISION_TYPES: Final[tuple[type[Any], ...]] = (Allow, Deny, Ask, Rewrite)
POST_DECISION_TYPES: Final[tuple[type[Any], ...]] = (Accept, Block)
