"""Code Mode: the model writes one Python program that calls tools, instead of calling each tool itself.

:func:`render_python_sdk` turns the visible tools into the typed stubs the model
programs against; :class:`SubprocessPythonRuntime` runs the program in a fresh
Python process and serves its tool calls through host *bindings*. The
``run_code`` transport (``ToolRuntime(mode="code", code_runtime=...)`` or
``present_as``) joins the two to the tool pipeline: every call a program makes
runs the full pipeline as a sub-call; when the runtime has an ``event_sink``,
its settled content also goes through the ``dsh_code_dispatch_log``
waterfall and is logged to that sink.
"""

from ._bridge import CodeDispatchLog, render_run_code_value
from ._runtime import (
    Binding,
    CodeRunError,
    CodeRunErrorKind,
    CodeRunResult,
    CodeRuntime,
    SubprocessPythonRuntime,
)
from ._sdk import (
    RUN_CODE_DESCRIPTION,
    RUN_CODE_NAME,
    render_python_sdk,
    run_code_output_spec,
    run_code_parameters_spec,
)

__all__ = [
    "RUN_CODE_DESCRIPTION",
    "RUN_CODE_NAME",
    "Binding",
    "CodeDispatchLog",
    "CodeRunError",
    "CodeRunErrorKind",
    "CodeRunResult",
    "CodeRuntime",
    "SubprocessPythonRuntime",
    "render_python_sdk",
    "render_run_code_value",
    "run_code_output_spec",
    "run_code_parameters_spec",
]
