"""Entry-point plugin loading: containment, ordering, setup rollback and validation.

Each test builds throw-away distributions (a package plus a ``*.dist-info``
with ``METADATA`` and ``entry_points.txt``) in a temporary directory on
``sys.path``; ``importlib.metadata`` discovers them there like installed ones.
Every test uses its own entry-point group and module prefix, so nothing leaks
between tests and the real ``dsh`` group of this checkout does not interfere.
"""

from __future__ import annotations

import gc
import importlib
import importlib.metadata
import itertools
import sys
import textwrap
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pluggy
import pytest

from dsh_core import Deny, ToolRuntime, define_tool, hookimpl
from dsh_core._config import DshConfig, load_config
from dsh_core._plugins import PluginReport, discover_entry_points, load_plugins
from dsh_core.testing import json_tool, make_input, make_runtime

_counter = itertools.count()


async def _none(args: object) -> None:
    return None


class Dists:
    """Builds distributions whose entry points live in a group private to one test."""

    def __init__(self, root: Path) -> None:
        self.root = root
        serial = next(_counter)
        self.group = f"dsh_test_{serial}"
        self.prefix = f"dshtest{serial}_"

    def module(self, name: str, source: str) -> str:
        """Write ``<prefix><name>.py`` and return its importable name."""
        full = self.prefix + name
        (self.root / f"{full}.py").write_text(textwrap.dedent(source))
        return full

    def dist(self, name: str, entry_points: dict[str, str], *, version: str = "1.0", group: str | None = None) -> None:
        """Declare distribution ``name`` with ``entry_points`` (values may use ``{p}`` for the module prefix)."""
        info = self.root / f"{name.replace('-', '_')}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        lines = [f"[{group or self.group}]"] + [
            f"{ep} = {value.format(p=self.prefix)}" for ep, value in entry_points.items()
        ]
        (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
        importlib.invalidate_caches()

    def load(
        self, runtime: ToolRuntime | None = None, config: DshConfig | None = None
    ) -> tuple[ToolRuntime, PluginReport]:
        runtime = runtime or ToolRuntime()
        return runtime, load_plugins(runtime, self.group, config)


@pytest.fixture
def dists(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Dists]:
    factory = Dists(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield factory
    for name in [m for m in sys.modules if m.startswith(factory.prefix)]:
        del sys.modules[name]
    importlib.invalidate_caches()


GOOD_MODULE = """
from dsh_core import hookimpl, define_tool

async def _echo(args):
    return args

@hookimpl
def dsh_setup(runtime, config):
    runtime.register(define_tool(
        name="echo", description="echo it", parameters={}, output={"type": "json"}, execute=_echo))
"""


# -- the good shapes ---------------------------------------------------------------


async def test_module_plugin_registers_its_tools(dists: Dists) -> None:
    dists.module("good", GOOD_MODULE)
    dists.dist("dsh-good", {"good": "{p}good"}, version="2.3")
    runtime, report = dists.load()
    assert report.ok
    (loaded,) = report.loaded
    assert (loaded.name, loaded.value, loaded.distribution, loaded.version) == (
        "good",
        dists.prefix + "good",
        "dsh-good",
        "2.3",
    )
    assert loaded.tools == ("echo",)
    assert runtime.plugins.has_plugin("good")
    result = await runtime.execute(make_input("echo", {"x": 1}))
    assert not result.is_error


def test_setup_receives_its_own_table_as_a_plain_dict(dists: Dists) -> None:
    dists.module(
        "cfg",
        """
        from dsh_core import hookimpl
        SEEN = []

        @hookimpl
        def dsh_setup(config):
            SEEN.append(config)
        """,
    )
    dists.dist("dsh-cfg", {"cfg": "{p}cfg", "other": "{p}cfg:Other"})
    (dists.root / f"{dists.prefix}cfg.py").write_text(
        (dists.root / f"{dists.prefix}cfg.py").read_text()
        + "\nclass Other:\n    @hookimpl\n    def dsh_setup(self, config):\n        SEEN.append(('other', config))\n"
    )
    config = DshConfig(plugins={"cfg": {"level": 3, "nested": {"a": [1]}}})
    _, report = dists.load(config=config)
    assert report.ok
    module = sys.modules[dists.prefix + "cfg"]
    # Each plugin's dsh_setup ran exactly once, with its own table ({} when it has none).
    assert module.SEEN == [{"level": 3, "nested": {"a": [1]}}, ("other", {})]
    assert type(module.SEEN[0]) is dict


def test_instance_plugin_and_per_runtime_state(dists: Dists) -> None:
    dists.module(
        "stateful",
        """
        from dsh_core import hookimpl

        class Policy:
            def __init__(self, runtime):
                self.runtime = runtime

            @hookimpl
            def dsh_tools_change(self):
                pass

        @hookimpl
        def dsh_setup(runtime, config):
            runtime.plugins.register(Policy(runtime), name="stateful-policy")
        """,
    )
    dists.dist("dsh-stateful", {"stateful": "{p}stateful"})
    first, report_a = dists.load()
    second, report_b = dists.load()
    assert report_a.ok and report_b.ok
    assert report_a.loaded[0].plugins == ("stateful", "stateful-policy")
    policy_a = first.plugins.get_plugin("stateful-policy")
    policy_b = second.plugins.get_plugin("stateful-policy")
    assert policy_a is not policy_b
    assert policy_a.runtime is first and policy_b.runtime is second


def test_object_entry_point(dists: Dists) -> None:
    dists.module(
        "obj",
        """
        from dsh_core import hookimpl

        class Observer:
            @hookimpl
            def dsh_result(self, execution, result):
                pass

        plugin = Observer()
        """,
    )
    dists.dist("dsh-obj", {"obj": "{p}obj:plugin"})
    runtime, report = dists.load()
    assert report.ok
    assert runtime.plugins.get_plugin("obj") is sys.modules[dists.prefix + "obj"].plugin


def test_class_entry_point_is_instantiated(dists: Dists) -> None:
    dists.module(
        "cls",
        """
        from dsh_core import hookimpl

        class Observer:
            @hookimpl
            def dsh_result(self, execution, result):
                pass
        """,
    )
    dists.dist("dsh-cls", {"cls": "{p}cls:Observer"})
    runtime, report = dists.load()
    assert report.ok
    plugin = runtime.plugins.get_plugin("cls")
    assert isinstance(plugin, sys.modules[dists.prefix + "cls"].Observer)


CLASS_ONLY_MODULE = """
from dsh_core import Deny, hookimpl

class NoDeletes:
    @hookimpl
    async def dsh_pre_execute(self, execution, next):
        return Deny("no deletes") if execution.name.startswith("delete") else await next()

class Helper:
    def dsh_result(self, execution, result):
        pass
"""


async def test_a_module_whose_hookimpls_are_in_a_class_fails_and_names_the_class(dists: Dists) -> None:
    """pluggy scans the module's attributes only: registered as it is, the policy would never run."""
    dists.module("policy", CLASS_ONLY_MODULE)
    dists.dist("dsh-policy", {"no-deletes": "{p}policy"})
    runtime, report = dists.load(make_runtime(json_tool("delete_all")))
    assert report.loaded == ()
    (failed,) = report.failed
    assert (failed.name, failed.stage) == ("no-deletes", "register")
    assert failed.error == (
        f"{dists.prefix}policy has no hookimpls, so it could do nothing; its class NoDeletes has some: "
        f'point the entry point at "{dists.prefix}policy:NoDeletes" (a class is instantiated with no arguments)'
    )
    assert not runtime.plugins.has_plugin("no-deletes")
    assert not (await runtime.execute(make_input("delete_all"))).is_error  # nothing half-loaded either way


def test_an_entry_point_with_no_hookimpls_at_all_fails(dists: Dists) -> None:
    dists.module("inert", "from dsh_core import hookimpl\n\nVALUE = 1\n")
    dists.dist("dsh-inert", {"inert": "{p}inert", "inert-object": "{p}inert:VALUE"})
    runtime, report = dists.load()
    assert report.loaded == ()
    assert [(failed.name, failed.stage, failed.error) for failed in report.failed] == [
        ("inert", "register", f"{dists.prefix}inert has no hookimpls, so it could do nothing"),
        ("inert-object", "register", f"{dists.prefix}inert:VALUE has no hookimpls, so it could do nothing"),
    ]
    assert runtime.plugins.get_plugins() == set()


def test_class_needing_arguments_is_rejected_clearly(dists: Dists) -> None:
    dists.module(
        "needy",
        """
        class Needy:
            def __init__(self, runtime):
                pass
        """,
    )
    dists.dist("dsh-needy", {"needy": "{p}needy:Needy"})
    runtime, report = dists.load()
    (failed,) = report.failed
    assert failed.stage == "import"
    assert "names the class Needy, which could not be instantiated without arguments" in failed.error
    assert not runtime.plugins.has_plugin("needy")


# -- containment -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "value", "expected"),
    [
        ("import this_dependency_is_not_installed_xyz\n", "{p}mod", "ModuleNotFoundError: No module named"),
        ("x = 1\n", "{p}mod:missing", "AttributeError:"),
        ("raise RuntimeError('boom at import')\n", "{p}mod", "RuntimeError: boom at import"),
        ("import sys\nsys.exit(3)\n", "{p}mod", "SystemExit(3): the plugin tried to exit the host"),
        (
            "import sys\nv = []\nfor _ in range(100_000):\n    v = [v]\nsys.exit(v)\n",
            "{p}mod",
            "SystemExit([[[[[[[...]]]]]]]): the plugin tried to exit the host",
        ),
        ("def broken(:\n", "{p}mod", "SyntaxError"),
    ],
    ids=["missing-dependency", "missing-attribute", "raises", "system-exit", "system-exit-too-deep", "syntax-error"],
)
def test_import_failures_are_reported_and_others_still_load(
    dists: Dists, source: str, value: str, expected: str
) -> None:
    dists.module("mod", source)
    dists.module("good", GOOD_MODULE)
    dists.dist("dsh-a-bad", {"bad": value})
    dists.dist("dsh-b-good", {"good": "{p}good"})
    runtime, report = dists.load()
    assert not report.ok
    (failed,) = report.failed
    assert (failed.name, failed.stage, failed.distribution, failed.version) == ("bad", "import", "dsh-a-bad", "1.0")
    assert expected in failed.error
    assert failed.traceback is not None
    assert [p.name for p in report.loaded] == ["good"]
    assert runtime.get("echo") is not None


def test_keyboard_interrupt_at_import_propagates(dists: Dists) -> None:
    dists.module("ctrlc", "raise KeyboardInterrupt\n")
    dists.dist("dsh-ctrlc", {"ctrlc": "{p}ctrlc"})
    with pytest.raises(KeyboardInterrupt):
        dists.load()


def test_invalid_hookimpl_fails_registration(dists: Dists) -> None:
    dists.module(
        "badargs",
        """
        from dsh_core import hookimpl

        @hookimpl
        def dsh_result(execution, outcome):
            pass
        """,
    )
    dists.dist("dsh-badargs", {"badargs": "{p}badargs"})
    runtime, report = dists.load()
    (failed,) = report.failed
    assert failed.stage == "register"
    assert failed.error.startswith("PluginValidationError:")
    assert "outcome" in failed.error
    assert not runtime.plugins.has_plugin("badargs")


TYPO_MODULE = """
        from dsh_core import hookimpl

        @hookimpl
        def dsh_setup(runtime, config):
            from dsh_core import define_tool
            async def body(args):
                return None
            runtime.register(define_tool(
                name="typo_tool", description="", parameters={}, output={"type": "json"}, execute=body))

        @hookimpl
        async def dsh_pre_exec(execution, next):
            return await next()
        """


def test_unknown_hook_is_reported_and_unregistered(dists: Dists) -> None:
    dists.module("typo", TYPO_MODULE)
    dists.dist("dsh-typo", {"typo": "{p}typo"})
    runtime, report = dists.load()
    assert report.loaded == ()
    (failed,) = report.failed
    assert failed.stage == "register"
    assert failed.error == 'PluginValidationError: unknown hook "dsh_pre_exec" (did you mean "dsh_pre_execute"?)'
    assert not runtime.plugins.has_plugin("typo")
    assert runtime.get("typo_tool") is None
    runtime.plugins.check_pending()  # nothing pending is left behind


def test_with_a_plain_pluggy_manager_an_unknown_hook_is_caught_at_validation(dists: Dists) -> None:
    """Only the runtime's own manager refuses at register(); the loader's final check still covers a plain one."""
    dists.module("typo", TYPO_MODULE)
    dists.dist("dsh-typo", {"typo": "{p}typo"})
    runtime, report = dists.load(ToolRuntime(plugins=pluggy.PluginManager("dsh")))
    (failed,) = report.failed
    assert failed.stage == "validate"
    assert failed.error == 'unknown hook "dsh_pre_exec" (did you mean "dsh_pre_execute"?)'
    assert not runtime.plugins.has_plugin("typo")
    assert runtime.get("typo_tool") is None


SHAPES_MODULE = """
from dsh_core import hookimpl

@hookimpl(wrapper=True)
def dsh_result(execution, result):
    return (yield)

@hookimpl
async def dsh_tools_change():
    pass
"""


@pytest.mark.parametrize(
    ("manager", "stage", "error"),
    [
        (None, "register", 'PluginValidationError: dsh_result of plugin "shapes" is a pluggy wrapper (wrapper=True), '
                           "which the runtime never runs on dsh_result: write a plain hookimpl; dsh_tools_change of "
                           'plugin "shapes" is an async def, but dsh_tools_change is called synchronously and its '
                           "coroutine would never run: make it a plain def"),
        (pluggy.PluginManager, "validate", 'dsh_result of plugin "shapes" is a pluggy wrapper (wrapper=True), which '
                                           "the runtime never runs on dsh_result: write a plain hookimpl; "
                                           'dsh_tools_change of plugin "shapes" is an async def, but dsh_tools_change '
                                           "is called synchronously and its coroutine would never run: make it a "
                                           "plain def"),
    ],
    ids=["runtime-manager", "plain-pluggy-manager"],
)  # fmt: skip
def test_a_plugin_with_hookimpls_the_runtime_never_runs_fails_and_leaves_nothing(
    dists: Dists, manager: Any, stage: str, error: str
) -> None:
    dists.module("shapes", SHAPES_MODULE)
    dists.dist("dsh-shapes", {"shapes": "{p}shapes"})
    runtime, report = dists.load(ToolRuntime(plugins=manager("dsh")) if manager else None)
    assert report.loaded == ()
    (failed,) = report.failed
    assert (failed.name, failed.stage, failed.error) == ("shapes", stage, error)
    assert not runtime.plugins.has_plugin("shapes")


@pytest.mark.parametrize(
    ("source", "kind"),
    [
        ("def dsh_result(execution, result):\n    yield", "a generator function"),
        ("async def dsh_result(execution, result):\n    yield", "an async generator"),
        ("async def dsh_pre_execute(execution, next):\n    yield await next()", "an async generator"),
    ],
    ids=["generator-observer", "async-generator-observer", "async-generator-listener"],
)
def test_a_hookimpl_that_yields_fails_its_plugin(dists: Dists, source: str, kind: str) -> None:
    """Calling it only made a generator: an audit observer wrote nothing, and check said nothing."""
    dists.module("yields", "from dsh_core import hookimpl\n\n@hookimpl\n" + source + "\n")
    dists.dist("dsh-yields", {"yields": "{p}yields"})
    runtime, report = dists.load()
    (failed,) = report.failed
    hook = source.split("(")[0].split()[-1]
    assert failed.error == (
        f'PluginValidationError: {hook} of plugin "yields" is {kind} (it yields), so its body would never run '
        f"on {hook}: remove the yield"
    )
    assert not runtime.plugins.has_plugin("yields")


def test_an_entry_point_naming_none_fails_instead_of_reading_as_disabled(dists: Dists) -> None:
    dists.module("empty", "plugin = None\n")
    dists.dist("dsh-empty", {"empty": "{p}empty:plugin"})
    _, report = dists.load()
    (failed,) = report.failed
    assert (failed.name, failed.stage) == ("empty", "import")
    assert "names None, not a plugin" in failed.error
    assert "empty" not in report.disabled


def test_a_plugin_whose_attribute_lookup_raises_fails_alone(dists: Dists) -> None:
    """A lazy proxy's __getattr__ raising RuntimeError crashed load_plugins and every dsh-tools command."""
    dists.module(
        "proxy",
        """
        class Lazy:
            def __getattr__(self, name):
                raise RuntimeError("backend not configured")

        plugin = Lazy()
        """,
    )
    dists.dist("dsh-proxy", {"proxy": "{p}proxy:plugin"})
    _, report = dists.load()
    (failed,) = report.failed
    assert (failed.name, failed.stage) == ("proxy", "import")
    assert failed.error == "reading its capabilities failed: RuntimeError: backend not configured"


def test_one_object_under_two_entry_point_names_says_which_plugin_holds_it(dists: Dists) -> None:
    """pluggy's message listed every registered plugin's repr: kilobytes over several lines."""
    dists.module("shared", "from dsh_core import hookimpl\n\n@hookimpl\ndef dsh_result(execution, result):\n    pass\n")
    dists.dist("dsh-shared", {"first": "{p}shared", "second": "{p}shared"})
    _, report = dists.load()
    (loaded,) = report.loaded
    (failed,) = report.failed
    assert (loaded.name, failed.name, failed.stage) == ("first", "second", "register")
    assert failed.error == (
        f"{dists.prefix}shared is already loaded as plugin 'first'; one object is registered once "
        "(two entry points, or two --plugin options, name it)"
    )


def test_unknown_hook_in_a_setup_registered_instance_rolls_back_its_owner(dists: Dists) -> None:
    dists.module(
        "owner",
        """
        from dsh_core import hookimpl

        class Inner:
            @hookimpl
            def dsh_resutl(self, execution, result):
                pass

        @hookimpl
        def dsh_setup(runtime, config):
            runtime.plugins.register(Inner(), name="owner-inner")
        """,
    )
    dists.dist("dsh-owner", {"owner": "{p}owner"})
    runtime, report = dists.load()
    (failed,) = report.failed
    assert (failed.name, failed.stage) == ("owner", "setup")
    assert failed.error == 'dsh_setup failed: PluginValidationError: unknown hook "dsh_resutl" (did you mean "dsh_result"?)'

    assert not runtime.plugins.has_plugin("owner")
    assert not runtime.plugins.has_plugin("owner-inner")


def test_optional_unknown_hooks_are_allowed(dists: Dists) -> None:
    dists.module(
        "optional",
        """
        from dsh_core import hookimpl

        @hookimpl(optionalhook=True)
        def dsh_future_hook():
            pass
        """,
    )
    dists.dist("dsh-optional", {"optional": "{p}optional"})
    _, report = dists.load()
    assert report.ok


FAILING_SETUP = """
from dsh_core import ToolRestriction, Agent, define_tool, hookimpl

async def _body(args):
    return None

def tool(name):
    return define_tool(name=name, description="", parameters={}, output={"type": "json"}, execute=_body)

class Helper:
    @hookimpl
    def dsh_result(self, execution, result):
        pass

AGENT = Agent(id="worker")

@hookimpl
def dsh_setup(runtime, config):
    runtime.register(tool("kept_before_failure"))
    runtime.scoped(AGENT).register(tool("scoped_tool"))
    runtime.guard(lambda execution: None)
    runtime.restrict(ToolRestriction(deny=["host_tool"]), AGENT)
    runtime.scoped(AGENT).present_as("both")
    runtime.plugins.register(Helper(), name="failing-helper")
    raise RuntimeError("setup exploded")
"""


async def test_failing_setup_rolls_back_tools_guards_and_plugins(dists: Dists) -> None:
    dists.module("failing", FAILING_SETUP)
    dists.module("good", GOOD_MODULE)
    dists.dist("dsh-failing", {"failing": "{p}failing"})
    dists.dist("dsh-good", {"good": "{p}good"})
    host = ToolRuntime()
    host.register(define_tool(name="host_tool", description="", parameters={}, output={"type": "json"}, execute=_none))
    runtime, report = dists.load(host)
    (failed,) = report.failed
    assert (failed.name, failed.stage) == ("failing", "setup")
    assert failed.error == "dsh_setup failed: RuntimeError: setup exploded"
    agent = sys.modules[dists.prefix + "failing"].AGENT
    assert runtime.get("kept_before_failure") is None
    assert runtime.get("scoped_tool", agent) is None
    assert [definition.name for _, definition in runtime.registrations()] == ["host_tool", "echo"]
    assert not runtime.plugins.has_plugin("failing")
    assert not runtime.plugins.has_plugin("failing-helper")
    # The guard is gone too: the good plugin's tool still runs.
    result = await runtime.execute(make_input("echo", {}))
    assert not result.is_error
    # So are the restriction and the presentation it declared for its agent.
    assert runtime.get("host_tool", agent) is not None
    assert runtime.effective_mode(agent) == "native"
    assert not runtime._recorders  # nothing records once loading is over


CAPTURING_SETUP = """
from dsh_core import define_tool, hookimpl

async def _body(args):
    return None

CAPTURED = []

@hookimpl
def dsh_setup(runtime, config):
    CAPTURED.append(runtime.register)
"""

USING_CAPTURED_SETUP = """
from dsh_core import define_tool, hookimpl
import {p}capturing as capturing

async def _body(args):
    return None

@hookimpl
def dsh_setup(runtime, config):
    capturing.CAPTURED[0](define_tool(
        name="late", description="", parameters={{}}, output={{"type": "json"}}, execute=_body))
    raise RuntimeError("second setup exploded")
"""


def test_registration_is_owned_by_the_setup_running_now_whatever_method_object_it_calls(dists: Dists) -> None:
    """A ``runtime.register`` kept from one plugin's setup and called in another's belongs to the second."""
    dists.module("capturing", CAPTURING_SETUP)
    dists.module("using", USING_CAPTURED_SETUP.format(p=dists.prefix))
    dists.dist("dsh-a-capturing", {"capturing": "{p}capturing"})
    dists.dist("dsh-b-using", {"using": "{p}using"})
    runtime, report = dists.load()
    (loaded,) = report.loaded
    (failed,) = report.failed
    assert (loaded.name, loaded.tools) == ("capturing", ())
    assert (failed.name, failed.stage) == ("using", "setup")
    # Rolled back with the plugin whose setup registered it.
    assert runtime.get("late") is None
    # After loading, the kept method registers as the host's, recorded by nobody.
    captured = sys.modules[dists.prefix + "capturing"].CAPTURED[0]
    with captured(sys.modules[dists.prefix + "using"].define_tool(
        name="later", description="", parameters={}, output={"type": "json"},
        execute=sys.modules[dists.prefix + "using"]._body,
    )):  # fmt: skip
        assert runtime.get("later") is not None
    assert runtime.get("later") is None


@pytest.mark.parametrize(
    "definition",
    [
        "async def dsh_setup(runtime, config):\n    RAN.append('body')",
        "async def dsh_setup(runtime, config):\n    RAN.append('body')\n    yield",
        "def dsh_setup(runtime, config):\n    RAN.append('body')\n    yield",
        "async def _steps():\n    RAN.append('body')\n    yield\n"
        "@hookimpl\ndef dsh_setup(runtime, config):\n    return _steps()",
    ],
    ids=["coroutine", "async-generator", "generator", "returns-an-async-generator"],
)
def test_a_setup_that_would_not_run_now_is_a_setup_failure(dists: Dists, definition: str) -> None:
    # An async generator's body never runs either: it was reported loaded, its setup skipped.
    dists.module("asyncsetup", "from dsh_core import hookimpl\nRAN = []\n@hookimpl\n" + definition + "\n")
    dists.dist("dsh-asyncsetup", {"asyncsetup": "{p}asyncsetup"})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        runtime, report = dists.load()
        gc.collect()
    (failed,) = report.failed
    assert (failed.name, failed.stage) == ("asyncsetup", "setup")
    assert failed.error == (
        "dsh_setup failed: TypeError: dsh_setup must be a plain (synchronous) function; it runs once at load time"
    )
    assert report.loaded == ()
    assert not runtime.plugins.has_plugin("asyncsetup")
    assert sys.modules[dists.prefix + "asyncsetup"].RAN == []
    assert [str(w.message) for w in caught] == []  # nothing left never awaited


def test_setup_calls_only_the_new_plugins_hookimpl(dists: Dists) -> None:
    dists.module(
        "counter",
        """
        from dsh_core import hookimpl
        CALLS = []

        class Counting:
            def __init__(self, label):
                self.label = label

            @hookimpl
            def dsh_setup(self, runtime, config):
                CALLS.append(self.label)

        first = Counting("first")
        second = Counting("second")
        third = Counting("third")
        """,
    )
    dists.dist("dsh-counter", {"a": "{p}counter:first", "b": "{p}counter:second", "c": "{p}counter:third"})
    _, report = dists.load()
    assert report.ok
    assert sys.modules[dists.prefix + "counter"].CALLS == ["first", "second", "third"]


def test_duplicate_tool_name_is_refused_and_attributed(dists: Dists) -> None:
    source = """
    from dsh_core import define_tool, hookimpl

    async def _body(args):
        return None

    @hookimpl
    def dsh_setup(runtime, config):
        try:
            runtime.register(define_tool(
                name="shared", description="", parameters={}, output={"type": "json"}, execute=_body))
        except Exception:
            if config.get("reraise"):
                raise
    """
    # One module per plugin: pluggy refuses to register the same object twice.
    dists.module("dup", source)
    dists.module("dup2", source)
    dists.dist("dsh-a", {"first": "{p}dup"})
    dists.dist("dsh-b", {"second": "{p}dup2"})
    config = DshConfig(plugins={"second": {"reraise": True}})
    _runtime, report = dists.load(config=config)
    assert [p.name for p in report.loaded] == ["first"]
    (failed,) = report.failed
    assert (failed.name, failed.stage) == ("second", "setup")
    assert 'tool "shared" is already registered' in failed.error
    (refusal,) = report.refused
    assert (refusal.plugin, refusal.tool, refusal.conflicts_with) == ("second", "shared", "first")


def test_refused_registration_is_recorded_even_when_caught(dists: Dists) -> None:
    dists.module(
        "badschema",
        """
        from dsh_core import define_tool, hookimpl
        import dsh_core

        async def _body(args):
            return None

        @hookimpl
        def dsh_setup(runtime, config):
            try:
                runtime.register(define_tool(
                    name="loose", description="", parameters={}, output={"type": "json"}, execute=_body))
                runtime.register(define_tool(
                    name="loose", description="", parameters={}, output={"type": "json"}, execute=_body))
            except dsh_core.RegistrationError:
                pass
        """,
    )
    dists.dist("dsh-badschema", {"badschema": "{p}badschema"})
    _, report = dists.load()
    assert report.ok
    (refusal,) = report.refused
    assert refusal.tool == "loose"
    assert refusal.conflicts_with == "badschema"
    assert refusal.definition is not None


# -- selection and order -----------------------------------------------------------


def test_disabled_plugins_are_not_imported(dists: Dists) -> None:
    dists.module("never", "raise RuntimeError('must not be imported')\n")
    dists.module("good", GOOD_MODULE)
    dists.dist("dsh-x", {"never": "{p}never", "good": "{p}good"})
    _runtime, report = dists.load(config=DshConfig(disabled_plugins=("never",)))
    assert report.ok
    assert report.disabled == ("never",)
    assert [p.name for p in report.loaded] == ["good"]
    assert dists.prefix + "never" not in sys.modules


def test_blocked_names_count_as_disabled(dists: Dists) -> None:
    dists.module("good", GOOD_MODULE)
    dists.dist("dsh-x", {"good": "{p}good"})
    runtime = ToolRuntime()
    runtime.plugins.set_blocked("good")
    _, report = dists.load(runtime)
    assert report.disabled == ("good",)
    assert report.loaded == ()


def test_order_is_sorted_by_distribution_then_name(dists: Dists) -> None:
    dists.module(
        "order",
        """
        from dsh_core import hookimpl
        ORDER = []

        class P:
            def __init__(self, label):
                self.label = label

            @hookimpl
            def dsh_setup(self):
                ORDER.append(self.label)

        a1, a2, b1, c1 = P("a1"), P("a2"), P("b1"), P("c1")
        """,
    )
    # Created in scrambled order: the file system may list them any way.
    dists.dist("zeta-dist", {"c1": "{p}order:c1"})
    dists.dist("Alpha-Dist", {"z_second": "{p}order:a2", "a_first": "{p}order:a1"})
    dists.dist("beta-dist", {"b1": "{p}order:b1"})
    _, report = dists.load()
    assert [p.name for p in report.loaded] == ["a_first", "z_second", "b1", "c1"]
    assert sys.modules[dists.prefix + "order"].ORDER == ["a1", "a2", "b1", "c1"]
    assert [ep.name for ep in discover_entry_points(dists.group)] == ["a_first", "z_second", "b1", "c1"]


SHARED_TOOL = """
from dsh_core import define_tool, hookimpl

DSH_CAPABILITIES = {"tools": ["shared"], "affects": []}

async def _body(args):
    return __name__

@hookimpl
def dsh_setup(runtime, config):
    runtime.register(define_tool(
        name="shared", description="", parameters={}, output={"type": "json"}, execute=_body))
"""


async def test_a_tool_prefix_lets_two_plugins_with_the_same_tool_name_load(dists: Dists) -> None:
    dists.module("same1", SHARED_TOOL)
    dists.module("same2", SHARED_TOOL)
    dists.dist("dsh-a", {"first": "{p}same1"})
    dists.dist("dsh-b", {"second": "{p}same2"})
    # strict_capabilities: the manifest names the plugin's own tool name, before the host's prefix.
    config = DshConfig(tool_prefixes={"second": "two"}, strict_capabilities=True)
    runtime, report = dists.load(config=config)
    assert report.ok and report.refused == ()
    assert sorted(runtime.names()) == ["shared", "two__shared"]
    assert [loaded.tools for loaded in report.loaded] == [("shared",), ("two__shared",)]
    renamed = await runtime.execute(make_input("two__shared"))
    assert renamed.value == dists.prefix + "same2"
    assert [schema.name for schema in runtime.schemas()] == ["shared", "two__shared"]


def test_duplicate_entry_point_names_first_wins(dists: Dists) -> None:
    dists.module("good", GOOD_MODULE)
    dists.module("other", "from dsh_core import hookimpl\n")
    dists.dist("dsh-b", {"same": "{p}other"})
    dists.dist("dsh-a", {"same": "{p}good"})
    _runtime, report = dists.load()
    (loaded,) = report.loaded
    assert (loaded.name, loaded.distribution) == ("same", "dsh-a")
    (failed,) = report.failed
    assert (failed.name, failed.distribution, failed.stage) == ("same", "dsh-b", "register")
    assert (
        failed.error
        == f'duplicate plugin name "same": already provided by dsh-a ({dists.prefix}good); this one was skipped'
    )
    assert dists.prefix + "other" not in sys.modules


def test_name_taken_by_a_host_plugin(dists: Dists) -> None:
    dists.module("good", GOOD_MODULE)
    dists.dist("dsh-x", {"good": "{p}good"})
    runtime = ToolRuntime()
    host_plugin = object()
    runtime.plugins.register(host_plugin, name="good")
    _, report = dists.load(runtime)
    (failed,) = report.failed
    assert failed.stage == "register"
    assert "already registered by the host" in failed.error
    assert runtime.plugins.get_plugin("good") is host_plugin


def test_name_taken_by_an_earlier_plugins_setup(dists: Dists) -> None:
    dists.module(
        "grabber",
        """
        from dsh_core import hookimpl

        @hookimpl
        def dsh_setup(runtime):
            runtime.plugins.register(object(), name="zz_victim")
        """,
    )
    dists.module("victim", "x = 1\n")
    dists.dist("dsh-x", {"grabber": "{p}grabber", "zz_victim": "{p}victim"})
    _, report = dists.load()
    (failed,) = report.failed
    assert failed.error == 'a plugin named "zz_victim" is already registered by plugin grabber\'s dsh_setup; skipped'
    assert dists.prefix + "victim" not in sys.modules


def test_loading_the_same_plugins_into_a_runtime_again_is_an_error(dists: Dists) -> None:
    """A second call would report every plugin "already registered by the host" and refuse to start."""
    dists.module("good", GOOD_MODULE)
    dists.dist("dsh-good", {"good": "{p}good"})
    runtime, first = dists.load()
    assert first.ok
    with pytest.raises(RuntimeError) as raised:
        dists.load(runtime)
    assert str(raised.value) == (
        "plugins were already loaded into this runtime by an earlier load_plugins() call: good; "
        "load a runtime's plugins once (entry_points= loads others)"
    )
    assert runtime.plugins.has_plugin("good") and runtime.names() == ["echo"]


def test_other_plugins_may_be_loaded_into_a_runtime_later(dists: Dists) -> None:
    dists.module("good", GOOD_MODULE)
    dists.module("observer", "from dsh_core import hookimpl\n\n@hookimpl\ndef dsh_result(execution, result):\n    pass\n")
    runtime = ToolRuntime()
    point = importlib.metadata.EntryPoint(name="good", value=dists.prefix + "good", group=dists.group)
    assert load_plugins(runtime, dists.group, entry_points=[point]).ok
    later = importlib.metadata.EntryPoint(name="observer", value=dists.prefix + "observer", group=dists.group)
    assert [loaded.name for loaded in load_plugins(runtime, dists.group, entry_points=[later]).loaded] == ["observer"]
    runtime.plugins.unregister(name="observer")  # the host took it out: loading it again is a fresh start
    assert [loaded.name for loaded in load_plugins(runtime, dists.group, entry_points=[later]).loaded] == ["observer"]


def test_no_entry_points_is_an_empty_ok_report(dists: Dists) -> None:
    _, report = dists.load()
    assert report == PluginReport()
    assert report.ok


def test_explicit_entry_points_replace_discovery(dists: Dists) -> None:
    dists.module("good", GOOD_MODULE)
    runtime = ToolRuntime()
    point = importlib.metadata.EntryPoint(name="adhoc", value=dists.prefix + "good", group=dists.group)
    report = load_plugins(runtime, dists.group, entry_points=[point])
    (loaded,) = report.loaded
    assert (loaded.name, loaded.distribution, loaded.version) == ("adhoc", None, None)
    assert runtime.get("echo") is not None


class _TypoPolicy:
    @hookimpl
    async def dsh_pre_exectue(self, execution: Any, next: Any) -> Any:
        return Deny("never applied")


class _FutureHooks:
    @hookimpl(optionalhook=True)
    def dsh_future_hook(self) -> None:
        pass


async def test_a_host_registering_a_misspelt_policy_is_refused_not_silently_ignored() -> None:
    """A deny-everything policy whose hook name is misspelt would never run: refuse it at register()."""
    runtime = make_runtime(json_tool("echo"))
    policy = _TypoPolicy()
    with pytest.raises(pluggy.PluginValidationError) as raised:
        runtime.plugins.register(policy, name="typo-policy")
    assert str(raised.value) == 'unknown hook "dsh_pre_exectue" (did you mean "dsh_pre_execute"?)'
    assert not runtime.plugins.is_registered(policy)
    runtime.plugins.check_pending()  # nothing of it is left behind
    runtime.plugins.register(_FutureHooks(), name="future")  # optionalhook: allowed
    assert not (await runtime.execute(make_input("echo", {}))).is_error


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: load_plugins(None), "load_plugins() takes a ToolRuntime, got NoneType"),  # type: ignore[arg-type]
        (lambda: load_plugins(ToolRuntime(), "", None), "group must be a non-empty entry-point group name, got ''"),
        (lambda: load_plugins(ToolRuntime(), config={}),  # type: ignore[arg-type]
         "config must be a DshConfig (see load_config) or None, got dict"),
        (lambda: load_plugins(ToolRuntime(), entry_points=["pkg.module"]),  # type: ignore[list-item]
         "entry_points holds importlib.metadata.EntryPoint items, got str at position 0"),
    ],
    ids=["runtime", "group", "config", "entry-points"],
)  # fmt: skip
def test_load_plugins_refuses_arguments_of_the_wrong_kind(call: Any, message: str) -> None:
    with pytest.raises(TypeError) as raised:
        call()
    assert str(raised.value) == message


