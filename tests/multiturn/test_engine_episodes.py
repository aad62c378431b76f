"""Multi-turn episodes sampled by literl's own engine on the testbed model: the trajectory's sampled tokens carry
exactly the log-probs the policy gives them in the full context (token-in, token-out: no drift), and the
context between turns is the framed observation, masked."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from literl.multiturn import ChatFormat, EpisodeCaps, StepResult, run_episodes
from literl.multiturn.engine_turns import engine_turns
from literl.rollout.generator import SamplingParams
from literl.rollout.hf_engine import HFEngine
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
    engine = HFEngine(model, eos_token_ids=[tokenizer.eos_token_id], pad_id=tokenizer.pad_token_id)
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
