"""Which callables can suspend: a conservative reading of their bytecode.

A trio task only gives up control at an ``await`` that reaches a trio trap.
Code that can never get there needs no cancel scope: nothing in it could be
interrupted. Entering a ``trio.CancelScope`` costs more than a whole pipeline
call whose body cannot suspend (BENCHMARKS.md), so the pipeline asks, once per
tool and per listener, whether it can suspend, and links the caller's signal
to a cancel scope only for calls where something can.

Two questions are answered, both from the code object alone:

* :func:`can_suspend`: an ``async def`` cannot suspend when its code holds no
  suspension point at all (no ``await``, ``async for`` or ``async with``). A
  plain ``def`` may return any awaitable, so it counts as "may suspend" (its
  callers decide whether they await what it returns).
* :func:`suspends_beyond_next`: a waterfall listener whose every ``await`` is
  literally ``await next()`` on its own ``next`` parameter suspends only if
  the rest of the chain does, so it adds no suspension of its own.

Both answer ``True`` ("it may suspend") whenever they cannot prove otherwise:
a callable object, a ``functools.partial``, a decorated wrapper that awaits the
wrapped function, an ``await`` of anything but ``next()``, ``next`` stored to,
a shape of bytecode this interpreter version compiles differently. A wrong
``True`` costs one cancel scope; only a wrong ``False`` would matter, so the
reading is checked on known samples when this module is imported, and is
switched off (everything may suspend) if it disagrees with them.
"""

from __future__ import annotations

import dis
import functools
import inspect
import types
from collections.abc import Callable
from typing import Any, Final

__all__ = ["ANALYSIS_ENABLED", "can_suspend", "suspends_beyond_next"]

# Opcodes that open a suspension point other than a plain ``await`` expression.
_ASYNC_OPCODES: Final = frozenset(
    {"GET_AITER", "GET_ANEXT", "BEFORE_ASYNC_WITH", "SETUP_ASYNC_WITH", "END_ASYNC_FOR", "ASYNC_GEN_WRAP"}
)
# Instructions the compiler may put between loading ``next``, calling it and awaiting the result.
_CALL_NOISE: Final = frozenset({"PUSH_NULL", "PRECALL", "CACHE", "NOP", "EXTENDED_ARG"})
_LOAD_LOCAL: Final = frozenset({"LOAD_FAST", "LOAD_FAST_CHECK", "LOAD_FAST_BORROW"})
_REBIND: Final = frozenset({"STORE_FAST", "DELETE_FAST", "STORE_FAST_LOAD_FAST", "STORE_FAST_STORE_FAST"})


def _code_of(fn: object) -> types.CodeType | None:
    """The code object of a plain (coroutine) function or bound method; ``None`` for anything else."""
    if isinstance(fn, types.MethodType):
        fn = fn.__func__
    if isinstance(fn, types.FunctionType):
        return fn.__code__
    return None


def _instructions(code: types.CodeType) -> list[dis.Instruction]:
    return [ins for ins in dis.get_instructions(code) if ins.opname != "CACHE"]


def _awaits_only(code: types.CodeType, next_name: str | None) -> bool:
    """Whether every suspension point in ``code`` is ``await <next_name>()`` (none at all when ``next_name`` is None)."""
    if not code.co_flags & inspect.CO_COROUTINE:
        return False
    instructions = _instructions(code)
    yields = 0
    awaits: list[int] = []
    for index, ins in enumerate(instructions):
        name = ins.opname
        if name in _ASYNC_OPCODES:
            return False
        if name == "YIELD_VALUE":
            yields += 1
        elif name == "GET_AWAITABLE":
            awaits.append(index)
        elif name in _REBIND and next_name is not None and _names(ins, next_name):
            return False
    if yields != len(awaits):
        return False
    if not awaits:
        return True
    if next_name is None or next_name in code.co_cellvars or next_name not in code.co_varnames[: _parameter_count(code)]:
        return False
    return all(_awaits_next_call(instructions, index, next_name) for index in awaits)


def _parameter_count(code: types.CodeType) -> int:
    return code.co_argcount + code.co_kwonlyargcount


