"""Removing directory trees too deep for ``shutil.rmtree``, which tests that make them must do themselves.

On Python 3.11 ``shutil.rmtree`` recurses once per level: a tree 2 000
directories deep left in ``tmp_path`` makes pytest's own clean-up of old
temporary directories raise ``RecursionError`` in a later run. This walks with
one directory descriptor open at a time, so neither the depth nor the length
of the paths matters.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

__all__ = ["remove_deep_tree"]

_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)


def remove_deep_tree(root: Path) -> None:
    """Remove ``root`` and everything below it, depth first, without recursion."""
    fd = os.open(root, _FLAGS)
    names: list[str] = []  # the directories entered below root, by name
    while True:
        below = None
        for name in os.listdir(fd):
            if stat.S_ISDIR(os.stat(name, dir_fd=fd, follow_symlinks=False).st_mode):
                below = name
                break
            os.unlink(name, dir_fd=fd)
        if below is not None:
            child = os.open(below, _FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
            names.append(below)
            continue
        if not names:
            os.close(fd)
            os.rmdir(root)
            return
        parent = os.open("..", _FLAGS, dir_fd=fd)
        os.close(fd)
        os.rmdir(names.pop(), dir_fd=parent)
        fd = parent
