"""Policy masks: `(logp_BT, old_logp_BT, rollout_logp_BT, adv_BT, mask_BT, entropy_BT, *, ...) -> (gate_BT, metrics)`.

A policy mask decides, from the *current* policy on the micro-batch it is given, which tokens' policy loss counts.
Its `gate_BT` (detached, 0 off `mask_BT`) multiplies the policy-loss term only — not a KL loss term, not the
entropy bonus — and leaves every aggregation denominator as it is: a masked token or sequence stays in N, n_i and
B', as in the papers, TRL and slime. That is what sets these apart from `loss_masks`, which are fixed per rollout
batch and remove tokens from the denominators. The objective multiplies the gates of every configured entry
(`algorithm.policy_masks: {opsm: {delta: 0.5}}`) and composes them with any policy loss.

Inputs: `logp_BT` is the current policy's log-prob (read detached: a mask has no gradient), `entropy_BT` its
entropy at the sampling temperature (detached; None when the forward computed none), `rollout_logp_BT` what the
inference engine reported, `mask_BT` the loss mask of the tokens passed (one micro-batch). Metrics follow the
policy losses' conventions (plain values are token-weighted, `ops.Ratio` values pool exactly).

Registered: opsm, high_entropy.
"""

from __future__ import annotations

import torch

from literl.algorithm import ops
from literl.algorithm.tricks import POLICY_MASKS


@POLICY_MASKS.register(ranges={"delta": ">= 0"})
def opsm(logp_BT, old_logp_BT, rollout_logp_BT, adv_BT, mask_BT, entropy_BT, *, delta, source="rollout"):
    """OPSM (DeepSeek-V3.2): drop a negative-advantage response that has drifted too far off the sampling policy.

        D_i = (1/n_i) Σ_t m·(log μ_it − sg(logp_it))         mean log(μ/π_θ) over the valid tokens (empty row: 0)
        M_i = 0 if (A_i < 0 ∧ D_i > delta) else 1             (strict: A = 0 and D = δ are kept)
        gate_it = M_i · m_it                                   (masked rows stay in n_i and B')

    μ is the rollout engine's log-prob (the paper's "sampling probability returned by the inference framework",
    TRL), so D covers both policy drift and training–inference mismatch; source="old" uses the trainer's
    recompute π_old instead (slime's default), and so does a batch without rollout log-probs. D reads the current
    policy, so it is recomputed at every update. A_i is the row's mean advantage. delta has no default: the paper
    gives none, TRL suggests 0.5, slime defaults to 1e-4. With the default grpo surrogate (PPO clip 0.2,
    seq_mean_token_mean) this is the spec's loss exactly.
    Metrics: masked_seq_frac (of the non-empty rows, pooled), masked_token_frac, seq_log_ratio_mean (D over the
    non-empty rows, pooled), seq_log_ratio_max.
    Refs: DeepSeek-V3.2 arXiv:2512.02556 §3.1; TRL off_policy_mask_threshold (get_off_policy_mask); slime --use-opsm;
    newer-losses.md §3; algorithms.md §10.3.
    """
    if source not in ("rollout", "old"):
        raise ValueError(f"opsm: source must be 'rollout' (the engine's μ) or 'old' (π_old), got {source!r}")
    behaviour_BT = rollout_logp_BT if source == "rollout" and rollout_logp_BT is not None else old_logp_BT
    # where(), not a product: a padded position may hold garbage (even inf) in either log-prob
    drift_B = ops.masked_mean(torch.where(mask_BT, behaviour_BT - logp_BT.detach(), 0.0), mask_BT, dim=-1)
    adv_B = ops.masked_mean(adv_BT, mask_BT, dim=-1)
    masked_B = (adv_B < 0) & (drift_B > delta)
    gate_BT = (mask_BT & ~masked_B[:, None]).to(logp_BT.dtype)
    rows_B = mask_BT.any(-1)
    metrics = {
        "masked_seq_frac": ops.pooled_mean(masked_B.float(), rows_B),
        "masked_token_frac": ops.masked_mean(masked_B[:, None].expand_as(mask_BT).float(), mask_BT),
        "seq_log_ratio_mean": ops.pooled_mean(drift_B, rows_B),
        "seq_log_ratio_max": ops.masked_max(drift_B, rows_B),
    }
    return gate_BT, metrics


@POLICY_MASKS.register(ranges={"top_ratio": "> 0 and <= 1"})
def high_entropy(logp_BT, old_logp_BT, rollout_logp_BT, adv_BT, mask_BT, entropy_BT, *, top_ratio=0.2,
                 normalize="all"):
    """The 80/20 rule: train only on the top_ratio highest-entropy tokens ("forking tokens") of the batch passed.

        k = max(1, ⌊top_ratio·N + 0.9999⌋)                 N valid tokens (the authors' ceil, float noise absorbed)
        τ = the k-th largest H over the valid tokens          (padding excluded)
        e_t = m_t · 1[H_t ≥ τ]                               (ties at τ all kept: possibly more than k tokens)
        gate_t = e_t (normalize="all": the loss keeps the paper's 1/N over ALL tokens)
               | e_t · N / Σe (normalize="selected": the authors' code, a mean over the selected tokens)

    H is the current policy's entropy at the sampling temperature, from the training forward of the micro-batch
    being updated (detached): the fork tokens are those the policy being trained is uncertain about (the paper,
    TRL and the authors' code all take it from the training forward). The quantile's scope is that micro-batch,
    as in the authors' code (TRL gathers it across processes); with the default micro_batch_tokens a testbed step
    is one micro-batch. Its recipe is DAPO: `--preset dapo` (token_mean, ε 0.2/0.28) plus this mask.
    Metrics: kept_token_frac, entropy_kept_mean and entropy_all_mean (pooled), entropy_threshold (τ).
    Refs: Beyond the 80/20 Rule arXiv:2506.01939 §5 (ρ = 0.2); TRL top_entropy_quantile (get_high_entropy_mask);
    newer-losses.md §4; algorithms.md §10.4.
    """
    if normalize not in ("all", "selected"):
        raise ValueError(f"high_entropy: normalize must be 'all' (the paper, TRL) or 'selected' (the authors' code), "
                         f"got {normalize!r}")
    if entropy_BT is None:
        raise ValueError("high_entropy needs the current policy's token entropies (entropy_BT), and this forward "
                         "computed none; the objective passes the update forward's entropies")
    entropy_BT = entropy_BT.detach()
    count = mask_BT.sum()
    k = torch.floor(count.to(torch.float64) * top_ratio + 0.9999).clamp(min=1)
    threshold = ops.kth_largest(entropy_BT, mask_BT, k)
    kept_BT = mask_BT & (entropy_BT >= threshold)
    gate_BT = kept_BT.to(entropy_BT.dtype)
    if normalize == "selected":
        gate_BT = gate_BT * (count / kept_BT.sum().clamp(min=1)).to(gate_BT.dtype)
    metrics = {
        "kept_token_frac": ops.masked_mean(kept_BT.float(), mask_BT),
        "entropy_kept_mean": ops.pooled_mean(entropy_BT, kept_BT),
        "entropy_all_mean": ops.pooled_mean(entropy_BT, mask_BT),
        "entropy_threshold": torch.where(count > 0, threshold, 0.0),
    }
    return gate_BT.to(logp_BT.dtype), metrics
