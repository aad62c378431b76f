"""The runner on a stand-in trainer (tests/arena/fake_trainer.py): parallel jobs, skipping finished runs,
resuming from checkpoints, restarting runs without one, failures, and Ctrl-C then rerun."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from rich.console import Console

from literl.arena.runner import AblationRunner, steps_logged, threads_per_run
from literl.arena.spec import parse_spec

FAKE_TRAINER = Path(__file__).with_name("fake_trainer.py")
STEPS = 4


@pytest.fixture
def fake_python(tmp_path) -> str:
    """An executable that takes the runner's `python -m literl.cli train ...` and runs the fake trainer."""
    path = tmp_path / "fake-python"
    path.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_TRAINER}" "$@"\n')
    path.chmod(0o755)
    return str(path)


def plan(out: Path, variants=None, seeds=2):
    spec = parse_spec({"preset": "lite_ppo", "baseline": "a", "seeds": seeds, "base": {"trainer.steps": STEPS},
                       "variants": variants or {"a": {}, "b": {}}}, source="t.yaml")
    return spec.plan(out)


def run_all(runs, python, jobs=1, threads=2):
    console = Console(record=True, width=200, file=open(os.devnull, "w"))
    outcome = AblationRunner(runs, {r.directory: STEPS for r in runs}, jobs=jobs, threads=threads,
                             console=console, python=python).run()
    return outcome, console.export_text()


def launches(run) -> list[str]:
    path = run.directory / "launches.txt"
    return path.read_text().splitlines() if path.exists() else []


def test_threads_are_divided_between_jobs():
    assert threads_per_run(2, 2) == 1 and threads_per_run(1, 2) == 2 and threads_per_run(4, 2) == 1


def test_every_run_finishes_in_parallel_and_a_rerun_skips_them(tmp_path, fake_python):
    runs = plan(tmp_path / "out")
    outcome, text = run_all(runs, fake_python, jobs=2)
    assert outcome.exit_code == 0 and len(outcome.finished) == 4
    for run in runs:
        assert (run.directory / "summary.json").is_file() and steps_logged(run.directory) == STEPS
        assert "trainer.threads=1" in launches(run)[0] and "trainer.resume=true" in launches(run)[0]
        assert "fake trainer" in (run.directory / "train.log").read_text()
    assert "finished a/default/seed_0" in text
    again, text = run_all(runs, fake_python, jobs=2)
    assert len(again.skipped) == 4 and not again.finished
    assert all(len(launches(r)) == 1 for r in runs)
    assert "4 of 4 runs already finished" in text


def test_a_failed_run_is_reported_with_its_log_and_the_others_continue(tmp_path, fake_python):
    runs = plan(tmp_path / "out", variants={"a": {}, "broken": {"fake.fail": True}}, seeds=1)
    outcome, text = run_all(runs, fake_python)
    assert [r.variant for r, _ in outcome.failed] == ["broken"] and outcome.failed[0][1] == 3
    assert [r.variant for r in outcome.finished] == ["a"]
    assert outcome.exit_code == 1
    assert "FAILED broken/default/seed_0 (exit code 3)" in text
    assert str(runs[1].directory / "train.log") in text.replace("\n", "")
    assert "failing on purpose" in text


