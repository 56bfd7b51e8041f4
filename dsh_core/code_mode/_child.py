"""The child side of :class:`~dsh_core.code_mode.SubprocessPythonRuntime`.

The host starts this file as ``python -I _child.py``, once per run. It imports
the standard library only (isolated mode does not even put this directory on
``sys.path``), reads one ``run`` frame, runs the program and reports back; the
frames are described in ``_runtime``'s docstring.

Before anything of the program runs, the protocol moves off the standard
streams: the host's pipes are duplicated onto private descriptors, descriptor 1
is pointed at descriptor 2 (so a C extension or a subprocess writing to "stdout"
cannot corrupt a frame) and descriptor 0 at the null device. ``sys.stdout`` and
``sys.stderr`` become writers that turn complete lines into ``log`` frames.

The host imports :func:`encode_json` and :func:`decode_json` from here, so both
ends speak one codec: compact ASCII JSON, whose slow path never recurses, so
values nested thousands of levels deep cross the channel intact.
"""

from __future__ import annotations

import ast
import asyncio
import builtins
import contextlib
import inspect
import io
import json
import math
import os
import re
import sys
import threading
import traceback
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, BinaryIO, Final, NoReturn

# A log entry is cut after this many characters so that every log frame stays
# far below the host's frame cap (12 bytes per character in the worst case).
_LOG_CHUNK = 32 * 1024
# Diagnostic messages (exception text) sent to the host are cut to this length.
_MAX_MESSAGE = 16 * 1024
_PROGRAM_FILE = "<run_code>"
_MAIN_NAME = "__dsh_main__"


# ---------------------------------------------------------------------------
# Codec, shared with the host


def encode_json(value: object, *, ascii_only: bool = True) -> str:
    """Compact JSON for ``value``; ``NaN``/``inf`` and non-``str`` keys raise ``ValueError``/``TypeError``."""
    try:
        return json.dumps(value, ensure_ascii=ascii_only, separators=(",", ":"), allow_nan=False)
    except RecursionError:
        return _encode_deep(value, ascii_only)


def _encode_deep(value: object, ascii_only: bool) -> str:
    out: list[str] = []
    # (True, text) is literal output; (False, value) is a value still to encode.
    tasks: list[tuple[bool, object]] = [(False, value)]
    while tasks:
        literal, item = tasks.pop()
        if literal:
            out.append(item)  # type: ignore[arg-type]
        elif isinstance(item, dict):
            entries = list(item.items())
            tasks.append((True, "}"))
            for index in range(len(entries) - 1, -1, -1):
                key, child = entries[index]
                if not isinstance(key, str):
                    raise TypeError(f"object key {key!r} is not a str")
                tasks.append((False, child))
                tasks.append((True, ("," if index else "") + json.dumps(key, ensure_ascii=ascii_only) + ":"))
            tasks.append((True, "{"))
        elif isinstance(item, (list, tuple)):
            tasks.append((True, "]"))
            for index in range(len(item) - 1, -1, -1):
                tasks.append((False, item[index]))
                if index:
                    tasks.append((True, ","))
            tasks.append((True, "["))
        else:
            out.append(json.dumps(item, ensure_ascii=ascii_only, allow_nan=False))
    return "".join(out)


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a JSON number")


def decode_json(text: str) -> Any:
    """Parse one JSON document; ``NaN``/``Infinity`` and malformed text raise ``ValueError``."""
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except RecursionError:
        return _decode_deep(text)


# The C string scanner the json module itself uses (typeshed does not declare it).
_scanstring: Final[Callable[[str, int, bool], tuple[str, int]]] = json.decoder.scanstring  # type: ignore[attr-defined]
_SPACE = re.compile(r"[ \t\n\r]*")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?")
_WORDS = {"true": True, "false": False, "null": None}


