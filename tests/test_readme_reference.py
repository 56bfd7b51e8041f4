"""The README's reference parts say what the code does: the CLI synopsis and table, the sample rules."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import click

from dsh_core import Agent, ToolEffects
from dsh_core._cli import cli
from dsh_core.testing import json_tool, make_input, make_runtime
from dsh_plugins import permissions

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text(encoding="utf-8")


def cli_section() -> str:
    return README.split("## The `dsh-tools` command", 1)[1].split("```console", 1)[0]


def leaf_commands(group: click.Group, prefix: str = "") -> list[tuple[str, click.Command]]:
    found = []
    for name, command in group.commands.items():
        path = f"{prefix}{name}"
        if isinstance(command, click.Group):
            found.extend(leaf_commands(command, f"{path} "))
        else:
            found.append((path, command))
    return found


def long_options(command: click.Command) -> list[str]:
    return [
        max(parameter.opts, key=len)
        for parameter in command.params
        if isinstance(parameter, click.Option) and not parameter.hidden and "--help" not in parameter.opts
    ]


def test_the_synopsis_names_every_global_option() -> None:
    # The synopsis and the paragraph under it, up to the command table.
    synopsis = cli_section().split("| command |", 1)[0]
    missing = [option for option in long_options(cli) if option not in synopsis]
    assert missing == [], synopsis


def test_the_command_table_names_every_command_with_every_option() -> None:
    spans = re.findall(r"`([^`]+)`", cli_section())
    missing = []
    for path, command in leaf_commands(cli):
        usages = [span for span in spans if span == path or span.startswith(f"{path} ")]
        if not usages:
            missing.append(path)
            continue
        missing.extend(f"{path} {option}" for option in long_options(command) if option not in usages[0])
    assert missing == []


def readme_permissions_table() -> dict[str, object]:
    blocks = re.findall(r"```toml\n(.*?)```", README, flags=re.DOTALL)
    (sample,) = [block for block in blocks if "[plugins.permissions]" in block]
    table = tomllib.loads(sample)["plugins"]["permissions"]
    assert isinstance(table, dict)
    return table


async def test_the_sample_rules_ask_for_a_tool_that_is_destructive_or_open_world() -> None:
    runtime = make_runtime(
        json_tool("drop_table", effects=ToolEffects(destructive=True)),
        json_tool("fetch_url", effects=ToolEffects(read_only=True, open_world=True)),
        json_tool("add", effects=ToolEffects(read_only=True)),
    )
    permissions.dsh_setup(runtime, readme_permissions_table())
    for name, rule in (("drop_table", 4), ("fetch_url", 5)):
        asked = await runtime.execute(make_input(name, agent=Agent("a")))
        assert asked.code == "DENIED", name  # asked, and no approval service to say yes
        assert asked.error.message == f'approval required by permissions rule #{rule} (tool "*")'
    assert not (await runtime.execute(make_input("add", agent=Agent("a")))).is_error


def test_the_hookspecs_pipeline_summary_lists_every_decision() -> None:
    from typing import get_args

    from dsh_core import hookspecs
    from dsh_core._decisions import PostToolDecision, PreToolDecision

    assert hookspecs.__doc__ is not None
    summary = hookspecs.__doc__.split("::", 1)[1].split("\n\n", 2)[1]
    (pre,) = [line for line in summary.splitlines() if "dsh_pre_execute" in line]
    (post,) = [line for line in summary.splitlines() if "dsh_post_execute" in line]
    assert [c.__name__ for c in get_args(PreToolDecision) if c.__name__ not in pre] == []
    assert [c.__name__ for c in get_args(PostToolDecision) if c.__name__ not in post] == []


def test_the_examples_readme_names_the_paths_calls_jsonl_reads() -> None:
    calls = [json.loads(line) for line in (REPO / "examples" / "calls.jsonl").read_text().splitlines()]
    paths = {json.loads(call["arguments"]).get("path") for call in calls}
    text = (REPO / "examples" / "README.md").read_text(encoding="utf-8")
    paragraph = text.split("`calls.jsonl` holds", 1)[1].split("\n\n", 1)[0]
    named = [span for span in re.findall(r"`([^`]+)`", paragraph) if "/" in span]
    assert named and [span for span in named if span not in paths] == []


def test_the_quick_start_installs_the_nox_ci_uses() -> None:
    (ci_pin,) = re.findall(r"'(nox==[^']+)'", (REPO / ".ci" / "run").read_text())
    quick_start = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert f"pip install '{ci_pin}'" in quick_start
