"""Token log-probs (and entropies) of response tokens under a causal LM, with the LM head applied in chunks.

    z_t      = lm_head(h_t) / temperature                     (fp32, full vocabulary)
    logp_t   = z_t[y_t] − logsumexp(z_t)
    H_t      = logsumexp(z_t) − Σ_v softmax(z_t)_v · z_t,v     (algorithms.md §5)

where h_t is the decoder's hidden state at the position that predicts response token y_t. The decoder body
runs once on the whole batch; the head then runs over the response positions in chunks of `chunk_tokens`, and
its backward recomputes each chunk's logits instead of storing them, so a step never holds batch × length ×
vocab fp32 logits (20 GB for 64 × 512 tokens at Qwen's 151,936-token vocabulary), in forward or backward.

Models whose logits are not a plain linear map of the decoder output (logit soft-capping, logit scaling, a
custom head) take the direct path: a full forward, then log_softmax.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F

# Logits held per chunk (fp32 elements): 2^25 is 128 MB, a few of which are alive at once in backward.
DEFAULT_CHUNK_LOGITS = 1 << 25
# Config fields that mean the logits are not `lm_head(hidden)` (Gemma 2, Cohere, Granite, ...).
_LOGIT_TRANSFORM_FIELDS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")

_head_cache: "weakref.WeakKeyDictionary[torch.nn.Module, bool]" = weakref.WeakKeyDictionary()


def token_logprobs(model: torch.nn.Module, tokens_BL: torch.Tensor, prompt_len_B: torch.Tensor, T: int, *,
                   temperature: float = 1.0, with_entropy: bool = False, chunk_tokens: int | None = None,
                   mask_BT: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log π(y_t) of response tokens t < T of each row, and the entropy of π at those positions if asked.

    Layout as in `literl.batch`: row b holds its prompt then its response, right-padded; response token t is
    `tokens_BL[b, prompt_len_B[b] + t]`. Returns fp32 (logp_BT, entropy_BT or None). Positions past a row's end
    hold finite values of no meaning, or 0 where `mask_BT` is given: the head then skips them, which saves the
    vocabulary-sized matmul on padding. `chunk_tokens` (default: as many as fit 2^25 logits) sets the peak memory
    of the head. Gradients reach every parameter, the tied embedding included.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 (got {temperature})")
    B, device = tokens_BL.shape[0], tokens_BL.device
    prompt_len_B = prompt_len_B.to(device)
    if B == 0 or T == 0:
        empty = torch.zeros(B, T, device=device)
        return empty, (empty.clone() if with_entropy else None)
    pos_BT = prompt_len_B[:, None] - 1 + torch.arange(T, device=device)[None, :]
    if int(prompt_len_B.min()) < 1:
        raise ValueError("every row needs a prompt of at least one token")
    # The last response token is never an input: the forward only needs columns up to its predictor.
    L = min(tokens_BL.shape[1], int(pos_BT[:, -1].max()) + 1)
    pos_BT = pos_BT.clamp(max=L - 1)
    target_BT = tokens_BL.gather(1, (pos_BT + 1).clamp(max=tokens_BL.shape[1] - 1))
    valid_BT = torch.ones(B, T, dtype=torch.bool, device=device) if mask_BT is None else mask_BT.to(device).bool()

    head = _plain_linear_head(model)
    if head is None:
        return _direct(model, tokens_BL[:, :L], pos_BT, target_BT, valid_BT, temperature, with_entropy)
    hidden_BLH = model.get_decoder()(input_ids=tokens_BL[:, :L], use_cache=False).last_hidden_state
    if mask_BT is None:
        hidden_NH = hidden_BLH.gather(1, pos_BT[:, :, None].expand(-1, -1, hidden_BLH.shape[-1])).flatten(0, 1)
        target_N = target_BT.flatten()
    else:
        # Only real response tokens reach the head; row-major order matches valid_BT's True entries.
        row_N, col_N = valid_BT.nonzero(as_tuple=True)
        hidden_NH = hidden_BLH[row_N, pos_BT[row_N, col_N]]
        target_N = target_BT[row_N, col_N]
    if chunk_tokens is None:
        chunk_tokens = max(1, DEFAULT_CHUNK_LOGITS // head.out_features)
    logp_N, entropy_N = ChunkedHeadLogprobs.apply(hidden_NH, head.weight, head.bias, target_N,
                                                  float(temperature), bool(with_entropy), int(chunk_tokens))
    logp_BT = _scatter_rows(logp_N, valid_BT, mask_BT is None)
    entropy_BT = _scatter_rows(entropy_N, valid_BT, mask_BT is None) if with_entropy else None
    return logp_BT, entropy_BT


def _scatter_rows(values_N: torch.Tensor, valid_BT: torch.Tensor, dense: bool) -> torch.Tensor:
    if dense:
        return values_N.view(valid_BT.shape)
    out_BT = values_N.new_zeros(valid_BT.shape)
    return out_BT.masked_scatter(valid_BT, values_N)


def _direct(model, tokens_BL, pos_BT, target_BT, valid_BT, temperature, with_entropy):
    """Full logits from the model's own forward: for heads that are not a plain linear layer."""
    logits_BLV = model(input_ids=tokens_BL, use_cache=False).logits
    z_BTV = logits_BLV.gather(1, pos_BT[:, :, None].expand(-1, -1, logits_BLV.shape[-1])).float() / temperature
    logp_BT, entropy_BT = _logp_entropy(z_BTV, target_BT, with_entropy)
    zero = torch.zeros((), device=logp_BT.device)
    logp_BT = torch.where(valid_BT, logp_BT, zero)
    return logp_BT, (torch.where(valid_BT, entropy_BT, zero) if with_entropy else None)


