"""Next-token sampling from logits: temperature, top-k, top-p, and the log-prob the sampler reports."""

from __future__ import annotations

import torch

from literl.rollout.engine import SamplingParams


def sample_next_token(logits_BV: torch.Tensor, params: SamplingParams, rng: torch.Generator | None = None,
                      *, gumbel_BV: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; return (token_B, logp_B).

    logp is log softmax(logits / temperature) at the sampled token over the *full* vocabulary, the same
    quantity the trainer computes for old_logp. Top-k/top-p only decide which tokens may be drawn; their
    renormalisation is not folded into the reported log-prob (folding it in biases IS ratios by log of
    the kept mass, vllm#42259).

    Sampling is the Gumbel-max trick: token = argmax_v (log q_v + g_v), g_v ~ Gumbel(0, 1) i.i.d., which draws
    v with probability q_v (the filtered, renormalised distribution). `gumbel_BV` supplies the g_v (drawn from
    `rng` when omitted, see `gumbel_noise`): the engine draws them for every row of the batch at every step, so
    a row's sample depends only on the seed, its row and its step, never on which other rows are still running.
    """
    logp_BV = torch.log_softmax(logits_BV.float() / params.temperature, dim=-1)
    if params.greedy:
        token_B = logp_BV.argmax(-1)
    else:
        allowed_BV = filter_top_k_top_p(logp_BV, top_k=params.top_k, top_p=params.top_p)
        if gumbel_BV is None:
            gumbel_BV = gumbel_noise(*allowed_BV.shape, device=allowed_BV.device, rng=rng)
        token_B = (allowed_BV + gumbel_BV).argmax(-1)
    return token_B, logp_BV.gather(-1, token_B[:, None]).squeeze(-1)


def gumbel_noise(*shape: int, device: torch.device, rng: torch.Generator | None = None) -> torch.Tensor:
    """g = −log(−log U), U ~ Uniform[0, 1) (U = 0 gives −inf, a token that is never drawn).

    Four times faster on CPU than `Tensor.exponential_`, the other way to draw the race's noise.
    """
    return gumbel_from_uniform(uniform_noise(*shape, device=device, rng=rng))


def uniform_noise(*shape: int, device: torch.device, rng: torch.Generator | None = None) -> torch.Tensor:
    """U ~ Uniform[0, 1), the draw behind `gumbel_noise` (drawn eagerly, from `rng`, so that a compiled step can
    turn it into Gumbel noise without touching the random stream)."""
    return torch.empty(shape, device=device).uniform_(generator=rng)


def gumbel_from_uniform(uniform: torch.Tensor) -> torch.Tensor:
    """−log(−log U), element-wise. Eagerly it overwrites U (a draw serves once; at a 152k vocabulary that saves two
    [rows, vocab] temporaries per token step); compiled, it is out of place and fuses into the decode step's graph."""
    if torch.compiler.is_compiling():
        return -torch.log(-torch.log(uniform))
    return uniform.log_().neg_().log_().neg_()


def sample_from_uniform(logits_BV: torch.Tensor, params: SamplingParams, uniform_BV: torch.Tensor | None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """`sample_next_token` with the race's noise given as its uniform draw (None when greedy), which it consumes
    (`gumbel_from_uniform`)."""
    gumbel_BV = None if uniform_BV is None else gumbel_from_uniform(uniform_BV)
    return sample_next_token(logits_BV, params, gumbel_BV=gumbel_BV)


def filter_top_k_top_p(logp_BV: torch.Tensor, *, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """log-probs with the tokens outside the top-k and outside the top-p nucleus set to −inf.

    top-p keeps the smallest set of most likely tokens whose mass reaches top_p (the most likely token always
    stays). With both, top-k applies first and top-p measures mass in the renormalised top-k distribution,
    as Hugging Face's warpers and vLLM do.
    """
    allowed_BV = logp_BV
    if top_k and top_k < allowed_BV.shape[-1]:
        kth_B1 = torch.topk(allowed_BV, top_k, dim=-1).values[:, -1:]
        allowed_BV = allowed_BV.masked_fill(allowed_BV < kth_B1, float("-inf"))
    if top_p < 1.0:
        sorted_BV, order_BV = torch.sort(allowed_BV, dim=-1, descending=True)
        probs_BV = torch.softmax(sorted_BV, dim=-1)
        mass_before_BV = probs_BV.cumsum(-1) - probs_BV
        drop_BV = torch.zeros_like(mass_before_BV, dtype=torch.bool).scatter(-1, order_BV, mass_before_BV >= top_p)
        allowed_BV = allowed_BV.masked_fill(drop_BV, float("-inf"))
    return allowed_BV
