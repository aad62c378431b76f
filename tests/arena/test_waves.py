"""Sequential seeds end to end on the stand-in trainer (tests/arena/fake_trainer.py): waves, the stop, the
summary's sequential section, a rerun that reaches the same decisions without training again, per-run metrics equal
to a fixed-seed run's, and the command line's --sequential, --gpus-per-run and --plan."""

from __future__ import annotations

import json
import os
import sys

import pytest
from rich.console import Console

from literl.arena import ablation, stats
from literl.arena.runner import AblationRunner
from literl.arena.sequential import EQUIVALENT
from literl.arena.spec import parse_spec
from literl.arena.waves import run_in_waves
from literl.cli import main
from tests.arena.test_runner import STEPS, fake_python  # noqa: F401  (fake_python is a fixture)


@pytest.fixture(autouse=True)
def keep_argv(monkeypatch):
    monkeypatch.setattr(sys, "argv", list(sys.argv))


def sequential_spec(**design):
    return parse_spec({"preset": "lite_ppo", "baseline": "a", "base": {"trainer.steps": STEPS},
                       "variants": {"a": {}, "b": {}},
                       "sequential": {"first": 2, "step": 2, "max": 8, **design}}, source="t.yaml")


def local_dispatch(python):
    def dispatch(runs):
        console = Console(file=open(os.devnull, "w"))
        return AblationRunner(runs, {r.directory: STEPS for r in runs}, jobs=2, threads=2, console=console,
                              python=python).run()
    return dispatch


def launches(directory) -> int:
    path = directory / "launches.txt"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_a_known_harm_stops_before_the_ceiling_and_a_rerun_trains_nothing(tmp_path, fake_python, monkeypatch):
    """b is 0.1 worse (FAKE_EFFECT) with noise of sd 0.01 per run, so s_d ≈ 0.014. Design 2,2,8: look 1 (n = 2)
    has t boundary ≈ 43,000 (no decision); look 2 (n = 4) has 8.85 and t ≈ 0.1/(0.014/2) ≈ 14: hurts at wave 2.
    8 of 16 runs: half the compute saved. Seeds 4-7 never run. Rerun: same decision, no run launched again."""
    monkeypatch.setenv("FAKE_EFFECT", "b:-0.1")
    out = tmp_path / "out"
    summary, outcome = run_in_waves(sequential_spec(), out, local_dispatch(fake_python))
    section = summary["sequential"]
    comp = section["comparisons"][0]
    assert outcome.exit_code == 0 and comp["decision"] == stats.HURTS and comp["decided_at_wave"] == 2
    assert [look["decision"] for look in comp["looks"]] == ["next wave", stats.HURTS]
    assert comp["looks"][1]["rci_high"] < 0 < comp["looks"][0]["rci_high"]
    assert (section["runs_used"], section["runs_ceiling"], section["compute_saved"]) == (8, 16, 0.5)
    assert section["design"].startswith("group-sequential") and section["all_decided"]
    assert not (out / "a" / "default" / "seed_4").exists()
    on_disk = json.loads((out / ablation.SUMMARY_FILE).read_text())
    assert on_disk["sequential"]["comparisons"][0]["decided_at_wave"] == 2
    again, _ = run_in_waves(sequential_spec(), out, local_dispatch(fake_python))
    assert again["sequential"]["comparisons"][0] == comp
    assert all(launches(out / v / "default" / f"seed_{s}") == 1 for v in "ab" for s in range(4))
    ablation.summarize_ablation(out, report=True)            # what `literl report OUT` rebuilds
    page = (out / ablation.REPORT_FILE).read_text()
    assert "Sequential seeds" in page and "hurts at wave 2 (4 pairs" in page and "50% of the compute saved" in page


def test_the_waves_give_the_per_run_metrics_of_a_fixed_seed_run(tmp_path, fake_python, monkeypatch):
    monkeypatch.setenv("FAKE_EFFECT", "b:-0.1")
    waves, _ = run_in_waves(sequential_spec(), tmp_path / "seq", local_dispatch(fake_python))
    fixed = parse_spec({"preset": "lite_ppo", "baseline": "a", "base": {"trainer.steps": STEPS},
                        "variants": {"a": {}, "b": {}}, "seeds": 4}, source="t.yaml")
    runs = fixed.plan(tmp_path / "fixed")
    ablation.record_plan(tmp_path / "fixed", fixed, runs)
    local_dispatch(fake_python)(runs)
    summary = ablation.summarize_ablation(tmp_path / "fixed", report=False)
    assert "sequential" not in summary and "sequential" not in summary["spec"]

    def scores(s):
        return sorted((r["variant"], r["seed"], r["final"], r["auc"]) for r in s["per_run"])
    assert scores(waves) == scores(summary) and len(scores(summary)) == 8