def test_every_first_party_plugin_loads_through_its_entry_point_at_once(tmp_path: Path) -> None:
    # Each plugin's module is registered under its entry-point name: an object a plugin
    # registers must be named otherwise, or loading fails (only the real loader shows it).
    config = DshConfig(
        strict_capabilities=True,
        plugins={
            "timeout": {"default_ms": 30_000},
            "permissions": {"rules": [{"tool": "bash", "action": "ask"}]},
            "audit": {"path": str(tmp_path / "audit.jsonl")},
            "files": {"root": str(tmp_path)},
            "shell": {"root": str(tmp_path)},
            "spill": {"max_inline_bytes": 4096, "directory": str(tmp_path / "spill")},
            "ledger": {"path": str(tmp_path / "effects.jsonl")},
            "limits": {"max_calls": 100},
            "otel": {"enabled": True},
            "undo": {"enabled": True},
            "tool_search": {"enabled": True, "defer": ["grep"]},
        },
    )
    points = [point for point in discover_entry_points() if point.value.startswith("dsh_plugins.")]
    assert {point.name for point in points} >= set(config.plugins) | {"mcp"}
    runtime = ToolRuntime()
    report = load_plugins(runtime, config=config, entry_points=points)
    assert [(failed.name, failed.error) for failed in report.failed] == []
    for name in ("timeout-policy", "call-limits", "otel-tracing", "undo-log", "tool-search", "effect-ledger"):
        assert runtime.plugins.get_plugin(name) is not None, name
    assert "grep" not in [schema.name for schema in runtime.schemas()]
    assert "search_tools" in runtime.names()
    # The catalogue a model is shown: every tool harvested has an object at its parameters' root.
    catalogue = runtime.schemas()
    assert len(catalogue) >= 7  # files, shell, spill and tool_search (grep deferred)
    assert [s.name for s in catalogue if s.parameters.get("type") != "object"] == []


