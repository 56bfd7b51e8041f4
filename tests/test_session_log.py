"""The durable session log: append, read back, survive a torn tail, refuse corruption."""

from __future__ import annotations

import gzip
import json
import os
import stat
import threading
from pathlib import Path
from typing import Any

import pytest
import trio

import dsh_core._session_log as session_log_module
from dsh_core._content import ImageBlock, TextBlock
from dsh_core._errors import NonJsonValueError
from dsh_core._json import FrozenDict
from dsh_core._session_log import (
    SessionLog,
    SessionLogError,
    read_session_log,
    structure_content,
)

GZIPPED_NOTES = gzip.compress(b"important notes\n", mtime=0)


@pytest.fixture
def log_path(tmp_path: Path) -> Path:
    return tmp_path / "session.jsonl"


def nested(depth: int, leaf: object = "leaf") -> object:
    value = leaf
    for _ in range(depth):
        value = [value]
    return value


def depth_of(value: object) -> tuple[int, object]:
    depth = 0
    while isinstance(value, (list, tuple)):
        value = value[0]
        depth += 1
    return depth, value


def write_three(path: Path, **options: Any) -> None:
    with SessionLog(path, **options) as log:
        for n in range(3):
            log.append({"type": "note", "data": {"n": n}})


# --- round trip ---------------------------------------------------------------------------


def test_tool_events_round_trip_with_camel_case_data(log_path: Path) -> None:
    """Each typed helper writes its event with camelCase data that reads back unchanged."""
    with SessionLog(log_path) as log:
        seqs = [
            log.append_call("c1", "read_file", {"path": "é.txt", "lines": [1, 2]}, agent="main"),
            log.append_result(
                "c1",
                content=[TextBlock(text="hello"), ImageBlock(data="AAAA", mime_type="image/png")],
                is_error=False,
                meta={"diffs": []},
            ),
            log.append_dispatch_start("root", "c2", "c2:code:1", "grep", {"q": "x"}),
            log.append_dispatch("root", "c2", "c2:code:1", "grep", {"q": "x"}, content=[], is_error=True),
            log.append_result(
                "c2",
                content=[TextBlock(text="Error: boom")],
                is_error=True,
                error={"name": "ToolError", "code": "TOOL_ERROR", "message": "boom"},
            ),
        ]
    assert seqs == [1, 2, 3, 4, 5]
    read = read_session_log(log_path)
    assert read.torn is None
    assert [(e.seq, e.type) for e in read.events] == [
        (1, "tool/call"),
        (2, "tool/result"),
        (3, "tool/code-dispatch-start"),
        (4, "tool/code-dispatch"),
        (5, "tool/result"),
    ]
    assert [e.data for e in read.events] == [
        {"callId": "c1", "name": "read_file", "arguments": {"path": "é.txt", "lines": [1, 2]}, "agent": "main"},
        {
            "callId": "c1",
            "content": [{"type": "text", "text": "hello"}, {"type": "image", "data": "AAAA", "mimeType": "image/png"}],
            "isError": False,
            "error": None,
            "meta": {"diffs": []},
        },
        {"rootCallId": "root", "parentCallId": "c2", "subCallId": "c2:code:1", "name": "grep", "arguments": {"q": "x"}},
        {
            "rootCallId": "root",
            "parentCallId": "c2",
            "subCallId": "c2:code:1",
            "name": "grep",
            "arguments": {"q": "x"},
            "isError": True,
            "content": [],
        },
        {
            "callId": "c2",
            "content": [{"type": "text", "text": "Error: boom"}],
            "isError": True,
            "error": {"name": "ToolError", "code": "TOOL_ERROR", "message": "boom"},
            "meta": None,
        },
    ]
    assert all(type(e.data) is FrozenDict for e in read.events)


def test_each_line_is_compact_utf8_json_with_seq_type_data(log_path: Path) -> None:
    """The file is one JSON object per line, non-ASCII kept as UTF-8, ending in a newline."""
    with SessionLog(log_path) as log:
        log.append({"type": "note", "data": {"text": "héllo"}})
    raw = log_path.read_bytes()
    assert raw == '{"seq":1,"type":"note","data":{"text":"héllo"}}\n'.encode()


def test_logged_content_structures_back_into_blocks(log_path: Path) -> None:
    """Replay can turn a logged content list back into the blocks the model saw."""
    blocks = (TextBlock(text="a"), ImageBlock(data="b", mime_type="image/gif"))
    with SessionLog(log_path) as log:
        log.append_result("c", content=blocks, is_error=False)
    (event,) = read_session_log(log_path).events
    assert structure_content(event.data["content"]) == blocks


