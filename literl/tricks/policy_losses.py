"""Policy losses: `(logp_BT, old_logp_BT, rollout_logp_BT, adv_BT, mask_BT, *, ...) -> (loss_BT, metrics)`.

Every loss is per token and UNREDUCED (aggregation is its own axis), 0 off `mask_BT`, and minimised
(loss = −objective). Only `logp_BT` carries a gradient; the other log-probs are treated as constants.
Log-ratios are clamped before `exp` (±20 by default, GSPO's sequence log-ratio ±10) so no ratio overflows.

Metrics are 0-dim tensors (masked means over `mask_BT` unless the key says otherwise), without prefixes:
    clipfrac_binding_low   A<0 ∧ ρ<lo   (the clip zeroes the gradient)
    clipfrac_binding_high  A>0 ∧ ρ>hi
    ratio_outside_low / ratio_outside_high   ρ<lo / ρ>hi whatever the sign of A
    ratio_mean, ratio_min, ratio_max, approx_kl_k1 = mean(old − logp), approx_kl_k3 = mean(ρ − 1 − log ρ)
    clipped_low_BT, clipped_high_BT  per-token bool maps of the two binding sets (all False for reinforce)
plus the loss-specific keys listed in each docstring. Keys ending in `_max`/`_min` reduce across
micro-batches by max/min (over no token they are −inf/+inf, which that reduction ignores), `_BT` keys are
maps, the rest by token-weighted mean.

Registered: reinforce, ppo_clip, gspo, gspo_token, cispo, minirl.
"""

from __future__ import annotations

import math

import torch

from literl import ops
from literl.tricks import POLICY_LOSSES


def _log_ratio(logp_BT, old_logp_BT, clamp):
    """log(π/π_q) clamped to ±clamp: exp of an unclamped outlier would overflow to inf (verl clamps ±20)."""
    return (logp_BT - old_logp_BT).clamp(-clamp, clamp)


def _masked(loss_BT, mask_BT):
    return torch.where(mask_BT, loss_BT, 0.0)


@torch.no_grad()
def _ratio_metrics(ratio_BT, log_ratio_BT, adv_BT, mask_BT, lo, hi):
    """The shared metric dict; `ratio_BT` is the ratio the loss clips, `lo`/`hi` its bounds (None = none)."""
    below_BT = ratio_BT < lo if lo is not None else torch.zeros_like(mask_BT)
    above_BT = ratio_BT > hi if hi is not None else torch.zeros_like(mask_BT)
    clipped_low_BT = below_BT & (adv_BT < 0) & mask_BT
    clipped_high_BT = above_BT & (adv_BT > 0) & mask_BT
    d_BT = log_ratio_BT.detach()
    return {
        "clipfrac_binding_low": ops.masked_mean(clipped_low_BT.float(), mask_BT),
        "clipfrac_binding_high": ops.masked_mean(clipped_high_BT.float(), mask_BT),
        "ratio_outside_low": ops.masked_mean(below_BT.float(), mask_BT),
        "ratio_outside_high": ops.masked_mean(above_BT.float(), mask_BT),
        "ratio_mean": ops.masked_mean(ratio_BT, mask_BT),
        "ratio_min": ops.masked_min(ratio_BT, mask_BT),
        "ratio_max": ops.masked_max(ratio_BT, mask_BT),
        "approx_kl_k1": ops.masked_mean(-d_BT, mask_BT),
        "approx_kl_k3": ops.masked_mean(torch.expm1(d_BT) - d_BT, mask_BT),
        "clipped_low_BT": clipped_low_BT,
        "clipped_high_BT": clipped_high_BT,
    }


def _clipped_surrogate(ratio, adv, eps_low, eps_high):
    """max(−A·ρ, −A·clip(ρ, 1−eps_low, 1+eps_high)): zero gradient exactly on the binding sets."""
    return torch.maximum(-adv * ratio, -adv * ratio.clamp(1.0 - eps_low, 1.0 + eps_high))


