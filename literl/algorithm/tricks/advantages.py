"""Advantage estimators: `(rewards_B, group_B, mask_BT, token_rewards_BT, *, ...) -> adv_BT`.

Outcome estimators see R_i = r_i + Σ_t m_it·token_rewards_it (token_rewards carries e.g. −β·KL when the KL
is a reward penalty; zeros otherwise), produce one scalar per sequence and broadcast it over the sequence's
loss-mask tokens. Output is float32 and 0 wherever `mask_BT` is False. No gradient flows (rewards have none).

Shared rules (algorithms.md §1):
- Groups are explicit ids (`group_B`, any integers), never positions.
- A NaN reward means "not scorable": that sequence gets A = 0 and is left out of every statistic.
- Every estimator is the one core `_normalize`: where the mean is taken × where the std is taken (ROLL's
  `norm_mean_type` × `norm_std_type` decomposition). Statistics are computed on values shifted by the
  scope's minimum, so an all-equal scope centres to exactly 0 and its advantage is exactly 0 (never the
  rounding noise of a mean divided by a tiny std). A zero denominator (std 0 with eps = 0) also gives 0, never
  NaN (algorithms.md §1.1, §1.4).
- A group with a single valid member has no baseline: A = 0, with a warning (not verl's A = r fallback).

Registered: grpo, dr_grpo, batch_norm, lite_ppo, rloo, reinforce_pp, reinforce_pp_baseline.
"""

from __future__ import annotations

import warnings

import torch

from literl.algorithm import ops
from literl.algorithm.tricks import ADVANTAGES


def _outcome(rewards_B, mask_BT, token_rewards_BT):
    """(R_B, valid_B): R_i = r_i + Σ_t m·token_rewards, valid = reward is not NaN (R := 0 where invalid)."""
    valid_B = ~torch.isnan(rewards_B)
    extra_B = ops.masked_sum(token_rewards_BT.float(), mask_BT, dim=-1)
    R_B = torch.where(valid_B, rewards_B.float() + extra_B, torch.zeros_like(extra_B))
    return R_B, valid_B


def _broadcast(adv_B, valid_B, mask_BT):
    keep_BT = mask_BT & valid_B[:, None]
    return torch.where(keep_BT, adv_B[:, None].float(), 0.0)


def _warn_singletons(count_B, valid_B):
    if bool(((count_B == 1) & valid_B).any()):
        warnings.warn("advantages: a group has a single valid member, so it has no baseline; its advantage "
                      "is set to 0 (algorithms.md §1.1)")


def _group_centre(R_B, group_B, valid_B):
    """(R − mean_g(R), valid group size); centring values shifted by the group min makes equal groups exact 0."""
    ref_B, _ = ops.group_min_max(R_B, group_B, valid_B)
    mean_B, _, count_B = ops.group_mean_std(R_B - ref_B, group_B, valid_B)
    _warn_singletons(count_B, valid_B)
    return (R_B - ref_B) - mean_B, count_B


def _batch_centre(R_B, valid_B, weights_B):
    x_B = R_B - ops.masked_min(R_B, valid_B, empty=0.0)
    mean, _ = ops.batch_mean_std(x_B, valid_B, weights=weights_B)
    return x_B - mean


def _std(scope, R_B, group_B, valid_B, centred_B, *, unbiased, weights_B):
    """Std of the scope. "group": each group's own std; "batch": std of the raw R over the batch (weighted
    by weights_B if given); "pooled": sqrt(Σ (R − mean_g)² / (N − 1)), the within-group spread (AReaL)."""
    if scope == "group":
        return ops.group_mean_std(centred_B, group_B, valid_B, unbiased=unbiased)[1]
    if scope == "pooled":
        n = valid_B.sum() - (1 if unbiased else 0)
        # float64: squares of rewards near 1e19 overflow float32 (see ops.group_mean_std)
        return (ops.masked_sum(centred_B.double() ** 2, valid_B) / n.clamp(min=1)).sqrt().to(centred_B.dtype)
    return ops.batch_mean_std(R_B, valid_B, unbiased=unbiased, weights=weights_B)[1]


