"""Batched sampling with a KV cache for any Hugging Face causal LM, through literl's decoder runtime.

Where the time goes and what this engine does about it (numbers in benchmarks/engine_speed.py, docs/speed.md):
- Prefill runs once per distinct prompt, all of them in one batched pass; the G samples of a group share its KV
  cache (a copy, not a forward). For models whose layers the runtime runs exactly, the prefill goes through the
  runtime's prompt pass (no mask or cache building; compiled with the decode step), else through the model's own
  forward.
- Decode takes one of three routes (`decode_route`; the choice for `decode="auto"` is made in
  `literl.model.capabilities`, by device):
    static       `StaticKVDecoder`: attends over the columns written so far; the CPU default
    fixed        `FixedShapeDecoder`: one shape per batch size (the whole cache attended, unwritten columns
                 masked); on CUDA captured as one CUDA graph per batch bucket (`cuda_graphs`): the CUDA default
    dynamic      the model's own forward with a growing cache (models the runtime does not run)
- Finished rows leave the batch at a check (`literl.rollout.decode_loop`): at every check that finds one
  (moving only the rows that fill their slots), or with CUDA graphs once the running rows fit a smaller bucket.
- Host syncs (reading "how many rows are done") happen every step on CPU, where they are free, and every
  `sync_every` steps on accelerators, where each one stalls the launch queue.
- Sampling runs inside the decode step (compiled: in the step's graph; captured: in the CUDA graph, the noise
  drawn there too from the run's generator). Every path draws the same uniform noise for all rows at every step,
  so a seed gives the same tokens on every path.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from literl.model.attention import rollout_attention
from literl.model.capabilities import CUDA_GRAPHS, auto_decode_route, capabilities, captures_cuda_graphs
from literl.model.compiled import compile_seconds, compiles_layer_by_layer
from literl.model.cuda_graphs import BucketGraphs, decode_buckets
from literl.model.decode import (Decoder, DynamicCacheDecoder, FixedShapeDecoder, StaticKVDecoder,
                                 compiled_decode_step, decode_step, fixed_decode_step)
from literl.model.moe import ROLLOUT_ROUTES, Routing, new_routes
from literl.model.prompt_pass import DistinctPrompts, distinct_prompts, prefill, prefill_by_layers
from literl.model.quantize import WEIGHT_FORMATS, fake_quantize_
from literl.model.record import Recorder
from literl.rollout.decode_loop import SamplingBuffers, sample_tokens
from literl.rollout.engine import Generation, SamplingParams, check_prompts

ACCELERATOR_SYNC_EVERY = 8
DECODE_CHOICES = ("auto", "static", "fixed", "dynamic")
# The fixed step's cache width (on CUDA) and the width it attends over are multiples of this many columns: a step
# reads at most 63 unwritten columns, there are few widths to capture, and generations whose prompts differ a
# little in width replay the same graphs.
COLUMN_STEP = 64


class NativeEngine:
    """literl's own rollout engine (`rollout.engine=native`) over a `transformers` causal LM: its decoder runtime
    (`literl.model`), not Hugging Face's generate.

    With `dtype=None` (default) the engine samples from the policy module itself, so weight sync is
    free. With a lower precision (`torch.bfloat16`) it keeps its own copy in that dtype, which makes the
    training–inference mismatch real and measurable on CPU; `sync_weights` refreshes that copy. With
    `weights="float8_e4m3"` that copy's projection weights are also rounded to FP8 (an FP8 engine's numbers,
    computed in `dtype`; `literl.model.quantize`), after every sync too; `weights="int4"` rounds them to 4-bit
    integers with group scales (a weight-only 4-bit engine, the harsher mismatch).

    `decode` picks the decode route (module docstring): "auto" (`capabilities.auto_decode_route` for the model's
    device, when the model supports the static-cache step), "static", "fixed" or "dynamic". `compile=True`
    compiles the static or fixed step, its sampling included, and the prompt pass, with `torch.compile` (~20-40 s
    once per process on CPU; worth it only for long runs). `cuda_graphs=False` runs the fixed step eagerly on CUDA
    (for comparisons and debugging). `sync_every` sets how many steps pass between checks for finished rows
    (default: 1 on CPU, 8 on accelerators).

    `recorder` (the policy forward's, `literl.model.policy.PolicyForward.recorder`): a generation whose params ask
    `keep_forward` then keeps the decode steps' matmul outputs for an on-policy update, when the engine
    samples from the recorder's module itself on the static or fixed route without CUDA graphs (a graph cannot
    write a record whose rows move every step), the model supports it and the record fits the recorder's budget;
    the generation carries it as `forward_record`.

    For a mixture-of-experts model whose MoE blocks the runtime runs, every generation on a static-cache route
    (inside the CUDA graphs too) also records the experts each fed token was routed to (prompt and response), as
    the extra `rollout_routes_BLNK`: what R3 replays and what training–inference route agreement compares with
    (`literl.model.moe`).
    """

    def __init__(self, model: torch.nn.Module, *, eos_token_ids: Sequence[int], pad_id: int,
                 dtype: torch.dtype | None = None, decode: str = "auto", compile: bool = False,
                 sync_every: int | None = None, recorder: Recorder | None = None, weights: str | None = None,
                 cuda_graphs: bool = True):
        self.dtype = dtype
        self.eos_token_ids = sorted(set(int(t) for t in eos_token_ids))
        if not self.eos_token_ids:
            raise ValueError("NativeEngine needs at least one EOS token id to know when a response ends")
        if decode not in DECODE_CHOICES:
            raise ValueError(f"decode must be one of {', '.join(map(repr, DECODE_CHOICES))} (got {decode!r})")
        if weights not in (None, *WEIGHT_FORMATS):
            raise ValueError(f"weights must be None or one of {WEIGHT_FORMATS} (got {weights!r})")
        self.pad_id = int(pad_id)
        self.model = model
        self.weights = weights
        if weights is not None or (dtype is not None and dtype != next(model.parameters()).dtype):
            self.model = copy.deepcopy(model).to(dtype or next(model.parameters()).dtype).eval()
            self._round_weights()
        self.decode = decode
        self.compile = compile
        self.cuda_graphs = cuda_graphs
        self.sync_every = sync_every
        self.recorder = recorder
        self._captured: _CapturedDecode | None = None

    def sync_weights(self, policy: torch.nn.Module) -> None:
        if self.model is policy:
            return
        with torch.no_grad():
            for dst, src in zip(self.model.parameters(), policy.parameters()):
                dst.copy_(src)
        self._round_weights()

    def _round_weights(self) -> None:
        if self.weights is not None:
            fake_quantize_(self.model, self.weights)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def uses_static_kv(self) -> bool:
        """Whether decode runs on a static-cache step, static or fixed (checked once, on first use)."""
        if self.decode == "dynamic":
            return False
        supported = capabilities(self.model).static_decode
        if self.decode in ("static", "fixed") and not supported:
            raise ValueError(f"{type(self.model).__name__} does not support the static KV decode step "
                             f"(decode={self.decode!r}); use decode='auto' or 'dynamic' (rollout.decode)")
        return supported

    @property
    def decode_route(self) -> str:
        """The route `generate` decodes on: "static", "fixed", "cuda_graphs" (fixed, captured) or "dynamic" (also
        taken, whatever this says, by sequences longer than the model's attention window)."""
        if not self.uses_static_kv:
            return "dynamic"
        route = auto_decode_route(self.device) if self.decode == "auto" else self.decode
        if route == "fixed" and self.cuda_graphs and captures_cuda_graphs(self.device):
            return CUDA_GRAPHS
        return route

    def decode_report(self) -> dict:
        """What a benchmark reports about this engine's decode: its route, the seconds `torch.compile` took for the
        compiled steps and prompt pass in this process, and, with CUDA graphs, the captured buckets, their capture
        seconds and why capturing failed (None when it did not)."""
        graphs = None if self._captured is None else self._captured.graphs
        return {"route": self.decode_route, "compile": self.compile, "compile_seconds": compile_seconds(),
                "graphs": sorted(graphs.graphs) if graphs else [],
                "capture_seconds": round(graphs.capture_seconds, 3) if graphs else 0.0,
                "capture_failure": graphs.failure if graphs else None}

    def can_record(self, rows: int, max_new_tokens: int) -> bool:
        """Whether a generation of `rows` responses would keep its forward (see the class docstring)."""
        return (self.recorder is not None and self.decode_route in ("static", "fixed")
                and capabilities(self.model).record
                and self.recorder.fits(self.model, rows * (max_new_tokens - 1)))

    @torch.inference_mode()
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 *, rng: torch.Generator | None = None,
                 before_step: Callable[[int], None] | None = None) -> Generation:
        """`before_step(t)`, when given, runs before every decode step t >= 1 (the forward that samples token t):
        an asynchronous producer loads a newer policy version there (partial rollouts, `literl.rollout.
        async_rollout`: the weights are copied in place, so captured CUDA graphs read the new ones), or raises to
        abandon the generation."""
        device = self.device
        B, T = len(prompts), params.max_new_tokens
        if B == 0:
            return Generation.empty()
        check_prompts(prompts)
        was_training = self.model.training
        self.model.eval()
        try:
            prepared = distinct_prompts(prompts, self.pad_id, device)
            width = prepared.width + T
            route = self.decode_route if self._fits_window(width) else "dynamic"
            captured = self._capture_state(B, T, params, width) if route == CUDA_GRAPHS else None
            routing = self._routing(B, width, captured) if route != "dynamic" else None
            with rollout_attention(device):
                first_logits_UV, cache = self._prefill(prepared, routing)
                record = None
                if params.keep_forward and T > 1 and route in ("static", "fixed") and self.can_record(B, T):
                    record = self.recorder.start(self.model, B, T, device)
                decoder, buffers = self._decoder(route, cache, prepared, T, record, routing, captured,
                                                 self._stop_ids(params))
                sync_every = self.sync_every or (1 if device.type == "cpu" else ACCELERATOR_SYNC_EVERY)
                # The fixed step on CUDA runs at bucket sizes, graphs or not (so the eager step is the graphs'
                # exact reference); elsewhere batches are exact.
                fixed_on_cuda = route in ("fixed", CUDA_GRAPHS) and captures_cuda_graphs(device)
                ids_BT, logp_BT = self._sample(decoder, first_logits_UV[prepared.source_B], params, rng, buffers,
                                               sync_every, decode_buckets(B) if fixed_on_cuda else None, captured,
                                               before_step)
        finally:
            self.model.train(was_training)
        generation = self._generation(ids_BT, logp_BT, self._stop_ids(params))
        generation.forward_record = record
        if routing is not None:
            generation.extras[ROLLOUT_ROUTES] = routing.record_BLNK[:B, :width].cpu()
        return generation

    def _routing(self, rows: int, length: int, captured: "_CapturedDecode | None") -> Routing | None:
        """Where the experts of every fed token go, for an MoE model the runtime routes (else None): rows × length
        positions, plus a trash row for the slots that pad a bucket."""
        moe = capabilities(self.model).moe
        if moe is None:
            return None
        if captured is not None:
            if captured.routes_BLNK is None:
                captured.routes_BLNK = new_routes(rows + 1, captured.decoder_capacity, moe.layers, moe.top_k,
                                                  self.device)
            return Routing(record_BLNK=captured.routes_BLNK.fill_(-1))
        return Routing(record_BLNK=new_routes(rows + 1, length, moe.layers, moe.top_k, self.device))

    def _prefill(self, prepared: DistinctPrompts, routing: Routing | None):
        """Through the runtime's prompt pass when its hidden states are the decoder's and the model's logits are
        its head applied to them (recording the prompts' routes when asked); else through the model's own
        forward."""
        caps = capabilities(self.model)
        if caps.layers and caps.shared_prompts and caps.head is not None:
            routes = None if routing is None else prepared.routes_at(routing)
            out = prefill_by_layers(self.model, prepared, compiled=self.compile, routes=routes)
            if routing is not None:
                prepared.share_prompt_routes(routing.record_BLNK[:prepared.source_B.shape[0]])
            return out
        return prefill(self.model, prepared)

    def _fits_window(self, length: int) -> bool:
        """Sequences longer than a sliding attention window decode through the model's own forward, whose cache
        keeps the window; the static-cache steps attend to every column."""
        caps = capabilities(self.model)
        if caps.fits_window(length):
            return True
        if self.decode in ("static", "fixed"):
            raise ValueError(f"decode={self.decode!r} attends to every position, but {type(self.model).__name__} "
                             f"uses a sliding attention window of {caps.window} and these sequences reach {length} "
                             f"positions; use decode='auto' or 'dynamic' (rollout.decode)")
        return False

    def _step_fn(self, fixed: bool):
        if not self.compile:
            return fixed_decode_step if fixed else decode_step
        return compiled_decode_step(self.device.type, fixed=fixed, by_layer=compiles_layer_by_layer(self.device.type))

    def _stop_ids(self, params: SamplingParams) -> list[int]:
        """The ids that end a response: the engine's EOS ids, and the call's own stops (`stop_token_ids`)."""
        if not params.stop_token_ids:
            return self.eos_token_ids
        return sorted(set(self.eos_token_ids) | {int(t) for t in params.stop_token_ids})

    def _decoder(self, route: str, cache, prepared: DistinctPrompts, T: int, record, routing,
                 captured: "_CapturedDecode | None", stop_ids: list[int]) -> tuple[Decoder, SamplingBuffers]:
        B = prepared.source_B.shape[0]
        if captured is not None:
            decoder = captured.decoder.start(cache, prepared, T, routing=routing, capacity=captured.decoder_capacity)
            captured.buffers.reset()
            return decoder, captured.buffers
        buffers = SamplingBuffers(B, T, self.pad_id, stop_ids, self.device)
        if route == "fixed":
            # On CUDA the cache is as wide as a captured one (the same shapes as the graphs run).
            capacity = _capacity(prepared.width + T) if captures_cuda_graphs(self.device) else None
            return FixedShapeDecoder(self.model, self._step_fn(fixed=True), width_step=COLUMN_STEP).start(
                cache, prepared, T, record=record, routing=routing, capacity=capacity), buffers
        if route == "static":
            return StaticKVDecoder(self.model, cache, prepared, T, step_fn=self._step_fn(fixed=False), record=record,
                                   routing=routing), buffers
        return DynamicCacheDecoder(self.model, cache, prepared), buffers

    def _sample(self, decoder: Decoder, first_logits_BV: torch.Tensor, params: SamplingParams,
                rng: torch.Generator | None, buffers: SamplingBuffers, sync_every: int, buckets: list[int] | None,
                captured: "_CapturedDecode | None", before_step: Callable[[int], None] | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        device = first_logits_BV.device
        source = _device_rng(rng, device)
        if captured is None:
            return sample_tokens(decoder, first_logits_BV, params, source, buffers, sync_every=sync_every,
                                 buckets=buckets, before_step=before_step)
        # The graphs draw from the generator registered with them: it takes the run's generator state, and gives
        # it back advanced as the same eager draws would have.
        generator = captured.generator
        if source is None:
            generator.seed()
        else:
            generator.set_state(source.get_state())
        out = sample_tokens(decoder, first_logits_BV, params, generator, buffers, sync_every=sync_every,
                            buckets=buckets, graphs=captured.graphs, before_step=before_step)
        if source is not None:
            source.set_state(generator.get_state())
        return out

    def _capture_state(self, rows: int, T: int, params: SamplingParams, width: int) -> "_CapturedDecode":
        """The buffers and graphs of the CUDA-graph route, reused from the previous generation when this one has the
        same rows, max_new_tokens and sampling parameters, its width fits their cache (and does not waste more than
        two capacity steps of it), and the model's weights are where they were (graphs read them by address)."""
        capacity = _capacity(width)
        key = (rows, T, params, _weight_addresses(self.model))
        captured = self._captured
        if (captured is None or captured.key != key or width > captured.decoder_capacity
                or captured.decoder_capacity > capacity + 2 * COLUMN_STEP):
            self._captured = None       # drop the old graphs (and their memory) before making new ones
            generator = torch.Generator(device=self.device)
            captured = self._captured = _CapturedDecode(
                key=key, decoder=FixedShapeDecoder(self.model, self._step_fn(fixed=True), width_step=COLUMN_STEP),
                buffers=SamplingBuffers(rows, T, self.pad_id, self._stop_ids(params), self.device),
                graphs=BucketGraphs(self.device, generator), generator=generator, decoder_capacity=capacity)
        return captured

    def _generation(self, ids_BT: torch.Tensor, logp_BT: torch.Tensor, stop_ids: list[int] | None = None
                    ) -> Generation:
        """Cut each row after its first EOS (or other stop id).

        Finished rows keep sampling until they leave the batch or the loop ends, and a row only leaves, and the
        loop only stops early, after an EOS: so every column up to a row's first EOS was written.
        """
        stops = self.eos_token_ids if stop_ids is None else stop_ids
        eos_BT = torch.isin(ids_BT, torch.tensor(stops, device=ids_BT.device))
        mask_BT = (eos_BT.long().cumsum(-1) - eos_BT.long()) == 0
        ids_BT = torch.where(mask_BT, ids_BT, torch.full_like(ids_BT, self.pad_id))
        logp_BT = torch.where(mask_BT, logp_BT, torch.zeros_like(logp_BT))
        truncated_B = ~(eos_BT & mask_BT).any(-1)
        return Generation(ids_BT.cpu(), mask_BT.cpu(), logp_BT.cpu(), truncated_B.cpu())


@dataclass
class _CapturedDecode:
    """What an engine's CUDA graphs hold on to between generations: the fixed-shape decoder's buffers, the
    sampling loop's, the MoE routes (made on first use) and the generator the graphs draw from."""

    key: tuple
    decoder: FixedShapeDecoder
    buffers: SamplingBuffers
    graphs: BucketGraphs
    generator: torch.Generator
    decoder_capacity: int
    routes_BLNK: torch.Tensor | None = None


def _capacity(width: int) -> int:
    return -(-width // COLUMN_STEP) * COLUMN_STEP


def _weight_addresses(model: torch.nn.Module) -> tuple[int, ...]:
    return tuple(p.data_ptr() for p in model.parameters())


def _device_rng(rng: torch.Generator | None, device: torch.device) -> torch.Generator | None:
    """A generator on the sampling device, seeded from `rng` so that a seeded run repeats exactly."""
    if rng is None or rng.device.type == device.type:
        return rng
    seed = int(torch.randint(0, 2**62, (1,), generator=rng, device=rng.device))
    return torch.Generator(device=device).manual_seed(seed)


HFEngine = NativeEngine     # the name before the package layout (rollout.engine=hf); kept for old imports
