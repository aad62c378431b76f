"""A tool's JSON schema, read from a plain Python function's signature and docstring (TRL's convention).

    def lookup(word: str, limit: int = 3) -> str:
        '''Look a word up in the dictionary.

        Args:
            word: the word to look up
            limit: how many senses to return
        '''

gives the schema `apply_chat_template(..., tools=[...])` takes:

    {"type": "function", "function": {"name": "lookup", "description": "Look a word up in the dictionary.",
     "parameters": {"type": "object", "properties": {"word": {"type": "string", "description": "the word to look
     up"}, "limit": {"type": "integer", "description": "how many senses to return"}}, "required": ["word"]}}}

Every parameter needs a type hint and a line under `Args:`, and the function a docstring: the model reads
nothing else about a tool, so a missing description is an error, not a silent gap.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from typing import Any, Callable

_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", dict: "object", list: "array"}
_ARG_LINE = re.compile(r"^\s*(\*{0,2}\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_SECTIONS = ("args:", "arguments:", "parameters:", "returns:", "return:", "raises:", "yields:", "examples:",
             "example:", "note:", "notes:")


def tool_schema(fn: Callable) -> dict:
    """The function-calling schema of `fn`; raises ValueError naming what is missing and how to add it."""
    name = getattr(fn, "__name__", None)
    if not name or not callable(fn):
        raise ValueError(f"a tool must be a named Python function (got {fn!r})")
    doc = inspect.getdoc(fn)
    if not doc:
        raise ValueError(f"tool {name!r} has no docstring: write one whose first paragraph says what the tool "
                         "does and an 'Args:' section with a line 'name: meaning' per parameter")
    description, arg_docs = _parse_docstring(doc)
    try:
        hints = typing.get_type_hints(fn)
    except Exception as exc:  # noqa: BLE001 - an unresolvable annotation: say which function
        raise ValueError(f"tool {name!r}: its type hints cannot be resolved ({exc})") from exc
    properties: dict[str, Any] = {}
    required: list[str] = []
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ValueError(f"tool {name!r}: *{param.name} / **{param.name} cannot be described to a model; "
                             "name each parameter")
        if param.name not in hints:
            raise ValueError(f"tool {name!r}: parameter {param.name!r} has no type hint; add one "
                             f"(e.g. `{param.name}: str`)")
        if param.name not in arg_docs:
            raise ValueError(f"tool {name!r}: parameter {param.name!r} is not described in the docstring; add "
                             f"a line '{param.name}: <what it means>' under 'Args:'")
        prop = _json_type(hints[param.name], f"tool {name!r}, parameter {param.name!r}")
        prop["description"] = arg_docs[param.name]
        properties[param.name] = prop
        if param.default is inspect.Parameter.empty:
            required.append(param.name)
    parameters = {"type": "object", "properties": properties, "required": required}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """(first paragraph, {argument: description}) of a Google-style docstring; continuation lines of an
    argument (indented deeper than its name) are joined to it."""
    paragraphs = doc.strip().split("\n\n")
    description = " ".join(line.strip() for line in paragraphs[0].splitlines())
    args: dict[str, str] = {}
    in_args, current, name_indent = False, None, None
    for line in doc.splitlines():
        stripped = line.strip()
        if stripped.lower() in _SECTIONS:
            in_args, current = stripped.lower() in ("args:", "arguments:", "parameters:"), None
            continue
        if not in_args or not stripped:
            continue
        indent = len(line) - len(line.lstrip())
        match = _ARG_LINE.match(line)
        if match and (name_indent is None or indent <= name_indent):
            current, name_indent = match.group(1).lstrip("*"), indent
            args[current] = match.group(2).strip()
        elif current is not None:
            args[current] = f"{args[current]} {stripped}".strip()
    return description, args


def _json_type(hint: Any, where: str) -> dict:
    origin, params = typing.get_origin(hint), typing.get_args(hint)
    if hint in _JSON_TYPES:
        return {"type": _JSON_TYPES[hint]}
    if origin in (typing.Union, types.UnionType):
        options = [p for p in params if p is not type(None)]
        if len(options) == 1:
            return {**_json_type(options[0], where), "nullable": True}
        return {"anyOf": [_json_type(p, where) for p in options]}
    if origin is typing.Literal:
        values = list(params)
        kinds = {type(v) for v in values}
        schema = {"enum": values}
        if len(kinds) == 1 and kinds.pop() in _JSON_TYPES:
            schema["type"] = _JSON_TYPES[type(values[0])]
        return schema
    if origin in (list, tuple, set, frozenset):
        item = params[0] if params else None
        return {"type": "array", **({"items": _json_type(item, where)} if item not in (None, Ellipsis) else {})}
    if origin is dict:
        return {"type": "object"}
    raise ValueError(f"{where}: type {hint!r} has no JSON schema equivalent; use str, int, float, bool, list[...], "
                     "dict, Literal[...] or Optional[...]")
