"""Group filters: `(correct_B, rewards_B, group_B, *, ...) -> keep_B` (bool; whole groups kept or dropped).

The collector samples, scores, filters, and samples again until enough groups survive (DAPO dynamic
sampling); the filter itself only decides.

Registered: keep_all, nonzero_reward_std.
"""

from __future__ import annotations

import torch

from literl import ops
from literl.tricks import GROUP_FILTERS


@GROUP_FILTERS.register
def keep_all(correct_B, rewards_B, group_B):
    """No filtering.

        keep_i = True

    Refs: algorithms.md §4.3 (the baseline of dynamic sampling).
    """
    return torch.ones_like(group_B, dtype=torch.bool)


@GROUP_FILTERS.register
def nonzero_reward_std(correct_B, rewards_B, group_B, *, metric="correct"):
    """DAPO dynamic sampling: drop groups whose values are all equal (zero advantage for every member).

        keep_i = (max_g(v) ≠ min_g(v)) ∨ |g| = 1,     v = correct (metric="correct") or reward (metric="reward")

    A group of one is kept, as verl does. Filtering on correctness (the default) keeps an all-correct group
    out even when an overlong penalty makes its rewards differ. NaN rewards are ignored in the comparison.
    Refs: DAPO arXiv:2503.14476 §3.2 Eq. 11; verl-recipe dapo_ray_trainer; algorithms.md §4.3.
    """
    if metric not in ("correct", "reward"):
        raise ValueError(f"nonzero_reward_std: metric must be 'correct' or 'reward', got {metric!r}")
    values_B = correct_B.float() if metric == "correct" else rewards_B.float()
    lo_B, hi_B = ops.group_min_max(values_B, group_B, ~torch.isnan(values_B))
    _, size_B = ops.group_sum(torch.ones_like(values_B), group_B)
    return (hi_B != lo_B) | (size_B == 1)
