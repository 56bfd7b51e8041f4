"""Permissions ``paths`` rules match a path argument as the file it names, not as its spelling.

A plain ``args`` glob compares the raw string: ``./secrets/key``, ``x/../secrets/key``
or an absolute path dodged a deny rule ``path = "secrets/*"``, and
``docs/../secrets/key`` passed an allow rule ``docs/*``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest

import dsh_plugins.files as files
import dsh_plugins.permissions as permissions
from dsh_core import (
    Agent,
    CancelSignal,
    ToolExecution,
    ToolExecutionFailure,
    ToolExecutionSuccess,
    ToolExecutionToken,
    ToolRuntime,
    snapshot_json,
)
from dsh_core.testing import StaticApproval, json_tool, make_input, make_runtime
from dsh_plugins import _case_folding
from dsh_plugins._case_folding import folds_case
from dsh_plugins.permissions import Permissions, PermissionsSettings, Rule

SPELLINGS = ["secrets/key", "./secrets/key", "secrets//key", "x/../secrets/key", "ABSOLUTE", "via-link/key"]


def _workspace(root: Path) -> None:
    (root / "secrets").mkdir()
    (root / "docs").mkdir()
    (root / "via-link").symlink_to(root / "secrets")


def _spelt(spelling: str, root: Path) -> str:
    return str(root / "secrets" / "key") if spelling == "ABSOLUTE" else spelling


def _runtime(root: Path, config: dict[str, Any], approval: StaticApproval | None = None) -> ToolRuntime:
    # permissions first: the files workspace it resolves against is looked up when a call is decided.
    return make_runtime(plugins=[(permissions, config), (files, {"root": str(root)})], approval=approval)


@pytest.mark.parametrize("spelling", SPELLINGS)
async def test_a_paths_deny_rule_catches_every_spelling_of_the_file(tmp_path: Path, spelling: str) -> None:
    _workspace(tmp_path)
    rule = {"tool": "write_file", "paths": {"path": "secrets/*"}, "action": "deny", "reason": "no secrets"}
    runtime = _runtime(tmp_path, {"rules": [rule]})
    result = await runtime.execute(
        make_input("write_file", {"path": _spelt(spelling, tmp_path), "content": "pwned"}, agent=Agent("a"))
    )
    assert isinstance(result, ToolExecutionFailure) and result.code == "DENIED"
    assert result.error.message == "no secrets"
    assert not (tmp_path / "secrets" / "key").exists()


async def test_a_paths_deny_rule_lets_other_files_through(tmp_path: Path) -> None:
    _workspace(tmp_path)
    rule = {"tool": "write_file", "paths": {"path": "secrets/*"}, "action": "deny"}
    runtime = _runtime(tmp_path, {"rules": [rule]})
    for path in ["docs/a.md", "secrets-not/x", "./docs/../notes.txt"]:
        result = await runtime.execute(make_input("write_file", {"path": path, "content": "ok"}, agent=Agent("a")))
        assert isinstance(result, ToolExecutionSuccess), path


@pytest.mark.parametrize(
    ("path", "allowed"),
    [
        ("docs/a.md", True),
        ("./docs/a.md", True),
        ("ABSOLUTE_DOCS", True),
        ("docs/../secrets/key", False),
        ("secrets/key", False),
        ("docs/../../outside", False),  # escapes the root: fails closed
    ],
)
async def test_a_paths_allow_rule_allows_only_files_really_below_it(tmp_path: Path, path: str, allowed: bool) -> None:
    _workspace(tmp_path)
    approval = StaticApproval("denied")
    rule = {"tool": "write_file", "paths": {"path": "docs/*"}, "action": "allow"}
    runtime = _runtime(tmp_path, {"default": "ask", "rules": [rule]}, approval)
    path = str(tmp_path / "docs" / "a.md") if path == "ABSOLUTE_DOCS" else path
    result = await runtime.execute(make_input("write_file", {"path": path, "content": "x"}, agent=Agent("a")))
    if allowed:
        assert isinstance(result, ToolExecutionSuccess)
        assert approval.requests == []
    else:
        assert isinstance(result, ToolExecutionFailure) and result.code == "DENIED"
        assert approval.requests == [
            ("write_file", 'approval required by the permissions default: no rule matched tool "write_file"')
        ]
    assert not (tmp_path / "secrets" / "key").exists()


def _policy(rule: dict[str, Any], default: Literal["allow", "deny"] = "allow") -> Permissions:
    return Permissions(PermissionsSettings(default=default, rules=(Rule(**rule),)))


@pytest.mark.parametrize(
    ("value", "deny", "allow"),
    [
        ("../outside", True, False),  # escapes the root
        (7, True, False),  # no path at all
        ("a\x00b", True, False),
        ("\ud800", True, False),  # JSON allows a lone surrogate; no file can be named by it
        (["docs/a", "x/../secrets/k"], True, False),  # one file of a list is enough to deny, and to not allow
        (["docs/a", "./docs/b"], False, True),
        ([], False, False),  # names no file
    ],
)
def test_values_that_are_no_file_below_the_root_fail_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: Any, deny: bool, allow: bool
) -> None:
    # Without a files workspace, relative paths are taken below the directory the host started in.
    monkeypatch.chdir(tmp_path)
    execution = ToolExecution(
        call_id="c1", root_call_id="c1", name="fs", arguments=snapshot_json({"path": value}),
        signal=CancelSignal(), token=ToolExecutionToken(),
    )  # fmt: skip
    denying = _policy({"tool": "fs", "paths": {"path": "secrets/*"}, "action": "deny"}, "allow")
    assert denying.decide(execution)[0] == ("deny" if deny else "allow")
    allowing = _policy({"tool": "fs", "paths": {"path": "docs/*"}, "action": "allow"}, "deny")
    assert allowing.decide(execution)[0] == ("allow" if allow else "deny")


def _fs_call(path: str) -> ToolExecution:
    return ToolExecution(
        call_id="c1", root_call_id="c1", name="fs", arguments=snapshot_json({"path": path}),
        signal=CancelSignal(), token=ToolExecutionToken(),
    )  # fmt: skip


@pytest.mark.parametrize("path", ["secrets/key", "./secrets/key", ".vault/key", "docs/../secrets/key"])
async def test_a_rule_whose_directory_is_a_symlink_matches_the_files_it_leads_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """The values were resolved and the glob was not: with secrets -> .vault, "secrets/*" matched nothing."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".vault").mkdir()
    (tmp_path / ".vault" / "key").write_text("k")
    (tmp_path / "docs").mkdir()
    (tmp_path / "secrets").symlink_to(".vault")
    denying = _policy({"tool": "fs", "paths": {"path": "secrets/*"}, "action": "deny"}, "allow")
    assert denying.decide(_fs_call(path))[0] == "deny"
    assert (await denying.dsh_pre_execute(_fs_call(path), _allowed)).__class__.__name__ == "Deny"
    assert denying.decide(_fs_call("docs/readme"))[0] == "allow"


