"""The multi-turn collector: trajectories as RolloutBatch rows of the engine's own ids, through the objective and
literl's policy forward.

A scripted engine (fixed turn texts per question, log-probs -0.01·(i+1) − 0.001·row) stands in for sampling, so
each batch is known by hand; the policy forward is a tiny random Qwen3 over the testbed chat tokenizer.
"""

from __future__ import annotations

import dataclasses

import torch

from literl.algorithm.objective import Objective
from literl.config.load import load_config
from literl.model.policy import PolicyForward
from literl.multiturn import ChatFormat, EpisodeCaps, ToolEnvironment
from literl.multiturn.collector import MultiTurnCollector
from literl.multiturn.setup import EpisodeSetup
from literl.multiturn.testbed_chat import build_chat_tokenizer
from literl.rollout.collector import Collector, PromptStream
from literl.rollout.engine import Generation, SamplingParams
from literl.tools import ToolRunner, calculator
from tests.conftest import build_tiny_qwen3

IM_END = 101
MAX_NEW = 40


class ScriptedEngine:
    """`Engine.generate` from scripts: each prompt gets the next turn text of the first question it contains."""

    def __init__(self, chat: ChatFormat, scripts: dict[str, list[str]]):
        self.chat, self.scripts = chat, {q: list(turns) for q, turns in scripts.items()}

    def generate(self, prompts, params, *, rng=None) -> Generation:
        rows = []
        for prompt in prompts:
            question = next(q for q in self.scripts if q in self.chat.decode(prompt))
            rows.append(self.chat.encode(self.scripts[question].pop(0))[:params.max_new_tokens])
        T = max(len(r) for r in rows)
        ids, mask = torch.zeros(len(rows), T, dtype=torch.long), torch.zeros(len(rows), T, dtype=torch.bool)
        logp = torch.zeros(len(rows), T)
        for b, row in enumerate(rows):
            ids[b, :len(row)], mask[b, :len(row)] = torch.tensor(row), True
            logp[b, :len(row)] = -0.01 * torch.arange(1, len(row) + 1) - 0.001 * b
        truncated = torch.tensor([IM_END not in row for row in rows])
        return Generation(ids, mask, logp, truncated)


class BoxedSeven:
    """The reward functions' stand-in: 1 for a response with \\boxed{7}; it records what it was given."""

    def score(self, responses, examples):
        self.seen = (list(responses), list(examples))
        scores = torch.tensor([float("\\boxed{7}" in r) for r in responses])
        return scores, scores >= 0.5, {}


def _setup(chat: ChatFormat, runner: ToolRunner) -> EpisodeSetup:
    return EpisodeSetup(chat, lambda problem: ToolEnvironment(runner), EpisodeCaps(4, MAX_NEW, MAX_NEW, 64), runner)


def _collectors(scripts, problems, *, group_size: int, objective: Objective):
    tokenizer = build_chat_tokenizer("hermes_tools")
    runner = ToolRunner({"calculator": calculator})
    chat = ChatFormat(tokenizer, "qwen3", ToolEnvironment(runner).tool_schemas)
    parts = lambda: dict(engine=ScriptedEngine(chat, scripts), problems=problems,  # noqa: E731
                         decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=True), rewards=BoxedSeven(),
                         objective=objective, sampling=SamplingParams(max_new_tokens=MAX_NEW),
                         prompts_per_step=len(problems), group_size=group_size, max_rounds=1,
                         stream=PromptStream(len(problems), seed=0), pad_id=0)
    prompt = lambda i: chat.prompt_ids(ToolEnvironment(runner).reset(problems[i]))  # noqa: E731
    return Collector(prompt_ids=prompt, **parts()), MultiTurnCollector(setup=_setup(chat, runner), **parts()), tokenizer


