"""From run records to the ablation's summary: per-run scores, per-cell intervals, paired comparisons.

`summarize` is pure over `RunRecord`s (the formulas live in `literl.arena.stats`); `literl.arena.ablation`
writes its result to summary.json and `print_summary` shows the same numbers as rich tables.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Sequence

from literl.arena import stats
from literl.arena.runs import SUMMARY_FILE, RunRecord, checkpoint_step
from literl.arena.sequential import CONTINUE

ALL_SCENARIOS = "all"      # the comparison pooled over scenarios, one pair per seed
LOG_NAME = "train.log"


def run_scores(record: RunRecord, metric: str, source: str = "eval") -> dict[str, float] | None:
    """final / best / auc of the run's curve of `metric` (source "eval": its held-out evaluations; "train": its
    per-step training metric); None when it has no value, or none at its last evaluation (last step) — scoring
    an earlier one as 'final' would pair runs at different steps."""
    steps, values = record.eval_curve(metric) if source == "eval" else record.metric_curve(metric)
    if not values or steps[-1] != _last_evaluated_step(record, metric, source):
        return None
    return stats.curve_scores(steps, values)


def _last_evaluated_step(record: RunRecord, metric: str, source: str = "eval") -> int | None:
    rows = record.evals if source == "eval" else record.metrics
    return max((int(r["step"]) for r in rows if metric in r and "step" in r), default=None)


def summarize(records: Sequence[RunRecord], *, metric: str, variants: Sequence[str], scenarios: Sequence[str],
              baseline: str | None = None, expected: Iterable[tuple[str, str, int, Path]] = (),
              name: str = "", confidence: float = stats.CONFIDENCE, metric_source: str = "eval") -> dict:
    """The summary.json document. `expected` lists (variant, scenario, seed, directory) of every planned run,
    so that runs which never finished are named in `runs.missing` instead of silently shrinking n.
    `metric_source` "train" scores a per-step training metric (metrics.jsonl) instead of a held-out one: its
    final is the last step's value, its AUC the mean over the steps."""
    scores, per_run, missing, noise = _score_runs(records, metric, expected, metric_source)
    where = "eval.jsonl" if metric_source == "eval" else "metrics.jsonl (every training step)"
    what = "evaluations (the one before training included)" if metric_source == "eval" else "logged steps"
    cells = [_cell(v, s, scores, confidence) for s in scenarios for v in variants]
    comparisons = []
    if baseline is not None:
        for variant in (v for v in variants if v != baseline):
            for scenario in [*scenarios, *([ALL_SCENARIOS] if len(scenarios) > 1 else [])]:
                comparisons.append(_comparison(variant, baseline, scenario, scores, confidence, noise))
    return {
        "name": name, "metric": metric, "metric_source": metric_source, "higher_is_better": True,
        "confidence": confidence, "baseline": baseline, "variants": list(variants), "scenarios": list(scenarios),
        "scores": {"final": f"{metric} at the last {'evaluation' if metric_source == 'eval' else 'step'} ({where})",
                   "best": f"max of {metric} over all {what}",
                   "auc": f"trapezoid area under {metric} vs step, divided by the step span"},
        "intervals": {"cells": "mean ± Student-t interval over seeds",
                      "comparisons": f"percentile bootstrap of the mean paired difference, "
                                     f"{stats.BOOTSTRAP_RESAMPLES} resamples, numpy default_rng({stats.BOOTSTRAP_SEED})"
                                     "; t_ci_* is the paired t interval",
                      "verdict": "helps if the bootstrap interval lies above 0, hurts if below, else no "
                                 "detectable difference",
                      "detectable": stats.DETECTION_METHOD,
                      "eval_noise": EVAL_NOISE_METHOD},
        "runs": {"expected": len(per_run) + len(missing), "used": len(per_run), "missing": missing},
        "per_run": per_run, "cells": cells, "comparisons": comparisons,
    }


