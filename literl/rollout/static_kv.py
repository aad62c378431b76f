"""A lean decode step with a preallocated KV cache, for decoder-only LMs of the Llama / Qwen family.

Why: for a small model, a large share of the model's own decode step is not the maths: `DynamicCache` grows
by concatenation (every step copies the whole cache), and masks and positions are rebuilt at every step
(benchmark model, batch 128, 1 thread: 16 ms per step through the model's forward, 10.4 ms here).
Here the cache is allocated once (prompt width + max_new_tokens columns), a step writes one column and
attends over the columns written so far, and the layers' own submodules (norms, projections, MLP or MoE
block, rotary embedding) do the maths, so the numbers are those of the model's forward.

It applies to pre-norm decoders whose layers compute `h += attn(input_layernorm(h)); h += mlp(post_norm(h))`
with q/k/v/o projections, optional per-head q/k norms and standard rotary embeddings; a model with
sliding-window layers only while the sequence fits in the window (`fits_attention_window`).
`supports_static_kv` checks the structure and then compares a few decode steps with the model's forward;
any other model uses `DynamicCacheDecoder`.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from transformers.cache_utils import DynamicCache

from literl.compiled import compile_for_varying_sizes
from literl.rollout.decoding import DistinctPrompts, distinct_prompts, prefill
from literl.rollout.generator import SamplingParams
from literl.rollout.sampling import sample_from_uniform

_LAYER_PARTS = ("self_attn", "input_layernorm", "post_attention_layernorm", "mlp")
_ATTENTION_PARTS = ("q_proj", "k_proj", "v_proj", "o_proj", "head_dim", "scaling")
_BODY_PARTS = ("embed_tokens", "layers", "norm", "rotary_emb")
# Config fields of attention variants this step does not implement.
_UNSUPPORTED_CONFIG = ("attn_logit_softcapping", "final_logit_softcapping")


class StaticKVDecoder:
    """Decoder over a preallocated per-layer KV cache [R, kv_heads, S, head_dim], S = P + max_new_tokens.

    `step_fn` is `static_decode_step` or its compiled version (`compiled_decode_step`). With a `record`
    (`literl.rollout.recording.ForwardRecord`), steps run `recording_step_fn` instead, which also keeps every
    layer's matmul outputs in the record, and the decoder tracks which batch row each slot holds.
    """

    def __init__(self, model: torch.nn.Module, cache: DynamicCache, prompts: DistinctPrompts,
                 max_new_tokens: int, step_fn=None, *, record=None, recording_step_fn=None):
        self.model = model
        self.step_fn = step_fn or static_decode_step
        P, source_B = prompts.width, prompts.source_B
        self.record, self.recording_step_fn = record, recording_step_fn
        if record is not None:
            self.slot_rows_R = torch.arange(source_B.shape[0], device=source_B.device)
        self.prompt_width = P
        # One spare column: a slice of all columns would be a distinct shape for torch.compile (a recompile).
        capacity = P + max_new_tokens
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        for layer in cache.layers:
            keys_UKPD, values_UKPD = layer.keys, layer.values
            R, K, _, D = source_B.shape[0], keys_UKPD.shape[1], keys_UKPD.shape[2], keys_UKPD.shape[3]
            keys_RKSD = keys_UKPD.new_empty(R, K, capacity, D)
            values_RKSD = values_UKPD.new_empty(R, K, capacity, D)
            keys_RKSD[:, :, :P] = keys_UKPD[source_B]
            values_RKSD[:, :, :P] = values_UKPD[source_B]
            self.keys.append(keys_RKSD)
            self.values.append(values_RKSD)
        # Additive attention bias: −inf on left padding; unwritten columns are never read (sliced away).
        dtype = self.keys[0].dtype
        self.bias_RS = torch.zeros(source_B.shape[0], capacity, dtype=dtype, device=source_B.device)
        self.bias_RS[:, :P].masked_fill_(~prompts.real_UP[source_B], float("-inf"))
        self.position_R = prompts.length_U[source_B]
        self.column = P

    def step(self, token_R: torch.Tensor) -> torch.Tensor:
        return self._step(token_R, None)

    def step_and_sample(self, token_R: torch.Tensor, params: SamplingParams, uniform_RV: torch.Tensor | None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
        # Sampling inside the step function: compiled, it joins the step's graph (~12 small eager ops per token
        # step fewer); the noise's uniform draw stays outside, so the random stream is the same either way.
        return self._step(token_R, (params, uniform_RV))

    def _step(self, token_R: torch.Tensor, sample: tuple[SamplingParams, torch.Tensor | None] | None):
        if self.column >= self.bias_RS.shape[1]:
            raise RuntimeError("the static KV cache is full: more steps than max_new_tokens")
        if self.record is None:
            out = self.step_fn(self.model, token_R, self.position_R, self.keys, self.values, self.bias_RS,
                               self.column, sample)
        else:
            records = self.record.add_step(self.slot_rows_R, self.column - self.prompt_width)
            out = self.recording_step_fn(self.model, token_R, self.position_R, self.keys, self.values,
                                         self.bias_RS, self.column, self.record.weights, records, sample)
        self.column += 1
        self.position_R = self.position_R + 1
        return out

    def keep(self, slots_K: torch.Tensor) -> None:
        # Kept rows move to the front of the same buffers (no new allocation). Only the rows whose slot changes
        # move (`hf_engine.live_slots_in_place` keeps most in place), and only their written columns: early in a
        # rollout most of each buffer is still empty.
        K, written = slots_K.shape[0], self.column
        moved_M = torch.nonzero(slots_K != torch.arange(K, device=slots_K.device)).flatten()
        source_M = slots_K[moved_M]
        for cache in (self.keys, self.values):
            for i, full_RKSD in enumerate(cache):
                if moved_M.numel():
                    written_RKWD = full_RKSD[:, :, :written]
                    written_RKWD.index_copy_(0, moved_M, written_RKWD.index_select(0, source_M))
                cache[i] = full_RKSD[:K]
        self.bias_RS = self.bias_RS[slots_K]
        self.position_R = self.position_R[slots_K]
        if self.record is not None:
            self.slot_rows_R = self.slot_rows_R[slots_K]


def static_decode_step(model: torch.nn.Module, token_R: torch.Tensor, position_R: torch.Tensor,
                       keys: list[torch.Tensor], values: list[torch.Tensor], bias_RS: torch.Tensor,
                       column: int, sample: tuple[SamplingParams, torch.Tensor | None] | None = None):
    """Feed one token per row at cache column `column` (its rotary position is `position_R`); return logits_RV, or
    with `sample=(params, uniform_RV)` the next token and its log-prob (`sampling.sample_from_uniform`)."""
    body = model.get_decoder()
    hidden_R1H = body.embed_tokens(token_R[:, None])
    cos_R1D, sin_R1D = body.rotary_emb(hidden_R1H, position_R[:, None])
    bias_R11S = bias_RS[:, None, None, :column + 1]
    for layer, keys_RKSD, values_RKSD in zip(body.layers, keys, values):
        attended_R1H = _attend(layer.self_attn, layer.input_layernorm(hidden_R1H), cos_R1D, sin_R1D,
                               keys_RKSD, values_RKSD, bias_R11S, column)
        hidden_R1H = hidden_R1H + attended_R1H
        mlp_out = layer.mlp(layer.post_attention_layernorm(hidden_R1H))
        hidden_R1H = hidden_R1H + (mlp_out[0] if isinstance(mlp_out, tuple) else mlp_out)
    return sampled(model.get_output_embeddings()(body.norm(hidden_R1H))[:, 0], sample)


def sampled(logits_RV: torch.Tensor, sample: tuple[SamplingParams, torch.Tensor | None] | None):
    """A step's result: its logits, or with `sample=(params, uniform_RV)` the sampled (token_R, logp_R)."""
    return logits_RV if sample is None else sample_from_uniform(logits_RV, *sample)


