"""Why a step has no learning signal: every advantage is 0, so the policy-gradient term is 0 and the step only
moves the weights through KL, entropy or optimizer momentum. Some causes are a setting the user can fix and
would otherwise go unnoticed for a whole run (weights that never change), so the trainer says which one.

The diagnosis reads only the step's metrics (no trick names), most specific cause first.
"""

from __future__ import annotations


def no_signal_reason(metrics: dict[str, float], *, group_size: int) -> str:
    """The most likely reason a step's advantages are all 0, in words with the fix."""
    sampled = metrics.get("collect/sampled_groups", 0.0) * group_size
    for key, value in metrics.items():
        if key.startswith("reward/") and key.endswith("/errors"):
            name = key[len("reward/"):-len("/errors")]
            failed = value + metrics.get(f"reward/{name}/timeouts", 0.0)
            if sampled and failed >= sampled:
                return (f"reward function {name} failed or timed out on every response of the step, so every one "
                        f"scored 0 (see the warning about it above; counts in reward/{name}/errors and /timeouts)")
    if group_size == 1:
        return ("rollout.group_size=1: each prompt has one response, so a group-relative advantage has no baseline "
                "and is 0 and the weights never change; use rollout.group_size >= 2, or an advantage over the "
                "batch (algorithm.advantage.name=batch_norm or reinforce_pp)")
    if metrics.get("reward/std", 1.0) == 0.0:
        return (f"every response of the step got the same reward ({metrics.get('reward/mean', 0.0):g}); if this "
                "persists, the problems are too hard or too easy for the policy, or the reward function does not "
                "tell responses apart")
    if metrics.get("groups/zero_std_frac", 0.0) == 1.0:
        return ("within every group all responses got the same reward (each problem all right or all wrong); if "
                "this persists, the problems are too hard or too easy for the policy (dynamic sampling, "
                "algorithm.group_filter.name=nonzero_reward_std with rollout.max_rounds > 1, refills such batches)")
    return "every advantage of the step is 0"
