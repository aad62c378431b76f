"""Batched sampling with a KV cache for any Hugging Face causal LM.

Prompts are left-padded so that every row's next token sits in the last column; finished rows are
dropped from the batch (and from the KV cache) so that they stop costing compute.
"""

from __future__ import annotations

import copy
from typing import Sequence

import torch
from transformers.cache_utils import DynamicCache

from literl.rollout.generator import Generation, SamplingParams
from literl.rollout.sampling import sample_next_token


class HFEngine:
    """Rollout engine over a `transformers` causal LM.

    With `dtype=None` (default) the engine samples from the policy module itself, so weight sync is
    free. With a lower precision (`torch.bfloat16`) it keeps its own copy in that dtype, which makes the
    training–inference mismatch real and measurable on CPU; `sync_weights` refreshes that copy.
    """

    def __init__(self, model: torch.nn.Module, *, eos_token_ids: Sequence[int], pad_id: int,
                 dtype: torch.dtype | None = None):
        self.dtype = dtype
        self.eos_token_ids = sorted(set(int(t) for t in eos_token_ids))
        if not self.eos_token_ids:
            raise ValueError("HFEngine needs at least one EOS token id to know when a response ends")
        self.pad_id = int(pad_id)
        self.model = model
        if dtype is not None and dtype != next(model.parameters()).dtype:
            self.model = copy.deepcopy(model).to(dtype)
        self.model.eval()

    def sync_weights(self, policy: torch.nn.Module) -> None:
        if self.model is policy:
            return
        with torch.no_grad():
            for dst, src in zip(self.model.parameters(), policy.parameters()):
                dst.copy_(src)

    @torch.inference_mode()
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 *, rng: torch.Generator | None = None) -> Generation:
        device = next(self.model.parameters()).device
        B = len(prompts)
        if B == 0:
            empty = torch.zeros(0, 1)
            return Generation(empty.long(), empty.bool(), empty, torch.zeros(0, dtype=torch.bool))
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        was_training = self.model.training
        self.model.eval()
        P = max(len(p) for p in prompts)
        input_ids = torch.full((B, P), self.pad_id, dtype=torch.long)
        attn = torch.zeros((B, P), dtype=torch.long)
        for i, p in enumerate(prompts):
            input_ids[i, P - len(p):] = torch.as_tensor(list(p), dtype=torch.long)
            attn[i, P - len(p):] = 1
        input_ids, attn = input_ids.to(device), attn.to(device)
        positions = (attn.cumsum(-1) - 1).clamp(min=0)

        T = params.max_new_tokens
        out_ids = torch.full((B, T), self.pad_id, dtype=torch.long, device=device)
        out_logp = torch.zeros((B, T), dtype=torch.float32, device=device)
        lengths = torch.zeros(B, dtype=torch.long, device=device)
        finished = torch.zeros(B, dtype=torch.bool, device=device)
        eos = torch.tensor(self.eos_token_ids, device=device)

        cache = DynamicCache()
        out = self.model(input_ids=input_ids, attention_mask=attn, position_ids=positions,
                         past_key_values=cache, use_cache=True, logits_to_keep=1)
        logits = out.logits[:, -1]
        active = torch.arange(B, device=device)      # original row of each live cache row
        next_pos = positions[:, -1] + 1
        for t in range(T):
            token, logp = sample_next_token(logits, params, rng)
            out_ids[active, t] = token
            out_logp[active, t] = logp
            lengths[active] = t + 1
            done_now = torch.isin(token, eos)
            finished[active] |= done_now
            if t == T - 1 or bool(done_now.all()):
                break
            if bool(done_now.any()):
                keep = torch.nonzero(~done_now).flatten()
                cache.batch_select_indices(keep)
                active, token, attn, next_pos = active[keep], token[keep], attn[keep], next_pos[keep]
            attn = torch.cat([attn, torch.ones_like(attn[:, :1])], dim=1)
            out = self.model(input_ids=token[:, None], attention_mask=attn, position_ids=next_pos[:, None],
                             past_key_values=cache, use_cache=True)
            logits = out.logits[:, -1]
            next_pos = next_pos + 1
        if was_training:
            self.model.train()

        mask = torch.arange(T, device=device)[None, :] < lengths[:, None]
        out_ids = torch.where(mask, out_ids, torch.full_like(out_ids, self.pad_id))
        out_logp = torch.where(mask, out_logp, torch.zeros_like(out_logp))
        return Generation(out_ids.cpu(), mask.cpu(), out_logp.cpu(), (~finished).cpu())
