"""Runs survive misuse (issue 22): one writer per run, safe and honest resume, no NaN models, no silent no-ops.

Each test reproduces a failure a careful user met (they failed before the fix) on a tiny model. Most start
from one finished two-step run (checkpoints at steps 1 and 2), copied per test.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from literl.cli import main
from literl.config.load import from_yaml_file, load_config
from literl.rewards import time_bounded
from literl.assembly.api import train
from literl.run.metrics_log import read_metrics
from tests.conftest import build_tiny_qwen3

FAST = ["trainer.steps=2", "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=8",
        "eval.limit=2", "eval.samples=1", "eval.greedy=false", "eval.before=false", "eval.every=0",
        "trainer.progress=false", "data.size=32", "optim.lr=1e-3"]


def _overrides(model_dir, out, *extra):
    return [f"model.path={model_dir}", f"trainer.output_dir={out}", *FAST, *extra]


def _train(model_dir, out, *extra, preset="grpo", **kwargs):
    return train(load_config(preset=preset, overrides=_overrides(model_dir, out, *extra)), **kwargs)


def _weights(folder):
    out = {}
    for file in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(file)))
    return out


@time_bounded      # runs in-process: a worker process would first import this module (torch, transformers)
def varying_reward(response: str, example: dict, *, timeout_s: float = 5.0) -> float:
    """Rewards that differ within groups even for a random model, so every step really updates."""
    return float(len(response) % 3 == 0)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from literl.testbed.tokenizer import build_char_tokenizer

    path = tmp_path_factory.mktemp("model") / "tiny-qwen3"
    build_tiny_qwen3().save_pretrained(path)
    build_char_tokenizer().save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def finished_run(model_dir, tmp_path_factory):
    """A grpo run of two steps with checkpoints at steps 1 and 2 (read-only: tests copy it)."""
    out = tmp_path_factory.mktemp("finished") / "run"
    _train(model_dir, out, "trainer.save_every=1", reward_fns=[varying_reward])
    return out


@pytest.fixture
def run_copy(finished_run, tmp_path):
    target = tmp_path / "run"
    shutil.copytree(finished_run, target)
    return target


def _console(capsys) -> str:
    """What the run printed, unwrapped (the console folds long lines at the terminal width)."""
    return capsys.readouterr().err.replace("\n", "")


def _resume(model_dir, run_dir, *extra):
    return _train(model_dir, run_dir, "trainer.resume=true", *extra, reward_fns=[varying_reward])


# ------------------------------------------------------------------------------------------ 1. one writer per run
def _hold_lock(directory):
    """Another process holding the directory's lock, as a running `literl train` does."""
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from literl.run.lock import DirectoryLock; "
                               "lock = DirectoryLock(sys.argv[1]).acquire(); print('held', flush=True); time.sleep(120)",
                               str(directory)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_second_writer_of_a_run_directory_is_refused_with_the_holders_pid(model_dir, run_copy, capsys):
    """A resume started while the run still runs (or a second train on one output_dir) used to exit 0 with the
    logs of both interleaved. Now it is refused and changes nothing; kill -9 of the holder frees the directory."""
    from literl.run.lock import DirectoryLock

    before = (run_copy / "metrics.jsonl").read_text()
    holder = _hold_lock(run_copy)
    try:
        code = main(["train", *_overrides(model_dir, run_copy, "trainer.resume=true", "trainer.steps=3")])
        assert code == 2
        assert f"pid {holder.pid}" in _console(capsys)
        assert (run_copy / "metrics.jsonl").read_text() == before
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    DirectoryLock(run_copy).acquire().release()      # the OS dropped the dead holder's lock


# ------------------------------------------------------------------------------------------ 2. resume runs no code
class _RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.mkdir, (str(self.marker),)


def test_a_crafted_trainer_state_runs_no_code_and_the_previous_checkpoint_is_used(model_dir, run_copy, tmp_path,
                                                                                  capsys):
    marker = tmp_path / "code-ran"
    torch.save({"step": 2, "payload": _RunsCode(marker)}, run_copy / "checkpoints/step_000002/trainer_state.pt")
    _resume(model_dir, run_copy, "trainer.steps=3")
    assert not marker.exists(), "loading a checkpoint must not execute code from it"
    err = _console(capsys)
    assert "step_000002/trainer_state.pt cannot be read safely" in err and "resumed from" in err
    assert (run_copy / "checkpoints/corrupt-step_000002").is_dir()
    assert [r["step"] for r in read_metrics(run_copy)] == [1, 2, 3]      # continued from step 1