def test_a_taken_plugin_name_is_reported_readably() -> None:
    runtime = ToolRuntime()
    runtime.plugins.register(object(), name="taken")
    with pytest.raises(ValueError) as info:
        runtime.plugins.register(object(), name="taken")
    assert str(info.value) == "plugin name 'taken' is already taken by object; register this object under another name"


CONFIG_CHECKING_MODULE = """
import attrs
from dsh_core import hookimpl, structure_table

@attrs.frozen
class Settings:
    level: int = 0

@hookimpl
def dsh_setup(runtime, config):
    structure_table(Settings, config, "[plugins.strict]")
"""


def test_configuration_failures_are_reported_with_every_violation(dists: Dists) -> None:
    dists.module("strict", CONFIG_CHECKING_MODULE)
    dists.module("fine", CONFIG_CHECKING_MODULE)
    dists.module("broken", "raise ImportError('gone')")
    dists.dist("dsh-cfg", {"strict": "{p}strict", "broken": "{p}broken", "unset": "{p}broken", "fine": "{p}fine"})
    config = DshConfig(plugins={"strict": {"level": "3", "extra": 1}, "broken": {"x": 1}, "fine": {"level": 1}})
    _, report = dists.load(config=config)
    by_name = {failed.name: failed for failed in report.failed}
    assert set(by_name) == {"strict", "broken", "unset"}
    assert by_name["strict"].stage == "setup" and by_name["strict"].configured
    assert set(by_name["strict"].violations) == {
        '[plugins.strict]: unknown key "extra" (allowed: level)',
        '[plugins.strict].level: expected an integer, got "3"',
    }
    assert (by_name["broken"].configured, by_name["broken"].violations) == (True, ())
    assert (by_name["unset"].configured, by_name["unset"].violations) == (False, ())
    # What a host must not run without: a rejected table, and a configured plugin that is missing.
    assert [failed.name for failed in report.config_failures] == ["broken", "strict"]