def sampling_se_curve(record: RunRecord, metric: str) -> dict | None:
    """{steps, values, se} of the run's evaluations of `metric` with the response-sampling standard error each
    logged (`<metric>_sampling_se`, from `eval.samples` >= 2; literl.evaluation.sample_metrics.sampling_standard_error);
    None when any evaluation lacks it (runs from before it was logged, or K = 1)."""
    steps, values = record.eval_curve(metric)
    se_steps, se = record.eval_curve(f"{metric}_sampling_se")
    if not steps or se_steps != steps:
        return None
    return {"steps": steps, "values": values, "se": se}


def _score_runs(records, metric, expected, source="eval"):
    scores: dict[tuple[str, str], dict[int, dict]] = {}
    noise: dict[tuple[str, str], dict[int, dict]] = {}
    per_run, missing, seen = [], [], set()
    for record in records:
        seen.add(Path(record.directory))
        result = run_scores(record, metric, source) if record.finished else None
        if result is None:
            reason = _why_unscored(record, metric, source)
            missing.append(_missing(record.variant, record.scenario, record.seed, record.directory, reason))
            continue
        scores.setdefault((record.variant, record.scenario), {})[record.seed] = result
        curve = sampling_se_curve(record, metric) if source == "eval" else None
        if curve is not None:
            noise.setdefault((record.variant, record.scenario), {})[record.seed] = curve
        per_run.append({"variant": record.variant, "scenario": record.scenario, "seed": record.seed,
                        "directory": str(record.directory), **result,
                        **({"final_sampling_se": curve["se"][-1]} if curve is not None else {})})
    for variant, scenario, seed, directory in expected:
        if Path(directory) not in seen:
            missing.append(_missing(variant, scenario, seed, directory, "not run"))
    return scores, per_run, missing, noise


def _why_unscored(record: RunRecord, metric: str, source: str = "eval") -> str:
    if record.finished:
        last = _last_evaluated_step(record, metric, source)
        file = "eval.jsonl" if source == "eval" else "metrics.jsonl"
        if last is None:
            return f"no '{metric}' in {file}"
        return (f"'{metric}' is null (not a finite number) at the last "
                f"{'evaluation' if source == 'eval' else 'logged step'}, step {last}")

    log = Path(record.directory) / LOG_NAME
    step = checkpoint_step(Path(record.directory))
    if SUMMARY_FILE in record.damaged:
        where = f"its checkpoint at step {step}" if step is not None else "the start (it has no checkpoint)"
        return (f"{SUMMARY_FILE} is damaged ({record.damaged[SUMMARY_FILE]}), so the run counts as unfinished: "
                f"rerun the ablation, which resumes it from {where} and writes {SUMMARY_FILE} again (a plain run: "
                f"literl train trainer.resume=true trainer.output_dir={record.directory})")
    if step is not None:
        return f"unfinished: checkpoint at step {step}, rerun the ablation to resume it (log: {log})"
    return f"unfinished or failed: no summary.json and no checkpoint (see {log})"


def _missing(variant, scenario, seed, directory, reason) -> dict:
    return {"variant": variant, "scenario": scenario, "seed": seed, "directory": str(directory), "reason": reason}


def _cell(variant: str, scenario: str, scores: dict, confidence: float) -> dict:
    by_seed = scores.get((variant, scenario), {})
    seeds = sorted(by_seed)
    cell = {"variant": variant, "scenario": scenario, "n": len(seeds), "seeds": seeds}
    for score in stats.SCORES:
        values = [by_seed[s][score] for s in seeds]
        cell[score] = {**stats.mean_interval(values, confidence).as_dict(), "values": values}
    return cell


def _comparison(variant: str, baseline: str, scenario: str, scores: dict, confidence: float,
                noise: dict) -> dict:
    out = {"variant": variant, "baseline": baseline, "scenario": scenario}
    for score in stats.SCORES:
        if scenario == ALL_SCENARIOS:
            paired = _seed_means_over_scenarios(variant, baseline, scores, score)
        else:
            paired = tuple({seed: result[score] for seed, result in scores.get((v, scenario), {}).items()}
                           for v in (variant, baseline))
        out[score] = stats.compare(*paired, confidence)
        if score in EVAL_NOISE_SCORES:
            share = _eval_noise(variant, baseline, scenario, scores, noise, out[score], score)
            if share is not None:
                out[score]["eval_noise"] = share
    return out


