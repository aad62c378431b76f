"""Policy losses against hand-computed cases, and the gradient properties of algorithms.md §9.3–9.6."""

from __future__ import annotations

import math

import pytest
import torch

from literl.algorithm import ops
from literl.algorithm.tricks import AGGREGATIONS, POLICY_LOSSES
from tests.tricks.toy_batch_e import aggregate, batch_e
from tests.tricks.toy_batch_e import close as close64

L = math.log


def call(name, logp, old, adv, rollout=None, mask=None, **params):
    """Run a loss on 1-row inputs given as plain lists; returns (loss_BT, metrics, dloss.sum()/dlogp)."""
    logp_BT = torch.tensor([logp], dtype=torch.float32, requires_grad=True)
    old_BT = torch.tensor([old], dtype=torch.float32)
    rollout_BT = old_BT.clone() if rollout is None else torch.tensor([rollout], dtype=torch.float32)
    adv_BT = torch.tensor([adv], dtype=torch.float32)
    mask_BT = torch.ones_like(adv_BT, dtype=torch.bool) if mask is None else torch.tensor([mask], dtype=torch.bool)
    loss_BT, metrics = POLICY_LOSSES.build(name, params)(logp_BT, old_BT, rollout_BT, adv_BT, mask_BT)
    (grad,) = torch.autograd.grad(loss_BT.sum(), logp_BT)
    return loss_BT.detach()[0], metrics, grad[0]


def close(actual, expected, atol=1e-4):
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=torch.float32), atol=atol, rtol=0)


def test_reinforce_hand():
    """logp = log 0.5, old = log 0.25 → w = 2; A = 1: loss = −2·log 0.5 = 1.3863, ∇ = −w·A = −2.
    behaviour="rollout" with μ = 0.5 → w = 1, ∇ = −1. is_cap = 1.5 → w = 1.5, ∇ = −1.5.
    """
    loss, metrics, grad = call("reinforce", [L(0.5)], [L(0.25)], [1.0], rollout=[L(0.5)])
    close(loss, [1.3863])
    close(grad, [-2.0])
    close(metrics["is_weight_mean"], 2.0)
    close(call("reinforce", [L(0.5)], [L(0.25)], [1.0], rollout=[L(0.5)], behaviour="rollout")[2], [-1.0])
    _, m, grad = call("reinforce", [L(0.5)], [L(0.25)], [1.0], is_cap=1.5)
    close(grad, [-1.5])
    close(m["is_truncated_frac"], 1.0)


def test_ppo_clip_hand():
    """Four tokens, ρ = [1.5, 1.5, 0.5, 1.0], A = [1, −1, −1, 1], ε = 0.2:
    t0: max(−1.5, −1.2) = −1.2, clipped → ∇ 0.          t1: max(1.5, 1.2) = 1.5, ∇ = −A·ρ = 1.5.
    t2: max(0.5, 0.8) = 0.8, clipped → ∇ 0.              t3: max(−1, −1) = −1, ∇ = −1.
    binding: high = {t0} → 1/4, low = {t2} → 1/4; outside high = {t0,t1} → 1/2, outside low = {t2} → 1/4.
    """
    loss, m, grad = call("ppo_clip", [L(1.5), L(1.5), L(0.5), 0.0], [0.0] * 4, [1.0, -1.0, -1.0, 1.0])
    close(loss, [-1.2, 1.5, 0.8, -1.0])
    close(grad, [0.0, 1.5, 0.0, -1.0])
    close(m["clipfrac_binding_high"], 0.25)
    close(m["clipfrac_binding_low"], 0.25)
    close(m["ratio_outside_high"], 0.5)
    close(m["ratio_outside_low"], 0.25)
    close(m["ratio_max"], 1.5)
    close(m["ratio_min"], 0.5)
    assert m["clipped_high_BT"].tolist() == [[True, False, False, False]]
    assert m["clipped_low_BT"].tolist() == [[False, False, True, False]]


def test_ppo_dual_clip_hand():
    """dual_clip c = 3, A = −1: ρ = 4 → max(4, 1.2) = 4, min(4, 3) = 3, ∇ 0; ρ = 2 → 2 < 3, ∇ = −A·ρ = 2.
    dual_clip_frac = 1/2.
    """
    loss, m, grad = call("ppo_clip", [L(4.0), L(2.0)], [0.0, 0.0], [-1.0, -1.0], dual_clip=3.0)
    close(loss, [3.0, 2.0])
    close(grad, [0.0, 2.0])
    close(m["dual_clip_frac"], 0.5)


def seq_mean_weights(mask):
    num, den = AGGREGATIONS.get("seq_mean_token_mean")(torch.tensor([mask]), torch.zeros(1, dtype=torch.long))
    return num / den


