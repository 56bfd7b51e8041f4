"""Capability manifests: declared, reported, and enforced only under strict_capabilities."""

from __future__ import annotations

import importlib.metadata
import itertools
import json
import sys
import textwrap
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
import trio
from click.testing import CliRunner

from dsh_core import CancelSignal, CapabilityError, Deny, TextBlock, ToolRuntime, hookimpl
from dsh_core._capabilities import Capabilities, _read_only, _Watch, guard_guard, guard_listeners
from dsh_core._cli import cli
from dsh_core._config import DshConfig
from dsh_core._plugins import PluginReport, load_plugins
from dsh_core.code_mode import CodeRunResult
from dsh_core.testing import FakeCodeRuntime, json_tool, make_input

_serial = itertools.count()

HEADER = """
from dsh_core import Accept, Allow, Block, Deny, TextBlock, ToolExecutionSuccess, define_tool, hookimpl

async def _echo(args):
    return args

def tool(name):
    return define_tool(name=name, description=name, parameters={}, output={"type": "json"}, execute=_echo)
"""

# A plugin without a manifest (it needs a hookimpl: one with none fails to load).
PLAIN = (
    HEADER
    + """
@hookimpl
def dsh_result(execution, result):
    pass
"""
)

# Registers three tools and denies every call it sees whose name starts with "rm" or is "ls".
POLICY = (
    HEADER
    + """
DSH_CAPABILITIES = {"tools": ["fs_*"], "affects": ["fs_*", "rm*"]}

@hookimpl
async def dsh_pre_execute(execution, next):
    if execution.name.startswith("rm") or execution.name == "ls":
        return Deny("not today")
    return await next()

@hookimpl
def dsh_setup(runtime, config):
    runtime.register(tool("fs_read"))
    runtime.register(tool("fs_write"))
"""
)


class Loader:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.prefix = f"dshcap{next(_serial)}_"

    def module(self, name: str, source: str) -> str:
        full = self.prefix + name
        (self.root / f"{full}.py").write_text(textwrap.dedent(source))
        return full

    def load(
        self, plugins: dict[str, str], *, strict: bool, runtime: ToolRuntime | None = None, **settings: Any
    ) -> tuple[ToolRuntime, PluginReport]:
        runtime = runtime or ToolRuntime()
        points = [
            importlib.metadata.EntryPoint(name=name, value=self.module(name, source), group="dsh")
            for name, source in plugins.items()
        ]
        config = DshConfig(strict_capabilities=strict, **settings)
        return runtime, load_plugins(runtime, config=config, entry_points=points)


@pytest.fixture
def loader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Loader]:
    monkeypatch.syspath_prepend(str(tmp_path))
    factory = Loader(tmp_path)
    yield factory
    for name in [m for m in sys.modules if m.startswith(factory.prefix)]:
        del sys.modules[name]


def tools_host(runtime: ToolRuntime, *names: str) -> ToolRuntime:
    for name in names:
        runtime.register(json_tool(name))
    return runtime


# -- the manifest ----------------------------------------------------------------------------


def test_the_manifest_is_reported(loader: Loader) -> None:
    _, report = loader.load({"policy": POLICY}, strict=False)
    assert report.ok
    assert report.loaded[0].capabilities == Capabilities(tools=("fs_*",), affects=("fs_*", "rm*"))


def test_a_plugin_without_a_manifest_reports_none(loader: Loader) -> None:
    _, report = loader.load({"plain": PLAIN}, strict=False)
    assert report.loaded[0].capabilities is None


@pytest.mark.parametrize(
    ("manifest", "message"),
    [
        ('["fs_*"]', "must be a dict"),
        ('{"tools": "fs_*"}', '"tools" must be a list'),
        ('{"affects": [1]}', '"affects"[0] must be a non-empty string'),
        (
            '{"affects": [__import__("functools").reduce(lambda v, _: [v], range(100_000), [])]}',
            '"affects"[0] must be a non-empty string, got [[[[[[[...]]]]]]]',
        ),
        ('{"tool": ["x"]}', "unknown key(s) tool"),
    ],
    ids=["not-a-dict", "not-a-list", "not-a-string", "too-deep-to-print", "unknown-key"],
)
def test_a_malformed_manifest_fails_the_plugin_at_import(loader: Loader, manifest: str, message: str) -> None:
    _, report = loader.load({"bad": HEADER + f"\nDSH_CAPABILITIES = {manifest}\n"}, strict=False)
    assert [(f.name, f.stage) for f in report.failed] == [("bad", "import")]
    assert message in report.failed[0].error


# -- off by default ----------------------------------------------------------------------------


