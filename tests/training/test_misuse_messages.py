"""Bad input that used to end in a traceback (or in silence) gets a message naming the problem and the fix
(issue 22, item 10)."""

from __future__ import annotations

import errno
import os

import pytest

from literl.cli import main
from tests.training.test_misuse import FAST


def _argv(model_dir, out, *extra):
    return ["train", f"model.path={model_dir}", f"trainer.output_dir={out}", *FAST, *extra]


@pytest.mark.parametrize("preset, setting, message", [
    ("dapo", "rollout.max_new_tokens=1", "taken from rollout.max_new_tokens) must be >= 2"),
    ("lite_ppo", "algorithm.reward_shaping.rescale.low=nan", "rescale: low must be a number"),
    ("lite_ppo", "optim.lr=inf", "optim.lr=inf is not a finite number"),
    ("grpo", "trainer.epochs=0", "trainer.epochs=0 must be >= 1"),
])
def test_settings_that_cannot_work_are_refused_with_the_key(tmp_path, capsys, preset, setting, message):
    """dapo with max_new_tokens=1 was a ValueError traceback advising to 'leave cache_length unset' (it was
    unset); rescale.low=nan a TypeError traceback; optim.lr=inf was accepted and made every weight NaN."""
    assert main(["train", "--preset", preset, setting, f"trainer.output_dir={tmp_path / 'r'}", "--print-config"]) == 2
    err = capsys.readouterr().err
    assert message in err and "leave it unset" not in err


def test_a_missing_reference_model_is_a_message_and_leaves_no_run(tiny_qwen3_dir, tmp_path, capsys):
    out = tmp_path / "run"
    argv = _argv(tiny_qwen3_dir, out, "algorithm.kl_coef=0.1", f"model.reference={tmp_path / 'nosuch'}")
    assert main(argv) == 2
    assert f"model.reference={tmp_path / 'nosuch'} is not a directory" in capsys.readouterr().err
    assert not out.exists()


def test_ctrl_c_before_the_first_step_says_that_nothing_was_saved(tiny_qwen3_dir, tmp_path, capsys, monkeypatch):
    """Ctrl-C while the model loads used to exit 130 without a word."""
    import literl.assembly.builder as components

    def interrupted_while_loading(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(components, "load_policy", interrupted_while_loading)
    assert main(_argv(tiny_qwen3_dir, tmp_path / "run")) == 130
    assert "interrupted before a training step finished, so nothing new was saved" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_a_read_only_output_directory_is_a_message(tiny_qwen3_dir, tmp_path, capsys):
    parent = tmp_path / "read-only"
    parent.mkdir()
    parent.chmod(0o500)
    try:
        assert main(_argv(tiny_qwen3_dir, parent / "run")) == 1
    finally:
        parent.chmod(0o700)
    assert "cannot write" in capsys.readouterr().err


@pytest.mark.parametrize("code, message", [(errno.EROFS, "Choose a writable trainer.output_dir"),
                                           (errno.EACCES, "Choose a writable trainer.output_dir"),
                                           (errno.ENOSPC, "no space left on the device")])
def test_disk_errors_name_the_file_and_the_fix(code, message):
    from literl.commands.train_command import _os_error_message

    text = _os_error_message(OSError(code, os.strerror(code), "/runs/r/metrics.jsonl"))
    assert message in text and "/runs/r/metrics.jsonl" in text
