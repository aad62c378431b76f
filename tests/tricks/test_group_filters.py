"""Group filters (§4.3)."""

from __future__ import annotations

import torch

from literl.tricks import GROUP_FILTERS

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


HAND_CASES = {"keep_all": test_keep_all_hand, "nonzero_reward_std": test_nonzero_reward_std_hand}
