"""attrs validators whose messages read like the rest of the package's.

``attrs.validators.instance_of`` raises a ``TypeError`` whose ``str()`` is a
tuple of the message, the attribute, the type and the value; these say
``ToolErrorInfo.name must be a str, got int`` instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from typing import Any, Final

import attrs

from ._json import safe_repr

__all__ = [
    "MIN_MEMORY_BYTES",
    "RESOURCE_LIMIT_MAX",
    "callable_or_none",
    "instance_of",
    "memory_limit_problem",
    "one_of",
    "positive_finite",
    "resource_limit_problem",
    "usable_path",
]

Validator = Callable[[Any, "attrs.Attribute[Any]", Any], None]


def instance_of(kind: type, *, optional: bool = False, exact: bool = False) -> Validator:
    """The field must be an instance of ``kind`` (``exact``: of ``kind`` itself), or ``None`` when ``optional``."""
    expected = f"a {kind.__name__}" + (" or None" if optional else "")

    def check(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if (value is None and optional) or (type(value) is kind if exact else isinstance(value, kind)):
            return
        raise TypeError(f"{type(instance).__name__}.{attribute.name} must be {expected}, got {type(value).__name__}")

    return check


def one_of(values: Collection[object]) -> Validator:
    """The field must equal one of ``values`` (listed sorted, so a set's message is stable)."""
    listed = ", ".join(sorted(repr(value) for value in values))

    def check(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value not in values:
            raise ValueError(f"{type(instance).__name__}.{attribute.name} must be one of {listed}, got {safe_repr(value)}")

    return check


def callable_or_none(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    """The field must be callable, or ``None``."""
    if value is not None and not callable(value):
        raise TypeError(f"{type(instance).__name__}.{attribute.name} must be callable or None, got {type(value).__name__}")


def positive_finite(value: object) -> bool:
    """Whether ``value`` is a real number above zero (not a bool, not NaN or infinite).

    An ``int`` of any size is finite: ``math.isfinite`` would overflow on one
    beyond a float's range instead of answering.
    """
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return value > 0
    return isinstance(value, float) and math.isfinite(value) and value > 0


# ``resource.setrlimit`` takes a signed 64-bit count (a larger int overflows a C long),
# and the CPU limit's hard ceiling is one above its soft one. Keeping one below
# 2**63 - 1 also keeps a finite limit apart from platforms whose RLIM_INFINITY is 2**63 - 1.
RESOURCE_LIMIT_MAX: Final = 2**63 - 2


def resource_limit_problem(value: int) -> str | None:
    """What is wrong with ``value`` as a resource limit the Code Mode child sets, or ``None``.

    Shared by ``[code_runtime]`` and ``SubprocessPythonRuntime``, so a limit
    the child could not apply is refused where it is written, not at every run.
    """
    if value > RESOURCE_LIMIT_MAX:
        return f"expected at most {RESOURCE_LIMIT_MAX} (the largest resource limit), got {value}"
    return None


# The limit is the child's whole address space: the interpreter alone takes more than
# 16 MiB, so a smaller limit (often a value in MiB written as bytes) fails every run.
MIN_MEMORY_BYTES: Final = 16 * 1024 * 1024


def memory_limit_problem(value: int) -> str | None:
    """What is wrong with ``value`` as the Code Mode child's memory limit, or ``None``.

    Shared by ``[code_runtime]`` and ``SubprocessPythonRuntime``: one floor, so a
    value one accepts the other does not refuse.
    """
    if value < MIN_MEMORY_BYTES:
        return f"expected at least {MIN_MEMORY_BYTES} (16 MiB; the value is in bytes), got {value}"
    return resource_limit_problem(value)


def usable_path(value: str) -> bool:
    """Whether ``value`` can name a file the host keeps: not empty (the working directory), no NUL character.

    The bundled plugins' file settings check the same (``dsh_plugins._file_settings``,
    which keeps to dsh_core's public names).
    """
    return bool(value) and "\x00" not in value
