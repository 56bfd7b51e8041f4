"""The child side of :class:`~dsh_core.code_mode.SubprocessPythonRuntime`.

The host starts this file in ``python -I``, once per run. It imports
the standard library only (isolated mode does not even put this directory on
``sys.path``), reads one ``run`` frame, runs the program and reports back; the
frames are described in ``_runtime``'s docstring.

Before anything of the program runs, the protocol moves off the standard
streams: the host's pipes are duplicated onto private descriptors, descriptor 1
is pointed at descriptor 2 (so a C extension or a subprocess writing to "stdout"
cannot corrupt a frame) and descriptor 0 at the null device. ``sys.stdout`` and
``sys.stderr`` become writers that turn complete lines into ``log`` frames.

Both ends speak one codec, :mod:`dsh_core._jsoncodec`, which the child loads
by path: compact JSON whose slow path never recurses, so values nested
thousands of levels deep cross the channel intact (ASCII, but for the returned
value, which goes as UTF-8: see ``_Run._value_frame``). The host starts the child
through a one-line bootstrap that loads this file the same way, so neither
file is compiled again on every run.

Start-up and per-call latency are most of what Code Mode costs, so the child
imports as little as it can: importing ``asyncio`` alone takes several times
as long as starting the interpreter. A program with no ``import`` (and no way
to reach one: ``__import__``, ``exec``, dunder attributes...) can only await
tool calls, so it runs on a small driver that reads each reply right where
the program waits for it, without an event loop. Any other program runs under
``asyncio.run``, replies read by the loop itself off the protocol descriptor.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # no stub; signal (enum) would add 4 ms to start-up
import _thread
import ast
import builtins
import io
import json
import math
import os
import sys
from collections.abc import Awaitable, Callable, Generator, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Final, NoReturn

if TYPE_CHECKING:
    import asyncio

# A log entry is cut after this many characters so that every log frame stays
# far below the host's frame cap (12 bytes per character in the worst case).
_LOG_CHUNK = 32 * 1024
# Diagnostic messages (exception text) sent to the host are cut to this length.
_MAX_MESSAGE = 16 * 1024
_PROGRAM_FILE = "<run_code>"
# The real os._exit: the program's is a stand-in that ends what it started first (see _program_exit).
_exit: Final = os._exit
_MAIN_NAME = "__dsh_main__"
_PROGRAM_MODULE = "__run_code__"  # the program's __name__


# ---------------------------------------------------------------------------
# Codec, shared with the host


def _load_beside(name: str, path: str) -> Any:
    """Load a standard-library-only module of dsh_core by path (its cached bytecode when there is one).

    The child cannot import ``dsh_core`` itself: that would import the whole
    framework (trio, attrs, pluggy) into every run.
    """
    from importlib.machinery import SourceFileLoader

    module = sys.modules[name] = type(sys)(name)
    module.__file__ = path
    SourceFileLoader(name, path).exec_module(module)
    return module


if TYPE_CHECKING:
    from .._jsoncodec import decode_json, encode_json, holds_only_scalars
else:
    _codec = _load_beside("_dsh_jsoncodec", os.path.join(os.path.dirname(os.path.dirname(__file__)), "_jsoncodec.py"))
    decode_json, encode_json, holds_only_scalars = _codec.decode_json, _codec.encode_json, _codec.holds_only_scalars


class TooManyValues(Exception):
    """A value holds more JSON values (each container and each scalar counts one) than it may."""


def json_problem(value: object, max_values: int = sys.maxsize) -> str | None:
    """Why ``value`` is not lossless JSON (with its path), or None when it is.

    Raises :class:`TooManyValues` once it has met more than ``max_values``
    JSON values (the host refuses a frame of more, so a value is checked
    here, where the program can be told).

    The same rules as the host's ``snapshot_json``: exact ``dict`` with ``str``
    keys, ``list``/``tuple``, ``str``, ``int``, ``bool``, ``None`` and finite
    floats other than ``-0.0``; no cycles, no subclasses. Entries are checked
    in order, one container open per level of the path, and the path's text is
    only spelled out for the problem found, so a value nested 100 000 levels
    deep costs memory linear in its depth.
    """
    if type(value) not in _CONTAINERS:
        problem = _leaf_problem(value)
        return None if problem is None else f"$: {problem}"
    if type(value) is not dict and _flat_scalars(value):  # type: ignore[arg-type]
        if len(value) + 1 > max_values:  # type: ignore[arg-type]
            raise TooManyValues
        return None
    keys: list[str | int] = []  # the path from the root to the container being checked
    on_path: set[int] = {id(value)}
    values = 1
    stack: list[tuple[Iterator[tuple[Any, Any]], int, bool]] = [_open(value)]
    while stack:
        entries, ident, is_dict = stack[-1]
        for key, item in entries:
            values += 1
            if values > max_values:
                raise TooManyValues
            if is_dict and type(key) is not str:
                return f"{_spell_path(keys)}: object key {_bounded_repr(key)} is not a str"
            if type(item) in _CONTAINERS:
                if type(item) is not dict and _flat_scalars(item):
                    values += len(item)  # a million numbers: counted and checked at C speed
                    if values > max_values:
                        raise TooManyValues
                    continue
                keys.append(key)
                if id(item) in on_path:
                    return f"{_spell_path(keys)}: the value contains itself"
                on_path.add(id(item))
                stack.append(_open(item))
                break
            problem = _leaf_problem(item)
            if problem is not None:
                keys.append(key)
                return f"{_spell_path(keys)}: {problem}"
        else:
            stack.pop()
            on_path.discard(ident)
            if stack:
                keys.pop()
    return None


_CONTAINERS: Final = frozenset((dict, list, tuple))
def _flat_scalars(items: list[Any] | tuple[Any, ...]) -> bool:
    """Whether every item is a lossless JSON scalar, tested as the host's snapshot tests it (same codec function)."""
    return holds_only_scalars(items, _max_int)


def _open(container: Any) -> tuple[Iterator[tuple[Any, Any]], int, bool]:
    if type(container) is dict:
        return iter(container.items()), id(container), True
    return enumerate(container), id(container), False