def test_structure_content_names_the_bad_path() -> None:
    """Malformed logged content is a SessionLogError with the JSON path of each problem."""
    with pytest.raises(SessionLogError) as info:
        structure_content([{"type": "text", "text": "a"}, {"type": "text", "text": 3}])
    assert "$[1].text" in str(info.value)


def test_lone_surrogates_survive_the_round_trip(log_path: Path) -> None:
    """A string with no UTF-8 form is written as a JSON escape, not lost or crashed on."""
    with SessionLog(log_path) as log:
        log.append_call("c", "t", {"s": "a\ud800b"})
    (event,) = read_session_log(log_path).events
    assert event.data["arguments"] == {"s": "a\ud800b"}


def test_each_event_is_one_write_including_its_newline(log_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A line reaches the OS in a single write call, so a crash tears at most that one line."""
    writes: list[bytes] = []
    real_fdopen = os.fdopen

    class Recording:
        def __init__(self, file: Any) -> None:
            self._file = file

        def write(self, data: Any) -> int:
            writes.append(bytes(data))
            written: int = self._file.write(data)
            return written

        def __getattr__(self, name: str) -> Any:
            return getattr(self._file, name)

    def recording_fdopen(*args: Any, **kwargs: Any) -> Any:
        return Recording(real_fdopen(*args, **kwargs))

    monkeypatch.setattr(session_log_module.os, "fdopen", recording_fdopen)
    with SessionLog(log_path) as log:
        log.append({"type": "a", "data": {}})
        log.append_call("c", "t", {"x": "y" * 10_000})
    assert len(writes) == 2
    assert all(w.endswith(b"\n") and w.count(b"\n") == 1 for w in writes)


# --- validation before writing ------------------------------------------------------------


@pytest.mark.parametrize(
    ("append", "error"),
    [
        (lambda log: log.append({"type": "x", "data": {"bad": float("nan")}}), NonJsonValueError),
        (lambda log: log.append({"type": "", "data": {}}), TypeError),
        (lambda log: log.append({"type": "x"}), TypeError),
        (lambda log: log.append({"type": "x", "data": [1]}), TypeError),
        (lambda log: log.append_call("c", "t", {"s": {1, 2}}), NonJsonValueError),
        (lambda log: log.append_call(1, "t", {}), TypeError),
        (lambda log: log.append_result("c", content="text", is_error=False), TypeError),
        (lambda log: log.append_result("c", content=[], is_error=True), ValueError),
        (
            lambda log: log.append_result(
                "c", content=[], is_error=False, error={"name": "E", "code": "C", "message": "m"}
            ),
            ValueError,
        ),
        (lambda log: log.append_result("c", content=[], is_error=True, error={"name": "E"}), ValueError),
        (lambda log: log.append_dispatch("r", "p", "s", "n", {}, content=[], is_error=0), TypeError),
    ],
)
def test_invalid_events_are_refused_before_anything_is_written(
    log_path: Path, append: Any, error: type[Exception]
) -> None:
    """A bad event raises and leaves the file and the numbering untouched."""
    with SessionLog(log_path) as log:
        log.append({"type": "ok", "data": {}})
        with pytest.raises(error):
            append(log)
        assert log.next_seq == 2
    assert [e.seq for e in read_session_log(log_path).events] == [1]


def test_appending_to_a_closed_log_fails(log_path: Path) -> None:
    """After close the log refuses events instead of reopening silently."""
    log = SessionLog(log_path)
    log.close()
    log.close()
    assert log.closed
    with pytest.raises(ValueError, match="closed"):
        log.append({"type": "x", "data": {}})


def test_unknown_fsync_policy_is_refused(log_path: Path) -> None:
    """A typo in the policy is an error, not a silent default."""
    with pytest.raises(ValueError, match="fsync must be one of"):
        SessionLog(log_path, fsync="sometimes")  # type: ignore[arg-type]


def test_a_failed_write_stops_further_appends(log_path: Path) -> None:
    """After a write that may have left half a line, appending would bury it mid-log, so it is refused."""

    class HalfWriter:
        def __init__(self, file: Any) -> None:
            self._file = file

        def write(self, data: Any) -> int:
            self._file.write(bytes(data)[:5])
            raise OSError(28, "No space left on device")

        def __getattr__(self, name: str) -> Any:
            return getattr(self._file, name)

    log = SessionLog(log_path, fsync="never")
    log.append({"type": "ok", "data": {}})
    log._file = HalfWriter(log._file)  # type: ignore[assignment]
    with pytest.raises(OSError, match="No space"):
        log.append({"type": "lost", "data": {}})
    with pytest.raises(SessionLogError, match="reopen the log to repair it"):
        log.append({"type": "ok", "data": {}})
    log.close()
    with SessionLog(log_path) as reopened:
        assert reopened.torn is not None
        assert reopened.append({"type": "ok", "data": {}}) == 2
    assert [e.seq for e in read_session_log(log_path).events] == [1, 2]


# --- reopening ----------------------------------------------------------------------------


def test_reopening_continues_the_sequence(log_path: Path) -> None:
    """A second writer session picks up numbering where the first stopped."""
    write_three(log_path)
    with SessionLog(log_path) as log:
        assert log.torn is None
        assert log.next_seq == 4
        assert log.append({"type": "note", "data": {}}) == 4
    assert [e.seq for e in read_session_log(log_path).events] == [1, 2, 3, 4]


def test_empty_existing_file_starts_at_one(log_path: Path) -> None:
    """An empty file is a log with no events."""
    log_path.touch()
    with SessionLog(log_path) as log:
        assert log.next_seq == 1
    assert read_session_log(log_path).events == ()


# --- torn and garbled lines ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("tail", "reason"),
    [
        (b'{"seq":4,"type":"note","da', "has no newline"),
        (b'{"seq":4,"type":"note","data":{}}', "has no newline"),
        (b'{"seq":4,"type":"no\x00\x00\x00\n', "is not valid JSON"),
        (b"\xff\xfe\n", "is not UTF-8"),
        (b"\n", "is empty"),
    ],
)
def test_torn_last_line_is_skipped_and_reported(log_path: Path, tail: bytes, reason: str) -> None:
    """A crash mid-write damages only the last line: the reader keeps every earlier event and says what it skipped."""
    write_three(log_path)
    size = log_path.stat().st_size
    with open(log_path, "ab") as file:
        file.write(tail)
    read = read_session_log(log_path)
    assert [e.seq for e in read.events] == [1, 2, 3]
    assert read.torn is not None
    assert (read.torn.line, read.torn.offset, read.torn.size) == (4, size, len(tail))
    assert reason in read.torn.reason
    assert str(read.torn).startswith(f"line 4 (byte {size}, {len(tail)} bytes) {reason}")


@pytest.mark.parametrize("tail", [b'{"seq":4,"ty', b'{"se', b"\x00" * 100, b'{"seq":4,"type":"x"\x00\x00'])
def test_reopening_cuts_off_a_torn_tail_and_reports_it(log_path: Path, tail: bytes) -> None:
    """The next append starts on a clean line after the torn one is removed, reusing its seq."""
    write_three(log_path)
    clean = log_path.read_bytes()
    with open(log_path, "ab") as file:
        file.write(tail)
    with SessionLog(log_path) as log:
        assert log.torn is not None
        assert log.torn.line == 4
        assert log_path.read_bytes() == clean
        assert log.append({"type": "after", "data": {}}) == 4
    read = read_session_log(log_path)
    assert read.torn is None
    assert [(e.seq, e.type) for e in read.events][-1] == (4, "after")


def test_a_whole_json_last_line_not_in_our_shape_is_refused_not_cut_off(log_path: Path) -> None:
    """An event with a key this writer does not know (a newer writer's) was taken for torn and deleted."""
    write_three(log_path)
    with open(log_path, "ab") as file:
        file.write(b'{"seq":4,"type":"tool/result","data":{},"ts":123}\n')
    before = log_path.read_bytes()
    with pytest.raises(SessionLogError, match="line 4: is not an event object"):
        SessionLog(log_path)
    assert log_path.read_bytes() == before


@pytest.mark.parametrize("last", [True, False], ids=["last-line", "middle-line"])
def test_a_line_holding_an_integer_too_long_to_convert_is_refused_and_kept(log_path: Path, last: bool) -> None:
    """Valid JSON Python will not convert by default: called "not valid JSON", and as a last line cut off as torn."""
    write_three(log_path)
    lines = log_path.read_bytes().splitlines(keepends=True)
    line = b'{"seq":4,"type":"note","data":{"n":' + b"7" * 5000 + b"}}\n"
    log_path.write_bytes(b"".join([*lines, line] if last else [*lines[:1], line, *lines[1:]]))
    before = log_path.read_bytes()
    problem = "cannot be read: it holds an integer of 5000 digits, longer than the 4300 digits accepted"
    # The writer reads back to the last event only: a middle line is the readers' to refuse.
    for reader in (read_session_log, SessionLog) if last else (read_session_log,):
        with pytest.raises(SessionLogError) as refused:
            reader(log_path)
        assert f"line {4 if last else 2}: {problem}" in str(refused.value)
    assert log_path.read_bytes() == before


def test_a_torn_last_line_holding_a_long_integer_is_still_cut_off_as_torn(log_path: Path) -> None:
    write_three(log_path)
    clean = log_path.read_bytes()
    with open(log_path, "ab") as file:
        file.write(b'{"seq":4,"type":"note","data":{"n":' + b"7" * 5000 + b',"x":\n')
    with SessionLog(log_path) as log:
        assert log.torn is not None and log.torn.line == 4
    assert log_path.read_bytes() == clean


def test_reopening_a_log_that_is_only_a_torn_line_starts_over(log_path: Path) -> None:
    """A crash during the very first write leaves nothing committed."""
    log_path.write_bytes(b'{"seq":1,"type"')
    with SessionLog(log_path) as log:
        assert log.torn is not None
        assert log.append({"type": "x", "data": {}}) == 1
    assert [e.seq for e in read_session_log(log_path).events] == [1]


def test_garbled_middle_line_is_an_error_naming_it(log_path: Path) -> None:
    """Damage before the last line is corruption, not a crash artefact."""
    write_three(log_path)
    lines = log_path.read_bytes().splitlines(keepends=True)
    lines[1] = b'{"seq":2,"type":"note","data":{\n'
    log_path.write_bytes(b"".join(lines))
    with pytest.raises(SessionLogError) as info:
        read_session_log(log_path)
    assert info.value.line == 2
    assert "line 2: is not valid JSON" in str(info.value)


def test_reopening_a_log_garbled_before_its_last_line_is_an_error(log_path: Path) -> None:
    """The writer refuses to append after corruption rather than hide it behind new events."""
    write_three(log_path)
    lines = log_path.read_bytes().splitlines(keepends=True)
    lines[1] = b"not json\n"
    lines[2] = b"also not json\n"
    log_path.write_bytes(b"".join(lines))
    with pytest.raises(SessionLogError) as info:
        SessionLog(log_path)
    assert info.value.line == 3  # a whole line is no torn write


@pytest.mark.parametrize(
    "content",
    [
        b'{"id":"a","name":"calc","arguments":{}}\n',  # a batch file given as --session
        b"my notes\n",
        b'{"important":"config"}',  # one line, no newline, but no event's start either
        GZIPPED_NOTES,  # binary, one "line" with no newline
        b'\xff\xfe{"id":"a"}\n',  # a UTF-16 file: one line, not UTF-8
        b"PK\x03\x04\x14\x00\x00\x00",  # a zip header: NUL bytes, but no event's start before them
    ],
    ids=["batch", "notes", "config", "gzip", "utf16", "zip"],
)
def test_a_file_that_is_not_a_session_log_is_refused_and_left_alone(log_path: Path, content: bytes) -> None:
    log_path.write_bytes(content)
    with pytest.raises(SessionLogError, match="not a session log line") as info:
        SessionLog(log_path)
    assert info.value.line == 1
    assert "has no newline" not in str(info.value)  # what is in the line, not what a torn write would lack
    assert log_path.read_bytes() == content
    with pytest.raises(SessionLogError, match="not a session log line") as info:
        read_session_log(log_path)  # what the grants file and the ledger read first
    assert info.value.line == 1
    assert "has no newline" not in str(info.value)


def test_a_binary_file_is_refused_for_what_is_in_it(log_path: Path) -> None:
    log_path.write_bytes(GZIPPED_NOTES)
    with pytest.raises(SessionLogError, match=r"line 1: is not UTF-8: .*: this is not a session log line"):
        SessionLog(log_path)


def test_a_binary_file_of_several_lines_is_refused_and_left_alone(log_path: Path) -> None:
    content = b"\x1f\x8b\x08\x00\n\xcb\xcc-\n\xc4\x9d\xee"
    log_path.write_bytes(content)
    with pytest.raises(SessionLogError, match="not a session log line"):
        SessionLog(log_path)
    with pytest.raises(SessionLogError, match="not a session log line") as info:
        read_session_log(log_path)
    assert info.value.line == 1
    assert log_path.read_bytes() == content


@pytest.mark.parametrize(
    "tail",
    [b"\xff\xfe\x00garbage", b"\xc3(\n", b"\x00\x00\x00\n"],
    ids=["binary", "bad-utf8-line", "zeros-newline"],
)
def test_garbage_after_committed_events_is_still_cut_off_as_torn(log_path: Path, tail: bytes) -> None:
    """After a valid event, bytes that are not text are what a crash left where the file grew."""
    write_three(log_path)
    clean = log_path.read_bytes()
    with open(log_path, "ab") as file:
        file.write(tail)
    assert read_session_log(log_path).torn is not None
    with SessionLog(log_path) as log:
        assert log.torn is not None and log.torn.line == 4
        assert log_path.read_bytes() == clean
        assert log.append({"type": "after", "data": {}}) == 4


@pytest.mark.parametrize(
    "content",
    [b"\x00" * 4096, b'{"se' + b"\x00" * 100, b'{"seq":1,"type":"x","da' + b"\x00" * 10, b"   "],
    ids=["zeros", "start-then-zeros", "line-then-zeros", "blank"],
)
def test_a_log_whose_first_write_a_crash_damaged_starts_over(log_path: Path, content: bytes) -> None:
    """A crash in the first write can leave zero fill or the start of the first line, and nothing committed."""
    log_path.write_bytes(content)
    read = read_session_log(log_path)
    assert read.events == () and read.torn is not None
    with SessionLog(log_path) as log:
        assert log.torn is not None and log.torn.line == 1
        assert log.append({"type": "x", "data": {}}) == 1
    assert [e.seq for e in read_session_log(log_path).events] == [1]


def test_readable_text_after_committed_events_is_refused_and_left_alone(log_path: Path) -> None:
    """A note someone appended to a log is not crash damage: it is kept, and the log is refused."""
    write_three(log_path)
    with open(log_path, "ab") as file:
        file.write(b"remember: call 2 was a test\n")
    content = log_path.read_bytes()
    with pytest.raises(SessionLogError, match="not a session log line") as info:
        SessionLog(log_path)
    assert info.value.line == 4
    assert log_path.read_bytes() == content


def test_a_second_writer_of_one_log_is_refused(log_path: Path) -> None:
    with SessionLog(log_path) as first:
        first.append({"type": "a", "data": {}})
        with pytest.raises(SessionLogError, match="another writer has this session log open"):
            SessionLog(log_path)
        first.append({"type": "b", "data": {}})
    with SessionLog(log_path) as again:  # closed: free again
        assert again.next_seq == 3


def test_a_new_log_is_readable_by_its_owner_only(log_path: Path) -> None:
    old = os.umask(0o022)
    try:
        SessionLog(log_path).close()
    finally:
        os.umask(old)
    assert log_path.stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b'{"seq":2,"type":"note","data":{},"extra":1}\n', "is not an event object"),
        (b'{"seq":true,"type":"note","data":{}}\n', "invalid seq"),
        (b'{"seq":2,"type":7,"data":{}}\n', "invalid type"),
        (b'{"seq":2,"type":"note","data":[]}\n', "data that is not an object"),
        (b'{"seq":2,"type":"note","data":{"x":NaN}}\n', "NaN is not a JSON number"),
        (b'{"seq":2,"type":"note","data":{"x":1e400}}\n', "not lossless JSON"),
    ],
)
def test_lines_that_are_json_but_not_events_are_damage(log_path: Path, line: bytes, reason: str) -> None:
    """Only exact {seq, type, data} objects with lossless JSON data count as events."""
    write_three(log_path)
    lines = log_path.read_bytes().splitlines(keepends=True)
    lines[1] = line
    log_path.write_bytes(b"".join(lines))
    with pytest.raises(SessionLogError, match=reason):
        read_session_log(log_path)


