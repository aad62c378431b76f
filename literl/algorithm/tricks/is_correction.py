"""Training–inference mismatch correction.

Signature: `(old_logp_BT, rollout_logp_BT, mask_BT, *, ...) -> (weight_BT, keep_BT, metrics)`.

The ratio corrected is π_old/μ_old, with d_t = old_logp_t − rollout_logp_t (log-space, clamped ±20 before
any exp). The objective multiplies the per-token policy loss by `weight_BT` (detached float32; 1 off the
mask) and drops tokens with `keep_BT` False from the loss AND from the aggregation denominators
(rejection sampling). Masking with reject=False instead sets the weight to 0 but keeps the token in the
denominators (TRL "mask", dilution); reject=True removes it (verl rollout_rs).

Metrics over the response mask unless said: weight_mean, weight_min, weight_max and ess (1/mean(ŵ²),
ŵ = w/mean(w)) over the kept tokens; truncated_frac (TIS: ρ > cap) or masked_frac (MIS: outside
[low, high]). With no kept token, weight_min/weight_max are +inf/−inf (a min/max over nothing), which the
objective leaves out of the logged metrics.

Registered: none, token_tis, seq_tis, token_mis, seq_mis, geo_mis.
"""

from __future__ import annotations

import torch

from literl.algorithm import ops
from literl.algorithm.tricks import IS_CORRECTIONS

LOG_RATIO_CLAMP = 20.0  # exp(±20) stays finite in fp32, also for a sequence sum (verl clamps ±20)


def _token_log_ratio(old_logp_BT, rollout_logp_BT, mask_BT):
    d_BT = old_logp_BT.detach().float() - rollout_logp_BT.detach().float()
    return torch.where(mask_BT, d_BT, torch.zeros_like(d_BT)).clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


def _seq_ratio(old_logp_BT, rollout_logp_BT, mask_BT, *, geometric):
    """Per-sequence ratio broadcast to tokens: exp(Σ_t d_t) (product) or exp(mean_t d_t) (geometric mean)."""
    d_BT = _token_log_ratio(old_logp_BT, rollout_logp_BT, mask_BT)
    d_B = ops.masked_mean(d_BT, mask_BT, dim=-1) if geometric else d_BT.sum(-1)
    return torch.exp(d_B.clamp(-LOG_RATIO_CLAMP, LOG_RATIO_CLAMP))[:, None].expand_as(d_BT)


def _finish(w_BT, keep_BT, mask_BT, frac_name, frac_BT):
    """Weights (1 off the mask, 0 on rejected tokens) and the shared metrics."""
    weight_BT = torch.where(mask_BT, torch.where(keep_BT, w_BT, torch.zeros_like(w_BT)), torch.ones_like(w_BT))
    metrics = {
        "weight_mean": ops.masked_mean(weight_BT, keep_BT),
        "weight_max": ops.masked_max(weight_BT, keep_BT),
        "weight_min": ops.masked_min(weight_BT, keep_BT),
        "ess": ops.effective_sample_size(weight_BT, keep_BT),
        frac_name: ops.masked_mean(frac_BT.float(), mask_BT),
    }
    return weight_BT.float(), keep_BT, metrics


def _tis(ratio_BT, mask_BT, cap):
    return _finish(ratio_BT.clamp(max=cap), mask_BT, mask_BT, "truncated_frac", ratio_BT > cap)


def _mis(ratio_BT, mask_BT, low, high, reject):
    outside_BT = (ratio_BT < low) | (ratio_BT > high)
    w_BT = torch.where(outside_BT, torch.zeros_like(ratio_BT), ratio_BT)
    keep_BT = mask_BT & ~outside_BT if reject else mask_BT
    return _finish(w_BT, keep_BT, mask_BT, "masked_frac", outside_BT & mask_BT)


# identity: the objective may then skip the old-logp recompute on a single on-policy update (old = sg(logp) exactly).
@IS_CORRECTIONS.register(identity=True)
def none(old_logp_BT, rollout_logp_BT, mask_BT):
    """No correction: the loss trusts π_old as the sampler.

        w_t = 1,  keep_t = m_t

    Refs: algorithms.md §2.8 (verl bypass mode folds μ into the PPO ratio instead).
    """
    ones_BT = torch.ones_like(old_logp_BT, dtype=torch.float32)
    return _finish(ones_BT, mask_BT, mask_BT, "truncated_frac", torch.zeros_like(mask_BT))