@functools.cache
def compiled_decode_step(device_type: str = "cpu"):
    """`static_decode_step` through `torch.compile` (compiled on first use, once per process and device type;
    shared by every engine): one graph for every batch size and cache column; a step with one row left runs
    eagerly (`literl.compiled`). On CPU its kernels are called from C++ (measured there only)."""
    return compile_for_varying_sizes(static_decode_step, cpp_wrapper=device_type == "cpu",
                                     eager_when=lambda model, token_R, *rest: token_R.shape[0] < 2)


def _attend(attn, x_R1H, cos_R1D, sin_R1D, keys_RKSD, values_RKSD, bias_R11S, column: int) -> torch.Tensor:
    R, D = x_R1H.shape[0], attn.head_dim
    # One token per row: the model's [R, 1, heads, D] and [R, heads, 1, D] are the same memory as [R, heads, D],
    # so the transposes of the full forward are not needed.
    out_RKGD = attend_projected(attn, attn.q_proj(x_R1H).view(R, -1, D), attn.k_proj(x_R1H).view(R, -1, D),
                                attn.v_proj(x_R1H).view(R, -1, D), cos_R1D, sin_R1D, keys_RKSD, values_RKSD,
                                bias_R11S, column)
    return attn.o_proj(out_RKGD.reshape(R, 1, -1))


