"""Resuming equals not stopping, for runs in bfloat16 and compiled runs on CPU (issue 59: combinations the probe
did not reach). A run of 2 steps against 1 step resumed to 2, on a tiny Qwen3: the resumed run reads back its
float32 masters, AdamW moments and RNG, so its metrics (timing aside) and final weights are the straight run's."""

from __future__ import annotations

import pytest
import torch

from literl.config.load import load_config
from literl.assembly.api import train
from literl.run.metrics_log import read_metrics
from tests.training.test_trainer import _comparable, _overrides, _params, length_reward


def _run(model_dir, out, *extra):
    cfg = load_config(preset="grpo", overrides=_overrides(model_dir, out, "trainer.save_every=1", "eval.limit=2",
                                                          "eval.before=false", *extra))
    return train(cfg, reward_fns=[length_reward])


@pytest.mark.parametrize("setting", [
    "model.dtype=bfloat16",
    # Three runs that each compile the update's layers: ~5 min on one shared CPU thread, so outside the default
    # suite's budget; `python -m pytest -m slow tests/training/test_resume_in_bfloat16_and_compiled.py` (passes).
    pytest.param("trainer.compile=true", marks=pytest.mark.slow)])
def test_a_run_resumed_after_one_step_equals_the_straight_run(tiny_qwen3_dir, tmp_path, setting):
    straight = _run(tiny_qwen3_dir, tmp_path / "a", setting, "trainer.steps=2")
    _run(tiny_qwen3_dir, tmp_path / "b", setting, "trainer.steps=1")
    resumed = _run(tiny_qwen3_dir, tmp_path / "b", setting, "trainer.steps=2", "trainer.resume=true")
    records = read_metrics(resumed)
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["optim/skipped_step"] == 0 and r["optim/grad_norm"] > 0 for r in records), "both steps trained"
    assert _comparable(records) == _comparable(read_metrics(straight))
    a, b = _params(straight), _params(resumed)
    if setting == "model.dtype=bfloat16":
        assert all(t.dtype == torch.bfloat16 for t in a.values()), "final/ is written in the compute dtype"
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
