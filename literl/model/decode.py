"""Decoders: "the token each live row just sampled" → "the logits (or the next sample) of each row's next token",
able to drop finished rows (`keep`) so that they stop costing compute.

- `StaticKVDecoder`: a preallocated per-layer KV cache [R, J, S, D] (S = prompt width + max_new_tokens columns);
  a step writes one column and attends over the columns written so far, through the one layer body
  (`decode_step`: `literl.model.layer.decoder_layer` with cached attention). Why: for a small model, a large
  share of the model's own decode step is not the maths (`DynamicCache` grows by concatenation, so every step
  copies the whole cache; masks and positions are rebuilt at every step): benchmark model, batch 128, 1 thread,
  16 ms per step through the model's forward against 10.4 ms here. With a `ForwardRecord` the step also writes
  every projection's output into the record (`literl.model.record`), for the update to replay.
- `FixedShapeDecoder`: the same cache and layer body with every shape fixed per batch size and attended width
  (`fixed_decode_step`: the column a device tensor, unwritten columns masked, all state written in place), so that
  a CUDA graph can capture a step and replay it (`literl.model.cuda_graphs`).
- `DynamicCacheDecoder`: the model's own forward with a growing cache: slower, correct for any causal LM.

Sampling can run inside the step (`step_and_sample`: compiled, it joins the step's graph); the caller passes the
sampling function, so this package knows nothing of sampling parameters.
"""

from __future__ import annotations

import functools
from typing import Callable, Protocol

import torch
from transformers.cache_utils import DynamicCache

from literl.model import attention
from literl.model.compiled import compile_for_varying_sizes
from literl.model.kernels import call_norm
from literl.model.layer import decoder_layer, embed_and_rotary, routed_linears
from literl.model.moe import Routing, TokenRoutes
from literl.model.prompt_pass import DistinctPrompts, cache_keyword
from literl.model.record import ForwardRecord, RecordingLinears

# A step's sampling: (fn, *args) called as fn(logits_RV, *args) -> (token_R, logp_R), or None for the logits.
Sample = tuple | None