def _names(ins: dis.Instruction, name: str) -> bool:
    value = ins.argval
    return value == name or (isinstance(value, tuple) and name in value)


def _awaits_next_call(instructions: list[dis.Instruction], index: int, next_name: str) -> bool:
    """Whether the ``GET_AWAITABLE`` at ``index`` awaits the result of ``next_name()`` called with no arguments."""
    position = index - 1
    while position >= 0 and instructions[position].opname in _CALL_NOISE:
        position -= 1
    if position < 0 or instructions[position].opname != "CALL" or instructions[position].arg != 0:
        return False
    position -= 1
    while position >= 0 and instructions[position].opname in _CALL_NOISE:
        position -= 1
    if position < 0:
        return False
    load = instructions[position]
    return load.opname in _LOAD_LOCAL and load.argval == next_name


# Set by dsh_core._capabilities on a listener wrapper whose own awaits are only the wrapped
# listener's and next(): the wrapper suspends exactly when the listener it names does.
SUSPENDS_LIKE: Final = "__dsh_suspends_like__"


def _analyse(fn: Callable[..., Any], next_name: str | None) -> bool:
    if not ANALYSIS_ENABLED:
        return True
    if isinstance(fn, types.FunctionType) and SUSPENDS_LIKE in fn.__dict__:
        fn = fn.__dict__[SUSPENDS_LIKE]
    code = _code_of(fn)
    if code is None:
        return True
    return _code_may_suspend(code, next_name)


# Listener chains are rebuilt whenever the plugin set changes (a per-agent plugin
# registered for one turn, say); reading a code object once is enough.
@functools.lru_cache(maxsize=4096)
def _code_may_suspend(code: types.CodeType, next_name: str | None) -> bool:
    try:
        return not _awaits_only(code, next_name)
    except Exception:  # an interpreter whose bytecode dis cannot read: stay conservative
        return True


def can_suspend(fn: Callable[..., Any]) -> bool:
    """Whether calling ``fn`` and awaiting what it returns can give control back to trio.

    ``False`` only for an ``async def`` function or method with no ``await``,
    ``async for`` or ``async with`` in its own code.
    """
    return _analyse(fn, None)


def suspends_beyond_next(fn: Callable[..., Any], next_name: str = "next") -> bool:
    """Whether the waterfall listener ``fn`` can suspend other than by awaiting ``next()``.

    ``False`` when every ``await`` in ``fn``'s own code is ``await next()``
    (``next`` being its parameter of that name, never reassigned), so the
    listener suspends exactly when the rest of its chain does.
    """
    return _analyse(fn, next_name)


# -- self-check ------------------------------------------------------------------------------


async def _sample_plain(args: Any) -> Any:
    return args


async def _sample_awaits(args: Any) -> Any:
    return await args()


async def _sample_async_with(args: Any) -> Any:
    async with args:
        return None


async def _sample_next(execution: Any, next: Callable[[], Any]) -> Any:
    if execution is None:
        return None
    return await next()


async def _sample_next_then_other(execution: Any, next: Callable[[], Any]) -> Any:
    outcome = await next()
    await execution()
    return outcome


async def _sample_deferred_next(execution: Any, next: Callable[[], Any]) -> Any:
    pending = next()
    return await pending


def _samples_agree() -> bool:
    expected = [
        (can_suspend(_sample_plain), False),
        (can_suspend(_sample_awaits), True),
        (can_suspend(_sample_async_with), True),
        (can_suspend(functools.partial(_sample_plain)), True),
        (can_suspend(_samples_agree), True),
        (suspends_beyond_next(_sample_next), False),
        (suspends_beyond_next(_sample_next_then_other), True),
        (suspends_beyond_next(_sample_deferred_next), True),
        (suspends_beyond_next(_sample_awaits), True),
    ]
    return all(answer is wanted for answer, wanted in expected)


ANALYSIS_ENABLED: bool = True
"""Whether the bytecode reading is in use; ``False`` makes every async callable "may suspend"."""
ANALYSIS_ENABLED = _samples_agree()