def _step_gradient(model, objective: Objective, batch):
    """One on-policy step's loss and parameter gradients through literl's policy forward."""
    model.zero_grad()
    train, _ = objective.prepare(batch)
    forward = PolicyForward(model, temperature=1.0, packed="off")
    logits = forward.logprobs(train, with_entropy=True)
    out = objective.loss(logits.logp_BT, train, logits.entropy_BT)
    out.loss.backward()
    return train, out.loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_trajectories_that_end_at_turn_one_give_the_single_turn_batch_loss_and_gradient_bit_for_bit():
    """Two questions × G=2, every response answers without a tool call (the episode ends at turn 1), one runs to
    the 40-token cap without <|im_end|> (truncated in both paths). The multi-turn collector's batch equals the
    single-turn collector's field by field (its context mask all False), and so do the TrainBatch, the loss and
    every parameter's gradient through the policy forward: torch.equal, no tolerance."""
    scripts = {"What is 3+4?": ["So \\boxed{7}<|im_end|>", "It is 8<|im_end|>"],
               "What is 2+5?": ["\\boxed{7}, done<|im_end|>", "a long answer that never ends, running on and on..."]}
    problems = [{"problem": "What is 3+4?", "answer": "7"}, {"problem": "What is 2+5?", "answer": "7"}]
    objective = Objective.from_config(load_config(overrides=["rollout.max_new_tokens=40", "algorithm.kl_coef=0",
                                                             "algorithm.entropy_coef=0.01"]))
    single, multi, tokenizer = _collectors(scripts, problems, group_size=2, objective=objective)
    rng = torch.Generator().manual_seed(0)
    a, metrics_a = single.collect(rng)
    b, metrics_b = multi.collect(rng)
    for field in dataclasses.fields(a):
        if field.name in ("context_mask_BT", "forward_record", "extras"):
            continue
        x, y = getattr(a, field.name), getattr(b, field.name)
        assert torch.equal(x, y) if torch.is_tensor(x) else x == y, field.name
    assert a.context_mask_BT is None and not b.context_mask_BT.any()
    assert a.truncated_B.tolist() == [False, False, False, True] and a.rewards_B.tolist() == [1.0, 0.0, 1.0, 0.0]
    assert {k: v for k, v in metrics_a.items() if not k.startswith("time/")} == {
        k: v for k, v in metrics_b.items() if not k.startswith(("time/", "multiturn/"))}
    assert metrics_b["multiturn/turns_mean"] == 1.0 and metrics_b["multiturn/end_length"] == 1.0
    assert metrics_b["multiturn/end_answer"] == 2.0 and metrics_b["multiturn/end_eos"] == 1.0

    model = build_tiny_qwen3(seed=1, vocab_size=len(tokenizer), max_position_embeddings=1024)
    train_a, loss_a, grads_a = _step_gradient(model, objective, a)
    train_b, loss_b, grads_b = _step_gradient(model, objective, b)
    for field in ("tokens_BL", "mask_BT", "loss_mask_BT", "adv_BT", "weight_BT", "is_weight_BT", "rollout_logp_BT"):
        assert torch.equal(getattr(train_a, field), getattr(train_b, field)), field
    assert torch.equal(loss_a, loss_b)
    assert grads_a.keys() == grads_b.keys() and all(torch.equal(grads_a[n], grads_b[n]) for n in grads_a)


CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "3+4"}}</tool_call>'