@pytest.mark.parametrize(
    ("file", "text", "table"),
    [
        ("dsh.toml", '[plugins.strict]\nlevel = "3"\n', "[plugins.strict]"),
        ("pyproject.toml", '[tool.dsh.plugins.strict]\nlevel = "3"\n', "[tool.dsh.plugins.strict]"),
    ],
)
def test_a_rejected_table_is_named_with_its_file_and_its_real_table(
    dists: Dists, tmp_path: Path, file: str, text: str, table: str
) -> None:
    # The plugin names its table [plugins.strict]; in pyproject.toml that table is [tool.dsh.plugins.strict].
    dists.module("strict", CONFIG_CHECKING_MODULE)
    dists.dist("dsh-cfg", {"strict": "{p}strict"})
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / file).write_text(text)
    config = load_config(cwd=tmp_path / "conf")
    assert config.plugin_table("strict") == table
    _, report = dists.load(config=config)
    (failed,) = report.config_failures
    violation = f'{tmp_path / "conf" / file}: {table}.level: expected an integer, got "3"'
    assert failed.violations == (violation,)
    assert failed.error == f"dsh_setup failed: ConfigError: invalid configuration: {violation}"


def test_a_table_no_plugin_reads_is_a_configuration_failure(dists: Dists) -> None:
    # A host that refuses to run while config_failures is non-empty must see a misspelt table too.
    dists.module("fine", CONFIG_CHECKING_MODULE)
    dists.dist("dsh-cfg", {"permissions": "{p}fine", "off": "{p}fine"})
    config = DshConfig(
        plugins={"permisions": {"default": "deny"}, "zzz": {}, "permissions": {}, "off": {}},
        disabled_plugins=["off"],
    )
    _, report = dists.load(config=config)
    assert [plugin.name for plugin in report.loaded] == ["permissions"]
    assert report.failed == ()
    assert [(t.name, t.stage, t.configured, t.suggestion) for t in report.unmatched_tables] == [
        ("permisions", "config", True, "permissions"),
        ("zzz", "config", True, None),
    ]
    assert [t.error for t in report.unmatched_tables] == [
        '[plugins.permisions] configures no installed plugin (did you mean "permissions"?)',
        "[plugins.zzz] configures no installed plugin",
    ]
    assert report.config_failures == report.unmatched_tables


