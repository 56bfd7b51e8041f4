"""Which hookimpls a runtime accepts: the dsh plugin manager's refusals, and a host's own pluggy manager."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pluggy

from dsh_core import Deny, ToolRuntime, hookimpl, hookspecs
from dsh_core.testing import expect_failure, json_tool, make_input


class _NoDeletes:
    @hookimpl
    async def dsh_pre_execute(self, execution: Any, next: Any) -> Any:
        return Deny("no deletes") if execution.name.startswith("delete") else await next()


class _TypoPolicy:
    @hookimpl
    async def dsh_pre_exectue(self, execution: Any, next: Any) -> Any:
        return Deny("never applied")


class _ResultWrapper:
    @hookimpl(wrapper=True)
    def dsh_result(self, execution: Any, result: Any) -> Generator[None, Any, Any]:
        return (yield)


class _ResultHookwrapper:
    @hookimpl(hookwrapper=True)
    def dsh_result(self, execution: Any, result: Any) -> Generator[None, Any, None]:
        yield


class _PreWrapper:
    @hookimpl(wrapper=True)
    def dsh_pre_execute(self, execution: Any, next: Any) -> Generator[None, Any, Any]:
        return (yield)


class _AsyncToolsChange:
    @hookimpl
    async def dsh_tools_change(self) -> None:
        pass


# -- a host's own PluginManager("dsh") ----------------------------------------------


async def test_a_policy_registered_on_a_plain_manager_before_the_runtime_applies() -> None:
    """pluggy creates a spec-less caller for the early hookimpl; the runtime still adds every spec."""
    pm = pluggy.PluginManager("dsh")
    pm.register(_NoDeletes(), name="no-deletes")
    runtime = ToolRuntime(plugins=pm)
    assert all(getattr(pm.hook, name).has_spec() for name in dir(hookspecs) if name.startswith("dsh_"))
    runtime.register(json_tool("delete_all"))  # fires dsh_tools_change, which must exist
    result = expect_failure(await runtime.execute(make_input("delete_all")))
    assert (result.code, result.error.message, result.error.info.plugin) == ("DENIED", "no deletes", "no-deletes")


async def test_a_plain_manager_that_already_has_the_specs_is_taken_as_it_is() -> None:
    pm = pluggy.PluginManager("dsh")
    pm.add_hookspecs(hookspecs)
    runtime = ToolRuntime(plugins=pm)
    pm.register(_NoDeletes(), name="no-deletes")
    runtime.register(json_tool("delete_all"))
    assert expect_failure(await runtime.execute(make_input("delete_all"))).code == "DENIED"
