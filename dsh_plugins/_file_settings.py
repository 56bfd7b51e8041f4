"""The check shared by the plugin settings that name a file or directory the plugin keeps.

``[plugins.audit] path``, ``[plugins.ledger] path`` and ``[plugins.spill]
directory``: an empty name would mean the working directory, and a NUL
character cannot be in a path at all, so both are refused with the table's
other problems, before the plugin creates anything.
"""

from __future__ import annotations

import attrs


def kept_path(instance: object, attribute: attrs.Attribute[str | None], value: str | None) -> None:
    """An attrs validator: ``value`` is ``None`` (not configured) or a non-empty path without NUL characters."""
    if value is not None and (not value or "\x00" in value):
        raise ValueError(f"{attribute.name} must be a non-empty path without NUL characters (got {value!r})")
