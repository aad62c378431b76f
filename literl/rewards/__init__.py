"""Rewards: the math answer checker and pluggable, weighted reward functions.

    math_reward(response, gold) -> 1.0 | 0.0          the default check (math_answer.py)
    RewardSet([(path_or_fn, weight), ...]).score(responses, examples) -> (scores_B, correct_B, metrics)
"""

import importlib

# Names resolve on first use: a checker worker process imports `literl.rewards.math_answer`, and
# loading `functions` (and so torch) there would double its start-up time for nothing.
_EXPORTS = {
    "DEFAULT_REWARD_FN": "functions", "RewardSet": "functions", "RewardWarning": "functions",
    "RewardsFailing": "functions",
    "load_reward_fn": "functions", "time_bounded": "isolation",
    "extract_final_answer": "math_answer", "is_equivalent": "math_answer", "math_accuracy": "math_answer",
    "math_reward": "math_answer", "normalize_answer_text": "math_answer",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'literl.rewards' has no attribute {name!r}")
    return getattr(importlib.import_module(f"literl.rewards.{_EXPORTS[name]}"), name)
