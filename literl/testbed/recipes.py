"""Build recipes for the testbed variants, and the recipe hash that names their cache folders.

    base     the notes' model (~0.8 M parameters), 1500 SFT steps on solutions with 20% slipped steps,
             gated on a useful validation accuracy band so that RL has room (sampled accuracy ~30-60%).
             The notes used 15%; here that put one seed at 58% sampled, near the ceiling the slips
             set (a sampled solution of k steps is slip-free with probability ~(1 - rate)^k), while
             20% lands two seeds at 42%, mid-band, with greedy accuracy still ~75-85%.
    aligned  base plus a short SFT on clean solutions: lower entropy and higher accuracy, like an
             instruct model (it reuses the cached base when the base part of its recipe matches)
    micro    a ~20 k parameter model trained for a few steps: builds in seconds, for tests only
    moe      base's recipe with every MLP a mixture of 8 experts (2 per token, renormalised): a tiny Qwen3-MoE for
             Routing Replay and the MiniRL stability study on CPU

The regimes of the seed studies (docs/testbed.md, "Regimes"; docs/arena.md, "Findings") continue a built
variant with one more SFT phase, so each costs a short phase on top of a cached model rather than a new warm-up:

    long          base + SFT on the long tier (1-12 operations, slips at 0.1 per step): responses 7x apart
                  in length within a batch, for token- vs sequence-level weighting and length budgets
    long_aligned  long + SFT on clean long-tier solutions: the aligned policy of the same regime
    long_loopy    long + SFT on long-tier solutions of which half repeat their last step line a geometric number
                  of times (mean 10): a base policy with no-stop repetition that a 160-token budget cuts — long,
                  wrong responses whose per-token weight token- and sequence-level aggregation set differently
    aligned_varied aligned + SFT on clean solutions written in equivalent forms chosen at random (operand order of
                  + and *, spaces): a policy with many tokens whose alternatives are also right, as an instruct
                  model's phrasing choices (the LitePPO paper's aligned Qwen3 put only ~50% of tokens at p ≥ 0.99,
                  its base models ~90%; `aligned` puts 96% there), so that clipping acts on low-probability tokens
                  with positive advantages
    varied        base taught from its first step on solutions in the varied forms (same steps, rates and gate)
    varied_aligned varied + SFT on clean solutions in the varied forms: an aligned policy with many acceptable
                  tokens (aligned_varied's phase over `aligned` lost the arithmetic)
    skewed_aligned varied + SFT on clean solutions whose lines are canonical 85% of the time and otherwise in one of
                  their other forms (a few percent each): an aligned policy with valid low-probability alternatives,
                  the tokens with positive advantage that PPO's upper clip bound caps (clip-higher, finding_b)
    checked       base + SFT on solutions of which half check every step (the step, then "check " and the step worked
                  again, right): a policy that chooses per response between a short answer and a ~2.5x longer,
                  more accurate one, which a 64-token budget cuts at 3-4 operations (overlong filtering, finding_d)
    direct        base + SFT on solutions of which half are the right answer alone, boxed, with no step: a policy that
                  chooses per response between answering at once (right mostly at 1-2 operations) and working the
                  steps (right far more often at 3-4), where a short budget cuts only the worked way (finding_d)
    moe_flat      moe with its router weights scaled by 1/64 and then held fixed through a short SFT that lets the
                  experts adapt: the same routes with 64x smaller margins between the 2nd and 3rd expert, so that
                  the router's own updates move routes between θ_old and θ (the MiniRL study's off-policy setting)

A recipe is a frozen dataclass tree; every field and `CODE_VERSION` feed the hash, so any change to a
recipe (or a bump of the version after a change in the build code) builds a new folder. A field added after
recipes were cached enters the hash only when it differs from its default (`OPTIONAL_FIELDS`: `experts`,
`parent`, `router_scale`, `measure.tier`), so existing folders keep their names.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass

from literl.testbed.model import ExpertsShape, ModelShape
from literl.testbed.warmup import SFTPhase

CODE_VERSION = "1"
"""Bump when a change in the build code would change the weights a recipe produces."""

SEED_RETRY_STRIDE = 1000        # a retried build uses seed + 1000 * attempt
EXTENSION_DATA_SEED_OFFSET = 100
ALIGNMENT_DATA_SEED_OFFSET = 200


@dataclass(frozen=True)
class AccuracyGate:
    """The useful range of validation sampled accuracy after the warm-up, and what to do outside it.

    Below `low`, up to `max_extensions` extra `extension` phases run (each checked again); if the model
    is still outside [low, high], the build restarts from a new seed, up to `max_seed_retries` times,
    and then fails with an error that lists every attempt.
    """

    low: float
    high: float
    extension: SFTPhase
    max_extensions: int = 2
    max_seed_retries: int = 2


@dataclass(frozen=True)
class MeasureSettings:
    """How accuracy is measured: validation (train split, drives the gate) and held-out (reported)."""

    validation_problems: int = 128
    validation_seed: int = 999
    heldout_problems: int = 200
    samples_per_problem: int = 4
    max_new_tokens: int = 64
    sampling_seed: int = 0
    tier: str = "mixed"
    """The task tier of the validation and held-out problems (the long regimes measure on the long tier)."""


@dataclass(frozen=True)
class TestbedRecipe:
    """Everything that determines a testbed's weights (given the code version)."""

    __test__ = False   # not a pytest test class despite the name

    variant: str
    seed: int
    shape: ModelShape
    warmup: SFTPhase
    gate: AccuracyGate | None
    alignment: SFTPhase | None = None
    """A clean-data SFT phase applied on top of the gated warm-up (the aligned variant)."""
    measure: MeasureSettings = MeasureSettings()
    num_threads: int = 2
    """torch CPU threads during the build: results are bitwise reproducible only at a fixed count."""
    experts: ExpertsShape | None = None
    """Mixture-of-experts MLPs (a Qwen3-MoE); None: the dense Qwen3."""
    parent: TestbedRecipe | None = None
    """The built variant the `alignment` phase continues; None: this recipe without its alignment phase
    (`base_recipe`), as `aligned` continues `base`."""
    router_scale: float | None = None
    """MoE only: multiply the parent's router weights by this before the `alignment` phase and hold them fixed
    during it (the experts and everything else train), so every router margin shrinks by this factor while the
    top-k choices stay as they were."""

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["parent"] = self.parent.to_dict() if self.parent is not None else None
        for path, default in OPTIONAL_FIELDS.items():
            *outer, last = path
            holder = out
            for key in outer:
                holder = holder[key]
            if holder[last] == default:
                del holder[last]
        for phase in (out["warmup"], (out["gate"] or {}).get("extension"), out["alignment"]):
            if phase is not None and phase["style"] == "canonical":
                del phase["style"]     # SFTPhase.style, added later: in the hash only when set
        return out

    def recipe_hash(self) -> str:
        """12 hex digits of a SHA-256 over every field and CODE_VERSION."""
        payload = json.dumps({"recipe": self.to_dict(), "code_version": CODE_VERSION}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:12]

    def folder_name(self) -> str:
        return f"{self.variant}-{self.recipe_hash()}"

    def base_recipe(self) -> "TestbedRecipe":
        """The recipe of the model the alignment phase starts from (itself when there is none)."""
        if self.alignment is None:
            return self
        if self.parent is not None:
            return self.parent
        return dataclasses.replace(self, variant="base", alignment=None)


