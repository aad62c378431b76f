"""Small tensor helpers shared by the tricks: masked reductions and statistics per group.

This is the only place these exist. Masks are `bool` (True = the token counts). Groups are given by
explicit ids (`group_B`, any integers), never by assuming the G samples of a prompt are contiguous
(algorithms.md §1.1, "always group by explicit gid").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    x = torch.where(mask, x, torch.zeros((), dtype=x.dtype, device=x.device))
    return x.sum() if dim is None else x.sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim=None) -> torch.Tensor:
    """Mean over True entries; 0 (never NaN) where nothing is selected."""
    count = mask.sum() if dim is None else mask.sum(dim)
    return masked_sum(x, mask, dim) / count.clamp(min=1).to(x.dtype)


def masked_max(x: torch.Tensor, mask: torch.Tensor, *, empty: float = -math.inf) -> torch.Tensor:
    """Max over True entries; `empty` where nothing is selected.

    The default −inf is the identity of max, so a micro-batch with no selected token leaves a step's max
    unchanged (the metric accumulator drops it); pass e.g. empty=0.0 where the value feeds arithmetic.
    Computed without reading the mask on the host (no boolean indexing): on a GPU it does not wait for the device.
    """
    return _masked_extreme(x, mask, empty, -math.inf, torch.amax)


def masked_min(x: torch.Tensor, mask: torch.Tensor, *, empty: float = math.inf) -> torch.Tensor:
    """Min over True entries; `empty` where nothing is selected (default +inf, the identity of min)."""
    return _masked_extreme(x, mask, empty, math.inf, torch.amin)


def _masked_extreme(x: torch.Tensor, mask: torch.Tensor, empty: float, identity: float, reduce) -> torch.Tensor:
    """reduce over the selected entries (the others replaced by the reduction's identity, which never wins over a
    selected value, NaN included), `empty` when none is selected."""
    empty_t = torch.full((), empty, dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return empty_t
    extreme = reduce(torch.where(mask, x, torch.full((), identity, dtype=x.dtype, device=x.device)))
    return torch.where(mask.any(), extreme, empty_t)


def descending_rank(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The rank of each True entry of `x` in descending order over the whole tensor (0 = largest), equal values
    ranked by lower flat (row-major) index first; False entries rank after every True one. No host sync.

    `rank < k` selects the k largest with a deterministic tie-break (KL-Cov's top-k, newer-losses.md §6)."""
    flat_x, flat_mask = x.detach().flatten(), mask.flatten()
    by_value = torch.sort(flat_x, descending=True, stable=True).indices          # ties keep index order
    by_validity = torch.sort(flat_mask[by_value].to(torch.uint8), descending=True, stable=True).indices
    order = by_value[by_validity]
    rank = torch.empty_like(order)
    rank[order] = torch.arange(order.numel(), device=order.device)
    return rank.view(x.shape)


