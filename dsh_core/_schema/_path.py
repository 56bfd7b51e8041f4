"""``LinkedPath``: the path of a node in a deep walk, spelled out only for a message.

The schema walks keep the path of every node they have yet to finish. Kept as
text, each level would hold a copy of its whole ancestry, so a schema nested
40 000 levels deep would need gigabytes; kept as links to the parent, each
level holds its own segment and nothing more.
"""

from __future__ import annotations

__all__ = ["LinkedPath"]


class LinkedPath:
    """A path made of its parent and one more segment; ``str()`` (or an f-string) spells it out.

    ``blank`` says whether the spelled path is empty, without spelling it (a
    root path of ``""`` reads differently from ``"value"`` in messages).
    """

    __slots__ = ("blank", "parent", "segment")

    def __init__(self, parent: LinkedPath | None, segment: str) -> None:
        self.parent: LinkedPath | None = parent
        self.segment = segment
        self.blank: bool = not segment and (parent is None or parent.blank)

    @classmethod
    def root(cls, text: str) -> LinkedPath:
        return cls(None, text)

    def child(self, segment: str) -> LinkedPath:
        return LinkedPath(self, segment)

    def __str__(self) -> str:
        segments: list[str] = []
        link: LinkedPath | None = self
        while link is not None:
            segments.append(link.segment)
            link = link.parent
        return "".join(reversed(segments))

    def __repr__(self) -> str:
        return f"LinkedPath({str(self)!r})"