async def test_without_strict_mode_nothing_is_enforced_or_wrapped(loader: Loader) -> None:
    source = POLICY.replace('runtime.register(tool("fs_write"))', 'runtime.register(tool("other"))')
    runtime, report = loader.load({"policy": source}, strict=False, runtime=tools_host(ToolRuntime(), "ls"))
    assert report.loaded[0].tools == ("fs_read", "other")
    result = await runtime.execute(make_input("ls"))
    assert result.is_error and result.code == "DENIED"
    impl = runtime.plugins.hook.dsh_pre_execute.get_hookimpls()[0]
    assert impl.function is sys.modules[loader.prefix + "policy"].dsh_pre_execute


# -- registrations -----------------------------------------------------------------------------


def test_strict_mode_refuses_registrations_outside_tools(loader: Loader) -> None:
    source = POLICY.replace(
        'runtime.register(tool("fs_write"))',
        'try:\n        runtime.register(tool("shell"))\n    except Exception:\n        pass',
    )
    runtime, report = loader.load({"policy": source}, strict=True)
    assert report.ok
    assert report.loaded[0].tools == ("fs_read",)
    assert [(r.plugin, r.tool) for r in report.refused] == [("policy", "shell")]
    assert "may not register tool" in report.refused[0].error and "fs_*" in report.refused[0].error
    assert runtime.names() == ["fs_read"]


def test_an_uncaught_refusal_rolls_the_plugin_back(loader: Loader) -> None:
    source = POLICY.replace('runtime.register(tool("fs_write"))', 'runtime.register(tool("shell"))')
    runtime, report = loader.load({"policy": source}, strict=True)
    assert [(f.name, f.stage) for f in report.failed] == [("policy", "setup")]
    assert runtime.names() == []


def test_a_plugin_without_a_manifest_may_register_nothing_in_strict_mode(loader: Loader) -> None:
    source = HEADER + "\n@hookimpl\ndef dsh_setup(runtime, config):\n    runtime.register(tool('x'))\n"
    _, report = loader.load({"plain": source}, strict=True)
    assert [(f.name, f.stage) for f in report.failed] == [("plain", "setup")]
    assert "its DSH_CAPABILITIES tools are none" in report.failed[0].error


# -- decisions ---------------------------------------------------------------------------------


async def test_a_decision_inside_affects_stands(loader: Loader) -> None:
    runtime, _ = loader.load({"policy": POLICY}, strict=True, runtime=tools_host(ToolRuntime(), "rm"))
    result = await runtime.execute(make_input("rm"))
    assert result.is_error and result.code == "DENIED"


async def test_a_decision_outside_affects_is_a_policy_error_naming_the_plugin(loader: Loader) -> None:
    runtime, _ = loader.load({"policy": POLICY}, strict=True, runtime=tools_host(ToolRuntime(), "ls"))
    result = await runtime.execute(make_input("ls"))
    assert result.is_error and result.code == "POLICY_ERROR"
    assert result.error.info is not None and result.error.info.plugin == "policy"
    assert 'plugin policy may not decide calls of tool "ls"' in result.error.message


async def test_passing_through_outside_affects_is_fine(loader: Loader) -> None:
    runtime, _ = loader.load({"policy": POLICY}, strict=True, runtime=tools_host(ToolRuntime(), "cat"))
    result = await runtime.execute(make_input("cat", {"x": 1}))
    assert not result.is_error


@pytest.mark.parametrize(
    "hook",
    [
        "@hookimpl\nasync def dsh_pre_execute(execution, next):\n    return Allow()\n",
        "@hookimpl\nasync def dsh_pre_execute(next):\n    await next()\n    return Deny('late')\n",
        "@hookimpl\nasync def dsh_execute(execution, next):\n    return ToolExecutionSuccess(value=1, content=())\n",
        "@hookimpl\nasync def dsh_post_execute(execution, result, next):\n"
        "    await next()\n    return Accept(content=[TextBlock('x')])\n",
        "@hookimpl\nasync def dsh_post_execute(execution, result, next):\n"
        "    return Block(feedback=[TextBlock('no')])\n",
    ],
    ids=["own-allow", "deny-after-next", "replaced-result", "replaced-content", "block"],
)
async def test_every_kind_of_decision_outside_affects_is_refused(loader: Loader, hook: str) -> None:
    source = HEADER + '\nDSH_CAPABILITIES = {"affects": ["mine"]}\n' + hook
    runtime, report = loader.load({"p": source}, strict=True, runtime=tools_host(ToolRuntime(), "mine", "theirs"))
    assert report.ok
    refused = await runtime.execute(make_input("theirs"))
    assert refused.is_error and refused.code == "POLICY_ERROR" and "plugin p may not decide" in refused.error.message
    allowed = await runtime.execute(make_input("mine"))
    assert not (allowed.is_error and allowed.code == "POLICY_ERROR")


