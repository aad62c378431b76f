"""The LM head as log-probs and entropies of target tokens, never holding a batch × vocabulary logits tensor.

    z_t      = lm_head(h_t) / temperature                     (fp32, full vocabulary)
    logp_t   = z_t[y_t] − logsumexp(z_t)
    H_t      = logsumexp(z_t) − Σ_v softmax(z_t)_v · z_t,v     (algorithms.md §5)

The head runs over tiles of (tokens × vocabulary entries) with an online logsumexp, and its backward recomputes
each tile's logits instead of storing them, so a step never holds batch × length × vocab fp32 logits (20 GB for
64 × 512 tokens at Qwen's 151,936-token vocabulary), in forward or backward.

Models whose logits are not a plain linear map of the decoder output (logit soft-capping, logit scaling, a
custom head) take the direct path: a full forward, then log_softmax (`direct_logprobs`).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from literl.model.compiled import compile_for_varying_sizes

# Accelerators: logits per tile (fp32 elements); 2^25 is 128 MB, two of which are alive at once in backward. A tile
# spans up to ACCELERATOR_TILE_TOKENS tokens and the vocabulary block that keeps it at that size: the weight
# gradient of a vocabulary block is then one product over a micro-batch's tokens, not a sum of products over
# whole-vocabulary tiles of ~220 tokens each (each of which re-reads and re-writes the whole [V, H] float32
# accumulator: 1.2 GB at 151,936 × 2,048, ~0.4 s per update at 3 TB/s). Chosen by that arithmetic, not measured.
DEFAULT_CHUNK_LOGITS = 1 << 25
ACCELERATOR_TILE_TOKENS = 16384
# CPU: vocabulary columns per tile, at least this many tokens, and about this many logits (4 MB) per tile.
CPU_VOCAB_BLOCK = 4096
CPU_MIN_TILE_TOKENS = 256
CPU_TILE_LOGITS = 1 << 20
# Config fields that mean the logits are not `lm_head(hidden)` (Gemma 2, Cohere, Granite, ...).
LOGIT_TRANSFORM_FIELDS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")


def head_logprobs(head: torch.nn.Linear, hidden_MH: torch.Tensor, target_M: torch.Tensor, temperature: float,
                  with_entropy: bool, tiling: "Tiling", compute_dtype: torch.dtype | None = None, *,
                  fused: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(logp_M, entropy_M or None) of the target tokens from hidden_MH through a linear head, tile by tile.
    `compute_dtype` narrower than the head's weight (mixed precision: bfloat16 over float32 master weights): the
    matmuls run in it, the logits, log-softmax and gradient accumulation in float32, and the gradients come back in
    the weight's and the hidden state's own dtypes. `fused=True`: each tile's element-wise work is one compiled
    kernel forward and one backward (`compiled_tile_statistics`, `compiled_tile_gradient`; a head without bias)."""
    return ChunkedHeadLogprobs.apply(hidden_MH, head.weight, head.bias, target_M, float(temperature),
                                     bool(with_entropy), tiling, compute_dtype, bool(fused) and head.bias is None)


def scatter_rows(values_M: torch.Tensor, valid_BT: torch.Tensor, dense: bool) -> torch.Tensor:
    """values_M (one per valid_BT True entry, row-major) back to [B, T], 0 elsewhere (`dense`: every entry valid)."""
    if dense:
        return values_M.view(valid_BT.shape)
    out_BT = values_M.new_zeros(valid_BT.shape)
    return out_BT.masked_scatter(valid_BT, values_M)


def direct_logprobs(model, tokens_BL, pos_BT, target_BT, valid_BT, temperature, with_entropy):
    """Full logits from the model's own forward: for heads that are not a plain linear layer."""
    logits_BLV = model(input_ids=tokens_BL, use_cache=False).logits
    z_BTV = logits_BLV.gather(1, pos_BT[:, :, None].expand(-1, -1, logits_BLV.shape[-1])).float() / temperature
    logp_BT, entropy_BT = _logp_entropy(z_BTV, target_BT, with_entropy)
    zero = torch.zeros((), device=logp_BT.device)
    logp_BT = torch.where(valid_BT, logp_BT, zero)
    return logp_BT, (torch.where(valid_BT, entropy_BT, zero) if with_entropy else None)


