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

    def shortened(self, limit: int) -> str:
        """The spelled path, or when longer than ``limit`` its start and end around ``…`` (``limit`` chars).

        Only the ends are spelled out: a path thousands of levels deep, or
        holding a key of megabytes, costs a walk along its links, not a copy.
        """
        segments: list[str] = []
        length = 0
        link: LinkedPath | None = self
        while link is not None:
            segments.append(link.segment)
            length += len(link.segment)
            link = link.parent
        segments.reverse()
        if length <= limit:
            return "".join(segments)
        head_chars = (limit - 1) // 2
        return _first_chars(segments, head_chars) + "…" + _last_chars(segments, limit - 1 - head_chars)

    def __repr__(self) -> str:
        return f"LinkedPath({str(self)!r})"


def _first_chars(segments: list[str], count: int) -> str:
    taken: list[str] = []
    for segment in segments:
        if count <= 0:
            break
        taken.append(segment[:count])
        count -= len(taken[-1])
    return "".join(taken)


def _last_chars(segments: list[str], count: int) -> str:
    taken: list[str] = []
    for segment in reversed(segments):
        if count <= 0:
            break
        taken.append(segment[max(len(segment) - count, 0) :])
        count -= len(taken[-1])
    return "".join(reversed(taken))
