"""Which of the runtime's modes a model supports: the one place literl decides how a model's forward runs.

    layers          the layer body (`literl.model.layer`) can run the model: a pre-norm Llama/Qwen-style decoder
                    with no attention dropout (the hand-applied layers leave dropout out)
    shared_prompts  a training forward that runs each distinct prompt once gives the decoder's plain forward
                    (through the hand-applied layers when `layers`, else through the model's own forward with a
                    cache); else whole rows run through the model's own forward
    static_decode   the static-cache decode step gives the model's own logits; else the model's own forward
                    decodes with a growing cache
    record          the decode step can keep its projections for an update to replay (gated MLPs, plain linear
                    projections) and a recorded step gives the plain one's logits
    head            the LM head when logits are exactly head(final hidden state), else None (full logits from the
                    model's own forward)
    moe             the shape of the MoE layers when every sparse block runs through the runtime's `moe_block` as
                    the model computes it (their routes can then be recorded, replayed and compared); None for
                    dense models and blocks it does not understand
    window          the sliding attention window, if any (the runtime attends to every position, so it is exact
                    only on sequences shorter than the window)
    packed_kernel   per compute dtype: the attention kernel of the packed route (whole rows as one token stream
                    without padding, `literl.model.packing`) on this model's device, or None where the update does
                    not pack (`PACKED_ROUTE`)
    packed_prompts_shared   per kernel and compute dtype: whether the packed stream runs each distinct prompt once
                    for the rows that continue it (`SHARED_PACKED_PROMPTS`), its probe matching the model's own
                    forward

Structure is read from the modules and config; each numerical probe runs once per model, on a few tokens, the
first time its answer is needed, and compares the mode with the model's own forward, within a tolerance scaled to
the precision it computes in (`probe_tolerance`). A mode whose probe fails is not used, and the log says once
why; an out-of-memory or an accelerator backend error during a probe is raised, never taken for "not supported".

Device choices made here by measurement (or, where no measurement exists yet, said so): `records_forward` (the
update replaying the rollout's forward: CPU only), `PACKED_ROUTE` (which devices pack rows, with which kernels),
`SHARED_PACKED_PROMPTS` (which of those kernels share prompts), `FUSED_HEAD_TILES` (where the head's tiles are
compiled kernels) and `micro_batch_tokens`
(`trainer.micro_batch_tokens=auto`: sized from free accelerator memory).
"""

from __future__ import annotations

import functools
import logging
import weakref

import torch

from literl.model.decode import StaticKVDecoder
from literl.model.forward import response_hidden
from literl.model.head import linear_head
from literl.model.layer import has_layer_structure
from literl.model.moe import MoeShape, Routing, is_sparse_moe, moe_block, router_module
from literl.model.packing import pack_rows, packed_layers
from literl.model.precision import computing_in
from literl.model.prompt_pass import batch_prompts, distinct_prompts, prefill
from literl.model.record import Recorder, can_record

log = logging.getLogger(__name__)
# Errors that say a mode does not fit a model (a part it lacks, a shape it cannot take): the probe answers "no".
# (An ImportError: this torch lacks the kernel a mode needs.)
_STRUCTURE_ERRORS = (AttributeError, TypeError, ValueError, IndexError, KeyError, NotImplementedError, ImportError,
                     RuntimeError)
# Words of an accelerator backend's error (cuBLAS, cuDNN, a kernel launch, out of memory): raised, not a "no".
_BACKEND_WORDS = ("cuda", "cudnn", "cublas", "nccl", "hip error", "out of memory", "device-side", "illegal memory")
# Probe tolerances are relative to the largest expected value (+1) and hold for float32; a narrower compute dtype
# gets this many of its epsilons instead (bfloat16: 8 × 2⁻⁷ = 0.0625), so that its rounding is not taken for a
# wrong mode, while a wrong mask or position still differs by O(1).
PROBE_EPSILONS = 8
_cache: "weakref.WeakKeyDictionary[torch.nn.Module, Capabilities]" = weakref.WeakKeyDictionary()


