"""Opening a file only if it is a regular file when it is opened, not when it was checked; replacing one whole.

A path checked with ``stat`` can be swapped for a FIFO before it is opened, and a
plain ``open`` of a FIFO blocks until a writer (or reader) turns up: forever, in
a worker thread no cancellation reaches. Opening with ``O_NONBLOCK`` returns at
once whatever the path is now, and ``fstat`` of the descriptor says what was
actually opened.

:func:`write_regular` gives a file new content without ever leaving it half
written: the bytes go to a temporary file beside it (``.NAME.dsh-<random>.tmp``,
created exclusively and, replacing a file, readable only by its owner until it
is done), which takes the file's permission bits, owner and group, is flushed to
disk and then renamed over the file.
A crash, a kill or a full disk part-way leaves the original as it was (and, at
worst, a temporary file with that recognisable name). A new file's mode follows
the umask (and a directory's default ACL) as a plain ``open`` would: its
temporary file is created with ``0o666``, so the kernel applies them, and no
umask is read (``os.umask`` can only be read by setting it, a race with every
other thread). The rename would change what the file is, so two files are
still written in place, truncated and rewritten as before:

- one with more than one hard link: a rename would leave the other names on the
  old content, splitting the link;
- one whose owner or group the process cannot give the temporary file (another
  user's file it may write, for a process that is not root): a rename would
  silently hand the file to the process's user;
- one in a directory the process may not create files in (a writable file in a
  read-only directory): there is nowhere to put the temporary file.

A rename also drops extended attributes and ACLs the file had; its owner, group
and permission bits (set-id and sticky bits included) are kept.

A path resolved with ``realpath`` has no symlink left in it, but one can be
swapped in, for any directory on the way, between the check of where the path
leads and its use: an ``O_NOFOLLOW`` open guards the last name only. So a
resolved path is walked: each directory is opened relative to the one before
it, never following a symlink, and the file, its temporary file and the rename
use the last directory's descriptor. A symlink met on the way is refused
(:class:`PathChangedError`) instead of followed out of the checked place. Where
descriptors cannot stand for directories (Windows), or a directory on the way
may be searched but not opened (no ``O_PATH``), the path is used as it is.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Iterator
from typing import BinaryIO, Final

__all__ = [
    "PATH_MAX",
    "NotRegularFileError",
    "PathChangedError",
    "make_directories",
    "open_regular",
    "remove_resolved",
    "write_regular",
]

_NONBLOCK: Final = getattr(os, "O_NONBLOCK", 0)
_CLOEXEC: Final = getattr(os, "O_CLOEXEC", 0)
_COMMON_FLAGS: Final = _NONBLOCK | _CLOEXEC
_NOFOLLOW: Final = getattr(os, "O_NOFOLLOW", 0)
# ELOOP: O_NOFOLLOW met a symlink. ENXIO: a FIFO without a reader, opened to write without blocking.
_NOT_REGULAR_ERRNOS: Final = frozenset({errno.ELOOP, errno.ENXIO})
_TEMP_FLAGS: Final = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
# How much of the file's name its temporary file's name keeps: with the rest it stays under NAME_MAX (255 bytes).
_TEMP_NAME_KEPT_BYTES: Final = 128
_TEMP_ATTEMPTS: Final = 16
_DIRECTORY: Final = getattr(os, "O_DIRECTORY", 0)
# O_PATH opens a directory the process may search but not list (mode 0o111) and reads nothing.
_WALK_FLAGS: Final = (getattr(os, "O_PATH", 0) or os.O_RDONLY) | _DIRECTORY | _NOFOLLOW | _CLOEXEC
# os.replace takes the directory descriptors os.rename does (supports_dir_fd lists rename only).
_CAN_WALK: Final = bool(_DIRECTORY and _NOFOLLOW) and {os.open, os.rename, os.unlink} <= os.supports_dir_fd
_CAN_MAKE: Final = _CAN_WALK and os.mkdir in os.supports_dir_fd


def _path_max() -> int:
    try:
        return os.pathconf("/", "PC_PATH_MAX")
    except (AttributeError, OSError, ValueError):  # no pathconf (Windows), or no such limit
        return 4096


PATH_MAX: Final = _path_max()
"""The size in bytes (its NUL included) a path the path-based calls take must stay under; 4096 on Linux."""


class NotRegularFileError(OSError):
    """The path is (now) a directory, FIFO, device, socket or, with ``follow_symlinks=False``, a symlink."""

    def __init__(self, path: str, *, is_directory: bool = False) -> None:
        super().__init__(f"{path!r} is not a regular file")
        self.path = path
        self.is_directory = is_directory


class PathChangedError(OSError):
    """A directory on the way to a resolved path is a symlink now: it changed since the path was resolved."""

    def __init__(self, path: str) -> None:
        super().__init__(
            errno.ELOOP, f"{path!r} changed since it was checked: a directory on the way to it is now a symlink"
        )
        self.path = path


class _Place:
    """Where a file's operations are aimed: its name in an open directory, or its whole path."""

    __slots__ = ("directory", "directory_fd", "name")

    def __init__(self, path: str, directory_fd: int | None) -> None:
        self.directory_fd = directory_fd
        encoded = os.fsencode(path)
        self.directory, base = os.path.split(encoded)
        self.name = base if directory_fd is not None else encoded

    def entry(self, name: bytes) -> bytes:
        """How the operations name ``name``, a file beside this one."""
        return name if self.directory_fd is not None else os.path.join(self.directory, name)

    def close(self) -> None:
        if self.directory_fd is not None:
            os.close(self.directory_fd)


