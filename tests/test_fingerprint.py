"""Contract fingerprints: what they cover, their canonical text, and how logs and replay use them."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any

import pytest

from dsh_core import (
    Agent,
    SessionLog,
    SessionLogError,
    SessionRecorder,
    ToolDefinition,
    ToolOutput,
    ToolRuntime,
    contract_fingerprint,
    define_tool,
    read_session_log,
    replay,
)
from dsh_core._fingerprint import canonical_json
from dsh_core._logged_calls import logged_calls
from dsh_core._session_log import SessionEvent
from dsh_core.testing import json_tool, make_input, make_runtime


async def _add(args: Any) -> int:
    return int(args["a"] + args["b"])


def add_tool(
    *,
    name: str = "add",
    description: str = "add two integers",
    parameters: dict[str, Any] | None = None,
    output: Any = None,
    body: Any = _add,
) -> Any:
    return define_tool(
        name=name,
        description=description,
        parameters=parameters or {"a": {"type": "integer", "required": True}, "b": {"type": "integer", "required": True}},
        output=output or {"type": "integer"},
        execute=body,
    )


# -- what a fingerprint covers ---------------------------------------------------------


def test_a_fingerprint_is_the_sha256_of_the_canonical_schemas() -> None:
    tool = add_tool()
    text = json.dumps(
        {"output": dict(tool.output.schema), "parameters": json.loads(json.dumps(tool.parameters))},
        sort_keys=True,
        separators=(",", ":"),
    )
    assert contract_fingerprint(tool) == "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def test_name_description_and_body_are_not_part_of_the_contract() -> None:
    async def other(args: Any) -> int:
        return 0

    base = contract_fingerprint(add_tool())
    assert contract_fingerprint(add_tool(name="plus", description="something else", body=other)) == base


def test_parameter_and_output_changes_change_the_fingerprint() -> None:
    base = contract_fingerprint(add_tool())
    wider = add_tool(parameters={"a": {"type": "number", "required": True}, "b": {"type": "integer", "required": True}})
    optional_b = add_tool(parameters={"a": {"type": "integer", "required": True}, "b": {"type": "integer"}})
    new_output = add_tool(output={"type": "number"})
    rendered = add_tool(output=ToolOutput(schema={"type": "integer"}, render=lambda args, value: []))
    prints = {contract_fingerprint(tool) for tool in (wider, optional_b, new_output)}
    assert base not in prints and len(prints) == 3
    # A renderer decides how a value is shown, not which values are valid.
    assert contract_fingerprint(rendered) == base


def raw_tool(parameters: dict[str, Any]) -> ToolDefinition:
    return ToolDefinition(
        name="raw", description="", parameters=parameters, output=ToolOutput(schema={"type": "integer"}), execute=_add
    )


def test_a_fingerprint_is_computed_once_per_definition() -> None:
    tool = raw_tool({"type": "object"})
    first = contract_fingerprint(tool)
    assert contract_fingerprint(tool) is first
    assert "sha256" not in repr(tool)


def test_only_definitions_have_a_fingerprint() -> None:
    with pytest.raises(TypeError, match="takes a ToolDefinition, got dict"):
        contract_fingerprint({"name": "add"})  # type: ignore[arg-type]


# -- the canonical text -------------------------------------------------------------------


def test_canonical_text_sorts_keys_at_every_level_and_has_no_whitespace() -> None:
    assert canonical_json({"b": [1, {"d": None, "c": True}], "a": "x"}) == '{"a":"x","b":[1,{"c":true,"d":null}]}'
    assert canonical_json({"b": 1, "a": 2}) == canonical_json({"a": 2, "b": 1})


def test_canonical_text_escapes_to_ascii() -> None:
    assert canonical_json({"é": "\u202e\n"}) == '{"\\u00e9":"\\u202e\\n"}'


def test_integral_floats_read_as_the_integers_they_equal() -> None:
    assert canonical_json([1.0, -0.0, 2.5, 1e20, 10**30]) == "[1,0,2.5,100000000000000000000,1000000000000000000000000000000]"
    minimum_int = raw_tool({"type": "object", "properties": {"a": {"type": "integer", "minimum": 1}}})
    minimum_float = raw_tool({"type": "object", "properties": {"a": {"type": "integer", "minimum": 1.0}}})
    minimum_two = raw_tool({"type": "object", "properties": {"a": {"type": "integer", "minimum": 2}}})
    assert contract_fingerprint(minimum_int) == contract_fingerprint(minimum_float)
    assert contract_fingerprint(minimum_int) != contract_fingerprint(minimum_two)


def test_canonical_text_refuses_what_is_not_json() -> None:
    with pytest.raises(ValueError, match="nan is not a JSON number"):
        canonical_json([math.nan])
    with pytest.raises(ValueError, match="inf is not a JSON number"):
        canonical_json({"x": math.inf})
    with pytest.raises(TypeError, match="object key 1 is not a str"):
        canonical_json({1: "x"})
    with pytest.raises(TypeError, match="set is not a JSON value"):
        canonical_json([{1}])


def test_canonical_text_of_a_value_nested_20000_deep() -> None:
    depth = 20_000
    nested: Any = "leaf"
    for index in range(depth):
        nested = {"k": nested} if index % 2 else [nested]
    assert canonical_json(nested) == '{"k":[' * (depth // 2) + '"leaf"' + "]}" * (depth // 2)


def test_a_schema_nested_thousands_deep_has_a_fingerprint() -> None:
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(3_000):
        deep = {"type": "array", "items": deep}
    tool = add_tool(parameters={"a": deep})
    assert contract_fingerprint(tool).startswith("sha256:")
    deeper = add_tool(parameters={"a": {"type": "array", "items": deep}})
    assert contract_fingerprint(deeper) != contract_fingerprint(tool)


# -- the session log -----------------------------------------------------------------


def test_tool_call_events_carry_a_contract_only_when_given(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    with SessionLog(path) as log:
        log.append_call("c1", "add", {}, contract="sha256:abc")
        log.append_call("c2", "add", {})
        with pytest.raises(ValueError, match="contract must not be empty"):
            log.append_call("c3", "add", {}, contract="")
        with pytest.raises(TypeError, match="contract must be a str or None, got int"):
            log.append_call("c3", "add", {}, contract=1)  # type: ignore[arg-type]
    first, second = read_session_log(path).events
    assert first.data["contract"] == "sha256:abc"
    assert "contract" not in second.data
    assert [call.contract for call in logged_calls([first, second])] == ["sha256:abc", None]


@pytest.mark.parametrize("bad", [1, "", ["sha256:abc"]])
def test_a_malformed_logged_contract_names_its_seq(bad: object) -> None:
    event = SessionEvent(seq=7, type="tool/call", data={"callId": "c1", "name": "add", "agent": None, "contract": bad})
    with pytest.raises(SessionLogError, match="seq 7: malformed tool/call event: contract must be null or a non-empty str"):
        logged_calls([event])


async def test_the_recorder_logs_the_contract_of_the_tool_the_agent_sees(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    runtime = make_runtime(add_tool())
    agent = Agent("narrow")
    scoped = add_tool(output={"type": "number"})
    runtime.register(scoped, agent)
    with SessionLog(path) as log:
        recorder = SessionRecorder(log, runtime)
        for request in (
            make_input("add", {"a": 1, "b": 2}, call_id="global"),
            make_input("add", {"a": 1, "b": 2}, call_id="scoped", agent=agent),
            make_input("missing", call_id="unknown"),
        ):
            recorder.record_call(request)
            await runtime.execute(request)
        SessionRecorder(log).record_call(make_input("add", {"a": 1, "b": 2}, call_id="no-runtime"))
    contracts = {event.data["callId"]: event.data.get("contract") for event in read_session_log(path).events}
    assert contracts == {
        "global": contract_fingerprint(runtime.get("add")),  # type: ignore[arg-type]
        "scoped": contract_fingerprint(scoped),
        "unknown": None,
        "no-runtime": None,
    }
    assert contracts["global"] != contracts["scoped"]


def test_the_recorder_logs_the_contract_even_when_the_arguments_are_not_json(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    runtime = make_runtime(add_tool())
    with SessionLog(path) as log:
        SessionRecorder(log, runtime).record_call(make_input("add", {"a": {1, 2}}, call_id="c1"))
    (event,) = read_session_log(path).events
    assert event.data["arguments"] is None
    assert event.data["contract"] == contract_fingerprint(runtime.get("add"))  # type: ignore[arg-type]


# -- replay ------------------------------------------------------------------------------


async def _record(path: Path, runtime: ToolRuntime, *names: str) -> None:
    with SessionLog(path) as log:
        recorder = SessionRecorder(log, runtime)
        runtime.plugins.register(recorder)
        for index, name in enumerate(names):
            request = make_input(name, {"a": 1, "b": 2}, call_id=f"c{index}")
            recorder.record_call(request)
            await runtime.execute(request)


async def test_replay_says_whether_each_tool_changed_since_it_was_recorded(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    await _record(path, make_runtime(add_tool(), add_tool(name="sub"), add_tool(name="gone")), "add", "sub", "gone")
    with SessionLog(path) as log:  # a call recorded without a runtime has no fingerprint
        log.append_call("c9", "add", {"a": 1, "b": 2})

    same_add = add_tool(description="reworded")  # a new definition, the same contract
    new_sub = add_tool(name="sub", output={"type": "number"})
    later = make_runtime(same_add, new_sub)
    changed = {call.call_id: call.contract_changed for call in replay(read_session_log(path), later)}
    assert changed == {"c0": False, "c1": True, "c2": None, "c9": None}


async def test_replay_of_an_unchanged_session_reports_no_change(tmp_path: Path) -> None:
    path = tmp_path / "s.jsonl"
    runtime = make_runtime(json_tool("echo"))
    await _record(path, runtime, "echo", "echo")
    assert [call.contract_changed for call in replay(read_session_log(path), runtime)] == [False, False]


async def test_replay_compares_a_scoped_call_with_the_variant_its_agent_saw(tmp_path: Path) -> None:
    from dsh_core import Agent

    path = tmp_path / "s.jsonl"
    agent = Agent("a1")
    runtime = make_runtime(add_tool())
    runtime.register(add_tool(output={"type": "number"}), agent)  # a1's own variant of add
    with SessionLog(path) as log:
        recorder = SessionRecorder(log, runtime)
        runtime.plugins.register(recorder)
        for call_id, scope in (("global", None), ("scoped", agent)):
            request = make_input("add", {"a": 1, "b": 2}, call_id=call_id, agent=scope)
            recorder.record_call(request)
            await runtime.execute(request)
    changed = {call.call_id: call.contract_changed for call in replay(read_session_log(path), runtime)}
    assert changed == {"global": False, "scoped": False}  # nothing changed for either