async def test_listeners_of_plugins_registered_in_setup_are_guarded_too(loader: Loader) -> None:
    source = (
        HEADER
        + """
DSH_CAPABILITIES = {"affects": ["mine"]}

class Policy:
    @hookimpl
    async def dsh_pre_execute(self, execution, next):
        return Deny("no")

@hookimpl
def dsh_setup(runtime, config):
    runtime.plugins.register(Policy(), name="p-policy")
"""
    )
    runtime, _ = loader.load({"p": source}, strict=True, runtime=tools_host(ToolRuntime(), "mine", "theirs"))
    assert (await runtime.execute(make_input("mine"))).code == "DENIED"
    refused = await runtime.execute(make_input("theirs"))
    assert refused.code == "POLICY_ERROR"
    assert refused.error.info is not None and refused.error.info.plugin == "p-policy"
    assert "plugin p may not decide" in refused.error.message


async def test_guards_added_in_setup_may_deny_only_inside_affects(loader: Loader) -> None:
    source = (
        HEADER
        + """
DSH_CAPABILITIES = {"affects": ["mine"]}

def deny_everything(execution):
    return "denied by the guard"

@hookimpl
def dsh_setup(runtime, config):
    runtime.guard(deny_everything)
"""
    )
    runtime, _ = loader.load({"p": source}, strict=True, runtime=tools_host(ToolRuntime(), "mine", "theirs"))
    assert (await runtime.execute(make_input("mine"))).code == "DENIED"
    refused = await runtime.execute(make_input("theirs"))
    assert refused.code == "POLICY_ERROR" and 'plugin p may not deny calls of tool "theirs"' in refused.error.message


def test_an_async_guard_is_refused_before_strict_mode_wraps_it(loader: Loader) -> None:
    """The strict-mode wrapper is a plain function: the check must see the guard as the plugin gave it."""
    source = (
        HEADER
        + """
DSH_CAPABILITIES = {"affects": ["mine"]}

async def deny_everything(execution):
    return "denied by the guard"

@hookimpl
def dsh_setup(runtime, config):
    runtime.guard(deny_everything)
"""
    )
    runtime, report = loader.load({"p": source}, strict=True, runtime=tools_host(ToolRuntime(), "mine"))
    (failed,) = report.failed
    assert (failed.name, failed.stage) == ("p", "setup")
    assert "deny_everything is async" in failed.error
    assert runtime._registry.view(None).guards == ()


async def test_a_plugin_without_a_manifest_decides_nothing_in_strict_mode(loader: Loader) -> None:
    source = HEADER + "\n@hookimpl\nasync def dsh_pre_execute(execution, next):\n    return Deny('no')\n"
    runtime, _ = loader.load({"plain": source}, strict=True, runtime=tools_host(ToolRuntime(), "t"))
    assert (await runtime.execute(make_input("t"))).code == "POLICY_ERROR"


# -- what a listener outside affects may not do ------------------------------------------------

# A plugin that may decide only calls of "mine"; the hosts below also have "theirs".
MINE = (
    HEADER
    + "\nfrom dsh_core import AbortError, CancelSignal, CapabilityError, DshError\n\n"
    + 'DSH_CAPABILITIES = {"affects": ["mine"]}\n'
)


def mine_and_theirs() -> ToolRuntime:
    return tools_host(ToolRuntime(), "mine", "theirs")


@pytest.mark.parametrize(
    ("hook", "inside"),
    [
        ("@hookimpl\nasync def dsh_pre_execute(execution, next):\n    raise DshError('by raising', code='DENIED')\n",
         "DENIED"),
        ("@hookimpl\nasync def dsh_pre_execute(execution, next):\n    raise AbortError('by raising')\n", "ABORTED"),
        ("@hookimpl\nasync def dsh_execute(execution, next):\n    raise DshError('by raising', code='TOOL_TIMEOUT')\n",
         "TOOL_TIMEOUT"),
        ("@hookimpl\nasync def dsh_post_execute(execution, result, next):\n"
         "    await next()\n    raise DshError('by raising', code='DENIED')\n", "DENIED"),
        ("@hookimpl\nasync def dsh_pre_execute(execution, next):\n    raise RuntimeError('by raising')\n",
         "POLICY_ERROR"),
    ],
    ids=["pre-denied", "pre-aborted", "execute-timeout", "post-after-next", "pre-runtime-error"],
)  # fmt: skip
async def test_a_listener_cannot_decide_outside_affects_by_raising(loader: Loader, hook: str, inside: str) -> None:
    runtime, report = loader.load({"p": MINE + hook}, strict=True, runtime=mine_and_theirs())
    assert report.ok
    refused = await runtime.execute(make_input("theirs"))
    assert refused.is_error and refused.code == "POLICY_ERROR"
    assert refused.error.info is not None and (refused.error.info.name, refused.error.info.plugin) == (
        "CapabilityError",
        "p",
    )
    assert refused.error.message.startswith('plugin p may not decide calls of tool "theirs": its DSH_CAPABILITIES')
    assert "listener raised" in refused.error.message and "by raising" in refused.error.message
    decided = await runtime.execute(make_input("mine"))
    assert decided.is_error and (decided.code, decided.error.message) == (inside, "by raising")


