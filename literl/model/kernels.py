"""Small tensor functions the layer body and its modes share: RMS norm with a hand-written backward, rotary
embedding, per-head views, and row selections whose backward avoids atomic adds.

All of them work on any leading shape; the dimension key is `literl.algorithm.batch`'s.
"""

from __future__ import annotations

import torch


def apply_norm(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The norm module applied to x: through `_RMSNorm` when it is a plain fp32 RMS norm (Llama's and Qwen's,
    which keep `variance_epsilon`), else through the module itself. Both give the same bits in fp32 (the same
    operations in the same order); the hand-written backward is what differs."""
    weight, eps = getattr(module, "weight", None), getattr(module, "variance_epsilon", None)
    plain = isinstance(eps, float) and isinstance(weight, torch.Tensor) and weight.dim() == 1
    # Under torch.compile the module's own ops fuse into one kernel each way, which beats the hand backward.
    if plain and x.dtype == weight.dtype == torch.float32 and not torch.compiler.is_compiling():
        return _RMSNorm.apply(x, weight, eps)
    return module(x)


def call_norm(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The norm module's own forward (for passes without autograd, where the hand backward buys nothing)."""
    return module(x)


class _RMSNorm(torch.autograd.Function):
    """y = w ⊙ x̂, x̂ = x · rstd, rstd = 1 / sqrt(mean(x²) + ε) over the last dimension, with the backward written
    out (a third fewer element-wise passes than autograd through the module's ops):
        ∂L/∂w = Σ_rows g ⊙ x̂        ∂L/∂x = rstd · (g_x̂ − x̂ · mean(g_x̂ ⊙ x̂)),   g_x̂ = g ⊙ w
    """

    @staticmethod
    def forward(ctx, x, weight, eps):
        rstd = torch.rsqrt(x.square().mean(-1, keepdim=True).add_(eps))
        normalized = x * rstd
        ctx.save_for_backward(normalized, rstd, weight)
        return normalized * weight

    @staticmethod
    def backward(ctx, grad):
        normalized, rstd, weight = ctx.saved_tensors
        grad_weight = (grad * normalized).flatten(0, -2).sum(0) if ctx.needs_input_grad[1] else None
        grad_normalized = grad * weight
        grad_x = grad_normalized.sub_(normalized * (grad_normalized * normalized).mean(-1, keepdim=True)).mul_(rstd)
        return grad_x, grad_weight, None


def per_head(x_NF: torch.Tensor, head_dim: int, norm_module: torch.nn.Module | None, norm=apply_norm
             ) -> torch.Tensor:
    """[..., heads·D] → [..., heads, D], with the per-head norm (Qwen3's q_norm / k_norm) when there is one."""
    x_NHD = x_NF.unflatten(-1, (-1, head_dim))
    return x_NHD if norm_module is None else norm(norm_module, x_NHD)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Standard (non-interleaved) rotary embedding: x·cos + rotate_half(x)·sin (cos, sin broadcast over x)."""
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-second, first), dim=-1) * sin


def gather_distinct_rows(x_NF: torch.Tensor, index_M: torch.Tensor) -> torch.Tensor:
    """x_NF[index_M] for an index without repeats, whose backward scatters the gradient rows into place (no
    accumulation, so no atomic adds in a compiled backward, ~5x faster than index_select's index_add here)."""
    return _SelectRows.apply(x_NF, index_M, True)


def repeat_rows(x_UF: torch.Tensor, index_R: torch.Tensor) -> torch.Tensor:
    """x_UF[index_R] for an index with repeats (each row's copy of its prompt's keys or values), whose backward
    adds the rows of a contiguous copy of the gradient into their sources. The gradient arriving here is a view
    of the attention's key or value gradient (its prompt columns); index_add on such a view falls back to
    scatter_add (0.6-0.7 ms per call on the benchmark workload, against ~0.06 ms for copy and index_add; an
    indexing backward, an accumulating index_put, is slower still)."""
    return _SelectRows.apply(x_UF, index_R, False)


class _SelectRows(torch.autograd.Function):
    """x[index] along dim 0; backward: index_copy of the gradient rows when the index has no repeats
    (`gather_distinct_rows`), else index_add of a contiguous copy of them (`repeat_rows`)."""

    @staticmethod
    def forward(ctx, x, index, distinct: bool):
        ctx.save_for_backward(index)
        ctx.rows, ctx.distinct = x.shape[0], distinct
        return x.index_select(0, index)

    @staticmethod
    def backward(ctx, grad):
        (index,) = ctx.saved_tensors
        zeros = grad.new_zeros(ctx.rows, *grad.shape[1:])
        if ctx.distinct:
            return zeros.index_copy(0, index, grad), None, None
        return zeros.index_add_(0, index, grad.contiguous()), None, None


def padded(x_M: torch.Tensor, slot_M: torch.Tensor, rows: int, width: int, fill: float = 0.0) -> torch.Tensor:
    """Packed tokens → padded rows: [M, heads, D] → [rows, heads, width, D], [M, heads] → [rows, heads, width]
    (`fill` where no token); `slot_M` = row·width + column of each token."""
    out = x_M.new_full((rows * width, *x_M.shape[1:]), fill).index_copy(0, slot_M, x_M)
    return out.unflatten(0, (rows, width)).transpose(1, 2)