def test_a_table_for_an_installed_plugin_left_out_of_entry_points_is_not_unmatched(dists: Dists) -> None:
    dists.module("fine", CONFIG_CHECKING_MODULE)
    dists.dist("dsh-cfg", {"fine": "{p}fine", "other": "{p}fine"})
    runtime = ToolRuntime()
    chosen = [point for point in discover_entry_points(dists.group) if point.name == "fine"]
    report = load_plugins(runtime, dists.group, DshConfig(plugins={"other": {}}), entry_points=chosen)
    assert report.unmatched_tables == () and report.config_failures == ()


def test_a_table_for_a_plugin_that_reads_no_configuration_is_reported_as_ignored(dists: Dists) -> None:
    # pluggy lets a hookimpl take fewer arguments than the spec: dsh_setup(runtime) never sees its table.
    dists.module("nosetup", "from dsh_core import hookimpl\n\n@hookimpl\ndef dsh_result(execution, result):\n    pass\n")
    dists.module("noconfig", "from dsh_core import hookimpl\n\n@hookimpl\ndef dsh_setup(runtime):\n    pass\n")
    dists.module("reads", CONFIG_CHECKING_MODULE)
    dists.dist("dsh-cfg", {"nosetup": "{p}nosetup", "noconfig": "{p}noconfig", "reads": "{p}reads"})
    config = DshConfig(plugins={"nosetup": {"block": ["calc"]}, "noconfig": {"limit": 1}, "reads": {"level": 1}})
    _, report = dists.load(config=config)
    assert sorted(plugin.name for plugin in report.loaded) == ["noconfig", "nosetup", "reads"]
    assert report.ignored_tables == ("noconfig", "nosetup")
    assert report.config_failures == ()  # a warning: the plugin runs as it would without the table


