"""Multi-turn episodes sampled by literl's own engine on the testbed model: the trajectory's sampled tokens carry
exactly the log-probs the policy gives them in the full context (token-in, token-out: no drift), and the
context between turns is the framed observation, masked."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from literl.multiturn import ChatFormat, EpisodeCaps, StepResult, run_episodes
from literl.multiturn.engine_turns import engine_turns
from literl.rollout.engine import SamplingParams
from literl.rollout.native_engine import NativeEngine
from literl.testbed.cache import prebuilt_folder
from literl.testbed.recipes import recipe_for

OBSERVATION = "checked"


class CheckOnce:
    """After the first turn, shows an observation; the second turn ends the episode."""

    def __init__(self):
        self.turns = 0

    def reset(self, problem):
        return [{"role": "user", "content": problem["problem"]}]

    def step(self, turn):
        self.turns += 1
        if self.turns == 1:
            return StepResult([{"role": "tool", "content": OBSERVATION}])
        return StepResult(done=True, end_reason="answer" if "\\boxed{" in turn.text else "eos")


def policy_logp(model, ids, temperature):
    """log π(token_t | tokens_<t) at every position t >= 1 of one sequence, from one full forward."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].float() / temperature
    return torch.log_softmax(logits[:-1], -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]


def test_testbed_episodes_through_literls_engine_carry_the_policys_own_log_probs():
    folder = prebuilt_folder(recipe_for("base"))
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    chat = ChatFormat(tokenizer, "raw")
    engine = NativeEngine(model, eos_token_ids=[tokenizer.eos_token_id], pad_id=tokenizer.pad_token_id)
    generate = engine_turns(engine, SamplingParams(temperature=1.0), rng=torch.Generator().manual_seed(0))
    problems = [{"problem": "What is 3+4?\n"}, {"problem": "What is 2*5-3?\n"}, {"problem": "What is 7+8*2?\n"}]
    caps = EpisodeCaps(max_turns=3, max_turn_tokens=48, max_response_tokens=160)
    trajectories = run_episodes(generate, problems, lambda p: CheckOnce(), chat, caps)

    frame = "\n<tool_response>\n" + OBSERVATION + "\n</tool_response>\n"
    two_turns = 0
    for trajectory in trajectories:
        assert trajectory.end_reason in ("answer", "eos", "length")
        (sample,) = trajectory.samples                      # the raw family is append-only
        mask = torch.tensor(sample.response_mask, dtype=torch.bool)
        context = [t for t, m in zip(sample.response_ids, sample.response_mask) if m == 0]
        if trajectory.turns == 2:
            two_turns += 1
            assert chat.decode(context) == frame
            assert sample.response_ids[mask.tolist().index(False) - 1] == tokenizer.eos_token_id
        logp = policy_logp(model, sample.context_ids, 1.0)[len(sample.prompt_ids) - 1:]
        rollout = torch.tensor(sample.rollout_logp)
        torch.testing.assert_close(rollout[mask], logp[mask], atol=2e-4, rtol=0)
        assert (rollout[~mask] == 0).all()
    # the warmed-up testbed model ends a solution with EOS well within 48 tokens, so episodes reach turn 2
    assert two_turns >= 2


class AskAgain:
    """A simulated user: every turn gets the reply 'Again?' until the turn cap ends the episode."""

    def reset(self, problem):
        return [{"role": "user", "content": problem["problem"]}]

    def step(self, turn):
        return StepResult([{"role": "user", "content": "Again?"}])