@POLICY_LOSSES.register(ranges={"is_cap": "> 0", "log_ratio_clamp": "> 0"})
def reinforce(logp_BT, old_logp_BT, rollout_logp_BT, adv_BT, mask_BT, *, behaviour="old", is_cap=None,
              log_ratio_clamp=20.0):
    """REINFORCE with importance sampling, log form (no clipping).

        w_t = exp(sg(logp_t) − q_logp_t)  [min(w, is_cap) when set],  q = old ("old") or μ ("rollout")
        loss_t = −sg(w_t)·A_t·logp_t           ∇ = −w_t·A_t·∇logp_t

    The value is not the ratio-form objective, only its gradient matches (log it as a surrogate).
    Extra metrics: is_weight_mean, is_weight_max, is_truncated_frac.
    Refs: Williams 1992; verl compute_policy_loss_reinforce; algorithms.md §2.1.
    """
    if behaviour not in ("old", "rollout"):
        raise ValueError(f"reinforce: behaviour must be 'old' or 'rollout', got {behaviour!r}")
    q_BT = old_logp_BT if behaviour == "old" else rollout_logp_BT
    w_BT = torch.exp(_log_ratio(logp_BT.detach(), q_BT, log_ratio_clamp))
    capped_BT = w_BT > is_cap if is_cap is not None else torch.zeros_like(mask_BT)
    if is_cap is not None:
        w_BT = w_BT.clamp(max=is_cap)
    loss_BT = _masked(-w_BT * adv_BT * logp_BT, mask_BT)
    d_BT = _log_ratio(logp_BT.detach(), old_logp_BT, log_ratio_clamp)
    metrics = _ratio_metrics(torch.exp(d_BT), d_BT, adv_BT, mask_BT, None, None)
    metrics.update(is_weight_mean=ops.masked_mean(w_BT, mask_BT), is_weight_max=ops.masked_max(w_BT, mask_BT),
                   is_truncated_frac=ops.masked_mean(capped_BT.float(), mask_BT))
    return loss_BT, metrics


@POLICY_LOSSES.register(ranges={"eps_low": ">= 0 and <= 1", "eps_high": ">= 0", "dual_clip": "> 1",
                                 "log_ratio_clamp": "> 0"})
def ppo_clip(logp_BT, old_logp_BT, rollout_logp_BT, adv_BT, mask_BT, *, eps_low=0.2, eps_high=0.2, dual_clip=None,
             log_ratio_clamp=20.0):
    """PPO clipped surrogate with decoupled bounds (clip-higher when eps_high > eps_low) and optional dual-clip.

        ρ_t = exp(logp_t − old_logp_t)
        loss_t = max(−A·ρ_t, −A·clip(ρ_t, 1−eps_low, 1+eps_high))
        dual_clip = c > 1, for A < 0 only: loss_t = min(loss_t, −c·A)    (zero gradient when ρ > c)

    The gradient is exactly 0 on (A>0 ∧ ρ>1+eps_high) ∨ (A<0 ∧ ρ<1−eps_low), and on (A<0 ∧ ρ>c).
    Extra metric: dual_clip_frac (A<0 ∧ ρ>c). clipped_*_BT hold the §2.2 sets, not the dual-clip set.
    Refs: PPO arXiv:1707.06347 Eq. 7; clip-higher DAPO arXiv:2503.14476 §3.1; dual-clip arXiv:1912.09729;
    algorithms.md §2.2–2.4.
    """
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"ppo_clip: dual_clip must be > 1 (it floors the objective at c·A), got {dual_clip}")
    log_ratio_BT = _log_ratio(logp_BT, old_logp_BT, log_ratio_clamp)
    ratio_BT = torch.exp(log_ratio_BT)
    loss_BT = _clipped_surrogate(ratio_BT, adv_BT, eps_low, eps_high)
    dual_BT = torch.zeros_like(mask_BT)
    if dual_clip is not None:
        dual_BT = (adv_BT < 0) & (-dual_clip * adv_BT < loss_BT)
        loss_BT = torch.where(adv_BT < 0, torch.minimum(loss_BT, -dual_clip * adv_BT), loss_BT)
    metrics = _ratio_metrics(ratio_BT.detach(), log_ratio_BT, adv_BT, mask_BT, 1.0 - eps_low, 1.0 + eps_high)
    metrics["dual_clip_frac"] = ops.masked_mean(dual_BT.float(), mask_BT)
    return _masked(loss_BT, mask_BT), metrics


def _seq_log_ratio(logp_BT, old_logp_BT, mask_BT, clamp):
    """mean_t log ρ over the valid tokens (empty row → 0, so s = 1), clamped to ±clamp (verl clamps ≤ 10)."""
    return ops.masked_mean(logp_BT - old_logp_BT, mask_BT, dim=-1).clamp(-clamp, clamp)


def _gspo_metrics(seq_ratio_B, logp_BT, old_logp_BT, adv_BT, mask_BT, eps_low, eps_high, clamp):
    ratio_BT = seq_ratio_B.detach()[:, None].expand_as(logp_BT)
    log_ratio_BT = _log_ratio(logp_BT.detach(), old_logp_BT, clamp)
    return _ratio_metrics(ratio_BT, log_ratio_BT, adv_BT, mask_BT, 1.0 - eps_low, 1.0 + eps_high)