def test_an_absolute_rule_through_a_system_symlink_matches(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "sh").write_text("")
    (tmp_path / "bin").symlink_to("real")
    denying = _policy({"tool": "fs", "paths": {"path": f"{tmp_path}/bin/*"}, "action": "deny"}, "allow")
    assert denying.decide(_fs_call(str(tmp_path / "bin" / "sh")))[0] == "deny"
    assert denying.decide(_fs_call(str(tmp_path / "real" / "sh")))[0] == "deny"


@pytest.mark.parametrize(
    ("glob", "root", "pattern"),
    [
        ("../*.env", "/home/u/proj", "/home/u/*.env"),  # climbs out of the root: its wildcard stays one
        ("*.env", "/", "/*.env"),  # a host started in / without a files root
        ("../../etc/*", "/home/u/proj", "/home/etc/*"),
        ("*", "/r [v2]", "/r [[]v2]/*"),  # the root's own brackets are no pattern
        ("/a[b]/c", "/x", "/a[b]/c"),  # an absolute glob's are
    ],
)
def test_a_paths_glob_keeps_its_wildcards_wherever_it_starts(glob: str, root: str, pattern: str) -> None:
    """Counting the root's parts as literal escaped "../*.env" to "/home/u/[*].env": the rule matched nothing."""
    from dsh_plugins.permissions import _path_pattern

    assert _path_pattern(glob, root) == pattern
    assert _path_pattern(glob, root, resolve=True) == pattern  # none of these exist: resolved as written


