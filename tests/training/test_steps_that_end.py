"""Every step ends, says why it takes long, and a run that learned nothing says so (issue 59: R1, R2, R3, R6).

R1: a group filter that no group can meet resampled step 1 forever with a large rollout.max_rounds, printing
nothing, and Ctrl-C could not stop it (the step never ended). R3: a filter that keeps no group made every step an
empty, skipped batch, and the run ended rc 0 without a word. R6: a failing asynchronous producer ended the run with
two chained tracebacks. Tiny Qwen3, two prompts of two samples, eight new tokens a step.
"""

from __future__ import annotations

import json
import os
import signal

import pytest

from literl.cli import main
from literl.config.load import load_config
from literl.config.errors import ConfigError
from literl.rewards import time_bounded
from literl.rollout import collector as collector_module
from literl.assembly.api import train
from literl.run.metrics_log import read_metrics
from literl.training.trainer import TrainingInterrupted

FAST = ["trainer.steps=2", "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=8",
        "eval.limit=2", "eval.samples=1", "eval.greedy=false", "eval.before=false", "eval.every=0",
        "trainer.progress=false", "data.size=32"]
NEVER_MET = ["algorithm.group_filter.name=mean_in_band", "algorithm.group_filter.params.low=5",
             "algorithm.group_filter.params.high=6"]         # a band above every reward of {0, 1}


def _overrides(model_dir, out, *extra):
    return [f"model.path={model_dir}", f"trainer.output_dir={out}", *FAST, *extra]


def _console(capsys) -> str:
    return capsys.readouterr().err.replace("\n", "")


@time_bounded
def counted_reward(response: str, example: dict, *, timeout_s: float = 5.0) -> float:
    """Reward 0 or 1 by length (in-process); after `counted_reward.stop_after` calls it sends this process SIGINT,
    as a Ctrl-C in the middle of resampling would."""
    counted_reward.calls += 1
    if counted_reward.calls == counted_reward.stop_after:
        os.kill(os.getpid(), signal.SIGINT)
    return float(len(response) % 2)


def test_a_filter_no_group_can_meet_stops_the_run_after_twenty_empty_rounds(tiny_qwen3_dir, tmp_path, capsys):
    """max_rounds=1000 (the limit): old code sampled 1000 rounds per step, silently, and the issue's 1,000,000 never
    ended. Now 20 rounds in a row without a kept group (2 groups each: 40 groups) stop the run with exit 1 and one
    message naming the filter's params and both fixes; metrics.jsonl has no step."""
    out = tmp_path / "run"
    code = main(["train", *_overrides(tiny_qwen3_dir, out, *NEVER_MET, "rollout.max_rounds=1000")])
    err = _console(capsys)
    assert code == 1 and "Traceback" not in err
    assert "kept none of the 40 groups sampled in the last 20 rounds" in err
    assert "algorithm.group_filter.params" in err and "rollout.max_rounds" in err
    assert read_metrics(out) == []


def test_a_step_resampling_for_long_reports_its_round_and_kept_groups(tiny_qwen3_dir, tmp_path, capsys,
                                                                      monkeypatch):
    """PROGRESS_SECONDS set to 0: every round but the last reports. max_rounds=3 with the never-met band: rounds
    1 and 2 report '0 of 2 groups kept', round 3 ends the step (empty) without a report; two steps: 4 lines."""
    monkeypatch.setattr(collector_module, "PROGRESS_SECONDS", 0.0)
    train(load_config(preset="grpo", overrides=_overrides(tiny_qwen3_dir, tmp_path / "run", *NEVER_MET,
                                                          "rollout.max_rounds=3")))
    err = _console(capsys)
    assert err.count("0 of 2 groups kept so far") == 4
    assert "round 1 of at most 3" in err and "round 2 of at most 3" in err and "round 3 of at most 3" not in err


