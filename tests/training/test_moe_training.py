"""Training a mixture-of-experts policy end to end: R2 and R3 under an FP8-like engine, route agreement logged,
the load-balancing loss off unless asked, and a dense model refused for routing replay with the key named."""

from __future__ import annotations

import math

import pytest

from literl.config.load import load_config
from literl.assembly.api import train
from literl.run.metrics_log import read_metrics
from tests.training.test_trainer import length_reward


def _train(model_dir, out, *overrides, preset="minirl"):
    cfg = load_config(preset=preset, overrides=[
        f"model.path={model_dir}", f"trainer.output_dir={out}", "trainer.steps=2", "rollout.prompts_per_step=4",
        "rollout.group_size=4", "rollout.max_new_tokens=16", "eval.every=0", "eval.before=false", "eval.limit=4",
        "eval.samples=1", "eval.greedy=false", "trainer.progress=false", "optim.lr=1e-3", *overrides])
    return read_metrics(train(cfg, reward_fns=[length_reward]))


@pytest.mark.parametrize("preset", ["minirl_r2", "minirl_r3"])
def test_routing_replay_trains_a_moe_policy_under_an_fp8_engine_and_logs_route_agreement(tiny_moe_dir, tmp_path,
                                                                                         preset):
    """Two off-policy mini-batches per step: training–inference agreement below 1 (FP8 weights move routes), the
    staleness agreement of each mini-batch logged, finite losses, weights that move."""
    records = _train(tiny_moe_dir, tmp_path / preset, "rollout.dtype=float8_e4m3", "trainer.minibatches=2",
                     preset=preset)
    for record in records:
        assert 0.0 < record["moe/route_agree_ti"] < 1.0
        assert 0.0 < record["moe/route_agree_st_mb0"] <= 1.0 and 0.0 < record["moe/route_agree_st_mb1"] <= 1.0
        assert math.isfinite(record["loss/total"]) and record["optim/grad_norm"] > 0
        assert "loss/router_aux" not in record            # the load-balancing loss is off by default


def test_the_load_balancing_loss_is_added_when_asked(tiny_moe_dir, tmp_path):
    records = _train(tiny_moe_dir, tmp_path / "aux", "algorithm.router_aux_loss_coef=0.01")
    assert all(record["loss/router_aux"] > 0 for record in records)


def test_routing_replay_on_a_dense_model_names_the_key(tiny_qwen3_dir, tmp_path, capsys):
    from literl.cli import main

    code = main(["train", f"model.path={tiny_qwen3_dir}", f"trainer.output_dir={tmp_path / 'dense'}",
                 "--preset", "minirl_r2", "trainer.steps=1", "trainer.progress=false"])
    assert code == 2 and "algorithm.routing_replay=r2" in capsys.readouterr().err