def test_a_config_error_without_a_table_is_a_configuration_failure_too(dists: Dists) -> None:
    dists.module(
        "needs",
        """
        from dsh_core import ConfigError, hookimpl

        @hookimpl
        def dsh_setup(runtime, config):
            raise ConfigError(["[plugins.needs].token: required"])
        """,
    )
    dists.dist("dsh-needs", {"needs": "{p}needs"})
    _, report = dists.load()
    (failed,) = report.config_failures
    assert (failed.configured, failed.violations) == (False, ("[plugins.needs].token: required",))


def test_a_configured_name_two_distributions_provide_is_a_configuration_failure(dists: Dists) -> None:
    """Which one the table configures depends on the sort order: a squatter would silently win."""
    dists.module("good", GOOD_MODULE)
    dists.module("squat", "from dsh_core import hookimpl\n\n@hookimpl\ndef dsh_result(execution, result):\n    pass\n")
    dists.dist("acme-squat", {"same": "{p}squat"})
    dists.dist("dsh-real", {"same": "{p}good"})
    _, report = dists.load(config=DshConfig(plugins={"same": {"level": 1}}))
    assert [(loaded.name, loaded.distribution) for loaded in report.loaded] == [("same", "acme-squat")]
    (failed,) = report.config_failures
    assert (failed.name, failed.distribution, failed.configured) == ("same", "dsh-real", True)
    assert failed.shadowed_by == f"acme-squat ({dists.prefix}squat)"
    # Without a table nothing is configured wrongly: the skipped one is only reported.
    _, unconfigured = dists.load()
    assert [failed.shadowed_by for failed in unconfigured.failed] == [f"acme-squat ({dists.prefix}squat)"]
    assert unconfigured.config_failures == ()


