"""Training precision: the weights, their gradients and the optimizer's state are float32 (the master weights);
`model.dtype` is the precision the forward and backward compute in.

    model.dtype=float32    everything in float32 (the CPU numerical reference every other path is tested against)
    model.dtype=bfloat16   matmuls and attention in bfloat16 (`torch.autocast`); the parameters stay float32, so
                           autograd accumulates float32 gradients over the micro-batches and AdamW keeps float32
                           moments and updates float32 weights. Norms, the residual stream and the head's
                           log-softmax stay float32.

Why master weights: an AdamW step moves a weight by about the learning rate (its first step by exactly lr·sign(g)).
At the real-model profile's lr 1e-6 that is far below half a bfloat16 ulp of a typical weight (|w| ≈ 0.02 has an ulp
of 2⁻¹³ ≈ 1.2e-4), so a bfloat16 weight would round every update away: pure bfloat16 training silently does not
train. The frozen reference model has no optimizer and is kept in the compute dtype itself.
"""

from __future__ import annotations

import contextlib

import torch

PRECISIONS = {"float32": torch.float32, "bfloat16": torch.bfloat16}
MASTER_DTYPE = torch.float32


def compute_dtype(name: str) -> torch.dtype:
    """The dtype a training forward computes in for `model.dtype=name`."""
    if name not in PRECISIONS:
        raise ValueError(f"model.dtype must be one of {sorted(PRECISIONS)} (got {name!r})")
    return PRECISIONS[name]


def parameter_dtype(module: torch.nn.Module) -> torch.dtype:
    return next(module.parameters()).dtype


def autocasts(module: torch.nn.Module, dtype: torch.dtype | None) -> bool:
    """Whether a forward of `module` computing in `dtype` needs autocast: its floating parameters are wider."""
    return dtype is not None and dtype.itemsize < parameter_dtype(module).itemsize


def computing_in(module: torch.nn.Module, dtype: torch.dtype | None):
    """A context in which the module's forward computes in `dtype` (autocast over its float32 parameters), or a
    no-op when the parameters are already in that dtype."""
    if not autocasts(module, dtype):
        return contextlib.nullcontext()
    device = next(module.parameters()).device
    return torch.autocast(device.type, dtype=dtype)
