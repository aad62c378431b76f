"""The `multiturn/...` metrics of a batch of trajectories (issue 56's names), for metrics.jsonl and the report.

    multiturn/turns_mean              turns per trajectory
    multiturn/tool_calls_mean         tool calls per trajectory
    multiturn/tool_error_frac         calls answered with an error (malformed, unknown tool, the tool failed) / calls
    multiturn/tool_timeout_frac       calls past their deadline / calls            (both 0 when no call was made)
    multiturn/observation_token_frac  observation tokens / response-side tokens (sampled + observation + boundary)
    multiturn/void_turn_frac          turns with neither a tool call nor an answer / turns
    multiturn/end_<reason>            trajectories that ended for each reason (answer, eos, max_turns, length,
                                      tool_failure), every reason present, 0 included
"""

from __future__ import annotations

from typing import Sequence

from literl.multiturn.trajectory import END_REASONS, Trajectory


def multiturn_metrics(trajectories: Sequence[Trajectory]) -> dict[str, float]:
    if not trajectories:
        return {}
    counts = [t.counts() for t in trajectories]
    total = {key: sum(c[key] for c in counts) for key in counts[0]}
    response_tokens = total["sampled_tokens"] + total["observation_tokens"] + total["boundary_tokens"]
    metrics = {
        "multiturn/turns_mean": total["turns"] / len(trajectories),
        "multiturn/tool_calls_mean": total["tool_calls"] / len(trajectories),
        "multiturn/tool_error_frac": total["tool_errors"] / total["tool_calls"] if total["tool_calls"] else 0.0,
        "multiturn/tool_timeout_frac": total["tool_timeouts"] / total["tool_calls"] if total["tool_calls"] else 0.0,
        "multiturn/observation_token_frac": total["observation_tokens"] / response_tokens if response_tokens else 0.0,
        "multiturn/void_turn_frac": total["void_turns"] / total["turns"] if total["turns"] else 0.0,
    }
    for reason in END_REASONS:
        metrics[f"multiturn/end_{reason}"] = float(sum(t.end_reason == reason for t in trajectories))
    return metrics
