"""Per-problem metrics over n sampled responses: pass@k, avg@k, maj@k; standard errors of their means.

Averaged over the problems of a benchmark by `evaluate.py`.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Sequence

from literl.rewards.math_answer import normalize_answer_text


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al. 2021, arXiv:2107.03374, Eq. 1):

        pass@k = 1 − C(n−c, k) / C(n, k) = 1 − Π_{i=n−c+1}^{n} (1 − k/i)

    The product form avoids the huge binomials. It is 1 when n − c < k (every k-subset holds a correct
    sample). Plain "any of the first k is correct" (verl's best@k) is biased low against this estimator.
    """
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n (got n={n}, c={c})")
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 1 <= k <= n (got n={n}, k={k})")
    if n - c < k:
        return 1.0
    miss_all = 1.0
    for i in range(n - c + 1, n + 1):
        miss_all *= 1.0 - k / i
    return 1.0 - miss_all


def avg_at_k(correct: Sequence[bool], k: int | None = None) -> float:
    """Mean correctness of the first k samples (all when k is None): avg@k = (1/k) Σ_{j<k} correct_j."""
    k = len(correct) if k is None else k
    if not 1 <= k <= len(correct):
        raise ValueError(f"avg_at_k needs 1 <= k <= {len(correct)} samples (got k={k})")
    return sum(bool(x) for x in correct[:k]) / k


def maj_at_k(answers: Sequence[str | None], correct: Sequence[bool], k: int | None = None) -> float:
    """Majority vote over the first k extracted answers: 1.0 if the most common answer is correct.

    Answers are grouped by `normalize_answer_text` (so "\\dfrac{1}{2}" and "\\frac{1}{2}" vote together,
    while "0.5" is a different answer). Samples without an answer (None) do not vote; if none voted the
    result is 0. Ties go to the answer whose first vote came earliest (lowest sample index), which makes
    maj@1 = correctness of the first sample. The group's correctness is that of its earliest sample.
    """
    k = len(answers) if k is None else k
    if len(answers) != len(correct):
        raise ValueError(f"maj_at_k got {len(answers)} answers but {len(correct)} correctness flags")
    if not 1 <= k <= len(answers):
        raise ValueError(f"maj_at_k needs 1 <= k <= {len(answers)} samples (got k={k})")
    keys = [normalize_answer_text(a) if a is not None else None for a in answers[:k]]
    votes = Counter(key for key in keys if key)
    if not votes:
        return 0.0
    first_index = {}
    for index, key in enumerate(keys):
        if key and key not in first_index:
            first_index[key] = index
    winner = max(votes, key=lambda key: (votes[key], -first_index[key]))
    return 1.0 if correct[first_index[winner]] else 0.0


def k_values(samples: int) -> list[int]:
    """The k reported for pass@k and maj@k: 1, 2, 4, ... up to `samples`, and `samples` itself."""
    if samples < 1:
        raise ValueError(f"samples must be >= 1 (got {samples})")
    ks, k = [], 1
    while k <= samples:
        ks.append(k)
        k *= 2
    if ks[-1] != samples:
        ks.append(samples)
    return ks


SE_METHOD = ("standard error of the mean of per-problem averages, sqrt(sum_i (p_i - mean)^2 / (N (N - 1))) over "
             "the N problems' p_i = c_i / K: problems are the clusters, so it covers both which problems were drawn "
             "and which samples each got (the clustered SE of Miller 2024, arXiv:2411.00640, with equal cluster "
             "sizes); for the mean over B benchmarks, sqrt(sum_b SE_b^2) / B (benchmarks independent)")


def standard_error_of_mean(values: Sequence[float]) -> float | None:
    """sqrt(Σ (v − mean)² / (N (N − 1))): the standard error of the mean of N values; None for N < 2.

    Over per-problem accuracies p_i = c_i / K this is the clustered standard error of avg@K (problems are the
    clusters, their K samples the observations; see SE_METHOD).
    """
    n = len(values)
    if n < 2:
        return None
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n * (n - 1)))


SAMPLING_SE_METHOD = ("standard error of avg@K from the sampling of responses alone, the problems held fixed: "
                      "sqrt(sum_i p_i (1 - p_i) / (K - 1)) / N over the N problems' p_i = c_i / K (Miller 2024, "
                      "arXiv:2411.00640, §3: the conditional variance given the questions; p_i (1 - p_i) / (K - 1) "
                      "is the unbiased estimate of Var(c_i / K)); None for K < 2. Two runs scored on the same "
                      "problems differ by noise of variance se_a^2 + se_b^2 even when their policies are equal")


def sampling_standard_error(num_correct: Sequence[int], samples: int) -> float | None:
    """The standard error of avg@K that comes from which K responses each problem drew, the N problems fixed.

    sqrt(Σ_i p_i (1 − p_i) / (K − 1)) / N with p_i = c_i / K; None when K < 2 (one sample per problem says nothing
    of its spread) or N = 0. This is the part of the noise of a paired difference between two runs evaluated on
    the same problems that a larger evaluation removes (SAMPLING_SE_METHOD). c = [1, 3], K = 4: p = 0.25, 0.75,
    Σ p (1 − p) / 3 = (0.1875 + 0.1875) / 3 = 0.125, sqrt(0.125) / 2 = 0.17678.
    """
    n = len(num_correct)
    if samples < 2 or n == 0:
        return None
    if any(not 0 <= c <= samples for c in num_correct):
        raise ValueError(f"num_correct must lie in [0, samples={samples}] (got {list(num_correct)})")
    spread = sum((c / samples) * (1 - c / samples) for c in num_correct) / (samples - 1)
    return math.sqrt(spread) / n


def mean_with_standard_error(means: Sequence[float], errors: Sequence[float | None]) -> tuple[float, float | None]:
    """The unweighted mean of B benchmark scores (as papers report their 'average') and its standard error
    sqrt(Σ SE_b²) / B, treating the benchmarks as independent; the SE is None when any SE_b is."""
    if not means:
        raise ValueError("mean_with_standard_error needs at least one benchmark")
    mean = sum(means) / len(means)
    if any(e is None for e in errors):
        return mean, None
    return mean, math.sqrt(sum(e * e for e in errors)) / len(means)
