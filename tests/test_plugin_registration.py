"""Which hookimpls a runtime accepts: the dsh plugin manager's refusals, and a host's own pluggy manager."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pluggy
import pytest

from dsh_core import Deny, ToolRuntime, hookimpl, hookspecs
from dsh_core.testing import expect_failure, json_tool, make_input, make_runtime


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


class _PlainPreExecute:
    @hookimpl
    def dsh_pre_execute(self, execution: Any, next: Any) -> Any:
        return next()  # even handing back next()'s coroutine: the runtime awaits a coroutine function's call


class _Unmarked:
    async def dsh_pre_execute(self, execution: Any, next: Any) -> Any:  # the decorator forgotten
        return Deny("never said")


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


@pytest.mark.parametrize(
    ("plugin", "message"),
    [
        (_TypoPolicy(), 'typo: unknown hook "dsh_pre_exectue" (did you mean "dsh_pre_execute"?)'),
        (_ResultWrapper(), 'dsh_result of plugin "typo" is a pluggy wrapper (wrapper=True), which the runtime never '
                           "runs on dsh_result: write a plain hookimpl"),
    ],
    ids=["misspelt", "result-wrapper"],
)  # fmt: skip
async def test_on_a_plain_manager_a_hookimpl_that_never_runs_fails_every_call(plugin: object, message: str) -> None:
    """A plain manager refuses nothing at register(): the runtime refuses to run calls without the policy."""
    pm = pluggy.PluginManager("dsh")
    runtime = ToolRuntime(plugins=pm)
    runtime.register(json_tool("echo"))
    assert not (await runtime.execute(make_input("echo"))).is_error
    pm.register(plugin, name="typo")
    failed = expect_failure(await runtime.execute(make_input("echo")))
    assert (failed.code, failed.error.message, failed.error.info.plugin) == ("POLICY_ERROR", message, "typo")
    pm.unregister(plugin)
    assert not (await runtime.execute(make_input("echo"))).is_error


# -- the runtime's own manager refuses at register() -------------------------------------


@pytest.mark.parametrize(
    ("plugin", "message"),
    [
        (_ResultWrapper(), 'dsh_result of plugin "shape" is a pluggy wrapper (wrapper=True), which the runtime '
                           "never runs on dsh_result: write a plain hookimpl"),
        (_ResultHookwrapper(), 'dsh_result of plugin "shape" is a pluggy wrapper (hookwrapper=True), which the '
                               "runtime never runs on dsh_result: write a plain hookimpl"),
        (_PreWrapper(), 'dsh_pre_execute of plugin "shape" is a pluggy wrapper (wrapper=True), which the runtime '
                        "never runs on dsh_pre_execute: a waterfall listener is an async def that wraps the rest "
                        "of the chain by awaiting next()"),
        (_AsyncToolsChange(), 'dsh_tools_change of plugin "shape" is an async def, but dsh_tools_change is called '
                              "synchronously and its coroutine would never run: make it a plain def"),
        (_PlainPreExecute(), 'dsh_pre_execute of plugin "shape" is not an async def, but its listeners are '
                             "awaited: make it async def"),
        (_Unmarked(), 'dsh_pre_execute of plugin "shape" is not marked @hookimpl, so it would never be called: '
                      "decorate it with @hookimpl (from dsh_core import hookimpl)"),
    ],
    ids=["result-wrapper", "result-hookwrapper", "waterfall-wrapper", "async-tools-change", "plain-def-waterfall",
         "unmarked"],
)  # fmt: skip
def test_a_hookimpl_the_runtime_never_runs_is_refused_at_register(plugin: object, message: str) -> None:
    runtime = make_runtime()
    with pytest.raises(pluggy.PluginValidationError) as raised:
        runtime.plugins.register(plugin, name="shape")
    assert str(raised.value) == message
    assert not runtime.plugins.is_registered(plugin)
    runtime.register(json_tool("echo"))  # dsh_tools_change has nothing of it left to call


_CLASS_NOT_INSTANCE = (
    'dsh_pre_execute of plugin "{name}" is a method of the class _NoDeletes, which was registered instead of '
    "an instance (self would take the call's first argument): register an instance: _NoDeletes()"
)


async def test_a_forgotten_hookimpl_marker_is_refused_by_make_runtime_too_and_nothing_stays_registered() -> None:
    with pytest.raises(pluggy.PluginValidationError, match="is not marked @hookimpl"):
        make_runtime(json_tool("read"), plugins={"unmarked": _Unmarked()})
    runtime = make_runtime(json_tool("read"))
    with pytest.raises(pluggy.PluginValidationError):
        runtime.plugins.register(_Unmarked(), name="unmarked")
    assert runtime.plugins.get_plugin("unmarked") is None
    assert not (await runtime.execute(make_input("read"))).is_error


def test_objects_that_answer_any_attribute_are_not_taken_for_unmarked_hooks() -> None:
    """A Mock or a delegating proxy defines no hook of its own; the review found them refused."""
    from unittest import mock

    class Proxy:
        def __getattr__(self, name: str) -> Any:
            return lambda *args, **kwargs: None

    runtime = make_runtime()
    for index, plugin in enumerate((mock.Mock(), mock.MagicMock(), Proxy())):
        assert runtime.plugins.register(plugin, name=f"p{index}") == f"p{index}"


def test_a_marked_hook_that_is_no_function_is_refused_for_what_it_is() -> None:
    import functools
    import types

    def changed(extra: int) -> None:
        pass

    plugin = types.SimpleNamespace(dsh_tools_change=hookimpl(functools.partial(changed, 1)))
    with pytest.raises(pluggy.PluginValidationError) as raised:
        make_runtime().plugins.register(plugin, name="partial")
    assert str(raised.value) == (
        'dsh_tools_change of plugin "partial" is marked @hookimpl but is not a function, so pluggy never '
        "registers it: make it a def"
    )


def test_an_attribute_that_raises_or_is_no_callable_is_not_taken_for_an_unmarked_hook() -> None:
    class Odd:
        dsh_result = "not a function"

        def __getattr__(self, name: str) -> Any:
            raise RuntimeError(name)

    runtime = make_runtime()
    assert runtime.plugins.register(Odd(), name="odd") == "odd"


def test_a_policy_class_registered_instead_of_an_instance_is_refused_naming_the_fix() -> None:
    runtime = make_runtime()
    with pytest.raises(pluggy.PluginValidationError) as raised:
        runtime.plugins.register(_NoDeletes, name="no-deletes")
    assert str(raised.value) == _CLASS_NOT_INSTANCE.format(name="no-deletes")
    assert not runtime.plugins.is_registered(_NoDeletes)
    with pytest.raises(pluggy.PluginValidationError) as from_helper:
        make_runtime(json_tool("read"), plugins={"no-deletes": _NoDeletes})
    assert str(from_helper.value) == _CLASS_NOT_INSTANCE.format(name="no-deletes")


async def test_on_a_plain_manager_a_policy_class_fails_every_call_naming_the_fix() -> None:
    pm = pluggy.PluginManager("dsh")
    runtime = ToolRuntime(plugins=pm)
    runtime.register(json_tool("read"))
    pm.register(_NoDeletes, name="no-deletes")
    failed = expect_failure(await runtime.execute(make_input("read")))
    assert (failed.code, failed.error.message) == ("POLICY_ERROR", _CLASS_NOT_INSTANCE.format(name="no-deletes"))


async def test_a_class_whose_hookimpls_take_no_self_may_be_registered_itself() -> None:
    class StaticPolicy:
        @staticmethod
        @hookimpl
        async def dsh_pre_execute(execution: Any, next: Any) -> Any:
            return Deny("static says no")

    runtime = make_runtime(json_tool("read"), plugins={"static": StaticPolicy})
    failed = expect_failure(await runtime.execute(make_input("read")))
    assert (failed.code, failed.error.message, failed.error.info.plugin) == ("DENIED", "static says no", "static")


def test_a_wrapper_of_dsh_tools_change_is_accepted_since_pluggy_itself_calls_that_hook() -> None:
    heard: list[str] = []

    class ChangeWrapper:
        @hookimpl(wrapper=True)
        def dsh_tools_change(self) -> Generator[None, Any, Any]:
            heard.append("before")
            outcome = yield
            heard.append("after")
            return outcome

    runtime = make_runtime(plugins=[ChangeWrapper()])
    runtime.register(json_tool("echo"))
    assert heard == ["before", "after"]