def test_chat_template_episodes_through_literls_engine_frame_turns_and_keep_the_policys_log_probs():
    """A tiny random Qwen3 over the chat tokenizer, its head biased (+4) towards <|im_end|> and </tool_call> so
    that turns end within a few tokens; decode route "dynamic" (the model's own forward, so the bias applies).
    Turns that sampled <|im_end|> are followed by '\\n<|im_start|>user...', those that stopped at </tool_call> by
    an inserted '<|im_end|>' first; every sampled token's log-prob is the policy's in the full context."""
    from literl.multiturn.testbed_chat import build_chat_tokenizer
    from tests.conftest import build_tiny_qwen3

    tokenizer = build_chat_tokenizer("hermes_tools")
    model = build_tiny_qwen3(seed=3, vocab_size=len(tokenizer), tie_word_embeddings=False).eval()
    bias = torch.zeros(len(tokenizer))
    bias[[101, 103]] = 4.0
    model.lm_head.bias = torch.nn.Parameter(bias)
    chat = ChatFormat(tokenizer, "qwen3")
    engine = NativeEngine(model, eos_token_ids=chat.stop_token_ids, pad_id=tokenizer.pad_token_id, decode="dynamic")
    generate = engine_turns(engine, SamplingParams(temperature=1.0), rng=torch.Generator().manual_seed(1))
    problems = [{"problem": f"Question {i}"} for i in range(6)]
    trajectories = run_episodes(generate, problems, lambda p: AskAgain(), chat,
                                EpisodeCaps(max_turns=3, max_turn_tokens=24, max_response_tokens=200))
    frame_after = {101: "\n<|im_start|>user\nAgain?<|im_end|>\n<|im_start|>assistant\n",
                   103: "<|im_end|>\n<|im_start|>user\nAgain?<|im_end|>\n<|im_start|>assistant\n"}
    seen_endings = set()
    for trajectory in trajectories:
        (sample,) = trajectory.samples
        mask = sample.response_mask
        for start in range(1, len(mask)):
            if mask[start - 1] == 1 and mask[start] == 0:          # a boundary: the turn before it ended at a stop
                end = start + mask[start:].index(1) if 1 in mask[start:] else len(mask)
                last_sampled = sample.response_ids[start - 1]
                seen_endings.add(last_sampled)
                assert chat.decode(sample.response_ids[start:end]) == frame_after[last_sampled]
        logp = policy_logp(model, sample.context_ids, 1.0)[len(sample.prompt_ids) - 1:]
        m = torch.tensor(mask, dtype=torch.bool)
        torch.testing.assert_close(torch.tensor(sample.rollout_logp)[m], logp[m], atol=2e-4, rtol=0)
    assert seen_endings == {101, 103}                        # both kinds of turn end were exercised
    assert sum(t.end_reason == "max_turns" for t in trajectories) >= 3


def test_literls_engine_stops_a_row_at_a_stop_token_the_call_names_as_at_an_eos():
    """The tool-happy tiny Qwen3 (</tool_call> ~15% per token): asked with stop_token_ids=(</tool_call>,), every row
    ends at its first <|im_end|> or </tool_call> (kept as its last token, not truncated); asked without, some row
    samples past a </tool_call>. Both on the static decode route and the model's own (dynamic) forward."""
    from literl.multiturn.testbed_chat import build_chat_tokenizer
    from tests.multiturn.test_train_with_tools import IM_END, TOOL_CALL_END, tool_happy_qwen3

    tokenizer = build_chat_tokenizer("hermes_tools")
    model = tool_happy_qwen3(tokenizer).eval()
    prompts = [tokenizer("What is 3+4?")["input_ids"]] * 8
    for route in ("static", "dynamic"):
        engine = NativeEngine(model, eos_token_ids=[IM_END], pad_id=0, decode=route)
        stopped = engine.generate(prompts, SamplingParams(max_new_tokens=24, stop_token_ids=(TOOL_CALL_END,)),
                                  rng=torch.Generator().manual_seed(0))
        for b in range(len(prompts)):
            ids = stopped.response_ids_BT[b][stopped.mask_BT[b]].tolist()
            ends = [i for i, t in enumerate(ids) if t in (IM_END, TOOL_CALL_END)]
            assert ends == ([len(ids) - 1] if not stopped.truncated_B[b] else [])
        assert (~stopped.truncated_B).any()
        free = engine.generate(prompts, SamplingParams(max_new_tokens=24), rng=torch.Generator().manual_seed(0))
        assert any(TOOL_CALL_END in free.response_ids_BT[b][free.mask_BT[b]].tolist()[:-1] for b in range(8)), route
