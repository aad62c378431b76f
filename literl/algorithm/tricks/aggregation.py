"""Loss aggregation as token weights: `(mask_BT, group_B, *, ...) -> (numerator_BT, denominator)`.

The objective calls an entry once per optimizer step on the full step batch S and uses

    weight_BT = numerator_BT / max(Σ denominator, 1),     loss(micro-batch) = Σ_{b,t ∈ mb} weight·ℓ

so the micro-batch losses add up exactly to the step loss whatever the split. The numerator is float32 and
0 off the mask; the denominator is a 0-dim float32 *count* (tokens, sequences or groups), so counts from
several ranks can be summed (all-reduced) before dividing. `mask_BT` is the final loss mask (response ∧
loss masks ∧ IS keep): a rejected token leaves both the numerator and the counts.

Registered: token_mean, seq_mean_token_mean, seq_mean_token_sum, seq_mean_token_sum_norm.
verl's legacy per-micro-batch normaliser (inexact) is `algorithm.aggregation_normaliser=local`, which applies
the same entry to each micro-batch instead (`Objective.micro_batches`).
"""

from __future__ import annotations

import torch

from literl.algorithm import ops
from literl.algorithm.tricks import AGGREGATIONS


def _count(x, mask_BT) -> torch.Tensor:
    """A 0-dim float32 count on the mask's device (so it can be all-reduced with the step's other counts)."""
    return torch.as_tensor(x, dtype=torch.float32, device=mask_BT.device).reshape(())


@AGGREGATIONS.register
def token_mean(mask_BT, group_B, *, token_mean_scope="batch"):
    """Token mean: every valid token of the step weighs the same (DAPO, LitePPO "token-level").

        "batch": L = Σ_{i∈S} Σ_t m·ℓ / Σ_{i∈S} Σ_t m                  num = m, den = #tokens
        "group": L = (1/|P_valid|) Σ_g Σ_{i∈g} Σ_t m·ℓ / Σ_{i∈g} Σ_t m  num = m / tokens_g, den = #groups with ≥1 token

    "batch" is what every framework implements; "group" is the paper equations read literally (1/Σ|o_i|
    inside the expectation over prompts).
    Refs: DAPO arXiv:2503.14476 Eq. 4; LitePPO arXiv:2508.08221 J_token-level; algorithms.md §3.
    """
    if token_mean_scope not in ("batch", "group"):
        raise ValueError(f"token_mean: token_mean_scope must be 'batch' or 'group', got {token_mean_scope!r}")
    m_BT = mask_BT.float()
    if token_mean_scope == "batch":
        return m_BT, _count(m_BT.sum(), mask_BT)
    group_tokens_B, _ = ops.group_sum(m_BT.sum(-1), group_B)
    index_B, n_groups = ops.dense_group_index(group_B)
    has_tokens = torch.zeros(n_groups, dtype=torch.bool, device=mask_BT.device)
    has_tokens[index_B[mask_BT.any(-1)]] = True
    return m_BT / group_tokens_B.clamp(min=1)[:, None], _count(has_tokens.sum(), mask_BT)


@AGGREGATIONS.register
def seq_mean_token_mean(mask_BT, group_B):
    """Sequence mean of per-sequence token means (GRPO, GSPO).

        L = (1/|S_valid|) Σ_i (Σ_t m·ℓ / Σ_t m)       num = m / |y_i|, den = #sequences with ≥1 valid token

    Empty sequences weigh nothing and are not counted.
    Refs: DeepSeekMath arXiv:2402.03300 Eq. 3; GSPO arXiv:2507.18071 Eq. 5; algorithms.md §3.
    """
    m_BT = mask_BT.float()
    lengths_B = m_BT.sum(-1)
    return m_BT / lengths_B.clamp(min=1)[:, None], _count((lengths_B > 0).sum(), mask_BT)


@AGGREGATIONS.register
def seq_mean_token_sum(mask_BT, group_B):
    """Sequence mean of per-sequence token sums (MiniRL, REINFORCE): no length normalisation.

        L = (1/|S|) Σ_i Σ_t m·ℓ         num = m, den = #sequences (empty ones included)

    Refs: MiniRL arXiv:2512.01374 Eq. 7; algorithms.md §2.7, §3.
    """
    return mask_BT.float(), _count(mask_BT.shape[0], mask_BT)


@AGGREGATIONS.register(ranges={"max_new_tokens": "> 0"})
def seq_mean_token_sum_norm(mask_BT, group_B, *, max_new_tokens=None):
    """Dr.GRPO constant normaliser: token sums divided by the max generation length, averaged over sequences.

        L = (1/|S|) Σ_i Σ_t m·ℓ / L_const    num = m / L_const, den = #sequences, L_const = max_new_tokens

    L_const is a constant of the run (filled from the run context), never the padded T of a micro-batch.
    Refs: Dr.GRPO arXiv:2503.20783 (oat masked_sum constant_normalizer); algorithms.md §3.
    """
    if max_new_tokens is None or max_new_tokens <= 0:
        raise ValueError("seq_mean_token_sum_norm needs max_new_tokens (the max generation length, L_const); "
                         "give the entry params.max_new_tokens, or build it with context={'max_new_tokens': ...}")
    return mask_BT.float() / float(max_new_tokens), _count(mask_BT.shape[0], mask_BT)