async def test_a_guard_cannot_deny_outside_affects_by_raising(loader: Loader) -> None:
    source = MINE + (
        "def guard(execution):\n    raise DshError('by raising', code='DENIED')\n\n"
        "@hookimpl\ndef dsh_setup(runtime, config):\n    runtime.guard(guard)\n"
    )
    runtime, _ = loader.load({"p": source}, strict=True, runtime=mine_and_theirs())
    refused = await runtime.execute(make_input("theirs"))
    assert refused.is_error and refused.code == "POLICY_ERROR"
    assert 'plugin p may not deny calls of tool "theirs"' in refused.error.message
    assert "its guard raised DshError: by raising" in refused.error.message
    assert (await runtime.execute(make_input("mine"))).code == "DENIED"


async def test_what_next_raised_passes_a_listener_outside_affects_unchanged(loader: Loader) -> None:
    decider = (
        HEADER
        + 'from dsh_core import DshError\n\nDSH_CAPABILITIES = {"affects": ["theirs"]}\n\n'
        + "@hookimpl\nasync def dsh_pre_execute(execution, next):\n    raise DshError('theirs to decide', code='DENIED')\n"
    )
    passing = MINE + (
        "@hookimpl\nasync def dsh_pre_execute(execution, next):\n"
        "    try:\n        return await next()\n    except DshError:\n        raise\n"
    )
    # Loaded later, "passing" is the outer listener: the decider's denial goes through it.
    runtime, _ = loader.load({"decider": decider, "passing": passing}, strict=True, runtime=mine_and_theirs())
    result = await runtime.execute(make_input("theirs"))
    assert result.is_error and (result.code, result.error.message) == ("DENIED", "theirs to decide")
    assert result.error.info is not None and result.error.info.plugin == "decider"


async def test_the_runtimes_own_policy_error_from_next_passes_unchanged(loader: Loader) -> None:
    twice = MINE + "@hookimpl\nasync def dsh_pre_execute(execution, next):\n    await next()\n    return await next()\n"
    runtime, _ = loader.load({"p": twice}, strict=True, runtime=mine_and_theirs())
    result = await runtime.execute(make_input("theirs"))
    assert result.is_error and result.code == "POLICY_ERROR"
    assert result.error.message == "p: next() may be called at most once per listener"


async def test_cancellation_passes_a_listener_outside_affects(loader: Loader, autojump_clock: Any) -> None:
    slow = MINE + (
        "import trio\n\n@hookimpl\nasync def dsh_pre_execute(execution, next):\n"
        "    await trio.sleep(10)\n    return await next()\n"
    )
    runtime, _ = loader.load({"p": slow}, strict=True, runtime=mine_and_theirs())
    result = await runtime.execute(make_input("theirs", signal=CancelSignal.after(1)))
    assert result.is_error and result.code == "ABORTED_BEFORE_DISPATCH"


@pytest.mark.parametrize(
    "hook",
    [
        # The audit's reproducer: swap in a fired signal around next(), restore it after.
        "@hookimpl\nasync def dsh_execute(execution, next):\n"
        "    fired = CancelSignal()\n    fired.cancel('by the wrapper')\n    held = execution.signal\n"
        "    execution.signal = fired\n    try:\n        return await next()\n    finally:\n"
        "        execution.signal = held\n",
        # The refusal caught: nothing was replaced, and the attempt still fails the call.
        "@hookimpl\nasync def dsh_execute(execution, next):\n"
        "    fired = CancelSignal()\n    fired.cancel('by the wrapper')\n    try:\n"
        "        execution.signal = fired\n    except CapabilityError:\n        pass\n    return await next()\n",
    ],
    ids=["uncaught", "caught"],
)
async def test_a_wrapper_outside_affects_cannot_replace_the_signal(loader: Loader, hook: str) -> None:
    runtime, _ = loader.load({"p": MINE + hook}, strict=True, runtime=mine_and_theirs())
    refused = await runtime.execute(make_input("theirs"))
    assert refused.is_error and refused.code == "POLICY_ERROR"
    assert refused.error.message.startswith('plugin p may not replace the signal of calls of tool "theirs"')
    assert (await runtime.execute(make_input("mine"))).code == "ABORTED_BEFORE_DISPATCH"