def kth_largest(x: torch.Tensor, mask: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The k-th largest True entry of `x` (k ≥ 1, a 0-dim tensor); −inf when k exceeds the number of True
    entries (nothing True included). No host sync."""
    flat = torch.where(mask, x.detach(), torch.full((), -math.inf, dtype=x.dtype, device=x.device)).flatten()
    ordered = torch.sort(flat, descending=True).values
    index = (k.to(torch.long) - 1).clamp(0, max(flat.numel() - 1, 0))
    return ordered[index] if flat.numel() else torch.zeros((), dtype=x.dtype, device=x.device)


@dataclass(frozen=True)
class Ratio:
    """A mean kept as (Σ numerator, Σ denominator) so that micro-batch values combine exactly: `a + b` adds
    both sums, `float()` divides once, and gives `empty` when the denominator is 0.

    For statistics whose own count is not the micro-batch's loss-token count: means over sequences, or over a
    mask other than the loss mask (algorithms.md §7 diagnostics). Fields are 0-dim tensors or floats.
    """
    num: torch.Tensor | float
    den: torch.Tensor | float
    empty: float = 0.0

    def __add__(self, other: Ratio) -> Ratio:
        return Ratio(self.num + other.num, self.den + other.den, self.empty)

    def __float__(self) -> float:
        den = float(self.den)
        return float(self.num) / den if den > 0 else self.empty


@dataclass(frozen=True)
class SampleSize:
    """Normalised effective sample size from additive sums, so it combines exactly across micro-batches:

        ESS = mean(w)² / mean(w²) = (Σw)² / (n·Σw²)

    1 when nothing is selected (no weight to judge), 0 when every selected weight is 0.
    """
    sum_w: torch.Tensor | float
    sum_w2: torch.Tensor | float
    count: torch.Tensor | float

    def __add__(self, other: SampleSize) -> SampleSize:
        return SampleSize(self.sum_w + other.sum_w, self.sum_w2 + other.sum_w2, self.count + other.count)

    def __float__(self) -> float:
        n, sum_w2 = float(self.count), float(self.sum_w2)
        if n == 0:
            return 1.0
        return float(self.sum_w) ** 2 / (n * sum_w2) if sum_w2 > 0 else 0.0


def pooled_mean(x: torch.Tensor, mask: torch.Tensor) -> Ratio:
    """Mean over True entries as a `Ratio` (Σ x, count); 0 when nothing is selected."""
    return Ratio(masked_sum(x, mask), mask.sum())


def pooled_ess(w: torch.Tensor, mask: torch.Tensor) -> SampleSize:
    """`effective_sample_size` as a `SampleSize` that combines exactly across micro-batches."""
    return SampleSize(masked_sum(w, mask), masked_sum(w * w, mask), mask.sum())


def dense_group_index(group_B: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Map arbitrary group ids to 0..n_groups-1 (order of first appearance is not kept; sorted ids)."""
    uniq, index_B = torch.unique(group_B, return_inverse=True)
    return index_B, int(uniq.numel())


def group_sum(values_B: torch.Tensor, group_B: torch.Tensor, valid_B: torch.Tensor | None = None):
    """Per-sequence view of the sum and count of its group's valid values: (sum_B, count_B)."""
    index_B, n = dense_group_index(group_B)
    if valid_B is None:
        valid_B = torch.ones_like(values_B, dtype=torch.bool)
    v = torch.where(valid_B, values_B, torch.zeros_like(values_B))
    sums = torch.zeros(n, dtype=values_B.dtype, device=values_B.device).index_add_(0, index_B, v)
    counts = torch.zeros(n, dtype=values_B.dtype, device=values_B.device).index_add_(
        0, index_B, valid_B.to(values_B.dtype))
    return sums[index_B], counts[index_B]


def group_mean_std(values_B: torch.Tensor, group_B: torch.Tensor, valid_B: torch.Tensor | None = None,
                   *, unbiased: bool = True):
    """Per-sequence (mean, std, count) of its group over valid entries.

    std is the unbiased (N-1) estimate by default, as torch.std in verl/TRL/ROLL; a group with fewer
    than 2 valid members gets std 0 (never NaN). Invalid entries (e.g. NaN rewards) are excluded.
    Computed in float64 and returned in the input's dtype: float32 squares overflow from |x| ≈ 2e19 on, which
    would make the std inf and every advantage 0.
    """
    dtype = values_B.dtype
    values_B = values_B.double() if values_B.is_floating_point() else values_B
    if valid_B is None:
        valid_B = torch.ones_like(values_B, dtype=torch.bool)
    s, n = group_sum(values_B, group_B, valid_B)
    mean = s / n.clamp(min=1)
    sq, _ = group_sum((values_B - mean) ** 2, group_B, valid_B)
    dof = (n - 1) if unbiased else n
    var = torch.where(dof > 0, sq / dof.clamp(min=1), torch.zeros_like(sq))
    return mean.to(dtype), var.clamp(min=0).sqrt().to(dtype), n.to(dtype)


def batch_mean_std(values: torch.Tensor, valid: torch.Tensor, *, unbiased: bool = True,
                   weights: torch.Tensor | None = None):
    """(mean, std) over valid entries, optionally weighted (e.g. by token counts); std 0 if < 2 entries.
    Computed in float64, returned in the input's dtype (see `group_mean_std`)."""
    dtype = values.dtype
    values = values.double()
    weights = None if weights is None else weights.double()
    mean, std = _batch_mean_std(values, valid, unbiased, weights)
    return mean.to(dtype), std.to(dtype)


def _batch_mean_std(values, valid, unbiased, weights):
    w = valid.to(values.dtype) if weights is None else torch.where(valid, weights, torch.zeros_like(weights))
    total = w.sum()
    x = torch.where(valid, values, torch.zeros_like(values))
    mean = (w * x).sum() / total.clamp(min=1e-12)
    sq = (w * (x - mean) ** 2).sum()
    denom = total - 1 if unbiased else total
    var = sq / denom if float(denom) > 0 else torch.zeros((), dtype=values.dtype, device=values.device)
    return mean, var.clamp(min=0).sqrt()


def response_lengths(mask_BT: torch.Tensor) -> torch.Tensor:
    return mask_BT.sum(-1)


def last_token_index(mask_BT: torch.Tensor) -> torch.Tensor:
    """Index of each row's last True entry (0 for an empty row)."""
    T = mask_BT.shape[-1]
    positions = torch.arange(T, device=mask_BT.device).expand_as(mask_BT)
    return torch.where(mask_BT, positions, torch.zeros_like(positions)).max(-1).values


def group_min_max(values_B: torch.Tensor, group_B: torch.Tensor, valid_B: torch.Tensor | None = None):
    """Per-sequence view of its group's (min, max) over valid entries; (0, 0) for a group with none valid."""
    index_B, n = dense_group_index(group_B)
    if valid_B is None:
        valid_B = torch.ones_like(values_B, dtype=torch.bool)
    inf = torch.tensor(float("inf"), dtype=values_B.dtype, device=values_B.device)
    lo = torch.full((n,), float("inf"), dtype=values_B.dtype, device=values_B.device).scatter_reduce(
        0, index_B, torch.where(valid_B, values_B, inf), reduce="amin")
    hi = torch.full((n,), float("-inf"), dtype=values_B.dtype, device=values_B.device).scatter_reduce(
        0, index_B, torch.where(valid_B, values_B, -inf), reduce="amax")
    empty = torch.isinf(lo)
    lo, hi = lo.masked_fill(empty, 0.0), hi.masked_fill(empty, 0.0)
    return lo[index_B], hi[index_B]


def effective_sample_size(w: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Normalised ESS 1/mean(ŵ²) with ŵ = w/mean(w), i.e. mean(w)²/mean(w²), over True entries.

    1 when nothing is selected (no weight to judge), 0 when every selected weight is 0.
    """
    m = masked_mean(w, mask)
    m2 = masked_mean(w * w, mask)
    if bool(m2 > 0):
        return m * m / m2
    return torch.ones((), dtype=w.dtype, device=w.device) if not bool(mask.any()) \
        else torch.zeros((), dtype=w.dtype, device=w.device)
