"""A graded length term for `reward.fns`: shorter responses score higher, in [0, 1].

    brevity(response) = 1 − min(len(response), max_chars) / max_chars         (characters; max_chars = 256)

Beside the correctness check with a small weight (`reward.fns=[{fn: ...math_accuracy}, {fn:
literl.rewards.length:brevity, weight: 0.1}]`), it prefers the shorter of two equally correct responses, as
length-aware rewards do (e.g. Kimi k1.5's length penalty, arXiv 2501.12599). It also makes the reward graded:
a group whose members are all correct no longer has a reward std of exactly 0 but one of its length spread
times the weight (`groups/small_std_frac`), which is what a group-std normalisation divides by (algorithms.md §1.1;
the regime of `finding_c`, docs/testbed.md).
"""

from __future__ import annotations

MAX_CHARS = 256


def brevity(response: str, example: dict | None = None, *, max_chars: int = MAX_CHARS) -> float:
    """1 − min(len(response), max_chars) / max_chars: 1.0 for an empty response, 0.0 from max_chars on."""
    if max_chars <= 0:
        raise ValueError(f"max_chars must be > 0 (got {max_chars})")
    return 1.0 - min(len(response), max_chars) / max_chars
