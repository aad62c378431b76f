"""Advantage estimators against hand-computed cases (arithmetic in each docstring) and §9.1 properties."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

from literl.algorithm.tricks import ADVANTAGES

S3 = math.sqrt(1 / 3)  # unbiased std of [1, 0, 0, 1]


def run(name, rewards, groups, mask=None, token_rewards=None, **params):
    rewards_B = torch.tensor(rewards, dtype=torch.float32)
    group_B = torch.tensor(groups, dtype=torch.long)
    mask_BT = torch.ones(len(rewards), 1, dtype=torch.bool) if mask is None else torch.tensor(mask, dtype=torch.bool)
    tr_BT = torch.zeros(mask_BT.shape) if token_rewards is None else torch.tensor(token_rewards, dtype=torch.float32)
    return ADVANTAGES.build(name, params)(rewards_B, group_B, mask_BT, tr_BT)


def close(actual, expected, atol=1e-4):
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=torch.float32), atol=atol, rtol=0)


def test_grpo_hand():
    """rewards [1,0,0,1] in one group (id 7): mean 0.5, unbiased std sqrt((4·0.25)/3) = 0.5774,
    A = ±0.5/0.5774 = ±0.8660. A second group (id 3) [1,1,1] has std 0 → A = 0 (not NaN).
    Rows are interleaved, so grouping by position would mix the groups.
    """
    adv = run("grpo", [1, 1, 0, 1, 0, 1, 1], [7, 3, 7, 3, 7, 3, 7])[:, 0]
    close(adv, [0.8660, 0, -0.8660, 0, -0.8660, 0, 0.8660])


def test_grpo_group_of_one_warns_and_is_zero():
    """group 5 has one member: its own mean is r, so A = 0 (verl would give r/(1+eps)); a warning is raised."""
    with pytest.warns(UserWarning, match="single valid member"):
        adv = run("grpo", [1.0, 1.0, 0.0], [5, 9, 9])[:, 0]
    close(adv, [0.0, 0.7071, -0.7071])  # group 9: ±0.5 / sqrt(0.5)


def test_grpo_stats_exclude_masked():
    """rewards [1,0,0,1], row 3 has an empty mask.
    Default (included): stats of [1,0,0,1] → rows 0..2 = 0.866, −0.866, −0.866; row 3 masked → 0.
    stats_exclude_masked: stats of [1,0,0]: mean 1/3, unbiased std sqrt((4/9+1/9+1/9)/2) = 0.5774 →
    row 0 = (2/3)/0.5774 = 1.1547, rows 1,2 = (−1/3)/0.5774 = −0.5774.
    """
    mask = [[1, 1], [1, 0], [1, 1], [0, 0]]
    close(run("grpo", [1, 0, 0, 1], [0] * 4, mask)[:, 0], [0.8660, -0.8660, -0.8660, 0.0])
    close(run("grpo", [1, 0, 0, 1], [0] * 4, mask, stats_exclude_masked=True)[:, 0], [1.1547, -0.5774, -0.5774, 0])
    assert (run("grpo", [1, 0, 0, 1], [0] * 4, mask)[~torch.tensor(mask, dtype=torch.bool)] == 0).all()


def test_dr_grpo_hand():
    """rewards [1,0,0,1]: group mean 0.5 and no std, so A = ±0.5."""
    close(run("dr_grpo", [1, 0, 0, 1], [0, 0, 0, 0])[:, 0], [0.5, -0.5, -0.5, 0.5])


def test_token_rewards_enter_outcome():
    """rewards [1, 0]; row 0 has token rewards −0.5, −0.5 (e.g. −β·KL) on its 2 tokens → R = [0, 0] → dr_grpo A = 0.
    Token rewards off the mask are ignored: row 1's 9 sits on a masked position.
    """
    adv = run("dr_grpo", [1, 0], [0, 0], [[1, 1], [1, 0]], [[-0.5, -0.5], [0.0, 9.0]])
    close(adv, [[0, 0], [0, 0]])


def test_batch_norm_hand():
    """rewards [1,0,0,0], lengths [3,1,1,1], groups ignored.
    sequence: mean 0.25, unbiased var (0.5625 + 3·0.0625)/3 = 0.25, std 0.5 → A = [1.5, −0.5, −0.5, −0.5].
    token: tokens [1,1,1,0,0,0], mean 0.5, unbiased var 6·0.25/5 = 0.3, std 0.5477 → A = ±0.5/0.5477 = ±0.9129.
    """
    mask = [[1, 1, 1], [1, 0, 0], [1, 0, 0], [1, 0, 0]]
    close(run("batch_norm", [1, 0, 0, 0], [0, 0, 1, 1], mask)[:, 0], [1.5, -0.5, -0.5, -0.5])
    close(run("batch_norm", [1, 0, 0, 0], [0, 0, 1, 1], mask, weighting="token")[:, 0],
          [0.9129, -0.9129, -0.9129, -0.9129])


def test_lite_ppo_hand():
    """rewards [1,0 | 1,1] in groups 0, 1. Group means 0.5, 1 → centred [0.5, −0.5, 0, 0].
    raw: batch mean 0.75, SS = 3·0.0625 + 0.5625 = 0.75, unbiased var 0.25, std 0.5 → A = [1, −1, 0, 0].
    centered (AReaL): within SS = 0.5, var 0.5/3, std 0.4082 → A = [1.2247, −1.2247, 0, 0].
    """
    close(run("lite_ppo", [1, 0, 1, 1], [0, 0, 1, 1])[:, 0], [1, -1, 0, 0])
    close(run("lite_ppo", [1, 0, 1, 1], [0, 0, 1, 1], std_of="centered")[:, 0], [1.2247, -1.2247, 0, 0])


def test_rloo_hand():
    """rewards [1,0,0,1]: A_0 = 1 − (0+0+1)/3 = 0.6667, A_1 = 0 − (1+0+1)/3 = −0.6667 (= 4/3 · ±0.5)."""
    close(run("rloo", [1, 0, 0, 1], [0] * 4)[:, 0], [0.6667, -0.6667, -0.6667, 0.6667])


def test_reinforce_pp_hand():
    """mask [[1,1],[1,0]], rewards [1, 0], γ = 0.5. Returns: row 0 t1 = 1, t0 = 0.5·1 = 0.5; row 1 t0 = 0.
    Tokens [0.5, 1, 0]: mean 0.5, unbiased var (0 + 0.25 + 0.25)/2 = 0.25 → A = (G − 0.5)/0.5 = [0, 1 | −1].
    """
    adv = run("reinforce_pp", [1, 0], [0, 0], [[1, 1], [1, 0]], gamma=0.5)
    close(adv, [[0, 1], [-1, 0]])


def test_reinforce_pp_token_rewards_and_empty():
    """γ = 1, mask [[1,1],[1,1],[0,0]], rewards [1, 0, 1], token rewards row 1 = [−1, 0].
    Returns: row 0 [1, 1]; row 1 [−1, 0]; row 2 empty (its reward has no token) → 0.
    Tokens [1, 1, −1, 0]: mean 0.25, deviations [.75, .75, −1.25, −.25], SS = 2.75, var 2.75/3, std 0.9574
    → A = [0.7833, 0.7833 | −1.3056, −0.2611 | 0, 0].
    """
    adv = run("reinforce_pp", [1, 0, 1], [0, 0, 0], [[1, 1], [1, 1], [0, 0]], [[0, 0], [-1, 0], [0, 0]])
    close(adv, [[0.7833, 0.7833], [-1.3056, -0.2611], [0, 0]])


def test_reinforce_pp_baseline_hand():
    """rewards [1, 0] in one group, lengths [3, 1]: centred [0.5, −0.5] → tokens [.5, .5, .5, −.5].
    Token mean 0.25, SS = 3·0.0625 + 0.5625 = 0.75, unbiased var 0.25, std 0.5 → A = [0.5 (×3), −1.5].
    (The group's advantages no longer sum to 0: the token-weighted re-centring of §1.2.)
    """
    adv = run("reinforce_pp_baseline", [1, 0], [0, 0], [[1, 1, 1], [1, 0, 0]])
    close(adv, [[0.5, 0.5, 0.5], [-1.5, 0, 0]])


HAND_CASES = {
    "grpo": test_grpo_hand,
    "dr_grpo": test_dr_grpo_hand,
    "batch_norm": test_batch_norm_hand,
    "lite_ppo": test_lite_ppo_hand,
    "rloo": test_rloo_hand,
    "reinforce_pp": test_reinforce_pp_hand,
    "reinforce_pp_baseline": test_reinforce_pp_baseline_hand,
}


def random_batch(seed=0, P=5, G=4, T=6):
    g = torch.Generator().manual_seed(seed)
    rewards_B = torch.randint(0, 2, (P * G,), generator=g).float()
    group_B = torch.arange(P).repeat_interleave(G)[torch.randperm(P * G, generator=g)] * 11 + 3
    lengths_B = torch.randint(1, T + 1, (P * G,), generator=g)
    mask_BT = torch.arange(T)[None, :] < lengths_B[:, None]
    return rewards_B, group_B, mask_BT, torch.zeros(P * G, T)


@pytest.mark.parametrize("name,params", [("grpo", {}), ("lite_ppo", {}), ("lite_ppo", {"std_of": "centered"}),
                                         ("batch_norm", {}), ("batch_norm", {"weighting": "token"}),
                                         ("reinforce_pp", {}), ("reinforce_pp_baseline", {})])
def test_std_normalised_estimators_invariant_to_affine_reward(name, params):
    """r → 2r − 1 scales numerator and std by 2; only eps's relative size changes (§1.7, §9.1)."""
    r, g, m, z = random_batch()
    fn = ADVANTAGES.build(name, params)
    torch.testing.assert_close(fn(2 * r - 1, g, m, z), fn(r, g, m, z), atol=1e-5, rtol=0)


def test_dr_grpo_doubles_under_affine_reward():
    r, g, m, z = random_batch()
    fn = ADVANTAGES.build("dr_grpo")
    torch.testing.assert_close(fn(2 * r - 1, g, m, z), 2 * fn(r, g, m, z), atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", ADVANTAGES.names())
def test_nan_reward_gets_zero_and_is_excluded(name):
    """A NaN row gets A = 0 and the others equal the estimator run without that row."""
    r, g, m, z = random_batch(seed=1)
    fn = ADVANTAGES.build(name)
    r_nan = r.clone()
    r_nan[4] = float("nan")
    keep = torch.arange(len(r)) != 4
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        adv = fn(r_nan, g, m, z)
        expected = fn(r[keep], g[keep], m[keep], z[keep])
    assert torch.isfinite(adv).all() and (adv[4] == 0).all()
    torch.testing.assert_close(adv[keep], expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "lite_ppo", "rloo", "reinforce_pp_baseline"])
def test_grouping_is_by_id_not_position(name):
    """Permuting the rows permutes the advantages: nothing assumes a group's samples are contiguous."""
    r, g, m, z = random_batch(seed=2)
    perm = torch.randperm(len(r), generator=torch.Generator().manual_seed(3))
    fn = ADVANTAGES.build(name)
    torch.testing.assert_close(fn(r[perm], g[perm], m[perm], z[perm]), fn(r, g, m, z)[perm], atol=1e-6, rtol=0)


def test_lite_ppo_raw_vs_centered_within_between():
    """Σ(r − r̄)² = within + between, so A_centered / A_raw = sqrt(SS_total / SS_within) for every row.
    Batch: groups [1,0,0,0], [1,1,1,0], [1,1,1,1]; means 0.25, 0.75, 1; r̄ = 2/3.
    within = 0.75 + 0.75 + 0 = 1.5; between = 4·((0.25−2/3)² + (0.75−2/3)² + (1/3)²) = 1.1667; total = 2.6667.
    """
    r = torch.tensor([1, 0, 0, 0, 1, 1, 1, 0, 1, 1, 1, 1], dtype=torch.float32)
    g = torch.arange(3).repeat_interleave(4)
    m, z = torch.ones(12, 1, dtype=torch.bool), torch.zeros(12, 1)
    within = sum(float(((r[g == k] - r[g == k].mean()) ** 2).sum()) for k in range(3))
    total = float(((r - r.mean()) ** 2).sum())
    between = sum(4 * float((r[g == k].mean() - r.mean()) ** 2) for k in range(3))
    assert within == pytest.approx(1.5) and total == pytest.approx(within + between) == pytest.approx(8 / 3)
    raw = ADVANTAGES.build("lite_ppo")(r, g, m, z)
    cen = ADVANTAGES.build("lite_ppo", {"std_of": "centered"})(r, g, m, z)
    moving = raw.abs() > 0
    ratio = cen[moving] / raw[moving]
    torch.testing.assert_close(ratio, torch.full_like(ratio, math.sqrt(total / within)), atol=1e-4, rtol=0)


def test_rloo_equals_scaled_centring():
    """A = (G/(G−1))·(r − mean_g) exactly, for groups of different sizes (2, 3, 5)."""
    g = torch.tensor([0, 0, 1, 1, 1, 2, 2, 2, 2, 2])
    r = torch.tensor([1, 0, 1, 1, 0, 0, 1, 0, 0, 1], dtype=torch.float32)
    m, z = torch.ones(10, 1, dtype=torch.bool), torch.zeros(10, 1)
    expected = torch.empty(10)
    for k in range(3):
        sel = g == k
        n = int(sel.sum())
        expected[sel] = n / (n - 1) * (r[sel] - r[sel].mean())
    torch.testing.assert_close(ADVANTAGES.build("rloo")(r, g, m, z)[:, 0], expected, atol=1e-6, rtol=0)


def test_zero_std_group_is_exactly_zero():
    """All-equal groups of non-dyadic values centre to exactly 0 (no rounding noise amplified by 1/(std+eps))."""
    r = torch.tensor([0.1, 0.1, 0.1, 0.7, 0.7, 0.7])
    g = torch.tensor([0, 0, 0, 1, 1, 1])
    m, z = torch.ones(6, 2, dtype=torch.bool), torch.zeros(6, 2)
    for name in ["grpo", "dr_grpo", "lite_ppo", "rloo"]:
        assert (ADVANTAGES.build(name)(r, g, m, z) == 0).all(), name
    assert (ADVANTAGES.build("batch_norm")(torch.full((6,), 0.3), g, m, z) == 0).all()


EPS_ZERO_ESTIMATORS = [("grpo", {}), ("batch_norm", {}), ("batch_norm", {"weighting": "token"}), ("lite_ppo", {}),
                       ("lite_ppo", {"std_of": "centered"}), ("reinforce_pp", {}), ("reinforce_pp_baseline", {})]


@pytest.mark.filterwarnings("ignore:advantages")
@pytest.mark.parametrize("name,params", EPS_ZERO_ESTIMATORS)
@pytest.mark.parametrize("rewards,groups", [([1.0, 1.0, 1.0, 1.0], [0, 0, 1, 1]),     # constant batch
                                            ([0.3, 0.3, 0.3, 0.3], [0, 1, 2, 3]),     # groups of one
                                            ([0.7], [0])])                            # one sequence
def test_eps_zero_without_spread_gives_zero_not_nan(name, params, rewards, groups):
    """eps = 0 and nothing to divide by (std 0, var 0): A = 0, never 0/0 = NaN (§1.1, §1.4; style §3.2)."""
    mask = [[1, 1, 0]] * len(rewards)
    assert (run(name, rewards, groups, mask, eps=0.0, **params) == 0).all()


@pytest.mark.filterwarnings("ignore:advantages")
def test_grpo_eps_zero_hand():
    """eps = 0, rewards [1,1 | 0,1 | 0.5] in groups 0, 1, 2: group 0 has std 0 → A = 0; group 1 has mean 0.5 and
    unbiased std sqrt(0.5) = 0.7071 → A = ∓0.5/0.7071 = ∓0.7071; group 2 is a group of one → A = 0."""
    close(run("grpo", [1, 1, 0, 1, 0.5], [0, 0, 1, 1, 2], eps=0.0)[:, 0], [0, 0, -0.7071, 0.7071, 0])


@pytest.mark.parametrize("name,params", EPS_ZERO_ESTIMATORS)
def test_eps_zero_is_the_eps_limit_where_there_is_spread(name, params):
    """With spread in every scope, eps = 0 is the plain formula: it agrees with a tiny eps."""
    r, g, m, z = random_batch(seed=4)
    r[g == g[0]] = torch.tensor([1.0, 0.0, 0.0, 1.0])   # one group sure to have spread
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exact = ADVANTAGES.build(name, {**params, "eps": 0.0})(r, g, m, z)
        near = ADVANTAGES.build(name, {**params, "eps": 1e-12})(r, g, m, z)
    assert torch.isfinite(exact).all() and exact.abs().max() > 0
    torch.testing.assert_close(exact, near, atol=1e-5, rtol=0)