@pytest.mark.parametrize(
    "attempt",
    [
        "execution.signal.cancel('by the listener')",
        "CancelSignal.any(execution.signal, CancelSignal()).sources[0].cancel()",
    ],
    ids=["cancel", "through-sources"],
)
async def test_a_listener_outside_affects_cannot_fire_the_callers_signal(loader: Loader, attempt: str) -> None:
    hook = (
        "@hookimpl\nasync def dsh_pre_execute(execution, next):\n"
        f"    try:\n        {attempt}\n    except CapabilityError:\n        pass\n    return await next()\n"
    )
    runtime, _ = loader.load({"p": MINE + hook}, strict=True, runtime=mine_and_theirs())
    signal = CancelSignal()
    refused = await runtime.execute(make_input("theirs", signal=signal))
    assert refused.is_error and refused.code == "POLICY_ERROR"
    assert refused.error.message.startswith('plugin p may not cancel calls of tool "theirs"')
    assert not signal.cancelled
    decided = await runtime.execute(make_input("mine", signal=signal))
    assert decided.code == "ABORTED_BEFORE_DISPATCH" and signal.cancelled


async def test_the_read_only_signal_reports_waits_and_links_like_the_callers(autojump_clock: Any) -> None:
    watch = _Watch("p", Capabilities(), "t")
    caller = CancelSignal()
    view = _read_only(caller, watch)
    assert isinstance(view, CancelSignal) and not view.cancelled and view.sources == ()
    with pytest.raises(CapabilityError, match=r'^plugin p may not cancel calls of tool "t"'):
        view.cancel()
    assert not caller.cancelled
    woke = trio.Event()

    async def wait() -> None:
        await view.wait()
        woke.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait)
        await trio.sleep(1)
        assert not woke.is_set()
        caller.cancel("stop")
    assert woke.is_set() and view.cancelled and view.reason == "stop"

    timed = CancelSignal.after(5, reason="late")
    fused = _read_only(CancelSignal.any(CancelSignal(), timed), watch)
    assert fused.deadline == timed.deadline and len(fused.sources) == 2
    for source in (fused, *fused.sources):
        with pytest.raises(CapabilityError):
            source.cancel()
    # A listener fusing the view with a signal of its own: the deadline and the reason carry over.
    mixed = CancelSignal.any(fused, CancelSignal())
    start = trio.current_time()
    with trio.CancelScope() as scope:
        unlink = mixed.link(scope)
        await trio.sleep(60)
    unlink()
    assert scope.cancelled_caught and trio.current_time() - start == 5
    assert mixed.cancelled and mixed.reason == "late"


async def test_a_wrapper_outside_affects_reads_the_dispatch_as_it_is(loader: Loader) -> None:
    timer = (
        HEADER
        + 'from dsh_core import CancelSignal\n\nDSH_CAPABILITIES = {"affects": ["*"]}\n\n'
        + "@hookimpl\nasync def dsh_execute(execution, next):\n    held = execution.signal\n"
        + "    execution.signal = CancelSignal.any(held, CancelSignal.after(60))\n"
        + "    try:\n        return await next()\n    finally:\n        execution.signal = held\n"
    )
    watcher = MINE + (
        "SEEN = []\n\n@hookimpl\nasync def dsh_execute(execution, next):\n    result = await next()\n"
        "    body = execution.body_result\n"
        "    SEEN.append((execution.signal.deadline, execution.body_started, body.value))\n"
        "    return result\n"
    )
    # Loaded later, "timer" wraps "watcher" and installs its deadline first.
    runtime, _ = loader.load({"watcher": watcher, "timer": timer}, strict=True, runtime=mine_and_theirs())
    result = await runtime.execute(make_input("theirs", {"x": 1}))
    assert not result.is_error
    ((deadline, started, value),) = sys.modules[loader.prefix + "watcher"].SEEN
    assert deadline < float("inf") and started and value == {"x": 1}


# -- tool prefixes -----------------------------------------------------------------------------


def test_affects_globs_match_a_prefixed_tool_by_the_plugins_own_name() -> None:
    own = Capabilities(affects=("fs_*",))
    assert own.may_affect("pfx__fs_read", "pfx") and own.may_affect("fs_read", "pfx")
    assert not own.may_affect("pfx__fs_read") and not own.may_affect("other__fs_read", "pfx")
    assert Capabilities(affects=("pfx__fs_*",)).may_affect("pfx__fs_read", "pfx")  # prefixed globs still match


