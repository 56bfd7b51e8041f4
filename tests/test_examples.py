"""The example distributions (examples/) through the runtime, and their discovery through entry points."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from dsh_core import (
    Agent,
    ConfigError,
    Deny,
    Parallel,
    ToolExecutionFailure,
    ToolExecutionInput,
    ToolExecutionResult,
    ToolExecutionSuccess,
    ToolRuntime,
    hookimpl,
    run_tool_calls,
    thaw,
)
from dsh_core.presentation import GenericCallView, ReadFileLine, ReadResultView
from dsh_core.testing import json_tool, make_input, make_runtime

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "examples"

if importlib.util.find_spec("dsh_example_tools") is None:  # not installed: import them from the tree
    sys.path[:0] = [str(EXAMPLES / "dsh-example-tools"), str(EXAMPLES / "dsh-example-policy")]
from dsh_example_policy import rate_limit, tidy_paths, workspace  # noqa: E402
from dsh_example_tools import calc_tool, http_status_tool, read_file_tool  # noqa: E402
from dsh_example_tools import dsh_setup as tools_setup  # noqa: E402


def code(result: ToolExecutionResult) -> str | None:
    assert isinstance(result, ToolExecutionFailure), result
    return result.code


def value(result: ToolExecutionResult) -> Any:
    assert isinstance(result, ToolExecutionSuccess), result
    return thaw(result.value)


# -- calc ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("op", "a", "b", "expected"),
    [
        ("add", 2, 40, 42),
        ("sub", 2, 5, -3),
        ("mul", 6, 7, 42),
        ("div", 84, 2, 42),
        ("div", 7, 2, 3.5),
        ("add", 0.5, 0.25, 0.75),
        ("mul", -1.0, 0, 0.0),  # no negative zero in JSON
        ("mul", 10**30, 10**30, 10**60),
    ],
)
async def test_calc(op: str, a: float, b: float, expected: float) -> None:
    result = value(await make_runtime(calc_tool()).execute(make_input("calc", {"op": op, "a": a, "b": b})))
    assert result == expected
    assert type(result) is type(expected)


async def test_calc_integer_result_for_integer_operands_only() -> None:
    runtime = make_runtime(calc_tool())
    assert type(value(await runtime.execute(make_input("calc", {"op": "add", "a": 1, "b": 2})))) is int
    assert type(value(await runtime.execute(make_input("calc", {"op": "add", "a": 1.0, "b": 2})))) is float


async def test_calc_renders_the_equation() -> None:
    result = await make_runtime(calc_tool()).execute(make_input("calc", {"op": "mul", "a": 6, "b": 7}))
    assert [block.text for block in result.content] == ["6 * 7 = 42"]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("arguments", "expected_code", "message"),
    [
        ({"op": "div", "a": 1, "b": 0}, "CALC_ERROR", "division by zero: 1 / 0"),
        ({"op": "div", "a": 1.5, "b": 0.0}, "CALC_ERROR", "division by zero: 1.5 / 0.0"),
        ({"op": "mul", "a": 1e308, "b": 10}, "CALC_ERROR", "1e+308 * 10 has no finite result"),
        ({"op": "add", "a": 10**400, "b": 0.5}, "CALC_ERROR", "is too large to compute"),
        ({"op": "pow", "a": 2, "b": 3}, "INVALID_ARGS", '"op" must be one of'),
        ({"op": "add", "a": True, "b": 1}, "INVALID_ARGS", '"a" must be a number'),
        ({"op": "add", "a": 1}, "INVALID_ARGS", "b"),
    ],
)
async def test_calc_errors_are_clean_tool_errors(arguments: dict[str, Any], expected_code: str, message: str) -> None:
    result = await make_runtime(calc_tool()).execute(make_input("calc", arguments))
    assert code(result) == expected_code
    assert isinstance(result, ToolExecutionFailure) and message in result.error.message


def test_calc_is_parallel_safe_and_presents_the_expression() -> None:
    tool = calc_tool()
    runtime = make_runtime(tool)
    assert runtime.execution_mode(make_input("calc", {"op": "add", "a": 1, "b": 2})) == Parallel()
    assert tool.present_call is not None
    view = tool.present_call({"op": "add", "a": 1, "b": 2})
    assert isinstance(view, GenericCallView) and view.title == "1 + 2"


# -- read_file ----------------------------------------------------------------------------------


@pytest.fixture
def workspace_root(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "src").mkdir(parents=True)
    (root / "src" / "main.py").write_text("".join(f"line {n}\n" for n in range(1, 11)), encoding="utf-8")
    (tmp_path / "secret.txt").write_text("top secret\n", encoding="utf-8")
    return root


async def test_read_file_returns_a_numbered_window(workspace_root: Path) -> None:
    runtime = make_runtime(read_file_tool(workspace_root))
    result = value(await runtime.execute(make_input("read_file", {"path": "src/main.py", "offset": 3, "limit": 2})))
    assert result == {
        "path": "src/main.py",
        "offset": 3,
        "lines": [{"number": 3, "text": "line 3"}, {"number": 4, "text": "line 4"}],
        "total_lines": 10,
    }


async def test_read_file_defaults_and_absolute_paths_inside_the_root(workspace_root: Path) -> None:
    runtime = make_runtime(read_file_tool(workspace_root))
    result = value(await runtime.execute(make_input("read_file", {"path": str(workspace_root / "src" / "main.py")})))
    assert result["offset"] == 1 and len(result["lines"]) == 10 and result["path"] == "src/main.py"


async def test_read_file_past_the_end_is_an_empty_window(workspace_root: Path) -> None:
    runtime = make_runtime(read_file_tool(workspace_root))
    result = await runtime.execute(make_input("read_file", {"path": "src/main.py", "offset": 50}))
    assert value(result)["lines"] == [] and value(result)["total_lines"] == 10
    assert "no lines from 50" in result.content[0].text  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("../secret.txt", "outside the workspace root"),
        ("src/../../secret.txt", "outside the workspace root"),
        ("/etc/passwd", "outside the workspace root"),
        ("src/missing.py", "no such file"),
        ("src", "not a regular file"),
        ("a\x00b", "NUL"),
    ],
)
async def test_read_file_refuses(workspace_root: Path, path: str, message: str) -> None:
    runtime = make_runtime(read_file_tool(workspace_root))
    result = await runtime.execute(make_input("read_file", {"path": path}))
    assert code(result) == "READ_FILE_ERROR"
    assert isinstance(result, ToolExecutionFailure) and message in result.error.message


async def test_read_file_refuses_symlinks_that_escape(workspace_root: Path) -> None:
    (workspace_root / "link.txt").symlink_to(workspace_root.parent / "secret.txt")
    (workspace_root / "outside").symlink_to(workspace_root.parent)
    runtime = make_runtime(read_file_tool(workspace_root))
    for path in ("link.txt", "outside/secret.txt"):
        assert code(await runtime.execute(make_input("read_file", {"path": path}))) == "READ_FILE_ERROR"


async def test_read_file_follows_symlinks_that_stay_inside(workspace_root: Path) -> None:
    (workspace_root / "alias.py").symlink_to(workspace_root / "src" / "main.py")
    runtime = make_runtime(read_file_tool(workspace_root))
    result = value(await runtime.execute(make_input("read_file", {"path": "alias.py", "limit": 1})))
    assert result["path"] == "src/main.py" and result["lines"] == [{"number": 1, "text": "line 1"}]


async def test_read_file_refuses_binary_files(workspace_root: Path) -> None:
    (workspace_root / "blob.bin").write_bytes(b"\x00\x01\x02")
    runtime = make_runtime(read_file_tool(workspace_root))
    assert code(await runtime.execute(make_input("read_file", {"path": "blob.bin"}))) == "READ_FILE_ERROR"


@pytest.mark.parametrize("window", [{"offset": 0}, {"limit": 0}])
async def test_read_file_window_must_be_positive(workspace_root: Path, window: dict[str, int]) -> None:
    runtime = make_runtime(read_file_tool(workspace_root))
    result = await runtime.execute(make_input("read_file", {"path": "src/main.py", **window}))
    assert code(result) == "READ_FILE_ERROR"


async def test_read_file_presents_a_read_card(workspace_root: Path) -> None:
    tool = read_file_tool(workspace_root)
    runtime = make_runtime(tool)
    arguments = {"path": "src/main.py", "limit": 1}
    result = await runtime.execute(make_input("read_file", arguments))
    assert tool.present_result is not None and tool.present_call is not None
    card = tool.present_result(arguments, result)
    assert card == ReadResultView(
        path="src/main.py", offset=1, lines=[ReadFileLine(number=1, text="line 1")], total_lines=10, lang="python"
    )
    failed = await runtime.execute(make_input("read_file", {"path": "nope"}))
    assert tool.present_result({"path": "nope"}, failed) is None
    call_card = tool.present_call(arguments)
    assert isinstance(call_card, GenericCallView) and call_card.kind == "read"


def test_read_file_is_parallel_safe(workspace_root: Path) -> None:
    runtime = make_runtime(read_file_tool(workspace_root))
    assert runtime.execution_mode(make_input("read_file", {"path": "x"})) == Parallel()


def test_example_tools_reject_a_missing_root(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is not a directory"):
        tools_setup(ToolRuntime(), {"root": str(tmp_path / "nope")})


# -- http_status_lookup -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        (404, {"code": 404, "phrase": "Not Found", "class": "client error", "registered": True}),
        (200, {"code": 200, "phrase": "OK", "class": "success", "registered": True}),
        (503, {"code": 503, "phrase": "Service Unavailable", "class": "server error", "registered": True}),
        (299, {"code": 299, "phrase": None, "class": "success", "registered": False}),
    ],
)
async def test_http_status_lookup(status: int, expected: dict[str, Any]) -> None:
    runtime = make_runtime(http_status_tool())
    assert value(await runtime.execute(make_input("http_status_lookup", {"code": status}))) == expected


@pytest.mark.parametrize("status", [99, 600, -1])
async def test_http_status_lookup_refuses_non_status_numbers(status: int) -> None:
    runtime = make_runtime(http_status_tool())
    assert code(await runtime.execute(make_input("http_status_lookup", {"code": status}))) == "UNKNOWN_STATUS"


async def test_http_status_lookups_run_in_parallel() -> None:
    runtime = make_runtime(http_status_tool())
    calls = [make_input("http_status_lookup", {"code": status}) for status in (200, 301, 404)]
    assert all(runtime.execution_mode(call) == Parallel() for call in calls)
    results = await run_tool_calls(runtime, calls)
    assert [value(result)["phrase"] for result in results] == ["OK", "Moved Permanently", "Not Found"]


# -- rate limit ---------------------------------------------------------------------------------


def limited(config: dict[str, Any], *names: str) -> ToolRuntime:
    runtime = make_runtime(*(json_tool(name) for name in names or ("t",)))
    rate_limit.dsh_setup(runtime, config)
    return runtime


async def test_rate_limit_denies_beyond_max_calls_in_the_window(autojump_clock: trio.testing.MockClock) -> None:
    runtime = limited({"max_calls": 2, "window_s": 10}, "t", "other")
    assert not (await runtime.execute(make_input("t"))).is_error
    await trio.sleep(4)
    assert not (await runtime.execute(make_input("t"))).is_error
    third = await runtime.execute(make_input("t"))
    assert code(third) == "DENIED"
    assert isinstance(third, ToolExecutionFailure)
    assert third.error.message == 'rate limit: tool "t" may run at most 2 times per 10 s; try again in 6.0 s'
    assert third.error.info is not None and third.error.info.plugin == "rate-limiter"
    assert not (await runtime.execute(make_input("other"))).is_error  # per tool
    await trio.sleep(6)  # the first call's slot frees
    assert not (await runtime.execute(make_input("t"))).is_error
    assert code(await runtime.execute(make_input("t"))) == "DENIED"


async def test_denied_calls_do_not_use_up_the_window(autojump_clock: trio.testing.MockClock) -> None:
    runtime = limited({"max_calls": 1, "window_s": 10})
    await runtime.execute(make_input("t"))
    for _ in range(5):
        assert code(await runtime.execute(make_input("t"))) == "DENIED"
    await trio.sleep(10)
    assert not (await runtime.execute(make_input("t"))).is_error


async def test_rate_limit_applies_only_to_its_tools(autojump_clock: trio.testing.MockClock) -> None:
    runtime = limited({"max_calls": 1, "tools": ["write_*"]}, "write_file", "read_file")
    for _ in range(3):
        assert not (await runtime.execute(make_input("read_file"))).is_error
    await runtime.execute(make_input("write_file"))
    assert code(await runtime.execute(make_input("write_file"))) == "DENIED"


async def test_a_rewritten_call_counts_once(autojump_clock: trio.testing.MockClock) -> None:
    # The rewrite makes the pre-execute stage run twice for one call; the limiter sees it twice.
    runtime = make_runtime(json_tool("read", parameters={"path": {"type": "string", "required": True}}))
    rate_limit.dsh_setup(runtime, {"max_calls": 1, "window_s": 10})
    tidy_paths.dsh_setup(runtime, {})
    result = await runtime.execute(make_input("read", {"path": "./a"}))
    assert not result.is_error, result
    assert value(result) == {"path": "a"}
    assert code(await runtime.execute(make_input("read", {"path": "b"}))) == "DENIED"  # the one slot is taken


# -- tidy paths ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "tidied"),
    [
        ("./a//b/./c", "a/b/c"),
        ("a/b", "a/b"),
        ("/abs//x/", "/abs/x/"),  # a trailing slash names a directory: it stays
        ("dir/", "dir/"),
        ("", ""),  # an empty path is the tool's to refuse, never the workspace root
        ("./", "."),
        ("/", "/"),
        ("../up/./x", "../up/x"),  # ".." is the workspace guard's business, never dropped here
        ("a/../b", "a/../b"),
        ("./-rf", "./-rf"),  # "-rf" would read as an option to a command the path is passed to
        (".//-x/./y", "./-x/y"),
        ("-n", "-n"),
    ],
)
def test_tidy_drops_dot_segments_and_repeated_slashes_only(path: str, tidied: str) -> None:
    assert tidy_paths.tidy(path) == tidied


@pytest.mark.parametrize(
    "text",
    [
        "https://example.com//a/./b.tar.gz",
        "s3://bucket//key",
        "file:///tmp//x",
        "//cdn.example.com/./lib.js",  # a scheme-relative URL, or a network path
        "let x = 1; // a comment\nx",
        "a  //  b",
        "./a\tb//c",
        "./a//b\x1b[2J",
        "./my file//x",
    ],
)
def test_tidy_leaves_what_is_not_a_file_system_path_alone(text: str) -> None:
    assert tidy_paths.tidy(text) == text


DOWNLOAD_PARAMETERS = {"source": {"type": "string", "required": True}, "dest": {"type": "string"}}


async def test_tidy_paths_leaves_urls_and_code_under_path_keys_alone() -> None:
    runtime = make_runtime(json_tool("download", parameters=DOWNLOAD_PARAMETERS))
    tidy_paths.dsh_setup(runtime, {})
    url = await runtime.execute(make_input("download", {"source": "https://example.com/a.tar.gz", "dest": "./a.tgz"}))
    assert value(url) == {"source": "https://example.com/a.tar.gz", "dest": "a.tgz"}
    [note] = url.additional_contexts
    assert "changed by path-tidier: tidied dest './a.tgz' -> 'a.tgz'." in note.content[0].text  # type: ignore[union-attr]
    code_text = "let x = 1; // a comment\nx"
    ran = await runtime.execute(make_input("download", {"source": code_text}))
    assert value(ran) == {"source": code_text} and ran.additional_contexts == ()
    dash = await runtime.execute(make_input("download", {"source": "./-rf"}))
    assert value(dash) == {"source": "./-rf"} and dash.additional_contexts == ()


async def test_tidy_paths_takes_the_workspace_guards_tools_and_path_keys() -> None:
    runtime = make_runtime(json_tool("write_x", parameters=DOWNLOAD_PARAMETERS), json_tool("read_x"))
    tidy_paths.dsh_setup(runtime, {"tools": ["write_*"], "path_keys": ["dest"]})
    written = await runtime.execute(make_input("write_x", {"source": "./a", "dest": "./b"}))
    assert value(written) == {"source": "./a", "dest": "b"}
    read = await runtime.execute(make_input("read_x", {"dest": "./b"}))
    assert value(read) == {"dest": "./b"} and read.additional_contexts == ()
    # One settings class for both plugins: the same keys, defaults and checks.
    assert tidy_paths.TidySettings is workspace.PathArguments
    assert issubclass(workspace.WorkspaceSettings, workspace.PathArguments)
    with pytest.raises(ConfigError, match=r"\[plugins\.tidy-paths\]: unknown key \"root\""):
        tidy_paths.dsh_setup(ToolRuntime(), {"root": "."})


async def test_an_untidy_path_is_rewritten_and_the_guard_judges_the_result(tmp_path: Path) -> None:
    runtime = make_runtime(json_tool("read", parameters={"path": {"type": "string", "required": True}}))
    tidy_paths.dsh_setup(runtime, {})
    workspace.dsh_setup(runtime, {"root": str(tmp_path)})
    ok = await runtime.execute(make_input("read", {"path": ".//notes.txt"}))
    assert value(ok) == {"path": "notes.txt"}
    [note] = ok.additional_contexts
    assert "tidied path './/notes.txt' -> 'notes.txt'" in note.content[0].text  # type: ignore[union-attr]
    outside = await runtime.execute(make_input("read", {"path": "./..//../etc/passwd"}))
    assert code(outside) == "DENIED"
    assert "../../etc/passwd" in outside.error.message  # the guard saw the rewritten path


async def test_tidy_paths_tidies_each_path_of_a_list() -> None:
    runtime = make_runtime(json_tool("cat", parameters={"paths": {"type": "array", "items": {"type": "string"}}}))
    tidy_paths.dsh_setup(runtime, {})
    ok = await runtime.execute(make_input("cat", {"paths": ["./a//b", "c", "d/./e/"]}))
    assert value(ok) == {"paths": ["a/b", "c", "d/e/"]}
    assert len(ok.additional_contexts) == 1


async def test_tidy_paths_leaves_tidy_and_refused_calls_alone() -> None:
    class DenyAll:
        @hookimpl
        async def dsh_pre_execute(self, execution: Any, next: Any) -> Any:
            return Deny("closed")

    runtime = make_runtime(json_tool("read", parameters={"path": {"type": "string", "required": True}}))
    tidy_paths.dsh_setup(runtime, {})
    assert (await runtime.execute(make_input("read", {"path": "a/b"}))).additional_contexts == ()
    assert (await runtime.execute(make_input("read", {"path": ""}))).additional_contexts == ()
    denied_runtime = make_runtime(json_tool("read"), plugins=[DenyAll()])
    tidy_paths.dsh_setup(denied_runtime, {})
    denied = await denied_runtime.execute(make_input("read", {"path": "./a"}))
    assert code(denied) == "DENIED" and denied.additional_contexts == ()


@pytest.mark.parametrize(
    ("config", "fragment"),
    [
        ({"max_calls": 0}, "max_calls must be a positive number"),
        ({"window_s": -1}, "window_s must be a positive number"),
        ({"max_calls": "5"}, "expected an integer"),
    ],
)
def test_rate_limit_config_is_checked(config: dict[str, Any], fragment: str) -> None:
    with pytest.raises(ConfigError, match=r"\[plugins\.rate-limit\]") as caught:
        rate_limit.dsh_setup(ToolRuntime(), config)
    assert fragment in str(caught.value)


# -- workspace guard ----------------------------------------------------------------------------


def guarded(root: Path, **config: Any) -> ToolRuntime:
    runtime = make_runtime(json_tool("write_file"), json_tool("read_file"))
    workspace.dsh_setup(runtime, {"root": str(root), **config})
    return runtime


@pytest.mark.parametrize(
    "arguments",
    [
        {"path": "../outside.txt"},
        {"path": "/etc/passwd"},
        {"options": {"target": "/tmp/x"}},  # nested
        {"paths": ["inside.txt", "../../x"]},  # any of a list
    ],
)
async def test_guard_denies_paths_outside_the_root(workspace_root: Path, arguments: dict[str, Any]) -> None:
    result = await guarded(workspace_root).execute(make_input("write_file", arguments))
    assert code(result) == "DENIED"
    assert isinstance(result, ToolExecutionFailure) and result.error.info is not None
    assert result.error.info.plugin == "no-writes-outside-workspace"
    assert "resolves outside the workspace" in result.error.message


@pytest.mark.parametrize(
    "arguments",
    [{"path": "src/new.py"}, {"path": "."}, {"content": "/etc/passwd"}, {"path": 3}, {}],
)
async def test_guard_allows_paths_inside_and_non_path_arguments(
    workspace_root: Path, arguments: dict[str, Any]
) -> None:
    assert not (await guarded(workspace_root).execute(make_input("write_file", arguments))).is_error


async def test_guard_follows_symlinks(workspace_root: Path) -> None:
    (workspace_root / "escape").symlink_to(workspace_root.parent)
    runtime = guarded(workspace_root)
    assert code(await runtime.execute(make_input("write_file", {"path": "escape/new.txt"}))) == "DENIED"


async def test_guard_can_be_confined_to_some_tools(workspace_root: Path) -> None:
    runtime = guarded(workspace_root, tools=["write_*"])
    assert not (await runtime.execute(make_input("read_file", {"path": "/etc/passwd"}))).is_error
    assert code(await runtime.execute(make_input("write_file", {"path": "/etc/passwd"}))) == "DENIED"


async def test_guard_denial_cannot_be_reallowed_by_a_listener(workspace_root: Path) -> None:
    import dsh_plugins.permissions as permissions

    runtime = guarded(workspace_root)
    permissions.dsh_setup(runtime, {"rules": [{"tool": "*", "action": "allow"}]})
    assert code(await runtime.execute(make_input("write_file", {"path": "/etc/x"}, agent=Agent("a")))) == "DENIED"


# -- discovery through entry points -------------------------------------------------------------


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


needs_loader = pytest.mark.skipif(
    importlib.util.find_spec("dsh_core._plugins") is None, reason="dsh_core._plugins (load_plugins) is not written yet"
)
needs_examples = pytest.mark.skipif(
    not (_installed("dsh-example-tools") and _installed("dsh-example-policy")),
    reason="install the examples first: pip install -e examples/dsh-example-tools -e examples/dsh-example-policy",
)


def loaded_runtime(**tables: dict[str, Any]) -> tuple[ToolRuntime, Any]:
    from dsh_core._config import DshConfig
    from dsh_core._plugins import load_plugins

    runtime = ToolRuntime()
    report = load_plugins(runtime, config=DshConfig(plugins=tables))
    return runtime, report


@needs_loader
@needs_examples
def test_example_plugins_are_discovered_through_entry_points(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # plugins with files (the audit log) write here
    runtime, report = loaded_runtime(**{"example-tools": {"root": str(REPO)}})
    loaded = {plugin.name: plugin for plugin in report.loaded}
    assert {"example-tools", "rate-limit", "no-writes-outside-workspace"} <= set(loaded), report
    assert loaded["example-tools"].distribution == "dsh-example-tools"
    assert loaded["example-tools"].tools == ("calc", "read_file", "http_status_lookup")
    assert "rate-limiter" in loaded["rate-limit"].plugins
    assert "path-tidier" in loaded["tidy-paths"].plugins
    assert not [
        failed for failed in report.failed if failed.distribution in ("dsh-example-tools", "dsh-example-policy")
    ]
    assert {"calc", "read_file", "http_status_lookup"} <= set(runtime.names())


@needs_loader
@needs_examples
async def test_calls_jsonl_runs_through_the_discovered_plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    runtime, _ = loaded_runtime(
        **{"example-tools": {"root": str(REPO)}, "no-writes-outside-workspace": {"root": str(REPO)}}
    )
    calls = []
    for line in (EXAMPLES / "calls.jsonl").read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        assert isinstance(record["arguments"], str)  # as a model emits them
        calls.append(
            ToolExecutionInput(
                call_id=record["id"],
                name=record["name"],
                arguments=json.loads(record["arguments"]),
                signal=make_input("x").signal,
            )
        )
    results = await run_tool_calls(runtime, calls)
    outcomes = [None if not result.is_error else code(result) for result in results]
    assert outcomes == [None, None, None, "DENIED", "INVALID_ARGS", "CALC_ERROR", None]
    assert value(results[0]) == 42
    assert value(results[1])["phrase"] == "I'm a Teapot"
    assert value(results[2])["path"] == "examples/README.md"
    # "./examples//README.md": tidied by a Rewrite, judged again by the workspace guard, and the model is told.
    assert value(results[6])["path"] == "examples/README.md"
    [note] = results[6].additional_contexts
    assert note.source == "path-tidier"
    assert "tidied path './examples//README.md' -> 'examples/README.md'" in note.content[0].text  # type: ignore[union-attr]


# -- the policy plugin of examples/README.md ----------------------------------------------------


def readme_policy_source() -> str:
    text = (EXAMPLES / "README.md").read_text(encoding="utf-8")
    section = text.split("## Writing a policy plugin", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert match, "examples/README.md lost its policy example"
    return match.group(1)


def test_readme_policy_example_is_ten_lines_or_so() -> None:
    code_lines = [line for line in readme_policy_source().splitlines() if line.strip()]
    assert len(code_lines) <= 12


@needs_loader
async def test_readme_policy_example_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    from dsh_core._plugins import load_plugins

    module = types.ModuleType("my_policy")
    exec(compile(readme_policy_source(), "examples/README.md", "exec"), module.__dict__)
    monkeypatch.setitem(sys.modules, "my_policy", module)
    runtime = make_runtime(json_tool("delete_file"), json_tool("read_file"))
    point = importlib.metadata.EntryPoint(name="no-deletes", value="my_policy", group="dsh")
    report = load_plugins(runtime, entry_points=[point])
    assert report.ok, report
    assert [plugin.plugins for plugin in report.loaded] == [("no-deletes", "no-deletes-policy")]
    denied = await runtime.execute(make_input("delete_file", {"path": "x"}))
    assert code(denied) == "DENIED"
    assert isinstance(denied, ToolExecutionFailure)
    assert denied.error.message == "delete_file: nothing is deleted here"
    assert not (await runtime.execute(make_input("read_file"))).is_error


def test_example_packages_list_their_packages_and_entry_points() -> None:
    import tomllib

    for directory, package in (
        ("dsh-example-tools", "dsh_example_tools"),
        ("dsh-example-policy", "dsh_example_policy"),
    ):
        project = tomllib.loads((EXAMPLES / directory / "pyproject.toml").read_text(encoding="utf-8"))
        assert project["build-system"]["requires"] == ["hatchling==1.33.0"]
        assert project["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"] == [package]
        assert "dsh-tools" in project["project"]["dependencies"]
        for value_ in project["project"]["entry-points"]["dsh"].values():
            module = value_.split(":")[0]
            assert (EXAMPLES / directory / (module.replace(".", os.sep) + ".py")).exists() or (
                EXAMPLES / directory / module.replace(".", os.sep) / "__init__.py"
            ).exists()


def test_resume_after_crash_sends_nothing_twice(tmp_path: Path) -> None:
    # A real crash: the example's child process dies with os._exit in the middle of the second email.
    script = Path(__file__).parent.parent / "examples" / "resume_after_crash.py"
    ledger = tmp_path / "effects.jsonl"
    done = subprocess.run(
        [sys.executable, str(script), str(ledger)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert "the process died (exit status 70)" in lines[0]
    assert '  mail-1: ok {"queued": "ann@example.com"}' in lines
    assert "  mail-2: EFFECT_IN_DOUBT" in lines
    assert any(line.startswith("  look-1: ok") for line in lines)
    outbox = ledger.with_suffix(".outbox").read_text(encoding="utf-8").splitlines()
    assert outbox == ["ann@example.com: invoice", "bob@example.com: invoice"]  # each sent once


def test_undo_a_turn_reverts_what_it_can_and_keeps_a_hand_edit(tmp_path: Path) -> None:
    script = Path(__file__).parent.parent / "examples" / "undo_a_turn.py"
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:3] == ["t1-edit: ok", "t1-plan: ok", "t1-todo: ok"]
    assert "  t1-plan: undone" in lines and "  t1-edit: undone" in lines
    assert lines[-1] == "still undoable: ['t1-todo']"
    assert (tmp_path / "notes.md").read_text() == "a draft of the notes\n"
    assert not (tmp_path / "plan.md").exists()
    assert "added by hand" in (tmp_path / "todo.md").read_text()


def test_the_examples_use_only_the_public_api() -> None:
    # They show third-party use from the outside: a private module is not theirs to import.
    private = re.compile(r"^\s*(?:from|import)\s+dsh_core\._", re.MULTILINE)
    offenders = [
        str(path.relative_to(EXAMPLES))
        for path in sorted(EXAMPLES.rglob("*.py"))
        if private.search(path.read_text(encoding="utf-8"))
    ]
    assert offenders == []
