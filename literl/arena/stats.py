"""The arena's statistics, on plain numbers (no files, no torch): scores of one curve, intervals over seeds,
paired differences against the baseline and the verdict.

Scores of one run, from its held-out accuracy curve (step_k, acc_k), k = 0..K, sorted by step:
    final  acc_K (the "after" evaluation)
    best   max_k acc_k (the "before" evaluation included, so a variant that only hurts scores its start)
    auc    Σ_k (step_{k+1} − step_k)(acc_k + acc_{k+1})/2 / (step_K − step_0)
           the trapezoid area under the curve divided by the step span: the curve's average accuracy over
           training, on the accuracy scale, comparable across runs of different lengths (one point: acc_0)

Over seeds, mean ± t_{n−1, 0.975} · s/√n (s: the unbiased sample std), the Student-t 95% interval.

Paired difference of a variant against the baseline: d_i = score(variant, scenario, seed) −
score(baseline, same scenario, same seed), over the pairs both have. Its 95% interval is the percentile
bootstrap of the mean: BOOTSTRAP_RESAMPLES resamples of the n differences with replacement from
numpy's default_rng(BOOTSTRAP_SEED), the 2.5th and 97.5th percentiles of the resampled means. The paired t
interval is reported beside it.

Verdict (higher is better): "helps" when the bootstrap interval lies above 0, "hurts" when it lies below 0,
"no detectable difference" when it contains 0, "too few pairs" with fewer than 2 pairs. With 3 pairs the
percentile interval is simply [min d, max d] (each extreme is drawn in 1/27 > 2.5% of resamples), so
"helps" means every seed improved; with no true effect that happens by chance in 1 of 8 comparisons, which
is why the t interval (wider) is shown too.

What a comparison could have detected (paired t, α = DETECT_ALPHA two-sided, power DETECT_POWER = 1 − β):
    MDE = (t_{1−α/2, n−1} + t_{1−β, n−1}) · s_d / √n
with s_d the sample std (ddof 1) of the n paired differences: the smallest true mean difference that a
paired t test at this n would detect with that power, given the observed spread. Seeds needed: the smallest
n ≥ 2 whose MDE (same s_d) is at most the observed |mean difference|. Both use the central-t approximation
of the power calculation (the exact one uses the noncentral t and needs slightly more seeds at small n); with
n < 2 there is no spread and both are None.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

CONFIDENCE = 0.95
BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0
HELPS, HURTS, NO_DIFFERENCE, TOO_FEW = "helps", "hurts", "no detectable difference", "too few pairs"
SCORES = ("final", "best", "auc")
DETECT_ALPHA, DETECT_POWER = 0.05, 0.80
MAX_SEEDS_NEEDED = 100_000     # beyond this "seeds needed" is reported as None (effectively undetectable)
FLOAT_NOISE = 1e-12            # a mean difference this small is rounding (e.g. 0.51 − 0.5 − 0.01), not an effect
DETECTION_METHOD = (f"paired t, alpha = {DETECT_ALPHA} two-sided, power {DETECT_POWER:.0%}: "
                    "MDE = (t_{1-alpha/2, n-1} + t_{power, n-1}) * s_d / sqrt(n), s_d the std of the paired "
                    "differences; seeds_needed: the smallest n whose MDE at this s_d is <= |mean difference| "
                    "(central-t approximation)")


@dataclass(frozen=True)
class Interval:
    """A mean with its interval; low/high are None when n < 2 (no spread to estimate)."""

    mean: float | None
    low: float | None
    high: float | None
    n: int

    @property
    def half_width(self) -> float | None:
        return None if self.low is None or self.high is None else (self.high - self.low) / 2

    def as_dict(self) -> dict:
        return {**asdict(self), "half_width": self.half_width}


# ---------------------------------------------------------------------------------------------- one curve
def area_under_curve(steps: Sequence[float], values: Sequence[float]) -> float:
    """Trapezoid area under values(steps) divided by the step span (a mean accuracy); see the module doc."""
    if len(steps) != len(values) or not steps:
        raise ValueError(f"area_under_curve needs equally long, non-empty steps and values "
                         f"(got {len(steps)} and {len(values)})")
    if len(steps) == 1:
        return float(values[0])
    span = steps[-1] - steps[0]
    if span <= 0:
        raise ValueError(f"area_under_curve needs increasing steps, got {list(steps)}")
    area = sum((steps[k + 1] - steps[k]) * (values[k] + values[k + 1]) / 2 for k in range(len(steps) - 1))
    return float(area / span)


def trapezoid_weights(steps: Sequence[float]) -> list[float]:
    """w_k with area_under_curve(steps, y) = Σ_k w_k · y_k: half of each neighbouring interval, over the span.

    steps 0, 5, 10: (2.5, 5, 2.5) / 10 = 0.25, 0.5, 0.25. One step: [1.0]."""
    if len(steps) == 1:
        return [1.0]
    span = steps[-1] - steps[0]
    if span <= 0:
        raise ValueError(f"trapezoid_weights needs increasing steps, got {list(steps)}")
    return [((steps[k] - steps[k - 1] if k > 0 else 0) + (steps[k + 1] - steps[k] if k + 1 < len(steps) else 0))
            / 2 / span for k in range(len(steps))]


def curve_scores(steps: Sequence[float], values: Sequence[float]) -> dict[str, float]:
    """final, best and auc of one run's accuracy curve (steps ascending)."""
    return {"final": float(values[-1]), "best": float(max(values)), "auc": area_under_curve(steps, values)}


