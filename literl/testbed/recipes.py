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

A recipe is a frozen dataclass tree; every field and `CODE_VERSION` feed the hash, so any change to a
recipe (or a bump of the version after a change in the build code) builds a new folder. A field added after
recipes were cached, whose default is None (`experts`), enters the hash only when set, so existing folders keep
their names.
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

    def to_dict(self) -> dict:
        out = dataclasses.asdict(self)
        if out["experts"] is None:
            del out["experts"]
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
        return dataclasses.replace(self, variant="base", alignment=None)


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

VARIANTS: dict[str, TestbedRecipe] = {r.variant: r for r in (BASE, ALIGNED, MICRO, MOE)}


def recipe_for(variant: str) -> TestbedRecipe:
    """The recipe of a named variant."""
    if variant not in VARIANTS:
        raise ValueError(f"unknown testbed variant {variant!r}; expected one of {sorted(VARIANTS)}")
    return VARIANTS[variant]