# The largest int magnitude the host can read back (its int-to-str digit limit, sent in
# the run frame): a program may lift this process's own limit and return a larger one,
# which json.dumps here would write and the host then could not parse.
_max_int: int | None = None


def set_max_int_digits(digits: int) -> None:
    """Refuse ints with more than ``digits`` decimal digits (0: no limit), as the host does."""
    global _max_int
    _max_int = 10**digits - 1 if digits else None


set_max_int_digits(sys.get_int_max_str_digits())  # until the run frame says the host's


def _leaf_problem(item: object) -> str | None:
    kind = type(item)
    if item is None or kind is str or kind is bool:
        return None
    if kind is int:
        assert isinstance(item, int)
        limit = _max_int
        if limit is None or -limit <= item <= limit:
            return None
        return f"an int of {item.bit_length()} bits has more digits than JSON text can carry here"
    if kind is float:
        assert isinstance(item, float)
        if not math.isfinite(item):
            return f"{item!r} is not a finite JSON number"
        if item == 0.0 and math.copysign(1.0, item) < 0:
            return "-0.0 has no lossless JSON form"
        return None
    return f"{_type_name(kind)} is not a JSON value"


def _type_name(kind: type) -> str:
    """A type's name as a script's traceback gives it: no module for builtins or the program's own classes.

    The program runs as the body of ``__dsh_main__`` in module ``__run_code__``, so
    a class it defines is ``__run_code__.__dsh_main__.<locals>.X``; the model is
    shown ``X``, as a traceback shows a ``__main__`` class.
    """
    module = kind.__module__ if isinstance(kind.__module__, str) else "<unknown>"
    qualname = kind.__qualname__ if isinstance(kind.__qualname__, str) else kind.__name__
    if module == _PROGRAM_MODULE:
        return qualname.removeprefix(f"{_MAIN_NAME}.<locals>.")
    return qualname if module in ("__main__", "builtins") else f"{module}.{qualname}"


def _spell_path(keys: list[str | int]) -> str:
    return "$" + "".join(f"[{key}]" if type(key) is int else f"[{json.dumps(key)}]" for key in keys)


def _bounded_repr(value: object) -> str:
    """A short repr of a key, even one nested too deep for ``repr()`` or with a ``__repr__`` that raises."""
    import reprlib  # only when a value was refused: keep it out of the child's start-up

    shortener = reprlib.Repr()
    shortener.maxstring = shortener.maxother = 80
    try:
        return shortener.repr(value)
    except Exception:
        return f"<{_type_name(type(value))}>"


# ---------------------------------------------------------------------------
# Output


