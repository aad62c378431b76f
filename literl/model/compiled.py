"""`torch.compile` for functions whose tensor sizes change from call to call (rows still decoding, bucket widths).

Dynamo compiles one graph with symbolic sizes (`dynamic=True`), but by default it still specialises in two ways
that cost a fresh compile (several seconds on CPU) in the middle of a run: on a size of 1 (a rollout's last
unfinished row, a one-row training forward), and on two sizes that happened to be equal at the first call
("duck shapes": rows == width once, different later). Here equal sizes are never assumed equal, and calls
with a size-1 input run the function eagerly, so one graph serves the whole run.

Python floats the function reads (norm epsilons, attention scales: constants of the model) are compiled in as
constants: by default dynamo turns each into a 0-d tensor input, made afresh on every call (18 of them in a
decode step: ~70 µs of its ~1 ms fixed cost per call, measured at 4 rows).
"""

from __future__ import annotations

import sys
import time
from typing import Callable

import torch
from torch._dynamo import config as dynamo_config
from torch.fx.experimental import _config as fx_config


def compile_for_varying_sizes(fn: Callable, *, eager_when: Callable[..., bool], cpp_wrapper: bool = False,
                              name: str | None = None) -> Callable:
    """`fn` compiled with symbolic sizes; calls for which `eager_when(*args)` is True (those with a size of 1)
    run `fn` itself. Compiles on first use. `cpp_wrapper=True` has inductor call the graph's kernels from C++
    instead of Python: worth it for a small graph called many times (a decode step: ~3% less rollout time on
    CPU), not measurable on the update's larger ones.

    The first compiled call (the compile, and one run) is timed: its seconds are kept under `name` (default: the
    function's name) in `compile_seconds()` and printed once to stderr."""
    compiled = torch.compile(fn, dynamic=True, options={"cpp_wrapper": cpp_wrapper})
    label = name or fn.__name__
    first = [True]

    def call(*args):
        if eager_when(*args):
            return fn(*args)
        if first[0]:
            first[0] = False
            start = time.perf_counter()
            out = _call_compiled(compiled, args)
            _COMPILE_SECONDS[label] = seconds = time.perf_counter() - start
            print(f"[literl] compiled {label} in {seconds:.1f} s (torch.compile, once per process)", file=sys.stderr,
                  flush=True)
            return out
        return _call_compiled(compiled, args)

    return call


def compile_seconds() -> dict[str, float]:
    """Seconds each function compiled with `compile_for_varying_sizes` took at its first compiled call (compile
    and one run), by name, in this process."""
    return dict(_COMPILE_SECONDS)


_COMPILE_SECONDS: dict[str, float] = {}


def _call_compiled(compiled: Callable, args: tuple):
    # Set for the call (a compile can happen in any of them) by plain assignment: `fx_config.patch` costs ~50 µs
    # per call, 3 ms per rollout of 64 decode steps.
    prior = fx_config.use_duck_shape, dynamo_config.specialize_float
    fx_config.use_duck_shape, dynamo_config.specialize_float = False, True
    try:
        return compiled(*args)
    finally:
        fx_config.use_duck_shape, dynamo_config.specialize_float = prior


def compiles_layer_by_layer(device_type: str) -> bool:
    """Whether `torch.compile` takes a pass over every layer (the decode step, the prompts' pass) one layer at a
    time, one graph serving every layer, rather than as one graph of all the layers.

    On CPU one graph of all layers: inductor fuses across the layers' boundaries and dynamo's ~0.3 ms per call is
    paid once per pass, not once per layer (measured on the step benchmark, docs/speed.md). Elsewhere one layer:
    a graph of every layer is unrolled over the model's depth, so its compile time grows with it (minutes for a
    28-layer model, where one layer's graph takes seconds whatever the depth), while the per-call cost it saves is
    gone anyway on CUDA, whose decode steps replay as CUDA graphs."""
    return device_type != "cpu"
