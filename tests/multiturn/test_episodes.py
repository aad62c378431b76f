"""The multi-turn driver with a scripted engine: the trajectory is the engine's ids plus framed observations,
the mask marks exactly the sampled ids, non-append-only templates split into samples that match what the
engine saw, and every end reason is reached and recorded."""

from __future__ import annotations

import time

import pytest

from literl.multiturn import ChatFormat, EpisodeCaps, SampledTurn, StepResult, ToolEnvironment, run_episodes
from literl.multiturn.testbed_chat import build_chat_tokenizer
from literl.tools import PythonSandbox, SandboxLimits, ToolRunner, calculator, sandbox_isolation
from tests.multiturn.scripted import ScriptedEngine, logprobs

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>'
Q = "What is 2+3?"


def setup(template="hermes_tools", tools=None):
    runner = ToolRunner(tools or {"calculator": calculator}, timeout_s=10)
    chat = ChatFormat(build_chat_tokenizer(template), "qwen3", ToolEnvironment(runner).tool_schemas)
    return chat, (lambda problem: ToolEnvironment(runner))


def test_a_tool_call_episode_is_the_engines_ids_plus_the_templates_frames_exactly():
    """Turn 1 stops at </tool_call> (73 ids: 'Let me check.' is 13, the call 60: its JSON is 58
    characters, <tool_call> and </tool_call> one id each); the calculator answers '5'; turn 2 is '\\boxed{5}<|im_end|>' (10 ids).
    The context between them is <|im_end|>\\n<|im_start|>user\\n<tool_response>\\n 5 \\n</tool_response>\\n
    <|im_end|>\\n<|im_start|>assistant\\n: 27 ids, of which 1 is the observation. Rendering the final messages
    with the template gives the same ids, plus the template's newline after the last <|im_end|>."""
    chat, env_factory = setup()
    engine = ScriptedEngine(chat, {Q: ["Let me check." + CALL, "\\boxed{5}<|im_end|>"]})
    (trajectory,) = run_episodes(engine, [{"problem": Q}], env_factory, chat)
    assert trajectory.end_reason == "answer" and trajectory.turns == 2 and len(trajectory.samples) == 1
    sample = trajectory.samples[0]
    assert sample.response_mask == [1] * 73 + [0] * 27 + [1] * 10
    assert sample.rollout_logp == logprobs(73) + [0.0] * 27 + logprobs(10)
    context = [t for t, m in zip(sample.response_ids, sample.response_mask) if m == 0]
    assert chat.decode(context) == ("<|im_end|>\n<|im_start|>user\n<tool_response>\n5\n</tool_response>\n"
                                    "<|im_end|>\n<|im_start|>assistant\n")
    assert (trajectory.observation_tokens, trajectory.boundary_tokens) == (1, 26)
    rendered = chat.render(trajectory.messages, add_generation_prompt=False)
    assert chat.encode(rendered) == sample.context_ids + chat.encode("\n")
    assert trajectory.messages[1]["tool_calls"] == [
        {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "2+3"}}}]
    assert engine.contexts[Q][1] == sample.prompt_ids + sample.response_ids[:73 + 27]


def test_a_turn_that_sampled_its_end_of_turn_token_does_not_get_a_second_one():
    """A user-style environment answers a finished turn: the engine sampled <|im_end|>, so the frame starts at the
    newline after it. Context: \\n<|im_start|>user\\n 'Again?' <|im_end|>\\n<|im_start|>assistant\\n."""
    chat = ChatFormat(build_chat_tokenizer(), "qwen3")

    class AskTwice:
        def __init__(self):
            self.turns = 0

        def reset(self, problem):
            return [{"role": "user", "content": problem["problem"]}]

        def step(self, turn):
            self.turns += 1
            if self.turns == 1:
                return StepResult([{"role": "user", "content": "Again?"}])
            return StepResult(done=True, end_reason="answer", reward=1.0)

    engine = ScriptedEngine(chat, {Q: ["5<|im_end|>", "\\boxed{5}<|im_end|>"]})
    (trajectory,) = run_episodes(engine, [{"problem": Q}], lambda p: AskTwice(), chat)
    sample = trajectory.samples[0]
    context = [t for t, m in zip(sample.response_ids, sample.response_mask) if m == 0]
    assert chat.decode(context) == "\n<|im_start|>user\nAgain?<|im_end|>\n<|im_start|>assistant\n"
    assert sample.response_mask[:2] == [1, 1]          # '5' and the sampled <|im_end|>
    assert trajectory.turn_rewards == [None, 1.0]
    assert chat.encode(chat.render(trajectory.messages, add_generation_prompt=False)) == \
        sample.context_ids + chat.encode("\n")


