"""The update's forward replayed from the rollout's: no forward matmuls for response tokens.

In an on-policy update the policy's weights are those the rollout sampled with, so every projection output of
the training forward was already computed by a decode step and kept (`literl.rollout.recording`). Here each
layer is applied to a response token's residual stream with its projections *replayed*: their forward returns
the recorded output, and their backward is the usual one,

    y = x·Wᵀ + b      ∂L/∂x = g·W      ∂L/∂W = gᵀ·x      ∂L/∂b = Σ_tokens g

which needs the input x (norms, rotary and SiLU·up are cheap and recomputed from the recorded outputs) but never
the product x·Wᵀ itself. A response token then costs 4N matmul FLOPs in the update instead of 6N. Where the
record also keeps the attention's output and log-sum-exp (CPU, `recording.keeps_attention`), the attention's
forward is not run again either: `RecordedAttention` returns the recorded output and runs only the flash
kernel's backward, from the recomputed q/k/v and the recorded output and log-sum-exp. The residual stream is
the embedding plus the recorded outputs, so the hidden states, and hence the log-probs, are the rollout's own
(the decode computed them); gradients equal the plain path's within float rounding (tests/training/test_replay.py).

Prompts run as in `literl.training.shared_prompts` (each distinct prompt once, with autograd), and response
tokens attend to their prompt's keys and values as there. Without autograd (an old-log-prob pass before the
first optimizer step) only the residual additions are left: the response tokens' hidden states are the
embedding plus the recorded o and down outputs. `token_logprobs` takes this path only while the record is
valid and matches the model's current weights (`replay_source`), and falls back to the plain one otherwise.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from literl.compiled import compile_for_varying_sizes
from literl.rollout.recording import RECORD_KEY, RECORD_ROW_KEY, ForwardRecord
from literl.rollout.static_kv import rotate
from literl.training.shared_prompts import apply_norm, attention_bias, gather_distinct_rows, per_head


@dataclass(frozen=True)
class Replay:
    """A valid record and, for each response token of the rows at hand, its record row (−1: none)."""

    record: ForwardRecord
    row_BT: torch.Tensor


def replay_source(extras: dict | None, model: torch.nn.Module) -> Replay | None:
    """The batch's rollout record when it can stand in for the model's forward: still in its buffers and
    recorded with exactly the model's current weights; else None (the plain forward runs)."""
    if not extras:
        return None
    record, row_BT = extras.get(RECORD_KEY), extras.get(RECORD_ROW_KEY)
    if record is None or row_BT is None or not record.valid() or not record.matches(model):
        return None
    return Replay(record, row_BT)


class ReplayedProjections(torch.autograd.Function):
    """Projections that share their input x, with recorded outputs: forward returns y_MO (the concatenated
    outputs), backward gives ∂x = g·[W₁; W₂; …], ∂Wᵢ = gᵢᵀ·x, ∂bᵢ = Σ gᵢ. `params` is (W₁, b₁, W₂, b₂, …),
    a b None where the projection has no bias."""

    @staticmethod
    def forward(ctx, x_MI, y_MO, *params):
        ctx.save_for_backward(x_MI, *params)
        return y_MO.view_as(y_MO)

    @staticmethod
    def backward(ctx, grad_MO):
        x_MI, *params = ctx.saved_tensors
        weights, biases = params[0::2], params[1::2]
        weight_OI = weights[0] if len(weights) == 1 else torch.cat(weights)
        grad_x = grad_MO.mm(weight_OI) if ctx.needs_input_grad[0] else None
        grad_weight_OI = grad_MO.t().mm(x_MI)
        grads, start = [], 0
        for weight, bias in zip(weights, biases):
            rows = slice(start, start + weight.shape[0])
            grads.append(grad_weight_OI[rows])
            grads.append(grad_MO[:, rows].sum(0) if bias is not None else None)
            start += weight.shape[0]
        return (grad_x, None, *grads)


def _projections(x_MI: torch.Tensor, y_MO: torch.Tensor, *linears: torch.nn.Linear) -> torch.Tensor:
    params = [p for linear in linears for p in (linear.weight, linear.bias)]
    return ReplayedProjections.apply(x_MI, y_MO, *params)


