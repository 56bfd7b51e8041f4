"""File systems that ignore case: where ``SECRETS/key`` and ``secrets/key`` are one file.

macOS (APFS, HFS+) and Windows (NTFS) ignore case by default, and APFS
ignores Unicode normalisation too. ``realpath`` keeps the spelling it was
given, so a path compared as text with a path from elsewhere (a rule's glob,
a directory git runs files from) must be compared as the file system
compares names, or another spelling of the same file gets past the check.
"""

from __future__ import annotations

import functools
import os
import unicodedata

__all__ = ["folded", "folds_case"]


def folded(text: str) -> str:
    """``text`` as a case- and normalisation-insensitive file system compares it."""
    return unicodedata.normalize("NFC", text).casefold()


@functools.lru_cache(maxsize=64)
def folds_case(directory: str) -> bool:
    """Whether the file system holding ``directory`` ignores case. Blocks on the file system.

    Found by looking the nearest existing component with letters up under its
    other case (``lstat``, so a symlink of that name is no false positive). A
    directory that does not exist yet (a file about to be written two levels
    down) is decided by the nearest one that does: it would be created there.
    """
    if os.name == "nt":
        return True
    path = directory
    while True:
        name = os.path.basename(path)
        parent = os.path.dirname(path)
        if name.swapcase() != name:
            try:
                this = os.lstat(path)
            except FileNotFoundError:
                this = None
            except (OSError, ValueError):
                return False
            if this is not None:
                try:
                    other = os.lstat(os.path.join(parent, name.swapcase()))
                except (OSError, ValueError):
                    return False
                return (this.st_dev, this.st_ino) == (other.st_dev, other.st_ino)
        if parent == path:
            return False
        path = parent
