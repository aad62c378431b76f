"""Group filters (§4.3)."""

from __future__ import annotations

import pytest
import torch

from literl.config.load import ConfigError, load_config
from literl.algorithm.tricks import GROUP_FILTERS

CORRECT = torch.tensor([1, 1, 0, 1, 0, 0, 1], dtype=torch.bool)
GROUPS = torch.tensor([0, 0, 1, 1, 2, 2, 3])


def test_keep_all_hand():
    """Every row kept."""
    assert GROUP_FILTERS.get("keep_all")(CORRECT, CORRECT.float(), GROUPS).tolist() == [True] * 7


def test_nonzero_reward_std_hand():
    """correct by group: 0 = [1,1] all right → drop; 1 = [0,1] → keep; 2 = [0,0] all wrong → drop;
    3 = [1], a group of one → keep (verl). Rows interleaved by id, not position: ids [5,9,5,9] with
    correct [1,1,1,0] → group 5 all right (drop), group 9 mixed (keep).
    metric="reward": group 0 rewards [1, 0.5] (an overlong penalty) differ → kept, though all correct."""
    keep = GROUP_FILTERS.get("nonzero_reward_std")(CORRECT, CORRECT.float(), GROUPS)
    assert keep.tolist() == [False, False, True, True, False, False, True]
    ids = torch.tensor([5, 9, 5, 9])
    keep = GROUP_FILTERS.get("nonzero_reward_std")(torch.tensor([True, True, True, False]), torch.zeros(4), ids)
    assert keep.tolist() == [False, True, False, True]
    rewards = torch.tensor([1.0, 0.5, 0, 1, 0, 0, 1])
    keep = GROUP_FILTERS.build("nonzero_reward_std", {"metric": "reward"})(CORRECT, rewards, GROUPS)
    assert keep.tolist() == [True, True, True, True, False, False, True]
    assert GROUP_FILTERS.get("nonzero_reward_std")(CORRECT, rewards, GROUPS).tolist()[:2] == [False, False]


# A graded reward (correctness + 0.1 x brevity): group 0 all right, group 1 all wrong, both differing by length;
# group 2 all wrong and equal; group 3 mixed; group 4 a group of one.
GRADED = torch.tensor([1.05, 1.08, 0.05, 0.07, 0.0, 0.0, 1.0, 0.0, 1.0])
GRADED_CORRECT = torch.tensor([1, 1, 0, 0, 0, 0, 1, 0, 1], dtype=torch.bool)
GRADED_GROUPS = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3, 4])


def test_nonzero_reward_std_drops_groups_whose_std_is_at_most_min_std():
    """ROLL's std_filter (unbiased std, as torch.std): a pair differing by d has std d/√2.
    Group 0: d = 0.03 → 0.0212; group 1: d = 0.02 → 0.0141; group 2: 0; group 3: [1, 0] → 0.707; group 4: one.
    min_std 0.01 keeps 0, 1, 3, 4; min_std 0.02 keeps 0, 3, 4 (group 1's 0.0141 ≤ 0.02);
    min_std 0 is the exact rule, which keeps groups 0 and 1 too (their rewards differ)."""
    build = GROUP_FILTERS.build

    def kept(params):
        keep = build("nonzero_reward_std", {"metric": "reward", **params})(GRADED_CORRECT, GRADED, GRADED_GROUPS)
        return sorted({int(g) for g, k in zip(GRADED_GROUPS, keep) if k})

    assert kept({"min_std": 0.01}) == [0, 1, 3, 4]
    assert kept({"min_std": 0.02}) == [0, 3, 4]
    assert kept({"min_std": 0.0}) == [0, 1, 3, 4]
    assert kept({}) == [0, 1, 3, 4]


def test_mean_in_band_hand():
    """ROLL's mean_filter (drop when mean ≤ low or mean ≥ high), defaults (0, 1), on the graded reward:
    group 0 mean 1.065 ≥ 1 → drop; group 1 mean 0.06 → KEEP (all wrong, kept: the graded reward's trap);
    group 2 mean 0 ≤ 0 → drop; group 3 mean 0.5 → keep; group 4, a group of one → keep.
    On correctness (metric="correct") group 1's mean is 0 → dropped: the DAPO rule.
    A NaN reward is left out of the mean: [NaN, 0.5, 0.7] → 0.6 → keep; all NaN → mean 0 → drop."""
    mean_in_band = GROUP_FILTERS.get("mean_in_band")
    assert mean_in_band(GRADED_CORRECT, GRADED, GRADED_GROUPS).tolist() == [
        False, False, True, True, False, False, True, True, True]
    on_correct = GROUP_FILTERS.build("mean_in_band", {"metric": "correct"})(GRADED_CORRECT, GRADED, GRADED_GROUPS)
    assert on_correct.tolist() == [False, False, False, False, False, False, True, True, True]
    nan = float("nan")
    keep = mean_in_band(torch.zeros(5, dtype=torch.bool), torch.tensor([nan, 0.5, 0.7, nan, nan]),
                        torch.tensor([0, 0, 0, 1, 1]))
    assert keep.tolist() == [True, True, True, False, False]
    narrow = GROUP_FILTERS.build("mean_in_band", {"low": 0.1, "high": 0.9})(GRADED_CORRECT, GRADED, GRADED_GROUPS)
    assert narrow.tolist() == [False, False, False, False, False, False, True, True, True]


def test_group_filters_refuse_parameters_that_cannot_filter():
    """A negative min_std and a band with low ≥ high are refused when the config loads (the registry's ranges);
    an unknown metric when the filter runs. Each message names the parameter and its valid range."""
    with pytest.raises(ConfigError, match=r"min_std=-0.1 must be >= 0"):
        load_config(overrides=["algorithm.group_filter.name=nonzero_reward_std", "rollout.max_rounds=3",
                               "algorithm.group_filter.params.min_std=-0.1"])
    with pytest.raises(ConfigError, match=r"low=1.0 must be < high=1.0"):
        load_config(overrides=["algorithm.group_filter.name=mean_in_band", "rollout.max_rounds=3",
                               "algorithm.group_filter.params={low: 1.0, high: 1.0}"])
    with pytest.raises(ValueError, match="metric must be 'correct' or 'reward'"):
        GROUP_FILTERS.build("mean_in_band", {"metric": "score"})(CORRECT, CORRECT.float(), GROUPS)


HAND_CASES = {"keep_all": test_keep_all_hand, "nonzero_reward_std": test_nonzero_reward_std_hand,
              "mean_in_band": test_mean_in_band_hand}