def test_a_run_with_a_checkpoint_resumes_and_one_without_restarts_clean(tmp_path, fake_python):
    runs = plan(tmp_path / "out", seeds=1)
    with_checkpoint, without = runs
    (with_checkpoint.directory / "checkpoints" / "step_000002").mkdir(parents=True)
    (with_checkpoint.directory / "checkpoints" / "latest").write_text("step_000002")
    (with_checkpoint.directory / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n')
    without.directory.mkdir(parents=True)
    (without.directory / "metrics.jsonl").write_text('{"step": 1}\n{"step": 2}\n{"step": 3}\n')
    (without.directory / "train.log").write_text("an earlier attempt\n")
    outcome, text = run_all(runs, fake_python)
    assert len(outcome.finished) == 2
    assert "resuming at step 2" in text
    assert "from step 2" in (with_checkpoint.directory / "train.log").read_text()
    lines = (without.directory / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == STEPS, "stale metrics of the crashed attempt must be cleared"
    assert (without.directory / "train.log").read_text().startswith("an earlier attempt")


INTERRUPTIBLE = """
import sys
from pathlib import Path
from rich.console import Console
sys.path.insert(0, {root!r})
from literl.arena.runner import AblationRunner
from tests.arena.test_runner import plan, STEPS
runs = plan(Path({out!r}), seeds=2)
outcome = AblationRunner(runs, {{r.directory: STEPS for r in runs}}, jobs=1, python={python!r},
                         console=Console(file=sys.stdout, width=200)).run()
sys.exit(outcome.exit_code)
"""


def test_ctrl_c_checkpoints_the_running_run_and_a_rerun_finishes_only_the_missing(tmp_path, fake_python):
    out = tmp_path / "out"
    script = INTERRUPTIBLE.format(root=str(Path(__file__).parents[2]), out=str(out), python=fake_python)
    env = {**os.environ, "FAKE_STEP_SECONDS": "0.3"}
    runner = subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, text=True)
    runs = plan(out, seeds=2)
    deadline = time.time() + 60
    while not (steps_logged(runs[1].directory) >= 1 and (runs[0].directory / "summary.json").exists()):
        assert time.time() < deadline and runner.poll() is None, "the first run did not finish in time"
        time.sleep(0.05)
    runner.send_signal(signal.SIGINT)
    output, _ = runner.communicate(timeout=60)
    assert runner.returncode == 130, output
    assert "stopping: no new runs" in output and "stopped b/default/seed_0" in output
    assert not (runs[1].directory / "summary.json").exists()
    assert (runs[1].directory / "checkpoints" / "latest").is_file(), "SIGTERM must leave a checkpoint"
    assert not runs[2].directory.exists(), "no run may start after Ctrl-C"
    finished_before = (runs[0].directory / "summary.json").stat().st_mtime_ns

    rerun = subprocess.run([sys.executable, "-c", script], env={**env, "FAKE_STEP_SECONDS": "0.02"},
                           capture_output=True, text=True, timeout=60)
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    assert all((r.directory / "summary.json").is_file() for r in runs)
    assert (runs[0].directory / "summary.json").stat().st_mtime_ns == finished_before
    assert [len(launches(r)) for r in runs] == [1, 2, 1, 1]
    assert "from step 0" not in (runs[1].directory / "train.log").read_text().split("===")[-1]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_a_run_checkpoints_and_stops_when_the_runner_is_killed(tmp_path, fake_python):
    out = tmp_path / "out"
    script = INTERRUPTIBLE.format(root=str(Path(__file__).parents[2]), out=str(out), python=fake_python)
    runner = subprocess.Popen([sys.executable, "-c", script], env={**os.environ, "FAKE_STEP_SECONDS": "0.5"},
                              stdout=subprocess.DEVNULL)
    first = plan(out, seeds=2)[0]
    deadline = time.time() + 60
    while steps_logged(first.directory) < 1:
        assert time.time() < deadline and runner.poll() is None
        time.sleep(0.05)
    runner.kill()
    runner.wait()
    deadline = time.time() + 20
    while not (first.directory / "checkpoints" / "latest").is_file():
        assert time.time() < deadline, "the orphaned run did not get SIGTERM"
        time.sleep(0.05)
    assert not (first.directory / "summary.json").exists()


def test_a_run_that_cannot_start_fails_alone(tmp_path):
    runs = plan(tmp_path / "out", seeds=1)
    outcome, text = run_all(runs, str(tmp_path / "no-such-python"))
    assert [code for _, code in outcome.failed] == [-1, -1] and outcome.exit_code == 1
    assert "could not start" in text and "could not start" in (runs[0].directory / "train.log").read_text()
