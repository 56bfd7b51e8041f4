"""The spill policy (dsh_plugins.spill): oversized text moves to a file; the value never changes."""

from __future__ import annotations

import logging
import os
import re
import tempfile
import threading
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from dsh_core import (
    Accept,
    Block,
    CancelSignal,
    ConfigError,
    ImageBlock,
    TextBlock,
    ToolExecution,
    ToolExecutionFailure,
    ToolExecutionResult,
    ToolExecutionSuccess,
    ToolExecutionToken,
    ToolRuntime,
    UserMessage,
    failure_result,
    hookimpl,
)
from dsh_core.code_mode import CodeRunResult
from dsh_core.testing import FakeCodeRuntime, Recorder, json_tool, make_input, make_runtime
from dsh_plugins import spill
from dsh_plugins.files import file_tools
from dsh_plugins.spill import SpillPolicy, SpillStore, bounded_replacement

Next = Callable[[], Awaitable[Any]]
CAP = 1000
BIG = "".join(f"line {n:05d} of a long result\n" for n in range(1, 501))  # 14 000 bytes, 500 lines


def text_tool(name: str, text: str) -> Any:
    async def body(args: Any) -> str:
        return text

    return json_tool(name, body, output={"type": "string"})


def with_spill(
    directory: Path, *tools: Any, cap: int = CAP, plugins: tuple[object, ...] = (), **settings: Any
) -> ToolRuntime:
    runtime = make_runtime(*tools, plugins=plugins)
    spill.dsh_setup(runtime, {"max_inline_bytes": cap, "directory": str(directory), **settings})
    return runtime


def only_text(result: ToolExecutionResult) -> str:
    (block,) = result.content
    assert isinstance(block, TextBlock)
    return block.text


# <call id>-<tool>-<six random hex digits>.txt
NAME = re.compile(r"[A-Za-z0-9._-]+-[0-9a-f]{6}\.txt")


def locator(text: str) -> Path:
    match = re.search(r"saved at (\S+);", text)
    assert match, text
    return Path(match.group(1))


# --- the model-facing copy ---------------------------------------------------------------


async def test_oversized_text_is_spilled_with_a_locator_and_the_value_kept(tmp_path: Path) -> None:
    runtime = with_spill(tmp_path / "spill", text_tool("dump", BIG))
    result = await runtime.execute(make_input("dump", call_id="call-7"))
    assert isinstance(result, ToolExecutionSuccess) and result.value == BIG
    text = only_text(result)
    assert len(text.encode()) <= CAP
    path = locator(text)
    assert path.parent == tmp_path / "spill" and NAME.fullmatch(path.name)
    assert path.name.startswith("call-7-dump-") and path.read_text() == BIG
    assert "(500 lines, 14000 bytes)" in text
    assert text.startswith("line 00001") and text.endswith("long result\n")
    omitted = int(re.search(r"\[(\d+) of 14000 bytes omitted", text).group(1))  # type: ignore[union-attr]
    head, tail = text.partition("\n\n[")[0], text.rpartition("]\n\n")[2]
    assert omitted == 14000 - len(head.encode()) - len(tail.encode())


async def test_spill_files_are_private(tmp_path: Path) -> None:
    runtime = with_spill(tmp_path / "spill", text_tool("dump", BIG))
    path = locator(only_text(await runtime.execute(make_input("dump"))))
    assert path.stat().st_mode & 0o777 == 0o600 and (tmp_path / "spill").stat().st_mode & 0o777 == 0o700


async def test_content_within_the_cap_is_untouched(tmp_path: Path) -> None:
    runtime = with_spill(tmp_path / "spill", text_tool("small", "x" * CAP))
    assert only_text(await runtime.execute(make_input("small"))) == "x" * CAP
    assert not (tmp_path / "spill").exists()


@pytest.mark.parametrize(
    "content",
    [
        [ImageBlock("A" * 5000, "image/png")],
        [TextBlock("x" * 5000), ImageBlock("AAAA", "image/png")],
    ],
)
async def test_content_that_is_not_all_text_is_untouched(tmp_path: Path, content: list[Any]) -> None:
    tool = json_tool("pic", output={"type": "json"}, finalize_content=None)
    runtime = with_spill(tmp_path / "spill", tool, plugins=(ContentReplacer(content),))
    result = await runtime.execute(make_input("pic"))
    assert result.content == tuple(content)


