"""Aggregation weights: hand cases, the direct §3 formulas, and exactness under uneven micro-batch splits."""

from __future__ import annotations

import pytest
import torch

from literl.algorithm.tricks import AGGREGATIONS

MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]], dtype=torch.bool)
LOSS = torch.tensor([[1.0, 1.0, 1.0, 99.0], [2.0, 99.0, 99.0, 99.0]])  # 99 off the mask must not count


def aggregate(name, mask, loss, groups=None, **params):
    group_B = torch.zeros(len(mask), dtype=torch.long) if groups is None else torch.tensor(groups)
    num, den = AGGREGATIONS.build(name, params)(mask, group_B)
    assert num.dtype == torch.float32 and den.dim() == 0 and den.dtype == torch.float32
    assert (num[~mask] == 0).all()
    return (num * loss).sum() / den.clamp(min=1)


def test_token_mean_hand():
    """mask [[1,1,1,0],[1,0,0,0]], loss [[1,1,1,·],[2,·,·,·]]: (1+1+1+2)/4 tokens = 1.25.
    "group" scope, 3 rows [[1,1,1],[2],[3,3]] with groups [0,0,1]: group 0 (3+2)/4 = 1.25, group 1 6/2 = 3,
    mean over the 2 groups = 2.125 (batch scope would give 11/6 = 1.8333).
    """
    assert float(aggregate("token_mean", MASK, LOSS)) == pytest.approx(1.25)
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0]], dtype=torch.bool)
    loss = torch.tensor([[1.0, 1, 1], [2, 0, 0], [3, 3, 0]])
    assert float(aggregate("token_mean", mask, loss, [0, 0, 1], token_mean_scope="group")) == pytest.approx(2.125)
    assert float(aggregate("token_mean", mask, loss, [0, 0, 1])) == pytest.approx(11 / 6)


def test_seq_mean_token_mean_hand():
    """Same case: per-sequence means 3/3 = 1 and 2/1 = 2, mean over 2 sequences = 1.5.
    An extra empty row is not counted: still 1.5.
    """
    assert float(aggregate("seq_mean_token_mean", MASK, LOSS)) == pytest.approx(1.5)
    mask = torch.cat([MASK, torch.zeros(1, 4, dtype=torch.bool)])
    assert float(aggregate("seq_mean_token_mean", mask, torch.cat([LOSS, LOSS[:1]]))) == pytest.approx(1.5)


def test_seq_mean_token_sum_hand():
    """Same case: per-sequence sums 3 and 2, mean over 2 sequences = 2.5; an extra empty row counts: 5/3."""
    assert float(aggregate("seq_mean_token_sum", MASK, LOSS)) == pytest.approx(2.5)
    mask = torch.cat([MASK, torch.zeros(1, 4, dtype=torch.bool)])
    assert float(aggregate("seq_mean_token_sum", mask, torch.cat([LOSS, LOSS[:1]]))) == pytest.approx(5 / 3)


def test_seq_mean_token_sum_norm_hand():
    """Same case, L_const = 4: (3/4 + 2/4) / 2 sequences = 0.625."""
    assert float(aggregate("seq_mean_token_sum_norm", MASK, LOSS, max_new_tokens=4)) == pytest.approx(0.625)


HAND_CASES = {
    "token_mean": test_token_mean_hand,
    "seq_mean_token_mean": test_seq_mean_token_mean_hand,
    "seq_mean_token_sum": test_seq_mean_token_sum_hand,
    "seq_mean_token_sum_norm": test_seq_mean_token_sum_norm_hand,
}

MODES = [("token_mean", {}), ("token_mean", {"token_mean_scope": "group"}), ("seq_mean_token_mean", {}),
         ("seq_mean_token_sum", {}), ("seq_mean_token_sum_norm", {"max_new_tokens": 9})]


def random_step(seed=0, B=9, T=9):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(0, T + 1, (B,), generator=g)
    lengths[2] = 0
    mask = torch.arange(T)[None, :] < lengths[:, None]
    groups = torch.tensor([4, 4, 4, 1, 1, 1, 8, 8, 8])
    theta = torch.randn(B, T, generator=g, requires_grad=True)
    coef = torch.randn(B, T, generator=g)
    return mask, groups, theta, coef, lengths


