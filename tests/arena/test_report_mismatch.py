"""The MiniRL study's signals in the report (issue 19's minirl_stability spec): the training–inference gap
(`ti/*`) and MoE route agreement (`moe/route_agree_*`) drawn per variant among the mechanism panels with a table of
their means, and folded away when no run logged them or they carry no signal."""

from __future__ import annotations

import json

from literl.arena import ablation, plots
from literl.arena.report import MISMATCH_PANELS
from literl.arena.runs import load_run
from literl.arena.spec import parse_spec
from tests.arena.fake_runs import write_run

STEPS = 4
SPEC = {"name": "moe_like", "preset": "minirl", "baseline": "minirl", "seeds": 2,
        "variants": {"minirl": {}, "minirl_r3": {"algorithm.routing_replay": "r3"}},
        "scenarios": {"on_policy": {"trainer.minibatches": 1}, "off_policy": {"trainer.minibatches": 4}}}


def moe_metrics(variant: str, scenario: str, seed: int, step: int) -> dict:
    """ti/kl_k1 = 0.01·step·(1 + seed): mean over steps 1..4 is 0.025·(1 + seed), so 0.025 and 0.05 for seeds 0
    and 1, averaged 0.0375. route_agree_ti = a − 0.02·step with a = 0.90 (minirl) or 0.95 (minirl_r3): means
    0.85 and 0.90. route_agree_st is exactly 1 on-policy and 1 − 0.01·step off-policy (mean 0.975).
    ti/ess is 1 up to float noise everywhere; ti/abs_logdiff_max is never logged."""
    start = 0.90 if variant == "minirl" else 0.95
    return {"ti/kl_k1": 0.01 * step * (1 + seed), "moe/route_agree_ti": start - 0.02 * step,
            "moe/route_agree_st": 1.0 if scenario == "on_policy" else 1 - 0.01 * step,
            "ti/ess": 1.0 - (step % 2) * 1e-14}


def make_runs(out, metrics):
    spec = parse_spec(SPEC, source="moe_like.yaml")
    runs = spec.plan(out)
    for run in runs:
        write_run(run.directory, [0.3, 0.4], eval_every=STEPS, seed=run.seed)
        with open(run.directory / "metrics.jsonl", "w") as f:
            for step in range(1, STEPS + 1):
                record = {"step": step, "accuracy": 0.5, **metrics(run.variant, run.scenario, run.seed, step)}
                f.write(json.dumps(record) + "\n")
    ablation.record_plan(out, spec, runs)
    return spec, runs


def test_moe_runs_show_mismatch_and_route_agreement_per_variant(tmp_path):
    spec, runs = make_runs(tmp_path, moe_metrics)
    records = [load_run(r.directory, variant=r.variant, scenario=r.scenario) for r in runs]
    variants, scenarios = ["minirl", "minirl_r3"], ["on_policy", "off_policy"]
    styles = plots.variant_styles(variants)
    result = plots.curves_figure(records, MISMATCH_PANELS, variants, scenarios, styles)
    assert [p.key for p in result.panels] == ["ti/kl_k1", "moe/route_agree_ti", "moe/route_agree_st"]
    assert result.folded == ["ESS train–inference: constant 1 (range 1e-14: float noise) in every run"]
    # one column per scenario, one row per panel; in each panel a line in each variant's colour
    axes = [ax for ax in result.figure.axes if ax.get_visible()]
    assert len(axes) == 2 * 3
    for ax in axes:
        assert {line.get_color() for line in ax.lines} == {styles[v].color for v in variants}, ax.get_title()

    ablation.summarize_ablation(tmp_path)
    page = (tmp_path / "report.html").read_text()
    section = page.split("Training–inference mismatch and Routing Replay</h3>")[1].split("<h3>")[0]
    assert "data-panels='3'" in section and "Not drawn, no signal: ESS train–inference" in section
    rows = {tuple(cell.split("</td>")[0] for cell in row.split("<td class='l'>")[1:3]): row
            for row in section.split("<tr>")[2:]}
    assert set(rows) == {(v, s) for v in variants for s in scenarios}
    header = section.split("<tr>")[1]
    assert [h.split("</code>")[0] for h in header.split("<code>")[1:]] == [
        "ti/kl_k1", "moe/route_agree_ti", "moe/route_agree_st"]

    def cells(variant, scenario):
        return [c.split("</td>")[0] for c in rows[(variant, scenario)].split("<td>")[1:]]

    assert cells("minirl", "off_policy") == ["2", "0.0375 [0.025, 0.05]", "0.85 [0.85, 0.85]", "0.975 [0.975, 0.975]"]
    assert cells("minirl_r3", "on_policy") == ["2", "0.0375 [0.025, 0.05]", "0.9 [0.9, 0.9]", "1 [1, 1]"]


