"""`literl difficulty` and training with `eval.policy=trainer` on damaged inputs (issue 59: combinations the probe
did not reach): a weights or tokenizer file cut short, an output path that is a file, a problem set whose every
row is unusable. Each gives exit 2 and one line naming the file and the fix, before any sampling or training.
Before: a cut-short model.safetensors raised a raw SafetensorError, a cut tokenizer.json a bare "Unterminated
string" naming no file, a file as --output-dir a FileExistsError after every problem was sampled, and a benchmark
without a usable problem a KeyError ('avg@1') at the first evaluation."""

from __future__ import annotations

import json
import shutil
import sys

import pytest

from literl.cli import main
from literl.model.damaged_files import damaged_model_file

GOOD_PROBLEMS = [{"id": "1", "problem": "1+1", "answer": "2"}, {"id": "2", "problem": "2+2", "answer": "4"}]


@pytest.fixture(autouse=True)
def keep_argv(monkeypatch):
    monkeypatch.setattr(sys, "argv", list(sys.argv))


@pytest.fixture
def problems(tmp_path):
    path = tmp_path / "problems.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in GOOD_PROBLEMS))
    return path


def _cut(path, keep: int) -> None:
    path.write_bytes(path.read_bytes()[:keep])


def _damaged_copy(model_dir, tmp_path, name: str, keep: int):
    copy = tmp_path / f"damaged-{name}"
    shutil.copytree(model_dir, copy)
    _cut(copy / name, keep)
    return copy


def _difficulty(model, problems, out, *extra):
    return main(["difficulty", "--model", str(model), "--problems", str(problems), "--samples", "2",
                 "--max-new-tokens", "3", "--device", "cpu", "--output-dir", str(out), *extra])


def _train(model, out, *extra):
    return main(["train", f"model.path={model}", f"trainer.output_dir={out}", "trainer.steps=1",
                 "rollout.prompts_per_step=2", "rollout.group_size=2", "rollout.max_new_tokens=4",
                 "eval.policy=trainer", "eval.limit=2", "eval.samples=1", "trainer.progress=false", "data.size=8",
                 *extra])


def _last_line(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return [line for line in err.splitlines() if line.strip()][-1]


def test_an_intact_model_directory_has_no_damaged_file(tiny_qwen3_dir):
    assert damaged_model_file(tiny_qwen3_dir) is None


@pytest.mark.parametrize("name, keep, problem", [
    ("model.safetensors", 1000, "model.safetensors: cut short (1000 bytes, its header alone declares"),
    ("model.safetensors", 4, "model.safetensors: cut short (4 bytes, less than a safetensors header)"),
    ("tokenizer.json", 10, "tokenizer.json: not valid JSON"),
])
def test_difficulty_names_a_damaged_model_file(tiny_qwen3_dir, tmp_path, problems, capsys, name, keep, problem):
    model = _damaged_copy(tiny_qwen3_dir, tmp_path, name, keep)
    assert _difficulty(model, problems, tmp_path / "out") == 2
    line = _last_line(capsys)
    assert line.startswith("literl difficulty: error: could not load the model in") and problem in line
    assert "Copy that file again" in line and not (tmp_path / "out").exists()


def test_difficulty_refuses_a_file_as_output_dir_before_loading_the_model(tmp_path, problems, capsys):
    """The model path does not even exist: the output path is checked first, so no sampling is lost."""
    target = tmp_path / "afile"
    target.write_text("mine\n")
    assert _difficulty(tmp_path / "no-model", problems, target) == 2
    assert "--output-dir " + str(target) + " is a file, not a folder" in _last_line(capsys)
    assert target.read_text() == "mine\n"


def test_difficulty_refuses_a_set_without_a_usable_problem(tiny_qwen3_dir, tmp_path, capsys):
    unusable = tmp_path / "nan.jsonl"
    unusable.write_text('{"id": "1", "problem": "1+1", "answer": NaN}\n')
    with pytest.warns(UserWarning, match="skipped 1 of 1 rows"):
        assert _difficulty(tiny_qwen3_dir, unusable, tmp_path / "out") == 2
    assert "has no usable problem" in _last_line(capsys) and not (tmp_path / "out").exists()


def test_trainer_policy_evaluation_of_a_benchmark_without_a_usable_problem_is_refused_before_training(
        tiny_qwen3_dir, tmp_path, capsys):
    unusable = tmp_path / "bench.jsonl"
    unusable.write_text('{"id": "1", "problem": "1+1", "answer": 1e400}\n')
    with pytest.warns(UserWarning, match="skipped 1 of 1 rows"):
        assert _train(tiny_qwen3_dir, tmp_path / "run", f"eval.benchmarks=[{unusable}]") == 2
    assert "eval.benchmarks: " + str(unusable) + " has no usable problem" in _last_line(capsys)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


def test_trainer_policy_run_names_cut_short_weights(tiny_qwen3_dir, tmp_path, problems, capsys):
    model = _damaged_copy(tiny_qwen3_dir, tmp_path, "model.safetensors", 1000)
    assert _train(model, tmp_path / "run", f"eval.benchmarks=[{problems}]") == 2
    assert "model.safetensors: cut short" in _last_line(capsys)


def test_a_file_as_trainer_output_dir_is_named(tiny_qwen3_dir, tmp_path, capsys):
    target = tmp_path / "afile"
    target.write_text("mine\n")
    assert _train(tiny_qwen3_dir, target) == 2
    assert f"trainer.output_dir={target} is a file, not a folder" in _last_line(capsys)
    assert target.read_text() == "mine\n"
