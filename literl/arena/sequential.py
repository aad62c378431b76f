"""Sequential seeds: run an ablation in waves of seeds and stop each comparison as soon as its answer is known,
with the false-positive rate held at α over all the looks (pure numbers: no files, no torch).

A design is `first` seeds, then `step` more per wave, up to `max` (a spec's `sequential: {first: 4, step: 4,
max: 16}`). The looks are at n_k = first, first + step, ..., max paired seeds, information fractions
t_k = n_k / max. After each wave every comparison is tested once more; looking k times at a test of level α
would reject a true null far more often than α, so the α is *spent* over the looks:

    Lan & DeMets (1983), O'Brien–Fleming-type spending function, α/2 on each side (two-sided, symmetric):
        α(t) = 2 · (2 − 2 Φ(z_{1−α/4} / √t)),   α(1) = α
    boundary c_k (on the z scale) solves, under no effect,
        P(|Z_j| < c_j for j < k, |Z_k| ≥ c_k) = α(t_k) − α(t_{k−1})
    with Z_k = S_k / √t_k and S a Brownian motion in t (independent increments between the looks). The first
    boundary is closed-form, c_1 = Φ⁻¹(1 − α(t_1)/2); the later ones are found by numerical integration of the
    continuation density (Armitage, McPherson & Rowe 1969; Jennison & Turnbull 2000, ch. 19) and bisection.

The spending function is the O'Brien–Fleming shape: almost nothing is spent early (at t = 1/4, α(t) ≈ 1.5e-5),
so an early stop needs an overwhelming effect, and the last look's boundary is close to the fixed-sample 1.96
(four equal looks: 4.333, 2.963, 2.359, 2.014, the values of gsDesign's and ldbounds' symmetric two-sided
design). The seeds' spread is unknown, so the z boundaries become t boundaries with the same nominal level (the
significance level approach of Jennison & Turnbull 2000): b_k = t_{1 − p_k/2, n_k − 1}, p_k = 2(1 − Φ(c_k)).

Each look gives the repeated confidence interval (Jennison & Turnbull 1989) of the mean paired difference,
    RCI_k = d̄_k ± b_k · s_k / √n_k
whose coverage holds simultaneously over the looks, and the decision of the comparison:
    "helps"      RCI_k lies above 0            "hurts"  RCI_k lies below 0
    "equivalent" RCI_k lies inside (−margin, +margin), when the design states a margin
    next wave    otherwise; at the last look (n_k = max) "no detectable difference".
Stopping for equivalence never makes a helps/hurts verdict more likely, so it leaves the false-positive rate at
or below α (it is a non-binding futility stop).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from literl.arena import stats
from literl.config.errors import ConfigError

EQUIVALENT, CONTINUE = "equivalent", "next wave"
DESIGN_NAME = "group-sequential, Lan-DeMets O'Brien-Fleming-type alpha spending"
DESIGN_KEYS = ("first", "step", "max", "margin", "alpha", "score")
DEFAULT_ALPHA = 0.05
GRID_POINTS = 801          # per look; the boundaries match published values to 1e-3 at 201, so this is margin
SIMULATION_SEED = 0


@dataclass(frozen=True)
class SequentialDesign:
    """Waves of seeds with a ceiling, and what decides a comparison."""

    first: int
    step: int
    max: int
    margin: float | None = None     # on the score's scale (e.g. 0.02 = 2 points of accuracy); None: no equivalence
    alpha: float = DEFAULT_ALPHA
    score: str = "final"

    def looks(self) -> list[int]:
        """Paired seeds at each look: first, first + step, ..., max (the last wave may be short)."""
        sizes, n = [], self.first
        while n < self.max:
            sizes.append(n)
            n += self.step
        return [*sizes, self.max]

    def as_dict(self) -> dict:
        return {"design": DESIGN_NAME, "first": self.first, "step": self.step, "max": self.max,
                "margin": self.margin, "alpha": self.alpha, "score": self.score, "looks": self.looks()}


def parse_design(raw: Any, where: str) -> SequentialDesign:
    """A spec's `sequential:` mapping ({first, step, max[, margin, alpha, score]}) or the `--sequential 4,4,16`
    text; bad values name the problem and the fix."""
    if isinstance(raw, str):
        parts = [p.strip() for p in raw.split(",")]
        try:
            numbers = [int(p) for p in parts]
        except ValueError:
            numbers = []
        if len(numbers) != 3:
            raise ConfigError(f"{where} '{raw}' must be three integers FIRST,STEP,MAX, e.g. 4,4,16 (4 seeds, then 4 "
                              "more per wave, at most 16)")
        raw = dict(zip(("first", "step", "max"), numbers))
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a mapping like {{first: 4, step: 4, max: 16}}, not {raw!r}")
    unknown = [k for k in raw if k not in DESIGN_KEYS]
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {', '.join(map(str, unknown))}; valid: {', '.join(DESIGN_KEYS)}")
    missing = [k for k in ("first", "step", "max") if k not in raw]
    if missing:
        raise ConfigError(f"{where}: missing {', '.join(missing)} (e.g. {{first: 4, step: 4, max: 16}})")
    first, step, ceiling = (raw[k] for k in ("first", "step", "max"))
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (first, step, ceiling)):
        raise ConfigError(f"{where}: first, step and max must be integers (seeds), got {first!r}, {step!r}, "
                          f"{ceiling!r}")
    if first < 2 or step < 1 or ceiling < first:
        raise ConfigError(f"{where}: need first >= 2 (a spread needs two seeds), step >= 1 and max >= first; got "
                          f"first={first}, step={step}, max={ceiling}")
    margin = raw.get("margin")
    if margin is not None and (isinstance(margin, bool) or not isinstance(margin, (int, float)) or margin <= 0):
        raise ConfigError(f"{where}: margin must be a positive number on the score's scale (0.02 = 2 points of "
                          f"accuracy), or left out for no equivalence stop; got {margin!r}")
    alpha = raw.get("alpha", DEFAULT_ALPHA)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
        raise ConfigError(f"{where}: alpha must be between 0 and 1 (e.g. 0.05), got {alpha!r}")
    score = str(raw.get("score", "final"))
    if score not in stats.SCORES:
        raise ConfigError(f"{where}: score '{score}' must be one of {', '.join(stats.SCORES)}")
    return SequentialDesign(first, step, ceiling, None if margin is None else float(margin), float(alpha), score)


# ---------------------------------------------------------------------------------------------- normal
def normal_cdf(z: float) -> float:
    return 0.5 * math.erfc(-z / math.sqrt(2))


def normal_quantile(p: float) -> float:
    """Φ⁻¹(p) by bisection on erfc (|error| < 1e-12); Φ⁻¹(0.975) = 1.959964."""
    if not 0 < p < 1:
        raise ValueError(f"normal_quantile needs 0 < p < 1, got {p}")
    low, high = -40.0, 40.0
    for _ in range(200):
        mid = (low + high) / 2
        if normal_cdf(mid) < p:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def _normal_cdf_array(x: np.ndarray) -> np.ndarray:
    return 0.5 * np.array([math.erfc(-v / math.sqrt(2)) for v in np.ravel(x)]).reshape(np.shape(x))


# ---------------------------------------------------------------------------------------------- boundaries
def spent_alpha(t: float, alpha: float = DEFAULT_ALPHA) -> float:
    """α(t) = 2(2 − 2Φ(z_{1−α/4}/√t)): the two-sided α spent by information fraction t (α/2 on each side; 0 at
    t = 0, α at t ≥ 1)."""
    if t <= 0:
        return 0.0
    return alpha if t >= 1 else 2 * (2 - 2 * normal_cdf(normal_quantile(1 - alpha / 4) / math.sqrt(t)))


def z_boundaries(fractions: Sequence[float], alpha: float = DEFAULT_ALPHA) -> list[float]:
    """The two-sided z boundaries c_1..c_K at increasing information fractions (module docstring)."""
    fractions = [min(1.0, float(t)) for t in fractions]
    if not fractions or any(b <= a for a, b in zip(fractions, fractions[1:])) or fractions[0] <= 0:
        raise ValueError(f"z_boundaries needs increasing information fractions in (0, 1], got {list(fractions)}")
    boundaries: list[float] = []
    # The sub-density of S_k = Z_k √t_k over the paths that have not crossed yet, on a grid (None before look 1).
    grid, density, previous_t = None, None, 0.0
    for k, t in enumerate(fractions):
        target = spent_alpha(t, alpha) - spent_alpha(previous_t, alpha)
        if density is None:
            c = normal_quantile(1 - target / 2)
        else:
            sigma = math.sqrt(t - previous_t)
            weights = density * _grid_weights(grid)

            def crossing(c_z: float) -> float:
                edge = c_z * math.sqrt(t)
                tails = _normal_cdf_array((-edge - grid) / sigma) + _normal_cdf_array((grid - edge) / sigma)
                return float(np.sum(weights * tails))

            if target <= 0:
                c = math.inf
            else:
                low, high = 0.0, 40.0        # crossing() falls as c grows: bisect for the one that spends `target`
                for _ in range(100):
                    mid = (low + high) / 2
                    low, high = (mid, high) if crossing(mid) > target else (low, mid)
                c = (low + high) / 2
        boundaries.append(c)
        edge = c * math.sqrt(t)
        new_grid = np.linspace(-edge, edge, GRID_POINTS)
        if density is None:
            new_density = np.exp(-new_grid ** 2 / (2 * t)) / math.sqrt(2 * math.pi * t)
        else:
            sigma = math.sqrt(t - previous_t)
            gap = new_grid[:, None] - grid[None, :]
            kernel = np.exp(-gap ** 2 / (2 * sigma ** 2)) / (sigma * math.sqrt(2 * math.pi))
            new_density = kernel @ (density * _grid_weights(grid))
        grid, density, previous_t = new_grid, new_density, t
    return boundaries


def _grid_weights(grid: np.ndarray) -> np.ndarray:
    """Simpson weights of an equally spaced grid with an odd number of points."""
    h = grid[1] - grid[0]
    w = np.ones(len(grid))
    w[1:-1:2], w[2:-1:2] = 4, 2
    return w * h / 3


def t_boundaries(sizes: Sequence[int], ceiling: int, alpha: float = DEFAULT_ALPHA) -> list[float]:
    """Boundaries b_k for the paired t statistic at the looks' sizes n_k (fractions n_k/ceiling): the t quantile
    with n_k − 1 degrees of freedom at the z boundary's nominal level."""
    zs = z_boundaries([n / ceiling for n in sizes], alpha)
    out = []
    for n, c in zip(sizes, zs):
        nominal = 2 * (1 - normal_cdf(c))
        out.append(math.inf if nominal <= 0 else stats.t_quantile(1 - nominal / 2, n - 1))
    return out


