"""Running a sequential spec wave by wave: the first wave's seeds, the statistics, the next wave only for what is
still open (literl.arena.sequential has the design and its statistics).

Every wave is an ordinary ablation of the spec on its seeds so far: the same runs, folders and commands as a
fixed-seed spec with those seeds, so its per-run metrics are the ones a fixed-seed run gives. A wave's runs are
launched by `dispatch` (the local runner or the Ray dispatcher) and skipped when already finished, so a stopped
ablation rerun with the same command re-reads the finished waves, reaches the same decisions and continues
where it stopped. The decisions are recomputed from the runs each time, never stored apart from them.

summary.json gains a `sequential` section: the design, the waves run, each comparison's decision with the wave
it was reached at and its looks (repeated confidence intervals), and the compute used against the ceiling.
"""

from __future__ import annotations

from typing import Callable

from literl.arena import ablation
from literl.arena.runner import Outcome
from literl.arena.spec import AblationSpec, PlannedRun


def wave_seeds(spec: AblationSpec) -> list[list[int]]:
    """The seeds of the spec after each wave: the first n_k of its seed pool, n_k the design's looks."""
    return [spec.seeds[:n] for n in spec.sequential.looks()]


def run_in_waves(spec: AblationSpec, out_dir, dispatch: Callable[[list[PlannedRun]], Outcome],
                 on_wave: Callable[[int, dict], None] | None = None) -> tuple[dict, Outcome]:
    """Run waves until every comparison is decided or the ceiling is reached (or a wave fails or is stopped);
    returns the last summary (with its `sequential` section, literl.arena.sequential.decisions) and the last
    outcome."""
    outcome, summary = Outcome(), None
    for wave, seeds in enumerate(wave_seeds(spec), start=1):
        at_wave = spec.narrowed(seeds=seeds)
        runs = at_wave.plan(out_dir)
        ablation.record_plan(out_dir, at_wave, runs)
        outcome = dispatch(runs)
        summary = ablation.summarize_ablation(out_dir, report=False)
        section = summary["sequential"]
        if on_wave is not None:
            on_wave(wave, section)
        if outcome.failed or outcome.interrupted or section["all_decided"]:
            break
    return summary, outcome
