"""Config loading: presets, dotted overrides, and clear errors for every kind of bad input."""

from __future__ import annotations

import warnings

import pytest

from literl.config.load import (HF_MODEL_LR, TESTBED_LR, explain, from_yaml_file, load_config, preset_names,
                                  preset_summary, resolve, to_yaml)
from literl.config.errors import ConfigError

PRESETS = ["cispo", "dapo", "dr_grpo", "gmpo", "grpo", "gspo", "lite_ppo", "minirl", "reinforce_pp", "sapo"]


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


def test_bad_param_value_fails_before_the_run_starts(tmp_path, capsys):
    """A value no trick can run with is caught by the objective's self-check when the objective is built — the first
    thing a run does, before its model loads (here a path that does not exist, never reached) — and by
    `literl config`, not at step 300."""
    from literl.cli import main
    from literl.algorithm.objective import Objective

    bad = ["algorithm.reward_shaping.soft_overlong.cache_length=100", "rollout.max_new_tokens=64"]
    with pytest.raises((ConfigError, ValueError)):
        Objective.from_config(load_config(preset="dr_grpo", overrides=bad))
    assert main(["config", "--preset", "dr_grpo", *bad]) == 2
    assert main(["train", "--preset", "dr_grpo", *bad, f"model.path={tmp_path / 'no-such-model'}",
                 f"trainer.output_dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert "cache_length" in err and "no-such-model" not in err


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


# ---------------------------------------------------------------------------------------------- resolve
def test_resolve_picks_the_hugging_face_lr_for_a_model_passed_in():
    """literl.train(cfg, model=...) leaves model.path null; the caller says the policy is not the testbed."""
    cfg = load_config()
    assert resolve(cfg).optim.lr == TESTBED_LR
    assert resolve(cfg, external_model=True).optim.lr == HF_MODEL_LR
    assert resolve(load_config(overrides=["model.path=/some/model"])).optim.lr == HF_MODEL_LR
    assert resolve(load_config(overrides=["optim.lr=3e-6"]), external_model=True).optim.lr == 3e-6


# ---------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("text, names", [
    ("- a\n- b\n", ["top level", "list"]),
    ("5\n", ["top level", "int"]),
    ("algorithm:\n  reward_shaping: [rescale]\n", ["algorithm.reward_shaping", "list", "rescale: {low: -1}"]),
    ("algorithm:\n  loss_masks: {overlong: 3}\n", ["algorithm.loss_masks.overlong", "overlong: {}"]),
    ("algorithm:\n  loss_masks: {overlong: }\n", ["algorithm.loss_masks.overlong", "null", "overlong: {}"]),
    ("algorithm: [1]\n", ["algorithm", "list", "policy_loss"]),
    ("trainer: 5\n", ["trainer", "int 5", "steps"]),
    ("reward:\n  fns: {0: {weight: 2}}\n", ["reward.fns", "must be a list", "reward.fns.0.weight=2"]),
])
def test_a_yaml_file_of_the_wrong_shape_names_the_key(tmp_path, text, names):
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(preset="dapo", config_file=path)
    assert all(name in str(err.value) for name in names), str(err.value)


@pytest.mark.parametrize("override, names", [
    ("reward.fns={0: {weight: 2}}", ["reward.fns", "must be a list"]),
    ("trainer.trackers=wandb", ["trainer.trackers", "must be a list"]),
    ("algorithm.policy_loss=cispo", ["algorithm.policy_loss.name="]),
    ("trainer=5", ["trainer", "steps"]),
    ("trainer.steps={", ["trainer.steps={", "YAML"]),
    ("reward.fns.1.weight=2", ["out of range", "reward.fns has indices 0..0"]),
    ("reward.fns.0.wieght=2", ["wieght", "weight"]),
    ("trainer.trackers.0=wandb", ["trainer.trackers is empty"]),
])
def test_an_override_of_the_wrong_shape_names_the_key(override, names):
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[override])
    assert all(name in str(err.value) for name in names), str(err.value)


def test_an_override_sets_one_item_of_a_list():
    cfg = load_config(overrides=["reward.fns.0.weight=2", "optim.betas.1=0.99"])
    assert cfg.reward.fns[0].weight == 2.0 and cfg.reward.fns[0].fn.endswith(":math_accuracy")
    assert cfg.optim.betas == [0.9, 0.99]
    whole = load_config(overrides=["reward.fns=[{fn: 'a.b:c'}, {fn: 'a.b:d', weight: 0.5}]", "reward.fns.1.weight=3"])
    assert [(f.fn, f.weight) for f in whole.reward.fns] == [("a.b:c", 1.0), ("a.b:d", 3.0)]