# ---------------------------------------------------------------------------------------------- decisions
@dataclass(frozen=True)
class Look:
    """One comparison at one look: its repeated confidence interval and its decision."""

    n: int
    mean: float
    low: float
    high: float
    boundary: float
    decision: str

    def as_dict(self) -> dict:
        return {"n": self.n, "mean_diff": self.mean, "rci_low": self.low, "rci_high": self.high,
                "t_boundary": self.boundary, "decision": self.decision}


def decide(diffs: Sequence[float], boundary: float, margin: float | None, final: bool) -> Look:
    """The decision of one look from the n paired differences seen so far and the look's t boundary."""
    x = np.asarray(diffs, dtype=float)
    n, mean = len(x), float(x.mean())
    spread = float(x.std(ddof=1)) if n >= 2 else 0.0
    # No spread gives no interval: equal differences are ties of discrete scores as often as a sure effect, so
    # they decide nothing, except all-zero differences (arms that train identically) against a margin.
    half = boundary * spread / math.sqrt(n) if spread > 0 else (0.0 if mean == 0 and n >= 2 else math.inf)
    low, high = mean - half, mean + half
    if low > 0:
        decision = stats.HELPS
    elif high < 0:
        decision = stats.HURTS
    elif margin is not None and -margin < low and high < margin:
        decision = EQUIVALENT
    else:
        decision = stats.NO_DIFFERENCE if final else CONTINUE
    return Look(n, mean, low, high, boundary, decision)


