"""Which per-tier reward-std curves a training set gets (`groups/reward_std/<tier>`)."""

from __future__ import annotations

from literl.rollout.collector import MAX_TIERS, tier_labels


def test_few_tiers_are_kept_as_they_are():
    problems = [{"difficulty": "3_ops"}, {"level": "Level 5"}, {"tier": "hard"}, {}]
    assert tier_labels(problems) == ["3_ops", "Level 5", "hard", ""]


def test_half_step_difficulties_are_binned_to_whole_numbers_so_no_tier_is_dropped():
    """DeepMath: 18 values 1.0, 1.5, ..., 9.5. Without binning, 6 of them (the hardest, in string order) had no
    curve at all."""
    values = [1.0 + 0.5 * k for k in range(18)]
    labels = tier_labels([{"difficulty": v} for v in values])
    assert labels == [str(int(v)) for v in values]
    assert len(set(labels)) == 9 <= MAX_TIERS


def test_many_named_tiers_keep_the_most_common_ones():
    problems = [{"tier": f"t{k}"} for k in range(MAX_TIERS + 3)] + [{"tier": "t0"}] * 5
    labels = tier_labels(problems)
    assert len(set(labels) - {""}) == MAX_TIERS and labels.count("t0") == 6