def replayed_layer(layer: torch.nn.Module, hidden_MH: torch.Tensor, recorded: list[torch.Tensor],
                   cos_MD: torch.Tensor, sin_MD: torch.Tensor, prefix_keys: torch.Tensor, prefix_values: torch.Tensor,
                   slot_M: torch.Tensor, rows: int, width: int, bias_R1WS: torch.Tensor) -> torch.Tensor:
    """One decoder layer on m packed response tokens, given what the rollout recorded for them (`recorded`: its
    q/k/v, o, gate/up and down projection outputs, and where kept the attention's output and log-sum-exp),
    attending to their prompt's keys and values and to the earlier tokens of their row.

    Attention runs on the padded [rows, heads, width, D] layout (`slot_M` = row·width + column of each token,
    `bias_R1WS` the additive attention mask over prompt + response keys); everything else on the packed tokens,
    so no projection's backward computes on padding.
    """
    qkv_MF, o_MH, gate_up_MF, down_MH, *kept = recorded
    attn, mlp = layer.self_attn, layer.mlp
    D = attn.head_dim
    cos_M1D, sin_M1D = cos_MD[:, None], sin_MD[:, None]
    qkv_MF = _projections(apply_norm(layer.input_layernorm, hidden_MH), qkv_MF, attn.q_proj, attn.k_proj,
                          attn.v_proj)
    query_MF, key_MF, value_MF = qkv_MF.split(
        [attn.q_proj.out_features, attn.k_proj.out_features, attn.v_proj.out_features], dim=-1)
    query_MQD = rotate(per_head(query_MF, D, getattr(attn, "q_norm", None)), cos_M1D, sin_M1D)
    key_MKD = rotate(per_head(key_MF, D, getattr(attn, "k_norm", None)), cos_M1D, sin_M1D)
    value_MKD = value_MF.unflatten(-1, (-1, D))
    query, key, value = (_padded(x, slot_M, rows, width) for x in (query_MQD, key_MKD, value_MKD))
    keys, values = torch.cat([prefix_keys, key], dim=2), torch.cat([prefix_values, value], dim=2)
    if kept:
        attended_MF = RecordedAttention.apply(query, keys, values, *kept, slot_M, bias_R1WS, attn.scaling)
    else:
        out_RQWD = F.scaled_dot_product_attention(query, keys, values, attn_mask=bias_R1WS, scale=attn.scaling,
                                                  enable_gqa=True)
        attended_MF = gather_distinct_rows(out_RQWD.transpose(1, 2).flatten(0, 1).flatten(1), slot_M)
    hidden_MH = hidden_MH + _projections(attended_MF, o_MH, attn.o_proj)
    gate_up_MF = _projections(apply_norm(layer.post_attention_layernorm, hidden_MH), gate_up_MF, mlp.gate_proj,
                              mlp.up_proj)
    gate_MF, up_MF = gate_up_MF.chunk(2, dim=-1)
    return hidden_MH + _projections(mlp.act_fn(gate_MF) * up_MF, down_MH, mlp.down_proj)


def _padded(x_MHD: torch.Tensor, slot_M: torch.Tensor, rows: int, width: int, fill: float = 0.0) -> torch.Tensor:
    """Packed [m, heads, D] → padded [rows, heads, width, D] (`fill` where no token); [m, heads] → [rows, heads,
    width]."""
    padded = x_MHD.new_full((rows * width, *x_MHD.shape[1:]), fill).index_copy(0, slot_M, x_MHD)
    return padded.unflatten(0, (rows, width)).transpose(1, 2)


class RecordedAttention(torch.autograd.Function):
    """Attention of packed tokens whose output out_MF and log-sum-exp lse_MQ (per query head) the rollout
    recorded: forward returns out_MF; backward is the CPU flash kernel's backward on the padded layout,

        P = exp(s − lse),  s = scale · q·kᵀ + bias      ∂v = Pᵀ·g      ∂s = P ⊙ (g·vᵀ − rowsum(g ⊙ out))
        ∂q = scale · ∂s·k      ∂k = scale · ∂sᵀ·q

    which needs out and lse but not the forward itself. Padded query positions get lse = +∞ (P = 0 there) and a
    zero gradient, so they contribute nothing."""

    @staticmethod
    def forward(ctx, query_RQWD, keys_RKSD, values_RKSD, out_MF, lse_MQ, slot_M, bias_R1WS, scale):
        ctx.save_for_backward(query_RQWD, keys_RKSD, values_RKSD, out_MF, lse_MQ, slot_M, bias_R1WS)
        ctx.scale = scale
        return out_MF.view_as(out_MF)

    @staticmethod
    def backward(ctx, grad_MF):
        query_RQWD, keys_RKSD, values_RKSD, out_MF, lse_MQ, slot_M, bias_R1WS = ctx.saved_tensors
        R, Q, W, D = query_RQWD.shape
        out_RQWD = _padded(out_MF.view(-1, Q, D), slot_M, R, W)
        grad_RQWD = _padded(grad_MF.reshape(-1, Q, D), slot_M, R, W)
        lse_RQW = _padded(lse_MQ, slot_M, R, W, fill=float("inf")).contiguous()
        grads = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad_RQWD, query_RQWD, keys_RKSD, values_RKSD, out_RQWD, lse_RQW, 0.0, False, attn_mask=bias_R1WS,
            scale=ctx.scale)
        return (*grads, None, None, None, None, None)