def _decode_deep(text: str) -> Any:
    """An iterative JSON parser for documents too deep for the C decoder."""
    containers: list[list[Any] | dict[str, Any]] = []
    keys: list[str] = []

    def skip(position: int) -> int:
        match = _SPACE.match(text, position)
        assert match is not None
        return match.end()

    def key_at(position: int) -> tuple[str, int]:
        if text[position : position + 1] != '"':
            raise ValueError(f"expected an object key at {position}")
        key, position = _scanstring(text, position + 1, True)
        position = skip(position)
        if text[position : position + 1] != ":":
            raise ValueError(f"expected ':' at {position}")
        return key, skip(position + 1)

    position = skip(0)
    while True:
        char = text[position : position + 1]
        value: Any
        if char == "{":
            position = skip(position + 1)
            if text[position : position + 1] != "}":
                key, position = key_at(position)
                containers.append({})
                keys.append(key)
                continue
            value, position = {}, position + 1
        elif char == "[":
            position = skip(position + 1)
            if text[position : position + 1] != "]":
                containers.append([])
                keys.append("")
                continue
            value, position = [], position + 1
        elif char == '"':
            value, position = _scanstring(text, position + 1, True)
        elif (number := _NUMBER.match(text, position)) is not None:
            value = float(number.group()) if number.group(1) or number.group(2) else int(number.group())
            position = number.end()
        else:
            for word, constant in _WORDS.items():
                if text.startswith(word, position):
                    value, position = constant, position + len(word)
                    break
            else:
                raise ValueError(f"unexpected character at {position}")
        # A value is complete: hand it up, closing every container it ends.
        while True:
            if not containers:
                if skip(position) != len(text):
                    raise ValueError(f"extra data at {position}")
                return value
            parent = containers[-1]
            if isinstance(parent, list):
                parent.append(value)
            else:
                parent[keys[-1]] = value
            position = skip(position)
            char = text[position : position + 1]
            if char == ",":
                position = skip(position + 1)
                if isinstance(parent, dict):
                    keys[-1], position = key_at(position)
                break
            if char != ("]" if isinstance(parent, list) else "}"):
                raise ValueError(f"expected ',' or a closing bracket at {position}")
            position += 1
            value = containers.pop()
            keys.pop()


def json_problem(value: object) -> str | None:
    """Why ``value`` is not lossless JSON (with its path), or None when it is.

    The same rules as the host's ``snapshot_json``: exact ``dict`` with ``str``
    keys, ``list``/``tuple``, ``str``, ``int``, ``bool``, ``None`` and finite
    floats other than ``-0.0``; no cycles, no subclasses.
    """
    # (value, path, leaving): a leaving entry drops a container from the path.
    pending: list[tuple[object, str, bool]] = [(value, "$", False)]
    on_path: set[int] = set()
    while pending:
        item, path, leaving = pending.pop()
        if leaving:
            on_path.discard(id(item))
            continue
        kind = type(item)
        if item is None or kind is str or kind is int or kind is bool:
            continue
        if kind is float:
            assert isinstance(item, float)
            if not math.isfinite(item):
                return f"{path}: {item!r} is not a finite JSON number"
            if item == 0.0 and math.copysign(1.0, item) < 0:
                return f"{path}: -0.0 has no lossless JSON form"
            continue
        if kind is dict or kind is list or kind is tuple:
            if id(item) in on_path:
                return f"{path}: the value contains itself"
            on_path.add(id(item))
            pending.append((item, path, True))
            if isinstance(item, dict):
                for key, child in item.items():
                    if type(key) is not str:
                        return f"{path}: object key {key!r} is not a str"
                    pending.append((child, f"{path}[{json.dumps(key)}]", False))
            elif isinstance(item, (list, tuple)):
                for index, child in enumerate(item):
                    pending.append((child, f"{path}[{index}]", False))
            continue
        return f"{path}: {kind.__module__}.{kind.__qualname__} is not a JSON value".replace("builtins.", "")
    return None


# ---------------------------------------------------------------------------
# Output