async def _allowed() -> Any:
    from dsh_core import Allow

    return Allow()


async def test_without_a_files_workspace_paths_resolve_against_the_start_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    rule = {"tool": "fs", "paths": {"path": "secrets/*"}, "action": "deny"}
    runtime = make_runtime(json_tool("fs"), plugins=[(permissions, {"rules": [rule]})])
    for path in ["secrets/k", "./secrets/k", "a/../secrets/k", os.path.join(tmp_path, "secrets", "k")]:
        result = await runtime.execute(make_input("fs", {"path": path}))
        assert isinstance(result, ToolExecutionFailure) and result.code == "DENIED", path
    result = await runtime.execute(make_input("fs", {"path": "docs/k"}))
    assert isinstance(result, ToolExecutionSuccess)


def test_check_warns_about_an_args_rule_that_looks_like_a_path_rule() -> None:
    policy = _policy({"tool": "write_file", "args": {"path": "secrets/*"}, "action": "deny"})
    [warning] = policy.diagnostics()
    assert warning == (
        'permissions rule #1 (tool "write_file") matches args path = "secrets/*" against the raw text, so another '
        "spelling of the same file (a ./ prefix, x/../, an absolute path) dodges it; write "
        'paths = { path = "secrets/*" } to match it as a path'
    )
    assert _policy({"tool": "bash", "args": {"command": "rm */x"}, "action": "deny"}).diagnostics() == []
    assert _policy({"tool": "write_file", "args": {"path": "*.env"}, "action": "deny"}).diagnostics() == []


# --- file systems that ignore case (macOS, Windows) ----------------------------------------