def test_gspo_hand():
    """Token log-ratios [log 2, 0] → s = exp((log 2 + 0)/2) = √2 = 1.4142.
    A = +1: clip(s) = 1 + 4e-4 → loss = max(−1.4142, −1.0004) = −1.0004 on both tokens, ∇ = 0.
    A = −1: loss = max(1.4142, 1.0004) = 1.4142; with seq_mean_token_mean weights (½, ½) the objective is
    1.4142 and ∂/∂logp_t = −A·s·(1/|y|) = 0.7071 for each token.
    """
    loss, m, grad = call("gspo", [L(2.0), 0.0], [0.0, 0.0], [1.0, 1.0])
    close(loss, [-1.0004, -1.0004])
    close(grad, [0.0, 0.0])
    close(m["ratio_mean"], math.sqrt(2))
    close(m["clipfrac_binding_high"], 1.0)
    w = seq_mean_weights([1, 1])
    logp = torch.tensor([[L(2.0), 0.0]], requires_grad=True)
    loss_BT, _ = POLICY_LOSSES.get("gspo")(logp, torch.zeros(1, 2), torch.zeros(1, 2), -torch.ones(1, 2),
                                         torch.ones(1, 2, dtype=torch.bool))
    total = (w * loss_BT).sum()
    close(total, 1.4142)
    close(torch.autograd.grad(total, logp)[0][0], [0.7071, 0.7071])


def test_gspo_token_hand():
    """Same inputs as gspo: s_t = sg(√2)·π/sg(π) has value √2 on both tokens.
    A = −1: loss_t = 1.4142; ∂loss_t/∂logp_t = −A·s = 1.4142, times the weight ½ → 0.7071 (= gspo).
    A = +1: clipped at 1.0004 → ∇ 0.
    """
    loss, _, grad = call("gspo_token", [L(2.0), 0.0], [0.0, 0.0], [-1.0, -1.0])
    close(loss, [1.4142, 1.4142])
    close(grad, [1.4142, 1.4142])
    loss, _, grad = call("gspo_token", [L(2.0), 0.0], [0.0, 0.0], [1.0, 1.0])
    close(loss, [-1.0004, -1.0004])
    close(grad, [0.0, 0.0])


def test_cispo_hand():
    """ub = 1.2: ρ = 1.5, A = 1 → ŵ = 1.2, loss = −1.2·logp = −1.2·log 1.5 = −0.4866, ∇ = −1.2 (PPO: 0).
    unified_mask: A > 0 ∧ ρ > ub → masked, loss 0, ∇ 0.
    lb = 0.8: ρ = 0.5, A = −1 → ŵ = 0.8, ∇ = −ŵ·A = 0.8; unified → 0.
    """
    loss, m, grad = call("cispo", [L(1.5)], [0.0], [1.0], ub=1.2)
    close(loss, [-0.4866])
    close(grad, [-1.2])
    close(m["capped_frac"], 1.0)
    close(m["clipfrac_binding_high"], 1.0)
    close(call("cispo", [L(1.5)], [0.0], [1.0], ub=1.2, unified_mask=True)[2], [0.0])
    close(call("cispo", [L(0.5)], [0.0], [-1.0], ub=1.2, lb=0.8)[2], [0.8])
    close(call("cispo", [L(0.5)], [0.0], [-1.0], ub=1.2, lb=0.8, unified_mask=True)[2], [0.0])


def test_minirl_hand():
    """On-policy, logp = old = log 0.5, μ = 0.25, A = 1: w = min(π_θ/μ, 5) = 2 → loss = −2·log 0.5 = 1.3863, ∇ = −2.
    Mask on π_old, not μ: logp = log 0.6, old = log 0.5 (r = 1.2 ≤ 1.27), μ = 0.3 (π_θ/μ = 2) → kept, ∇ = −2.
    logp = log 0.7, old = log 0.5 (r = 1.4 > 1.27), μ = 0.7 (π_θ/μ = 1) → M = 0, ∇ = 0.
    TIS: logp = old = log 0.6, μ = 0.06 → π_θ/μ = 10 → w = 5.
    tis_scope="train_infer": logp = log 0.6, old = log 0.5, μ = 0.05 → min(10, 5)·1.2 = 6; "full": min(12, 5) = 5.
    train_infer_is=False: w = r = 1.2.
    """
    loss, _, grad = call("minirl", [L(0.5)], [L(0.5)], [1.0], rollout=[L(0.25)])
    close(loss, [1.3863])
    close(grad, [-2.0])
    close(call("minirl", [L(0.6)], [L(0.5)], [1.0], rollout=[L(0.3)])[2], [-2.0])
    close(call("minirl", [L(0.7)], [L(0.5)], [1.0], rollout=[L(0.7)])[2], [0.0])
    _, m, grad = call("minirl", [L(0.6)], [L(0.6)], [1.0], rollout=[L(0.06)])
    close(grad, [-5.0])
    close(m["is_truncated_frac"], 1.0)
    close(m["is_weight_max"], 5.0)
    args = ([L(0.6)], [L(0.5)], [1.0])
    close(call("minirl", *args, rollout=[L(0.05)], tis_scope="train_infer")[2], [-6.0])
    close(call("minirl", *args, rollout=[L(0.05)])[2], [-5.0])
    close(call("minirl", *args, rollout=[L(0.05)], train_infer_is=False)[2], [-1.2])


HAND_CASES = {
    "reinforce": test_reinforce_hand,
    "ppo_clip": test_ppo_clip_hand,
    "gspo": test_gspo_hand,
    "gspo_token": test_gspo_token_hand,
    "cispo": test_cispo_hand,
    "minirl": test_minirl_hand,
}