@POLICY_LOSSES.register(ranges={"eps_low": ">= 0 and <= 1", "eps_high": ">= 0", "log_ratio_clamp": "> 0"})
def gspo(logp_BT, old_logp_BT, rollout_logp_BT, adv_BT, mask_BT, *, eps_low=3e-4, eps_high=4e-4,
         log_ratio_clamp=10.0):
    """GSPO: PPO clipping on the length-normalised sequence ratio.

        s_i = exp((1/|y_i|) Σ_t log ρ_it),   A_i = mean_t A_it
        loss_it = max(−A_i·s_i, −A_i·clip(s_i, 1−eps_low, 1+eps_high))   on every valid token of i

    Each valid token carries its sequence's loss, so seq_mean_token_mean aggregation gives exactly the
    paper's (1/G) Σ_i objective (token_mean would weight sequence i by |y_i|). Empty response: s = 1, loss 0.
    Metrics are on s_i broadcast to tokens (token-weighted); approx_kl_* on the token log-ratios.
    Refs: GSPO arXiv:2507.18071 Eq. 5–7; algorithms.md §2.5.
    """
    seq_ratio_B = torch.exp(_seq_log_ratio(logp_BT, old_logp_BT, mask_BT, log_ratio_clamp))
    adv_B = ops.masked_mean(adv_BT, mask_BT, dim=-1)
    loss_B = _clipped_surrogate(seq_ratio_B, adv_B, eps_low, eps_high)
    loss_BT = _masked(loss_B[:, None].expand_as(logp_BT), mask_BT)
    return loss_BT, _gspo_metrics(seq_ratio_B, logp_BT, old_logp_BT, adv_BT, mask_BT, eps_low, eps_high,
                                  log_ratio_clamp)


@POLICY_LOSSES.register(ranges={"eps_low": ">= 0 and <= 1", "eps_high": ">= 0", "log_ratio_clamp": "> 0"})
def gspo_token(logp_BT, old_logp_BT, rollout_logp_BT, adv_BT, mask_BT, *, eps_low=3e-4, eps_high=4e-4,
               log_ratio_clamp=10.0):
    """GSPO-token: the sequence ratio's value with a per-token gradient, allowing per-token advantages.

        s_it = sg(s_i)·π_θ(y_it)/sg(π_θ(y_it)) = exp(logp_it − sg(logp_it) + sg(log s_i))
        loss_it = max(−A_it·s_it, −A_it·clip(s_it, 1−eps_low, 1+eps_high))

    Equal to gspo (value, clip set, gradient) when A_it = A_i and aggregated by seq_mean_token_mean.
    Refs: GSPO arXiv:2507.18071 Eq. 13–14 (verl compute_policy_loss_gspo); algorithms.md §2.5.
    """
    log_s_B = _seq_log_ratio(logp_BT.detach(), old_logp_BT, mask_BT, log_ratio_clamp)
    ratio_BT = torch.exp(logp_BT - logp_BT.detach() + log_s_B[:, None])
    loss_BT = _masked(_clipped_surrogate(ratio_BT, adv_BT, eps_low, eps_high), mask_BT)
    return loss_BT, _gspo_metrics(torch.exp(log_s_B), logp_BT, old_logp_BT, adv_BT, mask_BT, eps_low, eps_high,
                                  log_ratio_clamp)


@POLICY_LOSSES.register(ranges={"ub": "> 0", "lb": ">= 0 and <= ub", "eps_high": ">= 0",
                                 "eps_low": ">= 0 and <= 1", "log_ratio_clamp": "> 0"})
