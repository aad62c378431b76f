"""Loss masks: `(mask_BT, truncated_B, *, ...) -> keep_BT`; a mask only ever turns True into False.

Applied after the advantage statistics (TRL, ROLL), so masked sequences still shape their group's baseline;
masked tokens leave the aggregation denominators. The objective ANDs every configured mask.

Registered: overlong.
"""

from __future__ import annotations

from literl.algorithm.tricks import LOSS_MASKS


@LOSS_MASKS.register
def overlong(mask_BT, truncated_B):
    """DAPO overlong filtering: a response cut by max_new_tokens (no EOS) contributes no loss.

        keep_it = m_it ∧ ¬truncated_i        truncated = stopped by the length cap, not by EOS

    "Truncated" is finish_reason == "length", not "length == cap" (ROLL), so a response that ends with EOS
    exactly at the cap is kept.
    Refs: DAPO arXiv:2503.14476 §3.4; algorithms.md §4.1.
    """
    return mask_BT & ~truncated_B.bool()[:, None]