@IS_CORRECTIONS.register(ranges={"cap": "> 0"})
def token_tis(old_logp_BT, rollout_logp_BT, mask_BT, *, cap=2.0):
    """Truncated importance sampling per token (one-sided, upper).

        w_t = min(π_old(y_t)/μ(y_t), cap) = min(exp(d_t), cap)

    Refs: Yao et al. 2025 "Your efficient RL framework secretly brings you off-policy RL training" (TIS);
    verl rollout_is=token, threshold 2.0; algorithms.md §2.8.
    """
    d_BT = _token_log_ratio(old_logp_BT, rollout_logp_BT, mask_BT)
    return _tis(torch.exp(d_BT), mask_BT, cap)


@IS_CORRECTIONS.register(ranges={"cap": "> 0"})
def seq_tis(old_logp_BT, rollout_logp_BT, mask_BT, *, cap=2.0):
    """Truncated importance sampling on the sequence (product) ratio, shared by all tokens of a sequence.

        ρ_i = exp(clamp(Σ_t d_t, ±20)),   w_it = min(ρ_i, cap)

    Empty response: ρ = 1.
    Refs: verl rollout_is=sequence; TRL sequence_truncate; algorithms.md §2.8.
    """
    return _tis(_seq_ratio(old_logp_BT, rollout_logp_BT, mask_BT, geometric=False), mask_BT, cap)


@IS_CORRECTIONS.register(ranges={"low": ">= 0 and < high"})
def token_mis(old_logp_BT, rollout_logp_BT, mask_BT, *, low=0.5, high=2.0, reject=False):
    """Masked importance sampling per token: keep the ratio inside [low, high], drop the token outside.

        w_t = exp(d_t)·1[low ≤ exp(d_t) ≤ high]
        reject=False: weight 0, token kept in the denominators (TRL token_mask)
        reject=True:  keep_t = False, the token leaves the loss and the denominators (verl rollout_rs)

    Refs: Liu et al. 2025 "When speed kills stability" (MIS); algorithms.md §2.8.
    """
    d_BT = _token_log_ratio(old_logp_BT, rollout_logp_BT, mask_BT)
    return _mis(torch.exp(d_BT), mask_BT, low, high, reject)


@IS_CORRECTIONS.register(ranges={"low": ">= 0 and < high"})
def seq_mis(old_logp_BT, rollout_logp_BT, mask_BT, *, low=0.5, high=2.0, reject=False):
    """Masked importance sampling on the sequence (product) ratio: a whole sequence is in or out.

        ρ_i = exp(clamp(Σ_t d_t, ±20)),   w_it = ρ_i·1[low ≤ ρ_i ≤ high]     (reject as in token_mis)

    Refs: Liu et al. 2025 (MIS); TRL sequence_mask (default mode); algorithms.md §2.8.
    """
    ratio_BT = _seq_ratio(old_logp_BT, rollout_logp_BT, mask_BT, geometric=False)
    return _mis(ratio_BT, mask_BT, low, high, reject)


@IS_CORRECTIONS.register(ranges={"low": ">= 0 and < high"})
def geo_mis(old_logp_BT, rollout_logp_BT, mask_BT, *, low=0.5, high=2.0, reject=False):
    """Masked importance sampling on the geometric-mean sequence ratio (length-independent scale).

        ρ_i = exp(mean_t d_t),   w_it = ρ_i·1[low ≤ ρ_i ≤ high]     (reject as in token_mis)

    Empty response: ρ = 1.
    Refs: Liu et al. 2025 (MIS); ROLL geometric ratio, verl seq_mean_k1; algorithms.md §2.8.
    """
    ratio_BT = _seq_ratio(old_logp_BT, rollout_logp_BT, mask_BT, geometric=True)
    return _mis(ratio_BT, mask_BT, low, high, reject)