async def test_a_nested_call_is_untouched_in_post_execute(tmp_path: Path) -> None:
    runtime = with_spill(tmp_path / "spill", text_tool("dump", BIG))
    result = await runtime.execute(make_input("dump", parent=ToolExecutionToken(), root_call_id="outer"))
    assert only_text(result) == BIG


class ContentReplacer:
    """An inner post-execute listener replacing the content (and adding a context)."""

    def __init__(self, content: list[Any]) -> None:
        self.content = content

    @hookimpl
    async def dsh_post_execute(self, execution: ToolExecution, result: Any, next: Next) -> Any:
        await next()
        return Accept(content=self.content, additional_contexts=[UserMessage([TextBlock("note")], source="inner")])


class ValueReplacer:
    @hookimpl
    async def dsh_post_execute(self, execution: ToolExecution, result: Any, next: Next) -> Any:
        await next()
        return Accept(value="v" * 5000)


class Blocker:
    @hookimpl
    async def dsh_post_execute(self, execution: ToolExecution, result: Any, next: Next) -> Any:
        await next()
        return Block(feedback=[TextBlock("no " * 2000)])


async def test_an_inner_listeners_content_is_bounded_and_its_contexts_kept(tmp_path: Path) -> None:
    runtime = with_spill(tmp_path / "spill", text_tool("t", "small"), plugins=(ContentReplacer([TextBlock(BIG)]),))
    result = await runtime.execute(make_input("t"))
    assert isinstance(result, ToolExecutionSuccess) and result.value == "small"
    assert locator(only_text(result)).read_text() == BIG
    assert [m.source for m in result.additional_contexts] == ["inner"]


@pytest.mark.parametrize(("listener", "expected"), [(ValueReplacer(), "v" * 5000), (Blocker(), "no " * 2000)])
async def test_value_replacements_and_blocks_pass_through(tmp_path: Path, listener: object, expected: str) -> None:
    runtime = with_spill(tmp_path / "spill", text_tool("t", "small"), plugins=(listener,))
    assert only_text(await runtime.execute(make_input("t"))) == expected


async def test_a_large_failure_message_is_bounded_too(tmp_path: Path) -> None:
    async def body(args: Any) -> str:
        raise ValueError(BIG)

    runtime = with_spill(tmp_path / "spill", json_tool("boom", body))
    result = await runtime.execute(make_input("boom"))
    assert isinstance(result, ToolExecutionFailure) and result.error.message == BIG
    assert len(only_text(result).encode()) <= CAP and locator(only_text(result)).read_text() == f"Error: {BIG}"


async def test_multiple_text_blocks_are_joined_by_newlines(tmp_path: Path) -> None:
    blocks = [TextBlock("a" * 600), TextBlock("b" * 600)]
    runtime = with_spill(tmp_path / "spill", text_tool("t", "small"), plugins=(ContentReplacer(blocks),))
    assert locator(only_text(await runtime.execute(make_input("t")))).read_text() == "a" * 600 + "\n" + "b" * 600


async def test_lone_surrogates_are_saved_as_replacement_characters(tmp_path: Path) -> None:
    # JSON allows "\ud800": the file is valid UTF-8 all the same, as the TypeScript original writes it.
    text = "x" * 1500 + "lone \ud800 and \udfff, a split pair \ud83d\ude00.\n"
    runtime = with_spill(tmp_path / "spill", text_tool("dump", text))
    notice = only_text(await runtime.execute(make_input("dump")))
    path = locator(notice)
    saved = path.read_bytes().decode("utf-8")  # strict
    assert saved == "x" * 1500 + "lone \ufffd and \ufffd, a split pair \U0001f600.\n"
    assert f"(1 line, {path.stat().st_size} bytes)" in notice
    assert notice.endswith("a split pair \U0001f600.\n")


# --- fallbacks ---------------------------------------------------------------------------