def random_inputs(seed=0, B=6, T=7, spread=0.5):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, T, generator=g) * 3
    logp = (old + spread * torch.randn(B, T, generator=g)).requires_grad_(True)
    rollout = old + 0.3 * torch.randn(B, T, generator=g)
    adv = torch.randn(B, 1, generator=g).expand(B, T).contiguous()
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    lengths[0] = 0
    mask = torch.arange(T)[None, :] < lengths[:, None]
    return logp, old, rollout, adv, mask


def grad_of(name, inputs, weights=None, **params):
    logp, old, rollout, adv, mask = inputs
    loss_BT, metrics = POLICY_LOSSES.build(name, params)(logp, old, rollout, adv, mask)
    total = (loss_BT * (mask.float() if weights is None else weights)).sum()
    (grad,) = torch.autograd.grad(total, logp)
    return grad, total, metrics


def test_ppo_clip_gradient_zero_exactly_on_binding_set():
    """∇ = 0 exactly on (A>0 ∧ ρ>1+ε_h) ∨ (A<0 ∧ ρ<1−ε_l), else −A·ρ (clip-higher bounds 0.2/0.28)."""
    inputs = random_inputs()
    logp, old, _, adv, mask = inputs
    grad, _, m = grad_of("ppo_clip", inputs, eps_low=0.2, eps_high=0.28)
    ratio = torch.exp(logp.detach() - old)
    binding = ((adv > 0) & (ratio > 1.28)) | ((adv < 0) & (ratio < 0.8))
    assert binding[mask].any() and (~binding[mask]).any()
    assert (grad[binding] == 0).all()
    torch.testing.assert_close(grad[mask & ~binding], (-adv * ratio)[mask & ~binding])
    assert torch.equal(m["clipped_low_BT"] | m["clipped_high_BT"], binding & mask)


def test_ppo_dual_clip_zero_gradient_past_c():
    """For A < 0 and ρ > c the loss is the constant −c·A: ∇ = 0; below c it is PPO's."""
    inputs = random_inputs(spread=1.0)
    logp, old, _, adv, mask = inputs
    grad, _, _ = grad_of("ppo_clip", inputs, dual_clip=1.5)
    ratio = torch.exp(logp.detach() - old)
    dual = (adv < 0) & (ratio > 1.5) & mask
    assert dual.any()
    assert (grad[dual] == 0).all()
    plain, _, _ = grad_of("ppo_clip", inputs)
    torch.testing.assert_close(grad[mask & ~dual], plain[mask & ~dual])


def test_cispo_gradient_is_clipped_weight_times_advantage():
    """∇ = −sg(clamp(ρ, lb, ub))·A·∇logp everywhere, nonzero past the bound where PPO's is 0; with the
    unified mask (ub = 1+ε_h, lb = 1−ε_l) the zero set equals PPO's."""
    inputs = random_inputs()
    logp, old, _, adv, mask = inputs
    ratio = torch.exp(logp.detach() - old)
    grad, _, _ = grad_of("cispo", inputs, ub=1.2, lb=0.8)
    torch.testing.assert_close(grad, torch.where(mask, -ratio.clamp(0.8, 1.2) * adv, torch.zeros(())))
    ppo_grad, _, _ = grad_of("ppo_clip", inputs)
    past = mask & (ppo_grad == 0) & (adv != 0)
    assert past.any() and (grad[past] != 0).all()
    unified, _, _ = grad_of("cispo", inputs, ub=1.2, lb=0.8, unified_mask=True)
    assert torch.equal(unified[mask] == 0, ppo_grad[mask] == 0)


@pytest.mark.parametrize("eps", [(3e-4, 4e-4), (0.2, 0.2)])
def test_gspo_token_equals_gspo_under_seq_mean_token_mean(eps):
    """Per-sequence advantages + seq_mean_token_mean weights: same loss and gradient to 1e-6."""
    inputs = random_inputs(spread=0.05)
    mask = inputs[4]
    num, den = AGGREGATIONS.get("seq_mean_token_mean")(mask, torch.zeros(len(mask), dtype=torch.long))
    weights = num / den.clamp(min=1)
    params = dict(eps_low=eps[0], eps_high=eps[1])
    g_seq, l_seq, _ = grad_of("gspo", inputs, weights, **params)
    g_tok, l_tok, _ = grad_of("gspo_token", inputs, weights, **params)
    torch.testing.assert_close(l_tok, l_seq, atol=1e-6, rtol=0)
    torch.testing.assert_close(g_tok, g_seq, atol=1e-6, rtol=0)


def test_gspo_on_one_token_sequences_equals_ppo():
    """With |y| = 1 the sequence ratio is the token ratio: gspo = ppo_clip (same eps)."""
    logp, old, rollout, adv, _ = random_inputs(T=1, spread=0.3)
    mask = torch.ones_like(adv, dtype=torch.bool)
    inputs = (logp, old, rollout, adv, mask)
    g1, l1, _ = grad_of("gspo", inputs, eps_low=0.2, eps_high=0.2)
    g2, l2, _ = grad_of("ppo_clip", inputs)
    torch.testing.assert_close((l1, g1), (l2, g2))


