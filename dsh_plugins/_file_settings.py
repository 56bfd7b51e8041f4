"""The check shared by the plugin settings that name a file or directory.

``[plugins.audit] path``, ``[plugins.ledger] path``, ``[plugins.spill]
directory`` and the ``root`` of ``[plugins.files]`` and ``[plugins.shell]``:
an empty name would mean the working directory (a workspace nobody chose, or a
log written wherever the host happens to start), and a NUL character cannot be
in a path at all, so both are refused with the table's other problems, before
the plugin creates or registers anything.
"""

from __future__ import annotations

from typing import Annotated, TypeAlias

from dsh_core import TableCheck, check_validator


def path_problem(value: str) -> str | None:
    """What is wrong with ``value`` as a configured path, or ``None``."""
    if not value or "\x00" in value:
        return f"must be a non-empty path without NUL characters (got {value!r})"
    return None


PathSetting: TypeAlias = Annotated[str, TableCheck(path_problem)]
"""A path key's type: ``PathSetting | None = attrs.field(default=None, validator=kept_path)``."""

kept_path = check_validator(path_problem)
"""An attrs validator: ``value`` is ``None`` (not configured) or a path :func:`path_problem` accepts."""
