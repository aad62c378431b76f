"""Where an update's time goes, for `benchmarks/gpu_step.py --profile DIR`: one learner update run under
`torch.profiler`, its operator tables and timeline written to DIR, and a summary of its kernels by kind.

    profile_one_update(parts, device, DIR, name, calls)   the calls-th update profiled: DIR/<name>_update_ops.txt
                                                          (top operators by device time, and by host time),
                                                          DIR/<name>_update_trace.json.gz (the timeline, with the
                                                          update's parts as `literl/…` ranges: `learner.phase`)
    profile_summary(events, wall_s, cuda=...)             device seconds by `kernel_kind` (CPU self time without
                                                          CUDA), kernels launched, host synchronisations, the
                                                          share of the wall time the device was busy
"""

from __future__ import annotations

import time
from pathlib import Path

import torch


# Which kind of work a kernel (or, without CUDA, an operator) is, by the first pattern its lower-cased name holds.
KERNEL_KINDS = (
    ("communication", ("nccl", "gloo", "all_reduce", "allreduce", "all_gather", "reduce_scatter")),
    # torch.compile's generated kernels (triton_poi/per/red_fused_...): element-wise work and reductions fused
    # across operators (their names also hold "_fused" and the operators', e.g. "to_copy")
    ("compiled_fused", ("triton_poi", "triton_per", "triton_red")),
    ("attention", ("flash", "attn", "attention", "fmha", "sdpa", "varlen")),
    ("matmul", ("gemm", "cutlass", "sm90_xmma", "nvjet", "aten::mm", "aten::addmm", "aten::bmm", "matmul",
                "aten::linear")),
    ("optimizer", ("adam", "multi_tensor", "foreach", "_fused")),
    ("copy", ("memcpy", "memset", "copy_", "aten::to", "cat", "index", "gather", "scatter")),
    ("norm_elementwise", ("norm", "elementwise", "vectorized", "reduce", "softmax", "silu", "exp", "log", "mul",
                          "add", "sum", "mean", "pow", "rsqrt", "where", "fill")),
)
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpy", "cudaEventSynchronize")


def kernel_kind(name: str) -> str:
    lowered = name.lower()
    for kind, patterns in KERNEL_KINDS:
        if any(pattern in lowered for pattern in patterns):
            return kind
    return "other"


def profile_one_update(parts, device: torch.device, out_dir: Path, name: str, calls: int) -> dict:
    """Run the `calls`-th learner update under torch.profiler; fill and return a dict
    with "summary" (see the module's docstring) once it has run, and write the operator table to `out_dir`."""
    from torch.profiler import ProfilerActivity, profile

    out: dict = {}
    update, count = parts.learner.update, [0]
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])

    def profiled_update(*args, **kwargs):
        count[0] += 1
        if count[0] != calls:
            return update(*args, **kwargs)
        synchronize(device)
        start = time.perf_counter()
        with profile(activities=activities) as prof:
            result = update(*args, **kwargs)
            synchronize(device)
        wall_s = time.perf_counter() - start
        # A profiler API this torch names otherwise costs the summary, never the benchmark's figures.
        try:
            out["summary"] = profile_summary(prof.events(), wall_s, cuda=device.type == "cuda")
            sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
            averages = prof.key_averages()
            table = averages.table(sort_by=sort, row_limit=40, max_name_column_width=90)
            # The host's side too: where the update's wall time goes when the device waits for its launches.
            host = averages.table(sort_by="cpu_time_total", row_limit=30, max_name_column_width=90)
            out_dir.mkdir(parents=True, exist_ok=True)
            tmp = out_dir / f".{name}_update_ops.txt.tmp"
            tmp.write_text(f"{name}: one update after the timed steps, {wall_s:.3f} s wall\n{table}\n"
                           f"by host time (operators' totals, children included):\n{host}\n")
            tmp.replace(out_dir / f"{name}_update_ops.txt")
            prof.export_chrome_trace(str(out_dir / f"{name}_update_trace.json.gz"))   # chrome://tracing, Perfetto
        except Exception as err:        # noqa: BLE001
            out.setdefault("summary", {"error": f"{type(err).__name__}: {err}"[:300], "wall_s": round(wall_s, 4)})
        return result

    parts.learner.update = profiled_update
    return out


def profile_summary(events, wall_s: float, *, cuda: bool) -> dict:
    """Device (CUDA) or, without CUDA, CPU self time in seconds by `kernel_kind`, the kernels launched, the host
    synchronisations and the share of `wall_s` the device was busy (kernels may overlap: an upper bound)."""
    by_kind: dict[str, float] = {}
    kernels = syncs = 0
    for event in events:
        if event.name.startswith(SYNC_CALLS) and "Async" not in event.name:
            syncs += 1
        if cuda:
            if event.device_type.name != "CUDA" or _is_annotation(event):
                continue
            kernels += 1
            seconds = getattr(event, "device_time_total", None) or event.cuda_time_total
            seconds /= 1e6
        else:
            if not event.name.startswith("aten::"):
                continue
            seconds = event.self_cpu_time_total / 1e6       # self times: nested operators are not counted twice
        kind = kernel_kind(event.name)
        by_kind[kind] = by_kind.get(kind, 0.0) + seconds
    busy = sum(by_kind.values())
    return {"wall_s": round(wall_s, 4), "device_busy_frac": round(busy / wall_s, 4) if wall_s else None,
            "seconds_by_kind": {k: round(v, 4) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
            "kernels": kernels if cuda else None, "host_syncs": syncs if cuda else None}


# Ranges the profiler also draws on the device's timeline, around kernels already counted: the update's parts
# (`learner.phase`), compiled regions, the optimizer step. Counted as kernels they inflated "other" and the busy
# share (the first H200 profiles of 2026-11-27).
ANNOTATION_PREFIXES = ("literl/", "Torch-Compiled Region", "## Call CompiledFxGraph", "CompiledFunction",
                       "Optimizer.", "ProfilerStep")


def _is_annotation(event) -> bool:
    return bool(getattr(event, "is_user_annotation", False)) or event.name.startswith(ANNOTATION_PREFIXES)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
