"""Running the tool calls of a batch concurrently, each under a deadline, every failure an observation.

A call runs in a thread of a shared pool: tools that wait (a sandbox subprocess, an HTTP service) overlap,
and sampling is not blocked by them. A thread cannot be killed, so a call past its deadline is answered
with a timeout observation while its thread finishes in the background: tools that can hang in Python
code should bound themselves (the `python` tool does, in a subprocess it kills).
"""

from __future__ import annotations

import inspect
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Callable, Sequence

from literl.tools.calls import ToolCall, ToolResult
from literl.tools.json_schema import tool_schema

_JSON_CHECKS = {"string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
                "array": (list,), "object": (dict,)}


class ToolRunner:
    """Runs calls against `tools` ({name: function}) in `max_workers` threads, each call within `timeout_s`."""

    def __init__(self, tools: dict[str, Callable], *, timeout_s: float = 30.0, max_workers: int = 8):
        if timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0 (got {timeout_s})")
        self.tools = dict(tools)
        self.timeout_s = float(timeout_s)
        self._schemas = {name: tool_schema(fn)["function"]["parameters"] for name, fn in self.tools.items()}
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="literl-tool")

    def run(self, calls: Sequence[ToolCall]) -> list[ToolResult]:
        """One result per call, in order; returns within about `timeout_s` whatever the tools do."""
        started = time.monotonic()
        futures = {}
        results: list[ToolResult | None] = [None] * len(calls)
        for i, call in enumerate(calls):
            problem = self._problem(call)
            if problem is not None:
                results[i] = ToolResult(call, f"Error: {problem}", "error")
            else:
                futures[i] = self._pool.submit(self.tools[call.name], **call.arguments)
        for i, future in futures.items():
            remaining = max(0.0, started + self.timeout_s - time.monotonic())
            try:
                value = future.result(timeout=remaining)
            except FutureTimeout:
                results[i] = ToolResult(calls[i], f"Error: tool {calls[i].name!r} did not finish within "
                                                  f"{self.timeout_s:g} s", "timeout")
            except Exception as exc:  # noqa: BLE001 - a tool's failure is the model's observation
                results[i] = ToolResult(calls[i], f"Error: {type(exc).__name__}: {exc}", "error")
            else:
                results[i] = ToolResult(calls[i], str(value), getattr(value, "status", "ok"))
        return results

    def _problem(self, call: ToolCall) -> str | None:
        """Why a call cannot run (malformed, unknown tool, arguments that do not fit), or None."""
        if call.error is not None:
            return call.error
        if call.name not in self.tools:
            return f"unknown tool {call.name!r}; the tools are: {', '.join(self.tools) or '(none)'}"
        params = self._schemas[call.name]
        try:
            inspect.signature(self.tools[call.name]).bind(**call.arguments)
        except TypeError as exc:
            return f"tool {call.name!r}: {exc}; its parameters: {', '.join(params['properties']) or '(none)'}"
        for key, value in call.arguments.items():
            declared = params["properties"].get(key, {})
            expected = declared.get("type")
            ok_types = _JSON_CHECKS.get(expected)
            if value is None and declared.get("nullable"):
                continue
            if ok_types and (not isinstance(value, ok_types) or (expected != "boolean" and isinstance(value, bool))):
                return f"tool {call.name!r}: argument {key!r} must be {expected} (got {type(value).__name__})"
        return None

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
