"""Config loading: presets, dotted overrides, and clear errors for every kind of bad input."""

from __future__ import annotations

import pytest

from literl.config_loader import (explain, from_yaml_file, load_config, preset_names, preset_summary, resolve,
                                  to_yaml)
from literl.registry import ConfigError

PRESETS = ["cispo", "dapo", "dr_grpo", "grpo", "gspo", "lite_ppo", "minirl", "reinforce_pp"]


def test_every_preset_from_the_issue_ships():
    assert set(PRESETS) <= set(preset_names())


@pytest.mark.parametrize("name", PRESETS)
def test_preset_loads_and_has_a_documented_header(name):
    cfg = load_config(preset=name)
    assert cfg.preset == name
    summary = preset_summary(name)
    assert "arXiv" in summary, f"preset {name}'s first line must name its paper"


def test_presets_change_what_their_header_says():
    """Spot checks of deltas against the papers (algorithms.md §1.4, §2.3, §3, §2.7)."""
    lite = load_config(preset="lite_ppo").algorithm
    assert (lite.advantage.name, lite.aggregation.name) == ("lite_ppo", "token_mean")
    dapo = load_config(preset="dapo")
    assert dapo.algorithm.policy_loss.params["eps_high"] == 0.28
    assert dapo.algorithm.group_filter.name == "nonzero_reward_std" and dapo.rollout.max_rounds > 1
    assert load_config(preset="dr_grpo").algorithm.aggregation.name == "seq_mean_token_sum_norm"
    minirl = load_config(preset="minirl").algorithm
    assert (minirl.policy_loss.name, minirl.aggregation.name) == ("minirl", "seq_mean_token_sum")


def test_dotted_overrides_reach_trick_params():
    cfg = load_config(preset="dapo", overrides=["algorithm.policy_loss.name=cispo",
                                                "algorithm.policy_loss.params={ub: 5.0}",
                                                "trainer.steps=7", "seed=3"])
    assert cfg.algorithm.policy_loss.name == "cispo"
    assert cfg.algorithm.policy_loss.params == {"ub": 5.0}
    assert (cfg.trainer.steps, cfg.seed) == (7, 3)


def test_issue_example_override_line_works():
    """The exact line from the issue: switching to CISPO with its absolute cap, from the default params."""
    cfg = load_config(overrides=["algorithm.policy_loss.name=cispo", "algorithm.policy_loss.params.eps_high=5.0"])
    assert cfg.algorithm.policy_loss.params["eps_high"] == 5.0


def test_unknown_key_names_the_key_and_suggests():
    with pytest.raises(ConfigError) as err:
        load_config(overrides=["trainer.stepz=3"])
    assert "trainer.stepz" in str(err.value) and "steps" in str(err.value)


def test_unknown_trick_lists_valid_names():
    with pytest.raises(ConfigError) as err:
        load_config(overrides=["algorithm.policy_loss.name=ppo_clipp"])
    msg = str(err.value)
    assert "ppo_clipp" in msg and "ppo_clip" in msg and "cispo" in msg and "gspo" in msg


def test_bad_trick_param_lists_valid_params():
    with pytest.raises(ConfigError) as err:
        load_config(overrides=["algorithm.policy_loss.params.eps_hihg=0.3"])
    msg = str(err.value)
    assert "eps_hihg" in msg and "eps_high" in msg and "eps_low" in msg


def test_bad_param_in_multi_trick_axis():
    with pytest.raises(ConfigError) as err:
        load_config(overrides=["algorithm.reward_shaping.soft_overlong.factr=0.5"])
    assert "factr" in str(err.value) and "factor" in str(err.value)


def test_bad_value_type_and_bad_choice():
    with pytest.raises(ConfigError):
        load_config(overrides=["trainer.steps=many"])
    with pytest.raises(ConfigError) as err:
        load_config(overrides=["rollout.dtype=float8"])
    assert "bfloat16" in str(err.value)


def test_bad_param_value_fails_at_load_time():
    """A value no trick can run with is caught by the objective's self-check, not at step 300."""
    with pytest.raises((ConfigError, ValueError)):
        load_config(preset="dr_grpo", overrides=["algorithm.reward_shaping.soft_overlong.cache_length=100",
                                                 "rollout.max_new_tokens=64"])


def test_incompatible_combinations_are_refused():
    with pytest.raises(ConfigError, match="minirl"):
        load_config(preset="minirl", overrides=["algorithm.is_correction.name=token_tis"])
    with pytest.raises(ConfigError, match="bypass"):
        load_config(overrides=["algorithm.bypass_mode=true", "algorithm.is_correction.name=token_tis"])
    with pytest.raises(ConfigError, match="minibatches"):
        load_config(overrides=["trainer.minibatches=64", "rollout.prompts_per_step=8"])


def test_missing_config_file_and_bad_yaml(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(config_file=tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("trainer: [unclosed\n")
    with pytest.raises(ConfigError, match="YAML"):
        load_config(config_file=bad)
    with pytest.raises(ConfigError, match="key=value"):
        load_config(overrides=["trainer.steps"])
    with pytest.raises(ConfigError, match="lite_ppo"):
        load_config(preset="lite-ppo")


def test_user_file_layers_over_preset_and_overrides_win(tmp_path):
    user = tmp_path / "mine.yaml"
    user.write_text("trainer:\n  steps: 11\nalgorithm:\n  entropy_coef: 0.01\n")
    cfg = load_config(preset="grpo", config_file=user, overrides=["trainer.steps=12"])
    assert cfg.trainer.steps == 12 and cfg.algorithm.entropy_coef == 0.01


def test_resolved_config_round_trips_through_yaml(tmp_path):
    cfg = resolve(load_config(preset="dapo"))
    assert cfg.optim.lr is not None and cfg.eval.temperature == cfg.rollout.temperature
    path = tmp_path / "config.yaml"
    path.write_text(to_yaml(cfg))
    assert from_yaml_file(path) == cfg


def test_explain_lists_keys_help_and_trick_params():
    text = explain()
    assert "trainer.steps" in text and "rollout.max_rounds" in text
    assert "ppo_clip(" in text and "eps_high" in text and "lite_ppo(" in text


def test_switching_a_trick_by_name_drops_the_previous_tricks_params():
    """dapo sets ppo_clip's eps_high = 0.28; switching to cispo must not hand that value to cispo."""
    cfg = load_config(preset="dapo", overrides=["algorithm.policy_loss.name=cispo"])
    assert cfg.algorithm.policy_loss.params == {}
    same = load_config(preset="dapo", overrides=["algorithm.policy_loss.name=ppo_clip"])
    assert same.algorithm.policy_loss.params["eps_high"] == 0.28