def capabilities(model: torch.nn.Module) -> "Capabilities":
    """The model's capabilities (made once per module; probes run lazily)."""
    if model not in _cache:
        _cache[model] = Capabilities(model)
    return _cache[model]


class Capabilities:
    """See the module docstring."""

    def __init__(self, model: torch.nn.Module):
        self._model = weakref.ref(model)
        self._packed: dict[torch.dtype | None, str | None] = {}
        self._shared_packed: dict[tuple[str, torch.dtype | None], bool] = {}

    @property
    def model(self) -> torch.nn.Module:
        return self._model()

    @functools.cached_property
    def layers(self) -> bool:
        return has_layer_structure(self.model) and not getattr(self.model.config, "attention_dropout", 0.0)

    @functools.cached_property
    def window(self) -> int | None:
        return attention_window(self.model)

    def fits_window(self, length: int) -> bool:
        """Whether a sequence of `length` positions (padding included) is shorter than every attention window."""
        return self.window is None or length < self.window

    @functools.cached_property
    def shared_prompts(self) -> bool:
        return _probing(self.model, "the shared-prompt training forward", _shared_prompts_match, self.layers)

    @functools.cached_property
    def static_decode(self) -> bool:
        return has_layer_structure(self.model) and _probing(self.model, "the static-cache decode step",
                                                            _static_decode_matches)

    @functools.cached_property
    def record(self) -> bool:
        return self.layers and self.static_decode and can_record(self.model) and _probing(
            self.model, "recording the decode's forward", _recording_matches)

    @functools.cached_property
    def head(self) -> torch.nn.Linear | None:
        head = linear_head(self.model)
        return head if head is not None and _probing(self.model, "the chunked LM head", _head_matches, head) else None

    @functools.cached_property
    def moe(self) -> MoeShape | None:
        shape = MoeShape.of(self.model) if self.layers else None
        if shape is None or getattr(self.model.config, "router_jitter_noise", 0.0):    # no jitter in moe_block
            return None
        return shape if _probing(self.model, "routing MoE layers through the runtime", _moe_blocks_match) else None

    def packed_kernel(self, dtype: torch.dtype | None = None) -> str | None:
        """The attention kernel of the packed training route for forwards computing in `dtype` (None: the
        parameters' own), the first of `PACKED_ROUTE[device]` whose packed forward matches the model's own; None
        where rows are not packed (that device has no packed route, or no kernel matched)."""
        if dtype not in self._packed:
            device = next(self.model.parameters()).device
            kernels = PACKED_ROUTE.get(device.type, ()) if self.layers else ()
            self._packed[dtype] = next((kernel for kernel in kernels if _probing(
                self.model, f"the packed training forward ({kernel} attention)", _packed_matches, kernel, dtype)),
                None)
        return self._packed[dtype]

    def packed_prompts_shared(self, kernel: str, dtype: torch.dtype | None = None) -> bool:
        """Whether the packed route with `kernel`, computing in `dtype`, runs each distinct prompt once for the
        rows that continue it (`SHARED_PACKED_PROMPTS`, and the shared stream's probe matches the model's own)."""
        key = (kernel, dtype)
        if key not in self._shared_packed:
            self._shared_packed[key] = kernel in SHARED_PACKED_PROMPTS and _probing(
                self.model, f"sharing prompts in the packed training forward ({kernel} attention)", _packed_matches,
                kernel, dtype, True)
        return self._shared_packed[key]


def attention_window(model: torch.nn.Module) -> int | None:
    """The attention window of the model's sliding-window layers; None when every layer sees the whole sequence.

    Sliding-window layers (Mistral's; Gemma 2/3's and Qwen2's with `use_sliding_window`, those `layer_types`
    marks "sliding_attention") attend to the last `sliding_window` positions only, and the model's cache keeps
    only those.
    """
    config = getattr(model, "config", None)
    window = getattr(config, "sliding_window", None)
    if not window:
        return None
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        return int(window) if any("sliding" in str(kind) for kind in layer_types) else None
    return None if getattr(config, "use_sliding_window", True) is False else int(window)


