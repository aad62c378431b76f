"""Files literl creates in a run or ablation folder are never opened through a symbolic link it did not make
(issue 59, R5: the directory lock opened `<dir>/.lock` following links and truncated it, emptying the link's
target). Each test plants a link to a victim file and checks the victim is unchanged and the refusal names the
link and the fix."""

from __future__ import annotations

import os
import sys

import pytest

from literl.cli import main
from literl.data.no_follow import LinkRefused, open_append
from literl.run.lock import DirectoryLock
from literl.run.metrics_log import MetricsLog


@pytest.fixture
def victim(tmp_path):
    path = tmp_path / "victim.txt"
    path.write_text("data\n")
    return path


def test_a_link_named_lock_is_refused_and_its_target_keeps_its_bytes(tmp_path, victim):
    """The old lock did os.open(.lock, O_RDWR|O_CREAT) then ftruncate(0) + write(pid): 'data\\n' became the pid."""
    run = tmp_path / "run"
    run.mkdir()
    (run / ".lock").symlink_to(victim)
    with pytest.raises(LinkRefused, match=r"\.lock is a symbolic link.*rm .*\.lock"):
        DirectoryLock(run).acquire()
    assert victim.read_text() == "data\n"


def test_train_on_a_folder_whose_lock_is_a_link_exits_2_with_one_line(tmp_path, victim, capsys, tiny_qwen3_dir):
    run = tmp_path / "run"
    run.mkdir()
    (run / ".lock").symlink_to(victim)
    code = main(["train", f"model.path={tiny_qwen3_dir}", f"trainer.output_dir={run}", "trainer.steps=0",
                 "eval.before=false", "trainer.progress=false", "data.size=8"])
    assert code == 2
    err = capsys.readouterr().err
    assert "is a symbolic link" in err and "Traceback" not in err
    assert victim.read_text() == "data\n"


def test_an_ablation_folder_whose_lock_is_a_link_is_refused(tmp_path, victim, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    out = tmp_path / "ablation"
    out.mkdir()
    (out / ".lock").symlink_to(victim)
    assert main(["ablate", "advantage_norm", "trainer.steps=1", "--out", str(out)]) == 2
    assert "is a symbolic link" in capsys.readouterr().err
    assert victim.read_text() == "data\n"
    assert not (out / "plan.json").exists()


def test_metric_lines_are_not_appended_through_a_link(tmp_path, victim):
    """metrics.jsonl is appended to once a step: through a planted link each step would add a line to the victim."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").symlink_to(victim)
    log = MetricsLog(run, [], {}, run_name="r")
    with pytest.raises(LinkRefused, match="metrics.jsonl is a symbolic link"):
        log.log(1, {"loss/total": 0.5})
    assert victim.read_text() == "data\n"


def test_appending_to_a_plain_file_still_works_and_creates_it(tmp_path):
    path = tmp_path / "train.log"
    with open_append(path) as f:
        f.write("a\n")
    with open_append(path) as f:
        f.write("b\n")
    assert path.read_text() == "a\nb\n"


def test_an_ablation_run_whose_train_log_is_a_link_fails_alone(tmp_path, victim):
    """The runner appends each run's output to its train.log: a link there fails that run (named), the victim keeps
    its bytes, and the runner goes on (a stand-in python that would fail if it were ever launched)."""
    from rich.console import Console

    from literl.arena.runner import AblationRunner
    from literl.arena.spec import parse_spec

    spec = parse_spec({"preset": "lite_ppo", "baseline": "a", "seeds": 1, "variants": {"a": {}}}, source="t.yaml")
    (run,) = spec.plan(tmp_path / "out")
    run.directory.mkdir(parents=True)
    (run.directory / "train.log").symlink_to(victim)
    console = Console(record=True, width=200, file=open(os.devnull, "w"))
    outcome = AblationRunner([run], {run.directory: 1}, console=console, python="/bin/false").run()
    assert outcome.failed == [(run, -1)]
    assert "train.log is a symbolic link" in console.export_text().replace("\n", "")
    assert victim.read_text() == "data\n"