def test_minirl_on_policy_is_train_infer_weighted_reinforce():
    """θ = θ_old: M = 1 and w = min(π_old/μ, cap) → ∇ = −(π_old/μ)·A·∇logp (cap high enough here)."""
    _, old, rollout, adv, mask = random_inputs()
    logp = old.clone().requires_grad_(True)
    grad, _, _ = grad_of("minirl", (logp, old, rollout, adv, mask), tis_cap=1e6)
    expected = torch.where(mask, -torch.exp(old - rollout) * adv, torch.zeros(()))
    torch.testing.assert_close(grad, expected)


def test_minirl_caps_weight_at_five():
    """Default tis_cap = 5: no token carries |∇| > 5·|A|, and heavy ratios are exactly capped."""
    _, old, rollout, adv, mask = random_inputs()
    rollout = old - 3.0  # π_old/μ = e^3 ≈ 20 everywhere
    logp = old.clone().requires_grad_(True)
    grad, _, m = grad_of("minirl", (logp, old, rollout, adv, mask))
    torch.testing.assert_close(grad, torch.where(mask, -5.0 * adv, torch.zeros(())))
    assert float(m["is_truncated_frac"]) == 1.0


def test_ppo_clip_symmetric_equals_textbook():
    """eps_low = eps_high: −min(ρA, clip(ρ, 1−ε, 1+ε)A), written out directly."""
    logp, old, rollout, adv, mask = random_inputs()
    loss, _ = POLICY_LOSSES.get("ppo_clip")(logp, old, rollout, adv, mask)
    ratio = torch.exp(logp - old)
    textbook = -torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
    torch.testing.assert_close(loss, torch.where(mask, textbook, torch.zeros(())))


@pytest.mark.parametrize("name", POLICY_LOSSES.names())
def test_metric_keys(name):
    """Every loss reports the shared keys; `_BT` entries are bool maps, the rest 0-dim tensors."""
    _, metrics = POLICY_LOSSES.get(name)(*random_inputs())
    shared = {"clipfrac_binding_low", "clipfrac_binding_high", "ratio_outside_low", "ratio_outside_high",
              "ratio_mean", "ratio_min", "ratio_max", "approx_kl_k1", "approx_kl_k3", "clipped_low_BT",
              "clipped_high_BT"}
    assert shared <= set(metrics)
    for key, value in metrics.items():
        if key.endswith("_BT"):
            assert value.dtype == torch.bool and value.shape == (6, 7)
        elif isinstance(value, ops.Ratio):      # a pooled mean over its own count (exact across micro-batches)
            assert math.isfinite(float(value))
        else:
            assert value.dim() == 0 and not value.requires_grad and torch.isfinite(value)


def test_log_ratio_clamp_keeps_outliers_finite():
    """log ρ = 100 would overflow exp; clamped at 20 the loss and gradient stay finite."""
    loss, m, grad = call("ppo_clip", [100.0, -100.0], [0.0, 0.0], [-1.0, 1.0])
    assert torch.isfinite(loss).all() and torch.isfinite(grad).all()
    close(m["ratio_max"], math.exp(20.0), atol=1e3)


def test_cispo_paper_notation_sets_the_bounds():
    """eps_high = 0.2 ⇔ ub = 1.2 and eps_low = 0.5 ⇔ lb = 0.5 (r̂ = clip(ρ, 1 − ε_low, 1 + ε_high), §2.6):
    ratios [0.25, 1.0, 3.0] with A = +1 → weights [0.5, 1.0, 1.2] either way."""
    logp = torch.log(torch.tensor([[0.25, 1.0, 3.0]])) + torch.log(torch.tensor(0.1))
    old = torch.full((1, 3), float(torch.log(torch.tensor(0.1))))
    adv, mask = torch.ones(1, 3), torch.ones(1, 3, dtype=torch.bool)
    paper = POLICY_LOSSES.build("cispo", {"eps_high": 0.2, "eps_low": 0.5})
    absolute = POLICY_LOSSES.build("cispo", {"ub": 1.2, "lb": 0.5})
    for fn in (paper, absolute):
        lp = logp.clone().requires_grad_(True)
        loss, _ = fn(lp, old, old, adv, mask)
        loss.sum().backward()
        torch.testing.assert_close(lp.grad, -torch.tensor([[0.5, 1.0, 1.2]]))


# ---- the newer losses (newer-losses.md §1, §2, §5, §6), on the shared toy batch E, in float64 ---------------------

E = math.exp


def run_e(name, how, *, inputs=None, overrides=None, **params):
    """(L, ∂L/∂logp, metrics) of `name` on batch E (fields replaced by `overrides`), aggregated the spec's way."""
    b = {**batch_e(), **(overrides or {})}
    logp = b["logp"].clone().requires_grad_(True)
    loss_BT, metrics = POLICY_LOSSES.build(name, params)(logp, b["old"], b["rollout"], b["adv"], b["mask"],
                                                          **(inputs or {}))
    assert (loss_BT[~b["mask"]] == 0).all()
    total = aggregate(loss_BT, b["mask"], how)
    (grad,) = torch.autograd.grad(total, logp)
    return total.detach(), grad, metrics


