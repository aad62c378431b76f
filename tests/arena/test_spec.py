"""Ablation specs: parsing, up-front validation with clear errors, and the planned runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from literl.arena.spec import (check_configs, format_value, load_spec, parse_spec, resolve_spec_path,
                               shipped_spec_names)
from literl.config.errors import ConfigError

MINIMAL = {"preset": "lite_ppo", "baseline": "a", "seeds": 2,
           "variants": {"a": {"algorithm.advantage.name": "grpo"}, "b": {"algorithm.advantage.name": "dr_grpo"}}}
SHIPPED = ["advantage_norm", "clip_higher", "loss_aggregation", "overlong_filter", "presets", "entropy_control"]


def spec_with(**changes):
    return parse_spec({**MINIMAL, **changes}, source="test.yaml")


def test_the_five_study_axes_ship_as_specs():
    assert set(SHIPPED) <= set(shipped_spec_names())


NOT_A_PAPER_CLAIM = {"positive_control", "finding_e_sampling", "finding_c_binary"}
"""Shipped specs that test the instrument or attribute another spec's result, not a claim of a paper."""


@pytest.mark.parametrize("name", shipped_spec_names())
def test_shipped_spec_loads_documents_the_paper_and_every_config_validates(name):
    """Every shipped spec (the study axes, the findings, the controls): a spec that names a testbed, preset or key
    that does not exist fails here rather than minutes into an ablation."""
    spec = load_spec(name)
    assert spec.paper_finding and spec.description
    header = [line for line in resolve_spec_path(name).read_text().splitlines() if line.startswith("#")]
    if name not in NOT_A_PAPER_CLAIM:
        assert any("arXiv" in line for line in header), "the header comment must cite the paper"
    steps = check_configs(spec)
    assert set(steps) == {(v, s) for v in spec.variant_names for s in spec.scenario_names}
    assert {k.split("=")[0] for k in spec.base} >= {"trainer.steps", "eval.every", "eval.limit"}


def test_advantage_spec_is_the_issue_grid():
    spec = load_spec("advantage_norm")
    assert len(spec.plan("out")) == 4 * 2 * 3
    overrides = {v.name: v.overrides for v in spec.variants}
    assert overrides["no_std"] == ("algorithm.advantage.name=dr_grpo",)
    assert dict(s.overrides and (s.name, s.overrides) for s in spec.scenarios if s.overrides) == {
        "reward_pm1": ("algorithm.reward_shaping.rescale.low=-1",)}


def test_plan_order_directories_and_command_line():
    """Overrides go base ← scenario ← variant, then the runner's own keys; directories name the run."""
    spec = spec_with(base={"trainer.steps": 3}, scenarios={"hard": {"data.difficulty": "hard"}})
    runs = spec.plan("/tmp/out")
    assert [(r.variant, r.seed) for r in runs] == [("a", 0), ("b", 0), ("a", 1), ("b", 1)]
    run = runs[3]
    assert run.directory == Path("/tmp/out/b/hard/seed_1")
    assert run.command("py", threads=2) == [
        "py", "-m", "literl.cli", "train", "--preset", "lite_ppo", "trainer.steps=3", "data.difficulty=hard",
        "algorithm.advantage.name=dr_grpo", "seed=1", "trainer.output_dir=/tmp/out/b/hard/seed_1",
        "trainer.resume=true", "trainer.threads=2"]


def test_a_variant_may_swap_the_preset_and_the_scenario_defaults_to_one():
    spec = spec_with(variants={"a": {"preset": "grpo"}, "b": {}})
    assert [r.preset for r in spec.plan("o")] == ["grpo", "lite_ppo"] * 2
    assert spec.scenario_names == ["default"]


def test_overrides_may_be_a_list_and_extra_base_overrides_come_last():
    spec = parse_spec({**MINIMAL, "base": ["trainer.steps=5"]}, extra_base=["trainer.steps=2"])
    assert spec.base == ("trainer.steps=5", "trainer.steps=2")


@pytest.mark.parametrize("value, text", [(True, "true"), (None, "null"), (-1, "-1"), (0.28, "0.28"),
                                         ("grpo", "grpo"), ({"overlong": {}}, '{"overlong": {}}'),
                                         ("true", '"true"'), ([1, 2], "[1, 2]")])
def test_format_value_round_trips_through_yaml(value, text):
    assert format_value(value) == text
    assert yaml.safe_load(text) == value


@pytest.mark.parametrize("changes, message", [
    ({"variant": {}}, "unknown key(s) 'variant' (did you mean 'variants'?)"),
    ({"baseline": "c"}, "baseline 'c' is not one of the variants (a, b)"),
    ({"seeds": [1, 1]}, "repeat"),
    ({"seeds": "three"}, "seeds must be a count"),
    ({"variants": {"a/b": {}}}, "becomes a directory name"),
    ({"variants": {"a": {"seed": 3}}}, "sets 'seed', which the runner sets"),
    ({"base": {"trainer.output_dir": "x"}}, "which the runner sets"),
    ({"variants": {"a": "grpo"}}, "must map dotted keys to values"),
    ({"scenarios": {"s": {"preset": "grpo"}}}, "only variants may swap the preset"),
    ({"scenarios": {"s": {"algorithm.advantage.name": "grpo"}}}, "both set algorithm.advantage.name"),
])
def test_bad_specs_fail_with_the_fix(changes, message):
    raw = {**MINIMAL, **changes}
    if "baseline" not in changes and "variants" in changes and "a" not in changes["variants"]:
        raw["baseline"] = next(iter(changes["variants"]))
    with pytest.raises(ConfigError) as err:
        parse_spec(raw, source="test.yaml")
    assert message in str(err.value)


def test_missing_keys_are_named():
    with pytest.raises(ConfigError, match="missing required key.*baseline.*variants"):
        parse_spec({"preset": "grpo", "seeds": 1}, source="t.yaml")


def test_a_variant_that_is_not_a_config_fails_before_anything_runs():
    spec = spec_with(variants={"a": {}, "b": {"algorithm.advantage.name": "grpoo"}},
                     scenarios={"easy": {"data.difficulty": "easy"}})
    with pytest.raises(ConfigError, match=r"variant 'b' × scenario 'easy' does not load as a config: .*grpoo"):
        check_configs(spec)
    with pytest.raises(ConfigError, match="not one of: easy, medium, hard, mixed"):
        check_configs(spec_with(scenarios={"x": {"data.difficulty": "extreme"}}))
    with pytest.raises(ConfigError, match="bad config key"):
        check_configs(spec_with(base={"trainer.stepz": 3}))


def test_unknown_spec_name_suggests_a_shipped_one(tmp_path):
    with pytest.raises(ConfigError, match="Did you mean 'clip_higher'"):
        load_spec("clip_highr")
    bad = tmp_path / "bad.yaml"
    bad.write_text("variants: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_spec(bad)