def test_checkpoints_latest_cannot_point_outside_the_run(model_dir, run_copy, tmp_path, capsys):
    """`latest` naming a folder outside the run (here one with a crafted state) is ignored with a note; garbage
    bytes in it are too (they were a UnicodeDecodeError traceback)."""
    outside = tmp_path / "elsewhere" / "step_000009"
    shutil.copytree(run_copy / "checkpoints/step_000002", outside)
    marker = tmp_path / "code-ran"
    torch.save({"step": 9, "payload": _RunsCode(marker)}, outside / "trainer_state.pt")
    (run_copy / "checkpoints/latest").write_text("../../elsewhere/step_000009")
    _resume(model_dir, run_copy)
    assert not marker.exists()
    assert "not a step_<n> folder of this run" in _console(capsys)
    (run_copy / "checkpoints/latest").write_bytes(b"\xff\xfe\x00garbage")
    _resume(model_dir, run_copy)
    assert "latest cannot be read" in _console(capsys)
    assert json.loads((run_copy / "summary.json").read_text())["steps"] == 2


# ------------------------------------------------------------------------------------------ 3. no NaN models
@time_bounded
def extreme_reward(response: str, example: dict, *, timeout_s: float = 5.0) -> float:
    """Alternates ±3.4e38 (finite float32 values) so every group differs: the policy-gradient loss overflows."""
    extreme_reward.calls = getattr(extreme_reward, "calls", 0) + 1
    return 3.4e38 if extreme_reward.calls % 2 else -3.4e38


def test_non_finite_steps_are_skipped_counted_and_stop_the_run_without_saving_nan(model_dir, tmp_path):
    """Before: the loss was NaN, every weight became NaN, the run exited normally and saved an all-NaN final/. Now each such optimizer step is skipped and counted; two in a row stop the run with an error; the
    weights saved are the last good ones."""
    out = tmp_path / "run"
    with pytest.raises(RuntimeError, match="2 optimizer steps in a row"):      # literl's NonFiniteTraining
        _train(model_dir, out, "trainer.steps=3", "trainer.max_non_finite_steps=2", preset="dr_grpo",
               reward_fns=[extreme_reward])
    records = read_metrics(out)
    assert [r["step"] for r in records] == [1]
    assert records[0]["optim/non_finite_step"] == 1.0 and records[0]["optim/skipped_step"] == 1.0
    assert not (out / "final").exists()
    saved = _weights(out / "checkpoints/step_000001/model")
    start = _weights(model_dir)
    assert all(torch.equal(saved[k], start[k]) for k in saved), "skipped steps leave the weights unchanged"


# ------------------------------------------------------------------------------------------ 4. crashes lose little
def test_a_crash_mid_run_keeps_the_last_step_and_resumes_exactly(model_dir, finished_run, tmp_path, monkeypatch):
    """An exception in step 2 (here: out of memory in the rollout) used to leave nothing to resume from with the
    default settings. Now the state after step 1 is saved, and resuming gives the uninterrupted run's weights."""
    import literl.assembly.builder as components

    real_build = components.build_components

    def build_failing_at_the_second_rollout(*args, **kwargs):
        parts = real_build(*args, **kwargs)
        real_collect, calls = parts.collector.collect, []

        def collect(rng, **kwargs):
            calls.append(1)
            if len(calls) == 2:
                raise MemoryError("simulated: out of memory while sampling")
            return real_collect(rng, **kwargs)

        parts.collector.collect = collect
        return parts

    monkeypatch.setattr(components, "build_components", build_failing_at_the_second_rollout)
    with pytest.raises(MemoryError):
        _train(model_dir, tmp_path / "crashed", reward_fns=[varying_reward])
    assert (tmp_path / "crashed/checkpoints/step_000001").is_dir()
    monkeypatch.setattr(components, "build_components", real_build)
    resumed = _resume(model_dir, tmp_path / "crashed")
    a, b = _weights(finished_run / "final"), _weights(resumed / "final")     # the same run, uninterrupted
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_checkpoints_are_written_by_time_by_default(model_dir, tmp_path):
    from literl.config.schema import TrainerConfig

    assert TrainerConfig().save_every == 0 and getattr(TrainerConfig(), "save_every_minutes", 0) > 0
    out = _train(model_dir, tmp_path / "run", "trainer.save_every_minutes=1e-9", "trainer.keep_checkpoints=0",
                 reward_fns=[varying_reward])
    assert sorted(p.name for p in (out / "checkpoints").glob("step_*")) == ["step_000001", "step_000002"]


@time_bounded
def interrupting_reward(response: str, example: dict, *, timeout_s: float = 5.0) -> float:
    """Presses Ctrl-C (SIGINT to this process) during the first step's scoring."""
    if not getattr(interrupting_reward, "sent", False):
        interrupting_reward.sent = True
        os.kill(os.getpid(), signal.SIGINT)
    return float(len(response) % 3 == 0)


