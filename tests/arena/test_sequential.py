"""The sequential design's statistics (literl.arena.sequential): the spending function and boundaries against
hand-computed and published values, the decisions of one look, and simulations of whole designs (not timed)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from literl.arena import stats
from literl.arena.sequential import (CONTINUE, EQUIVALENT, SequentialDesign, decide, normal_quantile, parse_design,
                                     run_looks, simulate, spent_alpha, t_boundaries, z_boundaries)
from literl.config.errors import ConfigError

ALPHA = 0.05
MC_SIMS = 4000
MC_SE = math.sqrt(ALPHA * (1 - ALPHA) / MC_SIMS)      # 0.00345: three of them is the tolerance below


def test_the_looks_are_first_then_each_step_up_to_the_ceiling():
    assert SequentialDesign(4, 4, 16).looks() == [4, 8, 12, 16]
    assert SequentialDesign(2, 2, 8).looks() == [2, 4, 6, 8]
    assert SequentialDesign(3, 4, 9).looks() == [3, 7, 9]       # the last wave is short
    assert SequentialDesign(5, 1, 5).looks() == [5]


def test_the_spending_function_spends_all_of_alpha_at_the_end_and_almost_nothing_early():
    """α(t) = 2(2 − 2Φ(z_{0.9875}/√t)), z_{0.9875} = 2.2414: α(1) = 0.05; α(1/4) = 4(1 − Φ(4.4828)) = 1.47e-5;
    α(1/2) = 4(1 − Φ(3.1698)) = 4 · 7.63e-4 = 0.00305."""
    assert spent_alpha(1.0) == ALPHA and spent_alpha(0.0) == 0.0
    assert spent_alpha(0.25) == pytest.approx(1.47e-5, rel=0.02)
    assert spent_alpha(0.5) == pytest.approx(0.00305, rel=0.01)


def test_one_look_is_the_fixed_sample_test_and_the_first_boundary_is_closed_form():
    """One look at t = 1: c = z_{0.975} = 1.95996. The first look spends α(t_1) alone, half on each side:
    at t_1 = 1/4 the per-side spend is 2 − 2Φ(z_{0.9875}/√(1/4)) = 2(1 − Φ(4.4828)) = 7.37e-6, so
    c_1 = Φ⁻¹(1 − 7.37e-6) = 4.3326."""
    assert z_boundaries([1.0]) == [pytest.approx(1.959964, abs=1e-5)]
    upper_tail = 0.5 * math.erfc(4.482807 / math.sqrt(2))          # 1 − Φ(4.4828) = 3.68e-6
    expected = normal_quantile(1 - 2 * upper_tail)
    assert z_boundaries([0.25, 1.0])[0] == pytest.approx(expected, abs=1e-5)
    assert expected == pytest.approx(4.3326, abs=1e-3)


def test_boundaries_match_the_published_obrien_fleming_type_values():
    """Lan–DeMets O'Brien–Fleming-type, two-sided α = 0.05 (gsDesign sfLDOF, test.type 2; ldbounds):
    two equal looks 2.963, 1.969; four equal looks 4.333, 2.963, 2.359, 2.014."""
    assert z_boundaries([0.5, 1.0]) == pytest.approx([2.963, 1.969], abs=1e-3)
    assert z_boundaries([0.25, 0.5, 0.75, 1.0]) == pytest.approx([4.333, 2.963, 2.359, 2.014], abs=1e-3)


def test_t_boundaries_keep_the_nominal_level_of_each_z_boundary():
    """Look 4 of 2,2,8 (n = 8, z 2.014): nominal p = 2(1 − Φ(2.014)) = 0.0440, b = t_{0.978, 7} = 2.45 (wider
    than z: 7 degrees of freedom)."""
    b = t_boundaries([2, 4, 6, 8], 8)
    p = 2 * (1 - 0.5 * math.erfc(-2.0141 / math.sqrt(2)))
    assert b[3] == pytest.approx(stats.t_quantile(1 - p / 2, 7), abs=1e-3) and b[3] == pytest.approx(2.452, abs=2e-3)
    assert b[0] > 1000 and b[1] == pytest.approx(8.85, abs=0.05)


def test_a_look_decides_from_its_repeated_confidence_interval():
    """d = [0.10, 0.12, 0.08, 0.10]: mean 0.10, s = √(0.0008/3) = 0.016330, s/√4 = 0.008165. Boundary 3:
    RCI 0.10 ± 0.0245 = [0.0755, 0.1245] → helps; negated → hurts. d = [0.01, −0.01, 0.01, −0.01] (mean 0,
    s = 0.011547, s/2 = 0.005774), boundary 3: RCI ±0.01732 → inside margin 0.02: equivalent; margin 0.015 or
    none: next wave, and at the ceiling no detectable difference."""
    look = decide([0.10, 0.12, 0.08, 0.10], 3.0, None, final=False)
    assert look.decision == stats.HELPS and (look.low, look.high) == pytest.approx((0.075505, 0.124495), abs=1e-5)
    assert decide([-0.10, -0.12, -0.08, -0.10], 3.0, None, final=False).decision == stats.HURTS
    flat = [0.01, -0.01, 0.01, -0.01]
    assert decide(flat, 3.0, 0.02, final=False).decision == EQUIVALENT
    assert decide(flat, 3.0, 0.015, final=False).decision == CONTINUE
    assert decide(flat, 3.0, None, final=True).decision == stats.NO_DIFFERENCE


def test_looks_stop_at_the_first_decision():
    """2,2,8 on differences −0.3 ± a little: n = 2 has b ≈ 43,000 (no decision: RCI ±43,000·0.0071); n = 4 has b =
    8.85 and s/√4 ≈ 0.0065, RCI ≈ −0.3 ± 0.057 → hurts at look 2; looks 3 and 4 are not made."""
    diffs = [-0.29, -0.31, -0.30, -0.30, -0.31, -0.29, -0.30, -0.30]
    looks = run_looks(diffs, SequentialDesign(2, 2, 8))
    assert [look.decision for look in looks] == [CONTINUE, stats.HURTS]
    assert [look.n for look in looks] == [2, 4]


def test_parse_design_names_the_problem_and_the_fix():
    assert parse_design("4,4,16", "--sequential") == SequentialDesign(4, 4, 16)
    assert parse_design({"first": 2, "step": 2, "max": 8, "margin": 0.02}, "s").margin == 0.02
    for bad, message in [("4,4", "three integers"), ({"first": 1, "step": 1, "max": 4}, "first >= 2"),
                         ({"first": 4, "step": 4}, "missing max"), ({"first": 4, "step": 4, "max": 2}, "max >= first"),
                         ({"first": 2, "step": 2, "max": 8, "margin": -1}, "margin must be a positive"),
                         ({"first": 2, "step": 2, "max": 8, "score": "mean"}, "score 'mean'"),
                         ({"first": 2, "step": 2, "max": 8, "waves": 3}, "unknown key")]:
        with pytest.raises(ConfigError, match=message):
            parse_design(bad, "s")


@pytest.mark.parametrize("design", [SequentialDesign(2, 2, 8), SequentialDesign(4, 4, 16),
                                    SequentialDesign(4, 4, 16, margin=0.5)])
def test_under_no_effect_the_false_positive_rate_stays_at_alpha(design):
    """4,000 simulated ablations, paired differences N(0, 1): helps + hurts within 3 Monte-Carlo standard errors
    (3 · √(0.05 · 0.95 / 4000) = 0.0103) of α = 0.05. Naively testing at α at each of the 4 looks would give
    about 0.11 (checked below, so the test can fail)."""
    result = simulate(design, effect=0.0, sd=1.0, sims=MC_SIMS)
    assert abs(result.resolved - ALPHA) < 3 * MC_SE
    naive = simulate(design, 0.0, 1.0, sims=MC_SIMS, boundaries=[stats.t_quantile(0.975, n - 1)
                                                                  for n in design.looks()])
    assert naive.resolved > ALPHA + 5 * MC_SE


def test_two_identical_arms_scored_with_evaluation_noise_never_exceed_alpha():
    """Identical arms: each seed's two runs have the same true accuracy p_seed ~ U(0.4, 0.6), each scored on 800
    samples (binomial), so differences are discrete and their spread is evaluation noise alone. 4,000 ablations
    of 2,2,8 call helps or hurts at a rate within Monte-Carlo error of α."""
    rng = np.random.default_rng(1)
    p = rng.uniform(0.4, 0.6, size=(MC_SIMS, 8))
    draws = (rng.binomial(800, p) - rng.binomial(800, p)) / 800
    result = simulate(SequentialDesign(2, 2, 8), 0.0, 1.0, draws=draws)
    assert result.resolved < ALPHA + 3 * MC_SE


def test_under_a_large_effect_most_comparisons_stop_at_the_first_wave():
    """4,4,16: look 1 (n = 4, t = 1/4) has z boundary 4.333, nominal p = 1.47e-5, t boundary t_{1−p/2, 3} = 53.1.
    An effect of 40 paired standard deviations gives t ≈ 40 · √4 = 80 > 53: most stop at wave 1, all called
    helps. An effect of 3 sd gives t ≈ 6 at look 1 (continue) and ≈ 8.5 at look 2 (n = 8, boundary 4.43):
    almost all stop at wave 2, using about 8 of the 16 seeds."""
    result = simulate(SequentialDesign(4, 4, 16), effect=40.0, sd=1.0, sims=MC_SIMS)
    assert result.stopped_at[0] > 0.5 and result.helps == 1.0
    moderate = simulate(SequentialDesign(4, 4, 16), effect=3.0, sd=1.0, sims=MC_SIMS)
    assert moderate.stopped_at[1] > 0.9 and moderate.expected_seeds < 9 and moderate.helps == 1.0


def test_a_look_whose_differences_are_all_equal_cannot_size_its_interval():
    """d = [0.01, 0.01]: s = 0, so t = ∞ at any boundary; with discrete scores (accuracy on 800 samples) such ties
    happen by chance (1.3% of identical-arm pairs at n = 2), so no spread means no helps/hurts: next wave. All
    differences exactly 0 (a trick that changes nothing) is equivalent when a margin is stated."""
    assert decide([0.01, 0.01], 5.0, None, final=False).decision == CONTINUE
    assert decide([0.01, 0.01], 5.0, 0.1, final=True).decision == stats.NO_DIFFERENCE
    assert decide([0.0, 0.0, 0.0], 5.0, 0.02, final=False).decision == EQUIVALENT
