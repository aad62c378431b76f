"""Statistics of hand-made runs with known means: cells, paired comparisons, verdicts, missing runs."""

from __future__ import annotations

import json
import math

import pytest

from literl.arena import ablation
from literl.arena.runs import load_run
from literl.arena.spec import parse_spec
from literl.arena.summary import print_summary, summarize
from literl.config.errors import ConfigError
from tests.arena.fake_runs import write_run

T2 = 4.302653    # t_{2, 0.975}
# final accuracy of each variant at seed 0, 1, 2 in scenario s1 (s2 adds 0.1 to all)
FINAL = {"base": [0.50, 0.51, 0.52], "better": [0.59, 0.61, 0.63], "worse": [0.40, 0.41, 0.42],
         "same": [0.48, 0.51, 0.54]}
SPEC = {"name": "handmade", "paper_finding": "Better helps, worse hurts.", "description": "A hand-made ablation.",
        "preset": "lite_ppo", "baseline": "base", "seeds": 3,
        "variants": {v: {} for v in FINAL}, "scenarios": {"s1": {}, "s2": {"data.difficulty": "hard"}}}


def curve(final: float) -> list[float]:
    """Held-out accuracy at steps 0, 5, 10: 0.3 before, then `final` twice.
    AUC = (5·(0.3 + f)/2 + 5·f)/10 = 0.075 + 0.75·f; best = f; final = f."""
    return [0.3, final, final]


def make_ablation(out, skip=(), sampling_se=None):
    spec = parse_spec(SPEC, source="handmade.yaml")
    runs = spec.plan(out)
    for run in runs:
        if (run.variant, run.scenario, run.seed) in skip:
            continue
        offset = 0.1 if run.scenario == "s2" else 0.0
        write_run(run.directory, curve(FINAL[run.variant][run.seed] + offset), seed=run.seed,
                  sampling_se=(sampling_se or {}).get(run.variant))
    ablation.record_plan(out, spec, runs)
    return spec, runs


def summarize_handmade(out):
    make_ablation(out)
    return ablation.summarize_ablation(out, report=False)


def cell(summary, variant, scenario):
    return next(c for c in summary["cells"] if (c["variant"], c["scenario"]) == (variant, scenario))


def comparison(summary, variant, scenario):
    return next(c for c in summary["comparisons"] if (c["variant"], c["scenario"]) == (variant, scenario))


def test_cells_hold_mean_and_t_interval_over_seeds(tmp_path):
    summary = summarize_handmade(tmp_path)
    base = cell(summary, "base", "s1")
    assert base["n"] == 3 and base["seeds"] == [0, 1, 2]
    assert base["final"]["mean"] == pytest.approx(0.51)
    assert base["final"]["half_width"] == pytest.approx(T2 * 0.01 / math.sqrt(3), abs=1e-6)
    assert base["best"]["mean"] == pytest.approx(0.51)
    assert base["auc"]["mean"] == pytest.approx(0.075 + 0.75 * 0.51)
    assert cell(summary, "worse", "s2")["final"]["mean"] == pytest.approx(0.51)


def test_paired_differences_give_the_expected_verdicts(tmp_path):
    """better − base = [0.09, 0.10, 0.11] → helps; worse − base = −0.1 each → hurts;
    same − base = [−0.02, 0, +0.02] → no detectable difference. AUC differences are 0.75× these."""
    summary = summarize_handmade(tmp_path)
    better = comparison(summary, "better", "s1")
    assert better["final"]["diffs"] == pytest.approx([0.09, 0.10, 0.11])
    assert (better["final"]["ci_low"], better["final"]["ci_high"]) == pytest.approx((0.09, 0.11))
    assert better["final"]["verdict"] == "helps"
    assert better["auc"]["mean_diff"] == pytest.approx(0.075)
    assert comparison(summary, "worse", "s2")["final"]["verdict"] == "hurts"
    same = comparison(summary, "same", "s1")["final"]
    assert same["mean_diff"] == pytest.approx(0.0, abs=1e-12) and same["verdict"] == "no detectable difference"
    assert same["t_ci_high"] == pytest.approx(T2 * 0.02 / math.sqrt(3), abs=1e-6)


def test_the_pooled_comparison_has_one_pair_per_seed_averaged_over_scenarios(tmp_path):
    """s2 adds 0.1 to every run, so each seed's difference is the same in both scenarios: the pooled pairs are
    the 3 seeds (not 6 scenario × seed pairs, which would count each seed twice) with the s1 differences."""
    summary = summarize_handmade(tmp_path)
    pooled = comparison(summary, "better", "all")["final"]
    assert pooled["n_pairs"] == 3
    assert pooled["pairs"] == [0, 1, 2]
    assert pooled["diffs"] == pytest.approx([0.09, 0.10, 0.11])
    assert {c["scenario"] for c in summary["comparisons"]} == {"s1", "s2", "all"}
    assert all(c["variant"] != "base" for c in summary["comparisons"])