def test_gmpo_hand():
    """Batch E, ε_low = ε_high = 0.4 (log space), SM over B' = 2 rows (seq_mean_token_mean of s_i per token).
    Row 0 (A = +1): ℓ = [0.5, 0, −0.5] → ℓ̂ = [0.4, 0, −0.4] → ℓ̃ = min = [0.4, 0, −0.5];
        ḡ₀ = (0.4 + 0 − 0.5)/3 = −1/30 → e^ḡ₀ = 0.967216, s₀ = −0.967216.
    Row 1 (A = −0.5): ℓ = [−0.5, −0.3] → ℓ̂ = [−0.4, −0.3] → ℓ̃ = max = [−0.4, −0.3];
        ḡ₁ = −0.35 → e^ḡ₁ = 0.704688, s₁ = +0.5·0.704688 = 0.352344.
    L = (−0.967216 + 0.352344)/2 = −0.307436.
    g = −(A/B')·e^ḡ·live/n: g[0,1] = g[0,2] = −(1/2)(0.967216)/3 = −0.161203; g[0,0] = 0 (0.5 > 0.4);
        g[1,1] = +(0.5/2)(0.704688)/2 = 0.088086; g[1,0] = 0 (−0.5 < −0.4); padding 0.
    """
    loss, grad, metrics = run_e("gmpo", "seq_mean_token_mean")
    close64(loss, (-E(-1 / 30) + 0.5 * E(-0.35)) / 2, atol=1e-12)
    close64(loss, -0.307436)
    close64(grad, [[0.0, -E(-1 / 30) / 6, -E(-1 / 30) / 6], [0.0, 0.5 * E(-0.35) / 4, 0.0]], atol=1e-12)
    close64(grad, [[0.0, -0.161203, -0.161203], [0.0, 0.088086, 0.0]])
    close64(metrics["clipfrac_binding_high"], 1 / 5)       # (0,0): A > 0, ℓ = 0.5 > 0.4
    close64(metrics["clipfrac_binding_low"], 1 / 5)        # (1,0): A < 0, ℓ = −0.5 < −0.4


def test_gmpo_edge_cases():
    """On-policy (r = 1): L = −(1/B')ΣA = −(1 − 0.5)/2 = −0.25, g = −A/(B'·n) = [−1/6 ×3], [+1/8 ×2].
    An empty row adds nothing and leaves B' (rows [A=1 n=3], [empty]): L = −1, g = −1/3 per token.
    A = 0 on every row: L = 0 and g = 0. Every token of row 0 clipped (ℓ = [0.5, 0.6, 0.7] > 0.4, A = 1):
    s₀ = −e^0.4 is a constant, g = 0. ℓ = ε_high exactly (A = 1) is live: g = −e^0.4/1."""
    b = batch_e()
    loss, grad, _ = run_e("gmpo", "seq_mean_token_mean", overrides={"old": b["logp"]})
    close64(loss, -0.25, atol=1e-12)
    close64(grad, [[-1 / 6] * 3, [1 / 8, 1 / 8, 0.0]], atol=1e-12)
    empty = torch.tensor([[1, 1, 1], [0, 0, 0]], dtype=torch.bool)
    loss, grad, _ = run_e("gmpo", "seq_mean_token_mean", overrides={"old": b["logp"], "mask": empty,
                                                                     "adv": torch.where(empty, b["adv"], 0.0)})
    close64(loss, -1.0, atol=1e-12)
    close64(grad, [[-1 / 3] * 3, [0.0] * 3], atol=1e-12)
    loss, grad, _ = run_e("gmpo", "seq_mean_token_mean", overrides={"adv": torch.zeros(2, 3, dtype=torch.float64)})
    assert float(loss) == 0.0 and not grad.any()
    f64 = torch.float64
    one_row = {"logp": torch.tensor([[0.5, 0.6, 0.7]], dtype=f64), "old": torch.zeros(1, 3, dtype=f64),
               "rollout": torch.zeros(1, 3, dtype=f64), "mask": torch.ones(1, 3, dtype=torch.bool),
               "adv": torch.ones(1, 3, dtype=f64)}
    loss, grad, _ = run_e("gmpo", "seq_mean_token_mean", overrides=one_row)
    close64(loss, -E(0.4), atol=1e-12)
    assert not grad.any()
    boundary = {"logp": torch.tensor([[0.4]], dtype=f64), "old": torch.zeros(1, 1, dtype=f64),
                "rollout": torch.zeros(1, 1, dtype=f64), "mask": torch.ones(1, 1, dtype=torch.bool),
                "adv": torch.ones(1, 1, dtype=f64)}
    _, grad, _ = run_e("gmpo", "seq_mean_token_mean", overrides=boundary)
    close64(grad, [[-E(0.4)]], atol=1e-12)


