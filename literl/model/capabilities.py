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

Structure is read from the modules and config; each numerical probe runs once per model, on a few tokens, the
first time its answer is needed, and compares the mode with the model's own forward.
"""

from __future__ import annotations

import functools
import weakref

import torch

from literl.model.decode import StaticKVDecoder
from literl.model.forward import response_hidden
from literl.model.head import linear_head
from literl.model.layer import has_layer_structure
from literl.model.moe import MoeShape, Routing, is_sparse_moe, moe_block
from literl.model.prompts import batch_prompts, distinct_prompts, prefill
from literl.model.record import Recorder, can_record

_PROBE_ERRORS = (AttributeError, TypeError, ValueError, RuntimeError, IndexError)
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
        return _probing(self.model, _shared_prompts_match, self.layers)

    @functools.cached_property
    def static_decode(self) -> bool:
        return has_layer_structure(self.model) and _probing(self.model, _static_decode_matches)

    @functools.cached_property
    def record(self) -> bool:
        return self.layers and self.static_decode and can_record(self.model) and _probing(
            self.model, _recording_matches)

    @functools.cached_property
    def head(self) -> torch.nn.Linear | None:
        head = linear_head(self.model)
        return head if head is not None and _probing(self.model, _head_matches, head) else None

    @functools.cached_property
    def moe(self) -> MoeShape | None:
        shape = MoeShape.of(self.model) if self.layers else None
        if shape is None or getattr(self.model.config, "router_jitter_noise", 0.0):    # no jitter in moe_block
            return None
        return shape if _probing(self.model, _moe_blocks_match) else None


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


def _probing(model: torch.nn.Module, probe, *args) -> bool:
    """probe(model, *args) in eval mode without autograd; a probe that raises means "not supported"."""
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            return bool(probe(model, *args))
    except _PROBE_ERRORS:
        return False
    finally:
        model.train(was_training)


def _close(got: torch.Tensor, expected: torch.Tensor, tolerance: float) -> bool:
    scale = float(expected.abs().max()) + 1.0
    return got.shape == expected.shape and float((got.float() - expected.float()).abs().max()) <= tolerance * scale


def _full_precision(model: torch.nn.Module) -> bool:
    return next(model.parameters()).dtype in (torch.float32, torch.float64)


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
    return _close(got_MH, expected_MH, 1e-3)


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
    tolerance = 1e-3 if _full_precision(model) else 5e-2
    for row, (p, c) in enumerate(zip(prompts, continuations)):
        ids_1L = torch.tensor([[t % vocab for t in p + c]], device=device)
        expected_NV = model(input_ids=ids_1L, use_cache=False).logits[0, len(p) - 1:]
        if not _close(got_RNV[row], expected_NV, tolerance):
            return False
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
    return _close(logits[1], logits[0], 1e-4 if _full_precision(model) else 5e-2)


def _head_matches(model: torch.nn.Module, head: torch.nn.Linear) -> bool:
    """The model's logits against head(decoder(x)) on three tokens."""
    vocab, device = _vocab_and_device(model)
    probe_1L = torch.arange(3, device=device)[None, :] % vocab
    expected = model(input_ids=probe_1L, use_cache=False).logits
    got = head(model.get_decoder()(input_ids=probe_1L, use_cache=False).last_hidden_state)
    return expected.shape == got.shape and torch.allclose(expected.float(), got.float(), rtol=1e-4, atol=1e-4)


def _moe_blocks_match(model: torch.nn.Module) -> bool:
    """Every sparse block through `moe_block` against its own forward on five random tokens: with the router's
    choice, and with the router's choice weighted the way a replay recomputes the weights."""
    generator = torch.Generator().manual_seed(0)
    for layer in model.get_decoder().layers:
        mlp = layer.mlp
        if not is_sparse_moe(mlp):
            continue
        weight = mlp.gate.weight
        x_1MH = torch.randn(1, 5, weight.shape[1], generator=generator).to(weight.device, weight.dtype)
        expected = mlp(x_1MH)
        expected = expected[0] if isinstance(expected, tuple) else expected
        reweighted = Routing(reweight=True)
        index_M = torch.arange(5, device=weight.device)
        routes = reweighted.at(torch.zeros_like(index_M), index_M, torch.ones_like(index_M, dtype=torch.bool))
        tolerance = 1e-4 if _full_precision(model) else 5e-2
        if not (_close(moe_block(mlp, x_1MH[0]), expected[0], tolerance)
                and _close(moe_block(mlp, x_1MH[0], routes.layer(0)), expected[0], tolerance)):
            return False
    return True


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
