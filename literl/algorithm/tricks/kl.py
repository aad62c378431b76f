"""KL estimators: `(logp_BT, ref_logp_BT, *, ...) -> kl_BT`, per token and unreduced.

With δ = logp − ref_logp on tokens sampled from π (Schulman's "Approximating KL divergence" note):
    k1 = δ                      unbiased for KL(π‖π_ref), ∇ = ∇logπ (0 in expectation)
    k2 = ½δ²                    biased, low variance; ∇ = δ·∇logπ, the gradient of the reverse KL
    k3 = e^(−δ) − 1 + δ         unbiased and ≥ 0 ("low_var_kl"); ∇ in expectation = ∇ KL(π_ref‖π)
The `_st` variants are straight-through: the value of k1/k3, the gradient of k2 (verl "k1+"/"k3+").
The coefficient β lives in the objective, not here. Values off the mask are not zeroed: aggregation
weights are 0 there.

Registered: k1, k2, k3, k1_st, k3_st.
"""

from __future__ import annotations

import torch

from literl.algorithm.tricks import KL_ESTIMATORS


@KL_ESTIMATORS.register
def k1(logp_BT, ref_logp_BT):
    """k1 estimator, the log-ratio itself.

        k1_t = logp_t − ref_logp_t

    Unclamped, as in verl.
    Refs: Schulman 2020 "Approximating KL divergence"; algorithms.md §5.
    """
    return logp_BT - ref_logp_BT


@KL_ESTIMATORS.register
def k2(logp_BT, ref_logp_BT):
    """k2 estimator, half the squared log-ratio.

        k2_t = ½·(logp_t − ref_logp_t)²

    Unclamped, as in verl.
    Refs: Schulman 2020 "Approximating KL divergence"; algorithms.md §5.
    """
    return 0.5 * (logp_BT - ref_logp_BT) ** 2


@KL_ESTIMATORS.register(ranges={"log_ratio_clamp": "> 0", "clamp": "> 0"})
def k3(logp_BT, ref_logp_BT, *, log_ratio_clamp=20.0, clamp=10.0):
    """k3 estimator ("low_var_kl"), non-negative and unbiased.

        x_t = clamp(ref_logp_t − logp_t, ±log_ratio_clamp),   k3_t = clamp(e^x − 1 − x, ±clamp)

    Both clamps as in verl: the first keeps exp finite, the second bounds one token's penalty.
    Refs: Schulman 2020 "Approximating KL divergence"; GRPO arXiv:2402.03300 Eq. 4; algorithms.md §5.
    """
    x_BT = (ref_logp_BT - logp_BT).clamp(-log_ratio_clamp, log_ratio_clamp)
    return (torch.expm1(x_BT) - x_BT).clamp(-clamp, clamp)


def _straight_through(value_BT, logp_BT, ref_logp_BT):
    grad_BT = k2(logp_BT, ref_logp_BT)
    return value_BT.detach() + (grad_BT - grad_BT.detach())


@KL_ESTIMATORS.register
def k1_st(logp_BT, ref_logp_BT):
    """k1 value with the k2 gradient (straight-through).

        k1_st_t = sg(k1_t) + k2_t − sg(k2_t)        ∇ = (logp − ref_logp)·∇logp

    Refs: verl core_algos.kl_penalty "k1+"; algorithms.md §5.
    """
    return _straight_through(k1(logp_BT, ref_logp_BT), logp_BT, ref_logp_BT)


@KL_ESTIMATORS.register(ranges={"log_ratio_clamp": "> 0", "clamp": "> 0"})
def k3_st(logp_BT, ref_logp_BT, *, log_ratio_clamp=20.0, clamp=10.0):
    """k3 value (with k3's clamps) with the k2 gradient (straight-through).

        k3_st_t = sg(k3_t) + k2_t − sg(k2_t)        ∇ = (logp − ref_logp)·∇logp

    Refs: verl core_algos.kl_penalty "k3+"; algorithms.md §5.
    """
    value_BT = k3(logp_BT, ref_logp_BT, log_ratio_clamp=log_ratio_clamp, clamp=clamp)
    return _straight_through(value_BT, logp_BT, ref_logp_BT)