def test_sapo_hand():
    """Batch E, τ_pos = 1, τ_neg = 1.05, SMTM over B' = 2.
    Row 0 (A = 1, τ = 1): r = [1.648721, 1, 0.606531], σ(r − 1) = [0.656722, 0.5, 0.402882], q = −4σ =
        [−2.626889, −2, −1.611530]; row mean −2.079473.
    Row 1 (A = −0.5, τ = 1.05): σ(1.05(r − 1)) = [0.398159, 0.432382], f = (4/1.05)σ = [1.516795, 1.647168],
        q = 0.5f = [0.758398, 0.823584]; row mean 0.790991.
    L = (−2.079473 + 0.790991)/2 = −0.644241.
    g = −A·4σ(1−σ)·r/(n·B'): g[0,0] = −4(0.656722)(0.343278)(1.648721)/6 = −0.247790, g[0,1] = −1/6,
        g[1,1] = 0.5·4(0.432382)(0.567618)(0.740818)/4 = 0.090909.
    """
    loss, grad, metrics = run_e("sapo", "seq_mean_token_mean")
    σ0 = [1 / (1 + E(-(r - 1))) for r in (E(0.5), 1.0, E(-0.5))]
    σ1 = [1 / (1 + E(-1.05 * (r - 1))) for r in (E(-0.5), E(-0.3))]
    exact = (-4 * sum(σ0) / 3 + 0.5 * (4 / 1.05) * sum(σ1) / 2) / 2
    close64(loss, exact, atol=1e-12)
    close64(loss, -0.644241)
    close64(grad[0, 0], -4 * σ0[0] * (1 - σ0[0]) * E(0.5) / 6, atol=1e-12)
    close64(grad[0, 0], -0.247790)
    close64(grad[0, 1], -1 / 6, atol=1e-12)
    close64(grad[1, 1], 0.5 * 4 * σ1[1] * (1 - σ1[1]) * E(-0.3) / 4, atol=1e-12)
    close64(grad[1, 1], 0.090909)
    assert grad[1, 2] == 0.0
    close64(metrics["gate_weight_mean"], (sum(4 * s * (1 - s) for s in σ0) + sum(4 * s * (1 - s) for s in σ1)) / 5,
            atol=1e-7)


def test_sapo_edge_cases():
    """r = 1: the value is −2A/τ (row 0: −2, row 1: +0.5·2/1.05), NOT −A, while g = −A/(n·B') as plain PG.
    A = 0: zero loss and gradient. ℓ = ±100 (e^100 overflows float32): finite value 4/τ·σ, gradient exactly 0 on
    the saturated side. log_ratio_clamp = 20 (verl) clamps ℓ: a token at ℓ = 25 gets gradient 0 (with τ = 1e-12,
    τ(r − 1) = 0.072 is far from saturating, so without the clamp its gradient is not 0: checked too)."""
    b = batch_e()
    loss, grad, _ = run_e("sapo", "seq_mean_token_mean", overrides={"old": b["logp"]})
    close64(loss, (-2.0 + 0.5 * 2 / 1.05) / 2, atol=1e-12)
    close64(grad, [[-1 / 6] * 3, [1 / 8, 1 / 8, 0.0]], atol=1e-12)
    loss, grad, _ = run_e("sapo", "seq_mean_token_mean", overrides={"adv": torch.zeros(2, 3, dtype=torch.float64)})
    assert float(loss) == 0.0 and not grad.any()
    logp = torch.tensor([[100.0, -100.0]], requires_grad=True)
    loss_BT, _ = POLICY_LOSSES.get("sapo")(logp, torch.zeros(1, 2), torch.zeros(1, 2), torch.tensor([[-1.0, 1.0]]),
                                           torch.ones(1, 2, dtype=torch.bool))
    loss_BT.sum().backward()
    assert torch.isfinite(loss_BT).all() and torch.isfinite(logp.grad).all()
    close64(loss_BT[0, 0], 4 / 1.05, atol=1e-6)          # −A·(4/τ)·σ(∞) with A = −1, τ = 1.05
    assert logp.grad[0, 0] == 0.0
    logp = torch.tensor([[25.0]], dtype=torch.float64, requires_grad=True)
    loss_BT, _ = POLICY_LOSSES.build("sapo", {"log_ratio_clamp": 20.0, "tau_neg": 1e-12})(
        logp, torch.zeros(1, 1, dtype=torch.float64), torch.zeros(1, 1, dtype=torch.float64),
        -torch.ones(1, 1, dtype=torch.float64), torch.ones(1, 1, dtype=torch.bool))
    loss_BT.sum().backward()
    assert logp.grad[0, 0] == 0.0
    logp = torch.tensor([[25.0]], dtype=torch.float64, requires_grad=True)
    loss_BT, _ = POLICY_LOSSES.build("sapo", {"tau_neg": 1e-12})(
        logp, torch.zeros(1, 1, dtype=torch.float64), torch.zeros(1, 1, dtype=torch.float64),
        -torch.ones(1, 1, dtype=torch.float64), torch.ones(1, 1, dtype=torch.bool))
    loss_BT.sum().backward()
    assert logp.grad[0, 0] > 0.0


