"""The step-speed benchmark's own logic (not its timings): the FLOP-floor arithmetic, the reward, the TRL
configuration, and that literl's side really updates on every response."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import flop_floor  # noqa: E402
import workload  # noqa: E402
from step_literl import LiterlStepper, digit_fraction  # noqa: E402


def test_flop_params_of_the_benchmark_model():
    """Per layer: q 256·256 + k 128·256 + v 128·256 + o 256·256 + gate, up 2·768·256 + down 256·768 = 786,432;
    4 layers = 3,145,728; the tied head 100·256 = 25,600 once; norm gains and the lookup count nothing."""
    model, _ = workload.build_model()
    assert flop_floor.flop_params(model) == 3_171_328


def test_floor_and_combined_rate_hand_case():
    """N = 10⁶, 10 generated and 5 trained tokens, rates 1 and 2 GFLOP/s:
    2·10⁶·10 / 10⁹ + 6·10⁶·5 / (2·10⁹) = 0.02 + 0.015 = 0.035 s; rate = (2·10⁷ + 3·10⁷) / 0.035 = 1.4286 GFLOP/s."""
    kwargs = dict(rate_generate=1e9, rate_train=2e9)
    assert flop_floor.floor_seconds(10**6, 10, 5, **kwargs) == pytest.approx(0.035)
    assert flop_floor.combined_rate(10**6, 10, 5, **kwargs) == pytest.approx(5e7 / 0.035)
    # Backward only (an update replaying the rollout's forward): 0.02 + 4·10⁶·5 / (2·10⁹) = 0.03 s.
    assert flop_floor.floor_seconds(10**6, 10, 5, **kwargs, train_flops_per_param=4) == pytest.approx(0.03)


def test_matmul_rate_counts_the_flops_of_its_shapes():
    rate = flop_floor.MatmulRate([(8, 4), (4, 8)], decode_rows=3, train_tokens=5)
    generate, train = rate.measure(decode_repeats=2)
    assert rate.n_params == 64 and generate > 0 and train > 0
    assert rate.summary()["samples"] == 1


@pytest.mark.parametrize("response, expected", [("a1b2", 0.5), ("", 0.0), ("12", 1.0), ("x", 0.0)])
def test_digit_fraction(response, expected):
    assert digit_fraction(response, {}) == expected


def test_literl_side_updates_on_every_response():
    """Two prompts × 4 samples on the benchmark model: rewards differ within each group, no response has a zero
    advantage, every generated token is trained, and the step changes the weights."""
    torch.manual_seed(0)
    model, tokenizer = workload.build_model()
    from literl.testbed.tasks import train_problems

    stepper = LiterlStepper(model, tokenizer, train_problems(2, seed=0), threads=1, group_size=4,
                            max_new_tokens=8)
    before = [p.detach().clone() for p in model.parameters()]
    try:
        record = stepper.step()
    finally:
        stepper.close()
    assert record["responses"] == 8
    assert record["zero_reward_std_groups"] == 0 and record["zero_advantage_responses"] == 0
    assert record["trained_tokens"] == record["generated_tokens"] > 0
    assert record["old_logp_s"] == 0.0      # on-policy single update: no recompute pass, as in TRL
    assert record["replayed_update"] == 1.0  # ... and the update replays the rollout's forward
    assert any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))


def test_trl_config_takes_one_optimizer_step_per_rollout_batch(tmp_path):
    """per_device_train_batch_size = P·G with no accumulation: TRL derives one generation of P·G per step."""
    pytest.importorskip("trl")
    from step_trl import trl_settings
    from trl import GRPOConfig

    settings = trl_settings(prompts_per_step=16, group_size=8, max_new_tokens=64, steps=3,
                            gradient_checkpointing=False)
    config = GRPOConfig(output_dir=str(tmp_path), **settings)
    assert config.generation_batch_size == 128 and config.steps_per_generation == 1
    assert config.num_iterations == 1 and config.beta == 0.0 and not config.activation_checkpointing