def _logp_entropy(z_MV: torch.Tensor, target_M: torch.Tensor, with_entropy: bool):
    lse_M = torch.logsumexp(z_MV, dim=-1)
    logp_M = z_MV.gather(-1, target_M[..., None]).squeeze(-1) - lse_M
    if not with_entropy:
        return logp_M, None
    return logp_M, lse_M - (torch.softmax(z_MV, dim=-1) * z_MV).sum(-1)


@dataclass(frozen=True)
class Tiling:
    """Tile of the head's logits computed at once: `tokens` response positions × `vocab` vocabulary entries."""

    tokens: int
    vocab: int

    @staticmethod
    def default(vocab_size: int, device: torch.device, *, chunk_tokens: int | None = None,
                vocab_block: int | None = None) -> "Tiling":
        """CPU: tiles of a few MB, so that the element-wise work on a tile runs in cache (on a memory-poor host
        this halves the head's time against whole-vocabulary chunks). Accelerators: DEFAULT_CHUNK_LOGITS per tile,
        as many tokens as ACCELERATOR_TILE_TOKENS, so that few tiles (kernel launches) are needed and each
        vocabulary block's weight gradient is one product."""
        if device.type == "cpu":
            vocab = min(vocab_size, vocab_block or CPU_VOCAB_BLOCK)
            tokens = chunk_tokens or max(CPU_MIN_TILE_TOKENS, CPU_TILE_LOGITS // vocab)
        else:
            tokens = chunk_tokens or ACCELERATOR_TILE_TOKENS
            vocab = min(vocab_size, vocab_block or max(1, DEFAULT_CHUNK_LOGITS // tokens))
        return Tiling(tokens=max(1, int(tokens)), vocab=max(1, int(vocab)))


class ChunkedHeadLogprobs(torch.autograd.Function):
    """(logp_M, entropy_M) of a linear head over the full vocabulary, never holding more than one tile of logits.

    Forward keeps, per token, an online logsumexp over vocabulary tiles: the running max m, Σ e^(z−m) and
    Σ e^(z−m)·z, so that lse = m + log Σ e^(z−m) and E_p[z] = Σ e^(z−m)·z / Σ e^(z−m), and H = lse − E_p[z].
    Backward recomputes each tile's logits z (temperature-scaled) and p = e^(z − lse):
        ∂logp/∂z = onehot(y) − p
        ∂H/∂z    = −p ⊙ (z − E_p[z])
    then ∂/∂h = (∂/∂z / temperature) · W and ∂/∂W = (∂/∂z / temperature)ᵀ · h, accumulated tile by tile.
    `fused`: a tile's element-wise work, forward and backward, is one compiled kernel each (`tile_statistics`,
    `tile_gradient`) reading the matmul's output as it is, instead of eager passes over an fp32 copy.
    """

    @staticmethod
    def forward(ctx, hidden_MH, weight_VH, bias_V, target_M, temperature, with_entropy, tiling, compute_dtype=None,
                fused=False):
        N, V = hidden_MH.shape[0], weight_VH.shape[0]
        saved = hidden_MH, weight_VH
        hidden_MH, weight_VH = _in_compute_dtype(hidden_MH, weight_VH, compute_dtype)
        f32 = dict(dtype=torch.float32, device=hidden_MH.device)
        max_M = torch.full((N,), float("-inf"), **f32)
        sum_exp_M, sum_exp_z_M, target_z_M = (torch.zeros(N, **f32) for _ in range(3))
        tile_buffer = None if fused else torch.empty(min(N, tiling.tokens) * min(V, tiling.vocab), **f32)
        statistics = compiled_tile_statistics() if fused else None
        for v0 in range(0, V, tiling.vocab):
            tile_weight_VH = weight_VH[v0:v0 + tiling.vocab]
            tile_bias_V = None if bias_V is None else bias_V[v0:v0 + tiling.vocab]
            for n0 in range(0, N, tiling.tokens):
                rows = slice(n0, n0 + tiling.tokens)
                in_tile_C, local_C = _target_in_tile(target_M[rows], v0, tile_weight_VH.shape[0])
                if fused:
                    max_M[rows], sum_exp_M[rows], sum_exp_z_M[rows], target_z_M[rows] = statistics(
                        hidden_MH[rows] @ tile_weight_VH.t(), max_M[rows], sum_exp_M[rows], sum_exp_z_M[rows],
                        target_z_M[rows], local_C, in_tile_C, temperature, with_entropy)
                    continue
                z_CV = _tile_logits(hidden_MH[rows], tile_weight_VH, tile_bias_V, temperature, tile_buffer)
                target_z_M[rows] = torch.where(in_tile_C, z_CV.gather(1, local_C[:, None]).squeeze(1),
                                               target_z_M[rows])
                new_max_C = torch.maximum(max_M[rows], z_CV.amax(-1))
                rescale_C = torch.exp(max_M[rows] - new_max_C)
                max_M[rows] = new_max_C
                exp_CV = torch.exp(z_CV - new_max_C[:, None]) if with_entropy else z_CV.sub_(new_max_C[:, None]).exp_()
                sum_exp_M[rows] = sum_exp_M[rows] * rescale_C + exp_CV.sum(-1)
                if with_entropy:
                    sum_exp_z_M[rows] = sum_exp_z_M[rows] * rescale_C + exp_CV.mul_(z_CV).sum(-1)
        lse_M = max_M + sum_exp_M.log()
        mean_z_M = sum_exp_z_M / sum_exp_M
        ctx.save_for_backward(*saved, bias_V, target_M, lse_M, mean_z_M)
        ctx.settings = (temperature, with_entropy, tiling, compute_dtype, fused)
        return target_z_M - lse_M, (lse_M - mean_z_M if with_entropy else None)

    @staticmethod
    def backward(ctx, grad_logp_M, grad_entropy_M):
        hidden_MH, weight_VH, bias_V, target_M, lse_M, mean_z_M = ctx.saved_tensors
        temperature, with_entropy, tiling, compute_dtype, fused = ctx.settings
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        out_dtypes = hidden_MH.dtype, weight_VH.dtype
        hidden_MH, weight_VH = _in_compute_dtype(hidden_MH, weight_VH, compute_dtype)
        N, V = hidden_MH.shape[0], weight_VH.shape[0]
        grad_logp_M = grad_logp_M.float()
        grad_entropy_M = grad_entropy_M.float() if (with_entropy and grad_entropy_M is not None) else None
        grad_h_MH = torch.zeros(hidden_MH.shape, dtype=torch.float32, device=hidden_MH.device)
        grad_w_VH = torch.zeros(weight_VH.shape, dtype=torch.float32, device=weight_VH.device) if need_w else None
        grad_b_V = torch.zeros(V, dtype=torch.float32, device=weight_VH.device) if need_b else None
        tile_buffer = None if fused else torch.empty(min(N, tiling.tokens) * min(V, tiling.vocab),
                                                     dtype=torch.float32, device=hidden_MH.device)
        gradient = compiled_tile_gradient() if fused else None
        for v0 in range(0, V, tiling.vocab):
            block = slice(v0, v0 + tiling.vocab)
            tile_weight_VH = weight_VH[block]
            for n0 in range(0, N, tiling.tokens):
                rows = slice(n0, n0 + tiling.tokens)
                h_CH = hidden_MH[rows]
                if fused:
                    in_tile_C, local_C = _target_in_tile(target_M[rows], v0, tile_weight_VH.shape[0])
                    grad_z_CV = gradient(h_CH @ tile_weight_VH.t(), lse_M[rows], mean_z_M[rows], local_C, in_tile_C,
                                         grad_logp_M[rows], None if grad_entropy_M is None else grad_entropy_M[rows],
                                         temperature)
                    _accumulate_head_grads(grad_z_CV, h_CH, tile_weight_VH, grad_h_MH[rows],
                                           grad_w_VH[block] if need_w else None)
                    continue
                z_CV = _tile_logits(h_CH, tile_weight_VH, None if bias_V is None else bias_V[block], temperature,
                                    tile_buffer)
                grad_z_CV = _tile_grad_logits(z_CV, lse_M[rows], mean_z_M[rows], target_M[rows], v0,
                                              grad_logp_M[rows],
                                              None if grad_entropy_M is None else grad_entropy_M[rows])
                grad_z_CV.div_(temperature)
                _accumulate_head_grads(grad_z_CV, h_CH, tile_weight_VH, grad_h_MH[rows],
                                       grad_w_VH[block] if need_w else None)
                if need_b:
                    grad_b_V[block] += grad_z_CV.sum(0)
        return (grad_h_MH.to(out_dtypes[0]) if need_h else None,
                grad_w_VH.to(out_dtypes[1]) if need_w else None,
                grad_b_V.to(bias_V.dtype) if need_b else None, None, None, None, None, None, None)


def _in_compute_dtype(hidden_MH: torch.Tensor, weight_VH: torch.Tensor, compute_dtype: torch.dtype | None):
    """The hidden states and the head's weight as the matmuls take them: cast once per call to a compute dtype
    narrower than the weight's (not per tile: a tile of a 151,936-token head would otherwise re-read its whole
    weight), else as they are."""
    if compute_dtype is None or compute_dtype.itemsize >= weight_VH.dtype.itemsize:
        return hidden_MH, weight_VH
    return hidden_MH.to(compute_dtype), weight_VH.to(compute_dtype)


def _tile_logits(h_CH, tile_weight_VH, tile_bias_V, temperature, buffer) -> torch.Tensor:
    """z = (h Wᵀ + b) / temperature in fp32, written into `buffer` (reused: no allocation per tile)."""
    C, W = h_CH.shape[0], tile_weight_VH.shape[0]
    z_CV = buffer[:C * W].view(C, W)
    if h_CH.dtype == torch.float32 and tile_weight_VH.dtype == torch.float32:
        torch.mm(h_CH, tile_weight_VH.t(), out=z_CV)
    else:
        z_CV.copy_(h_CH @ tile_weight_VH.t())
    if tile_bias_V is not None:
        z_CV += tile_bias_V
    return z_CV.div_(temperature) if temperature != 1.0 else z_CV


def _accumulate_head_grads(grad_z_CV, h_CH, tile_weight_VH, grad_h_CH, grad_tile_weight_VH) -> None:
    """grad_h += ∂z · W and grad_W += ∂zᵀ · h into fp32 accumulators; the matmuls run in the weights' dtype
    (as autograd would for a low-precision linear layer), never on an fp32 copy of the weights."""
    if tile_weight_VH.dtype == torch.float32 and h_CH.dtype == torch.float32:
        grad_h_CH.addmm_(grad_z_CV, tile_weight_VH)
        if grad_tile_weight_VH is not None:
            grad_tile_weight_VH.addmm_(grad_z_CV.t(), h_CH)
        return
    grad_z_CV = grad_z_CV.to(tile_weight_VH.dtype)
    grad_h_CH += (grad_z_CV @ tile_weight_VH).float()
    if grad_tile_weight_VH is not None:
        grad_tile_weight_VH += (grad_z_CV.t() @ h_CH.to(tile_weight_VH.dtype)).float()


def _target_in_tile(target_C, v0: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(whether each target falls in vocabulary columns [v0, v0 + width), its column there, clamped)."""
    local_C = target_C - v0
    return (local_C >= 0) & (local_C < width), local_C.clamp(0, width - 1)


def _tile_grad_logits(z_CV, lse_C, mean_z_C, target_C, v0, grad_logp_C, grad_entropy_C) -> torch.Tensor:
    """g_logp·(onehot(y) − p) + g_H·(−p ⊙ (z − E_p[z])) on one tile, overwriting z's buffer."""
    p_CV = torch.exp(z_CV - lse_C[:, None])
    if grad_entropy_C is None:
        grad_z_CV = p_CV.mul_(-grad_logp_C[:, None])
    else:
        # −p·g_logp − p·(z − E[z])·g_H  =  −p · ((z − E[z])·g_H + g_logp)
        scale_CV = z_CV.sub_(mean_z_C[:, None]).mul_(grad_entropy_C[:, None]).add_(grad_logp_C[:, None])
        grad_z_CV = p_CV.mul_(scale_CV).neg_()
    in_tile_C, local_C = _target_in_tile(target_C, v0, z_CV.shape[1])
    return grad_z_CV.scatter_add_(1, local_C[:, None], (grad_logp_C * in_tile_C)[:, None])


def tile_statistics(zb_CV, max_C, sum_exp_C, sum_exp_z_C, target_z_C, local_C, in_tile_C, temperature: float,
                    with_entropy: bool):
    """One tile's share of the forward's online logsumexp (`ChunkedHeadLogprobs.forward`, the same arithmetic),
    from the tile's logits as the matmul returned them (its dtype, before temperature): the running max, Σ e^(z−m),
    Σ e^(z−m)·z and the target's logit, updated. Compiled (`compiled_tile_statistics`), the tile is read by one
    kernel, where the eager tile makes ~9 passes over an fp32 copy of it."""
    z_CV = zb_CV.float() / temperature
    target_z_C = torch.where(in_tile_C, z_CV.gather(1, local_C[:, None]).squeeze(1), target_z_C)
    new_max_C = torch.maximum(max_C, z_CV.amax(-1))
    rescale_C = torch.exp(max_C - new_max_C)
    exp_CV = torch.exp(z_CV - new_max_C[:, None])
    sum_exp_C = sum_exp_C * rescale_C + exp_CV.sum(-1)
    if with_entropy:
        sum_exp_z_C = sum_exp_z_C * rescale_C + (exp_CV * z_CV).sum(-1)
    return new_max_C, sum_exp_C, sum_exp_z_C, target_z_C


def tile_gradient(zb_CV, lse_C, mean_z_C, local_C, in_tile_C, grad_logp_C, grad_entropy_C, temperature: float):
    """∂/∂(hWᵀ) of one tile, in the logits' dtype (what the two matmuls after it take): `_tile_grad_logits`'
    arithmetic divided by the temperature, from the tile's logits as the matmul returned them."""
    z_CV = zb_CV.float() / temperature
    p_CV = torch.exp(z_CV - lse_C[:, None])
    if grad_entropy_C is None:
        grad_z_CV = -p_CV * grad_logp_C[:, None]
    else:
        grad_z_CV = -p_CV * ((z_CV - mean_z_C[:, None]) * grad_entropy_C[:, None] + grad_logp_C[:, None])
    target_CV = (torch.arange(z_CV.shape[1], device=z_CV.device)[None, :] == local_C[:, None]) & in_tile_C[:, None]
    grad_z_CV = grad_z_CV + torch.where(target_CV, grad_logp_C[:, None], 0.0)
    return (grad_z_CV / temperature).to(zb_CV.dtype)


@functools.cache
def compiled_tile_statistics():
    """`tile_statistics` through `torch.compile`, one graph for every tile size (a tile of one token or one
    vocabulary entry runs eagerly)."""
    return compile_for_varying_sizes(tile_statistics, name="the head's tile statistics",
                                     eager_when=lambda zb_CV, *rest: min(zb_CV.shape) < 2)


@functools.cache
def compiled_tile_gradient():
    """`tile_gradient` through `torch.compile` (as `compiled_tile_statistics`)."""
    return compile_for_varying_sizes(tile_gradient, name="the head's tile gradient",
                                     eager_when=lambda zb_CV, *rest: min(zb_CV.shape) < 2)


def linear_head(model: torch.nn.Module) -> torch.nn.Linear | None:
    """The LM head when, by structure and config, logits are `head(decoder(x).last_hidden_state)`; else None.
    (`literl.model.capabilities` also checks it against the model's forward once.)"""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if not isinstance(head, torch.nn.Linear) or not hasattr(model, "get_decoder"):
        return None
    config = getattr(model, "config", None)
    if any(getattr(config, name, None) not in (None, 1, 1.0) for name in LOGIT_TRANSFORM_FIELDS):
        return None
    return head
