"""Why a step has no learning signal: every advantage is 0, so the policy-gradient term is 0 and the step only
moves the weights through KL, entropy or optimizer momentum. Some causes are a setting the user can fix and
would otherwise go unnoticed for a whole run (weights that never change), so the trainer says which one.

The diagnosis reads only the step's metrics (no trick names), most specific cause first.
"""

from __future__ import annotations

import json
from pathlib import Path


def no_signal_reason(metrics: dict[str, float], *, group_size: int) -> str:
    """The most likely reason a step's advantages are all 0, in words with the fix."""
    sampled = metrics.get("collect/sampled_groups", 0.0) * group_size
    if metrics.get("collect/batch_fill", 1.0) == 0.0:
        rounds = int(metrics.get("collect/rounds", 1))
        return (f"the group filter kept none of the {int(metrics.get('collect/sampled_groups', 0))} groups sampled "
                f"in {rounds} round{'s' if rounds != 1 else ''}, so the batch is empty and the step is skipped "
                "(optim/skipped_step); if this persists the weights never change: loosen "
                "algorithm.group_filter.params, or raise rollout.max_rounds to resample more")
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


def run_without_signal(metrics_path: str | Path) -> str | None:
    """Why a whole run learned nothing, read from its metrics.jsonl (every step of every session, a resume's
    included): None when some step had a learning signal, or when no step was trained at all (trainer.steps=0)."""
    steps = skipped = 0
    path = Path(metrics_path)
    for line in path.read_bytes().splitlines() if path.is_file() else []:
        try:
            record = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        if not isinstance(record, dict):
            continue
        steps += 1
        if record.get("optim/skipped_step") == 1.0:
            skipped += 1
        elif record.get("advantage/all_zero") != 1.0:
            return None
    if steps == 0:
        return None
    if skipped == steps:
        return (f"every one of its {steps} steps had an empty batch (the group filter kept no group), so no "
                "optimizer step ran and final/ holds the starting weights; see the first warning above for the fix")
    return (f"none of its {steps} steps had a learning signal (every advantage 0; {skipped} of them with an empty "
            "batch), so the weights moved only through KL, entropy or optimizer momentum, if at all; see the warnings "
            "above for the cause")