DEEP_JSON = b"[" * 100_000 + b"1" + b"]" * 100_000


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        (b'{"seq":' + DEEP_JSON + b',"type":"note","data":{}}\n', "line 2: has an invalid seq [[[[[[[...]]]]]]]"),
        (b'{"seq":2,"type":' + DEEP_JSON + b',"data":{}}\n', "line 2: has an invalid type [[[[[[[...]]]]]]]"),
    ],
    ids=["deep-seq", "deep-type"],
)
def test_a_damaged_field_too_deep_to_print_is_still_named_with_its_line(
    log_path: Path, line: bytes, reason: str
) -> None:
    write_three(log_path)
    lines = log_path.read_bytes().splitlines(keepends=True)
    lines[1] = line
    log_path.write_bytes(b"".join(lines))
    with pytest.raises(SessionLogError) as caught:
        read_session_log(log_path)
    assert str(log_path) in str(caught.value)
    assert reason in str(caught.value)


def test_a_gap_in_seq_is_an_error(log_path: Path) -> None:
    """Numbering runs 1, 2, 3 without gaps; a gap means lines were lost or spliced."""
    write_three(log_path)
    lines = log_path.read_bytes().splitlines(keepends=True)
    del lines[1]
    log_path.write_bytes(b"".join(lines))
    with pytest.raises(SessionLogError, match="line 2: seq 3 where 2 was expected"):
        read_session_log(log_path)