@contextlib.contextmanager
def _placed(path: str) -> Iterator[_Place]:
    directory_fd = _walk_to_directory(path) if _CAN_WALK else None
    place = _Place(path, directory_fd)
    try:
        yield place
    finally:
        place.close()


def _walk_to_directory(path: str) -> int | None:
    """The directory holding ``path`` (resolved), opened one name at a time without following a symlink.

    ``None`` when a directory on the way cannot be opened at all (searchable, not
    readable, without ``O_PATH``): the caller then uses the path as it is.
    """
    return _walk(os.path.dirname(os.fsencode(path)), path, make=False)


def _walk(directory: bytes, path: str, *, make: bool) -> int | None:
    """``directory`` opened from ``/`` (or ``.``) one name at a time, never following a symlink.

    With ``make``, a missing name is made first. ``None`` when a directory on
    the way cannot be opened (see :func:`_walk_to_directory`); ``path`` is what
    errors name.
    """
    names = [name for name in directory.split(b"/") if name]
    try:
        fd = os.open(b"/" if directory.startswith(b"/") else b".", _WALK_FLAGS)
    except PermissionError:
        return None
    walked = b"/" if directory.startswith(b"/") else b""
    try:
        for name in names:
            following = _open_or_make(fd, name, walked + name, path, make=make)
            if following is None:
                os.close(fd)
                return None
            os.close(fd)
            fd = following
            walked += name + b"/"
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_regular_fd(path: str, flags: int, place: _Place | None = None) -> int:
    """A descriptor of ``path`` opened with ``flags`` without blocking, if it is a regular file; blocking after."""
    # Unlike dsh_core._session_log._open_regular_file: no stat by path first, O_NOFOLLOW when asked, mode 0o666, NotRegularFileError (an OSError).
    try:
        if place is None:
            fd = os.open(path, flags | _COMMON_FLAGS, 0o666)
        else:
            fd = os.open(place.name, flags | _COMMON_FLAGS, 0o666, dir_fd=place.directory_fd)
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
    return fd


