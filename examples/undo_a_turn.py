"""Take back what a rejected turn did to a workspace, and keep what someone changed since.

    python examples/undo_a_turn.py [WORKSPACE_DIR]

A model turn edits ``notes.md``, writes ``plan.md`` and overwrites
``todo.md``; the person reviewing the turn rejects it. Meanwhile someone else
has edited ``todo.md`` by hand. The host undoes the turn from its first call:

- ``plan.md``, which the turn created, is removed;
- ``notes.md`` gets its old text back;
- ``todo.md`` is left alone: it no longer holds what the turn wrote, so
  reverting it would destroy the other person's edit.

By default the undo stops at that first refusal (an older effect may be what a
newer one built on) and says why; the host, knowing these are three
independent files, then undoes the rest with ``keep_going=True``. The refused
call stays in the log.

The file tools come from the ``files`` plugin (``write_file`` and ``edit_file``
declare how to revert themselves); the log is ``dsh_plugins.undo.UndoLog``.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import trio

from dsh_core import CancelSignal, ToolExecutionInput, ToolRuntime, run_tool_calls
from dsh_plugins.files import file_tools
from dsh_plugins.undo import UndoLog, UndoOutcome

TURN = [
    ("t1-edit", "edit_file", {"path": "notes.md", "old_string": "draft", "new_string": "final"}),
    ("t1-plan", "write_file", {"path": "plan.md", "content": "1. ship it\n"}),
    ("t1-todo", "write_file", {"path": "todo.md", "content": "- nothing left\n"}),
]


def report(outcomes: list[UndoOutcome]) -> None:
    for outcome in outcomes:
        print(f"  {outcome.call_id}: {'undone' if outcome.reverted else 'kept: ' + (outcome.error or '')}")


async def main(workspace: Path) -> None:
    (workspace / "notes.md").write_text("a draft of the notes\n")
    (workspace / "todo.md").write_text("- write the notes\n")

    runtime = ToolRuntime()
    for tool in file_tools(workspace):
        runtime.register(tool)
    log = UndoLog(runtime)
    runtime.plugins.register(log, name="undo-log")

    calls = [
        ToolExecutionInput(call_id=call_id, name=name, arguments=arguments, signal=CancelSignal())
        for call_id, name, arguments in TURN
    ]
    for (call_id, _, _), result in zip(TURN, await run_tool_calls(runtime, calls), strict=True):
        print(f"{call_id}: {'error' if result.is_error else 'ok'}")

    (workspace / "todo.md").write_text("- nothing left\n- but one more thing, added by hand\n")

    print("the turn is rejected: undo from its first call")
    report(await log.undo_to("t1-edit"))
    print("the files are independent: undo the rest, past the one that cannot be")
    report(await log.undo_to("t1-edit", keep_going=True))
    for name in ("notes.md", "plan.md", "todo.md"):
        path = workspace / name
        print(f"{name}: {path.read_text()!r}" if path.exists() else f"{name}: (gone)")
    print(f"still undoable: {[entry.call_id for entry in log.entries()]}")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        trio.run(main, Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as directory:
            trio.run(main, Path(directory))
