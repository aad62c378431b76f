"""The attention step of `literl.model.layer.decoder_layer`, one per kind of pass.

Each maker returns `attend(attn, query_NQD, key_NJD, value_NJD) -> attended_NF` for one layer (N the body's
leading shape, Q query heads, J key/value heads, F = Q·D, o_proj's input):

- `cached`: one decode step against a static KV cache (write this token's key and value at a cache column,
  attend over the columns written so far);
- `fixed`: the same step with every shape fixed (the column is a device tensor, the query attends to the whole
  cache, a bias hides the unwritten columns): one shape per batch size, what a CUDA graph captures;
- `dense`: a full forward over [rows, width] tokens, causal within them, optionally after a prefix of keys and
  values they all may attend to (their prompt's); optionally keeping each layer's own keys and values;
- `replayed`: packed tokens whose attention output (and, on CPU, its log-sum-exp) a rollout recorded: the
  forward returns the record, the backward is the attention's (`RecordedAttention`);
- `packed`: whole rows packed into one token stream without padding (`literl.model.packing`), each token attending
  to its own row's earlier tokens, through one of `PACKED_KERNELS`.

Grouped-query attention never repeats keys and values per query head: a static decode step views the query
heads sharing a key/value head as that head's Z "queries"; the dense forward passes `enable_gqa`.
"""

from __future__ import annotations

import contextlib
import functools
import dataclasses
import inspect
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from literl.model.kernels import gather_distinct_rows, padded

# The packed stream's attention kernels (`packed`); `literl.model.capabilities` picks one per model and device.
PACKED_KERNELS = ("varlen", "padded", "document_mask")


def cached(keys_RJSD: torch.Tensor, values_RJSD: torch.Tensor, bias_R11S: torch.Tensor, column: int,
           keep: tuple[torch.Tensor, torch.Tensor] | None = None):
    """Attention of one decode step (one token per row, query_RQD) at cache column `column`.

    `keep=(out_RF, lse_RQ)` (CPU only: a record's rows, `literl.model.record.keeps_attention`) also writes the
    output, one row per token, and the log-sum-exp per query head: the CPU flash kernel, which SDPA runs here
    anyway, gives both; the kept output is then o_proj's input (the kernel's own output is head-major)."""

    def attend(attn, query_RQD, key_RJD, value_RJD):
        keys_RJSD.narrow(2, column, 1).copy_(key_RJD[:, :, None])
        values_RJSD.narrow(2, column, 1).copy_(value_RJD[:, :, None])
        return _decode_attention(attn, query_RQD, keys_RJSD[:, :, :column + 1], values_RJSD[:, :, :column + 1],
                                 bias_R11S, keep)

    return attend


def fixed(keys_RJSD: torch.Tensor, values_RJSD: torch.Tensor, bias_R11S: torch.Tensor, column_1: torch.Tensor,
          keep: tuple[torch.Tensor, torch.Tensor] | None = None):
    """`cached` with every shape fixed: this token's key and value go to the cache column held by `column_1` (a
    one-element long tensor on the cache's device, so one captured or compiled step serves every column) and the
    query attends to all S columns, `bias_R11S` being −inf on the columns not written yet (and on left padding).
    Masked columns weigh exp(−inf) = 0, so the result is `cached`'s up to float rounding; unwritten columns must
    hold finite values (0 · NaN would be NaN), which `decode.FixedShapeDecoder` guarantees by zeroing its cache."""

    def attend(attn, query_RQD, key_RJD, value_RJD):
        keys_RJSD.index_copy_(2, column_1, key_RJD[:, :, None])
        values_RJSD.index_copy_(2, column_1, value_RJD[:, :, None])
        return _decode_attention(attn, query_RQD, keys_RJSD, values_RJSD, bias_R11S, keep)

    return attend


def _decode_attention(attn, query_RQD, keys_RJCD, values_RJCD, bias_R11C, keep):
    """One query token per row against C cached columns; the query heads sharing a key/value head become its Z
    "queries" (query head h = j·Z + z), so keys and values are never repeated per head."""
    R, D = query_RQD.shape[0], query_RQD.shape[-1]
    query_RJZD = query_RQD.view(R, keys_RJCD.shape[1], -1, D)
    if keep is None:
        out_RJZD = F.scaled_dot_product_attention(query_RJZD, keys_RJCD, values_RJCD, attn_mask=bias_R11C,
                                                  scale=attn.scaling)
        return out_RJZD.reshape(R, -1)
    out_RJZD, lse_RJZ = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query_RJZD, keys_RJCD, values_RJCD, 0.0, False, attn_mask=bias_R11C, scale=attn.scaling)
    keep[0].copy_(out_RJZD.reshape(R, -1))
    keep[1].copy_(lse_RJZ.reshape(R, -1))
    return keep[0]


