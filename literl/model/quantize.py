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
"""

from __future__ import annotations

import torch

FP8_E4M3_MAX = 448.0
WEIGHT_FORMATS = ("float8_e4m3",)


@torch.no_grad()
def fake_quantize_fp8_(model: torch.nn.Module) -> torch.nn.Module:
    """Round the decoder layers' projection weights of `model` to FP8 E4M3 in place (see the module docstring)."""
    for layer in model.get_decoder().layers:
        for name, module in layer.named_modules():
            if isinstance(module, torch.nn.Linear) and not _is_router(name):
                module.weight.copy_(_rounded(module.weight))
            experts = getattr(module, "experts", None)
            if experts is not None and name.split(".")[-1] != "experts":
                for parameter in experts.parameters(recurse=False):
                    if parameter.dim() == 3:        # [experts, out, in]
                        parameter.copy_(_rounded(parameter))
    return model


def _is_router(name: str) -> bool:
    """The router of a MoE block (`mlp.gate`), the shared expert's gate (`mlp.shared_expert_gate`)."""
    last = name.split(".")[-1]
    return last in ("gate", "shared_expert_gate")


def _rounded(weight: torch.Tensor) -> torch.Tensor:
    """weight (…, out, in) rounded to FP8 E4M3 with a scale per output channel, in weight's dtype."""
    scale = weight.float().abs().amax(-1, keepdim=True).clamp(min=1e-12) / FP8_E4M3_MAX
    return ((weight.float() / scale).to(torch.float8_e4m3fn).float() * scale).to(weight.dtype)