def cispo(logp_BT, old_logp_BT, rollout_logp_BT, adv_BT, mask_BT, *, ub=5.0, lb=None, eps_high=None, eps_low=None,
          unified_mask=False, log_ratio_clamp=20.0):
    """CISPO: REINFORCE weighted by a clipped, detached IS ratio; clipped tokens keep their gradient.

        ρ_t = exp(sg(logp_t) − old_logp_t),   ŵ_t = clamp(ρ_t, lb, ub)   (ub absolute cap, lb None = none)
        loss_t = −M_t·sg(ŵ_t)·A_t·logp_t
        M_t = 1, or with unified_mask: 0 if (A>0 ∧ ρ>ub) ∨ (A<0 ∧ lb set ∧ ρ<lb)

    The bounds can also be given in the paper's notation, r̂ = clip(ρ, 1 − ε_low^IS, 1 + ε_high^IS):
    eps_high sets ub = 1 + eps_high and eps_low sets lb = 1 − eps_low (each overrides ub / lb when given).
    Mind the convention: TRL's CISPO `epsilon_high` is the absolute cap, i.e. our `ub`.
    Past the cap the gradient is ub·A·∇logp, not 0 as in PPO; the unified mask restores PPO's zero set.
    Extra metric: capped_frac (ŵ ≠ ρ). ratio_outside_* are ρ>ub / ρ<lb; clipfrac_binding_* the M = 0 sets.
    Refs: MiniMax-M1 arXiv:2506.13585 Eq. 4–7 (TRL loss_type="cispo": absolute cap, ScaleRL ub = 5); algorithms.md §2.6.
    """
    if eps_high is not None:
        ub = 1.0 + eps_high
    if eps_low is not None:
        lb = 1.0 - eps_low
    log_ratio_BT = _log_ratio(logp_BT.detach(), old_logp_BT, log_ratio_clamp)
    ratio_BT = torch.exp(log_ratio_BT)
    w_BT = ratio_BT.clamp(min=lb, max=ub) if (lb, ub) != (None, None) else ratio_BT
    metrics = _ratio_metrics(ratio_BT, log_ratio_BT, adv_BT, mask_BT, lb, ub)
    keep_BT = mask_BT
    if unified_mask:
        keep_BT = mask_BT & ~metrics["clipped_low_BT"] & ~metrics["clipped_high_BT"]
    metrics["capped_frac"] = ops.masked_mean((w_BT != ratio_BT).float(), mask_BT)
    return _masked(-w_BT * adv_BT * logp_BT, keep_BT), metrics


@POLICY_LOSSES.register(ranges={"eps_low": ">= 0 and <= 1", "eps_high": ">= 0", "tis_cap": "> 0",
                                 "log_ratio_clamp": "> 0"})
def minirl(logp_BT, old_logp_BT, rollout_logp_BT, adv_BT, mask_BT, *, eps_low=0.2, eps_high=0.27, tis_cap=5.0,
           tis_scope="full", train_infer_is=True, log_ratio_clamp=20.0):
    """MiniRL: PPO-masked REINFORCE with the full, truncated token IS weight π_θ/μ_old.

        r_t = π_θ/π_old (training-engine old policy),  f_t = π_old/μ_old (1 if not train_infer_is)
        M_t = 0 if (A>0 ∧ r_t>1+eps_high) ∨ (A<0 ∧ r_t<1−eps_low), else 1
        w_t = min(f_t·r_t, tis_cap)  (tis_scope="full")   |   min(f_t, tis_cap)·r_t  ("train_infer")
        loss_t = −M_t·sg(w_t)·A_t·logp_t

    On-policy (θ = θ_old) this is (π_old/μ_old)-weighted REINFORCE. Pair with dr_grpo advantages and
    seq_mean_token_sum aggregation (the paper's setting). Extra metrics: is_weight_mean, is_weight_max,
    is_truncated_frac. Clip metrics and clipped_*_BT are on r (the M = 0 sets).
    Refs: Zheng et al. arXiv:2512.01374 §4.1 Eq. 7 (TIS threshold 5); algorithms.md §2.7.
    """
    if tis_scope not in ("full", "train_infer"):
        raise ValueError(f"minirl: tis_scope must be 'full' or 'train_infer', got {tis_scope!r}")
    cap = math.inf if tis_cap is None else tis_cap
    d_st_BT = _log_ratio(logp_BT.detach(), old_logp_BT, log_ratio_clamp)
    d_ti_BT = _log_ratio(old_logp_BT, rollout_logp_BT, log_ratio_clamp) if train_infer_is \
        else torch.zeros_like(d_st_BT)
    ratio_BT = torch.exp(d_st_BT)
    if tis_scope == "full":
        raw_BT = torch.exp((d_st_BT + d_ti_BT).clamp(-log_ratio_clamp, log_ratio_clamp))
        w_BT = raw_BT.clamp(max=cap)
    else:
        raw_BT = torch.exp(d_ti_BT)
        w_BT = raw_BT.clamp(max=cap) * ratio_BT
    metrics = _ratio_metrics(ratio_BT, d_st_BT, adv_BT, mask_BT, 1.0 - eps_low, 1.0 + eps_high)
    keep_BT = mask_BT & ~metrics["clipped_low_BT"] & ~metrics["clipped_high_BT"]
    metrics.update(is_weight_mean=ops.masked_mean(w_BT, mask_BT), is_weight_max=ops.masked_max(w_BT, mask_BT),
                   is_truncated_frac=ops.masked_mean((raw_BT > cap).float(), mask_BT))
    return _masked(-w_BT * adv_BT * logp_BT, keep_BT), metrics