def rollout_attention(device: torch.device):
    """The context a rollout (prefill and decode steps) runs in: on CUDA, SDPA pinned to the memory-efficient
    kernel (it takes an additive bias; flash takes none, and cuDNN's kernel builds a new execution plan for every
    new shape on cu13 builds: once per step for a decode whose key length grows, and never allowed inside a
    capture), with the math kernel as the fallback for shapes it rejects. Elsewhere SDPA chooses as usual (on CPU
    its flash kernel takes the bias)."""
    if device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def dense(bias_R1WS: torch.Tensor, prefix: tuple[torch.Tensor, torch.Tensor] | None = None,
          kept: list | None = None):
    """Attention of [R, W] tokens (query_RWQD) over `prefix` (keys_RJXD, values_RJXD: X columns every row's
    tokens may attend to, e.g. its prompt) then over themselves; `bias_R1WS` is the additive mask over the
    S = X + W key columns. With a list `kept`, each call appends its own (keys_RJWD, values_RJWD)."""

    def attend(attn, query_RWQD, key_RWJD, value_RWJD):
        query_RQWD, key_RJWD, value_RJWD = query_RWQD.transpose(1, 2), key_RWJD.transpose(1, 2), \
            value_RWJD.transpose(1, 2)
        if kept is not None:
            kept.append((key_RJWD, value_RJWD))
        keys, values = (key_RJWD, value_RJWD) if prefix is None else (torch.cat([prefix[0], key_RJWD], dim=2),
                                                                      torch.cat([prefix[1], value_RJWD], dim=2))
        out_RQWD = F.scaled_dot_product_attention(query_RQWD, keys, values, attn_mask=bias_R1WS, scale=attn.scaling,
                                                  enable_gqa=True)
        return out_RQWD.transpose(1, 2).flatten(2)

    return attend


def replayed(prefix: tuple[torch.Tensor, torch.Tensor], slot_M: torch.Tensor, rows: int, width: int,
             bias_R1WS: torch.Tensor, kept: list[torch.Tensor]):
    """Attention of m packed response tokens (query_MQD; `slot_M` = row·width + column of each) over their row's
    prefix and the row's earlier tokens, on the padded [rows, heads, width, D] layout. `kept` is the record's
    (attention output, log-sum-exp) rows for the tokens (empty where the record does not keep them: then the
    attention is computed)."""

    def attend(attn, query_MQD, key_MJD, value_MJD):
        query, key, value = (padded(x, slot_M, rows, width) for x in (query_MQD, key_MJD, value_MJD))
        keys, values = torch.cat([prefix[0], key], dim=2), torch.cat([prefix[1], value], dim=2)
        if kept:
            return RecordedAttention.apply(query, keys, values, *kept, slot_M, bias_R1WS, attn.scaling)
        out_RQWD = F.scaled_dot_product_attention(query, keys, values, attn_mask=bias_R1WS, scale=attn.scaling,
                                                  enable_gqa=True)
        return gather_distinct_rows(out_RQWD.transpose(1, 2).flatten(0, 1).flatten(1), slot_M)

    return attend