OPTIONAL_FIELDS: dict[tuple[str, ...], object] = {
    ("experts",): None, ("parent",): None, ("router_scale",): None, ("measure", "tier"): "mixed"}
"""Fields added after recipes were cached, by their path in `to_dict`, with the default that leaves them out
of the hash: a recipe that does not set them keeps the folder name (and the shipped weights) it had."""


BASE = TestbedRecipe(
    variant="base",
    seed=0,
    shape=ModelShape(),
    warmup=SFTPhase(steps=1500, lr=2e-3, slip_rate=0.2),
    gate=AccuracyGate(low=0.30, high=0.62,
                      extension=SFTPhase(steps=300, lr=5e-4, slip_rate=0.2, warmup_steps=20)),
)

ALIGNED = dataclasses.replace(
    BASE, variant="aligned",
    alignment=SFTPhase(steps=300, lr=5e-4, slip_rate=0.0, warmup_steps=20),
)

MICRO = TestbedRecipe(
    variant="micro",
    seed=0,
    shape=ModelShape(hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, ffn_size=64, max_positions=256),
    # enough steps that most responses end with EOS well inside 64 tokens, which keeps trainer tests fast
    warmup=SFTPhase(steps=60, lr=1e-2, slip_rate=0.2, batch_size=16, warmup_steps=10),
    gate=None,
    measure=MeasureSettings(validation_problems=8, heldout_problems=16, samples_per_problem=2),
    num_threads=1,   # a model this small gains nothing from a second thread, and loses a lot on a busy CPU
)