class _Channel:
    """Writes frames to the protocol descriptor; safe to call from any thread."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._lock = threading.Lock()

    def send(self, frame: dict[str, Any]) -> None:
        data = memoryview((encode_json(frame) + "\n").encode("ascii"))
        with self._lock:
            while data:
                data = data[os.write(self._fd, data) :]


class _LogWriter(io.TextIOBase):
    """``sys.stdout``/``sys.stderr`` for the program: each complete line becomes one ``log`` frame.

    A partial line waits for its newline (or the end of the run); a line longer
    than ``_LOG_CHUNK`` characters is sent in several entries.
    """

    encoding = "utf-8"

    def __init__(self, channel: _Channel) -> None:
        super().__init__()
        self._channel = channel
        self._parts: list[str] = []
        self._size = 0

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        start = 0
        while (newline := text.find("\n", start)) >= 0:
            self._parts.append(text[start:newline])
            self.end_line()
            start = newline + 1
        if start < len(text):
            self._parts.append(text[start:])
            self._size += len(text) - start
            if self._size >= _LOG_CHUNK:
                self.end_line()
        return len(text)

    def end_line(self) -> None:
        """Send whatever is buffered (a complete line, or the tail at the end of the run)."""
        line = "".join(self._parts)
        self._parts.clear()
        self._size = 0
        for start in range(0, max(len(line), 1), _LOG_CHUNK):
            self._channel.send({"type": "log", "text": line[start : start + _LOG_CHUNK]})

    def flush_tail(self) -> None:
        if self._parts:
            self.end_line()


# ---------------------------------------------------------------------------
# The program's namespace


def _make_error_class(name: str) -> type[Exception]:
    def __init__(self: Exception, tool_name: str, message: str) -> None:
        Exception.__init__(self, message)
        self.tool_name = tool_name  # type: ignore[attr-defined]

    return type(
        name,
        (Exception,),
        {"__init__": __init__, "__module__": "builtins", "__doc__": "A tool call made by the program failed."},
    )


def _make_tools(names: Iterable[str], call: Callable[[str, object], Awaitable[object]]) -> object:
    known = sorted(set(names))
    functions: dict[str, Callable[[object], Awaitable[object]]] = {}
    for name in known:

        def bind(name: str) -> Callable[[object], Awaitable[object]]:
            async def tool(args: object, /) -> object:
                return await call(name, args)

            tool.__name__ = tool.__qualname__ = name
            return tool

        functions[name] = bind(name)

    class Tools:
        """The program's tools: ``await tools.name(args)`` or ``await tools["name"](args)``."""

        __slots__ = ()

        def __getattr__(self, name: str) -> Callable[[object], Awaitable[object]]:
            try:
                return functions[name]
            except KeyError:
                raise AttributeError(f"no tool named {name!r}") from None

        def __getitem__(self, name: str) -> Callable[[object], Awaitable[object]]:
            try:
                return functions[name]
            except (KeyError, TypeError):
                raise KeyError(name) from None

        def __contains__(self, name: object) -> bool:
            return name in functions

        def __iter__(self) -> Any:
            return iter(known)

        def __len__(self) -> int:
            return len(known)

        def __dir__(self) -> list[str]:
            return list(known)

        def __repr__(self) -> str:
            return f"<tools: {', '.join(known)}>"

    return Tools()


def _compile(program: str) -> Any:
    """The program as the body of ``async def __dsh_main__()``, keeping its own line numbers."""
    body = ast.parse(program, filename=_PROGRAM_FILE, mode="exec").body
    module = ast.parse(f"async def {_MAIN_NAME}():\n    pass\n", filename=_PROGRAM_FILE, mode="exec")
    function = module.body[0]
    assert isinstance(function, ast.AsyncFunctionDef)
    if body:
        function.body = body
    return compile(module, _PROGRAM_FILE, "exec", dont_inherit=True)


def _program_line(exc: BaseException) -> int | None:
    if isinstance(exc, SyntaxError) and exc.filename == _PROGRAM_FILE:
        return exc.lineno
    line = None
    for frame in traceback.extract_tb(exc.__traceback__):
        if frame.filename == _PROGRAM_FILE:
            line = frame.lineno
    return line


def _describe_exception(exc: BaseException, error_class: type[Exception]) -> str:
    try:
        if isinstance(exc, SyntaxError):
            text = f"{type(exc).__name__}: {exc.msg}"
        else:
            text = traceback.format_exception_only(type(exc), exc)[-1].strip()
            if isinstance(exc, BaseExceptionGroup):
                leaves = [traceback.format_exception_only(type(e), e)[-1].strip() for e in exc.exceptions[:3]]
                text += " [" + "; ".join(leaves) + "]"
    except Exception:
        text = f"{type(exc).__name__}: <unprintable exception>"
    notes = []
    if isinstance(exc, error_class):
        notes.append(f"tool {getattr(exc, 'tool_name', '?')!r}")
    line = _program_line(exc)
    if line is not None:
        notes.append(f"line {line}")
    if notes:
        text += f" ({', '.join(notes)})"
    return text[:_MAX_MESSAGE]


# ---------------------------------------------------------------------------
# Running


