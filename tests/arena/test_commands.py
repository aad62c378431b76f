"""`literl ablate` and `literl report` from the command line (without training: dry runs and hand-made runs)."""

from __future__ import annotations

import json
import sys

import pytest

from literl.cli import main
from tests.arena.fake_runs import write_run
from tests.arena.test_summary import make_ablation


@pytest.fixture(autouse=True)
def keep_argv(monkeypatch):
    monkeypatch.setattr(sys, "argv", list(sys.argv))


def test_list_names_the_shipped_specs(capsys):
    assert main(["ablate", "--list"]) == 0
    out = capsys.readouterr().out
    assert "advantage_norm" in out and "4×2×3 runs" in out


def test_dry_run_validates_and_prints_every_run(capsys, tmp_path):
    assert main(["ablate", "advantage_norm", "trainer.steps=2", "--out", str(tmp_path / "o"), "--jobs", "2",
                 "--threads", "2", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "24 runs" in out
    assert "no_std/reward_pm1/seed_2:" in out and "algorithm.reward_shaping.rescale.low=-1" in out
    assert "trainer.steps=60 eval.every=15" in out and "trainer.steps=2" in out and "trainer.threads=1" in out
    assert not (tmp_path / "o").exists(), "a dry run writes nothing"


@pytest.mark.parametrize("argv, message", [
    (["ablate", "no_such_spec"], "neither a file nor a shipped spec"),
    (["ablate", "advantage_norm", "trainer.stepz=3", "--dry-run"], "does not load as a config"),
    (["ablate", "advantage_norm", "seed=3"], "which the runner sets"),
    (["ablate"], "name a spec file"),
    (["ablate", "advantage_norm", "--jobs", "0"], "--jobs and --threads must be >= 1"),
])
def test_bad_input_exits_2_with_the_fix(argv, message, capsys):
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_report_rebuilds_an_ablation_folder(tmp_path, capsys):
    make_ablation(tmp_path)
    assert main(["report", str(tmp_path)]) == 0
    assert (tmp_path / "report.html").is_file()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["runs"]["used"] == 24
    assert "helps" in capsys.readouterr().out


def test_report_of_plain_runs(tmp_path, capsys):
    write_run(tmp_path / "one", [0.2, 0.4])
    write_run(tmp_path / "two", [0.3, 0.3])
    assert main(["report", str(tmp_path / "one"), str(tmp_path / "two"), "--out", str(tmp_path / "both.html")]) == 0
    assert "one" in (tmp_path / "both.html").read_text()
    assert main(["report", str(tmp_path / "one")]) == 0
    assert (tmp_path / "one" / "report.html").is_file()


def test_report_refuses_what_is_not_a_run(tmp_path, capsys):
    assert main(["report", str(tmp_path)]) == 2
    assert "neither a run directory" in capsys.readouterr().err


def test_report_labels_are_text_not_markup(tmp_path, capsys):
    """Issue 31.15: a run label with two `$` crashed `literl report` in matplotlib's mathtext, and `[...]` in a
    label was read as rich markup in the console table (`[bold]` vanished)."""
    dollars, brackets = tmp_path / "lr $10^{-3$", tmp_path / "[bold]run"
    write_run(dollars, [0.3, 0.4])
    write_run(brackets, [0.3, 0.5])
    assert main(["report", str(dollars), str(brackets), "--out", str(tmp_path / "r.html")]) == 0
    out = capsys.readouterr().out
    assert "lr $10^{-3$" in out and "[bold]run" in out
    assert (tmp_path / "r.html").is_file()


def test_report_reads_past_a_line_that_is_not_utf8(tmp_path, capsys):
    """Issue 31.18: one non-UTF-8 line in eval.jsonl stopped `literl report` with a raw UnicodeDecodeError. The
    line is skipped with a warning naming the file and the line, as a line cut short by a crash is skipped."""
    run = write_run(tmp_path / "run", [0.3, 0.4, 0.5])
    with open(run / "eval.jsonl", "ab") as f:
        f.write(b'{"step": 99, "tag": "\xff\xfe"}\n')
    with pytest.warns(UserWarning, match=r"eval.jsonl, line 4: not valid UTF-8"):
        assert main(["report", str(run)]) == 0
    assert (run / "report.html").is_file()
