"""Resume a turn after the process died, without sending anything twice.

    python examples/resume_after_crash.py [LEDGER_FILE]

A model turn asks for three calls: two ``send_email`` and one ``lookup``. The
first run happens in a child process that dies (``os._exit``, no cleanup, no
``finally``) in the middle of the second email. Then this process resumes the
same turn, with the same call ids, against the same effect ledger:

- the first email was committed before the crash: its recorded result comes
  back and nothing is sent;
- the second email was in flight: nobody knows whether it went out, so it fails
  ``EFFECT_IN_DOUBT`` instead of being sent again;
- the lookup never started: it runs now.

Each "sent" email is appended to ``<ledger>.outbox`` so the output can show
what really happened.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import trio

from dsh_core import CancelSignal, ToolExecutionInput, ToolRuntime, define_tool, json_text, run_tool_calls
from dsh_plugins.ledger import EffectLedger

CALLS = [
    ("mail-1", "send_email", {"to": "ann@example.com", "subject": "invoice"}),
    ("mail-2", "send_email", {"to": "bob@example.com", "subject": "invoice"}),
    ("look-1", "lookup", {"customer": "carol"}),
]


def build_runtime(ledger_path: Path, *, die_on: str | None) -> ToolRuntime:
    outbox = ledger_path.with_suffix(".outbox")

    async def send_email(args: Any) -> dict[str, Any]:
        with outbox.open("a", encoding="utf-8") as file:
            file.write(f"{args['to']}: {args['subject']}\n")
        if args["to"] == die_on:
            os._exit(70)  # the process dies after the email left, before anything is recorded
        return {"queued": args["to"]}

    async def lookup(args: Any) -> dict[str, Any]:
        return {"customer": args["customer"], "tier": "gold"}

    runtime = ToolRuntime()
    runtime.register(
        define_tool(
            name="send_email",
            description="Send an email.",
            parameters={"to": {"type": "string", "required": True}, "subject": {"type": "string", "required": True}},
            output={"type": "json"},
            execute=send_email,
        )
    )
    runtime.register(
        define_tool(
            name="lookup",
            description="Look a customer up.",
            parameters={"customer": {"type": "string", "required": True}},
            output={"type": "json"},
            execute=lookup,
        )
    )
    runtime.plugins.register(
        EffectLedger(ledger_path, runtime=runtime, rerun_in_doubt=["lookup"]), name="effect-ledger"
    )
    return runtime


async def run_turn(runtime: ToolRuntime) -> list[str]:
    requests = [
        ToolExecutionInput(call_id=call_id, name=name, arguments=args, signal=CancelSignal())
        for call_id, name, args in CALLS
    ]
    results = await run_tool_calls(runtime, requests)
    lines = []
    for (call_id, _, _), result in zip(CALLS, results, strict=True):
        if result.is_error:
            info = result.error.info  # type: ignore[union-attr]
            lines.append(f"{call_id}: {info.code if info else 'error'}")
        else:
            lines.append(f"{call_id}: ok {json_text(result.value)}")  # type: ignore[union-attr]
    return lines


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--child":
        trio.run(run_turn, build_runtime(Path(sys.argv[2]), die_on="bob@example.com"))
        return
    ledger_path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp()) / "effects.jsonl"
    outbox = ledger_path.with_suffix(".outbox")
    ledger_path.parent.mkdir(parents=True, exist_ok=True)
    child = subprocess.run([sys.executable, __file__, "--child", str(ledger_path)], check=False)
    if child.returncode != 70:
        sys.exit(f"the first run should have died in the second email, but it exited with {child.returncode}")
    print(f"first run: the process died (exit status {child.returncode})")
    print("outbox after the crash:", outbox.read_text(encoding="utf-8").splitlines())
    print("resuming the same turn:")
    for line in trio.run(run_turn, build_runtime(ledger_path, die_on=None)):
        print("  " + line)
    print("outbox after the resume:", outbox.read_text(encoding="utf-8").splitlines())


if __name__ == "__main__":
    main()