def test_a_template_that_strips_reasoning_splits_the_trajectory_into_samples_that_match_what_the_engine_saw():
    """With hermes_strip_thinking, the history after the tool call renders turn 1 without '<think>add</think>'.
    So turn 2 is sampled from that re-rendered history, which becomes sample 2's prompt; sample 1 keeps turn 1
    with its reasoning. Each sample's prompt is exactly the context the engine got, each response exactly what it
    sampled (all mask 1)."""
    chat, env_factory = setup("hermes_strip_thinking")
    turn1, turn2 = "<think>add</think>Check." + CALL, "<think>got 5</think>\\boxed{5}<|im_end|>"
    engine = ScriptedEngine(chat, {Q: [turn1, turn2]})
    (trajectory,) = run_episodes(engine, [{"problem": Q}], env_factory, chat)
    first, second = trajectory.samples
    assert trajectory.end_reason == "answer" and len(trajectory.samples) == 2
    assert engine.contexts[Q] == [first.prompt_ids, second.prompt_ids]
    assert first.response_ids == chat.encode(turn1) and second.response_ids == chat.encode(turn2)
    assert set(first.response_mask) == set(second.response_mask) == {1}
    assert "<think>add</think>" not in chat.decode(second.prompt_ids)
    assert chat.decode(second.prompt_ids) == chat.render(trajectory.messages[:-1], add_generation_prompt=True)
    assert chat.decode(second.prompt_ids).endswith(
        'Check.' + CALL + "<|im_end|>\n<|im_start|>user\n<tool_response>\n5\n</tool_response>\n<|im_end|>\n"
        "<|im_start|>assistant\n")


def test_the_append_only_template_keeps_reasoning_in_one_sample():
    chat, env_factory = setup("hermes_tools")
    engine = ScriptedEngine(chat, {Q: ["<think>add</think>Check." + CALL, "\\boxed{5}<|im_end|>"]})
    (trajectory,) = run_episodes(engine, [{"problem": Q}], env_factory, chat)
    assert len(trajectory.samples) == 1
    assert chat.decode(trajectory.samples[0].context_ids).count("<think>add</think>") == 1


def test_every_end_reason_is_reached_and_the_other_episodes_go_on():
    """answer: a boxed answer; eos: a plain reply (a void turn); max_turns: a call in each of 2 allowed turns;
    length: a turn cut at its 64-token cap with no stop; tool_failure: the environment raises on one episode."""
    chat, env_factory = setup()

    class Breaks(ToolEnvironment):
        def step(self, turn):
            raise RuntimeError("the sandbox service is down")

    scripts = {"answer 1": ["\\boxed{1}<|im_end|>"], "plain 2": ["I do not know.<|im_end|>"],
               "loop 3": [CALL, CALL, CALL], "long 4": ["x" * 100], "broken 5": [CALL]}
    engine = ScriptedEngine(chat, scripts)
    runner = ToolRunner({"calculator": calculator})
    factory = lambda p: Breaks(runner) if p["problem"] == "broken 5" else env_factory(p)
    caps = EpisodeCaps(max_turns=2, max_turn_tokens=64, max_response_tokens=500)
    trajectories = run_episodes(engine, [{"problem": q} for q in scripts], factory, chat, caps)
    assert [t.end_reason for t in trajectories] == ["answer", "eos", "max_turns", "length", "tool_failure"]
    assert [t.void_turns for t in trajectories] == [0, 1, 0, 0, 0]
    assert trajectories[2].turns == 2 and trajectories[2].tool_calls == 2
    assert trajectories[3].samples[0].response_mask == [1] * 64
    assert trajectories[4].failure == "RuntimeError: the sandbox service is down"


def test_an_observation_that_would_pass_the_response_budget_ends_the_episode_at_length():
    """Turn 1 is 60 ids (the call alone); budget 80: the 27-id continuation would bring it to 87 >= 80."""
    chat, env_factory = setup()
    engine = ScriptedEngine(chat, {Q: [CALL, "\\boxed{5}<|im_end|>"]})
    (trajectory,) = run_episodes(engine, [{"problem": Q}], env_factory, chat,
                                 EpisodeCaps(max_response_tokens=80, max_turn_tokens=64))
    assert trajectory.end_reason == "length" and trajectory.samples[0].response_mask == [1] * 60
    assert trajectory.tool_calls == 1