def test_clip_cov_hand():
    """Batch E, ε_low = ε_high = 1 (the recipe), ρ_c = 2e-4, TM over N = 5.
    Ā = (1 + 1 + 1 − 0.5 − 0.5)/5 = 0.4, l̄ = (−0.7 − 0.5 − 2.0 − 0.6 − 1.3)/5 = −1.02;
    Cov = [[0.6·0.32, 0.6·0.52, 0.6·(−0.98)], [(−0.9)(0.42), (−0.9)(−0.28)]]
        = [[0.192, 0.312, −0.588], [−0.378, 0.252]].
    Default band (1, 5): nothing selected → plain PPO with ε = 1: q = −A·r = [[−1.648721, −1, −0.606531], [0.303265,
        0.370409]], L = −2.581578/5 = −0.516315.
    Band (0.2, 0.3): C = {(1,1)} (r = 0.740818 ∈ [0, 2], not PPO-clipped); n_clip = max(1, ⌊0.001⌋) = 1 → S = C.
        q[1,1] = 0 → L = (−1.648721 − 1 − 0.606531 + 0.303265)/5 = −0.590397; g[1,1] = 0, g[0,0] = −1.648721/5
        = −0.329744, g[1,0] = 0.5·0.606531/5 = 0.060653.
    Band (0.2, 0.35): C = {(0,1), (1,1)}, one drawn: L = −0.590397 with (1,1), −0.316316 with (0,1) (injected).
    """
    r = [[E(0.5), 1.0, E(-0.5)], [E(-0.5), E(-0.3)]]
    q = [-r[0][0], -r[0][1], -r[0][2], 0.5 * r[1][0], 0.5 * r[1][1]]
    loss, _, metrics = run_e("clip_cov", "token_mean")
    close64(loss, sum(q) / 5, atol=1e-12)
    close64(loss, -0.516315)
    assert float(metrics["cov_candidate_frac"]) == 0.0 and float(metrics["cov_detached_frac"]) == 0.0
    loss, grad, metrics = run_e("clip_cov", "token_mean", clip_cov_lb=0.2, clip_cov_ub=0.3)
    close64(loss, (sum(q) - q[4]) / 5, atol=1e-12)
    close64(loss, -0.590397)
    close64(grad, [[-r[0][0] / 5, -0.2, -r[0][2] / 5], [0.5 * r[1][0] / 5, 0.0, 0.0]], atol=1e-12)
    close64(grad[0, 0], -0.329744)
    close64(grad[1, 0], 0.060653)
    close64(metrics["cov_detached_frac"], 1 / 5)
    assert metrics["cov_detached_BT"].tolist() == [[False, False, False], [False, True, False]]
    pick_01 = torch.tensor([[0, 1, 0], [0, 0, 0]], dtype=torch.bool)
    loss, grad, _ = run_e("clip_cov", "token_mean", inputs={"selected_BT": pick_01}, clip_cov_lb=0.2,
                          clip_cov_ub=0.35)
    close64(loss, (sum(q) - q[1]) / 5, atol=1e-12)
    close64(loss, -0.316316)
    assert grad[0, 1] == 0.0 and grad[1, 1] != 0.0


def test_clip_cov_draws_its_token_with_the_generator_it_is_given():
    """Band (0.2, 0.35) on batch E: C = {(0,1), (1,1)}, n_clip = 1. The same seed picks the same token; over 400
    seeds each candidate is picked about half the time (binomial(400, ½): 200 ± 10, so [150, 250] fails with
    probability < 1e-6); selection="top" takes the larger Cov, (0,1) (0.312 > 0.252), every time."""
    picks = []
    for seed in range(400):
        draws = [run_e("clip_cov", "token_mean", inputs={"generator": torch.Generator().manual_seed(seed)},
                       clip_cov_lb=0.2, clip_cov_ub=0.35)[2]["cov_detached_BT"] for _ in range(2)]
        assert torch.equal(draws[0], draws[1]) and int(draws[0].sum()) == 1
        picks.append(bool(draws[0][0, 1]))
    assert 150 <= sum(picks) <= 250
    _, _, m = run_e("clip_cov", "token_mean", clip_cov_lb=0.2, clip_cov_ub=0.35, selection="top")
    assert m["cov_detached_BT"].tolist() == [[False, True, False], [False, False, False]]


def test_clip_cov_edge_cases():
    """Uniform advantages (A = 1 on every valid token): Cov ≡ 0, C = ∅ (ω_low = 1 > 0) → exactly ppo_clip with
    ε = 1. No valid token: L = 0, nothing selected. A PPO-clipped token is never a candidate: with ε = 0.2 and
    the band (0.2, 0.35), (1,1) (r = 0.741 < 0.8, A < 0) is clipped, so C = {(0,1)} and S = {(0,1)}.
    n_clip ≥ 1: ρ_c·N = 2e-4·5 = 0.001 still detaches one token."""
    b = batch_e()
    ones = torch.where(b["mask"], 1.0, 0.0).to(torch.float64)
    loss, grad, _ = run_e("clip_cov", "token_mean", overrides={"adv": ones})
    ppo_loss, ppo_grad, _ = run_e("ppo_clip", "token_mean", overrides={"adv": ones}, eps_low=1.0, eps_high=1.0)
    close64(loss, ppo_loss, atol=1e-15)
    close64(grad, ppo_grad, atol=1e-15)
    none = torch.zeros(2, 3, dtype=torch.bool)
    zeros = torch.zeros(2, 3, dtype=torch.float64)
    loss, grad, m = run_e("clip_cov", "token_mean", overrides={"mask": none, "adv": zeros})
    assert float(loss) == 0.0 and not grad.any() and not m["cov_detached_BT"].any()
    _, _, m = run_e("clip_cov", "token_mean", clip_cov_lb=0.2, clip_cov_ub=0.35, eps_low=0.2, eps_high=0.2)
    assert m["cov_detached_BT"].tolist() == [[False, True, False], [False, False, False]]


