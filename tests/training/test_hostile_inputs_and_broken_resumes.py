"""Runs survive misuse: resume on a folder that is not a run, a refused resume, a full disk,
hostile reward values, a reward that always fails, LoRA ranks beyond the layers, data without a usable problem.

Each test reproduces what a probe of the issue found (they failed before the fix) on a tiny model; the training
ones start from one finished two-step run (checkpoints at steps 1 and 2), copied per test.
"""

from __future__ import annotations

import os
import shutil

import pytest
import yaml

from literl.cli import main
from literl.config.load import load_config
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


def _tree(folder):
    """Every path under `folder` with its bytes (None for a folder), for 'nothing was changed' checks."""
    return {str(p.relative_to(folder)): (None if p.is_dir() else p.read_bytes()) for p in sorted(folder.rglob("*"))}


# ------------------------------------------------------------------------------------------ 2. not a run
def test_resume_refuses_a_folder_that_is_not_a_literl_run_and_deletes_nothing(model_dir, tmp_path, capsys):
    """Issue 31.2: `trainer.resume=true` on a folder holding the user's notes.txt, .old-backup/, .tmp-work/ and
    .bashrc.tmp removed the two folders recursively as 'unfinished temporary files', then trained into it."""
    folder = tmp_path / "mine"
    for sub in (".old-backup", ".tmp-work"):
        (folder / sub).mkdir(parents=True)
        (folder / sub / "precious.txt").write_text("keep me")
    (folder / "notes.txt").write_text("my notes")
    (folder / ".bashrc.tmp").write_text("export X=1")
    before = _tree(folder)
    for resume in ("true", "false"):
        assert main(["train", *_overrides(model_dir, folder, f"trainer.resume={resume}")]) == 2
        err = _console(capsys)
        assert "not a literl run" in err and "notes.txt" in err and "trainer.output_dir" in err
        assert _tree(folder) == before, "nothing in the folder was changed"


def test_a_run_keeps_files_that_only_look_like_temporaries(model_dir, run_copy):
    """Only literl's own temporaries (their exact names, where literl writes them) are removed at a start."""
    mine = [run_copy / ".old-backup", run_copy / "checkpoints/.tmp-work", run_copy / ".bashrc.tmp"]
    mine[0].mkdir()
    mine[1].mkdir()
    mine[2].write_text("export X=1")
    literl_leftovers = [run_copy / "checkpoints/.tmp-step_000003-4242", run_copy / ".old-final-4242",
                        run_copy / ".metrics.jsonl.ab_cd9xy.tmp", run_copy / "checkpoints/.latest.q1w2e3r4.tmp"]
    for path in literl_leftovers:
        path.mkdir() if "step_" in path.name or "final" in path.name else path.write_text("half")
    _train(model_dir, run_copy, "trainer.resume=true", "trainer.steps=3", reward_fns=[varying_reward])
    assert all(p.exists() for p in mine)
    assert not any(p.exists() for p in literl_leftovers)
    assert [r["step"] for r in read_metrics(run_copy)] == [1, 2, 3]


# ------------------------------------------------------------------------------------------ 7. full disk
@pytest.fixture
def small_disk(tmp_path):
    """A 4 MiB tmpfs (a real file system that fills up); needs root to mount."""
    import subprocess

    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root (the simulated full-disk test runs everywhere)")
    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True).returncode:
        pytest.skip("this machine does not let a test mount a tmpfs")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def _fill(disk, leave: int):
    """Fill `disk` up to `leave` free bytes with one file; returns it."""
    filler = disk / "filler"
    free = shutil.disk_usage(disk).free
    with open(filler, "wb") as f:
        f.write(b"\0" * max(0, free - leave))
    return filler