def test_dense_runs_with_an_exact_engine_fold_the_section_away(tmp_path):
    """No moe/* keys (a dense model) and ti/kl_k1 exactly 0 (the engine computes what the trainer does)."""
    make_runs(tmp_path, lambda variant, scenario, seed, step: {"ti/kl_k1": 0.0})
    ablation.summarize_ablation(tmp_path)
    page = (tmp_path / "report.html").read_text()
    section = page.split("Training–inference mismatch and Routing Replay</h3>")[1].split("<h3>")[0]
    assert "<img" not in section and "<table" not in section
    assert "Not drawn, no signal: KL train–inference (k1): always 0 in every run." in section
    assert "routes agree" not in section


def float32_rounding(variant, scenario, seed, step):
    """What the positive control's dense runs logged with literl's float32 engine: a k1 KL of about −1.3e-8 and
    a worst-token |log-ratio| of about 1e-6, varying from step to step by as much as they are large."""
    return {"ti/kl_k1": -1e-8 * (1 + (step + seed) % 3), "ti/abs_logdiff_max": 1e-6 * (1 + step % 2),
            "ti/kl_k3": 1e-13 * step}


def test_float32_rounding_between_engine_and_trainer_is_folded_not_drawn_as_a_trend(tmp_path):
    """Ranges of 2e-8 and 1e-6 are above the generic float-noise tolerance (1e-9), so only the ti/ floors
    (1e-6 nats for the KLs, 1e-4 for the worst token) keep them from being plotted as curves."""
    _, runs = make_runs(tmp_path, float32_rounding)
    records = [load_run(r.directory, variant=r.variant, scenario=r.scenario) for r in runs]
    assert plots.no_signal([v for r in records for v in r.metric_curve("ti/kl_k1")[1]]) is None
    ablation.summarize_ablation(tmp_path)
    page = (tmp_path / "report.html").read_text()
    section = page.split("Training–inference mismatch and Routing Replay</h3>")[1].split("<h3>")[0]
    assert "<img" not in section and "<table" not in section
    assert ("KL train–inference (k1): |value| ≤ 1e-06 throughout (float32 rounding between engine and trainer) "
            "in every run") in section
    assert "max |log π_old − log μ|: |value| ≤ 0.0001 throughout (float32 rounding" in section


def test_one_value_above_the_floor_draws_the_panel_for_every_run(tmp_path):
    def spiky(variant, scenario, seed, step):
        return {"ti/kl_k1": 2e-6 if (variant, scenario, seed, step) == ("minirl", "on_policy", 0, 4) else 1e-8}

    _, runs = make_runs(tmp_path, spiky)
    records = [load_run(r.directory, variant=r.variant, scenario=r.scenario) for r in runs]
    variants = ["minirl", "minirl_r3"]
    result = plots.curves_figure(records, MISMATCH_PANELS, variants, ["on_policy", "off_policy"],
                                 plots.variant_styles(variants))
    assert [p.key for p in result.panels] == ["ti/kl_k1"] and result.folded == []