async def test_guarded_listeners_and_guards_take_the_plugins_prefix() -> None:
    class Policy:
        @hookimpl
        async def dsh_pre_execute(self, execution: Any, next: Any) -> Any:
            return Deny("own policy") if execution.name.endswith("fs_read") else await next()

    def guard(execution: Any) -> str:
        return "own guard"

    granted = Capabilities(affects=("fs_*",))
    runtime = tools_host(ToolRuntime(), "pfx__fs_read", "pfx__fs_write", "shell")
    policy = Policy()
    runtime.plugins.register(policy, name="p")
    assert guard_listeners(runtime.plugins, policy, "p", granted, prefix="pfx") == 1
    runtime.guard(guard_guard(guard, "p", granted, prefix="pfx"))
    read = await runtime.execute(make_input("pfx__fs_read"))
    assert read.is_error and (read.code, read.error.message) == ("DENIED", "own policy")
    write = await runtime.execute(make_input("pfx__fs_write"))
    assert write.is_error and (write.code, write.error.message) == ("DENIED", "own guard")
    shell = await runtime.execute(make_input("shell"))
    assert shell.code == "POLICY_ERROR" and 'plugin p may not deny calls of tool "shell"' in shell.error.message


async def test_a_tool_prefix_keeps_a_plugins_policy_on_its_own_tools(loader: Loader) -> None:
    source = HEADER + (
        'DSH_CAPABILITIES = {"tools": ["fs_*"], "affects": ["fs_*"]}\n\n'
        "@hookimpl\ndef dsh_setup(runtime, config):\n"
        '    runtime.register(tool("fs_read"))\n    runtime.register(tool("fs_write"))\n'
        '    runtime.guard(lambda execution: "own guard" if execution.name.endswith("fs_write") else None)\n\n'
        "@hookimpl\nasync def dsh_pre_execute(execution, next):\n"
        '    return Deny("own policy") if execution.name.endswith("fs_read") else await next()\n'
    )
    runtime, report = loader.load({"p": source}, strict=True, tool_prefixes={"p": "pfx"})
    assert report.loaded[0].tools == ("pfx__fs_read", "pfx__fs_write")
    read = await runtime.execute(make_input("pfx__fs_read"))
    assert read.is_error and (read.code, read.error.message) == ("DENIED", "own policy")
    write = await runtime.execute(make_input("pfx__fs_write"))
    assert write.is_error and (write.code, write.error.message) == ("DENIED", "own guard")


# -- the Code Mode dispatch log ----------------------------------------------------------------


def code_host(*names: str) -> tuple[ToolRuntime, list[tuple[str, Any]]]:
    async def program(tools: Mapping[str, Any]) -> CodeRunResult:
        for name in names:
            await tools[name]({})
        return CodeRunResult()

    events: list[tuple[str, Any]] = []
    runtime = ToolRuntime(
        mode="code", code_runtime=FakeCodeRuntime(program), event_sink=lambda kind, data: events.append((kind, data))
    )
    return tools_host(runtime, *names), events


def logged(events: list[tuple[str, Any]]) -> dict[str, Any]:
    return {data["name"]: data["content"] for kind, data in events if kind == "tool/code-dispatch"}


async def test_a_dispatch_log_listener_replaces_the_logged_content_only_inside_affects(
    loader: Loader, caplog: pytest.LogCaptureFixture
) -> None:
    forger = MINE + (
        "@hookimpl\nasync def dsh_code_dispatch_log(dispatch, next):\n"
        "    await next()\n    return [TextBlock('forged ' + dispatch.name)]\n"
    )
    runtime, events = code_host("mine", "theirs")
    loader.load({"p": forger}, strict=True, runtime=runtime)
    result = await runtime.execute(make_input("run_code", {"code": "...", "description": "d"}))
    assert not result.is_error
    assert logged(events) == {"mine": (TextBlock("forged mine"),), "theirs": (TextBlock("{}"),)}
    assert 'plugin p may not replace the logged content of calls of tool "theirs"' in caplog.text


async def test_a_raising_dispatch_log_listener_outside_affects_keeps_the_rest_of_the_chain(
    loader: Loader, caplog: pytest.LogCaptureFixture
) -> None:
    short = (
        HEADER
        + 'DSH_CAPABILITIES = {"affects": ["*"]}\n\n'
        + "@hookimpl\nasync def dsh_code_dispatch_log(dispatch, next):\n    await next()\n"
        + "    return [TextBlock('short')]\n"
    )
    rogue = MINE + (
        "@hookimpl\nasync def dsh_code_dispatch_log(dispatch, next):\n    await next()\n    raise RuntimeError('rogue')\n"
    )
    runtime, events = code_host("theirs")
    # Loaded later, "rogue" is the outer listener.
    loader.load({"short": short, "rogue": rogue}, strict=True, runtime=runtime)
    await runtime.execute(make_input("run_code", {"code": "...", "description": "d"}))
    assert logged(events) == {"theirs": (TextBlock("short"),)}
    assert "its dsh_code_dispatch_log listener raised RuntimeError: rogue" in caplog.text


