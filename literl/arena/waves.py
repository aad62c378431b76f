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

from literl.arena import ablation, stats
from literl.arena.runner import Outcome
from literl.arena.sequential import CONTINUE
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


def describe_decision(comp: dict) -> str:
    """'hurts at wave 2 (4 pairs), RCI [-0.36, -0.30]' for the terminal and the report."""
    if not comp["looks"]:
        return "no look yet"
    look = comp["looks"][-1]
    rci = f"RCI [{look['rci_low']:+.3f}, {look['rci_high']:+.3f}]" if abs(look["rci_low"]) < 1e6 else "RCI unbounded"
    if comp["decision"] == CONTINUE:
        return f"open after {look['n']} pairs ({rci}): next wave"
    if comp["decision"] == stats.NO_DIFFERENCE:
        return f"no detectable difference at the ceiling ({look['n']} pairs, {rci})"
    return f"{comp['decision']} at wave {comp['decided_at_wave']} ({look['n']} pairs, {rci})"


def print_sequential(section: dict, console) -> None:
    from rich.markup import escape
    from rich.table import Table

    margin = f", equivalence margin ±{section['margin']}" if section["margin"] is not None else ""
    table = Table(title=f"sequential seeds: {section['design']}, α {section['alpha']}, looks at "
                        f"{', '.join(map(str, section['looks']))} seeds{margin}; score {section['score']}")
    for column in ("variant", "scenario", "decision"):
        table.add_column(column)
    for comp in section["comparisons"]:
        table.add_row(escape(comp["variant"]), escape(comp["scenario"]), escape(describe_decision(comp)))
    console.print(table)
    console.print(f"{section['runs_used']} of {section['runs_ceiling']} runs at the ceiling "
                  f"({100 * section['compute_saved']:.0f}% of the compute saved) after {section['waves_run']} of "
                  f"{section['waves_planned']} waves", highlight=False)
