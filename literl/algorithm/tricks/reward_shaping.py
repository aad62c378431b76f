"""Reward shaping: `(rewards_B, lengths_B, truncated_B, *, ...) -> rewards_B`, applied before advantages.

`lengths_B` is the response length in generated tokens (EOS included), not prompt + response. NaN rewards
(unscorable) stay NaN.

Registered: rescale, soft_overlong.
"""

from __future__ import annotations

import torch

from literl.algorithm.tricks import REWARD_SHAPING

DEFAULT_CACHE_FRACTION = 0.2  # DAPO: L_cache / L_max = 4096 / 20480


@REWARD_SHAPING.register(ranges={"low": "< high"})
def rescale(rewards_B, lengths_B, truncated_B, *, low=0.0, high=1.0):
    """Affine map of a {0,1} reward onto {low, high} (e.g. low=-1 for the ±1 scale).

        r' = low + (high − low)·r

    Std-normalised advantages are invariant to it (up to eps); mean-only ones (dr_grpo) scale with high − low.
    Refs: LitePPO arXiv:2508.08221 Takeaway 1, Fig. 18; algorithms.md §1.7.
    """
    return low + (high - low) * rewards_B.float()


def _cache_length(max_new_tokens, cache_length):
    if max_new_tokens is None:
        raise ValueError("soft_overlong needs max_new_tokens (L_max, the generation cap); give it in params or "
                         "build it with context={'max_new_tokens': ...}")
    if cache_length is None:
        cache_length = max(1, round(DEFAULT_CACHE_FRACTION * max_new_tokens))
    if not 0 < cache_length < max_new_tokens:
        raise ValueError(f"soft_overlong: cache_length={cache_length} must be in (0, max_new_tokens="
                         f"{max_new_tokens}); lower cache_length (DAPO uses 0.2·L_max) or leave it unset")
    return cache_length


@REWARD_SHAPING.register(ranges={"max_new_tokens": ">= 2", "cache_length": "> 0 and < max_new_tokens",
                                  "factor": ">= 0"})
def soft_overlong(rewards_B, lengths_B, truncated_B, *, max_new_tokens=None, cache_length=None, factor=1.0):
    """DAPO soft overlong punishment: a linear penalty over the last cache_length tokens before the cap.

        R_len = 0                                  if |y| ≤ L_max − L_cache
              = ((L_max − L_cache) − |y|)/L_cache  if L_max − L_cache < |y| ≤ L_max
              = −1                                 if |y| > L_max
        r' = r + factor·R_len       L_max = max_new_tokens, L_cache = cache_length (default round(0.2·L_max))

    Added whether or not the answer is correct. On a {0,1} reward, factor=0.5 keeps DAPO's ratio to the
    ±1 correctness gap (§1.7).
    Refs: DAPO arXiv:2503.14476 §3.4 Eq. 13; algorithms.md §4.2.
    """
    cache = _cache_length(max_new_tokens, cache_length)
    start = max_new_tokens - cache
    over_B = (lengths_B.float() - start).clamp(min=0.0)
    penalty_B = torch.where(lengths_B > max_new_tokens, torch.full_like(over_B, -1.0), -over_B / cache)
    return rewards_B.float() + factor * penalty_B
