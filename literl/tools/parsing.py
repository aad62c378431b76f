"""Reading the tool calls out of a model's turn, in its family's format.

Hermes / Qwen (`hermes`): each call is `<tool_call>{"name": "...", "arguments": {...}}</tool_call>`; the text
before the first call is the turn's content. A call that cannot be read (not JSON, no name, arguments that are
not an object, no closing tag) becomes a `ToolCall` with `error` set: it is answered with an error observation
and counted as a tool error, so the model learns the format instead of the rollout failing.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Protocol

from literl.tools.calls import ToolCall

CALL_FORMAT_HINT = 'write <tool_call>{"name": "<tool>", "arguments": {...}}</tool_call>'


@dataclass(frozen=True)
class ParsedTurn:
    content: str                 # the turn's text before its first tool call (all of it when there is none)
    calls: tuple[ToolCall, ...]


class ToolCallParser(Protocol):
    def parse(self, text: str) -> ParsedTurn: ...


class HermesToolCallParser:
    start, end = "<tool_call>", "</tool_call>"

    def parse(self, text: str) -> ParsedTurn:
        first = text.find(self.start)
        if first < 0:
            return ParsedTurn(text, ())
        calls, position = [], first
        while (begin := text.find(self.start, position)) >= 0:
            body_start = begin + len(self.start)
            close = text.find(self.end, body_start)
            if close < 0:
                raw = text[begin:]
                calls.append(ToolCall(None, {}, raw, f"the tool call has no closing {self.end}; {CALL_FORMAT_HINT}"))
                break
            raw = text[begin:close + len(self.end)]
            calls.append(_read_call(text[body_start:close].strip(), raw))
            position = close + len(self.end)
        return ParsedTurn(text[:first], tuple(calls))


def _read_call(body: str, raw: str) -> ToolCall:
    try:
        data = json.loads(body)
    except json.JSONDecodeError as exc:
        return ToolCall(None, {}, raw, f"the tool call is not valid JSON ({exc.msg} at character {exc.pos}); "
                                       f"{CALL_FORMAT_HINT}")
    if not isinstance(data, dict):
        return ToolCall(None, {}, raw, f"the tool call must be a JSON object; {CALL_FORMAT_HINT}")
    name = data.get("name")
    if not isinstance(name, str) or not name:
        return ToolCall(None, {}, raw, f"the tool call has no \"name\" string; {CALL_FORMAT_HINT}")
    arguments = data.get("arguments", {})
    if isinstance(arguments, str):   # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            pass
    if not isinstance(arguments, dict):
        return ToolCall(name, {}, raw, f"the \"arguments\" of tool {name!r} must be a JSON object; {CALL_FORMAT_HINT}")
    return ToolCall(name, arguments, raw)