EVAL_NOISE_SCORES = ("final", "auc")
EVAL_NOISE_METHOD = ("sampling_variance = the mean over the paired seeds of the variance that the two runs' "
                     "response sampling alone gives their difference: for Δ final se_variant² + se_baseline² at the "
                     "last evaluation, for Δ AUC Σ_k w_k² (se_variant,k² + se_baseline,k²) over the evaluations "
                     "with the trapezoid weights w_k of the AUC (the evaluation before training, when both runs scored "
                     "it identically, is one shared sample and adds nothing); each se is the evaluation's "
                     "response-sampling standard error, the problems fixed; a pooled comparison averages its seed's "
                     "scenarios (Σ / S²). observed_variance = s_d² of the paired differences; share = their ratio: "
                     "above ~0.5 the minimum detectable effect is mostly evaluation noise, which more eval.samples "
                     "or eval.limit shrink at no cost in training. The two arms are treated as independent; they "
                     "share their sampling seed, which correlates them while the policies are close, so a share "
                     "near or above 1 says the evaluation noise alone could explain the spread")
EVAL_NOISE_NOTABLE = 0.5


def _pair_sampling_variance(a: dict, b: dict, score: str) -> float | None:
    """The variance response sampling gives score(a) − score(b) for two runs' evaluation curves (None when they
    were evaluated at different steps)."""
    if a["steps"] != b["steps"]:
        return None
    # The evaluation before training is one sample when both arms start from the same policy and sampling seed
    # (scored identically): it adds nothing to the difference. Later ones are separate, even if equal by chance.
    per_step = [0.0 if step == 0 and va == vb else sa ** 2 + sb ** 2
                for step, va, vb, sa, sb in zip(a["steps"], a["values"], b["values"], a["se"], b["se"])]
    if score == "final":
        return per_step[-1]
    return sum(w * w * v for w, v in zip(stats.trapezoid_weights(a["steps"]), per_step))


def _eval_noise(variant: str, baseline: str, scenario: str, scores: dict, noise: dict, entry: dict,
                score: str) -> dict | None:
    """How much of a Δ's paired variance the evaluations' response sampling explains (EVAL_NOISE_METHOD); None
    when a paired run logged no sampling SE, or the differences have no spread (< 2 pairs, or all equal).

    Two runs evaluated on the same problems with K samples each differ, even when their policies are equal, by
    noise of variance se_a² + se_b²; when that is most of s_d², the seeds agree better than the verdict shows."""
    observed = entry.get("sd_diff")
    if observed is None or observed <= stats.FLOAT_NOISE:
        return None
    scenarios = ([s for (v, s) in scores if v == baseline] if scenario == ALL_SCENARIOS else [scenario])
    variances = []
    for seed in entry["pairs"]:       # the paired keys are seeds, in a scenario and pooled alike
        both = [s for s in scenarios if seed in scores.get((variant, s), {}) and seed in scores.get((baseline, s), {})]
        try:
            parts = [_pair_sampling_variance(noise[(variant, s)][seed], noise[(baseline, s)][seed], score)
                     for s in both]
        except KeyError:
            return None
        if not parts or any(p is None for p in parts):
            return None
        variances.append(sum(parts) / len(parts) ** 2)
    sampling = sum(variances) / len(variances)
    return {"sampling_variance": sampling, "observed_variance": observed ** 2, "share": sampling / observed ** 2}