# --- deep nesting -------------------------------------------------------------------------


def test_deeply_nested_arguments_are_logged_and_read_back(log_path: Path) -> None:
    """5 000-deep arguments (beyond json's recursion limit) are written and read back intact."""
    with SessionLog(log_path) as log:
        log.append_call("c", "deep_args", {"nested": nested(5000)})
        log.append({"type": "after", "data": {}})
    read = read_session_log(log_path)
    assert read.torn is None
    assert depth_of(read.events[0].data["arguments"]["nested"]) == (5000, "leaf")  # type: ignore[index]
    assert read.events[1].seq == 2


def test_deep_json_written_by_others_does_not_crash_the_reader(log_path: Path) -> None:
    """A 20 000-deep line (twenty times json's limit) parses without RecursionError."""
    depth = 20_000
    body = "[" * depth + "1" + "]" * depth
    log_path.write_text('{"seq":1,"type":"x","data":{"v":' + body + "}}\n", encoding="utf-8")
    (event,) = read_session_log(log_path).events
    assert depth_of(event.data["v"]) == (depth, 1)


@pytest.mark.parametrize("newline", [b"", b"\n"])
def test_deep_torn_last_line_is_reported_not_raised(log_path: Path, newline: bytes) -> None:
    """An unterminated deep line at the end is a torn tail, not a RecursionError."""
    write_three(log_path)
    with open(log_path, "ab") as file:
        file.write(b'{"seq":4,"type":"x","data":{"v":' + b"[" * 50_000 + newline)
    read = read_session_log(log_path)
    assert [e.seq for e in read.events] == [1, 2, 3]
    assert read.torn is not None
    assert read.torn.line == 4