# ---------------------------------------------------------------------------------------------- intervals
def mean_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> Interval:
    """Mean ± t_{n−1, (1+confidence)/2} · s/√n over seeds."""
    x = np.asarray(values, dtype=float)
    n = len(x)
    if n == 0:
        return Interval(None, None, None, 0)
    mean = float(x.mean())
    if n < 2:
        return Interval(mean, None, None, n)
    half = t_quantile((1 + confidence) / 2, n - 1) * float(x.std(ddof=1)) / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n)


def bootstrap_interval(values: Sequence[float], confidence: float = CONFIDENCE,
                       resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> Interval:
    """Percentile bootstrap interval of the mean (seeded, so a summary is reproducible)."""
    x = np.asarray(values, dtype=float)
    n = len(x)
    if n < 2:
        return Interval(float(x.mean()) if n else None, None, None, n)
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, n, size=(resamples, n))].mean(axis=1)
    alpha = 1 - confidence
    low, high = np.percentile(means, [100 * alpha / 2, 100 * (1 - alpha / 2)])
    return Interval(float(x.mean()), float(low), float(high), n)


def verdict(interval: Interval) -> str:
    """helps / hurts / no detectable difference, from an interval of (variant − baseline)."""
    if interval.low is None or interval.high is None:
        return TOO_FEW
    if interval.low > 0:
        return HELPS
    if interval.high < 0:
        return HURTS
    return NO_DIFFERENCE


def paired_differences(variant: dict, baseline: dict) -> tuple[list, list[float]]:
    """Differences variant[k] − baseline[k] over the keys (scenario, seed) both have, in sorted key order."""
    keys = sorted(set(variant) & set(baseline))
    return keys, [float(variant[k]) - float(baseline[k]) for k in keys]


def compare(variant: dict, baseline: dict, confidence: float = CONFIDENCE) -> dict:
    """The paired comparison of one score: mean difference, bootstrap and t intervals, verdict, and what it
    could have detected (minimum detectable effect, seeds needed for the observed effect)."""
    keys, diffs = paired_differences(variant, baseline)
    boot = bootstrap_interval(diffs, confidence)
    t_int = mean_interval(diffs, confidence)
    sd = float(np.std(diffs, ddof=1)) if len(diffs) >= 2 else None
    return {"n_pairs": len(diffs), "mean_diff": boot.mean, "ci_low": boot.low, "ci_high": boot.high,
            "t_ci_low": t_int.low, "t_ci_high": t_int.high, "verdict": verdict(boot),
            "sd_diff": sd, "mde": minimum_detectable_effect(diffs),
            "seeds_needed": seeds_needed(boot.mean, sd) if sd is not None else None,
            "pairs": [list(k) if isinstance(k, tuple) else k for k in keys], "diffs": diffs}


