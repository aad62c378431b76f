"""The FLOP floor of an RL step: the time its matmuls alone would take at this machine's measured matmul rate.

    floor = 2N · generated_tokens / rate_generate  +  6N · trained_tokens / rate_train
          = (2N · generated_tokens + 6N · trained_tokens) / rate

N counts the weights of every matmul a token goes through: the decoder layers' projections and the LM head.
With tied embeddings the head is the embedding matrix, counted once; the embedding lookup itself costs no
FLOPs, and norm gains are left out (no matmul). Attention scores (2·layers·context·heads·head_dim per token)
are left out as well, so the floor is a lower bound. A generated token costs one forward (2N); a trained token
a forward and a backward (6N), the prompt tokens that condition it not counted.

Each rate is measured on the workload's own matmul shapes, at the benchmark's thread count:
  rate_generate  the per-token matmuls of a decode step for a full batch of rows (x·Wᵀ for every weight)
  rate_train     forward and backward matmuls of every weight over the trained tokens (x·Wᵀ, dy·W, dyᵀ·x)
`rate` is their FLOP-weighted (harmonic) combination, so the floor is also total FLOPs / rate.
"""

from __future__ import annotations

import statistics
import time

import torch


def matmul_weight_shapes(model: torch.nn.Module) -> list[tuple[int, int]]:
    """(out_features, in_features) of every distinct Linear weight; a tied head appears once."""
    seen, shapes = set(), []
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and id(module.weight) not in seen:
            seen.add(id(module.weight))
            shapes.append(tuple(module.weight.shape))
    return shapes


def flop_params(model: torch.nn.Module) -> int:
    """N: the parameters of every matmul a token goes through (see the module docstring)."""
    return sum(out_features * in_features for out_features, in_features in matmul_weight_shapes(model))


def floor_seconds(n_params: int, generated_tokens: float, trained_tokens: float, *, rate_generate: float,
                  rate_train: float, train_flops_per_param: int = 6) -> float:
    """2N·generated / rate_generate + 6N·trained / rate_train (rates in FLOP/s); `train_flops_per_param=4` for
    an update that takes its forward from the rollout (backward only)."""
    return (2 * n_params * generated_tokens / rate_generate
            + train_flops_per_param * n_params * trained_tokens / rate_train)


def combined_rate(n_params: int, generated_tokens: float, trained_tokens: float, *, rate_generate: float,
                  rate_train: float) -> float:
    """The single rate with floor = (2N·generated + 6N·trained) / rate."""
    flops = 2 * n_params * generated_tokens + 6 * n_params * trained_tokens
    return flops / floor_seconds(n_params, generated_tokens, trained_tokens, rate_generate=rate_generate,
                                 rate_train=rate_train)


class MatmulRate:
    """Times the workload's matmuls (fp32, current thread count); `measure()` can be called between steps."""

    def __init__(self, shapes: list[tuple[int, int]], *, decode_rows: int, train_tokens: int, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.n_params = sum(o * i for o, i in shapes)
        self.decode_rows, self.train_tokens = decode_rows, train_tokens
        self.weights = [torch.randn(o, i, generator=g) for o, i in shapes]
        self.decode_inputs = [torch.randn(decode_rows, i, generator=g) for _, i in shapes]
        self.train_inputs = [torch.randn(train_tokens, i, generator=g) for _, i in shapes]
        self.train_grads = [torch.randn(train_tokens, o, generator=g) for o, _ in shapes]
        self.generate_samples: list[float] = []
        self.train_samples: list[float] = []

    def _decode_step(self) -> None:
        for x, w in zip(self.decode_inputs, self.weights):
            torch.mm(x, w.t())

    def _train_pass(self) -> None:
        for x, dy, w in zip(self.train_inputs, self.train_grads, self.weights):
            torch.mm(x, w.t())
            torch.mm(dy, w)
            torch.mm(dy.t(), x)

    def measure(self, decode_repeats: int = 20) -> tuple[float, float]:
        """One sample of (rate_generate, rate_train) in FLOP/s, also kept for `summary()`."""
        self._decode_step()
        start = time.perf_counter()
        for _ in range(decode_repeats):
            self._decode_step()
        decode_s = (time.perf_counter() - start) / decode_repeats
        self._train_pass()
        start = time.perf_counter()
        self._train_pass()
        train_s = time.perf_counter() - start
        rates = (2 * self.n_params * self.decode_rows / decode_s, 6 * self.n_params * self.train_tokens / train_s)
        self.generate_samples.append(rates[0])
        self.train_samples.append(rates[1])
        return rates

    def summary(self) -> dict[str, float]:
        """Median rates (GFLOP/s) over the samples taken."""
        return {"rate_generate_gflops": statistics.median(self.generate_samples) / 1e9,
                "rate_train_gflops": statistics.median(self.train_samples) / 1e9,
                "samples": len(self.train_samples)}
