"""The registry's contract covers how a trick goes with the rest of the config: declared at registration
(`compatibility=[Expects(...), UnderSettings(...), WithTrick(...)]`, `identity=True`), the names in a declaration
are checked when the axes are linked or when a later trick registers, and `compatibility_problems` evaluates the
chosen tricks' declarations with their default parameters filled in. Fresh registries, so the built-in ones stay
as they are."""

from __future__ import annotations

import pytest

from literl.algorithm.registry import (Expects, Registry, UnderSettings, WithTrick, compatibility_problems,
                                       link_axes)
from literl.config.errors import ConfigError


def _axes():
    aggregation, loss = Registry("aggregation"), Registry("policy_loss")

    @aggregation.register
    def token_mean(mask_BT, group_B):
        return mask_BT

    @aggregation.register
    def seq_mean(mask_BT, group_B):
        return mask_BT

    axes = {"aggregation": aggregation, "policy_loss": loss}
    link_axes(axes)
    return axes


def test_a_declaration_naming_an_unknown_axis_or_trick_fails_when_the_trick_registers():
    axes = _axes()
    loss = axes["policy_loss"]
    with pytest.raises(ValueError, match=r"policy_loss\.sequence_loss: a compatibility declaration \(Expects\) names "
                                         r"the axis 'aggregations', which does not exist \(axes: aggregation, "
                                         r"policy_loss\)"):
        loss.register(compatibility=[Expects("aggregations", ("token_mean",), "")])(_sequence_loss())
    with pytest.raises(ValueError, match=r"names aggregation 'tokn_mean', which is not registered \(registered: "
                                         r"seq_mean, token_mean\)"):
        loss.register(compatibility=[Expects("aggregation", ("tokn_mean",), "")])(_sequence_loss())
    with pytest.raises(ValueError, match=r"names aggregation 'rescale', which is not registered"):
        loss.register(compatibility=[WithTrick("aggregation", "rescale", lambda own, other: None)])(_sequence_loss())
    with pytest.raises(ValueError, match="declare each rule as Expects, UnderSettings or WithTrick"):
        loss.register(compatibility=["aggregation=token_mean"])(_sequence_loss())
    assert "sequence_loss" not in loss      # a refused registration leaves nothing half-registered
    loss.register(compatibility=[Expects("aggregation", ("token_mean",), "")])(_sequence_loss())
    assert "sequence_loss" in loss


def test_declarations_made_before_the_axes_are_linked_are_checked_by_the_link():
    """The built-in tricks register before every axis exists: `link_axes` (end of literl.algorithm.tricks) checks
    them all at import."""
    aggregation, loss = Registry("aggregation"), Registry("policy_loss")
    loss.register(compatibility=[Expects("aggregation", ("token_mean",), "")])(_sequence_loss())
    with pytest.raises(ValueError, match="names aggregation 'token_mean', which is not registered"):
        link_axes({"aggregation": aggregation, "policy_loss": loss})


def test_every_built_in_declaration_names_registered_tricks_and_config_keys():
    from literl.algorithm.tricks import ALL
    from literl.config.schema import KNOB_KEYS

    link_axes(ALL)       # raises if a declaration names an axis or trick that does not exist
    declared = [(axis, name, d) for axis, registry in ALL.items() for name in registry.names()
                for d in registry.compatibility_of(name)]
    assert {(axis, name) for axis, name, _ in declared} >= {
        ("policy_loss", "gspo"), ("policy_loss", "gspo_token"), ("policy_loss", "gmpo"), ("policy_loss", "clip_cov"),
        ("policy_loss", "kl_cov"), ("policy_loss", "minirl"), ("group_filter", "mean_in_band")}
    settings = {key for _, _, d in declared if isinstance(d, UnderSettings) for key in d.settings}
    assert settings and settings <= KNOB_KEYS
    assert ALL["is_correction"].is_identity("none") and ALL["group_filter"].is_identity("keep_all")
    assert not ALL["is_correction"].is_identity("token_tis") and not ALL["group_filter"].is_identity("mean_in_band")


def test_a_declared_setting_that_is_not_a_config_key_is_refused_naming_the_trick():
    from literl.config.rules import _check_declared_settings_exist

    loss = Registry("policy_loss")
    loss.register(compatibility=[UnderSettings({"trainer.minibatchez": 1}, "")])(_sequence_loss())
    with pytest.raises(ConfigError, match=r"policy_loss 'sequence_loss' declares a rule on trainer\.minibatchez, "
                                          r"which is not a config key"):
        _check_declared_settings_exist({"policy_loss": loss})


def test_the_problems_of_the_chosen_tricks_with_their_defaults_filled_in():
    """sequence_loss expects seq_mean (a warning) and warns under trainer.minibatches=1 with trainer.epochs=1;
    capped_loss refuses token_mean (an error) and checks its cap=2.0 (default) against the aggregation's
    scale=3.0 (default): 2.0 < 3.0 is reported, as the check says."""
    axes = _axes()
    loss, aggregation = axes["policy_loss"], axes["aggregation"]

    @aggregation.register
    def scaled(mask_BT, group_B, *, scale=3.0):
        return mask_BT

    loss.register(compatibility=[
        Expects("aggregation", ("seq_mean",), "{name} is defined with seq_mean; {other} is not it"),
        UnderSettings({"trainer.minibatches": 1, "trainer.epochs": 1}, "{name} is on-policy here")])(_sequence_loss())

    def capped_loss(logp_BT, *, cap=2.0):
        return logp_BT

    def cap_below_scale(own, other):
        return f"cap={own['cap']} < scale={other['scale']}" if own["cap"] < other["scale"] else None

    loss.register(compatibility=[Expects("aggregation", ("seq_mean", "scaled"), "not with {other}", error=True),
                                 WithTrick("aggregation", "scaled", cap_below_scale)])(capped_loss)
    settings = {"trainer.minibatches": 1, "trainer.epochs": 1}
    read = []

    def setting(key):
        read.append(key)
        return settings[key]

    assert compatibility_problems(axes, {"policy_loss": {"sequence_loss": {}}, "aggregation": {"token_mean": {}}},
                                  setting) == [(False, "sequence_loss is defined with seq_mean; token_mean is not it"),
                                               (False, "sequence_loss is on-policy here")]
    assert read == ["trainer.minibatches", "trainer.epochs"]
    settings["trainer.epochs"] = 2      # one setting off: no problem
    assert compatibility_problems(axes, {"policy_loss": {"sequence_loss": {}}, "aggregation": {"seq_mean": {}}},
                                  setting) == []
    assert compatibility_problems(axes, {"policy_loss": {"capped_loss": None}, "aggregation": {"token_mean": {}}},
                                  setting) == [(True, "not with token_mean")]
    assert compatibility_problems(axes, {"policy_loss": {"capped_loss": {}}, "aggregation": {"scaled": {}}},
                                  setting) == [(False, "cap=2.0 < scale=3.0")]
    assert compatibility_problems(axes, {"policy_loss": {"capped_loss": {"cap": 4.0}}, "aggregation": {"scaled": {}}},
                                  setting) == []


def _sequence_loss():
    """A fresh function named sequence_loss each call (a registry refuses a name twice)."""

    def sequence_loss(logp_BT, *, eps=0.1):
        return logp_BT

    return sequence_loss