# ---------------------------------------------------------------------------------------------- power
def _detect_factor(n: int, alpha: float, power: float) -> float:
    """(t_{1−α/2, n−1} + t_{power, n−1}) / √n: the MDE in units of s_d."""
    return (t_quantile(1 - alpha / 2, n - 1) + t_quantile(power, n - 1)) / math.sqrt(n)


def minimum_detectable_effect(diffs: Sequence[float], alpha: float = DETECT_ALPHA,
                              power: float = DETECT_POWER) -> float | None:
    """MDE = (t_{1−α/2, n−1} + t_{power, n−1}) · s_d/√n of n paired differences (None when n < 2).

    d = [0.01, 0.03, 0.02]: s_d = 0.01, (4.3027 + 1.0607) · 0.01/√3 = 0.03097."""
    n = len(diffs)
    if n < 2:
        return None
    return _detect_factor(n, alpha, power) * float(np.std(np.asarray(diffs, dtype=float), ddof=1))


def seeds_needed(effect: float | None, sd: float, alpha: float = DETECT_ALPHA, power: float = DETECT_POWER,
                 max_n: int = MAX_SEEDS_NEEDED) -> int | None:
    """The smallest n ≥ 2 with (t_{1−α/2, n−1} + t_{power, n−1}) · sd/√n ≤ |effect|; None when the effect
    is 0 (or missing, or float noise: |effect| ≤ 1e-12) or more than `max_n` would be needed. sd = 0 and
    effect ≠ 0: 2."""
    if effect is None or not math.isfinite(effect) or abs(effect) <= FLOAT_NOISE or not math.isfinite(sd):
        return None
    if sd == 0:
        return 2
    target = abs(effect) / sd
    if _detect_factor(max_n, alpha, power) > target:
        return None
    low, high = 2, max_n           # the factor falls monotonically with n: bisect for the first n that fits
    while low < high:
        mid = (low + high) // 2
        if _detect_factor(mid, alpha, power) <= target:
            high = mid
        else:
            low = mid + 1
    return low


# ---------------------------------------------------------------------------------------------- Student t
def t_quantile(p: float, df: float) -> float:
    """The p-quantile of Student's t with df degrees of freedom (bisection on the exact CDF; |error| < 1e-9).

    Implemented here so that the arena needs no scipy: t_{0.975, 2} = 4.3027, t_{0.975, 10} = 2.2281.
    """
    if not 0 < p < 1 or df <= 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df > 0, got p={p}, df={df}")
    if p < 0.5:
        return -t_quantile(1 - p, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        high *= 2
    for _ in range(200):
        mid = (low + high) / 2
        if t_cdf(mid, df) < p:
            low = mid
        else:
            high = mid
        if high - low < 1e-12 * max(1.0, high):
            break
    return (low + high) / 2


def t_cdf(t: float, df: float) -> float:
    """P(T ≤ t) = 1 − I_x(df/2, 1/2)/2 for t ≥ 0, with x = df/(df + t²) (regularized incomplete beta)."""
    tail = 0.5 * _regularized_beta(df / (df + t * t), df / 2, 0.5)
    return 1 - tail if t >= 0 else tail


def _regularized_beta(x: float, a: float, b: float) -> float:
    """I_x(a, b) by Lentz's continued fraction (Numerical Recipes §6.4), using the symmetry for x > (a+1)/(a+b+2)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x > (a + 1) / (a + b + 2):
        return 1 - math.exp(log_front) * _beta_fraction(1 - x, b, a) / b
    return math.exp(log_front) * _beta_fraction(x, a, b) / a


def _beta_fraction(x: float, a: float, b: float) -> float:
    tiny = 1e-300   # keeps the Lentz denominators away from exact zero
    c, d = 1.0, 1 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 500):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1 + numerator * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= c * d
        if abs(c * d - 1) < 1e-15:
            break
    return result