def attend_projected(attn, query_RQD: torch.Tensor, key_RKD: torch.Tensor, value_RKD: torch.Tensor,
                     cos_R1D: torch.Tensor, sin_R1D: torch.Tensor, keys_RKSD: torch.Tensor, values_RKSD: torch.Tensor,
                     bias_R11S: torch.Tensor, column: int,
                     keep: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """One decode step's attention from its projected q/k/v: per-head norms and rotary, the new key and value
    written at cache column `column`, then attention over columns 0..column; returns out_RKGD.

    `keep=(out_RF, lse_RQ)` (CPU only: a record's rows, `recording.keeps_attention`) also writes the output, one
    row per token, and the log-sum-exp per query head: the CPU flash kernel, which SDPA runs here anyway, gives
    both."""
    R, D = query_RQD.shape[0], query_RQD.shape[-1]
    if getattr(attn, "q_norm", None) is not None:
        query_RQD = attn.q_norm(query_RQD)
    if getattr(attn, "k_norm", None) is not None:
        key_RKD = attn.k_norm(key_RKD)
    query_RQD = rotate(query_RQD, cos_R1D, sin_R1D)
    keys_RKSD.narrow(2, column, 1).copy_(rotate(key_RKD, cos_R1D, sin_R1D)[:, :, None])
    values_RKSD.narrow(2, column, 1).copy_(value_RKD[:, :, None])
    # Grouped-query attention without repeating K/V: the query heads sharing a KV head become its G "queries".
    query_RKGD = query_RQD.view(R, keys_RKSD.shape[1], -1, D)
    if keep is None:
        return F.scaled_dot_product_attention(query_RKGD, keys_RKSD[:, :, :column + 1],
                                              values_RKSD[:, :, :column + 1], attn_mask=bias_R11S, scale=attn.scaling)
    out_RKGD, lse_RKG = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query_RKGD, keys_RKSD[:, :, :column + 1], values_RKSD[:, :, :column + 1], 0.0, False, attn_mask=bias_R11S,
        scale=attn.scaling)
    # Query head h = k·G + g, as in the update's [R, heads, W, D] layout.
    keep[0].copy_(out_RKGD.reshape(R, -1))
    keep[1].copy_(lse_RKG.reshape(R, -1))
    return out_RKGD


def rotate(x_RHD: torch.Tensor, cos_R1D: torch.Tensor, sin_R1D: torch.Tensor) -> torch.Tensor:
    """Standard (non-interleaved) rotary embedding: x·cos + rotate_half(x)·sin (cos, sin broadcast over x)."""
    first, second = x_RHD.chunk(2, dim=-1)
    return x_RHD * cos_R1D + torch.cat((-second, first), dim=-1) * sin_R1D


