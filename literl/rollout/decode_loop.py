"""The engine's sampling loop: T tokens for each of B rows from a decoder, finished rows leaving the batch.

Every per-step write goes in place into buffers made once per generation (`SamplingBuffers`: every row's tokens
and log-probs, each slot's batch row, last token and finished flag, the response index as a device
tensor), so a step does the same work on the same memory at every step: with a `decode.FixedShapeDecoder` on
CUDA, one step is captured as a CUDA graph per batch bucket and replayed (`literl.model.cuda_graphs`).

The host reads the device only at a check, every `sync_every` steps (how many rows still run; 1 on CPU, where a
read is free, 8 on accelerators, where each stalls the launch queue), and rows move only there: at every check
that finds finished rows when batches are exact (the static and dynamic decoders, the fixed one off CUDA), or,
with buckets, once the running rows fit a smaller bucket. Until they leave, finished rows keep sampling (their
tokens after the EOS are cut by the engine), and the trash slots that pad a bucket write into row B, dropped.

Noise: a uniform draw for all B rows at every step (inside the step, so inside the graph when captured), so a
row's sample depends only on the seed, its row and its step, never on which rows still run or which slot holds
it: every decode path draws the same numbers and samples the same tokens.
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import torch

from literl.model.cuda_graphs import BucketGraphs, bucket_for
from literl.model.decode import Decoder
from literl.rollout.engine import SamplingParams
from literl.rollout.sampling import sample_from_uniform, uniform_noise


class SamplingBuffers:
    """The loop's state for B rows and T tokens, on the sampling device, written in place. Row B is the trash row
    (what trash slots write goes there); a slot's finished flag moves with its row, and a trash slot counts as
    finished. `reset` readies the same buffers for another generation."""

    def __init__(self, rows: int, max_new_tokens: int, pad_id: int, eos_token_ids: Sequence[int],
                 device: torch.device):
        B, T = rows, max_new_tokens
        self.batch, self.pad_id = B, pad_id
        self.ids_BT = torch.empty((B + 1, T), dtype=torch.long, device=device)
        self.logp_BT = torch.empty((B + 1, T), dtype=torch.float32, device=device)
        self.done_R = torch.empty(B, dtype=torch.bool, device=device)     # each slot's row has sampled an EOS
        self.row_R = torch.empty(B, dtype=torch.long, device=device)      # the batch row each slot holds; B: trash
        self.token_R = torch.zeros(B, dtype=torch.long, device=device)    # each slot's last sampled token
        self.t_1 = torch.empty(1, dtype=torch.long, device=device)        # the response index the next step writes
        self.eos_E = torch.tensor(sorted(set(eos_token_ids)), dtype=torch.long, device=device)
        self.reset()

    def reset(self) -> None:
        self.ids_BT.fill_(self.pad_id)
        self.logp_BT.zero_()
        self.done_R.zero_()
        torch.arange(self.batch, out=self.row_R)
        self.t_1.zero_()

    def write(self, token_R: torch.Tensor, logp_R: torch.Tensor) -> None:
        """The tokens sampled for the first R slots, at the current response index; then the next index."""
        R = token_R.shape[0]
        row_R, t_R = self.row_R[:R], self.t_1.expand(R)
        self.ids_BT.index_put_((row_R, t_R), token_R)
        self.logp_BT.index_put_((row_R, t_R), logp_R)
        # Not `torch.isin`: with few tokens it may sort and take `unique` of them, a host sync on CUDA.
        self.done_R[:R] |= (token_R[:, None] == self.eos_E).any(-1)
        self.token_R[:R].copy_(token_R)
        self.t_1 += 1

    def running(self, slots: int) -> torch.Tensor:
        """Which of the first `slots` slots hold a row that has not finished."""
        return ~self.done_R[:slots]

    def keep(self, kept_R: torch.Tensor, slots: int) -> None:
        """Slots kept_R move to the front; slots len(kept_R)..slots-1 become trash slots."""
        n = kept_R.shape[0]
        for buffer in (self.row_R, self.token_R, self.done_R):
            buffer[:n] = buffer.index_select(0, kept_R)
        self.row_R[n:slots] = self.batch
        self.done_R[n:slots] = True

    def snapshot(self) -> Callable[[], None]:
        """What a step changes besides the entries it writes (a repeated step writes them again): a function that
        puts it back."""
        token_R, t_1, done_R = self.token_R.clone(), self.t_1.clone(), self.done_R.clone()

        def restore() -> None:
            self.token_R.copy_(token_R)
            self.t_1.copy_(t_1)
            self.done_R.copy_(done_R)

        return restore


def sample_tokens(decoder: Decoder, first_logits_BV: torch.Tensor, params: SamplingParams,
                  rng: torch.Generator | None, buffers: SamplingBuffers, *, sync_every: int,
                  buckets: list[int] | None = None, graphs: BucketGraphs | None = None,
                  before_step: Callable[[int], None] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample T tokens per row; return (ids_BT, logp_BT), pad / 0 after a row left the batch.

    The first token comes from the prefill's logits, each later one from `decoder.step_and_sample`. `buckets`
    (`cuda_graphs.decode_buckets`): the batch sizes to run at (the decoder must take trash slots: a
    `FixedShapeDecoder`); None: exactly the running rows. `graphs`: replay each step as its bucket's CUDA graph
    (the decoder's `device_step`, which touches no host state, then its `count_step`). `before_step(t)`: called
    on the host before decode step t >= 1 (an asynchronous producer swaps the weights in place there, outside any
    capture, or raises to abandon the generation).
    """
    (B, V), T, device = first_logits_BV.shape, params.max_new_tokens, first_logits_BV.device

    def noise(slots: int) -> torch.Tensor | None:
        if params.greedy:
            return None
        uniform_BV = uniform_noise(B, V, device=device, rng=rng)
        # Below B slots the rows have moved (the trash slots read the last row's noise; their samples are dropped).
        return uniform_BV if slots == B else uniform_BV.index_select(0, buffers.row_R[:slots].clamp(max=B - 1))

    def step(slots: int) -> None:
        sample = (sample_from_uniform, params, noise(slots))
        if graphs is None:
            token_R, logp_R = decoder.step_and_sample(buffers.token_R[:slots], sample)
        else:       # the device work only (captured and replayed); the host counts the step below
            token_R, logp_R = decoder.device_step(buffers.token_R[:slots], sample)
        buffers.write(token_R, logp_R)

    def snapshot() -> Callable[[], None]:
        restores = [decoder.snapshot(), buffers.snapshot()]
        state = None if rng is None else rng.get_state()

        def restore() -> None:
            for undo in restores:
                undo()
            if state is not None:
                rng.set_state(state)

        return restore

    buffers.write(*sample_from_uniform(first_logits_BV, params, noise(B)))
    slots = B
    for t in range(1, T):
        if t % sync_every == 0:
            running_R = buffers.running(slots)
            n = int(running_R.sum())
            if n == 0:
                break
            target = n if buckets is None else bucket_for(n, buckets)
            if target < slots:
                kept_R = live_slots_in_place(running_R, n)
                if target == n:
                    decoder.keep(kept_R)
                else:
                    decoder.keep(kept_R, target)
                buffers.keep(kept_R, target)
                slots = target
        if before_step is not None:
            before_step(t)
        if graphs is None:
            step(slots)
        else:
            graphs.run((slots, decoder.attended_width()), functools.partial(step, slots), snapshot)
            decoder.count_step()
    return buffers.ids_BT[:B], buffers.logp_BT[:B]


def live_slots_in_place(live_R: torch.Tensor, n: int | None = None) -> torch.Tensor:
    """The n live slots, ordered for a cheap `Decoder.keep`: a live slot among the first n keeps its position,
    and the live slots beyond n fill the holes the finished ones leave there, so compacting moves only as many
    rows as there are holes (dropping 16 scattered rows of 128 moves at most 16, not every row after the first
    hole). Which slot holds a row does not change its samples: the noise is drawn per batch row. `n`: the count of
    live slots, when the caller has it."""
    n = int(live_R.sum()) if n is None else n
    kept_R = torch.arange(n, device=live_R.device)
    holes = torch.nonzero(~live_R[:n]).flatten()
    kept_R[holes] = torch.nonzero(live_R[n:]).flatten() + n
    return kept_R
