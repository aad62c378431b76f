"""Importance-weight diagnostics: π_θ/μ_old = [π_old/μ_old] (training–inference) × [π_θ/π_old] (staleness).

In log space, per token (algorithms.md §7, MiniRL arXiv:2512.01374 Eq. 5–6):

    d_ti  = old_logp − rollout_logp      training–inference discrepancy
    d_st  = logp − old_logp              policy staleness (0 on the first on-policy mini-batch)
    d_tot = logp − rollout_logp = d_ti + d_st

For each part p ∈ {ti, st, tot}, over the masked tokens (w = e^d; exps take d clamped to ±20):
    p/kl_k1             mean(−d)                      k1 estimate of KL(sampler ‖ target) (ti: KL(μ‖π_old))
    p/kl_k3             mean(e^d − 1 − d)             lower-variance estimate of the same KL
    p/abs_logdiff_mean  mean|d|,   p/abs_logdiff_max  max|d|
    p/chi2_token        mean(e^(2d)) − 1              χ² (IS variance) per token
    p/chi2_seq          mean_i(e^(2 Σ_t d)) − 1       the same for sequence (product) weights
    p/log_ppl_diff      mean_i(−mean_t d)             ti: mean_t rollout_logp − mean_t old_logp (verl log_ppl_diff)
    p/ess               1/mean(ŵ²), ŵ = w/mean(w)
    p/ratio_mean, p/ratio_min, p/ratio_max  of w
    st/ppo_kl           = st/kl_k1 = mean(old_logp − logp)
    share/ti, share/st  Σ|d_ti| / (Σ|d_ti| + Σ|d_st|) and its complement: which factor carries the total
                        absolute log-weight (0 and 0 when both are exactly 0)
Means over tokens unless the key says sequences (empty sequences are skipped).

Per staleness (asynchronous runs, `rollout.max_staleness = k >= 1`: `staleness_BT` = the step minus the policy
version that sampled each token). There μ is the engine at an older version, so d_ti holds the version gap as well
as the numerical one; for each j in 0..k, over the tokens j versions old:
    stale/j/ti_kl_k1, stale/j/ti_kl_k3, stale/j/ti_abs_logdiff_max     d_ti's statistics
    stale/j/st_kl_k1, stale/j/tot_kl_k3                                 the staleness factor's and the total's
(null in metrics.jsonl at a step without such tokens). Staleness 0 is the engine's numerical gap alone; the growth
with j is what the policy's movement over j versions adds.

The mask is the response mask, not the loss mask, and the sequence statistics count sequences, so the
micro-batch's loss-token count is the wrong weight to combine them with. Means and shares therefore come back
as `ops.Ratio` (Σ, count) and the ESS as `ops.SampleSize` (Σw, Σw², n): the metric accumulator adds them up
and divides once, so a step's value is the statistic of its whole batch whatever the micro-batch split
(`float()` gives one call's value). Maxima and minima are 0-dim tensors, ∓inf when the mask is empty.
"""

from __future__ import annotations

import torch

from literl.algorithm import ops

LOG_CLAMP = 20.0  # keeps e^(2d) finite in fp32 (e^40 ≈ 2e17)


def _kl_stats(d_BT, mask_BT):
    d = torch.where(mask_BT, d_BT.float(), 0.0)
    dc = d.clamp(-LOG_CLAMP, LOG_CLAMP)
    return {
        "kl_k1": ops.pooled_mean(-d, mask_BT),
        "kl_k3": ops.pooled_mean(torch.expm1(dc) - dc, mask_BT),
        "abs_logdiff_mean": ops.pooled_mean(d.abs(), mask_BT),
        "abs_logdiff_max": ops.masked_max(d.abs(), mask_BT),
    }


def _log_weight_stats(d_BT, mask_BT):
    d = torch.where(mask_BT, d_BT.float(), 0.0)
    dc = d.clamp(-LOG_CLAMP, LOG_CLAMP)
    w = torch.exp(dc)
    seq_valid_B = mask_BT.any(-1)
    seq_d_B = d.sum(-1).clamp(-LOG_CLAMP, LOG_CLAMP)
    stats = _kl_stats(d_BT, mask_BT)
    stats.update({
        "chi2_token": ops.pooled_mean(torch.expm1(2 * dc), mask_BT),
        "chi2_seq": ops.pooled_mean(torch.expm1(2 * seq_d_B), seq_valid_B),
        "log_ppl_diff": ops.pooled_mean(-ops.masked_mean(d, mask_BT, dim=-1), seq_valid_B),
        "ess": ops.pooled_ess(w, mask_BT),
        "ratio_mean": ops.pooled_mean(w, mask_BT),
        "ratio_min": ops.masked_min(w, mask_BT),
        "ratio_max": ops.masked_max(w, mask_BT),
    })
    return stats


@torch.no_grad()
def is_decomposition(logp_BT, old_logp_BT, rollout_logp_BT, mask_BT, staleness_BT=None, max_staleness: int = 0
                     ) -> dict:
    """Statistics of the training–inference, staleness and total log-weights (see the module docstring), and with
    `staleness_BT` the same per staleness 0..max_staleness.

        d_ti = old_logp − rollout_logp,  d_st = logp − old_logp,  d_tot = d_ti + d_st

    Refs: MiniRL arXiv:2512.01374 Eq. 5–6; verl rollout_corr metrics; algorithms.md §7.
    """
    d_ti = old_logp_BT.float() - rollout_logp_BT.float()
    d_st = logp_BT.float() - old_logp_BT.float()
    out = {}
    for part, d in (("ti", d_ti), ("st", d_st), ("tot", d_ti + d_st)):
        out.update({f"{part}/{k}": v for k, v in _log_weight_stats(d, mask_BT).items()})
    out["st/ppo_kl"] = out["st/kl_k1"]
    abs_ti, abs_st = ops.masked_sum(d_ti.abs(), mask_BT), ops.masked_sum(d_st.abs(), mask_BT)
    out["share/ti"] = ops.Ratio(abs_ti, abs_ti + abs_st)
    out["share/st"] = ops.Ratio(abs_st, abs_ti + abs_st)
    if staleness_BT is not None:
        out.update(_by_staleness(d_ti, d_st, mask_BT, staleness_BT.to(mask_BT.device), max_staleness))
    return out


def _by_staleness(d_ti, d_st, mask_BT, staleness_BT, max_staleness: int) -> dict:
    """The per-staleness statistics: a fixed set of keys (0..k, no host sync), NaN where a bin has no token."""
    out = {}
    for j in range(max_staleness + 1):
        bin_BT = mask_BT & (staleness_BT == j)
        ti, st = _kl_stats(d_ti, bin_BT), _kl_stats(d_st, bin_BT)
        tot = _kl_stats(d_ti + d_st, bin_BT)
        for key, stat in (("ti_kl_k1", ti["kl_k1"]), ("ti_kl_k3", ti["kl_k3"]), ("st_kl_k1", st["kl_k1"]),
                          ("tot_kl_k3", tot["kl_k3"])):
            out[f"stale/{j}/{key}"] = ops.Ratio(stat.num, stat.den, empty=float("nan"))
        out[f"stale/{j}/ti_abs_logdiff_max"] = ti["abs_logdiff_max"]
    return out
