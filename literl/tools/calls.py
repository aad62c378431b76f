"""What a parsed tool call and a tool's result are: the plain data passed between parser, runner and episode."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

ToolStatus = Literal["ok", "error", "timeout"]


@dataclass(frozen=True)
class ToolCall:
    """One call the model wrote. A malformed one keeps its raw text and `error` (why it could not be read);
    it is answered with an error observation rather than run."""

    name: str | None
    arguments: dict[str, Any] = field(default_factory=dict)
    raw: str = ""
    error: str | None = None


class ToolOutput(str):
    """A tool's result text that also says how the call went (`status`), so a tool like `python` can return its
    timeout or traceback as the observation while the runner still counts it as a timeout or an error.
    A tool may return a plain `str` (status "ok")."""

    status: ToolStatus

    def __new__(cls, text: str, status: ToolStatus = "ok"):
        out = super().__new__(cls, text)
        out.status = status
        return out


@dataclass(frozen=True)
class ToolResult:
    """The observation for one call: `text` goes back to the model; `status` feeds the tool metrics."""

    call: ToolCall
    text: str
    status: ToolStatus