# -- suspension --------------------------------------------------------------------------------


def test_a_wrapper_suspends_like_the_listener_it_wraps() -> None:
    class Policy:
        @hookimpl
        async def dsh_pre_execute(self, execution: Any, next: Any) -> Any:
            return await next()

    runtime = ToolRuntime()
    policy = Policy()
    runtime.plugins.register(policy, name="p")
    original = runtime.plugins.hook.dsh_pre_execute.get_hookimpls()[0].function
    guard_listeners(runtime.plugins, policy, "p", Capabilities())
    wrapper = runtime.plugins.hook.dsh_pre_execute.get_hookimpls()[0].function
    assert wrapper is not original and wrapper.__dsh_suspends_like__ is original


async def test_strict_mode_adds_no_cancel_scope_to_a_call_that_cannot_suspend(loader: Loader) -> None:
    source = MINE + (
        "SEEN = []\n\n@hookimpl\nasync def dsh_pre_execute(execution, next):\n    return await next()\n\n"
        "@hookimpl(trylast=True)\nasync def dsh_execute(execution, next):\n"
        "    SEEN.append(execution.may_suspend)\n    return await next()\n"
    )
    runtime, _ = loader.load({"p": source}, strict=True, runtime=mine_and_theirs())
    assert not (await runtime.execute(make_input("mine"))).is_error
    assert not (await runtime.execute(make_input("theirs"))).is_error
    assert sys.modules[loader.prefix + "p"].SEEN == [False, False]


# -- the CLI -----------------------------------------------------------------------------------


@pytest.fixture
def cli_plugin(loader: Loader, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "200")
    return [
        "--no-plugins",
        "--plugin",
        f"policy={loader.module('policy', POLICY)}",
        "--plugin",
        f"plain={loader.module('plain', PLAIN)}",
    ]


def test_plugins_capabilities_lists_the_manifests(cli_plugin: list[str]) -> None:
    result = CliRunner().invoke(cli, [*cli_plugin, "plugins", "--capabilities"], catch_exceptions=False)
    assert result.exit_code == 0
    assert "fs_*, rm*" in result.stdout and "fs_read, fs_write" in result.stdout
    assert "not declared" in result.stdout


def test_plugins_capabilities_json(cli_plugin: list[str]) -> None:
    result = CliRunner().invoke(cli, [*cli_plugin, "plugins", "--capabilities", "--json"], catch_exceptions=False)
    data: dict[str, Any] = json.loads(result.stdout)
    assert data["strict"] is False
    assert data["plugins"] == [
        {
            "plugin": "policy",
            "declared": True,
            "tools": ["fs_*"],
            "affects": ["fs_*", "rm*"],
            "registered": ["fs_read", "fs_write"],
        },
        {"plugin": "plain", "declared": False, "tools": [], "affects": [], "registered": []},
    ]


def test_check_warns_about_undeclared_plugins_in_strict_mode(cli_plugin: list[str], tmp_path: Path) -> None:
    (tmp_path / "dsh.toml").write_text("strict_capabilities = true\n")
    result = CliRunner().invoke(cli, [*cli_plugin, "check"], catch_exceptions=False)
    assert "plugin plain declares no DSH_CAPABILITIES" in result.stdout
    assert "plugin policy declares no" not in result.stdout


def _first_party_modules() -> list[str]:
    import importlib.metadata

    # From the installed entry points, so a new first-party plugin cannot be left out of this check.
    values = {point.value for point in importlib.metadata.entry_points(group="dsh")}
    return sorted(value for value in values if value.startswith("dsh_plugins."))


def test_every_first_party_module_is_an_entry_point() -> None:
    assert {"dsh_plugins.timeout", "dsh_plugins.ledger", "dsh_plugins.mcp_client"} <= set(_first_party_modules())


@pytest.mark.parametrize("module", _first_party_modules())
def test_first_party_plugins_declare_a_valid_manifest(module: str) -> None:
    import importlib

    from dsh_core._capabilities import capabilities_of

    loaded = importlib.import_module(module)
    assert capabilities_of(loaded) is not None


# -- restrictions, deferrals and presentations made in setup ------------------------------------