def _safe_divide(centred, scale):
    """centred / scale, and 0 where scale is 0: a scope without spread has A = 0 even with eps = 0 (§1.1)."""
    nonzero = scale > 0
    safe = torch.where(nonzero, scale, torch.ones_like(scale))   # keeps 0/0 out of the branch not taken
    return torch.where(nonzero, centred / safe, torch.zeros_like(centred))


def _normalize(R_B, group_B, valid_B, *, mean_scope, std_scope, unbiased=True, eps=0.0, weights_B=None):
    """A = (R − mean_scope(R)) / (std_scope(R) + eps), 0 for invalid sequences; std_scope None: no division.

    mean_scope: "group" | "batch" (weighted by weights_B if given).  std_scope: see `_std`.
    A zero denominator (std 0, eps 0) gives A = 0: its centred values are 0 as well (algorithms.md §1.1, §1.4).
    """
    if mean_scope == "group":
        centred_B, _ = _group_centre(R_B, group_B, valid_B)
    else:
        centred_B = _batch_centre(R_B, valid_B, weights_B)
    adv_B = centred_B
    if std_scope is not None:
        std = _std(std_scope, R_B, group_B, valid_B, centred_B, unbiased=unbiased, weights_B=weights_B)
        adv_B = _safe_divide(centred_B, std + eps)
    return torch.where(valid_B, adv_B, torch.zeros_like(adv_B))


def _stats_valid(valid_B, mask_BT, exclude_masked):
    return valid_B & mask_BT.any(-1) if exclude_masked else valid_B


@ADVANTAGES.register(ranges={"eps": ">= 0"})
def grpo(rewards_B, group_B, mask_BT, token_rewards_BT, *, eps=1e-6, unbiased=True, stats_exclude_masked=False):
    """GRPO group normalisation: centre and scale by the group's own statistics.

        A_i = (R_i − mean_g(R)) / (std_g(R) + eps)      std unbiased (N−1) unless unbiased=False

    Group of one → 0 (warned); all-equal group → 0. Empty responses and overlong-masked sequences stay in
    the statistics unless stats_exclude_masked=True (then an all-False mask row is left out).
    Refs: DeepSeekMath arXiv:2402.03300 §4.1.2; algorithms.md §1.1.
    """
    R_B, valid_B = _outcome(rewards_B, mask_BT, token_rewards_BT)
    valid_B = _stats_valid(valid_B, mask_BT, stats_exclude_masked)
    adv_B = _normalize(R_B, group_B, valid_B, mean_scope="group", std_scope="group", unbiased=unbiased, eps=eps)
    return _broadcast(adv_B, valid_B, mask_BT)


@ADVANTAGES.register
def dr_grpo(rewards_B, group_B, mask_BT, token_rewards_BT, *, stats_exclude_masked=False):
    """Dr.GRPO: group mean baseline, no std division (pair it with seq_mean_token_sum_norm).

        A_i = R_i − mean_g(R)

    Group of one → 0 (warned). Not invariant to reward scale: r → 2r − 1 doubles A.
    Refs: Dr.GRPO arXiv:2503.20783 (oat `compute_monte_carlo_advantages`, critic_type=drgrpo); algorithms.md §1.3.
    """
    R_B, valid_B = _outcome(rewards_B, mask_BT, token_rewards_BT)
    valid_B = _stats_valid(valid_B, mask_BT, stats_exclude_masked)
    adv_B = _normalize(R_B, group_B, valid_B, mean_scope="group", std_scope=None)
    return _broadcast(adv_B, valid_B, mask_BT)