def _seed_means_over_scenarios(variant: str, baseline: str, scores: dict, score: str) -> tuple[dict, dict]:
    """({seed: mean over scenarios}, same for the baseline), over the scenarios where both ran that seed.

    The seed is the unit of replication: the runs of one seed in different scenarios share their seed, and
    for a trick the scenario does not touch (a scale-invariant advantage under a reward rescale) they are the
    same run. Counting them as separate pairs would shrink the interval for nothing; averaging each seed's
    differences over the scenarios first does not."""
    scenarios = sorted({s for (v, s) in scores if v in (variant, baseline)})
    variant_means, baseline_means = {}, {}
    seeds = sorted({seed for (v, _), by_seed in scores.items() if v == variant for seed in by_seed})
    for seed in seeds:
        both = [s for s in scenarios
                if seed in scores.get((variant, s), {}) and seed in scores.get((baseline, s), {})]
        if both:
            variant_means[seed] = sum(scores[(variant, s)][seed][score] for s in both) / len(both)
            baseline_means[seed] = sum(scores[(baseline, s)][seed][score] for s in both) / len(both)
    return variant_means, baseline_means


# ---------------------------------------------------------------------------------------------- terminal
def format_cell(entry: dict) -> str:
    """'mean ± half-width' of a cell's score ('–' when no run scored)."""
    if entry["mean"] is None:
        return "–"
    half = entry.get("half_width")
    return f"{entry['mean']:.3f} ± {half:.3f}" if half is not None else f"{entry['mean']:.3f}"


def _fmt_diff(entry: dict) -> str:
    if entry["mean_diff"] is None:
        return "–"
    if entry["ci_low"] is None:
        return f"{entry['mean_diff']:+.3f}"
    return f"{entry['mean_diff']:+.3f}\n[{entry['ci_low']:+.3f}, {entry['ci_high']:+.3f}]"


def format_detectable(entry: dict) -> str:
    """'MDE 0.031, 5 seeds for Δ' : what the comparison could detect, and the seeds the observed Δ needs."""
    mde = entry.get("mde")
    if mde is None:
        return ""
    needed = entry.get("seeds_needed")
    if needed is None:
        small = abs(entry.get("mean_diff") or 0.0) <= stats.FLOAT_NOISE
        need = "Δ = 0" if small else f"> {stats.MAX_SEEDS_NEEDED:,} seeds for Δ"
    else:
        need = f"{needed} seeds for Δ"
    return f"MDE {mde:.3f}, {need}"


def format_fragility(entry: dict) -> str:
    """'fragile: t interval includes 0' for a helps/hurts verdict whose paired t interval still contains 0.

    The percentile bootstrap of a handful of paired differences is narrower than the t interval (at 5 pairs it
    treats the seeds' spread as known), so a verdict it alone supports is a lead to check on other seeds
    (results/findings/instrument.md: the findings' re-runs on new seeds)."""
    if entry.get("verdict") not in (stats.HELPS, stats.HURTS) or entry.get("t_ci_low") is None:
        return ""
    return "fragile: t interval includes 0" if entry["t_ci_low"] <= 0.0 <= entry["t_ci_high"] else ""


VERDICT_STYLE = {stats.HELPS: "green", stats.HURTS: "red", stats.NO_DIFFERENCE: "dim", stats.TOO_FEW: "yellow"}


def format_eval_noise(entry: dict) -> str:
    """'evaluation noise 86% of s_d²' for a Δ final or AUC whose runs logged their sampling SE ('' otherwise)."""
    noise = entry.get("eval_noise")
    if noise is None:
        return ""
    return f"evaluation noise {100 * noise['share']:.0f}% of s_d²"


def eval_noise_is_notable(entry: dict) -> bool:
    """Whether the evaluation noise is most of this Δ's paired variance (share >= EVAL_NOISE_NOTABLE)."""
    return entry.get("eval_noise", {}).get("share", 0.0) >= EVAL_NOISE_NOTABLE


def _comparison_cell(entry: dict) -> str:
    """One score's cell of the terminal's comparisons table: Δ [interval], verdict, fragility mark, MDE, and (Δ
    final, Δ AUC) the evaluation noise's share of its variance, in yellow where it is most of it."""
    fragile, noise = format_fragility(entry), format_eval_noise(entry)
    return (f"{_fmt_diff(entry)}\n[{VERDICT_STYLE[entry['verdict']]}]{entry['verdict']}[/]"
            + (f"\n[yellow]{fragile}[/]" if fragile else "") + f"\n[dim]{format_detectable(entry)}[/]"
            + (f"\n[{'yellow' if eval_noise_is_notable(entry) else 'dim'}]{noise}[/]" if noise else ""))


