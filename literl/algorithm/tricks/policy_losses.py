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

Registered: reinforce, ppo_clip, gspo, gspo_token, cispo, minirl, gmpo, sapo, clip_cov, kl_cov.
"""

from __future__ import annotations

import math

import torch

from literl.algorithm import ops
from literl.algorithm.registry import Expects, UnderSettings
from literl.algorithm.tricks import POLICY_LOSSES

# How some losses go with the other axes (checked when a config loads: literl.algorithm.registry).
SEQUENCE_LEVEL = Expects("aggregation", ("seq_mean_token_mean",),
                         "{name} is defined with seq_mean_token_mean aggregation (algorithms.md §2.5); {other} weights "
                         "each sequence by its length")
TOKEN_LEVEL = Expects("aggregation", ("token_mean",),
                      "{name} is defined with token_mean aggregation (the paper's token-level loss, algorithms.md "
                      "§10.5-10.6); {other} weighs tokens differently")


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


@POLICY_LOSSES.register(ranges={"eps_low": ">= 0 and <= 1", "eps_high": ">= 0", "log_ratio_clamp": "> 0"},
                        compatibility=[SEQUENCE_LEVEL])
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


@POLICY_LOSSES.register(ranges={"eps_low": ">= 0 and <= 1", "eps_high": ">= 0", "log_ratio_clamp": "> 0"},
                        compatibility=[SEQUENCE_LEVEL])
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
                                 "log_ratio_clamp": "> 0"},
                        compatibility=[Expects("is_correction", ("none",),
                                               "algorithm.policy_loss=minirl already weights tokens by π_θ/μ_old "
                                               "(with its own TIS); set algorithm.is_correction.name=none, or use "
                                               "minirl's params (tis_cap, train_infer_is)", error=True)])
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


# ---- the newer losses of 2025–26 (newer-losses.md; algorithms.md §10) ---------------------------------------------
# Their spec is exact arithmetic with no ratio clamp: `log_ratio_clamp=None` keeps it (a number reproduces verl's
# ±20 where verl clamps). Like every loss here, each returns a per-token loss that the configured aggregation
# weighs; the docstrings name the aggregation their papers use (the gmpo and sapo presets set it).

# Past this log-ratio σ(τ(ρ − 1)) is 1 in float64 for any τ > 1e-20, so SAPO's value and gradient are unchanged by
# capping ℓ here; it only keeps exp() finite, so that autograd never multiplies a zero by an infinite ratio.
_SATURATED_LOG_RATIO = 50.0


def _plain_log_ratio(logp_BT, old_logp_BT, clamp):
    """ℓ = logp − old_logp, clamped to ±clamp only when a clamp is given (None: the spec's exact ℓ)."""
    log_ratio_BT = logp_BT - old_logp_BT
    return log_ratio_BT if clamp is None else log_ratio_BT.clamp(-clamp, clamp)


def _valid_log_ratio(logp_BT, old_logp_BT, mask_BT, clamp):
    """`_plain_log_ratio` with ℓ := 0 at masked positions. A masked token may hold any log-ratio (padding, or a token
    a loss mask removed with an extreme ratio); exp() of it could overflow, and autograd's 0 · inf would put a NaN
    in the gradient at that position, where the spec's gradient is 0 (newer-losses.md §0)."""
    return torch.where(mask_BT, _plain_log_ratio(logp_BT, old_logp_BT, clamp), 0.0)


def _sequence_advantage(adv_BT, mask_BT):
    """A_i = mean_t A_it over the valid tokens (the broadcast sequence advantage; 0 for an empty row)."""
    return ops.masked_mean(adv_BT, mask_BT, dim=-1)


@POLICY_LOSSES.register(ranges={"eps_low": ">= 0", "eps_high": ">= 0", "log_ratio_clamp": "> 0"},
                        compatibility=[Expects("aggregation", ("seq_mean_token_mean",),
                                               "gmpo puts its per-sequence loss on every token and is defined with "
                                               "seq_mean_token_mean aggregation (algorithms.md §10.1); {other} "
                                               "weights each sequence by its length")])
def gmpo(logp_BT, old_logp_BT, rollout_logp_BT, adv_BT, mask_BT, *, eps_low=0.4, eps_high=0.4,
         log_ratio_clamp=None):
    """GMPO: maximise the geometric mean of the token ratios of each response, clipped in log space.

        ℓ = logp − old_logp,  ℓ̂ = clamp(ℓ, −eps_low, +eps_high)              (bounds in LOG space: e^±0.4)
        ℓ̃ = min(ℓ, ℓ̂) if A_i > 0 else max(ℓ, ℓ̂)                              (cap increases / decreases only)
        s_i = −A_i · exp((1/n_i) Σ_t m·ℓ̃)      on every valid token of row i (an empty row: 0)

    Each valid token carries its sequence's s_i, so seq_mean_token_mean aggregation gives exactly the spec's
    L = (1/B') Σ_{n_i>0} s_i (the gmpo preset sets it). ∂L/∂logp_it = −A_i·exp(ḡ_i)·live_it/(n_i·B'): every live
    token of a row gets the same gradient; a clipped one gets 0 but still scales the row through exp(ḡ_i). A_i is
    the row's mean advantage (the advantage must be sequence-level). Metrics on the token ratios, with binding
    sets A>0 ∧ ℓ>eps_high and A<0 ∧ ℓ<−eps_low; extra: geo_ratio_mean (exp ḡ_i, token-weighted).
    Refs: GMPO arXiv:2507.20673 (objective, clip (e^−0.4, e^0.4)); verl compute_policy_loss_geo_mean; TRL GMPOTrainer;
    newer-losses.md §1; algorithms.md §10.1.
    """
    log_ratio_BT = _plain_log_ratio(logp_BT, old_logp_BT, log_ratio_clamp)
    adv_B = _sequence_advantage(adv_BT, mask_BT)
    clipped_BT = log_ratio_BT.clamp(-eps_low, eps_high)
    positive_BT = (adv_B > 0)[:, None].expand_as(log_ratio_BT)
    capped_BT = torch.where(positive_BT, torch.minimum(log_ratio_BT, clipped_BT),
                            torch.maximum(log_ratio_BT, clipped_BT))
    geo_log_B = ops.masked_mean(capped_BT, mask_BT, dim=-1)
    geo_ratio_B = torch.exp(geo_log_B)
    loss_BT = _masked((-adv_B * geo_ratio_B)[:, None].expand_as(logp_BT), mask_BT)
    d_BT = log_ratio_BT.detach()
    metrics = _ratio_metrics(torch.exp(d_BT), d_BT, adv_BT, mask_BT, math.exp(-eps_low), math.exp(eps_high))
    metrics["geo_ratio_mean"] = ops.masked_mean(geo_ratio_B.detach()[:, None].expand_as(d_BT), mask_BT)
    return loss_BT, metrics


@POLICY_LOSSES.register(ranges={"tau_pos": "> 0", "tau_neg": "> 0", "log_ratio_clamp": "> 0"})
def sapo(logp_BT, old_logp_BT, rollout_logp_BT, adv_BT, mask_BT, *, tau_pos=1.0, tau_neg=1.05, log_ratio_clamp=None):
    """SAPO: a smooth, temperature-controlled sigmoid gate of the token ratio instead of a hard clip.

        ρ_t = exp(logp_t − old_logp_t),   τ_t = tau_pos if A_t > 0 else tau_neg
        loss_t = −(4/τ_t) · σ(τ_t·(ρ_t − 1)) · A_t                      (no clipping)
        ∂loss_t/∂logp_t = −A_t · 4σ(1−σ) · ρ_t                         (= −A_t on-policy, ρ = 1)

    Aggregate with seq_mean_token_mean (the paper's (1/G) Σ_i (1/|o_i|) Σ_t; the sapo preset sets it). On-policy
    the value is −2A/τ, not −A: only the gradient equals the plain policy gradient. Far from ρ = 1 the weight
    decays like 4e^{−τ|ρ−1|} but never reaches 0. No clamp (the spec; log_ratio_clamp=20 reproduces verl); ℓ is
    capped at 50 only to keep exp finite, where σ is already 1 and the gradient exactly 0.
    Extra metric: gate_weight_mean = mean 4σ(1−σ) (1 on-policy; how much gradient the gate lets through).
    Refs: SAPO arXiv:2511.20347 §3; verl compute_policy_loss_sapo; TRL loss_type="sapo"; newer-losses.md §2;
    algorithms.md §10.2.
    """
    log_ratio_BT = _plain_log_ratio(logp_BT, old_logp_BT, log_ratio_clamp).clamp(max=_SATURATED_LOG_RATIO)
    ratio_BT = torch.exp(log_ratio_BT)
    tau_BT = torch.where(adv_BT > 0, torch.full_like(ratio_BT, tau_pos), torch.full_like(ratio_BT, tau_neg))
    gate_BT = torch.sigmoid(tau_BT * (ratio_BT - 1.0))
    loss_BT = _masked(-(4.0 / tau_BT) * gate_BT * adv_BT, mask_BT)
    d_BT = log_ratio_BT.detach()
    metrics = _ratio_metrics(ratio_BT.detach(), d_BT, adv_BT, mask_BT, None, None)
    g_BT = gate_BT.detach()
    metrics["gate_weight_mean"] = ops.masked_mean(4.0 * g_BT * (1.0 - g_BT), mask_BT)
    return loss_BT, metrics


def _token_covariance(logp_BT, adv_BT, mask_BT):
    """Cov_it = (A_it − Ā)(logp_it − l̄), the means over the valid tokens of the tensors given; all detached."""
    logp_BT = logp_BT.detach()
    adv_mean = ops.masked_mean(adv_BT, mask_BT)
    logp_mean = ops.masked_mean(logp_BT, mask_BT)
    return torch.where(mask_BT, (adv_BT - adv_mean) * (logp_BT - logp_mean), 0.0)


def _selection_count(fraction, mask_BT):
    """max(1, ⌊fraction·N⌋) as a 0-dim tensor, N the valid tokens; ⌊·⌋ taken in float64 (no host sync)."""
    n = mask_BT.sum().to(torch.float64)
    return torch.floor(n * fraction).clamp(min=1)


def _entropy_metrics(entropy_BT, selected_BT, mask_BT, what):
    """Entropy of the selected tokens and of all valid ones, as pooled means (exact across micro-batches)."""
    if entropy_BT is None:
        return {}
    h_BT = entropy_BT.detach()
    return {f"entropy_{what}_mean": ops.pooled_mean(h_BT, selected_BT & mask_BT),
            "entropy_all_mean": ops.pooled_mean(h_BT, mask_BT)}


@POLICY_LOSSES.register(ranges={"clip_cov_ratio": "> 0 and <= 1", "clip_cov_lb": "< clip_cov_ub",
                                 "eps_low": ">= 0 and <= 1", "eps_high": ">= 0", "log_ratio_clamp": "> 0"},
                        inputs=("generator", "selected_BT", "entropy_BT"), compatibility=[TOKEN_LEVEL])
def clip_cov(logp_BT, old_logp_BT, rollout_logp_BT, adv_BT, mask_BT, *, clip_cov_ratio=2e-4, clip_cov_lb=1.0,
             clip_cov_ub=5.0, eps_low=1.0, eps_high=1.0, selection="random", log_ratio_clamp=None, generator=None,
             selected_BT=None, entropy_BT=None):
    """Clip-Cov: detach a few random tokens whose log-prob/advantage covariance is high (entropy control).

        Cov_t = (A_t − Ā)(sg(logp_t) − l̄)          Ā, l̄: means over the valid tokens of the tensors passed
        p1 = −A·ρ,  p2 = −A·clip(ρ, 1−eps_low, 1+eps_high),  c_t = 1[p2 > p1]            (PPO-clipped)
        C = {valid t: c_t = 0 ∧ clip_cov_lb < Cov_t < clip_cov_ub}
        S ⊆ C uniformly at random, |S| = min(max(1, ⌊clip_cov_ratio·N⌋), |C|)
        loss_t = (1 − 1[t ∈ S]) · max(p1, p2)       (a detached token adds 0 to the value, and stays in N)

    Aggregate with token_mean (the paper's token-level loss). The selection reads the current policy's log-probs
    (detached) and the advantages of the micro-batch it is given: the covariance that drives the entropy change
    is that of the policy being updated (the paper; verl computes it on the micro-batch passed to the loss).
    `generator` (supplied by the objective, seeded from the run) draws S; `selected_BT` overrides S (tests).
    selection="top" takes the n largest Cov instead (ties: lower index first): deterministic, not the paper's.
    The default eps 1/1 (clip range [0, 2]) is the authors' recipe; 0.2 gives verl's default PPO clip.
    Extra metrics: cov_candidate_frac (|C|/N), cov_detached_frac (|S|/N); with entropy_BT (supplied by the
    objective), entropy_detached_mean and entropy_all_mean. Token map: cov_detached_BT.
    Refs: Entropy Mechanism arXiv:2505.22617 (Clip-Cov; r = 2e-4, ω = [1, 5]); verl compute_policy_loss_clip_cov;
    newer-losses.md §5; algorithms.md §10.5.
    """
    if selection not in ("random", "top"):
        raise ValueError(f"clip_cov: selection must be 'random' or 'top', got {selection!r}")
    log_ratio_BT = _valid_log_ratio(logp_BT, old_logp_BT, mask_BT, log_ratio_clamp)
    ratio_BT = torch.exp(log_ratio_BT)
    unclipped_BT = -adv_BT * ratio_BT
    clipped_BT = -adv_BT * ratio_BT.clamp(1.0 - eps_low, 1.0 + eps_high)
    cov_BT = _token_covariance(logp_BT, adv_BT, mask_BT)
    ppo_clipped_BT = (clipped_BT > unclipped_BT).detach()
    candidate_BT = mask_BT & ~ppo_clipped_BT & (cov_BT > clip_cov_lb) & (cov_BT < clip_cov_ub)
    if selected_BT is not None:
        detached_BT = selected_BT.bool() & mask_BT
    else:
        if selection == "random":
            keys_BT = torch.rand(cov_BT.shape, generator=generator, device=cov_BT.device, dtype=torch.float64)
        else:
            keys_BT = cov_BT
        detached_BT = candidate_BT & (ops.descending_rank(keys_BT, candidate_BT) < _selection_count(clip_cov_ratio,
                                                                                                     mask_BT))
    loss_BT = torch.where(detached_BT, 0.0, torch.maximum(unclipped_BT, clipped_BT))
    metrics = _ratio_metrics(ratio_BT.detach(), log_ratio_BT, adv_BT, mask_BT, 1.0 - eps_low, 1.0 + eps_high)
    metrics.update(cov_candidate_frac=ops.masked_mean(candidate_BT.float(), mask_BT),
                   cov_detached_frac=ops.masked_mean(detached_BT.float(), mask_BT),
                   cov_detached_BT=detached_BT, **_entropy_metrics(entropy_BT, detached_BT, mask_BT, "detached"))
    return _masked(loss_BT, mask_BT), metrics


@POLICY_LOSSES.register(ranges={"kl_cov_ratio": "> 0 and <= 1", "ppo_kl_coef": ">= 0", "log_ratio_clamp": "> 0"},
                        inputs=("entropy_BT",), compatibility=[
                            TOKEN_LEVEL,
                            UnderSettings({"trainer.minibatches": 1, "trainer.epochs": 1,
                                           "algorithm.bypass_mode": False},
                                          "kl_cov's |log ρ| penalty has zero gradient while ρ = 1, and with "
                                          "trainer.minibatches=1 every update is on-policy: the run is the plain "
                                          "policy gradient (algorithms.md §10.6); set trainer.minibatches > 1, as "
                                          "the paper's recipes do")])
def kl_cov(logp_BT, old_logp_BT, rollout_logp_BT, adv_BT, mask_BT, *, kl_cov_ratio=2e-4, ppo_kl_coef=1.0,
           log_ratio_clamp=None, entropy_BT=None):
    """KL-Cov: a |log ρ| penalty toward π_old on the tokens of highest log-prob/advantage covariance.

        Cov_t as in clip_cov (current log-probs, detached; means over the valid tokens of the tensors passed)
        S = the k = max(1, ⌊kl_cov_ratio·N⌋) valid tokens of largest Cov (ties: lower row-major index first)
        loss_t = −A_t·ρ_t + ppo_kl_coef · |logp_t − old_logp_t| · 1[t ∈ S]          (no ratio clipping at all)

    Aggregate with token_mean. ∂/∂logp of the penalty is ppo_kl_coef·sign(ℓ) (0 at ℓ = 0), so on the first,
    on-policy mini-batch (ρ ≡ 1) the gradient is the plain policy gradient: the penalty acts on later mini-batches.
    |log ρ| (absolute k1) is the codes' proxy for the paper's D_KL(π_old‖π_θ). κ is a fraction (the authors'
    repo takes percent); the paper uses 2e-3 at 7B, 2e-4 at 32B; verl's config defaults ppo_kl_coef to 0.1.
    Extra metrics: cov_penalised_frac (|S|/N), kl_penalty_mean (|ℓ| over S, pooled); with entropy_BT,
    entropy_penalised_mean and entropy_all_mean. Token map: cov_penalised_BT.
    Refs: Entropy Mechanism arXiv:2505.22617 (KL-Cov; k = 2e-3 / 2e-4, β = 1); verl compute_policy_loss_kl_cov;
    newer-losses.md §6; algorithms.md §10.6.
    """
    log_ratio_BT = _valid_log_ratio(logp_BT, old_logp_BT, mask_BT, log_ratio_clamp)
    ratio_BT = torch.exp(log_ratio_BT)
    cov_BT = _token_covariance(logp_BT, adv_BT, mask_BT)
    penalised_BT = mask_BT & (ops.descending_rank(cov_BT, mask_BT) < _selection_count(kl_cov_ratio, mask_BT))
    penalty_BT = torch.where(penalised_BT, log_ratio_BT.abs(), 0.0)
    loss_BT = -adv_BT * ratio_BT + ppo_kl_coef * penalty_BT
    metrics = _ratio_metrics(ratio_BT.detach(), log_ratio_BT, adv_BT, mask_BT, None, None)
    metrics.update(cov_penalised_frac=ops.masked_mean(penalised_BT.float(), mask_BT),
                   kl_penalty_mean=ops.pooled_mean(penalty_BT.detach(), penalised_BT),
                   cov_penalised_BT=penalised_BT, **_entropy_metrics(entropy_BT, penalised_BT, mask_BT, "penalised"))
    return _masked(loss_BT, mask_BT), metrics
