"""The rollout.* multi-turn keys: mistakes are refused with the fix (their shapes when the config loads; tools,
environments, families and templates when the collector is built), and without them the single-turn collector is
built exactly as before."""

from __future__ import annotations

import pytest

from literl.assembly.collection import Prompting, build_collector, multiturn_settings
from literl.config.errors import ConfigError
from literl.config.load import load_config, resolve
from literl.multiturn.collector import MultiTurnCollector
from literl.multiturn.testbed_chat import build_chat_tokenizer
from literl.rollout.collector import Collector
from literl.testbed.tokenizer import build_char_tokenizer

PROBLEMS = [{"problem": "What is 3+4?", "answer": "7"}]


@pytest.mark.parametrize("overrides, message", [
    (["rollout.tools=[calculator]"], "rollout.tools[0]='calculator' is not an import path 'module:name'"),
    (["rollout.tools=[literl.tools:calculator,literl.tools:calculator]"], "names a tool twice"),
    (["rollout.max_turns=0"], "rollout.max_turns=0 must be >= 1"),
    (["rollout.max_tool_response_tokens=0"], "rollout.max_tool_response_tokens=0 must be >= 1, or null"),
    (["rollout.tools=[literl.tools:calculator]", "rollout.engine=vllm"], "set rollout.engine=native"),
    (["rollout.environment=my_env:Env", "rollout.max_staleness=1"], "set rollout.max_staleness=0"),
])
def test_a_bad_multiturn_key_is_refused_when_the_config_loads_with_its_fix(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_config(overrides=overrides)


def _build(cfg, tokenizer):
    cfg = resolve(cfg)      # the profile's sampling settings, as a run has them
    prompting = Prompting.from_config(cfg, tokenizer, testbed_problems=False)
    return build_collector(cfg, problems=PROBLEMS, prompting=prompting, engine=None, objective=None,
                           reward_fns=None, pad_id=0)


def test_without_tools_or_an_environment_the_single_turn_collector_is_built():
    cfg = load_config(overrides=["rollout.max_new_tokens=16"])
    collector = _build(cfg, build_chat_tokenizer())
    assert type(collector) is Collector


def test_with_tools_the_multiturn_collector_is_built_with_the_family_read_off_the_tokenizer():
    """A tokenizer with a chat template gets the hermes family, the testbed's plain one the raw family;
    max_new_tokens 16 is the trajectory's budget and, with max_turn_tokens unset, one turn's cap too."""
    cfg = load_config(overrides=["rollout.max_new_tokens=16", "rollout.tools=[literl.tools:calculator]"])
    collector = _build(cfg, build_chat_tokenizer())
    assert isinstance(collector, MultiTurnCollector) and collector.setup.chat.family.name == "hermes"
    assert (collector.setup.caps.max_response_tokens, collector.setup.caps.max_turn_tokens) == (16, 16)
    assert multiturn_settings(cfg, build_char_tokenizer()).model_family == "raw"


@pytest.mark.parametrize("overrides, tokenizer, message", [
    (["rollout.tools=[literl.tools:no_such_tool]"], "hermes_tools", "no_such_tool"),
    (["rollout.tools=[literl.tools:calculator]", "rollout.model_family=llama9"], "hermes_tools",
     "unknown model family 'llama9'"),
    (["rollout.environment=no_such_env"], "hermes_tools", "neither a registered environment"),
    (["rollout.tools=[literl.tools:calculator]"], "hermes_strip_thinking", "not append-only"),
    (["rollout.tools=[literl.tools:calculator]", "rollout.max_tool_response_tokens=3"], "hermes_tools",
     "leaves no room for the marker"),
])
def test_a_tool_environment_family_or_template_that_cannot_run_is_refused_when_the_collector_is_built(
        overrides, tokenizer, message):
    cfg = load_config(overrides=["rollout.max_new_tokens=16", *overrides])
    with pytest.raises(ConfigError, match=message):
        _build(cfg, build_chat_tokenizer(tokenizer))