class ProbeMismatch(Exception):
    """A mode's numbers differ from the model's own forward beyond the probe's tolerance."""


def _probing(model: torch.nn.Module, mode: str, probe, *args) -> bool:
    """probe(model, *args) in eval mode without autograd: whether `mode` gives the model's own numbers. A mismatch
    or an error saying the mode does not fit the model means "no", logged once (a cached answer is not probed
    again) with why; an out-of-memory or an accelerator backend error is raised, so that a failing GPU never
    passes for a model that needs a slower path."""
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            supported = bool(probe(model, *args))
        why = "its numbers differ from the model's own forward"
    except ProbeMismatch as err:
        supported, why = False, str(err)
    except _STRUCTURE_ERRORS as err:
        if is_backend_error(err):
            raise
        supported, why = False, f"it raised {type(err).__name__}: {err}"
    finally:
        model.train(was_training)
    if not supported:
        log.warning("literl: %s is not used for %s: %s; a slower path runs instead", mode, type(model).__name__, why)
    return supported


def is_backend_error(err: BaseException) -> bool:
    """An out-of-memory or an accelerator runtime error (as opposed to a mode that does not fit the model)."""
    if isinstance(err, torch.OutOfMemoryError) or type(err).__name__ == "AcceleratorError":
        return True
    return isinstance(err, RuntimeError) and any(word in str(err).lower() for word in _BACKEND_WORDS)


def probe_tolerance(dtype: torch.dtype, full_precision: float) -> float:
    """A probe's tolerance for numbers computed in `dtype`: `full_precision` for float32/64, else PROBE_EPSILONS of
    the dtype's epsilon (and never less than `full_precision`)."""
    if dtype in (torch.float32, torch.float64):
        return full_precision
    return max(full_precision, PROBE_EPSILONS * torch.finfo(dtype).eps)


def _tolerance(model: torch.nn.Module, full_precision: float) -> float:
    return probe_tolerance(next(model.parameters()).dtype, full_precision)


def _close(got: torch.Tensor, expected: torch.Tensor, tolerance: float) -> bool:
    """True when got matches expected within tolerance × (max |expected| + 1); else raises ProbeMismatch."""
    if got.shape != expected.shape:
        raise ProbeMismatch(f"shape {tuple(got.shape)} instead of {tuple(expected.shape)}")
    scale = float(expected.abs().max()) + 1.0 if expected.numel() else 1.0
    error = float((got.float() - expected.float()).abs().max()) if got.numel() else 0.0
    if not error <= tolerance * scale:      # NaN fails too
        raise ProbeMismatch(f"max |difference| {error:.3g} from the model's own forward, above the tolerance "
                            f"{tolerance:.3g} × {scale:.3g}")
    return True


def _vocab_and_device(model: torch.nn.Module) -> tuple[int, torch.device]:
    head = model.get_output_embeddings()
    return head.out_features, head.weight.device


def _shared_prompts_match(model: torch.nn.Module, by_layers: bool) -> bool:
    """Hidden states of responses on shared prompts against the decoder's plain forward on whole rows."""
    vocab, device = _vocab_and_device(model)
    decoder = model.get_decoder()
    rows = [[3, 4, 5, 6, 7, 8], [3, 4, 5, 9], [10, 11, 12, 13, 14], [3, 4, 5, 6, 15]]
    prompt_len_B = torch.tensor([3, 3, 2, 3], device=device)
    tokens_BL = torch.tensor([[t % vocab for t in r] + [0] * (6 - len(r)) for r in rows], device=device)
    valid_BT = torch.arange(4, device=device)[None, :] < (torch.tensor([len(r) for r in rows], device=device)
                                                          - prompt_len_B)[:, None]
    prompts = batch_prompts(tokens_BL, prompt_len_B)
    got_MH = response_hidden(model, tokens_BL, prompt_len_B, valid_BT, prompts, by_layers=by_layers,
                             buckets=lambda steps: [torch.arange(len(steps), device=device)])
    hidden_BLH = decoder(input_ids=tokens_BL, use_cache=False).last_hidden_state
    positions_BT = (prompt_len_B[:, None] - 1 + torch.arange(4, device=device)[None, :]).clamp(max=5)
    expected_MH = hidden_BLH[torch.arange(4, device=device)[:, None].expand(-1, 4), positions_BT][valid_BT]
    return _close(got_MH, expected_MH, _tolerance(model, 1e-3))


