"""`literl train rollout.engine=vllm` on a real engine: the loop runs unchanged, every step's rollout log-probs
come from vLLM and, in float32, agree with the trainer's after each weight sync; the slow test checks that a
policy learns through the bfloat16 engine and that its mismatch is measured."""

from __future__ import annotations

import json

import pytest

from literl.cli import main
from literl.run.metrics_log import read_metrics
from tests.vllm_engine.conftest import vllm_tiny_qwen3

TI_KEYS = ("ti/kl_k1", "ti/kl_k3", "ti/abs_logdiff_max", "ti/ratio_min", "ti/ratio_max", "ti/ess", "st/kl_k3",
           "share/ti")


@pytest.fixture
def head32_model_dir(tmp_path, char_tokenizer):
    path = tmp_path / "tiny-qwen3-h32"
    vllm_tiny_qwen3().save_pretrained(path)
    char_tokenizer.save_pretrained(path)
    return path


def test_five_steps_with_the_vllm_engine_log_the_mismatch_decomposition(vllm_python, head32_model_dir, tmp_path):
    """A length reward (it differs within groups) and lr 1e-2 move the policy every step; had a sync failed, the
    engine would sample from stale weights and the training–inference gap would grow far past float32 rounding
    (1e-4). Evaluation runs through the engine too."""
    out = tmp_path / "run"
    # A testbed-sized model on testbed problems: the testbed profile (its sampling, its held-out evaluation).
    code = main(["train", f"model.path={head32_model_dir}", "model.profile=testbed", f"trainer.output_dir={out}",
                 "trainer.steps=5",
                 "rollout.prompts_per_step=4", "rollout.group_size=4", "rollout.max_new_tokens=12",
                 "data.size=64", "optim.lr=1e-2", "eval.before=false", "eval.limit=4", "eval.samples=2",
                 "trainer.progress=false", "reward.fns.0.fn=tests.rewards.sample_reward_fns:length_bonus",
                 "rollout.engine=vllm", "rollout.vllm.kv_cache_gib=0.25",
                 f"rollout.vllm.python={vllm_python}"])
    assert code == 0
    rows = read_metrics(out)
    assert [row["step"] for row in rows] == [1, 2, 3, 4, 5]
    for row in rows:
        assert all(key in row for key in TI_KEYS)
        assert row["ti/abs_logdiff_max"] < 1e-4
        assert row["sync/bytes"] == 4.0 * 80_576 and row["time/sync"] > 0
        assert row["optim/grad_norm"] > 0 and row["optim/skipped_step"] == 0     # the policy moved
    summary = json.loads((out / "summary.json").read_text())
    assert "testbed/accuracy" in summary["eval"]["after"]
    engine = json.loads((out / "run.json").read_text())["sessions"][0]["engine"]     # its own environment's
    assert engine["name"] == "vllm" and engine["vllm_version"].startswith("0.32") and engine["torch_version"]


@pytest.mark.slow
def test_reward_rises_with_the_bfloat16_vllm_engine(vllm_python, head32_model_dir, tmp_path):
    """20 lite_ppo steps sampling with the bf16 engine, training in float32, on a reward the random policy can
    learn fast (response length, up to 100 characters): the mean reward of the last 5 steps beats the first 5 by
    a clear margin, and the engine's bf16 numerics show as a nonzero training–inference gap every step."""
    out = tmp_path / "run"
    code = main(["train", f"model.path={head32_model_dir}", "model.profile=testbed", f"trainer.output_dir={out}",
                 "trainer.steps=20",
                 "rollout.prompts_per_step=8", "rollout.group_size=8", "rollout.max_new_tokens=48", "data.size=256",
                 "optim.lr=3e-3", "eval.before=false", "eval.every=0", "eval.limit=8", "eval.samples=1",
                 "trainer.progress=false", "reward.fns.0.fn=tests.rewards.sample_reward_fns:length_bonus",
                 "rollout.engine=vllm", "rollout.dtype=bfloat16", f"rollout.vllm.python={vllm_python}"])
    assert code == 0
    rows = read_metrics(out)
    first = sum(row["reward/mean"] for row in rows[:5]) / 5
    last = sum(row["reward/mean"] for row in rows[-5:]) / 5
    assert last > first + 0.05, (first, last)
    assert min(row["ti/abs_logdiff_max"] for row in rows) > 1e-4
