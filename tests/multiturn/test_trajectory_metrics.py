"""multiturn/... metrics against a hand-counted batch."""

from __future__ import annotations

from literl.multiturn.metrics import multiturn_metrics
from literl.multiturn.trajectory import TrainingSample, Trajectory
from literl.tools import ToolCall, ToolResult


def trajectory(turns, statuses, void, sampled, observation, boundary, reason):
    sample = TrainingSample([5])
    sample.add_sampled([7] * sampled, [0.0] * sampled)
    sample.add_context([8] * (observation + boundary))
    t = Trajectory({}, [sample], [], reason, turns, void_turns=void, observation_tokens=observation,
                   boundary_tokens=boundary)
    t.tool_results = [ToolResult(ToolCall("f"), "", s) for s in statuses]
    return t


def test_metrics_of_a_hand_counted_batch():
    """Trajectory A: 3 turns, calls ok/error/timeout, 40 sampled, 10 observation, 10 boundary tokens, answer.
    Trajectory B: 1 turn, no call, a void turn, 20 sampled, eos.
    turns_mean (3+1)/2 = 2; tool_calls_mean 3/2 = 1.5; error 1/3; timeout 1/3; observation 10/(60+10+10) =
    0.125; void 1/4 = 0.25; one answer, one eos."""
    metrics = multiturn_metrics([trajectory(3, ["ok", "error", "timeout"], 0, 40, 10, 10, "answer"),
                                 trajectory(1, [], 1, 20, 0, 0, "eos")])
    assert metrics == {"multiturn/turns_mean": 2.0, "multiturn/tool_calls_mean": 1.5,
                       "multiturn/tool_error_frac": 1 / 3, "multiturn/tool_timeout_frac": 1 / 3,
                       "multiturn/observation_token_frac": 0.125, "multiturn/void_turn_frac": 0.25,
                       "multiturn/end_answer": 1.0, "multiturn/end_eos": 1.0, "multiturn/end_max_turns": 0.0,
                       "multiturn/end_length": 0.0, "multiturn/end_tool_failure": 0.0}


def test_a_batch_without_calls_reports_zero_tool_fractions():
    metrics = multiturn_metrics([trajectory(1, [], 0, 5, 0, 0, "answer")])
    assert metrics["multiturn/tool_error_frac"] == 0.0 and metrics["multiturn/tool_timeout_frac"] == 0.0
    assert multiturn_metrics([]) == {}