def _static_decode_matches(model: torch.nn.Module) -> bool:
    """Three static decode steps on two prompts of different lengths against the model's full forward."""
    vocab, device = _vocab_and_device(model)
    prompts = [[3, 4, 5, 6], [7, 8]]
    continuations = [[9, 10, 11], [12, 13, 14]]
    prepared = distinct_prompts([[t % vocab for t in p] for p in prompts], pad_id=0, device=device)
    first_UV, cache = prefill(model, prepared)
    decoder = StaticKVDecoder(model, cache, prepared, max_new_tokens=len(continuations[0]) + 1)
    got = [first_UV.float()]
    for t in range(len(continuations[0])):
        got.append(decoder.step(torch.tensor([c[t] % vocab for c in continuations], device=device)).float())
    got_RNV = torch.stack(got, dim=1)
    tolerance = _tolerance(model, 1e-3)
    for row, (p, c) in enumerate(zip(prompts, continuations)):
        ids_1L = torch.tensor([[t % vocab for t in p + c]], device=device)
        expected_NV = model(input_ids=ids_1L, use_cache=False).logits[0, len(p) - 1:]
        _close(got_RNV[row], expected_NV, tolerance)
    return True


def _recording_matches(model: torch.nn.Module) -> bool:
    """Three recorded decode steps give the plain static step's logits (the record is what they computed)."""
    vocab, device = _vocab_and_device(model)
    prepared = distinct_prompts([[3 % vocab, 4 % vocab, 5 % vocab], [6 % vocab]], pad_id=0, device=device)
    tokens = [torch.tensor([t % vocab, (t + 1) % vocab], device=device) for t in (7, 9, 11)]
    logits = []
    for recording in (False, True):
        _, cache = prefill(model, prepared)
        record = Recorder(model, max_bytes=1 << 62).start(model, 2, len(tokens) + 1, device) if recording else None
        decoder = StaticKVDecoder(model, cache, prepared, len(tokens) + 1, record=record)
        logits.append(torch.stack([decoder.step(token_R).float() for token_R in tokens]))
    return _close(logits[1], logits[0], _tolerance(model, 1e-4))


def _head_matches(model: torch.nn.Module, head: torch.nn.Linear) -> bool:
    """The model's logits against head(decoder(x)) on three tokens."""
    vocab, device = _vocab_and_device(model)
    probe_1L = torch.arange(3, device=device)[None, :] % vocab
    expected = model(input_ids=probe_1L, use_cache=False).logits
    got = head(model.get_decoder()(input_ids=probe_1L, use_cache=False).last_hidden_state)
    return _close(got, expected, _tolerance(model, 1e-4))


def _moe_blocks_match(model: torch.nn.Module) -> bool:
    """Every sparse block through `moe_block` against its own forward on five random tokens: with the router's
    choice, and with the router's choice weighted the way a replay recomputes the weights."""
    generator = torch.Generator().manual_seed(0)
    for layer in model.get_decoder().layers:
        mlp = layer.mlp
        if not is_sparse_moe(mlp):
            continue
        weight = router_module(mlp.gate).weight
        x_1MH = torch.randn(1, 5, weight.shape[1], generator=generator).to(weight.device, weight.dtype)
        expected = mlp(x_1MH)
        expected = expected[0] if isinstance(expected, tuple) else expected
        reweighted = Routing(reweight=True)
        index_M = torch.arange(5, device=weight.device)
        routes = reweighted.at(torch.zeros_like(index_M), index_M, torch.ones_like(index_M, dtype=torch.bool))
        tolerance = _tolerance(model, 1e-4)
        _close(moe_block(mlp, x_1MH[0]), expected[0], tolerance)
        _close(moe_block(mlp, x_1MH[0], routes.layer(0)), expected[0], tolerance)
    return True


