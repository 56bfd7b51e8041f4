"""The ``dsh-tools`` command line: inspect, call and check the tools a host's plugins provide.

Every command builds a :class:`~dsh_core.ToolRuntime` the way a host would:
the configuration (``--config``, else ``dsh.toml``, else ``[tool.dsh]`` in
``pyproject.toml``), its ``mode``, an approval service (non-interactive: every
``Ask`` is denied; ``--interactive``: a prompt on the terminal), then the
plugins of the ``dsh`` entry-point group (``--no-plugins`` skips them;
``--plugin [NAME=]MODULE[:ATTR]`` adds one that is not installed as an entry
point, e.g. while writing it). Plugins that fail to load are reported on
stderr and left out; ``check`` and ``plugins`` report them in full. The
commands that run calls (``call``, ``run``, ``serve-mcp``, ``simulate``)
instead refuse to start while a plugin the configuration sets up is missing
(its ``dsh_setup`` rejected its table, or it has a ``[plugins.<name>]`` table
and failed), or a plugin ``--plugin`` names did not load (it failed, its NAME
is an installed plugin's, which keeps it, or ``disabled_plugins`` lists it):
its policy would silently be off.

Sessions recorded by ``call`` and ``run`` (``--session`` or the config's
``session_log``) include each call's decision trace, which ``explain`` shows;
``simulate`` replays a session through a new policy stack without running any
tool. An existing file is appended to only when it is a session log (its first
line an event); a torn last line it ends with is cut off, with a warning. A log
that cannot be written is a usage error (exit 2): before anything runs when a
call cannot be recorded, after the output when a result or the closing sync could not be.

Exit status: 0 on success; 1 when ``call`` ran a call that failed, ``check``
found problems, ``explain`` found no trace, or ``simulate`` found calls the new
policies decide differently; 2 for usage errors (bad options, invalid JSON
arguments, an unreadable or invalid configuration, batch file or session log,
an unknown call id, a configured or ``--plugin`` plugin that failed to load). ``run`` exits 0
once the batch ran, whatever the calls' outcomes: each result line says
``is_error``. Ctrl-C prints "Aborted!" and exits 130 (128 + SIGINT), never
with a traceback.
"""

from __future__ import annotations

import contextlib
import difflib
import errno
import gc
import getpass
import importlib.metadata
import importlib.util
import os
import shlex
import sys
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import click
import trio
from rich.console import Console
from rich.highlighter import JSONHighlighter
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table
from rich.text import Text

from ._arguments_text import TRUNCATED_HINT, ArgumentsJsonError, ArgumentsText, _repeated_key
from ._config import DshConfig, load_config
from ._content import ContentBlock, ImageBlock, TextBlock
from ._definition import ToolDefinition
from ._errors import ConfigError, DshError, ErrorCode, JsonSchemaError, NonJsonValueError, bounded_listing
from ._execution import Agent, ScopeKey, ToolExecution, ToolExecutionInput
from ._json import json_text, thaw
from ._jsoncodec import IntegerTooLongError, decode_json, dumps_text
from ._logged_calls import LoggedCall, logged_calls
from ._mcp_serve_token import ServeToken, TokenSourceError, serve_token
from ._pipeline import approval_unavailable_reason
from ._plugins import (
    FailedPlugin,
    PluginReport,
    RefusedRegistration,
    discover_entry_points,
    load_plugins,
    unknown_hooks,
)
from ._registry import RUN_CODE_NAME
from ._replay import SessionRecorder, replay
from ._results import ToolExecutionFailure, ToolExecutionResult
from ._runtime import PROVIDER_TOOL_NAME, ApprovalService, ToolRuntime, agent_scope
from ._scheduling import run_tool_calls
from ._session_log import SessionLog, SessionLogError, SessionLogRead, read_session_log, refuse_non_regular_target
from ._signal import CancelSignal
from ._terminal_logging import escaped_last_resort
from ._terminal_text import clipped, json_printable, printable, terminal_text
from ._trace import DecisionTrace
from .hookspecs import hookimpl

__all__ = ["main"]

"""Tool names every major model provider accepts; others are a ``check`` warning."""


DEFAULT_AGENT = "cli"
"""The agent the CLI acts as without ``--agent``: ``Ask`` decisions need one to be approved."""


class _UsageProblem(click.ClickException):
    """A usage error that is not about one option (configuration, batch file): exit 2.

    The message quotes plugin errors, file contents and paths, so it is shown
    with its control characters escaped.
    """

    exit_code = 2

    def __init__(self, message: str) -> None:
        super().__init__(printable(message))


@attrs.frozen(kw_only=True)
class _Options:
    config_path: Path | None
    no_plugins: bool
    extra_plugins: tuple[str, ...]
    interactive: bool
    group: str
    mode: str | None = None
    grants: Path | None = None


@attrs.frozen(kw_only=True)
class _Host:
    runtime: ToolRuntime
    report: PluginReport
    config: DshConfig


def _stdout_is_terminal() -> bool:
    return sys.stdout.isatty()


def _stderr() -> Console:
    return Console(stderr=True, highlight=False)


def _stdout() -> Console:
    return Console(highlight=False)


def _cell(text: str, style: str = "") -> Text:
    """A table cell of text from a tool, a plugin or a file: one line, never markup."""
    return terminal_text((text, style), one_line=True)


def _echo_json(value: object, *, indent: int | None = None) -> None:
    """Write ``value`` as JSON text on stdout: every command's ``--json`` output goes through here.

    Tool results and descriptions can hold lone surrogates (legal JSON, but no
    encoding writes them) and bidi, C1 or escape characters: written as JSON
    escapes, the text decodes to the same value and cannot fail to encode or
    drive a terminal.
    """
    click.echo(json_printable(dumps_text(value, indent=indent)))


# -- building the host -------------------------------------------------------------------


def _approval(interactive: bool, err: Console, grants: Path | None = None) -> ApprovalService | None:
    try:
        from dsh_plugins.approval import NonInteractiveApproval, TerminalApproval
    except ImportError:
        if interactive or grants is not None:
            err.print(
                "warning: approval is unavailable (dsh_plugins.approval is missing); Ask denies",
                soft_wrap=True,
            )
        return None
    service: ApprovalService
    if interactive:
        service = TerminalApproval(show=_show_on_stderr, readline=_read_stdin_line, report_always=grants is not None)
    else:
        service = NonInteractiveApproval()
    if grants is None:
        return service
    from dsh_plugins.grants import GrantBook, GrantError, GrantingApproval

    try:
        book = GrantBook(grants)
    except (GrantError, OSError) as exc:
        raise _UsageProblem(f"cannot use grants file {grants}: {exc}") from exc
    return GrantingApproval(service, book, granted_by=_user())


def _user() -> str:
    """Who answers at this terminal, for the audit trail of grants made here."""
    try:
        return f"{getpass.getuser()} (dsh-tools)"
    except (OSError, KeyError):
        return "dsh-tools"


def _show_on_stderr(question: str) -> None:
    from dsh_plugins.approval import discard_typed_ahead  # only ever shown by its TerminalApproval

    discard_typed_ahead()
    # stdout carries results (``run`` writes JSON lines there): ask on stderr. On the stream
    # itself: while rich shows a live display it puts a proxy there, which prints an
    # unfinished line (the question's last) as markup, so a model's "[black on black]"
    # would hide text, or "[/]" fail the question.
    stream = getattr(sys.stderr, "rich_proxied_file", sys.stderr)
    stream.write(question)
    stream.flush()


def _read_stdin_line() -> str:
    # Looked up at each read: the stdin of this invocation (a test runner replaces it).
    return sys.stdin.readline()


def _dotted_name(text: str) -> bool:
    return all(part.isidentifier() for part in text.split("."))


def _plugin_spec(spec: str) -> tuple[str, str]:
    """``[NAME=]MODULE[:ATTR]`` as (entry-point name, value); a malformed one is a usage error.

    Checked here because importlib accepts any value and fails only when the
    entry point is loaded, with an error that does not say what was wrong.
    """
    name, sep, value = spec.partition("=")
    if not sep:
        name, value = spec, spec
    name, value = name.strip(), value.strip()
    module, colon, attr = value.partition(":")
    module, attr = module.strip(), attr.strip()
    if not name or not _dotted_name(module) or (colon and not _dotted_name(attr)):
        raise click.BadParameter(
            f"expected [NAME=]MODULE[:ATTR] (MODULE and ATTR dotted Python names), got {spec!r}", param_hint="--plugin"
        )
    return name, f"{module}:{attr}" if colon else module


def _plugin_specs(ctx: click.Context, param: click.Parameter, value: tuple[str, ...]) -> tuple[str, ...]:
    for spec in value:
        _plugin_spec(spec)
    return value


def _extra_entry_point(spec: str, group: str) -> importlib.metadata.EntryPoint:
    name, value = _plugin_spec(spec)
    return importlib.metadata.EntryPoint(name=name, value=value, group=group)