def direct(name, params, mask, groups, loss):
    """The §3 definitions written out row by row."""
    m = mask.float()
    per_sum = (m * loss).sum(-1)
    lengths = m.sum(-1)
    if name == "token_mean" and params.get("token_mean_scope") == "group":
        means = [per_sum[groups == k].sum() / lengths[groups == k].sum() for k in groups.unique()
                 if lengths[groups == k].sum() > 0]
        return torch.stack(means).mean()
    if name == "token_mean":
        return per_sum.sum() / lengths.sum()
    if name == "seq_mean_token_mean":
        valid = lengths > 0
        return (per_sum[valid] / lengths[valid]).mean()
    if name == "seq_mean_token_sum":
        return per_sum.mean()
    return (per_sum / params["max_new_tokens"]).mean()


@pytest.mark.parametrize("name,params", MODES)
def test_matches_direct_formula(name, params):
    mask, groups, theta, coef, _ = random_step()
    loss = theta.detach() * coef
    num, den = AGGREGATIONS.build(name, params)(mask, groups)
    torch.testing.assert_close((num * loss).sum() / den, direct(name, params, mask, groups, loss))


@pytest.mark.parametrize("name,params", MODES)
def test_micro_batches_sum_to_full_batch_loss_and_gradient(name, params):
    """Weights from the full step batch; rows split into uneven micro-batches [1, 5, 3] (each trimmed to
    its own longest row, as TrainBatch.micro_batches does); Σ_mb Σ w·ℓ equals the full loss and gradient."""
    mask, groups, theta, coef, lengths = random_step()
    num, den = AGGREGATIONS.build(name, params)(mask, groups)
    weight = num / den.clamp(min=1)
    full = (weight * theta * coef).sum()
    (g_full,) = torch.autograd.grad(full, theta)
    order = torch.argsort(lengths, descending=True)
    total = torch.zeros(())
    for rows in torch.split(order, [1, 5, 3]):
        T_mb = max(int(lengths[rows].max()), 1)
        total = total + (weight[rows, :T_mb] * theta[rows, :T_mb] * coef[rows, :T_mb]).sum()
    (g_split,) = torch.autograd.grad(total, theta)
    torch.testing.assert_close(total, full)
    torch.testing.assert_close(g_split, g_full)


@pytest.mark.parametrize("name,params", MODES)
def test_denominators_add_across_ranks(name, params):
    """Counts are additive: computing (num, den) per simulated rank (whole groups per rank) and all-reducing
    the denominators gives the full-batch weights."""
    mask, groups, *_ = random_step()
    fn = AGGREGATIONS.build(name, params)
    num, den = fn(mask, groups)
    ranks = [torch.tensor([0, 1, 2, 6, 7, 8]), torch.tensor([3, 4, 5])]
    parts = [fn(mask[r], groups[r]) for r in ranks]
    den_all = sum(d for _, d in parts)
    torch.testing.assert_close(den_all, den)
    for r, (n, _) in zip(ranks, parts):
        torch.testing.assert_close(n / den_all, num[r] / den)


def test_const_norm_needs_max_new_tokens():
    """No L_const → a ValueError saying how to give it; the registry fills it from the run context."""
    with pytest.raises(ValueError, match="max_new_tokens"):
        AGGREGATIONS.get("seq_mean_token_sum_norm")(MASK, torch.zeros(2, dtype=torch.long))
    fn = AGGREGATIONS.build("seq_mean_token_sum_norm", {}, context={"max_new_tokens": 4})
    num, den = fn(MASK, torch.zeros(2, dtype=torch.long))
    assert float((num * LOSS).sum() / den) == pytest.approx(0.625)


def test_fully_masked_step_has_zero_weights():
    mask = torch.zeros(3, 4, dtype=torch.bool)
    for name, params in MODES:
        num, den = AGGREGATIONS.build(name, params)(mask, torch.zeros(3, dtype=torch.long))
        assert (num == 0).all() and torch.isfinite(num / den.clamp(min=1)).all()