@pytest.fixture
def folding_file_system(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pretend the workspace's file system ignores case, as APFS and NTFS do by default."""
    monkeypatch.setattr(permissions, "folds_case", lambda directory: True, raising=False)


@pytest.mark.parametrize("spelling", ["SECRETS/key", "Secrets/KEY", "./secrets/Key"])
async def test_on_a_case_folding_file_system_another_case_does_not_dodge_a_deny_rule(
    tmp_path: Path, folding_file_system: None, spelling: str
) -> None:
    """There ``SECRETS/key`` is the file ``secrets/key``: a case-sensitive compare let it through."""
    _workspace(tmp_path)
    rule = {"tool": "read_file", "paths": {"path": "secrets/*"}, "action": "deny", "reason": "no secrets"}
    runtime = _runtime(tmp_path, {"rules": [rule]})
    result = await runtime.execute(make_input("read_file", {"path": spelling}, agent=Agent("a")))
    assert isinstance(result, ToolExecutionFailure) and result.code == "DENIED", result
    assert result.error.message == "no secrets"


async def test_on_a_case_folding_file_system_an_allow_rule_takes_the_other_case_too(
    tmp_path: Path, folding_file_system: None
) -> None:
    _workspace(tmp_path)
    (tmp_path / "docs" / "a.md").write_text("hello")
    rules = [{"tool": "read_file", "paths": {"path": "docs/*"}, "action": "allow"}]
    runtime = _runtime(tmp_path, {"rules": rules, "default": "deny"})
    allowed = await runtime.execute(make_input("read_file", {"path": "DOCS/a.md"}, agent=Agent("a")))
    denied = await runtime.execute(make_input("read_file", {"path": "secrets/key"}, agent=Agent("a")))
    assert isinstance(denied, ToolExecutionFailure) and denied.code == "DENIED"
    # The rule allowed it; on this (really case-sensitive) disk the file then does not exist.
    assert not (isinstance(allowed, ToolExecutionFailure) and allowed.code == "DENIED"), allowed


async def test_case_folding_is_decided_where_the_value_lives_not_at_the_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A vfat or casefold directory inside a case-sensitive root: there SECRETS/key is secrets/key."""
    _workspace(tmp_path)
    mount = tmp_path / "mnt"
    (mount / "secrets").mkdir(parents=True)
    (tmp_path / "other").mkdir()
    monkeypatch.setattr(
        permissions, "folds_case", lambda directory: directory.startswith(str(mount)), raising=False
    )
    rules = [
        {"tool": "read_file", "paths": {"path": "mnt/secrets/*"}, "action": "deny", "reason": "mounted secrets"},
        {"tool": "read_file", "paths": {"path": "other/*"}, "action": "deny", "reason": "other"},
    ]
    runtime = _runtime(tmp_path, {"rules": rules})
    folded = await runtime.execute(make_input("read_file", {"path": "mnt/SECRETS/key"}, agent=Agent("a")))
    assert isinstance(folded, ToolExecutionFailure) and folded.code == "DENIED", folded
    assert folded.error.message == "mounted secrets"
    # On the case-sensitive root, OTHER is another directory than other.
    (tmp_path / "OTHER").mkdir()
    (tmp_path / "OTHER" / "x").write_text("x")
    kept_apart = await runtime.execute(make_input("read_file", {"path": "OTHER/x"}, agent=Agent("a")))
    assert isinstance(kept_apart, ToolExecutionSuccess), kept_apart


async def test_a_file_directly_inside_a_case_folding_directory_is_matched_folded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """folds_case(dir) looked dir's own name up in its parent: it answered for the parent (s20 review)."""
    _workspace(tmp_path)
    mount = tmp_path / "mnt"
    (mount / "sub").mkdir(parents=True)
    (mount / "key.txt").write_text("secret")
    inside = str(mount) + "/"
    real_lstat = os.lstat

    def folding_lstat(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        # A casefold directory (or a vfat mount) inside a case-sensitive root: its entries fold.
        text = os.fspath(path)
        if isinstance(text, str) and text.startswith(inside):
            text = inside + text[len(inside) :].lower()
        return real_lstat(text, *args, **kwargs)

    monkeypatch.setattr(_case_folding.os, "lstat", folding_lstat)
    folds_case.cache_clear()
    try:
        assert folds_case(str(mount)) is True and folds_case(str(tmp_path)) is False
        rule = {"tool": "read_file", "paths": {"path": "mnt/key.txt"}, "action": "deny", "reason": "secret"}
        runtime = _runtime(tmp_path, {"rules": [rule]})
        for spelling in ("mnt/key.txt", "mnt/KEY.txt", "mnt/Key.TXT"):
            result = await runtime.execute(make_input("read_file", {"path": spelling}, agent=Agent("a")))
            assert isinstance(result, ToolExecutionFailure) and result.code == "DENIED", (spelling, result)
    finally:
        folds_case.cache_clear()


def test_an_entry_whose_other_case_is_no_plain_variant_does_not_decide_for_the_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """"ß" swaps to "SS", which a case-ignoring file system need not find: it answered "case-sensitive" (s20 review)."""
    mount = tmp_path / "mnt"
    mount.mkdir()
    for name in ("\u00df-notes.txt", "key.txt"):
        (mount / name).write_text("x")
    inside = str(mount) + "/"
    real_lstat, real_scandir = os.lstat, os.scandir

    def folding_lstat(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        text = os.fspath(path)
        if isinstance(text, str) and text.startswith(inside):
            # Simple case folding, a character at a time, as vfat, exFAT and HFS+ do: "SS" is not "ß".
            text = inside + "".join(c.lower() if len(c.lower()) == 1 else c for c in text[len(inside) :])
        return real_lstat(text, *args, **kwargs)

    class ScanInOrder:
        def __init__(self, directory: str) -> None:
            with real_scandir(directory) as entries:
                self.entries = sorted(entries, key=lambda entry: entry.name, reverse=True)  # "ß..." first

        def __enter__(self) -> Iterator[os.DirEntry[str]]:
            return iter(self.entries)

        def __exit__(self, *exc: object) -> None:
            pass

    monkeypatch.setattr(_case_folding.os, "lstat", folding_lstat)
    monkeypatch.setattr(_case_folding.os, "scandir", ScanInOrder)
    folds_case.cache_clear()
    try:
        assert folds_case(str(mount)) is True
    finally:
        folds_case.cache_clear()


def test_a_case_sensitive_file_system_is_told_apart_even_with_a_symlink_of_the_other_case(tmp_path: Path) -> None:
    folds_case.cache_clear()
    project = tmp_path / "Project"
    project.mkdir()
    assert folds_case(str(project)) is False
    (tmp_path / "pROJECT").symlink_to(project)  # the other case names another entry here: no folding
    folds_case.cache_clear()
    assert folds_case(str(project)) is False
    digits = tmp_path / "1234"
    digits.mkdir()
    folds_case.cache_clear()
    assert folds_case(str(digits)) is False  # no letters: its parents' names decide


def test_a_case_folding_file_system_is_recognised(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project = tmp_path / "Project"
    project.mkdir()
    real_lstat = os.lstat

    def folding_lstat(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        return real_lstat(str(path).replace("pROJECT", "Project"), *args, **kwargs)

    monkeypatch.setattr(_case_folding.os, "lstat", folding_lstat)
    folds_case.cache_clear()
    try:
        assert folds_case(str(project)) is True
        # "Deeper" does not exist: a write_file there creates it on Project's file system.
        assert folds_case(str(project / "new" / "Deeper")) is True
    finally:
        folds_case.cache_clear()


@pytest.mark.parametrize("name", ["proj [v2]", "a*b", "what?"])
async def test_a_root_whose_name_holds_glob_characters_still_matches_relative_rules(tmp_path: Path, name: str) -> None:
    """The root's text went into the pattern: "[v2]" became a character class and every relative deny rule failed open."""
    root = tmp_path / name
    root.mkdir()
    _workspace(root)
    rule = {"tool": "write_file", "paths": {"path": "secrets/*"}, "action": "deny", "reason": "no secrets"}
    runtime = _runtime(root, {"rules": [rule]})
    result = await runtime.execute(make_input("write_file", {"path": "secrets/key", "content": "x"}, agent=Agent("a")))
    assert isinstance(result, ToolExecutionFailure) and result.error.message == "no secrets"
    assert not (root / "secrets" / "key").exists()


@pytest.mark.parametrize("kind", ["args", "paths"])
async def test_a_value_written_as_an_objects_key_does_not_dodge_a_rule(tmp_path: Path, kind: str) -> None:
    """{"files": {"secrets/key": "pwned"}} ran past a deny rule that caught ["secrets/key"]: keys were never looked at."""
    _workspace(tmp_path)
    rule = {"tool": "multi_write", kind: {"files": "secrets/*"}, "action": "deny", "reason": "no secrets"}
    runtime = make_runtime(
        json_tool("multi_write"), plugins=[(permissions, {"rules": [rule]}), (files, {"root": str(tmp_path)})]
    )
    for arguments in ({"files": ["secrets/key"]}, {"files": {"secrets/key": "pwned"}}):
        result = await runtime.execute(make_input("multi_write", arguments, agent=Agent("a")))
        assert isinstance(result, ToolExecutionFailure) and result.error.message == "no secrets", arguments


async def test_an_allow_rule_on_an_object_needs_its_keys_to_match_too(tmp_path: Path) -> None:
    """Every value inside matched an allow glob while the key, the real target, was never looked at."""
    _workspace(tmp_path)
    rules = [{"tool": "multi_write", "args": {"files": "docs/*"}, "action": "allow"}]
    runtime = make_runtime(json_tool("multi_write"), plugins=[(permissions, {"rules": rules, "default": "deny"})])
    refused = await runtime.execute(
        make_input("multi_write", {"files": {"/etc/cron.d/x": "docs/readme"}}, agent=Agent("a"))
    )
    assert isinstance(refused, ToolExecutionFailure) and refused.code == "DENIED"
    allowed = await runtime.execute(make_input("multi_write", {"files": {"docs/a": "docs/b"}}, agent=Agent("a")))
    assert isinstance(allowed, ToolExecutionSuccess)
