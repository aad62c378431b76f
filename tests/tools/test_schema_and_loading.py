"""Tool schemas from signatures and docstrings, and loading tools named in the config."""

from __future__ import annotations

from typing import Literal, Optional

import pytest

from literl.tools import load_tools, tool_schema


def lookup(word: str, limit: int = 3, mode: Literal["short", "long"] = "short", tags: Optional[list[str]] = None,
           scale: float = 1.0, exact: bool = False) -> str:
    """Look a word up in the dictionary.

    Returns its senses, most common first.

    Args:
        word: the word to look up
        limit: how many senses
            to return at most
        mode: how much of each sense to show
        tags (list): only senses with these tags
        scale: a weight
        exact: match case
    """
    return word


def undocumented(x: int) -> int:
    """Doubles x."""
    return 2 * x


def test_schema_reads_types_defaults_and_the_docstring_of_a_plain_function():
    """word has no default -> the only required parameter; limit's description joins its two lines; Optional
    becomes nullable; Literal becomes an enum of strings; the description is the first paragraph only."""
    schema = tool_schema(lookup)
    assert schema["type"] == "function"
    fn = schema["function"]
    assert fn["name"] == "lookup"
    assert fn["description"] == "Look a word up in the dictionary."
    props = fn["parameters"]["properties"]
    assert fn["parameters"]["required"] == ["word"]
    assert props["word"] == {"type": "string", "description": "the word to look up"}
    assert props["limit"] == {"type": "integer", "description": "how many senses to return at most"}
    assert props["mode"] == {"enum": ["short", "long"], "type": "string", "description": "how much of each sense to show"}
    assert props["tags"] == {"type": "array", "items": {"type": "string"}, "nullable": True,
                             "description": "only senses with these tags"}
    assert props["scale"]["type"] == "number" and props["exact"]["type"] == "boolean"


def test_schema_refuses_a_parameter_the_docstring_does_not_describe():
    with pytest.raises(ValueError, match=r"parameter 'x' is not described.*under 'Args:'"):
        tool_schema(undocumented)


def test_schema_refuses_missing_type_hints_and_docstrings():
    def no_hint(x):
        """Does.

        Args:
            x: a thing
        """
    def no_doc(x: int):
        pass
    with pytest.raises(ValueError, match=r"parameter 'x' has no type hint"):
        tool_schema(no_hint)
    with pytest.raises(ValueError, match=r"has no docstring"):
        tool_schema(no_doc)


def test_load_tools_resolves_config_strings_and_reports_bad_ones():
    tools = load_tools(["literl.tools:python", "literl.tools:calculator", lookup])
    assert list(tools) == ["python", "calculator", "lookup"]
    with pytest.raises(ValueError, match=r"rollout.tools: .*must look like 'package.module:function'"):
        load_tools(["literl.tools.python"])
    with pytest.raises(ValueError, match=r"rollout.tools: cannot import module 'no_such_module_xyz'"):
        load_tools(["no_such_module_xyz:f"])
    with pytest.raises(ValueError, match=r"has no function 'nope'"):
        load_tools(["literl.tools:nope"])
    with pytest.raises(ValueError, match=r"cannot be offered to a model: .*not described"):
        load_tools([undocumented])
    with pytest.raises(ValueError, match=r"two tools are named 'lookup'"):
        load_tools([lookup, lookup])