@ADVANTAGES.register(ranges={"eps": ">= 0"})
def batch_norm(rewards_B, group_B, mask_BT, token_rewards_BT, *, weighting="sequence", unbiased=True, eps=1e-6):
    """Batch normalisation: centre and scale by statistics of the whole rollout batch (groups ignored).

        A_i = (R_i − mean_B(R)) / (std_B(R) + eps)
        weighting="sequence": every sequence counts once (ROLL, TRL)
        weighting="token":    sequence i counts |y_i| times (verl/OpenRLHF REINFORCE++ style)

    Constant batch → 0. With token weighting, empty responses weigh nothing.
    Refs: REINFORCE++ arXiv:2501.03262; algorithms.md §1.2.
    """
    if weighting not in ("sequence", "token"):
        raise ValueError(f"batch_norm: weighting must be 'sequence' or 'token', got {weighting!r}")
    R_B, valid_B = _outcome(rewards_B, mask_BT, token_rewards_BT)
    weights_B = mask_BT.sum(-1).float() if weighting == "token" else None
    adv_B = _normalize(R_B, group_B, valid_B, mean_scope="batch", std_scope="batch", unbiased=unbiased, eps=eps,
                       weights_B=weights_B)
    return _broadcast(adv_B, valid_B, mask_BT)


@ADVANTAGES.register(ranges={"eps": ">= 0"})
def lite_ppo(rewards_B, group_B, mask_BT, token_rewards_BT, *, std_of="raw", unbiased=True, eps=1e-6):
    """LitePPO mixed normalisation: group mean, batch std.

        A_i = (R_i − mean_g(R)) / (σ + eps)
        std_of="raw":      σ = std_B(R), the raw rewards of the whole batch (paper Eq. 5–6, ROLL, TRL)
        std_of="centered": σ = sqrt(Σ_i (R_i − mean_g(R))² / (N−1)), pooled within-group std (AReaL)

    Σ(R − R̄)² = within + between, so "centered" ≤ "raw" and its advantages are larger. Group of one → 0.
    Refs: LitePPO arXiv:2508.08221 v3 §4.1 Eq. 5–6, Takeaway 3; algorithms.md §1.4.
    """
    if std_of not in ("raw", "centered"):
        raise ValueError(f"lite_ppo: std_of must be 'raw' or 'centered', got {std_of!r}")
    R_B, valid_B = _outcome(rewards_B, mask_BT, token_rewards_BT)
    std_scope = "batch" if std_of == "raw" else "pooled"
    adv_B = _normalize(R_B, group_B, valid_B, mean_scope="group", std_scope=std_scope, unbiased=unbiased, eps=eps)
    return _broadcast(adv_B, valid_B, mask_BT)


@ADVANTAGES.register
def rloo(rewards_B, group_B, mask_BT, token_rewards_BT):
    """REINFORCE leave-one-out: the baseline is the mean of the other members of the group.

        A_i = R_i − (1/(G−1)) Σ_{j≠i} R_j = (G/(G−1))·(R_i − mean_g(R))      G = valid members of the group

    Group of one → 0 (warned; verl's loop version returns r, its vectorised one 0).
    Refs: Ahmadian et al. arXiv:2402.14740; algorithms.md §1.5.
    """
    R_B, valid_B = _outcome(rewards_B, mask_BT, token_rewards_BT)
    centred_B, count_B = _group_centre(R_B, group_B, valid_B)
    scale_B = torch.where(count_B > 1, count_B / (count_B - 1).clamp(min=1), torch.zeros_like(count_B))
    adv_B = torch.where(valid_B, centred_B * scale_B, torch.zeros_like(centred_B))
    return _broadcast(adv_B, valid_B, mask_BT)


