"""The physical limit: the unavoidable pieces of one ``add`` call, each measured alone.

The pipeline cannot do less than: validate the arguments with the compiled
fastjsonschema function, validate the output ``3``, await a trivial async body
under trio, snapshot the arguments and the value, and make one no-op async call
per configured hook layer. ``limit.kN`` is that sum with ``N`` hook layers, the
loop overhead of each piece subtracted. Everything else the pipeline does
(identity objects, cancel scopes, result classes, rendering) is measured as the
distance from this limit. Floors that add what the contract or trio make
unavoidable are shown beside it: the objects every call hands out
(``limit.contract``), two frames per nested waterfall layer (``limit.w40``),
a checkpoint and a cancel scope for a body that suspends (``limit.suspend``).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

import fastjsonschema
import trio

from dsh_core import CancelSignal, ToolExecutionToken, ToolRunContext, snapshot_json
from dsh_core._content import text_block
from dsh_core._execution import new_execution
from dsh_core._results import new_success

from ._fixtures import ADD_SCHEMA, ARGS, ARGS_TEXT, add_body
from ._harness import Bench, Case, Derived, loop_timer

GROUP = "limit"

# Hook-layer counts the pipeline rows compare against: none, one per waterfall
# (pre, execute, post, result), ten per waterfall, and the plugin rows.
HOOK_LAYERS = (0, 1, 2, 3, 4, 40)

_SUM_KEYS = ("limit.args", "limit.output", "limit.snap_args", "limit.snap_value")
_SIGNAL = CancelSignal()

# What a successful call must hand out, built with the pipeline's own positional
# constructors: its ToolExecution (with a fresh token), the body's run context,
# the rendered text block and the result. The specification requires each of them.
_CALL_OBJECTS = (
    "new_execution('c1', 'c1', 'add', FROZEN, SIGNAL, Token(), None, None); "
    "RunContext(EXECUTION, SIGNAL, []); new_success(3, (text_block('3'),), None, False)"
)


def _namespace() -> dict[str, Any]:
    async def noop(value: object) -> object:
        return value

    async def listener(value: object, next: Any) -> object:
        return await next()

    async def layer(index: int, value: object) -> object:
        # The least a nested waterfall layer can be: the listener's frame and one frame that runs the next.
        if index == _LAYERS:
            return await noop(value)
        return await listener(value, functools.partial(layer, index + 1, value))

    async def with_scope() -> None:
        with trio.CancelScope():
            await noop(None)

    execution = new_execution("c1", "c1", "add", snapshot_json(ARGS), _SIGNAL, ToolExecutionToken(), None, None)
    return {
        "new_execution": new_execution,
        "Token": ToolExecutionToken,
        "RunContext": ToolRunContext,
        "text_block": text_block,
        "new_success": new_success,
        "EXECUTION": execution,
        "FROZEN": execution.arguments,
        "SIGNAL": _SIGNAL,
        "validate_args": fastjsonschema.compile(ADD_SCHEMA, use_default=False, use_formats=False),
        "validate_output": fastjsonschema.compile({"type": "integer"}, use_default=False, use_formats=False),
        "snapshot_json": snapshot_json,
        "body": add_body,
        "noop": noop,
        "layer": layer,
        "with_scope": with_scope,
        "checkpoint": trio.lowlevel.checkpoint,
        "loads": json.loads,
        "ARGS": ARGS,
        "TEXT": ARGS_TEXT,
    }


def _bench(key: str, label: str, stmt: str, runner: Any = "sync") -> Bench:
    return Bench(key=key, label=label, setup=lambda: loop_timer(stmt, _namespace(), runner), vs="limit.k0")


_LAYERS = 10  # layers in the limit.layer10 measurement


def limit_sum(stats: Mapping[str, float], hooks: int = 0) -> float:
    """The limit with ``hooks`` no-op hook layers, loop overhead subtracted from every piece."""
    sync = sum(stats[key] - stats["limit.loop"] for key in _SUM_KEYS)
    body = stats["limit.body"] - stats["limit.aloop"]
    hook = stats["limit.hook"] - stats["limit.aloop"]
    return sync + body + hooks * hook


def cases(smoke: bool) -> list[Case]:
    out: list[Case] = [
        _bench("limit.loop", "empty loop (sync)", "pass"),
        _bench("limit.aloop", "empty loop (async, trio)", "pass", "trio"),
        _bench("limit.args", "fastjsonschema: args {a:1,b:2} vs the 2-property schema", "validate_args(ARGS)"),
        _bench("limit.output", 'fastjsonschema: output 3 vs {"type":"integer"}', "validate_output(3)"),
        _bench("limit.snap_args", "snapshot_json(args)", "snapshot_json(ARGS)"),
        _bench("limit.snap_value", "snapshot_json(3)", "snapshot_json(3)"),
        _bench("limit.body", "trio: await body(args)", "await body(ARGS)", "trio"),
        _bench("limit.hook", "trio: one no-op async hook call", "await noop(ARGS)", "trio"),
        _bench("limit.loads", "json.loads(args text)", "loads(TEXT)"),
    ]
    for hooks in HOOK_LAYERS:
        out.append(
            Derived(
                key=f"limit.k{hooks}",
                label=f"physical limit, {hooks} hook layers" + (" (sum of the pieces)" if hooks == 0 else ""),
                inputs=("limit.loop", "limit.aloop", *_SUM_KEYS, "limit.body", "limit.hook"),
                compute=functools.partial(limit_sum, hooks=hooks),
                vs=None if hooks == 0 else "limit.k0",
            )
        )
    out += [
        _bench("limit.layer10", f"trio: {_LAYERS} nested waterfall layers, the least each can be (2 frames)",
               "await layer(0, ARGS)", "trio"),
        _bench("limit.checkpoint", "trio: await trio.lowlevel.checkpoint()", "await checkpoint()", "trio"),
        _bench("limit.scope", "trio: with trio.CancelScope(): await noop()", "await with_scope()", "trio"),
        Derived(
            key="limit.w40",
            label="structural floor, 40 nested waterfall layers (limit + 40 minimal layers)",
            inputs=("limit.k0", "limit.layer10", "limit.aloop"),
            compute=lambda stats: stats["limit.k0"] + 4 * (stats["limit.layer10"] - stats["limit.aloop"]),
            vs="limit.k40",
        ),
        _bench("limit.objects", "the objects a call hands out, built alone (execution + token, run context, "
               "text block, result)", _CALL_OBJECTS),
        _limit_plus("limit.contract", "contract floor, 0 hook layers (limit + the objects a call hands out)",
                    "limit.objects"),
        Derived(
            key="limit.suspend",
            label="physical limit of a call whose body suspends once (+ one checkpoint + one cancel scope)",
            inputs=("limit.k0", "limit.checkpoint", "limit.scope", "limit.aloop"),
            compute=lambda stats: stats["limit.k0"] + stats["limit.checkpoint"] + stats["limit.scope"]
            - 2 * stats["limit.aloop"],
            vs="limit.k0",
        ),
    ]  # fmt: skip
    out.append(_limit_plus("limit.k0.json", "physical limit, args arriving as JSON text (+ json.loads)", "limit.loads"))
    return out


def _limit_plus(key: str, label: str, piece: str) -> Derived:
    """``limit.k0`` plus one more sync piece, its loop overhead subtracted."""
    return Derived(
        key=key,
        label=label,
        inputs=("limit.k0", piece, "limit.loop"),
        compute=lambda stats: stats["limit.k0"] + stats[piece] - stats["limit.loop"],
        vs="limit.k0",
    )