MOE = dataclasses.replace(BASE, variant="moe", experts=ExpertsShape())

# The regimes (docs/testbed.md, "Regimes"). LONG_TIER_MEASURE: the long tier's solutions run to ~110 tokens, so
# the measurement's generation cap is 160 (loops are cut there). They build with one thread: a short phase gains
# little from a second, and a 2-thread build on a busy 2-core machine spin-waits (~10x slower, measured).
LONG_TIER_MEASURE = MeasureSettings(max_new_tokens=160, tier="long")
LONG = dataclasses.replace(
    BASE, variant="long", parent=BASE, measure=LONG_TIER_MEASURE, num_threads=1,
    # slips at 0.1 per step: a 12-step solution is slip-free with probability ~0.28, a 1-step one ~0.9, so groups
    # of every length hold both rewards (at base's 0.2, 12 steps would almost never be right)
    # 1000 steps at 1e-3: 400 at 5e-4 left the model unable to copy operands along chains of 6 or more operations
    # (held-out sampled accuracy 2-6% there, greedy 0%: no long solution to reward, truncate or weigh)
    alignment=SFTPhase(steps=1000, lr=1e-3, slip_rate=0.1, warmup_steps=50, tier="long"),
)
LONG_ALIGNED = dataclasses.replace(
    LONG, variant="long_aligned", parent=LONG,
    alignment=SFTPhase(steps=300, lr=5e-4, slip_rate=0.0, warmup_steps=20, tier="long"),
)
# A base model's degenerate repetition: the long, truncated, zero-reward responses that sequence-level aggregation
# weighs by 1/L per token and token-level by 1/sum L (DAPO §3.3, LitePPO Takeaway 7). The same slips as `long`, so
# only the loops are new; 300 steps at 5e-4, as the aligned phases (a short phase over a cached policy).
LONG_LOOPY = dataclasses.replace(
    LONG, variant="long_loopy", parent=LONG,
    alignment=SFTPhase(steps=300, lr=5e-4, slip_rate=0.1, warmup_steps=20, tier="long", style="end_loop"),
)
ALIGNED_VARIED = dataclasses.replace(
    ALIGNED, variant="aligned_varied", parent=ALIGNED, num_threads=1,
    alignment=SFTPhase(steps=300, lr=5e-4, slip_rate=0.0, warmup_steps=20, style="varied"),
)
# The forms from the first step: aligned_varied relearned its format over a cached policy and lost its arithmetic
# (11.6% held-out sampled), so here the base recipe itself is taught the varied forms (the same steps, rates and
# gate), and the aligned phase on top of it keeps them.
VARIED = dataclasses.replace(
    BASE, variant="varied",
    warmup=SFTPhase(steps=1500, lr=2e-3, slip_rate=0.2, style="varied"),
    gate=AccuracyGate(low=0.30, high=0.62,
                      extension=SFTPhase(steps=300, lr=5e-4, slip_rate=0.2, warmup_steps=20, style="varied")),
)
VARIED_ALIGNED = dataclasses.replace(
    VARIED, variant="varied_aligned", parent=VARIED,
    alignment=SFTPhase(steps=300, lr=5e-4, slip_rate=0.0, warmup_steps=20, style="varied"),
)
# Clip-higher's regime (finding_b): an aligned policy whose valid alternatives sit at a few percent, where PPO's upper
# bound caps them. Over `varied`, which already computes in every form, so only the forms' prior moves (a phase
# that taught new forms over `aligned` lost the arithmetic: aligned_varied).
SKEWED_ALIGNED = dataclasses.replace(
    VARIED, variant="skewed_aligned", parent=VARIED, num_threads=1,
    alignment=SFTPhase(steps=300, lr=5e-4, slip_rate=0.0, warmup_steps=20, style="skewed"),
)
# Overlong filtering's regime (finding_d): careful solutions that are longer and more often right, cut by a short
# budget within groups that also hold short answers. Over `base`, whose canonical lines the unchecked half keeps (at
# its slip rate 0.2), so the phase teaches the checked form; 1000 steps at 1e-3 as `long` taught its new tier. A first
# build (600 steps, the checked solutions' step lines slipped and only their checks right) gave checked responses
# only 10 points more often right than unchecked ones at 3-4 operations (results/testbed/regimes.md, rejected probes).
# Measured at
# 128 new tokens, which no checked solution of 1-4 operations exceeds.
CHECKED = dataclasses.replace(
    BASE, variant="checked", parent=BASE, num_threads=1, measure=MeasureSettings(max_new_tokens=128),
    alignment=SFTPhase(steps=1000, lr=1e-3, slip_rate=0.2, warmup_steps=50, style="checked"),
)
# Overlong filtering's regime, second design (finding_d, fourth version): the short way computes nothing, so the worked
# way's edge at 3-4 operations is computation, not slip-free lines that RL hands every form (`checked`, above). The
# same phase as `checked` (1000 steps at 1e-3 over `base`, slips at 0.2 in the worked half), measured at 128 tokens. A
# first build of this style (600 steps, `ba3ef80`) failed three of its four bars and was removed; this one passes two
# and misses the held-out bar (23.5% sampled against >= 30%: two thirds of its responses answer at once), which
# results/testbed/regimes.md reports beside finding_d's verdict.
DIRECT = dataclasses.replace(
    BASE, variant="direct", parent=BASE, num_threads=1, measure=MeasureSettings(max_new_tokens=128),
    alignment=SFTPhase(steps=1000, lr=1e-3, slip_rate=0.2, warmup_steps=50, style="direct"),
)
MOE_FLAT = dataclasses.replace(
    # 1/64: scaling the router shrinks the margins and the logit changes that hidden-state updates cause alike, so
    # only the router's own updates (Adam: ~lr per weight, whatever the scale) flip more routes; at 1/8 the last
    # of 8 mini-batches changed 2.4% of (token, layer) routes against moe's 1.3% (probe of the baseline, N = 8)
    MOE, variant="moe_flat", parent=MOE, router_scale=1 / 64, num_threads=1,
    alignment=SFTPhase(steps=200, lr=5e-4, slip_rate=0.2, warmup_steps=20),
)

VARIANTS: dict[str, TestbedRecipe] = {r.variant: r for r in (BASE, ALIGNED, MICRO, MOE, LONG, LONG_ALIGNED,
                                                              LONG_LOOPY, ALIGNED_VARIED, VARIED, VARIED_ALIGNED,
                                                              SKEWED_ALIGNED, CHECKED, DIRECT, MOE_FLAT)}


def recipe_for(variant: str) -> TestbedRecipe:
    """The recipe of a named variant."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown testbed variant {variant!r}; expected one of {sorted(VARIANTS)}")
    return VARIANTS[variant]
