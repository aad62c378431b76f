"""IS-weight decomposition diagnostics (§7, §9.12)."""

from __future__ import annotations

import math

import pytest
import torch

from literl.algorithm.diagnostics import is_decomposition
from literl.algorithm.metric_reduction import MetricAccumulator, scalars

L = math.log


def test_is_decomposition_hand():
    """One row, two tokens: μ = [0.5, 0.5], π_old = [0.25, 0.5], π_θ = π_old → d_ti = [−log 2, 0], d_st = 0.
    ti/kl_k1 = mean(−d) = 0.6931/2 = 0.3466; ti/kl_k3 = mean(e^d − 1 − d) = (0.5 − 1 + 0.6931)/2 = 0.0966;
    abs mean 0.3466, max 0.6931; chi2_token = mean(e^2d) − 1 = (0.25 + 1)/2 − 1 = −0.375;
    chi2_seq = e^(2·(−0.6931)) − 1 = −0.75; log_ppl_diff = −mean_t d = 0.3466; ratio [0.5, 1]: mean 0.75;
    ess = 0.75² / ((0.25 + 1)/2) = 0.9. Staleness is 0: st/ppo_kl 0, ratio 1; share/ti = 1, share/st = 0.
    """
    rollout = torch.tensor([[L(0.5), L(0.5)]])
    old = torch.tensor([[L(0.25), L(0.5)]])
    out = is_decomposition(old.clone(), old, rollout, torch.ones(1, 2, dtype=torch.bool))
    expected = {"ti/kl_k1": 0.3466, "ti/kl_k3": 0.0966, "ti/abs_logdiff_mean": 0.3466, "ti/abs_logdiff_max": 0.6931,
                "ti/chi2_token": -0.375, "ti/chi2_seq": -0.75, "ti/log_ppl_diff": 0.3466, "ti/ratio_mean": 0.75,
                "ti/ratio_min": 0.5, "ti/ratio_max": 1.0, "ti/ess": 0.9, "st/ppo_kl": 0.0, "st/ratio_mean": 1.0,
                "share/ti": 1.0, "share/st": 0.0, "tot/kl_k1": 0.3466}
    for key, value in expected.items():
        assert float(out[key]) == pytest.approx(value, abs=1e-4), key
    assert all(math.isfinite(v) for v in scalars(out).values())


def test_per_staleness_breakdown_hand():
    """Two rows of two tokens, k = 2: row 0 sampled 0 versions ago, row 1 2 versions ago (its last token padding).
    d_ti = [[−log 2, 0], [log 2, ·]], d_st = [[0, 0], [−log 2, ·]].
    staleness 0: ti_kl_k1 = mean(−d_ti) = 0.6931/2 = 0.3466, ti_kl_k3 = (0.5 − 1 + 0.6931 + 0)/2 = 0.0966,
                 ti_abs_logdiff_max 0.6931, st_kl_k1 0, tot_kl_k3 = ti's 0.0966;
    staleness 2: ti_kl_k1 = −0.6931, ti_kl_k3 = 2 − 1 − 0.6931 = 0.3069, st_kl_k1 = 0.6931,
                 tot: d = 0 → 0;   staleness 1: no token → NaN (null in metrics.jsonl), its max left out.
    Micro-batch split: the per-row sums combine exactly (row by row gives the same step values)."""
    rollout = torch.tensor([[L(0.5), L(0.5)], [L(0.25), 0.0]])
    old = torch.tensor([[L(0.25), L(0.5)], [L(0.5), 0.0]])
    logp = torch.tensor([[L(0.25), L(0.5)], [L(0.25), 0.0]])
    mask = torch.tensor([[True, True], [True, False]])
    staleness = torch.tensor([[0, 0], [2, -1]])
    out = is_decomposition(logp, old, rollout, mask, staleness, max_staleness=2)
    expected = {"stale/0/ti_kl_k1": 0.3466, "stale/0/ti_kl_k3": 0.0966, "stale/0/ti_abs_logdiff_max": 0.6931,
                "stale/0/st_kl_k1": 0.0, "stale/0/tot_kl_k3": 0.0966, "stale/2/ti_kl_k1": -0.6931,
                "stale/2/ti_kl_k3": 0.3069, "stale/2/st_kl_k1": 0.6931, "stale/2/tot_kl_k3": 0.0,
                "stale/2/ti_abs_logdiff_max": 0.6931}
    whole = scalars(out)
    for key, value in expected.items():
        assert whole[key] == pytest.approx(value, abs=1e-4), key
    assert math.isnan(whole["stale/1/ti_kl_k1"]) and "stale/1/ti_abs_logdiff_max" not in whole
    split = MetricAccumulator()
    for row in range(2):
        split.add(is_decomposition(logp[row:row + 1], old[row:row + 1], rollout[row:row + 1], mask[row:row + 1],
                                   staleness[row:row + 1], max_staleness=2))
    by_rows = split.result()
    for key, value in expected.items():
        assert by_rows[key] == pytest.approx(value, abs=1e-4), key


HAND_CASES = {"is_decomposition": test_is_decomposition_hand}


def random_logps(seed=0, B=5, T=8):
    g = torch.Generator().manual_seed(seed)
    rollout = -torch.rand(B, T, generator=g) * 2
    old = rollout + 0.2 * torch.randn(B, T, generator=g)
    logp = old + 0.1 * torch.randn(B, T, generator=g)
    mask = torch.arange(T)[None, :] < torch.tensor([8, 3, 0, 5, 1])[:, None]
    return logp, old, rollout, mask