# Makes one change (ACTION) in its dsh_setup; AFFECTS is its manifest's "affects".
SCOPING = (
    HEADER
    + """
from dsh_core import Agent, ToolRestriction

DSH_CAPABILITIES = {"tools": [], "affects": AFFECTS}
AGENT = Agent(id="worker")

@hookimpl
def dsh_setup(runtime, config):
    ACTION
"""
)


def scoping(affects: list[str], action: str) -> str:
    return SCOPING.replace("AFFECTS", repr(affects)).replace("ACTION", action)


@pytest.mark.parametrize(
    ("affects", "action"),
    [
        (["fs_*"], 'runtime.restrict(ToolRestriction(deny=["fs_write", "fs_read"]), AGENT)'),
        (["*"], 'runtime.restrict(ToolRestriction(allow=["fs_read"]), AGENT)'),
        (["fs_*"], 'runtime.defer_tools(["fs_*", "fs_big_*", "fs_read"])'),
        (["*"], 'runtime.defer_tools(["mcp__*"])'),
        (["*"], 'runtime.present_as("native", AGENT)'),
        (["*"], 'runtime.scoped(AGENT).present_as("native")'),
    ],
    ids=["deny-inside", "allow-list-with-star", "defer-inside", "defer-with-star", "present", "present-scoped"],
)
def test_scope_changes_inside_affects_are_made_in_strict_mode(loader: Loader, affects: list[str], action: str) -> None:
    host = tools_host(ToolRuntime(), "fs_read", "fs_write", "shell")
    _, report = loader.load({"p": scoping(affects, action)}, strict=True, runtime=host)
    assert report.ok and report.failed == () and [p.name for p in report.loaded] == ["p"]


@pytest.mark.parametrize(
    ("affects", "action", "message"),
    [
        (
            ["fs_*"],
            'runtime.restrict(ToolRestriction(deny=["fs_read", "shell"]), AGENT)',
            'plugin p may not restrict tool "shell": its DSH_CAPABILITIES affects fs_* (strict_capabilities)',
        ),
        (
            ["fs_*"],
            'runtime.scoped(AGENT).restrict(ToolRestriction(allow=["fs_read"]))',
            "plugin p may not restrict a scope to an allow list, which hides every other tool: its"
            ' DSH_CAPABILITIES affects fs_* (strict_capabilities; an allow list needs "*")',
        ),
        (
            ["fs_*"],
            'runtime.defer_tools(["fs_*", "f*"])',
            'plugin p may not defer tools matching "f*": its DSH_CAPABILITIES affects fs_* (strict_capabilities)',
        ),
        (
            [],
            'runtime.defer_tools(["fs_read"])',
            'plugin p may not defer tools matching "fs_read": its DSH_CAPABILITIES affects nothing'
            " (strict_capabilities)",
        ),
        (
            ["fs_*"],
            'runtime.present_as("native", AGENT)',
            'plugin p may not present a scope\'s tools as "native", which affects every tool of the scope: its'
            ' DSH_CAPABILITIES affects fs_* (strict_capabilities; a presentation needs "*")',
        ),
    ],
    ids=["deny-outside", "allow-list", "defer-outside", "defer-nothing", "present"],
)
def test_scope_changes_outside_affects_are_refused_in_strict_mode(
    loader: Loader, affects: list[str], action: str, message: str
) -> None:
    runtime, report = loader.load(
        {"p": scoping(affects, action)}, strict=True, runtime=tools_host(ToolRuntime(), "fs_read", "fs_write", "shell")
    )
    assert [(f.name, f.stage) for f in report.failed] == [("p", "setup")]
    assert message in report.failed[0].error
    assert [(r.plugin, r.tool, message in r.error) for r in report.refused] == [("p", None, True)]
    # Refused before anything changed: nothing to roll back, every tool as it was.
    agent = sys.modules[loader.prefix + "p"].AGENT
    assert runtime.names(agent) == ["fs_read", "fs_write", "shell"]
    assert runtime.deferred_tools() == [] and runtime.effective_mode(agent) == "native"


def test_scope_changes_are_not_checked_without_strict_mode(loader: Loader) -> None:
    action = 'runtime.restrict(ToolRestriction(deny=["shell"]), AGENT)'
    runtime, report = loader.load({"p": scoping([], action)}, strict=False, runtime=tools_host(ToolRuntime(), "shell"))
    assert report.ok and runtime.names(sys.modules[loader.prefix + "p"].AGENT) == []


def test_a_deferral_may_name_a_prefixed_tool_by_the_plugins_own_name(loader: Loader) -> None:
    action = 'runtime.defer_tools(["ex__fs_read", "ex__fs_*"])'
    _, report = loader.load({"p": scoping(["fs_*"], action)}, strict=True, tool_prefixes={"p": "ex"})
    assert report.ok and report.failed == ()