def test_a_calculator_turn_becomes_context_between_the_sampled_turns_of_one_row():
    """One question, G=1: turn 1 calls the calculator (stopping at </tool_call>), turn 2 answers \\boxed{7}. The row's
    response is [turn 1 | <|im_end|>\\n<|im_start|>user\\n<tool_response>\\n 7 \\n</tool_response>\\n<|im_end|>\\n
    <|im_start|>assistant\\n | turn 2]: mask_BT True exactly on the two turns' ids, context_mask_BT on the rest,
    rollout_logp 0 there; tokens_BL is prompt + that response; the reward function saw the whole response text and
    the messages; the metrics count 2 turns, 1 call, no error, and observation tokens 1 of the region's."""
    scripts = {"What is 3+4?": [CALL, "\\boxed{7}<|im_end|>"]}
    problems = [{"problem": "What is 3+4?", "answer": "7"}]
    objective = Objective.from_config(load_config(overrides=["rollout.max_new_tokens=40"]))
    _, multi, tokenizer = _collectors(scripts, problems, group_size=1, objective=objective)
    multi.setup = dataclasses.replace(multi.setup, caps=EpisodeCaps(4, 200, 200, 64))
    batch, metrics = multi.collect(torch.Generator().manual_seed(0))
    chat = multi.setup.chat
    turn1, turn2 = chat.encode(CALL), chat.encode("\\boxed{7}<|im_end|>")
    between = chat.encode("<|im_end|>\n<|im_start|>user\n<tool_response>\n7\n</tool_response>\n<|im_end|>\n"
                          "<|im_start|>assistant\n")
    response = turn1 + between + turn2
    n = len(response)
    assert batch.response_ids_BT[0, :n].tolist() == response
    assert batch.mask_BT[0, :n].tolist() == [True] * len(turn1) + [False] * len(between) + [True] * len(turn2)
    assert batch.context_mask_BT[0, :n].tolist() == [False] * len(turn1) + [True] * len(between) + [False] * len(turn2)
    assert (batch.rollout_logp_BT[0][batch.context_mask_BT[0]] == 0).all()
    expected_logp = [-0.01 * (i + 1) for i in range(len(turn1))] + [-0.01 * (i + 1) for i in range(len(turn2))]
    torch.testing.assert_close(batch.rollout_logp_BT[0][batch.mask_BT[0]], torch.tensor(expected_logp))
    prompt = int(batch.prompt_len_B[0])
    assert batch.tokens_BL[0, prompt:prompt + n].tolist() == response and batch.lengths_B.tolist() == [prompt + n]
    assert batch.rewards_B.tolist() == [1.0] and batch.truncated_B.tolist() == [False]
    responses, examples = multi.rewards.seen
    assert responses == [tokenizer.decode(response, skip_special_tokens=True)]
    assert examples[0]["tool_calls"] == ["calculator"] and examples[0]["messages"][-1]["content"] == "\\boxed{7}"
    assert metrics["multiturn/turns_mean"] == 2.0 and metrics["multiturn/tool_calls_mean"] == 1.0
    assert metrics["multiturn/tool_error_frac"] == 0.0 and metrics["multiturn/end_answer"] == 1.0
    assert metrics["multiturn/observation_token_frac"] == 1 / n
    assert metrics["response_length/mean"] == len(turn1) + len(turn2)


def test_changing_an_observation_changes_the_log_probs_only_of_the_tokens_after_it():
    """Two rows alike but for the calculator's answer (7 vs 9, one token each). Through the policy forward, every
    sampled token before the observation has the same log-prob in both rows, bit for bit; the context positions
    have log-prob 0 in both; and some sampled token after it differs (so the loss differs only through them)."""
    scripts = {"What is 3+4?": [CALL, "\\boxed{7}<|im_end|>"]}
    problems = [{"problem": "What is 3+4?", "answer": "7"}]
    objective = Objective.from_config(load_config(overrides=["rollout.max_new_tokens=40"]))
    _, multi, tokenizer = _collectors(scripts, problems, group_size=1, objective=objective)
    multi.setup = dataclasses.replace(multi.setup, caps=EpisodeCaps(4, 200, 200, 64))
    batch, _ = multi.collect(torch.Generator().manual_seed(0))
    two = batch.select(torch.tensor([0, 0]))
    seven, nine = multi.setup.chat.encode("7"), multi.setup.chat.encode("9")
    where = (two.response_ids_BT[1] == seven[0]) & two.context_mask_BT[1]
    assert int(where.sum()) == 1
    two.response_ids_BT[1, where] = nine[0]
    prompt = int(two.prompt_len_B[1])
    two.tokens_BL[1, prompt:prompt + where.shape[0]][where] = nine[0]
    model = build_tiny_qwen3(seed=2, vocab_size=len(tokenizer), max_position_embeddings=1024)
    train, _ = objective.prepare(two)
    logp = PolicyForward(model, temperature=1.0, packed="off").logprobs(train).logp_BT.detach()
    t = int(torch.nonzero(where)[0])
    before, after = two.mask_BT[0].clone(), two.mask_BT[0].clone()
    before[t:], after[:t] = False, False
    assert torch.equal(logp[0][before], logp[1][before])
    assert (logp[:, two.context_mask_BT[0]] == 0).all()
    assert not torch.equal(logp[0][after], logp[1][after])
