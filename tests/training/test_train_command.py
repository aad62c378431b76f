"""`literl train` as a user types it: resuming a run, retrying a start that failed, bad settings."""

from __future__ import annotations

from literl.cli import main
from literl.config.load import from_yaml_file
from literl.run.metrics_log import read_metrics
from tests.training.test_trainer import TINY


def _train(*argv: str) -> int:
    return main(["train", *argv])


def test_resume_continues_the_run_as_it_was_configured(tiny_qwen3_dir, tmp_path, capsys):
    """The run started from the dapo preset; the resume command names only the directory and the new length, so
    the default preset (lite_ppo) must not replace dapo's algorithm halfway through the run."""
    out = tmp_path / "run"
    first = [f"model.path={tiny_qwen3_dir}", f"trainer.output_dir={out}", *TINY, "trainer.steps=1",
             "trainer.save_every=1", "eval.before=false", "algorithm.kl_coef=0.0"]
    assert _train("--preset", "dapo", *first) == 0
    started = from_yaml_file(out / "config.yaml")
    assert _train(f"trainer.output_dir={out}", "trainer.resume=true", "trainer.steps=2") == 0
    resumed = from_yaml_file(out / "config.yaml")
    assert resumed.preset == "dapo" and resumed.algorithm == started.algorithm
    assert resumed.model == started.model and resumed.rollout == started.rollout
    assert resumed.trainer.steps == 2 and [r["step"] for r in read_metrics(out)] == [1, 2]
    assert "resuming with a config that differs" not in capsys.readouterr().out


def test_a_start_that_failed_while_loading_can_be_retried(tiny_qwen3_dir, tmp_path, capsys):
    out = tmp_path / "run"
    argv = [f"model.path={tiny_qwen3_dir}", f"trainer.output_dir={out}", *TINY, "trainer.steps=1"]
    assert _train(*argv, f"data.train={tmp_path / 'nosuch.jsonl'}") == 2
    assert "nosuch.jsonl" in capsys.readouterr().err
    assert _train(*argv) == 0
    assert [r["step"] for r in read_metrics(out)] == [1]


def test_cuda_without_a_gpu_is_a_config_error(tiny_qwen3_dir, tmp_path, capsys):
    import torch

    if torch.cuda.is_available():
        return
    assert _train(f"model.path={tiny_qwen3_dir}", f"trainer.output_dir={tmp_path / 'r'}", *TINY,
                  "trainer.device=cuda") == 2
    assert "trainer.device=cpu" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