def _build_host(
    ctx: click.Context,
    *,
    quiet: bool = False,
    config_path: Path | None = None,
    runtime_class: type[ToolRuntime] = ToolRuntime,
    runs_calls: bool = False,
) -> _Host:
    """The host the options describe; ``config_path`` overrides ``--config``.

    ``runtime_class`` other than ``ToolRuntime`` (the simulator's) always gets
    a native-mode runtime without an approval service. ``runs_calls``: the
    command runs (or simulates) calls, so a plugin the configuration sets up
    that failed to load is a usage error, not a warning: its policy would
    silently be off.
    """
    options: _Options = ctx.find_object(_Options)  # type: ignore[assignment]
    err = _stderr()
    try:
        config = load_config(config_path if config_path is not None else options.config_path)
    except ConfigError as exc:
        raise _UsageProblem("\n  ".join(["invalid configuration:", *exc.violations])) from exc
    if options.mode is not None:
        config = attrs.evolve(config, mode=options.mode)  # type: ignore[arg-type]  # click.Choice checked it
    simulated = runtime_class is not ToolRuntime
    approval = None if simulated else _approval(options.interactive, err, options.grants)
    try:
        code_runtime = None
        if config.mode != "native" and not simulated:
            from .code_mode import SubprocessPythonRuntime

            try:
                code_runtime = SubprocessPythonRuntime(**config.code_runtime.options())
            except (TypeError, ValueError) as exc:
                raise _UsageProblem(f"invalid configuration: [code_runtime]: {exc}") from exc
        mode = "native" if simulated else config.mode
        runtime = runtime_class(approval=approval, mode=mode, code_runtime=code_runtime)
    except _UsageProblem:
        raise
    except Exception as exc:  # e.g. Code Mode requested but unavailable
        raise _UsageProblem(f'cannot create a runtime with mode "{config.mode}": {exc}') from exc
    if config.source is not None:
        # The model must not rewrite its own policy through the file tools (--grants: see GrantingApproval).
        runtime.kept_files.add(config.source, "the configuration file")
        for preferred in config.preferred_paths:  # created, it would replace the configuration file
            runtime.kept_files.add(preferred, "where a configuration file would replace the one in use")
    # Lets the terminal prompt show the tools' own cards (also behind a GrantingApproval).
    prompt = getattr(approval, "inner", approval)
    if prompt is not None and hasattr(prompt, "runtime"):
        prompt.runtime = runtime
    points = [] if options.no_plugins else discover_entry_points(options.group)
    named = [_extra_entry_point(spec, options.group) for spec in options.extra_plugins]
    report = load_plugins(runtime, options.group, config, entry_points=[*points, *named])
    # The host lives as long as the command. Its runtime and plugins refer to each other, so
    # only the cycle collector frees them, and what they hold (the effect ledger's lock) with
    # them: collect when the command ends, as the end of the process would, so that a next
    # command in the same process (a test, a host calling main()) finds those files free.
    ctx.call_on_close(gc.collect)
    # A table no plugin reads is refused below, in its own words.
    refused = tuple(f for f in report.config_failures if f.stage != "config") if runs_calls else ()
    missing = _named_plugins_missing(report, config, named, refused) if runs_calls else []
    if not quiet:
        for failed in report.failed:
            if failed not in refused and not any(failed is m for m in missing):
                lines = _duplicate_tool_lines(failed, report) or [
                    f"plugin {failed.name} failed ({failed.stage}): {failed.error}"
                ]
                for line in lines:
                    err.print(terminal_text(f"warning: {line}"), soft_wrap=True)
    if missing:
        lines = [
            f"plugin {m}: disabled_plugins names it"
            if isinstance(m, str)
            else f"plugin {m.name} ({m.value}) failed at {m.stage}: {m.error}"
            for m in missing
        ]
        installed = {point.name for point in points}
        if any(isinstance(m, FailedPlugin) and m.name in installed for m in missing):
            lines.append(
                "(an installed plugin of the same name takes priority: give yours another NAME=, or add --no-plugins)"
            )
        raise _UsageProblem("\n  ".join(["a plugin named by --plugin failed to load, so nothing was run:", *lines]))
    if refused:
        raise _UsageProblem(
            "\n  ".join(
                [
                    "a plugin the configuration sets up failed to load, so nothing was run:",
                    *(line for failed in refused for line in _config_failure_lines(failed, report, config)),
                ]
            )
        )
    # A misspelt table configures nothing: the policy it meant to set up would be silently off.
    unmatched = _unmatched_tables(config, report, options) if runs_calls else []
    if unmatched:
        raise _UsageProblem(
            "\n  ".join(
                [
                    "a [plugins.<name>] table configures no installed plugin, so nothing was run "
                    "(fix its name, or remove the table):",
                    *(f"[plugins.{table}] configures no installed plugin{hint}" for table, hint in unmatched),
                ]
            )
        )
    if not quiet:  # after the refusals: a command that runs nothing needs no lesser warning
        lines = _ignored_table_lines(report, config) + _misspelt_plugin_names(config, report, options)
        if not runs_calls:  # refused above when it runs calls
            lines += _unmatched_table_lines(config, report, options)
        _warn(lines)
    return _Host(runtime=runtime, report=report, config=config)


def _warn(lines: Sequence[str]) -> None:
    err = _stderr()
    for line in lines:
        err.print(terminal_text(f"warning: {line}"), soft_wrap=True)


def _unmatched_table_lines(config: DshConfig, report: PluginReport, options: _Options) -> list[str]:
    """What ``check`` and the commands that run no calls say of a table no installed plugin reads."""
    return [
        f"[plugins.{table}] configures no installed plugin: it is ignored{hint}"
        for table, hint in _unmatched_tables(config, report, options)
    ]


def _misspelt_plugin_names(config: DshConfig, report: PluginReport, options: _Options) -> list[str]:
    """``disabled_plugins`` and ``[tool_prefixes]`` names no plugin has, each with a "did you mean" hint.

    Entry-point names mix ``-`` and ``_`` (example-tools, tool_search): a
    misspelt name disables or prefixes nothing, without a word.
    """
    known = _known_plugin_names(report, options)
    lines = []
    for setting, names in (("disabled_plugins", config.disabled_plugins), ("tool_prefixes", config.tool_prefixes)):
        for name in names:
            if name not in known and name not in report.disabled:
                close = difflib.get_close_matches(name, sorted(known), n=1)
                hint = f' (did you mean "{close[0]}"?)' if close else ""
                lines.append(f'{setting} names "{name}", but no such plugin is installed{hint}')
    return lines


def _ignored_table_lines(report: PluginReport, config: DshConfig) -> list[str]:
    """A warning for each table of a loaded plugin that never reads one: settings there change nothing."""
    return [
        f"plugin {name} reads no configuration (it has no dsh_setup taking a config argument), "
        f"so its table {config.plugin_table(name)} has no effect"
        for name in report.ignored_tables
    ]


def _named_plugins_missing(
    report: PluginReport,
    config: DshConfig,
    named: Sequence[importlib.metadata.EntryPoint],
    refused: Sequence[FailedPlugin],
) -> list[FailedPlugin | str]:
    """The ``--plugin`` entry points that did not load: failed ones, and names ``disabled_plugins`` lists.

    The user asked for each by name, so a command that runs calls must not
    start without it (a typo, or a name an installed plugin already has, would
    leave its policy silently off). Failures the configuration check already
    refuses are left to it.
    """
    wanted = {(point.name, point.value) for point in named}
    missing: list[FailedPlugin | str] = [
        failed for failed in report.failed if (failed.name, failed.value) in wanted and failed not in refused
    ]
    loaded = {plugin.name for plugin in report.loaded}
    missing += [
        name
        for name in dict.fromkeys(point.name for point in named)
        if name in report.disabled and name in config.disabled_plugins and name not in loaded
    ]
    return missing


def _known_plugin_names(report: PluginReport, options: _Options) -> set[str]:
    """Every plugin name a table or a list in the configuration may rightly name.

    The installed entry points count even under ``--no-plugins``: a table for
    one of them is right, only not used this time.
    """
    known = {ep.name for ep in importlib.metadata.entry_points(group=options.group)}
    known |= {loaded.name for loaded in report.loaded} | {failed.name for failed in report.failed}
    return known | {_plugin_spec(spec)[0] for spec in options.extra_plugins}


def _unmatched_tables(config: DshConfig, report: PluginReport, options: _Options) -> list[tuple[str, str]]:
    """The ``[plugins.<name>]`` tables no plugin reads (``load_plugins`` finds them), each with a "did you mean" hint (or "")."""
    return [
        (table.name, f' (did you mean "{table.suggestion}"?)' if table.suggestion else "")
        for table in report.unmatched_tables
    ]


def _fatal_duplicates(failed: FailedPlugin, report: PluginReport) -> list[RefusedRegistration]:
    """The refused registrations of a tool name another plugin holds that made ``failed``'s setup fail.

    Empty when the failure had another cause.
    """
    if failed.stage != "setup":
        return []
    return [
        refusal
        for refusal in report.refused
        if refusal.conflicts_with is not None and refusal.plugin == failed.name and refusal.error in failed.error
    ]


def _duplicate_tool_text(refusal: RefusedRegistration) -> str:
    """``check``'s wording for a tool name another plugin holds: the holder, and the fix.

    Not the registry's own message: that speaks to a plugin author, not to the
    user who installed both plugins.
    """
    assert refusal.conflicts_with is not None
    return f'tool "{refusal.tool}" {_duplicate(refusal.plugin, refusal.conflicts_with)}'


def _duplicate_tool_line(refusal: RefusedRegistration) -> str:
    return f"plugin {refusal.plugin}: {_duplicate_tool_text(refusal)}"


def _duplicate_tool_lines(failed: FailedPlugin, report: PluginReport) -> list[str]:
    """A setup that failed on a tool name another plugin holds, in ``check``'s wording (else empty)."""
    return [_duplicate_tool_line(refusal) for refusal in _fatal_duplicates(failed, report)]


def _config_failure_lines(failed: FailedPlugin, report: PluginReport, config: DshConfig) -> list[str]:
    """A configured plugin's failure: each problem in its table, else how it failed; then the fix for its cause.

    Only a table ``dsh_setup`` refused is fixed in the table: a name clash is
    fixed by a prefix or by uninstalling a distribution, a plugin that cannot be
    imported by fixing or reinstalling it.
    """
    name = failed.name
    without = f'or list "{name}" in disabled_plugins to run without it'
    table = config.plugin_table(name)
    duplicates = _fatal_duplicates(failed, report)
    if duplicates:
        if all(refusal.conflicts_with == name for refusal in duplicates):
            hint = f"the plugin registers one tool name twice (its own bug): fix or update it, {without}"
        else:
            hint = f"a tool name clash, not a table problem: rename as above, {without}"
        return [*map(_duplicate_tool_line, duplicates), f"hint: {hint}"]
    if failed.violations:
        return [
            *(f"plugin {name}: {violation}" for violation in failed.violations),
            f"hint: fix its table {table}, {without}",
        ]
    if failed.shadowed_by is not None:
        skipped = f"{failed.distribution or 'an entry point'} ({failed.value})"
        return [
            f"plugin {name} ({config.plugin_table(name)} is set) is provided by two distributions: "
            f"{failed.shadowed_by} took the name and {skipped} was skipped; uninstall the one you do not mean "
            "(or, for a --plugin one, give it another NAME=)",
            f"hint: a plugin name clash, not a table problem: uninstall one distribution as above, {without}",
        ]
    if failed.stage == "setup":
        # Its dsh_setup raised something other than ConfigError: the table may or may not be the cause.
        hint = f"its dsh_setup failed (see its error): fix the plugin or its table {table}, {without}"
    else:
        hint = f"the plugin itself failed, not its table: fix or reinstall it, {without}"
    return [
        f"plugin {name} ({config.plugin_table(name)} is set) failed at {failed.stage}: {failed.error}",
        f"hint: {hint}",
    ]


def _scope_label(scope: object) -> str | None:
    if scope is None:
        return None
    if isinstance(scope, Agent):
        return scope.id
    return str(scope)