class _Run:
    """One program run: the pending tool calls and the replies coming back on stdin."""

    def __init__(self, frame: dict[str, Any], reader: BinaryIO, channel: _Channel) -> None:
        self.program: str = frame["program"]
        self.names: list[str] = frame["names"]
        self.global_name: str = frame["global"]
        self.error_class = _make_error_class(frame["error_class"])
        self.max_output_bytes: int = frame["max_output_bytes"]
        self.max_frame_bytes: int = frame["max_frame_bytes"]
        self.reader = reader
        self.channel = channel
        self.pending: dict[int, tuple[str, asyncio.Future[object]]] = {}
        self.next_id = 1

    async def call(self, name: str, args: object) -> object:
        problem = json_problem(args)
        if problem is not None:
            raise self.error_class(
                name, f"tool arguments must be lossless JSON (pass an arguments dict, e.g. `{{}}`): {problem}"
            )
        call_id = self.next_id
        self.next_id += 1
        frame = {"type": "call", "id": call_id, "name": name, "args": args}
        try:
            size = len(encode_json(frame))
        except (ValueError, TypeError) as exc:
            raise self.error_class(name, f"tool arguments cannot be sent: {exc}") from None
        if size > self.max_frame_bytes:
            raise self.error_class(name, f"tool arguments exceed {self.max_frame_bytes} bytes")
        future: asyncio.Future[object] = asyncio.get_running_loop().create_future()
        self.pending[call_id] = (name, future)
        try:
            self.channel.send(frame)
            return await future
        finally:
            self.pending.pop(call_id, None)

    def receive(self, line: bytes | None) -> None:
        """Runs on the event loop for each line the host sends (None: the host closed the channel)."""
        if line is None:
            for name, future in self.pending.values():
                if not future.done():
                    future.set_exception(self.error_class(name, "the host closed the channel"))
            return
        reply = decode_json(line.decode("utf-8"))
        entry = self.pending.get(reply["id"])
        if entry is None or entry[1].done():
            return  # the program stopped waiting for this call
        name, future = entry
        if reply["ok"]:
            future.set_result(reply["value"])
        else:
            future.set_exception(self.error_class(name, reply["message"]))

    def pump(self, loop: asyncio.AbstractEventLoop) -> None:
        """Reader thread: forward every reply line to the event loop."""
        try:
            for line in self.reader:
                loop.call_soon_threadsafe(self.receive, line)
        except (OSError, ValueError):
            pass
        except RuntimeError:
            return  # the loop is gone
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(self.receive, None)

    async def outcome(self) -> dict[str, Any]:
        """Run the program; the ``done`` frame describing how it ended."""
        loop = asyncio.get_running_loop()
        threading.Thread(target=self.pump, args=(loop,), name="dsh-replies", daemon=True).start()
        namespace: dict[str, Any] = {
            "__name__": "__run_code__",
            "__builtins__": builtins,
            self.global_name: _make_tools(self.names, self.call),
            self.error_class.__name__: self.error_class,
        }
        try:
            exec(_compile(self.program), namespace)
            main = namespace.pop(_MAIN_NAME)
            if inspect.isasyncgenfunction(main):
                raise SyntaxError("'yield' is not allowed in a run_code program")
            value = await main()
        except BaseException as exc:
            # Everything the program raises is its outcome, SystemExit and
            # CancelledError included: the process ends right after.
            return _failure("exception", _describe_exception(exc, self.error_class))
        if value is None:
            return {"type": "done"}
        problem = json_problem(value)
        if problem is not None:
            return _failure("invalid-output", f"the program returned a value that is not lossless JSON: {problem}")
        frame = {"type": "done", "value": value}
        try:
            size = len(encode_json(frame))
        except (ValueError, TypeError) as exc:
            return _failure("invalid-output", f"the program returned a value that cannot be encoded: {exc}")
        if size > self.max_frame_bytes or size > self.max_output_bytes + 64:
            return _failure("output-limit", f"the returned value exceeds {self.max_output_bytes} bytes")
        return frame


def _failure(kind: str, message: str) -> dict[str, Any]:
    return {"type": "done", "error": {"kind": kind, "message": message}}


async def _serve(run: _Run, writers: list[_LogWriter]) -> NoReturn:
    done = await run.outcome()
    for writer in writers:
        writer.flush_tail()
    run.channel.send(done)
    # Leave at once: no asyncio teardown waiting on the program's leftover
    # tasks, no atexit handlers printing after ``done``.
    os._exit(0)


def main() -> NoReturn:
    protocol_out = os.dup(1)
    protocol_in = os.dup(0)
    os.dup2(2, 1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    channel = _Channel(protocol_out)
    reader = os.fdopen(protocol_in, "rb")
    try:
        frame = decode_json(reader.readline().decode("utf-8"))
        run = _Run(frame, reader, channel)
    except Exception as exc:
        os.write(2, f"dsh code runtime child: unusable run frame: {exc!r}\n".encode())
        os._exit(2)
    writers = [_LogWriter(channel), _LogWriter(channel)]
    sys.stdout, sys.stderr = writers
    sys.stdin = io.StringIO()
    try:
        asyncio.run(_serve(run, writers))
    except BaseException:
        # Only reachable when the channel itself failed (the host went away).
        os._exit(1)
    os._exit(1)


if __name__ == "__main__":
    main()
