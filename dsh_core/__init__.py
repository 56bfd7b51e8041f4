"""dsh-tools: a policy-governed tool pipeline for LLM agents.

Register tools (typed JSON-Schema parameters, a mandatory output schema, an
async body) on a :class:`ToolRuntime` and execute every model tool call through
one ordered pipeline of pluggy hooks, run on trio. See :mod:`dsh_core.hookspecs`
for the plugin contract.
"""

from ._arguments_text import ArgumentsJsonError, ArgumentsText
from ._capabilities import Capabilities, CapabilityError
from ._config import CodeRuntimeSettings, DshConfig, load_config, structure_table
from ._content import ContentBlock, ImageBlock, TextBlock, UserMessage
from ._decisions import (
    APPROVAL_ANSWERS,
    MAX_REWRITES,
    UNSET,
    Accept,
    Allow,
    Ask,
    Block,
    Deny,
    PostToolDecision,
    PreToolDecision,
    Rewrite,
)
from ._definition import ToolDefinition, ToolEffects, ToolOutput, ToolSchema, default_render, define_tool
from ._errors import (
    AbortError,
    CodeRunFailedError,
    ConfigError,
    DshError,
    ErrorCode,
    JsonSchemaError,
    NonJsonValueError,
    PolicyError,
    RegistrationError,
    SchemaSpecError,
    ToolArgsError,
    ToolNotFoundError,
    ToolOutputError,
    ToolTimeoutError,
    bounded_listing,
)
from ._execution import (
    Agent,
    Exclusive,
    Parallel,
    ScopeKey,
    ToolDispatchExecution,
    ToolExecution,
    ToolExecutionInput,
    ToolExecutionMode,
    ToolExecutionToken,
    ToolRunContext,
    scope_id,
)
from ._fingerprint import canonical_json, contract_fingerprint
from ._json import (
    FrozenDict,
    FrozenList,
    JsonValue,
    json_equal,
    json_text,
    nests_deeper_than,
    safe_repr,
    snapshot_json,
    thaw,
)
from ._kept_files import KeptFiles
from ._orphans import OrphanedWork
from ._plugins import (
    FailedPlugin,
    LoadedPlugin,
    PluginReport,
    RefusedRegistration,
    discover_entry_points,
    load_plugins,
)
from ._registry import RUN_CODE_NAME, Disposer, PresentationMode, ToolGuard, ToolRegistration, ToolRestriction
from ._replay import ReplayedCall, SessionRecorder, ToolResult, replay
from ._resources import ResourceClaim
from ._results import (
    ToolErrorInfo,
    ToolExecutionFailure,
    ToolExecutionResult,
    ToolExecutionSuccess,
    ToolFailure,
    failure_result,
    sole_exception,
)
from ._retry import AttemptTimedOut, RetryAttempt, RetryPolicy, TransientToolError
from ._runtime import ApprovalService, ModelTools, ScopedToolRuntime, ToolRuntime
from ._scheduling import run_tool_calls
from ._schema._raw import RawSchema
from ._session_log import SessionEvent, SessionLog, SessionLogError, SessionLogRead, TornLine, read_session_log
from ._signal import CancelSignal
from ._simulate import SimulatedCall, SimulationReport, SimulationRuntime, Verdict, simulate
from ._table_checks import TableCheck, check_validator, keyed_check, keyed_validator
from ._tool_decorator import tool
from ._trace import DecisionTrace, TraceStage, TraceStep, trace_of
from ._waterfall import DshPluginManager
from ._well_formed import well_formed_text
from .hookspecs import hookimpl

__version__ = "0.1.0"

__all__ = [
    "APPROVAL_ANSWERS",
    "MAX_REWRITES",
    "RUN_CODE_NAME",
    "UNSET",
    "AbortError",
    "Accept",
    "Agent",
    "Allow",
    "ApprovalService",
    "ArgumentsJsonError",
    "ArgumentsText",
    "Ask",
    "AttemptTimedOut",
    "Block",
    "CancelSignal",
    "Capabilities",
    "CapabilityError",
    "CodeRunFailedError",
    "CodeRuntimeSettings",
    "ConfigError",
    "ContentBlock",
    "DecisionTrace",
    "Deny",
    "Disposer",
    "DshConfig",
    "DshError",
    "DshPluginManager",
    "ErrorCode",
    "Exclusive",
    "FailedPlugin",
    "FrozenDict",
    "FrozenList",
    "ImageBlock",
    "JsonSchemaError",
    "JsonValue",
    "KeptFiles",
    "LoadedPlugin",
    "ModelTools",
    "NonJsonValueError",
    "OrphanedWork",
    "Parallel",
    "PluginReport",
    "PolicyError",
    "PostToolDecision",
    "PreToolDecision",
    "PresentationMode",
    "RawSchema",
    "RefusedRegistration",
    "RegistrationError",
    "ReplayedCall",
    "ResourceClaim",
    "RetryAttempt",
    "RetryPolicy",
    "Rewrite",
    "SchemaSpecError",
    "ScopeKey",
    "ScopedToolRuntime",
    "SessionEvent",
    "SessionLog",
    "SessionLogError",
    "SessionLogRead",
    "SessionRecorder",
    "SimulatedCall",
    "SimulationReport",
    "SimulationRuntime",
    "TableCheck",
    "TextBlock",
    "ToolArgsError",
    "ToolDefinition",
    "ToolDispatchExecution",
    "ToolEffects",
    "ToolErrorInfo",
    "ToolExecution",
    "ToolExecutionFailure",
    "ToolExecutionInput",
    "ToolExecutionMode",
    "ToolExecutionResult",
    "ToolExecutionSuccess",
    "ToolExecutionToken",
    "ToolFailure",
    "ToolGuard",
    "ToolNotFoundError",
    "ToolOutput",
    "ToolOutputError",
    "ToolRegistration",
    "ToolRestriction",
    "ToolResult",
    "ToolRunContext",
    "ToolRuntime",
    "ToolSchema",
    "ToolTimeoutError",
    "TornLine",
    "TraceStage",
    "TraceStep",
    "TransientToolError",
    "UserMessage",
    "Verdict",
    "__version__",
    "bounded_listing",
    "canonical_json",
    "check_validator",
    "contract_fingerprint",
    "default_render",
    "define_tool",
    "discover_entry_points",
    "failure_result",
    "hookimpl",
    "json_equal",
    "json_text",
    "keyed_check",
    "keyed_validator",
    "load_config",
    "load_plugins",
    "nests_deeper_than",
    "read_session_log",
    "replay",
    "run_tool_calls",
    "safe_repr",
    "scope_id",
    "simulate",
    "snapshot_json",
    "sole_exception",
    "structure_table",
    "thaw",
    "tool",
    "trace_of",
    "well_formed_text",
]