def test_a_full_disk_during_a_checkpoint_is_named_and_leaves_no_partial_copy(model_dir, finished_run, small_disk,
                                                                              capsys):
    """Issue 31.7, on a real full disk: torch.save and safetensors report it as RuntimeError / SafetensorError,
    not OSError(ENOSPC), so the disk-full message never appeared and the partial `.tmp-step_*` stayed on the full
    disk. Now the free space tells, the message names trainer.keep_checkpoints and the free space, the partial
    copy is removed, and once there is room the resume saves."""
    run = small_disk / "run"
    shutil.copytree(finished_run, run)
    filler = _fill(small_disk, leave=40_000)
    argv = ["train", *_overrides(model_dir, run, "trainer.resume=true", "trainer.steps=3")]
    assert main(argv) == 1
    err = _console(capsys)
    assert "no space left" in err and "trainer.keep_checkpoints=2" in err and " free in " in err
    assert not [p.name for p in (run / "checkpoints").iterdir() if p.name.startswith(".")], "partial copy removed"
    filler.unlink()
    assert main(argv) == 0
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3]


def test_a_save_error_that_is_not_an_oserror_on_a_full_disk_is_reported_as_a_full_disk(model_dir, run_copy,
                                                                                       monkeypatch, capsys):
    """The same without root: torch.save raises what it raises on a full disk (a RuntimeError) while the disk
    reports no free space."""
    import torch

    from literl.training import checkpoint

    real_save = torch.save

    def save_on_a_full_disk(obj, path, *args, **kwargs):
        if "checkpoints" in str(path):
            with open(path, "wb") as f:
                f.write(b"partial")
            raise RuntimeError("[enforce fail at inline_container.cc:664] . unexpected pos 64 vs 0")
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save_on_a_full_disk)
    monkeypatch.setattr(checkpoint, "_free_bytes", lambda where: 4096)
    assert main(["train", *_overrides(model_dir, run_copy, "trainer.resume=true", "trainer.steps=3")]) == 1
    err = _console(capsys)
    assert "no space left" in err and "4.0 KiB free" in err and "trainer.keep_checkpoints=2" in err
    assert "unexpected pos 64" in err, "the original error is quoted"
    assert not [p.name for p in (run_copy / "checkpoints").iterdir() if p.name.startswith(".")]


# ------------------------------------------------------------------------------------------ 8. refused resume
def test_a_refused_resume_leaves_config_yaml_as_it_was(model_dir, run_copy):
    """Issue 31.8: a resume refused because its override does not fit the checkpoint (a LoRA rank on a run
    without LoRA) rewrote config.yaml with that override, so the next plain resume failed too."""
    saved = (run_copy / "config.yaml").read_bytes()
    record = (run_copy / "run.json").read_bytes()
    with pytest.raises(RuntimeError, match="model.lora.rank=0"):
        _train(model_dir, run_copy, "trainer.resume=true", "trainer.steps=3", "model.lora.rank=4",
               reward_fns=[varying_reward])
    assert (run_copy / "config.yaml").read_bytes() == saved
    assert (run_copy / "run.json").read_bytes() == record
    assert main(["train", f"trainer.output_dir={run_copy}", "trainer.resume=true", "trainer.steps=3"]) == 0
    assert [r["step"] for r in read_metrics(run_copy)] == [1, 2, 3]


# ------------------------------------------------------------------------------------------ 10. rewards that never work
@time_bounded
def unreachable_judge(response: str, example: dict, *, timeout_s: float = 5.0) -> float:
    raise ConnectionError("the judge at http://judge:8000 does not answer")


def test_a_reward_that_fails_every_step_stops_the_run_with_its_last_checkpoint(model_dir, tmp_path, capsys):
    """Issue 31.10: every step spent its reward budget for zero signal, forever. Now reward.max_failed_batches
    batches in a row without one usable reward stop the run (exit 1, a message naming the function and the
    setting, no traceback), after saving the state of the last complete step."""
    out = tmp_path / "run"
    code = main(["train", *_overrides(model_dir, out, "trainer.steps=4", "reward.max_failed_batches=2",
                                      "reward.fns.0.fn=tests.training.test_hostile_inputs_and_broken_resumes:unreachable_judge")])
    err = _console(capsys)
    assert code == 1 and "Traceback" not in err
    assert "unreachable_judge" in err and "reward.max_failed_batches=2" in err
    assert [r["step"] for r in read_metrics(out)] == [1]
    assert (out / "checkpoints/step_000001").is_dir()


