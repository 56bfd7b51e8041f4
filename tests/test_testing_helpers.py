"""``dsh_core.testing``: the helpers plugin authors use in their own tests."""

from __future__ import annotations

import types
from typing import Any

import pytest

from dsh_core import Deny, ToolExecution, ToolExecutionFailure, ToolExecutionSuccess, ToolRuntime, hookimpl
from dsh_core.code_mode import CodeRunResult
from dsh_core.testing import (
    FakeCodeRuntime,
    ToolCallError,
    expect_failure,
    expect_success,
    json_tool,
    make_input,
    make_runtime,
)


async def test_expect_success_and_failure_return_the_result_typed() -> None:
    async def boom(args: object) -> object:
        raise RuntimeError("broke")

    runtime = make_runtime(json_tool("ok"), json_tool("boom", boom))
    ok = await runtime.execute(make_input("ok", {"a": 1}))
    failed = await runtime.execute(make_input("boom"))
    assert isinstance(expect_success(ok), ToolExecutionSuccess) and expect_success(ok).value == {"a": 1}
    assert isinstance(expect_failure(failed), ToolExecutionFailure) and expect_failure(failed).code == "TOOL_ERROR"
    with pytest.raises(AssertionError, match="expected a failure, got ToolExecutionSuccess"):
        expect_failure(ok)
    with pytest.raises(AssertionError, match="expected a success, got ToolExecutionFailure"):
        expect_success(failed)
    with pytest.raises(AssertionError, match="expected a success, got None"):
        expect_success(None)


def _module_plugin(blocked: list[str]) -> types.ModuleType:
    """An entry-point-shaped plugin: a module whose dsh_setup registers a fresh policy."""

    class BlockNamed:
        def __init__(self, names: list[str]) -> None:
            self.names = names

        @hookimpl
        async def dsh_pre_execute(self, execution: ToolExecution, next: Any) -> Any:
            if execution.name in self.names:
                return Deny(reason="blocked by the module plugin")
            return await next()

    module = types.ModuleType("block_named")

    @hookimpl
    def dsh_setup(runtime: Any, config: dict[str, Any]) -> None:
        unknown = set(config) - {"names"}
        if unknown:
            raise ValueError(f"unknown keys {sorted(unknown)}")
        runtime.plugins.register(BlockNamed(config.get("names", blocked)))

    module.dsh_setup = dsh_setup  # type: ignore[attr-defined]
    return module


async def test_make_runtime_sets_up_a_plugin_that_has_its_own_dsh_setup() -> None:
    # Registering the module alone left its policy off: every call was allowed.
    runtime = make_runtime(json_tool("rm"), json_tool("ls"), plugins=[_module_plugin(["rm"])])
    assert expect_failure(await runtime.execute(make_input("rm"))).code == "DENIED"
    assert expect_success(await runtime.execute(make_input("ls"))).value == {}
    configured = make_runtime(json_tool("rm"), json_tool("ls"), plugins=[(_module_plugin(["rm"]), {"names": ["ls"]})])
    assert expect_success(await configured.execute(make_input("rm"))).value == {}
    assert expect_failure(await configured.execute(make_input("ls"))).code == "DENIED"


def test_make_runtime_raises_what_dsh_setup_raises_and_checks_the_table() -> None:
    with pytest.raises(ValueError, match=r"unknown keys \['nmes'\]"):
        make_runtime(plugins=[(_module_plugin([]), {"nmes": ["x"]})])
    with pytest.raises(TypeError, match="takes a mapping table, got list"):
        make_runtime(plugins=[(_module_plugin([]), ["x"])])  # type: ignore[list-item]


class _DenyAll:
    @hookimpl
    async def dsh_pre_execute(self, execution: ToolExecution, next: Any) -> Any:
        return Deny(reason="denied")


async def test_make_runtime_registers_a_mapping_of_plugins_under_their_names() -> None:
    # Registered from a list, an object is blamed under pluggy's numeric id.
    runtime = make_runtime(
        json_tool("rm"),
        json_tool("ls"),
        plugins={"deny-all": _DenyAll(), "block-named": (_module_plugin(["rm"]), {"names": ["ls"]})},
    )
    # In order; the module's dsh_setup registers its policy (unnamed) after it.
    assert [name for name, _ in runtime.plugins.list_name_plugin()][:2] == ["deny-all", "block-named"]
    denied = expect_failure(await runtime.execute(make_input("rm")))
    assert (denied.code, denied.error.info.plugin) == ("DENIED", "deny-all")
    runtime.plugins.unregister(name="deny-all")
    assert expect_success(await runtime.execute(make_input("rm"))).value == {}  # the table's names, not ["rm"]


def test_make_runtime_takes_only_str_names_in_a_mapping() -> None:
    with pytest.raises(TypeError, match="make_runtime: a plugins mapping is keyed by plugin name, got int"):
        make_runtime(plugins={1: _DenyAll()})  # type: ignore[dict-item]


def _code_mode(program: Any) -> ToolRuntime:
    async def refuse(args: Any) -> Any:
        raise RuntimeError(f"{args['path']} is not allowed")

    return make_runtime(json_tool("delete", refuse), mode="code", code_runtime=FakeCodeRuntime(program))


async def test_fake_code_runtime_fails_the_run_when_the_program_raises() -> None:
    # An escaping error is the program's failure, as in a real run: CODE_RUN_FAILED, not TOOL_ERROR.
    async def escapes(tools: Any) -> CodeRunResult:
        await tools["delete"]({"path": "/x"})
        return CodeRunResult()

    failed = expect_failure(await _code_mode(escapes).execute(make_input("run_code", {"code": "", "description": "d"})))
    assert failed.code == "CODE_RUN_FAILED"
    assert failed.error.message == "code run failed (exception): ToolCallError: /x is not allowed (tool 'delete')"

    async def raises(tools: Any) -> CodeRunResult:
        raise ValueError("bug in the program")

    failed = expect_failure(await _code_mode(raises).execute(make_input("run_code", {"code": "", "description": "d"})))
    assert (failed.code, failed.error.message) == (
        "CODE_RUN_FAILED",
        "code run failed (exception): ValueError: bug in the program",
    )


async def test_fake_code_runtime_hands_the_program_plain_mutable_values_as_a_real_run_does() -> None:
    """A real program decodes JSON into dicts and lists; the fake handed it FrozenDicts and tuples."""

    async def listing(args: Any) -> Any:
        return {"items": [1, 2], "nested": {"deep": [{"x": 1}]}}

    async def program(tools: Any) -> CodeRunResult:
        value = await tools["listing"]({})
        assert type(value) is dict and value["items"] == [1, 2]
        value["items"].append(3)
        value["nested"]["deep"][0]["x"] = 2
        return CodeRunResult(value=value, has_value=True)

    runtime = make_runtime(json_tool("listing", listing), mode="code", code_runtime=FakeCodeRuntime(program))
    done = expect_success(await runtime.execute(make_input("run_code", {"code": "", "description": "d"})))
    assert done.value["result"] == {"items": (1, 2, 3), "nested": {"deep": ({"x": 2},)}}


async def test_fake_code_runtime_program_catches_tool_call_error() -> None:
    async def catches(tools: Any) -> CodeRunResult:
        try:
            await tools["delete"]({"path": "/y"})
        except ToolCallError as exc:
            return CodeRunResult(value=[exc.tool_name, str(exc)], has_value=True)
        return CodeRunResult()

    done = expect_success(await _code_mode(catches).execute(make_input("run_code", {"code": "", "description": "d"})))
    assert done.value == {"logs": (), "result": ("delete", "/y is not allowed")}
