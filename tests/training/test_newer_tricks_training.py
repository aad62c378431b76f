"""The tricks of 2025–26 in real training steps on the tiny model: each trains, reports its mechanism metrics, and
Clip-Cov's random selection is seeded from the run (a resumed run selects what the uninterrupted one did)."""

from __future__ import annotations

import math

import pytest
import torch

from literl.config.load import load_config
from literl.assembly.api import train
from literl.run.metrics_log import read_metrics
from tests.training.test_trainer import _comparable, _overrides, _params, length_reward

# A band and a fraction wide enough that the tiny model's steps have candidates to detach.
WIDE_CLIP_COV = ["algorithm.policy_loss.name=clip_cov", "algorithm.policy_loss.params.clip_cov_lb=0.0",
                 "algorithm.policy_loss.params.clip_cov_ub=100.0", "algorithm.policy_loss.params.clip_cov_ratio=0.05"]
TRICKS = {
    "clip_cov": (WIDE_CLIP_COV, "policy_loss/cov_detached_frac"),
    "kl_cov": (["algorithm.policy_loss.name=kl_cov", "algorithm.policy_loss.params.kl_cov_ratio=0.02"],
               "policy_loss/cov_penalised_frac"),
    "opsm": (["algorithm.policy_masks.opsm.delta=0.0"], "policy_mask/opsm/masked_seq_frac"),
    "high_entropy": (["algorithm.policy_masks.high_entropy.top_ratio=0.2"],
                     "policy_mask/high_entropy/kept_token_frac"),
}


@pytest.mark.parametrize("trick", sorted(TRICKS))
def test_each_new_trick_trains_and_logs_what_it_did(tiny_qwen3_dir, tmp_path, trick):
    """Two steps of two mini-batches (the second is off-policy), token_mean: finite loss, a real update, and the
    trick's own metric in metrics.jsonl at a value it can reach (a fraction of tokens or rows in (0, 1])."""
    overrides, key = TRICKS[trick]
    cfg = load_config(preset="grpo", overrides=_overrides(tiny_qwen3_dir, tmp_path / trick, "trainer.minibatches=2",
                                                          "algorithm.aggregation.name=token_mean", *overrides))
    records = read_metrics(train(cfg, reward_fns=[length_reward]))
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert math.isfinite(r["loss/total"]) and r["optim/grad_norm"] > 0 and r["optim/skipped_step"] == 0.0
        assert 0.0 <= r[key] <= 1.0
    assert any(r[key] > 0 for r in records), [r[key] for r in records]
    if trick == "high_entropy":
        for r in records:
            assert r["policy_mask/high_entropy/entropy_kept_mean"] > r["policy_mask/high_entropy/entropy_all_mean"]


def test_clip_cov_resumed_selects_the_tokens_of_the_uninterrupted_run(tiny_qwen3_dir, tmp_path):
    """Four steps straight against two steps, a checkpoint and two more: the same detached fractions, the same
    metrics (timing aside) and bit-identical weights: the selection's seeds come from the run's generator, which
    the checkpoint carries."""
    extra = [*WIDE_CLIP_COV, "algorithm.aggregation.name=token_mean", "trainer.minibatches=2"]
    reward = [length_reward]

    def run(out, *more):
        return train(load_config(preset="grpo", overrides=_overrides(tiny_qwen3_dir, tmp_path / out, *extra, *more)),
                     reward_fns=reward)

    straight = run("a", "trainer.steps=4", "trainer.save_every=2")
    run("b", "trainer.steps=2", "trainer.save_every=2")
    resumed = run("b", "trainer.steps=4", "trainer.save_every=2", "trainer.resume=true")
    a_records, b_records = read_metrics(straight), read_metrics(resumed)
    assert sum(r["policy_loss/cov_detached_frac"] for r in a_records) > 0
    assert _comparable(a_records) == _comparable(b_records)
    a, b = _params(straight), _params(resumed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
