"""Trick parameters are checked against ranges declared next to each trick, when the config loads (issue 22).

Before, an inverted rescale (low > high: the run learns to be wrong), negative clip bounds, or an IS window with
low > high loaded without a word; rescale.low=nan was a TypeError traceback; rewards near 1e19 overflowed the
float32 std and zeroed every advantage.
"""

from __future__ import annotations

import pytest
import torch

from literl.config.load import explain, load_config
from literl.algorithm.registry import Registry
from literl.config.errors import ConfigError
from literl.algorithm.tricks import ALL, ADVANTAGES


@pytest.mark.parametrize("preset, override, message", [
    ("lite_ppo", "algorithm.reward_shaping={rescale: {low: 1.0, high: 0.0}}",
     "algorithm.reward_shaping.rescale: low=1.0 must be < high=0.0"),
    ("lite_ppo", "algorithm.reward_shaping.rescale.low=nan", "low must be a number, got str 'nan'"),
    ("lite_ppo", "algorithm.reward_shaping.rescale.low=.nan", "rescale.low=nan is not a finite number"),
    ("lite_ppo", "algorithm.policy_loss.params.eps_low=-0.1", "eps_low=-0.1 must be >= 0"),
    ("lite_ppo", "algorithm.policy_loss.params.eps_high=-0.2", "eps_high=-0.2 must be >= 0"),
    ("lite_ppo", "algorithm.policy_loss.params.dual_clip=0.5", "dual_clip=0.5 must be > 1"),
    ("grpo", "algorithm.is_correction={name: token_mis, params: {low: 3.0}}", "low=3.0 must be < high=2.0"),
    ("grpo", "algorithm.is_correction={name: token_tis, params: {cap: -1}}", "cap=-1 must be > 0"),
    ("grpo", "algorithm.advantage.params.eps=-1e-6", "eps=-1e-06 must be >= 0"),
    ("lite_ppo", "optim.lr=inf", "optim.lr=inf is not a finite number"),
    ("dapo", "rollout.max_new_tokens=1",
     "soft_overlong: max_new_tokens=1 (unset, so taken from rollout.max_new_tokens) must be >= 2"),
])
def test_out_of_range_settings_are_refused_when_the_config_loads(preset, override, message):
    with pytest.raises(ConfigError) as caught:
        load_config(preset=preset, overrides=[override])
    assert message in str(caught.value)


def test_every_declared_range_names_real_parameters_and_holds_for_the_defaults():
    for axis, registry in ALL.items():
        for name in registry.names():
            required = {k: 0.1 for k in registry.required_of(name)}      # a value for what has no default
            registry.check(name, required, context={"max_new_tokens": 64})    # the paper defaults are in range
            assert set(registry.ranges_of(name)) <= set(registry.params_of(name)), (axis, name)


def test_a_range_is_declared_at_registration_and_shown_by_explain():
    reg = Registry("demo")

    @reg.register(ranges={"low": ">= 0 and < high"})
    def window(x, *, low=0.5, high=2.0):
        """A demo trick."""
        return x

    assert reg.ranges_of("window") == {"low": ">= 0 and < high"}
    with pytest.raises(ConfigError, match="low=2.5 must be < high=2.0"):
        reg.check("window", {"low": 2.5})
    reg.check("window", {"low": 2.5, "high": 3.0})
    with pytest.raises(ValueError, match="not a keyword parameter"):
        reg.register(ranges={"lo": "> 0"})(lambda x, *, low=0: x)
    assert "valid: low < high" in explain() and "valid: eps_low >= 0 and <= 1" in explain()


def test_group_advantages_of_rewards_near_1e19_are_not_zeroed():
    """Group [0, 4e19, 0, 4e19]: mean 2e19, centred ±2e19, unbiased std = sqrt(4·(2e19)²/3) = 2e19·2/√3, so
    A = ±√3/2 = ±0.8660. In float32, (2e19)² = 4e38 overflows to inf and every A was 0."""
    rewards_B = torch.tensor([0.0, 4e19, 0.0, 4e19])
    group_B, mask_BT, zeros_BT = torch.zeros(4, dtype=torch.long), torch.ones(4, 2, dtype=torch.bool), torch.zeros(4, 2)
    for name in ("grpo", "lite_ppo", "batch_norm"):
        adv_BT = ADVANTAGES.get(name)(rewards_B, group_B, mask_BT, zeros_BT)
        assert adv_BT.dtype == torch.float32
        assert torch.allclose(adv_BT[:, 0], torch.tensor([-1.0, 1.0, -1.0, 1.0]) * 3 ** 0.5 / 2, atol=1e-5), name