def open_regular(path: str, *, follow_symlinks: bool = False, resolved: bool = False) -> BinaryIO:
    """``path`` opened ``"rb"``, if it is a regular file.

    Never blocks on what the path turned out to be. Without ``follow_symlinks``
    a symlink swapped in for the file since it was checked is refused rather than
    followed out of wherever the path was checked to be; a ``resolved`` path
    (``realpath``'s) refuses one swapped in for any directory on the way too
    (:class:`PathChangedError`).

    Raises :class:`NotRegularFileError` for anything but a regular file, and
    ``OSError`` (``FileNotFoundError``, ``PermissionError``...) as ``open`` does.
    """
    flags = os.O_RDONLY | (0 if follow_symlinks else _NOFOLLOW)
    if not resolved:
        return os.fdopen(_open_regular_fd(path, flags), "rb")
    with _placed(path) as place:
        return os.fdopen(_open_regular_fd(path, flags, place), "rb")


def write_regular(path: str, data: bytes) -> None:
    """Make ``data`` the content of ``path`` (resolved with ``realpath``), created if missing: atomically, see above.

    An existing ``path`` must be a regular file the process may write (it is
    opened for writing, never truncated by that, first): otherwise this raises
    as :func:`open_regular` does, or ``PermissionError``, and writes nothing.
    Any ``OSError`` (a full disk, a directory the process cannot create a file
    in) leaves ``path`` as it was and no temporary file behind; a directory on
    the way swapped for a symlink raises :class:`PathChangedError`.
    """
    with _placed(path) as place:
        try:
            target: int | None = _open_regular_fd(path, os.O_WRONLY | _NOFOLLOW, place)
        except FileNotFoundError:
            target = None
        try:
            status = None if target is None else os.fstat(target)
            # A hard-linked file, or one whose owner the rename would not keep: rewritten in place.
            hard_linked = status is not None and status.st_nlink > 1
            if hard_linked or not _replace(place, data, status):
                _write_in_place(target, data)
        finally:
            if target is not None:
                os.close(target)


def make_directories(path: str) -> None:
    """Create the directory ``path`` (resolved with ``realpath``) and every parent it lacks.

    What ``os.makedirs(path, exist_ok=True)`` does, without its two hazards:
    it recurses once per missing directory (a path 2 000 directories deep from
    a model raised ``RecursionError``), and it follows symlinks, so a directory
    on the way swapped for one would have the new directories made wherever
    it points. Here each name is opened, or made and then opened, relative to
    the directory before it, never following a symlink (:class:`PathChangedError`);
    where directories cannot be walked by descriptor, the names are made one
    by one by path, in a loop. A name that exists and is not a directory raises
    ``FileExistsError`` naming ``path``.
    """
    if len(os.fsencode(path)) >= PATH_MAX:
        # Made by descriptor, a longer path would exist where no path-based call (realpath,
        # ripgrep, the other tools) could reach it; os.makedirs refused it the same way.
        raise OSError(errno.ENAMETOOLONG, os.strerror(errno.ENAMETOOLONG), path)
    if _CAN_MAKE and _make_walking(path):
        return
    missing: list[str] = []
    current = path
    while not os.path.isdir(current):
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory)
        except FileExistsError:
            if not os.path.isdir(directory):
                raise FileExistsError(errno.EEXIST, "a file is in the way of a directory", path) from None


def _make_walking(path: str) -> bool:
    """:func:`make_directories` by descriptor; ``False`` when a directory on the way cannot be opened."""
    fd = _walk(os.fsencode(path), path, make=True)
    if fd is None:
        return False
    os.close(fd)
    return True


def _open_or_make(fd: int, name: bytes, shown: bytes, path: str, *, make: bool) -> int | None:
    """The directory ``name`` in ``fd`` opened (made first when missing, with ``make``); ``None``: not openable."""
    for _ in range(2):  # made by someone else between the open and the mkdir: open it then
        try:
            return os.open(name, _WALK_FLAGS, dir_fd=fd)
        except FileNotFoundError:
            if not make:
                raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), path) from None
        except PermissionError:
            return None
        except OSError as exc:
            # O_NOFOLLOW meeting a symlink: ELOOP (Linux), ENOTDIR with O_DIRECTORY elsewhere.
            if exc.errno == errno.ELOOP or (exc.errno == errno.ENOTDIR and os.path.islink(shown)):
                raise PathChangedError(path) from None
            if make and exc.errno == errno.ENOTDIR:
                raise FileExistsError(errno.EEXIST, "a file is in the way of a directory", path) from None
            raise type(exc)(exc.errno, exc.strerror, path) from None
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o777, dir_fd=fd)
    raise PathChangedError(path)