async def test_a_save_failure_keeps_the_original_and_warns(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    runtime = with_spill(blocker / "spill", text_tool("dump", BIG))
    with caplog.at_level(logging.WARNING, logger="dsh_plugins.spill"):
        result = await runtime.execute(make_input("dump"))
    assert isinstance(result, ToolExecutionSuccess) and only_text(result) == BIG
    assert "cannot save the result of dump" in caplog.text and "keeping the inline content" in caplog.text


async def test_any_failure_of_the_store_keeps_the_original(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    class BrokenStore(spill.SpillStore):
        def save(self, call_id: str, tool: str, text: str) -> str:
            raise UnicodeEncodeError("utf-8", text, 0, 1, "surrogates not allowed")

    runtime = make_runtime(text_tool("dump", BIG))
    runtime.plugins.register(SpillPolicy(CAP, BrokenStore(str(tmp_path))))
    with caplog.at_level(logging.WARNING, logger="dsh_plugins.spill"):
        result = await runtime.execute(make_input("dump"))
    assert isinstance(result, ToolExecutionSuccess) and only_text(result) == BIG
    assert "cannot save the result of dump" in caplog.text


async def test_a_one_line_output_says_line(tmp_path: Path) -> None:
    runtime = with_spill(tmp_path / "spill", text_tool("dump", "z" * 5000))
    assert "(1 line, 5000 bytes)" in only_text(await runtime.execute(make_input("dump")))


async def test_a_cap_too_small_for_the_notice_keeps_the_original(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    runtime = with_spill(tmp_path / "spill", text_tool("dump", BIG), cap=40)
    with caplog.at_level(logging.WARNING, logger="dsh_plugins.spill"):
        assert only_text(await runtime.execute(make_input("dump"))) == BIG
    assert "exceeds max_inline_bytes=40" in caplog.text
    assert os.listdir(tmp_path / "spill") == []  # no orphan left behind


async def test_an_earlier_spill_is_never_overwritten(tmp_path: Path) -> None:
    runtime = with_spill(tmp_path / "spill", text_tool("dump", BIG))
    first = locator(only_text(await runtime.execute(make_input("dump", call_id="c1"))))
    second = locator(only_text(await runtime.execute(make_input("dump", call_id="c1"))))
    assert first != second and first.read_text() == second.read_text() == BIG
    assert all(re.fullmatch(r"c1-dump-[0-9a-f]{6}\.txt", path.name) for path in (first, second))


def test_file_names_are_made_safe(tmp_path: Path) -> None:
    path = SpillStore(str(tmp_path)).save("../a:b/c", "we ird", "x")
    assert os.path.dirname(path) == str(tmp_path)
    assert re.fullmatch(r"_a_b_c-we_ird-[0-9a-f]{6}\.txt", os.path.basename(path))


def fixed_random_parts(monkeypatch: pytest.MonkeyPatch, *parts: str) -> list[str]:
    """Make the random part of spill names come from ``parts`` (the last one repeats); returns those handed out."""
    handed: list[str] = []

    def token_hex(nbytes: int) -> str:
        assert nbytes == 3
        handed.append(parts[min(len(handed), len(parts) - 1)])
        return handed[-1]

    monkeypatch.setattr(spill.secrets, "token_hex", token_hex)
    return handed


def test_a_taken_name_is_retried_with_another_random_part(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "call_0-dump-aaaaaa.txt").write_text("earlier")
    handed = fixed_random_parts(monkeypatch, "aaaaaa", "bbbbbb")
    path = SpillStore(str(tmp_path)).save("call_0", "dump", "new")
    assert os.path.basename(path) == "call_0-dump-bbbbbb.txt" and handed == ["aaaaaa", "bbbbbb"]
    assert (tmp_path / "call_0-dump-aaaaaa.txt").read_text() == "earlier"


def test_call_ids_that_repeat_across_sessions_keep_spilling(tmp_path: Path) -> None:
    # Call ids that restart every session (call_0): the numbered names of the old scheme ran out at 999.
    store = SpillStore(str(tmp_path))
    paths = {store.save("call_0", "dump", f"text {n}") for n in range(1200)}
    assert len(paths) == 1200 and len(os.listdir(tmp_path)) == 1200


async def test_a_few_taken_names_in_a_row_give_up_and_keep_the_original(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "spill").mkdir(mode=0o700)
    (tmp_path / "spill" / "c1-dump-aaaaaa.txt").write_text("earlier")
    handed = fixed_random_parts(monkeypatch, "aaaaaa")
    runtime = with_spill(tmp_path / "spill", text_tool("dump", BIG))
    with caplog.at_level(logging.WARNING, logger="dsh_plugins.spill"):
        assert only_text(await runtime.execute(make_input("dump", call_id="c1"))) == BIG
    assert len(handed) == spill.NAME_ATTEMPTS and "no free spill file name" in caplog.text
    assert os.listdir(tmp_path / "spill") == ["c1-dump-aaaaaa.txt"]


def test_the_store_writes_valid_utf8_whoever_calls_it(tmp_path: Path) -> None:
    path = SpillStore(str(tmp_path)).save("c", "t", "a\ud800b")
    assert Path(path).read_bytes() == "a\ufffdb".encode()


def test_a_symlinked_spill_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(PermissionError):
        SpillStore(str(tmp_path / "link")).save("c", "t", "x")


# --- where spills go ------------------------------------------------------------------------


def isolated_temp_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Make ``tmp_path/tmp`` the system temp directory for this test (world-writable and sticky, like /tmp)."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    temp.chmod(0o1777)
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    return temp


def default_spill(*tools: Any) -> ToolRuntime:
    runtime = make_runtime(*tools)
    spill.dsh_setup(runtime, {"max_inline_bytes": CAP})
    return runtime


async def test_by_default_each_runtime_spills_into_a_private_directory_made_on_first_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    temp_dir = isolated_temp_dir(tmp_path, monkeypatch)
    first, second = default_spill(text_tool("dump", BIG)), default_spill(text_tool("dump", BIG))
    assert os.listdir(temp_dir) == []  # nothing is made before something spills
    mine = locator(only_text(await first.execute(make_input("dump", call_id="c1"))))
    theirs = locator(only_text(await second.execute(make_input("dump", call_id="c1"))))
    assert mine.parent != theirs.parent
    for path in (mine, theirs):
        assert path.parent.parent == temp_dir and path.parent.name.startswith("dsh-spill-")
        info = path.parent.stat()
        assert info.st_mode & 0o777 == 0o700 and info.st_uid == os.getuid()
    again = locator(only_text(await first.execute(make_input("dump", call_id="c2"))))
    assert again.parent == mine.parent  # one directory per runtime, not per spill
    assert sorted(os.listdir(temp_dir)) == sorted([mine.parent.name, theirs.parent.name])


async def test_a_directory_at_the_old_shared_name_does_not_stop_spilling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    temp_dir = isolated_temp_dir(tmp_path, monkeypatch)
    # Whoever made <tmp>/dsh-spill first (another user, say) turned spilling off for everyone else.
    squatted = temp_dir / "dsh-spill"
    squatted.mkdir()
    squatted.chmod(0o777)
    runtime = default_spill(text_tool("dump", BIG))
    text = only_text(await runtime.execute(make_input("dump")))
    assert len(text.encode()) <= CAP and locator(text).read_text() == BIG
    assert locator(text).parent != squatted and os.listdir(squatted) == []


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702])
async def test_a_configured_directory_others_may_write_to_is_refused(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, mode: int
) -> None:
    # The reader trusts what is in the directory: nobody else may put files there.
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    runtime = with_spill(shared, text_tool("dump", BIG))
    with caplog.at_level(logging.WARNING, logger="dsh_plugins.spill"):
        assert only_text(await runtime.execute(make_input("dump"))) == BIG
    assert f"is writable by other users (mode {mode:o})" in caplog.text and "keeping the inline content" in caplog.text
    assert os.listdir(shared) == []


async def test_a_configured_directory_of_the_user_alone_is_used_as_it_is(tmp_path: Path) -> None:
    readable = tmp_path / "readable"
    readable.mkdir()
    readable.chmod(0o755)  # others may read its listing, not add to it
    runtime = with_spill(readable, text_tool("dump", BIG))
    assert locator(only_text(await runtime.execute(make_input("dump")))).parent == readable
    assert readable.stat().st_mode & 0o777 == 0o755


# --- exempt tools --------------------------------------------------------------------------


async def test_read_file_answers_are_never_spilled_so_a_spill_file_can_be_read_back(tmp_path: Path) -> None:
    # Without the spill reader, the files plugin's read_file is how the model reads a spill back.
    runtime = with_spill(tmp_path / "spill", text_tool("dump", BIG), *file_tools(tmp_path), read_tool=False)
    path = locator(only_text(await runtime.execute(make_input("dump", call_id="c1"))))
    answer = await runtime.execute(make_input("read_file", {"path": f"spill/{path.name}"}, call_id="c2"))
    text = only_text(answer)
    assert "saved at" not in text and "line 00500 of a long result" in text and len(text.encode()) > CAP
    assert os.listdir(tmp_path / "spill") == [path.name]


async def test_exempt_tools_replaces_the_default(tmp_path: Path) -> None:
    runtime = with_spill(
        tmp_path / "spill", text_tool("dump", BIG), *file_tools(tmp_path), read_tool=False, exempt_tools=["dump"]
    )
    assert only_text(await runtime.execute(make_input("dump"))) == BIG
    (tmp_path / "big.txt").write_text(BIG)
    assert "saved at" in only_text(await runtime.execute(make_input("read_file", {"path": "big.txt"})))


async def test_exempt_tools_covers_the_post_execute_copy_not_the_dispatch_log(tmp_path: Path) -> None:
    runtime = with_spill(tmp_path / "spill", text_tool("dump", BIG), exempt_tools=["dump"])
    runtime.event_sink = lambda kind, data: None
    policy = runtime.plugins.get_plugin("spill-policy")
    dispatch: Any = SimpleNamespace(sub_call_id="outer:code:1", name="dump")

    async def next_() -> list[Any]:
        return [TextBlock(BIG)]

    (block,) = await policy.dsh_code_dispatch_log(dispatch, next_)
    assert locator(block.text).read_text() == BIG  # a log copy is not model context: it is bounded as before


# --- cancelled while saving ----------------------------------------------------------------


class GatedStore(SpillStore):
    """A store whose save (in its worker thread) waits until the test lets it go on: a slow disk."""

    def __init__(self, directory: Path) -> None:
        super().__init__(str(directory))
        self.entered = trio.Event()
        self.release = threading.Event()
        self.on_save: Callable[[], None] = lambda: None

    def save(self, call_id: str, tool: str, text: str) -> str:
        trio.from_thread.run_sync(self.entered.set)
        self.on_save()
        assert self.release.wait(10)
        return super().save(call_id, tool, text)


def files_in(directory: Path) -> list[str]:
    return sorted(os.listdir(directory)) if directory.exists() else []


async def cancel_while_saving(store: GatedStore, cancel: Callable[[], None]) -> None:
    await store.entered.wait()
    cancel()
    store.release.set()


async def test_a_call_cancelled_while_its_output_is_saved_leaves_no_spill_file(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    store = GatedStore(tmp_path / "spill")
    runtime = make_runtime(text_tool("dump", BIG))
    runtime.plugins.register(SpillPolicy(CAP, store))
    signal = CancelSignal()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(cancel_while_saving, store, lambda: signal.cancel("user pressed stop"))
        result = await runtime.execute(make_input("dump", signal=signal))
    assert isinstance(result, ToolExecutionFailure) and result.error.info is not None
    assert result.error.info.code == "ABORTED"
    assert store.release.is_set()  # the save did finish: its file was removed, not never written
    assert files_in(tmp_path / "spill") == []


async def test_a_signal_cancelled_during_the_save_without_interrupting_it_discards_the_file(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # No trio cancellation reaches the listener (nothing links the signal here), yet the
    # core turns a success under a fired signal into ABORTED: the notice would never be shown.
    store = GatedStore(tmp_path / "spill")
    policy = SpillPolicy(CAP, store)
    signal = CancelSignal()
    execution: Any = SimpleNamespace(signal=signal, parent=None, name="dump", call_id="c1")
    result = ToolExecutionSuccess(value=BIG, content=(TextBlock(BIG),))
    decision = Accept()

    async def next_() -> Accept:
        return decision

    store.on_save = lambda: signal.cancel("stop from the UI thread")
    store.release.set()
    assert await policy.dsh_post_execute(execution, result, next_) is decision
    assert signal.cancelled
    assert files_in(tmp_path / "spill") == []


async def test_a_failure_is_still_bounded_when_the_signal_fires_during_the_save(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # A failure stays a failure under a fired signal: its notice is shown, so its file stays.
    store = GatedStore(tmp_path / "spill")
    policy = SpillPolicy(CAP, store)
    signal = CancelSignal()
    execution: Any = SimpleNamespace(signal=signal, parent=None, name="dump", call_id="c1")
    failure = failure_result(BIG, "TOOL_ERROR")

    async def next_() -> Accept:
        return Accept()

    store.on_save = lambda: signal.cancel("stop from the UI thread")
    store.release.set()
    decision = await policy.dsh_post_execute(execution, failure, next_)
    assert isinstance(decision, Accept) and decision.content is not None
    (block,) = decision.content
    assert isinstance(block, TextBlock)
    assert locator(block.text).read_text() == f"Error: {BIG}"


async def test_a_dispatch_log_copy_cancelled_while_saved_leaves_no_spill_file(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    store = GatedStore(tmp_path / "spill")
    policy = SpillPolicy(CAP, store)
    dispatch: Any = SimpleNamespace(sub_call_id="outer:code:1", name="dump")

    async def next_() -> list[Any]:
        return [TextBlock(BIG)]

    async with trio.open_nursery() as nursery:
        with trio.CancelScope() as scope:
            nursery.start_soon(cancel_while_saving, store, scope.cancel)
            await policy.dsh_code_dispatch_log(dispatch, next_)
    assert scope.cancelled_caught
    assert files_in(tmp_path / "spill") == []


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("read_file", 'exempt_tools: expected an array, got "read_file"'),
        ([1], "exempt_tools\\[0\\]: expected a string"),
        ([""], "exempt_tools: lists tool names; an empty one exempts nothing"),
    ],
)
def test_an_invalid_exempt_tools_fails_the_load(value: object, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        spill.dsh_setup(make_runtime(), {"max_inline_bytes": 100, "exempt_tools": value})


def test_an_unknown_setting_fails_the_load() -> None:
    with pytest.raises(ConfigError, match="exempt_tool"):
        spill.dsh_setup(make_runtime(), {"max_inline_bytes": 100, "exempt_tool": ["x"]})


# --- the dispatch-log copy ---------------------------------------------------------------


async def test_a_large_sub_result_is_spilled_in_the_dispatch_log_only(tmp_path: Path) -> None:
    huge = "z" * 1_000_000
    received: list[Any] = []

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        received.append(await tools["big"]({}))
        return CodeRunResult(value=len(received[0]), has_value=True)

    events: list[tuple[str, Any]] = []
    recorder = Recorder()
    runtime = ToolRuntime(
        mode="code", code_runtime=FakeCodeRuntime(program), event_sink=lambda kind, data: events.append((kind, data))
    )
    runtime.register(text_tool("big", huge))
    runtime.plugins.register(recorder)
    spill.dsh_setup(runtime, {"max_inline_bytes": CAP, "directory": str(tmp_path / "spill")})

    outer = await runtime.execute(make_input("run_code", {"code": "...", "description": "d"}, call_id="outer"))
    assert isinstance(outer, ToolExecutionSuccess) and outer.value == {"logs": (), "result": 1_000_000}
    assert received == [huge]  # the program got the whole value
    nested = [result for execution, result in recorder.results if execution.parent is not None]
    assert [r.content for r in nested] == [(TextBlock(huge),)]  # post-execute leaves the sub-call alone

    (logged,) = [data["content"] for kind, data in events if kind == "tool/code-dispatch"]
    (block,) = logged
    assert isinstance(block, TextBlock) and len(block.text.encode()) <= CAP
    path = locator(block.text)
    assert path.name.startswith("outer_code_1-big-") and NAME.fullmatch(path.name) and path.read_text() == huge


async def test_without_an_event_sink_no_dispatch_log_copy_is_spilled(tmp_path: Path) -> None:
    # Nothing logs the copy: a file for it would be referenced by nothing.
    huge = "token=abc123\n" * 10_000
    received: list[Any] = []

    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        received.append(await tools["big"]({}))
        return CodeRunResult(value=len(received[-1]), has_value=True)

    runtime = ToolRuntime(mode="code", code_runtime=FakeCodeRuntime(program))
    runtime.register(text_tool("big", huge))
    spill.dsh_setup(runtime, {"max_inline_bytes": CAP, "directory": str(tmp_path / "spill"), "read_tool": False})
    outer = await runtime.execute(make_input("run_code", {"code": "...", "description": "d"}, call_id="outer"))
    assert isinstance(outer, ToolExecutionSuccess) and received == [huge]
    assert not (tmp_path / "spill").exists()

    # A sink the host attaches later (as `dsh-tools run --session-log` does) gets bounded copies.
    events: list[tuple[str, Any]] = []
    runtime.event_sink = lambda kind, data: events.append((kind, data))
    await runtime.execute(make_input("run_code", {"code": "...", "description": "d"}, call_id="again"))
    (logged,) = [data["content"] for kind, data in events if kind == "tool/code-dispatch"]
    assert locator(logged[0].text).read_text() == huge


async def test_small_or_non_text_dispatch_logs_are_untouched(tmp_path: Path) -> None:
    policy = SpillPolicy(CAP, SpillStore(str(tmp_path)))
    for content in ([TextBlock("short")], [ImageBlock("A" * 5000, "image/png")]):

        async def next_(content: list[Any] = content) -> list[Any]:
            return content

        dispatch: Any = SimpleNamespace(sub_call_id="outer:code:1", name="t")
        assert await policy.dsh_code_dispatch_log(dispatch, next_) == content
    assert os.listdir(tmp_path) == []


# --- configuration and the bound itself ----------------------------------------------------


def test_without_max_inline_bytes_nothing_is_registered(tmp_path: Path) -> None:
    runtime = make_runtime()
    before = set(runtime.plugins.get_plugins())
    spill.dsh_setup(runtime, {"directory": str(tmp_path)})
    # No policy: only what `check` asks for its warning that directory has no effect.
    [added] = set(runtime.plugins.get_plugins()) - before
    assert not isinstance(added, SpillPolicy)
    assert added.diagnostics() == [
        "[plugins.spill].directory has no effect: spilling is off: set max_inline_bytes to turn it on"
    ]


def test_the_policy_registers_under_its_name(tmp_path: Path) -> None:
    runtime = make_runtime()
    spill.dsh_setup(runtime, {"max_inline_bytes": 0})
    assert isinstance(runtime.plugins.get_plugin("spill-policy"), SpillPolicy)


@pytest.mark.parametrize(
    ("value", "fragment"),
    [(-1, "must be a non-negative integer \\(got -1\\)"), (1.5, "expected an integer"), (True, "expected an integer")],
)
def test_an_invalid_max_inline_bytes_fails_the_load(value: object, fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        spill.dsh_setup(make_runtime(), {"max_inline_bytes": value})


@pytest.mark.parametrize("directory", ["", "/tmp/a\x00b"], ids=["empty", "nul"])
def test_an_unusable_directory_fails_the_load(directory: str) -> None:
    with pytest.raises(ConfigError, match=r"\[plugins\.spill\]\.directory: must be a non-empty path without NUL characters"):
        spill.dsh_setup(make_runtime(), {"max_inline_bytes": 100, "directory": directory})


@given(text=st.text(min_size=1, max_size=400), cap=st.integers(min_value=0, max_value=600))
def test_a_replacement_never_exceeds_the_cap(text: str, cap: int) -> None:
    replacement = bounded_replacement(text, cap, "/tmp/x.txt")
    if replacement is not None:
        assert len(replacement.encode("utf-8", "surrogatepass")) <= cap
        assert "/tmp/x.txt" in replacement


def test_previews_cut_on_character_boundaries() -> None:
    text = "é" * 1000
    replacement = bounded_replacement(text, 400, "/x")
    assert replacement is not None
    head, _, rest = replacement.partition("\n\n")
    tail = rest.rpartition("\n\n")[2]
    assert set(head) == {"é"} and set(tail) == {"é"}


async def test_a_failure_whose_call_was_stopped_is_still_spilled(tmp_path: Path) -> None:
    """Post-execute runs under the fired signal: the save was cancelled at once and the whole log went inline."""
    signal = CancelSignal()

    async def build(args: Any) -> str:
        signal.cancel("user pressed stop")  # the stop arrives as the body fails
        raise RuntimeError("compile failed:\n" + "error: something\n" * 2000)

    directory = tmp_path / "spills"
    runtime = make_runtime(json_tool("build", build), plugins=[(spill, {"max_inline_bytes": 1000, "directory": str(directory)})])
    result = await runtime.execute(make_input("build", call_id="c1", signal=signal))
    assert isinstance(result, ToolExecutionFailure) and result.code == "TOOL_ERROR"
    assert sum(len(block.text.encode()) for block in result.content if isinstance(block, TextBlock)) <= 1000
    (saved,) = os.listdir(directory)
    assert "error: something\n" * 2000 in (directory / saved).read_text()


def test_a_private_spill_directory_removed_under_the_store_is_made_again() -> None:
    """A temp cleaner removed it on a long-running host: every later spill failed and went inline whole."""
    import shutil

    store = SpillStore()
    first = store.save("c1", "t", "one")
    gone = store.directory
    assert gone is not None
    shutil.rmtree(gone)
    try:
        second = store.save("c2", "t", "two")
        assert store.directory is not None and store.directory != gone
        assert os.path.dirname(second) == store.directory and Path(second).read_text() == "two"
        assert not os.path.exists(first)
    finally:
        if store.directory is not None:
            shutil.rmtree(store.directory, ignore_errors=True)
