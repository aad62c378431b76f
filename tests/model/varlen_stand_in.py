"""A CPU stand-in for torch's varlen_attn operator, built the same way (a custom operator with a fake kernel and a
backward operator of its own), so that the compiled varlen layer's graph structure is tested where CI runs
(tests/model/test_packed.py): causal attention within each segment, O = P·V with P = softmax(scale·Q·Kᵀ) over a
same-segment causal mask aligned at the segments' ends as flash attention aligns it when a segment has more keys
than queries (shared prompts), written out forward and backward (an operator's
kernel runs below autograd). Outputs are contiguous, as their fakes say.

Why a module of its own, which no test file is: an operator must be registered once per process. pytest imports a
test file under its base name (`test_packed`), and a test module importing it as `tests.model.test_packed` runs
it a second time; torch's `custom_op` then destroys the first registration and makes a new one, while the first
module's function still calls the destroyed one — a use of freed memory that crashed the full suite now and then
(a segfault, or std::bad_alloc inside the operator). This module is only ever imported as
`tests.model.varlen_stand_in` (tests/test_structure.py checks that no test file defines an operator)."""

from __future__ import annotations

import torch


@torch.library.custom_op("literl_test::varlen_attention", mutates_args=())
def stand_in_varlen(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, cu_R1: torch.Tensor,
                    cu_key_R1: torch.Tensor, scale: float) -> torch.Tensor:
    q, k, v = _heads_first(query, key, value)
    out = _segment_causal_probs(q, k, cu_R1, cu_key_R1, scale) @ v
    return out.transpose(0, 1).to(query.dtype).contiguous()


@stand_in_varlen.register_fake
def _(query, key, value, cu_R1, cu_key_R1, scale):
    return query.new_empty(query.shape)


@torch.library.custom_op("literl_test::varlen_attention_backward", mutates_args=())
def _stand_in_varlen_backward(grad: torch.Tensor, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                              cu_R1: torch.Tensor, cu_key_R1: torch.Tensor, scale: float
                              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # dV = Pᵀ·dO, dS = P ⊙ (dO·Vᵀ − rowsum(dO ⊙ O)), dQ = scale·dS·K, dK = scale·dSᵀ·Q; grouped heads summed.
    q, k, v = _heads_first(query, key, value)
    d_out = grad.transpose(0, 1).float()
    probs = _segment_causal_probs(q, k, cu_R1, cu_key_R1, scale)
    out = probs @ v
    d_scores = probs * (d_out @ v.transpose(1, 2) - (d_out * out).sum(-1, keepdim=True))
    d_query, d_key, d_value = scale * d_scores @ k, scale * d_scores.transpose(1, 2) @ q, probs.transpose(1, 2) @ d_out
    groups = query.shape[1] // key.shape[1]
    d_key, d_value = (x.unflatten(0, (key.shape[1], groups)).sum(1) for x in (d_key, d_value))
    return tuple(x.transpose(0, 1).to(y.dtype).contiguous() for x, y in zip((d_query, d_key, d_value),
                                                                             (query, key, value)))


@_stand_in_varlen_backward.register_fake
def _(grad, query, key, value, cu_R1, cu_key_R1, scale):
    return query.new_empty(query.shape), key.new_empty(key.shape), value.new_empty(value.shape)


def _stand_in_setup(ctx, inputs, output):
    query, key, value, cu_R1, cu_key_R1, scale = inputs
    ctx.save_for_backward(query, key, value, cu_R1, cu_key_R1)
    ctx.scale = scale


def _stand_in_grad(ctx, grad):
    query, key, value, cu_R1, cu_key_R1 = ctx.saved_tensors
    return (*_stand_in_varlen_backward(grad, query, key, value, cu_R1, cu_key_R1, ctx.scale), None, None, None)


stand_in_varlen.register_autograd(_stand_in_grad, setup_context=_stand_in_setup)


def _heads_first(query_MQD, key_MJD, value_MJD):
    """[Q, M, D] float32 copies, the key/value heads repeated for the query heads they serve."""
    groups = query_MQD.shape[1] // key_MJD.shape[1]
    return (x.transpose(0, 1).float().contiguous() for x in (query_MQD, key_MJD.repeat_interleave(groups, 1),
                                                             value_MJD.repeat_interleave(groups, 1)))


def _segment_causal_probs(q_QMD, k_QYD, cu_R1, cu_key_R1, scale):
    segment_M, offset_M, length_M = _segments(cu_R1, q_QMD.shape[1])
    segment_Y, offset_Y, length_Y = _segments(cu_key_R1, k_QYD.shape[1])
    # Aligned at the ends: query offset a of a segment with n queries and m keys sees keys up to offset a + m − n.
    allowed_MY = (segment_M[:, None] == segment_Y[None, :]) & (
        offset_Y[None, :] - length_Y[None, :] <= offset_M[:, None] - length_M[:, None])
    return torch.softmax((scale * q_QMD @ k_QYD.transpose(1, 2)).masked_fill(~allowed_MY, -torch.inf), -1)


def _segments(cu_R1, M):
    """Each position's segment, offset in it, and the segment's length."""
    length_R = (cu_R1[1:] - cu_R1[:-1]).long()
    segment_M = torch.repeat_interleave(torch.arange(len(length_R)), length_R)
    return segment_M, torch.arange(M) - cu_R1[:-1].long()[segment_M], length_R[segment_M]
