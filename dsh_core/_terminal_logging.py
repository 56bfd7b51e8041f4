"""Log records that reach the terminal with nothing configured, escaped as the rest of the CLI's output is.

With no handler set up, Python prints a WARNING through ``logging.lastResort``,
raw. The project's warnings name what an MCP server listed, what a session log
holds, what a plugin raised: text a server or a model chose, which could drive
the terminal of whoever runs ``dsh-tools``. While a command runs, the last
resort is a handler that writes the same text (the message alone) through
:func:`printable`. A handler someone configured (``basicConfig``, a plugin's
own) is found before the last resort is, so it is left as it is.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from ._terminal_text import printable

__all__ = ["escaped_last_resort"]


class _EscapingFormatter(logging.Formatter):
    """The message on one line, the traceback after it on its own lines, both escaped.

    No message of the project spans lines, and the values in one do: a newline
    there would start a line that looks like the CLI's own (``error: ...``).
    A traceback is many lines by nature, as a tool's output is, so its
    newlines are kept and only the other controls escaped.
    """

    def formatMessage(self, record: logging.LogRecord) -> str:
        return printable(super().formatMessage(record), one_line=True)

    def formatException(self, ei: logging._SysExcInfoType) -> str:
        return printable(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return printable(super().formatStack(stack_info))


class _EscapingStderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """WARNING and above to the current ``sys.stderr`` (looked up per record, as the last resort does)."""

    def __init__(self) -> None:
        logging.Handler.__init__(self, logging.WARNING)
        self.setFormatter(_EscapingFormatter())

    @property
    def stream(self) -> TextIO:
        return sys.stderr


@contextmanager
def escaped_last_resort() -> Iterator[None]:
    """Within: a record no configured handler takes is written escaped to stderr, not raw."""
    previous = logging.lastResort
    logging.lastResort = _EscapingStderrHandler()
    try:
        yield
    finally:
        logging.lastResort = previous
