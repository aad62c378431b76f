"""Held-out accuracy and token entropy of a testbed policy, measured through the rollout engine.

Sampled accuracy (temperature 1, averaged over several samples per problem) is the headline: RL mostly
sharpens the sampling distribution, so greedy accuracy, reported beside it, moves much less.
Mean token entropy is the entropy of the temperature-1 next-token distribution at each sampled response
token, averaged over all response tokens (nats).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Sequence

import torch
from transformers import PreTrainedTokenizerBase

from literl.rollout.engine import SamplingParams
from literl.rollout.native_engine import NativeEngine
from literl.testbed.tasks import is_correct

ENTROPY_CHUNK = 256   # sequences per teacher-forced forward, to bound memory on large evaluations


@dataclass
class PolicyMeasurement:
    """What `measure_policy` reports; `asdict` gives the manifest entry."""

    sampled_accuracy: float
    greedy_accuracy: float
    mean_token_entropy: float
    sampled_accuracy_by_ops: dict[str, float]
    greedy_accuracy_by_ops: dict[str, float]
    mean_response_tokens: float
    truncated_rate: float
    num_problems: int
    samples_per_problem: int
    max_new_tokens: int

    def to_dict(self) -> dict:
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in asdict(self).items()}


def prompt_ids(tokenizer: PreTrainedTokenizerBase, problems: Sequence[dict]) -> list[list[int]]:
    """Token ids of each problem string verbatim (the raw template: no BOS, no chat wrapper)."""
    return [tokenizer(p["problem"], add_special_tokens=False)["input_ids"] for p in problems]


def _accuracy_by_ops(problems: Sequence[dict], correct: Sequence[bool], repeats: int) -> dict[str, float]:
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for i, ok in enumerate(correct):
        key = str(problems[i // repeats]["num_ops"])
        totals[key][0] += int(ok)
        totals[key][1] += 1
    return {k: hits / n for k, (hits, n) in sorted(totals.items())}


@torch.no_grad()
def mean_token_entropy(model: torch.nn.Module, prompts: Sequence[list[int]], response_ids_BT: torch.Tensor,
                       mask_BT: torch.Tensor, *, pad_id: int) -> float:
    """Average next-token entropy (T=1, nats) over the masked response tokens."""
    total, count = 0.0, 0
    for start in range(0, len(prompts), ENTROPY_CHUNK):
        chunk = range(start, min(start + ENTROPY_CHUNK, len(prompts)))
        rows = [list(prompts[i]) + response_ids_BT[i][mask_BT[i]].tolist() for i in chunk]
        width = max(len(r) for r in rows)
        ids_BT = torch.full((len(rows), width), pad_id, dtype=torch.long)
        scored_BT = torch.zeros((len(rows), width), dtype=torch.bool)
        for j, i in enumerate(chunk):
            ids_BT[j, :len(rows[j])] = torch.as_tensor(rows[j])
            # The logits at position t predict token t+1: response tokens are predicted from
            # the last prompt position up to the one before the final response token.
            n_prompt, n_resp = len(prompts[i]), int(mask_BT[i].sum())
            scored_BT[j, n_prompt - 1:n_prompt - 1 + n_resp] = True
        attention_BT = (torch.arange(width)[None, :] < torch.tensor([len(r) for r in rows])[:, None]).long()
        logp_BTV = torch.log_softmax(model(input_ids=ids_BT, attention_mask=attention_BT).logits.float(), -1)
        entropy_BT = -(logp_BTV.exp() * logp_BTV).sum(-1)
        total += float(entropy_BT[scored_BT].sum())
        count += int(scored_BT.sum())
    return total / max(count, 1)


def measure_policy(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, problems: Sequence[dict], *,
                   samples_per_problem: int = 4, max_new_tokens: int = 64, seed: int = 0) -> PolicyMeasurement:
    """Sampled (T=1) and greedy accuracy and mean token entropy on `problems`; deterministic given `seed`."""
    if not problems or samples_per_problem < 1:
        raise ValueError("measure_policy needs at least one problem and one sample per problem")
    was_training = model.training
    engine = NativeEngine(model, eos_token_ids=[tokenizer.eos_token_id], pad_id=tokenizer.pad_token_id)
    prompts = prompt_ids(tokenizer, problems)
    repeated = [p for p in prompts for _ in range(samples_per_problem)]
    rng = torch.Generator().manual_seed(seed)
    sampled = engine.generate(repeated, SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens), rng=rng)
    greedy = engine.generate(prompts, SamplingParams(greedy=True, max_new_tokens=max_new_tokens), rng=rng)

    def judge(generation, repeats):
        texts = tokenizer.batch_decode(generation.response_ids_BT.masked_fill(~generation.mask_BT, 0),
                                       skip_special_tokens=True)
        return [is_correct(text, problems[i // repeats]["answer"]) for i, text in enumerate(texts)]

    sampled_ok, greedy_ok = judge(sampled, samples_per_problem), judge(greedy, 1)
    entropy = mean_token_entropy(model, repeated, sampled.response_ids_BT, sampled.mask_BT,
                                 pad_id=tokenizer.pad_token_id)
    model.train(was_training)
    return PolicyMeasurement(
        sampled_accuracy=sum(sampled_ok) / len(sampled_ok),
        greedy_accuracy=sum(greedy_ok) / len(greedy_ok),
        mean_token_entropy=entropy,
        sampled_accuracy_by_ops=_accuracy_by_ops(problems, sampled_ok, samples_per_problem),
        greedy_accuracy_by_ops=_accuracy_by_ops(problems, greedy_ok, 1),
        mean_response_tokens=float(sampled.mask_BT.sum(-1).float().mean()),
        truncated_rate=float(sampled.truncated_B.float().mean()),
        num_problems=len(problems),
        samples_per_problem=samples_per_problem,
        max_new_tokens=max_new_tokens,
    )
