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


def test_seeds_and_variants_narrow_a_spec_into_a_folder_of_their_own(capsys):
    """finding_e_score has 3 variants × 8 seeds (8-15); --seeds 0,2-3 --variants dapo_score,lite_ppo leaves 2 × 3 =
    6 runs, variants in the spec's order (lite_ppo first), under runs/ablations/finding_e_score-seeds_0+2-3-
    variants_dapo_score+lite_ppo, so the spec's own folder and summary are left alone."""
    assert main(["ablate", "finding_e_score", "--seeds", "0,2-3", "--variants", "dapo_score,lite_ppo",
                 "--dry-run"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines[:-1]] == [
        f"{v}/default/seed_{s}" for s in (0, 2, 3) for v in ("lite_ppo", "dapo_score")]
    assert lines[-1].startswith("6 runs")
    folder = "runs/ablations/finding_e_score-seeds_0+2-3-variants_dapo_score+lite_ppo/"
    assert all(f"trainer.output_dir={folder}" in line for line in lines[:-1])


def test_seed_lists_read_ranges_and_refuse_what_is_not_one():
    """'8-15' is 8 seeds, both ends included; '0,2-3' is 0, 2, 3; a reversed range, a word or a repeat is refused."""
    from literl.arena.spec import parse_seed_list
    from literl.config.errors import ConfigError

    assert parse_seed_list("8-15") == list(range(8, 16))
    assert parse_seed_list("0, 2-3") == [0, 2, 3]
    for bad, message in [("3-1", "low ≤ high"), ("x", "is not a seed"), ("1,0-2", "repeats a seed"), ("", "not a")]:
        with pytest.raises(ConfigError, match=message):
            parse_seed_list(bad)


@pytest.mark.parametrize("argv, message", [
    (["ablate", "finding_e_score", "--variants", "dapo", "--dry-run"], "must keep the baseline 'lite_ppo'"),
    (["ablate", "finding_e_score", "--variants", "lite_ppo,dapo_scor", "--dry-run"], "did you mean 'dapo_score'"),
    (["ablate", "finding_e_score", "--seeds", "4-2", "--dry-run"], "low ≤ high"),
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