# ------------------------------------------------------------------------------------------ device routes
# Devices whose update replays the rollout's recorded forward (literl/model/record.py). On CPU it is measured to
# pay against the computed forward (results/benchmarks/2026-11-24_cpu_step-vs-trl.md). On a
# GPU it is not measured, and the arithmetic says it does not pay: a record moves
# ~1.4 MB per token (Qwen3-0.6B: 28 layers × 12,288 fp32 outputs) to save ~1 µs of matmul per token at H100 rates
# (2N = 0.9 GFLOP at 989 TFLOP/s), and a replayed update cannot take the packed route. So it is off there.
RECORD_REPLAY_DEVICES = ("cpu",)

# Devices whose update packs whole rows into one token stream, and the attention kernels to try there, in order
# (`attention.packed`). CUDA: varlen first (flash attention over the row starts: no padding, no mask, native
# grouped-query heads), then padded rows through SDPA's flash kernel (no mask, `is_causal`): varlen measured the
# faster on the 0.6B body's rows (results/benchmarks/2026-11-26_h200_gpu-step.md). CPU packs nothing: its shared-prompt
# and replayed forwards are measured faster there and keep the default job's numbers.
PACKED_ROUTE: dict[str, tuple[str, ...]] = {"cuda": ("varlen", "padded")}
# The packed kernels whose stream shares each distinct prompt among the rows that continue it (`packing`, module
# docstring): a GRPO group's prompt runs through the layers once, its keys and values gathered for each response
# (a segment with more keys than queries, causal aligned at its end: the CUDA probe and gpu test pass). NOT ON
# with varlen, by measurement: the gather's backward took back the matmul time the shorter stream saved, and
# rebuilt (`attention.gathered_keys`) it lowers the device time but not the update's wall time, since the host
# lays out the longer stream (results/benchmarks/2026-11-27_h100_compiled-update.md, 2026-11-28_h200_gpu-step.md).
# The document-mask kernel (the CPU reference)
# shares, so CI tests the layout; `padded` attends within whole rows only.
SHARED_PACKED_PROMPTS: tuple[str, ...] = ("document_mask",)


def records_forward(device: torch.device) -> bool:
    """Whether an update on `device` replays the rollout's forward (see RECORD_REPLAY_DEVICES)."""
    return torch.device(device).type in RECORD_REPLAY_DEVICES


def _packed_matches(model: torch.nn.Module, kernel: str, dtype: torch.dtype | None, share_prompts: bool = False
                    ) -> bool:
    """The packed forward of rows of different lengths, computing in `dtype`, against the decoder's own forward on
    the right-padded rows (in the same precision): hidden states at every response predictor. `share_prompts`: three
    of four rows continue one prompt (one of them with a single response token), packed with it shared."""
    vocab, device = _vocab_and_device(model)
    if share_prompts:
        rows, prompt_len_B = [[3, 4, 5, 6, 7, 8, 9], [3, 4, 5, 10, 11], [3, 4, 5, 12], [13, 14, 15, 16]], [3, 3, 3, 1]
    else:
        rows, prompt_len_B = [[3, 4, 5, 6, 7, 8, 9], [3, 4, 10], [11, 12, 13, 14, 15]], [3, 2, 1]
    prompt_len_B = torch.tensor(prompt_len_B)
    tokens_BL = torch.tensor([[t % vocab for t in r] + [0] * (7 - len(r)) for r in rows])
    valid_BT = torch.arange(6)[None, :] < (torch.tensor([len(r) for r in rows]) - prompt_len_B)[:, None]
    packed = pack_rows(tokens_BL, prompt_len_B, valid_BT, share_prompts=share_prompts)
    if share_prompts and not packed.shares_prompts:
        raise ProbeMismatch("the probe's rows were not packed with a shared prompt")
    decoder = model.get_decoder()
    with computing_in(model, dtype):
        got_PH = packed_layers(decoder, packed.to(device), kernel)
        hidden_BLH = decoder(input_ids=tokens_BL.to(device), use_cache=False).last_hidden_state
    b_P, t_P = valid_BT.nonzero(as_tuple=True)
    expected_PH = hidden_BLH[b_P.to(device), (prompt_len_B[b_P] - 1 + t_P).to(device)]
    return _close(got_PH, expected_PH, probe_tolerance(dtype or next(model.parameters()).dtype, 1e-3))


