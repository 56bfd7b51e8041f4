"""Model-facing content blocks and deferred user messages."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal, TypeAlias

import attrs

from ._checks import instance_of
from ._json import JsonValue, snapshot_json

__all__ = ["ContentBlock", "ImageBlock", "TextBlock", "UserMessage", "as_content", "text_block", "text_of"]


# Content crosses into JSON and terminals: a str subclass (with its own __str__, say) is refused.
_str_field = instance_of(str, exact=True)


@attrs.frozen(slots=False)  # built for nearly every result: the dict form constructs faster
class TextBlock:
    """A run of text the model reads."""

    text: str = attrs.field(validator=_str_field)
    type: Literal["text"] = attrs.field(default="text", init=False)


_new_object = object.__new__


def text_block(text: str) -> TextBlock:
    """``TextBlock(text)`` for a ``text`` the caller knows is a ``str`` (skips the validator)."""
    block: TextBlock = _new_object(TextBlock)
    fields = block.__dict__
    fields["text"] = text
    fields["type"] = "text"
    return block


@attrs.frozen(slots=True)
class ImageBlock:
    """An image, as base64 ``data`` with its ``mime_type``."""

    data: str = attrs.field(validator=_str_field)
    mime_type: str = attrs.field(validator=_str_field)
    type: Literal["image"] = attrs.field(default="image", init=False)


ContentBlock: TypeAlias = TextBlock | ImageBlock


def as_content(blocks: object, *, what: str = "content") -> tuple[ContentBlock, ...]:
    """Check that ``blocks`` is an iterable of content blocks and freeze it as a tuple.

    Raises ``TypeError`` naming the first offending position; a ``str`` is refused
    (it is iterable, but almost always a forgotten ``[TextBlock(...)]``).
    """
    kind = type(blocks)
    if kind is not list and kind is not tuple and (isinstance(blocks, (str, bytes)) or not isinstance(blocks, Iterable)):
        raise TypeError(f"{what} must be a list of content blocks, got {type(blocks).__name__}")
    out: tuple[Any, ...] = blocks if kind is tuple else tuple(blocks)  # type: ignore[assignment, arg-type]
    for index, block in enumerate(out):
        if type(block) is not TextBlock and type(block) is not ImageBlock:
            raise TypeError(f"{what}[{index}] must be a TextBlock or ImageBlock, got {type(block).__name__}")
    return out


def text_of(blocks: Iterable[ContentBlock]) -> str:
    """Texts of text blocks and ``[<type> content]`` for the others, joined by newlines."""
    return "\n".join(b.text if isinstance(b, TextBlock) else f"[{b.type} content]" for b in blocks)





def _message_content(value: object) -> tuple[ContentBlock, ...]:
    return as_content(value, what="UserMessage.content")


def _named_source(instance: UserMessage, attribute: attrs.Attribute[str], value: object) -> None:
    # A session log keeps the source to say whose message it was; replay refuses one naming nobody.
    _str_field(instance, attribute, value)
    if not value:
        raise ValueError("UserMessage.source must not be empty (name who produced the message)")


@attrs.frozen(slots=True)
class UserMessage:
    """A context deferred until after the tool result (``ToolRunContext.defer_context``).

    ``source`` says who produced it (a plugin or tool name; never empty);
    ``meta`` is any lossless JSON the host wants to keep with it.
    """

    content: tuple[ContentBlock, ...] = attrs.field(converter=_message_content)
    source: str = attrs.field(default="tool", validator=_named_source)
    meta: JsonValue = attrs.field(default=None, converter=snapshot_json)
