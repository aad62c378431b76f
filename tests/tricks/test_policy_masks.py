"""Policy masks against the worked examples of newer-losses.md §3 (OPSM) and §4 (the 80/20 entropy mask), on the
shared toy batch E in float64, and their edge cases. A mask's gate multiplies the policy loss; the denominators
stay those of every valid token."""

from __future__ import annotations

import math

import pytest
import torch

from literl.algorithm.tricks import POLICY_LOSSES, POLICY_MASKS
from tests.tricks.toy_batch_e import F64, aggregate, batch_e, close

E = math.exp


def gated(mask_name, mask_params, how, *, loss="ppo_clip", loss_params=None, overrides=None):
    """(L, ∂L/∂logp, gate, metrics): `loss` on batch E times the mask's gate, aggregated the spec's way."""
    b = {**batch_e(), **(overrides or {})}
    logp = b["logp"].clone().requires_grad_(True)
    gate, metrics = POLICY_MASKS.build(mask_name, mask_params)(logp, b["old"], b["rollout"], b["adv"], b["mask"],
                                                               b["entropy"])
    assert not gate.requires_grad and (gate[~b["mask"]] == 0).all()
    loss_BT, _ = POLICY_LOSSES.build(loss, loss_params or {})(logp, b["old"], b["rollout"], b["adv"], b["mask"])
    total = aggregate(loss_BT * gate, b["mask"], how)
    (grad,) = torch.autograd.grad(total, logp)
    return total.detach(), grad, gate, metrics


def test_opsm_hand():
    """Batch E, base = PPO clip ε = 0.2, SMTM over B' = 2 (masked rows stay in B').
    D₀ = mean(−1.0 + 0.7, −0.5 + 0.5, −1.5 + 2.0) = mean(−0.3, 0, 0.5) = 0.066667 (A₀ > 0: kept anyway).
    D₁ = mean(−0.3 + 0.6, −1.0 + 1.3) = 0.3 (the padding 5.0 is ignored).
    Row 0: clip(r) = [1.2, 1, 0.8], min(rA, clip·A) = [1.2, 1, 0.606531] → q = [−1.2, −1, −0.606531], mean −0.935510.
    Row 1 (A = −0.5): rA = [−0.303265, −0.370409], clip·A = [−0.4, −0.4] → q = [0.4, 0.4] (both clipped), mean 0.4.
    δ = 0.25: 0.3 > 0.25 ∧ A₁ < 0 → M₁ = 0, L = −0.935510/2 = −0.467755.   δ = 0.5: L = (−0.935510 + 0.4)/2 = −0.267755.
    Gradients (both δ): g[0,2] = −0.606531/6 = −0.101088, g[0,1] = −1/6, g[0,0] = 0 (r > 1.2), row 1 all 0.
    """
    row0 = (-1.2 - 1.0 - E(-0.5)) / 3
    for delta, expected, printed, masked in ((0.25, row0 / 2, -0.467755, 0.5), (0.5, (row0 + 0.4) / 2, -0.267755, 0.0)):
        loss, grad, gate, metrics = gated("opsm", {"delta": delta}, "seq_mean_token_mean")
        close(loss, expected, atol=1e-12)
        close(loss, printed)
        close(grad, [[0.0, -1 / 6, -E(-0.5) / 6], [0.0, 0.0, 0.0]], atol=1e-12)
        close(grad[0, 2], -0.101088)
        close(float(metrics["masked_seq_frac"]), masked, atol=1e-12)
        close(float(metrics["seq_log_ratio_mean"]), (0.2 / 3 + 0.3) / 2, atol=1e-12)
        close(metrics["seq_log_ratio_max"], 0.3, atol=1e-12)
    assert gate.tolist() == [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]]


