"""CUDA graphs of a decode step, one per batch bucket and attended width.

Eagerly, a decode step of a 28-layer model launches ~1,650 kernels, each costing the host several microseconds:
at a few hundred rows the GPU waits for the launches, not for the maths. A CUDA graph records the step's kernels
once and replays them with one launch. A graph replays exactly the work it recorded, on the same memory, so what
it captures must keep every shape and address from step to step: `decode.FixedShapeDecoder` (the whole cache
attended, the column a device tensor, every write in place) and the engine's sampling loop (per-row outputs
written in place, the response index a device tensor) are built for that. As rows finish the batch shrinks to
the next *bucket* (`decode_buckets`), and as columns are written the attended width grows by steps of 64 columns
(`FixedShapeDecoder.attended_width`): one graph per (bucket, width) pair, captured the first time it is reached.
Rows only shrink and widths only grow, so a generation reaches at most (#buckets + #widths) pairs.

Capturing: one eager warm-up step first, on a side stream (lazy initialisation, cuBLAS workspaces and the
autotuning of compiled kernels must not happen inside a capture), its effects then undone by the caller's
`snapshot`; then the capture. The graphs share one memory pool: they never run concurrently and keep nothing in
it between replays (every output is written into buffers allocated outside the graphs). Random draws inside a
graph come from a generator registered with it (`torch.cuda.CUDAGraph.register_generator_state`): each replay
advances the generator as the same eager draws would, so graphed and eager sampling draw the same numbers.
"""

from __future__ import annotations

import sys
import time
from typing import Callable

import torch

# Batch sizes a shrinking decode batch takes: 1, 2, 4, 8, then 2^k and 1.5·2^k (12, 16, 24, 32, 48, ...). A batch
# runs at the smallest bucket that holds its live rows, so at most a third of its rows are finished ones (above 8).
_SMALL_BUCKETS = (1, 2, 4, 8)


def decode_buckets(rows: int) -> list[int]:
    """The batch sizes a decode batch of `rows` rows runs at, largest first: `rows` itself, then every bucket below
    it."""
    sizes, size = set(_SMALL_BUCKETS), 8
    while size < rows:
        sizes.update((size, size * 3 // 2))
        size *= 2
    return [rows] + sorted((s for s in sizes if s < rows), reverse=True)


def bucket_for(live: int, buckets: list[int]) -> int:
    """The smallest bucket that holds `live` rows (buckets as `decode_buckets` gives them)."""
    return min(b for b in buckets if b >= live)


class BucketGraphs:
    """CUDA graphs of one step function per bucket, over buffers that stay put (see the module docstring).

    `run(key, step, snapshot)` replays the graph of `key` (a bucket: the batch size and, for
    `FixedShapeDecoder`, the attended width), capturing it on first use: `step()` runs one step's device work in
    place, touches no host state (a replay would not repeat it) and returns nothing; `snapshot()` returns a
    function that undoes what a step changed (for the warm-up step). `generator`: the CUDA generator the step draws from (registered with every graph). The graphs hold the
    addresses of everything the step touched: those buffers must outlive them.
    """

    def __init__(self, device: torch.device, generator: torch.Generator | None = None):
        self.device, self.generator = device, generator
        self.graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        self.pool = torch.cuda.graph_pool_handle()
        self.capture_seconds = 0.0
        self.failure: str | None = None

    def run(self, key: tuple, step: Callable[[], None], snapshot: Callable[[], Callable[[], None]]) -> bool:
        """One step at this key: True when a graph replayed it, False when it ran eagerly (a capture failed:
        `failure` says why, and every later step runs eagerly too)."""
        graph = self.graphs.get(key)
        if graph is None and self.failure is None:
            try:
                graph = self.graphs[key] = self._capture(step, snapshot)
            except RuntimeError as error:   # an op that cannot be captured (a host sync): the state was restored
                self.failure = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
                print(f"[literl] capturing the decode step as a CUDA graph failed ({self.failure}); decoding "
                      "eagerly from now on (slower). rollout.decode=static decodes without graphs.", file=sys.stderr,
                      flush=True)
        if graph is None:
            step()
            return False
        graph.replay()
        return True

    def _capture(self, step: Callable[[], None], snapshot: Callable[[], Callable[[], None]]) -> torch.cuda.CUDAGraph:
        start = time.perf_counter()
        restore = snapshot()
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        try:
            with torch.cuda.stream(side):
                step()
        finally:
            torch.cuda.current_stream(self.device).wait_stream(side)
            restore()
        graph = torch.cuda.CUDAGraph()
        # Needed from torch 2.4 until the release that registers generators on first use (and makes this a no-op).
        register = getattr(graph, "register_generator_state", None)
        if self.generator is not None and register is not None:
            register(self.generator)
        with torch.cuda.graph(graph, pool=self.pool):
            step()
        self.capture_seconds += time.perf_counter() - start
        return graph
