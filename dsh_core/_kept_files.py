"""Files the host keeps (grants, logs, ledger, configuration) that the model's file tools must not write.

A tool that writes files for the model (the bundled ``write_file`` and
``edit_file``) would otherwise let one allowed call rewrite the host's own
records: a forged line in the grants file is a standing approval of every
tool. Whoever keeps such a file names it in the runtime's
:class:`KeptFiles`; the writing tools ask :meth:`ToolRuntime.kept_file` before
they write, and refuse.

Names are compared when the question is asked, after ``realpath`` on both
sides (so ``./grants.jsonl``, ``x/../grants.jsonl``, an absolute path or a
symlink to the file are all the same file, even one created after it was
named), and by device and inode when both exist (a hard link, or another
letter case on a case-insensitive file system).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Mapping

from ._registry import Disposer

__all__ = ["KeptFiles", "kept_by"]


class KeptFiles:
    """The files one runtime's host keeps, each with the words a refusal gives for it ("the audit log")."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # the writing tools ask from worker threads
        # Each path's holds, oldest first: two keepers of one file (a plugin and the host) each
        # let go of their own, and the file stays kept while one holds it.
        self._files: dict[str, list[tuple[object, str]]] = {}

    def add(self, path: str | os.PathLike[str], what: str) -> Disposer:
        """Keep ``path`` (made absolute now) from the file tools; the returned callable lets go of this hold.

        The file stays kept while any hold on it remains; a refusal names it
        with the words of the latest.
        """
        name = os.path.abspath(os.fspath(path))
        hold = (object(), what)
        with self._lock:
            self._files.setdefault(name, []).append(hold)

        def forget() -> None:
            with self._lock:
                holds = self._files.get(name)
                if holds is not None and hold in holds:
                    holds.remove(hold)
                    if not holds:
                        del self._files[name]

        return Disposer(forget)

    def items(self) -> list[tuple[str, str]]:
        """Every kept file (absolute, as named) and what it is."""
        with self._lock:
            return [(name, holds[-1][1]) for name, holds in self._files.items()]


def kept_by(path: str, files: Iterable[tuple[str, str]] | Mapping[str, str]) -> str | None:
    """What ``path`` is when it is one of ``files`` (after ``realpath``, or the same inode), else ``None``.

    Blocks on the file system (``realpath`` and ``stat``): call it from a worker thread.
    """
    pairs = files.items() if isinstance(files, Mapping) else files
    real = os.path.realpath(path)
    try:
        status: os.stat_result | None = os.stat(real)
    except OSError:
        status = None
    for name, what in pairs:
        kept = os.path.realpath(name)
        if kept == real:
            return what
        if status is not None:
            try:
                if os.path.samestat(status, os.stat(kept)):
                    return what
            except OSError:
                continue
    return None
