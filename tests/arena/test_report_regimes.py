"""The findings specs' additions to the arena (issue 34): a spec may score a per-step training metric
(`metric_source: train`, e.g. entropy for the clip-higher claim), and the report shows the mechanism behind each
finding — response lengths (aggregation, length budgets), IS-weight tails (train–inference correction) and route
drift by mini-batch (Routing Replay) — each with a table of per-run means, like the mismatch panels."""

from __future__ import annotations

import json

import pytest

from literl.arena import ablation, plots
from literl.arena.runs import load_run
from literl.arena.spec import parse_spec
from literl.arena.summary import summarize
from literl.config.errors import ConfigError
from tests.arena.fake_runs import write_run

STEPS = 4
SPEC = {"name": "regimes", "preset": "grpo", "baseline": "sequence", "seeds": 2,
        "variants": {"sequence": {}, "token": {"algorithm.aggregation.name": "token_mean"}}}


def make_runs(out, metrics, spec=SPEC):
    spec = parse_spec(spec, source="regimes.yaml")
    runs = spec.plan(out)
    for run in runs:
        write_run(run.directory, [0.3, 0.4], eval_every=STEPS, seed=run.seed)
        with open(run.directory / "metrics.jsonl", "w") as f:
            for step in range(1, STEPS + 1):
                f.write(json.dumps({"step": step, **metrics(run.variant, run.seed, step)}) + "\n")
    ablation.record_plan(out, spec, runs)
    return spec, runs


def entropy(variant, seed, step):
    """entropy/mean = 0.1 − 0.01·step (sequence) or 0.1 − 0.005·step (token), + 0.002·seed."""
    slope = 0.01 if variant == "sequence" else 0.005
    return {"entropy/mean": 0.1 - slope * step + 0.002 * seed}


def test_a_training_metric_is_scored_from_every_step(tmp_path):
    """Seed 0, token: entropy 0.095, 0.09, 0.085, 0.08 at steps 1..4: final 0.08, best 0.095, AUC (trapezoid over
    the span 3) = (0.0925 + 0.0875 + 0.0825) / 3 = 0.0875; sequence: final 0.06, AUC 0.075. Paired Δ final
    = +0.02 on both seeds (the seed offset cancels), Δ AUC = +0.0125."""
    make_runs(tmp_path, entropy, {**SPEC, "metric": "entropy/mean", "metric_source": "train"})
    summary = ablation.summarize_ablation(tmp_path)
    assert summary["metric_source"] == "train" and "metrics.jsonl" in summary["scores"]["final"]
    token0 = next(r for r in summary["per_run"] if r["variant"] == "token" and r["seed"] == 0)
    assert token0["final"] == pytest.approx(0.08) and token0["best"] == pytest.approx(0.095)
    assert token0["auc"] == pytest.approx(0.0875)
    comparison = summary["comparisons"][0]
    assert comparison["final"]["mean_diff"] == pytest.approx(0.02) and comparison["final"]["verdict"] == "helps"
    assert comparison["auc"]["mean_diff"] == pytest.approx(0.0125)
    page = (tmp_path / "report.html").read_text()
    scored = page.split("The scored metric</h3>")[1].split("<h3>")[0]
    assert "data-panels='1'" in scored and "alt='entropy/mean'" in scored
    assert "alt='held-out accuracy'" in page, "the held-out accuracy the runs logged is still drawn"


def test_a_run_without_the_training_metric_is_named_missing(tmp_path):
    spec, runs = make_runs(tmp_path, lambda v, s, step: {"accuracy": 0.5})
    records = [load_run(r.directory, variant=r.variant, scenario=r.scenario) for r in runs]
    summary = summarize(records, metric="entropy/mean", metric_source="train", variants=spec.variant_names,
                        scenarios=spec.scenario_names, baseline="sequence")
    assert summary["runs"]["used"] == 0
    assert {m["reason"] for m in summary["runs"]["missing"]} == {"no 'entropy/mean' in metrics.jsonl"}