def run_looks(diffs: Sequence[float], design: SequentialDesign) -> list[Look]:
    """Every look the design makes on these paired differences (seed order), up to the first decision."""
    sizes = [n for n in design.looks() if n <= len(diffs)]
    if not sizes:
        return []
    boundaries = t_boundaries(sizes, design.max, design.alpha)
    looks = []
    for n, b in zip(sizes, boundaries):
        look = decide(diffs[:n], b, design.margin, final=n >= design.max)
        looks.append(look)
        if look.decision != CONTINUE:
            break
    return looks


def decided(look: Look | None) -> bool:
    return look is not None and look.decision != CONTINUE


# ---------------------------------------------------------------------------------------------- simulation
@dataclass(frozen=True)
class SimulatedDesign:
    """What the design does over many simulated comparisons with normal paired differences."""

    helps: float            # fraction of comparisons called helps
    hurts: float
    equivalent: float
    undecided: float        # reached the ceiling without a verdict
    stopped_at: list[float]  # fraction decided (or ended) at each look
    expected_seeds: float   # mean paired seeds used
    seeds_used: np.ndarray | None = None    # per simulated comparison (to combine comparisons: --plan)

    @property
    def resolved(self) -> float:
        return self.helps + self.hurts


def simulate(design: SequentialDesign, effect: float, sd: float, sims: int = 4000,
             seed: int = SIMULATION_SEED, draws: np.ndarray | None = None,
             boundaries: Sequence[float] | None = None) -> SimulatedDesign:
    """`sims` comparisons whose paired differences are N(effect, sd²) i.i.d. (or the given `draws`, shape
    (sims, max)), run through the design's looks at once (vectorised). `boundaries` replaces the design's t
    boundaries (e.g. the unadjusted t_{0.975, n−1} at every look, to see what the spending buys)."""
    looks = design.looks()
    x = draws if draws is not None else np.random.default_rng(seed).normal(effect, sd, size=(sims, design.max))
    sims = x.shape[0]
    boundaries = list(boundaries) if boundaries is not None else t_boundaries(looks, design.max, design.alpha)
    csum, csq = np.cumsum(x, axis=1), np.cumsum(x * x, axis=1)
    outcome = np.full(sims, "", dtype=object)
    stopped = np.full(sims, -1)
    for k, (n, b) in enumerate(zip(looks, boundaries)):
        mean = csum[:, n - 1] / n
        var = np.maximum(csq[:, n - 1] - n * mean ** 2, 0.0) / (n - 1)
        # as in decide(): no spread decides nothing, except all-zero differences (cumsum rounding: a tolerance)
        no_spread = var <= 1e-24 * np.maximum(1.0, mean ** 2)
        with np.errstate(invalid="ignore"):
            half = np.where(no_spread, np.where(mean == 0, 0.0, np.inf), b * np.sqrt(var / n))
        low, high = mean - half, mean + half
        live = stopped < 0
        call = np.where(low > 0, stats.HELPS, np.where(high < 0, stats.HURTS, ""))
        if design.margin is not None:
            call = np.where((call == "") & (low > -design.margin) & (high < design.margin), EQUIVALENT, call)
        if k == len(looks) - 1:
            call = np.where(call == "", stats.NO_DIFFERENCE, call)
        newly = live & (call != "")
        outcome[newly], stopped[newly] = call[newly], k
    counts = {name: float(np.mean(outcome == name))
              for name in (stats.HELPS, stats.HURTS, EQUIVALENT, stats.NO_DIFFERENCE)}
    return SimulatedDesign(counts[stats.HELPS], counts[stats.HURTS], counts[EQUIVALENT], counts[stats.NO_DIFFERENCE],
                           [float(np.mean(stopped == k)) for k in range(len(looks))],
                           float(np.mean(np.asarray(looks)[stopped])), np.asarray(looks)[stopped])


