"""``calc``: one arithmetic operation on two numbers."""

from __future__ import annotations

import math
from typing import Any

from dsh_core import DshError, TextBlock, ToolDefinition, ToolEffects, ToolOutput, define_tool
from dsh_core.presentation import GenericCallView

SYMBOLS = {"add": "+", "sub": "-", "mul": "*", "div": "/"}


class CalcError(DshError):
    """An operation with no finite result (division by zero, overflow)."""

    code = "CALC_ERROR"


def calculate(op: str, a: int | float, b: int | float) -> int | float:
    """``a <op> b``; an integer when both operands are integers and the result is whole.

    Raises :class:`CalcError` for a division by zero or a result that is not a
    finite number.
    """
    try:
        if op == "add":
            result: int | float = a + b
        elif op == "sub":
            result = a - b
        elif op == "mul":
            result = a * b
        elif b == 0:
            raise CalcError(f"division by zero: {a} / {b}")
        elif isinstance(a, int) and isinstance(b, int) and a % b == 0:
            result = a // b  # exact: stays an integer, even beyond float range
        else:
            result = a / b
    except OverflowError:
        raise CalcError(f"{a} {SYMBOLS[op]} {b} is too large to compute") from None
    if isinstance(result, float):
        if not math.isfinite(result):
            raise CalcError(f"{a} {SYMBOLS[op]} {b} has no finite result")
        if result == 0:
            result = 0.0  # JSON has no negative zero
    return result


async def _run(args: Any) -> int | float:
    return calculate(args["op"], args["a"], args["b"])


def _render(args: Any, value: Any) -> list[TextBlock]:
    return [TextBlock(f"{args['a']} {SYMBOLS[args['op']]} {args['b']} = {value}")]


def calc_tool() -> ToolDefinition:
    """The ``calc`` definition (pure and parallel-safe)."""
    return define_tool(
        name="calc",
        description="Compute a op b for two numbers. Integer operands give an integer result when it is whole.",
        parameters={
            "op": {"type": "string", "enum": ["add", "sub", "mul", "div"], "required": True},
            "a": {"type": "number", "required": True, "description": "Left operand."},
            "b": {"type": "number", "required": True, "description": "Right operand."},
        },
        output=ToolOutput(schema={"type": "number"}, render=_render),
        execute=_run,
        is_concurrency_safe=lambda args: True,
        effects=ToolEffects(read_only=True, idempotent=True),
        present_call=lambda args: GenericCallView(title=f"{args['a']} {SYMBOLS[args['op']]} {args['b']}", kind="other"),
    )