def test_deep_garbled_middle_line_is_a_session_log_error(log_path: Path) -> None:
    """Deep garbage in the middle is reported as corruption of that line."""
    write_three(log_path)
    lines = log_path.read_bytes().splitlines(keepends=True)
    lines[0] = b'{"seq":1,"type":"x","data":{"v":' + b"[" * 50_000 + b"}}\n"
    log_path.write_bytes(b"".join(lines))
    with pytest.raises(SessionLogError) as info:
        read_session_log(log_path)
    assert info.value.line == 1


def test_reverse_scan_finds_the_tail_across_chunk_boundaries(log_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reopening reads the file backwards in chunks; tiny chunks must find the same last line."""
    monkeypatch.setattr(session_log_module, "_CHUNK", 7)
    write_three(log_path)
    with open(log_path, "ab") as file:
        file.write(b'{"seq":4,"type":"long-torn-line-spanning-chunks"')
    with SessionLog(log_path) as log:
        assert log.torn is not None
        assert log.torn.line == 4
        assert log.next_seq == 4


# --- fsync policies -----------------------------------------------------------------------


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record every os.fsync as "file" or "dir" (and still perform it)."""
    calls: list[str] = []
    real = os.fsync

    def recording(fd: int) -> None:
        calls.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real(fd)

    monkeypatch.setattr(os, "fsync", recording)
    return calls


@pytest.mark.parametrize(
    ("policy", "expected"),
    [("never", []), ("always", ["file", "file", "file"]), ("close", ["file"])],
)
def test_fsync_policy_on_an_existing_log(log_path: Path, fsyncs: list[str], policy: Any, expected: list[str]) -> None:
    """never: no fsync; always: one per line; close: one when closed."""
    log_path.touch()
    with SessionLog(log_path, fsync=policy) as log:
        for n in range(3):
            log.append({"type": "n", "data": {"n": n}})
        during = list(fsyncs)
    assert fsyncs == expected
    assert during == ([] if policy == "close" else expected)


@pytest.mark.parametrize(
    ("policy", "expected"), [("never", []), ("always", ["file", "dir", "file"]), ("close", ["file", "dir"])]
)
def test_a_new_log_also_syncs_its_directory(
    log_path: Path, fsyncs: list[str], policy: Any, expected: list[str]
) -> None:
    """Creating the file is only durable once the directory entry is synced, once."""
    with SessionLog(log_path, fsync=policy) as log:
        log.append({"type": "n", "data": {}})
    assert fsyncs == expected


@pytest.mark.parametrize(("failure", "broken"), [(KeyboardInterrupt(), False), (OSError(5, "EIO"), True)])
def test_a_sync_interrupted_after_a_whole_line_leaves_the_log_usable_but_a_failed_one_does_not(
    log_path: Path, monkeypatch: pytest.MonkeyPatch, failure: BaseException, broken: bool
) -> None:
    """Ctrl-C during the fsync of ``always`` found the line whole, yet refused every later write."""
    real = os.fsync
    failures = [failure]

    def failing_once(fd: int) -> None:
        if failures:
            raise failures.pop()
        real(fd)

    log_path.touch()
    monkeypatch.setattr(os, "fsync", failing_once)
    with SessionLog(log_path, fsync="always") as log:
        with pytest.raises(type(failure)):
            log.append({"type": "n", "data": {"n": 1}})
        if broken:
            with pytest.raises(SessionLogError, match="an earlier write failed"):
                log.append({"type": "n", "data": {"n": 2}})
        else:
            log.append({"type": "n", "data": {"n": 2}})
    events = read_session_log(log_path).events
    assert [(e.seq, e.data["n"]) for e in events] == ([(1, 1)] if broken else [(1, 1), (2, 2)])


def test_close_policy_without_writes_does_not_sync(log_path: Path, fsyncs: list[str]) -> None:
    """Opening and closing an intact log changes nothing, so there is nothing to sync."""
    write_three(log_path, fsync="never")
    with SessionLog(log_path, fsync="close"):
        pass
    assert fsyncs == []


def test_read_events_are_json_equal_to_what_was_logged(log_path: Path) -> None:
    """The file is standard JSON lines: any JSON reader agrees with read_session_log."""
    write_three(log_path)
    parsed = [json.loads(line) for line in log_path.read_text(encoding="utf-8").splitlines()]
    read = read_session_log(log_path)
    assert parsed == [{"seq": e.seq, "type": e.type, "data": e.data} for e in read.events]


def test_a_later_read_picks_up_after_an_earlier_one(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    with SessionLog(path) as log:
        log.append_call("c1", "t", {})
        log.append_call("c2", "t", {})
    first = read_session_log(path)
    assert first.end == path.stat().st_size
    nothing_new = read_session_log(path, after=first)
    assert nothing_new.events == () and nothing_new.end == first.end
    with SessionLog(path) as log:
        log.append_call("c3", "t", {})
    with path.open("ab") as file:
        file.write(b'{"seq": 4, "type": "tool/call", "da')  # a write in progress
    later = read_session_log(path, after=first)
    assert [(event.seq, event.data["callId"]) for event in later.events] == [(3, "c3")]
    assert later.torn is not None and later.end == first.end + len(path.read_bytes()) - first.end - later.torn.size
    assert read_session_log(path).events[:3] == first.events + later.events


def test_a_reader_following_a_log_keeps_its_place_across_empty_polls(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    with SessionLog(path) as log:
        log.append_call("c1", "t", {})
    read = read_session_log(path)
    for _ in range(3):
        read = read_session_log(path, after=read)  # nothing new
        assert read.events == () and read.next_seq == 2
    with SessionLog(path) as log:
        log.append_call("c2", "t", {})
    read = read_session_log(path, after=read)
    assert [event.seq for event in read.events] == [2] and read.next_seq == 3


def test_a_later_read_refuses_a_file_that_shrank_or_skipped_a_seq(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    with SessionLog(path) as log:
        log.append_call("c1", "t", {})
    first = read_session_log(path)
    path.write_bytes(b"")
    with pytest.raises(SessionLogError, match="shorter than the"):
        read_session_log(path, after=first)
    with SessionLog(path) as log:
        log.append_call("c1", "t", {})
    first = read_session_log(path)
    with path.open("ab") as file:
        file.write(b'{"seq": 5, "type": "tool/call", "data": {"callId": "c5", "name": "t", "arguments": {}}}\n')
        file.write(b'{"seq": 6, "type": "tool/call", "data": {"callId": "c6", "name": "t", "arguments": {}}}\n')
    with pytest.raises(SessionLogError, match="seq 5 where 2 was expected"):
        read_session_log(path, after=first)


# -- targets that are not regular files ----------------------------------------------------------


@pytest.mark.parametrize("target", ["device", "directory"])
def test_a_target_that_is_not_a_regular_file_is_refused(tmp_path: Path, target: str) -> None:
    path = Path(os.devnull) if target == "device" else tmp_path
    with pytest.raises(SessionLogError, match="not a regular file") as refused:
        SessionLog(path)
    assert refused.value.path == os.fspath(path)
    assert str(refused.value).startswith(f"{path}: not a regular file")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
async def test_a_fifo_with_no_reader_is_refused_instead_of_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "log.fifo"
    os.mkfifo(fifo)
    # Real time: the open this guards against blocks in the OS, out of reach of a mock clock.
    with trio.fail_after(10):
        with pytest.raises(SessionLogError, match="not a regular file"):
            await trio.to_thread.run_sync(SessionLog, fifo, abandon_on_cancel=True)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
async def test_reading_a_fifo_with_no_writer_is_refused_instead_of_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "log.fifo"
    os.mkfifo(fifo)
    # Real time: the open this guards against blocks in the OS, out of reach of a mock clock.
    with trio.fail_after(10):
        with pytest.raises(SessionLogError) as refused:
            await trio.to_thread.run_sync(read_session_log, fifo, abandon_on_cancel=True)
    assert refused.value.path == os.fspath(fifo)
    assert str(refused.value) == f"{fifo}: not a regular file but a FIFO (named pipe); a session log must be one"


@pytest.mark.parametrize("target", ["device", "directory"])
def test_reading_a_target_that_is_not_a_regular_file_names_what_it_is(tmp_path: Path, target: str) -> None:
    path, kind = (Path(os.devnull), "a character device") if target == "device" else (tmp_path, "a directory")
    with pytest.raises(SessionLogError) as refused:
        read_session_log(path)
    assert str(refused.value) == f"{path}: not a regular file but {kind}; a session log must be one"


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
def test_reading_checks_the_opened_file_not_only_the_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fifo = tmp_path / "log.fifo"
    os.mkfifo(fifo)
    # Swapped in after the check by path: the non-blocking open returns, and the opened file is refused.
    monkeypatch.setattr(session_log_module, "refuse_non_regular_target", lambda path: None)
    with pytest.raises(SessionLogError, match="not a regular file but a FIFO"):
        read_session_log(fifo)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
def test_a_fifo_with_a_reader_is_refused_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fifo = tmp_path / "log.fifo"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)
    try:
        with pytest.raises(SessionLogError, match="not a regular file"):
            SessionLog(fifo)
        # Swapped in after the check by path: the opened file itself is checked too.
        monkeypatch.setattr(session_log_module, "refuse_non_regular_target", lambda path: None)
        with pytest.raises(SessionLogError, match="not a regular file"):
            SessionLog(fifo)
    finally:
        os.close(reader)


# --- threads ------------------------------------------------------------------------------


def test_events_appended_from_many_threads_stay_in_seq_order(log_path: Path) -> None:
    """Orphaned worker threads announce their finish from their own threads: the log must take them all."""
    threads, per_thread = 32, 50
    start = threading.Barrier(threads)
    seqs: list[int] = []

    def append_events(writer: int) -> None:
        start.wait()
        for n in range(per_thread):
            seqs.append(log.append({"type": "note", "data": {"writer": writer, "n": n}}))

    with SessionLog(log_path, fsync="never") as log:
        workers = [threading.Thread(target=append_events, args=(w,)) for w in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        assert log.next_seq == threads * per_thread + 1
    events = read_session_log(log_path).events
    assert [e.seq for e in events] == list(range(1, threads * per_thread + 1))
    assert sorted(seqs) == list(range(1, threads * per_thread + 1))
    for writer in range(threads):
        assert [e.data["n"] for e in events if e.data["writer"] == writer] == list(range(per_thread))


def test_c1_controls_and_bidi_overrides_are_escaped_in_the_file(tmp_path: Path) -> None:
    """A session log is read on terminals too: a model's CSI or RLO went into it raw (s20 logs audit)."""
    hostile = "\u009b2J\u009d0;title\u0007 \u202eevil Grüße"
    with SessionLog(tmp_path / "s.jsonl") as log:
        log.append({"type": "note", "data": {"arguments": {"x": hostile}}})
    raw = (tmp_path / "s.jsonl").read_bytes()
    assert "\u009b".encode() not in raw and "\u202e".encode() not in raw
    assert "Grüße".encode() in raw
    (event,) = read_session_log(tmp_path / "s.jsonl").events
    assert event.data["arguments"] == {"x": hostile}


def test_a_log_truncated_while_open_refuses_to_number_on(tmp_path: Path) -> None:
    """It wrote seq 3, 4 at offset 0: a file its own reader refused from the first line (s20 logs audit)."""
    path = tmp_path / "s.jsonl"
    log = SessionLog(path)
    log.append({"type": "note", "data": {"n": 1}})
    log.append({"type": "note", "data": {"n": 2}})
    os.truncate(path, 0)  # ": > log", logrotate's copytruncate
    with pytest.raises(SessionLogError, match="the file was truncated while open"):
        log.append({"type": "note", "data": {"n": 3}})
    with pytest.raises(SessionLogError, match="an earlier write failed"):
        log.append({"type": "note", "data": {"n": 4}})
    log.close()
    with SessionLog(path) as reopened:
        reopened.append({"type": "note", "data": {"n": 5}})
    assert [(event.seq, event.data) for event in read_session_log(path).events] == [(1, {"n": 5})]