def test_opsm_edge_cases():
    """Strict tests: D₁ = δ = 0.3 exactly → kept; A₁ = 0 with D₁ = 0.3 > 0.25 → kept. Padding garbage (inf and NaN
    in μ and logp past the row's end) never reaches D. An empty row: D = 0, kept, contributes nothing. D < 0 never
    masks. source="old" reads π_old: D₁ = mean(−0.1 + 0.6, −1.0 + 1.3) = 0.4 > 0.25 → masked; a batch without
    rollout log-probs (None) falls back to π_old too."""
    b = batch_e()
    # D₁ in float64 is 0.30000000000000004 for these inputs; state D = δ exactly with δ read off the same sum
    d1 = float(((b["rollout"][1, :2] - b["logp"][1, :2]).sum() / 2))
    gate = POLICY_MASKS.build("opsm", {"delta": d1})(b["logp"], b["old"], b["rollout"], b["adv"], b["mask"], None)[0]
    assert gate[1, :2].tolist() == [1.0, 1.0]
    zero_adv = torch.where(b["mask"], torch.tensor([[1.0], [0.0]], dtype=F64).expand(2, 3), 0.0)
    gate = POLICY_MASKS.build("opsm", {"delta": 0.25})(b["logp"], b["old"], b["rollout"], zero_adv, b["mask"], None)[0]
    assert gate[1, :2].tolist() == [1.0, 1.0]
    garbage_mu, garbage_logp = b["rollout"].clone(), b["logp"].clone()
    garbage_mu[1, 2], garbage_logp[1, 2] = math.inf, math.nan
    gate, m = POLICY_MASKS.build("opsm", {"delta": 0.25})(garbage_logp, b["old"], garbage_mu, b["adv"], b["mask"], None)
    assert gate.tolist() == [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]] and math.isfinite(float(m["seq_log_ratio_mean"]))
    empty = torch.tensor([[1, 1, 1], [0, 0, 0]], dtype=torch.bool)
    gate, m = POLICY_MASKS.build("opsm", {"delta": 0.0})(b["logp"], b["old"], b["rollout"], b["adv"], empty, None)
    assert gate.tolist() == [[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]] and float(m["masked_seq_frac"]) == 0.0
    below = b["rollout"] - 5.0                                       # μ far below π_θ: D < 0
    gate = POLICY_MASKS.build("opsm", {"delta": 0.0})(b["logp"], b["old"], below, b["adv"], b["mask"], None)[0]
    assert gate[1, :2].tolist() == [1.0, 1.0]
    for params, rollout in (({"delta": 0.35, "source": "old"}, b["rollout"]), ({"delta": 0.35}, None)):
        gate = POLICY_MASKS.build("opsm", params)(b["logp"], b["old"], rollout, b["adv"], b["mask"], None)[0]
        assert gate[1, :2].tolist() == [0.0, 0.0]          # D₁ = 0.4 > 0.35; with μ it would be 0.3, kept


def test_opsm_leaves_denominators_and_only_drops_negative_rows():
    """Masking row 1 of batch E keeps it in B' = 2: the value is row 0's mean over 2, not over 1."""
    loss, _, _, _ = gated("opsm", {"delta": 0.0}, "seq_mean_token_mean")
    close(loss, (-1.2 - 1.0 - E(-0.5)) / 3 / 2, atol=1e-12)


