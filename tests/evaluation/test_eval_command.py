"""`literl eval` end to end on a tiny random Qwen3, and how --model finds a model in a run directory."""

from __future__ import annotations

import json
import sys

import pytest

from literl.cli import main
from literl.commands.eval_command import resolve_model_dir


def run_cli(monkeypatch, *argv: str) -> int:
    monkeypatch.setattr(sys, "argv", ["literl", *argv])
    return main(list(argv))


def test_eval_end_to_end(tiny_qwen3_dir, shared_data, tmp_path, monkeypatch, capsys):
    output = tmp_path / "results" / "eval.json"
    code = run_cli(monkeypatch, "eval", "--model", str(tiny_qwen3_dir), "--benchmarks", "math500,aime24",
                   "--samples", "4", "--limit", "20", "--max-new-tokens", "4", "--data-dir", str(shared_data),
                   "--output", str(output), "--device", "cpu", "--batch-size", "40")
    assert code == 0
    result = json.loads(output.read_text())
    assert set(result["benchmarks"]) == {"math500", "aime24"}
    assert result["settings"]["samples"] == 4 and result["settings"]["max_new_tokens"] == 4
    assert result["metadata"]["model"] == str(tiny_qwen3_dir)
    for bench in result["benchmarks"].values():
        assert bench["num_problems"] == 20 and len(bench["problems"]) == 20
        assert set(bench["metrics"]) == {"avg@4", "pass@1", "pass@2", "pass@4", "maj@1", "maj@2", "maj@4"}
        assert all(0.0 <= v <= 1.0 for v in bench["metrics"].values())
        assert bench["metrics"]["pass@1"] == pytest.approx(bench["metrics"]["avg@4"])
        assert bench["metrics"]["pass@1"] <= bench["metrics"]["pass@2"] <= bench["metrics"]["pass@4"]
        assert 1 <= bench["mean_response_tokens"] <= 4 and 0.0 <= bench["truncation_rate"] <= 1.0
        record = bench["problems"][0]
        assert len(record["correct"]) == len(record["extracted"]) == len(record["response_tokens"]) == 4
    assert result["benchmarks"]["math500"]["problems"][0]["id"] == "test/precalculus/807.json"
    printed = capsys.readouterr().out
    assert "math500" in printed and "avg@4" in printed and str(output) in printed


def test_eval_reports_bad_input_without_a_traceback(tmp_path, monkeypatch, capsys):
    assert run_cli(monkeypatch, "eval", "--model", str(tmp_path / "missing")) == 2
    assert "is not a directory" in capsys.readouterr().err


@pytest.mark.parametrize("option,value,message", [("--batch-size", "0", "--batch-size must be >= 1 (got 0)"),
                                                  ("--samples", "0", "--samples must be >= 1 (got 0)")])
def test_eval_rejects_bad_counts_before_loading_the_model(tmp_path, monkeypatch, capsys, option, value, message):
    # The model path does not exist: the count must be reported first, without waiting for a model to load.
    assert run_cli(monkeypatch, "eval", "--model", str(tmp_path / "missing"), option, value) == 2
    assert capsys.readouterr().err.strip() == f"literl eval: error: {message}"


def test_eval_reports_a_template_the_tokenizer_lacks_without_a_traceback(tiny_qwen3_dir, tmp_path, monkeypatch,
                                                                          capsys):
    problems = tmp_path / "problems.jsonl"
    problems.write_text(json.dumps({"id": "1", "problem": "1+1", "answer": "2"}) + "\n")
    output = tmp_path / "eval.json"
    code = run_cli(monkeypatch, "eval", "--model", str(tiny_qwen3_dir), "--benchmarks", str(problems),
                   "--template", "chat", "--device", "cpu", "--output", str(output))
    assert code == 2
    err = capsys.readouterr().err                     # after the model-loading progress bars
    assert err.splitlines()[-1].startswith("literl eval: error: template 'chat' needs a tokenizer with a "
                                           "chat_template")
    assert "Traceback" not in err and not output.exists()


def test_eval_help_explains_every_option(monkeypatch, capsys):
    with pytest.raises(SystemExit):
        run_cli(monkeypatch, "eval", "--help")
    text = capsys.readouterr().out
    for option in ("--model", "--benchmarks", "--samples", "--temperature", "--top-p", "--top-k",
                   "--max-new-tokens", "--limit", "--output", "--data-dir", "--template", "--seed",
                   "--batch-size", "--dtype"):
        assert option in text
    assert "Known benchmarks: aime24" in text


def test_resolve_model_dir_in_a_run_directory(tmp_path):
    run = tmp_path / "run"
    for step in ("step_000002", "step_000010"):
        (run / "checkpoints" / step / "model").mkdir(parents=True)
        (run / "checkpoints" / step / "model" / "config.json").write_text("{}")
    (run / "checkpoints" / "step_000011" / "model").mkdir(parents=True)            # incomplete: no config
    assert resolve_model_dir(run) == run / "checkpoints" / "step_000010" / "model"
    (run / "final").mkdir()
    (run / "final" / "config.json").write_text("{}")
    assert resolve_model_dir(run) == run / "final"
    assert resolve_model_dir(run / "final") == run / "final"
    with pytest.raises(FileNotFoundError, match="holds no model"):
        resolve_model_dir(tmp_path)
