"""Reward shaping (§1.7, §4.2)."""

from __future__ import annotations

import math

import pytest
import torch

from literl.algorithm.tricks import REWARD_SHAPING

NO_TRUNC = torch.zeros(4, dtype=torch.bool)


def test_rescale_hand():
    """low=−1, high=1: r' = −1 + 2r → [0, 1, 1, 0] → [−1, 1, 1, −1]; NaN (unscorable) stays NaN."""
    fn = REWARD_SHAPING.build("rescale", {"low": -1.0, "high": 1.0})
    out = fn(torch.tensor([0.0, 1.0, 1.0, 0.0]), torch.ones(4), NO_TRUNC)
    assert out.tolist() == [-1.0, 1.0, 1.0, -1.0]
    assert math.isnan(float(fn(torch.tensor([float("nan")]), torch.ones(1), NO_TRUNC[:1])[0]))


def test_soft_overlong_hand():
    """L_max = 10, L_cache = 4 → ramp from 6: lengths [5, 6, 8, 10, 11] → penalties [0, 0, −2/4, −4/4, −1];
    added to rewards [1, 1, 1, 0, 0] → [1, 1, 0.5, −1, −1]; factor 0.5 halves the penalty → [1, 1, 0.75, −0.5, −0.5]."""
    rewards, lengths = torch.tensor([1.0, 1, 1, 0, 0]), torch.tensor([5, 6, 8, 10, 11])
    trunc = torch.zeros(5, dtype=torch.bool)
    fn = REWARD_SHAPING.build("soft_overlong", {"max_new_tokens": 10, "cache_length": 4})
    torch.testing.assert_close(fn(rewards, lengths, trunc), torch.tensor([1.0, 1, 0.5, -1, -1]))
    fn = REWARD_SHAPING.build("soft_overlong", {"max_new_tokens": 10, "cache_length": 4, "factor": 0.5})
    torch.testing.assert_close(fn(rewards, lengths, trunc), torch.tensor([1.0, 1, 0.75, -0.5, -0.5]))


HAND_CASES = {"rescale": test_rescale_hand, "soft_overlong": test_soft_overlong_hand}


def test_soft_overlong_defaults_and_errors():
    """max_new_tokens comes from the run context; cache_length None → round(0.2·20) = 4 (start 16):
    length 18 → −2/4 = −0.5. cache_length ≥ L_max, or no L_max at all, is a ValueError that says what to do."""
    fn = REWARD_SHAPING.build("soft_overlong", {}, context={"max_new_tokens": 20})
    assert float(fn(torch.zeros(1), torch.tensor([18]), NO_TRUNC[:1])[0]) == pytest.approx(-0.5)
    with pytest.raises(ValueError, match="cache_length"):
        REWARD_SHAPING.build("soft_overlong", {"max_new_tokens": 8, "cache_length": 8})(
            torch.zeros(1), torch.ones(1), NO_TRUNC[:1])
    with pytest.raises(ValueError, match="max_new_tokens"):
        REWARD_SHAPING.get("soft_overlong")(torch.zeros(1), torch.ones(1), NO_TRUNC[:1])
