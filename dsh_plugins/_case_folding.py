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
import stat
import unicodedata
from typing import Final

__all__ = ["folded", "folds_case"]


def folded(text: str) -> str:
    """``text`` as a case- and normalisation-insensitive file system compares it."""
    return unicodedata.normalize("NFC", text).casefold()


@functools.lru_cache(maxsize=64)
def folds_case(directory: str) -> bool:
    """Whether names inside ``directory`` are compared ignoring case. Blocks on the file system.

    Found by looking an entry of the directory up under its other case
    (``lstat``, so a symlink of that name is no false positive): the
    directory's contents are what a value inside it names, and a case-folding
    mount or an ext4 ``casefold`` directory folds its entries, not its own name
    (which its parent holds). A directory not made yet is decided by the
    nearest one that is (it would be created there); one with no entry that
    has letters, by its own name looked up in its parent (the nearest such
    component up the path).
    """
    if os.name == "nt":
        return True
    path = directory
    while True:
        try:
            is_dir = stat.S_ISDIR(os.lstat(path).st_mode)
        except (OSError, ValueError):
            is_dir = False
        if is_dir or os.path.dirname(path) == path:
            break
        path = os.path.dirname(path)
    answer = _entries_fold(path) if is_dir else None
    return answer if answer is not None else _own_name_folds(path)


def _entries_fold(directory: str) -> bool | None:
    """Whether an entry of ``directory`` is found under its other case; ``None`` when none has letters."""
    try:
        with os.scandir(directory) as entries:
            for count, entry in enumerate(entries):
                if count >= _PROBED_ENTRIES:
                    break
                other_case = entry.name.swapcase()
                if other_case == entry.name or other_case.swapcase() != entry.name:
                    # No letters, or one whose other case is no plain variant ("ß" is "SS"): a file
                    # system that ignores case need not find it so, and one entry decides for all.
                    continue
                try:
                    this = os.lstat(os.path.join(directory, entry.name))
                    other = os.lstat(os.path.join(directory, other_case))
                except (OSError, ValueError):
                    return False
                return (this.st_dev, this.st_ino) == (other.st_dev, other.st_ino)
    except OSError:
        return None
    return None


# How many entries are looked at for one with letters: a directory of numbered files has none.
_PROBED_ENTRIES: Final = 64


def _own_name_folds(directory: str) -> bool:
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