def test_an_unknown_metric_source_is_refused():
    with pytest.raises(ConfigError, match="metric_source 'held_out' must be one of eval, train"):
        parse_spec({**SPEC, "metric_source": "held_out"})


def lengths(variant, seed, step):
    """sequence: lengths p10 20, p90 100, cv 0.5; token: p90 80, cv 0.4 (seed 1 adds 0.1 to cv); correct 30,
    wrong 70 throughout."""
    p90, cv = (100.0, 0.5) if variant == "sequence" else (80.0, 0.4)
    return {"response_length/p10": 20.0, "response_length/mean": 50.0 + step, "response_length/p90": p90,
            "response_length/cv": cv + 0.1 * seed, "response_length/correct_mean": 30.0,
            "response_length/wrong_mean": 70.0}


def section(page: str, title: str) -> str:
    return page.split(f"{title}</h3>")[1].split("<h3>")[0]


def table_cells(part: str, variant: str) -> list[str]:
    row = next(r for r in part.split("<tr>")[2:] if r.split("<td class='l'>")[1].startswith(variant))
    return [c.split("</td>")[0] for c in row.split("<td>")[1:]]


def test_response_lengths_are_drawn_and_tabled_per_variant(tmp_path):
    """The length section draws every length panel with signal (p10 and the correct/wrong means are constant
    and fold away) and tables each run's mean over steps: mean length 52.5 (51..54), cv 0.5 and 0.6 by seed."""
    make_runs(tmp_path, lengths)
    ablation.summarize_ablation(tmp_path)
    part = section((tmp_path / "report.html").read_text(), "Response lengths")
    header = part.split("<tr>")[1]
    assert [h.split("</code>")[0] for h in header.split("<code>")[1:]] == [
        "response_length/mean", "response_length/p90", "response_length/cv"]
    assert table_cells(part, "sequence") == ["2", "52.5 [52.5, 52.5]", "100 [100, 100]", "0.55 [0.5, 0.6]"]
    assert table_cells(part, "token") == ["2", "52.5 [52.5, 52.5]", "80 [80, 80]", "0.45 [0.4, 0.5]"]
    assert "data-panels='3'" in part and "length, 10th percentile: constant 20" in part


def group_std(variant, seed, step):
    """sequence: zero-std groups 0.1·step, small-std ones 0.5 (seed 1: 0.6), mean std 0.2, dynamic sampling
    keeping 1 − 0.1·step of the groups it sampled; token: zero 0.0, small 0.4, mean std 0.3, every group kept."""
    if variant == "sequence":
        return {"groups/zero_std_frac": 0.1 * step, "groups/small_std_frac": 0.5 + 0.1 * seed,
                "groups/reward_std_mean": 0.2, "collect/kept_group_frac": 1.0 - 0.1 * step}
    return {"groups/zero_std_frac": 0.0, "groups/small_std_frac": 0.4, "groups/reward_std_mean": 0.3,
            "collect/kept_group_frac": 1.0}


def test_zero_and_small_group_std_are_tabled_per_variant(tmp_path):
    """The reward-std section tables each run's mean over steps: sequence's zero-std share (0.1 + ... + 0.4) / 4
    = 0.25 on both seeds, small-std 0.5 and 0.6 by seed, kept groups (0.9 + ... + 0.6) / 4 = 0.75; token's 0, 0.4,
    mean std 0.3, all kept (the groups dynamic sampling drops are the other half of what advantages see)."""
    make_runs(tmp_path, group_std)
    ablation.summarize_ablation(tmp_path)
    part = section((tmp_path / "report.html").read_text(), "Reward std within groups, by difficulty tier")
    header = part.split("<tr>")[1]
    assert [h.split("</code>")[0] for h in header.split("<code>")[1:]] == [
        "groups/zero_std_frac", "groups/small_std_frac", "groups/reward_std_mean", "collect/kept_group_frac"]
    assert table_cells(part, "sequence") == ["2", "0.25 [0.25, 0.25]", "0.55 [0.5, 0.6]", "0.2 [0.2, 0.2]",
                                             "0.75 [0.75, 0.75]"]
    assert table_cells(part, "token") == ["2", "0 [0, 0]", "0.4 [0.4, 0.4]", "0.3 [0.3, 0.3]", "1 [1, 1]"]


