"""Damaged files in run and ablation folders give a message naming the file and the fix, and `report` and
`ablate` agree on what is finished (issue 59: R4, R9, R10). Hand-made runs (tests/arena/fake_runs.py) and the
runner's stand-in trainer (tests/arena/fake_trainer.py); nothing trains."""

from __future__ import annotations

import sys

import pytest

from literl.arena import ablation
from literl.arena.runs import is_finished, load_run
from literl.cli import main
from tests.arena.fake_runs import write_run
from tests.arena.test_runner import fake_python, plan, run_all  # noqa: F401 - fake_python is a fixture
from tests.arena.test_summary import make_ablation

CUT_SHORT = b'{"seed": 1, "final'


@pytest.fixture(autouse=True)
def keep_argv(monkeypatch):
    monkeypatch.setattr(sys, "argv", list(sys.argv))


def _missing(summary) -> dict[str, str]:
    return {f"{m['variant']}/{m['scenario']}/seed_{m['seed']}": m["reason"] for m in summary["runs"]["missing"]}


@pytest.mark.parametrize("damage", [CUT_SHORT, b"\xff\xfe{}", b"[1, 2]"])
def test_report_names_a_damaged_summary_and_the_fix(tmp_path, capsys, damage):
    """24 hand-made runs; base/s1/seed_1's summary.json damaged three ways (cut short, not UTF-8 — a raw
    UnicodeDecodeError before —, a list). The run is left out as damaged, with the fix; 23 are used."""
    _, runs = make_ablation(tmp_path)
    target = next(r for r in runs if (r.variant, r.scenario, r.seed) == ("base", "s1", 1))
    (target.directory / "summary.json").write_bytes(damage)
    summary = ablation.summarize_ablation(tmp_path, report=False)      # what `literl report` reads, without plots
    assert summary["runs"]["used"] == 23
    reason = _missing(summary)["base/s1/seed_1"]
    assert reason.startswith("summary.json is damaged (") and "rerun the ablation, which resumes it" in reason


def test_report_of_a_plain_run_with_a_non_utf8_summary_prints_no_traceback(tmp_path, capsys):
    """R9's reproduction: printf '\\xff\\xfe{}' > summary.json; literl report RUN raised UnicodeDecodeError."""
    run = write_run(tmp_path / "run", [0.3, 0.4])
    (run / "summary.json").write_bytes(b"\xff\xfe{}")
    assert main(["report", str(run)]) == 0
    out = capsys.readouterr().out.replace("\n", "")
    assert "summary.json is damaged (not valid UTF-8)" in out


def test_ablate_resumes_a_run_whose_summary_is_damaged_and_keeps_the_old_file(tmp_path, fake_python):
    """Before: the runner skipped the run as finished (summary.json existed) while report called it unfinished
    and said to rerun: the run was lost for good. Now both call it unfinished; the rerun resumes it from its
    checkpoint at step 4 (no step redone), writes a new summary.json, and keeps the damaged bytes aside."""
    runs = plan(tmp_path / "out", seeds=1)
    run_all(runs, fake_python)
    damaged = runs[0]
    (damaged.directory / "summary.json").write_bytes(CUT_SHORT)
    assert not is_finished(damaged.directory)
    outcome, text = run_all(runs, fake_python)
    assert [r.variant for r in outcome.finished] == ["a"] and [r.variant for r in outcome.skipped] == ["b"]
    assert "summary.json is damaged (not valid JSON" in text
    assert is_finished(damaged.directory)
    assert (damaged.directory / "summary.json.damaged").read_bytes() == CUT_SHORT
    assert "from step 4" in (damaged.directory / "train.log").read_text().splitlines()[-1]


@pytest.mark.parametrize("damage, problem", [(b'{"spec": {"name": "handm', "is not valid JSON"),
                                             (b"\xff\xfe", "is not valid UTF-8"),
                                             (b'{"spec": {}, "runs": 3}', "does not hold the spec")])
def test_a_damaged_plan_is_named_with_the_fix_by_report_and_ablate(tmp_path, capsys, damage, problem):
    make_ablation(tmp_path)
    (tmp_path / "plan.json").write_bytes(damage)
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err.replace("\n", "")
    assert f"plan.json {problem}" in err and "mv " in err and "Traceback" not in err
    with pytest.raises(Exception, match=rf"plan.json {problem}"):
        ablation.load_plan(tmp_path)


def test_metric_lines_that_are_not_records_are_skipped_with_a_warning_naming_them(tmp_path, capsys):
    """A JSON list line in metrics.jsonl (AttributeError before) and "step": 1e400 in eval.jsonl (read as inf:
    OverflowError in int()) are skipped with a warning naming the file and line; the rest of the run is read."""
    run = write_run(tmp_path / "run", [0.3, 0.4, 0.5], eval_every=2)
    with open(run / "metrics.jsonl", "a") as f:
        f.write("[1, 2, 3]\n")
    with open(run / "eval.jsonl", "a") as f:
        f.write('{"step": 1e400, "tag": "after", "testbed/accuracy": 0.9}\n')
    with pytest.warns(UserWarning) as caught:
        assert main(["report", str(run)]) == 0
    messages = [str(w.message) for w in caught]
    assert any("metrics.jsonl, line 5: a JSON list, not an object" in m for m in messages)
    assert any('eval.jsonl, line 4: "step" is Infinity, not a whole number' in m for m in messages)
    record = load_run(run)
    assert len(record.metrics) == 4 and record.eval_curve("testbed/accuracy") == ([0, 2, 4], [0.3, 0.4, 0.5])


def test_a_damaged_diagnostics_file_is_named_and_the_run_still_counts(tmp_path):
    run = write_run(tmp_path / "run", [0.3, 0.4])
    (run / "diagnostics.json").write_bytes(b"\xff")
    with pytest.warns(UserWarning, match=r"diagnostics.json is not valid UTF-8: the report's mechanism sections"):
        record = load_run(run)
    assert record.finished and record.diagnostics is None


def test_export_onto_an_existing_file_is_refused_before_anything_is_written(tmp_path, capsys):
    """R10: `--export f` with f a file gave a raw FileExistsError (after report.html was written)."""
    run = write_run(tmp_path / "run", [0.3, 0.4])
    target = tmp_path / "f"
    target.write_text("mine\n")
    assert main(["report", str(run), "--export", str(target)]) == 2
    err = capsys.readouterr().err
    assert f"--export {target}: {target} is a file, not a folder" in err
    assert target.read_text() == "mine\n" and not (run / "report.html").exists()
    assert main(["report", str(run), "--export", str(target / "sub")]) == 2
