"""KL estimators: hand case, Monte-Carlo unbiasedness, straight-through gradients, and the clamps (§5, §9.9)."""

from __future__ import annotations

import math

import pytest
import torch

from literl.algorithm.tricks import KL_ESTIMATORS

P, P_REF = 0.5, 0.25  # δ = log 2 = 0.6931


def value_and_grad(name, logp=math.log(P), ref=math.log(P_REF), **params):
    logp_BT = torch.tensor([[logp]], requires_grad=True)
    kl_BT = KL_ESTIMATORS.build(name, params)(logp_BT, torch.tensor([[ref]]))
    (grad,) = torch.autograd.grad(kl_BT.sum(), logp_BT)
    return float(kl_BT.detach()), float(grad)


def test_k1_hand():
    """δ = log 0.5 − log 0.25 = log 2 = 0.6931; ∇k1 = 1."""
    assert value_and_grad("k1") == pytest.approx((0.6931, 1.0), abs=1e-4)


def test_k2_hand():
    """½·(log 2)² = ½·0.4805 = 0.2402; ∇k2 = δ = 0.6931."""
    assert value_and_grad("k2") == pytest.approx((0.2402, 0.6931), abs=1e-4)


def test_k3_hand():
    """e^(−δ) − 1 + δ = 0.25/0.5 − 1 + 0.6931 = 0.1931; ∇k3 = 1 − π_ref/π = 1 − 0.5 = 0.5."""
    assert value_and_grad("k3") == pytest.approx((0.1931, 0.5), abs=1e-4)


def test_k1_st_hand():
    """Value of k1 (0.6931), gradient of k2 (δ = 0.6931)."""
    assert value_and_grad("k1_st") == pytest.approx((0.6931, 0.6931), abs=1e-4)


def test_k3_st_hand():
    """Value of k3 (0.1931), gradient of k2 (0.6931)."""
    assert value_and_grad("k3_st") == pytest.approx((0.1931, 0.6931), abs=1e-4)


HAND_CASES = {"k1": test_k1_hand, "k2": test_k2_hand, "k3": test_k3_hand, "k1_st": test_k1_st_hand,
              "k3_st": test_k3_st_hand}


def test_k3_nonnegative():
    g = torch.Generator().manual_seed(0)
    logp, ref = torch.randn(50, 20, generator=g) * 3, torch.randn(50, 20, generator=g) * 3
    assert (KL_ESTIMATORS.get("k3")(logp, ref) >= 0).all()


def test_k1_k3_unbiased_by_monte_carlo():
    """Samples y ~ π on a 6-way categorical: mean k1 and mean k3 match KL(π‖π_ref) = Σ π log(π/π_ref)."""
    g = torch.Generator().manual_seed(0)
    log_pi = torch.log_softmax(torch.randn(6, generator=g), -1)
    log_ref = torch.log_softmax(torch.randn(6, generator=g), -1)
    exact = float((log_pi.exp() * (log_pi - log_ref)).sum())
    y = torch.multinomial(log_pi.exp(), 200_000, replacement=True, generator=g)
    logp, ref = log_pi[y][None, :], log_ref[y][None, :]
    for name in ["k1", "k3"]:
        est = KL_ESTIMATORS.get(name)(logp, ref)
        stderr = float(est.std()) / math.sqrt(est.numel())
        assert abs(float(est.mean()) - exact) < 4 * stderr + 1e-4, name
    assert float(KL_ESTIMATORS.get("k2")(logp, ref).mean()) != pytest.approx(exact, abs=1e-3)


@pytest.mark.parametrize("st,base", [("k3_st", "k2"), ("k1_st", "k2")])
def test_straight_through_has_k2_gradient(st, base):
    g = torch.Generator().manual_seed(1)
    logp = torch.randn(4, 5, generator=g).requires_grad_(True)
    ref = torch.randn(4, 5, generator=g)
    value = KL_ESTIMATORS.get(st)(logp, ref)
    (g_st,) = torch.autograd.grad(value.sum(), logp)
    (g_k2,) = torch.autograd.grad(KL_ESTIMATORS.get(base)(logp, ref).sum(), logp)
    torch.testing.assert_close(g_st, g_k2)
    plain = KL_ESTIMATORS.get(st.removesuffix("_st"))(logp, ref)
    torch.testing.assert_close(value, plain)


def test_k3_clamps_only_past_thresholds():
    """x = ref − logp. Inside |x| ≤ 20 and k3 ≤ 10 the value is the formula; k3 > 10 is clamped to 10;
    with the output clamp lifted, x = −25 is read as −20: e^−20 − 1 + 20 ≈ 19 (not 24)."""
    k3 = KL_ESTIMATORS.get("k3")
    x = torch.tensor([[-3.0, 0.5, 2.0]])
    torch.testing.assert_close(k3(torch.zeros_like(x), x), torch.expm1(x) - x)
    assert float(k3(torch.zeros(1, 1), torch.tensor([[5.0]]))) == 10.0  # e^5 − 6 = 142 → 10
    lifted = float(k3(torch.zeros(1, 1), torch.tensor([[-25.0]]), clamp=1e30))
    assert lifted == pytest.approx(19.0, abs=1e-5)
    assert float(k3(torch.zeros(1, 1), torch.tensor([[-19.0]]), clamp=1e30)) == pytest.approx(18.0, abs=1e-5)