@pytest.mark.parametrize("override, key", [
    ("optim.betas=[0.9]", "optim.betas"), ("optim.betas=[0.9,1.0]", "optim.betas"),
    ("optim.betas=[-0.1,0.9]", "optim.betas"), ("optim.lr=0", "optim.lr"), ("optim.eps=0", "optim.eps"),
    ("trainer.threads=-1", "trainer.threads"), ("trainer.threads=0", "trainer.threads"),
    ("rollout.temperature=0", "rollout.temperature"), ("rollout.temperature=-1", "rollout.temperature"),
    ("rollout.top_p=0", "rollout.top_p"), ("rollout.top_p=1.5", "rollout.top_p"), ("rollout.top_k=-1", "rollout.top_k"),
    ("eval.temperature=0", "eval.greedy"), ("eval.max_new_tokens=0", "eval.max_new_tokens"),
    ("eval.limit=0", "eval.limit"), ("data.limit=0", "data.limit"), ("data.limit=-5", "data.limit"),
    ("algorithm.kl_coef=-0.1", "algorithm.kl_coef"), ("algorithm.entropy_coef=-0.01", "algorithm.entropy_coef"),
    ("eval.every=-1", "eval.every"), ("trainer.save_every=-1", "trainer.save_every"),
    ("trainer.keep_checkpoints=-1", "trainer.keep_checkpoints"),
])
def test_values_that_would_fail_or_mislead_at_run_time_are_refused(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(overrides=[override])


def test_documented_zero_and_null_meanings_still_load():
    cfg = load_config(overrides=["trainer.keep_checkpoints=0", "trainer.save_every=0", "eval.every=0",
                                 "trainer.threads=null", "data.limit=null", "eval.temperature=null",
                                 "rollout.top_p=1.0", "trainer.threads=1", "eval.temperature=0.6"])
    assert (cfg.trainer.keep_checkpoints, cfg.eval.every, cfg.data.limit) == (0, 0, None)
    assert "0: keep all" in explain()


def test_presets_command_with_an_unknown_name_says_so_without_a_traceback(capsys):
    from literl.cli import main

    assert main(["presets", "dapoo"]) == 2
    err = capsys.readouterr().err
    assert "unknown preset 'dapoo'" in err and "dapo" in err and "Traceback" not in err
    assert main(["presets", "dapo"]) == 0


# ---------------------------------------------------------------------------------------------- trick maps
def test_an_empty_map_clears_a_presets_reward_shaping():
    cfg = load_config(preset="dapo", overrides=["algorithm.reward_shaping={}"])
    assert cfg.algorithm.reward_shaping == {}
    assert load_config(preset="dapo", overrides=["~algorithm.reward_shaping"]).algorithm.reward_shaping == {}


def test_a_map_given_in_an_override_or_file_replaces_the_presets_map_in_its_order(tmp_path):
    cfg = load_config(preset="dapo", overrides=["algorithm.reward_shaping={soft_overlong: {}, rescale: {low: -1}}"])
    assert list(cfg.algorithm.reward_shaping.items()) == [("soft_overlong", {}), ("rescale", {"low": -1})]
    path = tmp_path / "mine.yaml"
    path.write_text("algorithm:\n  reward_shaping:\n    soft_overlong: {factor: 0.5}\n")
    assert load_config(preset="dapo", config_file=path).algorithm.reward_shaping == {"soft_overlong": {"factor": 0.5}}
    path.write_text("algorithm:\n  reward_shaping:\n")
    assert load_config(preset="dapo", config_file=path).algorithm.reward_shaping == {}


def test_one_entry_is_removed_with_null_or_tilde():
    for override in ("algorithm.reward_shaping.soft_overlong=null", "~algorithm.reward_shaping.soft_overlong"):
        cfg = load_config(preset="dapo", overrides=[override])
        assert cfg.algorithm.reward_shaping == {"rescale": {"low": -1.0, "high": 1.0}}, override
    with pytest.raises(ConfigError, match="soft_overlng.*holds: rescale, soft_overlong"):
        load_config(preset="dapo", overrides=["algorithm.reward_shaping.soft_overlng=null"])
    with pytest.raises(ConfigError, match="only algorithm.loss_masks"):
        load_config(overrides=["~trainer.steps"])


def test_a_dotted_override_still_merges_into_one_entry():
    cfg = load_config(preset="dapo", overrides=["algorithm.reward_shaping.soft_overlong.factor=0.5",
                                                "algorithm.loss_masks.overlong={}"])
    assert cfg.algorithm.reward_shaping == {"rescale": {"low": -1.0, "high": 1.0}, "soft_overlong": {"factor": 0.5}}
    assert cfg.algorithm.loss_masks == {"overlong": {}}
    tweak = load_config(preset="dapo", overrides=["algorithm.reward_shaping.rescale={low: 0.0}"])
    assert tweak.algorithm.reward_shaping["rescale"] == {"low": 0.0, "high": 1.0}


def test_trick_map_overrides_apply_in_command_line_order():
    cleared_then_set = load_config(preset="dapo", overrides=["algorithm.reward_shaping={}",
                                                             "algorithm.reward_shaping.rescale.low=-1"])
    assert cleared_then_set.algorithm.reward_shaping == {"rescale": {"low": -1}}
    set_then_cleared = load_config(preset="dapo", overrides=["algorithm.reward_shaping.rescale.low=-1",
                                                             "algorithm.reward_shaping={}"])
    assert set_then_cleared.algorithm.reward_shaping == {}


def test_policy_masks_are_a_map_edited_like_loss_masks_and_a_required_parameter_must_be_given():
    """algorithm.policy_masks.<name>.<param>=v adds an entry, =null removes it; OPSM's δ has no default, so naming
    the mask without it is refused with the parameter's name; presets gmpo and sapo set their papers' losses."""
    cfg = load_config(overrides=["algorithm.policy_masks.opsm.delta=0.5",
                                 "algorithm.policy_masks.high_entropy.top_ratio=0.2"])
    assert cfg.algorithm.policy_masks == {"opsm": {"delta": 0.5}, "high_entropy": {"top_ratio": 0.2}}
    cfg = load_config(overrides=["algorithm.policy_masks.opsm.delta=0.5", "algorithm.policy_masks.opsm=null"])
    assert cfg.algorithm.policy_masks == {}
    with pytest.raises(ConfigError, match="needs delta"):
        load_config(overrides=["algorithm.policy_masks={opsm: {}}"])
    with pytest.raises(ConfigError, match="top_ratio=0 must be > 0"):
        load_config(overrides=["algorithm.policy_masks.high_entropy.top_ratio=0"])
    with pytest.raises(ConfigError, match="unknown policy_mask 'opsn'"):
        load_config(overrides=["algorithm.policy_masks.opsn.delta=0.5"])
    assert "delta=<required>" in explain()
    gmpo, sapo = load_config(preset="gmpo").algorithm, load_config(preset="sapo").algorithm
    assert (gmpo.policy_loss.name, gmpo.policy_loss.params, gmpo.aggregation.name) == (
        "gmpo", {"eps_low": 0.4, "eps_high": 0.4}, "seq_mean_token_mean")
    assert (sapo.policy_loss.name, sapo.policy_loss.params) == ("sapo", {"tau_pos": 1.0, "tau_neg": 1.05})


def test_gmpo_without_its_aggregation_and_kl_cov_on_policy_warn():
    with pytest.warns(UserWarning, match="gmpo puts its per-sequence loss"):
        load_config(overrides=["algorithm.policy_loss.name=gmpo", "algorithm.aggregation.name=token_mean"])
    with pytest.warns(UserWarning, match="kl_cov's"):
        load_config(overrides=["algorithm.policy_loss.name=kl_cov", "trainer.minibatches=1"])


@pytest.mark.parametrize("name", ["clip_cov", "kl_cov"])
def test_covariance_losses_warn_without_token_mean_and_not_with_it(name):
    with pytest.warns(UserWarning, match=f"{name} is defined with token_mean"):
        load_config(overrides=[f"algorithm.policy_loss.name={name}", "trainer.minibatches=2"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_config(overrides=[f"algorithm.policy_loss.name={name}", "algorithm.aggregation.name=token_mean",
                               "trainer.minibatches=2"])


def test_mean_in_band_warns_when_rolls_band_meets_a_rescaled_reward():
    """dapo rescales the reward to ±1 before the filter: ROLL's (0, 1) there drops every group with a wrong
    majority (finding_e_roll's first probe kept 1-4%); the translated (-1, 1) loads silently."""
    with pytest.warns(UserWarning, match=r"set algorithm.group_filter.params.low=-1.0 and high=1.0"):
        load_config(preset="dapo", overrides=["algorithm.group_filter.name=mean_in_band",
                                              "algorithm.group_filter.params={metric: reward}"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_config(preset="dapo", overrides=["algorithm.group_filter.name=mean_in_band",
                                              "algorithm.group_filter.params={low: -1.0, high: 1.0}"])
        load_config(overrides=["algorithm.group_filter.name=mean_in_band", "rollout.max_rounds=3"])
