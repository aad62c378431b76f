"""Batched sampling with a KV cache for any Hugging Face causal LM, through literl's decoder runtime.

Where the time goes and what this engine does about it (numbers in benchmarks/engine_speed.py):
- Prefill runs once per distinct prompt; the G samples of a group share its KV cache (a copy, not a forward).
  For models whose layers the runtime runs exactly, the prefill goes through the runtime's prompt pass (no mask
  or cache building; compiled with the decode step), else through the model's own forward.
- Decode uses `StaticKVDecoder` (preallocated cache, the runtime's layer body) when the model passes its check
  (`literl.model.capabilities`), else the model's own forward with a growing cache.
- Finished rows are dropped from the batch as soon as a check finds one; only the rows that fill their slots
  move (`live_slots_in_place`), so a drop costs little.
- Host syncs (reading "how many rows are done") happen every step on CPU, where they are free, and every
  `sync_every` steps on accelerators, where each one stalls the launch queue.
- Sampling runs inside the decode step (compiled, in the step's graph). Only the uniform draw is made outside, for
  all rows at every step, so a seed gives the same tokens on every path.
"""

from __future__ import annotations

import copy
from typing import Sequence

import torch

from literl.model.capabilities import capabilities
from literl.model.decode import Decoder, DynamicCacheDecoder, StaticKVDecoder, compiled_decode_step, decode_step
from literl.model.moe import ROLLOUT_ROUTES, Routing, new_routes
from literl.model.prompts import DistinctPrompts, distinct_prompts, prefill, prefill_by_layers
from literl.model.quantize import WEIGHT_FORMATS, fake_quantize_
from literl.model.record import Recorder
from literl.rollout.generator import Generation, SamplingParams, check_prompts
from literl.rollout.sampling import sample_from_uniform, uniform_noise

ACCELERATOR_SYNC_EVERY = 8


