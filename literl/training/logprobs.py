"""Token log-probs (and entropies) of response tokens under a causal LM, with the LM head applied in chunks.

    z_t      = lm_head(h_t) / temperature                     (fp32, full vocabulary)
    logp_t   = z_t[y_t] − logsumexp(z_t)
    H_t      = logsumexp(z_t) − Σ_v softmax(z_t)_v · z_t,v     (algorithms.md §5)

where h_t is the decoder's hidden state at the position that predicts response token y_t. The decoder body
runs once on the whole batch; the head then runs over tiles of (response positions × vocabulary entries) with
an online logsumexp, and its backward recomputes each tile's logits instead of storing them, so a step never
holds batch × length × vocab fp32 logits (20 GB for 64 × 512 tokens at Qwen's 151,936-token vocabulary), in
forward or backward.

Models whose logits are not a plain linear map of the decoder output (logit soft-capping, logit scaling, a
custom head) take the direct path: a full forward, then log_softmax.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch

from literl.training import shared_prompts
from literl.training.replay import replay_source
from literl.rollout.static_kv import fits_attention_window

# Accelerators: logits per tile (fp32 elements); 2^25 is 128 MB, two of which are alive at once in backward.
DEFAULT_CHUNK_LOGITS = 1 << 25
# CPU: vocabulary columns per tile, at least this many tokens, and about this many logits (4 MB) per tile.
CPU_VOCAB_BLOCK = 4096
CPU_MIN_TILE_TOKENS = 256
CPU_TILE_LOGITS = 1 << 20
# Rows are grouped by length for the decoder forward (when `mask_BT` says where responses end); a group costs
# about this many tokens' worth of compute in fixed overhead (CPU, benchmark model), and there are at most:
BUCKET_OVERHEAD_TOKENS = 512
MAX_BUCKETS = 8
# CPU: a decoder forward takes at most about this many padded tokens, so that a layer's element-wise work
# (norms, rotary, SiLU, residuals) on its [tokens × FFN] activations runs in cache: ~5% less update time on the
# benchmark workload than one 6k-token forward (1 thread).
CPU_FORWARD_TOKENS = 1024
# A replayed forward runs all rows in one pass while rows × longest row is at most this many tokens: its tokens
# are then consecutive record rows, read in place (`replay.replayed_responses`), and each weight gradient is one
# product. Benchmark workload (128 × ≤63 tokens), alternating A/B: update −8% compiled, −2% eager against
# by-length groups. Above it, rows are grouped as for the computed forward (bounded activations).
REPLAY_ONE_PASS_TOKENS = 16384
# Config fields that mean the logits are not `lm_head(hidden)` (Gemma 2, Cohere, Granite, ...).
_LOGIT_TRANSFORM_FIELDS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale")

_head_cache: "weakref.WeakKeyDictionary[torch.nn.Module, bool]" = weakref.WeakKeyDictionary()


def token_logprobs(model: torch.nn.Module, tokens_BL: torch.Tensor, prompt_len_B: torch.Tensor, T: int, *,
                   temperature: float = 1.0, with_entropy: bool = False, chunk_tokens: int | None = None,
                   vocab_block: int | None = None, mask_BT: torch.Tensor | None = None, compiled: bool = False,
                   extras: dict | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log π(y_t) of response tokens t < T of each row, and the entropy of π at those positions if asked.

    Layout as in `literl.batch`: row b holds its prompt then its response, right-padded; response token t is
    `tokens_BL[b, prompt_len_B[b] + t]`. Returns fp32 (logp_BT, entropy_BT or None). Positions past a row's end
    hold finite values of no meaning, or 0 where `mask_BT` is given: the head then skips them, which saves the
    vocabulary-sized matmul on padding. The head's logits exist one tile of `chunk_tokens` × `vocab_block` at a
    time (defaults in `Tiling.default`), which bounds its memory whatever the batch. Gradients reach every
    parameter, the tied embedding included. `compiled=True` runs the decoder layers of the shared-prompt path
    through `torch.compile` (`shared_prompts.compiled_decoder_layer`). `extras` are the rows' per-token extras
    (`literl.batch`): when they hold a rollout record that still matches the model's weights, the response
    tokens' projections are replayed from it instead of computed (`literl.training.replay`); same values,
    gradients within float rounding.
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
    if mask_BT is None:
        hidden_BLH = model.get_decoder()(input_ids=tokens_BL[:, :L], use_cache=False).last_hidden_state
        hidden_NH = hidden_BLH.gather(1, pos_BT[:, :, None].expand(-1, -1, hidden_BLH.shape[-1])).flatten(0, 1)
        target_N = target_BT.flatten()
    else:
        hidden_NH = _response_hidden(model, tokens_BL, prompt_len_B, pos_BT, valid_BT, compiled,
                                     replay_source(extras, model))
        target_N = target_BT[valid_BT]
    tiling = Tiling.default(head.out_features, device, chunk_tokens=chunk_tokens, vocab_block=vocab_block)
    logp_N, entropy_N = ChunkedHeadLogprobs.apply(hidden_NH, head.weight, head.bias, target_N,
                                                  float(temperature), bool(with_entropy), tiling)
    logp_BT = _scatter_rows(logp_N, valid_BT, mask_BT is None)
    entropy_BT = _scatter_rows(entropy_N, valid_BT, mask_BT is None) if with_entropy else None
    return logp_BT, entropy_BT


def _response_hidden(model, tokens_BL, prompt_len_B, pos_BT, valid_BT, compiled: bool, replay) -> torch.Tensor:
    """Hidden states at the real response positions (valid_BT's True entries, row-major): a prompt that several
    rows share runs once (`shared_prompts`), with the responses replayed from the rollout when a record allows
    it, else whole rows run, grouped by length."""
    replay = replay if replay is not None and shared_prompts.runs_layer_by_layer(model) else None
    prompts = shared_prompts.shared_prompts(tokens_BL, prompt_len_B, only_if_shared=replay is None)
    # The shared path attends to the whole prompt cache: exact only within a sliding attention window.
    if (prompts is not None and fits_attention_window(model, tokens_BL.shape[1])
            and shared_prompts.matches_plain_forward(model)):
        return shared_prompts.response_hidden(model, tokens_BL, prompt_len_B, valid_BT, prompts,
                                              buckets=forward_groups if replay is None else replay_groups,
                                              compiled=compiled, replay=replay)
    return _response_hidden_by_length(model.get_decoder(), tokens_BL, pos_BT, valid_BT)


def _response_hidden_by_length(decoder, tokens_BL, pos_BT, valid_BT) -> torch.Tensor:
    """Hidden states at the real response positions (valid_BT's True entries, row-major), with the decoder run
    on groups of rows of similar length, each cut to its own longest row: no compute on most of the padding."""
    needed_B = torch.where(valid_BT, pos_BT + 1, torch.zeros_like(pos_BT)).amax(-1).clamp(min=1)
    parts, order = [], []
    flat_index_BT = torch.full_like(pos_BT, -1)
    flat_index_BT[valid_BT] = torch.arange(int(valid_BT.sum()), device=pos_BT.device)
    for rows_R in forward_groups(needed_B):
        width = int(needed_B[rows_R].max())
        hidden_RLH = decoder(input_ids=tokens_BL[rows_R, :width], use_cache=False).last_hidden_state
        valid_RT = valid_BT[rows_R]
        row_M, col_M = valid_RT.nonzero(as_tuple=True)
        parts.append(hidden_RLH[row_M, pos_BT[rows_R][row_M, col_M]])
        order.append(flat_index_BT[rows_R][valid_RT])
    hidden_MH, order_M = torch.cat(parts), torch.cat(order)
    return hidden_MH[torch.argsort(order_M)]


def forward_groups(length_B: torch.Tensor) -> list[torch.Tensor]:
    """Rows of each decoder forward: `length_buckets`, and on CPU each bucket cut, longest rows first, into
    forwards of at most CPU_FORWARD_TOKENS padded tokens."""
    buckets = length_buckets(length_B)
    if length_B.device.type != "cpu":
        return buckets
    groups = []
    for rows in buckets:
        rows = rows[torch.argsort(length_B[rows], descending=True, stable=True)]
        start = 0
        while start < len(rows):
            count = max(1, CPU_FORWARD_TOKENS // max(int(length_B[rows[start]]), 1))
            groups.append(rows[start:start + count])
            start += count
    return groups


def replay_groups(length_B: torch.Tensor) -> list[torch.Tensor]:
    """Rows of each replayed forward: all of them while rows × longest row ≤ REPLAY_ONE_PASS_TOKENS, else
    `forward_groups`."""
    if length_B.numel() * int(length_B.max()) <= REPLAY_ONE_PASS_TOKENS:
        return [torch.arange(length_B.shape[0], device=length_B.device)]
    return forward_groups(length_B)


def length_buckets(length_B: torch.Tensor, *, overhead_tokens: int = BUCKET_OVERHEAD_TOKENS,
                   max_buckets: int = MAX_BUCKETS) -> list[torch.Tensor]:
    """Split rows into groups of similar length minimising Σ_groups (rows × longest row + overhead_tokens).

    Over the distinct lengths u_0 > u_1 > … with n_j rows of length ≥ u_j (cumulative), a group covering
    lengths j..i−1 costs (n_i − n_j)·u_j + overhead, and cost_k[i] = min_j cost_{k−1}[j] + group(j, i): an
    exact dynamic programme, vectorised over j (at most a few hundred distinct lengths).
    """
    lengths_B = length_B.cpu()
    distinct_U, count_U = torch.unique(lengths_B, sorted=True, return_counts=True)
    distinct_U, count_U = distinct_U.flip(0).double(), count_U.flip(0).double()
    U = distinct_U.shape[0]
    rows_before_I = torch.cat([torch.zeros(1, dtype=torch.float64), count_U.cumsum(0)])
    i_I, j_J = torch.arange(U + 1), torch.arange(U)
    group_JI = (rows_before_I[None, :] - rows_before_I[:U, None]) * distinct_U[:, None] + overhead_tokens
    group_JI = group_JI.masked_fill(i_I[None, :] <= j_J[:, None], float("inf"))
    cost_I = torch.full((U + 1,), float("inf"), dtype=torch.float64)
    cost_I[0] = 0.0
    costs, splits = [], []
    for _ in range(max_buckets):
        total_JI = cost_I[:U, None] + group_JI
        # amin + argmin: Tensor.min(dim) takes ~17 ms per call on a busy 2-thread CPU (its parallel kernel)
        best_I, split_I = total_JI.amin(dim=0), total_JI.argmin(dim=0)
        cost_I = torch.cat([torch.zeros(1, dtype=torch.float64), best_I[1:]])
        costs.append(float(best_I[U]))
        splits.append(split_I)
    bounds, i, k = [], U, min(range(max_buckets), key=costs.__getitem__)
    while i > 0:   # cost_k[0] = 0 for every k, so a path may use fewer than k + 1 groups and stop early
        j = int(splits[k][i])
        bounds.append((float(distinct_U[i - 1]), float(distinct_U[j])))
        i, k = j, k - 1
    return [torch.nonzero((lengths_B >= low) & (lengths_B <= high)).flatten().to(length_B.device)
            for low, high in reversed(bounds)]


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


@dataclass(frozen=True)
class Tiling:
    """Tile of the head's logits computed at once: `tokens` response positions × `vocab` vocabulary entries."""

    tokens: int
    vocab: int

    @staticmethod
    def default(vocab_size: int, device: torch.device, *, chunk_tokens: int | None = None,
                vocab_block: int | None = None) -> "Tiling":
        """CPU: tiles of a few MB, so that the element-wise work on a tile runs in cache (on a memory-poor host
        this halves the head's time against whole-vocabulary chunks). Accelerators: whole-vocabulary rows,
        chunked to DEFAULT_CHUNK_LOGITS so that few tiles (kernel launches) are needed."""
        if device.type == "cpu":
            vocab = min(vocab_size, vocab_block or CPU_VOCAB_BLOCK)
            tokens = chunk_tokens or max(CPU_MIN_TILE_TOKENS, CPU_TILE_LOGITS // vocab)
        else:
            vocab = min(vocab_size, vocab_block or vocab_size)
            tokens = chunk_tokens or max(1, DEFAULT_CHUNK_LOGITS // vocab)
        return Tiling(tokens=max(1, int(tokens)), vocab=max(1, int(vocab)))


class ChunkedHeadLogprobs(torch.autograd.Function):
    """(logp_N, entropy_N) of a linear head over the full vocabulary, never holding more than one tile of logits.

    Forward keeps, per token, an online logsumexp over vocabulary tiles: the running max m, Σ e^(z−m) and
    Σ e^(z−m)·z, so that lse = m + log Σ e^(z−m) and E_p[z] = Σ e^(z−m)·z / Σ e^(z−m), and H = lse − E_p[z].
    Backward recomputes each tile's logits z (temperature-scaled) and p = e^(z − lse):
        ∂logp/∂z = onehot(y) − p
        ∂H/∂z    = −p ⊙ (z − E_p[z])
    then ∂/∂h = (∂/∂z / temperature) · W and ∂/∂W = (∂/∂z / temperature)ᵀ · h, accumulated tile by tile.
    """

    @staticmethod
    def forward(ctx, hidden_NH, weight_VH, bias_V, target_N, temperature, with_entropy, tiling):
        N, V = hidden_NH.shape[0], weight_VH.shape[0]
        f32 = dict(dtype=torch.float32, device=hidden_NH.device)
        max_N = torch.full((N,), float("-inf"), **f32)
        sum_exp_N, sum_exp_z_N, target_z_N = (torch.zeros(N, **f32) for _ in range(3))
        tile_buffer = torch.empty(min(N, tiling.tokens) * min(V, tiling.vocab), **f32)
        for v0 in range(0, V, tiling.vocab):
            weight_WH = weight_VH[v0:v0 + tiling.vocab]
            bias_W = None if bias_V is None else bias_V[v0:v0 + tiling.vocab]
            for n0 in range(0, N, tiling.tokens):
                rows = slice(n0, n0 + tiling.tokens)
                z_CW = _tile_logits(hidden_NH[rows], weight_WH, bias_W, temperature, tile_buffer)
                in_tile_C, local_C = _target_in_tile(target_N[rows], v0, z_CW.shape[1])
                target_z_N[rows] = torch.where(in_tile_C, z_CW.gather(1, local_C[:, None]).squeeze(1),
                                               target_z_N[rows])
                new_max_C = torch.maximum(max_N[rows], z_CW.amax(-1))
                rescale_C = torch.exp(max_N[rows] - new_max_C)
                max_N[rows] = new_max_C
                exp_CW = torch.exp(z_CW - new_max_C[:, None]) if with_entropy else z_CW.sub_(new_max_C[:, None]).exp_()
                sum_exp_N[rows] = sum_exp_N[rows] * rescale_C + exp_CW.sum(-1)
                if with_entropy:
                    sum_exp_z_N[rows] = sum_exp_z_N[rows] * rescale_C + exp_CW.mul_(z_CW).sum(-1)
        lse_N = max_N + sum_exp_N.log()
        mean_z_N = sum_exp_z_N / sum_exp_N
        ctx.save_for_backward(hidden_NH, weight_VH, bias_V, target_N, lse_N, mean_z_N)
        ctx.settings = (temperature, with_entropy, tiling)
        return target_z_N - lse_N, (lse_N - mean_z_N if with_entropy else None)

    @staticmethod
    def backward(ctx, grad_logp_N, grad_entropy_N):
        hidden_NH, weight_VH, bias_V, target_N, lse_N, mean_z_N = ctx.saved_tensors
        temperature, with_entropy, tiling = ctx.settings
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        N, V = hidden_NH.shape[0], weight_VH.shape[0]
        grad_logp_N = grad_logp_N.float()
        grad_entropy_N = grad_entropy_N.float() if (with_entropy and grad_entropy_N is not None) else None
        grad_h_NH = torch.zeros(hidden_NH.shape, dtype=torch.float32, device=hidden_NH.device)
        grad_w_VH = torch.zeros(weight_VH.shape, dtype=torch.float32, device=weight_VH.device) if need_w else None
        grad_b_V = torch.zeros(V, dtype=torch.float32, device=weight_VH.device) if need_b else None
        tile_buffer = torch.empty(min(N, tiling.tokens) * min(V, tiling.vocab), dtype=torch.float32,
                                  device=hidden_NH.device)
        for v0 in range(0, V, tiling.vocab):
            block = slice(v0, v0 + tiling.vocab)
            weight_WH = weight_VH[block]
            for n0 in range(0, N, tiling.tokens):
                rows = slice(n0, n0 + tiling.tokens)
                h_CH = hidden_NH[rows]
                z_CW = _tile_logits(h_CH, weight_WH, None if bias_V is None else bias_V[block], temperature,
                                    tile_buffer)
                grad_z_CW = _tile_grad_logits(z_CW, lse_N[rows], mean_z_N[rows], target_N[rows], v0,
                                              grad_logp_N[rows],
                                              None if grad_entropy_N is None else grad_entropy_N[rows])
                grad_z_CW.div_(temperature)
                _accumulate_head_grads(grad_z_CW, h_CH, weight_WH, grad_h_NH[rows],
                                       grad_w_VH[block] if need_w else None)
                if need_b:
                    grad_b_V[block] += grad_z_CW.sum(0)
        return (grad_h_NH.to(hidden_NH.dtype) if need_h else None,
                grad_w_VH.to(weight_VH.dtype) if need_w else None,
                grad_b_V.to(bias_V.dtype) if need_b else None, None, None, None, None)


def _tile_logits(h_CH, weight_WH, bias_W, temperature, buffer) -> torch.Tensor:
    """z = (h Wᵀ + b) / temperature in fp32, written into `buffer` (reused: no allocation per tile)."""
    C, W = h_CH.shape[0], weight_WH.shape[0]
    z_CW = buffer[:C * W].view(C, W)
    if h_CH.dtype == torch.float32 and weight_WH.dtype == torch.float32:
        torch.mm(h_CH, weight_WH.t(), out=z_CW)
    else:
        z_CW.copy_(h_CH @ weight_WH.t())
    if bias_W is not None:
        z_CW += bias_W
    return z_CW.div_(temperature) if temperature != 1.0 else z_CW


def _accumulate_head_grads(grad_z_CW, h_CH, weight_WH, grad_h_CH, grad_w_WH) -> None:
    """grad_h += ∂z · W and grad_W += ∂zᵀ · h into fp32 accumulators; the matmuls run in the weights' dtype
    (as autograd would for a low-precision linear layer), never on an fp32 copy of the weights."""
    if weight_WH.dtype == torch.float32 and h_CH.dtype == torch.float32:
        grad_h_CH.addmm_(grad_z_CW, weight_WH)
        if grad_w_WH is not None:
            grad_w_WH.addmm_(grad_z_CW.t(), h_CH)
        return
    grad_z_CW = grad_z_CW.to(weight_WH.dtype)
    grad_h_CH += (grad_z_CW @ weight_WH).float()
    if grad_w_WH is not None:
        grad_w_WH += (grad_z_CW.t() @ h_CH.to(weight_WH.dtype)).float()


def _target_in_tile(target_C, v0: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(whether each target falls in vocabulary columns [v0, v0 + width), its column there, clamped)."""
    local_C = target_C - v0
    return (local_C >= 0) & (local_C < width), local_C.clamp(0, width - 1)


def _tile_grad_logits(z_CW, lse_C, mean_z_C, target_C, v0, grad_logp_C, grad_entropy_C) -> torch.Tensor:
    """g_logp·(onehot(y) − p) + g_H·(−p ⊙ (z − E_p[z])) on one tile, overwriting z's buffer."""
    p_CW = torch.exp(z_CW - lse_C[:, None])
    if grad_entropy_C is None:
        grad_z_CW = p_CW.mul_(-grad_logp_C[:, None])
    else:
        # −p·g_logp − p·(z − E[z])·g_H  =  −p · ((z − E[z])·g_H + g_logp)
        scale_CW = z_CW.sub_(mean_z_C[:, None]).mul_(grad_entropy_C[:, None]).add_(grad_logp_C[:, None])
        grad_z_CW = p_CW.mul_(scale_CW).neg_()
    in_tile_C, local_C = _target_in_tile(target_C, v0, z_CW.shape[1])
    return grad_z_CW.scatter_add_(1, local_C[:, None], (grad_logp_C * in_tile_C)[:, None])


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