def _logp_entropy(z_NV: torch.Tensor, target_N: torch.Tensor, with_entropy: bool):
    lse_N = torch.logsumexp(z_NV, dim=-1)
    logp_N = z_NV.gather(-1, target_N[..., None]).squeeze(-1) - lse_N
    if not with_entropy:
        return logp_N, None
    return logp_N, lse_N - (torch.softmax(z_NV, dim=-1) * z_NV).sum(-1)


class ChunkedHeadLogprobs(torch.autograd.Function):
    """(logp_N, entropy_N) of a linear head over the full vocabulary, never holding more than one chunk of logits.

    Backward recomputes each chunk's logits z (temperature-scaled) and p = softmax(z):
        ∂logp/∂z = onehot(y) − p
        ∂H/∂z    = −p ⊙ (z − Σ_v p_v z_v)
    then ∂/∂h = (∂/∂z / temperature) · W and ∂/∂W = (∂/∂z / temperature)ᵀ · h, accumulated over chunks.
    """

    @staticmethod
    def forward(ctx, hidden_NH, weight_VH, bias_V, target_N, temperature, with_entropy, chunk_tokens):
        N = hidden_NH.shape[0]
        logp_N = torch.empty(N, dtype=torch.float32, device=hidden_NH.device)
        lse_N = torch.empty_like(logp_N)
        entropy_N = torch.empty_like(logp_N) if with_entropy else None
        for start in range(0, N, chunk_tokens):
            chunk = slice(start, start + chunk_tokens)
            z_CV = _chunk_logits(hidden_NH[chunk], weight_VH, bias_V, temperature)
            lse_N[chunk] = torch.logsumexp(z_CV, dim=-1)
            logp_N[chunk] = z_CV.gather(-1, target_N[chunk, None]).squeeze(-1) - lse_N[chunk]
            if with_entropy:
                p_CV = torch.exp(z_CV - lse_N[chunk, None])
                entropy_N[chunk] = lse_N[chunk] - (p_CV * z_CV).sum(-1)
        ctx.save_for_backward(hidden_NH, weight_VH, bias_V, target_N, lse_N)
        ctx.settings = (temperature, with_entropy, chunk_tokens)
        return logp_N, entropy_N

    @staticmethod
    def backward(ctx, grad_logp_N, grad_entropy_N):
        hidden_NH, weight_VH, bias_V, target_N, lse_N = ctx.saved_tensors
        temperature, with_entropy, chunk_tokens = ctx.settings
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h_NH = torch.empty_like(hidden_NH) if need_h else None
        grad_w_VH = torch.zeros_like(weight_VH, dtype=torch.float32) if need_w else None
        grad_b_V = torch.zeros_like(bias_V, dtype=torch.float32) if need_b else None
        for start in range(0, hidden_NH.shape[0], chunk_tokens):
            chunk = slice(start, start + chunk_tokens)
            h_CH = hidden_NH[chunk]
            z_CV = _chunk_logits(h_CH, weight_VH, bias_V, temperature)
            p_CV = torch.exp(z_CV - lse_N[chunk, None])
            # ∂/∂z of logp: onehot − p, written in place over p to keep one V-sized buffer per chunk.
            grad_z_CV = _grad_logits(z_CV, p_CV, target_N[chunk], grad_logp_N[chunk],
                                     grad_entropy_N[chunk] if (with_entropy and grad_entropy_N is not None) else None)
            grad_z_CV.div_(temperature)
            if need_h:
                grad_h_NH[chunk] = (grad_z_CV.to(weight_VH.dtype) @ weight_VH).to(hidden_NH.dtype)
            if need_w:
                grad_w_VH.addmm_(grad_z_CV.t(), h_CH.float())
            if need_b:
                grad_b_V += grad_z_CV.sum(0)
        grad_w_VH = grad_w_VH.to(weight_VH.dtype) if need_w else None
        grad_b_V = grad_b_V.to(bias_V.dtype) if need_b else None
        return grad_h_NH, grad_w_VH, grad_b_V, None, None, None, None