def test_identical_arms_are_equivalent_at_the_first_wave_within_the_margin(tmp_path, fake_python):
    """Without FAKE_EFFECT both arms score 0.5 + 0.01·seed: every difference is 0, s = 0, mean 0, so the RCI is
    [0, 0], inside ±0.02: equivalent at wave 1, 4 of 16 runs (75% saved). Without a margin the same arms run to the
    ceiling and end 'no detectable difference' (zero spread decides no helps/hurts)."""
    summary, _ = run_in_waves(sequential_spec(margin=0.02), tmp_path / "eq", local_dispatch(fake_python))
    comp = summary["sequential"]["comparisons"][0]
    assert comp["decision"] == EQUIVALENT and comp["decided_at_wave"] == 1
    assert summary["sequential"]["compute_saved"] == 0.75
    summary, _ = run_in_waves(sequential_spec(), tmp_path / "none", local_dispatch(fake_python))
    comp = summary["sequential"]["comparisons"][0]
    assert comp["decision"] == stats.NO_DIFFERENCE and comp["n_pairs"] == 8
    assert summary["sequential"]["compute_saved"] == 0


def test_the_command_line_plans_waves_and_refuses_too_many_gpus(capsys):
    assert main(["ablate", "positive_control", "--sequential", "2,2,8", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "16 runs" in out and "seed=7" in out
    assert main(["ablate", "positive_control", "--gpus-per-run", "3", "--devices", "0,1", "--dry-run"]) == 2
    assert "needs 3 GPUs but this machine shows 2 (0, 1)" in capsys.readouterr().err
    assert main(["ablate", "positive_control", "--sequential", "2,2", "--dry-run"]) == 2
    assert "three integers" in capsys.readouterr().err


def test_plan_reads_the_pilot_and_prints_the_seeds_needed(tmp_path, fake_python, monkeypatch, capsys):
    """A 4-seed pilot with Δ ≈ −0.1 and s_d ≈ 0.014: for a stated effect of 0.02 the fixed design needs
    n with (t_{0.975,n−1} + t_{0.8,n−1}) · s_d/√n ≤ 0.02, about 6 seeds for s_d 0.014; the sequential line and
    the expected runs follow."""
    monkeypatch.setenv("FAKE_EFFECT", "b:-0.1")
    fixed = parse_spec({"preset": "lite_ppo", "baseline": "a", "base": {"trainer.steps": STEPS},
                        "variants": {"a": {}, "b": {}}, "seeds": 4}, source="t.yaml")
    pilot = tmp_path / "pilot"
    runs = fixed.plan(pilot)
    ablation.record_plan(pilot, fixed, runs)
    local_dispatch(fake_python)(runs)
    summary = ablation.summarize_ablation(pilot, report=False)
    sd = summary["comparisons"][0]["final"]["sd_diff"]
    spec_file = tmp_path / "s.yaml"
    spec_file.write_text(json.dumps({"preset": "lite_ppo", "baseline": "a", "base": {"trainer.steps": STEPS},
                                     "variants": {"a": {}, "b": {}}, "sequential": {"first": 4, "step": 4, "max": 16}}))
    assert main(["ablate", str(spec_file), "--plan", "--pilot", str(pilot), "--effect", "0.02"]) == 0
    out = capsys.readouterr().out
    assert f"{stats.seeds_needed(0.02, sd)} seeds fixed" in out and f"s_d {sd:.4f}" in out
    assert "sequential 4,4,16:" in out and "expected runs under the sequential design" in out


def test_a_cluster_that_cannot_be_joined_is_refused_with_the_fix(tmp_path, capsys):
    """Nothing listens on 127.0.0.1:1: the command exits 2 naming the address and how to start a head, and no run
    starts (a sequential spec's first wave included)."""
    pytest.importorskip("ray")
    argv = ["ablate", "positive_control", "--sequential", "2,2,8", "--cluster", "127.0.0.1:1", "--out",
            str(tmp_path / "o"), "--no-report"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "no Ray cluster answers at --cluster 127.0.0.1:1" in err and "ray start --head" in err
    assert not (tmp_path / "o" / "lr_tuned" / "default" / "seed_0" / "train.log").exists()