# ------------------------------------------------------------------------------------------ 11-12. data files
@pytest.mark.parametrize("content", ["", "\n  \n\n", '{"problem": "What is 1+1?", "answer": "  "}\n'
                                                     '{"problem": "What is 2+2?", "answer": null}\n'],
                         ids=["empty", "blank-lines", "blank-answers"])
def test_a_data_file_without_a_usable_problem_says_so(model_dir, tmp_path, capsys, content):
    """Issue 31.11: these were reported as 'every training problem is too long for the model'."""
    data = tmp_path / "problems.jsonl"
    data.write_text(content)
    assert main(["train", *_overrides(model_dir, tmp_path / "run"), "--data", str(data)]) == 2
    err = _console(capsys)
    assert f"{data} holds no usable problem" in err and "too long" not in err


def test_a_missing_field_is_named_with_the_option_of_the_command_that_read_it(model_dir, tmp_path, capsys):
    """Issue 31.12: the hint named --answer-field, which `literl train` rejects; train takes data.answer_field."""
    data = tmp_path / "problems.jsonl"
    data.write_text('{"question": "What is 1+1?", "final": "2"}\n')
    assert main(["train", *_overrides(model_dir, tmp_path / "run"), "--data", str(data)]) == 2
    err = _console(capsys)
    assert "data.problem_field=<one of them>" in err and "--problem-field" not in err
    assert main(["train", *_overrides(model_dir, tmp_path / "run"), "--data", str(data),
                 "data.problem_field=question"]) == 2
    err = _console(capsys)
    assert "data.answer_field=<one of them>" in err and "--answer-field" not in err
    assert main(["eval", "--model", str(model_dir), "--benchmarks", str(data), "--limit", "1"]) == 2
    err = _console(capsys)
    assert "--problem-field" in err and "data.problem_field" not in err


# ------------------------------------------------------------------------------------------ 14. paths and encodings
def test_paths_with_any_character_and_files_with_a_byte_order_mark_are_read(tmp_path, capsys):
    """Issue 31.14: a --data / --model path with an emoji was refused as 'not valid YAML' (json.dumps escaped it
    into a surrogate pair); a --config file saved with a UTF-8 BOM was refused instead of read."""
    folder = tmp_path / "données 🧮"
    folder.mkdir()
    data, model = folder / "train.jsonl", folder / "model"
    assert main(["train", "--data", str(data), "--model", str(model), "--print-config"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["data"]["train"] == str(data) and printed["model"]["path"] == str(model)
    config = tmp_path / "bom.yaml"
    config.write_bytes(b"\xef\xbb\xbf" + "trainer:\n  steps: 7\n".encode())
    assert main(["train", "--config", str(config), "--print-config"]) == 0
    assert "steps: 7" in capsys.readouterr().out


# ------------------------------------------------------------------------------------------ 16. LoRA rank
def test_a_lora_rank_beyond_every_adapted_layer_is_refused_before_the_adapters_are_made(model_dir, tmp_path,
                                                                                        capsys):
    """Issue 31.16: model.lora.rank=10000 on a model whose layers are at most 32 wide was accepted and built
    adapters 1,200× the model's size. An adapter of rank r ≥ min(in, out) can already express any update of its
    layer, so a rank above every adapted layer's min(in, out) is refused, naming that bound."""
    assert main(["train", *_overrides(model_dir, tmp_path / "run", "model.lora.rank=10000")]) == 2
    err = _console(capsys)
    assert "model.lora.rank=10000" in err and "32" in err
    assert not (tmp_path / "run").exists()


def test_a_lora_rank_beyond_some_adapted_layers_is_a_warning():
    from literl.model.lora import LoraRankWarning, apply_lora

    spec = load_config(overrides=["model.lora.rank=24"]).model.lora
    with pytest.warns(LoraRankWarning, match=r"k_proj.*16"):
        apply_lora(build_tiny_qwen3(), spec)
