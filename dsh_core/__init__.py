"""dsh-tools: a policy-governed tool pipeline for LLM agents.

Register tools (typed JSON-Schema parameters, a mandatory output schema, an
async body) on a :class:`ToolRuntime` and execute every model tool call through
one ordered pipeline of pluggy hooks, run on trio. See :mod:`dsh_core.hookspecs`
for the plugin contract.
"""

from ._content import ContentBlock, ImageBlock, TextBlock, UserMessage
from ._decisions import UNSET, Accept, Allow, Ask, Block, Deny, PostToolDecision, PreToolDecision
from ._definition import ToolDefinition, ToolOutput, ToolSchema, default_render, define_tool
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
)
from ._json import FrozenDict, FrozenList, JsonValue, json_equal, json_text, snapshot_json, thaw
from ._registry import RUN_CODE_NAME, Disposer, PresentationMode, ToolGuard, ToolRestriction
from ._results import (
    ToolErrorInfo,
    ToolExecutionFailure,
    ToolExecutionResult,
    ToolExecutionSuccess,
    ToolFailure,
)
from ._runtime import ApprovalService, ScopedToolRuntime, ToolRuntime
from ._scheduling import run_tool_calls
from ._signal import CancelSignal
from ._waterfall import DshPluginManager
from .hookspecs import hookimpl

__version__ = "0.1.0"

__all__ = [
    "RUN_CODE_NAME",
    "UNSET",
    "AbortError",
    "Accept",
    "Agent",
    "Allow",
    "ApprovalService",
    "Ask",
    "Block",
    "CancelSignal",
    "CodeRunFailedError",
    "ConfigError",
    "ContentBlock",
    "Deny",
    "Disposer",
    "DshError",
    "DshPluginManager",
    "ErrorCode",
    "Exclusive",
    "FrozenDict",
    "FrozenList",
    "ImageBlock",
    "JsonSchemaError",
    "JsonValue",
    "NonJsonValueError",
    "Parallel",
    "PolicyError",
    "PostToolDecision",
    "PreToolDecision",
    "PresentationMode",
    "RegistrationError",
    "SchemaSpecError",
    "ScopeKey",
    "ScopedToolRuntime",
    "TextBlock",
    "ToolArgsError",
    "ToolDefinition",
    "ToolDispatchExecution",
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
    "ToolRestriction",
    "ToolRunContext",
    "ToolRuntime",
    "ToolSchema",
    "ToolTimeoutError",
    "UserMessage",
    "__version__",
    "default_render",
    "define_tool",
    "hookimpl",
    "json_equal",
    "json_text",
    "run_tool_calls",
    "snapshot_json",
    "thaw",
]