# ---------------------------------------------------------------------------------------------- an ablation
def design_from_dict(info: dict) -> SequentialDesign:
    return SequentialDesign(int(info["first"]), int(info["step"]), int(info["max"]), info.get("margin"),
                            float(info.get("alpha", DEFAULT_ALPHA)), str(info.get("score", "final")))


def decisions(summary: dict, design: SequentialDesign, seeds: Sequence[int], runs_per_seed: int) -> dict:
    """summary.json's `sequential` section: each comparison's looks on the paired differences of the summary's
    chosen score, taken in the order of `seeds` (the wave order), its decision and the wave it was reached at, and
    the runs used against the ceiling's."""
    order = {seed: i for i, seed in enumerate(seeds)}
    comparisons = []
    for comp in summary["comparisons"]:
        entry = comp[design.score]
        by_seed = dict(zip((p if isinstance(p, int) else p[-1] for p in entry["pairs"]), entry["diffs"]))
        diffs = [by_seed[s] for s in sorted(by_seed, key=lambda s: order.get(s, len(order)))]
        looks = run_looks(diffs, design)
        decided_at = next((i + 1 for i, look in enumerate(looks) if look.decision != CONTINUE), None)
        comparisons.append({"variant": comp["variant"], "baseline": comp["baseline"], "scenario": comp["scenario"],
                            "score": design.score, "decision": looks[-1].decision if looks else CONTINUE,
                            "decided_at_wave": decided_at, "n_pairs": len(diffs),
                            "looks": [look.as_dict() for look in looks]})
    sizes = design.looks()
    seeds_used = len(seeds)
    return {**design.as_dict(), "waves_run": sum(1 for n in sizes if n <= seeds_used), "waves_planned": len(sizes),
            "seeds_used": seeds_used, "runs_used": runs_per_seed * seeds_used,
            "runs_ceiling": runs_per_seed * design.max,
            "compute_saved": 1 - seeds_used / design.max,
            "all_decided": all(c["decision"] != CONTINUE for c in comparisons), "comparisons": comparisons}