class HFEngine:
    """Rollout engine over a `transformers` causal LM.

    With `dtype=None` (default) the engine samples from the policy module itself, so weight sync is
    free. With a lower precision (`torch.bfloat16`) it keeps its own copy in that dtype, which makes the
    training–inference mismatch real and measurable on CPU; `sync_weights` refreshes that copy. With
    `weights="float8_e4m3"` that copy's projection weights are also rounded to FP8 (an FP8 engine's numbers,
    computed in `dtype`; `literl.model.quantize`), after every sync too; `weights="int4"` rounds them to 4-bit
    integers with group scales (a weight-only 4-bit engine, the harsher mismatch).

    `decode` picks the decode path: "auto" (the static-cache step when the model supports it), "static", or
    "dynamic" (the model's own forward). `compile=True` compiles the static step, its sampling included, and the
    prompt pass, with `torch.compile` (~20-40 s once per process on CPU; worth it only for long runs).
    `sync_every` sets how many steps pass between checks for finished rows (default: 1 on CPU, 8 on accelerators).

    `recorder` (the policy forward's, `literl.model.policy.PolicyForward.recorder`): `generate(...,
    record_forward=True)` then keeps the decode steps' matmul outputs for an on-policy update, when the engine
    samples from the recorder's module itself on the static path, the model supports it and the record fits the
    recorder's budget; the generation carries it as `forward_record`.

    For a mixture-of-experts model whose MoE blocks the runtime runs, every generation on the static path also
    records the experts each fed token was routed to (prompt and response), as the extra `rollout_routes_BLNK`:
    what R3 replays and what training–inference route agreement compares with (`literl.model.moe`).
    """

    def __init__(self, model: torch.nn.Module, *, eos_token_ids: Sequence[int], pad_id: int,
                 dtype: torch.dtype | None = None, decode: str = "auto", compile: bool = False,
                 sync_every: int | None = None, recorder: Recorder | None = None, weights: str | None = None):
        self.dtype = dtype
        self.eos_token_ids = sorted(set(int(t) for t in eos_token_ids))
        if not self.eos_token_ids:
            raise ValueError("HFEngine needs at least one EOS token id to know when a response ends")
        if decode not in ("auto", "static", "dynamic"):
            raise ValueError(f"decode must be 'auto', 'static' or 'dynamic' (got {decode!r})")
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
        self.sync_every = sync_every
        self.recorder = recorder
        device_type = next(model.parameters()).device.type
        self._step_fn = compiled_decode_step(device_type) if compile else decode_step

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
    def uses_static_kv(self) -> bool:
        """Whether decode runs on the static-cache step (checked once, on first use)."""
        if self.decode == "dynamic":
            return False
        supported = capabilities(self.model).static_decode
        if self.decode == "static" and not supported:
            raise ValueError(f"{type(self.model).__name__} does not support the static KV decode step")
        return supported

    def can_record(self, rows: int, max_new_tokens: int) -> bool:
        """Whether a generation of `rows` responses would keep its forward (see the class docstring)."""
        return (self.recorder is not None and self.uses_static_kv and capabilities(self.model).record
                and self.recorder.fits(self.model, rows * (max_new_tokens - 1)))

    @torch.inference_mode()
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams,
                 *, rng: torch.Generator | None = None, record_forward: bool = False) -> Generation:
        device = next(self.model.parameters()).device
        B, T = len(prompts), params.max_new_tokens
        if B == 0:
            return Generation.empty()
        check_prompts(prompts)
        was_training = self.model.training
        self.model.eval()
        try:
            prepared = distinct_prompts(prompts, self.pad_id, device)
            use_static = self.uses_static_kv and self._fits_window(prepared.width + T)
            routing = self._routing(B, prepared.width + T, device) if use_static else None
            first_logits_UV, cache = self._prefill(prepared, routing)
            record = None
            if record_forward and use_static and T > 1 and self.can_record(B, T):
                record = self.recorder.start(self.model, B, T, device)
            decoder = self._decoder(cache, prepared, T, use_static, record, routing)
            ids_BT, logp_BT = self._sample_loop(decoder, first_logits_UV[prepared.source_B], params,
                                                _device_rng(rng, device))
        finally:
            self.model.train(was_training)
        generation = self._generation(ids_BT, logp_BT)
        generation.forward_record = record
        if routing is not None:
            generation.extras[ROLLOUT_ROUTES] = routing.record_BLNK.cpu()
        return generation

    def _routing(self, rows: int, length: int, device: torch.device) -> Routing | None:
        """Where the experts of every fed token go, for an MoE model the runtime routes (else None)."""
        moe = capabilities(self.model).moe
        if moe is None:
            return None
        return Routing(record_BLNK=new_routes(rows, length, moe.layers, moe.top_k, device))

    def _prefill(self, prepared: DistinctPrompts, routing: Routing | None):
        """Through the runtime's prompt pass when its hidden states are the decoder's and the model's logits are
        its head applied to them (recording the prompts' routes when asked); else through the model's own
        forward."""
        caps = capabilities(self.model)
        if caps.layers and caps.shared_prompts and caps.head is not None:
            routes = None if routing is None else prepared.routes_at(routing)
            out = prefill_by_layers(self.model, prepared, compiled=self.compile, routes=routes)
            if routing is not None:
                prepared.share_prompt_routes(routing.record_BLNK)
            return out
        return prefill(self.model, prepared)

    def _fits_window(self, length: int) -> bool:
        """Sequences longer than a sliding attention window decode through the model's own forward, whose cache
        keeps the window; the static step attends to every column."""
        caps = capabilities(self.model)
        if caps.fits_window(length):
            return True
        if self.decode == "static":
            raise ValueError(f"decode='static' attends to every position, but {type(self.model).__name__} uses a "
                             f"sliding attention window of {caps.window} and these sequences reach {length} "
                             f"positions; use decode='auto' or 'dynamic' (rollout.decode)")
        return False

    def _decoder(self, cache, prepared: DistinctPrompts, T: int, use_static: bool, record, routing) -> Decoder:
        if use_static:
            return StaticKVDecoder(self.model, cache, prepared, T, step_fn=self._step_fn, record=record,
                                   routing=routing)
        return DynamicCacheDecoder(self.model, cache, prepared)

    def _sample_loop(self, decoder: Decoder, logits_BV: torch.Tensor, params: SamplingParams,
                     rng: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample T steps; return (ids_BT, logp_BT), pad / 0 where a row was no longer running.

        Slots are the live rows of the decoder's batch; `row_R` maps them back to rows of the output. The first
        token is sampled from the prefill's logits, each later one by the decoder's `step_and_sample`.
        """
        (B, V), T, device = logits_BV.shape, params.max_new_tokens, logits_BV.device
        ids_BT = torch.full((B, T), self.pad_id, dtype=torch.long, device=device)
        logp_BT = torch.zeros((B, T), dtype=torch.float32, device=device)
        eos_E = torch.tensor(self.eos_token_ids, device=device)
        sync_every = self.sync_every or (1 if device.type == "cpu" else ACCELERATOR_SYNC_EVERY)
        row_R = torch.arange(B, device=device)
        done_R = torch.zeros(B, dtype=torch.bool, device=device)
        for t in range(T):
            # Noise for all B rows at every step, so a row's sample never depends on which rows were dropped.
            uniform_BV = None if params.greedy else uniform_noise(B, V, device=device, rng=rng)
            uniform_RV = uniform_BV if uniform_BV is None or row_R.shape[0] == B else uniform_BV[row_R]
            if t == 0:
                token_R, token_logp_R = sample_from_uniform(logits_BV, params, uniform_RV)
            else:
                token_R, token_logp_R = decoder.step_and_sample(token_R, (sample_from_uniform, params, uniform_RV))
            ids_BT[row_R, t], logp_BT[row_R, t] = token_R, token_logp_R
            done_R |= torch.isin(token_R, eos_E)
            if t == T - 1:
                break
            if (t + 1) % sync_every == 0:
                n_done = int(done_R.sum())
                if n_done == done_R.shape[0]:
                    break
                # Finished rows are dropped at every check that finds one: a drop moves only the rows filling
                # the holes, and waiting for a fraction of the batch to finish was slower (benchmark workload,
                # rollout wall time against waiting for 1/8: −2% compiled / −6% eager; 1/16 −1% / −1%; 1/4
                # +3% / +5%; within the noise of a full RL step, docs/speed.md).
                if n_done:
                    kept_R = live_slots_in_place(~done_R)
                    decoder.keep(kept_R)
                    row_R, token_R, done_R = row_R[kept_R], token_R[kept_R], done_R[kept_R]
        return ids_BT, logp_BT

    def _generation(self, ids_BT: torch.Tensor, logp_BT: torch.Tensor) -> Generation:
        """Cut each row after its first EOS.

        Finished rows keep sampling until they are dropped or the loop ends, and a row is only dropped, and
        the loop only stops early, after an EOS: so every column up to a row's first EOS was written.
        """
        eos_BT = torch.isin(ids_BT, torch.tensor(self.eos_token_ids, device=ids_BT.device))
        mask_BT = (eos_BT.long().cumsum(-1) - eos_BT.long()) == 0
        ids_BT = torch.where(mask_BT, ids_BT, torch.full_like(ids_BT, self.pad_id))
        logp_BT = torch.where(mask_BT, logp_BT, torch.zeros_like(logp_BT))
        truncated_B = ~(eos_BT & mask_BT).any(-1)
        return Generation(ids_BT.cpu(), mask_BT.cpu(), logp_BT.cpu(), truncated_B.cpu())


def live_slots_in_place(live_R: torch.Tensor) -> torch.Tensor:
    """The n live slots, ordered for a cheap `Decoder.keep`: a live slot among the first n keeps its position,
    and the live slots beyond n fill the holes the finished ones leave there, so compacting moves only as many
    rows as there are holes (dropping 16 scattered rows of 128 moves at most 16, not every row after the first
    hole). Which slot holds a row does not change its samples: the noise is drawn per batch row."""
    n = int(live_R.sum())
    kept_R = torch.arange(n, device=live_R.device)
    holes = torch.nonzero(~live_R[:n]).flatten()
    kept_R[holes] = torch.nonzero(live_R[n:]).flatten() + n
    return kept_R


def _device_rng(rng: torch.Generator | None, device: torch.device) -> torch.Generator | None:
    """A generator on the sampling device, seeded from `rng` so that a seeded run repeats exactly."""
    if rng is None or rng.device.type == device.type:
        return rng
    seed = int(torch.randint(0, 2**62, (1,), generator=rng, device=rng.device))
    return torch.Generator(device=device).manual_seed(seed)