def test_a_long_observation_is_cut_to_the_cap_and_marked():
    """A 50-character result, cap 40: the marker '\\n...[cut: 35 more tokens]' is 25 ids, so 15 characters are
    kept and 50 - 15 = 35 are cut."""
    def shout(text: str) -> str:
        """Repeat the text.

        Args:
            text: what to repeat
        """
        return "0123456789" * 5

    chat, env_factory = setup(tools={"shout": shout})
    call = '<tool_call>{"name": "shout", "arguments": {"text": "a"}}</tool_call>'
    engine = ScriptedEngine(chat, {Q: [call, "\\boxed{5}<|im_end|>"]})
    (trajectory,) = run_episodes(engine, [{"problem": Q}], env_factory, chat,
                                 EpisodeCaps(max_tool_response_tokens=40))
    assert trajectory.truncated_observations == 1 and trajectory.observation_tokens == 40
    assert trajectory.messages[2]["content"] == "012345678901234\n...[cut: 35 more tokens]"
    assert "012345678901234\n...[cut: 35 more tokens]\n</tool_response>" in chat.decode(trajectory.samples[0].context_ids)


def test_an_engine_that_runs_past_the_stop_is_cut_at_the_stop_with_its_log_probs():
    chat, env_factory = setup()
    engine = ScriptedEngine(chat, {Q: [CALL, "\\boxed{5}<|im_end|>"]}, overrun="garbage")
    (trajectory,) = run_episodes(engine, [{"problem": Q}], env_factory, chat)
    sample = trajectory.samples[0]
    assert sample.response_ids[:60] == chat.encode(CALL) and sample.rollout_logp[:60] == logprobs(60)
    assert "garbage" not in chat.decode(sample.context_ids)


def test_malformed_calls_are_answered_with_an_error_and_the_episode_goes_on():
    chat, env_factory = setup()
    engine = ScriptedEngine(chat, {Q: ['<tool_call>{"name": calculator}</tool_call>', "\\boxed{5}<|im_end|>"]})
    (trajectory,) = run_episodes(engine, [{"problem": Q}], env_factory, chat)
    assert trajectory.end_reason == "answer"
    assert trajectory.counts()["tool_errors"] == 1
    assert trajectory.messages[2]["content"].startswith("Error: the tool call is not valid JSON")
    assert trajectory.messages[1] == {"role": "assistant", "content": '<tool_call>{"name": calculator}</tool_call>'}


def test_environments_of_a_batch_step_concurrently():
    """Four episodes whose tool sleeps 0.4 s: stepped together they take about 0.4 s, not 1.6 s."""
    def nap(seconds: float) -> str:
        """Sleep.

        Args:
            seconds: how long
        """
        time.sleep(seconds)
        return "rested"

    chat, env_factory = setup(tools={"nap": nap})
    call = '<tool_call>{"name": "nap", "arguments": {"seconds": 0.4}}</tool_call>'
    questions = [f"Question {i}?" for i in range(4)]
    engine = ScriptedEngine(chat, {q: [call, "\\boxed{1}<|im_end|>"] for q in questions})
    started = time.monotonic()
    trajectories = run_episodes(engine, [{"problem": q} for q in questions], env_factory, chat)
    assert time.monotonic() - started < 1.3
    assert engine.calls == 2                             # one batched engine call per turn
    assert [t.end_reason for t in trajectories] == ["answer"] * 4


def test_the_engine_contract_is_checked_with_clear_errors():
    chat, env_factory = setup()
    with pytest.raises(ValueError, match="returned 0 turns for 1 contexts"):
        run_episodes(lambda c, m: [], [{"problem": Q}], env_factory, chat)
    with pytest.raises(ValueError, match="has 2 ids but 1 log-probs"):
        run_episodes(lambda c, m: [SampledTurn([5, 6], [0.0])], [{"problem": Q}], env_factory, chat)
    with pytest.raises(ValueError, match=r"rollout.max_turns must be >= 1"):
        EpisodeCaps(max_turns=0)


@pytest.mark.skipif(sandbox_isolation() != "namespaced", reason="needs namespaced isolation: root and `unshare`")
def test_hostile_code_in_an_episode_becomes_observations_and_the_episode_ends_normally():
    sandbox = PythonSandbox(SandboxLimits(wall_s=120, cpu_s=1, memory_mb=256))

    def python(code: str) -> str:
        """Run Python code.

        Args:
            code: the program
        """
        return sandbox.run(code)

    chat, env_factory = setup(tools={"python": python})
    kill = '<tool_call>{"name": "python", "arguments": {"code": "import os\\nos.kill(os.getppid(), 9)"}}</tool_call>'
    spin = '<tool_call>{"name": "python", "arguments": {"code": "while True: pass"}}</tool_call>'
    engine = ScriptedEngine(chat, {Q: [kill, spin, "\\boxed{5}<|im_end|>"]})
    (trajectory,) = run_episodes(engine, [{"problem": Q}], env_factory, chat)
    assert trajectory.end_reason == "answer"
    assert "PermissionError" in trajectory.messages[2]["content"]
    assert "CPU time limit" in trajectory.messages[4]["content"]
    assert [r.status for r in trajectory.tool_results] == ["error", "timeout"]
