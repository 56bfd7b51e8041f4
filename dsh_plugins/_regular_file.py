"""Opening a file only if it is a regular file when it is opened, not when it was checked.

A path checked with ``stat`` can be swapped for a FIFO before it is opened, and a
plain ``open`` of a FIFO blocks until a writer (or reader) turns up: forever, in
a worker thread no cancellation reaches. Opening with ``O_NONBLOCK`` returns at
once whatever the path is now, and ``fstat`` of the descriptor says what was
actually opened.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import BinaryIO, Final

__all__ = ["NotRegularFileError", "open_regular"]

_NONBLOCK: Final = getattr(os, "O_NONBLOCK", 0)
_COMMON_FLAGS: Final = _NONBLOCK | getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW: Final = getattr(os, "O_NOFOLLOW", 0)
# ELOOP: O_NOFOLLOW met a symlink. ENXIO: a FIFO without a reader, opened to write without blocking.
_NOT_REGULAR_ERRNOS: Final = frozenset({errno.ELOOP, errno.ENXIO})


class NotRegularFileError(OSError):
    """The path is (now) a directory, FIFO, device, socket or, with ``follow_symlinks=False``, a symlink."""

    def __init__(self, path: str, *, is_directory: bool = False) -> None:
        super().__init__(f"{path!r} is not a regular file")
        self.path = path
        self.is_directory = is_directory


def open_regular(path: str, *, write: bool = False, follow_symlinks: bool = False) -> BinaryIO:
    """``path`` opened ``"rb"`` (or ``"wb"``: created or truncated with ``write``), if it is a regular file.

    Never blocks on what the path turned out to be. Without ``follow_symlinks``
    (for a path already resolved with ``realpath``) a symlink swapped in since is
    refused rather than followed out of wherever the path was checked to be.

    Raises :class:`NotRegularFileError` for anything but a regular file, and
    ``OSError`` (``FileNotFoundError``, ``PermissionError``...) as ``open`` does.
    """
    flags = _COMMON_FLAGS | (0 if follow_symlinks else _NOFOLLOW)
    flags |= os.O_WRONLY | os.O_CREAT | os.O_TRUNC if write else os.O_RDONLY
    try:
        fd = os.open(path, flags, 0o666)
    except OSError as exc:
        if exc.errno in _NOT_REGULAR_ERRNOS:
            raise NotRegularFileError(path) from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise NotRegularFileError(path, is_directory=stat.S_ISDIR(mode))
        if _NONBLOCK:
            os.set_blocking(fd, True)  # what a plain open gives a regular file
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "wb" if write else "rb")