def print_summary(summary: dict, console=None) -> None:
    """The cells table (mean ± 95% CI over seeds) and the comparisons table (paired Δ, bootstrap CI, verdict)."""
    from rich.console import Console
    from rich.markup import escape        # labels are run and variant names: text, not markup
    from rich.table import Table

    console = console or Console()
    metric = escape(summary["metric"])
    cells = Table(title=f"{escape(summary['name'] or 'runs')}: {metric}, mean ± 95% CI over seeds")
    for column in ("variant", "scenario", "n", "final", "best", "AUC"):
        cells.add_column(column, justify="left" if column in ("variant", "scenario") else "right")
    for cell in summary["cells"]:
        cells.add_row(escape(cell["variant"]), escape(cell["scenario"]), str(cell["n"]),
                      *(format_cell(cell[s]) for s in stats.SCORES))
    console.print(cells)
    if summary["comparisons"]:
        table = Table(title=f"paired difference vs baseline '{escape(summary['baseline'])}' "
                            f"(mean Δ [95% bootstrap CI], verdict; minimum detectable effect at α 0.05, power "
                            f"80%, seeds needed to detect the observed Δ)")
        for column in ("variant", "scenario", "pairs", "Δ final", "Δ best", "Δ AUC"):
            table.add_column(column, justify="left" if column in ("variant", "scenario") else "right")
        for comp in summary["comparisons"]:
            table.add_row(escape(comp["variant"]), escape(comp["scenario"]), str(comp["final"]["n_pairs"]),
                          *(_comparison_cell(comp[s]) for s in stats.SCORES))
        console.print(table)
        if any(eval_noise_is_notable(comp[score]) for comp in summary["comparisons"] for score in EVAL_NOISE_SCORES):
            console.print("[yellow]Where marked, Δ is mostly evaluation noise: two runs scored on the same "
                          "problems differ by their samples alone. More eval.samples or eval.limit shrink the MDE "
                          "without more seeds (docs/arena.md, \"Evaluation noise\").[/]")
    missing = summary["runs"]["missing"]
    if missing:
        console.print(f"[yellow]{len(missing)} of {summary['runs']['expected']} runs missing from these "
                      f"statistics:[/]")
        for item in missing:
            console.print(escape(f"  {item['variant']}/{item['scenario']}/seed_{item['seed']}: {item['reason']}"),
                          highlight=False)


# ---------------------------------------------------------------------------------------------- sequential
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


def sequential_html(summary: dict) -> str:
    """The report's section on the sequential design ('' for a fixed-seed ablation)."""
    import html

    section = summary.get("sequential")
    if not section:
        return ""
    margin = (f"equivalent when the interval lies inside ±{section['margin']}" if section["margin"] is not None
              else "no equivalence margin stated")
    rows = "".join(f"<tr><td class='l'>{html.escape(c['variant'])}</td><td class='l'>{html.escape(c['scenario'])}"
                   f"</td><td class='l'>{html.escape(describe_decision(c))}</td></tr>" for c in section["comparisons"])
    return (f"<h3>Sequential seeds</h3><p class='note'>Design: {html.escape(section['design'])} (α "
            f"{section['alpha']}), looks after {', '.join(map(str, section['looks']))} seeds, score "
            f"<code>{html.escape(section['score'])}</code>; helps/hurts when the repeated confidence interval (RCI) "
            f"excludes 0, {margin} (docs/arena-at-scale.md).</p><table><tr><th class='l'>variant</th><th "
            f"class='l'>scenario</th><th class='l'>decision</th></tr>{rows}</table><p class='note'>"
            f"{section['runs_used']} of {section['runs_ceiling']} runs at the ceiling: "
            f"{100 * section['compute_saved']:.0f}% of the compute saved, after {section['waves_run']} of "
            f"{section['waves_planned']} waves.</p>")