def _discounted_returns(rewards_BT, mask_BT, gamma):
    """G_t = Σ_{s ≥ t, s in mask} γ^(#mask tokens from t to s) r_s; masked positions are skipped, not reset."""
    if gamma == 1.0:
        masked = torch.where(mask_BT, rewards_BT, torch.zeros_like(rewards_BT))
        return masked.flip(-1).cumsum(-1).flip(-1)
    running_B = torch.zeros_like(rewards_BT[:, 0])
    returns_BT = torch.zeros_like(rewards_BT)
    for t in range(rewards_BT.shape[-1] - 1, -1, -1):
        running_B = torch.where(mask_BT[:, t], rewards_BT[:, t] + gamma * running_B, running_B)
        returns_BT[:, t] = running_B
    return returns_BT


def _whiten_tokens(x_BT, valid_BT, eps):
    """Token-weighted whitening (x − mean)·rsqrt(var + eps), unbiased var over the valid tokens (verl);
    0 where var + eps = 0 (constant returns with eps = 0), never NaN."""
    ref = ops.masked_min(x_BT, valid_BT, empty=0.0)
    mean, std = ops.batch_mean_std(x_BT - ref, valid_BT, unbiased=True)
    out = _safe_divide(x_BT - ref - mean, (std.double() ** 2 + eps).sqrt().to(std.dtype))   # std² in float64
    return torch.where(valid_BT, out, torch.zeros_like(out)).float()


@ADVANTAGES.register(ranges={"gamma": ">= 0 and <= 1", "eps": ">= 0"})
def reinforce_pp(rewards_B, group_B, mask_BT, token_rewards_BT, *, gamma=1.0, eps=1e-8):
    """REINFORCE++: per-token rewards, discounted returns, then token-weighted batch whitening (no groups).

        r_t = token_rewards_t + 1[t = last valid token]·r_i
        G_t = Σ_{s≥t} γ^(s−t) r_s        (s over loss-mask tokens; 0 after EOS)
        A_t = (G_t − mean_tok(G)) / sqrt(var_tok(G) + eps)

    Masked positions inside a row are skipped (carry the return), so a rejected token never cuts the outcome
    reward off from the tokens before it. Empty response: nothing to place the reward on, A = 0.
    Refs: REINFORCE++ arXiv:2501.03262 (verl compute_reinforce_plus_plus_outcome_advantage); algorithms.md §1.6.
    """
    valid_B = ~torch.isnan(rewards_B)
    valid_BT = mask_BT & valid_B[:, None]
    last_B = ops.last_token_index(mask_BT)
    outcome_B = torch.where(valid_B, rewards_B.float(), torch.zeros_like(rewards_B, dtype=torch.float32))
    place_BT = torch.zeros_like(valid_BT).scatter_(1, last_B[:, None], True) & valid_BT
    token_r_BT = torch.where(valid_BT, token_rewards_BT.float(), 0.0)
    token_r_BT = token_r_BT + place_BT * outcome_B[:, None]
    return _whiten_tokens(_discounted_returns(token_r_BT, valid_BT, gamma), valid_BT, eps)


@ADVANTAGES.register(ranges={"eps": ">= 0"})
def reinforce_pp_baseline(rewards_B, group_B, mask_BT, token_rewards_BT, *, eps=1e-8):
    """REINFORCE++-baseline: group-mean centring, broadcast to tokens, then token-weighted batch whitening.

        A_t = w(R_i − mean_g(R)),   w(x) = (x − mean_tok(x)) / sqrt(var_tok(x) + eps)

    The token-weighted re-centring means a group's advantages no longer sum to 0 (as in verl/OpenRLHF).
    Group of one: centred value 0 (warned) before whitening.
    Refs: REINFORCE++ arXiv:2501.03262 (verl compute_reinforce_plus_plus_baseline_outcome_advantage);
    algorithms.md §1.6.
    """
    R_B, valid_B = _outcome(rewards_B, mask_BT, token_rewards_BT)
    centred_B = _normalize(R_B, group_B, valid_B, mean_scope="group", std_scope=None)
    return _whiten_tokens(_broadcast(centred_B, valid_B, mask_BT), mask_BT & valid_B[:, None], eps)
