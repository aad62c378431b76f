"""Next-token sampling from logits: temperature, top-k, top-p, and the log-prob the sampler reports."""

from __future__ import annotations

import torch

from literl.rollout.generator import SamplingParams


def sample_next_token(logits_BV: torch.Tensor, params: SamplingParams,
                      rng: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; return (token_B, logp_B).

    logp is log softmax(logits / temperature) at the sampled token over the *full* vocabulary, the same
    quantity the trainer computes for old_logp. Top-k/top-p only decide which tokens may be drawn; their
    renormalisation is not folded into the reported log-prob (folding it in biases IS ratios by log of
    the kept mass, vllm#42259).
    """
    logp_BV = torch.log_softmax(logits_BV.float() / params.temperature, dim=-1)
    if params.greedy:
        token = logp_BV.argmax(-1)
    else:
        filtered = logp_BV
        if params.top_k and params.top_k < filtered.shape[-1]:
            kth = torch.topk(filtered, params.top_k, dim=-1).values[:, -1:]
            filtered = filtered.masked_fill(filtered < kth, float("-inf"))
        if params.top_p < 1.0:
            sorted_logp, order = torch.sort(filtered, dim=-1, descending=True)
            cum = sorted_logp.exp().cumsum(-1)
            # keep the smallest prefix whose mass reaches top_p (the first token always stays)
            drop_sorted = (cum - sorted_logp.exp()) >= params.top_p
            drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
            filtered = filtered.masked_fill(drop, float("-inf"))
        probs = torch.softmax(filtered, dim=-1)
        token = torch.multinomial(probs, 1, generator=rng).squeeze(-1)
    return token, logp_BV.gather(-1, token[:, None]).squeeze(-1)
