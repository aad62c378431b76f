"""Running a batch's tool calls concurrently, each under a deadline; failures come back as observations."""

from __future__ import annotations

import threading
import time

from literl.tools import ToolCall, ToolRunner, calculator


def wait_a_bit(seconds: float) -> str:
    """Sleep, then report.

    Args:
        seconds: how long to sleep
    """
    time.sleep(seconds)
    return f"slept {seconds}"


def explode(reason: str) -> str:
    """Always fails.

    Args:
        reason: the message
    """
    raise RuntimeError(reason)


def test_calls_run_concurrently_and_a_slow_one_times_out_without_holding_the_others():
    """Four 0.4 s sleeps in four threads take ~0.4 s, not 1.6 s; a 5 s sleep stops at the 1 s deadline."""
    runner = ToolRunner({"wait_a_bit": wait_a_bit}, timeout_s=1.0, max_workers=5)
    started = time.monotonic()
    results = runner.run([ToolCall("wait_a_bit", {"seconds": 0.4})] * 4 + [ToolCall("wait_a_bit", {"seconds": 5})])
    elapsed = time.monotonic() - started
    assert [r.status for r in results] == ["ok"] * 4 + ["timeout"]
    assert results[0].text == "slept 0.4"
    assert "did not finish within 1 s" in results[4].text
    assert elapsed < 1.5
    runner.close()


def test_every_kind_of_bad_call_is_an_error_observation_in_order():
    runner = ToolRunner({"calculator": calculator, "explode": explode}, timeout_s=5)
    results = runner.run([
        ToolCall("calculator", {"expression": "6*7"}),
        ToolCall("search", {"q": "x"}),
        ToolCall("calculator", {"expr": "1"}),
        ToolCall("calculator", {"expression": 42}),
        ToolCall(None, {}, "<tool_call>{</tool_call>", "the tool call is not valid JSON"),
        ToolCall("explode", {"reason": "boom"}),
        ToolCall("calculator", {"expression": "1/0"}),
    ])
    texts = [r.text for r in results]
    assert texts[0] == "42" and results[0].status == "ok"
    assert texts[1] == "Error: unknown tool 'search'; the tools are: calculator, explode"
    assert "missing a required argument: 'expression'" in texts[2] and "its parameters: expression" in texts[2]
    assert texts[3] == "Error: tool 'calculator': argument 'expression' must be string (got int)"
    assert texts[4] == "Error: the tool call is not valid JSON"
    assert texts[5] == "Error: RuntimeError: boom"
    assert texts[6].startswith("Error: division by zero")
    assert [r.status for r in results] == ["ok"] + ["error"] * 6
    assert threading.active_count() < 50
    runner.close()


def maybe(limit: int | None = None) -> str:
    """Echo the limit.

    Args:
        limit: a cap, or null for none
    """
    return str(limit)


def test_an_optional_argument_accepts_null_and_refuses_a_wrong_type():
    runner = ToolRunner({"maybe": maybe}, timeout_s=5)
    ok, bad = runner.run([ToolCall("maybe", {"limit": None}), ToolCall("maybe", {"limit": "3"})])
    assert (ok.text, ok.status) == ("None", "ok")
    assert bad.text == "Error: tool 'maybe': argument 'limit' must be integer (got str)"
    runner.close()
