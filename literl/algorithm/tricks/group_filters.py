"""Group filters: `(correct_B, rewards_B, group_B, *, ...) -> keep_B` (bool; whole groups kept or dropped).

The collector samples, scores, filters, and samples again until enough groups survive (DAPO dynamic
sampling); the filter itself only decides.

Registered: keep_all, nonzero_reward_std, mean_in_band.
"""

from __future__ import annotations

import torch

from literl.algorithm import ops
from literl.algorithm.registry import WithTrick
from literl.algorithm.tricks import GROUP_FILTERS


@GROUP_FILTERS.register(identity=True)
def keep_all(correct_B, rewards_B, group_B):
    """No filtering.

        keep_i = True

    Refs: algorithms.md §4.3 (the baseline of dynamic sampling).
    """
    return torch.ones_like(group_B, dtype=torch.bool)


@GROUP_FILTERS.register(ranges={"min_std": ">= 0"})
def nonzero_reward_std(correct_B, rewards_B, group_B, *, metric="correct", min_std=0.0):
    """DAPO dynamic sampling: drop groups whose values are all equal (zero advantage for every member).

        keep_i = (max_g(v) ≠ min_g(v)) ∨ |g| = 1                     (min_std = 0, the default)
        keep_i = (std_g(v) > min_std) ∨ |g| = 1                      (min_std > 0; std unbiased, as torch.std)
        v = correct (metric="correct") or reward (metric="reward")

    A group of one is kept, as verl and ROLL do. Filtering on correctness (the default) keeps an all-correct group
    out even when an overlong penalty makes its rewards differ. `metric="reward", min_std=s` is ROLL's
    `query_filter_config: {type: std_filter, filter_args: {std_threshold: s}}`, which also drops groups whose
    rewards differ by less than s. NaN rewards are ignored in the comparison and in the std.
    Refs: DAPO arXiv:2503.14476 §3.2 Eq. 11; verl-recipe dapo_ray_trainer; ROLL query_filter; algorithms.md §4.3.
    """
    values_B = _metric_values(correct_B, rewards_B, metric, "nonzero_reward_std")
    valid_B = ~torch.isnan(values_B)
    _, size_B = ops.group_sum(torch.ones_like(values_B), group_B)
    if min_std == 0:
        lo_B, hi_B = ops.group_min_max(values_B, group_B, valid_B)
        return (hi_B != lo_B) | (size_B == 1)
    _, std_B, _ = ops.group_mean_std(values_B, group_B, valid_B)
    return (std_B > min_std) | (size_B == 1)


def _band_off_the_reward_scale(band, scale) -> str | None:
    """ROLL's mean filter band (0, 1) is for a {0, 1} reward; the filter sees the reward after `rescale`."""
    low, high = scale["low"], scale["high"]
    if band["metric"] == "reward" and (band["low"], band["high"]) == (0.0, 1.0) and (low, high) != (0.0, 1.0):
        return (f"mean_in_band's band (0, 1) is ROLL's for a {{0, 1}} reward, but reward_shaping.rescale maps the "
                f"reward onto {{{low}, {high}}} before the filter: set algorithm.group_filter.params.low={low} and "
                f"high={high} for the same rule (algorithms.md §4.3)")
    return None


@GROUP_FILTERS.register(ranges={"low": "< high"},
                        compatibility=[WithTrick("reward_shaping", "rescale", _band_off_the_reward_scale)])
def mean_in_band(correct_B, rewards_B, group_B, *, low=0.0, high=1.0, metric="reward"):
    """ROLL's mean filter: keep a group whose mean value lies strictly inside (low, high).

        keep_i = (low < mean_g(v) < high) ∨ |g| = 1,     v = reward (metric="reward", ROLL's) or correct

    ROLL's `query_filter_config: {type: mean_filter, filter_args: {threshold_down: low, threshold_up: high}}`
    (drop when mean ≤ low or mean ≥ high), which with the defaults (0, 1) drops the all-wrong and all-correct
    groups of a {0, 1} reward. With a graded reward it is not the same rule: under correctness + 0.1 × brevity an
    all-wrong group's mean is above 0 and it is kept, equal correctness and all (the trap `finding_e_roll`
    measures). The band is on the reward the filter sees, after `reward_shaping`: under the dapo preset's rescale
    to ±1 (r' = 2r − 1) ROLL's (0, 1) is low=−1, high=1, and ROLL's std_threshold s is min_std=2s above.
    A group of one is kept (ROLL); NaN values are left out of the mean (a group with none valid: 0).
    Refs: ROLL roll/pipeline/rlvr query_filter, docs "Rollout Filtering and Dynamic Resampling"; algorithms.md §4.3.
    """
    values_B = _metric_values(correct_B, rewards_B, metric, "mean_in_band")
    _, size_B = ops.group_sum(torch.ones_like(values_B), group_B)
    mean_B, _, _ = ops.group_mean_std(values_B, group_B, ~torch.isnan(values_B))
    return ((mean_B > low) & (mean_B < high)) | (size_B == 1)


def _metric_values(correct_B, rewards_B, metric, name):
    if metric not in ("correct", "reward"):
        raise ValueError(f"{name}: metric must be 'correct' or 'reward', got {metric!r}")
    return correct_B.float() if metric == "correct" else rewards_B.float()
