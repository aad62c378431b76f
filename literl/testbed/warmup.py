"""Supervised warm-up (SFT) of the testbed model on worked solutions.

The loss is next-token cross-entropy on the solution tokens and the final EOS only (never on the
prompt), averaged over those tokens. The learning rate warms up linearly, then follows a cosine down to
`min_lr_ratio * lr` at `steps`. Batches are drawn from an endless seeded stream of training problems
and grouped by length (`BUCKET_BATCHES` batches at a time) so that little compute goes to padding.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Callable, Iterator

import torch
from transformers import PreTrainedTokenizerBase

from literl.testbed.tasks import problem_stream

BUCKET_BATCHES = 8   # batches drawn together, sorted by length, then shuffled: ~30% less padding


@dataclass(frozen=True)
class SFTPhase:
    """One supervised phase: which data, how long, which optimiser settings."""

    steps: int
    lr: float
    slip_rate: float
    """Share of solution steps that carry an arithmetic slip (carried forward); 0 for clean data."""
    batch_size: int = 64
    warmup_steps: int = 50
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    tier: str = "mixed"
    style: str = "canonical"
    """How the solutions are written: `tasks.SOLUTION_STYLES` (canonical, varied, end_loop, skewed)."""


@dataclass
class SFTBatch:
    input_ids_BT: torch.Tensor
    attention_BT: torch.Tensor
    loss_mask_BT: torch.Tensor
    """bool, True where the *target* token (input shifted by one) counts: solution tokens and EOS."""


def encode_examples(tokenizer: PreTrainedTokenizerBase, records: list[dict]) -> SFTBatch:
    """Right-padded `problem + solution + EOS` rows; the loss mask covers solution and EOS targets."""
    rows, starts = [], []
    for record in records:
        prompt = tokenizer(record["problem"], add_special_tokens=False)["input_ids"]
        solution = tokenizer(record["solution"], add_special_tokens=False)["input_ids"]
        rows.append(prompt + solution + [tokenizer.eos_token_id])
        starts.append(len(prompt))
    width = max(len(r) for r in rows)
    input_ids_BT = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    attention_BT = torch.zeros((len(rows), width), dtype=torch.long)
    loss_mask_BT = torch.zeros((len(rows), width - 1), dtype=torch.bool)
    for i, (row, start) in enumerate(zip(rows, starts)):
        input_ids_BT[i, :len(row)] = torch.as_tensor(row)
        attention_BT[i, :len(row)] = 1
        # target t+1 is scored at position t: the first scored target is the first solution token
        loss_mask_BT[i, start - 1:len(row) - 1] = True
    return SFTBatch(input_ids_BT, attention_BT, loss_mask_BT)


def sft_batches(phase: SFTPhase, tokenizer: PreTrainedTokenizerBase, *, data_seed: int) -> Iterator[SFTBatch]:
    """Endless, seed-determined batches, grouped by length."""
    stream = problem_stream(split="train", tier=phase.tier, seed=data_seed, slip_rate=phase.slip_rate,
                            style=phase.style)
    order_rng = random.Random(f"literl-sft-order:{data_seed}")
    while True:
        pool = [next(stream) for _ in range(phase.batch_size * BUCKET_BATCHES)]
        pool.sort(key=lambda r: len(r["problem"]) + len(r["solution"]))
        groups = [pool[i:i + phase.batch_size] for i in range(0, len(pool), phase.batch_size)]
        order_rng.shuffle(groups)
        for group in groups:
            yield encode_examples(tokenizer, group)


def learning_rate(step: int, phase: SFTPhase) -> float:
    """Linear warm-up to `lr`, then cosine to `min_lr_ratio * lr` at `phase.steps` (flat afterwards)."""
    if step < phase.warmup_steps:
        return phase.lr * (step + 1) / phase.warmup_steps
    progress = min(1.0, (step - phase.warmup_steps) / max(1, phase.steps - phase.warmup_steps))
    floor = phase.min_lr_ratio * phase.lr
    return floor + (phase.lr - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def sft_loss(model: torch.nn.Module, batch: SFTBatch) -> torch.Tensor:
    """Mean cross-entropy over the masked targets."""
    logits_BTV = model(input_ids=batch.input_ids_BT, attention_mask=batch.attention_BT).logits[:, :-1]
    targets_BT = batch.input_ids_BT[:, 1:]
    return torch.nn.functional.cross_entropy(logits_BTV[batch.loss_mask_BT].float(),
                                             targets_BT[batch.loss_mask_BT])


StepCallback = Callable[[int, float, float], bool | None]
"""Called after each optimiser step with (step, loss, lr); returning True stops the phase."""


def run_sft(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, phase: SFTPhase,
            *, data_seed: int, on_step: StepCallback | None = None) -> int:
    """Train `model` in place for up to `phase.steps` steps; return the number of steps taken."""
    if phase.steps < 1:
        raise ValueError(f"an SFT phase needs at least one step (got {phase.steps})")
    decay, no_decay = [], []
    for name, param in model.named_parameters():
        (no_decay if param.ndim < 2 or "norm" in name else decay).append(param)
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": phase.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}], lr=phase.lr)
    model.train()
    batches = sft_batches(phase, tokenizer, data_seed=data_seed)
    for step in range(phase.steps):
        lr = learning_rate(step, phase)
        for group in optimizer.param_groups:
            group["lr"] = lr
        loss = sft_loss(model, next(batches))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), phase.grad_clip)
        optimizer.step()
        if on_step is not None and on_step(step + 1, loss.item(), lr):
            return step + 1
    return phase.steps
