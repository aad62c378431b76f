"""The shared toy batch E of newer-losses.md §0, in float64, and the spec's aggregators (TM, SMTM/SM with B').

    logp         = [[-0.7, -0.5, -2.0], [-0.6, -1.3, -0.8]]
    old_logp     = [[-1.2, -0.5, -1.5], [-0.1, -1.0, -0.9]]
    rollout_logp = [[-1.0, -0.5, -1.5], [-0.3, -1.0,  5.0]]   5.0 is padding garbage
    mask         = [[1, 1, 1], [1, 1, 0]],  A = [1.0, -0.5],  entropy = [[0.9, 0.1, 2.0], [1.5, 0.3, 9.9]]
    ⇒ ℓ = [[0.5, 0, −0.5], [−0.5, −0.3, ·]],  n = [3, 2],  N = 5,  B' = 2
"""

from __future__ import annotations

import torch

F64 = torch.float64


def batch_e() -> dict[str, torch.Tensor]:
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    adv = torch.where(mask, torch.tensor([[1.0], [-0.5]], dtype=F64).expand(2, 3), 0.0)
    return {
        "logp": torch.tensor([[-0.7, -0.5, -2.0], [-0.6, -1.3, -0.8]], dtype=F64),
        "old": torch.tensor([[-1.2, -0.5, -1.5], [-0.1, -1.0, -0.9]], dtype=F64),
        "rollout": torch.tensor([[-1.0, -0.5, -1.5], [-0.3, -1.0, 5.0]], dtype=F64),
        "mask": mask,
        "adv": adv,
        "entropy": torch.tensor([[0.9, 0.1, 2.0], [1.5, 0.3, 9.9]], dtype=F64),
    }


def aggregate(loss_BT: torch.Tensor, mask_BT: torch.Tensor, how: str) -> torch.Tensor:
    """The spec's scalar, in the loss's dtype (float64 here): "token_mean" is TM = Σ m·q / N; "seq_mean_token_mean"
    is SMTM = (1/B') Σ_{n_i>0} (1/n_i) Σ_t m·q over the B' non-empty rows (SM when each valid token of a row carries
    the row's s_i). Written out rather than taken from literl's aggregation axis, whose weights are float32 (that
    axis has its own tests); 0 when nothing is valid."""
    m = mask_BT.to(loss_BT.dtype)
    q = torch.where(mask_BT, loss_BT, 0.0)
    if how == "token_mean":
        return (m * q).sum() / m.sum().clamp(min=1)
    assert how == "seq_mean_token_mean", how
    n_B = m.sum(-1)
    rows = n_B > 0
    return ((m * q).sum(-1)[rows] / n_B[rows]).sum() / rows.sum().clamp(min=1)


def close(actual, expected, atol=1e-6):
    """Against the spec's printed numbers (6 decimals): atol 1e-6 covers their rounding."""
    torch.testing.assert_close(torch.as_tensor(actual, dtype=F64), torch.as_tensor(expected, dtype=F64),
                               atol=atol, rtol=0)