def remove_resolved(path: str) -> None:
    """Remove the file at ``path`` (resolved with ``realpath``), refusing a directory on the way swapped for a symlink."""
    with _placed(path) as place:
        os.unlink(place.name, dir_fd=place.directory_fd)


def _write_in_place(fd: int | None, data: bytes) -> None:
    assert fd is not None  # only an existing file is written in place
    os.ftruncate(fd, 0)
    _write_all(fd, data)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _replace(place: _Place, data: bytes, status: os.stat_result | None) -> bool:
    """``data`` written to a temporary file renamed over the file at ``place``.

    ``False`` (nothing done) when the owner cannot be kept, or the directory refuses
    the temporary file of a file that exists.
    """
    directory_fd = place.directory_fd
    # A new file's temporary file is created as the file would be (0o666 less the umask); an
    # existing one's only for its owner until it has the file's own bits, however open they are.
    try:
        fd, temp = _create_temp(place, 0o666 if status is None else 0o600)
    except PermissionError:
        if status is None:
            raise  # a new file cannot be created there at all
        return False  # the file may be writable where its directory is not: written in place
    replaced = False
    try:
        try:
            if status is not None:
                if not _take_owner(fd, status):
                    return False
                os.fchmod(fd, stat.S_IMODE(status.st_mode))  # after fchown, which clears set-id bits
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, place.name, src_dir_fd=directory_fd, dst_dir_fd=directory_fd)
        replaced = True
    finally:
        if not replaced:
            with contextlib.suppress(OSError):
                os.unlink(temp, dir_fd=directory_fd)
    _sync_directory(place)
    return True


def _create_temp(place: _Place, mode: int) -> tuple[int, bytes]:
    # Dot-prefixed, so listings and globs skip it; random, so it names no user's file.
    name = os.path.basename(place.name)
    for attempt in range(_TEMP_ATTEMPTS):
        temp = place.entry(b".%s.dsh-%s.tmp" % (_name_start(name), secrets.token_hex(8).encode()))
        try:
            return os.open(temp, _TEMP_FLAGS, mode, dir_fd=place.directory_fd), temp
        except FileExistsError:
            if attempt == _TEMP_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


def _name_start(name: bytes) -> bytes:
    """At most the first ``_TEMP_NAME_KEPT_BYTES`` of ``name``, never ending inside a UTF-8 character.

    A name cut mid-character is invalid UTF-8, which some file systems (APFS) refuse.
    """
    kept = name[:_TEMP_NAME_KEPT_BYTES]
    # Back off continuation bytes (10xxxxxx) and the lead byte they belong to, unless the character is whole.
    end = len(kept)
    while end > 0 and kept[end - 1] & 0xC0 == 0x80:
        end -= 1
    if end > 0 and kept[end - 1] >= 0xC0:
        lead = kept[end - 1]
        length = 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
        if len(kept) - (end - 1) < length:
            return kept[: end - 1]
    return kept


def _take_owner(fd: int, status: os.stat_result) -> bool:
    """Whether the temporary file ``fd`` has (or could be given) the owner and group of the file it replaces."""
    made = os.fstat(fd)
    if (made.st_uid, made.st_gid) == (status.st_uid, status.st_gid):
        return True
    try:
        os.fchown(fd, status.st_uid, status.st_gid)
    except PermissionError:
        return False
    return True


def _sync_directory(place: _Place) -> None:
    # The rename is on disk only once the directory is; best effort: some file systems refuse it.
    # Reopened to read: an O_PATH descriptor cannot be synced.
    flags = os.O_RDONLY | _DIRECTORY | _CLOEXEC
    try:
        if place.directory_fd is not None:
            fd = os.open(b".", flags, dir_fd=place.directory_fd)
        else:
            fd = os.open(place.directory or b".", flags)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
