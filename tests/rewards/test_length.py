"""The graded length term (`literl.rewards.length.brevity`) and its place beside the correctness check."""

from __future__ import annotations

import pytest
import torch

from literl.rewards import RewardSet
from literl.rewards.length import brevity


def test_brevity_falls_linearly_with_the_characters_up_to_max_chars():
    """1 − min(n, 256) / 256: n = 0 → 1.0, 64 → 0.75, 128 → 0.5, 256 and 300 → 0.0."""
    assert [brevity("x" * n) for n in (0, 64, 128, 256, 300)] == [1.0, 0.75, 0.5, 0.0, 0.0]
    assert brevity("x" * 10, {}, max_chars=20) == 0.5
    with pytest.raises(ValueError, match="max_chars"):
        brevity("x", max_chars=0)


def test_a_small_brevity_weight_grades_equally_correct_responses_without_deciding_accuracy():
    """math_accuracy (weight 1) + 0.1 · brevity: two correct answers of 64 and 128 characters score 1 + 0.1 · 0.75
    = 1.075 and 1 + 0.1 · 0.5 = 1.05; a wrong one of 64 characters 0.075, and stays wrong (the first function
    decides accuracy)."""
    rewards = RewardSet([("literl.rewards.math_answer:math_accuracy", 1.0), ("literl.rewards.length:brevity", 0.1)],
                        n_workers=0)
    short, long = "The answer is \\boxed{7}.".ljust(64), "The answer is \\boxed{7}.".ljust(128)
    wrong = "The answer is \\boxed{8}.".ljust(64)
    scores, correct, _ = rewards.score([short, long, wrong], [{"answer": "7"}] * 3)
    torch.testing.assert_close(torch.as_tensor(scores, dtype=torch.float64),
                               torch.tensor([1.075, 1.05, 0.075], dtype=torch.float64))
    assert [bool(c) for c in correct] == [True, True, False]
    rewards.close()