@pytest.mark.parametrize("squatter", ["acme-timeout", "dsh-timeout", "zz-timeout"])
def test_a_first_party_plugin_keeps_its_name_wherever_a_squatter_sorts(dists: Dists, squatter: str) -> None:
    """A third-party entry point named like a bundled plugin is skipped, not the bundled one.

    ``dsh-timeout`` (what ``new-plugin dsh-timeout`` makes) sorts before ``dsh-tools``: it used
    to take the name, and declared timeouts silently stopped being enforced.
    """
    dists.module("own", GOOD_MODULE)
    dists.module("squat", SQUAT_MODULE)
    dists.dist("dsh-tools", {"timeout": "{p}own"})
    dists.dist(squatter, {"timeout": "{p}squat"})
    _, report = dists.load()
    assert [(loaded.name, loaded.distribution) for loaded in report.loaded] == [("timeout", "dsh-tools")]
    (failed,) = report.failed
    assert (failed.name, failed.distribution, failed.stage) == ("timeout", squatter, "register")
    assert failed.shadowed_by == f"dsh-tools ({dists.prefix}own)"
    assert failed.error == (
        f'duplicate plugin name "timeout": it is dsh-tools\' own plugin ({dists.prefix}own), which keeps it; '
        f"{squatter} ({dists.prefix}squat) was skipped: uninstall it or rename its entry point"
    )
    assert dists.prefix + "squat" not in sys.modules
    # Unconfigured, the bundled plugin runs and the squatter is only reported; configured, the
    # table may have been meant for either, so a host that runs calls still refuses.
    assert report.config_failures == ()
    _, configured = dists.load(config=DshConfig(plugins={"timeout": {}}))
    assert [failed.distribution for failed in configured.config_failures] == [squatter]


