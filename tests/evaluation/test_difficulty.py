"""`literl difficulty`: thresholds, splits, outputs, and the command end to end."""

from __future__ import annotations

import json
import sys

import pytest

from literl.cli import main
from literl.data.files import read_rows
from literl.commands.difficulty_command import default_thresholds, split_by_difficulty, write_difficulty_outputs


@pytest.mark.parametrize("samples,thresholds", [(8, (2, 5)), (4, (1, 2)), (16, (4, 10)), (1, (0, 0))])
def test_default_thresholds_scale_with_k(samples, thresholds):
    """⌊k·2/8⌋ and ⌊k·5/8⌋: k = 8 gives hard 0–2, medium 3–5, easy 6–8 (algorithms.md §8.1)."""
    assert default_thresholds(samples) == thresholds


def test_split_and_outputs(tmp_path):
    records = [{"id": str(i), "problem": f"p{i}", "answer": str(i)} for i in range(9)]
    counts = list(range(9))                                  # one problem per count 0..8
    tiers = split_by_difficulty(records, counts, hard_max=2, medium_max=5)
    assert [r["num_correct"] for r in tiers["hard"]] == [0, 1, 2]
    assert [r["num_correct"] for r in tiers["medium"]] == [3, 4, 5]
    assert [r["num_correct"] for r in tiers["easy"]] == [6, 7, 8]
    summary = write_difficulty_outputs(tmp_path, "toy", records, counts, 8, 2, 5)
    assert summary["tier_sizes"] == {"easy": 3, "medium": 3, "hard": 3}
    assert summary["thresholds"] == {"hard": [0, 2], "medium": [3, 5], "easy": [6, 8]}
    assert summary["mean_accuracy"] == pytest.approx(36 / 72)
    assert read_rows(tmp_path / "counts.jsonl")[4] == {"id": "4", "num_correct": 4, "samples": 8, "answer": "4"}
    assert (tmp_path / "histogram.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert [r["id"] for r in read_rows(tmp_path / "medium.jsonl")] == ["3", "4", "5"]
    assert read_rows(tmp_path / "easy.jsonl")[0] == {"id": "6", "problem": "p6", "answer": "6", "num_correct": 6}
    with pytest.raises(ValueError, match="hard_max <= medium_max"):
        split_by_difficulty(records, counts, hard_max=5, medium_max=2)


def test_difficulty_end_to_end(tiny_qwen3_dir, shared_data, tmp_path, monkeypatch, capsys):
    out = tmp_path / "split"
    argv = ["difficulty", "--model", str(tiny_qwen3_dir), "--problems", "aime24", "--limit", "6",
            "--samples", "8", "--max-new-tokens", "3", "--data-dir", str(shared_data), "--output-dir", str(out),
            "--device", "cpu"]
    monkeypatch.setattr(sys, "argv", ["literl", *argv])
    assert main(argv) == 0
    counts = read_rows(out / "counts.jsonl")
    assert len(counts) == 6 and all(0 <= row["num_correct"] <= 8 and row["samples"] == 8 for row in counts)
    split_sizes = {tier: len(read_rows(out / f"{tier}.jsonl")) for tier in ("easy", "medium", "hard")}
    assert sum(split_sizes.values()) == 6
    assert (out / "histogram.png").stat().st_size > 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tier_sizes"] == split_sizes and summary["model"] == str(tiny_qwen3_dir)
    assert "hard" in capsys.readouterr().out


@pytest.mark.parametrize("options,message", [
    (("--batch-size", "0"), "--batch-size must be >= 1 (got 0)"),
    (("--samples", "0"), "--samples must be >= 1 (got 0)"),
    (("--samples", "4", "--hard-max", "3", "--medium-max", "2"), "need 0 <= --hard-max <= --medium-max"),
])
def test_difficulty_rejects_bad_settings_before_loading_the_model(tmp_path, monkeypatch, capsys, options, message):
    argv = ["difficulty", "--model", str(tmp_path / "missing"), "--problems", "aime24", *options]
    monkeypatch.setattr(sys, "argv", ["literl", *argv])
    assert main(argv) == 2
    assert capsys.readouterr().err.startswith(f"literl difficulty: error: {message}")


def test_difficulty_reports_a_template_the_tokenizer_lacks_without_a_traceback(tiny_qwen3_dir, tmp_path,
                                                                                monkeypatch, capsys):
    problems = tmp_path / "problems.jsonl"
    problems.write_text(json.dumps({"id": "1", "problem": "1+1", "answer": "2"}) + "\n")
    out = tmp_path / "split"
    argv = ["difficulty", "--model", str(tiny_qwen3_dir), "--problems", str(problems), "--template", "chat",
            "--device", "cpu", "--output-dir", str(out)]
    monkeypatch.setattr(sys, "argv", ["literl", *argv])
    assert main(argv) == 2
    err = capsys.readouterr().err                     # after the model-loading progress bars
    assert err.splitlines()[-1].startswith("literl difficulty: error: template 'chat' needs a tokenizer with a "
                                           "chat_template")
    assert not out.exists()