class Decoder(Protocol):
    """One decode step for the live rows of a generation; rows are "slots" numbered 0..R-1."""

    def step(self, token_R: torch.Tensor) -> torch.Tensor:
        """Append each slot's sampled token; return the fp32-castable logits_RV of its next token."""
        ...

    def step_and_sample(self, token_R: torch.Tensor, sample: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        """`step`, then `sample[0](logits_RV, *sample[1:])`: (next token_R, its logp_R). A decoder may run both as
        one (the static decoder's compiled step samples inside its graph)."""
        ...

    def keep(self, kept_R: torch.Tensor) -> None:
        """Keep only these slots (in this order); the others are dropped from the batch and the cache. Any order
        is valid; a decoder may be cheapest when most slots keep their position (kept_R[i] == i)."""
        ...


def decode_step(model: torch.nn.Module, token_R: torch.Tensor, position_R: torch.Tensor, keys: list[torch.Tensor],
                values: list[torch.Tensor], bias_RS: torch.Tensor, column: int,
                recording: tuple[list, list] | None = None, sample: Sample = None, routes: TokenRoutes | None = None):
    """Feed one token per row at cache column `column` (its rotary position is `position_R`); return logits_RV, or
    with `sample` the sampled (token_R, logp_R).

    `recording=(weights, records)` (a record's `fused_weights` and `add_step` rows, per layer) runs the recording
    projections: each group of matmuls sharing an input writes its output into the record's rows, and where the
    record keeps the attention (CPU) its output and log-sum-exp are written too. `routes` records the MoE layers'
    choice of experts for these tokens (`literl.model.moe`)."""
    bias_R11S = bias_RS[:, None, None, :column + 1]
    return _layers_and_head(model, token_R, position_R, keys, values, recording, sample, routes,
                            lambda keys_RJSD, values_RJSD, keep: attention.cached(keys_RJSD, values_RJSD, bias_R11S,
                                                                                  column, keep))


def fixed_decode_step(model: torch.nn.Module, token_R: torch.Tensor, position_R: torch.Tensor,
                      keys: list[torch.Tensor], values: list[torch.Tensor], bias_RS: torch.Tensor,
                      column_1: torch.Tensor, recording: tuple[list, list] | None = None, sample: Sample = None,
                      routes: TokenRoutes | None = None, *, layer_step: Callable | None = None):
    """`decode_step` with every shape fixed (`attention.fixed`): `column_1` is a one-element long tensor holding
    the cache column, the query attends to every column it is given (keys, values and bias [.., S]: the cache or
    its first columns), and the columns after `column_1` are masked here (`bias_RS` carries only the prompts' left
    padding). Nothing in it depends on a host value that changes from step to step, so at a given batch size and
    width every call is the same work on the same memory.

    `layer_step` (`fixed_layer` or its compiled form) runs each layer of a step that neither records nor routes,
    one call per layer (`compiled.compiles_layer_by_layer`)."""
    unwritten_S = torch.arange(bias_RS.shape[1], device=bias_RS.device) > column_1
    bias_R11S = bias_RS.masked_fill(unwritten_S, float("-inf"))[:, None, None, :]
    if layer_step is not None and recording is None and routes is None:
        body = model.get_decoder()
        hidden_RH, cos_R1D, sin_R1D = embed_and_rotary(body, token_R, position_R[:, None])
        for layer, keys_RJSD, values_RJSD in zip(body.layers, keys, values):
            hidden_RH = layer_step(layer, hidden_RH, cos_R1D, sin_R1D, keys_RJSD, values_RJSD, bias_R11S, column_1)
        logits_RV = model.get_output_embeddings()(body.norm(hidden_RH))
        return logits_RV if sample is None else sample[0](logits_RV, *sample[1:])
    return _layers_and_head(model, token_R, position_R, keys, values, recording, sample, routes,
                            lambda keys_RJSD, values_RJSD, keep: attention.fixed(keys_RJSD, values_RJSD, bias_R11S,
                                                                                 column_1, keep))


def fixed_layer(layer: torch.nn.Module, hidden_RH: torch.Tensor, cos_R1D: torch.Tensor, sin_R1D: torch.Tensor,
                keys_RJSD: torch.Tensor, values_RJSD: torch.Tensor, bias_R11S: torch.Tensor,
                column_1: torch.Tensor) -> torch.Tensor:
    """One layer of `fixed_decode_step` (computed projections, the module's own norms)."""
    return decoder_layer(layer, hidden_RH, cos_R1D, sin_R1D, norm=call_norm,
                         attention=attention.fixed(keys_RJSD, values_RJSD, bias_R11S, column_1))


def _layers_and_head(model, token_R, position_R, keys, values, recording, sample, routes, attention_of):
    """The body of a decode step: every layer (`attention_of(keys_RJSD, values_RJSD, keep)` makes its attention),
    the final norm and the head, then `sample` if given."""
    body = model.get_decoder()
    hidden_RH, cos_R1D, sin_R1D = embed_and_rotary(body, token_R, position_R[:, None])
    routed = routed_linears(body.layers, routes)
    for i, (layer, keys_RJSD, values_RJSD) in enumerate(zip(body.layers, keys, values)):
        linears, keep = routed[i], None
        if recording is not None:
            rows = recording[1][i]
            linears, keep = RecordingLinears(rows, recording[0][i]), (rows[4:] or None)
        hidden_RH = decoder_layer(layer, hidden_RH, cos_R1D, sin_R1D, linears=linears, norm=call_norm,
                                  attention=attention_of(keys_RJSD, values_RJSD, keep))
    logits_RV = model.get_output_embeddings()(body.norm(hidden_RH))
    return logits_RV if sample is None else sample[0](logits_RV, *sample[1:])


@functools.cache
def compiled_decode_step(device_type: str = "cpu", fixed: bool = False, by_layer: bool = False):
    """`decode_step` (or `fixed_decode_step`) through `torch.compile` (compiled on first use, once per process,
    device type and kind; shared by every engine): one graph for every batch size and cache column, one more when
    recording; a step with one row left, or one that records MoE routes, runs eagerly (`literl.model.compiled`).
    On CPU its kernels are called from C++ (measured there). `by_layer` (`compiled.compiles_layer_by_layer`: CUDA):
    the fixed step runs its layers through one compiled graph of a layer (`compiled_fixed_layer`) instead, so the
    compile time does not grow with depth. Inductor's own CUDA graphs stay off: the engine captures the fixed step
    itself, once per batch bucket (`literl.model.cuda_graphs`)."""
    if fixed and by_layer:
        return functools.partial(fixed_decode_step, layer_step=compiled_fixed_layer())
    return compile_for_varying_sizes(
        fixed_decode_step if fixed else decode_step, cpp_wrapper=device_type == "cpu",
        name="the fixed-shape decode step" if fixed else "the decode step",
        eager_when=lambda model, token_R, position_R, keys, values, bias, column, recording, sample, routes:
        token_R.shape[0] < 2 or routes is not None)


@functools.cache
def compiled_fixed_layer():
    """`fixed_layer` through `torch.compile`: one graph for every layer of a model (the layer's weights are graph
    inputs), every batch size and column; a single row runs eagerly."""
    return compile_for_varying_sizes(fixed_layer, name="a fixed-shape decode layer",
                                     eager_when=lambda layer, hidden_RH, *rest: hidden_RH.shape[0] < 2)


class StaticKVDecoder:
    """Decoder over a preallocated per-layer KV cache [R, J, S, D], S = X + max_new_tokens (X the prompt width).

    `step_fn` is `decode_step` or `compiled_decode_step()`. With a `record`, steps also keep every layer's matmul
    outputs in it; with a `routing` (`moe.Routing` over the generation's rows), they record each MoE layer's
    experts at the fed token's position (its rotary position: the prompt's length plus the response index). Either
    way the decoder tracks which batch row each slot holds.
    """

    def __init__(self, model: torch.nn.Module, cache: DynamicCache, prompts: DistinctPrompts,
                 max_new_tokens: int, step_fn: Callable | None = None, *, record: ForwardRecord | None = None,
                 routing: Routing | None = None):
        self.model = model
        self.step_fn = step_fn or decode_step
        X, source_B = prompts.width, prompts.source_B
        self.record, self.routing = record, routing
        if record is not None or routing is not None:
            self.slot_rows_R = torch.arange(source_B.shape[0], device=source_B.device)
        self.prompt_width = X
        capacity = X + max_new_tokens
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        for layer in cache.layers:
            keys_UJXD, values_UJXD = layer.keys, layer.values
            R, J, D = source_B.shape[0], keys_UJXD.shape[1], keys_UJXD.shape[3]
            keys_RJSD = keys_UJXD.new_empty(R, J, capacity, D)
            values_RJSD = values_UJXD.new_empty(R, J, capacity, D)
            keys_RJSD[:, :, :X] = keys_UJXD[source_B]
            values_RJSD[:, :, :X] = values_UJXD[source_B]
            self.keys.append(keys_RJSD)
            self.values.append(values_RJSD)
        # Additive attention bias: −inf on left padding; unwritten columns are never read (sliced away).
        dtype = self.keys[0].dtype
        self.bias_RS = torch.zeros(source_B.shape[0], capacity, dtype=dtype, device=source_B.device)
        self.bias_RS[:, :X].masked_fill_(~prompts.real_UX[source_B], float("-inf"))
        self.position_R = prompts.length_U[source_B]
        self.column = X

    def step(self, token_R: torch.Tensor) -> torch.Tensor:
        return self._step(token_R, None)

    def step_and_sample(self, token_R: torch.Tensor, sample: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        # Sampling inside the step function: compiled, it joins the step's graph (~12 small eager ops per token
        # step fewer); the noise's uniform draw stays outside, so the random stream is the same either way.
        return self._step(token_R, sample)

    def _step(self, token_R: torch.Tensor, sample: Sample):
        if self.column >= self.bias_RS.shape[1]:
            raise RuntimeError("the static KV cache is full: more steps than max_new_tokens")
        recording, routes = _step_extras(self)
        out = self.step_fn(self.model, token_R, self.position_R, self.keys, self.values, self.bias_RS, self.column,
                           recording, sample, routes)
        self.column += 1
        self.position_R = self.position_R + 1
        return out

    def keep(self, kept_R: torch.Tensor) -> None:
        # Kept rows move to the front of the same buffers (no new allocation). Only the rows whose slot changes
        # move (`decode_loop.live_slots_in_place` keeps most in place), and only their written columns: early in a
        # rollout most of each buffer is still empty.
        count, written = kept_R.shape[0], self.column
        moved_R = torch.nonzero(kept_R != torch.arange(count, device=kept_R.device)).flatten()
        moved_from_R = kept_R[moved_R]
        for cache in (self.keys, self.values):
            for i, full_RJSD in enumerate(cache):
                if moved_R.numel():
                    written_RJSD = full_RJSD[:, :, :written]
                    written_RJSD.index_copy_(0, moved_R, written_RJSD.index_select(0, moved_from_R))
                cache[i] = full_RJSD[:count]
        self.bias_RS = self.bias_RS[kept_R]
        self.position_R = self.position_R[kept_R]
        if self.record is not None or self.routing is not None:
            self.slot_rows_R = self.slot_rows_R[kept_R]


class FixedShapeDecoder:
    """A static-cache decoder whose steps have one shape per batch size and attended width, its state updated in
    place.

    Every buffer is allocated once and never moves: per layer the keys and values of all S columns [B, J, S, D]
    (zeros where not written), the prompts' left-padding bias [B, S], each slot's rotary position and batch row,
    and the cache column (`column_1`, a device tensor). A step (`fixed_decode_step`) writes one column and attends
    over the cache's first `attended_width()` columns, the unwritten ones masked; its device work (`device_step`)
    touches no host state, and `count_step` then bumps a host mirror of the column. So on CUDA one step at a given
    batch size and attended width can be captured as a graph
    and replayed for every column up to that width (`literl.model.cuda_graphs`), and a compiled step sees sizes
    change only at those widths. `width_step`: the attended width is the written columns rounded up to a multiple
    of it (so a step reads at most `width_step` − 1 unwritten columns); None: the whole cache, one width.

    `keep(kept_R, rows)` moves the kept slots to the front (only the slots that change position move, as in
    `StaticKVDecoder.keep`) and may keep `rows` > len(kept_R) slots: the extra ones are *trash* slots, whose batch
    row is `trash_row` (= B: an engine gives its per-row outputs, and the routes, one row more for them), so a
    batch takes only a few sizes (its buckets) as rows finish. `start` refills the same buffers for the next
    generation when it fits (same rows, widths within the capacity), so graphs captured over them stay valid.
    With a `record` (CPU) or a `routing`, steps record as `StaticKVDecoder`'s do; a record takes no trash slots.
    """

    def __init__(self, model: torch.nn.Module, step_fn: Callable | None = None, *, width_step: int | None = None):
        self.model = model
        self.step_fn = step_fn or fixed_decode_step
        self.width_step = width_step
        self.keys_full: list[torch.Tensor] = []
        self.values_full: list[torch.Tensor] = []

    def fits(self, rows: int, width: int) -> bool:
        """Whether a generation of `rows` rows and `width` = prompt width + max_new_tokens columns reuses the
        buffers (see `start`)."""
        return bool(self.keys_full) and self.keys_full[0].shape[0] == rows and width <= self.capacity

    @property
    def capacity(self) -> int:
        return self.keys_full[0].shape[2]

    def start(self, cache: DynamicCache, prompts: DistinctPrompts, max_new_tokens: int, *,
              record: ForwardRecord | None = None, routing: Routing | None = None, capacity: int | None = None
              ) -> "FixedShapeDecoder":
        """Begin a generation of the rows `prompts.source_B` after the prefill's `cache`: the buffers are refilled
        in place when they fit (`fits`), else allocated with `capacity` columns (default: prompt width +
        `max_new_tokens`)."""
        X, source_B = prompts.width, prompts.source_B
        B, width = source_B.shape[0], X + max_new_tokens
        fresh = not self.fits(B, width)
        if fresh:
            S = max(capacity or width, width)
            self.keys_full = [layer.keys.new_zeros(B, layer.keys.shape[1], S, layer.keys.shape[3])
                              for layer in cache.layers]
            self.values_full = [layer.values.new_zeros(B, layer.values.shape[1], S, layer.values.shape[3])
                                for layer in cache.layers]
            self.bias_full = self.keys_full[0].new_zeros(B, S)
            self.position_full = source_B.new_zeros(B)
            self.slot_rows_full = source_B.new_zeros(B)
            self.column_1 = source_B.new_zeros(1)
        for full, layer_kv in zip(self.keys_full + self.values_full,
                                  [layer.keys for layer in cache.layers] + [layer.values for layer in cache.layers]):
            if not fresh:
                full[:, :, X:].zero_()      # a previous generation's columns: masked, but they must be finite
            full[:, :, :X] = layer_kv[source_B]
        self.bias_full.zero_()
        self.bias_full[:, :X].masked_fill_(~prompts.real_UX[source_B], float("-inf"))
        self.position_full.copy_(prompts.length_U[source_B])
        torch.arange(B, out=self.slot_rows_full)
        self.column_1.fill_(X)
        self.column, self.prompt_width, self.trash_row = X, X, B
        self.record, self.routing = record, routing
        self._view(B)
        return self

    def _view(self, rows: int) -> None:
        """Views of the first `rows` slots: prefixes of the buffers, so their addresses never change."""
        self.rows = rows
        self.keys = [full[:rows] for full in self.keys_full]
        self.values = [full[:rows] for full in self.values_full]
        self.bias_RS, self.position_R = self.bias_full[:rows], self.position_full[:rows]
        self.slot_rows_R = self.slot_rows_full[:rows]

    def step(self, token_R: torch.Tensor) -> torch.Tensor:
        out = self.device_step(token_R)
        self.count_step()
        return out

    def step_and_sample(self, token_R: torch.Tensor, sample: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.device_step(token_R, sample)
        self.count_step()
        return out

    def device_step(self, token_R: torch.Tensor, sample: Sample = None):
        """`step` (with `sample`: `step_and_sample`) without touching any host state: what a CUDA graph captures
        and replays. The caller then counts the step (`count_step`), once per step, replayed or not. (A record's
        bookkeeping is host state: recording steps are never captured.)"""
        if self.column >= self.capacity:
            raise RuntimeError("the static KV cache is full: more steps than max_new_tokens")
        recording, routes = _step_extras(self)
        width = self.attended_width()
        keys, values, bias_RS = self.keys, self.values, self.bias_RS
        if width < self.capacity:       # views of the first columns: the same memory at every step of this width
            keys, values = [k.narrow(2, 0, width) for k in keys], [v.narrow(2, 0, width) for v in values]
            bias_RS = bias_RS.narrow(1, 0, width)
        out = self.step_fn(self.model, token_R, self.position_R, keys, values, bias_RS, self.column_1, recording,
                           sample, routes)
        self.position_R += 1        # in place: the buffers never move
        self.column_1 += 1
        return out

    def attended_width(self) -> int:
        """How many cache columns the next step attends over (see `width_step`)."""
        if self.width_step is None:
            return self.capacity
        return min(self.capacity, -(-(self.column + 1) // self.width_step) * self.width_step)

    def count_step(self) -> None:
        """After a `device_step` (run or replayed): advance the host mirror of the column."""
        self.column += 1

    def snapshot(self) -> Callable[[], None]:
        """What a `device_step` changes besides the cache column it writes (which a repeated step writes again,
        identically): returns a function that puts it back (for a warm-up step before a capture)."""
        position, column_1 = self.position_full.clone(), self.column_1.clone()

        def restore() -> None:
            self.position_full.copy_(position)
            self.column_1.copy_(column_1)

        return restore

    def keep(self, kept_R: torch.Tensor, rows: int | None = None) -> None:
        """Keep these slots (in this order) at the front; with `rows` > len(kept_R), slots len(kept_R)..rows-1
        stay in the batch as trash slots (their row: `trash_row`)."""
        count = kept_R.shape[0]
        rows = count if rows is None else rows
        if rows > count and self.record is not None:
            raise ValueError("a recording decoder keeps exactly its live rows (a record has no trash row)")
        moved_R = torch.nonzero(kept_R != torch.arange(count, device=kept_R.device)).flatten()
        if moved_R.numel():
            moved_from_R = kept_R[moved_R]
            for full in self.keys_full + self.values_full:
                written = full[:, :, :self.column]
                written.index_copy_(0, moved_R, written.index_select(0, moved_from_R))
            for full in (self.bias_full, self.position_full, self.slot_rows_full):
                full.index_copy_(0, moved_R, full.index_select(0, moved_from_R))
        self.slot_rows_full[count:rows] = self.trash_row
        self._view(rows)


class DynamicCacheDecoder:
    """The model's own forward with a growing `DynamicCache`: slower, but correct for any causal LM."""

    def __init__(self, model: torch.nn.Module, cache: DynamicCache, prompts: DistinctPrompts):
        self.model = model
        self.cache = cache
        cache.batch_select_indices(prompts.source_B)     # copy each distinct prompt's KV to its G rows
        self.attention_mask_RS = prompts.real_UX[prompts.source_B].long()
        self.next_position_R = prompts.length_U[prompts.source_B]
        self._cache_keyword = cache_keyword(model)

    def step(self, token_R: torch.Tensor) -> torch.Tensor:
        ones_R1 = torch.ones_like(self.attention_mask_RS[:, :1])
        self.attention_mask_RS = torch.cat([self.attention_mask_RS, ones_R1], dim=1)
        out = self.model(input_ids=token_R[:, None], attention_mask=self.attention_mask_RS,
                         position_ids=self.next_position_R[:, None], use_cache=True,
                         **{self._cache_keyword: self.cache})
        self.next_position_R = self.next_position_R + 1
        return out.logits[:, -1]

    def step_and_sample(self, token_R: torch.Tensor, sample: tuple) -> tuple[torch.Tensor, torch.Tensor]:
        return sample[0](self.step(token_R), *sample[1:])

    def keep(self, kept_R: torch.Tensor) -> None:
        self.cache.batch_select_indices(kept_R)
        self.attention_mask_RS = self.attention_mask_RS[kept_R]
        self.next_position_R = self.next_position_R[kept_R]


def _step_extras(decoder) -> tuple:
    """What a static-cache decoder's step passes its step function besides the cache: the record's weights and
    this step's row slots in it (None without a record), and the replayed routes of the running rows (None
    without Routing Replay)."""
    recording = routes = None
    if decoder.record is not None:
        recording = (decoder.record.weights,
                     decoder.record.add_step(decoder.slot_rows_R, decoder.column - decoder.prompt_width))
    if decoder.routing is not None:
        routes = decoder.routing.at(decoder.slot_rows_R, decoder.position_R)
    return recording, routes