def _chunk_logits(h_CH, weight_VH, bias_V, temperature) -> torch.Tensor:
    z_CV = F.linear(h_CH, weight_VH, bias_V).float()
    return z_CV.div_(temperature) if temperature != 1.0 else z_CV


def _grad_logits(z_CV, p_CV, target_C, grad_logp_C, grad_entropy_C):
    """g_logp·(onehot(y) − p) + g_H·(−p ⊙ (z − E_p[z])), reusing p's buffer."""
    grad_z_CV = p_CV
    if grad_entropy_C is not None:
        mean_z_C = (p_CV * z_CV).sum(-1, keepdim=True)
        # −p(z − E[z])·g_H − p·g_logp  =  −p · ((z − E[z])·g_H + g_logp)
        scale_CV = (z_CV - mean_z_C).mul_(grad_entropy_C[:, None]).add_(grad_logp_C[:, None])
        grad_z_CV = p_CV.mul_(scale_CV).neg_()
    else:
        grad_z_CV = p_CV.mul_(-grad_logp_C[:, None])
    grad_z_CV.scatter_add_(-1, target_C[:, None], grad_logp_C[:, None])
    return grad_z_CV


def _plain_linear_head(model: torch.nn.Module) -> torch.nn.Linear | None:
    """The LM head when logits are exactly `head(decoder(x).last_hidden_state)`, else None (use the direct path).

    Checked by structure, by config, and once per model by comparing with the model's own forward on 3 tokens.
    """
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if not isinstance(head, torch.nn.Linear) or not hasattr(model, "get_decoder"):
        return None
    config = getattr(model, "config", None)
    if any(getattr(config, name, None) not in (None, 1, 1.0) for name in _LOGIT_TRANSFORM_FIELDS):
        return None
    if model not in _head_cache:
        _head_cache[model] = _head_matches_forward(model, head)
    return head if _head_cache[model] else None


@torch.no_grad()
def _head_matches_forward(model: torch.nn.Module, head: torch.nn.Linear) -> bool:
    device = head.weight.device
    probe_1L = torch.arange(3, device=device)[None, :] % head.out_features
    was_training = model.training
    model.eval()
    try:
        expected = model(input_ids=probe_1L, use_cache=False).logits.float()
        got = head(model.get_decoder()(input_ids=probe_1L, use_cache=False).last_hidden_state).float()
    except (AttributeError, TypeError, ValueError):
        return False
    finally:
        model.train(was_training)
    return expected.shape == got.shape and torch.allclose(expected, got, rtol=1e-4, atol=1e-4)