def supports_static_kv(model: torch.nn.Module) -> bool:
    """True when the model has the supported structure and a few static decode steps match its forward."""
    if not has_supported_structure(model):
        return False
    try:
        return _matches_forward(model)
    except (AttributeError, TypeError, ValueError, RuntimeError, IndexError):
        return False


def attention_window(model: torch.nn.Module) -> int | None:
    """The attention window of the model's sliding-window layers; None when every layer sees the whole sequence.

    Sliding-window layers (Mistral's; Gemma 2/3's and Qwen2's with `use_sliding_window`, those `layer_types`
    marks "sliding_attention") attend to the last `sliding_window` positions only, and the model's cache keeps
    only those. The static decode step and the shared-prompt training forward attend to every position, so for
    such a model they are exact only on sequences shorter than the window.
    """
    config = getattr(model, "config", None)
    window = getattr(config, "sliding_window", None)
    if not window:
        return None
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return int(window) if any("sliding" in str(kind) for kind in layer_types) else None
    return None if getattr(config, "use_sliding_window", True) is False else int(window)


def fits_attention_window(model: torch.nn.Module, length: int) -> bool:
    """Whether a sequence of `length` positions (padding included) is shorter than every attention window."""
    window = attention_window(model)
    return window is None or length < window


def has_supported_structure(model: torch.nn.Module) -> bool:
    """Whether the model is a pre-norm Llama/Qwen-style decoder this module's layer-by-layer step can run
    (the training forward of `literl.training.shared_prompts` runs on the same structure)."""
    if not (hasattr(model, "get_decoder") and isinstance(model.get_output_embeddings(), torch.nn.Linear)):
        return False
    body = model.get_decoder()
    if not all(hasattr(body, part) for part in _BODY_PARTS):
        return False
    config = getattr(model, "config", None)
    if any(getattr(config, name, None) is not None for name in _UNSUPPORTED_CONFIG):
        return False
    for layer in body.layers:
        if not all(hasattr(layer, part) for part in _LAYER_PARTS):
            return False
        attn = layer.self_attn
        if not all(hasattr(attn, part) for part in _ATTENTION_PARTS) or getattr(attn, "sliding_window", None):
            return False
    return True


@torch.inference_mode()
def _matches_forward(model: torch.nn.Module) -> bool:
    """Three static decode steps on two prompts of different lengths against the model's full forward."""
    vocab = model.get_output_embeddings().out_features
    device = model.get_output_embeddings().weight.device
    prompts = [[3, 4, 5, 6], [7, 8]]
    continuations = [[9, 10, 11], [12, 13, 14]]
    prepared = distinct_prompts([[t % vocab for t in p] for p in prompts], pad_id=0, device=device)
    first_UV, cache = prefill(model, prepared)
    decoder = StaticKVDecoder(model, cache, prepared, max_new_tokens=len(continuations[0]) + 1)
    got = [first_UV.float()]
    for t in range(len(continuations[0])):
        got.append(decoder.step(torch.tensor([c[t] % vocab for c in continuations], device=device)).float())
    got_RNV = torch.stack(got, dim=1)
    for row, (p, c) in enumerate(zip(prompts, continuations)):
        ids_1L = torch.tensor([[t % vocab for t in p + c]], device=device)
        expected_NV = model(input_ids=ids_1L, use_cache=False).logits[0, len(p) - 1:].float()
        scale = float(expected_NV.abs().max()) + 1.0
        tolerance = 1e-3 if got_RNV.dtype in (torch.float32, torch.float64) and _is_full_precision(model) else 5e-2
        if float((got_RNV[row] - expected_NV).abs().max()) > tolerance * scale:
            return False
    return True


def _is_full_precision(model: torch.nn.Module) -> bool:
    return next(model.parameters()).dtype in (torch.float32, torch.float64)
