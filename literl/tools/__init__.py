"""Tools a model can call during a rollout: plain Python functions with type hints and a docstring.

    literl.tools:python       run Python code in an isolated subprocess (`literl.tools.sandbox`)
    literl.tools:calculator   exact arithmetic on an expression (`literl.tools.arithmetic`)

Public API:
    tool_schema(fn) -> dict                      the JSON schema for `apply_chat_template(..., tools=...)`
    load_tools(["module:function", fn]) -> {name: fn};  tool_schemas(tools) -> [schema]
    ToolRunner(tools, timeout_s=..., max_workers=...).run(calls) -> [ToolResult]
    model_family(name) -> ModelFamily            parser and turn-boundary facts of a model family
    ToolCall, ToolResult, ToolOutput;  PythonSandbox, SandboxLimits, sandbox_isolation()
"""

from literl.tools.arithmetic import calculator
from literl.tools.calls import ToolCall, ToolOutput, ToolResult
from literl.tools.execution import ToolRunner
from literl.tools.families import MODEL_FAMILIES, ModelFamily, model_family
from literl.tools.loading import load_tools, tool_schemas
from literl.tools.parsing import HermesToolCallParser, ParsedTurn
from literl.tools.sandbox import PythonSandbox, SandboxLimits, python, sandbox_isolation
from literl.tools.json_schema import tool_schema

__all__ = ["calculator", "python", "tool_schema", "load_tools", "tool_schemas", "ToolRunner", "ToolCall",
           "ToolOutput", "ToolResult", "model_family", "ModelFamily", "MODEL_FAMILIES", "HermesToolCallParser",
           "ParsedTurn", "PythonSandbox", "SandboxLimits", "sandbox_isolation"]