def drift(variant, seed, step):
    """Route agreement per mini-batch k (0, 1, 2 and 10: the order must be numeric) 1 − 0.01·k (sequence) or
    1 − 0.02·k (token); staleness KL 0.001·k·step; IS tails: largest weight 2 + step, 5%·step truncated."""
    slope = 0.01 if variant == "sequence" else 0.02
    out = {f"moe/route_agree_st_mb{k}": 1 - slope * k for k in (0, 1, 2, 10)}
    out.update({f"st/ppo_kl_mb{k}": 0.001 * k * step for k in (1, 2, 10)})
    out.update({"policy_loss/is_weight_max": 2.0 + step, "policy_loss/is_truncated_frac": 0.05 * step})
    return out


def test_route_drift_is_drawn_per_mini_batch_in_numeric_order(tmp_path):
    make_runs(tmp_path, drift)
    ablation.summarize_ablation(tmp_path)
    page = (tmp_path / "report.html").read_text()
    part = section(page, "Route drift by mini-batch")
    header = part.split("<tr>")[1]
    assert [h.split("</code>")[0] for h in header.split("<code>")[1:]] == [
        "moe/route_agree_st_mb1", "moe/route_agree_st_mb2", "moe/route_agree_st_mb10", "st/ppo_kl_mb1",
        "st/ppo_kl_mb2", "st/ppo_kl_mb10"], "mini-batch 0 agrees exactly (always 1) and is folded away"
    assert table_cells(part, "token")[:4] == ["2", "0.98 [0.98, 0.98]", "0.96 [0.96, 0.96]", "0.8 [0.8, 0.8]"]
    tails = section(page, "Tails of the training–inference IS weights")
    assert table_cells(tails, "sequence") == ["2", "4.5 [4.5, 4.5]", "0.125 [0.125, 0.125]"]


def test_dense_on_policy_runs_fold_the_drift_and_tail_sections(tmp_path):
    make_runs(tmp_path, lambda v, s, step: {"accuracy": 0.5})
    ablation.summarize_ablation(tmp_path)
    page = (tmp_path / "report.html").read_text()
    assert "No run logged moe/route_agree_st_mb*" in section(page, "Route drift by mini-batch")
    assert "No run logged ti/chi2_*" in section(page, "Tails of the training–inference IS weights")


def test_names_sort_by_the_numbers_inside_them():
    keys = ["groups/reward_std/10-12_ops", "groups/reward_std/4-6_ops", "groups/reward_std/1-3_ops", "x/mb10",
            "x/mb2"]
    assert sorted(keys, key=plots.natural_key) == [
        "groups/reward_std/1-3_ops", "groups/reward_std/4-6_ops", "groups/reward_std/10-12_ops", "x/mb2", "x/mb10"]


def test_the_sections_a_spec_names_as_its_mechanism_come_first(tmp_path):
    make_runs(tmp_path, lengths, {**SPEC, "mechanism": ["lengths", "entropy"]})
    ablation.summarize_ablation(tmp_path)
    page = (tmp_path / "report.html").read_text()
    lead = page.split("<h2>The mechanism of this finding</h2>")[1].split("<h2>")[0]
    assert [h.split("</h3>")[0] for h in lead.split("<h3>")[1:]] == ["Response lengths", "Entropy"]
    rest = page.split("<h2>Other mechanism diagnostics</h2>")[1]
    assert "<h3>Response lengths</h3>" not in rest and "<h3>Clipped tokens</h3>" in rest
    assert page.index("<h2>Statistics</h2>") < page.index("<h2>The mechanism of this finding</h2>")


def test_an_unknown_mechanism_section_is_refused_with_a_suggestion():
    with pytest.raises(ConfigError, match="'length' is not a report section \\(did you mean 'lengths'\\?\\)"):
        parse_spec({**SPEC, "mechanism": ["length"]})