def test_missing_runs_are_named_and_leave_the_others_paired(tmp_path):
    """better/s1/seed_2 never ran and worse/s1/seed_0 stopped before summary.json: both are listed, n drops,
    and the pairs use only the seeds both variants have."""
    make_ablation(tmp_path, skip={("better", "s1", 2)})
    (tmp_path / "worse/s1/seed_0/summary.json").unlink()
    summary = ablation.summarize_ablation(tmp_path, report=False)
    missing = {(m["variant"], m["scenario"], m["seed"]): m["reason"] for m in summary["runs"]["missing"]}
    assert missing[("better", "s1", 2)] == "not run"
    assert missing[("worse", "s1", 0)].startswith("unfinished or failed")
    assert "train.log" in missing[("worse", "s1", 0)]
    (tmp_path / "worse/s1/seed_0/checkpoints/step_000005").mkdir(parents=True)
    (tmp_path / "worse/s1/seed_0/checkpoints/latest").write_text("step_000005")
    again = ablation.summarize_ablation(tmp_path, report=False)
    reasons = [m["reason"] for m in again["runs"]["missing"] if m["variant"] == "worse"]
    assert reasons[0].startswith("unfinished: checkpoint at step 5, rerun the ablation to resume it")
    assert summary["runs"] == {**summary["runs"], "expected": 24, "used": 22}
    assert cell(summary, "better", "s1")["n"] == 2
    assert comparison(summary, "better", "s1")["final"]["diffs"] == pytest.approx([0.09, 0.10])
    pooled = comparison(summary, "better", "all")["final"]     # seed 2 pairs in s2 only
    assert pooled["pairs"] == [0, 1, 2] and pooled["diffs"] == pytest.approx([0.09, 0.10, 0.11])


def test_summary_json_is_written_and_the_tables_print(tmp_path, capsys):
    from rich.console import Console

    make_ablation(tmp_path, skip={("same", "s2", 1)})
    summary = ablation.summarize_ablation(tmp_path, report=False)
    on_disk = json.loads((tmp_path / "summary.json").read_text())
    assert on_disk["comparisons"] == json.loads(json.dumps(summary["comparisons"]))
    assert on_disk["spec"]["baseline"] == "base" and on_disk["metric"] == "testbed/accuracy"
    assert not list(tmp_path.glob(".*tmp*")), "the atomic write left a temporary file"
    console = Console(width=200, record=True)
    print_summary(summary, console)
    text = console.export_text()
    assert "0.510 ± 0.025" in text and "helps" in text and "hurts" in text
    assert "same/s2/seed_1: not run" in text


def test_a_run_without_the_metric_is_missing_not_zero(tmp_path):
    write_run(tmp_path / "r", [0.2, 0.4], metric="other/accuracy")
    summary = summarize([load_run(tmp_path / "r", variant="r")], metric="testbed/accuracy", variants=["r"],
                        scenarios=["run"])
    assert summary["runs"]["missing"][0]["reason"] == "no 'testbed/accuracy' in eval.jsonl"
    assert summary["cells"][0]["final"]["mean"] is None


def test_resuming_with_a_changed_spec_is_refused(tmp_path):
    make_ablation(tmp_path)
    changed = parse_spec({**SPEC, "variants": {**SPEC["variants"], "better": {"algorithm.advantage.name": "grpo"}}},
                         source="changed.yaml")
    with pytest.raises(ConfigError, match=r"better/s1/seed_0 \(changed: overrides\).*another --out"):
        ablation.record_plan(tmp_path, changed, changed.plan(tmp_path))
    same = parse_spec(SPEC, source="handmade.yaml")
    ablation.record_plan(tmp_path, same, same.plan(tmp_path))    # an unchanged spec resumes fine


def test_a_run_whose_last_evaluation_is_null_is_missing_not_scored_at_an_earlier_step(tmp_path):
    run_dir = write_run(tmp_path / "r", [0.2, 0.4, 0.6])
    lines = (run_dir / "eval.jsonl").read_text().splitlines()
    last = json.loads(lines[-1])
    lines[-1] = json.dumps({**last, "testbed/accuracy": None})
    (run_dir / "eval.jsonl").write_text("\n".join(lines) + "\n")
    summary = summarize([load_run(run_dir, variant="r")], metric="testbed/accuracy", variants=["r"],
                        scenarios=["run"])
    assert summary["runs"]["missing"][0]["reason"] == ("'testbed/accuracy' is null (not a finite number) at the "
                                                       f"last evaluation, step {last['step']}")
    assert summary["per_run"] == []