class _Channel:
    """Writes frames to the protocol descriptor; safe to call from any thread the program starts."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._lock = _thread.allocate_lock()
        # (thread, descriptor, take): while a frame that thread sends waits, take() reads replies.
        self._reading: tuple[int, int, Callable[[], bool]] | None = None

    def read_while_blocked(self, fd: int, take: Callable[[], bool]) -> None:
        """From now on, while a frame sent from this thread waits for the pipe, call ``take`` when ``fd`` is readable.

        ``take`` returns False once ``fd`` has ended (it is not waited on any more).
        """
        self._reading = (_thread.get_ident(), fd, take)

    def forget(self) -> None:
        """In a forked process: never read a reply nor write a frame again; the program's own process does.

        The fork's copy of the descriptor is closed, and the lock, which another
        thread may have held when the process forked, made anew.
        """
        self._reading = None
        self._lock = _thread.allocate_lock()
        fd, self._fd = self._fd, -1
        if fd >= 0:
            try:  # noqa: SIM105 - contextlib is not loaded in the child
                os.close(fd)
            except OSError:
                pass

    def send(self, frame: dict[str, Any]) -> None:
        self.send_text(encode_json(frame))

    def send_text(self, text: str) -> None:
        """Send one frame already encoded by :func:`encode_json` (ASCII, no newline)."""
        self._write(memoryview((text + "\n").encode("ascii")))

    def send_bytes(self, frame: bytes) -> None:
        """Send one frame already encoded to bytes (no newline)."""
        self._write(memoryview(frame + b"\n"))

    def _write(self, data: memoryview) -> None:
        if self._fd < 0:
            return  # forgotten in a forked process: its output goes to descriptor 2 instead
        # A program's signal handler that raises (a SIGALRM "timeout" idiom) would otherwise run
        # between any two steps here: a frame cut in half, or the lock left held for good. Held
        # off until the frame is whole, the handler runs right after, in the program's code.
        held = _signal_mask()
        try:
            _hold_signals()
            self._write_whole(data)
        finally:
            _restore_signals(held)

    def _write_whole(self, data: memoryview) -> None:
        if self._reader_here() is None:
            with self._lock:
                while data:
                    data = data[os.write(self._fd, data) :]
            return
        while not self._lock.acquire(timeout=0.001):
            self._wait(writable=False)  # another thread's frame waits for the pipe: read meanwhile
        try:
            # Non-blocking only for this frame: a write that does not fit returns, and the thread
            # reads replies meanwhile. (Left blocking otherwise, as a program writing to the
            # descriptor itself expects.)
            os.set_blocking(self._fd, False)
            try:
                while data:
                    try:
                        data = data[os.write(self._fd, data) :]
                    except BlockingIOError:
                        self._wait(writable=True)
            finally:
                os.set_blocking(self._fd, True)
        finally:
            self._lock.release()

    def _reader_here(self) -> tuple[int, int, Callable[[], bool]] | None:
        reading = self._reading
        return reading if reading is not None and reading[0] == _thread.get_ident() else None

    def _wait(self, *, writable: bool) -> None:
        """Until the pipe takes more (``writable``) or for no time, taking replies meanwhile on their thread."""
        import select  # only once a frame has had to wait: keep it out of the child's start-up

        reading = self._reader_here()
        if reading is None:
            if writable:
                select.select([], [self._fd], [])
            return
        _, fd, take = reading
        readable, _, _ = select.select([fd], [self._fd] if writable else [], [], None if writable else 0)
        if readable and not take():
            self._reading = None  # the host closed the channel: nothing more to read


# What a frame write holds off: every signal but those a fault raises (held, they would kill).
_HELD_SIGNALS: Final = (
    frozenset(_signal.valid_signals())
    - {getattr(_signal, name) for name in ("SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGTRAP", "SIGABRT") if hasattr(_signal, name)}
    if hasattr(_signal, "pthread_sigmask")
    else frozenset()
)


def _restore_signals(held: Any) -> None:
    if held is not None:
        _signal.pthread_sigmask(_signal.SIG_SETMASK, held)


def _signal_mask() -> Any:
    """This thread's signal mask, to restore after :func:`_hold_signals` (``None``: none to keep).

    Read before holding them, and the hold made inside the ``try``: a handler
    whose signal came just before the hold still runs right after it, and if
    it raises there, the mask must be put back (taken from the hold's own
    return value, it would be lost with the exception).
    """
    if not _HELD_SIGNALS:
        return None  # Windows: no signal masks
    return _signal.pthread_sigmask(_signal.SIG_BLOCK, ())


def _hold_signals() -> None:
    """Block :data:`_HELD_SIGNALS` for this thread (see :func:`_signal_mask` for how to undo it)."""
    if _HELD_SIGNALS:
        _signal.pthread_sigmask(_signal.SIG_BLOCK, _HELD_SIGNALS)


class _ReadingLock:
    """A writer's re-entrant lock that its channel's reader thread waits for while reading replies.

    A thread printing holds it while its frame waits for the pipe, and the
    host reads the pipe again only once the child has read replies it holds
    back: the reader thread, blocked here, would never read them (the run
    hung to its budget). It reads meanwhile, as it does waiting for the
    channel's own lock.

    A C lock's ``with`` leaves no gap for a Python signal handler between
    taking the lock and the block, or between the block and the release; these
    methods are Python code, so signals are held from before the lock is taken
    until after it is released: a program's handler that raises (a SIGALRM
    "timeout") runs then, and never leaves the lock held for good.
    """

    __slots__ = ("_channel", "_lock", "_masks")

    def __init__(self, channel: _Channel) -> None:
        self._channel = channel
        self._lock = _thread.RLock()
        self._masks: list[Any] = []  # the signal masks to restore, one per hold (touched by the holder only)

    def __enter__(self) -> None:
        held = _signal_mask()
        try:
            _hold_signals()
            if not self._lock.acquire(blocking=False):
                if self._channel._reader_here() is None:
                    self._lock.acquire()
                else:
                    while not self._lock.acquire(timeout=0.001):
                        self._channel._wait(writable=False)
        except BaseException:
            _restore_signals(held)
            raise
        self._masks.append(held)

    def __exit__(self, *exc: object) -> None:
        held = self._masks.pop()
        self._lock.release()
        _restore_signals(held)


class _LogWriter(io.TextIOBase):
    """``sys.stdout``/``sys.stderr`` for the program: each complete line becomes one ``log`` frame.

    A partial line waits for its newline (or the end of the run, or a
    ``flush()``, which sends it as a part of the entry); a line longer than
    ``_LOG_CHUNK`` characters is sent in several entries. A line's trailing
    ``"\r"`` (``"\r\n"`` endings, ``csv.writer``) is left out, as it is of a line
    written to descriptors 1 and 2.

    What programs expect of the standard streams works too: ``reconfigure()``
    to UTF-8 or line buffering (what this stream does anyway), a ``buffer``
    taking bytes, and ``fileno()``: descriptor 1 or 2, whose lines the host logs
    as well (descriptor 1 points at 2), so ``faulthandler`` or a subprocess given
    ``stdout=sys.stdout`` write into the same logs.
    """

    encoding = "utf-8"
    errors = "strict"
    line_buffering = True

    def __init__(self, channel: _Channel, fd: int) -> None:
        super().__init__()
        self._channel = channel
        self._fd = fd
        self.name = "<stdout>" if fd == 1 else "<stderr>"
        self._parts: list[str] = []
        self._size = 0
        # Threads of the program print too: each write's text goes out once, as a real stream's does.
        self._lock = _ReadingLock(self._channel)
        self._buffer: _LogBuffer | None = None
        self._forked_to: io.TextIOBase | None = None  # in a forked process: where its text goes instead

    def forked(self, stream: io.TextIOBase) -> None:
        """In a forked process: write to ``stream`` from now on (a reference kept from before the fork still works).

        What the program's process had buffered is its own to send; the lock,
        which another thread may have held when the process forked, is made anew.
        """
        self._lock = _ReadingLock(self._channel)
        self._parts.clear()
        self._size = 0
        self._buffer = None
        self._forked_to = stream

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self._fd

    @property
    def buffer(self) -> _LogBuffer:
        """Bytes written here are decoded as UTF-8 (invalid sequences replaced) into the same log."""
        with self._lock:
            if self._buffer is None:
                self._buffer = _LogBuffer(self)
            return self._buffer

    def reconfigure(
        self,
        *,
        encoding: str | None = None,
        errors: str | None = None,
        newline: str | None = None,
        line_buffering: bool | None = None,
        write_through: bool | None = None,
    ) -> None:
        """Accept what this stream already is (UTF-8, line by line); refuse another encoding.

        ``errors``, ``line_buffering`` and ``write_through`` change nothing: the
        text goes to the host as it is, each line as soon as it ends.
        """
        if encoding is not None:
            import codecs  # loaded at interpreter start-up: no cost

            if codecs.lookup(encoding).name != "utf-8":
                raise ValueError(
                    f"sys.{self.name.strip('<>')} of a run_code program writes UTF-8 text to the run's logs; "
                    f"it cannot be reconfigured to encoding={encoding!r} (only 'utf-8')"
                )
        if newline not in (None, "", "\n", "\r", "\r\n"):
            raise ValueError(f"illegal newline value: {newline!r}")

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        if self._forked_to is not None:
            return self._forked_to.write(text)
        with self._lock:
            if self._buffer is not None:
                self._buffer.flush_tail()  # a character left unfinished there is over: text follows it
            return self._write(text)

    def _write(self, text: str) -> int:
        start = 0
        while (newline := text.find("\n", start)) >= 0:
            self._parts.append(text[start:newline])
            self.end_line()
            start = newline + 1
        if start < len(text):
            self._parts.append(text[start:])
            self._size += len(text) - start
            if self._size > _LOG_CHUNK:
                self._send_whole_chunks()
        return len(text)

    def _send_whole_chunks(self) -> None:
        """Send a line grown past ``_LOG_CHUNK`` but for its last 1 to ``_LOG_CHUNK`` characters, kept for what follows.

        Never the whole line: the newline ``print()`` writes after the text would
        then end an empty line, a blank entry that was never printed. (Nor a
        trailing ``"\r"`` alone, which the line's end leaves out.)
        """
        line = "".join(self._parts)
        cr = line.endswith("\r")
        keep = (len(line) - cr - 1) % _LOG_CHUNK + 1 + cr
        for start in range(0, len(line) - keep, _LOG_CHUNK):
            self._channel.send({"type": "log", "text": line[start : start + _LOG_CHUNK]})
        self._parts[:] = [line[len(line) - keep :]]
        self._size = keep

    def end_line(self) -> None:
        """Send whatever is buffered (a complete line, or the tail at the end of the run)."""
        with self._lock:
            line = "".join(self._parts).removesuffix("\r")
            self._parts.clear()
            self._size = 0
            for start in range(0, max(len(line), 1), _LOG_CHUNK):
                self._channel.send({"type": "log", "text": line[start : start + _LOG_CHUNK]})

    def flush(self) -> None:
        """Send the line written so far, though unfinished (``print(..., flush=True)``).

        The host joins it with what follows; if the run is cut short first (a
        timeout), the part sent is kept: a program's last words are often an
        unfinished ``working...``.
        """
        if self._forked_to is not None:
            self._forked_to.flush()
            return
        with self._lock:
            if self._parts:
                self._channel.send({"type": "log", "text": "".join(self._parts), "partial": True})
                self._parts.clear()
                self._size = 0

    def flush_tail(self) -> None:
        with self._lock:
            if self._buffer is not None:
                self._buffer.flush_tail()
            if self._parts:
                self.end_line()


class _LogBuffer(io.BufferedIOBase):
    """``sys.stdout.buffer`` for the program: bytes decoded as UTF-8 (invalid sequences replaced) into its writer.

    A character split across two writes is decoded whole; bytes of one left
    unfinished at the end of the run become U+FFFD.
    """

    def __init__(self, writer: _LogWriter) -> None:
        super().__init__()
        import codecs  # loaded at interpreter start-up: no cost

        self._writer = writer
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return self._writer.fileno()

    def write(self, data: Any) -> int:
        if isinstance(data, str):
            raise TypeError("a bytes-like object is required, not 'str'")
        raw = memoryview(data).tobytes()
        if self._writer._forked_to is not None:
            self._writer.write(raw.decode("utf-8", "replace"))
            return len(raw)
        with self._writer._lock:
            text = self._decoder.decode(raw)
            if text:
                self._writer._write(text)
        return len(raw)

    def flush(self) -> None:
        self._writer.flush()

    def flush_tail(self) -> None:
        text = self._decoder.decode(b"", final=True)
        if text:
            self._writer._write(text)


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


def _parse(program: str) -> ast.Module:
    return ast.parse(program, filename=_PROGRAM_FILE, mode="exec")


def _compile(tree: ast.Module) -> Any:
    """The parsed program as the body of ``async def __dsh_main__()``, keeping its own line numbers."""
    module = ast.parse(f"async def {_MAIN_NAME}():\n    pass\n", filename=_PROGRAM_FILE, mode="exec")
    function = module.body[0]
    assert isinstance(function, ast.AsyncFunctionDef)
    if tree.body:
        function.body = tree.body
    return compile(module, _PROGRAM_FILE, "exec", dont_inherit=True)


# Describing a failure imports nothing (not even ``traceback``): it must work after the
# program has used up its file descriptors or its memory, and cost no start-up time.


def _program_line(exc: BaseException) -> int | None:
    """The line of the program where ``exc`` was raised (its innermost frame in the program), if any."""
    if isinstance(exc, SyntaxError) and exc.filename == _PROGRAM_FILE:
        return exc.lineno
    line = None
    frame = exc.__traceback__
    while frame is not None:
        if frame.tb_frame.f_code.co_filename == _PROGRAM_FILE and (frame.tb_lineno or 0) > 0:
            line = frame.tb_lineno
        frame = frame.tb_next
    return line


def _exception_line(exc: BaseException) -> str:
    """``Type: message``, as the last line of a traceback names the exception (its notes left out)."""
    kind = type(exc)
    if isinstance(exc, SyntaxError):
        return f"{kind.__name__}: {exc.msg}"
    name = _type_name(kind)
    try:
        message = str(exc)
    except BaseException:  # a KeyboardInterrupt from __str__ too: describing must not raise
        message = "<exception str() failed>"
    return f"{name}: {message}".strip() if message else name


def _describe_exception(exc: BaseException, error_class: type[Exception]) -> str:
    """What the model is told about ``exc``; never raises, whatever the exception or the process is short of."""
    try:
        text = _exception_line(exc)
        if isinstance(exc, BaseExceptionGroup):
            text += " [" + "; ".join(_exception_line(leaf) for leaf in exc.exceptions[:3]) + "]"
        notes = []
        if isinstance(exc, error_class):
            notes.append(f"tool {getattr(exc, 'tool_name', '?')!r}")
        line = _program_line(exc)
        if line is not None:
            notes.append(f"line {line}")
        if notes:
            text += f" ({', '.join(notes)})"
        return text[:_MAX_MESSAGE]
    except BaseException:
        return f"{type(exc).__name__}: <unprintable exception>"


# ---------------------------------------------------------------------------
# Running


# Names through which a program without an import statement could still reach
# one (and with it an awaitable that needs a real event loop).
_IMPORT_HATCHES: Final = frozenset(
    {"__import__", "exec", "eval", "compile", "breakpoint", "globals", "locals", "vars", "__builtins__", "__loader__"}
)


def needs_event_loop(tree: ast.AST) -> bool:
    """Whether the program may await anything but tool calls, so it must run under ``asyncio``.

    Only an imported module can hand a program such an awaitable; ``True``
    for any ``import``, any name that reaches the import machinery, and any
    dunder attribute (``f.__globals__``...), so the answer errs towards asyncio.
    """
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            return True
        if isinstance(node, ast.Name) and node.id in _IMPORT_HATCHES:
            return True
        if isinstance(node, ast.Attribute) and node.attr.startswith("__"):
            return True
    return False


class _Reply:
    """What a tool call waits on under the direct driver: settled by the host's reply frame."""

    __slots__ = ("_done", "_error", "_value")

    def __init__(self) -> None:
        self._done = False
        self._value: object = None
        self._error: BaseException | None = None

    def done(self) -> bool:
        return self._done

    def set_result(self, value: object) -> None:
        self._done, self._value = True, value

    def set_exception(self, error: BaseException) -> None:
        self._done, self._error = True, error

    def __await__(self) -> Generator[_Reply, None, object]:
        if not self._done:
            yield self  # up to the driver, which reads replies until this one is settled
        if self._error is not None:
            raise self._error
        return self._value


class _Run:
    """One program run: the pending tool calls and the replies coming back on stdin."""

    def __init__(self, frame: dict[str, Any], reader: io.BufferedReader, channel: _Channel) -> None:
        self.program: str = frame["program"]
        self.names: list[str] = frame["names"]
        self.global_name: str = frame["global"]
        self.error_class = _make_error_class(frame["error_class"])
        self.max_output_bytes: int = frame["max_output_bytes"]
        self.max_frame_bytes: int = frame["max_frame_bytes"]
        self.max_json_values: int = frame["max_json_values"]
        if "max_int_digits" in frame:  # absent from a host older than the field: this process's own limit
            set_max_int_digits(frame["max_int_digits"])
        self.reader = reader
        self.channel = channel
        self.pending: dict[int, tuple[str, _Reply | asyncio.Future[object]]] = {}
        self.next_id = 1
        self.ids_lock = _thread.allocate_lock()
        self.thread = _thread.get_ident()  # the thread the program (and its event loop) runs on
        self.forked = False  # a process the program forked, not the program's own
        self.loop: asyncio.AbstractEventLoop | None = None  # set while running under asyncio
        self.unparsed = bytearray()  # under asyncio: what arrived of a reply line not yet complete
        self.unparsed_scanned = 0  # how much of it is known to hold no newline
        self.writers: list[_LogWriter] = []

    async def call(self, name: str, args: object) -> object:
        if self.forked:
            raise self.error_class(
                name,
                "tools cannot be called from a forked process (os.fork, multiprocessing's 'fork' start method); "
                "only the program's own process can call them: send what the worker needs back to it "
                "(a return value, a multiprocessing Queue) and make the call there",
            )
        if not self.on_program_loop():
            # Its reply could not reach it: refused before the host runs the tool (a write the
            # program, told the call failed, would make again).
            raise self.error_class(
                name,
                "tools can only be called on the program's own event loop, not from another thread or its "
                "event loop; from a thread, use asyncio.run_coroutine_threadsafe(tools.name(args), loop)"
                ".result(), with loop = asyncio.get_running_loop() taken in the program",
            )
        try:
            problem = json_problem(args, self.max_json_values)
        except TooManyValues:
            raise self.error_class(
                name, f"tool arguments hold more than {self.max_json_values} JSON values (max_json_values)"
            ) from None
        if problem is not None:
            raise self.error_class(
                name, f"tool arguments must be lossless JSON (pass an arguments dict, e.g. `{{}}`): {problem}"
            )
        with self.ids_lock:
            call_id = self.next_id
            self.next_id += 1
        try:
            text = encode_json({"type": "call", "id": call_id, "name": name, "args": args})
        except (ValueError, TypeError) as exc:
            raise self.error_class(name, f"tool arguments cannot be sent: {exc}") from None
        if len(text) > self.max_frame_bytes:
            raise self.error_class(name, f"tool arguments exceed {self.max_frame_bytes} bytes")
        reply: _Reply | asyncio.Future[object] = _Reply() if self.loop is None else self.loop.create_future()
        self.pending[call_id] = (name, reply)
        try:
            self.channel.send_text(text)
            return await reply
        except BaseException:
            # A cancelled await cancels the future too: it is done, with no reply in it.
            if not isinstance(reply, _Reply) and (not reply.done() or reply.cancelled()):
                # Cancelled while it waited (asyncio.wait_for ran out, task.cancel()): the host
                # cancels the call too, so the calls made after it need not wait for its body.
                try:  # noqa: SIM105 - contextlib is not loaded in the child
                    self.channel.send_text(encode_json({"type": "cancel", "id": call_id}))
                except BaseException:
                    pass
            raise
        finally:
            self.pending.pop(call_id, None)

    def on_program_loop(self) -> bool:
        """Whether a call awaited here can be answered: on the program's thread, in its event loop if it has one."""
        if _thread.get_ident() != self.thread:
            return False
        if self.loop is None:
            return True
        import asyncio  # loaded already: the program runs under it

        try:
            return asyncio.get_running_loop() is self.loop
        except RuntimeError:
            return False

    def receive(self, line: bytes | None) -> None:
        """Settle the call a reply line answers (None: the host closed the channel)."""
        if line is None:
            for name, reply in self.pending.values():
                if not reply.done():
                    reply.set_exception(self.error_class(name, "the host closed the channel"))
            return
        message = decode_json(line.decode("utf-8"))
        entry = self.pending.get(message["id"])
        if entry is None or entry[1].done():
            return  # the program stopped waiting for this call
        name, reply = entry
        if message["ok"]:
            reply.set_result(message["value"])
        else:
            reply.set_exception(self.error_class(name, message["message"]))

    def drive(self, main: Callable[[], Awaitable[object]]) -> object:
        """Run ``main()`` with no event loop: each suspension is one tool call waiting for its reply."""
        coroutine = main().__await__()
        error: BaseException | None = None
        while True:
            try:
                waiting = coroutine.send(None) if error is None else coroutine.throw(error)
            except StopIteration as stop:
                return stop.value
            error = None
            if type(waiting) is not _Reply:
                # Unreachable for a program needs_event_loop() let through; say so rather than hang.
                error = RuntimeError(
                    f"run_code: the program awaited {type(waiting).__name__}, not a tool call; "
                    "add `import asyncio` to run it under an event loop"
                )
                continue
            while not waiting.done():
                line = self.reader.readline()
                self.receive(line or None)

    def listen(self, loop: asyncio.AbstractEventLoop) -> None:
        """Have ``loop`` read reply lines off the protocol descriptor as they arrive.

        And the channel too, while a frame the loop's thread sends waits for the pipe: the
        host may hold that frame's call back until this process reads the replies it has
        written, so waiting without reading them would leave each side waiting for the other.
        """
        fd = self.reader.fileno()
        os.set_blocking(fd, False)
        # The run frame was read through the buffered reader: take what it read ahead
        # (nothing, normally: the host writes no reply before a call), then read the fd itself.
        try:
            self.unparsed = bytearray(self.reader.read1(1 << 16) or b"")
        except BlockingIOError:
            self.unparsed = bytearray()

        def readable() -> None:
            if not self.take_replies():
                loop.remove_reader(fd)

        loop.add_reader(fd, readable)
        self.channel.read_while_blocked(fd, self.take_replies)

    def take_replies(self) -> bool:
        """Read the replies that have arrived and settle their calls; False once the host has closed the channel."""
        if self.forked:
            return False  # the program's own process reads them
        try:
            chunk = os.read(self.reader.fileno(), 1 << 16)
        except BlockingIOError:
            return True
        except OSError:
            chunk = b""
        if not chunk:
            self.receive(None)
            return False
        unparsed = self.unparsed
        unparsed.extend(chunk)
        # From where the last search stopped: a reply of many megabytes comes in 64 KiB reads,
        # and searching it all again each time was quadratic.
        while (end := unparsed.find(b"\n", self.unparsed_scanned)) >= 0:
            line = bytes(unparsed[:end])
            del unparsed[: end + 1]
            self.unparsed_scanned = 0
            self.receive(line)
        self.unparsed_scanned = len(unparsed)
        return True

    def serve(self, writers: list[_LogWriter]) -> NoReturn:
        """Run the program and send the ``done`` frame describing how it ended; never returns."""
        self.writers = writers
        namespace: dict[str, Any] = {
            "__name__": _PROGRAM_MODULE,
            "__builtins__": builtins,
            self.global_name: _make_tools(self.names, self.call),
            self.error_class.__name__: self.error_class,
        }
        try:
            tree = _parse(self.program)
            exec(_compile(tree), namespace)
            main = namespace.pop(_MAIN_NAME)
            if main.__code__.co_flags & _CO_ASYNC_GENERATOR:
                raise SyntaxError("'yield' is not allowed in a run_code program")
            if needs_event_loop(tree):
                import asyncio

                # Finishes inside the loop. Not asyncio.run: closing the runner cancels every task,
                # so a SystemExit or KeyboardInterrupt that a task or callback lets out of the loop
                # would be reported as the main coroutine's CancelledError; it reaches the except
                # below instead, and the process ends without closing the loop.
                asyncio.Runner().run(self._serve_under_asyncio(main))
            value = self.drive(main)
        except BaseException as exc:
            # Everything the program raises is its outcome, SystemExit and
            # CancelledError included: the process ends right after.
            self.finish(_failure("exception", _describe_exception(exc, self.error_class)))
        self.finish(self.done_frame(value))

    async def _serve_under_asyncio(self, main: Callable[[], Awaitable[object]]) -> NoReturn:
        import asyncio

        self.loop = asyncio.get_running_loop()
        self.listen(self.loop)
        try:
            value = await main()
        except BaseException as exc:
            self.finish(_failure("exception", _describe_exception(exc, self.error_class)))
        self.finish(self.done_frame(value))

    def done_frame(self, value: object) -> dict[str, Any] | bytes:
        """The ``done`` frame for a program that returned ``value``: already encoded (UTF-8) when it carries the value.

        Never raises: the value is the program's, and whatever checking or
        encoding it runs into (``MemoryError`` under a memory limit) is an
        ``invalid-output`` outcome, not a child that dies without a word.
        """
        try:
            return self._value_frame(value)
        except Exception as exc:
            message = _describe_exception(exc, self.error_class)
            return _failure("invalid-output", f"the program returned a value that could not be checked: {message}")

    def _value_frame(self, value: object) -> dict[str, Any] | bytes:
        if value is None:
            return {"type": "done"}
        try:
            problem = json_problem(value, self.max_json_values)
        except TooManyValues:
            return _failure(
                "output-limit",
                f"the returned value holds more than {self.max_json_values} JSON values (max_json_values)",
            )
        if problem is not None:
            return _failure("invalid-output", f"the program returned a value that is not lossless JSON: {problem}")
        try:
            # What the cap counts: the UTF-8 size of the value's compact JSON, as the host
            # measures it (a lone surrogate is three bytes).
            plain = encode_json(value, ascii_only=False)
        except (ValueError, TypeError) as exc:
            return _failure("invalid-output", f"the program returned a value that cannot be encoded: {exc}")
        # The frame carries exactly those bytes, so a value within the cap always fits a frame
        # (max_frame_bytes is above the cap); escaped to ASCII it could outgrow it (six bytes
        # for each é, twelve for an emoji).
        # isascii() is a flag lookup: an ASCII value (the usual case) is encoded without a check.
        encoded = plain.encode("ascii") if plain.isascii() else plain.encode("utf-8", "surrogatepass")
        if len(encoded) > self.max_output_bytes:
            return _failure("output-limit", f"the returned value exceeds {self.max_output_bytes} bytes")
        return b'{"type":"done","value":' + encoded + b"}"

    def forget_channel(self) -> None:
        """In a forked process: the channel and the replies are the program's own process's; see :func:`_after_fork`."""
        self.forked = True
        self.ids_lock = _thread.allocate_lock()
        try:  # noqa: SIM105 - contextlib is not loaded in the child
            self.reader.close()
        except BaseException:
            pass

    def finish(self, done: dict[str, Any] | bytes) -> NoReturn:
        if self.forked:
            _end_fork(done)
        for stream in (sys.stdout, sys.stderr):
            # A stream the program put in their place (io.TextIOWrapper(sys.stdout.buffer, ...), a
            # common "make it UTF-8" line) holds what it printed; an interpreter flushes it at exit,
            # os._exit does not.
            if stream is not None and not any(stream is writer for writer in self.writers):
                try:  # noqa: SIM105 - contextlib is not loaded in the child
                    stream.flush()
                except BaseException:
                    pass
        for writer in self.writers:
            writer.flush_tail()
        for stream in (sys.__stdout__, sys.__stderr__):
            # What went through the original streams (a library that kept them) is buffered
            # here and would die with os._exit: written out, it reaches the host's log.
            try:
                if stream is not None:
                    stream.flush()
            except BaseException:
                pass
        ctypes = sys.modules.get("ctypes")
        if ctypes is not None:
            # A program that printed through C (libc printf via ctypes) left it in C's own stdio
            # buffer, which os._exit drops. Only then: importing ctypes costs every other run.
            try:  # noqa: SIM105 - contextlib is not loaded in the child
                ctypes.CDLL(None).fflush(None)
            except BaseException:
                pass
        _end_descendants()
        if isinstance(done, bytes):
            self.channel.send_bytes(done)
        else:
            self.channel.send(done)
        # Leave at once: no asyncio teardown waiting on the program's leftover
        # tasks, no atexit handlers printing after ``done``.
        _exit(0)


def _after_fork(run: _Run, channel: _Channel, writers: list[_LogWriter]) -> None:
    """In a process the program forked (``os.fork``, multiprocessing's ``fork`` start method): let go of the channel.

    Writing frames of its own would interleave with the program's (a frame
    larger than the pipe's atomic size is cut among them), and reading would
    take replies the program waits for. The fork prints plain text to
    descriptor 2, which the host logs line by line, and its tool calls fail.
    """
    channel.forget()
    run.forget_channel()
    streams = [
        io.TextIOWrapper(
            io.FileIO(2, "w", closefd=False), encoding="utf-8", errors="backslashreplace", line_buffering=True
        )
        for _ in writers
    ]
    for writer, stream in zip(writers, streams, strict=True):
        writer.forked(stream)
    sys.stdout, sys.stderr = streams


def _end_fork(done: dict[str, Any] | bytes) -> NoReturn:
    """A forked process that ran the rest of the program to its end: exit, the outcome its own (not the run's)."""
    error = done.get("error") if isinstance(done, dict) else None
    try:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        if error is not None:
            line = f"run_code: forked process {os.getpid()} ended: {error['kind']}: {error['message']}\n"
            os.write(2, line.encode("utf-8", "backslashreplace"))
    except BaseException:
        pass
    _exit(1 if error is not None else 0)


_CO_ASYNC_GENERATOR: Final = 0x200  # inspect.CO_ASYNC_GENERATOR, without importing inspect


def descendants(root: int) -> list[int]:
    """Every live process below ``root``, by parent pid, whatever session or group it moved to.

    Read from Linux's ``/proc`` (elsewhere: none found). The host's kill of the
    child's process group misses a process started in a session or group of its
    own (``start_new_session=True``, ``setsid``); its parent pid still leads here
    while the child lives.
    """
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    children: dict[int, list[int]] = {}
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as stat:
                fields = stat.read().rpartition(b")")[2].split()
        except OSError:
            continue  # gone meanwhile
        if len(fields) > 1 and fields[0] != b"Z":  # a zombie has nothing left to stop
            children.setdefault(int(fields[1]), []).append(int(name))
    found: list[int] = []
    below = [root]
    while below:
        for pid in children.get(below.pop(), ()):
            found.append(pid)
            below.append(pid)
    return found


def _end_descendants() -> None:
    """SIGKILL whatever the program started and left running, before the child exits and they lose their parent.

    Only when the child has children at all (``waitpid`` says so without a
    scan): a program that started nothing pays one system call.
    """
    try:
        os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
        return  # no children: nothing below this process
    except BaseException:
        pass
    try:
        for pid in descendants(os.getpid()):
            try:  # noqa: SIM105 - contextlib is not loaded in the child
                os.kill(pid, _signal.SIGKILL)
            except OSError:
                pass  # gone meanwhile
    except BaseException:
        pass  # the run's outcome still goes out


def _program_exit(status: int) -> NoReturn:
    """``os._exit`` as the program sees it: what it started is ended first, as at the end of a run.

    Otherwise a process it started in a session of its own would outlive the
    child: the host's kill of a child that has already exited reaches only
    its process group.
    """
    _end_descendants()
    _exit(status)


_program_exit.__name__ = _program_exit.__qualname__ = "_exit"
_program_exit.__doc__ = os._exit.__doc__


def _on_cpu_limit(signum: int, frame: object) -> None:
    """SIGXCPU at the soft CPU limit: end what the program started, then die of the signal as without this handler.

    The host reports a child killed by SIGXCPU as one that used up
    ``max_cpu_s``. A handler runs between bytecodes of the main thread: a
    program stuck in one long C call meets the hard limit (SIGKILL) a second
    later instead, and what it started is left to the host's process-group kill.
    """
    _end_descendants()
    _signal.signal(signum, _signal.SIG_DFL)
    if hasattr(_signal, "pthread_sigmask"):
        _signal.pthread_sigmask(_signal.SIG_UNBLOCK, {signum})
    _signal.raise_signal(signum)
    _exit(1)  # not reached: the signal's default action ends the process


def _failure(kind: str, message: str) -> dict[str, Any]:
    return {"type": "done", "error": {"kind": kind, "message": message}}


# Audit events that start another program: refused when the host forbids subprocesses.
_SPAWN_EVENTS: Final = frozenset(
    (
        "os.exec",
        "os.fork",
        "os.forkpty",
        "os.posix_spawn",
        "os.spawn",
        "os.system",
        "os.startfile",
        "subprocess.Popen",
        "pty.spawn",
        "ctypes.dlopen",  # a C library could fork behind the hooks' back
    )
)


_NETWORK_EVENTS: Final = frozenset(
    (
        "socket.connect",
        "socket.bind",
        "socket.sendto",
        "socket.sendmsg",
        "socket.getaddrinfo",
        "socket.gethostbyname",
        "socket.gethostbyaddr",
    )
)
_AF_UNIX: Final = 1  # socket.AF_UNIX wherever it exists, without importing socket
_FILE_CHANGE_EVENTS: Final = frozenset(
    (
        "os.remove",
        "os.rename",
        "os.rmdir",
        "os.mkdir",
        "os.chmod",
        "os.chown",
        "os.truncate",
        "os.link",
        "os.symlink",
        "os.utime",
        "os.setxattr",
        "os.removexattr",
        "os.mknod",  # raised by the child's stand-ins: see _audit_special_files
        "os.mkfifo",
        "shutil.rmtree",
        "shutil.copyfile",
        "shutil.move",
    )
)


def apply_limits(limits: dict[str, Any]) -> None:
    """Lower this process's resource limits (soft and hard) and forbid spawning, as the run frame asks.

    Called before the program is compiled. Raises ``OSError``/``ValueError``
    when a limit cannot be set: the run must not go on without it.
    """
    if not limits:
        return
    rlimits = {"memory_bytes": "RLIMIT_AS", "cpu_s": "RLIMIT_CPU", "file_bytes": "RLIMIT_FSIZE"}
    wanted = {key: value for key, value in limits.items() if key in rlimits and value is not None}
    if wanted:
        import resource

        for key, value in wanted.items():
            which = getattr(resource, rlimits[key])
            _, hard = resource.getrlimit(which)
            ceiling = value if hard == resource.RLIM_INFINITY else min(value, hard)
            soft = top = ceiling
            if key == "cpu_s":
                # SIGXCPU at the soft limit ends what the program started and names the cause; the hard
                # limit a second later is SIGKILL. Soft below hard, or the kernel sends SIGKILL alone.
                if hard == resource.RLIM_INFINITY or ceiling < hard:
                    top = ceiling + 1
                elif ceiling > 1:
                    soft = ceiling - 1
                if hasattr(_signal, "SIGXCPU"):
                    _signal.signal(_signal.SIGXCPU, _on_cpu_limit)
            resource.setrlimit(which, (soft, top))
    refused: list[tuple[frozenset[str], str]] = []
    if limits.get("subprocesses") is False:
        refused.append((_SPAWN_EVENTS, "start other programs"))
    if limits.get("network") is False:
        refused.append((_NETWORK_EVENTS, "use the network, only its tools may"))
    writes = limits.get("file_writes") is False
    if writes:
        refused.append((_FILE_CHANGE_EVENTS, "change files, only its tools may"))
        sys.dont_write_bytecode = True  # imports must not try to write .pyc files
        _audit_special_files()
    if not refused:
        return
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    offline = limits.get("network") is False

    def refuse(event: str, args: tuple[Any, ...]) -> None:
        for events, what in refused:
            if event in events:
                raise PermissionError(f"this run_code program may not {what} ({event})")
        # Any socket but a local one: listen() on an unbound socket binds a port on every
        # interface without a bind event. (asyncio's loop needs its AF_UNIX socketpair.)
        if offline and event == "socket.__new__" and args[1] != _AF_UNIX:
            raise PermissionError("this run_code program may not use the network, only its tools may (socket.__new__)")
        if writes and event == "open" and len(args) == 3 and isinstance(args[2], int) and args[2] & write_flags:
            raise PermissionError(f"this run_code program may not change files, only its tools may (open {args[0]!r})")
        # Binding a local socket to a path makes a file there (an abstract name, from a NUL, does not).
        if writes and event == "socket.bind" and _names_a_file(args[1]):
            raise PermissionError(f"this run_code program may not change files, only its tools may (bind {args[1]!r})")

    sys.addaudithook(refuse)


def _names_a_file(address: object) -> bool:
    """Whether a ``socket.bind`` address is a file-system path (an ``AF_UNIX`` one not in the abstract namespace)."""
    if isinstance(address, str | bytes | bytearray | memoryview) and not isinstance(address, memoryview):
        return len(address) > 0 and address[:1] not in ("\0", b"\0")
    return hasattr(address, "__fspath__")


def _audit_special_files() -> None:
    """Have ``os.mknod`` and ``os.mkfifo`` raise an audit event first, as other file-changing calls do.

    CPython raises none for either, so without these stand-ins a program
    refused every other way of making a file could still make one. They
    replace the functions in ``posix`` too, which ``os`` re-exports.
    """
    import posix

    def audited(name: str, original: Callable[..., None]) -> Callable[..., None]:
        def stand_in(path: Any, *args: Any, **kwargs: Any) -> None:
            sys.audit(f"os.{name}", path, *args, *kwargs.values())
            original(path, *args, **kwargs)

        stand_in.__name__ = stand_in.__qualname__ = name
        stand_in.__doc__ = original.__doc__
        return stand_in

    for name in ("mknod", "mkfifo"):
        original = getattr(posix, name, None)
        if original is not None:  # neither exists on Windows
            setattr(posix, name, audited(name, original))
            setattr(os, name, getattr(posix, name))


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
        _exit(2)
    try:
        apply_limits(frame.get("limits") or {})
    except Exception as exc:
        channel.send(_failure("exception", f"the requested resource limits could not be applied: {exc}"))
        _exit(0)
    writers = [_LogWriter(channel, 1), _LogWriter(channel, 2)]
    sys.stdout, sys.stderr = writers
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=lambda: _after_fork(run, channel, writers))
    os._exit = _program_exit
    sys.stdin = io.StringIO()
    try:
        run.serve(writers)
    except BaseException:
        # Only reachable when the channel itself failed (the host went away).
        _exit(1)
    _exit(1)


if __name__ == "__main__":
    main()
