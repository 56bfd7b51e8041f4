"""Quoting a model's path in a message that goes back to the model: whole when short, by its ends when not."""

from __future__ import annotations

from typing import Final

__all__ = ["QUOTED_PATH_CHARS", "quoted_path"]

QUOTED_PATH_CHARS: Final = 300
"""A path longer than this is quoted by its two ends around an ellipsis (a megabyte path came back whole)."""


def quoted_path(path: str) -> str:
    """``repr(path)``; of a path too long to quote whole, its two ends around an ellipsis."""
    if len(path) > QUOTED_PATH_CHARS:
        half = QUOTED_PATH_CHARS // 2
        path = f"{path[:half]}…{path[-half:]}"
    return repr(path)