class RecordedAttention(torch.autograd.Function):
    """Attention of packed tokens whose output out_MF and log-sum-exp lse_MQ (per query head) the rollout
    recorded: forward returns out_MF; backward is the CPU flash kernel's backward on the padded layout,

        P = exp(s − lse),  s = scale · q·kᵀ + bias      ∂v = Pᵀ·g      ∂s = P ⊙ (g·vᵀ − rowsum(g ⊙ out))
        ∂q = scale · ∂s·k      ∂k = scale · ∂sᵀ·q

    which needs out and lse but not the forward itself. Padded query positions get lse = +∞ (P = 0 there) and a
    zero gradient, so they contribute nothing."""

    @staticmethod
    def forward(ctx, query_RQWD, keys_RJSD, values_RJSD, out_MF, lse_MQ, slot_M, bias_R1WS, scale):
        ctx.save_for_backward(query_RQWD, keys_RJSD, values_RJSD, out_MF, lse_MQ, slot_M, bias_R1WS)
        ctx.scale = scale
        return out_MF.view_as(out_MF)

    @staticmethod
    def backward(ctx, grad_MF):
        query_RQWD, keys_RJSD, values_RJSD, out_MF, lse_MQ, slot_M, bias_R1WS = ctx.saved_tensors
        R, Q, W, D = query_RQWD.shape
        out_RQWD = padded(out_MF.view(-1, Q, D), slot_M, R, W)
        grad_RQWD = padded(grad_MF.reshape(-1, Q, D), slot_M, R, W)
        lse_RQW = padded(lse_MQ, slot_M, R, W, fill=float("inf")).contiguous()
        grads = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            grad_RQWD, query_RQWD, keys_RJSD, values_RJSD, out_RQWD, lse_RQW, 0.0, False, attn_mask=bias_R1WS,
            scale=ctx.scale)
        return (*grads, None, None, None, None, None)


def packed(stream, kernel: str):
    """Attention of a packed stream of rows (query_MQD; `stream` a `literl.model.packing.PackedRows` on the
    device), each token over its own row's tokens up to itself. Kernels:

        varlen         `torch.nn.attention.varlen.varlen_attn`: flash attention over the row starts, no padding, no
                       mask, grouped-query heads natively (CUDA, 16-bit inputs); with shared prompts each segment's
                       keys gathered (its prompt's, then its own) and the causal mask aligned at their ends
        padded         the stream scattered into right-padded [rows, width] rows, then SDPA with `is_causal` and
                       `enable_gqa` and no mask (with a mask, no flash kernel applies), on CUDA restricted to the
                       flash, memory-efficient and math kernels (cuDNN's builds a graph for every new shape); a
                       row's padding comes after its tokens, so causal attention never reaches it
        document_mask  SDPA over the whole stream with an [M, M] same-row-and-causal mask (with shared prompts: a
                       token's row and its prompt, up to its position): O(M²) memory, the reference the others are
                       tested against

    Under autocast the kernels take its dtype (a custom kernel like varlen's is not autocast by torch)."""
    def attend(attn, query_MQD, key_MJD, value_MJD):
        return _packed_kernel(kernel, stream, *_in_autocast_dtype(query_MQD, key_MJD, value_MJD),
                              attn.scaling).flatten(1)

    return attend


@torch.compiler.disable
def _packed_kernel(kernel: str, stream, query_MQD, key_MJD, value_MJD, scale: float) -> torch.Tensor:
    # Outside torch.compile's graphs (`packing.compiled_packed_layer`): the kernel is one fused kernel already, and
    # the stream's row starts and width, read here, would otherwise become guards (a recompile per micro-batch).
    run = {"varlen": _varlen, "padded": _padded_rows, "document_mask": _document_mask}[kernel]
    return run(stream, query_MQD, key_MJD, value_MJD, scale)