def test_a_verdict_the_t_interval_does_not_support_is_marked_fragile():
    """d = 0.01, 0.02, 0.09: the 3-pair bootstrap interval is [min, max] = [0.01, 0.09], "helps"; the t interval is
    0.04 ± 4.3027 · 0.04359 / √3 = 0.04 ± 0.1083 = [−0.068, +0.148], which contains 0: fragile.
    d = 0.10, 0.11, 0.12: bootstrap [0.10, 0.12], t 0.11 ± 4.3027 · 0.01 / √3 = [0.085, 0.135]: not fragile.
    "no detectable difference" is never marked (there is no claim to be fragile)."""
    from literl.arena import stats
    from literl.arena.summary import format_fragility

    def entry(diffs):
        return stats.compare({("s", k): d for k, d in enumerate(diffs)}, {("s", k): 0.0 for k in range(len(diffs))})

    weak, strong = entry([0.01, 0.02, 0.09]), entry([0.10, 0.11, 0.12])
    assert weak["verdict"] == strong["verdict"] == "helps"
    assert weak["t_ci_low"] == pytest.approx(0.04 - 0.1083, abs=5e-4) and weak["t_ci_high"] > 0
    assert format_fragility(weak) == "fragile: t interval includes 0"
    assert strong["t_ci_low"] == pytest.approx(0.085, abs=5e-4) and format_fragility(strong) == ""
    assert format_fragility(entry([-0.09, -0.02, -0.01])) == "fragile: t interval includes 0"   # hurts, mirrored
    assert format_fragility(entry([-0.05, 0.01, 0.02])) == ""          # no detectable difference: nothing to flag


def test_the_terminal_and_the_report_mark_a_fragile_verdict(tmp_path):
    """In the hand-made ablation every verdict is backed by its t interval (no mark); a comparison whose seeds
    disagree in size but not in sign gets the mark in both renderings."""
    from rich.console import Console

    from literl.arena import stats
    from literl.arena.report import _verdict_html

    summary = summarize_handmade(tmp_path)
    console = Console(width=200, record=True)
    print_summary(summary, console)
    assert "fragile" not in console.export_text()
    weak = stats.compare({("s", k): d for k, d in enumerate([0.01, 0.02, 0.09])}, {("s", k): 0.0 for k in range(3)})
    assert "fragile: t interval includes 0" in _verdict_html(weak)
    summary["comparisons"][0]["final"] = weak
    console = Console(width=200, record=True)
    print_summary(summary, console)
    assert "fragile: t interval includes 0" in console.export_text()


def test_the_evaluation_noise_share_of_delta_final_is_its_runs_sampling_variance_over_the_observed_one(tmp_path):
    """Runs logging their response-sampling SE: base 0.01, every other variant 0.02, so each pair carries sampling
    variance 0.02² + 0.01² = 5e-4. better − base in s1: diffs 0.09, 0.10, 0.11, s_d = 0.01, s_d² = 1e-4: share 5.0
    (the seeds agree far better than two noisy evaluations could show). same − base: diffs −0.02, 0, 0.02,
    s_d² = 4e-4: share 1.25. Pooled over s1, s2 (the same diffs, + 0.1 on both arms): a seed's mean over two
    scenarios has sampling variance 2 · 5e-4 / 2² = 2.5e-4, against s_d² 1e-4: share 2.5. Without logged SEs (runs
    written before evaluations logged them) there is no share.

    Δ AUC: the curves are 0.3, f, f at steps 0, 5, 10, so AUC = 0.075 + 0.75 f and better − base's AUC diffs are
    0.75 × (0.09, 0.10, 0.11): s_d² = 0.0075² = 5.625e-5. The shared evaluation before training (0.3 in both arms)
    is one sample and adds nothing; steps 5 and 10 weigh 0.5 and 0.25: (0.25 + 0.0625) × 5e-4 = 1.5625e-4, share
    2.7778."""
    from rich.console import Console

    from literl.arena.report import _verdict_html

    make_ablation(tmp_path, sampling_se={"base": 0.01, "better": 0.02, "worse": 0.02, "same": 0.02})
    summary = ablation.summarize_ablation(tmp_path, report=False)
    better = comparison(summary, "better", "s1")["final"]["eval_noise"]
    assert better["sampling_variance"] == pytest.approx(5e-4)
    assert better["observed_variance"] == pytest.approx(1e-4)
    assert better["share"] == pytest.approx(5.0)
    assert comparison(summary, "same", "s1")["final"]["eval_noise"]["share"] == pytest.approx(1.25)
    assert comparison(summary, "better", "all")["final"]["eval_noise"]["share"] == pytest.approx(2.5)
    auc = comparison(summary, "better", "s1")["auc"]["eval_noise"]
    assert auc["sampling_variance"] == pytest.approx(1.5625e-4)
    assert auc["observed_variance"] == pytest.approx(5.625e-5)
    assert auc["share"] == pytest.approx(1.5625e-4 / 5.625e-5)
    assert "eval_noise" not in comparison(summary, "better", "s1")["best"]
    run = next(r for r in summary["per_run"] if r["variant"] == "better")
    assert run["final_sampling_se"] == 0.02
    console = Console(width=200, record=True)
    print_summary(summary, console)
    text = console.export_text()
    assert "evaluation noise 500% of s_d²" in text and "mostly evaluation noise" in text
    assert "evaluation noise 500% of s_d²" in _verdict_html(comparison(summary, "better", "s1")["final"])

    plain = summarize_handmade(tmp_path / "without")
    assert all("eval_noise" not in c["final"] for c in plain["comparisons"])
    console = Console(width=200, record=True)
    print_summary(plain, console)
    assert "evaluation noise" not in console.export_text()
