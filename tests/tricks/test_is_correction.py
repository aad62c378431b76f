"""Training–inference correction: hand cases and the MIS mask-versus-reject denominators (§2.8, §9.8)."""

from __future__ import annotations

import math

import pytest
import torch

from literl.algorithm.tricks import AGGREGATIONS, IS_CORRECTIONS


def correct(name, ratios, mask=None, **params):
    """Inputs as ratios π_old/μ: old_logp = log ratio, rollout_logp = 0."""
    old = torch.log(torch.tensor(ratios, dtype=torch.float32))
    mask_BT = torch.ones_like(old, dtype=torch.bool) if mask is None else torch.tensor(mask, dtype=torch.bool)
    weight, keep, metrics = IS_CORRECTIONS.build(name, params)(old, torch.zeros_like(old), mask_BT)
    assert weight.dtype == torch.float32 and keep.dtype == torch.bool and not weight.requires_grad
    return weight, keep, metrics


def close(actual, expected, atol=1e-4):
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=torch.float32), atol=atol, rtol=0)


def test_none_hand():
    """w = 1 everywhere, keep = mask; ess = 1."""
    weight, keep, m = correct("none", [[3.0, 0.1]], [[1, 0]])
    close(weight, [[1.0, 1.0]])
    assert keep.tolist() == [[True, False]]
    close(m["ess"], 1.0)


def test_token_tis_hand():
    """cap 2: ratios [0.5, 3.0] → [0.5, 2.0]; truncated 1/2; mean 1.25; ess = 1.25² / ((0.25 + 4)/2) = 0.7353."""
    weight, keep, m = correct("token_tis", [[0.5, 3.0]])
    close(weight, [[0.5, 2.0]])
    assert keep.all()
    close(m["truncated_frac"], 0.5)
    close(m["weight_mean"], 1.25)
    close(m["weight_max"], 2.0)
    close(m["weight_min"], 0.5)
    close(m["ess"], 0.7353)


def test_seq_tis_hand():
    """cap 2: row 0 ratios [2, 3] → ρ_seq = 6 → w = 2 on both tokens; row 1 [0.5, 2] → ρ = 1 → w = 1.
    Row 2 is empty: ρ = 1 and its padding gets weight 1 (neutral)."""
    weight, _, m = correct("seq_tis", [[2.0, 3.0], [0.5, 2.0], [7.0, 7.0]], [[1, 1], [1, 1], [0, 0]])
    close(weight, [[2.0, 2.0], [1.0, 1.0], [1.0, 1.0]])
    close(m["truncated_frac"], 0.5)


def test_token_mis_hand():
    """[low, high] = [0.5, 2]: ratios [0.25, 1.5, 3.0] → w = [0, 1.5, 0]; masked 2/3.
    reject=False keeps every token (weight 0 still counts in denominators); reject=True keeps only t1."""
    weight, keep, m = correct("token_mis", [[0.25, 1.5, 3.0]])
    close(weight, [[0.0, 1.5, 0.0]])
    assert keep.all()
    close(m["masked_frac"], 2 / 3)
    weight, keep, _ = correct("token_mis", [[0.25, 1.5, 3.0]], reject=True)
    close(weight, [[0.0, 1.5, 0.0]])
    assert keep.tolist() == [[False, True, False]]


def test_seq_mis_hand():
    """Products: row 0 [2, 2] → 4 > 2 → masked (w 0); row 1 [0.5, 3] → 1.5 → w = 1.5 on both tokens."""
    weight, keep, m = correct("seq_mis", [[2.0, 2.0], [0.5, 3.0]], reject=True)
    close(weight, [[0.0, 0.0], [1.5, 1.5]])
    assert keep.tolist() == [[False, False], [True, True]]
    close(m["masked_frac"], 0.5)


def test_geo_mis_hand():
    """Geometric means: row 0 [1.5, 1.5] → 1.5 (kept, w 1.5); row 1 [4, 9] → 6 > 2 (w 0);
    row 2 [0.25, 0.64] → 0.4 < 0.5 (w 0). A product-based filter would also drop row 0 (2.25 > 2)."""
    weight, _, _ = correct("geo_mis", [[1.5, 1.5], [4.0, 9.0], [0.25, 0.64]])
    close(weight, [[1.5, 1.5], [0.0, 0.0], [0.0, 0.0]])


HAND_CASES = {
    "none": test_none_hand,
    "token_tis": test_token_tis_hand,
    "seq_tis": test_seq_tis_hand,
    "token_mis": test_token_mis_hand,
    "seq_mis": test_seq_mis_hand,
    "geo_mis": test_geo_mis_hand,
}


@pytest.mark.parametrize("reject,expected", [(False, 2 / 3), (True, 1.0)])
def test_mis_mask_keeps_denominator_reject_removes_it(reject, expected):
    """Per-token loss ℓ = [1, 1, 1], ratios [0.25, 1, 1], token_mean aggregation over keep:
    reject=False: Σ w·ℓ / 3 = (0 + 1 + 1)/3 = 2/3 (TRL mask dilutes); reject=True: (1 + 1)/2 = 1 (verl RS)."""
    weight, keep, _ = correct("token_mis", [[0.25, 1.0, 1.0]], reject=reject)
    num, den = AGGREGATIONS.get("token_mean")(keep, torch.zeros(1, dtype=torch.long))
    assert float((num / den * weight * torch.ones(1, 3)).sum()) == pytest.approx(expected)


def test_log_ratio_clamped_for_long_sequences():
    """Σ d = 100·1 would overflow exp; the sequence log ratio is clamped at 20 and ρ_seq = e^20 stays finite."""
    old = torch.ones(1, 100)
    weight, _, m = IS_CORRECTIONS.get("seq_tis")(old, torch.zeros_like(old), torch.ones(1, 100, dtype=torch.bool),
                                                 cap=1e30)
    assert float(weight[0, 0]) == pytest.approx(math.exp(20.0), rel=1e-5)
    assert all(torch.isfinite(v) for v in m.values())