# ------------------------------------------------------------------------------------------ micro-batch size
# What trainer.micro_batch_tokens=auto is off accelerators: the CPU figure the setting had before it could be auto.
CPU_MICRO_BATCH_TOKENS = 16384
# On an accelerator, `auto` measures the update's activation memory per token (a packed forward and backward at
# two sizes, the difference over the difference, `_update_memory`) and takes this share of the memory left (free
# now, plus what the allocator holds unused, minus the gradients and AdamW moments not yet allocated, minus what a
# forward and backward takes whatever its size): the rest absorbs fragmentation. On an H100 the eager update ran
# at the sizes it gave (peaks 64 and 74 of 79 GiB); the compiled 1.7B body's did not, neither on an H100 nor, with
# the size-independent part subtracted, on an H200: a micro-batch that runs out of memory makes the learner start
# its optimizer step again smaller (`learner.OOM_BACKOFF`; results/benchmarks/2026-11-27_h200_compiled-update.md).
AUTO_MEMORY_SHARE = 0.8
AUTO_PROBE_TOKENS = (1024, 3072)
AUTO_TOKEN_LIMITS = (1024, 262144)


def tokens_for_memory(available_bytes: float, bytes_per_token: float, *, share: float = AUTO_MEMORY_SHARE,
                      limits: tuple[int, int] = AUTO_TOKEN_LIMITS) -> int:
    """Tokens per micro-batch that fit `share` of `available_bytes` at `bytes_per_token`, rounded down to a
    multiple of 1024 and kept within `limits`."""
    if bytes_per_token <= 0:
        return limits[1]
    tokens = int(max(available_bytes, 0.0) * share / bytes_per_token) // 1024 * 1024
    return max(limits[0], min(limits[1], tokens))


def micro_batch_tokens(policy_forward, setting: int | str) -> int:
    """The padded (packed: real) tokens per forward/backward for `trainer.micro_batch_tokens=setting`: the number
    itself, or for `auto` CPU_MICRO_BATCH_TOKENS off accelerators and, on CUDA, what the free memory holds."""
    if setting != "auto":
        return int(setting)
    device = policy_forward.device
    if device.type != "cuda":
        return CPU_MICRO_BATCH_TOKENS
    per_token, fixed = _update_memory(policy_forward)
    free, _ = torch.cuda.mem_get_info(device)
    held = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    trainable = [p for p in policy_forward.model.parameters() if p.requires_grad]
    pending = sum(p.numel() * 4 * 3 for p in trainable) if all(p.grad is None for p in trainable) else 0
    tokens = tokens_for_memory(free + held - pending - fixed, per_token)
    log.info("literl: trainer.micro_batch_tokens=auto: %d tokens (%.0f KB of activations per token, %.1f GiB free, "
             "%.1f GiB for a forward and backward of any size)", tokens, per_token / 1024,
             (free + held - pending) / 2**30, fixed / 2**30)
    return tokens


