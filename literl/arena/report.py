"""report.html: one self-contained page (inline CSS, plots as embedded PNGs, no scripts, no external assets)
for an ablation or for plain runs.

Sections: setup; statistics (cells, paired comparisons with verdicts, per-run scores, missing runs); learning curves
with seed bands (held-out accuracy, reward, entropy, response length, clip fractions, truncation rate, group reward
std); mechanism diagnostics (clipped tokens, repetition of truncated responses, reward std by difficulty tier and the
groups dynamic sampling kept, IS-weight decomposition, training–inference mismatch and MoE route agreement, entropy).
With an export folder the figures are also written as PDF, SVG and PNG, the tables as CSV and LaTeX.
"""

from __future__ import annotations

import html
import time
from collections import Counter
from pathlib import Path
from typing import Sequence

from literl.arena import plots
from literl.arena.plots import Panel
from literl.arena.runs import RunRecord
from literl.arena.spec import MECHANISM_SECTIONS
from literl.arena.stats import SCORES
from literl.arena.summary import (EVAL_NOISE_SCORES, eval_noise_is_notable, format_cell, format_detectable,
                                  format_eval_noise, format_fragility, sequential_html)
from literl.data.files import write_text_atomic

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2em auto;max-width:1250px;
color:#222;padding:0 1em;line-height:1.45}
h1{font-size:1.6em}h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}h3{margin-top:1.5em}
table{border-collapse:collapse;margin:.6em 0;font-size:.88em}th,td{border:1px solid #ddd;padding:.25em .55em;
text-align:right}th{background:#f4f4f4}td.l,th.l{text-align:left}code{background:#f4f4f4;padding:0 .25em}
.helps{color:#137333;font-weight:600}.hurts{color:#b3261e;font-weight:600}.none{color:#666}
.few{color:#a15c00}.note{color:#555;font-size:.92em}.finding{background:#f7f7ef;border-left:4px solid #c9c28a;
padding:.5em 1em}.grid{display:flex;flex-wrap:wrap;gap:1.2em}img{max-width:100%;height:auto}
figure{margin:.6em 0}figure img{width:calc(var(--print-width) * 1.4)}.tok{font-family:monospace}
@media print{figure img{width:var(--print-width)}}
.missing{background:#fff4e5;border-left:4px solid #f0a020;padding:.5em 1em}
"""

HELD_OUT_NOTE = ("Held-out evaluations (eval.jsonl), not smoothed; the line is the mean over seeds, the band spans "
                 "the seeds (min to max).")
TRAIN_NOTE = (f"Per-step training metrics (metrics.jsonl), smoothed per seed with an exponential moving average "
              f"(factor {plots.TRAIN_SMOOTHING}); the band spans the seeds (min to max). Clipped tokens: low side "
              f"A&lt;0 and ρ&lt;1−ε_low, high side A&gt;0 and ρ&gt;1+ε_high.")
FRACTION_OF_TOKENS, NATS = "fraction of tokens", "nats per token"
TRAINING_PANELS = [
    Panel("accuracy", "training accuracy", "fraction correct"), Panel("reward/mean", "reward", "mean reward"),
    Panel("entropy/mean", "token entropy", NATS), Panel("response_length/mean", "response length", "tokens"),
    Panel("policy_loss/clipfrac_binding_low", "clipped, low side", FRACTION_OF_TOKENS),
    Panel("policy_loss/clipfrac_binding_high", "clipped, high side", FRACTION_OF_TOKENS),
    Panel("truncation_rate", "truncation rate", "fraction of responses"),
    Panel("groups/reward_std_mean", "reward std in groups", "std of reward"),
]
FRACTION_OF_GROUPS = "fraction of groups"
# What a std normalisation divides by (finding_c): equal rewards carry no advantage unless a batch mean centres them
# (finding_f_skew, the last panel); a small nonzero std (graded rewards) is what dividing amplifies more than 10x.
GROUP_STD_PANELS = [
    Panel("groups/zero_std_frac", "groups with reward std 0", FRACTION_OF_GROUPS),
    Panel("groups/small_std_frac", "groups with 0 < std < 0.1", FRACTION_OF_GROUPS),
    Panel("groups/reward_std_mean", "reward std in groups", "std of reward"),
    Panel("advantage/equal_reward_abs", "|advantage| in equal-reward groups", "mean |A| per token"),
    Panel("collect/kept_group_frac", "sampled groups kept (dynamic sampling)", FRACTION_OF_GROUPS),
]
REPETITION_PANELS = [
    Panel("repetition/truncated_repetitive_frac", "repetitive: all truncated", "fraction of truncated"),
    Panel("repetition/truncated_repetitive_frac_correct", "repetitive: correct ones", "fraction of truncated"),
    Panel("repetition/truncated_repetitive_frac_wrong", "repetitive: wrong ones", "fraction of truncated"),
]
# An engine that computes in the trainer's float32 differs from it by rounding only: |log π_old − log μ| about
# 1e-6 nats per token on the testbed (the vLLM float32 parity test allows 1e-4), a k1 KL of ±1e-8. Below these
# floors a ti/ curve is rounding, not mismatch; bfloat16 and FP8 engines are orders of magnitude above them.
F32_ROUNDING = "float32 rounding between engine and trainer"
IS_PANELS = [
    Panel("ti/kl_k3", "KL train–inference (k3)", NATS, floor=1e-6, floor_cause=F32_ROUNDING),
    Panel("st/kl_k3", "KL staleness (k3)", NATS),
    Panel("share/ti", "share train–inference", "share of |log w|"),
    Panel("share/st", "share staleness", "share of |log w|"), Panel("tot/kl_k3", "KL total (k3)", NATS),
]
AGREEMENT = "fraction of (token, layer)"
# The MiniRL study's stability signals (arXiv 2512.01374; algorithms.md §6–7): the training–inference gap the
# engine makes, and on MoE models how often the routers of engine and trainer (ti), and of θ_old and θ (st),
# choose the same experts. Dense models never log moe/*; an engine equal to the trainer logs ti/* as 0 or rounding.
MISMATCH_PANELS = [
    Panel("ti/kl_k1", "KL train–inference (k1)", NATS, floor=1e-6, floor_cause=F32_ROUNDING),
    Panel("ti/abs_logdiff_max", "max |log π_old − log μ|", "nats", floor=1e-4, floor_cause=F32_ROUNDING),
    Panel("ti/ess", "ESS train–inference", "normalised ESS"),
    Panel("moe/route_agree_ti", "routes agree: engine vs trainer", AGREEMENT),
    Panel("moe/route_agree_st", "routes agree: θ_old vs θ", AGREEMENT),
]
ENTROPY_PANELS = [Panel("entropy/mean", "mean token entropy", NATS),
                  Panel("entropy/token_max", "max token entropy", "nats")]
# What the entropy-control tricks act on (algorithms.md §10.4–10.6): the share of tokens each selects and the
# entropy of those tokens, beside the entropy of all tokens. Logged only by runs that use them.
SELECTION_PANELS = [
    Panel("policy_loss/cov_detached_frac", "Clip-Cov: detached", FRACTION_OF_TOKENS),
    Panel("policy_loss/cov_penalised_frac", "KL-Cov: penalised", FRACTION_OF_TOKENS),
    Panel("policy_mask/high_entropy/kept_token_frac", "80/20: kept", FRACTION_OF_TOKENS),
    Panel("policy_mask/opsm/masked_seq_frac", "OPSM: masked responses", "fraction of responses"),
]
SELECTED_ENTROPY_PANELS = [
    Panel("policy_loss/entropy_detached_mean", "entropy, Clip-Cov's detached", NATS),
    Panel("policy_loss/entropy_penalised_mean", "entropy, KL-Cov's penalised", NATS),
    Panel("policy_mask/high_entropy/entropy_kept_mean", "entropy, 80/20's kept", NATS),
]
# Token- vs sequence-level weighting (LitePPO Takeaway 7) and length budgets (Takeaway 8) act on how much response
# lengths differ within a step, and on whether correct and wrong responses differ in length.
TOKENS = "tokens"
LENGTH_PANELS = [
    Panel("response_length/p10", "length, 10th percentile", TOKENS),
    Panel("response_length/mean", "length, mean", TOKENS),
    Panel("response_length/p90", "length, 90th percentile", TOKENS),
    Panel("response_length/cv", "length spread (std / mean)", "coefficient of variation"),
    Panel("response_length/correct_mean", "length of correct responses", TOKENS),
    Panel("response_length/wrong_mean", "length of wrong responses", TOKENS),
    # a budget's cuts: overlong filtering changes the update only for a cut response beside a correct one
    Panel("truncation_rate", "truncation rate", "fraction of responses"),
    Panel("truncation/beside_correct_frac", "cut beside a correct one", "fraction of truncated"),
]
# The tail of the training–inference IS weights (MiniRL §5.1): what an uncorrected gradient takes at full weight
# and the truncated weight min(π/μ, C) cuts.
IS_TAIL_PANELS = [
    Panel("ti/abs_logdiff_max", "max |log π_old − log μ|", "nats", floor=1e-4, floor_cause=F32_ROUNDING),
    Panel("ti/chi2_token", "χ² of token weights", "E[w²] − 1", floor=1e-6, floor_cause=F32_ROUNDING),
    Panel("ti/chi2_seq", "χ² of sequence weights", "E[w²] − 1", floor=1e-6, floor_cause=F32_ROUNDING),
    Panel("policy_loss/is_weight_max", "largest IS weight used", "π/μ (truncated)"),
    Panel("policy_loss/is_truncated_frac", "IS weights truncated", FRACTION_OF_TOKENS),
]


class Figures:
    """The report's figures by name, kept for --export after their PNG is embedded in the page."""

    def __init__(self):
        self.items: list[tuple[str, plots.CurvesFigure]] = []

    def html(self, name: str, result: plots.CurvesFigure, what: str) -> str:
        """The <img> and a note on what was folded or drawn as points. On screen the figure is shown at 1.4×
        its print size (CSS inches), on paper at its print size."""
        self.items.append((name, result))
        notes = []
        if result.sparse:
            notes.append("Drawn as points, one per seed and step (logged at few steps): "
                         + ", ".join(_e(p.title) for p in result.sparse) + ".")
        if result.folded:
            notes.append("Not drawn, no signal: " + "; ".join(_e(f) for f in result.folded) + ".")
        note = "".join(f"<p class='note fold'>{n}</p>" for n in notes)
        if result.figure is None:
            return (f"<p class='note'>No run logged {_e(what)}.</p>" if not result.folded else "") + note
        min_font = min(plots.FONT_PT.values())
        return (f"<figure><img alt='{_e(what)}' src='{result.data_uri()}' "
                f"style='--print-width:{result.width_in:.2f}in' data-width-in='{result.width_in:.2f}' "
                f"data-min-font-pt='{min_font}' data-panels='{len(result.panels)}'></figure>{note}")

    def export(self, directory: Path) -> list[Path]:
        written = []
        for name, result in self.items:
            if result.figure is not None:
                written += plots.save_figure(result.figure, Path(directory) / name)
        return written


def _e(value) -> str:
    return html.escape(str(value))


def _table(header: Sequence[str] | None, rows: Sequence[Sequence[str]], left: int = 2) -> str:
    """An HTML table (no header row when `header` is None); the first `left` columns are left-aligned text;
    cells are already-escaped HTML."""
    head = "".join(f"<th class='l'>{h}</th>" if i < left else f"<th>{h}</th>" for i, h in enumerate(header or []))
    head = f"<tr>{head}</tr>" if header else ""
    body = "".join("<tr>" + "".join(f"<td class='l'>{c}</td>" if i < left else f"<td>{c}</td>"
                                    for i, c in enumerate(row)) + "</tr>" for row in rows)
    return f"<table>{head}{body}</table>"


# ---------------------------------------------------------------------------------------------- sections
def _setup_section(spec_info: dict | None, records: Sequence[RunRecord]) -> str:
    if not spec_info:
        rows = [[_e(r.variant), f"<code>{_e(r.directory)}</code>", "yes" if r.finished else "no"] for r in records]
        return "<h2>Runs</h2>" + _table(["run", "directory", "finished"], rows)
    parts = ["<h2>Setup</h2>"]
    if spec_info.get("description"):
        parts.append(f"<p>{_e(spec_info['description'])}</p>")
    if spec_info.get("paper_finding"):
        parts.append(f"<div class='finding'><b>What the paper found.</b> {_e(spec_info['paper_finding'])}</div>")
    overrides = lambda items: " ".join(f"<code>{_e(o)}</code>" for o in items) or "–"  # noqa: E731
    rows = [["preset", f"<code>{_e(spec_info['preset'])}</code>"], ["every run", overrides(spec_info["base"])],
            ["seeds", _e(", ".join(map(str, spec_info["seeds"])))],
            ["score", f"<code>{_e(spec_info['metric'])}</code>"]]
    parts.append(_table(None, rows))
    arms = [[_e(name) + (" (baseline)" if name == spec_info["baseline"] else ""), "variant",
             overrides(([f"--preset {arm['preset']}"] if arm.get("preset") else []) + arm["overrides"])]
            for name, arm in spec_info["variants"].items()]
    arms += [[_e(name), "scenario", overrides(arm["overrides"])] for name, arm in spec_info["scenarios"].items()]
    parts.append(_table(["name", "kind", "overrides"], arms, left=3))
    return "".join(parts)


def _verdict_html(entry: dict) -> str:
    css = {"helps": "helps", "hurts": "hurts", "no detectable difference": "none"}.get(entry["verdict"], "few")
    if entry["mean_diff"] is None:
        return "–"
    ci = (f" [{entry['ci_low']:+.3f}, {entry['ci_high']:+.3f}]" if entry["ci_low"] is not None else "")
    t_ci = (f"<br><span class='note'>t: [{entry['t_ci_low']:+.3f}, {entry['t_ci_high']:+.3f}]</span>"
            if entry["t_ci_low"] is not None else "")
    detectable = format_detectable(entry)
    detectable = f"<br><span class='note'>{_e(detectable)}</span>" if detectable else ""
    fragile = format_fragility(entry)
    fragile = f"<br><span class='few'>{_e(fragile)}</span>" if fragile else ""
    noise = format_eval_noise(entry)
    if noise:
        noise = f"<br><span class='{'few' if eval_noise_is_notable(entry) else 'note'}'>{_e(noise)}</span>"
    return (f"{entry['mean_diff']:+.3f}{ci} <span class='{css}'>{_e(entry['verdict'])}</span>{fragile}{t_ci}"
            f"{detectable}{noise}")


def _statistics_section(summary: dict) -> str:
    metric, scores, intervals = _e(summary["metric"]), summary["scores"], summary["intervals"]
    parts = ["<h2>Statistics</h2>",
             f"<p class='note'>Scores of each run's <code>{metric}</code> curve: <b>final</b> = "
             f"{_e(scores['final'])}; <b>best</b> = {_e(scores['best'])}; <b>AUC</b> = {_e(scores['auc'])}. "
             f"Cells: {_e(intervals['cells'])} (95%). Comparisons: {_e(intervals['comparisons'])}. "
             f"Verdict: {_e(intervals['verdict'])}. "
             f"<b>MDE</b> (minimum detectable effect) and seeds needed: {_e(intervals.get('detectable', ''))}. "
             "A true effect as large as the MDE would have been detected in 80% of such experiments; "
             "“no detectable difference” says little about smaller ones.</p>"]
    rows = [[_e(c["variant"]), _e(c["scenario"]), str(c["n"]), *(format_cell(c[s]) for s in SCORES)]
            for c in summary["cells"]]
    parts.append(_table(["variant", "scenario", "seeds", "final", "best", "AUC"], rows))
    if summary["comparisons"]:
        parts.append(f"<h3>Paired difference against the baseline <code>{_e(summary['baseline'])}</code></h3>")
        rows = [[_e(c["variant"]), _e(c["scenario"]), str(c["final"]["n_pairs"]),
                 *(_verdict_html(c[s]) for s in SCORES)] for c in summary["comparisons"]]
        parts.append(_table(["variant", "scenario", "pairs", "Δ final", "Δ best", "Δ AUC"], rows))
        parts.append("<p class='note'>Scenario <code>all</code> pools the scenarios: one pair per seed, that "
                     "seed's differences averaged over the scenarios.</p>")
        if any("eval_noise" in c[score] for c in summary["comparisons"] for score in EVAL_NOISE_SCORES):
            parts.append(f"<p class='note'><b>Evaluation noise</b> (Δ final, Δ AUC): "
                         f"{_e(summary['intervals'].get('eval_noise', ''))}.</p>")
    missing = summary["runs"]["missing"]
    if missing:
        items = "".join(f"<li>{_e(m['variant'])}/{_e(m['scenario'])}/seed_{m['seed']}: {_e(m['reason'])}</li>"
                        for m in missing)
        parts.append(f"<div class='missing'><b>{len(missing)} of {summary['runs']['expected']} runs are missing "
                     f"from these statistics.</b><ul>{items}</ul></div>")
    rows = [[_e(r["variant"]), _e(r["scenario"]), str(r["seed"]), *(f"{r[s]:.3f}" for s in SCORES)]
            for r in summary["per_run"]]
    parts.append("<details><summary>Per-run scores</summary>"
                 + _table(["variant", "scenario", "seed", "final", "best", "AUC"], rows) + "</details>")
    return "".join(parts)


def _curves_section(records, variants, scenarios, styles, metric: str, figures: Figures,
                    metric_source: str = "eval") -> str:
    def figure(name, panels, what):
        return figures.html(name, plots.curves_figure(records, panels, variants, scenarios, styles), what)

    if metric_source == "eval":
        accuracy_keys = [metric]
        scored = ""
    else:       # a training metric is scored: draw it first, then whatever held-out accuracy the runs logged
        accuracy_keys = sorted({k for r in records for k in r.eval_keys() if k.endswith("/accuracy")
                                and not k.endswith("greedy_accuracy")})
        scored = (f"<h3>The scored metric</h3><p class='note'>{TRAIN_NOTE.split(' Clipped')[0]}</p>"
                  + figure("scored", [Panel(metric, metric, _unit(metric))], metric))
    held_out = []
    for key in accuracy_keys:
        held_out.append(Panel(key, key, "accuracy (fraction)" if key.endswith("accuracy") else key, "eval"))
        greedy = key.replace("/accuracy", "/greedy_accuracy")
        if greedy != key:
            held_out.append(Panel(greedy, greedy, held_out[-1].unit, "eval"))
    return ("<h2>Learning curves</h2>" + scored
            + f"<h3>Held-out accuracy</h3><p class='note'>{HELD_OUT_NOTE}</p>"
            + figure("held_out", held_out, "held-out accuracy")
            + f"<h3>Training</h3><p class='note'>{TRAIN_NOTE}</p>"
            + figure("training", TRAINING_PANELS, "training metrics"))


def _unit(key: str) -> str:
    """The y-axis label of a training metric scored by a spec: the unit of its panel in the report, if it has one."""
    for panel in [*TRAINING_PANELS, *ENTROPY_PANELS, *IS_PANELS, *MISMATCH_PANELS]:
        if panel.key == key:
            return panel.unit
    return key


def _clipped_tokens_html(records, variants, scenarios) -> str:
    blocks = []
    for scenario in scenarios:
        for variant in variants:
            group = [r for r in records if r.variant == variant and r.scenario == scenario and r.diagnostics]
            if not group:
                continue
            sides = []
            for side in ("low", "high"):
                counts: Counter = Counter()
                for r in group:
                    for item in r.diagnostics.get("clipped_tokens", {}).get(side, []):
                        counts[str(item.get("token"))] += int(item.get("count", 0))
                rows = [[f"<span class='tok'>{_e(_show_token(tok))}</span>", str(n)]
                        for tok, n in counts.most_common(20)]
                sides.append(f"<div><b>{side} side</b>" + (_table(["token", "count"], rows, left=1) if rows
                                                          else "<p class='note'>none clipped</p>") + "</div>")
            blocks.append(f"<div><h4>{_e(variant)} · {_e(scenario)} ({len(group)} runs)</h4>"
                          f"<div class='grid'>{''.join(sides)}</div></div>")
    if not blocks:
        return "<p class='note'>No run wrote diagnostics.json yet (it is written when a run finishes).</p>"
    return f"<div class='grid'>{''.join(blocks)}</div>"


def _show_token(token: str) -> str:
    """Whitespace made visible, so that a clipped space or newline can be told apart from nothing."""
    return token.replace(" ", "␣").replace("\n", "⏎").replace("\t", "⇥") or "∅"


def _repetition_table(records, variants, scenarios) -> str:
    """Per cell, over all steps and seeds, weighting each step by its truncation rate (a step with no
    truncated response says nothing about their repetition)."""
    rows = []
    for scenario in scenarios:
        for variant in variants:
            group = [r for r in records if r.variant == variant and r.scenario == scenario]
            weights, fracs = [], []
            for r in group:
                truncation = dict(zip(*r.metric_curve("truncation_rate")))
                for step, frac in zip(*r.metric_curve("repetition/truncated_repetitive_frac")):
                    weights.append(truncation.get(step, 0.0))
                    fracs.append(frac)
            total = sum(weights)
            mean_truncation = [v for r in group for v in r.metric_curve("truncation_rate")[1]]
            if not mean_truncation:
                continue
            repetitive = sum(w * f for w, f in zip(weights, fracs)) / total if total > 0 else None
            rows.append([_e(variant), _e(scenario), f"{sum(mean_truncation) / len(mean_truncation):.3f}",
                         f"{repetitive:.3f}" if repetitive is not None else "–",
                         f"{1 - repetitive:.3f}" if repetitive is not None else "–"])
    if not rows:
        return ""
    return _table(["variant", "scenario", "truncation rate", "repetitive", "not repetitive"], rows)


def _mean_table(records, variants, scenarios, panels: Sequence[Panel]) -> str:
    """Per variant and scenario, each panel's metric averaged over each run's logged steps, then over the seeds,
    [lowest seed, highest seed]; only the metrics the figure draws (logged, with signal: plots.fold_reason),
    and nothing when there are none."""
    def drawn(panel: Panel) -> bool:
        values = [v for r in records for v in r.metric_curve(panel.key)[1]]
        return bool(values) and plots.fold_reason(panel, values) is None

    logged = [p for p in panels if drawn(p)]
    rows = []
    for scenario in scenarios:
        for variant in variants:
            group = [r for r in records if r.variant == variant and r.scenario == scenario]
            cells = []
            for panel in logged:
                per_run = [sum(values) / len(values) for r in group if (values := r.metric_curve(panel.key)[1])]
                cells.append(f"{sum(per_run) / len(per_run):.4g} [{min(per_run):.4g}, {max(per_run):.4g}]"
                             if per_run else "–")
            if any(c != "–" for c in cells):
                rows.append([_e(variant), _e(scenario), str(len(group)), *cells])
    if not rows:
        return ""
    return _table(["variant", "scenario", "runs", *(f"<code>{_e(p.key)}</code>" for p in logged)], rows)


class _DiagnosticsInput:
    """What every mechanism-diagnostics section reads: the runs, their variants and scenarios, and the figures
    the page collects (each section's figure is drawn when the section is built, in page order)."""

    def __init__(self, records, variants, scenarios, styles, figures: Figures):
        self.records, self.variants, self.scenarios = records, variants, scenarios
        self.styles, self.figures = styles, figures

    def figure(self, name, panels, what) -> str:
        return self.figures.html(name, plots.curves_figure(self.records, panels, self.variants, self.scenarios,
                                                           self.styles), what)

    def table(self, panels) -> str:
        return _mean_table(self.records, self.variants, self.scenarios, panels)


def _clipped_tokens_section(d: _DiagnosticsInput) -> str:
    return ("<h3>Clipped tokens</h3><p class='note'>The token strings that most often hit a binding clip bound "
            "(low: A&lt;0 and ρ&lt;1−ε_low; high: A&gt;0 and ρ&gt;1+ε_high), summed over seeds (top 20 per run, "
            "from diagnostics.json). The LitePPO paper found discourse connectives clipped at ε_high = 0.2 and "
            "function tokens at 0.28 (algorithms.md §8.2.4).</p>"
            + _clipped_tokens_html(d.records, d.variants, d.scenarios))


def _lengths_section(d: _DiagnosticsInput) -> str:
    return ("<h3>Response lengths</h3><p class='note'>How far apart response lengths are within a step (10th and "
            "90th percentiles, std / mean) and how long correct and wrong responses are. Sequence-level "
            "aggregation weighs each token of response i by 1/L_i, token-level by 1/Σ L: they differ only when "
            "lengths differ (LitePPO Takeaway 7, algorithms.md §3); a length budget below the long correct "
            "solutions truncates them (Takeaway 8); overlong filtering changes the update only for a cut response "
            "whose group holds a correct one (elsewhere its advantage is 0 either way; logged at steps that cut "
            "something). The table averages each run's steps, then the seeds.</p>"
            + d.table(LENGTH_PANELS) + d.figure("lengths", LENGTH_PANELS, "response_length/*, truncation"))


def _repetition_section(d: _DiagnosticsInput) -> str:
    return ("<h3>Repetition of truncated responses</h3><p class='note'>Fraction of truncated responses whose tail "
            "is a repetition loop (a periodic suffix covering ≥ 20% of the response), per step; the table weights "
            "each step by its truncation rate. The paper: wrong responses repeat far more than correct ones, and "
            "overlong filtering lowers the repeat ratio (§8.2.6–7).</p>"
            + _repetition_table(d.records, d.variants, d.scenarios)
            + d.figure("repetition", REPETITION_PANELS, "repetition/*"))


def _reward_std_by_tier_section(d: _DiagnosticsInput) -> str:
    tiers = [Panel(k, f"reward std, {k.rsplit('/', 1)[-1]}", "std of reward")
             for k in sorted(plots.keys_with_prefix(d.records, "groups/reward_std/"), key=plots.natural_key)]
    return ("<h3>Reward std within groups, by difficulty tier</h3><p class='note'>On easy data the within-group "
            "std falls fast, so dividing advantages by it amplifies small differences (§8.2.2). A group of equal "
            "rewards (std 0) has advantage 0 unless a batch mean centres it; a small nonzero std (under 0.1: graded, "
            "since binary ones at G = 8 give 0 or ≥ 0.33) is what a std normalisation amplifies more than 10×; "
            "dynamic sampling drops some groups (§4.3: by correctness or by reward). Steps, then seeds, averaged.</p>"
            + d.table(GROUP_STD_PANELS)
            + d.figure("group_std", GROUP_STD_PANELS, "groups/*_std_*, advantage/equal_reward_abs, collect/kept_*")
            + d.figure("reward_std_by_tier", tiers, "groups/reward_std/<tier>"))


def _is_decomposition_section(d: _DiagnosticsInput) -> str:
    return ("<h3>Importance-weight decomposition</h3><p class='note'>π_θ/μ = [π_old/μ] (training–inference, "
            "<code>ti/*</code>) × [π_θ/π_old] (staleness, <code>st/*</code>); <code>share/*</code> says which "
            "factor carries the total |log w| (algorithms.md §7).</p>"
            + d.figure("is_decomposition", IS_PANELS, "ti/*, st/*, share/*"))


def _mismatch_routing_section(d: _DiagnosticsInput) -> str:
    return ("<h3>Training–inference mismatch and Routing Replay</h3><p class='note'>The gap between the engine "
            "that sampled (μ) and the trainer at θ_old (<code>ti/*</code>: KL(μ‖π_old) as the MiniRL paper plots "
            "it, the worst token's log-ratio, the effective sample size of the token weights), and on MoE models "
            "the share of (token, layer) pairs whose top-k experts agree between the engine and the trainer "
            "(<code>moe/route_agree_ti</code>) and between θ_old and θ in the update "
            "(<code>moe/route_agree_st</code>); Routing Replay (R2/R3) makes the replayed side agree by "
            "construction (algorithms.md §6–7). The table averages each run's steps, then the seeds.</p>"
            + d.table(MISMATCH_PANELS)
            + d.figure("mismatch_routing", MISMATCH_PANELS, "ti/kl_k1, ti/abs_logdiff_max, ti/ess, moe/route_agree_*"))


def _is_tails_section(d: _DiagnosticsInput) -> str:
    return ("<h3>Tails of the training–inference IS weights</h3><p class='note'>The worst token's log-ratio, the "
            "χ² divergence (the variance of the weights per token and per sequence), the largest weight the loss "
            "used and the share it truncated: the tokens an uncorrected gradient takes at full weight (MiniRL "
            "§5.1). The table averages each run's steps, then the seeds.</p>"
            + d.table(IS_TAIL_PANELS)
            + d.figure("is_tails", IS_TAIL_PANELS,
                       "ti/chi2_*, policy_loss/is_weight_max, policy_loss/is_truncated_frac"))


def _route_drift_section(d: _DiagnosticsInput) -> str:
    drift = [Panel(k, f"routes agree, mini-batch {k.rsplit('mb', 1)[-1]}", AGREEMENT)
             for k in sorted(plots.keys_with_prefix(d.records, "moe/route_agree_st_mb"), key=plots.natural_key)]
    drift += [Panel(k, f"KL staleness, mini-batch {k.rsplit('mb', 1)[-1]}", NATS)
              for k in sorted(plots.keys_with_prefix(d.records, "st/ppo_kl_mb"), key=plots.natural_key)]
    return ("<h3>Route drift by mini-batch</h3><p class='note'>Share of (token, layer) pairs whose top-k experts "
            "under θ are those of θ_old, and the staleness KL, for each mini-batch of a step (mini-batch k follows "
            "k optimizer steps on the batch): off-policy updates move routes further with every mini-batch, which "
            "is what Routing Replay fixes (MiniRL §5.2; algorithms.md §6). The table averages each run's steps, "
            "then the seeds.</p>"
            + d.table(drift) + d.figure("route_drift", drift, "moe/route_agree_st_mb*, st/ppo_kl_mb*"))


def _entropy_section(d: _DiagnosticsInput) -> str:
    return ("<h3>Entropy</h3><p class='note'>Token entropy of π_θ on the sampled responses; clip-higher is meant "
            "to slow its collapse (§8.2.3).</p>" + d.figure("entropy", ENTROPY_PANELS, "entropy/*"))


def _selection_section(d: _DiagnosticsInput) -> str:
    return _selection_html(d.records, d.variants, d.scenarios, d.figure)


# One builder per name of MECHANISM_SECTIONS, in its order.
DIAGNOSTICS_SECTIONS = {
    "clipped_tokens": _clipped_tokens_section, "lengths": _lengths_section, "repetition": _repetition_section,
    "reward_std_by_tier": _reward_std_by_tier_section, "is_decomposition": _is_decomposition_section,
    "mismatch_routing": _mismatch_routing_section, "is_tails": _is_tails_section,
    "route_drift": _route_drift_section, "entropy": _entropy_section, "selection": _selection_section,
}
assert tuple(DIAGNOSTICS_SECTIONS) == MECHANISM_SECTIONS


def _diagnostics_section(records, variants, scenarios, styles, figures: Figures,
                         lead: Sequence[str] = ()) -> str:
    """The mechanism diagnostics, one section each (MECHANISM_SECTIONS); the ones a spec names as the mechanism of
    its finding (`mechanism:`) come first, under their own heading, so the panel that explains the result is the
    first diagnostic a reader meets after the learning curves."""
    d = _DiagnosticsInput(records, variants, scenarios, styles, figures)
    lead = [name for name in lead if name in DIAGNOSTICS_SECTIONS]
    parts = []
    if lead:
        parts.append("<h2>The mechanism of this finding</h2><p class='note'>The diagnostics the spec names as the "
                     "mechanism behind its claim (<code>mechanism:</code>); the others follow below.</p>")
        parts += [DIAGNOSTICS_SECTIONS[name](d) for name in lead]
    parts.append("<h2>Other mechanism diagnostics</h2>" if lead else "<h2>Mechanism diagnostics</h2>")
    parts += [build(d) for name, build in DIAGNOSTICS_SECTIONS.items() if name not in lead]
    return "".join(parts)


def _selection_html(records, variants, scenarios, figure) -> str:
    """The entropy-control and masking tricks at work, when a run used one (algorithms.md §10): the share of
    tokens or responses each selected per step, and the entropy of the selected tokens (of the update's forward)."""
    table = _mean_table(records, variants, scenarios, SELECTION_PANELS + SELECTED_ENTROPY_PANELS)
    if not table:
        return ""
    return ("<h3>What the entropy-control and masking tricks selected</h3><p class='note'>Per step: the share of "
            "tokens Clip-Cov detached, KL-Cov penalised and the 80/20 mask kept, the share of responses OPSM masked, "
            "and the mean entropy of the selected tokens (compare with the token entropy above). The table averages "
            "each run's steps, then the seeds (algorithms.md §10).</p>" + table
            + figure("selection", SELECTED_ENTROPY_PANELS, "the selected tokens' entropy"))


# ---------------------------------------------------------------------------------------------- the page
def build_report(path: str | Path, records: Sequence[RunRecord], summary: dict, *, title: str,
                 spec_info: dict | None = None, export_dir: str | Path | None = None) -> Path:
    """Write the self-contained report.html atomically and return its path; with `export_dir`, also every
    figure as PDF, SVG and PNG and every table as CSV and LaTeX there (literl/arena/export.py)."""
    variants, scenarios = summary["variants"], summary["scenarios"]
    styles = plots.variant_styles(variants)
    figures = Figures()
    body = [f"<h1>{_e(title)}</h1>",
            f"<p class='note'>Generated {time.strftime('%Y-%m-%d %H:%M')} by <code>literl</code> from "
            f"{len(records)} run directories; {summary['runs']['used']} finished runs enter the statistics.</p>",
            _setup_section(spec_info, records), _statistics_section(summary) + sequential_html(summary),
            _curves_section(records, variants, scenarios, styles, summary["metric"], figures,
                            summary.get("metric_source", "eval")),
            _diagnostics_section(records, variants, scenarios, styles, figures,
                                 (spec_info or {}).get("mechanism", ()))]
    page = ("<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
            f"<title>{_e(title)}</title><style>{CSS}</style></head><body>{''.join(body)}</body></html>")
    if export_dir is not None:
        from literl.arena.export import write_tables

        figures.export(Path(export_dir))
        write_tables(summary, export_dir)
    return write_text_atomic(path, page)
