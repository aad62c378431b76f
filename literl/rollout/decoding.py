"""Prompt preparation, prefill, and the generic decoder that any Hugging Face causal LM supports.

A rollout batch holds each prompt G times. `distinct_prompts` finds the distinct ones (anywhere in the batch,
not only consecutive repeats), so the prefill runs once per distinct prompt and its KV cache is then copied to
the G rows that sample from it. Prompts are left-padded: every row's next token then sits in the same column,
so a decode step appends one column for all rows at once.

A decoder turns "the token each live row just sampled" into "the logits of each live row's next token", and
can drop rows (`keep`) so that finished responses stop costing compute. `DynamicCacheDecoder` does this with
the model's own forward and works for every model; `literl.rollout.static_kv` is the faster specialised one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import torch
from transformers.cache_utils import DynamicCache

from literl.rollout.generator import SamplingParams
from literl.rollout.sampling import sample_from_uniform


@dataclass
class DistinctPrompts:
    """Distinct prompts, left-padded to a common length P, and which one each of the B rows continues.

    ids_UP     long, left-padded with pad_id
    real_UP    bool, True on prompt tokens (False on the left padding)
    length_U   long, prompt lengths
    source_B   long, index into U of each row's prompt
    """

    ids_UP: torch.Tensor
    real_UP: torch.Tensor
    length_U: torch.Tensor
    source_B: torch.Tensor

    @property
    def width(self) -> int:
        return int(self.ids_UP.shape[1])


def distinct_prompts(prompts: Sequence[Sequence[int]], pad_id: int, device: torch.device) -> DistinctPrompts:
    first_row: dict[tuple[int, ...], int] = {}
    source = [first_row.setdefault(tuple(int(t) for t in p), len(first_row)) for p in prompts]
    unique = list(first_row)
    P = max(len(p) for p in unique)
    ids_UP = torch.full((len(unique), P), pad_id, dtype=torch.long)
    real_UP = torch.zeros((len(unique), P), dtype=torch.bool)
    for u, p in enumerate(unique):
        ids_UP[u, P - len(p):] = torch.tensor(p, dtype=torch.long)
        real_UP[u, P - len(p):] = True
    return DistinctPrompts(ids_UP.to(device), real_UP.to(device),
                           torch.tensor([len(p) for p in unique], device=device),
                           torch.tensor(source, dtype=torch.long, device=device))


def prefill(model: torch.nn.Module, prompts: DistinctPrompts) -> tuple[torch.Tensor, DynamicCache]:
    """Run the distinct prompts through the model once: (logits_UV of each prompt's next token, the KV cache)."""
    positions_UP = (prompts.real_UP.long().cumsum(-1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    out = model(input_ids=prompts.ids_UP, attention_mask=prompts.real_UP.long(), position_ids=positions_UP,
                past_key_values=cache, use_cache=True, logits_to_keep=1)
    return out.logits[:, -1], out.past_key_values


class Decoder(Protocol):
    """One decode step for the live rows of a generation; rows are "slots" numbered 0..R-1."""

    def step(self, token_R: torch.Tensor) -> torch.Tensor:
        """Append each slot's sampled token; return the fp32-castable logits_RV of its next token."""
        ...

    def step_and_sample(self, token_R: torch.Tensor, params: SamplingParams, uniform_RV: torch.Tensor | None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        """`step`, then `sampling.sample_from_uniform` on its logits: (next token_R, its logp_R). A decoder may run
        both as one (the static decoder's compiled step samples inside its graph)."""
        ...

    def keep(self, slots_K: torch.Tensor) -> None:
        """Keep only these slots (in this order); the others are dropped from the batch and the cache. Any order
        is valid; a decoder may be cheapest when most slots keep their position (slots_K[i] == i)."""
        ...


class DynamicCacheDecoder:
    """The model's own forward with a growing `DynamicCache`: slower, but correct for any causal LM."""

    def __init__(self, model: torch.nn.Module, cache: DynamicCache, prompts: DistinctPrompts):
        self.model = model
        self.cache = cache
        cache.batch_select_indices(prompts.source_B)     # copy each distinct prompt's KV to its G rows
        self.attention_mask_RL = prompts.real_UP[prompts.source_B].long()
        self.next_position_R = prompts.length_U[prompts.source_B]

    def step(self, token_R: torch.Tensor) -> torch.Tensor:
        ones_R1 = torch.ones_like(self.attention_mask_RL[:, :1])
        self.attention_mask_RL = torch.cat([self.attention_mask_RL, ones_R1], dim=1)
        out = self.model(input_ids=token_R[:, None], attention_mask=self.attention_mask_RL,
                         position_ids=self.next_position_R[:, None], past_key_values=self.cache, use_cache=True)
        self.next_position_R = self.next_position_R + 1
        return out.logits[:, -1]

    def step_and_sample(self, token_R: torch.Tensor, params: SamplingParams, uniform_RV: torch.Tensor | None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        return sample_from_uniform(self.step(token_R), params, uniform_RV)

    def keep(self, slots_K: torch.Tensor) -> None:
        self.cache.batch_select_indices(slots_K)
        self.attention_mask_RL = self.attention_mask_RL[slots_K]
        self.next_position_R = self.next_position_R[slots_K]