def _update_memory(policy_forward) -> tuple[float, float]:
    """(bytes per token, bytes whatever the size) of an update's forward and backward at its peak (of a no-grad
    forward, for a frozen model): measured at two sizes on rows of 256 tokens, the difference over the difference
    and what is left at the first size (the compute-dtype copies of the weights autocast keeps during a forward,
    the head's tiles; less the gradients, which `micro_batch_tokens` counts apart). One unmeasured call at the first
    size goes first: a first call allocates what later calls reuse (a compiled forward compiles in it), which would
    count as memory of the first size and make the per-token figure too small. Both were added after the 1.7B body's
    compiled update ran out of memory on an H100 at the size the plain difference gave
    (results/benchmarks/2026-11-27_h100_gpu-step.md)."""
    device, model = policy_forward.device, policy_forward.model
    vocab = model.get_output_embeddings().out_features
    params = [p for p in model.parameters() if p.requires_grad]
    peaks, counts = [], []
    generator = torch.Generator().manual_seed(0)
    share = policy_forward.shares_packed_prompts
    for probe, tokens in enumerate((AUTO_PROBE_TOKENS[0], *AUTO_PROBE_TOKENS)):
        rows, width = tokens // 256, 256
        tokens_BL = torch.randint(vocab, (rows, width), generator=generator)
        # Rows in pairs continuing one prompt of one token, so that a forward sharing prompts runs the stream (and
        # the compiled graph) the update will.
        tokens_BL[:, 0] = torch.arange(rows) // 2 % vocab
        prompt_len_B = torch.ones(rows, dtype=torch.long)
        mask_BT = torch.ones(rows, width - 1, dtype=torch.bool)
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        with torch.enable_grad():
            logp_BT, entropy_BT = policy_forward.token_logprobs(tokens_BL, prompt_len_B, width - 1, mask_BT=mask_BT,
                                                                with_entropy=True)
            if params and logp_BT.requires_grad:
                torch.autograd.grad((logp_BT.sum() + entropy_BT.sum()), params, allow_unused=True)
        del logp_BT, entropy_BT
        torch.cuda.synchronize(device)
        if probe > 0:
            peaks.append(torch.cuda.max_memory_allocated(device) - base)
            counts.append(pack_rows(tokens_BL, prompt_len_B, mask_BT, share_prompts=share).tokens)
    per_token = (peaks[1] - peaks[0]) / (counts[1] - counts[0])
    gradients = sum(p.numel() * p.element_size() for p in params)
    return per_token, max(0.0, peaks[0] - per_token * counts[0] - gradients)


# Where `trainer.compile=true` also compiles the LM head's tiles (`head.tile_statistics`, `head.tile_gradient`): on
# CUDA, where the eager tiles' element-wise passes over fp32 logits were a quarter of the 1.7B body's compiled
# update (its 151,936-token vocabulary; results/benchmarks/2026-11-27_h200_compiled-update.md). CPU keeps the eager
# tiles, sized to
# stay in its cache.
FUSED_HEAD_TILES = ("cuda",)


def fuses_head_tiles(device: torch.device, compiled: bool) -> bool:
    """Whether the head's tiles run as compiled kernels for a forward on `device` (`compiled`: trainer.compile)."""
    return compiled and device.type in FUSED_HEAD_TILES


def cluster_micro_batch_tokens(setting: int | str) -> int:
    """Tokens per micro-batch on a Ray cluster, where the driver and every trainer rank split a step alike (each
    rank measuring its own memory could disagree): `auto` is CPU_MICRO_BATCH_TOKENS there."""
    return CPU_MICRO_BATCH_TOKENS if setting == "auto" else int(setting)


# ------------------------------------------------------------------------------ decode routes (issue 30)
# Which decode step `rollout.decode=auto` runs for a model the static-cache step supports, by device type:
#   "static"  attend over the columns written so far, rows dropped at every check (`decode.StaticKVDecoder`)
#   "fixed"   one shape per batch size (`decode.FixedShapeDecoder`): the whole cache attended, unwritten columns
#             masked; where `captures_cuda_graphs`, each batch bucket's step is one CUDA graph (`cuda_graphs`)
# CPU stays on "static" until "fixed" is measured not slower there (the commands in docs/speed.md, "GPU decode");
# on CUDA the eager step is bound by kernel launches (~1,650 per step for a 28-layer model), which graphs remove.
AUTO_DECODE_ROUTES = {"cuda": "fixed"}
CUDA_GRAPHS = "cuda_graphs"


def auto_decode_route(device: torch.device) -> str:
    """The decode route `rollout.decode=auto` takes on this device: "static" or "fixed" (see above)."""
    return AUTO_DECODE_ROUTES.get(device.type, "static")


def captures_cuda_graphs(device: torch.device) -> bool:
    """Whether the fixed-shape decode step runs as CUDA graphs on this device."""
    return device.type == "cuda"