def test_total_is_the_sum_of_the_parts():
    """d_tot = d_ti + d_st: the linear statistics add up; the shares sum to 1."""
    out = is_decomposition(*random_logps())
    for key in ["kl_k1", "log_ppl_diff"]:
        assert float(out[f"tot/{key}"]) == pytest.approx(float(out[f"ti/{key}"]) + float(out[f"st/{key}"]), abs=1e-6)
    assert float(out["share/ti"]) + float(out["share/st"]) == pytest.approx(1.0)
    assert float(out["st/ppo_kl"]) == float(out["st/kl_k1"])


def test_train_inference_kl_matches_monte_carlo():
    """Tokens sampled from μ (5-way categorical); old_logp = log π(y), rollout_logp = log μ(y):
    ti/kl_k1 and ti/kl_k3 estimate KL(μ‖π_old) = Σ μ log(μ/π)."""
    g = torch.Generator().manual_seed(0)
    log_mu = torch.log_softmax(torch.randn(5, generator=g), -1)
    log_pi = torch.log_softmax(log_mu + 0.5 * torch.randn(5, generator=g), -1)
    exact = float((log_mu.exp() * (log_mu - log_pi)).sum())
    y = torch.multinomial(log_mu.exp(), 40_000, replacement=True, generator=g).reshape(40, 1000)
    mask = torch.ones(40, 1000, dtype=torch.bool)
    out = is_decomposition(log_pi[y], log_pi[y], log_mu[y], mask)
    assert float(out["ti/kl_k1"]) == pytest.approx(exact, abs=0.01)
    assert float(out["ti/kl_k3"]) == pytest.approx(exact, abs=0.01)


def test_empty_and_identical_inputs_are_finite():
    """Identical log-probs: shares 0 and 0, ESS 1. Empty mask: the same, and max/min are −inf/+inf (a max/min
    over nothing), which the accumulator leaves out: nothing non-finite is logged."""
    logp, old, rollout, mask = random_logps()
    for m in [torch.zeros_like(mask), mask]:
        out = is_decomposition(old, old, old, m)
        logged = scalars(out)
        assert all(math.isfinite(v) for v in logged.values())
        assert logged["share/ti"] == 0.0 and logged["share/st"] == 0.0 and logged["ti/ess"] == 1.0
        assert ("ti/ratio_max" in logged) == bool(m.any())
    out = is_decomposition(old, old, old, torch.zeros_like(mask))
    assert float(out["ti/ratio_max"]) == -math.inf and float(out["ti/ratio_min"]) == math.inf


def test_sequence_statistics_hand_two_rows():
    """μ = 1 everywhere (rollout_logp 0); d_ti row 0 = [0.1]·4, row 1 = [−0.5] (one token); π_θ = π_old.
    log_ppl_diff = mean_i(−mean_t d) = (−0.1 + 0.5)/2 = 0.2   (a token-weighted mix of rows would give 0.02);
    chi2_seq = (e^(2·0.4) + e^(2·(−0.5)))/2 − 1 = (2.225541 + 0.367879)/2 − 1 = 0.296710;
    kl_k1 = −(0.4 − 0.5)/5 = 0.02;  w = [e^0.1]·4 + [e^−0.5]: Σw = 5.027215, Σw² = 4e^0.2 + e^−1 = 5.253490,
    ess = (Σw)²/(5·Σw²) = 25.272891/26.267452 = 0.962137.
    The same holds when each row is its own micro-batch, weighted by any token count.
    """
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]], dtype=torch.bool)
    rollout = torch.zeros(2, 4)
    old = torch.tensor([[0.1, 0.1, 0.1, 0.1], [-0.5, 0.0, 0.0, 0.0]])
    expected = {"ti/log_ppl_diff": 0.2, "ti/chi2_seq": 0.296710, "ti/kl_k1": 0.02, "ti/ess": 0.962137}
    full = scalars(is_decomposition(old, old, rollout, mask))
    acc = MetricAccumulator()
    for row, weight in ((0, 4), (1, 1)):
        acc.add(is_decomposition(old[row:row + 1], old[row:row + 1], rollout[row:row + 1], mask[row:row + 1]),
                weight=weight)
    split = acc.result()
    for key, value in expected.items():
        assert full[key] == pytest.approx(value, abs=1e-5), key
        assert split[key] == pytest.approx(value, abs=1e-5), key


def _accumulated(parts, logp, old, rollout, mask, weight_of):
    acc = MetricAccumulator()
    for rows in parts:
        rows = torch.tensor(rows)
        acc.add(is_decomposition(logp[rows], old[rows], rollout[rows], mask[rows]), weight=weight_of(rows))
    return acc.result()


@pytest.mark.parametrize("parts", [[[0, 1], [2, 3, 4]], [[0], [1], [2], [3], [4]], [[3, 1, 0], [4, 2]],
                                   [[2], [0, 1, 3, 4]]])
def test_every_metric_is_the_same_for_any_micro_batch_split(parts):
    """Uneven rows (lengths 8, 3, 0, 5, 1), micro-batches of different sizes, one holding only the empty row,
    and weights from a different mask (a loss mask that drops row 0, as the overlong filter would): every
    logged value equals the full-batch one (sequence means, ESS, shares, max/min included)."""
    logp, old, rollout, mask = random_logps()
    loss_mask = mask.clone()
    loss_mask[0] = False
    full = _accumulated([list(range(5))], logp, old, rollout, mask, lambda rows: int(loss_mask[rows].sum()))
    split = _accumulated(parts, logp, old, rollout, mask, lambda rows: int(loss_mask[rows].sum()))
    assert split.keys() == full.keys() and "ti/chi2_seq" in full and "ti/kl_k3" in full
    for key in full:
        assert split[key] == pytest.approx(full[key], rel=1e-6, abs=1e-6), key