def test_kl_cov_hand():
    """Batch E, κ = 0.4 → k = ⌊2.0⌋ = 2, β = 1, TM over N = 5. Cov ranking 0.312 (0,1) > 0.252 (1,1) > 0.192 (0,0)
    > −0.378 > −0.588 → S = {(0,1), (1,1)}.
    q = −A·r + β|ℓ|·1[S]: (0,0) −1.648721, (0,1) −1 + |0| = −1, (0,2) −0.606531, (1,0) 0.303265,
        (1,1) 0.5·0.740818 + |−0.3| = 0.670409.  L = −2.281577/5 = −0.456315.
    g = (−A·r + β·sign(ℓ)·1[S])/N: g[1,1] = (0.370409 − 1)/5 = −0.125918; g[0,1] = (−1 + 0)/5 = −0.2 (abs has
        subgradient 0 at ℓ = 0); others −A·r/5.
    """
    r = [[E(0.5), 1.0, E(-0.5)], [E(-0.5), E(-0.3)]]
    loss, grad, metrics = run_e("kl_cov", "token_mean", kl_cov_ratio=0.4)
    close64(loss, (-r[0][0] - 1 - r[0][2] + 0.5 * r[1][0] + 0.5 * r[1][1] + 0.3) / 5, atol=1e-12)
    close64(loss, -0.456315)
    close64(grad, [[-r[0][0] / 5, -0.2, -r[0][2] / 5], [0.5 * r[1][0] / 5, (0.5 * r[1][1] - 1) / 5, 0.0]], atol=1e-12)
    close64(grad[1, 1], -0.125918)
    assert metrics["cov_penalised_BT"].tolist() == [[False, True, False], [False, True, False]]
    close64(metrics["cov_penalised_frac"], 2 / 5)
    close64(float(metrics["kl_penalty_mean"]), 0.15, atol=1e-12)      # (|0| + |−0.3|)/2


def test_kl_cov_edge_cases():
    """Ties: A = [1, 1] makes Cov ≡ 0; κ = 0.2 → k = 1 and the lowest index (0,0) is penalised:
    q[0,0] = −1.648721 + |0.5| = −1.148721. No valid token: L = 0. On-policy (r ≡ 1, ℓ ≡ 0) the gradient is the
    unclipped policy gradient −A/N whatever is selected: [[−0.2 ×3], [0.1 ×2]]."""
    b = batch_e()
    ones = torch.where(b["mask"], 1.0, 0.0).to(torch.float64)
    logp = b["logp"].clone().requires_grad_(True)
    loss_BT, m = POLICY_LOSSES.build("kl_cov", {"kl_cov_ratio": 0.2})(logp, b["old"], b["rollout"], ones, b["mask"])
    close64(loss_BT[0, 0], -E(0.5) + 0.5, atol=1e-12)
    close64(loss_BT[0, 0], -1.148721)
    assert m["cov_penalised_BT"].tolist() == [[True, False, False], [False, False, False]]
    none = torch.zeros(2, 3, dtype=torch.bool)
    zeros = torch.zeros(2, 3, dtype=torch.float64)
    loss, grad, _ = run_e("kl_cov", "token_mean", overrides={"mask": none, "adv": zeros})
    assert float(loss) == 0.0 and not grad.any()
    _, grad, _ = run_e("kl_cov", "token_mean", overrides={"old": b["logp"]}, kl_cov_ratio=1.0)
    close64(grad, [[-0.2] * 3, [0.1, 0.1, 0.0]], atol=1e-15)


@pytest.mark.parametrize("name", ["clip_cov", "kl_cov"])
def test_covariance_losses_give_a_masked_token_with_an_extreme_log_ratio_a_zero_gradient(name):
    """Batch E with old_logp[0,2] = −100 and that token masked: ℓ[0,2] = 98, whose ratio overflows float32. The spec's
    gradient at a masked position is 0 (newer-losses.md §0, §5, §6); the valid tokens keep batch E's values, so the
    loss equals the one with (0,2) simply masked and its original old_logp."""
    b = {k: v.float() if v.is_floating_point() else v for k, v in batch_e().items()}
    mask = b["mask"].clone()
    mask[0, 2] = False
    extreme = b["old"].clone()
    extreme[0, 2] = -100.0
    fn = POLICY_LOSSES.build(name, {"selection": "top"} if name == "clip_cov" else {})
    logp = b["logp"].clone().requires_grad_(True)
    loss_BT, _ = fn(logp, extreme, b["rollout"], b["adv"], mask)
    loss_BT.sum().backward()
    assert torch.isfinite(logp.grad).all() and logp.grad[0, 2] == 0.0
    reference_BT, _ = fn(b["logp"], b["old"], b["rollout"], b["adv"], mask)
    assert torch.equal(loss_BT.detach(), reference_BT)


HAND_CASES.update({
    "gmpo": test_gmpo_hand,
    "sapo": test_sapo_hand,
    "clip_cov": test_clip_cov_hand,
    "kl_cov": test_kl_cov_hand,
})
