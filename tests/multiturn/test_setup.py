"""Settings to an episode setup: tools and environments named as strings, every mistake reported up front."""

from __future__ import annotations

import pytest

from literl.multiturn import StepResult, run_episodes
from literl.multiturn.setup import MultiTurnSettings, build_episode_setup, environment_class
from literl.multiturn.testbed_chat import build_chat_tokenizer
from tests.multiturn.scripted import ScriptedEngine


class Echo:
    """An environment without tools: repeats the model's turn once, then ends."""

    def __init__(self):
        self.seen = 0

    def reset(self, problem):
        return [{"role": "user", "content": problem["problem"]}]

    def step(self, turn):
        self.seen += 1
        if self.seen > 1:
            return StepResult(done=True, end_reason="answer")
        return StepResult([{"role": "user", "content": f"You said: {turn.text}"}])


class NoStep:
    def reset(self, problem):
        return []


def test_the_tools_environment_lists_the_tools_in_the_prompt_and_answers_calls():
    setup = build_episode_setup(MultiTurnSettings(tools=["literl.tools:calculator"], model_family="qwen3",
                                                  system_prompt="Use the calculator.", max_turns=3),
                                build_chat_tokenizer())
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "6*7"}}</tool_call>'
    engine = ScriptedEngine(setup.chat, {"What is 6*7?": [call, "\\boxed{42}<|im_end|>"]})
    (trajectory,) = run_episodes(engine, [{"problem": "What is 6*7?"}], setup.env_factory, setup.chat, setup.caps)
    prompt = setup.chat.decode(trajectory.samples[0].prompt_ids)
    assert prompt.startswith("<|im_start|>system\nUse the calculator.\n\nYou can call these tools:\n<tools>\n")
    assert '"name": "calculator"' in prompt
    assert trajectory.messages[3]["content"] == "42" and trajectory.end_reason == "answer"
    assert setup.caps.max_turns == 3
    setup.close()


def test_an_environment_named_by_import_path_is_built_per_episode():
    setup = build_episode_setup(MultiTurnSettings(environment="tests.multiturn.test_setup:Echo",
                                                  model_family="qwen3"), build_chat_tokenizer())
    engine = ScriptedEngine(setup.chat, {"Hi": ["Hello<|im_end|>", "Bye<|im_end|>"], "Yo": ["Hey<|im_end|>",
                                                                                         "Bye<|im_end|>"]})
    trajectories = run_episodes(engine, [{"problem": "Hi"}, {"problem": "Yo"}], setup.env_factory, setup.chat,
                                setup.caps)
    assert [t.messages[2]["content"] for t in trajectories] == ["You said: Hello", "You said: Hey"]
    assert [t.end_reason for t in trajectories] == ["answer", "answer"]


def test_mistakes_in_the_settings_are_reported_with_the_fix():
    tokenizer = build_chat_tokenizer()
    with pytest.raises(ValueError, match=r"'tools' needs at least one tool in rollout.tools"):
        build_episode_setup(MultiTurnSettings(), tokenizer)
    with pytest.raises(ValueError, match=r"neither a registered environment \(tools\) nor an import path"):
        environment_class("sandboxy")
    with pytest.raises(ValueError, match=r"must be a class with reset\(problem\) and step\(turn\).*lacks step"):
        environment_class("tests.multiturn.test_setup:NoStep")
    with pytest.raises(ValueError, match=r"rollout.environment: cannot import module 'nowhere_xyz'"):
        environment_class("nowhere_xyz:Env")
    with pytest.raises(ValueError, match=r"unknown model family 'gpt9'"):
        build_episode_setup(MultiTurnSettings(tools=["literl.tools:calculator"], model_family="gpt9"), tokenizer)
    with pytest.raises(ValueError, match=r"rollout.max_turns must be >= 1"):
        build_episode_setup(MultiTurnSettings(tools=["literl.tools:calculator"], max_turns=0), tokenizer)
