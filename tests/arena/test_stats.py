"""The arena's statistics on numbers worked out by hand (literl/arena/stats.py)."""

from __future__ import annotations

import math

import pytest

from literl.arena import stats


@pytest.mark.parametrize("df, expected", [(1, 12.706205), (2, 4.302653), (4, 2.776445), (10, 2.228139),
                                          (30, 2.042272), (1000, 1.962339)])
def test_t_quantile_matches_the_tables(df, expected):
    """Two-sided 95% critical values of Student's t (any statistics table)."""
    assert stats.t_quantile(0.975, df) == pytest.approx(expected, abs=1e-5)
    assert stats.t_quantile(0.025, df) == pytest.approx(-expected, abs=1e-5)


def test_t_cdf_has_the_cauchy_closed_form_at_one_degree_of_freedom():
    """df = 1 is the Cauchy distribution: P(T ≤ t) = 1/2 + atan(t)/π."""
    for t in (-3.0, -0.5, 0.0, 0.7, 10.0):
        assert stats.t_cdf(t, 1) == pytest.approx(0.5 + math.atan(t) / math.pi, abs=1e-10)


def test_mean_interval_of_one_two_three():
    """[1, 2, 3]: mean 2, s = 1, half width t_{2,0.975}·1/√3 = 4.302653/1.732051 = 2.484138."""
    interval = stats.mean_interval([1.0, 2.0, 3.0])
    assert interval.mean == pytest.approx(2.0)
    assert interval.half_width == pytest.approx(2.484138, abs=1e-6)
    assert (interval.low, interval.high) == pytest.approx((2 - 2.484138, 2 + 2.484138), abs=1e-6)


def test_mean_interval_with_one_or_no_value_has_no_spread():
    assert stats.mean_interval([0.4]) == stats.Interval(0.4, None, None, 1)
    assert stats.mean_interval([]) == stats.Interval(None, None, None, 0)


def test_area_under_curve_is_the_trapezoid_mean():
    """steps [0, 10, 20], acc [0.2, 0.4, 0.4]: area 10·0.3 + 10·0.4 = 7, span 20 → 0.35.
    Uneven steps [0, 5, 20], acc [0, 1, 1]: 5·0.5 + 15·1 = 17.5 → 0.875. One point: that point."""
    assert stats.area_under_curve([0, 10, 20], [0.2, 0.4, 0.4]) == pytest.approx(0.35)
    assert stats.area_under_curve([0, 5, 20], [0.0, 1.0, 1.0]) == pytest.approx(0.875)
    assert stats.area_under_curve([3], [0.6]) == pytest.approx(0.6)


def test_area_under_curve_rejects_bad_curves():
    with pytest.raises(ValueError, match="equally long"):
        stats.area_under_curve([0, 1], [0.5])
    with pytest.raises(ValueError, match="increasing"):
        stats.area_under_curve([5, 5], [0.5, 0.6])


def test_curve_scores_final_best_auc():
    scores = stats.curve_scores([0, 10, 20], [0.2, 0.5, 0.4])
    assert scores == pytest.approx({"final": 0.4, "best": 0.5, "auc": (10 * 0.35 + 10 * 0.45) / 20})


def test_bootstrap_of_three_pairs_spans_their_range_and_is_reproducible():
    """With 3 values each extreme is drawn in 1/27 ≈ 3.7% > 2.5% of the resamples, so the percentile
    interval is [min, max]."""
    first = stats.bootstrap_interval([0.1, 0.2, 0.3])
    assert first.mean == pytest.approx(0.2)
    assert (first.low, first.high) == pytest.approx((0.1, 0.3))
    assert stats.bootstrap_interval([0.1, 0.2, 0.3]) == first


def test_bootstrap_narrows_with_more_pairs_and_is_exact_for_constant_pairs():
    many = stats.bootstrap_interval([0.1, 0.2, 0.3] * 10)
    assert 0.1 < many.low < 0.2 < many.high < 0.3
    constant = stats.bootstrap_interval([0.05, 0.05, 0.05])
    assert (constant.mean, constant.low, constant.high) == pytest.approx((0.05, 0.05, 0.05))


def test_verdict_reads_the_interval_against_zero():
    assert stats.verdict(stats.Interval(0.1, 0.02, 0.2, 3)) == stats.HELPS
    assert stats.verdict(stats.Interval(-0.1, -0.2, -0.01, 3)) == stats.HURTS
    assert stats.verdict(stats.Interval(0.05, -0.01, 0.1, 3)) == stats.NO_DIFFERENCE
    assert stats.verdict(stats.Interval(0.0, 0.0, 0.0, 3)) == stats.NO_DIFFERENCE
    assert stats.verdict(stats.Interval(0.1, None, None, 1)) == stats.TOO_FEW


def test_compare_pairs_by_key_and_ignores_unpaired_runs():
    """Variant seeds 0,1,2 vs baseline seeds 0,1,3: only seeds 0 and 1 pair, diffs [0.1, 0.3]."""
    variant = {("s", 0): 0.6, ("s", 1): 0.8, ("s", 2): 0.9}
    baseline = {("s", 0): 0.5, ("s", 1): 0.5, ("s", 3): 0.1}
    result = stats.compare(variant, baseline)
    assert result["n_pairs"] == 2
    assert result["diffs"] == pytest.approx([0.1, 0.3])
    assert result["mean_diff"] == pytest.approx(0.2)
    assert result["verdict"] == stats.HELPS
    # paired t: mean 0.2, s = 0.141421, t_{1} = 12.706205 → half width 1.270620
    assert result["t_ci_high"] - 0.2 == pytest.approx(12.706205 * 0.141421356 / math.sqrt(2), abs=1e-5)


def test_trapezoid_weights_reproduce_the_area_under_the_curve():
    """steps 0, 5, 10: half of each neighbouring interval over the span, (2.5, 5, 2.5) / 10; uneven steps 0, 2, 10:
    (1, 5, 4) / 10. Σ w_k y_k is the AUC."""
    weights = stats.trapezoid_weights([0, 2, 10])
    assert stats.trapezoid_weights([0, 5, 10]) == pytest.approx([0.25, 0.5, 0.25])
    assert weights == pytest.approx([0.1, 0.5, 0.4])
    assert stats.trapezoid_weights([7]) == [1.0]
    y = [0.3, 0.7, 0.4]
    assert sum(w * v for w, v in zip(weights, y)) == pytest.approx(stats.area_under_curve([0, 2, 10], y))
    with pytest.raises(ValueError, match="increasing"):
        stats.trapezoid_weights([3, 3])