def test_high_entropy_hand():
    """Batch E, ρ = 0.4, DAPO base (ε_low = 0.2, ε_high = 0.28), Σ/N with N = 5.
    Valid entropies [0.9, 0.1, 2.0, 1.5, 0.3] (9.9 is padding); k = ⌊0.4·5 + 0.9999⌋ = 2; τ = 2nd largest = 1.5 →
    kept (0,2) [H = 2.0] and (1,0) [H = 1.5].
    (0,2): A = 1, r = 0.606531 → min(0.606531, 0.8)·1 → q = −0.606531 (live). (1,0): A = −0.5, r = 0.606531 < 0.8 →
    min(−0.303265, −0.4) = −0.4 → q = +0.4 (clipped). Σq = −0.206531.
    normalize="all": L = −0.206531/5 = −0.041306, g[0,2] = −0.606531/5 = −0.121306, others 0.
    normalize="selected": L = −0.206531/2 = −0.103265, g[0,2] = −0.303265.
    Entropy kept vs all: (2.0 + 1.5)/2 = 1.75 against 4.8/5 = 0.96.
    """
    dapo = {"eps_low": 0.2, "eps_high": 0.28}
    loss, grad, gate, m = gated("high_entropy", {"top_ratio": 0.4}, "token_mean", loss_params=dapo)
    assert gate.tolist() == [[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]
    close(loss, (-E(-0.5) + 0.4) / 5, atol=1e-12)
    close(loss, -0.041306)
    close(grad, [[0.0, 0.0, -E(-0.5) / 5], [0.0, 0.0, 0.0]], atol=1e-12)
    close(grad[0, 2], -0.121306)
    close(m["kept_token_frac"], 0.4)
    close(float(m["entropy_kept_mean"]), 1.75, atol=1e-12)
    close(float(m["entropy_all_mean"]), 0.96, atol=1e-12)
    close(m["entropy_threshold"], 1.5, atol=1e-12)
    loss, grad, _, _ = gated("high_entropy", {"top_ratio": 0.4, "normalize": "selected"}, "token_mean",
                             loss_params=dapo)
    close(loss, (-E(-0.5) + 0.4) / 2, atol=1e-12)
    close(loss, -0.103265)
    close(grad[0, 2], -E(-0.5) / 2, atol=1e-12)
    close(grad[0, 2], -0.303265)


def _kept(entropy, top_ratio, mask=None):
    entropy = torch.tensor([entropy], dtype=F64)
    mask = torch.ones_like(entropy, dtype=torch.bool) if mask is None else torch.tensor([mask], dtype=torch.bool)
    zeros = torch.zeros_like(entropy)
    gate, _ = POLICY_MASKS.build("high_entropy", {"top_ratio": top_ratio})(zeros, zeros, zeros, zeros, mask, entropy)
    return int(gate.sum())


def test_high_entropy_count_rule_ties_and_float_noise():
    """H = [0.1, 0.2, 0.3, 0.4], ρ = 0.3: k = ⌊1.2 + 0.9999⌋ = 2 (the authors' ceil; TRL's quantile keeps 1).
    Ties at τ are all kept: H = [1, 1, 1, 0], ρ = 0.25 → k = 1, τ = 1, three tokens kept.
    ρ = 0.07, N = 100: 0.07·100 = 7.000000000000001 in float64, a naive ceil gives 8; ⌊7.0000… + 0.9999⌋ = 7.
    ρ = 1: every valid token (no mask). The minimum is one token: ρ = 0.01, N = 5 → k = ⌊0.05 + 0.9999⌋ = 1.
    Padding is excluded from the ranking: a padded H of 9.9 is never kept and does not take a slot."""
    assert _kept([0.1, 0.2, 0.3, 0.4], 0.3) == 2
    assert _kept([1.0, 1.0, 1.0, 0.0], 0.25) == 3
    assert _kept([float(i) for i in range(100)], 0.07) == 7
    assert _kept([0.5, 0.1, 0.9, 0.2], 1.0) == 4
    assert _kept([0.5, 0.1, 0.9, 0.2, 0.3], 0.01) == 1
    assert _kept([0.5, 0.1, 9.9], 0.5, mask=[1, 1, 0]) == 1
    entropy = torch.tensor([[0.5, 0.1, 9.9]], dtype=F64)
    zeros = torch.zeros_like(entropy)
    gate, _ = POLICY_MASKS.get("high_entropy")(zeros, zeros, zeros, zeros, torch.tensor([[1, 1, 0]], dtype=torch.bool),
                                               entropy, top_ratio=0.5)
    assert gate.tolist() == [[1.0, 0.0, 0.0]]


def test_high_entropy_edge_cases():
    """No valid token: an empty gate, L = 0, metrics finite. A = 0 tokens still compete for the slots (selection
    reads entropy only). Without entropies it refuses, naming what is missing."""
    none = torch.zeros(2, 3, dtype=torch.bool)
    loss, grad, gate, m = gated("high_entropy", {}, "token_mean", overrides={"mask": none})
    assert float(loss) == 0.0 and not grad.any() and not gate.any()
    assert all(math.isfinite(float(v)) for v in m.values())
    zero_adv = torch.zeros(2, 3, dtype=F64)
    _, _, gate, _ = gated("high_entropy", {"top_ratio": 0.4}, "token_mean", overrides={"adv": zero_adv})
    assert gate.tolist() == [[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]
    b = batch_e()
    with pytest.raises(ValueError, match="entropies"):
        POLICY_MASKS.get("high_entropy")(b["logp"], b["old"], b["rollout"], b["adv"], b["mask"], None)


HAND_CASES = {
    "opsm": test_opsm_hand,
    "high_entropy": test_high_entropy_hand,
}