def _visible(runtime: ToolRuntime, scope: ScopeKey | None) -> list[tuple[ToolDefinition, str | None]]:
    defined_in = {id(definition): s for s, definition in runtime.registrations()}
    out = []
    for name in runtime.names(scope):
        definition = runtime.get(name, scope)
        if definition is not None:
            out.append((definition, _scope_label(defined_in.get(id(definition)))))
    return out


def _agent_option_value(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value == "":
        raise click.BadParameter("an agent id cannot be empty")
    return value


agent_option = click.option(
    "--agent",
    metavar="ID",
    default=DEFAULT_AGENT,
    show_default=True,
    callback=_agent_option_value,
    help="Act as this agent: its scope's tools and policies (approval needs an agent).",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output.")
session_option = click.option(
    "--session",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Append the calls and results to this session log (default: the config's session_log).",
)


# -- the command group -------------------------------------------------------------------

INTERRUPTED_EXIT = 130
"""Exit status after Ctrl-C: 128 + SIGINT, what a shell reports for a process the signal stopped."""


class _Commands(click.Group):
    """The ``dsh-tools`` group: Ctrl-C in any command exits 130, not click's 1.

    A script running ``dsh-tools`` tells an interrupted run from a failed one by
    that status, as it does for any other program; the message stays one line.
    A warning logged while a command runs, with no logging configured, is
    escaped as everything else the CLI prints is.
    """

    def invoke(self, ctx: click.Context) -> Any:
        try:
            with escaped_last_resort():
                return super().invoke(ctx)
        except KeyboardInterrupt:
            click.echo(err=True)  # closes the terminal's ^C echo, as click does
            click.echo("Aborted!", err=True)
            ctx.exit(INTERRUPTED_EXIT)


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Configuration file (default: ./dsh.toml, else [tool.dsh] in ./pyproject.toml); "
    "a file named pyproject.toml is read from its [tool.dsh] table.",
)
@click.option("--no-plugins", is_flag=True, help="Do not load the dsh entry-point plugins (debugging).")
@click.option(
    "--plugin",
    "extra_plugins",
    multiple=True,
    metavar="[NAME=]MODULE[:ATTR]",
    callback=_plugin_specs,
    help="Also load this plugin, as if it were an entry point (repeatable). Commands that run calls "
    "refuse to start when it does not load; an installed plugin of the same NAME keeps it.",
)
@click.option("--interactive", is_flag=True, help="Ask on the terminal when a policy says Ask (default: deny).")
@click.option(
    "--grants",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Standing approvals file: calls a grant covers are allowed without asking; "
    "with --interactive, answering 'a' records a grant there.",
)
@click.option("--group", default="dsh", hidden=True, help="Entry-point group to load plugins from.")
@click.option(
    "--mode",
    type=click.Choice(["native", "code", "both"]),
    default=None,
    help="Presentation mode, overriding the configuration (code/both enable run_code).",
)
@click.version_option(package_name="dsh-tools", prog_name="dsh-tools")
@click.pass_context
def cli(
    ctx: click.Context,
    config_path: Path | None,
    no_plugins: bool,
    extra_plugins: tuple[str, ...],
    interactive: bool,
    grants: Path | None,
    group: str,
    mode: str | None,
) -> None:
    """Inspect, call and check the tools of a dsh-tools host."""
    ctx.obj = _Options(
        config_path=config_path,
        no_plugins=no_plugins,
        extra_plugins=extra_plugins,
        interactive=interactive,
        group=group,
        mode=mode,
        grants=grants,
    )


def _default_timeout_ms(runtime: ToolRuntime) -> float | None:
    """The loaded timeout plugin's ``default_ms``: the budget of tools that declare none."""
    from dsh_plugins.timeout import PLUGIN_NAME, TimeoutPolicy

    policy = runtime.plugins.get_plugin(PLUGIN_NAME)
    return policy.default_ms if isinstance(policy, TimeoutPolicy) else None


@cli.command("list")
@agent_option
@json_option
@click.pass_context
def list_command(ctx: click.Context, agent: str | None, as_json: bool) -> None:
    """List the tools visible to the model."""
    host = _build_host(ctx)
    scope = agent_scope(host.runtime, agent)
    rows: list[dict[str, Any]] = []
    deferred = {definition.name for definition in host.runtime.deferred_tools(scope)}
    default_ms = _default_timeout_ms(host.runtime)
    for definition, defined_in in _visible(host.runtime, scope):
        declared = definition.timeout_ms
        rows.append(
            {
                "name": definition.name,
                "description": (definition.description.strip().splitlines() or [""])[0],
                "scope": defined_in,
                "parallel": definition.is_concurrency_safe is not None,
                # The budget a call gets: its own, else the timeout plugin's default_ms.
                "timeout_ms": declared if declared is not None else default_ms,
                "timeout_source": "tool" if declared is not None else "default" if default_ms is not None else None,
                # None: the tool declares nothing (not the same as declaring no effects, []).
                "effects": list(definition.effects.names) if definition.effects is not None else None,
                "retry_attempts": definition.retry.max_attempts if definition.retry is not None else None,
                # True: callable, but its schema reaches the model only once a search loads it.
                "deferred": definition.name in deferred,
                "revertible": definition.revert is not None,
            }
        )
    if as_json:
        _echo_json(rows, indent=2)
        return
    table = Table(title=f"{len(rows)} tool{'s' if len(rows) != 1 else ''} (mode: {host.runtime.effective_mode(scope)})")
    table.add_column("tool", overflow="fold", style="bold")
    table.add_column("description")
    table.add_column("scope", no_wrap=True)
    table.add_column("parallel", no_wrap=True)
    table.add_column("timeout", no_wrap=True, justify="right")
    table.add_column("effects")
    for row in rows:
        timeout = row["timeout_ms"]
        effects = row["effects"]
        attempts = row["retry_attempts"]
        notes = [
            note
            for note in (
                "deferred" if row["deferred"] else "",
                f"{attempts} tries" if attempts else "",
                "undoable" if row["revertible"] else "",
            )
            if note
        ]
        table.add_row(
            terminal_text(str(row["name"]), (f" ({', '.join(notes)})" if notes else "", "dim"), one_line=True),
            _cell(str(row["description"])),
            _cell(str(row["scope"] or "global")),
            "per call" if row["parallel"] else "no",
            "-"
            if not isinstance(timeout, int | float)
            else f"{timeout:g} ms (default)"
            if row["timeout_source"] == "default"
            else f"{timeout:g} ms",
            "-" if effects is None else ", ".join(name.replace("_", " ") for name in effects) or "none",
        )
    _stdout().print(table)


@cli.command("schemas")
@agent_option
@json_option
@click.pass_context
def schemas_command(ctx: click.Context, agent: str | None, as_json: bool) -> None:
    """Print the schemas the model is given, as JSON."""
    host = _build_host(ctx)
    scope = agent_scope(host.runtime, agent)
    # What a request carries, not every visible schema: under Code Mode only run_code is sent.
    try:
        carried = host.runtime.model_tools(scope)
    except DshError as exc:
        raise _UsageProblem(f"cannot tell what the model is sent: {exc}") from exc
    schemas = [schema.to_dict() for schema in carried.schemas]
    if carried.instructions:
        _stderr().print(
            f"note: in {host.runtime.effective_mode(scope)!r} mode the request also carries the Code Mode SDK "
            "text and its instructions (dsh-tools sdk prints the SDK)",
            soft_wrap=True,
        )
    if as_json:
        _echo_json(schemas, indent=2)
        return
    # Highlighted as written: print_json would decode and re-encode it, writing the escapes back raw.
    text = JSONHighlighter()(Text(json_printable(dumps_text(schemas, indent=2)), no_wrap=True))
    _stdout().print(text, soft_wrap=True)


@cli.command("sdk")
@agent_option
@click.pass_context
def sdk_command(ctx: click.Context, agent: str | None) -> None:
    """Print the Code Mode Python SDK generated for the tools the model is shown (deferred ones once loaded)."""
    try:
        from .code_mode import render_python_sdk
    except ImportError as exc:
        raise _UsageProblem(f"Code Mode is not available in this installation: {exc}") from exc
    host = _build_host(ctx)
    scope = agent_scope(host.runtime, agent)
    deferred = {definition.name for definition in host.runtime.deferred_tools(scope)}
    tools = [
        definition
        for definition, _ in _visible(host.runtime, scope)
        if definition.name != RUN_CODE_NAME and definition.name not in deferred
    ]
    sdk = render_python_sdk(tools)
    # Prompt text for the model, exact into a pipe; its descriptions may hold bidi controls.
    click.echo(printable(sdk) if _stdout_is_terminal() else sdk, nl=False)


# -- executing calls -------------------------------------------------------------------------


def _content_json(content: Sequence[ContentBlock]) -> list[dict[str, str]]:
    out = []
    for block in content:
        if isinstance(block, TextBlock):
            out.append({"type": "text", "text": block.text})
        elif isinstance(block, ImageBlock):
            out.append({"type": "image", "data": block.data, "mimeType": block.mime_type})
    return out


def _contexts_json(result: ToolExecutionResult) -> list[dict[str, Any]]:
    """The messages that follow the result in the model's context (a policy's rewrite note, say)."""
    return [
        {"source": context.source, "content": _content_json(context.content)}
        for context in result.additional_contexts
    ]


def _render(content: Sequence[ContentBlock]) -> str:
    return "\n".join(
        block.text if isinstance(block, TextBlock) else f"[image {block.mime_type}]"
        for block in content
        if isinstance(block, TextBlock | ImageBlock)
    )


def _error_json(result: ToolExecutionResult) -> dict[str, str | None] | None:
    if not result.is_error:
        return None
    info = result.error.info
    return {
        "message": result.error.message,
        "code": info.code if info else None,
        "name": info.name if info else None,
        "plugin": info.plugin if info else None,
    }


class _Recorder(SessionRecorder):
    """A session recorder that keeps its first write failure for the command to report.

    A ``dsh_result`` observer that raises is only a logged warning in the
    pipeline; the command must still say the log it was asked to keep is incomplete.
    """

    @hookimpl
    def dsh_result(self, execution: ToolExecution, result: ToolExecutionResult) -> None:
        with contextlib.suppress(OSError, SessionLogError):  # kept in self.failure
            super().dsh_result(execution, result)

    @hookimpl
    def dsh_call_unwound(self, execution: ToolExecution, cause: BaseException, body_started: bool) -> None:
        with contextlib.suppress(OSError, SessionLogError):  # kept in self.failure
            super().dsh_call_unwound(execution, cause, body_started)

    def event_sink(self, event_type: str, data: Mapping[str, Any]) -> None:
        with contextlib.suppress(OSError, SessionLogError):  # kept in self.failure
            super().event_sink(event_type, data)


class _Session:
    """Records calls (before they run) and results (as they settle) when a log was asked for."""

    def __init__(self, recorder: _Recorder | None, target: Path | None = None) -> None:
        self.recorder = recorder
        self.target = target
        self.failure: BaseException | None = None

    def attach(self, runtime: ToolRuntime) -> None:
        if self.recorder is not None:
            self.recorder.runtime = runtime  # each call then records its tool's contract fingerprint
            runtime.plugins.register(self.recorder, name="dsh-tools-session")
            if self.target is not None:
                clash = runtime.kept_file(str(self.target))
                if clash is not None:
                    # Another writer's lines in the session log make it unreadable from the first call.
                    raise _UsageProblem(f"the session log {self.target} is {clash}; give it a file of its own")
                runtime.kept_files.add(self.target, "the session log")
            runtime.event_sink = self.recorder.event_sink
            # A recorded session keeps each call's decision trace, for ``explain`` and ``simulate``.
            runtime.trace_decisions = True

    def call(self, request: ToolExecutionInput) -> None:
        """Record ``request`` before it runs; a log that cannot take it stops the command first."""
        if self.recorder is not None:
            try:
                self.recorder.record_call(request)
            except (OSError, SessionLogError) as exc:
                raise _UsageProblem(f"cannot write session log {self.target}: {_one_line(exc)}; nothing was run") from exc

    def unbegun(self, cause: BaseException) -> None:
        """The run was cut short: each recorded call it never began gets its ``tool/unwound``."""
        if self.recorder is not None:
            with contextlib.suppress(OSError, SessionLogError):  # kept in the recorder's failure
                self.recorder.record_unbegun(cause)

    def check(self) -> None:
        """Once the command's output is written: report a result or the close the log could not take."""
        failure = self.failure or (self.recorder.failure if self.recorder is not None else None)
        if failure is not None:
            raise _UsageProblem(
                f"cannot write session log {self.target}: {_one_line(failure)}; the calls ran but the log is incomplete"
            )


def _one_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


@contextmanager
def _session(path: Path | None, config: DshConfig) -> Iterator[_Session]:
    """The session the command records into; its ``check()`` reports a write that failed."""
    target = path if path is not None else (Path(config.session_log) if config.session_log else None)
    if target is None:
        yield _Session(None)
        return
    # A device (/dev/null, /dev/full), a FIFO or a directory: refused before anything runs, by the
    # check SessionLog makes, with the CLI's own wording.
    try:
        refuse_non_regular_target(target)
    except SessionLogError:
        raise _UsageProblem(f"cannot use {target} as the session log: not a regular file; nothing was run") from None
    try:
        log_cm = SessionLog(target)
    except SessionLogError as exc:
        # Not a log (a batch or notes file given by mistake), or another writer has it:
        # the log refuses before touching a byte.
        raise _UsageProblem(f"cannot use {target} as the session log: {exc}; nothing was written to it") from None
    except (OSError, ValueError) as exc:
        raise _UsageProblem(f"cannot open session log {target}: {exc}") from exc
    if log_cm.torn is not None:
        _stderr().print(
            terminal_text(f"warning: session log {target}: cut off a torn last line: {log_cm.torn}"),
            soft_wrap=True,
        )
    session = _Session(_Recorder(log_cm), target)
    try:
        yield session
    finally:
        try:
            log_cm.close()
        except (OSError, SessionLogError) as exc:
            session.failure = session.failure or exc


@cli.command("call")
@click.argument("name")
@click.argument("json_args", default="{}", metavar="[JSON_ARGS]")
@agent_option
@session_option
@click.pass_context
def call_command(ctx: click.Context, name: str, json_args: str, agent: str | None, session: Path | None) -> None:
    """Call one tool through the full pipeline and print what the model would see.

    JSON_ARGS is the arguments object as JSON (default: {}), checked as a
    model's arguments text is: an object that gives a key twice is refused.
    Exit status 1 when the call failed (its error code is printed on stderr).
    """
    # Parsed as the runtime parses a model's text, so the same arguments are refused (a
    # repeated key, NaN) here as in a batch; refused before any plugin loads, as a usage error.
    arguments = ArgumentsText(json_args)
    try:
        arguments.decode()
    except ArgumentsJsonError as exc:
        # The hint for a model (a call cut off at its output limit) does not fit text a person typed.
        message = str(exc).replace(TRUNCATED_HINT, "the text ends before the JSON does (check its quoting in your shell)")
        raise click.BadParameter(message, param_hint="JSON_ARGS") from exc
    except NonJsonValueError:
        pass  # JSON, but not losslessly (1e999): the call fails INVALID_ARGS, as a model's would
    host = _build_host(ctx, runs_calls=True)
    scope = agent_scope(host.runtime, agent)
    request = ToolExecutionInput(
        call_id=f"cli-{uuid.uuid4().hex[:12]}", name=name, arguments=arguments, signal=CancelSignal(), agent=scope
    )
    with _session(session, host.config) as log:
        log.attach(host.runtime)
        log.call(request)
        try:
            with _plain_interrupts():
                result = trio.run(host.runtime.execute, request)
        except BaseException as exc:
            log.unbegun(exc)
            raise
    _warn_orphans(host.runtime)
    text = "\n".join(
        part
        for part in (
            _render(result.content),
            *(f"[{context.source}] {_render(context.content)}" for context in result.additional_contexts),
        )
        if part
    )
    if text:
        # On a terminal the tool's text must not drive it; into a pipe it goes exactly as it
        # is (color=True: click would otherwise strip what looks like ANSI styling), but for
        # what the stream cannot encode (a lone surrogate), which is written as its escape.
        if _stdout_is_terminal():
            click.echo(printable(text))
        else:
            encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
            click.echo(text.encode(encoding, "backslashreplace").decode(encoding), color=True)
    if result.is_error:
        error = _error_json(result) or {}
        click.echo(f"error: {printable(error.get('code') or 'unknown')}{_decided_by(error, host.runtime)}", err=True)
        if _nobody_could_approve(request, result):
            options: _Options = ctx.find_object(_Options)  # type: ignore[assignment]
            why = "" if options.grants is not None else "nobody could be asked for approval: "
            click.echo(f"hint: {why}{_approval_next_step(options, [name], agent, 1)}", err=True)
    log.check()
    if result.is_error:
        ctx.exit(1)


def _decided_by(error: Mapping[str, str | None], runtime: ToolRuntime) -> str:
    """`` (plugin X)`` for the plugin a failure blames; the pipeline's own approval step is no plugin."""
    plugin = error.get("plugin")
    if not plugin:
        return ""
    if plugin == "approval" and not runtime.plugins.has_plugin(plugin):
        return " (approval)"
    return f" (plugin {printable(plugin)})"


def _nobody_could_approve(call: ToolExecutionInput, result: ToolExecutionResult) -> bool:
    """Whether ``call`` was denied because its ``Ask`` could be put to no one."""
    if not isinstance(result, ToolExecutionFailure) or result.error.info is None:
        return False
    info = result.error.info
    return (info.code, info.plugin, result.error.message) == (
        ErrorCode.DENIED,
        "approval",
        approval_unavailable_reason(call.name),
    )


def _approval_next_step(options: _Options, tools: Sequence[str], agent: str | None, count: int) -> str:
    """How the person running the command could answer the ``Ask`` of ``count`` calls that nobody could.

    Without ``--interactive`` the CLI's approval service answers no one; with
    ``--grants``, a grant in force would have answered instead. The commands
    it suggests are pasted into a shell, and a tool name comes from an MCP
    server or a model: each piece is shell-quoted, so ``$(...)`` in a name
    stays text, and the line is escaped, so it cannot drive the terminal.
    """
    if options.grants is not None:
        grants = shlex.quote(str(options.grants))
        which = "this call" if count == 1 else "them"
        return printable(
            f"no grant in force in {grants} covers {which} (dsh-tools grants show {grants} lists them); "
            "add --interactive to be asked at this terminal",
            one_line=True,
        )
    tool = shlex.quote(tools[0]) if len(set(tools)) == 1 else "TOOL"
    who = f"--agent {shlex.quote(agent)}" if agent is not None else "--any-agent"
    return printable(
        "add --interactive to answer at this terminal, or --grants FILE to answer from standing grants "
        f"(dsh-tools grants add FILE {tool} {who})",
        one_line=True,
    )


@contextmanager
def _plain_interrupts() -> Iterator[None]:
    """Let Ctrl-C in a trio run reach click as a plain ``KeyboardInterrupt``.

    trio raises the interrupt inside a task, and a nursery (``run`` overlaps
    calls in one) wraps it in a ``BaseExceptionGroup``, which click would show
    as a traceback: unwrapped, it exits 130 with "Aborted!" as every command does.
    """
    try:
        yield
    except BaseExceptionGroup as group:
        if group.subgroup(KeyboardInterrupt) is not None:
            raise KeyboardInterrupt from None
        raise


def _warn_orphans(runtime: ToolRuntime) -> None:
    """Name every worker thread a cancelled call left running: it dies with this process."""
    for work in runtime.orphaned_work():
        click.echo(
            f"warning: call {printable(work.call_id, one_line=True)} ({printable(work.tool, one_line=True)}) "
            f"was cancelled while a worker thread ran {printable(work.function, one_line=True)}; "
            "the thread was still running at exit and was stopped with the process",
            err=True,
        )


def _parse_batch(path: Path) -> list[ToolExecutionInput]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise _UsageProblem(f"cannot read {path}: {exc}") from exc
    # JSON lines end at "\n" only: str.splitlines() would also split at U+2028, U+2029
    # and U+0085, which a JSON string may hold raw, and miscount the lines after them.
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    calls: list[ToolExecutionInput] = []
    problems: list[str] = []
    ids: set[str] = set()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            record = decode_json(line)
        except IntegerTooLongError as exc:
            problems.append(f"{where}: cannot be read: it holds {exc}")
            continue
        except ValueError as exc:
            problems.append(f"{where}: not valid JSON: {exc}")
            continue
        if not isinstance(record, dict):
            problems.append(f"{where}: expected an object with id, name and arguments")
            continue
        # The parser keeps a repeated key's last value, where a policy or the tool may read
        # the first: refused in the record and its arguments object, as in a model's text.
        repeated = _repeated_key(line)
        if repeated is not None:
            problems.append(f"{where}: the key {dumps_text(repeated)} is given twice in one object")
            continue
        unknown = sorted(set(record) - {"id", "name", "arguments"})
        call_id, name = record.get("id"), record.get("name")
        line_problems = []
        if unknown:
            line_problems.append(f"unknown key(s) {', '.join(unknown)}")
        if not isinstance(call_id, str) or not call_id:
            line_problems.append('"id" must be a non-empty string')
        elif call_id in ids:
            line_problems.append(f'duplicate id "{call_id}"')
        if not isinstance(name, str) or not name:
            line_problems.append('"name" must be a non-empty string')
        if line_problems:
            problems.append(f"{where}: " + "; ".join(line_problems))
            continue
        assert isinstance(call_id, str) and isinstance(name, str)
        ids.add(call_id)
        arguments = record.get("arguments", {})
        if isinstance(arguments, str):
            # As a model emits them: a JSON text, parsed by the runtime, which fails a
            # text that is not JSON INVALID_ARGS and says so to the model.
            arguments = ArgumentsText(arguments)
        calls.append(ToolExecutionInput(call_id=call_id, name=name, arguments=arguments, signal=CancelSignal()))
    if problems:
        # The first 20 (a file of 100 000 bad lines printed 6.6 MB of problems).
        raise _UsageProblem(f"invalid batch file {path}:\n  " + bounded_listing(problems, separator="\n  "))
    return calls


class _ProgressObserver:
    """Advances the progress bar as each top-level call of the batch settles."""

    def __init__(self, progress: Progress, task: Any, call_ids: set[str]) -> None:
        self._progress = progress
        self._task = task
        self._call_ids = call_ids

    @hookimpl
    def dsh_result(self, execution: ToolExecution, result: ToolExecutionResult) -> None:
        if execution.parent is None and execution.call_id in self._call_ids:
            self._progress.advance(self._task)


@cli.command("run")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--max-parallel", default=10, show_default=True, type=click.IntRange(min=1), help="Parallel pool size.")
@agent_option
@session_option
@click.pass_context
def run_command(ctx: click.Context, file: Path, max_parallel: int, agent: str | None, session: Path | None) -> None:
    """Run a batch of model tool calls from a JSON-lines file.

    Each line is {"id": ..., "name": ..., "arguments": {...} or "<json text>"}.
    The calls run like one model turn (consecutive parallel-safe calls overlap);
    one JSON result line per call is written to stdout, in input order. Exit
    status 0 once the batch ran, even when calls failed.
    """
    calls = _parse_batch(file)
    host = _build_host(ctx, runs_calls=True)
    scope = agent_scope(host.runtime, agent)
    if scope is not None:
        calls = [attrs.evolve(call, agent=scope) for call in calls]
    err = _stderr()
    options: _Options = ctx.find_object(_Options)  # type: ignore[assignment]
    progress = Progress(
        TextColumn("running tool calls"),
        BarColumn(),
        MofNCompleteColumn(),
        console=err,
        transient=True,
        # A bar redrawn while a question waits would draw over it.
        disable=not err.is_terminal or options.interactive,
    )
    task = progress.add_task("calls", total=len(calls))
    observer = _ProgressObserver(progress, task, {call.call_id for call in calls})
    with _session(session, host.config) as log:
        log.attach(host.runtime)
        for call in calls:
            log.call(call)
        host.runtime.plugins.register(observer, name="dsh-tools-progress")
        try:
            with _plain_interrupts(), progress:
                results = trio.run(run_tool_calls, host.runtime, calls, max_parallel)
        except BaseException as exc:
            log.unbegun(exc)
            raise
        finally:
            host.runtime.plugins.unregister(observer)
    _warn_orphans(host.runtime)
    for call, result in zip(calls, results, strict=True):
        line = {
            "id": call.call_id,
            "name": call.name,
            "is_error": result.is_error,
            "content": _content_json(result.content),
            "error": _error_json(result),
            "meta": thaw(result.meta),
            "contexts": _contexts_json(result),
        }
        _echo_json(line)
    unanswered = [call.name for call, result in zip(calls, results, strict=True) if _nobody_could_approve(call, result)]
    if unanswered:
        step = _approval_next_step(options, unanswered, agent, len(unanswered))
        why = "" if options.grants is not None else "nobody could be asked: "
        click.echo(f"hint: {len(unanswered)} call(s) needed approval, and {why}{step}", err=True)
    log.check()


# -- diagnostics -------------------------------------------------------------------------------


@attrs.define
class _Findings:
    problems: list[str] = attrs.field(factory=list)
    warnings: list[str] = attrs.field(factory=list)


def _check_tool(definition: ToolDefinition, owner: str, findings: _Findings) -> None:
    """Schemas against the enforced subset (problems), MCP's depth and a provider-safe name (warnings)."""
    from ._mcp_server import mcp_listing_problem
    from ._schema._subset import TOOL_ARGUMENTS_ROOT
    from .schema import assert_object_json_schema, assert_supported_json_schema

    def assert_parameters(schema: object) -> None:
        assert_object_json_schema(schema, reason=TOOL_ARGUMENTS_ROOT)

    for what, schema, check in (
        ("parameters", definition.parameters, assert_parameters),
        ("output", definition.output.schema, assert_supported_json_schema),
    ):
        try:
            check(schema)
        except JsonSchemaError as exc:
            for violation in exc.violations:
                findings.problems.append(f'{owner}: tool "{definition.name}" {what}: {violation}')
    listing_problem = mcp_listing_problem(definition.schema, definition)
    if listing_problem is not None:
        findings.warnings.append(
            f'{owner}: tool "{definition.name}" cannot be served over MCP: {listing_problem} '
            "(serve-mcp leaves it out of its tool list)"
        )
    if not PROVIDER_TOOL_NAME.fullmatch(definition.name):
        findings.warnings.append(
            f'{owner}: tool name "{definition.name}" does not match ^{PROVIDER_TOOL_NAME.pattern}$ '
            "(some model providers will refuse it)"
        )
    effects = definition.effects
    if definition.retry is not None and effects is not None and effects.destructive and not effects.idempotent:
        findings.warnings.append(
            f'{owner}: tool "{definition.name}" retries a destructive, non-idempotent body: a failure after its '
            "effect happened would repeat it (raise TransientToolError only when nothing happened, or narrow retry_on)"
        )


def _duplicate(plugin: str, holder: str) -> str:
    """What to say about a tool name ``plugin`` registered while ``holder`` had it already."""
    if plugin == "mcp":
        # The MCP client registers every server's tools itself: [tool_prefixes] cannot tell them apart.
        if holder == plugin:
            also = "another of its servers"
        else:
            also = "the host" if holder == "<host>" else f"plugin {holder}"
        return (
            f"was listed by an MCP server while {also} already registered it (duplicate tool name; "
            "to load both, give each [[plugins.mcp.servers]] entry its own prefix)"
        )
    if holder == plugin:
        return "is registered twice by this plugin itself (its own duplicate: the second registration was refused)"
    owner = "the host" if holder == "<host>" else f"plugin {holder}"
    return (
        f"is already registered by {owner} (duplicate tool name; to load both, "
        f'give one a prefix: [tool_prefixes] {plugin} = "..." in dsh.toml)'
    )


def _diagnose(host: _Host, options: _Options) -> tuple[_Findings, int]:
    from ._waterfall import WATERFALLS, HookChains

    runtime, report = host.runtime, host.report
    pm = runtime.plugins
    findings = _Findings()
    folded: list[RefusedRegistration] = []  # said with the failure they caused
    for failed in report.failed:
        origin = f" from {failed.distribution} {failed.version}" if failed.distribution else ""
        duplicates = _fatal_duplicates(failed, report)
        if duplicates:
            # The holder and the fix, not the registry's hint for plugin authors next to it.
            folded.extend(duplicates)
            findings.problems.extend(
                f"plugin {failed.name} ({failed.value}{origin}) failed at {failed.stage}: {_duplicate_tool_text(refusal)}"
                for refusal in duplicates
            )
        elif failed.violations:
            # Each problem of its table on its own line, as for the host's own settings.
            findings.problems.extend(
                f"plugin {failed.name} ({failed.value}{origin}) failed at {failed.stage}: invalid configuration: "
                f"{violation}"
                for violation in failed.violations
            )
        else:
            findings.problems.append(
                f"plugin {failed.name} ({failed.value}{origin}) failed at {failed.stage}: {failed.error}"
            )

    for refusal in report.refused:
        tool = f'tool "{refusal.tool}"' if refusal.tool else "a registration"
        owner = f"plugin {refusal.plugin}"
        if refusal.conflicts_with is not None:
            if all(refusal is not said for said in folded):
                findings.problems.append(f"{owner}: {_duplicate_tool_text(refusal)}")
            # Refused for its name alone: the rest of its checks still apply.
            if refusal.definition is not None:
                _check_tool(refusal.definition, owner, findings)
        else:
            findings.problems.append(f"{owner}: {tool} was refused: {refusal.error}")

    plugin_of_tool = {name: loaded.name for loaded in report.loaded for name in loaded.tools}
    registrations = runtime.registrations()
    for _scope_key, definition in registrations:
        name = definition.name
        _check_tool(definition, f"plugin {plugin_of_tool[name]}" if name in plugin_of_tool else "host", findings)

    chains = HookChains(pm)
    scopes: list[Any] = [None]
    for plugin in pm.get_plugins():
        scope = getattr(plugin, "dsh_scope", None)
        if scope is not None and all(scope is not s for s in scopes):
            scopes.append(scope)
    for hook_name in WATERFALLS:
        seen: set[tuple[str, int]] = set()
        for scope in scopes:
            for listener in chains.listeners(hook_name, scope):
                key = (listener.plugin_name, id(listener.fn))
                if listener.problem is not None and key not in seen:
                    seen.add(key)
                    findings.problems.append(f"plugin {listener.problem}")

    loaded_names = {loaded.name for loaded in report.loaded}
    for plugin, message in unknown_hooks(pm):
        findings.problems.append(f"plugin {pm.get_name(plugin)}: {message}")

    if host.config.session_log:
        clash = runtime.kept_file(os.path.abspath(host.config.session_log))
        if clash is not None:
            findings.problems.append(
                f"session_log {host.config.session_log!r} is {clash}: two writers in one file make it unreadable; "
                "give the session log a file of its own"
            )

    if host.config.strict_capabilities:
        for loaded in report.loaded:
            if loaded.capabilities is None:
                findings.warnings.append(
                    f"plugin {loaded.name} declares no DSH_CAPABILITIES: under strict_capabilities it may "
                    "register no tools and decide no calls"
                )

    # Plugins may report their own findings (e.g. the MCP client's schema downgrades).
    for plugin in pm.get_plugins():
        diagnostics = getattr(plugin, "diagnostics", None)
        if not callable(diagnostics) or isinstance(plugin, type):
            continue
        try:
            items = list(diagnostics())
        except Exception as exc:
            findings.problems.append(f"plugin {pm.get_name(plugin)}: diagnostics() failed: {exc}")
            continue
        for item in items:
            target = findings.problems if getattr(item, "level", "warning") == "problem" else findings.warnings
            target.append(f"plugin {pm.get_name(plugin)}: {item}")

    # Standing grants (--grants FILE) belong to the approval service, not to a plugin.
    book: Any = getattr(host.runtime.approval, "book", None)
    book_diagnostics = getattr(book, "diagnostics", None)
    if callable(book_diagnostics):
        try:
            where = getattr(book, "path", None)
            findings.warnings.extend(f"grants {where}: {item}" for item in book_diagnostics(host.runtime))
        except Exception as exc:
            findings.problems.append(f"grants: diagnostics() failed: {exc}")

    for plugin_name in host.config.tool_prefixes:
        if plugin_name not in loaded_names:
            findings.warnings.append(f'tool_prefixes names "{plugin_name}", but no such plugin is loaded')
        elif plugin_name == "mcp":
            findings.warnings.append(
                'tool_prefixes names "mcp": it prefixes only the tools listed at setup, not those a server '
                "lists later; give each [[plugins.mcp.servers]] entry a prefix instead"
            )

    known = _known_plugin_names(report, options)
    for disabled in host.config.disabled_plugins:
        if disabled not in known and disabled not in report.disabled:
            findings.warnings.append(f'disabled_plugins names "{disabled}", but no such plugin is installed')
    findings.warnings.extend(_unmatched_table_lines(host.config, report, options))
    findings.warnings.extend(
        f"{host.config.plugin_table(name)} is configured, but {name} is in disabled_plugins: the table has no effect"
        for name in host.config.disabled_plugins
        if name in host.config.plugins
    )
    findings.warnings.extend(_ignored_table_lines(report, host.config))
    return findings, len(registrations)


@cli.command("check")
@click.option("--strict", is_flag=True, help="Treat warnings as problems.")
@click.pass_context
def check_command(ctx: click.Context, strict: bool) -> None:
    """Load the plugins and report every problem found (plugin author's doctor).

    Exit status 1 when there is any problem (or, with --strict, any warning).
    """
    host = _build_host(ctx, quiet=True)
    options: _Options = ctx.find_object(_Options)  # type: ignore[assignment]
    findings, tool_count = _diagnose(host, options)
    out = _stdout()
    for problem in findings.problems:
        out.print(terminal_text(("problem:", "red"), f" {problem}"), soft_wrap=True)
    for warning in findings.warnings:
        out.print(terminal_text(("warning:", "yellow"), f" {warning}"), soft_wrap=True)
    report = host.report
    summary = (
        f"{len(report.loaded)} plugin(s) loaded, {len(report.failed)} failed, {len(report.disabled)} disabled; "
        f"{tool_count} tool(s) registered; "
        f"{len(findings.problems)} problem(s), {len(findings.warnings)} warning(s)"
    )
    out.print(summary, soft_wrap=True)
    if findings.problems or (strict and findings.warnings):
        ctx.exit(1)


@cli.command("serve-mcp")
@click.option("--http", is_flag=True, help="Serve streamable HTTP instead of stdio.")
@click.option(
    "--port", default=None, type=click.IntRange(1, 65535), help="With --http: the port on 127.0.0.1 (default 8765)."
)
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="With --http: the bearer token clients must send is this file's first line "
    "(the file must be readable by its owner only). Default: $DSH_MCP_TOKEN, else a token "
    "made for this run and printed to stderr.",
)
@click.option(
    "--no-auth",
    is_flag=True,
    help="With --http: require no token. Any process of any user on this machine can then call every tool served.",
)
@click.option(
    "--approval-timeout",
    "approval_timeout",
    default=600.0,
    show_default=True,
    type=click.FloatRange(min=0, min_open=True, max=86_400),
    metavar="SECONDS",
    help="How long a client has to answer an approval question; no answer in time denies the call.",
)
@agent_option
@click.pass_context
def serve_mcp_command(
    ctx: click.Context,
    http: bool,
    port: int | None,
    token_file: Path | None,
    no_auth: bool,
    approval_timeout: float,
    agent: str | None,
) -> None:
    """Serve the visible tools over MCP; every call runs the full pipeline.

    stdio by default (nothing else is written to stdout), or streamable HTTP
    bound to 127.0.0.1 with --http. Over HTTP every request must carry
    "Authorization: Bearer <token>" (see --token-file), unless --no-auth.
    """
    if port is not None and not http:
        raise _UsageProblem("--port needs --http (without it, serve-mcp serves stdio and listens on no port)")
    try:
        token = serve_token(http=http, token_file=token_file, no_auth=no_auth)
    except TokenSourceError as exc:
        raise _UsageProblem(str(exc)) from None
    # _mcp_server imports the SDK only when serving starts, so an ImportError around
    # importing it would come too late: ask whether the extra is installed first.
    if importlib.util.find_spec("mcp") is None:
        raise _UsageProblem("serve-mcp needs the MCP extra: pip install 'dsh-tools[mcp]'")
    if http and importlib.util.find_spec("hypercorn") is None:
        raise _UsageProblem("serve-mcp --http needs hypercorn, part of the MCP extra: pip install 'dsh-tools[mcp]'")
    from ._mcp_server import DEFAULT_HTTP_PORT, run_serve_mcp

    # Warnings go to stderr, apart from the stdio protocol: a long-running server must not hide them.
    host = _build_host(ctx, runs_calls=True)
    port = port or DEFAULT_HTTP_PORT
    try:
        with _plain_interrupts():
            run_serve_mcp(
                host.runtime,
                http=http,
                port=port,
                agent=agent,
                bearer_token=token.value,
                on_listening=partial(_announce_listening, token),
                approval_timeout_s=approval_timeout,
            )
    except BaseExceptionGroup as group:
        # hypercorn binds inside a trio nursery, which wraps the error in a group.
        bind_failure = _bind_failure(group) if http else None
        if bind_failure is None:
            raise
        raise _UsageProblem(f"cannot listen on 127.0.0.1:{port}: {bind_failure.strerror}") from None
    except OSError as exc:
        if not http or _bind_failure(exc) is None:
            raise
        raise _UsageProblem(f"cannot listen on 127.0.0.1:{port}: {exc.strerror}") from None


def _announce_listening(token: ServeToken, urls: list[str]) -> None:
    """Tell the user on stderr where the server listens and, for a token made for this run, what to send."""
    err = _stderr()
    for url in urls:
        err.print(terminal_text(f"serve-mcp: listening on {url}/mcp"), soft_wrap=True)
    if token.value is None:
        err.print(
            terminal_text(
                ("warning:", "yellow"), " no authentication (--no-auth): any local process can call these tools"
            ),
            soft_wrap=True,
        )
    elif token.generated:
        # Printed once, here only: soft_wrap keeps the header on one line to copy.
        header = f"Authorization: Bearer {token.value}"
        err.print(terminal_text(f"serve-mcp: clients must send the header: {header}"), soft_wrap=True)
        err.print(
            terminal_text("serve-mcp: the token is new for this run; set DSH_MCP_TOKEN or --token-file to choose one"),
            soft_wrap=True,
        )
    else:
        err.print(
            terminal_text("serve-mcp: clients must send the header: Authorization: Bearer <the token>"), soft_wrap=True
        )


# What binding a listening socket fails with: the port is taken, privileged, or not on this host.
_BIND_ERRNOS = frozenset({errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES})


def _bind_failure(exc: BaseException) -> OSError | None:
    """The bind error in ``exc`` (an ``OSError`` or a group holding only one), else None."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if isinstance(exc, OSError) and exc.errno in _BIND_ERRNOS:
        return exc
    return None


@cli.command("replay")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.pass_context
def replay_command(ctx: click.Context, file: Path) -> None:
    """Render a recorded session in the terminal, from the log alone.

    Cards come from the installed tools' presenters (pure functions of the
    arguments and the durable result), so the replay matches what was shown live.
    """
    from ._terminal_cards import render_replayed_call

    read = _read_log(file)
    host = _build_host(ctx, quiet=True)
    out = _stdout()
    try:
        calls = replay(read, host.runtime)
    except SessionLogError as exc:
        raise _UsageProblem(f"cannot read session log {file}: {exc}") from exc
    if not calls:
        out.print("(no tool calls in this session)")
    for call in calls:
        out.print(render_replayed_call(call))


def _read_log(file: Path) -> SessionLogRead:
    try:
        read = read_session_log(file)
    except (OSError, SessionLogError) as exc:
        raise _UsageProblem(f"cannot read session log {file}: {exc}") from exc
    if read.torn is not None:
        _stderr().print(terminal_text(f"warning: skipped a torn last line: {read.torn}"))
    return read


@cli.command("explain")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("call_id")
@click.option(
    "--agent",
    metavar="ID",
    default=None,
    help="The agent that made the call ('' for the global scope); needed when several agents used CALL_ID.",
)
@json_option
@click.pass_context
def explain_command(ctx: click.Context, file: Path, call_id: str, agent: str | None, as_json: bool) -> None:
    """Show how the policy stack decided one recorded call: its decision trace.

    Sessions recorded by ``call`` and ``run`` carry traces; a host records them
    with ``ToolRuntime(trace_decisions=True)`` and a ``SessionRecorder``. Exit
    status 1 when the call's result has no trace, 2 when the log has no such call
    (or several agents made one and ``--agent`` does not say whose).
    """
    read = _read_log(file)
    try:
        matching = [logged for logged in logged_calls(read.events) if logged.call_id == call_id]
    except SessionLogError as exc:
        raise _UsageProblem(f"cannot read session log {file}: {exc}") from exc
    call = _explained_call(matching, file, call_id, agent)
    result = call.result
    trace = None
    if result is not None and result.get("trace") is not None:
        try:
            trace = DecisionTrace.from_json(thaw(result["trace"]))
        except ValueError as exc:
            raise _UsageProblem(f"{file}: call {call_id}: {exc}") from exc
    error = result.get("error") if result is not None else None
    if as_json:
        data = {
            "callId": call_id,
            "name": call.name,
            "agent": call.agent,
            "isError": result.get("isError") if result is not None else None,
            "error": thaw(error),
            "trace": trace.to_json() if trace is not None else None,
        }
        if call.unwound is not None:
            data["unwound"] = dict(call.unwound)  # only then: the output of a finished call is unchanged
        _echo_json(data, indent=2)
    else:
        out = _stdout()
        made_by = f" (agent {call.agent})" if call.agent else ""
        outcome: tuple[tuple[str, str], ...]
        if result is None:
            outcome = ((call.unsettled_note(), "yellow"),)
        elif result.get("isError"):
            code, message = (error or {}).get("code"), (error or {}).get("message")
            outcome = ((f"failed {code}", "red"), (f": {clipped(str(message))}", ""))
        else:
            outcome = (("succeeded", "green"),)
        # One line, the failure's message too: a newline in a model's tool name or in a message
        # quoting it would draw a line that reads as another call's outcome.
        out.print(terminal_text(f"call {call_id}: {call.name}{made_by}: ", *outcome, one_line=True), soft_wrap=True)
        if trace is not None:
            table = Table(title="decision trace")
            table.add_column("#", justify="right", no_wrap=True)
            table.add_column("stage", no_wrap=True)
            table.add_column("actor", overflow="fold")
            table.add_column("outcome", overflow="fold")
            for number, step in enumerate(trace, start=1):
                style = "red" if step.outcome.startswith(("deny", "block", "error", "fail")) else ""
                style = style or ("yellow" if step.outcome.startswith("ask") else "")
                table.add_row(str(number), _cell(step.stage), _cell(step.actor), _cell(step.outcome, style))
            out.print(table)
    if trace is None:
        _stderr().print(
            terminal_text(
                f"no decision trace was recorded for {call_id}: the session was recorded without "
                "trace_decisions, or the call failed before any policy ran"
            ),
            soft_wrap=True,
        )
        ctx.exit(1)


def _explained_call(matching: list[LoggedCall], file: Path, call_id: str, agent: str | None) -> LoggedCall:
    """The latest of ``matching`` (the calls with ``call_id``, as replay pairs them) made by ``agent``.

    Call ids are per conversation, so agents sharing a log may each have one:
    without ``--agent`` the id must name one agent's calls (``''`` names the global scope).
    """
    if not matching:
        raise _UsageProblem(f'no tool call "{call_id}" in {file}')
    agents = list(dict.fromkeys(logged.agent for logged in matching))
    if agent is not None:
        wanted = agent or None
        matching = [logged for logged in matching if logged.agent == wanted]
        if not matching:
            whose = "the global scope" if wanted is None else f'agent "{wanted}"'
            raise _UsageProblem(f'no tool call "{call_id}" of {whose} in {file} (made by {_agent_names(agents)})')
    elif len(agents) > 1:
        raise _UsageProblem(
            f'call id "{call_id}" was used by more than one agent in {file}: {_agent_names(agents)}; '
            "pass --agent ID (--agent '' for the global scope)"
        )
    return matching[-1]  # the latest call with this id, as replay does


def _agent_names(agents: list[str | None]) -> str:
    names = [f'"{agent}"' for agent in agents if agent is not None]
    if None in agents:
        names.append("the global scope")
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


@cli.command("simulate")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The configuration whose policy stack to try (default: the global --config, else the usual lookup).",
)
@json_option
@click.pass_context
def simulate_command(ctx: click.Context, file: Path, config_path: Path | None, as_json: bool) -> None:
    """Replay a recorded session's calls through a new policy stack, running no tool.

    Plugins are loaded from the configuration as usual, but their tools are set
    aside: each recorded tool gets a stand-in, and every dispatch is answered
    from the log. Prints each call whose decision (allow, deny, ask, rewrite) would
    change. Exit status 1 when any would, 0 otherwise (usable in CI).
    """
    from ._simulate import SimulationRuntime, simulate

    read = _read_log(file)
    # A policy under test that failed to load must not pass as "nothing would change".
    host = _build_host(ctx, config_path=config_path, runtime_class=SimulationRuntime, runs_calls=True)
    try:
        with _plain_interrupts():
            report = trio.run(simulate, read, host.runtime)
    except SessionLogError as exc:
        raise _UsageProblem(f"cannot simulate {file}: {exc}") from exc
    if as_json:
        rows = [
            {
                "callId": call.call_id,
                "name": call.name,
                "agent": call.agent,
                "recorded": attrs.asdict(call.recorded) if call.recorded else None,
                "simulated": attrs.asdict(call.simulated) if call.simulated else None,
                "changed": call.changed,
                "summary": call.summary,
            }
            for call in report.calls
        ]
        _echo_json({"changed": report.changed, "calls": rows}, indent=2)
    else:
        out = _stdout()
        changes = report.changes
        if changes:
            table = Table(title=f"{len(changes)} of {len(report.calls)} call(s) would be decided differently")
            table.add_column("call", overflow="fold")
            table.add_column("tool", overflow="fold")
            table.add_column("agent", overflow="fold")
            table.add_column("change", overflow="fold")
            table.add_column("by", overflow="fold")
            for call in changes:
                by = call.simulated.actor if call.simulated is not None else None
                table.add_row(
                    *(_cell(text) for text in (call.call_id, call.name, call.agent or "-", call.summary, by or "-"))
                )
            out.print(table)
        skipped = [call for call in report.calls if call.recorded is None or call.simulated is None]
        for call in skipped:
            line = f"{call.call_id} ({call.name}): {call.summary}"
            out.print(terminal_text((line, "dim"), one_line=True), soft_wrap=True)
        compared = len(report.calls) - len(skipped)
        out.print(
            f"{compared} call(s) compared, {len(changes)} would change, {len(skipped)} not compared", soft_wrap=True
        )
    if report.changed:
        ctx.exit(1)


def _print_capabilities(host: _Host, as_json: bool) -> None:
    report, strict = host.report, host.config.strict_capabilities
    if as_json:
        rows = [
            {
                "plugin": loaded.name,
                "declared": loaded.capabilities is not None,
                "tools": list(loaded.capabilities.tools) if loaded.capabilities else [],
                "affects": list(loaded.capabilities.affects) if loaded.capabilities else [],
                "registered": list(loaded.tools),
            }
            for loaded in report.loaded
        ]
        _echo_json({"strict": strict, "plugins": rows}, indent=2)
        return
    table = Table(title=f"plugin capabilities (strict_capabilities: {'on' if strict else 'off'})")
    for column in ("plugin", "tools", "affects", "registered"):
        table.add_column(column, overflow="fold")
    for loaded in report.loaded:
        declared = loaded.capabilities
        if declared is not None:
            tools = _cell(", ".join(declared.tools) or "(none)")
            affects = _cell(", ".join(declared.affects) or "(none)")
        else:
            missing = ("not declared (none)", "yellow") if strict else ("not declared", "dim")
            tools, affects = _cell(*missing), _cell(*missing)
        table.add_row(_cell(loaded.name), tools, affects, _cell(", ".join(loaded.tools) or "-"))
    _stdout().print(table)


@cli.command("plugins")
@click.option("--capabilities", is_flag=True, help="Show each plugin's DSH_CAPABILITIES manifest.")
@json_option
@click.pass_context
def plugins_command(ctx: click.Context, capabilities: bool, as_json: bool) -> None:
    """Show which plugins loaded, which failed (and why) and which are disabled."""
    host = _build_host(ctx, quiet=True)
    report = host.report
    # Failures are this command's own output; a misspelt table or name is none, yet the place to look.
    options: _Options = ctx.find_object(_Options)  # type: ignore[assignment]
    _warn(
        _unmatched_table_lines(host.config, report, options)
        + _misspelt_plugin_names(host.config, report, options)
        + _ignored_table_lines(report, host.config)
    )
    if capabilities:
        _print_capabilities(host, as_json)
        return
    if as_json:
        data = {
            "loaded": [attrs.asdict(p) for p in report.loaded],
            "failed": [attrs.asdict(p, filter=lambda a, _: a.name != "traceback") for p in report.failed],
            "disabled": list(report.disabled),
        }
        _echo_json(data, indent=2)
        return
    out = _stdout()
    table = Table(title="loaded plugins")
    for column in ("plugin", "entry point", "distribution", "version", "tools"):
        table.add_column(column, overflow="fold")
    for loaded in report.loaded:
        table.add_row(
            *(
                _cell(text)
                for text in (
                    loaded.name,
                    loaded.value,
                    loaded.distribution or "-",
                    loaded.version or "-",
                    ", ".join(loaded.tools) or "-",
                )
            )
        )
    out.print(table)
    for failed in report.failed:
        out.print(
            terminal_text(("failed:", "red"), f" {failed.name} ({failed.value}) at {failed.stage}: {failed.error}"),
            soft_wrap=True,
        )
    for name in report.disabled:
        out.print(terminal_text(f"disabled: {name}"))
    if not report.loaded and not report.failed and not report.disabled:
        out.print("no plugins found")


@cli.command("new-plugin")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--name", default=None, help="Entry-point name (default: the directory's name without dsh-).")
def new_plugin_command(directory: Path, name: str | None) -> None:
    """Write a plugin distribution to start from: a tool, a policy, their tests and a nox matrix."""
    from ._scaffold import check_plugin_name, write_plugin

    if name is None:
        derived_from = directory.resolve().name
        name = derived_from.lower().removeprefix("dsh-").removeprefix("dsh_")
        try:
            check_plugin_name(name)
        except ValueError as exc:
            # The user never typed this name: say where it came from and how to give one.
            raise _UsageProblem(
                f"{exc} (the name was taken from the directory {derived_from!r}; give one with --name NAME)"
            ) from exc
    try:
        written = write_plugin(directory, name)
    except ValueError as exc:
        raise _UsageProblem(str(exc)) from exc
    except OSError as exc:  # a parent that is a file, a read-only directory...
        raise _UsageProblem(f"cannot write the plugin in {directory}: {exc}") from exc
    out = _stdout()
    for path in written:
        out.print(terminal_text(f"wrote {path}"))
    out.print(terminal_text(f"next: cd {directory} && pip install -e '.[test]' && pytest"))


@cli.group("ledger")
def ledger_group() -> None:
    """Inspect an effect ledger and settle calls whose effect is in doubt."""


def _open_ledger(file: Path) -> Any:
    try:
        from dsh_plugins.ledger import EffectLedger, LedgerError
    except ImportError as exc:  # pragma: no cover (the first-party plugins ship in the same wheel)
        raise _UsageProblem(f"the ledger plugin is missing: {exc}") from exc
    try:
        return EffectLedger(file, fsync="always")
    except (LedgerError, OSError) as exc:
        raise _UsageProblem(f"cannot open effect ledger {file}: {exc}") from exc


@ledger_group.command("show")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@json_option
@click.pass_context
def ledger_show_command(ctx: click.Context, file: Path, as_json: bool) -> None:
    """List every recorded call and its state. Exit status 1 when any call is in doubt.

    Reads without taking the ledger's lock, so it works while a host is using it.
    """
    from dsh_plugins.ledger import LedgerError, read_ledger

    try:
        entries = read_ledger(file)
    except (LedgerError, OSError) as exc:
        raise _UsageProblem(f"cannot read effect ledger {file}: {exc}") from exc
    if as_json:
        rows = [
            {
                "key": entry.key,
                "agent": entry.agent,
                "tool": entry.tool,
                "state": entry.state,
                "inDoubt": entry.in_doubt,
                "at": entry.at,
                "value": thaw(entry.value),
                "error": None
                if entry.error_message is None
                else {"code": entry.error_code, "message": entry.error_message},
            }
            for entry in entries
        ]
        _echo_json({"entries": rows}, indent=2)
    else:
        out = _stdout()
        table = Table(title=terminal_text(f"{len(entries)} call(s) in {file}"))
        for column in ("call", "agent", "tool", "state", "started"):
            table.add_column(column, overflow="fold")
        for entry in entries:
            # A ledger is a file anyone can edit: every field is shown as text, never as markup.
            state = _cell(f"{entry.state} (in doubt)", "red") if entry.in_doubt else _cell(entry.state)
            cells = (_cell(text) for text in (entry.key, entry.agent or "-", entry.tool))
            table.add_row(*cells, state, _cell(str(entry.at)))
        out.print(table)
    if any(entry.in_doubt for entry in entries):
        ctx.exit(1)


@ledger_group.command("resolve")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("call_id")
@click.argument("value")
@click.option("--agent", default=None, help="The agent id the call was made under.")
def ledger_resolve_command(file: Path, call_id: str, value: str, agent: str | None) -> None:
    """Record that the in-doubt call CALL_ID happened, with VALUE (JSON) as its result."""
    try:
        parsed = decode_json(value)
    except ValueError as exc:
        raise _UsageProblem(f"VALUE is not JSON: {exc}") from exc
    with _open_ledger(file) as ledger:
        try:
            ledger.resolve(call_id, parsed, agent=agent)
        except ValueError as exc:  # LedgerError, NonJsonValueError
            raise _UsageProblem(str(exc)) from exc
    _stdout().print(terminal_text(f"{call_id}: committed; later calls with this id return the value"))


@ledger_group.command("forget")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("call_id")
@click.option("--agent", default=None, help="The agent id the call was made under.")
def ledger_forget_command(file: Path, call_id: str, agent: str | None) -> None:
    """Record that the in-doubt call CALL_ID did not happen, so a later call with this id runs."""
    with _open_ledger(file) as ledger:
        try:
            ledger.forget(call_id, agent=agent)
        except ValueError as exc:  # LedgerError
            raise _UsageProblem(str(exc)) from exc
    _stdout().print(terminal_text(f"{call_id}: released; a later call with this id runs"))


@ledger_group.command("compact")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--archive", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Keep the old file under this name (it must not exist).")  # fmt: skip
def ledger_compact_command(file: Path, archive: Path | None) -> None:
    """Rewrite the ledger as its entries: one start line per call and its outcome, released calls dropped."""
    with _open_ledger(file) as ledger:
        try:
            before, after = ledger.compact(archive=archive)
        except (ValueError, OSError) as exc:  # LedgerError
            raise _UsageProblem(str(exc)) from exc
    kept = f"; the old file is {archive}" if archive is not None else ""
    _stdout().print(terminal_text(f"{file}: {before} line(s) -> {after}{kept}"))


@cli.group("grants")
def grants_group() -> None:
    """List, add and revoke standing approvals ("always allow" grants)."""


def _grant_book(file: Path) -> Any:
    from dsh_plugins.grants import GrantBook, GrantError

    try:
        return GrantBook(file)
    except (GrantError, OSError) as exc:
        raise _UsageProblem(f"cannot use grants file {file}: {exc}") from exc


def _when(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    try:
        return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(epoch))
    except (OverflowError, OSError, ValueError):  # a grants file may hold any finite time
        return f"{epoch:.6g} s after 1970"


@grants_group.command("show")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--all", "show_all", is_flag=True, help="Also list revoked and expired grants.")
@json_option
def grants_show_command(file: Path, show_all: bool, as_json: bool) -> None:
    """List the grants in force (with --all, every grant ever made) and how often each was used."""
    book = _grant_book(file)
    now = time.time()
    try:
        grants = book.grants(include_inactive=show_all)
    except (ValueError, OSError) as exc:
        raise _UsageProblem(f"cannot read grants file {file}: {exc}") from exc
    if as_json:
        rows = [grant.to_json() | {"active": grant.active(now)} for grant in grants]
        _echo_json({"grants": [thaw(row) for row in rows]}, indent=2)
        return
    table = Table(title=terminal_text(f"{len(grants)} grant(s) in {file}"))
    for column in ("id", "tool", "agent", "arguments", "granted by", "expires", "uses", "state"):
        table.add_column(column, overflow="fold")
    for grant in grants:
        agent = "*" if grant.any_agent else grant.agent or "(none)"
        arguments = "any" if grant.arguments is None else json_text(grant.arguments)
        if grant.revoked_at is not None:
            state = f"revoked by {grant.revoked_by}"
        elif not grant.active(now):
            state = "expired"
        else:
            state = "active"
        table.add_row(
            *(_cell(text) for text in (grant.id, grant.tool, agent, arguments, grant.granted_by)),
            _when(grant.expires_at),
            str(grant.uses),
            _cell(state),
        )
    _stdout().print(table)


def _check_grant_target(ctx: click.Context, tool: str, arguments: object) -> None:
    """Warn about a tool no loaded plugin registers; refuse ``--arguments`` its parameter schema refuses.

    The tools are those the global options load (as ``list`` shows them). A
    tool they do not register may come from a plugin not loaded here, so it is
    a warning; nothing is checked when the configuration cannot be loaded
    (granting does not need it).
    """
    from dsh_plugins.grants import unmatchable_arguments

    try:
        host = _build_host(ctx, quiet=True)
    except _UsageProblem as exc:
        click.echo(f"warning: the grant is not checked against the loaded tools: {exc}", err=True)
        return
    if tool not in {definition.name for _, definition in host.runtime.registrations()}:
        line = f'warning: no loaded tool is named "{tool}"; the grant applies only if such a tool is registered later'
        _stderr().print(terminal_text(line, one_line=True), soft_wrap=True)
        return
    if not isinstance(arguments, Mapping):
        return
    violations = unmatchable_arguments(host.runtime, tool, arguments)
    if violations:
        raise _UsageProblem(
            f'--arguments can never match a call of tool "{tool}", whose parameter schema refuses them: '
            f"{'; '.join(violations)}; nothing was granted"
        )


@grants_group.command("add")
@click.argument("file", type=click.Path(dir_okay=False, path_type=Path))
@click.argument("tool")
@click.option("--agent", default=None, help="The agent id it is granted for.")
@click.option("--any-agent", is_flag=True, help="Grant it for every agent.")
@click.option("--arguments", "arguments_json", default=None, help="Only calls with exactly these arguments (JSON).")
@click.option("--ttl", type=float, default=None, help="Seconds until it expires (default: until revoked).")
@click.option("--by", "granted_by", default=None, help="Who grants it (default: the current user).")
@click.option("--note", default=None, help="Why it was granted.")
@click.pass_context
def grants_add_command(
    ctx: click.Context,
    file: Path,
    tool: str,
    agent: str | None,
    any_agent: bool,
    arguments_json: str | None,
    ttl: float | None,
    granted_by: str | None,
    note: str | None,
) -> None:
    """Grant TOOL standing approval, so Ask decisions for it are allowed without asking.

    Name the agent it is for (--agent ID) or grant it to every agent (--any-agent).
    """
    if (agent is None) == (not any_agent):
        raise _UsageProblem("pass either --agent ID or --any-agent (approval is asked only for an agent's calls)")
    from dsh_plugins.grants import MAX_TTL_S

    if ttl is not None and not 0 < ttl <= MAX_TTL_S:  # (nan fails both comparisons)
        raise _UsageProblem(f"--ttl must be a positive number of seconds, at most 100 years, got {ttl:g}")
    arguments = None
    if arguments_json is not None:
        try:
            arguments = decode_json(arguments_json)
        except ValueError as exc:
            raise _UsageProblem(f"--arguments is not JSON: {exc}") from exc
        repeated = _repeated_key(arguments_json)
        if repeated is not None:
            # The parser keeps the last value, a person reads the first: the grant would cover other arguments.
            raise _UsageProblem(f"--arguments gives the key {dumps_text(repeated)} twice in one object")
        if not isinstance(arguments, Mapping):
            # Checked before the tool is looked up, so no warning about it comes first.
            raise _UsageProblem(f"--arguments must be a JSON object (a call's whole arguments), got {arguments_json}")
    _check_grant_target(ctx, tool, arguments)
    book = _grant_book(file)
    try:
        grant = book.grant(
            tool,
            granted_by=granted_by or _user(),
            agent=agent,
            any_agent=any_agent,
            arguments=arguments,
            ttl_s=ttl,
            note=note,
        )
    except (ValueError, OSError) as exc:  # GrantError, NonJsonValueError, bad options
        raise _UsageProblem(str(exc)) from exc
    _stdout().print(terminal_text(f"{grant.id}: {grant.describe()}"))


@grants_group.command("revoke")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.argument("grant_id")
@click.option("--by", "revoked_by", default=None, help="Who revokes it (default: the current user).")
def grants_revoke_command(file: Path, grant_id: str, revoked_by: str | None) -> None:
    """Take back grant GRANT_ID; hosts using the file stop applying it on their next call."""
    book = _grant_book(file)
    try:
        book.revoke(grant_id, by=revoked_by or _user())
    except (ValueError, OSError) as exc:
        raise _UsageProblem(str(exc)) from exc
    _stdout().print(terminal_text(f"{grant_id}: revoked"))


@grants_group.command("compact")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--archive", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Where the full history goes (default: FILE.<UTC time>).")  # fmt: skip
def grants_compact_command(file: Path, archive: Path | None) -> None:
    """Move FILE's history (every use, revocation and expired grant) to an archive; keep the grants in force."""
    book = _grant_book(file)
    try:
        moved = book.compact(archive)
    except (ValueError, OSError) as exc:
        raise _UsageProblem(str(exc)) from exc
    kept = len(book.grants())
    _stdout().print(terminal_text(f"{kept} grant(s) in force kept in {file}; history in {moved}"))


def main(argv: Sequence[str] | None = None) -> None:
    """Run the ``dsh-tools`` command line (the console-script entry point)."""
    cli.main(args=list(argv) if argv is not None else None, prog_name="dsh-tools")


if __name__ == "__main__":
    main()
