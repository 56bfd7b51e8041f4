"""``dsh_core.testing``'s result helpers, which plugin authors use in their own tests."""

from __future__ import annotations

import pytest

from dsh_core import ToolExecutionFailure, ToolExecutionSuccess
from dsh_core.testing import expect_failure, expect_success, json_tool, make_input, make_runtime


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
