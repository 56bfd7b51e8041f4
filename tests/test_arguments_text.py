"""ArgumentsText: the model's JSON argument text, parsed by the runtime, with a message the model can act on."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio.testing

from dsh_core import (
    ArgumentsJsonError,
    ArgumentsText,
    CancelSignal,
    FrozenDict,
    SessionLog,
    SessionRecorder,
    ToolExecutionInput,
    ToolExecutionSuccess,
    define_tool,
    read_session_log,
    run_tool_calls,
)
from dsh_core.testing import Recorder, expect_failure, json_tool, make_input, make_runtime


def add_tool(**options: Any) -> Any:
    async def add(args: Any) -> int:
        return int(args["a"] + args["b"])

    return define_tool(
        name="add",
        description="adds",
        parameters={"a": {"type": "integer", "required": True}, "b": {"type": "integer", "required": True}},
        output={"type": "integer"},
        execute=add,
        **options,
    )



async def test_valid_text_is_parsed_and_validated_like_any_arguments() -> None:
    recorder = Recorder()
    runtime = make_runtime(add_tool(), plugins=[recorder])
    result = await runtime.execute(make_input("add", ArgumentsText('{"a": 2, "b": 40}')))
    assert isinstance(result, ToolExecutionSuccess) and result.value == 42
    [(execution, _)] = recorder.results
    assert isinstance(execution.arguments, FrozenDict)
    assert execution.arguments == {"a": 2, "b": 40}
    invalid = expect_failure(await runtime.execute(make_input("add", ArgumentsText('{"a": "2", "b": 40}'))))
    assert invalid.code == "INVALID_ARGS" and invalid.error.info is not None
    assert invalid.error.info.name == "ToolArgsError"


async def test_a_cut_off_text_says_so_and_asks_for_a_smaller_call() -> None:
    recorder = Recorder()
    runtime = make_runtime(json_tool("write", parameters={"content": {"type": "string"}}), plugins=[recorder])
    text = '{"content": "' + "x" * 100
    result = expect_failure(await runtime.execute(make_input("write", ArgumentsText(text))))
    assert result.code == "INVALID_ARGS"
    assert result.error.info is not None and result.error.info.name == "ArgumentsJsonError"
    assert result.error.message.startswith("arguments are not valid JSON: Unterminated string starting at (character 12 of 113)")
    assert "probably cut off at the output token limit" in result.error.message
    assert "send a smaller call" in result.error.message
    # The whole pipeline saw it: observers (audit, session logs) record the failure.
    [(execution, observed)] = recorder.results
    assert observed is result or observed.error == result.error
    assert execution.arguments is None


@pytest.mark.parametrize(
    ("text", "truncated"),
    [
        ('{"a": 1, "b": ', True),
        ('{"a": 1, "b": 2', True),
        ("[1, 2", True),
        ("[1, tr", True),
        ('{"a": n', True),
        ("[1.", True),
        ('{"a": 1.5e', True),
        ("[-", True),
        ('{"a', True),
        ("{", True),
        ('{"a": 1}}', False),
        ("not json", False),
        ('{"a": NaN}', False),
    ],
)
def test_only_a_text_that_ends_early_is_called_cut_off(text: str, truncated: bool) -> None:
    with pytest.raises(ArgumentsJsonError) as caught:
        ArgumentsText(text).decode()
    assert caught.value.code == "INVALID_ARGS"
    assert caught.value.message.startswith("arguments are not valid JSON")
    assert ("cut off" in caught.value.message) is truncated


@pytest.mark.parametrize("text", ["", "   ", "\n"])
def test_an_empty_text_means_no_arguments(text: str) -> None:
    assert ArgumentsText(text).decode() == {}


def test_deep_documents_parse_without_recursion_errors() -> None:
    depth = 20_000
    value = ArgumentsText('{"x": ' + "[" * depth + "]" * depth + "}").decode()
    assert isinstance(value, FrozenDict)
    inner = value["x"]
    for _ in range(depth - 1):
        inner = inner[0]
    assert inner == ()


@pytest.mark.parametrize("deep", [False, True], ids=["flat", "deeper-than-the-c-parser"])
@pytest.mark.parametrize("sign", ["", "-"])
def test_an_integer_too_long_to_convert_is_named_without_pythons_hint(deep: bool, sign: str) -> None:
    """It read "not valid JSON: ... use sys.set_int_max_str_digits() to increase the limit": no help to a model."""
    depth = 20_000 if deep else 1
    text = '{"x": ' + "[" * depth + sign + "9" * 5000 + "]" * depth + "}"
    with pytest.raises(ArgumentsJsonError) as refused:
        ArgumentsText(text).decode()
    assert str(refused.value) == "arguments hold an integer of 5000 digits, longer than the 4300 digits accepted"


def test_a_text_cut_off_after_a_long_integer_is_called_cut_off() -> None:
    """The digits limit stopped the parser first: a call cut at the token limit was told about the integer."""
    text = '{"a": ' + "9" * 5000 + ', "b": "cut'
    with pytest.raises(ArgumentsJsonError) as refused:
        ArgumentsText(text).decode()
    assert str(refused.value).startswith("arguments are not valid JSON: Unterminated string starting at")
    assert "cut off" in str(refused.value)


def test_the_text_is_parsed_once_and_equality_is_by_text() -> None:
    arguments = ArgumentsText('{"a": 1}')
    first = arguments.decode()
    assert arguments.decode() is first
    assert arguments == ArgumentsText('{"a": 1}')
    assert repr(arguments) == "ArgumentsText('{\"a\": 1}')"
    with pytest.raises(TypeError, match="takes the JSON text as a str"):
        ArgumentsText(b"{}")  # type: ignore[arg-type]


async def test_scheduling_classifies_the_parsed_arguments(autojump_clock: trio.testing.MockClock) -> None:
    starts: list[float] = []

    async def slow(args: Any) -> str:
        starts.append(trio.current_time())
        await trio.sleep(1)
        return args["path"]

    tool = json_tool(
        "read", slow, parameters={"path": {"type": "string", "required": True}}, is_concurrency_safe=lambda a: True
    )
    runtime = make_runtime(tool)
    calls = [make_input("read", ArgumentsText(f'{{"path": "{name}"}}')) for name in ("a", "b")]
    results = await run_tool_calls(runtime, calls)
    assert [result.value for result in results] == ["a", "b"]  # type: ignore[union-attr]
    assert starts == [0, 0]  # parallel-safe: the classifier saw real arguments, not the text


async def test_the_session_log_records_the_parsed_arguments_or_the_text(tmp_path: Path) -> None:
    log_path = tmp_path / "s.jsonl"
    runtime = make_runtime(add_tool())
    with SessionLog(log_path) as log:
        recorder = SessionRecorder(log, runtime)
        for text in ('{"a": 1, "b": 2}', '{"a": 1, "b'):
            recorder.record_call(make_input("add", ArgumentsText(text)))
    logged = [event.data["arguments"] for event in read_session_log(log_path).events]
    assert logged == [{"a": 1, "b": 2}, '{"a": 1, "b']  # what the model sent is never lost


@pytest.mark.parametrize("text", ['{"a": "\\u', '{"a": "\\u00', '{"a": "\\ud800\\udc00', '{"a": "\\ud800\\udc'])
def test_a_text_cut_inside_a_unicode_escape_is_cut_off(text: str) -> None:
    # Found by the fuzz target: json reports these as a bad escape, not as an unterminated string.
    with pytest.raises(ArgumentsJsonError, match="cut off"):
        ArgumentsText(text).decode()


def test_a_bad_escape_inside_the_text_is_not_called_cut_off() -> None:
    with pytest.raises(ArgumentsJsonError) as caught:
        ArgumentsText('{"a": "\\u12G4"}').decode()
    assert "cut off" not in caught.value.message


@pytest.mark.parametrize("after", ["\x0c", "\x0b", "\u2028", "\xa0", "\x00", " x", " t", "-"])
def test_text_after_a_complete_document_is_a_mistake_not_a_cut_off(after: str) -> None:
    # JSON whitespace is space, tab, LF and CR only: anything else after the document is extra text.
    with pytest.raises(ArgumentsJsonError) as caught:
        ArgumentsText('{"a": 1}' + after).decode()
    assert caught.value.message.startswith("arguments are not valid JSON: Extra data")
    assert "cut off" not in caught.value.message


def test_json_whitespace_after_the_document_is_fine() -> None:
    assert ArgumentsText('{"a": 1} \t\r\n').decode() == {"a": 1}


@pytest.mark.parametrize("text", ["\xa0", "\x1c", "\u2028", "\x0c", " \x0b "])
def test_only_json_whitespace_means_no_arguments(text: str) -> None:
    with pytest.raises(ArgumentsJsonError, match="arguments are not valid JSON: Expecting value"):
        ArgumentsText(text).decode()


@pytest.mark.parametrize("text", ["[" * 100_000, "[" * 100_000 + "1, ", '{"a": ' * 5_000 + "tr", "[" * 5_000 + "-"])
def test_a_deep_document_cut_off_says_so(text: str) -> None:
    # Too deep for the C decoder: the iterative parser's errors get the same reading.
    with pytest.raises(ArgumentsJsonError) as caught:
        ArgumentsText(text).decode()
    assert caught.value.message.startswith("arguments are not valid JSON")
    assert "probably cut off at the output token limit" in caught.value.message


@pytest.mark.parametrize("text", ["[" * 5_000 + "]" * 5_000 + " x", "[" * 5_000 + "1.]" + "]" * 4_999])
def test_a_deep_document_with_a_mistake_is_not_called_cut_off(text: str) -> None:
    with pytest.raises(ArgumentsJsonError) as caught:
        ArgumentsText(text).decode()
    assert caught.value.message.startswith("arguments are not valid JSON")
    assert "cut off" not in caught.value.message


@pytest.mark.parametrize(
    "text",
    [
        '{"a": 1, "a": 2}',
        '{"b": {"a": 1, "a": 1}}',
        '[{"x": [], "\\u0061": 0, "a": 1}]',  # an escaped spelling is the same key
        "[" * 5_000 + '{"a": 1, "a": 2}' + "]" * 5_000,  # deep: the iterative parser's path
        '{"a": ' * 3_000 + '{"k": 1, "z": "\\"k\\"", "k": 2}' + "}" * 3_000,
    ],
)
def test_a_repeated_key_is_refused(text: str) -> None:
    # Parsers disagree on which value wins: a policy reading the first could pass a call the tool
    # reads with the last. The model is told what to fix instead.
    with pytest.raises(ArgumentsJsonError) as caught:
        ArgumentsText(text).decode()
    assert caught.value.code == "INVALID_ARGS"
    assert "twice in one object; send each key once" in caught.value.message


@pytest.mark.parametrize(
    "text",
    [
        '{"a": {"a": 1}, "b": [{"a": 2}, {"a": 3}]}',
        "[" * 5_000 + '{"a": {"a": "a"}, "b": ["a", "a"], "c": "}"}' + "]" * 5_000,
    ],
)
def test_the_same_key_in_different_objects_is_fine(text: str) -> None:
    value = ArgumentsText(text).decode()
    while isinstance(value, tuple):
        value = value[0]
    assert isinstance(value, FrozenDict) and "a" in value


async def test_a_repeated_key_fails_the_call_invalid_args() -> None:
    runtime = make_runtime(add_tool())
    result = expect_failure(await runtime.execute(make_input("add", ArgumentsText('{"a": 1, "b": 2, "a": 40}'))))
    assert result.code == "INVALID_ARGS"
    assert result.error.message == 'arguments give the key "a" twice in one object; send each key once'


def test_a_str_as_arguments_warns_the_host_to_wrap_provider_text() -> None:
    """Passed as it came, the provider's text failed every call with a message that blamed the model."""
    with pytest.warns(UserWarning, match=r"arguments is a str.*pass ArgumentsText\(text\)"):
        ToolExecutionInput(call_id="c", name="t", arguments=' {"a": 1}', signal=CancelSignal())


def test_a_str_that_is_no_object_text_is_the_models_and_does_not_warn() -> None:
    # A Code Mode program's tools.x("hello") reaches the runtime so: nothing for the host to fix.
    ToolExecutionInput(call_id="c", name="t", arguments="hello", signal=CancelSignal())