def test_a_stop_request_skips_the_scheduled_evaluation(model_dir, tmp_path):
    """A scheduler's grace period is short: after Ctrl-C/SIGTERM the step ends and the checkpoint is written
    without the evaluation that was due at that step."""
    out = tmp_path / "run"
    with pytest.raises(KeyboardInterrupt):
        _train(model_dir, out, "trainer.steps=3", "eval.every=1", reward_fns=[interrupting_reward])
    assert (out / "checkpoints/step_000001").is_dir()
    assert not (out / "eval.jsonl").exists() or "step_1" not in (out / "eval.jsonl").read_text()


# ------------------------------------------------------------------------------------------ 5. corrupt checkpoint
def test_a_corrupt_newest_checkpoint_falls_back_to_the_previous_one(model_dir, run_copy, capsys):
    """keep_checkpoints kept step 1 for exactly this; a damaged step 2 used to end resume in a raw traceback."""
    weights = next((run_copy / "checkpoints/step_000002/model").glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[:100])
    _resume(model_dir, run_copy, "trainer.steps=3")
    err = _console(capsys)
    assert f"{weights.name} cannot be read" in err and "fell back to the previous checkpoint" in err
    assert [r["step"] for r in read_metrics(run_copy)] == [1, 2, 3]


# ------------------------------------------------------------------------------------------ 6. resume's config
def test_resume_refuses_a_missing_empty_or_unreadable_config_unless_told_which_to_use(model_dir, run_copy, capsys):
    """Before: a grpo run resumed without config.yaml silently continued as lite_ppo (the default preset), and
    an empty file as the bare defaults; the record of what ran was overwritten."""
    resume = ["train", f"trainer.output_dir={run_copy}", "trainer.resume=true"]
    saved = run_copy / "config.yaml"
    started = from_yaml_file(saved)
    for damage, problem in ((saved.unlink, "is missing"), (lambda: saved.write_text(""), "is empty"),
                            (lambda: saved.write_bytes(b"\xff\x00\xfe"), "cannot be read")):
        damage()
        before = saved.read_bytes() if saved.exists() else None
        assert main(resume) == 2
        err = _console(capsys)
        assert problem in err and "--config" in err and "checkpoints/step_000002/config.yaml" in err
        assert (saved.read_bytes() if saved.exists() else None) == before, "nothing was changed"
    saved.write_text("trainer: {stepz: 3}\n")
    assert main(resume) == 2 and "config.yaml is not a readable literl config" in _console(capsys)
    assert main([*resume, "--config", str(run_copy / "checkpoints/step_000002/config.yaml")]) == 0
    resumed = from_yaml_file(saved)
    assert resumed.preset == "grpo" and resumed.algorithm == started.algorithm and resumed.rollout == started.rollout


# ------------------------------------------------------------------------------------------ 7. disk space
def test_stale_temporaries_are_removed_when_a_run_starts(model_dir, run_copy):
    """Killed saves left `.tmp-*` folders (gigabytes each for a real model) that nothing removed."""
    leftovers = [run_copy / "checkpoints/.tmp-step_000003-4242", run_copy / ".tmp-final-4242"]
    for folder in leftovers:
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"0" * 1000)
    (run_copy / ".metrics.jsonl.x1y2.tmp").write_text("half a line")
    _resume(model_dir, run_copy)
    assert not any(p.exists() for p in leftovers) and not (run_copy / ".metrics.jsonl.x1y2.tmp").exists()
    assert (run_copy / "checkpoints/step_000002").is_dir()


def test_a_full_disk_names_keep_checkpoints_and_lowering_it_lets_the_resume_save(model_dir, run_copy, monkeypatch,
                                                                                 capsys):
    """A disk with room for two checkpoints: with keep_checkpoints=2 the third save cannot fit. Before, the same
    save failed on every resume (it needed room for one more than it kept) with a bare OSError; now the message
    names keep_checkpoints and the free space, and a resume with keep_checkpoints=1 removes the oldest first."""
    real_save = torch.save

    def save_on_a_two_checkpoint_disk(obj, path, *args, **kwargs):
        root = os.path.dirname(os.path.dirname(path))
        if os.path.basename(root) == "checkpoints" and len([n for n in os.listdir(root) if n != "latest"]) > 2:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save_on_a_two_checkpoint_disk)
    argv = ["train", *_overrides(model_dir, run_copy, "trainer.resume=true", "trainer.steps=3")]
    assert main(argv) == 1
    err = _console(capsys)
    assert "no space left" in err and "trainer.keep_checkpoints=2" in err and " free in " in err
    assert not list((run_copy / "checkpoints").glob(".tmp-*")), "the partial checkpoint is removed"
    assert main([*argv, "trainer.keep_checkpoints=1"]) == 0
    assert sorted(p.name for p in (run_copy / "checkpoints").glob("step_*")) == ["step_000003"]


