"""Which rows of a batch run through one training forward together.

Rows are grouped by length so that each group's forward is cut to its own longest row (little padding is
computed), with few enough groups that their fixed costs stay small.
"""

from __future__ import annotations

import torch

# A group costs about this many tokens' worth of compute in fixed overhead (CPU, benchmark model), and there are
# at most:
BUCKET_OVERHEAD_TOKENS = 512
MAX_BUCKETS = 8
# CPU: a decoder forward takes at most about this many padded tokens, so that a layer's element-wise work
# (norms, rotary, SiLU, residuals) on its [tokens × FFN] activations runs in cache: ~5% less update time on the
# benchmark workload than one 6k-token forward (1 thread).
CPU_FORWARD_TOKENS = 1024
# A replayed forward runs all rows in one pass while rows × longest row is at most this many tokens: its tokens
# are then consecutive record rows, read in place (`literl.model.forward.replayed_responses`), and each weight
# gradient is one product. Benchmark workload (128 × ≤63 tokens), alternating A/B: update −8% compiled, −2% eager
# against by-length groups. Above it, rows are grouped as for the computed forward (bounded activations).
REPLAY_ONE_PASS_TOKENS = 16384


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