SQUAT_MODULE = """
from dsh_core import hookimpl

@hookimpl
def dsh_result(execution, result):
    pass
"""


def test_a_configured_duplicate_is_no_configuration_failure_when_its_name_loaded(dists: Dists) -> None:
    dists.module("first", GOOD_MODULE)
    dists.dist("dsh-a", {"same": "{p}first"})
    dists.dist("dsh-b", {"same": "{p}first"})
    _, report = dists.load(config=DshConfig(plugins={"same": {}}))
    assert [failed.stage for failed in report.failed] == ["register"]
    assert report.config_failures == ()


def _without_cwd(monkeypatch: pytest.MonkeyPatch, cwd: Path) -> None:
    """``sys.path`` as a console script has it: neither ``""`` nor the working directory on it."""
    kept = [p for p in sys.path if p and Path(p).resolve() != cwd.resolve()]
    monkeypatch.setattr(sys, "path", kept)


def test_a_module_in_the_working_directory_that_cannot_be_imported_names_the_import_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``dsh-tools --plugin mymod:Cls`` next to ``mymod.py``: the console script does not import from there."""
    module = f"dshtest_cwd_{next(_counter)}"
    (tmp_path / f"{module}.py").write_text(GOOD_MODULE)
    monkeypatch.chdir(tmp_path)
    _without_cwd(monkeypatch, tmp_path)
    point = importlib.metadata.EntryPoint(name="mine", value=module, group="dsh")
    report = load_plugins(ToolRuntime(), entry_points=[point])
    (failed,) = report.failed
    assert failed.stage == "import"
    assert failed.error == (
        f"ModuleNotFoundError: No module named '{module}' ({module}.py is in the current directory, which is not "
        "on Python's import path: run with PYTHONPATH=. or install its project with pip install -e .)"
    )


def test_a_missing_module_elsewhere_gets_no_working_directory_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    _without_cwd(monkeypatch, tmp_path)
    point = importlib.metadata.EntryPoint(name="mine", value="dshtest_nowhere_xyz:Policy", group="dsh")
    (failed,) = load_plugins(ToolRuntime(), entry_points=[point]).failed
    assert failed.error == "ModuleNotFoundError: No module named 'dshtest_nowhere_xyz'"