# ------------------------------------------------------------------------------------------ 8. sizes
def test_prompts_too_long_for_the_context_are_skipped_with_a_count_or_refused(model_dir, tmp_path, capsys):
    """The tiny model has 256 positions; a 400-character problem with 8 new tokens cannot fit. Before, it was
    sampled past the model's positions (a 10 MB one drove memory to ~5 GB)."""
    from literl.config.errors import ConfigError

    rows = [{"id": f"p{i}", "problem": f"{i}+{i}=", "answer": str(2 * i)} for i in range(6)]
    rows.insert(3, {"id": "huge", "problem": "9" * 400, "answer": "1"})
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = _train(model_dir, tmp_path / "run", f"data.train={data}", "data.template=raw", "trainer.steps=1")
    err = _console(capsys)
    assert "skipped 1 of 7 training problems" in err and "6 training problems" in err
    assert all("9" * 400 not in s["problem"] for s in map(json.loads, (out / "samples.jsonl").open()))
    with pytest.raises(ConfigError, match="'huge', 40[0-9] prompt tokens"):
        _train(model_dir, tmp_path / "refused", f"data.train={data}", "data.template=raw",
               "data.overlong_prompts=error")
    assert not (tmp_path / "refused").exists()


@pytest.mark.parametrize("setting, message", [
    ("rollout.max_new_tokens=100000000", "leaves no room for a prompt in the model's 256 positions"),
    ("rollout.prompts_per_step=100000000", "cannot fit in memory"),
])
def test_impossible_sizes_are_refused_before_the_rollout(model_dir, tmp_path, setting, message):
    from literl.config.errors import ConfigError

    with pytest.raises(ConfigError, match=message):
        _train(model_dir, tmp_path / "run", setting)


# ------------------------------------------------------------------------------------------ 9. no silent no-ops
@time_bounded
def broken_reward(response: str, example: dict, *, timeout_s: float = 5.0) -> float:
    raise KeyError("answer_text")        # e.g. a field name that the data does not have


@pytest.mark.parametrize("setting, reward, reason", [
    ("rollout.group_size=1", varying_reward, "rollout.group_size=1: each prompt has one response"),
    ("rollout.group_size=2", broken_reward, "reward function broken_reward failed or timed out on every response"),
])
def test_a_step_without_learning_signal_says_why(model_dir, tmp_path, capsys, setting, reward, reason):
    """group_size=1 with a group advantage never changed the weights, and a reward function failing on every
    response gave all-zero rewards, both without a word on the console."""
    out = _train(model_dir, tmp_path / "run", setting, "trainer.steps=1", reward_fns=[reward])
    err = _console(capsys)
    assert "WARNING: no learning signal at step 1" in err and reason in err
    assert read_metrics(out)[0]["advantage/all_zero"] == 1.0


# ------------------------------------------------------------------------------------------ 11. honest resumes
def test_resuming_a_finished_run_whose_checkpoints_were_deleted_is_refused(model_dir, run_copy):
    """Before, it retrained from step 0 behind a 'no checkpoint yet' note and overwrote final/."""
    final = _weights(run_copy / "final")
    shutil.rmtree(run_copy / "checkpoints")
    with pytest.raises(FileExistsError, match="finished run .* whose checkpoints were deleted"):
        _resume(model_dir, run_copy)
    after = _weights(run_copy / "final")
    assert all(torch.equal(final[k], after[k]) for k in final)


def test_the_summary_counts_the_steps_the_model_was_trained_for(model_dir, run_copy, capsys):
    """Resumed with trainer.steps=1 below its checkpoint's step 2: the model is step 2's, and summary.json said 1."""
    _resume(model_dir, run_copy, "trainer.steps=1")
    assert json.loads((run_copy / "summary.json").read_text())["steps"] == 2
    assert "trainer.steps=1 is below the checkpoint's step 2" in _console(capsys)


def test_a_checkpoint_of_the_previous_format_still_resumes(model_dir, run_copy, capsys):
    """Checkpoints written before weights_only loading kept numpy's RNG state as an array: still readable."""
    import numpy as np

    path = run_copy / "checkpoints/step_000002/trainer_state.pt"
    state = torch.load(path, weights_only=True)
    kind, keys, position, has_gauss, cached = state["rng"]["numpy"]
    state["rng"]["numpy"] = (kind, keys.numpy().astype(np.uint32), position, has_gauss, cached)
    torch.save(state, path)
    _resume(model_dir, run_copy, "trainer.steps=3")
    assert "resumed from" in _console(capsys) and not (run_copy / "checkpoints/corrupt-step_000002").exists()
    assert [r["step"] for r in read_metrics(run_copy)] == [1, 2, 3]
