"""``read_file``: a window of lines from a text file inside the workspace root."""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath
from typing import Any

import trio

from dsh_core import DshError, TextBlock, ToolDefinition, ToolEffects, ToolOutput, define_tool
from dsh_core.presentation import FileLocation, GenericCallView, ReadFileLine, ReadResultView

DEFAULT_LIMIT = 200
MAX_BYTES = 10 * 1024 * 1024

LANGS = {".py": "python", ".md": "markdown", ".toml": "toml", ".json": "json", ".jsonl": "json", ".txt": "text"}


class ReadFileError(DshError):
    """The file cannot be read: outside the workspace, missing, not text, too large."""

    code = "READ_FILE_ERROR"


def resolve_inside(root: Path, path: str) -> Path:
    """``path`` (relative to ``root``, or absolute) resolved with symlinks, refusing anything outside ``root``.

    ``root`` must already be resolved. Raises :class:`ReadFileError` when the
    resolved path is not ``root`` or below it: ``..`` segments, absolute paths
    elsewhere and symlinks pointing out all count as escaping.
    """
    if "\x00" in path:
        raise ReadFileError("path must not contain NUL characters")
    target = Path(os.path.realpath(root / path))
    if target != root and root not in target.parents:
        raise ReadFileError(f"{path!r} is outside the workspace root {str(root)!r}")
    return target


def _read_lines(target: Path) -> list[str]:
    try:
        size = target.stat().st_size
        if not target.is_file():
            raise ReadFileError(f"{target.name!r} is not a regular file")
        if size > MAX_BYTES:
            raise ReadFileError(f"{target.name!r} is {size} bytes; files over {MAX_BYTES} bytes are not read")
        data = target.read_bytes()
    except FileNotFoundError:
        raise ReadFileError("no such file") from None
    except OSError as exc:
        raise ReadFileError(f"cannot read the file: {exc.strerror or exc}") from None
    if b"\x00" in data:
        raise ReadFileError("the file looks binary (it contains NUL bytes)")
    return data.decode("utf-8", errors="replace").splitlines()


def read_file_tool(root: str | os.PathLike[str] | None = None) -> ToolDefinition:
    """The ``read_file`` definition for the workspace ``root`` (default: the current directory)."""
    base = Path(os.path.realpath(os.fspath(root) if root is not None else os.getcwd()))

    async def run(args: Any) -> dict[str, Any]:
        offset = args.get("offset", 1)
        limit = args.get("limit", DEFAULT_LIMIT)
        if offset < 1 or limit < 1:
            raise ReadFileError("offset and limit must be at least 1")
        target = resolve_inside(base, args["path"])
        # File I/O blocks; keep the event loop free for other calls.
        lines = await trio.to_thread.run_sync(_read_lines, target)
        window = lines[offset - 1 : offset - 1 + limit]
        shown = PurePosixPath(target.relative_to(base)).as_posix() if target != base else "."
        return {
            "path": shown,
            "offset": offset,
            "lines": [{"number": offset + index, "text": text} for index, text in enumerate(window)],
            "total_lines": len(lines),
        }

    def render(args: Any, value: Any) -> list[TextBlock]:
        body = "\n".join(f"{line['number']:>6}\t{line['text']}" for line in value["lines"])
        last = value["offset"] + len(value["lines"]) - 1
        header = f"{value['path']} (lines {value['offset']}-{last} of {value['total_lines']})"
        if not value["lines"]:
            header = f"{value['path']}: no lines from {value['offset']} (the file has {value['total_lines']})"
        return [TextBlock(f"{header}\n{body}" if body else header)]

    def present_call(args: Any) -> GenericCallView:
        return GenericCallView(title=f"Read {args['path']}", kind="read", locations=[FileLocation(path=args["path"])])

    def present_result(args: Any, result: Any) -> ReadResultView | None:
        value = getattr(result, "value", None)
        if not isinstance(value, dict):
            return None
        return ReadResultView(
            path=value["path"],
            offset=value["offset"],
            lines=[ReadFileLine(number=line["number"], text=line["text"]) for line in value["lines"]],
            total_lines=value["total_lines"],
            lang=LANGS.get(PurePosixPath(value["path"]).suffix),
        )

    return define_tool(
        name="read_file",
        description=(
            "Read lines of a UTF-8 text file in the workspace. Returns numbered lines from `offset` "
            f"(1-based, default 1), at most `limit` of them (default {DEFAULT_LIMIT})."
        ),
        parameters={
            "path": {"type": "string", "required": True, "description": "File path, relative to the workspace."},
            "offset": {"type": "integer", "description": "First line to return (1-based)."},
            "limit": {"type": "integer", "description": "Maximum number of lines."},
        },
        output=ToolOutput(
            schema={
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "path": {"type": "string", "required": True},
                    "offset": {"type": "integer", "required": True},
                    "lines": {
                        "type": "array",
                        "required": True,
                        "items": {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": {
                                "number": {"type": "integer", "required": True},
                                "text": {"type": "string", "required": True},
                            },
                        },
                    },
                    "total_lines": {"type": "integer", "required": True},
                },
            },
            render=render,
        ),
        execute=run,
        is_concurrency_safe=lambda args: True,
        effects=ToolEffects(read_only=True),
        present_call=present_call,
        present_result=present_result,
    )
