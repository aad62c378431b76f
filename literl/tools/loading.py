"""Tools named in the config (`rollout.tools=[literl.tools:python, my_module:lookup]`) turned into functions
with their schemas, every problem reported before anything runs."""

from __future__ import annotations

from typing import Callable, Sequence

from literl.rewards.isolation import resolve_function
from literl.tools.json_schema import tool_schema


def load_tools(names: Sequence[str | Callable]) -> dict[str, Callable]:
    """{tool name: function} for import paths `module:function` (or functions given directly), in order.
    Raises ValueError for a path that does not import, a function without a schema, or two tools of one name."""
    tools: dict[str, Callable] = {}
    for entry in names:
        if callable(entry):
            fn = entry
        else:
            try:
                fn = resolve_function(entry)
            except ValueError as exc:
                raise ValueError(f"rollout.tools: {exc}") from None
        try:
            schema = tool_schema(fn)
        except ValueError as exc:
            raise ValueError(f"rollout.tools: {entry!r} cannot be offered to a model: {exc}") from None
        name = schema["function"]["name"]
        if name in tools:
            raise ValueError(f"rollout.tools: two tools are named {name!r} ({tools[name]!r} and {fn!r}); the model "
                             "calls tools by name, so each needs its own (rename one function)")
        tools[name] = fn
    return tools


def tool_schemas(tools: dict[str, Callable]) -> list[dict]:
    """The schemas to pass as `apply_chat_template(..., tools=...)`, in the tools' order."""
    return [tool_schema(fn) for fn in tools.values()]