def _in_autocast_dtype(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    device_type = tensors[0].device.type
    if not torch.is_autocast_enabled(device_type):
        return tensors
    dtype = torch.get_autocast_dtype(device_type)
    return tuple(t.to(dtype) for t in tensors)


def _varlen(stream, query_MQD, key_MJD, value_MJD, scale: float) -> torch.Tensor:
    options = varlen_options(scale, query_MQD.shape[-1], grouped=query_MQD.shape[1] != key_MJD.shape[1])
    return varlen_segments(query_MQD, key_MJD, value_MJD, VarlenLayout.of(stream), options)


@dataclass(frozen=True)
class VarlenLayout:
    """What the varlen kernel needs of a packed stream (`packing.PackedRows`): the segments' starts and longest
    length, and with shared prompts where each segment's keys start and the longest, and where the stream's keys
    go among them (`own_slot_M`, `copy_slot_A`, `copy_source_A`; else None, 0)."""

    cu_R1: torch.Tensor
    width: int
    cu_key_R1: torch.Tensor | None = None
    key_width: int = 0
    own_slot_M: torch.Tensor | None = None
    copy_slot_A: torch.Tensor | None = None
    copy_source_A: torch.Tensor | None = None

    @classmethod
    def of(cls, stream) -> "VarlenLayout":
        """The layout of a `packing.PackedRows` (its fields of the same names)."""
        return cls(**{field.name: getattr(stream, field.name) for field in dataclasses.fields(cls)})


def varlen_segments(query_MQD, key_MJD, value_MJD, layout: VarlenLayout, options: dict) -> torch.Tensor:
    """Causal attention within each segment of a packed stream through `varlen_kernel`; with shared prompts each
    segment's keys and values gathered first (its prompt's, then its own: `gathered_keys`), more keys than
    queries, the causal mask aligned at the segment's end (flash attention's convention)."""
    if layout.cu_key_R1 is None:
        return varlen_kernel(query_MQD, key_MJD, value_MJD, layout.cu_R1, layout.cu_R1, layout.width, layout.width,
                             options)
    return varlen_kernel(query_MQD, gathered_keys(key_MJD, layout), gathered_keys(value_MJD, layout), layout.cu_R1,
                         layout.cu_key_R1, layout.width, layout.key_width, options)


def gathered_keys(x_MJD: torch.Tensor, layout: VarlenLayout) -> torch.Tensor:
    """x_MJD's rows in the segments' key order (`packing.PackedRows.key_Y`): every stream token's own key placed
    once, then the copies of prompt keys in the response segments. Its backward gathers the own keys' gradients
    and sums only the A copies'; `x_MJD.index_select(0, key_Y)` gave the same values, but its backward, an
    index_add with atomics over every key, cost as much as the shared prompts saved (bfloat16;
    results/benchmarks/2026-11-27_h100_compiled-update.md)."""
    keys = x_MJD.new_empty((x_MJD.shape[0] + layout.copy_slot_A.shape[0], *x_MJD.shape[1:]))
    keys = keys.index_copy(0, layout.own_slot_M, x_MJD)
    return keys.index_copy(0, layout.copy_slot_A, x_MJD.index_select(0, layout.copy_source_A))


def varlen_kernel(query_MQD, key_YJD, value_YJD, cu_R1: torch.Tensor, cu_key_R1: torch.Tensor, max_q: int,
                  max_k: int, options: dict) -> torch.Tensor:
    """`torch.nn.attention.varlen.varlen_attn`, causal within each segment (cu_R1, cu_key_R1: the segments' starts in
    the queries and keys, max_q, max_k: the longest), with `varlen_options`' keywords."""
    from torch.nn.attention.varlen import varlen_attn

    return varlen_attn(query_MQD, key_YJD, value_YJD, cu_R1, cu_key_R1, max_q, max_k, **options)


def varlen_in_graph(layout: VarlenLayout, options: dict):
    """`packed` with the varlen kernel, for a layer compiled whole (`packing.compiled_varlen_layer`): varlen_attn is
    a custom operator with a fake kernel, so torch.compile traces it as one node of the layer's graph, the
    segments' starts (and shared prompts' key positions) tensor inputs and the lengths symbolic ints; a layer is
    then one graph forward and one backward, not two graphs with an eager kernel between them (on an H100 the
    host's cost per layer call was what the GPU waited for: results/benchmarks/2026-11-27_h200_compiled-update.md)."""
    def attend(attn, query_MQD, key_MJD, value_MJD):
        return varlen_segments(*_in_autocast_dtype(query_MQD, key_MJD, value_MJD), layout, options).flatten(1)

    return attend


def varlen_options_of(attn: torch.nn.Module) -> dict:
    """`varlen_options` for a model's attention module (its scale, head size, and whether heads are grouped)."""
    grouped = getattr(attn, "num_key_value_groups", 1) != 1
    return varlen_options(attn.scaling, attn.head_dim, grouped)


@functools.cache
def _varlen_parameters() -> frozenset[str]:
    from torch.nn.attention.varlen import varlen_attn

    return frozenset(inspect.signature(varlen_attn).parameters)


def varlen_options(scale: float, head_dim: int, grouped: bool) -> dict:
    """varlen_attn's keywords for causal attention at `scale`, by what this torch's signature takes: torch 2.9
    had `is_causal`, later releases `window_size=(-1, 0)` and `scale`, 2.12 `enable_gqa` (the flash kernel under
    it takes fewer key/value heads than query heads either way; the capability probe checks the numbers)."""
    names = _varlen_parameters()
    options: dict = {"is_causal": True} if "is_causal" in names else {"window_size": (-1, 0)}
    if "scale" in names:
        options["scale"] = scale
    elif abs(scale * head_dim ** 0.5 - 1.0) > 1e-6:
        raise NotImplementedError("this torch's varlen_attn has no scale argument and the model's attention scale "
                                  "is not 1/sqrt(head_dim)")
    if grouped and "enable_gqa" in names:
        options["enable_gqa"] = True
    return options


def _padded_rows(stream, query_MQD, key_MJD, value_MJD, scale: float) -> torch.Tensor:
    if stream.shares_prompts:
        raise ValueError("the padded kernel attends within whole rows: pack them without shared prompts")
    R, W = stream.rows, stream.width
    query_RQWD, key_RJWD, value_RJWD = (padded(x, stream.slot_M, R, W) for x in (query_MQD, key_MJD, value_MJD))
    with _without_cudnn(query_MQD.device):
        out_RQWD = F.scaled_dot_product_attention(query_RQWD, key_RJWD, value_RJWD, is_causal=True, scale=scale,
                                                  enable_gqa=True)
    return gather_distinct_rows(out_RQWD.transpose(1, 2).flatten(0, 1), stream.slot_M)


def _without_cudnn(device: torch.device):
    if device.type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


def _document_mask(stream, query_MQD, key_MJD, value_MJD, scale: float) -> torch.Tensor:
    M = query_MQD.shape[0]
    if stream.shares_prompts:
        # A token sees the keys of its segment (its prompt's and its own) up to its own position in the row.
        segment_M = torch.searchsorted(stream.cu_R1[1:].long(), torch.arange(M, device=query_MQD.device), right=True)
        key_segment_Y = torch.searchsorted(stream.cu_key_R1[1:].long(), torch.arange(len(stream.key_Y),
                                                                                 device=query_MQD.device), right=True)
        member_RM = torch.zeros(stream.rows, M, dtype=torch.bool, device=query_MQD.device)
        member_RM[key_segment_Y, stream.key_Y] = True
        allowed_MM = member_RM[segment_M] & (stream.position_M[None, :] <= stream.position_M[:, None])
    else:
        causal_MM = torch.ones(M, M, dtype=torch.bool, device=query_MQD.device).tril()
        allowed_MM = causal_MM & (stream.row_M[:, None] == stream.row_M[None, :])
    out_1QMD = F.scaled_dot_product_attention(query_MQD.transpose(0, 1)[None], key_MJD.transpose(0, 1)[None],
                                              value_MJD.transpose(0, 1)[None], attn_mask=allowed_MM, scale=scale,
                                              enable_gqa=True)
    return out_1QMD[0].transpose(0, 1)


def causal_bias(prefix_real_RX: torch.Tensor, width: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive attention mask [R, 1, W, X + W] of W tokens over a prefix (its real columns) and over themselves
    (causal): 0 where allowed, −inf elsewhere. Made once per forward: a boolean mask would be converted to this
    inside every attention call, forward and backward."""
    R, W = prefix_real_RX.shape[0], width
    causal_WW = torch.ones(W, W, dtype=torch.bool, device=prefix_real_RX.device).tril()
    allowed_RWS = torch.cat([prefix_real_RX[:, None, :].expand(-1, W, -1), causal_WW[None].expand(R, W, W)], dim=-1)
    return torch.zeros(allowed_RWS.shape, dtype=dtype, device=allowed_RWS.device).masked_fill_(
        ~allowed_RWS, float("-inf"))[:, None]


def left_padded_bias(real_UX: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask [U, 1, X, X] of left-padded prompts over themselves: causal, real keys only. A padding
    position also sees itself, so that no softmax row is empty: not every attention kernel returns zeros for a
    row with no key, and a NaN there would reach the responses through the padding's keys and values, masked or
    not (0 · NaN is NaN). What padding positions compute is never read."""
    X = real_UX.shape[1]
    causal_XX = torch.ones(X, X, dtype=torch.bool, device=real_UX.device).tril()
    allowed_UXX = (causal_XX[None] & real_UX[:, None, :]) | torch.eye(X, dtype=torch.bool, device=real_UX.device)
    return torch.zeros(allowed_UXX.shape, dtype=dtype, device=real_UX.device).masked_fill_(
        ~allowed_UXX, float("-inf"))[:, None]
