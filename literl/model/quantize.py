"""FP8 weights for an inference copy of a model: the training–inference mismatch of an FP8 engine, on CPU.

The MiniRL study (arXiv 2512.01374 §5) samples with FP8 inference and trains in BF16, a mismatch large enough that
IS correction and Routing Replay decide stability. `fake_quantize_fp8_` rounds a bfloat16 copy's projection
weights to FP8 E4M3 with one scale per output channel, as FP8 inference engines store them, and keeps computing
in bfloat16:

    s_o = max_i |W_oi| / 448          (448: the largest finite E4M3 value)
    W_oi ← bf16( fp8_e4m3(W_oi / s_o) ) · s_o

Rounded: every linear projection inside the decoder layers (attention, MLP, shared experts) and the experts'
stacked weights of MoE blocks (a scale per expert and output channel). Kept: embeddings, the LM head, norms and
routers (FP8 engines keep the router in higher precision, so routes differ only through the hidden states).

`fake_quantize_int4_` is the harsher engine of the same kind, a 4-bit weight-only engine (GPTQ/AWQ-style storage,
round to nearest): the same weights rounded to symmetric 4-bit integers with one scale per output channel and
group of INT4_GROUP input channels, computing in bfloat16:

    s_og = max_{i in g} |W_oi| / 7          W_oi ← bf16( clamp(round(W_oi / s_og), −8, 7) ) · s_og

Its rounding error is ~10× FP8's (a step of max/7 against E4M3's 3-bit mantissa), so the training–inference
gap of a tiny model with short responses reaches the size that the MiniRL study's FP8 engine makes over long
ones (docs/testbed.md, "Regimes").
"""

from __future__ import annotations

from typing import Callable

import torch

FP8_E4M3_MAX = 448.0
INT4_MAX, INT4_MIN = 7, -8
INT4_GROUP = 32
WEIGHT_FORMATS = ("float8_e4m3", "int4")


@torch.no_grad()
def fake_quantize_fp8_(model: torch.nn.Module) -> torch.nn.Module:
    """Round the decoder layers' projection weights of `model` to FP8 E4M3 in place (see the module docstring)."""
    return _round_projections_(model, _rounded)


@torch.no_grad()
def fake_quantize_int4_(model: torch.nn.Module) -> torch.nn.Module:
    """Round the decoder layers' projection weights of `model` to 4-bit integers with group scales, in place."""
    return _round_projections_(model, _rounded_int4)


def fake_quantize_(model: torch.nn.Module, weights: str) -> torch.nn.Module:
    """Round `model`'s projection weights to the engine weight format `weights` (one of WEIGHT_FORMATS)."""
    if weights not in WEIGHT_FORMATS:
        raise ValueError(f"unknown engine weight format {weights!r}; expected one of {WEIGHT_FORMATS}")
    return fake_quantize_fp8_(model) if weights == "float8_e4m3" else fake_quantize_int4_(model)


def _round_projections_(model: torch.nn.Module, rounded: Callable[[torch.Tensor], torch.Tensor]) -> torch.nn.Module:
    for layer in model.get_decoder().layers:
        for name, module in layer.named_modules():
            if isinstance(module, torch.nn.Linear) and not _is_router(name):
                module.weight.copy_(rounded(module.weight))
            experts = getattr(module, "experts", None)
            if experts is not None and name.split(".")[-1] != "experts":
                for parameter in experts.parameters(recurse=False):
                    if parameter.dim() == 3:        # [experts, out, in]
                        parameter.copy_(rounded(parameter))
    return model


def _is_router(name: str) -> bool:
    """The router of a MoE block (`mlp.gate`), the shared expert's gate (`mlp.shared_expert_gate`)."""
    last = name.split(".")[-1]
    return last in ("gate", "shared_expert_gate")


def _rounded(weight: torch.Tensor) -> torch.Tensor:
    """weight (…, out, in) rounded to FP8 E4M3 with a scale per output channel, in weight's dtype."""
    scale = weight.float().abs().amax(-1, keepdim=True).clamp(min=1e-12) / FP8_E4M3_MAX
    return ((weight.float() / scale).to(torch.float8_e4m3fn).float() * scale).to(weight.dtype)


def _rounded_int4(weight: torch.Tensor) -> torch.Tensor:
    """weight (…, out, in) rounded to symmetric 4-bit integers with a scale per output channel and group of
    INT4_GROUP input channels (one group when `in` is not a multiple of it), in weight's dtype."""
    *outer, inputs = weight.shape
    group = INT4_GROUP if inputs % INT4_GROUP == 0 else inputs
    grouped = weight.float().reshape(*outer, inputs // group, group)
    scale = grouped.abs().amax(-1, keepdim=True).clamp(min=1e-12) / INT4_MAX
    levels = torch.round(grouped / scale).clamp(INT4_MIN, INT4_MAX)
    return (levels * scale).reshape(weight.shape).to(weight.dtype)
