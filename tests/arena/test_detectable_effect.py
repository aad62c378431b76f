"""What a comparison could have detected: the minimum detectable effect and the seeds an effect needs
(literl/arena/stats.py), worked out by hand from t tables, and where the summary and report show them."""

from __future__ import annotations

import json
import math

import pytest

from literl.arena import ablation, stats
from tests.arena.test_summary import comparison, make_ablation

# Student-t quantiles from any table: t_{0.975, df} and t_{0.80, df}
T975 = {1: 12.706205, 2: 4.302653, 3: 3.182446, 4: 2.776445}
T80 = {1: 1.376382, 2: 1.060660, 3: 0.978472, 4: 0.940965}


@pytest.mark.parametrize("df", [1, 2, 3, 4])
def test_the_power_quantile_matches_the_tables(df):
    assert stats.t_quantile(0.80, df) == pytest.approx(T80[df], abs=1e-5)


def test_minimum_detectable_effect_of_three_paired_differences():
    """d = [0.01, 0.03, 0.02]: s_d = 0.01, n = 3, MDE = (t_{.975,2} + t_{.80,2})·s_d/√3
    = (4.302653 + 1.060660)·0.01/1.732051 = 0.030965."""
    assert stats.minimum_detectable_effect([0.01, 0.03, 0.02]) == pytest.approx(0.030965, abs=1e-6)


def test_seeds_needed_is_the_first_n_whose_mde_reaches_the_effect():
    """Effect 0.02 at s_d 0.01 needs (t_{.975,n−1} + t_{.80,n−1})/√n ≤ 2:
    n = 3: 5.363313/1.732051 = 3.0965 > 2;  n = 4: (3.182446 + 0.978472)/2 = 2.0805 > 2;
    n = 5: (2.776445 + 0.940965)/2.236068 = 1.6625 ≤ 2  →  5 seeds."""
    assert (T975[3] + T80[3]) / 2 > 2 and (T975[4] + T80[4]) / math.sqrt(5) <= 2
    assert stats.seeds_needed(0.02, 0.01) == 5
    assert stats.seeds_needed(-0.02, 0.01) == 5           # the sign of the effect does not matter


def test_a_tiny_effect_needs_the_normal_approximations_seed_count():
    """For large n the t quantiles tend to z: n ≈ ((1.959964 + 0.841621)·s_d/effect)² = 78,489 at
    effect/s_d = 0.01; the t quantiles add a seed or two."""
    n = stats.seeds_needed(1e-4, 1e-2)
    assert 78_489 <= n <= 78_495
    assert stats.seeds_needed(1e-6, 1.0) is None           # beyond MAX_SEEDS_NEEDED


def test_no_spread_or_no_effect_edge_cases():
    assert stats.minimum_detectable_effect([0.1]) is None and stats.minimum_detectable_effect([]) is None
    assert stats.minimum_detectable_effect([0.25, 0.25, 0.25]) == 0.0   # exact in binary: s_d = 0
    assert stats.seeds_needed(0.0, 0.01) is None and stats.seeds_needed(None, 0.01) is None
    assert stats.seeds_needed(0.05, 0.0) == 2


def test_every_comparison_in_the_summary_gives_its_mde_and_seeds_needed(tmp_path):
    """The hand-made ablation: same − base = [−0.02, 0, +0.02], s_d = 0.02, MDE = 5.363313·0.02/√3 = 0.061930,
    no observed effect so no seed count; better − base = [0.09, 0.10, 0.11], s_d = 0.01, Δ = 0.1: already at
    n = 2 (12.706205 + 1.376382)/√2 = 9.958 ≤ 10."""
    make_ablation(tmp_path)
    summary = ablation.summarize_ablation(tmp_path)
    same = comparison(summary, "same", "s1")["final"]
    assert same["sd_diff"] == pytest.approx(0.02) and same["mde"] == pytest.approx(0.061930, abs=1e-6)
    assert same["seeds_needed"] is None
    better = comparison(summary, "better", "s1")["final"]
    assert better["mde"] == pytest.approx(0.030965, abs=1e-6) and better["seeds_needed"] == 2
    assert all("mde" in c[s] and "seeds_needed" in c[s] for c in summary["comparisons"] for s in stats.SCORES)
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert "power 80%" in on_disk["intervals"]["detectable"] and "t_{power, n-1}" in on_disk["intervals"]["detectable"]
    page = (tmp_path / "report.html").read_text()
    assert "MDE 0.062, Δ = 0" in page and "MDE 0.031, 2 seeds for Δ" in page