def test_ctrl_c_while_resampling_stops_the_step_and_saves_the_last_complete_one(tiny_qwen3_dir, tmp_path,
                                                                                capsys):
    """Step 1 resamples (never-met band, max_rounds=15, below the stall bound); SIGINT arrives in its 3rd round
    (reward call 9, 4 responses a round). Old code finished all 15 rounds first. Now the step stops after round 3:
    12 reward calls, TrainingInterrupted, the checkpoint of step 0 and no logged step."""
    counted_reward.calls, counted_reward.stop_after = 0, 9
    out = tmp_path / "run"
    cfg = load_config(preset="grpo", overrides=_overrides(tiny_qwen3_dir, out, *NEVER_MET, "rollout.max_rounds=15"))
    with pytest.raises(TrainingInterrupted):
        train(cfg, reward_fns=[counted_reward])
    assert counted_reward.calls == 12
    assert (out / "checkpoints/step_000000").is_dir()
    assert read_metrics(out) == []
    assert "interrupted after step 0: checkpoint saved" in _console(capsys)


def test_a_filter_that_keeps_no_group_warns_and_the_summary_says_nothing_was_learned(tiny_qwen3_dir, tmp_path,
                                                                                    capsys):
    """min_std=10 keeps no group of {0, 1} rewards (their std is at most 0.71); max_rounds=2: each step ends
    empty after 2 rounds. Old code: rc 0, no warning (the empty-batch return came before it). Now step 1 warns
    once, naming the filter, the end says the run learned nothing, and summary.json records why."""
    out = tmp_path / "run"
    code = main(["train", *_overrides(tiny_qwen3_dir, out, "algorithm.group_filter.name=nonzero_reward_std",
                                      "algorithm.group_filter.params.min_std=10", "rollout.max_rounds=2")])
    err = _console(capsys)
    assert code == 0
    assert err.count("WARNING: no learning signal") == 1
    assert "no learning signal at step 1: the group filter kept none of the 4 groups sampled in 2 rounds" in err
    assert "this run learned nothing: every one of its 2 steps had an empty batch" in err
    summary = json.loads((out / "summary.json").read_text())
    assert "every one of its 2 steps had an empty batch" in summary["no_learning_signal"]
    assert [r["advantage/all_zero"] for r in read_metrics(out)] == [1.0, 1.0]


def test_a_run_that_learned_has_no_such_warning(tiny_qwen3_dir, tmp_path, capsys):
    """The same run without the filter, with a reward that differs within groups: no 'learned nothing' line and
    no key in summary.json (the warning is about the run, not printed on every run)."""
    counted_reward.calls, counted_reward.stop_after = 0, -1
    out = tmp_path / "run"
    train(load_config(preset="grpo", overrides=_overrides(tiny_qwen3_dir, out, "optim.lr=1e-3")),
          reward_fns=[counted_reward])
    assert any(r["advantage/all_zero"] == 0.0 for r in read_metrics(out))
    assert "learned nothing" not in _console(capsys)
    assert "no_learning_signal" not in json.loads((out / "summary.json").read_text())


def test_a_failing_asynchronous_producer_ends_the_run_with_one_line(tiny_qwen3_dir, tmp_path, capsys):
    """k = 2, a reward that always raises, reward.max_failed_batches=2: the producer's RewardsFailing was wrapped
    in RolloutProducerError, which the command did not know (two chained tracebacks). Now it is the producer's own
    error, printed as the synchronous run prints it: exit 1, one line naming the setting."""
    code = main(["train", *_overrides(tiny_qwen3_dir, tmp_path / "run", "trainer.steps=4", "rollout.max_staleness=2",
                                      "reward.max_failed_batches=2",
                                      "reward.fns.0.fn=tests.rewards.sample_reward_fns:always_raises")])
    err = _console(capsys)
    assert code == 1 and "Traceback" not in err
    assert "reward.max_failed_batches=2" in err


@pytest.mark.parametrize("override, message", [
    ("rollout.max_rounds=1000000", "rollout.max_rounds=1000000 must be in \\[1, 1000\\]"),
    ("rollout.max_staleness=1000000", "rollout.max_staleness=1000000 must be in \\[0, 64\\]"),
    ("rollout.max_staleness=3", "rollout.max_staleness=3 exceeds trainer.steps=2"),
])
def test_values_that_would_hang_a_step_are_refused_at_load(override, message):
    """R2: max_staleness=1,000,000 gave no step in 90 s (a staleness histogram of 10^6 + 1 metrics a step, and a
    bound no run of 2 steps reaches); max_rounds had no upper bound either."""
    with pytest.raises(ConfigError, match=message):
        load_config(preset="grpo", overrides=["trainer.steps=2", override])