def replayed_layers(decoder, hidden_MH: torch.Tensor, record_layers: list[tuple[torch.Tensor, ...]],
                    record_row_M: torch.Tensor | None, cos_MD: torch.Tensor, sin_MD: torch.Tensor,
                    prefix_kv: list[tuple[torch.Tensor, torch.Tensor]], slot_M: torch.Tensor, rows: int, width: int,
                    bias_R1WS: torch.Tensor) -> torch.Tensor:
    """Every layer (`replayed_layer`) and the final norm on m packed tokens: their recorded outputs are
    record_layers[l]'s rows record_row_M, or, with record_row_M None, those buffers as they are (slices of the
    record). A layer gathers its rows when it runs, so that only what its backward needs outlives it."""
    for layer, (prefix_keys, prefix_values), buffers in zip(decoder.layers, prefix_kv, record_layers):
        hidden_MH = replayed_layer(layer, hidden_MH, layer_rows(buffers, record_row_M), cos_MD, sin_MD, prefix_keys,
                                   prefix_values, slot_M, rows, width, bias_R1WS)
    return apply_norm(decoder.norm, hidden_MH)


@functools.cache
def compiled_replayed_layers():
    """`replayed_layers` through `torch.compile` (once per process; one graph for every bucket, with element-wise
    work fused across layer boundaries); a bucket with one row, one token, a width of one or a one-token prompt
    runs eagerly."""
    return compile_for_varying_sizes(
        replayed_layers, eager_when=lambda decoder, hidden_MH, record_layers, record_row_M, cos, sin, prefix_kv,
        slot_M, rows, width, bias: min(hidden_MH.shape[0], prefix_kv[0][0].shape[2], rows, width) < 2)


def record_slices(layers: list[tuple[torch.Tensor, ...]], record_row_M: torch.Tensor
                  ) -> tuple[list[tuple[torch.Tensor, ...]], torch.Tensor | None]:
    """(layers, rows) for `layer_rows`: when these record rows (ascending) are consecutive, each layer's buffers
    sliced to them (slices of the record itself) and rows None; else the buffers as they are and the rows to
    gather."""
    M, first = record_row_M.shape[0], int(record_row_M[0])
    if int(record_row_M[-1]) - first + 1 != M:
        return layers, record_row_M
    return [tuple(buffer.narrow(0, first, M) for buffer in layer) for layer in layers], None


def layer_rows(buffers: tuple[torch.Tensor, ...], record_row_M: torch.Tensor | None) -> list[torch.Tensor]:
    """One layer's recorded outputs for the tokens: its buffers' rows record_row_M, or the buffers themselves when
    record_row_M is None (already sliced to the tokens, `record_slices`)."""
    return list(buffers) if record_row_M is None else [buffer.index_select(0, record_row_M) for buffer in buffers]


def replayed_responses(decoder, ids_RW: torch.Tensor, positions_RW: torch.Tensor, prompt_real_RP: torch.Tensor,
                       prefix_kv: list[tuple[torch.Tensor, torch.Tensor]], fed_RW: torch.Tensor,
                       record_row_RW: torch.Tensor, record: ForwardRecord, *, compiled: bool = False
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(hidden_MH, row_M, column_M): the hidden states (final norm applied) of the fed response tokens of a bucket
    of rows (fed_RW's True entries: the tokens a decode step consumed, a prefix of each row), token i at
    (row_M[i], column_M[i]), from the record.

    Tokens run in the order of their record rows. When they are exactly a run of consecutive record rows (the
    update of a whole rollout batch in one bucket) each layer reads slices of the record itself, not gathered
    copies (with the one pass, `logprobs.replay_groups`: update −8% compiled, −2% eager on the benchmark workload
    against by-length groups, alternating A/B).
    """
    R, W = ids_RW.shape
    row_M, column_M = fed_RW.nonzero(as_tuple=True)
    record_row_M, by_record_M = torch.sort(record_row_RW[row_M, column_M])
    if bool((record_row_M < 0).any()):
        raise ValueError("a fed response token has no record row: the record does not cover this batch")
    row_M, column_M = row_M[by_record_M], column_M[by_record_M]
    hidden_MH = decoder.embed_tokens(ids_RW[row_M, column_M])
    if not torch.is_grad_enabled():
        # Values only (an old-log-prob pass): each layer adds its recorded o and down outputs to the residual
        # stream, so nothing but those additions and the final norm is left to compute.
        residual_adds, rows = record_slices([(layer[1], layer[3]) for layer in record.layers], record_row_M)
        for pair in residual_adds:      # each layer's (o, down) of its (qkv, o, gate_up, down, ...)
            o_MH, down_MH = layer_rows(pair, rows)
            hidden_MH = hidden_MH + o_MH + down_MH
        return apply_norm(decoder.norm, hidden_MH), row_M, column_M
    record_layers, rows = record_slices(record.layers, record_row_M)
    cos_MD, sin_MD = (x[0] for x in decoder.rotary_emb(hidden_MH[None], positions_RW[row_M, column_M][None]))
    run = compiled_replayed_layers() if compiled else replayed_layers
    hidden_MH = run(decoder, hidden_MH, record_layers, rows, cos_MD, sin_MD, prefix_kv, row_M * W + column_M, R, W,
                    attention_bias(prompt_real_RP, W, hidden_MH.dtype))
    return hidden_MH, row_M, column_M
