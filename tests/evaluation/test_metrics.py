"""pass@k, avg@k and maj@k against values worked out by hand."""

from __future__ import annotations

import math

import pytest

from literl.evaluation.sample_metrics import avg_at_k, k_values, maj_at_k, pass_at_k, sampling_standard_error

PASS_AT_K_CASES = [
    # (n, c, k, expected, arithmetic)
    (4, 0, 1, 0.0, "no correct sample"),
    (4, 4, 2, 1.0, "all correct"),
    (4, 1, 1, 0.25, "c/n"),
    (4, 1, 2, 0.5, "1 - C(3,2)/C(4,2) = 1 - 3/6"),
    (4, 2, 2, 5 / 6, "1 - C(2,2)/C(4,2) = 1 - 1/6"),
    (5, 2, 3, 0.9, "1 - C(3,3)/C(5,3) = 1 - 1/10"),
    (8, 3, 4, 13 / 14, "1 - C(5,4)/C(8,4) = 1 - 5/70"),
    (4, 3, 2, 1.0, "n - c = 1 < k = 2: every pair holds a correct one"),
    (10, 1, 10, 1.0, "k = n"),
]


@pytest.mark.parametrize("n,c,k,expected,arithmetic", PASS_AT_K_CASES)
def test_pass_at_k_hand_cases(n, c, k, expected, arithmetic):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12), arithmetic


def test_pass_at_k_matches_the_binomial_form_and_is_stable():
    for n, c, k in [(16, 5, 4), (64, 10, 8), (100, 37, 50)]:
        assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), rel=1e-12)
    value = pass_at_k(1000, 1, 1)          # binomials of this size overflow floats; the product does not
    assert value == pytest.approx(0.001)
    assert 0.0 < pass_at_k(2000, 3, 700) < 1.0


@pytest.mark.parametrize("n,c,k", [(4, 5, 1), (4, -1, 1), (4, 1, 0), (4, 1, 5)])
def test_pass_at_k_rejects_impossible_counts(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_avg_at_k():
    correct = [True, False, True, True]
    assert avg_at_k(correct) == 0.75
    assert avg_at_k(correct, 2) == 0.5             # first two: 1 of 2
    with pytest.raises(ValueError):
        avg_at_k(correct, 5)


def test_maj_at_k_hand_cases():
    """Votes are grouped by normalised text; ties go to the answer voted first; None does not vote."""
    answers = ["5", "\\dfrac{1}{2}", "\\frac{1}{2}", "7", None]
    correct = [False, True, True, False, False]
    assert maj_at_k(answers, correct) == 1.0        # 1/2 has 2 votes (dfrac = frac), 5 and 7 have 1
    assert maj_at_k(answers, correct, 1) == 0.0     # only "5"
    assert maj_at_k(answers, correct, 2) == 0.0     # tie 5 vs 1/2: "5" was voted first
    assert maj_at_k(["3", "4", "4", "3"], [True, False, False, True]) == 1.0   # tie 2-2: "3" first
    assert maj_at_k([None, None], [False, False]) == 0.0
    assert maj_at_k([None, "2"], [False, True]) == 1.0
    assert maj_at_k(["0.5", "\\frac{1}{2}", "0.5"], [True, True, True], 3) == 1.0


def test_k_values():
    assert k_values(1) == [1]
    assert k_values(4) == [1, 2, 4]
    assert k_values(6) == [1, 2, 4, 6]
    assert k_values(8) == [1, 2, 4, 8]


def test_sampling_standard_error_is_the_responses_part_of_avg_at_k_noise_with_problems_fixed():
    """c = [1, 3] of K = 4: p = 0.25, 0.75, Σ p (1 − p) / (K − 1) = 0.375 / 3 = 0.125, / N = 2: sqrt(0.125) / 2
    = 0.176777. Problems always or never solved add nothing: c = [0, 4] -> 0. One sample per problem, or no
    problem, says nothing of the spread: None."""
    assert sampling_standard_error([1, 3], 4) == pytest.approx(math.sqrt(0.125) / 2)
    assert sampling_standard_error([0, 4], 4) == 0.0
    assert sampling_standard_error([1], 2) == pytest.approx(0.5)     # p = 0.5: sqrt(0.25 / (K − 1 = 1)) / 1
    assert sampling_standard_error([1, 0], 1) is None
    assert sampling_standard_error([], 4) is None
    with pytest.raises(ValueError, match="num_correct"):
        sampling_standard_error([5], 4)
